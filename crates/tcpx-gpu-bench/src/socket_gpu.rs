//! `socket`: GPU -> GPU through the socket backend behind `CudaStaging`, in one process (sender
//! thread on GPU `src`, receiver thread on GPU `dst`) over loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tcpx_gpu::Device;
use tcpx_sched::{Assignment, SchedConfig};
use tcpx_transport::cuda_staging::CudaStaging;
use tcpx_transport::driver::{connect_in_process, run_both_sides, Side};
use tcpx_transport::nccl::NcclTransport;
use tcpx_transport::socket::{SocketConfig, SocketTransport};
use tcpx_transport::{Memory, MrId, RecvComm, SendComm, Transport};

use crate::{emit, human, parse_list, parse_size, rates, Rates};

/// A sender and a receiver side, each with `channels` comms and the GPU buffer registered.
pub struct Pair {
    pub send_t: Arc<dyn Transport>,
    pub recv_t: Arc<dyn Transport>,
    pub send: Vec<Box<dyn SendComm>>,
    pub recv: Vec<Box<dyn RecvComm>>,
    pub smr: Vec<MrId>,
    pub rmr: Vec<MrId>,
}

pub fn connect(
    g0: &Device,
    g1: &Device,
    socks: usize,
    channels: usize,
    src: &Arc<tcpx_gpu::DeviceBuffer>,
    dst: &Arc<tcpx_gpu::DeviceBuffer>,
    staging_ring: usize,
) -> Result<Pair> {
    let (send_t, recv_t): (Arc<dyn Transport>, Arc<dyn Transport>) = if socks == 0 {
        // 0 sockets: the `nccl` backend instead (NCCL picks its own transport from its env).
        (
            Arc::new(NcclTransport::new(g0.clone())?),
            Arc::new(NcclTransport::new(g1.clone())?),
        )
    } else {
        let cfg = SocketConfig {
            socks,
            ..SocketConfig::default()
        };
        let staged = |cfg: SocketConfig| -> Result<Arc<dyn Transport>> {
            let inner = Arc::new(SocketTransport::new(cfg)?);
            Ok(Arc::new(
                CudaStaging::new(inner).with_ring(Some(staging_ring)),
            ))
        };
        (staged(cfg.clone())?, staged(cfg)?)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = connect_in_process(&*send_t, &*recv_t, channels, deadline)?;
    let smr = send
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Cuda(Arc::clone(src))))
        .collect::<Result<Vec<_>, _>>()?;
    let rmr = recv
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Cuda(Arc::clone(dst))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Pair {
        send_t,
        recv_t,
        send,
        recv,
        smr,
        rmr,
    })
}

/// Moves `n` bytes from offset 0 of the source buffer to offset 0 of the destination; returns
/// when the last byte is in GPU memory on the receiving side.
pub fn transfer(p: &mut Pair, n: usize, chunk: usize, window: usize, tag: u32) -> Result<()> {
    let channels = p.send.len();
    let cfg = SchedConfig {
        size: n as u64,
        chunk: chunk.min(n).max(1) as u64,
        window,
        channels,
        assignment: Assignment::RoundRobin,
    };
    // A schedule the options make impossible is refused as itself, before either side starts.
    cfg.validate()?;
    let stall = Duration::from_secs(30);
    let Pair {
        send_t,
        recv_t,
        send,
        recv,
        smr,
        rmr,
    } = p;
    let (sent, received) = run_both_sides(
        &cfg,
        tag,
        1,
        Side::new(&**send_t, send, smr, 0),
        Side::new(&**recv_t, recv, rmr, 0),
        stall,
    );
    sent.context("sending")?;
    received.context("receiving")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    sizes: &str,
    socks: &str,
    channels: usize,
    chunk: &str,
    window: usize,
    iters: usize,
    src: usize,
    dst: usize,
) -> Result<()> {
    let sizes = parse_list(sizes)?;
    let socks = parse_list(socks)?;
    let chunk = parse_size(chunk)?;
    let Some(&max) = sizes.iter().max() else {
        bail!("no sizes given")
    };
    if src == dst && socks.contains(&0) {
        // Both ranks of one process on one GPU are one NCCL host: NCCL refuses them.
        bail!(
            "--socks 0 (the nccl backend) with --src = --dst = {src}: NCCL refuses two ranks on \
             one GPU within one process; on one GPU use `tcpx-run bench --transport nccl --memory \
             cuda`, which runs the sides as 2 NCCL hosts, a process each"
        );
    }
    // The tool's default staging: the model's ring for the largest message's chunk.
    let staging_ring =
        tcpx_model::auto_staging_ring(chunk.min(max) as u64, Some(max as u64)) as usize;
    let g0 = Device::open(src)?;
    let g1 = Device::open(dst)?;
    let a = Arc::new(g0.alloc(max)?);
    let b = Arc::new(g1.alloc(max)?);
    let (s0, s1) = (g0.new_stream()?, g1.new_stream()?);
    for &k in &socks {
        let mut pair = connect(&g0, &g1, k, channels.max(1), &a, &b, staging_ring)?;
        for (i, &n) in sizes.iter().enumerate() {
            let seed = 0x50c0_0000 + i as u64 * 31 + k as u64;
            s0.fill_pattern(&a, 0, n, seed, 0)?;
            s1.fill_pattern(&b, 0, n, !seed, 0)?; // poison
            s0.synchronize()?;
            s1.synchronize()?;
            transfer(&mut pair, n, chunk, window, 0)?; // warm-up
            let mut secs = Vec::new();
            for it in 0..iters {
                let t = Instant::now();
                transfer(&mut pair, n, chunk, window, 1 + it as u32)?;
                secs.push(t.elapsed().as_secs_f64());
            }
            if let Some(at) = s1.verify_pattern(&b, 0, n, seed, 0)? {
                bail!(
                    "socket backend, {k} socket(s): {} message arrived wrong at byte {at}",
                    human(n)
                );
            }
            let Rates {
                median_s,
                gbps,
                best_gbps,
            } = rates(n, &secs);
            let backend = if k == 0 {
                "nccl-transport"
            } else {
                "socket-gpu"
            };
            println!(
                "{backend} {channels}ch x {k:>2} socks {:>6}  {gbps:7.2} GB/s (best {best_gbps:.2})  chunk {} window {window}  staging ring {}  verified",
                human(n),
                human(chunk.min(n)),
                human(staging_ring)
            );
            emit(
                json!({"kind": if k == 0 { "nccl_transport_gpu" } else { "socket_gpu" }, "channels": channels, "socks": k, "bytes": n,
                "chunk": chunk.min(n), "window": window, "iters": iters, "median_s": median_s, "gbps": gbps,
                "best_gbps": best_gbps, "verified": true, "src": src, "dst": dst, "staging_ring": staging_ring}),
            );
        }
    }
    Ok(())
}
