//! The backends' settings from this process's environment, and the NIC places of the emulated
//! fabric node it may run in: read here, once per command, and passed down with the experiment
//! or the run's options. Libraries never look at the environment (see
//! `tcpx_transport::registry::BackendEnv`, `tcpx_bench::SideEnv`); a bad value stops the command
//! before anything starts, naming its variable.

use anyhow::anyhow;
use tcpx_transport::registry::BackendEnv;

/// The backend settings of this process's environment (`NCCL_NET_PLUGIN`, `TCPX_NETPLUGIN_DEV`,
/// `TCPX_NCCL_GPU`, `TCPX_CUDAP2P_MODE`).
pub fn from_process() -> anyhow::Result<BackendEnv> {
    from_lookup(|k| {
        // A value that is not UTF-8 is passed on as it reads, to be refused with its name.
        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned())
    })
}

/// [`from_process`] with the places of the emulated fabric node this process was started in
/// (`tcpx_fabric::here`: a runner marked it), for the bench's NIC plans.
pub fn side_env() -> anyhow::Result<tcpx_bench::SideEnv> {
    Ok(tcpx_bench::SideEnv {
        backends: from_process()?,
        places: places_from(|k| std::env::var(k).ok())?,
    })
}

/// The NIC and GPU places of the fabric node a lookup's runner marked; `None` outside one.
fn places_from(
    get: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<tcpx_bench::nics::NodePlaces>> {
    match tcpx_fabric::inside::here_from(get) {
        None => Ok(None),
        Some(p) => Ok(Some(
            p.map_err(|e| anyhow!("reading the emulated fabric's placement: {e}"))?
                .places(),
        )),
    }
}

/// [`from_process`] over any lookup (tests give a table).
fn from_lookup(get: impl Fn(&str) -> Option<String>) -> anyhow::Result<BackendEnv> {
    BackendEnv::from_vars(get).map_err(|e| anyhow!("{e}: fix or unset it"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_test_support::env_lookup;

    #[test]
    fn fabric_places_only_where_a_runner_marked_the_process() {
        assert!(places_from(env_lookup(&[])).unwrap().is_none());
        let e = places_from(env_lookup(&[
            ("TCPX_FABRIC", "f"),
            ("TCPX_FABRIC_NODE", "z"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("TCPX_FABRIC_NODE") && e.contains("placement"),
            "{e}"
        );
    }

    #[test]
    fn refusals_name_the_variable_and_the_removed_socket_switches_are_not_read() {
        // The socket layout switches are gone: their values, good or bad, change nothing.
        let env = from_lookup(env_lookup(&[
            ("TCPX_SOCKET_THREADS", "4K"),
            ("TCPX_SOCKET_PIECE", "lots"),
            ("TCPX_SOCKET_CALL", "2G"),
        ]))
        .unwrap();
        assert_eq!(env, BackendEnv::default());
        for (name, bad) in [
            ("TCPX_NETPLUGIN_DEV", "-1"),
            ("TCPX_NCCL_GPU", "gpu0"),
            ("TCPX_CUDAP2P_MODE", "both"),
        ] {
            let e = from_lookup(env_lookup(&[(name, bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name), "{name}={bad}: {e}");
        }
        let env = from_lookup(env_lookup(&[
            ("NCCL_NET_PLUGIN", "gpudirecttcpx"),
            ("TCPX_CUDAP2P_MODE", "write"),
        ]))
        .unwrap();
        assert_eq!(env.net_plugin.as_deref(), Some("gpudirecttcpx"));
        assert_eq!(env.cudap2p_mode.as_str(), "write");
    }
}
