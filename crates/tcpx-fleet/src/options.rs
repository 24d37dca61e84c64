//! A fleet run's settings and their checks, before anything starts: this node's place in the
//! fleet (from its flags, else the launcher's environment), the options every node runs with
//! ([`FleetOptions::new`] refuses what a fleet cannot measure), the fleet's size limit, and the
//! leader's listener. The binary maps its flags onto these and prints; the rules and their
//! messages live here.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use tcpx_bench::Experiment;

use super::error::FleetError;

use super::outliers::Thresholds;
use super::proto::{MAX_NICS, MAX_NODES};
use super::schedule::{runs_for, NicChoice, MAX_RUNS};
use tcpx_link::auth::RunToken;
use tcpx_link::launch::Launch;
use tcpx_link::with_port;

/// Port the fleet leader listens on unless told otherwise.
pub const DEFAULT_FLEET_PORT: u16 = 5320;

/// The variables launchers set to the number of nodes in the job, in the order they are asked.
const FLEET_SIZE_VARS: [&str; 5] = [
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "GROUP_WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
];

/// The fleet's size from a launcher's environment (`get` looks a variable up): the first of
/// the variables launchers set that holds a number, and its name.
pub fn nodes_from_env(get: impl Fn(&str) -> Option<String>) -> Option<(u32, &'static str)> {
    FLEET_SIZE_VARS
        .into_iter()
        .find_map(|k| get(k)?.trim().parse().ok().map(|n| (n, k)))
}

/// This node's place in the fleet: its rank (0 leads), the fleet's size and the leader's
/// address as given (`HOST` or `HOST:PORT`; a follower needs it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPlace {
    pub rank: u32,
    pub nodes: u32,
    pub leader: Option<String>,
}

impl FleetPlace {
    /// The place the flags give (`rank`, `nodes`, `leader`), each missing one from the
    /// launcher's environment: `launch` (as [`tcpx_link::launch::launch_from_env`] read it) for the
    /// rank and the leader, `get` for the fleet's size ([`nodes_from_env`]) and `TCPX_LEADER`.
    pub fn resolve(
        rank: Option<u32>,
        nodes: Option<u32>,
        leader: Option<String>,
        launch: Option<&Launch>,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<FleetPlace, FleetError> {
        let rank = rank
            .or_else(|| launch.map(|l| l.node_rank.unwrap_or(l.rank)))
            .ok_or_else(|| FleetError::Refused("no rank: give --rank, or start under a launcher (srun, mpirun, torchrun, a JobSet) that sets one".into()))?;
        let nodes = match nodes {
            Some(n) => n,
            None => nodes_from_env(&get).map(|(n, _)| n).ok_or_else(|| {
                FleetError::Refused(
                    "no fleet size: give --nodes (the launcher's environment names none)".into(),
                )
            })?,
        };
        if rank >= nodes {
            return Err(refused(format!(
                "--rank {rank} is not below --nodes {nodes}: check the launcher's ranks and --nodes"
            )));
        }
        let leader = leader
            .or_else(|| launch.and_then(|l| l.leader.clone()))
            .or_else(|| get("TCPX_LEADER").filter(|s| !s.is_empty()));
        Ok(FleetPlace {
            rank,
            nodes,
            leader,
        })
    }
}

/// A fleet run's settings, for the leader and the followers alike.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub nodes: u32,
    pub rank: u32,
    /// This node's NICs as given (interface names or local addresses).
    pub nics: Vec<String>,
    /// The bench experiment of every pair (its `nics` are set per run).
    pub exp: Experiment,
    pub reps: u32,
    pub join_wait: Duration,
    pub pair_wait: Duration,
    /// Where the leader writes the matrix and the report.
    pub out: PathBuf,
    pub token: Option<RunToken>,
    /// The backend settings and, in an emulated fabric node, the NIC places, as the binary
    /// read them.
    pub backends: tcpx_bench::SideEnv,
    pub host: String,
    /// The tool's version, for the greeting and the JSON document.
    pub version: String,
    pub thresholds: Thresholds,
}

