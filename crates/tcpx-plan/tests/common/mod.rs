//! What the plan-engine hardening tests share: the repository's plans/ folder, its loopback
//! target set and the facts of a small test machine.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tcpx_plan::{Estimate, Plan, PlanError, PlanExperiment, RunOutcome, SystemFacts, TargetSet};
use tcpx_report::{ResultRecord, SideFigures};

/// The repository's plans/ folder.
pub fn plans_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans")
}

/// The loopback target set from plans/targets.
pub fn targets() -> TargetSet {
    TargetSet::load(&plans_dir().join("targets/loopback.toml")).unwrap()
}

/// A 2-CPU machine named `test`.
pub fn facts() -> SystemFacts {
    SystemFacts {
        cpus: 2,
        hostname: "test".into(),
        ..SystemFacts::default()
    }
}

/// The dry pass (estimate) of plan source `src`, named `t.rhai` in plans/, on `facts` with the
/// loopback target set.
pub fn dry_on(facts: &SystemFacts, src: &str) -> Result<Estimate, PlanError> {
    Plan::from_source("t", &plans_dir(), src).estimate(facts, &targets())
}

/// [`dry_on`] the 2-CPU test machine of [`facts`].
pub fn dry(src: &str) -> Result<Estimate, PlanError> {
    dry_on(&facts(), src)
}

/// What a test runner returns for `exp`: one repetition of 1 MiB messages measured at `gbs`
/// GB/s on both sides, every iteration alike.
pub fn measured_at(exp: &PlanExperiment, phase: &str, started: f64, gbs: f64) -> RunOutcome {
    let side = SideFigures {
        avg_us: 1e3 / gbs,
        p50_us: 1e3 / gbs,
        p99_us: 1e3 / gbs,
        min_us: 1e3 / gbs,
        max_us: 1e3 / gbs,
        algbw_gbs: gbs,
        busbw_gbs: gbs,
        wrong_bytes: Some(0),
        iter_us: Vec::new(),
    };
    RunOutcome {
        records: vec![ResultRecord {
            size: Some(1 << 20),
            chunk: Some(1 << 19),
            send: Some(side.clone()),
            recv: Some(side),
            ..exp.record(phase, started)
        }],
        ..RunOutcome::default()
    }
}
