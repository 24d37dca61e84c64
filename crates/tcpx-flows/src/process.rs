//! Flow processes: how a multi-process run starts one process per flow ([`Launcher`]), and
//! what such a process does first ([`die_with_parent`]).
//!
//! Invariant: a flow process never outlives the process that started it. The parent puts its
//! pid in [`PARENT_PID_ENV`]; the child asks the kernel for SIGKILL when its parent dies
//! (`PR_SET_PDEATHSIG`) and then checks that the parent is still the one named, which closes the
//! race of a parent that died before the request was made. The supervisor also stops every
//! child it started before it returns, whatever happened.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tcpx_bench::Experiment;
use tcpx_transport::nccl;

use crate::error::FlowsError;
use crate::supervise::ChildSpec;

/// Environment variable carrying the pid of a flow process's parent.
pub const PARENT_PID_ENV: &str = "TCPX_PARENT_PID";

/// Which side of a flow a process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowSide {
    /// Receives; listens on the flow's control port.
    Server,
    /// Sends; connects to the flow's control port.
    Client,
}

impl FlowSide {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowSide::Server => "server",
            FlowSide::Client => "client",
        }
    }
}

/// A fault a test asks one flow process to act out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildFault {
    /// Server: accept the client's control connection, then exit with status 3 (a crash
    /// mid-experiment).
    ExitAfterAccept,
    /// Client: exit with status 3 before connecting (its server waits for nobody).
    ExitBeforeConnect,
}

/// One flow process to start.
#[derive(Debug)]
pub struct FlowJob<'a> {
    /// The experiment with `flow_index` set to this flow.
    pub exp: &'a Experiment,
    pub side: FlowSide,
    /// The flow's control address: where the server listens, where the client connects.
    pub addr: SocketAddr,
    /// Where the process must write its [`ChildReport`](crate::ChildReport).
    pub report: &'a Path,
    pub fault: Option<ChildFault>,
}

/// How to start a flow process. The `tcpx-run` binary starts itself (`tcpx-run bench` with the
/// experiment as JSON); an embedding program starts whatever runs `tcpx_bench` and writes a
/// [`ChildReport`](crate::ChildReport).
pub trait Launcher: Send + Sync {
    /// The command for `job`; the caller adds the parent pid and the standard streams.
    fn flow_command(&self, job: &FlowJob<'_>) -> std::io::Result<Command>;
    /// A bare `tcpx-run` command (arguments added by the caller), for runs that are not flows
    /// (the default-vs-tuned validation). Default: this launcher cannot start one.
    fn tool_command(&self) -> std::io::Result<Command> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this launcher cannot start tcpx-run for other runs",
        ))
    }
}

/// The flow processes of one run and the directory their reports go to (removed when dropped,
/// so keep it until the processes ended).
pub struct FlowProcesses {
    pub specs: Vec<ChildSpec>,
    pub dir: tempfile::TempDir,
}

/// The `NCCL_HOSTID` of `side`'s process of flow `flow` when the two sides run on the same GPU
/// index ([`nccl::process::shared_gpu`], `gpus` GPUs here): the server (the nccl listener, rank
/// 0) and the client (rank 1) get the ranks' ids of [`nccl::shared_gpu_host_ids`], whether this
/// process starts both sides (a local bench) or one (a plan's leader or follower, which on one
/// machine share the GPU too). Between two real nodes the ids differ as the hosts do, so nothing
/// changes there. `None` leaves NCCL's own host identity.
pub fn nccl_host_id(exp: &Experiment, flow: usize, side: FlowSide, gpus: usize) -> Option<String> {
    nccl::process::shared_gpu(exp, flow, gpus)?;
    let rank = match side {
        FlowSide::Server => 0,
        FlowSide::Client => 1,
    };
    nccl::shared_gpu_host_ids(2).into_iter().nth(rank)
}

