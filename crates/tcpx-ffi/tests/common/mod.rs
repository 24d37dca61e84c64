//! Shared helpers: build and load the test plugin, move bytes through it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tcpx_ffi::{
    CurrentContext, FfiError, ListenComm, NoGpuContext, Plugin, PluginOptions, RecvComm, SendComm,
};
use tcpx_gpu::HostBuffer;

pub use tcpx_test_support::test_plugin_so;

/// Serialises loads: the plugin reads its mode and faults from the environment in `init`.
static LOAD: Mutex<()> = Mutex::new(());

/// Loads a fresh instance of the test plugin (its own copy of the `.so`, so its own `init` and
/// state) in `mode` with `faults`.
pub fn load(mode: &str, faults: &str, options: PluginOptions) -> Result<Plugin, FfiError> {
    static COPY: AtomicUsize = AtomicUsize::new(0);
    let so = test_plugin_so();
    let _guard = LOAD.lock().unwrap_or_else(|p| p.into_inner());
    let n = COPY.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tcpx-ffi-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join(format!("libnccl-net-test{n}.so"));
    std::fs::copy(so, &copy).expect("copy the plugin");
    std::env::set_var("TCPX_TEST_PLUGIN_MODE", mode);
    std::env::set_var("TCPX_TEST_PLUGIN_FAULT", faults);
    let plugin = Plugin::load_with(Some(copy.to_str().expect("utf-8 path")), options);
    std::env::remove_var("TCPX_TEST_PLUGIN_MODE");
    std::env::remove_var("TCPX_TEST_PLUGIN_FAULT");
    // The mapping stays after the file is gone.
    let _ = std::fs::remove_dir_all(&dir);
    plugin
}

pub fn host_ctx() -> Arc<dyn CurrentContext> {
    Arc::new(NoGpuContext)
}

pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// Bytes that differ at every position and from run to run of the pattern seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A page-aligned host buffer holding `bytes`.
pub fn host_buffer(bytes: &[u8]) -> Arc<HostBuffer> {
    let buf = HostBuffer::new(bytes.len().max(1)).expect("host buffer");
    if !bytes.is_empty() {
        buf.span_all().expect("span").copy_from_slice(bytes);
    }
    buf
}

/// What one receive reported.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub size: Option<usize>,
    pub fragments: usize,
}

/// One comm pair on device 0 of `plugin`, labelled `channel` (host memory): listen, connect,
/// accept. The listener comes back too, so that it stays open as long as the test's comms.
pub fn comm_pair(plugin: &Plugin, channel: u32) -> (ListenComm, SendComm, RecvComm) {
    let mut listen = plugin.listen(0, channel, host_ctx()).unwrap();
    let send = plugin
        .connect(0, listen.handle(), channel, host_ctx(), deadline())
        .unwrap();
    let recv = listen.accept(deadline()).unwrap();
    (listen, send, recv)
}

/// Sends messages of `sizes` through `plugin` (connect in a thread, accept here) with up to
/// `window` requests in flight on each side; returns what each receive reported and checks that
/// the receive buffer equals the send buffer byte for byte.
pub fn transfer(plugin: &Plugin, sizes: &[usize], window: usize) -> Vec<Received> {
    let total: usize = sizes.iter().sum();
    let data = pattern(total, sizes.len() as u64 + total as u64);
    let offsets: Vec<usize> = sizes
        .iter()
        .scan(0, |off, &s| {
            let o = *off;
            *off += s;
            Some(o)
        })
        .collect();
    let mut listen = plugin.listen(0, 1, host_ctx()).expect("listen");
    let handle = listen.handle().clone();
    let received = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut send = plugin
                .connect(0, &handle, 1, host_ctx(), deadline())
                .expect("connect");
            let src = send.register(host_buffer(&data)).expect("register source");
            for (&off, &len) in offsets.iter().zip(sizes) {
                while send.in_flight() >= window {
                    send.wait(deadline()).expect("send completes");
                }
                while send.isend(&src, off, len, 0).expect("isend").is_none() {
                    send.wait(deadline()).expect("send completes");
                }
            }
            while send.in_flight() > 0 {
                send.wait(deadline()).expect("send completes");
            }
        });
        let mut recv = listen.accept(deadline()).expect("accept");
        let dst_buf = HostBuffer::new(total.max(1)).expect("destination");
        let dst = recv
            .register(Arc::clone(&dst_buf))
            .expect("register destination");
        let mut received = Vec::new();
        let mut next = 0;
        while received.len() < sizes.len() {
            while next < sizes.len() && recv.in_flight() < window {
                match recv
                    .irecv(&dst, offsets[next], sizes[next], 0)
                    .expect("irecv")
                {
                    Some(id) => assert_eq!(id.0 as usize, next, "requests numbered in order"),
                    None => break,
                }
                next += 1;
            }
            let done = recv.wait(deadline()).expect("receive completes");
            assert_eq!(
                done.id.0 as usize,
                received.len(),
                "receives complete in FIFO order"
            );
            received.push(Received {
                size: done.size,
                fragments: done.fragments,
            });
        }
        sender.join().expect("sender thread");
        drop(dst);
        let got = dst_buf.span_all().expect("all receives handed back");
        if total > 0 {
            let first_bad = got.iter().zip(&data).position(|(a, b)| a != b);
            assert_eq!(first_bad, None, "received bytes differ from the sent ones");
        }
        received
    });
    received
}
