//! Topology discovery and binding derivation on the fixture trees, and hwloc vs sysfs on this
//! machine.

use std::path::PathBuf;

use tcpx_topo::{derive, discover, Backend, BindingRule, BindingSpec, CpuSet, Source, SysRoot};

fn fixture(name: &str) -> SysRoot {
    SysRoot::new(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
}

fn set(list: &str) -> CpuSet {
    CpuSet::parse_list(list).unwrap()
}

const NCCL_TX: &str = "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177";
const NCCL_RX: &str = "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191";

#[test]
fn a3_high_layout_is_read_from_sysfs() {
    let topo = discover(&fixture("a3-high"), Backend::Auto).unwrap();
    assert_eq!(
        topo.source,
        Source::Sysfs,
        "a fixture root must not go through hwloc"
    );
    assert_eq!(topo.cpus.len(), 208);
    assert_eq!(topo.cores.len(), 104);
    assert_eq!(topo.packages, vec![0, 1]);
    assert_eq!(topo.nr_possible_cpus, 208);
    assert_eq!(topo.numa_nodes.len(), 2);
    assert_eq!(topo.numa_nodes[0].cpus, set("0-51,104-155"));
    assert_eq!(topo.numa_nodes[1].cpus, set("52-103,156-207"));
    // Core 8 of socket 0 is CPUs 8 and 112; core 0 of socket 1 is CPUs 52 and 156.
    let core_of = |cpu: u32| &topo.cores[topo.cpus.iter().find(|c| c.id == cpu).unwrap().core];
    assert_eq!(core_of(112).cpus, set("8,112"));
    assert_eq!(core_of(52).cpus, set("52,156"));
    assert_eq!(core_of(52).package, 1);
    assert_eq!(topo.physical_cpus(Some(0)), set("0-51"));
    assert_eq!(topo.hyperthread_cpus(Some(1)), set("156-207"));

    let bus_ids: Vec<&str> = topo.gpus.iter().map(|g| g.pci.bus_id.as_str()).collect();
    assert_eq!(
        bus_ids,
        [
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:09:00.0",
            "0000:0a:00.0",
            "0000:83:00.0",
            "0000:84:00.0",
            "0000:89:00.0",
            "0000:8a:00.0"
        ]
    );
    assert!(topo
        .gpus
        .iter()
        .all(|g| g.model.as_deref() == Some("H100 80GB HBM3")));
    assert_eq!(topo.gpus[5].pci.numa, Some(1));
    assert_eq!(
        topo.gpus[0].pci.path.len(),
        5,
        "host bridge, root port, switch up, switch down, GPU"
    );

    let names: Vec<&str> = topo.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["eth0", "eth1", "eth2", "eth3", "eth4", "lo"]);
    let eth3 = topo.nic("eth3").unwrap();
    assert_eq!(eth3.driver.as_deref(), Some("gve"));
    assert_eq!(eth3.speed_mbps, Some(200_000));
    assert_eq!(eth3.state, "up");
    assert_eq!(eth3.pci.as_ref().unwrap().bus_id, "0000:85:00.0");
    assert_eq!(topo.numa_of(eth3.pci.as_ref().unwrap()), Some(1));
    let lo = topo.nic("lo").unwrap();
    assert!(lo.is_virtual && lo.pci.is_none() && lo.speed_mbps.is_none());
    assert!(topo.warnings.is_empty(), "{:?}", topo.warnings);
}

#[test]
fn a3_high_bindings_equal_nccl() {
    let topo = discover(&fixture("a3-high"), Backend::Sysfs).unwrap();
    let plan = derive(&topo, &BindingRule::default());
    assert_eq!(plan.tx_bindings.to_string(), NCCL_TX);
    assert_eq!(plan.rx_bindings.to_string(), NCCL_RX);
    assert_eq!(plan.tx_bindings, BindingSpec::parse(NCCL_TX).unwrap());
    plan.tx_bindings.validate_for_tcpx().unwrap();

    let paired: Vec<(usize, &str)> = plan
        .pairings
        .iter()
        .map(|p| (p.gpu, p.nic.as_deref().unwrap()))
        .collect();
    assert_eq!(
        paired,
        [
            (0, "eth1"),
            (1, "eth1"),
            (2, "eth2"),
            (3, "eth2"),
            (4, "eth3"),
            (5, "eth3"),
            (6, "eth4"),
            (7, "eth4")
        ]
    );
    // GPU and NIC share host bridge, root port and switch upstream port.
    assert!(plan.pairings.iter().all(|p| p.shared_path_len == 3));

    let row = |n: &str| plan.rows.iter().find(|r| r.nic == n).unwrap();
    assert_eq!(row("eth1").gpus, vec![0, 1]);
    assert_eq!(row("eth4").numa, Some(1));
    assert_eq!(row("eth4").physical_cores, set("52-103"));
    assert_eq!(row("eth4").hyperthreads, set("156-207"));
    // eth0 is on NUMA 0 but no GPU is behind its bridge: listed, not a data NIC, not in bindings.
    assert!(!row("eth0").data_nic);
    assert!(row("eth0").gpus.is_empty());
    assert!(plan.tx_bindings.get("eth0").is_none());
    assert!(plan.rows.iter().all(|r| r.nic != "lo"));
}

