//! This side's NICs for an experiment: `--nics` entries resolved against the machine's interfaces
//! and topology into `tcpx_sched::nic` inputs, and the per-flow channel-to-NIC plan.
//!
//! An entry is an interface name (`eth1`: its first IPv4 address, else its first global IPv6 one)
//! or a local address (`127.0.0.2`: any address this machine can bind, so every 127.0.0.0/8
//! address emulates one more NIC on loopback). NUMA node and PCI path come from `tcpx-topo`
//! (`Topology::nics`) where the interface is known there; emulated NICs have neither. A named NIC
//! that does not exist, has no address or is down is an error that says what to check.

use std::net::IpAddr;

use nix::net::if_::InterfaceFlags;

/// The places a caller gives the bench ([`crate::SideEnv::places`]).
pub use tcpx_sched::nic::NodePlaces;
use tcpx_sched::nic::{assign_channels, ChannelNic, GpuPlace, NicError, NicInfo, NicPolicy};
use tcpx_topo::Topology;

use crate::Experiment;

/// One network interface as the machine reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addrs: Vec<IpAddr>,
    /// Administratively up and with a carrier (IFF_UP and IFF_RUNNING; loopback needs IFF_UP).
    pub up: bool,
}

/// The machine's interfaces (getifaddrs), in this thread's network namespace.
pub fn local_interfaces() -> Result<Vec<Interface>, String> {
    let mut out: Vec<Interface> = Vec::new();
    let list = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("listing network interfaces (getifaddrs): {e}"))?;
    for ifa in list {
        let addr = ifa.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        });
        let i = match out.iter().position(|i| i.name == ifa.interface_name) {
            Some(i) => i,
            None => {
                // Flags, not /sys/class/net: sysfs shows the namespace it was mounted in, while
                // getifaddrs answers for this thread's network namespace.
                let f = ifa.flags;
                out.push(Interface {
                    name: ifa.interface_name.clone(),
                    addrs: Vec::new(),
                    up: f.contains(InterfaceFlags::IFF_UP)
                        && (f.contains(InterfaceFlags::IFF_RUNNING)
                            || f.contains(InterfaceFlags::IFF_LOOPBACK)),
                });
                out.len() - 1
            }
        };
        if let Some(a) = addr {
            out[i].addrs.push(a);
        }
    }
    Ok(out)
}

/// The address a named interface's channels bind to: first IPv4, else first global IPv6.
fn usable_addr(i: &Interface) -> Option<IpAddr> {
    i.addrs.iter().copied().find(IpAddr::is_ipv4).or_else(|| {
        i.addrs.iter().copied().find(|a| match a {
            // fe80::/10 needs a scope id, which a bind address cannot carry here.
            IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
            IpAddr::V4(_) => false,
        })
    })
}

/// Interface `i` bound at `addr` and shown as `name`, with its NUMA node and PCI path from
/// `topo` where it knows them.
fn nic_info(topo: Option<&Topology>, i: &Interface, name: String, addr: IpAddr) -> NicInfo {
    let (numa, pci_path) = match topo.and_then(|t| Some((t, t.nic(&i.name)?.pci.as_ref()?))) {
        Some((t, p)) => (t.numa_of(p), p.path.clone()),
        None => (None, Vec::new()),
    };
    NicInfo {
        name,
        addr,
        numa,
        pci_path,
        up: i.up,
    }
}

/// Checks that `addr` can be bound here (it belongs to this machine).
fn bindable(addr: IpAddr) -> bool {
    std::net::TcpListener::bind((addr, 0)).is_ok()
}

