//! The `nccl` transport backend (ncclSend/ncclRecv behind the Transport trait) moving GPU memory
//! through the shared transfer driver, byte-exact. Both sides run on GPU 0 as 2 NCCL hosts, each
//! a process of its own (`nccl_ranks`): the receiver (rank 0) listens and hands its handles to
//! the sender (rank 1) through the parent. Needs a GPU and libnccl; prints `SKIP:` without.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::testing::{gpus_or_skip, skip};
use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::nccl::NcclTransport;
use tcpx_transport::{Handle, HostBuffer, Memory, Transport, TransportError};

mod nccl_ranks;
use nccl_ranks::{done, finish, hex, start, this_rank, unhex, HANDLES, HANDLES_ENV};

const CHANNELS: usize = 2;
const SIZE: usize = (24 << 20) + 777;

fn sched() -> SchedConfig {
    SchedConfig {
        size: SIZE as u64,
        chunk: 4 << 20,
        window: 4,
        channels: CHANNELS,
        assignment: Assignment::RoundRobin,
    }
}

/// Runs this rank's side (`role`, matching `comms`) of the transfer [`sched`] lays out, landing at
/// `base` of the receive buffer and waiting at most 30 s without progress.
fn run_side(t: &dyn Transport, role: Role, base: usize, comms: &mut Comms<'_>) {
    let mut x = Transfer::new(sched(), role, base, 0).unwrap();
    x.run(t, comms, Duration::from_secs(30)).unwrap();
}

#[test]
fn gpu_nccl_transport_moves_gpu_memory_byte_exact() {
    const T: &str = "gpu_nccl_transport_moves_gpu_memory_byte_exact";
    let Some(g) = gpus_or_skip(T, 1) else { return };
    let t = match NcclTransport::new(g[0].clone()) {
        Ok(t) => t,
        Err(e) => return skip(T, &format!("{e}")),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    match this_rank() {
        None => {
            // The parent: rank 0's handles go to rank 1.
            let mut r0 = start(T, 0, &[]);
            let handles = r0.line(HANDLES, deadline);
            let Some(handles) = handles else {
                finish(vec![r0], Duration::from_secs(5));
                panic!("rank 0 printed no handles within 60 s");
            };
            let r1 = start(T, 1, &[(HANDLES_ENV, handles)]);
            finish(vec![r0, r1], Duration::from_secs(180));
        }
        Some(0) => {
            // The receiver: listens, accepts, receives, checks what landed.
            let mut ls: Vec<_> = (0..CHANNELS).map(|_| t.listen().unwrap()).collect();
            let hs: Vec<String> = ls.iter().map(|l| hex(l.handle().as_bytes())).collect();
            assert!(ls.iter().all(|l| l.handle().as_bytes().len() == 128));
            println!("{HANDLES} {}", hs.join(","));
            let mut recv: Vec<_> = ls.iter_mut().map(|l| l.accept(deadline).unwrap()).collect();
            let dst = Arc::new(g[0].alloc(SIZE + 4096).unwrap());
            let s = g[0].new_stream().unwrap();
            s.fill_pattern(&dst, 0, SIZE + 4096, 3, 0).unwrap();
            s.synchronize().unwrap();
            // Host memory is refused: NCCL moves GPU memory only.
            assert!(matches!(
                recv[0].reg_mr(&Memory::Host(HostBuffer::new(64).unwrap())),
                Err(TransportError::Usage(_))
            ));
            let rmr: Vec<_> = recv
                .iter_mut()
                .map(|c| c.reg_mr(&Memory::Cuda(dst.clone())).unwrap())
                .collect();
            run_side(&t, Role::Recv, 4096, &mut Comms::Recv(&mut recv, &rmr));
            assert_eq!(s.verify_pattern(&dst, 4096, SIZE, 41, 0).unwrap(), None);
            assert_eq!(
                s.verify_pattern(&dst, 0, 4096, 3, 0).unwrap(),
                None,
                "bytes before the target untouched"
            );
            done(0);
        }
        Some(rank) => {
            // The sender: connects to rank 0's handles and sends the pattern.
            let hs = std::env::var(HANDLES_ENV).unwrap();
            let mut send: Vec<_> = hs
                .split(',')
                .map(|h| {
                    let h = Handle::from_bytes(unhex(h)).unwrap();
                    t.connect(&h, deadline).unwrap()
                })
                .collect();
            assert_eq!(send.len(), CHANNELS);
            let src = Arc::new(g[0].alloc(SIZE).unwrap());
            let s = g[0].new_stream().unwrap();
            s.fill_pattern(&src, 0, SIZE, 41, 0).unwrap();
            s.synchronize().unwrap();
            let smr: Vec<_> = send
                .iter_mut()
                .map(|c| c.reg_mr(&Memory::Cuda(src.clone())).unwrap())
                .collect();
            run_side(&t, Role::Send, 0, &mut Comms::Send(&mut send, &smr));
            done(rank);
        }
    }
}
