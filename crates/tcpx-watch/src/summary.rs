//! What a watch directory says, as figures: per process, per NIC and per link, bytes, requests,
//! GB/s over the whole run and per time window, latency percentiles, start-up times, errors.
//!
//! Rates come from counter differences. Between two interval lines of one process, each comm's
//! bytes moved evenly over that span (the only assumption the counters allow); a window's GB/s
//! of a process is the bytes that fell in the window over the part of the window the process
//! covered, and a NIC's or link's GB/s is the sum over the processes using it. Windows are laid
//! on one wall-clock axis (each run's `start.unix_s` plus its `t`), so processes line up.
//! Latency percentiles are read from the summed histogram differences, linearly within a bucket
//! (a percentile in the overflow bucket is its lower bound).
//!
//! Receives counted at their posted size (`posted_sized`, [`crate::record::posted_sized`]: the
//! inner plugin reported no received size, as GPUDirect-TCPX never does) have bytes that are an
//! upper bound, not a figure. Where such a recv comm's link has a send end in the files read,
//! its received bytes and rates are the send end's (exact): a link's `recv` is its send end's
//! traffic (`recv_from_send_end`, with the recv end's own count in `recv_counted_bytes`), and a
//! NIC's or process's `recv` takes that link's send segments' bytes in place of the comm's
//! (its requests and latency stay the comm's own). Where the link has no send end read, the
//! comm's figures stay, marked `recv_upper_bound`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::read::{Process, Run, WatchDir};
use crate::record::{Dir, Histogram};

/// The most windows a summary has: beyond it the window widens (bounded memory and output,
/// whatever clocks the files claim).
pub const MAX_WINDOWS: usize = 20_000;

/// How the figures are cut.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SummaryOptions {
    /// The window width in seconds; `None`: the median interval the shim wrote.
    pub window_s: Option<f64>,
}

/// Latency percentiles of requests, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub samples: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
}

/// One direction's traffic of a process, NIC or link.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Traffic {
    pub bytes: u64,
    pub requests: u64,
    pub errors: u64,
    /// Bytes over the seconds the processes covered (GB/s = 1e9 bytes/s); None before a second
    /// interval line.
    pub gbps: Option<f64>,
    /// GB/s per window (None where no process of it covered the window).
    pub gbps_windows: Vec<Option<f64>>,
    pub latency: Option<Percentiles>,
    /// Per window: the mean bytes of a completed request over the median request latency
    /// (GB/s while a request is in flight), None where no request completed. A slow link shows
    /// here even when the job spreads its bytes evenly over NICs and waits for the slowest.
    pub request_gbps_windows: Vec<Option<f64>>,
}

/// One process that loaded the shim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessFigures {
    pub host: String,
    pub pid: u32,
    pub inner: String,
    pub inner_name: String,
    pub api: Option<u32>,
    /// Start lines after the first (the shim re-initialised).
    pub restarts: usize,
    /// Whether its last run wrote an end line (a killed or still-running process has none).
    pub ended: bool,
    /// Seconds from its first start to its last line.
    pub span_s: f64,
    pub send: Traffic,
    pub recv: Traffic,
    /// See [`NicFigures::recv_upper_bound`].
    pub recv_upper_bound: bool,
    /// See [`NicFigures::recv_from_send_end`].
    pub recv_from_send_end: bool,
}

/// One NIC of one host: a device the inner plugin reported, or one a comm used.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NicFigures {
    pub host: String,
    pub dev: u32,
    /// The device's name as the inner plugin gave it.
    pub name: String,
    /// The name shown: the device's name, with its index where two devices share one.
    pub label: String,
    pub speed_mbps: Option<i64>,
    /// Whether the inner plugin reported it in a start line.
    pub reported: bool,
    /// Comms that used it.
    pub comms: usize,
    pub send: Traffic,
    pub recv: Traffic,
    /// Send plus receive, per window.
    pub total_gbps_windows: Vec<Option<f64>>,
    /// Some of `recv` is receives counted at their posted size with no send end read to take
    /// the figure from: its bytes and GB/s are an upper bound, not a measurement.
    pub recv_upper_bound: bool,
    /// Some of `recv`'s bytes are the paired send ends' (its recv comms counted posted sizes).
    pub recv_from_send_end: bool,
}

