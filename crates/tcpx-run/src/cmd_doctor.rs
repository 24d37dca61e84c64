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

use tcpx_doctor::{examine, Inputs};

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

pub fn run(args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let inputs = Inputs {
        plugin: args.plugin.clone(),
        unix_prefix: args.unix_prefix.clone(),
        ifname: args.ifname.clone(),
        ctrl_dev: args.ctrl_dev.clone(),
        tx_bindings: args.tx_bindings.clone(),
        rx_bindings: args.rx_bindings.clone(),
        root: args.root.clone(),
        stale_fabric: crate::cmd_fabric::stale_summary(&args.root),
        dynamic_chunk: None,
    }
    .or_env(|k: &str| std::env::var_os(k));
    let report = examine(&inputs);
    if args.json {
        crate::print_json(report.to_json())?;
    } else {
        print!("{}", report.to_text());
    }
    if args.require.contains(&Requirement::Tcpx) && !report.tcpx_usable {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
