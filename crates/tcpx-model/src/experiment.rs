//! [`Experiment`]: everything that defines one bench run, as both sides must hold it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{format_size, Backend, CpuSet, Memory, NicPolicy};

/// Default chunk when none is given.
pub const DEFAULT_CHUNK: u64 = 512 * 1024;
/// Most memory one side may ask for, to catch typos like `--size 1T` before allocating.
pub const MAX_BYTES_PER_SIDE: u64 = 64 << 30;
/// Longest `timeout_s` accepted (a day): longer waits are typos, and every timeout must fit a
/// `Duration` and the kernel's socket timeouts.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;
/// Largest `sock_buf`: `setsockopt` takes a C `int` and the kernel doubles it, so anything above
/// `INT_MAX / 2` would be cut or wrap instead of being granted.
pub const MAX_SOCK_BUF: u64 = (i32::MAX / 2) as u64;
/// Most timed iterations per size (their timings are kept in memory).
pub const MAX_ITERS: u32 = 1_000_000;
/// Most untimed iterations per size.
pub const MAX_WARMUP: u32 = 100_000;
/// Smallest `zero_copy_min`: below a page, lending pages to the kernel costs more than copying.
pub const MIN_ZERO_COPY: u64 = 4096;
/// Largest `zero_copy_min`.
pub const MAX_ZERO_COPY: u64 = 1 << 30;
/// Smallest `staging_ring`: a ring holds at least one chunk, and chunks below this cost more
/// per byte than staging saves.
pub const MIN_STAGING_RING: u64 = 64 << 10;
/// Largest `staging_ring`.
pub const MAX_STAGING_RING: u64 = 1 << 30;
/// The smallest ring `staging_ring`'s auto picks (unless the largest message is smaller):
/// 32-64 MiB rings of 4-16 MiB chunks measured best at 16 sockets on a 300 MiB-L3 host
/// (docs/perf-data/PERFORMANCE-history-2026-11.md, "Issue 26, fourth pass").
pub const AUTO_STAGING_RING_MIN: u64 = 32 << 20;
/// Chunks an auto staging ring holds at least, so copies overlap the network.
pub const AUTO_STAGING_RING_CHUNKS: u64 = 4;
/// Most chunks one transfer is cut into; keeps a schedule's per-channel index lists small.
pub const MAX_CHUNKS: u64 = 1 << 24;

/// Where memory lives, as a backend states what it can move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Host,
    Cuda,
}

/// What a backend can do; an experiment is checked against it before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests in flight per comm, at most.
    pub max_requests: usize,
    /// Bytes per request, at most.
    pub max_request_bytes: usize,
    /// Memory kinds requests may use.
    pub memory: Vec<MemoryKind>,
}

crate::outside::word_enum!(
    /// Where a message size's start barrier falls: before every iteration (each timed alone,
    /// from an idle start), or once before the timed iterations, which then run back to back
    /// as one transfer, the next posted while this one drains (how nccl-tests times: its
    /// iterations are queued without a barrier between them). Each iteration's time is then
    /// the gap between the ends of consecutive iterations on that side.
    Barrier, "barrier",
    Iteration = "iteration",
    Size = "size"
);

impl Barrier {
    /// Whether this is the default, which JSON leaves out.
    pub fn is_iteration(&self) -> bool {
        *self == Barrier::Iteration
    }
}

crate::outside::word_enum!(
    /// Where the socket backend's worker threads run. `own`: each worker thread takes a CPU of
    /// its own among those its side may use (the one with the fewest of this process's workers),
    /// so that two busy workers never share a CPU while another idles; `shared`: the workers
    /// share their side's CPUs and the kernel places them; `auto`: `own` where the side may use
    /// [`OWN_CPUS_FROM`] or more CPUs, all in one NUMA node, and a comm's workers are at least
    /// half of them (the two sides of a loopback transfer fill the CPUs), else `shared`.
    WorkerCpus, "worker_cpus",
    Auto = "auto",
    Own = "own",
    Shared = "shared"
);

