//! Backend `socket`: native kernel TCP, `socks` sockets per comm, one worker thread per socket.
//!
//! Wire format, per socket and per request, in FIFO order: one or more pieces, each a 24-byte
//! header (total bytes of the request, offset of the piece, length of the piece with
//! [`LAST_PIECE`] set on this socket's last piece of the request; little endian u64s) followed by
//! the piece's bytes. A request of `n` bytes is cut into [`PIECES_PER_SOCKET`] contiguous pieces
//! per socket when those are at least [`MIN_SHARED_PIECE`] bytes, else one per socket (at least
//! [`MIN_PIECE`] bytes each, so small messages use few sockets), and
//! the sockets' workers take pieces from the request as they become free: a socket the kernel
//! serves faster carries more, so one slow socket does not hold the whole comm to its pace. Every
//! socket still ends every request with a header marked last (of an empty piece if it got none),
//! which keeps the per-socket FIFO streams aligned without a shared sequencer.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::{
    Activity, Handle, Limits, Listener, Memory, MemoryKind, MrId, RecvComm, RequestId, Result,
    SendComm, Span, Transport, TransportError,
};

const MAGIC: &[u8; 8] = b"TCPXSOCK";
const WIRE_VERSION: u16 = 2;
const HEADER: usize = 24;
/// Bit of a header's length word that marks the socket's last piece of a request.
pub const LAST_PIECE: u64 = 1 << 63;
/// Smallest piece a request is cut into.
pub const MIN_PIECE: usize = 64 * 1024;
/// Pieces per socket a large request is cut into, so that sockets can even out their pace.
pub const PIECES_PER_SOCKET: usize = 2;
/// Most bytes one `write` or `read` system call moves. Over loopback on a 16-core host plain C TCP
/// moved 1.3x more with 256 KiB calls than with whole-slice ones at 1 and 8 streams (the receiver
/// takes the socket lock once per call; shorter calls let sender and receiver copy at once).
pub const MAX_CALL: usize = 256 * 1024;
/// Smallest piece worth the extra header and wake-up of cutting more pieces than sockets: below
/// it a request is cut into one piece per socket (measured on a 16-core host: 256 KiB pieces at
/// 16 sockets cost more in system calls than the even pace gained, see docs/PERFORMANCE.md).
pub const MIN_SHARED_PIECE: usize = 512 * 1024;
/// Most sockets per comm (NCCL allows 64 in total per comm; 16 x 1 is plenty for one NIC).
pub const MAX_SOCKS: usize = 64;
/// How long an accepted data socket may take to send its greeting before it is dropped as a
/// stray (a port scan, a silent connection).
pub const STRAY_HELLO_WAIT: Duration = Duration::from_secs(5);
/// Requests in flight per comm, as NCCL's net API allows.
pub const MAX_REQUESTS: usize = 32;

/// Settings of the socket backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// Address listeners bind to and handles advertise.
    pub bind: IpAddr,
    /// Sockets per comm.
    pub socks: usize,
    /// SO_SNDBUF/SO_RCVBUF to ask for. `None` leaves Linux's autotuning on, which grows buffers
    /// up to net.ipv4.tcp_wmem/tcp_rmem's maximum; an explicit size is capped at net.core.wmem_max.
    pub sock_buf: Option<usize>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            socks: 1,
            sock_buf: None,
        }
    }
}

/// Native TCP transport.
pub struct SocketTransport {
    cfg: SocketConfig,
    activity: Arc<Activity>,
    next_comm: AtomicU64,
}

impl SocketTransport {
    pub fn new(cfg: SocketConfig) -> Result<Self> {
        if cfg.socks == 0 || cfg.socks > MAX_SOCKS {
            return Err(TransportError::Usage(format!(
                "{} sockets per channel asked for: the socket backend takes 1 to {MAX_SOCKS}",
                cfg.socks
            )));
        }
        Ok(SocketTransport {
            cfg,
            activity: Arc::new(Activity::default()),
            next_comm: AtomicU64::new(1),
        })
    }

    pub fn config(&self) -> &SocketConfig {
        &self.cfg
    }

