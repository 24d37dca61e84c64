//! A small point-to-point API for library users, after the UCCL P2P engine's `Endpoint`:
//! `listen`/`accept`/`connect` give a [`Conn`] with comms in both directions over `channels`
//! channels; `reg` registers memory; `send`/`recv` (and `sendv`/`recvv`) block until done,
//! `send_async`/`recv_async` return a [`XferId`] that `poll` advances.
//!
//! A message is laid over the channels in chunks by `tcpx-sched`, so a send and the receive that
//! matches it must have the same length; transfers on one connection match in FIFO order per
//! direction.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use tcpx_transport::{endpoint::{Endpoint, EndpointConfig}, socket::{SocketConfig, SocketTransport}, HostBuffer, Memory};
//! # fn main() -> tcpx_transport::Result<()> {
//! let t = Arc::new(SocketTransport::new(SocketConfig::default())?);
//! let ep = Endpoint::new(t, EndpointConfig::default())?;
//! let deadline = Instant::now() + Duration::from_secs(10);
//! let mut conn = ep.connect("127.0.0.1:7000".parse().unwrap(), deadline)?;
//! let buf = HostBuffer::new(1 << 20)?;
//! let mr = conn.reg(Memory::Host(buf))?;
//! conn.send(mr, 0, 1 << 20)?;
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_sched::{Assignment, Role, SchedConfig};

use crate::driver::{Comms, Transfer};
use crate::socket::{connect_retry, SocketConfig};
use crate::{io_err, Handle, Memory, MrId, RecvComm, Result, SendComm, Transport, TransportError};

const CONTROL_MAGIC: &[u8; 8] = b"TCPXEPv1";

/// How a connection lays messages over channels. Both ends must agree (checked on connect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    pub channels: usize,
    pub chunk: usize,
    pub window: usize,
    /// Longest time a transfer may go without progress.
    pub stall: Duration,
}

impl Default for EndpointConfig {
    /// Two channels of one socket over host memory, chunk and window by the automatic rule.
    fn default() -> Self {
        EndpointConfig::auto(tcpx_model::Backend::Socket, false, 2, 1)
    }
}

impl EndpointConfig {
    /// `channels` channels of `socks` sockets of `backend`, GPU memory or host, with the chunk
    /// and window of the automatic rule (`tcpx_model::auto_transfer`, the one `tcpx-run bench`
    /// uses; the message size is not known in advance), and a 30 s stall limit.
    pub fn auto(backend: tcpx_model::Backend, gpu: bool, channels: usize, socks: usize) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let choice = tcpx_model::auto_transfer(&tcpx_model::AutoInput {
            backend,
            gpu,
            size: None,
            channels: count(channels),
            socks_per_channel: count(socks),
        });
        EndpointConfig {
            channels,
            chunk: usize::try_from(choice.chunk).unwrap_or(usize::MAX),
            window: choice.window as usize,
            stall: Duration::from_secs(30),
        }
    }
}

/// A local endpoint: a transport plus an optional control listener.
pub struct Endpoint {
    transport: Arc<dyn Transport>,
    cfg: EndpointConfig,
    listener: Option<TcpListener>,
}

/// Memory registered on every comm of a [`Conn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mr(usize);

/// An asynchronous transfer on a [`Conn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XferId(u64);

struct Pending {
    id: XferId,
    parts: VecDeque<(Mr, usize, usize)>,
    current: Option<Transfer>,
    bytes: u64,
}

/// A connection with comms in both directions.
pub struct Conn {
    transport: Arc<dyn Transport>,
    cfg: EndpointConfig,
    peer: SocketAddr,
    send: Vec<Box<dyn SendComm>>,
    recv: Vec<Box<dyn RecvComm>>,
    /// Per registration: its MrId on each send comm and each recv comm.
    mrs: Vec<(Memory, Vec<MrId>, Vec<MrId>)>,
    sends: VecDeque<Pending>,
    recvs: VecDeque<Pending>,
    finished: HashMap<XferId, u64>,
    next_id: u64,
    _control: TcpStream,
    /// Since when nothing moved while transfers were queued ([`Conn::poll`]'s stall check).
    quiet_since: Instant,
}

