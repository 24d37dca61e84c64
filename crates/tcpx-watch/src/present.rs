//! The report of a watch directory: the table a terminal gets, the one JSON document, the
//! self-contained HTML page (GB/s per NIC over time as a chart and as a heat table in the
//! fleet report's colours), and the one line per NIC per window that `--follow` prints.
//! Every name from a file is printed through `tcpx_report::safe::printable` (or escaped for HTML).

use std::fmt::Write as _;

use serde::Serialize;
use tcpx_report::safe::printable;
use tcpx_report::{html_escape as esc, Series};

use crate::summary::{NicFigures, Percentiles, Summary, Traffic};
use crate::verdict::Verdict;

/// Everything `tcpx-run watch` says about a directory: `--json` prints this.
#[derive(Debug, Clone, Serialize)]
pub struct WatchReport {
    pub dir: String,
    pub summary: Summary,
    pub verdicts: Vec<Verdict>,
}

fn gbps(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"))
}

fn lat(p: &Option<Percentiles>) -> (String, String) {
    match p {
        Some(p) => (format!("{:.0}", p.p50_us), format!("{:.0}", p.p99_us)),
        None => ("-".into(), "-".into()),
    }
}

fn bytes(n: u64) -> String {
    tcpx_report::safe::human_bytes(n)
}

/// A figure that is an upper bound (receives counted at their posted size) reads `<= x`.
fn bounded(cell: String, upper: bool) -> String {
    if upper && cell != "-" {
        format!("<= {cell}")
    } else {
        cell
    }
}

fn traffic_cells(t: &Traffic, upper: bool) -> Vec<String> {
    let (p50, p99) = lat(&t.latency);
    vec![
        bounded(gbps(t.gbps), upper),
        bounded(bytes(t.bytes), upper),
        t.requests.to_string(),
        p50,
        p99,
    ]
}

/// Left-aligned first column, right-aligned others, columns as wide as their widest cell.
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = width.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        for (i, c) in cells.iter().enumerate() {
            let w = width.get(i).copied().unwrap_or(0);
            if i == 0 {
                let _ = write!(out, "{c:<w$}");
            } else {
                let _ = write!(out, "  {c:>w$}");
            }
        }
        out.push('\n');
    };
    line(&mut out, head.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(&mut out, r.clone());
    }
    out
}

