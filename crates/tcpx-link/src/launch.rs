//! Launcher environments (Slurm, torchrun, Open MPI/PMI, JobSet): who leads, who follows.
//!
//! Invariant: one process per node takes part, never two followers on one node. Launchers
//! often start one process per GPU (`torchrun --nproc-per-node 8`); roles come from the node
//! rank (torchrun `GROUP_RANK`/`NODE_RANK`, Slurm `SLURM_NODEID`, JobSet's completion index), and
//! only local rank 0 of each node leads or follows. The others exit at once: the node's process
//! already runs one flow process per GPU in multi-process mode. Where a launcher gives no node
//! rank (Open MPI, PMI), local rank 0 of world rank 0 leads and every other local rank 0 follows.
//! The environment is passed in (`get`), never read here.
//!
//! Launchers nest, and the processes of the inner one inherit the outer one's variables:
//! `salloc mpirun` starts Open MPI's daemons through srun, so every rank on a node also carries
//! that daemon's SLURM_PROCID and SLURM_LOCALID 0; torchrun's workers under `srun torchrun` carry
//! the torchrun task's. So the innermost launcher gives the roles: torchrun, then Open MPI, then
//! PMI, then Slurm, then a JobSet's pod index. PMI only where it says the local rank or no Slurm
//! step is around: `srun --mpi=pmi2` sets PMI_RANK without one, and Slurm's variables say more.

/// This machine's name (`/proc/sys/kernel/hostname`), as a node names itself to its peers and
/// in its documents; `unknown` where the kernel does not say.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Rank and leader as a launcher describes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The process's rank among all processes.
    pub rank: u32,
    /// Leader host, when the launcher says.
    pub leader: Option<String>,
    /// Which launcher: `slurm`, `torchrun`, `openmpi`, `pmi`, `jobset`.
    pub source: &'static str,
    /// The node's index, when the launcher says.
    pub node_rank: Option<u32>,
    /// The process's rank on its node, when the launcher says.
    pub local_rank: Option<u32>,
}

/// What a process started by a launcher does in a plan run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRole {
    /// Leads the run (node 0's local rank 0).
    Leader,
    /// Follows the leader (local rank 0 of another node).
    Follower,
    /// Another process on a node whose local rank 0 takes part: nothing to do, for this reason.
    Idle(String),
}

impl Launch {
    /// This process's role; see the module doc.
    pub fn role(&self) -> NodeRole {
        if let Some(local) = self.local_rank.filter(|&l| l != 0) {
            return NodeRole::Idle(format!(
                "rank {} is local rank {local} of {} under {}: only local rank 0 of each node takes part (it runs one process per GPU itself with process_mode \"multi-process\"), so this process has nothing to do",
                self.rank,
                self.node_rank
                    .map_or_else(|| "its node".to_string(), |n| format!("node {n}")),
                self.source
            ));
        }
        let first = match self.node_rank {
            Some(n) => n == 0,
            None => self.rank == 0,
        };
        if first {
            NodeRole::Leader
        } else {
            NodeRole::Follower
        }
    }
}

/// First host of a Slurm node list: `a3-[001-002,7],b` -> `a3-001`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut depth = 0;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let first = &list[..end];
    match first.find('[') {
        None => Some(first.to_string()),
        Some(i) => {
            let inner = first[i + 1..].trim_end_matches(']');
            let item = inner.split(',').next()?;
            let start = item.split('-').next()?;
            Some(format!("{}{}", &first[..i], start))
        }
    }
}

