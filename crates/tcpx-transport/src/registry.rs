//! The backends this crate has, what each can do, their settings, and which of them can run here.
//!
//! [`Backend`] names every backend and answers what it can do ([`Backend::capabilities`],
//! [`limits`]: which memory it moves and how GPU memory reaches it, whether it places channels on
//! NICs itself, what a comm costs in open files, what NCCL runs for the same thing, and its limits
//! before it is opened), so code above asks the backend instead of matching on its name; both
//! live in [`crate::backend`], below the backends, and are re-exported here. [`BackendConfig`]
//! holds one backend's settings as typed values. The environment is read by the binary (and the
//! Python edge), once, into [`BackendEnv`] ([`BackendEnv::from_vars`] parses what it looked up);
//! library code takes a config and never looks at the environment itself. [`open`], the one
//! opener, turns a config into a transport, ready for the memory the caller will use: host-only
//! backends get GPU memory through [`crate::cuda_staging::CudaStaging`], the net plugin is given
//! its GPU. [`available`] opens each backend once and says, for each one that cannot run, why.

use std::sync::Arc;

use tcpx_gpu::Device;

use crate::cuda_staging::CudaStaging;
use crate::cudap2p::{CopyMode, CudaP2pTransport};
use crate::nccl::NcclTransport;
use crate::netplugin::{NetPluginConfig, NetPluginTransport};
use crate::socket::{Pieces, SocketConfig, SocketTransport};
use crate::{Result, Transport, TransportError};

pub use crate::backend::{
    limits, Backend, Capabilities, GpuMemoryPath, NcclEquivalent, NicPlacement, OpenFileCost,
};

/// The backend settings a process's environment gives. The binary (`tcpx-run`) and the Python
/// edge (`tcpx-py`) build it once with [`BackendEnv::from_vars`]; libraries take it as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendEnv {
    /// The socket backend's worker threads ([`Pieces`]): no variable sets them (the
    /// `TCPX_SOCKET_*` layout switches were removed once measured, docs/PERFORMANCE.md), so
    /// [`BackendEnv::from_vars`] leaves the default; in-process callers may set them.
    pub socket_pieces: Pieces,
    /// Which net plugin (`NCCL_NET_PLUGIN`; `None`: `libnccl-net.so`).
    pub net_plugin: Option<String>,
    /// The net plugin's device (`TCPX_NETPLUGIN_DEV`, default 0).
    pub netplugin_dev: usize,
    /// The GPU libnccl runs on for host-memory experiments (`TCPX_NCCL_GPU`, default 0).
    pub nccl_gpu: usize,
    /// Which GPU drives a cudap2p copy (`TCPX_CUDAP2P_MODE`: `read`, the default, or `write`).
    pub cudap2p_mode: CopyMode,
}

impl BackendEnv {
    /// The variables [`BackendEnv::from_vars`] looks up.
    pub const VARS: [&'static str; 4] = [
        "NCCL_NET_PLUGIN",
        "TCPX_NETPLUGIN_DEV",
        "TCPX_NCCL_GPU",
        "TCPX_CUDAP2P_MODE",
    ];

    /// Parses the variables `get` finds (the binary passes `|k| std::env::var(k).ok()`); a blank
    /// value counts as unset. Each refusal names its variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let index = |name: &str, what: &str| -> Result<usize> {
            match var(name) {
                None => Ok(0),
                Some(v) => v.trim().parse().map_err(|_| {
                    TransportError::Usage(format!(
                        "{name}={} is not a {what} (0, 1, ...)",
                        crate::shown(&v)
                    ))
                }),
            }
        };
        let cudap2p_mode = match var("TCPX_CUDAP2P_MODE") {
            None => CopyMode::default(),
            Some(v) => CopyMode::parse(&v).map_err(|e| {
                TransportError::Usage(format!("TCPX_CUDAP2P_MODE={}: {e}", crate::shown(&v)))
            })?,
        };
        Ok(BackendEnv {
            socket_pieces: Pieces::default(),
            net_plugin: var("NCCL_NET_PLUGIN"),
            netplugin_dev: index("TCPX_NETPLUGIN_DEV", "device index")?,
            nccl_gpu: index("TCPX_NCCL_GPU", "GPU index")?,
            cudap2p_mode,
        })
    }

    /// The net plugin's settings: the plugin and device named here, no variables of its own.
    pub fn netplugin(&self) -> NetPluginConfig {
        NetPluginConfig {
            plugin: self.net_plugin.clone(),
            dev: self.netplugin_dev,
            env: Vec::new(),
        }
    }
}

