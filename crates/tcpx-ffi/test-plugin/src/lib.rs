//! tcpx-test-plugin: a working NCCL net plugin (`ncclNetPlugin_v7`, named "tcpx-test-plugin")
//! that moves bytes over loopback TCP, so that the production plugin path runs end to end where
//! no GPUDirect-TCPX NIC exists.
//!
//! It keeps GPUDirect-TCPX's rules: n == 1, at most 16 requests per comm, `test` only on the
//! oldest unfinished request, FIFO matching, tags ignored, connect/accept answer "not yet" with a
//! NULL comm until the TCP connection is up, accept writes the device handle into storage the
//! caller provides.
//!
//! Environment, read once by `init`:
//! - `TCPX_TEST_PLUGIN_MODE=host` (default): received bytes go straight into the receive buffer,
//!   `test` reports sizes, device type HOST.
//! - `TCPX_TEST_PLUGIN_MODE=unpack`: TCPX-like delivery. Device type UNPACK, version 0x7; accept's
//!   device handle points to an unpack handle `{meta, bounce_buf, head = u64::MAX}` in host memory.
//!   Received bytes land in fragments of 2 to 4 KiB at random offsets inside shuffled 4 KiB pages
//!   of a bounce buffer; receive `i` describes them in `meta.mem[i % 16]` and stores the count in
//!   `meta.cnt[i % 16]` after a release fence; `test` does not write sizes; the pages are held
//!   until `irecvConsumed` (FIFO). Registrations must be 4 KiB aligned, one irecv at most 4 MiB.
//! - GPU memory (where a CUDA driver is present, `ptrSupport` adds CUDA): `regMr` takes CUDA
//!   pointers (4 KiB aligned) with the GPU's context current, as GPUDirect-TCPX does. In host mode
//!   their bytes are staged through host memory inside the plugin. In unpack mode, when a CUDA
//!   context is current at `accept`, the comm is a GPU comm like TCPX's: the bounce buffer is
//!   device memory, the unpack handle itself is device memory (its `meta` host memory mapped to
//!   the device), received bytes are copied into the shuffled 4 KiB bounce pages on the GPU and
//!   the metadata is filled exactly as in host unpack mode; the caller unpacks with a GPU kernel.
//! - `TCPX_TEST_PLUGIN_FAULT`: comma-separated faults: `<fn>:<code>` (every call of `fn` answers
//!   `code`), `<fn>:<code>@<n>` (only the n-th call, from 1), `busy:<fn>@<n>` (the n-th isend or
//!   irecv answers success with a NULL request), `null_fn:<fn>` (`init` clears that table entry),
//!   `block:<fn>` (every call of `fn` blocks forever, as a close stuck inside a plugin),
//!   `never_complete` (sends never make progress, so nothing completes), `accept_together:<n>`
//!   (no accept completes before `n` listen comms have each been polled by `accept`, as a caller
//!   that accepts its channels one after another never gets through GPUDirect-TCPX's accepts,
//!   which each take over 5 s, within a deadline that covers them together),
//!   `slow_dev:<dev>:<us per MiB>` (device `dev` is a slow NIC: each send comm on it moves one
//!   message at a time at that pace, a message's bytes leaving no earlier than the previous one's
//!   time is up and its send reported done only once its own is, so both ends of its comms see
//!   the rate; other devices are untouched).
//! - `TCPX_TEST_PLUGIN_DEVICES=<n>`: number of devices (default 1).
//! - `TCPX_TEST_PLUGIN_MAX_COMMS=<n>`: the `maxComms` the properties report (default 65536), so
//!   a caller's check against a plugin's comm limit can be exercised.
//! - `TCPX_TEST_PLUGIN_WARN_THREAD=1`: a finished receive is reported done only after a helper
//!   thread of the plugin has logged a WARN about it through NCCL's logger, as GPUDirect-TCPX's
//!   I/O threads warn on every host-memory receive. A caller that blocks the logger (a lock on
//!   stderr held across the run) then never sees a receive complete.
//!
//! Not for: production, speed, or anything beyond 127.0.0.1.

#![allow(non_upper_case_globals)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CString};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tcpx_ffi::abi::*;

mod gpu;

type Comm = *mut c_void;

/// The exported table. Mutable only so that `init` can clear entries for `null_fn` faults.
#[no_mangle]
pub static mut ncclNetPlugin_v7: NcclNetV7 = NcclNetV7 {
    name: c"tcpx-test-plugin".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: None,
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: Some(irecv_consumed),
};

// ---- configuration and faults -----------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Host,
    Unpack,
}

#[derive(Debug, Clone)]
enum Fault {
    Fail {
        func: String,
        code: c_int,
        nth: Option<u64>,
    },
    Busy {
        func: String,
        nth: u64,
    },
    NullFn(String),
    NeverComplete,
    /// `block:<fn>`: every call of `fn` blocks forever (a close that never returns).
    Block(String),
    /// `accept_together:<n>`: accepts complete only once `n` listen comms are being accepted.
    AcceptTogether(usize),
    /// `slow_dev:<dev>:<us per MiB>`: sends on device `dev` paced at that rate.
    SlowDev {
        dev: c_int,
        us_per_mib: u64,
    },
}

#[derive(Debug)]
struct Config {
    mode: Mode,
    devices: c_int,
    max_comms: c_int,
    faults: Vec<Fault>,
    /// `TCPX_TEST_PLUGIN_WARN_THREAD=1`: receives complete after a helper thread's WARN.
    warn_thread: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static LOGGER: OnceLock<usize> = OnceLock::new();
static CALLS: Mutex<Option<HashMap<&'static str, u64>>> = Mutex::new(None);

fn config() -> &'static Config {
    static BEFORE_INIT: Config = Config {
        mode: Mode::Host,
        devices: 0,
        max_comms: 65536,
        faults: Vec::new(),
        warn_thread: false,
    };
    CONFIG.get().unwrap_or(&BEFORE_INIT)
}

