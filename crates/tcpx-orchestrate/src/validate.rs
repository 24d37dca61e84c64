//! Closing the tuning loop: libnccl point-to-point with NCCL's defaults against the same with a
//! run's tuned variables, repetitions interleaved, and the gain with its interval.
//!
//! Everything here is decided without running anything: which variables each arm sets or
//! clears ([`arm_env`]), the child `tcpx-run bench` arguments both arms share ([`bench_args`]),
//! the rotating order of the repetitions ([`schedule`]), whether the machine can run it at all
//! ([`prerequisites`]: libnccl and two GPUs, else N/A with the reason), and the figures over the
//! repetitions ([`summarise`]). NCCL reads its environment once per process, so every
//! repetition of every arm is its own process; the caller starts them.

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
            "needs GPUs {} and {} ({need} GPUs), this machine has {gpus}",
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

/// Runs every repetition of both arms in [`schedule`] order, each a `tcpx-run bench` child
/// (`command` makes the bare command; [`bench_args`] and [`arm_env`] are added here), and
/// summarises. `progress` hears `(run, of, repetition, arm)` before each. Every wait inside a
/// child is bounded by the bench's own `--timeout`.
pub fn run_comparison(
    cfg: &ValidateConfig,
    tuned: &[(String, String)],
    command: BenchCommand<'_>,
    progress: &mut dyn FnMut(usize, usize, u32, Arm),
) -> anyhow::Result<Vec<SizeGain>> {
    use anyhow::Context;
    let args = bench_args(cfg);
    let runs = schedule(cfg.reps);
    let mut results = Vec::new();
    for (i, (rep, arm)) in runs.iter().enumerate() {
        progress(i + 1, runs.len(), rep + 1, *arm);
        let (remove, set) = arm_env(*arm, tuned);
        let mut cmd = command()?;
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for k in &remove {
            cmd.env_remove(k);
        }
        cmd.envs(set);
        let out = cmd.output().context("starting tcpx-run bench")?;
        if !out.status.success() {
            anyhow::bail!(
                "repetition {} ({}) failed: {}",
                rep + 1,
                arm.as_str(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let doc: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("reading the bench's JSON document")?;
        for m in doc["measurements"].as_array().into_iter().flatten() {
            if let (Some(size), Some(bw)) = (m["size"].as_u64(), m["recv"]["busbw_gbs"].as_f64()) {
                results.push((*arm, size, bw));
            }
        }
    }
    Ok(summarise(&cfg.sizes, &results))
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
    fn missing_nccl_or_gpus_give_the_reason() {
        let c = cfg();
        let e = prerequisites(Ok(2), Err("libnccl.so.2: not found".into()), &c).unwrap_err();
        assert!(e.contains("libnccl") && e.contains("not found"), "{e}");
        let e = prerequisites(Err("no CUDA driver".into()), Ok("2.28".into()), &c).unwrap_err();
        assert!(e.contains("no CUDA driver"), "{e}");
        let e = prerequisites(Ok(1), Ok("2.28".into()), &c).unwrap_err();
        assert!(e.contains("this machine has 1"), "{e}");
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
}
