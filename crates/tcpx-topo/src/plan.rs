//! GPU <-> NIC pairing and NCCL-style TX/RX thread bindings derived from a [`Topology`].
//!
//! # Pairing rule
//! Candidates are the NICs with a PCI function that are not virtual, less the one carrying the
//! default route (the control NIC, A3-high's eth0) when there are others. Each GPU takes the
//! candidate whose PCI path shares the longest prefix with the GPU's: the closest shared bridge.
//! Ties go to a NIC on the GPU's NUMA node, then to the NIC with fewest GPUs so far, then by
//! name. NICs that get at least one GPU are the *data NICs*; with no GPU on the machine every
//! candidate is one.
//!
//! # Binding rule (reproduces NCCL's A3-high bindings)
//! Per NUMA node, take its cores in order of their lowest CPU number. Skip the first
//! `reserved_cores` (left to the OS, IRQ-less housekeeping and the application's main threads),
//! give the next `cores_per_direction` cores to TX and the next `cores_per_direction` to RX; a
//! core contributes all of its hardware threads. Every NIC on that node gets the node's TX and RX
//! sets. With the defaults (8 reserved, 14 per direction) on A3-high (52 cores per node, core k
//! = CPUs k and k+104 on node 0, k+52 and k+156 on node 1) this gives exactly NCCL's
//! `eth1,eth2 TX 8-21,112-125 RX 22-35,126-139` and `eth3,eth4 TX 60-73,164-177 RX
//! 74-87,178-191`. A node with fewer cores than `reserved + 2 * per_direction` scales both numbers
//! by its core count over 52 (the reference node), keeping at least one core per direction; a
//! single-core node gives TX and RX the same core.

use serde::Serialize;

use crate::binding::BindingSpec;
use crate::cpuset::CpuSet;
use crate::model::{Nic, PciInfo, Topology};

/// The A3-high node size the default rule was read from.
pub const REFERENCE_CORES_PER_NODE: usize = 52;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BindingRule {
    pub reserved_cores: usize,
    pub cores_per_direction: usize,
}

impl Default for BindingRule {
    fn default() -> Self {
        Self {
            reserved_cores: 8,
            cores_per_direction: 14,
        }
    }
}

impl BindingRule {
    /// (reserved, per direction) for a node of `cores` cores.
    pub fn scaled_for(&self, cores: usize) -> (usize, usize) {
        if cores >= self.reserved_cores + 2 * self.cores_per_direction {
            return (self.reserved_cores, self.cores_per_direction);
        }
        let reserved = cores * self.reserved_cores / REFERENCE_CORES_PER_NODE;
        let per = (cores * self.cores_per_direction / REFERENCE_CORES_PER_NODE).max(1);
        (reserved, per)
    }
}

/// TX and RX CPU sets of one NUMA node under a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeBinding {
    pub numa: Option<u32>,
    pub tx: CpuSet,
    pub rx: CpuSet,
}

pub fn node_binding(topo: &Topology, numa: Option<u32>, rule: &BindingRule) -> NodeBinding {
    let cores = topo.cores_of(numa);
    let (reserved, per) = rule.scaled_for(cores.len());
    let take = |from: usize| -> CpuSet {
        cores
            .iter()
            .skip(from)
            .take(per)
            .flat_map(|c| c.cpus.iter())
            .collect()
    };
    let tx = take(reserved);
    let mut rx = take(reserved + per);
    if rx.is_empty() {
        rx = tx.clone(); // too few cores: TX and RX share
    }
    NodeBinding { numa, tx, rx }
}

/// One GPU and the NIC it was paired with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPairing {
    pub gpu: usize,
    pub bus_id: String,
    pub numa: Option<u32>,
    pub nic: Option<String>,
    /// Length of the PCI path prefix the two share (host bridge = 1).
    pub shared_path_len: usize,
}

/// One row of the binding table (the IRQ plan's step 2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicRow {
    pub nic: String,
    pub driver: Option<String>,
    pub bus_id: Option<String>,
    pub speed_mbps: Option<u64>,
    pub state: String,
    pub numa: Option<u32>,
    pub physical_cores: CpuSet,
    pub hyperthreads: CpuSet,
    pub tx: CpuSet,
    pub rx: CpuSet,
    pub gpus: Vec<usize>,
    pub data_nic: bool,
}

/// The derived plan: per-NIC rows, GPU pairings and NCCL binding strings for the data NICs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopoPlan {
    pub rule: BindingRule,
    pub rows: Vec<NicRow>,
    pub pairings: Vec<GpuPairing>,
    pub tx_bindings: BindingSpec,
    pub rx_bindings: BindingSpec,
}

