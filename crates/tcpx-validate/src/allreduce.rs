//! The all-reduce arm of a validation: one process, two NCCL ranks (one per GPU, each
//! communicator made on its own thread since each rank's init waits for the other), f32 sum
//! all-reduce at every size, bus bandwidth by nccl-tests' formula, the result checked once on
//! the host (1 + 2 = 3 in every element checked). NCCL reads its environment once per process,
//! so the caller starts one such process per repetition and arm, and reads its [`ChildOutcome`]
//! (one JSON document on stdout).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tcpx_ffi::nccl::{allreduce_bus_bandwidth, Comm, Nccl};
use tcpx_gpu::{Device, DeviceBuffer, Stream};

use super::error::{chain, During, MeasureError};
use super::ValidateConfig;

/// One size of one all-reduce process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllReduceRow {
    /// Bytes reduced per rank (the size rounded down to whole f32 values).
    pub size: u64,
    pub iters: u32,
    /// Median over the timed iterations.
    pub median_s: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
}

/// What an all-reduce process prints: one JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ChildOutcome {
    Measured {
        /// libnccl's version and path.
        nccl: String,
        rows: Vec<AllReduceRow>,
    },
    Failed {
        error: String,
    },
}

impl ChildOutcome {
    /// `(size, busbw GB/s)` of every row, or the child's error.
    pub fn figures(&self) -> Result<Vec<(u64, f64)>, String> {
        match self {
            ChildOutcome::Measured { rows, .. } => {
                Ok(rows.iter().map(|r| (r.size, r.busbw_gbs)).collect())
            }
            ChildOutcome::Failed { error } => Err(error.clone()),
        }
    }
}

/// Elements checked on the host after the timed runs.
const CHECKED: usize = 1 << 18;

fn once(
    nccl: &Nccl,
    comms: &mut [Comm; 2],
    bufs: [&DeviceBuffer; 2],
    streams: [&Stream; 2],
    count: usize,
    deadline: Duration,
) -> Result<(), MeasureError> {
    let [c0, c1] = comms;
    nccl.group(|| {
        c0.all_reduce_f32_sum(bufs[0], bufs[0], count, streams[0])?;
        c1.all_reduce_f32_sum(bufs[1], bufs[1], count, streams[1])
    })?;
    for (c, s) in [(&mut *c0, streams[0]), (&mut *c1, streams[1])] {
        c.wait_ready("ncclAllReduce", deadline)?;
        s.synchronize_within(deadline)?;
        c.async_error()?;
    }
    Ok(())
}

