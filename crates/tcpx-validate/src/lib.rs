//! tcpx-validate: closing the tuning loop: libnccl point-to-point (send/recv through the `nccl`
//! backend) and all-reduce bus bandwidth, each with NCCL's defaults against the same with a
//! run's tuned variables, repetitions interleaved, and the gain with its interval.
//!
//! Decided without running anything: which variables each arm sets or clears ([`arm_env`]), the
//! child arguments both arms share ([`child_args`]: `tcpx-run bench` for send/recv, `tcpx-run
//! validate --allreduce-child` for all-reduce), the rotating order of the runs ([`runs`]),
//! whether the machine can run it at all ([`prerequisites`]: libnccl and two GPUs, else N/A with
//! the reason), the figures of each child's JSON document ([`figures_of`]) and the gains over
//! the repetitions ([`summarise`]). NCCL reads its environment once per process, so every
//! repetition of every arm of every collective is its own process; the caller says how to start
//! one (a bare `tcpx-run` command). [`allreduce`] is what the all-reduce child runs, [`rank`]
//! one rank of a run whose two ranks share a GPU; [`rank::init_comm`] and [`rank::step`] are the
//! one NCCL rank runner (tcpx-gpu-bench's one-GPU NCCL ranks run on them too).
//!
//! Not for: choosing the tuned variables (tcpx-report's tuned.env), the plan runner that calls
//! [`plan_validation`] (tcpx-orchestrate), or reading NCCL's log and process environment
//! (tcpx-transport's nccl backend: [`nccl_log`] is its log reader).

#![forbid(unsafe_code)]

pub mod allreduce;
mod error;
pub mod plan;
pub mod rank;
mod verdict;

pub use error::MeasureError;
pub use tcpx_transport::nccl::log as nccl_log;
pub use verdict::{check_net_plugin_path, Verdict};

use serde::{Deserialize, Serialize};
use tcpx_report::stats::{ratio_of_medians, FigureStats};

/// The two configurations compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    /// NCCL's defaults: none of the tuned variables set.
    Default,
    /// The tuned NCCL variables set.
    Tuned,
}

impl Arm {
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::Default => "default",
            Arm::Tuned => "tuned",
        }
    }
}

/// What one validation runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidateConfig {
    pub sizes: Vec<u64>,
    pub reps: u32,
    pub iters: u32,
    pub warmup: u32,
    /// GPUs of the sender and the receiver.
    pub send_gpu: usize,
    pub recv_gpu: usize,
}

/// Variables a validation child gets: `set` for this arm, `remove` (every variable the tuned
/// file names, and `tcpx-run bench`'s own `TCPX_*` fallbacks, which would change the
/// experiment) before that. Only NCCL's variables (`NCCL_*`) differ between the arms.
pub fn arm_env(arm: Arm, tuned: &[(String, String)]) -> (Vec<String>, Vec<(String, String)>) {
    let mut remove: Vec<String> = tuned.iter().map(|(k, _)| k.clone()).collect();
    remove.extend(BENCH_ENV.iter().map(|s| s.to_string()));
    remove.sort();
    remove.dedup();
    let set = match arm {
        Arm::Default => Vec::new(),
        Arm::Tuned => tuned
            .iter()
            .filter(|(k, _)| k.starts_with("NCCL_"))
            .cloned()
            .collect(),
    };
    (remove, set)
}

/// `tcpx-run bench`'s environment fallbacks: the knob table's variables, in its order.
pub static BENCH_ENV: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| tcpx_model::knob::with_env().filter_map(|s| s.env).collect());

/// Arguments after `tcpx-run` for one repetition of either arm (the arms differ only in their
/// environment): the `nccl` backend, GPU memory on two GPUs, one channel so that NCCL's own
/// channels carry the tuning, one JSON document out.
pub fn bench_args(cfg: &ValidateConfig) -> Vec<String> {
    let sizes: Vec<String> = cfg.sizes.iter().map(|s| s.to_string()).collect();
    [
        "bench",
        "--role",
        "local",
        "--transport",
        "nccl",
        "--memory",
        &format!("cuda:{},{}", cfg.send_gpu, cfg.recv_gpu),
        "--channels",
        "1",
        "--size",
        &sizes.join(","),
        "--iters",
        &cfg.iters.to_string(),
        "--warmup",
        &cfg.warmup.to_string(),
        "--no-csv",
        "--json",
        "--name",
        "validate",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What a validation compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Collective {
    /// ncclSend/ncclRecv through the `nccl` backend (`tcpx-run bench`): receiver busbw.
    SendRecv,
    /// ncclAllReduce (f32 sum) over the two GPUs: nccl-tests' busbw.
    AllReduce,
}

impl Collective {
    pub const ALL: [Collective; 2] = [Collective::SendRecv, Collective::AllReduce];
    pub fn as_str(self) -> &'static str {
        match self {
            Collective::SendRecv => "sendrecv",
            Collective::AllReduce => "allreduce",
        }
    }
}

/// Arguments after `tcpx-run` for one run of `collective` (either arm: they differ only in
/// their environment).
pub fn child_args(cfg: &ValidateConfig, collective: Collective) -> Vec<String> {
    match collective {
        Collective::SendRecv => bench_args(cfg),
        Collective::AllReduce => {
            let sizes: Vec<String> = cfg.sizes.iter().map(|s| s.to_string()).collect();
            let gpus = format!("{},{}", cfg.send_gpu, cfg.recv_gpu);
            let n = |v: u32| v.to_string();
            let args = [
                "validate",
                "--allreduce-child",
                "--size",
                &sizes.join(","),
                "--iters",
                &n(cfg.iters),
                "--warmup",
                &n(cfg.warmup),
                "--gpus",
                &gpus,
            ];
            args.iter().map(|s| s.to_string()).collect()
        }
    }
}

/// One child process of a validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub rep: u32,
    pub arm: Arm,
    pub collective: Collective,
}

/// Every run in order: repetition r runs each collective with both arms in [`schedule`]'s
/// order for r, so drift over time falls on both arms of both collectives alike.
pub fn runs(reps: u32, collectives: &[Collective]) -> Vec<Run> {
    let order = schedule(reps);
    order
        .chunks(2)
        .flat_map(|pair| {
            collectives.iter().flat_map(move |&collective| {
                pair.iter().map(move |&(rep, arm)| Run {
                    rep,
                    arm,
                    collective,
                })
            })
        })
        .collect()
}

/// `(size, busbw GB/s)` from a child's stdout: the bench's JSON document (receiver busbw of each
/// size) or the all-reduce child's [`allreduce::ChildOutcome`]; `Err` says what was wrong.
pub fn figures_of(collective: Collective, stdout: &[u8]) -> Result<Vec<(u64, f64)>, String> {
    match collective {
        Collective::SendRecv => {
            let doc: serde_json::Value = serde_json::from_slice(stdout)
                .map_err(|e| format!("reading the bench's JSON document: {e}"))?;
            Ok(doc["measurements"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| Some((m["size"].as_u64()?, m["recv"]["busbw_gbs"].as_f64()?)))
                .collect())
        }
        Collective::AllReduce => serde_json::from_slice::<allreduce::ChildOutcome>(stdout)
            .map_err(|e| format!("reading the all-reduce child's JSON document: {e}"))?
            .figures(),
    }
}

/// The order of the runs: repetition r runs both arms, default first on even r and tuned
/// first on odd r, so drift over time falls on both alike.
pub fn schedule(reps: u32) -> Vec<(u32, Arm)> {
    (0..reps)
        .flat_map(|r| {
            if r % 2 == 0 {
                [(r, Arm::Default), (r, Arm::Tuned)]
            } else {
                [(r, Arm::Tuned), (r, Arm::Default)]
            }
        })
        .collect()
}

/// Where the two NCCL ranks of every run go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// Each rank on its own GPU, both in one process (one NCCL host: NCCL's own intra-node
    /// transports unless the environment turns them off).
    TwoGpus { send_gpu: usize, recv_gpu: usize },
    /// Both ranks on one GPU, each in a process of its own with its own `NCCL_HOSTID`
    /// ([`host_ids`]): NCCL sees two nodes and uses its network transport (NET/Socket or a net
    /// plugin), which is what a tuned.env for a network tunes.
    SharedGpu { gpu: usize, host_ids: [String; 2] },
}

impl Placement {
    /// What the output says about it.
    pub fn describe(&self) -> String {
        match self {
            Placement::TwoGpus { send_gpu, recv_gpu } => {
                format!("GPUs {send_gpu} and {recv_gpu} as 1 NCCL host")
            }
            Placement::SharedGpu { gpu, host_ids } => {
                tcpx_transport::nccl::describe_shared_gpu(*gpu, host_ids)
            }
        }
    }
}

/// The `NCCL_HOSTID` of each of `ranks` rank processes sharing one GPU: the assignment every
/// shared-GPU NCCL run uses ([`tcpx_transport::nccl::shared_gpu_host_ids`]).
pub use tcpx_transport::nccl::shared_gpu_host_ids as host_ids;

