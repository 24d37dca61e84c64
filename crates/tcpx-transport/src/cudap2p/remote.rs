//! One `cudap2p` comm whose two ends live in different processes of one node: CUDA IPC for the
//! bytes, a Unix socket for the control messages of [`super::wire`].
//!
//! One end exports its memory, the other maps it and runs the copies:
//!
//! | mode  | exporter (sends `Offer`s)   | copier (maps, copies, sends `Done`) |
//! |-------|-----------------------------|-------------------------------------|
//! | read  | sender                      | receiver pulls                      |
//! | write | receiver                    | sender pushes                       |
//!
//! Per request, in FIFO order: the exporter's post sends `Offer {seq, handle, offset, len}`; the
//! copier matches it with its own k-th post, maps the allocation (once per allocation, through
//! [`tcpx_gpu::open_peer_cached`]), queues the copy on its GPU's stream and records an event; when
//! the event has passed, the copier's request is done and it sends `Done {seq, bytes}`, which
//! finishes the exporter's request. All of this runs inside `isend`/`irecv`/`test`, which never
//! block; a reader thread per comm files incoming messages and wakes the transport's
//! [`Activity`].
//!
//! Memory lifetime (the driver forbids freeing an allocation another process still maps): the
//! exporter keeps every allocation it offered until the copier says `Released` (after the
//! exporter deregistered it and sent `Unshare`) or `Bye` (the copier closed every mapping of the
//! comm), or until the peer process is gone. Deregistering memory with requests outstanding is
//! refused, so a copy never outlives the registration it reads or writes.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcpx_model::Backoff;

use tcpx_gpu::{DeviceBuffer, Event, IpcExport, IpcMemHandle, PeerMapping, Stream};

use super::wire::{read_msg, Msg, Offer, ReadOutcome};
use super::{check_request, consume_refused, gpu_buffer, gpu_err, CopyMode, MAX_REQUESTS};
use crate::comm_end::CommEnd;
use crate::{io_err, Activity, Memory, MrId, MrTable, RequestId, Result, TransportError};

/// How long a deregistration whose `Unshare` could not be written waits for the reader thread to
/// record the peer's goodbye or the end of the stream (the peer closed first, a benign race).
const UNSHARE_RACE_WAIT: Duration = Duration::from_secs(2);

/// How long a comm being dropped waits for its peer to close its mappings of this side's memory.
const GOODBYE_WAIT: Duration = Duration::from_secs(10);
/// Longest a control message write may block (the peer's reader drains continuously).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which end of the comm this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Send,
    Recv,
}

/// An allocation this end offered to the peer.
struct SharedAlloc {
    /// Held so the memory is not freed while the peer maps it.
    buf: Arc<DeviceBuffer>,
    /// Registrations of this comm that export it.
    live_mrs: usize,
    /// Offered since the last `Unshare`.
    offered: bool,
    /// `Unshare`s sent and not yet answered with `Released`.
    unshares_pending: usize,
}

impl SharedAlloc {
    fn unused(&self) -> bool {
        self.live_mrs == 0 && !self.offered && self.unshares_pending == 0
    }
}

/// A copy queued on this end's GPU.
struct InFlight {
    seq: u64,
    event: Event,
    bytes: usize,
    handle: IpcMemHandle,
    /// Both kept alive until the copy has run.
    _mapping: Arc<PeerMapping>,
    _local: Arc<DeviceBuffer>,
}

#[derive(Default)]
struct LinkState {
    /// Copier: the peer's offers not yet matched with a post of this end, in arrival order.
    offers: VecDeque<Offer>,
    /// Exporter: requests the peer reported done.
    dones: HashMap<u64, usize>,
    /// Why the comm cannot go on (set by either thread, or by the peer's `Fail`).
    failure: Option<String>,
    sent_bye: bool,
    peer_bye: bool,
    peer_closed: bool,
    /// Exporter: allocations offered to the peer.
    shared: HashMap<IpcMemHandle, SharedAlloc>,
    /// Copier: the peer's allocations this comm maps, per GPU of this side that copies.
    mappings: HashMap<(usize, IpcMemHandle), Arc<PeerMapping>>,
    /// Copier: copies on the GPU, oldest first.
    inflight: VecDeque<InFlight>,
    /// Copier: `Unshare`s that arrived while a copy still used the allocation.
    pending_unshare: Vec<IpcMemHandle>,
}

