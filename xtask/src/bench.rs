//! `cargo xtask bench`: `tcpx-run bench` (socket backend, host memory, one channel of K sockets)
//! against the physical ceiling of this machine's loopback, measured in the same run: free-running
//! plain C TCP (`tcp_yardstick.c` with `TCP_YARDSTICK_FREE`, built with the machine's C compiler
//! when there is one): K sender threads each write their own buffer of the message size, whole
//! buffer per call, for a fixed time, K receivers read into their own buffers, no barriers, what
//! `iperf3 -P K` with large buffers measures. The ratios are against it, and against the same
//! yardstick with each receiver's reads walking its whole buffer (`TCP_YARDSTICK_WALK`): the
//! free-running yardstick's reads all land in the same few cache-resident MiB of its buffer,
//! the tool's fill whole requests, and on the 16-core GPU host that difference alone is about
//! 1.3x the kernel's CPU per byte (docs/perf-data/PERFORMANCE-history-2026-11.md, issue 26).
//! And against the fastest plain C that fills its buffer: walking reads into a 256 KiB buffer of
//! the receiver's own, copied on with streaming stores (`TCP_YARDSTICK_BOUNCE`, `TCP_YARDSTICK_NT`),
//! what the socket backend does for large buffers; where free-running C's receives never leave
//! the cache, this is the ceiling for a program whose bytes must land in memory.
//!
//! Extra columns explain the rest: plain C moving one message cut into K slices (each stream its
//! own sender and receiver thread, the clock stopped by the last stream: a stream the scheduler
//! serves less holds the whole message back, which free-running streams do not), the same with a
//! barrier after every iteration (each iteration its own transfer, as the tool times them), and
//! `tcpx-run baseline` (the one-message program in Rust). Runs interleave (C, baseline, tool for
//! each K, then the next repetition), so all see the same machine state; the table gives medians
//! and the ratios' spread.
//!
//! A second table gives the CPU each side spent per GB over its timed part (the yardstick's
//! getrusage, the tool's `--sample-ms` process CPU; both sides of the transfer run in one
//! process in both) and the CPUs that kept busy: where the CPUs are the limit, the ratio is the
//! CPU per byte and the busy CPUs of the two, multiplied
//! (docs/perf-data/PERFORMANCE-history-2026-11.md, "Issue 26, closing measurement").

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Bytes per system call plain C is run with (0: a stream's whole slice at once); the best counts.
/// (1 MiB calls, also tried, were never the best on the 16-core GPU host.)
const C_CALLS: [u64; 2] = [256 << 10, 0];

/// The plain C yardstick's source, also written into the GPU bundle.
pub const TCP_YARDSTICK_C: &str = include_str!("tcp_yardstick.c");

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Socket (stream) counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    socks: Vec<u32>,
    /// Message size (the buffer size on each side).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Timed iterations per run.
    #[arg(long, default_value_t = 10)]
    iters: u32,
    /// Repetitions of each triple (median kept).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Bytes per request of the tool; `auto` passes no `--chunk` (the tool's own rule).
    #[arg(long, default_value = "auto")]
    chunk: String,
    /// Requests in flight per channel, each run in turn; `auto` passes no `--window` (the tool's
    /// own rule, what a user gets with no flags), a number passes it.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    window: Vec<String>,
    /// The tool's start barriers (`tcpx-run bench --barrier`); each is run with each window:
    /// `iteration` times every iteration from an idle start, `size` runs the timed iterations
    /// back to back as nccl-tests does.
    #[arg(long, value_delimiter = ',', default_value = "iteration,size")]
    barrier: Vec<String>,
    /// Seconds each free-running yardstick run sends for.
    #[arg(long, default_value_t = 2.0)]
    free_secs: f64,
}

/// Median ([`tcpx_report::stats::median`]) and (min, max) of a list; NaN for an empty one.
fn median_spread(v: Vec<f64>) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::NAN, f64::min);
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    (tcpx_report::stats::median(&v).unwrap_or(f64::NAN), min, max)
}

fn json_of(out: &std::process::Output, what: &str) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().context("no output")?;
    serde_json::from_str(last).with_context(|| format!("{what}: unreadable JSON line `{last}`"))
}

