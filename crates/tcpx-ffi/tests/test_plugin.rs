//! The whole plugin path against a real plugin: `tcpx-test-plugin` moving bytes over loopback TCP,
//! in host mode and in TCPX-like unpack mode, plus every fault of the issue's list.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{deadline, host_buffer, host_ctx, load, transfer};
use tcpx_ffi::{
    AbiVersion, DeviceKind, FfiError, HostRegion, MemoryKind, Plugin, PluginOptions,
    UnpackHandling, MAX_IN_FLIGHT,
};
use tcpx_gpu::HostBuffer;
use tcpx_test_support::assert_says;

fn cpu_unpack() -> PluginOptions {
    PluginOptions {
        unpack: UnpackHandling::Cpu,
    }
}

/// Sizes around page and fragment boundaries, the 4 MiB limit, and enough messages to reuse
/// every unpack slot more than twice.
fn mixed_sizes() -> Vec<usize> {
    let mut sizes = vec![
        0,
        1,
        7,
        2047,
        2048,
        4095,
        4096,
        4097,
        65_536 + 13,
        1 << 20,
        4 << 20,
    ];
    sizes.extend((0..30).map(|i| 1 + (i * 104_729) % (600 << 10)));
    sizes.push(3_000_001);
    sizes
}

#[test]
fn loads_and_reports_name_version_and_properties() {
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    assert_eq!(plugin.name(), "tcpx-test-plugin");
    assert_eq!(plugin.version(), AbiVersion::V7);
    assert!(
        plugin.library().contains("libnccl-net-test"),
        "{}",
        plugin.library()
    );
    assert_eq!(plugin.device_count().unwrap(), 1);
    let props = plugin.properties(0).unwrap();
    assert_eq!(props.device, DeviceKind::Host);
    assert!(props.supports(MemoryKind::Host));
    assert!(!props.supports(MemoryKind::Cuda));
    assert_eq!(props.max_recvs, 1);
    assert_eq!(props.speed_mbps, 100_000);

    let unpack = load("unpack", "", cpu_unpack()).unwrap();
    assert_eq!(
        unpack.properties(0).unwrap().device,
        DeviceKind::Unpack { version: 0x7 }
    );
}

#[test]
fn host_mode_moves_bytes_exactly() {
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let sizes = mixed_sizes();
    let got = transfer(&plugin, &sizes, MAX_IN_FLIGHT);
    for (r, &s) in got.iter().zip(&sizes) {
        assert_eq!(r.size, Some(s), "host mode reports the received size");
        assert_eq!(r.fragments, 0);
    }
}

#[test]
fn host_mode_with_a_window_of_one_also_works() {
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    transfer(&plugin, &[100, 200_000, 3], 1);
}

#[test]
fn unpack_mode_reassembles_scattered_fragments_exactly() {
    let plugin = load("unpack", "", cpu_unpack()).unwrap();
    let sizes = mixed_sizes();
    let got = transfer(&plugin, &sizes, MAX_IN_FLIGHT);
    for (r, &s) in got.iter().zip(&sizes) {
        assert_eq!(r.size, Some(s), "unpacked bytes add up to the message");
        // Fragments are 2-4 KiB: at least one per 4 KiB, at most one per 2 KiB (rounded up).
        assert!(
            r.fragments >= s.div_ceil(4096),
            "{s} bytes in {} fragments",
            r.fragments
        );
        assert!(
            r.fragments <= s.div_ceil(2048),
            "{s} bytes in {} fragments",
            r.fragments
        );
    }
}

