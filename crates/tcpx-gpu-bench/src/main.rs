//! tcpx-gpu-bench: reference measurements on a GPU machine, for the table in docs/PERFORMANCE.md.
//!
//! - `nccl`: GPU a -> GPU b through libnccl's ncclSend/ncclRecv (two ranks in one process, one
//!   per GPU), byte-exact verification on the receiving GPU after the timed runs; `--allreduce`
//!   adds ncclAllReduce bus bandwidth (nccl-tests' formula). With `--src` equal to `--dst` (a
//!   one-GPU machine) the ranks run as 2 NCCL hosts on that GPU, a process each
//!   ([`nccl_hosts`]). The NCCL environment (NCCL_NET,
//!   NCCL_P2P_DISABLE, NCCL_NSOCKS_PERTHREAD, ...) is read once per process by NCCL, so each
//!   configuration is a separate run of this binary (`cargo xtask gpu-test` writes those runs).
//! - `pinned`: device <-> pinned host copies, timed with CUDA events.
//! - `socket`: GPU a -> GPU b through the socket backend behind `CudaStaging` (device -> pinned
//!   host -> sockets -> pinned host -> device, copies pipelined with the network), driven by the
//!   shared `tcpx_transport::driver`, verified byte-exact on the receiving GPU.
//! - `unpack`: the GPUDirect-TCPX receive unpack kernel on TCPX-shaped fragment lists (4 KiB
//!   fragments, shuffled pages, 512 KiB to 4 MiB per receive) against a device-to-device copy of
//!   the same bytes, verified on the GPU; target: at least 70% of the copy's bandwidth.
//! - `tcp`: raw TCP over loopback with 1..N streams, host memory to host memory: the ceiling the
//!   socket backends work under.
//!
//! Each measurement prints one `RESULT {json}` line (and a readable line). Not for: the socket
//! backend's own GPU path (that is `tcpx-run` / `tcpx-bench`), nor a substitute for nccl-tests.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use tcpx_ffi::nccl::{allreduce_bus_bandwidth, Comm, Nccl};
use tcpx_gpu::{Device, DeviceBuffer, Stream};

mod nccl_hosts;
mod socket_gpu;
mod unpack;

