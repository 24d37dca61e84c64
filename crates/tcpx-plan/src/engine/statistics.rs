//! Statistics over results: `best`, `gain`, `gain_ci`, `holds`, `significant`, and the noise
//! level comparisons use (`noise`, `measure_noise`).

use std::collections::BTreeSet;

use rhai::{Array, Dynamic, Engine, Map};
use tcpx_report::sequential::{self, Design, Outcome};
use tcpx_report::stats::{self, Difference, Judgement};
use tcpx_report::{FigureStats, NoiseInfo, Ranking};

use super::check::{finite_threshold, Metric, Op};
use super::figures::{
    figure_of, is_estimate, noise_choice, noise_level, same_experiment, why_same,
};
use super::runs::{current_result, current_results, extend_comparison, run_many, stats_map};
use super::values::{as_f64, err, map_get, RResult};
use super::{Mode, Shared};
use crate::knobs::PlanExperiment;

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[
    ("best", 1),
    ("best", 2),
    ("gain_ci", 2),
    ("gain_ci", 3),
    ("holds", 3),
    ("significant", 1),
    ("noise", 0),
    ("measure_noise", 1),
    ("gain", 2),
    ("gain", 3),
];

/// The method and level of a bootstrap ratio interval, for labels.
const BOOTSTRAP_METHOD: &str =
    "bootstrap percentile interval of the ratio of medians, nominal 95% (not sequential)";

/// The id of the sequential comparison a result map (or an estimate) comes from.
fn comparison_of(m: &Map) -> Option<i64> {
    map_get(m, "comparison").as_int().ok().filter(|i| *i > 0)
}

/// An estimate from `gain_ci` that `op threshold` leaves undecided (its interval straddles the
/// threshold, or it is from before the design's first look) and that comes from a sequential
/// comparison: rounds are added to that comparison until the paired interval decides it or the
/// comparison's budget runs out, and the estimate is made again from every round. Anything
/// else is returned as it is. `what` names the criterion or decision for the report.
pub(super) fn settle(
    st: &Shared,
    x: &Dynamic,
    op: Op,
    threshold: f64,
    what: &str,
) -> RResult<Dynamic> {
    if !is_estimate(x) {
        return Ok(x.clone());
    }
    let e = x.clone().cast::<Map>();
    let decided = map_get(&e, "decisive").as_bool().unwrap_or(true) && {
        let lo = as_f64(&map_get(&e, "lo")).unwrap_or(f64::NAN);
        let hi = as_f64(&map_get(&e, "hi")).unwrap_or(f64::NAN);
        op.judge(lo, hi, threshold) != Judgement::Inconclusive
    };
    let Some(id) = comparison_of(&e) else {
        return Ok(x.clone());
    };
    if decided || map_get(&e, "identical").as_bool().unwrap_or(false) {
        return Ok(x.clone());
    }
    let (a, b) = (
        map_get(&e, "a").into_string().unwrap_or_default(),
        map_get(&e, "b").into_string().unwrap_or_default(),
    );
    let metric = map_get(&e, "metric").into_string().unwrap_or_default();
    let settled = |p: &sequential::Paired| {
        op.judge(p.lo - 1.0, p.hi - 1.0, threshold) != Judgement::Inconclusive
    };
    if extend_comparison(st, id, (&a, &b), &metric, what, &settled)?.is_none() {
        return Ok(x.clone());
    }
    let Some((ma, mb)) = current_results(st, id, &a, &b) else {
        return Ok(x.clone());
    };
    gain_ci(st, &Dynamic::from(ma), &Dynamic::from(mb), &metric)
}

/// The sequential design two result maps share when they come from one sequential comparison
/// with as many rounds each (their repetitions are then pairs, round by round).
fn shared_design(a: &Map, b: &Map, na: usize, nb: usize) -> Option<Design> {
    let (ia, ib) = (comparison_of(a)?, comparison_of(b)?);
    let rounds = map_get(a, "max_rounds").as_int().ok()?;
    (ia == ib && na == nb && rounds > 0).then(|| Design::new(rounds as usize))
}

/// `gain_ci(a, b)`: the relative change of `b` over `a` (ratio of medians - 1) with its interval,
/// judged against the noise level; `()` when either did not run.
/// A ratio as a gain and its interval, in percent: `+12.0% [+3.1%, +20.4%]`.
fn gain_text(r: &stats::Ratio) -> String {
    format!(
        "{:+.1}% [{:+.1}%, {:+.1}%]",
        (r.ratio - 1.0) * 100.0,
        (r.lo - 1.0) * 100.0,
        (r.hi - 1.0) * 100.0
    )
}

