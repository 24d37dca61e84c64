//! The plan runner's leader side: [`LeaderRunner`] runs each experiment as the bench client
//! while the follower serves, and turns what both sides measured into report records.
//!
//! Each side picks its own NICs for `nics: N` (loopback: 127.0.0.2 ..= 127.0.0.(N+1)). With
//! `process_mode: "multi-process"` each side runs one flow process per flow (the follower's
//! servers on the ports it reserved, the leader's clients connecting there); the result of each
//! size is then one record whose send/recv figures are the node's (all flows' bytes over the
//! wall-clock time any of them was transferring, as [`aggregate`](tcpx_flows::figures::aggregate)
//! does; times are the slowest flow's), with each flow's
//! figures in `per_flow`, so single- and multi-process rows compare directly.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_model::Backoff;

use tcpx_bench::{BenchError, Experiment, Measurement, SideEnv};
use tcpx_model::{Knob, NotApplied, Side};
use tcpx_plan::{PlanExperiment, RunOutcome, Runner, SystemFacts};
use tcpx_report::{FlowFigures, ResultRecord, SampleRecord, SideFigures, Status};
use tcpx_transport::registry::{self, BackendConfig, BackendEnv};
use tcpx_transport::TransportError;

use crate::error::OrchestrateError;
use crate::knobs::{binding_for, irq_for, knobs_not_applied, run_pinned, side_nics, IrqOutcome};
use crate::proto::{Action, Event, Leader};
use crate::FaultHooks;
use tcpx_flows::figures::{aggregate, single_process_figures};
use tcpx_flows::process::{children_limit, flow_children, ChildFault, FlowSide, Launcher};
use tcpx_flows::supervise::{supervise_until, ChildResult};
use tcpx_link::{Link, LinkError, LinkMsg};

/// One message size as the leader records it.
struct Row {
    size: u64,
    chunk: u64,
    send: SideFigures,
    recv: SideFigures,
    per_flow: Vec<FlowFigures>,
}

/// What the leader's side of an experiment measured.
struct Measured {
    rows: Vec<Row>,
    /// The leader's channels on NICs (`flow 0: 127.0.0.2,127.0.0.3; ...`), when it named NICs.
    nic_plan: Option<String>,
}

