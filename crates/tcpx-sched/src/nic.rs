//! Which NIC carries which channel: the channel-to-NIC policies, as plain data in, indices out.
//!
//! Inputs are what a topology reader knows about each NIC ([`NicInfo`]: name, address, NUMA node,
//! PCI path, up or down) and about the GPU a flow belongs to ([`GpuPlace`]); the answer is one NIC
//! index per channel ([`assign_channels`]). Nothing here reads the machine, so the same inputs give
//! the same answer everywhere and every policy is tested deterministically. `tcpx-bench` builds the
//! inputs from `tcpx-topo`.
//!
//! Policies:
//! - [`NicPolicy::NumaLocal`]: the up NICs on the GPU's NUMA node, channels round-robin over them.
//! - [`NicPolicy::ClosestPci`]: the up NICs whose PCI path shares the longest prefix with the GPU's
//!   (score = number of shared path elements, as the C++ ChannelManager scores them), channels
//!   round-robin over the best-scoring ones.
//! - [`NicPolicy::RoundRobin`]: every up NIC; channel `c` of flow `f` takes NIC
//!   `(f * channels + c) % n`, so the flows of a node spread over all NICs.
//! - [`NicPolicy::Explicit`]: the listed NICs (by name or address), channel `c` takes entry
//!   `c % len`; a listed NIC that is unknown or down is an error, never skipped.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One NIC as the policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicInfo {
    /// Interface name (`eth1`), or the address itself for an emulated NIC (`127.0.0.2`).
    pub name: String,
    /// The address channels on this NIC bind to.
    pub addr: IpAddr,
    /// NUMA node of the NIC's PCI function; `None` when unknown (virtual or emulated NICs).
    pub numa: Option<u32>,
    /// PCI path from the host bridge down to the NIC (empty when it has none).
    pub pci_path: Vec<String>,
    /// Link state usable (operstate up, or unknown for loopback).
    pub up: bool,
}

/// Where the GPU of one flow sits. `numa: None` and an empty path mean "unknown" (no GPU, or a
/// host-memory flow): then every up NIC counts as local and every NIC scores the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuPlace {
    pub numa: Option<u32>,
    pub pci_path: Vec<String>,
}

/// How channels are given to NICs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicPolicy {
    NumaLocal,
    ClosestPci,
    RoundRobin,
    /// NIC names or addresses, in channel order (repeated when there are more channels).
    Explicit(Vec<String>),
}

impl NicPolicy {
    /// The policy names accepted by [`FromStr`] (an explicit list is given as the NIC list).
    pub const NAMES: &'static [&'static str] =
        &["numa-local", "closest-pci", "round-robin", "explicit"];
}

impl fmt::Display for NicPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NicPolicy::NumaLocal => f.write_str("numa-local"),
            NicPolicy::ClosestPci => f.write_str("closest-pci"),
            NicPolicy::RoundRobin => f.write_str("round-robin"),
            NicPolicy::Explicit(l) => write!(f, "explicit({})", l.join(",")),
        }
    }
}

impl FromStr for NicPolicy {
    type Err = NicError;

    /// `numa-local`, `closest-pci`, `round-robin`, or `explicit:eth1,eth2` / `explicit` (then the
    /// list is filled in by the caller).
    fn from_str(s: &str) -> Result<Self, NicError> {
        let t = s.trim();
        match t {
            "numa-local" | "numa" => Ok(NicPolicy::NumaLocal),
            "closest-pci" | "pci" => Ok(NicPolicy::ClosestPci),
            "round-robin" | "rr" => Ok(NicPolicy::RoundRobin),
            "explicit" => Ok(NicPolicy::Explicit(Vec::new())),
            _ => match t.strip_prefix("explicit:") {
                Some(list) => Ok(NicPolicy::Explicit(
                    list.split(',')
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .collect(),
                )),
                None => Err(NicError::UnknownPolicy(t.to_string())),
            },
        }
    }
}