fn write_frame(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(&(bytes.len() as u32).to_le_bytes())?;
    s.write_all(bytes)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 1 << 20 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "control frame too large",
        ));
    }
    let mut b = vec![0u8; len];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// How long an accepted control connection may take to send its whole first frame, from its
/// connect and however its bytes trickle in (connections are read side by side, so a stranger's
/// wait costs a real peer nothing).
pub const FIRST_FRAME_WAIT: Duration = Duration::from_secs(5);

/// Waits until `s` has data (or its end) to read, until `until`, asking `go_on` every `tick`;
/// the read timeout is left for the caller to set. Past `until`: the io timeout a read would give.
fn wait_readable(
    s: &TcpStream,
    until: Instant,
    tick: Duration,
    go_on: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let peer = s.peer_addr().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let err = control_err(peer);
    let mut byte = [0u8; 1];
    loop {
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the peer sent nothing in time",
            )));
        };
        s.set_read_timeout(Some(left.min(tick).max(Duration::from_millis(1))))
            .map_err(&err)?;
        match s.peek(&mut byte) {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                go_on()?
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => go_on()?,
            Err(e) => return Err(err(e)),
        }
    }
}

/// Whether a failed first exchange looks like a stranger (closed, reset, silent, garbage)
/// rather than a peer of this protocol.
fn stray(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof
            | ConnectionReset
            | ConnectionAborted
            | BrokenPipe
            | InvalidData
            | WouldBlock
            | TimedOut
    )
}

fn control_err(peer: SocketAddr) -> impl Fn(std::io::Error) -> TransportError {
    io_err(
        format!("control connection with {peer}"),
        "is the peer an Endpoint of the same version, still running?",
    )
}

fn config_bytes(c: &EndpointConfig) -> Vec<u8> {
    let mut b = CONTROL_MAGIC.to_vec();
    for v in [c.channels, c.chunk, c.window] {
        b.extend_from_slice(&(v as u64).to_le_bytes());
    }
    b
}

fn describe(c: &[u8]) -> String {
    if c.len() != 32 || &c[..8] != CONTROL_MAGIC {
        return "not an endpoint greeting".into();
    }
    let w = |i: usize| u64::from_le_bytes(c[8 + i * 8..16 + i * 8].try_into().expect("8 bytes"));
    format!("channels={} chunk={} window={}", w(0), w(1), w(2))
}

impl Endpoint {
    /// Checks the configuration against the backend's limits.
    pub fn new(transport: Arc<dyn Transport>, cfg: EndpointConfig) -> Result<Self> {
        let limits = transport.limits();
        if cfg.channels == 0 || cfg.chunk == 0 || cfg.window == 0 {
            return Err(TransportError::Usage(
                "channels, chunk and window must each be at least 1".into(),
            ));
        }
        if cfg.window > limits.max_requests {
            return Err(TransportError::Usage(format!(
                "window {} is beyond what backend `{}` allows ({} requests per comm)",
                cfg.window,
                transport.name(),
                limits.max_requests
            )));
        }
        if cfg.chunk > limits.max_request_bytes {
            return Err(TransportError::Usage(format!(
                "chunk {} B is beyond backend `{}`'s {} B per request",
                cfg.chunk,
                transport.name(),
                limits.max_request_bytes
            )));
        }
        Ok(Endpoint {
            transport,
            cfg,
            listener: None,
        })
    }

    /// Opens the control listener; returns the bound address (port 0 picks a free one).
    pub fn listen(&mut self, addr: SocketAddr) -> Result<SocketAddr> {
        let l = TcpListener::bind(addr).map_err(|source| TransportError::Io {
            what: format!("binding the control listener to {addr}"),
            hint: format!(
                "is port {} already in use (ss -ltnp)? is the address local?",
                addr.port()
            ),
            source,
        })?;
        let local = l.local_addr().map_err(control_err(addr))?;
        self.listener = Some(l);
        Ok(local)
    }

