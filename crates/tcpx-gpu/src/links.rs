//! How the GPUs of this node reach each other: what CUDA says per ordered pair (peer access,
//! `cuDeviceGetP2PAttribute`) and what NVML says about the wiring (NVLink, the PCIe path), the
//! view `nvidia-smi topo -m` prints.
//!
//! CUDA is asked through device handles only, so no context is created (opening a context costs
//! memory and time on every GPU). NVML is loaded with `libloading` from `libnvidia-ml.so.1`; where
//! it is missing or fails, the CUDA half is still reported and [`GpuLinks::nvml`] says why the
//! other half is absent. GPUs are matched between the two by PCI bus id, since CUDA's order
//! (`CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`) need not be NVML's.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUdevice_P2PAttribute, CUresult};

use crate::{device_count, GpuError};

/// One GPU as the link view lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNode {
    /// CUDA ordinal in this process.
    pub index: usize,
    pub name: String,
    /// As CUDA writes it, e.g. `0000:8A:00.0`.
    pub pci_bus_id: String,
    /// NVLinks NVML reports active on this GPU (`None` without NVML or where NVML cannot tell).
    pub active_nvlinks: Option<u32>,
}

/// Where the PCIe path between two GPUs meets (NVML's `nvmlGpuTopologyLevel_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PciePath {
    /// On one board (NVML_TOPOLOGY_INTERNAL).
    Internal,
    /// Through one PCIe switch (SINGLE).
    SingleSwitch,
    /// Through several PCIe switches, no host bridge (MULTIPLE).
    MultipleSwitches,
    /// Through one host bridge (HOSTBRIDGE).
    HostBridge,
    /// Through host bridges of one NUMA node (NODE).
    NumaNode,
    /// Across NUMA nodes, over the CPUs' interconnect (SYSTEM).
    System,
}

impl PciePath {
    /// NVML's numeric level (0, 10, ..., 50); `None` for a value NVML does not define.
    pub fn from_nvml(level: u32) -> Option<PciePath> {
        Some(match level {
            0 => PciePath::Internal,
            10 => PciePath::SingleSwitch,
            20 => PciePath::MultipleSwitches,
            30 => PciePath::HostBridge,
            40 => PciePath::NumaNode,
            50 => PciePath::System,
            _ => return None,
        })
    }

    /// The label `nvidia-smi topo -m` uses.
    pub fn label(self) -> &'static str {
        match self {
            PciePath::Internal => "X",
            PciePath::SingleSwitch => "PIX",
            PciePath::MultipleSwitches => "PXB",
            PciePath::HostBridge => "PHB",
            PciePath::NumaNode => "NODE",
            PciePath::System => "SYS",
        }
    }
}

/// How GPU `from` reaches GPU `to` (ordered: CUDA's attributes may differ per direction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLink {
    pub from: usize,
    pub to: usize,
    /// `cuDeviceCanAccessPeer(from, to)`: `from` may map and copy `to`'s memory directly.
    pub peer_access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (0 is the best link; relative within a node).
    pub perf_rank: Option<i32>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access_supported: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: Option<bool>,
    /// NVML: the pair talks over NVLink (`nvmlDeviceGetP2PStatus` with the NVLink index).
    pub nvlink: Option<bool>,
    /// NVML: where their PCIe paths meet.
    pub pcie: Option<PciePath>,
}

impl GpuLink {
    /// The `nvidia-smi topo -m` cell: `NV<n>` over NVLink (n: the fewer of the two GPUs' active
    /// links, which is what nvidia-smi shows on NVSwitch systems), else the PCIe label, else `?`.
    pub fn label(&self, nodes: &[GpuNode]) -> String {
        if self.nvlink == Some(true) {
            let links = |i: usize| nodes.iter().find(|n| n.index == i)?.active_nvlinks;
            return match (links(self.from), links(self.to)) {
                (Some(a), Some(b)) => format!("NV{}", a.min(b)),
                _ => "NV".into(),
            };
        }
        self.pcie.map_or_else(|| "?".into(), |p| p.label().into())
    }

