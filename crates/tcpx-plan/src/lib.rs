//! tcpx-plan: the Rhai engine and plan API that turn `plans/*.rhai` into experiments, criteria,
//! decisions and charts.
//!
//! A plan builds experiments from a base and varies them (`base.with_knobs(#{ window: 32 })`,
//! `sweep`, `matrix`), groups them in phases, runs them through a [`Runner`] the caller
//! implements, and records criteria (`criterion("server > 3.5 GB/s", r)`, read into a typed
//! [`Check`]), decision points with the branch taken, and chart declarations into a
//! [`tcpx_report::RunReport`]. Thresholds and per-platform settings come from a [`TargetSet`]
//! (`plans/targets/*.toml`), chosen by the detected platform or by name. Scripts are sandboxed:
//! no file or process access (imports only from the plan's own directory by plain name), `eval`
//! disabled, limits on operations, call depth and sizes; errors carry `file:line:column`. Plans
//! read the machine through [`SystemFacts`] only.
//!
//! Built on tcpx-model (what an experiment and its knobs are) and tcpx-report (records,
//! statistics); it does not depend on tcpx-bench, so it pulls in no CUDA, FFI or fabric.
//!
//! Not for: moving bytes or applying knobs (the [`Runner`] in tcpx-run does that with
//! tcpx-bench and tcpx-affinity) or writing report files (tcpx-report).

#![forbid(unsafe_code)]

mod engine;
pub mod knobs;
mod limits;
pub mod search;
pub mod system;
pub mod targets;

pub use engine::{
    Check, Estimate, Limits, Metric, Op, Plan, PlanError, Unit, MAX_CONFIGURATIONS,
    MAX_PLAN_EXPERIMENTS, VALIDATE_ESTIMATE_S,
};
pub use knobs::{check as check_knob, suggest, KnobError, KnobKind, PlanExperiment, KNOBS};
pub use limits::MAX_PLAN_BYTES;
pub use system::{
    GpuFact, IrqFact, KnobSupport, NicFact, NumaFact, RunOutcome, Runner, SystemFacts, Validation,
};
pub use targets::{choose as choose_targets, detect_platform, TargetSet, DEFAULT_MAX_ROUNDS};
