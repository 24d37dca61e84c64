//! The netplugin backend through a real plugin: `tcpx-test-plugin` (built from this workspace)
//! moving bytes over loopback TCP, in host mode and in TCPX-like unpack mode, driven by the same
//! schedule driver and transfer shapes as the socket backend's tests.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::{fill_pattern, verify_pattern};
use tcpx_sched::Assignment;
use tcpx_test_support::test_plugin_so;
use tcpx_transport::netplugin::{NetPluginConfig, NetPluginTransport};
use tcpx_transport::{HostBuffer, Memory, Transport, TransportError};

use common::{comms, soon};

/// A netplugin transport on a fresh copy of the test plugin (its own init, mode and faults).
fn transport(mode: &str, faults: &str) -> Arc<NetPluginTransport> {
    static COPY: AtomicUsize = AtomicUsize::new(0);
    let n = COPY.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tcpx-transport-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join(format!("libnccl-net-t{n}.so"));
    std::fs::copy(test_plugin_so(), &copy).unwrap();
    let t = NetPluginTransport::new(NetPluginConfig {
        plugin: Some(copy.to_str().unwrap().to_string()),
        dev: 0,
        env: vec![
            ("TCPX_TEST_PLUGIN_MODE".into(), mode.into()),
            ("TCPX_TEST_PLUGIN_FAULT".into(), faults.into()),
        ],
    })
    .unwrap();
    // The mapping stays after the file is gone.
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(t)
}

/// One transfer through the shared driver; the receive buffer must equal the sent pattern.
fn run_transfer(
    t: Arc<NetPluginTransport>,
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    assignment: Assignment,
) -> Result<(), TransportError> {
    let cfg = common::schedule(size, chunk, window, channels, assignment);
    common::transfer_on(&*t, cfg, Duration::from_secs(20))
}

#[test]
fn host_mode_one_channel_byte_exact() {
    run_transfer(
        transport("host", ""),
        1 << 20,
        64 << 10,
        4,
        1,
        Assignment::RoundRobin,
    )
    .unwrap();
}

/// `total` bytes in `chunk`s over three channels, then 3 MiB in 300,000-byte chunks (the last
/// one short) over two channels weighted 3:1; both byte exact.
fn many_channels_byte_exact(mode: &str, total: usize, chunk: u64, window: usize) {
    let t = transport(mode, "");
    run_transfer(t.clone(), total, chunk, window, 3, Assignment::RoundRobin).unwrap();
    run_transfer(t, 3 << 20, 300_000, 2, 2, Assignment::Weighted(vec![3, 1])).unwrap();
}

#[test]
fn host_mode_many_channels_odd_sizes_byte_exact() {
    many_channels_byte_exact("host", (12 << 20) + 12345, 1 << 20, 3);
}

#[test]
fn unpack_mode_one_channel_byte_exact() {
    let t = transport("unpack", "");
    assert_eq!(t.limits().max_request_bytes, 4 << 20);
    assert_eq!(t.limits().max_requests, 16);
    run_transfer(t, 1 << 20, 64 << 10, 4, 1, Assignment::RoundRobin).unwrap();
}

#[test]
fn unpack_mode_many_channels_full_4_mib_chunks_byte_exact() {
    many_channels_byte_exact("unpack", (24 << 20) + 12345, 4 << 20, 16);
}

#[test]
fn unpack_mode_refuses_chunks_over_4_mib_by_name() {
    let t = transport("unpack", "");
    let (mut send, mut recv) = comms(&*t, 1);
    let dst = HostBuffer::new(8 << 20).unwrap();
    let rmr = recv[0].reg_mr(&Memory::Host(dst)).unwrap();
    let err = recv[0].irecv(rmr, 0, (4 << 20) + 4096, 0).unwrap_err();
    assert!(matches!(err, TransportError::Usage(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("4194304 bytes one irecv may carry"),
        "{err}"
    );
    drop(send.pop());
}

#[test]
fn requests_may_be_tested_in_any_order() {
    let t = transport("host", "");
    let (mut send, mut recv) = comms(&*t, 1);
    let (send, recv) = (&mut send[0], &mut recv[0]);
    let src = HostBuffer::new(3 * 4096).unwrap();
    let dst = HostBuffer::new(3 * 4096).unwrap();
    fill_pattern(&mut src.span_all().unwrap(), 5, 0);
    let smr = send.reg_mr(&Memory::Host(src)).unwrap();
    let rmr = recv.reg_mr(&Memory::Host(dst.clone())).unwrap();
    let r: Vec<_> = (0..3)
        .map(|i| recv.irecv(rmr, i * 4096, 4096, 0).unwrap().unwrap())
        .collect();
    let s: Vec<_> = (0..3)
        .map(|i| send.isend(smr, i * 4096, 4096, 0).unwrap().unwrap())
        .collect();
    // Ask about the newest first: the plugin is only ever asked about its oldest.
    let deadline = soon();
    for (comm_reqs, is_send) in [(&s, true), (&r, false)] {
        for &req in comm_reqs.iter().rev() {
            loop {
                let done = if is_send {
                    send.test(req).unwrap()
                } else {
                    recv.test(req).unwrap()
                };
                if let Some(n) = done {
                    assert_eq!(n, 4096);
                    break;
                }
                assert!(Instant::now() < deadline, "request {req:?} never finished");
            }
        }
    }
    let err = recv.consume(r[1]).unwrap_err();
    assert!(err.to_string().contains("out of FIFO order"), "{err}");
    for &req in &r {
        recv.consume(req).unwrap();
    }
    assert_eq!(verify_pattern(&dst.span_all().unwrap(), 5, 0), None);
}

#[test]
fn plugin_errors_surface_with_their_names() {
    let t = transport("host", "isend:3");
    let (mut send, _recv) = comms(&*t, 1);
    let src = HostBuffer::new(4096).unwrap();
    let smr = send[0].reg_mr(&Memory::Host(src)).unwrap();
    let err = send[0].isend(smr, 0, 4096, 0).unwrap_err().to_string();
    assert!(
        err.contains("internal error (3) from isend on comm"),
        "{err}"
    );
}

#[test]
fn open_without_a_plugin_says_what_is_missing() {
    // No NCCL_NET_PLUGIN here and no libnccl-net.so on this machine.
    if std::env::var_os("NCCL_NET_PLUGIN").is_some() {
        println!("SKIP: NCCL_NET_PLUGIN is set in this environment");
        return;
    }
    match tcpx_transport::open("netplugin", Default::default()) {
        Err(TransportError::Unavailable { name, reason }) => {
            assert_eq!(name, "netplugin");
            assert!(reason.contains("libnccl-net.so"), "{reason}");
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => println!("SKIP: a libnccl-net.so is installed here"),
    }
}

#[test]
fn an_opened_plugin_keeps_within_what_its_capabilities_said_before_opening() {
    use tcpx_transport::registry::Backend;
    let before = tcpx_transport::registry::limits(Backend::NetPlugin);
    for mode in ["host", "unpack"] {
        let opened = transport(mode, "").limits();
        assert_eq!(opened.max_requests, before.max_requests, "{mode}");
        assert!(
            opened.max_request_bytes <= before.max_request_bytes,
            "{mode}"
        );
        assert_eq!(opened.memory, before.memory, "{mode}");
    }
    let t = transport("host", "");
    // It places its NICs itself: a channel cannot be bound to an address.
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    match t.listen_on(local) {
        Err(TransportError::Unavailable { reason, .. }) => {
            assert!(reason.contains("leave --nics out"), "{reason}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("the netplugin backend bound a channel to {local}"),
    }
}
