//! The files of a fleet run (`tcpx-run fleet`): the pair matrix as CSV (one row per sender,
//! receiver, NIC choice and repetition) and as one JSON document, and a self-contained HTML
//! report with a heatmap per NIC choice (sender rows, receiver columns, each cell the median
//! GB/s over repetitions) and the verdict table. Every file is written whole under a temporary
//! name and renamed into place, so a reader (or a run cut short) sees the last complete matrix.
//!
//! The statistics that name slow nodes, NICs and pairs are the orchestrator's; this module only
//! writes what it is given.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{refuse, Error, Result};
use serde::{Deserialize, Serialize};

use crate::html::esc;
use crate::stats::median;

/// One pair run: `sender` sent to `receiver` over `nic` in repetition `rep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetRow {
    /// Index of the run in the schedule.
    pub run: u32,
    pub rep: u32,
    /// Tournament round.
    pub round: u32,
    /// `nic0`, `nic1`, ... or `all`.
    pub nic: String,
    pub sender: u32,
    pub sender_host: String,
    /// The sender's address(es) for this run, `;`-separated.
    pub sender_addr: String,
    pub receiver: u32,
    pub receiver_host: String,
    pub receiver_addr: String,
    /// Message size, bytes.
    pub size: u64,
    /// Bytes moved in the timed iterations.
    pub bytes: u64,
    /// Received bytes that differed from what was sent; `None`: not checked.
    pub wrong_bytes: Option<u64>,
    /// Receiver-side GB/s (1e9 bytes per second) over the timed iterations.
    pub gbps: Option<f64>,
    /// Median time per iteration, microseconds.
    pub p50_us: Option<f64>,
    /// Start-up, on the sender: TCP connect from its NIC to the receiver's, milliseconds.
    pub connect_ms: Option<f64>,
    /// Start-up: from the sender's connection being up to the receiver's first byte arriving
    /// (the receiver's accept and answer), milliseconds.
    pub accept_ms: Option<f64>,
    /// Start-up: from the sender's connect call to the receiver's first byte, milliseconds.
    pub first_byte_ms: Option<f64>,
    /// Start-up of the measurement itself: the sender's wall time less its timed iterations
    /// (handshake, connections, warm-up and checking), milliseconds.
    pub setup_ms: Option<f64>,
    /// `ok`, `failed` (a side failed: see `error`), `wrong_bytes`, or `skipped` (a node was
    /// lost before the run).
    pub status: String,
    pub error: String,
}

impl FleetRow {
    /// Whether the row is a trustworthy measurement: it ran, its bytes were checked and right.
    pub fn measured(&self) -> Option<f64> {
        (self.status == "ok").then_some(self.gbps).flatten()
    }
}

/// What a finding names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A node slow on every NIC.
    Node,
    /// One NIC of one node.
    Nic,
    /// A node fine on each NIC alone but slow with all of them together.
    AllNics,
    /// One direction of one pair, its nodes otherwise fine.
    Pair,
    /// One NIC (rail) below the node's other NICs on most pairs, no node's NIC to blame: with
    /// two nodes, or the same NIC slow on every node (its switch, its configuration).
    Rail,
    /// A node lost or never joined; its runs were skipped or failed.
    Lost,
    /// Runs that failed or moved wrong bytes.
    Failed,
}

/// One line of the verdict table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The node (for a pair: the sender).
    pub node: Option<u32>,
    pub host: String,
    /// `nic1`, `all`, or empty.
    pub nic: String,
    /// For a pair: the receiver.
    pub peer: Option<u32>,
    /// Its median GB/s.
    pub gbps: Option<f64>,
    /// The peers' median GB/s it is compared with.
    pub peers_gbps: Option<f64>,
    /// How far below its peers, percent (negative: below).
    pub below_pct: Option<f64>,
    /// The same over the repetitions one by one: lowest and highest, percent.
    pub below_pct_range: Option<(f64, f64)>,
    /// Robust z-score (distance from the peers' median in scaled MADs).
    pub robust_z: Option<f64>,
    /// The finding in words.
    pub text: String,
}

