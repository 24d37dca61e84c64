//! The netplugin backend carrying GPU memory through the workspace's test plugin, byte-exact and
//! checked on the GPU: in host mode (the plugin stages GPU bytes through host memory) and in
//! TCPX-like unpack mode (received bytes land in shuffled 4 KiB pages of a device bounce buffer,
//! the real CUDA unpack kernel gathers them, irecvConsumed follows its event). Needs a GPU (two
//! for GPU0 -> GPU1; with one, GPU0 -> GPU0); prints `SKIP:` without.
//!
//! The plugin library comes from `TCPX_TEST_PLUGIN_SO` (the device bundle sets it to its copy in
//! `lib/`), or is built with cargo into this test's target directory.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::testing::gpus_or_skip;
use tcpx_gpu::Device;
use tcpx_test_support::test_plugin_so;
use tcpx_transport::netplugin::{NetPluginConfig, NetPluginTransport};
use tcpx_transport::{Memory, MemoryKind, Transport};

/// A fresh copy of the test plugin (its own init and mode), as a path to load.
fn plugin_copy(mode: &str) -> String {
    static COPY: AtomicUsize = AtomicUsize::new(0);
    let n = COPY.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tcpx-netplugin-gpu-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(format!("libnccl-net-gpu-{mode}-{n}.so"));
    std::fs::copy(test_plugin_so(), &copy).unwrap_or_else(|e| {
        panic!(
            "copying {} to {}: {e}",
            test_plugin_so().display(),
            copy.display()
        )
    });
    copy.to_str().unwrap().to_string()
}

/// Sender and receiver transports on one plugin copy, for GPUs `g0` and `g1`.
fn transports(
    mode: &str,
    g0: &Device,
    g1: &Device,
) -> (Arc<NetPluginTransport>, Arc<NetPluginTransport>) {
    let plugin = plugin_copy(mode);
    let make = |g: &Device| {
        let t = NetPluginTransport::new(NetPluginConfig {
            plugin: Some(plugin.clone()),
            dev: 0,
            env: vec![
                ("TCPX_TEST_PLUGIN_MODE".into(), mode.into()),
                ("TCPX_TEST_PLUGIN_FAULT".into(), String::new()),
            ],
        })
        .unwrap_or_else(|e| panic!("loading the test plugin ({plugin}) in {mode} mode: {e}"));
        let t = t.with_device(g.clone());
        assert!(
            t.limits().memory.contains(&MemoryKind::Cuda),
            "the test plugin does not offer CUDA memory (ptrSupport {:#x}): is libcuda.so.1 \
             loadable in this process?",
            t.properties().ptr_support
        );
        Arc::new(t)
    };
    (make(g0), make(g1))
}

/// Sends `size` bytes GPU `g0` -> GPU `g1` over `channels` comms through the test plugin in
/// `mode`, receiving at offset 4096, twice; every byte (and those around the target) checked on
/// the GPU.
fn gpu_transfer(
    mode: &str,
    g0: &Device,
    g1: &Device,
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
) {
    let (st, rt) = transports(mode, g0, g1);
    common::gpu_rounds(
        &format!("{mode} mode"),
        (&*st, &*rt),
        (g0, g1),
        (size, common::schedule(size, chunk, window, channels)),
        (91, Duration::from_secs(30)),
        |r| {
            let (round, seed, s1, dst) = (r.round, r.seed, r.stream, r.dst);
            r.received
                .unwrap_or_else(|e| panic!("{mode} mode, round {round}, receiver: {e}"));
            r.sent
                .unwrap_or_else(|e| panic!("{mode} mode, round {round}, sender: {e}"));
            let wrong = s1
                .count_pattern_errors(dst, common::POISON, size, seed, 0)
                .unwrap();
            assert_eq!(
                wrong,
                0,
                "{mode} mode, round {round}, {size} bytes in chunks of {chunk} over {channels} \
                 channel(s): {wrong} received bytes differ (first at {:?}); in unpack mode \
                 suspect the fragment list or the kernel",
                s1.verify_pattern(dst, common::POISON, size, seed, 0)
                    .unwrap()
            );
        },
    );
}

#[test]
fn gpu_netplugin_host_mode_carries_gpu_memory_byte_exact() {
    let Some(g) = gpus_or_skip("gpu_netplugin_host_mode_carries_gpu_memory_byte_exact", 1) else {
        return;
    };
    let g1 = common::second_gpu_or_first(&g);
    gpu_transfer("host", &g[0], &g1, (8 << 20) + 12345, 1 << 20, 4, 2);
    gpu_transfer("host", &g[0], &g1, 3, 1 << 20, 2, 1);
}

#[test]
fn gpu_netplugin_unpack_mode_runs_the_real_unpack_kernel_byte_exact() {
    let Some(g) = gpus_or_skip(
        "gpu_netplugin_unpack_mode_runs_the_real_unpack_kernel_byte_exact",
        1,
    ) else {
        return;
    };
    let g1 = common::second_gpu_or_first(&g);
    // Full 4 MiB receives (the TCPX maximum), 16 in flight per comm (every unpack slot in use).
    gpu_transfer("unpack", &g[0], &g1, (24 << 20) + 12345, 4 << 20, 16, 3);
    // Small and odd receives: fragments of a few bytes, unaligned ends.
    gpu_transfer("unpack", &g[0], &g1, 300_001, 64 << 10, 4, 1);
    gpu_transfer("unpack", &g[0], &g1, 3, 1 << 20, 2, 1);
}

/// Below the transport: the comm a GPU-context accept produces really is a GPU unpack comm (the
/// unpack handle in device memory, nothing read on the CPU), and a receive into host memory, which
/// the test plugin delivers to the GPU bounce pages anyway, is refused with a clear error at test
/// rather than reported with bytes that never reached it (GPUDirect-TCPX writes host receives in
/// place and passes this check).
#[test]
fn gpu_netplugin_unpack_comm_keeps_its_handle_on_the_gpu() {
    let Some(g) = gpus_or_skip("gpu_netplugin_unpack_comm_keeps_its_handle_on_the_gpu", 1) else {
        return;
    };
    let (st, rt) = transports("unpack", &g[0], &g[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = common::one_comm(&*st, &*rt, deadline);
    let src = tcpx_transport::HostBuffer::new(4096).unwrap();
    let dst = tcpx_transport::HostBuffer::new(4096).unwrap();
    let smr = send.reg_mr(&Memory::Host(src)).unwrap();
    let rmr = recv.reg_mr(&Memory::Host(dst)).unwrap();
    let rreq = recv.irecv(rmr, 0, 4096, 0).unwrap().expect("a free slot");
    let sreq = send.isend(smr, 0, 4096, 0).unwrap().expect("a free slot");
    let err = loop {
        assert!(Instant::now() < deadline, "the host receive never finished");
        let _ = send.test(sreq).unwrap();
        match recv.test(rreq) {
            Ok(None) => std::thread::yield_now(),
            Ok(Some(n)) => panic!("a host receive in GPU bounce pages was reported with {n} bytes"),
            Err(e) => break e,
        }
    };
    assert!(
        err.to_string().contains("GPU bounce pages"),
        "host memory on a GPU unpack comm: {err}"
    );
    // A transport without the GPU cannot accept such a comm, and says what to do.
    let plain = NetPluginTransport::new(NetPluginConfig {
        plugin: Some(plugin_copy("unpack")),
        dev: 0,
        env: vec![("TCPX_TEST_PLUGIN_MODE".into(), "unpack".into())],
    })
    .unwrap();
    assert!(!plain.limits().memory.contains(&MemoryKind::Cuda));
}