#[test]
fn unpack_by_caller_holds_receives_until_consumed_in_fifo_order() {
    let plugin = load("unpack", "", PluginOptions::default()).unwrap();
    let (_listen, mut send, mut recv) = common::comm_pair(&plugin, 4);
    assert!(recv.is_unpack());
    let dh = recv.device_handle();
    assert_eq!(dh.net_device_type, tcpx_ffi::abi::NCCL_NET_DEVICE_UNPACK);
    assert_eq!(dh.net_device_version, 0x7);
    assert!(!dh.handle.is_null());
    assert_eq!(dh.size, 24);

    let n = MAX_IN_FLIGHT;
    let src = send
        .register(host_buffer(&common::pattern(n * 4096, 1)))
        .unwrap();
    let dst = recv.register(HostBuffer::new(n * 4096).unwrap()).unwrap();
    for i in 0..n {
        recv.irecv(&dst, i * 4096, 4096, 0)
            .unwrap()
            .expect("posted");
        send.isend(&src, i * 4096, 4096, 0)
            .unwrap()
            .expect("posted");
    }
    let err = recv.irecv(&dst, 0, 1, 0).unwrap_err();
    assert!(
        err.to_string().contains("16 requests already in flight"),
        "{err}"
    );
    let err = recv.consumed().unwrap_err();
    assert!(err.to_string().contains("not done yet"), "{err}");
    for i in 0..n {
        let done = recv.wait(deadline()).unwrap();
        assert_eq!(done.id.0, i as u64);
        assert_eq!(done.unpack_slot, Some(i % 16));
        assert_eq!(done.size, None, "TCPX does not report sizes");
        send.wait(deadline()).unwrap();
    }
    // All done, none handed back: the comm is still full and there is nothing left to test.
    assert_eq!(recv.in_flight(), n);
    assert!(recv
        .test()
        .unwrap_err()
        .to_string()
        .contains("awaiting consumed"));
    for i in 0..n {
        assert_eq!(recv.consumed().unwrap().0, i as u64);
    }
    assert_eq!(recv.in_flight(), 0);
    // Slot 0 is used again by request 16.
    recv.irecv(&dst, 0, 4096, 0).unwrap().expect("posted");
    send.isend(&src, 0, 4096, 0).unwrap().expect("posted");
    assert_eq!(recv.wait(deadline()).unwrap().unpack_slot, Some(0));
    recv.consumed().unwrap();
    send.wait(deadline()).unwrap();
}

// ---- bad input and faults -----------------------------------------------------------------------

#[test]
fn a_file_that_is_not_a_library_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libnccl-net-fake.so");
    std::fs::write(&path, b"not an ELF file").unwrap();
    let err = Plugin::load(Some(path.to_str().unwrap())).unwrap_err();
    assert!(matches!(err, FfiError::Open { .. }), "{err:?}");
    let s = err.to_string();
    assert_says(&s, &["cannot open net plugin", "libnccl-net-fake.so"]);
}

#[test]
fn a_library_without_a_plugin_symbol_is_a_clear_error() {
    let err = Plugin::load(Some("libm.so.6")).unwrap_err();
    assert!(matches!(err, FfiError::NoKnownSymbol { .. }), "{err:?}");
    let s = err.to_string();
    assert_says(
        &s,
        &[
            "not an NCCL net plugin",
            "ncclNetPlugin_v9, ncclNetPlugin_v8, ncclNetPlugin_v7",
        ],
    );
}

#[test]
fn a_null_function_the_path_needs_is_named() {
    let plugin = load("host", "null_fn:regMr", PluginOptions::default()).unwrap();
    let mut listen = plugin.listen(0, 1, host_ctx()).unwrap();
    let send = plugin
        .connect(0, listen.handle(), 1, host_ctx(), deadline())
        .unwrap();
    let _recv = listen.accept(deadline()).unwrap();
    let err = send.register(HostBuffer::new(4096).unwrap()).unwrap_err();
    assert!(
        matches!(
            err,
            FfiError::MissingFunction {
                function: "regMr",
                ..
            }
        ),
        "{err:?}"
    );
    let s = err.to_string();
    assert!(
        s.contains("has no regMr function (NULL in ncclNetPlugin_v7)"),
        "{s}"
    );

    let plugin = load("unpack", "null_fn:irecvConsumed", cpu_unpack()).unwrap();
    let mut listen = plugin.listen(0, 1, host_ctx()).unwrap();
    let _send = plugin
        .connect(0, listen.handle(), 1, host_ctx(), deadline())
        .unwrap();
    let err = listen.accept(deadline()).unwrap_err();
    assert!(
        err.to_string().contains("no irecvConsumed function"),
        "{err}"
    );
}

#[test]
fn plugin_errors_are_named_with_call_comm_and_channel() {
    let plugin = load("host", "isend:3", PluginOptions::default()).unwrap();
    let mut listen = plugin.listen(0, 1, host_ctx()).unwrap(); // comm 1
    let mut send = plugin
        .connect(0, listen.handle(), 1, host_ctx(), deadline())
        .unwrap(); // comm 2
    let _recv = listen.accept(deadline()).unwrap();
    let src = send.register(HostBuffer::new(4096).unwrap()).unwrap();
    let err = send.isend(&src, 0, 4096, 0).unwrap_err();
    assert_eq!(err.code(), Some(3));
    let s = err.to_string();
    assert!(
        s.starts_with("internal error (3) from isend on comm 2, channel 1"),
        "{s}"
    );
    assert!(s.contains("tcpx-test-plugin"), "{s}");
    // The failed post left nothing in flight and the range is free again.
    assert_eq!(send.in_flight(), 0);
    assert!(src.memory().span(0, 4096).is_ok());

    let plugin = load("host", "accept:2", PluginOptions::default()).unwrap();
    let mut listen = plugin.listen(0, 7, host_ctx()).unwrap();
    let err = listen.accept(deadline()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("system error (2) from accept on comm 2, channel 7"),
        "{err}"
    );
}

