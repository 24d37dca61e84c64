//! tcpx-bench: one experiment, end to end, between a server (receiver) and a client (sender).
//!
//! The two sides talk over a control connection (JSON frames over TCP): a version and config
//! handshake (a mismatch is refused with both values shown), handle exchange for every flow and
//! channel, then for every message size warm-up and timed iterations, each started by a barrier
//! (the receiver posts, says "ready", the sender starts), and an end barrier where both sides swap
//! their timings so that both print the same [`Measurement`]s. Received bytes are checked against a
//! seeded pattern when `verify` is on (the default).
//!
//! A *flow* is one independent stream of transfers with its own buffers and channels, as one GPU
//! of a node would have; several flows of one experiment run at once in one process.
//!
//! [`Experiment`] itself (with its typed values) is `tcpx_model`'s, re-exported here. Also the
//! experiment as `tcpx-run bench`'s flags give it, checked with the flag named ([`flags`]), and
//! its CSV rows and samples file ([`csv`]).
//!
//! Not for: deciding what to run (that is `tcpx-plan`), formatting reports (`tcpx-report`), or
//! moving bytes itself (`tcpx-transport`).
//!
//! # How it works
//!
//! `run_server` (receiver) / `run_client` (sender) / `run_local` (both, in one process over loopback).
//! Control protocol: JSON frames; `Hello{protocol, version, experiment}` -> `Welcome` or
//! `Refuse{reason with both values}`; per flow `Handles`; per iteration `Ready` (receiver posted, both
//! start their clocks); per size `Result` from each side (end barrier); `Abort{reason}` when a side fails;
//! `Bye`. `baseline` is plain multi-stream TCP for comparison.
//!
//! NICs and processes: `Experiment.nics` (this side's interface names or local addresses; each
//! side names its own, so it is left out of the handshake comparison) and `nic_policy` go through
//! `nics::plan_nics` (getifaddrs in the thread's network namespace + `tcpx-topo` for NUMA/PCI; GPU
//! `i` of the topology is flow `i`'s place; or the places the caller gives in `SideEnv::places`,
//! as the binary does in an emulated fabric node) to a `NicPlan` of one address per channel.
//! `Experiment.flow_index = Some(i)` makes a process carry flow `i` of `flows` alone (seeds, NICs
//! and labels follow the global index); `tcpx-orchestrate` starts and supervises one such process
//! per flow. Results carry `flow_iter_secs` per flow and summaries `flow_gbs`. A peer that closed
//! the control connection or sent `Abort` is `BenchError::PeerGone`, so a supervisor can tell an
//! echo from a cause without reading text.
//!
//! Pinning and sampling: `send_cpus`/`recv_cpus` pin the side's thread before any comm is opened,
//! so socket workers (started from it) inherit the mask; the mask is read back into the result and
//! the previous one is restored when the side ends (`PinGuard`), so one experiment's pinning never
//! leaks into the next on the same thread. `sample_ms` runs `tcpx-affinity`'s samplers over the
//! timed iterations only; each side's `CpuCost` (CPU-s per GB, busy and softirq shares, hot cores,
//! retransmits) travels in its `Result`, raw rows stay with the side (`Outcome.samples`). Backend
//! settings (`env`: NCCL_NET_PLUGIN, TCPX_NETPLUGIN_DEV, NCCL_GPUDIRECTTCPX_*, ...) go to the backend
//! with the experiment; the netplugin backend puts them into the process environment before loading
//! the plugin (plugins read getenv), and a plugin library is initialised once per process, so only
//! the first experiment's values reach a given library.
//!
//! Limits before anything runs: `limits::check_process_limits` refuses more comms than the backend
//! allows (`Transport::max_comms`, a plugin's `maxComms`) and, for the socket backend, more sockets
//! than the open-file limit (`ulimit -n`, read from /proc/self/limits) can hold; `gpu_mem` refuses
//! more flows than a side has GPUs (every flow stands for one GPU, so a node with fewer GPUs than
//! its peer is a mismatch, not something to fold onto fewer GPUs). A side that cannot run still
//! meets its peer for a few seconds (`TELL_PEER_WAIT`) to refuse its hello or abort after the
//! welcome, so the other machine's operator reads the cause rather than a timeout.
//!
//! Stragglers ([`sockets`]): each side reads its comms' per-socket counters
//! (`SendComm::socket_stats`; the socket backend has them) before the first timed iteration and
//! after the last; the bytes, busy time and pieces of every socket (with its flow, channel and,
//! where channels were placed on NICs, NIC) travel in `SideResult::socket_bytes`, and each
//! summary carries the rates (`sockets`) and their spread (`socket_spread`): the table adds one
//! `#   recv sockets: ...` line per size naming the slowest socket and its share of the median,
//! flagged `LAGS` below [`sockets::LAG_SHARE`].
//!
//! Invariants: both sides print identical `Measurement`s; timings exclude pattern fill and
//! verification; a failure names the experiment, the peer and the stage (size, iteration); nothing
//! waits longer than `timeout_s` without progress.

