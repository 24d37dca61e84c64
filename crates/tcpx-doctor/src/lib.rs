//! Checks, one by one, what GPUDirect-TCPX needs on a machine and says what to fix: the net
//! plugin (loadable, version, name, devices), rxdm's Unix sockets, the data NICs (up, speed,
//! driver), the control NIC, the devmem counters, the TX/RX binding variables against the
//! topology, the GPUs, the user the run is under, and which of tcpx-lab's backends open here
//! ([`tcpx_transport::registry::available`]).
//!
//! For: `tcpx-run doctor` and anything else that wants the same verdict as data ([`examine`] ->
//! [`Report`]). Not for: fixing anything (every check only reads), reading the environment
//! (the caller resolves flags and variables into [`Inputs`], [`Inputs::or_env`] with its own
//! lookup), or printing (the report as text and JSON is [`present`], printed by the caller).

#![forbid(unsafe_code)]

pub mod present;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tcpx_ffi::{DeviceKind, FfiError, MemoryKind, Plugin};
use tcpx_topo::{discover, Backend, BindingSpec, Nic, SysRoot, Topology};

/// What to check, each setting already resolved by the caller (flag, else environment variable).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Net plugin as NCCL_NET_PLUGIN names it (path or name); `None`: libnccl-net.so.
    pub plugin: Option<String>,
    /// Directory of rxdm's Unix sockets; `None`: /tmp, where the plugin looks by default.
    pub unix_prefix: Option<PathBuf>,
    /// Data NICs, comma-separated (NCCL_GPUDIRECTTCPX_SOCKET_IFNAME).
    pub ifname: Option<String>,
    /// Control NIC (NCCL_GPUDIRECTTCPX_CTRL_DEV).
    pub ctrl_dev: Option<String>,
    /// NCCL_GPUDIRECTTCPX_TX_BINDINGS / _RX_BINDINGS values.
    pub tx_bindings: Option<String>,
    pub rx_bindings: Option<String>,
    /// Read /sys and /proc under this directory (`/` for the live machine, or a fixture tree).
    pub root: PathBuf,
    /// A stale emulated fabric found by the caller, described (reported as a warning).
    pub stale_fabric: Option<String>,
    /// NCCL_DYNAMIC_CHUNK_SIZE, what GPUDirect-TCPX splits sends by (unset, it is 0 and stalls).
    pub dynamic_chunk: Option<String>,
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but not as TCPX wants it.
    Warn,
    /// Present and broken.
    Fail,
    /// Not on this machine at all.
    Absent,
    /// Not checked (and why is in the detail).
    Skipped,
}

impl Status {
    /// How reports print it.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
            Status::Absent => "absent",
            Status::Skipped => "skipped",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub check: String,
    pub status: Status,
    pub detail: String,
    /// What to do about it (None when nothing needs doing).
    pub fix: Option<String>,
}

fn finding(check: &str, status: Status, detail: String, fix: Option<&str>) -> Finding {
    Finding {
        check: check.to_string(),
        status,
        detail,
        fix: fix.map(str::to_string),
    }
}

/// Everything doctor found, and whether TCPX is usable.
#[derive(Debug, Clone)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub tcpx_usable: bool,
    /// Why not, in a few words each.
    pub missing: Vec<String>,
}