#[derive(Parser)]
#[command(about = "GPU reference measurements: NCCL, pinned copies, raw TCP loopback")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The sending and the receiving GPU of a GPU -> GPU measurement.
#[derive(Args, Clone, Copy)]
struct GpuPair {
    #[arg(long, default_value_t = 0)]
    src: usize,
    #[arg(long, default_value_t = 1)]
    dst: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// GPU -> GPU through NCCL point-to-point (and optionally all-reduce).
    Nccl {
        /// Message sizes (K, M, G suffixes are powers of 1024).
        #[arg(long, default_value = "1M,4M,16M,64M,256M,1G")]
        sizes: String,
        /// Timed iterations per size (the median is reported).
        #[arg(long, default_value_t = 5)]
        iters: usize,
        #[command(flatten)]
        gpus: GpuPair,
        /// Name of this configuration in the results (e.g. "socket-default").
        #[arg(long, default_value = "nccl")]
        label: String,
        /// Also time ncclAllReduce (f32 sum) over both GPUs at these sizes.
        #[arg(long)]
        allreduce: bool,
        /// Seconds to wait for the ranks to connect and for each transfer.
        #[arg(long, default_value_t = 120)]
        deadline_s: u64,
    },
    /// One rank of `nccl` on one GPU (started by `nccl` itself, with NCCL_HOSTID and
    /// NCCL_COMM_ID set).
    #[command(hide = true)]
    NcclRank {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        sizes: String,
        #[arg(long)]
        iters: usize,
        #[arg(long)]
        gpu: usize,
        #[arg(long)]
        label: String,
        #[arg(long)]
        allreduce: bool,
        #[arg(long)]
        deadline_s: u64,
    },
    /// Device <-> pinned host copies on one GPU.
    Pinned {
        #[arg(long, default_value = "1M,16M,256M,1G")]
        sizes: String,
        #[arg(long, default_value_t = 10)]
        iters: usize,
        #[arg(long, default_value_t = 0)]
        gpu: usize,
    },
    /// Plain GPU -> GPU copies (`cuMemcpyPeerAsync`), the yardstick for the `cudap2p` backend:
    /// first without peer access (the driver stages through the host), then with it enabled,
    /// each run on the receiving GPU's stream (read) and on the sending GPU's (write).
    Peer {
        #[arg(long, default_value = "64M,256M,1G")]
        sizes: String,
        #[arg(long, default_value_t = 10)]
        iters: usize,
        #[command(flatten)]
        gpus: GpuPair,
        /// Enable peer access before allocating the buffers (and skip the staged rows), to see
        /// whether allocations made after enabling get the direct path too.
        #[arg(long)]
        enable_first: bool,
    },
    /// GPU -> GPU through the socket backend with pinned staging (the `--memory cuda` path).
    Socket {
        #[arg(long, default_value = "1M,4M,16M,64M,256M,1G")]
        sizes: String,
        /// Sockets per channel to try (comma-separated); 0 runs the `nccl` transport backend
        /// through the same driver instead.
        #[arg(long, default_value = "1,2,4,8,16")]
        socks: String,
        /// Channels (comms), each with its own CUDA stream per side.
        #[arg(long, default_value_t = 1)]
        channels: usize,
        /// Bytes per request (chunk); smaller messages are one chunk.
        #[arg(long, default_value = "8M")]
        chunk: String,
        /// Requests in flight per channel.
        #[arg(long, default_value_t = 8)]
        window: usize,
        #[arg(long, default_value_t = 5)]
        iters: usize,
        #[command(flatten)]
        gpus: GpuPair,
    },
    /// The TCPX receive unpack kernel against a device-to-device copy of the same bytes.
    Unpack {
        /// Bytes per receive (at most 4M, the GPUDirect-TCPX maximum).
        #[arg(long, default_value = "512K,1M,2M,4M")]
        sizes: String,
        /// Smallest fragment: 4096 gives whole, page-aligned 4 KiB fragments; less gives
        /// fragments at random offsets inside their page (unaligned sources).
        #[arg(long, default_value_t = 4096)]
        min_fragment: usize,
        #[arg(long, default_value_t = 10)]
        iters: usize,
        #[arg(long, default_value_t = 0)]
        gpu: usize,
    },
    /// Raw TCP over 127.0.0.1 with several streams, host memory only.
    Tcp {
        #[arg(long, default_value = "1,2,4,8,16")]
        streams: String,
        /// Bytes moved in total per stream count.
        #[arg(long, default_value = "8G")]
        total: String,
        /// Bytes per write/read call.
        #[arg(long, default_value = "4M")]
        chunk: String,
    },
}

/// A byte count as the rest of tcpx-lab reads one ([`tcpx_model::parse_size`]: K, M, G, T are
/// powers of 1024).
fn parse_size(s: &str) -> Result<usize> {
    let n = tcpx_model::parse_size(s).map_err(|e| anyhow::anyhow!(e))?;
    usize::try_from(n).with_context(|| format!("size {s:?} overflows"))
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    s.split(',').map(parse_size).collect()
}

fn human(n: usize) -> String {
    tcpx_model::format_size(n as u64)
}

/// The median of timings ([`tcpx_model::median`]: the mean of the middle two for an even
/// count); NaN when there are none, which JSON writes as null, rather than a panic.
fn median(v: Vec<f64>) -> f64 {
    tcpx_model::median(&v).unwrap_or(f64::NAN)
}

/// The rates of `n` bytes moved once in each timed iteration `secs`.
struct Rates {
    median_s: f64,
    /// GB/s (1e9 bytes/s) at the median time.
    gbps: f64,
    /// GB/s at the best time.
    best_gbps: f64,
}

fn rates(n: usize, secs: &[f64]) -> Rates {
    let median_s = median(secs.to_vec());
    let best = secs.iter().cloned().fold(f64::MAX, f64::min);
    Rates {
        median_s,
        gbps: n as f64 / median_s / 1e9,
        best_gbps: n as f64 / best / 1e9,
    }
}

