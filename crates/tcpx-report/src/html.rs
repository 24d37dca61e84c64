//! summary.md and the self-contained index.html of one run (charts embedded as data: URIs, no
//! external script, style or font).

use std::fmt::Write as _;

use crate::error::{Context, Result};

use crate::chart::ChartFiles;
use crate::record::{
    summarise, Completion, CriterionResult, DecisionRecord, Ranking, RunReport, Summary, Verdict,
};
use crate::safe::printable;
use tcpx_topo::text::is_line_breaking;

/// `s` for HTML text and double-quoted attributes: `&`, `<`, `>` and `"` as entities, and
/// every control character (a peer's or a plan's escape sequence, bell, CR or line feed)
/// written as an escape ([`printable`]), so none reaches index.html raw (issue 43 item 6).
pub fn esc(s: &str) -> String {
    printable(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `s` for one summary.md table cell or list item: a line feed as a blank (as before), every
/// other control character as an escape ([`printable`]), `|` escaped.
fn md_cell(s: &str) -> String {
    printable(&s.replace('\n', " ")).replace('|', "\\|")
}

/// Text over several lines: its line feeds kept, every other control character (escape, bell,
/// CR) written as an escape.
fn md_lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// The last guard of a file people read: any control character but the line feeds the writer
/// itself put there, escaped (whatever was interpolated unescaped above).
fn no_raw_controls(text: String) -> String {
    if !text.chars().any(|c| c != '\n' && is_line_breaking(c)) {
        return text;
    }
    md_lines(&text)
}

pub(crate) fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn size_text(v: Option<u64>) -> String {
    match v {
        None => "-".into(),
        Some(v) => {
            for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
                if v >= 1 << shift && v % (1 << shift) == 0 {
                    return format!("{}{unit}", v >> shift);
                }
            }
            v.to_string()
        }
    }
}

fn summary_note(report: &RunReport, s: &Summary) -> String {
    let mut parts = Vec::new();
    if let Some(reason) = &s.reason {
        parts.push(reason.clone());
    }
    for (k, why) in &s.not_applied {
        parts.push(format!("{k}: not applied here ({why})"));
    }
    if let Some(r) = report
        .records
        .iter()
        .find(|r| r.experiment == s.experiment && r.size == s.size && !r.nic_plan.is_empty())
    {
        parts.push(format!(
            "channels on NICs: {}",
            crate::record::nic_plan_text(r)
        ));
    }
    parts.join("; ")
}

/// Each flow's (GPU's) server GB/s, median over the repetitions, `0: 1.20, 1: 1.10`; `-` when
/// not known.
fn per_flow_cell(report: &RunReport, s: &Summary) -> String {
    let recs: Vec<_> = report
        .records
        .iter()
        .filter(|r| r.experiment == s.experiment && r.size == s.size && !r.per_flow.is_empty())
        .collect();
    let Some(first) = recs.first() else {
        return "-".into();
    };
    first
        .per_flow
        .iter()
        .map(|f| {
            let vals: Vec<f64> = recs
                .iter()
                .filter_map(|r| r.per_flow.iter().find(|p| p.flow == f.flow))
                .map(|p| p.recv_gbs)
                .collect();
            let m = crate::stats::median(&vals).unwrap_or(f.recv_gbs);
            format!("{}: {:.3}", f.flow, m)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `median [lo, hi] n` of a metric, `-` when not measured.
fn figure_cell(s: &Summary, metric: &str, digits: usize) -> String {
    s.figure(metric)
        .map_or_else(|| "-".into(), |f| f.text(digits))
}

fn status_cell(s: &Summary) -> String {
    if s.reps > 1 {
        format!("{} ({} of {} ran)", s.status.as_str(), s.n_ok, s.reps)
    } else {
        s.status.as_str().to_string()
    }
}

/// The value a criterion was held against, with its interval when it has one.
fn actual_cell(c: &CriterionResult) -> String {
    match (c.actual, c.ci95_lo, c.ci95_hi) {
        (Some(a), Some(lo), Some(hi)) => {
            let n = c.n.map_or_else(String::new, |n| format!(" n={n}"));
            format!("{a:.3} [{lo:.3}, {hi:.3}]{n}")
        }
        (a, _, _) => fmt_opt(a, 3),
    }
}

fn criterion_detail(c: &CriterionResult) -> String {
    let mut d = c.detail.clone();
    if c.verdict == Verdict::Inconclusive {
        let more = match c.reps_to_settle {
            Some(n) => format!("about {n} repetitions would likely settle it"),
            None => {
                "the estimate sits on the threshold: more repetitions will not settle it".into()
            }
        };
        if d.is_empty() {
            d = more;
        } else {
            d = format!("{d}; {more}");
        }
    }
    d
}

fn decision_answer(d: &DecisionRecord) -> &'static str {
    match d.answer {
        Some(true) => "yes",
        Some(false) => "no",
        None => "UNANSWERED",
    }
}

pub(crate) const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#f0f0f0}.PASS{color:#176f2c;font-weight:bold}.FAIL{color:#b00020;font-weight:bold}\
.NA{color:#777;font-weight:bold}.banner{padding:.6em 1em;border-radius:4px;font-size:1.2em}\
.INCONCLUSIVE{color:#9a6700;font-weight:bold}.banner.inconclusive{background:#fff8e1}.banner.pass{background:#e3f4e6}.banner.fail{background:#fde3e6}.banner.incomplete{background:#fff2cc}\
figure{margin:1em 0}img.chart{max-width:100%;border:1px solid #ddd}code{background:#f5f5f5;padding:0 3px}";

/// Script that records in the DOM how many charts decoded, so a headless browser dump can
/// check that charts loaded.
pub(crate) const CHART_CHECK: &str = "<script>window.addEventListener('load',function(){\
var imgs=Array.prototype.slice.call(document.querySelectorAll('img.chart'));\
var ok=imgs.filter(function(i){return i.complete&&i.naturalWidth>0;}).length;\
document.body.setAttribute('data-charts-loaded',String(ok));\
document.body.setAttribute('data-charts-total',String(imgs.length));});</script>";

fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "PASS",
        Verdict::Fail => "FAIL",
        Verdict::Inconclusive => "INCONCLUSIVE",
        Verdict::NotEvaluated => "NA",
    }
}

/// The summaries of one phase (computed from the records when the report has none yet).
fn phase_summaries<'a>(report: &'a RunReport, all: &'a [Summary], phase: &str) -> Vec<&'a Summary> {
    let _ = report;
    all.iter().filter(|s| s.phase == phase).collect()
}

fn all_summaries(report: &RunReport) -> Vec<Summary> {
    if report.summaries.is_empty() {
        summarise(report.records.iter())
    } else {
        report.summaries.clone()
    }
}

fn noise_line(report: &RunReport) -> Option<String> {
    report.noise.as_ref().map(|n| {
        let measured = n
            .measured
            .map_or_else(|| "not measured".into(), |m| format!("{:.1}%", m * 100.0));
        let source = if n.source.is_empty() {
            format!("floor {:.1}% from the target set", n.floor * 100.0)
        } else {
            n.source.clone()
        };
        format!(
            "Noise: differences smaller than {:.1}% are not counted; applied: {source} (A/A spread {measured}). {}",
            n.used * 100.0,
            n.detail
        )
    })
}

/// One line per sequential comparison: rounds, why it stopped, the interval's method.
fn sequential_lines(report: &RunReport) -> Vec<String> {
    report
        .sequential
        .iter()
        .map(|q| {
            format!(
                "({}) {}: {} of at most {} rounds, {:.0} s, stopped: {}. {}",
                q.phase,
                q.configurations.join(" vs "),
                q.rounds,
                q.max_rounds,
                q.seconds,
                q.stop.as_str(),
                q.why
            )
        })
        .collect()
}

/// What the interval of every comparison below is.
fn sequential_method(report: &RunReport) -> Option<String> {
    report
        .sequential
        .first()
        .map(|q| format!("Intervals of comparisons: {}.", q.method))
}

const FIGURES_NOTE: &str = "Figures: median [interval] n repetitions and the interval's real level: the order-statistic interval of the median, 95% from 6 repetitions, [min, max] below (75% at 3, 94% at 5).";

pub(crate) fn summary_markdown(
    report: &RunReport,
    charts: &[(usize, ChartFiles)],
    chart_errors: &[String],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Plan `{}` — {}\n",
        md_cell(&report.plan),
        md_cell(&report.stamp)
    );
    let _ = writeln!(s, "**Result: {}**\n", md_cell(&report.verdict_line()));
    let _ = writeln!(
        s,
        "- plan: `{}`\n- platform: {} (targets: {})\n- started {}, finished {}",
        md_cell(&report.plan_path),
        md_cell(&report.platform),
        md_cell(&report.targets),
        md_cell(&report.started_utc),
        md_cell(&report.finished_utc)
    );
    for (k, v) in &report.setup {
        let _ = writeln!(s, "- {}: {}", md_cell(k), md_cell(v));
    }
    let _ = writeln!(s, "\n## Criteria\n");
    if report.criteria.is_empty() {
        let _ = writeln!(s, "(none declared)");
    } else {
        let _ = writeln!(
            s,
            "| phase | criterion | verdict | actual | threshold | detail |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for c in &report.criteria {
            let _ = writeln!(
                s,
                "| {} | {} | **{}** | {} | {} | {} |",
                md_cell(&c.phase),
                md_cell(&c.text),
                c.verdict.as_str(),
                md_cell(&actual_cell(c)),
                fmt_opt(c.threshold, 3),
                md_cell(&criterion_detail(c))
            );
        }
    }
    if let Some(n) = noise_line(report) {
        let _ = writeln!(s, "\n{}", md_cell(&n));
    }
    if !report.rankings.is_empty() {
        let _ = writeln!(s, "\n## Rankings\n");
        for r in &report.rankings {
            let _ = writeln!(s, "- {}", ranking_line(r, md_cell));
        }
    }
    if !report.sequential.is_empty() {
        let _ = writeln!(s, "\n## Sequential comparisons\n");
        if let Some(m) = sequential_method(report) {
            let _ = writeln!(s, "{}\n", md_cell(&m));
        }
        for l in sequential_lines(report) {
            let _ = writeln!(s, "- {}", md_cell(&l));
        }
    }
    let _ = writeln!(s, "\n## Decisions\n");
    if report.decisions.is_empty() {
        let _ = writeln!(s, "(none declared)");
    }
    for d in &report.decisions {
        let answer = decision_answer(d);
        let _ = writeln!(
            s,
            "- **{}** ({}): {} — answer: {answer} → {}**{}** (not taken: {}). {}",
            md_cell(&d.name),
            md_cell(&d.phase),
            md_cell(&d.question),
            if d.answer.is_none() {
                "default branch "
            } else {
                ""
            },
            md_cell(&d.branch_taken),
            md_cell(&d.branch_not_taken),
            md_cell(&d.detail)
        );
    }
    if !charts.is_empty() || !chart_errors.is_empty() {
        let _ = writeln!(s, "\n## Charts\n");
        for (i, c) in charts {
            let spec = &report.charts[*i];
            let _ = writeln!(
                s,
                "![{}](charts/{}.png) ([SVG](charts/{}.svg), {} points)\n",
                md_cell(&spec.title),
                md_cell(&spec.id),
                md_cell(&spec.id),
                c.points
            );
        }
        for e in chart_errors {
            let _ = writeln!(s, "- chart not drawn: {}", md_cell(e));
        }
    }
    let summaries = all_summaries(report);
    for phase in &report.phases {
        let recs = phase_summaries(report, &summaries, &phase.name);
        let _ = writeln!(s, "\n## {}\n", md_cell(&phase.name));
        if !phase.description.is_empty() {
            let _ = writeln!(s, "{}\n", md_cell(&phase.description));
        }
        if recs.is_empty() {
            let _ = writeln!(s, "(no experiments)");
            continue;
        }
        let _ = writeln!(
            s,
            "{FIGURES_NOTE}\n\n| configuration | status | size | chunk | server GB/s | client GB/s | server GB/s per flow | p50 us | p99 us | notes |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for r in recs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                md_cell(&r.label),
                md_cell(&status_cell(r)),
                size_text(r.size),
                size_text(r.chunk),
                figure_cell(r, "server_gbs", 3),
                figure_cell(r, "client_gbs", 3),
                md_cell(&per_flow_cell(report, r)),
                figure_cell(r, "p50_us", 1),
                figure_cell(r, "p99_us", 1),
                md_cell(&summary_note(report, r))
            );
        }
    }
    if !report.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &report.notes {
            let _ = writeln!(s, "- {}", md_cell(n));
        }
    }
    let _ = writeln!(
        s,
        "\nFiles: `results.csv` (every knob and figure per experiment, size and repetition, then one summary row per experiment and size), `samples.csv` (CPU/IRQ/NIC samples), `report.json` (all of it), `charts/`."
    );
    no_raw_controls(s)
}

fn banner_class(r: &RunReport) -> &'static str {
    match (&r.completion, r.exit_code()) {
        (Completion::Incomplete(_), _) => "incomplete",
        (_, 0) if r.nothing_measured() => "inconclusive",
        (_, 0)
            if r.criteria
                .iter()
                .any(|c| c.verdict == Verdict::Inconclusive) =>
        {
            "inconclusive"
        }
        (_, 0) => "pass",
        _ => "fail",
    }
}

