//! The harness every CLI test uses: the binary under test, a deadline on every run, plan
//! directories made from the real target sets, assertions on how a run ended, and the fixtures
//! the modules share (the emulated fabric, free loopback ports, the test net plugin).
//!
//! A run of a command goes through [`TestCmd`] (tcpx-run with arguments, environment, a working
//! directory and its own deadline) or, for a hand-built [`Command`] (another program, a run
//! under `ip netns exec`), through [`RunWithDeadline::output_with_deadline`]: either way stdin is
//! closed, stdout and stderr are captured, and a run past its deadline is killed and fails the
//! test with what it printed, so that a hang costs one test, not the whole suite.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::Duration;

/// How long one run of a command may take unless the test sets its own deadline: a run past it
/// is hung. The longest runs are the real plans of `plan` and `plan_modes` (phase2_single_process
/// estimates itself at up to 362 s if every comparison needs its most rounds, on an idle machine)
/// and the launchers' (180 s); on the 2-core CI machine, shared with the other tests, a run takes
/// up to twice as long.
pub const DEADLINE: Duration = Duration::from_secs(900);

/// [`Command::output`] with a deadline: stdin closed, stdout and stderr captured, the child
/// killed past [`DEADLINE`] (the test then fails with what it had printed).
pub trait RunWithDeadline {
    /// Runs the command to its end within [`DEADLINE`]; an error only when it cannot start.
    fn output_with_deadline(&mut self) -> std::io::Result<Output>;
}

impl RunWithDeadline for Command {
    #[track_caller]
    fn output_with_deadline(&mut self) -> std::io::Result<Output> {
        let child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(output_within(child, DEADLINE).unwrap_or_else(|out| {
            panic!(
                "{:?}: no end within {DEADLINE:?}, killed; {}",
                self.get_program(),
                text(&out)
            )
        }))
    }
}

/// One run of `tcpx-run` to build: arguments, environment, working directory and deadline
/// ([`DEADLINE`] unless [`TestCmd::deadline`] sets another). `RUST_LOG` is removed, so that a
/// developer's setting cannot change what a test reads.
pub struct TestCmd {
    cmd: Command,
    deadline: Duration,
}

/// `tcpx-run` with no arguments yet, as a [`TestCmd`].
pub fn tcpx_run() -> TestCmd {
    TestCmd::new::<&str>([])
}

impl TestCmd {
    /// `tcpx-run args...`.
    pub fn new<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> TestCmd {
        let mut cmd = Command::new(bin());
        cmd.args(args).env_remove("RUST_LOG");
        TestCmd {
            cmd,
            deadline: DEADLINE,
        }
    }

    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut TestCmd {
        self.cmd.arg(a);
        self
    }

    pub fn args<S: AsRef<OsStr>>(&mut self, args: impl IntoIterator<Item = S>) -> &mut TestCmd {
        self.cmd.args(args);
        self
    }

    pub fn env(&mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> &mut TestCmd {
        self.cmd.env(k, v);
        self
    }

    pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        &mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> &mut TestCmd {
        self.cmd.envs(vars);
        self
    }

    pub fn env_remove(&mut self, k: impl AsRef<OsStr>) -> &mut TestCmd {
        self.cmd.env_remove(k);
        self
    }

    pub fn current_dir(&mut self, d: impl AsRef<Path>) -> &mut TestCmd {
        self.cmd.current_dir(d);
        self
    }

    /// Kill the run past `d` instead of [`DEADLINE`].
    pub fn deadline(&mut self, d: Duration) -> &mut TestCmd {
        self.deadline = d;
        self
    }

    /// Runs it to its end (stdin closed, output captured); past the deadline the run is killed
    /// and the test fails with what it printed. A panic of tcpx-run fails the test whatever its
    /// status (no input may make it panic).
    #[track_caller]
    pub fn run(&mut self) -> Output {
        let child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin()));
        let out = output_within(child, self.deadline).unwrap_or_else(|out| {
            panic!(
                "tcpx-run {:?}: no end within {:?}, killed; {}",
                self.cmd.get_args().collect::<Vec<_>>(),
                self.deadline,
                text(&out)
            )
        });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked"),
            "no panic on any input: {}",
            text(&out)
        );
        out
    }

    /// Runs it and checks that it exited with 0: its stdout and stderr.
    #[track_caller]
    pub fn ok(&mut self) -> (String, String) {
        let out = self.run();
        let stdout = stdout_ok(&out);
        (stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Runs it and checks that it was refused (exit 2) saying each of `says`: its stderr.
    #[track_caller]
    pub fn refused(&mut self, says: &[&str]) -> String {
        assert_refused(&self.run(), says)
    }
}

/// A temporary directory for one test, removed when dropped: a plan directory with the real
/// target sets and common module ([`Dir::plan`]), reports, CSV files.
pub struct Dir {
    tmp: tempfile::TempDir,
}

impl Dir {
    pub fn new() -> Dir {
        Dir {
            tmp: tempfile::tempdir().expect("a temporary directory (is TMPDIR writable?)"),
        }
    }

    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.tmp.path().join(p)
    }

    /// Writes plan `name.rhai` with `src` here, beside the real target sets (`targets/`) and
    /// common.rhai: its path.
    pub fn plan(&self, name: &str, src: &str) -> PathBuf {
        write_plan_dir(self.path(), name, src)
    }
}

