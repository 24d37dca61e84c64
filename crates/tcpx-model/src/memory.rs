//! Where an experiment's buffers live.

use std::fmt;
use std::str::FromStr;

/// Where buffers live: `host`, `cuda` (flow `f` on GPU `f` on both sides) or `cuda:S,R` (the
/// sender's flow `f` from GPU `S + f`, the receiver's from GPU `R + f`, modulo the GPU count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Memory {
    #[default]
    Host,
    Cuda,
    CudaPair {
        send: usize,
        recv: usize,
    },
}

/// A memory text that is none of the accepted forms; shows the text and the forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memory `{0}`: use host, cuda (flow f on GPU f on both sides) or cuda:S,R (sender from GPU S, receiver from GPU R, e.g. cuda:0,1)")]
pub struct MemoryError(pub String);

impl Memory {
    /// The first GPU of each side (sender, receiver); `None` for host memory.
    pub fn gpu_bases(self) -> Option<(usize, usize)> {
        match self {
            Memory::Host => None,
            Memory::Cuda => Some((0, 0)),
            Memory::CudaPair { send, recv } => Some((send, recv)),
        }
    }

    /// Whether buffers are GPU memory.
    pub fn is_cuda(self) -> bool {
        self != Memory::Host
    }

    /// The GPUs (sender, receiver) flow `flow` uses on a machine with `gpus` GPUs; `None` for
    /// host memory or no GPU.
    pub fn flow_gpus(self, flow: usize, gpus: usize) -> Option<(usize, usize)> {
        let (s, r) = self.gpu_bases()?;
        (gpus > 0).then(|| ((s + flow) % gpus, (r + flow) % gpus))
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memory::Host => f.write_str("host"),
            Memory::Cuda => f.write_str("cuda"),
            Memory::CudaPair { send, recv } => write!(f, "cuda:{send},{recv}"),
        }
    }
}

impl FromStr for Memory {
    type Err = MemoryError;

    fn from_str(s: &str) -> Result<Self, MemoryError> {
        let bad = || MemoryError(s.to_string());
        match s {
            "host" => Ok(Memory::Host),
            "cuda" => Ok(Memory::Cuda),
            m => {
                let rest = m.strip_prefix("cuda:").ok_or_else(bad)?;
                let (a, b) = rest.split_once(',').ok_or_else(bad)?;
                let send = a.trim().parse().map_err(|_| bad())?;
                let recv = b.trim().parse().map_err(|_| bad())?;
                Ok(Memory::CudaPair { send, recv })
            }
        }
    }
}

crate::serde_as_text!(Memory, "host, cuda or cuda:S,R");
