//! NCCL on real GPUs through `tcpx_ffi::nccl`: send/recv byte-exact, all-reduce sums, and the
//! failure paths (a rank that never comes, a bad peer) end in errors within their deadlines.
//! The two ranks run on GPU 0 as 2 NCCL hosts, each a process of its own (`nccl_ranks`), so one
//! GPU is enough. Without a GPU and libnccl these print `SKIP:`; `cargo xtask gpu-test` runs them
//! with `TCPX_REQUIRE_GPU=1` and NCCL forced onto NET/Socket over loopback.

use std::time::{Duration, Instant};

mod nccl_ranks;
use nccl_ranks::{done, run_pair, this_rank};

use tcpx_ffi::nccl::{Comm, Nccl, NcclError};
use tcpx_gpu::testing::{gpus_or_skip, skip};
use tcpx_gpu::Device;

fn nccl_or_skip(test: &str) -> Option<&'static Nccl> {
    match Nccl::load() {
        Ok(n) => Some(n),
        Err(e) => {
            skip(test, &format!("libnccl unavailable: {e}"));
            None
        }
    }
}

/// This rank process's communicator on GPU 0 (NCCL_COMM_ID from the parent names the root).
fn comm(nccl: &'static Nccl, g: &Device, rank: usize) -> Comm {
    let id = nccl.unique_id().unwrap();
    Comm::init_rank(nccl, g, 2, rank, &id, Duration::from_secs(60)).unwrap()
}

/// This process's part of the two-rank test `test`: its rank, the GPUs, NCCL, its communicator on
/// GPU 0 and a stream. `None` when the test is skipped (no GPU or no libnccl), or in the parent
/// process, which has run both ranks as child processes within `limit` (`run_pair`).
fn rank_or_run_pair(
    test: &str,
    limit: Duration,
) -> Option<(usize, Vec<Device>, &'static Nccl, Comm, tcpx_gpu::Stream)> {
    let g = gpus_or_skip(test, 1)?;
    let nccl = nccl_or_skip(test)?;
    let Some(rank) = this_rank() else {
        run_pair(test, limit);
        return None;
    };
    let c = comm(nccl, &g[0], rank);
    let s = g[0].new_stream().unwrap();
    Some((rank, g, nccl, c, s))
}

/// Bounded wait for one rank's operations: queued, then finished on its stream.
fn finish(c: &mut Comm, s: &tcpx_gpu::Stream, what: &'static str) {
    c.wait_ready(what, Duration::from_secs(60)).unwrap();
    s.synchronize_within(Duration::from_secs(60)).unwrap();
    c.async_error().unwrap();
}

/// Neither rank closes before the other is done: a one-element all-reduce.
fn barrier(c: &mut Comm, g: &Device, s: &tcpx_gpu::Stream) {
    let f = g.alloc(4).unwrap();
    c.all_reduce_f32_sum(&f, &f, 1, s).unwrap();
    finish(c, s, "barrier");
}

#[test]
fn gpu_nccl_send_recv_is_byte_exact() {
    const T: &str = "gpu_nccl_send_recv_is_byte_exact";
    let Some((rank, g, nccl, mut c, s)) = rank_or_run_pair(T, Duration::from_secs(240)) else {
        return;
    };
    eprintln!("{nccl:?}, rank {rank}");
    let cap = 16 << 20;
    let buf = g[0].alloc(cap).unwrap();
    // Odd sizes and offsets: a lost, duplicated or shifted byte shows.
    for (i, (src_off, dst_off, n)) in [
        (0usize, 0usize, 1usize),
        (5, 4097, 4099),
        (0, 3, (8 << 20) + 3),
        (64, 0, cap - 64),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 100 + i as u64;
        if rank == 0 {
            s.fill_pattern(&buf, src_off, n, seed, 0).unwrap();
            s.synchronize().unwrap();
            nccl.group(|| c.send(&buf, src_off, n, 1, &s)).unwrap();
            finish(&mut c, &s, "send");
        } else {
            s.fill_pattern(&buf, 0, cap, 999, 0).unwrap(); // poison
            s.synchronize().unwrap();
            nccl.group(|| c.recv(&buf, dst_off, n, 0, &s)).unwrap();
            finish(&mut c, &s, "recv");
            assert_eq!(
                s.verify_pattern(&buf, dst_off, n, seed, 0).unwrap(),
                None,
                "{n} bytes at {dst_off}"
            );
            if dst_off > 0 {
                // Bytes before the target range are untouched (still the poison).
                assert_eq!(s.verify_pattern(&buf, 0, dst_off, 999, 0).unwrap(), None);
            }
        }
        // The next case's poison must not overwrite bytes still arriving: both ranks finish
        // each case before the next.
        barrier(&mut c, &g[0], &s);
    }
    // Out-of-range requests are refused before NCCL sees them.
    assert!(matches!(
        c.send(&buf, 1, cap, 1 - rank, &s),
        Err(NcclError::Gpu(_))
    ));
    done(rank);
}

