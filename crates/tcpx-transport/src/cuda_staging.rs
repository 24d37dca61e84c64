//! GPU memory over a host-memory backend: GPU -> pinned host -> backend -> pinned host -> GPU.
//!
//! [`CudaStaging`] wraps any [`Transport`] that moves host memory (the socket backend, say). GPU
//! memory ([`Memory::Cuda`]) registered on one of its comms is staged in page-locked host memory
//! that is registered with the inner comm instead, in one of two shapes:
//! - a **mirror** as large as each GPU buffer (the default): a request stages at its own offset;
//! - a **ring** of a fixed size per comm ([`CudaStaging::with_ring`]), shared by all GPU buffers
//!   of the comm: each request takes the next free range ([`crate::staging_ring`]) and gives it
//!   back when finished. A ring a few MiB long stays in the CPU's cache, so the network's copies
//!   in and out of it, and the GPU's copies, do not go to DRAM as a 256 MiB mirror's do.
//!
//! A send copies its range device -> staging on the comm's own CUDA stream and posts the inner
//! send when the copy has finished; a receive lands in staging and is reported done once the
//! staging -> device copy has finished. Each comm (one per channel) has its own stream, and every request is its own
//! copy, so with a window of several requests per channel the copies of some chunks overlap the
//! network transfer of others. Host memory passes straight through.
//!
//! Order is kept: inner sends are posted in the order the sends were posted (FIFO matching), and
//! inner receives are consumed in posting order. A test moves every receive of the comm along, so
//! each chunk's mirror -> device copy is queued as soon as its bytes have landed rather than when
//! it becomes the oldest.
//!
//! Not for: GPUs a backend can reach directly (GPUDirect-TCPX through `netplugin`), nor choosing
//! chunk sizes (`tcpx-sched`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::{Device, DeviceBuffer, GpuError, HostBuffer, HostCopy, HostPin, Stream};

use crate::staging_ring::RingRanges;
use crate::{
    consumed_before_done, Handle, Limits, Listener, Memory, MemoryKind, MrId, MrTable, RecvComm,
    RequestId, Result, SendComm, Transport, TransportError,
};

fn gpu_err(what: &str, e: GpuError) -> TransportError {
    TransportError::Failed(format!("{what}: {e}"))
}

/// A host-memory transport made to carry GPU memory through pinned staging buffers.
pub struct CudaStaging {
    inner: Arc<dyn Transport>,
    /// Bytes of each comm's staging ring; `None`: a mirror as large as each GPU buffer.
    ring: Option<usize>,
}

impl CudaStaging {
    /// Wraps `inner`, staging each GPU buffer through a mirror of its size. Each comm stages
    /// through the GPU of the first GPU buffer registered on it (its stream is made then); GPU
    /// buffers of other GPUs are refused on that comm.
    pub fn new(inner: Arc<dyn Transport>) -> Self {
        CudaStaging { inner, ring: None }
    }

    /// Stages through one ring of `bytes` per comm instead (`None`: mirrors). A request longer
    /// than the ring is refused, naming both sizes; with a window of several requests the ring
    /// should hold several of them for the copies to overlap the network.
    pub fn with_ring(mut self, bytes: Option<usize>) -> Self {
        self.ring = bytes;
        self
    }

    fn staged_send(&self, inner: Box<dyn SendComm>) -> Box<dyn SendComm> {
        Box::new(StagingSend {
            inner,
            mrs: Mrs::new(self.ring),
            queue: VecDeque::new(),
            next: 0,
            max_requests: self.inner.limits().max_requests.max(1),
        })
    }
}

impl Transport for CudaStaging {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn max_comms(&self) -> Option<usize> {
        self.inner.max_comms()
    }

    fn limits(&self) -> Limits {
        let mut l = self.inner.limits();
        if !l.memory.contains(&MemoryKind::Cuda) {
            l.memory.push(MemoryKind::Cuda);
        }
        l
    }

