//! The one place tcpx-plan's engine reaches the experiment model of the bench: byte counts as
//! plans write them. (knobs.rs builds on `tcpx_bench::Experiment` directly; the dependency on
//! tcpx-bench leaves with both.)

pub(crate) use tcpx_bench::format_size;
