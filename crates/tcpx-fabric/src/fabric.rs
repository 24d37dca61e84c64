//! Bringing a fabric up and down, its state file, and what exists now (status, stale fabrics).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tcpx_sched::nic::{GpuPlace, NicInfo};

use crate::fault_kind::{Fault, FaultKind, LossMethod};
use crate::placement::{self, Node};
use crate::spec::{check_id, Delay, Layout, Loss, Rate, Spec, Topology};
use crate::sys::{self, LinkEntry, NetnsEntry, Op, QdiscEntry, TbfParent};
use crate::FabricError;

/// Namespace name prefixes: node A is `tcpx-a-<id>`, node B `tcpx-b-<id>`, node C
/// `tcpx-c-<id>`, ...; the switch of a fabric of more than two nodes is `tcpx-sw-<id>`.
pub const NS_PREFIX_A: &str = "tcpx-a-";
pub const NS_PREFIX_B: &str = "tcpx-b-";
pub const SWITCH_NS_PREFIX: &str = "tcpx-sw-";

/// The namespace of `node` in fabric `id`.
pub fn ns_name(id: &str, node: Node) -> String {
    format!("tcpx-{}-{id}", node.letter())
}

/// The switch namespace of fabric `id` (only a fabric of more than two nodes has one).
pub fn switch_ns_name(id: &str) -> String {
    format!("{SWITCH_NS_PREFIX}{id}")
}

/// The bridge of rail `k` (NIC index `k`, 0-based) in the switch namespace: `br1`, `br2`, ...
pub fn bridge_name(k: u32) -> String {
    format!("br{}", k + 1)
}

/// The switch's port for NIC `k` of `node`: `c-eth2` is node C's eth2.
pub fn switch_port_name(node: Node, k: u32) -> String {
    format!("{}-{}", node.letter(), placement::nic_name(k))
}

/// Every namespace fabric `id` can have (nodes A to H, the switch): what `down` looks for, so
/// it removes what a killed `up` of any size left.
fn all_ns_names(id: &str) -> Vec<String> {
    Node::first(Node::MAX)
        .map(|n| ns_name(id, n))
        .chain([switch_ns_name(id)])
        .collect()
}

/// The fabric id a namespace named like a fabric's belongs to.
fn id_of_ns(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("tcpx-")?;
    let id = match rest.split_once('-')? {
        ("sw", id) => id,
        (letter, id) if Node::from_letter(letter).is_some() && letter.len() == 1 => id,
        _ => return None,
    };
    check_id(id).is_ok().then_some(id)
}

/// How far `up` got; the state file says so, so a killed `up` is recognised later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Creating,
    Up,
}

/// The state file (`<state_dir>/<id>.json`): what `up` made, written before the first change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub id: String,
    pub ns_a: String,
    pub ns_b: String,
    /// 2 to 8 (a state file written before N-node fabrics existed has no field: 2).
    #[serde(default = "two_nodes")]
    pub nodes: u32,
    /// The switch namespace of a fabric of more than two nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_ns: Option<String>,
    pub nics: u32,
    pub rate: Rate,
    pub delay: Option<Delay>,
    pub topology: Topology,
    /// The `fabric up` process; while `phase` is `creating` and it is gone, the fabric is stale.
    pub creator_pid: u32,
    pub phase: Phase,
    /// Faults set on the running fabric ([`Fabric::set_fault`]), in the order set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
}

fn two_nodes() -> u32 {
    2
}

impl State {
    pub fn layout(&self) -> Layout {
        Layout::for_nodes(self.nodes)
    }

    /// The nodes, A first.
    pub fn node_list(&self) -> Vec<Node> {
        Node::first(self.nodes).collect()
    }

    /// Every namespace of this fabric: the nodes' in order, then the switch's.
    pub fn namespaces(&self) -> Vec<String> {
        self.node_list()
            .into_iter()
            .map(|n| ns_name(&self.id, n))
            .chain(self.switch_ns.clone())
            .collect()
    }
}

fn state_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// The most a state file may hold: eight nodes' NICs and faults take a few KiB, so anything near
/// this is not a state file of ours.
pub(crate) const MAX_STATE_BYTES: u64 = 1 << 20;

/// The state file's bytes: a regular file only (a FIFO is refused at once instead of blocking
/// the open, [`tcpx_topo::open_regular`]), at most `limit` bytes.
fn read_at_most(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = tcpx_topo::open_regular(path)?;
    tcpx_topo::read_at_most(file, limit)?.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} KiB, the limit for a fabric state file",
                limit >> 10
            ),
        )
    })
}

