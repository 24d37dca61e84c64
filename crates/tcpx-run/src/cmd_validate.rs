//! `tcpx-run validate <report dir | tuned.env | tuned.json>`: libnccl send/recv (the `nccl`
//! backend, GPU to GPU) and all-reduce busbw, each with NCCL's defaults and with the tuned NCCL
//! variables, repetitions interleaved, and the gain per size with its interval. On one GPU (or
//! `--gpus G,G`) both ranks share it as 2 NCCL hosts (distinct `NCCL_HOSTID`s), so NCCL uses its
//! network transport; `--net-plugin` (or tuned.env's `NCCL_NET_PLUGIN`) makes that a net plugin
//! for both arms. NCCL's own log proves per arm which network was used and which variables were
//! read. N/A, with the reason and exit status 4 (nothing was validated), where libnccl or a GPU
//! is missing; 2 when a run failed (or `--net-plugin` names no file); 3 when the logs show a
//! silent fallback or a tuned variable never read. The work is
//! `tcpx_validate`'s; this module reads the environment, says how to start a child
//! (this binary: NCCL reads its environment once per process) and prints. The hidden
//! `--allreduce-child` and `--rank-child` are those children.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{anyhow, bail, Result};
use tcpx_validate::{self as v, Collective, ValidateConfig};

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// A plan run's report directory, or its tuned.env / tuned.json
    #[arg(required_unless_present_any = ["allreduce_child", "rank_child"])]
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
    /// Sender's and receiver's GPU, as S,R. On a machine with one GPU (or with G,G) both ranks
    /// share one GPU as 2 NCCL hosts (distinct NCCL_HOSTIDs, so NCCL uses its network
    /// transport): the default 0,1 becomes 0,0 there, and the output says so
    #[arg(long, default_value = "0,1")]
    pub gpus: String,
    /// One JSON document on stdout instead of the table
    #[arg(long)]
    pub json: bool,
    /// NCCL net plugin (.so) for both arms: sets NCCL_NET_PLUGIN, NCCL_NET_GDR_LEVEL=LOC unless
    /// set, and a plugin chunk that is never 0 (default: tuned.env's NCCL_NET_PLUGIN, if any)
    #[arg(long)]
    pub net_plugin: Option<PathBuf>,
    /// Keep every child's NCCL log (NCCL_DEBUG=INFO) in this directory
    #[arg(long)]
    pub nccl_logs: Option<PathBuf>,
    /// The most one run (one repetition of one arm of one collective) may take, in seconds
    #[arg(long, default_value_t = 300)]
    pub run_timeout: u64,
    /// Run one all-reduce arm in this process and print its JSON result (started by validate)
    #[arg(long, hide = true)]
    pub allreduce_child: bool,
    /// Run one rank of a one-GPU run in this process (started by validate, twice per run)
    #[arg(long, hide = true)]
    pub rank_child: Option<usize>,
    /// The collective of a --rank-child: sendrecv or allreduce
    #[arg(long, hide = true, default_value = "sendrecv")]
    pub collective: String,
}

fn config(a: &ValidateArgs) -> Result<ValidateConfig> {
    ValidateConfig::from_flags(&a.gpus, &a.size, a.reps, a.iters, a.warmup).map_err(|e| anyhow!(e))
}

/// Prints a child process's outcome as one JSON line for its parent; exit code 0 where it
/// measured, 1 where it did not.
fn child_outcome(out: &v::allreduce::ChildOutcome) -> Result<ExitCode> {
    println!("{}", serde_json::to_string(out)?);
    Ok(match out {
        v::allreduce::ChildOutcome::Measured { .. } => ExitCode::SUCCESS,
        v::allreduce::ChildOutcome::Failed { .. } => ExitCode::from(1),
    })
}

pub fn run(a: &ValidateArgs) -> Result<ExitCode> {
    let cfg = config(a)?;
    if a.allreduce_child {
        let out = v::allreduce::child(&cfg, std::time::Duration::from_secs(120));
        return child_outcome(&out);
    }
    if let Some(rank) = a.rank_child {
        let collective = match a.collective.as_str() {
            "sendrecv" => Collective::SendRecv,
            "allreduce" => Collective::AllReduce,
            other => bail!("--collective `{other}`: sendrecv or allreduce"),
        };
        if std::env::var_os("NCCL_COMM_ID").is_none() {
            bail!("--rank-child is started by `tcpx-run validate`, which sets NCCL_COMM_ID");
        }
        let out = v::rank::child(&cfg, collective, rank, std::time::Duration::from_secs(120));
        return child_outcome(&out);
    }
    let tuned = tcpx_report::tuned::load(a.path.as_deref().unwrap_or("tuned.env".as_ref()))?;
    let env = |k: &str| std::env::var(k).ok();
    let found = v::Found {
        gpus: tcpx_gpu::device_count().map_err(|e| e.to_string()),
        nccl: tcpx_ffi::nccl::Nccl::load()
            .map(|n| format!("libnccl {} ({})", n.version(), n.path()))
            .map_err(|e| e.to_string()),
        gdr_level: env("NCCL_NET_GDR_LEVEL"),
        dynamic_chunk: env(tcpx_transport::netplugin::DYNAMIC_CHUNK_VAR),
    };
    let request = v::Request {
        cfg: &cfg,
        tuned: &tuned.vars,
        net_plugin: a.net_plugin.as_deref(),
        log_dir: a.nccl_logs.as_deref(),
        run_timeout_s: a.run_timeout,
    };
    // NCCL reads its environment once per process: every run is a child, this binary again.
    let command = || {
        let exe = std::env::current_exe().map_err(|e| {
            std::io::Error::new(e.kind(), format!("finding this tcpx-run binary: {e}"))
        })?;
        Ok(Command::new(exe))
    };
    let mut say = |line: &str| eprintln!("validate: {line}");
    let mut progress = |i, of, r: &v::Run| {
        let (c, arm) = (r.collective.as_str(), r.arm.as_str());
        eprintln!(
            "validate: run {i} of {of}: repetition {} {c} {arm}",
            r.rep + 1
        )
    };
    let v::Validated {
        found,
        placement,
        extras,
        settings,
        results,
        problems,
        verdict,
    } = v::validate(&request, found, &command, &mut say, &mut progress).map_err(|e| anyhow!(e))?;
    if a.json {
        let doc = serde_json::json!({
            "start": {
                "tool": "tcpx-run validate", "version": crate::VERSION,
                "host": crate::cmd_bench::host_name(), "timestamp": tcpx_report::utc_now_iso(),
                "tuned": tuned.source.display().to_string(), "config": cfg,
            },
            "status": verdict.status(&results),
            "found": found,
            "placement": placement,
            "net_plugin": extras.notes,
            "settings": settings,
            "evidence_problems": problems,
            "collectives": results,
        });
        println!("{doc}");
    } else {
        print!("{}", v::table(&found, &tuned.source, &results));
        for n in extras.notes.iter().chain(&settings) {
            println!("# {n}");
        }
        if !problems.is_empty() {
            println!(
                "# UNPROVEN: NCCL's log does not show what was asked ({} problem(s) above)",
                problems.len()
            );
        }
    }
    if verdict == v::Verdict::NotAvailable {
        // Nothing was validated: not a success a script could take for "tuned settings hold".
        eprintln!("validate: nothing was validated here (N/A): exit status 4");
    }
    Ok(ExitCode::from(verdict.exit_code()))
}
