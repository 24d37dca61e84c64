//! A tune run's directory: `points.csv` (every point), `search.svg` (the search's path),
//! `summary.md`, `tune.json` and `tuned.env`. Every file is written whole or not at all
//! ([`tcpx_report::write_file`]); text that came from a run (error messages) is escaped for
//! each format.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tcpx_model::setting::Network;
use tcpx_plan::search::{Decision, Phase};
use tcpx_report::safe::{comment, shell_word};
use tcpx_report::stats::median;

use crate::{Subject, TuneRun};

/// Why a tune run's directory could not be written: a file that could not be written (the
/// message names it and what to check), or the run that could not be encoded as JSON.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A file of the run directory could not be written.
    #[error(transparent)]
    Write(#[from] tcpx_report::Error),
    /// `tune.json` could not be encoded.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Where the run was and what it loaded, for the files' headers and tuned.env.
#[derive(Debug, Clone, Default)]
pub struct RunContext {
    pub host: String,
    pub started: String,
    /// The net plugin NCCL loaded (`tcpx` subject).
    pub net_plugin: Option<String>,
    /// The command that reproduces the run.
    pub command: String,
}

/// The variables tuned.env exports: the winner's settings as its reader takes them (no
/// translation), and for NCCL the network pinned (`NCCL_NET`, with `NCCL_NET_PLUGIN` for a
/// plugin). Levels left at `default` are not exported.
pub fn tuned_vars(run: &TuneRun, ctx: &RunContext) -> Vec<(String, String)> {
    let Some(values) = run.winner_values() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match run.subject {
        Subject::Nccl(n) => {
            if let (Network::Tcpx, Some(p)) = (n, &ctx.net_plugin) {
                out.push(("NCCL_NET_PLUGIN".to_string(), p.clone()));
            }
            out.push(("NCCL_NET".to_string(), n.nccl_net_name().to_string()));
            // What the reader will run: a value it would lower (sockets x threads above its
            // cap, a chunk above a buffer's eighth) is written as lowered, so the file says
            // what runs and validate finds nothing clamped.
            let asked: std::collections::BTreeMap<String, String> = values
                .into_iter()
                .filter(|(_, v)| v != crate::space::DEFAULT_LEVEL)
                .collect();
            let effective = tcpx_model::setting::effective(n, &asked).ok();
            for (k, v) in asked {
                if let Some(s) = tcpx_model::setting::spec(n, &k) {
                    let x = effective
                        .as_ref()
                        .and_then(|e| e.values.get(s.var).copied())
                        .or_else(|| s.parse(&v).ok());
                    if let Some(x) = x {
                        out.push((k, s.text(x)));
                    }
                }
            }
        }
        Subject::SocketBackend => {
            for (k, v) in values {
                let knobs: Vec<(tcpx_model::Knob, String)> = if k == "layout" {
                    match v.split_once('x') {
                        Some((c, s)) => vec![
                            (tcpx_model::Knob::Channels, c.to_string()),
                            (tcpx_model::Knob::SocksPerChannel, s.to_string()),
                        ],
                        None => Vec::new(),
                    }
                } else {
                    tcpx_model::Knob::from_name(&k)
                        .map(|kn| vec![(kn, v)])
                        .unwrap_or_default()
                };
                for (kn, val) in knobs {
                    if let Some(env) = kn.spec().env {
                        out.push((env.to_string(), val));
                    }
                }
            }
        }
    }
    out
}

fn gbs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// `tuned.env`: a header saying what was measured and how the winner was chosen, then one
/// `export NAME=VALUE` per variable.
pub fn tuned_env(run: &TuneRun, ctx: &RunContext) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# tuned.env from tcpx-run tune {} ({}) on {} at {}",
        run.subject.name(),
        run.subject.describe(),
        comment(&ctx.host),
        ctx.started
    );
    let _ = writeln!(s, "# measured: {}", comment(&run.measured));
    let w = median(&run.outcome.winner_samples);
    let b = median(&run.outcome.base_samples);
    let _ = writeln!(
        s,
        "# winner {} GB/s (median of {}), the defaults {} GB/s; {}",
        gbs(w),
        run.outcome.winner_samples.len(),
        gbs(b),
        gain_text(run)
    );
    let _ = writeln!(s, "# chosen: {}", decision_text(run));
    match run.subject {
        Subject::Nccl(_) => {
            let _ = writeln!(s, "# prove it in NCCL: tcpx-run validate <this directory>");
        }
        Subject::SocketBackend => {
            let _ = writeln!(
                s,
                "# tcpx-run bench reads these TCPX_* variables as its flags' defaults"
            );
        }
    }
    if let Subject::Nccl(n) = run.subject {
        let _ = writeln!(
            s,
            "# NCCL_NET={} pins the network tuned: NCCL stops with an error instead of falling \
             back to another transport",
            n.nccl_net_name()
        );
    }
    if let Some(values) = run.winner_values() {
        let left: Vec<String> = values
            .iter()
            .filter(|(_, v)| v == crate::space::DEFAULT_LEVEL)
            .map(|(k, _)| k.clone())
            .collect();
        if !left.is_empty() {
            let _ = writeln!(
                s,
                "# left at their defaults (the search found nothing better): {}",
                left.join(", ")
            );
        }
    }
    let vars = tuned_vars(run, ctx);
    if vars.is_empty() {
        let _ = writeln!(s, "# no point succeeded: nothing to export");
    }
    for (k, v) in vars {
        let _ = writeln!(s, "export {k}={}", shell_word(&v));
    }
    s
}

