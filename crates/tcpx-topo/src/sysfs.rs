//! Reading the topology from sysfs under a [`SysRoot`]: works on fixture trees and on any Linux,
//! and is the only source of NIC driver/speed/state and of GPU identification (so GPUs are found
//! without hwloc's CUDA/NVML plugins: PCI vendor 0x10de with class 0x0300 or 0x0302).

use std::collections::BTreeMap;
use std::path::Path;

use crate::cpuset::CpuSet;
use crate::model::{nvidia_model_name, Core, Cpu, Gpu, Nic, NumaNode, PciInfo};
use crate::sysroot::SysRoot;
use crate::TopoError;

pub const NVIDIA_VENDOR: u16 = 0x10de;
/// PCI class codes (upper 16 bits of the 24-bit class) of display (VGA) and 3D controllers.
pub const GPU_CLASSES: [u16; 2] = [0x0300, 0x0302];

/// CPUs, cores, NUMA nodes, packages and the possible-CPU count.
pub struct CpuLayout {
    pub cpus: Vec<Cpu>,
    pub cores: Vec<Core>,
    pub numa_nodes: Vec<NumaNode>,
    pub packages: Vec<u32>,
    pub nr_possible_cpus: u32,
}

pub fn read_cpu_layout(root: &SysRoot) -> Result<CpuLayout, TopoError> {
    let online_text = root.read("/sys/devices/system/cpu/online").map_err(|e| {
        TopoError::Missing(format!("{e} (is --root a Linux root with /sys mounted?)"))
    })?;
    let online = CpuSet::parse_list(&online_text)
        .map_err(|e| TopoError::Malformed(format!("/sys/devices/system/cpu/online: {e}")))?;
    if online.is_empty() {
        return Err(TopoError::Malformed(
            "/sys/devices/system/cpu/online lists no CPU".into(),
        ));
    }
    let nr_possible_cpus = root
        .read_opt("/sys/devices/system/cpu/possible")
        .and_then(|s| CpuSet::parse_list(&s).ok())
        .and_then(|s| s.last())
        .map_or(online.last().unwrap_or(0) + 1, |m| m + 1);

    // NUMA nodes; a kernel without NUMA has no node directory: then one node 0 holds everything.
    let mut numa_nodes: Vec<NumaNode> = Vec::new();
    for name in root.list_dir("/sys/devices/system/node") {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let list = root.read(format!("/sys/devices/system/node/{name}/cpulist"))?;
        let cpus = CpuSet::parse_list(&list)
            .map_err(|e| TopoError::Malformed(format!("node{id}/cpulist: {e}")))?;
        numa_nodes.push(NumaNode {
            id,
            cpus: cpus.intersection(&online),
        });
    }
    if numa_nodes.is_empty() {
        numa_nodes.push(NumaNode {
            id: 0,
            cpus: online.clone(),
        });
    }
    // Cores: CPUs sharing (package, core_id) are hardware threads of one core.
    let mut threads = Vec::new();
    for cpu in online.iter() {
        let topo = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let read_num = |attr: &str| -> Result<u32, TopoError> {
            let text = root.read(format!("{topo}/{attr}"))?;
            let v: i64 = text.trim().parse().map_err(|_| {
                TopoError::Malformed(format!("{topo}/{attr}: {:?} is not a number", text.trim()))
            })?;
            Ok(v.max(0) as u32) // -1 means "unknown" on some virtual machines
        };
        let package = read_num("physical_package_id")?;
        let core_id = read_num("core_id")?;
        threads.push(Thread {
            cpu,
            package,
            core_key: (u64::from(package) << 32) | u64::from(core_id),
        });
    }
    Ok(assemble_layout(threads, numa_nodes, nr_possible_cpus))
}

/// One hardware thread as a source reports it; `core_key` is equal for threads of one core.
pub(crate) struct Thread {
    pub cpu: u32,
    pub package: u32,
    pub core_key: u64,
}