/// Runs every check.
pub fn examine(inputs: &Inputs) -> Report {
    let root = SysRoot::new(&inputs.root);
    let mut findings = Vec::new();
    let mut missing = Vec::new();

    // 1. The plugin.
    let spec = inputs.plugin.clone();
    let plugin_ok = check_plugin(spec.as_deref(), &mut findings);
    if !plugin_ok {
        missing.push("net plugin: no GPUDirect-TCPX plugin loaded".into());
    }

    check_dynamic_chunk(inputs.dynamic_chunk.as_deref(), &mut findings);

    // 2. rxdm.
    let prefix = inputs
        .unix_prefix
        .clone()
        .unwrap_or_else(|| PathBuf::from(RXDM_DEFAULT_PREFIX));
    if !check_rxdm(&prefix, &mut findings) {
        missing.push(format!("rxdm sockets: none under {}", prefix.display()));
    }

    // 3-6 need the topology.
    let topo = match discover(&root, Backend::Sysfs) {
        Ok(t) => Some(t),
        Err(e) => {
            findings.push(finding(
                "topology",
                Status::Fail,
                format!("cannot read {}: {e}", root.path("sys").display()),
                Some("run on the node itself (or point --root at a full fixture tree)"),
            ));
            None
        }
    };
    let ctrl = inputs.ctrl_dev.clone();
    let ifnames = inputs.ifname.clone();
    let mut data_nics: Vec<Nic> = Vec::new();
    if let Some(topo) = &topo {
        data_nics = check_data_nics(topo, ifnames.as_deref(), ctrl.as_deref(), &mut findings);
        if data_nics.is_empty() {
            missing.push("no data NIC up".into());
        }
        check_ctrl_nic(topo, ctrl.as_deref(), &mut findings);
        if topo.gpus.is_empty() {
            missing.push("no NVIDIA GPU".into());
            findings.push(finding(
                "gpus",
                Status::Absent,
                "no NVIDIA GPU on the PCI bus".into(),
                Some("TCPX receives into GPU memory: run on an A3 node (8 x H100)"),
            ));
        } else {
            findings.push(finding(
                "gpus",
                Status::Ok,
                format!("{} NVIDIA GPU(s)", topo.gpus.len()),
                None,
            ));
        }
        for (var, value) in [
            ("NCCL_GPUDIRECTTCPX_TX_BINDINGS", &inputs.tx_bindings),
            ("NCCL_GPUDIRECTTCPX_RX_BINDINGS", &inputs.rx_bindings),
        ] {
            check_bindings(topo, var, value.as_deref(), &mut findings);
        }
    } else {
        missing.push("topology unreadable".into());
    }
    check_devmem(&root, &data_nics, &mut findings);
    check_user(&root, &mut findings);
    if let Some(stale) = &inputs.stale_fabric {
        findings.push(finding(
            "emulated fabric",
            Status::Warn,
            format!("stale: {stale}"),
            Some("`tcpx-run fabric down --id <id>` removes it (`tcpx-run fabric status` lists it)"),
        ));
    }
    check_backends(spec.as_deref(), &mut findings);

    for f in &findings {
        if f.status == Status::Fail && !missing.iter().any(|m| m.contains(&f.check)) {
            missing.push(format!("{} failed (see its fix)", f.check));
        }
    }
    Report {
        tcpx_usable: missing.is_empty(),
        findings,
        missing,
    }
}

fn check_plugin(spec: Option<&str>, findings: &mut Vec<Finding>) -> bool {
    let plugin = match Plugin::load(spec) {
        Ok(p) => p,
        Err(e @ FfiError::Open { .. }) => {
            findings.push(finding(
                "net plugin",
                Status::Absent,
                e.to_string(),
                Some(
                    "install Google's nccl-plugin-gpudirecttcpx (libnccl-net.so) and put its \
                     directory on LD_LIBRARY_PATH, or set NCCL_NET_PLUGIN to its path",
                ),
            ));
            return false;
        }
        Err(e) => {
            findings.push(finding(
                "net plugin",
                Status::Fail,
                e.to_string(),
                Some(
                    "use a GPUDirect-TCPX plugin build matching this NCCL (v7 ABI or newer); its \
                     init needs a CUDA GPU and NICs named by NCCL_GPUDIRECTTCPX_SOCKET_IFNAME \
                     (and _CTRL_DEV) that exist: its warnings above say which step failed",
                ),
            ));
            return false;
        }
    };
    let head = format!(
        "{} ({} ABI) from {}",
        plugin.name(),
        plugin.version(),
        plugin.library()
    );
    let devices = match plugin.device_count() {
        Ok(n) => n,
        Err(e) => {
            findings.push(finding(
                "net plugin",
                Status::Fail,
                format!("{head}; devices failed: {e}"),
                Some("check the plugin's warnings and NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"),
            ));
            return false;
        }
    };
    let mut descs = Vec::new();
    let mut unpack = false;
    for d in 0..devices {
        match plugin.properties(d) {
            Ok(p) => {
                unpack |= matches!(p.device, DeviceKind::Unpack { .. });
                descs.push(format!(
                    "dev {d}: {} {} Gb/s {:?}{}",
                    p.name,
                    p.speed_mbps / 1000,
                    p.device,
                    if p.supports(MemoryKind::Cuda) {
                        ", CUDA memory"
                    } else {
                        ""
                    }
                ));
            }
            Err(e) => descs.push(format!("dev {d}: {e}")),
        }
    }
    let detail = format!("{head}; {devices} device(s): {}", descs.join("; "));
    if devices == 0 {
        findings.push(finding(
            "net plugin",
            Status::Fail,
            detail,
            Some("the plugin found no NIC: check NCCL_GPUDIRECTTCPX_SOCKET_IFNAME names data NICs that are up"),
        ));
        false
    } else if !unpack {
        findings.push(finding(
            "net plugin",
            Status::Warn,
            format!("{detail} -- not GPUDirect-TCPX (no UNPACK device)"),
            Some("set NCCL_NET_PLUGIN to the GPUDirect-TCPX plugin to use TCPX"),
        ));
        false
    } else {
        findings.push(finding("net plugin", Status::Ok, detail, None));
        true
    }
}

