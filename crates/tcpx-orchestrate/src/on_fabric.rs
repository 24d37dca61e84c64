//! Plan runs on an emulated fabric (`--fabric ID`, or `--targets emulated-a3` for the fabric
//! `fabric up` makes by default): the leader runs in node A, its follower in node B.
//!
//! The command the user typed re-executes itself inside node A ([`run_in_node_a`]) and waits for
//! it; inside node A the leader listens on NIC 1's address and starts `tcpx-run follow` inside
//! node B ([`NodeBFollower`]). Both are marked with the fabric and node
//! (`tcpx_fabric::Fabric::mark`), so their flow processes place channels with the fabric's
//! emulated A3 placement. Every process dies with the one that started it (PR_SET_PDEATHSIG
//! through `TCPX_PARENT_PID`, as flow processes do), and the follower is stopped when the leader
//! ends, whatever happened.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use tcpx_fabric::{Fabric, Node, Phase, FABRIC_ENV, FABRIC_NODE_ENV};
use tcpx_flows::PARENT_PID_ENV;

use crate::error::OrchestrateError;

/// The fabric a plan run asks for: `--fabric`, or the default fabric for the emulated-a3 targets.
pub(crate) fn requested(fabric: Option<&str>, targets: Option<&str>) -> Option<String> {
    if let Some(f) = fabric {
        return Some(f.to_string());
    }
    let t = targets?;
    let stem = std::path::Path::new(t)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(t);
    (stem == "emulated-a3").then(|| tcpx_fabric::DEFAULT_ID.to_string())
}

/// Opens fabric `id` for a plan run: root, and the fabric up (not stale, not being made).
pub(crate) fn open(id: &str) -> Result<Fabric, OrchestrateError> {
    tcpx_fabric::require_root().map_err(|e| {
        OrchestrateError::step("a plan run on an emulated fabric enters its namespaces", e)
    })?;
    let fabric = Fabric::open(id, &tcpx_fabric::default_state_dir()).map_err(|e| {
        OrchestrateError::step(
            format!("bring it up first: sudo tcpx-run fabric up --id {id} --nics 4 --rate 2gbit"),
            e,
        )
    })?;
    if fabric.state.phase != Phase::Up {
        return Err(OrchestrateError::Refused(format!(
            "fabric `{id}` is not up (its `fabric up` did not finish): `tcpx-run fabric down --id {id}`, then up again"
        )));
    }
    Ok(fabric)
}

/// Whether this process is the leader the outer command started inside node A of `id`.
pub(crate) fn in_node_a(id: &str) -> bool {
    std::env::var(FABRIC_ENV).ok().as_deref() == Some(id)
        && std::env::var(FABRIC_NODE_ENV)
            .ok()
            .and_then(|v| Node::from_env_value(&v))
            == Some(Node::A)
}

/// Runs `program` with `args` (the caller's own command line, so the same command runs again)
/// inside node A and returns its exit code.
pub(crate) fn run_in_node_a(
    fabric: &Fabric,
    program: &Path,
    args: Vec<OsString>,
) -> Result<ExitCode, OrchestrateError> {
    let mut cmd = fabric.command_in(Node::A, program);
    cmd.args(args);
    fabric.mark(&mut cmd, Node::A);
    cmd.env(PARENT_PID_ENV, std::process::id().to_string());
    eprintln!(
        "tcpx-run: emulated fabric `{}` ({} NICs at {}): leader in {}, follower in {}",
        fabric.id(),
        fabric.state.nics,
        fabric.state.rate,
        fabric.ns(Node::A),
        fabric.ns(Node::B)
    );
    let status = cmd.status().map_err(|e| {
        OrchestrateError::step(
            format!(
                "starting the leader in {} (`ip netns exec`)",
                fabric.ns(Node::A)
            ),
            e,
        )
    })?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(2)),
        None => {
            eprintln!("tcpx-run: the leader in node A was killed by a signal ({status})");
            ExitCode::from(2)
        }
    })
}

/// The address the leader listens on inside node A: NIC 1's, port `port` (0: any).
pub(crate) fn leader_addr(fabric: &Fabric, port: u16) -> SocketAddr {
    let ip = fabric.addrs(Node::A)[0];
    SocketAddr::new(ip.into(), port)
}

/// How the fabric appears in a report's setup.
pub(crate) fn describe(fabric: &Fabric) -> String {
    format!(
        "emulated on one machine: fabric `{}`, {} NICs at {} each ({} GB/s line rate per NIC), {} placement; leader in {}, follower in {}",
        fabric.id(),
        fabric.state.nics,
        fabric.state.rate,
        fabric.state.rate.gbs(),
        fabric.state.topology,
        fabric.ns(Node::A),
        fabric.ns(Node::B)
    )
}