/// Where the ranks go on a machine with `gpus` GPUs: their own GPUs when `cfg` names two
/// different ones that exist; otherwise both on one GPU as two NCCL hosts (the sender's GPU if
/// it exists, else GPU 0). `Err` only without any GPU.
pub fn placement(gpus: usize, cfg: &ValidateConfig) -> Result<Placement, String> {
    if gpus == 0 {
        return Err("this machine has no GPU".into());
    }
    let need = cfg.send_gpu.max(cfg.recv_gpu) + 1;
    if cfg.send_gpu != cfg.recv_gpu && gpus >= need {
        return Ok(Placement::TwoGpus {
            send_gpu: cfg.send_gpu,
            recv_gpu: cfg.recv_gpu,
        });
    }
    let gpu = if cfg.send_gpu < gpus { cfg.send_gpu } else { 0 };
    let ids = host_ids(2);
    Ok(Placement::SharedGpu {
        gpu,
        host_ids: [ids[0].clone(), ids[1].clone()],
    })
}

/// `Err(reason)` when the validation cannot run here: `gpus` and `nccl` are what the caller
/// found (GPU count, libnccl's path and version), or why they could not be found. `Ok` says
/// what was found and where the ranks go ([`placement`]).
pub fn prerequisites(
    gpus: Result<usize, String>,
    nccl: Result<String, String>,
    cfg: &ValidateConfig,
) -> Result<(String, Placement), String> {
    let nccl = nccl.map_err(|e| format!("no libnccl here: {e}"))?;
    let n = gpus.map_err(|e| format!("no GPU can be used: {e}"))?;
    let p = placement(n, cfg)?;
    Ok((format!("{nccl}, {n} GPU(s), {}", p.describe()), p))
}

/// Variables every child of an arm gets on top of its tuned ones: a net plugin for both arms
/// (`NCCL_NET_PLUGIN`, `NCCL_NET_GDR_LEVEL=LOC` unless the environment gives a level, since
/// without devmem GPUDirect-TCPX can only receive to host memory, and a plugin chunk that is never
/// 0: [`tcpx_transport::netplugin::plugin_chunk`]'s rule per arm, the tuned arm keeping its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmExtras {
    pub default: Vec<(String, String)>,
    pub tuned: Vec<(String, String)>,
    /// One line each, for the header and the report.
    pub notes: Vec<String>,
}

/// [`ArmExtras`] for `plugin` (the `--net-plugin` path, else tuned.env's `NCCL_NET_PLUGIN`);
/// `gdr_level` and `chunk` are the process environment's `NCCL_NET_GDR_LEVEL` and
/// `NCCL_DYNAMIC_CHUNK_SIZE` (the binary reads them). `Err` for a chunk the plugin cannot take.
pub fn net_plugin_env(
    plugin: Option<&str>,
    tuned: &[(String, String)],
    gdr_level: Option<&str>,
    chunk: Option<&str>,
) -> Result<ArmExtras, String> {
    use tcpx_transport::netplugin::{plugin_chunk, DYNAMIC_CHUNK_VAR};
    let from_tuned = tuned
        .iter()
        .find(|(k, _)| k == "NCCL_NET_PLUGIN")
        .map(|(_, v)| v.as_str());
    let Some(so) = plugin.or(from_tuned).filter(|s| !s.trim().is_empty()) else {
        return Ok(ArmExtras::default());
    };
    let mut common = vec![("NCCL_NET_PLUGIN".to_string(), so.to_string())];
    let mut notes = vec![format!("net plugin {so} for both arms (NCCL_NET_PLUGIN)")];
    match gdr_level.filter(|s| !s.trim().is_empty()) {
        Some(l) => notes.push(format!("NCCL_NET_GDR_LEVEL={l} from the environment")),
        None => {
            common.push(("NCCL_NET_GDR_LEVEL".into(), "LOC".into()));
            notes.push(
                "NCCL_NET_GDR_LEVEL=LOC (GPU memory is not received directly: no devmem assumed; \
                 set NCCL_NET_GDR_LEVEL to override)"
                    .into(),
            );
        }
    }
    let tuned_map: std::collections::BTreeMap<String, String> = tuned.iter().cloned().collect();
    let mut per_arm = |arm: Arm, exp: &std::collections::BTreeMap<String, String>| {
        let c = plugin_chunk(exp, chunk).map_err(|e| format!("{} arm: {e}", arm.as_str()))?;
        notes.push(format!("{} arm: {}", arm.as_str(), c.line()));
        let mut v = common.clone();
        v.push((DYNAMIC_CHUNK_VAR.to_string(), c.bytes.to_string()));
        Ok::<_, String>(v)
    };
    let default = per_arm(Arm::Default, &Default::default())?;
    let tuned_v = per_arm(Arm::Tuned, &tuned_map)?;
    Ok(ArmExtras {
        default,
        tuned: tuned_v,
        notes,
    })
}

/// What NCCL, and the network transport under it, will change of a tuned file's settings,
/// found without running anything ([`tcpx_model::setting::effective`]): one line per value it
/// lowers (sockets x threads above the transport's cap, a network chunk above an eighth of the
/// buffer), per value outside what its reader accepts, and for a configuration left with no
/// sockets. The plugin's own rows apply where `NCCL_NET` names GPUDirect-TCPX; with another
/// plugin only NCCL's own variables are judged.
pub fn setting_findings(tuned: &[(String, String)], plugin: bool) -> Vec<String> {
    use tcpx_model::setting::{self, Network, Reader};
    let net = tuned
        .iter()
        .find(|(k, _)| k == "NCCL_NET")
        .map(|(_, v)| v.trim().to_string());
    let tcpx = net
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case(Network::Tcpx.nccl_net_name()));
    let network = if tcpx { Network::Tcpx } else { Network::Socket };
    let judged: std::collections::BTreeMap<String, String> = tuned
        .iter()
        .filter(|(k, _)| {
            setting::spec(network, k).is_some_and(|s| !plugin || tcpx || s.reader == Reader::Nccl)
        })
        .cloned()
        .collect();
    match setting::effective(network, &judged) {
        Ok(e) => {
            let mut out: Vec<String> = e
                .clamps
                .iter()
                .map(|c| format!("NCCL will not run the file's value: {c}"))
                .collect();
            if let Some(u) = e.unrunnable {
                out.push(format!("this configuration cannot run: {u}"));
            }
            out
        }
        Err(e) => vec![format!("{e} (NCCL would not take it as written)")],
    }
}

/// How a validation runs besides its [`ValidateConfig`].
#[derive(Debug, Clone)]
pub struct Setup {
    pub placement: Placement,
    pub extras: ArmExtras,
    /// Where each child's NCCL log is written (`NCCL_DEBUG_FILE`) and kept; `None`: a temporary
    /// directory, removed afterwards.
    pub log_dir: Option<std::path::PathBuf>,
    /// The most one run (both rank processes) may take before it is killed.
    pub run_deadline: std::time::Duration,
}

impl Setup {
    /// Where the children's NCCL logs go: `log_dir`, else a temporary directory named
    /// `prefix...` (returned too: it is removed when dropped).
    fn logs(&self, prefix: &str) -> (Option<tempfile::TempDir>, Option<std::path::PathBuf>) {
        let temp = match &self.log_dir {
            Some(_) => None,
            None => tempfile::Builder::new().prefix(prefix).tempdir().ok(),
        };
        let dir = self
            .log_dir
            .clone()
            .or_else(|| temp.as_ref().map(|t| t.path().to_path_buf()));
        (temp, dir)
    }

    /// Ranks where [`placement`] puts them, no plugin, logs not kept, 10 minutes a run.
    pub fn plain(placement: Placement) -> Setup {
        Setup {
            placement,
            extras: ArmExtras::default(),
            log_dir: None,
            run_deadline: std::time::Duration::from_secs(600),
        }
    }
}

/// Arguments after `tcpx-run` for rank `rank`'s process of one run of `collective` with both
/// ranks on `gpu` ([`rank`]).
pub fn rank_child_args(
    cfg: &ValidateConfig,
    collective: Collective,
    rank: usize,
    gpu: usize,
) -> Vec<String> {
    let sizes: Vec<String> = cfg.sizes.iter().map(|s| s.to_string()).collect();
    [
        "validate".to_string(),
        "--rank-child".into(),
        rank.to_string(),
        "--collective".into(),
        collective.as_str().into(),
        "--size".into(),
        sizes.join(","),
        "--iters".into(),
        cfg.iters.to_string(),
        "--warmup".into(),
        cfg.warmup.to_string(),
        "--gpus".into(),
        format!("{gpu},{gpu}"),
    ]
    .to_vec()
}

/// What NCCL's logs of every run of one arm of one collective say, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmEvidence {
    pub arm: Arm,
    /// Networks named by "Using network X" in any run.
    pub networks: Vec<String>,
    /// The largest "nNodes N" (2 when one GPU is two NCCL hosts).
    pub nodes: Option<u32>,
    /// Each variable this arm set and what NCCL (or the plugin) said it read.
    pub read: std::collections::BTreeMap<String, String>,
    /// [`nccl_log::check`]'s findings: a silent fallback, a variable never read.
    pub problems: Vec<String>,
}