    /// Listens on `bind` (port chosen by the kernel); the handle advertises that address.
    pub fn listen_at(&self, bind: IpAddr) -> Result<Box<dyn Listener>> {
        let addr = SocketAddr::new(bind, 0);
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(io_err(
                "creating a data socket",
                "the process may be out of file descriptors (ulimit -n)",
            ))?;
        // Buffer sizes set on the listener are inherited by accepted sockets, before the handshake,
        // which is when the TCP window scale is fixed.
        tune(SockRef::from(&sock), &self.cfg).map_err(io_err(
            "setting socket options",
            "net.core.rmem_max / wmem_max",
        ))?;
        sock.bind(&addr.into()).map_err(io_err(
            format!("binding a data listener to {bind}"),
            "the address must belong to this machine (ip addr)",
        ))?;
        sock.listen(MAX_SOCKS as i32).map_err(io_err(
            "listening",
            "the address must belong to this machine",
        ))?;
        let listener: TcpListener = sock.into();
        let local = listener.local_addr().map_err(io_err(
            "reading the listener address",
            "nothing to fix; report this",
        ))?;
        let comm_id = self.next_comm.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(SocketListener {
            listener,
            data: HandleData {
                socks: self.cfg.socks as u16,
                nonce: random_nonce(),
                addr: local,
            },
            cfg: self.cfg.clone(),
            activity: Arc::clone(&self.activity),
            comm_id,
        }))
    }

    /// Connects to a peer's listener, from `local` when given (the NIC this channel leaves by).
    pub fn connect_via(
        &self,
        handle: &Handle,
        local: Option<IpAddr>,
        deadline: Instant,
    ) -> Result<Box<dyn SendComm>> {
        let h = decode_handle(handle)?;
        if h.socks as usize != self.cfg.socks {
            return Err(TransportError::Usage(format!(
                "peer listens with {} sockets per channel, this side has {}: use the same --socks-per-channel on both",
                h.socks, self.cfg.socks
            )));
        }
        let mut streams = Vec::with_capacity(self.cfg.socks);
        for index in 0..self.cfg.socks {
            let stream = connect_retry_from(h.addr, local, &self.cfg, deadline)?;
            let mut hello = Vec::with_capacity(20);
            hello.extend_from_slice(MAGIC);
            hello.extend_from_slice(&h.nonce.to_le_bytes());
            hello.extend_from_slice(&(index as u16).to_le_bytes());
            hello.extend_from_slice(&(self.cfg.socks as u16).to_le_bytes());
            (&stream).write_all(&hello).map_err(io_err(
                format!("greeting {} on data socket {index}", h.addr),
                "the peer may have given up waiting; start both sides together",
            ))?;
            streams.push(stream);
        }
        let comm_id = self.next_comm.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(SocketSendComm::start(
            streams,
            h.addr.to_string(),
            comm_id,
            Arc::clone(&self.activity),
        )?))
    }
}

fn io_err(
    what: impl Into<String>,
    hint: impl Into<String>,
) -> impl FnOnce(io::Error) -> TransportError {
    let (what, hint) = (what.into(), hint.into());
    move |source| TransportError::Io { what, hint, source }
}

fn tune(sock: SockRef<'_>, cfg: &SocketConfig) -> io::Result<()> {
    sock.set_nodelay(true)?;
    if let Some(b) = cfg.sock_buf {
        sock.set_send_buffer_size(b)?;
        sock.set_recv_buffer_size(b)?;
    }
    Ok(())
}

struct HandleData {
    socks: u16,
    nonce: u64,
    addr: SocketAddr,
}

fn encode_handle(h: &HandleData) -> Handle {
    let mut b = Vec::with_capacity(48);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    b.extend_from_slice(&h.socks.to_le_bytes());
    b.extend_from_slice(&h.nonce.to_le_bytes());
    match h.addr.ip() {
        IpAddr::V4(ip) => {
            b.push(4);
            b.extend_from_slice(&ip.to_ipv6_mapped().octets());
        }
        IpAddr::V6(ip) => {
            b.push(6);
            b.extend_from_slice(&ip.octets());
        }
    }
    b.extend_from_slice(&h.addr.port().to_le_bytes());
    Handle(b)
}

