//! Backend `cudap2p` on real GPUs: GPU 0 -> GPU 1 through the shared driver, receiver pulling
//! (read) and sender pushing (write), bytes checked on the GPU. Skips visibly with fewer than two
//! GPUs (runs under `cargo xtask gpu-test`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::cudap2p::{CopyMode, CudaP2pTransport};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::{Memory, Transport};

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
    let channels = 2;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut listeners: Vec<_> = (0..channels).map(|_| t.listen().unwrap()).collect();
    let mut send: Vec<_> = listeners
        .iter()
        .map(|l| t.connect(&l.handle(), deadline).unwrap())
        .collect();
    let mut recv: Vec<_> = listeners
        .iter_mut()
        .map(|l| l.accept(deadline).unwrap())
        .collect();
    let (src_mem, dst_mem) = (Memory::Cuda(src.clone()), Memory::Cuda(dst.clone()));
    let smr: Vec<_> = send
        .iter_mut()
        .map(|c| c.reg_mr(&src_mem).unwrap())
        .collect();
    let rmr: Vec<_> = recv
        .iter_mut()
        .map(|c| c.reg_mr(&dst_mem).unwrap())
        .collect();
    let cfg = SchedConfig {
        size: size as u64,
        chunk: 4 << 20,
        window: 8,
        channels,
        assignment: Assignment::RoundRobin,
    };
    std::thread::scope(|s| {
        let cfg2 = cfg.clone();
        let t2 = &t;
        let r = s.spawn(move || {
            Transfer::new(cfg2, Role::Recv, 0, 0).unwrap().run(
                t2,
                &mut Comms::Recv(&mut recv, &rmr),
                Duration::from_secs(10),
            )
        });
        Transfer::new(cfg, Role::Send, 0, 0)
            .unwrap()
            .run(
                &t,
                &mut Comms::Send(&mut send, &smr),
                Duration::from_secs(10),
            )
            .unwrap();
        r.join().unwrap().unwrap();
    });
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
