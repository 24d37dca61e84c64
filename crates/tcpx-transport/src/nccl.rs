//! Backend `nccl`: libnccl's ncclSend/ncclRecv behind the [`Transport`] trait, the in-tool
//! reference the other backends are compared with.
//!
//! Each comm is a 2-rank NCCL communicator: `listen` makes an `ncclUniqueId` (128 bytes, exactly
//! a handle's maximum), the listener is rank 0 and the connecting side rank 1. Requests are
//! ncclSend/ncclRecv of bytes on the comm's own CUDA stream; a CUDA event recorded after each one
//! tells `test` when it finished. NCCL delivers sends to one peer in order, which is the FIFO
//! matching the trait promises. GPU memory only ([`Memory::Cuda`]); which NCCL transport carries
//! the bytes (NET/Socket, a net plugin, P2P) is NCCL's choice, steered by its environment
//! (`NCCL_NET`, `NCCL_NET_PLUGIN`, `NCCL_P2P_DISABLE`, ...), which NCCL reads once per process.
//!
//! One GPU can carry both ranks when each runs in a process of its own as its own NCCL host:
//! NCCL refuses two ranks on one GPU only when their host hashes match, and `NCCL_HOSTID` sets
//! the hash. [`shared_gpu_host_ids`] is the one assignment every caller uses (the bench's flow
//! processes, `tcpx-run validate`, tcpx-gpu-bench and its tests); NCCL then sees two nodes and
//! carries the bytes over its network transport (NET/Socket or a net plugin).
//!
//! A process running libnccl has its own needs: its environment, a host id when it shares a
//! GPU, a log that says which network NCCL used ([`process`], [`log`]).
//!
//! Not for: collectives (the benchmark calls `tcpx_ffi::nccl` directly for all-reduce).

pub mod log;
pub mod process;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_ffi::nccl::{Comm, Nccl, NcclError, NcclUniqueId, NCCL_UNIQUE_ID_BYTES};
use tcpx_gpu::{Device, DeviceBuffer, Event, Stream};

use crate::backend::{self, Backend};
use crate::comm_end::{CommEnd, ReceivingEnd, SendingEnd};
use crate::{
    consumed_before_done, Handle, Limits, Listener, Memory, MrId, MrTable, RecvComm, RequestId,
    Result, SendComm, Transport, TransportError,
};

/// Requests in flight per comm, at most.
pub const MAX_REQUESTS: usize = 32;

/// The variable NCCL hashes into a rank's host identity.
pub const HOSTID_VAR: &str = "NCCL_HOSTID";

/// The `NCCL_HOSTID` of each of `ranks` rank processes sharing one GPU: distinct, so that NCCL's
/// host hashes differ and it treats them as nodes of their own (it refuses two ranks on one GPU
/// only within one host). Rank `r` (the listener is rank 0) gets element `r`.
pub fn shared_gpu_host_ids(ranks: usize) -> Vec<String> {
    (0..ranks).map(|r| format!("tcpx-lab-host{r}")).collect()
}

/// What the output says when ranks share GPU `gpu` as NCCL hosts `host_ids`: "1 GPU as 2 NCCL
/// hosts (GPU 0, NCCL_HOSTID tcpx-lab-host0 and tcpx-lab-host1)".
pub fn describe_shared_gpu(gpu: usize, host_ids: &[String]) -> String {
    format!(
        "1 GPU as {} NCCL hosts (GPU {gpu}, {HOSTID_VAR} {})",
        host_ids.len(),
        host_ids.join(" and ")
    )
}

fn nccl_err(e: NcclError) -> TransportError {
    match e {
        NcclError::Timeout { what, after } => TransportError::Timeout {
            what: what.to_string(),
            secs: after.as_secs_f64(),
            hint: "is the peer running and connecting with the same handle? NCCL_DEBUG=WARN shows NCCL's view".into(),
        },
        other => TransportError::Failed(other.to_string()),
    }
}

/// [`nccl_err`] for a failed `ncclCommInitRank`, with what to check when both ranks share a GPU.
fn init_err(e: NcclError) -> TransportError {
    match nccl_err(e) {
        TransportError::Failed(m) => TransportError::Failed(format!(
            "{m}; if both ranks run on one GPU, each process must be an NCCL host of its own \
             ({HOSTID_VAR} set differently per process; a local `tcpx-run bench` does that itself)"
        )),
        other => other,
    }
}

/// NCCL as a transport, on one GPU of this process.
pub struct NcclTransport {
    nccl: &'static Nccl,
    device: Device,
}

