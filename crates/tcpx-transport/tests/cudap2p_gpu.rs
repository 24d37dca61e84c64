//! Backend `cudap2p` on real GPUs: GPU 0 -> GPU 1 through the shared driver, receiver pulling
//! (read) and sender pushing (write), bytes checked on the GPU. Skips visibly with fewer than two
//! GPUs (runs under `cargo xtask gpu-test`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use tcpx_sched::Assignment;
use tcpx_transport::cudap2p::{CopyMode, CudaP2pTransport};
use tcpx_transport::Memory;

fn gpu0_to_gpu1(mode: CopyMode) {
    let Some(gpus) = tcpx_gpu::testing::gpus_or_skip("cudap2p GPU0 -> GPU1", 2) else {
        return;
    };
    let size = (64 << 20) + 4096;
    let src = Arc::new(gpus[0].alloc(size).unwrap());
    let dst = Arc::new(gpus[1].alloc(size).unwrap());
    let s0 = gpus[0].new_stream().unwrap();
    s0.fill_pattern(&src, 0, size, 5, 0).unwrap();
    s0.synchronize().unwrap();
    let s1 = gpus[1].new_stream().unwrap();
    s1.fill_pattern(&dst, 0, size, 99, 0).unwrap();
    s1.synchronize().unwrap();
    let t = CudaP2pTransport::new(mode);
    let cfg = common::schedule(size, 4 << 20, 8, 2, Assignment::RoundRobin);
    let mems = (&Memory::Cuda(src.clone()), &Memory::Cuda(dst.clone()));
    common::drive(
        (&t, &t),
        common::comms(&t, 2),
        mems,
        cfg,
        0,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(
        s1.verify_pattern(&dst, 0, size, 5, 0).unwrap(),
        None,
        "{mode:?}: GPU 1 holds GPU 0's bytes"
    );
}

#[test]
fn gpu0_to_gpu1_receiver_pulls() {
    gpu0_to_gpu1(CopyMode::Read);
}

#[test]
fn gpu0_to_gpu1_sender_pushes() {
    gpu0_to_gpu1(CopyMode::Write);
}
