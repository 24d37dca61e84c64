//! One NCCL rank of a validation run in its own process: what validate starts twice per run when
//! both ranks share one GPU ([`super::Placement::SharedGpu`]). NCCL refuses two ranks on one GPU
//! only when their host hashes match; the parent gives each rank process its own `NCCL_HOSTID`,
//! so NCCL sees two nodes and carries the bytes over its network transport (NET/Socket, or a net
//! plugin). Both processes find each other through `NCCL_COMM_ID` (the parent picks the
//! address): with it set, `ncclGetUniqueId` returns the same id in both, and rank 0 runs the
//! bootstrap root. Send/recv: rank 0 sends, rank 1 receives; busbw = bytes / median time
//! (nccl-tests' sendrecv). All-reduce: f32 sum, nccl-tests' busbw. Checked once at the end (the
//! received bytes, 1 + 2 = 3). The receiver's (rank 1's) [`ChildOutcome`] is the run's figure.
//!
//! [`init_comm`] and [`step`] are the one NCCL rank runner: tcpx-gpu-bench's one-GPU NCCL ranks
//! meet and move bytes through them too.

use std::time::{Duration, Instant};

use tcpx_ffi::nccl::{allreduce_bus_bandwidth, Comm, Nccl};
use tcpx_gpu::{Device, DeviceBuffer, Stream};

use super::allreduce::{AllReduceRow, ChildOutcome};
use super::error::{chain, During, MeasureError};
use super::{Collective, ValidateConfig};

/// Bytes checked after the timed runs.
const CHECKED: usize = 1 << 20;

/// Rank `rank` of a two-rank communicator on `dev`, meeting the other rank's process at the
/// `NCCL_COMM_ID` both inherited (each with its own `NCCL_HOSTID` when they share the GPU).
pub fn init_comm(
    nccl: &'static Nccl,
    dev: &Device,
    rank: usize,
    deadline: Duration,
) -> Result<Comm, MeasureError> {
    let id = nccl
        .unique_id()
        .during(|| "ncclGetUniqueId (NCCL_COMM_ID names the rendezvous address)")?;
    Comm::init_rank(nccl, dev, 2, rank, &id, deadline).during(|| {
        format!(
            "rank {rank}: ncclCommInitRank (the other rank's process, NCCL_COMM_ID, NCCL_HOSTID)"
        )
    })
}

/// One `collective` of `bytes` on `comm` (send/recv: rank 0 sends; all-reduce: an in-place f32
/// sum), waited for: enqueued, the stream done, no asynchronous error; every wait bounded by
/// `deadline`.
pub fn step(
    nccl: &Nccl,
    comm: &mut Comm,
    collective: Collective,
    buf: &DeviceBuffer,
    stream: &Stream,
    bytes: usize,
    deadline: Duration,
) -> Result<(), MeasureError> {
    let rank = comm.rank();
    match collective {
        Collective::SendRecv => nccl.group(|| {
            if rank == 0 {
                comm.send(buf, 0, bytes, 1, stream)
            } else {
                comm.recv(buf, 0, bytes, 0, stream)
            }
        })?,
        Collective::AllReduce => comm.all_reduce_f32_sum(buf, buf, bytes / 4, stream)?,
    }
    comm.wait_ready("ncclSend/ncclRecv/ncclAllReduce", deadline)?;
    stream.synchronize_within(deadline)?;
    comm.async_error()?;
    Ok(())
}