    /// "NV18, peer access, perf rank 0": for one-line reports.
    pub fn summary(&self, nodes: &[GpuNode]) -> String {
        let mut s = self.label(nodes);
        s.push_str(if self.peer_access {
            ", peer access"
        } else {
            ", no peer access (copies go through host memory)"
        });
        if let Some(r) = self.perf_rank {
            s.push_str(&format!(", perf rank {r}"));
        }
        s
    }
}

/// The link view of this node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLinks {
    pub gpus: Vec<GpuNode>,
    /// Every ordered pair of distinct GPUs.
    pub links: Vec<GpuLink>,
    /// `Ok(())` when NVML answered, else why the NVLink/PCIe columns are empty.
    pub nvml: Result<(), String>,
}

impl GpuLinks {
    pub fn link(&self, from: usize, to: usize) -> Option<&GpuLink> {
        self.links.iter().find(|l| l.from == from && l.to == to)
    }
}

fn cu_err(call: &'static str, device: usize, r: CUresult) -> GpuError {
    GpuError::driver(call, device, cu::DriverError(r))
}

/// The CUDA handle, name and bus id of GPU `index`, without creating a context.
fn describe_device(index: usize) -> Result<(sys::CUdevice, String, String), GpuError> {
    let dev =
        cu::device::get(index as i32).map_err(|e| GpuError::driver("cuDeviceGet", index, e))?;
    let mut name = [0 as c_char; 128];
    // SAFETY: the buffer holds 128 bytes and its length is passed; the driver NUL-terminates.
    let r = unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev) };
    let name = if r == CUresult::CUDA_SUCCESS {
        // SAFETY: NUL-terminated inside the buffer (successful call above).
        unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "unknown GPU".into()
    };
    let mut bus = [0 as c_char; 32];
    // SAFETY: as above, 32 bytes.
    let r = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, dev) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(cu_err("cuDeviceGetPCIBusId", index, r));
    }
    // SAFETY: NUL-terminated by the driver within the buffer.
    let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok((dev, name, bus))
}

fn p2p_attribute(
    attr: CUdevice_P2PAttribute,
    from: sys::CUdevice,
    to: sys::CUdevice,
) -> Option<i32> {
    let mut v: c_int = 0;
    // SAFETY: two valid device handles and an out pointer to one int.
    let r = unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, from, to) };
    (r == CUresult::CUDA_SUCCESS).then_some(v)
}

/// Asks CUDA and NVML how every ordered pair of this node's GPUs is linked. An error only when
/// CUDA itself is absent or broken ([`GpuError::DriverMissing`], [`GpuError::NoDevice`]); a
/// node with one GPU has no links.
pub fn gpu_links() -> Result<GpuLinks, GpuError> {
    let count = device_count()?;
    if count == 0 {
        return Err(GpuError::NoDevice {
            detail: "cuDeviceGetCount returned 0".into(),
        });
    }
    let described = (0..count)
        .map(describe_device)
        .collect::<Result<Vec<_>, _>>()?;
    let nvml = nvml();
    let handles: Vec<Option<NvmlDevice>> = described
        .iter()
        .map(|(_, _, bus)| nvml.as_ref().ok().and_then(|n| n.by_bus_id(bus)))
        .collect();
    let gpus: Vec<GpuNode> = described
        .iter()
        .enumerate()
        .map(|(i, (_, name, bus))| GpuNode {
            index: i,
            name: name.clone(),
            pci_bus_id: bus.clone(),
            active_nvlinks: match (nvml, handles[i]) {
                (Ok(n), Some(h)) => n.active_nvlinks(h),
                _ => None,
            },
        })
        .collect();
    let mut links = Vec::new();
    for a in 0..count {
        for b in 0..count {
            if a != b {
                links.push(pair_link(
                    (a, described[a].0, handles[a]),
                    (b, described[b].0, handles[b]),
                    nvml,
                )?);
            }
        }
    }
    let missing: Vec<String> = gpus
        .iter()
        .zip(&handles)
        .filter(|(_, h)| h.is_none())
        .map(|(g, _)| format!("GPU {} ({})", g.index, g.pci_bus_id))
        .collect();
    let nvml_state = match nvml {
        Err(e) => Err(e.clone()),
        Ok(_) if !missing.is_empty() => Err(format!(
            "NVML does not know {} by PCI bus id",
            missing.join(", ")
        )),
        Ok(_) => Ok(()),
    };
    Ok(GpuLinks {
        gpus,
        links,
        nvml: nvml_state,
    })
}

