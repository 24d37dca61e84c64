//! tcpx-test-support: helpers the crates' integration tests share, so that each lives once: the
//! workspace's test net plugin and the watch shim to put in front of it, the /proc and /sys
//! fixture trees and writable copies of them, and a writer that captures a log.
//!
//! For: `[dev-dependencies]` only. Not for: anything a shipped binary or library runs, nor
//! helpers one crate's tests alone use (those stay in that crate's `tests/common`, or in
//! tcpx-run's `tests/cli/harness.rs`). Helpers panic with what to check, as a test should; none
//! of them waits without a deadline.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The workspace's test net plugin (`libtcpx_test_plugin.so`): `TCPX_TEST_PLUGIN_SO` when set
/// (the GPU device bundle points it at its copy in `lib/`), else built with cargo into the calling
/// test's own target directory (a no-op when it is fresh), so `cargo test` alone suffices on a
/// clean clone.
pub fn test_plugin_so() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Some(p) = std::env::var_os("TCPX_TEST_PLUGIN_SO") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "TCPX_TEST_PLUGIN_SO={} is not a file: point it at libtcpx_test_plugin.so \
                 (the device bundle keeps it in lib/)",
                p.display()
            );
            return p;
        }
        build_cdylib("tcpx-test-plugin", "libtcpx_test_plugin.so")
    })
}

/// The watch shim (`crates/tcpx-watch-plugin`, `libtcpx_watch_plugin.so`), built like
/// [`test_plugin_so`] (or `TCPX_WATCH_PLUGIN_SO` when set).
pub fn watch_plugin_so() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Some(p) = std::env::var_os("TCPX_WATCH_PLUGIN_SO") {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "TCPX_WATCH_PLUGIN_SO={} is not a file: point it at libtcpx_watch_plugin.so",
                p.display()
            );
            return p;
        }
        build_cdylib("tcpx-watch-plugin", "libtcpx_watch_plugin.so")
    })
}

/// Installs the watch shim in `dir` under the name `NCCL_NET_PLUGIN=tcpxwatch` resolves
/// (`libnccl-net-tcpxwatch.so`, found through `LD_LIBRARY_PATH=dir`) and returns its path.
pub fn install_watch_plugin(dir: &Path) -> PathBuf {
    let to = dir.join("libnccl-net-tcpxwatch.so");
    std::fs::copy(watch_plugin_so(), &to)
        .unwrap_or_else(|e| panic!("copying the watch shim to {}: {e}", to.display()));
    to
}

/// Builds workspace package `package` (a cdylib) into the calling test's target directory and
/// returns the library `file` there.
fn build_cdylib(package: &str, file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in <target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("target dir");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", package, "--target-dir"])
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo to build {package}: {e}"));
    assert!(status.success(), "building {package} failed: {status}");
    let so = profile_dir.join(file);
    assert!(so.exists(), "{} missing after the build", so.display());
    so
}

/// The fixture tree `name` (a captured /proc and /sys) in tcpx-topo's tests/fixtures, the one
/// copy every crate's tests read.
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tcpx-topo/tests/fixtures")
        .join(name)
}

/// Copies the tree `from` into `to`, symlinks as symlinks (the /sys fixtures are made of them;
/// their relative targets stay inside the copy).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ty = entry.file_type().unwrap();
        if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ty.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A temporary directory on tmpfs (/dev/shm) when there is one: fixture copies are ~1,700 small
/// files, which a loaded disk creates slowly.
pub fn fast_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("tcpx-fixture-")
            .tempdir_in(shm)
        {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A writable copy of the fixture tree `name` in a [`fast_tempdir`]; keep the directory alive as
/// long as the copy is used.
pub fn writable_fixture(name: &str) -> tempfile::TempDir {
    let dir = fast_tempdir();
    copy_tree(&fixture_dir(name), dir.path());
    dir
}

/// Bytes written through any of its clones, for reading a log back (a tracing subscriber's
/// writer, say).
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// What was written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        bytes.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An environment as a lookup (`get(name)`) from a table of `(name, value)`, for code that reads
/// its variables through a function rather than from the process (a launcher's environment, a
/// backend's settings).
pub fn env_lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

/// Asks `done` every `poll` until it says yes or `limit` has passed: whether it said yes.
pub fn poll_until(limit: Duration, poll: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(poll);
    }
}

/// Waits for `child` to exit, polling every `poll`, for at most `limit`: its exit status, or
/// `None` once the limit passed, the child then killed and reaped (the caller panics with what
/// it waited for).
pub fn wait_within(child: &mut Child, limit: Duration, poll: Duration) -> Option<ExitStatus> {
    let mut status = None;
    if poll_until(limit, poll, || {
        status = child.try_wait().unwrap();
        status.is_some()
    }) {
        return status;
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Checks that `text` (a command's output, a report) says each of `says`, naming the first it
/// lacks and showing the whole text.
#[track_caller]
pub fn assert_says(text: &str, says: &[&str]) {
    for s in says {
        assert!(text.contains(s), "should say `{s}`:\n{text}");
    }
}
