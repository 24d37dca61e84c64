//! Backend `netplugin`: any NCCL net plugin (a `.so` exporting `ncclNetPlugin_v9`, `_v8` or `_v7`)
//! driven through `tcpx-ffi`'s safe wrappers. GPUDirect-TCPX is the plugin that matters; in CI the
//! workspace's `tcpx-test-plugin` stands in for it, over loopback, in both of its delivery modes.
//!
//! One comm per channel, host memory. The plugin's rules (16 requests per comm, only the oldest
//! request tested, receives handed back in FIFO order, at most 4 MiB per receive on an UNPACK
//! device) are kept by `tcpx-ffi`; this module maps them onto the [`Transport`] trait, whose
//! callers may test any request: completions of older requests are remembered until asked for.
//!
//! Host memory always; GPU memory ([`Memory::Cuda`]) once the transport is given its GPU
//! ([`NetPluginTransport::with_device`]), whose primary context is then made current before
//! listen, connect, accept and regMr (GPUDirect-TCPX picks the GPU from the current context).
//!
//! On an UNPACK device (GPUDirect-TCPX) the bytes of a receive may have to be unpacked from the
//! plugin's bounce buffer; who does it follows from where accept's unpack handle lives, never from
//! which plugin this is. A handle in host memory (the test plugin delivering to host memory) is
//! read on the CPU and receives are unpacked there inside `tcpx-ffi`. A handle in device memory
//! (GPUDirect-TCPX always, the test plugin with a GPU context current at accept) makes a GPU
//! comm: a receive into host memory must arrive in place (GPUDirect-TCPX receives host memory
//! with plain `recv`; its fragment list is checked to be empty) and is then only handed back
//! (`irecvConsumed`, which the plugin needs to retire it); for a receive into GPU memory
//! each finished receive's fragment list
//! is read from the host-mapped metadata, the CUDA unpack kernel of `tcpx-gpu` copies the fragments
//! into the receive buffer on a stream of the comm, and only once that kernel's event completed
//! is the receive reported finished to the caller, and only on the caller's `consume` is it handed
//! back to the plugin (`irecvConsumed`, which recycles the bounce pages). [`RecvTracker`] keeps
//! that order; it is plain bookkeeping and tested without a GPU.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tcpx_ffi::abi::UNPACK_MAX_RECV_BYTES;
use tcpx_ffi::{
    ConnectHandle, CurrentContext, DeviceKind, FfiError, MemoryRegistration, NetProperties,
    NoGpuContext, Plugin, PluginOptions, UnpackHandling, MAX_IN_FLIGHT,
};
use tcpx_gpu::{Device, DeviceBuffer, Stream};

use crate::{
    Handle, HostBuffer, Limits, Listener, Memory, MemoryKind, MrId, RecvComm, RequestId, Result,
    SendComm, Transport, TransportError,
};

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

/// The variable GPUDirect-TCPX splits every send by (`kDynamicChunkSize`): read once at the
/// plugin's init. Unset, the plugin's parameter default is 0, every send is cut into 0-byte
/// pieces and never advances (issue 29). Distinct from NCCL's `NCCL_P2P_NET_CHUNKSIZE`.
pub const DYNAMIC_CHUNK_VAR: &str = "NCCL_DYNAMIC_CHUNK_SIZE";
/// The value Google's published A3 configurations export.
pub const DYNAMIC_CHUNK_DEFAULT: u64 = 524_288;

/// Where the plugin's dynamic chunk of a run comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkSource {
    /// The experiment's own settings (`--env`, a plan's or tuned.env's variables).
    Experiment,
    /// The process environment the run was started with.
    Environment,
    /// Neither gave one: tcpx-lab supplies [`DYNAMIC_CHUNK_DEFAULT`].
    Supplied,
}

/// The plugin's dynamic chunk for one run, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginChunk {
    pub bytes: u64,
    pub source: ChunkSource,
}

impl ChunkSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ChunkSource::Experiment => "experiment",
            ChunkSource::Environment => "environment",
            ChunkSource::Supplied => "supplied by tcpx-lab",
        }
    }
}