fn pair_link(
    from: (usize, sys::CUdevice, Option<NvmlDevice>),
    to: (usize, sys::CUdevice, Option<NvmlDevice>),
    nvml: &Result<Nvml, String>,
) -> Result<GpuLink, GpuError> {
    let (a, da, ha) = from;
    let (b, db, hb) = to;
    let mut can: c_int = 0;
    // SAFETY: two valid device handles, one int out pointer.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(cu_err("cuDeviceCanAccessPeer", a, r));
    }
    let (nvlink, pcie) = match (nvml, ha, hb) {
        (Ok(n), Some(ha), Some(hb)) => (n.nvlink_between(ha, hb), n.common_ancestor(ha, hb)),
        _ => (None, None),
    };
    Ok(GpuLink {
        from: a,
        to: b,
        peer_access: can != 0,
        perf_rank: p2p_attribute(
            CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
            da,
            db,
        ),
        access_supported: p2p_attribute(
            CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
            da,
            db,
        )
        .map(|v| v != 0),
        native_atomics: p2p_attribute(
            CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
            da,
            db,
        )
        .map(|v| v != 0),
        nvlink,
        pcie,
    })
}

/// "NV18, peer access, perf rank 0" for the pair `from -> to` (CUDA ordinals of this process),
/// or why it cannot be said; never fails (for log lines). Asks only about the two GPUs, once per
/// pair and process.
pub fn gpu_link_summary(from: usize, to: usize) -> String {
    if from == to {
        return "same GPU".into();
    }
    static SEEN: std::sync::Mutex<Vec<((usize, usize), String)>> =
        std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, s)) = seen.iter().find(|(k, _)| *k == (from, to)) {
        return s.clone();
    }
    let summary = (|| -> Result<String, GpuError> {
        let count = device_count()?;
        if from >= count || to >= count {
            return Ok(format!("GPU {from} or {to} is not one of the {count} here"));
        }
        let (da, na, bus_a) = describe_device(from)?;
        let (db, nb, bus_b) = describe_device(to)?;
        let nvml = nvml();
        let handle = |bus: &str| nvml.as_ref().ok().and_then(|n| n.by_bus_id(bus));
        let (ha, hb) = (handle(&bus_a), handle(&bus_b));
        let nodes = [
            GpuNode {
                index: from,
                name: na,
                pci_bus_id: bus_a,
                active_nvlinks: nvml
                    .as_ref()
                    .ok()
                    .zip(ha)
                    .and_then(|(n, h)| n.active_nvlinks(h)),
            },
            GpuNode {
                index: to,
                name: nb,
                pci_bus_id: bus_b,
                active_nvlinks: nvml
                    .as_ref()
                    .ok()
                    .zip(hb)
                    .and_then(|(n, h)| n.active_nvlinks(h)),
            },
        ];
        let link = pair_link((from, da, ha), (to, db, hb), nvml)?;
        Ok(link.summary(&nodes))
    })()
    .unwrap_or_else(|e| format!("link unknown: {e}"));
    seen.push(((from, to), summary.clone()));
    summary
}

// ---- NVML, loaded at run time ----