/// Why no NIC could be given to a channel. Each message says what to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NicError {
    #[error("NIC policy `{0}` is unknown: choose numa-local, closest-pci, round-robin or explicit:<nic>,<nic>")]
    UnknownPolicy(String),
    #[error("no NIC given: name at least one interface or address (e.g. --nics eth1,eth2 or --nics 127.0.0.2)")]
    NoNics,
    #[error("the explicit NIC policy got an empty list: name the NICs in channel order")]
    EmptyExplicitList,
    #[error("NIC `{name}` does not exist here (known: {known}); check `ip addr`")]
    NoSuchNic { name: String, known: String },
    #[error("NIC `{name}` is down; bring it up (`ip link set {name} up`) or leave it out")]
    NicDown { name: String },
    #[error("every NIC is down ({names}); check `ip link`")]
    AllDown { names: String },
    #[error("no up NIC on the GPU's NUMA node {numa} (up NICs: {nics}); use --nic-policy closest-pci or round-robin")]
    NoLocalNic { numa: u32, nics: String },
    #[error("channels is 0: give at least one channel")]
    ZeroChannels,
}

/// The NIC chosen for one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelNic {
    pub channel: usize,
    /// Index into the `nics` slice given to [`assign_channels`].
    pub nic: usize,
    pub name: String,
    pub addr: IpAddr,
}

/// The NUMA node and PCI path of a node's NICs and GPUs as its caller knows them where the
/// machine cannot say (an emulated fabric node, whose veths have no sysfs place): given to the
/// bench by whoever knows, never looked up here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlaces {
    /// The node's NICs with their places (matched to the bench's NICs by interface name).
    pub nics: Vec<NicInfo>,
    /// The node's GPUs, GPU `i` at index `i`.
    pub gpus: Vec<GpuPlace>,
}

impl NodePlaces {
    /// The place of `name`'s NIC (an interface name such as `eth2`), if it is one of these.
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
}

/// The index among `gpus` of the GPU flow `flow` of `flows` stands for, given the NICs in use: a
/// GPU closest (longest shared PCI path, else same NUMA node) to NIC `flow * N / flows`, flows
/// sharing that NIC taking its GPUs in turn; with no NICs or no GPUs, flows spread evenly over
/// the GPUs. This is how a real run would place one process per GPU to use the NICs it was
/// given (tcpx-fabric's `inside` module says why for A3-high).
pub fn gpu_for_flow(flow: u32, flows: u32, in_use: &[NicInfo], gpus: &[GpuPlace]) -> usize {
    if gpus.is_empty() {
        return 0;
    }
    let flows = u64::from(flows.max(1));
    let f = u64::from(flow) % flows;
    if in_use.is_empty() {
        return ((f * gpus.len() as u64) / flows) as usize % gpus.len();
    }
    let n = in_use.len() as u64;
    let nic_of = |g: u64| (g * n / flows) as usize;
    let k = nic_of(f);
    let nic = &in_use[k];
    let turn = (0..f).filter(|&g| nic_of(g) == k).count();
    let closeness = |g: &GpuPlace| {
        (
            pci_score(&g.pci_path, &nic.pci_path),
            usize::from(g.numa.is_some() && g.numa == nic.numa),
        )
    };
    let best = gpus.iter().map(closeness).max().unwrap_or_default();
    let close: Vec<usize> = (0..gpus.len())
        .filter(|&i| closeness(&gpus[i]) == best)
        .collect();
    close[turn % close.len()]
}

/// Finds a NIC by interface name or by address text.
pub fn find_nic(nics: &[NicInfo], wanted: &str) -> Option<usize> {
    let wanted = wanted.trim();
    nics.iter().position(|n| n.name == wanted).or_else(|| {
        wanted
            .parse::<IpAddr>()
            .ok()
            .and_then(|a| nics.iter().position(|n| n.addr == a))
    })
}