/// Runs the all-reduce on `cfg.send_gpu` and `cfg.recv_gpu` at every size: `cfg.warmup`
/// untimed then `cfg.iters` timed iterations; every wait bounded by `deadline`.
pub fn measure(
    cfg: &ValidateConfig,
    deadline: Duration,
) -> Result<(String, Vec<AllReduceRow>), MeasureError> {
    let nccl = Nccl::load().during(|| "loading libnccl")?;
    let g = [Device::open(cfg.send_gpu)?, Device::open(cfg.recv_gpu)?];
    let id = nccl.unique_id()?;
    let init = |rank: usize| {
        let d = g[rank].clone();
        std::thread::spawn(move || Comm::init_rank(nccl, &d, 2, rank, &id, deadline))
    };
    let (t0, t1) = (init(0), init(1));
    let join = |t: std::thread::JoinHandle<_>| t.join().map_err(|_| MeasureError::InitPanicked);
    let mut comms = [join(t0)??, join(t1)??];
    let max = cfg.sizes.iter().copied().max().unwrap_or(0).max(4) as usize;
    let bufs = [g[0].alloc(max)?, g[1].alloc(max)?];
    let streams = [g[0].new_stream()?, g[1].new_stream()?];
    let mut rows = Vec::new();
    for &size in &cfg.sizes {
        let count = size as usize / 4;
        if count == 0 {
            continue;
        }
        let mut secs = Vec::with_capacity(cfg.iters as usize);
        for i in 0..cfg.warmup + cfg.iters {
            let t = Instant::now();
            once(
                nccl,
                &mut comms,
                [&bufs[0], &bufs[1]],
                [&streams[0], &streams[1]],
                count,
                deadline,
            )?;
            if i >= cfg.warmup {
                secs.push(t.elapsed().as_secs_f64());
            }
        }
        secs.sort_by(f64::total_cmp);
        let median_s = tcpx_report::stats::median(&secs).unwrap_or(f64::NAN);
        let bytes = count * 4;
        rows.push(AllReduceRow {
            size: bytes as u64,
            iters: cfg.iters,
            median_s,
            algbw_gbs: bytes as f64 / median_s / 1e9,
            busbw_gbs: allreduce_bus_bandwidth(bytes, median_s, 2) / 1e9,
        });
    }
    // The sum arrived: rank 0 holds 1.0, rank 1 holds 2.0, both must read 3.0.
    let k = CHECKED.min(max / 4);
    for (buf, v) in bufs.iter().zip([1.0f32, 2.0]) {
        let bytes: Vec<u8> = std::iter::repeat_n(v.to_ne_bytes(), k).flatten().collect();
        buf.write_from_host(0, &bytes)?;
    }
    // The copies from pageable memory may still be landing; the streams are non-blocking.
    for d in &g {
        d.synchronize()?;
    }
    once(
        nccl,
        &mut comms,
        [&bufs[0], &bufs[1]],
        [&streams[0], &streams[1]],
        k,
        deadline,
    )?;
    for (rank, buf) in bufs.iter().enumerate() {
        let mut back = vec![0u8; k * 4];
        buf.read_to_host(0, &mut back)?;
        if let Some(i) = back
            .chunks_exact(4)
            .position(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != 3.0)
        {
            return Err(MeasureError::WrongData(format!(
                "ncclAllReduce summed wrong on rank {rank}: element {i} is not 1 + 2"
            )));
        }
    }
    Ok((
        format!("libnccl {} ({})", nccl.version(), nccl.path()),
        rows,
    ))
}

/// The child's whole work: [`measure`] as a [`ChildOutcome`].
pub fn child(cfg: &ValidateConfig, deadline: Duration) -> ChildOutcome {
    match measure(cfg, deadline) {
        Ok((nccl, rows)) => ChildOutcome::Measured { nccl, rows },
        Err(e) => ChildOutcome::Failed { error: chain(&e) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_document_round_trips_and_gives_its_figures() {
        let m = ChildOutcome::Measured {
            nccl: "libnccl 2.28.3 (/usr/lib/libnccl.so.2)".into(),
            rows: vec![AllReduceRow {
                size: 1 << 20,
                iters: 5,
                median_s: 0.001,
                algbw_gbs: 1.048576,
                busbw_gbs: 1.048576,
            }],
        };
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.starts_with(r#"{"status":"measured""#), "{text}");
        let back: ChildOutcome = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.figures().unwrap(), vec![(1 << 20, 1.048576)]);
        let f: ChildOutcome =
            serde_json::from_str(r#"{"status":"failed","error":"ncclCommInitRank: timeout"}"#)
                .unwrap();
        assert_eq!(f.figures().unwrap_err(), "ncclCommInitRank: timeout");
    }

    #[test]
    fn without_libnccl_or_gpus_the_child_fails_with_the_reason() {
        // CI has neither; on a GPU machine with libnccl this measures for real (tiny size).
        let cfg = ValidateConfig {
            sizes: vec![4096],
            reps: 1,
            iters: 1,
            warmup: 0,
            send_gpu: 0,
            recv_gpu: 1,
        };
        match child(&cfg, Duration::from_secs(60)) {
            ChildOutcome::Failed { error } => assert!(!error.is_empty()),
            ChildOutcome::Measured { rows, .. } => {
                assert_eq!(rows.len(), 1);
                assert!(rows[0].busbw_gbs.is_finite() && rows[0].busbw_gbs > 0.0);
            }
        }
    }
}
