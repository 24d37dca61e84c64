//! What a plan adds to its report besides verdicts: `chart`, `note` and `print` (notes), and
//! number formatting for texts (`fmt`, `pct`).

use rhai::{Array, Dynamic, Engine, Map};
use tcpx_report::{ChartKind, ChartSpec, METRICS};

use super::check::Metric;
use super::values::{as_f64, err, map_get, RResult};
use super::Shared;
use crate::knobs::{knob_names, suggest, KNOBS};

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[("chart", 1), ("note", 1), ("fmt", 2), ("pct", 1)];

fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').chars().take(60).collect()
}

fn check_knob_name(what: &str, k: &str) -> RResult<()> {
    if KNOBS.iter().any(|x| x.name == k) {
        return Ok(());
    }
    let hint = suggest(k, knob_names())
        .map(|s| format!(": did you mean `{s}`?"))
        .unwrap_or_default();
    err(format!("chart {what} `{k}` is not a knob{hint}"))
}

fn chart(st: &Shared, m: &Map) -> RResult<()> {
    const KEYS: &[&str] = &[
        "id", "title", "kind", "metric", "x", "y", "series", "results", "phase",
    ];
    for k in m.keys() {
        if !KEYS.contains(&k.as_str()) {
            let hint = suggest(k, KEYS.iter().copied())
                .map(|s| format!(": did you mean `{s}`?"))
                .unwrap_or_default();
            return err(format!(
                "chart: unknown key `{k}`{hint} (keys: {})",
                KEYS.join(", ")
            ));
        }
    }
    let text = |k: &str| -> RResult<Option<String>> {
        match m.get(k) {
            None => Ok(None),
            Some(d) if d.is_unit() => Ok(None),
            Some(d) if d.is_string() => Ok(d.clone().into_string().ok()),
            Some(d) => err(format!("chart: `{k}` wants text, got {}", d.type_name())),
        }
    };
    let title = text("title")?.map_or_else(|| err("chart: give a title"), Ok)?;
    let kind = match text("kind")?.as_deref() {
        Some("bar") => ChartKind::Bar,
        Some("line") => ChartKind::Line,
        Some("heatmap") => ChartKind::Heatmap,
        Some(other) => {
            return err(format!(
                "chart kind `{other}`: use \"bar\", \"line\" or \"heatmap\""
            ))
        }
        None => return err("chart: give a kind: \"bar\", \"line\" or \"heatmap\""),
    };
    let metric = text("metric")?.unwrap_or_else(|| "server_gbs".into());
    let metric = Metric::parse(&metric)
        .map(Metric::name)
        .map_or_else(
            || {
                let all: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
                let hint = suggest(&metric, all.iter().copied())
                    .map(|s| format!(": did you mean `{s}`?"))
                    .unwrap_or_default();
                err(format!("chart metric `{metric}` is unknown{hint}"))
            },
            Ok,
        )?
        .to_string();
    let (x, y, series) = (text("x")?, text("y")?, text("series")?);
    match kind {
        ChartKind::Line if x.is_none() => return err("a line chart needs x: the knob varied"),
        ChartKind::Heatmap if x.is_none() || y.is_none() => {
            return err("a heatmap needs x and y: the two knobs varied")
        }
        _ => {}
    }
    for (what, k) in [("x", &x), ("y", &y), ("series", &series)] {
        if let Some(k) = k {
            check_knob_name(what, k)?;
        }
    }
    let experiments: Vec<String> = match m.get("results") {
        None => vec![],
        Some(d) if d.is_array() => d
            .clone()
            .cast::<Array>()
            .iter()
            .filter(|r| r.is_map())
            .map(|r| {
                map_get(&r.clone().cast::<Map>(), "name")
                    .into_string()
                    .unwrap_or_default()
            })
            .collect(),
        Some(d) => {
            return err(format!(
                "chart: `results` wants an array of results, got {}",
                d.type_name()
            ))
        }
    };
    let mut s = st.borrow_mut();
    let phase = text("phase")?.or_else(|| Some(s.phase.clone()));
    let given = text("id")?;
    // The id names the chart's files: checked here, in the dry pass, not at report time.
    if let Some(id) = given.as_deref().filter(|id| {
        id.is_empty()
            || id.len() > 100
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        return err(format!(
            "chart: id `{}` may hold only letters, digits, _ and - (1 to 100 of them): it names the chart's files",
            tcpx_report::safe::comment(id)
        ));
    }
    let mut id = given.unwrap_or_else(|| slug(&title));
    if id.is_empty() {
        id = "chart".into();
    }
    let base = id.clone();
    let mut n = 2;
    while s.report.charts.iter().any(|c| c.id == id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    s.report.charts.push(ChartSpec {
        id,
        title,
        kind,
        metric,
        x,
        y,
        series,
        experiments,
        phase,
    });
    Ok(())
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    {
        let st = st.clone();
        engine.on_print(move |s| {
            st.borrow_mut().report.notes.push(s.to_string());
        });
    }
    engine.on_debug(|_, _, _| {});
    {
        let st = st.clone();
        engine.register_fn("chart", move |m: Map| chart(&st, &m));
    }
    {
        let st = st.clone();
        engine.register_fn("note", move |t: &str| {
            st.borrow_mut().report.notes.push(t.to_string());
        });
    }

    engine.register_fn("fmt", |x: Dynamic, digits: i64| -> String {
        match as_f64(&x) {
            Some(v) => format!("{v:.*}", digits.clamp(0, 12) as usize),
            None => "n/a".into(),
        }
    });
    engine.register_fn("pct", |x: Dynamic| -> String {
        match as_f64(&x) {
            Some(v) => format!("{:+.1}%", v * 100.0),
            None => "n/a".into(),
        }
    });
}
