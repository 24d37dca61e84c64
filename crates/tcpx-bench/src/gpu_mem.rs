//! Where an experiment's buffers live: `--memory host`, or GPU memory.
//!
//! - `cuda`: flow `f` of each side on GPU `f % n` (one GPU per flow, as on a node).
//! - `cuda:S,R`: the sender's flow `f` on GPU `(S + f) % n`, the receiver's on `(R + f) % n`;
//!   `cuda:0,1` puts the two sides of a local (one-process) run on different GPUs.
//!
//! GPU buffers are filled and checked by `tcpx-gpu`'s pattern kernels (the same pattern as the
//! host's), so verification never copies a message back to the host. Which GPU a side's backend
//! is given is decided here ([`side_gpu`]); what the backend does with it is the registry's
//! (`tcpx_transport::registry::open`: staging for a host-only backend, the GPU itself for the
//! others).

use std::sync::Arc;

use tcpx_gpu::{Device, DeviceBuffer, HostBuffer, Stream};
use tcpx_transport::Memory;

use crate::{Experiment, Side};

/// First GPU of each side, or `None` for host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub send: usize,
    pub recv: usize,
}

impl Placement {
    fn base(&self, side: Side) -> usize {
        match side {
            Side::Send => self.send,
            Side::Recv => self.recv,
        }
    }
}

/// The first GPU of each side for `memory`, or `None` for host memory.
pub(crate) fn placement_of(memory: tcpx_model::Memory) -> Option<Placement> {
    memory
        .gpu_bases()
        .map(|(send, recv)| Placement { send, recv })
}

/// Parses `--memory`: `host`, `cuda` or `cuda:S,R`.
#[cfg(test)]
pub(crate) fn placement(memory: &str) -> Result<Option<Placement>, String> {
    memory
        .parse::<tcpx_model::Memory>()
        .map(placement_of)
        .map_err(|e| e.to_string())
}

fn gpu(base: usize, flow: usize) -> Result<Device, String> {
    let n = tcpx_gpu::device_count().map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("--memory cuda, but this machine has no GPU (nvidia-smi lists none)".into());
    }
    Device::open((base + flow) % n).map_err(|e| e.to_string())
}

/// Refuses an experiment whose flows would share a GPU on this side: every flow stands for one
/// GPU of a node, so a node with fewer GPUs than flows (or a peer with more GPUs than this one)
/// is a mismatch to fix, not something to fold silently onto fewer GPUs.
pub(crate) fn check_gpu_count(exp: &Experiment, side: Side) -> Result<(), String> {
    let Some(p) = placement_of(exp.memory) else {
        return Ok(());
    };
    let n = tcpx_gpu::device_count().map_err(|e| e.to_string())?;
    gpus_suffice(exp.flows as usize, p.base(side), n, side)
}

/// The arithmetic of [`check_gpu_count`]: `flows` flows from GPU `base` on a side with `n` GPUs.
fn gpus_suffice(flows: usize, base: usize, n: usize, side: Side) -> Result<(), String> {
    // CUDA_VISIBLE_DEVICES is the CUDA driver's own variable, which the driver in this process
    // has already applied to the count `n`; it is read here only to explain that count, not as
    // a setting of tcpx-lab's (those come from the binary, as a `BackendEnv`).
    let visible = std::env::var("CUDA_VISIBLE_DEVICES")
        .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
        .unwrap_or_default();
    if n == 0 {
        return Err(format!(
            "--memory cuda, but the {} side has no GPU{visible}: check nvidia-smi on that machine",
            side.as_str()
        ));
    }
    if flows > n {
        return Err(format!(
            "{flows} flows need {flows} GPUs on the {} side (one GPU per flow), but this machine has {n}{visible}: use --flows {n} or fewer, or run on a machine with {flows} GPUs",
            side.as_str()
        ));
    }
    if base >= n {
        return Err(format!(
            "the {} side's first GPU is {base}, but this machine has GPUs 0..{}{visible}: check --memory cuda:S,R",
            side.as_str(),
            n - 1
        ));
    }
    Ok(())
}

/// The GPU one side's backend is given: `None` for host memory; for GPU memory the side's first
/// GPU for this process's first flow, once the side is known to have a GPU per flow and the
/// backend to take this process's flows.
pub(crate) fn side_gpu(exp: &Experiment, side: Side) -> Result<Option<Device>, String> {
    let Some(p) = placement_of(exp.memory) else {
        return Ok(None);
    };
    check_gpu_count(exp, side)?;
    if let Some(most) = exp.transport.capabilities().flows_per_process {
        if exp.local_flows() > most {
            let flows = match most {
                1 => "one flow".to_string(),
                n => format!("{n} flows"),
            };
            return Err(format!(
                "the {} backend runs {flows} per process: use --flows {most}, or one process per flow",
                exp.transport
            ));
        }
    }
    gpu(p.base(side), exp.flow_id(0) as usize).map(Some)
}

