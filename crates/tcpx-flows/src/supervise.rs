//! The multi-process supervisor: one child process per flow (per GPU), as the C++
//! `run_p2p_fullmesh.sh` starts one benchmark per GPU.
//!
//! [`supervise`] starts every [`ChildSpec`], waits for them, and reads each one's
//! [`ChildReport`] once it ended. When one fails it stops the others (SIGTERM, then SIGKILL after
//! [`STOP_GRACE`]) and reports which flow failed, how, and the end of its error output. A child
//! whose report says its peer went away ([`ChildErrorKind::PeerGone`]) is an echo, not a cause:
//! the others get [`ECHO_GRACE`] to fail on their own first. The child's experiment carries the
//! parent's `flows`, so a node started with another flow count is refused by the handshake with
//! both values.
//!
//! Invariant: every child started is ended and reaped before `supervise` returns.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::path::PathBuf;

use tcpx_bench::{BenchError, Experiment, Measurement};

use crate::report::{ChildErrorKind, ChildReport};
use crate::supervisor::{Cause, Ended, SupAction, SupEvent, Supervisor, Verdict};
pub use crate::supervisor::{ECHO_GRACE, STOP_GRACE};

/// One child to start.
pub struct ChildSpec {
    /// The flow (GPU index) it carries.
    pub flow: u32,
    /// `server` or `client`, for messages.
    pub role: String,
    /// The full command; the process writes its [`ChildReport`] to `report`.
    pub command: Command,
    /// Where the process writes its report.
    pub report: PathBuf,
    /// The experiment it was given, which its report's figures are checked against.
    pub asked: Experiment,
}

/// What a child that finished well reported.
#[derive(Debug, Clone)]
pub struct ChildResult {
    pub flow: u32,
    pub role: String,
    pub pid: u32,
    pub measurements: Vec<Measurement>,
    /// Which NICs its channels used, when the experiment named NICs.
    pub nic_plan: Option<String>,
}

struct Running {
    flow: u32,
    role: String,
    pid: u32,
    child: Child,
    report_path: PathBuf,
    asked: Experiment,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    /// Stdout and stderr once read to the end (after the child ended).
    collected: Option<(String, String)>,
    status: Option<ExitStatus>,
}

impl Running {
    fn label(&self) -> String {
        format!("flow {} ({}, pid {})", self.flow, self.role, self.pid)
    }

    /// Everything the child printed; call only once it ended (the readers run to end of file).
    fn outputs(&mut self) -> (String, String) {
        let take =
            |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        if self.collected.is_none() {
            self.collected = Some((take(self.out.take()), take(self.err.take())));
        }
        self.collected.clone().unwrap_or_default()
    }

    /// The report the child wrote; call only once it ended.
    fn report(&self) -> Result<ChildReport, String> {
        ChildReport::read(&self.report_path)
    }

    /// Whether the child ended by saying that its peer went away: a consequence of a failure
    /// elsewhere rather than a cause.
    fn is_echo(&self) -> bool {
        self.report()
            .ok()
            .and_then(|r| r.error)
            .is_some_and(|e| e.kind == ChildErrorKind::PeerGone)
    }

    /// Whether the child refused the experiment as invalid here (it ran nothing).
    fn is_invalid(&self) -> bool {
        self.report()
            .ok()
            .and_then(|r| r.error)
            .is_some_and(|e| e.kind == ChildErrorKind::Invalid)
    }
}

