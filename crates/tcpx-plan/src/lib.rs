//! tcpx-plan: the Rhai engine and plan API that turn `plans/*.rhai` into experiments.
//!
//! Will hold: experiment values built from a base and varied, sweeps, phases, criteria, decision
//! points and chart declarations, with per-platform target sets. Filled by the plans/reports issue;
//! nothing here works yet.
//!
//! Not for: running experiments (that is `tcpx-bench`) or writing reports (`tcpx-report`).