    fn listen(&self) -> Result<Box<dyn Listener>> {
        Ok(Box::new(StagingListener {
            inner: self.inner.listen()?,
            ring: self.ring,
        }))
    }

    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
        let inner = self.inner.connect(handle, deadline)?;
        Ok(self.staged_send(inner))
    }

    // A channel bound to a NIC stages through the host like any other: the NIC choice is the
    // inner backend's.
    fn listen_on(&self, local: std::net::IpAddr) -> Result<Box<dyn Listener>> {
        Ok(Box::new(StagingListener {
            inner: self.inner.listen_on(local)?,
            ring: self.ring,
        }))
    }

    fn connect_from(
        &self,
        handle: &Handle,
        local: std::net::IpAddr,
        deadline: Instant,
    ) -> Result<Box<dyn SendComm>> {
        let inner = self.inner.connect_from(handle, local, deadline)?;
        Ok(self.staged_send(inner))
    }

    fn activity(&self) -> u64 {
        self.inner.activity()
    }

    fn wait_activity(&self, seen: u64, timeout: Duration) {
        // GPU copies finishing do not bump the inner counter: wait only briefly, so a finished
        // copy is noticed within tens of microseconds rather than at the driver's full timeout.
        self.inner
            .wait_activity(seen, timeout.min(Duration::from_micros(20)));
    }
}

struct StagingListener {
    inner: Box<dyn Listener>,
    ring: Option<usize>,
}

impl Listener for StagingListener {
    fn handle(&self) -> Handle {
        self.inner.handle()
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let inner = self.inner.accept(deadline)?;
        Ok(Box::new(StagingRecv {
            inner,
            mrs: Mrs::new(self.ring),
            reqs: VecDeque::new(),
            next: 0,
        }))
    }
}

/// A registration: host memory passes through; GPU memory has a pinned mirror or uses the comm's
/// ring.
enum Reg {
    Host {
        inner: MrId,
    },
    Mirrored {
        inner: MrId,
        dev: Arc<DeviceBuffer>,
        mirror: Arc<HostBuffer>,
        _pin: HostPin,
    },
    Ringed {
        dev: Arc<DeviceBuffer>,
    },
}

/// A comm's staging ring: the pinned buffer, its registration with the inner comm, and which of
/// its ranges requests hold.
struct Ring {
    buf: Arc<HostBuffer>,
    _pin: HostPin,
    inner: MrId,
    ranges: RingRanges,
}

/// Where one request's bytes are staged: the inner registration and offset, and the ring range
/// it holds (given back when the request is finished).
#[derive(Clone, Copy)]
struct Stage {
    inner_mr: MrId,
    at: usize,
    range: Option<u64>,
}

/// The registrations of one comm, its stream (made at the first GPU registration, on that
/// buffer's GPU) and its ring, when it stages through one (made then too).
struct Mrs {
    stream: Option<Stream>,
    regs: MrTable<Reg>,
    ring_bytes: Option<usize>,
    ring: Option<Ring>,
}

impl Mrs {
    fn new(ring_bytes: Option<usize>) -> Self {
        Mrs {
            stream: None,
            regs: MrTable::default(),
            ring_bytes,
            ring: None,
        }
    }

    /// The comm's stream, on `device`: made now if this is the first GPU buffer.
    fn stream_for(&mut self, device: &Device) -> Result<&Stream> {
        if self.stream.is_none() {
            let s = device
                .new_stream()
                .map_err(|e| gpu_err("creating the comm's CUDA stream", e))?;
            self.stream = Some(s);
        }
        let s = self.stream.as_ref().expect("made above");
        if s.device().index() != device.index() {
            return Err(TransportError::Usage(format!(
                "GPU buffer on GPU {} registered on a comm staging through GPU {}",
                device.index(),
                s.device().index()
            )));
        }
        Ok(s)
    }

    /// The stream GPU requests use (there is one once a GPU buffer is registered).
    fn stream(&self) -> Result<&Stream> {
        self.stream
            .as_ref()
            .ok_or_else(|| TransportError::Usage("no GPU buffer is registered on this comm".into()))
    }