/// A node as it joined the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    pub rank: u32,
    pub host: String,
    /// Its NICs as given (`eth1`, `127.0.0.11`) and the address each resolved to.
    pub nics: Vec<String>,
    pub addrs: Vec<String>,
    /// Empty while the node is in the run; else why it is not.
    pub lost: String,
}

/// What a fleet run started with (`start` of `matrix.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStart {
    pub tool: String,
    pub version: String,
    /// UTC start, ISO 8601.
    pub started: String,
    /// Every rank, with why it is out of the run where it is.
    pub nodes: Vec<FleetNode>,
    /// The bench experiment every pair ran (without NICs; each side's are in its row).
    pub experiment: serde_json::Value,
    pub reps: u32,
    /// Pair runs scheduled in all.
    pub scheduled: u32,
}

/// How a fleet run ended (`end` of `matrix.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetEnd {
    /// Empty until the run ends.
    pub findings: Vec<Finding>,
    /// True once every scheduled run has a row and the verdicts are in.
    pub complete: bool,
}

/// The whole fleet document (`matrix.json`), iperf3-style: what was started (`start`), every
/// pair run as it ended (`rows`, iperf3's intervals), and how the run ended (`end`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetDoc {
    pub start: FleetStart,
    pub rows: Vec<FleetRow>,
    pub end: FleetEnd,
}

/// Columns of `matrix.csv`.
pub const FLEET_CSV_HEADER: &[&str] = &[
    "run",
    "rep",
    "round",
    "nic",
    "sender",
    "sender_host",
    "sender_addr",
    "receiver",
    "receiver_host",
    "receiver_addr",
    "size",
    "bytes",
    "wrong_bytes",
    "gbps",
    "p50_us",
    "connect_ms",
    "accept_ms",
    "first_byte_ms",
    "setup_ms",
    "status",
    "error",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn optf(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

/// One row's CSV fields, in [`FLEET_CSV_HEADER`]'s order.
pub fn fleet_csv_fields(r: &FleetRow) -> Vec<String> {
    vec![
        r.run.to_string(),
        r.rep.to_string(),
        r.round.to_string(),
        r.nic.clone(),
        r.sender.to_string(),
        r.sender_host.clone(),
        r.sender_addr.clone(),
        r.receiver.to_string(),
        r.receiver_host.clone(),
        r.receiver_addr.clone(),
        r.size.to_string(),
        r.bytes.to_string(),
        opt(r.wrong_bytes),
        optf(r.gbps, 4),
        optf(r.p50_us, 1),
        optf(r.connect_ms, 3),
        optf(r.accept_ms, 3),
        optf(r.first_byte_ms, 3),
        optf(r.setup_ms, 1),
        r.status.clone(),
        r.error.clone(),
    ]
}

/// The matrix as CSV text (a header, then one row per pair run).
pub fn fleet_csv(rows: &[FleetRow]) -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(FLEET_CSV_HEADER)?;
    for r in rows {
        // A node's error text escaped, one row per line (issue 43 item 6).
        w.write_record(
            fleet_csv_fields(r)
                .iter()
                .map(|c| crate::safe::printable(c)),
        )?;
    }
    w.into_inner().map_err(|e| Error::Write(e.to_string()))
}

/// Files of a fleet run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetFiles {
    pub csv: PathBuf,
    pub json: PathBuf,
    pub html: PathBuf,
}

impl FleetFiles {
    pub fn in_dir(dir: &Path) -> FleetFiles {
        FleetFiles {
            csv: dir.join("matrix.csv"),
            json: dir.join("matrix.json"),
            html: dir.join("report.html"),
        }
    }
}