/// What both threads of one comm share.
struct Link {
    comm: u64,
    side: Side,
    mode: CopyMode,
    peer_pid: u32,
    /// Tells peer processes apart in the mapping cache.
    peer_tag: u64,
    writer: Mutex<UnixStream>,
    state: Mutex<LinkState>,
    activity: Arc<Activity>,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn exporter(&self) -> bool {
        matches!(
            (self.mode, self.side),
            (CopyMode::Read, Side::Send) | (CopyMode::Write, Side::Recv)
        )
    }

    fn name(&self) -> String {
        format!(
            "cudap2p comm {:#x} ({} mode, peer process {})",
            self.comm,
            self.mode.as_str(),
            self.peer_pid
        )
    }

    /// Writes `msgs` in order; a failed write fails the comm.
    fn send(&self, msgs: &[Msg]) -> Result<()> {
        if msgs.is_empty() {
            return Ok(());
        }
        let mut frames = Vec::new();
        for m in msgs {
            frames.extend_from_slice(&m.encode());
        }
        let r = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(&frames);
        r.map_err(|e| {
            let f = format!(
                "{}: writing to the control socket failed ({e}): the peer process may have exited",
                self.name()
            );
            self.lock().failure.get_or_insert(f.clone());
            self.activity.bump();
            TransportError::Failed(f)
        })
    }

    /// Records a failure (the first one wins) and returns it as an error.
    fn fail(&self, st: &mut LinkState, why: String) -> TransportError {
        let f = st.failure.get_or_insert(why).clone();
        self.activity.bump();
        TransportError::Failed(f)
    }

    /// Waits (bounded) for this end's copies, then forgets them and its mappings.
    fn close_mappings(&self, st: &mut LinkState) -> Vec<Arc<PeerMapping>> {
        for c in &st.inflight {
            if c.event.wait_within(tcpx_gpu::DEFAULT_GPU_DEADLINE).is_err() {
                // The mappings stay referenced by the leaked copy below: never unmapped under it.
                tracing::warn!("{}: copy {} did not finish on the GPU", self.name(), c.seq);
            }
        }
        let done: Vec<InFlight> = st.inflight.drain(..).collect();
        let mut out: Vec<Arc<PeerMapping>> = st.mappings.drain().map(|(_, m)| m).collect();
        for c in done {
            if c.event.is_complete().unwrap_or(false) {
                out.push(c._mapping);
            } else {
                std::mem::forget(c);
            }
        }
        st.pending_unshare.clear();
        out
    }
}

/// The abstract-namespace address of the control socket `name`.
fn abstract_addr(name: &str) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| {
        TransportError::Protocol(format!("cudap2p socket name {name:?} is not usable: {e}"))
    })
}

/// Connects to the listener's socket `name` and introduces comm `comm` to it.
pub(super) fn connect(
    name: &str,
    comm: u64,
    mode: CopyMode,
    listener_pid: u32,
    deadline: Instant,
) -> Result<UnixStream> {
    let addr = abstract_addr(name)?;
    let started = Instant::now();
    let mut backoff = Backoff::doubling(Duration::from_micros(200), Duration::from_millis(10));
    let stream = loop {
        match UnixStream::connect_addr(&addr) {
            Ok(s) => break s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                if !backoff.wait(deadline) {
                    return Err(TransportError::Io {
                        what: format!(
                            "connecting to cudap2p comm {comm:#x} of process {listener_pid} (socket @{name})"
                        ),
                        hint: "the listening process must be alive on this node, in the same \
                               network namespace (abstract Unix sockets are per namespace), and \
                               still listening"
                            .into(),
                        source: e,
                    });
                }
            }
            Err(e) => {
                return Err(TransportError::Io {
                    what: format!("connecting to cudap2p comm {comm:#x} (socket @{name})"),
                    hint: "both processes must run on one node in one network namespace".into(),
                    source: e,
                })
            }
        }
    };
    let (pid, nonce) = super::process_tag();
    let io = |what: &str, e: std::io::Error| TransportError::Io {
        what: format!("{what} cudap2p comm {comm:#x} of process {listener_pid}"),
        hint: "is the listening process still alive and running tcpx with cudap2p?".into(),
        source: e,
    };
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(|e| io("setting up", e))?;
    (&stream)
        .write_all(
            &Msg::Hello {
                comm,
                mode,
                pid,
                nonce,
            }
            .encode(),
        )
        .map_err(|e| io("greeting", e))?;
    stream
        .set_read_timeout(Some(handshake_read_timeout(deadline)))
        .map_err(|e| io("setting up", e))?;
    match read_msg(&mut &stream) {
        ReadOutcome::Msg(Msg::Welcome) => {}
        ReadOutcome::Msg(Msg::Refuse { reason }) => {
            return Err(TransportError::Failed(format!(
                "cudap2p comm {comm:#x} of process {listener_pid} refused the connection: {reason}"
            )))
        }
        ReadOutcome::Msg(other) => {
            return Err(TransportError::Protocol(format!(
                "cudap2p comm {comm:#x}: expected a welcome, got {other:?}"
            )))
        }
        ReadOutcome::Closed => {
            return Err(TransportError::Failed(format!(
                "cudap2p comm {comm:#x}: process {listener_pid} closed the connection during the handshake"
            )))
        }
        ReadOutcome::Bad(e) => {
            return Err(TransportError::Protocol(format!(
                "cudap2p comm {comm:#x} handshake: {e}"
            )))
        }
        ReadOutcome::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(TransportError::Timeout {
                what: format!("the welcome of cudap2p comm {comm:#x} from process {listener_pid}"),
                secs: started.elapsed().as_secs_f64(),
                hint: "the listening side must call accept".into(),
            })
        }
        ReadOutcome::Io(e) => return Err(io("waiting for the welcome of", e)),
    }
    Ok(stream)
}

