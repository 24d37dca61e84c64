//! The shim's files: JSON lines in `DIR/watch-<host>-<pid>.jsonl` (the contract
//! `tcpx_watch::record` reads) and, optionally, a Prometheus textfile.
//!
//! Bounds: the file is renamed to `.jsonl.1` (replacing an older one) once the next line would
//! take it past half of `TCPX_WATCH_MAX_MB`, so the two together stay within it. A new file
//! starts with the process's `start` line again (same `unix_s` and `pid`: a continuation, not a
//! restart), so each file names its devices. An interval line too large for half the bound
//! lists the comms that fit and counts the rest (`omitted_comms`). The directory is created 0700
//! when absent; every file is created with `O_CREAT | O_EXCL | O_NOFOLLOW` (never written through
//! a link), the textfile under a temporary name and renamed.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::recorder::{
    lat_bound_us, CommStats, ConnEvent, ErrorEvent, Recorder, LAT_BOUNDS, LAT_BUCKETS,
};

/// One device as the real plugin described it at init.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub dev: i32,
    pub name: String,
    pub pci_path: String,
    pub speed_mbps: i64,
    pub max_comms: i64,
    /// An UNPACK device (GPUDirect-TCPX): receives are handed back with `irecvConsumed`.
    pub unpack: bool,
}

/// What the `start` line says.
#[derive(Debug, Clone)]
pub struct StartInfo {
    pub unix_s: f64,
    pub host: String,
    pub pid: u32,
    pub inner: String,
    pub inner_name: String,
    pub inner_api: u32,
    pub api: u32,
    pub devices: Vec<DeviceInfo>,
}

/// JSON string literal of `s`.
pub fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A finite f64 as JSON (non-finite ones as 0: JSON has no NaN).
fn num(out: &mut String, x: f64) {
    if x.is_finite() {
        let _ = write!(out, "{x}");
    } else {
        out.push('0');
    }
}

pub fn start_line(s: &StartInfo) -> String {
    let mut o = String::with_capacity(256);
    o.push_str("{\"kind\":\"start\",\"v\":1,\"t\":0.0,\"unix_s\":");
    num(&mut o, s.unix_s);
    o.push_str(",\"host\":");
    json_str(&mut o, &s.host);
    let _ = write!(o, ",\"pid\":{},\"inner\":", s.pid);
    json_str(&mut o, &s.inner);
    o.push_str(",\"inner_name\":");
    json_str(&mut o, &s.inner_name);
    let _ = write!(
        o,
        ",\"api\":{},\"inner_api\":{},\"devices\":[",
        s.api, s.inner_api
    );
    for (i, d) in s.devices.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{{\"dev\":{},\"name\":", d.dev);
        json_str(&mut o, &d.name);
        o.push_str(",\"pci_path\":");
        json_str(&mut o, &d.pci_path);
        let _ = write!(
            o,
            ",\"speed_mbps\":{},\"max_comms\":{}}}",
            d.speed_mbps, d.max_comms
        );
    }
    o.push_str("]}");
    o
}

pub fn conn_line(e: &ConnEvent) -> String {
    let mut o = String::with_capacity(160);
    o.push_str("{\"kind\":\"conn\",\"t\":");
    num(&mut o, e.t);
    let _ = write!(o, ",\"comm\":{}", e.comm);
    if let Some(d) = e.dir {
        let _ = write!(o, ",\"dir\":\"{}\"", d.as_str());
    }
    let _ = write!(
        o,
        ",\"dev\":{},\"link\":\"{:016x}\",\"call\":\"{}\",\"took_s\":",
        e.dev.max(0),
        e.link,
        e.call
    );
    num(&mut o, e.took_s);
    let _ = write!(o, ",\"ok\":{},\"code\":{}}}", e.ok, e.code);
    o
}

pub fn error_line(e: &ErrorEvent) -> String {
    let mut o = String::with_capacity(120);
    o.push_str("{\"kind\":\"error\",\"t\":");
    num(&mut o, e.t);
    if let Some(c) = e.comm {
        let _ = write!(o, ",\"comm\":{c}");
    }
    let _ = write!(o, ",\"call\":\"{}\"", e.call);
    if let Some(d) = e.dev {
        let _ = write!(o, ",\"dev\":{}", d.max(0));
    }
    if let Some(l) = e.link {
        let _ = write!(o, ",\"link\":\"{l:016x}\"");
    }
    let _ = write!(o, ",\"code\":{}}}", e.code);
    o
}

