//! Safe ownership of a loaded plugin, its comms, registrations and requests.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tcpx_model::Backoff;

use crate::abi::{
    self, NcclResult, NetDeviceHandle, NetPropertiesV7, NetPropertiesV8, NetPropertiesV9,
    UnpackHandle, NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_UNPACK, NCCL_NET_HANDLE_MAXSIZE,
    UNPACK_MAX_RECV_BYTES, UNPACK_PAGE, UNPACK_SLOTS,
};
use crate::error::{CallSite, FfiError};
use crate::loader::{self, AbiVersion, Table};
use crate::memory::{MemoryKind, PluginMemory};
use crate::unpack;

/// Requests a comm may have in flight (GPUDirect-TCPX's limit; NCCL allows 32).
pub const MAX_IN_FLIGHT: usize = 16;

type Result<T, E = FfiError> = std::result::Result<T, E>;

/// Makes a GPU's primary context current on the calling thread. GPUDirect-TCPX picks the GPU
/// from the thread's current device in listen, connect, accept and regMr, so the GPU layer
/// supplies one of these per GPU; host-only use passes [`NoGpuContext`].
pub trait CurrentContext: Send + Sync {
    fn make_current(&self) -> Result<(), String>;
}

/// For host memory only: nothing to make current.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGpuContext;

impl CurrentContext for NoGpuContext {
    fn make_current(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A GPU from `tcpx-gpu` makes its primary context current.
impl CurrentContext for tcpx_gpu::Device {
    fn make_current(&self) -> Result<(), String> {
        tcpx_gpu::Device::make_current(self).map_err(|e| e.to_string())
    }
}

/// Who performs the unpack of receives on an UNPACK device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnpackHandling {
    /// The caller (a GPU kernel): [`RecvComm::test`] reports the slot, the caller copies the
    /// fragments, then calls [`RecvComm::consumed`]. Right for GPUDirect-TCPX, whose unpack
    /// handle lives in device memory.
    #[default]
    Caller,
    /// This crate, on the CPU, inside [`RecvComm::test`], followed by `irecvConsumed`, for comms
    /// whose unpack handle is host memory (then its metadata and bounce buffer are too, as in the
    /// test plugin's host mode): choosing this declares that a handle CUDA does not know as device
    /// memory is a plain host struct. A comm whose unpack handle CUDA reports as device memory
    /// (GPUDirect-TCPX) is left to the caller ([`RecvComm::needs_gpu_unpack`]).
    Cpu,
}

/// How to drive a loaded plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct PluginOptions {
    pub unpack: UnpackHandling,
}

/// What the plugin says about one device, independent of the ABI version.
#[derive(Debug, Clone, PartialEq)]
pub struct NetProperties {
    pub name: String,
    pub pci_path: String,
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    pub reg_is_global: bool,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub device: DeviceKind,
}

impl NetProperties {
    pub fn supports(&self, kind: MemoryKind) -> bool {
        self.ptr_support & kind.nccl_ptr_type() != 0
    }
}

/// `netDeviceType` / `netDeviceVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Host,
    /// Receives land in a bounce buffer and need an unpack (GPUDirect-TCPX, version 0x7).
    Unpack {
        version: i32,
    },
    Other {
        kind: i32,
        version: i32,
    },
}

impl DeviceKind {
    fn from_raw(kind: c_int, version: c_int) -> Self {
        match kind {
            NCCL_NET_DEVICE_HOST => DeviceKind::Host,
            NCCL_NET_DEVICE_UNPACK => DeviceKind::Unpack { version },
            kind => DeviceKind::Other { kind, version },
        }
    }
}

/// The opaque bytes `listen` produces, to be sent to the peer out of band for `connect`.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectHandle([u8; NCCL_NET_HANDLE_MAXSIZE]);

impl ConnectHandle {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Wraps bytes received from the peer (at most 128; shorter input is zero-padded).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > NCCL_NET_HANDLE_MAXSIZE {
            return None;
        }
        let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        h[..bytes.len()].copy_from_slice(bytes);
        Some(ConnectHandle(h))
    }
}

impl std::fmt::Debug for ConnectHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnectHandle({} bytes)", self.0.len())
    }
}

/// One request of a comm, numbered from 0 in posting order (receive `i` uses unpack slot `i % 16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// A finished send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendCompletion {
    pub id: RequestId,
    pub len: usize,
}

/// A finished receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvCompletion {
    pub id: RequestId,
    /// Bytes received, when known: the plugin's `sizes` (GPUDirect-TCPX does not write it) or the
    /// sum of the unpacked fragments.
    pub size: Option<usize>,
    /// With [`UnpackHandling::Caller`] on an UNPACK device: the slot whose fragments the caller
    /// must copy before [`RecvComm::consumed`].
    pub unpack_slot: Option<usize>,
    /// Fragments this crate unpacked on the CPU (0 when no unpack ran here).
    pub fragments: usize,
}

/// A loaded, initialised plugin library (state shared by all its comms).
struct Shared {
    table: Table,
    name: String,
    opened_as: String,
    next_comm: AtomicU64,
}

// SAFETY: `table` points into a library that is never unloaded and whose table is only read;
// NCCL calls a plugin from several threads, so its entry points must be thread-safe.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Expands `$body` once per ABI version, with `$t` bound to that version's table pointer: for
/// code written the same way for every version although the types it works on differ (a size
/// argument is an `int` in one version's signature and a `size_t` in another's).
macro_rules! with_table {
    ($table:expr, |$t:ident| $body:expr) => {
        match $table {
            Table::V7($t) => $body,
            Table::V8($t) => $body,
            Table::V9($t) => $body,
        }
    };
}

/// Reads one function pointer whose type is the same in every ABI version.
macro_rules! common_fn {
    ($shared:expr, $field:ident, $cname:literal, $needed:expr) => {{
        let shared: &Shared = $shared;
        // SAFETY: the table pointer stays valid for the life of the process (see `Shared`).
        let f = unsafe { with_table!(shared.table, |t| (*t).$field) };
        f.ok_or_else(|| shared.missing($cname, $needed))
    }};
}

/// Reads one function pointer of one version's table `t` (a raw pointer, so inside `unsafe`),
/// or the error naming the missing function.
macro_rules! version_fn {
    ($t:expr, $shared:expr, $field:ident, $cname:literal, $needed:expr) => {
        (*$t).$field.ok_or_else(|| $shared.missing($cname, $needed))
    };
}

/// [`NetProperties`] from any version's properties struct `p`; `reg_is_global` is not in v7.
macro_rules! net_properties {
    ($p:expr, reg_is_global: $reg_is_global:expr) => {{
        let p = $p;
        NetProperties {
            name: cstr(p.name),
            pci_path: cstr(p.pci_path),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: $reg_is_global,
            speed_mbps: p.speed,
            port: p.port,
            latency_us: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            device: DeviceKind::from_raw(p.net_device_type, p.net_device_version),
        }
    }};
}

impl Shared {
    fn missing(&self, function: &'static str, needed_for: &'static str) -> FfiError {
        FfiError::MissingFunction {
            plugin: self.name.clone(),
            symbol: self.table.version().symbol(),
            function,
            needed_for,
        }
    }

