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
