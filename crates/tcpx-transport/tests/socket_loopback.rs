//! The socket backend over real loopback sockets: byte-exact transfers through the shared driver and
//! the endpoint API, and the faults a user meets (peer gone, nobody listening, mismatched settings).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::{fill_pattern, verify_pattern};
use tcpx_sched::Assignment;
use tcpx_transport::driver::connect_in_process;
use tcpx_transport::endpoint::{Endpoint, EndpointConfig};
use tcpx_transport::socket::{Pieces, SocketConfig, SocketTransport};
use tcpx_transport::{HostBuffer, Memory, Transport, TransportError};

use common::{comms, soon};

fn transport(socks: usize) -> Arc<SocketTransport> {
    Arc::new(
        SocketTransport::new(SocketConfig {
            socks,
            ..SocketConfig::default()
        })
        .unwrap(),
    )
}

fn run_transfer(
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    socks: usize,
    assignment: Assignment,
) {
    run_transfer_with(size, chunk, window, channels, transport(socks), assignment)
}

fn run_transfer_with(
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    t: Arc<SocketTransport>,
    assignment: Assignment,
) {
    let cfg = common::schedule(size, chunk, window, channels, assignment);
    common::transfer_on(&*t, cfg, Duration::from_secs(10)).unwrap();
}

#[test]
fn one_channel_one_socket_byte_exact() {
    run_transfer(1 << 20, 64 << 10, 4, 1, 1, Assignment::RoundRobin);
}

#[test]
fn many_channels_many_sockets_odd_sizes_byte_exact() {
    run_transfer((12 << 20) + 12345, 1 << 20, 3, 3, 4, Assignment::RoundRobin);
    run_transfer(3 << 20, 300_000, 2, 2, 3, Assignment::Weighted(vec![3, 1]));
}

/// `driver::connect_in_process` between two transports opens one comm per channel, each end on
/// loopback, paired channel by channel: a transfer over all of them arrives byte-exact.
#[test]
fn comms_opened_in_process_between_two_transports_pair_up_channel_by_channel() {
    let (st, rt) = (transport(2), transport(2));
    let comms = connect_in_process(&*st, &*rt, 3, soon()).unwrap();
    assert_eq!(
        (comms.0.len(), comms.1.len()),
        (3, 3),
        "one comm per channel"
    );
    for (send, recv) in comms.0.iter().zip(&comms.1) {
        assert!(send.peer().starts_with("127.0.0.1:"), "{}", send.peer());
        assert!(recv.peer().starts_with("127.0.0.1:"), "{}", recv.peer());
    }
    let cfg = common::schedule((1 << 20) + 7, 64 << 10, 2, 3, Assignment::RoundRobin);
    common::transfer((&*st, &*rt), comms, cfg, Duration::from_secs(10)).unwrap();
}

/// `socks` sockets per comm moved by `threads` worker threads (0: the default choice).
fn transport_with(socks: usize, threads: usize) -> Arc<SocketTransport> {
    let t = SocketTransport::new(SocketConfig {
        socks,
        ..SocketConfig::default()
    })
    .unwrap()
    .with_pieces(Pieces {
        threads,
        ..Pieces::default()
    })
    .unwrap();
    Arc::new(t)
}

/// 16 sockets with requests of several pieces over a deep window: every request's pieces are
/// taken by whichever sockets are free, across requests, and every byte lands where it belongs.
#[test]
fn sixteen_sockets_pieces_taken_across_requests_byte_exact() {
    // 8 MiB requests are four 2 MiB pieces each, so sockets race for them.
    let t = transport_with(16, 3);
    run_transfer_with((48 << 20) + 4097, 8 << 20, 16, 1, t, Assignment::RoundRobin);
    // Requests of one piece: each on the one socket that takes it.
    let t = transport_with(16, 16);
    run_transfer_with(
        (16 << 20) + 12345,
        512 << 10,
        8,
        2,
        t,
        Assignment::RoundRobin,
    );
}