/// One connection: its send comm and its recv comm, paired by `link`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkFigures {
    pub link: String,
    /// `host/pid nic` of the sending end, where its file was read.
    pub send_end: Option<String>,
    pub recv_end: Option<String>,
    /// The NIC keys (host, dev) of the two ends.
    #[serde(skip)]
    pub nics: Vec<(String, u32)>,
    pub send: Traffic,
    /// The receiving end's traffic; where it counted posted sizes and the send end was read,
    /// the send end's bytes and rates (`recv_from_send_end`).
    pub recv: Traffic,
    /// The recv end counted completions at their posted size and the send end was read: `recv`'s
    /// bytes and rates are the send end's (exact).
    pub recv_from_send_end: bool,
    /// The recv end counted completions at their posted size and no send end was read: `recv`'s
    /// bytes and GB/s are an upper bound, not a measurement.
    pub recv_upper_bound: bool,
    /// The recv end's own byte count where it was replaced by the send end's (an upper bound).
    pub recv_counted_bytes: Option<u64>,
}

/// One set-up call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StartupFigure {
    pub host: String,
    pub pid: u32,
    pub call: String,
    pub dir: Option<String>,
    pub comm: u64,
    pub dev: u32,
    pub nic: String,
    pub link: String,
    /// Seconds since that process's shim init when it finished.
    pub t: f64,
    pub took_s: f64,
    pub ok: bool,
    pub code: i64,
}

/// One failed call of the inner plugin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorFigure {
    pub host: String,
    pub pid: u32,
    pub t: f64,
    pub call: String,
    pub comm: Option<u64>,
    pub nic: Option<String>,
    pub code: i64,
}

/// Everything `tcpx-run watch` shows of a directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub window_s: f64,
    /// Wall-clock seconds of window 0's start.
    pub origin_unix_s: f64,
    pub windows: usize,
    pub processes: Vec<ProcessFigures>,
    pub nics: Vec<NicFigures>,
    pub links: Vec<LinkFigures>,
    pub startup: Vec<StartupFigure>,
    pub errors: Vec<ErrorFigure>,
    /// What the shims could not record: comms beyond their tables, latency samples lost.
    pub dropped_comms: u64,
    pub dropped_lat_samples: u64,
    /// Requests beyond the shims' request tables (neither timed nor counted).
    pub dropped_requests: u64,
    /// Interval lines that left comms out to stay within the file bound.
    pub lines_omitting_comms: u64,
    pub notes: Vec<String>,
}

/// The percentile `q` (0..1) of a histogram (see the module doc).
pub fn percentile(le: &[f64], counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().fold(0u64, |a, c| a.saturating_add(*c));
    if total == 0 {
        return None;
    }
    let target = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0.0f64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let c = c as f64;
        if below + c >= target {
            let lower = if i == 0 { 0.0 } else { le[i - 1] };
            let Some(&upper) = le.get(i) else {
                return Some(lower);
            };
            let frac = ((target - below) / c).clamp(0.0, 1.0);
            return Some(lower + (upper - lower) * frac);
        }
        below += c;
    }
    le.last().copied()
}

fn percentiles(h: &Histogram) -> Option<Percentiles> {
    let samples = h.total();
    Some(Percentiles {
        samples,
        p50_us: percentile(&h.le, &h.counts, 0.5)?,
        p90_us: percentile(&h.le, &h.counts, 0.9)?,
        p99_us: percentile(&h.le, &h.counts, 0.99)?,
    })
}