/// Where GPUDirect-TCPX looks for rxdm's sockets when NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX is unset.
const RXDM_DEFAULT_PREFIX: &str = "/tmp";

/// The sockets GPUDirect-TCPX connects to under the prefix: each accept installs a flow-steering
/// rule through the first, each close removes it through the second. (With
/// NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE=1 its init also registers at `rxdm_application_registry`.)
const RXDM_RULE_SOCKETS: [&str; 2] = ["rx_rule_manager", "rx_rule_uninstall"];

/// Which backends open here, and why the others do not (informational: TCPX needs `netplugin`,
/// checked above in detail).
fn check_backends(plugin: Option<&str>, findings: &mut Vec<Finding>) {
    use tcpx_transport::registry::{available, Backend, BackendConfig};
    let configs: Vec<BackendConfig> = Backend::ALL
        .into_iter()
        .map(|b| match BackendConfig::default_for(b) {
            BackendConfig::NetPlugin(mut c) => {
                c.plugin = plugin.map(str::to_string);
                BackendConfig::NetPlugin(c)
            }
            c => c,
        })
        .collect();
    let statuses = available(&configs);
    let detail = statuses
        .iter()
        .map(|s| match &s.unavailable {
            None => format!("{}: available", s.backend),
            Some(why) => format!("{}: unavailable ({why})", s.backend),
        })
        .collect::<Vec<_>>()
        .join("; ");
    findings.push(finding("backends", Status::Ok, detail, None));
}

fn check_rxdm(prefix: &std::path::Path, findings: &mut Vec<Finding>) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let fix = "start the receive data-path manager (the tcpgpudmarxd container) with this \
               directory mounted, and set NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX to it";
    let entries = match std::fs::read_dir(prefix) {
        Ok(e) => e,
        Err(e) => {
            findings.push(finding(
                "rxdm sockets",
                Status::Absent,
                format!("{}: {e}", prefix.display()),
                Some(fix),
            ));
            return false;
        }
    };
    let mut sockets: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    sockets.sort();
    if sockets.is_empty() {
        findings.push(finding(
            "rxdm sockets",
            Status::Fail,
            format!(
                "{} exists but holds no Unix socket: rxdm is not running",
                prefix.display()
            ),
            Some(fix),
        ));
        false
    } else if let Some(missing) = RXDM_RULE_SOCKETS
        .iter()
        .find(|n| !sockets.iter().any(|s| s == *n))
    {
        findings.push(finding(
            "rxdm sockets",
            Status::Fail,
            format!(
                "{} holds {} but not `{missing}`: GPUDirect-TCPX installs and removes a \
                 flow-steering rule through {} at every accept and close",
                prefix.display(),
                sockets.join(", "),
                RXDM_RULE_SOCKETS.join(" and ")
            ),
            Some(fix),
        ));
        false
    } else {
        findings.push(finding(
            "rxdm sockets",
            Status::Ok,
            format!(
                "{} socket(s) in {}: {}",
                sockets.len(),
                prefix.display(),
                sockets.join(", ")
            ),
            None,
        ));
        true
    }
}