    fn check(&self, code: NcclResult, site: impl FnOnce() -> CallSite) -> Result<()> {
        if code == abi::NCCL_SUCCESS {
            Ok(())
        } else {
            Err(FfiError::Plugin {
                code,
                site: site(),
                plugin: self.name.clone(),
            })
        }
    }

    fn new_comm_id(&self) -> u64 {
        self.next_comm.fetch_add(1, Ordering::Relaxed) + 1
    }
}

fn site(call: &'static str) -> CallSite {
    CallSite {
        call,
        comm: None,
        channel: None,
    }
}

/// Plugins loaded so far: a library is opened and initialised once per process.
static LOADED: Mutex<Vec<Arc<Shared>>> = Mutex::new(Vec::new());

/// A loaded NCCL net plugin.
#[derive(Clone)]
pub struct Plugin {
    shared: Arc<Shared>,
    options: PluginOptions,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.shared.name)
            .field("version", &self.version())
            .field("library", &self.shared.opened_as)
            .finish()
    }
}

impl Plugin {
    /// Loads a plugin as NCCL would for `NCCL_NET_PLUGIN=spec` (see [`loader::candidate_names`])
    /// and calls its `init` (once per library for the life of the process).
    pub fn load(spec: Option<&str>) -> Result<Plugin> {
        Plugin::load_with(spec, PluginOptions::default())
    }

    pub fn load_with(spec: Option<&str>, options: PluginOptions) -> Result<Plugin> {
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        let names = loader::candidate_names(spec);
        if let Some(shared) = loaded.iter().find(|s| names.contains(&s.opened_as)) {
            return Ok(Plugin {
                shared: Arc::clone(shared),
                options,
            });
        }
        let opened = loader::open(spec)?;
        let name = opened
            .table
            .name()
            .unwrap_or_else(|| opened.opened_as.clone());
        let shared = Arc::new(Shared {
            table: opened.table,
            name,
            opened_as: opened.opened_as,
            next_comm: AtomicU64::new(0),
        });
        let init = common_fn!(&shared, init, "init", "loading the plugin")?;
        common_fn!(&shared, devices, "devices", "loading the plugin")?;
        let logger = crate::logger::plugin_logger();
        // SAFETY: `init` comes from the plugin's table; the logger is the C shim, valid forever.
        let code = unsafe { init(logger) };
        shared.check(code, || site("init"))?;
        tracing::info!(
            plugin = %shared.name,
            version = %shared.table.version(),
            library = %shared.opened_as,
            "net plugin loaded"
        );
        loaded.push(Arc::clone(&shared));
        Ok(Plugin { shared, options })
    }

    /// The table's `name` (e.g. "GPUDirectTCPX_v7").
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The ABI version found (newest exported wins).
    pub fn version(&self) -> AbiVersion {
        self.shared.table.version()
    }

    /// The library name or path that opened.
    pub fn library(&self) -> &str {
        &self.shared.opened_as
    }

    pub fn options(&self) -> PluginOptions {
        self.options
    }

    /// The same loaded plugin, driven with other options (comms opened later use them).
    pub fn with_options(&self, options: PluginOptions) -> Plugin {
        Plugin {
            shared: Arc::clone(&self.shared),
            options,
        }
    }

    /// Number of network devices the plugin offers.
    pub fn device_count(&self) -> Result<usize> {
        let devices = common_fn!(&self.shared, devices, "devices", "listing devices")?;
        let mut n: c_int = 0;
        // SAFETY: `devices` writes one int through the pointer we own.
        let code = unsafe { devices(&mut n) };
        self.shared.check(code, || site("devices"))?;
        usize::try_from(n).map_err(|_| FfiError::Contract {
            plugin: self.shared.name.clone(),
            site: site("devices"),
            what: format!("reported {n} devices"),
        })
    }

    fn dev_index(&self, dev: usize, call: &'static str) -> Result<c_int> {
        let count = self.device_count()?;
        if dev >= count {
            return Err(FfiError::Usage {
                site: site(call),
                what: format!(
                    "device {dev} does not exist: plugin `{}` has {count} device(s) (0..{count})",
                    self.shared.name
                ),
            });
        }
        Ok(dev as c_int)
    }

    /// Properties of device `dev`.
    pub fn properties(&self, dev: usize) -> Result<NetProperties> {
        let d = self.dev_index(dev, "getProperties")?;
        let check = |code| self.shared.check(code, || site("getProperties"));
        let missing = |s: &Shared| s.missing("getProperties", "device properties");
        // SAFETY (all arms): `getProperties` fills the properties struct of its own version, which
        // we own and zero-initialise; the strings it points to are owned by the plugin.
        unsafe {
            match self.shared.table {
                Table::V7(t) => {
                    let mut p: NetPropertiesV7 = std::mem::zeroed();
                    check((*t).get_properties.ok_or_else(|| missing(&self.shared))?(
                        d, &mut p,
                    ))?;
                    Ok(net_properties!(p, reg_is_global: false))
                }
                Table::V8(t) => {
                    let mut p: NetPropertiesV8 = std::mem::zeroed();
                    check((*t).get_properties.ok_or_else(|| missing(&self.shared))?(
                        d, &mut p,
                    ))?;
                    Ok(net_properties!(p, reg_is_global: p.reg_is_global != 0))
                }
                Table::V9(t) => {
                    let mut p: NetPropertiesV9 = std::mem::zeroed();
                    check((*t).get_properties.ok_or_else(|| missing(&self.shared))?(
                        d, &mut p,
                    ))?;
                    Ok(net_properties!(p, reg_is_global: p.reg_is_global != 0))
                }
            }
        }
    }

    /// Listens on device `dev`; `channel` only labels the comm in messages.
    pub fn listen(
        &self,
        dev: usize,
        channel: u32,
        ctx: Arc<dyn CurrentContext>,
    ) -> Result<ListenComm> {
        let d = self.dev_index(dev, "listen")?;
        let listen = common_fn!(&self.shared, listen, "listen", "listening")?;
        common_fn!(
            &self.shared,
            close_listen,
            "closeListen",
            "closing a listener"
        )?;
        let id = self.shared.new_comm_id();
        let here = || CallSite {
            call: "listen",
            comm: Some(id),
            channel: Some(channel),
        };
        make_current(&*ctx, here)?;
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut comm: *mut c_void = std::ptr::null_mut();
        // SAFETY: the handle buffer is NCCL_NET_HANDLE_MAXSIZE bytes; `comm` receives a pointer.
        let code = unsafe { listen(d, handle.as_mut_ptr().cast(), &mut comm) };
        self.shared.check(code, here)?;
        if comm.is_null() {
            return Err(FfiError::Contract {
                plugin: self.shared.name.clone(),
                site: here(),
                what: "listen succeeded without a listen comm".into(),
            });
        }
        Ok(ListenComm {
            plugin: self.clone(),
            ptr: comm,
            id,
            channel,
            dev,
            ctx,
            handle: ConnectHandle(handle),
        })
    }