/// Resolves `--nics` entries into policy inputs. `bind_check` says whether an address belongs to
/// this machine (the live check binds a socket; tests pass their own).
pub fn nic_inventory(
    entries: &[String],
    interfaces: &[Interface],
    topo: Option<&Topology>,
    bind_check: &dyn Fn(IpAddr) -> bool,
) -> Result<Vec<NicInfo>, NicError> {
    if entries.is_empty() {
        return Err(NicError::NoNics);
    }
    let known = || {
        interfaces
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.trim();
        let info =
            if let Ok(addr) = entry.parse::<IpAddr>() {
                let owner = interfaces.iter().find(|i| i.addrs.contains(&addr));
                match owner {
                    Some(i) => {
                        let name = if addr.is_loopback() {
                            entry.to_string()
                        } else {
                            i.name.clone()
                        };
                        nic_info(topo, i, name, addr)
                    }
                    // 127.0.0.2 and friends: on `lo` without being listed; the kernel decides.
                    None if bind_check(addr) => NicInfo {
                        name: entry.to_string(),
                        addr,
                        numa: None,
                        pci_path: Vec::new(),
                        up: true,
                    },
                    None => {
                        return Err(NicError::NoSuchNic {
                            name: format!("{entry} (no interface here has this address)"),
                            known: known(),
                        })
                    }
                }
            } else {
                let i = interfaces.iter().find(|i| i.name == entry).ok_or_else(|| {
                    NicError::NoSuchNic {
                        name: entry.to_string(),
                        known: known(),
                    }
                })?;
                let addr = usable_addr(i).ok_or_else(|| NicError::NoSuchNic {
                    name: format!("{entry} (it has no usable IP address: `ip addr add` one)"),
                    known: known(),
                })?;
                nic_info(topo, i, i.name.clone(), addr)
            };
        // A NIC the user named must work: a down one is an error, never skipped.
        if !info.up {
            return Err(NicError::NicDown { name: info.name });
        }
        out.push(info);
    }
    Ok(out)
}

/// Where flow `flow`'s GPU sits: GPU `flow` of the topology (PCI bus order), when there is one.
pub fn gpu_place(topo: Option<&Topology>, flow: u32) -> GpuPlace {
    topo.and_then(|t| {
        t.gpus.get(flow as usize).map(|g| GpuPlace {
            numa: t.numa_of(&g.pci),
            pci_path: g.pci.path.clone(),
        })
    })
    .unwrap_or_default()
}

/// The channel-to-NIC plan of this process's flows (index `k` of [`Experiment::local_flows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicPlan {
    pub per_flow: Vec<Vec<ChannelNic>>,
}