fn decode_handle(h: &Handle) -> Result<HandleData> {
    let b = h.as_bytes();
    let bad = |why: &str| {
        TransportError::Protocol(format!(
            "handle of {} bytes is not a socket-backend handle ({why}); both sides must use --transport socket",
            b.len()
        ))
    };
    if b.len() != 39 || &b[..8] != MAGIC {
        return Err(bad("wrong size or magic"));
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != WIRE_VERSION {
        return Err(bad(&format!(
            "wire version {version}, this build speaks {WIRE_VERSION}"
        )));
    }
    let socks = u16::from_le_bytes([b[10], b[11]]);
    let nonce = u64::from_le_bytes(b[12..20].try_into().expect("8 bytes"));
    let octets: [u8; 16] = b[21..37].try_into().expect("16 bytes");
    let v6 = std::net::Ipv6Addr::from(octets);
    let ip = match b[20] {
        4 => IpAddr::V4(v6.to_ipv4_mapped().ok_or_else(|| bad("bad IPv4 address"))?),
        6 => IpAddr::V6(v6),
        _ => return Err(bad("unknown address family")),
    };
    let port = u16::from_le_bytes([b[37], b[38]]);
    Ok(HandleData {
        socks,
        nonce,
        addr: SocketAddr::new(ip, port),
    })
}

fn random_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

impl Transport for SocketTransport {
    fn name(&self) -> &str {
        "socket"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_requests: MAX_REQUESTS,
            max_request_bytes: i32::MAX as usize,
            memory: vec![MemoryKind::Host],
        }
    }

    fn listen(&self) -> Result<Box<dyn Listener>> {
        self.listen_at(self.cfg.bind)
    }

    fn listen_on(&self, local: IpAddr) -> Result<Box<dyn Listener>> {
        self.listen_at(local)
    }

    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
        self.connect_via(handle, None, deadline)
    }

    fn connect_from(
        &self,
        handle: &Handle,
        local: IpAddr,
        deadline: Instant,
    ) -> Result<Box<dyn SendComm>> {
        self.connect_via(handle, Some(local), deadline)
    }

    fn activity(&self) -> u64 {
        self.activity.get()
    }

    fn wait_activity(&self, seen: u64, timeout: Duration) {
        self.activity.wait(seen, timeout)
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Accepts one connection on `listener`, waiting until `deadline`; `Ok(None)` when nobody came
/// in time. The accepted stream is blocking. std has no accept with a timeout, so this polls a
/// non-blocking listener with a short growing pause (capped at 10 ms) that bounds the wait's cost.
pub fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    listener.set_nonblocking(true)?;
    let mut pause = Duration::from_micros(200);
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                stream.set_nonblocking(false)?;
                return Ok(Some((stream, from)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let Some(left) = remaining(deadline) else {
                    return Ok(None);
                };
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Connects, retrying refused or unreachable attempts with a growing pause until `deadline`.
pub fn connect_retry(addr: SocketAddr, cfg: &SocketConfig, deadline: Instant) -> Result<TcpStream> {
    connect_retry_from(addr, None, cfg, deadline)
}

/// [`connect_retry`] from a given local address (port chosen by the kernel), so the connection
/// leaves by that address's NIC.
pub fn connect_retry_from(
    addr: SocketAddr,
    local: Option<IpAddr>,
    cfg: &SocketConfig,
    deadline: Instant,
) -> Result<TcpStream> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let Some(left) = remaining(deadline) else {
            return Err(TransportError::Timeout {
                what: format!("connecting to {addr} ({attempts} attempts)"),
                secs: started.elapsed().as_secs_f64(),
                hint: format!(
                    "is the peer running and listening on {addr}? is a firewall in the way?"
                ),
            });
        };
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(io_err(
                "creating a socket",
                "the process may be out of file descriptors (ulimit -n)",
            ))?;
        tune(SockRef::from(&sock), cfg).map_err(io_err(
            "setting socket options",
            "net.core.rmem_max / wmem_max",
        ))?;
        if let Some(ip) = local {
            sock.bind(&SocketAddr::new(ip, 0).into()).map_err(io_err(
                format!("binding a data connection to local address {ip}"),
                "the address must belong to this machine (ip addr)",
            ))?;
        }
        match sock.connect_timeout(&addr.into(), left.min(Duration::from_secs(5))) {
            Ok(()) => return Ok(sock.into()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                ) =>
            {
                std::thread::sleep(pause.min(remaining(deadline).unwrap_or_default()));
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(TransportError::Io {
                    what: format!("connecting to {addr}"),
                    hint: "the address must be reachable from this machine (ip route get)".into(),
                    source: e,
                })
            }
        }
    }
}

struct SocketListener {
    listener: TcpListener,
    data: HandleData,
    cfg: SocketConfig,
    activity: Arc<Activity>,
    comm_id: u64,
}

impl Listener for SocketListener {
    fn handle(&self) -> Handle {
        encode_handle(&self.data)
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let socks = self.cfg.socks;
        let mut slots: Vec<Option<TcpStream>> = (0..socks).map(|_| None).collect();
        let mut got = 0;
        let started = Instant::now();
        let mut peer = None;
        while got < socks {
            let accepted =
                accept_until(&self.listener, deadline).map_err(|e| TransportError::Io {
                    what: format!("accepting on {}", self.data.addr),
                    hint: "the process may be out of file descriptors (ulimit -n)".into(),
                    source: e,
                })?;
            let Some((stream, from)) = accepted else {
                return Err(TransportError::Timeout {
                    what: format!(
                        "accepting {socks} data sockets on {} ({got} arrived)",
                        self.data.addr
                    ),
                    secs: started.elapsed().as_secs_f64(),
                    hint:
                        "did the peer get the handle and connect? same --socks-per-channel on both?"
                            .into(),
                });
            };
            // A peer's socket greets at once: a silent one (a stray) is dropped after a short
            // wait instead of holding the listener until the deadline.
            let hello_by = deadline.min(Instant::now() + STRAY_HELLO_WAIT);
            match read_hello(&stream, hello_by, self.data.nonce, socks) {
                Ok(index) if slots[index].is_none() => {
                    tune(SockRef::from(&stream), &self.cfg)
                        .map_err(io_err("setting socket options", "net.core.rmem_max"))?;
                    slots[index] = Some(stream);
                    got += 1;
                    peer = Some(from);
                }
                Ok(index) => {
                    tracing::warn!(
                        "dropping a second connection for data socket {index} from {from}"
                    )
                }
                Err(e) => tracing::warn!("dropping a stray connection from {from}: {e}"),
            }
        }
        let streams: Vec<TcpStream> = slots
            .into_iter()
            .map(|s| s.expect("all slots filled"))
            .collect();
        let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
        Ok(Box::new(SocketRecvComm::start(
            streams,
            peer,
            self.comm_id,
            Arc::clone(&self.activity),
        )?))
    }
}

fn read_hello(
    stream: &TcpStream,
    deadline: Instant,
    nonce: u64,
    socks: usize,
) -> io::Result<usize> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(
        remaining(deadline).unwrap_or(Duration::from_millis(1)),
    ))?;
    let mut hello = [0u8; 20];
    (&*stream).read_exact(&mut hello)?;
    stream.set_read_timeout(None)?;
    let their_nonce = u64::from_le_bytes(hello[8..16].try_into().expect("8 bytes"));
    let index = u16::from_le_bytes([hello[16], hello[17]]) as usize;
    let count = u16::from_le_bytes([hello[18], hello[19]]) as usize;
    if &hello[..8] != MAGIC || their_nonce != nonce || index >= socks || count != socks {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "greeting does not match this listener",
        ));
    }
    Ok(index)
}

