//! `cargo xtask ci`: what CI runs, in order: format check, clippy with warnings denied, every test.
//! GPU tests on a machine without a GPU print `SKIP: ...`; those lines are collected and listed
//! at the end so that the log says what was not exercised.

use std::io::{BufRead, BufReader};
use std::path::Path;
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
    eprintln!("==> cargo test --workspace");
    let mut child = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["test", "--workspace"])
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
    eprintln!("==> all checks passed");
    Ok(())
}
