//! The `nccl` transport backend (ncclSend/ncclRecv behind the Transport trait) moving GPU memory
//! through the shared transfer driver, byte-exact. Needs 2 GPUs and libnccl; prints `SKIP:` without.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::testing::{gpus_or_skip, skip};
use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::nccl::NcclTransport;
use tcpx_transport::{HostBuffer, Memory, Transport, TransportError};

#[test]
fn gpu_nccl_transport_moves_gpu_memory_byte_exact() {
    const T: &str = "gpu_nccl_transport_moves_gpu_memory_byte_exact";
    let Some(g) = gpus_or_skip(T, 2) else { return };
    let (st, rt) = match (
        NcclTransport::new(g[0].clone()),
        NcclTransport::new(g[1].clone()),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return skip(T, &format!("{e}")),
    };
    let channels = 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ls: Vec<_> = (0..channels).map(|_| rt.listen().unwrap()).collect();
    assert!(ls.iter().all(|l| l.handle().as_bytes().len() == 128));
    let mut comms = common::connect_listeners(&st, &mut ls, deadline);
    let size = (24 << 20) + 777;
    let src = Arc::new(g[0].alloc(size).unwrap());
    let dst = Arc::new(g[1].alloc(size + 4096).unwrap());
    let (s0, s1) = (g[0].new_stream().unwrap(), g[1].new_stream().unwrap());
    s0.fill_pattern(&src, 0, size, 41, 0).unwrap();
    s1.fill_pattern(&dst, 0, size + 4096, 3, 0).unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    let (smr, rmr) = common::register(
        &mut comms,
        &Memory::Cuda(src.clone()),
        &Memory::Cuda(dst.clone()),
    );
    let (mut send, mut recv) = comms;
    // Host memory is refused: NCCL moves GPU memory only.
    assert!(matches!(
        send[0].reg_mr(&Memory::Host(HostBuffer::new(64).unwrap())),
        Err(TransportError::Usage(_))
    ));
    let cfg = SchedConfig {
        size: size as u64,
        chunk: 4 << 20,
        window: 4,
        channels,
        assignment: Assignment::RoundRobin,
    };
    std::thread::scope(|s| {
        let cfg2 = cfg.clone();
        let (rt, rmr, recv) = (&rt, &rmr, &mut recv);
        let r = s.spawn(move || {
            let mut x = Transfer::new(cfg2, Role::Recv, 4096, 0).unwrap();
            x.run(rt, &mut Comms::Recv(recv, rmr), Duration::from_secs(30))
                .unwrap();
        });
        let mut x = Transfer::new(cfg, Role::Send, 0, 0).unwrap();
        x.run(
            &st,
            &mut Comms::Send(&mut send, &smr),
            Duration::from_secs(30),
        )
        .unwrap();
        r.join().unwrap();
    });
    assert_eq!(s1.verify_pattern(&dst, 4096, size, 41, 0).unwrap(), None);
    assert_eq!(
        s1.verify_pattern(&dst, 0, 4096, 3, 0).unwrap(),
        None,
        "bytes before the target untouched"
    );
}
