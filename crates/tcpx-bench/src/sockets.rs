//! Stragglers: what each socket of every comm moved over the timed iterations of one size, and
//! how far the slowest one lags the others. NCCL's speed over a comm is about the slowest
//! socket's times the socket count, so one lagging socket (or NIC) costs the whole run.
//!
//! The figures come from the backend's per-socket counters
//! ([`tcpx_transport::SendComm::socket_stats`]); backends without sockets of their own give none.
//! In the socket backend's dynamic layout a free socket takes the next piece, so a socket the
//! kernel serves slower carries fewer bytes over the timed wall time (`gbs`): the verdict is
//! taken on that figure, among the sockets that had work at all (a message too small to give
//! every socket a piece leaves some idle, which is not lagging). Each socket's rate while it held
//! pieces (`busy_gbs`) is given too; on a loaded machine it is noisy, as scheduling delays count
//! as busy time.

use serde::{Deserialize, Serialize};

/// A socket is flagged when its GB/s is below this share of the median socket's.
pub const LAG_SHARE: f64 = 0.8;
/// Fewest pieces the median busy socket must have carried for a verdict: below it one piece
/// more or less moves a socket's share by more than a tenth, and a message that was cut into a
/// few pieces says nothing about the sockets' speeds.
pub const MIN_PIECES: u64 = 10;

/// Which socket: its flow, channel, index and NIC (flattened into [`SocketBytes`] and
/// [`SocketRate`], so their JSON keeps these as top-level keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketId {
    /// The flow's id ([`crate::Experiment::flow_id`]).
    pub flow: u32,
    pub channel: u32,
    /// The socket's index in its comm.
    pub socket: u32,
    /// The NIC the channel was placed on, when the experiment named NICs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<String>,
}

impl SocketId {
    /// `flow F channel C socket S`, the name the straggler line gives.
    pub fn label(&self) -> String {
        format!(
            "flow {} channel {} socket {}",
            self.flow, self.channel, self.socket
        )
    }
}

/// Payload bytes one socket moved over the timed iterations of one size (one side's count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketBytes {
    #[serde(flatten)]
    pub id: SocketId,
    pub bytes: u64,
    /// Nanoseconds the socket held those bytes' pieces ([`tcpx_transport::SocketStat::busy_ns`]).
    #[serde(default)]
    pub busy_ns: u64,
    /// Pieces the socket finished ([`tcpx_transport::SocketStat::pieces`]).
    #[serde(default)]
    pub pieces: u64,
    /// System calls the socket's worker made for it ([`tcpx_transport::SocketStat::calls`]).
    #[serde(default)]
    pub calls: u64,
    /// Of those, the ones that would have blocked.
    #[serde(default)]
    pub blocked_calls: u64,
    /// `poll` waits of the socket's thread, counted on its first socket.
    #[serde(default)]
    pub waits: u64,
    /// Of `bytes`, those received around the cache
    /// ([`tcpx_transport::SocketStat::around_cache_bytes`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub around_cache_bytes: u64,
    /// The CPU the socket's worker thread was given ([`tcpx_transport::SocketStat::cpu`]);
    /// `None` where the kernel placed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// [`SocketBytes`] with its rates: the bytes over the summed wall time of the timed iterations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SocketRate {
    #[serde(flatten)]
    pub id: SocketId,
    pub bytes: u64,
    #[serde(default)]
    pub pieces: u64,
    /// [`SocketBytes::calls`].
    #[serde(default)]
    pub calls: u64,
    /// [`SocketBytes::blocked_calls`].
    #[serde(default)]
    pub blocked_calls: u64,
    /// [`SocketBytes::waits`].
    #[serde(default)]
    pub waits: u64,
    /// [`SocketBytes::around_cache_bytes`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub around_cache_bytes: u64,
    /// [`SocketBytes::cpu`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// Bytes over the summed wall time of the timed iterations.
    pub gbs: f64,
    /// Bytes over the time the socket held pieces; `None` when it held none.
    #[serde(default)]
    pub busy_gbs: Option<f64>,
}

