//! A whole plan run on the leader's node, from a plan file to a written report directory, and
//! the follower's way in: what `tcpx-run plans/x.rhai` and `tcpx-run follow` do once their flags
//! are parsed.
//!
//! [`run_plan`] loads the plan, picks the target set (detected platform or the caller's choice),
//! checks the plan without running anything (knobs, criteria, charts, estimated time against a
//! budget), finds its follower (one that connects to a listening address, one started in node B
//! of an emulated fabric, or one on loopback in this process), runs the experiments through
//! [`LeaderRunner`], and writes the report directory after every experiment. It says what it
//! does on stderr as `tcpx-run: ...` lines, as [`crate::on_fabric`] does; the caller prints the
//! outcome ([`PlanRunOutcome`]).

use std::cell::RefCell;
use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_plan::Plan;
use tcpx_report::RunReport;

use crate::error::{chain, Cause, OrchestrateError};
use crate::facts::gather_facts;
use crate::knobs::knobs_not_applied;
use crate::{
    accept_follower, on_fabric, serve, FaultHooks, FollowOpts, LeaderObserver, LeaderRunner,
};
use tcpx_bench::flags::check_host_port;
use tcpx_flows::Launcher;
use tcpx_link::auth::{require_token, RunToken};
use tcpx_link::launch::Launch;
use tcpx_link::{connect_until, plan_port, with_port};

/// How long a follower started here waits for the leader's next experiment.
const FOLLOWER_IDLE: Duration = Duration::from_secs(900);

/// What a plan run is asked to do (the leader's command line, parsed).
#[derive(Clone, Debug)]
pub struct PlanRunOptions {
    /// The plan file.
    pub plan: PathBuf,
    /// Target set: a name in the plan's `targets/` directory or a .toml path; `None`: the
    /// detected platform.
    pub targets: Option<String>,
    /// Refuse plans estimated to run longer than this many seconds (unless `yes`).
    pub budget: Option<f64>,
    /// Run even when the estimate exceeds `budget`.
    pub yes: bool,
    /// Check the plan and list its experiments; run nothing.
    pub dry_run: bool,
    /// Wait for a follower on this address (HOST:PORT or HOST) instead of starting one.
    pub listen: Option<String>,
    /// Run on this emulated fabric: the leader in its node A, the follower in node B.
    pub fabric: Option<String>,
    /// Plan port given on the command line.
    pub port: Option<u16>,
    /// `TCPX_PLAN_PORT` as the process sees it.
    pub env_plan_port: Option<String>,
    /// How long to wait for the follower to connect, seconds.
    pub follower_timeout: u64,
    /// Where run directories go.
    pub reports: PathBuf,
    /// Script operation limit.
    pub max_operations: u64,
    /// Faults for tests; the default in production.
    pub faults: FaultHooks,
    /// The run token (`TCPX_RUN_TOKEN` or `--token-file`, read by the caller): required to
    /// listen beyond loopback or follow a leader beyond this machine; generated for a follower
    /// this run starts itself (loopback, fabric node B).
    pub token: Option<RunToken>,
    /// GPUDirect-TCPX's dynamic chunk for netplugin experiments that leave `plugin_chunk`
    /// unset (the caller's checked reading of NCCL_DYNAMIC_CHUNK_SIZE); `None`: Google's value.
    pub plugin_chunk: Option<u64>,
    /// This process's backend settings (and NIC places in an emulated fabric node), as the
    /// caller read them; the follower this run starts in this process shares them.
    pub side_env: tcpx_bench::SideEnv,
}

impl PlanRunOptions {
    fn plan_port(&self) -> u16 {
        plan_port(self.port, self.env_plan_port.as_deref())
    }
}

/// How the run starts processes: flow processes through `launcher`; `program` (with `args`, the
/// caller's own command line) run again inside node A of a fabric, and `program follow` in
/// node B.
pub struct PlanRunProcess {
    /// Starts flow processes.
    pub launcher: Arc<dyn Launcher>,
    /// The program that runs plans (`tcpx-run`).
    pub program: PathBuf,
    /// The caller's arguments, without the program name.
    pub args: Vec<OsString>,
    /// The launcher environment this process runs under, if any.
    pub launch: Option<Launch>,
}

/// What the caller shows while experiments run.
pub trait PlanProgress {
    /// The run starts with `runs` experiment runs estimated; the observer hears each one.
    fn observer(&mut self, runs: u64) -> Box<dyn LeaderObserver>;
    /// The experiments are over (before the follower is told goodbye).
    fn done(&mut self);
}

