//! libnccl, loaded at run time: the in-tool reference the other backends are measured against.
//!
//! No link-time dependency: [`Nccl::load`] opens `libnccl.so.2` with `libloading` (or the path in
//! `TCPX_NCCL_LIB`), checks `ncclGetVersion` against [`MIN_NCCL_VERSION`], and resolves the few
//! entry points used here. [`Comm`] owns one communicator; its operations take `tcpx_gpu`
//! buffers and streams, so the only raw device pointers are built here from checked ranges.
//!
//! Nothing waits forever: [`Comm::init_rank`] uses NCCL's non-blocking mode and polls
//! `ncclCommGetAsyncError` up to a deadline, aborting the communicator when it passes; completion
//! of queued operations is waited for on the `tcpx_gpu::Stream` with its own deadline, after which
//! the caller should [`Comm::abort`]. Errors name the `ncclResult_t` and `ncclGetLastError` text.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tcpx_model::Backoff;

use tcpx_gpu::{DeviceBuffer, GpuError, Stream};

/// Oldest NCCL accepted: 2.18 has everything used here (non-blocking init with `ncclConfig_t`,
/// `ncclGetLastError`, `ncclCommGetAsyncError`, point-to-point in groups).
pub const MIN_NCCL_VERSION: NcclVersion = NcclVersion {
    major: 2,
    minor: 18,
    patch: 0,
};

/// Size of an `ncclUniqueId`, fixed by nccl.h.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclResult_t` codes (nccl.h): the same enum as the plugin ABI's.
pub use crate::abi::{
    result_c_name, NcclResult, NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE,
    NCCL_IN_PROGRESS, NCCL_REMOTE_ERROR, NCCL_SUCCESS, NCCL_SYSTEM_ERROR,
    NCCL_UNHANDLED_CUDA_ERROR,
};

/// `ncclDataType_t` values used here.
const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT32: c_int = 7;
/// `ncclRedOp_t::ncclSum`.
const NCCL_SUM: c_int = 0;

/// `ncclUniqueId`: 128 opaque bytes made by one rank and handed to the others out of band
/// (the tool's own control connection).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }
    pub fn from_bytes(b: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        NcclUniqueId {
            internal: b.map(|c| c as c_char),
        }
    }
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId({:02x?}..)", &self.to_bytes()[..8])
    }
}

/// `ncclConfig_t` as nccl.h 2.17 lays it out. NCCL reads `size` and `version` and fills the
/// fields a newer header would add with their defaults, so this prefix is valid for every
/// release from 2.17 on.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfigV217 {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: "leave to NCCL".
const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