impl WorkerCpus {
    /// Whether this is the default, which JSON leaves out.
    pub fn is_auto(&self) -> bool {
        *self == WorkerCpus::Auto
    }

    /// Whether the `workers` threads of a comm take a CPU each, on a side that may use `cpus`
    /// CPUs, of which `one_numa_node` says whether they all lie in one NUMA node.
    pub fn own_cpus(self, cpus: usize, workers: usize, one_numa_node: bool) -> bool {
        match self {
            WorkerCpus::Own => true,
            WorkerCpus::Shared => false,
            WorkerCpus::Auto => {
                cpus >= OWN_CPUS_FROM && workers.saturating_mul(2) >= cpus && one_numa_node
            }
        }
    }
}

/// CPUs a side may use from which `worker_cpus = auto` gives each worker thread its own, when a
/// comm's workers are at least half of them. On the 16-CPU H200 host (2026-11-29, three calls on
/// three hosts, docs/perf-data/issue40-h200-2026-11-29-s14/) a CPU each moved 16 sockets 1.08x
/// (median of 11 repetitions, 0.93-1.16), 8 sockets 1.04x (0.97-1.11) and GPU staging at 16
/// sockets 1.06x (0.89-1.26) of the kernel's placement, where 4 sockets lost (0.96x, 0.92-1.16)
/// and 1 socket was noise: few workers find idle CPUs by themselves. Smaller machines run a
/// thread per socket, more threads than CPUs: not measured there. Across NUMA nodes the kernel's
/// placement is kept, since which node is near the NIC is the `thread_binding` knob's business.
pub const OWN_CPUS_FROM: usize = 16;

/// Everything that defines an experiment; both sides must hold the same values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experiment {
    /// Name shown in tables, CSV and errors.
    pub name: String,
    /// The backend moving the bytes.
    pub transport: Backend,
    /// Where buffers live.
    pub memory: Memory,
    /// Message sizes in bytes, run in this order.
    pub sizes: Vec<u64>,
    /// Timed iterations per size.
    pub iters: u32,
    /// Untimed iterations before the timed ones.
    pub warmup: u32,
    /// Independent flows (one per GPU) run at once.
    pub flows: u32,
    /// Channels (comms) per flow.
    pub channels: u32,
    /// Sockets per channel (socket backend).
    pub socks_per_channel: u32,
    /// Bytes per request; `None`: the automatic rule's ([`Experiment::chunk_for`]).
    pub chunk: Option<u64>,
    /// Requests in flight per channel; `None`: the automatic rule's
    /// ([`Experiment::window_for`]). Left out of JSON when auto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// Check every received byte.
    pub verify: bool,
    /// SO_SNDBUF/SO_RCVBUF to ask for; `None` keeps Linux's autotuning.
    pub sock_buf: Option<u64>,
    /// Send pieces of at least this many bytes zero-copy (`MSG_ZEROCOPY`: the kernel sends
    /// from the buffer's pages, which stay lent until it says it is done); `None` copies every
    /// send. Left out of JSON when off, so experiments without it read and print as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_copy_min: Option<u64>,
    /// Where the start barrier falls ([`Barrier`]). Left out of JSON at its default, so
    /// experiments without it read and print as before.
    #[serde(default, skip_serializing_if = "Barrier::is_iteration")]
    pub barrier: Barrier,
    /// GPU memory over a host-memory backend: bytes of the pinned ring each channel stages
    /// through; `None`: picked by [`Experiment::staging_ring_bytes`]. Left out of JSON when
    /// auto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_ring: Option<u64>,
    /// Where the socket backend's worker threads run ([`WorkerCpus`]). Left out of JSON at its
    /// default, so experiments without it read and print as before.
    #[serde(default, skip_serializing_if = "WorkerCpus::is_auto")]
    pub worker_cpus: WorkerCpus,
    /// Longest wait for any progress, seconds.
    pub timeout_s: f64,
    /// CPUs the sending side's threads run on; `None`: unpinned. Socket worker threads inherit
    /// it, since they are started from the pinned thread.
    #[serde(default)]
    pub send_cpus: Option<CpuSet>,
    /// CPUs the receiving side's threads run on.
    #[serde(default)]
    pub recv_cpus: Option<CpuSet>,
    /// Sample CPU, IRQ, NIC and TCP counters every this many ms during timed iterations.
    #[serde(default)]
    pub sample_ms: Option<u32>,
    /// Backend settings (NCCL_* and plugin variables), passed to the backend, not the process;
    /// the nccl backend's flow processes get the `NCCL_*` ones in their environment, since libnccl
    /// reads nothing else (`tcpx_transport::nccl::process::process_env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// This side's NICs, as interface names (`eth1`) or local addresses (`127.0.0.2`); each
    /// channel binds to the one [`Experiment::nic_policy`] gives it. Empty: the backend's default
    /// address, no NIC choice. Each side names its own, so the two lists need not be equal.
    #[serde(default)]
    pub nics: Vec<String>,
    /// How channels are given to NICs (`explicit`: channel `c` takes `nics[c % len]`).
    #[serde(default)]
    pub nic_policy: NicPolicy,
    /// Run every flow in its own process (one `tcpx-run bench` child per flow, flow `i` on
    /// control port base + `i`) instead of all flows in this process.
    #[serde(default)]
    pub multi_process: bool,
    /// In a multi-process run, the one flow (of `flows`) this process carries; `None`: all.
    #[serde(default)]
    pub flow_index: Option<u32>,
}

