//! tcpx-topo: where things are on this machine.
//!
//! CPUs, cores, hyperthread siblings, NUMA nodes, GPUs and NICs with their PCI bus ids, PCI paths
//! and NUMA nodes, NIC driver/speed/state; GPU <-> NIC pairing by PCI distance and NCCL-style
//! TX/RX binding strings derived from that ([`plan`] documents both rules). On the running system
//! hwloc (through `hwlocality`) supplies CPUs, cores, NUMA nodes and the PCI tree; sysfs supplies
//! NIC details and finds NVIDIA GPUs by PCI vendor/class, so no CUDA-enabled hwloc is needed.
//! Everything reads under a [`SysRoot`], so fixture trees stand in for `/sys` in tests.
//!
//! Also home of the two text forms every layer above shares: [`CpuSet`] (cpu lists and
//! `smp_affinity` hex masks) and [`BindingSpec`] (`"eth1:8-21,112-125;eth2:..."`), and, as the
//! lowest crate every layer depends on, of bounded file reads of regular files only ([`open_regular`], [`read_bounded`]) and the
//! one-line text forms every layer prints ([`text`]: comments and shell words).
//!
//! [`render`] is the text view `tcpx-run topo` prints (machine, GPUs, binding table, NCCL
//! bindings with the rule as applied per node).
//!
//! Not for: changing anything on the system (that is `tcpx-affinity`), or moving data.
//!
//! # How it works
//!
//! `discover(&SysRoot, Backend)` -> `Topology` (CPUs, cores with their hyperthreads, packages, NUMA
//! nodes, GPUs, NICs with PCI bus id, PCI path, NUMA node, driver, speed, state). On `/` hwloc
//! (`hwlocality`) gives CPUs/cores/NUMA and the PCI tree; sysfs gives NIC details and finds GPUs by PCI
//! vendor 0x10de + class 0x0300/0x0302, so no CUDA-enabled hwloc is needed. A fixture root is read from
//! sysfs alone, or with `Backend::HwlocXml(file)` from an hwloc XML export plus its sysfs tree
//! (`tests/fixtures/a3-high.hwloc.xml`: both readings of A3-high agree exactly). hwloc is the default
//! cargo feature `hwloc` (links libhwloc.so.15); without it, or if hwloc fails under `Backend::Auto`,
//! sysfs answers and a warning says so. `derive(&Topology, &BindingRule)` -> `TopoPlan`: each GPU paired with the NIC sharing
//! the longest PCI path prefix (closest bridge; ties: same NUMA, least loaded, name), the
//! default-route (control) NIC left out when there are others; per NUMA node,
//! skip `reserved_cores` (8) cores, give the next `cores_per_direction` (14) to TX and the next 14 to
//! RX, each with all its hyperthreads; nodes smaller than 8 + 2x14 cores scale both by cores/52.
//! On A3-high this reproduces NCCL's bindings exactly (fixture `tests/fixtures/a3-high`, made by
//! `make_fixtures.py`). `CpuSet` (cpu lists and kernel hex masks of any width) and `BindingSpec`
//! (`eth1:8-21,112-125;...`) live here so every layer shares them.
//!
//! Invariants: nothing here writes; every read goes through `SysRoot`; a fixture root never reaches hwloc.

#![forbid(unsafe_code)]

pub mod binding;
pub mod cpuset;
#[cfg(feature = "hwloc")]
pub mod hwloc;
pub mod model;
pub mod plan;
pub mod render;
pub mod sysfs;
pub mod sysroot;
pub mod text;

pub use binding::{BindingParseError, BindingSpec, NicBinding, MAX_RANGES_PER_NIC};
pub use cpuset::{CpuSet, CpuSetParseError};
pub use model::{Core, Cpu, Gpu, Nic, NumaNode, PciInfo, Source, Topology};
pub use plan::{derive, BindingRule, GpuPairing, NicRow, TopoPlan, REFERENCE_CORES_PER_NODE};
pub use sysroot::{open_regular, read_at_most, read_bounded, read_bounded_bytes, SysRoot};

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("missing: {0}")]
    Missing(String),
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("hwloc: {0} (is libhwloc 2.x installed? `apt-get install libhwloc15`; or use the sysfs backend)")]
    Hwloc(String),
}

