//! The few CUDA driver calls the test plugin needs to take GPU memory the way GPUDirect-TCPX does:
//! the context current on the calling thread (captured at accept and regMr, as TCPX picks the GPU
//! from it), device bounce pages, host-mapped unpack metadata, and synchronous copies between host
//! staging and device memory. Through cudarc's dynamically loaded driver API, and only after
//! `tcpx_gpu::init` found libcuda, so a machine without a driver never reaches cudarc (which
//! would panic across the C ABI).

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUresult};

/// A CUDA context as a plain address, so plugin state holding it stays `Send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx(usize);

fn check(call: &str, r: CUresult) -> Result<(), String> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

/// Whether the CUDA driver can be used at all in this process.
pub fn available() -> bool {
    tcpx_gpu::init().is_ok()
}

/// The context current on the calling thread, if CUDA is present and one is current.
pub fn current() -> Option<Ctx> {
    if !available() {
        return None;
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is initialised; the call writes one pointer into `ctx`.
    let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    (r == CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(Ctx(ctx as usize))
}

/// Runs `f` with `ctx` pushed as the calling thread's current context (popped after), so the
/// caller's own current context is left as it was.
pub fn with<R>(ctx: Ctx, f: impl FnOnce() -> Result<R, String>) -> Result<R, String> {
    // SAFETY: `ctx` came from cuCtxGetCurrent of a context the caller keeps alive (a primary
    // context retained by the GPU layer for the life of its comms).
    check("cuCtxPushCurrent", unsafe {
        sys::cuCtxPushCurrent_v2(ctx.0 as sys::CUcontext)
    })?;
    let out = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above from this thread's stack.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    out
}

/// `len` bytes of device memory in `ctx`.
pub fn alloc(ctx: Ctx, len: usize) -> Result<u64, String> {
    with(ctx, || {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: a context is current; the call writes one device address.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, len) })?;
        Ok(p)
    })
}

/// Frees device memory from [`alloc`] (after the GPU finished with it).
pub fn free(ctx: Ctx, p: u64) {
    let _ = with(ctx, || {
        // SAFETY: `p` came from cuMemAlloc in this context and is freed once, by its owner.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(p) })
    });
}

/// `len` zeroed bytes of page-locked host memory mapped into every context's address space
/// (portable + device-mapped), like TCPX's `netUnpackMeta`. With unified addressing its host
/// address is also its device address.
pub fn alloc_host_mapped(ctx: Ctx, len: usize) -> Result<*mut u8, String> {
    const PORTABLE: u32 = 0x01;
    const DEVICEMAP: u32 = 0x02;
    with(ctx, || {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a context is current; the call writes one host pointer.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, len, PORTABLE | DEVICEMAP)
        })?;
        // SAFETY: `len` bytes at `p` were just allocated and are ours.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
        Ok(p.cast())
    })
}

/// Frees memory from [`alloc_host_mapped`].
pub fn free_host(ctx: Ctx, p: *mut u8) {
    let _ = with(ctx, || {
        // SAFETY: `p` came from cuMemHostAlloc and is freed once, by its owner.
        check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p.cast()) })
    });
}

/// Copies `src` to device address `dst` (synchronous).
///
/// # Safety
/// `dst..dst + src.len()` must be device memory of `ctx` that nobody else uses meanwhile.
pub unsafe fn to_device(ctx: Ctx, dst: u64, src: &[u8]) -> Result<(), String> {
    with(ctx, || {
        // SAFETY: the caller vouches for the destination; `src` is a live slice.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    })
}

/// Waits until every copy issued in `ctx` has landed. A copy from pageable host memory returns
/// once its bytes are staged, before the DMA reaches the GPU, and the caller's kernels run on
/// non-blocking streams that do not wait for it: so the plugin calls this before it reports a
/// receive done.
pub fn synchronize(ctx: Ctx) -> Result<(), String> {
    with(ctx, || {
        // SAFETY: a context is current; the call only waits.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    })
}

/// Copies device address `src` into `dst` (synchronous).
///
/// # Safety
/// `src..src + dst.len()` must be device memory of `ctx` that nobody writes meanwhile.
pub unsafe fn to_host(ctx: Ctx, dst: &mut [u8], src: u64) -> Result<(), String> {
    with(ctx, || {
        // SAFETY: the caller vouches for the source; `dst` is a live exclusive slice.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    })
}
