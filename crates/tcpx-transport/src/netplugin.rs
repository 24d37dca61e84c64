//! Backend `netplugin`: any NCCL net plugin (a `.so` exporting `ncclNetPlugin_v9`, `_v8` or `_v7`)
//! driven through `tcpx-ffi`'s safe wrappers. GPUDirect-TCPX is the plugin that matters; in CI the
//! workspace's `tcpx-test-plugin` stands in for it, over loopback, in both of its delivery modes.
//!
//! One comm per channel, host memory. The plugin's rules (16 requests per comm, only the oldest
//! request tested, receives handed back in FIFO order, at most 4 MiB per receive on an UNPACK
//! device) are kept by `tcpx-ffi`; this module maps them onto the [`Transport`] trait, whose
//! callers may test any request: completions of older requests are remembered until asked for.
//!
//! On an UNPACK device (GPUDirect-TCPX) the bytes of a receive must be unpacked from the plugin's
//! bounce buffer. With the test plugin this happens on the CPU inside `tcpx-ffi`; with a real TCPX
//! plugin it needs the CUDA unpack kernel from `tcpx-gpu`, which this backend does not drive yet:
//! accepting a receive comm there is reported as unavailable rather than attempted.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tcpx_ffi::abi::UNPACK_MAX_RECV_BYTES;
use tcpx_ffi::{
    ConnectHandle, CurrentContext, DeviceKind, FfiError, MemoryRegistration, NetProperties,
    NoGpuContext, Plugin, PluginOptions, UnpackHandling, MAX_IN_FLIGHT,
};

use crate::{
    Handle, HostBuffer, Limits, Listener, Memory, MemoryKind, MrId, RecvComm, RequestId, Result,
    SendComm, Transport, TransportError,
};

/// Name the workspace's test plugin reports; its unpack handle is host memory, so receives on
/// its UNPACK device are unpacked on the CPU.
pub const TEST_PLUGIN_NAME: &str = "tcpx-test-plugin";

/// Settings of the netplugin backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetPluginConfig {
    /// Which plugin, as `NCCL_NET_PLUGIN` names it: a path, a name `X` (tried as `X`, then
    /// `libnccl-net-X.so`), or `None` for `libnccl-net.so`.
    pub plugin: Option<String>,
    /// The plugin's device (NIC) index.
    pub dev: usize,
    /// Environment the plugin reads (NCCL_GPUDIRECTTCPX_SOCKET_IFNAME, _CTRL_DEV, _TX_BINDINGS,
    /// _RX_BINDINGS, _UNIX_CLIENT_PREFIX, NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, ...). Set
    /// before the library is loaded and left set, since plugins read some of it later too; a
    /// library is initialised once per process, so only its first load sees them.
    pub env: Vec<(String, String)>,
}

impl NetPluginConfig {
    /// `NCCL_NET_PLUGIN` for the plugin, `TCPX_NETPLUGIN_DEV` for the device (default 0).
    pub fn from_env() -> Result<Self> {
        let dev = match std::env::var("TCPX_NETPLUGIN_DEV") {
            Ok(d) => d.trim().parse().map_err(|_| {
                TransportError::Usage(format!(
                    "TCPX_NETPLUGIN_DEV={d} is not a device index (0, 1, ...)"
                ))
            })?,
            Err(_) => 0,
        };
        Ok(NetPluginConfig {
            plugin: std::env::var("NCCL_NET_PLUGIN")
                .ok()
                .filter(|s| !s.is_empty()),
            dev,
            env: Vec::new(),
        })
    }
}

/// Serialises "set the plugin's environment, then load it".
static LOAD: Mutex<()> = Mutex::new(());

/// Turns a plugin-layer error into the transport's vocabulary, keeping its text.
fn ffi_err(e: FfiError) -> TransportError {
    match e {
        FfiError::Timeout {
            what,
            site,
            waited,
            check,
        } => TransportError::Timeout {
            what: format!("{what} at {site}"),
            secs: waited.as_secs_f64(),
            hint: check.to_string(),
        },
        e @ FfiError::Usage { .. } => TransportError::Usage(e.to_string()),
        e => TransportError::Failed(e.to_string()),
    }
}

/// A loaded net plugin, one of its devices, and the GPU context hook for its calls.
pub struct NetPluginTransport {
    plugin: Plugin,
    dev: usize,
    props: NetProperties,
    ctx: Arc<dyn CurrentContext>,
    /// Labels for messages: the n-th listen and the n-th connect are channel n, which is how the
    /// driver opens one comm per channel on each side.
    next_listen: AtomicU32,
    next_connect: AtomicU32,
}

