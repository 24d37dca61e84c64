//! Charts as PNG and SVG with plotters. Text is laid out and (for PNG) drawn with DejaVu Sans,
//! bundled in `assets/` (Bitstream Vera licence, `assets/DejaVuSans-LICENSE.txt`), so rendering
//! needs no font installed on the machine.

use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::error::{Context, Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::record::{ChartKind, ChartSpec, RunReport, Status, Summary};
use tcpx_model::Knob;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The bundled file is a valid TrueType font; a failure here would be a build defect
            // and shows up as a chart error below (FontUnavailable), not a panic.
            let _ = plotters::style::register_font("sans-serif", style, FONT);
        }
    });
}

/// Where a chart was written.
#[derive(Debug, Clone)]
pub struct ChartFiles {
    pub png: PathBuf,
    pub svg: PathBuf,
    /// Data points drawn (configurations with a value).
    pub points: usize,
}

/// Knobs whose values are byte counts, shown as 256K / 1M.
fn is_size_knob(name: &str) -> bool {
    matches!(name, "chunk" | "sock_buf" | "size" | "sizes")
}

fn human_size(v: f64) -> String {
    let v = v as u64;
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if v >= 1 << shift && v % (1 << shift) == 0 {
            return format!("{}{unit}", v >> shift);
        }
    }
    v.to_string()
}

/// The value of the knob a chart names `knob` (the plan's text): `None` when the configuration
/// has no such knob, or no knob has that name (drawn as `-`, as an unset knob).
fn knob_value<'a>(r: &'a Summary, knob: &str) -> Option<&'a serde_json::Value> {
    r.knobs.get(&Knob::from_name(knob)?)
}

