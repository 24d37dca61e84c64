//! `tcpx-run plans/x.rhai` (also `tcpx-run plan plans/x.rhai`): the plan runner, as leader.
//!
//! Reads the plan, picks the target set (detected platform or --targets), checks the plan
//! without running anything (knobs, criteria, charts, estimated time against --budget), finds
//! its follower (a `tcpx-run follow` on the peer node, from flags or the launcher's environment;
//! with neither, a follower on loopback in this process), runs the experiments as the bench
//! client while the follower serves, and writes reports/<stamp>-<plan>/ after every experiment.
//! Exit code: 0 all criteria pass, 1 some fail, 2 the run could not complete.
//!
//! Each side picks its own NICs for `nics: N` (loopback: 127.0.0.2 ..= 127.0.0.(N+1)). With
//! `process_mode: "multi-process"` each side runs one `tcpx-run bench` child per flow (the
//! follower's servers on the ports it reserved, the leader's clients connecting there); the
//! result of each size is then one record whose send/recv figures are the node's (the flows' GB/s
//! summed, as `tcpx_bench::multiproc::aggregate` does; times are the slowest flow's), with each
//! flow's figures in `per_flow`, so single- and multi-process rows compare directly.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tcpx_bench::{BenchError, Experiment, Measurement};
use tcpx_plan::{Plan, PlanExperiment, RunOutcome, Runner, SystemFacts};
use tcpx_report::{FlowFigures, ResultRecord, SampleRecord, SideFigures, Status};

use crate::cmd_follow::{
    binding_for, gather_facts, irq_for, knobs_not_applied, launch_from_env, nic_policy_not_applied,
    nics_for, plan_port, run_pinned, End, FollowOpts, IrqOutcome, Link, LinkError, LinkMsg,
    NicChoice, LINK_PROTOCOL,
};

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The plan file, e.g. plans/phase1_window.rhai.
    pub plan: PathBuf,
    /// Target set: a name in plans/targets/ (a3-high, loopback) or a .toml path. Default: the
    /// detected platform.
    #[arg(long)]
    pub targets: Option<String>,
    /// Refuse plans estimated to run longer than this many seconds (unless --yes).
    // harden: range-checked value parser (negative, NaN and garbage are usage errors).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::budget_seconds)]
    pub budget: Option<f64>,
    /// Run even when the estimate exceeds --budget.
    #[arg(long)]
    pub yes: bool,
    /// Check the plan and print the experiments and estimate; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for a follower on this address (HOST:PORT or HOST) instead of starting one on
    /// loopback. Under a launcher (Slurm, torchrun, Open MPI, JobSet) rank 0 listens on
    /// 0.0.0.0 and other ranks become followers.
    #[arg(long)]
    pub listen: Option<String>,
    /// Plan port (default 5310 or TCPX_PLAN_PORT).
    #[arg(long)]
    pub port: Option<u16>,
    /// How long to wait for the follower to connect, seconds.
    #[arg(long, default_value_t = 300, value_parser = crate::args::wait_seconds)] // harden
    pub follower_timeout: u64,
    /// Where run directories go.
    #[arg(long, default_value = "reports")]
    pub reports: PathBuf,
    /// Script operation limit (stops endless loops).
    #[arg(long, default_value_t = 5_000_000)]
    pub max_operations: u64,
    /// Test hook: in the first multi-process experiment, the leader's client process for flow F
    /// exits before connecting (the follower's server for it waits for nobody).
    #[arg(long, hide = true)]
    pub test_fail_client_flow: Option<u32>,
}

#[derive(Parser)]
#[command(
    name = "tcpx-run",
    about = "Run a plan: tcpx-run plans/x.rhai [options]"
)]
struct BarePlan {
    #[command(flatten)]
    args: PlanArgs,
}

