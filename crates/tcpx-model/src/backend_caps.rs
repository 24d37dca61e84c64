//! What each backend can do, as plain data: the answers code above the transports asks for
//! instead of matching on a backend's name. `tcpx-transport`'s registry opens backends and checks
//! these answers against the opened transports (its tests); the limits an opened transport reports
//! may be tighter than the ones here.

use crate::Backend;

impl Backend {
    /// What this backend can do; the one place that says it.
    pub fn capabilities(self) -> Capabilities {
        match self {
            Backend::Socket => Capabilities {
                host_memory: true,
                gpu_memory: GpuMemoryPath::Staged,
                nics: NicPlacement::PerChannel,
                // Each socket, the clone its worker thread polls, and a wake-up socket pair per
                // worker thread (at most a thread per socket).
                open_files: OpenFileCost::Sockets { per_socket: 4 },
                threads: WorkerThreads::PerSocket,
                nccl: NcclEquivalent::Closest(
                    "tcpx-lab's own socket backend; NCCL's NET/Socket is the closest (NCCL picks it when no net plugin is loaded)",
                ),
                flows_per_process: None,
                max_requests: 32,
                max_request_bytes: i32::MAX as usize,
                default_chunk: DefaultChunk::AtMost(crate::DEFAULT_CHUNK),
            },
            Backend::NetPlugin => Capabilities {
                host_memory: true,
                gpu_memory: GpuMemoryPath::Direct,
                nics: NicPlacement::Itself(
                    "the netplugin backend picks its NICs itself (NCCL_GPUDIRECTTCPX_SOCKET_IFNAME in the experiment's env)",
                ),
                open_files: OpenFileCost::NotCounted,
                threads: WorkerThreads::PerChannel,
                nccl: NcclEquivalent::NetPlugin,
                flows_per_process: None,
                max_requests: 16,
                max_request_bytes: i32::MAX as usize,
                default_chunk: DefaultChunk::AtMost(crate::DEFAULT_CHUNK),
            },
            Backend::Nccl => Capabilities {
                host_memory: false,
                gpu_memory: GpuMemoryPath::Direct,
                nics: NicPlacement::Itself(
                    "NCCL picks its NICs itself (NCCL_SOCKET_IFNAME / NCCL_GPUDIRECTTCPX_SOCKET_IFNAME in the experiment's env)",
                ),
                open_files: OpenFileCost::NotCounted,
                threads: WorkerThreads::PerChannel,
                nccl: NcclEquivalent::Itself,
                flows_per_process: Some(1),
                max_requests: 32,
                max_request_bytes: usize::MAX >> 1,
                // NCCL cuts a message into its own network chunks (NCCL_P2P_NET_CHUNKSIZE) and
                // pipelines them; one ncclSend per 512 KiB piece on top of that halved NCCL's
                // throughput once NCCL was tuned (docs/PERFORMANCE.md, one H100, 2026-11-24).
                default_chunk: DefaultChunk::WholeMessage,
            },
            Backend::CudaP2p => Capabilities {
                host_memory: false,
                gpu_memory: GpuMemoryPath::Direct,
                nics: NicPlacement::NoNic(
                    "cudap2p copies between GPUs of one node: no NIC is involved",
                ),
                open_files: OpenFileCost::NotCounted,
                threads: WorkerThreads::PerChannel,
                nccl: NcclEquivalent::Closest(
                    "GPU-to-GPU copies inside one node: NCCL chooses P2P/NVLink itself",
                ),
                flows_per_process: None,
                max_requests: 32,
                max_request_bytes: i32::MAX as usize,
                default_chunk: DefaultChunk::AtMost(crate::DEFAULT_CHUNK),
            },
        }
    }
}

/// What a backend can do (see [`Backend::capabilities`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// It moves host memory.
    pub host_memory: bool,
    /// How GPU memory reaches it.
    pub gpu_memory: GpuMemoryPath,
    /// Who puts a channel on a NIC.
    pub nics: NicPlacement,
    /// What a comm costs in this process's open files.
    pub open_files: OpenFileCost,
    /// How many threads move a channel's bytes (what a configuration costs in CPUs).
    pub threads: WorkerThreads,
    /// What NCCL runs for the same thing (for tuned.env).
    pub nccl: NcclEquivalent,
    /// Flows one process may carry; `None`: no limit of its own.
    pub flows_per_process: Option<u32>,
    /// Requests in flight per comm, at most (before opening; an opened transport may allow fewer).
    pub max_requests: usize,
    /// Bytes per request, at most (before opening).
    pub max_request_bytes: usize,
    /// Bytes per request when the experiment leaves `chunk` at auto.
    pub default_chunk: DefaultChunk,
}

impl Capabilities {
    /// Whether the backend is a net plugin NCCL loads (GPUDirect-TCPX's): loaded once per
    /// process, initialised from that process's environment, with its own dynamic chunk.
    pub fn loads_a_net_plugin(&self) -> bool {
        self.nccl == NcclEquivalent::NetPlugin
    }