/// One comm's counters moving between two interval lines of one run.
#[derive(Debug, Clone)]
struct Segment {
    /// Index into the list of runs (process, run).
    run: usize,
    a: f64,
    b: f64,
    dir: Dir,
    dev: u32,
    link: String,
    bytes: u64,
    requests: u64,
    errors: u64,
    lat: Histogram,
    /// Microseconds of request latency summed, where the shim wrote the sum.
    lat_sum_us: Option<u64>,
    /// A receive counted (in part) at posted sizes: its bytes are an upper bound.
    upper_bound: bool,
}

impl Segment {
    /// The segment's requests, errors and latency, without its bytes.
    fn without_bytes(&self) -> Segment {
        Segment {
            bytes: 0,
            ..self.clone()
        }
    }

    /// The segment's bytes alone, as received by the other end's `run` (its times are
    /// wall-clock: they stay).
    fn bytes_only(&self, run: usize) -> Segment {
        Segment {
            run,
            dir: Dir::Recv,
            requests: 0,
            errors: 0,
            lat: Histogram::default(),
            lat_sum_us: None,
            upper_bound: false,
            ..self.clone()
        }
    }
}

/// A histogram sum keyed by its bounds (a comm whose bounds differ is left out of it).
#[derive(Debug, Clone, Default)]
struct HistSum {
    h: Option<Histogram>,
    mismatched: bool,
}

impl HistSum {
    fn add(&mut self, d: &Histogram) {
        if d.counts.is_empty() {
            return;
        }
        match &mut self.h {
            None => self.h = Some(d.clone()),
            Some(h) if h.le == d.le && h.counts.len() == d.counts.len() => {
                for (a, b) in h.counts.iter_mut().zip(&d.counts) {
                    *a = a.saturating_add(*b);
                }
            }
            Some(_) => self.mismatched = true,
        }
    }
}

fn hist_delta(now: &Histogram, was: Option<&Histogram>) -> Histogram {
    match was {
        Some(w) if w.le == now.le && w.counts.len() == now.counts.len() => Histogram {
            le: now.le.clone(),
            counts: now
                .counts
                .iter()
                .zip(&w.counts)
                .map(|(n, w)| n.saturating_sub(*w))
                .collect(),
        },
        _ => now.clone(),
    }
}

/// Accumulates one unit's (process, NIC or link) traffic of one direction.
#[derive(Default)]
struct Acc {
    bytes: u64,
    requests: u64,
    errors: u64,
    /// (run, window) -> bytes that fell in it.
    window_bytes: BTreeMap<(usize, usize), f64>,
    runs: BTreeSet<usize>,
    lat: HistSum,
    /// window -> what the segments whose midpoint is in it completed.
    window_req: BTreeMap<usize, WindowRequests>,
}

/// Requests completed in one window.
#[derive(Default)]
struct WindowRequests {
    bytes: u64,
    requests: u64,
    lat: HistSum,
    /// The latency sum, while every segment had one.
    lat_sum_us: Option<u64>,
    segments: usize,
}

impl WindowRequests {
    /// Mean request bytes over the median request latency (the histogram's, or the mean from
    /// the latency sum where there is no histogram), GB/s. The median because a request stalled
    /// by a starved CPU in a window must not decide the window.
    fn request_gbps(&self) -> Option<f64> {
        if self.requests == 0 {
            return None;
        }
        let mean_bytes = self.bytes as f64 / self.requests as f64;
        let median = self
            .lat
            .h
            .as_ref()
            .and_then(|h| percentile(&h.le, &h.counts, 0.5));
        let lat_us = match (median, self.lat_sum_us) {
            (Some(m), _) => m,
            (None, Some(sum)) => sum as f64 / self.requests as f64,
            (None, None) => return None,
        };
        (lat_us > 0.0).then(|| mean_bytes / lat_us / 1e3)
    }
}

struct Axis {
    origin: f64,
    width: f64,
    windows: usize,
    /// Per run, its covered span [a, b].
    cover: Vec<(f64, f64)>,
}

impl Axis {
    fn window_of(&self, x: f64) -> usize {
        (((x - self.origin) / self.width).floor().max(0.0) as usize).min(self.windows - 1)
    }

    fn span(&self, w: usize) -> (f64, f64) {
        let a = self.origin + w as f64 * self.width;
        (a, a + self.width)
    }

