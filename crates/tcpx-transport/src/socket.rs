//! Backend `socket`: native kernel TCP, `socks` sockets per comm, moved along by worker threads
//! that each own one or more of the sockets (one thread per socket, shared down to half the CPUs
//! on machines of 16 CPUs or more, [`thread_count`]; NCCL's `NSOCKS_PERTHREAD` likewise shares
//! threads between sockets). A thread drives its sockets without blocking and waits in `poll`
//! when none can move.
//!
//! Wire format, per socket: pieces, each a 32-byte header (the request's sequence number on the
//! comm, its total bytes, the piece's offset and its length with [`LAST_PIECE`] set; little
//! endian u64s) followed by the piece's bytes. Requests are numbered 0, 1, 2, ... in posting
//! order on both sides (sends and receives match in that order). A request of `n` bytes is cut
//! into pieces of about [`PIECE`] bytes, which go into the comm's pool; a socket with nothing to
//! write takes the oldest untaken piece (and gives it back if it cannot begin it). A socket the
//! kernel serves faster carries more, one that stalls holds at most the piece it has begun, and
//! no socket waits for another: the receiver finds each piece's request by its number and
//! finishes a request when its last byte has landed. (A piece of a request the receiver has not
//! posted yet stays in the kernel's buffer until it is.) The handle still carries a layout word
//! from when a striped layout (a fixed socket per piece) could be chosen: it is always 0, this
//! dynamic layout, and a handle asking for another is refused. The striped layout lost to this
//! one on the 16-core host (docs/perf-data/PERFORMANCE-history-2026-11.md, "Issue 26").
//!
//! Each piece goes out in system calls of at most [`MAX_CALL`] bytes, the header and the start of
//! the payload in one `writev`.
//!
//! Receives into a host buffer larger than the caches ([`receives_around_cache`]; the cache's
//! size from `tcpx_topo::sysfs::last_level_cache_bytes`) read into a
//! small buffer of the socket's own ([`RECEIVE_BOUNCE`], which stays in the core's cache) and
//! copy each read on with streaming stores: the kernel's copy into a destination that is not in
//! the cache reads every line in before writing it, a streaming store does not
//! (docs/PERFORMANCE.md, "Host memory over loopback"). A staging ring, whose bytes the copy engine
//! reads at once, keeps the direct read, as do buffers the cache can hold.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tcpx_model::{remaining, Backoff};

use crate::{
    consumed_before_done, io_err, Activity, Handle, Limits, Listener, Memory, MemoryKind, MrId,
    RecvComm, RequestId, Result, SendComm, Span, Transport, TransportError,
};

const MAGIC: &[u8; 8] = b"TCPXSOCK";
/// 3: 32-byte piece headers naming the request, and the handle carries the receiving side's
/// layout ([`LAYOUT_DYNAMIC`], the only one left).
const WIRE_VERSION: u16 = 3;
/// The handle's layout word: 0, pieces taken by whichever socket is free. (1 to [`MAX_SOCKS`]
/// were striped layouts, sockets per request, chosen by an environment variable that is gone;
/// a handle naming one comes from an older build set up that way and is refused.)
const LAYOUT_DYNAMIC: u16 = 0;
const HEADER: usize = 32;
/// Bit of a header's length word that marks the socket's last piece of a request.
pub const LAST_PIECE: u64 = 1 << 63;
/// Smallest piece a request is cut into.
pub const MIN_PIECE: usize = 64 * 1024;
/// Size of the pieces a large request is cut into: small enough that an 8 MiB request gives
/// several sockets something to take, large enough that a piece is one long system call.
pub const PIECE: usize = 2 << 20;
/// Most bytes one `write` or `read` system call moves: a whole piece.
pub const MAX_CALL: usize = PIECE;
/// Most sockets per comm (NCCL allows 64 in total per comm; 16 x 1 is plenty for one NIC).
pub const MAX_SOCKS: usize = 64;
/// How long an accepted data socket may take to send its whole greeting, from its connect and
/// however its bytes trickle in, before it is dropped as a stray (a port scan, a silent
/// connection). Connections are read side by side, so a stray's wait costs a real peer nothing.
pub const STRAY_HELLO_WAIT: Duration = Duration::from_secs(5);
/// Requests in flight per comm, as NCCL's net API allows.
pub const MAX_REQUESTS: usize = 32;
/// Bytes of a socket's receive buffer for reads that are copied on with streaming stores: room
/// for what one read returns over loopback (70-90 KiB on the 16-core host), small enough that a
/// thread's few stay in its core's cache (128 KiB beat 256 KiB and 1 MiB there).
pub const RECEIVE_BOUNCE: usize = 128 << 10;
/// Smallest host buffer whose receives go around the cache, whatever the cache: below this a
/// streaming copy's extra pass costs more than the cache misses it saves (32 MiB: -10 % at 4
/// sockets, -15 % at 16 on the H200 host).
pub const AROUND_CACHE_MIN: usize = 32 << 20;
/// The threshold where the last-level cache's size cannot be read: the smallest size measured to
/// gain (128 MiB: +7 to +12 % at 1 to 8 sockets on the H200 host).
pub const AROUND_CACHE_UNKNOWN_CACHE: usize = 128 << 20;

/// Fewest sockets of a comm whose receives go around the cache. With one socket, one thread
/// copies every byte and its CPU is the limit, so a second pass costs (-9 and -14 % in two of
/// three H200 runs at 256 MiB); with several, the memory traffic of reading each destination line
/// in is, and the streaming copy saves it (+3 to +16 % at 4 sockets and more).
pub const AROUND_CACHE_MIN_SOCKETS: usize = 4;

/// Whether receives into `buf` on a comm of `socks` sockets read into [`RECEIVE_BOUNCE`] and copy
/// on with streaming stores: a CPU that has them ([`tcpx_gpu::STREAMING_STORES`]; a plain copy on
/// gains nothing, as plain C showed), at least [`AROUND_CACHE_MIN_SOCKETS`] sockets, and a buffer of at
/// least [`around_cache_threshold_here`] bytes whose bytes are not read again at once (a GPU
/// staging ring is, and its chunks are best left in the cache for the copy engine).
pub fn receives_around_cache(buf: &tcpx_gpu::HostBuffer, socks: usize) -> bool {
    tcpx_gpu::STREAMING_STORES
        && socks >= AROUND_CACHE_MIN_SOCKETS
        && buf.len() >= around_cache_threshold_here()
        && !buf.is_read_at_once()
}

/// [`around_cache_threshold`] for this machine's last-level cache (read from `/sys` once).
pub fn around_cache_threshold_here() -> usize {
    static THRESHOLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        around_cache_threshold(tcpx_topo::sysfs::last_level_cache_bytes(
            &tcpx_topo::SysRoot::live(),
        ))
    })
}

/// The buffer size from which receives go around the cache, given the last-level cache's size:
/// a quarter of the cache, at least [`AROUND_CACHE_MIN`]; [`AROUND_CACHE_UNKNOWN_CACHE`] when the
/// size is unknown. A quarter, not the whole: the cache is shared with the sender's buffer (over
/// loopback), the sockets' buffers and whatever else runs on the socket, and on the H200 host
/// (300 MiB of L3, shared with other guests) receiving around it lost at 64 MiB and won from 128
/// MiB (docs/PERFORMANCE.md, "Host memory over loopback").
pub fn around_cache_threshold(last_level_cache: Option<usize>) -> usize {
    match last_level_cache {
        Some(llc) => (llc / 4).max(AROUND_CACHE_MIN),
        None => AROUND_CACHE_UNKNOWN_CACHE,
    }
}

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
    /// How the comm's sockets share worker threads ([`Pieces::threads`]; the default lets
    /// [`thread_count`] choose).
    pub pieces: Pieces,
    /// Send pieces of at least this many bytes with `MSG_ZEROCOPY`: the kernel sends from the
    /// request's pages instead of copying them, and a request is done only when the kernel has
    /// said (on the socket's error queue) that it no longer needs them. `None`: copy every send.
    pub zero_copy_min: Option<usize>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            socks: 1,
            sock_buf: None,
            pieces: Pieces::default(),
            zero_copy_min: None,
        }
    }
}

/// What the zero-copy sends of a transport did, over all its comms.
#[derive(Debug, Default)]
pub struct ZeroCopyStats {
    /// Send calls made with `MSG_ZEROCOPY` (each one the kernel numbers and completes).
    pub calls: AtomicU64,
    /// Of those, the ones whose completion arrived.
    pub completed: AtomicU64,
    /// Of those, the ones the kernel copied after all (always over loopback).
    pub copied: AtomicU64,
}