    /// Pinned host memory of `len` bytes on `device`, registered with the inner comm.
    fn pinned(
        device: &Device,
        len: usize,
        inner_reg: impl FnOnce(&Memory) -> Result<MrId>,
    ) -> Result<(Arc<HostBuffer>, HostPin, MrId)> {
        let buf = HostBuffer::new(len)?;
        // The copy engine reads each staged chunk as soon as it lands: keep it in the cache.
        buf.mark_read_at_once();
        let pin =
            HostPin::new(device, &buf).map_err(|e| gpu_err("pinning the staging buffer", e))?;
        let inner = inner_reg(&Memory::Host(Arc::clone(&buf)))?;
        Ok((buf, pin, inner))
    }

    fn reg(
        &mut self,
        mem: &Memory,
        inner_reg: impl FnOnce(&Memory) -> Result<MrId>,
    ) -> Result<MrId> {
        let reg = match mem {
            Memory::Cuda(dev) => {
                let device = self.stream_for(dev.device())?.device().clone();
                match self.ring_bytes {
                    Some(bytes) => {
                        if self.ring.is_none() {
                            let (buf, pin, inner) = Self::pinned(&device, bytes, inner_reg)?;
                            self.ring = Some(Ring {
                                buf,
                                _pin: pin,
                                inner,
                                ranges: RingRanges::new(bytes),
                            });
                        }
                        Reg::Ringed {
                            dev: Arc::clone(dev),
                        }
                    }
                    None => {
                        let (mirror, pin, inner) = Self::pinned(&device, dev.len(), inner_reg)?;
                        Reg::Mirrored {
                            inner,
                            dev: Arc::clone(dev),
                            mirror,
                            _pin: pin,
                        }
                    }
                }
            }
            other => Reg::Host {
                inner: inner_reg(other)?,
            },
        };
        Ok(self.regs.insert(reg))
    }

    fn get(&self, mr: MrId) -> Result<&Reg> {
        self.regs.get(mr)
    }

    fn ring(&mut self) -> Result<&mut Ring> {
        self.ring
            .as_mut()
            .ok_or_else(|| TransportError::Failed("the comm's staging ring is gone".into()))
    }

    /// Where a request of `len` bytes at `offset` of `mr` stages; `None` while the ring has no
    /// free range that long (older requests must finish first).
    fn stage(&mut self, mr: MrId, offset: usize, len: usize) -> Result<Option<Stage>> {
        let inner_mr = match self.get(mr)? {
            Reg::Host { inner } | Reg::Mirrored { inner, .. } => *inner,
            Reg::Ringed { .. } => {
                let ring = self.ring()?;
                let capacity = ring.ranges.capacity();
                if len > capacity {
                    return Err(TransportError::Usage(format!(
                        "a request of {len} bytes does not fit the staging ring of {capacity} bytes: \
                         raise the staging ring (--staging-ring) or lower the chunk size"
                    )));
                }
                let inner_mr = ring.inner;
                if len == 0 {
                    // Nothing to stage; the inner backend answers for an empty request.
                    return Ok(Some(Stage {
                        inner_mr,
                        at: 0,
                        range: None,
                    }));
                }
                let Some(r) = ring.ranges.take(len) else {
                    return Ok(None);
                };
                return Ok(Some(Stage {
                    inner_mr,
                    at: r.start,
                    range: Some(r.id),
                }));
            }
        };
        Ok(Some(Stage {
            inner_mr,
            at: offset,
            range: None,
        }))
    }

    /// Takes back a stage that was not used (the newest).
    fn unstage(&mut self, stage: Stage) {
        if let (Some(id), Some(ring)) = (stage.range, self.ring.as_mut()) {
            ring.ranges.untake(id);
        }
    }