/// The arm's evidence from its runs' parsed logs; `asked` is every variable the arm set.
pub fn arm_evidence(
    arm: Arm,
    logs: &[nccl_log::NcclLogEvidence],
    asked: &[(String, String)],
) -> ArmEvidence {
    let mut all = nccl_log::NcclLogEvidence::default();
    for ev in logs {
        for n in &ev.networks {
            if !all.networks.contains(n) {
                all.networks.push(n.clone());
            }
        }
        all.set_by_environment.extend(
            ev.set_by_environment
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        all.nodes = match (all.nodes, ev.nodes) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    let read = asked
        .iter()
        .filter_map(|(k, _)| Some((k.clone(), all.set_by_environment.get(k)?.clone())))
        .collect();
    ArmEvidence {
        arm,
        networks: all.networks.clone(),
        nodes: all.nodes,
        read,
        problems: nccl_log::check(&all, asked),
    }
}

/// One size's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeGain {
    pub size: u64,
    /// Receiver bus bandwidth (GB/s) over the repetitions of each arm.
    pub default: Option<FigureStats>,
    pub tuned: Option<FigureStats>,
    /// Median tuned / median default, with its 95 % interval.
    pub gain: Option<f64>,
    pub gain_lo: Option<f64>,
    pub gain_hi: Option<f64>,
}

/// The figures of every size from `(arm, size, busbw GB/s)` results.
pub fn summarise(sizes: &[u64], results: &[(Arm, u64, f64)]) -> Vec<SizeGain> {
    sizes
        .iter()
        .map(|&size| {
            let of = |arm: Arm| -> Vec<f64> {
                results
                    .iter()
                    .filter(|(a, s, _)| *a == arm && *s == size)
                    .map(|r| r.2)
                    .collect()
            };
            let (d, t) = (of(Arm::Default), of(Arm::Tuned));
            let ratio = ratio_of_medians(&d, &t);
            SizeGain {
                size,
                default: FigureStats::of(&d),
                tuned: FigureStats::of(&t),
                gain: ratio.as_ref().map(|r| r.ratio),
                gain_lo: ratio.as_ref().map(|r| r.lo),
                gain_hi: ratio.as_ref().map(|r| r.hi),
            }
        })
        .collect()
}

/// A fresh `tcpx-run` command (no arguments yet) for one repetition.
pub type BenchCommand<'a> = &'a dyn Fn() -> std::io::Result<std::process::Command>;

/// How one collective's validation came out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Measured {
        sizes: Vec<SizeGain>,
    },
    /// A run failed: the reason, and no gain (its other runs were not started).
    Failed {
        reason: String,
    },
    #[serde(rename = "n/a")]
    NotAvailable {
        reason: String,
    },
}

/// One collective's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveGains {
    pub collective: Collective,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What NCCL's own logs said, per arm (absent where no run got as far as a log).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<ArmEvidence>,
}

/// Every collective N/A for the same reason (what [`prerequisites`] said).
pub fn not_available(collectives: &[Collective], reason: &str) -> Vec<CollectiveGains> {
    collectives
        .iter()
        .map(|&collective| CollectiveGains {
            collective,
            outcome: Outcome::NotAvailable {
                reason: reason.to_string(),
            },
            evidence: Vec::new(),
        })
        .collect()
}

/// Runs every run of [`runs`] (`command` makes the bare `tcpx-run` command; arguments and
/// environment are added here): with [`Placement::TwoGpus`] one child holding both ranks
/// ([`child_args`]), with [`Placement::SharedGpu`] two rank processes ([`rank_child_args`]) with
/// their own `NCCL_HOSTID`s meeting at an `NCCL_COMM_ID` on 127.0.0.1. Every child logs at
/// `NCCL_DEBUG=INFO` (INIT, ENV, NET) to a file of its own, which is read (bounded) into each
/// arm's [`ArmEvidence`]. A collective whose run fails is `Failed` with the reason and runs no
/// more; the others go on. `progress` hears `(run, of, &run)` before each. Every run is bounded
/// by `setup.run_deadline` (its children are killed past it) and each wait inside a child by its
/// own deadline.
pub fn run_validation(
    cfg: &ValidateConfig,
    tuned: &[(String, String)],
    setup: &Setup,
    collectives: &[Collective],
    command: BenchCommand<'_>,
    progress: &mut dyn FnMut(usize, usize, &Run),
) -> Vec<CollectiveGains> {
    let all = runs(cfg.reps, collectives);
    let mut results: Vec<(Collective, Arm, u64, f64)> = Vec::new();
    let mut logs: Vec<(Collective, Arm, nccl_log::NcclLogEvidence)> = Vec::new();
    let mut failed: std::collections::BTreeMap<Collective, String> = Default::default();
    let (_temp, log_dir) = setup.logs("tcpx-validate-");
    for (i, run) in all.iter().enumerate() {
        if failed.contains_key(&run.collective) {
            continue;
        }
        progress(i + 1, all.len(), run);
        let name = format!(
            "run{:02}-rep{}-{}-{}",
            i + 1,
            run.rep + 1,
            run.collective.as_str(),
            run.arm.as_str()
        );
        let env = ChildEnv::of(run.arm, tuned, &setup.extras, log_dir.as_deref(), &name);
        let (outcome, log) = match &setup.placement {
            Placement::TwoGpus { .. } => one_run(cfg, &env, run, command, setup.run_deadline),
            Placement::SharedGpu { gpu, host_ids } => {
                shared_run(cfg, &env, run, command, *gpu, host_ids, setup.run_deadline)
            }
        };
        if !log.is_empty() {
            logs.push((run.collective, run.arm, nccl_log::parse(&log)));
        }
        match outcome {
            Ok(fs) => results.extend(
                fs.into_iter()
                    .map(|(s, bw)| (run.collective, run.arm, s, bw)),
            ),
            Err(e) => {
                let why = format!("repetition {} ({}): {e}", run.rep + 1, run.arm.as_str());
                failed.insert(run.collective, why);
            }
        }
    }
    collectives
        .iter()
        .map(|&collective| {
            let outcome = match failed.remove(&collective) {
                Some(reason) => Outcome::Failed { reason },
                None => {
                    let rs: Vec<(Arm, u64, f64)> = results
                        .iter()
                        .filter(|r| r.0 == collective)
                        .map(|r| (r.1, r.2, r.3))
                        .collect();
                    Outcome::Measured {
                        sizes: summarise(&collective_sizes(cfg, collective), &rs),
                    }
                }
            };
            let evidence = [Arm::Default, Arm::Tuned]
                .into_iter()
                .filter_map(|arm| {
                    let evs: Vec<_> = logs
                        .iter()
                        .filter(|l| l.0 == collective && l.1 == arm)
                        .map(|l| l.2.clone())
                        .collect();
                    if evs.is_empty() {
                        return None;
                    }
                    let env = ChildEnv::of(arm, tuned, &setup.extras, None, "");
                    Some(arm_evidence(arm, &evs, &env.asked))
                })
                .collect();
            CollectiveGains {
                collective,
                outcome,
                evidence,
            }
        })
        .collect()
}

/// What the caller found out about this machine and process before a validation: the GPU
/// count and libnccl (its path and version), or why either could not be found, and the process
/// environment's `NCCL_NET_GDR_LEVEL` and `NCCL_DYNAMIC_CHUNK_SIZE`.
#[derive(Debug, Clone)]
pub struct Found {
    pub gpus: Result<usize, String>,
    pub nccl: Result<String, String>,
    pub gdr_level: Option<String>,
    pub dynamic_chunk: Option<String>,
}

/// A validation as asked: the tuned file's variables, `--net-plugin`, `--nccl-logs` and the
/// most one run may take (held to 10 s - 1 h).
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub cfg: &'a ValidateConfig,
    pub tuned: &'a [(String, String)],
    pub net_plugin: Option<&'a std::path::Path>,
    pub log_dir: Option<&'a std::path::Path>,
    pub run_timeout_s: u64,
}

/// What [`validate`] found and measured, for the caller to print.
#[derive(Debug, Clone)]
pub struct Validated {
    /// What was found (libnccl, GPUs, where the ranks go), or `N/A: why`.
    pub found: String,
    pub placement: Option<Placement>,
    pub extras: ArmExtras,
    /// What NCCL will change of the tuned settings ([`setting_findings`]).
    pub settings: Vec<String>,
    pub results: Vec<CollectiveGains>,
    /// Where NCCL's logs do not show what was asked ([`evidence_problems`]).
    pub problems: Vec<String>,
    pub verdict: Verdict,
}

/// The whole of `tcpx-run validate` but the printing: the net plugin checked and its variables
/// decided ([`net_plugin_env`]), the log directory made, the tuned settings judged, then every
/// collective run interleaved ([`run_validation`]) where [`prerequisites`] hold, else N/A with the
/// reason. `say` hears each line for the user as it is known (the settings' findings, what was
/// found, the plugin's notes), `progress` each run before it starts. `Err` for a request that
/// cannot start: a `--net-plugin` that names no file, a plugin chunk the plugin cannot take, a
/// log directory that cannot be made.
pub fn validate(
    req: &Request<'_>,
    found: Found,
    command: BenchCommand<'_>,
    say: &mut dyn FnMut(&str),
    progress: &mut dyn FnMut(usize, usize, &Run),
) -> Result<Validated, String> {
    if let Some(p) = req.net_plugin {
        check_net_plugin_path(p)?;
    }
    let plugin = req.net_plugin.map(|p| p.display().to_string());
    let extras = net_plugin_env(
        plugin.as_deref(),
        req.tuned,
        found.gdr_level.as_deref(),
        found.dynamic_chunk.as_deref(),
    )?;
    if let Some(d) = req.log_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| format!("--nccl-logs {}: creating the directory: {e}", d.display()))?;
    }
    let settings = setting_findings(req.tuned, !extras.default.is_empty());
    for f in &settings {
        say(f);
    }
    let (found, placement, results) = match prerequisites(found.gpus, found.nccl, req.cfg) {
        Err(reason) => (
            format!("N/A: {reason}"),
            None,
            not_available(&Collective::ALL, &reason),
        ),
        Ok((found, placement)) => {
            say(&found);
            for n in &extras.notes {
                say(n);
            }
            let setup = Setup {
                placement: placement.clone(),
                extras: extras.clone(),
                log_dir: req.log_dir.map(std::path::Path::to_path_buf),
                run_deadline: std::time::Duration::from_secs(req.run_timeout_s.clamp(10, 3600)),
            };
            let results = run_validation(
                req.cfg,
                req.tuned,
                &setup,
                &Collective::ALL,
                command,
                progress,
            );
            (found, Some(placement), results)
        }
    };
    let problems = evidence_problems(&results);
    let verdict = Verdict::of(&results, &problems);
    Ok(Validated {
        found,
        placement,
        extras,
        settings,
        results,
        problems,
        verdict,
    })
}