/// Threads multiplexing sockets through the driver, every byte checked: eight sockets on two
/// threads (each thread moving four on `poll`, as a host of 16 CPUs or more does by default) at
/// deeper and shallower windows than there are sockets and over several channels, and sixteen
/// sockets on four threads with requests of several pieces each.
#[test]
fn threads_multiplexing_sockets_byte_exact() {
    run_transfer_with(
        (24 << 20) + 4097,
        1 << 20,
        16,
        1,
        transport_with(8, 2),
        Assignment::RoundRobin,
    );
    run_transfer_with(
        (6 << 20) + 1,
        256 << 10,
        3,
        2,
        transport_with(8, 2),
        Assignment::RoundRobin,
    );
    run_transfer_with(
        (5 << 20) + 999,
        10_000,
        8,
        1,
        transport_with(4, 0),
        Assignment::RoundRobin,
    );
    run_transfer_with(
        16 << 20,
        8 << 20,
        2,
        1,
        transport_with(16, 4),
        Assignment::RoundRobin,
    );
}

/// Sockets sharing a thread: the sender going away mid-request fails the receive (naming the
/// peer) instead of hanging, and dropping the comms ends every worker thread (the test returns).
#[test]
fn shared_threads_report_a_vanished_peer_and_shut_down() {
    let t = transport_with(4, 2);
    let (mut send, mut recv) = comms(&*t, 1);
    let src = HostBuffer::new(8 << 20).unwrap();
    let dst = HostBuffer::new(8 << 20).unwrap();
    let smr = send[0].reg_mr(&Memory::Host(src)).unwrap();
    let rmr = recv[0].reg_mr(&Memory::Host(dst)).unwrap();
    // One whole request, then half of the next one's bytes never come: the sender goes away.
    let s1 = send[0].isend(smr, 0, 4 << 20, 0).unwrap().unwrap();
    let r1 = recv[0].irecv(rmr, 0, 4 << 20, 0).unwrap().unwrap();
    let r2 = recv[0].irecv(rmr, 4 << 20, 4 << 20, 0).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = None;
    while got.is_none() && Instant::now() < deadline {
        let seen = t.activity();
        got = recv[0].test(r1).unwrap();
        if got.is_none() {
            t.wait_activity(seen, Duration::from_millis(50));
        }
    }
    assert_eq!(got, Some(4 << 20), "the first request arrives whole");
    while send[0].test(s1).unwrap().is_none() && Instant::now() < deadline {
        let seen = t.activity();
        t.wait_activity(seen, Duration::from_millis(50));
    }
    recv[0].consume(r1).unwrap();
    drop(send);
    let err = loop {
        let seen = t.activity();
        match recv[0].test(r2) {
            Err(e) => break e.to_string(),
            Ok(Some(_)) => panic!("a receive completed without a sender"),
            Ok(None) => {
                assert!(
                    Instant::now() < deadline,
                    "no error 10 s after the peer left"
                );
                t.wait_activity(seen, Duration::from_millis(50));
            }
        }
    };
    assert!(err.contains("closed the connection"), "{err}");
    drop(recv);
}

#[test]
fn piece_settings_out_of_range_are_refused() {
    let t = SocketTransport::new(SocketConfig::default()).unwrap();
    let e = t
        .with_pieces(Pieces {
            threads: 65,
            ..Pieces::default()
        })
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("threads take 0 (automatic) to 64"),
        "{e}"
    );
}

#[test]
fn limits_are_refused_with_the_number() {
    let e = SocketTransport::new(SocketConfig {
        socks: 0,
        ..SocketConfig::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("1 to 64"), "{e}");
    let t: Arc<dyn Transport> = transport(1);
    let e = Endpoint::new(
        t,
        EndpointConfig {
            window: 33,
            ..EndpointConfig::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("window 33") && e.to_string().contains("32 requests"),
        "{e}"
    );
}

#[test]
fn connect_to_nobody_retries_until_the_deadline() {
    // Bind and drop a listener to get a port that nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t: Arc<dyn Transport> = transport(1);
    let ep = Endpoint::new(t, EndpointConfig::default()).unwrap();
    let started = Instant::now();
    let e = ep
        .connect(
            format!("127.0.0.1:{port}").parse().unwrap(),
            Instant::now() + Duration::from_millis(400),
        )
        .err()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert!(started.elapsed() < Duration::from_secs(5), "deadline kept");
    let msg = e.to_string();
    assert!(matches!(e, TransportError::Timeout { .. }), "{msg}");
    assert!(
        msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("attempts"),
        "{msg}"
    );
}

#[test]
fn port_in_use_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut ep = Endpoint::new(
        transport(1) as Arc<dyn Transport>,
        EndpointConfig::default(),
    )
    .unwrap();
    let e = ep.listen(addr).err().unwrap().to_string();
    assert!(
        e.contains(&addr.port().to_string()) && e.contains("in use"),
        "{e}"
    );
}

/// A stranger whose first bytes frame something small that is not an endpoint greeting is
/// dropped like any other stray: the accept goes on and the real peer gets through.
#[test]
fn a_framed_stranger_does_not_end_an_accept() {
    use std::io::Write;
    let mut server = Endpoint::new(
        transport(2) as Arc<dyn Transport>,
        EndpointConfig::default(),
    )
    .unwrap();
    let addr = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut stranger = std::net::TcpStream::connect(addr).unwrap();
    stranger
        .write_all(&[5, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'])
        .unwrap();
    let client = Endpoint::new(
        transport(2) as Arc<dyn Transport>,
        EndpointConfig::default(),
    )
    .unwrap();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| server.accept(soon()));
        let b = client.connect(addr, soon());
        (a.join().unwrap(), b)
    });
    assert!(a.is_ok(), "{:?}", a.err());
    assert!(b.is_ok(), "{:?}", b.err());
    drop(stranger);
}