/// Number of leading PCI path elements two devices share (0: different host bridges).
pub fn pci_score(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn names(nics: &[NicInfo], idx: &[usize]) -> String {
    if idx.is_empty() {
        return "none".into();
    }
    idx.iter()
        .map(|&i| nics[i].name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives each of `channels` channels of flow `flow` (whose GPU sits at `gpu`) one NIC of `nics`.
pub fn assign_channels(
    policy: &NicPolicy,
    nics: &[NicInfo],
    gpu: &GpuPlace,
    flow: usize,
    channels: usize,
) -> Result<Vec<ChannelNic>, NicError> {
    if channels == 0 {
        return Err(NicError::ZeroChannels);
    }
    if nics.is_empty() {
        return Err(NicError::NoNics);
    }
    let all: Vec<usize> = (0..nics.len()).collect();
    let up: Vec<usize> = all.iter().copied().filter(|&i| nics[i].up).collect();
    if up.is_empty() && !matches!(policy, NicPolicy::Explicit(_)) {
        return Err(NicError::AllDown {
            names: names(nics, &all),
        });
    }
    // The candidate NICs and where channel 0 starts among them.
    let (pool, start): (Vec<usize>, usize) = match policy {
        NicPolicy::Explicit(list) => {
            if list.is_empty() {
                return Err(NicError::EmptyExplicitList);
            }
            let mut pool = Vec::with_capacity(list.len());
            for wanted in list {
                let i = find_nic(nics, wanted).ok_or_else(|| NicError::NoSuchNic {
                    name: wanted.clone(),
                    known: names(nics, &all),
                })?;
                if !nics[i].up {
                    return Err(NicError::NicDown {
                        name: nics[i].name.clone(),
                    });
                }
                pool.push(i);
            }
            (pool, 0)
        }
        NicPolicy::RoundRobin => (up.clone(), flow * channels),
        NicPolicy::NumaLocal => match gpu.numa {
            // Nothing to decide by when the GPU's node is unknown, or when no NIC has a known node
            // (virtual interfaces such as emulated loopback NICs): spread like round-robin. Only a
            // machine whose NICs are placed, none on the GPU's node, is refused.
            None => (up.clone(), flow * channels),
            Some(_) if up.iter().all(|&i| nics[i].numa.is_none()) => (up.clone(), flow * channels),
            Some(numa) => {
                let local: Vec<usize> = up
                    .iter()
                    .copied()
                    .filter(|&i| nics[i].numa == Some(numa))
                    .collect();
                if local.is_empty() {
                    return Err(NicError::NoLocalNic {
                        numa,
                        nics: names(nics, &up),
                    });
                }
                (local, 0)
            }
        },
        NicPolicy::ClosestPci => {
            let best = up
                .iter()
                .map(|&i| pci_score(&nics[i].pci_path, &gpu.pci_path))
                .max()
                .unwrap_or(0);
            let closest: Vec<usize> = up
                .iter()
                .copied()
                .filter(|&i| pci_score(&nics[i].pci_path, &gpu.pci_path) == best)
                .collect();
            // With no GPU position every NIC ties: spread flows like round-robin does.
            let start = if best == 0 { flow * channels } else { 0 };
            (closest, start)
        }
    };
    Ok((0..channels)
        .map(|channel| {
            let nic = pool[(start + channel) % pool.len()];
            ChannelNic {
                channel,
                nic,
                name: nics[nic].name.clone(),
                addr: nics[nic].addr,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        p.split('/').map(str::to_string).collect()
    }

    /// Two NUMA nodes, two NICs each, in the A3-high shape: GPU and NIC pairs share a switch.
    fn a3_like() -> Vec<NicInfo> {
        let nic = |name: &str, addr: &str, numa: u32, p: &str| NicInfo {
            name: name.into(),
            addr: addr.parse().unwrap(),
            numa: Some(numa),
            pci_path: path(p),
            up: true,
        };
        vec![
            nic(
                "eth1",
                "10.0.1.1",
                0,
                "pci0000:00/0000:00:01.0/0000:05:00.0/0000:06:00.0",
            ),
            nic(
                "eth2",
                "10.0.2.1",
                0,
                "pci0000:00/0000:00:02.0/0000:0b:00.0/0000:0c:00.0",
            ),
            nic(
                "eth3",
                "10.0.3.1",
                1,
                "pci0000:80/0000:80:01.0/0000:85:00.0/0000:86:00.0",
            ),
            nic(
                "eth4",
                "10.0.4.1",
                1,
                "pci0000:80/0000:80:02.0/0000:8b:00.0/0000:8c:00.0",
            ),
        ]
    }

    fn gpu(numa: u32, p: &str) -> GpuPlace {
        GpuPlace {
            numa: Some(numa),
            pci_path: path(p),
        }
    }

    fn picked(v: &[ChannelNic]) -> Vec<&str> {
        v.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn closest_pci_takes_the_nic_behind_the_same_switch() {
        let nics = a3_like();
        // GPU behind eth2's switch (0000:0b:00.0).
        let g = gpu(0, "pci0000:00/0000:00:02.0/0000:0b:00.0/0000:0d:00.0");
        let v = assign_channels(&NicPolicy::ClosestPci, &nics, &g, 0, 3).unwrap();
        assert_eq!(picked(&v), ["eth2", "eth2", "eth2"]);
        assert_eq!(v[1].addr, "10.0.2.1".parse::<IpAddr>().unwrap());
        // Only the host bridge in common with eth3 and eth4: both score 1, channels alternate.
        let g = gpu(1, "pci0000:80/0000:80:03.0/0000:90:00.0");
        let v = assign_channels(&NicPolicy::ClosestPci, &nics, &g, 0, 4).unwrap();
        assert_eq!(picked(&v), ["eth3", "eth4", "eth3", "eth4"]);
        assert_eq!(
            pci_score(&nics[2].pci_path, &g.pci_path),
            1,
            "host bridge only"
        );
    }

    #[test]
    fn closest_pci_skips_a_down_nic_for_the_next_best() {
        let mut nics = a3_like();
        nics[1].up = false;
        let g = gpu(0, "pci0000:00/0000:00:02.0/0000:0b:00.0/0000:0d:00.0");
        let v = assign_channels(&NicPolicy::ClosestPci, &nics, &g, 0, 2).unwrap();
        // eth1 shares the host bridge only (score 1) and beats NUMA-1 NICs (score 0).
        assert_eq!(picked(&v), ["eth1", "eth1"]);
    }

    #[test]
    fn numa_local_round_robins_over_the_nodes_nics_and_refuses_an_empty_node() {
        let mut nics = a3_like();
        let g = gpu(1, "pci0000:80/0000:80:01.0/0000:85:00.0/0000:87:00.0");
        let v = assign_channels(&NicPolicy::NumaLocal, &nics, &g, 3, 3).unwrap();
        assert_eq!(picked(&v), ["eth3", "eth4", "eth3"]);
        nics[2].up = false;
        nics[3].up = false;
        let e = assign_channels(&NicPolicy::NumaLocal, &nics, &g, 0, 1).unwrap_err();
        assert_eq!(
            e,
            NicError::NoLocalNic {
                numa: 1,
                nics: "eth1, eth2".into()
            }
        );
        assert!(e.to_string().contains("closest-pci"), "{e}");
    }

    /// A GPU with a known NUMA node and NICs with none (emulated loopback addresses on a GPU
    /// host): round-robin, not a refusal; one placed NIC elsewhere still refuses.
    #[test]
    fn numa_local_with_unplaced_nics_spreads_like_round_robin() {
        let mut nics = a3_like();
        for n in &mut nics {
            n.numa = None;
        }
        let g = gpu(0, "pci0000:00/0000:00:06.0");
        let v = assign_channels(&NicPolicy::NumaLocal, &nics, &g, 1, 2).unwrap();
        assert_eq!(picked(&v), ["eth3", "eth4"]);
        nics[0].numa = Some(1);
        let e = assign_channels(&NicPolicy::NumaLocal, &nics, &g, 1, 2).unwrap_err();
        assert!(matches!(e, NicError::NoLocalNic { numa: 0, .. }), "{e}");
    }

    #[test]
    fn round_robin_spreads_flows_over_all_nics() {
        let nics = a3_like();
        let g = GpuPlace::default();
        let per_flow: Vec<Vec<String>> = (0..3)
            .map(|f| {
                let v = assign_channels(&NicPolicy::RoundRobin, &nics, &g, f, 2).unwrap();
                v.into_iter().map(|c| c.name).collect()
            })
            .collect();
        assert_eq!(
            per_flow,
            [["eth1", "eth2"], ["eth3", "eth4"], ["eth1", "eth2"]]
        );
    }

    #[test]
    fn unknown_gpu_position_treats_every_nic_alike() {
        // Emulated NICs on loopback: no NUMA, no PCI path.
        let nics: Vec<NicInfo> = ["127.0.0.2", "127.0.0.3"]
            .iter()
            .map(|a| NicInfo {
                name: a.to_string(),
                addr: a.parse().unwrap(),
                numa: None,
                pci_path: vec![],
                up: true,
            })
            .collect();
        for policy in [NicPolicy::NumaLocal, NicPolicy::ClosestPci] {
            let v = assign_channels(&policy, &nics, &GpuPlace::default(), 0, 3).unwrap();
            assert_eq!(
                picked(&v),
                ["127.0.0.2", "127.0.0.3", "127.0.0.2"],
                "{policy}"
            );
            // Flow 1 starts where flow 0 stopped, so flows spread over the NICs.
            let v = assign_channels(&policy, &nics, &GpuPlace::default(), 1, 1).unwrap();
            assert_eq!(picked(&v), ["127.0.0.3"], "{policy}");
        }
    }

    #[test]
    fn explicit_lists_take_names_or_addresses_and_refuse_unknown_or_down_nics() {
        let mut nics = a3_like();
        let p: NicPolicy = "explicit:eth4,10.0.1.1".parse().unwrap();
        let v = assign_channels(&p, &nics, &GpuPlace::default(), 5, 3).unwrap();
        assert_eq!(picked(&v), ["eth4", "eth1", "eth4"]);
        assert_eq!(v.iter().map(|c| c.nic).collect::<Vec<_>>(), [3, 0, 3]);
        let p = NicPolicy::Explicit(vec!["eth9".into()]);
        let e = assign_channels(&p, &nics, &GpuPlace::default(), 0, 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("`eth9` does not exist here (known: eth1, eth2, eth3, eth4)"),
            "{e}"
        );
        nics[3].up = false;
        let p = NicPolicy::Explicit(vec!["eth4".into()]);
        let e = assign_channels(&p, &nics, &GpuPlace::default(), 0, 1).unwrap_err();
        assert_eq!(
            e,
            NicError::NicDown {
                name: "eth4".into()
            }
        );
        assert_eq!(
            assign_channels(
                &NicPolicy::Explicit(vec![]),
                &nics,
                &GpuPlace::default(),
                0,
                1
            ),
            Err(NicError::EmptyExplicitList)
        );
    }

    #[test]
    fn no_nics_all_down_zero_channels_and_bad_names_are_errors() {
        let g = GpuPlace::default();
        assert_eq!(
            assign_channels(&NicPolicy::RoundRobin, &[], &g, 0, 1),
            Err(NicError::NoNics)
        );
        let mut nics = a3_like();
        assert_eq!(
            assign_channels(&NicPolicy::RoundRobin, &nics, &g, 0, 0),
            Err(NicError::ZeroChannels)
        );
        nics.iter_mut().for_each(|n| n.up = false);
        let e = assign_channels(&NicPolicy::ClosestPci, &nics, &g, 0, 1).unwrap_err();
        assert!(matches!(e, NicError::AllDown { .. }), "{e}");
        let e = "fastest".parse::<NicPolicy>().unwrap_err();
        assert!(e.to_string().contains("round-robin"), "{e}");
        for name in NicPolicy::NAMES {
            assert!(name.parse::<NicPolicy>().is_ok(), "{name}");
        }
        assert_eq!(
            "round-robin".parse::<NicPolicy>().unwrap().to_string(),
            "round-robin"
        );
    }
}
