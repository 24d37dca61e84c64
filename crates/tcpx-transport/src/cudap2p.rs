//! Backend `cudap2p`: intra-node GPU-to-GPU copies, the node-local baseline network figures are
//! read against (NCCL's P2P transport, see the seeds' analysis).
//!
//! Same process: the k-th send and the k-th receive of a comm (FIFO, as on every backend) become
//! one device-to-device copy (`tcpx_gpu::Stream::copy_device`: `cuMemcpyPeerAsync` between two
//! GPUs, so the copy engines move it over NVLink or PCIe peer access where the driver has a peer
//! route, else through host memory), queued on a stream of the receiving GPU ([`CopyMode::Read`],
//! the receiver pulls) or of the sending GPU ([`CopyMode::Write`], the sender pushes). Both
//! requests finish when the copy's event has passed. Peer access is enabled (asked of the driver
//! before every copy, see `tcpx_gpu::Device::enable_peer_access`): without it the driver stages
//! peer copies through host memory at a tenth of the speed.
//!
//! Two processes of one node: the handle names the listening process and a Unix socket in the
//! abstract namespace (gone with the listener, nothing on disk). A connect from another process
//! goes through that socket, which then carries the comm's control messages ([`wire`]); the bytes
//! move by CUDA IPC: the side whose memory is read (read mode: the sender) or written (write
//! mode: the receiver) exports it, the other side maps it once per allocation and runs the copy
//! on its own GPU (see `remote` for the protocol and the memory-lifetime rules). Both
//! processes must use the same `TCPX_CUDAP2P_MODE`; a mismatch is refused at connect.
//!
//! Not for: host memory (use `socket`), or GPUs of different machines.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tcpx_gpu::{Device, DeviceBuffer, Event, Stream};

mod remote;
mod wire;

use remote::{RemoteEnd, Side};

use crate::backend::{self, Backend};
use crate::comm_end::{CommEnd, ReceivingEnd, SendingEnd};
use crate::{
    Activity, Handle, Limits, Listener, Memory, MrId, MrTable, RecvComm, RequestId, Result,
    SendComm, Transport, TransportError,
};

const MAGIC: &[u8; 8] = b"TCPXCP2P";
/// Requests in flight per comm.
pub const MAX_REQUESTS: usize = 32;

/// Which GPU's stream runs the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyMode {
    /// The receiving GPU pulls the bytes (reads its peer's memory).
    #[default]
    Read,
    /// The sending GPU pushes the bytes (writes its peer's memory).
    Write,
}

impl CopyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMode::Read => "read",
            CopyMode::Write => "write",
        }
    }

    /// `read` or `write` (also from `TCPX_CUDAP2P_MODE`).
    pub fn parse(s: &str) -> Result<CopyMode> {
        match s.trim() {
            "read" | "" => Ok(CopyMode::Read),
            "write" => Ok(CopyMode::Write),
            other => Err(TransportError::Usage(format!(
                "cudap2p copy mode `{other}`: choose read (receiver pulls) or write (sender pushes)"
            ))),
        }
    }
}

/// One posted request's memory.
struct Posted {
    buf: Arc<DeviceBuffer>,
    off: usize,
    len: usize,
}

/// A matched pair's copy: done once its event passed.
struct Copy {
    event: Event,
    bytes: usize,
}

#[derive(Default)]
struct PipeState {
    connected: bool,
    sends: VecDeque<(u64, Posted)>,
    recvs: VecDeque<(u64, Posted)>,
    copies: HashMap<u64, Arc<Copy>>,
    /// Copies one side has already finished with (the sender saw it done, or the receiver
    /// consumed it): a copy is forgotten only once both sides are through with it, since either
    /// may look at it last.
    retired_once: std::collections::HashSet<u64>,
    failure: Option<String>,
    /// One stream per GPU that runs copies, made on first use.
    streams: HashMap<usize, Stream>,
    /// The route of the first copy was logged.
    described: bool,
}