/// How a plan run ended.
pub enum PlanRunOutcome {
    /// The run happened in node A of the fabric, in another process: its exit code.
    InNodeA(ExitCode),
    /// A dry run: the experiments the plan would run, in order.
    DryRun(Vec<String>),
    /// The run's report (complete or not) and where it was written.
    Ran {
        report: Box<RunReport>,
        dir: PathBuf,
    },
}

/// Under a launcher, a process whose role is to follow: connects to the launcher's leader and
/// serves its experiments.
pub fn follow_launched(
    launch: &Launch,
    opts: &PlanRunOptions,
    launcher: Arc<dyn Launcher>,
) -> Result<u32, OrchestrateError> {
    // Same command on every node: the others follow node 0.
    let Some(leader) = &launch.leader else {
        return Err(OrchestrateError::Refused(format!(
            "rank {} under {} has no leader address: set TCPX_LEADER or MASTER_ADDR",
            launch.rank, launch.source
        )));
    };
    let addr = with_port(leader, opts.plan_port());
    check_host_port(&addr).map_err(|e| {
        OrchestrateError::Refused(format!("the leader address from {}: {e}", launch.source))
    })?;
    eprintln!(
        "tcpx-run: rank {} ({}) follows the leader at {addr}",
        launch.rank, launch.source
    );
    let stream = connect_until(
        &addr,
        Instant::now() + Duration::from_secs(opts.follower_timeout),
    )?;
    serve(
        stream,
        &FollowOpts {
            idle: FOLLOWER_IDLE,
            launcher,
            faults: FaultHooks::default(),
            token: opts.token.clone(),
            side_env: opts.side_env.clone(),
        },
    )
}

/// `tcpx-run follow`'s leader: the flag, else the launcher's leader, else `env_leader` (the
/// variable and value of `TCPX_LEADER` or `MASTER_ADDR` without a launcher rank, read by the
/// caller); an error saying what to give when none names one.
pub fn leader_to_follow(
    flag: Option<&str>,
    launch: Option<&Launch>,
    env_leader: Option<(&str, String)>,
) -> Result<String, OrchestrateError> {
    match (flag, launch) {
        (Some(l), _) => Ok(l.to_string()),
        (None, Some(Launch { leader: Some(l), .. })) => Ok(l.clone()),
        (None, None) if env_leader.is_some() => {
            let (var, value) = env_leader.unwrap_or_default();
            eprintln!("tcpx-run follow: the leader is {value} (from {var})");
            Ok(value)
        }
        (None, Some(l)) => Err(OrchestrateError::Refused(format!(
            "the {} launcher gives rank {} but no leader address: pass --leader HOST or set TCPX_LEADER (or MASTER_ADDR)",
            l.source,
            l.rank
        ))),
        (None, None) => Err(OrchestrateError::Refused(
            "no leader given: pass --leader HOST[:PORT], or start under a launcher (Slurm, torchrun, Open MPI, JobSet) with MASTER_ADDR or TCPX_LEADER set".into(),
        )),
    }
}

/// `tcpx-run follow` once its leader is known: connects to `leader` (on `port` when it names
/// none) within `connect_timeout` and serves its experiments; the number served.
pub fn follow(
    leader: &str,
    port: u16,
    connect_timeout: Duration,
    opts: &FollowOpts,
) -> Result<u32, OrchestrateError> {
    let addr = with_port(leader, port);
    check_host_port(&addr).map_err(|e| OrchestrateError::Refused(format!("--leader: {e}")))?;
    eprintln!("tcpx-run follow: connecting to the leader at {addr}");
    let stream = connect_until(&addr, Instant::now() + connect_timeout)?;
    serve(stream, opts)
}

