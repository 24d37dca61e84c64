//! Opening a plugin library the way NCCL does and finding its function table.

use std::ffi::CStr;

use crate::abi::{NcclNetV7, NcclNetV8, NcclNetV9};
use crate::error::FfiError;

/// Which `ncclNet_vN_t` a plugin exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbiVersion {
    V7,
    V8,
    V9,
}

impl AbiVersion {
    pub fn number(self) -> u32 {
        match self {
            AbiVersion::V7 => 7,
            AbiVersion::V8 => 8,
            AbiVersion::V9 => 9,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            AbiVersion::V7 => "ncclNetPlugin_v7",
            AbiVersion::V8 => "ncclNetPlugin_v8",
            AbiVersion::V9 => "ncclNetPlugin_v9",
        }
    }
}

impl std::fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.number())
    }
}

/// The library names NCCL tries, in order: `X` then `libnccl-net-X.so` for `NCCL_NET_PLUGIN=X`
/// (just `X` when it is a path), `libnccl-net.so` when unset.
pub fn candidate_names(spec: Option<&str>) -> Vec<String> {
    match spec {
        None | Some("") => vec!["libnccl-net.so".to_string()],
        Some(x) if x.contains('/') => vec![x.to_string()],
        Some(x) => vec![x.to_string(), format!("libnccl-net-{x}.so")],
    }
}

/// A function table found in a loaded library; the library is never unloaded, so the pointer
/// stays valid for the life of the process.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Table {
    V7(*const NcclNetV7),
    V8(*const NcclNetV8),
    V9(*const NcclNetV9),
}

impl Table {
    pub(crate) fn version(self) -> AbiVersion {
        match self {
            Table::V7(_) => AbiVersion::V7,
            Table::V8(_) => AbiVersion::V8,
            Table::V9(_) => AbiVersion::V9,
        }
    }

    /// The table's `name` field.
    pub(crate) fn name(self) -> Option<String> {
        // SAFETY: the table pointer came from dlsym of a plugin symbol in a library that is never
        // unloaded; `name` is the first field in every version.
        let ptr = unsafe {
            match self {
                Table::V7(t) => (*t).name,
                Table::V8(t) => (*t).name,
                Table::V9(t) => (*t).name,
            }
        };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: a non-NULL `name` is a NUL-terminated string owned by the plugin.
        Some(
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// An opened library with its table; the library handle is leaked on purpose (NCCL never
/// unloads a net plugin either: its threads may still run code from it).
pub(crate) struct Opened {
    pub(crate) opened_as: String,
    pub(crate) table: Table,
}

/// Opens the first candidate that loads and probes it for v9, v8, v7.
pub(crate) fn open(spec: Option<&str>) -> Result<Opened, FfiError> {
    let mut reasons = Vec::new();
    for name in candidate_names(spec) {
        // SAFETY: loading a shared library runs its initialisers; loading a net plugin is the
        // point of this function and the caller asked for this one.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => {
                let table = probe(&lib).ok_or_else(|| FfiError::NoKnownSymbol {
                    library: name.clone(),
                })?;
                std::mem::forget(lib);
                return Ok(Opened {
                    opened_as: name,
                    table,
                });
            }
            Err(e) => {
                // libloading's Display says only "dlopen failed"; the reason is in its source.
                let why = std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string());
                reasons.push(if why.starts_with(&name) {
                    why
                } else {
                    format!("{name}: {why}")
                });
            }
        }
    }
    Err(FfiError::Open {
        spec: spec.unwrap_or("(NCCL_NET_PLUGIN unset)").to_string(),
        reasons: reasons.join("; "),
    })
}