impl PluginChunk {
    /// One line for the header: the value, and who chose it.
    pub fn line(&self) -> String {
        let who = match self.source {
            ChunkSource::Experiment => "given with the experiment",
            ChunkSource::Environment => "from the environment",
            ChunkSource::Supplied => {
                "none given: tcpx-lab supplies Google's A3 value (GPUDirect-TCPX's own default 0 \
                 cuts sends into 0-byte pieces)"
            }
        };
        format!("plugin chunk {DYNAMIC_CHUNK_VAR}={} ({who})", self.bytes)
    }
}

/// Decides the plugin chunk of a netplugin run from the experiment's variables (`experiment`,
/// which win, as they are set before the plugin loads) and the process environment's value
/// (`process`, looked up by the binary). Neither: [`DYNAMIC_CHUNK_DEFAULT`], to be added to the
/// experiment's variables. A value that is not a whole number in 1..=2^31-1 is refused with the
/// fix: 0 is the stall itself, and the plugin silently keeps its default for others.
pub fn plugin_chunk(
    experiment: &std::collections::BTreeMap<String, String>,
    process: Option<&str>,
) -> std::result::Result<PluginChunk, String> {
    let (value, source) = match (experiment.get(DYNAMIC_CHUNK_VAR), process) {
        (Some(v), _) => (v.as_str(), ChunkSource::Experiment),
        (None, Some(v)) if !v.trim().is_empty() => (v, ChunkSource::Environment),
        _ => {
            return Ok(PluginChunk {
                bytes: DYNAMIC_CHUNK_DEFAULT,
                source: ChunkSource::Supplied,
            })
        }
    };
    let where_ = match source {
        ChunkSource::Experiment => "in the experiment's --env",
        _ => "in the environment",
    };
    let fix = format!(
        "give a byte count from 1 to 2147483647 (Google's A3 value is {DYNAMIC_CHUNK_DEFAULT}), \
         or leave {DYNAMIC_CHUNK_VAR} unset for tcpx-lab to supply that"
    );
    let bounded: String = value.chars().take(40).collect();
    match value.trim().parse::<u64>() {
        Ok(0) => Err(format!(
            "{DYNAMIC_CHUNK_VAR}=0 {where_}: GPUDirect-TCPX would cut every send into 0-byte \
             pieces and never finish one; {fix}"
        )),
        Ok(n) if n <= i32::MAX as u64 => Ok(PluginChunk { bytes: n, source }),
        _ => Err(format!(
            "{DYNAMIC_CHUNK_VAR}={bounded:?} {where_} is not a chunk the plugin takes (it \
             would silently keep its own default); {fix}"
        )),
    }
}

/// [`plugin_chunk`] for an experiment about to run: `None` when its backend loads no net plugin;
/// else the chunk, and when tcpx-lab supplies it, the chunk written into the experiment's
/// variables, which are set before the plugin loads. `process` is the process environment's
/// value (looked up by the binary).
pub fn supply_plugin_chunk(
    exp: &mut tcpx_model::Experiment,
    process: Option<&str>,
) -> std::result::Result<Option<PluginChunk>, String> {
    if !exp.transport.capabilities().loads_a_net_plugin() {
        return Ok(None);
    }
    let chunk = plugin_chunk(&exp.env, process)?;
    if chunk.source == ChunkSource::Supplied {
        exp.env
            .insert(DYNAMIC_CHUNK_VAR.to_string(), chunk.bytes.to_string());
    }
    Ok(Some(chunk))
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
    /// The GPU whose memory this transport may register and whose streams run the unpack kernel.
    device: Option<Device>,
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
            // The one write to the process environment outside the binaries, and why: a net
            // plugin takes its settings (NCCL_GPUDIRECTTCPX_*, NCCL_SOCKET_*, ...) only through
            // getenv, at its init and later, and these are the experiment's own, known only when
            // it arrives (over the plan link, in a follower that runs it in this process). The
            // binary's own environment was read once into `registry::BackendEnv` before this;
            // here it is written, under `LOAD`, just before the library is loaded.
            for (k, v) in &cfg.env {
                std::env::set_var(k, v);
            }
            Plugin::load(cfg.plugin.as_deref()).map_err(|e| TransportError::Unavailable {
                name: "netplugin".into(),
                reason: e.to_string(),
            })?
        };
        // Who unpacks is decided per comm from what accept hands over: an unpack handle in host
        // memory is read and unpacked on the CPU (tcpx-ffi asks CUDA whether the address is
        // device memory); one in device memory leaves it to the GPU kernel here.
        let plugin = plugin.with_options(PluginOptions {
            unpack: UnpackHandling::Cpu,
        });
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
            device: None,
            next_listen: AtomicU32::new(0),
            next_connect: AtomicU32::new(0),
        })
    }

    /// Makes `ctx` current before listen/connect/accept/regMr (the GPU layer's hook).
    pub fn with_context(mut self, ctx: Arc<dyn CurrentContext>) -> Self {
        self.ctx = ctx;
        self
    }

    /// Lets this transport register GPU memory of `device` and unpack receives on it; its primary
    /// context becomes the context made current before listen/connect/accept/regMr.
    pub fn with_device(mut self, device: Device) -> Self {
        self.ctx = Arc::new(device.clone());
        self.device = Some(device);
        self
    }

    /// The GPU given with [`NetPluginTransport::with_device`].
    pub fn device(&self) -> Option<&Device> {
        self.device.as_ref()
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

    fn max_comms(&self) -> Option<usize> {
        usize::try_from(self.props.max_comms)
            .ok()
            .filter(|&n| n > 0)
    }

    fn limits(&self) -> Limits {
        Limits {
            max_requests: MAX_IN_FLIGHT,
            max_request_bytes: if self.unpack() {
                UNPACK_MAX_RECV_BYTES
            } else {
                i32::MAX as usize
            },
            memory: if self.device.is_some() && self.props.supports(tcpx_ffi::MemoryKind::Cuda) {
                vec![MemoryKind::Host, MemoryKind::Cuda]
            } else {
                vec![MemoryKind::Host]
            },
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
            device: self.device.clone(),
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
            mrs: Registrations::new(self.device.clone()),
            finished: HashMap::new(),
            peer,
        }))
    }
}