impl NetPluginTransport {
    /// Loads the plugin (once per process and library) and checks that device `cfg.dev` exists.
    pub fn new(cfg: NetPluginConfig) -> Result<Self> {
        let plugin = {
            let _guard = LOAD.lock().unwrap_or_else(|p| p.into_inner());
            for (k, v) in &cfg.env {
                std::env::set_var(k, v);
            }
            Plugin::load(cfg.plugin.as_deref()).map_err(|e| TransportError::Unavailable {
                name: "netplugin".into(),
                reason: e.to_string(),
            })?
        };
        let unpack = if plugin.name() == TEST_PLUGIN_NAME {
            UnpackHandling::Cpu
        } else {
            UnpackHandling::Caller
        };
        let plugin = plugin.with_options(PluginOptions { unpack });
        let props = plugin.properties(cfg.dev).map_err(ffi_err)?;
        if !props.supports(tcpx_ffi::MemoryKind::Host) {
            return Err(TransportError::Unavailable {
                name: "netplugin".into(),
                reason: format!(
                    "plugin `{}` device {} does not take host memory (ptrSupport {:#x}); this \
                     backend moves host memory only so far",
                    plugin.name(),
                    cfg.dev,
                    props.ptr_support
                ),
            });
        }
        tracing::info!(
            plugin = plugin.name(),
            version = %plugin.version(),
            library = plugin.library(),
            dev = cfg.dev,
            nic = %props.name,
            speed_mbps = props.speed_mbps,
            device = ?props.device,
            "netplugin backend ready"
        );
        Ok(NetPluginTransport {
            plugin,
            dev: cfg.dev,
            props,
            ctx: Arc::new(NoGpuContext),
            next_listen: AtomicU32::new(0),
            next_connect: AtomicU32::new(0),
        })
    }

    /// Makes `ctx` current before listen/connect/accept/regMr (the GPU layer's hook).
    pub fn with_context(mut self, ctx: Arc<dyn CurrentContext>) -> Self {
        self.ctx = ctx;
        self
    }

    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    pub fn properties(&self) -> &NetProperties {
        &self.props
    }

    fn unpack(&self) -> bool {
        matches!(self.props.device, DeviceKind::Unpack { .. })
    }
}

impl Transport for NetPluginTransport {
    fn name(&self) -> &str {
        "netplugin"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_requests: MAX_IN_FLIGHT,
            max_request_bytes: if self.unpack() {
                UNPACK_MAX_RECV_BYTES
            } else {
                i32::MAX as usize
            },
            memory: vec![MemoryKind::Host],
        }
    }

    fn listen(&self) -> Result<Box<dyn Listener>> {
        let channel = self.next_listen.fetch_add(1, Ordering::Relaxed);
        let listen = self
            .plugin
            .listen(self.dev, channel, Arc::clone(&self.ctx))
            .map_err(ffi_err)?;
        Ok(Box::new(NetListener {
            listen,
            plugin: self.plugin.clone(),
        }))
    }

    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
        let h = ConnectHandle::from_bytes(handle.as_bytes()).ok_or_else(|| {
            TransportError::Protocol(format!(
                "handle of {} bytes is longer than a net plugin handle",
                handle.as_bytes().len()
            ))
        })?;
        let channel = self.next_connect.fetch_add(1, Ordering::Relaxed);
        let comm = self
            .plugin
            .connect(self.dev, &h, channel, Arc::clone(&self.ctx), deadline)
            .map_err(ffi_err)?;
        let peer = format!(
            "{} comm {} (channel {channel})",
            self.plugin.name(),
            comm.id()
        );
        Ok(Box::new(NetSendComm {
            comm,
            mrs: Registrations::default(),
            finished: HashMap::new(),
            peer,
        }))
    }
}

struct NetListener {
    listen: tcpx_ffi::ListenComm,
    plugin: Plugin,
}

impl Listener for NetListener {
    fn handle(&self) -> Handle {
        Handle::from_bytes(self.listen.handle().as_bytes().to_vec())
            .expect("a plugin handle is at most HANDLE_MAX bytes")
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let comm = self.listen.accept(deadline).map_err(ffi_err)?;
        if comm.is_unpack() && self.plugin.options().unpack == UnpackHandling::Caller {
            return Err(TransportError::Unavailable {
                name: "netplugin".into(),
                reason: format!(
                    "plugin `{}` delivers receives through an UNPACK device (GPUDirect-TCPX): \
                     they need the CUDA unpack kernel of tcpx-gpu, which this backend does not \
                     drive yet; sending works, receiving does not",
                    self.plugin.name()
                ),
            });
        }
        let peer = format!(
            "{} comm {} (channel {})",
            self.plugin.name(),
            comm.id(),
            comm.channel()
        );
        Ok(Box::new(NetRecvComm {
            comm,
            mrs: Registrations::default(),
            posted: HashMap::new(),
            order: VecDeque::new(),
            finished: HashMap::new(),
            tested: HashSet::new(),
            peer,
        }))
    }
}

type HostRegistration = Arc<MemoryRegistration<Arc<HostBuffer>>>;

/// Registrations of one comm by id; dropping one deregisters it once no request holds it.
#[derive(Default)]
struct Registrations {
    next: u32,
    by_id: HashMap<u32, HostRegistration>,
}

