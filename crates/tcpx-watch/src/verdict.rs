//! What stands out in a summary, named: an idle NIC, a slow NIC or link, a start-up stall,
//! errors, and a job that did not run through the shim at all.
//!
//! Slow uses the fleet's straggler rule (`tcpx_report::stats::robust`): a NIC's figure at least
//! 10 % and 3.5 robust z under the median of the other NICs', and below them in *every* window
//! used as a repetition (windows in which nothing moved are left out). The z is taken on the
//! figures' logarithms (`standing_ratio`): a job's processes share CPUs, so one NIC's rate
//! halving in a window is the noise to measure a gap against, not an amount of GB/s. Two figures are judged:
//! the NIC's GB/s (send plus receive), which falls when the job moves bytes wherever a NIC is
//! free, and its send requests' speed (mean request bytes over median request latency), which
//! falls when the job spreads bytes evenly and waits for the slowest NIC (NCCL's channels, the
//! bench's round-robin). Receive latency is not judged: it is mostly how late the sender was.
//! The request speed's latency is a median from power-of-two buckets, so it names a NIC only
//! below half its peers' (a bucket's width), where GB/s uses the fleet's 10 %.
//! A link is judged the same way among links, and named only where neither of its NICs is.
//!
//! Receives counted at their posted size (see [`crate::summary`]) are no rate: a link judges its
//! send end's figures (a paired link's receive figures are its send end's anyway), a link with
//! only such a receive end is not judged, and where any NIC's receive figure is an upper bound
//! the NICs' GB/s judged is their send GB/s alone (every NIC alike).
//!
//! Idle: a device the inner plugin reported that carried no byte while others carried some.

use serde::Serialize;
use tcpx_report::stats::robust::{self, Thresholds};

use crate::summary::{LinkFigures, NicFigures, Summary, Traffic};

/// What a verdict is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// The job did not load the shim, or NCCL used another network.
    NoShim,
    IdleNic,
    SlowNic,
    SlowLink,
    StartupStall,
    Errors,
    /// The shims dropped comms or samples (their tables are bounded): figures are partial.
    Dropped,
}