/// The IP a listen address (checked by [`check_host_port`]) binds: a host name other than
/// `localhost` counts as beyond this machine.
fn listen_ip(addr: &str) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    match addr.parse::<SocketAddr>() {
        Ok(a) => a.ip(),
        Err(_) if addr.starts_with("localhost:") => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Err(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

/// The target sets next to a plan: `<plan dir>/targets`.
pub fn targets_dir(plan: &Path) -> PathBuf {
    plan.parent()
        .map(|p| p.join("targets"))
        .unwrap_or_else(|| PathBuf::from("plans/targets"))
}

/// Runs the plan as leader (see the module doc). A process under a launcher whose role is not
/// the leader's is the caller's to handle first ([`follow_launched`]).
pub fn run_plan(
    opts: &PlanRunOptions,
    process: &PlanRunProcess,
    progress: &mut dyn PlanProgress,
) -> Result<PlanRunOutcome, OrchestrateError> {
    let launch = process.launch.as_ref();
    // With --listen or a launcher the user places both sides (e.g. `fabric exec a -- ...`).
    let by_hand = opts.listen.is_some() || launch.is_some();
    if by_hand && opts.fabric.is_some() {
        return Err(OrchestrateError::Refused("--fabric starts both nodes on this machine itself: leave out --listen and run it outside a launcher".into()));
    }
    let wanted = on_fabric::requested(opts.fabric.as_deref(), opts.targets.as_deref());
    let fabric = match wanted.filter(|_| !by_hand) {
        None => None,
        Some(id) => {
            let f = on_fabric::open(&id)?;
            if !on_fabric::in_node_a(&id) {
                return Ok(PlanRunOutcome::InNodeA(on_fabric::run_in_node_a(
                    &f,
                    &process.program,
                    process.args.clone(),
                )?));
            }
            // The leader in node A dies with the command that started it there.
            if let Err(e) = tcpx_flows::process::die_with_parent_from_env() {
                return Err(OrchestrateError::Failed(e));
            }
            Some(f)
        }
    };
    let mut plan = Plan::load(&opts.plan)?;
    plan.limits.max_operations = opts.max_operations;
    plan.budget_s = opts.budget;
    let port = opts.plan_port();
    let listen = match (&opts.listen, launch, &fabric) {
        (_, _, Some(f)) => Some(on_fabric::leader_addr(f, port).to_string()),
        (Some(l), _, _) => {
            let a = with_port(l, port);
            check_host_port(&a).map_err(|e| OrchestrateError::Refused(format!("--listen: {e}")))?;
            Some(a)
        }
        // Under a launcher: where the launcher says the leader is when that is loopback (one
        // node), else every address (a run token is then required).
        (None, Some(l), None) => Some(
            l.leader
                .as_deref()
                .and_then(|h| with_port(h, port).parse::<std::net::SocketAddr>().ok())
                .filter(|a| a.ip().is_loopback())
                .map_or_else(|| format!("0.0.0.0:{port}"), |a| a.to_string()),
        ),
        (None, None, None) => None,
    };
    // The token: the caller's; else, for a follower this run starts itself, a fresh one. A
    // leader that anyone beyond this machine can reach needs one given (the follower must
    // know it).
    let token = match (&opts.token, &listen, &fabric) {
        (Some(t), _, _) => Some(t.clone()),
        (None, None, _) | (None, _, Some(_)) => Some(
            RunToken::generate()
                .map_err(|e| OrchestrateError::step("reading /dev/urandom for a run token", e))?,
        ),
        (None, Some(l), None) => {
            let ip = listen_ip(l);
            let side = match &opts.listen {
                Some(_) => "--listen",
                None => "listening for the launcher's follower",
            };
            if !opts.dry_run {
                require_token(None, ip, side).map_err(OrchestrateError::Refused)?;
            }
            None
        }
    };
    let peer_label = match (&listen, &fabric) {
        (Some(l), Some(f)) => format!(
            "follower in node B ({}) of emulated fabric `{}` via {l}",
            f.ns(tcpx_fabric::Node::B),
            f.id()
        ),
        (Some(l), None) => format!("remote follower via {l}"),
        (None, _) => "loopback (in-process follower)".into(),
    };
    let facts = gather_facts(&peer_label);
    let targets =
        tcpx_plan::choose_targets(&targets_dir(&opts.plan), opts.targets.as_deref(), &facts)
            .map_err(|e| OrchestrateError::Refused(e.to_string()))?;
    // The dry pass answers not_applied_here() as the real run will (loopback unless --listen).
    let support_facts = facts.clone();
    let loopback_guess = listen.is_none();
    let support: tcpx_plan::KnobSupport = Rc::new(move |e| {
        knobs_not_applied(
            &e.bench_to_run(),
            &e.outside,
            &support_facts,
            loopback_guess,
        )
    });
    eprintln!("tcpx-run: checking plan {} (dry pass)", plan.name);
    let est = plan.check_budget_with(&facts, &targets, opts.budget, opts.yes, Some(support))?;
    eprintln!(
        "tcpx-run: plan {} ({} experiments, {} runs with repetitions, about {:.0} s; at most \
         {:.0} s if every comparison needs its most rounds), targets `{}`, follower: {peer_label}",
        plan.name, est.experiments, est.runs, est.seconds, est.worst_seconds, targets.name
    );
    if let Some(w) = est.warning() {
        eprintln!("tcpx-run: warning: {w}");
    }
    if opts.dry_run {
        return Ok(PlanRunOutcome::DryRun(est.names.clone()));
    }

    let (listener, local_follower) = match &listen {
        Some(l) => (
            TcpListener::bind(l).map_err(|e| {
                OrchestrateError::step(format!("listening for the follower on {l}"), e)
            })?,
            false,
        ),
        None => (
            TcpListener::bind("127.0.0.1:0")
                .map_err(|e| OrchestrateError::step("listening on loopback", e))?,
            true,
        ),
    };
    let follower_addr = listener.local_addr()?;
    let follower = if local_follower {
        let opts = FollowOpts {
            idle: FOLLOWER_IDLE,
            launcher: process.launcher.clone(),
            faults: FaultHooks::default(),
            token: token.clone(),
            side_env: opts.side_env.clone(),
        };
        Some(
            std::thread::Builder::new()
                .name("tcpx-follower".into())
                .spawn(move || -> Result<u32, OrchestrateError> {
                    let s = connect_until(
                        &follower_addr.to_string(),
                        Instant::now() + Duration::from_secs(30),
                    )?;
                    serve(s, &opts)
                })
                .map_err(|e| OrchestrateError::step("starting the loopback follower", e))?,
        )
    } else {
        eprintln!("tcpx-run: waiting for a follower on {follower_addr}");
        None
    };
    // On a fabric the follower is ours to start, in node B; dropped (stopped) on any early return.
    let node_b = match &fabric {
        Some(f) => Some(on_fabric::NodeBFollower::start(
            f,
            &process.program,
            follower_addr,
            opts.follower_timeout,
            token.as_ref(),
        )?),
        None => None,
    };
    let link = accept_follower(
        &listener,
        Instant::now() + Duration::from_secs(opts.follower_timeout),
        token.as_ref(),
        &format!("plan {}", plan.name),
    )?;
    if !local_follower {
        eprintln!(
            "tcpx-run: follower {} joined{}",
            link.0.peer,
            if token.is_some() {
                " (run token proven both ways)"
            } else {
                " (no run token: loopback only)"
            }
        );
    }
    // A second follower is told at once that this run has one.
    let _refuse_others = crate::leader::RefuseOthers::start(&listener, link.0.peer)?;
    let (tx_bindings, rx_bindings) = (facts.tx_bindings.clone(), facts.rx_bindings.clone());
    let mut facts = facts;
    facts.peer = format!("{} ({})", link.0.peer, peer_label);

    let runner = Rc::new(RefCell::new(
        LeaderRunner::new(
            link,
            facts,
            process.launcher.clone(),
            progress.observer(est.runs as u64),
            &opts.faults,
        )
        .with_plugin_chunk(opts.plugin_chunk)
        .with_side_env(opts.side_env.clone()),
    ));
    // The report directory is created (for this run alone) and checked before the first
    // experiment.
    let dir = tcpx_report::create_run_dir(
        &opts.reports,
        &format!("{}-{}", tcpx_report::utc_stamp(), plan.name),
    )
    .map_err(OrchestrateError::report)?;
    let write_dir = dir.clone();
    let write_errors: Rc<RefCell<Vec<String>>> = Rc::default();
    let errs = write_errors.clone();
    let on_update = Box::new(move |r: &RunReport| {
        if let Err(e) = tcpx_report::write_run(r, &write_dir) {
            let e: Cause = e.into();
            errs.borrow_mut().push(chain(&*e));
        }
    });
    let result = plan.execute(runner.clone(), &targets, on_update);
    progress.done();
    // Tell the follower we are done (best effort: it may be gone).
    runner.borrow_mut().say_goodbye();
    if let Some(h) = follower {
        match h.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("tcpx-run: loopback follower: {}", chain(&e)),
            Err(_) => eprintln!("tcpx-run: the loopback follower thread panicked"),
        }
    }
    if let Some(e) = node_b.and_then(|n| n.finish(Duration::from_secs(30))) {
        eprintln!("tcpx-run: {e}");
    }
    let mut report = result?;
    if let Some(f) = &fabric {
        report.setup.insert("fabric".into(), on_fabric::describe(f));
        report.setup.insert(
            tcpx_report::LINE_RATE_SETUP_KEY.into(),
            f.state.rate.gbs().to_string(),
        );
        report
            .notes
            .extend(on_fabric::target_notes(&targets.settings));
        let phase = report
            .phases
            .first()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        report
            .criteria
            .extend(on_fabric::absolute_criterion(&targets.settings, &phase));
    }
    report
        .setup
        .insert("targets file".into(), targets.path.display().to_string());
    report.setup.insert(
        "estimate".into(),
        format!(
            "{} experiments, {} runs with repetitions, about {:.0} s",
            est.experiments, est.runs, est.seconds
        ),
    );
    // What tuned.env needs to name machine-specific values (bindings, the plugin loaded).
    use tcpx_report::tuned::{SETUP_NET_PLUGIN, SETUP_RX_BINDINGS, SETUP_TX_BINDINGS};
    for (key, value) in [
        (SETUP_TX_BINDINGS, Some(tx_bindings)),
        (SETUP_RX_BINDINGS, Some(rx_bindings)),
        (SETUP_NET_PLUGIN, opts.side_env.backends.net_plugin.clone()),
    ] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            report.setup.insert(key.into(), v);
        }
    }
    // Results that cannot be written to `dir` go to a temporary directory.
    let saved =
        tcpx_report::write_run_or_fallback(&report, &dir).map_err(OrchestrateError::report)?;
    if let Some(why) = &saved.fallback_reason {
        eprintln!(
            "tcpx-run: warning: could not write the report to {} ({why}); the results are in {}",
            dir.display(),
            saved.written.dir.display()
        );
    }
    let written = saved.written;
    for e in written
        .chart_errors
        .iter()
        .chain(write_errors.borrow().iter())
    {
        eprintln!("tcpx-run: report: {e}");
    }
    Ok(PlanRunOutcome::Ran {
        report: Box::new(report),
        dir: written.dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(leader: Option<&str>) -> Launch {
        Launch {
            rank: 3,
            leader: leader.map(String::from),
            source: "slurm",
            node_rank: Some(1),
            local_rank: Some(0),
        }
    }

    #[test]
    fn the_leader_to_follow_is_the_flag_then_the_launchers() {
        assert_eq!(
            leader_to_follow(Some("a:1"), Some(&launch(Some("b"))), None).unwrap(),
            "a:1"
        );
        assert_eq!(
            leader_to_follow(None, Some(&launch(Some("b"))), None).unwrap(),
            "b"
        );
        // Without a launcher rank, TCPX_LEADER / MASTER_ADDR as the caller read them.
        assert_eq!(
            leader_to_follow(None, None, Some(("MASTER_ADDR", "h0".into()))).unwrap(),
            "h0"
        );
        let e = leader_to_follow(None, Some(&launch(None)), None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the slurm launcher gives rank 3 but no leader address"),
            "{e}"
        );
        let e = leader_to_follow(None, None, None).unwrap_err();
        assert!(e.to_string().contains("pass --leader HOST[:PORT]"), "{e}");
    }

    #[test]
    fn target_sets_sit_next_to_the_plan() {
        assert_eq!(
            targets_dir(Path::new("plans/x.rhai")),
            Path::new("plans/targets")
        );
        assert_eq!(targets_dir(Path::new("/")), Path::new("plans/targets"));
    }

    #[test]
    fn a_launched_follower_without_a_leader_says_what_to_set() {
        let opts = PlanRunOptions {
            plan: "p.rhai".into(),
            targets: None,
            budget: None,
            yes: false,
            dry_run: false,
            listen: None,
            fabric: None,
            port: None,
            env_plan_port: None,
            follower_timeout: 1,
            reports: "reports".into(),
            max_operations: 1,
            faults: FaultHooks::default(),
            token: None,
            plugin_chunk: None,
            side_env: Default::default(),
        };
        struct NoLauncher;
        impl Launcher for NoLauncher {
            fn tool_command(&self) -> std::io::Result<std::process::Command> {
                Err(std::io::Error::other("none"))
            }
            fn flow_command(
                &self,
                _: &tcpx_flows::FlowJob<'_>,
            ) -> std::io::Result<std::process::Command> {
                Err(std::io::Error::other("none"))
            }
        }
        let e = follow_launched(&launch(None), &opts, Arc::new(NoLauncher)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rank 3 under slurm has no leader address: set TCPX_LEADER or MASTER_ADDR"
        );
    }
}