/// Non-virtual NICs with their PCI function.
fn physical_nics(topo: &Topology) -> Vec<(&Nic, &PciInfo)> {
    topo.nics
        .iter()
        .filter(|n| !n.is_virtual)
        .filter_map(|n| n.pci.as_ref().map(|p| (n, p)))
        .collect()
}

/// Physical NICs that may carry data: all but the default-route (control) NIC, unless that is
/// the only one.
pub fn candidate_nics(topo: &Topology) -> Vec<(&Nic, &PciInfo)> {
    let physical = physical_nics(topo);
    let data: Vec<(&Nic, &PciInfo)> = physical
        .iter()
        .copied()
        .filter(|(n, _)| !n.default_route)
        .collect();
    if data.is_empty() {
        physical
    } else {
        data
    }
}

/// Pair every GPU with its closest NIC (see the module docs for the rule).
pub fn pair_gpus(topo: &Topology) -> Vec<GpuPairing> {
    let nics = candidate_nics(topo);
    let mut load: Vec<usize> = vec![0; nics.len()];
    let mut out = Vec::new();
    for gpu in &topo.gpus {
        let gpu_numa = topo.numa_of(&gpu.pci);
        let best = nics
            .iter()
            .enumerate()
            .map(|(i, (_, pci))| {
                let shared = gpu.pci.shared_path_len(pci);
                let same_numa = gpu_numa.is_some() && topo.numa_of(pci) == gpu_numa;
                (i, shared, same_numa)
            })
            // Longest shared path, then same NUMA, then least loaded, then first by name.
            .max_by(|a, b| {
                (
                    a.1,
                    a.2,
                    std::cmp::Reverse(load[a.0]),
                    std::cmp::Reverse(&nics[a.0].0.name),
                )
                    .cmp(&(
                        b.1,
                        b.2,
                        std::cmp::Reverse(load[b.0]),
                        std::cmp::Reverse(&nics[b.0].0.name),
                    ))
            });
        let (nic, shared) = match best {
            Some((i, shared, _)) => {
                load[i] += 1;
                (Some(nics[i].0.name.clone()), shared)
            }
            None => (None, 0),
        };
        out.push(GpuPairing {
            gpu: gpu.index,
            bus_id: gpu.pci.bus_id.clone(),
            numa: gpu_numa,
            nic,
            shared_path_len: shared,
        });
    }
    out
}

/// Derive the full plan: pairings, per-NIC table rows and NCCL TX/RX binding specs.
pub fn derive(topo: &Topology, rule: &BindingRule) -> TopoPlan {
    let pairings = pair_gpus(topo);
    let have_gpus = !topo.gpus.is_empty();
    let candidates: Vec<&str> = candidate_nics(topo)
        .iter()
        .map(|(n, _)| n.name.as_str())
        .collect();
    let mut rows = Vec::new();
    let mut tx_bindings = BindingSpec::default();
    let mut rx_bindings = BindingSpec::default();
    for (nic, pci) in physical_nics(topo) {
        let numa = topo.numa_of(pci);
        // A NIC whose node is unknown on a multi-node machine gets bindings over all cores.
        let node = node_binding(topo, numa, rule);
        let gpus: Vec<usize> = pairings
            .iter()
            .filter(|p| p.nic.as_deref() == Some(nic.name.as_str()))
            .map(|p| p.gpu)
            .collect();
        let data_nic = if have_gpus {
            !gpus.is_empty()
        } else {
            candidates.contains(&nic.name.as_str())
        };
        if data_nic {
            tx_bindings.push(nic.name.clone(), node.tx.clone());
            rx_bindings.push(nic.name.clone(), node.rx.clone());
        }
        rows.push(NicRow {
            nic: nic.name.clone(),
            driver: nic.driver.clone(),
            bus_id: Some(pci.bus_id.clone()),
            speed_mbps: nic.speed_mbps,
            state: nic.state.clone(),
            numa,
            physical_cores: topo.physical_cpus(numa),
            hyperthreads: topo.hyperthread_cpus(numa),
            tx: node.tx,
            rx: node.rx,
            gpus,
            data_nic,
        });
    }
    TopoPlan {
        rule: *rule,
        rows,
        pairings,
        tx_bindings,
        rx_bindings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_at_least_one_core_per_direction() {
        let r = BindingRule::default();
        assert_eq!(r.scaled_for(52), (8, 14));
        assert_eq!(r.scaled_for(100), (8, 14));
        assert_eq!(r.scaled_for(2), (0, 1));
        assert_eq!(r.scaled_for(1), (0, 1));
        assert_eq!(r.scaled_for(26), (4, 7));
    }
}