/// How a request stands; shared by the comm and the socket workers.
#[derive(Debug)]
struct ReqState {
    /// Sockets that have not finished their piece yet.
    remaining: AtomicUsize,
    /// Bytes moved.
    bytes: AtomicU64,
    /// For receives: the message size the sender announced (all sockets must agree).
    total: AtomicU64,
    /// For receives: parts of the posted span not yet handed to a worker. For sends: the pieces
    /// no worker has taken yet, the lowest offset last.
    free: Mutex<Vec<Span>>,
    /// Offset of the posted span in its buffer.
    base: usize,
    /// Size of the posted span.
    capacity: usize,
}

/// First error of a comm; every later test sees it.
#[derive(Debug, Default)]
struct Failure(Mutex<Option<String>>);

impl Failure {
    fn set(&self, msg: String) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(msg);
        }
    }
    fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct SendJob {
    req: Arc<ReqState>,
}

struct RecvJob {
    req: Arc<ReqState>,
}

/// Sockets and their workers, common to both directions.
struct Workers<J> {
    queues: Vec<Sender<J>>,
    streams: Vec<TcpStream>,
    threads: Vec<JoinHandle<()>>,
    failure: Arc<Failure>,
    peer: String,
    comm_id: u64,
    mrs: Vec<Option<Memory>>,
    reqs: VecDeque<(RequestId, Arc<ReqState>)>,
    next_req: u64,
}