#[test]
fn gpu_nccl_allreduce_sums_across_ranks() {
    const T: &str = "gpu_nccl_allreduce_sums_across_ranks";
    let Some((rank, g, nccl, mut c, s)) = rank_or_run_pair(T, Duration::from_secs(240)) else {
        return;
    };
    let count = (1 << 20) + 7;
    let vals: Vec<u8> = (0..count)
        .flat_map(|i| (((i % 1000) as f32) * (rank as f32 + 1.0)).to_le_bytes())
        .collect();
    let (x, y) = (
        g[0].alloc(count * 4).unwrap(),
        g[0].alloc(count * 4).unwrap(),
    );
    x.write_from_host(0, &vals).unwrap();
    g[0].synchronize().unwrap();
    nccl.group(|| c.all_reduce_f32_sum(&x, &y, count, &s))
        .unwrap();
    finish(&mut c, &s, "allreduce");
    let mut out = vec![0u8; count * 4];
    y.read_to_host(0, &mut out).unwrap();
    for (i, b) in out.chunks_exact(4).enumerate() {
        let got = f32::from_le_bytes(b.try_into().unwrap());
        assert_eq!(got, ((i % 1000) as f32) * 3.0, "element {i} on rank {rank}");
    }
    barrier(&mut c, &g[0], &s);
    done(rank);
}

#[test]
fn gpu_nccl_rank_that_never_joins_times_out() {
    const T: &str = "gpu_nccl_rank_that_never_joins_times_out";
    let Some(g) = gpus_or_skip(T, 1) else { return };
    let Some(nccl) = nccl_or_skip(T) else { return };
    let id = nccl.unique_id().unwrap();
    let t = Instant::now();
    match Comm::init_rank(nccl, &g[0], 2, 0, &id, Duration::from_secs(3)) {
        Err(NcclError::Timeout { .. }) => {}
        Err(e) => {
            eprintln!("init without a peer failed early instead of timing out (also fine): {e}")
        }
        Ok(_) => panic!("a 2-rank communicator formed with only one rank"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the deadline held: {:?}",
        t.elapsed()
    );
    assert!(matches!(
        Comm::init_rank(nccl, &g[0], 2, 2, &id, Duration::from_secs(1)),
        Err(NcclError::Argument(_))
    ));
}

#[test]
fn gpu_nccl_bad_peer_names_the_nccl_result() {
    const T: &str = "gpu_nccl_bad_peer_names_the_nccl_result";
    let Some((rank, g, nccl, mut c, s)) = rank_or_run_pair(T, Duration::from_secs(120)) else {
        return;
    };
    if rank == 0 {
        let a = g[0].alloc(4096).unwrap();
        // Peer 7 does not exist in a 2-rank communicator: NCCL refuses it, by name.
        let r = nccl
            .group(|| c.send(&a, 0, 4096, 7, &s))
            .and_then(|_| c.wait_ready("send", Duration::from_secs(10)));
        match r {
            Err(e @ NcclError::Call { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("ncclInvalidArgument") || msg.contains("ncclInvalidUsage"),
                    "{msg}"
                );
                eprintln!("as expected: {msg}");
            }
            other => panic!("send to a nonexistent peer gave {other:?}"),
        }
    }
    done(rank);
}
