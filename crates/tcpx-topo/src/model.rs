//! The topology data model: plain serde structs, filled by [`crate::sysfs`] and [`crate::hwloc`].

use serde::Serialize;

use crate::cpuset::CpuSet;

/// Where the CPU/NUMA/PCI-tree facts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// hwloc (through `hwlocality`) for CPUs, cores, NUMA nodes and PCI paths; sysfs for NIC
    /// driver/speed/state and GPU identification.
    HwlocAndSysfs,
    /// sysfs only (fixture trees, or when hwloc was not asked for).
    Sysfs,
}

/// One online logical CPU (a hardware thread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// Linux CPU number (OS index).
    pub id: u32,
    /// Index into [`Topology::cores`].
    pub core: usize,
    /// Physical package (socket) id.
    pub package: u32,
    pub numa: Option<u32>,
}

/// One physical core and its hardware threads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Core {
    pub index: usize,
    pub package: u32,
    pub numa: Option<u32>,
    /// All hardware threads; the lowest one is called the core's primary thread.
    pub cpus: CpuSet,
}

impl Core {
    pub fn primary(&self) -> u32 {
        self.cpus.first().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: CpuSet,
}

/// A PCI function and where it sits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciInfo {
    /// `dddd:bb:dd.f`, lower-case, as sysfs and `nvidia-smi` print it.
    pub bus_id: String,
    pub vendor: u16,
    pub device: u16,
    /// 24-bit class code (`0x030200` = 3D controller).
    pub class: u32,
    pub numa: Option<u32>,
    pub local_cpus: CpuSet,
    /// From the host bridge down to the device itself: the host bridge (`pci0000:00`) then every
    /// bridge/port bus id, ending with `bus_id`. Two devices' shared prefix is their closest
    /// shared bridge.
    pub path: Vec<String>,
}

impl PciInfo {
    /// Number of leading path elements two devices share (0: different host bridges).
    pub fn shared_path_len(&self, other: &PciInfo) -> usize {
        self.path
            .iter()
            .zip(&other.path)
            .take_while(|(a, b)| a == b)
            .count()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Position in PCI bus id order: the order of `CUDA_DEVICE_ORDER=PCI_BUS_ID` and nvidia-smi.
    pub index: usize,
    pub pci: PciInfo,
    /// A marketing name where the device id is known to us, else None.
    pub model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nic {
    pub name: String,
    /// Kernel driver (`gve`, `virtio_net`, `mlx5_core`); None for virtual interfaces.
    pub driver: Option<String>,
    /// Link speed in Mbit/s as the driver reports it; None when unknown or the link is down.
    pub speed_mbps: Option<u64>,
    /// `operstate`: up, down, unknown, ...
    pub state: String,
    /// Software interfaces (`lo`, bridges, ifb) under `/sys/devices/virtual`.
    pub is_virtual: bool,
    /// The PCI function behind the interface (for virtio: the virtio device's PCI parent).
    pub pci: Option<PciInfo>,
    /// Carries the IPv4 default route (`/proc/net/route`): the control NIC on a multi-NIC
    /// machine such as A3-high's eth0, which is kept out of GPU pairing when others exist.
    pub default_route: bool,
}

/// Everything `tcpx-topo` knows about a machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub source: Source,
    /// The root the facts were read under (`/` for the running system).
    pub root: String,
    /// Highest possible CPU number + 1 (`/sys/devices/system/cpu/possible`): the width of IRQ masks.
    pub nr_possible_cpus: u32,
    pub cpus: Vec<Cpu>,
    pub cores: Vec<Core>,
    pub numa_nodes: Vec<NumaNode>,
    pub packages: Vec<u32>,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    /// Things that were odd but not fatal (a NIC without PCI parent, hwloc missing a device).
    pub warnings: Vec<String>,
}

impl Topology {
    pub fn online_cpus(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    pub fn nic(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// The NUMA node a PCI device belongs to: its own `numa_node` when known, else the node holding
    /// its local CPUs, else the only node on single-node machines.
    pub fn numa_of(&self, pci: &PciInfo) -> Option<u32> {
        if pci.numa.is_some() {
            return pci.numa;
        }
        if self.numa_nodes.len() == 1 {
            return Some(self.numa_nodes[0].id);
        }
        let candidates: Vec<&NumaNode> = self
            .numa_nodes
            .iter()
            .filter(|n| !pci.local_cpus.is_empty() && pci.local_cpus.is_subset(&n.cpus))
            .collect();
        match candidates.as_slice() {
            [one] => Some(one.id),
            _ => None,
        }
    }

    /// Cores of a NUMA node (all cores when `numa` is None), ordered by primary thread.
    pub fn cores_of(&self, numa: Option<u32>) -> Vec<&Core> {
        let mut cores: Vec<&Core> = self
            .cores
            .iter()
            .filter(|c| numa.is_none() || c.numa == numa)
            .collect();
        cores.sort_by_key(|c| c.primary());
        cores
    }

    /// Primary threads of the node's cores ("physical cores" in the binding table).
    pub fn physical_cpus(&self, numa: Option<u32>) -> CpuSet {
        self.cores_of(numa).iter().map(|c| c.primary()).collect()
    }

    /// The other hardware threads of the node's cores ("hyperthreads").
    pub fn hyperthread_cpus(&self, numa: Option<u32>) -> CpuSet {
        self.cores_of(numa)
            .iter()
            .flat_map(|c| c.cpus.iter().skip(1))
            .collect()
    }
}

/// Names for the GPUs this project meets; anything else shows its PCI device id.
pub fn nvidia_model_name(device: u16) -> Option<&'static str> {
    Some(match device {
        0x2330 => "H100 80GB HBM3",
        0x2331 => "H100 PCIe",
        0x2335 => "H200",
        0x2324 => "H800",
        0x20b0 => "A100 SXM4 40GB",
        0x20b2 => "A100 SXM4 80GB",
        0x20b5 => "A100 PCIe 80GB",
        0x26b9 => "L40S",
        0x27b8 => "L4",
        0x1eb8 => "T4",
        _ => return None,
    })
}
