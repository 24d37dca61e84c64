//! Multi-process mode: one child process per flow (per GPU), supervised by a parent that gathers
//! per-flow and per-node figures, as the C++ `run_p2p_fullmesh.sh` starts one benchmark per GPU.
//!
//! The parent (in `tcpx-run bench --multi-process`) builds one [`ChildSpec`] per flow and side:
//! flow `i` runs `tcpx-run bench` with `flow_index = i` on control port base + `i`, so it meets
//! flow `i` of the peer node and nobody else. [`supervise`] starts them all, collects what each
//! prints, and when one fails stops the others (SIGTERM, then SIGKILL after a grace period) and
//! reports which flow failed, how, and the end of its error output. The child's experiment
//! carries the parent's `flows`, so a node started with another flow count is refused by the
//! handshake with both values. [`aggregate`] turns the children's results into per-flow and
//! per-node figures; [`single_process_figures`] does the same for a one-process run, so both
//! modes print the same table.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{BenchError, Measurement};

/// One child to start.
pub struct ChildSpec {
    /// The flow (GPU index) it carries.
    pub flow: u32,
    /// `server` or `client`, for messages.
    pub role: String,
    /// The full command; its stdout must end with the JSON array of its measurements
    /// (`tcpx-run bench --json`).
    pub command: Command,
}

/// What a child that finished well reported.
#[derive(Debug, Clone)]
pub struct ChildResult {
    pub flow: u32,
    pub role: String,
    pub pid: u32,
    pub measurements: Vec<Measurement>,
    pub stdout: String,
}

/// Grace period between SIGTERM and SIGKILL when stopping the other children.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// How long the others may still end on their own when the first child to fail only echoes a
/// peer that went away. The cause may be a sibling here whose exit is not seen yet (its peer on
/// the other node failed first and that node's parent stopped the rest); stopping it at once
/// would hide its own error behind "stopped".
pub const ECHO_GRACE: Duration = Duration::from_secs(2);

/// Whether a child's error output only says that its peer went away, a consequence of a failure
/// elsewhere rather than a cause.
fn is_echo(err: &str) -> bool {
    err.contains("closed the control connection")
        || err.contains("closed the connection")
        || err.contains("the peer stopped")
}

struct Running {
    flow: u32,
    role: String,
    pid: u32,
    child: Child,
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

/// The measurements a child printed: the last stdout line that is a JSON array.
pub fn parse_child_output(stdout: &str) -> Result<Vec<Measurement>, String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .ok_or("it printed no JSON results (was it started with --json?)")?;
    serde_json::from_str(line).map_err(|e| format!("its JSON results are unreadable: {e}"))
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
        let first_is_echo = !signalled && is_echo(&children[i].outputs().1);
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
                .position(|(_, _, err)| !err.trim().is_empty() && !is_echo(err))
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
        return Err(BenchError::Failed(format!(
            "{} {how}: {}; stopped the others: {stopped}{}",
            children[*first].label(),
            said(err, 4),
            if also.is_empty() {
                String::new()
            } else {
                format!("; also ended: {}", also.join("; "))
            }
        )));
    }
    children
        .into_iter()
        .map(|mut c| {
            let (out, err) = c.outputs();
            let measurements = parse_child_output(&out).map_err(|e| {
                BenchError::Failed(format!("{}: {e}; its stderr: {}", c.label(), tail(&err, 4)))
            })?;
            Ok(ChildResult {
                flow: c.flow,
                role: c.role,
                pid: c.pid,
                measurements,
                stdout: out,
            })
        })
        .collect()
}

/// One flow's figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowFigure {
    pub flow: u32,
    pub send_gbs: f64,
    pub recv_gbs: f64,
    pub wrong_bytes: Option<u64>,
}

/// Per-flow and per-node figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeFigures {
    pub size: u64,
    pub per_flow: Vec<FlowFigure>,
    /// Node send GB/s: all flows' bytes over the node (single process: over the slowest flow's
    /// time; multi-process: sum of the flows' own GB/s, as the processes are not in lockstep).
    pub node_send_gbs: f64,
    pub node_recv_gbs: f64,
    pub wrong_bytes: Option<u64>,
}

