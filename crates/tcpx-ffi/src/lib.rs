//! tcpx-ffi: the NCCL net plugin ABI (v7, v8, v9) and safe wrappers to drive any plugin with it,
//! GPUDirect-TCPX first.
//!
//! - [`abi`]: `repr(C)` function tables, properties, device handle, result codes and the TCPX
//!   receive-side unpack structures, each pinned by layout tests.
//! - [`Plugin::load`]: opens a plugin by path or NCCL-style name, probes `ncclNetPlugin_v9`, `_v8`,
//!   `_v7` newest first, calls `init` once per library with a logger that lands in `tracing`.
//! - [`ListenComm`], [`SendComm`], [`RecvComm`], [`MemoryRegistration`]: own the plugin's comms and
//!   registrations (closed / deregistered on drop) and enforce the plugin's discipline: only the
//!   oldest request of a comm is tested, receives are consumed FIFO, at most 16 requests in flight,
//!   `n == 1`, connect/accept retried until a deadline.
//! - [`nccl`]: libnccl itself (dlopen of `libnccl.so.2`), the in-tool reference transport.
//! - [`unpack`]: the descriptor logic that turns a TCPX scatter list back into contiguous bytes (on
//!   the CPU here; the GPU kernel in `tcpx-gpu` mirrors it).
//!
//! Not for: choosing chunks, channels or NICs (`tcpx-sched`), timing transfers (`tcpx-bench`),
//! allocating GPU memory or launching kernels (`tcpx-gpu`), or the transport trait (`tcpx-transport`,
//! whose `netplugin` backend sits on these wrappers).
//!
//! # How it works
//!
//! `abi`: `repr(C)` NCCL net ABI v7/v8/v9 (tables, properties, device handle, result codes) and the
//! TCPX unpack structs (`LoadMeta`, `NetUnpackMeta`, `UnpackHandle`), pinned by layout tests and by C
//! probe plugins (`csrc/probe_plugin.c`, built by `build.rs`). `Plugin::load(spec)` opens a plugin the
//! NCCL way (`X`, then `libnccl-net-X.so`; none: `libnccl-net.so`), takes the newest of
//! `ncclNetPlugin_v9/_v8/_v7`, calls `init` once per library (kept loaded for the process) with a C
//! logger shim (`csrc/logger_shim.c`, vsnprintf) forwarding to `tracing` target `ncclnet`.
//! `ListenComm`/`SendComm`/`RecvComm` own comms (closed on drop), `MemoryRegistration<M: PluginMemory>`
//! owns the memory (deregistered when the last request or caller reference goes). Each request holds
//! a lease (a `Span`) over its bytes until done. `unpack::apply_load_metas` is the CPU form of the
//! scatter-list copy the GPU kernel mirrors. `nccl`: libnccl loader. `test-plugin/`: a working
//! `ncclNetPlugin_v7` over loopback TCP (host or TCPX-like unpack delivery, fault injection by env).
//! `sockopt`: `SO_ZEROCOPY`, the one socket option the socket backend needs that no safe crate
//! sets.
//!
//! Invariants: the plugin is only asked to test the oldest unfinished request of a comm; at most 16
//! requests per comm; n == 1; receives handed back (`irecvConsumed`) in FIFO order and only after
//! their unpack; at most 4 MiB per receive and 4 KiB-aligned registrations on an UNPACK device;
//! connect/accept retried until a deadline; accept always gets device-handle storage; the GPU context
//! hook (`CurrentContext`) runs before listen/connect/accept/regMr; a comm dropped with requests in
//! flight leaks their memory rather than free what the plugin may still write.

// Every unsafe operation sits in its own `unsafe {}` block with a SAFETY comment, in unsafe fns too.
#[deny(unsafe_op_in_unsafe_fn)]
pub mod abi;
mod error;
#[deny(unsafe_op_in_unsafe_fn)]
mod loader;
#[deny(unsafe_op_in_unsafe_fn)]
mod logger;
#[deny(unsafe_op_in_unsafe_fn)]
pub mod malloc;
#[deny(unsafe_op_in_unsafe_fn)]
mod memory;
pub mod nccl;
#[deny(unsafe_op_in_unsafe_fn)]
mod plugin;
pub mod sockopt;
#[deny(unsafe_op_in_unsafe_fn)]
pub mod unpack;

pub use error::{CallSite, FfiError};
pub use loader::{candidate_names, AbiVersion};
pub use memory::{HostRegion, MemoryKind, PluginMemory};
pub use plugin::{
    ConnectHandle, CurrentContext, DeviceKind, ListenComm, MemoryRegistration, NetProperties,
    NoGpuContext, Plugin, PluginOptions, RecvComm, RecvCompletion, RequestId, SendComm,
    SendCompletion, UnpackHandling, CLOSE_DEADLINE, MAX_IN_FLIGHT,
};