#![forbid(unsafe_code)]

pub mod baseline;
mod clock;
mod control;
pub mod csv;
pub mod flags;
mod gpu_mem;
pub mod limits;
pub mod nics;
pub mod proto;
mod run;
mod size;
pub mod sockbuf;
pub mod sockets;
pub mod table;

use serde::{Deserialize, Serialize};

pub use clock::{covered_ns, monotonic_ns, MonoSpan};
pub use run::{
    bind_control, run_client, run_client_with, run_local, run_local_with, run_server,
    run_server_with, BenchError, Outcome, Progress, SideEnv,
};
pub use size::{format_size, parse_size, parse_sizes};

/// Checks a `memory` value (`host`, `cuda` or `cuda:S,R`) by the rules an experiment's
/// validation applies, for callers that hold it before an [`Experiment`] exists (plan knobs).
pub fn check_memory(memory: &str) -> Result<(), String> {
    memory
        .parse::<Memory>()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The GPUs (sender, receiver) that flow `flow` of a `memory` value uses on a machine with `gpus`
/// GPUs, as the experiment places them; `None` for host memory, a bad value or no GPU.
pub fn flow_gpus(memory: &str, flow: usize, gpus: usize) -> Option<(usize, usize)> {
    memory.parse::<Memory>().ok()?.flow_gpus(flow, gpus)
}

/// Protocol version of the control connection; both sides must speak the same.
pub const PROTOCOL: u32 = 1;

pub use tcpx_model::{
    secs_clamped, Backend, Barrier, CpuSet, Experiment, Memory, NicPolicy, Side, DEFAULT_CHUNK,
    MAX_BYTES_PER_SIDE, MAX_ITERS, MAX_SOCK_BUF, MAX_TIMEOUT_S, MAX_WARMUP,
};

/// Text a peer sent (a message name, a version, a reason), for an error or a log line while that
/// peer may be a stranger: at most `max` characters, control characters escaped, so it can
/// neither flood the terminal nor write escape sequences to it.
pub fn shown(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Comparing two sides' experiments field by field, for a handshake refusal.
pub trait Differences {
    /// The fields that differ from `other`, as `name: ours vs theirs` lines.
    fn differences(&self, other: &Experiment) -> Vec<String>;
}

impl Differences for Experiment {
    fn differences(&self, other: &Experiment) -> Vec<String> {
        let a = serde_json::to_value(self).unwrap_or_default();
        let b = serde_json::to_value(other).unwrap_or_default();
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
            return vec!["experiments could not be compared".into()];
        };
        // Keys of both: a knob left out of one side's JSON at its default (`barrier`,
        // `zero_copy_min`) still differs from the other side's setting.
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let null = serde_json::Value::Null;
        keys.into_iter()
            // Each side names its own NICs (addresses differ between nodes).
            .filter(|k| k.as_str() != "name" && k.as_str() != "nics")
            .filter_map(|k| {
                let (v, w) = (a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null));
                (v != w).then(|| format!("{k}: {v} vs {w}"))
            })
            .collect()
    }
}

