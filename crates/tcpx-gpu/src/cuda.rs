//! CUDA through `cudarc` with dynamic loading: devices, device and pinned host buffers, streams,
//! timing events and the NVRTC pattern kernels.
//!
//! Nothing here links against CUDA. The driver library is probed with `libloading` before cudarc
//! is touched (cudarc panics when it cannot find a library), so a machine without a GPU gets
//! [`GpuError::DriverMissing`] and every binary still runs its non-GPU parts.

use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tcpx_model::Backoff;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys::{self, CUdevice_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::{GpuError, HostBuffer, Span, PAGE};

/// How long [`Stream::synchronize`], [`Event::wait`] and buffer drops wait for the GPU before
/// giving up with [`GpuError::Timeout`]. Long enough for a 1 GiB copy through a slow link many
/// times over; a hung kernel or copy is reported instead of hanging the tool.
pub const DEFAULT_GPU_DEADLINE: Duration = Duration::from_secs(120);

/// The device address of `offset..offset + len` in the `size` bytes at `ptr`, or
/// [`GpuError::OutOfBounds`] for a range that is empty or does not fit.
pub(crate) fn device_range(
    ptr: sys::CUdeviceptr,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<sys::CUdeviceptr, GpuError> {
    match offset.checked_add(len) {
        Some(end) if end <= size && len > 0 => Ok(ptr + offset as u64),
        _ => Err(GpuError::OutOfBounds { offset, len, size }),
    }
}

static DRIVER: OnceLock<Result<(), GpuError>> = OnceLock::new();

/// Loads the driver library and initialises CUDA, once per process. Every other call in this
/// module goes through it, so calling it first is only needed to ask "is there CUDA here?".
pub fn init() -> Result<(), GpuError> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: loading libcuda runs its initialisers, which are written to be loaded into
            // any process; the handle is dropped right away (cudarc keeps its own).
            let probe = unsafe { libloading::Library::new("libcuda.so.1") };
            if let Err(e) = probe {
                // cudarc also tries other names (libcuda.so); accept those before giving up.
                // SAFETY: as above, only dlopen of the candidate names.
                if !unsafe { sys::is_culib_present() } {
                    let mut reason = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        reason = format!("{reason}: {s}");
                        src = s.source();
                    }
                    return Err(GpuError::DriverMissing { reason });
                }
            }
            match cu::init() {
                Ok(()) => Ok(()),
                Err(e) if e.0 == CUresult::CUDA_ERROR_NO_DEVICE => Err(GpuError::NoDevice {
                    detail: "cuInit: CUDA_ERROR_NO_DEVICE".into(),
                }),
                Err(e) => Err(GpuError::driver("cuInit", 0, e)),
            }
        })
        .clone()
}

/// Number of GPUs the driver sees (0 is an answer, not an error, once the driver is present).
pub fn device_count() -> Result<usize, GpuError> {
    init()?;
    match cu::device::get_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(e) if e.0 == CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(GpuError::driver("cuDeviceGetCount", 0, e)),
    }
}

struct Kernels {
    fill: CudaFunction,
    verify: CudaFunction,
    count: CudaFunction,
    unpack: CudaFunction,
    unpack_warp: CudaFunction,
}

/// The two kernels that check pattern bytes on the GPU and answer in one 8-byte word.
#[derive(Debug, Clone, Copy)]
enum PatternCheck {
    /// `tcpx_verify_pattern`: the index of the first bad byte (the word starts at `u64::MAX`).
    FirstBad,
    /// `tcpx_count_pattern_errors`: the number of bad bytes (the word starts at 0).
    Count,
}

impl PatternCheck {
    /// The stream operation, as errors name it.
    fn operation(self) -> &'static str {
        match self {
            PatternCheck::FirstBad => "verify_pattern",
            PatternCheck::Count => "count_pattern_errors",
        }
    }

    /// The byte the answer word is filled with before the kernel runs.
    fn initial(self) -> u8 {
        match self {
            PatternCheck::FirstBad => 0xff,
            PatternCheck::Count => 0,
        }
    }

    fn kernel(self, k: &Kernels) -> &CudaFunction {
        match self {
            PatternCheck::FirstBad => &k.verify,
            PatternCheck::Count => &k.count,
        }
    }

    /// The driver call, as errors name it.
    fn launch_call(self) -> &'static str {
        match self {
            PatternCheck::FirstBad => "cuLaunchKernel(tcpx_verify_pattern)",
            PatternCheck::Count => "cuLaunchKernel(tcpx_count_pattern_errors)",
        }
    }
}

struct DeviceInner {
    ctx: Arc<CudaContext>,
    index: usize,
    name: String,
    pci_bus_id: String,
    sm_count: u32,
    compute_capability: (i32, i32),
    kernels: OnceLock<Result<Arc<Kernels>, GpuError>>,
}

/// One GPU, by index or PCI bus id: its primary context, made current on whichever thread uses it.
/// Cheap to clone.
#[derive(Clone)]
pub struct Device(Arc<DeviceInner>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} ({}, {})",
            self.0.index, self.0.name, self.0.pci_bus_id
        )
    }
}

impl Device {
    /// Opens GPU `index` (0-based, in CUDA's order, which `CUDA_VISIBLE_DEVICES` may remap).
    pub fn open(index: usize) -> Result<Device, GpuError> {
        let count = device_count()?;
        if count == 0 {
            return Err(GpuError::NoDevice {
                detail: "cuDeviceGetCount returned 0".into(),
            });
        }
        if index >= count {
            return Err(GpuError::IndexOutOfRange { index, count });
        }
        let ctx = CudaContext::new(index)
            .map_err(|e| GpuError::driver("cuDevicePrimaryCtxRetain", index, e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let compute_capability = ctx
            .compute_capability()
            .map_err(|e| GpuError::driver("cuDeviceGetAttribute(compute capability)", index, e))?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| GpuError::driver("cuDeviceGetAttribute(SM count)", index, e))?;
        let mut bus = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer is 32 bytes and we pass its length; the driver writes a
        // NUL-terminated string of at most that many bytes.
        unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, ctx.cu_device()) }
            .result()
            .map_err(|e| GpuError::driver("cuDeviceGetPCIBusId", index, e))?;
        // SAFETY: NUL-terminated by the driver within the buffer (checked call above).
        let pci_bus_id = unsafe { CStr::from_ptr(bus.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(Device(Arc::new(DeviceInner {
            ctx,
            index,
            name,
            pci_bus_id,
            sm_count: sm_count.max(1) as u32,
            compute_capability,
            kernels: OnceLock::new(),
        })))
    }

    /// Opens the GPU at a PCI bus id such as `0000:8a:00.0` (as sysfs and `nvidia-smi` print it).
    pub fn by_pci_bus_id(bus_id: &str) -> Result<Device, GpuError> {
        init()?;
        let c = CString::new(bus_id).map_err(|_| GpuError::BusIdNotFound {
            bus_id: bus_id.into(),
            detail: "contains a NUL byte".into(),
        })?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `dev` is a valid out pointer and `c` a NUL-terminated string, both live for the call.
        let r = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(GpuError::BusIdNotFound {
                bus_id: bus_id.into(),
                detail: format!("{:?}", DriverError(r)),
            });
        }
        // A CUdevice handle is the ordinal on every driver so far; check rather than assume.
        let count = device_count()?;
        for index in 0..count {
            if cu::device::get(index as i32).ok() == Some(dev) {
                return Device::open(index);
            }
        }
        Err(GpuError::BusIdNotFound {
            bus_id: bus_id.into(),
            detail: "no ordinal maps to it".into(),
        })
    }