/// The `nccl` backend's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NcclConfig {
    /// The GPU libnccl runs on when [`open`] is given none (`TCPX_NCCL_GPU`, default 0).
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

    /// The settings an experiment runs its backend with, the one place they are derived: the
    /// socket backend's sockets, buffer and zero-copy threshold from the experiment (its worker
    /// threads from `env`); the net plugin's from the experiment's variables over the binary's
    /// environment (`NCCL_NET_PLUGIN` and `TCPX_NETPLUGIN_DEV` in `exp.env` win, every `exp.env`
    /// entry is handed to the plugin, which reads NCCL_GPUDIRECTTCPX_* and NCCL_SOCKET_* from
    /// it, and the zero-copy threshold under the plugin's name unless those set it); the other
    /// backends' from `env`. `Err` for a `TCPX_NETPLUGIN_DEV` that is no device index.
    pub fn for_experiment(
        exp: &tcpx_model::Experiment,
        env: &BackendEnv,
    ) -> std::result::Result<BackendConfig, String> {
        if exp.transport.capabilities().loads_a_net_plugin() {
            return Ok(BackendConfig::NetPlugin(netplugin_for_experiment(
                exp, env,
            )?));
        }
        let socket = SocketConfig {
            socks: exp.socks_per_channel as usize,
            sock_buf: exp.sock_buf.map(|b| b as usize),
            zero_copy_min: exp.zero_copy_min.map(|b| b as usize),
            pieces: Pieces {
                worker_cpus: exp.worker_cpus,
                ..Pieces::default()
            },
            ..SocketConfig::default()
        };
        Ok(BackendConfig::new(exp.transport, socket, env))
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

    /// `backend`'s settings: `socket` as given (its settings come with the experiment) with the
    /// worker threads of `env` (where they run, `worker_cpus`, stays the experiment's); the other
    /// backends' from `env` (what the binary read from its environment).
    pub fn new(backend: Backend, socket: SocketConfig, env: &BackendEnv) -> Self {
        match backend {
            Backend::Socket => BackendConfig::Socket(SocketConfig {
                pieces: Pieces {
                    worker_cpus: socket.pieces.worker_cpus,
                    ..env.socket_pieces
                },
                ..socket
            }),
            Backend::NetPlugin => BackendConfig::NetPlugin(env.netplugin()),
            Backend::Nccl => BackendConfig::Nccl(NcclConfig { gpu: env.nccl_gpu }),
            Backend::CudaP2p => BackendConfig::CudaP2p(CudaP2pConfig {
                mode: env.cudap2p_mode,
            }),
        }
    }
}

/// The GPU whose memory a transport carries, and how a backend that moves host memory only
/// stages it.
#[derive(Clone)]
pub struct GpuMemory {
    pub device: Device,
    /// Bytes of each comm's pinned staging ring; `None`: a pinned mirror as large as each GPU
    /// buffer ([`CudaStaging::with_ring`]).
    pub staging_ring: Option<usize>,
}