/// What [`run_point`] returns: the figures per size (or why the run failed) and NCCL's log.
pub type PointOutcome = (Result<Vec<(u64, f64)>, String>, Option<ArmEvidence>);

/// One send/recv run with `vars` set on top of NCCL's defaults (and `setup.extras`' tuned-arm
/// variables): a point of `tcpx-run tune`. Where `setup.placement` puts the ranks, bounded by
/// `setup.run_deadline`, NCCL logging to `<log dir>/<name>[-rankN].log`. Returns the figures
/// (`(size, receiver busbw GB/s)`) or why the run failed, and what NCCL's log says it used and
/// read (`None` when no log was written).
pub fn run_point(
    cfg: &ValidateConfig,
    vars: &[(String, String)],
    setup: &Setup,
    command: BenchCommand<'_>,
    name: &str,
) -> PointOutcome {
    let (_temp, log_dir) = setup.logs("tcpx-tune-point-");
    let run = Run {
        rep: 0,
        arm: Arm::Tuned,
        collective: Collective::SendRecv,
    };
    let env = ChildEnv::of(Arm::Tuned, vars, &setup.extras, log_dir.as_deref(), name);
    let (outcome, log) = match &setup.placement {
        Placement::TwoGpus { .. } => one_run(cfg, &env, &run, command, setup.run_deadline),
        Placement::SharedGpu { gpu, host_ids } => {
            shared_run(cfg, &env, &run, command, *gpu, host_ids, setup.run_deadline)
        }
    };
    let evidence = (!log.trim().is_empty())
        .then(|| arm_evidence(Arm::Tuned, &[nccl_log::parse(&log)], &env.asked));
    (outcome, evidence)
}

/// One `tcpx-run` child with `args` (a `bench ... --json` run; none of this process's `TCPX_*`
/// fallbacks reach it), killed past `limit`: its JSON document's `(size, receiver busbw GB/s)`,
/// or why it failed (its exit status and the end of its stderr).
pub fn run_bench_child(
    args: &[String],
    command: BenchCommand<'_>,
    limit: std::time::Duration,
) -> Result<Vec<(u64, f64)>, String> {
    let deadline = std::time::Instant::now() + limit;
    let mut cmd = command().map_err(|e| format!("{e:#}"))?;
    cmd.args(args);
    for k in BENCH_ENV.iter() {
        cmd.env_remove(k);
    }
    let started = start(cmd)?;
    let (status, stdout, stderr) = finish_all(vec![started], deadline).remove(0);
    let Some(status) = status else {
        return Err(format!(
            "did not finish within {limit:?} and was killed: {}",
            tail(&stderr)
        ));
    };
    if !status.success() {
        return Err(format!("{status}: {}", tail(&stderr)));
    }
    figures_of(Collective::SendRecv, &stdout)
}

/// The environment of one run's children.
#[derive(Debug, Clone)]
struct ChildEnv {
    remove: Vec<String>,
    /// What the arm sets (tuned variables and [`ArmExtras`]): what its log must show read.
    asked: Vec<(String, String)>,
    /// NCCL's logging: INFO of INIT, ENV and NET, to `<dir>/<name>[-rankN].log`.
    log: Option<std::path::PathBuf>,
}

impl ChildEnv {
    fn of(
        arm: Arm,
        tuned: &[(String, String)],
        extras: &ArmExtras,
        dir: Option<&std::path::Path>,
        name: &str,
    ) -> ChildEnv {
        let (mut remove, set) = arm_env(arm, tuned);
        let extra = match arm {
            Arm::Default => &extras.default,
            Arm::Tuned => &extras.tuned,
        };
        let mut asked: Vec<(String, String)> = set
            .into_iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .collect();
        asked.extend(extra.iter().cloned());
        remove.extend(LOG_ENV.iter().map(|s| s.to_string()));
        ChildEnv {
            remove,
            asked,
            log: dir.map(|d| d.join(name)),
        }
    }

    fn apply(&self, cmd: &mut std::process::Command, rank: Option<usize>) {
        for k in &self.remove {
            cmd.env_remove(k);
        }
        cmd.envs(self.asked.iter().map(|(k, v)| (k, v)));
        if let Some(base) = &self.log {
            cmd.env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET")
                .env("NCCL_DEBUG_FILE", self.log_path(base, rank));
        }
    }

    fn log_path(&self, base: &std::path::Path, rank: Option<usize>) -> std::path::PathBuf {
        let mut n = base.as_os_str().to_owned();
        if let Some(r) = rank {
            n.push(format!("-rank{r}"));
        }
        n.push(".log");
        n.into()
    }

    /// The logs the children wrote, each read up to half of [`nccl_log::MAX_LOG_BYTES`].
    fn read_logs(&self, ranks: &[Option<usize>]) -> String {
        use std::io::Read;
        let Some(base) = &self.log else {
            return String::new();
        };
        let mut text = String::new();
        for &r in ranks {
            let mut bytes = Vec::new();
            if let Ok(f) = std::fs::File::open(self.log_path(base, r)) {
                let _ = f
                    .take((nccl_log::MAX_LOG_BYTES / 2) as u64)
                    .read_to_end(&mut bytes);
            }
            text.push_str(&String::from_utf8_lossy(&bytes));
            text.push('\n');
        }
        text
    }
}

/// NCCL's logging variables: the children's are set here, never inherited.
const LOG_ENV: &[&str] = &["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"];

/// The sizes a collective reports: all-reduce moves whole f32 values, so sizes round down to 4.
fn collective_sizes(cfg: &ValidateConfig, collective: Collective) -> Vec<u64> {
    match collective {
        Collective::SendRecv => cfg.sizes.clone(),
        Collective::AllReduce => cfg
            .sizes
            .iter()
            .map(|s| s / 4 * 4)
            .filter(|s| *s > 0)
            .collect(),
    }
}

/// Most of a child's stdout kept (its JSON document is far smaller); the rest is drained.
const MAX_CHILD_OUTPUT: u64 = 1 << 20;

/// A started child whose stdout and stderr are read (bounded) on threads of their own.
struct Started {
    child: std::process::Child,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
}

fn start(mut cmd: std::process::Command) -> Result<Started, String> {
    use std::io::Read;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting tcpx-run: {e}"))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut r) = r {
                let _ = (&mut r).take(MAX_CHILD_OUTPUT).read_to_end(&mut kept);
                let _ = std::io::copy(&mut r, &mut std::io::sink());
            }
            kept
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    Ok(Started { child, out, err })
}

/// What a finished child left: exit status (None: killed, at the deadline or because another
/// child failed), stdout, stderr.
type Finished = (Option<std::process::ExitStatus>, Vec<u8>, Vec<u8>);

/// Waits for every child until `deadline` passes; once one fails, or at the deadline, the others
/// are killed (a rank whose peer died would only wait out its own NCCL deadline).
fn finish_all(mut started: Vec<Started>, deadline: std::time::Instant) -> Vec<Finished> {
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; started.len()];
    loop {
        for (s, st) in started.iter_mut().zip(status.iter_mut()) {
            if st.is_none() {
                if let Ok(Some(x)) = s.child.try_wait() {
                    *st = Some(x);
                }
            }
        }
        let done = status.iter().all(|s| s.is_some());
        let one_failed = status.iter().flatten().any(|s| !s.success());
        if done || one_failed || std::time::Instant::now() >= deadline {
            break;
        }
        // Polled: std has no wait with a timeout; 20 ms is small against a run's seconds.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    started
        .into_iter()
        .zip(status)
        .map(|(mut s, st)| {
            let st = match st {
                Some(x) => Some(x),
                None => {
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                    None
                }
            };
            let out = s.out.join().unwrap_or_default();
            let err = s.err.join().unwrap_or_default();
            (st, out, err)
        })
        .collect()
}

fn tail(bytes: &[u8]) -> String {
    let t = String::from_utf8_lossy(bytes);
    let t = t.trim();
    let cut = t.len().saturating_sub(2000);
    let cut = (cut..=t.len())
        .find(|&i| t.is_char_boundary(i))
        .unwrap_or(0);
    t[cut..].to_string()
}

fn one_run(
    cfg: &ValidateConfig,
    env: &ChildEnv,
    run: &Run,
    command: BenchCommand<'_>,
    limit: std::time::Duration,
) -> (Result<Vec<(u64, f64)>, String>, String) {
    let deadline = std::time::Instant::now() + limit;
    let mut cmd = match command() {
        Ok(c) => c,
        Err(e) => return (Err(format!("{e:#}")), String::new()),
    };
    cmd.args(child_args(cfg, run.collective));
    env.apply(&mut cmd, None);
    let started = match start(cmd) {
        Ok(s) => s,
        Err(e) => return (Err(e), String::new()),
    };
    let (status, stdout, stderr) = finish_all(vec![started], deadline).remove(0);
    let log = env.read_logs(&[None]);
    let Some(status) = status else {
        return (
            Err(format!(
                "did not finish within {limit:?} and was killed: {}",
                tail(&stderr)
            )),
            log,
        );
    };
    // The all-reduce child reports its own failure in its document; the bench on stderr.
    let r = match figures_of(run.collective, &stdout) {
        Ok(f) if status.success() => Ok(f),
        Err(e) if status.success() => Err(e),
        Err(e) if run.collective == Collective::AllReduce && !stdout.is_empty() => Err(e),
        _ => Err(format!("{status}: {}", tail(&stderr))),
    };
    (r, log)
}