/// A thread collecting `pipe`; an error (not a panic) when no thread can be started, as under
/// a low address-space limit (issue 43 item 10).
fn reader(mut pipe: impl Read + Send + 'static) -> std::io::Result<JoinHandle<String>> {
    std::thread::Builder::new()
        .name("flow-output".into())
        .spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// Starts every child, waits until all finished or `limit` passed, and returns their results in
/// the order given. The first child to fail stops the rest; the error names it, says how it
/// ended with the end of its error output, and lists the children that were stopped.
pub fn supervise(specs: Vec<ChildSpec>, limit: Duration) -> Result<Vec<ChildResult>, BenchError> {
    supervise_until(specs, limit, &mut || None)
}

/// [`supervise`], also asking `stop` in every polling round (every 20 ms) whether to stop all
/// children early: when it returns a reason, the children still running are stopped and the
/// error starts with that reason. Used where news from outside ends the run sooner than the
/// children would notice, such as the other node's processes having failed before these ones
/// connected (they would retry until their timeout).
pub fn supervise_until(
    specs: Vec<ChildSpec>,
    limit: Duration,
    stop: &mut dyn FnMut() -> Option<String>,
) -> Result<Vec<ChildResult>, BenchError> {
    let mut children: Vec<Running> = Vec::with_capacity(specs.len());
    let mut not_started: Option<String> = None;
    for mut spec in specs {
        spec.command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match spec.command.spawn() {
            Ok(mut child) => {
                let out = child.stdout.take().map(reader).transpose();
                let err = child.stderr.take().map(reader).transpose();
                let (out, err) = match (out, err) {
                    (Ok(out), Ok(err)) => (out, err),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        not_started = Some(format!(
                            "could not start a thread reading the output of flow {} ({}): {e} (out of memory or threads: is the address-space limit, ulimit -v, too low?)",
                            spec.flow, spec.role,
                        ));
                        break;
                    }
                };
                children.push(Running {
                    flow: spec.flow,
                    role: spec.role,
                    pid: child.id(),
                    report_path: spec.report,
                    asked: spec.asked,
                    child,
                    out,
                    err,
                    collected: None,
                    status: None,
                });
            }
            Err(e) => {
                not_started = Some(format!(
                    "could not start the process for flow {} ({}): {e} (is {:?} executable?)",
                    spec.flow,
                    spec.role,
                    spec.command.get_program(),
                ));
                break;
            }
        }
    }
    let mut machine = Supervisor::new(children.len(), limit, Instant::now());
    let mut actions = match not_started {
        Some(why) => machine.handle(SupEvent::StopRequested(why), Instant::now()),
        None => Vec::new(),
    };
    // The driver: poll exits (the children do the work and time out on their own), ask for
    // outside news while watching, carry out the machine's signals.
    let verdict = 'run: loop {
        for action in std::mem::take(&mut actions) {
            match action {
                SupAction::Terminate(which) => {
                    for i in which {
                        // Not reaped yet (we hold it), so its pid cannot have been reused.
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(children[i].pid as i32),
                            nix::sys::signal::Signal::SIGTERM,
                        );
                    }
                }
                SupAction::Kill(which) => {
                    let mut batch = Vec::new();
                    for i in which {
                        let _ = children[i].child.kill();
                        children[i].status = children[i].child.wait().ok();
                        batch.push((i, ended(&children[i])));
                    }
                    actions.extend(machine.handle(SupEvent::Exited(batch), Instant::now()));
                }
                SupAction::Finished(v) => break 'run v,
            }
        }
        if !actions.is_empty() {
            continue;
        }
        let mut batch = Vec::new();
        for (i, c) in children.iter_mut().enumerate() {
            if c.status.is_some() {
                continue;
            }
            match c.child.try_wait() {
                Ok(Some(s)) => {
                    c.status = Some(s);
                    batch.push((i, ended(c)));
                }
                Ok(None) => {}
                Err(_) => {
                    // Cannot be waited for: count it as failed; the kill below reaps it.
                    let _ = c.child.kill();
                    c.status = c.child.wait().ok();
                    batch.push((i, ended(c)));
                }
            }
        }
        let now = Instant::now();
        if !batch.is_empty() {
            actions = machine.handle(SupEvent::Exited(batch), now);
        } else if machine.poll_timeout().is_some_and(|t| now >= t) {
            actions = machine.handle(SupEvent::Timeout, now);
        } else if machine.watching() {
            if let Some(reason) = stop() {
                actions = machine.handle(SupEvent::StopRequested(reason), now);
            }
        }
        if actions.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    describe_verdict(children, verdict, limit)
}

/// How a child that ended did, for the machine.
fn ended(c: &Running) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    let success = c.status.is_some_and(|s| s.success());
    Ended {
        success,
        signalled: c.status.is_some_and(|s| s.signal().is_some()),
        echo: !success && c.is_echo(),
    }
}

