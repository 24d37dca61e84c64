//! `cargo xtask bench`: `tcpx-run bench` (socket backend, host memory, one channel of K sockets)
//! side by side with `tcpx-run baseline` (plain TCP, K streams) on this machine's loopback.
//! Runs alternate so both see the same machine state; the median of the repetitions is kept.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Socket counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    socks: Vec<u32>,
    /// Message size.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Timed iterations per run.
    #[arg(long, default_value_t = 10)]
    iters: u32,
    /// Repetitions of each pair (median kept).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Bytes per request of the tool.
    #[arg(long, default_value = "4M")]
    chunk: String,
    /// Requests in flight per channel.
    #[arg(long, default_value_t = 8)]
    window: u32,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn json_of(out: &std::process::Output, what: &str) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().context("no output")?;
    serde_json::from_str(last).with_context(|| format!("{what}: unreadable JSON line `{last}`"))
}

pub fn run(root: &Path, a: BenchArgs) -> Result<()> {
    eprintln!("building tcpx-run (release)...");
    let st = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["build", "--release", "-q", "-p", "tcpx-run"])
        .status()?;
    if !st.success() {
        bail!("cargo build failed");
    }
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), Into::into);
    let bin = target.join("release/tcpx-run");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("Machine: {cpu}, {cores} CPUs, Linux {}", kernel.trim());
    println!(
        "Loopback 127.0.0.1, host memory, {} per message, {} iterations, median of {} runs.\n",
        a.size, a.iters, a.reps
    );
    println!("| sockets | plain TCP (GB/s) | tcpx-run socket (GB/s) | ratio |");
    println!("|---:|---:|---:|---:|");
    for &k in &a.socks {
        let (mut base, mut tool) = (Vec::new(), Vec::new());
        for rep in 0..a.reps {
            eprintln!("sockets {k}: repetition {} of {}", rep + 1, a.reps);
            let b = Command::new(&bin)
                .args([
                    "baseline",
                    "--json",
                    "--streams",
                    &k.to_string(),
                    "--size",
                    &a.size,
                ])
                .args(["--iters", &a.iters.to_string()])
                .output()?;
            base.push(json_of(&b, "baseline")?["gbps"].as_f64().context("gbps")?);
            let t = Command::new(&bin)
                .args([
                    "bench",
                    "--role",
                    "local",
                    "--no-csv",
                    "--json",
                    "--verify",
                    "off",
                    "--channels",
                    "1",
                ])
                .args([
                    "--socks-per-channel",
                    &k.to_string(),
                    "--size",
                    &a.size,
                    "--chunk",
                    &a.chunk,
                ])
                .args([
                    "--window",
                    &a.window.to_string(),
                    "--iters",
                    &a.iters.to_string(),
                    "--warmup",
                    "2",
                ])
                .output()?;
            let m = json_of(&t, "tcpx-run bench")?;
            // `bench --json` is one document: {start, measurements, end}.
            tool.push(
                m["measurements"][0]["recv"]["algbw_gbs"]
                    .as_f64()
                    .context("algbw")?,
            );
        }
        let (b, t) = (median(base), median(tool));
        println!("| {k} | {b:.2} | {t:.2} | {:.2} |", t / b);
    }
    Ok(())
}