/// One comm's entry of an interval line.
fn comm_entry(o: &mut String, c: &CommStats) {
    let requests = c.requests.load(Ordering::Relaxed);
    let posted = c.posted.load(Ordering::Relaxed);
    let _ = write!(
        o,
        "{{\"comm\":{},\"dir\":\"{}\",\"dev\":{},\"link\":\"{:016x}\",\"bytes\":{},\"requests\":{},\
         \"errors\":{},\"inflight\":{},\"closed\":{},\"lat_us\":{{\"le\":[",
        c.id,
        c.dir.as_str(),
        c.dev.max(0),
        c.link,
        c.bytes.load(Ordering::Relaxed),
        requests,
        c.errors.load(Ordering::Relaxed),
        posted.saturating_sub(requests),
        c.closed.load(Ordering::Relaxed),
    );
    for i in 0..LAT_BOUNDS {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{}", lat_bound_us(i));
    }
    o.push_str("],\"counts\":[");
    for i in 0..LAT_BUCKETS {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{}", c.lat[i].load(Ordering::Relaxed));
    }
    let _ = write!(
        o,
        "]}},\"lat_sum_us\":{},\"posted_sized\":{}}}",
        c.lat_sum_ns.load(Ordering::Relaxed) / 1000,
        c.posted_sized.load(Ordering::Relaxed)
    );
}

/// The interval line at `t`, listing comms while the line stays within `budget` bytes.
pub fn interval_line(rec: &Recorder, t: f64, dt_s: f64, budget: usize) -> String {
    let mut o = String::with_capacity(1024);
    o.push_str("{\"kind\":\"interval\",\"t\":");
    num(&mut o, t);
    o.push_str(",\"dt_s\":");
    num(&mut o, dt_s);
    o.push_str(",\"comms\":[");
    // Room kept for the tail (dropped counters), at most ~200 bytes.
    let limit = budget.saturating_sub(256);
    let mut omitted = 0u64;
    let mut first = true;
    let mut entry = String::with_capacity(600);
    for c in rec.comms() {
        entry.clear();
        comm_entry(&mut entry, c);
        if o.len() + entry.len() + 1 > limit {
            omitted += 1;
            continue;
        }
        if !first {
            o.push(',');
        }
        first = false;
        o.push_str(&entry);
    }
    let d = &rec.dropped;
    let _ = write!(
        o,
        "],\"dropped\":{{\"comms\":{},\"lat_samples\":{},\"requests\":{},\"error_lines\":{},\
         \"conn_lines\":{}}},\"omitted_comms\":{omitted}}}",
        d.comms.load(Ordering::Relaxed),
        d.lat_samples.load(Ordering::Relaxed),
        d.requests.load(Ordering::Relaxed),
        d.error_lines.load(Ordering::Relaxed),
        d.conn_lines.load(Ordering::Relaxed),
    );
    o
}

pub fn end_line(t: f64) -> String {
    let mut o = String::from("{\"kind\":\"end\",\"t\":");
    num(&mut o, t);
    o.push('}');
    o
}

/// Host name as a file-name part: `[A-Za-z0-9._-]`, others as `_`, at most 64 characters.
pub fn file_safe(s: &str) -> String {
    let s: String = s
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with('.') {
        format!("_{s}")
    } else {
        s
    }
}

fn create_new(path: &Path, mode: u32) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The JSON-lines file of this process, rotated within its bound.
pub struct LinesFile {
    path: PathBuf,
    file: File,
    written: u64,
    /// Half of `TCPX_WATCH_MAX_MB`: the file is rotated before it would pass this.
    half: u64,
    start: String,
}

impl LinesFile {
    /// Creates `dir` (0700) when absent and `watch-<host>-<pid>.jsonl` in it, exclusively (a
    /// file left by an earlier process of the same pid gets a `-<unix seconds>` name instead).
    pub fn create(dir: &Path, start: &StartInfo, max_bytes: u64) -> Result<LinesFile, String> {
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    format!(
                        "cannot create TCPX_WATCH_DIR {}: {e}; check the path and its parent's \
                         permissions",
                        dir.display()
                    )
                })?;
        }
        let base = format!("watch-{}-{}", file_safe(&start.host), start.pid);
        let mut path = dir.join(format!("{base}.jsonl"));
        let file = match create_new(&path, 0o600) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                path = dir.join(format!("{base}-{}.jsonl", start.unix_s as u64));
                create_new(&path, 0o600).map_err(|e| {
                    format!(
                        "cannot create {}: {e}; check TCPX_WATCH_DIR",
                        path.display()
                    )
                })?
            }
            Err(e) => {
                return Err(format!(
                    "cannot create {}: {e}; check TCPX_WATCH_DIR (a link there is refused)",
                    path.display()
                ))
            }
        };
        let mut f = LinesFile {
            path,
            file,
            written: 0,
            half: (max_bytes / 2).max(1),
            start: start_line(start),
        };
        let line = f.start.clone();
        f.write_line(&line)?;
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The most bytes one line may have to fit the bound.
    pub fn line_budget(&self) -> usize {
        usize::try_from(self.half.saturating_sub(self.start.len() as u64 + 1)).unwrap_or(usize::MAX)
    }

    /// Appends one line, rotating first if it would take the file past half the bound. A line
    /// that cannot fit even a fresh file is not written.
    pub fn write_line(&mut self, line: &str) -> Result<(), String> {
        let len = line.len() as u64 + 1;
        if self.written + len > self.half && self.written > 0 {
            self.rotate()?;
        }
        if self.written + len > self.half {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        self.file
            .write_all(&buf)
            .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        self.written += len;
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), String> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)
            .map_err(|e| format!("rotating {}: {e}", self.path.display()))?;
        self.file = create_new(&self.path, 0o600)
            .map_err(|e| format!("starting a new {}: {e}", self.path.display()))?;
        self.written = 0;
        let start = self.start.clone();
        let len = start.len() as u64 + 1;
        if len <= self.half {
            self.file
                .write_all(format!("{start}\n").as_bytes())
                .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
            self.written = len;
        }
        Ok(())
    }
}

