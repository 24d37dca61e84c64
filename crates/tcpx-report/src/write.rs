//! Writing one run directory: results.csv, samples.csv, report.json, tuned.env, tuned.json,
//! charts/, summary.md and a self-contained index.html.

use std::path::{Path, PathBuf};

use tcpx_model::{Knob, NotApplied};

use crate::error::{chain, Context, Error, Result};

use crate::chart::{render_chart, ChartFiles};
use crate::html;
use crate::record::{
    nic_plan_text, summarise, KnobValues, ResultRecord, RunReport, SideFigures, Summary,
};
use crate::safe::printable;

// Named here as well as at the crate root, for the modules that write their files through this one.
use crate::atomic_file::write_file;

/// What [`write_run`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// Charts that could not be drawn, with the error (the rest of the report is still written).
    pub chart_errors: Vec<String>,
}

const SIDE_FIELDS: [&str; 8] = SideFigures::CSV_COLUMNS;

fn side_cells(s: Option<&SideFigures>) -> Vec<String> {
    SIDE_FIELDS
        .iter()
        .map(|c| s.and_then(|f| f.csv_cell(c)).unwrap_or_default())
        .collect()
}

/// Figures whose interval summary rows carry in their own columns.
const INTERVAL_METRICS: [&str; 4] = ["server_gbs", "client_gbs", "p50_us", "p99_us"];