    pub fn index(&self) -> usize {
        self.0.index
    }
    pub fn name(&self) -> &str {
        &self.0.name
    }
    /// PCI bus id as the driver writes it, e.g. `0000:8A:00.0`.
    pub fn pci_bus_id(&self) -> &str {
        &self.0.pci_bus_id
    }
    pub fn compute_capability(&self) -> (i32, i32) {
        self.0.compute_capability
    }
    pub fn multiprocessor_count(&self) -> u32 {
        self.0.sm_count
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize), GpuError> {
        self.0
            .ctx
            .mem_get_info()
            .map_err(|e| self.err("cuMemGetInfo", e))
    }

    /// Makes this GPU's context current on the calling thread, for libraries (NCCL) that use the
    /// current context implicitly.
    pub fn make_current(&self) -> Result<(), GpuError> {
        self.0
            .ctx
            .bind_to_thread()
            .map_err(|e| self.err("cuCtxSetCurrent", e))
    }

    /// Waits for all work on this GPU.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.make_current()?;
        // cuCtxSynchronize has no timeout; it is used for drops and the synchronous host copies,
        // while the data path waits on streams and events, which are bounded.
        self.0
            .ctx
            .synchronize()
            .map_err(|e| self.err("cuCtxSynchronize", e))
    }

    /// A new non-blocking stream on this GPU.
    pub fn new_stream(&self) -> Result<Stream, GpuError> {
        let s = self
            .0
            .ctx
            .new_stream()
            .map_err(|e| self.err("cuStreamCreate", e))?;
        Ok(Stream {
            device: self.clone(),
            inner: s,
        })
    }

    /// `len` bytes of device memory whose start is aligned to [`PAGE`] (4 KiB), uninitialised.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer, GpuError> {
        if len == 0 {
            return Err(GpuError::ZeroSize);
        }
        self.make_current()?;
        let rounded = len
            .checked_next_multiple_of(PAGE)
            .ok_or(GpuError::OutOfBounds {
                offset: 0,
                len,
                size: usize::MAX,
            })?;
        let base = self.raw_alloc(rounded)?;
        if base % PAGE as u64 == 0 {
            return Ok(DeviceBuffer {
                device: self.clone(),
                base,
                ptr: base,
                len,
                owned: true,
            });
        }
        // cuMemAlloc promises only 256-byte alignment: over-allocate by a page and round up.
        // SAFETY: `base` came from cuMemAlloc just now and nothing else refers to it.
        let _ = unsafe { cu::free_sync(base) };
        let base = self.raw_alloc(rounded + PAGE)?;
        let ptr = base.next_multiple_of(PAGE as u64);
        Ok(DeviceBuffer {
            device: self.clone(),
            base,
            ptr,
            len,
            owned: true,
        })
    }

    fn raw_alloc(&self, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        // SAFETY: the context is current (callers bind it); the memory is only handed out wrapped
        // in a DeviceBuffer that frees it once.
        match unsafe { cu::malloc_sync(len) } {
            Ok(p) => Ok(p),
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let (free, total) = self.memory_info().unwrap_or((0, 0));
                Err(GpuError::OutOfDeviceMemory {
                    device: self.index(),
                    requested: len,
                    free,
                    total,
                })
            }
            Err(e) => Err(self.err("cuMemAlloc", e)),
        }
    }

    /// `len` bytes of page-locked host memory, zeroed, usable by every GPU's copies. Not
    /// write-combined, so the CPU reads it at normal speed (received data is read back).
    pub fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, GpuError> {
        if len == 0 {
            return Err(GpuError::ZeroSize);
        }
        self.make_current()?;
        const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
        // SAFETY: the context is current; the pointer is owned by the returned PinnedBuffer.
        let raw = unsafe { cu::malloc_host(len, CU_MEMHOSTALLOC_PORTABLE) }.map_err(|e| {
            GpuError::OutOfPinnedMemory {
                requested: len,
                detail: format!("cuMemHostAlloc: {e:?}"),
            }
        })?;
        let ptr = NonNull::new(raw as *mut u8).ok_or_else(|| GpuError::OutOfPinnedMemory {
            requested: len,
            detail: "null pointer".into(),
        })?;
        // SAFETY: `len` bytes at `ptr` were just allocated and are not shared yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedBuffer {
            device: self.clone(),
            ptr,
            len,
            pending: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn err(&self, call: &'static str, e: DriverError) -> GpuError {
        GpuError::driver(call, self.0.index, e)
    }

    /// The primary context (for the IPC, link and peer-access code in sibling modules).
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
    }

    fn kernels(&self) -> Result<Arc<Kernels>, GpuError> {
        self.0
            .kernels
            .get_or_init(|| {
                let (major, minor) = self.0.compute_capability;
                let ptx = crate::nvrtc::compile(
                    "pattern",
                    include_str!("kernels.cu"),
                    &format!("--gpu-architecture=compute_{major}{minor}"),
                )?;
                self.make_current()?;
                let module = self
                    .0
                    .ctx
                    .load_module(ptx)
                    .map_err(|e| self.err("cuModuleLoadData", e))?;
                let load = |name: &str| {
                    module
                        .load_function(name)
                        .map_err(|e| self.err("cuModuleGetFunction", e))
                };
                Ok(Arc::new(Kernels {
                    fill: load("tcpx_fill_pattern")?,
                    verify: load("tcpx_verify_pattern")?,
                    count: load("tcpx_count_pattern_errors")?,
                    unpack: load("tcpx_unpack")?,
                    unpack_warp: load("tcpx_unpack_warp")?,
                }))
            })
            .clone()
    }

    fn launch_config(&self, len: u64) -> LaunchConfig {
        const THREADS: u32 = 256;
        let words = len / 8 + 2;
        let blocks = words
            .div_ceil(THREADS as u64)
            .clamp(1, self.0.sm_count as u64 * 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Page-aligned (4 KiB) device memory on one GPU. Freed when dropped, after the GPU finished with it.
pub struct DeviceBuffer {
    device: Device,
    /// What cuMemAlloc returned (freed on drop).
    base: sys::CUdeviceptr,
    /// First byte of the buffer, `base` rounded up to a page.
    ptr: sys::CUdeviceptr,
    len: usize,
    /// False for memory someone else allocated ([`DeviceBuffer::borrowed`]): never freed here.
    owned: bool,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} bytes at {:#x} on GPU {})",
            self.len,
            self.ptr,
            self.device.index()
        )
    }
}

