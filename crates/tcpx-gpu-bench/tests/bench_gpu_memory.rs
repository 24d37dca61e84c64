//! `tcpx-bench` experiments with `--memory cuda`: the tool's own driver (control protocol,
//! barriers, verification) moving GPU memory through the socket backend (pinned staging) and
//! through the `nccl` backend, every byte checked on the GPU. Needs 2 GPUs (and libnccl for the
//! nccl case); prints `SKIP:` without.

use tcpx_bench::{run_local, Experiment, Measurement};
use tcpx_gpu::testing::{gpus_or_skip, skip};

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
        window: 4,
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

#[test]
fn gpu_bench_nccl_backend_with_gpu_memory_is_byte_exact() {
    const T: &str = "gpu_bench_nccl_backend_with_gpu_memory_is_byte_exact";
    if gpus_or_skip(T, 2).is_none() {
        return;
    }
    if let Err(e) = tcpx_ffi::nccl::Nccl::load() {
        return skip(T, &format!("libnccl unavailable: {e}"));
    }
    check(&Experiment {
        channels: 1,
        ..experiment("nccl")
    });
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