fn gain_text(run: &TuneRun) -> String {
    match run.gain() {
        Some(r) => format!(
            "gain {:.2}x [{:.2}, {:.2}] (winner / defaults, 95% interval)",
            r.ratio, r.lo, r.hi
        ),
        None => "no gain can be given (the winner or the defaults have no figure)".into(),
    }
}

/// How the winner was chosen, in words.
pub fn decision_text(run: &TuneRun) -> String {
    match &run.outcome.decision {
        Decision::Clear => "ahead of every other finalist beyond 3% noise".into(),
        Decision::CheapestOfTied { others } => format!(
            "the cheapest of {} configurations tied within 3% noise",
            others.len() + 1
        ),
        Decision::Undecided => {
            "the highest median when the budget ended the race (not decided beyond noise)".into()
        }
        Decision::NoneSucceeded => "no point succeeded".into(),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Control characters out, as every report writer does with text from a run.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `points.csv`: one row per measured point in order.
pub fn points_csv(run: &TuneRun) -> String {
    let mut s = String::from("id,phase");
    for d in &run.space.dims {
        s.push(',');
        s.push_str(&csv_field(&d.name));
    }
    s.push_str(",status,gbs,seconds,networks,reason\n");
    for p in &run.points {
        let _ = write!(s, "{},{}", p.record.id, p.record.phase.as_str());
        for (_, v) in &p.values {
            s.push(',');
            s.push_str(&csv_field(v));
        }
        let (status, g, reason) = match &p.record.value {
            Ok(v) => ("ok", format!("{v:.3}"), String::new()),
            Err(e) => ("failed", String::new(), printable(e)),
        };
        let nets = p
            .evidence
            .as_ref()
            .map(|e| e.networks.join(" "))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            ",{status},{g},{:.2},{},{}",
            p.record.cost_s,
            csv_field(&printable(&nets)),
            csv_field(&reason)
        );
    }
    s
}

fn xml(s: &str) -> String {
    printable(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn phase_colour(p: Phase) -> &'static str {
    match p {
        Phase::Base => "#444444",
        Phase::Design => "#1f77b4",
        Phase::Refine => "#2ca02c",
        Phase::Race => "#ff7f0e",
        Phase::Ablation => "#9467bd",
    }
}

/// `search.svg`: every point in the order measured (x) against its GB/s (y), coloured by
/// stage, failed points as red crosses on the axis, the best so far as a line, the defaults'
/// figure dashed.
pub fn search_svg(run: &TuneRun) -> String {
    let (w, h, left, right, top, bottom) = (960.0, 440.0, 64.0, 180.0, 40.0, 48.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let n = run.points.len().max(1) as f64;
    let ymax = run
        .points
        .iter()
        .filter_map(|p| p.record.value.as_ref().ok().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |i: usize| left + pw * (i as f64 + 0.5) / n;
    let y = |v: f64| top + ph * (1.0 - v / ymax);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>");
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"24\" font-size=\"15\">tcpx-run tune {}: every point measured, in order</text>",
        xml(run.subject.name())
    );
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#dddddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text>",
            left + pw,
            left - 6.0,
            yy + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 {:.1})\" text-anchor=\"middle\">GB/s (receiver busbw)</text>",
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">point, in the order measured</text>",
        left + pw / 2.0,
        h - 10.0
    );
    if let Some(b) = median(&run.outcome.base_samples) {
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"#444444\" stroke-dasharray=\"5,4\"/>",
            y(b),
            left + pw
        );
    }
    let mut best = f64::NEG_INFINITY;
    let mut path = String::new();
    for (i, p) in run.points.iter().enumerate() {
        let title = xml(&format!(
            "point {} ({}): {} -> {}",
            p.record.id,
            p.record.phase.as_str(),
            run.space.describe(&p.record.coords),
            match &p.record.value {
                Ok(v) => format!("{v:.2} GB/s"),
                Err(e) => format!("failed: {e}"),
            }
        ));
        match p.record.value {
            Ok(v) => {
                best = best.max(v);
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{}\"><title>{title}</title></circle>",
                    x(i),
                    y(v),
                    phase_colour(p.record.phase)
                );
            }
            Err(_) => {
                let (cx, cy) = (x(i), y(0.0) - 4.0);
                let _ = writeln!(
                    s,
                    "<path d=\"M{:.1},{:.1}l8,8m0,-8l-8,8\" stroke=\"#d62728\" stroke-width=\"2\"><title>{title}</title></path>",
                    cx - 4.0,
                    cy - 4.0
                );
            }
        }
        if best.is_finite() {
            let _ = write!(
                path,
                "{}{:.1},{:.1} ",
                if path.is_empty() { "M" } else { "L" },
                x(i),
                y(best)
            );
        }
    }
    if !path.is_empty() {
        let _ = writeln!(
            s,
            "<path d=\"{path}\" fill=\"none\" stroke=\"#888888\" stroke-width=\"1\"/>"
        );
    }
    let lx = left + pw + 16.0;
    let legend = [
        (Phase::Base, "defaults (dashed)"),
        (Phase::Design, "design (Latin hypercube)"),
        (Phase::Refine, "refine (pattern search)"),
        (Phase::Race, "race (finalists again)"),
        (Phase::Ablation, "ablation (one knob reset)"),
    ];
    for (k, (p, text)) in legend.iter().enumerate() {
        let ly = top + 10.0 + 20.0 * k as f64;
        let _ = writeln!(
            s,
            "<circle cx=\"{lx}\" cy=\"{ly}\" r=\"4\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{text}</text>",
            phase_colour(*p),
            lx + 10.0,
            ly + 4.0
        );
    }
    let ly = top + 10.0 + 20.0 * legend.len() as f64;
    let _ = writeln!(
        s,
        "<path d=\"M{},{}l8,8m0,-8l-8,8\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"{}\" y=\"{}\">failed</text>",
        lx - 4.0,
        ly - 4.0,
        lx + 10.0,
        ly + 4.0
    );
    let _ = writeln!(
        s,
        "<text x=\"{lx}\" y=\"{}\">grey line: best so far</text>",
        ly + 24.0
    );
    s.push_str("</svg>\n");
    s
}