fn probe(lib: &libloading::Library) -> Option<Table> {
    // SAFETY: the symbols are data symbols holding the table; we only take their address here.
    unsafe {
        if let Ok(sym) = lib.get::<*const NcclNetV9>(b"ncclNetPlugin_v9\0") {
            return Some(Table::V9(*sym));
        }
        if let Ok(sym) = lib.get::<*const NcclNetV8>(b"ncclNetPlugin_v8\0") {
            return Some(Table::V8(*sym));
        }
        if let Ok(sym) = lib.get::<*const NcclNetV7>(b"ncclNetPlugin_v7\0") {
            return Some(Table::V7(*sym));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_nccl_rules() {
        assert_eq!(candidate_names(None), ["libnccl-net.so"]);
        assert_eq!(
            candidate_names(Some("gpudirecttcpx")),
            ["gpudirecttcpx", "libnccl-net-gpudirecttcpx.so"]
        );
        assert_eq!(
            candidate_names(Some("/opt/x/libnccl-net.so")),
            ["/opt/x/libnccl-net.so"]
        );
    }

    #[test]
    fn missing_library_names_every_candidate() {
        let err = open(Some("no-such-plugin-xyz")).err().expect("must fail");
        let s = err.to_string();
        assert!(s.contains("no-such-plugin-xyz:"), "{s}");
        assert!(s.contains("libnccl-net-no-such-plugin-xyz.so"), "{s}");
        assert!(s.contains("LD_LIBRARY_PATH"), "{s}");
    }
}

/// The probe plugins built by `build.rs` from `csrc/probe_plugin.c`: a C compiler lays out the
/// tables and properties, so these tests also cross-check the `repr(C)` mirrors.
#[cfg(test)]
mod probe_tests {
    use crate::{AbiVersion, DeviceKind, FfiError, NoGpuContext, Plugin};
    use std::sync::Arc;

    fn probe(version: u32) -> Plugin {
        let path = format!("{}/libprobe_v{version}.so", env!("TCPX_FFI_PROBE_PLUGINS"));
        Plugin::load(Some(&path)).expect("probe plugin loads")
    }

    #[test]
    fn newest_table_wins_and_is_reported() {
        let p = probe(9);
        assert_eq!((p.version(), p.name()), (AbiVersion::V9, "probe_v9"));
        let p = probe(8);
        assert_eq!((p.version(), p.name()), (AbiVersion::V8, "probe_v8"));
        let p = probe(7);
        assert_eq!((p.version(), p.name()), (AbiVersion::V7, "probe_v7"));
        assert_eq!(p.device_count().unwrap(), 2);
    }

    #[test]
    fn properties_of_every_version_read_back_field_by_field() {
        let p7 = probe(7).properties(1).unwrap();
        assert_eq!(p7.name, "probe7");
        assert_eq!(p7.pci_path, "/sys/probe");
        assert_eq!(p7.guid, 0x1122334455667789);
        assert_eq!(p7.ptr_support, 3);
        assert_eq!((p7.speed_mbps, p7.port, p7.latency_us), (200_000, 7, 1.5));
        assert_eq!((p7.max_comms, p7.max_recvs), (77, 1));
        assert_eq!(p7.device, DeviceKind::Unpack { version: 7 });
        assert!(!p7.reg_is_global);

        let p8 = probe(8).properties(0).unwrap();
        assert_eq!(p8.name, "probe8");
        assert!(p8.reg_is_global);
        assert_eq!((p8.speed_mbps, p8.port, p8.latency_us), (200_000, 8, 2.5));
        assert_eq!((p8.max_comms, p8.max_recvs), (88, 8));
        assert_eq!(p8.device, DeviceKind::Unpack { version: 7 });

        let p9 = probe(9).properties(1).unwrap();
        assert_eq!(p9.name, "probe9");
        assert_eq!(p9.guid, 0x1122334455667789);
        assert!(p9.reg_is_global);
        assert_eq!((p9.speed_mbps, p9.port, p9.latency_us), (400_000, 9, 3.5));
        assert_eq!((p9.max_comms, p9.max_recvs), (99, 9));
        assert_eq!(p9.device, DeviceKind::Host);
    }

    #[test]
    fn a_null_entry_is_named_with_the_table_it_is_missing_from() {
        let err = probe(9).listen(0, 0, Arc::new(NoGpuContext)).unwrap_err();
        assert!(
            matches!(
                err,
                FfiError::MissingFunction {
                    function: "listen",
                    symbol: "ncclNetPlugin_v9",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = probe(8).listen(5, 0, Arc::new(NoGpuContext)).unwrap_err();
        assert!(err.to_string().contains("device 5 does not exist"), "{err}");
    }
}
