//! The NIC policies fed by `tcpx-topo`, on the A3-high fixture (8 GPUs, eth1-eth4 as data NICs,
//! eth0 the control NIC): closest-pci must give each GPU's channels the NIC that `tcpx-topo`'s
//! own pairing gives it, and numa-local the NICs of the GPU's NUMA node.

use std::net::IpAddr;
use std::path::PathBuf;

use tcpx_bench::nics::{nic_inventory, plan_from, Interface};
use tcpx_bench::Experiment;
use tcpx_topo::{discover, Backend, SysRoot};

fn a3_high() -> tcpx_topo::Topology {
    let root =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tcpx-topo/tests/fixtures/a3-high");
    discover(&SysRoot::new(root), Backend::Sysfs).unwrap()
}

/// The fixture has no addresses: give eth<k> 10.0.<k>.1, as the A3 data NICs have one subnet each.
fn interfaces(topo: &tcpx_topo::Topology) -> Vec<Interface> {
    topo.nics
        .iter()
        .enumerate()
        .map(|(k, n)| Interface {
            name: n.name.clone(),
            addrs: vec![format!("10.0.{k}.1").parse::<IpAddr>().unwrap()],
            up: true,
        })
        .collect()
}

fn data_nics() -> Vec<String> {
    ["eth1", "eth2", "eth3", "eth4"].map(String::from).to_vec()
}

/// One flow per GPU, `channels` each, over the data NICs with NIC policy `policy`.
fn eight_flows_over_data_nics(channels: u32, policy: &str) -> Experiment {
    Experiment {
        flows: 8,
        channels,
        nics: data_nics(),
        nic_policy: policy.parse().unwrap(),
        ..Experiment::default()
    }
}

#[test]
fn closest_pci_reproduces_tcpx_topo_pairing_on_a3_high() {
    let topo = a3_high();
    assert_eq!(topo.gpus.len(), 8);
    let nics = nic_inventory(&data_nics(), &interfaces(&topo), Some(&topo), &|_| false).unwrap();
    assert!(nics
        .iter()
        .all(|n| n.numa.is_some() && !n.pci_path.is_empty()));
    let exp = eight_flows_over_data_nics(2, "closest-pci");
    let plan = plan_from(&exp, &nics, Some(&topo)).unwrap();
    let pairing = tcpx_topo::plan::pair_gpus(&topo);
    for (gpu, chans) in plan.per_flow.iter().enumerate() {
        let want = pairing[gpu].nic.as_deref().unwrap();
        for c in chans {
            assert_eq!(c.name, want, "GPU {gpu} channel {}", c.channel);
        }
    }
    // Two GPUs per NIC, as on A3-high.
    let mut per_nic = std::collections::BTreeMap::new();
    for chans in &plan.per_flow {
        *per_nic.entry(chans[0].name.clone()).or_insert(0) += 1;
    }
    assert_eq!(per_nic.values().copied().collect::<Vec<_>>(), [2, 2, 2, 2]);
}

#[test]
fn numa_local_keeps_each_gpu_on_its_node_on_a3_high() {
    let topo = a3_high();
    let nics = nic_inventory(&data_nics(), &interfaces(&topo), Some(&topo), &|_| false).unwrap();
    let exp = eight_flows_over_data_nics(4, "numa-local");
    let plan = plan_from(&exp, &nics, Some(&topo)).unwrap();
    for (gpu, chans) in plan.per_flow.iter().enumerate() {
        let gpu_numa = topo.numa_of(&topo.gpus[gpu].pci);
        assert!(gpu_numa.is_some());
        for c in chans {
            assert_eq!(
                nics[c.nic].numa, gpu_numa,
                "GPU {gpu} channel {}",
                c.channel
            );
        }
        // Both NICs of the node are used by the 4 channels.
        let distinct: std::collections::BTreeSet<_> = chans.iter().map(|c| &c.name).collect();
        assert_eq!(distinct.len(), 2, "GPU {gpu}: {chans:?}");
    }
}