/// The criterion a fabric run leaves N/A with the targets' reason (`absolute_judged = false`,
/// `absolute_why`): absolute A3 figures are not judged on an emulated line rate.
pub(crate) fn absolute_criterion(
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
    phase: &str,
) -> Option<tcpx_report::CriterionResult> {
    if settings.get("absolute_judged").and_then(|v| v.as_bool()) != Some(false) {
        return None;
    }
    let why = settings
        .get("absolute_why")
        .and_then(|v| v.as_str())
        .unwrap_or("the fabric is emulated");
    Some(tcpx_report::CriterionResult {
        phase: phase.to_string(),
        ..tcpx_report::CriterionResult::plain(
            "absolute A3 thresholds (GB/s per GPU, NCCL bus bandwidth)",
            tcpx_report::Verdict::NotEvaluated,
            why.to_string(),
        )
    })
}

/// What the emulated targets say a fabric run cannot show (`not_covered`), as a report note.
pub(crate) fn target_notes(
    settings: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(list) = settings.get("not_covered").and_then(|v| v.as_array()) {
        let items: Vec<&str> = list.iter().filter_map(|v| v.as_str()).collect();
        if !items.is_empty() {
            notes.push(format!(
                "not covered by the emulated fabric: {}",
                items.join("; ")
            ));
        }
    }
    notes
}

/// `tcpx-run follow` running inside node B; stopped when dropped if it has not ended.
pub(crate) struct NodeBFollower {
    child: Option<Child>,
}

impl NodeBFollower {
    /// Starts `program follow` (tcpx-run's follower) in node B, connecting to the leader at
    /// `leader`.
    pub(crate) fn start(
        fabric: &Fabric,
        program: &Path,
        leader: SocketAddr,
        connect_timeout: u64,
        token: Option<&tcpx_link::auth::RunToken>,
    ) -> Result<Self, OrchestrateError> {
        let mut cmd = fabric.command_in(Node::B, program);
        // The run token travels in the environment, never on a command line others can read.
        match token {
            Some(t) => cmd.env(tcpx_link::auth::TOKEN_ENV, t.as_text()),
            None => cmd.env_remove(tcpx_link::auth::TOKEN_ENV),
        };
        cmd.args(["follow", "--leader"])
            .arg(leader.to_string())
            .args(["--connect-timeout", &connect_timeout.to_string()])
            .stdin(Stdio::null());
        fabric.mark(&mut cmd, Node::B);
        cmd.env(PARENT_PID_ENV, std::process::id().to_string());
        let child = cmd.spawn().map_err(|e| {
            OrchestrateError::step(
                format!("starting the follower in {}", fabric.ns(Node::B)),
                e,
            )
        })?;
        Ok(NodeBFollower { child: Some(child) })
    }

    /// Waits up to `limit` for the follower to end (after the leader said goodbye), then stops
    /// it. The error text when it failed or had to be stopped.
    pub fn finish(mut self, limit: Duration) -> Option<String> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + limit;
        loop {
            match child.try_wait() {
                Ok(Some(s)) if s.success() => return None,
                Ok(Some(s)) => return Some(format!("the follower in node B ended with {s}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Some(format!(
                        "the follower in node B had not ended {} s after the run and was stopped",
                        limit.as_secs()
                    ));
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Some(format!("waiting for the follower in node B: {e}"));
                }
            }
        }
    }
}

impl Drop for NodeBFollower {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulated_targets_ask_for_the_default_fabric() {
        assert_eq!(requested(Some("f2"), None).as_deref(), Some("f2"));
        assert_eq!(
            requested(Some("f2"), Some("emulated-a3")).as_deref(),
            Some("f2")
        );
        assert_eq!(
            requested(None, Some("emulated-a3")).as_deref(),
            Some("fabric")
        );
        assert_eq!(
            requested(None, Some("plans/targets/emulated-a3.toml")).as_deref(),
            Some("fabric")
        );
        assert_eq!(requested(None, Some("loopback")), None);
        assert_eq!(requested(None, None), None);
    }

    #[test]
    fn the_emulated_targets_notes_say_what_is_not_judged_or_covered() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans/targets");
        let t = tcpx_plan::choose_targets(
            &dir,
            Some("emulated-a3"),
            &tcpx_plan::SystemFacts::default(),
        )
        .unwrap();
        let mut settings = t.settings.clone();
        let covered = settings["not_covered"].as_array().unwrap().len();
        assert!(covered >= 2, "{settings:?}");
        settings.insert(
            "not_covered".into(),
            serde_json::json!(["devmem conflicts", "the unpack path"]),
        );
        let notes = target_notes(&settings);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("devmem conflicts; the unpack path"),
            "{notes:?}"
        );
        let c = absolute_criterion(&settings, "Phase 3.1").unwrap();
        assert_eq!(c.verdict, tcpx_report::Verdict::NotEvaluated);
        assert!(
            c.detail.starts_with("the fabric is emulated"),
            "{}",
            c.detail
        );
        assert!(absolute_criterion(&Default::default(), "p").is_none());
        assert!(target_notes(&Default::default()).is_empty());
    }
}