impl FleetOptions {
    /// The settings of a run at `place`, checked before anything starts. `exp` is what every
    /// pair runs: one message size, its received bytes verified, in this node's own process;
    /// its `nics` are this node's NICs (at least one). `pair_wait` (default: twice the bench's
    /// timeout plus 30 s) must leave a side that waits out the bench's timeout on a silent peer
    /// time to report; `below_pct` is in 0..100. The rest starts as the defaults, for the
    /// caller to replace: `out` is `reports/fleet-<UTC stamp>`, no run token, the backends'
    /// default environment, this host's name and this crate's version.
    pub fn new(
        place: &FleetPlace,
        mut exp: Experiment,
        reps: u32,
        join_wait: Duration,
        pair_wait: Option<Duration>,
        below_pct: f64,
    ) -> Result<FleetOptions, FleetError> {
        if exp.multi_process {
            return Err(refused(
                "--multi-process is not supported by fleet: each pair runs in the node's own process",
            ));
        }
        if exp.sizes.len() != 1 {
            return Err(refused("--size: give one message size for fleet (each pair runs it; a matrix per size would multiply the run)"));
        }
        if !exp.verify {
            return Err(refused("--verify off: fleet counts only runs whose received bytes were checked; leave --verify on"));
        }
        let nics = std::mem::take(&mut exp.nics);
        if nics.is_empty() {
            return Err(refused("give this node's NICs with --nics (e.g. --nics eth1,eth2,eth3,eth4, or local addresses)"));
        }
        let timeout_s = exp.timeout().as_secs();
        let pair_wait = pair_wait.map_or_else(
            || timeout_s.saturating_mul(2).saturating_add(30),
            |w| w.as_secs(),
        );
        // A side waits up to the bench's --timeout for its peer before it reports the failure; a
        // pair deadline shorter than that would blame the waiting side along with the silent one.
        if pair_wait < timeout_s.saturating_add(5) {
            return Err(refused(format!(
                "--pair-timeout {pair_wait}: give at least the bench --timeout ({timeout_s} s) plus 5, so that a side waiting on a silent peer reports before the deadline"
            )));
        }
        if !below_pct.is_finite() || !(0.0..100.0).contains(&below_pct) {
            return Err(refused(format!("--below-pct {below_pct}: give 0..100")));
        }
        Ok(FleetOptions {
            nodes: place.nodes,
            rank: place.rank,
            nics,
            exp,
            reps,
            join_wait,
            pair_wait: Duration::from_secs(pair_wait),
            out: PathBuf::from(format!("reports/fleet-{}", tcpx_report::utc_stamp())),
            token: None,
            backends: Default::default(),
            host: tcpx_link::launch::host_name(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            thresholds: Thresholds {
                below_pct,
                ..Thresholds::default()
            },
        })
    }

    /// A follower gives up after this long without a message from its leader: the join
    /// deadline, plus the slots of a whole round (an odd fleet idles one node for a round: two
    /// directions on every NIC choice), plus the slot it may wait out before that.
    pub fn idle_limit(&self) -> Duration {
        let choices = NicChoice::all_for(self.nics.len().min(MAX_NICS) as u32).len() as u32;
        self.join_wait + self.pair_wait * (2 * choices + 2)
    }
}

/// Refuses a fleet whose schedule would be too long ([`MAX_RUNS`]): `nodes` nodes with `nics`
/// NICs each, `reps` repetitions.
pub fn check_size(nodes: u32, nics: usize, reps: u32) -> Result<(), FleetError> {
    if !(2..=MAX_NODES).contains(&nodes) {
        return Err(refused(format!(
            "--nodes {nodes}: a fleet has 2..={MAX_NODES} nodes"
        )));
    }
    let choices = NicChoice::all_for(nics.min(MAX_NICS) as u32).len();
    let runs = runs_for(nodes, choices, reps);
    if runs > MAX_RUNS {
        return Err(refused(format!(
            "{nodes} nodes x {choices} NIC choice(s) x {reps} repetition(s) make {runs} pair runs, more than the {MAX_RUNS} one fleet run takes: fewer --reps or NICs, or qualify the fleet in parts"
        )));
    }
    Ok(())
}

/// The leader's listener: `listen` (`ADDR:PORT`) when given, else the `leader` address (`HOST`
/// or `HOST:PORT`, `port` when it names none) if it is this node's, else every address on
/// `port`.
pub fn leader_listener(
    listen: Option<&str>,
    leader: Option<&str>,
    port: u16,
) -> Result<TcpListener, FleetError> {
    if let Some(l) = listen {
        let addr: SocketAddr = l.parse().map_err(|e| {
            FleetError::step(
                format!("--listen {l}: give ADDR:PORT, e.g. 10.0.0.2:{DEFAULT_FLEET_PORT}"),
                e,
            )
        })?;
        return TcpListener::bind(addr).map_err(|e| {
            FleetError::step(
                format!(
                    "--listen {addr}: cannot listen there (in use, or not this node's address?)"
                ),
                e,
            )
        });
    }
    if let Some(h) = leader {
        if let Ok(addrs) = with_port(h, port).to_socket_addrs() {
            for addr in addrs {
                if let Ok(l) = TcpListener::bind(addr) {
                    return Ok(l);
                }
            }
        }
    }
    let any = SocketAddr::from(([0, 0, 0, 0], port));
    TcpListener::bind(any).map_err(|e| {
        FleetError::step(
            format!(
                "listening on {any}: the port is in use (pick another with --port) or not allowed"
            ),
            e,
        )
    })
}

/// A refusal saying `why`.
fn refused(why: impl Into<String>) -> FleetError {
    FleetError::Refused(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    use tcpx_test_support::env_lookup as vars;

    #[test]
    fn fleet_size_from_each_launcher() {
        assert_eq!(
            nodes_from_env(vars(&[
                ("SLURM_JOB_NUM_NODES", "4"),
                ("OMPI_COMM_WORLD_SIZE", "8")
            ])),
            Some((4, "SLURM_JOB_NUM_NODES"))
        );
        assert_eq!(
            nodes_from_env(vars(&[("GROUP_WORLD_SIZE", "2")])),
            Some((2, "GROUP_WORLD_SIZE"))
        );
        assert_eq!(nodes_from_env(vars(&[("PMI_SIZE", "x")])), None);
        assert_eq!(nodes_from_env(vars(&[])), None);
    }

    #[test]
    fn the_place_comes_from_the_flags_else_the_launcher() {
        let launch = Launch {
            rank: 5,
            leader: Some("node0".into()),
            source: "slurm",
            node_rank: Some(2),
            local_rank: Some(0),
        };
        let env = vars(&[("SLURM_JOB_NUM_NODES", "4"), ("TCPX_LEADER", "other")]);
        // The launcher: its node rank (not its process rank), its leader, the size from env.
        assert_eq!(
            FleetPlace::resolve(None, None, None, Some(&launch), &env).unwrap(),
            FleetPlace {
                rank: 2,
                nodes: 4,
                leader: Some("node0".into())
            }
        );
        // Flags win; TCPX_LEADER when nothing else names the leader, but not when blank.
        assert_eq!(
            FleetPlace::resolve(Some(1), Some(3), None, None, &env).unwrap(),
            FleetPlace {
                rank: 1,
                nodes: 3,
                leader: Some("other".into())
            }
        );
        let blank = vars(&[("TCPX_LEADER", "")]);
        assert_eq!(
            FleetPlace::resolve(Some(0), Some(2), None, None, blank)
                .unwrap()
                .leader,
            None
        );
        let err = |r: Result<FleetPlace, FleetError>| r.unwrap_err().to_string();
        assert!(
            err(FleetPlace::resolve(None, Some(2), None, None, vars(&[])))
                .starts_with("no rank: give --rank")
        );
        assert!(
            err(FleetPlace::resolve(Some(0), None, None, None, vars(&[])))
                .starts_with("no fleet size: give --nodes")
        );
        assert_eq!(
            err(FleetPlace::resolve(Some(2), Some(2), None, None, vars(&[]))),
            "--rank 2 is not below --nodes 2: check the launcher's ranks and --nodes"
        );
    }

    fn place() -> FleetPlace {
        FleetPlace {
            rank: 1,
            nodes: 3,
            leader: None,
        }
    }

    /// The default experiment on two NICs: one size, verified, a 30 s timeout.
    fn exp() -> Experiment {
        Experiment {
            nics: vec!["eth1".into(), "eth2".into()],
            ..Experiment::default()
        }
    }

    fn options(
        exp: Experiment,
        pair_wait: Option<u64>,
        below_pct: f64,
    ) -> Result<FleetOptions, String> {
        let join = Duration::from_secs(60);
        FleetOptions::new(
            &place(),
            exp,
            2,
            join,
            pair_wait.map(Duration::from_secs),
            below_pct,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn options_take_the_nics_out_of_the_experiment_and_default_the_pair_deadline() {
        let o = options(exp(), None, 10.0).unwrap();
        assert_eq!((o.rank, o.nodes, o.reps), (1, 3, 2));
        assert_eq!(o.nics, ["eth1", "eth2"]);
        assert!(o.exp.nics.is_empty(), "the NICs are set per run");
        assert_eq!(o.pair_wait, Duration::from_secs(90), "2 x 30 s + 30");
        assert_eq!(o.thresholds.below_pct, 10.0);
        assert!(o.token.is_none());
        assert!(o.out.starts_with("reports"), "{}", o.out.display());
        // Exactly the bench timeout plus 5 is enough.
        assert_eq!(
            options(exp(), Some(35), 0.0).unwrap().pair_wait.as_secs(),
            35
        );
    }

    #[test]
    fn options_a_fleet_cannot_measure_are_refused_with_what_to_change() {
        let with = |f: fn(&mut Experiment)| {
            let mut e = exp();
            f(&mut e);
            e
        };
        let cases: [(Result<FleetOptions, String>, &str); 7] = [
            (
                options(with(|e| e.multi_process = true), None, 10.0),
                "--multi-process is not supported by fleet",
            ),
            (
                options(with(|e| e.sizes = vec![1 << 20, 2 << 20]), None, 10.0),
                "--size: give one message size for fleet",
            ),
            (
                options(with(|e| e.verify = false), None, 10.0),
                "--verify off: fleet counts only runs whose received bytes were checked",
            ),
            (
                options(with(|e| e.nics.clear()), None, 10.0),
                "give this node's NICs with --nics",
            ),
            (
                options(exp(), Some(34), 10.0),
                "--pair-timeout 34: give at least the bench --timeout (30 s) plus 5",
            ),
            (options(exp(), None, 100.0), "--below-pct 100: give 0..100"),
            (
                options(exp(), None, f64::NAN),
                "--below-pct NaN: give 0..100",
            ),
        ];
        for (got, says) in cases {
            let e = got.unwrap_err();
            assert!(e.starts_with(says), "{e}\nshould start with: {says}");
        }
    }

    #[test]
    fn a_fleet_too_large_or_too_small_is_refused() {
        check_size(2, 1, 1).unwrap();
        assert_eq!(
            check_size(1, 1, 1).unwrap_err().to_string(),
            format!("--nodes 1: a fleet has 2..={MAX_NODES} nodes")
        );
        let e = check_size(MAX_NODES, MAX_NICS, 1000)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("more than the 250000 one fleet run takes"),
            "{e}"
        );
    }

    #[test]
    fn the_leader_listens_where_told_else_on_its_own_leader_address() {
        let l = leader_listener(Some("127.0.0.1:0"), Some("127.0.0.2"), 1).unwrap();
        assert_eq!(l.local_addr().unwrap().ip().to_string(), "127.0.0.1");
        // The leader address names this node: its port, or `port` when it names none.
        let l = leader_listener(None, Some("127.0.0.2:0"), 1).unwrap();
        assert_eq!(l.local_addr().unwrap().ip().to_string(), "127.0.0.2");
        let taken = l.local_addr().unwrap();
        let e = leader_listener(None, Some("127.0.0.3"), taken.port());
        let got = e.unwrap().local_addr().unwrap();
        assert_eq!(got, SocketAddr::from(([127, 0, 0, 3], taken.port())));
        // --listen is taken at its word: an address in use or malformed is an error, not a
        // fallback elsewhere.
        let e = leader_listener(Some(&taken.to_string()), None, 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--listen {taken}: cannot listen there (in use, or not this node's address?)")
        );
        let e = leader_listener(Some("127.0.0.1"), None, 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--listen 127.0.0.1: give ADDR:PORT, e.g. 10.0.0.2:{DEFAULT_FLEET_PORT}")
        );
    }
}