impl VerdictKind {
    pub fn word(self) -> &'static str {
        match self {
            VerdictKind::NoShim => "no shim",
            VerdictKind::IdleNic => "idle NIC",
            VerdictKind::SlowNic => "slow NIC",
            VerdictKind::SlowLink => "slow link",
            VerdictKind::StartupStall => "start-up stall",
            VerdictKind::Errors => "errors",
            VerdictKind::Dropped => "dropped",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    /// `host nic` of a NIC finding, the link's id for a link.
    pub subject: String,
    /// The figure judged (`gbps`, `send_gbps` where receive figures are upper bounds,
    /// `send_request_gbps`), for slow findings.
    pub figure: Option<String>,
    pub value: Option<f64>,
    pub peers: Option<f64>,
    pub below_pct: Option<f64>,
    /// The gap window by window, lowest and highest.
    pub below_pct_range: Option<(f64, f64)>,
    pub robust_z: Option<f64>,
    pub text: String,
}

impl Verdict {
    fn plain(kind: VerdictKind, subject: String, text: String) -> Verdict {
        Verdict {
            kind,
            subject,
            figure: None,
            value: None,
            peers: None,
            below_pct: None,
            below_pct_range: None,
            robust_z: None,
            text,
        }
    }
}

/// What the verdicts are judged against.
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictOptions {
    pub thresholds: Thresholds,
    /// A connect or accept longer than this is a stall.
    pub stall_s: f64,
}

impl Default for VerdictOptions {
    fn default() -> Self {
        VerdictOptions {
            thresholds: Thresholds::default(),
            stall_s: 10.0,
        }
    }
}

/// Which figure of a unit is judged, per window.
type FigureOf<'a, T> = (&'static str, &'a dyn Fn(&T) -> &[Option<f64>]);

/// A unit flagged: its index, its figure, where it stands, its per-window gap range.
type Flagged = (usize, f64, robust::Standing, Option<(f64, f64)>);

/// The units of `units` flagged on `figure`.
fn slow_units<T>(
    units: &[&T],
    figure: &dyn Fn(&T) -> &[Option<f64>],
    t: &Thresholds,
) -> Vec<Flagged> {
    // Only units that have the figure at all (a NIC that only receives has no send figure).
    let units: Vec<(usize, &T)> = units
        .iter()
        .enumerate()
        .filter(|(_, u)| figure(u).iter().any(Option::is_some))
        .map(|(i, u)| (i, *u))
        .collect();
    let index: Vec<usize> = units.iter().map(|(i, _)| *i).collect();
    let units: Vec<&T> = units.into_iter().map(|(_, u)| u).collect();
    let windows = units.first().map_or(0, |u| figure(u).len());
    // Windows where every unit has the figure and something moved: the repetitions.
    let reps: Vec<usize> = (0..windows)
        .filter(|&w| {
            units
                .iter()
                .all(|u| figure(u).get(w).copied().flatten().is_some())
                && units.iter().any(|u| figure(u)[w].is_some_and(|v| v > 0.0))
        })
        .collect();
    if units.len() < 2 || reps.is_empty() {
        return Vec::new();
    }
    let value = |u: &T| -> Option<f64> {
        let v: Vec<f64> = reps.iter().filter_map(|&w| figure(u)[w]).collect();
        tcpx_model::median(&v)
    };
    let values: Vec<Option<f64>> = units.iter().map(|u| value(u)).collect();
    let all: Vec<f64> = values.iter().flatten().copied().collect();
    let mut out = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let Some(x) = *v else { continue };
        let others: Vec<f64> = values
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, v)| *v)
            .collect();
        let Some(s) = robust::standing_ratio(x, &others, &all, t) else {
            continue;
        };
        let gaps: Vec<f64> = reps
            .iter()
            .filter_map(|&w| {
                let x = figure(units[i])[w]?;
                let o: Vec<f64> = units
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .filter_map(|(_, u)| figure(u)[w])
                    .collect();
                let p = tcpx_model::median(&o)?;
                (p > 0.0).then(|| (x / p - 1.0) * 100.0)
            })
            .collect();
        let range = robust::gap_range(&gaps);
        if robust::flagged(&s, range, t) {
            out.push((index[i], x, s, range));
        }
    }
    out
}

/// The thresholds of one figure: the request speed's median latency comes from power-of-two
/// buckets (interpolated within one), which can put two equal NICs up to a factor of 2 apart
/// when their requests sit on a bucket bound; so that figure names a NIC only when it is under
/// half its peers' whatever the thresholds say.
fn figure_thresholds(figure: &str, t: &Thresholds) -> Thresholds {
    match figure {
        "send_request_gbps" => Thresholds {
            below_pct: t.below_pct.max(REQUEST_BELOW_PCT),
            ..*t
        },
        _ => *t,
    }
}

/// See [`figure_thresholds`]: strictly more than the bucket width.
const REQUEST_BELOW_PCT: f64 = 50.5;

/// A link's GB/s per window: its send end's, or its receive end's where only that was read and
/// it is a measurement (not an upper bound from posted sizes: then none).
fn link_gbps(l: &LinkFigures) -> &[Option<f64>] {
    if moved(&l.send) {
        &l.send.gbps_windows
    } else if l.recv_upper_bound {
        &[]
    } else {
        &l.recv.gbps_windows
    }
}

fn nic_subject(n: &NicFigures) -> String {
    format!("{} {}", n.host, n.label)
}

fn moved(t: &Traffic) -> bool {
    t.bytes > 0
}