impl DeviceBuffer {
    /// Wraps `len` bytes of device memory at `ptr` on `device` that someone else allocated and
    /// frees (a torch CUDA tensor's `data_ptr()`), so transports can send from and receive into
    /// it in place. Nothing is freed when the buffer is dropped. The range is checked to lie in
    /// one allocation of this device (cuMemGetAddressRange).
    ///
    /// # Safety
    /// The allocation must stay alive for as long as the returned buffer lives, and nothing else
    /// may write the range while a send reads it, nor touch it while a receive writes it.
    pub unsafe fn borrowed(
        device: &Device,
        ptr: u64,
        len: usize,
    ) -> Result<DeviceBuffer, GpuError> {
        if len == 0 {
            return Err(GpuError::ZeroSize);
        }
        device.make_current()?;
        let mut base: sys::CUdeviceptr = 0;
        let mut alloc_len: usize = 0;
        // SAFETY: two valid out pointers; the driver only looks `ptr` up in its own tables.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut alloc_len, ptr) }
            .result()
            .map_err(|e| {
                device.err(
                    "cuMemGetAddressRange (is this device memory of this GPU?)",
                    e,
                )
            })?;
        let end = ptr.checked_add(len as u64);
        if end.is_none_or(|end| end > base + alloc_len as u64) {
            return Err(GpuError::OutOfBounds {
                offset: (ptr - base) as usize,
                len,
                size: alloc_len,
            });
        }
        Ok(DeviceBuffer {
            device: device.clone(),
            base,
            ptr,
            len,
            owned: false,
        })
    }

    /// Whether the memory belongs to someone else ([`DeviceBuffer::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        !self.owned
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Device address of the first byte, for libraries that take raw pointers (NCCL, plugins).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// What cuMemAlloc returned: the start of the allocation this buffer lies in (CUDA IPC
    /// exports whole allocations).
    pub(crate) fn allocation_base(&self) -> sys::CUdeviceptr {
        self.base
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        device_range(self.ptr, self.len, offset, len)
    }

    /// Copies `src` to `offset..`, after all work already queued on this GPU; returns when done.
    pub fn write_from_host(&self, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        let dst = self.check(offset, src.len())?;
        self.device.synchronize()?;
        // SAFETY: dst..dst+len is inside this allocation (checked); src is a live slice of that
        // length; the copy is synchronous, so src outlives it.
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()) }
            .result()
            .map_err(|e| self.device.err("cuMemcpyHtoD", e))
    }

    /// Copies `offset..offset + dst.len()` into `dst`, after all work queued on this GPU.
    pub fn read_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        let src = self.check(offset, dst.len())?;
        self.device.synchronize()?;
        // SAFETY: src range checked; dst is a live exclusive slice; synchronous copy.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()) }
            .result()
            .map_err(|e| self.device.err("cuMemcpyDtoH", e))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Queued copies or kernels may still use the memory: wait for the GPU first (borrowed
        // memory too, so its owner may free it once the buffer is gone).
        if self.device.synchronize().is_ok() && self.owned {
            // SAFETY: `base` came from cuMemAlloc and is freed once, here, with no work pending.
            let _ = unsafe { cu::free_sync(self.base) };
        }
        // If the GPU is broken we leak rather than free memory a hung copy may still touch.
    }
}

/// Page-locked host memory (not write-combined). Host access waits for the copies queued on it,
/// so the CPU never reads bytes a DMA is still writing, nor writes bytes a DMA is still reading.
pub struct PinnedBuffer {
    device: Device,
    ptr: NonNull<u8>,
    len: usize,
    /// Completion events of copies that touch this buffer and may not have finished.
    pending: Mutex<Vec<CudaEvent>>,
}

// SAFETY: the memory is owned by the buffer; host access goes through &self / &mut self borrows
// and waits for pending DMA first, so Rust's aliasing rules hold across threads as usual.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; `pending` is behind a mutex.
unsafe impl Sync for PinnedBuffer {}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.len)
    }
}

impl PinnedBuffer {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Start address (page-aligned), for registering with a plugin or socket zero-copy.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, once every copy queued on this buffer has finished (bounded wait).
    pub fn as_slice(&self) -> Result<&[u8], GpuError> {
        self.wait_pending()?;
        // SAFETY: `len` bytes at `ptr` are ours and initialised (zeroed at allocation); no DMA
        // writes them now (waited above) and none can start while `&self` is borrowed shared,
        // since device-to-host copies need `&mut PinnedBuffer`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes for writing, once every copy queued on this buffer has finished.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], GpuError> {
        self.wait_pending()?;
        // SAFETY: as in `as_slice`; `&mut self` also excludes host-to-device copies reading it.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    fn check(&self, offset: usize, len: usize) -> Result<*mut u8, GpuError> {
        match offset.checked_add(len) {
            // SAFETY: offset is within the allocation (checked), so the add stays in bounds.
            Some(end) if end <= self.len && len > 0 => Ok(unsafe { self.ptr.as_ptr().add(offset) }),
            _ => Err(GpuError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    fn add_pending(&self, ev: CudaEvent) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|e| !e.is_complete());
        p.push(ev);
    }

    fn wait_pending(&self) -> Result<(), GpuError> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + DEFAULT_GPU_DEADLINE;
        for ev in p.iter() {
            poll_until(
                deadline,
                "copy into/out of pinned buffer",
                self.device.index(),
                || query_event(ev),
            )?;
        }
        p.clear();
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.wait_pending().is_ok() {
            let _ = self.device.make_current();
            // SAFETY: `ptr` came from cuMemHostAlloc, no copy uses it any more, freed once.
            let _ = unsafe { cu::free_host(self.ptr.as_ptr() as *mut c_void) };
        }
    }
}