/// The buffers of all flows of one side, for one message size.
pub(crate) enum Bufs {
    Host(Vec<Arc<HostBuffer>>),
    Cuda(Vec<(Arc<DeviceBuffer>, Stream)>),
}

/// Refuses, with the numbers, a `size`-byte buffer for `flow` that the GPU's `free` memory
/// cannot hold (rather than leave it to the allocator's error).
fn check_gpu_fits(
    flow: u32,
    size: usize,
    free: usize,
    total: usize,
    gpu: &str,
) -> Result<(), String> {
    if size > free {
        return Err(format!(
            "flow {flow}: a {size}-byte buffer does not fit in GPU {gpu}'s free memory ({free} of {total} bytes): use a smaller --size"
        ));
    }
    Ok(())
}

impl Bufs {
    /// Buffers of `size` bytes for this process's flows (`exp.local_flows()`); on GPUs, global
    /// flow `exp.flow_id(k)` goes to the side's GPU base + that id.
    pub(crate) fn new(exp: &Experiment, side: Side, size: u64) -> Result<Bufs, String> {
        let size = size as usize;
        match placement_of(exp.memory) {
            None => {
                let flows = exp.local_flows() as usize;
                crate::limits::check_address_space(
                    flows,
                    size as u64,
                    crate::limits::address_space_limit(),
                )?;
                // Allocated fallibly: a failure is an error naming the size and the limits,
                // never an abort of the process.
                (0..flows)
                    .map(|k| {
                        HostBuffer::new(size).map_err(|e| {
                            format!(
                                "flow {k}: {e} ({flows} buffer(s) of {}; {})",
                                crate::format_size(size as u64),
                                crate::limits::host_memory_limits()
                            )
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(Bufs::Host)
            }
            Some(p) => (0..exp.local_flows())
                .map(|k| {
                    let d = gpu(p.base(side), exp.flow_id(k) as usize)?;
                    // Refuse with the numbers rather than leave it to the allocator.
                    if let Ok((free, total)) = d.memory_info() {
                        check_gpu_fits(exp.flow_id(k), size, free, total, d.pci_bus_id())?;
                    }
                    let b = d.alloc(size).map_err(|e| e.to_string())?;
                    let s = d.new_stream().map_err(|e| e.to_string())?;
                    Ok((Arc::new(b), s))
                })
                .collect::<Result<_, String>>()
                .map(Bufs::Cuda),
        }
    }

    /// Flows held here.
    pub(crate) fn len(&self) -> usize {
        match self {
            Bufs::Host(b) => b.len(),
            Bufs::Cuda(b) => b.len(),
        }
    }

    /// What this process's `flow`-th flow registers.
    pub(crate) fn memory(&self, flow: usize) -> Memory {
        match self {
            Bufs::Host(b) => Memory::Host(Arc::clone(&b[flow])),
            Bufs::Cuda(b) => Memory::Cuda(Arc::clone(&b[flow].0)),
        }
    }

    /// Overwrites every buffer with bytes that are not the pattern, so a byte never received
    /// shows as wrong.
    pub(crate) fn poison(&self) -> Result<(), String> {
        match self {
            Bufs::Host(bufs) => {
                for b in bufs {
                    b.span_all().map_err(|e| e.to_string())?.fill(0xA5);
                }
            }
            Bufs::Cuda(bufs) => {
                for (b, s) in bufs {
                    s.fill_pattern(b, 0, b.len(), 0x9015_0000_0000_0000, 0)
                        .and_then(|_| s.synchronize())
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Writes flow `flow`'s pattern for `seed`; `host_fill` fills host memory.
    pub(crate) fn fill(
        &self,
        flow: usize,
        seed: u64,
        host_fill: impl Fn(&mut [u8], u64),
    ) -> Result<(), String> {
        match self {
            Bufs::Host(b) => {
                host_fill(&mut b[flow].span_all().map_err(|e| e.to_string())?, seed);
                Ok(())
            }
            Bufs::Cuda(b) => {
                let (buf, s) = &b[flow];
                s.fill_pattern(buf, 0, buf.len(), seed, 0)
                    .and_then(|_| s.synchronize())
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Bytes of flow `flow` that differ from the pattern for `seed`; `host_count` counts host
    /// memory.
    pub(crate) fn count_wrong(
        &self,
        flow: usize,
        seed: u64,
        host_count: impl Fn(&[u8], u64) -> u64,
    ) -> Result<u64, String> {
        match self {
            Bufs::Host(b) => Ok(host_count(
                &b[flow].span_all().map_err(|e| e.to_string())?,
                seed,
            )),
            Bufs::Cuda(b) => {
                let (buf, s) = &b[flow];
                s.count_pattern_errors(buf, 0, buf.len(), seed, 0)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;

    /// Issue 43 item 10: a host buffer that cannot be had is an error naming its size and the
    /// process's limits, not an abort.
    #[test]
    fn a_host_buffer_that_cannot_be_allocated_is_an_error_naming_size_and_limits() {
        let exp = Experiment {
            sizes: vec![1 << 46],
            ..Experiment::default()
        };
        let e = match Bufs::new(&exp, Side::Send, 1 << 46) {
            Err(e) => e,
            Ok(_) => panic!("64 TiB were allocated"),
        };
        assert!(
            e.contains("64T") || e.contains("70368744177664"),
            "the size is named: {e}"
        );
        assert!(e.contains("ulimit -v"), "the limit is named: {e}");
    }

    #[test]
    fn memory_values_parse() {
        assert_eq!(placement("host").unwrap(), None);
        assert_eq!(
            placement("cuda").unwrap(),
            Some(Placement { send: 0, recv: 0 })
        );
        assert_eq!(
            placement("cuda:0,1").unwrap(),
            Some(Placement { send: 0, recv: 1 })
        );
        for bad in ["gpu", "cuda:", "cuda:1", "cuda:a,b", "CUDA"] {
            let e = placement(bad).unwrap_err();
            assert!(e.contains("cuda:S,R"), "{bad}: {e}");
        }
    }

    #[test]
    fn host_memory_gives_a_side_no_gpu() {
        let exp = Experiment {
            transport: Backend::Nccl,
            flows: 2,
            ..Experiment::default()
        };
        assert!(side_gpu(&exp, Side::Send).unwrap().is_none());
    }

    #[test]
    fn flow_gpus_follow_the_placement() {
        use crate::flow_gpus;
        assert_eq!(flow_gpus("cuda:0,1", 0, 2), Some((0, 1)));
        assert_eq!(flow_gpus("cuda:0,1", 1, 2), Some((1, 0)));
        assert_eq!(flow_gpus("cuda:0,4", 3, 8), Some((3, 7)));
        assert_eq!(flow_gpus("cuda", 2, 4), Some((2, 2)));
        assert_eq!(flow_gpus("host", 0, 2), None);
        assert_eq!(flow_gpus("cuda:x,1", 0, 2), None);
        assert_eq!(flow_gpus("cuda:0,1", 0, 0), None);
    }

    #[test]
    fn flows_beyond_the_gpus_of_a_side_are_refused() {
        gpus_suffice(4, 0, 8, Side::Send).unwrap();
        gpus_suffice(4, 4, 8, Side::Recv).unwrap();
        gpus_suffice(2, 1, 2, Side::Recv).unwrap();
        let e = gpus_suffice(8, 0, 4, Side::Recv).unwrap_err();
        assert!(
            e.contains("8 flows need 8 GPUs on the recv side") && e.contains("this machine has 4"),
            "{e}"
        );
        assert!(e.contains("--flows 4"), "{e}");
        let e = gpus_suffice(1, 2, 2, Side::Send).unwrap_err();
        assert!(e.contains("first GPU is 2") && e.contains("0..1"), "{e}");
        let e = gpus_suffice(1, 0, 0, Side::Send).unwrap_err();
        assert!(e.contains("has no GPU"), "{e}");
    }

    #[test]
    fn a_buffer_beyond_the_gpus_free_memory_is_refused_with_the_numbers() {
        let gib = 1usize << 30;
        assert!(super::check_gpu_fits(0, gib, 2 * gib, 80 * gib, "0000:04:00.0").is_ok());
        let e = super::check_gpu_fits(3, 90 * gib, 79 * gib, 80 * gib, "0000:04:00.0").unwrap_err();
        assert!(
            e.starts_with("flow 3:") && e.contains("0000:04:00.0"),
            "{e}"
        );
        assert!(e.contains(&(79 * gib).to_string()), "{e}");
    }
}