#[test]
fn plugin_log_lines_reach_tracing() {
    // A process-wide subscriber: per-thread ones race with the other tests' first use of the
    // same callsites. Lines are told apart by this test's own fault.
    let capture = tcpx_test_support::Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    if tracing::subscriber::set_global_default(subscriber).is_err() {
        println!("SKIP: a global tracing subscriber is already installed");
        return;
    }
    let plugin = load("host", "listen:5", PluginOptions::default()).unwrap();
    assert!(plugin.listen(0, 1, host_ctx()).is_err());
    let out = capture.text();
    assert!(
        out.contains(r#"NET/TestPlugin : mode Host, 1 device(s), faults [Fail { func: "listen""#),
        "{out}"
    );
    assert_says(&out, &["fault injected: listen call 1 answers 5", "WARN"]);
}

#[test]
fn a_request_that_never_completes_hits_its_deadline() {
    let plugin = load("host", "never_complete", PluginOptions::default()).unwrap();
    let (_listen, mut send, mut recv) = common::comm_pair(&plugin, 1);
    let src = send.register(HostBuffer::new(4096).unwrap()).unwrap();
    let dst = recv.register(HostBuffer::new(4096).unwrap()).unwrap();
    send.isend(&src, 0, 1000, 0).unwrap().unwrap();
    recv.irecv(&dst, 0, 1000, 0).unwrap().unwrap();
    let short = Instant::now() + Duration::from_millis(200);
    let err = send.wait(short).unwrap_err();
    assert!(matches!(err, FfiError::Timeout { .. }), "{err:?}");
    let s = err.to_string();
    assert_says(
        &s,
        &[
            "send #0 of 1000 bytes at test on comm 2, channel 1",
            "did not complete within",
        ],
    );
    let err = recv
        .wait(Instant::now() + Duration::from_millis(100))
        .unwrap_err();
    assert!(
        err.to_string().contains("receive #0 of up to 1000 bytes"),
        "{err}"
    );
    // The range stays lent to the stuck request.
    assert!(src.memory().span(0, 1000).is_err());
}

#[test]
fn more_than_4_mib_per_receive_is_refused_on_an_unpack_device() {
    let plugin = load("unpack", "", cpu_unpack()).unwrap();
    let (_listen, _send, mut recv) = common::comm_pair(&plugin, 1);
    assert_eq!(recv.max_recv_bytes(), 4 << 20);
    let dst = recv.register(HostBuffer::new(8 << 20).unwrap()).unwrap();
    let err = recv.irecv(&dst, 0, (4 << 20) + 1, 0).unwrap_err();
    let s = err.to_string();
    assert_says(
        &s,
        &[
            "larger than the 4194304 bytes one irecv may carry",
            "split the transfer",
        ],
    );
    assert!(recv.irecv(&dst, 0, 4 << 20, 0).unwrap().is_some());

    // A host device has no such limit.
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let (_listen, _send, mut recv) = common::comm_pair(&plugin, 1);
    let dst = recv.register(HostBuffer::new(8 << 20).unwrap()).unwrap();
    assert!(recv.irecv(&dst, 0, 8 << 20, 0).unwrap().is_some());
}

#[test]
fn misaligned_buffers_are_refused_on_an_unpack_device() {
    let plugin = load("unpack", "", cpu_unpack()).unwrap();
    let (_listen, _send, recv) = common::comm_pair(&plugin, 1);
    let buf = HostBuffer::new(3 * 4096).unwrap();
    let region = HostRegion::new(Arc::clone(&buf), 100, 8192).unwrap();
    let err = recv.register(region).unwrap_err();
    let s = err.to_string();
    assert!(
        s.contains("is not 4096-byte aligned (it is 100 bytes past a page)"),
        "{s}"
    );
    let aligned = HostRegion::new(buf, 4096, 8192).unwrap();
    assert!(recv.register(aligned).is_ok());
}

#[test]
fn host_devices_take_unaligned_registrations() {
    // The 4 KiB rule belongs to UNPACK devices (and CUDA memory): a host device takes a region
    // that starts mid-page.
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let (_listen, _send, recv) = common::comm_pair(&plugin, 1);
    let buf = HostBuffer::new(2 * 4096).unwrap();
    assert!(recv
        .register(HostRegion::new(buf, 100, 4096).unwrap())
        .is_ok());
}

#[test]
fn a_busy_plugin_is_retried_by_the_caller() {
    let plugin = load("host", "busy:isend@1", PluginOptions::default()).unwrap();
    let (_listen, mut send, mut recv) = common::comm_pair(&plugin, 1);
    let src = send.register(host_buffer(b"hello, plugin")).unwrap();
    let dst = recv.register(HostBuffer::new(4096).unwrap()).unwrap();
    assert_eq!(
        send.isend(&src, 0, 13, 0).unwrap(),
        None,
        "first isend is refused"
    );
    assert!(
        src.memory().span(0, 13).is_ok(),
        "a refused post lends nothing"
    );
    assert_eq!(send.isend(&src, 0, 13, 0).unwrap().unwrap().0, 0);
    recv.irecv(&dst, 0, 4096, 0).unwrap().unwrap();
    assert_eq!(recv.wait(deadline()).unwrap().size, Some(13));
    send.wait(deadline()).unwrap();
}

#[test]
fn the_request_discipline_is_enforced_before_the_plugin_sees_it() {
    let plugin = load("host", "never_complete", PluginOptions::default()).unwrap();
    let (_listen, mut send, recv) = common::comm_pair(&plugin, 1);
    let src = send.register(HostBuffer::new(64 * 1024).unwrap()).unwrap();
    // Out of range, and on the wrong comm.
    let err = send.isend(&src, 60 * 1024, 8 * 1024, 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("outside the registered 65536 bytes"),
        "{err}"
    );
    let other = recv.register(HostBuffer::new(4096).unwrap()).unwrap();
    let err = send.isend(&other, 0, 1, 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("registered on comm 3, not on this comm"),
        "{err}"
    );
    // Overlapping in-flight ranges.
    send.isend(&src, 0, 4096, 0).unwrap().unwrap();
    let err = send.isend(&src, 100, 10, 0).unwrap_err();
    assert!(err.to_string().contains("in use elsewhere"), "{err}");
    // At most 16 in flight.
    for i in 1..MAX_IN_FLIGHT {
        send.isend(&src, i * 4096, 4096, 0).unwrap().unwrap();
    }
    let err = send.isend(&src, 0, 0, 0).unwrap_err();
    assert!(
        err.to_string().contains("16 requests already in flight"),
        "{err}"
    );
    assert_eq!(send.in_flight(), MAX_IN_FLIGHT);
    // Nothing pending on recv: testing is a usage error, not a plugin call.
    let mut recv = recv;
    assert!(recv
        .test()
        .unwrap_err()
        .to_string()
        .contains("no receive waiting"));
    // A device that does not exist.
    let err = plugin.listen(3, 1, host_ctx()).unwrap_err();
    assert!(err.to_string().contains("device 3 does not exist"), "{err}");
}

#[test]
fn accept_without_a_peer_times_out_and_connect_to_nobody_fails() {
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let mut listen = plugin.listen(0, 2, host_ctx()).unwrap();
    let handle = listen.handle().clone();
    let err = listen
        .accept(Instant::now() + Duration::from_millis(100))
        .unwrap_err();
    let s = err.to_string();
    assert_says(&s, &["accepting at accept on comm", "must call connect"]);
    drop(listen); // the port is closed now
    let err = plugin
        .connect(0, &handle, 2, host_ctx(), deadline())
        .unwrap_err();
    let s = err.to_string();
    assert!(s.starts_with("system error (2) from connect"), "{s}");
}

#[test]
fn loading_the_same_library_twice_reuses_the_first_init() {
    let a = load("host", "", PluginOptions::default()).unwrap();
    let b = Plugin::load(Some(a.library())).unwrap();
    assert_eq!(a.library(), b.library());
    // Both handles drive the same instance: a comm from one works with the other's.
    let mut listen = a.listen(0, 1, host_ctx()).unwrap();
    let _send = b
        .connect(0, listen.handle(), 1, host_ctx(), deadline())
        .unwrap();
    listen.accept(deadline()).unwrap();
}

#[test]
fn a_gpu_context_hook_runs_before_calls_that_need_it_and_its_failure_is_reported() {
    struct Counting(std::sync::atomic::AtomicUsize, bool);
    impl tcpx_ffi::CurrentContext for Counting {
        fn make_current(&self) -> Result<(), String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.1 {
                Err("cuCtxSetCurrent failed: no device".into())
            } else {
                Ok(())
            }
        }
    }
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let ok = Arc::new(Counting(Default::default(), false));
    let mut listen = plugin.listen(0, 1, ok.clone()).unwrap();
    let send = plugin
        .connect(0, listen.handle(), 1, ok.clone(), deadline())
        .unwrap();
    let _recv = listen.accept(deadline()).unwrap();
    let before = ok.0.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        before >= 3,
        "listen, connect and accept each made it current ({before})"
    );
    let _mr = send.register(HostBuffer::new(4096).unwrap()).unwrap();
    assert_eq!(
        ok.0.load(std::sync::atomic::Ordering::Relaxed),
        before + 1,
        "regMr too"
    );

    let bad = Arc::new(Counting(Default::default(), true));
    let err = plugin.listen(0, 1, bad).unwrap_err();
    let s = err.to_string();
    assert_says(
        &s,
        &[
            "could not make the GPU context current before listen",
            "cuCtxSetCurrent failed",
        ],
    );
}