/// Whether a child other than `me` exited unsuccessfully.
fn other_failed(done: &[Finished], me: usize) -> bool {
    done.iter()
        .enumerate()
        .any(|(i, d)| i != me && d.0.is_some_and(|s| !s.success()))
}

/// One run as two rank processes on `gpu`, NCCL hosts `host_ids`: rank 1's (the receiver's)
/// document is the figure; a failure names the rank and what it said.
fn shared_run(
    cfg: &ValidateConfig,
    env: &ChildEnv,
    run: &Run,
    command: BenchCommand<'_>,
    gpu: usize,
    host_ids: &[String; 2],
    limit: std::time::Duration,
) -> (Result<Vec<(u64, f64)>, String>, String) {
    let deadline = std::time::Instant::now() + limit;
    // NCCL's rendezvous: rank 0 listens here. Taken from the kernel and let go just before; a
    // port taken in between fails rank 0's init with the address in its error.
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => {
            return (
                Err(format!("finding a free port on 127.0.0.1: {e}")),
                String::new(),
            )
        }
    };
    let mut started = Vec::new();
    for (rank, host) in host_ids.iter().enumerate() {
        let mut cmd = match command() {
            Ok(c) => c,
            Err(e) => return (Err(format!("{e:#}")), String::new()),
        };
        cmd.args(rank_child_args(cfg, run.collective, rank, gpu));
        env.apply(&mut cmd, Some(rank));
        cmd.env("NCCL_HOSTID", host)
            .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"));
        match start(cmd) {
            Ok(s) => started.push(s),
            Err(e) => {
                // Nothing to wait for from a rank that never started: the other is killed.
                let _ = finish_all(started, std::time::Instant::now());
                return (Err(format!("rank {rank}: {e}")), String::new());
            }
        }
    }
    let done = finish_all(started, deadline);
    let log = env.read_logs(&[Some(0), Some(1)]);
    let mut why = Vec::new();
    for (rank, (status, stdout, stderr)) in done.iter().enumerate() {
        let doc = serde_json::from_slice::<allreduce::ChildOutcome>(stdout);
        match (status, doc) {
            (None, _) if other_failed(&done, rank) => why.push(format!(
                "rank {rank} was killed once the other rank had failed"
            )),
            (None, _) => why.push(format!(
                "rank {rank} did not finish within {limit:?} and was killed: {}",
                tail(stderr)
            )),
            (Some(_), Ok(allreduce::ChildOutcome::Failed { error })) => {
                why.push(format!("rank {rank}: {error}"))
            }
            (Some(s), Err(_)) if !s.success() => {
                why.push(format!("rank {rank}: {s}: {}", tail(stderr)))
            }
            _ => {}
        }
    }
    if !why.is_empty() {
        return (Err(why.join("; ")), log);
    }
    let r = serde_json::from_slice::<allreduce::ChildOutcome>(&done[1].1)
        .map_err(|e| format!("reading rank 1's JSON document: {e}"))
        .and_then(|d| d.figures());
    (r, log)
}

/// The command-line table: one row per collective and size, receiver (send/recv) or nccl-tests
/// (all-reduce) busbw of each arm as median [interval], the gain with its interval; a collective
/// that failed or is N/A is one line with the reason.
pub fn table(found: &str, source: &std::path::Path, results: &[CollectiveGains]) -> String {
    let stats = |f: &Option<FigureStats>| {
        f.as_ref().map_or_else(
            || "-".into(),
            |f| format!("{:.2} [{:.2}, {:.2}]", f.median, f.ci95_lo, f.ci95_hi),
        )
    };
    let mut s = format!(
        "# tcpx-run validate {}: libnccl send/recv (nccl backend) and all-reduce, {found}\n\
         # busbw GB/s (1e9 B/s): median [95% interval] over the repetitions; gain = tuned / default\n\
         #{:>10} {:>12} {:>26} {:>26} {:>24}\n",
        source.display(),
        "collective",
        "size",
        "default",
        "tuned",
        "gain"
    );
    for c in results {
        match &c.outcome {
            Outcome::Measured { sizes } => {
                for g in sizes {
                    let gain = match (g.gain, g.gain_lo, g.gain_hi) {
                        (Some(r), Some(lo), Some(hi)) => format!("{r:.3} [{lo:.3}, {hi:.3}]"),
                        _ => "-".into(),
                    };
                    s.push_str(&format!(
                        " {:>10} {:>12} {:>26} {:>26} {:>24}\n",
                        c.collective.as_str(),
                        g.size,
                        stats(&g.default),
                        stats(&g.tuned),
                        gain
                    ));
                }
            }
            Outcome::Failed { reason } => {
                s.push_str(&format!("# {}: FAILED: {reason}\n", c.collective.as_str()))
            }
            Outcome::NotAvailable { reason } => {
                s.push_str(&format!("# {}: N/A: {reason}\n", c.collective.as_str()))
            }
        }
        for e in &c.evidence {
            s.push_str(&evidence_line(c.collective, e));
        }
    }
    s
}

/// One arm's NCCL log evidence as table lines: the network, the nodes, what was read, and
/// every problem on a line of its own starting `# WARNING`.
pub fn evidence_line(collective: Collective, e: &ArmEvidence) -> String {
    let nets = if e.networks.is_empty() {
        "none named".to_string()
    } else {
        e.networks.join("+")
    };
    let read: Vec<String> = e.read.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut s = format!(
        "# {} {}: NCCL log: network {nets}, nNodes {}, read {}\n",
        collective.as_str(),
        e.arm.as_str(),
        e.nodes.map_or("?".to_string(), |n| n.to_string()),
        if read.is_empty() {
            "(nothing asked)".to_string()
        } else {
            read.join(" ")
        }
    );
    for p in &e.problems {
        s.push_str(&format!(
            "# WARNING {} {}: {p}\n",
            collective.as_str(),
            e.arm.as_str()
        ));
    }
    s
}

/// Every evidence problem of every collective and arm, prefixed with where it was found.
pub fn evidence_problems(results: &[CollectiveGains]) -> Vec<String> {
    results
        .iter()
        .flat_map(|c| {
            c.evidence.iter().flat_map(move |e| {
                e.problems
                    .iter()
                    .map(move |p| format!("{} {}: {p}", c.collective.as_str(), e.arm.as_str()))
            })
        })
        .collect()
}

/// The plan's `validate()`: one sentence of every size's figures, and the gain at the largest
/// size that has one.
pub fn headline(gains: &[SizeGain]) -> Option<(f64, f64, f64, String)> {
    let detail: Vec<String> = gains
        .iter()
        .map(|g| match (&g.default, &g.tuned, g.gain) {
            (Some(d), Some(t), Some(r)) => format!(
                "{} B: default {:.2} GB/s, tuned {:.2} GB/s, gain {r:.3} [{:.3}, {:.3}]",
                g.size,
                d.median,
                t.median,
                g.gain_lo.unwrap_or(r),
                g.gain_hi.unwrap_or(r)
            ),
            _ => format!("{} B: not measured", g.size),
        })
        .collect();
    let top = gains.iter().rev().find(|g| g.gain.is_some())?;
    Some((top.gain?, top.gain_lo?, top.gain_hi?, detail.join("; ")))
}

/// The plan's `validate()` result from both collectives: send/recv's gain at its largest size is
/// the figure (it is what the plan's transfers are); all-reduce's headline, or why it has none,
/// follows in the detail. Send/recv without a gain makes the whole validation N/A with the reason.
pub fn plan_validation(results: &[CollectiveGains]) -> tcpx_plan::Validation {
    use tcpx_plan::Validation;
    let part = |c: Collective| {
        results
            .iter()
            .find(|r| r.collective == c)
            .map(|r| &r.outcome)
    };
    let text = |o: Option<&Outcome>| -> Result<(f64, f64, f64, String), String> {
        match o {
            Some(Outcome::Measured { sizes }) => {
                headline(sizes).ok_or_else(|| "no size was measured by both arms".to_string())
            }
            Some(Outcome::Failed { reason }) => Err(format!("failed: {reason}")),
            Some(Outcome::NotAvailable { reason }) => Err(format!("N/A: {reason}")),
            None => Err("not run".to_string()),
        }
    };
    let allreduce = match text(part(Collective::AllReduce)) {
        Ok((g, lo, hi, detail)) => {
            format!("all-reduce busbw gain {g:.3} [{lo:.3}, {hi:.3}] ({detail})")
        }
        Err(why) => format!("all-reduce: {why}"),
    };
    match text(part(Collective::SendRecv)) {
        Ok((gain, lo, hi, detail)) => Validation::Measured {
            gain,
            lo,
            hi,
            detail: format!("send/recv: {detail}; {allreduce}"),
        },
        Err(why) => Validation::NotAvailable(format!("send/recv: {why}; {allreduce}")),
    }
}

