//! NCCL on real GPUs through `tcpx_ffi::nccl`: GPU0 -> GPU1 byte-exact, all-reduce sums, and the
//! failure paths (a rank that never comes, a bad peer) end in errors within their deadlines.
//! Without two GPUs and libnccl these print `SKIP:`; `cargo xtask gpu-test` runs them with
//! `TCPX_REQUIRE_GPU=1` and NCCL forced onto NET/Socket over loopback.

use std::time::{Duration, Instant};

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

fn comms(nccl: &'static Nccl, g: &[Device]) -> (Comm, Comm) {
    let id = nccl.unique_id().unwrap();
    let (d0, d1) = (g[0].clone(), g[1].clone());
    let limit = Duration::from_secs(60);
    let t0 = std::thread::spawn(move || Comm::init_rank(nccl, &d0, 2, 0, &id, limit));
    let t1 = std::thread::spawn(move || Comm::init_rank(nccl, &d1, 2, 1, &id, limit));
    (t0.join().unwrap().unwrap(), t1.join().unwrap().unwrap())
}

#[test]
fn gpu_nccl_send_recv_is_byte_exact() {
    const T: &str = "gpu_nccl_send_recv_is_byte_exact";
    let Some(g) = gpus_or_skip(T, 2) else { return };
    let Some(nccl) = nccl_or_skip(T) else { return };
    eprintln!("{nccl:?}");
    let (mut c0, mut c1) = comms(nccl, &g);
    let (s0, s1) = (g[0].new_stream().unwrap(), g[1].new_stream().unwrap());
    let cap = 16 << 20;
    let (a, b) = (g[0].alloc(cap).unwrap(), g[1].alloc(cap).unwrap());
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
        s0.fill_pattern(&a, src_off, n, seed, 0).unwrap();
        s1.fill_pattern(&b, 0, cap, 999, 0).unwrap(); // poison
        s0.synchronize().unwrap();
        s1.synchronize().unwrap();
        nccl.group(|| {
            c0.send(&a, src_off, n, 1, &s0)?;
            c1.recv(&b, dst_off, n, 0, &s1)
        })
        .unwrap();
        c0.wait_ready("send", Duration::from_secs(60)).unwrap();
        c1.wait_ready("recv", Duration::from_secs(60)).unwrap();
        s0.synchronize().unwrap();
        assert_eq!(
            s1.verify_pattern(&b, dst_off, n, seed, 0).unwrap(),
            None,
            "{n} bytes at {dst_off}"
        );
        if dst_off > 0 {
            // Bytes before the target range are untouched (still the poison).
            assert_eq!(s1.verify_pattern(&b, 0, dst_off, 999, 0).unwrap(), None);
        }
        c0.async_error().unwrap();
        c1.async_error().unwrap();
    }
    // Out-of-range requests are refused before NCCL sees them.
    assert!(matches!(
        c0.send(&a, 1, cap, 1, &s0),
        Err(NcclError::Gpu(_))
    ));
    assert!(matches!(
        c0.send(&b, 0, 8, 1, &s0),
        Err(NcclError::Argument(_))
    ));
}

#[test]
fn gpu_nccl_allreduce_sums_across_gpus() {
    const T: &str = "gpu_nccl_allreduce_sums_across_gpus";
    let Some(g) = gpus_or_skip(T, 2) else { return };
    let Some(nccl) = nccl_or_skip(T) else { return };
    let (mut c0, mut c1) = comms(nccl, &g);
    let (s0, s1) = (g[0].new_stream().unwrap(), g[1].new_stream().unwrap());
    let count = (1 << 20) + 7;
    let vals = |r: usize| -> Vec<u8> {
        (0..count)
            .flat_map(|i| (((i % 1000) as f32) * (r as f32 + 1.0)).to_le_bytes())
            .collect()
    };
    let (x0, x1) = (
        g[0].alloc(count * 4).unwrap(),
        g[1].alloc(count * 4).unwrap(),
    );
    let (y0, y1) = (
        g[0].alloc(count * 4).unwrap(),
        g[1].alloc(count * 4).unwrap(),
    );
    x0.write_from_host(0, &vals(0)).unwrap();
    x1.write_from_host(0, &vals(1)).unwrap();
    nccl.group(|| {
        c0.all_reduce_f32_sum(&x0, &y0, count, &s0)?;
        c1.all_reduce_f32_sum(&x1, &y1, count, &s1)
    })
    .unwrap();
    c0.wait_ready("allreduce", Duration::from_secs(60)).unwrap();
    c1.wait_ready("allreduce", Duration::from_secs(60)).unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    for y in [&y0, &y1] {
        let mut out = vec![0u8; count * 4];
        y.read_to_host(0, &mut out).unwrap();
        for (i, c) in out.chunks_exact(4).enumerate() {
            let got = f32::from_le_bytes(c.try_into().unwrap());
            assert_eq!(
                got,
                ((i % 1000) as f32) * 3.0,
                "element {i} on GPU {}",
                y.device().index()
            );
        }
    }
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
    let Some(g) = gpus_or_skip(T, 2) else { return };
    let Some(nccl) = nccl_or_skip(T) else { return };
    let (mut c0, _c1) = comms(nccl, &g);
    let s0 = g[0].new_stream().unwrap();
    let a = g[0].alloc(4096).unwrap();
    // Peer 7 does not exist in a 2-rank communicator: NCCL refuses it, by name.
    let r = nccl
        .group(|| c0.send(&a, 0, 4096, 7, &s0))
        .and_then(|_| c0.wait_ready("send", Duration::from_secs(10)));
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
