//! `tcpx-run validate <report dir | tuned.env | tuned.json>`: libnccl send/recv (the `nccl`
//! backend, GPU to GPU) and all-reduce busbw, each with NCCL's defaults and with the tuned NCCL
//! variables, repetitions interleaved, and the gain per size with its interval. N/A, with the
//! reason and exit status 0, where libnccl or two GPUs are missing; 2 when a run failed. The work
//! is `tcpx_orchestrate::validate`'s; this module says how to start a child (this binary: NCCL
//! reads its environment once per process) and prints. The hidden `--allreduce-child` is that
//! child.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use tcpx_orchestrate::validate::{self as v, Collective, Outcome, ValidateConfig};

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// A plan run's report directory, or its tuned.env / tuned.json
    #[arg(required_unless_present = "allreduce_child")]
    pub path: Option<PathBuf>,
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
    /// Run one all-reduce arm in this process and print its JSON result (started by validate)
    #[arg(long, hide = true)]
    pub allreduce_child: bool,
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
    let sizes = tcpx_bench::parse_sizes(&a.size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
    if sizes.contains(&0) {
        bail!(
            "--size `{}`: a size of 0 bytes measures nothing; give 1 byte or more (e.g. 1M)",
            a.size
        );
    }
    Ok(ValidateConfig {
        sizes,
        reps: a.reps,
        iters: a.iters,
        warmup: a.warmup,
        send_gpu: s,
        recv_gpu: r,
    })
}

pub fn run(a: &ValidateArgs) -> Result<ExitCode> {
    let cfg = config(a)?;
    if a.allreduce_child {
        let out = v::allreduce::child(&cfg, std::time::Duration::from_secs(120));
        println!("{}", serde_json::to_string(&out)?);
        let ok = matches!(out, v::allreduce::ChildOutcome::Measured { .. });
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let tuned = tcpx_report::tuned::load(a.path.as_deref().unwrap_or("tuned.env".as_ref()))?;
    let nccl = tcpx_ffi::nccl::Nccl::load()
        .map(|n| format!("libnccl {} ({})", n.version(), n.path()))
        .map_err(|e| e.to_string());
    let gpus = tcpx_gpu::device_count().map_err(|e| e.to_string());
    let (found, results) = match v::prerequisites(gpus, nccl, &cfg) {
        Err(reason) => (
            format!("N/A: {reason}"),
            v::not_available(&Collective::ALL, &reason),
        ),
        Ok(found) => {
            let exe = std::env::current_exe().context("finding this tcpx-run binary")?;
            let command = move || Ok(Command::new(&exe));
            let mut progress = |i, of, r: &v::Run| {
                let (c, arm) = (r.collective.as_str(), r.arm.as_str());
                eprintln!(
                    "validate: run {i} of {of}: repetition {} {c} {arm}",
                    r.rep + 1
                )
            };
            let results =
                v::run_validation(&cfg, &tuned.vars, &Collective::ALL, &command, &mut progress);
            (found, results)
        }
    };
    let failed = results
        .iter()
        .any(|c| matches!(c.outcome, Outcome::Failed { .. }));
    let na = results
        .iter()
        .all(|c| matches!(c.outcome, Outcome::NotAvailable { .. }));
    if a.json {
        let doc = serde_json::json!({
            "start": {
                "tool": "tcpx-run validate", "version": crate::VERSION,
                "host": crate::cmd_bench::host_name(), "timestamp": tcpx_report::utc_now_iso(),
                "tuned": tuned.source.display().to_string(), "config": cfg,
            },
            "status": if na { "n/a" } else if failed { "failed" } else { "ok" },
            "found": found,
            "collectives": results,
        });
        println!("{doc}");
    } else {
        print!("{}", v::table(&found, &tuned.source, &results));
    }
    let failed = results
        .iter()
        .any(|c| matches!(c.outcome, Outcome::Failed { .. }));
    Ok(if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