struct NetListener {
    listen: tcpx_ffi::ListenComm,
    plugin: Plugin,
    device: Option<Device>,
}

impl Listener for NetListener {
    fn handle(&self) -> Handle {
        Handle::from_bytes(self.listen.handle().as_bytes().to_vec())
            .expect("a plugin handle is at most HANDLE_MAX bytes")
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let comm = self.listen.accept(deadline).map_err(ffi_err)?;
        let peer = format!(
            "{} comm {} (channel {})",
            self.plugin.name(),
            comm.id(),
            comm.channel()
        );
        // A GPU unpack comm (unpack handle in device memory, as GPUDirect-TCPX's always is):
        // receives into GPU memory are unpacked by the kernel on a stream of the transport's GPU;
        // receives into host memory are written in place by the plugin and only checked, which
        // any GPU can do (GPU 0 when the transport has none: its context reads the handle through
        // unified addressing).
        let gpu = if comm.needs_gpu_unpack() {
            let device = match &self.device {
                Some(d) => d.clone(),
                None => Device::open(0).map_err(|e| TransportError::Unavailable {
                    name: "netplugin".into(),
                    reason: format!(
                        "plugin `{}` keeps its unpack handle in GPU memory, which is read through \
                         a GPU context, but no GPU opens: {e}",
                        self.plugin.name()
                    ),
                })?,
            };
            let stream = match &self.device {
                Some(d) => Some(d.new_stream().map_err(|e| {
                    TransportError::Failed(format!(
                        "creating the unpack stream of {peer} on GPU {}: {e}",
                        d.index()
                    ))
                })?),
                None => None,
            };
            Some(UnpackGpu { device, stream })
        } else {
            None
        };
        Ok(Box::new(NetRecvComm {
            comm,
            mrs: Registrations::new(self.device.clone()),
            tracker: RecvTracker::default(),
            gpu,
            host_receives: HashSet::new(),
            peer,
        }))
    }
}

type HostRegistration = Arc<MemoryRegistration<Arc<HostBuffer>>>;
type CudaRegistration = Arc<MemoryRegistration<Arc<DeviceBuffer>>>;

/// One registration, of host or GPU memory.
#[derive(Clone)]
enum Registration {
    Host(HostRegistration),
    Cuda(CudaRegistration),
}

/// Registrations of one comm by id; dropping one deregisters it once no request holds it.
struct Registrations {
    next: u32,
    by_id: HashMap<u32, Registration>,
    /// The transport's GPU, the only one whose memory may be registered.
    device: Option<Device>,
}

impl Registrations {
    fn new(device: Option<Device>) -> Self {
        Registrations {
            next: 0,
            by_id: HashMap::new(),
            device,
        }
    }