/// The flow processes of a multi-process run: one per flow and side in `sides`, flow `i` with
/// `flow_index = i` on control port `base` + `i` (the server listens there, the client connects
/// there). `exp` is this side's experiment (its `nics` are this side's). `faults` gives a flow a
/// fault to act out (tests).
pub fn flow_children(
    launcher: &dyn Launcher,
    exp: &Experiment,
    sides: &[FlowSide],
    base: SocketAddr,
    faults: &[(u32, ChildFault)],
) -> Result<FlowProcesses, FlowsError> {
    let dir = tempfile::Builder::new()
        .prefix("tcpx-flows-")
        .tempdir()
        .map_err(|e| FlowsError::step("creating a directory for the flow processes' reports", e))?;
    let mut specs = Vec::new();
    let gpus = if nccl::process::ranks_may_share_gpu(exp) {
        tcpx_gpu::device_count().unwrap_or(0)
    } else {
        0
    };
    for i in 0..exp.flows {
        let port = base
            .port()
            .checked_add(u16::try_from(i).unwrap_or(u16::MAX))
            .ok_or_else(|| {
                FlowsError::Refused(format!(
                    "flow {i} would need control port {} + {i}, beyond 65535: use a lower --port",
                    base.port()
                ))
            })?;
        let child_exp = Experiment {
            flow_index: Some(i),
            ..exp.clone()
        };
        for &side in sides {
            let report: PathBuf = dir.path().join(format!("flow{i}-{}.json", side.as_str()));
            let fault = faults.iter().find(|(f, _)| *f == i).map(|(_, k)| *k);
            let mut command = launcher
                .flow_command(&FlowJob {
                    exp: &child_exp,
                    side,
                    addr: SocketAddr::new(base.ip(), port),
                    report: &report,
                    fault,
                })
                .map_err(|e| FlowsError::Launcher(e.into()))?;
            command.env(PARENT_PID_ENV, std::process::id().to_string());
            command.envs(nccl::process::process_env(&child_exp));
            if let Some(log) = nccl_log_path(&child_exp, dir.path(), i, side) {
                command.envs(nccl::process::log_env(&log));
            }
            if let Some(id) = nccl_host_id(&child_exp, i as usize, side, gpus) {
                command.env(nccl::HOSTID_VAR, id);
            }
            specs.push(ChildSpec {
                flow: i,
                role: side.as_str().to_string(),
                command,
                report,
                asked: child_exp.clone(),
            });
        }
    }
    Ok(FlowProcesses { specs, dir })
}

/// Where flow `flow`'s `side` process writes NCCL's log (`NCCL_DEBUG_FILE`), so the run can say
/// which network NCCL really used ([`nccl_network_summary`]): a plugin that fails to load makes
/// NCCL fall back to its own sockets without an error. `None` where
/// [`nccl::process::logs_to_file`] says no (other backends, `NCCL_DEBUG` set by the experiment).
pub fn nccl_log_path(exp: &Experiment, dir: &Path, flow: u32, side: FlowSide) -> Option<PathBuf> {
    if !nccl::process::logs_to_file(exp) {
        return None;
    }
    Some(dir.join(format!("nccl-flow{flow}-{}.log", side.as_str())))
}

/// What the NCCL logs of a run's flow processes (the `nccl-*.log` files [`nccl_log_path`] put
/// in `dir`) say, as lines for the table's header ([`nccl::process::network_summary`]). Empty
/// when no log was written (another backend, `NCCL_DEBUG` set by the user, or NCCL never
/// started).
pub fn nccl_network_summary(exp: &Experiment, dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("nccl-flow") && n.ends_with(".log"))
        })
        .collect();
    names.sort();
    nccl::process::network_summary(exp, &names)
}

/// How long the children of a multi-process run may take in all: the per-step timeout for
/// every warm-up and timed iteration of every size, plus setup.
pub fn children_limit(exp: &Experiment) -> Duration {
    let steps = exp.sizes.len() as f64 * (f64::from(exp.warmup) + f64::from(exp.iters)) + 4.0;
    // Saturating: an experiment not validated yet must not panic here.
    exp.timeout()
        .saturating_mul(steps.min(f64::from(u32::MAX)) as u32)
}

/// [`die_with_parent`] with [`PARENT_PID_ENV`] as this process's environment has it.
pub fn die_with_parent_from_env() -> Result<(), String> {
    die_with_parent(std::env::var(PARENT_PID_ENV).ok().as_deref())
}