pub(crate) fn read_state(dir: &Path, id: &str) -> Result<Option<State>, FabricError> {
    let path = state_path(dir, id);
    match read_at_most(&path, MAX_STATE_BYTES) {
        Ok(b) => {
            let s: State = serde_json::from_slice(&b).map_err(|e| FabricError::State {
                path: path.display().to_string(),
                err: format!("{e} (remove it with `tcpx-run fabric down --id {id}`)"),
            })?;
            // The file's name is the fabric's id: a file naming another fabric would make this
            // one act on that fabric's namespaces.
            if s.id != id {
                return Err(FabricError::State {
                    path: path.display().to_string(),
                    err: format!(
                        "it names fabric `{}`, not `{id}`: not this fabric's state file (moved or edited?); `tcpx-run fabric down --id {id}` removes fabric `{id}` by its name",
                        tcpx_topo::text::comment(&s.id)
                    ),
                });
            }
            Ok(Some(s))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FabricError::State {
            path: path.display().to_string(),
            err: e.to_string(),
        }),
    }
}

fn state_err(path: &Path, e: std::io::Error) -> FabricError {
    FabricError::State {
        path: path.display().to_string(),
        err: e.to_string(),
    }
}

/// Writes the state file; `create_new` when it must not exist yet (the lock against a second `up`).
pub(crate) fn write_state(dir: &Path, s: &State, create_new: bool) -> Result<(), FabricError> {
    fs::create_dir_all(dir).map_err(|e| state_err(dir, e))?;
    let path = state_path(dir, &s.id);
    let body = serde_json::to_vec_pretty(s).expect("state serialises");
    if create_new {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| state_err(&path, e))?;
        f.write_all(&body).map_err(|e| state_err(&path, e))?;
    } else {
        let tmp = dir.join(format!(".{}.json.tmp", s.id));
        // Created exclusively (a link planted at the temporary name is removed, not written
        // through: this runs as root), then renamed over the state file.
        let create = || {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
        };
        let mut f = match create() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp).and_then(|()| create())
            }
            r => r,
        }
        .map_err(|e| state_err(&tmp, e))?;
        f.write_all(&body).map_err(|e| state_err(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| state_err(&path, e))?;
    }
    Ok(())
}

/// Refuses unless the effective user is root (namespaces, links and qdiscs need CAP_NET_ADMIN
/// and CAP_SYS_ADMIN; root is what the commands are documented for).
pub fn check_root(euid: u32) -> Result<(), FabricError> {
    if euid == 0 {
        Ok(())
    } else {
        Err(FabricError::NotRoot { euid })
    }
}

/// [`check_root`] for this process's effective uid.
pub fn require_root() -> Result<(), FabricError> {
    check_root(nix::unistd::geteuid().as_raw())
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    // Signal 0 checks existence; EPERM means it exists but is someone else's.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// The steps of `up`, reported to [`UpOptions::on_step`] as they complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    StateWritten,
    NamespacesAdded,
    NicReady(u32),
}

/// Hooks for `up`: a cancel flag checked between steps (Ctrl-C), and a step observer.
#[derive(Default)]
pub struct UpOptions<'a> {
    pub cancel: Option<&'a AtomicBool>,
    pub on_step: Option<&'a mut dyn FnMut(Step)>,
}

/// A fabric that exists (brought up here or found through its state file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fabric {
    pub state: State,
    pub state_dir: PathBuf,
}

/// What `down` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DownReport {
    pub id: String,
    pub namespaces_removed: Vec<String>,
    /// Processes that were still running inside the namespaces (killed with SIGKILL: they
    /// would otherwise keep the namespace and its links alive).
    pub pids_killed: Vec<i32>,
    pub state_file_removed: Option<String>,
}

impl DownReport {
    pub fn removed_anything(&self) -> bool {
        !self.namespaces_removed.is_empty() || self.state_file_removed.is_some()
    }
}

/// Rolls back a partial `up` unless disarmed: every error, panic or cancel path leaves nothing.
struct UpGuard<'a> {
    id: &'a str,
    state_dir: &'a Path,
    armed: bool,
}

impl Drop for UpGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = teardown(self.id, self.state_dir) {
                eprintln!("tcpx-fabric: rolling back fabric `{}` failed: {e}", self.id);
            }
        }
    }
}

fn list_netns() -> Result<Vec<String>, FabricError> {
    let l: Vec<NetnsEntry> = sys::query(&Op::NetnsList)?;
    Ok(l.into_iter().map(|n| n.name).collect())
}