/// The shared state of one comm.
struct Pipe {
    id: u64,
    mode: CopyMode,
    state: Mutex<PipeState>,
    activity: Arc<Activity>,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns every matched send/receive pair into a queued copy.
    fn progress(&self, st: &mut PipeState) -> Result<()> {
        if let Some(f) = &st.failure {
            return Err(TransportError::Failed(f.clone()));
        }
        while !st.sends.is_empty() && !st.recvs.is_empty() {
            let (seq, send) = st.sends.pop_front().expect("non-empty");
            let (rseq, recv) = st.recvs.pop_front().expect("non-empty");
            debug_assert_eq!(seq, rseq, "FIFO on both sides");
            if send.len > recv.len {
                let f = format!(
                    "cudap2p comm {}: a send of {} B met a receive of {} B; both sides must post the same sizes",
                    self.id, send.len, recv.len
                );
                st.failure = Some(f.clone());
                return Err(TransportError::Failed(f));
            }
            let runner = match self.mode {
                CopyMode::Read => recv.buf.device().clone(),
                CopyMode::Write => send.buf.device().clone(),
            };
            let other = match self.mode {
                CopyMode::Read => send.buf.device(),
                CopyMode::Write => recv.buf.device(),
            };
            // Direct peer access makes the copy engines move the bytes over NVLink/PCIe; without
            // it the driver stages peer copies through host memory. Enabled once per GPU pair
            // (tcpx-gpu remembers); where there is no peer route the copy stays staged.
            runner.enable_peer_access(other).map_err(gpu_err)?;
            let gpu = runner.index();
            let stream = match st.streams.entry(gpu) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(runner.new_stream().map_err(gpu_err)?)
                }
            };
            stream
                .copy_device(&send.buf, send.off, &recv.buf, recv.off, send.len)
                .map_err(gpu_err)?;
            let event = stream.record().map_err(gpu_err)?;
            if !st.described {
                st.described = true;
                let peer = match self.mode {
                    CopyMode::Read => send.buf.device().index(),
                    CopyMode::Write => recv.buf.device().index(),
                };
                tracing::info!(
                    "cudap2p comm {:#x}: {}",
                    self.id,
                    describe_route(&runner, Some(peer), self.mode, false)
                );
            }
            st.copies.insert(
                seq,
                Arc::new(Copy {
                    event,
                    bytes: send.len,
                }),
            );
        }
        Ok(())
    }

    /// One side is through with copy `seq`; the second call forgets it.
    fn retire(&self, seq: u64) {
        let mut st = self.lock();
        if !st.retired_once.remove(&seq) {
            st.retired_once.insert(seq);
        } else {
            st.copies.remove(&seq);
        }
    }

    /// `Some(bytes)` once request `seq`'s copy finished.
    fn poll(&self, seq: u64) -> Result<Option<usize>> {
        let mut st = self.lock();
        self.progress(&mut st)?;
        let Some(c) = st.copies.get(&seq).cloned() else {
            return Ok(None);
        };
        drop(st);
        if c.event.is_complete().map_err(gpu_err)? {
            self.activity.bump();
            Ok(Some(c.bytes))
        } else {
            Ok(None)
        }
    }
}

fn gpu_err(e: tcpx_gpu::GpuError) -> TransportError {
    TransportError::Failed(format!("cudap2p: {e}"))
}

/// The GPU buffer `mem` is; host memory is refused (both ends of a comm register this way).
fn gpu_buffer(mem: &Memory) -> Result<&Arc<DeviceBuffer>> {
    match mem {
        Memory::Cuda(b) => Ok(b),
        Memory::Host(_) => Err(TransportError::Usage(
            "cudap2p moves GPU memory only: use --memory cuda".into(),
        )),
    }
}