    /// Registers `mem` through `host` or `cuda` (the comm's `register`), checking GPU memory
    /// belongs to this transport's GPU.
    fn register(
        &mut self,
        mem: &Memory,
        host: impl FnOnce(Arc<HostBuffer>) -> std::result::Result<HostRegistration, FfiError>,
        cuda: impl FnOnce(Arc<DeviceBuffer>) -> std::result::Result<CudaRegistration, FfiError>,
    ) -> Result<MrId> {
        let reg =
            match mem {
                Memory::Host(b) => Registration::Host(host(Arc::clone(b)).map_err(ffi_err)?),
                Memory::Cuda(b) => {
                    match &self.device {
                        None => return Err(TransportError::Usage(
                            "GPU memory on a netplugin transport without a GPU: create it with \
                             NetPluginTransport::with_device(the buffer's GPU)"
                                .into(),
                        )),
                        Some(d) if d.index() != b.device().index() => {
                            return Err(TransportError::Usage(format!(
                            "GPU memory of GPU {} on a netplugin transport for GPU {}: use one \
                             transport per GPU",
                            b.device().index(),
                            d.index()
                        )))
                        }
                        Some(_) => {}
                    }
                    Registration::Cuda(cuda(Arc::clone(b)).map_err(ffi_err)?)
                }
            };
        let id = self.next;
        self.next += 1;
        self.by_id.insert(id, reg);
        Ok(MrId(id))
    }

    fn get(&self, mr: MrId) -> Result<Registration> {
        self.by_id
            .get(&mr.0)
            .cloned()
            .ok_or_else(|| not_on_comm(mr))
    }

    fn remove(&mut self, mr: MrId) -> Result<()> {
        self.by_id
            .remove(&mr.0)
            .map(drop)
            .ok_or_else(|| not_on_comm(mr))
    }
}

fn not_on_comm(mr: MrId) -> TransportError {
    TransportError::Usage(format!("memory registration {} is not on this comm", mr.0))
}

/// Calls `$f` with the typed registration behind a [`Registration`].
macro_rules! with_reg {
    ($reg:expr, |$r:ident| $body:expr) => {
        match $reg {
            Registration::Host($r) => $body,
            Registration::Cuda($r) => $body,
        }
    };
}

/// The methods of [`NetSendComm`]'s and [`NetRecvComm`]'s impls that are the same for both: the
/// plugin comm registers memory, and the comm keeps its registrations and the peer's name.
macro_rules! plugin_comm_methods {
    () => {
        fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
            let comm = &self.comm;
            self.mrs
                .register(mem, |b| comm.register(b), |b| comm.register(b))
        }

        fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
            self.mrs.remove(mr)
        }

        fn peer(&self) -> String {
            self.peer.clone()
        }
    };
}

struct NetSendComm {
    comm: tcpx_ffi::SendComm,
    mrs: Registrations,
    /// Sends the plugin finished before the caller asked about them: id -> bytes.
    finished: HashMap<u64, usize>,
    peer: String,
}

impl SendComm for NetSendComm {
    plugin_comm_methods!();

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
        let reg = self.mrs.get(mr)?;
        let comm = &mut self.comm;
        let id = with_reg!(&reg, |r| comm.isend(r, offset, len, tag as i32)).map_err(ffi_err)?;
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
}

/// The GPU side of a comm whose unpack handle is device memory.
struct UnpackGpu {
    /// Reads the unpack handle (the transport's GPU, or GPU 0 for a host-memory transport).
    device: Device,
    /// Runs the unpack kernel of receives into GPU memory (only with the transport's GPU).
    stream: Option<Stream>,
}

struct NetRecvComm {
    comm: tcpx_ffi::RecvComm,
    mrs: Registrations,
    tracker: RecvTracker,
    /// Set when the plugin's unpack handle is device memory.
    gpu: Option<UnpackGpu>,
    /// Receives in flight whose memory is host memory.
    host_receives: HashSet<u64>,
    peer: String,
}

impl NetRecvComm {
    /// Moves receives whose GPU unpack finished to "finished" (the oldest first).
    fn poll_unpacks(&mut self) -> Result<()> {
        let comm = &self.comm;
        self.tracker
            .poll_unpacks(|id| comm.unpack_done(tcpx_ffi::RequestId(id)).map_err(ffi_err))
    }
}