/// For a flow process, first thing: be killed when the parent named in [`PARENT_PID_ENV`]
/// (`parent_pid`, read by the caller) dies. `Err` when the parent is already gone (the process
/// should exit at once) or the request failed. A `parent_pid` of `None` (not a flow process)
/// does nothing.
pub fn die_with_parent(parent_pid: Option<&str>) -> Result<(), String> {
    let Some(text) = parent_pid else {
        return Ok(());
    };
    let expected: i32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{PARENT_PID_ENV}={text} is not a pid"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("asking to die with the parent (prctl PR_SET_PDEATHSIG): {e}"))?;
    // The parent may have died between our start and the request: then we were re-parented
    // and no signal will come.
    let now = nix::unistd::getppid().as_raw();
    if now != expected {
        return Err(format!(
            "the parent process {expected} is gone (now parented by {now}): exiting"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_bench::flags::Knob;
    use tcpx_transport::nccl::process::shared_gpu as nccl_shared_gpu;

    fn exp(transport: &str, memory: &str, flows: &str) -> Experiment {
        tcpx_bench::flags::ExperimentFlags::default()
            .with(Knob::Name, "t")
            .with(Knob::Transport, transport)
            .with(Knob::Memory, memory)
            .with(Knob::Sizes, "64K")
            .with(Knob::Iters, "2")
            .with(Knob::Warmup, "1")
            .with(Knob::Flows, flows)
            .with(Knob::Channels, "1")
            .with(Knob::SocksPerChannel, "1")
            .with(Knob::Window, "2")
            .with(Knob::TimeoutS, "20")
            .with(
                Knob::ProcessMode,
                if flows != "1" {
                    "multi-process"
                } else {
                    "single-process"
                },
            )
            .experiment()
            .unwrap()
    }

    #[test]
    fn nccl_sides_sharing_a_gpu_are_two_nccl_hosts() {
        let e = exp("nccl", "cuda", "1");
        // One GPU: both sides on GPU 0, server rank 0, client rank 1, distinct ids.
        assert_eq!(nccl_shared_gpu(&e, 0, 1), Some(0));
        let server = nccl_host_id(&e, 0, FlowSide::Server, 1).unwrap();
        let client = nccl_host_id(&e, 0, FlowSide::Client, 1).unwrap();
        assert_eq!(server, "tcpx-lab-host0");
        assert_eq!(client, "tcpx-lab-host1");
        // Two GPUs named apart: NCCL's own host identity (its intra-node transports) stays.
        let apart = exp("nccl", "cuda:0,1", "1");
        assert_eq!(nccl_shared_gpu(&apart, 0, 2), None);
        assert_eq!(nccl_host_id(&apart, 0, FlowSide::Client, 2), None);
        // ... unless the machine has one GPU, where both wrap onto it.
        assert_eq!(nccl_shared_gpu(&apart, 0, 1), Some(0));
        // Flow 1 of `cuda` on 2 GPUs: GPU 1 on both sides.
        let two = exp("nccl", "cuda", "2");
        assert_eq!(nccl_shared_gpu(&two, 1, 2), Some(1));
        // Only one side started here (a plan's leader or follower): the same ids, so a plan run
        // on one GPU is two NCCL hosts too (NCCL refused it as a duplicate GPU otherwise).
        assert_eq!(
            nccl_host_id(&e, 0, FlowSide::Client, 1).as_deref(),
            Some("tcpx-lab-host1")
        );
        // No GPU found, host memory, or another backend: nothing set.
        assert_eq!(nccl_host_id(&e, 0, FlowSide::Server, 0), None);
        assert_eq!(nccl_shared_gpu(&exp("nccl", "host", "1"), 0, 1), None);
        assert_eq!(nccl_shared_gpu(&exp("socket", "cuda", "1"), 0, 1), None);
    }

    /// Builds `true` for every flow process, so the test can read the environment given to it.
    struct EnvLauncher;
    impl Launcher for EnvLauncher {
        fn flow_command(&self, _job: &FlowJob<'_>) -> std::io::Result<Command> {
            Ok(Command::new("true"))
        }
    }

    fn child_env(e: &Experiment) -> Vec<(String, Option<String>)> {
        let base: SocketAddr = "127.0.0.1:5299".parse().unwrap();
        let procs = flow_children(&EnvLauncher, e, &[FlowSide::Client], base, &[]).unwrap();
        let c = &procs.specs[0].command;
        c.get_envs()
            .map(|(k, v)| {
                let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
                (text(k), v.map(text))
            })
            .collect()
    }

    #[test]
    fn a_nccl_flow_process_gets_the_experiments_nccl_variables_and_nothing_else() {
        let mut e = exp("nccl", "cuda", "1");
        e.env
            .insert("NCCL_NET_PLUGIN".into(), "/x/libnccl-net.so".into());
        e.env.insert("NCCL_NET_GDR_LEVEL".into(), "LOC".into());
        e.env.insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
        let env = child_env(&e);
        let has = |k: &str, v: &str| env.contains(&(k.to_string(), Some(v.to_string())));
        assert!(has("NCCL_NET_PLUGIN", "/x/libnccl-net.so"), "{env:?}");
        assert!(has("NCCL_NET_GDR_LEVEL", "LOC"), "{env:?}");
        assert!(env.iter().all(|(k, _)| k != "LD_PRELOAD"), "{env:?}");
        // The socket backend takes its settings in-process: no variable of the experiment's.
        let mut s = exp("socket", "host", "1");
        s.env.insert("NCCL_SOCKET_NTHREADS".into(), "4".into());
        assert!(child_env(&s).iter().all(|(k, _)| !k.starts_with("NCCL_")));
    }

    #[test]
    fn a_nccl_flow_process_logs_to_a_file_of_its_own_unless_the_user_set_nccl_debug() {
        let e = exp("nccl", "cuda", "1");
        let base: SocketAddr = "127.0.0.1:5299".parse().unwrap();
        let sides = [FlowSide::Server, FlowSide::Client];
        let procs = flow_children(&EnvLauncher, &e, &sides, base, &[]).unwrap();
        let files: Vec<String> = procs
            .specs
            .iter()
            .map(|s| {
                let env: Vec<_> = s.command.get_envs().collect();
                let get = |k: &str| {
                    env.iter()
                        .find(|(n, _)| *n == k)
                        .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
                };
                assert_eq!(get("NCCL_DEBUG").as_deref(), Some("INFO"));
                assert!(get("NCCL_DEBUG_SUBSYS").unwrap().contains("INIT"));
                get("NCCL_DEBUG_FILE").unwrap()
            })
            .collect();
        assert_eq!(files.len(), 2);
        assert_ne!(files[0], files[1], "each process its own log");
        assert!(files
            .iter()
            .all(|f| Path::new(f).starts_with(procs.dir.path())));
        let mut own = exp("nccl", "cuda", "1");
        own.env.insert("NCCL_DEBUG".into(), "WARN".into());
        assert!(child_env(&own)
            .iter()
            .all(|(k, _)| k != "NCCL_DEBUG_FILE" && k != "NCCL_DEBUG_SUBSYS"));
        assert!(child_env(&exp("socket", "host", "1"))
            .iter()
            .all(|(k, _)| k != "NCCL_DEBUG_FILE"));
    }

    const PLUGIN_LOG: &str = "h:1:1 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\n\
        h:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin GPUDirectTCPX_v7\n\
        h:1:1 [0] NCCL INFO Using network GPUDirectTCPX_v7\n\
        h:1:1 [0] NCCL INFO NCCL_DYNAMIC_CHUNK_SIZE set by environment to 524288.\n\
        h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1\n";

    #[test]
    fn the_nccl_logs_say_which_network_was_used_and_name_a_silent_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = exp("nccl", "cuda", "1");
        assert!(
            nccl_network_summary(&e, dir.path()).is_empty(),
            "no log, no line"
        );
        e.env
            .insert("NCCL_NET_PLUGIN".into(), "/x/libnccl-net.so".into());
        e.env
            .insert("NCCL_DYNAMIC_CHUNK_SIZE".into(), "524288".into());
        std::fs::write(dir.path().join("nccl-flow0-server.log"), PLUGIN_LOG).unwrap();
        std::fs::write(dir.path().join("nccl-flow0-client.log"), PLUGIN_LOG).unwrap();
        std::fs::write(dir.path().join("flow0-server.json"), "Using network Socket").unwrap();
        let lines = nccl_network_summary(&e, dir.path());
        assert_eq!(
            lines,
            ["nccl: network GPUDirectTCPX_v7, nNodes 2, NCCL 2.28.3+cuda13.0 (2 logs)"],
            "{lines:?}"
        );
        // The plugin failed to load in one process: NCCL fell back to its sockets, silently.
        std::fs::write(
            dir.path().join("nccl-flow0-client.log"),
            "h:2:2 [0] NCCL INFO Using network Socket\n",
        )
        .unwrap();
        let lines = nccl_network_summary(&e, dir.path());
        // Client's log first (the files are read in name order).
        assert!(
            lines[0].starts_with("nccl: network Socket and GPUDirectTCPX_v7"),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("nccl: warning: NCCL used its own Socket transport")),
            "{lines:?}"
        );
    }
}