fn gain_ci(st: &Shared, a: &Dynamic, b: &Dynamic, metric: &str) -> RResult<Dynamic> {
    let metric = Metric::parse(metric)
        .map(Metric::name)
        .map_or_else(|| err(format!("gain_ci: unknown metric `{metric}`")), Ok)?;
    if !a.is_map() || !b.is_map() {
        return Ok(Dynamic::UNIT);
    }
    let (mut a, mut b) = (a.clone().cast::<Map>(), b.clone().cast::<Map>());
    // Two configurations of one sequential comparison: with every round it has so far (a
    // criterion or decision may have added some since these maps were made).
    if let Some(id) = comparison_of(&a).filter(|i| Some(*i) == comparison_of(&b)) {
        let name = |m: &Map| map_get(m, "name").into_string().unwrap_or_default();
        if let Some((ca, cb)) = current_results(st, id, &name(&a), &name(&b)) {
            (a, b) = (ca, cb);
        }
    }
    let ok = |m: &Map| map_get(m, "ok").as_bool().unwrap_or(false);
    if !ok(&a) || !ok(&b) {
        return Ok(Dynamic::UNIT);
    }
    let (Some(fa), Some(fb)) = (figure_of(&a, metric), figure_of(&b, metric)) else {
        return Ok(Dynamic::UNIT);
    };
    let name = |m: &Map| map_get(m, "name").into_string().unwrap_or_default();
    // The same result on both sides (the best is the baseline): the same measurements, a gain
    // of exactly 0, not two samples to resample.
    let noise = noise_level(st);
    let design = shared_design(&a, &b, fa.n, fb.n);
    let mut level = stats::LEVEL;
    let mut decisive = true;
    let mut method = BOOTSTRAP_METHOD.to_string();
    let mut paired_outcome = None;
    let r = if name(&a) == name(&b) {
        stats::Ratio {
            ratio: 1.0,
            lo: 1.0,
            hi: 1.0,
            n_a: fa.n,
            n_b: fb.n,
        }
    } else if let Some(d) = design {
        let Some(p) = sequential::paired(&fa.reps, &fb.reps, &d) else {
            return Ok(Dynamic::UNIT);
        };
        level = p.level;
        decisive = p.decisive;
        paired_outcome = Some(p.outcome(noise));
        method = if p.decisive {
            d.method()
        } else {
            format!(
                "paired sign-test interval of {} rounds, covering {:.0}% on its own: before the sequential design's first look (round {}), so it decides nothing",
                p.n,
                p.level * 100.0,
                d.first_look
            )
        };
        stats::Ratio {
            ratio: p.ratio,
            lo: p.lo,
            hi: p.hi,
            n_a: p.n,
            n_b: p.n,
        }
    } else {
        match stats::ratio_of_medians(&fa.reps, &fb.reps) {
            Some(r) => r,
            None => return Ok(Dynamic::UNIT),
        }
    };
    let label = |m: &Map| map_get(m, "label").into_string().unwrap_or_default();
    let mut m = Map::new();
    m.insert("kind".into(), Dynamic::from("gain".to_string()));
    m.insert("metric".into(), Dynamic::from(metric.to_string()));
    m.insert("value".into(), Dynamic::from(r.ratio - 1.0));
    m.insert("lo".into(), Dynamic::from(r.lo - 1.0));
    m.insert("hi".into(), Dynamic::from(r.hi - 1.0));
    m.insert("n".into(), Dynamic::from(r.n_a.min(r.n_b) as i64));
    m.insert("noise".into(), Dynamic::from(noise));
    m.insert("level".into(), Dynamic::from(level));
    m.insert("method".into(), Dynamic::from(method.clone()));
    m.insert("decisive".into(), Dynamic::from(decisive));
    if design.is_some() {
        m.insert(
            "comparison".into(),
            Dynamic::from(comparison_of(&a).unwrap_or(0)),
        );
    }
    m.insert("a".into(), Dynamic::from(name(&a)));
    m.insert("b".into(), Dynamic::from(name(&b)));
    m.insert("a_stats".into(), stats_map(&fa));
    m.insert("b_stats".into(), stats_map(&fb));
    let same = same_experiment(&a, &b);
    m.insert("identical".into(), Dynamic::from(same.is_some()));
    let (significant, why) = match &same {
        Some(knobs) => (
            false,
            format!(
                "{} and {} are the same experiment here: {}",
                label(&a),
                label(&b),
                why_same(&a, &b, knobs)
            ),
        ),
        None if !decisive => (false, format!("{}: undecided ({method})", gain_text(&r))),
        None => match paired_outcome.map_or_else(
            || r.difference(noise),
            |o| match o {
                Outcome::Higher => Difference::Higher,
                Outcome::Lower => Difference::Lower,
                _ => Difference::Tied,
            },
        ) {
            Difference::Tied => (
                false,
                format!("{}: within noise ({:.1}%)", gain_text(&r), noise * 100.0),
            ),
            _ => (
                true,
                format!("{}: beyond noise ({:.1}%)", gain_text(&r), noise * 100.0),
            ),
        },
    };
    m.insert("significant".into(), Dynamic::from(significant));
    m.insert("why".into(), Dynamic::from(why));
    Ok(Dynamic::from(m))
}