/// Rates of `bytes` over `secs` seconds (0 where no time passed).
pub fn rates(bytes: &[SocketBytes], secs: f64) -> Vec<SocketRate> {
    bytes
        .iter()
        .map(|b| SocketRate {
            id: b.id.clone(),
            bytes: b.bytes,
            pieces: b.pieces,
            calls: b.calls,
            blocked_calls: b.blocked_calls,
            waits: b.waits,
            around_cache_bytes: b.around_cache_bytes,
            cpu: b.cpu,
            gbs: if secs > 0.0 {
                b.bytes as f64 / 1e9 / secs
            } else {
                0.0
            },
            busy_gbs: (b.busy_ns > 0).then(|| b.bytes as f64 / b.busy_ns as f64),
        })
        .collect()
}

/// The spread of the busy sockets' rates while busy ([`SocketRate::busy_gbs`]) of one side for
/// one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub sockets: usize,
    /// Sockets that held no piece (left out of the figures below).
    pub idle: usize,
    /// GB/s over the wall time ([`SocketRate::gbs`]).
    pub min_gbs: f64,
    pub median_gbs: f64,
    pub max_gbs: f64,
    /// GB/s while busy ([`SocketRate::busy_gbs`]).
    pub busy_min_gbs: f64,
    pub busy_median_gbs: f64,
    pub busy_max_gbs: f64,
    /// The slowest socket ([`SocketId::label`]; the first of equals).
    pub slowest: String,
    /// The slowest socket's GB/s (over the wall time) over the median's (1.0 when the median is
    /// 0).
    pub slowest_share: f64,
    /// Pieces the median busy socket carried.
    pub median_pieces: u64,
    /// Whether there were enough pieces to judge ([`MIN_PIECES`]).
    pub judged: bool,
    /// Whether judged and `slowest_share` is below [`LAG_SHARE`].
    pub lags: bool,
    /// GB/s per NIC over the wall time (its sockets together), in first-seen order; empty
    /// without a NIC plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_nic: Vec<(String, f64)>,
}

/// What one side's sockets cost in system calls over the timed iterations of one size, all
/// sockets together: to compare with plain TCP's calls per byte (`xtask/src/tcp_yardstick.c`
/// counts its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calls {
    /// Payload bytes the sockets moved.
    pub bytes: u64,
    /// Data system calls (read/write/writev/send), those that would block included.
    pub calls: u64,
    /// Of those, the ones that would have blocked (`EAGAIN`).
    pub blocked_calls: u64,
    /// `poll` waits of the socket threads.
    pub waits: u64,
    /// Of `bytes`, those received around the cache (read into a socket's small buffer and
    /// copied on with streaming stores); 0 on the sending side.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub around_cache_bytes: u64,
    /// Payload bytes per call (0 without calls).
    pub bytes_per_call: f64,
    /// Payload bytes per `poll` wait (0 without waits).
    pub bytes_per_wait: f64,
    /// The CPUs the side's socket workers were given (`worker_cpus` = `own`) as a cpu list;
    /// `None` where the kernel placed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_cpus: Option<String>,
}

/// [`Calls`] of a side's sockets; `None` when the backend counted no calls.
pub fn calls(rates: &[SocketRate]) -> Option<Calls> {
    let sum = |f: fn(&SocketRate) -> u64| rates.iter().map(f).fold(0u64, u64::saturating_add);
    let (bytes, calls, blocked_calls, waits, around_cache_bytes) = (
        sum(|r| r.bytes),
        sum(|r| r.calls),
        sum(|r| r.blocked_calls),
        sum(|r| r.waits),
        sum(|r| r.around_cache_bytes),
    );
    if calls == 0 {
        return None;
    }
    let per = |n: u64| if n > 0 { bytes as f64 / n as f64 } else { 0.0 };
    Some(Calls {
        bytes,
        calls,
        blocked_calls,
        waits,
        around_cache_bytes,
        bytes_per_call: per(calls),
        bytes_per_wait: per(waits),
        worker_cpus: {
            let cpus: tcpx_topo::CpuSet = rates.iter().filter_map(|r| r.cpu).collect();
            (!cpus.is_empty()).then(|| cpus.to_list_string())
        },
    })
}

