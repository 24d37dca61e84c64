//! `tcpx-run fleet`: fleet qualification. One process per node, started by the job's launcher
//! (roles from its environment) or by hand (`--rank`, `--nodes`, `--leader`); rank 0 leads,
//! measures every ordered pair of nodes on each NIC and on all NICs together, writes the
//! matrix and the report, and names the slow node, NIC or pair. The run is
//! `tcpx_orchestrate::fleet`; this module maps flags and the launcher's environment onto it and
//! prints.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tcpx_orchestrate::fleet::outliers::Thresholds;
use tcpx_orchestrate::fleet::run::{self as fleet_run, FleetOptions, DEFAULT_FLEET_PORT};
use tcpx_orchestrate::launch::{launch_from_env, NodeRole};
use tcpx_orchestrate::link::with_port;

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

/// The fleet's size from a launcher's environment: the first of the variables launchers set.
fn nodes_from_env(get: impl Fn(&str) -> Option<String>) -> Option<(u32, &'static str)> {
    [
        "SLURM_JOB_NUM_NODES",
        "SLURM_NNODES",
        "GROUP_WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
    ]
    .into_iter()
    .find_map(|k| get(k)?.trim().parse().ok().map(|n| (n, k)))
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
    let rank = a
        .rank
        .or_else(|| launch.as_ref().map(|l| l.node_rank.unwrap_or(l.rank)))
        .ok_or_else(|| anyhow!("no rank: give --rank, or start under a launcher (srun, mpirun, torchrun, a JobSet) that sets one"))?;
    let nodes = match a.nodes {
        Some(n) => n,
        None => nodes_from_env(get).map(|(n, _)| n).ok_or_else(|| {
            anyhow!("no fleet size: give --nodes (the launcher's environment names none)")
        })?,
    };
    if rank >= nodes {
        bail!("--rank {rank} is not below --nodes {nodes}: check the launcher's ranks and --nodes");
    }
    let leader_host = a
        .leader
        .clone()
        .or_else(|| launch.as_ref().and_then(|l| l.leader.clone()))
        .or_else(|| get("TCPX_LEADER").filter(|s| !s.is_empty()));
    let mut exp = a.knobs.experiment().map_err(|e| anyhow!(e))?;
    if exp.multi_process {
        bail!(
            "--multi-process is not supported by fleet: each pair runs in the node's own process"
        );
    }
    if exp.sizes.len() != 1 {
        bail!("--size: give one message size for fleet (each pair runs it; a matrix per size would multiply the run)");
    }
    if !exp.verify {
        bail!("--verify off: fleet counts only runs whose received bytes were checked; leave --verify on");
    }
    let nics = std::mem::take(&mut exp.nics);
    if nics.is_empty() {
        bail!("give this node's NICs with --nics (e.g. --nics eth1,eth2,eth3,eth4, or local addresses)");
    }
    let timeout_s = exp.timeout().as_secs();
    let pair_wait = a
        .pair_timeout
        .unwrap_or_else(|| timeout_s.saturating_mul(2).saturating_add(30));
    // A side waits up to the bench's --timeout for its peer before it reports the failure; a
    // pair deadline shorter than that would blame the waiting side along with the silent one.
    if pair_wait < timeout_s.saturating_add(5) {
        bail!(
            "--pair-timeout {pair_wait}: give at least the bench --timeout ({timeout_s} s) plus 5, so that a side waiting on a silent peer reports before the deadline"
        );
    }
    if !a.below_pct.is_finite() || !(0.0..100.0).contains(&a.below_pct) {
        bail!("--below-pct {}: give 0..100", a.below_pct);
    }
    let opts = FleetOptions {
        nodes,
        rank,
        nics,
        exp,
        reps: a.reps,
        join_wait: Duration::from_secs(a.join_timeout),
        pair_wait: Duration::from_secs(pair_wait),
        out: a.out.clone().unwrap_or_else(|| {
            PathBuf::from(format!("reports/fleet-{}", tcpx_report::utc_stamp()))
        }),
        token: crate::cmd_follow::run_token(a.token_file.as_deref())?,
        backends: crate::backend_env::from_process()?,
        host: tcpx_orchestrate::standalone::host_name(),
        version: crate::VERSION.to_string(),
        thresholds: Thresholds {
            below_pct: a.below_pct,
            ..Thresholds::default()
        },
    };
    if rank == 0 {
        fleet_run::check_size(opts.nodes, opts.nics.len(), opts.reps)?;
        lead(a, &opts, leader_host.as_deref())
    } else {
        let Some(host) = leader_host else {
            bail!("no leader: give --leader HOST[:PORT] (rank 0's address), or start under a launcher that names it (or set TCPX_LEADER)");
        };
        let leader = with_port(&host, a.port);
        let done = fleet_run::follow(&opts, &leader, &mut say)?;
        say(&format!(
            "rank {rank}: done ({} pair-run sides); the leader writes the results",
            done.sides
        ));
        Ok(ExitCode::SUCCESS)
    }
}

/// The leader's listener: `--listen`, else the leader address if it is this node's, else every
/// address on `--port`.
fn leader_listener(a: &FleetArgs, leader: Option<&str>) -> Result<TcpListener> {
    if let Some(l) = &a.listen {
        let addr: SocketAddr = l.parse().with_context(|| {
            format!("--listen {l}: give ADDR:PORT, e.g. 10.0.0.2:{DEFAULT_FLEET_PORT}")
        })?;
        return TcpListener::bind(addr).with_context(|| {
            format!("--listen {addr}: cannot listen there (in use, or not this node's address?)")
        });
    }
    if let Some(h) = leader {
        if let Ok(addrs) = with_port(h, a.port).to_socket_addrs() {
            for addr in addrs {
                if let Ok(l) = TcpListener::bind(addr) {
                    return Ok(l);
                }
            }
        }
    }
    let any = SocketAddr::from(([0, 0, 0, 0], a.port));
    TcpListener::bind(any).with_context(|| {
        format!("listening on {any}: the port is in use (pick another with --port) or not allowed")
    })
}

fn lead(a: &FleetArgs, o: &FleetOptions, leader: Option<&str>) -> Result<ExitCode> {
    let listener = leader_listener(a, leader)?;
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
    let measured = doc.rows.iter().filter(|r| r.measured().is_some()).count();
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
    let clean =
        doc.end.complete && doc.end.findings.is_empty() && measured as u32 == doc.start.scheduled;
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_size_from_each_launcher() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            nodes_from_env(env(&[
                ("SLURM_JOB_NUM_NODES", "4"),
                ("OMPI_COMM_WORLD_SIZE", "8")
            ])),
            Some((4, "SLURM_JOB_NUM_NODES"))
        );
        assert_eq!(
            nodes_from_env(env(&[("GROUP_WORLD_SIZE", "2")])),
            Some((2, "GROUP_WORLD_SIZE"))
        );
        assert_eq!(nodes_from_env(env(&[("PMI_SIZE", "x")])), None);
        assert_eq!(nodes_from_env(env(&[])), None);
    }
}