fn pair(
    cfg_a: EndpointConfig,
    cfg_b: EndpointConfig,
) -> (
    Result<tcpx_transport::endpoint::Conn, TransportError>,
    Result<tcpx_transport::endpoint::Conn, TransportError>,
) {
    let mut server = Endpoint::new(transport(2) as Arc<dyn Transport>, cfg_a).unwrap();
    let addr = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let client = Endpoint::new(transport(2) as Arc<dyn Transport>, cfg_b).unwrap();
    std::thread::scope(|s| {
        let a = s.spawn(|| server.accept(soon()));
        let b = client.connect(addr, soon());
        (a.join().unwrap(), b)
    })
}

#[test]
fn endpoint_moves_bytes_both_ways_sync_async_and_vectored() {
    let (a, b) = pair(EndpointConfig::default(), EndpointConfig::default());
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    let n = 3 << 20;
    let abuf = HostBuffer::new(2 * n).unwrap();
    let bbuf = HostBuffer::new(2 * n).unwrap();
    fill_pattern(&mut abuf.span(0, n).unwrap(), 1, 0);
    fill_pattern(&mut bbuf.span(n, n).unwrap(), 2, 0);
    let amr = a.reg(Memory::Host(abuf.clone())).unwrap();
    let bmr = b.reg(Memory::Host(bbuf.clone())).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // a -> b synchronously, then b -> a as three pieces received in one recvv.
            a.send(amr, 0, n).unwrap();
            let got = a
                .recvv(&[
                    (amr, n, 1 << 20),
                    (amr, n + (1 << 20), 1 << 20),
                    (amr, n + (2 << 20), 1 << 20),
                ])
                .unwrap();
            assert_eq!(got, n as u64);
        });
        assert_eq!(b.recv(bmr, 0, n).unwrap(), n as u64);
        let id = b
            .sendv_async(&[(bmr, n, 1 << 20), (bmr, n + (1 << 20), 2 << 20)])
            .unwrap();
        // poll is non-blocking; wait finishes what poll did not.
        let sent = match b.poll(id).unwrap() {
            Some(n) => n,
            None => b.wait(id).unwrap(),
        };
        assert_eq!(sent, n as u64);
    });
    assert_eq!(verify_pattern(&bbuf.span(0, n).unwrap(), 1, 0), None);
    assert_eq!(verify_pattern(&abuf.span(n, n).unwrap(), 2, 0), None);
}

#[test]
fn endpoint_settings_mismatch_shows_both_values() {
    let (a, b) = pair(
        EndpointConfig::default(),
        EndpointConfig {
            chunk: 1 << 20,
            ..EndpointConfig::default()
        },
    );
    let e = a.err().unwrap().to_string();
    assert!(
        e.contains("chunk=524288") && e.contains("chunk=1048576"),
        "{e}"
    );
    assert!(b.is_err());
}

#[test]
fn peer_closing_mid_transfer_is_an_error_naming_the_peer() {
    let cfg = EndpointConfig {
        stall: Duration::from_secs(5),
        ..EndpointConfig::default()
    };
    let (a, b) = pair(cfg.clone(), cfg);
    let (mut a, b) = (a.unwrap(), b.unwrap());
    let peer = a.peer().to_string();
    let buf = HostBuffer::new(8 << 20).unwrap();
    let mr = a.reg(Memory::Host(buf)).unwrap();
    // The sender goes away without sending anything: the receive must fail, not hang.
    drop(b);
    let started = Instant::now();
    let e = a.recv(mr, 0, 8 << 20).err().unwrap().to_string();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failed before the stall deadline: {e}"
    );
    assert!(e.contains("closed the connection"), "{e}");
    assert!(e.contains(peer.split(':').next().unwrap()), "{e}");
}