/// `summary.md`: what was tuned, the winner and its gain, what mattered, the finalists, the
/// failures, and how to reproduce and prove it.
pub fn summary_md(run: &TuneRun, ctx: &RunContext) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# tcpx-run tune {}: {}\n",
        run.subject.name(),
        run.subject.describe()
    );
    let _ = writeln!(
        s,
        "- machine: {}, started {}",
        printable(&ctx.host),
        ctx.started
    );
    let _ = writeln!(s, "- measured: {}", printable(&run.measured));
    let _ = writeln!(
        s,
        "- space: {} knobs, {} configurations; budget {} points / {:.0} s; used {} points in {:.0} s (seed {})",
        run.space.dims.len(),
        run.space.size(),
        run.budget.points,
        run.budget.seconds,
        run.points.len(),
        run.elapsed_s,
        run.seed
    );
    let _ = writeln!(s, "- reproduce: `{}`\n", printable(&ctx.command));
    let _ = writeln!(s, "## Result\n");
    let w = median(&run.outcome.winner_samples);
    let b = median(&run.outcome.base_samples);
    let _ = writeln!(
        s,
        "Winner {} GB/s (median of {}), defaults {} GB/s: {}. Chosen as {}.\n",
        gbs(w),
        run.outcome.winner_samples.len(),
        gbs(b),
        gain_text(run),
        decision_text(run)
    );
    if let Some(winner) = &run.outcome.winner {
        let _ = writeln!(s, "| setting | winner | default |\n|---|---|---|");
        for ((d, &wi), &bi) in run.space.dims.iter().zip(winner).zip(&run_base(run)) {
            let _ = writeln!(s, "| {} | {} | {} |", d.name, d.levels[wi], d.levels[bi]);
        }
        s.push('\n');
    }
    let _ = writeln!(s, "## Which settings mattered\n");
    if run.outcome.effects.is_empty() {
        let _ = writeln!(s, "The winner is the defaults, or the budget left no point to reset its settings one at a time.\n");
    } else {
        let _ = writeln!(
            s,
            "Each row: the winner over the winner with only that setting put back to its default \
             (measured once; above 1 the change helped at the winner, interactions included).\n"
        );
        let _ = writeln!(
            s,
            "| setting | winner | default | winner / reset |\n|---|---|---|---|"
        );
        for e in &run.outcome.effects {
            let g = e
                .gain
                .map_or_else(|| "the reset point failed".into(), |g| format!("{g:.2}x"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {g} |",
                e.dim, e.winner_level, e.base_level
            );
        }
        s.push('\n');
    }
    let _ = writeln!(s, "## Finalists\n");
    for c in &run.outcome.finalists {
        let samples: Vec<String> = c.samples.iter().map(|v| format!("{v:.2}")).collect();
        let _ = writeln!(
            s,
            "- {}: median {} GB/s of [{}]",
            run.space.describe(&c.coords),
            gbs(median(&c.samples)),
            samples.join(", ")
        );
    }
    let _ = writeln!(s, "\n## The search's path\n");
    for p in [
        Phase::Base,
        Phase::Design,
        Phase::Refine,
        Phase::Race,
        Phase::Ablation,
    ] {
        let pts: Vec<&crate::PointRow> =
            run.points.iter().filter(|r| r.record.phase == p).collect();
        if pts.is_empty() {
            continue;
        }
        let ok: Vec<f64> = pts
            .iter()
            .filter_map(|r| r.record.value.as_ref().ok().copied())
            .collect();
        let best = ok.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            s,
            "- {}: {} points, {} failed, best {}",
            p.as_str(),
            pts.len(),
            pts.len() - ok.len(),
            if best.is_finite() {
                format!("{best:.2} GB/s")
            } else {
                "-".into()
            }
        );
    }
    let _ = writeln!(s, "\nEvery point: points.csv; the chart: search.svg.\n");
    let failed: Vec<&crate::PointRow> = run
        .points
        .iter()
        .filter(|r| r.record.value.is_err())
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "## Points that failed (never recommended)\n");
        for r in failed.iter().take(20) {
            let _ = writeln!(
                s,
                "- point {} ({}): {}: {}",
                r.record.id,
                r.record.phase.as_str(),
                run.space.describe(&r.record.coords),
                printable(
                    r.record
                        .value
                        .as_ref()
                        .err()
                        .map(String::as_str)
                        .unwrap_or("")
                )
            );
        }
        if failed.len() > 20 {
            let _ = writeln!(s, "- ... and {} more (points.csv)", failed.len() - 20);
        }
        s.push('\n');
    }
    let problems: Vec<String> = run
        .points
        .iter()
        .filter_map(|r| r.evidence.as_ref())
        .flat_map(|e| e.problems.iter().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(s, "## What NCCL's logs said\n");
        for p in problems.iter().take(10) {
            let _ = writeln!(s, "- {}", printable(p));
        }
        s.push('\n');
    }
    let reader = match run.subject {
        Subject::Nccl(Network::Socket) => "NCCL",
        Subject::Nccl(Network::Tcpx) => "NCCL and the GPUDirect-TCPX plugin",
        Subject::SocketBackend => "tcpx-run bench",
    };
    let _ = writeln!(
        s,
        "## Use it\n\n`tuned.env` holds the winner's variables as {reader} reads them; export them \
         with `tcpx-run apply <this directory>`."
    );
    if let Subject::Nccl(_) = run.subject {
        let _ = writeln!(
            s,
            "Prove them in NCCL against its defaults with `tcpx-run validate <this directory>`."
        );
    }
    s
}

