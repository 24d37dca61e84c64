//! Criteria and decisions: what a plan concludes. A criterion on a result's metric is a typed
//! [`Check`] (metric, comparison, threshold, unit), parsed once where it enters the API: from the
//! text of `criterion("server > 3.5 GB/s", r)`, or built with `check(metric, op, threshold)`.
//! Comparisons (`criterion(text, value, op, threshold)`, `holds`) are an [`Op`] from there on.

use rhai::{Dynamic, Engine, Map};
use tcpx_report::stats::{self, Judgement};
use tcpx_report::{CriterionResult, DecisionRecord, NamedFigure, Verdict};

use super::check::{finite_threshold, Check, Op};
use super::figures::{figure_from_stats_map, figure_of, is_estimate};
use super::statistics::settle;
use super::values::{as_f64, err, map_get, text_of, RResult};
use super::Shared;

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[
    ("check", 1),
    ("check", 3),
    ("to_string", 1),
    ("to_debug", 1),
    ("get$metric", 1),
    ("get$op", 1),
    ("get$threshold", 1),
    ("criterion", 2),
    ("criterion", 2),
    ("criterion", 3),
    ("criterion", 4),
    ("not_evaluated", 2),
    ("decision", 5),
];

/// A number given as a threshold: finite, else refused naming `text`.
pub(super) fn threshold_of(text: &str, d: &Dynamic) -> RResult<f64> {
    let t = as_f64(d).map_or_else(
        || {
            err(format!(
                "criterion `{text}`: the threshold must be a number"
            ))
        },
        Ok,
    )?;
    finite_threshold(text, t).map_or_else(err, Ok)
}

/// Records `c` in the current phase; whether it passed.
pub(super) fn push_criterion(st: &Shared, c: CriterionResult) -> bool {
    let pass = c.verdict == Verdict::Pass;
    let mut s = st.borrow_mut();
    let mut c = c;
    c.phase = s.phase.clone();
    s.report.criteria.push(c);
    pass
}

fn verdict_of(j: Judgement) -> Verdict {
    match j {
        Judgement::Pass => Verdict::Pass,
        Judgement::Fail => Verdict::Fail,
        Judgement::Inconclusive => Verdict::Inconclusive,
    }
}

/// What an interval criterion judges: an estimate with its interval and how many repetitions
/// gave it.
struct Interval {
    estimate: f64,
    lo: f64,
    hi: f64,
    n: usize,
}

/// A criterion over an interval: three-valued, with how many repetitions would settle it.
fn interval_criterion(
    text: &str,
    x: Interval,
    op: Op,
    threshold: f64,
    detail: String,
    figures: Vec<NamedFigure>,
) -> CriterionResult {
    let j = op.judge(x.lo, x.hi, threshold);
    CriterionResult {
        actual: Some(x.estimate),
        threshold: Some(threshold),
        ci95_lo: Some(x.lo),
        ci95_hi: Some(x.hi),
        n: Some(x.n),
        reps_to_settle: (j == Judgement::Inconclusive)
            .then(|| stats::reps_to_settle(x.estimate, x.lo, x.hi, x.n, threshold))
            .flatten(),
        figures,
        ..CriterionResult::plain(text, verdict_of(j), detail)
    }
}

/// `check` on result map `r`, recorded as `text`; not evaluated when `r` did not run.
fn criterion_on_result(text: &str, check: &Check, r: &Map) -> CriterionResult {
    let metric = check.metric.name();
    let name = text_of(r, "name");
    let status = text_of(r, "status");
    match figure_of(r, metric) {
        Some(f) if status == "ok" => interval_criterion(
            text,
            Interval {
                estimate: f.median,
                lo: f.ci95_lo,
                hi: f.ci95_hi,
                n: f.n,
            },
            check.op,
            check.threshold,
            format!(
                "{metric} of {name}, median of {} repetitions, order-statistic interval covering {:.0}%",
                f.n,
                f.level * 100.0
            ),
            vec![NamedFigure {
                name: format!("{metric} of {name}"),
                stats: f,
            }],
        ),
        _ => CriterionResult {
            threshold: Some(check.threshold),
            ..CriterionResult::plain(
                text,
                Verdict::NotEvaluated,
                format!(
                    "{name} is {status}{}",
                    map_get(r, "reason")
                        .into_string()
                        .map(|x| format!(": {x}"))
                        .unwrap_or_default()
                ),
            )
        },
    }
}