    fn covered(&self, run: usize, w: usize) -> f64 {
        let (a, b) = self.span(w);
        let (ra, rb) = self.cover[run];
        (b.min(rb) - a.max(ra)).max(0.0)
    }
}

impl Acc {
    fn add(&mut self, s: &Segment, axis: &Axis) {
        self.bytes = self.bytes.saturating_add(s.bytes);
        self.requests = self.requests.saturating_add(s.requests);
        self.errors = self.errors.saturating_add(s.errors);
        self.runs.insert(s.run);
        self.lat.add(&s.lat);
        if s.b > s.a {
            let (first, last) = (axis.window_of(s.a), axis.window_of(s.b));
            for w in first..=last {
                let (wa, wb) = axis.span(w);
                let overlap = (wb.min(s.b) - wa.max(s.a)).max(0.0);
                if overlap > 0.0 {
                    *self.window_bytes.entry((s.run, w)).or_default() +=
                        s.bytes as f64 * overlap / (s.b - s.a);
                }
            }
        } else {
            *self
                .window_bytes
                .entry((s.run, axis.window_of(s.a)))
                .or_default() += s.bytes as f64;
        }
        let mid = axis.window_of((s.a + s.b) / 2.0);
        let e = self.window_req.entry(mid).or_default();
        e.bytes = e.bytes.saturating_add(s.bytes);
        e.requests = e.requests.saturating_add(s.requests);
        e.lat.add(&s.lat);
        e.lat_sum_us = match (e.segments, e.lat_sum_us, s.lat_sum_us) {
            (0, _, new) => new,
            (_, Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
        e.segments += 1;
    }

    fn traffic(&self, axis: &Axis) -> Traffic {
        let mut gbps_windows = vec![None; axis.windows];
        for (w, slot) in gbps_windows.iter_mut().enumerate() {
            let mut rate = None;
            for &run in &self.runs {
                let cov = axis.covered(run, w);
                if cov > 0.0 {
                    let bytes = self.window_bytes.get(&(run, w)).copied().unwrap_or(0.0);
                    *rate.get_or_insert(0.0) += bytes / cov / 1e9;
                }
            }
            *slot = rate;
        }
        let covered = union_len(self.runs.iter().map(|&r| axis.cover[r]).collect());
        let mut request_gbps_windows = vec![None; axis.windows];
        for (&w, req) in &self.window_req {
            request_gbps_windows[w] = req.request_gbps();
        }
        Traffic {
            bytes: self.bytes,
            requests: self.requests,
            errors: self.errors,
            // Over the time any of its processes covered (processes side by side count once).
            gbps: (covered > 0.0).then(|| self.bytes as f64 / covered / 1e9),
            gbps_windows,
            latency: self.lat.h.as_ref().and_then(percentiles),
            request_gbps_windows,
        }
    }
}

/// One end of a link: (host, pid, dev).
type LinkEnd = (String, u32, u32);

/// The length of the union of spans.
fn union_len(mut spans: Vec<(f64, f64)>) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for (a, b) in spans {
        match cur {
            Some((ca, cb)) if a <= cb => cur = Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                cur = Some((a, b));
            }
            None => cur = Some((a, b)),
        }
    }
    total + cur.map_or(0.0, |(a, b)| b - a)
}

/// The run's clock on the shared axis: wall-clock where its start gave one, else the earliest
/// start of any run (its start line was rotated away).
fn run_offset(run: &Run, fallback: f64) -> f64 {
    run.start.as_ref().map_or(fallback, |s| s.unix_s)
}

fn dev_name(run: &Run, dev: u32) -> Option<String> {
    run.start
        .as_ref()?
        .devices
        .iter()
        .find(|d| d.dev == dev)
        .map(|d| d.name.clone())
}

