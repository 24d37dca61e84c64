//! tcpx-fabric: an emulated fabric of 2 to 8 nodes on one Linux machine, so NIC-scaling,
//! multi-channel, process-layout and fleet (every pair of nodes, every NIC) criteria can be
//! measured for real before a campaign on A3 nodes.
//!
//! Each node is a network namespace (`tcpx-a-<id>`, `tcpx-b-<id>`, `tcpx-c-<id>`, ...) with N
//! NICs named `eth1..ethN` (as A3-high's data NICs); NIC k of node i has 10.231.k.(i+1).
//! - Two nodes ([`Layout::Pairs`]): NIC k of node A and NIC k of node B are the two ends of one
//!   veth pair, 10.231.k.1/30 and 10.231.k.2/30, so each NIC's traffic takes its own pair.
//! - Three to eight nodes ([`Layout::Switched`]): one emulated switch, the namespace
//!   `tcpx-sw-<id>`, with one bridge per NIC index (`br1..brN`: rail-aligned, as A3's NICs are);
//!   NIC k of every node is a veth into bridge k (port `<node letter>-eth<k>`), one /24 per rail.
//!
//! Each direction of each NIC is capped by a tbf qdisc at the given rate, on the node's end (what
//! it sends) and on the far end (what it receives), and delayed by netem where the kernel has
//! sch_netem. Nothing is configured in the root namespace: no link, address or route there
//! changes. A state file (`/run/tcpx-fabric/<id>.json`, or `TCPX_FABRIC_STATE_DIR`) is written
//! before the first change, so [`status`] recognises a fabric whose `up` was killed, and [`down`]
//! removes it (every namespace of any fabric size).
//!
//! Faults ([`fault`]) are set on a running fabric one NIC of one node at a time: a lower cap,
//! packet loss (netem, else an nftables drop rule in the node), the NIC taken down; each is
//! recorded in the state file, shown by `status` and gone with `down`.
//!
//! Each emulated NIC carries the NUMA node and PCI path of the A3-high NIC it stands for
//! ([`placement`]); [`Fabric::nic_infos`] and [`Fabric::gpu_places`] give the
//! `tcpx_sched::nic` inputs, so `numa-local` and `closest-pci` choose as they would on A3.
//!
//! Hooks for runners: [`Fabric::nodes`] lists the nodes; [`Fabric::command_in`] builds a
//! `Command` that runs a program inside a node (`ip netns exec`), e.g. the plan leader in A and
//! its follower in B, or one fleet process per node; [`Fabric::addrs`] gives each node's
//! `--nics`; [`Fabric::mark`] tells a process started there which fabric and node it is in, and
//! [`here`] answers that inside it, with the emulated placement (`tcpx-bench` takes NIC and GPU
//! places from it instead of sysfs); [`Fabric::run_in`] runs a closure inside a node, for
//! sockets a test makes there.
//!
//! What the `fabric` commands print (a fabric described, `down`'s summary, each fabric's status,
//! the stale-fabric line of `doctor` and `topo`) and `fabric exec`'s command are in [`text`], so
//! the command-line front end only parses arguments and prints.
//!
//! For: one-machine rehearsals of multi-NIC and multi-node plans, and CI (which runs as root).
//! Not for: real A3 figures (the rate is a tbf cap, the "wire" is memory, all nodes share CPUs),
//! the devmem/unpack path of GPUDirect-TCPX, or anything without root. It drives iproute2 (`ip`,
//! `tc`) and, for loss without netem, nftables (`nft`) as subprocesses with typed arguments and
//! reads their JSON output (`-j`).

#![forbid(unsafe_code)]

pub mod fabric;
pub mod fault;
pub mod fault_kind;
pub mod inside;
pub mod placement;
pub mod spec;
pub mod sys;
pub mod text;

