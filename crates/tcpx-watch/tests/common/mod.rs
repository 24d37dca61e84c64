//! Synthetic watch files, written through the contract's own types.
#![allow(dead_code)]

use std::path::Path;

use tcpx_watch::record::{
    CommCounters, Conn, ConnCall, Device, Dir, Dropped, End, Histogram, Interval, Record, Start,
};

pub const UNIX0: f64 = 1_764_390_000.0;

pub fn start(host: &str, pid: u32, unix_s: f64, nics: &[&str]) -> Record {
    Record::Start(Start {
        v: 1,
        t: 0.0,
        unix_s,
        host: host.into(),
        pid,
        inner: "/opt/lib/libnccl-net.so".into(),
        inner_name: "Inner_v8".into(),
        api: 8,
        devices: nics
            .iter()
            .enumerate()
            .map(|(i, n)| Device {
                dev: i as u32,
                name: n.to_string(),
                pci_path: String::new(),
                speed_mbps: 200_000,
                max_comms: 1024,
            })
            .collect(),
    })
}

/// The latency bounds the tests use: 1, 2, 4, ... 2^19 us.
pub fn le() -> Vec<f64> {
    (0..20).map(|i| f64::from(1u32 << i)).collect()
}

/// The bucket of `lat_us` in [`le`] (the overflow bucket past the last bound).
pub fn bucket(lat_us: f64) -> usize {
    let le = le();
    le.iter().position(|b| lat_us <= *b).unwrap_or(le.len())
}

/// One comm's cumulative counters with its cumulative histogram `counts` (over [`le`]).
#[allow(clippy::too_many_arguments)]
pub fn comm(
    comm: u64,
    dir: Dir,
    dev: u32,
    link: &str,
    bytes: u64,
    requests: u64,
    lat_sum_us: Option<u64>,
    mut counts: Vec<u64>,
) -> CommCounters {
    // Shorter lists are the first buckets of a whole histogram.
    counts.resize(le().len() + 1, 0);
    CommCounters {
        comm,
        dir,
        dev,
        link: link.into(),
        bytes,
        requests,
        errors: 0,
        inflight: 0,
        lat_us: Histogram { le: le(), counts },
        lat_sum_us,
        closed: false,
    }
}

pub fn interval(t: f64, dt_s: f64, comms: Vec<CommCounters>) -> Record {
    Record::Interval(Interval {
        t,
        dt_s,
        comms,
        dropped: Dropped::default(),
        omitted_comms: 0,
    })
}

pub fn conn(
    t: f64,
    comm: u64,
    dir: Dir,
    dev: u32,
    link: &str,
    call: ConnCall,
    took_s: f64,
) -> Record {
    Record::Conn(Conn {
        t,
        comm,
        dir: Some(dir),
        dev,
        link: link.into(),
        call,
        took_s,
        ok: true,
        code: 0,
    })
}

pub fn end(t: f64) -> Record {
    Record::End(End { t })
}

pub fn lines(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect()
}

pub fn write(dir: &Path, host: &str, pid: u32, records: &[Record]) {
    std::fs::write(
        dir.join(format!("watch-{host}-{pid}.jsonl")),
        lines(records),
    )
    .unwrap();
}

/// A small deterministic noise in [-amp, amp] (no generator crate needed).
pub fn noise(seed: u64, amp: f64) -> f64 {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    ((x % 10_000) as f64 / 10_000.0 * 2.0 - 1.0) * amp
}

/// A job of two hosts (`a` sends, `b` receives), one link per NIC, `windows` intervals of 1 s.
/// `gbps(nic, window)` and `lat_us(nic, window)` give each NIC's figures.
pub fn two_hosts(
    dir: &Path,
    nics: &[&str],
    windows: usize,
    gbps: impl Fn(usize, usize) -> f64,
    lat_us: impl Fn(usize, usize) -> f64,
) {
    let req_bytes = 1u64 << 20;
    let mut a = vec![start("a", 100, UNIX0, nics)];
    let mut b = vec![start("b", 200, UNIX0 + 0.25, nics)];
    for (i, _) in nics.iter().enumerate() {
        let link = format!("{:016x}", 0xabc0 + i);
        a.push(conn(
            0.1,
            i as u64 + 1,
            Dir::Send,
            i as u32,
            &link,
            ConnCall::Connect,
            0.02,
        ));
        b.push(conn(
            0.1,
            i as u64 + 1,
            Dir::Recv,
            i as u32,
            &link,
            ConnCall::Accept,
            0.03,
        ));
    }
    let mut cum = vec![(0u64, 0u64, 0u64); nics.len()];
    let mut hist = vec![(vec![0u64; 21], vec![0u64; 21]); nics.len()];
    for w in 0..windows {
        let t = (w + 1) as f64;
        let mut ca = Vec::new();
        let mut cb = Vec::new();
        for (i, _) in nics.iter().enumerate() {
            let bytes = (gbps(i, w) * 1e9) as u64;
            let reqs = bytes / req_bytes;
            let lat = lat_us(i, w);
            cum[i].0 += reqs * req_bytes;
            cum[i].1 += reqs;
            cum[i].2 += (reqs as f64 * lat) as u64;
            hist[i].0[bucket(lat)] += reqs;
            hist[i].1[bucket(lat * 2.0)] += reqs;
            let link = format!("{:016x}", 0xabc0 + i);
            ca.push(comm(
                i as u64 + 1,
                Dir::Send,
                i as u32,
                &link,
                cum[i].0,
                cum[i].1,
                Some(cum[i].2),
                hist[i].0.clone(),
            ));
            cb.push(comm(
                i as u64 + 1,
                Dir::Recv,
                i as u32,
                &link,
                cum[i].0,
                cum[i].1,
                Some(cum[i].2 * 2),
                hist[i].1.clone(),
            ));
        }
        a.push(interval(t, 1.0, ca));
        b.push(interval(t, 1.0, cb));
    }
    a.push(end(windows as f64 + 0.5));
    b.push(end(windows as f64 + 0.5));
    write(dir, "a", 100, &a);
    write(dir, "b", 200, &b);
}

/// `r` as a line with each comm's `posted_sized` set (in `comms` order), as the shim writes it
/// when the inner plugin reports no sizes.
pub fn line_posted_sized(r: &Record, posted: &[u64]) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    if let Some(comms) = v.get_mut("comms").and_then(|c| c.as_array_mut()) {
        for (c, p) in comms.iter_mut().zip(posted) {
            c["posted_sized"] = serde_json::json!(p);
        }
    }
    serde_json::to_string(&v).unwrap()
}

/// Writes lines as they are (each without its newline).
pub fn write_lines(dir: &Path, host: &str, pid: u32, lines: &[String]) {
    let mut text = String::new();
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(dir.join(format!("watch-{host}-{pid}.jsonl")), text).unwrap();
}
