//! Closing the tuning loop: libnccl point-to-point (send/recv through the `nccl` backend) and
//! all-reduce bus bandwidth, each with NCCL's defaults against the same with a run's tuned
//! variables, repetitions interleaved, and the gain with its interval.
//!
//! Decided without running anything: which variables each arm sets or clears ([`arm_env`]), the
//! child arguments both arms share ([`child_args`]: `tcpx-run bench` for send/recv, `tcpx-run
//! validate --allreduce-child` for all-reduce), the rotating order of the runs ([`runs`]),
//! whether the machine can run it at all ([`prerequisites`]: libnccl and two GPUs, else N/A with
//! the reason), the figures of each child's JSON document ([`figures_of`]) and the gains over
//! the repetitions ([`summarise`]). NCCL reads its environment once per process, so every
//! repetition of every arm of every collective is its own process; the caller says how to start
//! one (a bare `tcpx-run` command). [`allreduce`] is what the all-reduce child runs.

pub mod allreduce;
pub mod nccl_log;

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

/// `tcpx-run bench`'s environment fallbacks.
pub const BENCH_ENV: &[&str] = &[
    "TCPX_TRANSPORT",
    "TCPX_MEMORY",
    "TCPX_FLOWS",
    "TCPX_CHANNELS",
    "TCPX_SOCKS_PER_CHANNEL",
    "TCPX_CHUNK",
    "TCPX_WINDOW",
    "TCPX_SOCK_BUF",
];

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

/// `Err(reason)` when the validation cannot run here: `gpus` and `nccl` are what the caller
/// found (GPU count, libnccl's path and version), or why they could not be found.
pub fn prerequisites(
    gpus: Result<usize, String>,
    nccl: Result<String, String>,
    cfg: &ValidateConfig,
) -> Result<String, String> {
    let nccl = nccl.map_err(|e| format!("no libnccl here: {e}"))?;
    let gpus = gpus.map_err(|e| format!("no GPU can be used: {e}"))?;
    let need = cfg.send_gpu.max(cfg.recv_gpu) + 1;
    if cfg.send_gpu == cfg.recv_gpu {
        return Err("the sender and receiver GPU must differ".into());
    }
    if gpus < need {
        return Err(format!(
            "needs GPUs {} and {} ({need} GPUs; NCCL puts each rank on its own GPU, never two on one), this machine has {gpus}",
            cfg.send_gpu, cfg.recv_gpu
        ));
    }
    Ok(format!("{nccl}, {gpus} GPUs"))
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
pub type BenchCommand<'a> = &'a dyn Fn() -> anyhow::Result<std::process::Command>;

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
        })
        .collect()
}

/// Runs every run of [`runs`] as a child (`command` makes the bare `tcpx-run` command;
/// [`child_args`] and [`arm_env`] are added here) and summarises each collective. A collective
/// whose run fails is `Failed` with the reason and runs no more; the others go on. `progress`
/// hears `(run, of, &run)` before each. Every wait inside a child is bounded by its own deadline.
pub fn run_validation(
    cfg: &ValidateConfig,
    tuned: &[(String, String)],
    collectives: &[Collective],
    command: BenchCommand<'_>,
    progress: &mut dyn FnMut(usize, usize, &Run),
) -> Vec<CollectiveGains> {
    let all = runs(cfg.reps, collectives);
    let mut results: Vec<(Collective, Arm, u64, f64)> = Vec::new();
    let mut failed: std::collections::BTreeMap<Collective, String> = Default::default();
    for (i, run) in all.iter().enumerate() {
        if failed.contains_key(&run.collective) {
            continue;
        }
        progress(i + 1, all.len(), run);
        match one_run(cfg, tuned, run, command) {
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
            CollectiveGains {
                collective,
                outcome,
            }
        })
        .collect()
}

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

fn one_run(
    cfg: &ValidateConfig,
    tuned: &[(String, String)],
    run: &Run,
    command: BenchCommand<'_>,
) -> Result<Vec<(u64, f64)>, String> {
    let (remove, set) = arm_env(run.arm, tuned);
    let mut cmd = command().map_err(|e| format!("{e:#}"))?;
    cmd.args(child_args(cfg, run.collective))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for k in &remove {
        cmd.env_remove(k);
    }
    cmd.envs(set);
    let out = cmd
        .output()
        .map_err(|e| format!("starting tcpx-run: {e}"))?;
    // The all-reduce child reports its own failure in its document; the bench on stderr.
    match figures_of(run.collective, &out.stdout) {
        Ok(f) if out.status.success() => Ok(f),
        Err(e) if out.status.success() => Err(e),
        Err(e) if run.collective == Collective::AllReduce && !out.stdout.is_empty() => Err(e),
        _ => Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
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
    }
    s
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

#[cfg(test)]
mod tests {
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
        }];
        res.push(CollectiveGains {
            collective: Collective::AllReduce,
            outcome: Outcome::Failed {
                reason: "repetition 1 (default): ncclCommInitRank timed out".into(),
            },
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
        let e = prerequisites(Ok(1), Ok("2.28".into()), &c).unwrap_err();
        assert!(e.contains("this machine has 1"), "{e}");
        assert!(e.contains("never two on one"), "{e}");
        assert!(prerequisites(Ok(2), Ok("libnccl 2.28".into()), &c).is_ok());
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
            },
            CollectiveGains {
                collective: Collective::AllReduce,
                outcome: Outcome::Measured {
                    sizes: vec![gain(64 << 20, 1.3)],
                },
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