/// How long a handshake read may block: the time left until `deadline`, at least 100 ms
/// (`set_read_timeout` refuses a zero timeout, and a reply already sent is still read).
fn handshake_read_timeout(deadline: Instant) -> Duration {
    deadline
        .checked_duration_since(Instant::now())
        .unwrap_or_default()
        .max(Duration::from_millis(100))
}

/// The listening side's half of the handshake on an accepted connection: reads the hello,
/// checks it names comm `comm` in `mode`, answers. Returns the peer's pid and process nonce.
pub(super) fn welcome(
    stream: &UnixStream,
    comm: u64,
    mode: CopyMode,
    deadline: Instant,
) -> Result<(u32, u64)> {
    let io = io_err(
        format!("handshake of cudap2p comm {comm:#x}"),
        "the connecting process may have exited",
    );
    stream.set_nonblocking(false).map_err(&io)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(&io)?;
    stream
        .set_read_timeout(Some(handshake_read_timeout(deadline)))
        .map_err(&io)?;
    let refuse = |reason: String| {
        let _ = (&*stream).write_all(
            &Msg::Refuse {
                reason: reason.clone(),
            }
            .encode(),
        );
        TransportError::Failed(reason)
    };
    match read_msg(&mut &*stream) {
        ReadOutcome::Msg(Msg::Hello {
            comm: c,
            mode: m,
            pid,
            nonce,
        }) => {
            if c != comm {
                return Err(refuse(format!(
                    "process {pid} asked for cudap2p comm {c:#x}, this listener is comm {comm:#x}"
                )));
            }
            if m != mode {
                return Err(refuse(format!(
                    "cudap2p comm {comm:#x}: the listening process copies in {} mode, process \
                     {pid} in {} mode; set TCPX_CUDAP2P_MODE the same on both sides",
                    mode.as_str(),
                    m.as_str()
                )));
            }
            (&*stream).write_all(&Msg::Welcome.encode()).map_err(&io)?;
            Ok((pid, nonce))
        }
        ReadOutcome::Msg(other) => Err(TransportError::Protocol(format!(
            "cudap2p comm {comm:#x}: expected a hello, got {other:?}"
        ))),
        ReadOutcome::Closed => Err(TransportError::Failed(format!(
            "cudap2p comm {comm:#x}: the connecting process closed the socket during the handshake"
        ))),
        ReadOutcome::Bad(e) => Err(TransportError::Protocol(format!(
            "cudap2p comm {comm:#x} handshake: {e}"
        ))),
        ReadOutcome::Io(e) => Err(io(e)),
    }
}

/// Binds the listening socket `name` in the abstract namespace (nothing on disk to remove; the
/// name goes away with the socket), non-blocking for [`super::P2pListener::accept`]'s polling.
pub(super) fn bind(name: &str) -> Result<UnixListener> {
    let addr = abstract_addr(name)?;
    let l = UnixListener::bind_addr(&addr).map_err(|e| TransportError::Io {
        what: format!("binding the cudap2p control socket @{name}"),
        hint: "another process may hold the name (a stale process of this tcpx run?)".into(),
        source: e,
    })?;
    l.set_nonblocking(true).map_err(|e| TransportError::Io {
        what: "making the cudap2p control socket non-blocking".into(),
        hint: "none".into(),
        source: e,
    })?;
    Ok(l)
}

