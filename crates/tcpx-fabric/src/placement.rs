//! The NUMA/PCI places of the emulated NICs and GPUs, as `tcpx_sched::nic` inputs.
//!
//! The A3-high numbers are those of the `tcpx-topo` a3-high fixture (a real A3-high node's sysfs):
//! a test reads that fixture with `tcpx-topo` and checks it against this table, so the two cannot
//! drift apart. They are written out here because an installed `tcpx-run` has no fixture tree.

use std::net::{IpAddr, Ipv4Addr};

use tcpx_sched::nic::{GpuPlace, NicInfo};

use crate::spec::{Topology, MAX_NODES};

/// One emulated node: node A, B, C, ... H (index 0 to 7). A two-node fabric has A and B; an
/// N-node fabric has the first N. Node A is the leader's side of a two-node run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Node(u8);

impl Node {
    /// The leader's node (the sender in a bench run started from it).
    pub const A: Node = Node(0);
    /// The follower's node of a two-node fabric.
    pub const B: Node = Node(1);
    /// The most nodes a fabric has (their letters are a to h).
    pub const MAX: u32 = MAX_NODES;

    /// Node `index` (0 is A), if below [`Node::MAX`].
    pub fn new(index: u32) -> Option<Node> {
        (index < Node::MAX).then_some(Node(index as u8))
    }

    /// The first `count` nodes, A first (at most [`Node::MAX`]).
    pub fn first(count: u32) -> impl Iterator<Item = Node> {
        (0..count.min(Node::MAX)).map(|i| Node(i as u8))
    }

    /// 0 for A, 1 for B, ...
    pub fn index(self) -> u32 {
        u32::from(self.0)
    }

    /// `a` for A, `b` for B, ... (in namespace names and [`crate::FABRIC_NODE_ENV`]).
    pub fn letter(self) -> char {
        char::from(b'a' + self.0)
    }

    /// `node A`, `node B`, ...
    pub fn label(self) -> &'static str {
        const LABELS: [&str; Node::MAX as usize] = [
            "node A", "node B", "node C", "node D", "node E", "node F", "node G", "node H",
        ];
        LABELS[self.0 as usize]
    }

    /// Parses a node's letter (`a`..`h`, either case).
    pub fn from_letter(v: &str) -> Option<Node> {
        match v.trim().as_bytes() {
            [c] => {
                let c = c.to_ascii_lowercase();
                (b'a'..b'a' + Node::MAX as u8)
                    .contains(&c)
                    .then(|| Node(c - b'a'))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A node is written as its letter (`"c"`) in state files and JSON.
impl serde::Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_char(self.letter())
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        let v = String::deserialize(d)?;
        Node::from_letter(&v)
            .ok_or_else(|| serde::de::Error::custom(format!("`{v}` is not a fabric node (a to h)")))
    }
}

/// A3-high's data NICs eth1..eth4: (name, NUMA node, PCI path from the host bridge down).
pub const A3_NICS: [(&str, u32, [&str; 5]); 4] = [
    (
        "eth1",
        0,
        [
            "pci0000:00",
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:02.0",
            "0000:05:00.0",
        ],
    ),
    (
        "eth2",
        0,
        [
            "pci0000:00",
            "0000:00:02.0",
            "0000:07:00.0",
            "0000:08:02.0",
            "0000:0b:00.0",
        ],
    ),
    (
        "eth3",
        1,
        [
            "pci0000:80",
            "0000:80:01.0",
            "0000:81:00.0",
            "0000:82:02.0",
            "0000:85:00.0",
        ],
    ),
    (
        "eth4",
        1,
        [
            "pci0000:80",
            "0000:80:02.0",
            "0000:87:00.0",
            "0000:88:02.0",
            "0000:8b:00.0",
        ],
    ),
];

/// A3-high's eight H100s in PCI bus order: (NUMA node, PCI path).
pub const A3_GPUS: [(u32, [&str; 5]); 8] = [
    (
        0,
        [
            "pci0000:00",
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0",
        ],
    ),
    (
        0,
        [
            "pci0000:00",
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:01.0",
            "0000:04:00.0",
        ],
    ),
    (
        0,
        [
            "pci0000:00",
            "0000:00:02.0",
            "0000:07:00.0",
            "0000:08:00.0",
            "0000:09:00.0",
        ],
    ),
    (
        0,
        [
            "pci0000:00",
            "0000:00:02.0",
            "0000:07:00.0",
            "0000:08:01.0",
            "0000:0a:00.0",
        ],
    ),
    (
        1,
        [
            "pci0000:80",
            "0000:80:01.0",
            "0000:81:00.0",
            "0000:82:00.0",
            "0000:83:00.0",
        ],
    ),
    (
        1,
        [
            "pci0000:80",
            "0000:80:01.0",
            "0000:81:00.0",
            "0000:82:01.0",
            "0000:84:00.0",
        ],
    ),
    (
        1,
        [
            "pci0000:80",
            "0000:80:02.0",
            "0000:87:00.0",
            "0000:88:00.0",
            "0000:89:00.0",
        ],
    ),
    (
        1,
        [
            "pci0000:80",
            "0000:80:02.0",
            "0000:87:00.0",
            "0000:88:01.0",
            "0000:8a:00.0",
        ],
    ),
];

/// The interface name of emulated NIC `k` (0-based) in both namespaces: `eth1`, `eth2`, ... as
/// on A3 (eth0 is A3's control NIC, which carries no GPU traffic).
pub fn nic_name(k: u32) -> String {
    format!("eth{}", k + 1)
}

/// The address of NIC `k` on `node`: 10.231.k.(i+1) on node i, so 10.231.k.1 in node A and
/// 10.231.k.2 in node B. In a two-node fabric NIC k is one /30 per veth pair, so each NIC's
/// traffic is routed over its own pair; in a switched fabric NIC k of every node sits on rail k's
/// bridge, one /24 per rail. Only ever configured inside the fabric's namespaces.
pub fn nic_addr(k: u32, node: Node) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, k as u8, node.0 + 1)
}