/// `holds(x, op, threshold)`: true when the whole interval of `x` (an estimate from `gain_ci`)
/// satisfies it, false when none of it does, () when it is inconclusive or `x` is (); a plain
/// number is compared as usual.
fn holds(st: &Shared, x: &Dynamic, op: Op, threshold: f64) -> RResult<Dynamic> {
    if x.is_unit() {
        return Ok(Dynamic::UNIT);
    }
    let x = &settle(
        st,
        x,
        op,
        threshold,
        &format!("holds(gain {} {threshold})", op.symbol()),
    )?;
    if is_estimate(x) {
        let e = x.clone().cast::<Map>();
        if map_get(&e, "identical").as_bool().unwrap_or(false)
            || !map_get(&e, "decisive").as_bool().unwrap_or(true)
        {
            return Ok(Dynamic::UNIT);
        }
        let lo = as_f64(&map_get(&e, "lo")).unwrap_or(f64::NAN);
        let hi = as_f64(&map_get(&e, "hi")).unwrap_or(f64::NAN);
        return Ok(match op.judge(lo, hi, threshold) {
            Judgement::Pass => Dynamic::from(true),
            Judgement::Fail => Dynamic::from(false),
            Judgement::Inconclusive => Dynamic::UNIT,
        });
    }
    if let Some(v) = as_f64(x) {
        return Ok(Dynamic::from(op.holds(v, threshold)));
    }
    err(format!(
        "holds: give an estimate from gain_ci, a number or (), got {}",
        x.type_name()
    ))
}

