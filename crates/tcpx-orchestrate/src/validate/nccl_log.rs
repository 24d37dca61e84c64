//! What NCCL's own log (`NCCL_DEBUG=INFO`, subsystems INIT and ENV at least) proves about a
//! run: which network NCCL used ("Using network Socket", "Using network GPUDirectTCPX_v7"), how
//! many nodes it saw ("nNodes 2" when one GPU is two NCCL hosts), and which variables it, or the
//! net plugin, read ("NCCL_X set by environment to V", with or without a trailing '.' or ':').
//! [`check`] turns that into problems: a silent fallback (NET/Socket where the tuned run asked for
//! a plugin) and a tuned variable nobody read. Pure text in, findings out; the caller captures
//! the log (NCCL_DEBUG_FILE) and bounds how much it reads ([`MAX_LOG_BYTES`]).

use std::collections::BTreeMap;

/// The most log text looked at; NCCL's INIT/ENV lines come first, and a run's log with
/// NET-level detail can be very long.
pub const MAX_LOG_BYTES: usize = 4 << 20;

/// What one or more NCCL logs say.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NcclLogEvidence {
    /// Every network named by "Using network X", in order of first appearance.
    pub networks: Vec<String>,
    /// Variable -> value, from every "set by environment to" line.
    pub set_by_environment: BTreeMap<String, String>,
    /// The largest "nNodes N" seen.
    pub nodes: Option<u32>,
    /// "NCCL version X" as NCCL prints it at init.
    pub version: Option<String>,
}

/// Reads the INFO lines that matter out of `text` (one or several ranks' logs, concatenated).
pub fn parse(text: &str) -> NcclLogEvidence {
    let mut end = text.len().min(MAX_LOG_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let mut ev = NcclLogEvidence::default();
    for line in text.lines() {
        let Some(at) = line.find("NCCL INFO ") else {
            continue;
        };
        let msg = line[at + "NCCL INFO ".len()..].trim();
        if let Some(net) = msg.strip_prefix("Using network ") {
            let net = net.split_whitespace().next().unwrap_or("").to_string();
            if !net.is_empty() && !ev.networks.contains(&net) {
                ev.networks.push(net);
            }
        } else if let Some(at) = msg.find(" set by environment to") {
            let name = msg[..at].split_whitespace().last().unwrap_or("");
            if !name.starts_with("NCCL_") {
                continue;
            }
            let value = msg[at + " set by environment to".len()..]
                .trim_start_matches(':')
                .trim();
            let value = value.strip_suffix('.').unwrap_or(value);
            ev.set_by_environment
                .insert(name.to_string(), value.to_string());
        } else if let Some(v) = msg.strip_prefix("NCCL version ") {
            ev.version
                .get_or_insert_with(|| v.split_whitespace().next().unwrap_or("").to_string());
        }
        if let Some(at) = msg.find(" nNodes ") {
            if let Some(n) = msg[at + " nNodes ".len()..]
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u32>().ok())
            {
                ev.nodes = Some(ev.nodes.map_or(n, |m| m.max(n)));
            }
        }
    }
    ev
}

/// Problems with a run whose environment set `tuned` (the arm's NCCL variables): no network
/// named at all; a plugin asked for (`NCCL_NET_PLUGIN`) but NCCL used its own Socket or IB
/// transport (a silent fallback); a tuned variable never reported as read. Variables NCCL reads
/// without saying so are not flagged: `NCCL_NET_PLUGIN` (its "Using network" line is the proof),
/// `NCCL_DEBUG*`, `NCCL_HOSTID` (said only when it changes the host hash) and
/// `NCCL_NVLS_ENABLE`.
pub fn check(ev: &NcclLogEvidence, tuned: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let plugin = tuned.iter().find(|(k, _)| k == "NCCL_NET_PLUGIN");
    match ev.networks.as_slice() {
        [] => problems.push(
            "NCCL's log names no network (\"Using network ...\"): run with NCCL_DEBUG=INFO and \
             NCCL_DEBUG_SUBSYS including INIT"
                .to_string(),
        ),
        nets => {
            if let Some((_, so)) = plugin {
                if let Some(own) = nets.iter().find(|n| *n == "Socket" || *n == "IB") {
                    problems.push(format!(
                        "NCCL used its own {own} transport although NCCL_NET_PLUGIN={so} was \
                         set: a silent fallback (check that the plugin loads: LD_LIBRARY_PATH, \
                         its init warnings in the log)"
                    ));
                }
            }
        }
    }
    const UNSAID: &[&str] = &["NCCL_NET_PLUGIN", "NCCL_HOSTID", "NCCL_NVLS_ENABLE"];
    for (k, v) in tuned {
        if !k.starts_with("NCCL_") || UNSAID.contains(&k.as_str()) || k.starts_with("NCCL_DEBUG") {
            continue;
        }
        match ev.set_by_environment.get(k) {
            None => problems.push(format!(
                "{k}={v} was set but neither NCCL nor the plugin reported reading it (no \"{k} \
                 set by environment to\" line): a misspelt name or a variable this NCCL does \
                 not know"
            )),
            Some(read) if read != v.trim() => problems.push(format!(
                "{k}: set to {v}, but the log says it was read as {read}"
            )),
            Some(_) => {}
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_of_set_by_environment_are_read() {
        let log = "\
h:1:1 [0] NCCL INFO NCCL_SOCKET_NTHREADS set by environment to 4.
h:1:1 [0] NCCL INFO NCCL_GPUDIRECTTCPX_SLOWNESS_SWITCH set by environment to: on
h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to Simple
h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
h:1:1 [0] NCCL INFO Using network Socket
h:1:1 [0] NCCL INFO Using network Socket
";
        let ev = parse(log);
        assert_eq!(ev.networks, ["Socket"]);
        assert_eq!(ev.nodes, Some(2));
        assert_eq!(ev.set_by_environment["NCCL_SOCKET_NTHREADS"], "4");
        assert_eq!(
            ev.set_by_environment["NCCL_GPUDIRECTTCPX_SLOWNESS_SWITCH"],
            "on"
        );
        assert_eq!(ev.set_by_environment["NCCL_PROTO"], "Simple");
    }

    #[test]
    fn a_fallback_and_an_unread_variable_are_flagged() {
        let ev = parse(
            "x NCCL INFO Using network Socket\nx NCCL INFO NCCL_NSOCKS_PERTHREAD set by \
             environment to 4.\n",
        );
        let tuned = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p = check(
            &ev,
            &tuned(&[
                ("NCCL_NET_PLUGIN", "/x/libnccl-net.so"),
                ("NCCL_NSOCKS_PERTHREAD", "4"),
                ("NCCL_SOCKETS_NTHREADS", "4"),
            ]),
        );
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("silent fallback"), "{p:?}");
        assert!(p[1].contains("NCCL_SOCKETS_NTHREADS"), "{p:?}");
        assert!(check(&ev, &tuned(&[("NCCL_NSOCKS_PERTHREAD", "4")])).is_empty());
        let none = check(&parse(""), &[]);
        assert!(none[0].contains("names no network"), "{none:?}");
    }

    #[test]
    fn any_text_is_taken_without_panic_and_bounded() {
        for t in [
            "NCCL INFO ",
            "NCCL INFO  set by environment to",
            "NCCL INFO x nNodes ",
            "é NCCL INFO Using network ",
        ] {
            let _ = parse(t);
        }
        let big = "x NCCL INFO Using network Socket\n".repeat(200_000);
        assert_eq!(parse(&big).networks, ["Socket"]);
    }
}
