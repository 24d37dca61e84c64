//! Why a plan run or its follower could not start or ended early: [`OrchestrateError`], what
//! every fallible public function of this crate returns. Its text is the message the binary
//! prints; where a step failed on a lower error, that error is the `source` (the binary's `{:#}`
//! prints it after the step, as `step: cause`).

use std::error::Error as StdError;

use tcpx_link::LinkError;
use tcpx_plan::PlanError;

/// A lower error this crate passes on as the cause of its own.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Why a plan run or its follower could not start, or ended early.
#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    /// The flags, the launcher's roles or the run token rule the run out; the text says what to
    /// change.
    #[error("{0}")]
    Refused(String),
    /// The run failed on its way: the leader turned the follower away, no follower came.
    #[error("{0}")]
    Failed(String),
    /// A step failed on a lower error: the text names the step, `source` the cause.
    #[error("{step}")]
    Step {
        step: String,
        #[source]
        source: Cause,
    },
    /// The follower stopped on purpose (a test hook), as a crashed node would.
    #[error(transparent)]
    Crash(#[from] FollowerCrash),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The link to the other node failed (connecting, or a message).
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The plan could not be loaded, checked or run.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A message could not be encoded.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The report directory could not be made or written (`tcpx_report`).
    #[error(transparent)]
    Report(Cause),
}

impl OrchestrateError {
    /// `step` failed because of `cause`.
    pub(crate) fn step(step: impl Into<String>, cause: impl Into<Cause>) -> OrchestrateError {
        OrchestrateError::Step {
            step: step.into(),
            source: cause.into(),
        }
    }

    /// Writing the report failed with `cause`.
    pub(crate) fn report(cause: impl Into<Cause>) -> OrchestrateError {
        OrchestrateError::Report(cause.into())
    }

    /// The follower's deliberate stop, when this is one (the binary exits with
    /// [`FollowerCrash::EXIT_STATUS`]).
    pub fn follower_crash(&self) -> Option<&FollowerCrash> {
        match self {
            OrchestrateError::Crash(c) => Some(c),
            _ => None,
        }
    }
}

/// [`serve`](crate::serve) stopped on purpose mid-plan
/// ([`FaultHooks::follower_exit_after`](crate::FaultHooks::follower_exit_after)), as a crashed
/// node would: the caller ends the process with [`FollowerCrash::EXIT_STATUS`].
#[derive(Debug)]
pub struct FollowerCrash {
    pub served: u32,
}

impl std::fmt::Display for FollowerCrash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.served;
        write!(
            f,
            "--fail-after {n}: the follower stopped on purpose after {n} experiment(s)"
        )
    }
}

impl std::error::Error for FollowerCrash {}

impl FollowerCrash {
    /// The exit status of a follower stopped this way.
    pub const EXIT_STATUS: u8 = 101;
}

pub(crate) use tcpx_model::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;

    /// What the binary prints (anyhow's `{:#}`): the step, then its causes, as `.context()`
    /// did; a crash is told apart.
    #[test]
    fn a_step_prints_its_cause_after_it_and_a_crash_is_told_apart() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "in use");
        let e = anyhow::Error::from(OrchestrateError::step("listening on loopback", io));
        assert_eq!(e.to_string(), "listening on loopback");
        assert_eq!(format!("{e:#}"), "listening on loopback: in use");
        let e = e.downcast::<OrchestrateError>().unwrap();
        assert_eq!(chain(&e), "listening on loopback: in use");
        let inner = anyhow::anyhow!("read-only").context("creating reports/x");
        let e = anyhow::Error::from(OrchestrateError::report(inner));
        assert_eq!(format!("{e:#}"), "creating reports/x: read-only");
        let crash = OrchestrateError::from(FollowerCrash { served: 2 });
        assert_eq!(crash.follower_crash().map(|c| c.served), Some(2));
        assert_eq!(
            crash.to_string(),
            "--fail-after 2: the follower stopped on purpose after 2 experiment(s)"
        );
        assert!(OrchestrateError::Failed("x".into())
            .follower_crash()
            .is_none());
    }
}