/// The `#` line of a side's [`Calls`].
pub fn calls_line(side: &str, c: &Calls) -> String {
    let pct = if c.calls > 0 {
        100.0 * c.blocked_calls as f64 / c.calls as f64
    } else {
        0.0
    };
    let around = if c.around_cache_bytes > 0 && c.bytes > 0 {
        format!(
            "; {:.0}% of bytes received around the cache",
            100.0 * c.around_cache_bytes as f64 / c.bytes as f64
        )
    } else {
        String::new()
    };
    let workers = match &c.worker_cpus {
        Some(list) => format!("; workers pinned to cpus {list}"),
        None => String::new(),
    };
    format!(
        "#   {side} calls: {} system calls, {:.0} KiB per call, {pct:.0}% would block; {} poll waits, {:.0} KiB per wait{around}{workers}",
        c.calls,
        c.bytes_per_call / 1024.0,
        c.waits,
        c.bytes_per_wait / 1024.0
    )
}

/// The median of `rates`, 0 when there are none.
fn median(rates: &[f64]) -> f64 {
    tcpx_model::median(rates).unwrap_or(0.0)
}

/// The spread of `rates`; `None` for fewer than two busy sockets (nothing to compare).
pub fn spread(rates: &[SocketRate]) -> Option<Spread> {
    let busy: Vec<(&SocketRate, f64)> = rates
        .iter()
        .filter_map(|r| r.busy_gbs.map(|g| (r, g)))
        .collect();
    if busy.len() < 2 {
        return None;
    }
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let g = sorted(busy.iter().map(|(r, _)| r.gbs).collect());
    let b = sorted(busy.iter().map(|(_, g)| *g).collect());
    let med = median(&g);
    let slowest = busy
        .iter()
        .map(|(r, _)| *r)
        .reduce(|a, b| if b.gbs < a.gbs { b } else { a })?;
    let share = if med > 0.0 { slowest.gbs / med } else { 1.0 };
    let mut pieces: Vec<u64> = busy.iter().map(|(r, _)| r.pieces).collect();
    pieces.sort_unstable();
    let median_pieces = pieces[pieces.len() / 2];
    let judged = median_pieces >= MIN_PIECES;
    let mut per_nic: Vec<(String, f64)> = Vec::new();
    for r in rates {
        let Some(nic) = &r.id.nic else { continue };
        match per_nic.iter_mut().find(|(n, _)| n == nic) {
            Some((_, gbs)) => *gbs += r.gbs,
            None => per_nic.push((nic.clone(), r.gbs)),
        }
    }
    Some(Spread {
        sockets: rates.len(),
        idle: rates.len() - busy.len(),
        min_gbs: g[0],
        median_gbs: med,
        max_gbs: g[g.len() - 1],
        busy_min_gbs: b[0],
        busy_median_gbs: median(&b),
        busy_max_gbs: b[b.len() - 1],
        slowest: slowest.id.label(),
        slowest_share: share,
        median_pieces,
        judged,
        lags: judged && share < LAG_SHARE,
        per_nic,
    })
}

