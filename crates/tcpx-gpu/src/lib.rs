//! tcpx-gpu: memory the transports move bytes from and into.
//!
//! Today it holds [`HostBuffer`]: a page-aligned host allocation whose disjoint byte ranges can be
//! lent to several worker threads at once through [`Span`]s, with overlap refused at run time. That
//! is the one piece of `unsafe` memory handling the socket backend needs, kept here so that the
//! transports stay safe Rust.
//!
//! Will hold (GPU issue): CUDA through `cudarc` with dynamic loading, devices by index and PCI bus
//! id, 4 KiB-aligned device buffers, pinned host staging buffers, streams, events and NVRTC kernels.
//!
//! Not for: moving bytes between machines (that is `tcpx-transport`).

mod host;

pub use host::{HostBuffer, MemError, Span, PAGE};