/// Build the layout from per-thread facts; cores are numbered in order of their lowest CPU, which
/// makes hwloc- and sysfs-derived layouts directly comparable.
pub(crate) fn assemble_layout(
    threads: Vec<Thread>,
    mut numa_nodes: Vec<NumaNode>,
    nr_possible_cpus: u32,
) -> CpuLayout {
    numa_nodes.sort_by_key(|n| n.id);
    let numa_of_cpu = |cpu: u32| {
        numa_nodes
            .iter()
            .find(|n| n.cpus.contains(cpu))
            .map(|n| n.id)
    };
    let mut by_core: BTreeMap<u64, (u32, CpuSet)> = BTreeMap::new();
    for t in &threads {
        by_core
            .entry(t.core_key)
            .or_insert_with(|| (t.package, CpuSet::new()))
            .1
            .insert(t.cpu);
    }
    let mut core_sets: Vec<(u32, CpuSet)> = by_core.into_values().collect();
    core_sets.sort_by_key(|(_, set)| set.first());
    let cores: Vec<Core> = core_sets
        .into_iter()
        .enumerate()
        .map(|(index, (package, cpus))| Core {
            index,
            package,
            numa: cpus.first().and_then(numa_of_cpu),
            cpus,
        })
        .collect();
    let mut cpus: Vec<Cpu> = threads
        .iter()
        .map(|t| Cpu {
            id: t.cpu,
            core: cores
                .iter()
                .position(|c| c.cpus.contains(t.cpu))
                .unwrap_or(0),
            package: t.package,
            numa: numa_of_cpu(t.cpu),
        })
        .collect();
    cpus.sort_by_key(|c| c.id);
    let mut packages: Vec<u32> = cores.iter().map(|c| c.package).collect();
    packages.sort();
    packages.dedup();
    let nr_possible_cpus = nr_possible_cpus.max(cpus.last().map_or(1, |c| c.id + 1));
    CpuLayout {
        cpus,
        cores,
        numa_nodes,
        packages,
        nr_possible_cpus,
    }
}

/// True for `dddd:bb:dd.f`.
pub fn is_pci_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

fn parse_hex<T: TryFrom<u64>>(text: Option<String>) -> Option<T> {
    let t = text?;
    let v = u64::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok()?;
    T::try_from(v).ok()
}

/// The PCI path (host bridge, bridges, device) from a canonical sysfs device path.
pub fn pci_path_of(device_path: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for comp in device_path.components() {
        let s = comp.as_os_str().to_string_lossy();
        if s.starts_with("pci") && s.len() > 3 && s[3..].contains(':') && !is_pci_bus_id(&s) {
            out.clear(); // host bridge "pci0000:00" starts the path
            out.push(s.to_string());
        } else if is_pci_bus_id(&s) {
            out.push(s.to_string());
        }
    }
    out
}

/// Read one PCI function's facts from `/sys/bus/pci/devices/<bus_id>`.
pub fn read_pci(root: &SysRoot, bus_id: &str) -> Option<PciInfo> {
    let dir = format!("/sys/bus/pci/devices/{bus_id}");
    let canonical = root.canonical(&dir)?;
    let numa = root
        .read_opt(format!("{dir}/numa_node"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|&n| n >= 0)
        .map(|n| n as u32);
    Some(PciInfo {
        bus_id: bus_id.to_ascii_lowercase(),
        vendor: parse_hex(root.read_opt(format!("{dir}/vendor")))?,
        device: parse_hex(root.read_opt(format!("{dir}/device"))).unwrap_or(0),
        class: parse_hex(root.read_opt(format!("{dir}/class"))).unwrap_or(0),
        numa,
        local_cpus: root
            .read_opt(format!("{dir}/local_cpulist"))
            .and_then(|s| CpuSet::parse_list(&s).ok())
            .unwrap_or_default(),
        path: pci_path_of(&canonical),
    })
}

/// NVIDIA display/3D controllers, in bus id order.
pub fn read_gpus(root: &SysRoot) -> Vec<Gpu> {
    let mut gpus: Vec<PciInfo> = root
        .list_dir("/sys/bus/pci/devices")
        .iter()
        .filter_map(|id| read_pci(root, id))
        .filter(|p| p.vendor == NVIDIA_VENDOR && GPU_CLASSES.contains(&((p.class >> 8) as u16)))
        .collect();
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    gpus.into_iter()
        .enumerate()
        .map(|(index, pci)| Gpu {
            index,
            model: nvidia_model_name(pci.device).map(str::to_string),
            pci,
        })
        .collect()
}

/// Interfaces with an IPv4 default route (destination and mask 0) in `/proc/net/route`.
pub fn default_route_interfaces(root: &SysRoot) -> Vec<String> {
    let Ok(text) = root.read("/proc/net/route") else {
        return Vec::new();
    };
    let mut out: Vec<String> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_string())
        })
        .collect();
    out.dedup();
    out
}

