//! The exported tables `ncclNetPlugin_v9`, `_v8`, `_v7` and their entries. Every entry runs
//! inside `catch_unwind` (a panic answers `ncclInternalError`, never unwinds into C), forwards
//! to the real plugin and, while recording, swaps comm and request pointers for the shim's own
//! (a boxed comm wrapper per comm, an arena slot per request) and counts what completed.

use std::ffi::{c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use tcpx_ffi::abi::*;

use crate::inner::{Has, MAX_GROUPED};
use crate::recorder::{link_id, Dir, HANDLE_BYTES};
use crate::state::{self, comm_of, listen_of, Recording, ShimComm};

type Comm = *mut c_void;

macro_rules! table {
    ($name:ident: $ty:ident { $($field:ident: $value:expr,)* }) => {
        /// Mutable only so that `init` can clear the entries the real plugin lacks and the
        /// shim's load can give it the real plugin's name; NCCL reads entries after `init`.
        #[no_mangle]
        pub static mut $name: $ty = $ty {
            name: c"tcpxwatch".as_ptr(),
            devices: Some(devices),
            listen: Some(listen),
            connect: Some(connect),
            accept: Some(accept),
            reg_mr_dma_buf: Some(reg_mr_dma_buf),
            dereg_mr: Some(dereg_mr),
            iflush: Some(iflush),
            test: Some(test),
            close_send: Some(close_send),
            close_recv: Some(close_recv),
            close_listen: Some(close_listen),
            get_device_mr: Some(get_device_mr),
            irecv_consumed: Some(irecv_consumed),
            $($field: $value,)*
        };
    };
}

table!(ncclNetPlugin_v9: NcclNetV9 {
    init: Some(init_v9),
    get_properties: Some(get_properties_v9),
    reg_mr: Some(reg_mr_size_t),
    isend: Some(isend_size_t),
    irecv: Some(irecv_size_t),
    make_v_device: Some(make_v_device),
});

table!(ncclNetPlugin_v8: NcclNetV8 {
    init: Some(init_v8),
    get_properties: Some(get_properties_v8),
    reg_mr: Some(reg_mr_size_t),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
});

table!(ncclNetPlugin_v7: NcclNetV7 {
    init: Some(init_v7),
    get_properties: Some(get_properties_v7),
    reg_mr: Some(reg_mr_int),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
});

/// Whether `p` is one of the shim's own tables.
pub fn is_own(p: *const c_void) -> bool {
    p == std::ptr::addr_of!(ncclNetPlugin_v9).cast()
        || p == std::ptr::addr_of!(ncclNetPlugin_v8).cast()
        || p == std::ptr::addr_of!(ncclNetPlugin_v7).cast()
}

/// Runs an entry's body; a panic answers `ncclInternalError` instead of unwinding into C.
fn guard(f: impl FnOnce() -> NcclResult) -> NcclResult {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(NCCL_INTERNAL_ERROR)
}

/// Clears, in every table, the entries the real plugin has as NULL (so NCCL, which reads the
/// entries after `init`, decides as it would without the shim).
fn mirror_nulls(has: &Has) {
    macro_rules! clear {
        ($t:expr) => {{
            let t = $t;
            let e = &has.entries;
            if !e[1] {
                t.devices = None;
            }
            if !e[2] {
                t.get_properties = None;
            }
            if !e[3] {
                t.listen = None;
            }
            if !e[4] {
                t.connect = None;
            }
            if !e[5] {
                t.accept = None;
            }
            if !e[6] {
                t.reg_mr = None;
            }
            if !e[7] {
                t.reg_mr_dma_buf = None;
            }
            if !e[8] {
                t.dereg_mr = None;
            }
            if !e[9] {
                t.isend = None;
            }
            if !e[10] {
                t.irecv = None;
            }
            if !e[11] {
                t.iflush = None;
            }
            if !e[12] {
                t.test = None;
            }
            if !e[13] {
                t.close_send = None;
            }
            if !e[14] {
                t.close_recv = None;
            }
            if !e[15] {
                t.close_listen = None;
            }
            if !e[16] {
                t.get_device_mr = None;
            }
            if !e[17] {
                t.irecv_consumed = None;
            }
        }};
    }
    // SAFETY: `init` runs under the shim's init lock before NCCL reads any entry but `init`
    // (NCCL's order: init, then the entries); each table is written through its own pointer.
    unsafe {
        clear!(&mut *std::ptr::addr_of_mut!(ncclNetPlugin_v9));
        clear!(&mut *std::ptr::addr_of_mut!(ncclNetPlugin_v8));
        clear!(&mut *std::ptr::addr_of_mut!(ncclNetPlugin_v7));
        if !has.make_v_device {
            (*std::ptr::addr_of_mut!(ncclNetPlugin_v9)).make_v_device = None;
        }
    }
}

/// Gives the tables the real plugin's name (NCCL reads `name` when it loads the shim, before
/// `init`, and selects a network by it with `NCCL_NET`).
fn take_inner_name(name: *const std::ffi::c_char) {
    // SAFETY: runs in the shim's constructor, while the loader holds its lock and before anyone
    // could read the tables; `name` lives as long as the never-unloaded real plugin.
    unsafe {
        (*std::ptr::addr_of_mut!(ncclNetPlugin_v9)).name = name;
        (*std::ptr::addr_of_mut!(ncclNetPlugin_v8)).name = name;
        (*std::ptr::addr_of_mut!(ncclNetPlugin_v7)).name = name;
    }
}

/// Runs when the shim is loaded: loads the real plugin now if `TCPX_WATCH_INNER` (or NCCL's
/// default name) finds one, so that the tables carry its name. A failure is reported by `init`.
extern "C" fn on_load() {
    let _ = std::panic::catch_unwind(|| {
        if std::env::var_os("TCPX_WATCH_INNER").is_none() {
            return;
        }
        if let Ok(inner) = state::load_inner(is_own) {
            let name = match inner.table {
                crate::inner::Table::V7(t) => t.name,
                crate::inner::Table::V8(t) => t.name,
                crate::inner::Table::V9(t) => t.name,
            };
            if !name.is_null() {
                take_inner_name(name);
            }
        }
    });
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

// ---- plugin-wide entries -----------------------------------------------------------------------

unsafe extern "C" fn init_v9(logger: NcclDebugLogger) -> NcclResult {
    guard(|| state::init(9, logger, is_own, mirror_nulls))
}

unsafe extern "C" fn init_v8(logger: NcclDebugLogger) -> NcclResult {
    guard(|| state::init(8, logger, is_own, mirror_nulls))
}

unsafe extern "C" fn init_v7(logger: NcclDebugLogger) -> NcclResult {
    guard(|| state::init(7, logger, is_own, mirror_nulls))
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    guard(|| match state::shim() {
        Some(s) => s.inner.devices(ndev),
        None => NCCL_INTERNAL_ERROR,
    })
}

unsafe extern "C" fn get_properties_v9(dev: c_int, props: *mut NetPropertiesV9) -> NcclResult {
    guard(|| match state::shim() {
        Some(s) => s.inner.get_properties_v9(dev, props),
        None => NCCL_INTERNAL_ERROR,
    })
}

unsafe extern "C" fn get_properties_v8(dev: c_int, props: *mut NetPropertiesV8) -> NcclResult {
    guard(|| match state::shim() {
        Some(s) => s.inner.get_properties_v8(dev, props),
        None => NCCL_INTERNAL_ERROR,
    })
}

unsafe extern "C" fn get_properties_v7(dev: c_int, props: *mut NetPropertiesV7) -> NcclResult {
    guard(|| match state::shim() {
        Some(s) => s.inner.get_properties_v7(dev, props),
        None => NCCL_INTERNAL_ERROR,
    })
}

unsafe extern "C" fn make_v_device(d: *mut c_int, props: *mut NetVDeviceProps) -> NcclResult {
    guard(|| match state::shim() {
        Some(s) => s.inner.make_v_device(d, props),
        None => NCCL_INTERNAL_ERROR,
    })
}

// ---- set-up --------------------------------------------------------------------------------------

/// The 128 handle bytes at `handle`, if any.
fn handle_bytes(handle: *mut c_void) -> Option<[u8; HANDLE_BYTES]> {
    if handle.is_null() {
        return None;
    }
    let mut out = [0u8; HANDLE_BYTES];
    // SAFETY: NCCL's handles are NCCL_NET_HANDLE_MAXSIZE bytes; we copy them.
    unsafe { std::ptr::copy_nonoverlapping(handle.cast::<u8>(), out.as_mut_ptr(), HANDLE_BYTES) };
    Some(out)
}

/// The recording, when the shim records.
fn recording() -> Option<(&'static state::Shim, Option<&'static Recording>)> {
    state::shim().map(|s| (s, s.recording.as_ref()))
}

unsafe extern "C" fn listen(dev: c_int, handle: *mut c_void, listen_comm: *mut Comm) -> NcclResult {
    guard(|| {
        let Some((s, rec)) = recording() else {
            return NCCL_INTERNAL_ERROR;
        };
        let Some(r) = rec else {
            return s.inner.listen(dev, handle, listen_comm);
        };
        let t0 = r.rec.now_ns();
        let code = s.inner.listen(dev, handle, listen_comm);
        let took = r.rec.now_ns().saturating_sub(t0);
        let link = handle_bytes(handle).map_or(0, |h| link_id(&h));
        r.conn("listen", None, None, dev, link, took, code);
        if code != NCCL_SUCCESS {
            r.error(None, Some(dev), "listen", code);
            return code;
        }
        if listen_comm.is_null() {
            return code;
        }
        // SAFETY: NCCL's out pointer, just filled by the real plugin.
        let inner = unsafe { *listen_comm };
        if !inner.is_null() {
            // SAFETY: as above; NCCL now holds the wrapper instead.
            unsafe { *listen_comm = r.new_listen(dev, link, inner).cast() };
        }
        code
    })
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut Comm,
    dev_comm: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard(|| {
        let Some((s, rec)) = recording() else {
            return NCCL_INTERNAL_ERROR;
        };
        let Some(r) = rec else {
            return s.inner.connect(dev, handle, send_comm, dev_comm);
        };
        let now = r.rec.now_ns();
        let addr = handle as usize;
        let (start, link) = match handle_bytes(handle) {
            Some(h) => r.rec.connect_begin(addr, &h, now),
            None => (now, 0),
        };
        let code = s.inner.connect(dev, handle, send_comm, dev_comm);
        let end = r.rec.now_ns();
        if code != NCCL_SUCCESS {
            r.rec.connect_done(addr);
            r.conn(
                "connect",
                None,
                Some(Dir::Send),
                dev,
                link,
                end.saturating_sub(start),
                code,
            );
            r.error(None, Some(dev), "connect", code);
            return code;
        }
        let inner = if send_comm.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: NCCL's out pointer, just written by the real plugin.
            unsafe { *send_comm }
        };
        if inner.is_null() {
            if let Some(after) = handle_bytes(handle) {
                r.rec.connect_not_yet(addr, &after, start, link);
            }
            return code;
        }
        r.rec.connect_done(addr);
        let wrapper = r.new_comm(Dir::Send, dev, link, inner);
        // SAFETY: the wrapper was just made and lives until closeSend.
        let c = unsafe { &*wrapper };
        r.conn(
            "connect",
            Some(c),
            Some(Dir::Send),
            dev,
            link,
            end.saturating_sub(start),
            code,
        );
        // SAFETY: NCCL's out pointer; NCCL holds the wrapper instead of the real comm.
        unsafe { *send_comm = wrapper.cast() };
        code
    })
}

unsafe extern "C" fn accept(
    listen_comm: Comm,
    recv_comm: *mut Comm,
    dev_comm: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard(|| {
        let Some((s, rec)) = recording() else {
            return NCCL_INTERNAL_ERROR;
        };
        let Some(r) = rec else {
            return s.inner.accept(listen_comm, recv_comm, dev_comm);
        };
        // SAFETY: NCCL passes a listen comm this shim returned (or NULL).
        let l = match unsafe { listen_of(listen_comm) } {
            Ok(Some(l)) => l,
            Ok(None) => return s.inner.accept(listen_comm, recv_comm, dev_comm),
            Err(code) => return code,
        };
        let now = r.rec.now_ns();
        let _ = l
            .accept_start
            .compare_exchange(0, now + 1, Ordering::Relaxed, Ordering::Relaxed);
        let start = l.accept_start.load(Ordering::Relaxed).saturating_sub(1);
        let code = s.inner.accept(l.inner, recv_comm, dev_comm);
        let end = r.rec.now_ns();
        if code != NCCL_SUCCESS {
            l.accept_start.store(0, Ordering::Relaxed);
            r.conn(
                "accept",
                None,
                Some(Dir::Recv),
                l.dev,
                l.link,
                end.saturating_sub(start),
                code,
            );
            r.error(None, Some(l.dev), "accept", code);
            return code;
        }
        let inner = if recv_comm.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: NCCL's out pointer, just written by the real plugin.
            unsafe { *recv_comm }
        };
        if inner.is_null() {
            return code;
        }
        l.accept_start.store(0, Ordering::Relaxed);
        let wrapper = r.new_comm(Dir::Recv, l.dev, l.link, inner);
        // SAFETY: the wrapper was just made and lives until closeRecv.
        let c = unsafe { &*wrapper };
        r.conn(
            "accept",
            Some(c),
            Some(Dir::Recv),
            l.dev,
            l.link,
            end.saturating_sub(start),
            code,
        );
        // SAFETY: NCCL's out pointer; NCCL holds the wrapper instead of the real comm.
        unsafe { *recv_comm = wrapper.cast() };
        code
    })
}

