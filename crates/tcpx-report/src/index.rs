//! An index over many run directories, and the comparison of two runs per configuration.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{chain, refuse, Result};

use crate::html::{esc, CHART_CHECK, STYLE};
use crate::record::{largest_per_experiment, summarise, RunReport, Status};
use crate::write::load_run;

/// One run in the index.
#[derive(Debug, Clone)]
pub struct IndexEntry {
    /// Directory name under reports/.
    pub dir: String,
    pub report: RunReport,
}

/// Run directories under `root` (those holding a report.json), oldest first, plus the
/// directories that could not be read and why.
pub fn scan(root: &Path) -> Result<(Vec<IndexEntry>, Vec<String>)> {
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) => refuse!(
            "cannot read {}: {e} (run a plan first: tcpx-run plans/phase1_window.rhai)",
            root.display()
        ),
    };
    let mut dirs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.join("report.json").is_file())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for d in dirs {
        let name = d
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match load_run(&d) {
            Ok(report) => out.push(IndexEntry { dir: name, report }),
            Err(e) => bad.push(format!("{name}: {}", chain(&e))),
        }
    }
    Ok((out, bad))
}

/// The best median server GB/s of a run (largest size per configuration).
fn best(r: &RunReport) -> Option<(String, f64)> {
    let largest = largest_per_experiment(r.records.iter());
    summarise(r.records.iter())
        .into_iter()
        .filter(|x| {
            largest
                .iter()
                .any(|l| l.experiment == x.experiment && l.size == x.size)
        })
        .filter(|x| x.status == Status::Ok)
        .filter_map(|x| Some((x.label.clone(), x.metric("server_gbs")?)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// One run's cells in the index, before the markdown or HTML escaping of each form.
struct IndexRow<'a> {
    plan: &'a str,
    platform: &'a str,
    result: String,
    experiments: usize,
    /// The best median server GB/s and its configuration, or `-`.
    best: String,
}

impl<'a> IndexRow<'a> {
    fn of(e: &'a IndexEntry) -> IndexRow<'a> {
        let r = &e.report;
        IndexRow {
            plan: &r.plan,
            platform: &r.platform,
            result: r.verdict_line(),
            experiments: largest_per_experiment(r.records.iter()).len(),
            best: best(r).map_or_else(|| "-".into(), |(l, v)| format!("{v:.3} ({l})")),
        }
    }
}

/// The index as markdown.
pub fn index_markdown(entries: &[IndexEntry], unreadable: &[String]) -> String {
    let mut s = String::from("# tcpx-lab plan runs\n\n");
    if entries.is_empty() {
        s.push_str("No runs yet: run a plan, e.g. `tcpx-run plans/phase1_window.rhai`.\n");
    } else {
        s.push_str("| run | plan | platform | result | experiments | best (server GB/s) |\n|---|---|---|---|---|---|\n");
        for e in entries {
            let row = IndexRow::of(e);
            let _ = writeln!(
                s,
                "| [{}]({}/index.html) | {} | {} | {} | {} | {} |",
                e.dir,
                e.dir,
                row.plan,
                row.platform,
                row.result.replace('|', "/"),
                row.experiments,
                row.best
            );
        }
    }
    for u in unreadable {
        let _ = writeln!(s, "\n- unreadable: {u}");
    }
    s
}

/// The index as a self-contained HTML page.
pub fn index_html(entries: &[IndexEntry], unreadable: &[String]) -> String {
    let mut h = format!("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>tcpx-lab plan runs</title><style>{STYLE}</style></head><body><h1>tcpx-lab plan runs</h1>");
    if entries.is_empty() {
        h.push_str("<p>No runs yet.</p>");
    } else {
        h.push_str("<table id=\"runs\"><tr><th>run</th><th>plan</th><th>platform</th><th>result</th><th>experiments</th><th>best (server GB/s)</th></tr>");
        for e in entries {
            let r = &e.report;
            let class = match r.exit_code() {
                0 if r.nothing_measured() => "NA",
                0 => "PASS",
                1 => "FAIL",
                _ => "NA",
            };
            let row = IndexRow::of(e);
            let _ = write!(
                h,
                "<tr><td><a href=\"{}/index.html\">{}</a></td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&e.dir),
                esc(&e.dir),
                esc(row.plan),
                esc(row.platform),
                esc(&row.result),
                row.experiments,
                esc(&row.best)
            );
        }
        h.push_str("</table>");
    }
    for u in unreadable {
        let _ = write!(h, "<p class=\"FAIL\">unreadable: {}</p>", esc(u));
    }
    h.push_str(CHART_CHECK);
    h.push_str("</body></html>\n");
    h
}

/// One configuration present in either run.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRow {
    pub experiment: String,
    pub label: String,
    pub size: Option<u64>,
    pub a_server_gbs: Option<f64>,
    pub b_server_gbs: Option<f64>,
    pub a_client_gbs: Option<f64>,
    pub b_client_gbs: Option<f64>,
}

impl CompareRow {
    /// The size, A and B server GB/s, the change and A and B client GB/s, as both forms of the
    /// comparison show them (numbers and `-`: nothing to escape).
    fn figure_cells(&self) -> [String; 6] {
        [
            self.size.map_or_else(|| "-".into(), |v| v.to_string()),
            f(self.a_server_gbs),
            f(self.b_server_gbs),
            pct(self.server_delta()),
            f(self.a_client_gbs),
            f(self.b_client_gbs),
        ]
    }

    /// Relative change of server GB/s from A to B (0.1 = +10 %).
    pub fn server_delta(&self) -> Option<f64> {
        match (self.a_server_gbs, self.b_server_gbs) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a - 1.0),
            _ => None,
        }
    }
}