/// Refuses a request of `len` bytes at `off` that is empty or reaches past the `registered`
/// bytes.
fn check_request(off: usize, len: usize, registered: usize) -> Result<()> {
    if len == 0 || off.checked_add(len).is_none_or(|end| end > registered) {
        return Err(TransportError::Usage(format!(
            "request {off}+{len} is outside the registered {registered} B (or empty)"
        )));
    }
    Ok(())
}

/// The refusal of a consume that is not of the oldest receive, or of one not reported done.
fn consume_refused(req: RequestId) -> TransportError {
    TransportError::Usage(format!(
        "receive {} consumed out of FIFO order or before its test reported it done",
        req.0
    ))
}

fn registry() -> &'static Mutex<HashMap<u64, Arc<Pipe>>> {
    static PIPES: OnceLock<Mutex<HashMap<u64, Arc<Pipe>>>> = OnceLock::new();
    PIPES.get_or_init(Default::default)
}

/// Identifies this process in handles (pid + a per-process nonce against pid reuse).
fn process_tag() -> (u32, u64) {
    static NONCE: OnceLock<u64> = OnceLock::new();
    let nonce = *NONCE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    (std::process::id(), nonce)
}

/// Intra-node GPU copies between comms of this process.
pub struct CudaP2pTransport {
    mode: CopyMode,
    next: AtomicU64,
    activity: Arc<Activity>,
}

impl CudaP2pTransport {
    pub fn new(mode: CopyMode) -> Self {
        CudaP2pTransport {
            mode,
            next: AtomicU64::new(1),
            activity: Arc::new(Activity::default()),
        }
    }

    pub fn mode(&self) -> CopyMode {
        self.mode
    }
}

/// What a listen handle says: which process and comm, in which mode, and the control socket's
/// abstract name for a connect from another process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListenHandle {
    pid: u32,
    nonce: u64,
    id: u64,
    mode: CopyMode,
    socket: String,
}

/// magic, pid, nonce, comm id, mode, socket name length: the bytes before the name.
const HANDLE_FIXED: usize = 8 + 4 + 8 + 8 + 1 + 1;

fn socket_name(pid: u32, nonce: u64, id: u64) -> String {
    format!("tcpx-cudap2p.{pid}.{nonce:016x}.{id:x}")
}

fn encode(h: &ListenHandle) -> Handle {
    let mut b = Vec::with_capacity(HANDLE_FIXED + h.socket.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&h.pid.to_le_bytes());
    b.extend_from_slice(&h.nonce.to_le_bytes());
    b.extend_from_slice(&h.id.to_le_bytes());
    b.push(match h.mode {
        CopyMode::Read => 0,
        CopyMode::Write => 1,
    });
    b.push(h.socket.len() as u8);
    b.extend_from_slice(h.socket.as_bytes());
    debug_assert!(b.len() <= crate::HANDLE_MAX);
    Handle(b)
}

fn decode(h: &Handle) -> Result<ListenHandle> {
    let b = h.as_bytes();
    let not_ours = || {
        TransportError::Protocol(format!(
            "handle of {} bytes is not a cudap2p handle of this tcpx version; both sides must use \
             --transport cudap2p and the same tcpx build",
            b.len()
        ))
    };
    if b.len() < HANDLE_FIXED || &b[..8] != MAGIC {
        return Err(not_ours());
    }
    let name_len = b[HANDLE_FIXED - 1] as usize;
    if b.len() != HANDLE_FIXED + name_len {
        return Err(not_ours());
    }
    let mode = match b[28] {
        0 => CopyMode::Read,
        1 => CopyMode::Write,
        _ => return Err(not_ours()),
    };
    let socket = std::str::from_utf8(&b[HANDLE_FIXED..])
        .map_err(|_| not_ours())?
        .to_string();
    Ok(ListenHandle {
        pid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        nonce: u64::from_le_bytes(b[12..20].try_into().expect("8 bytes")),
        id: u64::from_le_bytes(b[20..28].try_into().expect("8 bytes")),
        mode,
        socket,
    })
}