fn parse_faults(spec: &str) -> Result<Vec<Fault>, String> {
    let mut faults = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "never_complete" {
            faults.push(Fault::NeverComplete);
        } else if let Some(n) = item.strip_prefix("accept_together:") {
            let n = n
                .parse()
                .map_err(|_| format!("`{item}`: accept_together:<listen comms>"))?;
            faults.push(Fault::AcceptTogether(n));
        } else if let Some(rest) = item.strip_prefix("slow_dev:") {
            let (dev, us) = rest
                .split_once(':')
                .ok_or(format!("`{item}`: slow_dev:<dev>:<us per MiB>"))?;
            let dev = dev
                .parse()
                .map_err(|_| format!("`{item}`: bad device number"))?;
            let us_per_mib = us
                .parse()
                .map_err(|_| format!("`{item}`: bad microseconds per MiB"))?;
            faults.push(Fault::SlowDev { dev, us_per_mib });
        } else if let Some(f) = item.strip_prefix("block:") {
            faults.push(Fault::Block(f.to_string()));
        } else if let Some(f) = item.strip_prefix("null_fn:") {
            faults.push(Fault::NullFn(f.to_string()));
        } else if let Some(rest) = item.strip_prefix("busy:") {
            let (func, nth) = rest
                .split_once('@')
                .ok_or(format!("`{item}`: busy:<fn>@<n>"))?;
            let nth = nth
                .parse()
                .map_err(|_| format!("`{item}`: bad call number"))?;
            faults.push(Fault::Busy {
                func: func.to_string(),
                nth,
            });
        } else if let Some((func, code)) = item.split_once(':') {
            let (code, nth) = match code.split_once('@') {
                Some((c, n)) => (c, Some(n.parse().map_err(|_| format!("`{item}`: bad n"))?)),
                None => (code, None),
            };
            let code = code
                .parse()
                .map_err(|_| format!("`{item}`: bad result code"))?;
            faults.push(Fault::Fail {
                func: func.to_string(),
                code,
                nth,
            });
        } else {
            return Err(format!("`{item}` is not a fault"));
        }
    }
    Ok(faults)
}

/// Counts a call of `func`; returns the result code a fault asks for, if any.
fn fault(func: &'static str) -> Option<c_int> {
    let n = {
        let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
        let count = calls
            .get_or_insert_with(HashMap::new)
            .entry(func)
            .or_insert(0);
        *count += 1;
        *count
    };
    let mut busy = false;
    for f in &config().faults {
        match f {
            Fault::Fail { func: f, code, nth } if f == func && nth.is_none_or(|k| k == n) => {
                warn(format!("fault injected: {func} call {n} answers {code}"));
                return Some(*code);
            }
            Fault::Busy { func: f, nth } if f == func && *nth == n => busy = true,
            Fault::Block(f) if f == func => {
                warn(format!("fault injected: {func} call {n} blocks forever"));
                loop {
                    std::thread::park();
                }
            }
            _ => {}
        }
    }
    busy.then_some(-1)
}

/// The pace of device `dev` under a `slow_dev` fault: microseconds per MiB.
fn slow_pace(dev: c_int) -> Option<u64> {
    config().faults.iter().find_map(|f| match f {
        Fault::SlowDev { dev: d, us_per_mib } if *d == dev => Some(*us_per_mib),
        _ => None,
    })
}

fn never_complete() -> bool {
    config()
        .faults
        .iter()
        .any(|f| matches!(f, Fault::NeverComplete))
}