impl NcclTransport {
    /// Loads libnccl (see `tcpx_ffi::nccl::Nccl::load`); comms will run on `device`.
    pub fn new(device: Device) -> Result<Self> {
        let nccl = Nccl::load().map_err(|e| TransportError::Unavailable {
            name: "nccl".into(),
            reason: e.to_string(),
        })?;
        Ok(NcclTransport { nccl, device })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

impl Transport for NcclTransport {
    fn name(&self) -> &str {
        Backend::Nccl.name()
    }

    fn limits(&self) -> Limits {
        backend::limits(Backend::Nccl)
    }

    fn listen(&self) -> Result<Box<dyn Listener>> {
        let id = self.nccl.unique_id().map_err(nccl_err)?;
        Ok(Box::new(NcclListener {
            nccl: self.nccl,
            device: self.device.clone(),
            id,
        }))
    }

    fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
        let bytes: &[u8; NCCL_UNIQUE_ID_BYTES] = handle.as_bytes().try_into().map_err(|_| {
            TransportError::Protocol(format!(
                "an nccl handle has {NCCL_UNIQUE_ID_BYTES} bytes, this one {}",
                handle.as_bytes().len()
            ))
        })?;
        let id = NcclUniqueId::from_bytes(bytes);
        let end = NcclSide::join(self.nccl, &self.device, &id, true, deadline)?;
        Ok(Box::new(SendingEnd(end)))
    }
}

struct NcclListener {
    nccl: &'static Nccl,
    device: Device,
    id: NcclUniqueId,
}

impl Listener for NcclListener {
    fn handle(&self) -> Handle {
        Handle::from_bytes(self.id.to_bytes().to_vec()).expect("128 bytes fit a handle")
    }

    fn accept(&mut self, deadline: Instant) -> Result<Box<dyn RecvComm>> {
        let end = NcclSide::join(self.nccl, &self.device, &self.id, false, deadline)?;
        Ok(Box::new(ReceivingEnd(end)))
    }
}

/// One end of a comm; the same state serves both directions.
struct NcclSide {
    nccl: &'static Nccl,
    comm: Comm,
    peer_rank: usize,
    /// Whether this end sends (else it receives).
    sends: bool,
    stream: Stream,
    mrs: MrTable<Arc<DeviceBuffer>>,
    /// Requests in posting order: id, completion event, bytes, done (tested) yet.
    reqs: VecDeque<(RequestId, Event, usize, bool)>,
    next: u64,
}

impl NcclSide {
    /// Joins the two-rank comm `id` on `device`: the sender (the connecting side) as rank 1, the
    /// receiver (the listener) as rank 0.
    fn join(
        nccl: &'static Nccl,
        device: &Device,
        id: &NcclUniqueId,
        sends: bool,
        deadline: Instant,
    ) -> Result<Self> {
        let (rank, peer_rank) = if sends { (1, 0) } else { (0, 1) };
        let comm =
            Comm::init_rank(nccl, device, 2, rank, id, remaining(deadline)).map_err(init_err)?;
        let stream = comm
            .device()
            .new_stream()
            .map_err(|e| TransportError::Failed(format!("creating the comm's CUDA stream: {e}")))?;
        Ok(NcclSide {
            nccl,
            comm,
            peer_rank,
            sends,
            stream,
            mrs: MrTable::default(),
            reqs: VecDeque::new(),
            next: 0,
        })
    }
}

impl CommEnd for NcclSide {
    fn reg(&mut self, mem: &Memory) -> Result<MrId> {
        match mem {
            Memory::Cuda(b) if b.device().index() == self.comm.device().index() => {
                Ok(self.mrs.insert(Arc::clone(b)))
            }
            Memory::Cuda(b) => Err(TransportError::Usage(format!(
                "GPU buffer on GPU {} registered on an nccl comm of GPU {}",
                b.device().index(),
                self.comm.device().index()
            ))),
            _ => Err(TransportError::Usage(
                "the nccl backend moves GPU memory only (--memory cuda)".into(),
            )),
        }
    }

    fn dereg(&mut self, mr: MrId) -> Result<()> {
        self.mrs.remove(mr).map(drop)
    }

