//! tcpx-py: the native part of the `tcpx_lab` Python package (`tcpx_lab._native`), built by
//! maturin as an abi3 extension module.
//!
//! It exposes [`Endpoint`] with the UCCL P2P Engine's Python API (`connect`, `accept`, `reg`,
//! `send`/`recv`, `sendv`/`recvv`, `send_async`/`recv_async`, `poll_async`, `get_metadata`) over
//! `tcpx_transport::endpoint`, on memory the caller owns: `reg(ptr, size)` borrows a torch tensor's
//! or numpy array's bytes in place (host or CUDA, told apart by CUDA's pointer attributes where a
//! driver is present).
//!
//! Conventions (the package's docs repeat them):
//! - Misuse and setup failures raise: unknown `conn_id`/`mr_id`/`transfer_id`, a range outside
//!   the registered region, a send on an accepted (receiving) connection, a connect that finds no
//!   peer (`ConnectionError`/`TimeoutError`), a bad transport name.
//! - A transfer that fails once started (the peer went away, a stall, bytes the peer did not
//!   send) returns `success=False`, as UCCL does; `last_error()` gives the message, and the
//!   connection is closed for further transfers.
//! - The GIL is released around every call that may block.
//!
//! Not for: the plan runner (`tcpx_lab.run_plan` runs the `tcpx-run` binary), scheduling or
//! backends (`tcpx-sched`, `tcpx-transport`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::{
    PyConnectionError, PyKeyError, PyOSError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tcpx_gpu::{Device, DeviceBuffer, HostBuffer};
use tcpx_model::NicPlacement;
use tcpx_transport::endpoint::{Conn, Endpoint as RustEndpoint, EndpointConfig, Mr, XferId};
use tcpx_transport::registry::{self, Backend, BackendConfig, BackendEnv};
use tcpx_transport::socket::SocketConfig;
use tcpx_transport::{Memory, Transport, TransportError};

mod maps;

