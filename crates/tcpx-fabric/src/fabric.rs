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

use crate::placement::{self, Node};
use crate::spec::{check_id, Delay, Rate, Spec, Topology};
use crate::sys::{self, LinkEntry, NetnsEntry, Op, QdiscEntry, TbfParent};
use crate::FabricError;

/// Namespace name prefixes: node A is `tcpx-a-<id>`, node B `tcpx-b-<id>`.
pub const NS_PREFIX_A: &str = "tcpx-a-";
pub const NS_PREFIX_B: &str = "tcpx-b-";

/// The namespace of `node` in fabric `id`.
pub fn ns_name(id: &str, node: Node) -> String {
    match node {
        Node::A => format!("{NS_PREFIX_A}{id}"),
        Node::B => format!("{NS_PREFIX_B}{id}"),
    }
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
    pub nics: u32,
    pub rate: Rate,
    pub delay: Option<Delay>,
    pub topology: Topology,
    /// The `fabric up` process; while `phase` is `creating` and it is gone, the fabric is stale.
    pub creator_pid: u32,
    pub phase: Phase,
}

fn state_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

fn read_state(dir: &Path, id: &str) -> Result<Option<State>, FabricError> {
    let path = state_path(dir, id);
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| FabricError::State {
                path: path.display().to_string(),
                err: format!("{e} (remove it with `tcpx-run fabric down --id {id}`)"),
            }),
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
fn write_state(dir: &Path, s: &State, create_new: bool) -> Result<(), FabricError> {
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
        fs::write(&tmp, &body).map_err(|e| state_err(&tmp, e))?;
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

fn pid_alive(pid: u32) -> bool {
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
/// (their veths and qdiscs go with them), the state file.
fn teardown(id: &str, state_dir: &Path) -> Result<DownReport, FabricError> {
    let mut report = DownReport {
        id: id.to_string(),
        ..DownReport::default()
    };
    let present = list_netns()?;
    let mut first_err = None;
    for node in [Node::A, Node::B] {
        let ns = ns_name(id, node);
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

/// Waits until every NIC in both namespaces reports operstate UP. The kernel turns a veth's
/// carrier on asynchronously (linkwatch, up to about a second later), and a NIC without carrier
/// is "down" to the benchmarks' NIC check, so `up` returns only once all are usable.
fn wait_for_carrier(namespaces: &[&String], nics: u32) -> Result<(), FabricError> {
    let deadline = Instant::now() + CARRIER_DEADLINE;
    loop {
        let mut waiting = Vec::new();
        for ns in namespaces {
            let links: Vec<LinkEntry> = sys::query(&Op::LinkShow(ns.to_string()))?;
            for k in 0..nics {
                let name = placement::nic_name(k);
                let up = links
                    .iter()
                    .any(|l| l.ifname == name && l.operstate.as_deref() == Some("UP"));
                if !up {
                    waiting.push(format!("{name} in {ns}"));
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

impl Fabric {
    /// Brings `spec` up: two namespaces, `spec.nics` veth pairs, tbf (and netem) on both ends.
    /// Refused without root, when the fabric (or a leftover of it) exists, or when a delay is
    /// asked for on a kernel without sch_netem. On any failure everything made is removed.
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
        let ns_a = ns_name(id, Node::A);
        let ns_b = ns_name(id, Node::B);
        let present = list_netns()?;
        let mut existing: Vec<String> = [&ns_a, &ns_b]
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
            ns_a: ns_a.clone(),
            ns_b: ns_b.clone(),
            nics: spec.nics,
            rate: spec.rate,
            delay: spec.delay,
            topology: spec.topology,
            creator_pid: std::process::id(),
            phase: Phase::Creating,
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
        for ns in [&ns_a, &ns_b] {
            sys::run(&Op::NetnsAdd(ns.clone()))?;
            sys::run(&Op::LinkUp {
                ns: ns.clone(),
                dev: "lo".into(),
            })?;
        }
        step(Step::NamespacesAdded)?;
        for k in 0..spec.nics {
            let dev = placement::nic_name(k);
            sys::run(&Op::VethAdd {
                ns: ns_a.clone(),
                name: dev.clone(),
                peer_ns: ns_b.clone(),
            })?;
            for (ns, node) in [(&ns_a, Node::A), (&ns_b, Node::B)] {
                sys::run(&Op::AddrAdd {
                    ns: ns.clone(),
                    dev: dev.clone(),
                    addr: placement::nic_addr(k, node),
                    prefix: placement::PREFIX_LEN,
                })?;
                let parent = match spec.delay {
                    Some(delay) => {
                        sys::run(&Op::Netem {
                            ns: ns.clone(),
                            dev: dev.clone(),
                            delay,
                        })?;
                        TbfParent::UnderNetem
                    }
                    None => TbfParent::Root,
                };
                sys::run(&Op::Tbf {
                    ns: ns.clone(),
                    dev: dev.clone(),
                    rate: spec.rate,
                    parent,
                })?;
                sys::run(&Op::LinkUp {
                    ns: ns.clone(),
                    dev: dev.clone(),
                })?;
            }
            step(Step::NicReady(k))?;
        }
        wait_for_carrier(&[&ns_a, &ns_b], spec.nics)?;
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
    pub fn ns(&self, node: Node) -> &str {
        match node {
            Node::A => &self.state.ns_a,
            Node::B => &self.state.ns_b,
        }
    }

    /// `node`'s NIC addresses in NIC order (`--nics` for a run on that node).
    pub fn addrs(&self, node: Node) -> Vec<Ipv4Addr> {
        (0..self.state.nics)
            .map(|k| placement::nic_addr(k, node))
            .collect()
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
    /// a runner uses to start the leader in node A and the follower in node B. Add arguments,
    /// environment and stdio as for any `Command`; the process needs root to enter the namespace.
    pub fn command_in(&self, node: Node, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in_ns(self.ns(node), program)
    }
}

/// `program` to be run inside namespace `ns` (`ip netns exec <ns> <program>`).
pub fn command_in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Removes fabric `id`: processes still inside its namespaces (SIGKILL), the namespaces with
/// their links and qdiscs, the state file. Works on a stale fabric (a killed `up`) as well.
pub fn down(id: &str, state_dir: &Path) -> Result<DownReport, FabricError> {
    require_root()?;
    check_id(id)?;
    if let Some(s) = read_state(state_dir, id).ok().flatten() {
        if s.phase == Phase::Creating
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

/// One NIC as it is now (checked only when running as root).
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
    /// Empty when not checked (not root, or the fabric is not up).
    pub nics: Vec<NicStatus>,
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
        if let Some(id) = n
            .strip_prefix(NS_PREFIX_A)
            .or_else(|| n.strip_prefix(NS_PREFIX_B))
        {
            if check_id(id).is_ok() {
                ids.insert(id.to_string());
            }
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
    let namespaces_present: Vec<String> = [&ns_a, &ns_b]
        .into_iter()
        .filter(|n| present.contains(n))
        .cloned()
        .collect();
    let state = match read_state(state_dir, id) {
        Ok(s) => s,
        Err(e) => {
            return Ok(FabricStatus {
                id: id.into(),
                ns_a,
                ns_b,
                state: None,
                namespaces_present,
                health: Health::Stale {
                    why: vec![e.to_string()],
                },
                nics: Vec::new(),
                links_checked: false,
            })
        }
    };
    let mut why = Vec::new();
    let mut nics = Vec::new();
    let mut links_checked = false;
    let health = match &state {
        None => {
            why.push(format!(
                "namespaces {} exist without a state file in {} (left by a killed or failed `fabric up`)",
                namespaces_present.join(", "),
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
            for n in [&ns_a, &ns_b] {
                if !present.contains(n) {
                    why.push(format!("namespace {n} is gone"));
                }
            }
            if why.is_empty() && root {
                links_checked = true;
                nics = check_links(s, &mut why)?;
            }
            if why.is_empty() {
                Health::Up
            } else {
                Health::Stale { why }
            }
        }
    };
    Ok(FabricStatus {
        id: id.into(),
        ns_a,
        ns_b,
        state,
        namespaces_present,
        health,
        nics,
        links_checked,
    })
}

fn check_links(s: &State, why: &mut Vec<String>) -> Result<Vec<NicStatus>, FabricError> {
    let links_a: Vec<LinkEntry> = sys::query(&Op::AddrShow(s.ns_a.clone()))?;
    let links_b: Vec<LinkEntry> = sys::query(&Op::AddrShow(s.ns_b.clone()))?;
    let mut out = Vec::new();
    for k in 0..s.nics {
        let name = placement::nic_name(k);
        let mut rates = [None, None];
        let mut netem = true;
        for (i, (ns, links, node)) in [(&s.ns_a, &links_a, Node::A), (&s.ns_b, &links_b, Node::B)]
            .into_iter()
            .enumerate()
        {
            let want = placement::nic_addr(k, node).to_string();
            let Some(link) = links.iter().find(|l| l.ifname == name) else {
                why.push(format!("{name} is missing in {ns}"));
                continue;
            };
            if !link.flags.iter().any(|f| f == "UP") {
                why.push(format!("{name} in {ns} is down"));
            } else if link.operstate.as_deref() != Some("UP") {
                why.push(format!("{name} in {ns} has no carrier"));
            }
            if !link.addr_info.iter().any(|a| {
                a.family == "inet" && a.local == want && a.prefixlen == placement::PREFIX_LEN
            }) {
                why.push(format!(
                    "{name} in {ns} lacks {want}/{}",
                    placement::PREFIX_LEN
                ));
            }
            let q: Vec<QdiscEntry> = sys::query(&Op::QdiscShow {
                ns: ns.to_string(),
                dev: name.clone(),
            })?;
            rates[i] = q
                .iter()
                .find_map(QdiscEntry::tbf_rate_bytes)
                .map(|b| Rate { bits_per_s: b * 8 });
            if rates[i] != Some(s.rate) {
                why.push(format!(
                    "{name} in {ns}: tbf rate {} instead of {}",
                    rates[i].map_or("missing".to_string(), |r| r.to_string()),
                    s.rate
                ));
            }
            netem &= q.iter().any(|e| e.kind == "netem");
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