impl RecvComm for NetRecvComm {
    plugin_comm_methods!();

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
        let reg = self.mrs.get(mr)?;
        let comm = &mut self.comm;
        let Some(id) =
            with_reg!(&reg, |r| comm.irecv(r, offset, len, tag as i32)).map_err(ffi_err)?
        else {
            return Ok(None);
        };
        self.tracker.posted(id.0, len);
        if matches!(reg, Registration::Host(_)) {
            self.host_receives.insert(id.0);
        }
        Ok(Some(RequestId(id.0)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.poll_unpacks()?;
        if let Some(bytes) = self.tracker.report(req.0) {
            return Ok(Some(bytes));
        }
        if !self.tracker.is_posted(req.0) {
            return Err(TransportError::Usage(format!(
                "receive {} is not posted on {}",
                req.0, self.peer
            )));
        }
        if self.tracker.at_plugin() == 0 {
            // Every posted receive is past the plugin; `req` is still being unpacked.
            return Ok(None);
        }
        let Some(done) = self.comm.test().map_err(ffi_err)? else {
            return Ok(None);
        };
        let in_host = self.host_receives.remove(&done.id.0);
        let fail = |e: FfiError| TransportError::Failed(format!("{}: {e}", self.peer));
        let bytes = match (done.unpack_slot, &self.gpu) {
            (None, _) => None,
            (Some(_), Some(gpu)) if in_host => {
                self.comm
                    .check_in_place(done.id, &gpu.device)
                    .map_err(fail)?;
                None
            }
            (
                Some(_),
                Some(UnpackGpu {
                    stream: Some(stream),
                    ..
                }),
            ) => Some(self.comm.start_gpu_unpack(done.id, stream).map_err(fail)?),
            (Some(slot), _) => {
                return Err(TransportError::Failed(format!(
                    "{}: receive {} into GPU memory finished in unpack slot {slot} but this comm \
                     has no GPU stream to unpack it: give the transport the receiving GPU",
                    self.peer, done.id.0
                )))
            }
        };
        let unpacking = bytes.is_some();
        self.tracker
            .plugin_done(done.id.0, bytes.or(done.size), unpacking)
            .map_err(|e| TransportError::Failed(format!("{}: {e}", self.peer)))?;
        self.poll_unpacks()?;
        Ok(self.tracker.report(req.0))
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        self.tracker
            .consume(req.0)
            .map_err(|e| TransportError::Usage(format!("{e} on {}", self.peer)))?;
        if self.gpu.is_some() {
            // The tracker reported this receive only after its unpack kernel completed (or its
            // bytes were found in place); tcpx-ffi checks that again before irecvConsumed
            // recycles the bounce pages.
            let handed = self.comm.consumed().map_err(ffi_err)?;
            if handed.0 != req.0 {
                return Err(TransportError::Failed(format!(
                    "{}: handed back receive {} while consuming {}",
                    self.peer, handed.0, req.0
                )));
            }
        }
        Ok(())
    }
}

/// Where each receive of a comm stands between the plugin, the GPU unpack and the caller, so that
/// a receive is reported only once its bytes are in place and handed back only in FIFO order
/// after being reported. Plain bookkeeping, no I/O.
#[derive(Debug, Default)]
pub struct RecvTracker {
    /// Bytes asked for by each posted receive not yet consumed.
    posted: HashMap<u64, usize>,
    /// Receives not yet consumed, oldest first.
    order: VecDeque<u64>,
    /// Receives the plugin has not finished yet, oldest first (it finishes them in this order).
    at_plugin: VecDeque<u64>,
    /// Receives whose GPU unpack is queued but not known to be complete: id -> bytes.
    unpacking: VecDeque<(u64, usize)>,
    /// Receives whose bytes are in place: id -> bytes.
    finished: HashMap<u64, usize>,
    /// Receives reported finished to the caller, awaiting `consume`.
    tested: HashSet<u64>,
}

impl RecvTracker {
    /// A receive of up to `len` bytes was posted.
    pub fn posted(&mut self, id: u64, len: usize) {
        self.posted.insert(id, len);
        self.order.push_back(id);
        self.at_plugin.push_back(id);
    }

    pub fn is_posted(&self, id: u64) -> bool {
        self.posted.contains_key(&id)
    }

    /// Receives the plugin still has to finish.
    pub fn at_plugin(&self) -> usize {
        self.at_plugin.len()
    }