fn query_event(ev: &CudaEvent) -> Result<bool, DriverError> {
    // SAFETY: the event is alive (borrowed) and was created by cudarc.
    match unsafe { sys::cuEventQuery(ev.cu_event()) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(DriverError(e)),
    }
}

/// Polls `done` until it says true or `deadline` passes: spins briefly (copies of a few MiB finish
/// in tens of microseconds), then sleeps in growing steps up to 1 ms.
fn poll_until(
    deadline: Instant,
    what: &'static str,
    device: usize,
    mut done: impl FnMut() -> Result<bool, DriverError>,
) -> Result<(), GpuError> {
    let start = Instant::now();
    let mut naps = Backoff::doubling(Duration::from_micros(5), Duration::from_millis(1));
    loop {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(GpuError::driver("cuEventQuery/cuStreamQuery", device, e)),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(GpuError::Timeout {
                what,
                after: now - start,
            });
        }
        if now - start < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            naps.pause();
        }
    }
}

/// A stream on one GPU. Copies and kernels queued on it run in order; different streams overlap.
#[derive(Clone)]
pub struct Stream {
    device: Device,
    inner: Arc<CudaStream>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream on GPU {}", self.device.index())
    }
}

impl Stream {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw `CUstream` (the same handle as a `cudaStream_t`), for NCCL and plugins. It stays
    /// valid while this `Stream` (or a clone) lives.
    pub fn raw(&self) -> *mut c_void {
        self.inner.cu_stream() as *mut c_void
    }

    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    pub(crate) fn same_device(&self, what: &'static str, d: &Device) -> Result<(), GpuError> {
        if d.index() == self.device.index() {
            Ok(())
        } else {
            Err(GpuError::WrongDevice {
                what,
                a: self.device.index(),
                b: d.index(),
            })
        }
    }

    /// A new event with `flags`, recorded at the current end of the stream.
    fn recorded_event(&self, flags: sys::CUevent_flags) -> Result<CudaEvent, GpuError> {
        let ev = self
            .inner
            .context()
            .new_event(Some(flags))
            .map_err(|e| self.device.err("cuEventCreate", e))?;
        ev.record(&self.inner)
            .map_err(|e| self.device.err("cuEventRecord", e))?;
        Ok(ev)
    }