fn nic_line(n: &Nic) -> String {
    format!(
        "{}, {}, driver {}, NUMA {}, PCI {}",
        n.state,
        n.speed_mbps
            .map_or("speed unknown".to_string(), |s| format!(
                "{} Gb/s",
                s / 1000
            )),
        n.driver.as_deref().unwrap_or("-"),
        n.pci
            .as_ref()
            .and_then(|p| p.numa)
            .map_or("-".to_string(), |n| n.to_string()),
        n.pci.as_ref().map_or("-", |p| p.bus_id.as_str()),
    )
}

/// GPUDirect-TCPX's dynamic chunk: unset it is 0 and every send stalls (issue 29).
fn check_dynamic_chunk(value: Option<&str>, findings: &mut Vec<Finding>) {
    use tcpx_transport::netplugin::{plugin_chunk, ChunkSource, DYNAMIC_CHUNK_DEFAULT};
    let check = "plugin chunk";
    match plugin_chunk(&Default::default(), value) {
        Ok(c) if c.source == ChunkSource::Supplied => findings.push(Finding {
            check: check.into(),
            status: Status::Warn,
            detail: format!(
                "NCCL_DYNAMIC_CHUNK_SIZE is unset: GPUDirect-TCPX then cuts sends into 0-byte \
                 pieces and stalls; tcpx-run bench and plans supply {DYNAMIC_CHUNK_DEFAULT}, \
                 NCCL and other launchers do not"
            ),
            fix: Some(format!(
                "export NCCL_DYNAMIC_CHUNK_SIZE={DYNAMIC_CHUNK_DEFAULT} (Google's A3 value)"
            )),
        }),
        Ok(c) => findings.push(finding(
            check,
            Status::Ok,
            format!("NCCL_DYNAMIC_CHUNK_SIZE={}", c.bytes),
            None,
        )),
        Err(e) => findings.push(Finding {
            check: check.into(),
            status: Status::Fail,
            detail: e,
            fix: Some(format!(
                "export NCCL_DYNAMIC_CHUNK_SIZE={DYNAMIC_CHUNK_DEFAULT}"
            )),
        }),
    }
}

/// Whether an interface's operstate lets it carry traffic: `up`, or `unknown` on a virtual
/// interface (loopback reports `unknown` while it works, as do tun/dummy devices).
fn carries_traffic(n: &Nic) -> bool {
    n.state == "up" || (n.state == "unknown" && n.is_virtual)
}

/// Checks the data NICs; returns those that are up.
fn check_data_nics(
    topo: &Topology,
    ifnames: Option<&str>,
    ctrl: Option<&str>,
    findings: &mut Vec<Finding>,
) -> Vec<Nic> {
    let names: Vec<String> = match ifnames {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => {
            let candidates: Vec<String> = topo
                .nics
                .iter()
                .filter(|n| !n.is_virtual && Some(n.name.as_str()) != ctrl.or(Some("eth0")))
                .map(|n| n.name.clone())
                .collect();
            findings.push(finding(
                "data NICs",
                if candidates.is_empty() {
                    Status::Absent
                } else {
                    Status::Warn
                },
                if candidates.is_empty() {
                    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME is unset and there is no physical NIC \
                     besides the control NIC"
                        .to_string()
                } else {
                    format!(
                        "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME is unset; candidates: {}",
                        candidates.join(",")
                    )
                },
                Some("set NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=eth1,eth2,eth3,eth4 (the gVNIC data NICs)"),
            ));
            candidates
        }
    };
    let mut up = Vec::new();
    for name in names {
        let check = format!("data NIC {name}");
        match topo.nics.iter().find(|n| n.name == name) {
            None => findings.push(finding(
                &check,
                Status::Fail,
                "no such interface".into(),
                Some("fix NCCL_GPUDIRECTTCPX_SOCKET_IFNAME: list interfaces with `ip link`"),
            )),
            Some(n) if !carries_traffic(n) => findings.push(finding(
                &check,
                Status::Fail,
                nic_line(n),
                Some("bring it up (`ip link set dev <nic> up`) and check its cable/VPC attachment"),
            )),
            Some(n) => {
                let slow = n.speed_mbps.is_some_and(|s| s < 100_000);
                let not_gve = n.driver.as_deref() != Some("gve");
                findings.push(finding(
                    &check,
                    if slow || not_gve {
                        Status::Warn
                    } else {
                        Status::Ok
                    },
                    nic_line(n),
                    (slow || not_gve).then_some(
                        "TCPX devmem needs gVNIC (driver gve) data NICs at 200 Gb/s on an A3 node",
                    ),
                ));
                up.push(n.clone());
            }
        }
    }
    up
}