/// A typed check on `what` (a result map or `()`), recorded as `text`.
fn criterion_on(text: &str, check: &Check, what: Dynamic) -> RResult<CriterionResult> {
    if what.is_map() {
        return Ok(criterion_on_result(text, check, &what.cast::<Map>()));
    }
    if what.is_unit() {
        return Ok(CriterionResult {
            threshold: Some(check.threshold),
            ..CriterionResult::plain(
                text,
                Verdict::NotEvaluated,
                "no value: what it needs did not run here".into(),
            )
        });
    }
    err(format!(
        "criterion `{text}`: give a result map or (), got {}",
        what.type_name()
    ))
}

/// A criterion on an estimate from `gain_ci`: three-valued on its interval; not evaluated when
/// the two configurations are the same experiment here.
fn criterion_on_estimate(text: &str, e: &Map, op: Op, threshold: f64) -> CriterionResult {
    let why = text_of(e, "why");
    if map_get(e, "identical").as_bool().unwrap_or(false) {
        return CriterionResult {
            threshold: Some(threshold),
            ..CriterionResult::plain(text, Verdict::NotEvaluated, why)
        };
    }
    if !map_get(e, "decisive").as_bool().unwrap_or(true) {
        let f = |k: &str| as_f64(&map_get(e, k));
        return CriterionResult {
            actual: f("value"),
            threshold: Some(threshold),
            ci95_lo: f("lo"),
            ci95_hi: f("hi"),
            n: f("n").map(|n| n as usize),
            ..CriterionResult::plain(text, Verdict::Inconclusive, why)
        };
    }
    let f = |k: &str| as_f64(&map_get(e, k)).unwrap_or(f64::NAN);
    let metric = text_of(e, "metric");
    let mut figures = Vec::new();
    for (side, key) in [("a", "a_stats"), ("b", "b_stats")] {
        if let Some(stats) = figure_from_stats_map(&map_get(e, key)) {
            figures.push(NamedFigure {
                name: format!("{metric} of {}", text_of(e, side)),
                stats,
            });
        }
    }
    interval_criterion(
        text,
        Interval {
            estimate: f("value"),
            lo: f("lo"),
            hi: f("hi"),
            n: as_f64(&map_get(e, "n")).unwrap_or(0.0) as usize,
        },
        op,
        threshold,
        format!(
            "gain of {} over {}: {why}; interval: {}",
            text_of(e, "b"),
            text_of(e, "a"),
            text_of(e, "method")
        ),
        figures,
    )
}

/// `criterion(text, value, op, threshold)`: an estimate (three-valued), a number (two-valued),
/// or `()` (not evaluated).
fn criterion_on_value(
    text: &str,
    actual: Dynamic,
    op: Op,
    threshold: f64,
) -> RResult<CriterionResult> {
    Ok(match as_f64(&actual) {
        // 0.0 / 0.0 and the like: not a value to judge.
        Some(a) if !a.is_finite() => CriterionResult {
            threshold: Some(threshold),
            ..CriterionResult::plain(
                text,
                Verdict::NotEvaluated,
                format!("the value is {a}, not a finite number: nothing to judge"),
            )
        },
        Some(a) => CriterionResult {
            actual: Some(a),
            threshold: Some(threshold),
            ..CriterionResult::plain(
                text,
                if op.holds(a, threshold) {
                    Verdict::Pass
                } else {
                    Verdict::Fail
                },
                String::new(),
            )
        },
        None if is_estimate(&actual) => {
            criterion_on_estimate(text, &actual.cast::<Map>(), op, threshold)
        }
        None if actual.is_unit() => CriterionResult {
            threshold: Some(threshold),
            ..CriterionResult::plain(
                text,
                Verdict::NotEvaluated,
                "no value: what it needs did not run here".into(),
            )
        },
        None => {
            return err(format!(
                "criterion `{text}`: the value must be a number or (), got {}",
                actual.type_name()
            ))
        }
    })
}

