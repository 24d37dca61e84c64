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

use tcpx_bench::{BenchError, Measurement};

use crate::report::{ChildErrorKind, ChildReport};

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

/// Grace period between SIGTERM and SIGKILL when stopping the other children.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long the others may still end on their own when the first child to fail only echoes a
/// peer that went away. The cause may be a sibling here whose exit is not seen yet (its peer on
/// the other node failed first and that node's parent stopped the rest); stopping it at once
/// would hide its own error behind "stopped".
pub const ECHO_GRACE: Duration = Duration::from_secs(2);

struct Running {
    flow: u32,
    role: String,
    pid: u32,
    child: Child,
    report_path: PathBuf,
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

fn reader(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
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

/// Stops every child still running: SIGTERM, then SIGKILL after [`STOP_GRACE`].
fn stop_all(children: &mut [Running]) -> Vec<String> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut stopped = Vec::new();
    for c in children.iter_mut().filter(|c| c.status.is_none()) {
        // The child is not reaped yet (we hold it), so its pid cannot have been reused.
        let _ = kill(Pid::from_raw(c.pid as i32), Signal::SIGTERM);
    }
    let grace = Instant::now() + STOP_GRACE;
    for c in children.iter_mut().filter(|c| c.status.is_none()) {
        loop {
            match c.child.try_wait() {
                Ok(Some(s)) => {
                    c.status = Some(s);
                    stopped.push(c.label());
                    break;
                }
                Ok(None) if Instant::now() < grace => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = c.child.kill();
                    c.status = c.child.wait().ok();
                    stopped.push(format!("{} (SIGKILL)", c.label()));
                    break;
                }
            }
        }
    }
    stopped
}