fn emit(v: serde_json::Value) {
    println!("RESULT {v}");
}

/// One NCCL send/recv size's result, printed as a row and emitted as a `RESULT` line: `bad` is
/// the first wrong byte the receiver found (an error), `secs` the timed iterations, `placement`
/// how the ranks share a GPU when they do (added to both).
fn report_p2p(
    nccl: &Nccl,
    label: &str,
    n: usize,
    bad: Option<u64>,
    secs: &[f64],
    (src, dst): (usize, usize),
    placement: Option<&str>,
) -> Result<()> {
    if let Some(at) = bad {
        bail!(
            "NCCL {label}: {} message arrived wrong: first bad byte at {at}",
            human(n)
        );
    }
    let Rates {
        median_s,
        gbps,
        best_gbps,
    } = rates(n, secs);
    let shared = placement.map(|p| format!("  ({p})")).unwrap_or_default();
    println!(
        "nccl-p2p {label:>16} {:>6}  {gbps:7.2} GB/s (best {best_gbps:.2})  verified{shared}",
        human(n),
    );
    let mut v = json!({"kind": "nccl_p2p", "label": label, "bytes": n, "iters": secs.len(),
        "median_s": median_s, "gbps": gbps, "best_gbps": best_gbps, "verified": true,
        "src": src, "dst": dst, "nccl": nccl.version().to_string(), "env": nccl_env()});
    if let Some(p) = placement {
        v["placement"] = json!(p);
    }
    emit(v);
    Ok(())
}

fn nccl_env() -> serde_json::Value {
    let vars: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_"))
        .map(|(k, v)| (k, v.into()))
        .collect();
    vars.into()
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Nccl {
            sizes,
            iters,
            gpus: GpuPair { src, dst },
            label,
            allreduce,
            deadline_s,
        } => {
            let (iters, deadline) = (iters.max(1), Duration::from_secs(deadline_s));
            if src == dst {
                nccl_hosts::run(&nccl_hosts::RankJob {
                    sizes: &sizes,
                    iters,
                    gpu: src,
                    label: &label,
                    allreduce,
                    deadline,
                })
            } else {
                run_nccl(&sizes, iters, src, dst, &label, allreduce, deadline)
            }
        }
        Cmd::NcclRank {
            rank,
            sizes,
            iters,
            gpu,
            label,
            allreduce,
            deadline_s,
        } => nccl_hosts::rank(
            rank,
            &nccl_hosts::RankJob {
                sizes: &sizes,
                iters: iters.max(1),
                gpu,
                label: &label,
                allreduce,
                deadline: Duration::from_secs(deadline_s),
            },
        ),
        Cmd::Pinned { sizes, iters, gpu } => run_pinned(&sizes, iters.max(1), gpu),
        Cmd::Peer {
            sizes,
            iters,
            gpus: GpuPair { src, dst },
            enable_first,
        } => run_peer(&sizes, iters.max(1), src, dst, enable_first),
        Cmd::Unpack {
            sizes,
            min_fragment,
            iters,
            gpu,
        } => unpack::run(&sizes, min_fragment, iters.max(1), gpu),
        Cmd::Tcp {
            streams,
            total,
            chunk,
        } => run_tcp(&streams, &total, &chunk),
        Cmd::Socket {
            sizes,
            socks,
            channels,
            chunk,
            window,
            iters,
            gpus: GpuPair { src, dst },
        } => socket_gpu::run(
            &sizes,
            &socks,
            channels,
            &chunk,
            window,
            iters.max(1),
            src,
            dst,
        ),
    };
    if let Err(e) = r {
        eprintln!("tcpx-gpu-bench: error: {e:#}");
        std::process::exit(1);
    }
}

/// Two ranks in one process: each communicator is made on its own thread, since each rank's
/// init waits for the other.
fn make_comms(
    nccl: &'static Nccl,
    g0: &Device,
    g1: &Device,
    deadline: Duration,
) -> Result<(Comm, Comm)> {
    let id = nccl.unique_id()?;
    let (d0, d1) = (g0.clone(), g1.clone());
    let t0 = std::thread::spawn(move || Comm::init_rank(nccl, &d0, 2, 0, &id, deadline));
    let t1 = std::thread::spawn(move || Comm::init_rank(nccl, &d1, 2, 1, &id, deadline));
    let c0 = t0
        .join()
        .map_err(|_| anyhow::anyhow!("rank 0 init thread panicked"))??;
    let c1 = t1
        .join()
        .map_err(|_| anyhow::anyhow!("rank 1 init thread panicked"))??;
    Ok((c0, c1))
}