/// Removes everything of fabric `id` that exists: processes in its namespaces, the namespaces
/// (their veths, bridges, qdiscs and loss rules go with them), the state file.
fn teardown(id: &str, state_dir: &Path) -> Result<DownReport, FabricError> {
    let mut report = DownReport {
        id: id.to_string(),
        ..DownReport::default()
    };
    let present = list_netns()?;
    let mut first_err = None;
    for ns in all_ns_names(id) {
        if !present.contains(&ns) {
            continue;
        }
        match sys::netns_pids(&ns) {
            Ok(pids) => {
                for pid in pids {
                    if pid as u32 == std::process::id() {
                        continue;
                    }
                    if nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .is_ok()
                    {
                        report.pids_killed.push(pid);
                    }
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        match sys::run(&Op::NetnsDel(ns.clone())) {
            Ok(_) => report.namespaces_removed.push(ns),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let path = state_path(state_dir, id);
    match fs::remove_file(&path) {
        Ok(()) => report.state_file_removed = Some(path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            first_err.get_or_insert(state_err(&path, e));
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Longest wait for the veths' carriers after both ends are up.
const CARRIER_DEADLINE: Duration = Duration::from_secs(10);

/// Waits until every link of `ends` reports operstate UP. The kernel turns a veth's carrier on
/// asynchronously (linkwatch, up to about a second later), and a NIC without carrier is "down"
/// to the benchmarks' NIC check, so `up` returns only once all are usable.
pub(crate) fn wait_for_carrier(ends: &[End]) -> Result<(), FabricError> {
    let deadline = Instant::now() + CARRIER_DEADLINE;
    let namespaces: BTreeSet<&str> = ends.iter().map(|e| e.ns.as_str()).collect();
    loop {
        let mut waiting = Vec::new();
        for ns in &namespaces {
            let links: Vec<LinkEntry> = sys::query(&Op::LinkShow(ns.to_string()))?;
            for e in ends.iter().filter(|e| e.ns == *ns) {
                let up = links
                    .iter()
                    .any(|l| l.ifname == e.dev && l.operstate.as_deref() == Some("UP"));
                if !up {
                    waiting.push(format!("{} in {}", e.dev, e.ns));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(FabricError::NoCarrier {
                links: waiting.join(", "),
                secs: CARRIER_DEADLINE.as_secs(),
            });
        }
        // Linkwatch offers no notification through iproute2's one-shot commands: re-read soon.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One end of an emulated NIC's link: a veth in a namespace. Its egress qdiscs shape one
/// direction (node end: what the node sends; the far end, the peer's veth or the switch port:
/// what the node receives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct End {
    pub(crate) ns: String,
    pub(crate) dev: String,
}

/// The two ends of NIC `k` of `node`: its own veth, then the far end (node B's or node A's NIC
/// in a two-node fabric, the switch port otherwise).
pub(crate) fn ends_of(s: &State, node: Node, k: u32) -> [End; 2] {
    let dev = placement::nic_name(k);
    let near = End {
        ns: ns_name(&s.id, node),
        dev: dev.clone(),
    };
    let far = match (s.layout(), &s.switch_ns) {
        (Layout::Switched, Some(sw)) => End {
            ns: sw.clone(),
            dev: switch_port_name(node, k),
        },
        _ => End {
            ns: ns_name(&s.id, if node == Node::A { Node::B } else { Node::A }),
            dev,
        },
    };
    [near, far]
}

/// What shapes the link of NIC `k` of `node` now: the cap (the fabric's rate, or the lowest cap
/// fault on it) and the netem loss, if a loss fault made with netem is on it. In a two-node
/// fabric the link is shared by both nodes' NIC k, so faults on either count.
pub(crate) fn link_shape(s: &State, node: Node, k: u32) -> (Rate, Option<Loss>) {
    let on_link = |f: &&Fault| {
        f.nic == k
            && match s.layout() {
                Layout::Pairs => true,
                Layout::Switched => f.node == node,
            }
    };
    let mut rate = s.rate;
    let mut loss = None;
    for f in s.faults.iter().filter(on_link) {
        match f.kind {
            FaultKind::Cap(r) => rate = rate.min(r),
            FaultKind::Loss(l) if f.method == Some(LossMethod::Netem) => {
                loss = Some(loss.map_or(l, |x: Loss| x.max(l)));
            }
            _ => {}
        }
    }
    (rate, loss)
}

/// Shapes one end: netem root (delay and/or loss) with tbf under it, or tbf alone. `replace`
/// changes what a running fabric has in place.
pub(crate) fn shape_end(
    e: &End,
    rate: Rate,
    delay: Option<Delay>,
    loss: Option<Loss>,
    replace: bool,
) -> Result<(), FabricError> {
    let parent = if delay.is_some() || loss.is_some() {
        sys::run(&Op::Netem {
            ns: e.ns.clone(),
            dev: e.dev.clone(),
            delay,
            loss,
            replace,
        })?;
        TbfParent::UnderNetem
    } else {
        TbfParent::Root
    };
    sys::run(&Op::Tbf {
        ns: e.ns.clone(),
        dev: e.dev.clone(),
        rate,
        parent,
        replace,
    })?;
    Ok(())
}

/// `f` run on a thread inside namespace `ns` (`setns`), for sockets made there: a socket keeps
/// the namespace it was created in, so a listener or connection made by `f` can be used from
/// any thread afterwards. Needs root.
pub fn run_in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, FabricError> {
    let path = Path::new("/run/netns").join(ns);
    let file = fs::File::open(&path).map_err(|e| FabricError::State {
        path: path.display().to_string(),
        err: format!("{e} (is the fabric up? `tcpx-run fabric status`)"),
    })?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                    FabricError::State {
                        path: path.display().to_string(),
                        err: format!("entering the namespace: {e} (needs root)"),
                    }
                })?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

impl Fabric {
    /// Brings `spec` up: a namespace per node, and `spec.nics` NICs per node, joined by veth
    /// pairs (two nodes) or through the switch namespace's per-rail bridges (more), tbf (and
    /// netem) on both ends of each. Refused without root, when the fabric (or a leftover of it)
    /// exists, or when a delay is asked for on a kernel without sch_netem. On any failure
    /// everything made is removed.
    pub fn up(spec: &Spec) -> Result<Fabric, FabricError> {
        Fabric::up_with(spec, UpOptions::default())
    }

    pub fn up_with(spec: &Spec, mut opts: UpOptions<'_>) -> Result<Fabric, FabricError> {
        require_root()?;
        spec.validate()?;
        if spec.delay.is_some() && !sys::netem_available() {
            return Err(FabricError::NetemMissing);
        }
        let id = spec.id.as_str();
        let layout = Layout::for_nodes(spec.nodes);
        let present = list_netns()?;
        let mut existing: Vec<String> = all_ns_names(id)
            .into_iter()
            .filter(|n| present.contains(n))
            .map(|n| format!("namespace {n}"))
            .collect();
        let path = state_path(&spec.state_dir, id);
        if path.exists() {
            existing.push(format!("state file {}", path.display()));
        }
        if !existing.is_empty() {
            return Err(FabricError::Exists {
                id: id.to_string(),
                what: existing.join(", "),
            });
        }
        let mut state = State {
            id: id.to_string(),
            ns_a: ns_name(id, Node::A),
            ns_b: ns_name(id, Node::B),
            nodes: spec.nodes,
            switch_ns: (layout == Layout::Switched).then(|| switch_ns_name(id)),
            nics: spec.nics,
            rate: spec.rate,
            delay: spec.delay,
            topology: spec.topology,
            creator_pid: std::process::id(),
            phase: Phase::Creating,
            faults: Vec::new(),
        };
        // Written first and exclusively: a concurrent `up` of the same id fails here, and a
        // killed `up` leaves a record naming what to clean.
        write_state(&spec.state_dir, &state, true).map_err(|e| match e {
            FabricError::State { .. } if path.exists() => FabricError::Exists {
                id: id.to_string(),
                what: format!(
                    "state file {} (another `fabric up` is running?)",
                    path.display()
                ),
            },
            e => e,
        })?;
        let mut guard = UpGuard {
            id,
            state_dir: &spec.state_dir,
            armed: true,
        };
        let mut step = |s: Step| -> Result<(), FabricError> {
            if let Some(f) = opts.on_step.as_mut() {
                f(s);
            }
            match opts.cancel {
                Some(c) if c.load(Ordering::SeqCst) => Err(FabricError::Cancelled),
                _ => Ok(()),
            }
        };
        step(Step::StateWritten)?;
        for ns in state.namespaces() {
            sys::run(&Op::NetnsAdd(ns.clone()))?;
            sys::run(&Op::LinkUp {
                ns,
                dev: "lo".into(),
            })?;
        }
        step(Step::NamespacesAdded)?;
        let nodes = state.node_list();
        let prefix = match layout {
            Layout::Pairs => placement::PREFIX_LEN,
            Layout::Switched => placement::SWITCHED_PREFIX_LEN,
        };
        let mut all_ends = Vec::new();
        for k in 0..spec.nics {
            let dev = placement::nic_name(k);
            let mut ends = Vec::new();
            match &state.switch_ns {
                None => {
                    sys::run(&Op::VethAdd {
                        ns: state.ns_a.clone(),
                        name: dev.clone(),
                        peer_ns: state.ns_b.clone(),
                        peer_name: dev.clone(),
                    })?;
                    ends.extend(ends_of(&state, Node::A, k));
                }
                Some(sw) => {
                    let bridge = bridge_name(k);
                    sys::run(&Op::BridgeAdd {
                        ns: sw.clone(),
                        name: bridge.clone(),
                    })?;
                    sys::run(&Op::LinkUp {
                        ns: sw.clone(),
                        dev: bridge.clone(),
                    })?;
                    for &node in &nodes {
                        let port = switch_port_name(node, k);
                        sys::run(&Op::VethAdd {
                            ns: ns_name(id, node),
                            name: dev.clone(),
                            peer_ns: sw.clone(),
                            peer_name: port.clone(),
                        })?;
                        sys::run(&Op::SetMaster {
                            ns: sw.clone(),
                            dev: port,
                            master: bridge.clone(),
                        })?;
                        ends.extend(ends_of(&state, node, k));
                    }
                }
            }
            for &node in &nodes {
                sys::run(&Op::AddrAdd {
                    ns: ns_name(id, node),
                    dev: dev.clone(),
                    addr: placement::nic_addr(k, node),
                    prefix,
                })?;
            }
            for e in &ends {
                shape_end(e, spec.rate, spec.delay, None, false)?;
                sys::run(&Op::LinkUp {
                    ns: e.ns.clone(),
                    dev: e.dev.clone(),
                })?;
            }
            all_ends.extend(ends);
            step(Step::NicReady(k))?;
        }
        wait_for_carrier(&all_ends)?;
        if opts.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
            return Err(FabricError::Cancelled);
        }
        state.phase = Phase::Up;
        write_state(&spec.state_dir, &state, false)?;
        guard.armed = false;
        Ok(Fabric {
            state,
            state_dir: spec.state_dir.clone(),
        })
    }

    /// The fabric `id` as its state file describes it (whatever its health; see [`status`]).
    pub fn open(id: &str, state_dir: &Path) -> Result<Fabric, FabricError> {
        check_id(id)?;
        match read_state(state_dir, id)? {
            Some(state) => Ok(Fabric {
                state,
                state_dir: state_dir.to_path_buf(),
            }),
            None => Err(FabricError::NotFound {
                id: id.to_string(),
                path: state_path(state_dir, id).display().to_string(),
            }),
        }
    }

    /// Removes this fabric (see [`down`]).
    pub fn down(&self) -> Result<DownReport, FabricError> {
        down(&self.state.id, &self.state_dir)
    }

    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The namespace of `node`.
    pub fn ns(&self, node: Node) -> String {
        ns_name(&self.state.id, node)
    }

    /// How many nodes (2 to 8).
    pub fn node_count(&self) -> u32 {
        self.state.nodes
    }

    /// The nodes, A first: `fabric.nodes()` with [`Fabric::addrs`], [`Fabric::command_in`] and
    /// [`Fabric::mark`] is all a runner needs to start one process per node.
    pub fn nodes(&self) -> Vec<Node> {
        self.state.node_list()
    }

    /// The node of index `i` (0 is A), if this fabric has it.
    pub fn node(&self, i: u32) -> Option<Node> {
        Node::new(i).filter(|n| n.index() < self.state.nodes)
    }

    /// How many NICs each node has.
    pub fn nic_count(&self) -> u32 {
        self.state.nics
    }

    /// Pairs (two nodes) or switched (more).
    pub fn layout(&self) -> Layout {
        self.state.layout()
    }

    /// `f` run inside `node`'s namespace (see [`run_in_ns`]): sockets made by `f` live there.
    pub fn run_in<T: Send>(
        &self,
        node: Node,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, FabricError> {
        run_in_ns(&self.ns(node), f)
    }

    /// `node`'s NIC addresses in NIC order (`--nics` for a run on that node).
    pub fn addrs(&self, node: Node) -> Vec<Ipv4Addr> {
        (0..self.state.nics)
            .map(|k| placement::nic_addr(k, node))
            .collect()
    }

    /// `node`'s NIC addresses joined by commas, as `--nics` takes them: `10.231.0.3,10.231.1.3`.
    pub fn nics_arg(&self, node: Node) -> String {
        self.addrs(node)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `node`'s NICs as the channel-to-NIC policies see them, with the fabric's placement.
    pub fn nic_infos(&self, node: Node) -> Vec<NicInfo> {
        placement::nic_infos(self.state.nics, node, self.state.topology)
    }

    /// The emulated GPUs' places (GPU `i` of either node).
    pub fn gpu_places(&self) -> Vec<GpuPlace> {
        placement::gpu_places(self.state.topology)
    }

    /// `program` to be run inside `node`'s namespace (`ip netns exec <ns> <program>`): the hook
    /// a runner uses to start the leader in node A and the follower in node B (or one process
    /// per node of a larger fabric). Add arguments,
    /// environment and stdio as for any `Command`; the process needs root to enter the namespace.
    pub fn command_in(&self, node: Node, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in_ns(&self.ns(node), program)
    }
}

/// `program` to be run inside namespace `ns` (`ip netns exec <ns> <program>`).
pub fn command_in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Removes fabric `id`: processes still inside its namespaces (SIGKILL), the namespaces with
/// their links, bridges, qdiscs and fault rules, the state file. Works on a stale fabric (a killed `up`) as well.
pub fn down(id: &str, state_dir: &Path) -> Result<DownReport, FabricError> {
    down_with(id, state_dir, false)
}

/// [`down`]; with `force`, even while the state file says a `fabric up` (a live process) is
/// still bringing it up: for a state file whose pid is not that `up` (a reused pid, a state
/// file naming pid 1), which would otherwise block `down` for as long as that process lives.
pub fn down_with(id: &str, state_dir: &Path, force: bool) -> Result<DownReport, FabricError> {
    require_root()?;
    check_id(id)?;
    if let Some(s) = read_state(state_dir, id).ok().flatten() {
        if !force
            && s.phase == Phase::Creating
            && s.creator_pid != std::process::id()
            && pid_alive(s.creator_pid)
        {
            return Err(FabricError::Busy {
                id: id.to_string(),
                pid: s.creator_pid,
            });
        }
    }
    teardown(id, state_dir)
}

/// Health of one fabric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "health", rename_all = "kebab-case")]
pub enum Health {
    Up,
    /// A `fabric up` is still running.
    Creating {
        pid: u32,
    },
    /// Left behind or damaged: `fabric down --id <id>` removes it.
    Stale {
        why: Vec<String>,
    },
}

/// One NIC of a two-node fabric as it is now (checked only when running as root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicStatus {
    pub name: String,
    pub addr_a: Ipv4Addr,
    pub addr_b: Ipv4Addr,
    /// The tbf rate found on node A's end (A to B), node B's end (B to A).
    pub rate_a_to_b: Option<Rate>,
    pub rate_b_to_a: Option<Rate>,
    pub netem: bool,
}

/// One NIC of one node of a switched fabric as it is now (checked only when running as root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortStatus {
    pub node: Node,
    pub name: String,
    pub addr: Ipv4Addr,
    /// The tbf rate found on the node's end (what it sends) and on its switch port (what it
    /// receives).
    pub rate_out: Option<Rate>,
    pub rate_in: Option<Rate>,
    /// Administratively up with a carrier.
    pub up: bool,
    pub netem: bool,
}

/// One fabric found on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricStatus {
    pub id: String,
    pub ns_a: String,
    pub ns_b: String,
    pub state: Option<State>,
    pub namespaces_present: Vec<String>,
    #[serde(flatten)]
    pub health: Health,
    /// A two-node fabric's NICs; empty when not checked (not root, or the fabric is not up).
    pub nics: Vec<NicStatus>,
    /// A switched fabric's NICs, node by node; empty when not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortStatus>,
    /// Whether links and qdiscs were looked at (needs root to enter the namespaces).
    pub links_checked: bool,
}

impl FabricStatus {
    pub fn is_stale(&self) -> bool {
        matches!(self.health, Health::Stale { .. })
    }
}

/// Every fabric on this machine: those with a state file in `state_dir` and namespaces named
/// like a fabric's without one. As root, links, addresses and qdiscs of up fabrics are checked.
pub fn status(state_dir: &Path) -> Result<Vec<FabricStatus>, FabricError> {
    let root = nix::unistd::geteuid().is_root();
    let present = list_netns()?;
    let mut ids = BTreeSet::new();
    for n in &present {
        if let Some(id) = id_of_ns(n) {
            ids.insert(id.to_string());
        }
    }
    if let Ok(rd) = fs::read_dir(state_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".json") {
                if check_id(id).is_ok() {
                    ids.insert(id.to_string());
                }
            }
        }
    }
    ids.into_iter()
        .map(|id| status_of(&id, state_dir, &present, root))
        .collect()
}

/// The fabrics that are stale (cheap: needs no root when links cannot be checked).
pub fn stale(state_dir: &Path) -> Result<Vec<FabricStatus>, FabricError> {
    Ok(status(state_dir)?
        .into_iter()
        .filter(FabricStatus::is_stale)
        .collect())
}

fn status_of(
    id: &str,
    state_dir: &Path,
    present: &[String],
    root: bool,
) -> Result<FabricStatus, FabricError> {
    let ns_a = ns_name(id, Node::A);
    let ns_b = ns_name(id, Node::B);
    let namespaces_present: Vec<String> = all_ns_names(id)
        .into_iter()
        .filter(|n| present.contains(n))
        .collect();
    let mut out = FabricStatus {
        id: id.into(),
        ns_a,
        ns_b,
        state: None,
        namespaces_present,
        health: Health::Up,
        nics: Vec::new(),
        ports: Vec::new(),
        links_checked: false,
    };
    let state = match read_state(state_dir, id) {
        Ok(s) => s,
        Err(e) => {
            out.health = Health::Stale {
                why: vec![e.to_string()],
            };
            return Ok(out);
        }
    };
    let mut why = Vec::new();
    out.health = match &state {
        None => {
            why.push(format!(
                "namespaces {} exist without a state file in {} (left by a killed or failed `fabric up`)",
                out.namespaces_present.join(", "),
                state_dir.display()
            ));
            Health::Stale { why }
        }
        Some(s) if s.phase == Phase::Creating && pid_alive(s.creator_pid) => {
            Health::Creating { pid: s.creator_pid }
        }
        Some(s) if s.phase == Phase::Creating => {
            why.push(format!(
                "its `fabric up` (pid {}) ended before finishing",
                s.creator_pid
            ));
            Health::Stale { why }
        }
        Some(s) => {
            for n in s.namespaces() {
                if !present.contains(&n) {
                    why.push(format!("namespace {n} is gone"));
                }
            }
            if why.is_empty() && root {
                out.links_checked = true;
                match s.layout() {
                    Layout::Pairs => out.nics = check_pairs(s, &mut why)?,
                    Layout::Switched => out.ports = check_switched(s, &mut why)?,
                }
            }
            if why.is_empty() {
                Health::Up
            } else {
                Health::Stale { why }
            }
        }
    };
    out.state = state;
    Ok(out)
}

/// Whether NIC `k` of `node` is down by a fault.
fn down_by_fault(s: &State, node: Node, k: u32) -> bool {
    s.faults
        .iter()
        .any(|f| f.node == node && f.nic == k && f.kind == FaultKind::Down)
}

/// What one end of a link should be, checked against what it is: present, up with a carrier
/// (unless a down fault explains it), the address (on a node's end), the tbf rate.
struct EndCheck<'a> {
    links: &'a [LinkEntry],
    ns: &'a str,
    dev: String,
    addr: Option<(Ipv4Addr, u8)>,
    master: Option<String>,
    /// A down fault on this link: the end itself down, or its peer (no carrier) is expected.
    down_fault: bool,
    rate: Rate,
}

/// Checks one end; returns (tbf rate found, netem present, up with carrier).
fn check_end(
    c: &EndCheck<'_>,
    why: &mut Vec<String>,
) -> Result<(Option<Rate>, bool, bool), FabricError> {
    let (name, ns) = (&c.dev, c.ns);
    let Some(link) = c.links.iter().find(|l| l.ifname == *name) else {
        why.push(format!("{name} is missing in {ns}"));
        return Ok((None, false, false));
    };
    let admin_up = link.flags.iter().any(|f| f == "UP");
    let carrier = link.operstate.as_deref() == Some("UP");
    if !c.down_fault {
        if !admin_up {
            why.push(format!("{name} in {ns} is down"));
        } else if !carrier {
            why.push(format!("{name} in {ns} has no carrier"));
        }
    }
    if let Some((want, prefix)) = c.addr {
        let want = want.to_string();
        if !link
            .addr_info
            .iter()
            .any(|a| a.family == "inet" && a.local == want && a.prefixlen == prefix)
        {
            why.push(format!("{name} in {ns} lacks {want}/{prefix}"));
        }
    }
    if let Some(m) = &c.master {
        if link.master.as_ref() != Some(m) {
            why.push(format!("{name} in {ns} is not a port of {m}"));
        }
    }
    let q: Vec<QdiscEntry> = sys::query(&Op::QdiscShow {
        ns: ns.to_string(),
        dev: name.clone(),
    })?;
    let rate = q
        .iter()
        .find_map(QdiscEntry::tbf_rate_bytes)
        .map(|b| Rate { bits_per_s: b * 8 });
    if rate != Some(c.rate) {
        why.push(format!(
            "{name} in {ns}: tbf rate {} instead of {}",
            rate.map_or("missing".to_string(), |r| r.to_string()),
            c.rate
        ));
    }
    let netem = q.iter().any(|e| e.kind == "netem");
    Ok((rate, netem, admin_up && carrier))
}

fn check_pairs(s: &State, why: &mut Vec<String>) -> Result<Vec<NicStatus>, FabricError> {
    let links_a: Vec<LinkEntry> = sys::query(&Op::AddrShow(s.ns_a.clone()))?;
    let links_b: Vec<LinkEntry> = sys::query(&Op::AddrShow(s.ns_b.clone()))?;
    let mut out = Vec::new();
    for k in 0..s.nics {
        let name = placement::nic_name(k);
        let (rate, _) = link_shape(s, Node::A, k);
        let down_fault = down_by_fault(s, Node::A, k) || down_by_fault(s, Node::B, k);
        let mut rates = [None, None];
        let mut netem = true;
        for (i, (ns, links, node)) in [(&s.ns_a, &links_a, Node::A), (&s.ns_b, &links_b, Node::B)]
            .into_iter()
            .enumerate()
        {
            let (r, n, _) = check_end(
                &EndCheck {
                    links,
                    ns,
                    dev: name.clone(),
                    addr: Some((placement::nic_addr(k, node), placement::PREFIX_LEN)),
                    master: None,
                    down_fault,
                    rate,
                },
                why,
            )?;
            rates[i] = r;
            netem &= n;
        }
        out.push(NicStatus {
            name,
            addr_a: placement::nic_addr(k, Node::A),
            addr_b: placement::nic_addr(k, Node::B),
            rate_a_to_b: rates[0],
            rate_b_to_a: rates[1],
            netem,
        });
    }
    Ok(out)
}

fn check_switched(s: &State, why: &mut Vec<String>) -> Result<Vec<PortStatus>, FabricError> {
    let Some(sw) = &s.switch_ns else {
        why.push("the state names no switch namespace".into());
        return Ok(Vec::new());
    };
    let sw_links: Vec<LinkEntry> = sys::query(&Op::LinkShow(sw.clone()))?;
    for k in 0..s.nics {
        let br = bridge_name(k);
        match sw_links.iter().find(|l| l.ifname == br) {
            None => why.push(format!("bridge {br} is missing in {sw}")),
            Some(l) if !l.flags.iter().any(|f| f == "UP") => {
                why.push(format!("bridge {br} in {sw} is down"))
            }
            Some(_) => {}
        }
    }
    let mut out = Vec::new();
    for node in s.node_list() {
        let ns = ns_name(&s.id, node);
        let links: Vec<LinkEntry> = sys::query(&Op::AddrShow(ns.clone()))?;
        for k in 0..s.nics {
            let (rate, _) = link_shape(s, node, k);
            let down_fault = down_by_fault(s, node, k);
            let name = placement::nic_name(k);
            let addr = placement::nic_addr(k, node);
            let (rate_out, netem_out, up) = check_end(
                &EndCheck {
                    links: &links,
                    ns: &ns,
                    dev: name.clone(),
                    addr: Some((addr, placement::SWITCHED_PREFIX_LEN)),
                    master: None,
                    down_fault,
                    rate,
                },
                why,
            )?;
            let (rate_in, netem_in, _) = check_end(
                &EndCheck {
                    links: &sw_links,
                    ns: sw,
                    dev: switch_port_name(node, k),
                    addr: None,
                    master: Some(bridge_name(k)),
                    down_fault,
                    rate,
                },
                why,
            )?;
            out.push(PortStatus {
                node,
                name,
                addr,
                rate_out,
                rate_in,
                up,
                netem: netem_out && netem_in,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod state_file_tests {
    use super::*;

    #[test]
    fn a_state_file_is_read_only_up_to_its_limit_and_errors_say_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            matches!(read_state(dir.path(), "f"), Ok(None)),
            "no file: no fabric"
        );
        let big = vec![b' '; MAX_STATE_BYTES as usize + 1];
        fs::write(state_path(dir.path(), "f"), big).unwrap();
        let err = read_state(dir.path(), "f").unwrap_err().to_string();
        assert!(err.contains("limit for a fabric state file"), "{err}");
        fs::write(state_path(dir.path(), "g"), b"{not json").unwrap();
        let err = read_state(dir.path(), "g").unwrap_err().to_string();
        assert!(err.contains("tcpx-run fabric down --id g"), "{err}");
    }

    /// Issue 43 item 8: a link planted at the state file's temporary name is not followed.
    #[test]
    fn the_state_file_is_not_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "mine").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".f.json.tmp")).unwrap();
        let mut s = creating("f", 1);
        s.phase = Phase::Up;
        write_state(dir.path(), &s, false).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "mine");
        assert_eq!(read_state(dir.path(), "f").unwrap(), Some(s));
    }

    /// A state file of fabric `id`, being brought up by `pid`.
    fn creating(id: &str, pid: u32) -> State {
        State {
            id: id.into(),
            ns_a: ns_name(id, Node::A),
            ns_b: ns_name(id, Node::B),
            nodes: 2,
            switch_ns: None,
            nics: 1,
            rate: "1gbit".parse().unwrap(),
            delay: None,
            topology: Topology::Flat,
            creator_pid: pid,
            phase: Phase::Creating,
            faults: vec![],
        }
    }

    /// Issue 43 item 9: the state file's own `id` was trusted over the one asked for.
    #[test]
    fn a_state_file_naming_another_fabric_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = creating("other", 1);
        s.phase = Phase::Up;
        fs::write(
            state_path(dir.path(), "mine"),
            serde_json::to_vec(&s).unwrap(),
        )
        .unwrap();
        let err = read_state(dir.path(), "mine").unwrap_err().to_string();
        assert!(err.contains("names fabric `other`, not `mine`"), "{err}");
        assert!(matches!(read_state(dir.path(), "other"), Ok(None)));
    }

    /// Issue 43 item 3: a FIFO as the state file hung `status`/`down` in open().
    #[test]
    fn a_fifo_state_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = state_path(dir.path(), "f");
        assert!(Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap()
            .success());
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(read_state(&d, "f").map(|_| ()).map_err(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("reading a FIFO state file hung")
            .unwrap_err();
        assert!(err.contains("FIFO") && err.contains("f.json"), "{err}");
    }

    /// Issue 43 item 9: a state file naming pid 1 as its `fabric up` blocked `down` for good;
    /// `--force` (`down_with(.., true)`) removes it.
    #[test]
    fn a_state_file_naming_pid_1_can_be_forced_down() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: not root (down needs root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let id = format!("t43-{}", std::process::id());
        fs::write(
            state_path(dir.path(), &id),
            serde_json::to_vec(&creating(&id, 1)).unwrap(),
        )
        .unwrap();
        let err = down(&id, dir.path()).unwrap_err().to_string();
        assert!(err.contains("pid 1") && err.contains("--force"), "{err}");
        assert!(state_path(dir.path(), &id).exists());
        let r = down_with(&id, dir.path(), true).unwrap();
        assert!(r.state_file_removed.is_some(), "{r:?}");
        assert!(!state_path(dir.path(), &id).exists());
    }
}