    fn completion_event(&self) -> Result<CudaEvent, GpuError> {
        self.recorded_event(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
    }

    /// Queues a copy of `len` bytes from `src[src_off..]` (pinned host) to `dst[dst_off..]`.
    pub fn copy_to_device(
        &self,
        src: &PinnedBuffer,
        src_off: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        self.same_device("copy_to_device", dst.device())?;
        let s = src.check(src_off, len)?;
        let d = dst.check(dst_off, len)?;
        self.device.make_current()?;
        // SAFETY: both ranges are checked in bounds; the pinned source stays allocated and
        // unwritten by the host until the completion event recorded next has fired (its drop and
        // &mut access wait for it); the device buffer's drop waits for the GPU.
        unsafe { sys::cuMemcpyHtoDAsync_v2(d, s as *const c_void, len, self.inner.cu_stream()) }
            .result()
            .map_err(|e| self.device.err("cuMemcpyHtoDAsync", e))?;
        src.add_pending(self.completion_event()?);
        Ok(())
    }

    /// Queues a copy of `len` bytes from `src[src_off..]` (device) to `dst[dst_off..]` (pinned host).
    pub fn copy_to_host(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        dst: &mut PinnedBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        self.same_device("copy_to_host", src.device())?;
        let s = src.check(src_off, len)?;
        let d = dst.check(dst_off, len)?;
        self.device.make_current()?;
        // SAFETY: ranges checked; the host range is not read or written by the CPU until the
        // completion event fires (host access and drop wait for it).
        unsafe { sys::cuMemcpyDtoHAsync_v2(d as *mut c_void, s, len, self.inner.cu_stream()) }
            .result()
            .map_err(|e| self.device.err("cuMemcpyDtoHAsync", e))?;
        dst.add_pending(self.completion_event()?);
        Ok(())
    }

    /// Queues a device-to-device copy; `src` may be on another GPU (the driver routes it over
    /// NVLink/PCIe peer access or through host memory).
    pub fn copy_device(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        dst: &DeviceBuffer,
        dst_off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        let s = src.check(src_off, len)?;
        let d = dst.check(dst_off, len)?;
        self.device.make_current()?;
        let r = if src.device().index() == dst.device().index() {
            // SAFETY: ranges checked, both buffers freed only after the GPU is idle.
            unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, len, self.inner.cu_stream()) }
        } else {
            // SAFETY: as above; the contexts are the buffers' own primary contexts.
            unsafe {
                sys::cuMemcpyPeerAsync(
                    d,
                    dst.device.0.ctx.cu_ctx(),
                    s,
                    src.device.0.ctx.cu_ctx(),
                    len,
                    self.inner.cu_stream(),
                )
            }
        };
        r.result()
            .map_err(|e| self.device.err("cuMemcpyAsync (device to device)", e))
    }

    /// Queues a kernel writing the pattern bytes `byte_offset..byte_offset + len` into
    /// `dst[off..off + len]` (see [`crate::pattern`]).
    pub fn fill_pattern(
        &self,
        dst: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        byte_offset: u64,
    ) -> Result<(), GpuError> {
        self.same_device("fill_pattern", dst.device())?;
        let p = dst.check(off, len)?;
        let k = self.device.kernels()?;
        let (len64, cfg) = (len as u64, self.device.launch_config(len as u64));
        self.device.make_current()?;
        let mut b = self.inner.launch_builder(&k.fill);
        b.arg(&p).arg(&len64).arg(&seed).arg(&byte_offset);
        // SAFETY: the argument list matches tcpx_fill_pattern(u8*, u64, u64, u64); the kernel
        // writes only dst[off..off+len] (checked in bounds).
        unsafe { b.launch(cfg) }
            .map_err(|e| self.device.err("cuLaunchKernel(tcpx_fill_pattern)", e))?;
        Ok(())
    }

    /// Checks on the GPU that `src[off..off + len]` holds pattern bytes `byte_offset..`; waits for
    /// the answer: `None` when every byte matches, else the index (from `off`) of the first bad byte.
    pub fn verify_pattern(
        &self,
        src: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        byte_offset: u64,
    ) -> Result<Option<u64>, GpuError> {
        let first_bad =
            self.pattern_check(PatternCheck::FirstBad, src, (off, len), seed, byte_offset)?;
        Ok((first_bad != u64::MAX).then_some(first_bad))
    }

    /// Queues a copy of `src[src_off..src_off + span.len()]` into the host `span`. The span is
    /// held by the returned [`HostCopy`] until the GPU has written it, so no one reads or reuses
    /// those bytes early. Runs at full DMA speed when the span's buffer is pinned ([`HostPin`]).
    pub fn copy_device_to_span(
        &self,
        src: &DeviceBuffer,
        src_off: usize,
        span: Span,
    ) -> Result<HostCopy, GpuError> {
        self.queue_span_copy(
            ("copy_device_to_span", "cuMemcpyDtoHAsync"),
            src,
            src_off,
            span,
            |s, dst, stream| {
                // SAFETY: the source range is checked; the destination is the span's memory,
                // which the span keeps exclusively ours until the HostCopy (which owns it) has
                // seen the copy finish.
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, s, dst.len(), stream)
                }
            },
        )
    }

    /// Queues a copy of the host `span` into `dst[dst_off..dst_off + span.len()]`; the span is held
    /// by the returned [`HostCopy`] until the GPU has read it.
    pub fn copy_span_to_device(
        &self,
        span: Span,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<HostCopy, GpuError> {
        self.queue_span_copy(
            ("copy_span_to_device", "cuMemcpyHtoDAsync"),
            dst,
            dst_off,
            span,
            |d, src, stream| {
                // SAFETY: destination range checked; the source bytes stay lent to the HostCopy
                // (so unwritten by anyone) until the copy has finished.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(d, src.as_ptr() as *const c_void, src.len(), stream)
                }
            },
        )
    }

    /// Queues one copy between the host `span` and `device[off..off + span.len()]`: `copy` gets
    /// the checked device address, the span's bytes and the stream; `(what, call)` name the
    /// operation and the driver call for errors. The returned [`HostCopy`] holds the span until
    /// the copy has finished.
    fn queue_span_copy(
        &self,
        (what, call): (&'static str, &'static str),
        device: &DeviceBuffer,
        off: usize,
        mut span: Span,
        copy: impl FnOnce(sys::CUdeviceptr, &mut [u8], sys::CUstream) -> CUresult,
    ) -> Result<HostCopy, GpuError> {
        self.same_device(what, device.device())?;
        let at = device.check(off, span.len())?;
        self.device.make_current()?;
        copy(at, &mut span, self.inner.cu_stream())
            .result()
            .map_err(|e| self.device.err(call, e))?;
        Ok(HostCopy {
            event: Some(self.completion_event()?),
            span: Some(span),
            device: self.device.index(),
        })
    }

    /// Queues the TCPX receive unpack: for each entry, `len` bytes from `bounce[src_off..]` to
    /// `dst[dst_off + entry.dst_off..]`, on the GPU. Every entry is checked against both buffers
    /// first, so a bad list is an error here rather than a fault on the GPU. The entries travel
    /// through a small device buffer that lives until the stream has run the kernel.
    pub fn unpack(
        &self,
        bounce: &DeviceBuffer,
        copies: &[UnpackCopy],
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<usize, GpuError> {
        self.same_device("unpack (bounce buffer)", bounce.device())?;
        self.same_device("unpack (destination)", dst.device())?;
        let mut total = 0usize;
        for c in copies {
            let (s, l, d) = (c.src_off as usize, c.len as usize, c.dst_off as usize);
            bounce.check(s, l)?;
            let at = dst_off.checked_add(d).ok_or(GpuError::OutOfBounds {
                offset: d,
                len: l,
                size: dst.len(),
            })?;
            dst.check(at, l)?;
            total += l;
        }
        if copies.is_empty() {
            return Ok(0);
        }
        let k = self.device.kernels()?;
        let bytes = std::mem::size_of_val(copies);
        let table = self.device.alloc(bytes)?;
        self.device.make_current()?;
        // SAFETY: `copies` is a live slice of plain-old-data (repr(C) u32/u32/u64) of `bytes`
        // bytes; the copy is synchronous with respect to the host buffer (pageable memory), and
        // `table` holds exactly `bytes`.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                table.device_ptr(),
                copies.as_ptr() as *const c_void,
                bytes,
                self.inner.cu_stream(),
            )
        }
        .result()
        .map_err(|e| self.device.err("cuMemcpyHtoDAsync(unpack table)", e))?;
        let (src, out, tab, count) = (
            bounce.device_ptr(),
            dst.device_ptr() + dst_off as u64,
            table.device_ptr(),
            copies.len() as u64,
        );
        let blocks = (copies.len() as u64)
            .min(self.device.0.sm_count as u64 * 32)
            .max(1) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.inner.launch_builder(&k.unpack);
        b.arg(&src).arg(&out).arg(&tab).arg(&count);
        // SAFETY: arguments match tcpx_unpack(const u8*, u8*, const UnpackCopy*, u64); every
        // entry was checked to read inside `bounce` and write inside `dst` above.
        unsafe { b.launch(cfg) }.map_err(|e| self.device.err("cuLaunchKernel(tcpx_unpack)", e))?;
        // The table must outlive the kernel: wait for it before `table` is freed (its drop
        // would wait for the whole GPU otherwise).
        self.synchronize()?;
        Ok(total)
    }

    /// Counts on the GPU the bytes of `src[off..off + len]` that differ from pattern bytes
    /// `byte_offset..` (0 when the range is exact); waits for the answer. For reports that give
    /// the number of wrong bytes rather than the first one.
    pub fn count_pattern_errors(
        &self,
        src: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        byte_offset: u64,
    ) -> Result<u64, GpuError> {
        self.pattern_check(PatternCheck::Count, src, (off, len), seed, byte_offset)
    }

    /// Runs one of the pattern-checking kernels over `src[off..off + len]` against pattern bytes
    /// `byte_offset..` and waits for the 8-byte word it answers in.
    fn pattern_check(
        &self,
        check: PatternCheck,
        src: &DeviceBuffer,
        (off, len): (usize, usize),
        seed: u64,
        byte_offset: u64,
    ) -> Result<u64, GpuError> {
        self.same_device(check.operation(), src.device())?;
        let p = src.check(off, len)?;
        let k = self.device.kernels()?;
        let result = self.device.alloc(8)?;
        let res_ptr = result.device_ptr();
        self.device.make_current()?;
        // SAFETY: `result` is 8 bytes of device memory we own.
        unsafe { sys::cuMemsetD8Async(res_ptr, check.initial(), 8, self.inner.cu_stream()) }
            .result()
            .map_err(|e| self.device.err("cuMemsetD8Async", e))?;
        let (len64, cfg) = (len as u64, self.device.launch_config(len as u64));
        let mut b = self.inner.launch_builder(check.kernel(&k));
        b.arg(&p)
            .arg(&len64)
            .arg(&seed)
            .arg(&byte_offset)
            .arg(&res_ptr);
        // SAFETY: arguments match both kernels, tcpx_verify_pattern and
        // tcpx_count_pattern_errors (const u8*, u64, u64, u64, u64*); each reads
        // src[off..off+len] (checked) and writes (or adds into) the 8-byte `result` only.
        unsafe { b.launch(cfg) }.map_err(|e| self.device.err(check.launch_call(), e))?;
        self.synchronize()?;
        let mut word = [0u8; 8];
        result.read_to_host(0, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    /// Records a timing event at the current end of the stream.
    pub fn record(&self) -> Result<Event, GpuError> {
        let ev = self.recorded_event(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
        Ok(Event {
            inner: ev,
            device: self.device.index(),
        })
    }

    /// Makes later work on this stream wait for `ev` (which may come from another stream of the
    /// same GPU), without blocking the CPU.
    pub fn wait_event(&self, ev: &Event) -> Result<(), GpuError> {
        self.inner
            .wait(&ev.inner)
            .map_err(|e| self.device.err("cuStreamWaitEvent", e))
    }

    /// Waits until everything queued so far has finished, at most [`DEFAULT_GPU_DEADLINE`].
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.synchronize_within(DEFAULT_GPU_DEADLINE)
    }

    pub fn synchronize_within(&self, limit: Duration) -> Result<(), GpuError> {
        self.device.make_current()?;
        let s = self.inner.cu_stream();
        poll_until(
            Instant::now() + limit,
            "stream synchronize",
            self.device.index(),
            || {
                // SAFETY: the stream is alive (owned by self.inner).
                match unsafe { sys::cuStreamQuery(s) } {
                    CUresult::CUDA_SUCCESS => Ok(true),
                    CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                    e => Err(DriverError(e)),
                }
            },
        )
    }
}

/// A point in a stream, for timing and for ordering between streams.
pub struct Event {
    inner: CudaEvent,
    device: usize,
}

impl Event {
    /// True once the GPU has passed this point.
    pub fn is_complete(&self) -> Result<bool, GpuError> {
        query_event(&self.inner).map_err(|e| GpuError::driver("cuEventQuery", self.device, e))
    }

    /// Waits for the GPU to pass this point, at most `limit`.
    pub fn wait_within(&self, limit: Duration) -> Result<(), GpuError> {
        poll_until(Instant::now() + limit, "event wait", self.device, || {
            query_event(&self.inner)
        })
    }

    /// GPU time from `start` to this event (both must be complete; waits up to the default deadline).
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration, GpuError> {
        start.wait_within(DEFAULT_GPU_DEADLINE)?;
        self.wait_within(DEFAULT_GPU_DEADLINE)?;
        let ms = start
            .inner
            .elapsed_ms(&self.inner)
            .map_err(|e| GpuError::driver("cuEventElapsedTime", self.device, e))?;
        Ok(Duration::from_secs_f64(ms as f64 / 1e3))
    }
}

/// A copy between a host [`Span`] and device memory in flight. It owns the span until the copy
/// has finished; dropping it unfinished waits (bounded) and, if the GPU never finishes, keeps the
/// range lent out forever rather than let anyone touch bytes a DMA may still write.
pub struct HostCopy {
    event: Option<CudaEvent>,
    span: Option<Span>,
    device: usize,
}

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy({:?} on GPU {})", self.span, self.device)
    }
}