/// The real plugin's comm behind what NCCL passed, with the wrapper when recording.
fn unwrap(comm: Comm) -> Result<(Comm, Option<&'static ShimComm>), NcclResult> {
    let recording = state::shim().is_some_and(|s| s.recording.is_some());
    if !recording {
        return Ok((comm, None));
    }
    // SAFETY: while recording, every comm NCCL holds is a wrapper this shim returned.
    match unsafe { comm_of(comm) }? {
        Some(c) => Ok((c.inner, Some(c))),
        None => Ok((comm, None)),
    }
}

/// Runs `f` on the real plugin with the real comm behind `comm`; an error is recorded.
fn on_comm(
    comm: Comm,
    call: &'static str,
    f: impl FnOnce(&'static state::Shim, Comm) -> NcclResult,
) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let (inner, c) = match unwrap(comm) {
            Ok(x) => x,
            Err(code) => return code,
        };
        let code = f(s, inner);
        if code != NCCL_SUCCESS {
            if let Some(r) = s.recording.as_ref() {
                r.error(c, None, call, code);
            }
        }
        code
    })
}

// ---- registrations -------------------------------------------------------------------------------

unsafe extern "C" fn reg_mr_size_t(
    comm: Comm,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    on_comm(comm, "regMr", |s, c| {
        s.inner.reg_mr(c, data, size, ptr_type, mhandle)
    })
}