/// Escapes a Prometheus label value.
fn label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('_'),
            c => out.push(c),
        }
    }
}

/// A per-comm metric of the textfile: name, type, help, and how to read it.
type Metric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CommStats) -> u64,
);

/// The Prometheus textfile (node exporter textfile collector convention) for every comm.
pub fn prom_text(rec: &Recorder, devices: &[DeviceInfo], pid: u32) -> String {
    let mut o = String::with_capacity(4096);
    let labels = |o: &mut String, c: &CommStats| {
        let nic = devices
            .iter()
            .find(|d| d.dev == c.dev)
            .map_or("", |d| d.name.as_str());
        o.push_str("{dev=\"");
        label(o, nic);
        let _ = write!(
            o,
            "\",devidx=\"{}\",dir=\"{}\",link=\"{:016x}\",comm=\"{}\",pid=\"{pid}\"",
            c.dev,
            c.dir.as_str(),
            c.link,
            c.id
        );
    };
    let counters: [Metric; 4] = [
        (
            "tcpx_watch_bytes_total",
            "counter",
            "Bytes of requests completed on a comm since the shim's init.",
            |c| c.bytes.load(Ordering::Relaxed),
        ),
        (
            "tcpx_watch_requests_total",
            "counter",
            "Requests completed on a comm since the shim's init.",
            |c| c.requests.load(Ordering::Relaxed),
        ),
        (
            "tcpx_watch_errors_total",
            "counter",
            "Calls of the real plugin on a comm that returned an error.",
            |c| c.errors.load(Ordering::Relaxed),
        ),
        (
            "tcpx_watch_inflight",
            "gauge",
            "Requests posted on a comm and not yet completed.",
            |c| {
                c.posted
                    .load(Ordering::Relaxed)
                    .saturating_sub(c.requests.load(Ordering::Relaxed))
            },
        ),
    ];
    for (name, kind, help, value) in counters {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for c in rec.comms() {
            o.push_str(name);
            labels(&mut o, c);
            let _ = writeln!(o, "}} {}", value(c));
        }
    }
    let name = "tcpx_watch_request_latency_us";
    let _ = writeln!(
        o,
        "# HELP {name} Request latency, post to completion, in microseconds.\n# TYPE {name} histogram"
    );
    for c in rec.comms() {
        let mut cumulative = 0u64;
        for i in 0..LAT_BUCKETS {
            cumulative += c.lat[i].load(Ordering::Relaxed);
            let _ = write!(o, "{name}_bucket");
            labels(&mut o, c);
            if i < LAT_BOUNDS {
                let _ = writeln!(o, ",le=\"{}\"}} {cumulative}", lat_bound_us(i));
            } else {
                let _ = writeln!(o, ",le=\"+Inf\"}} {cumulative}");
            }
        }
        let _ = write!(o, "{name}_sum");
        labels(&mut o, c);
        let _ = writeln!(
            o,
            "}} {}",
            c.lat_sum_ns.load(Ordering::Relaxed) as f64 / 1000.0
        );
        let _ = write!(o, "{name}_count");
        labels(&mut o, c);
        let _ = writeln!(o, "}} {cumulative}");
    }
    let d = &rec.dropped;
    let _ = writeln!(
        o,
        "# HELP tcpx_watch_dropped_comms_total Comms beyond the shim's table, not recorded.\n\
         # TYPE tcpx_watch_dropped_comms_total counter\n\
         tcpx_watch_dropped_comms_total{{pid=\"{pid}\"}} {}\n\
         # HELP tcpx_watch_dropped_requests_total Requests passed through without a slot.\n\
         # TYPE tcpx_watch_dropped_requests_total counter\n\
         tcpx_watch_dropped_requests_total{{pid=\"{pid}\"}} {}",
        d.comms.load(Ordering::Relaxed),
        d.requests.load(Ordering::Relaxed)
    );
    o
}

