//! tcpx-ffi: the NCCL net plugin ABI (v7, v8, v9) and loaders for plugins and libnccl.
//!
//! Will hold: `repr(C)` mirrors of the ncclNet function tables and properties, the TCPX unpack
//! structures, a libloading-based plugin loader and safe wrappers that own comms, registrations and
//! requests. Filled by the net plugin issue; nothing here works yet.
//!
//! Not for: scheduling or benchmarking (that is `tcpx-sched` / `tcpx-bench`).

pub mod nccl;