    /// The request holding ring range `range` is finished with it.
    fn give_back(&mut self, range: Option<u64>) {
        if let (Some(id), Some(ring)) = (range, self.ring.as_mut()) {
            ring.ranges.give_back(id);
        }
    }

    /// The pinned buffer GPU registration `reg` stages in.
    fn staging_buf<'a>(&'a self, reg: &'a Reg) -> Result<&'a Arc<HostBuffer>> {
        match reg {
            Reg::Mirrored { mirror, .. } => Ok(mirror),
            Reg::Ringed { .. } => self
                .ring
                .as_ref()
                .map(|r| &r.buf)
                .ok_or_else(|| TransportError::Failed("the comm's staging ring is gone".into())),
            Reg::Host { .. } => Err(TransportError::Failed(
                "host memory has no staging buffer".into(),
            )),
        }
    }

    /// Forgets `mr` and drops its inner registration through `inner_dereg` (a ringed GPU
    /// buffer has none: its ring stays with the comm).
    fn dereg(&mut self, mr: MrId, inner_dereg: impl FnOnce(MrId) -> Result<()>) -> Result<()> {
        match self.regs.remove(mr)? {
            Reg::Host { inner } | Reg::Mirrored { inner, .. } => inner_dereg(inner),
            Reg::Ringed { .. } => Ok(()),
        }
    }
}

/// The GPU buffer of a staged registration; `None` for host memory.
fn gpu_buffer(reg: &Reg) -> Option<Arc<DeviceBuffer>> {
    match reg {
        Reg::Host { .. } => None,
        Reg::Mirrored { dev, .. } | Reg::Ringed { dev } => Some(Arc::clone(dev)),
    }
}

enum SendState {
    /// Device -> mirror copy in flight; the inner send is posted once it is done.
    Copying(HostCopy),
    /// Copy finished and its span given back; the inner comm was full when we tried to post.
    Ready,
    /// Posted on the inner comm.
    Posted(RequestId),
}

struct PendingSend {
    id: RequestId,
    /// Where the inner send reads.
    stage: Stage,
    len: usize,
    tag: u32,
    state: SendState,
}

struct StagingSend {
    inner: Box<dyn SendComm>,
    mrs: Mrs,
    /// Requests in posting order.
    queue: VecDeque<PendingSend>,
    next: u64,
    /// The inner backend's requests per comm: staging further ahead only queues copies early.
    max_requests: usize,
}

impl StagingSend {
    /// Posts inner sends for finished copies, oldest first, stopping at the first copy still
    /// running (or when the inner comm is full): the inner comm sees sends in posting order.
    fn pump(&mut self) -> Result<()> {
        for p in self.queue.iter_mut() {
            match &p.state {
                SendState::Posted(_) => continue,
                SendState::Copying(copy) => {
                    if !copy
                        .is_done()
                        .map_err(|e| gpu_err("device-to-host staging copy", e))?
                    {
                        break;
                    }
                    // Drop the finished copy first: it holds the mirror range, which the inner
                    // backend lends itself when we post.
                    p.state = SendState::Ready;
                }
                SendState::Ready => {}
            }
            match self
                .inner
                .isend(p.stage.inner_mr, p.stage.at, p.len, p.tag)?
            {
                Some(r) => p.state = SendState::Posted(r),
                None => break,
            }
        }
        Ok(())
    }
}

/// The methods of [`StagingSend`]'s and [`StagingRecv`]'s impls that are the same for both: the
/// staging registrations wrap the inner comm's, which also names the peer and counts its sockets.
macro_rules! staging_comm_methods {
    () => {
        fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
            let inner = &mut self.inner;
            self.mrs.reg(mem, |m| inner.reg_mr(m))
        }

        fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
            let inner = &mut self.inner;
            self.mrs.dereg(mr, |m| inner.dereg_mr(m))
        }

        fn peer(&self) -> String {
            self.inner.peer()
        }

        fn socket_stats(&self) -> Option<Vec<crate::SocketStat>> {
            self.inner.socket_stats()
        }
    };
}

