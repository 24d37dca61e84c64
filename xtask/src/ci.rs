//! `cargo xtask ci`: what CI runs, in order: format check, clippy with warnings denied, every test,
//! then the `tcpx_lab` Python package: its wheel built by maturin, installed into the venv
//! `ci/setup-debian.sh` made (target/py-venv, or $TCPX_PY_VENV), and its pytest suite.
//! GPU tests on a machine without a GPU print `SKIP: ...`; those lines are collected and listed
//! at the end so that the log says what was not exercised.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Result};

fn step(root: &Path, what: &str, args: &[&str]) -> Result<()> {
    eprintln!("==> cargo {}", args.join(" "));
    let st = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(args)
        .status()?;
    if !st.success() {
        bail!("{what} failed (cargo {})", args.join(" "));
    }
    Ok(())
}

pub fn run(root: &Path) -> Result<()> {
    step(root, "format check", &["fmt", "--all", "--", "--check"])?;
    step(
        root,
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // Every test binary runs even after one fails, so that one CI run lists every failure.
    eprintln!("==> cargo test --workspace --no-fail-fast");
    let mut child = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .stderr(Stdio::piped())
        .spawn()?;
    let mut skipped = Vec::new();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines() {
            let line = line?;
            if line.starts_with("SKIP:") {
                skipped.push(line.clone());
            }
            eprintln!("{line}");
        }
    }
    let st = child.wait()?;
    eprintln!("\n==> tests skipped on this machine ({}):", skipped.len());
    for s in &skipped {
        eprintln!("    {s}");
    }
    if !st.success() {
        bail!("tests failed");
    }
    python_tests(root)?;
    eprintln!("==> all checks passed");
    Ok(())
}

fn run_in(root: &Path, what: &str, exe: &Path, args: &[&str]) -> Result<()> {
    eprintln!("==> {} {}", exe.display(), args.join(" "));
    let mut cmd = Command::new(exe);
    cmd.current_dir(root).args(args);
    // run_plan's test uses the tcpx-run that `cargo test --workspace` built.
    let tcpx_run = root.join("target/debug/tcpx-run");
    if tcpx_run.is_file() {
        cmd.env("TCPX_RUN", tcpx_run);
    }
    let st = cmd.status();
    match st {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => bail!("{what} failed ({s})"),
        Err(e) => bail!("{what}: could not run {}: {e}", exe.display()),
    }
}

/// Builds the `tcpx_lab` wheel (dev profile, so it reuses what `cargo test` just compiled),
/// installs it into the CI venv and runs pytest on crates/tcpx-py/tests.
pub fn python_tests(root: &Path) -> Result<()> {
    let venv = std::env::var_os("TCPX_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/py-venv"));
    let bin = venv.join("bin");
    if !bin.join("maturin").is_file() || !bin.join("python").is_file() {
        bail!(
            "no Python venv with maturin at {}: run `bash ci/setup-debian.sh` (it makes one)",
            venv.display()
        );
    }
    let wheels = root.join("target/py-wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    let wheels_arg = wheels.to_string_lossy().into_owned();
    run_in(
        root,
        "building the tcpx_lab wheel",
        &bin.join("maturin"),
        &[
            "build",
            "--profile",
            "dev",
            "-m",
            "crates/tcpx-py/Cargo.toml",
            "-o",
            &wheels_arg,
        ],
    )?;
    let wheel = std::fs::read_dir(&wheels)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| anyhow::anyhow!("maturin wrote no wheel into {}", wheels.display()))?;
    let wheel_arg = wheel.to_string_lossy().into_owned();
    run_in(
        root,
        "installing the tcpx_lab wheel",
        &bin.join("python"),
        &[
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--force-reinstall",
            "--no-deps",
            &wheel_arg,
        ],
    )?;
    run_in(
        root,
        "pytest (crates/tcpx-py/tests)",
        &bin.join("python"),
        &[
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "crates/tcpx-py/tests",
        ],
    )
}
