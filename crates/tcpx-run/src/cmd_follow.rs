//! `tcpx-run follow`: the follower of a plan run. It connects to the leader (`tcpx-run
//! plans/x.rhai` on the other node), and for every experiment the leader sends it binds a bench
//! listener, applies its side's knobs (thread binding, IRQ policy, its own NICs), says where to
//! connect and runs `tcpx_bench::run_server` while the leader runs the client. With
//! `process_mode: "multi-process"` it reserves one control port per flow instead, tells the
//! leader the first, and runs one `tcpx-run bench --role server` child per flow.
//!
//! Also the leader/follower link shared with `cmd_plan`: JSON lines over TCP, the launcher
//! environment (Slurm, torchrun, Open MPI/PMI, JobSet), machine facts for plans, and the knob
//! helpers both sides use.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tcpx_affinity::{CpuSet, IrqGuard, IrqPolicy, SysRoot};
use tcpx_bench::Experiment;
use tcpx_plan::{IrqFact, NicFact, NumaFact, SystemFacts};

/// Version of the leader/follower link; both ends must match. 2: multi-process experiments
/// (`Ready.port` is the first of one port per flow) and NIC plans in `Done`. 3: `Abort`, and
/// an early `Done` that the leader reads while its processes still run.
pub const LINK_PROTOCOL: u32 = 3;
/// Port the leader listens on for its follower unless told otherwise.
pub const DEFAULT_PLAN_PORT: u16 = 5310;

/// One message on the link.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum LinkMsg {
    Hello {
        protocol: u32,
        version: String,
        host: String,
    },
    /// Run the server side of `exp`; `knobs` are the plan's knobs (binding, IRQ policy).
    Prepare {
        exp: Box<Experiment>,
        knobs: BTreeMap<String, Value>,
    },
    /// Listening for the bench client on `port`; knobs this side could not apply. For a
    /// multi-process experiment `port` is the first control port: flow `i`'s server child
    /// listens on `port + i`.
    Ready {
        port: u16,
        not_applied: BTreeMap<String, String>,
    },
    /// This side cannot run it (the leader records the experiment as failed).
    Refused {
        reason: String,
    },
    /// The server side finished (error text when it failed), with the NICs its channels used
    /// (`flow 0: eth1,eth2; ...`) when it named NICs.
    Done {
        error: Option<String>,
        #[serde(default)]
        nic_plan: Option<String>,
    },
    /// Leader to follower, during a multi-process experiment: the leader's processes failed,
    /// stop the server processes now rather than letting them wait for clients that will not
    /// come. The follower still answers with `Done`. One that arrives after the follower's
    /// `Done` (the two crossed) is ignored.
    Abort {
        reason: String,
    },
    Bye,
}

/// Why a link read failed.
#[derive(Debug)]
pub enum LinkError {
    Closed,
    Timeout,
    Other(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Closed => write!(f, "the connection was closed"),
            LinkError::Timeout => write!(f, "nothing arrived in time"),
            LinkError::Other(e) => write!(f, "{e}"),
        }
    }
}

/// The leader/follower connection.
pub struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl Link {
    pub fn new(stream: TcpStream) -> std::io::Result<Link> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let local = stream.local_addr()?;
        Ok(Link {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            peer,
            local,
        })
    }

    pub fn send(&mut self, m: &LinkMsg) -> Result<(), LinkError> {
        let mut line = serde_json::to_string(m).map_err(|e| LinkError::Other(e.to_string()))?;
        line.push('\n');
        self.writer
            .set_write_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| LinkError::Other(e.to_string()))?;
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted => LinkError::Closed,
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => LinkError::Timeout,
                _ => LinkError::Other(e.to_string()),
            })
    }

    /// Whether a message (or the end of the connection) is waiting, without blocking: then
    /// [`Link::recv`] returns at once, as a peer writes each message in one piece.
    pub fn readable(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let stream = self.reader.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let waiting = match stream.peek(&mut byte) {
            // Data, or end of file (0): either way `recv` has something to say.
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        // The reader and writer share one open file: back to blocking for both.
        let _ = stream.set_nonblocking(false);
        waiting
    }

    /// The next message if one (or the end of the connection) is already waiting, else `None`
    /// at once: for checking the link between other work.
    pub fn try_recv(&mut self) -> Option<Result<LinkMsg, LinkError>> {
        // A peer writes each message in one piece, so the rest of a begun line is moments away.
        self.readable().then(|| self.recv(Duration::from_secs(5)))
    }

    pub fn recv(&mut self, wait: Duration) -> Result<LinkMsg, LinkError> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .map_err(|e| LinkError::Other(e.to_string()))?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(LinkError::Closed),
            Ok(_) => serde_json::from_str(&line).map_err(|e| {
                LinkError::Other(format!("unreadable message `{}`: {e}", line.trim()))
            }),
            Err(e) => Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => LinkError::Timeout,
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
                    LinkError::Closed
                }
                _ => LinkError::Other(e.to_string()),
            }),
        }
    }
}

/// Rank and leader as a launcher describes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub rank: u32,
    /// Leader host, when the launcher says.
    pub leader: Option<String>,
    /// Which launcher: `slurm`, `torchrun`, `openmpi`, `pmi`, `jobset`.
    pub source: &'static str,
}

/// First host of a Slurm node list: `a3-[001-002,7],b` -> `a3-001`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut depth = 0;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let first = &list[..end];
    match first.find('[') {
        None => Some(first.to_string()),
        Some(i) => {
            let inner = first[i + 1..].trim_end_matches(']');
            let item = inner.split(',').next()?;
            let start = item.split('-').next()?;
            Some(format!("{}{}", &first[..i], start))
        }
    }
}