/// One ncclSend on rank 0 and the matching ncclRecv on rank 1 in one group; returns once both
/// streams finished.
#[allow(clippy::too_many_arguments)]
fn p2p_once(
    nccl: &Nccl,
    c0: &mut Comm,
    c1: &mut Comm,
    a: &DeviceBuffer,
    b: &DeviceBuffer,
    n: usize,
    s0: &Stream,
    s1: &Stream,
    deadline: Duration,
) -> Result<()> {
    nccl.group(|| {
        c0.send(a, 0, n, 1, s0)?;
        c1.recv(b, 0, n, 0, s1)
    })?;
    c0.wait_ready("ncclSend group", deadline)?;
    c1.wait_ready("ncclRecv group", deadline)?;
    s0.synchronize_within(deadline)?;
    s1.synchronize_within(deadline)?;
    c0.async_error()?;
    c1.async_error()?;
    Ok(())
}

fn run_nccl(
    sizes: &str,
    iters: usize,
    src: usize,
    dst: usize,
    label: &str,
    allreduce: bool,
    deadline: Duration,
) -> Result<()> {
    let sizes = parse_list(sizes)?;
    let Some(&max) = sizes.iter().max() else {
        bail!("no sizes given")
    };
    let nccl = Nccl::load()?;
    let g0 = Device::open(src)?;
    let g1 = Device::open(dst)?;
    eprintln!("{nccl:?}; {g0:?} -> {g1:?}; env {}", nccl_env());
    let (mut c0, mut c1) = make_comms(nccl, &g0, &g1, deadline)?;
    let (s0, s1) = (g0.new_stream()?, g1.new_stream()?);
    let a = g0.alloc(max)?;
    let b = g1.alloc(max)?;
    for (k, &n) in sizes.iter().enumerate() {
        let seed = 0x5eed_0000 + k as u64;
        s0.fill_pattern(&a, 0, n, seed, 0)?;
        s1.fill_pattern(&b, 0, n, seed ^ 0xdead, 0)?; // poison: a missed write is caught
        s0.synchronize()?;
        s1.synchronize()?;
        p2p_once(nccl, &mut c0, &mut c1, &a, &b, n, &s0, &s1, deadline)?; // warm-up / connect
        let mut secs = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            p2p_once(nccl, &mut c0, &mut c1, &a, &b, n, &s0, &s1, deadline)?;
            secs.push(t.elapsed().as_secs_f64());
        }
        let bad = s1.verify_pattern(&b, 0, n, seed, 0)?;
        report_p2p(nccl, label, n, bad, &secs, (src, dst), None)?;
    }
    if allreduce {
        let b0 = g1.alloc(max)?; // rank 1's send buffer
        for &n in &sizes {
            let count = n / 4;
            if count == 0 {
                continue;
            }
            let mut secs = Vec::new();
            for i in 0..=iters {
                let t = Instant::now();
                nccl.group(|| {
                    c0.all_reduce_f32_sum(&a, &a, count, &s0)?;
                    c1.all_reduce_f32_sum(&b0, &b, count, &s1)
                })?;
                c0.wait_ready("ncclAllReduce", deadline)?;
                c1.wait_ready("ncclAllReduce", deadline)?;
                s0.synchronize_within(deadline)?;
                s1.synchronize_within(deadline)?;
                if i > 0 {
                    secs.push(t.elapsed().as_secs_f64());
                }
            }
            let med = median(secs);
            let busbw = allreduce_bus_bandwidth(count * 4, med, 2) / 1e9;
            println!(
                "nccl-allreduce {label:>10} {:>6}  busbw {busbw:7.2} GB/s",
                human(n)
            );
            emit(
                json!({"kind": "nccl_allreduce", "label": label, "bytes": count * 4, "median_s": med,
                "busbw_gbps": busbw, "algbw_gbps": (count * 4) as f64 / med / 1e9, "env": nccl_env()}),
            );
        }
    }
    Ok(())
}