/// The prefix length of every NIC's subnet in a two-node fabric (one veth pair per NIC).
pub const PREFIX_LEN: u8 = 30;

/// The prefix length of every rail's subnet in a switched fabric (one bridge per NIC index).
pub const SWITCHED_PREFIX_LEN: u8 = 24;

/// The NICs of `node` as the channel-to-NIC policies see them, with `topology`'s placement.
pub fn nic_infos(nics: u32, node: Node, topology: Topology) -> Vec<NicInfo> {
    (0..nics)
        .map(|k| {
            let (numa, pci_path) = match topology {
                Topology::A3High => match A3_NICS.get(k as usize) {
                    Some((_, numa, path)) => {
                        (Some(*numa), path.iter().map(|s| s.to_string()).collect())
                    }
                    None => (None, Vec::new()),
                },
                Topology::Flat => (None, Vec::new()),
            };
            NicInfo {
                name: nic_name(k),
                addr: IpAddr::V4(nic_addr(k, node)),
                numa,
                pci_path,
                up: true,
            }
        })
        .collect()
}

/// Where GPU `i` of an emulated node sits (A3: eight GPUs; flat: unknown for every index).
pub fn gpu_places(topology: Topology) -> Vec<GpuPlace> {
    match topology {
        Topology::A3High => A3_GPUS
            .iter()
            .map(|(numa, path)| GpuPlace {
                numa: Some(*numa),
                pci_path: path.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
        Topology::Flat => vec![GpuPlace::default(); 8],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tcpx_sched::nic::{assign_channels, NicPolicy};

    fn fixture() -> tcpx_topo::Topology {
        let root =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tcpx-topo/tests/fixtures/a3-high");
        tcpx_topo::discover(&tcpx_topo::SysRoot::new(&root), tcpx_topo::Backend::Sysfs).unwrap()
    }

    #[test]
    fn the_a3_table_is_what_tcpx_topo_reads_from_the_a3_fixture() {
        let t = fixture();
        for (name, numa, path) in A3_NICS {
            let pci = t.nic(name).and_then(|n| n.pci.as_ref()).unwrap();
            assert_eq!(t.numa_of(pci), Some(numa), "{name}");
            assert_eq!(pci.path, path.to_vec(), "{name}");
        }
        assert_eq!(t.gpus.len(), A3_GPUS.len());
        for (g, (numa, path)) in t.gpus.iter().zip(A3_GPUS) {
            assert_eq!(t.numa_of(&g.pci), Some(numa), "GPU {}", g.index);
            assert_eq!(g.pci.path, path.to_vec(), "GPU {}", g.index);
        }
    }

    #[test]
    fn numa_local_picks_the_emulated_numa_local_nics() {
        let nics = nic_infos(4, Node::A, Topology::A3High);
        let gpus = gpu_places(Topology::A3High);
        for (g, place) in gpus.iter().enumerate() {
            let chans = assign_channels(&NicPolicy::NumaLocal, &nics, place, g, 4).unwrap();
            let got: Vec<&str> = chans.iter().map(|c| c.name.as_str()).collect();
            let want = if g < 4 {
                ["eth1", "eth2", "eth1", "eth2"]
            } else {
                ["eth3", "eth4", "eth3", "eth4"]
            };
            assert_eq!(got, want, "GPU {g}");
            for c in &chans {
                assert_eq!(nics[c.nic].numa, place.numa);
            }
        }
        // Two NICs are A3's eth1 and eth2, both on NUMA 0: GPUs of NUMA 1 have no local NIC.
        let two = nic_infos(2, Node::A, Topology::A3High);
        assert!(assign_channels(&NicPolicy::NumaLocal, &two, &gpus[4], 4, 1).is_err());
    }

    #[test]
    fn closest_pci_pairs_each_gpu_with_its_a3_nic() {
        let nics = nic_infos(4, Node::B, Topology::A3High);
        for (g, place) in gpu_places(Topology::A3High).iter().enumerate() {
            let chans = assign_channels(&NicPolicy::ClosestPci, &nics, place, g, 2).unwrap();
            let want = format!("eth{}", g / 2 + 1);
            assert!(chans.iter().all(|c| c.name == want), "GPU {g}: {chans:?}");
            assert_eq!(chans[0].addr, IpAddr::V4(nic_addr(g as u32 / 2, Node::B)));
        }
    }

    #[test]
    fn flat_placement_treats_every_nic_as_local() {
        let nics = nic_infos(3, Node::A, Topology::Flat);
        let place = &gpu_places(Topology::Flat)[5];
        let chans = assign_channels(&NicPolicy::NumaLocal, &nics, place, 0, 3).unwrap();
        let got: Vec<&str> = chans.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(got, ["eth1", "eth2", "eth3"]);
    }

    #[test]
    fn addresses_pair_up_per_nic() {
        assert_eq!(nic_addr(0, Node::A), Ipv4Addr::new(10, 231, 0, 1));
        assert_eq!(nic_addr(3, Node::B), Ipv4Addr::new(10, 231, 3, 2));
        assert_eq!(nic_name(0), "eth1");
        assert_eq!(
            nic_addr(2, Node::new(3).unwrap()),
            Ipv4Addr::new(10, 231, 2, 4)
        );
    }

    #[test]
    fn nodes_are_letters_a_to_h() {
        let all: Vec<char> = Node::first(20).map(Node::letter).collect();
        assert_eq!(all, ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']);
        assert_eq!(Node::new(2).unwrap().label(), "node C");
        assert_eq!(Node::new(8), None);
        assert_eq!(Node::from_letter("C"), Node::new(2));
        for bad in ["", "i", "ab", "1"] {
            assert_eq!(Node::from_letter(bad), None, "{bad}");
        }
        let j = serde_json::to_string(&Node::new(7).unwrap()).unwrap();
        assert_eq!(j, "\"h\"");
        assert_eq!(
            serde_json::from_str::<Node>(&j).unwrap(),
            Node::new(7).unwrap()
        );
        assert!(serde_json::from_str::<Node>("\"z\"").is_err());
    }
}
