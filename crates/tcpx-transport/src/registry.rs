//! The backends this crate has, their settings, and which of them can run here.
//!
//! [`Backend`] names every backend; [`BackendConfig`] holds one backend's settings as typed values.
//! The environment is read in one place, [`BackendConfig::from_env`], which the binary calls once;
//! library code takes a config and never looks at the environment itself. [`open`] turns a config
//! into a transport, ready for the memory the caller will use: host-only backends get GPU memory
//! through [`crate::cuda_staging::CudaStaging`], the net plugin is given its GPU. [`available`]
//! opens each backend once and says, for each one that cannot run, why.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use tcpx_gpu::Device;

use crate::cuda_staging::CudaStaging;
use crate::cudap2p::{CopyMode, CudaP2pTransport};
use crate::nccl::NcclTransport;
use crate::netplugin::{NetPluginConfig, NetPluginTransport};
use crate::socket::{SocketConfig, SocketTransport};
use crate::{MemoryKind, Result, Transport, TransportError};

/// A backend, available here or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// Native kernel TCP, several sockets per comm.
    Socket,
    /// An NCCL net plugin (GPUDirect-TCPX on A3) through `tcpx-ffi`.
    NetPlugin,
    /// libnccl's own point-to-point send/recv on one GPU.
    Nccl,
    /// GPU-to-GPU copies inside one process.
    CudaP2p,
}

impl Backend {
    /// Every backend, in the order they are listed to users.
    pub const ALL: [Backend; 4] = [
        Backend::Socket,
        Backend::NetPlugin,
        Backend::Nccl,
        Backend::CudaP2p,
    ];

    /// The name given on the command line and in plans.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Socket => "socket",
            Backend::NetPlugin => "netplugin",
            Backend::Nccl => "nccl",
            Backend::CudaP2p => "cudap2p",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = TransportError;

    fn from_str(s: &str) -> Result<Self> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                TransportError::Usage(format!(
                    "unknown transport `{s}`: choose one of {}",
                    Backend::ALL.map(Backend::name).join(", ")
                ))
            })
    }
}

/// The `nccl` backend's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NcclConfig {
    /// The GPU libnccl runs on (`TCPX_NCCL_GPU`, default 0).
    pub gpu: usize,
}

/// The `cudap2p` backend's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaP2pConfig {
    /// Which GPU drives the copy (`TCPX_CUDAP2P_MODE`: `read`, the default, or `write`).
    pub mode: CopyMode,
}

/// One backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    Socket(SocketConfig),
    NetPlugin(NetPluginConfig),
    Nccl(NcclConfig),
    CudaP2p(CudaP2pConfig),
}

impl BackendConfig {
    /// Which backend these settings are for.
    pub fn backend(&self) -> Backend {
        match self {
            BackendConfig::Socket(_) => Backend::Socket,
            BackendConfig::NetPlugin(_) => Backend::NetPlugin,
            BackendConfig::Nccl(_) => Backend::Nccl,
            BackendConfig::CudaP2p(_) => Backend::CudaP2p,
        }
    }

    /// Default settings of `backend`, without looking at the environment.
    pub fn default_for(backend: Backend) -> Self {
        match backend {
            Backend::Socket => BackendConfig::Socket(SocketConfig::default()),
            Backend::NetPlugin => BackendConfig::NetPlugin(NetPluginConfig::default()),
            Backend::Nccl => BackendConfig::Nccl(NcclConfig::default()),
            Backend::CudaP2p => BackendConfig::CudaP2p(CudaP2pConfig::default()),
        }
    }

    /// `backend`'s settings from the process environment (`NCCL_NET_PLUGIN` and
    /// `TCPX_NETPLUGIN_DEV`, `TCPX_NCCL_GPU`, `TCPX_CUDAP2P_MODE`); `socket` is taken as given
    /// (its settings come from the command line). For the binary, once; libraries take configs.
    pub fn from_env(backend: Backend, socket: SocketConfig) -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let gpu = |name: &str| -> Result<usize> {
            match var(name) {
                None => Ok(0),
                Some(v) => v.trim().parse().map_err(|_| {
                    TransportError::Usage(format!("{name}={v} is not a GPU index (0, 1, ...)"))
                }),
            }
        };
        Ok(match backend {
            Backend::Socket => BackendConfig::Socket(socket),
            Backend::NetPlugin => BackendConfig::NetPlugin(NetPluginConfig::from_env()?),
            Backend::Nccl => BackendConfig::Nccl(NcclConfig {
                gpu: gpu("TCPX_NCCL_GPU")?,
            }),
            Backend::CudaP2p => BackendConfig::CudaP2p(CudaP2pConfig {
                mode: CopyMode::parse(&var("TCPX_CUDAP2P_MODE").unwrap_or_default())?,
            }),
        })
    }
}