/// The results.csv header for a run with these knobs (`knob.<name>` each): one row per repetition
/// (`row` = `rep`), then one per configuration and size (`row` = `summary`: figures are the
/// medians over the repetitions that ran, with the interval of the main ones).
pub fn results_header(knobs: &[Knob]) -> Vec<String> {
    let mut h: Vec<String> = [
        "row",
        "rep",
        "n",
        "phase",
        "experiment",
        "label",
        "status",
        "reason",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    h.extend(knobs.iter().map(|k| format!("knob.{k}")));
    h.push("not_applied".into());
    h.extend(["size", "chunk", "started_s", "duration_s"].map(String::from));
    for side in ["send", "recv"] {
        h.extend(SIDE_FIELDS.iter().map(|f| format!("{side}.{f}")));
    }
    for m in INTERVAL_METRICS {
        h.push(format!("{m}.ci95_lo"));
        h.push(format!("{m}.ci95_hi"));
    }
    h.extend(["per_flow", "nic_plan"].map(String::from));
    h
}

/// `flow 0: send 1.234 recv 1.200 GB/s; flow 1: ...` (wrong bytes added where counted).
pub fn per_flow_text(r: &ResultRecord) -> String {
    r.per_flow
        .iter()
        .map(|f| {
            let wrong = f
                .wrong_bytes
                .map_or_else(String::new, |w| format!(", {w} wrong bytes"));
            format!(
                "flow {}: send {:.3} recv {:.3} GB/s{wrong}",
                f.flow, f.send_gbs, f.recv_gbs
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The cells a result and a summary row share after the experiment's name and status: the
/// value of each of `knobs` (empty where unset), the knobs not applied (`knob: why; ...`), the
/// message size and the chunk.
fn experiment_cells(
    knobs: &[Knob],
    values: &KnobValues,
    not_applied: &NotApplied,
    size: Option<u64>,
    chunk: Option<u64>,
) -> Vec<String> {
    let mut cells: Vec<String> = knobs
        .iter()
        .map(|k| match values.get(k) {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        })
        .collect();
    cells.push(
        not_applied
            .iter()
            .map(|(k, why)| format!("{k}: {why}"))
            .collect::<Vec<_>>()
            .join("; "),
    );
    cells.push(size.map_or_else(String::new, |s| s.to_string()));
    cells.push(chunk.map_or_else(String::new, |s| s.to_string()));
    cells
}

fn result_row(r: &ResultRecord, knobs: &[Knob]) -> Vec<String> {
    let mut row = vec![
        "rep".to_string(),
        r.rep.to_string(),
        "1".to_string(),
        r.phase.clone(),
        r.experiment.clone(),
        r.label.clone(),
        r.status.as_str().to_string(),
        r.reason.clone().unwrap_or_default(),
    ];
    row.extend(experiment_cells(
        knobs,
        &r.knobs,
        &r.not_applied,
        r.size,
        r.chunk,
    ));
    row.push(format!("{:.3}", r.started_s));
    row.push(format!("{:.3}", r.duration_s));
    row.extend(side_cells(r.send.as_ref()));
    row.extend(side_cells(r.recv.as_ref()));
    row.extend(std::iter::repeat_n(
        String::new(),
        2 * INTERVAL_METRICS.len(),
    ));
    row.push(per_flow_text(r));
    row.push(nic_plan_text(r));
    row
}

/// The medians of one side's figures over the repetitions (`prefix` `""`: receiver, `send_`).
fn median_side(s: &Summary, send: bool) -> Vec<String> {
    let m = |name: &str| s.metric(name);
    let cell = |v: Option<f64>, d: usize| v.map_or_else(String::new, |v| format!("{v:.d$}"));
    let (p50, p99, gbs) = if send {
        (m("send_p50_us"), m("send_p99_us"), m("client_gbs"))
    } else {
        (m("p50_us"), m("p99_us"), m("server_gbs"))
    };
    if gbs.is_none() {
        return vec![String::new(); SIDE_FIELDS.len()];
    }
    vec![
        if send {
            String::new()
        } else {
            cell(m("avg_us"), 3)
        },
        cell(p50, 3),
        cell(p99, 3),
        String::new(),
        String::new(),
        cell(gbs, 4),
        if send {
            String::new()
        } else {
            cell(m("busbw_gbs"), 4)
        },
        if send {
            String::new()
        } else {
            cell(m("wrong_bytes"), 0)
        },
    ]
}

fn summary_row(s: &Summary, knobs: &[Knob]) -> Vec<String> {
    let mut row = vec![
        "summary".to_string(),
        String::new(),
        s.n_ok.to_string(),
        s.phase.clone(),
        s.experiment.clone(),
        s.label.clone(),
        s.status.as_str().to_string(),
        s.reason.clone().unwrap_or_default(),
    ];
    row.extend(experiment_cells(
        knobs,
        &s.knobs,
        &s.not_applied,
        s.size,
        s.chunk,
    ));
    row.push(String::new());
    row.push(String::new());
    row.extend(median_side(s, true));
    row.extend(median_side(s, false));
    for m in INTERVAL_METRICS {
        match s.figure(m) {
            Some(f) => {
                row.push(format!("{:.4}", f.ci95_lo));
                row.push(format!("{:.4}", f.ci95_hi));
            }
            None => row.extend([String::new(), String::new()]),
        }
    }
    row.push(String::new());
    row.push(String::new());
    row
}

fn write_csv(
    path: &Path,
    header: &[String],
    rows: impl Iterator<Item = Vec<String>>,
) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    // Every cell printable: an escape sequence, bell, CR or line feed in a label, reason or
    // note (a peer's or a plan's text) is written escaped, one row per line (issue 43 item 6).
    let cells = |row: &[String]| row.iter().map(|c| printable(c)).collect::<Vec<_>>();
    w.write_record(cells(header))?;
    for row in rows {
        w.write_record(cells(&row))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| Error::Write(format!("encoding {}: {}", path.display(), e.error())))?;
    write_file(path, &bytes)
}

/// Writes every file of the run into `dir` (created if needed). Writing is repeatable: a run
/// directory is rewritten after each experiment, so an interrupted run still has its results.
/// Every file is written under a temporary name and renamed into place ([`write_file`]): a run
/// killed at any moment leaves each file whole, as of this write or the one before.
pub fn write_run(report: &RunReport, dir: &Path) -> Result<Written> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    let knobs = report.knobs_used();
    let mut full = report.clone();
    full.summaries = summarise(report.records.iter());
    let report = &full;

    let results = dir.join("results.csv");
    write_csv(
        &results,
        &results_header(&knobs),
        report
            .records
            .iter()
            .map(|r| result_row(r, &knobs))
            .chain(report.summaries.iter().map(|s| summary_row(s, &knobs))),
    )?;
    files.push(results);

    let samples = dir.join("samples.csv");
    write_csv(
        &samples,
        &["experiment", "t_s", "source", "subject", "metric", "value"].map(String::from),
        report.samples.iter().map(|s| {
            vec![
                s.experiment.clone(),
                format!("{:.3}", s.t_s),
                s.source.clone(),
                s.subject.clone(),
                s.metric.clone(),
                s.value.to_string(),
            ]
        }),
    )?;
    files.push(samples);

    let json = dir.join("report.json");
    write_file(&json, &serde_json::to_vec_pretty(report)?)?;
    files.push(json);

    files.extend(crate::tuned::write_tuned(report, dir)?);

    let chart_dir = dir.join("charts");
    let mut charts: Vec<(usize, ChartFiles)> = Vec::new();
    let mut chart_errors = Vec::new();
    for (i, spec) in report.charts.iter().enumerate() {
        match render_chart(report, spec, &chart_dir) {
            Ok(c) => {
                files.push(c.png.clone());
                files.push(c.svg.clone());
                charts.push((i, c));
            }
            Err(e) => chart_errors.push(chain(&e)),
        }
    }

    let md = dir.join("summary.md");
    write_file(
        &md,
        html::summary_markdown(report, &charts, &chart_errors).as_bytes(),
    )?;
    files.push(md);

    let index = dir.join("index.html");
    write_file(
        &index,
        html::run_html(report, &charts, &chart_errors)?.as_bytes(),
    )?;
    files.push(index);

    Ok(Written {
        dir: dir.to_path_buf(),
        files,
        chart_errors,
    })
}

/// report.json files larger than this are refused when read back.
pub const MAX_REPORT_JSON_BYTES: u64 = 256 << 20;

/// Reads a run directory's report.json back.
pub fn load_run(dir: &Path) -> Result<RunReport> {
    let path = dir.join("report.json");
    let text = crate::safe::read_bounded_bytes(&path, MAX_REPORT_JSON_BYTES, "a report.json")
        .with_context(|| {
            format!(
                "reading {} (is {} a run directory written by tcpx-run?)",
                path.display(),
                dir.display()
            )
        })?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}
