//! `tcpx-run follow`: the follower of a plan run (`tcpx_orchestrate::follower`), connecting to
//! the leader named by flags or the launcher's environment.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use tcpx_link::auth::{given_token, RunToken, TOKEN_ENV};
use tcpx_link::launch::{launch_from_env, Launch, NodeRole};
use tcpx_link::plan_port;
use tcpx_orchestrate::plan_run::{follow, leader_to_follow};
use tcpx_orchestrate::{FaultHooks, FollowOpts, FollowerCrash};

#[derive(clap::Args)]
pub struct FollowArgs {
    /// The leader: HOST or HOST:PORT (default: from the launcher's environment, else
    /// TCPX_LEADER, else MASTER_ADDR).
    #[arg(long)]
    leader: Option<String>,
    /// The leader's plan port when --leader has none (or TCPX_PLAN_PORT).
    #[arg(long)]
    port: Option<u16>,
    /// How long to keep trying to reach the leader, seconds.
    #[arg(long, allow_hyphen_values = true, default_value_t = 120, value_parser = crate::args::wait_seconds)]
    connect_timeout: u64,
    /// Longest wait for the leader's next experiment, seconds.
    #[arg(long, allow_hyphen_values = true, default_value_t = 900, value_parser = crate::args::wait_seconds)]
    idle_timeout: u64,
    /// File holding the run token the leader was given (default: TCPX_RUN_TOKEN); needed when
    /// the leader is not on this machine.
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Test hook: exit after serving this many experiments, as a crashed node would.
    #[arg(long, hide = true)]
    fail_after: Option<u32>,
    /// Test hook: in the first multi-process experiment, flow F's server process exits right
    /// after its client connects.
    #[arg(long, hide = true)]
    fail_flow: Option<u32>,
    /// Test hook: in the first multi-process experiment, keep flow F's control port bound, so
    /// its server process cannot bind it.
    #[arg(long, hide = true)]
    hold_port: Option<u32>,
}

/// `TCPX_PLAN_PORT` unless `--port` was given, checked (`tcpx_link::checked_env_plan_port`).
pub fn checked_env_plan_port(flag: Option<u16>) -> anyhow::Result<Option<String>> {
    tcpx_link::checked_env_plan_port(flag, std::env::var(tcpx_link::PLAN_PORT_ENV).ok())
        .map_err(anyhow::Error::msg)
}

/// The run token: `--token-file`, else `TCPX_RUN_TOKEN` (`tcpx_link::auth::given_token`).
pub fn run_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<RunToken>> {
    given_token(file, std::env::var_os(TOKEN_ENV).as_deref()).map_err(anyhow::Error::msg)
}

pub fn run(a: &FollowArgs) -> anyhow::Result<ExitCode> {
    // Started by a leader (in a fabric's node B): die with it.
    if let Err(e) = tcpx_flows::process::die_with_parent_from_env() {
        bail!("{e}");
    }
    let launch = launch_from_env(|k| std::env::var(k).ok());
    if let Some(NodeRole::Idle(why)) = launch.as_ref().map(Launch::role) {
        eprintln!("tcpx-run follow: {why}; exiting");
        return Ok(ExitCode::SUCCESS);
    }
    // Without a launcher rank, the launcher variables still name the leader (as --help says).
    let env_leader = ["TCPX_LEADER", "MASTER_ADDR"].iter().find_map(|k| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|v| (*k, v))
    });
    let source = match (&a.leader, &launch, &env_leader) {
        (Some(_), _, _) => "--leader".to_string(),
        (None, Some(l), _) => format!("the {} launcher's leader address", l.source),
        (None, None, Some((var, _))) => var.to_string(),
        (None, None, None) => "--leader".to_string(),
    };
    let leader = leader_to_follow(a.leader.as_deref(), launch.as_ref(), env_leader)?;
    let port = plan_port(a.port, checked_env_plan_port(a.port)?.as_deref());
    // A malformed address is refused here, before it reaches the resolver.
    tcpx_bench::flags::check_host_port(&tcpx_link::with_port(&leader, port))
        .map_err(|e| anyhow::anyhow!("{source}: {e}"))?;
    let token = run_token(a.token_file.as_deref())?;
    let followed = follow(
        &leader,
        port,
        Duration::from_secs(a.connect_timeout),
        &FollowOpts {
            idle: Duration::from_secs(a.idle_timeout),
            launcher: crate::flow_launcher::SelfLauncher::shared()?,
            faults: FaultHooks {
                follower_exit_after: a.fail_after,
                follower_fail_flow: a.fail_flow,
                follower_hold_port: a.hold_port,
                leader_fail_client_flow: None,
            },
            token,
            side_env: crate::backend_env::side_env()?,
        },
    );
    let served = match followed {
        Err(e) if e.follower_crash().is_some() => {
            return Ok(ExitCode::from(FollowerCrash::EXIT_STATUS))
        }
        r => r?,
    };
    eprintln!("tcpx-run follow: done, served {served} experiments");
    Ok(ExitCode::SUCCESS)
}
