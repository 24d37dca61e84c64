//! `tcpx-run baseline`: plain multi-stream TCP over loopback, printed as one line of figures.
//!
//! The yardstick `cargo xtask bench` holds `tcpx-run bench` to: the same message size in buffers
//! of that size on each side, one sender and one receiver thread per stream (see
//! `tcpx_bench::baseline`).

use std::process::ExitCode;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct BaselineArgs {
    /// TCP connections, each with its own sender and receiver thread.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    streams: u16,
    /// Bytes per message, cut evenly over the streams; each side has one buffer of this size,
    /// as `tcpx-run bench --size` does (K, M, G are powers of 1024).
    #[arg(long, default_value = "256M", value_parser = tcpx_bench::parse_size)]
    size: u64,
    /// Most bytes per write/read call (0: a stream's whole slice in one call).
    #[arg(long, default_value = "1M", value_parser = tcpx_bench::parse_size)]
    call: u64,
    /// Messages to send.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Loopback address to use (an IP address, no port).
    #[arg(long, default_value = "127.0.0.1", value_parser = parse_ip)]
    bind: std::net::IpAddr,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// An IP address, refused before any lookup when it is anything else (a name, a port).
fn parse_ip(s: &str) -> Result<std::net::IpAddr, String> {
    s.trim().parse().map_err(|_| {
        format!(
            "`{}` is not an IP address: give one without a port, e.g. 127.0.0.1",
            s.escape_debug()
        )
    })
}

pub fn run(a: &BaselineArgs) -> Result<ExitCode> {
    let r = tcpx_bench::baseline::run(
        &a.bind.to_string(),
        a.streams.into(),
        a.size as usize,
        a.iters as usize,
        a.call as usize,
    )
    .with_context(|| format!("plain TCP over {} failed", a.bind))?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"streams": r.streams, "call": a.call, "bytes": r.bytes, "secs": r.secs, "gbps": r.gbps()})
        );
    } else {
        println!(
            "baseline streams {} size {} iters {}: {:.2} GB/s",
            r.streams,
            tcpx_bench::format_size(a.size),
            a.iters,
            r.gbps()
        );
    }
    Ok(ExitCode::SUCCESS)
}