/// "GPU 0 pulls from GPU 1 (read mode, CUDA IPC; NV18, peer access)": where a comm's copies
/// run and which link they take, for logs and `describe`.
pub fn describe_route(
    local: &Device,
    peer: Option<usize>,
    mode: CopyMode,
    cross_process: bool,
) -> String {
    let how = if cross_process {
        "CUDA IPC"
    } else {
        "same process"
    };
    let verb = match mode {
        CopyMode::Read => "pulls from",
        CopyMode::Write => "pushes to",
    };
    let Some(peer) = peer else {
        return format!(
            "GPU {} {verb} a GPU this process cannot see ({} mode, {how})",
            local.index(),
            mode.as_str()
        );
    };
    let link = tcpx_gpu::gpu_link_summary(local.index(), peer);
    format!(
        "GPU {} {verb} GPU {peer} ({} mode, {how}; {link})",
        local.index(),
        mode.as_str()
    )
}

impl Transport for CudaP2pTransport {
    fn name(&self) -> &str {
        Backend::CudaP2p.name()
    }

    fn limits(&self) -> Limits {
        backend::limits(Backend::CudaP2p)
    }

    fn listen(&self) -> Result<Box<dyn Listener>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) | (u64::from(std::process::id()) << 32);
        let (pid, nonce) = process_tag();
        let socket = socket_name(pid, nonce, id);
        // Bound before the handle exists, so a peer holding the handle finds it listening.
        let uds = remote::bind(&socket)?;
        let pipe = Arc::new(Pipe {
            id,
            mode: self.mode,
            state: Mutex::new(PipeState::default()),
            activity: Arc::clone(&self.activity),
        });
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&pipe));
        Ok(Box::new(P2pListener {
            pipe,
            uds,
            handle: ListenHandle {
                pid,
                nonce,
                id,
                mode: self.mode,
                socket,
            },
        }))
    }

    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
        let h = decode(handle)?;
        if (h.pid, h.nonce) != process_tag() {
            let stream = remote::connect(&h.socket, h.id, self.mode, h.pid, deadline)?;
            let end = RemoteEnd::start(
                stream,
                h.id,
                Side::Send,
                self.mode,
                (h.pid, h.nonce),
                Arc::clone(&self.activity),
            )?;
            self.activity.bump();
            return Ok(Box::new(SendingEnd(end)));
        }
        let id = h.id;
        let pipe = registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
            .ok_or_else(|| {
                TransportError::Protocol(format!(
                    "cudap2p comm {id} is not listening (already connected, or its listener was dropped)"
                ))
            })?;
        pipe.lock().connected = true;
        self.activity.bump();
        Ok(Box::new(SendingEnd(End::new(pipe, true))))
    }

    fn activity(&self) -> u64 {
        self.activity.get()
    }

    fn wait_activity(&self, seen: u64, timeout: Duration) {
        // Copies finish on the GPU without telling the CPU: wake up soon to poll the events.
        self.activity
            .wait(seen, timeout.min(Duration::from_micros(50)))
    }
}

struct P2pListener {
    pipe: Arc<Pipe>,
    /// Where a connect from another process arrives.
    uds: std::os::unix::net::UnixListener,
    handle: ListenHandle,
}

impl Drop for P2pListener {
    fn drop(&mut self) {
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.pipe.id);
    }
}

