//! `tcpx-bench` experiments with `--memory cuda`: the tool's own driver (control protocol,
//! barriers, verification) moving GPU memory through the socket backend (pinned staging) and
//! through the `nccl` backend, every byte checked on the GPU. The socket case needs 2 GPUs; the
//! nccl case runs on GPU 0 as 2 NCCL hosts, server and client each a process of its own
//! (`nccl_ranks`), and needs libnccl. Prints `SKIP:` without.

use std::time::{Duration, Instant};

use tcpx_bench::{run_client, run_local, run_server, Barrier, Experiment, Measurement};
use tcpx_gpu::testing::{gpus_or_skip, skip};

mod nccl_ranks;
use nccl_ranks::{done, finish, start, this_rank, HANDLES, HANDLES_ENV};

fn experiment(transport: &str) -> Experiment {
    Experiment {
        name: format!("gpu-{transport}"),
        transport: transport.parse().unwrap(),
        memory: "cuda:0,1".parse().unwrap(),
        sizes: vec![(4 << 20) + 4096, 16 << 20],
        iters: 2,
        warmup: 1,
        flows: 1,
        channels: 2,
        socks_per_channel: 2,
        chunk: Some(1 << 20),
        window: Some(4),
        timeout_s: 30.0,
        ..Experiment::default()
    }
}

fn check(exp: &Experiment) {
    let out = run_local(
        exp,
        "127.0.0.1:0".parse().unwrap(),
        &mut |_: &Measurement| {},
    )
    .unwrap();
    assert_eq!(out.measurements.len(), exp.sizes.len());
    for m in &out.measurements {
        assert_eq!(
            m.recv.wrong_bytes,
            Some(0),
            "{}: {} bytes",
            exp.name,
            m.size
        );
        assert!(m.recv.algbw_gbs > 0.0);
    }
}

#[test]
fn gpu_bench_socket_backend_with_gpu_memory_is_byte_exact() {
    if gpus_or_skip("gpu_bench_socket_backend_with_gpu_memory_is_byte_exact", 2).is_none() {
        return;
    }
    check(&experiment("socket"));
}

/// The socket backend staging through a 3 MiB ring per channel, smaller than the messages and
/// than a channel's window of chunks, with a barrier per iteration and back to back.
#[test]
fn gpu_bench_socket_backend_through_a_staging_ring_is_byte_exact() {
    let Some(g) = gpus_or_skip(
        "gpu_bench_socket_backend_through_a_staging_ring_is_byte_exact",
        1,
    ) else {
        return;
    };
    let dst = if g.len() > 1 { 1 } else { 0 };
    for barrier in [Barrier::Iteration, Barrier::Size] {
        check(&Experiment {
            name: format!("gpu-socket-ring-{barrier}"),
            memory: format!("cuda:0,{dst}").parse().unwrap(),
            staging_ring: Some(3 << 20),
            barrier,
            ..experiment("socket")
        });
    }
}

#[test]
fn gpu_bench_nccl_backend_with_gpu_memory_is_byte_exact() {
    const T: &str = "gpu_bench_nccl_backend_with_gpu_memory_is_byte_exact";
    if gpus_or_skip(T, 1).is_none() {
        return;
    }
    if let Err(e) = tcpx_ffi::nccl::Nccl::load() {
        return skip(T, &format!("libnccl unavailable: {e}"));
    }
    let exp = Experiment {
        channels: 1,
        memory: "cuda:0,0".parse().unwrap(),
        ..experiment("nccl")
    };
    match this_rank() {
        None => {
            // The server (rank 0, the nccl listener) says its control port; the client follows.
            let mut server = start(T, 0, &[]);
            let deadline = Instant::now() + Duration::from_secs(60);
            let Some(port) = server.line(HANDLES, deadline) else {
                finish(vec![server], Duration::from_secs(5));
                panic!("the server printed no control port within 60 s");
            };
            let client = start(T, 1, &[(HANDLES_ENV, port)]);
            finish(vec![server, client], Duration::from_secs(180));
        }
        Some(0) => {
            let listener = tcpx_bench::bind_control("127.0.0.1:0".parse().unwrap()).unwrap();
            println!("{HANDLES} {}", listener.local_addr().unwrap().port());
            let out = run_server(&exp, listener, &mut |_: &Measurement| {}).unwrap();
            assert_eq!(out.measurements.len(), exp.sizes.len());
            for m in &out.measurements {
                assert_eq!(m.recv.wrong_bytes, Some(0), "{} bytes", m.size);
                assert!(m.recv.algbw_gbs > 0.0);
            }
            done(0);
        }
        Some(rank) => {
            let port: u16 = std::env::var(HANDLES_ENV).unwrap().parse().unwrap();
            let peer = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let out = run_client(&exp, peer, &mut |_: &Measurement| {}).unwrap();
            assert_eq!(out.measurements.len(), exp.sizes.len());
            done(rank);
        }
    }
}

#[test]
fn bad_memory_values_are_refused_by_name() {
    // A bad memory text cannot be an experiment's: it is refused where it is read.
    for bad in ["gpu", "cuda:1", "cuda:x,y"] {
        let e = bad.parse::<tcpx_bench::Memory>().unwrap_err().to_string();
        assert!(e.contains(bad) && e.contains("cuda:S,R"), "{e}");
    }
    assert!(experiment("socket").validate(None).is_ok());
}