    /// The plugin finished receive `id` with `bytes` (its posted size when unknown); with
    /// `unpacking` its GPU unpack has been queued and must complete before it counts as finished.
    pub fn plugin_done(
        &mut self,
        id: u64,
        bytes: Option<usize>,
        unpacking: bool,
    ) -> std::result::Result<(), String> {
        match self.at_plugin.front() {
            Some(&oldest) if oldest == id => {}
            other => {
                return Err(format!(
                "the plugin finished receive {id}, but the oldest unfinished receive is {other:?}"
            ))
            }
        }
        self.at_plugin.pop_front();
        let bytes = bytes.unwrap_or(self.posted[&id]);
        if unpacking {
            self.unpacking.push_back((id, bytes));
        } else {
            self.finished.insert(id, bytes);
        }
        Ok(())
    }

    /// Asks `complete(id)` about each queued unpack, oldest first, and moves the completed ones to
    /// finished. Stops at the first one still running: kernels on one stream finish in order.
    pub fn poll_unpacks<E>(
        &mut self,
        mut complete: impl FnMut(u64) -> std::result::Result<bool, E>,
    ) -> std::result::Result<(), E> {
        while let Some(&(id, bytes)) = self.unpacking.front() {
            if !complete(id)? {
                break;
            }
            self.unpacking.pop_front();
            self.finished.insert(id, bytes);
        }
        Ok(())
    }

    /// `Some(bytes)` once receive `id`'s bytes are in place (remembered until consumed, so asking
    /// again answers the same).
    pub fn report(&mut self, id: u64) -> Option<usize> {
        let bytes = *self.finished.get(&id)?;
        self.tested.insert(id);
        Some(bytes)
    }