pub(crate) fn run_html(
    report: &RunReport,
    charts: &[(usize, ChartFiles)],
    chart_errors: &[String],
) -> Result<String> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\"><title>{} {}</title><style>{STYLE}</style></head><body>",
        esc(&report.plan),
        esc(&report.stamp)
    );
    let _ = write!(
        h,
        "<h1>Plan <code>{}</code> — {}</h1><p class=\"banner {}\" id=\"verdict\">{}</p>",
        esc(&report.plan),
        esc(&report.stamp),
        banner_class(report),
        esc(&report.verdict_line())
    );
    let _ = write!(h, "<table><tr><th>plan</th><td>{}</td></tr><tr><th>platform</th><td>{} (targets: {})</td></tr><tr><th>started / finished</th><td>{} / {}</td></tr>",
        esc(&report.plan_path), esc(&report.platform), esc(&report.targets), esc(&report.started_utc), esc(&report.finished_utc));
    for (k, v) in &report.setup {
        let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    h.push_str("</table><h2>Criteria</h2>");
    if report.criteria.is_empty() {
        h.push_str("<p>(none declared)</p>");
    } else {
        h.push_str("<table id=\"criteria\"><tr><th>phase</th><th>criterion</th><th>verdict</th><th>actual</th><th>threshold</th><th>detail</th></tr>");
        for c in &report.criteria {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.phase),
                esc(&c.text),
                verdict_class(c.verdict),
                c.verdict.as_str(),
                esc(&actual_cell(c)),
                fmt_opt(c.threshold, 3),
                esc(&criterion_detail(c))
            );
        }
        h.push_str("</table>");
    }
    if let Some(n) = noise_line(report) {
        let _ = write!(h, "<p id=\"noise\">{}</p>", esc(&n));
    }
    if !report.rankings.is_empty() {
        h.push_str("<h2>Rankings</h2><ul id=\"rankings\">");
        for r in &report.rankings {
            let _ = write!(h, "<li>{}</li>", ranking_line(r, esc));
        }
        h.push_str("</ul>");
    }
    if !report.sequential.is_empty() {
        h.push_str("<h2>Sequential comparisons</h2>");
        if let Some(m) = sequential_method(report) {
            let _ = write!(h, "<p>{}</p>", esc(&m));
        }
        h.push_str("<ul id=\"sequential\">");
        for l in sequential_lines(report) {
            let _ = write!(h, "<li>{}</li>", esc(&l));
        }
        h.push_str("</ul>");
    }
    h.push_str("<h2>Decisions</h2>");
    if report.decisions.is_empty() {
        h.push_str("<p>(none declared)</p>");
    } else {
        h.push_str("<table id=\"decisions\"><tr><th>decision</th><th>question</th><th>answer</th><th>branch taken</th><th>not taken</th><th>detail</th></tr>");
        for d in &report.decisions {
            let answer = decision_answer(d);
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{answer}</td><td>{}<b>{}</b></td><td>{}</td><td>{}</td></tr>",
                esc(&d.name),
                esc(&d.question),
                if d.answer.is_none() { "default branch: " } else { "" },
                esc(&d.branch_taken),
                esc(&d.branch_not_taken),
                esc(&d.detail)
            );
        }
        h.push_str("</table>");
    }
    if !charts.is_empty() || !chart_errors.is_empty() {
        h.push_str("<h2>Charts</h2>");
    }
    for (i, c) in charts {
        let spec = &report.charts[*i];
        let png = std::fs::read(&c.png).with_context(|| format!("reading {}", c.png.display()))?;
        let _ = write!(
            h,
            "<figure><img class=\"chart\" alt=\"{}\" src=\"data:image/png;base64,{}\"><figcaption>{} — <a href=\"charts/{}.svg\">SVG</a>, <a href=\"charts/{}.png\">PNG</a></figcaption></figure>",
            esc(&spec.title),
            base64(&png),
            esc(&spec.title),
            esc(&spec.id),
            esc(&spec.id)
        );
    }
    for e in chart_errors {
        let _ = write!(h, "<p class=\"FAIL\">chart not drawn: {}</p>", esc(e));
    }
    let summaries = all_summaries(report);
    for phase in &report.phases {
        let _ = write!(
            h,
            "<h2>{}</h2><p>{}</p>",
            esc(&phase.name),
            esc(&phase.description)
        );
        let recs = phase_summaries(report, &summaries, &phase.name);
        if recs.is_empty() {
            h.push_str("<p>(no experiments)</p>");
            continue;
        }
        let _ = write!(h, "<p>{}</p>", esc(FIGURES_NOTE));
        h.push_str("<table class=\"results\"><tr><th>configuration</th><th>status</th><th>size</th><th>chunk</th><th>server GB/s</th><th>client GB/s</th><th>server GB/s per flow</th><th>p50 us</th><th>p99 us</th><th>notes</th></tr>");
        for r in recs {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.label),
                esc(&status_cell(r)),
                size_text(r.size),
                size_text(r.chunk),
                esc(&figure_cell(r, "server_gbs", 3)),
                esc(&figure_cell(r, "client_gbs", 3)),
                esc(&per_flow_cell(report, r)),
                esc(&figure_cell(r, "p50_us", 1)),
                esc(&figure_cell(r, "p99_us", 1)),
                esc(&summary_note(report, r))
            );
        }
        h.push_str("</table>");
    }
    if !report.notes.is_empty() {
        h.push_str("<h2>Notes</h2><ul>");
        for n in &report.notes {
            let _ = write!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>");
    }
    h.push_str("<p>Files: <a href=\"results.csv\">results.csv</a>, <a href=\"samples.csv\">samples.csv</a>, <a href=\"report.json\">report.json</a>, <a href=\"summary.md\">summary.md</a>.</p>");
    h.push_str(CHART_CHECK);
    h.push_str("</body></html>\n");
    Ok(no_raw_controls(h))
}

/// A ranking as one line, `(phase) text (interval: METHOD)`, each part through `cell` (the
/// escaping of summary.md or of index.html).
fn ranking_line(r: &Ranking, cell: fn(&str) -> String) -> String {
    format!(
        "({}) {}{}",
        cell(&r.phase),
        cell(&r.text),
        cell(&interval_note(&r.method))
    )
}

/// ` (interval: METHOD)` after a ranking, or nothing where the ranking names no method.
fn interval_note(method: &str) -> String {
    if method.is_empty() {
        String::new()
    } else {
        format!(" (interval: {method})")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(i.as_bytes()), o);
        }
    }
}
