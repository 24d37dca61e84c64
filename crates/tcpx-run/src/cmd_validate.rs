//! `tcpx-run validate <report dir | tuned.env | tuned.json>`: libnccl point-to-point (the `nccl`
//! backend, GPU to GPU) with NCCL's defaults and with the tuned NCCL variables, repetitions
//! interleaved, and the gain per size with its interval. N/A, with the reason and exit status 0,
//! where libnccl or two GPUs are missing. The decisions live in `tcpx_orchestrate::validate`;
//! this module starts the child processes (NCCL reads its environment once per process) and
//! prints.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use tcpx_orchestrate::validate::{prerequisites, run_comparison, SizeGain, ValidateConfig};

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// A plan run's report directory, or its tuned.env / tuned.json
    pub path: PathBuf,
    /// Message sizes (K, M, G = powers of 1024)
    #[arg(long, default_value = "1M,64M,256M")]
    pub size: String,
    /// Repetitions of each arm (default and tuned), interleaved in rotating order
    #[arg(long, default_value_t = 5)]
    pub reps: u32,
    /// Timed iterations per size in each repetition
    #[arg(long, default_value_t = 20)]
    pub iters: u32,
    /// Untimed iterations per size before them
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,
    /// Sender's and receiver's GPU, as S,R
    #[arg(long, default_value = "0,1")]
    pub gpus: String,
    /// One JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
}

fn config(a: &ValidateArgs) -> Result<ValidateConfig> {
    let (s, r) = a
        .gpus
        .split_once(',')
        .and_then(|(s, r)| Some((s.trim().parse().ok()?, r.trim().parse().ok()?)))
        .with_context(|| format!("--gpus `{}`: write it as S,R (e.g. 0,1)", a.gpus))?;
    if a.reps == 0 || a.iters == 0 {
        bail!("--reps and --iters must be at least 1");
    }
    Ok(ValidateConfig {
        sizes: tcpx_bench::parse_sizes(&a.size).map_err(|e| anyhow::anyhow!("--size: {e}"))?,
        reps: a.reps,
        iters: a.iters,
        warmup: a.warmup,
        send_gpu: s,
        recv_gpu: r,
    })
}

pub fn run(a: &ValidateArgs) -> Result<ExitCode> {
    let cfg = config(a)?;
    let tuned = crate::cmd_apply::load(&a.path)?;
    let nccl = tcpx_ffi::nccl::Nccl::load()
        .map(|n| format!("libnccl {} ({})", n.version(), n.path()))
        .map_err(|e| e.to_string());
    let gpus = tcpx_gpu::device_count().map_err(|e| e.to_string());
    let found = match prerequisites(gpus, nccl, &cfg) {
        Ok(f) => f,
        Err(reason) => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "start": start(&tuned.source, &cfg),
                        "status": "n/a",
                        "reason": reason,
                    })
                );
            } else {
                println!("validate: N/A: {reason}");
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let exe = std::env::current_exe().context("finding this tcpx-run binary")?;
    let command = move || Ok(Command::new(&exe));
    let gains = run_comparison(&cfg, &tuned.vars, &command, &mut |run, of, rep, arm| {
        eprintln!(
            "validate: run {run} of {of}: repetition {rep} {}",
            arm.as_str()
        )
    })?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "start": start(&tuned.source, &cfg),
                "status": "ok",
                "found": found,
                "sizes": gains,
                "allreduce": "not measured here: `tcpx-gpu-bench nccl --allreduce` measures all-reduce busbw",
            })
        );
    } else {
        print!("{}", table(&found, &tuned.source, &gains));
    }
    Ok(ExitCode::SUCCESS)
}

fn start(source: &std::path::Path, cfg: &ValidateConfig) -> serde_json::Value {
    serde_json::json!({
        "tool": "tcpx-run validate",
        "version": crate::VERSION,
        "host": crate::cmd_bench::host_name(),
        "timestamp": tcpx_report::utc_now_iso(),
        "tuned": source.display().to_string(),
        "config": cfg,
    })
}

fn stats_text(f: &Option<tcpx_report::FigureStats>) -> String {
    f.as_ref().map_or_else(
        || "-".into(),
        |f| format!("{:.2} [{:.2}, {:.2}]", f.median, f.ci95_lo, f.ci95_hi),
    )
}

fn table(found: &str, source: &std::path::Path, gains: &[SizeGain]) -> String {
    let mut s = Vec::new();
    let _ = writeln!(
        s,
        "# tcpx-run validate {}: nccl backend (libnccl send/recv), {found}\n# receiver busbw GB/s (1e9 B/s): median [95% interval] over the repetitions; gain = tuned / default",
        source.display()
    );
    let _ = writeln!(
        s,
        "#{:>12} {:>26} {:>26} {:>24}",
        "size", "default", "tuned", "gain"
    );
    for g in gains {
        let gain = match (g.gain, g.gain_lo, g.gain_hi) {
            (Some(r), Some(lo), Some(hi)) => format!("{r:.3} [{lo:.3}, {hi:.3}]"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            " {:>12} {:>26} {:>26} {:>24}",
            g.size,
            stats_text(&g.default),
            stats_text(&g.tuned),
            gain
        );
    }
    let _ = writeln!(
        s,
        "# all-reduce busbw: not measured here (`tcpx-gpu-bench nccl --allreduce` measures it)"
    );
    String::from_utf8_lossy(&s).into_owned()
}