/// `tcpx-run plans/x.rhai ...` (an unknown first word): a plan when it names a .rhai file.
pub fn run_external(words: &[String]) -> anyhow::Result<ExitCode> {
    let first = words.first().map(String::as_str).unwrap_or("");
    if !first.ends_with(".rhai") {
        bail!("unknown command `{first}`: see tcpx-run --help (a plan file must end in .rhai)");
    }
    let mut argv = vec!["tcpx-run".to_string()];
    argv.extend(words.iter().cloned());
    match BarePlan::try_parse_from(argv) {
        Ok(p) => run(&p.args),
        // harden: clap prints its own usage error (one "error:") and exits 2.
        Err(e) if e.use_stderr() => e.exit(),
        Err(e) => {
            print!("{e}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn figures(s: &tcpx_bench::SideSummary) -> SideFigures {
    SideFigures {
        avg_us: s.avg_us,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        min_us: s.min_us,
        max_us: s.max_us,
        algbw_gbs: s.algbw_gbs,
        busbw_gbs: s.busbw_gbs,
        wrong_bytes: s.wrong_bytes,
    }
}

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
            send: figures(&m.send),
            recv: figures(&m.recv),
            per_flow: if exp.flows > 1 {
                tcpx_bench::multiproc::single_process_figures(std::slice::from_ref(m))
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

/// Node rows of a multi-process run: GB/s summed over the flows' processes (the arithmetic of
/// `multiproc::aggregate`, as the processes are not in lockstep), times from the slowest flow
/// (largest average, p50, p99 and max; smallest min), wrong bytes summed.
fn node_rows(children: &[tcpx_bench::multiproc::ChildResult]) -> Measured {
    let figs = tcpx_bench::multiproc::aggregate(children);
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
    let plans: Vec<String> = children
        .iter()
        .filter_map(|c| crate::cmd_bench::child_nic_plan(&c.stdout))
        .collect();
    Measured {
        rows,
        nic_plan: (!plans.is_empty()).then(|| plans.join("; ")),
    }
}

/// The leader's side of a multi-process experiment: one `tcpx-run bench --role client` child
/// per flow, flow `i` connecting to the follower's port `base + i`.
///
/// The follower's `Done` is read as soon as it arrives (into `early`): when it reports that the
/// follower's processes failed, ours are stopped at once. Otherwise a client whose server never
/// started (a port it could not bind) would retry connecting until the experiment's timeout.
fn run_flow_processes(
    exp: &Experiment,
    base: SocketAddr,
    link: &mut Link,
    early: &mut Option<Result<LinkMsg, LinkError>>,
    fail_flow: Option<u32>,
) -> Result<Measured, BenchError> {
    let mut specs = crate::cmd_bench::flow_children(exp, &["client"], base).map_err(|e| {
        BenchError::Failed(format!("starting the leader's client processes: {e:#}"))
    })?;
    for s in specs.iter_mut().filter(|s| Some(s.flow) == fail_flow) {
        s.command.arg("--test-exit-before-connect");
    }
    let mut follower_says = || {
        if early.is_some() {
            return None;
        }
        let msg = link.try_recv()?;
        let stop = match &msg {
            Ok(LinkMsg::Done { error: None, .. }) => None,
            Ok(LinkMsg::Done { error: Some(_), .. }) => {
                Some("the follower's processes failed first (its error follows)".to_string())
            }
            Ok(other) => Some(format!("the follower sent {other:?} during the run")),
            Err(e) => Some(format!("lost the follower during the run ({e})")),
        };
        *early = Some(msg);
        stop
    };
    let limit = crate::cmd_bench::children_limit(exp);
    let children = tcpx_bench::multiproc::supervise_until(specs, limit, &mut follower_says)
        .map_err(|e| {
            let text = format!("leader's client processes: {e}");
            // A child that refused the experiment as invalid (no GPU here, a backend limit) ran
            // nothing: skipped, as the single-process run is, rather than failed.
            if text.contains("error: invalid experiment: ") {
                BenchError::Invalid(text)
            } else {
                BenchError::Failed(text)
            }
        })?;
    Ok(node_rows(&children))
}

/// The leader's side of every experiment.
pub struct LeaderRunner {
    link: Link,
    facts: SystemFacts,
    loopback: bool,
    bar: ProgressBar,
    lost: Option<String>,
    /// `--test-fail-client-flow`, until the first multi-process experiment used it.
    fail_client_flow: Option<u32>,
}

impl LeaderRunner {
    fn record(
        exp: &PlanExperiment,
        phase: &str,
        started: f64,
        status: Status,
        reason: Option<String>,
        not_applied: &BTreeMap<String, String>,
    ) -> ResultRecord {
        ResultRecord {
            phase: phase.into(),
            experiment: exp.name(),
            label: exp.label(),
            knobs: exp.knobs.clone(),
            not_applied: not_applied.clone(),
            status,
            reason,
            size: None,
            chunk: None,
            send: None,
            recv: None,
            started_s: started,
            duration_s: 0.0,
            per_flow: Vec::new(),
            nic_plan: BTreeMap::new(),
        }
    }

    fn one(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let t = Instant::now();
        let mut bench = exp.bench();
        let mut na: BTreeMap<String, String> = BTreeMap::new();
        let skip = |reason: String, na: &BTreeMap<String, String>| RunOutcome {
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
        // What the backend can do, checked here so nothing is started for it.
        let cfg = tcpx_transport::socket::SocketConfig {
            socks: bench.socks_per_channel as usize,
            sock_buf: bench.sock_buf.map(|b| b as usize),
            ..Default::default()
        };
        match tcpx_transport::open(&bench.transport, cfg) {
            Err(e) => return skip(format!("not supported by this build or machine: {e}"), &na),
            Ok(t) => {
                if let Err(e) = bench.validate(Some(&t.limits())) {
                    return skip(format!("not supported by this backend: {e}"), &na);
                }
            }
        }
        for (k, v) in knobs_not_applied(&exp.knobs, &self.facts, self.loopback) {
            // IRQ policy, binding and NICs are decided below, when they are applied.
            if !["irq_policy", "thread_binding", "nics", "nic_policy"].contains(&k.as_str()) {
                na.insert(k, v);
            }
        }
        // This side's NICs (the follower picks its own when it prepares).
        let choice = nics_for(&exp.knobs, &self.facts, self.loopback);
        if let Some(r) = nic_policy_not_applied(&exp.knobs, &choice, self.loopback) {
            na.insert("nic_policy".into(), r);
        }
        match choice {
            NicChoice::Default => {}
            NicChoice::Use(nics) => bench.nics = nics,
            NicChoice::NotApplied(r) => {
                na.insert("nics".into(), r);
            }
            NicChoice::Missing(r) => return skip(format!("leader: {r}"), &na),
        }
        let _irq_guard = match irq_for(&exp.knobs, &self.facts, self.loopback) {
            IrqOutcome::NotRequested => None,
            IrqOutcome::NotApplied(r) => {
                na.insert("irq_policy".into(), r);
                None
            }
            IrqOutcome::Refused(r) => return skip(r, &na),
            IrqOutcome::Applied(g) => Some(g),
        };
        let cpus = match binding_for(&exp.knobs, &self.facts, End::Send) {
            Ok(c) => c,
            Err(r) => {
                na.insert("thread_binding".into(), r);
                None
            }
        };
        let peer = self.link.peer;
        let lost = |what: &str, e: LinkError| -> String {
            format!(
                "follower at {peer} disappeared {what} of experiment '{}' ({e}): check that node's output; the results so far are kept",
                exp.name()
            )
        };
        if let Err(e) = self.link.send(&LinkMsg::Prepare {
            exp: Box::new(bench.clone()),
            knobs: exp.knobs.clone(),
        }) {
            return RunOutcome {
                fatal: Some(lost("before the start", e)),
                ..RunOutcome::default()
            };
        }
        let port = match self.link.recv(Duration::from_secs(60)) {
            Ok(LinkMsg::Ready { port, not_applied }) => {
                for (k, v) in not_applied {
                    na.entry(k).or_insert(format!("follower: {v}"));
                }
                port
            }
            Ok(LinkMsg::Refused { reason }) => {
                return skip(format!("the follower cannot run it: {reason}"), &na)
            }
            Ok(other) => {
                return RunOutcome {
                    fatal: Some(format!("the follower sent {other:?} instead of ready")),
                    ..RunOutcome::default()
                }
            }
            Err(e) => {
                return RunOutcome {
                    fatal: Some(lost("at the start", e)),
                    ..RunOutcome::default()
                }
            }
        };
        let sampler = if exp.knobs.get("sample").and_then(|v| v.as_bool()) == Some(true) {
            tcpx_affinity::Sampler::start(
                tcpx_affinity::SysRoot::live(),
                Duration::from_millis(100),
            )
            .ok()
        } else {
            None
        };
        let addr = SocketAddr::new(self.link.peer.ip(), port);
        // The follower's answer when it came while our processes ran (multi-process only).
        let mut early: Option<Result<LinkMsg, LinkError>> = None;
        let link = &mut self.link;
        let fail_flow = if bench.multi_process {
            self.fail_client_flow.take()
        } else {
            None
        };
        // Children started from the pinned thread inherit its CPU mask.
        let (result, pin_error) = run_pinned(cpus.as_ref(), || {
            if bench.multi_process {
                run_flow_processes(&bench, addr, link, &mut early, fail_flow)
            } else {
                tcpx_bench::run_client(&bench, addr, &mut |_: &Measurement| {})
                    .map(|o| single_process_rows(&bench, &o))
            }
        });
        if let Some(p) = pin_error {
            na.insert("thread_binding".into(), p);
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
        if bench.multi_process && early.is_none() && result.is_err() {
            // Our processes failed first: the follower's may be waiting for clients that will
            // not come. If its `Done` crosses this, it ignores the request.
            let reason = "the leader's processes failed".to_string();
            let _ = self.link.send(&LinkMsg::Abort { reason });
        }
        let done = match early {
            Some(d) => d,
            None => self
                .link
                .recv(Duration::from_secs_f64(bench.timeout_s + 30.0)),
        };
        let (follower_error, follower_nics) = match done {
            Ok(LinkMsg::Done { error, nic_plan }) => (error, nic_plan),
            Ok(other) => (Some(format!("unexpected message {other:?}")), None),
            Err(e) => {
                let mut out = RunOutcome {
                    fatal: Some(lost("during the run", e)),
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
                    BenchError::Failed(_) => Status::Failed,
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

    fn not_applied(&self, exp: &PlanExperiment) -> BTreeMap<String, String> {
        knobs_not_applied(&exp.knobs, &self.facts, self.loopback)
    }

    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        if let Some(l) = &self.lost {
            return RunOutcome {
                fatal: Some(l.clone()),
                ..RunOutcome::default()
            };
        }
        self.bar.set_message(exp.name());
        let out = self.one(exp, phase, started);
        if let Some(f) = &out.fatal {
            self.lost = Some(f.clone());
        }
        if self.bar.position() >= self.bar.length().unwrap_or(0) {
            self.bar.inc_length(1);
        }
        self.bar.inc(1);
        out
    }
}

/// Accepts one follower before `deadline` and greets it.
fn accept_follower(listener: &TcpListener, deadline: Instant) -> anyhow::Result<Link> {
    let accepted = tcpx_transport::socket::accept_until(listener, deadline)
        .context("accepting the follower")?;
    let Some((stream, _)) = accepted else {
        bail!(
            "no follower connected to {} in time: start `tcpx-run follow --leader <this host>` on the other node (or the same plan under your launcher), and check the firewall",
            listener.local_addr()?
        );
    };
    let mut link = Link::new(stream)?;
    match link.recv(Duration::from_secs(30)) {
        Ok(LinkMsg::Hello { protocol, version, .. }) if protocol != LINK_PROTOCOL => bail!(
            "the follower speaks link protocol {protocol} (tcpx-run {version}), this leader {LINK_PROTOCOL}: run the same build on both nodes"
        ),
        Ok(LinkMsg::Hello { .. }) => {}
        Ok(other) => bail!("the follower sent {other:?} instead of a greeting"),
        Err(e) => bail!("waiting for the follower's greeting: {e}"),
    }
    link.send(&LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: String::new(),
    })
    .map_err(|e| anyhow!("greeting the follower: {e}"))?;
    Ok(link)
}

fn targets_dir(plan: &Path) -> PathBuf {
    plan.parent()
        .map(|p| p.join("targets"))
        .unwrap_or_else(|| PathBuf::from("plans/targets"))
}

fn print_summary(report: &tcpx_report::RunReport, dir: &Path) {
    println!("plan {}: {}", report.plan, report.verdict_line());
    for c in &report.criteria {
        println!("  [{}] {} {}", c.verdict.as_str(), c.text, c.detail);
    }
    for d in &report.decisions {
        println!("  {}: -> {}", d.name, d.branch_taken);
    }
    println!("report: {}", dir.join("index.html").display());
}

pub fn run(a: &PlanArgs) -> anyhow::Result<ExitCode> {
    let launch = launch_from_env(|k| std::env::var(k).ok());
    if let Some(l) = launch.as_ref().filter(|l| l.rank != 0) {
        // Same command on every rank: the others follow rank 0.
        let Some(leader) = &l.leader else {
            bail!(
                "rank {} under {} has no leader address: set TCPX_LEADER or MASTER_ADDR",
                l.rank,
                l.source
            );
        };
        let addr = crate::cmd_follow::with_port(leader, plan_port(a.port));
        eprintln!(
            "tcpx-run: rank {} ({}) follows the leader at {addr}",
            l.rank, l.source
        );
        let stream = crate::cmd_follow::connect_until(
            &addr,
            Instant::now() + Duration::from_secs(a.follower_timeout),
        )?;
        crate::cmd_follow::serve(
            stream,
            &FollowOpts {
                idle: Duration::from_secs(900),
                fail_after: None,
                fail_flow: None,
                hold_port: None,
            },
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut plan = Plan::load(&a.plan)?;
    plan.limits.max_operations = a.max_operations;
    let listen = match (&a.listen, &launch) {
        (Some(l), _) => Some(crate::cmd_follow::with_port(l, plan_port(a.port))),
        (None, Some(_)) => Some(format!("0.0.0.0:{}", plan_port(a.port))),
        (None, None) => None,
    };
    let peer_label = match &listen {
        Some(l) => format!("remote follower via {l}"),
        None => "loopback (in-process follower)".into(),
    };
    let facts = gather_facts(&peer_label);
    let targets = tcpx_plan::choose_targets(&targets_dir(&a.plan), a.targets.as_deref(), &facts)
        .map_err(|e| anyhow!("{e}"))?;
    // The dry pass answers not_applied_here() as the real run will (loopback unless --listen).
    let support_facts = facts.clone();
    let loopback_guess = listen.is_none();
    let support: tcpx_plan::KnobSupport =
        Rc::new(move |e| knobs_not_applied(&e.knobs, &support_facts, loopback_guess));
    eprintln!("tcpx-run: checking plan {} (dry pass)", plan.name); // harden: item 6
    let est = plan.check_budget_with(&facts, &targets, a.budget, a.yes, Some(support))?;
    eprintln!(
        "tcpx-run: plan {} ({} experiments, about {:.0} s), targets `{}`, follower: {peer_label}",
        plan.name, est.experiments, est.seconds, targets.name
    );
    if let Some(w) = est.warning() {
        eprintln!("tcpx-run: warning: {w}"); // harden: item 8
    }
    if a.dry_run {
        for n in &est.names {
            println!("{n}");
        }
        return Ok(ExitCode::SUCCESS);
    }

    let (listener, local_follower) = match &listen {
        Some(l) => (
            TcpListener::bind(l).with_context(|| format!("listening for the follower on {l}"))?,
            false,
        ),
        None => (
            TcpListener::bind("127.0.0.1:0").context("listening on loopback")?,
            true,
        ),
    };
    let follower_addr = listener.local_addr()?;
    let follower = if local_follower {
        Some(
            std::thread::Builder::new()
                .name("tcpx-follower".into())
                .spawn(move || -> anyhow::Result<u32> {
                    let s = crate::cmd_follow::connect_until(
                        &follower_addr.to_string(),
                        Instant::now() + Duration::from_secs(30),
                    )?;
                    crate::cmd_follow::serve(
                        s,
                        &FollowOpts {
                            idle: Duration::from_secs(900),
                            fail_after: None,
                            fail_flow: None,
                            hold_port: None,
                        },
                    )
                })
                .context("starting the loopback follower")?,
        )
    } else {
        eprintln!("tcpx-run: waiting for a follower on {follower_addr}");
        None
    };
    let link = accept_follower(
        &listener,
        Instant::now() + Duration::from_secs(a.follower_timeout),
    )?;
    let loopback = link.peer.ip().is_loopback();
    let mut facts = facts;
    facts.peer = format!("{} ({})", link.peer, peer_label);

    let bar =
        ProgressBar::with_draw_target(Some(est.experiments as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} experiments, ETA {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let runner = Rc::new(RefCell::new(LeaderRunner {
        link,
        facts,
        loopback,
        bar: bar.clone(),
        lost: None,
        fail_client_flow: a.test_fail_client_flow,
    }));
    let dir = a
        .reports
        .join(format!("{}-{}", tcpx_report::utc_stamp(), plan.name));
    // harden: item 1, the report directory is checked before the first experiment.
    tcpx_report::prepare_run_dir(&dir)?;
    let write_dir = dir.clone();
    let write_errors: Rc<RefCell<Vec<String>>> = Rc::default();
    let errs = write_errors.clone();
    let on_update = Box::new(move |r: &tcpx_report::RunReport| {
        if let Err(e) = tcpx_report::write_run(r, &write_dir) {
            errs.borrow_mut().push(format!("{e:#}"));
        }
    });
    let result = plan.execute(runner.clone(), &targets, on_update);
    bar.finish_and_clear();
    // Tell the follower we are done (best effort: it may be gone).
    let _ = runner.borrow_mut().link.send(&LinkMsg::Bye);
    if let Some(h) = follower {
        match h.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("tcpx-run: loopback follower: {e:#}"),
            Err(_) => eprintln!("tcpx-run: the loopback follower thread panicked"),
        }
    }
    let mut report = result?;
    report
        .setup
        .insert("targets file".into(), targets.path.display().to_string());
    report.setup.insert(
        "estimate".into(),
        format!(
            "{} experiments, about {:.0} s",
            est.experiments, est.seconds
        ),
    );
    // harden: item 1, results that cannot be written to `dir` go to a temporary directory.
    let saved = tcpx_report::write_run_or_fallback(&report, &dir)?;
    if let Some(why) = &saved.fallback_reason {
        eprintln!(
            "tcpx-run: warning: could not write the report to {} ({why}); the results are in {}",
            dir.display(),
            saved.written.dir.display()
        );
    }
    let written = saved.written;
    let dir = written.dir.clone();
    for e in written
        .chart_errors
        .iter()
        .chain(write_errors.borrow().iter())
    {
        eprintln!("tcpx-run: report: {e}");
    }
    print_summary(&report, &dir);
    if let tcpx_report::Completion::Incomplete(e) = &report.completion {
        eprintln!("tcpx-run: error: the run did not complete: {e}");
    }
    Ok(ExitCode::from(report.exit_code()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_bench::multiproc::ChildResult;
    use tcpx_bench::{Side, SideResult};

    fn child(flow: u32, pid: u32, secs: &[f64], wrong: u64) -> ChildResult {
        let exp = Experiment {
            flows: 2,
            flow_index: Some(flow),
            multi_process: true,
            ..Experiment::default()
        };
        let side = |side, wrong| SideResult {
            side,
            iter_secs: secs.to_vec(),
            wrong_bytes: wrong,
            pinning: None,
            cpu: None,
            flow_iter_secs: vec![secs.to_vec()],
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
            stdout: format!("# channels on NICs: flow {flow}: 127.0.0.2\n[]"),
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