pub use fabric::{
    bridge_name, check_root, command_in_ns, down, down_with, ns_name, require_root, run_in_ns,
    stale, status, switch_ns_name, switch_port_name, DownReport, Fabric, FabricStatus, Health,
    NicStatus, Phase, PortStatus, State, Step, UpOptions,
};
pub use fault::{
    loss_methods, Fault, FaultAction, FaultChange, FaultClass, FaultKind, FaultParseError,
    LossMethod,
};
pub use inside::{gpu_for_flow, here, Placement, FABRIC_ENV, FABRIC_NODE_ENV};
pub use placement::Node;
pub use spec::{
    default_state_dir, Delay, Layout, Loss, Rate, Spec, SpecError, Topology, DEFAULT_ID, MAX_NODES,
    MIN_NODES,
};
pub use text::{stale_summary, ExecError};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a fabric command could not be done. Each message says what to check or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    #[error("the fabric commands need root (effective uid is {euid}): namespaces, veth links and qdiscs need CAP_SYS_ADMIN and CAP_NET_ADMIN; run with sudo")]
    NotRoot { euid: u32 },
    #[error(
        "`{tool}` could not be started ({err}): install iproute2 (`apt-get install iproute2`)"
    )]
    ToolMissing { tool: &'static str, err: String },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    ToolFailed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("`{cmd}` did not finish within {secs} s and was stopped")]
    ToolTimeout { cmd: String, secs: u64 },
    #[error("`{cmd}` printed output that is not the JSON expected ({err}); check the iproute2 version (`ip -V`, needs -j support)")]
    BadOutput { cmd: String, err: String },
    #[error("fabric `{id}` already exists ({what}): `tcpx-run fabric status` shows it, `tcpx-run fabric down --id {id}` removes it")]
    Exists { id: String, what: String },
    #[error(
        "fabric `{id}` is being brought up by pid {pid}; wait for it or stop that process first (if pid {pid} is not that `fabric up`, its state file is stale: `tcpx-run fabric down --id {id} --force`)"
    )]
    Busy { id: String, pid: u32 },
    #[error("no fabric `{id}` (no state file {path}); `tcpx-run fabric status` lists what exists")]
    NotFound { id: String, path: String },
    #[error("a cap of {cap} is above fabric `{id}`'s rate of {rate}: a cap can only lower a NIC's rate (a higher one would be reported set but change nothing); `uncap` goes back to the fabric's rate")]
    CapAboveRate { id: String, cap: Rate, rate: Rate },
    #[error("a delay needs the netem qdisc, and this kernel has no sch_netem (neither built in, loaded, nor under /lib/modules): leave --delay out, or use a kernel with CONFIG_NET_SCH_NETEM")]
    NetemMissing,
    #[error("no carrier on {links} after {secs} s although both ends are up; check `ip -n <namespace> link`")]
    NoCarrier { links: String, secs: u64 },
    #[error("fabric `{id}` has no {what}: it has {nodes} nodes (a to {last}) and {nics} NIC(s) each (eth1 to eth{nics})", last = (b'a' + (*nodes as u8).clamp(1, 8) - 1) as char)]
    NotInFabric {
        id: String,
        what: String,
        nodes: u32,
        nics: u32,
    },
    #[error("fabric `{id}` is not up (its `fabric up` did not finish): `tcpx-run fabric status` says why")]
    NotReady { id: String },
    #[error("packet loss needs the kernel's sch_netem, nftables or iptables, and none is here: install nftables (`apt-get install nftables`), or use a kernel with CONFIG_NET_SCH_NETEM")]
    LossUnavailable,
    #[error("a loss by {0} is not possible here (`tcpx_fabric::fault::loss_methods` lists what is): netem needs the kernel's sch_netem, nftables the `nft` command, iptables the `iptables` command")]
    LossMethodMissing(String),
    #[error("interrupted; everything made so far was removed")]
    Cancelled,
    #[error("fabric state file {path}: {err}")]
    State { path: String, err: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// Whether this kernel has sch_netem (so `--delay` can be honoured).
pub fn netem_available() -> bool {
    sys::netem_available()
}

/// Installs this process's SIGINT/SIGTERM/SIGHUP handler setting the returned flag, for a CLI
/// that passes it to [`UpOptions::cancel`] so Ctrl-C during `up` rolls back. A library user
/// with its own signal handling passes its own flag instead.
pub fn cancel_on_signals() -> Result<Arc<AtomicBool>, String> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    ctrlc::set_handler(move || f.store(true, Ordering::SeqCst))
        .map_err(|e| format!("installing the Ctrl-C handler: {e}"))?;
    Ok(flag)
}