impl<J: Send + 'static> Workers<J> {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        activity: Arc<Activity>,
        dir: &'static str,
        work: fn(&mut TcpStream, J) -> io::Result<bool>,
    ) -> Result<Self> {
        let failure = Arc::new(Failure::default());
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        let mut kept = Vec::new();
        for (i, stream) in streams.into_iter().enumerate() {
            let (tx, rx): (Sender<J>, Receiver<J>) = mpsc::channel();
            let mut own = stream
                .try_clone()
                .map_err(io_err("cloning a socket", "ulimit -n"))?;
            kept.push(stream);
            let failure = Arc::clone(&failure);
            let activity = Arc::clone(&activity);
            let peer_name = peer.clone();
            let t = std::thread::Builder::new()
                .name(format!("tcpx-{dir}-c{comm_id}-s{i}"))
                .spawn(move || {
                    for job in rx {
                        match work(&mut own, job) {
                            // Only a finished request lets the driver move on: waking it for
                            // every piece cost a wake-up per socket per request for nothing.
                            Ok(true) => activity.bump(),
                            Ok(false) => {}
                            Err(e) => {
                                let what = match e.kind() {
                                    io::ErrorKind::UnexpectedEof
                                    | io::ErrorKind::ConnectionReset
                                    | io::ErrorKind::BrokenPipe => {
                                        format!("peer {peer_name} closed the connection")
                                    }
                                    _ => format!("error talking to {peer_name}"),
                                };
                                failure.set(format!(
                                    "{what} (comm {comm_id}, socket {i}, {dir}): {e}"
                                ));
                                activity.bump();
                                return;
                            }
                        }
                    }
                })
                .map_err(io_err(
                    "starting a socket worker thread",
                    "the process may be at its thread limit",
                ))?;
            queues.push(tx);
            threads.push(t);
        }
        Ok(Workers {
            queues,
            streams: kept,
            threads,
            failure,
            peer,
            comm_id,
            mrs: Vec::new(),
            reqs: VecDeque::new(),
            next_req: 0,
        })
    }

    fn reg(&mut self, mem: &Memory) -> Result<MrId> {
        if mem.kind() != MemoryKind::Host {
            return Err(TransportError::Usage(
                "the socket backend moves host memory only".into(),
            ));
        }
        self.mrs.push(Some(mem.clone()));
        Ok(MrId(self.mrs.len() as u32 - 1))
    }

    fn dereg(&mut self, mr: MrId) -> Result<()> {
        match self.mrs.get_mut(mr.0 as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(TransportError::Usage(format!(
                "memory registration {} is not registered",
                mr.0
            ))),
        }
    }

    fn span(&self, mr: MrId, offset: usize, len: usize) -> Result<Span> {
        match self.mrs.get(mr.0 as usize) {
            Some(Some(Memory::Host(b))) => Ok(b.span(offset, len)?),
            _ => Err(TransportError::Usage(format!(
                "memory registration {} is not registered",
                mr.0
            ))),
        }
    }

    fn check_room(&self, len: usize) -> Result<bool> {
        if let Some(f) = self.failure.get() {
            return Err(TransportError::Failed(f));
        }
        if len == 0 || len > i32::MAX as usize {
            return Err(TransportError::Usage(format!(
                "request of {len} bytes: the socket backend takes 1 to {} bytes per request",
                i32::MAX
            )));
        }
        Ok(self.reqs.len() < MAX_REQUESTS)
    }

    fn push(&mut self, state: Arc<ReqState>) -> RequestId {
        let id = RequestId(self.next_req);
        self.next_req += 1;
        self.reqs.push_back((id, state));
        id
    }

    fn find(&self, req: RequestId) -> Result<(usize, &Arc<ReqState>)> {
        self.reqs
            .iter()
            .enumerate()
            .find(|(_, (id, _))| *id == req)
            .map(|(i, (_, s))| (i, s))
            .ok_or_else(|| {
                TransportError::Usage(format!(
                    "request {} is not outstanding on comm {}",
                    req.0, self.comm_id
                ))
            })
    }

    fn done(&self, req: RequestId) -> Result<Option<(usize, usize)>> {
        let (pos, st) = self.find(req)?;
        if st.remaining.load(Ordering::Acquire) == 0 {
            return Ok(Some((pos, st.bytes.load(Ordering::Acquire) as usize)));
        }
        match self.failure.get() {
            Some(f) => Err(TransportError::Failed(f)),
            None => Ok(None),
        }
    }
}

