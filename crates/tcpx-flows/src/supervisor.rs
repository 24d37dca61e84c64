//! The multi-process supervisor's decisions as a sans-IO state machine: which child's failure is
//! the cause, when to give an echo's siblings time to fail on their own, when to stop the rest
//! and when to kill them. [`supervise_until`](crate::supervise::supervise_until) is its driver
//! (it starts the processes, polls their exits, sends the signals); tests drive it with a
//! virtual clock.
//!
//! Children are numbered in the order given. The watch ends at the first failure, at the limit,
//! or at a stop request; then every child still running gets SIGTERM, and SIGKILL after
//! [`STOP_GRACE`].

use std::time::{Duration, Instant};

/// Grace period between SIGTERM and SIGKILL when stopping the other children.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long the others may still end on their own when the first child to fail only echoes a
/// peer that went away. The cause may be a sibling here whose exit is not seen yet (its peer on
/// the other node failed first and that node's parent stopped the rest); stopping it at once
/// would hide its own error behind "stopped".
pub const ECHO_GRACE: Duration = Duration::from_secs(2);

/// How a child ended, as far as the decisions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Exit status 0.
    pub success: bool,
    /// Killed by a signal: a cause, never an echo.
    pub signalled: bool,
    /// Its report says its peer went away (an echo of a failure elsewhere).
    pub echo: bool,
}

#[derive(Debug, Clone)]
pub enum SupEvent {
    /// Children that ended since the last event, as `(child, how)`, in child order.
    Exited(Vec<(usize, Ended)>),
    /// Stop every child now, for this reason (news from outside, or a child that could not start).
    StopRequested(String),
    /// `poll_timeout` passed (an early one is ignored).
    Timeout,
}

