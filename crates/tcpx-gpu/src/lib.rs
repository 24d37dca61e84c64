//! tcpx-gpu: memory the transports move bytes from and into, on the host and on NVIDIA GPUs.
//!
//! - [`HostBuffer`]: a page-aligned host allocation whose disjoint byte ranges can be lent to
//!   several worker threads at once through [`Span`]s, with overlap refused at run time;
//!   [`copy_streaming`], a copy into host memory whose stores bypass the cache.
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
//!   `nvidia-smi topo -m` shows them; [`link_view`] formats it as that matrix and as JSON.
//! - [`testing`]: how GPU tests skip visibly where there is no GPU, and fail instead where
//!   `TCPX_REQUIRE_GPU=1` says there must be one.
//!
//! This is the one crate besides `tcpx-ffi` allowed `unsafe` memory handling, so that the
//! transports stay safe Rust. Not for: moving bytes between machines (that is `tcpx-transport`),
//! nor NCCL (its loader is `tcpx_ffi::nccl`).
//!
//! # How it works
//!
//! `HostBuffer` (4 KiB-aligned, zeroed) lends disjoint byte ranges as `Span`s checked at run time.
//! CUDA through cudarc with dynamic loading: `init()` first dlopens `libcuda.so.1` itself, so a
//! machine without a driver gets `GpuError::DriverMissing` (never cudarc's panic); NVRTC is found the
//! same way (loader path, then `$CUDA_HOME/lib64`, `/usr/local/cuda/...`, `TCPX_NVRTC_LIB`).
//! `Device::open(index)` / `Device::by_pci_bus_id` (primary context, made current per call),
//! `Device::alloc` (4 KiB-aligned `DeviceBuffer`, `OutOfDeviceMemory` with free/total),
//! `Device::alloc_pinned` (`cuMemHostAlloc`, portable, not write-combined), `HostPin` (page-locks an
//! existing `HostBuffer`), `Stream` (copies between pinned/`Span`/device memory, `fill_pattern`,
//! `verify_pattern`, `record` -> `Event` for timing and cross-stream waits). Host access to pinned
//! memory and span copies (`HostCopy` owns the `Span` until the DMA finished) wait for the GPU, so
//! no byte is read or reused while a copy still touches it; every wait has a deadline
//! (`DEFAULT_GPU_DEADLINE`). `pattern_word(seed, i)` (splitmix64) defines the verification pattern;
//! `fill_pattern`/`verify_pattern` on the host and the NVRTC kernels (`src/kernels.cu`) on the GPU
//! compute the same bytes at any absolute offset. `testing::gpus_or_skip` prints `SKIP:` past the
//! test harness's capture, or fails when `TCPX_REQUIRE_GPU=1`. Between GPUs: `peer_access`
//! (`can_access_peer`, `enable_peer_access`), `ipc` (`DeviceBuffer::ipc_export`, `PeerMapping` that
//! unmaps on drop, `open_peer_cached`, `Stream::copy_from_peer`/`copy_to_peer`), and `gpu_links()`:
//! every ordered GPU pair's peer access and CUDA perf rank, plus NVLink count and PCIe relation
//! (nvidia-smi's NV#/PIX/PXB/PHB/NODE/SYS) from NVML loaded at run time (absent NVML is reported,
//! not fatal); `tcpx-run topo` prints it as a matrix.
//!
//! GPU paths through the transports: `tcpx_transport::cuda_staging::CudaStaging` wraps a host backend
//! (socket) for `Memory::Cuda` (device -> pinned mirror -> sockets -> pinned mirror -> device, one
//! stream per comm, copies pipelined per request); `tcpx_transport::nccl::NcclTransport` is libnccl's
//! ncclSend/ncclRecv behind the trait (2-rank communicator per comm, unique id as handle).
//! `tcpx-gpu-bench` measures NCCL (direct and through the trait), the socket GPU path, pinned copies
//! and raw TCP; `cargo xtask gpu-test` bundles it with the GPU tests (docs/PERFORMANCE.md has the
//! figures).

mod cuda;
mod error;
mod host;
mod ipc;
pub mod link_view;
mod links;
mod nvrtc;
pub mod pattern;
mod peer_access;
mod stream_copy;
pub mod testing;

pub use cuda::{
    device_count, init, is_device_pointer, pointer_device, Device, DeviceBuffer, Event, HostCopy,
    HostPin, PinnedBuffer, Stream, UnpackCopy, UnpackJob, UnpackTable, DEFAULT_GPU_DEADLINE,
};
pub use error::GpuError;
pub use host::{HostBuffer, MemError, Span, PAGE};
pub use ipc::{open_peer_cached, IpcExport, IpcMemHandle, PeerMapping, IPC_HANDLE_BYTES};
pub use links::{gpu_link_summary, gpu_links, GpuLink, GpuLinks, GpuNode, PciePath};
pub use pattern::{fill_pattern, pattern_byte, pattern_word, verify_pattern};
pub use stream_copy::{copy_streaming, STREAMING_STORES};
