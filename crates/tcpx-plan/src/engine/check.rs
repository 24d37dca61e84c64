//! What a criterion checks, typed: a metric of a result ([`Metric`]), a comparison ([`Op`]), a
//! threshold and its unit ([`Unit`]), together a [`Check`]. Read once where a criterion enters
//! the plan API; criteria, `holds`, `gain_ci` and the reports use them from there on.

use std::fmt;

use tcpx_report::stats::{self, Judgement};
use tcpx_report::METRICS;

use crate::knobs::suggest;

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
