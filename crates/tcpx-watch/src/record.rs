//! The shim's output contract: one JSON object per line, in `DIR/watch-<host>-<pid>.jsonl` (plus
//! at most one rotated `watch-<host>-<pid>.jsonl.1` per process, the older lines).
//!
//! Every record has `kind` and `t`, the seconds since the shim's init in that process. Counters
//! (`bytes`, `requests`, `errors`, the latency histogram's counts) are cumulative since init, so
//! a reader takes differences between intervals; a new `start` line in the same file is a
//! restart and resets them. Unknown fields are ignored and an unknown `kind` reads as
//! [`Record::Unknown`], so a newer shim's files still read.
//!
//! ```text
//! {"kind":"start","v":1,"t":0.0,"unix_s":..,"host":"..","pid":..,"inner":"<path>","inner_name":"..","api":7|8|9,
//!  "devices":[{"dev":0,"name":"eth1","pci_path":"..","speed_mbps":..,"max_comms":..}]}
//! {"kind":"conn","t":..,"comm":<u64>,"dir":"send"|"recv","dev":0,"link":"<16 hex>","call":"listen"|"connect"|"accept",
//!  "took_s":..,"ok":true,"code":0}
//! {"kind":"interval","t":..,"dt_s":..,"comms":[{"comm":..,"dir":"send","dev":0,"link":"..","bytes":..,"requests":..,
//!  "errors":..,"inflight":..,"lat_us":{"le":[1,2,4,...],"counts":[...]},"lat_sum_us":..,"posted_sized":..}],
//!  "dropped":{"comms":0,"lat_samples":0}}
//! {"kind":"error","t":..,"comm":..,"call":"isend",...,"code":<int>}
//! {"kind":"end","t":..}
//! ```
//!
//! `link` is the same on the send comm and the recv comm of one connection (both ends hash the
//! connect handle), which pairs a connection's two ends across processes and hosts.
//!
//! `posted_sized` (cumulative, 0 where absent) counts the completions the shim counted at their
//! posted size because the inner plugin's `test` reported no size (GPUDirect-TCPX never does):
//! exact for a send, an upper bound for a receive (NCCL posts a whole step). It is read by
//! [`posted_sized`] beside [`CommCounters`], not into it, so that code building `CommCounters`
//! by its fields keeps compiling.
//!
//! The latency histogram: `le` are the buckets' upper bounds in microseconds, increasing;
//! `counts[i]` counts the requests whose post-to-completion time fell in bucket `i` alone (not
//! cumulative over buckets, unlike Prometheus). `counts` has `le.len()` entries, or one more:
//! the requests above the last bound.

use serde::{Deserialize, Serialize};

/// The version of the contract this reader knows (`start.v`).
pub const CONTRACT_VERSION: u32 = 1;

/// One line of a shim's file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Start(Start),
    Conn(Conn),
    Interval(Interval),
    Error(ErrorRecord),
    End(End),
    /// A kind a newer shim writes that this reader does not know: skipped.
    #[serde(other)]
    Unknown,
}

impl Record {
    /// Seconds since the shim's init, where the record has them.
    pub fn t(&self) -> Option<f64> {
        match self {
            Record::Start(s) => Some(s.t),
            Record::Conn(c) => Some(c.t),
            Record::Interval(i) => Some(i.t),
            Record::Error(e) => Some(e.t),
            Record::End(e) => Some(e.t),
            Record::Unknown => None,
        }
    }

    /// Parses one line (without its newline).
    pub fn parse(line: &str) -> Result<Record, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// One comm entry's `posted_sized` (the other fields are [`CommCounters`]'s).
#[derive(Deserialize)]
struct PostedSizedComm {
    #[serde(default)]
    posted_sized: u64,
}

#[derive(Deserialize)]
struct PostedSizedLine {
    #[serde(default)]
    comms: Vec<PostedSizedComm>,
}

/// Per comm of an interval line, in its `comms` order: how many completions the shim counted at
/// their posted size (`posted_sized`; 0 where the field is absent: an older shim, or a plugin
/// that reports sizes). A receive comm with a non-zero count has received bytes that are an
/// upper bound. Unknown fields are ignored; a negative or non-integer count is an error.
pub fn posted_sized(line: &str) -> Result<Vec<u64>, serde_json::Error> {
    let l: PostedSizedLine = serde_json::from_str(line)?;
    Ok(l.comms.into_iter().map(|c| c.posted_sized).collect())
}

/// The first line a process writes: who it is, which plugin it wraps and that plugin's devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// The contract version ([`CONTRACT_VERSION`]).
    pub v: u32,
    pub t: f64,
    /// Wall-clock seconds since the Unix epoch at init: lines up processes on one time axis.
    pub unix_s: f64,
    pub host: String,
    pub pid: u32,
    /// The path of the real plugin the shim loaded.
    pub inner: String,
    /// The real plugin's own name (its net table's `name`).
    #[serde(default)]
    pub inner_name: String,
    /// The net API version NCCL took from the shim (7, 8 or 9).
    pub api: u32,
    #[serde(default)]
    pub devices: Vec<Device>,
}

