//! A process started inside a fabric node by a runner: which fabric and node it is in, and the
//! emulated placement its NIC policies use there.
//!
//! A runner that starts a process with [`Fabric::command_in`] also sets [`FABRIC_ENV`] (the
//! fabric's id) and [`FABRIC_NODE_ENV`] (`a` or `b`) with [`Fabric::mark`]; children inherit
//! both (`ip netns exec` keeps the environment), so flow processes started by that process know
//! it too. Veths have no sysfs NUMA node or PCI path, so code choosing NICs asks [`here`] for the
//! emulated places instead.
//!
//! Which emulated GPU a flow stands for: the GPUs next to the NICs in use, spread over them
//! ([`gpu_for_flow`]). Flow `f` of `F` with `N` NICs in use stands for a GPU closest (longest
//! shared PCI path, else same NUMA node) to NIC `f * N / F`; flows sharing a NIC take its GPUs in
//! turn. On A3-high (GPUs 2k and 2k+1 under eth(k+1); eth1/eth2 and GPUs 0-3 on NUMA 0, the rest
//! on NUMA 1) two flows over four NICs are GPUs 0 and 4, so `numa-local` gives flow 0 eth1/eth2
//! and flow 1 eth3/eth4; over two NICs they are GPUs 0 and 2 (both by NUMA 0's eth1/eth2), over
//! one NIC GPUs 0 and 1. This is how a real run would place one process per GPU to use the NICs
//! it was given: mapping flow `f` to GPU `f` would keep a small run on NUMA 0 and leave eth3/eth4
//! idle under `numa-local`, and spreading over all GPUs regardless of the NICs would put a flow
//! on a NUMA node with no NIC in use.

use std::process::Command;

pub use tcpx_sched::nic::gpu_for_flow;
use tcpx_sched::nic::{GpuPlace, NicInfo, NodePlaces};

use crate::{Fabric, FabricError, Node};

/// The fabric a process runs in (its id), set by the runner that started it there.
pub const FABRIC_ENV: &str = "TCPX_FABRIC";
/// The node a process runs in: `a`, `b`, ... (its letter).
pub const FABRIC_NODE_ENV: &str = "TCPX_FABRIC_NODE";

impl Node {
    /// `a`, `b`, ... as in [`FABRIC_NODE_ENV`].
    pub fn env_value(self) -> String {
        self.letter().to_string()
    }

    /// Parses [`FABRIC_NODE_ENV`]'s value.
    pub fn from_env_value(v: &str) -> Option<Node> {
        Node::from_letter(v)
    }
}

impl Fabric {
    /// Sets [`FABRIC_ENV`] and [`FABRIC_NODE_ENV`] on `cmd` (built by [`Fabric::command_in`]),
    /// and the state directory, so the process and its children find this fabric.
    pub fn mark(&self, cmd: &mut Command, node: Node) {
        cmd.env(FABRIC_ENV, self.id())
            .env(FABRIC_NODE_ENV, node.env_value())
            .env("TCPX_FABRIC_STATE_DIR", &self.state_dir);
    }
}

/// The emulated placement of the node this process runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: Node,
    /// The node's NICs with their emulated NUMA node and PCI path.
    pub nics: Vec<NicInfo>,
    /// The node's emulated GPUs, GPU `i` at index `i`.
    pub gpus: Vec<GpuPlace>,
}

impl Placement {
    /// The emulated place of `name`'s NIC (an interface name such as `eth2`), if it is one.
    pub fn nic(&self, name: &str) -> Option<&NicInfo> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Where flow `flow` of `flows`'s GPU sits when `in_use` are the NICs (with their places)
    /// the flows' channels may use (see [`gpu_for_flow`]).
    pub fn gpu_for(&self, flow: u32, flows: u32, in_use: &[NicInfo]) -> GpuPlace {
        self.gpus
            .get(gpu_for_flow(flow, flows, in_use, &self.gpus))
            .cloned()
            .unwrap_or_default()
    }

    /// The places of this node's NICs and GPUs, as the bench takes them from its caller.
    pub fn places(&self) -> NodePlaces {
        NodePlaces {
            nics: self.nics.clone(),
            gpus: self.gpus.clone(),
        }
    }
}

