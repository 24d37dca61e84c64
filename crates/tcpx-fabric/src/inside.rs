//! A process started inside a fabric node by a runner: which fabric and node it is in, and the
//! emulated placement its NIC policies use there.
//!
//! A runner that starts a process with [`Fabric::command_in`] also sets [`FABRIC_ENV`] (the
//! fabric's id) and [`FABRIC_NODE_ENV`] (`a` or `b`) with [`Fabric::mark`]; children inherit
//! both (`ip netns exec` keeps the environment), so flow processes started by that process know
//! it too. Veths have no sysfs NUMA node or PCI path, so code choosing NICs asks [`here`] for the
//! emulated places instead.
//!
//! Which emulated GPU a flow stands for: flows are spread evenly over the node's GPUs, flow `f`
//! of `F` standing for GPU `f * G / F` ([`gpu_for_flow`]). On A3-high (GPUs 0-3 on NUMA 0, 4-7 on
//! NUMA 1) two flows are GPUs 0 and 4, one per NUMA node, so `numa-local` gives flow 0 eth1/eth2
//! and flow 1 eth3/eth4 and four flows use each NIC once under `closest-pci`, as a run with one
//! flow per GPU pair spreads on a real node. Mapping flow `f` to GPU `f` would put every flow of a
//! small run on NUMA 0 and leave eth3/eth4 idle under `numa-local`.

use std::process::Command;

use tcpx_sched::nic::{GpuPlace, NicInfo};

use crate::{Fabric, FabricError, Node};

/// The fabric a process runs in (its id), set by the runner that started it there.
pub const FABRIC_ENV: &str = "TCPX_FABRIC";
/// The node a process runs in: `a` or `b`.
pub const FABRIC_NODE_ENV: &str = "TCPX_FABRIC_NODE";

impl Node {
    /// `a` or `b`, as in [`FABRIC_NODE_ENV`].
    pub fn env_value(self) -> &'static str {
        match self {
            Node::A => "a",
            Node::B => "b",
        }
    }

    /// Parses [`FABRIC_NODE_ENV`]'s value.
    pub fn from_env_value(v: &str) -> Option<Node> {
        match v.trim() {
            "a" | "A" => Some(Node::A),
            "b" | "B" => Some(Node::B),
            _ => None,
        }
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

    /// Where flow `flow` of `flows`'s GPU sits (see [`gpu_for_flow`]).
    pub fn gpu_for(&self, flow: u32, flows: u32) -> GpuPlace {
        self.gpus
            .get(gpu_for_flow(flow, flows, self.gpus.len()))
            .cloned()
            .unwrap_or_default()
    }
}

/// The emulated GPU flow `flow` of `flows` stands for among `gpus`: spread evenly (module doc).
pub fn gpu_for_flow(flow: u32, flows: u32, gpus: usize) -> usize {
    if gpus == 0 {
        return 0;
    }
    let flows = u64::from(flows.max(1));
    let flow = u64::from(flow) % flows;
    ((flow * gpus as u64) / flows) as usize % gpus
}

/// The fabric node this process runs in, as the runner marked it: `None` when not marked;
/// `Err` when marked but the fabric cannot be read (the message says what to check).
pub fn here_from(get: impl Fn(&str) -> Option<String>) -> Option<Result<Placement, FabricError>> {
    let id = get(FABRIC_ENV).filter(|s| !s.is_empty())?;
    let node_text = get(FABRIC_NODE_ENV).unwrap_or_default();
    let Some(node) = Node::from_env_value(&node_text) else {
        return Some(Err(FabricError::State {
            path: format!("${FABRIC_NODE_ENV}"),
            err: format!("`{node_text}` is not a fabric node (a or b)"),
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

    #[test]
    fn flows_spread_over_the_gpus() {
        let g = |flows: u32| (0..flows).map(|f| gpu_for_flow(f, flows, 8)).collect::<Vec<_>>();
        assert_eq!(g(1), [0]);
        assert_eq!(g(2), [0, 4]);
        assert_eq!(g(4), [0, 2, 4, 6]);
        assert_eq!(g(8), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(gpu_for_flow(3, 2, 8), 4);
        assert_eq!(gpu_for_flow(0, 0, 0), 0);
    }

    #[test]
    fn two_flows_take_both_numa_nodes_under_numa_local() {
        use tcpx_sched::nic::{assign_channels, NicPolicy};
        let p = Placement {
            node: Node::A,
            nics: crate::placement::nic_infos(4, Node::A, crate::Topology::A3High),
            gpus: crate::placement::gpu_places(crate::Topology::A3High),
        };
        let names = |flow: u32| {
            assign_channels(&NicPolicy::NumaLocal, &p.nics, &p.gpu_for(flow, 2), flow as usize, 2)
                .unwrap()
                .into_iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(0), ["eth1", "eth2"]);
        assert_eq!(names(1), ["eth3", "eth4"]);
        assert_eq!(p.nic("eth3").unwrap().numa, Some(1));
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
        assert!(matches!(missing, Err(FabricError::NotFound { .. })), "{missing:?}");
        let bad = here_from(env(vec![(FABRIC_ENV, "x".into()), (FABRIC_NODE_ENV, "c".into())]))
            .unwrap()
            .unwrap_err();
        assert!(bad.to_string().contains("not a fabric node"), "{bad}");
    }
}
