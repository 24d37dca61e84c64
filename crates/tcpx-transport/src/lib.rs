//! tcpx-transport: how bytes move between two processes, behind one trait.
//!
//! [`Transport`] is shaped after NCCL's net plugin API so that any backend fits behind it: `listen`
//! gives opaque handle bytes that travel out of band, the other side `connect`s with them and the
//! listener `accept`s; memory is registered per comm; `isend`/`irecv` post requests that `test`
//! polls; a finished receive is handed back with `consume` (GPUDirect-TCPX needs that to recycle
//! its bounce buffers). Matching is FIFO per comm: the k-th send on a comm lands in the k-th
//! receive posted on its peer.
//!
//! Backends ([`registry::Backend`]), each with typed settings ([`registry::BackendConfig`]),
//! opened by [`registry::open`], the one opener, and each answering what it can do
//! ([`registry::Backend::capabilities`], from `tcpx-model`, and [`registry::limits`]: memory path, NIC placement, open-file cost, NCCL
//! equivalent, limits before opening): `socket` (native kernel TCP, several sockets per comm, worker
//! threads that each drive one or more of them), `netplugin` (any NCCL net plugin through `tcpx-ffi`, GPUDirect-TCPX on A3;
//! see [`netplugin`]), `nccl` (libnccl send/recv) and `cudap2p` (GPU copies in one process). A
//! backend this build or machine lacks is reported as [`TransportError::Unavailable`], never a
//! crash; [`registry::available`] says which run here and why the others do not.
//!
//! GPU memory over a backend that moves host memory only goes through [`cuda_staging`]: pinned
//! host staging, one ring per comm ([`staging_ring`]) or a mirror per buffer, as
//! [`registry::GpuMemory`] says.
//!
//! On top sit [`driver`] (drives one transfer laid out by `tcpx-sched` over a set of comms, shared
//! by the benchmark and the endpoint) and [`endpoint`] (a small connect/accept/reg/send/recv API
//! for library users, after the UCCL P2P engine's).
//!
//! The environment is not read here: the binary (`tcpx-run`) and the Python edge (`tcpx-py`) read
//! it once into [`registry::BackendEnv`] and pass it down. The one exception is the net plugin's
//! own variables (see [`netplugin`]), which a plugin reads with getenv.
//!
//! Not for: deciding chunk sizes or windows (that is `tcpx-sched`), timing or verifying experiments
//! (`tcpx-bench`), or allocating memory (`tcpx-gpu`).

#![forbid(unsafe_code)]

pub mod backend;
mod comm_end;
pub mod cuda_staging;
pub mod cudap2p;
pub mod driver;
pub mod endpoint;
mod greeting;
pub mod nccl;
pub mod netplugin;
pub mod registry;
pub mod socket;
pub mod staging_ring;
mod worker_cpus;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use tcpx_gpu::{HostBuffer, MemError, Span};

/// Largest handle a backend may produce (NCCL_NET_HANDLE_MAXSIZE).
pub const HANDLE_MAX: usize = 128;

/// Memory a request reads from or writes into. Either kind may be owned (allocated by
/// `tcpx-gpu`) or borrowed from a caller such as the Python binding (`HostBuffer::borrowed`,
/// `DeviceBuffer::borrowed`: a torch tensor or numpy array, kept alive by its owner); backends
/// treat both alike.
#[derive(Debug, Clone)]
pub enum Memory {
    /// Host memory.
    Host(Arc<HostBuffer>),
    /// GPU memory; backends that cannot read it directly run behind [`cuda_staging::CudaStaging`].
    Cuda(Arc<tcpx_gpu::DeviceBuffer>),
}