/// What one side measured for one message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideResult {
    pub side: Side,
    /// Seconds per timed iteration, in order.
    pub iter_secs: Vec<f64>,
    /// Wrong bytes seen (receiver with verify on); `None` when not checked.
    pub wrong_bytes: Option<u64>,
    /// Where the side's threads ran, when pinned.
    #[serde(default)]
    pub pinning: Option<Pinning>,
    /// CPU cost over the timed iterations, when sampled.
    #[serde(default)]
    pub cpu: Option<CpuCost>,
    /// Per flow of this process (index `k` is flow [`Experiment::flow_id`]`(k)`), seconds per
    /// timed iteration: what each GPU's transfer took, for per-GPU bandwidth.
    #[serde(default)]
    pub flow_iter_secs: Vec<Vec<f64>>,
    /// When each timed iteration ran (CLOCK_MONOTONIC), in order; recorded by flow processes of
    /// multi-process runs, so their node figure can be taken over the time they were moving
    /// bytes. Empty elsewhere and in results of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iter_spans: Vec<MonoSpan>,
    /// Payload bytes each socket of each comm moved over the timed iterations (backends that
    /// count per socket; empty elsewhere and in results of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub socket_bytes: Vec<sockets::SocketBytes>,
}

/// The CPUs a side asked for and the set the kernel applied (read back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pinning {
    pub expected: String,
    pub actual: String,
}

/// What the timed iterations cost in CPU, from the samplers of `tcpx-affinity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// CPU seconds this process used (all threads; in `local` runs both sides).
    pub process_cpu_s: Option<f64>,
    /// `process_cpu_s` per GB moved (1e9 bytes).
    pub cpu_s_per_gb: Option<f64>,
    /// Machine-wide busy share of all CPUs.
    pub busy_pct: f64,
    /// Softirq share of busy time (receive processing).
    pub softirq_share_pct: f64,
    /// CPUs above the sampler's "hot" threshold, busiest first.
    pub hot_cores: Vec<u32>,
    /// TCP retransmitted segments as a share of sent ones.
    pub retrans_pct: Option<f64>,
    pub samples: usize,
}

impl CpuCost {
    pub fn from_summary(s: &tcpx_affinity::SampleSummary, bytes: u64) -> Self {
        CpuCost {
            process_cpu_s: s.process_cpu_s,
            cpu_s_per_gb: s
                .process_cpu_s
                .filter(|_| bytes > 0)
                .map(|c| c / (bytes as f64 / 1e9)),
            busy_pct: s.all_cpus.busy_pct,
            softirq_share_pct: s.softirq_share_pct,
            hot_cores: s.hot_cores.clone(),
            retrans_pct: s.tcp.as_ref().map(|t| t.retrans_pct),
            samples: s.samples,
        }
    }
}

/// Summary of one side for one size, in nccl-tests units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideSummary {
    pub side: Side,
    pub avg_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Bytes of all flows / 1e9 / average seconds per iteration.
    pub algbw_gbs: f64,
    /// Equal to algbw for point-to-point (nccl-tests sendrecv convention).
    pub busbw_gbs: f64,
    pub wrong_bytes: Option<u64>,
    #[serde(default)]
    pub pinning: Option<Pinning>,
    #[serde(default)]
    pub cpu: Option<CpuCost>,
    /// GB/s of each flow of the reporting process alone (its bytes over its own average time),
    /// in the order of [`SideResult::flow_iter_secs`]: the per-GPU figures.
    #[serde(default)]
    pub flow_gbs: Vec<f64>,
    /// Each timed iteration's time in microseconds, in run order (evenly thinned to at most
    /// [`KEPT_ITERATIONS`]), so percentiles can be taken over several repetitions together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iter_us: Vec<f64>,
    /// [`SideResult::iter_spans`], every one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iter_spans: Vec<MonoSpan>,
    /// [`SideResult::socket_bytes`], each with its GB/s over the summed wall time of the timed
    /// iterations (a straggler carries fewer bytes: see [`sockets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sockets: Vec<sockets::SocketRate>,
    /// The spread of `sockets` and whether the slowest lags ([`sockets::spread`]); `None` for
    /// fewer than two sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_spread: Option<sockets::Spread>,
    /// What `sockets` cost in system calls ([`sockets::calls`]); `None` where the backend counts
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_calls: Option<sockets::Calls>,
}