/// The byte rank 0 sends at offset `i` in the check.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Runs rank `rank` (0 or 1) of `collective` on GPU `cfg.send_gpu` at every size: `cfg.warmup`
/// untimed then `cfg.iters` timed iterations; every wait bounded by `deadline`.
pub fn measure(
    cfg: &ValidateConfig,
    collective: Collective,
    rank: usize,
    deadline: Duration,
) -> Result<(String, Vec<AllReduceRow>), MeasureError> {
    if rank >= 2 {
        return Err(MeasureError::NoSuchRank(rank));
    }
    let nccl = Nccl::load().during(|| "loading libnccl")?;
    let dev = Device::open(cfg.send_gpu)?;
    let mut comm = init_comm(nccl, &dev, rank, deadline)?;
    let max = cfg.sizes.iter().copied().max().unwrap_or(0).max(4) as usize;
    let buf = dev.alloc(max)?;
    let stream = dev.new_stream()?;
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let bytes = match collective {
            Collective::SendRecv => size as usize,
            Collective::AllReduce => size as usize / 4 * 4,
        };
        if bytes == 0 {
            continue;
        }
        let mut secs = Vec::with_capacity(cfg.iters as usize);
        for i in 0..cfg.warmup + cfg.iters {
            let t = Instant::now();
            step(nccl, &mut comm, collective, &buf, &stream, bytes, deadline)
                .during(|| format!("rank {rank}, {bytes} B, iteration {i}"))?;
            if i >= cfg.warmup {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        secs.sort_by(f64::total_cmp);
        let median_s = tcpx_report::stats::median(&secs).unwrap_or(f64::NAN);
        let algbw = bytes as f64 / median_s;
        rows.push(AllReduceRow {
            size: bytes as u64,
            iters: cfg.iters,
            median_s,
            algbw_gbs: algbw / 1e9,
            busbw_gbs: match collective {
                Collective::SendRecv => algbw / 1e9,
                Collective::AllReduce => allreduce_bus_bandwidth(bytes, median_s, 2) / 1e9,
            },
        });
    }
    // What arrived is checked: the received bytes (send/recv), 1 + 2 = 3 (all-reduce).
    let k = CHECKED.min(max) / 4 * 4;
    let fill: Vec<u8> = match collective {
        Collective::SendRecv => (0..k).map(pattern).collect(),
        Collective::AllReduce => std::iter::repeat_n((rank as f32 + 1.0).to_ne_bytes(), k / 4)
            .flatten()
            .collect(),
    };
    if collective == Collective::AllReduce || rank == 0 {
        buf.write_from_host(0, &fill)?;
    } else {
        buf.write_from_host(0, &vec![0u8; k])?;
    }
    // A copy from pageable memory may still be on its way when cuMemcpyHtoD returns, and NCCL's
    // non-blocking stream does not wait for it: without this the check raced the copy (seen on
    // the GPU machine with libnccl 2.28.9: every byte still 0).
    dev.synchronize()?;
    step(nccl, &mut comm, collective, &buf, &stream, k, deadline).during(|| "the checked run")?;
    if collective == Collective::AllReduce || rank == 1 {
        let mut back = vec![0u8; k];
        buf.read_to_host(0, &mut back)?;
        match collective {
            Collective::SendRecv => {
                let wrong = (0..k).filter(|&i| back[i] != pattern(i)).count();
                if let Some(i) = (0..k).find(|&i| back[i] != pattern(i)) {
                    let zeros = back.iter().filter(|&&b| b == 0).count();
                    return Err(MeasureError::WrongData(format!(
                        "ncclRecv delivered {wrong} wrong bytes of {k} checked, the first at \
                         offset {i} (got {}, sent {}; {zeros} bytes still 0 as before the \
                         receive): the received data did not land in the buffer",
                        back[i],
                        pattern(i)
                    )));
                }
            }
            Collective::AllReduce => {
                if let Some(i) = back
                    .chunks_exact(4)
                    .position(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != 3.0)
                {
                    return Err(MeasureError::WrongData(format!(
                        "ncclAllReduce summed wrong on rank {rank}: element {i} is not 1 + 2"
                    )));
                }
            }
        }
    }
    // Neither rank closes its connections before the other is done: a sender that exits as soon
    // as its last send is handed to the network cut GPUDirect-TCPX's receiver short ("Connection
    // closed by remote peer"). A one-element all-reduce finishes only once both are in it.
    let flag = dev.alloc(4)?;
    step(
        nccl,
        &mut comm,
        Collective::AllReduce,
        &flag,
        &stream,
        4,
        deadline,
    )
    .during(|| "the closing barrier (a one-element all-reduce)")?;
    Ok((
        format!("libnccl {} ({})", nccl.version(), nccl.path()),
        rows,
    ))
}

/// The rank process's whole work: [`measure`] as a [`ChildOutcome`].
pub fn child(
    cfg: &ValidateConfig,
    collective: Collective,
    rank: usize,
    deadline: Duration,
) -> ChildOutcome {
    match measure(cfg, collective, rank, deadline) {
        Ok((nccl, rows)) => ChildOutcome::Measured { nccl, rows },
        Err(e) => ChildOutcome::Failed { error: chain(&e) },
    }
}