/// Reads rank and leader from a launcher's environment (`get` is `std::env::var` in use).
/// `TCPX_LEADER` overrides the leader host of any launcher.
pub fn launch_from_env(get: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let explicit = get("TCPX_LEADER").filter(|s| !s.is_empty());
    let (rank, mut leader, source) = if let Some(r) = num("SLURM_PROCID") {
        let nodes = get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"));
        (r, nodes.as_deref().and_then(first_slurm_host), "slurm")
    } else if let (Some(r), Some(_)) = (num("RANK"), get("MASTER_ADDR")) {
        (r, get("MASTER_ADDR"), "torchrun")
    } else if let Some(r) = num("OMPI_COMM_WORLD_RANK") {
        (r, get("MASTER_ADDR"), "openmpi")
    } else if let Some(r) = num("PMI_RANK") {
        (r, get("MASTER_ADDR"), "pmi")
    } else if let Some(r) = num("JOB_COMPLETION_INDEX") {
        (r, get("MASTER_ADDR"), "jobset")
    } else {
        return None;
    };
    if explicit.is_some() {
        leader = explicit;
    }
    Some(Launch {
        rank,
        leader,
        source,
    })
}

fn read_euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// What plans may read about this machine.
pub fn gather_facts(peer: &str) -> SystemFacts {
    let root = SysRoot::live();
    let mut warnings = Vec::new();
    let mut facts = SystemFacts {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        is_root: read_euid() == Some(0),
        transports: vec!["socket".into()],
        peer: peer.to_string(),
        ..SystemFacts::default()
    };
    match tcpx_topo::discover(&root, tcpx_topo::Backend::Auto) {
        Ok(topo) => {
            facts.cpus = topo.cpus.len() as u32;
            facts.numa_nodes = topo
                .numa_nodes
                .iter()
                .map(|n| NumaFact {
                    id: n.id,
                    cpus: n.cpus.to_list_string(),
                })
                .collect();
            let plan = tcpx_topo::derive(&topo, &tcpx_topo::BindingRule::default());
            facts.tx_bindings = plan.tx_bindings.to_string();
            facts.rx_bindings = plan.rx_bindings.to_string();
            facts.gpus = topo
                .gpus
                .iter()
                .map(|g| tcpx_plan::GpuFact {
                    bus_id: g.pci.bus_id.clone(),
                    numa_node: g.pci.numa,
                    nic: plan
                        .pairings
                        .iter()
                        .find(|p| p.gpu == g.index)
                        .and_then(|p| p.nic.clone()),
                })
                .collect();
            facts.nics = topo
                .nics
                .iter()
                .map(|n| NicFact {
                    name: n.name.clone(),
                    driver: n.driver.clone().unwrap_or_default(),
                    numa_node: n.pci.as_ref().and_then(|p| p.numa),
                    speed_mbps: n.speed_mbps,
                    irqs: vec![],
                })
                .collect();
            warnings.extend(topo.warnings.iter().cloned());
        }
        Err(e) => warnings.push(format!("topology: {e}")),
    }
    match tcpx_affinity::queue_irqs(&root) {
        Ok((_, queues)) => {
            for q in queues {
                let affinity = root
                    .read_opt(format!("/proc/irq/{}/smp_affinity_list", q.irq))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                if let Some(n) = facts.nics.iter_mut().find(|n| n.name == q.nic) {
                    n.irqs.push(IrqFact {
                        irq: q.irq,
                        direction: format!("{:?}", q.direction).to_lowercase(),
                        queue: q.queue,
                        affinity,
                    });
                }
            }
        }
        Err(e) => warnings.push(format!("IRQs: {e}")),
    }
    facts.warnings = warnings;
    facts
}

/// Which end of a transfer this process plays, for bindings.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The sender (client): TX bindings.
    Send,
    /// The receiver (server): RX bindings.
    Recv,
}

