//! The summary's arithmetic and the verdicts on synthetic directories.

mod common;

use common::*;
use tcpx_watch::read::{read_dir, Limits};
use tcpx_watch::record::{ConnCall, Dir};
use tcpx_watch::summary::{summarise, SummaryOptions};
use tcpx_watch::verdict::{verdicts, VerdictKind, VerdictOptions};
use tcpx_watch::{watch, WatchOptions};

const NICS: [&str; 4] = ["eth1", "eth2", "eth3", "eth4"];

#[test]
fn gbps_per_nic_is_bytes_delta_over_time_delta_exactly() {
    let d = tempfile::tempdir().unwrap();
    // One process, two NICs, intervals at t = 0.5, 1.0, 1.5, 2.0 (every 0.5 s).
    let link = |i: u32| format!("{:016x}", 0x10 + i);
    let deltas: [[u64; 2]; 4] = [
        [1 << 20, 3 << 20],
        [5 << 20, 0],
        [2 << 20, 7 << 20],
        [0, 1 << 20],
    ];
    let mut records = vec![start("h", 7, UNIX0, &["eth1", "eth2"])];
    let mut cum = [0u64; 2];
    for (w, delta) in deltas.iter().enumerate() {
        for i in 0..2 {
            cum[i] += delta[i];
        }
        records.push(interval(
            (w + 1) as f64 * 0.5,
            0.5,
            (0..2)
                .map(|i| {
                    comm(
                        i as u64 + 1,
                        Dir::Send,
                        i as u32,
                        &link(i as u32),
                        cum[i],
                        cum[i] >> 20,
                        None,
                        vec![0, cum[i] >> 20],
                    )
                })
                .collect(),
        ));
    }
    write(d.path(), "h", 7, &records);
    let s = summarise(
        &read_dir(d.path(), &Limits::default()).unwrap(),
        &SummaryOptions::default(),
    );
    assert_eq!(s.window_s, 0.5);
    assert_eq!(s.windows, 4);
    assert_eq!(s.origin_unix_s, UNIX0);
    assert_eq!(s.nics.len(), 2);
    for (i, n) in s.nics.iter().enumerate() {
        assert_eq!(n.name, NICS[i]);
        let want: Vec<Option<f64>> = deltas
            .iter()
            .map(|d| Some(d[i] as f64 / 0.5 / 1e9))
            .collect();
        assert_eq!(n.send.gbps_windows, want, "{}", n.name);
        assert_eq!(n.send.bytes, cum[i]);
        assert_eq!(n.send.gbps, Some(cum[i] as f64 / 2.0 / 1e9));
        assert_eq!(n.recv.bytes, 0);
        // Every request in the (1, 2] us bucket: the median interpolates inside it.
        let p = n.send.latency.unwrap();
        assert!(p.p50_us > 1.0 && p.p50_us <= 2.0, "{p:?}");
    }
    // The process's figures are the two NICs' together; each link is its NIC's.
    assert_eq!(s.processes[0].send.bytes, cum[0] + cum[1]);
    assert_eq!(s.links.len(), 2);
    assert_eq!(s.links[1].send.gbps_windows, s.nics[1].send.gbps_windows);
    assert_eq!(s.links[1].send_end.as_deref(), Some("h/7 eth2"));

    // Windows of 1 s: each is the sum of two 0.5 s deltas over 1 s.
    let s = summarise(
        &read_dir(d.path(), &Limits::default()).unwrap(),
        &SummaryOptions {
            window_s: Some(1.0),
        },
    );
    assert_eq!(s.windows, 2);
    assert_eq!(
        s.nics[0].send.gbps_windows,
        vec![
            Some((6u64 << 20) as f64 / 1e9),
            Some((2u64 << 20) as f64 / 1e9)
        ]
    );
}