impl Listener for P2pListener {
    fn handle(&self) -> Handle {
        encode(&self.handle)
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let started = Instant::now();
        loop {
            let seen = self.pipe.activity.get();
            if self.pipe.lock().connected {
                return Ok(Box::new(ReceivingEnd(End::new(
                    Arc::clone(&self.pipe),
                    false,
                ))));
            }
            match self.uds.accept() {
                Ok((stream, _)) => {
                    // A peer process connected: nobody in this process may take the comm now.
                    registry()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&self.pipe.id);
                    let peer = remote::welcome(&stream, self.pipe.id, self.pipe.mode, deadline)?;
                    let end = RemoteEnd::start(
                        stream,
                        self.pipe.id,
                        Side::Recv,
                        self.pipe.mode,
                        peer,
                        Arc::clone(&self.pipe.activity),
                    )?;
                    return Ok(Box::new(ReceivingEnd(end)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(TransportError::Io {
                        what: format!("accepting cudap2p comm {:#x}", self.pipe.id),
                        hint: "out of file descriptors?".into(),
                        source: e,
                    })
                }
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(TransportError::Timeout {
                    what: format!("accepting cudap2p comm {:#x}", self.pipe.id),
                    secs: started.elapsed().as_secs_f64(),
                    hint: "did the sender get the handle and connect (in this process, or in \
                           another process of this node)?"
                        .into(),
                });
            };
            // In-process connects wake the activity; a peer process's connect is seen on the
            // next poll of the socket, at most a millisecond later.
            self.pipe
                .activity
                .wait(seen, left.min(Duration::from_millis(1)));
        }
    }
}

/// One side's registrations and outstanding requests.
struct End {
    pipe: Arc<Pipe>,
    /// Whether this end sends (else it receives).
    sends: bool,
    mrs: MrTable<Arc<DeviceBuffer>>,
    outstanding: VecDeque<RequestId>,
    /// Receives whose test reported them done, until consumed: id -> bytes.
    done: HashMap<RequestId, usize>,
    next: u64,
}

impl End {
    fn new(pipe: Arc<Pipe>, sends: bool) -> Self {
        End {
            pipe,
            sends,
            mrs: MrTable::default(),
            outstanding: VecDeque::new(),
            done: HashMap::new(),
            next: 0,
        }
    }

    fn check(&self, req: RequestId) -> Result<()> {
        if self.outstanding.contains(&req) {
            Ok(())
        } else {
            Err(TransportError::Usage(format!(
                "request {} is not outstanding on cudap2p comm {}",
                req.0, self.pipe.id
            )))
        }
    }
}

impl CommEnd for End {
    fn reg(&mut self, mem: &Memory) -> Result<MrId> {
        let buf = gpu_buffer(mem)?;
        Ok(self.mrs.insert(Arc::clone(buf)))
    }

    fn dereg(&mut self, mr: MrId) -> Result<()> {
        self.mrs.remove(mr).map(drop)
    }

    /// Posts on the send or the receive queue, as this end does; `None` when the window is full.
    fn post(&mut self, mr: MrId, off: usize, len: usize) -> Result<Option<RequestId>> {
        if self.outstanding.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let buf = Arc::clone(self.mrs.get(mr)?);
        check_request(off, len, buf.len())?;
        let id = RequestId(self.next);
        self.next += 1;
        let mut st = self.pipe.lock();
        let q = if self.sends {
            &mut st.sends
        } else {
            &mut st.recvs
        };
        q.push_back((id.0, Posted { buf, off, len }));
        self.pipe.progress(&mut st)?;
        drop(st);
        self.outstanding.push_back(id);
        Ok(Some(id))
    }

    /// A send is forgotten once done; a receive is kept until consumed.
    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        if let Some(&b) = self.done.get(&req) {
            return Ok(Some(b));
        }
        self.check(req)?;
        let done = self.pipe.poll(req.0)?;
        if let Some(b) = done {
            if self.sends {
                self.outstanding.retain(|r| *r != req);
                self.pipe.retire(req.0);
            } else {
                self.done.insert(req, b);
            }
        }
        Ok(done)
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.outstanding.front() {
            Some(&id) if id == req && self.done.remove(&req).is_some() => {
                self.outstanding.pop_front();
                // The copy is finished; forget it once the sender has seen it too (removing it
                // here alone left a slower sender polling for a copy that was gone: the stall
                // seen in read mode on the H200).
                self.pipe.retire(req.0);
                Ok(())
            }
            _ => Err(consume_refused(req)),
        }
    }