#[test]
fn short_receive_region_is_an_error_not_an_overrun() {
    let t = transport(1);
    let (mut send, mut recv) = comms(&*t, 1);
    let src = HostBuffer::new(8192).unwrap();
    let dst = HostBuffer::new(8192).unwrap();
    let smr = send[0].reg_mr(&Memory::Host(src)).unwrap();
    let rmr = recv[0].reg_mr(&Memory::Host(dst.clone())).unwrap();
    let r = recv[0].irecv(rmr, 0, 4096, 0).unwrap().unwrap();
    let s = send[0].isend(smr, 0, 8192, 0).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        match recv[0].test(r) {
            Err(e) => break e.to_string(),
            Ok(Some(_)) => panic!("an 8192-byte message fit a 4096-byte receive"),
            Ok(None) => {
                assert!(Instant::now() < deadline, "no error within 5 s");
                let seen = t.activity();
                t.wait_activity(seen, Duration::from_millis(50));
            }
        }
    };
    assert!(err.contains("8192") && err.contains("4096"), "{err}");
    let _ = send[0].test(s);
    // Whatever happened, the destination was not written beyond the receive.
    assert!(dst.span(4096, 4096).unwrap().iter().all(|&b| b == 0));
}

/// Zero-copy sends (`MSG_ZEROCOPY`) over loopback: the bytes arrive exactly, and every lent call's
/// completion was read off the error queue before its request was reported done (loopback
/// completes them by copying, but the notification still comes). Pieces below the threshold
/// are copied as before.
#[test]
fn zero_copy_sends_arrive_byte_exact_and_every_lent_call_completes() {
    use std::sync::atomic::Ordering;
    let zero_copy = |min: usize| {
        Arc::new(
            SocketTransport::new(SocketConfig {
                socks: 2,
                zero_copy_min: Some(min),
                ..SocketConfig::default()
            })
            .unwrap(),
        )
    };
    let t = zero_copy(64 << 10);
    run_transfer_with(
        (8 << 20) + 12345,
        1 << 20,
        4,
        2,
        Arc::clone(&t),
        Assignment::RoundRobin,
    );
    let z = t.zero_copy_stats();
    let calls = z.calls.load(Ordering::Relaxed);
    assert!(
        calls > 0,
        "pieces at or above the threshold went out zero-copy"
    );
    assert_eq!(
        z.completed.load(Ordering::Relaxed),
        calls,
        "a request finished before the kernel gave back its pages"
    );
    let above = zero_copy(1 << 30);
    run_transfer_with(
        4 << 20,
        1 << 20,
        4,
        1,
        Arc::clone(&above),
        Assignment::RoundRobin,
    );
    assert_eq!(above.zero_copy_stats().calls.load(Ordering::Relaxed), 0);
}

/// Waits until every request of `reqs` on `c` is done, by `test`ing them with a deadline.
fn wait_all(
    t: &dyn Transport,
    mut test: impl FnMut(tcpx_transport::RequestId) -> Option<usize>,
    reqs: &[tcpx_transport::RequestId],
) -> Vec<usize> {
    let deadline = soon();
    reqs.iter()
        .map(|&r| loop {
            let seen = t.activity();
            if let Some(n) = test(r) {
                break n;
            }
            assert!(
                Instant::now() < deadline,
                "request {} not done in 20 s",
                r.0
            );
            t.wait_activity(seen, Duration::from_millis(50));
        })
        .collect()
}