/// Which source to use for CPUs, NUMA nodes and PCI paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Backend {
    /// hwloc on the live system, sysfs on a fixture root.
    #[default]
    Auto,
    /// hwloc; only possible for the live system.
    Hwloc,
    /// sysfs only.
    Sysfs,
    /// hwloc from an XML export of the machine whose sysfs tree is the root (`lstopo m.xml` on
    /// that machine): for looking at another machine's topology the way hwloc sees it.
    HwlocXml(std::path::PathBuf),
}

/// Read the topology under `root` (use [`SysRoot::live`] for this machine).
pub fn discover(root: &SysRoot, backend: Backend) -> Result<Topology, TopoError> {
    let hwloc_source = match &backend {
        Backend::Auto if root.is_live() => Some(None),
        Backend::Auto | Backend::Sysfs => None,
        Backend::Hwloc if !root.is_live() => {
            return Err(TopoError::Hwloc(format!(
            "hwloc reads only the running system, not the tree at {} (give an XML export instead)",
            root.root().display()
        )))
        }
        Backend::Hwloc => Some(None),
        Backend::HwlocXml(path) => Some(Some(path.as_path())),
    };
    let mut warnings = Vec::new();
    let sys_layout = sysfs::read_cpu_layout(root)?;
    let mut gpus = sysfs::read_gpus(root);
    let mut nics = sysfs::read_nics(root, &mut warnings);
    let (layout, source) = match hwloc_source {
        None => (sys_layout, Source::Sysfs),
        Some(xml) => {
            let pcis = gpus
                .iter_mut()
                .map(|g| &mut g.pci)
                .chain(nics.iter_mut().filter_map(|n| n.pci.as_mut()));
            match with_hwloc(xml, sys_layout.nr_possible_cpus, pcis, &mut warnings) {
                Ok(layout) => (layout, Source::HwlocAndSysfs),
                // Asked for nothing in particular: the sysfs view is still a true answer.
                Err(e) if backend == Backend::Auto => {
                    warnings.push(format!("{e}; everything was read from sysfs instead"));
                    (sys_layout, Source::Sysfs)
                }
                Err(e) => return Err(e),
            }
        }
    };
    Ok(Topology {
        source,
        root: root.root().display().to_string(),
        nr_possible_cpus: layout.nr_possible_cpus,
        cpus: layout.cpus,
        cores: layout.cores,
        numa_nodes: layout.numa_nodes,
        packages: layout.packages,
        gpus,
        nics,
        warnings,
    })
}

/// CPU layout from hwloc (live or XML), and hwloc's PCI paths/NUMA nodes put on the devices.
#[cfg(feature = "hwloc")]
fn with_hwloc<'a>(
    xml: Option<&std::path::Path>,
    nr_possible_cpus: u32,
    pcis: impl Iterator<Item = &'a mut PciInfo>,
    warnings: &mut Vec<String>,
) -> Result<sysfs::CpuLayout, TopoError> {
    let hw = match xml {
        Some(path) => hwloc::load_xml(path)?,
        None => hwloc::load_live()?,
    };
    let layout = hwloc::cpu_layout(&hw, nr_possible_cpus);
    for pci in pcis {
        if !hwloc::annotate_pci(&hw, pci) {
            warnings.push(format!(
                "hwloc does not know PCI device {}: its PCI path comes from sysfs",
                pci.bus_id
            ));
        }
    }
    Ok(layout)
}

#[cfg(not(feature = "hwloc"))]
fn with_hwloc<'a>(
    _xml: Option<&std::path::Path>,
    _nr_possible_cpus: u32,
    _pcis: impl Iterator<Item = &'a mut PciInfo>,
    _warnings: &mut Vec<String>,
) -> Result<sysfs::CpuLayout, TopoError> {
    Err(TopoError::Hwloc(
        "this build has no hwloc support (the `hwloc` feature is off)".into(),
    ))
}

/// Checks that `parse` refuses each of `bad`, naming the first it takes.
#[cfg(test)]
#[track_caller]
fn assert_rejects<T, E>(parse: impl Fn(&str) -> Result<T, E>, bad: &[&str]) {
    for b in bad {
        assert!(parse(b).is_err(), "{b:?} should be rejected");
    }
}
