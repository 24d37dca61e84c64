//! Topology facts from hwloc (the `hwlocality` bindings to the system's libhwloc 2.x).
//!
//! hwloc is used for what it is best at: PUs, cores, packages, NUMA nodes, and the PCI tree
//! (bridges and their nesting) with each device's NUMA locality. It reads the live system, or an
//! hwloc XML export of another machine ([`load_xml`]) next to that machine's sysfs tree.

use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes, UpstreamAttributes};
use hwlocality::object::types::{BridgeType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology as HwTopology;

use crate::cpuset::CpuSet;
use crate::model::{NumaNode, PciInfo};
use crate::sysfs::{assemble_layout, CpuLayout, Thread};
use crate::TopoError;

/// Load the running system's topology with every PCI device and bridge kept.
pub fn load_live() -> Result<HwTopology, TopoError> {
    HwTopology::builder()
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| TopoError::Hwloc(format!("setting the I/O type filter: {e}")))?
        .build()
        .map_err(|e| TopoError::Hwloc(format!("building the topology: {e}")))
}

fn to_cpuset(
    bitmap: Option<impl std::ops::Deref<Target = hwlocality::cpu::cpuset::CpuSet>>,
) -> CpuSet {
    bitmap
        .map(|b| b.iter_set().map(|i| usize::from(i) as u32).collect())
        .unwrap_or_default()
}

/// hwloc XML exports larger than this are refused (a 2-socket, 8-GPU machine's is about 200 KiB).
pub const MAX_HWLOC_XML_BYTES: u64 = 64 << 20;

/// Load an hwloc XML export (`lstopo machine.xml`, or a fixture) with every PCI object kept: the
/// same facts as [`load_live`] for a machine that is not this one.
pub fn load_xml(path: &std::path::Path) -> Result<HwTopology, TopoError> {
    // Read here with a bound (hwloc would read an endless file such as /dev/zero forever).
    let xml = crate::read_bounded(path, MAX_HWLOC_XML_BYTES)
        .map_err(|e| TopoError::Hwloc(format!("reading XML {}: {e}", path.display())))?;
    HwTopology::builder()
        .from_xml(&xml)
        .map_err(|e| TopoError::Hwloc(format!("reading XML {}: {e}", path.display())))?
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| TopoError::Hwloc(format!("setting the I/O type filter: {e}")))?
        .build()
        .map_err(|e| {
            TopoError::Hwloc(format!(
                "building the topology from {}: {e}",
                path.display()
            ))
        })
}

/// CPUs, cores, packages and NUMA nodes as hwloc sees them (`nr_possible_cpus` comes from sysfs:
/// hwloc does not keep offline-but-possible CPUs).
pub fn cpu_layout(topo: &HwTopology, nr_possible_cpus: u32) -> CpuLayout {
    let numa_nodes: Vec<NumaNode> = topo
        .objects_with_type(ObjectType::NUMANode)
        .map(|n| NumaNode {
            id: n.os_index().unwrap_or(0) as u32,
            cpus: to_cpuset(n.cpuset()),
        })
        .collect();
    let threads: Vec<Thread> = topo
        .objects_with_type(ObjectType::PU)
        .map(|pu| {
            let core = pu.first_ancestor_with_type(ObjectType::Core).unwrap_or(pu);
            let package = pu
                .first_ancestor_with_type(ObjectType::Package)
                .and_then(|p| p.os_index())
                .unwrap_or(0) as u32;
            Thread {
                cpu: pu.os_index().unwrap_or(0) as u32,
                package,
                core_key: core.global_persistent_index(),
            }
        })
        .collect();
    assemble_layout(threads, numa_nodes, nr_possible_cpus)
}

/// The name of one PCI tree element in the same spelling sysfs uses, so paths from the two sources
/// compare equal: `pci0000:00` for a host bridge, `dddd:bb:dd.f` for bridges and devices.
fn pci_element_name(obj: &TopologyObject) -> Option<String> {
    match obj.attributes()? {
        ObjectAttributes::PCIDevice(pci) => Some(format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            pci.domain(),
            pci.bus_id(),
            pci.bus_device(),
            pci.function()
        )),
        ObjectAttributes::Bridge(bridge) => match bridge.upstream_type() {
            BridgeType::Host => match bridge.downstream_attributes()? {
                DownstreamAttributes::PCI(down) => Some(format!(
                    "pci{:04x}:{:02x}",
                    down.domain(),
                    down.secondary_bus()
                )),
            },
            _ => match bridge.upstream_attributes()? {
                UpstreamAttributes::PCI(pci) => Some(format!(
                    "{:04x}:{:02x}:{:02x}.{:x}",
                    pci.domain(),
                    pci.bus_id(),
                    pci.bus_device(),
                    pci.function()
                )),
            },
        },
        _ => None,
    }
}

/// Replace a sysfs-read device's PCI path, NUMA node and local CPUs with hwloc's view. Returns
/// false (and leaves `pci` as it was) when hwloc does not know the device.
pub fn annotate_pci(topo: &HwTopology, pci: &mut PciInfo) -> bool {
    let Ok(Some(obj)) = topo.pci_device_by_bus_id_string(&pci.bus_id) else {
        return false;
    };
    let mut path: Vec<String> = obj.ancestors().filter_map(pci_element_name).collect();
    path.reverse();
    path.push(pci.bus_id.clone());
    pci.path = path;
    if let Some(parent) = obj.first_non_io_ancestor() {
        let local = to_cpuset(parent.cpuset());
        if !local.is_empty() {
            pci.local_cpus = local;
        }
        if let Some(nodes) = parent.nodeset() {
            let ids: Vec<usize> = nodes.iter_set().map(usize::from).collect();
            if let [one] = ids.as_slice() {
                pci.numa = Some(*one as u32);
            }
        }
    }
    true
}