/// Rows of a single-process run; per-flow figures from each side's own flow timings.
fn single_process_rows(exp: &Experiment, o: &tcpx_bench::Outcome) -> Measured {
    let rows = o
        .measurements
        .iter()
        .map(|m| Row {
            size: m.size,
            chunk: m.chunk,
            send: m.send.figures(),
            recv: m.recv.figures(),
            per_flow: if exp.flows > 1 {
                single_process_figures(std::slice::from_ref(m))
                    .into_iter()
                    .flat_map(|f| f.per_flow)
                    .map(|f| FlowFigures {
                        flow: f.flow,
                        send_gbs: f.send_gbs,
                        recv_gbs: f.recv_gbs,
                        wrong_bytes: f.wrong_bytes,
                        pid: None,
                    })
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect();
    Measured {
        rows,
        nic_plan: o.nic_plan.as_ref().map(|p| p.describe(exp)),
    }
}

/// Node rows of a multi-process run: the node's GB/s of [`aggregate`] (wall-clock over the
/// flows' iteration spans; summed for results without them), times from the slowest flow
/// (largest average, p50, p99 and max; smallest min), wrong bytes summed.
fn node_rows(children: &[ChildResult]) -> Measured {
    let figs = aggregate(children);
    let rows = figs
        .iter()
        .map(|f| {
            let ms: Vec<&Measurement> = children
                .iter()
                .filter_map(|c| c.measurements.iter().find(|m| m.size == f.size))
                .collect();
            let side = |pick: fn(&Measurement) -> &tcpx_bench::SideSummary,
                        gbs: f64,
                        wrong: Option<u64>| {
                let max = |g: fn(&tcpx_bench::SideSummary) -> f64| {
                    ms.iter().map(|m| g(pick(m))).fold(0.0, f64::max)
                };
                let min = ms
                    .iter()
                    .map(|m| pick(m).min_us)
                    .fold(f64::INFINITY, f64::min);
                SideFigures {
                    avg_us: max(|s| s.avg_us),
                    p50_us: max(|s| s.p50_us),
                    p99_us: max(|s| s.p99_us),
                    min_us: if min.is_finite() { min } else { 0.0 },
                    max_us: max(|s| s.max_us),
                    algbw_gbs: gbs,
                    busbw_gbs: gbs,
                    wrong_bytes: wrong,
                    iter_us: Vec::new(),
                }
            };
            Row {
                size: f.size,
                chunk: ms.first().map_or(0, |m| m.chunk),
                send: side(|m| &m.send, f.node_send_gbs, None),
                recv: side(|m| &m.recv, f.node_recv_gbs, f.wrong_bytes),
                per_flow: f
                    .per_flow
                    .iter()
                    .map(|p| FlowFigures {
                        flow: p.flow,
                        send_gbs: p.send_gbs,
                        recv_gbs: p.recv_gbs,
                        wrong_bytes: p.wrong_bytes,
                        pid: children.iter().find(|c| c.flow == p.flow).map(|c| c.pid),
                    })
                    .collect(),
            }
        })
        .collect();
    let plans: Vec<String> = children.iter().filter_map(|c| c.nic_plan.clone()).collect();
    Measured {
        rows,
        nic_plan: (!plans.is_empty()).then(|| plans.join("; ")),
    }
}

/// The leader's side of a multi-process experiment: one client flow process
/// per flow, flow `i` connecting to the follower's port `base + i`.
///
/// The link is read while they run: when the follower's `Done` says its processes failed, ours
/// are stopped at once ([`Leader`] decides). Otherwise a client whose server never started (a
/// port it could not bind) would retry connecting until the experiment's timeout.
fn run_flow_processes(
    launcher: &dyn Launcher,
    exp: &Experiment,
    base: SocketAddr,
    link: &mut Link,
    proto: &mut Leader,
    fail_flow: Option<u32>,
) -> Result<Measured, BenchError> {
    let faults: Vec<(u32, ChildFault)> = fail_flow
        .map(|f| (f, ChildFault::ExitBeforeConnect))
        .into_iter()
        .collect();
    let flows = flow_children(launcher, exp, &[FlowSide::Client], base, &faults).map_err(|e| {
        BenchError::Failed(format!("starting the leader's client processes: {e:#}"))
    })?;
    let mut follower_says = || {
        if !proto.awaits_message() {
            return None;
        }
        let event = link_event(link.try_recv()?);
        Action::stop_reason(proto.handle(event, Instant::now()))
    };
    let limit = children_limit(exp);
    let children =
        supervise_until(flows.specs, limit, &mut follower_says).map_err(|e| match e {
            // A child that refused the experiment as invalid (no GPU here, a backend limit) ran
            // nothing: skipped, as the single-process run is, rather than failed.
            BenchError::Invalid(m) => {
                BenchError::Invalid(format!("leader's client processes: {m}"))
            }
            e => BenchError::Failed(format!("leader's client processes: {e}")),
        })?;
    drop(flows.dir);
    Ok(node_rows(&children))
}

/// What a plan run's caller hears about its progress (a progress bar, a log).
pub trait LeaderObserver {
    /// Experiment `name` starts.
    fn started(&mut self, _name: &str) {}
    /// The experiment that started last has finished.
    fn finished(&mut self) {}
}

/// `exp` as the bench runs it: a netplugin experiment whose plan left `plugin_chunk` unset gets
/// `plugin_chunk` bytes (the leader's value), so both sides and every flow process use one.
fn bench_with_plugin_chunk(exp: &PlanExperiment, plugin_chunk: u64) -> Experiment {
    let mut bench = exp.bench_to_run();
    if bench.transport.capabilities().loads_a_net_plugin() {
        bench
            .env
            .entry(tcpx_transport::netplugin::DYNAMIC_CHUNK_VAR.to_string())
            .or_insert_with(|| plugin_chunk.to_string());
    }
    bench
}

/// Whether `bench`'s backend opens on this machine, with this experiment's and this process's
/// (`backends`) settings (opened through the registry and dropped). A net plugin is not opened
/// here: loading it initialises it for the life of the process, before the experiment's own
/// variables (`bench.env`, set when the experiment opens it) could reach it; a missing plugin is
/// reported when the experiment runs.
fn backend_runs_here(bench: &Experiment, backends: &BackendEnv) -> Result<(), TransportError> {
    if bench.transport.capabilities().loads_a_net_plugin() {
        return Ok(());
    }
    let config = BackendConfig::for_experiment(bench, backends).map_err(TransportError::Usage)?;
    registry::open(&config, None).map(drop)
}

/// An observer that hears nothing.
pub struct Quiet;

impl LeaderObserver for Quiet {}

/// The leader's side of every experiment.
pub struct LeaderRunner {
    link: Link,
    /// The protocol's decisions; `self` only carries them out.
    proto: Leader,
    facts: SystemFacts,
    loopback: bool,
    launcher: Arc<dyn Launcher>,
    observer: Box<dyn LeaderObserver>,
    lost: Option<String>,
    /// Flow to fail in the first multi-process experiment (test hook), until it was used.
    fail_client_flow: Option<u32>,
    /// GPUDirect-TCPX's dynamic chunk for netplugin experiments whose plan left `plugin_chunk`
    /// unset: the leader's own, so both sides and every flow process use one value.
    plugin_chunk: u64,
    /// This process's backend settings and NIC places, as the binary read them.
    side_env: SideEnv,
}

impl LeaderRunner {
    /// The leader of a plan run over `link` (from [`accept_follower`]), with this machine's
    /// `facts`, starting flow processes with `launcher`.
    pub fn new(
        (link, proto): (Link, Leader),
        facts: SystemFacts,
        launcher: Arc<dyn Launcher>,
        observer: Box<dyn LeaderObserver>,
        faults: &FaultHooks,
    ) -> LeaderRunner {
        LeaderRunner {
            loopback: link.peer.ip().is_loopback(),
            link,
            proto,
            facts,
            launcher,
            observer,
            lost: None,
            fail_client_flow: faults.leader_fail_client_flow,
            plugin_chunk: tcpx_transport::netplugin::DYNAMIC_CHUNK_DEFAULT,
            side_env: SideEnv::default(),
        }
    }

    /// The backend settings the binary read from this process's environment (and, in an
    /// emulated fabric node, its NIC places), for the experiments this side runs in this
    /// process (flow processes read their own).
    pub fn with_side_env(mut self, env: SideEnv) -> LeaderRunner {
        self.side_env = env;
        self
    }

    /// Netplugin experiments that leave `plugin_chunk` unset get `bytes` (the caller's reading
    /// of NCCL_DYNAMIC_CHUNK_SIZE, checked by `tcpx_transport::netplugin::plugin_chunk`)
    /// instead of Google's value.
    pub fn with_plugin_chunk(mut self, bytes: Option<u64>) -> LeaderRunner {
        if let Some(b) = bytes {
            self.plugin_chunk = b;
        }
        self
    }

    /// Whether the follower is on this machine (traffic over loopback).
    pub fn loopback(&self) -> bool {
        self.loopback
    }

    /// Tells the follower the run is over (best effort: it may be gone).
    pub fn say_goodbye(&mut self) {
        let _ = self.drive(Event::Finish);
    }

    /// Hands `event` to the protocol and sends what it says to send; the other actions are
    /// returned. A send that fails is handed back as the link's failure.
    fn drive(&mut self, event: Event) -> Vec<Action> {
        drive(&mut self.link, &mut self.proto, event)
    }

    /// Reads the link until the protocol has something for the caller to do (or gave up).
    fn next_actions(&mut self) -> Vec<Action> {
        next_actions(&mut self.link, &mut self.proto)
    }

    fn record(
        exp: &PlanExperiment,
        phase: &str,
        started: f64,
        status: Status,
        reason: Option<String>,
        not_applied: &NotApplied,
    ) -> ResultRecord {
        ResultRecord {
            not_applied: not_applied.clone(),
            status,
            reason,
            ..exp.record(phase, started)
        }
    }

    fn one(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let t = Instant::now();
        let mut bench = bench_with_plugin_chunk(exp, self.plugin_chunk);
        let outside = &exp.outside;
        let mut na = NotApplied::new();
        let skip = |reason: String, na: &NotApplied| RunOutcome {
            records: vec![Self::record(
                exp,
                phase,
                started,
                Status::Skipped,
                Some(reason),
                na,
            )],
            ..RunOutcome::default()
        };
        // What the backend can do, checked here so nothing is started for it: whether it runs
        // on this machine, and its limits, which it answers without being opened.
        if let Err(e) = backend_runs_here(&bench, &self.side_env.backends) {
            return skip(format!("not supported by this build or machine: {e}"), &na);
        }
        if let Err(e) = bench.validate(Some(&registry::limits(bench.transport))) {
            return skip(format!("not supported by this backend: {e}"), &na);
        }
        for (k, v) in knobs_not_applied(&bench, outside, &self.facts, self.loopback) {
            // IRQ policy, binding and NICs are decided below, when they are applied.
            if ![
                Knob::IrqPolicy,
                Knob::ThreadBinding,
                Knob::Nics,
                Knob::NicPolicy,
            ]
            .contains(&k)
            {
                na.insert(k, v);
            }
        }
        // This side's NICs (the follower picks its own when it prepares).
        match side_nics(&bench, outside, &self.facts, self.loopback, &mut na) {
            Ok(Some(nics)) => bench.nics = nics,
            Ok(None) => {}
            Err(r) => return skip(format!("leader: {r}"), &na),
        }
        let _irq_guard = match irq_for(outside, &self.facts, self.loopback) {
            IrqOutcome::NotRequested => None,
            IrqOutcome::NotApplied(r) => {
                na.insert(Knob::IrqPolicy, r);
                None
            }
            IrqOutcome::Refused(r) => return skip(r, &na),
            IrqOutcome::Applied(g) => Some(g),
        };
        let cpus = match binding_for(outside, &self.facts, Side::Send) {
            Ok(c) => c,
            Err(r) => {
                na.insert(Knob::ThreadBinding, r);
                None
            }
        };
        let peer = self.link.peer;
        let name = exp.name();
        let fatal = |why: &str| -> String {
            format!(
                "{why}, in experiment '{name}' (follower at {peer}): check that node's output; the results so far are kept"
            )
        };
        let mut acts = self.drive(Event::Start {
            exp: Box::new(bench.clone()),
            outside: outside.clone(),
        });
        if acts.is_empty() {
            acts = self.next_actions();
        }
        let port = match acts.first() {
            Some(Action::Run { port, not_applied }) => {
                for (k, v) in not_applied {
                    na.entry(*k).or_insert(format!("follower: {v}"));
                }
                *port
            }
            Some(Action::Skip(reason)) => return skip(reason.clone(), &na),
            Some(Action::Fatal(why)) => {
                return RunOutcome {
                    fatal: Some(fatal(why)),
                    ..RunOutcome::default()
                }
            }
            other => {
                return RunOutcome {
                    fatal: Some(fatal(&format!("internal: the link answered {other:?}"))),
                    ..RunOutcome::default()
                }
            }
        };
        let sampler = if outside.sample {
            tcpx_affinity::Sampler::start(
                tcpx_affinity::SysRoot::live(),
                Duration::from_millis(100),
            )
            .ok()
        } else {
            None
        };
        let addr = SocketAddr::new(self.link.peer.ip(), port);
        let link = &mut self.link;
        let proto = &mut self.proto;
        let launcher = self.launcher.clone();
        let fail_flow = if bench.multi_process {
            self.fail_client_flow.take()
        } else {
            None
        };
        // Children started from the pinned thread inherit its CPU mask.
        let (result, pin_error) = run_pinned(cpus.as_ref(), || {
            if bench.multi_process {
                run_flow_processes(&*launcher, &bench, addr, link, proto, fail_flow)
            } else {
                tcpx_bench::run_client_with(&bench, &self.side_env, addr, &mut |_: &Measurement| {})
                    .map(|o| single_process_rows(&bench, &o))
            }
        });
        if let Some(p) = pin_error {
            na.insert(Knob::ThreadBinding, p);
        }
        let mut samples = Vec::new();
        if let Some(s) = sampler {
            if let Ok(rep) = s.stop() {
                samples = rep
                    .rows
                    .into_iter()
                    .map(|r| SampleRecord {
                        experiment: exp.name(),
                        t_s: r.t_s,
                        source: r.source.into(),
                        subject: r.subject,
                        metric: r.metric.into(),
                        value: r.value,
                    })
                    .collect();
            }
        }
        // Our processes failed first: the machine sends `Abort` (multi-process) so the
        // follower's stop waiting for clients that will not come.
        let mut acts = self.drive(Event::LocalEnded {
            failed: result.is_err(),
        });
        if acts.is_empty() {
            acts = self.next_actions();
        }
        let (follower_error, follower_nics) = match acts.into_iter().next() {
            Some(Action::Finished {
                follower_error,
                follower_nic_plan,
            }) => (follower_error, follower_nic_plan),
            other => {
                let why = match other {
                    Some(Action::Fatal(why)) => why,
                    other => format!("internal: the link answered {other:?}"),
                };
                let mut out = RunOutcome {
                    fatal: Some(fatal(&why)),
                    samples,
                    ..RunOutcome::default()
                };
                let reason = result.err().map(|e| e.to_string());
                out.records.push(Self::record(
                    exp,
                    phase,
                    started,
                    Status::Failed,
                    reason,
                    &na,
                ));
                return out;
            }
        };
        let duration = t.elapsed().as_secs_f64();
        // The client side succeeding is not the whole run: a follower's own error (its server
        // failed after the measurements reached us) and figures no link could give fail it.
        let client_ok = result.is_ok();
        let result = result.and_then(|measured| {
            if let Some(f) = &follower_error {
                return Err(BenchError::Failed(format!(
                    "the follower's side failed: {}",
                    tcpx_link::shown(f, 600)
                )));
            }
            for row in &measured.rows {
                // One flow's bytes: a node row's times are single flows' (multi-process), so
                // the floor is the weakest that holds for every row.
                for (side, figures) in [("send", &row.send), ("recv", &row.recv)] {
                    if let Err(e) = figures.check(row.size) {
                        return Err(BenchError::Failed(format!(
                            "impossible {side} figures for {} B (from the follower at {} or a flow process): {e}",
                            row.size, self.link.peer
                        )));
                    }
                }
            }
            Ok(measured)
        });
        // Named once: in the reason above when only the follower failed.
        let follower_error = follower_error.filter(|_| !client_ok);
        let records = match result {
            Ok(measured) => {
                let mut nic_plan = BTreeMap::new();
                if let Some(p) = measured.nic_plan {
                    nic_plan.insert("leader".to_string(), p);
                }
                if let Some(p) = follower_nics {
                    nic_plan.insert("follower".to_string(), p);
                }
                measured
                    .rows
                    .into_iter()
                    .map(|row| ResultRecord {
                        size: Some(row.size),
                        chunk: Some(row.chunk),
                        send: Some(row.send),
                        recv: Some(row.recv),
                        duration_s: duration,
                        per_flow: row.per_flow,
                        nic_plan: nic_plan.clone(),
                        ..Self::record(exp, phase, started, Status::Ok, None, &na)
                    })
                    .collect()
            }
            Err(e) => {
                let mut reason = e.to_string();
                if let Some(f) = follower_error {
                    reason.push_str(&format!("; follower: {f}"));
                }
                let status = match e {
                    BenchError::Invalid(_) | BenchError::Mismatch(_) => Status::Skipped,
                    BenchError::Failed(_) | BenchError::PeerGone(_) => Status::Failed,
                };
                vec![ResultRecord {
                    duration_s: duration,
                    ..Self::record(exp, phase, started, status, Some(reason), &na)
                }]
            }
        };
        RunOutcome {
            records,
            samples,
            fatal: None,
        }
    }
}

impl Runner for LeaderRunner {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }

    fn not_applied(&self, exp: &PlanExperiment) -> NotApplied {
        knobs_not_applied(
            &exp.bench_to_run(),
            &exp.outside,
            &self.facts,
            self.loopback,
        )
    }

    fn validate(&mut self, tuned: &[(String, String)]) -> tcpx_plan::Validation {
        // The leader's node runs both ranks: its facts say whether libnccl opens and how many
        // GPUs there are.
        let nccl = self
            .facts
            .transports
            .iter()
            .filter_map(|t| t.parse::<tcpx_model::Backend>().ok())
            .any(|b| b.capabilities().is_libnccl());
        let launcher = self.launcher.clone();
        let command = move || launcher.tool_command();
        tcpx_validate::plan::validate_for_plan(self.facts.gpus.len(), nccl, tuned, &command)
    }

    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        if let Some(l) = &self.lost {
            return RunOutcome {
                fatal: Some(l.clone()),
                ..RunOutcome::default()
            };
        }
        self.observer.started(&exp.name());
        let out = self.one(exp, phase, started);
        if let Some(f) = &out.fatal {
            self.lost = Some(f.clone());
        }
        self.observer.finished();
        out
    }
}

/// The link's outcome as a protocol event.
fn link_event(r: Result<LinkMsg, LinkError>) -> Event {
    match r {
        Ok(m) => Event::Received(m),
        Err(LinkError::Closed) => Event::Closed,
        Err(LinkError::Timeout) => Event::Timeout,
        Err(LinkError::Other(e)) => Event::LinkFailed(e),
    }
}

fn drive(link: &mut Link, proto: &mut Leader, event: Event) -> Vec<Action> {
    let mut out = Vec::new();
    let mut queue = vec![event];
    while let Some(e) = queue.pop() {
        for a in proto.handle(e, Instant::now()) {
            match a {
                Action::Send(m) => match link.send(&m) {
                    Ok(()) => {}
                    Err(LinkError::Closed) => queue.push(Event::Closed),
                    Err(e) => queue.push(Event::LinkFailed(e.to_string())),
                },
                other => out.push(other),
            }
        }
    }
    out
}

fn next_actions(link: &mut Link, proto: &mut Leader) -> Vec<Action> {
    loop {
        if !proto.awaits_message() {
            return Vec::new();
        }
        let now = Instant::now();
        let wait = proto
            .poll_timeout()
            .map_or(Duration::from_secs(1), |t| t.saturating_duration_since(now));
        let event = link_event(link.recv(wait));
        let acts = drive(link, proto, event);
        if !acts.is_empty() {
            return acts;
        }
    }
}

/// Most connections greeted at once while waiting for the follower; beyond it the oldest that
/// has not said hello is closed (one that has is never closed for a newcomer), else the newcomer.
const MAX_CANDIDATES: usize = 16;
/// Longest time from a candidate's first byte of a line to its newline: a follower writes each
/// message in one piece, so a line that does not complete at once is a stranger's (one sending
/// a byte now and then cannot stretch it).
const CANDIDATE_LINE_WAIT: Duration = Duration::from_millis(500);

/// A connection on the plan port that has not proved itself yet.
struct Candidate {
    link: Link,
    proto: Leader,
    /// When the line now arriving began (its first byte was seen).
    line_began: Option<Instant>,
    /// Whether its greeting was this protocol's `Hello`.
    said_hello: bool,
}

impl Candidate {
    /// What happened on this connection since the last look, without blocking: a whole
    /// message, a line that took too long, or the greeting's own deadline.
    fn event(&mut self, now: Instant) -> Option<Event> {
        if let Some(r) = self.link.poll() {
            self.line_began = None;
            if matches!(r, Ok(LinkMsg::Hello { .. })) {
                self.said_hello = true;
            }
            return Some(link_event(r));
        }
        if self.link.line_begun() {
            let began = *self.line_began.get_or_insert(now);
            if now.duration_since(began) >= CANDIDATE_LINE_WAIT {
                return Some(Event::LinkFailed(format!(
                    "a message that did not complete in {} s",
                    CANDIDATE_LINE_WAIT.as_secs_f64()
                )));
            }
        }
        self.proto
            .poll_timeout()
            .is_some_and(|t| now >= t)
            .then_some(Event::Timeout)
    }
}

/// Accepts the follower before `deadline`: the first connection that greets in this protocol and
/// proves the run token (`token`; `None` proves an empty key, for loopback). `run` names the run
/// in the greeting. Every other connection (one that closes, stays silent, sends something
/// else, speaks another version or fails the token check) is dropped with a line on stderr and
/// the wait goes on; several are greeted at once, so a silent one does not hold up the follower.
/// The link and the protocol, ready for [`LeaderRunner::new`].
/// Nothing here blocks on one connection: each is read as its bytes arrive, a line has
/// [`CANDIDATE_LINE_WAIT`] from its first byte, a greeting the protocol's own wait, and
/// `deadline` holds whatever the connections do.
pub fn accept_follower(
    listener: &TcpListener,
    deadline: Instant,
    token: Option<&tcpx_link::auth::RunToken>,
    run: &str,
) -> Result<(Link, Leader), OrchestrateError> {
    let here = listener.local_addr()?;
    listener
        .set_nonblocking(true)
        .map_err(|e| OrchestrateError::step("accepting the follower", e))?;
    let mut pending: Vec<Candidate> = Vec::new();
    let mut closing = tcpx_link::Closing::default();
    let mut dropped: Option<String> = None;
    fn drop_one(dropped: &mut Option<String>, from: SocketAddr, why: &str) {
        // The reason may quote a stranger (its `refused` reason): escaped and cut.
        let why = tcpx_link::shown(why, 300);
        eprintln!("tcpx-run: dropped a connection from {from} on the plan port: {why}");
        *dropped = Some(format!("{from}: {why}"));
    }
    // Polls the listener and the greetings in progress; a new connection starts the pauses over.
    const PAUSES: Backoff =
        Backoff::doubling(Duration::from_micros(200), Duration::from_millis(10));
    let mut backoff = PAUSES;
    loop {
        // New connections.
        loop {
            match listener.accept() {
                Ok((stream, from)) => {
                    backoff = PAUSES;
                    if pending.len() >= MAX_CANDIDATES {
                        match pending.iter().position(|c| !c.said_hello) {
                            Some(oldest) => {
                                let c = pending.remove(oldest);
                                drop_one(
                                    &mut dropped,
                                    c.link.peer,
                                    &format!("it had not said hello, and at most {MAX_CANDIDATES} connections are greeted at once"),
                                );
                                closing.add(c.link.into_stream(), Duration::from_millis(200));
                            }
                            None => {
                                drop_one(
                                    &mut dropped,
                                    from,
                                    "too many connections greeting at once",
                                );
                                continue;
                            }
                        }
                    }
                    let link = stream
                        .set_nonblocking(false)
                        .and_then(|()| Link::new(stream));
                    let nonce = tcpx_link::auth::nonce().map_err(|e| {
                        OrchestrateError::step("reading /dev/urandom for a nonce", e)
                    })?;
                    match link {
                        Ok(link) => pending.push(Candidate {
                            link,
                            proto: Leader::new(
                                Instant::now(),
                                crate::proto::Credentials {
                                    token: token.cloned(),
                                    nonce,
                                },
                                run,
                            ),
                            line_began: None,
                            said_hello: false,
                        }),
                        Err(e) => drop_one(&mut dropped, from, &e.to_string()),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(OrchestrateError::step("accepting the follower", e)),
            }
        }
        // Greetings in progress.
        let mut i = 0;
        while i < pending.len() {
            let c = &mut pending[i];
            let acts = c
                .event(Instant::now())
                .map(|e| drive(&mut c.link, &mut c.proto, e));
            let fatal = acts.into_iter().flatten().find_map(|a| match a {
                Action::Fatal(why) => Some(why),
                _ => None,
            });
            if let Some(why) = fatal {
                let c = pending.swap_remove(i);
                drop_one(&mut dropped, c.link.peer, &why);
                closing.add(c.link.into_stream(), Duration::from_millis(200));
                continue;
            }
            if c.proto.is_idle() {
                let c = pending.swap_remove(i);
                for mut other in pending {
                    let _ = other.link.send(&LinkMsg::Refused {
                        reason: format!(
                            "this leader has its follower already ({}): one follower per run",
                            c.link.peer
                        ),
                    });
                    closing.add(other.link.into_stream(), Duration::from_millis(500));
                }
                closing.finish_in_background();
                return Ok((c.link, c.proto));
            }
            i += 1;
        }
        closing.poll();
        if !backoff.wait(deadline) {
            let last = dropped
                .map(|d| format!(" (last connection dropped: {d})"))
                .unwrap_or_default();
            return Err(OrchestrateError::Failed(format!(
                "no follower connected to {here} in time{last}: start `tcpx-run follow --leader <this host>` on the other node (or the same plan under your launcher), with the same run token, and check the firewall; raise --follower-timeout to wait longer"
            )));
        }
    }
}

/// While the run goes on, answers every further connection on the plan port with `Refused`
/// (this leader has its follower) and closes it, so a second follower ends at once with the
/// reason instead of waiting for a greeting. Stops when dropped.
pub(crate) struct RefuseOthers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RefuseOthers {
    /// Starts refusing on `listener` (a clone is kept); `follower` is named in the refusal.
    pub(crate) fn start(
        listener: &TcpListener,
        follower: SocketAddr,
    ) -> Result<RefuseOthers, OrchestrateError> {
        use std::sync::atomic::Ordering;
        let listener = listener.try_clone().map_err(|e| {
            OrchestrateError::step("keeping the plan port to refuse other followers", e)
        })?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let refusal = {
            let mut line = serde_json::to_string(&LinkMsg::Refused {
                reason: format!(
                    "this leader is running a plan with its follower at {follower} already: one follower per run"
                ),
            })?;
            line.push('\n');
            line
        };
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("tcpx-refuse".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, from)) => {
                            eprintln!(
                                "tcpx-run: refused a connection from {from} on the plan port: this run has its follower"
                            );
                            // A few at a time, each on its own thread, so a silent one holds up
                            // no other; beyond that, closed at once.
                            if busy.fetch_add(1, Ordering::Relaxed) >= MAX_CANDIDATES {
                                busy.fetch_sub(1, Ordering::Relaxed);
                                continue;
                            }
                            let (one, refusal) = (busy.clone(), refusal.clone());
                            let spawned = std::thread::Builder::new()
                                .name("tcpx-refuse-one".into())
                                .spawn(move || {
                                    refuse_one(s, &refusal);
                                    one.fetch_sub(1, Ordering::Relaxed);
                                });
                            if spawned.is_err() {
                                busy.fetch_sub(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(|e| {
                OrchestrateError::step("starting the thread that refuses other followers", e)
            })?;
        Ok(RefuseOthers {
            stop,
            thread: Some(thread),
        })
    }
}

/// Answers one connection with `refusal` once it greeted (its greeting read first, up to a
/// line of 64 KiB or 5 s, so that closing does not reset the connection and lose the answer).
fn refuse_one(s: std::net::TcpStream, refusal: &str) {
    use std::io::{BufRead, Read, Write};
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let mut greeting = Vec::new();
    let _ = std::io::BufReader::new(&s)
        .take(64 * 1024)
        .read_until(b'\n', &mut greeting);
    let _ = (&s).write_all(refusal.as_bytes());
    tcpx_link::drain_and_close(s, Duration::from_secs(1));
}

impl Drop for RefuseOthers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_bench::{Side, SideResult};

    #[test]
    fn an_auto_plugin_chunk_is_the_leaders_and_a_planned_one_is_kept() {
        let var = tcpx_transport::netplugin::DYNAMIC_CHUNK_VAR;
        // The plugin chunk the bench of `p` gets, with the leader's at 1 MiB.
        let plugin_chunk =
            |p: &PlanExperiment| bench_with_plugin_chunk(p, 1 << 20).env.get(var).cloned();
        let mut p = PlanExperiment::defaults();
        assert!(!bench_with_plugin_chunk(&p, 1 << 20).env.contains_key(var));
        p.set("transport", &serde_json::json!("netplugin")).unwrap();
        assert_eq!(plugin_chunk(&p).as_deref(), Some("1048576"));
        p.set("plugin_chunk", &serde_json::json!("256K")).unwrap();
        assert_eq!(plugin_chunk(&p).as_deref(), Some("262144"));
    }

    fn child(flow: u32, pid: u32, secs: &[f64], wrong: u64) -> ChildResult {
        let exp = Experiment {
            flows: 2,
            flow_index: Some(flow),
            multi_process: true,
            ..Experiment::default()
        };
        let side = |side, wrong| SideResult {
            wrong_bytes: wrong,
            flow_iter_secs: vec![secs.to_vec()],
            ..SideResult::of_times(side, secs.to_vec())
        };
        ChildResult {
            flow,
            role: "client".into(),
            pid,
            measurements: vec![Measurement {
                experiment: exp,
                size: 1_000_000_000,
                chunk: 1 << 19,
                send: side(Side::Send, None).summarise(1_000_000_000),
                recv: side(Side::Recv, Some(wrong)).summarise(1_000_000_000),
            }],
            nic_plan: Some(format!("flow {flow}: 127.0.0.2")),
        }
    }

    #[test]
    fn node_rows_sum_the_flows_and_keep_the_slowest_times() {
        // Flow 0: 1e9 B in 0.25 s (4 GB/s); flow 1: in 0.5 s and 1.5 s (1 GB/s average), 2 wrong.
        let m = node_rows(&[child(0, 11, &[0.25, 0.25], 0), child(1, 12, &[0.5, 1.5], 2)]);
        assert_eq!(m.rows.len(), 1);
        let r = &m.rows[0];
        assert!(
            (r.recv.algbw_gbs - 5.0).abs() < 1e-9,
            "{}",
            r.recv.algbw_gbs
        );
        assert_eq!(r.recv.busbw_gbs, r.recv.algbw_gbs);
        assert!((r.recv.avg_us - 1e6).abs() < 1e-6, "slowest flow's average");
        assert!((r.recv.max_us - 1.5e6).abs() < 1e-6);
        assert!((r.recv.min_us - 0.25e6).abs() < 1e-6, "fastest sample");
        assert_eq!(r.recv.wrong_bytes, Some(2));
        assert_eq!(r.send.wrong_bytes, None);
        assert_eq!(
            r.per_flow
                .iter()
                .map(|f| (f.flow, f.pid, f.wrong_bytes))
                .collect::<Vec<_>>(),
            [(0, Some(11), Some(0)), (1, Some(12), Some(2))]
        );
        assert_eq!(
            m.nic_plan.as_deref(),
            Some("flow 0: 127.0.0.2; flow 1: 127.0.0.2")
        );
    }
}
