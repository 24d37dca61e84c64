//! tcpx-orchestrate: the plan runner, a plan's experiments run between a leader and a follower
//! node.
//!
//! For: a plan run as leader and the follower's way in ([`plan_run`], the whole runs, embeddable),
//! the leader's side of each experiment and its report records ([`LeaderRunner`], a
//! `tcpx_plan::Runner`), the follower loop ([`serve`]), the protocol decisions of both sides as
//! sans-IO state machines ([`proto`]), and inside the crate: machine facts, the knobs each side
//! applies for itself, and plan runs on an emulated fabric (leader in node A, follower in node
//! B). What fails says why as an [`OrchestrateError`].
//!
//! Not for: the link, the run token and launcher roles (tcpx-link), starting and supervising
//! flow processes or the standalone bench run (tcpx-flows), fleet qualification (tcpx-fleet),
//! the NCCL A/B validation a plan asks for (tcpx-validate), running one experiment
//! (tcpx-bench), deciding what to run (tcpx-plan), writing reports (tcpx-report), or parsing
//! command lines and printing (the `tcpx-run` binary). Nothing here re-executes the current
//! program: flow processes are started through the `tcpx_flows::Launcher` the caller passes
//! in, and faults are injected through [`FaultHooks`].

#![forbid(unsafe_code)]

mod error;
mod facts;
mod follower;
mod knobs;
mod leader;
mod on_fabric;
pub mod plan_run;
pub mod proto;

pub use error::{Cause, FollowerCrash, OrchestrateError};
pub use follower::{serve, FollowOpts};
pub use leader::{accept_follower, LeaderObserver, LeaderRunner, Quiet};

/// Faults a test asks a run to act out, each once. Production runs pass the default (none).
#[derive(Clone, Debug, Default)]
pub struct FaultHooks {
    /// Follower: stop serving with [`FollowerCrash`] when asked for experiment number `n + 1`,
    /// as a crashed node would (`tcpx-run follow` then exits with status 101).
    pub follower_exit_after: Option<u32>,
    /// Follower: in the first multi-process experiment, flow `f`'s server process accepts its
    /// client and exits with status 3, as a crashed flow process would.
    pub follower_fail_flow: Option<u32>,
    /// Follower: in the first multi-process experiment, flow `f`'s reserved control port stays
    /// bound, so its server process finds the port taken.
    pub follower_hold_port: Option<u32>,
    /// Leader: in the first multi-process experiment, flow `f`'s client process exits before
    /// connecting (the follower's server for it waits for nobody).
    pub leader_fail_client_flow: Option<u32>,
}