/// Where the textfile goes: the path, or `tcpx-watch-<pid>.prom` in it when it is a directory.
pub fn prom_path(setting: &Path, pid: u32) -> PathBuf {
    if setting.is_dir() {
        setting.join(format!("tcpx-watch-{pid}.prom"))
    } else {
        setting.to_path_buf()
    }
}

/// Writes `text` to `path` through a temporary name in the same directory and a rename.
pub fn write_replacing(path: &Path, text: &str, pid: u32) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{pid}"));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = create_new(&tmp, 0o644).map_err(|e| {
        format!(
            "cannot create {}: {e}; check TCPX_WATCH_PROM",
            tmp.display()
        )
    })?;
    f.write_all(text.as_bytes())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming {} to {}: {e}", tmp.display(), path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::Dir;

    fn start() -> StartInfo {
        StartInfo {
            unix_s: 1_764_390_000.5,
            host: "a3 \"x\"\n".into(),
            pid: 42,
            inner: "/opt/lib/libnccl-net.so".into(),
            inner_name: "GPUDirectTCPX_v7".into(),
            inner_api: 7,
            api: 9,
            devices: vec![DeviceInfo {
                dev: 0,
                name: "eth1".into(),
                pci_path: "/sys/x".into(),
                speed_mbps: 200_000,
                max_comms: 65536,
                unpack: true,
            }],
        }
    }

    #[test]
    fn strings_are_escaped_and_file_names_safe() {
        let mut s = String::new();
        json_str(&mut s, "a\"b\\c\n\u{1}");
        assert_eq!(s, r#""a\"b\\c\n\u0001""#);
        assert_eq!(file_safe("a3 \"x\"\n"), "a3__x__");
        assert_eq!(file_safe("../.."), "_.._..");
        assert_eq!(file_safe(""), "_");
    }

    #[test]
    fn rotation_keeps_file_and_predecessor_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let watch = dir.path().join("w");
        let bound = 4000u64;
        let mut f = LinesFile::create(&watch, &start(), bound).unwrap();
        let line = "x".repeat(300);
        for _ in 0..100 {
            f.write_line(&line).unwrap();
        }
        let main = std::fs::metadata(f.path()).unwrap().len();
        let mut old = f.path().as_os_str().to_owned();
        old.push(".1");
        let old_len = std::fs::metadata(&old).unwrap().len();
        assert!(main + old_len <= bound, "{main} + {old_len} > {bound}");
        // Each file opens with the start line.
        for p in [f.path().to_path_buf(), PathBuf::from(&old)] {
            let text = std::fs::read_to_string(p).unwrap();
            assert!(text.starts_with("{\"kind\":\"start\""), "{text}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&watch).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_link_in_place_of_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let s = start();
        let name = format!("watch-{}-{}.jsonl", file_safe(&s.host), s.pid);
        std::os::unix::fs::symlink(&target, dir.path().join(&name)).unwrap();
        let f = LinesFile::create(dir.path(), &s, 1 << 20).unwrap();
        assert_ne!(f.path(), dir.path().join(&name));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn an_interval_too_large_for_the_budget_omits_comms_and_counts_them() {
        let rec = Recorder::new();
        for i in 0..10 {
            rec.new_comm(Dir::Send, 0, i);
        }
        let full = interval_line(&rec, 1.0, 1.0, 1 << 20);
        assert!(full.contains("\"omitted_comms\":0"), "{full}");
        let cut = interval_line(&rec, 1.0, 1.0, 1500);
        assert!(cut.len() <= 1500, "{}", cut.len());
        assert!(!cut.contains("\"omitted_comms\":0"), "{cut}");
    }

    #[test]
    fn prom_text_has_help_type_and_cumulative_buckets() {
        let rec = Recorder::new();
        let (_, t) = rec.new_comm(Dir::Recv, 0, 0xab);
        let t = t.unwrap();
        t.stats.bytes.store(1234, Ordering::Relaxed);
        t.stats.lat[3].store(2, Ordering::Relaxed);
        let text = prom_text(&rec, &start().devices, 42);
        assert!(
            text.contains("# TYPE tcpx_watch_bytes_total counter"),
            "{text}"
        );
        assert!(text.contains(
            "tcpx_watch_bytes_total{dev=\"eth1\",devidx=\"0\",dir=\"recv\",link=\"00000000000000ab\",comm=\"1\",pid=\"42\"} 1234"
        ), "{text}");
        assert!(text.contains("le=\"8\"} 2"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 2"), "{text}");
    }
}
