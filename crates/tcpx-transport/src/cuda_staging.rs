//! GPU memory over a host-memory backend: GPU -> pinned host -> backend -> pinned host -> GPU.
//!
//! [`CudaStaging`] wraps any [`Transport`] that moves host memory (the socket backend, say). When
//! [`Memory::Cuda`] is registered on one of its comms it allocates a page-locked host mirror of
//! the device buffer and registers that with the inner comm instead. A send copies its range
//! device -> mirror on the comm's own CUDA stream and posts the inner send when the copy has
//! finished; a receive lands in the mirror and is reported done once the mirror -> device copy
//! has finished. Each comm (one per channel) has its own stream, and every request is its own
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

use crate::{
    Handle, Limits, Listener, Memory, MemoryKind, MrId, MrTable, RecvComm, RequestId, Result,
    SendComm, Transport, TransportError,
};

fn gpu_err(what: &str, e: GpuError) -> TransportError {
    TransportError::Failed(format!("{what}: {e}"))
}

/// A host-memory transport made to carry GPU memory through pinned staging buffers.
pub struct CudaStaging {
    inner: Arc<dyn Transport>,
}

impl CudaStaging {
    /// Wraps `inner`. Each comm stages through the GPU of the first GPU buffer registered on it
    /// (its stream is made then); GPU buffers of other GPUs are refused on that comm.
    pub fn new(inner: Arc<dyn Transport>) -> Self {
        CudaStaging { inner }
    }

    fn staged_send(&self, inner: Box<dyn SendComm>) -> Box<dyn SendComm> {
        Box::new(StagingSend {
            inner,
            mrs: Mrs::default(),
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
}

impl Listener for StagingListener {
    fn handle(&self) -> Handle {
        self.inner.handle()
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let inner = self.inner.accept(deadline)?;
        Ok(Box::new(StagingRecv {
            inner,
            mrs: Mrs::default(),
            reqs: VecDeque::new(),
            next: 0,
        }))
    }
}

/// A registration: host memory passes through; GPU memory has a pinned mirror.
enum Reg {
    Host {
        inner: MrId,
    },
    Cuda {
        inner: MrId,
        dev: Arc<DeviceBuffer>,
        mirror: Arc<HostBuffer>,
        _pin: HostPin,
    },
}

/// The registrations of one comm, and its stream (made at the first GPU registration, on that
/// buffer's GPU).
#[derive(Default)]
struct Mrs {
    stream: Option<Stream>,
    regs: MrTable<Reg>,
}

impl Mrs {
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

    fn reg(
        &mut self,
        mem: &Memory,
        inner_reg: impl FnOnce(&Memory) -> Result<MrId>,
    ) -> Result<MrId> {
        let reg = match mem {
            Memory::Cuda(dev) => {
                let device = self.stream_for(dev.device())?.device().clone();
                let mirror = HostBuffer::new(dev.len())?;
                let pin = HostPin::new(&device, &mirror)
                    .map_err(|e| gpu_err("pinning the staging buffer", e))?;
                let inner = inner_reg(&Memory::Host(Arc::clone(&mirror)))?;
                Reg::Cuda {
                    inner,
                    dev: Arc::clone(dev),
                    mirror,
                    _pin: pin,
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

    fn dereg(&mut self, mr: MrId) -> Result<MrId> {
        self.regs.remove(mr).map(|reg| inner_mr(&reg))
    }
}

fn inner_mr(reg: &Reg) -> MrId {
    match reg {
        Reg::Host { inner } | Reg::Cuda { inner, .. } => *inner,
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
    inner_mr: MrId,
    offset: usize,
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
            match self.inner.isend(p.inner_mr, p.offset, p.len, p.tag)? {
                Some(r) => p.state = SendState::Posted(r),
                None => break,
            }
        }
        Ok(())
    }
}

impl SendComm for StagingSend {
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        let inner = &mut self.inner;
        self.mrs.reg(mem, |m| inner.reg_mr(m))
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        let inner = self.mrs.dereg(mr)?;
        self.inner.dereg_mr(inner)
    }

    fn isend(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        let reg = self.mrs.get(mr)?;
        let inner_mr = inner_mr(reg);
        let state = match reg {
            Reg::Host { .. } => {
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
                match self.inner.isend(inner_mr, offset, len, tag)? {
                    Some(r) => SendState::Posted(r),
                    None => return Ok(None),
                }
            }
            Reg::Cuda { dev, mirror, .. } => {
                if self.queue.len() >= self.max_requests {
                    self.pump()?;
                    return Ok(None);
                }
                // The backend may still hold this range from an earlier send of the same bytes
                // (its worker drops the span just after reporting done): try again later.
                let Ok(span) = mirror.span(offset, len) else {
                    return Ok(None);
                };
                let copy = self
                    .mrs
                    .stream()?
                    .copy_device_to_span(dev, offset, span)
                    .map_err(|e| gpu_err("queuing the device-to-host staging copy", e))?;
                SendState::Copying(copy)
            }
        };
        let id = RequestId(self.next);
        self.next += 1;
        self.queue.push_back(PendingSend {
            id,
            inner_mr,
            offset,
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
                self.queue.remove(pos);
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }

    fn peer(&self) -> String {
        self.inner.peer()
    }

    fn socket_stats(&self) -> Option<Vec<crate::SocketStat>> {
        self.inner.socket_stats()
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
                        Reg::Cuda { .. } if bytes == 0 => RecvState::Done(0),
                        Reg::Cuda { .. } => RecvState::Landed(bytes),
                    };
                }
                RecvState::Landed(bytes) => {
                    let bytes = *bytes;
                    let Reg::Cuda { dev, mirror, .. } = self.mrs.get(p.mr)? else {
                        return Err(TransportError::Failed(
                            "staged receive lost its GPU registration".into(),
                        ));
                    };
                    // The backend's worker gives the range back just after reporting done; if it
                    // has not yet, try again on the next test.
                    let span = match mirror.span(p.offset, bytes) {
                        Ok(s) => s,
                        Err(tcpx_gpu::MemError::Overlap { .. }) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    };
                    let copy = self
                        .mrs
                        .stream()?
                        .copy_span_to_device(span, dev, p.offset)
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
    fn reg_mr(&mut self, mem: &Memory) -> Result<MrId> {
        let inner = &mut self.inner;
        self.mrs.reg(mem, |m| inner.reg_mr(m))
    }

    fn dereg_mr(&mut self, mr: MrId) -> Result<()> {
        let inner = self.mrs.dereg(mr)?;
        self.inner.dereg_mr(inner)
    }

    fn irecv(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<RequestId>> {
        let inner_mr = inner_mr(self.mrs.get(mr)?);
        let Some(r) = self.inner.irecv(inner_mr, offset, len, tag)? else {
            return Ok(None);
        };
        let id = RequestId(self.next);
        self.next += 1;
        self.reqs.push_back(PendingRecv {
            id,
            mr,
            offset,
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
                self.reqs.remove(pos);
                Ok(())
            }
            Some(_) => Err(TransportError::Usage(format!(
                "receive {} consumed before its test reported it done",
                req.0
            ))),
            None => Err(TransportError::Usage(format!(
                "receive request {} is not pending",
                req.0
            ))),
        }
    }

    fn peer(&self) -> String {
        self.inner.peer()
    }

    fn socket_stats(&self) -> Option<Vec<crate::SocketStat>> {
        self.inner.socket_stats()
    }
}