fn check_ctrl_nic(topo: &Topology, ctrl: Option<&str>, findings: &mut Vec<Finding>) {
    let Some(name) = ctrl else {
        findings.push(finding(
            "control NIC",
            Status::Warn,
            "NCCL_GPUDIRECTTCPX_CTRL_DEV is unset".into(),
            Some("set NCCL_GPUDIRECTTCPX_CTRL_DEV=eth0 (the NIC for the plugin's control traffic)"),
        ));
        return;
    };
    match topo.nics.iter().find(|n| n.name == name) {
        Some(n) if carries_traffic(n) => findings.push(finding(
            "control NIC",
            Status::Ok,
            format!("{name}: {}", nic_line(n)),
            None,
        )),
        Some(n) => findings.push(finding(
            "control NIC",
            Status::Fail,
            format!("{name}: {}", nic_line(n)),
            Some("bring the control NIC up"),
        )),
        None => findings.push(finding(
            "control NIC",
            Status::Fail,
            format!("{name}: no such interface"),
            Some("fix NCCL_GPUDIRECTTCPX_CTRL_DEV: list interfaces with `ip link`"),
        )),
    }
}

fn check_bindings(topo: &Topology, var: &str, value: Option<&str>, findings: &mut Vec<Finding>) {
    let check = var.trim_start_matches("NCCL_GPUDIRECTTCPX_").to_lowercase();
    let Some(value) = value else {
        findings.push(finding(
            &check,
            Status::Ok,
            format!("{var} unset: the plugin uses each NIC's NUMA-local CPUs"),
            None,
        ));
        return;
    };
    let spec = match BindingSpec::parse(value) {
        Ok(s) => s,
        Err(e) => {
            findings.push(finding(
                &check,
                Status::Fail,
                format!("{var}={value}: {e}"),
                Some(
                    "write it as nic:cpulist;nic:cpulist, e.g. eth1:8-21,112-125;eth2:8-21,112-125",
                ),
            ));
            return;
        }
    };
    let mut problems = Vec::new();
    // Set but naming no NIC (`;;;`, blanks): the plugin would bind nothing.
    if spec.entries.is_empty() {
        problems.push("names no NIC (no nic:cpulist entry)".to_string());
    }
    if let Err(e) = spec.validate_for_tcpx() {
        problems.push(e);
    }
    for nic in &topo.nics {
        let Some(cpus) = spec.get(&nic.name) else {
            continue;
        };
        let Some(numa) = nic.pci.as_ref().and_then(|p| p.numa) else {
            continue;
        };
        if let Some(node) = topo.numa_nodes.iter().find(|n| n.id == numa) {
            let off = cpus.difference(&node.cpus);
            if !off.is_empty() {
                problems.push(format!(
                    "{}: CPUs {} are not on its NUMA node {numa} ({})",
                    nic.name, off, node.cpus
                ));
            }
        }
    }
    let unknown: Vec<String> = value
        .split(';')
        .filter_map(|e| e.split(':').next())
        .map(str::trim)
        .filter(|n| !n.is_empty() && !topo.nics.iter().any(|x| x.name == *n))
        .map(str::to_string)
        .collect();
    if !unknown.is_empty() {
        problems.push(format!("no such interface: {}", unknown.join(", ")));
    }
    if problems.is_empty() {
        findings.push(finding(&check, Status::Ok, format!("{var}={value}"), None));
    } else {
        findings.push(finding(
            &check,
            Status::Fail,
            format!("{var}={value}: {}", problems.join("; ")),
            Some("derive bindings from the topology: `tcpx-run topo` prints NUMA-local TX/RX sets"),
        ));
    }
}