fn sum_wrong(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.fold(None, |acc, w| match (acc, w) {
        (None, w) => w,
        (a, None) => a,
        (Some(a), Some(b)) => Some(a + b),
    })
}

/// Figures of a multi-process run: one result per flow (for a `local` run where both sides are
/// children, each flow's first child counts; both sides agree on the figures).
pub fn aggregate(children: &[ChildResult]) -> Vec<SizeFigures> {
    let mut by_flow: Vec<&ChildResult> = Vec::new();
    for c in children {
        if !by_flow.iter().any(|b| b.flow == c.flow) {
            by_flow.push(c);
        }
    }
    by_flow.sort_by_key(|c| c.flow);
    let sizes: Vec<u64> = by_flow
        .first()
        .map(|c| c.measurements.iter().map(|m| m.size).collect())
        .unwrap_or_default();
    sizes
        .iter()
        .map(|&size| {
            let per_flow: Vec<FlowFigure> = by_flow
                .iter()
                .filter_map(|c| {
                    c.measurements
                        .iter()
                        .find(|m| m.size == size)
                        .map(|m| (c, m))
                })
                .map(|(c, m)| FlowFigure {
                    flow: c.flow,
                    send_gbs: m.send.algbw_gbs,
                    recv_gbs: m.recv.algbw_gbs,
                    wrong_bytes: m.recv.wrong_bytes,
                })
                .collect();
            SizeFigures {
                size,
                node_send_gbs: per_flow.iter().map(|f| f.send_gbs).sum(),
                node_recv_gbs: per_flow.iter().map(|f| f.recv_gbs).sum(),
                wrong_bytes: sum_wrong(per_flow.iter().map(|f| f.wrong_bytes)),
                per_flow,
            }
        })
        .collect()
}

/// The same figures from a single-process run's measurements (per-flow from `flow_gbs`).
pub fn single_process_figures(ms: &[Measurement]) -> Vec<SizeFigures> {
    ms.iter()
        .map(|m| SizeFigures {
            size: m.size,
            per_flow: m
                .send
                .flow_gbs
                .iter()
                .zip(&m.recv.flow_gbs)
                .enumerate()
                .map(|(k, (&s, &r))| FlowFigure {
                    flow: m.experiment.flow_id(k as u32),
                    send_gbs: s,
                    recv_gbs: r,
                    // The receiver counts wrong bytes over all its flows together.
                    wrong_bytes: None,
                })
                .collect(),
            node_send_gbs: m.send.algbw_gbs,
            node_recv_gbs: m.recv.algbw_gbs,
            wrong_bytes: m.recv.wrong_bytes,
        })
        .collect()
}