/// Why the run ended early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// A child failed: the first in `Verdict::failed`.
    Child,
    /// The run's time limit passed.
    Limit,
    /// A stop was requested, for this reason.
    Request(String),
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when every child ended with status 0.
    pub cause: Option<Cause>,
    /// Children that failed on their own, the one to name first first.
    pub failed: Vec<usize>,
    /// Children stopped by the supervisor, in child order, with whether SIGKILL was needed.
    pub stopped: Vec<(usize, bool)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupAction {
    /// Send SIGTERM to these children.
    Terminate(Vec<usize>),
    /// Send SIGKILL to these children (then report their exits).
    Kill(Vec<usize>),
    /// Every child has ended.
    Finished(Verdict),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Child {
    Running,
    Ended(Ended),
    /// Ended after the supervisor's SIGTERM (or SIGKILL).
    Stopped {
        killed: bool,
    },
    Killing,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Watching {
        deadline: Instant,
    },
    EchoGrace {
        until: Instant,
        first: usize,
    },
    Stopping {
        until: Instant,
        cause: Cause,
        failed: Vec<usize>,
    },
    Killing {
        cause: Cause,
        failed: Vec<usize>,
    },
    Over,
}

/// The supervisor of `n` running children.
pub struct Supervisor {
    children: Vec<Child>,
    phase: Phase,
}

impl Supervisor {
    /// `n` children started at `now`, allowed `limit` in all.
    pub fn new(n: usize, limit: Duration, now: Instant) -> Supervisor {
        Supervisor {
            children: vec![Child::Running; n],
            phase: Phase::Watching {
                deadline: now + limit,
            },
        }
    }

    /// When the driver must send [`SupEvent::Timeout`]; `None` when no deadline is pending.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Watching { deadline } => Some(*deadline),
            Phase::EchoGrace { until, .. } | Phase::Stopping { until, .. } => Some(*until),
            Phase::Killing { .. } | Phase::Over => None,
        }
    }

    /// Whether the watch is still on (the driver may ask for outside stop requests).
    pub fn watching(&self) -> bool {
        matches!(self.phase, Phase::Watching { .. })
    }

    fn running(&self) -> Vec<usize> {
        (0..self.children.len())
            .filter(|&i| matches!(self.children[i], Child::Running | Child::Killing))
            .collect()
    }

    fn failed_on_their_own(&self) -> Vec<usize> {
        (0..self.children.len())
            .filter(|&i| matches!(self.children[i], Child::Ended(e) if !e.success))
            .collect()
    }

    fn is_echo(&self, i: usize) -> bool {
        matches!(self.children[i], Child::Ended(e) if e.echo)
    }

    fn stop(&mut self, cause: Cause, failed: Vec<usize>, now: Instant) -> Vec<SupAction> {
        let running = self.running();
        if running.is_empty() {
            return self.finish(Some(cause), failed);
        }
        self.phase = Phase::Stopping {
            until: now + STOP_GRACE,
            cause,
            failed,
        };
        vec![SupAction::Terminate(running)]
    }

    fn finish(&mut self, cause: Option<Cause>, failed: Vec<usize>) -> Vec<SupAction> {
        self.phase = Phase::Over;
        let stopped = (0..self.children.len())
            .filter_map(|i| match self.children[i] {
                Child::Stopped { killed } => Some((i, killed)),
                _ => None,
            })
            .collect();
        vec![SupAction::Finished(Verdict {
            cause,
            failed,
            stopped,
        })]
    }

    /// The children that failed on their own, `first` named first unless it only echoes a
    /// peer and another did not.
    fn named(&self, first: usize) -> Vec<usize> {
        let mut failed: Vec<usize> = std::iter::once(first)
            .chain(
                self.failed_on_their_own()
                    .into_iter()
                    .filter(|&j| j != first),
            )
            .collect();
        if self.is_echo(first) {
            if let Some(k) = failed.iter().position(|&j| !self.is_echo(j)) {
                failed.swap(0, k);
            }
        }
        failed
    }

    pub fn handle(&mut self, event: SupEvent, now: Instant) -> Vec<SupAction> {
        if let SupEvent::Exited(batch) = &event {
            for &(i, ended) in batch {
                self.children[i] = match (&self.phase, self.children[i]) {
                    (Phase::Stopping { .. }, _) => Child::Stopped { killed: false },
                    (Phase::Killing { .. }, Child::Killing) => Child::Stopped { killed: true },
                    (Phase::Killing { .. }, _) => Child::Stopped { killed: false },
                    _ => Child::Ended(ended),
                };
            }
        }
        match (self.phase.clone(), event) {
            (Phase::Over, _) => vec![],
            (_, SupEvent::Timeout) if self.poll_timeout().is_none_or(|t| now < t) => vec![],
            (Phase::Watching { .. }, SupEvent::Exited(batch)) => {
                // Several may end at once (a killed child's peer fails right after it): one
                // killed by a signal is the cause rather than a consequence.
                let failures: Vec<(usize, Ended)> =
                    batch.into_iter().filter(|(_, e)| !e.success).collect();
                let first = failures
                    .iter()
                    .find(|(_, e)| e.signalled)
                    .or(failures.first())
                    .copied();
                match first {
                    // The first failure only echoes a vanished peer: the cause may be a sibling
                    // here whose exit is not seen yet; give it time to fail on its own.
                    Some((i, e)) if e.echo && !e.signalled => {
                        if self.running().is_empty() {
                            let named = self.named(i);
                            return self.stop(Cause::Child, named, now);
                        }
                        self.phase = Phase::EchoGrace {
                            until: now + ECHO_GRACE,
                            first: i,
                        };
                        vec![]
                    }
                    Some((i, _)) => {
                        let named = self.named(i);
                        self.stop(Cause::Child, named, now)
                    }
                    None if self.running().is_empty() => self.finish(None, vec![]),
                    None => vec![],
                }
            }
            (Phase::Watching { .. }, SupEvent::StopRequested(r)) => {
                let failed = self.failed_on_their_own();
                self.stop(Cause::Request(r), failed, now)
            }
            (Phase::Watching { .. }, SupEvent::Timeout) => {
                let failed = self.failed_on_their_own();
                self.stop(Cause::Limit, failed, now)
            }
            (Phase::EchoGrace { first, .. }, SupEvent::Exited(batch)) => {
                if batch.iter().any(|(_, e)| !e.success) || self.running().is_empty() {
                    let named = self.named(first);
                    self.stop(Cause::Child, named, now)
                } else {
                    vec![]
                }
            }
            (Phase::EchoGrace { first, .. }, SupEvent::Timeout) => {
                let named = self.named(first);
                self.stop(Cause::Child, named, now)
            }
            // Already stopping: nothing more to decide.
            (Phase::EchoGrace { .. }, SupEvent::StopRequested(_)) => vec![],
            (Phase::Stopping { cause, failed, .. }, SupEvent::Exited(_)) => {
                if self.running().is_empty() {
                    self.finish(Some(cause), failed)
                } else {
                    vec![]
                }
            }
            (Phase::Stopping { cause, failed, .. }, SupEvent::Timeout) => {
                let left = self.running();
                for &i in &left {
                    self.children[i] = Child::Killing;
                }
                self.phase = Phase::Killing { cause, failed };
                vec![SupAction::Kill(left)]
            }
            (Phase::Killing { cause, failed }, SupEvent::Exited(_)) => {
                if self.running().is_empty() {
                    self.finish(Some(cause), failed)
                } else {
                    vec![]
                }
            }
            (Phase::Stopping { .. } | Phase::Killing { .. }, _) => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Ended = Ended {
        success: true,
        signalled: false,
        echo: false,
    };
    const FAILED: Ended = Ended {
        success: false,
        signalled: false,
        echo: false,
    };
    const ECHO: Ended = Ended {
        success: false,
        signalled: false,
        echo: true,
    };
    const KILLED: Ended = Ended {
        success: false,
        signalled: true,
        echo: false,
    };
    const LIMIT: Duration = Duration::from_secs(100);

    fn finished(a: &[SupAction]) -> &Verdict {
        match a {
            [SupAction::Finished(v)] => v,
            other => panic!("expected the end, got {other:?}"),
        }
    }

    #[test]
    fn all_ending_well_is_a_clean_finish() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(2, LIMIT, t0);
        assert!(s.handle(SupEvent::Exited(vec![(1, OK)]), t0).is_empty());
        let a = s.handle(SupEvent::Exited(vec![(0, OK)]), t0);
        assert_eq!(
            finished(&a),
            &Verdict {
                cause: None,
                failed: vec![],
                stopped: vec![]
            }
        );
        assert!(s.poll_timeout().is_none());
    }

    /// The first failure stops the rest: SIGTERM, then SIGKILL for one that outlives the grace.
    #[test]
    fn a_failure_stops_the_others_and_kills_the_stubborn_after_the_grace() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(3, LIMIT, t0);
        let a = s.handle(SupEvent::Exited(vec![(1, FAILED)]), t0);
        assert_eq!(a, [SupAction::Terminate(vec![0, 2])]);
        assert_eq!(s.poll_timeout(), Some(t0 + STOP_GRACE));
        assert!(s.handle(SupEvent::Exited(vec![(0, FAILED)]), t0).is_empty());
        assert!(s.handle(SupEvent::Timeout, t0 + STOP_GRACE / 2).is_empty());
        let a = s.handle(SupEvent::Timeout, t0 + STOP_GRACE);
        assert_eq!(a, [SupAction::Kill(vec![2])]);
        let a = s.handle(SupEvent::Exited(vec![(2, KILLED)]), t0 + STOP_GRACE);
        assert_eq!(
            finished(&a),
            &Verdict {
                cause: Some(Cause::Child),
                failed: vec![1],
                stopped: vec![(0, false), (2, true)]
            }
        );
    }

    /// A child killed by a signal is the cause even when a lower one failed in the same round.
    #[test]
    fn a_signalled_child_is_named_before_others_of_its_round() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(3, LIMIT, t0);
        let a = s.handle(SupEvent::Exited(vec![(0, FAILED), (1, KILLED)]), t0);
        assert_eq!(a, [SupAction::Terminate(vec![2])]);
        let v = finished(&s.handle(SupEvent::Exited(vec![(2, OK)]), t0)).clone();
        assert_eq!(v.failed, [1, 0]);
    }

    /// An echo first: the siblings get ECHO_GRACE to fail on their own, and the one that does is
    /// named first, not stopped.
    #[test]
    fn after_an_echo_a_sibling_failing_within_the_grace_is_named_first() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(3, LIMIT, t0);
        assert!(s.handle(SupEvent::Exited(vec![(0, ECHO)]), t0).is_empty());
        assert_eq!(s.poll_timeout(), Some(t0 + ECHO_GRACE));
        assert!(!s.watching());
        // Outside news is not asked for any more.
        assert!(s
            .handle(SupEvent::StopRequested("late".into()), t0)
            .is_empty());
        let t1 = t0 + ECHO_GRACE / 2;
        let a = s.handle(SupEvent::Exited(vec![(2, FAILED)]), t1);
        assert_eq!(a, [SupAction::Terminate(vec![1])]);
        let v = finished(&s.handle(SupEvent::Exited(vec![(1, FAILED)]), t1)).clone();
        assert_eq!(v.failed, [2, 0], "the sibling's own failure is the cause");
        assert_eq!(v.stopped, [(1, false)]);
    }

    #[test]
    fn after_an_echo_the_grace_ends_and_the_rest_are_stopped() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(2, LIMIT, t0);
        s.handle(SupEvent::Exited(vec![(1, ECHO)]), t0);
        assert!(s.handle(SupEvent::Timeout, t0).is_empty(), "early");
        let a = s.handle(SupEvent::Timeout, t0 + ECHO_GRACE);
        assert_eq!(a, [SupAction::Terminate(vec![0])]);
        let v = finished(&s.handle(SupEvent::Exited(vec![(0, FAILED)]), t0 + ECHO_GRACE)).clone();
        assert_eq!((v.cause, v.failed), (Some(Cause::Child), vec![1]));
    }

    #[test]
    fn the_limit_stops_everyone() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(2, LIMIT, t0);
        assert!(s.handle(SupEvent::Timeout, t0 + LIMIT / 2).is_empty());
        let a = s.handle(SupEvent::Timeout, t0 + LIMIT);
        assert_eq!(a, [SupAction::Terminate(vec![0, 1])]);
        let v = finished(&s.handle(SupEvent::Exited(vec![(0, FAILED), (1, FAILED)]), t0 + LIMIT))
            .clone();
        assert_eq!(v.cause, Some(Cause::Limit));
        assert_eq!(v.stopped, [(0, false), (1, false)]);
    }

    /// The other node's processes failed (or a child could not start): stop at once, with the
    /// reason; with nobody left running the end comes at once.
    #[test]
    fn a_stop_request_stops_everyone_with_its_reason() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(2, LIMIT, t0);
        s.handle(SupEvent::Exited(vec![(0, OK)]), t0);
        let a = s.handle(SupEvent::StopRequested("the follower failed".into()), t0);
        assert_eq!(a, [SupAction::Terminate(vec![1])]);
        let v = finished(&s.handle(SupEvent::Exited(vec![(1, FAILED)]), t0)).clone();
        assert_eq!(v.cause, Some(Cause::Request("the follower failed".into())));
        let mut none = Supervisor::new(0, LIMIT, t0);
        let v = finished(&none.handle(SupEvent::StopRequested("x".into()), t0)).clone();
        assert!(v.stopped.is_empty());
    }
}