/// The terminal's report: processes, NICs, links, start-up, verdicts.
pub fn text(r: &WatchReport) -> String {
    let s = &r.summary;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "watch {}: {} process(es), {} NIC(s), {} link(s); windows of {:.3} s, {} of them (GB/s = 1e9 bytes/s)",
        printable(&r.dir),
        s.processes.len(),
        s.nics.len(),
        s.links.len(),
        s.window_s,
        s.windows
    );
    if !s.processes.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .processes
            .iter()
            .map(|p| {
                vec![
                    printable(&format!("{}/{}", p.host, p.pid)),
                    printable(&if p.inner_name.is_empty() {
                        p.inner.clone()
                    } else {
                        p.inner_name.clone()
                    }),
                    p.api.map_or("-".into(), |a| format!("v{a}")),
                    gbps(p.send.gbps),
                    bounded(gbps(p.recv.gbps), p.recv_upper_bound),
                    bytes(p.send.bytes),
                    bounded(bytes(p.recv.bytes), p.recv_upper_bound),
                    format!("{:.1}", p.span_s),
                    if p.ended { "yes" } else { "no" }.into(),
                    p.restarts.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "process",
                "inner",
                "api",
                "send GB/s",
                "recv GB/s",
                "sent",
                "received",
                "span s",
                "ended",
                "restarts",
            ],
            &rows,
        ));
    }
    if !s.nics.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .nics
            .iter()
            .map(|n| {
                let mut row = vec![
                    printable(&format!("{} {}", n.host, n.label)),
                    n.comms.to_string(),
                ];
                row.extend(traffic_cells(&n.send, false));
                row.extend(traffic_cells(&n.recv, n.recv_upper_bound));
                row
            })
            .collect();
        out.push_str(&table(
            &[
                "NIC",
                "comms",
                "send GB/s",
                "sent",
                "send req",
                "p50 us",
                "p99 us",
                "recv GB/s",
                "received",
                "recv req",
                "p50 us",
                "p99 us",
            ],
            &rows,
        ));
    }
    if !s.links.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = s
            .links
            .iter()
            .take(64)
            .map(|l| {
                let (p50, p99) = lat(&l.send.latency);
                vec![
                    printable(&l.link),
                    printable(l.send_end.as_deref().unwrap_or("-")),
                    printable(l.recv_end.as_deref().unwrap_or("-")),
                    match l.send.gbps {
                        Some(g) => gbps(Some(g)),
                        None => bounded(gbps(l.recv.gbps), l.recv_upper_bound),
                    },
                    bytes(l.send.bytes),
                    if l.recv_from_send_end {
                        format!("{}*", bytes(l.recv.bytes))
                    } else {
                        bounded(bytes(l.recv.bytes), l.recv_upper_bound)
                    },
                    p50,
                    p99,
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "link",
                "send end",
                "recv end",
                "GB/s",
                "sent",
                "received",
                "send p50 us",
                "send p99 us",
            ],
            &rows,
        ));
        if s.links.iter().any(|l| l.recv_from_send_end) {
            out.push_str(
                "* received: the send end's figure (the recv end counted its completions at their \
                 posted size, an upper bound)\n",
            );
        }
        if s.links.iter().any(|l| l.recv_upper_bound) {
            out.push_str(
                "<= : an upper bound (completions counted at their posted size, no send end read)\n",
            );
        }
        if s.links.len() > 64 {
            let _ = writeln!(
                out,
                "... {} more links (--json has all)",
                s.links.len() - 64
            );
        }
    }
    let setups: Vec<_> = s.startup.iter().filter(|c| c.call != "listen").collect();
    if !setups.is_empty() {
        let took: Vec<f64> = setups.iter().map(|c| c.took_s).collect();
        let slowest = setups
            .iter()
            .max_by(|a, b| a.took_s.total_cmp(&b.took_s))
            .map(|c| {
                printable(&format!(
                    "{} on {}/{} {} ({:.3} s)",
                    c.call, c.host, c.pid, c.nic, c.took_s
                ))
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\nstart-up: {} connect/accept call(s), median {:.3} s, slowest {slowest}",
            setups.len(),
            tcpx_model::median(&took).unwrap_or(0.0)
        );
    }
    out.push('\n');
    if r.verdicts.is_empty() {
        out.push_str(
            "verdict: nothing stands out (no idle or slow NIC or link, no stall, no error)\n",
        );
    } else {
        out.push_str("verdicts:\n");
        for v in &r.verdicts {
            let _ = writeln!(out, "  {}: {}", v.kind.word(), printable(&v.text));
        }
    }
    for n in &s.notes {
        let _ = writeln!(out, "note: {}", printable(n));
    }
    out
}

/// The `--follow` lines for window `w`: one per NIC that covered it.
pub fn follow_lines(s: &Summary, w: usize) -> Vec<String> {
    let t = w as f64 * s.window_s;
    s.nics
        .iter()
        .filter_map(|n| {
            let send = n.send.gbps_windows.get(w).copied().flatten();
            let recv = n.recv.gbps_windows.get(w).copied().flatten();
            if send.is_none() && recv.is_none() {
                return None;
            }
            Some(printable(&format!(
                "t={t:>8.1}s  {} {}  send {} GB/s  recv {} GB/s",
                n.host,
                n.label,
                gbps(send),
                bounded(gbps(recv), n.recv_upper_bound)
            )))
        })
        .collect()
}

fn nic_series(n: &NicFigures, s: &Summary) -> Series {
    Series {
        // Plotters escapes markup, not control characters.
        name: printable(&format!("{} {}", n.host, n.label)),
        points: n
            .total_gbps_windows
            .iter()
            .enumerate()
            .map(|(w, v)| ((w as f64 + 0.5) * s.window_s, *v))
            .collect(),
    }
}