#[test]
fn two_processes_line_up_on_wall_clock_and_links_pair_their_ends() {
    let d = tempfile::tempdir().unwrap();
    two_hosts(d.path(), &NICS, 6, |_, _| 2.0, |_, _| 100.0);
    let s = summarise(
        &read_dir(d.path(), &Limits::default()).unwrap(),
        &SummaryOptions::default(),
    );
    assert_eq!(s.processes.len(), 2);
    assert_eq!(s.nics.len(), 8);
    assert_eq!(s.links.len(), 4);
    for l in &s.links {
        assert_eq!(
            l.send.bytes, l.recv.bytes,
            "both ends of {} moved the same",
            l.link
        );
        assert!(l.send_end.as_deref().unwrap().starts_with("a/100 "));
        assert!(l.recv_end.as_deref().unwrap().starts_with("b/200 "));
    }
    // b started 0.25 s after a: its first window is partly covered, yet the rate stays 2 GB/s
    // (each request 1 MiB: 2e9 bytes rounded down to whole requests).
    let want = (2e9 as u64 / (1 << 20) * (1 << 20)) as f64 / 1e9;
    for n in s.nics.iter().filter(|n| n.host == "b") {
        for v in n.recv.gbps_windows.iter().flatten() {
            assert!((v - want).abs() < 1e-9, "{v} vs {want}");
        }
    }
    assert_eq!(s.startup.len(), 8);
    assert!(s
        .startup
        .iter()
        .any(|c| c.call == "accept" && c.took_s == 0.03));
}

fn judge(d: &std::path::Path) -> Vec<tcpx_watch::Verdict> {
    let s = summarise(
        &read_dir(d, &Limits::default()).unwrap(),
        &SummaryOptions::default(),
    );
    verdicts(&s, &VerdictOptions::default())
}

#[test]
fn equal_nics_with_noise_name_nothing() {
    for seed in 0..5u64 {
        let d = tempfile::tempdir().unwrap();
        two_hosts(
            d.path(),
            &NICS,
            10,
            |i, w| 10.0 * (1.0 + noise(seed * 1000 + (i * 100 + w) as u64, 0.04)),
            |i, w| 400.0 * (1.0 + noise(seed * 7777 + (i * 100 + w) as u64, 0.05)),
        );
        let v = judge(d.path());
        assert!(v.is_empty(), "seed {seed}: {v:#?}");
    }
}

#[test]
fn a_slow_nic_is_named_and_nothing_else() {
    // Balanced bytes (a job that waits for its slowest NIC), eth3's requests three times slower.
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        10,
        |i, w| 10.0 * (1.0 + noise((i * 100 + w) as u64, 0.04)),
        |i, w| if i == 2 { 1200.0 } else { 400.0 } * (1.0 + noise(99 + (i * 100 + w) as u64, 0.05)),
    );
    let v = judge(d.path());
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].kind, VerdictKind::SlowNic);
    assert_eq!(v[0].subject, "a eth3");
    assert_eq!(v[0].figure.as_deref(), Some("send_request_gbps"));
    assert!(v[0].below_pct.unwrap() < -50.0, "{:?}", v[0]);

    // Fewer bytes on eth2 in every window: named by GB/s, nothing else.
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        10,
        |i, w| if i == 1 { 5.0 } else { 10.0 } * (1.0 + noise((i * 100 + w) as u64, 0.04)),
        |i, w| 400.0 * (1.0 + noise(5 + (i * 100 + w) as u64, 0.05)),
    );
    let v = judge(d.path());
    // Both hosts' eth2 carried half: each is named, on its own host.
    let subjects: Vec<&str> = v.iter().map(|v| v.subject.as_str()).collect();
    assert_eq!(subjects, vec!["a eth2", "b eth2"], "{v:#?}");
    assert!(v
        .iter()
        .all(|v| v.kind == VerdictKind::SlowNic && v.figure.as_deref() == Some("gbps")));
}

#[test]
fn a_gap_that_one_window_reverses_is_not_named() {
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        10,
        |i, w| match (i, w) {
            (1, 4) => 10.0,
            (1, _) => 5.0,
            _ => 10.0 * (1.0 + noise((i * 100 + w) as u64, 0.04)),
        } * if i == 1 && w == 4 { 1.2 } else { 1.0 },
        |_, _| 400.0,
    );
    let v = judge(d.path());
    assert!(v.iter().all(|v| v.kind != VerdictKind::SlowNic), "{v:#?}");
}

