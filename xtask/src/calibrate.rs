//! `cargo xtask calibrate`: the calibration benchmark of the verdict statistics (issue 24) on
//! effects of known size: the emulated fabric's NICs at 1.0 / 1.25 / 1.1 / 1.0 Gbit/s (A/A,
//! +25 %, +10 %) and the loopback window 1 vs 16 effect (about 2.4x), each compared many times
//! with the sequential design plans use. It runs the ignored `calibration_full` test of
//! `crates/tcpx-run/tests/calibration.rs` (root: it builds network namespaces), which prints the
//! figures and fails when a goal is missed. The small version of the same runs in CI.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// A/A comparisons (goal: at most 5 % name a winner, over at least 40).
    #[arg(long, default_value_t = 40)]
    aa: u32,
    /// +25 % comparisons (goal: at least 90 % decided correctly within the default budget).
    #[arg(long, default_value_t = 20)]
    e25: u32,
    /// +10 % comparisons (reported; goal at least 50 %).
    #[arg(long, default_value_t = 20)]
    e10: u32,
    /// Loopback window 1 vs 16 comparisons (goal: all decided correctly).
    #[arg(long, default_value_t = 20)]
    loopback: u32,
    /// Build and run in release mode (slower to build, less CPU per transfer).
    #[arg(long)]
    release: bool,
}

pub fn run(root: &Path, a: CalibrateArgs) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(root)
        .args(["test", "-p", "tcpx-run", "--test", "calibration"]);
    if a.release {
        c.arg("--release");
    }
    c.args([
        "--",
        "--ignored",
        "--nocapture",
        "--exact",
        "calibration_full",
    ])
    .env("TCPX_CAL_AA", a.aa.to_string())
    .env("TCPX_CAL_25", a.e25.to_string())
    .env("TCPX_CAL_10", a.e10.to_string())
    .env("TCPX_CAL_LOOPBACK", a.loopback.to_string());
    let status = c
        .status()
        .context("running cargo test for the calibration (is cargo on PATH?)")?;
    if !status.success() {
        bail!("the calibration failed or missed a goal (its output above says which); it needs root and iproute2 for the fabric");
    }
    Ok(())
}
