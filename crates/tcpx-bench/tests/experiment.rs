//! Whole experiments over loopback, in process: results, verification, and refusals.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tcpx_bench::{
    bind_control, run_client, run_local, run_server, BenchError, Experiment, Measurement,
};

mod common;
use common::loopback;

fn small() -> Experiment {
    Experiment {
        sizes: vec![1 << 20, (3 << 20) + 4096],
        ..common::two_flows("t")
    }
}

#[test]
fn local_run_verifies_every_byte_and_reports_each_size() {
    let exp = small();
    let mut seen = Vec::new();
    let out = run_local(&exp, loopback(), &mut |m: &Measurement| seen.push(m.size)).unwrap();
    assert_eq!(seen, exp.sizes, "progress told about every size in order");
    assert_eq!(out.measurements.len(), 2);
    for m in &out.measurements {
        assert_eq!(m.recv.wrong_bytes, Some(0));
        assert_eq!(m.send.wrong_bytes, None);
        assert!(m.send.algbw_gbs > 0.0 && m.recv.algbw_gbs > 0.0);
        assert!(m.send.p50_us <= m.send.p99_us && m.send.min_us <= m.send.p50_us);
    }
}

#[test]
fn verification_off_reports_not_checked() {
    let exp = Experiment {
        verify: false,
        flows: 1,
        ..small()
    };
    let out = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap();
    assert!(out
        .measurements
        .iter()
        .all(|m| m.recv.wrong_bytes.is_none()));
}

fn server_client(
    server: Experiment,
    client: Experiment,
) -> (
    Result<tcpx_bench::Outcome, BenchError>,
    Result<tcpx_bench::Outcome, BenchError>,
) {
    let listener = bind_control(loopback()).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|s| {
        let srv = s.spawn(move || run_server(&server, listener, &mut |_: &Measurement| {}));
        let cli = run_client(&client, addr, &mut |_: &Measurement| {});
        (srv.join().unwrap(), cli)
    })
}

#[test]
fn both_sides_agree_on_the_results() {
    let exp = Experiment {
        flows: 1,
        ..small()
    };
    let (s, c) = server_client(exp.clone(), exp);
    let (s, c) = (s.unwrap(), c.unwrap());
    assert_eq!(s.measurements, c.measurements);
}

#[test]
fn mismatched_settings_are_refused_with_both_values() {
    let (s, c) = server_client(
        small(),
        Experiment {
            channels: 3,
            window: Some(8),
            ..small()
        },
    );
    for e in [s.unwrap_err(), c.unwrap_err()] {
        let msg = e.to_string();
        assert!(matches!(e, BenchError::Mismatch(_)), "{msg}");
        assert!(
            msg.contains("channels: 2 vs 3") && msg.contains("window: 4 vs 8"),
            "{msg}"
        );
    }
}

#[test]
fn unreachable_server_fails_at_the_deadline_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let exp = Experiment {
        timeout_s: 0.5,
        ..small()
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t0 = Instant::now();
    let e = run_client(&exp, addr, &mut |_: &Measurement| {})
        .unwrap_err()
        .to_string();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        e.contains(&addr.to_string()) && e.contains("experiment 't'"),
        "{e}"
    );
}

#[test]
fn server_without_client_gives_up_at_the_deadline() {
    let exp = Experiment {
        timeout_s: 0.3,
        ..small()
    };
    let e = run_server(
        &exp,
        bind_control(loopback()).unwrap(),
        &mut |_: &Measurement| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no client connected"), "{e}");
}

#[test]
fn port_in_use_and_bad_values_are_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let e = bind_control(taken.local_addr().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("in use") && e.contains("--port"), "{e}");
    let bad = Experiment {
        chunk: Some(8 << 20),
        ..small()
    };
    let e = run_local(&bad, loopback(), &mut |_: &Measurement| {}).unwrap_err();
    assert!(
        matches!(e, BenchError::Invalid(_))
            && e.to_string().contains("larger than the message size"),
        "{e}"
    );
    let bad = Experiment {
        window: Some(33),
        ..small()
    };
    let e = run_local(&bad, loopback(), &mut |_: &Measurement| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("window 33") && e.contains("socket"), "{e}");
    // An unknown transport cannot be an experiment's: it is refused where it is read.
    let e = "carrier-pigeon"
        .parse::<tcpx_bench::Backend>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown transport `carrier-pigeon`"), "{e}");
}