/// Variables as an arm's environment holds them, from literal pairs (this module's tests and
/// its submodules').
#[cfg(test)]
fn vars(kv: &[(&str, &str)]) -> Vec<(String, String)> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_tuned_files_values_that_nccl_would_lower_are_named_before_anything_runs() {
        let v = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(setting_findings(
            &v(&[
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_NSOCKS_PERTHREAD", "4")
            ]),
            false
        )
        .is_empty());
        let f = setting_findings(
            &v(&[
                ("NCCL_P2P_NET_CHUNKSIZE", "4194304"),
                ("NCCL_BUFFSIZE", "4194304"),
            ]),
            false,
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("NCCL_BUFFSIZE/8"), "{f:?}");
        let f = setting_findings(
            &v(&[
                ("NCCL_NET", "GPUDirectTCPX_v7"),
                ("NCCL_SOCKET_NTHREADS", "4"),
                ("NCCL_NSOCKS_PERTHREAD", "4"),
            ]),
            true,
        );
        assert!(
            f.iter().any(|l| l.contains("NCCL_NSOCKS_PERTHREAD=2")),
            "{f:?}"
        );
        // Another plugin: its own sockets are not judged by GPUDirect-TCPX's limits.
        assert!(setting_findings(&v(&[("NCCL_NSOCKS_PERTHREAD", "16")]), true).is_empty());
        assert!(!setting_findings(&v(&[("NCCL_BUFFSIZE", "lots")]), false).is_empty());
    }
    use super::*;

    fn cfg() -> ValidateConfig {
        ValidateConfig {
            sizes: vec![1 << 20, 64 << 20],
            reps: 4,
            iters: 5,
            warmup: 1,
            send_gpu: 0,
            recv_gpu: 1,
        }
    }

    #[test]
    fn without_libnccl_a_validation_is_not_available_and_runs_nothing_after_saying_why() {
        let tuned = vars(&[
            ("NCCL_P2P_NET_CHUNKSIZE", "4194304"),
            ("NCCL_BUFFSIZE", "4194304"),
        ]);
        let logs = tempfile::tempdir().unwrap();
        let log_dir = logs.path().join("a/b");
        let c = cfg();
        let req = Request {
            cfg: &c,
            tuned: &tuned,
            net_plugin: None,
            log_dir: Some(&log_dir),
            run_timeout_s: 1,
        };
        let found = || Found {
            gpus: Ok(2),
            nccl: Err("libnccl.so.2 could not be loaded".into()),
            gdr_level: None,
            dynamic_chunk: None,
        };
        let never = || -> std::io::Result<std::process::Command> { panic!("nothing may run") };
        let mut said = Vec::new();
        let v = validate(
            &req,
            found(),
            &never,
            &mut |l| said.push(l.to_string()),
            &mut |_, _, _| panic!("no run may start"),
        )
        .unwrap();
        assert_eq!(v.verdict, Verdict::NotAvailable);
        assert!(
            v.found.starts_with("N/A: no libnccl here: libnccl.so.2"),
            "{}",
            v.found
        );
        assert!(v.placement.is_none());
        assert_eq!(v.results.len(), Collective::ALL.len());
        // The settings NCCL would lower are said before anything else, and the log directory
        // was made.
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("NCCL_BUFFSIZE/8"), "{said:?}");
        assert!(log_dir.is_dir());
        // A request that cannot start is refused, naming what to fix.
        let missing = logs.path().join("no-such-plugin.so");
        let e = validate(
            &Request {
                net_plugin: Some(&missing),
                ..req.clone()
            },
            found(),
            &never,
            &mut |_| {},
            &mut |_, _, _| {},
        )
        .unwrap_err();
        assert!(e.contains("no-such-plugin.so"), "{e}");
        let file = logs.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = validate(
            &Request {
                log_dir: Some(&file.join("x")),
                ..req.clone()
            },
            found(),
            &never,
            &mut |_| {},
            &mut |_, _, _| {},
        )
        .unwrap_err();
        assert!(
            e.starts_with("--nccl-logs ") && e.contains("creating the directory"),
            "{e}"
        );
        let e = validate(
            &req,
            Found {
                dynamic_chunk: Some("0".into()),
                ..found()
            },
            &never,
            &mut |_| {},
            &mut |_, _, _| {},
        );
        // No plugin: the chunk variable is not the validation's business.
        assert!(e.is_ok());
    }

    #[test]
    fn only_nccl_variables_differ_between_the_arms() {
        let tuned = vec![
            ("NCCL_NSOCKS_PERTHREAD".to_string(), "4".to_string()),
            ("NCCL_SOCKET_NTHREADS".to_string(), "4".to_string()),
            ("UCCL_TCPX_WINDOW_SIZE".to_string(), "8".to_string()),
            ("TCPX_CHANNELS".to_string(), "4".to_string()),
        ];
        let (rd, sd) = arm_env(Arm::Default, &tuned);
        let (rt, st) = arm_env(Arm::Tuned, &tuned);
        assert_eq!(rd, rt, "both arms clear the same variables");
        assert!(rd.contains(&"NCCL_NSOCKS_PERTHREAD".to_string()));
        assert!(
            rd.contains(&"TCPX_WINDOW".to_string()),
            "bench fallbacks cleared"
        );
        assert!(sd.is_empty());
        assert_eq!(
            st.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_NTHREADS"]
        );
    }

    #[test]
    fn bench_args_name_the_nccl_backend_on_two_gpus() {
        let a = bench_args(&cfg()).join(" ");
        assert!(
            a.contains("--transport nccl --memory cuda:0,1 --channels 1"),
            "{a}"
        );
        assert!(
            a.contains("--size 1048576,67108864 --iters 5 --warmup 1"),
            "{a}"
        );
        assert!(a.ends_with("--json --name validate"), "{a}");
    }

    #[test]
    fn the_schedule_interleaves_and_rotates() {
        let s = schedule(3);
        assert_eq!(
            s,
            vec![
                (0, Arm::Default),
                (0, Arm::Tuned),
                (1, Arm::Tuned),
                (1, Arm::Default),
                (2, Arm::Default),
                (2, Arm::Tuned)
            ]
        );
    }

    #[test]
    fn every_repetition_runs_both_collectives_with_both_arms_in_rotating_order() {
        use Arm::{Default as D, Tuned as T};
        use Collective::{AllReduce as A, SendRecv as S};
        let got: Vec<(u32, Arm, Collective)> = runs(2, &Collective::ALL)
            .iter()
            .map(|r| (r.rep, r.arm, r.collective))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, D, S),
                (0, T, S),
                (0, D, A),
                (0, T, A),
                (1, T, S),
                (1, D, S),
                (1, T, A),
                (1, D, A)
            ]
        );
        assert_eq!(runs(3, &[S]).len(), 6);
    }

    #[test]
    fn the_allreduce_child_is_tcpx_run_validate_with_the_same_sizes_and_gpus() {
        let mut c = cfg();
        c.send_gpu = 2;
        c.recv_gpu = 3;
        let a = child_args(&c, Collective::AllReduce).join(" ");
        assert_eq!(
            a,
            "validate --allreduce-child --size 1048576,67108864 --iters 5 --warmup 1 --gpus 2,3"
        );
        assert_eq!(child_args(&c, Collective::SendRecv), bench_args(&c));
        assert_eq!(
            collective_sizes(
                &ValidateConfig {
                    sizes: vec![2, 4097],
                    ..c
                },
                Collective::AllReduce
            ),
            vec![4096]
        );
    }

    #[test]
    fn figures_come_from_each_childs_json_document() {
        let bench = br#"{"start":{},"measurements":[{"size":1048576,"recv":{"busbw_gbs":4.5},"send":{"busbw_gbs":9.0}}],"end":{}}"#;
        assert_eq!(
            figures_of(Collective::SendRecv, bench).unwrap(),
            vec![(1048576, 4.5)]
        );
        let ar = serde_json::to_vec(&allreduce::ChildOutcome::Measured {
            nccl: "libnccl 2.28".into(),
            rows: vec![allreduce::AllReduceRow {
                size: 4096,
                iters: 1,
                median_s: 1e-5,
                algbw_gbs: 0.4096,
                busbw_gbs: 0.4096,
            }],
        })
        .unwrap();
        assert_eq!(
            figures_of(Collective::AllReduce, &ar).unwrap(),
            vec![(4096, 0.4096)]
        );
        // A bench document fed to the all-reduce reader is refused, not read as empty.
        let e = figures_of(Collective::AllReduce, bench).unwrap_err();
        assert!(e.contains("all-reduce child's JSON"), "{e}");
        let e = figures_of(Collective::SendRecv, b"# table text").unwrap_err();
        assert!(e.contains("bench's JSON"), "{e}");
    }

    #[test]
    fn results_serialise_with_their_status_and_the_table_shows_each_collective() {
        let mut r = Vec::new();
        for (d, t) in [(4.0, 7.4), (4.1, 7.5), (3.9, 7.6)] {
            r.push((Arm::Default, 1 << 20, d));
            r.push((Arm::Tuned, 1 << 20, t));
        }
        let mut res = vec![CollectiveGains {
            collective: Collective::SendRecv,
            outcome: Outcome::Measured {
                sizes: summarise(&[1 << 20], &r),
            },
            evidence: Vec::new(),
        }];
        res.push(CollectiveGains {
            collective: Collective::AllReduce,
            outcome: Outcome::Failed {
                reason: "repetition 1 (default): ncclCommInitRank timed out".into(),
            },
            evidence: Vec::new(),
        });
        let v = serde_json::to_value(&res).unwrap();
        assert_eq!(v[0]["collective"], "sendrecv");
        assert_eq!(v[0]["status"], "measured");
        assert!(v[0]["sizes"][0]["gain"].as_f64().unwrap() > 1.8);
        assert_eq!(v[1]["status"], "failed");
        let back: Vec<CollectiveGains> = serde_json::from_value(v).unwrap();
        assert_eq!(back, res);
        let t = table(
            "libnccl 2.28, 2 GPUs",
            std::path::Path::new("tuned.env"),
            &res,
        );
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("sendrecv"))
            .unwrap();
        assert_eq!(row.split_whitespace().nth(1), Some("1048576"), "{t}");
        assert!(t.contains("# allreduce: FAILED: repetition 1"), "{t}");
        let na = not_available(&Collective::ALL, "no libnccl here");
        let v = serde_json::to_value(&na).unwrap();
        assert_eq!(v[1]["collective"], "allreduce");
        assert_eq!(v[1]["status"], "n/a");
        assert_eq!(v[1]["reason"], "no libnccl here");
        assert!(table("", std::path::Path::new("x"), &na).contains("# allreduce: N/A: no libnccl"));
    }

    #[test]
    fn missing_nccl_or_gpus_give_the_reason() {
        let c = cfg();
        let e = prerequisites(Ok(2), Err("libnccl.so.2: not found".into()), &c).unwrap_err();
        assert!(e.contains("libnccl") && e.contains("not found"), "{e}");
        let e = prerequisites(Err("no CUDA driver".into()), Ok("2.28".into()), &c).unwrap_err();
        assert!(e.contains("no CUDA driver"), "{e}");
        let e = prerequisites(Ok(0), Ok("2.28".into()), &c).unwrap_err();
        assert!(e.contains("no GPU"), "{e}");
        let (found, p) = prerequisites(Ok(2), Ok("libnccl 2.28".into()), &c).unwrap();
        assert!(matches!(p, Placement::TwoGpus { .. }), "{p:?}");
        assert!(found.contains("GPUs 0 and 1 as 1 NCCL host"), "{found}");
        let (found, p) = prerequisites(Ok(1), Ok("libnccl 2.28".into()), &c).unwrap();
        assert!(found.contains("1 GPU as 2 NCCL hosts"), "{found}");
        assert!(matches!(p, Placement::SharedGpu { gpu: 0, .. }), "{p:?}");
    }

    #[test]
    fn one_gpu_is_two_nccl_hosts_with_distinct_host_ids() {
        let ids = host_ids(2);
        assert_eq!(ids.len(), 2);
        assert_ne!(
            ids[0], ids[1],
            "equal ids make NCCL refuse two ranks on one GPU"
        );
        let mut four = host_ids(4);
        four.sort();
        four.dedup();
        assert_eq!(four.len(), 4);
        let mut c = cfg();
        // Two GPUs named and present: each rank on its own.
        assert_eq!(
            placement(8, &c).unwrap(),
            Placement::TwoGpus {
                send_gpu: 0,
                recv_gpu: 1
            }
        );
        // One GPU: both ranks on GPU 0, as two hosts.
        match placement(1, &c).unwrap() {
            Placement::SharedGpu { gpu, host_ids: h } => {
                assert_eq!(gpu, 0);
                assert_ne!(h[0], h[1]);
            }
            other => panic!("{other:?}"),
        }
        // The same GPU named twice asks for two hosts even where more GPUs exist.
        c.send_gpu = 3;
        c.recv_gpu = 3;
        assert!(matches!(
            placement(8, &c).unwrap(),
            Placement::SharedGpu { gpu: 3, .. }
        ));
        // A sender GPU that does not exist falls back to GPU 0.
        c.recv_gpu = 5;
        assert!(matches!(
            placement(2, &c).unwrap(),
            Placement::SharedGpu { gpu: 0, .. }
        ));
        assert!(placement(0, &c).is_err());
        let d = placement(1, &cfg()).unwrap().describe();
        assert!(d.starts_with("1 GPU as 2 NCCL hosts"), "{d}");
        let v = serde_json::to_value(placement(1, &cfg()).unwrap()).unwrap();
        assert_eq!(v["kind"], "shared_gpu");
        assert_eq!(v["host_ids"][1], "tcpx-lab-host1");
    }

    #[test]
    fn rank_children_name_their_rank_collective_and_shared_gpu() {
        let a = rank_child_args(&cfg(), Collective::AllReduce, 1, 0).join(" ");
        assert_eq!(
            a,
            "validate --rank-child 1 --collective allreduce --size 1048576,67108864 --iters 5 \
             --warmup 1 --gpus 0,0"
        );
    }

    #[test]
    fn a_net_plugin_goes_to_both_arms_with_gdr_off_and_never_a_zero_chunk() {
        assert_eq!(
            net_plugin_env(None, &[], None, None).unwrap(),
            ArmExtras::default()
        );
        let tuned = vars(&[
            ("NCCL_DYNAMIC_CHUNK_SIZE", "1048576"),
            ("NCCL_NSOCKS_PERTHREAD", "4"),
        ]);
        let x = net_plugin_env(Some("/p/libnccl-net.so"), &tuned, None, None).unwrap();
        for arm in [&x.default, &x.tuned] {
            assert!(arm.contains(&("NCCL_NET_PLUGIN".into(), "/p/libnccl-net.so".into())));
            assert!(arm.contains(&("NCCL_NET_GDR_LEVEL".into(), "LOC".into())));
        }
        // The default arm gets Google's chunk, never the plugin's own 0; tuned keeps its own.
        assert!(x
            .default
            .contains(&("NCCL_DYNAMIC_CHUNK_SIZE".into(), "524288".into())));
        assert!(x
            .tuned
            .contains(&("NCCL_DYNAMIC_CHUNK_SIZE".into(), "1048576".into())));
        assert!(
            x.notes.iter().any(|n| n.contains("supplies")),
            "{:?}",
            x.notes
        );
        // From tuned.env's own NCCL_NET_PLUGIN, and a GDR level from the environment kept.
        let t2 = vars(&[("NCCL_NET_PLUGIN", "/q/x.so")]);
        let x = net_plugin_env(None, &t2, Some("PHB"), Some("262144")).unwrap();
        assert!(x
            .default
            .contains(&("NCCL_NET_PLUGIN".into(), "/q/x.so".into())));
        assert!(!x.default.iter().any(|(k, _)| k == "NCCL_NET_GDR_LEVEL"));
        assert!(x
            .tuned
            .contains(&("NCCL_DYNAMIC_CHUNK_SIZE".into(), "262144".into())));
        // A zero chunk is refused with the fix.
        let e = net_plugin_env(
            Some("/p.so"),
            &vars(&[("NCCL_DYNAMIC_CHUNK_SIZE", "0")]),
            None,
            None,
        )
        .unwrap_err();
        assert!(e.contains("tuned arm") && e.contains("0-byte"), "{e}");
        let e = net_plugin_env(Some("/p.so"), &[], None, Some("0")).unwrap_err();
        assert!(e.contains("default arm"), "{e}");
    }

    #[test]
    fn each_arm_asks_its_tuned_variables_and_the_plugins() {
        let tuned = vars(&[("NCCL_NSOCKS_PERTHREAD", "4"), ("TCPX_CHANNELS", "2")]);
        let x = net_plugin_env(Some("/p.so"), &tuned, None, None).unwrap();
        let d = ChildEnv::of(Arm::Default, &tuned, &x, None, "r");
        let t = ChildEnv::of(Arm::Tuned, &tuned, &x, None, "r");
        assert!(!d.asked.iter().any(|(k, _)| k == "NCCL_NSOCKS_PERTHREAD"));
        assert!(t
            .asked
            .contains(&("NCCL_NSOCKS_PERTHREAD".into(), "4".into())));
        assert!(d.asked.iter().any(|(k, _)| k == "NCCL_NET_PLUGIN"));
        assert!(
            d.remove.contains(&"NCCL_DEBUG_FILE".to_string()),
            "logs never inherited"
        );
    }

    /// Real NCCL 2.28.9 logs (ci/real-tcpx/onegpu-nccl.py on nvidia-h100-x1, issue 29).
    const SOCKET_LOG: &str = include_str!(
        "../../tcpx-transport/src/nccl/fixtures/nccl-2.28-onegpu-socket-tuned-rank1.log"
    );
    const TCPX_LOG: &str = include_str!(
        "../../tcpx-transport/src/nccl/fixtures/nccl-2.28-onegpu-gpudirecttcpx-tuned-rank1.log"
    );

    #[test]
    fn evidence_from_real_logs_proves_the_network_and_flags_a_fallback() {
        let tuned = vars(&[
            ("NCCL_NSOCKS_PERTHREAD", "4"),
            ("NCCL_SOCKET_NTHREADS", "4"),
        ]);
        let sock = nccl_log::parse(SOCKET_LOG);
        let e = arm_evidence(Arm::Tuned, std::slice::from_ref(&sock), &tuned);
        assert_eq!(e.networks, ["Socket"]);
        assert_eq!(e.nodes, Some(2));
        assert_eq!(e.read["NCCL_SOCKET_NTHREADS"], "4");
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        // A plugin asked for, NET/Socket used: flagged, and in the table and the problem list.
        let x = net_plugin_env(Some("/tmp/plq/libnccl-net.so"), &tuned, None, None).unwrap();
        let asked = ChildEnv::of(Arm::Tuned, &tuned, &x, None, "r").asked;
        let e = arm_evidence(Arm::Tuned, &[sock], &asked);
        assert!(
            e.problems.iter().any(|p| p.contains("silent fallback")),
            "{:?}",
            e.problems
        );
        let line = evidence_line(Collective::SendRecv, &e);
        assert!(
            line.contains("# WARNING sendrecv tuned: NCCL used its own Socket"),
            "{line}"
        );
        // The real plugin run read the plugin, its chunk and GDR level: nothing to flag.
        let tcpx = nccl_log::parse(TCPX_LOG);
        let t = vars(&[
            ("NCCL_NSOCKS_PERTHREAD", "4"),
            ("NCCL_SOCKET_NTHREADS", "1"),
        ]);
        let x = net_plugin_env(Some("/tmp/plq/libnccl-net.so"), &t, None, None).unwrap();
        let asked = ChildEnv::of(Arm::Tuned, &t, &x, None, "r").asked;
        let e = arm_evidence(Arm::Tuned, std::slice::from_ref(&tcpx), &asked);
        assert_eq!(e.networks, ["GPUDirectTCPX_v7"]);
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        assert_eq!(e.read["NCCL_NET_GDR_LEVEL"], "LOC");
        // A tuned variable NCCL never read is flagged.
        let t = vars(&[("NCCL_SOCKETS_NTHREADS", "4")]);
        let e = arm_evidence(Arm::Tuned, &[tcpx], &t);
        assert!(
            e.problems
                .iter()
                .any(|p| p.contains("NCCL_SOCKETS_NTHREADS")),
            "{:?}",
            e.problems
        );
        let res = vec![CollectiveGains {
            collective: Collective::AllReduce,
            outcome: Outcome::Failed { reason: "x".into() },
            evidence: vec![e],
        }];
        let v = serde_json::to_value(&res).unwrap();
        assert_eq!(v[0]["evidence"][0]["arm"], "tuned");
        assert_eq!(evidence_problems(&res).len(), 1);
        assert!(evidence_problems(&res)[0].starts_with("allreduce tuned: "));
    }

    /// A stand-in for `tcpx-run validate --rank-child` as a real process (`sh`): it logs what
    /// NCCL would (its NCCL_HOSTID, the network, nNodes, each tuned variable read) to
    /// NCCL_DEBUG_FILE and prints a rank document whose busbw doubles when the tuned variable is
    /// set; rank 1 fails when FAIL_RANK1 is set, rank 0 then hangs (killed by the parent).
    const FAKE_RANK: &str = r#"
