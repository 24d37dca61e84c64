//! Receives counted at their posted size (`posted_sized`: GPUDirect-TCPX's `test` reports no
//! received size): an upper bound, never a rate. A paired link takes its send end's figures; an
//! unpaired one is marked; the verdicts judge send figures.

mod common;

use common::*;
use tcpx_watch::present::{self, WatchReport};
use tcpx_watch::read::{read_dir, Limits};
use tcpx_watch::record::Dir;
use tcpx_watch::summary::{summarise, Summary, SummaryOptions};
use tcpx_watch::verdict::{verdicts, VerdictOptions};

const MIB: u64 = 1 << 20;

/// One comm of a synthetic process: (comm id, direction, device, link, MiB per second,
/// factor its receive count is inflated by (1: exact), whether it counted posted sizes).
struct C {
    id: u64,
    dir: Dir,
    dev: u32,
    link: String,
    mib_s: f64,
    inflate: u64,
    posted: bool,
}

fn c(id: u64, dir: Dir, dev: u32, link: &str, mib_s: f64, inflate: u64, posted: bool) -> C {
    C {
        id,
        dir,
        dev,
        link: link.into(),
        mib_s,
        inflate,
        posted,
    }
}

/// A process with `windows` interval lines 1 s apart; request rates get a small noise (seeded
/// by the window and comm, the same for both ends of a link) so that windows differ.
#[allow(clippy::too_many_arguments)]
fn process(
    d: &std::path::Path,
    host: &str,
    pid: u32,
    unix_s: f64,
    nics: &[&str],
    comms: &[C],
    windows: usize,
) {
    let mut lines = vec![serde_json::to_string(&start(host, pid, unix_s, nics)).unwrap()];
    let mut reqs = vec![0u64; comms.len()];
    for w in 0..windows {
        let mut cs = Vec::new();
        let mut posted = Vec::new();
        for (i, x) in comms.iter().enumerate() {
            let seed = w as u64 * 1000 + u64::from_str_radix(&x.link, 16).unwrap_or(0);
            reqs[i] += (x.mib_s * (1.0 + noise(seed, 0.03))).round() as u64;
            let bytes = reqs[i] * MIB * x.inflate;
            cs.push(comm(
                x.id,
                x.dir,
                x.dev,
                &x.link,
                bytes,
                reqs[i],
                Some(reqs[i] * 500),
                {
                    let mut h = vec![0u64; 21];
                    h[bucket(500.0)] = reqs[i];
                    h
                },
            ));
            posted.push(if x.posted { reqs[i] } else { 0 });
        }
        lines.push(line_posted_sized(
            &interval((w + 1) as f64, 1.0, cs),
            &posted,
        ));
    }
    lines.push(serde_json::to_string(&end(windows as f64 + 0.5)).unwrap());
    write_lines(d, host, pid, &lines);
}

fn summary(d: &std::path::Path) -> Summary {
    summarise(
        &read_dir(d, &Limits::default()).unwrap(),
        &SummaryOptions::default(),
    )
}

fn report(d: &std::path::Path) -> WatchReport {
    let summary = summary(d);
    let verdicts = verdicts(&summary, &VerdictOptions::default());
    WatchReport {
        dir: d.display().to_string(),
        summary,
        verdicts,
    }
}