#[test]
fn device_memory_reaches_the_plugin_as_cuda_memory_with_the_gpu_current() {
    let test = "tcpx-ffi device_memory_reaches_the_plugin_as_cuda_memory_with_the_gpu_current";
    let Some(gpus) = tcpx_gpu::testing::gpus_or_skip(test, 1) else {
        return;
    };
    let gpu = gpus[0].clone();
    let ctx: Arc<dyn tcpx_ffi::CurrentContext> = Arc::new(gpu.clone());
    let plugin = load("host", "", PluginOptions::default()).unwrap();
    let mut listen = plugin.listen(0, 1, Arc::clone(&ctx)).unwrap();
    let send = plugin
        .connect(0, listen.handle(), 1, Arc::clone(&ctx), deadline())
        .unwrap();
    let _recv = listen.accept(deadline()).unwrap();
    let buf = Arc::new(gpu.alloc(1 << 20).unwrap());
    let aligned = buf.device_ptr() % 4096 == 0;
    let err = send.register(buf).unwrap_err();
    if aligned {
        // The test plugin takes host memory only: it must be told this is CUDA memory and refuse.
        assert_eq!(err.code(), Some(4), "{err}");
        assert!(
            err.to_string()
                .starts_with("invalid argument (4) from regMr"),
            "{err}"
        );
    } else {
        // CUDA memory must start on a 4 KiB page for GPUDirect-TCPX: refused before the plugin.
        assert!(err.to_string().contains("4096-byte aligned"), "{err}");
    }
}