/// A fleet run's output directory while the run goes on: `matrix.csv` grows a whole row at a
/// time ([`crate::CsvAppender`]: one append per row, so a run killed at any moment leaves whole
/// rows), `matrix.json` and `report.html` are rewritten whole (temporary name, then rename) when
/// the caller says. Rewriting the JSON after every row would cost the square of the rows.
pub struct FleetWriter {
    pub files: FleetFiles,
    csv: crate::CsvAppender,
}

impl FleetWriter {
    /// Creates `dir` (if needed) for a new run; a directory that already holds a fleet matrix
    /// is refused, so two runs never mix their rows.
    pub fn create(dir: &Path) -> Result<FleetWriter> {
        let files = FleetFiles::in_dir(dir);
        // A link (even a dangling one) at matrix.csv is refused, never written through.
        crate::refuse_link(&files.csv)?;
        if files.csv.exists() {
            refuse!(
                "{} already holds a fleet matrix: give another --out (each run its own directory)",
                dir.display()
            );
        }
        let csv = crate::CsvAppender::open(&files.csv, FLEET_CSV_HEADER)?;
        Ok(FleetWriter { files, csv })
    }

    /// Appends one row to `matrix.csv`.
    pub fn row(&self, row: &FleetRow) -> Result<()> {
        self.csv.append(&fleet_csv_fields(row))
    }

    /// Rewrites `matrix.json` whole, and `report.html` when `html` is set (the end of a run).
    pub fn document(&self, doc: &FleetDoc, html: bool) -> Result<()> {
        crate::write_file(
            &self.files.json,
            serde_json::to_string_pretty(doc)?.as_bytes(),
        )?;
        if html {
            crate::write_file(&self.files.html, fleet_html(doc).as_bytes())?;
        }
        Ok(())
    }
}

/// Writes a whole fleet run at once: `matrix.csv`, `matrix.json` and `report.html` into `dir`,
/// each whole through a temporary name (for a finished document, such as a re-render).
pub fn write_fleet(dir: &Path, doc: &FleetDoc) -> Result<FleetFiles> {
    let files = FleetFiles::in_dir(dir);
    crate::write_file(&files.csv, &fleet_csv(&doc.rows)?)?;
    crate::write_file(&files.json, serde_json::to_string_pretty(doc)?.as_bytes())?;
    crate::write_file(&files.html, fleet_html(doc).as_bytes())?;
    Ok(files)
}

/// Background colour of a heatmap cell: red at 0, yellow at half, green at (or above) `top`.
pub fn cell_colour(v: f64, top: f64) -> String {
    let x = if top > 0.0 {
        (v / top).clamp(0.0, 1.0)
    } else {
        0.0
    };
    // Hue 0 (red) .. 120 (green).
    format!("hsl({:.0},70%,{:.0}%)", 120.0 * x, 80.0 - 15.0 * x)
}

/// The NIC choices of the rows, in their first-seen order.
fn nic_labels(rows: &[FleetRow]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        if !out.contains(&r.nic) {
            out.push(r.nic.clone());
        }
    }
    out
}