    /// The caller hands receive `id` back: only the oldest, and only after it was reported.
    pub fn consume(&mut self, id: u64) -> std::result::Result<(), String> {
        match self.order.front() {
            Some(&oldest) if oldest == id && self.tested.remove(&id) => {
                self.order.pop_front();
                self.finished.remove(&id);
                self.posted.remove(&id);
                Ok(())
            }
            Some(&oldest) if oldest == id => Err(format!(
                "receive {id} consumed before test reported it finished"
            )),
            _ => Err(format!("receive {id} consumed out of FIFO order")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{plugin_chunk, supply_plugin_chunk, ChunkSource, DYNAMIC_CHUNK_VAR};

    #[test]
    fn a_supplied_chunk_goes_into_a_plugin_experiment_and_nowhere_else() {
        use tcpx_model::{Backend, Experiment};
        let mut sockets = Experiment::default();
        assert_eq!(supply_plugin_chunk(&mut sockets, Some("0")), Ok(None));
        assert!(sockets.env.is_empty());
        let mut plugin = Experiment {
            transport: Backend::NetPlugin,
            ..Experiment::default()
        };
        let c = supply_plugin_chunk(&mut plugin, None).unwrap().unwrap();
        assert_eq!(c.source, ChunkSource::Supplied);
        assert_eq!(plugin.env[DYNAMIC_CHUNK_VAR], c.bytes.to_string());
        // The environment's value is used, not copied: the plugin reads it there itself.
        let mut plugin = Experiment {
            transport: Backend::NetPlugin,
            ..Experiment::default()
        };
        let c = supply_plugin_chunk(&mut plugin, Some("1048576"))
            .unwrap()
            .unwrap();
        assert_eq!((c.bytes, c.source), (1 << 20, ChunkSource::Environment));
        assert!(plugin.env.is_empty());
        assert!(supply_plugin_chunk(&mut plugin, Some("0")).is_err());
    }

    fn vars(kv: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_chunk_given_means_googles_value_supplied_and_said() {
        let c = plugin_chunk(&vars(&[]), None).unwrap();
        assert_eq!(c.bytes, 524_288);
        assert_eq!(c.source, ChunkSource::Supplied);
        assert!(
            c.line().contains("NCCL_DYNAMIC_CHUNK_SIZE=524288"),
            "{}",
            c.line()
        );
        assert!(c.line().contains("tcpx-lab supplies"), "{}", c.line());
        // An empty variable in the environment is no value either.
        assert_eq!(
            plugin_chunk(&vars(&[]), Some(" ")).unwrap().source,
            ChunkSource::Supplied
        );
    }

    #[test]
    fn a_users_chunk_is_kept_and_the_experiments_wins() {
        let c = plugin_chunk(&vars(&[]), Some("131072")).unwrap();
        assert_eq!((c.bytes, c.source), (131_072, ChunkSource::Environment));
        let c = plugin_chunk(&vars(&[(DYNAMIC_CHUNK_VAR, "262144")]), Some("131072")).unwrap();
        assert_eq!((c.bytes, c.source), (262_144, ChunkSource::Experiment));
    }

    #[test]
    fn a_zero_or_unusable_chunk_is_refused_with_the_fix() {
        let e = plugin_chunk(&vars(&[]), Some("0")).unwrap_err();
        assert!(e.contains("0-byte") && e.contains("524288"), "{e}");
        let e = plugin_chunk(&vars(&[(DYNAMIC_CHUNK_VAR, "0")]), None).unwrap_err();
        assert!(e.contains("--env"), "{e}");
        for bad in ["-1", "512K", "2147483648", "99999999999999999999999"] {
            let e = plugin_chunk(&vars(&[(DYNAMIC_CHUNK_VAR, bad)]), None).unwrap_err();
            assert!(e.contains("1 to 2147483647"), "{bad}: {e}");
        }
        let long = "9".repeat(10_000);
        let e = plugin_chunk(&vars(&[]), Some(&long)).unwrap_err();
        assert!(
            e.len() < 600,
            "the message stays bounded: {} bytes",
            e.len()
        );
        assert_eq!(
            plugin_chunk(&vars(&[]), Some("2147483647")).unwrap().bytes,
            2_147_483_647
        );
    }

    use super::RecvTracker;

    #[test]
    fn a_gpu_unpacked_receive_is_reported_only_after_its_kernel_completed() {
        let mut t = RecvTracker::default();
        t.posted(0, 4 << 20);
        t.posted(1, 1 << 20);
        assert_eq!(t.at_plugin(), 2);
        assert_eq!(t.report(0), None);
        assert!(t.plugin_done(1, Some(10), true).is_err(), "out of order");
        t.plugin_done(0, Some(4 << 20), true).unwrap();
        assert_eq!(t.at_plugin(), 1);
        // The kernel is still running: not reported, and consume refused.
        t.poll_unpacks(|_| Ok::<_, ()>(false)).unwrap();
        assert_eq!(t.report(0), None);
        assert!(t.consume(0).unwrap_err().contains("before test reported"));
        // Kernel done: reported (and again), then consumed once.
        let mut asked = Vec::new();
        t.poll_unpacks(|id| {
            asked.push(id);
            Ok::<_, ()>(true)
        })
        .unwrap();
        assert_eq!(asked, vec![0]);
        assert_eq!(t.report(0), Some(4 << 20));
        assert_eq!(t.report(0), Some(4 << 20));
        t.consume(0).unwrap();
        assert!(t.consume(0).is_err());
        assert!(!t.is_posted(0));
    }

    #[test]
    fn unpacks_complete_in_stream_order_and_consumes_stay_fifo() {
        let mut t = RecvTracker::default();
        for id in 0..3 {
            t.posted(id, 100);
        }
        for id in 0..3 {
            t.plugin_done(id, Some(90 + id as usize), true).unwrap();
        }
        // Only the first two kernels finished: the third is not reported.
        t.poll_unpacks(|id| Ok::<_, ()>(id < 2)).unwrap();
        assert_eq!(t.report(2), None);
        assert_eq!(t.report(1), Some(91));
        assert!(t.consume(1).unwrap_err().contains("FIFO"));
        assert_eq!(t.report(0), Some(90));
        t.consume(0).unwrap();
        t.consume(1).unwrap();
        // A failing query is passed on, not swallowed.
        assert_eq!(
            t.poll_unpacks(|_| Err::<bool, _>("gpu gone")),
            Err("gpu gone")
        );
        t.poll_unpacks(|_| Ok::<_, ()>(true)).unwrap();
        assert_eq!(t.report(2), Some(92));
        t.consume(2).unwrap();
    }

    #[test]
    fn host_receives_are_finished_as_soon_as_the_plugin_says_so() {
        let mut t = RecvTracker::default();
        t.posted(0, 4096);
        t.plugin_done(0, None, false).unwrap();
        assert_eq!(
            t.report(0),
            Some(4096),
            "posted size when the plugin gives none"
        );
        t.consume(0).unwrap();
        assert!(t.consume(5).unwrap_err().contains("FIFO"));
    }
}