/// Removes every mapping of `handle` (one per GPU of this side that copied with it).
fn take_mappings(st: &mut LinkState, handle: &IpcMemHandle) -> Vec<Arc<PeerMapping>> {
    let keys: Vec<_> = st
        .mappings
        .keys()
        .filter(|(_, h)| h == handle)
        .copied()
        .collect();
    keys.iter().filter_map(|k| st.mappings.remove(k)).collect()
}

fn reader_loop(link: Arc<Link>, mut stream: UnixStream) {
    loop {
        let msg = match read_msg(&mut stream) {
            ReadOutcome::Msg(m) => m,
            ReadOutcome::Closed => {
                return peer_closed(&link, |st| {
                    (!st.peer_bye).then(|| {
                        format!(
                            "{}: the peer closed the control socket without a goodbye (it exited \
                             or crashed): check its output",
                            link.name()
                        )
                    })
                })
            }
            ReadOutcome::Bad(e) => {
                return peer_closed(&link, |_| {
                    Some(format!("{}: unreadable control message: {e}", link.name()))
                })
            }
            ReadOutcome::Io(e) => {
                return peer_closed(&link, |st| {
                    (!st.sent_bye).then(|| {
                        format!(
                            "{}: the control socket failed ({e}): the peer process may have died",
                            link.name()
                        )
                    })
                })
            }
        };
        handle_msg(&link, msg);
        link.activity.bump();
    }
}

/// Records that the control socket is closed and, unless an earlier one is recorded, the failure
/// `why` gives for it (`None`: the goodbyes explain the close); wakes the waiters.
fn peer_closed(link: &Link, why: impl FnOnce(&LinkState) -> Option<String>) {
    let mut st = link.lock();
    st.peer_closed = true;
    if let Some(f) = why(&st) {
        st.failure.get_or_insert(f);
    }
    drop(st);
    link.activity.bump();
}

fn handle_msg(link: &Link, msg: Msg) {
    let exporter = link.exporter();
    let mut replies = Vec::new();
    let mut release_later: Vec<Arc<PeerMapping>> = Vec::new();
    let mut free_later: Vec<Arc<DeviceBuffer>> = Vec::new();
    {
        let mut st = link.lock();
        match msg {
            Msg::Offer(offer) if !exporter => st.offers.push_back(offer),
            Msg::Done { seq, bytes } if exporter => {
                st.dones.insert(seq, bytes as usize);
            }
            Msg::Unshare { handle } if !exporter => {
                if st.inflight.iter().any(|c| c.handle == handle) {
                    st.pending_unshare.push(handle);
                } else {
                    release_later.extend(take_mappings(&mut st, &handle));
                    replies.push(Msg::Released { handle });
                }
            }
            Msg::Released { handle } if exporter => {
                if let Some(s) = st.shared.get_mut(&handle) {
                    s.unshares_pending = s.unshares_pending.saturating_sub(1);
                    if s.unused() {
                        free_later.extend(st.shared.remove(&handle).map(|s| s.buf));
                    }
                }
            }
            Msg::Fail { reason } => {
                let f = format!("{}: the peer failed: {reason}", link.name());
                st.failure.get_or_insert(f);
            }
            Msg::Bye => {
                // The peer closed its mappings of this side's memory and posts nothing more.
                st.peer_bye = true;
                let f = format!("{}: the peer closed its end of the comm", link.name());
                st.failure.get_or_insert(f);
                release_later.extend(link.close_mappings(&mut st));
                free_later.extend(st.shared.drain().map(|(_, s)| s.buf));
                if !st.sent_bye {
                    st.sent_bye = true;
                    replies.push(Msg::Bye);
                }
            }
            other => {
                let f = format!(
                    "{}: unexpected control message {other:?} for the {} side",
                    link.name(),
                    if exporter { "exporting" } else { "copying" }
                );
                st.failure.get_or_insert(f.clone());
                replies.push(Msg::Fail { reason: f });
            }
        }
    }
    // Unmapping and freeing wait for the GPU: outside the lock.
    drop(release_later);
    drop(free_later);
    let _ = link.send(&replies);
}

/// One registration of this end.
struct Mr {
    buf: Arc<DeviceBuffer>,
    /// Filled on the first offer when this end exports.
    export: Option<IpcExport>,
}

/// A post of the copying end not yet matched with the peer's offer.
struct Local {
    seq: u64,
    buf: Arc<DeviceBuffer>,
    off: usize,
    len: usize,
}