fn run_pinned(sizes: &str, iters: usize, gpu: usize) -> Result<()> {
    let sizes = parse_list(sizes)?;
    let Some(&max) = sizes.iter().max() else {
        bail!("no sizes given")
    };
    let g = Device::open(gpu)?;
    let s = g.new_stream()?;
    let dev = g.alloc(max)?;
    let mut host = g.alloc_pinned(max)?;
    for &n in &sizes {
        s.fill_pattern(&dev, 0, n, 3, 0)?;
        let (mut d2h, mut h2d) = (Vec::new(), Vec::new());
        for i in 0..=iters {
            let e0 = s.record()?;
            s.copy_to_host(&dev, 0, &mut host, 0, n)?;
            let e1 = s.record()?;
            s.copy_to_device(&host, 0, &dev, 0, n)?;
            let e2 = s.record()?;
            if i > 0 {
                d2h.push(e1.elapsed_since(&e0)?.as_secs_f64());
                h2d.push(e2.elapsed_since(&e1)?.as_secs_f64());
            }
        }
        if let Some(at) = tcpx_gpu::verify_pattern(&host.as_slice()?[..n], 3, 0) {
            bail!("pinned copy of {} came back wrong at byte {at}", human(n));
        }
        let (a, b) = (n as f64 / median(d2h) / 1e9, n as f64 / median(h2d) / 1e9);
        println!(
            "pinned GPU{gpu} {:>6}  device->host {a:6.1} GB/s  host->device {b:6.1} GB/s  verified",
            human(n)
        );
        emit(
            json!({"kind": "pinned", "gpu": gpu, "bytes": n, "d2h_gbps": a, "h2d_gbps": b, "verified": true}),
        );
    }
    Ok(())
}

/// One row of [`run_peer`]: median GB/s of `iters` copies of `n` bytes on `stream`, verified.
fn peer_copies(
    stream: &tcpx_gpu::Stream,
    src: &tcpx_gpu::DeviceBuffer,
    dst: &tcpx_gpu::DeviceBuffer,
    dst_stream: &tcpx_gpu::Stream,
    n: usize,
    iters: usize,
) -> Result<f64> {
    dst_stream.fill_pattern(dst, 0, n, 0x5eed, 0)?;
    dst_stream.synchronize()?;
    let mut secs = Vec::new();
    for i in 0..=iters {
        let e0 = stream.record()?;
        stream.copy_device(src, 0, dst, 0, n)?;
        let e1 = stream.record()?;
        e1.wait_within(Duration::from_secs(60))?;
        if i > 0 {
            secs.push(e1.elapsed_since(&e0)?.as_secs_f64());
        }
    }
    let wrong = dst_stream.count_pattern_errors(dst, 0, n, 7, 0)?;
    if wrong != 0 {
        bail!("peer copy of {}: {wrong} bytes arrived wrong", human(n));
    }
    Ok(n as f64 / median(secs) / 1e9)
}