fn log(level: c_int, msg: String) {
    let Some(&logger) = LOGGER.get() else { return };
    let Ok(msg) = CString::new(msg) else { return };
    // SAFETY: LOGGER holds the non-NULL `ncclDebugLogger_t` that init received.
    let logger: unsafe extern "C" fn(
        c_int,
        libc::c_ulong,
        *const c_char,
        c_int,
        *const c_char,
        ...
    ) = unsafe { std::mem::transmute::<usize, _>(logger) };
    // SAFETY: "%s" with one NUL-terminated string argument.
    unsafe {
        logger(
            level,
            0,
            c"tcpx-test-plugin".as_ptr(),
            line!() as c_int,
            c"NET/TestPlugin : %s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

fn warn(msg: String) {
    log(NCCL_LOG_WARN, msg);
}

/// Warns and returns `code`.
fn fail(code: NcclResult, msg: String) -> NcclResult {
    warn(msg);
    code
}

// ---- plugin-wide entry points ------------------------------------------------------------------

unsafe extern "C" fn init(logger: NcclDebugLogger) -> NcclResult {
    if let Some(l) = logger {
        let _ = LOGGER.set(l as usize);
    }
    let mode = match std::env::var("TCPX_TEST_PLUGIN_MODE").as_deref() {
        Err(_) | Ok("") | Ok("host") => Mode::Host,
        Ok("unpack") => Mode::Unpack,
        Ok(other) => {
            return fail(
                NCCL_INVALID_ARGUMENT,
                format!("TCPX_TEST_PLUGIN_MODE={other}: use host or unpack"),
            )
        }
    };
    let faults = match parse_faults(&std::env::var("TCPX_TEST_PLUGIN_FAULT").unwrap_or_default()) {
        Ok(f) => f,
        Err(e) => {
            return fail(
                NCCL_INVALID_ARGUMENT,
                format!("TCPX_TEST_PLUGIN_FAULT: {e}"),
            )
        }
    };
    let devices = std::env::var("TCPX_TEST_PLUGIN_DEVICES")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(1);
    let max_comms = match std::env::var("TCPX_TEST_PLUGIN_MAX_COMMS").as_deref() {
        Err(_) | Ok("") => 65536,
        Ok(n) => match n.trim().parse::<c_int>() {
            Ok(n) if n > 0 => n,
            _ => {
                return fail(
                    NCCL_INVALID_ARGUMENT,
                    format!("TCPX_TEST_PLUGIN_MAX_COMMS={n}: give a positive whole number"),
                )
            }
        },
    };
    for f in &faults {
        if let Fault::NullFn(name) = f {
            // SAFETY: init runs before the caller reads any other entry (NCCL's order too);
            // we write one field of our own table through a raw pointer.
            let t = unsafe { &mut *std::ptr::addr_of_mut!(ncclNetPlugin_v7) };
            match name.as_str() {
                "devices" => t.devices = None,
                "getProperties" => t.get_properties = None,
                "listen" => t.listen = None,
                "connect" => t.connect = None,
                "accept" => t.accept = None,
                "regMr" => t.reg_mr = None,
                "deregMr" => t.dereg_mr = None,
                "isend" => t.isend = None,
                "irecv" => t.irecv = None,
                "test" => t.test = None,
                "closeSend" => t.close_send = None,
                "closeRecv" => t.close_recv = None,
                "closeListen" => t.close_listen = None,
                "irecvConsumed" => t.irecv_consumed = None,
                other => {
                    return fail(
                        NCCL_INVALID_ARGUMENT,
                        format!("null_fn:{other}: unknown function"),
                    )
                }
            }
        }
    }
    let warn_thread = match std::env::var("TCPX_TEST_PLUGIN_WARN_THREAD").as_deref() {
        Err(_) | Ok("") | Ok("0") => false,
        Ok("1") => true,
        Ok(other) => {
            return fail(
                NCCL_INVALID_ARGUMENT,
                format!("TCPX_TEST_PLUGIN_WARN_THREAD={other}: use 0 or 1"),
            )
        }
    };
    let cfg = Config {
        mode,
        devices,
        max_comms,
        faults,
        warn_thread,
    };
    log(
        NCCL_LOG_INFO,
        format!(
            "mode {:?}, {} device(s), faults {:?}",
            cfg.mode, cfg.devices, cfg.faults
        ),
    );
    if CONFIG.set(cfg).is_err() {
        return fail(NCCL_INVALID_USAGE, "init called twice".into());
    }
    fault("init").unwrap_or(NCCL_SUCCESS)
}

unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    if let Some(code) = fault("devices") {
        return code;
    }
    // SAFETY: NCCL passes a valid int pointer.
    unsafe { *ndev = config().devices };
    NCCL_SUCCESS
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut NetPropertiesV7) -> NcclResult {
    if let Some(code) = fault("getProperties") {
        return code;
    }
    if dev < 0 || dev >= config().devices {
        return fail(
            NCCL_INVALID_ARGUMENT,
            format!("getProperties: no device {dev}"),
        );
    }
    let unpack = config().mode == Mode::Unpack;
    // SAFETY: NCCL passes a valid properties pointer; the strings are static.
    unsafe {
        *props = NetPropertiesV7 {
            name: c"lo".as_ptr().cast_mut(),
            pci_path: c"/sys/devices/virtual/net/lo".as_ptr().cast_mut(),
            guid: dev as u64,
            ptr_support: if gpu::available() {
                NCCL_PTR_HOST | NCCL_PTR_CUDA
            } else {
                NCCL_PTR_HOST
            },
            speed: 100_000,
            port: 0,
            latency: 0.0,
            max_comms: config().max_comms,
            max_recvs: 1,
            net_device_type: if unpack {
                NCCL_NET_DEVICE_UNPACK
            } else {
                NCCL_NET_DEVICE_HOST
            },
            net_device_version: if unpack {
                NCCL_NET_DEVICE_UNPACK_VERSION
            } else {
                0
            },
        };
    }
    NCCL_SUCCESS
}

// ---- connection setup ---------------------------------------------------------------------------

const HANDLE_MAGIC: [u8; 4] = *b"TXTP";
const MAX_REQUESTS: usize = 16;

struct ListenState {
    listener: TcpListener,
    dev: c_int,
}

/// A connect in progress, kept in the handle between calls (as NCCL's socket code does).
struct ConnectStage {
    socket: socket2::Socket,
}

unsafe extern "C" fn listen(dev: c_int, handle: *mut c_void, listen_comm: *mut Comm) -> NcclResult {
    if let Some(code) = fault("listen") {
        return code;
    }
    if dev < 0 || dev >= config().devices {
        return fail(NCCL_INVALID_ARGUMENT, format!("listen: no device {dev}"));
    }
    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
        Ok(l) => l,
        Err(e) => return fail(NCCL_SYSTEM_ERROR, format!("listen: bind 127.0.0.1: {e}")),
    };
    let port = match listener.local_addr() {
        Ok(a) => a.port(),
        Err(e) => return fail(NCCL_SYSTEM_ERROR, format!("listen: local_addr: {e}")),
    };
    if let Err(e) = listener.set_nonblocking(true) {
        return fail(NCCL_SYSTEM_ERROR, format!("listen: nonblocking: {e}"));
    }
    // SAFETY: NCCL passes a handle of NCCL_NET_HANDLE_MAXSIZE bytes.
    let h = unsafe { std::slice::from_raw_parts_mut(handle.cast::<u8>(), NCCL_NET_HANDLE_MAXSIZE) };
    h.fill(0);
    h[0..4].copy_from_slice(&HANDLE_MAGIC);
    h[4..6].copy_from_slice(&port.to_be_bytes());
    h[6..10].copy_from_slice(&Ipv4Addr::LOCALHOST.octets());
    // SAFETY: valid out pointer.
    unsafe { *listen_comm = Box::into_raw(Box::new(ListenState { listener, dev })).cast() };
    NCCL_SUCCESS
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut Comm,
    _send_dev_comm: *mut *mut NetDeviceHandle,
) -> NcclResult {
    if let Some(code) = fault("connect") {
        return code;
    }
    if dev < 0 || dev >= config().devices {
        return fail(NCCL_INVALID_ARGUMENT, format!("connect: no device {dev}"));
    }
    // SAFETY: NCCL passes the 128-byte handle from listen and a valid out pointer.
    let (h, send_comm) = unsafe {
        *send_comm = std::ptr::null_mut();
        (
            std::slice::from_raw_parts_mut(handle.cast::<u8>(), NCCL_NET_HANDLE_MAXSIZE),
            &mut *send_comm,
        )
    };
    if h[0..4] != HANDLE_MAGIC {
        return fail(
            NCCL_INVALID_ARGUMENT,
            "connect: handle is not from this plugin".into(),
        );
    }
    let port = u16::from_be_bytes([h[4], h[5]]);
    let ip = Ipv4Addr::new(h[6], h[7], h[8], h[9]);
    let stage_ptr = u64::from_ne_bytes(h[16..24].try_into().expect("8 bytes")) as usize;
    if stage_ptr == 0 {
        let socket = match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        {
            Ok(s) => s,
            Err(e) => return fail(NCCL_SYSTEM_ERROR, format!("connect: socket: {e}")),
        };
        if let Err(e) = socket.set_nonblocking(true) {
            return fail(NCCL_SYSTEM_ERROR, format!("connect: nonblocking: {e}"));
        }
        match socket.connect(&SocketAddrV4::new(ip, port).into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return fail(NCCL_SYSTEM_ERROR, format!("connect to {ip}:{port}: {e}")),
        }
        let stage = Box::into_raw(Box::new(ConnectStage { socket })) as usize as u64;
        h[16..24].copy_from_slice(&stage.to_ne_bytes());
        return NCCL_SUCCESS; // not yet: NULL comm, call again
    }
    // SAFETY: the stage pointer was stored by the call above and not freed since.
    let stage = unsafe { &mut *(stage_ptr as *mut ConnectStage) };
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&stage.socket),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    if ready == 0 {
        return NCCL_SUCCESS; // still connecting
    }
    h[16..24].fill(0);
    // SAFETY: the stage leaves the handle now and is freed exactly once.
    let stage = unsafe { Box::from_raw(stage_ptr as *mut ConnectStage) };
    match stage.socket.take_error() {
        Ok(None) => {}
        Ok(Some(e)) | Err(e) => {
            return fail(NCCL_SYSTEM_ERROR, format!("connect to {ip}:{port}: {e}"));
        }
    }
    let stream: TcpStream = stage.socket.into();
    let _ = stream.set_nodelay(true);
    *send_comm = Box::into_raw(Box::new(CommState::new(stream, Side::Send, dev))).cast();
    NCCL_SUCCESS
}

