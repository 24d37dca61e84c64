//! What each backend is and can do, known without opening it: [`Backend`] and its
//! [`Capabilities`] (the model's vocabulary, from `tcpx-model`) and [`limits`]. The backends'
//! own modules answer [`Transport::name`](crate::Transport::name) and
//! [`Transport::limits`](crate::Transport::limits) from here; [`crate::registry`], which knows
//! every backend and opens them, re-exports all of it, so the backends never reach back into the
//! registry.

use crate::{Limits, MemoryKind};

pub use tcpx_model::{
    Backend, Capabilities, GpuMemoryPath, NcclEquivalent, NicPlacement, OpenFileCost,
};

/// The most `backend` allows, known without opening it: what a plan checks an experiment against
/// before anything starts. An opened transport's [`Transport::limits`](crate::Transport::limits)
/// may be tighter (a plugin on an UNPACK device takes at most 4 MiB per receive) and is checked
/// again where the experiment runs.
pub fn limits(backend: Backend) -> Limits {
    let c = backend.capabilities();
    let mut memory = Vec::new();
    if c.host_memory {
        memory.push(MemoryKind::Host);
    } else if c.gpu_memory == GpuMemoryPath::Direct {
        memory.push(MemoryKind::Cuda);
    }
    Limits {
        max_requests: c.max_requests,
        max_request_bytes: c.max_request_bytes,
        memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_before_opening_follow_the_capabilities() {
        assert_eq!(limits(Backend::NetPlugin).max_requests, 16);
        assert_eq!(limits(Backend::Socket).memory, vec![MemoryKind::Host]);
        assert_eq!(limits(Backend::Nccl).memory, vec![MemoryKind::Cuda]);
    }
}