/// Without switch information (every device straight on its host bridge, as some VMs show it),
/// GPUs still go to data NICs on their own NUMA node, never to the default-route control NIC.
#[test]
fn flat_pci_pairs_by_numa_and_skips_the_control_nic() {
    let mut topo = discover(&fixture("a3-high"), Backend::Sysfs).unwrap();
    assert!(topo.nic("eth0").unwrap().default_route);
    assert!(!topo.nic("eth1").unwrap().default_route);
    let flatten = |p: &mut tcpx_topo::PciInfo| p.path = vec![p.path[0].clone(), p.bus_id.clone()];
    topo.gpus.iter_mut().for_each(|g| flatten(&mut g.pci));
    topo.nics
        .iter_mut()
        .filter_map(|n| n.pci.as_mut())
        .for_each(flatten);
    let plan = derive(&topo, &BindingRule::default());
    for p in &plan.pairings {
        let nic = p.nic.as_deref().unwrap();
        assert_ne!(nic, "eth0", "GPU {} paired with the control NIC", p.gpu);
        let nic_numa = topo.numa_of(topo.nic(nic).unwrap().pci.as_ref().unwrap());
        assert_eq!(
            nic_numa, p.numa,
            "GPU {} crossed NUMA nodes to {nic}",
            p.gpu
        );
    }
    // Spread evenly: two GPUs per data NIC.
    for nic in ["eth1", "eth2", "eth3", "eth4"] {
        assert_eq!(
            plan.pairings
                .iter()
                .filter(|p| p.nic.as_deref() == Some(nic))
                .count(),
            2
        );
    }
}

#[test]
fn other_rules_move_the_bindings() {
    let topo = discover(&fixture("a3-high"), Backend::Sysfs).unwrap();
    let plan = derive(
        &topo,
        &BindingRule {
            reserved_cores: 2,
            cores_per_direction: 4,
        },
    );
    assert_eq!(plan.tx_bindings.get("eth1").unwrap(), &set("2-5,106-109"));
    assert_eq!(plan.rx_bindings.get("eth3").unwrap(), &set("58-61,162-165"));
}

#[test]
fn single_socket_loopback_only() {
    let topo = discover(&fixture("single-socket-lo"), Backend::Auto).unwrap();
    assert_eq!(topo.cpus.len(), 8);
    assert_eq!(topo.cores.len(), 4);
    assert_eq!(topo.packages, vec![0]);
    // No /sys/devices/system/node: one node 0 with every CPU.
    assert_eq!(topo.numa_nodes.len(), 1);
    assert_eq!(topo.numa_nodes[0].cpus, set("0-7"));
    assert_eq!(topo.physical_cpus(None), set("0-3"));
    assert_eq!(topo.hyperthread_cpus(None), set("4-7"));
    assert!(topo.gpus.is_empty());
    assert_eq!(topo.nics.len(), 1);
    assert!(topo.nics[0].is_virtual);
    let plan = derive(&topo, &BindingRule::default());
    assert!(plan.rows.is_empty());
    assert!(plan.tx_bindings.is_empty() && plan.rx_bindings.is_empty());
}

#[test]
fn hwloc_refuses_fixture_roots() {
    let err = discover(&fixture("single-socket-lo"), Backend::Hwloc).unwrap_err();
    assert!(err.to_string().contains("only the running system"), "{err}");
}

#[test]
fn missing_root_names_what_to_check() {
    let err = discover(&SysRoot::new("/nonexistent/tcpx-root"), Backend::Sysfs).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/tcpx-root/sys/devices/system/cpu/online"),
        "{msg}"
    );
    assert!(msg.contains("--root"), "{msg}");
}

/// hwloc and sysfs must agree about this machine's CPUs, cores, NUMA nodes and PCI paths.
#[cfg(feature = "hwloc")]
#[test]
fn live_hwloc_agrees_with_sysfs() {
    let live = SysRoot::live();
    if live.read("/sys/devices/system/cpu/online").is_err() {
        println!("SKIP: no /sys on this machine");
        return;
    }
    let hw = discover(&live, Backend::Hwloc).expect("hwloc topology of this machine");
    let fs = discover(&live, Backend::Sysfs).unwrap();
    assert_eq!(hw.source, Source::HwlocAndSysfs);
    assert_eq!(hw.cpus, fs.cpus);
    assert_eq!(hw.cores, fs.cores);
    assert_eq!(hw.packages, fs.packages);
    assert_eq!(
        hw.numa_nodes.iter().map(|n| &n.cpus).collect::<Vec<_>>(),
        fs.numa_nodes.iter().map(|n| &n.cpus).collect::<Vec<_>>()
    );
    let online = CpuSet::parse_list(&live.read("/sys/devices/system/cpu/online").unwrap()).unwrap();
    assert_eq!(hw.online_cpus(), online);
    let count = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    assert!(
        hw.cpus.len() >= count,
        "{} CPUs online, {count} usable",
        hw.cpus.len()
    );
    for (a, b) in hw.nics.iter().zip(&fs.nics) {
        assert_eq!(a.name, b.name);
        if let (Some(pa), Some(pb)) = (&a.pci, &b.pci) {
            assert_eq!(
                pa.path, pb.path,
                "PCI path of {} differs between hwloc and sysfs",
                a.name
            );
        }
    }
    println!(
        "live: {} CPUs, {} cores, {} NICs, {} GPUs",
        hw.cpus.len(),
        hw.cores.len(),
        hw.nics.len(),
        hw.gpus.len()
    );
}