impl SendComm for StagingSend {
    staging_comm_methods!();

    fn isend(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        let (stage, state) = match gpu_buffer(self.mrs.get(mr)?) {
            None => {
                if !self.queue.is_empty() {
                    // Keep FIFO order behind staged sends still copying.
                    self.pump()?;
                    if self
                        .queue
                        .iter()
                        .any(|p| !matches!(p.state, SendState::Posted(_)))
                    {
                        return Ok(None);
                    }
                }
                let Some(stage) = self.mrs.stage(mr, offset, len)? else {
                    return Ok(None);
                };
                match self.inner.isend(stage.inner_mr, stage.at, len, tag)? {
                    Some(r) => (stage, SendState::Posted(r)),
                    None => return Ok(None),
                }
            }
            Some(dev) => {
                if self.queue.len() >= self.max_requests {
                    self.pump()?;
                    return Ok(None);
                }
                let Some(stage) = self.mrs.stage(mr, offset, len)? else {
                    // The ring is full: its oldest sends must finish first.
                    self.pump()?;
                    return Ok(None);
                };
                // The backend may still hold this range from an earlier send of the same bytes
                // (its worker drops the span just after reporting done): try again later.
                let buf = self.mrs.staging_buf(self.mrs.get(mr)?)?;
                let Ok(span) = buf.span(stage.at, len) else {
                    self.mrs.unstage(stage);
                    return Ok(None);
                };
                let copy = self
                    .mrs
                    .stream()?
                    .copy_device_to_span(&dev, offset, span)
                    .map_err(|e| gpu_err("queuing the device-to-host staging copy", e))?;
                (stage, SendState::Copying(copy))
            }
        };
        let id = RequestId(self.next);
        self.next += 1;
        self.queue.push_back(PendingSend {
            id,
            stage,
            len,
            tag,
            state,
        });
        self.pump()?;
        Ok(Some(id))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.pump()?;
        let Some(pos) = self.queue.iter().position(|p| p.id == req) else {
            return Err(TransportError::Usage(format!(
                "send request {} is not pending",
                req.0
            )));
        };
        let SendState::Posted(inner) = self.queue[pos].state else {
            return Ok(None);
        };
        match self.inner.test(inner)? {
            Some(bytes) => {
                if let Some(p) = self.queue.remove(pos) {
                    self.mrs.give_back(p.stage.range);
                }
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }
}

enum RecvState {
    /// Posted on the inner comm, landing in the mirror (or in host memory).
    Receiving(RequestId),
    /// `n` bytes are in the mirror; the mirror -> device copy is not queued yet.
    Landed(usize),
    /// Mirror -> device copy in flight.
    Copying(HostCopy, usize),
    /// In place; waiting for `consume`.
    Done(usize),
}

struct PendingRecv {
    id: RequestId,
    mr: MrId,
    offset: usize,
    /// Where the inner receive lands.
    stage: Stage,
    state: RecvState,
    /// The inner request, once its test reported it done, until it is consumed (in order).
    inner_done: Option<RequestId>,
}

struct StagingRecv {
    inner: Box<dyn RecvComm>,
    mrs: Mrs,
    /// Receives in posting order.
    reqs: VecDeque<PendingRecv>,
    next: u64,
}

impl StagingRecv {
    /// Moves one receive as far as it goes now. Every receive whose bytes have landed gets its
    /// mirror -> device copy queued at once, not only the oldest, so the copies of a window run
    /// back to back on the stream while the network fills the next chunks.
    fn advance(&mut self, i: usize) -> Result<()> {
        let p = &mut self.reqs[i];
        loop {
            match &p.state {
                RecvState::Receiving(r) => {
                    let r = *r;
                    let Some(bytes) = self.inner.test(r)? else {
                        return Ok(());
                    };
                    // The inner request is consumed in posting order (FIFO), by `consume_inner`;
                    // the bytes stay where they landed until we copy them.
                    p.inner_done = Some(r);
                    p.state = match self.mrs.get(p.mr)? {
                        Reg::Host { .. } => RecvState::Done(bytes),
                        _ if bytes == 0 => RecvState::Done(0),
                        _ => RecvState::Landed(bytes),
                    };
                }
                RecvState::Landed(bytes) => {
                    let bytes = *bytes;
                    let reg = self.mrs.get(p.mr)?;
                    let Some(dev) = gpu_buffer(reg) else {
                        return Err(TransportError::Failed(
                            "staged receive lost its GPU registration".into(),
                        ));
                    };
                    // The backend's worker gives the range back just after reporting done; if it
                    // has not yet, try again on the next test.
                    let span = match self.mrs.staging_buf(reg)?.span(p.stage.at, bytes) {
                        Ok(s) => s,
                        Err(tcpx_gpu::MemError::Overlap { .. }) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    };
                    let copy = self
                        .mrs
                        .stream()?
                        .copy_span_to_device(span, &dev, p.offset)
                        .map_err(|e| gpu_err("queuing the host-to-device staging copy", e))?;
                    p.state = RecvState::Copying(copy, bytes);
                }
                RecvState::Copying(copy, bytes) => {
                    if !copy
                        .is_done()
                        .map_err(|e| gpu_err("host-to-device staging copy", e))?
                    {
                        return Ok(());
                    }
                    p.state = RecvState::Done(*bytes);
                }
                RecvState::Done(_) => return Ok(()),
            }
        }
    }

    /// Hands finished inner requests back, oldest first, stopping at the first still receiving.
    fn consume_inner(&mut self) -> Result<()> {
        for p in self.reqs.iter_mut() {
            if matches!(p.state, RecvState::Receiving(_)) {
                break;
            }
            if let Some(r) = p.inner_done.take() {
                self.inner.consume(r)?;
            }
        }
        Ok(())
    }
}

impl RecvComm for StagingRecv {
    staging_comm_methods!();

    fn irecv(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        let Some(stage) = self.mrs.stage(mr, offset, len)? else {
            return Ok(None);
        };
        if stage.range.is_some() {
            // A ring range reused: the backend may still hold it from the request that had it
            // before (its worker drops the span just after reporting done). Ask again later.
            let buf = self.mrs.staging_buf(self.mrs.get(mr)?)?;
            if buf.span(stage.at, len).is_err() {
                self.mrs.unstage(stage);
                return Ok(None);
            }
        }
        let Some(r) = self.inner.irecv(stage.inner_mr, stage.at, len, tag)? else {
            self.mrs.unstage(stage);
            return Ok(None);
        };
        let id = RequestId(self.next);
        self.next += 1;
        self.reqs.push_back(PendingRecv {
            id,
            mr,
            offset,
            stage,
            state: RecvState::Receiving(r),
            inner_done: None,
        });
        Ok(Some(id))
    }

    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        let Some(pos) = self.reqs.iter().position(|p| p.id == req) else {
            return Err(TransportError::Usage(format!(
                "receive request {} is not pending",
                req.0
            )));
        };
        // Inner receives finish in order: stop at the first one still receiving.
        for i in 0..self.reqs.len() {
            self.advance(i)?;
            if matches!(self.reqs[i].state, RecvState::Receiving(_)) {
                break;
            }
        }
        self.consume_inner()?;
        match self.reqs[pos].state {
            RecvState::Done(bytes) => Ok(Some(bytes)),
            _ => Ok(None),
        }
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.reqs.iter().position(|p| p.id == req) {
            Some(pos) if matches!(self.reqs[pos].state, RecvState::Done(_)) => {
                // Done implies its inner request was consumed: consume_inner ran in that test.
                if let Some(p) = self.reqs.remove(pos) {
                    self.mrs.give_back(p.stage.range);
                }
                Ok(())
            }
            Some(_) => Err(consumed_before_done(req)),
            None => Err(TransportError::Usage(format!(
                "receive request {} is not pending",
                req.0
            ))),
        }
    }
}