fn knob_text(knobs: &BTreeMap<String, Value>, k: &str) -> String {
    knobs
        .get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The CPUs to pin the experiment's threads to: `Ok(None)` for no binding, `Err(reason)` when
/// the binding asked for cannot act here.
pub fn binding_for(
    knobs: &BTreeMap<String, Value>,
    facts: &SystemFacts,
    end: End,
) -> Result<Option<CpuSet>, String> {
    let online: CpuSet = (0..facts.cpus).collect();
    let set = match knob_text(knobs, "thread_binding").as_str() {
        "" | "none" => return Ok(None),
        "numa-local" => {
            let node = facts
                .numa_nodes
                .first()
                .ok_or("no NUMA node is known here")?;
            CpuSet::parse_list(&node.cpus).map_err(|e| e.to_string())?
        }
        "nccl" => {
            let spec = match end {
                End::Send => &facts.tx_bindings,
                End::Recv => &facts.rx_bindings,
            };
            if spec.is_empty() {
                return Err(
                    "no NCCL TX/RX bindings derive on this machine (no GPU/NIC pairs)".into(),
                );
            }
            let parsed = tcpx_affinity::BindingSpec::parse(spec).map_err(|e| e.to_string())?;
            let first = parsed
                .entries
                .first()
                .ok_or("the derived binding is empty")?;
            first.cpus.clone()
        }
        other => return Err(format!("unknown thread binding `{other}`")),
    };
    if set.is_empty() {
        return Err("the binding has no CPUs".into());
    }
    if facts.cpus > 0 && set == online {
        return Err(format!(
            "the binding is every online CPU ({}), so pinning would change nothing",
            set.to_list_string()
        ));
    }
    Ok(Some(set))
}

/// What became of an IRQ policy request.
pub enum IrqOutcome {
    NotRequested,
    /// Could not act here; the experiment still runs.
    NotApplied(String),
    /// Must not run without it (root missing): the experiment is skipped with this reason.
    Refused(String),
    /// Applied; restored when the guard is dropped or restored.
    Applied(IrqGuard),
}

/// Applies the IRQ policy the knobs ask for on this node, if it can act here.
pub fn irq_for(knobs: &BTreeMap<String, Value>, facts: &SystemFacts, loopback: bool) -> IrqOutcome {
    let kind = knob_text(knobs, "irq_policy");
    if kind.is_empty() || kind == "default" {
        return IrqOutcome::NotRequested;
    }
    if loopback {
        return IrqOutcome::NotApplied(
            "the traffic runs over loopback, which has no NIC queue IRQs".into(),
        );
    }
    if !facts.is_root {
        return IrqOutcome::Refused(format!(
            "irq_policy `{kind}` needs root (it writes /proc/irq/*/smp_affinity): run the plan with sudo, or leave irq_policy at \"default\""
        ));
    }
    if facts.tx_bindings.is_empty() || facts.rx_bindings.is_empty() {
        return IrqOutcome::NotApplied(
            "no TX/RX core sets derive on this machine (no GPU/NIC pairs)".into(),
        );
    }
    let parse = |s: &str| tcpx_affinity::BindingSpec::parse(s).map_err(|e| e.to_string());
    let policy = match (parse(&facts.tx_bindings), parse(&facts.rx_bindings)) {
        (Ok(tx), Ok(rx)) => IrqPolicy {
            tx,
            rx,
            spread: Default::default(),
        },
        (Err(e), _) | (_, Err(e)) => return IrqOutcome::NotApplied(e),
    };
    let root = SysRoot::live();
    let plan = match policy.plan(&root) {
        Ok(p) => p,
        Err(e) => return IrqOutcome::NotApplied(format!("planning the IRQ policy: {e}")),
    };
    // Ctrl-C / SIGTERM while applied: restore, then exit (the report so far is on disk).
    tcpx_affinity::install_signal_restore();
    match plan.apply_guarded(&tcpx_affinity::default_backup_path(&root)) {
        Ok(g) => IrqOutcome::Applied(g),
        Err(e) => IrqOutcome::NotApplied(format!("applying the IRQ policy: {e} (rolled back)")),
    }
}

/// What the `nics` knob becomes on one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicChoice {
    /// One NIC: the backend's default address (the route to the peer), no channel placement.
    Default,
    /// These NICs, for `Experiment::nics` (loopback addresses or interface names).
    Use(Vec<String>),
    /// The backend cannot place channels on NICs: runs without a NIC choice, reason recorded.
    NotApplied(String),
    /// This side has fewer usable NICs than asked: the experiment is skipped with the reason.
    Missing(String),
}

/// The interfaces a real fabric's channels may use, best first: up, not loopback, with an IPv4
/// address; the NICs the topology pairs with GPUs (the data NICs) before the others.
pub fn usable_nics(interfaces: &[tcpx_bench::nics::Interface], facts: &SystemFacts) -> Vec<String> {
    let usable = |i: &&tcpx_bench::nics::Interface| {
        i.up && i.name != "lo"
            && i.addrs
                .iter()
                .any(|a| matches!(a, IpAddr::V4(v4) if !v4.is_loopback()))
    };
    let mut out: Vec<String> = Vec::new();
    for nic in facts.gpus.iter().filter_map(|g| g.nic.as_deref()) {
        if !out.iter().any(|n| n == nic) && interfaces.iter().filter(usable).any(|i| i.name == nic)
        {
            out.push(nic.to_string());
        }
    }
    for i in interfaces.iter().filter(usable) {
        if !out.contains(&i.name) {
            out.push(i.name.clone());
        }
    }
    out
}

/// This side's NICs for the `nics` knob. One NIC keeps the backend's default address. Over
/// loopback, N NICs are the emulated 127.0.0.2 ..= 127.0.0.(N+1) (all on `lo`); on a real
/// fabric, the first N of [`usable_nics`]. Only the socket backend binds channels to NICs.
pub fn nics_for(knobs: &BTreeMap<String, Value>, facts: &SystemFacts, loopback: bool) -> NicChoice {
    let n = knobs.get("nics").and_then(Value::as_u64).unwrap_or(1);
    if n <= 1 {
        return NicChoice::Default;
    }
    match knob_text(knobs, "transport").as_str() {
        "" | "socket" => {}
        "cudap2p" => {
            return NicChoice::NotApplied(
                "cudap2p copies between GPUs of one node: no NIC is involved".into(),
            )
        }
        "nccl" => {
            return NicChoice::NotApplied(
                "NCCL picks its NICs itself (NCCL_SOCKET_IFNAME / NCCL_GPUDIRECTTCPX_SOCKET_IFNAME in the experiment's env)".into(),
            )
        }
        other => {
            return NicChoice::NotApplied(format!(
                "the {other} backend picks its NICs itself (NCCL_GPUDIRECTTCPX_SOCKET_IFNAME in the experiment's env)"
            ))
        }
    }
    if loopback {
        return NicChoice::Use((2..=n + 1).map(|i| format!("127.0.0.{i}")).collect());
    }
    let interfaces = match tcpx_bench::nics::local_interfaces() {
        Ok(i) => i,
        Err(e) => return NicChoice::Missing(e),
    };
    let usable = usable_nics(&interfaces, facts);
    if (usable.len() as u64) < n {
        return NicChoice::Missing(format!(
            "{n} NICs asked for, but this machine has {} usable (up, not loopback, with an IPv4 address){}: lower `nics`, or bring more interfaces up",
            usable.len(),
            if usable.is_empty() {
                String::new()
            } else {
                format!(": {}", usable.join(", "))
            }
        ));
    }
    NicChoice::Use(usable.into_iter().take(n as usize).collect())
}