unsafe extern "C" fn accept(
    listen_comm: Comm,
    recv_comm: *mut Comm,
    recv_dev_comm: *mut *mut NetDeviceHandle,
) -> NcclResult {
    if let Some(code) = fault("accept") {
        return code;
    }
    // SAFETY: NCCL passes our listen comm and a valid out pointer.
    let (l, recv_comm) = unsafe {
        *recv_comm = std::ptr::null_mut();
        (&*(listen_comm as *const ListenState), &mut *recv_comm)
    };
    let unpack = config().mode == Mode::Unpack;
    // GPUDirect-TCPX writes the device handle through this pointer without checking it.
    // SAFETY: reading the caller's pointer-to-pointer only after checking it for NULL.
    if unpack && (recv_dev_comm.is_null() || unsafe { (*recv_dev_comm).is_null() }) {
        return fail(
            NCCL_INVALID_ARGUMENT,
            "accept: no storage for the device handle (GPUDirect-TCPX would crash here)".into(),
        );
    }
    if let Some(n) = config().faults.iter().find_map(|f| match f {
        Fault::AcceptTogether(n) => Some(*n),
        _ => None,
    }) {
        // The listen comms polled so far, by address: none may finish before all `n` are.
        static POLLED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
        let mut polled = POLLED.lock().unwrap_or_else(|p| p.into_inner());
        if !polled.contains(&(listen_comm as usize)) {
            polled.push(listen_comm as usize);
        }
        if polled.len() < n {
            return NCCL_SUCCESS; // not yet
        }
    }
    let stream = match l.listener.accept() {
        Ok((s, _)) => s,
        Err(e) if e.kind() == ErrorKind::WouldBlock => return NCCL_SUCCESS, // not yet
        Err(e) => return fail(NCCL_SYSTEM_ERROR, format!("accept: {e}")),
    };
    if let Err(e) = stream.set_nonblocking(true) {
        return fail(NCCL_SYSTEM_ERROR, format!("accept: nonblocking: {e}"));
    }
    let _ = stream.set_nodelay(true);
    let mut comm = Box::new(CommState::new(stream, Side::Recv, l.dev));
    if unpack {
        // Like GPUDirect-TCPX: the GPU is the one whose context is current on this thread.
        let u = match Unpack::new(gpu::current()) {
            Ok(u) => u,
            Err(e) => return fail(NCCL_UNHANDLED_CUDA_ERROR, format!("accept: {e}")),
        };
        let handle: *mut c_void = match &u.gpu {
            Some(g) => g.handle as usize as *mut c_void,
            None => (&*u.handle as *const UnpackHandle).cast_mut().cast(),
        };
        // SAFETY: checked non-NULL above; the caller provides 32 bytes of storage.
        unsafe {
            **recv_dev_comm = NetDeviceHandle {
                net_device_type: NCCL_NET_DEVICE_UNPACK,
                net_device_version: NCCL_NET_DEVICE_UNPACK_VERSION,
                handle,
                size: std::mem::size_of::<UnpackHandle>(),
                needs_proxy_progress: 1,
            };
        }
        comm.unpack = Some(u);
    }
    *recv_comm = Box::into_raw(comm).cast();
    NCCL_SUCCESS
}

// ---- comms, registrations, requests --------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Send,
    Recv,
}

const COMM_MAGIC: u64 = 0x7463_7078_636f_6d6d;
const MR_MAGIC: u64 = 0x7463_7078_6d72_6d72;

struct CommState {
    magic: u64,
    side: Side,
    stream: TcpStream,
    /// Requests in posting order; for unpack receives, done ones stay until irecvConsumed.
    queue: VecDeque<Box<Request>>,
    posted: u64,
    unpack: Option<Unpack>,
    failed: bool,
    /// `slow_dev`: this comm's microseconds per MiB, and when its emulated link is free again.
    slow: Option<u64>,
    slow_free_at: Option<Instant>,
}

impl CommState {
    fn new(stream: TcpStream, side: Side, dev: c_int) -> Self {
        CommState {
            magic: COMM_MAGIC,
            side,
            stream,
            queue: VecDeque::new(),
            posted: 0,
            unpack: None,
            failed: false,
            slow: if side == Side::Send {
                slow_pace(dev)
            } else {
                None
            },
            slow_free_at: None,
        }
    }
}

/// Resolves a comm pointer, refusing anything that is not one of ours of the right side.
fn comm_mut<'a>(comm: Comm, side: Side, call: &str) -> Result<&'a mut CommState, NcclResult> {
    if comm.is_null() {
        return Err(fail(NCCL_INVALID_ARGUMENT, format!("{call}: NULL comm")));
    }
    // SAFETY: NCCL passes back a pointer this plugin produced; the magic guards against others.
    let c = unsafe { &mut *(comm as *mut CommState) };
    if c.magic != COMM_MAGIC || c.side != side {
        return Err(fail(
            NCCL_INVALID_ARGUMENT,
            format!("{call}: not a {side:?} comm"),
        ));
    }
    Ok(c)
}

struct Mr {
    magic: u64,
    comm: Comm,
    base: usize,
    size: usize,
    /// CUDA memory: the context current at regMr (its bytes are staged through host memory).
    cuda: Option<gpu::Ctx>,
}

struct Request {
    comm: *mut CommState,
    index: u64,
    data: *mut u8,
    /// Send: bytes to send. Receive: capacity.
    size: usize,
    /// Header bytes (message length) moved so far, and the header itself.
    header: [u8; 8],
    header_done: usize,
    /// Receive: message length once its header arrived.
    msg_len: usize,
    /// Payload bytes moved so far.
    moved: usize,
    done: bool,
    /// `test` has told the caller it is done (unpack receives stay queued until consumed).
    reported: bool,
    /// Unpack receives: the planned fragments, their pages, and how many are filled.
    frags: Vec<LoadMeta>,
    pages: Vec<u32>,
    /// Host bytes standing in for GPU memory: a CUDA send's bytes, or a receive headed for a CUDA
    /// buffer or GPU bounce pages (copied there when complete).
    staging: Vec<u8>,
    /// A receive into CUDA memory in host mode: its context and device address.
    cuda_dst: Option<(gpu::Ctx, u64)>,
    /// `warn_thread`: set by the helper thread once it has logged its WARN for this receive.
    helper_warned: Option<Arc<AtomicBool>>,
    /// `slow_dev` sends: no byte leaves before `.0`, and done is reported from `.1` on.
    paced: Option<(Instant, Instant)>,
}