/// Per-socket payload counts (`socket_stats`) add up to exactly the bytes moved on both sides,
/// and each receive socket counts what its sending socket sent. A socket has busy time exactly
/// when it carried bytes.
#[test]
fn socket_stats_count_every_payload_byte_once_per_socket() {
    let sizes: [usize; 5] = [(5 << 20) + 17, 3 << 20, 4096, (2 << 20) + 1, 777];
    let t = transport_with(4, 0);
    let (mut send, mut recv) = comms(&*t, 1);
    assert_eq!(
        send[0].socket_stats(),
        Some(vec![tcpx_transport::SocketStat::default(); 4]),
        "a new comm has moved nothing"
    );
    let total: usize = sizes.iter().sum();
    let src = HostBuffer::new(total).unwrap();
    fill_pattern(&mut src.span_all().unwrap(), 21, 0);
    let dst = HostBuffer::new(total).unwrap();
    let smr = send[0].reg_mr(&Memory::Host(src)).unwrap();
    let rmr = recv[0].reg_mr(&Memory::Host(dst.clone())).unwrap();
    let mut offsets = Vec::new();
    let mut at = 0;
    for &n in &sizes {
        offsets.push(at);
        at += n;
    }
    let rreqs: Vec<_> = sizes
        .iter()
        .zip(&offsets)
        .map(|(&n, &o)| recv[0].irecv(rmr, o, n, 0).unwrap().unwrap())
        .collect();
    let sreqs: Vec<_> = sizes
        .iter()
        .zip(&offsets)
        .map(|(&n, &o)| send[0].isend(smr, o, n, 0).unwrap().unwrap())
        .collect();
    let sent = wait_all(&*t, |r| send[0].test(r).unwrap(), &sreqs);
    let got = wait_all(&*t, |r| recv[0].test(r).unwrap(), &rreqs);
    assert_eq!(sent, sizes);
    assert_eq!(got, sizes);
    assert_eq!(
        verify_pattern(&dst.span_all().unwrap(), 21, 0),
        None,
        "bytes landed where sent"
    );
    let bytes = |s: Option<Vec<tcpx_transport::SocketStat>>| -> Vec<u64> {
        let s = s.expect("the socket backend counts");
        for st in &s {
            // A socket that carried bytes held their pieces for some time; an idle one none.
            assert_eq!(st.bytes > 0, st.busy_ns > 0, "{s:?}");
        }
        s.iter().map(|s| s.bytes).collect()
    };
    let pieces = |s: Option<Vec<tcpx_transport::SocketStat>>| -> Vec<u64> {
        s.unwrap().iter().map(|s| s.pieces).collect()
    };
    let (out_pieces, in_pieces) = (
        pieces(send[0].socket_stats()),
        pieces(recv[0].socket_stats()),
    );
    assert_eq!(out_pieces, in_pieces, "pieces on both ends");
    let (out, inn) = (bytes(send[0].socket_stats()), bytes(recv[0].socket_stats()));
    assert_eq!(out.len(), 4);
    assert_eq!(out.iter().sum::<u64>(), total as u64, "{out:?}");
    assert_eq!(out, inn, "each socket's bytes on both ends");
    // Every request is cut into pieces of about 2 MiB: 3 + 2 + 1 + 2 + 1.
    assert_eq!(out_pieces.iter().sum::<u64>(), 9, "{out_pieces:?}");
    for r in rreqs {
        recv[0].consume(r).unwrap();
    }
}

/// Laps: several repetitions of one message as one transfer. Every lap's bytes cross the wire
/// (the sockets count them all), each lands on the message's own bytes, and each side stamps its
/// laps in order.
#[test]
fn laps_repeat_the_message_byte_exact_and_stamp_each_lap() {
    use tcpx_transport::driver::{run_both_sides, Side};
    // An odd size, so every lap ends on a short chunk; more chunks per lap than channels.
    let (size, laps) = ((1 << 20) + 4099, 5u64);
    let t = transport(4);
    let (mut send, mut recv) = comms(&*t, 2);
    let src = HostBuffer::new(size).unwrap();
    fill_pattern(&mut src.span_all().unwrap(), 31, 0);
    let dst = HostBuffer::new(size + common::RECV_OFFSET).unwrap();
    dst.span_all().unwrap().fill(0xEE);
    let smr: Vec<_> = send
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Host(src.clone())).unwrap())
        .collect();
    let rmr: Vec<_> = recv
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Host(dst.clone())).unwrap())
        .collect();
    let cfg = common::schedule(size, 64 << 10, 4, 2, Assignment::RoundRobin);
    let stall = Duration::from_secs(10);
    let (sent, received) = run_both_sides(
        &cfg,
        0,
        laps,
        Side::new(&*t, &mut send, &smr, 0),
        Side::new(&*t, &mut recv, &rmr, common::RECV_OFFSET),
        stall,
    );
    let (sent, received) = (sent.unwrap(), received.unwrap());
    let all = dst.span_all().unwrap();
    assert!(all[..common::RECV_OFFSET].iter().all(|&b| b == 0xEE));
    assert_eq!(verify_pattern(&all[common::RECV_OFFSET..], 31, 0), None);
    for x in [&sent, &received] {
        assert_eq!(x.bytes_done(), size as u64 * laps);
        let ends: Vec<Instant> = x
            .lap_ends()
            .iter()
            .map(|e| e.expect("every lap ends"))
            .collect();
        assert_eq!(ends.len(), laps as usize);
        assert!(ends.windows(2).all(|w| w[0] <= w[1]), "laps end in order");
    }
    let moved = |stats: Vec<Option<Vec<tcpx_transport::SocketStat>>>| -> u64 {
        stats
            .into_iter()
            .flat_map(|s| s.unwrap())
            .map(|s| s.bytes)
            .sum()
    };
    assert_eq!(
        moved(send.iter().map(|c| c.socket_stats()).collect()),
        size as u64 * laps
    );
    assert_eq!(
        moved(recv.iter().map(|c| c.socket_stats()).collect()),
        size as u64 * laps
    );
}