/// A close that blocks inside the plugin (`block:closeSend,block:closeRecv`) is bounded: dropping
/// the comms returns after [`tcpx_ffi::CLOSE_DEADLINE`] each instead of hanging the caller.
#[test]
fn a_close_that_blocks_inside_the_plugin_is_bounded() {
    let plugin = load(
        "host",
        "block:closeSend,block:closeRecv",
        PluginOptions::default(),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        // Moves the bytes, then drops (closes) both comms.
        transfer(&plugin, &[100, 70_000], 2);
        let _ = tx.send(());
    });
    // Two closes, each waited for at most the deadline, plus the transfer itself.
    let guard = tcpx_ffi::CLOSE_DEADLINE * 2 + Duration::from_secs(30);
    rx.recv_timeout(guard)
        .expect("dropping comms whose close blocks must return within the close deadline");
    assert!(
        started.elapsed() >= tcpx_ffi::CLOSE_DEADLINE,
        "the closes did block (and were waited for) before being left to the plugin"
    );
}

/// `slow_dev:<dev>:<us per MiB>` paces device `dev` alone: 4 MiB through a device paced at
/// 100 ms per MiB take at least 400 ms on the wire (the bytes verified), while the same fault on
/// another device leaves device 0 at loopback speed.
#[test]
fn a_slow_device_is_paced_and_no_other() {
    let sizes = [1 << 20; 4];
    let slow = load("host", "slow_dev:0:100000", PluginOptions::default()).unwrap();
    let started = Instant::now();
    let got = transfer(&slow, &sizes, MAX_IN_FLIGHT);
    let slow_took = started.elapsed();
    assert_eq!(got.len(), sizes.len());
    assert!(
        slow_took >= Duration::from_millis(400),
        "4 MiB at 100 ms per MiB took only {slow_took:?}"
    );
    let other = load("host", "slow_dev:1:100000", PluginOptions::default()).unwrap();
    let started = Instant::now();
    transfer(&other, &sizes, MAX_IN_FLIGHT);
    let fast_took = started.elapsed();
    assert!(
        fast_took < slow_took,
        "device 0 was paced by a fault on device 1: {fast_took:?} vs {slow_took:?} paced"
    );
    let err = load("host", "slow_dev:0", PluginOptions::default()).unwrap_err();
    assert!(err.to_string().contains("invalid argument"), "{err}");
}