/// Network interfaces from `/sys/class/net`, with their PCI function where there is one.
pub fn read_nics(root: &SysRoot, warnings: &mut Vec<String>) -> Vec<Nic> {
    let defaults = default_route_interfaces(root);
    let mut nics = Vec::new();
    for name in root.list_dir("/sys/class/net") {
        let dir = format!("/sys/class/net/{name}");
        let Some(canonical) = root.canonical(&dir) else {
            warnings.push(format!("{dir}: cannot resolve the link"));
            continue;
        };
        let is_virtual = canonical.starts_with("/sys/devices/virtual");
        // The nearest PCI function above the interface (virtio NICs sit under virtioN first).
        let pci = pci_path_of(&canonical)
            .last()
            .and_then(|id| read_pci(root, id));
        if !is_virtual && pci.is_none() {
            warnings.push(format!(
                "{name}: not virtual but no PCI function found above it"
            ));
        }
        let speed_mbps = root
            .read_opt(format!("{dir}/speed"))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|&s| s > 0)
            .map(|s| s as u64);
        nics.push(Nic {
            driver: root.link_name(format!("{dir}/device/driver")),
            speed_mbps,
            state: root
                .read_opt(format!("{dir}/operstate"))
                .unwrap_or_else(|| "unknown".into()),
            is_virtual,
            pci,
            default_route: defaults.contains(&name),
            name,
        });
    }
    nics
}

/// The size of CPU 0's highest-level data or unified cache, from
/// `/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}` under `root`; `None` when none
/// can be read (at most 32 `index*` entries are looked at).
pub fn last_level_cache_bytes(root: &SysRoot) -> Option<usize> {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for name in root
        .list_dir(dir)
        .iter()
        .filter(|n| n.starts_with("index"))
        .take(32)
    {
        let attr = |a: &str| root.read_opt(dir.join(name).join(a));
        if attr("type").as_deref() == Some("Instruction") {
            continue;
        }
        let Some(level) = attr("level").and_then(|l| l.parse::<u32>().ok()) else {
            continue;
        };
        let Some(size) = attr("size").and_then(|s| parse_cache_size(&s)) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, size)| size)
}