impl Registrations {
    fn add(&mut self, reg: HostRegistration) -> MrId {
        let id = self.next;
        self.next += 1;
        self.by_id.insert(id, reg);
        MrId(id)
    }

    fn get(&self, mr: MrId) -> Result<&HostRegistration> {
        self.by_id.get(&mr.0).ok_or_else(|| {
            TransportError::Usage(format!("memory registration {} is not on this comm", mr.0))
        })
    }

    fn remove(&mut self, mr: MrId) -> Result<()> {
        self.by_id.remove(&mr.0).map(drop).ok_or_else(|| {
            TransportError::Usage(format!("memory registration {} is not on this comm", mr.0))
        })
    }
}

fn host_buffer(mem: &Memory) -> Result<Arc<HostBuffer>> {
    #[allow(unreachable_patterns)] // other memory kinds may join the enum
    match mem {
        Memory::Host(b) => Ok(Arc::clone(b)),
        _ => Err(TransportError::Usage(
            "the netplugin backend registers host memory only so far".into(),
        )),
    }
}

struct NetSendComm {
    comm: tcpx_ffi::SendComm,
    mrs: Registrations,
    /// Sends the plugin finished before the caller asked about them: id -> bytes.
    finished: HashMap<u64, usize>,
    peer: String,
}

impl SendComm for NetSendComm {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        let reg = self.comm.register(host_buffer(mem)?).map_err(ffi_err)?;
        Ok(self.mrs.add(reg))
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        self.mrs.remove(mr)
    }

    fn isend(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        if self.comm.in_flight() >= MAX_IN_FLIGHT {
            return Ok(None);
        }
        let reg = Arc::clone(self.mrs.get(mr)?);
        let id = self
            .comm
            .isend(&reg, offset, len, tag as i32)
            .map_err(ffi_err)?;
        Ok(id.map(|id| RequestId(id.0)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(bytes) = self.finished.remove(&req.0) {
            return Ok(Some(bytes));
        }
        if self.comm.in_flight() == 0 {
            return Err(TransportError::Usage(format!(
                "send {} is not in flight on {}",
                req.0, self.peer
            )));
        }
        match self.comm.test().map_err(ffi_err)? {
            Some(done) if done.id.0 == req.0 => Ok(Some(done.len)),
            Some(done) => {
                self.finished.insert(done.id.0, done.len);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }
}

struct NetRecvComm {
    comm: tcpx_ffi::RecvComm,
    mrs: Registrations,
    /// Bytes asked for by each posted receive (the size when the plugin does not report one).
    posted: HashMap<u64, usize>,
    /// Receives not yet consumed, oldest first.
    order: VecDeque<u64>,
    /// Receives the plugin finished before the caller asked about them: id -> bytes.
    finished: HashMap<u64, usize>,
    /// Receives reported finished to the caller, awaiting `consume`.
    tested: HashSet<u64>,
    peer: String,
}

impl RecvComm for NetRecvComm {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        let reg = self.comm.register(host_buffer(mem)?).map_err(ffi_err)?;
        Ok(self.mrs.add(reg))
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        self.mrs.remove(mr)
    }

    fn irecv(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        if self.comm.in_flight() >= MAX_IN_FLIGHT {
            return Ok(None);
        }
        let reg = Arc::clone(self.mrs.get(mr)?);
        let Some(id) = self
            .comm
            .irecv(&reg, offset, len, tag as i32)
            .map_err(ffi_err)?
        else {
            return Ok(None);
        };
        self.posted.insert(id.0, len);
        self.order.push_back(id.0);
        Ok(Some(RequestId(id.0)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(&bytes) = self.finished.get(&req.0) {
            self.tested.insert(req.0);
            return Ok(Some(bytes));
        }
        if !self.posted.contains_key(&req.0) {
            return Err(TransportError::Usage(format!(
                "receive {} is not posted on {}",
                req.0, self.peer
            )));
        }
        let Some(done) = self.comm.test().map_err(ffi_err)? else {
            return Ok(None);
        };
        let asked = self.posted[&done.id.0];
        let bytes = done.size.unwrap_or(asked);
        self.finished.insert(done.id.0, bytes);
        if done.id.0 == req.0 {
            self.tested.insert(req.0);
            Ok(Some(bytes))
        } else {
            Ok(None)
        }
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.order.front() {
            Some(&oldest) if oldest == req.0 && self.tested.remove(&req.0) => {
                self.order.pop_front();
                self.finished.remove(&req.0);
                self.posted.remove(&req.0);
                Ok(())
            }
            Some(&oldest) if oldest == req.0 => Err(TransportError::Usage(format!(
                "receive {} consumed before test reported it finished on {}",
                req.0, self.peer
            ))),
            _ => Err(TransportError::Usage(format!(
                "receive {} consumed out of FIFO order on {}",
                req.0, self.peer
            ))),
        }
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }
}