/// The self-contained HTML page (no script, nothing loaded from elsewhere).
pub fn html(r: &WatchReport) -> String {
    let s = &r.summary;
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>tcpx-run watch</title>\n<style>\nbody{font-family:sans-serif;margin:2em}\ntable{border-collapse:collapse;margin:1em 0}\ntd,th{border:1px solid #999;padding:4px 8px;text-align:right}\n.verdict td{text-align:left}\n</style></head><body>\n");
    let _ = writeln!(
        out,
        "<h1>tcpx-run watch</h1>\n<p>{}: {} process(es), {} NIC(s), {} link(s); windows of {:.3} s. GB/s = 1e9 bytes/s.</p>",
        esc(&r.dir),
        s.processes.len(),
        s.nics.len(),
        s.links.len(),
        s.window_s
    );
    out.push_str("<h2>Verdict</h2>\n");
    if r.verdicts.is_empty() {
        out.push_str("<p class=\"verdict-none\">Nothing stands out: no idle or slow NIC or link, no start-up stall, no error.</p>\n");
    } else {
        out.push_str("<table class=\"verdict\" id=\"verdict\"><tr><th>finding</th><th>subject</th><th>below peers</th><th>per window</th><th>robust z</th><th>detail</th></tr>\n");
        for v in &r.verdicts {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                v.kind.word(),
                esc(&v.subject),
                v.below_pct.map(|p| format!("{p:.0}%")).unwrap_or_default(),
                v.below_pct_range
                    .map(|(a, b)| format!("{a:.0}% .. {b:.0}%"))
                    .unwrap_or_default(),
                v.robust_z.map(|z| format!("{z:.1}")).unwrap_or_default(),
                esc(&v.text)
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("<h2>GB/s per NIC over time (send plus receive)</h2>\n");
    let series: Vec<Series> = s.nics.iter().map(|n| nic_series(n, s)).collect();
    match tcpx_report::series_svg(
        "GB/s per NIC",
        "seconds since the first process's start",
        "GB/s",
        &series,
    ) {
        Ok(svg) => {
            out.push_str("<div class=\"chart\">");
            out.push_str(&svg);
            out.push_str("</div>\n");
        }
        Err(e) => {
            let _ = writeln!(out, "<p>chart not drawn: {}</p>", esc(&e.to_string()));
        }
    }
    // The heat table: NIC rows, window columns, coloured against the median busy figure.
    let all: Vec<f64> = s
        .nics
        .iter()
        .flat_map(|n| n.total_gbps_windows.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let top = tcpx_model::median(&all).unwrap_or(0.0);
    let shown = s.windows.min(120);
    out.push_str("<table class=\"heat\"><tr><th>NIC \\ s</th>");
    for w in 0..shown {
        let _ = write!(out, "<th>{:.0}</th>", w as f64 * s.window_s);
    }
    out.push_str("</tr>\n");
    for n in &s.nics {
        let _ = write!(
            out,
            "<tr><th>{}</th>",
            esc(&format!("{} {}", n.host, n.label))
        );
        for w in 0..shown {
            match n.total_gbps_windows.get(w).copied().flatten() {
                Some(v) => {
                    let _ = write!(
                        out,
                        "<td style=\"background:{}\">{v:.2}</td>",
                        tcpx_report::fleet::cell_colour(v, top)
                    );
                }
                None => out.push_str("<td>-</td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    if s.windows > shown {
        let _ = writeln!(
            out,
            "<p>First {shown} of {} windows (the chart has all).</p>",
            s.windows
        );
    }
    out.push_str("<h2>NICs</h2>\n<table><tr><th>NIC</th><th>comms</th><th>send GB/s</th><th>sent</th><th>send p50 us</th><th>send p99 us</th><th>recv GB/s</th><th>received</th><th>recv p50 us</th><th>recv p99 us</th></tr>\n");
    for n in &s.nics {
        let (sp50, sp99) = lat(&n.send.latency);
        let (rp50, rp99) = lat(&n.recv.latency);
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{sp50}</td><td>{sp99}</td><td>{}</td><td>{}</td><td>{rp50}</td><td>{rp99}</td></tr>",
            esc(&format!("{} {}", n.host, n.label)),
            n.comms,
            gbps(n.send.gbps),
            bytes(n.send.bytes),
            esc(&bounded(gbps(n.recv.gbps), n.recv_upper_bound)),
            esc(&bounded(bytes(n.recv.bytes), n.recv_upper_bound)),
        );
    }
    out.push_str("</table>\n<h2>Start-up per connection</h2>\n<table><tr><th>process</th><th>call</th><th>NIC</th><th>comm</th><th>link</th><th>took s</th><th>ok</th></tr>\n");
    for c in s.startup.iter().take(1000) {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td><td>{}</td></tr>",
            esc(&format!("{}/{}", c.host, c.pid)),
            esc(&c.call),
            esc(&c.nic),
            c.comm,
            esc(&c.link),
            c.took_s,
            if c.ok { "yes".to_string() } else { format!("no ({})", c.code) }
        );
    }
    out.push_str("</table>\n");
    for n in &s.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(n));
    }
    out.push_str("</body></html>\n");
    out
}