/// Runs `ethtool -S nic` with a deadline; Err says why not.
fn ethtool_stats(nic: &str, deadline: Duration) -> Result<String, String> {
    let mut child = Command::new("ethtool")
        .args(["-S", nic])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ethtool: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "ethtool -S {nic} did not finish within {deadline:?}"
                ));
            }
            Err(e) => return Err(format!("waiting for ethtool: {e}")),
        }
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!("ethtool -S {nic}: {status}: {}", err.trim()));
    }
    Ok(out)
}

fn check_devmem(root: &SysRoot, nics: &[Nic], findings: &mut Vec<Finding>) {
    if !root.is_live() {
        findings.push(finding(
            "devmem counters",
            Status::Skipped,
            "reading a fixture tree: ethtool only sees the running system".into(),
            None,
        ));
        return;
    }
    if nics.is_empty() {
        findings.push(finding(
            "devmem counters",
            Status::Skipped,
            "no data NIC to read".into(),
            None,
        ));
        return;
    }
    for nic in nics {
        let check = format!("devmem {}", nic.name);
        match ethtool_stats(&nic.name, Duration::from_secs(5)) {
            Err(e) => findings.push(finding(
                &check,
                Status::Warn,
                e,
                Some("install ethtool (`apt-get install ethtool`) to read rx_devmem_pkts"),
            )),
            Ok(stats) => {
                let value = stats.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == "rx_devmem_pkts").then(|| v.trim().to_string())
                });
                match value {
                    None => findings.push(finding(
                        &check,
                        Status::Absent,
                        "no rx_devmem_pkts counter: this driver does not do devmem TCP".into(),
                        Some("TCPX needs the gve driver with devmem support (A3 images ship it)"),
                    )),
                    Some(v) => findings.push(finding(
                        &check,
                        Status::Ok,
                        format!("rx_devmem_pkts = {v} (grows while TCPX receives)"),
                        None,
                    )),
                }
            }
        }
    }
}

fn check_user(root: &SysRoot, findings: &mut Vec<Finding>) {
    use std::os::unix::fs::MetadataExt;
    if !root.is_live() {
        findings.push(finding(
            "user",
            Status::Skipped,
            "reading a fixture tree".into(),
            None,
        ));
        return;
    }
    match std::fs::metadata("/proc/self") {
        Ok(m) if m.uid() == 0 => findings.push(finding(
            "user",
            Status::Ok,
            "root: transfers, IRQ affinity and sysctl changes are all possible".into(),
            None,
        )),
        Ok(m) => findings.push(finding(
            "user",
            Status::Warn,
            format!("uid {}: transfers work; IRQ affinity (`tcpx-run irq apply`) and sysctl changes need root", m.uid()),
            Some("run plans that change IRQs or sysctls with sudo (they are restored on exit)"),
        )),
        Err(e) => findings.push(finding(
            "user",
            Status::Warn,
            format!("cannot read /proc/self: {e}"),
            None,
        )),
    }
}

#[cfg(test)]
mod operstate_tests {
    use super::*;

    fn nic(name: &str, state: &str, is_virtual: bool) -> Nic {
        Nic {
            name: name.into(),
            driver: None,
            speed_mbps: None,
            state: state.into(),
            is_virtual,
            pci: None,
            default_route: false,
        }
    }

    #[test]
    fn the_plugin_chunk_is_checked() {
        let status = |v: Option<&str>| {
            let mut f = Vec::new();
            check_dynamic_chunk(v, &mut f);
            assert_eq!(f.len(), 1);
            (f[0].status, f[0].detail.clone())
        };
        assert_eq!(status(None).0, Status::Warn);
        assert!(status(None).1.contains("0-byte"));
        assert_eq!(status(Some("524288")).0, Status::Ok);
        assert_eq!(status(Some("0")).0, Status::Fail);
        assert_eq!(status(Some("lots")).0, Status::Fail);
    }

    #[test]
    fn loopbacks_unknown_operstate_is_no_failure_but_a_down_or_unknown_physical_nic_is() {
        assert!(carries_traffic(&nic("lo", "unknown", true)));
        assert!(carries_traffic(&nic("eth1", "up", false)));
        assert!(!carries_traffic(&nic("lo", "down", true)));
        assert!(!carries_traffic(&nic("eth1", "unknown", false)));
        assert!(!carries_traffic(&nic("eth1", "down", false)));
    }
}
