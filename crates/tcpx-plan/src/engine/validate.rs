//! `validate()`: the run's tuned settings against NCCL's defaults, through the runner.

use rhai::{Dynamic, Engine};
use tcpx_model::{Backend, NcclEquivalent};
use tcpx_report::{CriterionResult, Verdict};

use super::criteria::push_criterion;
use super::{Mode, Shared};
use crate::system::Validation;

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[("validate", 0)];

/// What one `validate()` adds to a plan's estimate where it can run (libnccl and two GPUs):
/// 20 NCCL processes (send/recv and all-reduce, default and tuned, 5 repetitions each), each an
/// NCCL init over NET/Socket plus 25 transfers of 64 MiB, taken as 5 s apiece. A rough figure,
/// not a measurement: it keeps a plan that validates from looking free against `--budget`.
pub const VALIDATE_ESTIMATE_S: f64 = 100.0;

/// Whether the backend named `transport` (one of [`crate::SystemFacts::transports`]) is libnccl
/// itself, so NCCL's own send/recv and all-reduce runs, which `validate()` needs, can run here.
/// Asked of the backend's capabilities, not its name; an unknown name runs nothing.
fn runs_nccl_itself(transport: &str) -> bool {
    transport
        .parse::<Backend>()
        .is_ok_and(|b| b.capabilities().nccl == NcclEquivalent::Itself)
}

/// `validate()`: the run's tuned settings so far (tuned.env) against NCCL's defaults through
/// the runner, recorded as a criterion (N/A with the reason where it cannot run); returns the
/// gain (tuned / default busbw) or `()`.
fn validate_tuned(st: &Shared) -> Dynamic {
    let (mode, runner, tuned) = {
        let s = st.borrow();
        let mut r = s.report.clone();
        r.summaries = tcpx_report::summarise(r.records.iter());
        (
            s.mode,
            s.runner.clone(),
            tcpx_report::tuned::Tuned::from_report(&r).pairs(),
        )
    };
    if mode == Mode::Dry {
        let mut s = st.borrow_mut();
        if s.facts.transports.iter().any(|t| runs_nccl_itself(t)) && s.facts.gpus.len() >= 2 {
            s.est_s += VALIDATE_ESTIMATE_S;
        }
        return Dynamic::UNIT;
    }
    let text = "the tuned settings beat NCCL's defaults (libnccl send/recv, gain > 1)";
    let outcome = match runner {
        _ if tuned.is_empty() => Validation::NotAvailable("no tuned settings yet".into()),
        Some(r) => r.borrow_mut().validate(&tuned),
        None => Validation::NotAvailable("no runner is attached".into()),
    };
    match outcome {
        Validation::NotAvailable(why) => {
            push_criterion(st, CriterionResult::plain(text, Verdict::NotEvaluated, why));
            Dynamic::UNIT
        }
        Validation::Measured {
            gain,
            lo,
            hi,
            detail,
        } => {
            let verdict = if lo > 1.0 {
                Verdict::Pass
            } else if hi <= 1.0 {
                Verdict::Fail
            } else {
                Verdict::Inconclusive
            };
            push_criterion(
                st,
                CriterionResult::plain(
                    text,
                    verdict,
                    format!("gain {gain:.3} [{lo:.3}, {hi:.3}]: {detail}"),
                ),
            );
            Dynamic::from(gain)
        }
    }
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    {
        let st = st.clone();
        engine.register_fn("validate", move || -> Dynamic { validate_tuned(&st) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_libnccl_runs_the_validation() {
        let running: Vec<&str> = Backend::NAMES
            .into_iter()
            .filter(|t| runs_nccl_itself(t))
            .collect();
        assert_eq!(running, ["nccl"]);
        assert!(!runs_nccl_itself("NCCL") && !runs_nccl_itself(""));
    }
}
