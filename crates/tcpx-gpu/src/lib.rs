//! tcpx-gpu: memory the transports move bytes from and into, on the host and on NVIDIA GPUs.
//!
//! - [`HostBuffer`]: a page-aligned host allocation whose disjoint byte ranges can be lent to
//!   several worker threads at once through [`Span`]s, with overlap refused at run time.
//! - CUDA through `cudarc` with dynamic loading ([`Device`], [`DeviceBuffer`], [`PinnedBuffer`],
//!   [`Stream`], [`Event`]): nothing links against CUDA, so every binary builds and runs its
//!   non-GPU parts on a machine without a driver, where [`init`] answers
//!   [`GpuError::DriverMissing`] instead of panicking.
//! - The verification pattern ([`pattern_word`], [`fill_pattern`], [`verify_pattern`]) computed
//!   identically on the host and, through NVRTC-compiled kernels, on the GPU
//!   ([`Stream::fill_pattern`], [`Stream::verify_pattern`]).
//! - CUDA IPC between processes of one node ([`DeviceBuffer::ipc_export`], [`PeerMapping`],
//!   [`open_peer_cached`], [`Stream::copy_from_peer`] / [`Stream::copy_to_peer`]).
//! - The node's GPU link view ([`gpu_links`]): peer access and CUDA's P2P attributes per ordered
//!   pair, NVLink and the PCIe path from NVML (loaded at run time, optional), as
//!   `nvidia-smi topo -m` shows them.
//! - [`testing`]: how GPU tests skip visibly where there is no GPU, and fail instead where
//!   `TCPX_REQUIRE_GPU=1` says there must be one.
//!
//! This is the one crate besides `tcpx-ffi` allowed `unsafe` memory handling, so that the
//! transports stay safe Rust. Not for: moving bytes between machines (that is `tcpx-transport`),
//! nor NCCL (its loader is `tcpx_ffi::nccl`).

mod cuda;
mod host;
mod ipc;
mod links;
mod nvrtc;
pub mod pattern;
mod peer_access;
pub mod testing;

pub use cuda::{
    device_count, init, is_device_pointer, pointer_device, Device, DeviceBuffer, Event, GpuError,
    HostCopy, HostPin, PinnedBuffer, Stream, UnpackCopy, UnpackJob, UnpackTable,
    DEFAULT_GPU_DEADLINE,
};
pub use host::{HostBuffer, MemError, Span, PAGE};
pub use ipc::{open_peer_cached, IpcExport, IpcMemHandle, PeerMapping, IPC_HANDLE_BYTES};
pub use links::{gpu_link_summary, gpu_links, GpuLink, GpuLinks, GpuNode, PciePath};
pub use pattern::{fill_pattern, pattern_byte, pattern_word, verify_pattern};