/// Every verdict of a summary, most serious first (a shim missing comes from [`crate::fallback`]).
pub fn verdicts(s: &Summary, o: &VerdictOptions) -> Vec<Verdict> {
    let mut out = Vec::new();
    let t = &o.thresholds;

    // Idle NICs.
    let busy = s
        .nics
        .iter()
        .filter(|n| moved(&n.send) || moved(&n.recv))
        .count();
    if busy > 0 {
        for n in &s.nics {
            if n.reported && !moved(&n.send) && !moved(&n.recv) {
                out.push(Verdict::plain(
                    VerdictKind::IdleNic,
                    nic_subject(n),
                    format!(
                        "{} {} (device {}) carried no byte while {busy} other NIC(s) carried traffic{}: \
                         NCCL did not put a channel on it (check NCCL_SOCKET_IFNAME / the plugin's \
                         NIC list, and the GPU-NIC pairing: tcpx-run topo)",
                        n.host,
                        n.label,
                        n.dev,
                        if n.comms > 0 {
                            format!(" ({} comm(s) opened on it moved nothing)", n.comms)
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
        }
    }

    // Slow NICs: among the NICs that carried traffic.
    let active: Vec<&NicFigures> = s
        .nics
        .iter()
        .filter(|n| moved(&n.send) || moved(&n.recv))
        .collect();
    // A receive figure that is an upper bound is no rate: then every NIC is judged on what it sent.
    let bound = active.iter().any(|n| n.recv_upper_bound);
    let nic_figures: [FigureOf<NicFigures>; 2] = [
        (
            if bound { "send_gbps" } else { "gbps" },
            if bound {
                &|n: &NicFigures| n.send.gbps_windows.as_slice()
            } else {
                &|n: &NicFigures| n.total_gbps_windows.as_slice()
            },
        ),
        ("send_request_gbps", &|n: &NicFigures| {
            n.send.request_gbps_windows.as_slice()
        }),
    ];
    let mut slow_nics: Vec<(String, u32)> = Vec::new();
    for (name, fig) in nic_figures {
        for (i, x, st, range) in slow_units(&active, fig, &figure_thresholds(name, t)) {
            let n = active[i];
            if slow_nics.contains(&(n.host.clone(), n.dev)) {
                continue;
            }
            slow_nics.push((n.host.clone(), n.dev));
            out.push(slow_verdict(
                VerdictKind::SlowNic,
                nic_subject(n),
                name,
                x,
                st,
                range,
                "the other NICs",
                "check the NIC's link speed and errors (ethtool -S), its IRQ and CPU placement \
                 (tcpx-run irq, topo), or qualify it alone (tcpx-run fleet)",
            ));
        }
    }

    // Slow links, where neither NIC is named.
    let active_links: Vec<_> = s
        .links
        .iter()
        .filter(|l| moved(&l.send) || moved(&l.recv))
        .collect();
    let link_figures: [FigureOf<LinkFigures>; 2] = [
        ("gbps", &link_gbps),
        ("send_request_gbps", &|l: &LinkFigures| {
            l.send.request_gbps_windows.as_slice()
        }),
    ];
    let mut slow_links: Vec<String> = Vec::new();
    for (name, fig) in link_figures {
        for (i, x, st, range) in slow_units(&active_links, fig, &figure_thresholds(name, t)) {
            let l = active_links[i];
            if slow_links.contains(&l.link) || l.nics.iter().any(|k| slow_nics.contains(k)) {
                continue;
            }
            slow_links.push(l.link.clone());
            out.push(slow_verdict(
                VerdictKind::SlowLink,
                format!(
                    "link {} ({} -> {})",
                    l.link,
                    l.send_end.as_deref().unwrap_or("?"),
                    l.recv_end.as_deref().unwrap_or("?")
                ),
                name,
                x,
                st,
                range,
                "the other links",
                "both NICs are fine with their other links: the path between the two ends \
                 (switch port, cable) or one peer's load",
            ));
        }
    }

    // Start-up stalls.
    for c in &s.startup {
        if c.call != "listen" && c.took_s > o.stall_s {
            out.push(Verdict::plain(
                VerdictKind::StartupStall,
                format!("{}/{} {}", c.host, c.pid, c.nic),
                format!(
                    "{}/{}: {} on {} (comm {}, link {}) took {:.1} s (over {:.1} s){}: a slow \
                     rendezvous (GPUDirect-TCPX: the rxdm's flow steering, \"rx ctrl timeout\"; \
                     check the receive-datapath manager's log and the peer's start time)",
                    c.host,
                    c.pid,
                    c.call,
                    c.nic,
                    c.comm,
                    if c.link.is_empty() { "-" } else { &c.link },
                    c.took_s,
                    o.stall_s,
                    if c.ok { "" } else { " and failed" }
                ),
            ));
        }
    }

    // Errors.
    if !s.errors.is_empty() {
        let mut by: std::collections::BTreeMap<(String, i64), usize> = Default::default();
        for e in &s.errors {
            *by.entry((e.call.clone(), e.code)).or_default() += 1;
        }
        let parts: Vec<String> = by
            .iter()
            .map(|((call, code), n)| {
                format!("{call} returned {code} ({}) {n}x", result_name(*code))
            })
            .collect();
        let first = &s.errors[0];
        out.push(Verdict::plain(
            VerdictKind::Errors,
            format!("{} call(s)", s.errors.len()),
            format!(
                "the inner plugin returned errors: {}; first at {}/{} t={:.3} s{} (NCCL's log at \
                 the same time says what it did about them)",
                parts.join(", "),
                first.host,
                first.pid,
                first.t,
                first
                    .nic
                    .as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default()
            ),
        ));
    }
    let counted: u64 = s
        .nics
        .iter()
        .map(|n| n.send.errors.saturating_add(n.recv.errors))
        .sum();
    if counted > 0 && s.errors.is_empty() {
        out.push(Verdict::plain(
            VerdictKind::Errors,
            format!("{counted} request error(s)"),
            format!("{counted} request(s) failed according to the comms' counters"),
        ));
    }
    if s.dropped_comms > 0
        || s.dropped_lat_samples > 0
        || s.dropped_requests > 0
        || s.lines_omitting_comms > 0
    {
        out.push(Verdict::plain(
            VerdictKind::Dropped,
            String::new(),
            format!(
                "the shim's bounds left things out: {} comm(s) beyond its table, {} request(s) \
                 and {} latency sample(s) not recorded, {} interval line(s) listing only some \
                 comms: the figures here are partial (raise TCPX_WATCH_MAX_MB for the lines)",
                s.dropped_comms, s.dropped_requests, s.dropped_lat_samples, s.lines_omitting_comms
            ),
        ));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn slow_verdict(
    kind: VerdictKind,
    subject: String,
    figure: &str,
    x: f64,
    st: robust::Standing,
    range: Option<(f64, f64)>,
    against: &str,
    hint: &str,
) -> Verdict {
    let what = match figure {
        "gbps" => "GB/s",
        "send_gbps" => "send GB/s (receive figures here are upper bounds from posted sizes)",
        _ => "GB/s per send request (mean request bytes over median latency)",
    };
    let range_text = range
        .map(|(lo, hi)| format!(", {lo:.0}% .. {hi:.0}% window by window"))
        .unwrap_or_default();
    Verdict {
        kind,
        text: format!(
            "{subject}: {x:.3} {what} against {against}' {:.3} ({:.0}%{range_text}; robust z \
             {:.1}): {hint}",
            st.peers, st.below_pct, st.z
        ),
        subject,
        figure: Some(figure.to_string()),
        value: Some(x),
        peers: Some(st.peers),
        below_pct: Some(st.below_pct),
        below_pct_range: range,
        robust_z: Some(st.z),
    }
}

/// `ncclResult_t`'s C name, as NCCL's log prints it.
fn result_name(code: i64) -> &'static str {
    i32::try_from(code).map_or("unknown ncclResult_t", tcpx_ffi::abi::result_c_name)
}