/// `nvmlDevice_t`: an opaque pointer NVML hands out and keeps valid while it is initialised.
#[derive(Clone, Copy)]
struct NvmlDevice(*mut c_void);

type NvmlReturn = c_int;
const NVML_SUCCESS: NvmlReturn = 0;
/// `nvmlGpuP2PCapsIndex_t`: NVML_P2P_CAPS_INDEX_NVLINK.
const NVML_P2P_CAPS_INDEX_NVLINK: c_uint = 2;
/// `nvmlGpuP2PStatus_t`: NVML_P2P_STATUS_OK.
const NVML_P2P_STATUS_OK: c_uint = 0;
/// NVML_NVLINK_MAX_LINKS of current nvml.h (18 on Hopper; older GPUs answer fewer).
const NVML_NVLINK_MAX_LINKS: c_uint = 18;
/// `nvmlEnableState_t`: NVML_FEATURE_ENABLED.
const NVML_FEATURE_ENABLED: c_uint = 1;

struct Nvml {
    /// Keeps the library mapped while the function pointers below are used.
    _lib: libloading::Library,
    by_bus_id: unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> NvmlReturn,
    p2p_status: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint, *mut c_uint) -> NvmlReturn,
    common_ancestor: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_uint) -> NvmlReturn,
    nvlink_state: unsafe extern "C" fn(*mut c_void, c_uint, *mut c_uint) -> NvmlReturn,
}

fn nvml() -> &'static Result<Nvml, String> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(load_nvml)
}