impl HostCopy {
    /// True once the GPU has finished the copy.
    pub fn is_done(&self) -> Result<bool, GpuError> {
        match &self.event {
            Some(ev) => {
                query_event(ev).map_err(|e| GpuError::driver("cuEventQuery", self.device, e))
            }
            None => Ok(true),
        }
    }

    /// Waits up to `limit` for the copy, then hands the span back.
    pub fn wait(mut self, limit: Duration) -> Result<Span, GpuError> {
        if let Some(ev) = &self.event {
            poll_until(Instant::now() + limit, "host copy", self.device, || {
                query_event(ev)
            })?;
        }
        self.event = None;
        Ok(self
            .span
            .take()
            .expect("span held until the copy is waited for"))
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if let (Some(ev), Some(span)) = (self.event.take(), self.span.take()) {
            let done = poll_until(
                Instant::now() + DEFAULT_GPU_DEADLINE,
                "host copy",
                self.device,
                || query_event(&ev),
            );
            if done.is_err() {
                // The DMA may still write these bytes: never give the range back.
                std::mem::forget(span);
            }
        }
    }
}

/// Page-locks an existing [`HostBuffer`] with `cuMemHostRegister`, so copies between it and any
/// GPU run at DMA speed, and unlocks it when dropped. The buffer stays an ordinary `HostBuffer`
/// (sockets and plugins use it through spans as before).
pub struct HostPin {
    buf: Arc<HostBuffer>,
    device: Device,
}

impl std::fmt::Debug for HostPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostPin({} bytes)", self.buf.len())
    }
}

