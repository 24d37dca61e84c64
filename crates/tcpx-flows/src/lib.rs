//! tcpx-flows: one process per flow, started, watched and read back, and the standalone bench
//! run built on it.
//!
//! For: how a multi-process run starts one process per flow through the caller's [`Launcher`]
//! and what such a process does first ([`process`]: dying with its parent, NCCL's variables in
//! its environment), the typed [`ChildReport`] each writes ([`report`]), their supervisor
//! ([`supervisor`] decides as a state machine, [`supervise`] drives it on real processes), the
//! figures of a run's flows together ([`figures`]: aggregate GB/s over the wall-clock span any
//! flow was transferring), and one experiment outside a plan as `tcpx-run bench` runs it, in
//! this process or one process per flow ([`standalone`]), and why those fail ([`FlowsError`]).
//!
//! Not for: running one experiment in one process (that is `tcpx-bench`), the leader/follower
//! link or plans (tcpx-link, tcpx-orchestrate), or parsing flags and printing (the `tcpx-run`
//! binary). Nothing here re-executes the current program: the [`Launcher`] says how to start a
//! flow process, and faults a test wants acted out arrive as [`ChildFault`].
//!
//! **Invariant:** a flow process never outlives its parent (PR_SET_PDEATHSIG plus a parent-pid
//! check at start, and the supervisor reaps every child before it returns).

#![forbid(unsafe_code)]

pub mod error;
pub mod figures;
pub mod process;
pub mod report;
pub mod standalone;
pub mod supervise;
pub mod supervisor;

pub use error::FlowsError;
pub use process::{ChildFault, FlowJob, FlowSide, Launcher, PARENT_PID_ENV};
pub use report::{ChildError, ChildErrorKind, ChildReport};