    fn peer(&self) -> String {
        format!("cudap2p comm {} (this process)", self.pipe.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_name_the_process_and_the_socket() {
        let (pid, nonce) = process_tag();
        let h = ListenHandle {
            pid,
            nonce,
            id: u64::MAX,
            mode: CopyMode::Write,
            socket: socket_name(pid, nonce, u64::MAX),
        };
        let bytes = encode(&h);
        assert!(bytes.as_bytes().len() <= crate::HANDLE_MAX);
        assert_eq!(decode(&bytes).unwrap(), h);
        // Cut, lengthened, foreign or with a bad mode byte: refused with the same advice.
        let b = bytes.as_bytes();
        for bad in [
            b[..b.len() - 1].to_vec(),
            [b, &b"x"[..]].concat(),
            vec![0; 5],
            {
                let mut v = b.to_vec();
                v[28] = 9;
                v
            },
        ] {
            let e = decode(&Handle(bad)).unwrap_err().to_string();
            assert!(e.contains("not a cudap2p handle"), "{e}");
        }
        assert_eq!(CopyMode::parse("write").unwrap(), CopyMode::Write);
        assert!(CopyMode::parse("sideways").is_err());
    }

    #[test]
    fn a_handle_of_a_process_that_is_gone_fails_with_a_hint() {
        let t = CudaP2pTransport::new(CopyMode::Read);
        let (pid, nonce) = process_tag();
        let h = ListenHandle {
            pid: pid ^ 1,
            nonce: nonce ^ 1,
            id: 3,
            mode: CopyMode::Read,
            socket: socket_name(pid ^ 1, nonce ^ 1, 3),
        };
        let e = t
            .connect(&encode(&h), Instant::now() + Duration::from_millis(30))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("process {}", pid ^ 1)) && e.contains("alive"),
            "{e}"
        );
    }

    #[test]
    fn a_connect_through_the_socket_reaches_the_listener_of_this_process() {
        // The cross-process path run inside one process (no GPU needed to connect): the
        // listener's accept takes the socket connection and both ends speak the protocol.
        let t = CudaP2pTransport::new(CopyMode::Read);
        let mut l = t.listen().unwrap();
        let h = decode(&l.handle()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let connector = std::thread::spawn(move || {
            let s = remote::connect(&h.socket, h.id, CopyMode::Read, h.pid, deadline)?;
            RemoteEnd::start(
                s,
                h.id,
                Side::Send,
                CopyMode::Read,
                (1, 1),
                Arc::new(Activity::default()),
            )
        });
        let r = l.accept(deadline).unwrap();
        let s = connector.join().unwrap().unwrap();
        assert!(r.peer().contains("read mode"), "{}", r.peer());
        // The in-process path is closed once a peer process took the comm.
        let e = t.connect(&l.handle(), deadline).err().unwrap().to_string();
        assert!(e.contains("is not listening"), "{e}");
        drop(s);
        drop(r);
    }

    #[test]
    fn host_memory_is_refused_and_a_handle_connects_once() {
        let t = CudaP2pTransport::new(CopyMode::Read);
        let mut l = t.listen().unwrap();
        let h = l.handle();
        let mut s = t.connect(&h, Instant::now()).unwrap();
        let e = t.connect(&h, Instant::now()).err().unwrap().to_string();
        assert!(e.contains("is not listening"), "{e}");
        let mut r = l.accept(Instant::now() + Duration::from_secs(1)).unwrap();
        let host = Memory::Host(tcpx_gpu::HostBuffer::new(4096).unwrap());
        assert!(s
            .reg_mr(&host)
            .err()
            .unwrap()
            .to_string()
            .contains("--memory cuda"));
        assert!(r.reg_mr(&host).is_err());
    }
}
