//! The socket backend carrying GPU memory through `CudaStaging`: GPU -> pinned host -> loopback
//! sockets -> pinned host -> GPU, byte-exact, through the shared transfer driver. Needs a GPU
//! (two for GPU0 -> GPU1; with one, GPU0 -> GPU0); prints `SKIP:` without.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::testing::gpus_or_skip;
use tcpx_gpu::Device;
use tcpx_transport::cuda_staging::CudaStaging;
use tcpx_transport::socket::{SocketConfig, SocketTransport};
use tcpx_transport::{HostBuffer, Memory, MemoryKind, Transport, TransportError};

fn staging(socks: usize) -> Arc<dyn Transport> {
    let inner = SocketTransport::new(SocketConfig {
        socks,
        ..SocketConfig::default()
    })
    .unwrap();
    // Each comm stages through the GPU of the first buffer registered on it.
    Arc::new(CudaStaging::new(Arc::new(inner)))
}

/// Sends `size` bytes GPU `g0` -> GPU `g1` over `channels` comms of `socks` sockets, receiving
/// at offset 4096, and checks every byte (and that the bytes around the target are untouched).
fn gpu_transfer(
    g0: &Device,
    g1: &Device,
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    socks: usize,
) {
    let (st, rt) = (staging(socks), staging(socks));
    assert!(st.limits().memory.contains(&MemoryKind::Cuda));
    let (mut send, _recv) = common::gpu_rounds(
        "socket backend through CudaStaging",
        (&*st, &*rt),
        (g0, g1),
        (size, common::schedule(size, chunk, window, channels)),
        (77, Duration::from_secs(20)),
        |r| {
            let (round, seed, s1, dst) = (r.round, r.seed, r.stream, r.dst);
            r.received.unwrap();
            r.sent.unwrap();
            assert_eq!(
                s1.verify_pattern(dst, common::POISON, size, seed, 0)
                    .unwrap(),
                None,
                "round {round}, {size} bytes"
            );
        },
    );
    // Host memory still passes through on the same comms.
    let hb = HostBuffer::new(4096).unwrap();
    assert!(send[0].reg_mr(&Memory::Host(hb)).is_ok());
}

#[test]
fn gpu_socket_backend_carries_gpu_memory_byte_exact() {
    let Some(g) = gpus_or_skip("gpu_socket_backend_carries_gpu_memory_byte_exact", 1) else {
        return;
    };
    let (g0, g1) = (&g[0], common::second_gpu_or_first(&g));
    gpu_transfer(g0, &g1, (16 << 20) + 12345, 1 << 20, 4, 2, 4);
    gpu_transfer(g0, &g1, 100_000, 64 << 10, 2, 1, 1);
    gpu_transfer(g0, &g1, 3, 1 << 20, 2, 1, 2);
}

#[test]
fn gpu_staging_refuses_a_buffer_of_another_gpu() {
    let Some(g) = gpus_or_skip("gpu_staging_refuses_a_buffer_of_another_gpu", 2) else {
        return;
    };
    let g1 = Device::open(1).unwrap();
    let (st, rt) = (staging(1), staging(1));
    let mut l = rt.listen().unwrap();
    let h = l.handle();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut c, _r) = std::thread::scope(|s| {
        let a = s.spawn(|| l.accept(deadline).unwrap());
        (st.connect(&h, deadline).unwrap(), a.join().unwrap())
    });
    // The first GPU buffer picks the comm's GPU; one of another GPU is refused afterwards.
    let mine = Arc::new(g[0].alloc(4096).unwrap());
    let other = Arc::new(g1.alloc(4096).unwrap());
    assert!(c.reg_mr(&Memory::Cuda(mine)).is_ok());
    assert!(matches!(
        c.reg_mr(&Memory::Cuda(other)),
        Err(TransportError::Usage(_))
    ));
}
