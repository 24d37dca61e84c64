//! The backends that move bytes, by the names users give them.

use std::str::FromStr;

/// A backend, by name; whether it can run here is `tcpx-transport`'s business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Backend {
    /// Native kernel TCP, several sockets per comm.
    #[default]
    Socket,
    /// An NCCL net plugin (GPUDirect-TCPX on A3) through `tcpx-ffi`.
    NetPlugin,
    /// libnccl's own point-to-point send/recv on one GPU.
    Nccl,
    /// GPU-to-GPU copies inside one process.
    CudaP2p,
}

/// A transport name that is none of [`Backend::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport `{0}`: choose one of socket, netplugin, nccl, cudap2p")]
pub struct UnknownBackend(pub String);

impl Backend {
    /// Every backend, in the order they are listed to users.
    pub const ALL: [Backend; 4] = [
        Backend::Socket,
        Backend::NetPlugin,
        Backend::Nccl,
        Backend::CudaP2p,
    ];

    /// Every name, in the order of [`Backend::ALL`].
    pub const NAMES: [&'static str; 4] = ["socket", "netplugin", "nccl", "cudap2p"];

    /// The name given on the command line, in plans, CSV and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Socket => "socket",
            Backend::NetPlugin => "netplugin",
            Backend::Nccl => "nccl",
            Backend::CudaP2p => "cudap2p",
        }
    }
}

crate::display_as_word!(Backend, name);

impl FromStr for Backend {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

crate::serde_as_text!(Backend, "a transport name such as \"socket\"");