/// `best(results)`: the result with the best median, with `tied` (labels of those whose
/// interval reaches within noise of it), `identical` (the same experiment here: they differ
/// only in knobs not applied), `ranked` (false when all were the same experiment) and
/// `clear_winner`; recorded in the report's rankings.
fn best_of(st: &Shared, results: &Array, metric: &str) -> RResult<Dynamic> {
    let metric = Metric::parse(metric)
        .map(Metric::name)
        .map_or_else(|| err(format!("best: unknown metric `{metric}`")), Ok)?;
    let lower_is_better = metric.ends_with("_us") || metric == "wrong_bytes";
    let mut cands: Vec<(Map, FigureStats)> = Vec::new();
    for r in results {
        if r.is_unit() {
            continue;
        }
        if !r.is_map() {
            return err("best: give an array of results (from run, sweep, matrix or compare)");
        }
        let m = current_result(st, r.clone().cast::<Map>());
        if !map_get(&m, "ok").as_bool().unwrap_or(false) {
            continue;
        }
        if let Some(f) = figure_of(&m, metric) {
            cands.push((m, f));
        }
    }
    let Some(top_i) = (0..cands.len()).max_by(|&i, &j| {
        let (a, b) = (cands[i].1.median, cands[j].1.median);
        // Ties in the median keep the first.
        let o = if lower_is_better {
            b.total_cmp(&a)
        } else {
            a.total_cmp(&b)
        };
        o.then(j.cmp(&i))
    }) else {
        return Ok(Dynamic::UNIT);
    };
    let noise = noise_level(st);
    let (top, top_f) = cands[top_i].clone();
    let label = |m: &Map| map_get(m, "label").into_string().unwrap_or_default();
    let mut tied = Vec::new();
    let mut identical = Vec::new();
    let mut same_why = Vec::new();
    let mut methods: BTreeSet<String> = BTreeSet::new();
    for (i, (m, f)) in cands.iter().enumerate() {
        if i == top_i {
            continue;
        }
        if let Some(knobs) = same_experiment(&top, m) {
            identical.push(label(m));
            same_why.push(why_same(&top, m, &knobs));
            continue;
        }
        let d = match shared_design(&top, m, top_f.n, f.n) {
            Some(design) => {
                methods.insert(design.method());
                sequential::paired(&top_f.reps, &f.reps, &design).map(|p| match p.outcome(noise) {
                    Outcome::Higher => Difference::Higher,
                    Outcome::Lower => Difference::Lower,
                    _ => Difference::Tied,
                })
            }
            None => {
                methods.insert(BOOTSTRAP_METHOD.to_string());
                stats::ratio_of_medians(&top_f.reps, &f.reps).map(|r| r.difference(noise))
            }
        };
        let worse = match d {
            Some(d) if lower_is_better => d == Difference::Higher,
            Some(d) => d == Difference::Lower,
            None => false,
        };
        if !worse {
            tied.push(label(m));
        }
    }
    let ranked = !(cands.len() > 1 && identical.len() == cands.len() - 1);
    let clear = cands.len() > 1 && tied.is_empty() && identical.is_empty();
    same_why.dedup();
    let figure = format!("{metric} {}", top_f.text(3));
    let text = if !ranked {
        format!(
            "not ranked: {} and {} are the same experiment here ({})",
            label(&top),
            identical.join(", "),
            same_why.join("; ")
        )
    } else {
        let mut t = format!("best {figure}: {}", label(&top));
        if clear {
            t.push_str(&format!(
                ", ahead of every other configuration beyond noise ({:.1}%)",
                noise * 100.0
            ));
        } else if !tied.is_empty() {
            t.push_str(&format!(
                ", tied within noise ({:.1}%) with {}: no winner among them",
                noise * 100.0,
                tied.join(", ")
            ));
        }
        if !identical.is_empty() {
            t.push_str(&format!(
                "; the same experiment here as {} ({})",
                identical.join(", "),
                same_why.join("; ")
            ));
        }
        t
    };
    {
        let mut s = st.borrow_mut();
        let phase = s.phase.clone();
        s.report.rankings.push(Ranking {
            phase,
            metric: metric.to_string(),
            best: label(&top),
            tied: tied.clone(),
            identical: identical.clone(),
            ranked,
            noise,
            text: text.clone(),
            candidates: cands.iter().map(|(m, _)| label(m)).collect(),
            method: methods.into_iter().collect::<Vec<_>>().join("; "),
        });
    }
    let mut out = top;
    let arr = |v: &[String]| Dynamic::from(v.iter().cloned().map(Dynamic::from).collect::<Array>());
    out.insert("tied".into(), arr(&tied));
    out.insert("identical".into(), arr(&identical));
    out.insert("ranked".into(), Dynamic::from(ranked));
    out.insert("clear_winner".into(), Dynamic::from(clear));
    out.insert("ranking".into(), Dynamic::from(text));
    Ok(Dynamic::from(out))
}

/// Rounds of an A/A noise measurement, at least.
const NOISE_ROUNDS: u32 = sequential::NOISE_ROUNDS as u32;