/// Pairs the configurations of two runs by experiment name and message size (medians over
/// the repetitions).
pub fn compare(a: &RunReport, b: &RunReport) -> Vec<CompareRow> {
    let mut rows: Vec<CompareRow> = Vec::new();
    for r in &summarise(a.records.iter()) {
        rows.push(CompareRow {
            experiment: r.experiment.clone(),
            label: r.label.clone(),
            size: r.size,
            a_server_gbs: r.metric("server_gbs"),
            b_server_gbs: None,
            a_client_gbs: r.metric("client_gbs"),
            b_client_gbs: None,
        });
    }
    for r in &summarise(b.records.iter()) {
        if let Some(row) = rows
            .iter_mut()
            .find(|x| x.experiment == r.experiment && x.size == r.size)
        {
            row.b_server_gbs = r.metric("server_gbs");
            row.b_client_gbs = r.metric("client_gbs");
        } else {
            rows.push(CompareRow {
                experiment: r.experiment.clone(),
                label: r.label.clone(),
                size: r.size,
                a_server_gbs: None,
                b_server_gbs: r.metric("server_gbs"),
                a_client_gbs: None,
                b_client_gbs: r.metric("client_gbs"),
            });
        }
    }
    rows
}

fn f(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:+.1}%", v * 100.0))
}

/// The comparison as markdown.
pub fn compare_markdown(a_name: &str, a: &RunReport, b_name: &str, b: &RunReport) -> String {
    let mut s = format!(
        "# Comparison: A = {a_name} ({}), B = {b_name} ({})\n\nA: {}\n\nB: {}\n\n| experiment | configuration | size | A server GB/s | B server GB/s | change | A client GB/s | B client GB/s |\n|---|---|---|---|---|---|---|---|\n",
        a.plan,
        b.plan,
        a.verdict_line(),
        b.verdict_line()
    );
    for r in compare(a, b) {
        let [size, a_server, b_server, change, a_client, b_client] = r.figure_cells();
        let _ = writeln!(
            s,
            "| {} | {} | {size} | {a_server} | {b_server} | {change} | {a_client} | {b_client} |",
            r.experiment,
            r.label.replace('|', "/"),
        );
    }
    s
}

/// The comparison as a self-contained HTML page.
pub fn compare_html(a_name: &str, a: &RunReport, b_name: &str, b: &RunReport) -> String {
    let mut h = format!("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>compare {} vs {}</title><style>{STYLE}</style></head><body><h1>A = {} vs B = {}</h1><p>A: {}<br>B: {}</p><table id=\"compare\"><tr><th>experiment</th><th>configuration</th><th>size</th><th>A server GB/s</th><th>B server GB/s</th><th>change</th><th>A client GB/s</th><th>B client GB/s</th></tr>",
        esc(a_name), esc(b_name), esc(a_name), esc(b_name), esc(&a.verdict_line()), esc(&b.verdict_line()));
    for r in compare(a, b) {
        let class = match r.server_delta() {
            Some(d) if d > 0.0 => "PASS",
            Some(d) if d < 0.0 => "FAIL",
            _ => "NA",
        };
        let [size, a_server, b_server, change, a_client, b_client] = r.figure_cells();
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{size}</td><td>{a_server}</td><td>{b_server}</td><td class=\"{class}\">{change}</td><td>{a_client}</td><td>{b_client}</td></tr>",
            esc(&r.experiment),
            esc(&r.label),
        );
    }
    h.push_str("</table>");
    h.push_str(CHART_CHECK);
    h.push_str("</body></html>\n");
    h
}
