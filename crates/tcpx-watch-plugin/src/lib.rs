//! tcpx-watch-plugin: an NCCL net plugin that wraps the real one, so that any job's network
//! traffic can be watched per NIC and per connection without changing the job.
//!
//! NCCL loads it as `NCCL_NET_PLUGIN=tcpxwatch` (the library installed as
//! `libnccl-net-tcpxwatch.so` on the loader's path, or that file's path); it loads the real plugin
//! named by `TCPX_WATCH_INNER` the way NCCL names plugins (a path as is; `X` as `X`, then
//! `libnccl-net-X.so`; unset: `libnccl-net.so`) and passes every call through. The build
//! makes `libtcpx_watch_plugin.so`; copy or link it under the name NCCL looks for.
//!
//! Not for: reading or summarising what it writes (`tcpx-watch`, `tcpx-run watch`), choosing
//! settings (`tcpx-tune`), or driving a plugin from Rust (`tcpx-ffi`).
//!
//! # How it works
//!
//! - Loading: the real plugin is opened when the shim itself is loaded (a constructor), so the
//!   shim's tables carry the real plugin's `name` before NCCL reads it (NCCL selects a network by
//!   that name with `NCCL_NET`); if that fails, `init` tries again and, failing, logs the path
//!   and the loader's words through NCCL's logger and answers `ncclSystemError`, the class of
//!   failure NCCL itself reports for a plugin it cannot use.
//! - Versions: `ncclNetPlugin_v9`, `_v8` and `_v7` are exported whatever the real plugin has,
//!   because NCCL picks a version by `dlsym` before any shim code runs; a caller on another
//!   version than the real plugin's newest is served as NCCL's own compatibility layer serves
//!   that plugin (`inner`). Entries the real plugin has as NULL are cleared in the shim's tables
//!   during `init` (NCCL reads the entries after `init`), so NCCL decides as without the shim.
//! - Pass-through: without `TCPX_WATCH_DIR` the shim hands NCCL the real plugin's own comms and
//!   requests. With it, NCCL holds a small wrapper per comm (the real comm, the comm's counters)
//!   and, per request, the address of a slot in a fixed arena (`recorder`): `test` finds the
//!   slot's comm and post time from the pointer, with atomics only and no allocation. Every
//!   argument and result reaches the real plugin and NCCL unchanged.
//! - What is recorded per comm: direction, device and NIC (the real plugin's properties, asked
//!   once at init), a link id both ends compute alike (a hash of the connect handle: the listener
//!   over the handle `listen` filled, the connector over the handle its first `connect` got),
//!   completed bytes and requests (`test`'s done and sizes; where the plugin writes no size, as
//!   GPUDirect-TCPX never does, the posted size, counted in `posted_sized`: exact for a send, an
//!   upper bound for a receive, since NCCL posts a whole step; a link's send end is then the exact
//!   figure for both), post-to-completion latency as a log2
//!   histogram, listen/connect/accept time (from a connect's or accept's first "not yet" to its
//!   comm) and every error code per call.
//! - Output (`output`): a writer thread writes JSON lines every `TCPX_WATCH_INTERVAL_MS` to
//!   `TCPX_WATCH_DIR/watch-<host>-<pid>.jsonl` (the contract in `tcpx_watch::record`), rotated
//!   within `TCPX_WATCH_MAX_MB`, and `TCPX_WATCH_PROM`'s textfile; the last interval and an `end`
//!   line are written at process exit (`atexit`, waiting at most a second for the writer).
//!
//! Invariants: no panic crosses the C boundary (every entry runs under `catch_unwind`); memory
//! is bounded (a comm table, a slot arena and event queues of fixed size; what does not fit is
//! counted in `dropped`); the data path takes no lock and allocates nothing.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_upper_case_globals)]

pub mod config;
mod exports;
mod inner;
pub mod output;
pub mod recorder;
mod state;

pub use exports::{ncclNetPlugin_v7, ncclNetPlugin_v8, ncclNetPlugin_v9};
pub use inner::{MAX_COLLNET_SIZE, MAX_NET_SIZE};
pub use state::flush_now;