    /// Connects to the listener whose handle the peer sent, calling the plugin's `connect` again
    /// while it answers "not yet" (a NULL comm) until `deadline`.
    pub fn connect(
        &self,
        dev: usize,
        handle: &ConnectHandle,
        channel: u32,
        ctx: Arc<dyn CurrentContext>,
        deadline: Instant,
    ) -> Result<SendComm> {
        let d = self.dev_index(dev, "connect")?;
        let connect = common_fn!(&self.shared, connect, "connect", "connecting")?;
        common_fn!(&self.shared, close_send, "closeSend", "closing a send comm")?;
        common_fn!(&self.shared, test, "test", "sending")?;
        let id = self.shared.new_comm_id();
        let here = move || CallSite {
            call: "connect",
            comm: Some(id),
            channel: Some(channel),
        };
        // The plugin keeps its connection state in the handle between calls: one copy for all.
        let mut handle = handle.0;
        let mut dev_storage = Box::new(NetDeviceHandle::zeroed());
        let comm = poll_until(
            &mut dev_storage,
            deadline,
            |dev_storage| {
                make_current(&*ctx, here)?;
                let mut comm: *mut c_void = std::ptr::null_mut();
                let mut dev_ptr: *mut NetDeviceHandle = &mut **dev_storage;
                // SAFETY: handle is 128 bytes we own; `dev_ptr` points to storage for one device
                // handle that outlives the call.
                let code =
                    unsafe { connect(d, handle.as_mut_ptr().cast(), &mut comm, &mut dev_ptr) };
                self.shared.check(code, here)?;
                Ok((!comm.is_null()).then_some(comm))
            },
            |_, waited| FfiError::Timeout {
                what: "connecting".into(),
                site: here(),
                waited,
                check: "the peer must be listening and the handle must come from its listen; \
                        check the route to its address and that it calls accept",
            },
        )?;
        let raw = Arc::new(RawComm {
            plugin: self.clone(),
            ptr: comm,
            id,
            channel,
            side: Side::Send,
            unpack: false,
        });
        Ok(SendComm {
            raw,
            ctx,
            queue: VecDeque::new(),
            posted: 0,
        })
    }
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the plugin's property strings are NUL-terminated and live as long as the plugin.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn make_current(ctx: &dyn CurrentContext, site: impl FnOnce() -> CallSite) -> Result<()> {
    ctx.make_current().map_err(|reason| FfiError::Context {
        site: site(),
        reason,
    })
}

/// Polling pauses: spin politely first, then sleep briefly so a long wait does not burn a core.
fn poll_backoff() -> Backoff {
    Backoff::spin_then_sleep(999, Duration::from_micros(50))
}

/// Calls `attempt` on `state` until it yields a value, with polling pauses in between; once
/// `deadline` has passed, the error `timed_out` makes from `state` and the time waited.
fn poll_until<S, T>(
    state: &mut S,
    deadline: Instant,
    mut attempt: impl FnMut(&mut S) -> Result<Option<T>>,
    timed_out: impl FnOnce(&S, Duration) -> FfiError,
) -> Result<T> {
    let started = Instant::now();
    let mut backoff = poll_backoff();
    loop {
        if let Some(value) = attempt(state)? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(timed_out(state, started.elapsed()));
        }
        backoff.pause();
    }
}

/// A listening comm; closed on drop.
pub struct ListenComm {
    plugin: Plugin,
    ptr: *mut c_void,
    id: u64,
    channel: u32,
    dev: usize,
    ctx: Arc<dyn CurrentContext>,
    handle: ConnectHandle,
}

// SAFETY: the listen comm is used by one owner at a time (`&mut self` for accept).
unsafe impl Send for ListenComm {}