impl NcclConfigV217 {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking` set as given.
    pub fn new(blocking: bool) -> Self {
        NcclConfigV217 {
            size: std::mem::size_of::<NcclConfigV217>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: blocking as c_int,
            cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
            min_ctas: NCCL_CONFIG_UNDEF_INT,
            max_ctas: NCCL_CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: NCCL_CONFIG_UNDEF_INT,
        }
    }
}

/// Opaque `ncclComm_t`.
pub type RawComm = *mut c_void;

/// A version as `ncclGetVersion` encodes it (major*10000 + minor*100 + patch since 2.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    pub fn from_code(code: c_int) -> Self {
        let c = code.max(0) as u32;
        if c >= 10000 {
            NcclVersion {
                major: c / 10000,
                minor: (c / 100) % 100,
                patch: c % 100,
            }
        } else {
            // Before 2.9: major*1000 + minor*100 + patch.
            NcclVersion {
                major: c / 1000,
                minor: (c / 100) % 10,
                patch: c % 100,
            }
        }
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Everything that can go wrong with libnccl, each saying what to check next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcclError {
    #[error(
        "libnccl could not be loaded (tried {tried}): install NCCL 2.18+ (e.g. the nvidia-nccl \
         wheel or the libnccl2 package), add its folder to LD_LIBRARY_PATH, or set TCPX_NCCL_LIB \
         to the library's path"
    )]
    Missing { tried: String },
    #[error("{path} has no symbol {symbol}: it is not libnccl, or older than {MIN_NCCL_VERSION}")]
    Symbol { path: String, symbol: &'static str },
    #[error("{path} is NCCL {found}, older than the {MIN_NCCL_VERSION} this tool needs: install a newer NCCL")]
    Version { path: String, found: NcclVersion },
    #[error("{call} returned {name} ({code}): {text}; NCCL's last error: {last}. Run with NCCL_DEBUG=WARN for NCCL's own account")]
    Call {
        call: &'static str,
        name: &'static str,
        code: NcclResult,
        text: String,
        last: String,
    },
    #[error("{what} did not finish within {after:?}: the peer rank may be gone or stuck; the communicator was aborted")]
    Timeout { what: &'static str, after: Duration },
    #[error("{0}")]
    Gpu(#[from] GpuError),
    #[error("invalid argument: {0}")]
    Argument(String),
}

type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type FnGetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult;
type FnCommInitRankConfig = unsafe extern "C" fn(
    *mut RawComm,
    c_int,
    NcclUniqueId,
    c_int,
    *mut NcclConfigV217,
) -> NcclResult;
type FnCommOnly = unsafe extern "C" fn(RawComm) -> NcclResult;
type FnGetAsyncError = unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult;
type FnGroup = unsafe extern "C" fn() -> NcclResult;
type FnSend =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, *mut c_void) -> NcclResult;
type FnRecv =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> NcclResult;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
type FnErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;
type FnLastError = unsafe extern "C" fn(RawComm) -> *const c_char;

/// The loaded library and its entry points.
pub struct Nccl {
    path: String,
    version: NcclVersion,
    get_unique_id: FnGetUniqueId,
    comm_init_rank_config: FnCommInitRankConfig,
    comm_destroy: FnCommOnly,
    comm_abort: FnCommOnly,
    comm_get_async_error: FnGetAsyncError,
    group_start: FnGroup,
    group_end: FnGroup,
    send: FnSend,
    recv: FnRecv,
    all_reduce: FnAllReduce,
    get_error_string: FnErrorString,
    get_last_error: FnLastError,
    /// Keeps the code above mapped.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL {} from {}", self.version, self.path)
    }
}

static DEFAULT: OnceLock<Result<&'static Nccl, NcclError>> = OnceLock::new();

impl Nccl {
    /// Loads libnccl once per process: `TCPX_NCCL_LIB` if set, else `libnccl.so.2` and
    /// `libnccl.so` through the loader path.
    pub fn load() -> Result<&'static Nccl, NcclError> {
        DEFAULT
            .get_or_init(|| {
                let names: Vec<String> = match std::env::var("TCPX_NCCL_LIB") {
                    Ok(p) if !p.is_empty() => vec![p],
                    _ => vec!["libnccl.so.2".into(), "libnccl.so".into()],
                };
                let mut tried = Vec::new();
                for name in &names {
                    match Nccl::load_from(name) {
                        Ok(n) => return Ok(&*Box::leak(Box::new(n))),
                        Err(NcclError::Missing { tried: t }) => tried.push(t),
                        Err(e) => return Err(e),
                    }
                }
                Err(NcclError::Missing {
                    tried: tried.join("; "),
                })
            })
            .clone()
    }

    /// Loads libnccl from `path` (a file path or a soname) and checks its version.
    pub fn load_from(path: &str) -> Result<Nccl, NcclError> {
        // SAFETY: dlopen of a library the user named as libnccl; its initialisers only set up
        // NCCL's own state.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            let mut t = format!("{path}: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                t = format!("{t}: {s}");
                src = s.source();
            }
            NcclError::Missing { tried: t }
        })?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the symbol is looked up with the signature nccl.h declares for it.
                let s: Result<libloading::Symbol<$ty>, _> =
                    unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                *s.map_err(|_| NcclError::Symbol {
                    path: path.to_string(),
                    symbol: $name,
                })?
            }};
        }
        let get_version: FnGetVersion = sym!("ncclGetVersion", FnGetVersion);
        let mut code: c_int = 0;
        // SAFETY: valid out pointer for the duration of the call.
        let r = unsafe { get_version(&mut code) };
        let version = NcclVersion::from_code(code);
        if r != NCCL_SUCCESS || version < MIN_NCCL_VERSION || version.major != 2 {
            return Err(NcclError::Version {
                path: path.to_string(),
                found: version,
            });
        }
        Ok(Nccl {
            path: path.to_string(),
            version,
            get_unique_id: sym!("ncclGetUniqueId", FnGetUniqueId),
            comm_init_rank_config: sym!("ncclCommInitRankConfig", FnCommInitRankConfig),
            comm_destroy: sym!("ncclCommDestroy", FnCommOnly),
            comm_abort: sym!("ncclCommAbort", FnCommOnly),
            comm_get_async_error: sym!("ncclCommGetAsyncError", FnGetAsyncError),
            group_start: sym!("ncclGroupStart", FnGroup),
            group_end: sym!("ncclGroupEnd", FnGroup),
            send: sym!("ncclSend", FnSend),
            recv: sym!("ncclRecv", FnRecv),
            all_reduce: sym!("ncclAllReduce", FnAllReduce),
            get_error_string: sym!("ncclGetErrorString", FnErrorString),
            get_last_error: sym!("ncclGetLastError", FnLastError),
            _lib: lib,
        })
    }

    pub fn version(&self) -> NcclVersion {
        self.version
    }
    pub fn path(&self) -> &str {
        &self.path
    }

    fn check(&self, call: &'static str, code: NcclResult, comm: RawComm) -> Result<(), NcclError> {
        if code == NCCL_SUCCESS || code == NCCL_IN_PROGRESS {
            return Ok(());
        }
        Err(self.error(call, code, comm))
    }

    fn error(&self, call: &'static str, code: NcclResult, comm: RawComm) -> NcclError {
        // SAFETY: both return pointers to static or comm-owned NUL-terminated strings (or null).
        let text = unsafe { cstr((self.get_error_string)(code)) };
        // SAFETY: as above; a null comm asks for the last error of this thread.
        let last = unsafe { cstr((self.get_last_error)(comm)) };
        NcclError::Call {
            call,
            name: result_c_name(code),
            code,
            text,
            last,
        }
    }

    /// A fresh unique id (rank 0 makes it and sends it to the others).
    pub fn unique_id(&self) -> Result<NcclUniqueId, NcclError> {
        let mut id = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out pointer to a 128-byte ncclUniqueId.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(id)
    }

    /// Runs `ops` between `ncclGroupStart` and `ncclGroupEnd`, so that sends and receives queued
    /// inside (on one or several communicators) are matched together instead of deadlocking.
    /// With non-blocking communicators the group's launch may still be in flight on return:
    /// [`Comm::wait_ready`] waits for it.
    pub fn group<T>(&self, ops: impl FnOnce() -> Result<T, NcclError>) -> Result<T, NcclError> {
        // SAFETY: no arguments; groups nest per thread.
        let r = unsafe { (self.group_start)() };
        self.check("ncclGroupStart", r, std::ptr::null_mut())?;
        let out = ops();
        // The group must be closed even when an op failed, or this thread's group depth leaks.
        // SAFETY: matches the ncclGroupStart above.
        let r = unsafe { (self.group_end)() };
        let out = out?;
        self.check("ncclGroupEnd", r, std::ptr::null_mut())?;
        Ok(out)
    }
}

/// Copies a C string NCCL returned (null becomes empty).
///
/// # Safety
/// `p` is null or points at a NUL-terminated string valid for the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the function's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// One rank's communicator, on one GPU. Destroyed on drop (aborted if it failed).
pub struct Comm {
    nccl: &'static Nccl,
    raw: RawComm,
    device: tcpx_gpu::Device,
    rank: usize,
    nranks: usize,
    failed: bool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent, which `&mut self` on every operation guarantees.
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NCCL comm rank {}/{} on {:?}",
            self.rank, self.nranks, self.device
        )
    }
}

impl Comm {
    /// `ncclCommInitRankConfig` in non-blocking mode on `device`, waiting at most `deadline` for
    /// all `nranks` ranks to join (each calls this with the same `id`).
    pub fn init_rank(
        nccl: &'static Nccl,
        device: &tcpx_gpu::Device,
        nranks: usize,
        rank: usize,
        id: &NcclUniqueId,
        deadline: Duration,
    ) -> Result<Comm, NcclError> {
        if rank >= nranks || nranks > c_int::MAX as usize {
            return Err(NcclError::Argument(format!(
                "rank {rank} of {nranks} ranks"
            )));
        }
        device.make_current()?;
        let mut raw: RawComm = std::ptr::null_mut();
        let mut config = NcclConfigV217::new(false);
        // SAFETY: `raw` and `config` are valid for the call; the id is passed by value as nccl.h
        // declares; NCCL uses the context made current above.
        let r = unsafe {
            (nccl.comm_init_rank_config)(&mut raw, nranks as c_int, *id, rank as c_int, &mut config)
        };
        if r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS {
            let e = nccl.error("ncclCommInitRankConfig", r, raw);
            if !raw.is_null() {
                // SAFETY: NCCL returned this comm; aborting frees it.
                unsafe { (nccl.comm_abort)(raw) };
            }
            return Err(e);
        }
        let mut comm = Comm {
            nccl,
            raw,
            device: device.clone(),
            rank,
            nranks,
            failed: false,
        };
        comm.wait_ready("ncclCommInitRankConfig", deadline)?;
        Ok(comm)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn device(&self) -> &tcpx_gpu::Device {
        &self.device
    }

    /// Polls `ncclCommGetAsyncError` until the last call on this comm left `ncclInProgress`,
    /// at most `limit`; a timeout or error marks the comm failed (it is aborted on drop).
    pub fn wait_ready(&mut self, what: &'static str, limit: Duration) -> Result<(), NcclError> {
        let start = Instant::now();
        let mut naps = Backoff::doubling(Duration::from_micros(10), Duration::from_millis(2));
        loop {
            let mut state: NcclResult = NCCL_SUCCESS;
            // SAFETY: live comm, valid out pointer.
            let r = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut state) };
            if r != NCCL_SUCCESS {
                self.failed = true;
                return Err(self.nccl.error("ncclCommGetAsyncError", r, self.raw));
            }
            match state {
                NCCL_SUCCESS => return Ok(()),
                NCCL_IN_PROGRESS => {}
                code => {
                    self.failed = true;
                    return Err(self.nccl.error(what, code, self.raw));
                }
            }
            if start.elapsed() > limit {
                self.failed = true;
                return Err(NcclError::Timeout {
                    what,
                    after: start.elapsed(),
                });
            }
            naps.pause();
        }
    }

    /// Checks for an error NCCL hit in the background (a peer gone, a network error).
    pub fn async_error(&mut self) -> Result<(), NcclError> {
        let mut state: NcclResult = NCCL_SUCCESS;
        // SAFETY: live comm, valid out pointer.
        let r = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut state) };
        self.nccl.check("ncclCommGetAsyncError", r, self.raw)?;
        if state != NCCL_SUCCESS && state != NCCL_IN_PROGRESS {
            self.failed = true;
            return Err(self.nccl.error("(asynchronous)", state, self.raw));
        }
        Ok(())
    }

    fn range(&self, buf: &DeviceBuffer, offset: usize, len: usize) -> Result<u64, NcclError> {
        if buf.device().index() != self.device.index() {
            return Err(NcclError::Argument(format!(
                "buffer on GPU {} used with a communicator on GPU {}",
                buf.device().index(),
                self.device.index()
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(buf.device_ptr() + offset as u64),
            _ => Err(NcclError::Gpu(GpuError::OutOfBounds {
                offset,
                len,
                size: buf.len(),
            })),
        }
    }

    fn stream_ok(&self, stream: &Stream) -> Result<(), NcclError> {
        if stream.device().index() != self.device.index() {
            return Err(NcclError::Argument(format!(
                "stream of GPU {} used with a communicator on GPU {}",
                stream.device().index(),
                self.device.index()
            )));
        }
        Ok(())
    }

    /// Queues `ncclSend` of `buf[offset..offset + len]` to `peer` on `stream` (call inside
    /// [`Nccl::group`] when the peer also sends, or both block).
    pub fn send(
        &mut self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let (nccl, comm) = (self.nccl, self.raw);
        self.queue_p2p("ncclSend", (buf, offset, len), stream, |p| {
            // SAFETY: the range is inside a live device buffer of this comm's GPU (checked); NCCL
            // reads it from `stream`, whose buffers outlive queued work (their drops wait for the
            // GPU).
            unsafe {
                (nccl.send)(
                    p as *const c_void,
                    len,
                    NCCL_UINT8,
                    peer as c_int,
                    comm,
                    stream.raw(),
                )
            }
        })
    }

    /// Queues `ncclRecv` into `buf[offset..offset + len]` from `peer` on `stream`.
    pub fn recv(
        &mut self,
        buf: &DeviceBuffer,
        offset: usize,
        len: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let (nccl, comm) = (self.nccl, self.raw);
        self.queue_p2p("ncclRecv", (buf, offset, len), stream, |p| {
            // SAFETY: as in `send`; NCCL writes only the checked device range.
            unsafe {
                (nccl.recv)(
                    p as *mut c_void,
                    len,
                    NCCL_UINT8,
                    peer as c_int,
                    comm,
                    stream.raw(),
                )
            }
        })
    }

    /// Checks `buf[offset..offset + len]` and `stream` against this comm's GPU, makes the GPU
    /// current and queues `call` (the `name`d NCCL call) with the range's device address.
    fn queue_p2p(
        &self,
        name: &'static str,
        (buf, offset, len): (&DeviceBuffer, usize, usize),
        stream: &Stream,
        call: impl FnOnce(u64) -> NcclResult,
    ) -> Result<(), NcclError> {
        let p = self.range(buf, offset, len)?;
        self.stream_ok(stream)?;
        self.device.make_current()?;
        let r = call(p);
        self.nccl.check(name, r, self.raw)
    }

    /// Queues an in-place-capable sum all-reduce of `count` f32 values from `send` into `recv`.
    pub fn all_reduce_f32_sum(
        &mut self,
        send: &DeviceBuffer,
        recv: &DeviceBuffer,
        count: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let bytes = count
            .checked_mul(4)
            .ok_or_else(|| NcclError::Argument("count overflows".into()))?;
        let s = self.range(send, 0, bytes)?;
        let d = self.range(recv, 0, bytes)?;
        self.stream_ok(stream)?;
        self.device.make_current()?;
        // SAFETY: both ranges are inside live device buffers of this GPU (checked).
        let r = unsafe {
            (self.nccl.all_reduce)(
                s as *const c_void,
                d as *mut c_void,
                count,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.raw,
                stream.raw(),
            )
        };
        self.nccl.check("ncclAllReduce", r, self.raw)
    }

    /// Aborts the communicator now (frees it without waiting for peers or queued work).
    pub fn abort(mut self) {
        self.failed = true;
        drop(self);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let _ = self.device.make_current();
        // SAFETY: the comm is live and dropped once; abort also covers a failed or stuck comm,
        // destroy flushes a healthy one.
        unsafe {
            if self.failed {
                (self.nccl.comm_abort)(self.raw);
            } else if (self.nccl.comm_destroy)(self.raw) == NCCL_IN_PROGRESS {
                // Non-blocking destroy: give it a bounded time, then abort what is left.
                let _ = self.wait_ready("ncclCommDestroy", Duration::from_secs(10));
            }
        }
        self.raw = std::ptr::null_mut();
    }
}

/// nccl-tests' bus bandwidth for an all-reduce: algorithm bandwidth times `2 (n - 1) / n`.
pub fn allreduce_bus_bandwidth(bytes: usize, seconds: f64, nranks: usize) -> f64 {
    let algbw = bytes as f64 / seconds;
    algbw * 2.0 * (nranks as f64 - 1.0) / nranks as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nccl_h() {
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
        assert_eq!(std::mem::align_of::<NcclUniqueId>(), 1);
        // size_t, 2 x unsigned, 4 x int, pointer, int (+ tail padding) on LP64.
        assert_eq!(std::mem::size_of::<NcclConfigV217>(), 48);
        assert_eq!(std::mem::offset_of!(NcclConfigV217, blocking), 16);
        assert_eq!(std::mem::offset_of!(NcclConfigV217, net_name), 32);
        assert_eq!(std::mem::offset_of!(NcclConfigV217, split_share), 40);
    }

    #[test]
    fn version_codes_decode() {
        for (code, (major, minor, patch)) in [(22703, (2, 27, 3)), (2804, (2, 8, 4))] {
            let want = NcclVersion {
                major,
                minor,
                patch,
            };
            assert_eq!(NcclVersion::from_code(code), want, "{code}");
        }
        assert!(NcclVersion::from_code(21805) >= MIN_NCCL_VERSION);
        assert!(NcclVersion::from_code(21703) < MIN_NCCL_VERSION);
        assert_eq!(NcclVersion::from_code(22102).to_string(), "2.21.2");
    }

    #[test]
    fn unique_id_bytes_round_trip() {
        let b: [u8; 128] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(NcclUniqueId::from_bytes(&b).to_bytes(), b);
    }

    #[test]
    fn a_missing_or_foreign_library_is_a_clear_error() {
        match Nccl::load_from("/nonexistent/libnccl.so.2") {
            Err(NcclError::Missing { tried }) => {
                assert!(tried.contains("/nonexistent/libnccl.so.2"), "{tried}")
            }
            other => panic!("{other:?}"),
        }
        // libc is a real library without NCCL's symbols.
        match Nccl::load_from("libc.so.6") {
            Err(NcclError::Symbol { symbol, .. }) => assert_eq!(symbol, "ncclGetVersion"),
            other => panic!("{other:?}"),
        }
    }

    /// Builds a stand-in libnccl exporting only `ncclGetVersion` (answering `code`) with the C
    /// compiler tcpx-ffi's build script needs anyway.
    fn fake_nccl(code: i32) -> Option<std::path::PathBuf> {
        let dir =
            std::env::temp_dir().join(format!("tcpx-fake-nccl-{}-{code}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let c = dir.join("fake.c");
        let so = dir.join("libnccl.so.2");
        std::fs::write(
            &c,
            format!("int ncclGetVersion(int* v) {{ *v = {code}; return 0; }}\n"),
        )
        .ok()?;
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .status();
        matches!(built, Ok(s) if s.success()).then_some(so)
    }

    #[test]
    fn an_old_or_incomplete_libnccl_is_refused_by_name() {
        let (Some(old), Some(new)) = (fake_nccl(21304), fake_nccl(22803)) else {
            eprintln!("SKIP: an_old_or_incomplete_libnccl_is_refused_by_name: no C compiler (cc)");
            return;
        };
        match Nccl::load_from(old.to_str().unwrap()) {
            Err(e @ NcclError::Version { .. }) => {
                assert!(e.to_string().contains("NCCL 2.13.4"), "{e}");
                assert!(e.to_string().contains("2.18.0"), "{e}");
            }
            other => panic!("NCCL 2.13.4 gave {other:?}"),
        }
        // New enough, but not a real libnccl: the first missing entry point is named.
        match Nccl::load_from(new.to_str().unwrap()) {
            Err(NcclError::Symbol { symbol, .. }) => assert_eq!(symbol, "ncclGetUniqueId"),
            other => panic!("{other:?}"),
        }
        for p in [old, new] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }

    #[test]
    fn busbw_follows_nccl_tests() {
        assert_eq!(allreduce_bus_bandwidth(1000, 1.0, 2), 1000.0);
        assert_eq!(allreduce_bus_bandwidth(1000, 1.0, 4), 1500.0);
    }

    #[test]
    fn result_names() {
        assert_eq!(result_c_name(NCCL_REMOTE_ERROR), "ncclRemoteError");
        assert_eq!(result_c_name(42), "unknown ncclResult_t");
    }
}