/// A condition: `true`/`false`, or `()` for not evaluated.
fn criterion_on_condition(text: &str, what: &Dynamic) -> RResult<CriterionResult> {
    let (verdict, detail) = if let Ok(b) = what.as_bool() {
        (if b { Verdict::Pass } else { Verdict::Fail }, String::new())
    } else if what.is_unit() {
        (
            Verdict::NotEvaluated,
            "no value: what it needs did not run here".to_string(),
        )
    } else {
        return err(format!(
            "criterion `{text}`: give a result map, true/false, or (); got {}",
            what.type_name()
        ));
    };
    Ok(CriterionResult::plain(text, verdict, detail))
}

/// `decision(name, question, answer, yes, no)`: the branch taken, recorded.
fn decision(
    st: &Shared,
    name: &str,
    question: &str,
    answer: &Dynamic,
    yes: &str,
    no: &str,
) -> RResult<bool> {
    let a = if answer.is_unit() {
        None
    } else {
        Some(answer.as_bool().map_or_else(
            |t| {
                err(format!(
                    "decision `{name}`: the answer must be true, false or (), got {t}"
                ))
            },
            Ok,
        )?)
    };
    let taken = a.unwrap_or(false);
    let mut s = st.borrow_mut();
    let phase = s.phase.clone();
    s.report.decisions.push(DecisionRecord {
        phase,
        name: name.into(),
        question: question.into(),
        answer: a,
        branch_taken: if taken { yes } else { no }.into(),
        branch_not_taken: if taken { no } else { yes }.into(),
        detail: if a.is_none() {
            format!("UNANSWERED: what it needs was not measured here or its interval was inconclusive; the plan follows its default branch: {no}")
        } else {
            String::new()
        },
    });
    Ok(taken)
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    engine.register_type_with_name::<Check>("Check");
    engine.register_fn("check", |text: &str| -> RResult<Check> {
        Check::parse(text).map_or_else(err, Ok)
    });
    engine.register_fn(
        "check",
        |metric: &str, op: &str, threshold: Dynamic| -> RResult<Check> {
            let t = as_f64(&threshold)
                .map_or_else(|| err("check: the threshold must be a number"), Ok)?;
            Check::new(metric, op, t).map_or_else(err, Ok)
        },
    );
    engine.register_fn("to_string", |c: &mut Check| c.to_string());
    engine.register_fn("to_debug", |c: &mut Check| format!("check({c})"));
    engine.register_get("metric", |c: &mut Check| c.metric.name().to_string());
    engine.register_get("op", |c: &mut Check| c.op.symbol().to_string());
    engine.register_get("threshold", |c: &mut Check| c.threshold);
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |text: &str, what: Dynamic| -> RResult<bool> {
                let c = if what.is_map() {
                    let check = Check::parse(text).map_or_else(err, Ok)?;
                    criterion_on_result(text, &check, &what.cast::<Map>())
                } else {
                    criterion_on_condition(text, &what)?
                };
                Ok(push_criterion(&st, c))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |check: Check, what: Dynamic| -> RResult<bool> {
                let c = criterion_on(&check.to_string(), &check, what)?;
                Ok(push_criterion(&st, c))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |text: &str, check: Check, what: Dynamic| -> RResult<bool> {
                let c = criterion_on(text, &check, what)?;
                Ok(push_criterion(&st, c))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |text: &str, actual: Dynamic, op: &str, threshold: Dynamic| -> RResult<bool> {
                let t = threshold_of(text, &threshold)?;
                let op = Op::parse(op).map_or_else(err, Ok)?;
                let actual = settle(&st, &actual, op, t, &format!("criterion `{text}`"))?;
                let c = criterion_on_value(text, actual, op, t)?;
                Ok(push_criterion(&st, c))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn("not_evaluated", move |text: &str, why: &str| {
            push_criterion(
                &st,
                CriterionResult::plain(text, Verdict::NotEvaluated, why.into()),
            );
        });
    }
    {
        let st = st.clone();
        engine.register_fn(
            "decision",
            move |name: &str,
                  question: &str,
                  answer: Dynamic,
                  yes: &str,
                  no: &str|
                  -> RResult<bool> { decision(&st, name, question, &answer, yes, no) },
        );
    }
}