/// One device (NIC) as the real plugin's `getProperties` described it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub dev: u32,
    pub name: String,
    #[serde(default)]
    pub pci_path: String,
    #[serde(default)]
    pub speed_mbps: i64,
    #[serde(default)]
    pub max_comms: i64,
}

/// Which end of a connection a comm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dir {
    Send,
    Recv,
}

impl Dir {
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Send => "send",
            Dir::Recv => "recv",
        }
    }
}

/// Which set-up call a `conn` record timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnCall {
    Listen,
    Connect,
    Accept,
}

impl ConnCall {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnCall::Listen => "listen",
            ConnCall::Connect => "connect",
            ConnCall::Accept => "accept",
        }
    }
}

/// A listen, connect or accept, once it finished (a v7+ connect/accept may return without a comm
/// several times; `took_s` runs from the first call to the one that gave the comm or failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conn {
    pub t: f64,
    /// The shim's id of the comm (unique within the process; 0 for a listen).
    #[serde(default)]
    pub comm: u64,
    #[serde(default)]
    pub dir: Option<Dir>,
    pub dev: u32,
    #[serde(default)]
    pub link: String,
    pub call: ConnCall,
    pub took_s: f64,
    pub ok: bool,
    #[serde(default)]
    pub code: i64,
}

/// Counters of every comm at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub t: f64,
    /// The time since the previous interval line (or since init for the first).
    pub dt_s: f64,
    #[serde(default)]
    pub comms: Vec<CommCounters>,
    #[serde(default)]
    pub dropped: Dropped,
    /// Comms left out of this line to keep it within the file bound (their traffic is missing
    /// from it).
    #[serde(default)]
    pub omitted_comms: u64,
}

/// One comm's cumulative counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommCounters {
    pub comm: u64,
    pub dir: Dir,
    pub dev: u32,
    #[serde(default)]
    pub link: String,
    /// Bytes of completed requests (what `test` reported done, the sizes it returned).
    pub bytes: u64,
    /// Completed requests.
    pub requests: u64,
    #[serde(default)]
    pub errors: u64,
    /// Requests posted and not yet completed, now (a gauge, not a counter).
    #[serde(default)]
    pub inflight: u64,
    #[serde(default)]
    pub lat_us: Histogram,
    /// The sum of completed requests' latencies, microseconds (cumulative), where the shim
    /// wrote it: the exact mean where the histogram gives only buckets.
    #[serde(default)]
    pub lat_sum_us: Option<u64>,
    /// Whether NCCL has closed the comm (its counters stay final).
    #[serde(default)]
    pub closed: bool,
}

/// Post-to-completion latency, microseconds (see the module doc for the bucket convention).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    #[serde(default)]
    pub le: Vec<f64>,
    #[serde(default)]
    pub counts: Vec<u64>,
}

impl Histogram {
    /// Why the histogram cannot be read, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.counts.len() != self.le.len() && self.counts.len() != self.le.len() + 1 {
            return Some(format!(
                "{} latency counts for {} bounds (expected {} or {})",
                self.counts.len(),
                self.le.len(),
                self.le.len(),
                self.le.len() + 1
            ));
        }
        if let Some(b) = self.le.iter().find(|b| !b.is_finite() || **b < 0.0) {
            return Some(format!(
                "latency bound {b} is not a finite non-negative number"
            ));
        }
        if self.le.windows(2).any(|w| w[1] <= w[0]) {
            return Some("latency bounds do not increase".to_string());
        }
        None
    }

    /// The total count.
    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, c| a.saturating_add(*c))
    }
}

/// What the shim could not record (its tables are bounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dropped {
    /// Comms beyond the shim's table: their traffic is not in any `comms` entry.
    #[serde(default)]
    pub comms: u64,
    #[serde(default)]
    pub lat_samples: u64,
    /// Requests beyond the shim's request table: neither timed nor counted.
    #[serde(default)]
    pub requests: u64,
    /// Error and set-up lines not written (only counted) to keep the output bounded.
    #[serde(default)]
    pub error_lines: u64,
    #[serde(default)]
    pub conn_lines: u64,
}