/// TCPX-like bounce buffer and unpack metadata of one receive comm (host memory, or on the GPU).
struct Unpack {
    handle: Box<UnpackHandle>,
    meta: *mut NetUnpackMeta,
    bounce: Vec<u8>,
    free_pages: Vec<u32>,
    rng: u64,
    gpu: Option<GpuBounce>,
}

/// A GPU comm's device allocations: bounce pages and the unpack handle (both device memory) and
/// the context they belong to; `meta` is then host memory mapped to the device.
struct GpuBounce {
    ctx: gpu::Ctx,
    bounce: u64,
    handle: u64,
}

/// Pages in the pool: every slot can hold a full receive at once.
const POOL_PAGES: usize = UNPACK_SLOTS * UNPACK_MAX_FRAGMENTS;

impl Unpack {
    /// Host bounce buffer and metadata, or with `ctx` (a CUDA context current at accept) the
    /// GPU layout GPUDirect-TCPX uses.
    fn new(ctx: Option<gpu::Ctx>) -> Result<Self, String> {
        let meta_len = std::mem::size_of::<NetUnpackMeta>();
        let (meta, gpu) = match ctx {
            None => {
                let layout = std::alloc::Layout::new::<NetUnpackMeta>();
                // SAFETY: non-zero size; all-zero is a valid NetUnpackMeta (plain integers).
                let meta = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<NetUnpackMeta>();
                assert!(!meta.is_null(), "out of memory for unpack metadata");
                (meta, None)
            }
            Some(ctx) => {
                let meta = gpu::alloc_host_mapped(ctx, meta_len)?.cast::<NetUnpackMeta>();
                let bounce = match gpu::alloc(ctx, POOL_PAGES * UNPACK_PAGE) {
                    Ok(b) => b,
                    Err(e) => {
                        gpu::free_host(ctx, meta.cast());
                        return Err(format!("bounce buffer on the GPU: {e}"));
                    }
                };
                let handle = match gpu::alloc(ctx, std::mem::size_of::<UnpackHandle>()) {
                    Ok(h) => h,
                    Err(e) => {
                        gpu::free(ctx, bounce);
                        gpu::free_host(ctx, meta.cast());
                        return Err(format!("unpack handle on the GPU: {e}"));
                    }
                };
                (
                    meta,
                    Some(GpuBounce {
                        ctx,
                        bounce,
                        handle,
                    }),
                )
            }
        };
        let mut u = Unpack {
            handle: Box::new(UnpackHandle {
                meta,
                bounce_buf: std::ptr::null_mut(),
                head: u64::MAX,
            }),
            meta,
            bounce: Vec::new(),
            free_pages: (0..POOL_PAGES as u32).collect(),
            rng: 0x2545_F491_4F6C_DD1D ^ (meta as u64),
            gpu,
        };
        match &u.gpu {
            None => {
                let mut bounce = vec![0u8; POOL_PAGES * UNPACK_PAGE];
                u.handle.bounce_buf = bounce.as_mut_ptr().cast();
                u.bounce = bounce;
            }
            Some(g) => {
                u.handle.bounce_buf = g.bounce as usize as *mut c_void;
                let h = &*u.handle;
                let mut bytes = [0u8; 24];
                bytes[..8].copy_from_slice(&(h.meta as usize as u64).to_ne_bytes());
                bytes[8..16].copy_from_slice(&g.bounce.to_ne_bytes());
                bytes[16..].copy_from_slice(&h.head.to_ne_bytes());
                // SAFETY: `g.handle` is our 24-byte device allocation, used by no one yet.
                unsafe { gpu::to_device(g.ctx, g.handle, &bytes) }?;
            }
        }
        for i in (1..u.free_pages.len()).rev() {
            let j = u.next(i as u64 + 1) as usize;
            u.free_pages.swap(i, j);
        }
        Ok(u)
    }

    /// A pseudo-random number below `bound` (xorshift64*).
    fn next(&mut self, bound: u64) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound
    }

    /// Lays a message of `len` bytes over shuffled pages: fragments of 2-4 KiB at random
    /// offsets inside their page (so sources are rarely aligned), in destination order.
    fn plan(&mut self, len: usize) -> Option<(Vec<LoadMeta>, Vec<u32>)> {
        let mut frags = Vec::new();
        let mut pages = Vec::new();
        let mut off = 0usize;
        while off < len {
            let want = 2048 + self.next(2049) as usize;
            let flen = want.min(len - off);
            let in_page = self.next((UNPACK_PAGE - flen + 1) as u64) as usize;
            let page = self.free_pages.pop()?;
            pages.push(page);
            frags.push(LoadMeta {
                src_off: page * UNPACK_PAGE as u32 + in_page as u32,
                len: flen as u32,
                dst_off: off as u64,
            });
            off += flen;
        }
        Some((frags, pages))
    }

    fn recycle(&mut self, pages: Vec<u32>) {
        for p in pages {
            self.free_pages.push(p);
            let last = self.free_pages.len() - 1;
            let j = self.next(last as u64 + 1) as usize;
            self.free_pages.swap(last, j);
        }
    }
}

impl Drop for Unpack {
    fn drop(&mut self) {
        match &self.gpu {
            // SAFETY: allocated in `new` with this layout, freed once.
            None => unsafe {
                std::alloc::dealloc(self.meta.cast(), std::alloc::Layout::new::<NetUnpackMeta>())
            },
            Some(g) => {
                // The comm is closed: the caller has no unpack running on these pages any more.
                gpu::free(g.ctx, g.handle);
                gpu::free(g.ctx, g.bounce);
                gpu::free_host(g.ctx, self.meta.cast());
            }
        }
    }
}