/// The heatmap of one NIC choice: a table, sender rows and receiver columns; each cell the median
/// GB/s over repetitions with the count of runs behind it, `failed` where none measured.
fn heatmap(out: &mut String, doc: &FleetDoc, nic: &str) {
    let ranks: Vec<u32> = doc.start.nodes.iter().map(|n| n.rank).collect();
    let cell = |s: u32, r: u32| -> (Option<f64>, usize, usize) {
        let rows: Vec<&FleetRow> = doc
            .rows
            .iter()
            .filter(|x| x.nic == nic && x.sender == s && x.receiver == r)
            .collect();
        let ok: Vec<f64> = rows.iter().filter_map(|x| x.measured()).collect();
        let n_ok = ok.len();
        (median(&ok), n_ok, rows.len())
    };
    let all: Vec<f64> = doc
        .rows
        .iter()
        .filter(|x| x.nic == nic)
        .filter_map(FleetRow::measured)
        .collect();
    let top = median(&all).unwrap_or(0.0);
    let _ = writeln!(
        out,
        "<h3>{}: GB/s, sender (row) to receiver (column), median over repetitions</h3>",
        esc(nic)
    );
    let _ = writeln!(
        out,
        "<table class=\"heat\" data-nic=\"{}\"><tr><th>sender \\ receiver</th>",
        esc(nic)
    );
    for &r in &ranks {
        let _ = write!(out, "<th>{r}</th>");
    }
    out.push_str("</tr>\n");
    for &s in &ranks {
        let host = doc
            .start
            .nodes
            .iter()
            .find(|n| n.rank == s)
            .map(|n| n.host.as_str())
            .unwrap_or("");
        let _ = write!(out, "<tr><th title=\"{}\">{s}</th>", esc(host));
        for &r in &ranks {
            if s == r {
                out.push_str("<td class=\"self\"></td>");
                continue;
            }
            match cell(s, r) {
                (Some(v), n_ok, n) => {
                    let _ = write!(
                        out,
                        "<td style=\"background:{}\" title=\"{n_ok} of {n} runs measured\">{v:.2}</td>",
                        cell_colour(v, top)
                    );
                }
                (None, _, 0) => out.push_str("<td>-</td>"),
                (None, _, _) => out.push_str("<td class=\"failed\">failed</td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

fn kind_word(k: FindingKind) -> &'static str {
    match k {
        FindingKind::Node => "slow node",
        FindingKind::Nic => "slow NIC",
        FindingKind::AllNics => "slow with all NICs",
        FindingKind::Pair => "slow pair",
        FindingKind::Rail => "slow rail",
        FindingKind::Lost => "node lost",
        FindingKind::Failed => "failed runs",
    }
}

/// The self-contained HTML report: the verdict table, a heatmap per NIC choice, the start-up
/// figures per pair and the nodes. No script, no external style or font.
pub fn fleet_html(doc: &FleetDoc) -> String {
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>tcpx-run fleet</title>\n<style>\nbody{font-family:sans-serif;margin:2em}\ntable{border-collapse:collapse;margin:1em 0}\ntd,th{border:1px solid #999;padding:4px 8px;text-align:right}\ntd.self{background:#ddd}\ntd.failed{background:#333;color:#fff}\n.verdict td{text-align:left}\n</style></head><body>\n");
    let measured = doc.rows.iter().filter(|r| r.measured().is_some()).count();
    let _ = writeln!(
        out,
        "<h1>Fleet qualification</h1>\n<p>{} nodes, {} of {} pair runs measured with verified bytes, {} repetition(s); started {}; {}.</p>",
        doc.start.nodes.len(),
        measured,
        doc.start.scheduled,
        doc.start.reps,
        esc(&doc.start.started),
        if doc.end.complete { "complete" } else { "incomplete" }
    );
    out.push_str("<h2>Verdict</h2>\n");
    if doc.end.findings.is_empty() {
        out.push_str("<p class=\"verdict-none\">Nothing stands out: no node, NIC or pair is below its peers beyond the thresholds.</p>\n");
    } else {
        out.push_str("<table class=\"verdict\" id=\"verdict\"><tr><th>finding</th><th>node</th><th>host</th><th>NIC</th><th>peer</th><th>GB/s</th><th>peers' GB/s</th><th>below peers</th><th>per repetition</th><th>robust z</th><th>detail</th></tr>\n");
        for f in &doc.end.findings {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                kind_word(f.kind),
                opt(f.node),
                esc(&f.host),
                esc(&f.nic),
                opt(f.peer),
                optf(f.gbps, 2),
                optf(f.peers_gbps, 2),
                f.below_pct.map(|p| format!("{p:.0}%")).unwrap_or_default(),
                f.below_pct_range
                    .map(|(a, b)| format!("{a:.0}% .. {b:.0}%"))
                    .unwrap_or_default(),
                optf(f.robust_z, 1),
                esc(&f.text)
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("<h2>Heatmaps</h2>\n");
    for nic in nic_labels(&doc.rows) {
        heatmap(&mut out, doc, &nic);
    }
    out.push_str("<h2>Start-up per pair (medians, ms)</h2>\n<table><tr><th>sender</th><th>receiver</th><th>NIC</th><th>connect</th><th>accept</th><th>first byte</th><th>bench set-up</th></tr>\n");
    let mut keys: Vec<(String, u32, u32)> = doc
        .rows
        .iter()
        .map(|r| (r.nic.clone(), r.sender, r.receiver))
        .collect();
    keys.sort();
    keys.dedup();
    for (nic, s, r) in keys {
        let pick = |f: fn(&FleetRow) -> Option<f64>| {
            let v: Vec<f64> = doc
                .rows
                .iter()
                .filter(|x| x.nic == nic && x.sender == s && x.receiver == r)
                .filter_map(f)
                .collect();
            optf(median(&v), 2)
        };
        let _ = writeln!(
            out,
            "<tr><td>{s}</td><td>{r}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&nic),
            pick(|x| x.connect_ms),
            pick(|x| x.accept_ms),
            pick(|x| x.first_byte_ms),
            pick(|x| x.setup_ms)
        );
    }
    out.push_str("</table>\n<h2>Nodes</h2>\n<table><tr><th>rank</th><th>host</th><th>NICs</th><th>addresses</th><th>status</th></tr>\n");
    for n in &doc.start.nodes {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            n.rank,
            esc(&n.host),
            esc(&n.nics.join(", ")),
            esc(&n.addrs.join(", ")),
            if n.lost.is_empty() {
                "in the run".to_string()
            } else {
                esc(&n.lost)
            }
        );
    }
    out.push_str("</table>\n</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(s: u32, r: u32, nic: &str, gbps: f64, status: &str) -> FleetRow {
        FleetRow {
            run: 0,
            rep: 0,
            round: 0,
            nic: nic.into(),
            sender: s,
            sender_host: format!("h{s}"),
            sender_addr: format!("127.0.0.{}", 11 + s),
            receiver: r,
            receiver_host: format!("h{r}"),
            receiver_addr: format!("127.0.0.{}", 11 + r),
            size: 1 << 20,
            bytes: 4 << 20,
            wrong_bytes: Some(0),
            gbps: Some(gbps),
            p50_us: Some(100.0),
            connect_ms: Some(0.1),
            accept_ms: Some(0.05),
            first_byte_ms: Some(0.15),
            setup_ms: Some(3.0),
            status: status.into(),
            error: String::new(),
        }
    }

    fn doc(rows: Vec<FleetRow>, findings: Vec<Finding>) -> FleetDoc {
        FleetDoc {
            start: FleetStart {
                tool: "tcpx-run fleet".into(),
                version: "test".into(),
                started: "2026-01-01T00:00:00Z".into(),
                nodes: (0..3)
                    .map(|r| FleetNode {
                        rank: r,
                        host: format!("<h{r}>"),
                        nics: vec!["lo".into()],
                        addrs: vec![format!("127.0.0.{}", 11 + r)],
                        lost: String::new(),
                    })
                    .collect(),
                experiment: serde_json::json!({}),
                reps: 1,
                scheduled: 6,
            },
            rows,
            end: FleetEnd {
                findings,
                complete: true,
            },
        }
    }

    #[test]
    fn the_report_has_a_heatmap_per_nic_the_verdicts_and_escapes_names() {
        let rows = vec![
            row(0, 1, "nic0", 10.0, "ok"),
            row(1, 0, "nic0", 5.0, "ok"),
            row(0, 2, "nic0", 1.0, "failed"),
            row(0, 1, "all", 20.0, "ok"),
        ];
        let f = Finding {
            kind: FindingKind::Nic,
            node: Some(1),
            host: "h1".into(),
            nic: "nic0".into(),
            peer: None,
            gbps: Some(5.0),
            peers_gbps: Some(10.0),
            below_pct: Some(-50.0),
            below_pct_range: Some((-55.0, -45.0)),
            robust_z: Some(-9.0),
            text: "node 1 nic0".into(),
        };
        let html = fleet_html(&doc(rows.clone(), vec![f]));
        assert!(html.contains("data-nic=\"nic0\"") && html.contains("data-nic=\"all\""));
        assert!(html.contains(">10.00</td>") && html.contains(">5.00</td>"));
        assert!(html.contains("class=\"failed\">failed"), "{html}");
        assert!(html.contains("slow NIC") && html.contains("-50%"));
        assert!(html.contains("&lt;h1&gt;") && !html.contains("<h1>:"));
        assert!(!html.contains("http"), "self-contained: no link out");
        let none = fleet_html(&doc(rows, vec![]));
        assert!(none.contains("Nothing stands out"));
    }

    #[test]
    fn csv_has_a_row_per_run_and_files_are_written_whole() {
        let rows = vec![row(0, 1, "nic0", 10.0, "ok"), row(1, 0, "nic0", 5.0, "ok")];
        let text = String::from_utf8(fleet_csv(&rows).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], FLEET_CSV_HEADER.join(","));
        assert!(lines[1].contains(",10.0000,"), "{}", lines[1]);
        let d = tempfile::tempdir().unwrap();
        let files = write_fleet(d.path(), &doc(rows.clone(), vec![])).unwrap();
        let back: FleetDoc = serde_json::from_slice(&std::fs::read(&files.json).unwrap()).unwrap();
        assert_eq!(back.rows.len(), 2);
        assert!(files.html.exists() && files.csv.exists());
        // Only the three files: no temporary left behind.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 3);

        // Row by row: the CSV grows whole rows; a directory with a matrix is not reused.
        let run = d.path().join("run");
        let w = FleetWriter::create(&run).unwrap();
        w.row(&rows[0]).unwrap();
        let one = std::fs::read_to_string(&w.files.csv).unwrap();
        assert_eq!(one.lines().count(), 2, "{one}");
        w.row(&rows[1]).unwrap();
        let two = std::fs::read(&w.files.csv).unwrap();
        assert_eq!(
            two,
            fleet_csv(&rows).unwrap(),
            "appended rows = the whole matrix"
        );
        w.document(&doc(rows, vec![]), true).unwrap();
        assert!(w.files.json.exists() && w.files.html.exists());
        let again = FleetWriter::create(&run).err().unwrap().to_string();
        assert!(again.contains("already holds a fleet matrix"), "{again}");
    }

    /// Issue 43 item 8: a dangling `matrix.csv` link in `--out` was created and filled.
    #[test]
    fn links_in_the_output_directory_are_not_written_through() {
        let d = tempfile::tempdir().unwrap();
        let (out, elsewhere) = (d.path().join("out"), d.path().join("elsewhere"));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("matrix.csv"), out.join("matrix.csv")).unwrap();
        let e = FleetWriter::create(&out).err().unwrap().to_string();
        assert!(e.contains("matrix.csv is a symbolic link"), "{e}");
        assert!(!elsewhere.join("matrix.csv").exists());
        // The other two files, and a whole rewrite, replace links rather than follow them.
        std::fs::remove_file(out.join("matrix.csv")).unwrap();
        for f in ["matrix.json", "report.html"] {
            std::os::unix::fs::symlink(elsewhere.join(f), out.join(f)).unwrap();
        }
        let w = FleetWriter::create(&out).unwrap();
        let rows = vec![row(0, 1, "nic0", 10.0, "ok")];
        w.row(&rows[0]).unwrap();
        w.document(&doc(rows.clone(), vec![]), true).unwrap();
        write_fleet(&out, &doc(rows, vec![])).unwrap();
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
        for f in ["matrix.csv", "matrix.json", "report.html"] {
            assert!(
                std::fs::symlink_metadata(out.join(f)).unwrap().is_file(),
                "{f}"
            );
        }
    }
}