/// Summarises a directory's processes.
pub fn summarise(dir: &WatchDir, options: &SummaryOptions) -> Summary {
    let mut notes = dir.notes.clone();
    let runs: Vec<(usize, &Process, &Run)> = dir
        .processes
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| p.runs.iter().map(move |r| (pi, p, r)))
        .collect();
    let earliest = runs
        .iter()
        .filter_map(|(_, _, r)| r.start.as_ref().map(|s| s.unix_s))
        .fold(f64::INFINITY, f64::min);
    let earliest = if earliest.is_finite() { earliest } else { 0.0 };
    for (_, p, r) in &runs {
        if r.start.is_none() && !r.intervals.is_empty() {
            notes.push(format!(
                "{}/{}: lines whose start line was rotated away: its counters begin at its first \
                 interval and its clock is placed at the earliest start",
                p.host, p.pid
            ));
        }
    }

    // Segments: counter differences between consecutive interval lines of a run.
    let mut segments = Vec::new();
    let mut cover = Vec::with_capacity(runs.len());
    let mut dropped_comms = 0u64;
    let mut dropped_lat_samples = 0u64;
    let mut dropped_requests = 0u64;
    let mut lines_omitting_comms = 0u64;
    let mut dts = Vec::new();
    for (ri, (_, _, run)) in runs.iter().enumerate() {
        let off = run_offset(run, earliest);
        let mut prev: BTreeMap<(u64, Dir), &crate::record::CommCounters> = BTreeMap::new();
        // A run with a start begins at t = 0 with every counter at zero.
        let mut prev_t = run.start.as_ref().map(|s| s.t);
        let mut span: Option<(f64, f64)> = None;
        for (k, iv) in run.intervals.iter().enumerate() {
            let posted = run.posted_sized.get(k);
            dts.push(iv.dt_s);
            lines_omitting_comms += u64::from(iv.omitted_comms > 0);
            if let Some(pt) = prev_t {
                let (a, b) = (off + pt, off + iv.t);
                span = Some(span.map_or((a, b), |(x, _)| (x, b)));
                for (j, c) in iv.comms.iter().enumerate() {
                    let was = prev.get(&(c.comm, c.dir));
                    let posted_sized = posted.and_then(|p| p.get(j)).copied().unwrap_or(0);
                    // A comm not in the previous line is new since then: its counters began at
                    // zero. (A run without start has no previous line for its first: no segment.)
                    segments.push(Segment {
                        run: ri,
                        a,
                        b,
                        dir: c.dir,
                        dev: c.dev,
                        link: c.link.clone(),
                        bytes: c.bytes.saturating_sub(was.map_or(0, |w| w.bytes)),
                        requests: c.requests.saturating_sub(was.map_or(0, |w| w.requests)),
                        errors: c.errors.saturating_sub(was.map_or(0, |w| w.errors)),
                        lat: hist_delta(&c.lat_us, was.map(|w| &w.lat_us)),
                        lat_sum_us: match (c.lat_sum_us, was.map(|w| w.lat_sum_us)) {
                            (Some(n), Some(Some(w))) => Some(n.saturating_sub(w)),
                            (Some(n), None) => Some(n),
                            _ => None,
                        },
                        upper_bound: c.dir == Dir::Recv && posted_sized > 0,
                    });
                }
            }
            // A comm missing from a line (left out to keep the line bounded) keeps its last
            // counters: when it is listed again, only what it moved since counts.
            prev.extend(iv.comms.iter().map(|c| ((c.comm, c.dir), c)));
            prev_t = Some(iv.t);
        }
        // The dropped counters are cumulative: a run's last line has its totals.
        if let Some(last) = run.intervals.last() {
            dropped_comms = dropped_comms.saturating_add(last.dropped.comms);
            dropped_lat_samples = dropped_lat_samples.saturating_add(last.dropped.lat_samples);
            dropped_requests = dropped_requests.saturating_add(last.dropped.requests);
        }
        cover.push(span.unwrap_or((off, off)));
    }

    // The axis.
    let lo = cover.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
    let hi = cover.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    let mut width = options
        .window_s
        .filter(|w| w.is_finite() && *w > 0.0)
        .or_else(|| tcpx_model::median(&dts).filter(|w| *w > 0.0))
        .unwrap_or(1.0);
    let (origin, windows) = if lo.is_finite() && hi > lo {
        if (hi - lo) / width > MAX_WINDOWS as f64 {
            let wider = (hi - lo) / MAX_WINDOWS as f64;
            notes.push(format!(
                "the files span {:.0} s: windows widened from {width} s to {wider:.3} s (at most {MAX_WINDOWS})",
                hi - lo
            ));
            width = wider;
        }
        (
            lo,
            (((hi - lo) / width).ceil() as usize).clamp(1, MAX_WINDOWS),
        )
    } else {
        (if lo.is_finite() { lo } else { earliest }, 1)
    };
    let axis = Axis {
        origin,
        width,
        windows,
        cover,
    };

    // Names of NICs: (host, dev) -> name, from start lines.
    let mut nic_names: BTreeMap<(String, u32), (String, Option<i64>, bool)> = BTreeMap::new();
    for (_, p, r) in &runs {
        if let Some(s) = &r.start {
            for d in &s.devices {
                nic_names.insert(
                    (p.host.clone(), d.dev),
                    (d.name.clone(), Some(d.speed_mbps), true),
                );
            }
        }
    }
    let mut nic_acc: BTreeMap<(String, u32), [Acc; 2]> = BTreeMap::new();
    let mut nic_comms: BTreeMap<(String, u32), BTreeSet<(usize, u64)>> = BTreeMap::new();
    let mut proc_acc: Vec<[Acc; 2]> = dir.processes.iter().map(|_| Default::default()).collect();
    let mut link_acc: BTreeMap<String, [Acc; 2]> = BTreeMap::new();
    let mut link_ends: BTreeMap<String, [Option<LinkEnd>; 2]> = BTreeMap::new();
    let d = |dir: Dir| usize::from(dir == Dir::Recv);
    // Comm ids per process run, to count a NIC's comms.
    let comm_of: Vec<BTreeMap<(u64, Dir), u32>> = runs
        .iter()
        .map(|(_, _, r)| {
            r.intervals
                .iter()
                .flat_map(|iv| iv.comms.iter().map(|c| ((c.comm, c.dir), c.dev)))
                .collect()
        })
        .collect();
    for (ri, m) in comm_of.iter().enumerate() {
        let p = runs[ri].1;
        for ((comm, _), dev) in m {
            nic_comms
                .entry((p.host.clone(), *dev))
                .or_default()
                .insert((ri, *comm));
        }
    }
    // Links with a send end read: their posted-sized receives take the send end's bytes.
    let mut send_segments: BTreeMap<&str, Vec<&Segment>> = BTreeMap::new();
    for s in segments
        .iter()
        .filter(|s| s.dir == Dir::Send && !s.link.is_empty())
    {
        send_segments.entry(s.link.as_str()).or_default().push(s);
    }
    let paired = |s: &Segment| s.upper_bound && send_segments.contains_key(s.link.as_str());
    // (NIC, link) and (process, link) whose received bytes come from the link's send end.
    // (NIC, link, receiving run) and (process, link, receiving run).
    let mut nic_from_send: BTreeSet<((String, u32), String, usize)> = BTreeSet::new();
    let mut proc_from_send: BTreeSet<(usize, String, usize)> = BTreeSet::new();
    let mut nic_bound: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut proc_bound: BTreeSet<usize> = BTreeSet::new();
    let mut link_bound: BTreeSet<String> = BTreeSet::new();
    for s in &segments {
        let (pi, p, run) = runs[s.run];
        let key = (p.host.clone(), s.dev);
        nic_names.entry(key.clone()).or_insert_with(|| {
            (
                dev_name(run, s.dev).unwrap_or_else(|| format!("dev{}", s.dev)),
                None,
                false,
            )
        });
        if paired(s) {
            let own = s.without_bytes();
            nic_acc.entry(key.clone()).or_default()[1].add(&own, &axis);
            proc_acc[pi][1].add(&own, &axis);
            nic_from_send.insert((key, s.link.clone(), s.run));
            proc_from_send.insert((pi, s.link.clone(), s.run));
        } else {
            if s.upper_bound {
                nic_bound.insert(key.clone());
                proc_bound.insert(pi);
            }
            nic_acc.entry(key).or_default()[d(s.dir)].add(s, &axis);
            proc_acc[pi][d(s.dir)].add(s, &axis);
        }
        if s.upper_bound && !s.link.is_empty() {
            link_bound.insert(s.link.clone());
        }
        if !s.link.is_empty() {
            link_acc.entry(s.link.clone()).or_default()[d(s.dir)].add(s, &axis);
            link_ends.entry(s.link.clone()).or_default()[d(s.dir)] =
                Some((p.host.clone(), p.pid, s.dev));
        }
    }

    // The send end's bytes, as the receiving run's: its GB/s over the time that run covered.
    for (key, link, run) in &nic_from_send {
        let acc = &mut nic_acc.entry(key.clone()).or_default()[1];
        for s in send_segments.get(link.as_str()).into_iter().flatten() {
            acc.add(&s.bytes_only(*run), &axis);
        }
    }
    for (pi, link, run) in &proc_from_send {
        for s in send_segments.get(link.as_str()).into_iter().flatten() {
            proc_acc[*pi][1].add(&s.bytes_only(*run), &axis);
        }
    }
    let paired_links = link_bound
        .iter()
        .filter(|l| send_segments.contains_key(l.as_str()))
        .count();
    if !link_bound.is_empty() {
        let unpaired = link_bound.len() - paired_links;
        notes.push(format!(
            "{} link(s)' recv ends counted completions at their posted size (the inner plugin \
             reports no received size, as GPUDirect-TCPX): an upper bound; {paired_links} of them \
             take their received bytes and GB/s from their send end (exact){}",
            link_bound.len(),
            if unpaired > 0 {
                format!(
                    ", {unpaired} have no send end read and show an upper bound (<=), not a rate"
                )
            } else {
                String::new()
            }
        ));
    }

    let mut hist_mismatch = false;
    let label_of = |host: &str, dev: u32| -> String {
        let name = nic_names
            .get(&(host.to_string(), dev))
            .map(|n| n.0.clone())
            .unwrap_or_else(|| format!("dev{dev}"));
        let shared = nic_names
            .iter()
            .filter(|((h, _), n)| h == host && n.0 == name)
            .count()
            > 1;
        if shared {
            format!("{name}#{dev}")
        } else {
            name
        }
    };
    let mut nics = Vec::new();
    for ((host, dev), (name, speed, reported)) in &nic_names {
        let empty: [Acc; 2] = Default::default();
        let acc = nic_acc.get(&(host.clone(), *dev)).unwrap_or(&empty);
        hist_mismatch |= acc[0].lat.mismatched || acc[1].lat.mismatched;
        let (send, recv) = (acc[0].traffic(&axis), acc[1].traffic(&axis));
        let total_gbps_windows = send
            .gbps_windows
            .iter()
            .zip(&recv.gbps_windows)
            .map(|(a, b)| match (a, b) {
                (None, None) => None,
                _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
            })
            .collect();
        nics.push(NicFigures {
            host: host.clone(),
            dev: *dev,
            name: name.clone(),
            label: label_of(host, *dev),
            speed_mbps: *speed,
            reported: *reported,
            comms: nic_comms.get(&(host.clone(), *dev)).map_or(0, |c| c.len()),
            send,
            recv,
            total_gbps_windows,
            recv_upper_bound: nic_bound.contains(&(host.clone(), *dev)),
            recv_from_send_end: nic_from_send
                .iter()
                .any(|(k, _, _)| k.0 == *host && k.1 == *dev),
        });
    }
    let processes = dir
        .processes
        .iter()
        .zip(&proc_acc)
        .enumerate()
        .map(|(pi, (p, acc))| {
            let first = p.runs.iter().find_map(|r| r.start.as_ref());
            let span_s = union_len(
                runs.iter()
                    .enumerate()
                    .filter(|(_, (pj, _, _))| *pj == pi)
                    .map(|(ri, _)| axis.cover[ri])
                    .collect(),
            );
            ProcessFigures {
                host: p.host.clone(),
                pid: p.pid,
                inner: first.map(|s| s.inner.clone()).unwrap_or_default(),
                inner_name: first.map(|s| s.inner_name.clone()).unwrap_or_default(),
                api: first.map(|s| s.api),
                restarts: p
                    .runs
                    .iter()
                    .filter(|r| r.start.is_some())
                    .count()
                    .saturating_sub(1),
                ended: p.runs.last().is_some_and(|r| r.end.is_some()),
                span_s,
                send: acc[0].traffic(&axis),
                recv: acc[1].traffic(&axis),
                recv_upper_bound: proc_bound.contains(&pi),
                recv_from_send_end: proc_from_send.iter().any(|(p, _, _)| *p == pi),
            }
        })
        .collect();
    let end_text = |e: &Option<LinkEnd>| {
        e.as_ref()
            .map(|(h, pid, dev)| format!("{h}/{pid} {}", label_of(h, *dev)))
    };
    let links = link_acc
        .iter()
        .map(|(link, acc)| {
            let ends = link_ends.get(link).cloned().unwrap_or_default();
            let send = acc[0].traffic(&axis);
            let mut recv = acc[1].traffic(&axis);
            let bound = link_bound.contains(link);
            let from_send = bound && send_segments.contains_key(link.as_str());
            let mut recv_counted_bytes = None;
            if from_send {
                recv_counted_bytes = Some(recv.bytes);
                recv = Traffic {
                    bytes: send.bytes,
                    gbps: send.gbps,
                    gbps_windows: send.gbps_windows.clone(),
                    // A receive's request size is what was posted: no speed to take from it.
                    request_gbps_windows: vec![None; axis.windows],
                    ..recv
                };
            }
            LinkFigures {
                link: link.clone(),
                send_end: end_text(&ends[0]),
                recv_end: end_text(&ends[1]),
                nics: ends
                    .iter()
                    .flatten()
                    .map(|(h, _, dev)| (h.clone(), *dev))
                    .collect(),
                send,
                recv,
                recv_from_send_end: from_send,
                recv_upper_bound: bound && !from_send,
                recv_counted_bytes,
            }
        })
        .collect();
    if hist_mismatch {
        notes.push(
            "some comms' latency histograms have other bucket bounds than their NIC's first: \
             left out of its percentiles"
                .into(),
        );
    }

    let mut startup = Vec::new();
    let mut errors = Vec::new();
    for (_, p, r) in &runs {
        for c in &r.conns {
            startup.push(StartupFigure {
                host: p.host.clone(),
                pid: p.pid,
                call: c.call.as_str().into(),
                dir: c.dir.map(|d| d.as_str().to_string()),
                comm: c.comm,
                dev: c.dev,
                nic: label_of(&p.host, c.dev),
                link: c.link.clone(),
                t: c.t,
                took_s: c.took_s,
                ok: c.ok,
                code: c.code,
            });
            if !c.ok {
                errors.push(ErrorFigure {
                    host: p.host.clone(),
                    pid: p.pid,
                    t: c.t,
                    call: c.call.as_str().into(),
                    comm: (c.comm != 0).then_some(c.comm),
                    nic: Some(label_of(&p.host, c.dev)),
                    code: c.code,
                });
            }
        }
        for e in &r.errors {
            errors.push(ErrorFigure {
                host: p.host.clone(),
                pid: p.pid,
                t: e.t,
                call: e.call.clone(),
                comm: e.comm,
                nic: e.dev.map(|d| label_of(&p.host, d)),
                code: e.code,
            });
        }
    }
    Summary {
        window_s: width,
        origin_unix_s: origin,
        windows,
        processes,
        nics,
        links,
        startup,
        errors,
        dropped_comms,
        dropped_lat_samples,
        dropped_requests,
        lines_omitting_comms,
        notes,
    }
}