#[test]
fn a_pair_whose_recv_end_counted_posted_sizes_shows_received_as_sent() {
    // The real case: two ranks on one host and one NIC (`lo`), each sending to the other; the
    // recv ends counted NCCL's posted step sizes, 8x what was sent.
    let d = tempfile::tempdir().unwrap();
    let (l1, l2) = ("00000000000000a1", "00000000000000a2");
    process(
        d.path(),
        "h",
        1,
        UNIX0,
        &["lo"],
        &[
            c(1, Dir::Send, 0, l1, 50.0, 1, true),
            c(2, Dir::Recv, 0, l2, 50.0, 8, true),
        ],
        6,
    );
    process(
        d.path(),
        "h",
        2,
        UNIX0 + 0.1,
        &["lo"],
        &[
            c(1, Dir::Send, 0, l2, 50.0, 1, true),
            c(2, Dir::Recv, 0, l1, 50.0, 8, true),
        ],
        6,
    );
    let s = summary(d.path());
    assert_eq!(s.links.len(), 2);
    for l in &s.links {
        assert!(l.recv_from_send_end, "{}", l.link);
        assert!(!l.recv_upper_bound);
        assert_eq!(l.recv.bytes, l.send.bytes, "{}", l.link);
        assert_eq!(l.recv_counted_bytes, Some(l.send.bytes * 8));
        assert_eq!(l.recv.gbps, l.send.gbps);
        assert_eq!(l.recv.gbps_windows, l.send.gbps_windows);
        // The recv end's own requests stay.
        assert_eq!(l.recv.requests, l.send.requests);
    }
    assert_eq!(s.nics.len(), 1);
    let n = &s.nics[0];
    assert!(n.recv_from_send_end && !n.recv_upper_bound);
    assert_eq!(n.recv.bytes, n.send.bytes);
    assert_eq!(n.recv.requests, n.send.requests);
    let (sg, rg) = (n.send.gbps.unwrap(), n.recv.gbps.unwrap());
    assert!((sg - rg).abs() < 1e-12, "send {sg} recv {rg}");
    // Window by window where both processes covered the whole window (the received bytes are
    // rated over the receiving process's time, the sent over the sender's).
    for w in 1..6 {
        let (a, b) = (n.send.gbps_windows[w], n.recv.gbps_windows[w]);
        assert!(
            (a.unwrap() - b.unwrap()).abs() < 1e-9,
            "window {w}: {a:?} {b:?}"
        );
    }
    for p in &s.processes {
        assert!(p.recv_from_send_end && !p.recv_upper_bound);
    }
    // Each process received what the other sent.
    assert_eq!(s.processes[0].recv.bytes, s.processes[1].send.bytes);
    assert_eq!(s.processes[1].recv.bytes, s.processes[0].send.bytes);
    assert!(s
        .notes
        .iter()
        .any(|n| n.contains("posted size") && n.contains("2 of them take their received bytes")));

    let r = report(d.path());
    let text = present::text(&r);
    assert!(text.contains("* received: the send end's figure"), "{text}");
    assert!(!text.contains("<="), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["summary"]["links"][0]["recv_from_send_end"], true);
    assert_eq!(json["summary"]["links"][0]["recv_upper_bound"], false);
    assert_eq!(json["summary"]["nics"][0]["recv_from_send_end"], true);
    assert!(r.verdicts.is_empty(), "{:?}", r.verdicts);
}