/// This process's end of a cross-process comm.
pub(super) struct RemoteEnd {
    link: Arc<Link>,
    reader: Option<JoinHandle<()>>,
    mrs: MrTable<Mr>,
    /// Copier: posts waiting for the peer's offer.
    posted: VecDeque<Local>,
    outstanding: VecDeque<(RequestId, MrId)>,
    /// Finished requests (a receive stays here until consumed).
    finished: HashMap<u64, usize>,
    next: u64,
    streams: HashMap<usize, Stream>,
    described: bool,
}

impl RemoteEnd {
    /// Wraps a connected, greeted control socket; starts its reader thread.
    pub(super) fn start(
        stream: UnixStream,
        comm: u64,
        side: Side,
        mode: CopyMode,
        peer: (u32, u64),
        activity: Arc<Activity>,
    ) -> Result<RemoteEnd> {
        let io = io_err(
            format!("setting up cudap2p comm {comm:#x}"),
            "out of file descriptors or threads?",
        );
        stream.set_read_timeout(None).map_err(&io)?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(&io)?;
        let reading = stream.try_clone().map_err(&io)?;
        let link = Arc::new(Link {
            comm,
            side,
            mode,
            peer_pid: peer.0,
            peer_tag: peer.1 ^ u64::from(peer.0),
            writer: Mutex::new(stream),
            state: Mutex::new(LinkState::default()),
            activity,
        });
        let l2 = Arc::clone(&link);
        let reader = std::thread::Builder::new()
            .name(format!("cudap2p-{comm:x}"))
            .spawn(move || reader_loop(l2, reading))
            .map_err(&io)?;
        Ok(RemoteEnd {
            link,
            reader: Some(reader),
            mrs: MrTable::default(),
            posted: VecDeque::new(),
            outstanding: VecDeque::new(),
            finished: HashMap::new(),
            next: 0,
            streams: HashMap::new(),
            described: false,
        })
    }

    /// Matches offers with posts, queues their copies, retires finished copies (copier); picks
    /// up the peer's `Done`s (exporter). Never blocks on the GPU or the socket's reads.
    fn progress(&mut self) -> Result<()> {
        let mut out = Vec::new();
        let mut release_later = Vec::new();
        let result = {
            let link = Arc::clone(&self.link);
            let mut st = link.lock();
            if link.exporter() {
                let dones: Vec<_> = st.dones.drain().collect();
                self.finished.extend(dones);
                Ok(())
            } else {
                self.copier_progress(&link, &mut st, &mut out, &mut release_later)
            }
        };
        drop(release_later);
        let sent = self.link.send(&out);
        result.and(sent)
    }

    fn copier_progress(
        &mut self,
        link: &Link,
        st: &mut LinkState,
        out: &mut Vec<Msg>,
        release_later: &mut Vec<Arc<PeerMapping>>,
    ) -> Result<()> {
        // Retire finished copies first: their requests are done whatever happens next.
        while let Some(c) = st.inflight.front() {
            let done = c.event.is_complete().map_err(gpu_err);
            match done {
                Ok(true) => {
                    let c = st.inflight.pop_front().expect("front exists");
                    self.finished.insert(c.seq, c.bytes);
                    out.push(Msg::Done {
                        seq: c.seq,
                        bytes: c.bytes as u64,
                    });
                }
                Ok(false) => break,
                Err(e) => {
                    let e = link.fail(st, format!("{}: {e}", link.name()));
                    out.push(Msg::Fail {
                        reason: e.to_string(),
                    });
                    return Err(e);
                }
            }
        }
        let pending = std::mem::take(&mut st.pending_unshare);
        for h in pending {
            if st.inflight.iter().any(|c| c.handle == h) {
                st.pending_unshare.push(h);
            } else {
                release_later.extend(take_mappings(st, &h));
                out.push(Msg::Released { handle: h });
            }
        }
        if let Some(f) = &st.failure {
            return Err(TransportError::Failed(f.clone()));
        }
        while !self.posted.is_empty() && !st.offers.is_empty() {
            let local = self.posted.pop_front().expect("non-empty");
            let offer = st.offers.pop_front().expect("non-empty");
            if let Err(why) = self.queue_copy(link, st, &local, &offer) {
                let e = link.fail(st, why);
                out.push(Msg::Fail {
                    reason: e.to_string(),
                });
                return Err(e);
            }
        }
        Ok(())
    }

