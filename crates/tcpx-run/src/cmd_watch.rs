//! `tcpx-run watch DIR`: what the watch shim wrote while a job ran (`tcpx_watch`), as a table,
//! `--json` or an HTML report, or followed live (`--follow`: one line per NIC per window until
//! the job ends, Ctrl-C, or `--for`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tcpx_watch::{follow, present, watch, FollowEnd, WatchOptions};

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The directory the shim wrote into (TCPX_WATCH_DIR)
    pub dir: PathBuf,
    /// Follow a running job: one line per NIC per window, until every process has ended,
    /// Ctrl-C, or --for
    #[arg(long)]
    pub follow: bool,
    /// With --follow: stop after this many seconds
    #[arg(long = "for", value_name = "S", requires = "follow", value_parser = crate::args::budget_seconds)]
    pub for_s: Option<f64>,
    /// Window width in seconds (GB/s per window; --follow also polls this often); default: the
    /// shim's own interval
    #[arg(long, value_name = "S", value_parser = crate::args::budget_seconds)]
    pub interval: Option<f64>,
    /// Print one JSON document (summary and verdicts) instead of the table
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (GB/s per NIC over time) to this file
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
    /// NCCL's debug log (NCCL_DEBUG=INFO): names a fallback to NET/Socket, another plugin, or
    /// processes that wrote no watch file
    #[arg(long, value_name = "FILE")]
    pub nccl_log: Option<PathBuf>,
    /// The job was meant to load the shim: a directory without files is a finding
    #[arg(long)]
    pub expect_plugin: bool,
    /// A connect or accept longer than this many seconds is a start-up stall
    #[arg(long, value_name = "S", default_value = "10", value_parser = crate::args::budget_seconds)]
    pub stall_s: f64,
}

pub fn run(a: &WatchArgs) -> Result<ExitCode> {
    let mut o = WatchOptions {
        expect_plugin: a.expect_plugin,
        nccl_log: a.nccl_log.clone(),
        ..WatchOptions::default()
    };
    o.summary.window_s = a.interval;
    o.verdicts.stall_s = a.stall_s;
    let report = if a.follow {
        let stop = tcpx_fabric::cancel_on_signals().map_err(anyhow::Error::msg)?;
        let deadline = a
            .for_s
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .and_then(|d| Instant::now().checked_add(d));
        let poll = Duration::try_from_secs_f64(a.interval.unwrap_or(1.0))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(60));
        let json = a.json;
        let (report, end) = follow(&a.dir, &o, poll, &stop, deadline, |line| {
            // With --json the document alone goes to stdout.
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        })?;
        eprintln!(
            "tcpx-run watch: {}",
            match end {
                FollowEnd::JobEnded => "every process wrote its end line",
                FollowEnd::Stopped => "interrupted",
                FollowEnd::Deadline => "--for reached",
            }
        );
        report
    } else {
        watch(&a.dir, &o)?
    };
    if let Some(out) = &a.html {
        tcpx_report::write_file(out, present::html(&report).as_bytes())
            .with_context(|| format!("writing --html {}", out.display()))?;
    }
    if a.json {
        crate::print_json(serde_json::to_value(&report)?)?;
    } else {
        print!("{}", present::text(&report));
    }
    Ok(ExitCode::SUCCESS)
}