unsafe extern "C" fn reg_mr_int(
    comm: Comm,
    data: *mut c_void,
    size: c_int,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    // A negative int size reaches a size_t plugin as NCCL would pass it: sign-extended.
    on_comm(comm, "regMr", |s, c| {
        s.inner
            .reg_mr(c, data, size as isize as usize, ptr_type, mhandle)
    })
}

unsafe extern "C" fn reg_mr_dma_buf(
    comm: Comm,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    on_comm(comm, "regMrDmaBuf", |s, c| {
        s.inner
            .reg_mr_dma_buf(c, data, size, ptr_type, offset, fd, mhandle)
    })
}

unsafe extern "C" fn dereg_mr(comm: Comm, mhandle: *mut c_void) -> NcclResult {
    on_comm(comm, "deregMr", |s, c| s.inner.dereg_mr(c, mhandle))
}

unsafe extern "C" fn get_device_mr(
    comm: Comm,
    mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> NcclResult {
    on_comm(comm, "getDeviceMr", |s, c| {
        s.inner.get_device_mr(c, mhandle, dptr_mhandle)
    })
}

// ---- data path -----------------------------------------------------------------------------------

/// After a successful post: NCCL gets a slot standing for the real request, when the comm is
/// tracked and a slot is free (else the real request, untracked and counted).
fn track(c: &ShimComm, r: &Recording, request: *mut *mut c_void, t0: u64, bytes: u64, n: u32) {
    if request.is_null() {
        return;
    }
    // SAFETY: NCCL's out pointer, just written by the real plugin.
    let req = unsafe { *request };
    if req.is_null() {
        return; // "busy": NCCL posts again later
    }
    let Some(t) = c.tracked.as_ref() else {
        return;
    };
    if let Some(slot) = r.rec.claim(t.block, &c.hint) {
        slot.post(req, t.stats, t0, bytes, n);
        // SAFETY: as above; NCCL holds the slot's address as its request.
        unsafe { *request = (slot as *const crate::recorder::Slot).cast_mut().cast() };
    }
}

fn isend_common(
    comm: Comm,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let (inner, c) = match unwrap(comm) {
            Ok(x) => x,
            Err(code) => return code,
        };
        let (Some(r), Some(c)) = (s.recording.as_ref(), c) else {
            return s.inner.isend(inner, data, size, tag, mhandle, request);
        };
        let t0 = r.rec.now_ns();
        let code = s.inner.isend(inner, data, size, tag, mhandle, request);
        if code != NCCL_SUCCESS {
            r.error(Some(c), None, "isend", code);
            return code;
        }
        track(c, r, request, t0, size as u64, 1);
        code
    })
}