impl ListenComm {
    /// The bytes the peer needs for `connect`.
    pub fn handle(&self) -> &ConnectHandle {
        &self.handle
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Accepts one connection, calling the plugin's `accept` again while it answers "not yet"
    /// (a NULL comm) until `deadline`. Storage for the device handle is provided (GPUDirect-TCPX
    /// writes into it and would crash on NULL).
    pub fn accept(&mut self, deadline: Instant) -> Result<RecvComm> {
        let shared = &*self.plugin.shared;
        let accept = common_fn!(shared, accept, "accept", "accepting")?;
        common_fn!(shared, close_recv, "closeRecv", "closing a recv comm")?;
        common_fn!(shared, test, "test", "receiving")?;
        let id = shared.new_comm_id();
        let channel = self.channel;
        let here = move || CallSite {
            call: "accept",
            comm: Some(id),
            channel: Some(channel),
        };
        let mut storage = Box::new(NetDeviceHandle::zeroed());
        let mut dev_ptr: *mut NetDeviceHandle = &mut *storage;
        let comm = poll_until(
            &mut dev_ptr,
            deadline,
            |dev_ptr| {
                make_current(&*self.ctx, here)?;
                let mut comm: *mut c_void = std::ptr::null_mut();
                // SAFETY: `self.ptr` is our live listen comm; `dev_ptr` points to storage for one
                // device handle (or to the plugin's own, if it replaced the pointer earlier).
                let code = unsafe { accept(self.ptr, &mut comm, dev_ptr) };
                shared.check(code, here)?;
                Ok((!comm.is_null()).then_some(comm))
            },
            |_, waited| FfiError::Timeout {
                what: "accepting".into(),
                site: here(),
                waited,
                check: "the peer must call connect with this listener's handle; check that \
                        the handle reached it and the network path between you",
            },
        )?;
        let device_handle = if dev_ptr.is_null() {
            NetDeviceHandle::zeroed()
        } else {
            // SAFETY: non-NULL: either our storage or a handle the plugin owns for this comm.
            unsafe { *dev_ptr }
        };
        let props = self.plugin.properties(self.dev)?;
        let unpack = device_handle.net_device_type == NCCL_NET_DEVICE_UNPACK
            || matches!(props.device, DeviceKind::Unpack { .. });
        let raw = Arc::new(RawComm {
            plugin: self.plugin.clone(),
            ptr: comm,
            id,
            channel,
            side: Side::Recv,
            unpack,
        });
        let mut recv = RecvComm {
            raw,
            ctx: Arc::clone(&self.ctx),
            queue: VecDeque::new(),
            posted: 0,
            device_handle,
            host_unpack: None,
            device_unpack: None,
        };
        if unpack {
            common_fn!(
                shared,
                irecv_consumed,
                "irecvConsumed",
                "receiving on an UNPACK device"
            )?;
            if device_handle.handle.is_null() {
                return Err(recv.contract(
                    "accept",
                    "the device is UNPACK but accept gave no unpack handle".into(),
                ));
            }
            let on_device = tcpx_gpu::is_device_pointer(device_handle.handle as usize as u64);
            if self.plugin.options.unpack == UnpackHandling::Cpu && !on_device {
                // SAFETY: with `UnpackHandling::Cpu` the caller declared that this plugin keeps
                // its unpack handle in host memory, and CUDA does not know the address as device
                // memory (a GPU comm of the test plugin is left to the GPU path); it is a plain
                // struct of three words.
                let h: UnpackHandle =
                    unsafe { std::ptr::read(device_handle.handle.cast::<UnpackHandle>()) };
                if h.meta.is_null() || h.bounce_buf.is_null() {
                    return Err(recv.contract(
                        "accept",
                        "the unpack handle has a NULL meta or bounce buffer".into(),
                    ));
                }
                recv.host_unpack = Some(h);
            }
        }
        Ok(recv)
    }
}

impl Drop for ListenComm {
    fn drop(&mut self) {
        let shared = &*self.plugin.shared;
        if let Ok(close) = common_fn!(shared, close_listen, "closeListen", "closing") {
            // SAFETY: our live listen comm, closed once.
            let code = unsafe { close(self.ptr) };
            if code != abi::NCCL_SUCCESS {
                tracing::warn!(comm = self.id, code, "closeListen failed");
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Send,
    Recv,
}

/// A send or recv comm pointer, closed when the comm and all its registrations are gone.
struct RawComm {
    plugin: Plugin,
    ptr: *mut c_void,
    id: u64,
    channel: u32,
    side: Side,
    /// Receives need the UNPACK rules (4 MiB per irecv, 4 KiB-aligned registrations).
    unpack: bool,
}

// SAFETY: the comm pointer is only passed back to the plugin, which NCCL also drives from
// several threads (proxy and main thread for regMr/deregMr).
unsafe impl Send for RawComm {}
// SAFETY: as above; shared use is limited to deregMr from registrations.
unsafe impl Sync for RawComm {}

impl RawComm {
    fn site(&self, call: &'static str) -> CallSite {
        CallSite {
            call,
            comm: Some(self.id),
            channel: Some(self.channel),
        }
    }

    fn shared(&self) -> &Shared {
        &self.plugin.shared
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        let shared = &*self.plugin.shared;
        let close = match self.side {
            Side::Send => common_fn!(shared, close_send, "closeSend", "closing"),
            Side::Recv => common_fn!(shared, close_recv, "closeRecv", "closing"),
        };
        let Ok(close) = close else { return };
        /// The comm pointer, moved to the thread that closes it.
        struct Closing(*mut c_void);
        // SAFETY: the pointer is only passed back to the plugin, by that thread alone, once.
        unsafe impl Send for Closing {}
        let comm = Closing(self.ptr);
        let (tx, rx) = std::sync::mpsc::channel();
        // A close that blocks inside the plugin must not hang the process: it runs on its own
        // thread, waited for up to CLOSE_DEADLINE, then left to the plugin (the library stays
        // loaded for the life of the process, so the call stays valid).
        let spawned = std::thread::Builder::new()
            .name("tcpx-ffi-close".into())
            .spawn(move || {
                let comm = comm;
                // SAFETY: our live comm; every registration and request on it is gone by now,
                // and nothing else holds its pointer.
                let code = unsafe { close(comm.0) };
                let _ = tx.send(code);
            });
        let code = match spawned {
            Ok(_) => match rx.recv_timeout(CLOSE_DEADLINE) {
                Ok(code) => code,
                Err(_) => {
                    tracing::warn!(
                        comm = self.id,
                        channel = self.channel,
                        "closing a comm did not return within {CLOSE_DEADLINE:?}: left to the \
                         plugin, not waited for (check the plugin's log and its peer)"
                    );
                    return;
                }
            },
            // No thread to spare: close here, unbounded (a leaked comm would be worse).
            // SAFETY: as above; the closure that owned the pointer was never run.
            Err(_) => unsafe { close(self.ptr) },
        };
        if code != abi::NCCL_SUCCESS {
            tracing::warn!(comm = self.id, code, "closing a comm failed");
        }
    }
}

/// Longest wait for a plugin's closeSend/closeRecv before it is left to run on by itself.
pub const CLOSE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Memory registered with one comm; deregistered when the last reference (the caller's or an
/// in-flight request's) goes away.
pub struct MemoryRegistration<M: PluginMemory> {
    raw: Arc<RawComm>,
    mhandle: *mut c_void,
    mem: M,
}

// SAFETY: the mhandle is only passed back to the plugin; `M` is Send + Sync by its trait bound.
unsafe impl<M: PluginMemory> Send for MemoryRegistration<M> {}
// SAFETY: as above.
unsafe impl<M: PluginMemory> Sync for MemoryRegistration<M> {}

impl<M: PluginMemory> MemoryRegistration<M> {
    /// The registered memory (access to its bytes goes through its own checked API).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The comm this registration belongs to.
    pub fn comm_id(&self) -> u64 {
        self.raw.id
    }
}

impl<M: PluginMemory> Drop for MemoryRegistration<M> {
    fn drop(&mut self) {
        if let Ok(dereg) = common_fn!(self.raw.shared(), dereg_mr, "deregMr", "deregistering") {
            // SAFETY: our registration on our live comm, deregistered once.
            let code = unsafe { dereg(self.raw.ptr, self.mhandle) };
            if code != abi::NCCL_SUCCESS {
                tracing::warn!(comm = self.raw.id, code, "deregMr failed");
            }
        }
    }
}

fn register<M: PluginMemory>(
    raw: &Arc<RawComm>,
    ctx: &dyn CurrentContext,
    mem: M,
) -> Result<Arc<MemoryRegistration<M>>> {
    let here = || raw.site("regMr");
    let shared = raw.shared();
    let len = mem.len();
    let base = mem.base_ptr();
    if len == 0 {
        return Err(FfiError::Usage {
            site: here(),
            what: "cannot register 0 bytes".into(),
        });
    }
    let needs_pages = mem.kind() == MemoryKind::Cuda || raw.unpack;
    if needs_pages && (base as usize) % UNPACK_PAGE != 0 {
        return Err(FfiError::Usage {
            site: here(),
            what: format!(
                "buffer at {base:p} is not {UNPACK_PAGE}-byte aligned (it is {} bytes past a \
                 page): GPUDirect-TCPX registers whole 4 KiB pages; allocate page-aligned memory \
                 (tcpx_gpu::HostBuffer or a device buffer) and register it from its start",
                base as usize % UNPACK_PAGE
            ),
        });
    }
    common_fn!(shared, dereg_mr, "deregMr", "registering memory")?;
    make_current(ctx, here)?;
    let ptr_type = mem.kind().nccl_ptr_type();
    let mut mhandle: *mut c_void = std::ptr::null_mut();
    // Only v7's `int` size can be too small for `len`.
    let too_long = || FfiError::Usage {
        site: here(),
        what: format!("{len} bytes do not fit the int size of a v7 regMr (< 2 GiB)"),
    };
    // SAFETY (all versions): `base` is valid for `len` bytes for the life of `mem`, which the
    // registration owns, so it outlives the registration; `mhandle` receives one pointer.
    let code = unsafe {
        with_table!(shared.table, |t| {
            let size = size_arg(len, too_long)?;
            let reg_mr = version_fn!(t, shared, reg_mr, "regMr", "registering memory")?;
            reg_mr(raw.ptr, base.cast(), size, ptr_type, &mut mhandle)
        })
    };
    shared.check(code, here)?;
    Ok(Arc::new(MemoryRegistration {
        raw: Arc::clone(raw),
        mhandle,
        mem,
    }))
}

/// A version's `irecv` with its sizes as `S` (`int` before v9, `size_t` from v9).
type IrecvFn<S> = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut S,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> NcclResult;

/// `len` as the size argument of one version's call: an `int` before v9 (`too_long` past its
/// range), a `size_t` from v9 on.
fn size_arg<S: TryFrom<usize>>(len: usize, too_long: impl FnOnce() -> FfiError) -> Result<S> {
    S::try_from(len).map_err(|_| too_long())
}

/// Posts an `irecv` of one buffer: `(comm, data, size, tag, mhandle)`, the request into `req`.
///
/// # Safety
/// As the plugin's `irecv`: `data` is valid for `size` bytes until the request is done and
/// `mhandle` is the registration covering them.
unsafe fn irecv_one<S>(
    f: IrecvFn<S>,
    (comm, data, size, tag, mhandle): (*mut c_void, *mut c_void, S, c_int, *mut c_void),
    req: &mut *mut c_void,
) -> NcclResult {
    let (mut datas, mut sizes, mut tags, mut mhandles) = ([data], [size], [tag], [mhandle]);
    // SAFETY: n == 1 and every array has one element; the rest is the caller's promise.
    unsafe {
        f(
            comm,
            1,
            datas.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhandles.as_mut_ptr(),
            req,
        )
    }
}

/// One posted request and what keeps its memory alive and exclusively lent.
struct Pending {
    req: *mut c_void,
    id: RequestId,
    len: usize,
    /// Start of the request's bytes (for the CPU unpack; a device address for CUDA memory).
    dst: *mut u8,
    /// Where the request's bytes live.
    kind: MemoryKind,
    done: bool,
    /// The GPU unpack of a finished receive, until `consumed` (declared before `hold`, so an
    /// unfinished kernel is waited for before the memory it writes can go).
    job: Option<tcpx_gpu::UnpackJob>,
    /// The registration (`Arc`) and the lease over the request's range.
    hold: Box<dyn Send>,
}

impl Pending {
    /// For a comm dropped while its plugin may still touch this request's memory: keep the
    /// memory alive forever rather than risk a write into freed memory.
    fn abandon(self) {
        std::mem::forget(self.hold);
    }
}

/// A request about to be posted: its range checked against the registration and lent to it.
struct Posting {
    /// Start of the request's bytes.
    data: *mut u8,
    len: usize,
    kind: MemoryKind,
    hold: Box<dyn Send>,
}

impl Posting {
    fn new<M: PluginMemory>(
        raw: &RawComm,
        call: &'static str,
        reg: &Arc<MemoryRegistration<M>>,
        offset: usize,
        len: usize,
    ) -> Result<Posting> {
        check_range(raw, call, reg, offset, len)?;
        let hold = lease(raw, call, reg, offset, len)?;
        // `wrapping_add`: for GPU memory the base is a device address, not a host allocation
        // Rust may reason about; offset + len is inside the registration (checked above).
        let data = reg.mem.base_ptr().wrapping_add(offset);
        Ok(Posting {
            data,
            len,
            kind: reg.mem.kind(),
            hold,
        })
    }

    /// Queues the request the plugin returned for this posting, numbered in posting order;
    /// `None` when it returned none (the plugin is busy, and the range is no longer lent).
    fn queue(
        self,
        req: *mut c_void,
        queue: &mut VecDeque<Pending>,
        posted: &mut u64,
    ) -> Option<RequestId> {
        if req.is_null() {
            return None;
        }
        let id = RequestId(*posted);
        *posted += 1;
        queue.push_back(Pending {
            req,
            id,
            len: self.len,
            dst: self.data,
            kind: self.kind,
            done: false,
            job: None,
            hold: self.hold,
        });
        Some(id)
    }
}

fn check_range<M: PluginMemory>(
    raw: &RawComm,
    call: &'static str,
    reg: &MemoryRegistration<M>,
    offset: usize,
    len: usize,
) -> Result<()> {
    if !std::ptr::eq(Arc::as_ptr(&reg.raw), raw) {
        return Err(FfiError::Usage {
            site: raw.site(call),
            what: format!(
                "the memory is registered on comm {}, not on this comm: register it here",
                reg.raw.id
            ),
        });
    }
    if offset.checked_add(len).is_none_or(|end| end > reg.len()) {
        return Err(FfiError::Usage {
            site: raw.site(call),
            what: format!(
                "bytes {offset}+{len} are outside the registered {} bytes",
                reg.len()
            ),
        });
    }
    Ok(())
}

fn lease<M: PluginMemory>(
    raw: &RawComm,
    call: &'static str,
    reg: &Arc<MemoryRegistration<M>>,
    offset: usize,
    len: usize,
) -> Result<Box<dyn Send>> {
    let lease = if len == 0 {
        None
    } else {
        Some(reg.mem.lease(offset, len).map_err(|e| FfiError::Usage {
            site: raw.site(call),
            what: format!("bytes {offset}+{len} are in use elsewhere: {e}"),
        })?)
    };
    Ok(Box::new((Arc::clone(reg), lease)))
}

fn full(raw: &RawComm, call: &'static str) -> FfiError {
    FfiError::Usage {
        site: raw.site(call),
        what: format!(
            "{MAX_IN_FLIGHT} requests already in flight on this comm: test (and consume) the \
             oldest before posting more"
        ),
    }
}

/// Calls the plugin's `test` on a request; `Some(size)` when done (size -1 if not written).
fn test_request(raw: &RawComm, req: *mut c_void) -> Result<Option<c_int>> {
    let test = common_fn!(raw.shared(), test, "test", "testing requests")?;
    let mut done: c_int = 0;
    let mut size: c_int = -1;
    // SAFETY: `req` is a live request of this comm, the oldest one not yet done.
    let code = unsafe { test(req, &mut done, &mut size) };
    raw.shared().check(code, || raw.site("test"))?;
    Ok((done != 0).then_some(size))
}

/// The sending side of a comm; closed on drop.
pub struct SendComm {
    raw: Arc<RawComm>,
    ctx: Arc<dyn CurrentContext>,
    queue: VecDeque<Pending>,
    posted: u64,
}

// SAFETY: a send comm has one owner; request pointers are only handed back to the plugin.
unsafe impl Send for SendComm {}

impl SendComm {
    pub fn id(&self) -> u64 {
        self.raw.id
    }

    pub fn channel(&self) -> u32 {
        self.raw.channel
    }

    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Registers `mem` with this comm (making the GPU context current first).
    pub fn register<M: PluginMemory>(&self, mem: M) -> Result<Arc<MemoryRegistration<M>>> {
        register(&self.raw, &*self.ctx, mem)
    }

    /// Posts a send of `offset..offset + len` of `reg`. `Ok(None)`: the plugin is busy, try
    /// again after testing. The range stays lent out until the send completes.
    pub fn isend<M: PluginMemory>(
        &mut self,
        reg: &Arc<MemoryRegistration<M>>,
        offset: usize,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        let raw = &*self.raw;
        let here = || raw.site("isend");
        if self.queue.len() >= MAX_IN_FLIGHT {
            return Err(full(raw, "isend"));
        }
        let posting = Posting::new(raw, "isend", reg, offset, len)?;
        let shared = raw.shared();
        let buf: *mut c_void = posting.data.cast();
        let mut req: *mut c_void = std::ptr::null_mut();
        // Only an `int` size (before v9) can be too small for `len`.
        let too_long = || FfiError::Usage {
            site: here(),
            what: format!("{len} bytes do not fit the int size of this ABI's isend"),
        };
        // SAFETY (all versions): `buf` points to `len` bytes leased to this request until it is
        // done; `mhandle` is the registration covering them; `req` receives one pointer.
        let code = unsafe {
            with_table!(shared.table, |t| {
                let isend = version_fn!(t, shared, isend, "isend", "sending")?;
                let size = size_arg(len, too_long)?;
                isend(raw.ptr, buf, size, tag, reg.mhandle, &mut req)
            })
        };
        shared.check(code, here)?;
        Ok(posting.queue(req, &mut self.queue, &mut self.posted))
    }

    /// Tests the oldest send (the only one the plugin may be asked about).
    pub fn test(&mut self) -> Result<Option<SendCompletion>> {
        let Some(front) = self.queue.front() else {
            return Err(FfiError::Usage {
                site: self.raw.site("test"),
                what: "no send in flight to test".into(),
            });
        };
        if test_request(&self.raw, front.req)?.is_none() {
            return Ok(None);
        }
        let p = self.queue.pop_front().expect("front exists");
        Ok(Some(SendCompletion {
            id: p.id,
            len: p.len,
        }))
    }

    /// Tests the oldest send until it completes or `deadline` passes.
    pub fn wait(&mut self, deadline: Instant) -> Result<SendCompletion> {
        poll_until(self, deadline, SendComm::test, |comm, waited| {
            let front = comm.queue.front().expect("tested above");
            FfiError::Timeout {
                what: format!("send #{} of {} bytes", front.id.0, front.len),
                site: comm.raw.site("test"),
                waited,
                check: "the peer must post a matching irecv and keep testing it; check that it \
                        is alive and that its side did not fail",
            }
        })
    }
}

impl Drop for SendComm {
    fn drop(&mut self) {
        abandon_unfinished(&self.raw, &mut self.queue);
    }
}

fn abandon_unfinished(raw: &RawComm, queue: &mut VecDeque<Pending>) {
    let unfinished = queue.iter().filter(|p| !p.done).count();
    if unfinished > 0 {
        tracing::warn!(
            comm = raw.id,
            channel = raw.channel,
            unfinished,
            "comm dropped with requests in flight: their memory stays allocated and the comm \
             open, since the plugin may still write it"
        );
    }
    for p in queue.drain(..) {
        if p.done {
            drop(p);
        } else {
            p.abandon();
        }
    }
}

/// The receiving side of a comm; closed on drop.
pub struct RecvComm {
    raw: Arc<RawComm>,
    ctx: Arc<dyn CurrentContext>,
    /// Posted receives in order; the done ones (awaiting `consumed`) come first.
    queue: VecDeque<Pending>,
    posted: u64,
    device_handle: NetDeviceHandle,
    /// The unpack handle, read once, when the caller declared it host memory.
    host_unpack: Option<UnpackHandle>,
    /// The unpack handle read off the GPU (GPUDirect-TCPX keeps it in device memory), once.
    device_unpack: Option<UnpackHandle>,
}

// SAFETY: a recv comm has one owner; its pointers are only handed back to the plugin or, for the
// host unpack, read while the plugin has finished writing the slot.
unsafe impl Send for RecvComm {}

impl RecvComm {
    pub fn id(&self) -> u64 {
        self.raw.id
    }

    pub fn channel(&self) -> u32 {
        self.raw.channel
    }

    /// Receives posted and not yet handed back (done or not).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Whether receives land in a bounce buffer and need an unpack.
    pub fn is_unpack(&self) -> bool {
        self.raw.unpack
    }

    /// The device handle accept wrote (type, version, unpack handle address).
    pub fn device_handle(&self) -> &NetDeviceHandle {
        &self.device_handle
    }

    /// Most bytes one irecv may ask for on this comm.
    pub fn max_recv_bytes(&self) -> usize {
        if self.raw.unpack {
            UNPACK_MAX_RECV_BYTES
        } else {
            c_int::MAX as usize
        }
    }

    fn contract(&self, call: &'static str, what: String) -> FfiError {
        FfiError::Contract {
            plugin: self.raw.shared().name.clone(),
            site: self.raw.site(call),
            what,
        }
    }

    /// Registers `mem` with this comm (making the GPU context current first).
    pub fn register<M: PluginMemory>(&self, mem: M) -> Result<Arc<MemoryRegistration<M>>> {
        if self.host_unpack.is_some() && mem.kind() == MemoryKind::Cuda {
            return Err(FfiError::Usage {
                site: self.raw.site("regMr"),
                what: "this comm unpacks on the CPU (the plugin's bounce buffer is host memory), \
                       which cannot write GPU memory: receive into host memory, or make the GPU's \
                       context current before accept so the plugin delivers to the GPU"
                    .into(),
            });
        }
        register(&self.raw, &*self.ctx, mem)
    }

    /// Whether finished receives must be unpacked on the GPU by the caller
    /// ([`RecvComm::start_gpu_unpack`]): an UNPACK device whose unpack handle is not read on the
    /// CPU here.
    pub fn needs_gpu_unpack(&self) -> bool {
        self.raw.unpack && self.host_unpack.is_none()
    }

    /// The unpack handle, copied off the GPU on first use (its 24 bytes live in device memory).
    fn device_unpack_handle(&mut self, device: &tcpx_gpu::Device) -> Result<UnpackHandle> {
        if let Some(h) = self.device_unpack {
            return Ok(h);
        }
        let mut bytes = [0u8; std::mem::size_of::<UnpackHandle>()];
        let at = self.device_handle.handle as usize as u64;
        // SAFETY: accept reported an UNPACK device with this non-NULL handle, which the plugin
        // keeps allocated (device memory, or host memory the driver can read) for the comm's life.
        unsafe { device.read_raw(at, &mut bytes) }.map_err(|e| {
            self.contract(
                "irecv",
                format!(
                    "cannot read the unpack handle at {at:#x} from GPU {}: {e}",
                    device.index()
                ),
            )
        })?;
        let word =
            |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let h = UnpackHandle {
            meta: word(0) as usize as *mut abi::NetUnpackMeta,
            bounce_buf: word(1) as usize as *mut c_void,
            head: word(2),
        };
        // A NULL bounce buffer is legal for receives into host memory (GPUDirect-TCPX without
        // rxdm's GPU receive memory); the GPU unpack refuses it (`start_gpu_unpack`).
        if h.meta.is_null() {
            return Err(self.contract(
                "irecv",
                "the unpack handle read from the GPU has a NULL meta".into(),
            ));
        }
        self.device_unpack = Some(h);
        Ok(h)
    }

    /// Queues the GPU unpack of finished receive `id` on `stream`: reads its slot's fragment list
    /// (host-mapped `netUnpackMeta`), checks every fragment against the receive's bytes, and
    /// launches the kernel from the plugin's bounce buffer into the receive buffer. Returns the
    /// bytes the fragments carry. [`RecvComm::consumed`] refuses the receive until the kernel
    /// has finished ([`RecvComm::unpack_done`]).
    pub fn start_gpu_unpack(&mut self, id: RequestId, stream: &tcpx_gpu::Stream) -> Result<usize> {
        let here = "test";
        if !self.needs_gpu_unpack() {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what:
                    "this comm needs no GPU unpack (not an UNPACK device, or unpacked on the CPU)"
                        .into(),
            });
        }
        let handle = self.device_unpack_handle(stream.device())?;
        if handle.bounce_buf.is_null() {
            return Err(self.contract(
                here,
                "the unpack handle has no bounce buffer (NULL), so receives into GPU memory \
                 cannot be unpacked: the plugin found no GPU receive memory (rxdm's \
                 get_gpu_fd_* sockets)"
                    .into(),
            ));
        }
        let Some(index) = self.queue.iter().position(|p| p.id == id) else {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!("receive #{} is not in flight on this comm", id.0),
            });
        };
        let p = &self.queue[index];
        if !p.done || p.job.is_some() {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!(
                    "receive #{} {}",
                    id.0,
                    if p.done {
                        "is already being unpacked"
                    } else {
                        "is not finished yet: test it first"
                    }
                ),
            });
        }
        if p.kind != MemoryKind::Cuda {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!(
                    "receive #{} is in host memory, but the plugin delivered it to GPU bounce \
                     pages: register GPU memory (tcpx_gpu::DeviceBuffer) for receives on this comm",
                    id.0
                ),
            });
        }
        let slot = (id.0 % UNPACK_SLOTS as u64) as usize;
        // SAFETY: `meta` comes from the plugin's unpack handle (host memory mapped to the device,
        // readable here); the plugin reported receive `id` (slot `slot`) done and does not write
        // the slot again before irecvConsumed, which `consumed` only calls after the kernel.
        let metas = unsafe { unpack::read_slot(handle.meta, slot) }
            .map_err(|e| self.contract(here, format!("unpack slot {slot}: {e}")))?;
        let copies = unpack::gpu_copies(metas, p.len)
            .map_err(|e| self.contract(here, format!("unpack slot {slot}: {e}")))?;
        let device = stream.device();
        let table = device
            .upload_unpack_table(&copies)
            .map_err(|e| FfiError::Gpu {
                site: self.raw.site(here),
                reason: e.to_string(),
            })?;
        // SAFETY: the bounce pages of this receive stay untouched by the plugin until
        // irecvConsumed, which waits for the job (see `consumed`); the destination is this
        // request's `len` bytes of registered GPU memory, lent to it until it is handed back.
        let job = unsafe {
            stream.unpack_raw(
                handle.bounce_buf as usize as u64,
                &table,
                p.dst as usize as u64,
                p.len,
            )
        }
        .map_err(|e| FfiError::Gpu {
            site: self.raw.site(here),
            reason: e.to_string(),
        })?;
        let bytes = job.bytes();
        tracing::trace!(
            comm = self.raw.id,
            slot,
            fragments = job.fragments(),
            bytes,
            "GPU unpack queued"
        );
        self.queue[index].job = Some(job);
        Ok(bytes)
    }

    /// For a finished receive into host memory on a comm whose unpack handle is device memory:
    /// checks that the plugin wrote its bytes in place (GPUDirect-TCPX receives host memory with
    /// plain `recv`, leaving the slot's fragment list empty), so it needs no unpack and only
    /// [`RecvComm::consumed`]. `reader`: any GPU (with unified addressing its context can read
    /// the handle wherever it lives). A plugin that put the bytes into bounce pages instead is
    /// refused: a host buffer cannot be the target of the GPU unpack.
    pub fn check_in_place(&mut self, id: RequestId, reader: &tcpx_gpu::Device) -> Result<()> {
        let here = "test";
        let Some(p) = self.queue.iter().find(|p| p.id == id) else {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!("receive #{} is not in flight on this comm", id.0),
            });
        };
        if !p.done || p.kind != MemoryKind::Host || !self.needs_gpu_unpack() {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!(
                    "receive #{} is not a finished host-memory receive on a GPU unpack comm",
                    id.0
                ),
            });
        }
        let handle = self.device_unpack_handle(reader)?;
        let slot = (id.0 % UNPACK_SLOTS as u64) as usize;
        // SAFETY: `meta` comes from the plugin's unpack handle (host memory mapped to the device,
        // readable here); the plugin reported receive `id` done and does not write its slot again
        // before irecvConsumed.
        let metas = unsafe { unpack::read_slot(handle.meta, slot) }
            .map_err(|e| self.contract(here, format!("unpack slot {slot}: {e}")))?;
        if !metas.is_empty() {
            return Err(FfiError::Usage {
                site: self.raw.site(here),
                what: format!(
                    "receive #{} is in host memory, but the plugin delivered it as {} fragments \
                     in GPU bounce pages: register GPU memory (tcpx_gpu::DeviceBuffer) for \
                     receives on this comm",
                    id.0,
                    metas.len()
                ),
            });
        }
        Ok(())
    }

    /// Whether the GPU unpack of receive `id` has finished (its event completed).
    pub fn unpack_done(&self, id: RequestId) -> Result<bool> {
        let Some(p) = self.queue.iter().find(|p| p.id == id) else {
            return Err(FfiError::Usage {
                site: self.raw.site("test"),
                what: format!("receive #{} is not in flight on this comm", id.0),
            });
        };
        match &p.job {
            None => Err(FfiError::Usage {
                site: self.raw.site("test"),
                what: format!("receive #{} has no GPU unpack queued", id.0),
            }),
            Some(job) => job.is_complete().map_err(|e| FfiError::Gpu {
                site: self.raw.site("test"),
                reason: e.to_string(),
            }),
        }
    }

    /// Posts a receive of up to `len` bytes into `offset..offset + len` of `reg` (n == 1).
    /// `Ok(None)`: the plugin is busy, try again after testing.
    pub fn irecv<M: PluginMemory>(
        &mut self,
        reg: &Arc<MemoryRegistration<M>>,
        offset: usize,
        len: usize,
        tag: i32,
    ) -> Result<Option<RequestId>> {
        let raw = &*self.raw;
        let here = || raw.site("irecv");
        if self.queue.len() >= MAX_IN_FLIGHT {
            return Err(full(raw, "irecv"));
        }
        if len > self.max_recv_bytes() {
            return Err(FfiError::Usage {
                site: here(),
                what: format!(
                    "a receive of {len} bytes is larger than the {} bytes one irecv may carry \
                     here{}: split the transfer into chunks of at most that size",
                    self.max_recv_bytes(),
                    if raw.unpack {
                        " (UNPACK device: 2048 pages of 4 KiB; GPUDirect-TCPX aborts beyond it)"
                    } else {
                        ""
                    }
                ),
            });
        }
        let posting = Posting::new(raw, "irecv", reg, offset, len)?;
        let shared = raw.shared();
        let buf: *mut c_void = posting.data.cast();
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY (all versions): `buf` points to `len` bytes leased to this request until it is
        // handed back; `req` receives one pointer. `len` fits an `int` size (at most
        // `max_recv_bytes`, checked above).
        let code = unsafe {
            with_table!(shared.table, |t| irecv_one(
                version_fn!(t, shared, irecv, "irecv", "receiving")?,
                (raw.ptr, buf, len as _, tag, reg.mhandle),
                &mut req,
            ))
        };
        shared.check(code, here)?;
        Ok(posting.queue(req, &mut self.queue, &mut self.posted))
    }

    /// Tests the oldest receive that is not done yet. On an UNPACK device with
    /// [`UnpackHandling::Cpu`] a finished receive is unpacked and handed back here; with
    /// [`UnpackHandling::Caller`] it stays held until [`RecvComm::consumed`].
    pub fn test(&mut self) -> Result<Option<RecvCompletion>> {
        let Some(index) = self.queue.iter().position(|p| !p.done) else {
            return Err(FfiError::Usage {
                site: self.raw.site("test"),
                what: format!(
                    "no receive waiting to be tested ({} done and awaiting consumed())",
                    self.queue.len()
                ),
            });
        };
        let Some(size) = test_request(&self.raw, self.queue[index].req)? else {
            return Ok(None);
        };
        let id = self.queue[index].id;
        if !self.raw.unpack {
            self.queue.remove(index);
            return Ok(Some(RecvCompletion {
                id,
                size: usize::try_from(size).ok(),
                unpack_slot: None,
                fragments: 0,
            }));
        }
        let slot = (id.0 % UNPACK_SLOTS as u64) as usize;
        self.queue[index].done = true;
        match self.host_unpack {
            None => Ok(Some(RecvCompletion {
                id,
                size: None,
                unpack_slot: Some(slot),
                fragments: 0,
            })),
            Some(handle) => {
                let (total, fragments) = self.unpack_on_cpu(&handle, index, slot)?;
                self.consumed()?;
                Ok(Some(RecvCompletion {
                    id,
                    size: Some(total),
                    unpack_slot: None,
                    fragments,
                }))
            }
        }
    }

    /// Copies the fragments of the finished receive at `index` from the bounce buffer into its
    /// destination.
    fn unpack_on_cpu(
        &self,
        handle: &UnpackHandle,
        index: usize,
        slot: usize,
    ) -> Result<(usize, usize)> {
        let p = &self.queue[index];
        // SAFETY: the host unpack handle's `meta` points to a live netUnpackMeta (checked
        // non-NULL at accept); the plugin reported this receive done and does not touch its slot
        // until irecvConsumed, which comes after this copy.
        let metas = unsafe { unpack::read_slot(handle.meta, slot) }
            .map_err(|e| self.contract("test", format!("unpack slot {slot}: {e}")))?;
        let count = metas.len();
        let total = unpack::check_load_metas(metas, p.len, None)
            .map_err(|e| self.contract("test", format!("unpack slot {slot}: {e}")))?;
        let bounce = handle.bounce_buf.cast::<u8>().cast_const();
        for m in metas {
            // SAFETY: the destination range is inside this request's leased bytes (checked by
            // `check_load_metas` against `p.len`); the source lies in the plugin's bounce buffer,
            // which holds this fragment until irecvConsumed; the two never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bounce.add(m.src_off as usize),
                    p.dst.add(m.dst_off as usize),
                    m.len as usize,
                );
            }
        }
        tracing::trace!(
            comm = self.raw.id,
            slot,
            count,
            total,
            "unpacked on the CPU"
        );
        Ok((total, count))
    }

    /// Hands the oldest finished receive back to the plugin (`irecvConsumed`), FIFO. On an
    /// UNPACK device call this only after the unpack of that receive has completed.
    pub fn consumed(&mut self) -> Result<RequestId> {
        let raw = &*self.raw;
        let here = || raw.site("irecvConsumed");
        match self.queue.front() {
            Some(p) if p.done => {}
            Some(p) => {
                return Err(FfiError::Usage {
                    site: here(),
                    what: format!(
                        "the oldest receive (#{}) is not done yet: test it first",
                        p.id.0
                    ),
                })
            }
            None => {
                return Err(FfiError::Usage {
                    site: here(),
                    what: "no finished receive to hand back".into(),
                })
            }
        }
        if !raw.unpack {
            return Err(FfiError::Usage {
                site: here(),
                what: "this comm is not on an UNPACK device; receives are handed back by test"
                    .into(),
            });
        }
        if let Some(job) = &self.queue.front().expect("checked").job {
            let finished = job.is_complete().map_err(|e| FfiError::Gpu {
                site: here(),
                reason: e.to_string(),
            })?;
            if !finished {
                return Err(FfiError::Usage {
                    site: here(),
                    what: "the GPU unpack of the oldest receive is still running: its bounce \
                           pages may not be recycled yet; wait for unpack_done"
                        .into(),
                });
            }
        }
        let f = common_fn!(
            raw.shared(),
            irecv_consumed,
            "irecvConsumed",
            "UNPACK receives"
        )?;
        let req = self.queue.front().expect("checked").req;
        // SAFETY: `req` is this comm's oldest receive, done and not yet consumed.
        let code = unsafe { f(raw.ptr, 1, req) };
        raw.shared().check(code, here)?;
        Ok(self.queue.pop_front().expect("checked").id)
    }

    /// Tests the oldest unfinished receive until it completes or `deadline` passes.
    pub fn wait(&mut self, deadline: Instant) -> Result<RecvCompletion> {
        poll_until(self, deadline, RecvComm::test, |comm, waited| {
            let p = comm.queue.iter().find(|p| !p.done).expect("tested above");
            FfiError::Timeout {
                what: format!("receive #{} of up to {} bytes", p.id.0, p.len),
                site: comm.raw.site("test"),
                waited,
                check: "the peer must post a matching isend and keep testing it; check that it \
                        is alive and that its side did not fail",
            }
        })
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        abandon_unfinished(&self.raw, &mut self.queue);
    }
}

impl std::fmt::Debug for ListenComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenComm")
            .field("id", &self.id)
            .field("channel", &self.channel)
            .field("dev", &self.dev)
            .finish()
    }
}

impl std::fmt::Debug for SendComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendComm")
            .field("id", &self.raw.id)
            .field("channel", &self.raw.channel)
            .field("in_flight", &self.queue.len())
            .finish()
    }
}

impl std::fmt::Debug for RecvComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvComm")
            .field("id", &self.raw.id)
            .field("channel", &self.raw.channel)
            .field("unpack", &self.raw.unpack)
            .field("in_flight", &self.queue.len())
            .finish()
    }
}

impl<M: PluginMemory> std::fmt::Debug for MemoryRegistration<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegistration")
            .field("comm", &self.raw.id)
            .field("len", &self.mem.len())
            .field("kind", &self.mem.kind())
            .finish()
    }
}