#[test]
fn an_idle_nic_is_named() {
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        6,
        |i, _| if i == 3 { 0.0 } else { 10.0 },
        |_, _| 400.0,
    );
    let v = judge(d.path());
    let idle: Vec<&str> = v
        .iter()
        .filter(|v| v.kind == VerdictKind::IdleNic)
        .map(|v| v.subject.as_str())
        .collect();
    assert_eq!(idle, vec!["a eth4", "b eth4"], "{v:#?}");
    assert!(v.iter().all(|v| v.kind == VerdictKind::IdleNic), "{v:#?}");
    assert!(v[0].text.contains("carried no byte"));
}

#[test]
fn a_startup_stall_is_named() {
    let d = tempfile::tempdir().unwrap();
    two_hosts(d.path(), &NICS, 4, |_, _| 10.0, |_, _| 400.0);
    // A late accept appended to b's file (after its end line: the reader keeps it in the run).
    let path = d.path().join("watch-b-200.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&lines(&[conn(
        4.6,
        9,
        Dir::Recv,
        1,
        "00000000deadbeef",
        ConnCall::Accept,
        42.5,
    )]));
    std::fs::write(&path, text).unwrap();
    let v = judge(d.path());
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].kind, VerdictKind::StartupStall);
    assert!(
        v[0].text.contains("accept on eth2") && v[0].text.contains("42.5 s"),
        "{}",
        v[0].text
    );
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tcpx-transport/src/nccl/fixtures")
        .join(name)
}

#[test]
fn a_socket_fallback_in_nccls_log_is_named() {
    let d = tempfile::tempdir().unwrap();
    let o = WatchOptions {
        expect_plugin: true,
        nccl_log: Some(fixture("nccl-2.28-onegpu-socket-tuned-rank1.log")),
        ..WatchOptions::default()
    };
    let r = watch(d.path(), &o).unwrap();
    let texts: Vec<&str> = r.verdicts.iter().map(|v| v.text.as_str()).collect();
    assert!(
        r.verdicts.iter().all(|v| v.kind == VerdictKind::NoShim),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("no process wrote a watch file")),
        "{texts:#?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("\"Using network Socket\"") && t.contains("fallback")),
        "{texts:#?}"
    );
    assert!(
        texts.iter().any(|t| t.contains("vm:4628")),
        "the log's process is named: {texts:#?}"
    );

    // Another plugin (the real one, not the shim in front of it).
    let o = WatchOptions {
        nccl_log: Some(fixture("nccl-2.28-onegpu-gpudirecttcpx-tuned-rank1.log")),
        ..WatchOptions::default()
    };
    let r = watch(d.path(), &o).unwrap();
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    assert!(
        r.verdicts[0].text.contains(
            "\"Using network GPUDirectTCPX_v7\" with NCCL_NET_PLUGIN=/tmp/plq/libnccl-net.so: \
             that plugin directly"
        ),
        "{}",
        r.verdicts[0].text
    );

    // A log whose network is the shim and whose process wrote a file: nothing to say.
    let log = d.path().join("nccl.log");
    std::fs::write(
        &log,
        "h:7:7 [0] NCCL INFO NCCL_NET_PLUGIN set by environment to tcpxwatch\nh:7:7 [0] NCCL INFO NET/Plugin: Loaded net plugin GPUDirectTCPX_v7 (v8)\nh:7:7 [0] NCCL INFO Using network GPUDirectTCPX_v7\n",
    )
    .unwrap();
    write(
        d.path(),
        "h",
        7,
        &[start("h", 7, UNIX0, &["eth1"]), end(1.0)],
    );
    let r = watch(
        d.path(),
        &WatchOptions {
            expect_plugin: true,
            nccl_log: Some(log.clone()),
            ..WatchOptions::default()
        },
    )
    .unwrap();
    assert!(r.verdicts.is_empty(), "{:#?}", r.verdicts);
    // The same log with a second process that wrote nothing here.
    std::fs::write(
        &log,
        "h:7:7 [0] NCCL INFO NCCL_NET_PLUGIN set by environment to tcpxwatch\nh:7:7 [0] NCCL INFO Using network GPUDirectTCPX_v7\nh:8:8 [0] NCCL INFO Using network GPUDirectTCPX_v7\n",
    )
    .unwrap();
    let r = watch(
        d.path(),
        &WatchOptions {
            nccl_log: Some(log),
            ..WatchOptions::default()
        },
    )
    .unwrap();
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    assert!(r.verdicts[0].text.contains("h:8"), "{}", r.verdicts[0].text);
}

