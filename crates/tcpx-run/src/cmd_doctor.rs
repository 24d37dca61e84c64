//! `tcpx-run doctor`: checks, one by one, what GPUDirect-TCPX needs on this machine and says what
//! to fix: the net plugin (loadable, version, name, devices), rxdm's Unix sockets, the data NICs
//! (up, speed, driver), the control NIC, the devmem counters, the TX/RX binding variables against
//! the topology, the GPUs, and the user the run is under; and which of tcpx-lab's backends open
//! here ([`tcpx_transport::registry::available`]).
//!
//! On a machine without TCPX it says so plainly and exits 0, unless `--require tcpx` asks for a
//! non-zero exit (for scripts that must stop there).

use std::path::PathBuf;
use std::process::ExitCode;

use tcpx_doctor::{examine, Inputs, Report};

/// What a run may insist on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// Exit 1 unless GPUDirect-TCPX is usable here.
    Tcpx,
}

/// Check each prerequisite of GPUDirect-TCPX and explain what to fix.
#[derive(clap::Args, Debug, Default)]
pub struct DoctorArgs {
    /// Net plugin to check, as NCCL_NET_PLUGIN names it (path or name); default: $NCCL_NET_PLUGIN,
    /// else libnccl-net.so
    #[arg(long)]
    pub plugin: Option<String>,
    /// Directory of rxdm's Unix sockets; default: $NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX, else /tmp
    /// (where the plugin looks when the variable is unset)
    #[arg(long)]
    pub unix_prefix: Option<PathBuf>,
    /// Data NICs, comma-separated; default: $NCCL_GPUDIRECTTCPX_SOCKET_IFNAME
    #[arg(long)]
    pub ifname: Option<String>,
    /// Control NIC; default: $NCCL_GPUDIRECTTCPX_CTRL_DEV
    #[arg(long)]
    pub ctrl_dev: Option<String>,
    /// TX bindings ("eth1:8-21,112-125;eth2:..."); default: $NCCL_GPUDIRECTTCPX_TX_BINDINGS
    #[arg(long)]
    pub tx_bindings: Option<String>,
    /// RX bindings; default: $NCCL_GPUDIRECTTCPX_RX_BINDINGS
    #[arg(long)]
    pub rx_bindings: Option<String>,
    /// Read /sys and /proc under this directory instead of / (a fixture tree)
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Exit 1 when the named stack is not usable (otherwise doctor only reports)
    #[arg(long, value_enum)]
    pub require: Vec<Requirement>,
    /// Print the findings as JSON
    #[arg(long)]
    pub json: bool,
}

fn setting(flag: &Option<String>, var: &str) -> Option<String> {
    flag.clone()
        .or_else(|| std::env::var(var).ok())
        .filter(|s| !s.trim().is_empty())
}

/// The checks' inputs: each flag, else its environment variable.
fn inputs(args: &DoctorArgs) -> Inputs {
    Inputs {
        plugin: setting(&args.plugin, "NCCL_NET_PLUGIN"),
        unix_prefix: args.unix_prefix.clone().or_else(|| {
            std::env::var_os("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        }),
        ifname: setting(&args.ifname, "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"),
        ctrl_dev: setting(&args.ctrl_dev, "NCCL_GPUDIRECTTCPX_CTRL_DEV"),
        tx_bindings: setting(&args.tx_bindings, "NCCL_GPUDIRECTTCPX_TX_BINDINGS"),
        rx_bindings: setting(&args.rx_bindings, "NCCL_GPUDIRECTTCPX_RX_BINDINGS"),
        root: args.root.clone(),
        stale_fabric: crate::cmd_fabric::stale_summary(&args.root),
    }
}

pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = examine(&inputs(args));
    if args.json {
        let findings: Vec<_> = report
            .findings
            .iter()
            .map(|f| {
                serde_json::json!({
                    "check": f.check, "status": f.status.word().to_lowercase(),
                    "detail": f.detail, "fix": f.fix,
                })
            })
            .collect();
        let out = serde_json::json!({
            "tcpx_usable": report.tcpx_usable,
            "missing": report.missing,
            "findings": findings,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&report));
    }
    if args.require.contains(&Requirement::Tcpx) && !report.tcpx_usable {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(report: &Report) -> String {
    let mut out = String::from("tcpx-run doctor: GPUDirect-TCPX prerequisites\n\n");
    let width = report
        .findings
        .iter()
        .map(|f| f.check.len())
        .max()
        .unwrap_or(0);
    for f in &report.findings {
        out += &format!(
            "  [{:^7}] {:<width$}  {}\n",
            f.status.word(),
            f.check,
            f.detail
        );
        if let Some(fix) = &f.fix {
            out += &format!("  {:9} {:<width$}  fix: {fix}\n", "", "");
        }
    }
    out += "\n";
    if report.tcpx_usable {
        out += "GPUDirect-TCPX: usable here (run a transfer and watch rx_devmem_pkts grow).\n";
    } else {
        out += &format!(
            "GPUDirect-TCPX is not available on this machine: {}.\n\
             The `socket` backend works anywhere; `--require tcpx` makes this a failure.\n",
            report.missing.join("; ")
        );
    }
    out
}