rank=$3
[ -n "$NCCL_COMM_ID" ] || exit 9
{
  echo "h:1:1 [0] NCCL INFO NCCL_HOSTID set by environment to $NCCL_HOSTID"
  echo "h:1:1 [0] NCCL INFO comm 0x1 rank $rank nRanks 2 nNodes 2 localRanks 1 localRank 0"
  echo "h:1:1 [0] NCCL INFO Using network Socket"
  [ -n "$NCCL_NSOCKS_PERTHREAD" ] && echo "h:1:1 [0] NCCL INFO NCCL_NSOCKS_PERTHREAD set by environment to $NCCL_NSOCKS_PERTHREAD."
} > "$NCCL_DEBUG_FILE"
if [ -n "$FAIL_RANK1" ]; then
  [ "$rank" = 1 ] && { echo '{"status":"failed","error":"ncclCommInitRank: remote error"}'; exit 1; }
  exec sleep 30
fi
bw=1.0; [ -n "$NCCL_NSOCKS_PERTHREAD" ] && bw=2.0
echo "{\"status\":\"measured\",\"nccl\":\"fake\",\"rows\":[{\"size\":1048576,\"iters\":1,\"median_s\":0.001,\"algbw_gbs\":$bw,\"busbw_gbs\":$bw}]}"
"#;

    #[test]
    fn shared_gpu_runs_start_two_rank_processes_and_read_their_logs() {
        let logs = tempfile::tempdir().unwrap();
        let c = ValidateConfig {
            sizes: vec![1 << 20],
            reps: 2,
            ..cfg()
        };
        let mut setup = Setup::plain(placement(1, &c).unwrap());
        setup.log_dir = Some(logs.path().to_path_buf());
        let command = || {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", FAKE_RANK, "sh"]).env_remove("FAIL_RANK1");
            Ok(cmd)
        };
        let tuned = vars(&[("NCCL_NSOCKS_PERTHREAD", "4")]);
        let mut seen = 0;
        let res = run_validation(
            &c,
            &tuned,
            &setup,
            &Collective::ALL,
            &command,
            &mut |_, _, _| seen += 1,
        );
        assert_eq!(seen, 8, "2 repetitions x 2 arms x 2 collectives");
        for r in &res {
            match &r.outcome {
                Outcome::Measured { sizes } => {
                    assert!((sizes[0].gain.unwrap() - 2.0).abs() < 1e-9, "{sizes:?}")
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(r.evidence.len(), 2, "{r:?}");
            for e in &r.evidence {
                assert_eq!(e.networks, ["Socket"]);
                assert_eq!(e.nodes, Some(2));
                assert!(e.problems.is_empty(), "{:?}", e.problems);
            }
            assert_eq!(r.evidence[1].read["NCCL_NSOCKS_PERTHREAD"], "4");
            assert!(r.evidence[0].read.is_empty());
        }
        // Each rank logged to a file of its own, with a host id of its own.
        let r0 = std::fs::read_to_string(logs.path().join("run01-rep1-sendrecv-default-rank0.log"))
            .unwrap();
        let r1 = std::fs::read_to_string(logs.path().join("run01-rep1-sendrecv-default-rank1.log"))
            .unwrap();
        assert!(r0.contains("set by environment to tcpx-lab-host0"), "{r0}");
        assert!(r1.contains("set by environment to tcpx-lab-host1"), "{r1}");
    }

    #[test]
    fn a_failed_rank_fails_the_run_and_its_peer_is_killed_at_once() {
        let c = ValidateConfig {
            sizes: vec![1 << 20],
            reps: 1,
            ..cfg()
        };
        let mut setup = Setup::plain(placement(1, &c).unwrap());
        setup.run_deadline = std::time::Duration::from_secs(60);
        let command = || {
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", FAKE_RANK, "sh"]).env("FAIL_RANK1", "1");
            Ok(cmd)
        };
        let t = std::time::Instant::now();
        let res = run_validation(
            &c,
            &[],
            &setup,
            &[Collective::SendRecv],
            &command,
            &mut |_, _, _| {},
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t.elapsed()
        );
        match &res[0].outcome {
            Outcome::Failed { reason } => {
                assert!(
                    reason.contains("rank 1: ncclCommInitRank: remote error"),
                    "{reason}"
                );
                assert!(
                    reason.contains("rank 0 was killed once the other rank had failed"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gains_come_with_their_interval() {
        let mut r = Vec::new();
        for (d, t) in [(4.0, 7.4), (4.1, 7.5), (3.9, 7.6), (4.0, 7.5)] {
            r.push((Arm::Default, 1 << 20, d));
            r.push((Arm::Tuned, 1 << 20, t));
        }
        let g = summarise(&[1 << 20, 2 << 20], &r);
        let g0 = &g[0];
        assert!((g0.gain.unwrap() - 7.5 / 4.0).abs() < 0.01, "{g0:?}");
        assert!(
            g0.gain_lo.unwrap() > 1.7 && g0.gain_hi.unwrap() < 2.0,
            "{g0:?}"
        );
        assert_eq!(g0.default.as_ref().unwrap().n, 4);
        assert!(
            g[1].gain.is_none() && g[1].default.is_none(),
            "size not measured"
        );
    }

    fn gain(size: u64, g: f64) -> SizeGain {
        let results: Vec<(Arm, u64, f64)> = (0..5)
            .flat_map(|i| {
                let d = 4.0 + i as f64 * 0.01;
                [(Arm::Default, size, d), (Arm::Tuned, size, d * g)]
            })
            .collect();
        summarise(&[size], &results).remove(0)
    }

    #[test]
    fn the_plan_validation_carries_both_collectives() {
        let both = vec![
            CollectiveGains {
                collective: Collective::SendRecv,
                outcome: Outcome::Measured {
                    sizes: vec![gain(64 << 20, 1.8)],
                },
                evidence: Vec::new(),
            },
            CollectiveGains {
                collective: Collective::AllReduce,
                outcome: Outcome::Measured {
                    sizes: vec![gain(64 << 20, 1.3)],
                },
                evidence: Vec::new(),
            },
        ];
        match plan_validation(&both) {
            tcpx_plan::Validation::Measured { gain, detail, .. } => {
                assert!((gain - 1.8).abs() < 0.01, "send/recv is the figure: {gain}");
                assert!(detail.contains("all-reduce busbw gain 1.30"), "{detail}");
                assert!(detail.starts_with("send/recv: "), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        let mut ar_failed = both.clone();
        ar_failed[1].outcome = Outcome::Failed {
            reason: "repetition 1 (tuned): NCCL timeout".into(),
        };
        match plan_validation(&ar_failed) {
            tcpx_plan::Validation::Measured { detail, .. } => {
                assert!(
                    detail.contains("all-reduce: failed: repetition 1"),
                    "{detail}"
                )
            }
            other => panic!("{other:?}"),
        }
        let mut sr_na = both;
        sr_na[0].outcome = Outcome::NotAvailable {
            reason: "one GPU".into(),
        };
        match plan_validation(&sr_na) {
            tcpx_plan::Validation::NotAvailable(why) => {
                assert!(why.contains("send/recv: N/A: one GPU"), "{why}");
                assert!(why.contains("all-reduce busbw gain"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