/// Why `nic_policy` cannot act, if it cannot: one NIC or none placed, or emulated NICs with no
/// NUMA node or PCI place (numa-local and closest-pci then go round-robin).
pub fn nic_policy_not_applied(
    knobs: &BTreeMap<String, Value>,
    choice: &NicChoice,
    loopback: bool,
) -> Option<String> {
    let policy = knob_text(knobs, "nic_policy");
    if policy.is_empty() || policy == "round-robin" {
        return None;
    }
    match choice {
        NicChoice::Use(_) if loopback => Some(format!(
            "emulated loopback NICs have no NUMA node or PCI place, so {policy} gives channels round-robin"
        )),
        NicChoice::Use(_) => None,
        _ => Some("no NICs are placed for this experiment (nics is 1, or the backend picks them)".into()),
    }
}

/// A TCP socket bound to `ip:port` that does not listen, without SO_REUSEADDR.
///
/// Why not a `TcpListener`: a listening socket completes the handshake of a client that comes
/// early (the leader starts its clients as soon as it reads `Ready`), and dropping it then
/// resets that connection, which the client reports as the server closing the control
/// connection. A bound socket that does not listen refuses the connection, and the client
/// tries again until the flow's own process listens. Without SO_REUSEADDR here, a child's bind
/// (std sets SO_REUSEADDR) still fails with "address in use" while the port is held.
fn bind_unlistened(ip: IpAddr, port: u16) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let addr = SocketAddr::new(ip, port);
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// The port a socket from [`bind_unlistened`] holds.
fn held_port(s: &socket2::Socket) -> Result<u16, String> {
    s.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .ok_or_else(|| "reading the port of a reserved socket".to_string())
}

/// Binds `count` consecutive free ports on `ip` and keeps them bound (not listening, so an
/// early client is refused and retries rather than being accepted and reset): the caller
/// releases them right before the processes that take them over start. Returns the first port.
pub fn reserve_ports(ip: IpAddr, count: u32) -> Result<(u16, Vec<socket2::Socket>), String> {
    let mut last = String::new();
    for _ in 0..64 {
        let first =
            bind_unlistened(ip, 0).map_err(|e| format!("binding a control port on {ip}: {e}"))?;
        let base = held_port(&first)?;
        if u32::from(base) + count > 65536 {
            continue;
        }
        let mut held = vec![first];
        for i in 1..count {
            match bind_unlistened(ip, base + i as u16) {
                Ok(l) => held.push(l),
                Err(e) => {
                    last = format!("port {} was taken ({e})", u32::from(base) + i);
                    break;
                }
            }
        }
        if held.len() as u32 == count {
            return Ok((base, held));
        }
    }
    Err(format!(
        "found no {count} consecutive free control ports on {ip} in 64 tries (last: {last}): free some ports or use fewer flows"
    ))
}

/// Knobs the leader cannot apply for an experiment with `knobs` on this machine, with the reason,
/// decided without running anything (the runner's answer to `not_applied_here(exp)`).
pub fn knobs_not_applied(
    knobs: &BTreeMap<String, Value>,
    facts: &SystemFacts,
    loopback: bool,
) -> BTreeMap<String, String> {
    let mut na = BTreeMap::new();
    let choice = nics_for(knobs, facts, loopback);
    match &choice {
        NicChoice::NotApplied(r) => {
            na.insert("nics".into(), r.clone());
        }
        NicChoice::Missing(r) => {
            na.insert(
                "nics".into(),
                format!("{r}; the experiment will be skipped"),
            );
        }
        NicChoice::Default | NicChoice::Use(_) => {}
    }
    if let Some(r) = nic_policy_not_applied(knobs, &choice, loopback) {
        na.insert("nic_policy".into(), r);
    }
    let kind = knob_text(knobs, "irq_policy");
    if !kind.is_empty() && kind != "default" {
        if loopback {
            na.insert(
                "irq_policy".into(),
                "the traffic runs over loopback, which has no NIC queue IRQs".into(),
            );
        } else if !facts.is_root {
            na.insert(
                "irq_policy".into(),
                "needs root: the experiment will be skipped".into(),
            );
        } else if facts.tx_bindings.is_empty() || facts.rx_bindings.is_empty() {
            na.insert(
                "irq_policy".into(),
                "no TX/RX core sets derive on this machine (no GPU/NIC pairs)".into(),
            );
        }
    }
    if let Err(r) = binding_for(knobs, facts, End::Send) {
        na.insert("thread_binding".into(), r);
    }
    na
}