/// After a child failed with an echo, waits up to `grace` for the children still running: until
/// one of them fails too, or all have ended. Their exit statuses are recorded; nobody is stopped.
fn wait_for_own_failures(children: &mut [Running], grace: Duration) {
    let until = Instant::now() + grace;
    loop {
        let mut running = false;
        for c in children.iter_mut().filter(|c| c.status.is_none()) {
            match c.child.try_wait() {
                Ok(Some(s)) => {
                    c.status = Some(s);
                    if !s.success() {
                        return;
                    }
                }
                Ok(None) => running = true,
                Err(_) => return,
            }
        }
        if !running || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let deadline = Instant::now() + limit;
    let mut children: Vec<Running> = Vec::with_capacity(specs.len());
    for mut spec in specs {
        spec.command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match spec.command.spawn() {
            Ok(mut child) => {
                let out = child.stdout.take().map(reader);
                let err = child.stderr.take().map(reader);
                children.push(Running {
                    flow: spec.flow,
                    role: spec.role,
                    pid: child.id(),
                    report_path: spec.report,
                    child,
                    out,
                    err,
                    collected: None,
                    status: None,
                });
            }
            Err(e) => {
                let stopped = stop_all(&mut children);
                return Err(BenchError::Failed(format!(
                    "could not start the process for flow {} ({}): {e} (is {:?} executable?); stopped: {}",
                    spec.flow,
                    spec.role,
                    spec.command.get_program(),
                    if stopped.is_empty() { "none".into() } else { stopped.join(", ") }
                )));
            }
        }
    }
    // Poll for exits: the parent only watches, the children do the work and time out on their own.
    let failed: Option<(usize, String)> = loop {
        // Several may end in one round (a killed child's peer fails right after it): a child
        // killed by a signal is the cause rather than a consequence, so it is named first.
        let mut failure: Option<(usize, String, bool)> = None;
        for (i, c) in children.iter_mut().enumerate() {
            if c.status.is_some() {
                continue;
            }
            let ended = match c.child.try_wait() {
                Ok(Some(s)) => {
                    c.status = Some(s);
                    use std::os::unix::process::ExitStatusExt;
                    (!s.success()).then(|| (describe(&s), s.signal().is_some()))
                }
                Ok(None) => None,
                Err(e) => Some((format!("could not be waited for: {e}"), false)),
            };
            if let Some((how, signalled)) = ended {
                if failure.as_ref().is_none_or(|f| signalled && !f.2) {
                    failure = Some((i, how, signalled));
                }
            }
        }
        let failure = failure.map(|(i, how, _)| (i, how));
        if failure.is_some() {
            break failure;
        }
        if children.iter().all(|c| c.status.is_some()) {
            break None;
        }
        if Instant::now() >= deadline {
            break Some((
                usize::MAX,
                format!(
                    "the flow processes did not finish within {:.0} s",
                    limit.as_secs_f64()
                ),
            ));
        }
        if let Some(reason) = stop() {
            break Some((usize::MAX, reason));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some((i, how)) = failed {
        let stopped_list = |children: &mut [Running]| {
            let stopped = stop_all(children);
            if stopped.is_empty() {
                "none (all had ended)".to_string()
            } else {
                stopped.join(", ")
            }
        };
        if i == usize::MAX {
            // No child failed: the limit passed or the stop hook answered.
            let stopped = stopped_list(&mut children);
            return Err(BenchError::Failed(format!("{how}; stopped: {stopped}")));
        }
        let signalled = {
            use std::os::unix::process::ExitStatusExt;
            children[i].status.is_some_and(|s| s.signal().is_some())
        };
        // An echo of a vanished peer, not killed by a signal: the cause may be elsewhere.
        let first_is_echo = !signalled && children[i].is_echo();
        if first_is_echo {
            wait_for_own_failures(&mut children, ECHO_GRACE);
        }
        // Others that had already failed on their own (usually the dead one's peer).
        let also: Vec<usize> = (0..children.len())
            .filter(|&j| j != i && children[j].status.is_some_and(|s| !s.success()))
            .collect();
        let stopped = stopped_list(&mut children);
        let mut ended: Vec<(usize, String, String)> = std::iter::once(i)
            .chain(also)
            .map(|j| {
                let how = children[j]
                    .status
                    .as_ref()
                    .map(describe)
                    .unwrap_or_default();
                let (_, err) = children[j].outputs();
                (j, how, err)
            })
            .collect();
        ended[0].1 = how;
        // Children that ended in one polling round are in flow order, not in the order they
        // failed: name first one whose error is its own (a refusal, a limit) rather than the
        // echo of a peer that was stopped, unless the first was killed by a signal.
        if first_is_echo {
            if let Some(k) = ended
                .iter()
                .position(|(j, _, _)| children[*j].status.is_some() && !children[*j].is_echo())
            {
                ended.swap(0, k);
            }
        }
        let said = |err: &str, lines: usize| {
            if err.trim().is_empty() {
                "(no error output)".to_string()
            } else {
                tail(err, lines)
            }
        };
        let (first, how, err) = &ended[0];
        let also: Vec<String> = ended[1..]
            .iter()
            .map(|(j, how, err)| format!("{} {how}: {}", children[*j].label(), said(err, 2)))
            .collect();
        // A child that refused the experiment as invalid (no GPU here, a backend limit) ran
        // nothing: the caller may record it as skipped rather than failed.
        let invalid = ended.iter().any(|(j, _, _)| children[*j].is_invalid());
        let text = format!(
            "{} {how}: {}; stopped the others: {stopped}{}",
            children[*first].label(),
            said(err, 4),
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
        }
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
        let e = supervise(
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
        )
        .unwrap_err()
        .to_string();
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
        let e = supervise(
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
        )
        .unwrap_err()
        .to_string();
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
        let e = supervise(vec![sh(&dir, 4, "kill -9 $$")], Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flow 4 (client") && e.contains("killed by signal 9"),
            "{e}"
        );
    }

    #[test]
    fn children_past_the_limit_are_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let e = supervise(
            vec![sh(&dir, 0, "exec sleep 600")],
            Duration::from_millis(200),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("did not finish within") && e.contains("flow 0"),
            "{e}"
        );
    }

    #[test]
    fn a_child_without_a_report_is_an_error_and_reports_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let e = supervise(
            vec![sh(&dir, 0, "echo table only")],
            Duration::from_secs(60),
        )
        .unwrap_err()
        .to_string();
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
            }],
            Duration::from_secs(1)
        )
        .unwrap_err()
        .to_string()
        .contains("could not start the process for flow 0"));
    }
}
