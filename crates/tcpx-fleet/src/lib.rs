//! tcpx-fleet: fleet qualification (`tcpx-run fleet`): one process per node, every ordered pair
//! of nodes measured on every NIC and on all NICs together, the slow node, NIC or pair named.
//!
//! * [`schedule`]: the round-robin tournament of disjoint pairs.
//! * [`proto`]: the leader as a protocol machine without IO, and the messages of the fleet link.
//! * [`outliers`]: robust statistics over the matrix: who is below its peers, by how much.
//! * [`node`]: one node's side of a pair run (a real `tcpx-bench` server or client on the
//!   node's NIC addresses, with a start-up probe), the same for the leader's node and the others.
//! * [`options`]: a run's settings and their checks: this node's place in the fleet, the
//!   options every node runs with, the leader's listener.
//! * [`run`]: the drivers: the leader (sockets, clock, files) and a follower.
//! * [`error`]: [`FleetError`], why a run could not start or ended early.
//!
//! Not for: moving bytes (that is `tcpx-bench`), drawing the report (`tcpx-report::fleet`), the
//! link's lines, the run token and launcher roles (tcpx-link), or parsing command lines (the
//! `tcpx-run` binary).

#![forbid(unsafe_code)]

pub mod error;
pub mod node;
pub mod options;
pub mod outliers;
pub mod proto;
pub mod run;
pub mod schedule;

pub use error::FleetError;