unsafe extern "C" fn isend_size_t(
    comm: Comm,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    isend_common(comm, data, size, tag, mhandle, request)
}

unsafe extern "C" fn isend_int(
    comm: Comm,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // A negative int reaches a size_t plugin sign-extended, as a C cast would pass it.
    isend_common(comm, data, size as isize as usize, tag, mhandle, request)
}

/// Posted bytes of a grouped receive.
fn posted_bytes<T: Copy + TryInto<u64>>(n: c_int, sizes: *const T) -> u64 {
    let count = usize::try_from(n).unwrap_or(0).min(MAX_GROUPED);
    if sizes.is_null() {
        return 0;
    }
    (0..count)
        .map(|i| {
            // SAFETY: NCCL passes `n` sizes; i < n.
            let v = unsafe { *sizes.add(i) };
            v.try_into().unwrap_or(0)
        })
        .sum()
}

fn irecv_common(
    comm: Comm,
    n: c_int,
    posted: u64,
    post: impl FnOnce(&'static state::Shim, Comm) -> NcclResult,
    request: *mut *mut c_void,
) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let (inner, c) = match unwrap(comm) {
            Ok(x) => x,
            Err(code) => return code,
        };
        let (Some(r), Some(c)) = (s.recording.as_ref(), c) else {
            return post(s, inner);
        };
        let t0 = r.rec.now_ns();
        let code = post(s, inner);
        if code != NCCL_SUCCESS {
            r.error(Some(c), None, "irecv", code);
            return code;
        }
        track(
            c,
            r,
            request,
            t0,
            posted,
            n.clamp(1, MAX_GROUPED as c_int) as u32,
        );
        code
    })
}