/// How a comm's sockets are shared among its worker threads. Requests are always cut into pieces
/// of about [`PIECE`] bytes moved in calls of at most [`MAX_CALL`] bytes; no environment variable
/// changes that any more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pieces {
    /// Worker threads per comm; 0 (the default) = [`thread_count`]'s choice (one per socket,
    /// shared down to half the CPUs on machines of 16 CPUs or more). Set only by code (tests
    /// share threads this way on machines too small to do it by default); no variable reads it.
    pub threads: usize,
    /// Where the worker threads run (the `worker_cpus` knob; [`crate::worker_cpus`]).
    pub worker_cpus: tcpx_model::WorkerCpus,
}

impl Pieces {
    /// Refuses more threads than sockets a comm may have.
    pub fn check(&self) -> Result<()> {
        if self.threads > MAX_SOCKS {
            return Err(TransportError::Usage(format!(
                "{} socket worker threads per comm: threads take 0 (automatic) to {MAX_SOCKS}",
                self.threads
            )));
        }
        Ok(())
    }
}

/// Size of the pieces an `n`-byte request is cut into: even pieces of at most [`PIECE`] bytes
/// (as few as that allows), rounded up to whole pages and at least [`MIN_PIECE`].
fn piece_size(n: usize) -> usize {
    n.div_ceil(n.div_ceil(PIECE))
        .max(MIN_PIECE)
        .next_multiple_of(4096)
}

