//! `tcpx-run fleet`: fleet qualification. One process per node, started by the job's launcher
//! (roles from its environment) or by hand (`--rank`, `--nodes`, `--leader`); rank 0 leads,
//! measures every ordered pair of nodes on each NIC and on all NICs together, writes the
//! matrix and the report, and names the slow node, NIC or pair. The run is
//! `tcpx_fleet`; this module maps flags and the launcher's environment onto it and
//! prints.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use tcpx_fleet::options::{
    check_size, leader_listener, FleetOptions, FleetPlace, DEFAULT_FLEET_PORT,
};
use tcpx_fleet::run as fleet_run;
use tcpx_link::launch::{launch_from_env, NodeRole};
use tcpx_link::with_port;

#[derive(clap::Args)]
pub struct FleetArgs {
    /// Nodes in the fleet (default: from the launcher: SLURM_JOB_NUM_NODES, Open MPI's or PMI's
    /// world size, torchrun's GROUP_WORLD_SIZE).
    #[arg(long)]
    nodes: Option<u32>,
    /// This node's rank, 0 leads (default: the launcher's node rank).
    #[arg(long)]
    rank: Option<u32>,
    /// The leader: HOST or HOST:PORT (default: the launcher's leader host, or TCPX_LEADER).
    #[arg(long)]
    leader: Option<String>,
    /// The leader's port when --leader (or the launcher) gives none.
    #[arg(long, default_value_t = DEFAULT_FLEET_PORT)]
    port: u16,
    /// Leader: where to listen for the nodes, ADDR:PORT (default: the leader address, else
    /// 0.0.0.0 on --port; a port of 0 picks a free one, printed).
    #[arg(long)]
    listen: Option<String>,
    /// Repetitions of the whole matrix.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
    /// Seconds nodes may take to join; those missing then are named and the rest go on.
    #[arg(long, default_value_t = 120, value_parser = crate::args::wait_seconds)]
    join_timeout: u64,
    /// Seconds one pair run may take before a silent side counts as a lost node (default: twice
    /// the experiment's --timeout plus 30).
    #[arg(long, value_parser = crate::args::wait_seconds)]
    pair_timeout: Option<u64>,
    /// Leader: the directory for matrix.csv, matrix.json and report.html.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Percent below its peers' median at which a node, NIC or pair is named.
    #[arg(long, default_value_t = 10.0)]
    below_pct: f64,
    /// File holding the run token every node shares (default: TCPX_RUN_TOKEN); needed beyond
    /// loopback.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The bench experiment each pair runs (--size, --iters, --verify, ...); --nics are this
    /// node's NICs (interface names or local addresses), the same count on every node.
    #[command(
        flatten,
        next_help_heading = "The bench experiment of every pair (--nics: this node's NICs)"
    )]
    knobs: crate::cmd_bench::KnobArgs,
}

fn say(line: &str) {
    let mut e = std::io::stderr();
    let _ = writeln!(e, "tcpx-run fleet: {line}");
    let _ = e.flush();
}

pub fn run(a: &FleetArgs) -> Result<ExitCode> {
    let get = |k: &str| std::env::var(k).ok();
    let launch = launch_from_env(get);
    if let Some(l) = &launch {
        if let NodeRole::Idle(why) = l.role() {
            say(&why);
            return Ok(ExitCode::SUCCESS);
        }
    }
    let place = FleetPlace::resolve(a.rank, a.nodes, a.leader.clone(), launch.as_ref(), get)?;
    let exp = a.knobs.experiment().map_err(|e| anyhow!(e))?;
    let mut opts = FleetOptions::new(
        &place,
        exp,
        a.reps,
        Duration::from_secs(a.join_timeout),
        a.pair_timeout.map(Duration::from_secs),
        a.below_pct,
    )?;
    if let Some(out) = &a.out {
        opts.out = out.clone();
    }
    opts.token = crate::cmd_follow::run_token(a.token_file.as_deref())?;
    opts.backends = crate::backend_env::side_env()?;
    opts.version = crate::VERSION.to_string();
    if place.rank == 0 {
        check_size(opts.nodes, opts.nics.len(), opts.reps)?;
        lead(a, &opts, place.leader.as_deref())
    } else {
        let Some(host) = place.leader else {
            bail!("no leader: give --leader HOST[:PORT] (rank 0's address), or start under a launcher that names it (or set TCPX_LEADER)");
        };
        let leader = with_port(&host, a.port);
        let done = fleet_run::follow(&opts, &leader, &mut say)?;
        say(&format!(
            "rank {}: done ({} pair-run sides); the leader writes the results",
            place.rank, done.sides
        ));
        Ok(ExitCode::SUCCESS)
    }
}

fn lead(a: &FleetArgs, o: &FleetOptions, leader: Option<&str>) -> Result<ExitCode> {
    let listener = leader_listener(a.listen.as_deref(), leader, a.port)?;
    let at = listener.local_addr()?;
    say(&format!(
        "leading {} nodes; waiting for them on {at}",
        o.nodes
    ));
    if let Some(why) = o.exp.transport.capabilities().nics.not_applied() {
        say(&format!(
            "{} places its NICs itself ({why}): each NIC choice's bench runs on the backend's own \
             NICs; only the start-up probe uses the addresses named",
            o.exp.transport
        ));
    }
    let outcome = fleet_run::lead(o, listener, &mut say)?;
    let doc = &outcome.doc;
    let measured = outcome.measured();
    println!(
        "fleet of {} nodes: {measured} of {} pair runs measured with verified bytes",
        doc.start.nodes.len(),
        doc.start.scheduled
    );
    if doc.end.findings.is_empty() {
        println!("verdict: nothing stands out");
    }
    for f in &doc.end.findings {
        println!("verdict: {}", f.text);
    }
    println!(
        "matrix: {}\njson: {}\nreport: {}",
        outcome.files.csv.display(),
        outcome.files.json.display(),
        outcome.files.html.display()
    );
    Ok(if outcome.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