fn load_nvml() -> Result<Nvml, String> {
    // SAFETY: libnvidia-ml's initialisers are written to run in any process that loads it.
    let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.map_err(|e| {
        format!("NVML (libnvidia-ml.so.1) could not be loaded ({e}): NVLink and PCIe columns need the NVIDIA driver's NVML")
    })?;
    // SAFETY (each symbol): the types are the nvml.h prototypes of these functions:
    // nvmlInit_v2(void), nvmlDeviceGetHandleByPciBusId_v2(const char*, nvmlDevice_t*),
    // nvmlDeviceGetP2PStatus(dev, dev, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t*),
    // nvmlDeviceGetTopologyCommonAncestor(dev, dev, nvmlGpuTopologyLevel_t*),
    // nvmlDeviceGetNvLinkState(dev, unsigned int, nvmlEnableState_t*); the enums are C ints.
    let sym = |name: &str| format!("NVML lacks {name}: the driver's NVML is too old");
    let init: unsafe extern "C" fn() -> NvmlReturn =
        *unsafe { lib.get(b"nvmlInit_v2\0") }.map_err(|_| sym("nvmlInit_v2"))?;
    let by_bus_id = *unsafe { lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0") }
        .map_err(|_| sym("nvmlDeviceGetHandleByPciBusId_v2"))?;
    let p2p_status = *unsafe { lib.get(b"nvmlDeviceGetP2PStatus\0") }
        .map_err(|_| sym("nvmlDeviceGetP2PStatus"))?;
    let common_ancestor = *unsafe { lib.get(b"nvmlDeviceGetTopologyCommonAncestor\0") }
        .map_err(|_| sym("nvmlDeviceGetTopologyCommonAncestor"))?;
    let nvlink_state = *unsafe { lib.get(b"nvmlDeviceGetNvLinkState\0") }
        .map_err(|_| sym("nvmlDeviceGetNvLinkState"))?;
    // SAFETY: nvmlInit_v2 takes no arguments; calling it more than once is allowed (counted).
    let r = unsafe { init() };
    if r != NVML_SUCCESS {
        return Err(format!(
            "nvmlInit_v2 failed with nvmlReturn_t {r}: is the NVIDIA kernel driver loaded (`nvidia-smi`)?"
        ));
    }
    Ok(Nvml {
        _lib: lib,
        by_bus_id,
        p2p_status,
        common_ancestor,
        nvlink_state,
    })
}

// SAFETY: the function pointers are plain code addresses and NVML's API is thread-safe; the
// library handle is only kept, never used after loading.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    fn by_bus_id(&self, bus: &str) -> Option<NvmlDevice> {
        let c = CString::new(bus).ok()?;
        let mut dev: *mut c_void = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and an out pointer, both live for the call.
        let r = unsafe { (self.by_bus_id)(c.as_ptr(), &mut dev) };
        (r == NVML_SUCCESS && !dev.is_null()).then_some(NvmlDevice(dev))
    }

    fn nvlink_between(&self, a: NvmlDevice, b: NvmlDevice) -> Option<bool> {
        let mut status: c_uint = u32::MAX;
        // SAFETY: handles from nvmlDeviceGetHandleByPciBusId_v2 (valid while NVML is
        // initialised, which it stays for the process), one out pointer.
        let r = unsafe { (self.p2p_status)(a.0, b.0, NVML_P2P_CAPS_INDEX_NVLINK, &mut status) };
        (r == NVML_SUCCESS).then_some(status == NVML_P2P_STATUS_OK)
    }

    fn common_ancestor(&self, a: NvmlDevice, b: NvmlDevice) -> Option<PciePath> {
        let mut level: c_uint = u32::MAX;
        // SAFETY: as above.
        let r = unsafe { (self.common_ancestor)(a.0, b.0, &mut level) };
        if r == NVML_SUCCESS {
            PciePath::from_nvml(level)
        } else {
            None
        }
    }

    fn active_nvlinks(&self, d: NvmlDevice) -> Option<u32> {
        let mut active = 0;
        let mut answered = false;
        for link in 0..NVML_NVLINK_MAX_LINKS {
            let mut state: c_uint = 0;
            // SAFETY: as above; links past the GPU's own count are refused with an error code.
            let r = unsafe { (self.nvlink_state)(d.0, link, &mut state) };
            if r == NVML_SUCCESS {
                answered = true;
                if state == NVML_FEATURE_ENABLED {
                    active += 1;
                }
            }
        }
        answered.then_some(active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(index: usize, links: Option<u32>) -> GpuNode {
        GpuNode {
            index,
            name: "test GPU".into(),
            pci_bus_id: format!("0000:{:02X}:00.0", 0x10 + index),
            active_nvlinks: links,
        }
    }

    fn link(nvlink: Option<bool>, pcie: Option<PciePath>) -> GpuLink {
        GpuLink {
            from: 0,
            to: 1,
            peer_access: true,
            perf_rank: Some(0),
            access_supported: Some(true),
            native_atomics: Some(true),
            nvlink,
            pcie,
        }
    }

    #[test]
    fn nvml_levels_map_to_nvidia_smi_labels() {
        let labels: Vec<_> = [0, 10, 20, 30, 40, 50]
            .iter()
            .map(|&l| PciePath::from_nvml(l).unwrap().label())
            .collect();
        assert_eq!(labels, ["X", "PIX", "PXB", "PHB", "NODE", "SYS"]);
        assert_eq!(PciePath::from_nvml(15), None);
    }

    #[test]
    fn cells_prefer_nvlink_with_the_fewer_active_links() {
        let nodes = [node(0, Some(18)), node(1, Some(12))];
        let l = link(Some(true), Some(PciePath::System));
        assert_eq!(l.label(&nodes), "NV12");
        assert_eq!(l.summary(&nodes), "NV12, peer access, perf rank 0");
        let unknown = [node(0, None), node(1, Some(18))];
        assert_eq!(l.label(&unknown), "NV");
        assert_eq!(
            link(Some(false), Some(PciePath::NumaNode)).label(&nodes),
            "NODE"
        );
        assert_eq!(link(None, None).label(&nodes), "?");
        let mut slow = link(Some(false), Some(PciePath::System));
        slow.peer_access = false;
        slow.perf_rank = None;
        assert!(slow.summary(&nodes).contains("through host memory"));
    }
}
