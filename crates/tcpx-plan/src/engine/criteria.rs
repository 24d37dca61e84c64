//! Criteria and decisions: what a plan concludes. A criterion on a result's metric is a typed
//! [`Check`] (metric, comparison, threshold, unit), parsed once where it enters the API: from the
//! text of `criterion("server > 3.5 GB/s", r)`, or built with `check(metric, op, threshold)`.
//! Comparisons (`criterion(text, value, op, threshold)`, `holds`) are an [`Op`] from there on.

use std::fmt;

use rhai::{Dynamic, Engine, Map};
use tcpx_report::stats::{self, Judgement};
use tcpx_report::{CriterionResult, DecisionRecord, NamedFigure, Verdict, METRICS};

use super::statistics::{figure_from_stats_map, figure_of, is_estimate, settle};
use super::values::{as_f64, err, map_get, text_of, RResult};
use super::Shared;
use crate::knobs::suggest;

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

/// A comparison: of a criterion, `holds` or a [`Check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Greater,
    AtLeast,
    Less,
    AtMost,
    Equal,
}

impl Op {
    /// `>`, `>=`, `<`, `<=` or `==`.
    pub fn parse(text: &str) -> Result<Op, String> {
        Ok(match text {
            ">" => Op::Greater,
            ">=" => Op::AtLeast,
            "<" => Op::Less,
            "<=" => Op::AtMost,
            "==" => Op::Equal,
            _ => return Err(format!("comparison `{text}`: use >, >=, <, <= or ==")),
        })
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Op::Greater => ">",
            Op::AtLeast => ">=",
            Op::Less => "<",
            Op::AtMost => "<=",
            Op::Equal => "==",
        }
    }

    /// Whether `actual op threshold`; `==` allows a relative 1e-9.
    pub fn holds(self, actual: f64, threshold: f64) -> bool {
        match self {
            Op::Greater => actual > threshold,
            Op::AtLeast => actual >= threshold,
            Op::Less => actual < threshold,
            Op::AtMost => actual <= threshold,
            Op::Equal => (actual - threshold).abs() <= 1e-9 * threshold.abs().max(1.0),
        }
    }

    /// Pass when the whole interval `[lo, hi]` satisfies it, fail when none of it does.
    pub fn judge(self, lo: f64, hi: f64, threshold: f64) -> Judgement {
        // `stats::judge` knows every symbol this type has.
        stats::judge(lo, hi, self.symbol(), threshold).unwrap_or(Judgement::Inconclusive)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// A metric of a result: a name of [`METRICS`], reached also by its short names (`server`,
/// `client`, `per_gpu`, `p99`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric(&'static str);

impl Metric {
    pub fn parse(word: &str) -> Option<Metric> {
        let alias = match word {
            "server" | "recv" => "server_gbs",
            "client" | "send" => "client_gbs",
            "busbw" => "busbw_gbs",
            "server_per_gpu" | "per_gpu" => "server_gbs_per_flow",
            "client_per_gpu" => "client_gbs_per_flow",
            "p50" => "p50_us",
            "p99" => "p99_us",
            other => other,
        };
        METRICS
            .iter()
            .map(|(n, _)| *n)
            .find(|n| *n == alias)
            .map(Metric)
    }

    /// [`Metric::parse`], or a message naming the nearest metric and all of them.
    pub fn parse_or_explain(word: &str) -> Result<Metric, String> {
        Metric::parse(word).ok_or_else(|| {
            let all: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
            let hint = suggest(word, all.iter().copied().chain(["server", "client"]))
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            format!(
                "unknown metric `{word}`{hint}; metrics: server, client, {}",
                all.join(", ")
            )
        })
    }

    /// The name in [`METRICS`] (and in result maps).
    pub fn name(self) -> &'static str {
        self.0
    }

    /// The unit its values are in.
    pub fn unit(self) -> Option<Unit> {
        if self.0.contains("_gbs") {
            Some(Unit::GigabytesPerSecond)
        } else if self.0.ends_with("_us") {
            Some(Unit::Microseconds)
        } else if self.0 == "wrong_bytes" {
            Some(Unit::Bytes)
        } else {
            None
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The unit a criterion may name after its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    GigabytesPerSecond,
    Microseconds,
    Bytes,
}

impl Unit {
    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text {
            "GB/s" => Unit::GigabytesPerSecond,
            "us" => Unit::Microseconds,
            "bytes" => Unit::Bytes,
            _ => return None,
        })
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Unit::GigabytesPerSecond => "GB/s",
            Unit::Microseconds => "us",
            Unit::Bytes => "bytes",
        }
    }
}

/// `<metric> <op> <number> [unit]`: a criterion on one metric of a result, judged on the
/// interval of its median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Check {
    pub metric: Metric,
    pub op: Op,
    /// Always a finite number.
    pub threshold: f64,
    /// As written; when given, it fits the metric.
    pub unit: Option<Unit>,
}