unsafe extern "C" fn irecv_size_t(
    comm: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let posted = posted_bytes(n, sizes.cast_const());
    irecv_common(
        comm,
        n,
        posted,
        |s, c| {
            s.inner
                .irecv_usize(c, n, data, sizes, tags, mhandles, request)
        },
        request,
    )
}

unsafe extern "C" fn irecv_int(
    comm: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let posted = posted_bytes(n, sizes.cast_const());
    irecv_common(
        comm,
        n,
        posted,
        |s, c| {
            s.inner
                .irecv_int(c, n, data, sizes, tags, mhandles, request)
        },
        request,
    )
}

unsafe extern "C" fn iflush(
    comm: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // A flush request stays the real plugin's own: `test` passes it through uncounted.
    on_comm(comm, "iflush", |s, c| {
        s.inner.iflush(c, n, data, sizes, mhandles, request)
    })
}

/// What `test` writes in a size it did not fill (restored before NCCL sees it).
const UNWRITTEN: c_int = c_int::MIN;

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let Some(r) = s.recording.as_ref() else {
            return s.inner.test(request, done, sizes);
        };
        let Some(slot) = r.rec.slot_of(request) else {
            return s.inner.test(request, done, sizes);
        };
        if !slot.is_posted() {
            state::log(
                s.logger,
                NCCL_LOG_WARN,
                "test on a request that already completed (the shim no longer knows the real \
                 plugin's request)",
            );
            return NCCL_INTERNAL_ERROR;
        }
        // Sizes the real plugin leaves alone keep NCCL's values; a marker tells them apart.
        let n = (slot.n() as usize).clamp(1, MAX_GROUPED);
        let mut saved = [0 as c_int; MAX_GROUPED];
        if !sizes.is_null() {
            for (i, v) in saved.iter_mut().enumerate().take(n) {
                // SAFETY: NCCL passes room for the request's sizes (n of them).
                unsafe {
                    *v = *sizes.add(i);
                    *sizes.add(i) = UNWRITTEN;
                }
            }
        }
        let code = s.inner.test(slot.inner(), done, sizes);
        let now = r.rec.now_ns();
        let mut reported: Option<u64> = (!sizes.is_null()).then_some(0);
        if !sizes.is_null() {
            for (i, v) in saved.iter().enumerate().take(n) {
                // SAFETY: as above.
                let got = unsafe { *sizes.add(i) };
                if got == UNWRITTEN {
                    // SAFETY: as above: NCCL's own value back.
                    unsafe { *sizes.add(i) = *v };
                    reported = None;
                } else if let Some(sum) = reported.as_mut() {
                    *sum += u64::try_from(got).unwrap_or(0);
                }
            }
        }
        let stats = slot.stats();
        if code != NCCL_SUCCESS {
            if let Some(st) = stats {
                st.errors.fetch_add(1, Ordering::Relaxed);
                r.rec.error_event(crate::recorder::ErrorEvent {
                    t: r.rec.now_s(),
                    comm: Some(st.id),
                    dev: Some(st.dev),
                    link: Some(st.link),
                    call: "test",
                    code,
                });
            }
            return code;
        }
        // SAFETY: NCCL's done flag, just written by the real plugin.
        let finished = !done.is_null() && unsafe { *done } != 0;
        if finished {
            let hold = r.hold_recv && stats.is_some_and(|st| st.dir == Dir::Recv);
            slot.complete(reported, now, hold);
        }
        code
    })
}