fn run_base(run: &TuneRun) -> Vec<usize> {
    run.points
        .iter()
        .find(|p| p.record.phase == Phase::Base)
        .map(|p| p.record.coords.clone())
        .unwrap_or_else(|| vec![0; run.space.dims.len()])
}

/// Writes every file of the run into `dir` (which exists); returns the paths written.
pub fn write_dir(run: &TuneRun, ctx: &RunContext, dir: &Path) -> Result<Vec<PathBuf>, OutputError> {
    let doc = serde_json::json!({
        "tool": "tcpx-run tune",
        "host": ctx.host,
        "started": ctx.started,
        "command": ctx.command,
        "net_plugin": ctx.net_plugin,
        "tuned": tuned_vars(run, ctx),
        "gain": run.gain(),
        "run": run,
    });
    let files: Vec<(&str, String)> = vec![
        ("points.csv", points_csv(run)),
        ("search.svg", search_svg(run)),
        ("summary.md", summary_md(run, ctx)),
        ("tune.json", serde_json::to_string_pretty(&doc)? + "\n"),
        ("tuned.env", tuned_env(run, ctx)),
    ];
    let mut out = Vec::new();
    for (name, text) in files {
        let p = dir.join(name);
        tcpx_report::write_file(&p, text.as_bytes())?;
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_plan::search::{Budget, Decision, Dim, Outcome, Space};

    fn run_with_winner(subject: Subject, dims: &[(&str, &[&str])], winner: Vec<usize>) -> TuneRun {
        let space = Space::new(
            dims.iter()
                .map(|(n, ls)| Dim {
                    name: n.to_string(),
                    levels: ls.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        )
        .unwrap();
        TuneRun {
            subject,
            space,
            budget: Budget {
                points: 2,
                seconds: 1.0,
            },
            seed: 0,
            measured: "test".into(),
            points: Vec::new(),
            outcome: Outcome {
                winner: Some(winner),
                decision: Decision::Clear,
                winner_samples: vec![2.0],
                base_samples: vec![1.0],
                finalists: Vec::new(),
                effects: Vec::new(),
            },
            elapsed_s: 1.0,
        }
    }

    #[test]
    fn tuned_env_pins_the_network_and_writes_what_the_reader_runs() {
        let run = run_with_winner(
            Subject::Nccl(Network::Tcpx),
            &[
                ("NCCL_NSOCKS_PERTHREAD", &["default", "4"]),
                ("NCCL_SOCKET_NTHREADS", &["default", "4"]),
                ("NCCL_P2P_NET_CHUNKSIZE", &["default", "2M"]),
            ],
            vec![1, 1, 0],
        );
        let ctx = RunContext {
            net_plugin: Some("/opt/tcpx/libnccl-net.so".into()),
            ..Default::default()
        };
        let vars = tuned_vars(&run, &ctx);
        assert_eq!(
            vars,
            [
                (
                    "NCCL_NET_PLUGIN".to_string(),
                    "/opt/tcpx/libnccl-net.so".to_string()
                ),
                ("NCCL_NET".to_string(), "GPUDirectTCPX_v7".to_string()),
                // 4 x 4 sockets is above the plugin's 8: it runs 8 / 4 = 2 per thread.
                ("NCCL_NSOCKS_PERTHREAD".to_string(), "2".to_string()),
                ("NCCL_SOCKET_NTHREADS".to_string(), "4".to_string()),
            ]
        );
        let env = tuned_env(&run, &ctx);
        let parsed = tcpx_report::tuned::parse_env(&env).unwrap();
        assert_eq!(parsed.vars, vars, "tuned.env reads back as written");
        assert!(env.contains("left at their defaults") && env.contains("NCCL_P2P_NET_CHUNKSIZE"));
    }

    #[test]
    fn the_socket_backends_winner_is_its_own_tcpx_variables() {
        let run = run_with_winner(
            Subject::SocketBackend,
            &[("layout", &["1x16", "2x8"]), ("chunk", &["auto", "8M"])],
            vec![1, 1],
        );
        let vars = tuned_vars(&run, &RunContext::default());
        assert_eq!(
            vars,
            [
                ("TCPX_CHANNELS".to_string(), "2".to_string()),
                ("TCPX_SOCKS_PER_CHANNEL".to_string(), "8".to_string()),
                ("TCPX_CHUNK".to_string(), "8M".to_string()),
            ]
        );
    }

    #[test]
    fn text_from_a_run_is_escaped_in_every_file() {
        let mut run = run_with_winner(Subject::SocketBackend, &[("window", &["4", "8"])], vec![1]);
        run.points.push(crate::PointRow {
            record: tcpx_plan::search::PointRecord {
                id: 0,
                coords: vec![0],
                phase: tcpx_plan::search::Phase::Base,
                value: Err("boom\u{1b}[31m,\"quoted\"\n<script>".into()),
                cost_s: 1.0,
            },
            values: vec![("window".into(), "4".into())],
            evidence: None,
        });
        let csv = points_csv(&run);
        assert!(!csv.contains('\u{1b}'));
        assert_eq!(csv.lines().count(), 2, "one header, one row: {csv}");
        let svg = search_svg(&run);
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"));
        let md = summary_md(&run, &RunContext::default());
        assert!(!md.contains('\u{1b}'));
    }
}
