//! `tcpx-run tune <nccl|tcpx|socket>`: a search over the subject's own settings within a budget,
//! every point measured by the subject itself in fresh processes; writes
//! `reports/<stamp>-tune-<subject>/` (points.csv, search.svg, summary.md, tune.json, tuned.env)
//! and prints the winner. The work is `tcpx_tune`'s; this module reads the flags and the
//! environment, says how to start a child (this binary) and prints.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result};
use tcpx_tune::{output, Subject, TuneSpace};

#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// What to tune: nccl (libnccl send/recv over NCCL's NET/Socket), tcpx (libnccl over the
    /// GPUDirect-TCPX plugin; give --net-plugin) or socket (tcpx-lab's socket backend)
    pub subject: String,
    /// A knob to vary and its levels, NAME=v1,v2,... or NAME=lo..hi (doubling), repeatable;
    /// `default` leaves an NCCL variable unset. Given, the space is exactly these knobs; else
    /// the subject's default space (`--dry-run` lists it)
    #[arg(long, value_name = "NAME=LEVELS")]
    pub space: Vec<String>,
    /// Most points measured (every measurement counts, repeats included)
    #[arg(long, default_value_t = 60)]
    pub points: usize,
    /// Most minutes the search may take (points are not started past it)
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Message sizes of each point; the figure is the largest's (K, M, G = powers of 1024)
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Timed iterations per point
    #[arg(long, default_value_t = 6)]
    pub iters: u32,
    /// Untimed iterations per point before them
    #[arg(long, default_value_t = 2)]
    pub warmup: u32,
    /// GPU both NCCL ranks share as two NCCL hosts (nccl, tcpx)
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Where the socket backend's buffers live: host, or cuda:S,R (socket)
    #[arg(long, default_value = "host")]
    pub memory: String,
    /// The NCCL net plugin (.so) NCCL loads (tcpx; default: $NCCL_NET_PLUGIN)
    #[arg(long)]
    pub net_plugin: Option<PathBuf>,
    /// Seed of the search's random choices (the same seed, the same points)
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the run directory is created
    #[arg(long, default_value = "reports")]
    pub reports: PathBuf,
    /// Most seconds one point may take before its processes are killed (it then fails)
    #[arg(long, default_value_t = 120)]
    pub point_timeout: u64,
    /// Keep every point's NCCL log in this directory
    #[arg(long)]
    pub nccl_logs: Option<PathBuf>,
    /// Print the space and the budget, measure nothing
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(a: &TuneArgs) -> Result<ExitCode> {
    let subject = Subject::parse(&a.subject).map_err(|e| anyhow::anyhow!("{e}"))?;
    let budget = tcpx_tune::limits::budget(a.minutes, a.points, a.iters, a.warmup, a.point_timeout)
        .map_err(|e| anyhow::anyhow!(e))?;
    let space = if a.space.is_empty() {
        TuneSpace::default_for(subject)
    } else {
        TuneSpace::parse(subject, &a.space).map_err(|e| anyhow::anyhow!("--space: {e}"))?
    };
    let sizes = tcpx_tune::limits::sizes(&a.size).map_err(|e| anyhow::anyhow!(e))?;
    eprintln!(
        "tune {}: {} knobs, {} configurations; budget {} points, {:.1} minutes; from {}",
        subject.name(),
        space.space.dims.len(),
        space.space.size(),
        budget.points,
        budget.seconds / 60.0,
        space.space.describe(&space.base)
    );
    if a.dry_run {
        for d in &space.space.dims {
            println!("{}={}", d.name, d.levels.join(","));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("finding this tcpx-run binary")?;
    let command = move || Ok(Command::new(&exe));
    let limit = std::time::Duration::from_secs(a.point_timeout);
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let options = tcpx_tune::measure::PointOptions {
        sizes: sizes.clone(),
        size_text: a.size.clone(),
        iters: a.iters,
        warmup: a.warmup,
        gpu: a.gpu,
        memory: a.memory.clone(),
        net_plugin: a
            .net_plugin
            .as_ref()
            .map(|p| p.display().to_string())
            .or_else(|| env("NCCL_NET_PLUGIN")),
        gdr_level: env("NCCL_NET_GDR_LEVEL"),
        plugin_chunk: env(tcpx_transport::netplugin::DYNAMIC_CHUNK_VAR),
        limit,
        nccl_logs: a.nccl_logs.clone(),
    };
    let prepared = tcpx_tune::measure::prepare(subject, &options, &command)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(found) = &prepared.found {
        eprintln!("tune: {found}");
    }
    let plugin_path = prepared.net_plugin.clone();
    let mut measure = prepared.measure;
    let host = crate::cmd_bench::host_name();
    let ctx = output::RunContext {
        host: host.clone(),
        started: tcpx_report::utc_now_iso(),
        net_plugin: plugin_path,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    // The directory first, so a run whose results could not be saved is refused before it
    // spends its budget.
    let dir = tcpx_report::create_run_dir(
        &a.reports,
        &format!("{}-tune-{}", tcpx_report::utc_stamp(), subject.name()),
    )?;
    let mut progress = |p: &tcpx_tune::Progress| {
        let r = &p.row.record;
        let got = match &r.value {
            Ok(v) => format!("{v:.2} GB/s"),
            Err(e) => format!("FAILED: {}", tcpx_report::safe::comment(e)),
        };
        let best = p
            .best
            .as_ref()
            .map(|(v, _)| format!("; best {v:.2} GB/s"))
            .unwrap_or_default();
        eprintln!(
            "tune: point {}/{} ({}, {:.0} s): {} -> {got}{best}",
            p.done,
            p.budget.points,
            r.phase.as_str(),
            p.elapsed_s,
            space.space.describe(&r.coords),
        );
    };
    let run = tcpx_tune::run(
        subject,
        &space,
        budget,
        a.seed,
        measure.as_mut(),
        &mut progress,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    output::write_dir(&run, &ctx, &dir)?;
    println!("# tcpx-run tune {}: {}", subject.name(), subject.describe());
    println!(
        "# {} points in {:.0} s on {host}",
        run.points.len(),
        run.elapsed_s
    );
    match (run.winner_values(), run.gain()) {
        (Some(values), gain) => {
            let w = tcpx_report::stats::median(&run.outcome.winner_samples).unwrap_or(f64::NAN);
            let b = tcpx_report::stats::median(&run.outcome.base_samples).unwrap_or(f64::NAN);
            println!("winner: {w:.2} GB/s against the defaults' {b:.2} GB/s");
            println!("chosen: {}", output::decision_text(&run));
            if let Some(g) = gain {
                println!("gain:   {:.2}x [{:.2}, {:.2}]", g.ratio, g.lo, g.hi);
            }
            for (k, v) in values {
                println!("  {k}={v}");
            }
            println!("report: {}", dir.display());
            println!("next:   tcpx-run validate {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        (None, _) => {
            eprintln!(
                "tcpx-run: error: no point of the search succeeded (reasons in {}/summary.md)",
                dir.display()
            );
            Ok(ExitCode::from(2))
        }
    }
}