impl<J> Drop for Workers<J> {
    fn drop(&mut self) {
        self.queues.clear();
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl ReqState {
    /// The next untaken piece of a send.
    fn take_next(&self) -> Option<Span> {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }
}

fn encode_header(total: u64, off: u64, len: u64, last: bool) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[..8].copy_from_slice(&total.to_le_bytes());
    header[8..16].copy_from_slice(&off.to_le_bytes());
    let word = if last { len | LAST_PIECE } else { len };
    header[16..].copy_from_slice(&word.to_le_bytes());
    header
}

/// Sends this socket's share of a request: pieces taken from the request until none is left, the
/// last one marked. The next piece is taken before the current one is written, so the worker
/// knows which is its last. Returns true when this socket was the request's last to finish.
fn send_pieces(stream: &mut TcpStream, job: SendJob) -> io::Result<bool> {
    let req = &job.req;
    let total = req.capacity as u64;
    let mut next = req.take_next();
    loop {
        let this = next.take();
        if this.is_some() {
            next = req.take_next();
        }
        let last = next.is_none();
        let (off, payload): (u64, &[u8]) = match &this {
            Some(span) => ((span.offset() - req.base) as u64, span),
            None => (0, &[]),
        };
        let header = encode_header(total, off, payload.len() as u64, last);
        write_all_vectored(stream, &header, payload)?;
        req.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
        // Give the range back before the request can be reported done.
        drop(this);
        if last {
            break;
        }
    }
    Ok(req.remaining.fetch_sub(1, Ordering::AcqRel) == 1)
}

/// Writes header and payload with as few syscalls as the kernel allows.
fn write_all_vectored(stream: &mut TcpStream, mut head: &[u8], mut body: &[u8]) -> io::Result<()> {
    while !head.is_empty() || !body.is_empty() {
        let part = &body[..body.len().min(MAX_CALL)];
        let n = if head.is_empty() {
            stream.write(part)
        } else {
            stream.write_vectored(&[IoSlice::new(head), IoSlice::new(part)])
        };
        match n {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "socket accepted no bytes",
                ))
            }
            Ok(mut n) => {
                let h = n.min(head.len());
                head = &head[h..];
                n -= h;
                body = &body[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Receives this socket's share of a request: pieces until the one marked last. Returns true
/// when this socket was the request's last to finish.
fn recv_pieces(stream: &mut TcpStream, job: RecvJob) -> io::Result<bool> {
    let req = &job.req;
    loop {
        let mut header = [0u8; HEADER];
        stream.read_exact(&mut header)?;
        let word =
            |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (total, off, len_word) = (word(0), word(1), word(2));
        let (len, last) = (len_word & !LAST_PIECE, len_word & LAST_PIECE != 0);
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        if total > req.capacity as u64 {
            return Err(invalid(format!(
                "peer sent a message of {total} bytes into a receive of {} bytes; both sides must post the same sizes",
                req.capacity
            )));
        }
        if off.checked_add(len).is_none_or(|end| end > total) {
            return Err(invalid(format!(
                "piece {off}+{len} is outside a message of {total} bytes"
            )));
        }
        let prev = req.total.swap(total, Ordering::AcqRel);
        if prev != u64::MAX && prev != total {
            return Err(invalid(format!(
                "sockets disagree on message size: {prev} vs {total}"
            )));
        }
        if len > 0 {
            let mut piece = take_piece(req, off as usize, len as usize)
                .ok_or_else(|| invalid(format!("piece {off}+{len} was already filled")))?;
            for part in piece.chunks_mut(MAX_CALL) {
                stream.read_exact(part)?;
            }
            req.bytes.fetch_add(len, Ordering::Relaxed);
        }
        if last {
            break;
        }
    }
    Ok(req.remaining.fetch_sub(1, Ordering::AcqRel) == 1)
}

/// Cuts `[off, off+len)` (relative to the request) out of the request's free spans.
fn take_piece(req: &ReqState, off: usize, len: usize) -> Option<Span> {
    let want = req.base + off;
    let mut free = req.free.lock().unwrap_or_else(|p| p.into_inner());
    let i = free
        .iter()
        .position(|s| s.offset() <= want && want + len <= s.offset() + s.len())?;
    let mut span = free.swap_remove(i);
    if span.offset() < want {
        let at = want - span.offset();
        let (before, rest) = span.split_at(at).ok()?;
        free.push(before);
        span = rest;
    }
    if span.len() > len {
        let (piece, after) = span.split_at(len).ok()?;
        free.push(after);
        span = piece;
    }
    Some(span)
}

struct SocketSendComm {
    w: Workers<SendJob>,
}

impl SocketSendComm {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        activity: Arc<Activity>,
    ) -> Result<Self> {
        Ok(SocketSendComm {
            w: Workers::start(streams, peer, comm_id, activity, "send", send_pieces)?,
        })
    }
}

/// Size of the pieces an `n`-byte request is cut into over `socks` sockets.
fn piece_size(n: usize, socks: usize) -> usize {
    let shared = n.div_ceil(socks * PIECES_PER_SOCKET);
    let piece = if shared >= MIN_SHARED_PIECE {
        shared
    } else {
        n.div_ceil(socks).max(MIN_PIECE)
    };
    piece.next_multiple_of(4096)
}

/// Cuts `span` into pieces of `piece` bytes, listed lowest offset last (workers pop from the end).
fn cut_pieces(span: Span, piece: usize) -> Vec<Span> {
    let mut pieces = Vec::with_capacity(span.len().div_ceil(piece));
    let mut rest = Some(span);
    while let Some(s) = rest.take() {
        match s.split_at(piece) {
            Ok((a, b)) => {
                pieces.push(a);
                rest = Some(b);
            }
            Err(s) => pieces.push(s),
        }
    }
    pieces.reverse();
    pieces
}

impl SendComm for SocketSendComm {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        self.w.reg(mem)
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        self.w.dereg(mr)
    }

    fn isend(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        _tag: u32,
    ) -> Result<Option<RequestId>> {
        if !self.w.check_room(len)? {
            return Ok(None);
        }
        let socks = self.w.queues.len();
        let span = self.w.span(mr, offset, len)?;
        let state = Arc::new(ReqState {
            remaining: AtomicUsize::new(socks),
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(len as u64),
            free: Mutex::new(cut_pieces(span, piece_size(len, socks))),
            base: offset,
            capacity: len,
        });
        for q in &self.w.queues {
            if q.send(SendJob {
                req: Arc::clone(&state),
            })
            .is_err()
            {
                // The worker ended after an error; the failure says which.
                let f = self
                    .w
                    .failure
                    .get()
                    .unwrap_or_else(|| "socket worker stopped".into());
                return Err(TransportError::Failed(f));
            }
        }
        Ok(Some(self.w.push(state)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        match self.w.done(req)? {
            Some((pos, bytes)) => {
                self.w.reqs.remove(pos);
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }

    fn peer(&self) -> String {
        self.w.peer.clone()
    }
}

struct SocketRecvComm {
    w: Workers<RecvJob>,
    /// Receives that completed and await `consume`.
    completed: HashMap<RequestId, usize>,
}

impl SocketRecvComm {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        activity: Arc<Activity>,
    ) -> Result<Self> {
        Ok(SocketRecvComm {
            w: Workers::start(streams, peer, comm_id, activity, "recv", recv_pieces)?,
            completed: HashMap::new(),
        })
    }
}

impl RecvComm for SocketRecvComm {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        self.w.reg(mem)
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        self.w.dereg(mr)
    }

    fn irecv(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        _tag: u32,
    ) -> Result<Option<RequestId>> {
        if !self.w.check_room(len)? {
            return Ok(None);
        }
        let span = self.w.span(mr, offset, len)?;
        let socks = self.w.queues.len();
        let state = Arc::new(ReqState {
            remaining: AtomicUsize::new(socks),
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(u64::MAX),
            free: Mutex::new(vec![span]),
            base: offset,
            capacity: len,
        });
        for q in &self.w.queues {
            if q.send(RecvJob {
                req: Arc::clone(&state),
            })
            .is_err()
            {
                let f = self
                    .w
                    .failure
                    .get()
                    .unwrap_or_else(|| "socket worker stopped".into());
                return Err(TransportError::Failed(f));
            }
        }
        Ok(Some(self.w.push(state)))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(&b) = self.completed.get(&req) {
            return Ok(Some(b));
        }
        match self.w.done(req)? {
            Some((pos, bytes)) => {
                // Unfilled parts of a short message go back to the buffer now.
                self.w.reqs[pos]
                    .1
                    .free
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
                self.completed.insert(req, bytes);
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.w.reqs.front() {
            Some((id, _)) if *id == req && self.completed.remove(&req).is_some() => {
                self.w.reqs.pop_front();
                Ok(())
            }
            Some((id, _)) if *id == req => Err(TransportError::Usage(format!(
                "receive {} consumed before its test reported it done",
                req.0
            ))),
            _ => Err(TransportError::Usage(format!(
                "receive {} consumed out of FIFO order on comm {}",
                req.0, self.w.comm_id
            ))),
        }
    }

    fn peer(&self) -> String {
        self.w.peer.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let d = HandleData {
            socks: 4,
            nonce: 42,
            addr: "127.0.0.3:5000".parse().unwrap(),
        };
        let h = encode_handle(&d);
        assert!(h.as_bytes().len() <= crate::HANDLE_MAX);
        let back = decode_handle(&h).unwrap();
        assert_eq!((back.socks, back.nonce, back.addr), (4, 42, d.addr));
        let e = decode_handle(&Handle(vec![1, 2, 3])).err().unwrap();
        assert!(e.to_string().contains("not a socket-backend handle"), "{e}");
    }

    #[test]
    fn pieces_cover_small_and_large_requests() {
        assert_eq!(piece_size(1000, 4), MIN_PIECE);
        assert_eq!(piece_size(8 << 20, 4), (8 << 20) / 4 / PIECES_PER_SOCKET);
        // 256 KiB shared pieces are too small to be worth it: one 512 KiB piece per socket.
        assert_eq!(piece_size(8 << 20, 16), 512 << 10);
        assert_eq!(piece_size((8 << 20) + 1, 4) % 4096, 0);
        for (n, k) in [(1usize, 1usize), (100_000, 3), (8 << 20, 7), (5 << 20, 16)] {
            let p = piece_size(n, k);
            // No socket is asked for more than its share of pieces when all go equally fast.
            assert!(p * k * PIECES_PER_SOCKET >= n, "{n} bytes over {k} sockets");
            assert!(p >= MIN_PIECE && p % 4096 == 0);
        }
    }
}