/// The sockets count their system calls, with threads shared between sockets and with a thread
/// per socket: at least one per piece each way, those that would block among them, and every
/// payload byte once.
#[test]
fn system_calls_are_counted_with_shared_and_own_threads() {
    for threads in [2, 4] {
        let t = transport_with(4, threads);
        run_transfer_with((9 << 20) + 333, 1 << 20, 8, 1, t, Assignment::RoundRobin);
        let t = transport_with(4, threads);
        let (mut send, mut recv) = comms(&*t, 1);
        let n = (3 << 20) + 4097;
        let src = HostBuffer::new(n).unwrap();
        fill_pattern(&mut src.span_all().unwrap(), 7, 0);
        let dst = HostBuffer::new(n).unwrap();
        let smr = send[0].reg_mr(&Memory::Host(src)).unwrap();
        let rmr = recv[0].reg_mr(&Memory::Host(dst.clone())).unwrap();
        let r = recv[0].irecv(rmr, 0, n, 0).unwrap().unwrap();
        let s = send[0].isend(smr, 0, n, 0).unwrap().unwrap();
        assert_eq!(wait_all(&*t, |q| send[0].test(q).unwrap(), &[s]), [n]);
        assert_eq!(wait_all(&*t, |q| recv[0].test(q).unwrap(), &[r]), [n]);
        assert_eq!(verify_pattern(&dst.span_all().unwrap(), 7, 0), None);
        for stats in [send[0].socket_stats(), recv[0].socket_stats()] {
            let stats = stats.expect("the socket backend counts");
            let sum = |f: fn(&tcpx_transport::SocketStat) -> u64| stats.iter().map(f).sum::<u64>();
            assert_eq!(sum(|s| s.bytes), n as u64, "{stats:?}");
            assert!(sum(|s| s.calls) >= sum(|s| s.pieces), "{stats:?}");
            assert!(sum(|s| s.blocked_calls) <= sum(|s| s.calls), "{stats:?}");
        }
        recv[0].consume(r).unwrap();
    }
}