    /// Accepts one peer, waiting until `deadline`.
    pub fn accept(&self, deadline: Instant) -> Result<Conn> {
        self.accept_checking(deadline, Duration::from_secs(3600), &mut || Ok(()))
    }

    /// [`Endpoint::accept`], calling `go_on` about every `tick` while no peer has connected:
    /// an error from it ends the wait with that error (the Python binding checks for Ctrl-C
    /// there). Connections are read side by side without blocking ([`crate::greeting`]): one
    /// that has not sent this protocol's whole first frame within [`FIRST_FRAME_WAIT`] of its
    /// connect (a port scan, a probe, a trickle), or sends another, is dropped with a warning
    /// saying why and the wait goes on; a silent one delays a real peer by nothing (issue 43
    /// item 7: each cost it 5 s in turn).
    pub fn accept_checking(
        &self,
        deadline: Instant,
        tick: Duration,
        go_on: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Conn> {
        use crate::greeting::{take_waiting, wait_any, Greeting, Step, MAX_GREETING};
        let l = self
            .listener
            .as_ref()
            .ok_or_else(|| TransportError::Usage("accept before listen".into()))?;
        let started = Instant::now();
        let local = l
            .local_addr()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let frame_len = config_bytes(&self.cfg).len();
        let drop_stray = |g: &Greeting, why: &str| {
            tracing::warn!(
                "dropped a connection from {} that does not speak this protocol: {why}",
                g.from
            );
        };
        let mut pending: Vec<Greeting> = Vec::new();
        let mut next_tick = Instant::now().checked_add(tick).unwrap_or(deadline);
        loop {
            // A frame's length first, then (when it is a greeting's) the frame.
            take_waiting(
                l,
                &mut pending,
                4,
                FIRST_FRAME_WAIT,
                deadline,
                MAX_GREETING,
                &mut |g, why| drop_stray(g, why),
            )
            .map_err(control_err(local))?;
            let mut i = 0;
            while i < pending.len() {
                match pending[i].read() {
                    Step::Waiting => i += 1,
                    Step::Drop(why) => drop_stray(&pending.remove(i), &why),
                    Step::Whole if pending[i].bytes.len() == 4 => {
                        let g = &mut pending[i];
                        let len = u32::from_le_bytes(g.bytes[..4].try_into().expect("4 bytes"));
                        if len as usize == frame_len {
                            g.want(4 + frame_len);
                        } else {
                            drop_stray(
                                &pending.remove(i),
                                "its first frame is not an endpoint greeting",
                            );
                        }
                    }
                    Step::Whole => {
                        let g = pending.remove(i);
                        if !g.bytes[4..].starts_with(CONTROL_MAGIC) {
                            drop_stray(&g, "its first frame is not an endpoint greeting");
                            continue;
                        }
                        let (peer, theirs) = (g.from, g.bytes[4..].to_vec());
                        let stream = g.into_stream().map_err(control_err(peer))?;
                        match self.handshake(
                            stream,
                            peer,
                            deadline,
                            false,
                            tick,
                            go_on,
                            Some(theirs),
                        ) {
                            Err(TransportError::Io { source, .. }) if stray(&source) => {
                                tracing::warn!(
                                    "dropped a connection from {peer} that does not speak this protocol: {source}"
                                );
                            }
                            r => return r,
                        }
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout {
                    what: format!(
                        "a peer connecting to this endpoint ({} connections still greeting)",
                        pending.len()
                    ),
                    secs: started.elapsed().as_secs_f64(),
                    hint: "did the peer connect to the right address?".into(),
                });
            }
            if now >= next_tick {
                go_on()?;
                next_tick = Instant::now().checked_add(tick).unwrap_or(deadline);
            }
            wait_any(l, &pending, next_tick.min(deadline)).map_err(control_err(local))?;
        }
    }

    /// Connects to a peer's control listener, retrying until `deadline`.
    pub fn connect(&self, addr: SocketAddr, deadline: Instant) -> Result<Conn> {
        self.connect_checking(addr, deadline, Duration::from_secs(3600), &mut || Ok(()))
    }

    /// [`Endpoint::connect`], calling `go_on` about every `tick` while the peer does not
    /// answer: an error from it ends the wait with that error.
    pub fn connect_checking(
        &self,
        addr: SocketAddr,
        deadline: Instant,
        tick: Duration,
        go_on: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Conn> {
        let started = Instant::now();
        loop {
            let slice = Instant::now()
                .checked_add(tick)
                .map_or(deadline, |t| t.min(deadline));
            match connect_retry(addr, &SocketConfig::default(), slice) {
                Ok(stream) => {
                    return self.handshake(stream, addr, deadline, true, tick, go_on, None)
                }
                Err(TransportError::Timeout { what, hint, .. }) => {
                    if Instant::now() >= deadline {
                        return Err(TransportError::Timeout {
                            what,
                            secs: started.elapsed().as_secs_f64(),
                            hint,
                        });
                    }
                    go_on()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Settings, then data channels, with the peer on `s`. While the peer's first frame is
    /// awaited (a peer that has not called `accept` yet), `go_on` is asked every `tick`;
    /// `first` is that frame where the caller has read it already (the accepting side).
    #[allow(clippy::too_many_arguments)]
    fn handshake(
        &self,
        mut s: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
        client: bool,
        tick: Duration,
        go_on: &mut dyn FnMut() -> Result<()>,
        first: Option<Vec<u8>>,
    ) -> Result<Conn> {
        let err = control_err(peer);
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        s.set_write_timeout(Some(left)).map_err(&err)?;
        let mine = config_bytes(&self.cfg);
        write_frame(&mut s, &mine).map_err(&err)?;
        // A peer sends its first frame as soon as it connects: the accepting side has read it
        // (strangers dropped). A client waits for a peer that has not called accept yet, asking
        // go_on meanwhile.
        let theirs = match first {
            Some(frame) => frame,
            None => {
                wait_readable(&s, deadline, tick, go_on)?;
                s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .map_err(&err)?;
                read_frame(&mut s).map_err(&err)?
            }
        };
        s.set_read_timeout(Some(left)).map_err(&err)?;
        if theirs.len() != mine.len() || !theirs.starts_with(CONTROL_MAGIC) {
            // Not an endpoint's greeting at all (a probe, another service): a stranger, which
            // `accept` drops and waits on, rather than a peer whose settings differ.
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the first frame is not an endpoint greeting",
            )));
        }
        if theirs != mine {
            return Err(TransportError::Protocol(format!(
                "endpoint settings differ: this side {}, peer {peer} {}",
                describe(&mine),
                describe(&theirs)
            )));
        }
        // The client sends first on direction 1 (client -> server), then the server on direction 2.
        let mut send = Vec::new();
        let mut recv = Vec::new();
        for dir in 0..2 {
            let i_listen = (dir == 0) != client;
            if i_listen {
                let mut listeners = Vec::new();
                for _ in 0..self.cfg.channels {
                    let l = self.transport.listen()?;
                    write_frame(&mut s, l.handle().as_bytes()).map_err(&err)?;
                    listeners.push(l);
                }
                for mut l in listeners {
                    recv.push(l.accept(deadline)?);
                }
            } else {
                for _ in 0..self.cfg.channels {
                    let h = Handle::from_bytes(read_frame(&mut s).map_err(&err)?)?;
                    send.push(self.transport.connect(&h, deadline)?);
                }
            }
        }
        s.set_read_timeout(None).map_err(&err)?;
        Ok(Conn {
            transport: Arc::clone(&self.transport),
            cfg: self.cfg.clone(),
            peer,
            send,
            recv,
            mrs: Vec::new(),
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            finished: HashMap::new(),
            next_id: 0,
            _control: s,
            quiet_since: Instant::now(),
        })
    }
}

impl Conn {
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Registers memory for both directions.
    pub fn reg(&mut self, mem: Memory) -> Result<Mr> {
        let s = self
            .send
            .iter_mut()
            .map(|c| c.reg_mr(&mem))
            .collect::<Result<Vec<_>>>()?;
        let r = self
            .recv
            .iter_mut()
            .map(|c| c.reg_mr(&mem))
            .collect::<Result<Vec<_>>>()?;
        self.mrs.push((mem, s, r));
        Ok(Mr(self.mrs.len() - 1))
    }

    fn check(&self, mr: Mr, off: usize, len: usize) -> Result<()> {
        let (mem, _, _) = self.mrs.get(mr.0).ok_or_else(|| {
            TransportError::Usage(format!(
                "memory {} is not registered on this connection",
                mr.0
            ))
        })?;
        if len == 0 || off.checked_add(len).is_none_or(|e| e > mem.len()) {
            return Err(TransportError::Usage(format!(
                "range {off}+{len} is not inside registered memory of {} bytes",
                mem.len()
            )));
        }
        Ok(())
    }

    fn enqueue(&mut self, parts: &[(Mr, usize, usize)], role: Role) -> Result<XferId> {
        if parts.is_empty() {
            return Err(TransportError::Usage(
                "a transfer needs at least one buffer".into(),
            ));
        }
        for &(mr, off, len) in parts {
            self.check(mr, off, len)?;
        }
        let id = XferId(self.next_id);
        self.next_id += 1;
        let p = Pending {
            id,
            parts: parts.iter().copied().collect(),
            current: None,
            bytes: 0,
        };
        if self.sends.is_empty() && self.recvs.is_empty() {
            // The stall clock of `poll` starts with the first queued transfer.
            self.quiet_since = Instant::now();
        }
        match role {
            Role::Send => self.sends.push_back(p),
            Role::Recv => self.recvs.push_back(p),
        }
        Ok(id)
    }

    pub fn send_async(&mut self, mr: Mr, off: usize, len: usize) -> Result<XferId> {
        self.enqueue(&[(mr, off, len)], Role::Send)
    }

    pub fn recv_async(&mut self, mr: Mr, off: usize, len: usize) -> Result<XferId> {
        self.enqueue(&[(mr, off, len)], Role::Recv)
    }

    pub fn sendv_async(&mut self, parts: &[(Mr, usize, usize)]) -> Result<XferId> {
        self.enqueue(parts, Role::Send)
    }

    pub fn recvv_async(&mut self, parts: &[(Mr, usize, usize)]) -> Result<XferId> {
        self.enqueue(parts, Role::Recv)
    }

    /// Advances every queued transfer; `Some(bytes)` once `id` finished. A timeout error when
    /// transfers are queued and nothing moved for the config's `stall` (a silent peer), as
    /// [`Conn::wait`] has.
    pub fn poll(&mut self, id: XferId) -> Result<Option<u64>> {
        if self.progress()? {
            self.quiet_since = Instant::now();
        }
        if let Some(b) = self.finished.remove(&id) {
            return Ok(Some(b));
        }
        let queued = !self.sends.is_empty() || !self.recvs.is_empty();
        if queued && self.quiet_since.elapsed() >= self.cfg.stall {
            return Err(TransportError::Timeout {
                what: format!(
                    "transfer {} with {}: nothing moved while polling",
                    id.0, self.peer
                ),
                secs: self.quiet_since.elapsed().as_secs_f64(),
                hint: "is the peer posting the matching send/receive of the same length?".into(),
            });
        }
        Ok(None)
    }

    /// Blocks until `id` finished (stall deadline from the config).
    pub fn wait(&mut self, id: XferId) -> Result<u64> {
        let mut last = Instant::now();
        loop {
            let seen = self.transport.activity();
            if self.progress()? {
                last = Instant::now();
            }
            if let Some(b) = self.finished.remove(&id) {
                return Ok(b);
            }
            if last.elapsed() >= self.cfg.stall {
                return Err(TransportError::Timeout {
                    what: format!("transfer {} with {}", id.0, self.peer),
                    secs: self.cfg.stall.as_secs_f64(),
                    hint: "is the peer posting the matching send/receive of the same length?"
                        .into(),
                });
            }
            self.transport.wait_activity(seen, Duration::from_millis(2));
        }
    }

    pub fn send(&mut self, mr: Mr, off: usize, len: usize) -> Result<()> {
        let id = self.send_async(mr, off, len)?;
        self.wait(id).map(|_| ())
    }

    pub fn recv(&mut self, mr: Mr, off: usize, len: usize) -> Result<u64> {
        let id = self.recv_async(mr, off, len)?;
        self.wait(id)
    }

    pub fn sendv(&mut self, parts: &[(Mr, usize, usize)]) -> Result<()> {
        let id = self.sendv_async(parts)?;
        self.wait(id).map(|_| ())
    }

    pub fn recvv(&mut self, parts: &[(Mr, usize, usize)]) -> Result<u64> {
        let id = self.recvv_async(parts)?;
        self.wait(id)
    }

    fn progress(&mut self) -> Result<bool> {
        let a = self.progress_dir(Role::Send)?;
        let b = self.progress_dir(Role::Recv)?;
        Ok(a || b)
    }

    /// Advances the oldest transfer of one direction (FIFO keeps both ends matched).
    fn progress_dir(&mut self, role: Role) -> Result<bool> {
        let mut progressed = false;
        loop {
            let queue = match role {
                Role::Send => &mut self.sends,
                Role::Recv => &mut self.recvs,
            };
            let Some(p) = queue.front_mut() else {
                return Ok(progressed);
            };
            if p.current.is_none() {
                match p.parts.front() {
                    Some(&(mr, off, len)) => {
                        let cfg = SchedConfig {
                            size: len as u64,
                            chunk: self.cfg.chunk.min(len) as u64,
                            window: self.cfg.window,
                            channels: self.cfg.channels,
                            assignment: Assignment::RoundRobin,
                        };
                        p.current = Some(Transfer::new(cfg, role, off, mr.0 as u32)?);
                    }
                    None => {
                        let done = queue.pop_front().expect("front exists");
                        self.finished.insert(done.id, done.bytes);
                        progressed = true;
                        continue;
                    }
                }
            }
            let mr = p.parts.front().expect("part in progress").0;
            let t = p.current.as_mut().expect("set above");
            let (_, smrs, rmrs) = &self.mrs[mr.0];
            let moved = match role {
                Role::Send => t.step(&mut Comms::Send(&mut self.send, smrs))?,
                Role::Recv => t.step(&mut Comms::Recv(&mut self.recv, rmrs))?,
            };
            progressed |= moved;
            if t.is_done() {
                p.bytes += t.bytes_done();
                p.current = None;
                p.parts.pop_front();
                continue;
            }
            return Ok(progressed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_model::{auto_transfer, AutoInput, Backend};

    /// The endpoint's chunk and window are the automatic rule's, as `tcpx-run bench` gets them
    /// (the Python endpoint builds its configuration with [`EndpointConfig::auto`]): window 16
    /// rather than the 8 it had of its own; GPU memory over the socket backend takes the staged
    /// rule's larger chunks.
    #[test]
    fn endpoint_defaults_follow_the_automatic_rule() {
        for (backend, gpu, channels, socks) in [
            (Backend::Socket, false, 2, 1),
            (Backend::Socket, true, 2, 1),
            (Backend::Socket, false, 1, 16),
            (Backend::NetPlugin, true, 4, 1),
        ] {
            let c = EndpointConfig::auto(backend, gpu, channels, socks);
            let rule = auto_transfer(&AutoInput {
                backend,
                gpu,
                size: None,
                channels: channels as u32,
                socks_per_channel: socks as u32,
            });
            assert_eq!((c.chunk as u64, c.window as u32), (rule.chunk, rule.window));
            assert_eq!(c.channels, channels);
        }
        let d = EndpointConfig::default();
        assert_eq!((d.channels, d.chunk, d.window), (2, 512 * 1024, 16));
        let g = EndpointConfig::auto(Backend::Socket, true, 2, 1);
        assert_eq!((g.chunk, g.window), (8 << 20, 16));
    }
}