fn knob_number(r: &Summary, knob: &str) -> Option<f64> {
    match knob_value(r, knob)? {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn axis_value_label(knob: &str, r: &Summary) -> (Option<f64>, String) {
    let num = knob_number(r, knob);
    let text = match num {
        Some(v) if is_size_knob(knob) => human_size(v),
        _ => Knob::from_name(knob).map_or_else(|| "-".into(), |k| r.knob_text(k)),
    };
    (num, text)
}

/// Distinct axis values of `knob`, numeric ones in numeric order, others in first-seen order.
fn axis(records: &[Summary], knob: &str) -> Vec<String> {
    let mut vals: Vec<(Option<f64>, String)> = Vec::new();
    for r in records {
        let v = axis_value_label(knob, r);
        if !vals.iter().any(|(_, t)| *t == v.1) {
            vals.push(v);
        }
    }
    if vals.iter().all(|(n, _)| n.is_some()) {
        vals.sort_by(|a, b| a.0.unwrap_or(0.0).total_cmp(&b.0.unwrap_or(0.0)));
    }
    vals.into_iter().map(|(_, t)| t).collect()
}

fn metric_desc(metric: &str) -> String {
    crate::record::METRICS
        .iter()
        .find(|(n, _)| *n == metric)
        .map_or_else(|| metric.to_string(), |(_, d)| d.to_string())
}

/// The axis label of a chart with error bars: the metric, and what the bars really cover (the
/// order-statistic interval of the median, its lowest and highest level among the figures).
fn metric_desc_with_level(metric: &str, recs: &[Summary]) -> String {
    let levels: Vec<f64> = recs
        .iter()
        .filter_map(|r| r.figure(metric))
        .map(|f| f.level * 100.0)
        .collect();
    let lo = levels.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = levels.iter().copied().fold(0.0f64, f64::max);
    let level = if levels.is_empty() {
        return metric_desc(metric);
    } else if (hi - lo).abs() < 0.5 {
        format!("{lo:.0}%")
    } else {
        format!("{lo:.0}-{hi:.0}%")
    };
    format!(
        "{} (median; bars: {level} order-statistic interval)",
        metric_desc(metric)
    )
}

/// `n` segments (plotters' segmented range `0..m` has m+1 of them).
fn segments(
    n: i32,
) -> plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordi32> {
    (0..(n - 1).max(1)).into_segmented()
}

type DrawResult = Result<(), String>;

fn e<E: std::fmt::Debug>(x: E) -> String {
    format!("{x:?}")
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw_bar<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec,
    recs: &[Summary],
    line_rate: Option<f64>,
) -> DrawResult {
    let n = recs.len().max(1) as i32;
    let values: Vec<Option<f64>> = recs.iter().map(|r| r.metric(&spec.metric)).collect();
    // Each bar's line-rate ceiling (its NICs x one NIC's rate), drawn as a mark across the bar.
    let ceilings: Vec<Option<f64>> = recs
        .iter()
        .map(|r| line_rate.and_then(|rate| ceiling(&spec.metric, r, rate)))
        .collect();
    let max = recs
        .iter()
        .filter_map(|r| r.figure(&spec.metric))
        .fold(0.0f64, |a, f| a.max(f.max));
    let max = ceilings.iter().flatten().fold(max, |a, c| a.max(*c));
    let xmax = if max > 0.0 { max * 1.6 } else { 1.0 };
    let longest = recs.iter().map(|r| r.label.len()).max().unwrap_or(4) as u32;
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size((longest * 8 + 20).clamp(60, 360))
        .build_cartesian_2d(0f64..xmax, segments(n))
        .map_err(e)?;
    let labels: Vec<String> = recs.iter().map(|r| r.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n as usize)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels
                .get((n - 1 - *i) as usize)
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc(metric_desc_with_level(&spec.metric, recs))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(values.iter().enumerate().filter_map(|(i, v)| {
            v.map(|v| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(n - 1 - i as i32)),
                        (v, SegmentValue::Exact(n - i as i32)),
                    ],
                    PALETTE[0].filled(),
                );
                bar.set_margin(6, 6, 0, 0);
                bar
            })
        }))
        .map_err(e)?;
    // The interval of the median as an error bar, each repetition as a point.
    for (i, r) in recs.iter().enumerate() {
        let Some(f) = r.figure(&spec.metric) else {
            continue;
        };
        let y = SegmentValue::CenterOf(n - 1 - i as i32);
        chart
            .draw_series(std::iter::once(ErrorBar::new_horizontal(
                y.clone(),
                f.ci95_lo,
                f.median,
                f.ci95_hi,
                BLACK.stroke_width(2),
                10,
            )))
            .map_err(e)?;
        chart
            .draw_series(
                f.reps
                    .iter()
                    .map(|v| Circle::new((*v, y.clone()), 3, PALETTE[1].filled())),
            )
            .map_err(e)?;
    }
    if let Some(rate) = line_rate.filter(|_| ceilings.iter().any(Option::is_some)) {
        let grey = BLACK.mix(0.45);
        chart
            .draw_series(ceilings.iter().enumerate().filter_map(|(i, c)| {
                c.map(|c| {
                    PathElement::new(
                        vec![
                            (c, SegmentValue::Exact(n - 1 - i as i32)),
                            (c, SegmentValue::Exact(n - i as i32)),
                        ],
                        grey.stroke_width(2),
                    )
                })
            }))
            .map_err(e)?
            .label(format!("line-rate ceiling (NICs x {rate} GB/s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(e)?;
    }
    let style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(recs.iter().zip(&values).enumerate().map(|(i, (r, v))| {
            let at = r.figure(&spec.metric).map_or(0.0, |f| f.ci95_hi.max(f.max));
            let text = match (v, r.status) {
                (Some(_), _) => format!(
                    " {}",
                    r.figure(&spec.metric)
                        .map_or_else(String::new, |f| f.text(3))
                ),
                (None, Status::Ok) => " no value".to_string(),
                (None, s) => format!(" {} (see the table)", s.as_str()),
            };
            Text::new(
                text,
                (at, SegmentValue::CenterOf(n - 1 - i as i32)),
                style.clone(),
            )
        }))
        .map_err(e)?;
    Ok(())
}

/// The report setup key holding one NIC's line rate in GB/s (an emulated fabric's cap); line
/// charts of bandwidth then draw the ceiling the NICs in use allow.
pub const LINE_RATE_SETUP_KEY: &str = "nic_line_rate_gbs";

/// The line-rate ceiling of `metric` for `r`: its NICs times one NIC's `rate` (per flow for the
/// per-flow metrics); `None` for metrics that are not bandwidths.
fn ceiling(metric: &str, r: &Summary, rate: f64) -> Option<f64> {
    let nics = knob_number(r, "nics").unwrap_or(1.0).max(1.0);
    let flows = knob_number(r, "flows").unwrap_or(1.0).max(1.0);
    match metric {
        "server_gbs" | "client_gbs" | "recv_gbs" | "send_gbs" | "busbw_gbs" => Some(nics * rate),
        "server_gbs_per_flow" | "client_gbs_per_flow" => Some(nics * rate / flows),
        _ => None,
    }
}

fn draw_line<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec,
    recs: &[Summary],
    line_rate: Option<f64>,
) -> DrawResult {
    let x = spec.x.as_deref().unwrap_or("window");
    let xs = axis(recs, x);
    let series_names: Vec<String> = match &spec.series {
        Some(s) => axis(recs, s),
        None => vec![String::new()],
    };
    let n = xs.len().max(1) as i32;
    let max = recs
        .iter()
        .filter_map(|r| r.figure(&spec.metric))
        .fold(0.0f64, |a, f| a.max(f.max));
    // The ceiling at each x: the first record there with the metric decides.
    let ceilings: Vec<(SegmentValue<i32>, f64)> = match line_rate {
        Some(rate) => xs
            .iter()
            .enumerate()
            .filter_map(|(xi, label)| {
                let r = recs.iter().find(|r| {
                    axis_value_label(x, r).1 == *label && r.figure(&spec.metric).is_some()
                })?;
                Some((
                    SegmentValue::CenterOf(xi as i32),
                    ceiling(&spec.metric, r, rate)?,
                ))
            })
            .collect(),
        None => Vec::new(),
    };
    let max = ceilings.iter().fold(max, |a, (_, c)| a.max(*c));
    let ymax = if max > 0.0 { max * 1.2 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(segments(n), 0f64..ymax)
        .map_err(e)?;
    let xs_for_fmt = xs.clone();
    chart
        .configure_mesh()
        .x_labels(n as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => xs_for_fmt.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc(x)
        .y_desc(metric_desc_with_level(&spec.metric, recs))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for (si, sname) in series_names.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let figs: Vec<(SegmentValue<i32>, &crate::stats::FigureStats)> = recs
            .iter()
            .filter(|r| {
                spec.series
                    .as_ref()
                    .is_none_or(|s| axis_value_label(s, r).1 == *sname)
            })
            .filter_map(|r| {
                let xi = xs.iter().position(|t| *t == axis_value_label(x, r).1)?;
                Some((SegmentValue::CenterOf(xi as i32), r.figure(&spec.metric)?))
            })
            .collect();
        let pts: Vec<(SegmentValue<i32>, f64)> =
            figs.iter().map(|(x, f)| (x.clone(), f.median)).collect();
        chart
            .draw_series(figs.iter().map(|(x, f)| {
                ErrorBar::new_vertical(x.clone(), f.ci95_lo, f.median, f.ci95_hi, color, 10)
            }))
            .map_err(e)?;
        chart
            .draw_series(figs.iter().flat_map(|(x, f)| {
                f.reps
                    .iter()
                    .map(move |v| Circle::new((x.clone(), *v), 3, color.stroke_width(1)))
            }))
            .map_err(e)?;
        let label = match &spec.series {
            Some(s) => format!("{s}={sname}"),
            None => spec.metric.clone(),
        };
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new(p.clone(), 4, color.filled())),
            )
            .map_err(e)?;
    }
    if let (Some(rate), false) = (line_rate, ceilings.is_empty()) {
        let grey = BLACK.mix(0.45);
        chart
            .draw_series(LineSeries::new(ceilings, grey.stroke_width(1)))
            .map_err(e)?
            .label(format!("line-rate ceiling (NICs x {rate} GB/s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    Ok(())
}

fn heat_color(t: f64) -> RGBColor {
    // Light yellow (low) to dark blue (high).
    let t = t.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(lerp(255.0, 8.0), lerp(247.0, 48.0), lerp(188.0, 107.0))
}

fn draw_heatmap<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    spec: &ChartSpec,
    recs: &[Summary],
) -> DrawResult {
    let xk = spec.x.as_deref().unwrap_or("chunk");
    let yk = spec.y.as_deref().unwrap_or("window");
    let xs = axis(recs, xk);
    let ys = axis(recs, yk);
    let (nx, ny) = (xs.len().max(1) as i32, ys.len().max(1) as i32);
    let vals: Vec<f64> = recs.iter().filter_map(|r| r.metric(&spec.metric)).collect();
    let (lo, hi) = vals
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{} ({})", spec.title, spec.metric),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(segments(nx), segments(ny))
        .map_err(e)?;
    let (xf, yf) = (xs.clone(), ys.clone());
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(nx as usize)
        .y_labels(ny as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => xf.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => yf.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc(xk)
        .y_desc(yk)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
    for (xi, xt) in xs.iter().enumerate() {
        for (yi, yt) in ys.iter().enumerate() {
            let cell = recs
                .iter()
                .find(|r| axis_value_label(xk, r).1 == *xt && axis_value_label(yk, r).1 == *yt);
            let v = cell.and_then(|r| r.metric(&spec.metric));
            let color = match v {
                Some(v) if hi > lo => heat_color((v - lo) / (hi - lo)),
                Some(_) => heat_color(0.5),
                None => RGBColor(220, 220, 220),
            };
            let (xi, yi) = (xi as i32, yi as i32);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [
                        (SegmentValue::Exact(xi), SegmentValue::Exact(yi)),
                        (SegmentValue::Exact(xi + 1), SegmentValue::Exact(yi + 1)),
                    ],
                    color.filled(),
                )))
                .map_err(e)?;
            let text = match cell.and_then(|r| r.figure(&spec.metric)) {
                Some(f) if f.n > 1 => {
                    format!("{:.3} [{:.3}, {:.3}]", f.median, f.ci95_lo, f.ci95_hi)
                }
                Some(f) => format!("{:.3}", f.median),
                None => "n/a".to_string(),
            };
            let text_color = match v {
                Some(v) if hi > lo && (v - lo) / (hi - lo) > 0.55 => WHITE,
                _ => BLACK,
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    text,
                    (SegmentValue::CenterOf(xi), SegmentValue::CenterOf(yi)),
                    style.clone().color(&text_color),
                )))
                .map_err(e)?;
        }
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    spec: &ChartSpec,
    recs: &[Summary],
    line_rate: Option<f64>,
) -> DrawResult {
    root.fill(&WHITE).map_err(e)?;
    match spec.kind {
        ChartKind::Bar => draw_bar(&root, spec, recs, line_rate)?,
        ChartKind::Line => draw_line(&root, spec, recs, line_rate)?,
        ChartKind::Heatmap => draw_heatmap(&root, spec, recs)?,
    }
    root.present().map_err(e)
}

