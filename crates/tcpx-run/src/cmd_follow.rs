//! `tcpx-run follow`: the follower of a plan run (`tcpx_orchestrate::follower`), connecting to
//! the leader named by flags or the launcher's environment.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use tcpx_orchestrate::launch::{launch_from_env, Launch, NodeRole};
use tcpx_orchestrate::link::plan_port;
use tcpx_orchestrate::plan_run::{follow, leader_to_follow};
use tcpx_orchestrate::{FaultHooks, FollowOpts};

#[derive(clap::Args)]
pub struct FollowArgs {
    /// The leader: HOST or HOST:PORT (default: from the launcher's environment, or TCPX_LEADER).
    #[arg(long)]
    leader: Option<String>,
    /// The leader's plan port when --leader has none (or TCPX_PLAN_PORT).
    #[arg(long)]
    port: Option<u16>,
    /// How long to keep trying to reach the leader, seconds.
    #[arg(long, default_value_t = 120, value_parser = crate::args::wait_seconds)]
    connect_timeout: u64,
    /// Longest wait for the leader's next experiment, seconds.
    #[arg(long, default_value_t = 900, value_parser = crate::args::wait_seconds)]
    idle_timeout: u64,
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

/// `TCPX_PLAN_PORT` as this process sees it.
pub fn env_plan_port() -> Option<String> {
    std::env::var("TCPX_PLAN_PORT").ok()
}

pub fn run(a: &FollowArgs) -> anyhow::Result<ExitCode> {
    // Started by a leader (in a fabric's node B): die with it.
    if let Err(e) = tcpx_orchestrate::flows::die_with_parent_from_env() {
        bail!("{e}");
    }
    let launch = launch_from_env(|k| std::env::var(k).ok());
    if let Some(NodeRole::Idle(why)) = launch.as_ref().map(Launch::role) {
        eprintln!("tcpx-run follow: {why}; exiting");
        return Ok(ExitCode::SUCCESS);
    }
    let leader = leader_to_follow(a.leader.as_deref(), launch.as_ref())?;
    let served = follow(
        &leader,
        plan_port(a.port, env_plan_port().as_deref()),
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
        },
    )?;
    eprintln!("tcpx-run follow: done, served {served} experiments");
    Ok(ExitCode::SUCCESS)
}
