//! CUDA IPC between processes of one node: export a [`DeviceBuffer`]'s allocation as a 64-byte
//! handle, map a peer process's handle into this process ([`PeerMapping`], cached per peer and
//! allocation by [`open_peer_cached`]), and copy between local buffers and mapped peer ranges on a
//! [`Stream`].
//!
//! Legacy IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`) exports whole `cuMemAlloc`
//! allocations, so an export names the allocation and the buffer's offset inside it (a
//! [`DeviceBuffer`] may start a page into its allocation). The driver's rule that the exporter must
//! not free an allocation while another process still has it mapped is the caller's to keep (the
//! `cudap2p` transport holds exported buffers until its peer says it closed them).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys::{self, CUresult};

use crate::{Device, DeviceBuffer, GpuError, Stream};

/// Bytes in a legacy CUDA IPC memory handle (`CUipcMemHandle`, `cudaIpcMemHandle_t`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// The opaque IPC handle of one device allocation, as bytes that may travel to another process.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle(pub [u8; IPC_HANDLE_BYTES]);

impl std::fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Enough of the bytes to tell handles apart in logs.
        write!(f, "IpcMemHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

impl IpcMemHandle {
    fn to_sys(self) -> sys::CUipcMemHandle {
        let mut h = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        for (d, s) in h.reserved.iter_mut().zip(self.0) {
            *d = s as std::ffi::c_char;
        }
        h
    }

    fn from_sys(h: &sys::CUipcMemHandle) -> Self {
        let mut b = [0u8; IPC_HANDLE_BYTES];
        for (d, s) in b.iter_mut().zip(h.reserved) {
            *d = s as u8;
        }
        IpcMemHandle(b)
    }
}

/// What another process needs to reach a [`DeviceBuffer`]: its allocation's handle, where the
/// buffer starts inside that allocation, and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcExport {
    pub handle: IpcMemHandle,
    /// Offset of the buffer's first byte from the start of the allocation.
    pub offset: u64,
    /// The buffer's length in bytes.
    pub len: u64,
    /// The whole allocation's length (what the peer may map), for a peer whose driver cannot
    /// report the mapped range itself.
    pub alloc_len: u64,
}

impl DeviceBuffer {
    /// Exports this buffer's allocation for CUDA IPC (cheap; may be called again). The peer adds
    /// [`IpcExport::offset`] to the address it maps.
    pub fn ipc_export(&self) -> Result<IpcExport, GpuError> {
        let device = self.device();
        device.make_current()?;
        let mut h = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        let base = self.allocation_base();
        // SAFETY: `base` is the start of a live cuMemAlloc allocation owned by this buffer; the
        // driver writes the 64-byte handle into `h`, which lives for the call.
        unsafe { sys::cuIpcGetMemHandle(&mut h, base) }
            .result()
            .map_err(|e| GpuError::ipc("cuIpcGetMemHandle", device.index(), e))?;
        let offset = self.device_ptr() - base;
        let mut range_base: sys::CUdeviceptr = 0;
        let mut range_len: usize = 0;
        // SAFETY: `base` is a live allocation of this context; two valid out pointers.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut range_base, &mut range_len, base) };
        let alloc_len = if r == CUresult::CUDA_SUCCESS && range_base == base {
            range_len as u64
        } else {
            offset + self.len() as u64
        };
        Ok(IpcExport {
            handle: IpcMemHandle::from_sys(&h),
            offset,
            len: self.len() as u64,
            alloc_len,
        })
    }
}

/// A peer process's allocation mapped into this process on one GPU (`cuIpcOpenMemHandle` with
/// lazy peer access). Unmapped (`cuIpcCloseMemHandle`) when dropped, after the GPU is idle.
pub struct PeerMapping {
    device: Device,
    handle: IpcMemHandle,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// The exporting GPU's ordinal as this process numbers GPUs, when the driver says.
    owner: Option<usize>,
}

impl std::fmt::Debug for PeerMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PeerMapping({} bytes of {:?} at {:#x}, opened on GPU {}",
            self.len,
            self.handle,
            self.ptr,
            self.device.index()
        )?;
        match self.owner {
            Some(o) => write!(f, ", memory on GPU {o})"),
            None => write!(f, ")"),
        }
    }
}

impl Device {
    /// Maps a peer process's allocation into this GPU's context. The same handle opened twice in
    /// one context maps once (the driver counts references); prefer [`open_peer_cached`].
    pub fn open_ipc(
        &self,
        handle: &IpcMemHandle,
        alloc_len: usize,
    ) -> Result<PeerMapping, GpuError> {
        self.make_current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; `ptr` is a valid out pointer; the handle is passed by
        // value. A bad handle is reported by the driver, not undefined.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle.to_sys(), flags) }
            .result()
            .map_err(|e| GpuError::ipc("cuIpcOpenMemHandle", self.index(), e))?;
        // The driver's own view of the mapped range wins over the exporter's word; where the
        // driver does not say, the exporter's length (its cuMemGetAddressRange) is used.
        let mut base: sys::CUdeviceptr = 0;
        let mut mapped: usize = 0;
        // SAFETY: `ptr` was just mapped in this context; two valid out pointers.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut mapped, ptr) };
        let len = if r == CUresult::CUDA_SUCCESS && base == ptr && mapped > 0 {
            mapped
        } else {
            alloc_len
        };
        if len == 0 {
            // SAFETY: `ptr` came from the successful open above and is closed once, here.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
            return Err(GpuError::ZeroSize);
        }
        let mut ordinal: i32 = -1;
        // SAFETY: the attribute query reads the driver's tables for `ptr` and writes one int.
        let owner = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        let owner = (owner == CUresult::CUDA_SUCCESS && ordinal >= 0).then_some(ordinal as usize);
        Ok(PeerMapping {
            device: self.clone(),
            handle: *handle,
            ptr,
            len,
            owner,
        })
    }
}

