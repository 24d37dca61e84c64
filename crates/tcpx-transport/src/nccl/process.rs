//! What a process that runs libnccl for a flow needs besides the experiment, and what its log
//! says afterwards. libnccl (and a net plugin it loads) read their variables from the process
//! environment only, once, at init: a flow process must be started with them
//! ([`process_env`]). Two ranks on one GPU must be two NCCL hosts ([`shared_gpu`], with the ids of
//! [`shared_gpu_host_ids`](super::shared_gpu_host_ids)). NCCL falls back to its own sockets
//! without an error when a plugin fails to load, so a run logs NCCL to a file ([`log_env`]) and
//! says which network NCCL really used ([`network_summary`]).
//!
//! Callers name their own processes and files; nothing here starts a process or lists a
//! directory.

use std::path::{Path, PathBuf};

use tcpx_model::{Backend, Experiment};

use super::log;

/// Whether a flow of `exp` may have both ranks on one GPU (the nccl backend), so that a caller
/// with both sides here counts its GPUs for [`shared_gpu`].
pub fn ranks_may_share_gpu(exp: &Experiment) -> bool {
    exp.transport == Backend::Nccl
}

/// The GPU both sides of flow `flow` run on when they share one (`gpus` GPUs here) under the
/// nccl backend, else `None`. Such a flow's two processes must be two NCCL hosts: NCCL refuses
/// two ranks on one GPU of one host.
pub fn shared_gpu(exp: &Experiment, flow: usize, gpus: usize) -> Option<usize> {
    if !ranks_may_share_gpu(exp) {
        return None;
    }
    let (send, recv) = exp.memory.flow_gpus(flow, gpus)?;
    (send == recv).then_some(send)
}

/// The experiment's settings that a nccl flow process needs in its environment: for this
/// backend `--env NCCL_NET_PLUGIN=...` must be in the process's environment before NCCL starts,
/// or NCCL silently runs without it. Only `NCCL_*` names: nothing else an experiment carries (it
/// may come from a plan or a peer) reaches a process environment. Other backends take their
/// settings in-process and get nothing here.
pub fn process_env(exp: &Experiment) -> Vec<(&str, &str)> {
    if exp.transport != Backend::Nccl {
        return Vec::new();
    }
    exp.env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Whether a process running `exp` should log NCCL to a file of its own ([`log_env`]): under
/// the nccl backend, unless the experiment sets `NCCL_DEBUG` itself (its log then goes where
/// the user asked).
pub fn logs_to_file(exp: &Experiment) -> bool {
    exp.transport == Backend::Nccl && !exp.env.contains_key("NCCL_DEBUG")
}

/// The variables that make NCCL log what [`network_summary`] reads to `path`.
pub fn log_env(path: &Path) -> [(&'static str, &std::ffi::OsStr); 3] {
    [
        ("NCCL_DEBUG", "INFO".as_ref()),
        ("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET".as_ref()),
        ("NCCL_DEBUG_FILE", path.as_os_str()),
    ]
}

/// What the NCCL logs `logs` (each read up to half of [`log::MAX_LOG_BYTES`]) of a run of `exp`
/// say, as lines for a table's header: the network(s) NCCL used and the node count it saw, then
/// one warning per problem [`log::check`] finds for the experiment's `NCCL_*` settings (a plugin
/// asked for but Socket used; a variable nobody read). Empty for no logs.
pub fn network_summary(exp: &Experiment, logs: &[PathBuf]) -> Vec<String> {
    if logs.is_empty() {
        return Vec::new();
    }
    let mut text = String::new();
    for p in logs {
        use std::io::Read;
        let mut bytes = Vec::new();
        let head = std::fs::File::open(p).and_then(|f| {
            f.take((log::MAX_LOG_BYTES / 2) as u64)
                .read_to_end(&mut bytes)
        });
        if head.is_ok() {
            text.push_str(&String::from_utf8_lossy(&bytes));
            text.push('\n');
        }
    }
    let ev = log::parse(&text);
    let network = if ev.networks.is_empty() {
        "not named in its log".to_string()
    } else {
        ev.networks.join(" and ")
    };
    let mut lines = vec![format!(
        "nccl: network {network}{}{} ({} log{})",
        ev.nodes
            .map(|n| format!(", nNodes {n}"))
            .unwrap_or_default(),
        ev.version
            .as_deref()
            .map(|v| format!(", NCCL {v}"))
            .unwrap_or_default(),
        logs.len(),
        if logs.len() == 1 { "" } else { "s" },
    )];
    let tuned: Vec<(String, String)> = process_env(exp)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    lines.extend(
        log::check(&ev, &tuned)
            .into_iter()
            .map(|p| format!("nccl: warning: {p}")),
    );
    lines
}