impl HostPin {
    pub fn new(device: &Device, buf: &Arc<HostBuffer>) -> Result<HostPin, GpuError> {
        device.make_current()?;
        const CU_MEMHOSTREGISTER_PORTABLE: u32 = 0x01;
        // SAFETY: the range is the whole live allocation of `buf`, which this pin keeps alive
        // (Arc) until it unregisters it; registration does not change the bytes.
        unsafe {
            sys::cuMemHostRegister_v2(
                buf.as_ptr() as *mut c_void,
                buf.len(),
                CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(|e| GpuError::OutOfPinnedMemory {
            requested: buf.len(),
            detail: format!("cuMemHostRegister: {e:?}"),
        })?;
        Ok(HostPin {
            buf: Arc::clone(buf),
            device: device.clone(),
        })
    }

    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buf
    }
}

impl Drop for HostPin {
    fn drop(&mut self) {
        // Copies in flight hold spans of the buffer through HostCopy, whose drops wait for them;
        // wait for the whole GPU as well, since unregistering under a running DMA is undefined.
        if self.device.synchronize().is_ok() {
            // SAFETY: the pointer was registered in `new` and is unregistered once, here.
            let _ = unsafe { sys::cuMemHostUnregister(self.buf.as_ptr() as *mut c_void) };
        }
    }
}

/// A fragment list uploaded to device memory, with the extents it was checked for: the bounce
/// bytes it reads (`src_end`) and the destination bytes it writes (`dst_end`), so a launch only
/// compares two numbers with the buffers it is given. Cheap to clone (the device copy is shared),
/// so one upload can serve many launches.
#[derive(Clone)]
pub struct UnpackTable {
    table: Arc<DeviceBuffer>,
    count: usize,
    bytes: usize,
    src_end: u64,
    dst_end: u64,
}

impl std::fmt::Debug for UnpackTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnpackTable")
            .field("fragments", &self.count)
            .field("bytes", &self.bytes)
            .field("src_end", &self.src_end)
            .field("dst_end", &self.dst_end)
            .finish()
    }
}

impl UnpackTable {
    /// Fragments in the table.
    pub fn fragments(&self) -> usize {
        self.count
    }
    /// Bytes the fragments carry in total.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// One past the last bounce byte any fragment reads.
    pub fn src_end(&self) -> u64 {
        self.src_end
    }
    /// One past the last destination byte any fragment writes.
    pub fn dst_end(&self) -> u64 {
        self.dst_end
    }
}

/// An unpack queued on a stream. It owns the fragment table until the kernel has run; the plugin
/// may recycle the bounce pages (irecvConsumed) only once [`UnpackJob::is_complete`] said so.
pub struct UnpackJob {
    event: CudaEvent,
    /// Kept alive until the kernel has read it (dropping an unfinished job waits for the GPU).
    table: UnpackTable,
    device: usize,
}

impl std::fmt::Debug for UnpackJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnpackJob")
            .field("bytes", &self.table.bytes)
            .field("fragments", &self.table.count)
            .field("device", &self.device)
            .finish()
    }
}

impl UnpackJob {
    /// Bytes the job copies.
    pub fn bytes(&self) -> usize {
        self.table.bytes
    }
    pub fn fragments(&self) -> usize {
        self.table.count
    }
    /// True once the kernel (and everything queued before it on the stream) has finished.
    pub fn is_complete(&self) -> Result<bool, GpuError> {
        query_event(&self.event).map_err(|e| GpuError::driver("cuEventQuery", self.device, e))
    }
    /// Waits for the kernel, at most `limit`.
    pub fn wait_within(&self, limit: Duration) -> Result<(), GpuError> {
        poll_until(Instant::now() + limit, "unpack kernel", self.device, || {
            query_event(&self.event)
        })
    }
}

impl Device {
    /// Uploads a fragment list for [`Stream::unpack_table`] / [`Stream::unpack_raw`]
    /// (synchronous, so `copies` may be dropped right after). An empty list is an error: there
    /// is nothing to launch.
    pub fn upload_unpack_table(&self, copies: &[UnpackCopy]) -> Result<UnpackTable, GpuError> {
        let mut bytes = 0usize;
        let (mut src_end, mut dst_end) = (0u64, 0u64);
        for c in copies {
            src_end = src_end.max(u64::from(c.src_off) + u64::from(c.len));
            let end = c
                .dst_off
                .checked_add(u64::from(c.len))
                .ok_or(GpuError::OutOfBounds {
                    offset: c.dst_off as usize,
                    len: c.len as usize,
                    size: usize::MAX,
                })?;
            dst_end = dst_end.max(end);
            bytes += c.len as usize;
        }
        let size = std::mem::size_of_val(copies);
        let table = self.alloc(size)?;
        self.make_current()?;
        // SAFETY: `copies` is a live slice of plain-old-data (repr(C) u32/u32/u64) of `size`
        // bytes and `table` holds at least `size` bytes; the copy is synchronous.
        unsafe { sys::cuMemcpyHtoD_v2(table.device_ptr(), copies.as_ptr() as *const c_void, size) }
            .result()
            .map_err(|e| self.err("cuMemcpyHtoD(unpack table)", e))?;
        Ok(UnpackTable {
            table: Arc::new(table),
            count: copies.len(),
            bytes,
            src_end,
            dst_end,
        })
    }

    /// Copies `dst.len()` bytes from the device address `src` into `dst` (synchronous, after all
    /// work queued on this GPU), for small structures a plugin keeps in device memory (the
    /// GPUDirect-TCPX unpack handle).
    ///
    /// # Safety
    /// `src..src + dst.len()` must be device memory (or host memory mapped to the device) that is
    /// allocated and readable on this GPU for the duration of the call.
    pub unsafe fn read_raw(&self, src: u64, dst: &mut [u8]) -> Result<(), GpuError> {
        if dst.is_empty() {
            return Err(GpuError::ZeroSize);
        }
        self.synchronize()?;
        // SAFETY: the caller guarantees the source range; `dst` is a live exclusive slice of the
        // given length; the copy is synchronous.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len()) }
            .result()
            .map_err(|e| self.err("cuMemcpyDtoH(raw)", e))
    }
}

/// Whether `ptr` is memory CUDA knows as device memory (cuPointerGetAttribute MEMORY_TYPE). False
/// for ordinary host memory, and wherever there is no CUDA driver at all. Lets a caller decide
/// whether a structure a plugin handed over may be read on the CPU.
pub fn is_device_pointer(ptr: u64) -> bool {
    pointer_device(ptr).is_some()
}

/// The GPU whose device memory `ptr` points into (cuPointerGetAttribute MEMORY_TYPE and
/// DEVICE_ORDINAL), or `None` for host memory (pinned or not) and wherever there is no CUDA
/// driver at all.
pub fn pointer_device(ptr: u64) -> Option<usize> {
    if init().is_err() || ptr == 0 {
        return None;
    }
    let mut kind: u32 = 0;
    // SAFETY: the driver is initialised; the attribute query only inspects its own tables for
    // `ptr` and writes one unsigned int (CUmemorytype) into `kind`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    const CU_MEMORYTYPE_DEVICE: u32 = 2;
    if r != CUresult::CUDA_SUCCESS || kind != CU_MEMORYTYPE_DEVICE {
        return None;
    }
    let mut ordinal: i32 = -1;
    // SAFETY: as above; DEVICE_ORDINAL writes one int.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    (r == CUresult::CUDA_SUCCESS && ordinal >= 0).then_some(ordinal as usize)
}