/// The fabric node this process runs in, as the runner marked it: `None` when not marked;
/// `Err` when marked but the fabric cannot be read (the message says what to check).
pub fn here_from(get: impl Fn(&str) -> Option<String>) -> Option<Result<Placement, FabricError>> {
    let id = get(FABRIC_ENV).filter(|s| !s.is_empty())?;
    let node_text = get(FABRIC_NODE_ENV).unwrap_or_default();
    let Some(node) = Node::from_env_value(&node_text) else {
        return Some(Err(FabricError::State {
            path: format!("${FABRIC_NODE_ENV}"),
            err: format!("`{node_text}` is not a fabric node (a to h)"),
        }));
    };
    let dir = get("TCPX_FABRIC_STATE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(crate::spec::DEFAULT_STATE_DIR));
    Some(Fabric::open(&id, &dir).map(|f| Placement {
        node,
        nics: f.nic_infos(node),
        gpus: f.gpu_places(),
    }))
}

/// [`here_from`] with this process's environment.
pub fn here() -> Option<Result<Placement, FabricError>> {
    here_from(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a3(nics: u32) -> Placement {
        Placement {
            node: Node::A,
            nics: crate::placement::nic_infos(nics, Node::A, crate::Topology::A3High),
            gpus: crate::placement::gpu_places(crate::Topology::A3High),
        }
    }

    #[test]
    fn flows_stand_for_gpus_next_to_the_nics_in_use() {
        let g = |nics: u32, flows: u32| {
            let p = a3(nics);
            (0..flows)
                .map(|f| gpu_for_flow(f, flows, &p.nics, &p.gpus))
                .collect::<Vec<_>>()
        };
        assert_eq!(g(4, 2), [0, 4]);
        assert_eq!(g(2, 2), [0, 2]);
        assert_eq!(g(1, 2), [0, 1]);
        assert_eq!(g(4, 4), [0, 2, 4, 6]);
        assert_eq!(g(4, 8), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(g(1, 1), [0]);
        // No NICs known: spread over the GPUs.
        let gpus = crate::placement::gpu_places(crate::Topology::A3High);
        assert_eq!(gpu_for_flow(1, 2, &[], &gpus), 4);
        assert_eq!(gpu_for_flow(0, 0, &[], &[]), 0);
    }

    #[test]
    fn numa_local_uses_every_nic_in_use_and_never_fails_for_lack_of_a_local_nic() {
        use tcpx_sched::nic::{assign_channels, NicPolicy};
        for (nics, want) in [
            (4, [["eth1", "eth2"], ["eth3", "eth4"]]),
            (2, [["eth1", "eth2"], ["eth1", "eth2"]]),
            (1, [["eth1", "eth1"], ["eth1", "eth1"]]),
        ] {
            let p = a3(nics);
            for flow in 0..2u32 {
                let got: Vec<String> = assign_channels(
                    &NicPolicy::NumaLocal,
                    &p.nics,
                    &p.gpu_for(flow, 2, &p.nics),
                    flow as usize,
                    2,
                )
                .unwrap()
                .into_iter()
                .map(|c| c.name)
                .collect();
                let mut want = want[flow as usize].to_vec();
                if nics == 2 && flow == 1 {
                    // Flow 1 starts its round over NUMA 0's NICs one further on.
                    want.sort();
                }
                let mut sorted = got.clone();
                sorted.sort();
                assert_eq!(sorted, want, "{nics} NICs, flow {flow}: {got:?}");
            }
        }
        assert_eq!(a3(4).nic("eth3").unwrap().numa, Some(1));
    }

    #[test]
    fn the_environment_names_the_fabric_and_node() {
        let dir = tempfile::tempdir().unwrap();
        let env = |pairs: Vec<(&'static str, String)>| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        assert!(here_from(env(vec![])).is_none());
        let d = dir.path().display().to_string();
        let missing = here_from(env(vec![
            (FABRIC_ENV, "nope".into()),
            (FABRIC_NODE_ENV, "b".into()),
            ("TCPX_FABRIC_STATE_DIR", d.clone()),
        ]))
        .unwrap();
        assert!(
            matches!(missing, Err(FabricError::NotFound { .. })),
            "{missing:?}"
        );
        let bad = here_from(env(vec![
            (FABRIC_ENV, "x".into()),
            (FABRIC_NODE_ENV, "i".into()),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(bad.to_string().contains("not a fabric node"), "{bad}");

        // Node C of a 4-node fabric: its own addresses, the fabric's placement.
        let state = crate::State {
            id: "big".into(),
            ns_a: "tcpx-a-big".into(),
            ns_b: "tcpx-b-big".into(),
            nodes: 4,
            switch_ns: Some("tcpx-sw-big".into()),
            nics: 2,
            rate: crate::Rate::gbit(1),
            delay: None,
            topology: crate::Topology::A3High,
            creator_pid: 1,
            phase: crate::Phase::Up,
            faults: Vec::new(),
        };
        std::fs::write(
            dir.path().join("big.json"),
            serde_json::to_vec(&state).unwrap(),
        )
        .unwrap();
        let c = Node::new(2).unwrap();
        let fabric = Fabric::open("big", dir.path()).unwrap();
        let mut cmd = fabric.command_in(c, "true");
        fabric.mark(&mut cmd, c);
        let envs: Vec<(String, String)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.unwrap().to_string_lossy().into_owned(),
                )
            })
            .collect();
        let placed = here_from(|k| envs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(placed.node, c);
        assert_eq!(placed.nics[1].addr.to_string(), "10.231.1.3");
        assert_eq!(placed.nic("eth2").unwrap().numa, Some(0));
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["netns", "exec", "tcpx-c-big", "true"]);
    }
}