/// Opens the backend `cfg` is for. With `gpu`, the transport takes GPU memory of that GPU: the
/// net plugin registers it itself, `nccl` runs on it, backends that move host memory only are
/// wrapped in pinned staging ([`CudaStaging`], with `gpu`'s staging ring). A backend this build
/// or machine lacks is [`TransportError::Unavailable`].
pub fn open(cfg: &BackendConfig, gpu: Option<GpuMemory>) -> Result<Arc<dyn Transport>> {
    let staging_ring = gpu.as_ref().and_then(|g| g.staging_ring);
    let gpu = gpu.map(|g| g.device);
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
    if gpu.is_some() && cfg.backend().capabilities().gpu_memory == GpuMemoryPath::Staged {
        return Ok(Arc::new(CudaStaging::new(opened).with_ring(staging_ring)));
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

/// [`BackendConfig::for_experiment`]'s net plugin settings.
fn netplugin_for_experiment(
    exp: &tcpx_model::Experiment,
    env: &BackendEnv,
) -> std::result::Result<NetPluginConfig, String> {
    let mut cfg = env.netplugin();
    if let Some(p) = exp.env.get("NCCL_NET_PLUGIN").filter(|p| !p.is_empty()) {
        cfg.plugin = Some(p.clone());
    }
    if let Some(d) = exp.env.get("TCPX_NETPLUGIN_DEV") {
        cfg.dev = d.trim().parse().map_err(|_| {
            // At most 40 characters, control characters escaped: the value may be anything.
            let mut shown = String::new();
            for c in d.chars().take(40) {
                if c.is_control() {
                    shown.extend(c.escape_debug());
                } else {
                    shown.push(c);
                }
            }
            if d.chars().nth(40).is_some() {
                shown.push_str("...");
            }
            format!("TCPX_NETPLUGIN_DEV={shown} is not a device index (0, 1, ...)")
        })?;
    }
    cfg.env = exp
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let (Some(z), Some(var)) = (
        exp.zero_copy_min,
        tcpx_model::equivalence::var(
            tcpx_model::Knob::ZeroCopyMin,
            tcpx_model::equivalence::Reader::Nccl,
        ),
    ) {
        if !exp.env.contains_key(var) {
            cfg.env.push((var.to_string(), z.to_string()));
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_config_comes_from_the_experiment_over_the_binarys_environment() {
        let env = BackendEnv {
            socket_pieces: Pieces {
                threads: 2,
                ..Pieces::default()
            },
            net_plugin: Some("from-process".into()),
            netplugin_dev: 1,
            nccl_gpu: 3,
            ..BackendEnv::default()
        };
        let exp = |transport: Backend, vars: &[(&str, &str)]| tcpx_model::Experiment {
            transport,
            socks_per_channel: 6,
            sock_buf: Some(1 << 20),
            env: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            zero_copy_min: Some(64 << 10),
            worker_cpus: tcpx_model::WorkerCpus::Own,
            ..tcpx_model::Experiment::default()
        };
        match BackendConfig::for_experiment(&exp(Backend::Socket, &[]), &env).unwrap() {
            BackendConfig::Socket(c) => {
                assert_eq!(
                    (c.socks, c.sock_buf, c.zero_copy_min),
                    (6, Some(1 << 20), Some(64 << 10))
                );
                // Threads from the process, where they run from the experiment.
                assert_eq!(c.pieces.threads, 2);
                assert_eq!(c.pieces.worker_cpus, tcpx_model::WorkerCpus::Own);
            }
            other => panic!("{other:?}"),
        }
        match BackendConfig::for_experiment(&exp(Backend::Nccl, &[]), &env).unwrap() {
            BackendConfig::Nccl(c) => assert_eq!(c.gpu, 3),
            other => panic!("{other:?}"),
        }
        // The process's plugin and device unless the experiment names its own.
        match BackendConfig::for_experiment(&exp(Backend::NetPlugin, &[]), &env).unwrap() {
            BackendConfig::NetPlugin(c) => {
                assert_eq!((c.plugin.as_deref(), c.dev), (Some("from-process"), 1));
            }
            other => panic!("{other:?}"),
        }
        let vars = [
            ("NCCL_NET_PLUGIN", "from-experiment"),
            ("TCPX_NETPLUGIN_DEV", "2"),
            ("NCCL_SOCKET_NTHREADS", "4"),
        ];
        match BackendConfig::for_experiment(&exp(Backend::NetPlugin, &vars), &env).unwrap() {
            BackendConfig::NetPlugin(c) => {
                assert_eq!((c.plugin.as_deref(), c.dev), (Some("from-experiment"), 2));
                assert!(c.env.contains(&("NCCL_SOCKET_NTHREADS".into(), "4".into())));
            }
            other => panic!("{other:?}"),
        }
        let bad = exp(Backend::NetPlugin, &[("TCPX_NETPLUGIN_DEV", "x")]);
        let e = BackendConfig::for_experiment(&bad, &env).unwrap_err();
        assert!(e.contains("TCPX_NETPLUGIN_DEV=x"), "{e}");
        let bad = exp(Backend::NetPlugin, &[("TCPX_NETPLUGIN_DEV", "\u{1b}[2J")]);
        let e = BackendConfig::for_experiment(&bad, &env).unwrap_err();
        assert!(e.starts_with("TCPX_NETPLUGIN_DEV=\\u{1b}[2J is not"), "{e}");
    }

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
    fn the_environment_is_parsed_from_what_the_binary_looked_up_and_refusals_name_the_variable() {
        let vars = tcpx_test_support::env_lookup;
        assert_eq!(
            BackendEnv::from_vars(|_| None).unwrap(),
            BackendEnv::default()
        );
        let env = BackendEnv::from_vars(vars(&[
            ("NCCL_NET_PLUGIN", "/opt/libnccl-net-x.so"),
            ("TCPX_NETPLUGIN_DEV", "3"),
            ("TCPX_NCCL_GPU", " 2 "),
            ("TCPX_CUDAP2P_MODE", "write"),
        ]))
        .unwrap();
        assert_eq!(env.net_plugin.as_deref(), Some("/opt/libnccl-net-x.so"));
        assert_eq!(env.netplugin_dev, 3);
        assert_eq!(env.nccl_gpu, 2);
        assert_eq!(env.cudap2p_mode, CopyMode::Write);
        // Blank counts as unset.
        let blank = BackendEnv::from_vars(vars(&[("NCCL_NET_PLUGIN", " "), ("TCPX_NCCL_GPU", "")]));
        assert_eq!(blank.unwrap(), BackendEnv::default());
        // The socket layout switches are gone: even a value the old parser refused is not read.
        let removed = [
            ("TCPX_SOCKET_PIECE", "big"),
            ("TCPX_SOCKET_CALL", "1K"),
            ("TCPX_SOCKET_THREADS", "4"),
            ("TCPX_SOCKET_STRIPE", "1"),
            ("TCPX_SOCKET_BLOCKING", "1"),
            ("TCPX_SOCKET_RCVLOWAT", "256K"),
            ("TCPX_SOCKET_BUSY_POLL", "50"),
        ];
        assert_eq!(
            BackendEnv::from_vars(vars(&removed)).unwrap(),
            BackendEnv::default()
        );
        for name in removed.map(|(name, _)| name) {
            assert!(!BackendEnv::VARS.contains(&name), "{name}");
        }
        for (name, bad) in [
            ("TCPX_NETPLUGIN_DEV", "eth0"),
            ("TCPX_NCCL_GPU", "-1"),
            ("TCPX_CUDAP2P_MODE", "sideways"),
        ] {
            let e = BackendEnv::from_vars(|k| (k == name).then(|| bad.to_string()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name), "{name}={bad}: {e}");
        }
        // A value is quoted bounded.
        let long = "9".repeat(10_000);
        let e = BackendEnv::from_vars(|k| (k == "TCPX_NCCL_GPU").then(|| long.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{e}");
    }

    #[test]
    fn a_config_takes_the_environment_for_every_backend() {
        let env = BackendEnv {
            socket_pieces: Pieces {
                threads: 2,
                ..Pieces::default()
            },
            net_plugin: Some("x".into()),
            netplugin_dev: 1,
            nccl_gpu: 5,
            cudap2p_mode: CopyMode::Write,
        };
        let socket = SocketConfig {
            socks: 4,
            ..SocketConfig::default()
        };
        for b in Backend::ALL {
            let cfg = BackendConfig::new(b, socket.clone(), &env);
            assert_eq!(cfg.backend(), b);
            match cfg {
                BackendConfig::Socket(c) => {
                    assert_eq!(c.socks, 4);
                    assert_eq!(c.pieces, env.socket_pieces);
                }
                BackendConfig::NetPlugin(c) => {
                    assert_eq!((c.plugin.as_deref(), c.dev), (Some("x"), 1));
                }
                BackendConfig::Nccl(c) => assert_eq!(c.gpu, 5),
                BackendConfig::CudaP2p(c) => assert_eq!(c.mode, CopyMode::Write),
            }
        }
    }

    #[test]
    fn the_numbers_before_opening_are_the_backends_own() {
        assert_eq!(
            Backend::Socket.capabilities().max_requests,
            crate::socket::MAX_REQUESTS
        );
        assert_eq!(
            Backend::NetPlugin.capabilities().max_requests,
            tcpx_ffi::MAX_IN_FLIGHT
        );
        assert_eq!(
            Backend::Nccl.capabilities().max_requests,
            crate::nccl::MAX_REQUESTS
        );
        assert_eq!(
            Backend::CudaP2p.capabilities().max_requests,
            crate::cudap2p::MAX_REQUESTS
        );
    }

    #[test]
    fn each_backend_answers_what_it_can_do() {
        let caps = |b: Backend| b.capabilities();
        // Memory paths: only the socket backend needs staging for GPU memory.
        assert_eq!(caps(Backend::Socket).gpu_memory, GpuMemoryPath::Staged);
        for b in [Backend::NetPlugin, Backend::Nccl, Backend::CudaP2p] {
            assert_eq!(caps(b).gpu_memory, GpuMemoryPath::Direct, "{b}");
        }
        assert!(caps(Backend::Socket).host_memory && caps(Backend::NetPlugin).host_memory);
        assert!(!caps(Backend::Nccl).host_memory && !caps(Backend::CudaP2p).host_memory);
        // NICs: socket channels take theirs; the others say why a NIC choice is not applied.
        assert_eq!(caps(Backend::Socket).nics.not_applied(), None);
        let why = |b: Backend| caps(b).nics.not_applied().unwrap();
        assert!(why(Backend::NetPlugin).contains("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"));
        assert!(why(Backend::Nccl).contains("NCCL_SOCKET_IFNAME"));
        assert!(why(Backend::CudaP2p).contains("no NIC is involved"));
        // Open files: counted for the socket backend only, 4 a socket plus a listener per comm
        // (tests/open_file_cost.rs counts a real comm's).
        assert_eq!(caps(Backend::Socket).open_files.per_comm(8), Some(33));
        assert_eq!(
            caps(Backend::Socket).open_files.per_comm(u64::MAX),
            Some(u64::MAX)
        );
        for b in [Backend::NetPlugin, Backend::Nccl, Backend::CudaP2p] {
            assert_eq!(caps(b).open_files.per_comm(8), None, "{b}");
        }
        // NCCL equivalents.
        assert_eq!(caps(Backend::NetPlugin).nccl, NcclEquivalent::NetPlugin);
        assert_eq!(caps(Backend::Nccl).nccl, NcclEquivalent::Itself);
        assert!(
            matches!(caps(Backend::Socket).nccl, NcclEquivalent::Closest(t) if t.contains("NET/Socket"))
        );
        assert!(
            matches!(caps(Backend::CudaP2p).nccl, NcclEquivalent::Closest(t) if t.contains("P2P/NVLink"))
        );
        // Flows per process: libnccl's comm is one per process here.
        assert_eq!(caps(Backend::Nccl).flows_per_process, Some(1));
        assert_eq!(caps(Backend::Socket).flows_per_process, None);
    }

    #[test]
    fn the_socket_backend_opened_answers_as_its_capabilities_say() {
        let t = open(&BackendConfig::default_for(Backend::Socket), None).unwrap();
        // The limits known before opening are the opened transport's.
        assert_eq!(t.limits(), limits(Backend::Socket));
        // NIC placement per channel: it listens on the address a channel is given.
        let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert!(t.listen_on(local).is_ok());
        assert_eq!(t.max_comms(), None);
        // The threads a caller sets reach the transport.
        let env = BackendEnv {
            socket_pieces: Pieces {
                threads: 3,
                ..Pieces::default()
            },
            ..BackendEnv::default()
        };
        let cfg = BackendConfig::new(Backend::Socket, SocketConfig::default(), &env);
        let BackendConfig::Socket(c) = &cfg else {
            unreachable!("a socket config")
        };
        assert_eq!(SocketTransport::new(c.clone()).unwrap().pieces().threads, 3);
        // Out-of-range threads are refused by the one opener too.
        let bad = BackendConfig::Socket(SocketConfig {
            pieces: Pieces {
                threads: crate::socket::MAX_SOCKS + 1,
                ..Pieces::default()
            },
            ..SocketConfig::default()
        });
        assert!(open(&bad, None).is_err());
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