#[test]
fn pinning_is_read_back_reported_and_undone() {
    let before = tcpx_affinity::current_thread_affinity().unwrap();
    let cpu = before.first().unwrap().to_string();
    let exp = Experiment {
        flows: 1,
        send_cpus: Some(cpu.parse().unwrap()),
        recv_cpus: Some(cpu.parse().unwrap()),
        ..small()
    };
    let out = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap();
    for m in &out.measurements {
        for s in [&m.send, &m.recv] {
            let p = s.pinning.as_ref().expect("pinning reported");
            assert_eq!(
                (p.expected.as_str(), p.actual.as_str()),
                (cpu.as_str(), cpu.as_str())
            );
        }
    }
    assert_eq!(
        tcpx_affinity::current_thread_affinity().unwrap(),
        before,
        "the caller's mask is restored"
    );
}

#[test]
fn pinning_to_a_cpu_the_machine_lacks_is_a_clear_error() {
    let exp = Experiment {
        flows: 1,
        send_cpus: Some("1000".parse().unwrap()),
        ..small()
    };
    // Refused before anything starts (not after the whole timeout), naming the flag and CPU.
    let e = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap_err();
    assert!(matches!(e, BenchError::Invalid(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("--send-cpus `1000`") && e.contains("cpu(s) 1000"),
        "{e}"
    );
    // A list that is no cpu list cannot be an experiment's: it is refused where it is read.
    let e = tcpx_bench::flags::cpus("recv-cpus", Some("3-1")).unwrap_err();
    assert!(e.starts_with("--recv-cpus `3-1`"), "{e}");
}

#[test]
fn sampling_reports_the_cpu_cost_of_the_timed_iterations() {
    let exp = Experiment {
        flows: 1,
        sizes: vec![8 << 20],
        iters: 5,
        sample_ms: Some(20),
        ..small()
    };
    let out = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap();
    let c = out.measurements[0]
        .send
        .cpu
        .as_ref()
        .expect("send side sampled");
    assert!(c.samples >= 2, "{c:?}");
    assert!(
        c.process_cpu_s.unwrap() > 0.0 && c.cpu_s_per_gb.unwrap() > 0.0,
        "{c:?}"
    );
    assert!(
        out.measurements[0].recv.cpu.is_some(),
        "the receiver's cost came over the control connection"
    );
    assert_eq!(out.samples.len(), 1, "raw samples of this side kept");
    assert!(out.samples[0].1.rows.iter().any(|r| r.source == "cpu"));
}

/// The `zero_copy_min` knob end to end over loopback: pieces at or above it go out with
/// MSG_ZEROCOPY and every received byte is still what was sent; the experiment's JSON carries the
/// knob only when it is set, so experiments without it read and print as before.
#[test]
fn zero_copy_sends_verify_byte_exact() {
    let exp = Experiment {
        zero_copy_min: Some(64 << 10),
        ..small()
    };
    let out = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap();
    assert_eq!(out.measurements.len(), 2);
    for m in &out.measurements {
        assert_eq!(m.recv.wrong_bytes, Some(0), "size {}", m.size);
    }
    let json = serde_json::to_value(&exp).unwrap();
    assert_eq!(json["zero_copy_min"], 65536);
    let plain = serde_json::to_value(small()).unwrap();
    assert!(plain.get("zero_copy_min").is_none(), "{plain}");
    let e = Experiment {
        zero_copy_min: Some(100),
        ..small()
    };
    assert!(e.validate(None).unwrap_err().contains("zero-copy-min 100"));
}

/// `staging_ring`: carried in the experiment's JSON only when set; out of range, or smaller
/// than a chunk, refused before anything runs with both sizes named.
#[test]
fn a_staging_ring_is_checked_against_its_range_and_the_chunk() {
    let ring = Experiment {
        staging_ring: Some(1 << 20),
        chunk: Some(256 << 10),
        ..small()
    };
    assert_eq!(ring.validate(None), Ok(()));
    assert_eq!(
        serde_json::to_value(&ring).unwrap()["staging_ring"],
        1 << 20
    );
    let plain = serde_json::to_value(small()).unwrap();
    assert!(plain.get("staging_ring").is_none(), "{plain}");
    let tiny = Experiment {
        staging_ring: Some(4096),
        ..small()
    };
    assert!(tiny
        .validate(None)
        .unwrap_err()
        .contains("staging-ring 4096"));
    let short = Experiment {
        staging_ring: Some(128 << 10),
        chunk: Some(256 << 10),
        ..small()
    };
    let err = short.validate(None).unwrap_err();
    assert!(
        err.contains("chunk 256K") && err.contains("staging-ring 128K"),
        "{err}"
    );
    // Without a chunk, the default one of the largest message (512K) must fit too.
    let auto_chunk = Experiment {
        staging_ring: Some(128 << 10),
        chunk: None,
        ..small()
    };
    let err = auto_chunk.validate(None).unwrap_err();
    assert!(
        err.contains("chunk 512K") && err.contains("staging-ring 128K"),
        "{err}"
    );
}

/// The staging ring left at auto: four of the largest chunk, at least 32 MiB, no larger than
/// the largest message, never smaller than a chunk; a given ring is used as it is.
#[test]
fn an_auto_staging_ring_holds_four_chunks_within_the_message() {
    const M: u64 = 1 << 20;
    let ring = |sizes: &[u64], chunk: Option<u64>, staging_ring: Option<u64>| {
        Experiment {
            sizes: sizes.to_vec(),
            chunk,
            staging_ring,
            ..small()
        }
        .staging_ring_bytes()
    };
    assert_eq!(ring(&[256 * M], Some(8 * M), None), 32 * M);
    assert_eq!(ring(&[M, 1024 * M], Some(16 * M), None), 64 * M);
    // 512 KiB default chunks of a 1 MiB message: the message bounds the ring.
    assert_eq!(ring(&[M], None, None), M);
    // One chunk per message: the ring is the message.
    assert_eq!(ring(&[256 * M], Some(256 * M), None), 256 * M);
    assert_eq!(ring(&[256 * M], Some(8 * M), Some(3 * M)), 3 * M);
}

/// `barrier: size` between two sides: the timed iterations go back to back as one transfer,
/// every iteration still gets its own time, every byte of every iteration crosses a socket,
/// and the received bytes are what was sent.
#[test]
fn a_per_size_barrier_times_each_back_to_back_iteration_and_verifies() {
    let exp = Experiment {
        barrier: tcpx_model::Barrier::Size,
        iters: 6,
        ..small()
    };
    let (s, c) = server_client(exp.clone(), exp.clone());
    let (s, c) = (s.unwrap(), c.unwrap());
    assert_eq!(s.measurements, c.measurements);
    for m in &s.measurements {
        assert_eq!(m.recv.wrong_bytes, Some(0), "size {}", m.size);
        for side in [&m.send, &m.recv] {
            assert_eq!(side.iter_us.len(), 6, "one time per iteration");
            assert!(side.iter_us.iter().all(|&t| t > 0.0), "{:?}", side.iter_us);
            // The timed iterations' bytes, every one of them, crossed the sockets.
            let moved: u64 = side.sockets.iter().map(|s| s.bytes).sum();
            assert_eq!(moved, m.size * 6 * u64::from(exp.flows), "size {}", m.size);
        }
    }
    let json = serde_json::to_value(&exp).unwrap();
    assert_eq!(json["barrier"], "size");
    assert!(serde_json::to_value(small())
        .unwrap()
        .get("barrier")
        .is_none());
}