/// The hwloc reading path on an A3-high-shaped CPU layout, from hwloc's own synthetic input (the
/// live machine only exercises it with 2 CPUs). OS indexes follow Linux's numbering: core c of
/// package p has CPUs 52p + c and 104 + 52p + c.
#[cfg(feature = "hwloc")]
#[test]
fn hwloc_reads_an_a3_high_shaped_synthetic_topology() {
    let mut indexes = Vec::new();
    for p in 0..2 {
        for c in 0..52 {
            indexes.push((52 * p + c).to_string());
            indexes.push((104 + 52 * p + c).to_string());
        }
    }
    let desc = format!("pack:2 [numa] core:52 pu:2(indexes={})", indexes.join(","));
    let hw = hwlocality::Topology::builder()
        .from_synthetic(&desc)
        .expect("synthetic description")
        .build()
        .expect("hwloc builds the synthetic topology");
    let layout = tcpx_topo::hwloc::cpu_layout(&hw, 208);
    assert_eq!(layout.cpus.len(), 208);
    assert_eq!(layout.cores.len(), 104);
    assert_eq!(layout.packages, vec![0, 1]);
    assert_eq!(layout.numa_nodes.len(), 2);
    assert_eq!(layout.numa_nodes[0].cpus, set("0-51,104-155"));
    assert_eq!(layout.numa_nodes[1].cpus, set("52-103,156-207"));
    let core_of = |cpu: u32| &layout.cores[layout.cpus.iter().find(|c| c.id == cpu).unwrap().core];
    assert_eq!(core_of(112).cpus, set("8,112"));
    assert_eq!(core_of(60).cpus, set("60,164"));
    assert_eq!(core_of(60).numa, Some(1));
    // Same layout as the sysfs fixture reads, so the bindings derived from either agree.
    let fs = discover(&fixture("a3-high"), Backend::Sysfs).unwrap();
    assert_eq!(layout.cpus, fs.cpus);
    assert_eq!(layout.cores, fs.cores);
}

/// The hwloc reading path on the A3-high layout including its PCI tree: an hwloc XML export of
/// the machine next to its sysfs tree gives the same CPUs, PCI paths, NUMA nodes and bindings as
/// sysfs alone.
#[cfg(feature = "hwloc")]
#[test]
fn a3_high_through_hwloc_xml_equals_sysfs() {
    let xml = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/a3-high.hwloc.xml");
    let root = fixture("a3-high");
    let hw = discover(&root, Backend::HwlocXml(xml)).unwrap();
    let fs = discover(&root, Backend::Sysfs).unwrap();
    assert_eq!(hw.source, Source::HwlocAndSysfs);
    assert!(hw.warnings.is_empty(), "{:?}", hw.warnings);
    assert_eq!(hw.cpus, fs.cpus);
    assert_eq!(hw.cores, fs.cores);
    assert_eq!(hw.numa_nodes, fs.numa_nodes);
    assert_eq!(
        hw.gpus, fs.gpus,
        "GPU PCI paths, NUMA nodes and local CPUs from hwloc"
    );
    assert_eq!(hw.nics, fs.nics);
    assert_eq!(
        hw.gpus[6].pci.path,
        [
            "pci0000:80",
            "0000:80:02.0",
            "0000:87:00.0",
            "0000:88:00.0",
            "0000:89:00.0"
        ]
    );
    let plan = derive(&hw, &BindingRule::default());
    assert_eq!(plan.tx_bindings.to_string(), NCCL_TX);
    assert_eq!(plan.rx_bindings.to_string(), NCCL_RX);
}

#[cfg(not(feature = "hwloc"))]
#[test]
fn without_hwloc_auto_falls_back_to_sysfs_and_explicit_hwloc_is_refused() {
    let topo = discover(&SysRoot::live(), Backend::Auto).unwrap();
    assert_eq!(topo.source, Source::Sysfs);
    assert!(
        topo.warnings.iter().any(|w| w.contains("no hwloc support")),
        "{:?}",
        topo.warnings
    );
    let err = discover(&SysRoot::live(), Backend::Hwloc).unwrap_err();
    assert!(err.to_string().contains("no hwloc support"), "{err}");
}