impl Default for Dir {
    fn default() -> Dir {
        Dir::new()
    }
}

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
    let p = write_plan_dir(d.path(), name, src);
    (d, p)
}

/// Writes `name.rhai` into `dir` beside copies of the real target sets (`targets/`) and
/// common.rhai: the plan's path.
fn write_plan_dir(dir: &Path, name: &str, src: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("targets")).unwrap();
    for t in ["loopback.toml", "a3-high.toml"] {
        std::fs::copy(plans().join("targets").join(t), dir.join("targets").join(t)).unwrap();
    }
    std::fs::copy(plans().join("common.rhai"), dir.join("common.rhai")).unwrap();
    let p = dir.join(format!("{name}.rhai"));
    std::fs::write(&p, src).unwrap();
    p
}

pub use tcpx_test_support::{assert_says, copy_tree, fast_tempdir, fixture_dir, test_plugin_so};

/// `tcpx-run <plan> --reports <reports>`: a run of plan `plan` that writes its reports under
/// `reports`, for a test to add its own arguments to.
pub fn plan_command(plan: &Path, reports: &Path) -> Command {
    let mut c = Command::new(bin());
    c.arg(plan).arg("--reports").arg(reports);
    c
}

/// Reads a leader's stderr until it says where it waits for its follower, and returns that
/// address (panics with what it printed if it does not say so within 20 lines).
pub fn leader_address(err: &mut BufReader<ChildStderr>) -> String {
    let mut seen = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
        if let Some(a) = line
            .trim()
            .strip_prefix("tcpx-run: waiting for a follower on ")
        {
            return a.to_string();
        }
    }
    panic!("leader did not say where it listens: {seen}")
}

/// Starts `cmd` with its stdout going to `stdout` and its stderr piped: the process and its
/// stderr, to read line by line.
pub fn spawn_reading_stderr(cmd: &mut Command, stdout: Stdio) -> (Child, BufReader<ChildStderr>) {
    let mut child = cmd.stdout(stdout).stderr(Stdio::piped()).spawn().unwrap();
    let err = BufReader::new(child.stderr.take().unwrap());
    (child, err)
}

/// Starts plan `plan` as a leader listening on a free loopback port for up to 60 s, with `args`
/// after its own, writing its reports under `reports`: the process, its stderr past the line
/// that says where it waits, and that address.
pub fn spawn_leader(
    plan: &Path,
    args: &[&str],
    reports: &Path,
) -> (Child, BufReader<ChildStderr>, String) {
    let (leader, mut err) = spawn_reading_stderr(
        plan_command(plan, reports)
            .args(["--listen", "127.0.0.1:0", "--follower-timeout", "60"])
            .args(args),
        Stdio::piped(),
    );
    let addr = leader_address(&mut err);
    (leader, err, addr)
}

/// Waits for `child` (on another thread, so a hang cannot stall the test) for at most
/// `deadline`. Past it, kills the child and returns what it had printed as the error.
pub fn output_within(child: Child, deadline: std::time::Duration) -> Result<Output, Output> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(out) => Ok(out.expect("wait for tcpx-run")),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            Err(rx
                .recv()
                .expect("the killed run's output")
                .expect("its output"))
        }
    }
}

/// Runs `cmd` (stdin closed, output piped), killing it past `deadline`; checks that it exited
/// with 0 and returns its stdout and stderr. `what` names the run in the messages.
pub fn run_ok_within(
    what: &str,
    cmd: &mut Command,
    deadline: std::time::Duration,
) -> (String, String) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tcpx-run");
    let out = output_within(child, deadline).unwrap_or_else(|out| {
        panic!(
            "{what}: no end within {deadline:?}, killed; stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}:\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// How a finished command went (status, stdout, stderr), for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Checks that a finished command succeeded; returns its stdout.
#[track_caller]
pub fn stdout_ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", text(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Checks that a finished command was refused (exit code 2) and that its stderr says each of
/// `says`; returns that stderr for further checks.
#[track_caller]
pub fn assert_refused(o: &Output, says: &[&str]) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    for s in says {
        assert!(err.contains(s), "stderr should say `{s}`: {}", text(o));
    }
    err
}

/// Why the emulated-fabric tests cannot run here (not root, or `ip netns` unusable), or `None`.
pub fn netns_skip_reason() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        return Some(format!("not root (euid {uid:?})"));
    }
    match Command::new("ip")
        .args(["-j", "netns", "list"])
        .output_with_deadline()
    {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("`ip` not runnable: {e}")),
    }
}

/// Whether a test that needs namespaces must skip here: then it says so visibly (`SKIP: <test>:
/// <reason>` on the process's stderr, past libtest's capture, where `cargo xtask ci` lists it).
pub fn skip_without_netns(test: &str) -> bool {
    let Some(why) = netns_skip_reason() else {
        return false;
    };
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIP: {test}: {why}");
    true
}

