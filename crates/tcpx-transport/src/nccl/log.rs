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
/// transport (a silent fallback); a tuned variable never reported as read. Not looked for:
/// `NCCL_NET_PLUGIN` (its "Using network" line is the proof), `NCCL_DEBUG*`, and `NCCL_HOSTID`
/// and `NCCL_NVLS_ENABLE`, which tcpx-lab sets itself rather than tunes.
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
    // NCCL_NET is read with ncclGetEnv, which logs nothing: its proof is the network used.
    if let Some((_, want)) = tuned.iter().find(|(k, _)| k == "NCCL_NET") {
        let other: Vec<&String> = ev
            .networks
            .iter()
            .filter(|n| !n.eq_ignore_ascii_case(want.trim()))
            .collect();
        if !ev.networks.is_empty() && !other.is_empty() {
            problems.push(format!(
                "NCCL_NET={want} was set but NCCL used {}: the pin did not hold",
                other
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    const UNSAID: &[&str] = &[
        "NCCL_NET_PLUGIN",
        "NCCL_NET",
        "NCCL_HOSTID",
        "NCCL_NVLS_ENABLE",
    ];
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

    fn vars(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nccl_net_is_proven_by_the_network_used_not_by_a_set_by_environment_line() {
        let log = "h:1:1 [0] NCCL INFO Using network Socket\n";
        let ev = parse(log);
        assert!(check(&ev, &vars(&[("NCCL_NET", "Socket")])).is_empty());
        assert!(check(&ev, &vars(&[("NCCL_NET", "socket")])).is_empty());
        let p = check(&ev, &vars(&[("NCCL_NET", "GPUDirectTCPX_v7")]));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("the pin did not hold"), "{p:?}");
    }

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
        let p = check(
            &ev,
            &vars(&[
                ("NCCL_NET_PLUGIN", "/x/libnccl-net.so"),
                ("NCCL_NSOCKS_PERTHREAD", "4"),
                ("NCCL_SOCKETS_NTHREADS", "4"),
            ]),
        );
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("silent fallback"), "{p:?}");
        assert!(p[1].contains("NCCL_SOCKETS_NTHREADS"), "{p:?}");
        assert!(check(&ev, &vars(&[("NCCL_NSOCKS_PERTHREAD", "4")])).is_empty());
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

    /// Real NCCL 2.28.9 logs (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,NET), rank 1 of two
    /// processes on one H100 with distinct NCCL_HOSTIDs, captured by ci/real-tcpx/onegpu-nccl.py
    /// on nvidia-h100-x1 (issue 29): over NET/Socket, and over Google's GPUDirect-TCPX plugin.
    const SOCKET_LOG: &str = include_str!("fixtures/nccl-2.28-onegpu-socket-tuned-rank1.log");
    const TCPX_LOG: &str = include_str!("fixtures/nccl-2.28-onegpu-gpudirecttcpx-tuned-rank1.log");

    #[test]
    fn a_real_socket_run_shows_its_network_nodes_and_variables() {
        let ev = parse(SOCKET_LOG);
        assert_eq!(ev.version.as_deref(), Some("2.28.9+cuda13.0"));
        assert_eq!(ev.networks, ["Socket"]);
        assert_eq!(ev.nodes, Some(2), "one GPU, two NCCL hosts");
        assert_eq!(ev.set_by_environment["NCCL_NSOCKS_PERTHREAD"], "4");
        assert_eq!(ev.set_by_environment["NCCL_SOCKET_NTHREADS"], "4");
        assert_eq!(ev.set_by_environment["NCCL_HOSTID"], "tcpx-lab-onegpu-1");
        let tuned = vars(&[
            ("NCCL_NSOCKS_PERTHREAD", "4"),
            ("NCCL_SOCKET_NTHREADS", "4"),
        ]);
        assert!(check(&ev, &tuned).is_empty(), "{:?}", check(&ev, &tuned));
        // The same log for a run that asked for the plugin: a silent fallback.
        let mut with_plugin = tuned.clone();
        with_plugin.push(("NCCL_NET_PLUGIN".into(), "/x/libnccl-net.so".into()));
        let p = check(&ev, &with_plugin);
        assert!(p.len() == 1 && p[0].contains("silent fallback"), "{p:?}");
    }

    #[test]
    fn a_real_gpudirecttcpx_run_shows_the_plugin_and_its_chunk_read() {
        let ev = parse(TCPX_LOG);
        assert_eq!(ev.networks, ["GPUDirectTCPX_v7"]);
        assert_eq!(ev.nodes, Some(2));
        assert_eq!(ev.set_by_environment["NCCL_DYNAMIC_CHUNK_SIZE"], "524288");
        let tuned = vars(&[
            ("NCCL_NET_PLUGIN", "/tmp/plq/libnccl-net.so"),
            ("NCCL_DYNAMIC_CHUNK_SIZE", "524288"),
            ("NCCL_NSOCKS_PERTHREAD", "4"),
            ("NCCL_SOCKET_NTHREADS", "1"),
        ]);
        assert!(check(&ev, &tuned).is_empty(), "{:?}", check(&ev, &tuned));
        // A variable set with a typo is never read.
        let mut typo = tuned.clone();
        typo.push(("NCCL_DYNAMIC_CHUNKSIZE".into(), "1048576".into()));
        let p = check(&ev, &typo);
        assert!(
            p.len() == 1 && p[0].contains("NCCL_DYNAMIC_CHUNKSIZE"),
            "{p:?}"
        );
    }
}