impl NicPlan {
    /// `flow 0: eth1,eth2; flow 1: ...` for headers and reports.
    pub fn describe(&self, exp: &Experiment) -> String {
        self.per_flow
            .iter()
            .enumerate()
            .map(|(k, chans)| {
                let names: Vec<&str> = chans.iter().map(|c| c.name.as_str()).collect();
                format!("flow {}: {}", exp.flow_id(k as u32), names.join(","))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Builds the plan from resolved NICs (pure; see [`plan_nics`] for the live machine).
pub fn plan_from(
    exp: &Experiment,
    nics: &[NicInfo],
    topo: Option<&Topology>,
) -> Result<NicPlan, NicError> {
    plan_with(exp, nics, &|flow| gpu_place(topo, flow))
}

/// The NICs of `nics` with the NUMA node and PCI path `places` gives them (an emulated fabric
/// node's veths have none in sysfs), matched by interface name; NICs `places` does not know keep
/// theirs.
pub fn with_places(mut nics: Vec<NicInfo>, places: &NodePlaces) -> Vec<NicInfo> {
    for n in &mut nics {
        if let Some(e) = places.nic(&n.name) {
            n.numa = e.numa;
            n.pci_path = e.pci_path.clone();
        }
    }
    nics
}

/// The plan with NIC and GPU places from the caller (an emulated fabric node): flow `f` stands
/// for the GPU [`NodePlaces::gpu_for`] picks (GPUs next to the NICs in use).
pub fn plan_with_places(
    exp: &Experiment,
    nics: Vec<NicInfo>,
    places: &NodePlaces,
) -> Result<NicPlan, NicError> {
    let nics = with_places(nics, places);
    plan_with(exp, &nics, &|flow| places.gpu_for(flow, exp.flows, &nics))
}

fn plan_with(
    exp: &Experiment,
    nics: &[NicInfo],
    gpu_of: &dyn Fn(u32) -> GpuPlace,
) -> Result<NicPlan, NicError> {
    let policy = match exp.nic_policy {
        tcpx_model::NicPolicy::RoundRobin => NicPolicy::RoundRobin,
        tcpx_model::NicPolicy::NumaLocal => NicPolicy::NumaLocal,
        tcpx_model::NicPolicy::ClosestPci => NicPolicy::ClosestPci,
        tcpx_model::NicPolicy::Explicit => NicPolicy::Explicit(exp.nics.clone()),
    };
    let per_flow = (0..exp.local_flows())
        .map(|k| {
            let flow = exp.flow_id(k);
            assign_channels(
                &policy,
                nics,
                &gpu_of(flow),
                flow as usize,
                exp.channels as usize,
            )
        })
        .collect::<Result<_, _>>()?;
    Ok(NicPlan { per_flow })
}

/// The live plan: `None` when the experiment names no NICs (channels use the backend's default).
/// Topology is read from sysfs (no hwloc needed); where that fails, NICs have no NUMA/PCI place.
/// Where the caller gives `places` (a process in an emulated fabric node, which the binary
/// knows), NIC and GPU places come from them instead, as they would on A3.
pub fn plan_nics(exp: &Experiment, places: Option<&NodePlaces>) -> Result<Option<NicPlan>, String> {
    if exp.nics.is_empty() {
        return Ok(None);
    }
    let interfaces = local_interfaces()?;
    if let Some(places) = places {
        let nics =
            nic_inventory(&exp.nics, &interfaces, None, &bindable).map_err(|e| e.to_string())?;
        return plan_with_places(exp, nics, places)
            .map(Some)
            .map_err(|e| e.to_string());
    }
    let topo = match tcpx_topo::discover(&tcpx_topo::SysRoot::live(), tcpx_topo::Backend::Sysfs) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("topology unreadable ({e}); NIC policies see no NUMA/PCI places");
            None
        }
    };
    let nics = nic_inventory(&exp.nics, &interfaces, topo.as_ref(), &bindable)
        .map_err(|e| e.to_string())?;
    plan_from(exp, &nics, topo.as_ref())
        .map(Some)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifc(name: &str, addrs: &[&str], up: bool) -> Interface {
        Interface {
            name: name.into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            up,
        }
    }

    fn machine() -> Vec<Interface> {
        vec![
            ifc("lo", &["127.0.0.1", "::1"], true),
            ifc("eth0", &["fe80::1", "10.0.0.5"], true),
            ifc("eth1", &["fe80::2", "fd00::7"], true),
            ifc("eth2", &["10.0.2.5"], false),
            ifc("eth3", &[], true),
        ]
    }

    fn entries(e: &[&str]) -> Vec<String> {
        e.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_and_addresses_resolve_to_bind_addresses() {
        let all_local = |_: IpAddr| true;
        let v = nic_inventory(
            &entries(&["eth0", "eth1", "127.0.0.3", "10.0.0.5"]),
            &machine(),
            None,
            &all_local,
        )
        .unwrap();
        let got: Vec<(String, String)> = v
            .iter()
            .map(|n| (n.name.clone(), n.addr.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("eth0".into(), "10.0.0.5".into()),
                ("eth1".into(), "fd00::7".into()),
                ("127.0.0.3".into(), "127.0.0.3".into()),
                ("eth0".into(), "10.0.0.5".into()),
            ]
        );
    }

    #[test]
    fn missing_down_and_addressless_nics_are_named() {
        let nothing_local = |_: IpAddr| false;
        let e = nic_inventory(&entries(&["eth9"]), &machine(), None, &nothing_local)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`eth9` does not exist here (known: lo, eth0, eth1, eth2, eth3)"),
            "{e}"
        );
        let e = nic_inventory(&entries(&["eth2"]), &machine(), None, &nothing_local).unwrap_err();
        assert_eq!(
            e,
            NicError::NicDown {
                name: "eth2".into()
            }
        );
        let e =
            nic_inventory(&entries(&["10.0.2.5"]), &machine(), None, &nothing_local).unwrap_err();
        assert_eq!(
            e,
            NicError::NicDown {
                name: "eth2".into()
            }
        );
        let e = nic_inventory(&entries(&["eth3"]), &machine(), None, &nothing_local)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no usable IP address"), "{e}");
        let e = nic_inventory(&entries(&["192.0.2.77"]), &machine(), None, &nothing_local)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no interface here has this address"), "{e}");
    }

    /// On the emulated fabric veths eth1..eth4 have no sysfs place; the fabric's A3 placement
    /// makes numa-local and closest-pci choose as on A3, two flows standing for GPUs 0 and 4.
    #[test]
    fn fabric_placement_makes_numa_local_and_closest_pci_act_as_on_a3() {
        use tcpx_fabric::{placement, Node, Topology};
        let veths: Vec<Interface> = (0..4u32)
            .map(|k| {
                ifc(
                    &placement::nic_name(k),
                    &[&placement::nic_addr(k, Node::A).to_string()],
                    true,
                )
            })
            .collect();
        let names = entries(&["eth1", "eth2", "eth3", "eth4"]);
        let nics = nic_inventory(&names, &veths, None, &|_| false).unwrap();
        assert!(nics.iter().all(|n| n.numa.is_none()));
        let fabric = NodePlaces {
            nics: placement::nic_infos(4, Node::A, Topology::A3High),
            gpus: placement::gpu_places(Topology::A3High),
        };
        let exp = |policy: &str, flows: u32, channels: u32| Experiment {
            flows,
            channels,
            nic_policy: policy.parse().unwrap(),
            nics: names.clone(),
            ..Experiment::default()
        };
        let e = exp("numa-local", 2, 2);
        let p = plan_with_places(&e, nics.clone(), &fabric).unwrap();
        assert_eq!(p.describe(&e), "flow 0: eth1,eth2; flow 1: eth3,eth4");
        let e = exp("closest-pci", 4, 1);
        let p = plan_with_places(&e, nics.clone(), &fabric).unwrap();
        assert_eq!(
            p.describe(&e),
            "flow 0: eth1; flow 1: eth2; flow 2: eth3; flow 3: eth4"
        );
        // Without the fabric's places the same policy sees no NUMA node and goes round-robin.
        let e = exp("numa-local", 2, 2);
        let p = plan_from(&e, &nics, None).unwrap();
        assert_eq!(p.describe(&e), "flow 0: eth1,eth2; flow 1: eth3,eth4");
        let e = exp("numa-local", 2, 4);
        assert_eq!(
            plan_with_places(&e, nics.clone(), &fabric)
                .unwrap()
                .describe(&e),
            "flow 0: eth1,eth2,eth1,eth2; flow 1: eth3,eth4,eth3,eth4"
        );
        assert_eq!(
            plan_from(&e, &nics, None).unwrap().describe(&e),
            "flow 0: eth1,eth2,eth3,eth4; flow 1: eth1,eth2,eth3,eth4"
        );
    }

    #[test]
    fn plan_gives_each_flow_its_channels_and_a_child_only_its_flow() {
        let nics = nic_inventory(
            &entries(&["127.0.0.2", "127.0.0.3", "127.0.0.4"]),
            &[],
            None,
            &|_| true,
        )
        .unwrap();
        let exp = Experiment {
            flows: 2,
            channels: 2,
            nics: entries(&["127.0.0.2", "127.0.0.3", "127.0.0.4"]),
            ..Experiment::default()
        };
        let p = plan_from(&exp, &nics, None).unwrap();
        assert_eq!(
            p.describe(&exp),
            "flow 0: 127.0.0.2,127.0.0.3; flow 1: 127.0.0.4,127.0.0.2"
        );
        // The child for flow 1 of a multi-process run gets flow 1's channels.
        let child = Experiment {
            flow_index: Some(1),
            ..exp.clone()
        };
        let p = plan_from(&child, &nics, None).unwrap();
        assert_eq!(p.describe(&child), "flow 1: 127.0.0.4,127.0.0.2");
        let explicit = Experiment {
            nic_policy: "explicit".parse().unwrap(),
            nics: entries(&["127.0.0.4", "127.0.0.2"]),
            ..exp
        };
        let p = plan_from(&explicit, &nics, None).unwrap();
        assert_eq!(
            p.describe(&explicit),
            "flow 0: 127.0.0.4,127.0.0.2; flow 1: 127.0.0.4,127.0.0.2"
        );
    }

    #[test]
    fn live_plan_on_loopback_addresses() {
        let exp = Experiment {
            flows: 1,
            channels: 3,
            nics: entries(&["127.0.0.2", "127.0.0.3"]),
            ..Experiment::default()
        };
        let p = plan_nics(&exp, None).unwrap().unwrap();
        assert_eq!(p.describe(&exp), "flow 0: 127.0.0.2,127.0.0.3,127.0.0.2");
        assert_eq!(plan_nics(&Experiment::default(), None).unwrap(), None);
        let bad = Experiment {
            nics: entries(&["tcpx-no-such-if0"]),
            ..exp
        };
        let e = plan_nics(&bad, None).unwrap_err();
        assert!(e.contains("`tcpx-no-such-if0` does not exist here"), "{e}");
    }
}
