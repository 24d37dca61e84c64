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

/// The socket backend with `socks` sockets per comm, staging GPU memory through mirrors or, with
/// `ring`, through a ring of that many bytes per comm.
fn staging(socks: usize, ring: Option<usize>) -> Arc<dyn Transport> {
    let inner = SocketTransport::new(SocketConfig {
        socks,
        ..SocketConfig::default()
    })
    .unwrap();
    // Each comm stages through the GPU of the first buffer registered on it.
    Arc::new(CudaStaging::new(Arc::new(inner)).with_ring(ring))
}

/// Sends `size` bytes GPU `g0` -> GPU `g1` over `channels` comms of `socks` sockets (staged
/// through `ring` when given), receiving at offset 4096, and checks every byte (and that the
/// bytes around the target are untouched).
#[allow(clippy::too_many_arguments)]
fn gpu_transfer(
    g0: &Device,
    g1: &Device,
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    socks: usize,
    ring: Option<usize>,
) {
    let (st, rt) = (staging(socks, ring), staging(socks, ring));
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
    gpu_transfer(g0, &g1, (16 << 20) + 12345, 1 << 20, 4, 2, 4, None);
    gpu_transfer(g0, &g1, 100_000, 64 << 10, 2, 1, 1, None);
    gpu_transfer(g0, &g1, 3, 1 << 20, 2, 1, 2, None);
}

/// Through a staging ring: smaller than the window's bytes (requests wait for ranges), exactly
/// one chunk (one request at a time), and a size that leaves a tail unused before wrapping.
#[test]
fn gpu_socket_backend_carries_gpu_memory_through_a_staging_ring_byte_exact() {
    let name = "gpu_socket_backend_carries_gpu_memory_through_a_staging_ring_byte_exact";
    let Some(g) = gpus_or_skip(name, 1) else {
        return;
    };
    let (g0, g1) = (&g[0], common::second_gpu_or_first(&g));
    gpu_transfer(g0, &g1, (16 << 20) + 12345, 1 << 20, 4, 2, 4, Some(2 << 20));
    gpu_transfer(g0, &g1, 100_000, 64 << 10, 2, 1, 1, Some(64 << 10));
    gpu_transfer(
        g0,
        &g1,
        (8 << 20) + 1,
        1 << 20,
        8,
        1,
        2,
        Some((3 << 20) + 1),
    );
}

/// A request longer than the comm's staging ring is refused, naming both sizes.
#[test]
fn gpu_staging_refuses_a_request_longer_than_its_ring() {
    let Some(g) = gpus_or_skip("gpu_staging_refuses_a_request_longer_than_its_ring", 1) else {
        return;
    };
    let (st, rt) = (staging(1, Some(64 << 10)), staging(1, Some(64 << 10)));
    let (mut c, _r) = common::one_comm(&*st, &*rt, Instant::now() + Duration::from_secs(10));
    let buf = Arc::new(g[0].alloc(1 << 20).unwrap());
    let mr = c.reg_mr(&Memory::Cuda(buf)).unwrap();
    match c.isend(mr, 0, 128 << 10, 0) {
        Err(TransportError::Usage(m)) => {
            assert!(
                m.contains("131072 bytes") && m.contains("65536 bytes"),
                "{m}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn gpu_staging_refuses_a_buffer_of_another_gpu() {
    let Some(g) = gpus_or_skip("gpu_staging_refuses_a_buffer_of_another_gpu", 2) else {
        return;
    };
    let g1 = Device::open(1).unwrap();
    let (st, rt) = (staging(1, None), staging(1, None));
    let (mut c, _r) = common::one_comm(&*st, &*rt, Instant::now() + Duration::from_secs(10));
    // The first GPU buffer picks the comm's GPU; one of another GPU is refused afterwards.
    let mine = Arc::new(g[0].alloc(4096).unwrap());
    let other = Arc::new(g1.alloc(4096).unwrap());
    assert!(c.reg_mr(&Memory::Cuda(mine)).is_ok());
    assert!(matches!(
        c.reg_mr(&Memory::Cuda(other)),
        Err(TransportError::Usage(_))
    ));
}