/// `measure_noise(exp)`: runs `exp` twice as an A/A comparison (repetitions interleaved) and
/// takes the spread of the ratio of the two medians (the farther end of its interval from 1)
/// as the measured noise; comparisons then use it, never less than the target set's `noise`.
fn measure_noise(st: &Shared, exp: PlanExperiment) -> RResult<f64> {
    let name = exp.name();
    let label = exp.label();
    // At least NOISE_ROUNDS (20): the sign-test interval then reaches 95 % with the five most
    // extreme ratios on each side left out, so a few disturbed rounds do not set the band.
    let rounds = exp.repeat().max(NOISE_ROUNDS);
    let arm = |i: u32| {
        let mut e = exp.clone();
        e.repeat = rounds;
        e.rename(format!("{name}-aa{i}"));
        e.relabel(format!("{label} (A/A run {i})"));
        e
    };
    let rs = run_many(st, vec![arm(1), arm(2)], false)?;
    // Recorded so that no A/A run is ever recommended as a configuration (tuned.env).
    if let Some(n) = st.borrow_mut().report.noise.as_mut() {
        n.runs.extend((1..=2).map(|i| format!("{name}-aa{i}")));
    }
    let fig = |m: &Map| {
        map_get(m, "ok")
            .as_bool()
            .unwrap_or(false)
            .then(|| figure_of(m, "server_gbs"))
            .flatten()
    };
    let (Some(a), Some(b)) = (fig(&rs[0]), fig(&rs[1])) else {
        if st.borrow().mode == Mode::Real {
            st.borrow_mut().report.notes.push(format!(
                "noise: the A/A runs of {label} did not both run; the target set's floor is used"
            ));
        }
        return Ok(noise_level(st));
    };
    // The A/A runs are pairs, round by round: the sign-test interval of their ratios at 95 %.
    let single = Design {
        max_rounds: a.n.max(1),
        looks: 1,
        first_look: 6.min(a.n.max(1)),
        per_look_level: stats::LEVEL,
    };
    let Some(r) = sequential::paired(&a.reps, &b.reps, &single) else {
        return Ok(noise_level(st));
    };
    let spread = (r.hi - 1.0).max(1.0 - r.lo).max(0.0);
    {
        let mut s = st.borrow_mut();
        s.noise_measured = Some(s.noise_measured.map_or(spread, |m| m.max(spread)));
    }
    let (used, source) = noise_choice(st);
    let mut s = st.borrow_mut();
    let floor = s.targets.noise_floor().map_or(0.0, |(f, _)| f);
    let runs = s.report.noise.take().map(|n| n.runs).unwrap_or_default();
    s.report.noise = Some(NoiseInfo {
        floor,
        runs,
        measured: s.noise_measured,
        used,
        source,
        detail: format!(
            "A/A: {label} twice, {} rounds interleaved: median ratio {:.3} [{:.3}, {:.3}] ({:.0}% sign-test interval of the paired ratios); the noise band is its farther end from 1",
            r.n, r.ratio, r.lo, r.hi, r.level * 100.0
        ),
    });
    Ok(used)
}

fn gain(a: &Dynamic, b: &Dynamic, metric: &str) -> RResult<Dynamic> {
    let metric = Metric::parse(metric)
        .map(Metric::name)
        .map_or_else(|| err(format!("gain: unknown metric `{metric}`")), Ok)?;
    let get = |d: &Dynamic| -> Option<f64> {
        if d.is_map() {
            as_f64(&map_get(&d.clone().cast::<Map>(), metric))
        } else {
            None
        }
    };
    Ok(match (get(a), get(b)) {
        (Some(x), Some(y)) if x > 0.0 => Dynamic::from(y / x - 1.0),
        _ => Dynamic::UNIT,
    })
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    {
        let st = st.clone();
        engine.register_fn("best", move |r: Array| best_of(&st, &r, "server_gbs"));
    }
    {
        let st = st.clone();
        engine.register_fn("best", move |r: Array, metric: &str| {
            best_of(&st, &r, metric)
        });
    }
    {
        let st = st.clone();
        engine.register_fn("gain_ci", move |a: Dynamic, b: Dynamic| {
            gain_ci(&st, &a, &b, "server_gbs")
        });
    }
    {
        let st = st.clone();
        engine.register_fn("gain_ci", move |a: Dynamic, b: Dynamic, metric: &str| {
            gain_ci(&st, &a, &b, metric)
        });
    }
    {
        let st = st.clone();
        engine.register_fn(
            "holds",
            move |x: Dynamic, op: &str, t: Dynamic| -> RResult<Dynamic> {
                let t =
                    as_f64(&t).map_or_else(|| err("holds: the threshold must be a number"), Ok)?;
                let t = finite_threshold("holds", t).map_or_else(err, Ok)?;
                let op = Op::parse(op).map_or_else(|e| err(format!("holds: {e}")), Ok)?;
                holds(&st, &x, op, t)
            },
        );
    }
    engine.register_fn("significant", |x: Dynamic| -> RResult<Dynamic> {
        if x.is_unit() {
            return Ok(Dynamic::UNIT);
        }
        if !is_estimate(&x) {
            return err(format!(
                "significant: give an estimate from gain_ci or (), got {}",
                x.type_name()
            ));
        }
        Ok(map_get(&x.cast::<Map>(), "significant"))
    });
    {
        let st = st.clone();
        engine.register_fn("noise", move || noise_level(&st));
    }
    {
        let st = st.clone();
        engine.register_fn("measure_noise", move |e: PlanExperiment| -> RResult<f64> {
            measure_noise(&st, e)
        });
    }
    engine.register_fn("gain", |a: Dynamic, b: Dynamic| gain(&a, &b, "server_gbs"));
    engine.register_fn("gain", |a: Dynamic, b: Dynamic, metric: &str| {
        gain(&a, &b, metric)
    });
}