impl PeerMapping {
    /// The GPU whose context the mapping was opened in (the one that runs copies with it).
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn handle(&self) -> &IpcMemHandle {
        &self.handle
    }
    /// Bytes in the peer's allocation.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    /// This process's address of the allocation's first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Ordinal (in this process's numbering) of the GPU that holds the peer's memory, where the
    /// driver reports it (a GPU hidden by `CUDA_VISIBLE_DEVICES` has none).
    pub fn owner_ordinal(&self) -> Option<usize> {
        self.owner
    }

    fn check(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        crate::cuda::device_range(self.ptr, self.len, offset, len)
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // Copies queued with the mapping may still run: wait for the GPU before unmapping, and
        // leave it mapped if the GPU does not answer (unmapping under a running copy faults).
        if self.device.synchronize().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle in this context and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

type CacheKey = (usize, u64, IpcMemHandle);

fn cache() -> &'static Mutex<HashMap<CacheKey, Weak<PeerMapping>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Weak<PeerMapping>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The mapping of `handle` from peer process `peer` (any number that tells the caller's peers
/// apart) on `device` (`alloc_len`: the exporter's [`IpcExport::alloc_len`]), opened on first use and shared while any holder keeps it: comms of one
/// process that reach the same peer allocation map it once. It is unmapped when the last
/// [`Arc`] goes.
pub fn open_peer_cached(
    device: &Device,
    peer: u64,
    handle: &IpcMemHandle,
    alloc_len: usize,
) -> Result<Arc<PeerMapping>, GpuError> {
    let key = (device.index(), peer, *handle);
    let mut c = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = c.get(&key).and_then(Weak::upgrade) {
        return Ok(m);
    }
    c.retain(|_, w| w.strong_count() > 0);
    let m = Arc::new(device.open_ipc(handle, alloc_len)?);
    c.insert(key, Arc::downgrade(&m));
    Ok(m)
}

impl Stream {
    /// Queues a copy of `len` bytes from the peer's `src[src_off..]` into `dst[dst_off..]` (the
    /// receiver pulls). The mapping must have been opened on this stream's GPU.
    pub fn copy_from_peer(
        &self,
        src: &PeerMapping,
        src_off: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        self.copy_with_mapping(
            ("copy_from_peer (mapping)", src, src_off),
            ("copy_from_peer (destination)", dst, dst_off),
            len,
            "cuMemcpyAsync (from mapped peer memory)",
        )
    }

    /// Queues a copy of `len` bytes from `src[src_off..]` into the peer's `dst[dst_off..]` (the
    /// sender pushes). The mapping must have been opened on this stream's GPU.
    pub fn copy_to_peer(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        dst: &PeerMapping,
        dst_off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        self.copy_with_mapping(
            ("copy_to_peer (source)", src, src_off),
            ("copy_to_peer (mapping)", dst, dst_off),
            len,
            "cuMemcpyAsync (to mapped peer memory)",
        )
    }

    /// Queues `len` bytes from `src` to `dst`, each given as (what errors call it, memory,
    /// offset), after checking that both are on this stream's GPU and the ranges in bounds;
    /// `call` names the copy in a driver error.
    fn copy_with_mapping(
        &self,
        (src_what, src, src_off): (&'static str, &dyn CopyEnd, usize),
        (dst_what, dst, dst_off): (&'static str, &dyn CopyEnd, usize),
        len: usize,
        call: &'static str,
    ) -> Result<(), GpuError> {
        self.same_device(src_what, src.device())?;
        self.same_device(dst_what, dst.device())?;
        let s = src.range(src_off, len)?;
        let d = dst.range(dst_off, len)?;
        self.device().make_current()?;
        // SAFETY: both ranges are checked in bounds; the mapping and the buffer are released only
        // after the GPU is idle (their drops synchronize); unified addressing lets the driver
        // route the copy from or to the mapped peer memory.
        unsafe { sys::cuMemcpyAsync(d, s, len, self.cu_stream()) }
            .result()
            .map_err(|e| GpuError::ipc(call, self.device().index(), e))
    }
}

/// One end of a copy with a peer's mapped memory: a local device buffer or the mapping. Its
/// memory is released only after the GPU is idle (its drop synchronizes).
trait CopyEnd {
    fn device(&self) -> &Device;
    /// The device address of `offset..offset + len`, refused when out of bounds.
    fn range(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError>;
}

impl CopyEnd for DeviceBuffer {
    fn device(&self) -> &Device {
        DeviceBuffer::device(self)
    }
    fn range(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        self.check(offset, len)
    }
}

impl CopyEnd for PeerMapping {
    fn device(&self) -> &Device {
        PeerMapping::device(self)
    }
    fn range(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        self.check(offset, len)
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn ipc_handle_matches_the_driver_type() {
        assert_eq!(std::mem::size_of::<sys::CUipcMemHandle>(), IPC_HANDLE_BYTES);
        let mut b = [0u8; IPC_HANDLE_BYTES];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7 + 200) as u8;
        }
        let h = IpcMemHandle(b);
        assert_eq!(IpcMemHandle::from_sys(&h.to_sys()), h);
    }
}