/// Native TCP transport.
pub struct SocketTransport {
    cfg: SocketConfig,
    pieces: Pieces,
    zero_copy: Arc<ZeroCopyStats>,
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
        cfg.pieces.check()?;
        Ok(SocketTransport {
            pieces: cfg.pieces,
            cfg,
            zero_copy: Arc::new(ZeroCopyStats::default()),
            activity: Arc::new(Activity::default()),
            next_comm: AtomicU64::new(1),
        })
    }

    /// Cuts requests with `pieces` instead of the config's.
    pub fn with_pieces(mut self, pieces: Pieces) -> Result<Self> {
        pieces.check()?;
        self.pieces = pieces;
        Ok(self)
    }

    pub fn pieces(&self) -> Pieces {
        self.pieces
    }

    pub fn config(&self) -> &SocketConfig {
        &self.cfg
    }

    /// What this transport's zero-copy sends did so far.
    pub fn zero_copy_stats(&self) -> &ZeroCopyStats {
        &self.zero_copy
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
            pieces: self.pieces,
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
            let hello = encode_hello(h.nonce, index, self.cfg.socks);
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
            self.pieces,
            Arc::clone(&self.activity),
            ZeroCopy::new(self.cfg.zero_copy_min, Arc::clone(&self.zero_copy)),
        )?))
    }
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
    // The layout word, always the dynamic layout's (see [`LAYOUT_DYNAMIC`]).
    b.extend_from_slice(&LAYOUT_DYNAMIC.to_le_bytes());
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
    if b.len() != 41 || &b[..8] != MAGIC {
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
    let layout = u16::from_le_bytes([b[39], b[40]]);
    if layout != LAYOUT_DYNAMIC {
        return Err(TransportError::Protocol(format!(
            "the peer's handle asks for the striped layout ({layout} sockets per request), which this build no longer has: run the same build on both sides, without TCPX_SOCKET_STRIPE"
        )));
    }
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
        crate::backend::Backend::Socket.name()
    }

    fn limits(&self) -> Limits {
        crate::backend::limits(crate::backend::Backend::Socket)
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

/// Accepts one connection on `listener`, waiting until `deadline`; `Ok(None)` when nobody came
/// in time. The accepted stream is blocking. std has no accept with a timeout, so this polls a
/// non-blocking listener with a short growing pause (capped at 10 ms) that bounds the wait's cost.
pub fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    listener.set_nonblocking(true)?;
    let mut backoff = Backoff::doubling(Duration::from_micros(200), Duration::from_millis(10));
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                stream.set_nonblocking(false)?;
                return Ok(Some((stream, from)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !backoff.wait(deadline) {
                    return Ok(None);
                }
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
    let mut backoff = Backoff::doubling(Duration::from_millis(5), Duration::from_millis(200));
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
                backoff.wait(deadline);
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
    pieces: Pieces,
    activity: Arc<Activity>,
    comm_id: u64,
}

impl Listener for SocketListener {
    fn handle(&self) -> Handle {
        encode_handle(&self.data)
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let (streams, peer) = accept_greeted(
            &self.listener,
            self.data.nonce,
            self.cfg.socks,
            deadline,
            STRAY_HELLO_WAIT,
        )?;
        for stream in &streams {
            tune(SockRef::from(stream), &self.cfg)
                .map_err(io_err("setting socket options", "net.core.rmem_max"))?;
        }
        Ok(Box::new(SocketRecvComm::start(
            streams,
            peer.to_string(),
            self.comm_id,
            self.pieces,
            Arc::clone(&self.activity),
        )?))
    }
}

/// Accepts the `socks` data sockets of one comm on `listener` until `deadline`, in socket
/// order, with the peer's address. Every connection is read side by side with the others
/// ([`crate::greeting`]): one that has not sent its whole greeting within `hello_wait` of its
/// connect (however its bytes trickle in), that closes, that greets another listener or names
/// a socket already taken is dropped with a warning saying why, and delays the real peer's
/// sockets by nothing (issue 43 item 7: each silent one cost them 5 s in turn).
fn accept_greeted(
    listener: &TcpListener,
    nonce: u64,
    socks: usize,
    deadline: Instant,
    hello_wait: Duration,
) -> Result<(Vec<TcpStream>, SocketAddr)> {
    use crate::greeting::{take_waiting, wait_any, Greeting, Step, MAX_GREETING};
    let local = listener
        .local_addr()
        .map_or_else(|_| "a data listener".to_string(), |a| a.to_string());
    let io = |e: io::Error| TransportError::Io {
        what: format!("accepting on {local}"),
        hint: "the process may be out of file descriptors (ulimit -n)".into(),
        source: e,
    };
    let drop_stray = |g: &Greeting, why: &str| {
        tracing::warn!("dropping a stray connection from {}: {why}", g.from);
    };
    let started = Instant::now();
    let mut slots: Vec<Option<TcpStream>> = (0..socks).map(|_| None).collect();
    let mut got = 0;
    let mut peer = None;
    let mut pending: Vec<Greeting> = Vec::new();
    while got < socks {
        take_waiting(
            listener,
            &mut pending,
            HELLO_LEN,
            hello_wait,
            deadline,
            MAX_GREETING + socks,
            &mut |g, why| drop_stray(g, why),
        )
        .map_err(io)?;
        let mut i = 0;
        while i < pending.len() {
            match pending[i].read() {
                Step::Waiting => i += 1,
                Step::Drop(why) => drop_stray(&pending.remove(i), &why),
                Step::Whole => {
                    let g = pending.remove(i);
                    match check_hello(&g.bytes, nonce, socks) {
                        Ok(index) if slots[index].is_none() => {
                            peer = Some(g.from);
                            slots[index] = Some(g.into_stream().map_err(io)?);
                            got += 1;
                        }
                        Ok(index) => {
                            drop_stray(&g, &format!("a second connection for data socket {index}"))
                        }
                        Err(why) => drop_stray(&g, why),
                    }
                }
            }
        }
        if got == socks {
            break;
        }
        if Instant::now() >= deadline {
            return Err(TransportError::Timeout {
                what: format!(
                    "accepting {socks} data sockets on {local} ({got} arrived, {} connections still greeting)",
                    pending.len()
                ),
                secs: started.elapsed().as_secs_f64(),
                hint: "did the peer get the handle and connect? same --socks-per-channel on both?"
                    .into(),
            });
        }
        wait_any(listener, &pending, deadline).map_err(io)?;
    }
    for g in &pending {
        tracing::debug!(
            "closing a connection from {} that had not greeted when the peer's sockets were in",
            g.from
        );
    }
    let streams = slots
        .into_iter()
        .map(|s| s.expect("all slots filled"))
        .collect();
    Ok((streams, peer.expect("a socket arrived")))
}

/// The greeting a data socket opens with: [`MAGIC`], the listener's nonce, the socket's index
/// and the comm's socket count (what [`read_hello`] checks).
fn encode_hello(nonce: u64, index: usize, socks: usize) -> [u8; HELLO_LEN] {
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(MAGIC);
    hello[8..16].copy_from_slice(&nonce.to_le_bytes());
    hello[16..18].copy_from_slice(&(index as u16).to_le_bytes());
    hello[18..].copy_from_slice(&(socks as u16).to_le_bytes());
    hello
}

/// Bytes of a data socket's greeting ([`encode_hello`]).
const HELLO_LEN: usize = 20;

/// The socket index a greeting names, or why it is not one for this listener.
fn check_hello(hello: &[u8], nonce: u64, socks: usize) -> std::result::Result<usize, &'static str> {
    if hello.len() != HELLO_LEN || &hello[..8] != MAGIC {
        return Err("its greeting is not a data socket's");
    }
    let their_nonce = u64::from_le_bytes(hello[8..16].try_into().expect("8 bytes"));
    let index = u16::from_le_bytes([hello[16], hello[17]]) as usize;
    let count = u16::from_le_bytes([hello[18], hello[19]]) as usize;
    if their_nonce != nonce || index >= socks || count != socks {
        return Err("its greeting does not match this listener");
    }
    Ok(index)
}

/// How a request stands; shared by the comm and the socket workers.
#[derive(Debug)]
struct ReqState {
    /// The request's place among the comm's requests (0, 1, 2, ... in posting order, the same on
    /// both sides since sends and receives match in that order); every piece's header carries it.
    seq: u64,
    /// What is left before the request is done: sends, pieces not yet written (and, with
    /// zero-copy, not yet released by the kernel); receives, 1 until the last byte has landed.
    remaining: AtomicUsize,
    /// Bytes moved.
    bytes: AtomicU64,
    /// For receives: the message size the sender announced (all sockets must agree).
    total: AtomicU64,
    /// For receives: parts of the posted span not yet filled by a piece.
    free: Mutex<Vec<Span>>,
    /// Offset of the posted span in its buffer.
    base: usize,
    /// Size of the posted span.
    capacity: usize,
    /// For receives: the bytes land through a socket's [`RECEIVE_BOUNCE`] buffer
    /// ([`receives_around_cache`]).
    around_cache: bool,
}

impl ReqState {
    /// A send of `len` bytes at `base`: done when its `remaining` pieces are written.
    fn send(seq: u64, remaining: usize, base: usize, len: usize) -> Self {
        Self::new(seq, remaining, len as u64, Vec::new(), base, len)
    }

    /// A receive into `span` (`len` bytes at `base`) on a comm of `socks` sockets: done when its
    /// last byte has landed; the message size is what the first header announces.
    fn recv(seq: u64, socks: usize, span: Span, base: usize, len: usize) -> Self {
        let around_cache = receives_around_cache(span.buffer(), socks);
        let remaining = 1;
        ReqState {
            around_cache,
            ..Self::new(seq, remaining, u64::MAX, vec![span], base, len)
        }
    }

    fn new(
        seq: u64,
        remaining: usize,
        total: u64,
        free: Vec<Span>,
        base: usize,
        len: usize,
    ) -> Self {
        ReqState {
            seq,
            remaining: AtomicUsize::new(remaining),
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(total),
            free: Mutex::new(free),
            base,
            capacity: len,
            around_cache: false,
        }
    }
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

/// One socket's work in one direction, moved along without blocking by the thread that owns the
/// socket: the requests queued on it, in FIFO order, and how far the current piece has got.
trait Lane: Default + Send + 'static {
    /// `POLLOUT` for sends, `POLLIN` for receives.
    const EVENTS: PollFlags;
    const DIR: &'static str;
    fn push(&mut self, req: Arc<ReqState>);
    /// Whether a request is queued.
    fn busy(&self) -> bool;
    /// Moves bytes, in calls of at most [`MAX_CALL`] bytes, until the socket would block or a
    /// piece is done. Returns (bytes moved, requests this socket was the last to finish).
    fn pump(&mut self, stream: &mut TcpStream) -> io::Result<(bool, usize)>;
    /// What to wait for in `poll` while busy ([`Lane::EVENTS`] unless only the error queue
    /// matters, which `poll` reports without being asked).
    fn events(&self) -> PollFlags {
        Self::EVENTS
    }
    /// Takes the comm's settings (zero-copy, the pool of untaken pieces) and this socket's
    /// counters.
    fn setup(&mut self, comm: &LaneSetup, counter: Arc<SocketCounter>);
}

/// One socket's counters ([`crate::SocketStat`]), added to by its worker when a piece is done,
/// before the piece can finish its request (so a finished request's bytes are always counted).
#[derive(Debug, Default)]
struct SocketCounter {
    bytes: AtomicU64,
    busy_ns: AtomicU64,
    pieces: AtomicU64,
    /// Data system calls on the socket (read, write, writev, send), those that would block
    /// included.
    calls: AtomicU64,
    /// Of those, the ones that would have blocked (`EAGAIN`).
    blocked: AtomicU64,
    /// `poll` waits of the worker thread, counted on its first socket.
    waits: AtomicU64,
    /// Of `bytes`, those received around the cache ([`receives_around_cache`]).
    around_cache: AtomicU64,
}

impl SocketCounter {
    /// Counts a finished piece of `bytes` payload bytes that the socket held since `since`.
    fn piece(&self, bytes: u64, since: Option<Instant>) {
        if let Some(t) = since {
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        }
        self.pieces.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Release);
    }

    /// Counts one data system call; `blocked`: it would have blocked.
    fn call(&self, blocked: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if blocked {
            self.blocked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn stat(&self) -> crate::SocketStat {
        crate::SocketStat {
            bytes: self.bytes.load(Ordering::Acquire),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            pieces: self.pieces.load(Ordering::Relaxed),
            calls: self.calls.load(Ordering::Relaxed),
            blocked_calls: self.blocked.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            around_cache_bytes: self.around_cache.load(Ordering::Relaxed),
            cpu: None,
        }
    }
}

/// What every lane of a comm shares.
#[derive(Clone, Default)]
struct LaneSetup {
    zero_copy: ZeroCopy,
    /// Sends: the pieces no socket has taken yet.
    pool: Arc<Pool>,
}

/// The untaken pieces of a send comm, oldest first: a socket with nothing to
/// write takes the next one, so a socket the kernel serves faster carries more and one that
/// stalls holds at most the piece it has begun.
#[derive(Default)]
struct Pool {
    pieces: Mutex<VecDeque<(Arc<ReqState>, Span)>>,
    /// Pieces in `pieces`, readable without the lock.
    queued: AtomicUsize,
}

impl Pool {
    /// Queues a request's pieces (listed lowest offset last, as [`cut_pieces`] gives them).
    fn put(&self, req: &Arc<ReqState>, mut pieces: Vec<Span>) {
        let mut q = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(piece) = pieces.pop() {
            q.push_back((Arc::clone(req), piece));
        }
        self.queued.store(q.len(), Ordering::Release);
    }

    fn take(&self) -> Option<(Arc<ReqState>, Span)> {
        let mut q = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        let next = q.pop_front();
        self.queued.store(q.len(), Ordering::Release);
        next
    }

    /// Puts back a piece a socket took but could not begin (its buffer was full), for another.
    fn give_back(&self, req: Arc<ReqState>, piece: Span) {
        let mut q = self.pieces.lock().unwrap_or_else(|p| p.into_inner());
        q.push_front((req, piece));
        self.queued.store(q.len(), Ordering::Release);
    }

    fn is_empty(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }
}

/// A job for a worker thread: request `req` is posted, for socket `sock` (of the comm) to look
/// at (receives learn what comes from the headers; sends find their pieces in the comm's pool).
struct Job {
    sock: usize,
    req: Arc<ReqState>,
}

/// Fewest threads a comm's sockets are shared among: 4 threads moved 16 sockets at 13 GB/s on
/// the 16-core host, where 8 and 16 threads moved 21-23 (a thread copies about as fast as one
/// stream goes).
const MIN_SHARED_THREADS: usize = 8;

/// Threads per direction of a comm, unless `asked` (non-zero) says otherwise: at most one per socket,
/// and on a machine with at least 2 x [`MIN_SHARED_THREADS`] CPUs at most half the CPUs, so that
/// a machine running both sides of a transfer (as over loopback) has no more busy socket threads
/// than CPUs (measured on the 16-core host: 16 sockets on 8 threads +9% at 8 requests in flight,
/// even at 32; with receives around the cache, 8 threads 29.0 GB/s, 12 24.1, 16 24.8). Smaller
/// machines keep a thread per socket: on the 2-core VM, shared with other work, one thread per
/// side fell to 0.77-0.88x of free-running TCP at 2 to 8 sockets where a thread per socket held
/// 1.0x or more.
fn thread_count(socks: usize, asked: usize) -> usize {
    let socks = socks.max(1);
    if asked > 0 {
        return asked.min(socks);
    }
    let half = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
    if half >= MIN_SHARED_THREADS {
        socks.min(half)
    } else {
        socks
    }
}

/// Sockets and their worker threads, common to both directions. Socket `i` belongs to thread
/// `i % threads`; a thread moves each of its sockets along without blocking and waits in `poll`
/// when none can move, so several sockets share a thread (as NCCL's `NSOCKS_PERTHREAD`).
struct Workers<L: Lane> {
    queues: Vec<Sender<Job>>,
    /// Per thread: the write end of its wake-up socket pair (a byte there interrupts its poll).
    wakers: Vec<UnixStream>,
    streams: Vec<TcpStream>,
    threads: Vec<JoinHandle<()>>,
    failure: Arc<Failure>,
    peer: String,
    comm_id: u64,
    mrs: Vec<Option<Memory>>,
    reqs: VecDeque<(RequestId, Arc<ReqState>)>,
    next_req: u64,
    /// Requests posted so far: the next request's [`ReqState::seq`].
    posted: u64,
    /// The comm's layout and what its lanes share.
    setup: LaneSetup,
    /// Per socket: what it moved ([`SocketCounter`]).
    counters: Vec<Arc<SocketCounter>>,
    /// Per worker thread: the CPU it was given (`worker_cpus = own`), if any.
    cpus: Vec<Option<u32>>,
    _lane: std::marker::PhantomData<L>,
}

impl<L: Lane> Workers<L> {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        activity: Arc<Activity>,
        pieces: Pieces,
        zero_copy: ZeroCopy,
    ) -> Result<Self> {
        let dir = L::DIR;
        let setup = LaneSetup {
            zero_copy,
            pool: Arc::default(),
        };
        let failure = Arc::new(Failure::default());
        let nthreads = thread_count(streams.len(), pieces.threads);
        let streams_len = streams.len();
        let mut own: Vec<Vec<(usize, TcpStream)>> = (0..nthreads).map(|_| Vec::new()).collect();
        let mut kept = Vec::new();
        for (i, stream) in streams.into_iter().enumerate() {
            let mine = stream
                .try_clone()
                .map_err(io_err("cloning a socket", "ulimit -n"))?;
            mine.set_nonblocking(true).map_err(io_err(
                "making a socket non-blocking",
                "nothing to fix; report this",
            ))?;
            if setup.zero_copy.min > 0 {
                tcpx_ffi::sockopt::enable_zero_copy(&mine).map_err(io_err(
                    "turning on SO_ZEROCOPY",
                    "zero-copy sends need Linux 4.14 or later: leave --zero-copy-min out",
                ))?;
            }
            own[i % nthreads].push((i, mine));
            kept.push(stream);
        }
        let mut w = Workers {
            queues: Vec::new(),
            wakers: Vec::new(),
            streams: kept,
            threads: Vec::new(),
            failure: Arc::clone(&failure),
            peer: peer.clone(),
            comm_id,
            mrs: Vec::new(),
            reqs: VecDeque::new(),
            next_req: 0,
            posted: 0,
            setup: setup.clone(),
            counters: (0..streams_len).map(|_| Arc::default()).collect(),
            cpus: Vec::new(),
            _lane: std::marker::PhantomData,
        };
        // Claimed by this (the comm's starting) thread, so that they come from its side's CPUs.
        let claims = crate::worker_cpus::claims(pieces.worker_cpus, nthreads);
        w.cpus = claims.iter().map(|c| c.as_ref().map(|c| c.cpu())).collect();
        // On an error below, dropping `w` ends the threads already started.
        for ((t, socks), claim) in own.into_iter().enumerate().zip(claims) {
            let (tx, rx): (Sender<Job>, Receiver<Job>) = mpsc::channel();
            let (wake_tx, wake_rx) =
                UnixStream::pair().map_err(io_err("making a wake-up socket pair", "ulimit -n"))?;
            wake_tx
                .set_nonblocking(true)
                .and_then(|()| wake_rx.set_nonblocking(true))
                .map_err(io_err(
                    "making a socket non-blocking",
                    "nothing to fix; report this",
                ))?;
            let failure = Arc::clone(&failure);
            let activity = Arc::clone(&activity);
            let peer_name = peer.clone();
            let setup = setup.clone();
            let counters: Vec<Arc<SocketCounter>> = socks
                .iter()
                .map(|(i, _)| Arc::clone(&w.counters[*i]))
                .collect();
            let th = std::thread::Builder::new()
                .name(format!("tcpx-{dir}-c{comm_id}-t{t}"))
                .spawn(move || {
                    if let Some(Err(e)) = claim.as_ref().map(|c| c.pin_here()) {
                        tracing::warn!(
                            "socket worker {t} of comm {comm_id} stays unpinned: pinning it to cpu {} failed: {e}",
                            claim.as_ref().map_or(0, |c| c.cpu())
                        );
                    }
                    // The queue stays open until the failure is recorded, so a post that finds
                    // it closed always finds the reason.
                    let lanes = lane_loop::<L>(socks, counters, &rx, wake_rx, &setup, &activity);
                    if let Err((i, e)) = lanes {
                        let what = match e.kind() {
                            io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::BrokenPipe => {
                                format!("peer {peer_name} closed the connection")
                            }
                            _ => format!("error talking to {peer_name}"),
                        };
                        failure.set(format!("{what} (comm {comm_id}, socket {i}, {dir}): {e}"));
                        activity.bump();
                    }
                })
                .map_err(io_err(
                    "starting a socket worker thread",
                    "the process may be at its thread limit",
                ))?;
            w.queues.push(tx);
            w.wakers.push(wake_tx);
            w.threads.push(th);
        }
        Ok(w)
    }

    /// The next request's [`ReqState::seq`].
    fn next_seq(&mut self) -> u64 {
        self.posted += 1;
        self.posted - 1
    }

    /// One job per worker thread (on its first socket): wakes every thread to look at the pool.
    fn every_thread(&self) -> Vec<usize> {
        (0..self.queues.len()).collect()
    }

    /// Queues `req` on the sockets `jobs` names, and wakes the threads of those sockets.
    fn post(&mut self, req: &Arc<ReqState>, jobs: Vec<usize>) -> Result<()> {
        let threads = self.queues.len();
        let mut woken = vec![false; threads];
        for sock in jobs {
            let t = sock % threads;
            woken[t] = true;
            let job = Job {
                sock,
                req: Arc::clone(req),
            };
            if self.queues[t].send(job).is_err() {
                // The worker ended after an error; the failure says which.
                let f = self
                    .failure
                    .get()
                    .unwrap_or_else(|| "socket worker stopped".into());
                return Err(TransportError::Failed(f));
            }
        }
        for (w, _) in self.wakers.iter().zip(woken).filter(|(_, woke)| *woke) {
            // A full wake-up socket already has a byte waiting: nothing lost.
            let _ = (&*w).write(&[1]);
        }
        Ok(())
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

    /// A new request of `len` bytes at `offset` of `mr`: its span and sequence number, or `None`
    /// while the comm has [`MAX_REQUESTS`] outstanding (the caller posts again later).
    fn open(&mut self, mr: MrId, offset: usize, len: usize) -> Result<Option<(Span, u64)>> {
        if let Some(f) = self.failure.get() {
            return Err(TransportError::Failed(f));
        }
        if len == 0 || len > i32::MAX as usize {
            return Err(TransportError::Usage(format!(
                "request of {len} bytes: the socket backend takes 1 to {} bytes per request",
                i32::MAX
            )));
        }
        if self.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let span = self.span(mr, offset, len)?;
        Ok(Some((span, self.next_seq())))
    }

    /// Queues `state` on the sockets `jobs` names and keeps it among the outstanding requests.
    fn submit(&mut self, state: Arc<ReqState>, jobs: Vec<usize>) -> Result<Option<RequestId>> {
        self.post(&state, jobs)?;
        let id = RequestId(self.next_req);
        self.next_req += 1;
        self.reqs.push_back((id, state));
        Ok(Some(id))
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

    fn socket_stats(&self) -> Vec<crate::SocketStat> {
        let threads = self.cpus.len().max(1);
        self.counters
            .iter()
            .enumerate()
            .map(|(i, c)| crate::SocketStat {
                // Socket `i` belongs to thread `i % threads` (`Workers::start`).
                cpu: self.cpus.get(i % threads).copied().flatten(),
                ..c.stat()
            })
            .collect()
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

impl<L: Lane> Drop for Workers<L> {
    fn drop(&mut self) {
        self.queues.clear();
        for w in &self.wakers {
            let _ = (&*w).write(&[1]);
        }
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Longest a worker waits in `poll` before looking at its queue again (a wake-up byte normally
/// ends the wait at once; this bounds the cost of one lost).
const POLL_MS: u16 = 50;

/// A worker thread: moves its sockets' requests along until the comm is dropped (its queue
/// closed) or a socket fails (returned with the socket's index).
fn lane_loop<L: Lane>(
    mut socks: Vec<(usize, TcpStream)>,
    counters: Vec<Arc<SocketCounter>>,
    rx: &Receiver<Job>,
    wake: UnixStream,
    setup: &LaneSetup,
    activity: &Activity,
) -> std::result::Result<(), (usize, io::Error)> {
    let first = counters.first().cloned().unwrap_or_default();
    let mut lanes: Vec<L> = counters
        .into_iter()
        .map(|counter| {
            let mut lane = L::default();
            lane.setup(setup, counter);
            lane
        })
        .collect();
    // Socket index of the comm -> position in `socks`.
    let at = |socks: &[(usize, TcpStream)], i: usize| socks.iter().position(|(j, _)| *j == i);
    loop {
        // New requests, then the wake-up bytes that announced them.
        loop {
            match rx.try_recv() {
                Ok(job) => match at(&socks, job.sock) {
                    Some(k) => lanes[k].push(job.req),
                    None => {
                        return Err((
                            job.sock,
                            io::Error::other("request queued on a socket of another thread"),
                        ))
                    }
                },
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
            }
        }
        let mut buf = [0u8; 64];
        while matches!((&wake).read(&mut buf), Ok(n) if n > 0) {}
        let mut moved = false;
        for (k, lane) in lanes.iter_mut().enumerate() {
            if !lane.busy() {
                continue;
            }
            let (i, stream) = &mut socks[k];
            let (m, finished) = lane.pump(stream).map_err(|e| (*i, e))?;
            moved |= m;
            // Only a finished request lets the driver move on: waking it for every piece cost
            // a wake-up per socket per request for nothing.
            for _ in 0..finished {
                activity.bump();
            }
        }
        if moved {
            continue;
        }
        if !lanes.iter().any(Lane::busy) {
            // Nothing to do until the comm posts: block on the queue.
            match rx.recv() {
                Ok(job) => {
                    let k = at(&socks, job.sock).ok_or_else(|| {
                        (
                            job.sock,
                            io::Error::other("request queued on a socket of another thread"),
                        )
                    })?;
                    lanes[k].push(job.req);
                    continue;
                }
                Err(_) => return Ok(()),
            }
        }
        // Every busy socket would block: wait until one can move or a request comes.
        let mut fds: Vec<PollFd<'_>> = socks
            .iter()
            .zip(&lanes)
            .filter(|(_, l)| l.busy())
            .map(|((_, s), l)| PollFd::new(s.as_fd(), l.events()))
            .collect();
        fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        first.waits.fetch_add(1, Ordering::Relaxed);
        match poll(&mut fds, PollTimeout::from(POLL_MS)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err((socks[0].0, io::Error::from(e))),
        }
    }
}

/// A piece's header: the request's sequence number, its total bytes, the piece's offset and its
/// length with [`LAST_PIECE`] set (every piece counts alone, so every piece carries the mark;
/// the receiver strips it).
fn encode_header(seq: u64, total: u64, off: u64, len: u64) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[..8].copy_from_slice(&seq.to_le_bytes());
    header[8..16].copy_from_slice(&total.to_le_bytes());
    header[16..24].copy_from_slice(&off.to_le_bytes());
    header[24..].copy_from_slice(&(len | LAST_PIECE).to_le_bytes());
    header
}

/// A comm's zero-copy settings, shared by its send lanes.
#[derive(Debug, Clone, Default)]
pub(crate) struct ZeroCopy {
    /// Pieces of at least this many bytes go out with `MSG_ZEROCOPY`; 0: none.
    min: usize,
    stats: Arc<ZeroCopyStats>,
}

impl ZeroCopy {
    fn new(min: Option<usize>, stats: Arc<ZeroCopyStats>) -> Self {
        ZeroCopy {
            min: min.unwrap_or(0),
            stats,
        }
    }
}

/// One socket's zero-copy send calls: the kernel numbers them from 0 and reports ranges of them
/// done on the socket's error queue; until then it may still read the pages they lent.
#[derive(Default)]
struct Lent {
    /// Number the kernel gives the next zero-copy call.
    next: u32,
    /// Every call numbered below this one is done.
    done_below: u32,
    /// Ranges (first, last) done beyond `done_below` (the kernel may report them out of order).
    done_ahead: std::collections::BTreeMap<u32, u32>,
}

impl Lent {
    /// Records the kernel's report that calls `lo..=hi` are done.
    fn done(&mut self, lo: u32, hi: u32) {
        if lo <= self.done_below {
            self.done_below = self.done_below.max(hi.wrapping_add(1));
        } else {
            self.done_ahead.insert(lo, hi);
        }
        while let Some((&lo, &hi)) = self.done_ahead.first_key_value() {
            if lo > self.done_below {
                break;
            }
            self.done_ahead.pop_first();
            self.done_below = self.done_below.max(hi.wrapping_add(1));
        }
    }
}

/// A socket's sends: the next untaken piece of the comm's pool whenever the socket has none (a
/// piece the socket cannot begin, its buffer full, goes back for another socket).
///
/// With zero-copy on, a piece this socket has written is held (`lent`) until the kernel reports
/// every zero-copy call made so far done: only then may the caller reuse the buffer, so only
/// then does the piece count as done here.
#[derive(Default)]
struct SendLane {
    /// The comm's pool of untaken pieces.
    pool: Arc<Pool>,
    cur: Option<OutPiece>,
    zero_copy: ZeroCopy,
    calls: Lent,
    /// Pieces written, waiting for the zero-copy calls numbered below the mark.
    lent: VecDeque<(Arc<ReqState>, u32)>,
    /// What this socket moved ([`Workers::counters`]).
    counter: Arc<SocketCounter>,
}

/// A piece on its way out: its request, header, payload and how much of both has been written.
struct OutPiece {
    req: Arc<ReqState>,
    header: [u8; HEADER],
    body: Span,
    sent: usize,
    /// When the socket took it (its busy time runs from here).
    since: Instant,
}

/// How many error-queue messages one pass reads at most, so a flood cannot hold the worker.
const MAX_NOTICES_PER_PASS: usize = 64;

impl SendLane {
    /// Reads the kernel's zero-copy completions off the socket's error queue and gives back the
    /// requests whose calls are all done; returns how many requests that finished.
    fn reap(&mut self, stream: &TcpStream) -> io::Result<usize> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        for _ in 0..MAX_NOTICES_PER_PASS {
            let mut cmsg = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
            let mut none: [io::IoSliceMut<'_>; 0] = [];
            let flags = MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT;
            let msg = match recvmsg::<SockaddrStorage>(fd, &mut none, Some(&mut cmsg), flags) {
                Ok(m) => m,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from(e)),
            };
            for c in msg.cmsgs().map_err(io::Error::from)? {
                let err = match c {
                    ControlMessageOwned::Ipv4RecvErr(err, _)
                    | ControlMessageOwned::Ipv6RecvErr(err, _) => err,
                    _ => continue,
                };
                if err.ee_origin != tcpx_ffi::sockopt::SO_EE_ORIGIN_ZEROCOPY || err.ee_errno != 0 {
                    continue;
                }
                let (lo, hi) = (err.ee_info, err.ee_data);
                let n = u64::from(hi.wrapping_sub(lo)) + 1;
                self.calls.done(lo, hi);
                let stats = &self.zero_copy.stats;
                stats.completed.fetch_add(n, Ordering::Relaxed);
                if err.ee_code & tcpx_ffi::sockopt::SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                    stats.copied.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
        let mut finished = 0;
        while let Some((_, mark)) = self.lent.front() {
            if self.calls.done_below.wrapping_sub(*mark) as i32 >= 0 {
                let (req, _) = self.lent.pop_front().expect("front exists");
                if req.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    finished += 1;
                }
            } else {
                break;
            }
        }
        Ok(finished)
    }
}

/// Sends `part` with `MSG_ZEROCOPY`; `ENOBUFS` (the socket's option memory is full of lent
/// pages) sends it copied instead. The second value says whether a zero-copy call was made.
fn send_zero_copy(stream: &mut TcpStream, part: &[u8]) -> io::Result<(usize, bool)> {
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;
    let flags = MsgFlags::from_bits_retain(libc::MSG_ZEROCOPY) | MsgFlags::MSG_DONTWAIT;
    match send(stream.as_raw_fd(), part, flags) {
        Ok(n) => Ok((n, n > 0)),
        Err(nix::errno::Errno::ENOBUFS) => stream.write(part).map(|n| (n, false)),
        Err(e) => Err(io::Error::from(e)),
    }
}

impl SendLane {
    /// The next piece for this socket from the pool, if any.
    fn next_piece(&mut self) -> Option<OutPiece> {
        let (req, body) = self.pool.take()?;
        let (off, len) = ((body.offset() - req.base) as u64, body.len() as u64);
        Some(OutPiece {
            header: encode_header(req.seq, req.capacity as u64, off, len),
            req,
            body,
            sent: 0,
            since: Instant::now(),
        })
    }

    /// Whether there is a piece to write (not counting zero-copy completions to wait for).
    fn has_piece(&self) -> bool {
        self.cur.is_some() || !self.pool.is_empty()
    }
}

impl Lane for SendLane {
    const EVENTS: PollFlags = PollFlags::POLLOUT;
    const DIR: &'static str = "send";

    /// A send's pieces are in the pool; the job only woke this thread.
    fn push(&mut self, _req: Arc<ReqState>) {}

    fn busy(&self) -> bool {
        self.has_piece() || !self.lent.is_empty()
    }

    fn events(&self) -> PollFlags {
        if self.has_piece() {
            Self::EVENTS
        } else {
            // Only completions to wait for: they raise POLLERR, which poll always reports.
            PollFlags::empty()
        }
    }

    fn setup(&mut self, comm: &LaneSetup, counter: Arc<SocketCounter>) {
        self.counter = counter;
        self.zero_copy = comm.zero_copy.clone();
        self.pool = Arc::clone(&comm.pool);
    }

    fn pump(&mut self, stream: &mut TcpStream) -> io::Result<(bool, usize)> {
        let mut finished = 0;
        let mut moved = false;
        if !self.lent.is_empty() {
            let f = self.reap(stream)?;
            finished += f;
            moved |= f > 0;
        }
        if self.cur.is_none() {
            self.cur = self.next_piece();
        }
        let Some(p) = self.cur.as_mut() else {
            return Ok((moved, finished));
        };
        let body: &[u8] = &p.body;
        let zero_copy = self.zero_copy.min > 0 && body.len() >= self.zero_copy.min;
        while p.sent < HEADER + body.len() {
            let from = p.sent.saturating_sub(HEADER);
            let part = &body[from..body.len().min(from + MAX_CALL)];
            let n = if p.sent < HEADER && zero_copy {
                // The header alone, copied: the body's pages go out lent.
                stream.write(&p.header[p.sent..])
            } else if p.sent < HEADER {
                stream.write_vectored(&[IoSlice::new(&p.header[p.sent..]), IoSlice::new(part)])
            } else if zero_copy {
                send_zero_copy(stream, part).map(|(n, lent)| {
                    if lent {
                        self.calls.next = self.calls.next.wrapping_add(1);
                        self.zero_copy.stats.calls.fetch_add(1, Ordering::Relaxed);
                    }
                    n
                })
            } else {
                stream.write(part)
            };
            self.counter
                .call(matches!(&n, Err(e) if e.kind() == io::ErrorKind::WouldBlock));
            match n {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "socket accepted no bytes",
                    ))
                }
                Ok(n) => {
                    p.sent += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if p.sent == 0 {
                        // Not begun: another socket may take it now.
                        let p = self.cur.take().expect("a current piece");
                        self.pool.give_back(p.req, p.body);
                    }
                    return Ok((moved, finished));
                }
                Err(e) => return Err(e),
            }
        }
        let p = self.cur.take().expect("a current piece");
        let body_len = p.body.len() as u64;
        self.counter.piece(body_len, Some(p.since));
        p.req.bytes.fetch_add(body_len, Ordering::Relaxed);
        // Give the range back before the request can be reported done.
        drop(p.body);
        if self.calls.done_below != self.calls.next {
            // Pages of this piece (or an earlier one) are still lent to the kernel.
            self.lent.push_back((p.req, self.calls.next));
            finished += self.reap(stream)?;
        } else if p.req.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            finished += 1;
        }
        Ok((true, finished))
    }
}

/// A socket's receives: pieces of any posted request, in whatever order the sender's sockets
/// took them, each header naming its request; a piece of a request this side has not posted yet
/// waits in the kernel's buffer (the socket is not read) until it is posted.
#[derive(Default)]
struct RecvLane {
    /// Posted requests this socket may carry, oldest first (every posted request not yet
    /// complete when last looked at).
    reqs: VecDeque<Arc<ReqState>>,
    header: [u8; HEADER],
    /// Header bytes read so far.
    head: usize,
    /// The piece being filled (after its header was read): its request, the span, bytes filled.
    cur: Option<(Arc<ReqState>, Option<Span>, usize)>,
    /// The header read names a request not posted yet; nothing to do until a post.
    parked: bool,
    /// The sequence number after the last request posted.
    known: u64,
    /// What this socket moved ([`Workers::counters`]).
    counter: Arc<SocketCounter>,
    /// When the current piece's first header byte arrived (its busy time runs from here).
    since: Option<Instant>,
    /// Where reads for a request received around the cache land before they are copied on
    /// ([`RECEIVE_BOUNCE`] bytes once such a request has come, empty before).
    bounce: Vec<u8>,
}

impl RecvLane {
    fn word(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.header[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }

    /// The request the header just read belongs to; `None` when it is not posted yet.
    fn request_of_header(&mut self) -> io::Result<Option<Arc<ReqState>>> {
        let seq = self.word(0);
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        // Requests finished by other sockets are of no more use here.
        self.reqs
            .retain(|r| r.remaining.load(Ordering::Acquire) > 0);
        if let Some(req) = self.reqs.iter().find(|r| r.seq == seq) {
            return Ok(Some(Arc::clone(req)));
        }
        if seq >= self.known {
            return Ok(None);
        }
        Err(invalid(format!(
            "a piece of message {seq} arrived after that message was complete"
        )))
    }

    /// Checks the header just read and takes its piece out of `req`.
    fn open_piece(&self, req: &ReqState) -> io::Result<Option<Span>> {
        let (total, off, len) = (self.word(1), self.word(2), self.word(3) & !LAST_PIECE);
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
        if len == 0 {
            return Ok(None);
        }
        take_piece(req, off as usize, len as usize)
            .map(Some)
            .ok_or_else(|| invalid(format!("piece {off}+{len} was already filled")))
    }
}

impl Lane for RecvLane {
    const EVENTS: PollFlags = PollFlags::POLLIN;
    const DIR: &'static str = "recv";

    /// Receives learn what a socket carries from its headers: the share is the sender's affair.
    fn push(&mut self, req: Arc<ReqState>) {
        self.known = self.known.max(req.seq + 1);
        self.parked = false;
        // A socket that carries nothing of some requests still hears of them all: forget the
        // finished ones, so the list stays as long as the window.
        self.reqs
            .retain(|r| r.remaining.load(Ordering::Acquire) > 0);
        self.reqs.push_back(req);
    }

    fn busy(&self) -> bool {
        if self.parked {
            return false;
        }
        if self.cur.is_some() || self.head > 0 {
            return true;
        }
        self.reqs
            .iter()
            .any(|r| r.remaining.load(Ordering::Acquire) > 0)
    }

    fn setup(&mut self, _comm: &LaneSetup, counter: Arc<SocketCounter>) {
        self.counter = counter;
    }

    fn pump(&mut self, stream: &mut TcpStream) -> io::Result<(bool, usize)> {
        let mut moved = false;
        let eof = || {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended in the middle of a request",
            )
        };
        if self.cur.is_none() {
            while self.head < HEADER {
                let r = stream.read(&mut self.header[self.head..]);
                self.counter
                    .call(matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock));
                match r {
                    Ok(0) => return Err(eof()),
                    Ok(n) => {
                        if self.head == 0 {
                            self.since = Some(Instant::now());
                        }
                        self.head += n;
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((moved, 0)),
                    Err(e) => return Err(e),
                }
            }
            let Some(req) = self.request_of_header()? else {
                self.parked = true;
                return Ok((moved, 0));
            };
            let piece = self.open_piece(&req)?;
            self.cur = Some((req, piece, 0));
        }
        let Some((req, piece, got)) = self.cur.as_mut() else {
            return Ok((moved, 0));
        };
        let around_cache = req.around_cache;
        if around_cache && self.bounce.is_empty() {
            self.bounce = vec![0; RECEIVE_BOUNCE];
        }
        if let Some(piece) = piece {
            while *got < piece.len() {
                let end = piece.len().min(*got + MAX_CALL);
                let r = if !around_cache {
                    stream.read(&mut piece[*got..end])
                } else {
                    let want = (end - *got).min(self.bounce.len());
                    stream.read(&mut self.bounce[..want]).inspect(|&n| {
                        tcpx_gpu::copy_streaming(&mut piece[*got..*got + n], &self.bounce[..n])
                    })
                };
                self.counter
                    .call(matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock));
                match r {
                    Ok(0) => return Err(eof()),
                    Ok(n) => {
                        *got += n;
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((moved, 0)),
                    Err(e) => return Err(e),
                }
            }
        }
        let bytes = *got as u64;
        // Give the range back before the request can be reported done.
        let (req, _, _) = self.cur.take().expect("a current piece");
        self.head = 0;
        if around_cache {
            self.counter
                .around_cache
                .fetch_add(bytes, Ordering::Relaxed);
        }
        self.counter.piece(bytes, self.since.take());
        let before = req.bytes.fetch_add(bytes, Ordering::AcqRel);
        // The piece that brings the count to the message's size ends the request (pieces cannot
        // overlap: each was cut out of the receive's free spans).
        let done = before + bytes == req.total.load(Ordering::Acquire);
        if done {
            req.remaining.store(0, Ordering::Release);
        }
        Ok((true, usize::from(done)))
    }
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
    w: Workers<SendLane>,
}

impl SocketSendComm {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        pieces: Pieces,
        activity: Arc<Activity>,
        zero_copy: ZeroCopy,
    ) -> Result<Self> {
        Ok(SocketSendComm {
            w: Workers::start(streams, peer, comm_id, activity, pieces, zero_copy)?,
        })
    }
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

/// The methods of [`SocketSendComm`]'s and [`SocketRecvComm`]'s impls that are the same for both:
/// the workers keep the registrations, the peer's name and each socket's counts.
macro_rules! worker_comm_methods {
    () => {
        fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
            self.w.reg(mem)
        }

        fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
            self.w.dereg(mr)
        }

        fn peer(&self) -> String {
            self.w.peer.clone()
        }

        fn socket_stats(&self) -> Option<Vec<crate::SocketStat>> {
            Some(self.w.socket_stats())
        }
    };
}

impl SendComm for SocketSendComm {
    worker_comm_methods!();

    fn isend(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        _tag: u32,
    ) -> Result<Option<RequestId>> {
        let Some((span, seq)) = self.w.open(mr, offset, len)? else {
            return Ok(None);
        };
        // The pieces go into the pool, every piece counts, every thread looks.
        let pieces = cut_pieces(span, piece_size(len));
        let state = Arc::new(ReqState::send(seq, pieces.len(), offset, len));
        self.w.setup.pool.put(&state, pieces);
        let jobs = self.w.every_thread();
        self.w.submit(state, jobs)
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
}

struct SocketRecvComm {
    w: Workers<RecvLane>,
    /// Receives that completed and await `consume`.
    completed: HashMap<RequestId, usize>,
}

impl SocketRecvComm {
    fn start(
        streams: Vec<TcpStream>,
        peer: String,
        comm_id: u64,
        pieces: Pieces,
        activity: Arc<Activity>,
    ) -> Result<Self> {
        Ok(SocketRecvComm {
            w: Workers::start(
                streams,
                peer,
                comm_id,
                activity,
                pieces,
                ZeroCopy::default(),
            )?,
            completed: HashMap::new(),
        })
    }
}

impl RecvComm for SocketRecvComm {
    worker_comm_methods!();

    fn irecv(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        _tag: u32,
    ) -> Result<Option<RequestId>> {
        let Some((span, seq)) = self.w.open(mr, offset, len)? else {
            return Ok(None);
        };
        // Any socket may carry a piece, so every socket learns of the request, and it is done
        // when its last byte has landed.
        let jobs: Vec<usize> = (0..self.w.streams.len()).collect();
        let state = ReqState::recv(seq, self.w.streams.len(), span, offset, len);
        self.w.submit(Arc::new(state), jobs)
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
            Some((id, _)) if *id == req => Err(consumed_before_done(req)),
            _ => Err(TransportError::Usage(format!(
                "receive {} consumed out of FIFO order on comm {}",
                req.0, self.w.comm_id
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw peer sockets for the layout tests: `socks` accepted on 127.0.0.1 (receive buffers of
    /// `buf` bytes where given), in the order of their greeting's index, and the send comm of
    /// `t` connected to them through a handle.
    fn raw_receiver(
        t: &SocketTransport,
        socks: usize,
        buf: Option<usize>,
    ) -> (Box<dyn SendComm>, Vec<TcpStream>) {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        if let Some(b) = buf {
            sock.set_recv_buffer_size(b).unwrap();
        }
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        sock.bind(&any.into()).unwrap();
        sock.listen(64).unwrap();
        let listener: TcpListener = sock.into();
        let nonce = 0x5eed;
        let handle = encode_handle(&HandleData {
            socks: socks as u16,
            nonce,
            addr: listener.local_addr().unwrap(),
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        // The connections complete in the listen backlog, so connecting first cannot wait on us.
        let send = t.connect(&handle, deadline).unwrap();
        let (streams, _) =
            accept_greeted(&listener, nonce, socks, deadline, STRAY_HELLO_WAIT).unwrap();
        for s in &streams {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (send, streams)
    }

    /// Tests `req` until it is done or 10 s have passed.
    fn wait_send(t: &SocketTransport, c: &mut dyn SendComm, req: RequestId) -> Option<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = t.activity.get();
            if let Some(n) = c.test(req).unwrap() {
                return Some(n);
            }
            if Instant::now() >= deadline {
                return None;
            }
            t.activity.wait(seen, Duration::from_millis(50));
        }
    }

    fn patterned(len: usize, seed: u64) -> Arc<crate::HostBuffer> {
        let buf = crate::HostBuffer::new(len).unwrap();
        tcpx_gpu::fill_pattern(&mut buf.span(0, len).unwrap(), seed, 0);
        buf
    }

    #[test]
    fn the_threshold_is_a_quarter_of_the_cache_at_least_the_floor_and_a_default_when_unknown() {
        // The H200 host's 300 MiB of L3: 75 MiB, between the 64 that lost and the 128 that won.
        assert_eq!(around_cache_threshold(Some(300 << 20)), 75 << 20);
        assert_eq!(around_cache_threshold(Some(32 << 20)), AROUND_CACHE_MIN);
        assert_eq!(around_cache_threshold(None), AROUND_CACHE_UNKNOWN_CACHE);
        assert_eq!(around_cache_threshold(Some(usize::MAX)), usize::MAX / 4);
    }

    /// The handle keeps its 41 bytes of wire version 3, the layout word last and always 0 (the
    /// dynamic layout), so a peer of an earlier build in its default setting reads it as before;
    /// one naming a striped layout (an earlier build with TCPX_SOCKET_STRIPE set) is refused.
    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let d = HandleData {
            socks: 4,
            nonce: 42,
            addr: "127.0.0.3:5000".parse().unwrap(),
        };
        let h = encode_handle(&d);
        assert!(h.as_bytes().len() <= crate::HANDLE_MAX);
        assert_eq!(h.as_bytes().len(), 41);
        assert_eq!(&h.as_bytes()[8..10], &3u16.to_le_bytes(), "wire version 3");
        assert_eq!(&h.as_bytes()[39..], &[0, 0], "the dynamic layout");
        let back = decode_handle(&h).unwrap();
        assert_eq!((back.socks, back.nonce, back.addr), (4, 42, d.addr));
        for layout in [1u16, 2, MAX_SOCKS as u16 + 1] {
            let mut striped = h.as_bytes().to_vec();
            let n = striped.len();
            striped[n - 2..].copy_from_slice(&layout.to_le_bytes());
            let e = decode_handle(&Handle(striped)).err().unwrap();
            assert!(e.to_string().contains("striped layout"), "{e}");
        }
        let e = decode_handle(&Handle(vec![1, 2, 3])).err().unwrap();
        assert!(e.to_string().contains("not a socket-backend handle"), "{e}");
    }

    #[test]
    fn pieces_are_whole_calls_of_about_piece_bytes() {
        assert_eq!(
            (PIECE, MAX_CALL),
            (2 << 20, 2 << 20),
            "the defaults measured"
        );
        // Small requests: one piece (one socket), at least MIN_PIECE.
        assert_eq!(piece_size(1000), MIN_PIECE);
        assert_eq!(piece_size(PIECE), PIECE);
        // 8 MiB: four 2 MiB pieces, whichever sockets are free take them.
        assert_eq!(piece_size(8 << 20), 2 << 20);
        // Uneven sizes are cut evenly, never above PIECE after rounding to pages.
        assert_eq!(piece_size((8 << 20) + 1) % 4096, 0);
        for n in [1usize, 100_000, 8 << 20, 5 << 20, PIECE + 1] {
            let s = piece_size(n);
            assert!(s >= MIN_PIECE && s % 4096 == 0, "{n}: {s}");
            assert!(s <= PIECE.max(MIN_PIECE), "{n}: {s}");
            // As few pieces as the target allows.
            assert_eq!(n.div_ceil(s), n.div_ceil(PIECE), "{n} bytes");
        }
    }

    #[test]
    fn threads_never_exceed_sockets_and_default_to_half_the_cpus() {
        let half = std::thread::available_parallelism().map_or(1, |n| n.get() / 2);
        let want = if half >= MIN_SHARED_THREADS {
            half.min(64)
        } else {
            64
        };
        assert_eq!(thread_count(64, 0), want);
        assert_eq!(thread_count(1, 0), 1);
        assert_eq!(thread_count(16, 4), 4);
        assert_eq!(thread_count(2, 8), 2, "never more threads than sockets");
        assert_eq!(thread_count(16, 16), 16);
    }

    #[test]
    fn cut_pieces_cover_the_span_exactly_lowest_offset_last() {
        let buf = crate::HostBuffer::new((9 << 20) + 5).unwrap();
        for piece in [4096usize, 1 << 20, 2 << 20, 16 << 20] {
            let span = buf.span(100, (9 << 20) - 95).unwrap();
            let pieces = cut_pieces(span, piece);
            let mut at = 100;
            for s in pieces.iter().rev() {
                assert_eq!(s.offset(), at, "contiguous, in order from the end");
                assert!(s.len() <= piece && !s.is_empty());
                at += s.len();
            }
            assert_eq!(at, 100 + (9 << 20) - 95, "every byte in exactly one piece");
        }
    }

    /// Reads pieces off a raw socket until the sender closes it, checking every byte against
    /// the pattern of `seed` at the request's place (`seq * n` plus the piece's offset); returns
    /// (sequence number, offset, length) of each.
    fn drain_pieces(s: &mut TcpStream, n: usize, seed: u64) -> Vec<(u64, u64, u64)> {
        let mut got = Vec::new();
        loop {
            let mut first = [0u8; 1];
            if s.read(&mut first).unwrap() == 0 {
                return got;
            }
            let mut h = [0u8; HEADER];
            h[0] = first[0];
            s.read_exact(&mut h[1..]).unwrap();
            let w = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().unwrap());
            let (seq, total, off, len) = (w(0), w(1), w(2), w(3) & !LAST_PIECE);
            assert_eq!(total, n as u64);
            let mut body = vec![0u8; len as usize];
            s.read_exact(&mut body).unwrap();
            let at = seq * n as u64 + off;
            assert_eq!(
                tcpx_gpu::verify_pattern(&body, seed, at),
                None,
                "{seq}+{off}"
            );
            got.push((seq, off, len));
        }
    }

    /// The dynamic layout with one socket's reader stalled: the other sockets take every piece
    /// the stalled one has not begun, so every request but the one whose piece it holds
    /// finishes, the pieces of every request cover it exactly once, and the held one finishes
    /// once the socket is read. One thread moves all four sockets.
    #[test]
    fn dynamic_pieces_go_around_a_stalled_socket() {
        let k = 4;
        let t = SocketTransport::new(SocketConfig {
            socks: k,
            sock_buf: Some(64 << 10),
            pieces: Pieces {
                threads: 1,
                ..Pieces::default()
            },
            ..SocketConfig::default()
        })
        .unwrap();
        let (mut send, raw) = raw_receiver(&t, k, Some(64 << 10));
        // Two pieces of PIECE bytes per request.
        let n = 2 * PIECE;
        let reqs_n = 8;
        let src = patterned(reqs_n * n, 5);
        let mr = send.reg_mr(&Memory::Host(Arc::clone(&src))).unwrap();
        let reqs: Vec<RequestId> = (0..reqs_n)
            .map(|r| send.isend(mr, r * n, n, 0).unwrap().unwrap())
            .collect();
        let mut raw = raw.into_iter();
        let mut stalled = raw.next().unwrap();
        let (others, from_stalled, held) = std::thread::scope(|sc| {
            let readers: Vec<_> = raw
                .map(|mut s| sc.spawn(move || drain_pieces(&mut s, n, 5)))
                .collect();
            // Socket 0 has begun one piece (2 MiB, more than its buffers hold) and can finish
            // nothing: every other request finishes while it is not read.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut open: Vec<usize> = (0..reqs_n).collect();
            while open.len() > 1 {
                let seen = t.activity.get();
                let mut still = Vec::new();
                for r in open {
                    match send.test(reqs[r]).unwrap() {
                        Some(b) => assert_eq!(b, n),
                        None => still.push(r),
                    }
                }
                open = still;
                assert!(
                    Instant::now() < deadline,
                    "requests {open:?} held back by one stalled socket"
                );
                t.activity.wait(seen, Duration::from_millis(50));
            }
            let held = open[0];
            assert_eq!(send.test(reqs[held]).unwrap(), None);
            let stalled_reader = sc.spawn(move || drain_pieces(&mut stalled, n, 5));
            assert_eq!(wait_send(&t, &mut *send, reqs[held]), Some(n));
            // Closing the comm ends the readers.
            drop(send);
            let others: Vec<(u64, u64, u64)> = readers
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            (others, stalled_reader.join().unwrap(), held)
        });
        assert_eq!(
            from_stalled.len(),
            1,
            "the stalled socket carried one piece"
        );
        assert_eq!(from_stalled[0].0, held as u64);
        let mut all = others;
        all.extend(from_stalled);
        all.sort();
        for r in 0..reqs_n as u64 {
            let mut at = 0;
            for &(_, off, len) in all.iter().filter(|p| p.0 == r) {
                assert_eq!(off, at, "request {r}: pieces contiguous, none twice");
                at += len;
            }
            assert_eq!(at, n as u64, "request {r} covered");
        }
    }

    /// A dynamic receive socket hears of every request; those finished elsewhere are forgotten
    /// as new ones come, so a socket that carries nothing keeps no more than the window.
    #[test]
    fn a_dynamic_receive_socket_forgets_requests_finished_elsewhere() {
        let mut lane = RecvLane::default();
        lane.setup(&LaneSetup::default(), Arc::default());
        for seq in 0..1000u64 {
            let req = Arc::new(ReqState::new(seq, 1, u64::MAX, Vec::new(), 0, 1));
            lane.push(Arc::clone(&req));
            // Another socket brought its bytes.
            req.remaining.store(0, Ordering::Release);
        }
        assert!(lane.reqs.len() <= 1, "{} kept", lane.reqs.len());
        assert!(!lane.busy(), "nothing left to receive");
        assert_eq!(lane.known, 1000);
    }

    /// The dynamic layout's pool hands out pieces oldest first, across requests, and a piece
    /// given back (its socket could not begin it) is the next one out.
    #[test]
    fn the_pool_gives_pieces_oldest_first_and_takes_back_an_unbegun_one() {
        let buf = crate::HostBuffer::new(5 << 20).unwrap();
        let req = |seq: u64, off: usize, len: usize| Arc::new(ReqState::send(seq, 1, off, len));
        let pool = Pool::default();
        assert!(pool.is_empty());
        let (a, b) = (req(0, 0, 3 << 20), req(1, 3 << 20, 2 << 20));
        pool.put(&a, cut_pieces(buf.span(0, 3 << 20).unwrap(), 2 << 20));
        pool.put(&b, cut_pieces(buf.span(3 << 20, 2 << 20).unwrap(), 2 << 20));
        let mut out = Vec::new();
        let (r, first) = pool.take().unwrap();
        assert_eq!((r.seq, first.offset()), (0, 0));
        pool.give_back(r, first);
        while let Some((r, p)) = pool.take() {
            out.push((r.seq, p.offset(), p.len()));
        }
        assert_eq!(
            out,
            vec![
                (0, 0, 2 << 20),
                (0, 2 << 20, 1 << 20),
                (1, 3 << 20, 2 << 20)
            ]
        );
        assert!(pool.is_empty());
    }

    #[test]
    fn thread_counts_beyond_the_socket_limit_are_refused() {
        for (threads, accepted) in [
            (0, true),
            (1, true),
            (MAX_SOCKS, true),
            (MAX_SOCKS + 1, false),
        ] {
            let pieces = Pieces {
                threads,
                ..Pieces::default()
            };
            assert_eq!(pieces.check().is_ok(), accepted, "{pieces:?}");
        }
    }
}