/// Builds the C yardstick into `dir` with `cc` (or gcc); `None` with a note when there is no
/// compiler.
fn build_yardstick(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("tcp_yardstick.c");
    let exe = dir.join("tcp_yardstick");
    std::fs::create_dir_all(dir).ok()?;
    std::fs::write(&src, TCP_YARDSTICK_C).ok()?;
    for cc in ["cc", "gcc", "clang"] {
        let built = Command::new(cc)
            .args(["-O2", "-pthread", "-o"])
            .arg(&exe)
            .arg(&src)
            .status();
        if built.is_ok_and(|s| s.success()) {
            return Some(exe);
        }
    }
    eprintln!("xtask bench: no C compiler (cc, gcc, clang): the plain C column is left out");
    None
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
    let yard = build_yardstick(&target.join("xtask-bench"));
    let size_bytes = tcpx_size(&a.size)?;
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("Machine: {cpu}, {cores} CPUs, Linux {}", kernel.trim());
    println!(
        "Loopback 127.0.0.1, host memory, {} per message (and per buffer on each side), {} iterations, \
         tool: chunk {} window {:?} barrier {:?}; median of {} interleaved runs (ratio range in brackets); load average at start: {}.\n",
        a.size,
        a.iters,
        a.chunk,
        a.window,
        a.barrier,
        a.reps,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let k_count = a.socks.len();
    for w in &a.window {
        if w != "auto" && w.parse::<u32>().map_or(true, |n| n == 0) {
            bail!("--window {w}: `auto` or a number of requests of at least 1");
        }
    }
    // The tool's runs: each window with each barrier, and their column names.
    let variants: Vec<(&str, &str, String)> = a
        .window
        .iter()
        .flat_map(|w| a.barrier.iter().map(move |b| (w.as_str(), b.as_str())))
        .map(|(w, b)| {
            let name = match b {
                "iteration" => format!("window {w}"),
                "size" => format!("window {w} back to back"),
                other => format!("window {w} barrier {other}"),
            };
            (w, b, name)
        })
        .collect();
    // CPU-s per GB of the yardstick, and of the tool per window.
    let mut c_free_cpu = vec![Vec::new(); k_count];
    let mut c_walk_cpu = vec![Vec::new(); k_count];
    let mut c_walk = vec![Vec::new(); k_count];
    let mut c_fill_cpu = vec![Vec::new(); k_count];
    let mut c_fill = vec![Vec::new(); k_count];
    let mut tool_cpu = vec![vec![Vec::new(); k_count]; variants.len()];
    let (mut c_free, mut c_tcp, mut c_sync, mut base) = (
        vec![Vec::new(); k_count],
        vec![Vec::new(); k_count],
        vec![Vec::new(); k_count],
        vec![Vec::new(); k_count],
    );
    // tool[variant][stream count]: GB/s per repetition.
    let mut tool = vec![vec![Vec::new(); k_count]; variants.len()];
    for rep in 0..a.reps {
        for (i, &k) in a.socks.iter().enumerate() {
            eprintln!("repetition {} of {}: {k} streams", rep + 1, a.reps);
            if let Some(y) = &yard {
                // The yardstick: free-running streams, whole-buffer calls; then the same with
                // each receiver's reads walking its whole buffer, as the tool's receives fill
                // whole requests (the yardstick's reads all land in the same few cache-resident
                // MiB, which costs the kernel less per byte: docs/PERFORMANCE.md, host memory);
                // then walking through a 256 KiB bounce with streaming stores, the fastest way
                // plain C found to fill its buffer.
                for (walk, bounce, gbps, cpu) in [
                    (false, "0", &mut c_free, &mut c_free_cpu),
                    (true, "0", &mut c_walk, &mut c_walk_cpu),
                    (true, "262144", &mut c_fill, &mut c_fill_cpu),
                ] {
                    let out = Command::new(y)
                        .args([
                            size_bytes.to_string(),
                            "1".into(),
                            k.to_string(),
                            "1".into(),
                        ])
                        .arg("0")
                        .env("TCP_YARDSTICK_FREE", a.free_secs.to_string())
                        .env("TCP_YARDSTICK_WALK", if walk { "1" } else { "0" })
                        .env("TCP_YARDSTICK_BOUNCE", bounce)
                        .env("TCP_YARDSTICK_NT", "1")
                        .output()?;
                    let line = json_of(&out, "tcp_yardstick (free-running)")?;
                    gbps[i].push(line["gbps"].as_f64().context("gbps")?);
                    if let Some(c) = yardstick_cpu_per_gb(&line) {
                        cpu[i].push(c);
                    }
                }
                // One message in K slices: the strongest of plain C's call sizes.
                let mut best: f64 = 0.0;
                for call in C_CALLS {
                    let out = Command::new(y)
                        .args([size_bytes.to_string(), a.iters.to_string(), k.to_string()])
                        .args(["1".to_string(), call.to_string()])
                        .output()?;
                    let g = json_of(&out, "tcp_yardstick")?["gbps"]
                        .as_f64()
                        .context("gbps")?;
                    best = best.max(g);
                }
                c_tcp[i].push(best);
                let out = Command::new(y)
                    .args([size_bytes.to_string(), a.iters.to_string(), k.to_string()])
                    .args(["1".to_string(), C_CALLS[0].to_string()])
                    .env("TCP_YARDSTICK_SYNC", "1")
                    .output()?;
                c_sync[i].push(
                    json_of(&out, "tcp_yardstick (barrier per iteration)")?["gbps"]
                        .as_f64()
                        .context("gbps")?,
                );
            }
            let b = Command::new(&bin)
                .args(["baseline", "--json", "--streams", &k.to_string()])
                .args(["--size", &a.size, "--iters", &a.iters.to_string()])
                .output()?;
            base[i].push(json_of(&b, "baseline")?["gbps"].as_f64().context("gbps")?);
            for (w, (window, barrier, _)) in variants.iter().enumerate() {
                let mut t = Command::new(&bin);
                t.args(["bench", "--role", "local", "--no-csv", "--json"])
                    .args(["--verify", "off", "--channels", "1", "--barrier", barrier])
                    .args(["--socks-per-channel", &k.to_string(), "--size", &a.size]);
                if a.chunk != "auto" {
                    t.args(["--chunk", &a.chunk]);
                }
                if *window != "auto" {
                    t.args(["--window", window]);
                }
                let t = t
                    .args(["--iters", &a.iters.to_string(), "--warmup", "2"])
                    .args(["--sample-ms", "10"])
                    .output()?;
                let m = json_of(&t, "tcpx-run bench")?;
                // `bench --json` is one document: {start, measurements, end}.
                let recv = &m["measurements"][0]["recv"];
                tool[w][i].push(recv["algbw_gbs"].as_f64().context("algbw")?);
                if let Some(c) = recv["cpu"]["cpu_s_per_gb"].as_f64() {
                    tool_cpu[w][i].push(c);
                }
            }
        }
    }
    let mut head = vec![
        "streams".to_string(),
        "plain C free-running, the yardstick (GB/s)".into(),
        "plain C free-running, receives walking the buffer (GB/s)".into(),
        "plain C free-running, walking through a bounce with streaming stores (GB/s)".into(),
        "plain C, one message in K slices, best call size (GB/s)".into(),
        "plain C, barrier per iteration (GB/s)".into(),
        "tcpx-run baseline (GB/s)".into(),
    ];
    head.extend(
        variants
            .iter()
            .map(|(_, _, n)| format!("bench, {n} (GB/s)")),
    );
    head.extend(variants.iter().map(|(_, _, n)| format!("{n} / yardstick")));
    head.extend(variants.iter().map(|(_, _, n)| format!("{n} / walking")));
    head.extend(
        variants
            .iter()
            .map(|(_, _, n)| format!("{n} / C filling its buffer")),
    );
    head.extend(
        variants
            .iter()
            .map(|(_, _, n)| format!("{n} / C one message")),
    );
    println!("| {} |", head.join(" | "));
    println!("|{}", "---:|".repeat(head.len()));
    for (i, &k) in a.socks.iter().enumerate() {
        let ratio = |num: &[f64], den: &[f64]| -> String {
            if den.is_empty() {
                return "–".into();
            }
            let (m, lo, hi) =
                median_spread(num.iter().zip(den).map(|(n, d)| n / d).collect::<Vec<_>>());
            format!("{m:.2} [{lo:.2}-{hi:.2}]")
        };
        let med = |v: &[f64]| {
            if v.is_empty() {
                "–".to_string()
            } else {
                format!("{:.2}", median_spread(v.to_vec()).0)
            }
        };
        let mut cells = vec![
            k.to_string(),
            med(&c_free[i]),
            med(&c_walk[i]),
            med(&c_fill[i]),
            med(&c_tcp[i]),
            med(&c_sync[i]),
            med(&base[i]),
        ];
        cells.extend(tool.iter().map(|t| med(&t[i])));
        cells.extend(tool.iter().map(|t| ratio(&t[i], &c_free[i])));
        cells.extend(tool.iter().map(|t| ratio(&t[i], &c_walk[i])));
        cells.extend(tool.iter().map(|t| ratio(&t[i], &c_fill[i])));
        cells.extend(tool.iter().map(|t| ratio(&t[i], &c_tcp[i])));
        println!("| {} |", cells.join(" | "));
    }
    println!("\nCPU per byte (CPU-s per GB over the timed part, median) and CPUs busy (CPU-s per GB x GB/s):\n");
    let mut head = vec![
        "streams".to_string(),
        "yardstick CPU-s/GB".into(),
        "yardstick CPUs busy".into(),
        "walking CPU-s/GB".into(),
        "walking CPUs busy".into(),
        "filling CPU-s/GB".into(),
        "filling CPUs busy".into(),
    ];
    for (_, _, n) in &variants {
        head.push(format!("{n} CPU-s/GB"));
        head.push(format!("{n} CPUs busy"));
    }
    println!("| {} |", head.join(" | "));
    println!("|{}", "---:|".repeat(head.len()));
    for (i, &k) in a.socks.iter().enumerate() {
        let mut cells = vec![k.to_string()];
        cells.extend(cpu_cells(&c_free_cpu[i], &c_free[i]));
        cells.extend(cpu_cells(&c_walk_cpu[i], &c_walk[i]));
        cells.extend(cpu_cells(&c_fill_cpu[i], &c_fill[i]));
        for (w, t) in tool.iter().enumerate() {
            cells.extend(cpu_cells(&tool_cpu[w][i], &t[i]));
        }
        println!("| {} |", cells.join(" | "));
    }
    Ok(())
}

/// CPU seconds per GB of a yardstick line (its getrusage over the timed part), if it has them.
fn yardstick_cpu_per_gb(line: &serde_json::Value) -> Option<f64> {
    let cpu = line["user_s"].as_f64()? + line["sys_s"].as_f64()?;
    let gb = line["bytes"].as_f64()? / 1e9;
    (gb > 0.0).then(|| cpu / gb)
}

/// Median CPU-s per GB and CPUs busy (the per-repetition product with GB/s), or dashes.
fn cpu_cells(cpu: &[f64], gbps: &[f64]) -> [String; 2] {
    if cpu.is_empty() || cpu.len() != gbps.len() {
        return ["–".into(), "–".into()];
    }
    let busy: Vec<f64> = cpu.iter().zip(gbps).map(|(c, g)| c * g).collect();
    [
        format!("{:.3}", median_spread(cpu.to_vec()).0),
        format!("{:.1}", median_spread(busy).0),
    ]
}

/// Bytes in a size like `256M` (K, M, G are powers of 1024).
fn tcpx_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("size `{s}`: a number with K, M or G"))?;
    Ok(n << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_spreads() {
        assert_eq!(tcpx_size("256M").unwrap(), 256 << 20);
        assert_eq!(tcpx_size("4096").unwrap(), 4096);
        assert!(tcpx_size("lots").is_err());
        assert_eq!(median_spread(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(median_spread(vec![4.0, 1.0, 3.0, 2.0]), (2.5, 1.0, 4.0));
        // CPUs busy are CPU-s per GB times GB/s, per repetition, then the median.
        assert_eq!(
            cpu_cells(&[0.5, 0.6, 0.4], &[30.0, 20.0, 10.0]),
            ["0.500".to_string(), "12.0".to_string()]
        );
        assert_eq!(cpu_cells(&[], &[1.0]), ["–".to_string(), "–".to_string()]);
        let line = serde_json::json!({"user_s": 0.5, "sys_s": 1.5, "bytes": 4e9});
        assert_eq!(yardstick_cpu_per_gb(&line), Some(0.5));
        assert_eq!(
            yardstick_cpu_per_gb(&serde_json::json!({"gbps": 1.0})),
            None
        );
    }

    /// The C yardstick compiles and moves what it says, where there is a compiler.
    #[test]
    fn c_yardstick_builds_and_runs_where_there_is_a_compiler() {
        let dir = std::env::temp_dir().join(format!("xtask-yard-{}", std::process::id()));
        let Some(exe) = build_yardstick(&dir) else {
            eprintln!("SKIP: no C compiler");
            return;
        };
        let out = Command::new(&exe)
            .args(["1048576", "2", "1,3", "1", "4096"])
            .output()
            .unwrap();
        let sync = Command::new(&exe)
            .args(["1048576", "3", "2", "1", "0"])
            .env("TCP_YARDSTICK_SYNC", "1")
            .output()
            .unwrap();
        let free = Command::new(&exe)
            .args(["1048576", "1", "2", "1", "0"])
            .env("TCP_YARDSTICK_FREE", "0.05")
            .output()
            .unwrap();
        let walk = Command::new(&exe)
            .args(["1048576", "1", "2", "1", "0"])
            .env("TCP_YARDSTICK_FREE", "0.05")
            .env("TCP_YARDSTICK_WALK", "1")
            .output()
            .unwrap();
        // Receives through a bounce, copied on with streaming stores: free-running and timed.
        let fill = Command::new(&exe)
            .args(["1048576", "1", "2", "1", "0"])
            .env("TCP_YARDSTICK_FREE", "0.05")
            .env("TCP_YARDSTICK_BOUNCE", "65536")
            .env("TCP_YARDSTICK_NT", "1")
            .output()
            .unwrap();
        let sync_fill = Command::new(&exe)
            .args(["1048576", "3", "4", "1", "0"])
            .env("TCP_YARDSTICK_SYNC", "1")
            .env("TCP_YARDSTICK_BOUNCE", "65536")
            .env("TCP_YARDSTICK_NT", "1")
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for (run, kind, exact) in [
            (&fill, "c_free_walk_bounce_nt", None),
            (&sync_fill, "c_tcp_sync_bounce_nt", Some(3 * 1048576)),
        ] {
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            let line: serde_json::Value =
                serde_json::from_str(String::from_utf8_lossy(&run.stdout).trim()).unwrap();
            assert_eq!(line["kind"], kind);
            let bytes = line["bytes"].as_u64().unwrap();
            match exact {
                Some(b) => assert_eq!(bytes, b),
                None => assert!(
                    bytes >= 2 * 1048576 && bytes.is_multiple_of(1048576),
                    "{bytes} bytes"
                ),
            }
            // Each read fills at most the 64 KiB bounce: at least 16 reads per MiB received.
            assert!(
                line["rx_calls"].as_u64().unwrap() >= bytes / 65536,
                "{line}"
            );
        }
        // Receives walking the buffer get every byte too, and say which yardstick they are.
        assert!(walk.status.success());
        let walk: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&walk.stdout).trim()).unwrap();
        assert_eq!(walk["kind"], "c_free_walk");
        let walked = walk["bytes"].as_u64().unwrap();
        assert!(
            walked >= 2 * 1048576 && walked.is_multiple_of(1048576),
            "{walked} bytes"
        );
        assert!(free.status.success());
        let free: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&free.stdout).trim()).unwrap();
        assert_eq!(free["kind"], "c_free");
        // Its CPU over the timed part comes with it, and turns into CPU-s per GB.
        assert!(free["sys_s"].as_f64().is_some() && free["user_s"].as_f64().is_some());
        assert!(yardstick_cpu_per_gb(&free).is_some_and(|c| c >= 0.0));
        // Senders write whole buffers, at least one each, and receivers get all of it.
        let bytes = free["bytes"].as_u64().unwrap();
        assert!(
            bytes >= 2 * 1048576 && bytes.is_multiple_of(1048576),
            "{bytes} bytes"
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(sync.status.success());
        let sync: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&sync.stdout).trim()).unwrap();
        assert_eq!(sync["kind"], "c_tcp_sync");
        assert_eq!(sync["bytes"], 3 * 1048576);
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["streams"], 3);
        assert_eq!(lines[1]["bytes"], 2 * 1048576);
        assert_eq!(lines[1]["call"], 4096);
    }
}