/// Whether the CPUs `cpus` all lie in one NUMA node, by `/sys/devices/system/node/node*/cpulist`
/// under `root` (at most 1024 nodes are looked at). A kernel without NUMA has no node directory:
/// one node then holds every CPU. An unreadable node list, or a CPU no node lists, counts as
/// not one node.
pub fn in_one_numa_node(root: &SysRoot, cpus: &CpuSet) -> bool {
    let dir = "/sys/devices/system/node";
    let nodes: Vec<String> = root
        .list_dir(dir)
        .into_iter()
        .filter(|n| {
            n.strip_prefix("node")
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
        .take(1024)
        .collect();
    if nodes.is_empty() {
        return true;
    }
    nodes.iter().any(|name| {
        root.read_opt(format!("{dir}/{name}/cpulist"))
            .and_then(|list| CpuSet::parse_list(&list).ok())
            .is_some_and(|node| cpus.is_subset(&node))
    })
}

/// A sysfs cache size: bytes with an optional `K`, `M` or `G` (powers of 1024), e.g. `32768K`.
fn parse_cache_size(text: &str) -> Option<usize> {
    let (digits, shift) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 10),
        b'M' => (&text[..text.len() - 1], 20),
        b'G' => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture of `/sys` with CPU 0's caches as `(index, level, type, size)`.
    fn cache_tree(caches: &[(u32, &str, &str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (i, level, kind, size) in caches {
            let d = root
                .path()
                .join(format!("sys/devices/system/cpu/cpu0/cache/index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        root
    }

    #[test]
    fn the_last_level_cache_is_the_highest_data_or_unified_level_read() {
        let amd = cache_tree(&[
            (0, "1", "Data", "32K"),
            (1, "1", "Instruction", "32K"),
            (2, "2", "Unified", "512K"),
            (3, "3", "Unified", "32768K"),
        ]);
        assert_eq!(
            last_level_cache_bytes(&SysRoot::new(amd.path())),
            Some(32 << 20)
        );
        // An instruction cache never counts, whatever its level; an unreadable size is skipped.
        let odd = cache_tree(&[
            (0, "1", "Data", "48K"),
            (1, "4", "Instruction", "1G"),
            (2, "2", "Unified", "2M"),
            (3, "3", "Unified", "lots"),
        ]);
        assert_eq!(
            last_level_cache_bytes(&SysRoot::new(odd.path())),
            Some(2 << 20)
        );
        let none = tempfile::tempdir().unwrap();
        assert_eq!(last_level_cache_bytes(&SysRoot::new(none.path())), None);
        assert_eq!(parse_cache_size("105M"), Some(105 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("99999999999999999999K"), None);
    }

    #[test]
    fn cpus_lie_in_one_numa_node_when_one_node_lists_them_all() {
        let two = tempfile::tempdir().unwrap();
        for (node, list) in [("node0", "0-7,16-23"), ("node1", "8-15,24-31")] {
            let d = two.path().join("sys/devices/system/node").join(node);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{list}\n")).unwrap();
        }
        // Not a node: ignored.
        std::fs::create_dir_all(two.path().join("sys/devices/system/node/power")).unwrap();
        let root = SysRoot::new(two.path());
        let set = |l: &str| CpuSet::parse_list(l).unwrap();
        assert!(in_one_numa_node(&root, &set("0-3,20")));
        assert!(in_one_numa_node(&root, &set("8-15")));
        assert!(!in_one_numa_node(&root, &set("0-31")));
        assert!(!in_one_numa_node(&root, &set("7-8")));
        // A CPU no node lists.
        assert!(!in_one_numa_node(&root, &set("40")));
        // No node directory (a kernel without NUMA): one node.
        let flat = tempfile::tempdir().unwrap();
        assert!(in_one_numa_node(&SysRoot::new(flat.path()), &set("0-63")));
        // An unreadable list does not make a node.
        let broken = tempfile::tempdir().unwrap();
        let d = broken.path().join("sys/devices/system/node/node0");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpulist"), "zero\n").unwrap();
        assert!(!in_one_numa_node(&SysRoot::new(broken.path()), &set("0")));
    }

    #[test]
    fn pci_bus_ids_and_paths() {
        assert!(is_pci_bus_id("0000:00:03.0"));
        assert!(!is_pci_bus_id("pci0000:00"));
        assert!(!is_pci_bus_id("0000:00:03"));
        let p = pci_path_of(Path::new(
            "/sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0",
        ));
        assert_eq!(p, vec!["pci0000:00", "0000:00:03.0"]);
        let q = pci_path_of(Path::new(
            "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:02.0/0000:85:00.0",
        ));
        assert_eq!(q.len(), 5);
        assert_eq!(q[0], "pci0000:80");
        assert_eq!(q[4], "0000:85:00.0");
    }
}