#[test]
fn an_unpaired_recv_end_that_counted_posted_sizes_shows_an_upper_bound() {
    // Only the receiving host's file: nothing exact to take the figure from.
    let d = tempfile::tempdir().unwrap();
    let link = "00000000000000b1";
    process(
        d.path(),
        "b",
        2,
        UNIX0,
        &["eth1"],
        &[c(1, Dir::Recv, 0, link, 100.0, 8, true)],
        4,
    );
    let s = summary(d.path());
    let l = &s.links[0];
    assert!(l.recv_upper_bound && !l.recv_from_send_end);
    assert_eq!(l.recv_counted_bytes, None);
    assert!(l.recv.bytes > 0);
    let n = &s.nics[0];
    assert!(n.recv_upper_bound && !n.recv_from_send_end);
    assert!(s.processes[0].recv_upper_bound);

    let r = report(d.path());
    let text = present::text(&r);
    let received = tcpx_report::safe::human_bytes(l.recv.bytes);
    assert!(
        text.contains(&format!("<= {received}")),
        "{received} not marked as a bound:\n{text}"
    );
    assert!(text.contains("<= : an upper bound"), "{text}");
    // Never a measured GB/s: each recv GB/s printed is marked.
    let g = format!("{:.3}", n.recv.gbps.unwrap());
    assert!(text.contains(&format!("<= {g}")), "{text}");
    assert!(!text.contains(&format!("  {g}")), "{text}");
    let follow = present::follow_lines(&r.summary, 1).join("\n");
    assert!(follow.contains("recv <= "), "{follow}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["summary"]["links"][0]["recv_upper_bound"], true);
    assert_eq!(json["summary"]["nics"][0]["recv_upper_bound"], true);
    assert!(r.verdicts.is_empty(), "{:?}", r.verdicts);

    // The same line without posted_sized (an older shim, or sizes reported): a figure.
    let d2 = tempfile::tempdir().unwrap();
    process(
        d2.path(),
        "b",
        2,
        UNIX0,
        &["eth1"],
        &[c(1, Dir::Recv, 0, link, 100.0, 8, false)],
        4,
    );
    let s2 = summary(d2.path());
    assert!(!s2.links[0].recv_upper_bound && !s2.nics[0].recv_upper_bound);
    assert!(!present::text(&report(d2.path())).contains("<="));
}

/// Hosts a and b, four NICs, one link each way per NIC at 400 MiB/s; the recv ends counted
/// posted sizes (when `posted`) inflated by `inflate[nic]`; b may have `extra` comms.
fn both_ways(d: &std::path::Path, inflate: [u64; 4], posted: bool, extra: Vec<C>) {
    let nics = ["eth1", "eth2", "eth3", "eth4"];
    let link = |from: usize, i: usize| format!("{:016x}", 0xc0 + from * 16 + i);
    for (h, host) in ["a", "b"].into_iter().enumerate() {
        let mut comms: Vec<C> = Vec::new();
        for (i, &inf) in inflate.iter().enumerate() {
            comms.push(c(
                i as u64 + 1,
                Dir::Send,
                i as u32,
                &link(h, i),
                400.0,
                1,
                posted,
            ));
            comms.push(c(
                i as u64 + 11,
                Dir::Recv,
                i as u32,
                &link(1 - h, i),
                400.0,
                inf,
                posted,
            ));
        }
        if h == 1 {
            comms.extend(
                extra
                    .iter()
                    .map(|x| c(x.id, x.dir, x.dev, &x.link, x.mib_s, x.inflate, x.posted)),
            );
        }
        process(
            d,
            host,
            h as u32 + 1,
            UNIX0 + 0.2 * h as f64,
            &nics,
            &comms,
            8,
        );
    }
}

#[test]
fn equal_nics_with_inflated_recv_counts_name_nothing() {
    // Every NIC moves the same both ways; the recv counts are 8x on three NICs, 1x on eth4 (the
    // posted sizes happened to fit). Read as figures, eth4 would look slow on both hosts.
    let inflate = [8, 8, 8, 1];
    let d = tempfile::tempdir().unwrap();
    both_ways(d.path(), inflate, false, Vec::new());
    let r = report(d.path());
    assert!(
        r.verdicts.iter().any(|v| v.subject.ends_with("eth4")),
        "the control (counts taken as figures) names eth4: {:#?}",
        r.verdicts
    );

    // Counted at posted sizes and paired: every NIC is equal, nothing is named.
    let d = tempfile::tempdir().unwrap();
    both_ways(d.path(), inflate, true, Vec::new());
    let r = report(d.path());
    assert!(r.verdicts.is_empty(), "{:#?}", r.verdicts);
    let nic = |host: &str, name: &str| {
        r.summary
            .nics
            .iter()
            .find(|n| n.host == host && n.name == name)
            .unwrap()
    };
    for n in &r.summary.nics {
        assert!(n.recv_from_send_end && !n.recv_upper_bound, "{}", n.label);
        // What the NIC received is what the peer's same NIC sent.
        let peer = nic(if n.host == "a" { "b" } else { "a" }, &n.name);
        assert_eq!(n.recv.bytes, peer.send.bytes, "{} {}", n.host, n.label);
    }

    // And where b also receives on eth4 from a host whose file was not read (an upper bound, 8x):
    // judged on send figures, still nothing; the unpaired link is not judged.
    let d = tempfile::tempdir().unwrap();
    both_ways(
        d.path(),
        inflate,
        true,
        vec![c(99, Dir::Recv, 3, "00000000000000ff", 400.0, 8, true)],
    );
    let r = report(d.path());
    assert!(r.verdicts.is_empty(), "{:#?}", r.verdicts);
    let b4 = r
        .summary
        .nics
        .iter()
        .find(|n| n.host == "b" && n.name == "eth4")
        .unwrap();
    assert!(b4.recv_upper_bound && b4.recv_from_send_end);
    let unpaired = r
        .summary
        .links
        .iter()
        .find(|l| l.link == "00000000000000ff")
        .unwrap();
    assert!(unpaired.recv_upper_bound && unpaired.send_end.is_none());
}