/// Default first port: an endpoint for GPU `i` listens on `port_base + i`.
const DEFAULT_PORT_BASE: u16 = 5500;
/// Bytes of `get_metadata()`: IPv4 address, port (big-endian), GPU index (little-endian u32).
const METADATA_LEN: usize = 10;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A transport error raised as the Python exception that fits it, with the Rust message.
fn raise(e: TransportError) -> PyErr {
    let msg = e.to_string();
    match e {
        TransportError::Usage(_) => PyValueError::new_err(msg),
        TransportError::Timeout { .. } => PyTimeoutError::new_err(msg),
        TransportError::Io { .. } => PyConnectionError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// One region given to `reg`.
struct Region {
    base: u64,
    len: usize,
    mem: Memory,
}

impl Region {
    /// Offset of `ptr..ptr + size` in this region, refused when it is not inside.
    fn offset_of(&self, mr_id: u64, ptr: u64, size: usize) -> PyResult<usize> {
        let end = ptr.checked_add(size as u64);
        if size == 0 {
            return Err(PyValueError::new_err(format!(
                "size 0 at {ptr:#x}: a transfer needs at least 1 byte"
            )));
        }
        if ptr < self.base || end.is_none_or(|e| e > self.base + self.len as u64) {
            return Err(PyValueError::new_err(format!(
                "{size} bytes at {ptr:#x} are not inside registered region mr_id {mr_id} \
                 ({} bytes at {:#x}): register the memory you send from or receive into with \
                 reg(ptr, size) and pass that mr_id",
                self.len, self.base
            )));
        }
        Ok((ptr - self.base) as usize)
    }
}

/// A connection: which way it carries data, and the regions registered on it so far.
struct Slot {
    accepted: bool,
    state: Mutex<SlotState>,
}

struct SlotState {
    conn: Conn,
    /// Endpoint mr_id -> registration on this connection (made at first use).
    mrs: HashMap<u64, Mr>,
    /// Set once a transfer failed: the connection's FIFO order is lost, so it takes no more.
    broken: Option<String>,
}

impl Slot {
    /// The connection's state, locked; the message to report instead when a transfer on it
    /// failed earlier.
    fn usable(&self, conn_id: u64) -> Result<MutexGuard<'_, SlotState>, String> {
        let st = lock(&self.state);
        match &st.broken {
            Some(b) => Err(format!("conn_id {conn_id} failed earlier: {b}")),
            None => Ok(st),
        }
    }
}

impl SlotState {
    /// What a transfer step on this connection returned, as the message to report; a failure
    /// breaks the connection.
    fn breaks_on<T>(&mut self, step: Result<T, TransportError>) -> Result<T, String> {
        step.map_err(|e| {
            let msg = e.to_string();
            self.broken = Some(msg.clone());
            msg
        })
    }
}

/// What a transfer looks like once checked: per part, the region and the offset in it.
type Parts = Vec<(u64, Arc<Region>, usize, usize)>;

/// A point-to-point endpoint with UCCL's P2P Engine API.
///
/// `Endpoint(local_gpu_idx, num_cpus, *, transport="socket", port_base=None, plugin=None,
/// ip=None, timeout_s=300.0)`.
///
/// It listens on `ip` (only there), port `port_base + local_gpu_idx` (default port_base 5500,
/// or `TCPX_P2P_PORT_BASE`) from the first `accept()` or `get_metadata()` on, so that
/// `connect(ip, gpu)` finds it; connections there that do not speak its protocol are dropped.
/// `timeout_s` (at most a day) bounds `connect`/`accept`, which Ctrl-C also ends, and how long
/// a transfer, blocking or polled with `poll_async`, may go without progress (at most 30 s). A
/// connection carries data one way: the side that connected sends, the side that accepted
/// receives. `num_cpus` is the number of channels (comms, one socket and worker thread each on
/// the socket backend) a message is striped over; both sides must give the same value.
#[pyclass(module = "tcpx_lab._native", name = "Endpoint", frozen)]
struct Endpoint {
    local_gpu_idx: u32,
    ip: IpAddr,
    port: u16,
    timeout: Duration,
    transport: Arc<dyn Transport>,
    cfg: EndpointConfig,
    connector: Arc<RustEndpoint>,
    listener: Mutex<Option<Arc<RustEndpoint>>>,
    regions: Mutex<HashMap<u64, Arc<Region>>>,
    devices: Mutex<HashMap<usize, Device>>,
    conns: Mutex<HashMap<u64, Arc<Slot>>>,
    transfers: Mutex<HashMap<u64, (u64, XferId)>>,
    next_id: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// Bytes of the ring each channel stages GPU memory through over the socket backend:
/// `TCPX_STAGING_RING` (a size, or `auto`), else the ring the model picks for requests of at
/// most `chunk` bytes. A ring the model refuses (out of range, shorter than a chunk) is refused
/// here with the variable named.
fn env_staging_ring(chunk: usize) -> PyResult<usize> {
    let var = tcpx_model::Knob::StagingRing.env_var();
    let chunk = chunk as u64;
    let ring = match std::env::var(var) {
        Ok(v) if v.trim() != "auto" && !v.trim().is_empty() => {
            let refused = |e: String| PyValueError::new_err(format!("{var}={v}: {e}"));
            let r = tcpx_model::parse_size(&v).map_err(refused)?;
            tcpx_model::check_staging_ring(r, chunk).map_err(refused)?;
            r
        }
        _ => tcpx_model::auto_staging_ring(chunk, None),
    };
    Ok(ring as usize)
}

fn env_port_base() -> PyResult<u16> {
    match std::env::var("TCPX_P2P_PORT_BASE") {
        Ok(v) => v.trim().parse().map_err(|_| {
            PyValueError::new_err(format!(
                "TCPX_P2P_PORT_BASE={v} is not a port number (1..65535)"
            ))
        }),
        Err(_) => Ok(DEFAULT_PORT_BASE),
    }
}

/// The address this host is reached at: `TCPX_P2P_IP`, else the first non-loopback IPv4 address
/// the host name resolves to, else 127.0.0.1.
fn default_ip() -> PyResult<IpAddr> {
    if let Ok(v) = std::env::var("TCPX_P2P_IP") {
        return v
            .trim()
            .parse()
            .map_err(|_| PyValueError::new_err(format!("TCPX_P2P_IP={v} is not an IPv4 address")));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let found = (host.trim(), 0)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback());
    Ok(found.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// The backend named `name`, and the endpoint configuration for `channels` channels over it:
/// chunk and window by the automatic rule `tcpx-run bench` uses, for GPU memory when the GPU
/// opened.
fn open_transport(
    name: &str,
    ip: IpAddr,
    local_gpu_idx: u32,
    plugin: Option<String>,
    channels: usize,
) -> PyResult<(Arc<dyn Transport>, EndpointConfig)> {
    // The endpoint moves host memory between processes over a network: the backends that can.
    let offered = |b: &Backend| {
        let caps = b.capabilities();
        caps.host_memory && !matches!(caps.nics, NicPlacement::NoNic(_))
    };
    let Some(backend) = name.parse::<Backend>().ok().filter(offered) else {
        let names: Vec<String> = Backend::ALL
            .iter()
            .filter(|b| offered(b))
            .map(|b| format!("{:?}", b.name()))
            .collect();
        return Err(PyValueError::new_err(format!(
            "transport {name:?} is not one the P2P endpoint offers: choose {}",
            names.join(" or ")
        )));
    };
    // The Python edge reads the backends' settings from the environment, as the binary does.
    let env = BackendEnv::from_vars(|k| std::env::var(k).ok()).map_err(raise)?;
    let socket = SocketConfig {
        bind: ip,
        ..SocketConfig::default()
    };
    let mut cfg = BackendConfig::new(backend, socket, &env);
    if let (BackendConfig::NetPlugin(c), Some(p)) = (&mut cfg, plugin) {
        c.plugin = Some(p);
    }
    // Given a GPU, the registry stages GPU memory for the socket backend through a pinned ring
    // per channel (TCPX_STAGING_RING, else one that holds several of the endpoint's chunks), and
    // hands it to the plugin itself; without one, host memory only.
    let device = Device::open(local_gpu_idx as usize).ok();
    let ep = EndpointConfig::auto(backend, device.is_some(), channels, socket_socks(&cfg));
    let staging_ring = env_staging_ring(ep.chunk)?;
    let gpu = device.map(|device| registry::GpuMemory {
        device,
        staging_ring: Some(staging_ring),
    });
    let transport = registry::open(&cfg, gpu).map_err(raise)?;
    // The rule knows the backend's limits before opening; an opened one may allow fewer.
    let ep = EndpointConfig {
        window: ep.window.min(transport.limits().max_requests.max(1)),
        ..ep
    };
    Ok((transport, ep))
}

/// Sockets per channel of a backend configuration (1 for backends without sockets of their own).
fn socket_socks(cfg: &BackendConfig) -> usize {
    match cfg {
        BackendConfig::Socket(s) => s.socks,
        _ => 1,
    }
}

impl Endpoint {
    fn next(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn fail(&self, msg: String) {
        *lock(&self.last_error) = Some(msg);
    }

    /// The endpoint that listens on our port, bound on first use.
    fn listening(&self) -> PyResult<Arc<RustEndpoint>> {
        let mut l = lock(&self.listener);
        if let Some(ep) = l.as_ref() {
            return Ok(Arc::clone(ep));
        }
        let mut ep =
            RustEndpoint::new(Arc::clone(&self.transport), self.cfg.clone()).map_err(raise)?;
        // Where asked (`ip`, or the address this host is reached at), never every address.
        let addr = SocketAddr::new(self.ip, self.port);
        ep.listen(addr).map_err(|e| {
            PyOSError::new_err(format!(
                "{e} (an endpoint for GPU {} listens on port_base + local_gpu_idx = {}; give \
                 another port_base, or set TCPX_P2P_PORT_BASE, on both sides)",
                self.local_gpu_idx, self.port
            ))
        })?;
        let ep = Arc::new(ep);
        *l = Some(Arc::clone(&ep));
        Ok(ep)
    }

    fn slot(&self, conn_id: u64) -> PyResult<Arc<Slot>> {
        lock(&self.conns).get(&conn_id).cloned().ok_or_else(|| {
            PyKeyError::new_err(format!(
                "conn_id {conn_id} is not a connection of this endpoint: use the conn_id that \
                 connect() or accept() returned"
            ))
        })
    }

    fn region(&self, mr_id: u64) -> PyResult<Arc<Region>> {
        lock(&self.regions).get(&mr_id).cloned().ok_or_else(|| {
            PyKeyError::new_err(format!(
                "mr_id {mr_id} is not registered on this endpoint: use the mr_id that \
                 reg(ptr, size) returned"
            ))
        })
    }

    fn add_conn(&self, conn: Conn, accepted: bool) -> u64 {
        let id = self.next();
        let slot = Arc::new(Slot {
            accepted,
            state: Mutex::new(SlotState {
                conn,
                mrs: HashMap::new(),
                broken: None,
            }),
        });
        lock(&self.conns).insert(id, slot);
        id
    }

    /// Checks a transfer's direction and ranges before anything blocks.
    fn check(
        &self,
        conn_id: u64,
        send: bool,
        parts: &[(u64, u64, usize)],
    ) -> PyResult<(Arc<Slot>, Parts)> {
        let slot = self.slot(conn_id)?;
        if send && slot.accepted {
            return Err(PyValueError::new_err(format!(
                "conn_id {conn_id} was accepted, so it receives: a connection carries data from \
                 the side that connected to the side that accepted (connect from this side to \
                 send)"
            )));
        }
        if !send && !slot.accepted {
            return Err(PyValueError::new_err(format!(
                "conn_id {conn_id} was made by connect(), so it sends: receive on the conn_id \
                 that accept() returned"
            )));
        }
        if parts.is_empty() {
            return Err(PyValueError::new_err(
                "a transfer needs at least one buffer",
            ));
        }
        let mut checked = Vec::with_capacity(parts.len());
        for &(mr_id, ptr, size) in parts {
            let region = self.region(mr_id)?;
            let off = region.offset_of(mr_id, ptr, size)?;
            checked.push((mr_id, region, off, size));
        }
        Ok((slot, checked))
    }

    /// The connection's registrations for `parts`, registering regions at first use.
    fn conn_parts(
        st: &mut SlotState,
        parts: &Parts,
    ) -> Result<Vec<(Mr, usize, usize)>, TransportError> {
        let mut out = Vec::with_capacity(parts.len());
        for (mr_id, region, off, size) in parts {
            let mr = match st.mrs.get(mr_id) {
                Some(mr) => *mr,
                None => {
                    let mr = st.conn.reg(region.mem.clone())?;
                    st.mrs.insert(*mr_id, mr);
                    mr
                }
            };
            out.push((mr, *off, *size));
        }
        Ok(out)
    }

    /// Checks a transfer of `iovs` ((mr_id, ptr, size) each) with [`Self::check`], raising before
    /// anything blocks, and runs it whole; `false` (and `last_error`) when it fails once started.
    fn transfer(
        &self,
        py: Python<'_>,
        conn_id: u64,
        send: bool,
        iovs: &[(u64, u64, usize)],
    ) -> PyResult<bool> {
        let (slot, parts) = self.check(conn_id, send, iovs)?;
        let r = py.detach(|| {
            let mut st = slot.usable(conn_id)?;
            let run = |st: &mut SlotState| -> Result<(), TransportError> {
                let p = Self::conn_parts(st, &parts)?;
                if send {
                    st.conn.sendv(&p)
                } else {
                    st.conn.recvv(&p).map(|_| ())
                }
            };
            let step = run(&mut st);
            st.breaks_on(step)
        });
        match r {
            Ok(()) => Ok(true),
            Err(m) => {
                self.fail(m);
                Ok(false)
            }
        }
    }

    /// Checks a transfer as [`Self::transfer`] does and queues it: (success, transfer_id).
    fn start(
        &self,
        py: Python<'_>,
        conn_id: u64,
        send: bool,
        iovs: &[(u64, u64, usize)],
    ) -> PyResult<(bool, u64)> {
        let (slot, parts) = self.check(conn_id, send, iovs)?;
        let r = py.detach(|| {
            let mut st = slot.usable(conn_id)?;
            let p = Self::conn_parts(&mut st, &parts).map_err(|e| e.to_string())?;
            let x = if send {
                st.conn.sendv_async(&p)
            } else {
                st.conn.recvv_async(&p)
            };
            x.map_err(|e| e.to_string())
        });
        match r {
            Ok(x) => {
                let id = self.next();
                lock(&self.transfers).insert(id, (conn_id, x));
                Ok((true, id))
            }
            Err(m) => {
                self.fail(m);
                Ok((false, 0))
            }
        }
    }

    fn connect_addr(&self, py: Python<'_>, addr: SocketAddr) -> PyResult<(bool, u64)> {
        let deadline = Instant::now() + self.timeout;
        let ep = Arc::clone(&self.connector);
        let gpu = self.local_gpu_idx;
        let mut signal: Option<PyErr> = None;
        let conn = py
            .detach(|| -> Result<Conn, TransportError> {
                let mut conn =
                    ep.connect_checking(addr, deadline, SIGNAL_TICK, &mut signals(&mut signal))?;
                // First message: this side's GPU index, which accept() reports.
                let hello = HostBuffer::new(8)?;
                hello
                    .span_all()?
                    .copy_from_slice(&u64::from(gpu).to_le_bytes());
                let mr = conn.reg(Memory::Host(hello))?;
                conn.send(mr, 0, 8)?;
                Ok(conn)
            })
            .map_err(|e| signal.take().unwrap_or_else(|| raise(e)))?;
        Ok((true, self.add_conn(conn, false)))
    }
}

// The Endpoint's longest `timeout_s` is the bench's (a day).
use tcpx_model::MAX_TIMEOUT_S;

/// How often a wait for a peer checks for Ctrl-C (and other signals Python handles).
const SIGNAL_TICK: Duration = Duration::from_millis(100);

/// The check a wait for a peer makes every [`SIGNAL_TICK`] with the GIL released: Python's
/// signal handlers run (Ctrl-C raises KeyboardInterrupt); the exception is kept in `slot` and
/// ends the wait.
fn signals(slot: &mut Option<PyErr>) -> impl FnMut() -> Result<(), TransportError> + '_ {
    move || {
        Python::attach(|py| py.check_signals()).map_err(|e| {
            *slot = Some(e);
            TransportError::Usage("interrupted by a signal".into())
        })
    }
}

fn parse_metadata(metadata: &[u8]) -> PyResult<(String, u16, u32)> {
    if metadata.len() != METADATA_LEN {
        return Err(PyValueError::new_err(format!(
            "endpoint metadata has {} bytes, expected {METADATA_LEN} (what get_metadata() returns)",
            metadata.len()
        )));
    }
    let ip = Ipv4Addr::new(metadata[0], metadata[1], metadata[2], metadata[3]);
    let port = u16::from_be_bytes([metadata[4], metadata[5]]);
    let gpu = u32::from_le_bytes(metadata[6..10].try_into().expect("4 bytes"));
    Ok((ip.to_string(), port, gpu))
}

#[pymethods]
impl Endpoint {
    #[new]
    #[pyo3(signature = (local_gpu_idx, num_cpus, *, transport = "socket", port_base = None, plugin = None, ip = None, timeout_s = 300.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        local_gpu_idx: u32,
        num_cpus: usize,
        transport: &str,
        port_base: Option<u16>,
        plugin: Option<String>,
        ip: Option<String>,
        timeout_s: f64,
    ) -> PyResult<Self> {
        if num_cpus == 0 || num_cpus > 64 {
            return Err(PyValueError::new_err(format!(
                "num_cpus {num_cpus}: give 1..64 (the channels a message is striped over)"
            )));
        }
        if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= MAX_TIMEOUT_S) {
            return Err(PyValueError::new_err(format!(
                "timeout_s {timeout_s}: give a positive number of seconds, at most {MAX_TIMEOUT_S} (a day)"
            )));
        }
        let ip: IpAddr = match ip {
            Some(s) => s
                .parse()
                .map_err(|_| PyValueError::new_err(format!("ip {s:?} is not an IP address")))?,
            None => default_ip()?,
        };
        let port_base = match port_base {
            Some(p) => p,
            None => env_port_base()?,
        };
        let port = port_base
            .checked_add(local_gpu_idx as u16)
            .filter(|_| local_gpu_idx < 1024)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "port_base {port_base} + local_gpu_idx {local_gpu_idx} is not a port number"
                ))
            })?;
        let (transport, defaults) =
            py.detach(|| open_transport(transport, ip, local_gpu_idx, plugin, num_cpus))?;
        let timeout = Duration::from_secs_f64(timeout_s);
        let cfg = EndpointConfig {
            // A transfer that makes no progress fails after timeout_s, or the default stall
            // (30 s) if that is shorter: blocking calls and poll_async alike.
            stall: defaults.stall.min(timeout),
            ..defaults
        };
        let connector =
            Arc::new(RustEndpoint::new(Arc::clone(&transport), cfg.clone()).map_err(raise)?);
        Ok(Endpoint {
            local_gpu_idx,
            ip,
            port,
            timeout,
            transport,
            cfg,
            connector,
            listener: Mutex::new(None),
            regions: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            transfers: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            last_error: Mutex::new(None),
        })
    }

    /// `connect(remote_ip_addr, remote_gpu_idx, remote_port=-1) -> (success, conn_id)`: connects
    /// to the endpoint for GPU `remote_gpu_idx` at `remote_ip_addr` (port `port_base +
    /// remote_gpu_idx`, or `remote_port`), retrying until `timeout_s`. Raises
    /// `ConnectionError`/`TimeoutError` when no endpoint answers.
    #[pyo3(signature = (remote_ip_addr, remote_gpu_idx, remote_port = -1))]
    fn connect(
        &self,
        py: Python<'_>,
        remote_ip_addr: &str,
        remote_gpu_idx: u32,
        remote_port: i64,
    ) -> PyResult<(bool, u64)> {
        let ip: IpAddr = remote_ip_addr.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "remote_ip_addr {remote_ip_addr:?} is not an IP address"
            ))
        })?;
        let port = if remote_port >= 0 {
            u16::try_from(remote_port).map_err(|_| {
                PyValueError::new_err(format!("remote_port {remote_port} is not a port"))
            })?
        } else {
            let base = self.port - self.local_gpu_idx as u16;
            base.checked_add(remote_gpu_idx as u16)
                .filter(|_| remote_gpu_idx < 1024)
                .ok_or_else(|| {
                    PyValueError::new_err(format!("remote_gpu_idx {remote_gpu_idx} gives no port"))
                })?
        };
        self.connect_addr(py, SocketAddr::new(ip, port))
    }

    /// `connect_metadata(metadata) -> (success, conn_id)`: connects to the endpoint whose
    /// `get_metadata()` bytes these are (exchanged through a torch.distributed store, say).
    fn connect_metadata(&self, py: Python<'_>, metadata: &[u8]) -> PyResult<(bool, u64)> {
        let (ip, port, _) = parse_metadata(metadata)?;
        let ip: IpAddr = ip.parse().expect("formatted from Ipv4Addr");
        self.connect_addr(py, SocketAddr::new(ip, port))
    }

    /// `accept() -> (success, remote_ip_addr, remote_gpu_idx, conn_id)`: waits up to `timeout_s`
    /// for one peer's `connect` (raises `TimeoutError` after that).
    fn accept(&self, py: Python<'_>) -> PyResult<(bool, String, u32, u64)> {
        let ep = self.listening()?;
        let deadline = Instant::now() + self.timeout;
        let mut signal: Option<PyErr> = None;
        let (conn, gpu) = py
            .detach(|| -> Result<(Conn, u64), TransportError> {
                let mut conn =
                    ep.accept_checking(deadline, SIGNAL_TICK, &mut signals(&mut signal))?;
                let hello = HostBuffer::new(8)?;
                let mr = conn.reg(Memory::Host(Arc::clone(&hello)))?;
                conn.recv(mr, 0, 8)?;
                let b: [u8; 8] = hello.span_all()?[..].try_into().expect("8 bytes");
                Ok((conn, u64::from_le_bytes(b)))
            })
            .map_err(|e| signal.take().unwrap_or_else(|| raise(e)))?;
        let ip = conn.peer().ip().to_string();
        let gpu = u32::try_from(gpu).map_err(|_| {
            PyRuntimeError::new_err(format!(
                "peer {ip} sent GPU index {gpu}: not a tcpx_lab endpoint?"
            ))
        })?;
        Ok((true, ip, gpu, self.add_conn(conn, true)))
    }

    /// `get_metadata() -> bytes`: this endpoint's address for `connect_metadata` (starts
    /// listening): 4 bytes IPv4, 2 bytes port (big-endian), 4 bytes GPU index (little-endian).
    fn get_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.listening()?;
        let IpAddr::V4(v4) = self.ip else {
            return Err(PyValueError::new_err(format!(
                "metadata holds an IPv4 address and this endpoint's is {}: give ip=",
                self.ip
            )));
        };
        let mut b = Vec::with_capacity(METADATA_LEN);
        b.extend_from_slice(&v4.octets());
        b.extend_from_slice(&self.port.to_be_bytes());
        b.extend_from_slice(&self.local_gpu_idx.to_le_bytes());
        Ok(PyBytes::new(py, &b))
    }

    /// `parse_metadata(metadata) -> (ip, port, gpu_idx)`.
    #[staticmethod]
    #[pyo3(name = "parse_metadata")]
    fn parse_metadata_py(metadata: &[u8]) -> PyResult<(String, u16, u32)> {
        parse_metadata(metadata)
    }

    /// `reg(ptr, size) -> (success, mr_id)`: registers `size` bytes at address `ptr` (a torch
    /// tensor's `data_ptr()`, a numpy array's `ctypes.data`) without copying. CUDA device memory
    /// is recognised by CUDA's pointer attributes; anything else must be host memory mapped
    /// readable and writable in this process (checked against /proc/self/maps). The memory must
    /// stay alive until `dereg(mr_id)` and the end of every transfer that uses it.
    fn reg(&self, py: Python<'_>, ptr: u64, size: usize) -> PyResult<(bool, u64)> {
        if ptr == 0 || size == 0 {
            return Err(PyValueError::new_err(format!(
                "reg({ptr:#x}, {size}): give the start address and a size of at least 1 byte"
            )));
        }
        if ptr.checked_add(size as u64).is_none() {
            return Err(PyValueError::new_err(format!(
                "reg({ptr:#x}, {size}): the range wraps around the address space"
            )));
        }
        let mem = py.detach(|| -> PyResult<Memory> {
            match tcpx_gpu::pointer_device(ptr) {
                Some(ordinal) => {
                    let device = {
                        let mut d = lock(&self.devices);
                        match d.get(&ordinal) {
                            Some(dev) => dev.clone(),
                            None => {
                                let dev = Device::open(ordinal)
                                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                                d.insert(ordinal, dev.clone());
                                dev
                            }
                        }
                    };
                    // SAFETY: the driver says `ptr` is device memory of GPU `ordinal`, and
                    // `borrowed` checks the range lies in that allocation. Keeping it alive until
                    // dereg and the end of transfers is the caller's part, documented on `reg`
                    // (as with UCCL's reg).
                    let buf = unsafe { DeviceBuffer::borrowed(&device, ptr, size) }
                        .map_err(|e| PyValueError::new_err(e.to_string()))?;
                    Ok(Memory::Cuda(Arc::new(buf)))
                }
                None => {
                    maps::check_host_range(ptr, size).map_err(PyValueError::new_err)?;
                    // SAFETY: /proc/self/maps shows the range mapped readable and writable in
                    // this process now; the caller keeps it alive until dereg and the end of
                    // transfers, and does not touch it while a transfer uses it (documented on
                    // `reg`, as with UCCL's reg).
                    let buf = unsafe { HostBuffer::borrowed(ptr as *mut u8, size) }
                        .map_err(|e| PyValueError::new_err(e.to_string()))?;
                    Ok(Memory::Host(buf))
                }
            }
        })?;
        let id = self.next();
        lock(&self.regions).insert(
            id,
            Arc::new(Region {
                base: ptr,
                len: size,
                mem,
            }),
        );
        Ok((true, id))
    }

    /// `dereg(mr_id) -> success`: later transfers may not use `mr_id`. Connections that used it
    /// keep their registration (and a staging buffer for GPU memory) until they are dropped.
    fn dereg(&self, mr_id: u64) -> PyResult<bool> {
        lock(&self.regions)
            .remove(&mr_id)
            .map(|_| true)
            .ok_or_else(|| {
                PyKeyError::new_err(format!("mr_id {mr_id} is not registered on this endpoint"))
            })
    }

    /// `send(conn_id, mr_id, ptr, size) -> success`: blocks until the bytes are sent. The
    /// caller finishes GPU work writing them first (`torch.cuda.synchronize()`).
    fn send(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id: u64,
        ptr: u64,
        size: usize,
    ) -> PyResult<bool> {
        self.transfer(py, conn_id, true, &[(mr_id, ptr, size)])
    }

    /// `recv(conn_id, mr_id, ptr, size) -> success`: blocks until the bytes are in place. A send
    /// and the receive matching it have the same size.
    fn recv(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id: u64,
        ptr: u64,
        size: usize,
    ) -> PyResult<bool> {
        self.transfer(py, conn_id, false, &[(mr_id, ptr, size)])
    }

    /// `sendv(conn_id, mr_id_list, ptr_list, size_list, num_iovs) -> success`.
    fn sendv(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id_list: Vec<u64>,
        ptr_list: Vec<u64>,
        size_list: Vec<usize>,
        num_iovs: usize,
    ) -> PyResult<bool> {
        let iovs = iovs(&mr_id_list, &ptr_list, &size_list, num_iovs)?;
        self.transfer(py, conn_id, true, &iovs)
    }

    /// `recvv(conn_id, mr_id_list, ptr_list, size_list, num_iovs) -> success`.
    fn recvv(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id_list: Vec<u64>,
        ptr_list: Vec<u64>,
        size_list: Vec<usize>,
        num_iovs: usize,
    ) -> PyResult<bool> {
        let iovs = iovs(&mr_id_list, &ptr_list, &size_list, num_iovs)?;
        self.transfer(py, conn_id, false, &iovs)
    }

    /// `send_async(conn_id, mr_id, ptr, size) -> (success, transfer_id)`: queues the send;
    /// `poll_async` (or any blocking call on the connection) moves it along.
    fn send_async(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id: u64,
        ptr: u64,
        size: usize,
    ) -> PyResult<(bool, u64)> {
        self.start(py, conn_id, true, &[(mr_id, ptr, size)])
    }

    /// `recv_async(conn_id, mr_id, ptr, size) -> (success, transfer_id)`.
    fn recv_async(
        &self,
        py: Python<'_>,
        conn_id: u64,
        mr_id: u64,
        ptr: u64,
        size: usize,
    ) -> PyResult<(bool, u64)> {
        self.start(py, conn_id, false, &[(mr_id, ptr, size)])
    }

    /// `poll_async(transfer_id) -> (success, is_done)`: advances the transfer's connection
    /// without blocking. `(False, False)` when the transfer failed (see `last_error()`); a
    /// transfer id is forgotten once it reported done or failed.
    fn poll_async(&self, py: Python<'_>, transfer_id: u64) -> PyResult<(bool, bool)> {
        let (conn_id, x) = *lock(&self.transfers).get(&transfer_id).ok_or_else(|| {
            PyKeyError::new_err(format!(
                "transfer_id {transfer_id} is unknown or already reported done: use the id \
                 send_async/recv_async returned, until poll_async says is_done"
            ))
        })?;
        let slot = self.slot(conn_id)?;
        let r = py.detach(|| {
            let mut st = slot.usable(conn_id)?;
            let step = st.conn.poll(x);
            st.breaks_on(step)
        });
        match r {
            Ok(Some(_)) => {
                lock(&self.transfers).remove(&transfer_id);
                Ok((true, true))
            }
            Ok(None) => Ok((true, false)),
            Err(m) => {
                lock(&self.transfers).remove(&transfer_id);
                self.fail(m);
                Ok((false, false))
            }
        }
    }

    /// The message of the last transfer that returned `success=False`, or None.
    fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Closes a connection (its registrations and staging buffers go with it).
    fn close(&self, conn_id: u64) -> PyResult<()> {
        lock(&self.conns)
            .remove(&conn_id)
            .map(|_| ())
            .ok_or_else(|| {
                PyKeyError::new_err(format!(
                    "conn_id {conn_id} is not a connection of this endpoint"
                ))
            })
    }

    /// The port this endpoint listens on (port_base + local_gpu_idx).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The address this endpoint advertises (ip=, TCPX_P2P_IP, or the host name's address).
    #[getter]
    fn ip(&self) -> String {
        self.ip.to_string()
    }

    #[getter]
    fn local_gpu_idx(&self) -> u32 {
        self.local_gpu_idx
    }

    #[getter]
    fn transport(&self) -> String {
        self.transport.name().to_string()
    }

    /// Bytes per request: the automatic rule's for this backend, its sockets and memory (as
    /// `tcpx-run bench` takes it; docs/PERFORMANCE.md, "Chunk and window").
    #[getter]
    fn chunk(&self) -> usize {
        self.cfg.chunk
    }

    /// Requests in flight per channel, by the same rule.
    #[getter]
    fn window(&self) -> usize {
        self.cfg.window
    }
}

fn iovs(
    mrs: &[u64],
    ptrs: &[u64],
    sizes: &[usize],
    num_iovs: usize,
) -> PyResult<Vec<(u64, u64, usize)>> {
    if mrs.len() != num_iovs || ptrs.len() != num_iovs || sizes.len() != num_iovs {
        return Err(PyValueError::new_err(format!(
            "num_iovs is {num_iovs} but the lists hold {} mr_ids, {} pointers and {} sizes",
            mrs.len(),
            ptrs.len(),
            sizes.len()
        )));
    }
    Ok((0..num_iovs).map(|i| (mrs[i], ptrs[i], sizes[i])).collect())
}

/// Whether CUDA (the driver library and at least one GPU) is usable from this process.
#[pyfunction]
fn cuda_available() -> bool {
    tcpx_gpu::device_count().is_ok_and(|n| n > 0)
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Endpoint>()?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