impl Stream {
    /// Queues the unpack kernel (128 threads per fragment) of `table` reading `bounce[..]` and
    /// writing `dst[dst_off..]`; returns the job (whose event says when the bytes are in place). Both
    /// buffers are checked against the table's extents first. `table` by value or by reference:
    /// one upload may serve many launches.
    pub fn unpack_table(
        &self,
        bounce: &DeviceBuffer,
        table: impl std::borrow::Borrow<UnpackTable>,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<UnpackJob, GpuError> {
        let table = table.borrow();
        self.unpack_table_queued(bounce, table, dst, dst_off)?;
        self.unpack_job(table)
    }

    /// Queues the unpack kernel on raw device addresses: the plugin's bounce buffer and a
    /// registered receive buffer. The destination extent is checked against `dst_len`; the
    /// bounce extent cannot be (GPUDirect-TCPX does not say how large its buffer is).
    ///
    /// # Safety
    /// `bounce..bounce + table.src_end()` must be device memory of this stream's GPU that stays
    /// readable and unchanged until the returned job is complete (GPUDirect-TCPX: until
    /// irecvConsumed, which the caller must call only after that); `dst..dst + dst_len` must be
    /// device memory of this GPU that nobody else reads or writes until the job is complete.
    pub unsafe fn unpack_raw(
        &self,
        bounce: u64,
        table: impl std::borrow::Borrow<UnpackTable>,
        dst: u64,
        dst_len: usize,
    ) -> Result<UnpackJob, GpuError> {
        let table = table.borrow();
        // SAFETY: the caller's guarantees, passed on unchanged.
        unsafe { self.launch_unpack(bounce, table, dst, dst_len) }?;
        self.unpack_job(table)
    }

    /// The job of the unpack of `table` just queued: an event recorded after it, and the table,
    /// kept alive until then.
    fn unpack_job(&self, table: &UnpackTable) -> Result<UnpackJob, GpuError> {
        let event = self.completion_event()?;
        Ok(UnpackJob {
            event,
            table: table.clone(),
            device: self.device.index(),
        })
    }

    /// Launches the unpack kernel (no event).
    ///
    /// # Safety
    /// As for [`Stream::unpack_raw`], and the table's device copy must outlive the kernel.
    unsafe fn launch_unpack(
        &self,
        bounce: u64,
        table: &UnpackTable,
        dst: u64,
        dst_len: usize,
    ) -> Result<(), GpuError> {
        if table.dst_end > dst_len as u64 {
            return Err(GpuError::OutOfBounds {
                offset: 0,
                len: table.dst_end as usize,
                size: dst_len,
            });
        }
        if bounce == 0 || dst == 0 {
            return Err(GpuError::OutOfBounds {
                offset: 0,
                len: table.bytes,
                size: 0,
            });
        }
        let k = self.device.kernels()?;
        self.device.make_current()?;
        if table.count > 0 {
            const THREADS: u32 = 256;
            // kernels.cu's UNPACK_GROUP: threads per fragment.
            const UNPACK_GROUP: u32 = 128;
            let groups_per_block = (THREADS / UNPACK_GROUP) as u64;
            let blocks = (table.count as u64)
                .div_ceil(groups_per_block)
                .clamp(1, self.device.0.sm_count as u64 * 16) as u32;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (tab, count) = (table.table.device_ptr(), table.count as u64);
            let mut b = self.inner.launch_builder(&k.unpack_warp);
            b.arg(&bounce).arg(&dst).arg(&tab).arg(&count);
            // SAFETY: arguments match tcpx_unpack_warp(const u8*, u8*, const UnpackCopy*, u64);
            // the table holds `count` entries and stays alive until the kernel ran (the caller's
            // job holds it, and dropping the last reference waits for the GPU); reads and writes
            // stay in the ranges the caller vouched for (destination checked).
            unsafe { b.launch(cfg) }
                .map_err(|e| self.device.err("cuLaunchKernel(tcpx_unpack_warp)", e))?;
        }
        Ok(())
    }

    /// [`Stream::unpack_table`] without the completion event, for back-to-back launches whose
    /// end the caller marks itself ([`Stream::record`]); returns the bytes the table carries.
    /// The table may be dropped right after: freeing its device copy waits for the GPU.
    pub fn unpack_table_queued(
        &self,
        bounce: &DeviceBuffer,
        table: &UnpackTable,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<usize, GpuError> {
        let room = self.check_unpack_buffers(bounce, table, dst, dst_off)?;
        // SAFETY: every fragment reads inside `bounce` and writes inside `dst[dst_off..]`
        // (extents checked above); both buffers are freed only after the GPU is idle.
        unsafe {
            self.launch_unpack(
                bounce.device_ptr(),
                table,
                dst.device_ptr() + dst_off as u64,
                room,
            )
        }?;
        Ok(table.bytes)
    }

    fn check_unpack_buffers(
        &self,
        bounce: &DeviceBuffer,
        table: &UnpackTable,
        dst: &DeviceBuffer,
        dst_off: usize,
    ) -> Result<usize, GpuError> {
        self.same_device("unpack (bounce buffer)", bounce.device())?;
        self.same_device("unpack (destination)", dst.device())?;
        if table.src_end > bounce.len() as u64 {
            return Err(GpuError::OutOfBounds {
                offset: 0,
                len: table.src_end as usize,
                size: bounce.len(),
            });
        }
        dst.len().checked_sub(dst_off).ok_or(GpuError::OutOfBounds {
            offset: dst_off,
            len: 0,
            size: dst.len(),
        })
    }
}

/// One fragment of a TCPX receive: `len` bytes from `src_off` in the bounce buffer to `dst_off`
/// in the destination. The same 16-byte layout as the plugin's `loadMeta`
/// (`tcpx_ffi::abi::LoadMeta`), so a fragment list can be handed over as it is.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackCopy {
    pub src_off: u32,
    pub len: u32,
    pub dst_off: u64,
}

#[cfg(test)]
mod layout_tests {
    use super::UnpackCopy;

    #[test]
    fn unpack_copy_matches_load_meta() {
        assert_eq!(std::mem::size_of::<UnpackCopy>(), 16);
        assert_eq!(std::mem::align_of::<UnpackCopy>(), 16);
        assert_eq!(std::mem::offset_of!(UnpackCopy, len), 4);
        assert_eq!(std::mem::offset_of!(UnpackCopy, dst_off), 8);
    }
}
