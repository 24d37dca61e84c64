//! tcpx-link: the rendezvous of a run across nodes, shared by plan runs and fleet runs.
//!
//! For: the leader/follower link (JSON lines over TCP, each line bounded: [`Link`], the plan
//! run's [`LinkMsg`], and the line helpers a fleet run's own messages use), the run token both
//! sides prove with HMAC-SHA256 over fresh nonces ([`auth`]), and who leads and who follows
//! under a job launcher (Slurm, torchrun, Open MPI/PMI, JobSet: [`launch`]).
//!
//! Not for: what either side does with the link (the plan runner in tcpx-orchestrate, fleet in
//! tcpx-fleet), moving bytes (tcpx-bench), or reading the process environment: launchers'
//! variables are passed in.

#![forbid(unsafe_code)]

pub mod auth;
pub mod launch;
mod link;

pub use link::*;