/// Draws `spec` over `recs` through `backend`, which writes `tmp` in `format`, and renames `tmp`
/// to `path`.
fn draw_file<DB: DrawingBackend>(
    backend: DB,
    format: &str,
    tmp: &Path,
    path: &Path,
    spec: &ChartSpec,
    recs: &[Summary],
    line_rate: Option<f64>,
) -> Result<()> {
    let drawn = draw(backend.into_drawing_area(), spec, recs, line_rate).map_err(|m| {
        std::io::Error::other(format!("drawing chart `{}` as {format}: {m}", spec.id))
    });
    crate::atomic_file::finish_temp(tmp, path, drawn)
}

/// Chart size in pixels; bar charts grow with the number of bars.
fn size_for(spec: &ChartSpec, n: usize) -> (u32, u32) {
    match spec.kind {
        ChartKind::Bar => (900, (120 + 40 * n as u32).clamp(260, 1400)),
        _ => (900, 500),
    }
}

/// One line of a [`series_svg`] chart: its name and its points `(x, y)`; a `None` y is a gap.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, Option<f64>)>,
}

/// A line chart of several series over a numeric x axis (time, for `tcpx-run watch`'s GB/s per
/// NIC), as SVG text for embedding in a self-contained page. Same font and style as the
/// report's charts; a series' gaps break its line.
pub fn series_svg(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<String> {
    register_font();
    let points = || series.iter().flat_map(|s| s.points.iter());
    let (xlo, xhi) = points()
        .map(|p| p.0)
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    let (xlo, xhi) = if xlo.is_finite() && xhi > xlo {
        (xlo, xhi)
    } else if xlo.is_finite() {
        (xlo - 1.0, xlo + 1.0)
    } else {
        (0.0, 1.0)
    };
    let ymax = points()
        .filter_map(|p| p.1)
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (900, 420)).into_drawing_area();
        let drawn = (|| -> DrawResult {
            root.fill(&WHITE).map_err(e)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 20))
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(70)
                .build_cartesian_2d(xlo..xhi, 0f64..ymax)
                .map_err(e)?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(e)?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                // Each unbroken run of points is one line.
                let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
                for &(x, y) in &s.points {
                    match y.filter(|y| y.is_finite() && x.is_finite()) {
                        Some(y) => runs.last_mut().map(|r| r.push((x, y))).unwrap_or(()),
                        None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
                        None => {}
                    }
                }
                let mut labelled = false;
                for run in runs.into_iter().filter(|r| !r.is_empty()) {
                    let drawn = chart
                        .draw_series(LineSeries::new(run, color.stroke_width(2)))
                        .map_err(e)?;
                    if !labelled {
                        drawn.label(s.name.clone()).legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                        });
                        labelled = true;
                    }
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .draw()
                .map_err(e)?;
            root.present().map_err(e)
        })();
        drawn.map_err(|m| Error::Chart(format!("drawing chart `{title}`: {m}")))?;
    }
    Ok(text)
}