/// Runs `f` on a thread pinned to `cpus` (threads it starts inherit the mask); the error text
/// when pinning failed or the kernel applied another mask.
pub fn run_pinned<T: Send>(
    cpus: Option<&CpuSet>,
    f: impl FnOnce() -> T + Send,
) -> (T, Option<String>) {
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let pin_error = cpus.and_then(|c| match tcpx_affinity::pin_current_thread(c) {
                Ok(r) if r.matches() => None,
                Ok(r) => Some(format!("pinned, but {r}")),
                Err(e) => Some(format!("pinning failed: {e}")),
            });
            (f(), pin_error)
        });
        match h.join() {
            Ok(x) => x,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// Connects to `addr`, retrying until `deadline` (the leader may start later).
pub fn connect_until(addr: &str, deadline: Instant) -> anyhow::Result<TcpStream> {
    let mut last = String::new();
    loop {
        match addr.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = format!("{a}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("resolving {addr}: {e}"),
        }
        if Instant::now() >= deadline {
            bail!("could not reach the leader at {addr} ({last}): is `tcpx-run plans/<plan>.rhai` running there, and is the port open?");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Options of the follower loop.
#[derive(Clone, Debug)]
pub struct FollowOpts {
    /// Longest wait for the leader's next message.
    pub idle: Duration,
    /// Test hook: exit the process when asked for experiment number `n + 1`.
    pub fail_after: Option<u32>,
    /// Test hook: in the first multi-process experiment, flow `f`'s server child accepts its
    /// client and exits with status 3, as a crashed worker process would.
    pub fail_flow: Option<u32>,
    /// Test hook: in the first multi-process experiment, flow `f`'s reserved control port stays
    /// bound here, so its server child finds the port taken.
    pub hold_port: Option<u32>,
}

/// Test hooks for one multi-process experiment's server children.
#[derive(Clone, Copy, Debug, Default)]
struct ChildHooks {
    exit_after_accept: Option<u32>,
    hold_port: Option<u32>,
}

/// The follower: handshake, then serve experiments until the leader says goodbye. Returns the
/// number of experiments served.
pub fn serve(stream: TcpStream, opts: &FollowOpts) -> anyhow::Result<u32> {
    let mut link = Link::new(stream).context("setting up the link to the leader")?;
    let host = gather_facts(&link.peer.to_string());
    link.send(&LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: host.hostname.clone(),
    })
    .map_err(|e| anyhow::anyhow!("greeting the leader at {}: {e}", link.peer))?;
    match link.recv(Duration::from_secs(30)) {
        Ok(LinkMsg::Hello { protocol, .. }) if protocol == LINK_PROTOCOL => {}
        Ok(LinkMsg::Hello { protocol, version, .. }) => bail!(
            "the leader speaks link protocol {protocol} (tcpx-run {version}), this follower {LINK_PROTOCOL}: run the same tcpx-run build on both nodes"
        ),
        Ok(other) => bail!("the leader sent {other:?} instead of a greeting"),
        Err(e) => bail!("waiting for the leader's greeting from {}: {e}", link.peer),
    }
    let loopback = link.peer.ip().is_loopback();
    let mut served = 0u32;
    let mut hooks = Some(ChildHooks {
        exit_after_accept: opts.fail_flow,
        hold_port: opts.hold_port,
    });
    loop {
        let msg = match link.recv(opts.idle) {
            Ok(m) => m,
            Err(LinkError::Closed) => bail!(
                "the leader at {} closed the connection without saying goodbye (did it crash? see its output) after {served} experiments",
                link.peer
            ),
            Err(LinkError::Timeout) => bail!(
                "the leader at {} sent nothing for {} s: giving up",
                link.peer,
                opts.idle.as_secs()
            ),
            Err(e) => bail!("reading from the leader at {}: {e}", link.peer),
        };
        match msg {
            LinkMsg::Bye => return Ok(served),
            // The leader's stop request crossed our `Done`: that experiment is over already.
            LinkMsg::Abort { .. } => continue,
            LinkMsg::Prepare { exp, knobs } => {
                if opts.fail_after.is_some_and(|n| served >= n) {
                    // Test hook: vanish like a crashed node would (the OS closes the link
                    // mid-experiment); exit rather than abort so no core file is left behind.
                    eprintln!("tcpx-run follow: --fail-after {served}: exiting now");
                    std::process::exit(101);
                }
                served += 1;
                let mut not_applied = BTreeMap::new();
                let irq = irq_for(&knobs, &host, loopback);
                let _guard = match irq {
                    IrqOutcome::Refused(r) => {
                        let _ = link.send(&LinkMsg::Refused { reason: r });
                        continue;
                    }
                    IrqOutcome::NotApplied(r) => {
                        not_applied.insert("irq_policy".into(), r);
                        None
                    }
                    IrqOutcome::Applied(g) => Some(g),
                    IrqOutcome::NotRequested => None,
                };
                let cpus = match binding_for(&knobs, &host, End::Recv) {
                    Ok(c) => c,
                    Err(r) => {
                        not_applied.insert("thread_binding".into(), r);
                        None
                    }
                };
                let mut exp = *exp;
                let choice = nics_for(&knobs, &host, loopback);
                if let Some(r) = nic_policy_not_applied(&knobs, &choice, loopback) {
                    not_applied.insert("nic_policy".into(), r);
                }
                match choice {
                    NicChoice::Default => {}
                    NicChoice::Use(nics) => exp.nics = nics,
                    NicChoice::NotApplied(r) => {
                        not_applied.insert("nics".into(), r);
                    }
                    NicChoice::Missing(r) => {
                        let _ = link.send(&LinkMsg::Refused { reason: r });
                        continue;
                    }
                }
                if exp.multi_process {
                    let hooks = hooks.take().unwrap_or_default();
                    serve_multi(&mut link, &exp, not_applied, cpus.as_ref(), hooks)?;
                    continue;
                }
                let listener = match tcpx_bench::bind_control(SocketAddr::new(link.local.ip(), 0)) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = link.send(&LinkMsg::Refused {
                            reason: e.to_string(),
                        });
                        continue;
                    }
                };
                let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                if let Err(e) = link.send(&LinkMsg::Ready { port, not_applied }) {
                    bail!("telling the leader at {} we are ready: {e}", link.peer);
                }
                let (result, pin_error) = run_pinned(cpus.as_ref(), || {
                    tcpx_bench::run_server(&exp, listener, &mut |_: &tcpx_bench::Measurement| {})
                });
                let nic_plan = result
                    .as_ref()
                    .ok()
                    .and_then(|o| o.nic_plan.as_ref())
                    .map(|p| p.describe(&exp));
                let mut error = result.err().map(|e| e.to_string());
                if let (None, Some(p)) = (&error, pin_error) {
                    error = Some(format!("follower thread binding: {p}"));
                }
                if let Err(e) = link.send(&LinkMsg::Done { error, nic_plan }) {
                    bail!("reporting to the leader at {}: {e}", link.peer);
                }
            }
            other => bail!("the leader sent {other:?} where an experiment was expected"),
        }
    }
}

/// The server side of a multi-process experiment: one control port per flow reserved (and
/// released right before the children start, so a child that finds its port taken fails with
/// the bind error), `Ready` with the first, one `tcpx-run bench --role server` child per flow
/// under `multiproc::supervise` (a dead child is named, the others stopped), then `Done`.
fn serve_multi(
    link: &mut Link,
    exp: &Experiment,
    not_applied: BTreeMap<String, String>,
    cpus: Option<&CpuSet>,
    hooks: ChildHooks,
) -> anyhow::Result<()> {
    let ip = link.local.ip();
    let refuse = |link: &mut Link, reason: String| -> anyhow::Result<()> {
        link.send(&LinkMsg::Refused { reason })
            .map_err(|e| anyhow::anyhow!("telling the leader at {}: {e}", link.peer))
    };
    let (base, held) = match reserve_ports(ip, exp.flows) {
        Ok(r) => r,
        Err(e) => return refuse(link, e),
    };
    let mut specs =
        match crate::cmd_bench::flow_children(exp, &["server"], SocketAddr::new(ip, base)) {
            Ok(s) => s,
            Err(e) => return refuse(link, format!("{e:#}")),
        };
    if let Some(f) = hooks.exit_after_accept {
        for s in specs.iter_mut().filter(|s| s.flow == f) {
            s.command.arg("--test-exit-after-accept");
        }
    }
    if let Err(e) = link.send(&LinkMsg::Ready {
        port: base,
        not_applied,
    }) {
        bail!("telling the leader at {} we are ready: {e}", link.peer);
    }
    // Released right before the children bind them (the test hook keeps one).
    let kept: Vec<socket2::Socket> = held
        .into_iter()
        .zip(0u32..)
        .filter(|(_, i)| hooks.hold_port == Some(*i))
        .map(|(l, _)| l)
        .collect();
    let limit = crate::cmd_bench::children_limit(exp);
    // The leader says `Abort` when its client processes failed: stop ours rather than let them
    // wait out their timeout for clients that will not connect.
    let mut leader_says = || {
        link.try_recv().map(|msg| match msg {
            Ok(LinkMsg::Abort { reason }) => format!("stopped at the leader's request ({reason})"),
            Ok(other) => format!("the leader sent {other:?} during the run"),
            Err(e) => format!("lost the leader during the run ({e})"),
        })
    };
    let (result, pin_error) = run_pinned(cpus, || {
        tcpx_bench::multiproc::supervise_until(specs, limit, &mut leader_says)
    });
    drop(kept);
    let (mut error, nic_plan) = match result {
        Ok(children) => {
            let plans: Vec<String> = children
                .iter()
                .filter_map(|c| crate::cmd_bench::child_nic_plan(&c.stdout))
                .collect();
            (None, (!plans.is_empty()).then(|| plans.join("; ")))
        }
        Err(e) => (Some(format!("follower's server processes: {e}")), None),
    };
    if let (None, Some(p)) = (&error, pin_error) {
        error = Some(format!("follower thread binding: {p}"));
    }
    link.send(&LinkMsg::Done { error, nic_plan })
        .map_err(|e| anyhow::anyhow!("reporting to the leader at {}: {e}", link.peer))
}

#[derive(clap::Args)]
pub struct FollowArgs {
    /// The leader: HOST or HOST:PORT (default: from the launcher's environment, or TCPX_LEADER).
    #[arg(long)]
    leader: Option<String>,
    /// The leader's plan port when --leader has none (or TCPX_PLAN_PORT).
    #[arg(long)]
    port: Option<u16>,
    /// How long to keep trying to reach the leader, seconds.
    #[arg(long, default_value_t = 120, value_parser = crate::args::wait_seconds)] // harden
    connect_timeout: u64,
    /// Longest wait for the leader's next experiment, seconds.
    #[arg(long, default_value_t = 900, value_parser = crate::args::wait_seconds)] // harden
    idle_timeout: u64,
    /// Test hook: exit after serving this many experiments, as a crashed node would.
    #[arg(long, hide = true)]
    fail_after: Option<u32>,
    /// Test hook: in the first multi-process experiment, flow F's server process exits right
    /// after its client connects.
    #[arg(long, hide = true)]
    fail_flow: Option<u32>,
    /// Test hook: in the first multi-process experiment, keep flow F's control port bound, so
    /// its server process cannot bind it.
    #[arg(long, hide = true)]
    hold_port: Option<u32>,
}

/// `HOST` or `HOST:PORT` -> `HOST:PORT`.
pub fn with_port(host: &str, port: u16) -> String {
    if host.parse::<SocketAddr>().is_ok() {
        return host.to_string();
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return SocketAddr::new(ip, port).to_string();
    }
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        return host.to_string();
    }
    format!("{host}:{port}")
}