    fn post(&mut self, mr: MrId, offset: usize, len: usize) -> Result<Option<RequestId>> {
        let send = self.sends;
        if self.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        if len == 0 {
            return Err(TransportError::Usage("request of 0 bytes".into()));
        }
        let buf = Arc::clone(self.mrs.get(mr)?);
        let (comm, stream, peer) = (&mut self.comm, &self.stream, self.peer_rank);
        self.nccl
            .group(|| {
                if send {
                    comm.send(&buf, offset, len, peer, stream)
                } else {
                    comm.recv(&buf, offset, len, peer, stream)
                }
            })
            .map_err(nccl_err)?;
        self.comm
            .wait_ready(
                if send { "ncclSend" } else { "ncclRecv" },
                Duration::from_secs(30),
            )
            .map_err(nccl_err)?;
        let ev = self
            .stream
            .record()
            .map_err(|e| TransportError::Failed(format!("recording a CUDA event: {e}")))?;
        let id = RequestId(self.next);
        self.next += 1;
        self.reqs.push_back((id, ev, len, false));
        Ok(Some(id))
    }

    /// A send is forgotten once done, a receive when consumed.
    fn test(&mut self, req: RequestId) -> Result<Option<usize>> {
        self.comm.async_error().map_err(nccl_err)?;
        let Some(pos) = self.reqs.iter().position(|r| r.0 == req) else {
            return Err(TransportError::Usage(format!(
                "request {} is not pending on this comm",
                req.0
            )));
        };
        let done = self.reqs[pos]
            .1
            .is_complete()
            .map_err(|e| TransportError::Failed(format!("querying a CUDA event: {e}")))?;
        if !done {
            return Ok(None);
        }
        let bytes = self.reqs[pos].2;
        if self.sends {
            self.reqs.remove(pos);
        } else {
            self.reqs[pos].3 = true;
        }
        Ok(Some(bytes))
    }

    fn consume(&mut self, req: RequestId) -> Result<()> {
        match self.reqs.front() {
            Some((id, _, _, true)) if *id == req => {
                self.reqs.pop_front();
                Ok(())
            }
            Some((id, ..)) if *id == req => Err(consumed_before_done(req)),
            _ => Err(TransportError::Usage(format!(
                "receive {} consumed out of FIFO order",
                req.0
            ))),
        }
    }

    fn peer(&self) -> String {
        format!(
            "nccl rank {} (GPU {} here)",
            self.peer_rank,
            self.comm.device().index()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryKind;

    #[test]
    fn missing_nccl_or_gpu_is_reported_as_unavailable() {
        match crate::open("nccl", crate::socket::SocketConfig::default()) {
            Err(TransportError::Unavailable { name, reason }) => {
                assert_eq!(name, "nccl");
                assert!(
                    reason.contains("libnccl")
                        || reason.contains("GPU")
                        || reason.contains("libcuda"),
                    "{reason}"
                );
            }
            Ok(t) => {
                // A machine with libnccl and a GPU: the backend is real.
                assert_eq!(t.name(), "nccl");
                assert_eq!(t.limits().memory, vec![MemoryKind::Cuda]);
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn ranks_sharing_a_gpu_get_distinct_host_ids_and_say_so() {
        let ids = shared_gpu_host_ids(2);
        assert_eq!(ids, ["tcpx-lab-host0", "tcpx-lab-host1"]);
        let four = shared_gpu_host_ids(4);
        let mut unique = four.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 4, "{four:?}");
        // The first two are the same whatever the count: a 2-rank run and a 4-rank run agree.
        assert_eq!(four[..2], ids[..]);
        assert_eq!(
            describe_shared_gpu(0, &ids),
            "1 GPU as 2 NCCL hosts (GPU 0, NCCL_HOSTID tcpx-lab-host0 and tcpx-lab-host1)"
        );
    }

    #[test]
    fn a_failed_init_says_what_two_ranks_on_one_gpu_need() {
        let failed = init_err(NcclError::Argument("duplicate GPU".into())).to_string();
        assert!(failed.contains("duplicate GPU"), "{failed}");
        assert!(
            failed.contains("NCCL_HOSTID set differently per process"),
            "{failed}"
        );
        // A timeout stays a timeout, with its own hint.
        let t = init_err(NcclError::Timeout {
            what: "ncclCommInitRank",
            after: Duration::from_secs(3),
        });
        assert!(matches!(t, TransportError::Timeout { .. }), "{t}");
    }

    #[test]
    fn a_handle_of_the_wrong_size_is_refused_before_nccl() {
        let h = Handle::from_bytes(vec![1, 2, 3]).unwrap();
        let e = NcclUniqueId::from_bytes(&[0; NCCL_UNIQUE_ID_BYTES]);
        assert_eq!(e.to_bytes().len(), 128);
        let bytes: std::result::Result<&[u8; NCCL_UNIQUE_ID_BYTES], _> = h.as_bytes().try_into();
        assert!(bytes.is_err());
    }
}