/// A `#`-commented table: one line per size and flow, then the node's line.
pub fn figures_table(mode: &str, figs: &[SizeFigures]) -> String {
    let mut s = format!(
        "# per-GPU and per-node bandwidth ({mode}; GB/s = 1e9 B/s)\n#{:>12} {:>6} {:>10} {:>10} {:>8}",
        "size", "flow", "send", "recv", "#wrong"
    );
    let wrong = |w: Option<u64>| w.map_or_else(|| "-".to_string(), |w| w.to_string());
    for f in figs {
        for p in &f.per_flow {
            s.push_str(&format!(
                "\n#{:>12} {:>6} {:>10.2} {:>10.2} {:>8}",
                f.size,
                p.flow,
                p.send_gbs,
                p.recv_gbs,
                wrong(p.wrong_bytes)
            ));
        }
        s.push_str(&format!(
            "\n#{:>12} {:>6} {:>10.2} {:>10.2} {:>8}",
            f.size,
            "node",
            f.node_send_gbs,
            f.node_recv_gbs,
            wrong(f.wrong_bytes)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(flow: u32, script: &str) -> ChildSpec {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        ChildSpec {
            flow,
            role: "client".into(),
            command,
        }
    }

    fn measured(flow: u32, secs: f64) -> Measurement {
        let exp = crate::Experiment {
            flows: 2,
            flow_index: Some(flow),
            ..crate::Experiment::default()
        };
        let side = |side, wrong| crate::SideResult {
            side,
            iter_secs: vec![secs],
            wrong_bytes: wrong,
            pinning: None,
            cpu: None,
            flow_iter_secs: vec![vec![secs]],
        };
        Measurement {
            experiment: exp,
            size: 1_000_000_000,
            chunk: 1 << 19,
            send: side(crate::Side::Send, None).summarise(1_000_000_000),
            recv: side(crate::Side::Recv, Some(flow.into())).summarise(1_000_000_000),
        }
    }

    #[test]
    fn node_figures_sum_the_flows_and_keep_one_result_per_flow() {
        let child = |flow, role: &str, secs| ChildResult {
            flow,
            role: role.into(),
            pid: 1,
            measurements: vec![measured(flow, secs)],
            stdout: String::new(),
        };
        // Flow 1 listed first, and flow 0 twice (both sides of a local run).
        let figs = aggregate(&[
            child(1, "server", 0.5),
            child(0, "server", 0.25),
            child(0, "client", 0.25),
        ]);
        assert_eq!(figs.len(), 1);
        let f = &figs[0];
        assert_eq!(
            f.per_flow.iter().map(|p| p.flow).collect::<Vec<_>>(),
            [0, 1]
        );
        assert!((f.per_flow[0].recv_gbs - 4.0).abs() < 1e-9);
        assert!((f.node_recv_gbs - 6.0).abs() < 1e-9, "4 + 2 GB/s");
        assert_eq!(f.wrong_bytes, Some(1), "flow 1 reported one wrong byte");
        let table = figures_table("multi-process", &figs);
        assert!(table.contains("node") && table.contains("6.00"), "{table}");
    }

    /// The cause is named first even when its peer's echo ("closed the control connection")
    /// comes from a lower flow; the echo is still listed, with its own last words.
    #[test]
    fn the_child_that_failed_on_its_own_is_named_before_the_echo_of_its_peer() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("refused");
        let flag = flag.to_str().unwrap();
        let e = supervise(
            vec![
                // Fails only after flow 1 has, as a peer stopped by the other node would.
                sh(
                    0,
                    &format!(
                        "while [ ! -e {flag} ]; do :; done; \
                         echo 'peer 127.0.0.1:1 closed the control connection' >&2; exit 2"
                    ),
                ),
                sh(
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
                    0,
                    &format!(
                        "echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; \
                         echo 'peer 127.0.0.1:1 closed the control connection' >&2; exit 2"
                    ),
                ),
                // Ends only once the parent reaped flow 0 (a zombie still answers kill -0), i.e.
                // after the parent has seen the echo.
                sh(
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
        let started = Instant::now();
        let e = supervise(
            vec![
                // Would run far past the test; must be stopped, not waited for.
                sh(0, "exec sleep 600"),
                sh(
                    1,
                    "echo 'data channel 1: peer closed the connection' >&2; exit 3",
                ),
                sh(2, "exec sleep 600"),
            ],
            Duration::from_secs(60),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("flow 1 (client, pid")
                && e.contains("exited with status 3")
                && e.contains("peer closed the connection"),
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

    /// The stop hook ends the run at once: the sleepers are stopped (SIGTERM), named, and the
    /// error starts with the hook's reason; the hook is not asked again after it answered.
    #[test]
    fn a_stop_request_stops_every_child_with_its_reason() {
        let mut asked = 0;
        let e = supervise_until(
            vec![sh(0, "exec sleep 600"), sh(1, "exec sleep 600")],
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
        let e = supervise(vec![sh(4, "kill -9 $$")], Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flow 4 (client") && e.contains("killed by signal 9"),
            "{e}"
        );
    }

    #[test]
    fn children_past_the_limit_are_stopped() {
        let e = supervise(vec![sh(0, "exec sleep 600")], Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not finish within") && e.contains("flow 0"),
            "{e}"
        );
    }

    #[test]
    fn a_child_without_results_is_an_error_and_results_are_read_back() {
        let e = supervise(vec![sh(0, "echo table only")], Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert!(e.contains("printed no JSON results"), "{e}");
        let out = supervise(
            vec![sh(0, "echo '# table'; echo '[]'")],
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].measurements.is_empty());
        assert!(supervise(
            vec![ChildSpec {
                flow: 0,
                role: "server".into(),
                command: Command::new("/nonexistent/tcpx-run"),
            }],
            Duration::from_secs(1)
        )
        .unwrap_err()
        .to_string()
        .contains("could not start the process for flow 0"));
    }
}