/// Returns from the test when it must skip for want of namespaces ([`skip_without_netns`]).
/// (`#[macro_use] mod harness;` in main.rs brings it to every module.)
macro_rules! require_netns {
    ($test:expr) => {
        if $crate::harness::skip_without_netns($test) {
            return;
        }
    };
}

/// The receiver's GB/s (all timed iterations' bytes over their time) of the first measurement
/// in the JSON line of `tcpx-run bench --json`'s stdout; `None` without one.
pub fn recv_gbs(stdout: &str) -> Option<f64> {
    let json = stdout.lines().find(|l| l.starts_with('{'))?;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v["measurements"][0]["recv"]["algbw_gbs"].as_f64()
}

/// A fabric id with its own state directory; `fabric down` when dropped, pass or fail.
pub struct FabricGuard {
    /// The test's name for the fabric and this process's id (hex): namespaces are global, so two
    /// test runs on one machine must not bring up the same names.
    pub id: &'static str,
    pub state: tempfile::TempDir,
}

impl FabricGuard {
    pub fn new(name: &str) -> FabricGuard {
        let id = format!("{name}-{:x}", std::process::id());
        assert!(
            id.len() <= 20,
            "fabric id {id} is longer than fabric up takes"
        );
        FabricGuard {
            // Leaked (a few bytes per test) so that call sites pass it along like a literal.
            id: Box::leak(id.into_boxed_str()),
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// A fabric named `name` brought up with `fabric up --id <id> <args>` (which must succeed).
    pub fn up(name: &str, args: &[&str]) -> FabricGuard {
        let f = FabricGuard::new(name);
        let up = f.run(&[&["up", "--id", f.id], args].concat());
        assert!(up.status.success(), "{}", text(&up));
        f
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        // --state-dir right after the subcommand: `exec` takes everything after `--` as its command.
        c.arg("fabric").arg(args[0]);
        c.arg("--state-dir").arg(self.state.path());
        c.args(&args[1..]);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output_with_deadline().unwrap()
    }

    /// The namespace of `node` ('a' or 'b').
    pub fn ns(&self, node: char) -> String {
        format!("tcpx-{node}-{}", self.id)
    }

    /// The namespace of the switch (fabrics of more than two nodes).
    pub fn switch_ns(&self) -> String {
        format!("tcpx-sw-{}", self.id)
    }

    /// One `tcpx-run <bench_args>` from node A to node B: the server in node B on `port`, the
    /// client in node A with `--json`, each side on its addresses on the NICs `nics` (0-based).
    /// Both must succeed (the test fails with what both said): the client's stdout.
    pub fn bench(&self, bench_args: &[&str], nics: &[u32], port: u16) -> String {
        let addrs = |host: u8| {
            nics.iter()
                .map(|k| format!("10.231.{k}.{host}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut server = Command::new("ip");
        server
            .args(["netns", "exec", &self.ns('b'), bin()])
            .args(bench_args)
            .args(["--role", "server", "--peer", "10.231.0.2", "--port"])
            .arg(port.to_string())
            .arg("--nics")
            .arg(addrs(2))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // A server left running by a failed assertion is killed by the guard's `fabric down`.
        let mut server = server.spawn().unwrap();
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns('a'), bin()])
            .args(bench_args)
            .args(["--role", "client", "--json", "--peer"])
            .arg(format!("10.231.0.2:{port}"))
            .arg("--nics")
            .arg(addrs(1))
            .output_with_deadline()
            .unwrap();
        if !out.status.success() {
            let _ = server.kill();
        }
        let server_out = server
            .wait_with_output()
            .map_or_else(|e| format!("(not collected: {e})"), |o| text(&o));
        assert!(
            out.status.success(),
            "client: {}\nserver: {server_out}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for FabricGuard {
    fn drop(&mut self) {
        let _ = self.run(&["down", "--id", self.id]);
    }
}

/// A base port with `n` free ports after it on 127.0.0.1 (checked by binding them; released
/// before use). The CLI tests run in parallel in one process: each call starts elsewhere.
/// The ports lie outside the kernel's ephemeral range, so no outgoing connection of another
/// test (whose source port comes from that range) can take one between the check and the use.
pub fn free_ports(n: u16) -> u16 {
    static CALLS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let seed = (std::process::id() as u16)
        .wrapping_mul(7)
        .wrapping_add(call.wrapping_mul(1009));
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut w = t.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((w.next()??, w.next()??))
        })
        .unwrap_or((32768, 60999));
    // The larger stretch outside [lo, hi] within 10000..65000.
    let (start, len) = if lo.saturating_sub(10000) >= 65000u16.saturating_sub(hi) {
        (10000, lo.saturating_sub(10000))
    } else {
        (hi.saturating_add(1), 65000u16.saturating_sub(hi))
    };
    assert!(
        len > n.saturating_mul(4),
        "the ephemeral port range {lo}-{hi} leaves no room for test ports"
    );
    for k in 0..200u16 {
        let base = start + (seed.wrapping_add(k.wrapping_mul(97)) % (len - n));
        let held: Vec<_> = (0..n)
            .map_while(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} consecutive free ports found");
}
