//! `tcpx-run plans/x.rhai` (also `tcpx-run plan plans/x.rhai`): the plan runner, as leader.
//!
//! The run itself is `tcpx_orchestrate::plan_run`: this module parses the flags, draws the
//! progress bar and prints the summary. Exit code: 0 all criteria pass, 1 some fail, 2 the run
//! could not complete.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tcpx_link::launch::{launch_from_env, Launch, NodeRole};
use tcpx_orchestrate::plan_run::{
    follow_launched, run_plan, PlanProgress, PlanRunOptions, PlanRunOutcome, PlanRunProcess,
};
use tcpx_orchestrate::{FaultHooks, LeaderObserver};

use crate::cmd_follow::{checked_env_plan_port, run_token};

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
    /// An address beyond loopback needs a run token (TCPX_RUN_TOKEN or --token-file), the same
    /// as the follower's.
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
    #[arg(long, allow_hyphen_values = true, default_value_t = 300, value_parser = crate::args::wait_seconds)]
    pub follower_timeout: u64,
    /// Where run directories go.
    #[arg(long, default_value = "reports")]
    pub reports: PathBuf,
    /// Exit 2 when the run measured nothing (every experiment skipped or failed, e.g. refused
    /// on this machine): for CI gates, where such a run would otherwise end in exit 0 and the
    /// verdict NOTHING MEASURED.
    #[arg(long)]
    pub require_measured: bool,
    /// Script operation limit (stops endless loops): 1 or more.
    #[arg(long, default_value_t = 5_000_000, value_parser = crate::args::max_operations)]
    pub max_operations: u64,
    /// File holding the run token (default: TCPX_RUN_TOKEN): required with --listen on an
    /// address beyond loopback, and the follower needs the same.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
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
/// A net plugin is initialised once per process, at its first load: in a plan that may be the
/// backend check before any experiment, with none of the experiment's variables. So the plugin's
/// dynamic chunk goes into this process's environment before anything loads: a user's value is
/// kept (0 or an unusable one refused with the fix), none becomes Google's 524288. Experiments
/// in this process then share it; a `plugin_chunk` knob takes effect in flow processes
/// (`process_mode` multi-process), each of which loads the plugin afresh.
/// Returns the chunk and, when tcpx-lab supplied it, the line saying so: printed once the run
/// shows an experiment that used a net plugin (a plan without one has no use for it).
fn plugin_chunk_for_the_process() -> anyhow::Result<(u64, Option<String>)> {
    use tcpx_transport::netplugin::{plugin_chunk, ChunkSource, DYNAMIC_CHUNK_VAR};
    let given = std::env::var(DYNAMIC_CHUNK_VAR).ok();
    let c = plugin_chunk(&Default::default(), given.as_deref()).map_err(|e| anyhow::anyhow!(e))?;
    let mut line = None;
    if c.source == ChunkSource::Supplied {
        // Single-threaded still: nothing else reads the environment yet.
        std::env::set_var(DYNAMIC_CHUNK_VAR, c.bytes.to_string());
        line = Some(format!("tcpx-run plan: # {}", c.line()));
    }
    Ok((c.bytes, line))
}

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

/// The progress bar a plan run draws on stderr, made once the estimate is known.
#[derive(Default)]
struct Bar(Option<ProgressBar>);

impl PlanProgress for Bar {
    fn observer(&mut self, runs: u64) -> Box<dyn LeaderObserver> {
        let bar = ProgressBar::with_draw_target(Some(runs), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} experiments, ETA {eta} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.0 = Some(bar.clone());
        Box::new(Bar(Some(bar)))
    }

    fn done(&mut self) {
        self.0.iter().for_each(ProgressBar::finish_and_clear);
    }
}

impl LeaderObserver for Bar {
    fn started(&mut self, name: &str) {
        self.0.iter().for_each(|b| b.set_message(name.to_string()));
    }

    fn finished(&mut self) {
        // Plans may run more experiments than estimated (branches).
        if let Some(b) = &self.0 {
            if b.position() >= b.length().unwrap_or(0) {
                b.inc_length(1);
            }
            b.inc(1);
        }
    }
}

pub fn run(a: &PlanArgs) -> anyhow::Result<ExitCode> {
    let (plugin_chunk, chunk_line) = plugin_chunk_for_the_process()?;
    let launch = launch_from_env(|k| std::env::var(k).ok());
    if let Some(NodeRole::Idle(why)) = launch.as_ref().map(Launch::role) {
        eprintln!("tcpx-run: {why}; exiting");
        return Ok(ExitCode::SUCCESS);
    }
    let opts = PlanRunOptions {
        plan: a.plan.clone(),
        targets: a.targets.clone(),
        budget: a.budget,
        yes: a.yes,
        dry_run: a.dry_run,
        listen: a.listen.clone(),
        fabric: a.fabric.clone(),
        port: a.port,
        env_plan_port: checked_env_plan_port(a.port)?,
        follower_timeout: a.follower_timeout,
        reports: a.reports.clone(),
        max_operations: a.max_operations,
        faults: FaultHooks {
            leader_fail_client_flow: a.test_fail_client_flow,
            ..FaultHooks::default()
        },
        token: run_token(a.token_file.as_deref())?,
        plugin_chunk: Some(plugin_chunk),
        side_env: crate::backend_env::side_env()?,
    };
    let launcher = crate::flow_launcher::SelfLauncher::shared()?;
    // A dry run only checks the plan: it never waits as a follower.
    if let Some(l) = launch
        .as_ref()
        .filter(|l| l.role() == NodeRole::Follower && !a.dry_run)
    {
        follow_launched(l, &opts, launcher)?;
        return Ok(ExitCode::SUCCESS);
    }
    let process = PlanRunProcess {
        launcher,
        program: std::env::current_exe().context("finding this program to start it again")?,
        args: std::env::args_os().skip(1).collect(),
        launch,
    };
    match run_plan(&opts, &process, &mut Bar::default())? {
        PlanRunOutcome::InNodeA(code) => Ok(code),
        PlanRunOutcome::DryRun(names) => {
            for n in &names {
                println!("{n}");
            }
            Ok(ExitCode::SUCCESS)
        }
        PlanRunOutcome::Ran { report, dir } => {
            if let Some(l) = chunk_line.filter(|_| report.used_a_net_plugin()) {
                eprintln!("{l}");
            }
            print!("{}", report.console_summary(&dir));
            if let tcpx_report::Completion::Incomplete(e) = &report.completion {
                eprintln!("tcpx-run: error: the run did not complete: {e}");
            }
            if report.nothing_measured() {
                eprintln!(
                    "tcpx-run: {}: no experiment measured anything here (see the reasons in {}){}",
                    if a.require_measured {
                        "error"
                    } else {
                        "warning"
                    },
                    dir.join("summary.md").display(),
                    if a.require_measured {
                        ""
                    } else {
                        "; --require-measured makes this exit 2"
                    }
                );
                if a.require_measured {
                    return Ok(ExitCode::from(2));
                }
            }
            Ok(ExitCode::from(report.exit_code()))
        }
    }
}