unsafe extern "C" fn reg_mr(
    comm: Comm,
    data: *mut c_void,
    size: c_int,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    if let Some(code) = fault("regMr") {
        return code;
    }
    if comm.is_null() {
        return fail(NCCL_INVALID_ARGUMENT, "regMr: NULL comm".into());
    }
    let cuda = match ptr_type {
        NCCL_PTR_HOST => None,
        NCCL_PTR_CUDA if gpu::available() => match gpu::current() {
            Some(ctx) => Some(ctx),
            None => {
                return fail(
                    NCCL_UNHANDLED_CUDA_ERROR,
                    "regMr: CUDA memory, but no CUDA context is current on the calling thread \
                     (GPUDirect-TCPX needs the GPU's context current)"
                        .into(),
                )
            }
        },
        _ => {
            return fail(
                NCCL_INVALID_ARGUMENT,
                format!(
                    "regMr: pointer type {ptr_type} unsupported (host{} memory only)",
                    if gpu::available() { " and CUDA" } else { "" }
                ),
            )
        }
    };
    // SAFETY: any comm pointer of ours starts with CommState.
    let unpack = unsafe { (*(comm as *const CommState)).unpack.is_some() };
    if (unpack || cuda.is_some()) && (data as usize) % UNPACK_PAGE != 0 {
        return fail(
            NCCL_INVALID_ARGUMENT,
            format!("regMr: {data:p} is not 4 KiB aligned"),
        );
    }
    if size < 0 {
        return fail(NCCL_INVALID_ARGUMENT, format!("regMr: size {size}"));
    }
    let mr = Box::new(Mr {
        magic: MR_MAGIC,
        comm,
        base: data as usize,
        size: size as usize,
        cuda,
    });
    // SAFETY: valid out pointer.
    unsafe { *mhandle = Box::into_raw(mr).cast() };
    NCCL_SUCCESS
}

unsafe extern "C" fn dereg_mr(_comm: Comm, mhandle: *mut c_void) -> NcclResult {
    if let Some(code) = fault("deregMr") {
        return code;
    }
    if mhandle.is_null() {
        return fail(NCCL_INVALID_ARGUMENT, "deregMr: NULL handle".into());
    }
    // SAFETY: a handle from reg_mr, freed once.
    let mr = unsafe { Box::from_raw(mhandle.cast::<Mr>()) };
    if mr.magic != MR_MAGIC {
        std::mem::forget(mr);
        return fail(NCCL_INVALID_ARGUMENT, "deregMr: not a registration".into());
    }
    NCCL_SUCCESS
}

/// Checks that `data..data+size` lies in registration `mhandle` of `comm`; `Some(cuda)` when it
/// does, with the registration's CUDA context for GPU memory.
fn check_mr(
    comm: Comm,
    mhandle: *mut c_void,
    data: *mut c_void,
    size: usize,
    call: &str,
) -> Option<Option<gpu::Ctx>> {
    if mhandle.is_null() {
        warn(format!("{call}: NULL mhandle"));
        return None;
    }
    // SAFETY: a handle from reg_mr (magic-checked).
    let mr = unsafe { &*(mhandle as *const Mr) };
    let start = data as usize;
    let ok = mr.magic == MR_MAGIC
        && mr.comm == comm
        && start >= mr.base
        && start + size <= mr.base + mr.size;
    if !ok {
        warn(format!(
            "{call}: buffer {data:p}+{size} is not inside its registration"
        ));
        return None;
    }
    Some(mr.cuda)
}

/// Queues a request. With `cuda` (the buffer is GPU memory) a send's bytes are copied to host
/// staging now, and a receive lands in host staging and is copied to the GPU when complete.
fn post(
    c: &mut CommState,
    data: *mut u8,
    size: usize,
    cuda: Option<gpu::Ctx>,
    request: *mut *mut c_void,
) -> NcclResult {
    let mut staging = Vec::new();
    let mut cuda_dst = None;
    let mut data = data;
    if let Some(ctx) = cuda {
        staging = vec![0u8; size];
        if c.side == Side::Send {
            // SAFETY: `data..data + size` is inside a CUDA registration (checked by the caller)
            // that the caller does not write while the send is in flight.
            if let Err(e) = unsafe { gpu::to_host(ctx, &mut staging, data as usize as u64) } {
                return fail(NCCL_UNHANDLED_CUDA_ERROR, format!("isend: {e}"));
            }
        } else if c.unpack.is_none() {
            cuda_dst = Some((ctx, data as usize as u64));
        }
        if c.side == Side::Send || c.unpack.is_none() {
            data = staging.as_mut_ptr();
        }
    }
    let paced = c.slow.map(|us_per_mib| {
        let now = Instant::now();
        let start = c.slow_free_at.map_or(now, |t| t.max(now));
        let took = Duration::from_micros(us_per_mib.saturating_mul(size as u64) >> 20);
        let end = start + took;
        c.slow_free_at = Some(end);
        (start, end)
    });
    let mut r = Box::new(Request {
        comm: c,
        index: c.posted,
        data,
        size,
        header: (size as u64).to_le_bytes(),
        header_done: 0,
        msg_len: 0,
        moved: 0,
        done: false,
        reported: false,
        frags: Vec::new(),
        pages: Vec::new(),
        staging,
        cuda_dst,
        helper_warned: None,
        paced,
    });
    c.posted += 1;
    // SAFETY: valid out pointer; the Box keeps the request's address stable in the queue.
    unsafe { *request = (&mut *r as *mut Request).cast() };
    c.queue.push_back(r);
    NCCL_SUCCESS
}

unsafe extern "C" fn isend(
    send_comm: Comm,
    data: *mut c_void,
    size: c_int,
    _tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: valid out pointer.
    unsafe { *request = std::ptr::null_mut() };
    match fault("isend") {
        Some(-1) => return NCCL_SUCCESS, // busy: NULL request
        Some(code) => return code,
        None => {}
    }
    let c = match comm_mut(send_comm, Side::Send, "isend") {
        Ok(c) => c,
        Err(code) => return code,
    };
    if size < 0 {
        return NCCL_INVALID_ARGUMENT;
    }
    let Some(cuda) = check_mr(send_comm, mhandle, data, size as usize, "isend") else {
        return NCCL_INVALID_ARGUMENT;
    };
    if c.queue.len() >= MAX_REQUESTS {
        return fail(NCCL_INTERNAL_ERROR, "isend: request queue full (16)".into());
    }
    let code = post(c, data.cast(), size as usize, cuda, request);
    if code != NCCL_SUCCESS {
        // SAFETY: valid out pointer.
        unsafe { *request = std::ptr::null_mut() };
        return code;
    }
    eager_progress(c)
}

/// Moves what can be moved right away, as a plugin with its own I/O threads would.
fn eager_progress(c: &mut CommState) -> NcclResult {
    if c.side == Side::Send && never_complete() {
        return NCCL_SUCCESS;
    }
    match progress(c) {
        Ok(()) => NCCL_SUCCESS,
        Err(code) => {
            c.failed = true;
            code
        }
    }
}