impl SideSummary {
    /// The nccl-tests figures of this summary, as reports record them.
    pub fn figures(&self) -> tcpx_model::SideFigures {
        tcpx_model::SideFigures {
            avg_us: self.avg_us,
            p50_us: self.p50_us,
            p99_us: self.p99_us,
            min_us: self.min_us,
            max_us: self.max_us,
            algbw_gbs: self.algbw_gbs,
            busbw_gbs: self.busbw_gbs,
            wrong_bytes: self.wrong_bytes,
            iter_us: self.iter_us.clone(),
        }
    }
}

/// Iteration times a [`SideSummary`] keeps: enough for a p99 over a few repetitions, small
/// enough for the control connection's result frame.
pub const KEPT_ITERATIONS: usize = 2048;

/// `times` (seconds) in microseconds, thinned evenly to at most `KEPT_ITERATIONS`.
fn kept_iterations(times: &[f64]) -> Vec<f64> {
    let n = times.len();
    if n <= KEPT_ITERATIONS {
        return times.iter().map(|t| t * 1e6).collect();
    }
    (0..KEPT_ITERATIONS)
        .map(|i| times[i * n / KEPT_ITERATIONS] * 1e6)
        .collect()
}

/// The result of one message size of one experiment, as both sides agree on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub experiment: Experiment,
    pub size: u64,
    pub chunk: u64,
    pub send: SideSummary,
    pub recv: SideSummary,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl SideResult {
    /// Checks what a peer (or a flow process) says it measured for `bytes` per iteration (all
    /// its flows) over `iters` timed iterations: the count of iterations, every time a
    /// [`tcpx_model::check_time`] of its bytes (a flow's: its share), wrong bytes within what
    /// was moved, no socket faster than any link. Figures failing it would turn into infinite,
    /// negative or impossible rates in every report.
    pub fn check(&self, bytes: u64, iters: u32) -> Result<(), String> {
        if self.iter_secs.len() != iters as usize {
            return Err(format!(
                "{} iteration times for {iters} timed iterations",
                self.iter_secs.len()
            ));
        }
        for (i, &t) in self.iter_secs.iter().enumerate() {
            tcpx_model::check_time(&format!("iteration {i}"), t, bytes)?;
        }
        let flows = self.flow_iter_secs.len().max(1) as u64;
        for (f, times) in self.flow_iter_secs.iter().enumerate() {
            if times.len() != iters as usize {
                return Err(format!(
                    "flow {f}: {} iteration times for {iters} timed iterations",
                    times.len()
                ));
            }
            for (i, &t) in times.iter().enumerate() {
                tcpx_model::check_time(&format!("flow {f} iteration {i}"), t, bytes / flows)?;
            }
        }
        let moved = bytes.saturating_mul(u64::from(iters));
        if let Some(w) = self.wrong_bytes.filter(|&w| w > moved) {
            return Err(format!("{w} wrong bytes of {moved} moved"));
        }
        let total: f64 = self.iter_secs.iter().sum();
        for s in &self.socket_bytes {
            if s.bytes as f64 > total * tcpx_model::FASTEST_BYTES_PER_S {
                return Err(format!(
                    "a socket moved {} B in {total:e} s, faster than any link",
                    s.bytes
                ));
            }
        }
        Ok(())
    }

    /// A result of these iteration times (seconds, in order) alone: no verification, pinning,
    /// CPU cost, per-flow times, spans or socket counts.
    pub fn of_times(side: Side, iter_secs: Vec<f64>) -> SideResult {
        SideResult {
            side,
            iter_secs,
            wrong_bytes: None,
            pinning: None,
            cpu: None,
            flow_iter_secs: Vec::new(),
            iter_spans: Vec::new(),
            socket_bytes: Vec::new(),
        }
    }

    /// Summarises timings for `bytes` moved per iteration (all flows together).
    pub fn summarise(&self, bytes: u64) -> SideSummary {
        let mut s = self.iter_secs.clone();
        s.sort_by(f64::total_cmp);
        let avg = if s.is_empty() {
            0.0
        } else {
            s.iter().sum::<f64>() / s.len() as f64
        };
        let socket_rates = sockets::rates(&self.socket_bytes, s.iter().sum::<f64>());
        let algbw = if avg > 0.0 {
            bytes as f64 / 1e9 / avg
        } else {
            0.0
        };
        SideSummary {
            side: self.side,
            avg_us: avg * 1e6,
            p50_us: percentile(&s, 50.0) * 1e6,
            p99_us: percentile(&s, 99.0) * 1e6,
            min_us: s.first().copied().unwrap_or(0.0) * 1e6,
            max_us: s.last().copied().unwrap_or(0.0) * 1e6,
            algbw_gbs: algbw,
            busbw_gbs: algbw,
            wrong_bytes: self.wrong_bytes,
            pinning: self.pinning.clone(),
            cpu: self.cpu.clone(),
            flow_gbs: flow_gbs(&self.flow_iter_secs, bytes),
            iter_us: kept_iterations(&self.iter_secs),
            iter_spans: self.iter_spans.clone(),
            socket_spread: sockets::spread(&socket_rates),
            socket_calls: sockets::calls(&socket_rates),
            sockets: socket_rates,
        }
    }
}

