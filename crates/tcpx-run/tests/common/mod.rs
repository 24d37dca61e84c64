//! Helpers the CLI tests share: the binary under test, plan directories made from the real
//! target sets, and the workspace's test net plugin.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `tcpx-run` binary cargo built for these tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tcpx-run")
}

/// The repository's plans/ folder.
pub fn plans() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans")
}

/// A plan directory with the real target sets and common module, plus `name.rhai`.
pub fn plan_dir(name: &str, src: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("targets")).unwrap();
    for t in ["loopback.toml", "a3-high.toml"] {
        std::fs::copy(
            plans().join("targets").join(t),
            d.path().join("targets").join(t),
        )
        .unwrap();
    }
    std::fs::copy(plans().join("common.rhai"), d.path().join("common.rhai")).unwrap();
    let p = d.path().join(format!("{name}.rhai"));
    std::fs::write(&p, src).unwrap();
    (d, p)
}

/// Builds the workspace's test plugin into this test's target directory and returns its path.
pub fn test_plugin_so() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let target_dir = profile_dir.parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "tcpx-test-plugin", "--target-dir"])
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().unwrap().success(),
        "building tcpx-test-plugin failed"
    );
    profile_dir.join("libtcpx_test_plugin.so")
}
