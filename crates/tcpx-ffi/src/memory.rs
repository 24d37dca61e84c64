//! Memory a plugin may read from or write into, and how a request gets exclusive use of a range.

use std::sync::Arc;

use tcpx_gpu::{HostBuffer, Span};

/// Where memory lives, as `regMr` needs to be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Host,
    Cuda,
}

impl MemoryKind {
    pub(crate) fn nccl_ptr_type(self) -> std::ffi::c_int {
        match self {
            MemoryKind::Host => crate::abi::NCCL_PTR_HOST,
            MemoryKind::Cuda => crate::abi::NCCL_PTR_CUDA,
        }
    }
}

/// Memory that can be registered with a plugin.
///
/// # Safety
/// `base_ptr()` must stay valid for `len()` bytes for as long as the value lives, and while a
/// [`PluginMemory::Lease`] over `offset..offset + len` lives, nobody else may read or write those
/// bytes: the plugin (and this crate's CPU unpack) writes them through the raw pointer.
pub unsafe trait PluginMemory: Send + Sync + 'static {
    /// Exclusive use of one byte range, held for the life of one request.
    type Lease: Send + 'static;
    fn base_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn kind(&self) -> MemoryKind;
    /// Takes exclusive use of `offset..offset + len` (`len >= 1`), or says why not.
    fn lease(&self, offset: usize, len: usize) -> Result<Self::Lease, String>;
}

// SAFETY: the allocation lives as long as the Arc; `HostBuffer::span` refuses overlapping ranges,
// so a held `Span` is the only access to its bytes, and `as_ptr` comes from the allocation itself.
unsafe impl PluginMemory for Arc<HostBuffer> {
    type Lease = Span;
    fn base_ptr(&self) -> *mut u8 {
        self.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        HostBuffer::len(self)
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn lease(&self, offset: usize, len: usize) -> Result<Span, String> {
        self.span(offset, len).map_err(|e| e.to_string())
    }
}

/// A byte range of a [`HostBuffer`], registered on its own (one region per channel, say).
#[derive(Debug, Clone)]
pub struct HostRegion {
    buf: Arc<HostBuffer>,
    offset: usize,
    len: usize,
}

impl HostRegion {
    /// `offset..offset + len` of `buf`; `None` when that is empty or outside the buffer.
    pub fn new(buf: Arc<HostBuffer>, offset: usize, len: usize) -> Option<Self> {
        let end = offset.checked_add(len)?;
        (len > 0 && end <= buf.len()).then_some(HostRegion { buf, offset, len })
    }

    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buf
    }

    pub fn offset(&self) -> usize {
        self.offset
    }
}

// SAFETY: as for `Arc<HostBuffer>`: the region lies inside the allocation (checked in `new`) and
// its leases are spans of the underlying buffer, so the same overlap rule holds.
unsafe impl PluginMemory for HostRegion {
    type Lease = Span;
    fn base_ptr(&self) -> *mut u8 {
        self.buf.as_ptr().cast_mut().wrapping_add(self.offset)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn lease(&self, offset: usize, len: usize) -> Result<Span, String> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(format!(
                "{offset}+{len} is outside the {}-byte region",
                self.len
            ));
        }
        self.buf
            .span(self.offset + offset, len)
            .map_err(|e| e.to_string())
    }
}

// SAFETY: the device allocation lives as long as the Arc and `device_ptr` is its start. Rust never
// dereferences device memory, so there is no Rust reference a plugin write could alias; keeping
// concurrent requests off the same bytes is the caller's scheduling (the lease is empty).
unsafe impl PluginMemory for Arc<tcpx_gpu::DeviceBuffer> {
    type Lease = ();
    fn base_ptr(&self) -> *mut u8 {
        self.device_ptr() as usize as *mut u8
    }
    fn len(&self) -> usize {
        tcpx_gpu::DeviceBuffer::len(self)
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Cuda
    }
    fn lease(&self, offset: usize, len: usize) -> Result<(), String> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(format!(
                "{offset}+{len} is outside the {}-byte device buffer",
                self.len()
            ));
        }
        Ok(())
    }
}