/// Draws `spec` over `report`'s records into `dir/<id>.png` and `dir/<id>.svg`.
pub fn render_chart(report: &RunReport, spec: &ChartSpec, dir: &Path) -> Result<ChartFiles> {
    register_font();
    if !spec
        .id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(Error::Chart(format!(
            "chart id `{}` may hold only letters, digits, _ and -",
            spec.id
        )));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let recs = report.chart_summaries(spec);
    let points = recs
        .iter()
        .filter(|r| r.metric(&spec.metric).is_some())
        .count();
    let size = size_for(spec, recs.len());
    let line_rate = report
        .setup
        .get(LINE_RATE_SETUP_KEY)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0);
    let png = dir.join(format!("{}.png", spec.id));
    let svg = dir.join(format!("{}.svg", spec.id));
    // Drawn under temporary names and renamed: a killed run leaves whole charts.
    // Each temporary file is created by this process first (never through a planted link).
    let png_tmp = crate::atomic_file::reserve_temp(&png)?;
    let png_backend = BitMapBackend::new(&png_tmp, size);
    draw_file(png_backend, "PNG", &png_tmp, &png, spec, &recs, line_rate)?;
    let svg_tmp = crate::atomic_file::reserve_temp(&svg)?;
    let svg_backend = SVGBackend::new(&svg_tmp, size);
    draw_file(svg_backend, "SVG", &svg_tmp, &svg, spec, &recs, line_rate)?;
    Ok(ChartFiles { png, svg, points })
}
