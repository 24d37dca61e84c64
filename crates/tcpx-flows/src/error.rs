//! Why a standalone run or a run's flow processes could not start or ended early:
//! [`FlowsError`], what every fallible public function of this crate returns. Its text is the
//! message the binary prints; where a step failed on a lower error, that error is the `source`
//! (the binary's `{:#}` prints it after the step, as `step: cause`).

use std::error::Error as StdError;

use tcpx_bench::BenchError;

/// A lower error this crate passes on as the cause of its own.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Why a standalone run or a run's flow processes could not start, or ended early.
#[derive(Debug, thiserror::Error)]
pub enum FlowsError {
    /// The flags or the experiment rule the run out before anything started; the text says
    /// what to change.
    #[error("{0}")]
    Refused(String),
    /// A step failed on a lower error: the text names the step, `source` the cause.
    #[error("{step}")]
    Step {
        step: String,
        #[source]
        source: Cause,
    },
    /// The bench run (or a flow process's, as its report says) failed; its kind tells a bad
    /// experiment from a failure.
    #[error(transparent)]
    Bench(#[from] BenchError),
    /// A system call failed (writing the tables among them).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The caller's [`Launcher`](crate::Launcher) could not give a flow process's command.
    #[error(transparent)]
    Launcher(Cause),
    /// CSV rows or samples could not be written.
    #[error(transparent)]
    Output(Cause),
}

impl FlowsError {
    /// `step` failed because of `cause`.
    pub(crate) fn step(step: impl Into<String>, cause: impl Into<Cause>) -> FlowsError {
        FlowsError::Step {
            step: step.into(),
            source: cause.into(),
        }
    }

    /// The bench error behind this one, if the run itself failed.
    pub fn bench(&self) -> Option<&BenchError> {
        match self {
            FlowsError::Bench(b) => Some(b),
            _ => None,
        }
    }
}

pub(crate) use tcpx_model::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;

    /// What the binary prints (anyhow's `{:#}`): the step, then its causes, as `.context()`
    /// did; [`chain`] writes the same.
    #[test]
    fn a_step_prints_its_cause_after_it() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = anyhow::Error::from(FlowsError::step("creating a directory", io));
        assert_eq!(e.to_string(), "creating a directory");
        assert_eq!(format!("{e:#}"), "creating a directory: denied");
        let inner = anyhow::anyhow!("disk full").context("opening x.csv");
        let boxed: Cause = inner.into();
        assert_eq!(chain(&*boxed), "opening x.csv: disk full");
        let e = anyhow::Error::from(FlowsError::Output(boxed));
        assert_eq!(format!("{e:#}"), "opening x.csv: disk full");
        assert!(FlowsError::from(BenchError::Invalid("x".into()))
            .bench()
            .is_some());
    }
}