#[test]
fn reports_render_and_escape_names() {
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &["eth1", "<b>\u{1b}[31m"],
        3,
        |_, _| 1.0,
        |_, _| 100.0,
    );
    let r = watch(d.path(), &WatchOptions::default()).unwrap();
    let html = tcpx_watch::present::html(&r);
    assert!(
        html.contains("<svg") && html.contains("GB/s per NIC"),
        "a chart"
    );
    assert!(
        !html.contains("<b>") && !html.contains('\u{1b}'),
        "names escaped"
    );
    let text = tcpx_watch::present::text(&r);
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(
        text.contains("a eth1") && text.contains("nothing stands out"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["summary"]["nics"].as_array().unwrap().len(), 4);
    assert_eq!(tcpx_watch::present::follow_lines(&r.summary, 0).len(), 4);
}

#[test]
fn equal_nics_on_a_latency_bucket_bound_are_not_named() {
    // Every request of eth2 just above 512 us, the others' just below: one bucket apart.
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        10,
        |i, w| 10.0 * (1.0 + noise((i * 100 + w) as u64, 0.02)),
        |i, _| if i == 1 { 530.0 } else { 500.0 },
    );
    let v = judge(d.path());
    assert!(v.is_empty(), "{v:#?}");
    // Three buckets apart is slow.
    let d = tempfile::tempdir().unwrap();
    two_hosts(
        d.path(),
        &NICS,
        10,
        |i, w| 10.0 * (1.0 + noise((i * 100 + w) as u64, 0.02)),
        |i, _| if i == 1 { 3000.0 } else { 500.0 },
    );
    let v = judge(d.path());
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].subject, "a eth2");
}

#[test]
fn a_long_nccl_log_is_read_from_its_start_and_a_fifo_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("nccl.log");
    let mut text =
        std::fs::read_to_string(fixture("nccl-2.28-onegpu-socket-tuned-rank1.log")).unwrap();
    text.push_str(
        &"vm:4628:4630 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0\n".repeat(80_000),
    );
    std::fs::write(&log, text).unwrap();
    assert!(std::fs::metadata(&log).unwrap().len() > 5 << 20);
    let r = watch(
        d.path(),
        &WatchOptions {
            nccl_log: Some(log),
            ..WatchOptions::default()
        },
    )
    .unwrap();
    assert!(
        r.verdicts
            .iter()
            .any(|v| v.text.contains("\"Using network Socket\"")),
        "{:#?}",
        r.verdicts
    );
    let fifo = d.path().join("fifo.log");
    nix::unistd::mkfifo(
        &fifo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let e = watch(
        d.path(),
        &WatchOptions {
            nccl_log: Some(fifo),
            ..WatchOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("--nccl-log"), "{e}");
}

#[test]
fn a_comm_left_out_of_a_line_is_not_counted_twice() {
    let d = tempfile::tempdir().unwrap();
    let c = |bytes| {
        comm(
            1,
            Dir::Send,
            0,
            "00000000000000aa",
            bytes,
            bytes >> 20,
            None,
            vec![0, bytes >> 20],
        )
    };
    write(
        d.path(),
        "h",
        1,
        &[
            start("h", 1, UNIX0, &["eth1"]),
            interval(1.0, 1.0, vec![c(4 << 20)]),
            interval(2.0, 1.0, vec![]),
            interval(3.0, 1.0, vec![c(6 << 20)]),
            end(3.5),
        ],
    );
    let s = summarise(
        &read_dir(d.path(), &Limits::default()).unwrap(),
        &SummaryOptions::default(),
    );
    assert_eq!(s.nics[0].send.bytes, 6 << 20);
}