/// The table's line for `spread` of side `side`.
pub fn line(side: &str, s: &Spread) -> String {
    let verdict = if !s.judged {
        format!(
            "not judged (the median socket carried {} piece{}, fewer than {MIN_PIECES})",
            s.median_pieces,
            if s.median_pieces == 1 { "" } else { "s" }
        )
    } else if s.lags {
        format!("LAGS (below {:.0}% of the median)", LAG_SHARE * 100.0)
    } else {
        format!("ok (none below {:.0}% of the median)", LAG_SHARE * 100.0)
    };
    let mut out = format!(
        "#   {side} sockets: {}, {} idle; GB/s per socket min {:.2} median {:.2} max {:.2} (while busy {:.2}, {:.2}, {:.2}); slowest {} at {:.0}% of the median: {verdict}",
        s.sockets,
        s.idle,
        s.min_gbs,
        s.median_gbs,
        s.max_gbs,
        s.busy_min_gbs,
        s.busy_median_gbs,
        s.busy_max_gbs,
        s.slowest,
        s.slowest_share * 100.0
    );
    if !s.per_nic.is_empty() {
        let nics: Vec<String> = s
            .per_nic
            .iter()
            .map(|(n, g)| format!("{n} {g:.2}"))
            .collect();
        out.push_str(&format!("\n#   {side} per-NIC GB/s: {}", nics.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sockets of 4 per channel with these bytes, each busy for `busy_s` seconds (0 when it
    /// moved nothing).
    fn socks(
        bytes: &[u64],
        busy_s: f64,
        nic: impl Fn(usize) -> Option<String>,
    ) -> Vec<SocketBytes> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| SocketBytes {
                id: SocketId {
                    flow: 0,
                    channel: (i / 4) as u32,
                    socket: (i % 4) as u32,
                    nic: nic(i),
                },
                bytes: b,
                busy_ns: if b > 0 { (busy_s * 1e9) as u64 } else { 0 },
                pieces: b.div_ceil(1000),
                calls: b.div_ceil(1000) * 2,
                blocked_calls: b.div_ceil(1000) / 2,
                waits: u64::from(i % 4 == 0),
                around_cache_bytes: 0,
                cpu: None,
            })
            .collect()
    }

    /// Calls add up over every socket; bytes per call and per wait follow; a backend that
    /// counted no calls gives no figures, and the line shows KiB per call and the blocked share.
    #[test]
    fn calls_add_up_over_sockets() {
        let r = rates(&socks(&[1_024_000; 8], 1.0, |_| None), 2.0);
        let c = calls(&r).unwrap();
        assert_eq!(
            (c.bytes, c.calls, c.blocked_calls, c.waits),
            (8_192_000, 16_384, 4_096, 2)
        );
        assert_eq!(c.bytes_per_call, 500.0);
        assert_eq!(c.bytes_per_wait, 4_096_000.0);
        let line = calls_line("recv", &c);
        assert!(
            line.contains("16384 system calls, 0 KiB per call, 25% would block"),
            "{line}"
        );
        assert!(line.contains("2 poll waits, 4000 KiB per wait"), "{line}");
        assert!(!line.contains("around the cache"), "{line}");
        // Receives around the cache on half the sockets: their share of the bytes is said, and
        // the JSON carries the count only where it is not zero (older records read as 0).
        let mut half = socks(&[1_024_000; 8], 1.0, |_| None);
        for s in half.iter_mut().take(4) {
            s.around_cache_bytes = s.bytes;
        }
        let c2 = calls(&rates(&half, 2.0)).unwrap();
        assert_eq!(c2.around_cache_bytes, 4_096_000);
        let line = calls_line("recv", &c2);
        assert!(
            line.ends_with("; 50% of bytes received around the cache"),
            "{line}"
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("around_cache"), "{json}");
        let back: Calls = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        let json2 = serde_json::to_string(&c2).unwrap();
        assert!(json2.contains("\"around_cache_bytes\":4096000"), "{json2}");
        // Workers with a CPU each: the line and the JSON give the CPUs as a list.
        assert!(!json.contains("worker_cpus"), "{json}");
        let mut pinned = socks(&[1_024_000; 8], 1.0, |_| None);
        for (i, s) in pinned.iter_mut().enumerate() {
            s.cpu = Some([0, 1, 2, 3, 8, 9, 10, 12][i]);
        }
        let c3 = calls(&rates(&pinned, 2.0)).unwrap();
        assert_eq!(c3.worker_cpus.as_deref(), Some("0-3,8-10,12"));
        assert!(
            calls_line("send", &c3).ends_with("; workers pinned to cpus 0-3,8-10,12"),
            "{}",
            calls_line("send", &c3)
        );
        let none: Vec<SocketRate> = r
            .into_iter()
            .map(|mut x| {
                x.calls = 0;
                x
            })
            .collect();
        assert_eq!(calls(&none), None);
    }

    #[test]
    fn an_equal_set_flags_nothing() {
        let r = rates(&socks(&[1_000_000_000; 8], 1.0, |_| None), 2.0);
        assert!(r.iter().all(|r| (r.gbs - 0.5).abs() < 1e-12));
        assert!(r.iter().all(|r| r.busy_gbs == Some(1.0)));
        let s = spread(&r).unwrap();
        assert_eq!(s.sockets, 8);
        assert!(!s.lags, "{s:?}");
        assert!((s.slowest_share - 1.0).abs() < 1e-12);
        assert_eq!(s.idle, 0);
        assert!((s.min_gbs - 0.5).abs() < 1e-12 && (s.max_gbs - 0.5).abs() < 1e-12);
        assert!((s.busy_min_gbs - 1.0).abs() < 1e-12 && (s.busy_max_gbs - 1.0).abs() < 1e-12);
        assert!(s.per_nic.is_empty());
        let l = line("recv", &s);
        assert!(l.contains("recv sockets: 8, 0 idle; GB/s per socket min 0.50 median 0.50 max 0.50 (while busy 1.00, 1.00, 1.00);"), "{l}");
        assert!(l.contains("ok (none below 80% of the median)"), "{l}");
        assert!(!l.contains("LAGS"), "{l}");
    }

    #[test]
    fn one_socket_at_half_is_named_with_its_share() {
        let mut b = vec![2_000_000_000u64; 8];
        b[6] = 1_000_000_000;
        let nic = |i: usize| Some(if i < 4 { "eth1" } else { "eth2" }.to_string());
        // Over the same wall time it moved half the bytes (and, busy as long, at half the speed).
        let s = spread(&rates(&socks(&b, 1.0, nic), 1.0)).unwrap();
        assert!(s.lags, "{s:?}");
        assert_eq!(s.slowest, "flow 0 channel 1 socket 2");
        assert!((s.slowest_share - 0.5).abs() < 1e-12, "{s:?}");
        assert!((s.median_gbs - 2.0).abs() < 1e-12);
        assert!((s.min_gbs - 1.0).abs() < 1e-12);
        assert!((s.busy_min_gbs - 1.0).abs() < 1e-12 && (s.busy_median_gbs - 2.0).abs() < 1e-12);
        assert_eq!(
            s.per_nic,
            vec![("eth1".to_string(), 8.0), ("eth2".to_string(), 7.0)]
        );
        let l = line("recv", &s);
        assert!(
            l.contains(
                "slowest flow 0 channel 1 socket 2 at 50% of the median: LAGS (below 80% of the median)"
            ),
            "{l}"
        );
        assert!(l.contains("recv per-NIC GB/s: eth1 8.00, eth2 7.00"), "{l}");
    }

    #[test]
    fn fewer_than_two_busy_sockets_give_no_spread() {
        assert_eq!(spread(&rates(&socks(&[5], 1.0, |_| None), 1.0)), None);
        assert_eq!(spread(&rates(&socks(&[5, 0, 0], 1.0, |_| None), 1.0)), None);
        assert_eq!(spread(&[]), None);
    }

    /// A socket a small message gave no piece is idle, not a straggler.
    #[test]
    fn idle_sockets_are_counted_apart_and_flag_nothing() {
        let s = spread(&rates(&socks(&[40_000, 40_000, 0, 0], 1.0, |_| None), 1.0)).unwrap();
        assert_eq!((s.sockets, s.idle), (4, 2));
        assert!(s.judged && !s.lags, "{s:?}");
        assert!(line("send", &s).starts_with("#   send sockets: 4, 2 idle;"));
    }

    /// Two pieces against one is no verdict on speed: too few pieces are not judged.
    #[test]
    fn too_few_pieces_are_not_judged() {
        let s = spread(&rates(&socks(&[2000, 1000, 2000], 1.0, |_| None), 1.0)).unwrap();
        assert_eq!(s.median_pieces, 2);
        assert!(!s.judged && !s.lags, "{s:?}");
        assert!((s.slowest_share - 0.5).abs() < 1e-12, "{s:?}");
        let l = line("recv", &s);
        assert!(
            l.ends_with("not judged (the median socket carried 2 pieces, fewer than 10)"),
            "{l}"
        );
    }

    /// The socket's identity is flattened: the JSON keeps flow, channel, socket and nic as
    /// top-level keys (what the tables and earlier logs read), and reads them back.
    #[test]
    fn socket_rows_keep_their_json_keys() {
        let r = rates(&socks(&[2000], 1.0, |_| Some("eth1".into())), 1.0);
        let text = serde_json::to_string(&r[0]).unwrap();
        assert_eq!(
            text,
            r#"{"flow":0,"channel":0,"socket":0,"nic":"eth1","bytes":2000,"pieces":2,"calls":4,"blocked_calls":1,"waits":1,"gbs":2e-6,"busy_gbs":2e-6}"#
        );
        let v = serde_json::to_value(&r[0]).unwrap();
        let back: SocketRate = serde_json::from_value(v).unwrap();
        assert_eq!(back, r[0]);
        let b = serde_json::to_value(&socks(&[5], 1.0, |_| None)[0]).unwrap();
        assert_eq!(
            b,
            serde_json::json!({"flow": 0, "channel": 0, "socket": 0, "bytes": 5, "busy_ns": 1_000_000_000u64, "pieces": 1, "calls": 2, "blocked_calls": 0, "waits": 1})
        );
    }
}
