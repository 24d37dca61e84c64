//! tcpx-orchestrate: runs experiments across processes and nodes.
//!
//! For: the leader/follower link of a plan run ([`link`]), the leader's side of each experiment
//! and its report records ([`leader`]), the follower loop ([`follower`]), the multi-process
//! supervisor that starts one process per flow and reads each one's typed [`ChildReport`]
//! ([`supervise`], [`flows`], [`report`]), launcher environments ([`launch`]), machine facts
//! ([`facts`]), the knobs each side applies for itself ([`knobs`]), and the default-vs-tuned
//! libnccl comparison that validates a run's tuned settings ([`validate`]).
//! Also fleet qualification ([`fleet`]): every pair of N nodes measured per NIC, the slow one
//! named.
//!
//! Not for: running one experiment (that is `tcpx-bench`), deciding what to run (`tcpx-plan`),
//! writing reports (`tcpx-report`), or parsing command lines and printing (the `tcpx-run`
//! binary). Nothing here re-executes the current program: flow processes are started through
//! the [`Launcher`] the caller passes in, and faults are injected through [`FaultHooks`].
//!
//! The commands' whole runs live here too, so they can be embedded: a plan run as leader and the
//! follower's way in ([`plan_run`]), and one experiment outside a plan, in this process or one
//! process per flow, with its CSV rows and JSON document ([`standalone`]).

#![forbid(unsafe_code)]

pub mod auth;
pub mod facts;
pub mod figures;
pub mod fleet;
pub mod flows;
pub mod follower;
pub mod knobs;
pub mod launch;
pub mod leader;
pub mod link;
pub mod on_fabric;
pub mod plan_run;
pub mod proto;
pub mod report;
pub mod standalone;
pub mod supervise;
pub mod supervisor;
pub mod validate;

pub use flows::{ChildFault, FlowJob, FlowSide, Launcher, PARENT_PID_ENV};
pub use follower::{serve, FollowOpts, FollowerCrash};
pub use leader::{accept_follower, LeaderObserver, LeaderRunner, Quiet};
pub use link::{Link, LinkError, LinkMsg, DEFAULT_PLAN_PORT, LINK_PROTOCOL};
pub use report::{ChildError, ChildErrorKind, ChildReport};

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
