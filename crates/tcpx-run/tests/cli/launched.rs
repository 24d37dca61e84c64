//! Hosts emulated on this machine for real launchers (Slurm, Open MPI), and the checks of a plan
//! run they started.
//!
//! One network namespace the test creates holds everything the launcher starts: its daemons
//! bind every address by default, so they may only run where every address is the namespace's
//! loopback. `lo` is up with 127.0.0.1 and a second loopback address, 127.0.0.2 (without one
//! beyond 127.0.0.1 itself glibc's `AI_ADDRCONFIG` lookups in Slurm fail, "Unable to resolve
//! 127.0.0.1"). Each emulated host is a program run by `as-host NAME`: its own UTS namespace
//! (`hostname` says NAME, which is how slurmd finds its node) and mount namespace, where the
//! test's hosts file is bind-mounted over /etc/hosts (and an nsswitch.conf that looks names up in
//! files only, never DNS): `localhost` and `ctl` (the launching host)
//! are 127.0.0.1, node `nK` is 127.0.0.1K. So the launchers resolve their node names without
//! DNS, and nothing leaves the namespace. Every wait has a deadline; dropping [`Hosts`] stops
//! every process in the namespace (TERM, then KILL), deletes it and removes the directory, and
//! prints the daemons' logs when the test is failing.

use crate::harness::RunWithDeadline as _;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the launcher command `cmd` (`what`: `srun`, `mpirun`, ...) to its end, killing it past
/// 180 s: its output, and all it printed for assertion messages.
pub fn run_launcher(what: &str, cmd: &mut Command) -> (Output, String) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = crate::harness::output_within(child, Duration::from_secs(180))
        .unwrap_or_else(|o| panic!("{what} ran past 180 s: {}", crate::harness::text(&o)));
    let all = crate::harness::text(&out);
    (out, all)
}

/// Why this machine cannot run the launcher `programs` (the first missing one), if it cannot.
pub fn missing_program(programs: &[&str], package: &str) -> Option<String> {
    programs.iter().find_map(|p| {
        let found = std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
            .unwrap_or(false)
            || ["/usr/sbin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(p).is_file());
        (!found).then(|| {
            format!(
                "`{p}` not installed (Debian package {package}; ci/setup-debian.sh installs it)"
            )
        })
    })
}

/// `program` as found on PATH or in /usr/sbin (daemons live there and root's PATH may lack it).
pub fn program_path(program: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| Path::new("/usr/sbin").join(program))
}

/// The emulated hosts' names: `n1`, `n2`, ... (address 127.0.0.1K each).
pub fn node_names(n: usize) -> Vec<String> {
    (1..=n).map(|k| format!("n{k}")).collect()
}

/// A network namespace with the emulated hosts, a directory for their files, and the daemons
/// started in it.
pub struct Hosts {
    pub ns: String,
    pub dir: tempfile::TempDir,
    daemons: Vec<(String, Child)>,
    stopped: bool,
}

