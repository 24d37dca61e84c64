//! The variables that put the shim in front of the plugin a tuned set of variables names
//! (`tcpx-run apply --watch`): `NCCL_NET_PLUGIN=tcpxwatch` (NCCL then loads
//! `libnccl-net-tcpxwatch.so` from its library path), `TCPX_WATCH_INNER` = the plugin the set
//! named (or NCCL's default, `libnccl-net.so`), `TCPX_WATCH_DIR` = where the files go.

/// What `NCCL_NET_PLUGIN` is set to for the shim.
pub const SHIM_PLUGIN: &str = "tcpxwatch";
/// The plugin NCCL loads when `NCCL_NET_PLUGIN` is unset.
pub const NCCL_DEFAULT_PLUGIN: &str = "libnccl-net.so";

/// `vars` with the shim in front of their plugin, writing into `dir`; refused (with why) when
/// the set pins NCCL's own transport, which loads no plugin for the shim to wrap.
pub fn with_watch(vars: &[(String, String)], dir: &str) -> Result<Vec<(String, String)>, String> {
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.trim());
    let plugin = get("NCCL_NET_PLUGIN").filter(|p| !p.is_empty());
    if let Some(net) = get("NCCL_NET") {
        if net.eq_ignore_ascii_case("Socket") || net.eq_ignore_ascii_case("IB") {
            return Err(format!(
                "the tuned settings pin NCCL_NET={net}{}: NCCL then uses its own {net} transport \
                 and no net plugin, so the shim would see no traffic; watch a run that uses a \
                 plugin (GPUDirect-TCPX), or drop NCCL_NET",
                if plugin.is_some() {
                    ""
                } else {
                    " with no NCCL_NET_PLUGIN"
                }
            ));
        }
    }
    if plugin.is_some_and(crate::fallback::is_shim) {
        return Err(
            "the tuned settings already name the shim in NCCL_NET_PLUGIN: give the run's own \
             settings (the shim wraps the plugin they name)"
                .into(),
        );
    }
    if dir.is_empty() {
        return Err("the watch directory is empty: give a directory for TCPX_WATCH_DIR".into());
    }
    let mut out: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| k != "NCCL_NET_PLUGIN" && k != "TCPX_WATCH_INNER" && k != "TCPX_WATCH_DIR")
        .cloned()
        .collect();
    out.push(("NCCL_NET_PLUGIN".into(), SHIM_PLUGIN.into()));
    out.push((
        "TCPX_WATCH_INNER".into(),
        plugin.unwrap_or(NCCL_DEFAULT_PLUGIN).to_string(),
    ));
    out.push(("TCPX_WATCH_DIR".into(), dir.to_string()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_shim_goes_in_front_of_the_named_plugin_or_ncclsdefault() {
        let out = with_watch(
            &v(&[
                ("NCCL_NET_PLUGIN", "/usr/local/tcpx/lib64/libnccl-net.so"),
                ("NCCL_NSOCKS_PERTHREAD", "4"),
            ]),
            "/var/log/tcpx-watch",
        )
        .unwrap();
        assert_eq!(
            out,
            v(&[
                ("NCCL_NSOCKS_PERTHREAD", "4"),
                ("NCCL_NET_PLUGIN", "tcpxwatch"),
                ("TCPX_WATCH_INNER", "/usr/local/tcpx/lib64/libnccl-net.so"),
                ("TCPX_WATCH_DIR", "/var/log/tcpx-watch"),
            ])
        );
        let out = with_watch(&v(&[("NCCL_NET", "GPUDirectTCPX_v7")]), "/w").unwrap();
        assert!(out.contains(&("TCPX_WATCH_INNER".into(), "libnccl-net.so".into())));
        assert!(out.contains(&("NCCL_NET".into(), "GPUDirectTCPX_v7".into())));
    }

    #[test]
    fn a_socket_pin_or_the_shim_itself_is_refused() {
        let e = with_watch(&v(&[("NCCL_NET", "Socket")]), "/w").unwrap_err();
        assert!(
            e.contains("NCCL_NET=Socket with no NCCL_NET_PLUGIN") && e.contains("no net plugin"),
            "{e}"
        );
        let e = with_watch(&v(&[("NCCL_NET_PLUGIN", "tcpxwatch")]), "/w").unwrap_err();
        assert!(e.contains("already name the shim"), "{e}");
        assert!(with_watch(&v(&[]), "").is_err());
    }
}