impl Check {
    /// Reads the criterion text `server > 3.5 GB/s`; errors name the text.
    pub fn parse(text: &str) -> Result<Check, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let usage = || {
            format!(
                "criterion `{text}` is not `<metric> <op> <number> [unit]` (e.g. \"server > 3.5 GB/s\"); for other checks pass a condition: criterion(text, true_or_false)"
            )
        };
        if words.len() < 3 || words.len() > 4 {
            return Err(usage());
        }
        let metric =
            Metric::parse_or_explain(words[0]).map_err(|e| format!("criterion `{text}`: {e}"))?;
        let threshold: f64 = words[2].parse().map_err(|_| usage())?;
        let threshold = finite_threshold(text, threshold)?;
        let op = Op::parse(words[1]).map_err(|e| format!("criterion `{text}`: {e}"))?;
        let unit = match words.get(3) {
            None => None,
            Some(u) => Some(
                Unit::parse(u)
                    .filter(|unit| metric.unit() == Some(*unit))
                    .ok_or_else(|| {
                        format!(
                            "criterion `{text}`: unit `{u}` does not fit metric `{metric}` (GB/s for *_gbs, us for *_us)"
                        )
                    })?,
            ),
        };
        Ok(Check {
            metric,
            op,
            threshold,
            unit,
        })
    }

    /// `check(metric, op, threshold)`: the same checks as [`Check::parse`], the metric's unit
    /// implied.
    pub fn new(metric: &str, op: &str, threshold: f64) -> Result<Check, String> {
        let metric = Metric::parse_or_explain(metric).map_err(|e| format!("check: {e}"))?;
        let op = Op::parse(op).map_err(|e| format!("check: {e}"))?;
        if !threshold.is_finite() {
            return Err(format!(
                "check: the threshold {threshold} is not a finite number"
            ));
        }
        Ok(Check {
            metric,
            op,
            threshold,
            unit: metric.unit(),
        })
    }
}

/// The criterion text the check was read from, or would be written as.
impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.metric, self.op, self.threshold)?;
        match self.unit {
            Some(u) => write!(f, " {}", u.symbol()),
            None => Ok(()),
        }
    }
}

/// A threshold that is NaN or infinite judges nothing: refused, naming the criterion.
pub(super) fn finite_threshold(text: &str, t: f64) -> Result<f64, String> {
    if t.is_finite() {
        Ok(t)
    } else {
        Err(format!(
            "criterion `{text}`: the threshold {t} is not a finite number"
        ))
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_texts_parse_into_checks() {
        let c = Check::parse("server > 3.5 GB/s").unwrap();
        assert_eq!(
            c,
            Check {
                metric: Metric::parse("server_gbs").unwrap(),
                op: Op::Greater,
                threshold: 3.5,
                unit: Some(Unit::GigabytesPerSecond),
            }
        );
        assert_eq!(c.to_string(), "server_gbs > 3.5 GB/s");
        let c = Check::parse("p99 <= 5000").unwrap();
        assert_eq!(
            (c.metric.name(), c.op, c.unit),
            ("p99_us", Op::AtMost, None)
        );
        assert_eq!(Check::parse(&c.to_string()), Ok(c), "the text reads back");
        assert_eq!(
            Check::parse("server_per_gpu >= 9 GB/s")
                .unwrap()
                .metric
                .name(),
            "server_gbs_per_flow"
        );
        assert_eq!(
            Check::new("per_gpu", ">=", 9.0).unwrap(),
            Check::parse("server_gbs_per_flow >= 9 GB/s").unwrap()
        );
    }

    #[test]
    fn bad_criterion_texts_say_what_is_wrong() {
        let e = Check::parse("target: server > 9 GB/s").unwrap_err();
        assert!(e.contains("is not `<metric> <op> <number> [unit]`"), "{e}");
        let e = Check::parse("servr > 3 GB/s").unwrap_err();
        assert!(e.contains("did you mean `server`"), "{e}");
        let e = Check::parse("server ~ 3").unwrap_err();
        assert!(e.contains("comparison `~`: use >, >=, <, <= or =="), "{e}");
        let e = Check::parse("server > 3 us").unwrap_err();
        assert!(
            e.contains("unit `us` does not fit metric `server_gbs`"),
            "{e}"
        );
        let e = Check::parse("server > 3 Gbit/s").unwrap_err();
        assert!(e.contains("unit `Gbit/s` does not fit"), "{e}");
        let e = Check::parse("server > inf GB/s").unwrap_err();
        assert!(e.contains("not a finite number"), "{e}");
        let e = Check::new("server", ">", f64::NAN).unwrap_err();
        assert!(e.contains("not a finite number"), "{e}");
        let e = Check::new("server", "=>", 1.0).unwrap_err();
        assert!(e.contains("check: comparison `=>`"), "{e}");
    }

    #[test]
    fn ops_compare_and_judge_intervals() {
        for (text, op) in [
            (">", Op::Greater),
            (">=", Op::AtLeast),
            ("<", Op::Less),
            ("<=", Op::AtMost),
            ("==", Op::Equal),
        ] {
            assert_eq!(Op::parse(text), Ok(op));
            assert_eq!(op.symbol(), text);
        }
        assert!(Op::Equal.holds(1.0 + 1e-12, 1.0));
        assert!(!Op::Greater.holds(1.0, 1.0));
        assert_eq!(Op::Greater.judge(2.0, 3.0, 1.0), Judgement::Pass);
        assert_eq!(Op::Greater.judge(0.5, 3.0, 1.0), Judgement::Inconclusive);
        assert_eq!(Op::Greater.judge(0.1, 0.5, 1.0), Judgement::Fail);
    }
}