    /// Maps the offer's allocation (once) and queues the copy of one matched pair.
    fn queue_copy(
        &mut self,
        link: &Link,
        st: &mut LinkState,
        local: &Local,
        offer: &Offer,
    ) -> std::result::Result<(), String> {
        let name = link.name();
        if offer.seq != local.seq {
            return Err(format!(
                "{name}: the peer's request {} met this side's request {}; both sides must post \
                 in the same order",
                offer.seq, local.seq
            ));
        }
        let (send_len, recv_len) = match link.side {
            Side::Recv => (offer.len as usize, local.len),
            Side::Send => (local.len, offer.len as usize),
        };
        if send_len > recv_len {
            return Err(format!(
                "{name}: a send of {send_len} B met a receive of {recv_len} B; both sides must \
                 post the same sizes"
            ));
        }
        let device = local.buf.device();
        let key = (device.index(), offer.handle);
        let mapping = match st.mappings.get(&key) {
            Some(m) => Arc::clone(m),
            None => {
                let m = tcpx_gpu::open_peer_cached(
                    device,
                    link.peer_tag,
                    &offer.handle,
                    offer.alloc_len as usize,
                )
                .map_err(|e| format!("{name}: mapping the peer's memory: {e}"))?;
                st.mappings.insert(key, Arc::clone(&m));
                m
            }
        };
        let at = offer.offset as usize;
        if at
            .checked_add(send_len)
            .is_none_or(|end| end > mapping.len())
        {
            return Err(format!(
                "{name}: the peer offered {}+{send_len} B of an allocation of {} B",
                offer.offset,
                mapping.len()
            ));
        }
        let stream = match self.streams.entry(device.index()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(device.new_stream().map_err(|e| format!("{name}: {e}"))?)
            }
        };
        let queued = match link.side {
            Side::Recv => stream.copy_from_peer(&mapping, at, &local.buf, local.off, send_len),
            Side::Send => stream.copy_to_peer(&local.buf, local.off, &mapping, at, send_len),
        };
        queued.map_err(|e| format!("{name}: {e}"))?;
        let event = stream.record().map_err(|e| format!("{name}: {e}"))?;
        if !self.described {
            self.described = true;
            tracing::info!(
                "{name}: {}",
                super::describe_route(device, mapping.owner_ordinal(), link.mode, true)
            );
        }
        st.inflight.push_back(InFlight {
            seq: local.seq,
            event,
            bytes: send_len,
            handle: offer.handle,
            _mapping: mapping,
            _local: Arc::clone(&local.buf),
        });
        Ok(())
    }

    fn check(&self, req: RequestId) -> Result<()> {
        if self.outstanding.iter().any(|(r, _)| *r == req) {
            Ok(())
        } else {
            Err(TransportError::Usage(format!(
                "request {} is not outstanding on {}",
                req.0,
                self.link.name()
            )))
        }
    }

    fn finish(&mut self, req: RequestId, bytes: usize) -> usize {
        if self.link.side == Side::Send {
            self.finished.remove(&req.0);
            self.outstanding.retain(|(r, _)| *r != req);
        }
        bytes
    }
}

impl CommEnd for RemoteEnd {
    fn peer(&self) -> String {
        self.link.name()
    }

    fn reg(&mut self, mem: &Memory) -> Result<MrId> {
        let buf = Arc::clone(gpu_buffer(mem)?);
        Ok(self.mrs.insert(Mr { buf, export: None }))
    }