/// A call of the real plugin that returned an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub t: f64,
    #[serde(default)]
    pub comm: Option<u64>,
    pub call: String,
    #[serde(default)]
    pub dev: Option<u32>,
    #[serde(default)]
    pub link: Option<String>,
    /// The `ncclResult_t` the real plugin returned.
    pub code: i64,
}

/// The last line of a process that shut down cleanly (a crashed or killed one has none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct End {
    pub t: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_parses_with_devices_and_ignores_unknown_fields() {
        let line = r#"{"kind":"start","v":1,"t":0.0,"unix_s":1764390000.25,"host":"a3-0","pid":4242,"inner":"/usr/local/tcpx/lib64/libnccl-net.so","inner_name":"GPUDirectTCPX_v7","api":7,"devices":[{"dev":0,"name":"eth1","pci_path":"/sys/devices/pci0000:00/0000:00:0c.0","speed_mbps":200000,"max_comms":65536,"future":1},{"dev":1,"name":"eth2","pci_path":"","speed_mbps":200000,"max_comms":65536}],"added_later":{"x":[1,2]}}"#;
        let Record::Start(s) = Record::parse(line).unwrap() else {
            panic!("not a start")
        };
        assert_eq!(s.v, 1);
        assert_eq!(s.host, "a3-0");
        assert_eq!(s.pid, 4242);
        assert_eq!(s.api, 7);
        assert_eq!(s.inner_name, "GPUDirectTCPX_v7");
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.devices[1].name, "eth2");
        assert_eq!(s.devices[0].speed_mbps, 200000);
        assert_eq!(s.unix_s, 1764390000.25);
    }

    #[test]
    fn conn_parses() {
        let line = r#"{"kind":"conn","t":1.5,"comm":7,"dir":"recv","dev":1,"link":"00ff00ff00ff00ff","call":"accept","took_s":0.25,"ok":true,"code":0}"#;
        let Record::Conn(c) = Record::parse(line).unwrap() else {
            panic!("not a conn")
        };
        assert_eq!(c.comm, 7);
        assert_eq!(c.dir, Some(Dir::Recv));
        assert_eq!(c.call, ConnCall::Accept);
        assert_eq!(c.link, "00ff00ff00ff00ff");
        assert!(c.ok);
        assert_eq!(c.took_s, 0.25);
        let listen =
            r#"{"kind":"conn","t":0.1,"dev":0,"call":"listen","took_s":0.001,"ok":false,"code":3}"#;
        let Record::Conn(l) = Record::parse(listen).unwrap() else {
            panic!("not a conn")
        };
        assert_eq!(l.dir, None);
        assert_eq!(l.code, 3);
        assert!(!l.ok);
    }

    #[test]
    fn interval_parses() {
        let line = r#"{"kind":"interval","t":2.0,"dt_s":1.0,"comms":[{"comm":7,"dir":"send","dev":0,"link":"0123456789abcdef","bytes":1048576,"requests":4,"errors":0,"inflight":2,"lat_us":{"le":[1,2,4,8],"counts":[0,1,3,0,0]}}],"dropped":{"comms":0,"lat_samples":5}}"#;
        let Record::Interval(i) = Record::parse(line).unwrap() else {
            panic!("not an interval")
        };
        assert_eq!(i.dt_s, 1.0);
        assert_eq!(i.comms.len(), 1);
        let c = &i.comms[0];
        assert_eq!((c.bytes, c.requests, c.inflight), (1048576, 4, 2));
        assert_eq!(c.dir, Dir::Send);
        assert_eq!(c.lat_us.total(), 4);
        assert_eq!(c.lat_us.problem(), None);
        assert_eq!(i.dropped.lat_samples, 5);
    }

    #[test]
    fn posted_sized_is_read_per_comm_and_defaults_to_zero() {
        // As the shim writes it (crates/tcpx-watch-plugin output.rs): the count last.
        let line = r#"{"kind":"interval","t":2.0,"dt_s":1.0,"comms":[{"comm":1,"dir":"send","dev":0,"link":"0123456789abcdef","bytes":1048576,"requests":4,"errors":0,"inflight":0,"closed":false,"lat_us":{"le":[1,2],"counts":[0,4,0]},"lat_sum_us":6,"posted_sized":4},{"comm":2,"dir":"recv","dev":0,"link":"0123456789abcdef","bytes":8388608,"requests":4,"lat_us":{"le":[1,2],"counts":[0,4,0]},"posted_sized":4,"future":{"x":1}},{"comm":3,"dir":"recv","dev":1,"bytes":5,"requests":1}],"dropped":{"comms":0,"lat_samples":0}}"#;
        assert_eq!(posted_sized(line).unwrap(), vec![4, 4, 0]);
        // The record itself still reads, the field ignored by CommCounters.
        let Record::Interval(i) = Record::parse(line).unwrap() else {
            panic!("not an interval")
        };
        assert_eq!(i.comms.len(), 3);
        assert_eq!(i.comms[1].bytes, 8388608);
        // An interval without comms, or another kind: nothing.
        assert_eq!(
            posted_sized(r#"{"kind":"interval","t":1,"dt_s":1}"#).unwrap(),
            Vec::<u64>::new()
        );
        assert_eq!(
            posted_sized(r#"{"kind":"end","t":1}"#).unwrap(),
            Vec::<u64>::new()
        );
        // A negative count is no u64: refused, never wrapped.
        assert!(posted_sized(
            r#"{"kind":"interval","t":1,"dt_s":1,"comms":[{"comm":1,"dir":"recv","dev":0,"bytes":5,"requests":1,"posted_sized":-1}]}"#
        )
        .is_err());
    }

    #[test]
    fn error_and_end_parse() {
        let line =
            r#"{"kind":"error","t":3.0,"comm":7,"call":"isend","dev":0,"size":4096,"code":3}"#;
        let Record::Error(e) = Record::parse(line).unwrap() else {
            panic!("not an error")
        };
        assert_eq!((e.comm, e.call.as_str(), e.code), (Some(7), "isend", 3));
        let Record::End(e) = Record::parse(r#"{"kind":"end","t":9.5}"#).unwrap() else {
            panic!("not an end")
        };
        assert_eq!(e.t, 9.5);
    }

    #[test]
    fn an_unknown_kind_is_unknown_and_a_broken_line_is_an_error() {
        assert_eq!(
            Record::parse(r#"{"kind":"gauge","t":1.0,"x":2}"#).unwrap(),
            Record::Unknown
        );
        assert!(Record::parse(r#"{"kind":"interval","t":1.0"#).is_err());
        assert!(Record::parse(r#"{"t":1.0}"#).is_err());
        // A negative counter is no u64: refused at parse, never wrapped.
        assert!(Record::parse(
            r#"{"kind":"interval","t":1,"dt_s":1,"comms":[{"comm":1,"dir":"send","dev":0,"bytes":-5,"requests":0}]}"#
        )
        .is_err());
    }

    #[test]
    fn records_round_trip() {
        let records = vec![
            Record::Start(Start {
                v: 1,
                t: 0.0,
                unix_s: 100.5,
                host: "h".into(),
                pid: 1,
                inner: "/x.so".into(),
                inner_name: "X".into(),
                api: 8,
                devices: vec![Device {
                    dev: 0,
                    name: "eth1".into(),
                    pci_path: "p".into(),
                    speed_mbps: 100000,
                    max_comms: 8,
                }],
            }),
            Record::Interval(Interval {
                t: 1.0,
                dt_s: 1.0,
                comms: vec![CommCounters {
                    comm: 2,
                    dir: Dir::Recv,
                    dev: 0,
                    link: "aaaaaaaaaaaaaaaa".into(),
                    bytes: 10,
                    requests: 1,
                    errors: 0,
                    inflight: 0,
                    lat_us: Histogram {
                        le: vec![1.0, 2.0],
                        counts: vec![1, 0, 0],
                    },
                    lat_sum_us: Some(1),
                    closed: false,
                }],
                dropped: Dropped::default(),
                omitted_comms: 0,
            }),
            Record::End(End { t: 2.0 }),
        ];
        for r in records {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(Record::parse(&line).unwrap(), r, "{line}");
        }
    }

    #[test]
    fn histogram_problems_are_named() {
        let h = Histogram {
            le: vec![1.0, 2.0],
            counts: vec![1],
        };
        assert!(h
            .problem()
            .unwrap()
            .contains("1 latency counts for 2 bounds"));
        let h = Histogram {
            le: vec![2.0, 1.0],
            counts: vec![0, 0],
        };
        assert!(h.problem().unwrap().contains("do not increase"));
    }
}
