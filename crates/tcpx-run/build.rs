//! Puts the git commit the binary was built from into `TCPX_GIT_COMMIT` for `--version` and
//! `--json` (`unknown` outside a git checkout, e.g. from a source tarball).

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TCPX_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves (a commit, a checkout); the ref HEAD points to changes on commit.
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={head}");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            if let Some(p) = git(&["rev-parse", "--git-path", &r]) {
                if Path::new(&p).exists() {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