impl Hosts {
    /// Makes the namespace `tcpx-<tag>-<pid>` with `nodes` hosts `n1`..: `lo` up with 127.0.0.1
    /// and 127.0.0.2, the hosts file, the `as-host` wrapper and the `log/` directory.
    pub fn new(tag: &str, nodes: usize) -> Hosts {
        let ns = format!("tcpx-{tag}-{}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("log")).unwrap();
        let mut hosts = "127.0.0.1 localhost ctl\n".to_string();
        for (k, name) in node_names(nodes).iter().enumerate() {
            hosts.push_str(&format!("127.0.0.1{} {name}\n", k + 1));
        }
        std::fs::write(dir.path().join("hosts"), hosts).unwrap();
        // Names are looked up in that file only, never through DNS: this machine's nsswitch.conf
        // with its `hosts:` line replaced.
        let nsswitch = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
        let mut only_files: String = nsswitch
            .lines()
            .filter(|l| !l.trim_start().starts_with("hosts:"))
            .map(|l| format!("{l}\n"))
            .collect();
        only_files.push_str("hosts: files\n");
        std::fs::write(dir.path().join("nsswitch.conf"), only_files).unwrap();
        // $0 is the hosts file, $1 the host name, the rest the command.
        write_script(
            &dir.path().join("as-host"),
            "#!/bin/sh\n# as-host NAME CMD...: CMD as host NAME (own UTS and mount namespace, the test's hosts file, no DNS)\n\
             name=$1; shift\n\
             exec unshare --uts --mount sh -c 'mount --bind \"$0\" /etc/hosts && mount --bind \"$(dirname \"$0\")/nsswitch.conf\" /etc/nsswitch.conf && hostname \"$1\" && shift && exec \"$@\"' \"$(dirname \"$0\")/hosts\" \"$name\" \"$@\"\n",
        );
        let h = Hosts {
            ns,
            dir,
            daemons: Vec::new(),
            stopped: false,
        };
        let add = Command::new("ip")
            .args(["netns", "add", &h.ns])
            .output_with_deadline();
        let added = matches!(&add, Ok(o) if o.status.success());
        assert!(added, "ip netns add {}: {add:?}", h.ns);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["addr", "add", "127.0.0.2/8", "dev", "lo"],
        ] {
            let o = Command::new("ip")
                .args(["netns", "exec", &h.ns, "ip"])
                .args(&args)
                .output_with_deadline()
                .unwrap();
            assert!(o.status.success(), "ip {args:?} in {}: {o:?}", h.ns);
        }
        h
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `program args...` as host `host` inside the namespace.
    pub fn cmd(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns])
            .arg(self.path().join("as-host"))
            .arg(host)
            .arg(program);
        c
    }

    /// Starts a daemon in the foreground of `cmd`, its output going to `log/<name>.out`.
    pub fn start(&mut self, name: &str, mut cmd: Command) {
        let log =
            std::fs::File::create(self.path().join("log").join(format!("{name}.out"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.daemons.push((name.to_string(), child));
    }

    /// Polls `ready` (every 100 ms) until it is true, for at most `within`; panics naming `what`
    /// if it never is, or if a daemon exits meanwhile (with the logs, through the drop).
    pub fn wait_until(&mut self, what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        loop {
            if ready() {
                return;
            }
            for (name, child) in &mut self.daemons {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("{name} exited ({status}) while waiting for {what}");
                }
            }
            assert!(Instant::now() < deadline, "{what}: not within {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The processes left in the namespace.
    pub fn pids(&self) -> Vec<String> {
        let o = Command::new("ip")
            .args(["netns", "pids", &self.ns])
            .output_with_deadline()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        o.split_whitespace().map(str::to_string).collect()
    }

    /// Every log file of the daemons, with its name.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.path().join("log"))
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            out.push_str(&format!("==> {} (last 60 lines)\n", f.display()));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Stops every process in the namespace (TERM, up to 10 s, then KILL, up to 5 s), reaps the
    /// daemons and deletes the namespace: the processes still there after KILL (none expected).
    pub fn stop(&mut self) -> Vec<String> {
        self.stopped = true;
        for (signal, within) in [("-TERM", 10), ("-KILL", 5)] {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            let _ = Command::new("kill")
                .arg(signal)
                .args(&pids)
                .output_with_deadline();
            let gone = || self.pids().is_empty();
            tcpx_test_support::poll_until(
                Duration::from_secs(within),
                Duration::from_millis(50),
                gone,
            );
        }
        let left = self.pids();
        for (_, child) in &mut self.daemons {
            let ended = || !matches!(child.try_wait(), Ok(None));
            tcpx_test_support::poll_until(Duration::from_secs(5), Duration::from_millis(50), ended);
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .output_with_deadline();
        left
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the launcher's logs:\n{}", self.logs());
        }
        if !self.stopped {
            let left = self.stop();
            if !left.is_empty() {
                eprintln!("processes still in {} after KILL: {left:?}", self.ns);
            }
        }
    }
}

/// Writes an executable script to a temporary name, then renames it into place.
pub fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Open MPI's flags for these hosts: the out-of-band channel on `lo` only, TCP and self
/// transports (never used: tcpx-run does not call MPI_Init), no binding to cores (the emulated
/// hosts share this machine's), root allowed. No `--tag-output`: it tags each write, and one
/// line of tcpx-run's stderr may take several.
pub fn mpirun_args() -> Vec<&'static str> {
    vec![
        "--allow-run-as-root",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "--mca",
        "btl",
        "self,tcp",
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "--bind-to",
        "none",
    ]
}

/// Where `mpirun --output-filename DIR` put rank `rank`'s output: `DIR/<job>/rank.<rank>/`.
/// Each rank's own files, since on the shared stderr lines of different ranks can interleave
/// (one line of tcpx-run's stderr may take several writes). `(stdout, stderr)`, empty when
/// missing.
pub fn rank_output(dir: &Path, rank: u32) -> (String, String) {
    let jobs = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_else(|_| Vec::new());
    for job in jobs {
        let d = job.join(format!("rank.{rank}"));
        if d.is_dir() {
            let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
            return (read("stdout"), read("stderr"));
        }
    }
    (String::new(), String::new())
}

/// Checks the roles Open MPI's variables gave 4 ranks on `n1` (ranks 0, 1) and `n2` (2, 3),
/// each rank's output from `dir` (`--output-filename`): rank 0 leads and passes, rank 2
/// follows it at `n1`, ranks 1 and 3 exit at once, and no other rank leads or follows.
#[track_caller]
pub fn assert_open_mpi_roles(dir: &Path, all: &str) {
    let (out0, err0) = rank_output(dir, 0);
    for says in [
        "tcpx-run: waiting for a follower on 0.0.0.0:5310",
        "(run token proven both ways)",
    ] {
        assert!(
            err0.contains(says),
            "rank 0 should say `{says}`:\n{err0}\n{all}"
        );
    }
    assert!(
        out0.contains("plan launched: PASS"),
        "rank 0:\n{out0}\n{all}"
    );
    let (_, err2) = rank_output(dir, 2);
    assert!(
        err2.contains("tcpx-run: rank 2 (openmpi) follows the leader at n1:5310"),
        "rank 2:\n{err2}\n{all}"
    );
    for rank in [1, 3] {
        let (_, err) = rank_output(dir, rank);
        let says = format!("tcpx-run: rank {rank} is local rank 1 of its node under openmpi");
        assert!(
            err.contains(&says),
            "rank {rank} should say `{says}`:\n{err}\n{all}"
        );
    }
    for rank in [1, 2, 3] {
        let (_, err) = rank_output(dir, rank);
        assert!(
            !err.contains("waiting for a follower"),
            "rank {rank} leads too:\n{err}"
        );
    }
    for rank in [0, 1, 3] {
        let (_, err) = rank_output(dir, rank);
        assert!(
            !err.contains("follows the leader"),
            "rank {rank} follows too:\n{err}"
        );
    }
}

/// The run token the launched leader and follower share (the leader listens beyond loopback,
/// on every address of the namespace, as on a cluster).
pub const TOKEN: &str = "launched-run-token-0123456789";

/// A plan of one small experiment (1 MiB, 2 iterations, the receiver verifying every byte);
/// its criterion passes on any machine.
pub const PLAN: &str = "let b = experiment(#{ sizes: [\"1M\"], iters: 2, warmup: 0, sample: false });\nlet r = run(b);\ncriterion(\"server > 0.000001 GB/s\", r);\n";

/// Checks the one report directory under `reports`: the leader ran on host `leader_host` (where
/// the launcher placed rank 0, and where the others were told to find it), and every repetition
/// of the experiment ran (`ok`) with verification on, moved 1 MiB per iteration and saw no wrong
/// byte. Returns the number of repetitions.
#[track_caller]
pub fn assert_verified_report(reports: &Path, leader_host: &str, out: &str) -> usize {
    let dirs: Vec<PathBuf> = std::fs::read_dir(reports)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(
        dirs.len(),
        1,
        "only the leader writes a report: {dirs:?}\n{out}"
    );
    let json = std::fs::read_to_string(dirs[0].join("report.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        report["setup"]["host"], leader_host,
        "the leader's host in report.json\n{out}"
    );
    let records = report["records"]
        .as_array()
        .expect("records in report.json");
    assert!(!records.is_empty(), "no record: {json}");
    for r in records {
        assert_eq!(r["status"], "ok", "{r}\n{out}");
        assert_eq!(r["knobs"]["verify"], true, "{r}");
        assert_eq!(r["size"], 1_048_576, "{r}");
        assert_eq!(
            r["recv"]["wrong_bytes"], 0,
            "the receiver checked every byte: {r}"
        );
        assert_eq!(
            r["recv"]["iter_us"].as_array().map(Vec::len),
            Some(2),
            "two timed iterations received: {r}"
        );
    }
    records.len()
}