unsafe extern "C" fn irecv_consumed(comm: Comm, n: c_int, request: *mut c_void) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let (inner, c) = match unwrap(comm) {
            Ok(x) => x,
            Err(code) => return code,
        };
        let Some(r) = s.recording.as_ref() else {
            return s.inner.irecv_consumed(inner, n, request);
        };
        let Some(slot) = r.rec.slot_of(request) else {
            return s.inner.irecv_consumed(inner, n, request);
        };
        if !slot.is_held() {
            state::log(
                s.logger,
                NCCL_LOG_WARN,
                "irecvConsumed on a receive the shim already recycled (more receives left \
                 unconsumed on one comm than its slots)",
            );
            return NCCL_INTERNAL_ERROR;
        }
        let code = s.inner.irecv_consumed(inner, n, slot.inner());
        if code == NCCL_SUCCESS {
            slot.release();
        } else {
            r.error(c, None, "irecvConsumed", code);
        }
        code
    })
}

// ---- closing -------------------------------------------------------------------------------------

fn close_comm(
    comm: Comm,
    call: &'static str,
    close: fn(&crate::inner::Inner, Comm) -> NcclResult,
) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        let (inner, c) = match unwrap(comm) {
            Ok(x) => x,
            Err(code) => return code,
        };
        let code = close(s.inner, inner);
        match (s.recording.as_ref(), c) {
            (Some(r), Some(c)) if code == NCCL_SUCCESS => {
                if let Some(t) = c.tracked.as_ref() {
                    r.rec.close_comm(t);
                }
                // SAFETY: the wrapper came from Box::into_raw at connect/accept; NCCL closed
                // the comm and does not use it again.
                drop(unsafe { Box::from_raw(comm.cast::<ShimComm>()) });
            }
            (Some(r), c) if code != NCCL_SUCCESS => r.error(c, None, call, code),
            _ => {}
        }
        code
    })
}

unsafe extern "C" fn close_send(comm: Comm) -> NcclResult {
    close_comm(comm, "closeSend", |i, c| i.close_send(c))
}

unsafe extern "C" fn close_recv(comm: Comm) -> NcclResult {
    close_comm(comm, "closeRecv", |i, c| i.close_recv(c))
}

unsafe extern "C" fn close_listen(comm: Comm) -> NcclResult {
    guard(|| {
        let Some(s) = state::shim() else {
            return NCCL_INTERNAL_ERROR;
        };
        if s.recording.is_none() {
            return s.inner.close_listen(comm);
        }
        // SAFETY: while recording, NCCL holds listen wrappers this shim returned.
        let l = match unsafe { listen_of(comm) } {
            Ok(Some(l)) => l,
            Ok(None) => return s.inner.close_listen(comm),
            Err(code) => return code,
        };
        let code = s.inner.close_listen(l.inner);
        if code == NCCL_SUCCESS {
            // SAFETY: the wrapper came from Box::into_raw at listen; NCCL closed it.
            drop(unsafe { Box::from_raw(comm.cast::<state::ShimListen>()) });
        } else if let Some(r) = s.recording.as_ref() {
            r.error(None, Some(l.dev), "closeListen", code);
        }
        code
    })
}
