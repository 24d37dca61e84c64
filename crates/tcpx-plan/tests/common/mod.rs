//! What the plan-engine hardening tests share: the repository's plans/ folder, its loopback
//! target set and the facts of a small test machine.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tcpx_plan::{SystemFacts, TargetSet};

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
