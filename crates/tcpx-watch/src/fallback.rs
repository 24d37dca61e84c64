//! Whether the job ran through the shim at all: a directory with no file from a process the user
//! expected to load it, and what NCCL's own log says it used (`tcpx_transport::nccl::log` reads
//! "Using network X"; this module adds which processes wrote the log, from its line prefixes).

use std::collections::BTreeSet;

use tcpx_transport::nccl::log::{self, NcclLogEvidence};

use crate::read::WatchDir;
use crate::verdict::{Verdict, VerdictKind};

/// The shim's library is named `libnccl-net-tcpxwatch.so` (`NCCL_NET_PLUGIN=tcpxwatch`); a
/// plugin setting containing this (case-insensitive) asks for the shim.
pub const SHIM_NAME_PART: &str = "tcpxwatch";

/// What NCCL's log says about the processes and networks of a job.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NcclLogFacts {
    pub evidence: NcclLogEvidence,
    /// (host, pid) of every line prefix `host:pid:tid [dev] NCCL INFO`.
    pub processes: BTreeSet<(String, u32)>,
}

/// Reads `text` (one or several processes' logs), bounded as [`log::parse`] is.
pub fn read_nccl_log(text: &str) -> NcclLogFacts {
    let evidence = log::parse(text);
    let mut end = text.len().min(log::MAX_LOG_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut processes = BTreeSet::new();
    for line in text[..end].lines() {
        if !line.contains(" NCCL ") {
            continue;
        }
        let Some(prefix) = line.split_whitespace().next() else {
            continue;
        };
        let mut parts = prefix.rsplitn(3, ':');
        let (Some(_tid), Some(pid), Some(host)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if let Ok(pid) = pid.parse::<u32>() {
            if !host.is_empty() && processes.len() < 100_000 {
                processes.insert((host.to_string(), pid));
            }
        }
    }
    NcclLogFacts {
        evidence,
        processes,
    }
}

/// Whether a `NCCL_NET_PLUGIN` value names the shim.
pub fn is_shim(plugin: &str) -> bool {
    plugin.to_ascii_lowercase().contains(SHIM_NAME_PART)
}

/// What says the job did not run through the shim: `expected` (the user said it should have),
/// the directory read, and NCCL's log where given.
pub fn fallback_verdicts(
    dir: &WatchDir,
    expected: bool,
    nccl: Option<&NcclLogFacts>,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    let plain = |subject: String, text: String| Verdict {
        kind: VerdictKind::NoShim,
        subject,
        figure: None,
        value: None,
        peers: None,
        below_pct: None,
        below_pct_range: None,
        robust_z: None,
        text,
    };
    if expected && dir.processes.is_empty() {
        out.push(plain(
            "every process".into(),
            "no process wrote a watch file here although the shim was expected: NCCL did not \
             load it (check NCCL_NET_PLUGIN names the shim, that libnccl-net-tcpxwatch.so is on \
             the library path, TCPX_WATCH_DIR points here and is writable; NCCL's log with \
             NCCL_DEBUG=INFO says which network it used: --nccl-log)"
                .into(),
        ));
    }
    let Some(facts) = nccl else {
        return out;
    };
    // The shim gives NCCL the real plugin's name, so "Using network X" cannot tell the shim
    // from the plugin alone; the NCCL_NET_PLUGIN NCCL read can.
    let plugin = facts.evidence.set_by_environment.get("NCCL_NET_PLUGIN");
    for net in &facts.evidence.networks {
        let text = if net == "Socket" || net == "IB" {
            format!(
                "NCCL's log says \"Using network {net}\": NCCL's own transport, a fallback{} \
                 (the plugin did not load, or NCCL_NET pinned {net}); the shim saw none of that \
                 traffic: check NCCL_NET_PLUGIN, LD_LIBRARY_PATH and the log's NET/Plugin lines",
                plugin
                    .map(|p| format!(" although NCCL_NET_PLUGIN={p}"))
                    .unwrap_or_default()
            )
        } else if plugin.is_some_and(|p| is_shim(p)) {
            continue;
        } else {
            format!(
                "NCCL's log says \"Using network {net}\" with {}: that plugin directly, not the \
                 shim in front of it (set NCCL_NET_PLUGIN=tcpxwatch and TCPX_WATCH_INNER to the \
                 plugin: tcpx-run apply --watch)",
                match plugin {
                    Some(p) => format!("NCCL_NET_PLUGIN={p}"),
                    None => "no NCCL_NET_PLUGIN (NCCL's default libnccl-net.so)".to_string(),
                }
            )
        };
        out.push(plain(format!("network {net}"), text));
    }
    // NCCL's log names a host up to its first '.'.
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_string();
    let watched: BTreeSet<(String, u32)> = dir
        .processes
        .iter()
        .map(|p| (short(&p.host), p.pid))
        .collect();
    let missing: Vec<String> = facts
        .processes
        .iter()
        .filter(|(h, pid)| !watched.contains(&(short(h), *pid)))
        .map(|(h, pid)| format!("{h}:{pid}"))
        .collect();
    if !missing.is_empty() && (expected || !watched.is_empty()) {
        let shown: Vec<&str> = missing.iter().take(8).map(String::as_str).collect();
        out.push(plain(
            format!("{} process(es)", missing.len()),
            format!(
                "NCCL's log has lines from {} process(es) with no watch file here ({}{}): they \
                 did not load the shim, or wrote elsewhere (check their TCPX_WATCH_DIR and \
                 NCCL_NET_PLUGIN)",
                missing.len(),
                shown.join(", "),
                if missing.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
        ));
    }
    out
}
