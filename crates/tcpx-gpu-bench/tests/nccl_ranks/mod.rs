//! NCCL ranks of a test as processes of their own on one GPU: the test executable starts itself
//! once per rank (`--exact <test>`), each child with [`RANK_ENV`] set and its own `NCCL_HOSTID`
//! (tcpx_transport's shared-GPU assignment), so NCCL sees 2 hosts and uses its network
//! transport; a test's body asks [`this_rank`] which part it plays. A child prints
//! [`DONE`] and its rank when its part passed, so a child that skipped or ran nothing fails the
//! parent.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in a rank process: its rank.
pub const RANK_ENV: &str = "TCPX_TEST_NCCL_RANK";
/// What a rank process prints (with its rank) once its part passed.
pub const DONE: &str = "TCPX_TEST_RANK_DONE";
/// Rank 0 prints this, then its listen handles in hex, for rank 1 (set in [`HANDLES_ENV`]).
pub const HANDLES: &str = "TCPX_TEST_HANDLES";
pub const HANDLES_ENV: &str = "TCPX_TEST_NCCL_HANDLES";

/// The rank this process plays, when it is a rank process.
pub fn this_rank() -> Option<usize> {
    std::env::var(RANK_ENV).ok().and_then(|r| r.parse().ok())
}

/// Said by a rank process whose part passed.
pub fn done(rank: usize) {
    println!("{DONE} {rank}");
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex from rank 0"))
        .collect()
}

/// A started rank process and what it printed (read on a thread of its own).
pub struct Rank {
    pub rank: usize,
    child: Child,
    lines: mpsc::Receiver<String>,
    out: Vec<String>,
}

/// Starts rank `rank` of `test` (this executable, `--exact test`) as NCCL host `rank` with the
/// extra environment `env`.
pub fn start(test: &str, rank: usize, env: &[(&str, String)]) -> Rank {
    let ids = tcpx_transport::nccl::shared_gpu_host_ids(2);
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(RANK_ENV, rank.to_string())
        .env(tcpx_transport::nccl::HOSTID_VAR, &ids[rank])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .expect("starting a rank process (this test executable)");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Rank {
        rank,
        child,
        lines,
        out: Vec::new(),
    }
}

impl Rank {
    /// What follows `prefix` on the first line holding it, waiting until `deadline`.
    pub fn line(&mut self, prefix: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) => {
                    // The test harness may have printed "test NAME ... " on the same line.
                    let rest = l
                        .find(prefix)
                        .map(|i| l[i + prefix.len()..].trim().to_string());
                    self.out.push(l);
                    if rest.is_some() {
                        return rest;
                    }
                }
                Err(_) => return None,
            }
        }
    }
}

/// Waits for every rank until `limit` from now; a rank still running then is killed. Panics,
/// naming the rank and its output, unless each exited 0 having said it was done.
pub fn finish(mut ranks: Vec<Rank>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut why = Vec::new();
    for r in ranks.iter_mut() {
        let status = loop {
            match r.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    break None;
                }
            }
        };
        // What it printed, until its stdout closed.
        while let Ok(l) = r.lines.recv_timeout(Duration::from_secs(5)) {
            r.out.push(l);
        }
        // After the harness's "test NAME ... " on the same line, or on a line of its own.
        let said_done = r
            .out
            .iter()
            .any(|l| l.trim_end().ends_with(&format!("{DONE} {}", r.rank)));
        match status {
            Some(s) if s.success() && said_done => {}
            Some(s) => why.push(format!(
                "rank {} exited with {s}, done said: {said_done}; stdout:\n{}",
                r.rank,
                r.out.join("\n")
            )),
            None => why.push(format!(
                "rank {} did not finish within {limit:?} and was killed; stdout:\n{}",
                r.rank,
                r.out.join("\n")
            )),
        }
    }
    assert!(why.is_empty(), "{}", why.join("\n"));
}

/// A free port on 127.0.0.1 for `NCCL_COMM_ID` (the kernel's pick, let go just before use).
pub fn comm_id() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

/// Runs `test` as rank 0 and rank 1 meeting at one `NCCL_COMM_ID`, within `limit`.
pub fn run_pair(test: &str, limit: Duration) {
    let id = comm_id();
    let r0 = start(test, 0, &[("NCCL_COMM_ID", id.clone())]);
    let r1 = start(test, 1, &[("NCCL_COMM_ID", id)]);
    finish(vec![r0, r1], limit);
}