    /// Whether the backend is libnccl itself: where it opens, NCCL's own communicators run in
    /// this process (what a NCCL validation run needs).
    pub fn is_libnccl(&self) -> bool {
        self.nccl == NcclEquivalent::Itself
    }

    /// Whether its bytes go through sockets that take `zero_copy_min` (MSG_ZEROCOPY from that
    /// size on): its own sockets, one set per channel on the NIC given, or a net plugin's, which
    /// takes the threshold through its variable. libnccl's sockets and GPU copies do not.
    pub fn takes_zero_copy(&self) -> bool {
        self.nics == NicPlacement::PerChannel || self.loads_a_net_plugin()
    }

    /// Whether it copies between GPUs of one node, no NIC involved: a run's route is the path
    /// between the two GPUs (NVLink or PCIe), not a NIC.
    pub fn copies_between_gpus(&self) -> bool {
        matches!(self.nics, NicPlacement::NoNic(_))
    }
}

/// A backend's bytes per request when the experiment gives none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultChunk {
    /// This many bytes, or the whole message where it is smaller.
    AtMost(u64),
    /// The whole message in one request: the backend pipelines it itself.
    WholeMessage,
}

impl DefaultChunk {
    /// Bytes per request for a message of `size` bytes.
    pub fn for_size(self, size: u64) -> u64 {
        match self {
            DefaultChunk::AtMost(c) => c.min(size),
            DefaultChunk::WholeMessage => size,
        }
    }

    /// How the default reads in a report: `min(512K, size)` or `the whole message`.
    pub fn describe(self) -> String {
        match self {
            DefaultChunk::AtMost(c) => format!("min({}, size)", crate::format_size(c)),
            DefaultChunk::WholeMessage => "the whole message".to_string(),
        }
    }
}

/// How GPU memory reaches a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMemoryPath {
    /// It moves host memory only: the transport registry puts pinned host staging in front of
    /// it.
    Staged,
    /// It takes GPU memory itself (a plugin registers it, libnccl and CUDA copies read it).
    Direct,
}

/// Who puts a channel on a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NicPlacement {
    /// Each channel binds to the NIC it is given (`Transport::listen_on` / `connect_from`).
    PerChannel,
    /// The backend picks its NICs itself; the text says how to steer it.
    Itself(&'static str),
    /// No NIC is involved; the text says why.
    NoNic(&'static str),
}

impl NicPlacement {
    /// Why a NIC choice given for this backend is not applied; `None` where channels take it.
    pub fn not_applied(self) -> Option<&'static str> {
        match self {
            NicPlacement::PerChannel => None,
            NicPlacement::Itself(why) | NicPlacement::NoNic(why) => Some(why),
        }
    }
}

/// How many threads move a channel's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerThreads {
    /// A worker thread per socket.
    PerSocket,
    /// One thread per channel (the backend's own progress, or the caller's).
    PerChannel,
}

impl WorkerThreads {
    /// Threads of `channels` channels of `socks` sockets each.
    pub fn of(self, channels: u64, socks: u64) -> u64 {
        match self {
            WorkerThreads::PerSocket => channels.saturating_mul(socks),
            WorkerThreads::PerChannel => channels,
        }
    }
}

/// What one comm costs in open files, for the open-file budget (`ulimit -n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFileCost {
    /// `per_socket` files for each of its sockets, plus one listening socket while it is set
    /// up.
    Sockets { per_socket: u64 },
    /// The backend opens its own files (a plugin's, libnccl's); they are not guessed.
    NotCounted,
}

impl OpenFileCost {
    /// Files one comm of `socks` sockets holds; `None` where not counted.
    pub fn per_comm(self, socks: u64) -> Option<u64> {
        match self {
            OpenFileCost::Sockets { per_socket } => {
                Some(socks.saturating_mul(per_socket).saturating_add(1))
            }
            OpenFileCost::NotCounted => None,
        }
    }
}

/// What NCCL runs for what a backend does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclEquivalent {
    /// The same plugin, which NCCL loads through `NCCL_NET_PLUGIN`.
    NetPlugin,
    /// The backend is libnccl itself.
    Itself,
    /// No NCCL setting selects it; the text says what comes closest.
    Closest(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each question's answer per backend: the place that decides by a backend's name is
    /// `Backend::capabilities`, and these follow from it.
    #[test]
    fn capability_questions_answer_per_backend() {
        let answers = |f: fn(&Capabilities) -> bool| {
            Backend::ALL
                .into_iter()
                .filter(|b| f(&b.capabilities()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            answers(Capabilities::loads_a_net_plugin),
            [Backend::NetPlugin]
        );
        assert_eq!(answers(Capabilities::is_libnccl), [Backend::Nccl]);
        assert_eq!(
            answers(Capabilities::takes_zero_copy),
            [Backend::Socket, Backend::NetPlugin]
        );
        assert_eq!(
            answers(Capabilities::copies_between_gpus),
            [Backend::CudaP2p]
        );
    }
}