/// The results, or the error naming who failed, how, and who was stopped.
fn describe_verdict(
    mut children: Vec<Running>,
    v: Verdict,
    limit: Duration,
) -> Result<Vec<ChildResult>, BenchError> {
    let stopped = if v.stopped.is_empty() {
        "none (all had ended)".to_string()
    } else {
        v.stopped
            .iter()
            .map(|&(i, killed)| {
                let l = children[i].label();
                if killed {
                    format!("{l} (SIGKILL)")
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let said = |err: &str, lines: usize| {
        if err.trim().is_empty() {
            "(no error output)".to_string()
        } else {
            tail(err, lines)
        }
    };
    let how = |c: &Running| c.status.as_ref().map(describe).unwrap_or_default();
    match v.cause {
        None => {}
        Some(Cause::Limit) => {
            return Err(BenchError::Failed(format!(
                "the flow processes did not finish within {:.0} s; stopped: {stopped}",
                limit.as_secs_f64()
            )))
        }
        Some(Cause::Request(reason)) => {
            return Err(BenchError::Failed(format!("{reason}; stopped: {stopped}")))
        }
        Some(Cause::Child) => {
            let first = v.failed[0];
            let (_, err) = children[first].outputs();
            let also: Vec<String> = v.failed[1..]
                .iter()
                .map(|&j| {
                    let (_, err) = children[j].outputs();
                    format!(
                        "{} {}: {}",
                        children[j].label(),
                        how(&children[j]),
                        said(&err, 2)
                    )
                })
                .collect();
            // A child that refused the experiment as invalid (no GPU here, a backend limit) ran
            // nothing: the caller may record it as skipped rather than failed.
            let invalid = v.failed.iter().any(|&j| children[j].is_invalid());
            let text = format!(
                "{} {}: {}; stopped the others: {stopped}{}",
                children[first].label(),
                how(&children[first]),
                said(&err, 4),
                if also.is_empty() {
                    String::new()
                } else {
                    format!("; also ended: {}", also.join("; "))
                }
            );
            return Err(if invalid {
                BenchError::Invalid(text)
            } else {
                BenchError::Failed(text)
            });
        }
    }
    children
        .into_iter()
        .map(|mut c| {
            let (_, err) = c.outputs();
            let report = c.report().map_err(|e| {
                BenchError::Failed(format!("{}: {e}; its stderr: {}", c.label(), tail(&err, 4)))
            })?;
            if let Some(e) = report.error {
                // Exited 0 but reported an error: trust the report.
                return Err(BenchError::Failed(format!("{}: {}", c.label(), e.message)));
            }
            if let Err(e) = report.check(&c.asked) {
                return Err(BenchError::Failed(format!(
                    "{} reported impossible figures: {}",
                    c.label(),
                    tcpx_bench::shown(&e, 300)
                )));
            }
            Ok(ChildResult {
                flow: c.flow,
                role: c.role,
                pid: c.pid,
                measurements: report.measurements,
                nic_plan: report.nic_plan,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child running `script` under sh, with `$REPORT` its report path (in `dir`).
    fn sh(dir: &tempfile::TempDir, flow: u32, script: &str) -> ChildSpec {
        let report = dir.path().join(format!("flow{flow}.json"));
        let mut command = Command::new("sh");
        command.args(["-c", script]).env("REPORT", &report);
        ChildSpec {
            flow,
            role: "client".into(),
            command,
            report,
            asked: Experiment {
                sizes: vec![],
                ..Experiment::default()
            },
        }
    }

    /// What supervising `specs` within `limit` fails with.
    fn failure(specs: Vec<ChildSpec>, limit: Duration) -> String {
        supervise(specs, limit).unwrap_err().to_string()
    }

    /// Shell that writes a report with an error of `kind` and exits 2.
    fn fail_with(kind: &str, message: &str) -> String {
        format!(
            "echo '{message}' >&2; \
             echo '{{\"measurements\":[],\"nic_plan\":null,\"error\":{{\"kind\":\"{kind}\",\"message\":\"{message}\"}}}}' > \"$REPORT\"; exit 2"
        )
    }

    /// The cause is named first even when its peer's echo (a `peer_gone` report) comes from a
    /// lower flow; the echo is still listed, with its own last words.
    #[test]
    fn the_child_that_failed_on_its_own_is_named_before_the_echo_of_its_peer() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("refused");
        let flag = flag.to_str().unwrap();
        let e = failure(
            vec![
                // Fails only after flow 1 has, as a peer stopped by the other node would.
                sh(
                    &dir,
                    0,
                    &format!(
                        "while [ ! -e {flag} ]; do :; done; {}",
                        fail_with("peer_gone", "peer 127.0.0.1:1 went away")
                    ),
                ),
                sh(
                    &dir,
                    1,
                    &format!(
                        "echo 'refused: settings differ (server vs client):' >&2; \
                         echo '  flows: 2 vs 3' >&2; touch {flag}; exit 2"
                    ),
                ),
            ],
            Duration::from_secs(60),
        );
        assert!(e.starts_with("flow 1 (client, pid"), "{e}");
        assert!(e.contains("flows: 2 vs 3"), "{e}");
    }

    /// A sibling whose own failure comes just after the parent saw the echo is waited for (up to
    /// [`ECHO_GRACE`]) and named first, not stopped: in a two-node run the peer of the real
    /// cause often fails (and is stopped by the other node) before the cause's exit is seen here.
    #[test]
    fn a_sibling_failing_on_its_own_after_an_echo_is_named_not_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("pid0");
        let pid = pid.to_str().unwrap();
        let e = failure(
            vec![
                sh(
                    &dir,
                    0,
                    &format!(
                        "echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; {}",
                        fail_with("peer_gone", "peer 127.0.0.1:1 went away")
                    ),
                ),
                // Ends only once the parent reaped flow 0 (a zombie still answers kill -0), i.e.
                // after the parent has seen the echo.
                sh(
                    &dir,
                    1,
                    &format!(
                        "while [ ! -e {pid} ]; do :; done; p=$(cat {pid}); \
                         while kill -0 $p 2>/dev/null; do :; done; \
                         echo 'test hook: exiting with status 3' >&2; exit 3"
                    ),
                ),
            ],
            Duration::from_secs(60),
        );
        assert!(e.starts_with("flow 1 (client, pid"), "{e}");
        assert!(e.contains("exited with status 3: test hook"), "{e}");
        assert!(e.contains("stopped the others: none"), "{e}");
        assert!(e.contains("also ended: flow 0 (client"), "{e}");
    }

    #[test]
    fn a_failing_child_stops_the_others_and_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let e = supervise(
            vec![
                // Would run far past the test; must be stopped, not waited for.
                sh(&dir, 0, "exec sleep 600"),
                sh(&dir, 1, &fail_with("failed", "data channel 1: broken")),
                sh(&dir, 2, "exec sleep 600"),
            ],
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert!(matches!(e, BenchError::Failed(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("flow 1 (client, pid")
                && e.contains("exited with status 2")
                && e.contains("data channel 1: broken"),
            "{e}"
        );
        assert!(
            e.contains("stopped the others: flow 0") && e.contains("flow 2 (client"),
            "{e}"
        );
        assert!(
            started.elapsed() < STOP_GRACE * 2,
            "sleepers were stopped by SIGTERM, not waited for"
        );
    }

    /// A child whose report says the experiment is invalid here makes the whole run invalid
    /// (skipped in a plan), typed, whatever its message says.
    #[test]
    fn an_invalid_report_makes_an_invalid_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = supervise(
            vec![sh(&dir, 0, &fail_with("invalid", "needs 2 GPUs"))],
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert!(
            matches!(&e, BenchError::Invalid(m) if m.contains("needs 2 GPUs")),
            "{e:?}"
        );
    }

    /// The stop hook ends the run at once: the sleepers are stopped (SIGTERM), named, and the
    /// error starts with the hook's reason; the hook is not asked again after it answered.
    #[test]
    fn a_stop_request_stops_every_child_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mut asked = 0;
        let e = supervise_until(
            vec![sh(&dir, 0, "exec sleep 600"), sh(&dir, 1, "exec sleep 600")],
            Duration::from_secs(600),
            &mut || {
                asked += 1;
                (asked == 3).then(|| "the other node's processes failed".to_string())
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(asked, 3);
        assert!(
            e.starts_with("the other node's processes failed; stopped: flow 0 (client, pid"),
            "{e}"
        );
        assert!(e.contains("flow 1 (client, pid"), "{e}");
        assert!(!e.contains("SIGKILL"), "sleep ends on SIGTERM: {e}");
    }

    #[test]
    fn a_child_killed_by_a_signal_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = failure(vec![sh(&dir, 4, "kill -9 $$")], Duration::from_secs(60));
        assert!(
            e.contains("flow 4 (client") && e.contains("killed by signal 9"),
            "{e}"
        );
    }

    #[test]
    fn children_past_the_limit_are_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let e = failure(
            vec![sh(&dir, 0, "exec sleep 600")],
            Duration::from_millis(200),
        );
        assert!(
            e.contains("did not finish within") && e.contains("flow 0"),
            "{e}"
        );
    }

    /// Issue 43 item 4: a flow process's report is checked like any peer's figures. A real
    /// report passes; a time rewritten to -0.5 s or 1e-300 s, a rate of 1e294 GB/s, a size other
    /// than asked or a missing size fails the run naming the flow process.
    #[test]
    fn impossible_figures_in_a_childs_report_fail_the_run_naming_it() {
        use tcpx_bench::{Side, SideResult};
        let dir = tempfile::tempdir().unwrap();
        let size = 1u64 << 20;
        let asked = Experiment {
            sizes: vec![size],
            iters: 4,
            ..Experiment::default()
        };
        let times = vec![1e-4, 2e-4, 1.5e-4, 1e-4];
        let real = ChildReport {
            measurements: vec![Measurement {
                experiment: asked.clone(),
                size,
                chunk: 1 << 19,
                send: SideResult::of_times(Side::Send, times.clone()).summarise(size),
                recv: SideResult::of_times(Side::Recv, times).summarise(size),
            }],
            ..ChildReport::default()
        };
        let run = |report: &ChildReport, name: &str| {
            let file = dir.path().join(format!("{name}.json"));
            std::fs::write(&file, serde_json::to_vec(report).unwrap()).unwrap();
            let mut spec = sh(&dir, 0, &format!("cp '{}' \"$REPORT\"", file.display()));
            spec.asked = asked.clone();
            supervise(vec![spec], Duration::from_secs(60))
        };
        let out = run(&real, "real").unwrap();
        assert_eq!(out[0].measurements.len(), 1);
        let mut bad: Vec<(&str, ChildReport)> = Vec::new();
        for (name, us) in [("negative", -0.5e6), ("tiny", 1e-300 * 1e6)] {
            let mut r = real.clone();
            r.measurements[0].recv.avg_us = us;
            bad.push((name, r));
        }
        let mut r = real.clone();
        r.measurements[0].send.algbw_gbs = 1.05e294;
        bad.push(("fast", r));
        let mut r = real.clone();
        r.measurements[0].size = size / 2;
        bad.push(("size", r));
        let mut r = real.clone();
        r.measurements.clear();
        bad.push(("none", r));
        for (name, r) in &bad {
            let e = run(r, name).unwrap_err().to_string();
            assert!(
                e.contains("flow 0 (client, pid") && e.contains("reported impossible figures"),
                "{name}: {e}"
            );
        }
    }

    #[test]
    fn a_child_without_a_report_is_an_error_and_reports_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let e = failure(
            vec![sh(&dir, 0, "echo table only")],
            Duration::from_secs(60),
        );
        assert!(e.contains("wrote no report"), "{e}");
        let out = supervise(
            vec![sh(
                &dir,
                1,
                "echo '{\"measurements\":[],\"nic_plan\":\"flow 1: eth1\",\"error\":null}' > \"$REPORT\"",
            )],
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].measurements.is_empty());
        assert_eq!(out[0].nic_plan.as_deref(), Some("flow 1: eth1"));
        assert!(supervise(
            vec![ChildSpec {
                flow: 0,
                role: "server".into(),
                command: Command::new("/nonexistent/tcpx-run"),
                report: dir.path().join("none.json"),
                asked: Experiment::default(),
            }],
            Duration::from_secs(1)
        )
        .unwrap_err()
        .to_string()
        .contains("could not start the process for flow 0"));
    }
}