impl Memory {
    pub fn len(&self) -> usize {
        match self {
            Memory::Host(b) => b.len(),
            Memory::Cuda(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kind(&self) -> MemoryKind {
        match self {
            Memory::Host(_) => MemoryKind::Host,
            Memory::Cuda(_) => MemoryKind::Cuda,
        }
    }

    /// Whether the bytes belong to someone else (see the type's doc).
    pub fn is_borrowed(&self) -> bool {
        match self {
            Memory::Host(b) => b.is_borrowed(),
            Memory::Cuda(b) => b.is_borrowed(),
        }
    }
}

/// Where memory lives, and what a backend can do: the model's vocabulary, which experiments are
/// checked against.
pub use tcpx_model::{Limits, MemoryKind};

/// Opaque connection handle produced by `listen` and consumed by `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handle(Vec<u8>);

impl Handle {
    /// Wraps handle bytes received from the peer; refuses more than [`HANDLE_MAX`] bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, TransportError> {
        if bytes.len() > HANDLE_MAX {
            return Err(TransportError::Protocol(format!(
                "handle of {} bytes is larger than the {HANDLE_MAX} bytes a handle may have",
                bytes.len()
            )));
        }
        Ok(Handle(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Registered memory on one comm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrId(pub u32);

/// One posted request on one comm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Everything that can go wrong below the benchmark. Each message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{what}: {source}. Check: {hint}")]
    Io {
        what: String,
        hint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} did not happen within {secs:.1} s. Check: {hint}")]
    Timeout {
        what: String,
        secs: f64,
        hint: String,
    },
    #[error("{0}")]
    Failed(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("invalid use: {0}")]
    Usage(String),
    #[error("transport `{name}` is not available here: {reason}")]
    Unavailable { name: String, reason: String },
    #[error(transparent)]
    Mem(#[from] MemError),
    #[error(transparent)]
    Sched(#[from] tcpx_sched::SchedError),
}

impl From<tcpx_model::UnknownBackend> for TransportError {
    fn from(e: tcpx_model::UnknownBackend) -> Self {
        TransportError::Usage(e.to_string())
    }
}

pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// A network backend. Implementations are cheap to share between threads.
pub trait Transport: Send + Sync {
    /// Backend name as given on the command line (`socket`, `netplugin`, `nccl`).
    fn name(&self) -> &str;
    /// What the backend allows.
    fn limits(&self) -> Limits;
    /// Starts listening; the handle goes to the peer out of band.
    fn listen(&self) -> Result<Box<dyn Listener>>;
    /// Connects to a peer's listener, retrying until `deadline`.
    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>>;
    /// Listens on one local address (the NIC a channel was given, see `tcpx_sched::nic`); the
    /// handle advertises that address. Backends that choose their NIC themselves (plugins, libnccl)
    /// refuse with [`TransportError::Unavailable`].
    fn listen_on(&self, local: std::net::IpAddr) -> Result<Box<dyn Listener>> {
        Err(no_channel_binding(self.name(), local))
    }
    /// Connects from one local address (this side's NIC for the channel), retrying until
    /// `deadline`. Same refusal as [`Transport::listen_on`] where unsupported.
    fn connect_from(
        &self,
        handle: &Handle,
        local: std::net::IpAddr,
        deadline: Instant,
    ) -> Result<Box<dyn SendComm>> {
        let _ = (handle, deadline);
        Err(no_channel_binding(self.name(), local))
    }
    /// Comms (channels) one process may open on this backend, where the backend says
    /// (a plugin's `maxComms`); `None`: no limit of its own (file descriptors still apply).
    fn max_comms(&self) -> Option<usize> {
        None
    }
    /// A counter that grows whenever some request of this transport makes progress.
    /// Backends without notifications return 0 and [`Transport::wait_activity`] just yields.
    fn activity(&self) -> u64 {
        0
    }
    /// Waits until [`Transport::activity`] differs from `seen` or `timeout` passes.
    fn wait_activity(&self, seen: u64, timeout: Duration) {
        let _ = (seen, timeout);
        std::thread::yield_now();
    }
}

/// The refusal of [`Transport::listen_on`] and [`Transport::connect_from`] by a backend that
/// chooses its NIC itself.
fn no_channel_binding(backend: &str, local: std::net::IpAddr) -> TransportError {
    TransportError::Unavailable {
        name: backend.to_string(),
        reason: format!(
            "it cannot bind a channel to address {local}: leave --nics out for this backend"
        ),
    }
}

/// The listening end of one comm.
pub trait Listener: Send {
    fn handle(&self) -> Handle;
    /// Accepts the peer's connection, waiting until `deadline`.
    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>>;
}

/// The sending end of one comm.
pub trait SendComm: Send {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId>;
    fn dereg_mr(&mut self, mr: MrId) -> Result<()>;
    /// Posts a send of `len` bytes at `offset` of `mr`. `Ok(None)`: the comm is full, try later.
    fn isend(&mut self, mr: MrId, offset: usize, len: usize, tag: u32)
        -> Result<Option<RequestId>>;
    /// `Some(bytes)` once the send finished; the request is gone afterwards.
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    /// Who is on the other end, for messages.
    fn peer(&self) -> String;
    /// What each socket of the comm has moved so far, in socket order; `None` for backends
    /// without sockets of their own to count.
    fn socket_stats(&self) -> Option<Vec<SocketStat>> {
        None
    }
}

/// What one socket of a comm has moved since the comm was opened. In the socket backend a socket
/// takes the next piece whenever it is free, so a socket the kernel serves slower carries fewer
/// bytes over the same wall time; `bytes / busy_ns` is the socket's rate while it had work, which
/// shows a straggler and leaves out sockets a small message gave nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketStat {
    /// Payload bytes of the pieces this socket has finished (headers not counted).
    pub bytes: u64,
    /// Nanoseconds this socket held those pieces: a send piece from when the socket took it to
    /// its last byte written, a received one from its first header byte to its last byte read.
    pub busy_ns: u64,
    /// Pieces (of any length) this socket has finished.
    pub pieces: u64,
    /// Data system calls made on the socket (`read`, `write`, `writev`, `send`), those that
    /// would have blocked included.
    pub calls: u64,
    /// Of `calls`, the ones that would have blocked (`EAGAIN`).
    pub blocked_calls: u64,
    /// `poll` waits of the thread that drives this socket, counted on its first socket.
    pub waits: u64,
    /// Of `bytes`, those received around the cache: read into the socket's small buffer and
    /// copied on with streaming stores (`socket::receives_around_cache`).
    pub around_cache_bytes: u64,
    /// The CPU the worker thread driving this socket was given (`worker_cpus` = `own`);
    /// `None` where the kernel places it.
    pub cpu: Option<u32>,
}

/// The receiving end of one comm.
pub trait RecvComm: Send {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId>;
    fn dereg_mr(&mut self, mr: MrId) -> Result<()>;
    /// Posts a receive of up to `len` bytes at `offset` of `mr`. `Ok(None)`: full, try later.
    fn irecv(&mut self, mr: MrId, offset: usize, len: usize, tag: u32)
        -> Result<Option<RequestId>>;
    /// `Some(bytes received)` once the data is in place.
    fn test(&mut self, req: RequestId) -> Result<Option<usize>>;
    /// Hands a finished receive back; its window slot is free afterwards. FIFO order.
    fn consume(&mut self, req: RequestId) -> Result<()>;
    fn peer(&self) -> String;
    /// As [`SendComm::socket_stats`].
    fn socket_stats(&self) -> Option<Vec<SocketStat>> {
        None
    }
}

/// Opens a backend by name with `socket` and every other setting at its default (no environment
/// is read: see [`registry::BackendEnv`]), for host memory, through [`registry::open`].
pub fn open(name: &str, socket: socket::SocketConfig) -> Result<Arc<dyn Transport>> {
    let backend: registry::Backend = name.parse()?;
    registry::open(
        &registry::BackendConfig::new(backend, socket, &registry::BackendEnv::default()),
        None,
    )
}

/// Makes the [`TransportError::Io`] of a failed I/O call: what was being done and what to check.
pub(crate) fn io_err(
    what: impl Into<String>,
    hint: impl Into<String>,
) -> impl Fn(std::io::Error) -> TransportError {
    let (what, hint) = (what.into(), hint.into());
    move |source| TransportError::Io {
        what: what.clone(),
        hint: hint.clone(),
        source,
    }
}

/// `text` cut to 40 characters, for quoting a value a user gave in a message.
pub(crate) fn shown(text: &str) -> String {
    const MAX: usize = 40;
    match text.char_indices().nth(MAX) {
        None => text.to_string(),
        Some((i, _)) => format!("{}...", &text[..i]),
    }
}

/// A comm's memory registrations, for backends that keep one value per registration: the `n`-th
/// registration is [`MrId`] `n`, and an id is not given again after it is deregistered.
pub(crate) struct MrTable<T> {
    slots: Vec<Option<T>>,
}

impl<T> Default for MrTable<T> {
    fn default() -> Self {
        MrTable { slots: Vec::new() }
    }
}

impl<T> MrTable<T> {
    pub(crate) fn insert(&mut self, value: T) -> MrId {
        self.slots.push(Some(value));
        MrId(self.slots.len() as u32 - 1)
    }

    pub(crate) fn get(&self, mr: MrId) -> Result<&T> {
        match self.slots.get(mr.0 as usize) {
            Some(Some(v)) => Ok(v),
            _ => Err(not_registered(mr)),
        }
    }

    pub(crate) fn get_mut(&mut self, mr: MrId) -> Result<&mut T> {
        match self.slots.get_mut(mr.0 as usize) {
            Some(Some(v)) => Ok(v),
            _ => Err(not_registered(mr)),
        }
    }

    pub(crate) fn remove(&mut self, mr: MrId) -> Result<T> {
        self.slots
            .get_mut(mr.0 as usize)
            .and_then(Option::take)
            .ok_or_else(|| not_registered(mr))
    }
}

fn not_registered(mr: MrId) -> TransportError {
    TransportError::Usage(format!("memory registration {} is not registered", mr.0))
}

/// [`RecvComm::consume`] of a receive that `test` has not reported done.
pub(crate) fn consumed_before_done(req: RequestId) -> TransportError {
    TransportError::Usage(format!(
        "receive {} consumed before its test reported it done",
        req.0
    ))
}

/// A progress counter with a condition variable, for backends whose workers can wake a waiter.
#[derive(Debug, Default)]
pub struct Activity {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Activity {
    pub fn bump(&self) {
        let mut c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *c = c.wrapping_add(1);
        self.changed.notify_all();
    }

    pub fn get(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn wait(&self, seen: u64, timeout: Duration) {
        let c = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if *c != seen {
            return;
        }
        let _ = self
            .changed
            .wait_timeout_while(c, timeout, |c| *c == seen)
            .map(|(g, _)| drop(g));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_are_numbered_in_order_and_an_id_is_not_given_twice() {
        let mut mrs = MrTable::default();
        assert_eq!(mrs.insert("a"), MrId(0));
        assert_eq!(mrs.insert("b"), MrId(1));
        assert_eq!(mrs.remove(MrId(0)).unwrap(), "a");
        assert_eq!(mrs.insert("c"), MrId(2));
        *mrs.get_mut(MrId(2)).unwrap() = "d";
        assert_eq!(*mrs.get(MrId(2)).unwrap(), "d");
        // Removed or never given: refused with the id, whichever way it is asked for.
        for mr in [MrId(0), MrId(7)] {
            let want = format!(
                "invalid use: memory registration {} is not registered",
                mr.0
            );
            assert_eq!(mrs.get(mr).unwrap_err().to_string(), want);
            assert_eq!(mrs.get_mut(mr).unwrap_err().to_string(), want);
            assert_eq!(mrs.remove(mr).unwrap_err().to_string(), want);
        }
    }
}
