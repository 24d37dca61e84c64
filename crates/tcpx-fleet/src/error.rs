//! Why a fleet run could not start or ended early: [`FleetError`], what every fallible public
//! function of this crate returns. Its text is the message the binary prints; where a step
//! failed on a lower error, that error is the `source` (the binary's `{:#}` prints it after the
//! step, as `step: cause`).

use std::error::Error as StdError;

/// A lower error this crate passes on as the cause of its own.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Why a fleet run could not start, or ended early.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The settings, this node's NICs or the fleet rule the run out (nothing was started, or
    /// the leader turned this node away); the text says what to change.
    #[error("{0}")]
    Refused(String),
    /// The run failed on its way: the leader or a node was lost, a greeting went wrong.
    #[error("{0}")]
    Failed(String),
    /// A step failed on a lower error: the text names the step, `source` the cause.
    #[error("{step}")]
    Step {
        step: String,
        #[source]
        source: Cause,
    },
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The experiment could not be put into the JSON document.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The matrix or the report could not be written (`tcpx_report::fleet`).
    #[error(transparent)]
    Report(Cause),
}

impl FleetError {
    /// `step` failed because of `cause`.
    pub(crate) fn step(step: impl Into<String>, cause: impl Into<Cause>) -> FleetError {
        FleetError::Step {
            step: step.into(),
            source: cause.into(),
        }
    }

    /// Writing the results failed with `cause`.
    pub(crate) fn report(cause: impl Into<Cause>) -> FleetError {
        FleetError::Report(cause.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the binary prints (anyhow's `{:#}`): the step, then its causes, as `.context()`
    /// did.
    #[test]
    fn a_step_prints_its_cause_after_it() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = anyhow::Error::from(FleetError::step("creating the output directory d", io));
        assert_eq!(e.to_string(), "creating the output directory d");
        assert_eq!(format!("{e:#}"), "creating the output directory d: denied");
        let inner = anyhow::anyhow!("disk full").context("writing matrix.csv");
        let e = anyhow::Error::from(FleetError::report(inner));
        assert_eq!(format!("{e:#}"), "writing matrix.csv: disk full");
    }
}