unsafe extern "C" fn irecv(
    recv_comm: Comm,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    _tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: valid out pointer.
    unsafe { *request = std::ptr::null_mut() };
    match fault("irecv") {
        Some(-1) => return NCCL_SUCCESS,
        Some(code) => return code,
        None => {}
    }
    let c = match comm_mut(recv_comm, Side::Recv, "irecv") {
        Ok(c) => c,
        Err(code) => return code,
    };
    if n != 1 {
        return fail(
            NCCL_INVALID_ARGUMENT,
            format!("irecv: n = {n}, only 1 is supported"),
        );
    }
    // SAFETY: n == 1 and NCCL passes arrays of n elements.
    let (data, size, mhandle) = unsafe { (*data, *sizes, *mhandles) };
    if size < 0 {
        return NCCL_INVALID_ARGUMENT;
    }
    let Some(cuda) = check_mr(recv_comm, mhandle, data, size as usize, "irecv") else {
        return NCCL_INVALID_ARGUMENT;
    };
    if c.unpack.is_some() && size as usize > UNPACK_MAX_RECV_BYTES {
        // GPUDirect-TCPX aborts the process here; a test plugin answers an error instead.
        return fail(
            NCCL_INTERNAL_ERROR,
            format!("irecv: {size} bytes is more than the 4 MiB one unpack slot holds"),
        );
    }
    if c.queue.len() >= MAX_REQUESTS {
        return fail(NCCL_INTERNAL_ERROR, "irecv: request queue full (16)".into());
    }
    let code = post(c, data.cast(), size as usize, cuda, request);
    if code != NCCL_SUCCESS {
        return code;
    }
    eager_progress(c)
}

/// Moves bytes for the comm's unfinished requests, oldest first, until the socket would block.
fn progress(c: &mut CommState) -> Result<(), NcclResult> {
    if c.failed {
        return Err(NCCL_REMOTE_ERROR);
    }
    let side = c.side;
    let CommState {
        stream,
        queue,
        unpack,
        ..
    } = c;
    for r in queue.iter_mut().filter(|r| !r.done) {
        let finished = match side {
            Side::Send => send_some(stream, r)?,
            Side::Recv => recv_some(stream, r, unpack.as_mut())?,
        };
        if !finished {
            break;
        }
    }
    Ok(())
}

fn io_error(call: &str, e: std::io::Error) -> NcclResult {
    fail(NCCL_SYSTEM_ERROR, format!("{call}: {e}"))
}

/// Returns true when the request is complete.
fn send_some(stream: &mut TcpStream, r: &mut Request) -> Result<bool, NcclResult> {
    if r.paced.is_some_and(|(start, _)| Instant::now() < start) {
        return Ok(false); // slow_dev: the emulated link is still busy with earlier messages
    }
    while r.header_done < 8 {
        match stream.write(&r.header[r.header_done..]) {
            Ok(n) => r.header_done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(io_error("send", e)),
        }
    }
    while r.moved < r.size {
        // SAFETY: data..data+size is the registered, caller-owned send buffer.
        let buf = unsafe { std::slice::from_raw_parts(r.data.add(r.moved), r.size - r.moved) };
        match stream.write(buf) {
            Ok(n) => r.moved += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(io_error("send", e)),
        }
    }
    r.done = true;
    Ok(true)
}

fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>, NcclResult> {
    match stream.read(buf) {
        Ok(0) => Err(fail(
            NCCL_REMOTE_ERROR,
            "recv: the peer closed the connection with a receive pending".into(),
        )),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(io_error("recv", e)),
    }
}