pub fn plan_port(given: Option<u16>) -> u16 {
    given
        .or_else(|| {
            std::env::var("TCPX_PLAN_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
        })
        .unwrap_or(DEFAULT_PLAN_PORT)
}

pub fn run(a: &FollowArgs) -> anyhow::Result<ExitCode> {
    let launch = launch_from_env(|k| std::env::var(k).ok());
    let leader = match (&a.leader, &launch) {
        (Some(l), _) => l.clone(),
        (None, Some(Launch { leader: Some(l), .. })) => l.clone(),
        (None, Some(l)) => bail!(
            "the {} launcher gives rank {} but no leader address: pass --leader HOST or set TCPX_LEADER (or MASTER_ADDR)",
            l.source,
            l.rank
        ),
        (None, None) => bail!(
            "no leader given: pass --leader HOST[:PORT], or start under a launcher (Slurm, torchrun, Open MPI, JobSet) with MASTER_ADDR or TCPX_LEADER set"
        ),
    };
    let addr = with_port(&leader, plan_port(a.port));
    eprintln!("tcpx-run follow: connecting to the leader at {addr}");
    let stream = connect_until(
        &addr,
        Instant::now() + Duration::from_secs(a.connect_timeout),
    )?;
    let served = serve(
        stream,
        &FollowOpts {
            idle: Duration::from_secs(a.idle_timeout),
            fail_after: a.fail_after,
            fail_flow: a.fail_flow,
            hold_port: a.hold_port,
        },
    )?;
    eprintln!("tcpx-run follow: done, served {served} experiments");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launchers_give_rank_and_leader() {
        let l = launch_from_env(env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_JOB_NODELIST", "a3-[007-008]"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (1, Some("a3-007"), "slurm")
        );
        let l = launch_from_env(env(&[("RANK", "0"), ("MASTER_ADDR", "10.0.0.2")])).unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (0, Some("10.0.0.2"), "torchrun")
        );
        let l = launch_from_env(env(&[("OMPI_COMM_WORLD_RANK", "1")])).unwrap();
        assert_eq!((l.rank, l.leader, l.source), (1, None, "openmpi"));
        let l = launch_from_env(env(&[("PMI_RANK", "0"), ("TCPX_LEADER", "h0")])).unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (0, Some("h0"), "pmi")
        );
        let l = launch_from_env(env(&[
            ("JOB_COMPLETION_INDEX", "1"),
            ("MASTER_ADDR", "js-0"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (1, Some("js-0"), "jobset")
        );
        assert_eq!(launch_from_env(env(&[("RANK", "x")])), None);
        assert_eq!(launch_from_env(env(&[])), None);
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_slurm_host("n1,n2").as_deref(), Some("n1"));
        assert_eq!(
            first_slurm_host("gpu-[01-04,07],cpu1").as_deref(),
            Some("gpu-01")
        );
        assert_eq!(first_slurm_host("a3-[9,10]").as_deref(), Some("a3-9"));
        assert_eq!(first_slurm_host(""), None);
    }

    #[test]
    fn bindings_that_cannot_act_say_why() {
        let mut facts = SystemFacts {
            cpus: 4,
            numa_nodes: vec![NumaFact {
                id: 0,
                cpus: "0-3".into(),
            }],
            ..SystemFacts::default()
        };
        let knobs = |b: &str| BTreeMap::from([("thread_binding".to_string(), Value::from(b))]);
        assert_eq!(binding_for(&knobs("none"), &facts, End::Send), Ok(None));
        let e = binding_for(&knobs("numa-local"), &facts, End::Send).unwrap_err();
        assert!(e.contains("every online CPU"), "{e}");
        let e = binding_for(&knobs("nccl"), &facts, End::Send).unwrap_err();
        assert!(e.contains("no GPU/NIC pairs"), "{e}");
        facts.numa_nodes.push(NumaFact {
            id: 1,
            cpus: "4-7".into(),
        });
        facts.cpus = 8;
        facts.tx_bindings = "eth1:1-2;eth2:3".into();
        assert_eq!(
            binding_for(&knobs("nccl"), &facts, End::Send),
            Ok(Some(CpuSet::parse_list("1-2").unwrap()))
        );
        assert_eq!(
            binding_for(&knobs("numa-local"), &facts, End::Recv),
            Ok(Some(CpuSet::parse_list("0-3").unwrap()))
        );
    }

    #[test]
    fn nics_are_emulated_on_loopback_and_data_nics_come_first_on_a_fabric() {
        let knobs = |n: u64, transport: &str| {
            BTreeMap::from([
                ("nics".to_string(), Value::from(n)),
                ("transport".to_string(), Value::from(transport)),
            ])
        };
        let facts = SystemFacts::default();
        assert_eq!(
            nics_for(&knobs(1, "socket"), &facts, true),
            NicChoice::Default
        );
        assert_eq!(
            nics_for(&knobs(3, "socket"), &facts, true),
            NicChoice::Use(vec![
                "127.0.0.2".into(),
                "127.0.0.3".into(),
                "127.0.0.4".into()
            ])
        );
        assert!(matches!(
            nics_for(&knobs(2, "netplugin"), &facts, true),
            NicChoice::NotApplied(r) if r.contains("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME")
        ));
        assert!(matches!(
            nics_for(&knobs(2, "cudap2p"), &facts, false),
            NicChoice::NotApplied(r) if r.contains("no NIC")
        ));
        let ifc = |name: &str, addrs: &[&str], up: bool| tcpx_bench::nics::Interface {
            name: name.into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            up,
        };
        let interfaces = [
            ifc("lo", &["127.0.0.1"], true),
            ifc("eth0", &["10.0.0.2"], true),
            ifc("eth1", &["10.1.0.2"], true),
            ifc("eth2", &["10.2.0.2"], false),
            ifc("eth3", &["fd00::3"], true),
            ifc("eth4", &["10.4.0.2"], true),
        ];
        let gpu = |nic: &str| tcpx_plan::GpuFact {
            nic: Some(nic.into()),
            ..Default::default()
        };
        let facts = SystemFacts {
            gpus: vec![gpu("eth4"), gpu("eth4"), gpu("eth2"), gpu("eth1")],
            ..SystemFacts::default()
        };
        // GPU-paired NICs first (eth2 is down, eth3 has no IPv4), then the others; never lo.
        assert_eq!(usable_nics(&interfaces, &facts), ["eth4", "eth1", "eth0"]);
        let policy = BTreeMap::from([("nic_policy".to_string(), Value::from("numa-local"))]);
        let used = NicChoice::Use(vec!["127.0.0.2".into()]);
        assert!(nic_policy_not_applied(&policy, &used, true)
            .unwrap()
            .contains("no NUMA node or PCI place"));
        assert_eq!(nic_policy_not_applied(&policy, &used, false), None);
        assert!(nic_policy_not_applied(&policy, &NicChoice::Default, false).is_some());
    }

    #[test]
    fn more_nics_than_this_machine_has_skip_the_experiment_with_the_count() {
        let knobs = BTreeMap::from([
            ("nics".to_string(), Value::from(8)),
            ("transport".to_string(), Value::from("socket")),
        ]);
        let facts = SystemFacts::default();
        match nics_for(&knobs, &facts, false) {
            NicChoice::Missing(r) => {
                assert!(r.contains("8 NICs asked for, but this machine has"), "{r}");
                let na = knobs_not_applied(&knobs, &facts, false);
                assert!(
                    na["nics"].ends_with("the experiment will be skipped"),
                    "{na:?}"
                );
            }
            NicChoice::Use(n) => println!("SKIP: this machine has {} usable NICs", n.len()),
            other => panic!("{other:?}"),
        }
    }

    /// `readable` answers without blocking: nothing yet, a message waiting (left for `recv`),
    /// and the end of the connection.
    #[test]
    fn readable_tells_whether_recv_would_return_at_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = Link::new(TcpStream::connect(l.local_addr().unwrap()).unwrap()).unwrap();
        let mut b = Link::new(l.accept().unwrap().0).unwrap();
        assert!(!b.readable());
        a.send(&LinkMsg::Abort {
            reason: "test".into(),
        })
        .unwrap();
        a.send(&LinkMsg::Bye).unwrap();
        // The first message is read only by `recv`, and still there after asking.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !b.readable() {
            assert!(
                std::time::Instant::now() < deadline,
                "the message never arrived"
            );
            std::thread::yield_now();
        }
        assert!(b.readable());
        assert!(matches!(
            b.recv(Duration::from_secs(5)),
            Ok(LinkMsg::Abort { reason }) if reason == "test"
        ));
        // The second may already sit in the reader's buffer: still readable.
        assert!(b.readable());
        assert!(matches!(b.recv(Duration::from_secs(5)), Ok(LinkMsg::Bye)));
        drop(a);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !b.readable() {
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            std::thread::yield_now();
        }
        assert!(matches!(
            b.recv(Duration::from_secs(5)),
            Err(LinkError::Closed)
        ));
    }

    #[test]
    fn reserved_ports_are_consecutive_and_held_until_released() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let (base, held) = reserve_ports(ip, 3).unwrap();
        assert_eq!(held.len(), 3);
        for (i, l) in held.iter().enumerate() {
            assert_eq!(held_port(l).unwrap(), base + i as u16);
        }
        // Held: nobody else can take them (std's bind sets SO_REUSEADDR, as a child's does).
        let e = TcpListener::bind((ip, base + 1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        // Held but not listening: an early client is refused (and retries), never accepted
        // into a backlog that is reset when the reservation is released.
        let e = TcpStream::connect((ip, base)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        drop(held);
        // Released: the flow's child can bind its port.
        TcpListener::bind((ip, base + 1)).unwrap();
    }

    #[test]
    fn irq_policies_need_root_and_real_nics() {
        let facts = SystemFacts::default();
        let k = BTreeMap::from([("irq_policy".to_string(), Value::from("nccl"))]);
        assert!(
            matches!(irq_for(&k, &facts, true), IrqOutcome::NotApplied(r) if r.contains("loopback"))
        );
        assert!(
            matches!(irq_for(&k, &facts, false), IrqOutcome::Refused(r) if r.contains("needs root"))
        );
        let d = BTreeMap::from([("irq_policy".to_string(), Value::from("default"))]);
        assert!(matches!(
            irq_for(&d, &facts, false),
            IrqOutcome::NotRequested
        ));
    }
}