/// GB/s of each flow, when `bytes` are spread evenly over them.
fn flow_gbs(flow_iter_secs: &[Vec<f64>], bytes: u64) -> Vec<f64> {
    let per_flow = bytes as f64 / flow_iter_secs.len().max(1) as f64;
    flow_iter_secs
        .iter()
        .map(|t| {
            let avg = t.iter().sum::<f64>() / t.len().max(1) as f64;
            if avg > 0.0 {
                per_flow / 1e9 / avg
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_keeps_its_iteration_times_thinned_evenly() {
        let side = |n: usize| {
            SideResult::of_times(Side::Recv, (0..n).map(|i| (i + 1) as f64 * 1e-6).collect())
        };
        let small = side(10).summarise(1 << 20);
        assert_eq!(small.iter_us.len(), 10);
        assert!((small.iter_us[9] - 10.0).abs() < 1e-9);
        let big = side(3 * KEPT_ITERATIONS + 1).summarise(1 << 20);
        assert_eq!(big.iter_us.len(), KEPT_ITERATIONS);
        // Evenly spread over the run: first iteration first, increasing, ending near the last.
        assert!((big.iter_us[0] - 1.0).abs() < 1e-9);
        assert!(big.iter_us.windows(2).all(|w| w[0] < w[1]));
        assert!(big.iter_us[KEPT_ITERATIONS - 1] > (3 * KEPT_ITERATIONS - 3) as f64);
    }

    #[test]
    fn percentiles_and_bandwidth_follow_nccl_tests_units() {
        let r = SideResult {
            wrong_bytes: Some(0),
            flow_iter_secs: vec![vec![0.002, 0.002], vec![0.004, 0.004]],
            ..SideResult::of_times(Side::Recv, vec![0.004, 0.001, 0.002, 0.003])
        };
        let s = r.summarise(1_000_000_000);
        assert!((s.avg_us - 2500.0).abs() < 1e-6);
        assert!((s.p50_us - 2000.0).abs() < 1e-6);
        assert!((s.p99_us - 4000.0).abs() < 1e-6);
        assert!(
            (s.algbw_gbs - 400.0).abs() < 1e-9,
            "1e9 bytes in 2.5 ms is 400 GB/s"
        );
        assert_eq!(s.busbw_gbs, s.algbw_gbs);
        // Half the bytes each: 0.5e9 B in 2 ms and in 4 ms.
        assert_eq!(s.flow_gbs.len(), 2);
        assert!((s.flow_gbs[0] - 250.0).abs() < 1e-9, "{:?}", s.flow_gbs);
        assert!((s.flow_gbs[1] - 125.0).abs() < 1e-9, "{:?}", s.flow_gbs);
    }

    #[test]
    fn validation_names_the_bad_value() {
        let ok = Experiment::default();
        assert_eq!(ok.validate(None), Ok(()));
        let e = Experiment {
            chunk: Some(2 << 20),
            sizes: vec![1 << 20],
            ..ok.clone()
        };
        assert!(e
            .validate(None)
            .unwrap_err()
            .contains("chunk 2M is larger than the message size 1M"));
        let e = Experiment {
            iters: 0,
            ..ok.clone()
        };
        assert!(e
            .validate(None)
            .unwrap_err()
            .contains("--iters 0 is out of range: give 1..=1000000"));
        let e = Experiment {
            window: Some(64),
            ..ok.clone()
        };
        let limits = tcpx_transport::Limits {
            max_requests: 32,
            max_request_bytes: 1 << 30,
            memory: vec![],
        };
        let msg = e.validate(Some(&limits)).unwrap_err();
        assert!(
            msg.contains("window 64") && msg.contains("32 requests"),
            "{msg}"
        );
        let e = Experiment {
            sizes: vec![1 << 40],
            ..ok.clone()
        };
        assert!(e
            .validate(None)
            .unwrap_err()
            .contains("--size 1T is out of range: give 1..=64G"));
        let e = Experiment {
            sizes: vec![64 << 30],
            flows: 2,
            ..ok.clone()
        };
        assert!(e.validate(None).unwrap_err().contains("more than"));
        let e = Experiment {
            timeout_s: f64::NAN,
            ..ok.clone()
        };
        assert!(e.validate(None).is_err());
    }

    /// Values that reach a `Duration`, `setsockopt`'s int or an allocation are bounded here,
    /// for the CLI and plan knobs alike.
    #[test]
    fn values_beyond_what_their_syscall_or_type_takes_are_refused() {
        let ok = Experiment::default();
        let bad = |e: Experiment, words: &str| {
            let m = e.validate(None).unwrap_err();
            assert!(m.contains(words), "{m}");
        };
        bad(
            Experiment {
                timeout_s: 1e20,
                ..ok.clone()
            },
            "timeout",
        );
        bad(
            Experiment {
                sock_buf: Some(4 << 30),
                ..ok.clone()
            },
            "sock-buf 4294967296",
        );
        bad(
            Experiment {
                sock_buf: Some(MAX_SOCK_BUF + 1),
                ..ok.clone()
            },
            "sock-buf",
        );
        let fits = Experiment {
            sock_buf: Some(MAX_SOCK_BUF),
            ..ok.clone()
        };
        assert_eq!(fits.validate(None), Ok(()));
        bad(
            Experiment {
                iters: u32::MAX,
                ..ok.clone()
            },
            "iters",
        );
        bad(
            Experiment {
                warmup: MAX_WARMUP + 1,
                ..ok.clone()
            },
            "warmup",
        );
        bad(
            Experiment {
                nics: vec!["".into()],
                ..ok
            },
            "--nics",
        );
    }

    #[test]
    fn differences_show_both_values() {
        let a = Experiment::default();
        let b = Experiment {
            channels: 4,
            name: "other".into(),
            ..a.clone()
        };
        assert_eq!(a.differences(&b), vec!["channels: 2 vs 4".to_string()]);
    }

    #[test]
    fn a_knob_left_out_of_one_sides_json_still_differs() {
        let a = Experiment::default();
        let b = Experiment {
            barrier: tcpx_model::Barrier::Size,
            zero_copy_min: Some(65536),
            ..a.clone()
        };
        let both = vec![
            "barrier: null vs \"size\"".to_string(),
            "zero_copy_min: null vs 65536".to_string(),
        ];
        assert_eq!(a.differences(&b), both);
        assert_eq!(b.differences(&a).len(), 2);
    }
}