    fn dereg(&mut self, mr: MrId) -> Result<()> {
        let busy = self.outstanding.iter().filter(|(_, m)| *m == mr).count();
        if busy > 0 {
            return Err(TransportError::Usage(format!(
                "memory registration {} of {} still has {busy} request(s) outstanding: test \
                 (and consume) them before deregistering",
                mr.0,
                self.link.name()
            )));
        }
        let Mr {
            export: Some(export),
            ..
        } = self.mrs.remove(mr)?
        else {
            return Ok(());
        };
        let mut unshare = None;
        let mut free_later = None;
        {
            let mut st = self.link.lock();
            let peer_gone = st.peer_bye || st.peer_closed;
            if let Some(s) = st.shared.get_mut(&export.handle) {
                s.live_mrs = s.live_mrs.saturating_sub(1);
                if s.live_mrs == 0 && s.offered && !peer_gone {
                    s.offered = false;
                    s.unshares_pending += 1;
                    unshare = Some(Msg::Unshare {
                        handle: export.handle,
                    });
                } else if s.live_mrs == 0 && peer_gone {
                    // Nobody maps it any more.
                    s.offered = false;
                    s.unshares_pending = 0;
                }
                let s = &st.shared[&export.handle];
                if s.unused() {
                    free_later = st.shared.remove(&export.handle).map(|s| s.buf);
                }
            }
        }
        drop(free_later);
        if let Some(m) = unshare {
            if let Err(e) = self.link.send(&[m]) {
                // A peer that said goodbye meanwhile has closed its mappings: nothing to undo.
                // The write fails as soon as the peer closed its end, possibly before this side's
                // reader thread has read the peer's `Bye` (or the end of the stream): wait for the
                // reader to record it, briefly, before calling the failure real.
                let deadline = Instant::now() + UNSHARE_RACE_WAIT;
                loop {
                    let seen = self.link.activity.get();
                    let peer_gone = {
                        let st = self.link.lock();
                        st.peer_bye || st.peer_closed
                    };
                    if peer_gone {
                        break;
                    }
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        return Err(e);
                    };
                    self.link.activity.wait(seen, left);
                }
            }
        }
        Ok(())
    }

    /// Posts this end's next request; `None` when the window is full.
    fn post(&mut self, mr: MrId, off: usize, len: usize) -> Result<Option<RequestId>> {
        if self.outstanding.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let entry = self.mrs.get_mut(mr)?;
        check_request(off, len, entry.buf.len())?;
        if let Some(f) = &self.link.lock().failure {
            return Err(TransportError::Failed(f.clone()));
        }
        let seq = self.next;
        if self.link.exporter() {
            let fresh = entry.export.is_none();
            if fresh {
                entry.export = Some(entry.buf.ipc_export().map_err(gpu_err)?);
            }
            let export = entry.export.expect("exported above");
            let buf = Arc::clone(&entry.buf);
            {
                let mut st = self.link.lock();
                let s = st.shared.entry(export.handle).or_insert(SharedAlloc {
                    buf,
                    live_mrs: 0,
                    offered: false,
                    unshares_pending: 0,
                });
                if fresh {
                    s.live_mrs += 1;
                }
                s.offered = true;
            }
            self.link.send(&[Msg::Offer(Offer {
                seq,
                handle: export.handle,
                offset: export.offset + off as u64,
                len: len as u64,
                alloc_len: export.alloc_len,
            })])?;
        } else {
            self.posted.push_back(Local {
                seq,
                buf: Arc::clone(&entry.buf),
                off,
                len,
            });
        }
        self.next += 1;
        let id = RequestId(seq);
        self.outstanding.push_back((id, mr));
        self.progress()?;
        Ok(Some(id))
    }

    /// `Some(bytes)` once request `req` finished. A send is forgotten right away, a receive when
    /// consumed.
    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.check(req)?;
        if let Some(&b) = self.finished.get(&req.0) {
            return Ok(Some(self.finish(req, b)));
        }
        let progressed = self.progress();
        if let Some(&b) = self.finished.get(&req.0) {
            return Ok(Some(self.finish(req, b)));
        }
        progressed?;
        if let Some(f) = &self.link.lock().failure {
            return Err(TransportError::Failed(f.clone()));
        }
        Ok(None)
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.outstanding.front() {
            Some(&(id, _)) if id == req && self.finished.remove(&req.0).is_some() => {
                self.outstanding.pop_front();
                Ok(())
            }
            _ => Err(consume_refused(req)),
        }
    }
}