fn recv_some(
    stream: &mut TcpStream,
    r: &mut Request,
    mut unpack: Option<&mut Unpack>,
) -> Result<bool, NcclResult> {
    while r.header_done < 8 {
        let mut hdr = r.header;
        match read_some(stream, &mut hdr[r.header_done..])? {
            Some(n) => {
                r.header = hdr;
                r.header_done += n;
            }
            None => return Ok(false),
        }
        if r.header_done == 8 {
            r.msg_len = u64::from_le_bytes(r.header) as usize;
            if r.msg_len > r.size {
                return Err(fail(
                    NCCL_INTERNAL_ERROR,
                    format!(
                        "recv: message of {} bytes does not fit the posted receive of {}",
                        r.msg_len, r.size
                    ),
                ));
            }
            if let Some(u) = unpack.as_deref_mut() {
                let Some((frags, pages)) = u.plan(r.msg_len) else {
                    return Err(fail(
                        NCCL_INTERNAL_ERROR,
                        "recv: bounce pages exhausted".into(),
                    ));
                };
                r.frags = frags;
                r.pages = pages;
                if u.gpu.is_some() {
                    r.staging = vec![0u8; r.msg_len];
                }
            }
        }
    }
    while r.moved < r.msg_len {
        let dst: &mut [u8] = match unpack.as_deref_mut() {
            // SAFETY: data..data+size is the registered, caller-owned receive buffer.
            None => unsafe {
                std::slice::from_raw_parts_mut(r.data.add(r.moved), r.msg_len - r.moved)
            },
            Some(u) if u.gpu.is_some() => &mut r.staging[r.moved..r.msg_len],
            Some(u) => {
                // The fragment holding payload byte `moved`: fragments are in dst order.
                let k = r
                    .frags
                    .partition_point(|f| f.dst_off + u64::from(f.len) <= r.moved as u64);
                let f = r.frags[k];
                let into = r.moved - f.dst_off as usize;
                let start = f.src_off as usize + into;
                &mut u.bounce[start..f.src_off as usize + f.len as usize]
            }
        };
        match read_some(stream, dst)? {
            Some(n) => r.moved += n,
            None => return Ok(false),
        }
    }
    if let Some((ctx, dst)) = r.cuda_dst {
        // SAFETY: `dst..dst + msg_len` is inside the receive's CUDA registration (msg_len <= its
        // size), lent to this request until it completes.
        unsafe { gpu::to_device(ctx, dst, &r.staging[..r.msg_len]) }
            .map_err(|e| fail(NCCL_UNHANDLED_CUDA_ERROR, format!("recv: {e}")))?;
        gpu::synchronize(ctx).map_err(|e| fail(NCCL_UNHANDLED_CUDA_ERROR, format!("recv: {e}")))?;
    }
    if let Some(u) = unpack {
        if let Some(g) = &u.gpu {
            for f in &r.frags {
                let (src, len) = (f.dst_off as usize, f.len as usize);
                // SAFETY: the fragment's page belongs to this receive until irecvConsumed and lies
                // inside the bounce allocation (POOL_PAGES pages; offset within its page).
                unsafe {
                    gpu::to_device(
                        g.ctx,
                        g.bounce + u64::from(f.src_off),
                        &r.staging[src..src + len],
                    )
                }
                .map_err(|e| fail(NCCL_UNHANDLED_CUDA_ERROR, format!("recv: bounce page: {e}")))?;
            }
            gpu::synchronize(g.ctx)
                .map_err(|e| fail(NCCL_UNHANDLED_CUDA_ERROR, format!("recv: {e}")))?;
        }
        let slot = (r.index % UNPACK_SLOTS as u64) as usize;
        // SAFETY: `meta` is our live allocation; the slot belongs to this request until
        // irecvConsumed (at most 16 requests in flight).
        unsafe {
            let mem = std::ptr::addr_of_mut!((*u.meta).mem[slot]).cast::<LoadMeta>();
            for (k, f) in r.frags.iter().enumerate() {
                mem.add(k).write(*f);
            }
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*u.meta).cnt[slot]).write_volatile(r.frags.len() as u64);
        }
    }
    r.done = true;
    Ok(true)
}

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    if let Some(code) = fault("test") {
        return code;
    }
    if request.is_null() {
        return fail(NCCL_INVALID_ARGUMENT, "test: NULL request".into());
    }
    // SAFETY: a request pointer this plugin handed out and that is still queued.
    let comm = unsafe { (*(request as *const Request)).comm };
    // SAFETY: the request's comm outlives it.
    let c = unsafe { &mut *comm };
    let Some(oldest) = c.queue.iter().find(|r| !r.reported) else {
        return fail(
            NCCL_INTERNAL_ERROR,
            "test: request already completed".into(),
        );
    };
    if !std::ptr::eq(&**oldest, request as *const Request) {
        return fail(
            NCCL_INTERNAL_ERROR,
            format!(
                "test: request is not the oldest unfinished one (#{}) of its comm",
                oldest.index
            ),
        );
    }
    let stalled = c.side == Side::Send && never_complete();
    if !stalled {
        if let Err(code) = progress(c) {
            c.failed = true;
            return code;
        }
    }
    let pos = c
        .queue
        .iter()
        .position(|r| std::ptr::eq(&**r, request as *const Request))
        .expect("found above");
    let r = &mut c.queue[pos];
    // SAFETY: valid out pointer.
    unsafe { *done = r.done as c_int };
    if !r.done {
        return NCCL_SUCCESS;
    }
    if r.paced.is_some_and(|(_, end)| Instant::now() < end) {
        // SAFETY: valid out pointer.
        unsafe { *done = 0 };
        return NCCL_SUCCESS;
    }
    if c.side == Side::Recv && config().warn_thread && !helper_has_warned(r) {
        // SAFETY: valid out pointer.
        unsafe { *done = 0 };
        return NCCL_SUCCESS;
    }
    r.reported = true;
    let unpack = c.unpack.is_some();
    if !unpack && !sizes.is_null() {
        let n = if c.side == Side::Send {
            r.size
        } else {
            r.msg_len
        };
        // SAFETY: NCCL passes one int for n == 1 requests.
        unsafe { *sizes = n as c_int };
    }
    if !unpack || c.side == Side::Send {
        c.queue.remove(pos);
    }
    NCCL_SUCCESS
}

/// `warn_thread`: starts (once per receive) a helper thread that logs a WARN through NCCL's
/// logger and then marks the receive; true once it has. A thread that cannot be started counts
/// as done, so the option never stalls a run by itself.
fn helper_has_warned(r: &mut Request) -> bool {
    if let Some(flag) = &r.helper_warned {
        return flag.load(Ordering::Acquire);
    }
    let flag = Arc::new(AtomicBool::new(false));
    let mark = Arc::clone(&flag);
    let (index, bytes) = (r.index, r.msg_len);
    let started = std::thread::Builder::new()
        .name("tcpx-test-plugin-io".into())
        .spawn(move || {
            warn(format!(
                "helper thread: receive #{index} of {bytes} bytes landed in host memory"
            ));
            mark.store(true, Ordering::Release);
        });
    if started.is_err() {
        flag.store(true, Ordering::Release);
    }
    r.helper_warned = Some(flag);
    r.helper_warned
        .as_ref()
        .is_some_and(|f| f.load(Ordering::Acquire))
}

unsafe extern "C" fn irecv_consumed(recv_comm: Comm, n: c_int, request: *mut c_void) -> NcclResult {
    if let Some(code) = fault("irecvConsumed") {
        return code;
    }
    let c = match comm_mut(recv_comm, Side::Recv, "irecvConsumed") {
        Ok(c) => c,
        Err(code) => return code,
    };
    if n != 1 {
        return fail(NCCL_INVALID_ARGUMENT, format!("irecvConsumed: n = {n}"));
    }
    let Some(u) = c.unpack.as_mut() else {
        return fail(
            NCCL_INVALID_USAGE,
            "irecvConsumed on a host-mode comm".into(),
        );
    };
    match c.queue.front() {
        Some(r) if std::ptr::eq(&**r, request as *const Request) && r.reported => {}
        _ => {
            return fail(
                NCCL_INTERNAL_ERROR,
                "irecvConsumed: not the oldest finished receive of this comm".into(),
            )
        }
    }
    let r = c.queue.pop_front().expect("checked");
    u.recycle(r.pages);
    NCCL_SUCCESS
}

unsafe fn close(comm: Comm, side: Side, call: &'static str) -> NcclResult {
    if let Some(code) = fault(call) {
        return code;
    }
    if let Err(code) = comm_mut(comm, side, call) {
        return code;
    }
    // SAFETY: checked to be our comm; freed once.
    drop(unsafe { Box::from_raw(comm.cast::<CommState>()) });
    NCCL_SUCCESS
}

unsafe extern "C" fn close_send(comm: Comm) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe { close(comm, Side::Send, "closeSend") }
}

unsafe extern "C" fn close_recv(comm: Comm) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe { close(comm, Side::Recv, "closeRecv") }
}

unsafe extern "C" fn close_listen(comm: Comm) -> NcclResult {
    if let Some(code) = fault("closeListen") {
        return code;
    }
    if comm.is_null() {
        return fail(NCCL_INVALID_ARGUMENT, "closeListen: NULL".into());
    }
    // SAFETY: a listen comm from `listen`, freed once.
    drop(unsafe { Box::from_raw(comm.cast::<ListenState>()) });
    NCCL_SUCCESS
}
