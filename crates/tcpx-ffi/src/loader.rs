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
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    Err(FfiError::Open {
        spec: spec.unwrap_or("").to_string(),
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