/// Reads rank and leader from a launcher's environment (`get` is `std::env::var` in use).
/// `TCPX_LEADER` overrides the leader host of any launcher.
pub fn launch_from_env(get: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let explicit = get("TCPX_LEADER").filter(|s| !s.is_empty());
    let first = |keys: &[&str]| keys.iter().find_map(|k| num(k));
    let slurm = num("SLURM_PROCID");
    let pmi_local = first(&["MPI_LOCALRANKID", "PMI_LOCAL_RANK"]);
    let (rank, mut leader, source, node_rank, local_rank) =
        if let (Some(r), Some(_)) = (num("RANK"), get("MASTER_ADDR")) {
            (
                r,
                get("MASTER_ADDR"),
                "torchrun",
                first(&["GROUP_RANK", "NODE_RANK"]),
                num("LOCAL_RANK"),
            )
        } else if let Some(r) = num("OMPI_COMM_WORLD_RANK") {
            // OMPI_COMM_WORLD_NODE_RANK is the rank on the node (like the local rank), not the node.
            (
                r,
                get("MASTER_ADDR"),
                "openmpi",
                None,
                first(&["OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_NODE_RANK"]),
            )
        } else if let Some(r) = num("PMI_RANK").filter(|_| pmi_local.is_some() || slurm.is_none()) {
            (r, get("MASTER_ADDR"), "pmi", None, pmi_local)
        } else if let Some(r) = slurm {
            let nodes = get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"));
            (
                r,
                nodes.as_deref().and_then(first_slurm_host),
                "slurm",
                num("SLURM_NODEID"),
                num("SLURM_LOCALID"),
            )
        } else if let Some(r) = num("JOB_COMPLETION_INDEX") {
            // One pod per index: the index is the node.
            (r, get("MASTER_ADDR"), "jobset", Some(r), num("LOCAL_RANK"))
        } else {
            return None;
        };
    if explicit.is_some() {
        leader = explicit;
    }
    Some(Launch {
        rank,
        leader,
        source,
        node_rank,
        local_rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_test_support::env_lookup;

    #[test]
    fn launchers_give_rank_and_leader() {
        let cases: [(&[(&str, &str)], _); 5] = [
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_JOB_NODELIST", "a3-[007-008]"),
                ],
                (1, Some("a3-007"), "slurm"),
            ),
            (
                &[("RANK", "0"), ("MASTER_ADDR", "10.0.0.2")],
                (0, Some("10.0.0.2"), "torchrun"),
            ),
            (&[("OMPI_COMM_WORLD_RANK", "1")], (1, None, "openmpi")),
            (
                &[("PMI_RANK", "0"), ("TCPX_LEADER", "h0")],
                (0, Some("h0"), "pmi"),
            ),
            (
                &[("JOB_COMPLETION_INDEX", "1"), ("MASTER_ADDR", "js-0")],
                (1, Some("js-0"), "jobset"),
            ),
        ];
        for (env, want) in cases {
            let l = launch_from_env(env_lookup(env)).unwrap();
            assert_eq!((l.rank, l.leader.as_deref(), l.source), want, "{env:?}");
        }
        assert_eq!(launch_from_env(env_lookup(&[("RANK", "x")])), None);
        assert_eq!(launch_from_env(env_lookup(&[])), None);
    }

    /// `torchrun --nnodes 2 --nproc-per-node 8`: one leader, one follower, 14 idle; never two
    /// followers on a node.
    #[test]
    fn eight_processes_per_node_give_one_leader_and_one_follower() {
        let mut roles = Vec::new();
        for node in 0..2u32 {
            for local in 0..8u32 {
                let rank = (node * 8 + local).to_string();
                let (node, local) = (node.to_string(), local.to_string());
                let l = launch_from_env(env_lookup(&[
                    ("RANK", &rank),
                    ("LOCAL_RANK", &local),
                    ("GROUP_RANK", &node),
                    ("MASTER_ADDR", "n0"),
                ]))
                .unwrap();
                roles.push((l.node_rank, l.role()));
            }
        }
        let count = |want: &NodeRole| roles.iter().filter(|(_, r)| r == want).count();
        assert_eq!(count(&NodeRole::Leader), 1);
        assert_eq!(count(&NodeRole::Follower), 1);
        assert_eq!(roles[0], (Some(0), NodeRole::Leader));
        assert_eq!(roles[8], (Some(1), NodeRole::Follower));
        match &roles[9].1 {
            NodeRole::Idle(why) => assert!(why.contains("local rank 1 of node 1"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn node_and_local_ranks_of_each_launcher() {
        let role = |pairs: &[(&str, &str)]| launch_from_env(env_lookup(pairs)).unwrap().role();
        // Slurm: node 1's first task follows, its second idles; node 0's first leads even if
        // its global rank is not 0.
        assert_eq!(
            role(&[
                ("SLURM_PROCID", "8"),
                ("SLURM_NODEID", "1"),
                ("SLURM_LOCALID", "0")
            ]),
            NodeRole::Follower
        );
        assert!(matches!(
            role(&[
                ("SLURM_PROCID", "9"),
                ("SLURM_NODEID", "1"),
                ("SLURM_LOCALID", "1")
            ]),
            NodeRole::Idle(_)
        ));
        assert_eq!(
            role(&[
                ("SLURM_PROCID", "3"),
                ("SLURM_NODEID", "0"),
                ("SLURM_LOCALID", "0")
            ]),
            NodeRole::Leader
        );
        // torchrun's NODE_RANK when GROUP_RANK is absent.
        assert_eq!(
            role(&[
                ("RANK", "4"),
                ("NODE_RANK", "1"),
                ("LOCAL_RANK", "0"),
                ("MASTER_ADDR", "h")
            ]),
            NodeRole::Follower
        );
        // Open MPI: no node index; local rank 0 of world rank 0 leads, other local ranks idle.
        assert_eq!(
            role(&[
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0")
            ]),
            NodeRole::Leader
        );
        assert_eq!(
            role(&[
                ("OMPI_COMM_WORLD_RANK", "8"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0")
            ]),
            NodeRole::Follower
        );
        assert!(matches!(
            role(&[
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_NODE_RANK", "1")
            ]),
            NodeRole::Idle(_)
        ));
        // One process per node and no local rank (the old two-rank launch): rank 0 leads.
        assert_eq!(
            role(&[("RANK", "1"), ("MASTER_ADDR", "h")]),
            NodeRole::Follower
        );
        assert_eq!(role(&[("JOB_COMPLETION_INDEX", "0")]), NodeRole::Leader);
        assert_eq!(role(&[("JOB_COMPLETION_INDEX", "1")]), NodeRole::Follower);
    }

    /// Nested launchers: the innermost one's variables give the roles. The Slurm variables are
    /// those the real `salloc -N 2 mpirun -np 4` gave the ranks of node 1 (its Open MPI daemon's
    /// step: task 1, local ID 0), and `srun torchrun --nproc-per-node 2` gives its workers.
    #[test]
    fn the_innermost_launcher_gives_the_roles() {
        let role = |pairs: &[(&str, &str)]| {
            let l = launch_from_env(env_lookup(pairs)).unwrap();
            (l.source, l.role())
        };
        let slurm_step = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
        ];
        let with = |more: &[(&'static str, &'static str)]| {
            let mut v = slurm_step.to_vec();
            v.extend_from_slice(more);
            v
        };
        // Open MPI ranks 2 and 3 on node 1: one follows, one idles (not two followers).
        assert_eq!(
            role(&with(&[
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0")
            ])),
            ("openmpi", NodeRole::Follower)
        );
        assert!(matches!(
            role(&with(&[
                ("OMPI_COMM_WORLD_RANK", "3"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1")
            ])),
            ("openmpi", NodeRole::Idle(_))
        ));
        // torchrun's second worker on node 1 idles.
        assert!(matches!(
            role(&with(&[
                ("RANK", "3"),
                ("LOCAL_RANK", "1"),
                ("GROUP_RANK", "1"),
                ("MASTER_ADDR", "n1")
            ])),
            ("torchrun", NodeRole::Idle(_))
        ));
        // srun --mpi=pmi2: PMI_RANK but no PMI local rank, so Slurm's variables give the roles.
        let l = launch_from_env(env_lookup(&with(&[("PMI_RANK", "1")]))).unwrap();
        assert_eq!((l.source, l.leader.as_deref()), ("slurm", Some("n1")));
        // A PMI launcher that says the local rank is the inner one.
        assert!(matches!(
            role(&with(&[("PMI_RANK", "3"), ("MPI_LOCALRANKID", "1")])),
            ("pmi", NodeRole::Idle(_))
        ));
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_slurm_host("n1,n2").as_deref(), Some("n1"));
        assert_eq!(
            first_slurm_host("gpu-[01-04,07],cpu1").as_deref(),
            Some("gpu-01")
        );
        assert_eq!(first_slurm_host("a3-[9,10]").as_deref(), Some("a3-9"));
        assert_eq!(first_slurm_host(""), None);
    }
}