/// Opens the backend `cfg` is for. With `gpu`, the transport takes GPU memory of that GPU: the
/// net plugin registers it itself, `nccl` runs on it, backends that move host memory only are
/// wrapped in pinned staging ([`CudaStaging`]). A backend this build or machine lacks is
/// [`TransportError::Unavailable`].
pub fn open(cfg: &BackendConfig, gpu: Option<Device>) -> Result<Arc<dyn Transport>> {
    let opened: Arc<dyn Transport> = match cfg {
        BackendConfig::Socket(c) => Arc::new(SocketTransport::new(c.clone())?),
        BackendConfig::NetPlugin(c) => {
            let t = NetPluginTransport::new(c.clone())?;
            match gpu {
                Some(d) => return Ok(Arc::new(t.with_device(d))),
                None => Arc::new(t),
            }
        }
        BackendConfig::Nccl(c) => {
            let device = match gpu {
                Some(d) => d,
                None => Device::open(c.gpu).map_err(|e| TransportError::Unavailable {
                    name: "nccl".into(),
                    reason: e.to_string(),
                })?,
            };
            return Ok(Arc::new(NcclTransport::new(device)?));
        }
        BackendConfig::CudaP2p(c) => {
            tcpx_gpu::init().map_err(|e| TransportError::Unavailable {
                name: "cudap2p".into(),
                reason: e.to_string(),
            })?;
            Arc::new(CudaP2pTransport::new(c.mode))
        }
    };
    if gpu.is_some() && !opened.limits().memory.contains(&MemoryKind::Cuda) {
        return Ok(Arc::new(CudaStaging::new(opened)));
    }
    Ok(opened)
}

/// Whether one backend can run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    pub backend: Backend,
    /// `None`: it opened. `Some(reason)`: why it cannot run here (what is missing, what to check).
    pub unavailable: Option<String>,
}

impl BackendStatus {
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }
}

/// Opens each of `configs` once (host memory, no GPU given) and reports, per backend, whether it
/// opened and if not why. Loading a net plugin initialises it, once per process: call this before
/// a plugin is opened with other settings.
pub fn available(configs: &[BackendConfig]) -> Vec<BackendStatus> {
    configs
        .iter()
        .map(|cfg| BackendStatus {
            backend: cfg.backend(),
            unavailable: open(cfg, None).err().map(|e| match e {
                TransportError::Unavailable { reason, .. } => reason,
                other => other.to_string(),
            }),
        })
        .collect()
}

/// The names of the backends in `statuses` that opened, for facts and listings.
pub fn available_names(statuses: &[BackendStatus]) -> Vec<String> {
    statuses
        .iter()
        .filter(|s| s.is_available())
        .map(|s| s.backend.name().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_round_trips_through_its_name() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
            assert_eq!(BackendConfig::default_for(b).backend(), b);
        }
        let e = "tcp".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("unknown transport `tcp`"), "{e}");
        assert!(e.contains("socket, netplugin, nccl, cudap2p"), "{e}");
    }

    #[test]
    fn a_missing_plugin_is_unavailable_with_its_reason_and_socket_is_available() {
        let statuses = available(&[
            BackendConfig::Socket(SocketConfig::default()),
            BackendConfig::NetPlugin(NetPluginConfig {
                plugin: Some("/nonexistent/libnccl-net-missing.so".into()),
                dev: 0,
                env: Vec::new(),
            }),
        ]);
        assert_eq!(statuses[0].backend, Backend::Socket);
        assert!(statuses[0].is_available(), "{:?}", statuses[0]);
        assert_eq!(statuses[1].backend, Backend::NetPlugin);
        let why = statuses[1].unavailable.as_deref().expect("no such plugin");
        assert!(why.contains("libnccl-net-missing.so"), "{why}");
        assert_eq!(available_names(&statuses), vec!["socket".to_string()]);
    }
}