/// Receives into a buffer as large as a benchmark's go around the cache (read into the socket's
/// small buffer, copied on with streaming stores); a buffer as large that is marked as read at
/// once (a staging ring) keeps the direct read. Both arrive byte-exact, at an offset and odd
/// sizes, and the bytes around the message stay untouched.
#[test]
fn large_receives_around_the_cache_and_staging_rings_arrive_byte_exact() {
    use tcpx_transport::socket::{around_cache_threshold_here, receives_around_cache};
    let size = around_cache_threshold_here() + 3 * 4099;
    for read_at_once in [false, true] {
        let t = transport_with(4, 2);
        let src = HostBuffer::new(size).unwrap();
        let dst = HostBuffer::new(size + common::RECV_OFFSET + 4096).unwrap();
        if read_at_once {
            dst.mark_read_at_once();
        }
        assert_eq!(
            receives_around_cache(&dst, 4),
            tcpx_gpu::STREAMING_STORES && !read_at_once
        );
        fill_pattern(&mut src.span_all().unwrap(), 29, 0);
        dst.span_all().unwrap().fill(0xEE);
        let cfg = common::schedule(size, (3 << 20) + 5, 6, 2, Assignment::RoundRobin);
        let mut comms = common::comms(&*t, 2);
        common::drive_on(
            (&*t, &*t),
            &mut comms,
            (&Memory::Host(src.clone()), &Memory::Host(dst.clone())),
            cfg,
            common::RECV_OFFSET,
            Duration::from_secs(10),
        )
        .unwrap();
        // The receiving sockets count what came around the cache: all of it, or none.
        let stats: Vec<_> = comms
            .1
            .iter()
            .flat_map(|c| c.socket_stats().unwrap())
            .collect();
        let around: u64 = stats.iter().map(|s| s.around_cache_bytes).sum();
        let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
        assert_eq!(bytes, size as u64);
        let streamed = tcpx_gpu::STREAMING_STORES && !read_at_once;
        assert_eq!(around, if streamed { bytes } else { 0 });
        let all = dst.span_all().unwrap();
        let end = common::RECV_OFFSET + size;
        assert!(all[..common::RECV_OFFSET].iter().all(|&b| b == 0xEE));
        assert!(
            all[end..].iter().all(|&b| b == 0xEE),
            "bytes after the message untouched"
        );
        assert_eq!(verify_pattern(&all[common::RECV_OFFSET..end], 29, 0), None);
    }
}

#[test]
fn only_large_buffers_not_read_at_once_on_several_sockets_are_received_around_the_cache() {
    use tcpx_transport::socket::{
        around_cache_threshold_here, receives_around_cache, AROUND_CACHE_MIN_SOCKETS,
    };
    if !tcpx_gpu::STREAMING_STORES {
        let large = HostBuffer::new(around_cache_threshold_here()).unwrap();
        assert!(
            !receives_around_cache(&large, 16),
            "no streaming stores here"
        );
        return;
    }
    let (threshold, socks) = (around_cache_threshold_here(), AROUND_CACHE_MIN_SOCKETS);
    assert!(!receives_around_cache(
        &HostBuffer::new(threshold - 1).unwrap(),
        socks
    ));
    let large = HostBuffer::new(threshold).unwrap();
    assert!(receives_around_cache(&large, socks));
    assert!(receives_around_cache(&large, 16));
    assert!(
        !receives_around_cache(&large, socks - 1),
        "one thread's CPU is the limit"
    );
    large.mark_read_at_once();
    assert!(!receives_around_cache(&large, socks));
}

/// `worker_cpus = own`: every worker thread of a comm runs on a CPU of its own among those this
/// thread may use (doubling up only when there are more workers than CPUs), the sockets say which,
/// and the bytes still arrive exact; `shared` gives none.
#[test]
fn own_worker_cpus_give_each_worker_thread_its_own_cpu_and_the_sockets_say_which() {
    use tcpx_model::WorkerCpus;
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    let with = |worker_cpus| {
        let t = SocketTransport::new(SocketConfig {
            socks: 4,
            ..SocketConfig::default()
        })
        .unwrap()
        .with_pieces(Pieces {
            threads: 2,
            worker_cpus,
        })
        .unwrap();
        Arc::new(t)
    };
    let t = with(WorkerCpus::Own);
    let pair = comms(&*t, 1);
    for stats in pair
        .0
        .iter()
        .map(|c| c.socket_stats().unwrap())
        .chain(pair.1.iter().map(|c| c.socket_stats().unwrap()))
    {
        let cpus: Vec<u32> = stats
            .iter()
            .map(|s| s.cpu.expect("a CPU per socket"))
            .collect();
        // Sockets 0 and 2 share thread 0, 1 and 3 thread 1.
        assert_eq!((cpus[0], cpus[1]), (cpus[2], cpus[3]), "{cpus:?}");
        if allowed >= 2 {
            assert_ne!(
                cpus[0], cpus[1],
                "two workers of one comm on one CPU: {cpus:?}"
            );
        }
        assert!(cpus.iter().all(|&c| (c as usize) < 1024), "{cpus:?}");
    }
    let cfg = common::schedule((6 << 20) + 3, 1 << 20, 4, 1, Assignment::RoundRobin);
    common::transfer((&*t, &*t), pair, cfg, Duration::from_secs(10)).unwrap();

    let t = with(WorkerCpus::Shared);
    let pair = comms(&*t, 1);
    let stats = pair.0[0].socket_stats().unwrap();
    assert!(stats.iter().all(|s| s.cpu.is_none()), "{stats:?}");
}