impl Default for Experiment {
    fn default() -> Self {
        Experiment {
            name: "bench".into(),
            transport: Backend::Socket,
            memory: Memory::Host,
            sizes: vec![64 << 20],
            iters: 20,
            warmup: 5,
            flows: 1,
            channels: 2,
            socks_per_channel: 4,
            chunk: None,
            window: None,
            verify: true,
            sock_buf: None,
            zero_copy_min: None,
            barrier: Barrier::Iteration,
            staging_ring: None,
            worker_cpus: WorkerCpus::Auto,
            timeout_s: 30.0,
            send_cpus: None,
            recv_cpus: None,
            sample_ms: None,
            env: Default::default(),
            nics: Vec::new(),
            nic_policy: NicPolicy::RoundRobin,
            multi_process: false,
            flow_index: None,
        }
    }
}

/// Seconds as a `Duration`, clamped into `0..=MAX_TIMEOUT_S` (NaN is 0): for values that may
/// not have been validated yet, where `Duration::from_secs_f64` would panic.
pub fn secs_clamped(secs: f64) -> Duration {
    if secs.is_nan() {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(secs.clamp(0.0, MAX_TIMEOUT_S))
}

/// The staging ring picked when none is given, for requests of at most `chunk` bytes and
/// messages of at most `largest` bytes (`None`: not known): at least
/// [`AUTO_STAGING_RING_CHUNKS`] chunks and [`AUTO_STAGING_RING_MIN`], no larger than the largest
/// message (a ring as large as the message already has a whole mirror's footprint) nor than
/// [`MAX_STAGING_RING`], and never smaller than a chunk.
pub fn auto_staging_ring(chunk: u64, largest: Option<u64>) -> u64 {
    let chunk = chunk.max(1);
    let wanted = AUTO_STAGING_RING_CHUNKS
        .saturating_mul(chunk)
        .max(AUTO_STAGING_RING_MIN);
    let bounded = match largest {
        Some(l) => wanted.min(l.max(MIN_STAGING_RING)),
        None => wanted,
    };
    bounded.min(MAX_STAGING_RING).max(chunk)
}

/// Whether a staging ring of `ring` bytes is in the knob's range and holds a request of
/// `largest_request` bytes; the error says which and what to give instead.
pub fn check_staging_ring(ring: u64, largest_request: u64) -> Result<(), String> {
    if !(MIN_STAGING_RING..=MAX_STAGING_RING).contains(&ring) {
        return Err(format!(
            "staging-ring {ring} bytes: give {}..={}, or leave it out for the automatic ring (4 chunks, at least 32M, at most the largest message)",
            format_size(MIN_STAGING_RING),
            format_size(MAX_STAGING_RING)
        ));
    }
    if largest_request > ring {
        return Err(format!(
            "chunk {} does not fit staging-ring {}: each request stages whole; give a ring of at least one chunk (several, for the copies to overlap the network) or a smaller chunk",
            format_size(largest_request),
            format_size(ring)
        ));
    }
    Ok(())
}

impl Experiment {
    /// Chunk used for a message of `size` bytes: `chunk`, else the automatic rule's
    /// ([`crate::auto_transfer`]).
    pub fn chunk_for(&self, size: u64) -> u64 {
        self.chunk.unwrap_or_else(|| self.auto_for(size).chunk)
    }

    /// Requests in flight per channel for a message of `size` bytes: `window`, else the
    /// automatic rule's.
    pub fn window_for(&self, size: u64) -> u32 {
        self.window.unwrap_or_else(|| self.auto_for(size).window)
    }

    /// What the automatic rule chooses for a message of `size` bytes of this experiment.
    pub fn auto_for(&self, size: u64) -> crate::AutoChoice {
        crate::auto_transfer(&crate::AutoInput {
            backend: self.transport,
            gpu: self.memory.is_cuda(),
            size: Some(size),
            channels: self.channels,
            socks_per_channel: self.socks_per_channel,
        })
    }

    /// The chunk and window of a message of `size` bytes and where they came from, as headers
    /// show them: `chunk 4M, window 32 (auto: 16 sockets, 256M message, host memory)`.
    pub fn transfer_text(&self, size: u64) -> String {
        crate::describe_choice(
            self.chunk_for(size),
            self.window_for(size),
            self.chunk.is_none(),
            self.window.is_none(),
            &self.auto_for(size).basis,
        )
    }

    /// Bytes of the ring each channel stages GPU memory through (over a host-memory backend):
    /// `staging_ring` when given, else [`auto_staging_ring`] for the largest message's chunk.
    pub fn staging_ring_bytes(&self) -> u64 {
        if let Some(r) = self.staging_ring {
            return r;
        }
        let largest = self.sizes.iter().copied().max().unwrap_or(0);
        auto_staging_ring(self.chunk_for(largest), Some(largest))
    }

    /// Flows this process runs: 1 for a multi-process child, else `flows`.
    pub fn local_flows(&self) -> u32 {
        if self.flow_index.is_some() {
            1
        } else {
            self.flows
        }
    }

    /// The global index of this process's `k`-th flow.
    pub fn flow_id(&self, k: u32) -> u32 {
        self.flow_index.unwrap_or(k)
    }

    /// `timeout_s` as a `Duration`, never a panic: a value [`Experiment::validate`] would refuse
    /// (negative, NaN, infinite, beyond [`MAX_TIMEOUT_S`]) is clamped into `0..=MAX_TIMEOUT_S`,
    /// so a peer's experiment that has not been validated yet cannot crash this side.
    pub fn timeout(&self) -> Duration {
        secs_clamped(self.timeout_s)
    }

    /// The CPUs of one side, when pinned.
    pub fn cpus(&self, side: crate::Side) -> Option<&CpuSet> {
        match side {
            crate::Side::Send => self.send_cpus.as_ref(),
            crate::Side::Recv => self.recv_cpus.as_ref(),
        }
    }

    /// Checks every value; the error names the value and what would be accepted. Each number
    /// is held to its knob's range in the knob table ([`Experiment::check_ranges`]); what is
    /// checked here beyond that spans several knobs or a backend's limits.
    pub fn validate(&self, limits: Option<&Limits>) -> Result<(), String> {
        if self.sizes.is_empty() {
            return Err("no message size given: use --size, e.g. --size 64M".into());
        }
        self.check_ranges()?;
        if let Some(r) = self.staging_ring {
            // The largest request: the chunk of the largest message ("auto" chunks included).
            // Only a backend that stages GPU memory has a ring; elsewhere the knob is reported as
            // not applied, and its requests (the nccl backend's whole messages) need not fit it,
            // though the value is still checked against the knob's range.
            let stages = self.transport.capabilities().gpu_memory == crate::GpuMemoryPath::Staged;
            let largest = self.sizes.iter().copied().max().unwrap_or(0);
            let request = if stages { self.chunk_for(largest) } else { 0 };
            check_staging_ring(r, request)?;
        }
        if let Some(i) = self.nics.iter().position(|n| n.trim().is_empty()) {
            return Err(format!(
                "--nics: entry {} of {:?} is empty: name interfaces or addresses separated by commas, e.g. eth1,eth2",
                i + 1,
                self.nics
            ));
        }
        for (name, cpus) in [
            ("send-cpus", &self.send_cpus),
            ("recv-cpus", &self.recv_cpus),
        ] {
            if let Some(c) = cpus {
                if c.is_empty() {
                    return Err(format!("--{name} `{c}` names no CPU"));
                }
            }
        }
        if let Some(i) = self.flow_index {
            if i >= self.flows {
                return Err(format!(
                    "flow index {i} is outside the experiment's {} flows (0..{})",
                    self.flows, self.flows
                ));
            }
        }
        if self.nic_policy == NicPolicy::Explicit && self.nics.is_empty() {
            return Err(
                "--nic-policy explicit needs --nics naming the NICs in channel order".into(),
            );
        }
        for &s in &self.sizes {
            let chunk = self.chunk_for(s);
            if chunk > s {
                return Err(format!(
                    "chunk {} is larger than the message size {}: use --chunk <= size, or leave --chunk out",
                    format_size(chunk),
                    format_size(s)
                ));
            }
            let total = s.saturating_mul(self.flows.into());
            if total > MAX_BYTES_PER_SIDE {
                return Err(format!(
                    "size {} x {} flows is {} per side, more than the {} this tool allows",
                    format_size(s),
                    self.flows,
                    format_size(total),
                    format_size(MAX_BYTES_PER_SIDE)
                ));
            }
            let chunks = s.div_ceil(chunk);
            if chunks > MAX_CHUNKS {
                return Err(format!(
                    "transfer of {s} B in chunks of {chunk} B makes too many chunks ({chunks}); raise the chunk size"
                ));
            }
        }
        if let Some(l) = limits {
            if let Some(w) = self.window.filter(|&w| w as usize > l.max_requests) {
                return Err(format!(
                    "window {w} is beyond what transport `{}` allows ({} requests in flight per channel)",
                    self.transport, l.max_requests
                ));
            }
            let chunk = self
                .sizes
                .iter()
                .map(|&s| self.chunk_for(s))
                .max()
                .unwrap_or(0);
            if chunk > l.max_request_bytes as u64 {
                return Err(format!(
                    "chunk {} is beyond what transport `{}` allows per request ({})",
                    format_size(chunk),
                    self.transport,
                    format_size(l.max_request_bytes as u64)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    /// Issue 43: `bench --flows 65` ran though the knob allows 1..=64.
    #[test]
    fn counts_beyond_the_knob_tables_range_are_refused() {
        let ok = Experiment {
            sizes: vec![M],
            ..Experiment::default()
        };
        assert_eq!(ok.validate(None), Ok(()));
        for (e, says) in [
            (
                Experiment {
                    flows: 65,
                    ..ok.clone()
                },
                "flows 65 is out of range: give 1..=64",
            ),
            (
                Experiment {
                    channels: 65,
                    ..ok.clone()
                },
                "channels 65",
            ),
            (
                Experiment {
                    socks_per_channel: 100,
                    ..ok.clone()
                },
                "socks-per-channel 100",
            ),
            (
                Experiment {
                    window: Some(5000),
                    ..ok.clone()
                },
                "window 5000 is out of range: give 1..=4096",
            ),
        ] {
            let err = e.validate(None).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        let top = Experiment {
            flows: 64,
            channels: 64,
            window: Some(4096),
            ..ok
        };
        assert_eq!(top.validate(None), Ok(()));
    }

    /// Without a largest message (the Python endpoint's case) only the chunk and the bounds
    /// decide; a chunk beyond the largest ring still fits.
    #[test]
    fn an_auto_ring_without_a_known_message_holds_four_chunks_within_the_bounds() {
        assert_eq!(auto_staging_ring(512 << 10, None), AUTO_STAGING_RING_MIN);
        assert_eq!(auto_staging_ring(16 * M, None), 64 * M);
        assert_eq!(auto_staging_ring(512 * M, None), MAX_STAGING_RING);
        assert_eq!(auto_staging_ring(0, None), AUTO_STAGING_RING_MIN);
        assert_eq!(auto_staging_ring(8 * M, Some(M)), 8 * M);
    }

    /// An auto chunk is the backend's default: 512 KiB (or the message, when smaller) for the
    /// socket backend, the whole message for NCCL, which pipelines a call itself; a chunk given
    /// wins everywhere.
    #[test]
    fn a_given_chunk_or_window_wins_over_the_rule_and_each_says_so() {
        let auto = Experiment {
            channels: 1,
            socks_per_channel: 16,
            ..Experiment::default()
        };
        assert_eq!(
            (auto.chunk_for(256 * M), auto.window_for(256 * M)),
            (4 * M, 32)
        );
        let given = Experiment {
            chunk: Some(M),
            window: Some(2),
            ..auto.clone()
        };
        assert_eq!(
            (given.chunk_for(256 * M), given.window_for(256 * M)),
            (M, 2)
        );
        assert_eq!(given.transfer_text(256 * M), "chunk 1M, window 2 (given)");
        let window_only = Experiment {
            window: Some(8),
            ..auto
        };
        assert_eq!(
            window_only.transfer_text(256 * M),
            "chunk 4M, window 8 (chunk auto: 16 sockets, 256M message, host memory; window given)"
        );
        // A given window beyond the backend's most is refused, an automatic one never is.
        let limits = Limits {
            max_requests: 16,
            max_request_bytes: 1 << 30,
            memory: vec![MemoryKind::Host],
        };
        assert!(window_only.validate(Some(&limits)).is_ok());
        let deep = Experiment {
            window: Some(32),
            ..window_only
        };
        assert!(deep
            .validate(Some(&limits))
            .unwrap_err()
            .contains("window 32"));
    }

    #[test]
    fn an_auto_chunk_is_the_backends_default_and_a_given_one_wins() {
        let mut e = Experiment {
            transport: Backend::Socket,
            ..Experiment::default()
        };
        assert_eq!(e.chunk_for(256 * M), DEFAULT_CHUNK);
        assert_eq!(e.chunk_for(4096), 4096);
        e.transport = Backend::Nccl;
        assert_eq!(e.chunk_for(256 * M), 256 * M);
        e.chunk = Some(8 * M);
        assert_eq!(e.chunk_for(256 * M), 8 * M);
    }

    /// A ring is checked against the requests only where GPU memory is staged through it: the
    /// nccl backend's whole-message requests do not have to fit a ring it never uses.
    #[test]
    fn a_staging_ring_is_checked_only_on_a_backend_that_stages() {
        let e = |transport, chunk| Experiment {
            transport,
            sizes: vec![1024 * M],
            chunk,
            staging_ring: Some(32 * M),
            ..Experiment::default()
        };
        assert_eq!(e(Backend::Nccl, None).validate(None), Ok(()));
        let tiny = Experiment {
            staging_ring: Some(1024),
            ..e(Backend::Nccl, None)
        };
        assert!(tiny
            .validate(None)
            .unwrap_err()
            .contains("--staging-ring 1024 is out of range: give 64K..=1G"));
        let err = e(Backend::Socket, Some(64 * M)).validate(None).unwrap_err();
        assert!(err.contains("ring"), "{err}");
        assert_eq!(e(Backend::Socket, None).validate(None), Ok(()));
    }
}
