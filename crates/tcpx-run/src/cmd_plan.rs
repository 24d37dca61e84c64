//! `tcpx-run plans/x.rhai` (also `tcpx-run plan plans/x.rhai`): the plan runner, as leader.
//!
//! Reads the plan, picks the target set (detected platform or --targets), checks the plan
//! without running anything (knobs, criteria, charts, estimated time against --budget), finds
//! its follower (a `tcpx-run follow` on the peer node, from flags or the launcher's environment;
//! with neither, a follower on loopback in this process), runs the experiments through
//! `tcpx_orchestrate::LeaderRunner`, and writes reports/<stamp>-<plan>/ after every experiment.
//! Exit code: 0 all criteria pass, 1 some fail, 2 the run could not complete.

use std::cell::RefCell;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tcpx_orchestrate::facts::gather_facts;
use tcpx_orchestrate::knobs::knobs_not_applied;
use tcpx_orchestrate::launch::{launch_from_env, Launch, NodeRole};
use tcpx_orchestrate::link::{connect_until, plan_port, with_port};
use tcpx_orchestrate::{
    accept_follower, serve, FaultHooks, FollowOpts, LeaderObserver, LeaderRunner,
};
use tcpx_plan::Plan;

use crate::cmd_follow::env_plan_port;

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The plan file, e.g. plans/phase1_window.rhai.
    pub plan: PathBuf,
    /// Target set: a name in plans/targets/ (a3-high, loopback) or a .toml path. Default: the
    /// detected platform.
    #[arg(long)]
    pub targets: Option<String>,
    /// Refuse plans estimated to run longer than this many seconds (unless --yes).
    // Range-checked value parser (negative, NaN and garbage are usage errors).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::args::budget_seconds)]
    pub budget: Option<f64>,
    /// Run even when the estimate exceeds --budget.
    #[arg(long)]
    pub yes: bool,
    /// Check the plan and print the experiments and estimate; run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for a follower on this address (HOST:PORT or HOST) instead of starting one on
    /// loopback. Under a launcher (Slurm, torchrun, Open MPI, JobSet) local rank 0 of node 0
    /// listens on 0.0.0.0, local rank 0 of every other node follows, other local ranks exit.
    #[arg(long)]
    pub listen: Option<String>,
    /// Run on this emulated fabric (`tcpx-run fabric up`): the leader in its node A, the
    /// follower started in node B. `--targets emulated-a3` implies the default fabric `fabric`.
    #[arg(long, value_name = "ID")]
    pub fabric: Option<String>,
    /// Plan port (default 5310 or TCPX_PLAN_PORT).
    #[arg(long)]
    pub port: Option<u16>,
    /// How long to wait for the follower to connect, seconds.
    #[arg(long, default_value_t = 300, value_parser = crate::args::wait_seconds)]
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
        // Clap prints its own usage error (one "error:") and exits 2.
        Err(e) if e.use_stderr() => e.exit(),
        Err(e) => {
            print!("{e}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The progress bar a plan run draws on stderr.
struct Bar(ProgressBar);

impl LeaderObserver for Bar {
    fn started(&mut self, name: &str) {
        self.0.set_message(name.to_string());
    }

    fn finished(&mut self) {
        // Plans may run more experiments than estimated (branches).
        if self.0.position() >= self.0.length().unwrap_or(0) {
            self.0.inc_length(1);
        }
        self.0.inc(1);
    }
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
        match d.answer {
            None => println!(
                "  {}: UNANSWERED -> default branch: {}",
                d.name, d.branch_taken
            ),
            Some(_) => println!("  {}: -> {}", d.name, d.branch_taken),
        }
    }
    println!("report: {}", dir.join("index.html").display());
    println!(
        "tuned settings: {} (`tcpx-run apply {}`)",
        dir.join("tuned.env").display(),
        dir.display()
    );
}

pub fn run(a: &PlanArgs) -> anyhow::Result<ExitCode> {
    let launch = launch_from_env(|k| std::env::var(k).ok());
    if let Some(NodeRole::Idle(why)) = launch.as_ref().map(Launch::role) {
        eprintln!("tcpx-run: {why}; exiting");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(l) = launch.as_ref().filter(|l| l.role() == NodeRole::Follower) {
        // Same command on every node: the others follow node 0.
        let Some(leader) = &l.leader else {
            bail!(
                "rank {} under {} has no leader address: set TCPX_LEADER or MASTER_ADDR",
                l.rank,
                l.source
            );
        };
        let addr = with_port(leader, plan_port(a.port, env_plan_port().as_deref()));
        eprintln!(
            "tcpx-run: rank {} ({}) follows the leader at {addr}",
            l.rank, l.source
        );
        let stream = connect_until(
            &addr,
            Instant::now() + Duration::from_secs(a.follower_timeout),
        )?;
        serve(
            stream,
            &FollowOpts {
                idle: Duration::from_secs(900),
                launcher: crate::flow_launcher::SelfLauncher::shared()?,
                faults: FaultHooks::default(),
            },
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    // With --listen or a launcher the user places both sides (e.g. `fabric exec a -- ...`).
    let by_hand = a.listen.is_some() || launch.is_some();
    if by_hand && a.fabric.is_some() {
        bail!("--fabric starts both nodes on this machine itself: leave out --listen and run it outside a launcher");
    }
    let wanted = tcpx_orchestrate::on_fabric::requested(a.fabric.as_deref(), a.targets.as_deref());
    let fabric = match wanted.filter(|_| !by_hand) {
        None => None,
        Some(id) => {
            let f = tcpx_orchestrate::on_fabric::open(&id)?;
            if !tcpx_orchestrate::on_fabric::in_node_a(&id) {
                return tcpx_orchestrate::on_fabric::run_in_node_a(
                    &f,
                    &std::env::current_exe()
                        .context("finding this program to start it in node A")?,
                    std::env::args_os().skip(1).collect(),
                );
            }
            // The leader in node A dies with the command that started it there.
            if let Err(e) = tcpx_orchestrate::flows::die_with_parent(
                std::env::var(tcpx_orchestrate::PARENT_PID_ENV)
                    .ok()
                    .as_deref(),
            ) {
                bail!("{e}");
            }
            Some(f)
        }
    };
    let mut plan = Plan::load(&a.plan)?;
    plan.limits.max_operations = a.max_operations;
    let listen = match (&a.listen, &launch, &fabric) {
        (_, _, Some(f)) => Some(
            tcpx_orchestrate::on_fabric::leader_addr(
                f,
                plan_port(a.port, env_plan_port().as_deref()),
            )
            .to_string(),
        ),
        (Some(l), _, _) => Some(with_port(l, plan_port(a.port, env_plan_port().as_deref()))),
        (None, Some(_), None) => Some(format!(
            "0.0.0.0:{}",
            plan_port(a.port, env_plan_port().as_deref())
        )),
        (None, None, None) => None,
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
    let targets = tcpx_plan::choose_targets(&targets_dir(&a.plan), a.targets.as_deref(), &facts)
        .map_err(|e| anyhow!("{e}"))?;
    // The dry pass answers not_applied_here() as the real run will (loopback unless --listen).
    let support_facts = facts.clone();
    let loopback_guess = listen.is_none();
    let support: tcpx_plan::KnobSupport =
        Rc::new(move |e| knobs_not_applied(&e.knobs, &support_facts, loopback_guess));
    eprintln!("tcpx-run: checking plan {} (dry pass)", plan.name);
    let est = plan.check_budget_with(&facts, &targets, a.budget, a.yes, Some(support))?;
    eprintln!(
        "tcpx-run: plan {} ({} experiments, {} runs with repetitions, about {:.0} s), targets `{}`, \
         follower: {peer_label}",
        plan.name, est.experiments, est.runs, est.seconds, targets.name
    );
    if let Some(w) = est.warning() {
        eprintln!("tcpx-run: warning: {w}");
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
        let opts = FollowOpts {
            idle: Duration::from_secs(900),
            launcher: crate::flow_launcher::SelfLauncher::shared()?,
            faults: FaultHooks::default(),
        };
        Some(
            std::thread::Builder::new()
                .name("tcpx-follower".into())
                .spawn(move || -> anyhow::Result<u32> {
                    let s = connect_until(
                        &follower_addr.to_string(),
                        Instant::now() + Duration::from_secs(30),
                    )?;
                    serve(s, &opts)
                })
                .context("starting the loopback follower")?,
        )
    } else {
        eprintln!("tcpx-run: waiting for a follower on {follower_addr}");
        None
    };
    // On a fabric the follower is ours to start, in node B; dropped (stopped) on any early return.
    let node_b = match &fabric {
        Some(f) => Some(tcpx_orchestrate::on_fabric::NodeBFollower::start(
            f,
            &std::env::current_exe().context("finding this program to start the follower")?,
            follower_addr,
            a.follower_timeout,
        )?),
        None => None,
    };
    let link = accept_follower(
        &listener,
        Instant::now() + Duration::from_secs(a.follower_timeout),
    )?;
    let (tx_bindings, rx_bindings) = (facts.tx_bindings.clone(), facts.rx_bindings.clone());
    let mut facts = facts;
    facts.peer = format!("{} ({})", link.0.peer, peer_label);

    let bar = ProgressBar::with_draw_target(Some(est.runs as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} experiments, ETA {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let runner = Rc::new(RefCell::new(LeaderRunner::new(
        link,
        facts,
        crate::flow_launcher::SelfLauncher::shared()?,
        Box::new(Bar(bar.clone())),
        &FaultHooks {
            leader_fail_client_flow: a.test_fail_client_flow,
            ..FaultHooks::default()
        },
    )));
    let dir = a
        .reports
        .join(format!("{}-{}", tcpx_report::utc_stamp(), plan.name));
    // The report directory is checked before the first experiment.
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
    runner.borrow_mut().say_goodbye();
    if let Some(h) = follower {
        match h.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("tcpx-run: loopback follower: {e:#}"),
            Err(_) => eprintln!("tcpx-run: the loopback follower thread panicked"),
        }
    }
    if let Some(e) = node_b.and_then(|n| n.finish(Duration::from_secs(30))) {
        eprintln!("tcpx-run: {e}");
    }
    let mut report = result?;
    if let Some(f) = &fabric {
        report
            .setup
            .insert("fabric".into(), tcpx_orchestrate::on_fabric::describe(f));
        report.setup.insert(
            tcpx_report::LINE_RATE_SETUP_KEY.into(),
            f.state.rate.gbs().to_string(),
        );
        report
            .notes
            .extend(tcpx_orchestrate::on_fabric::target_notes(&targets.settings));
        let phase = report
            .phases
            .first()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        report
            .criteria
            .extend(tcpx_orchestrate::on_fabric::absolute_criterion(
                &targets.settings,
                &phase,
            ));
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
        (SETUP_NET_PLUGIN, std::env::var("NCCL_NET_PLUGIN").ok()),
    ] {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            report.setup.insert(key.into(), v);
        }
    }
    // Results that cannot be written to `dir` go to a temporary directory.
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