fn run_peer(sizes: &str, iters: usize, src: usize, dst: usize, enable_first: bool) -> Result<()> {
    let sizes = parse_list(sizes)?;
    let Some(&max) = sizes.iter().max() else {
        bail!("no sizes given")
    };
    if src == dst {
        bail!("--src and --dst name the same GPU {src}: a peer copy needs two");
    }
    let (a, b) = (Device::open(src)?, Device::open(dst)?);
    if enable_first {
        b.enable_peer_access(&a)?;
        a.enable_peer_access(&b)?;
    }
    let (sa, sb) = (a.new_stream()?, b.new_stream()?);
    let (from, to) = (a.alloc(max)?, b.alloc(max)?);
    let can = (b.can_access_peer(&a)?, a.can_access_peer(&b)?);
    println!(
        "peer GPU{src} -> GPU{dst}: peer access possible: GPU{dst} reads GPU{src}: {}, GPU{src} writes GPU{dst}: {}",
        can.0, can.1
    );
    for &n in &sizes {
        sa.fill_pattern(&from, 0, n, 7, 0)?;
        sa.synchronize()?;
    }
    // Peer access cannot be taken back cleanly in one process, so the staged rows come first.
    let passes: &[bool] = if enable_first {
        &[true]
    } else {
        &[false, true]
    };
    for &access in passes {
        if access {
            let on = (b.enable_peer_access(&a)?, a.enable_peer_access(&b)?);
            if on != (true, true) {
                println!("peer: no peer route between GPU{src} and GPU{dst}; rows below are staged again");
            }
        }
        for &n in &sizes {
            sa.fill_pattern(&from, 0, n, 7, 0)?;
            sa.synchronize()?;
            let read = peer_copies(&sb, &from, &to, &sb, n, iters)?;
            let write = peer_copies(&sa, &from, &to, &sb, n, iters)?;
            let label = if access {
                "peer access"
            } else {
                "no peer access"
            };
            println!(
                "peer GPU{src} -> GPU{dst} {:>6}  {label:<15} read (GPU{dst} stream) {read:7.1} GB/s  write (GPU{src} stream) {write:7.1} GB/s  verified",
                human(n)
            );
            emit(
                json!({"kind": "peer", "src": src, "dst": dst, "bytes": n, "peer_access": access,
                "read_gbps": read, "write_gbps": write, "verified": true}),
            );
        }
    }
    Ok(())
}

fn run_tcp(streams: &str, total: &str, chunk: &str) -> Result<()> {
    let counts = parse_list(streams)?;
    let total = parse_size(total)?;
    let chunk = parse_size(chunk)?.max(1);
    for &k in &counts {
        let k = k.max(1);
        let per_stream = (total / k).div_ceil(chunk) * chunk;
        let listener = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let start = Arc::new(Barrier::new(2 * k + 1));
        let mut senders = Vec::new();
        for _ in 0..k {
            let start = start.clone();
            let mut s = TcpStream::connect(addr).context("connect over loopback")?;
            s.set_write_timeout(Some(Duration::from_secs(60)))?;
            senders.push(std::thread::spawn(move || -> std::io::Result<()> {
                let buf = vec![0xa5u8; chunk];
                start.wait();
                let mut left = per_stream;
                while left > 0 {
                    let n = left.min(chunk);
                    s.write_all(&buf[..n])?;
                    left -= n;
                }
                Ok(())
            }));
        }
        let mut receivers = Vec::new();
        for _ in 0..k {
            let (mut s, _) = listener.accept()?;
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            let start = start.clone();
            receivers.push(std::thread::spawn(move || -> std::io::Result<usize> {
                let mut buf = vec![0u8; chunk];
                start.wait();
                let mut got = 0;
                while got < per_stream {
                    let n = s.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                Ok(got)
            }));
        }
        start.wait();
        let t = Instant::now();
        let mut moved = 0;
        for r in receivers {
            moved += r
                .join()
                .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
        }
        let secs = t.elapsed().as_secs_f64();
        for s in senders {
            s.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
        }
        if moved != per_stream * k {
            bail!("{k} streams: received {moved} of {} bytes", per_stream * k);
        }
        let gbps = moved as f64 / secs / 1e9;
        println!(
            "tcp loopback {k:>2} streams  {gbps:6.1} GB/s  ({} in {secs:.2} s)",
            human(moved)
        );
        emit(
            json!({"kind": "tcp_loopback", "streams": k, "bytes": moved, "seconds": secs, "gbps": gbps}),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(
            parse_list("1M,4k,2G,7").unwrap(),
            vec![1 << 20, 4096, 2 << 30, 7]
        );
        assert!(parse_size("12Q").is_err());
        assert_eq!(human(256 << 20), "256M");
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
        let r = rates(1_000_000_000, &[2.0, 0.5, 4.0]);
        assert_eq!((r.median_s, r.gbps, r.best_gbps), (2.0, 0.5, 2.0));
    }

    #[test]
    fn tcp_loopback_moves_every_byte() {
        run_tcp("1,3", "3M", "64K").unwrap();
    }
}