impl Drop for RemoteEnd {
    fn drop(&mut self) {
        // 1. Close this side's mappings of the peer's memory, then say so.
        let (mappings, bye) = {
            let mut st = self.link.lock();
            let m = self.link.close_mappings(&mut st);
            let bye = !st.sent_bye && !st.peer_closed;
            st.sent_bye = true;
            (m, bye)
        };
        drop(mappings);
        if bye {
            let _ = self.link.send(&[Msg::Bye]);
        }
        // 2. Keep the memory this side offered until the peer has closed its mappings of it.
        let deadline = Instant::now() + GOODBYE_WAIT;
        loop {
            let seen = self.link.activity.get();
            {
                let st = self.link.lock();
                if st.peer_bye || st.peer_closed || st.shared.is_empty() {
                    break;
                }
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                let mut st = self.link.lock();
                tracing::warn!(
                    "{}: the peer did not confirm closing its mappings within {GOODBYE_WAIT:?}; \
                     leaking {} offered allocation(s) rather than freeing memory it may map",
                    self.link.name(),
                    st.shared.len()
                );
                for (_, s) in st.shared.drain() {
                    std::mem::forget(s.buf);
                }
                break;
            };
            self.link
                .activity
                .wait(seen, left.min(Duration::from_millis(20)));
        }
        let shared: Vec<_> = self
            .link
            .lock()
            .shared
            .drain()
            .map(|(_, s)| s.buf)
            .collect();
        drop(shared);
        // 3. Stop the reader.
        let _ = self
            .link
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control socket listening at a name of this process ending in `suffix`, and a thread
    /// connecting to it for comm `comm` in `mode`: the accepted stream and the connecting thread,
    /// whose result comes once the listener answers the greeting.
    fn accepted(
        suffix: &str,
        comm: u64,
        mode: CopyMode,
        deadline: Instant,
    ) -> (UnixStream, JoinHandle<Result<UnixStream>>) {
        let name = format!(
            "tcpx-cudap2p-test.{}.{:x}{suffix}",
            std::process::id(),
            rand_u64()
        );
        let listener = bind(&name).unwrap();
        let client = std::thread::spawn(move || connect(&name, comm, mode, 1, deadline));
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "no connection");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        };
        (stream, client)
    }

    /// Two ends of one comm over a real socket pair in this process (no GPU: control path only).
    fn pair(mode: CopyMode) -> (RemoteEnd, RemoteEnd, Arc<Activity>) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (accepted, client) = accepted("", 77, mode, deadline);
        let peer = welcome(&accepted, 77, mode, deadline).unwrap();
        let sender = client.join().unwrap().unwrap();
        let activity = Arc::new(Activity::default());
        let send =
            RemoteEnd::start(sender, 77, Side::Send, mode, (9, 9), Arc::clone(&activity)).unwrap();
        let recv =
            RemoteEnd::start(accepted, 77, Side::Recv, mode, peer, Arc::clone(&activity)).unwrap();
        (send, recv, activity)
    }

    fn rand_u64() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(7);
        h.finish()
    }

    fn wait_for(activity: &Activity, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let seen = activity.get();
            if done() {
                return;
            }
            assert!(Instant::now() < deadline, "{what} did not happen");
            activity.wait(seen, Duration::from_millis(50));
        }
    }

    #[test]
    fn mismatched_modes_are_refused_by_name() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (accepted, client) = accepted(".m", 5, CopyMode::Write, deadline);
        let e = welcome(&accepted, 5, CopyMode::Read, deadline)
            .unwrap_err()
            .to_string();
        assert!(e.contains("TCPX_CUDAP2P_MODE"), "{e}");
        let e = client.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("refused") && e.contains("write mode"), "{e}");
    }

    #[test]
    fn connecting_to_a_socket_nobody_listens_on_times_out_with_a_hint() {
        let name = format!(
            "tcpx-cudap2p-test.{}.{:x}.none",
            std::process::id(),
            rand_u64()
        );
        let e = connect(
            &name,
            1,
            CopyMode::Read,
            4242,
            Instant::now() + Duration::from_millis(50),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("process 4242") && e.contains("alive"), "{e}");
    }

    #[test]
    fn a_peer_that_goes_away_fails_the_comm_by_name() {
        let (send, mut recv, activity) = pair(CopyMode::Read);
        drop(send);
        wait_for(&activity, "the goodbye", || recv.link.lock().peer_bye);
        let host = Memory::Host(tcpx_gpu::HostBuffer::new(4096).unwrap());
        assert!(recv.reg(&host).is_err());
        let f = recv.link.lock().failure.clone().unwrap();
        assert!(
            f.contains("cudap2p comm 0x4d") && f.contains("closed its end"),
            "{f}"
        );
        assert!(recv.test(RequestId(0)).is_err());
    }

    #[test]
    fn a_crashed_peer_without_goodbye_is_reported() {
        let (send, recv, activity) = pair(CopyMode::Write);
        // Close the socket the way a dying process does: no Bye.
        send.link
            .writer
            .lock()
            .unwrap()
            .shutdown(std::net::Shutdown::Both)
            .unwrap();
        wait_for(&activity, "the end of the stream", || {
            recv.link.lock().peer_closed
        });
        let f = recv.link.lock().failure.clone().unwrap();
        assert!(
            f.contains("without a goodbye") && f.contains("write mode"),
            "{f}"
        );
        drop(recv);
        drop(send);
    }

    #[test]
    fn a_peer_failure_and_unexpected_messages_reach_the_other_side() {
        let (send, recv, activity) = pair(CopyMode::Read);
        // The receiver copies in read mode: a Done sent to it is out of place.
        send.link.send(&[Msg::Done { seq: 0, bytes: 1 }]).unwrap();
        wait_for(&activity, "the protocol error", || {
            recv.link.lock().failure.is_some() && send.link.lock().failure.is_some()
        });
        let f = recv.link.lock().failure.clone().unwrap();
        assert!(f.contains("unexpected control message"), "{f}");
        let f = send.link.lock().failure.clone().unwrap();
        assert!(f.contains("the peer failed"), "{f}");
    }
}
