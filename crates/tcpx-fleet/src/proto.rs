//! The fleet's leader as a protocol machine without IO: it is told what happened
//! ([`FleetEvent`]: a node greeted, a node's message, a node lost, time passing) and answers
//! with what to do ([`FleetAction`]: accept or refuse a node, send a node a message, record a
//! matrix row, name a lost node, finish). The driver ([`super::run`]) owns the sockets, the
//! clock and the files; the tests drive this machine on a virtual clock with simulated nodes.
//!
//! The run: nodes join until all `nodes` ranks are in or the join deadline passes (those missing
//! are named and the others go on, if at least two). Then slot after slot of the schedule: for
//! each pair run the receiver is told to listen ([`FleetMsg::Serve`]), and once it says where
//! ([`FleetMsg::Listening`]) the sender is told to send ([`FleetMsg::Send`]); the run ends when
//! both sides report ([`FleetMsg::Done`]). Every pair run has a deadline: a side that has not
//! reported by then is a lost node. A lost node's other runs become `skipped` rows; every other
//! run still happens, so no result is lost.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tcpx_bench::Experiment;
use tcpx_report::fleet::FleetRow;

use super::schedule::{schedule, NicChoice, PairRun, Slot};

/// Version of the fleet link; leader and nodes must match.
pub const FLEET_PROTOCOL: u32 = 1;
/// Most NICs a node may bring.
pub const MAX_NICS: usize = 64;
/// Most nodes in a fleet.
pub const MAX_NODES: u32 = 4096;
/// Longest text (host, NIC name, error) a node may send; longer is cut.
pub const MAX_TEXT: usize = 2048;

/// What one side of a pair run reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SideReport {
    /// Why this side failed; `None` when it finished.
    pub error: Option<String>,
    pub gbps: Option<f64>,
    pub p50_us: Option<f64>,
    /// Bytes moved in the timed iterations.
    pub bytes: u64,
    /// Received bytes that were wrong (receiver, when checked).
    pub wrong_bytes: Option<u64>,
    pub connect_ms: Option<f64>,
    pub accept_ms: Option<f64>,
    pub first_byte_ms: Option<f64>,
    pub setup_ms: Option<f64>,
}

/// Which side of a pair run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairSide {
    Sender,
    Receiver,
}

/// One message on the fleet link (JSON, one per line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum FleetMsg {
    /// Node to leader: the greeting, with the node's rank, its NICs as given and the address
    /// each resolved to, and its nonce for the run token's proof.
    Hello {
        protocol: u32,
        version: String,
        rank: u32,
        nodes: u32,
        host: String,
        nics: Vec<String>,
        addrs: Vec<IpAddr>,
        nonce: String,
    },
    /// Leader to node: its nonce, its proof of the run token and the run's name.
    Welcome {
        protocol: u32,
        nonce: String,
        proof: String,
        run: String,
    },
    /// Node to leader: its proof of the run token.
    Auth { proof: String },
    /// Leader to node: not in this fleet, and why. `retry`: the refusal is of this moment (the
    /// leader's connections are all taken), and the node tries again within its join deadline.
    Refused {
        reason: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        retry: bool,
    },
    /// Leader to receiver: listen on `listen` (one of this node's addresses) for `run` of `exp`
    /// (whose `nics` are this node's for the run).
    Serve {
        run: PairRun,
        exp: Box<Experiment>,
        listen: IpAddr,
    },
    /// Receiver to leader: listening for `run`: the start-up probe on `probe_port`, the bench on
    /// `bench_port`.
    Listening {
        run: u32,
        probe_port: u16,
        bench_port: u16,
    },
    /// Leader to sender: send `run` of `exp` from `from` to the receiver at `to`.
    Send {
        run: PairRun,
        exp: Box<Experiment>,
        from: IpAddr,
        to: IpAddr,
        probe_port: u16,
        bench_port: u16,
    },
    /// Node to leader: its side of `run` ended.
    Done {
        run: u32,
        side: PairSide,
        report: SideReport,
    },
    /// Leader to node: the fleet run is over.
    Bye,
}

impl FleetMsg {
    /// The message's name, for logs (a stranger's content is never echoed).
    pub fn kind(&self) -> &'static str {
        match self {
            FleetMsg::Hello { .. } => "hello",
            FleetMsg::Welcome { .. } => "welcome",
            FleetMsg::Auth { .. } => "auth",
            FleetMsg::Refused { .. } => "refused",
            FleetMsg::Serve { .. } => "serve",
            FleetMsg::Listening { .. } => "listening",
            FleetMsg::Send { .. } => "send",
            FleetMsg::Done { .. } => "done",
            FleetMsg::Bye => "bye",
        }
    }
}

/// A node as the leader knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub rank: u32,
    pub host: String,
    pub nics: Vec<String>,
    pub addrs: Vec<IpAddr>,
}

/// The fleet's shape and its deadlines.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub nodes: u32,
    pub reps: u32,
    /// The experiment every pair runs (its `nics` are set per side and run).
    pub exp: Experiment,
    /// How long nodes may take to join.
    pub join_wait: Duration,
    /// How long one pair run may take, from the receiver being told to listen to both sides'
    /// reports.
    pub pair_wait: Duration,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetEvent {
    /// A connection `conn` greeted (its token proved) as `node`.
    Joined { conn: u64, node: NodeInfo },
    /// A message from node `rank` (rank 0: the leader's own node).
    Message { rank: u32, msg: FleetMsg },
    /// Node `rank`'s link ended (closed, unreadable).
    Lost { rank: u32, why: String },
    /// Time passed (the driver's wait for events ended at [`FleetLeader::poll_timeout`]).
    Tick,
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetAction {
    /// Connection `conn` is node `rank` from now on.
    Accept { conn: u64, rank: u32 },
    /// Tell connection `conn` why it is not in the fleet and close it.
    Refuse { conn: u64, reason: String },
    /// Send node `rank` (0: this process's own node) a message.
    Send { rank: u32, msg: FleetMsg },
    /// A matrix row is final: write it now.
    Row(FleetRow),
    /// Node `rank` is out of the run, for this reason.
    NodeLost { rank: u32, why: String },
    /// The run is over: every scheduled run has its row.
    Finished,
}

/// A pair run in flight.
#[derive(Debug, Clone)]
struct Active {
    run: PairRun,
    round: u32,
    deadline: Instant,
    sent: bool,
    sender: Option<SideReport>,
    receiver: Option<SideReport>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Joining { deadline: Instant },
    Running,
    Over,
}

/// The fleet leader's machine; see the module doc.
pub struct FleetLeader {
    cfg: FleetConfig,
    phase: Phase,
    nodes: Vec<Option<NodeInfo>>,
    lost: Vec<Option<String>>,
    slots: Vec<Slot>,
    next_slot: usize,
    active: Vec<Active>,
    rows: u32,
    nic_count: usize,
}

fn cut(text: &str) -> String {
    tcpx_bench::shown(text, MAX_TEXT)
}

impl FleetLeader {
    /// A leader whose own node is `own` (rank 0), waiting for the others until
    /// `now + cfg.join_wait`.
    pub fn new(cfg: FleetConfig, own: NodeInfo, now: Instant) -> FleetLeader {
        let n = cfg.nodes.clamp(1, MAX_NODES) as usize;
        let nic_count = own.addrs.len().max(1);
        let choices = NicChoice::all_for(nic_count as u32);
        let slots = schedule(n as u32, &choices, cfg.reps);
        let mut nodes = vec![None; n];
        nodes[0] = Some(NodeInfo { rank: 0, ..own });
        FleetLeader {
            phase: Phase::Joining {
                deadline: now + cfg.join_wait,
            },
            cfg,
            nodes,
            lost: vec![None; n],
            slots,
            next_slot: 0,
            active: Vec::new(),
            rows: 0,
            nic_count,
        }
    }

    /// Pair runs in the schedule.
    pub fn scheduled(&self) -> u32 {
        self.slots.iter().map(|s| s.runs.len() as u32).sum()
    }

    /// Rows recorded so far.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// The nodes that joined, by rank.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.iter().flatten()
    }

    /// Why node `rank` is out of the run, if it is.
    pub fn lost(&self, rank: u32) -> Option<&str> {
        self.lost.get(rank as usize)?.as_deref()
    }

    /// When to deliver [`FleetEvent::Tick`] if nothing else happens first.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Joining { deadline } => Some(deadline),
            Phase::Running => self.active.iter().map(|a| a.deadline).min(),
            Phase::Over => None,
        }
    }

    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    fn alive(&self, rank: u32) -> bool {
        let r = rank as usize;
        r < self.nodes.len() && self.nodes[r].is_some() && self.lost[r].is_none()
    }

    pub fn handle(&mut self, event: FleetEvent, now: Instant) -> Vec<FleetAction> {
        let mut out = Vec::new();
        match event {
            FleetEvent::Joined { conn, node } => self.joined(conn, node, now, &mut out),
            FleetEvent::Message { rank, msg } => self.message(rank, msg, now, &mut out),
            FleetEvent::Lost { rank, why } => {
                self.lose(rank, why, &mut out);
                self.settle(now, &mut out);
            }
            FleetEvent::Tick => self.tick(now, &mut out),
        }
        out
    }

    fn joined(&mut self, conn: u64, node: NodeInfo, now: Instant, out: &mut Vec<FleetAction>) {
        let n = self.nodes.len() as u32;
        let refuse = |reason: String| FleetAction::Refuse { conn, reason };
        if !matches!(self.phase, Phase::Joining { .. }) {
            out.push(refuse(format!(
                "rank {} came after the fleet had started without it (the join deadline of {} s had passed): start every node together, or give the leader a longer --join-timeout",
                node.rank,
                self.cfg.join_wait.as_secs()
            )));
            return;
        }
        if node.rank == 0 || node.rank >= n {
            out.push(refuse(format!(
                "rank {} is not a follower's rank in a fleet of {n} nodes (1..={}): check the launcher's ranks and --nodes",
                node.rank,
                n - 1
            )));
            return;
        }
        if let Some(have) = &self.nodes[node.rank as usize] {
            out.push(refuse(format!(
                "rank {} already joined from host {}; host {} claims it too: two processes on one node, or a rank given twice (check --rank and the launcher's --ntasks-per-node=1)",
                node.rank,
                cut(&have.host),
                cut(&node.host)
            )));
            return;
        }
        if node.addrs.len() != self.nic_count {
            out.push(refuse(format!(
                "rank {} brings {} NIC(s), the leader {}: every node needs the same number of NICs (rail i of one node is measured against rail i of the others); check --nics",
                node.rank,
                node.addrs.len(),
                self.nic_count
            )));
            return;
        }
        if let Some(why) = self.unusable_address(&node) {
            out.push(refuse(format!(
                "rank {} claims {why}: other nodes would be sent there; give each node its own NIC addresses in --nics",
                node.rank
            )));
            return;
        }
        let rank = node.rank;
        self.nodes[rank as usize] = Some(NodeInfo {
            host: cut(&node.host),
            nics: node.nics.iter().map(|s| cut(s)).collect(),
            ..node
        });
        out.push(FleetAction::Accept { conn, rank });
        if self.nodes.iter().all(Option::is_some) {
            self.start(now, out);
        }
    }

    /// Why one of `node`'s claimed NIC addresses cannot be its own: other nodes connect to
    /// these, so an address no one can be reached at (unspecified, broadcast, multicast), one
    /// given twice or one another node (the leader included) has would measure some other pair
    /// under this node's name.
    fn unusable_address(&self, node: &NodeInfo) -> Option<String> {
        for (i, a) in node.addrs.iter().enumerate() {
            let kind = match a {
                IpAddr::V4(v) if v.is_unspecified() => Some("unspecified"),
                IpAddr::V4(v) if v.is_broadcast() => Some("the broadcast address"),
                IpAddr::V4(v) if v.is_multicast() => Some("multicast"),
                IpAddr::V6(v) if v.is_unspecified() => Some("unspecified"),
                IpAddr::V6(v) if v.is_multicast() => Some("multicast"),
                _ => None,
            };
            if let Some(kind) = kind {
                return Some(format!("NIC address {a}, which is {kind}"));
            }
            if node.addrs[..i].contains(a) {
                return Some(format!("NIC address {a} twice"));
            }
            let other = self
                .nodes
                .iter()
                .flatten()
                .find(|n| n.rank != node.rank && n.addrs.contains(a));
            if let Some(other) = other {
                return Some(format!(
                    "NIC address {a}, which node {} ({}) has",
                    other.rank,
                    cut(&other.host)
                ));
            }
        }
        None
    }

    fn tick(&mut self, now: Instant, out: &mut Vec<FleetAction>) {
        match self.phase {
            Phase::Joining { deadline } if now >= deadline => {
                for r in 0..self.nodes.len() {
                    if self.nodes[r].is_none() {
                        let why = format!(
                            "never joined within the join deadline of {} s (is `tcpx-run fleet` running there, with this leader's address and run token?)",
                            self.cfg.join_wait.as_secs()
                        );
                        self.lost[r] = Some(why.clone());
                        out.push(FleetAction::NodeLost {
                            rank: r as u32,
                            why,
                        });
                    }
                }
                self.start(now, out);
            }
            Phase::Running => {
                let mut late: Vec<(u32, PairSide)> = Vec::new();
                for a in self.active.iter().filter(|a| now >= a.deadline) {
                    // A sender never told to start owes nothing.
                    if a.sent && a.sender.is_none() {
                        late.push((a.run.sender, PairSide::Sender));
                    }
                    if a.receiver.is_none() {
                        late.push((a.run.receiver, PairSide::Receiver));
                    }
                }
                for (rank, side) in late {
                    let why = format!(
                        "no report as {} within the pair deadline of {} s (the node hangs, or its network does: check it, or raise --pair-timeout)",
                        match side {
                            PairSide::Sender => "sender",
                            PairSide::Receiver => "receiver",
                        },
                        self.cfg.pair_wait.as_secs()
                    );
                    self.lose(rank, why, out);
                }
                self.settle(now, out);
            }
            _ => {}
        }
    }

    /// Node `rank` is out: named once; its sides of runs in flight fail now.
    fn lose(&mut self, rank: u32, why: String, out: &mut Vec<FleetAction>) {
        let r = rank as usize;
        if r >= self.nodes.len() || self.lost[r].is_some() {
            return;
        }
        if self.nodes[r].is_none() && matches!(self.phase, Phase::Joining { .. }) {
            // Not joined yet: nothing to lose (its connection failed before it greeted).
            return;
        }
        let why = cut(&why);
        self.lost[r] = Some(why.clone());
        out.push(FleetAction::NodeLost {
            rank,
            why: why.clone(),
        });
        let failed = SideReport {
            error: Some(format!("node {rank} lost: {why}")),
            ..SideReport::default()
        };
        for a in &mut self.active {
            if a.run.sender == rank && a.sender.is_none() {
                a.sender = Some(failed.clone());
            }
            if a.run.receiver == rank && a.receiver.is_none() {
                a.receiver = Some(failed.clone());
                // The sender was never told to start: it has nothing to report.
                if !a.sent && a.sender.is_none() {
                    a.sender = Some(SideReport {
                        error: Some(format!("not started: receiver {rank} lost")),
                        ..SideReport::default()
                    });
                }
            }
        }
    }

    fn message(&mut self, rank: u32, msg: FleetMsg, now: Instant, out: &mut Vec<FleetAction>) {
        if !self.alive(rank) || self.phase != Phase::Running {
            return;
        }
        match msg {
            FleetMsg::Listening {
                run,
                probe_port,
                bench_port,
            } => {
                let exp = self.cfg.exp.clone();
                let Some(i) = self
                    .active
                    .iter()
                    .position(|a| a.run.id == run && a.run.receiver == rank && !a.sent)
                else {
                    return;
                };
                if self.active[i].receiver.is_some() {
                    return;
                }
                let a = &self.active[i];
                let (Some(from), Some(to)) = (
                    self.addr_of(a.run.sender, a.run.nic),
                    self.addr_of(a.run.receiver, a.run.nic),
                ) else {
                    return;
                };
                let msg = FleetMsg::Send {
                    run: a.run,
                    exp: Box::new(self.exp_for(exp, a.run.sender, a.run.nic)),
                    from,
                    to,
                    probe_port,
                    bench_port,
                };
                out.push(FleetAction::Send {
                    rank: a.run.sender,
                    msg,
                });
                self.active[i].sent = true;
            }
            FleetMsg::Done { run, side, report } => {
                let Some(a) = self.active.iter_mut().find(|a| a.run.id == run) else {
                    return;
                };
                let report = SideReport {
                    error: report.error.map(|e| cut(&e)),
                    ..report
                };
                match side {
                    PairSide::Sender if a.run.sender == rank && a.sender.is_none() => {
                        a.sender = Some(report)
                    }
                    PairSide::Receiver if a.run.receiver == rank && a.receiver.is_none() => {
                        a.receiver = Some(report);
                        // A receiver that failed before listening: the sender never starts.
                        if !a.sent && a.sender.is_none() {
                            a.sender = Some(SideReport {
                                error: Some("not started: the receiver failed".into()),
                                ..SideReport::default()
                            });
                        }
                    }
                    _ => return,
                }
                self.settle(now, out);
            }
            // Anything else from a node is not for this phase: ignored.
            _ => {}
        }
    }

    /// Node `rank`'s address for a run over `nic` (its first for `all`).
    fn addr_of(&self, rank: u32, nic: NicChoice) -> Option<IpAddr> {
        let node = self.nodes.get(rank as usize)?.as_ref()?;
        match nic {
            NicChoice::Nic(i) => node.addrs.get(i as usize).copied(),
            NicChoice::All => node.addrs.first().copied(),
        }
    }

    /// The experiment for node `rank`'s side of a run over `nic`: that NIC's address, or all
    /// of them with a channel on each.
    fn exp_for(&self, mut exp: Experiment, rank: u32, nic: NicChoice) -> Experiment {
        let Some(node) = self.nodes.get(rank as usize).and_then(Option::as_ref) else {
            return exp;
        };
        match nic {
            NicChoice::Nic(i) => {
                exp.nics = node
                    .addrs
                    .get(i as usize)
                    .map(|a| vec![a.to_string()])
                    .unwrap_or_default();
            }
            NicChoice::All => {
                exp.nics = node.addrs.iter().map(IpAddr::to_string).collect();
                exp.channels = exp.channels.max(node.addrs.len() as u32);
            }
        }
        exp.nic_policy = tcpx_model::NicPolicy::RoundRobin;
        exp
    }

    fn start(&mut self, now: Instant, out: &mut Vec<FleetAction>) {
        self.phase = Phase::Running;
        self.settle(now, out);
    }

    /// Rows for the runs in flight that have both reports; when none is left in flight, starts
    /// slots until one has work (or the schedule is done).
    fn settle(&mut self, now: Instant, out: &mut Vec<FleetAction>) {
        if self.phase != Phase::Running {
            return;
        }
        let (done, left): (Vec<Active>, Vec<Active>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| a.sender.is_some() && a.receiver.is_some());
        self.active = left;
        for a in done {
            let row = self.row(&a.run, a.round, a.sender, a.receiver);
            self.rows += 1;
            out.push(FleetAction::Row(row));
        }
        while self.active.is_empty() {
            let Some(slot) = self.slots.get(self.next_slot).cloned() else {
                self.phase = Phase::Over;
                for r in 1..self.nodes.len() as u32 {
                    if self.alive(r) {
                        out.push(FleetAction::Send {
                            rank: r,
                            msg: FleetMsg::Bye,
                        });
                    }
                }
                out.push(FleetAction::Finished);
                return;
            };
            self.next_slot += 1;
            for run in slot.runs {
                let gone = [run.sender, run.receiver]
                    .into_iter()
                    .find(|&r| !self.alive(r));
                if let Some(g) = gone {
                    let why = format!(
                        "skipped: node {g} is out of the run ({})",
                        self.lost[g as usize].as_deref().unwrap_or("not joined")
                    );
                    let skipped = SideReport {
                        error: Some(why),
                        ..SideReport::default()
                    };
                    let mut row = self.row(&run, slot.round, Some(skipped.clone()), None);
                    row.status = "skipped".into();
                    self.rows += 1;
                    out.push(FleetAction::Row(row));
                    continue;
                }
                let Some(listen) = self.addr_of(run.receiver, run.nic) else {
                    continue;
                };
                let exp = self.exp_for(self.cfg.exp.clone(), run.receiver, run.nic);
                out.push(FleetAction::Send {
                    rank: run.receiver,
                    msg: FleetMsg::Serve {
                        run,
                        exp: Box::new(exp),
                        listen,
                    },
                });
                self.active.push(Active {
                    run,
                    round: slot.round,
                    deadline: now + self.cfg.pair_wait,
                    sent: false,
                    sender: None,
                    receiver: None,
                });
            }
        }
    }

    fn row(
        &self,
        run: &PairRun,
        round: u32,
        sender: Option<SideReport>,
        receiver: Option<SideReport>,
    ) -> FleetRow {
        let host = |r: u32| {
            self.nodes
                .get(r as usize)
                .and_then(Option::as_ref)
                .map(|n| n.host.clone())
                .unwrap_or_default()
        };
        let addr = |r: u32| match self.nodes.get(r as usize).and_then(Option::as_ref) {
            Some(n) => match run.nic {
                NicChoice::Nic(i) => n
                    .addrs
                    .get(i as usize)
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                NicChoice::All => n
                    .addrs
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(";"),
            },
            None => String::new(),
        };
        let s = believable(sender.unwrap_or_default(), &self.cfg.exp, run.sender);
        let r = believable(receiver.unwrap_or_default(), &self.cfg.exp, run.receiver);
        let errors: Vec<String> = [("sender", &s.error), ("receiver", &r.error)]
            .into_iter()
            .filter_map(|(who, e)| e.as_ref().map(|e| format!("{who}: {e}")))
            .collect();
        let wrong = r.wrong_bytes.or(s.wrong_bytes);
        let status = if !errors.is_empty() {
            "failed"
        } else if wrong.is_some_and(|w| w > 0) {
            "wrong_bytes"
        } else if self.cfg.exp.verify && wrong.is_none() {
            "failed"
        } else {
            "ok"
        };
        let mut error = errors.join("; ");
        if status == "failed" && error.is_empty() {
            error = "the received bytes were not checked".into();
        }
        FleetRow {
            run: run.id,
            rep: run.rep,
            round,
            nic: run.nic.label(),
            sender: run.sender,
            sender_host: host(run.sender),
            sender_addr: addr(run.sender),
            receiver: run.receiver,
            receiver_host: host(run.receiver),
            receiver_addr: addr(run.receiver),
            size: self.cfg.exp.sizes.first().copied().unwrap_or(0),
            bytes: r.bytes.max(s.bytes),
            wrong_bytes: wrong,
            gbps: r.gbps.or(s.gbps),
            p50_us: r.p50_us.or(s.p50_us),
            connect_ms: s.connect_ms,
            accept_ms: s.accept_ms,
            first_byte_ms: s.first_byte_ms,
            setup_ms: s.setup_ms,
            status: status.into(),
            error,
        }
    }
}

/// The bytes a side of a pair run of `exp` moves in its timed iterations: what its report's
/// `bytes` must be.
pub fn asked_bytes(exp: &Experiment) -> u64 {
    exp.sizes
        .first()
        .copied()
        .unwrap_or(0)
        .saturating_mul(u64::from(exp.iters))
        .saturating_mul(u64::from(exp.flows))
}

/// Why node `rank`'s report of a finished side cannot be a real run of `exp`: bytes other than
/// asked, a rate or time no link allows ([`tcpx_model::check_gbs`], [`tcpx_model::check_time`]),
/// more wrong bytes than moved, setup times that are not times. `None` for a believable one (or
/// one that reports its failure).
fn impossible(report: &SideReport, exp: &Experiment) -> Option<String> {
    if report.error.is_some() {
        return None;
    }
    let asked = asked_bytes(exp);
    let per_iteration = asked / u64::from(exp.iters.max(1));
    let check = || -> Result<(), String> {
        if report.bytes != asked {
            return Err(format!(
                "{} bytes moved where {asked} were asked",
                report.bytes
            ));
        }
        match report.gbps {
            Some(g) => tcpx_model::check_gbs("gbps", g)?,
            None => return Err("no rate".into()),
        }
        if let Some(p) = report.p50_us {
            tcpx_model::check_time("p50", p / 1e6, per_iteration)?;
        }
        if let Some(w) = report.wrong_bytes.filter(|&w| w > report.bytes) {
            return Err(format!("{w} wrong bytes of {} moved", report.bytes));
        }
        for (what, ms) in [
            ("connect_ms", report.connect_ms),
            ("accept_ms", report.accept_ms),
            ("first_byte_ms", report.first_byte_ms),
            ("setup_ms", report.setup_ms),
        ] {
            if let Some(ms) =
                ms.filter(|&ms| !(0.0..=tcpx_model::LONGEST_SECONDS * 1e3).contains(&ms))
            {
                return Err(format!("{what} {ms:e} is not a time"));
            }
        }
        Ok(())
    };
    check().err()
}

/// `report` when it is believable, else a failed side naming node `rank` and why (none of its
/// figures kept, so none reaches the matrix or the verdicts).
fn believable(report: SideReport, exp: &Experiment, rank: u32) -> SideReport {
    match impossible(&report, exp) {
        None => report,
        Some(why) => SideReport {
            error: Some(format!(
                "node {rank} reported impossible figures: {}",
                tcpx_bench::shown(&why, 300)
            )),
            ..SideReport::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, VecDeque};

    /// How a simulated node behaves.
    #[derive(Clone, Copy, PartialEq)]
    enum Fault {
        None,
        /// Its link closes when it is given its `n`-th task (0-based).
        DiesAtTask(u32),
        /// It stops answering from its `n`-th task on (the link stays up).
        HangsAtTask(u32),
    }

    struct Sim {
        leader: FleetLeader,
        now: Instant,
        queue: VecDeque<FleetEvent>,
        faults: BTreeMap<u32, Fault>,
        tasks: BTreeMap<u32, u32>,
        dead: Vec<u32>,
        rows: Vec<FleetRow>,
        lost: Vec<(u32, String)>,
        refused: Vec<(u64, String)>,
        accepted: Vec<(u64, u32)>,
        finished: bool,
        /// GB/s of a run: (sender, receiver, nic) -> value.
        speed: fn(u32, u32, NicChoice) -> f64,
    }

    fn node(rank: u32, nics: u32) -> NodeInfo {
        NodeInfo {
            rank,
            host: format!("n{rank}"),
            nics: (0..nics).map(|i| format!("eth{i}")).collect(),
            addrs: (0..nics)
                .map(|i| IpAddr::from([10, i as u8, 0, rank as u8]))
                .collect(),
        }
    }

    fn cfg(nodes: u32, reps: u32) -> FleetConfig {
        FleetConfig {
            nodes,
            reps,
            exp: Experiment::default(),
            join_wait: Duration::from_secs(60),
            pair_wait: Duration::from_secs(120),
        }
    }

    impl Sim {
        fn new(c: FleetConfig, nics: u32) -> Sim {
            let now = Instant::now();
            Sim {
                leader: FleetLeader::new(c, node(0, nics), now),
                now,
                queue: VecDeque::new(),
                faults: BTreeMap::new(),
                tasks: BTreeMap::new(),
                dead: Vec::new(),
                rows: Vec::new(),
                lost: Vec::new(),
                refused: Vec::new(),
                accepted: Vec::new(),
                finished: false,
                speed: |_, _, _| 10.0,
            }
        }

        fn feed(&mut self, e: FleetEvent) {
            let actions = self.leader.handle(e, self.now);
            for a in actions {
                self.act(a);
            }
        }

        fn act(&mut self, a: FleetAction) {
            match a {
                FleetAction::Accept { conn, rank } => self.accepted.push((conn, rank)),
                FleetAction::Refuse { conn, reason } => self.refused.push((conn, reason)),
                FleetAction::Row(r) => self.rows.push(r),
                FleetAction::NodeLost { rank, why } => self.lost.push((rank, why)),
                FleetAction::Finished => self.finished = true,
                FleetAction::Send { rank, msg } => self.deliver(rank, msg),
            }
        }

        /// Node `rank`'s report on its `side` of run `run`, queued as the leader's next event.
        fn done(&mut self, rank: u32, run: u32, side: PairSide, report: SideReport) {
            self.queue.push_back(FleetEvent::Message {
                rank,
                msg: FleetMsg::Done { run, side, report },
            });
        }

        /// A node's answer to a message, queued as the leader's next events.
        fn deliver(&mut self, rank: u32, msg: FleetMsg) {
            if self.dead.contains(&rank) {
                return;
            }
            if !matches!(msg, FleetMsg::Serve { .. } | FleetMsg::Send { .. }) {
                return;
            }
            let n = self.tasks.entry(rank).or_default();
            let task = *n;
            *n += 1;
            let fault = self.faults.get(&rank).copied().unwrap_or(Fault::None);
            let failing = match fault {
                Fault::DiesAtTask(k) | Fault::HangsAtTask(k) => task >= k,
                Fault::None => false,
            };
            // A sender that fails leaves its receiver's bench server waiting for a client until
            // the experiment's timeout, when the server reports the failure.
            if let (true, FleetMsg::Send { run, .. }) = (failing, &msg) {
                if !self.dead.contains(&run.receiver) {
                    let report = SideReport {
                        error: Some("timed out waiting for the client".into()),
                        ..SideReport::default()
                    };
                    self.done(run.receiver, run.id, PairSide::Receiver, report);
                }
            }
            match fault {
                Fault::DiesAtTask(k) if task >= k => {
                    self.dead.push(rank);
                    self.queue.push_back(FleetEvent::Lost {
                        rank,
                        why: "the connection was closed".into(),
                    });
                    return;
                }
                Fault::HangsAtTask(k) if task >= k => {
                    self.dead.push(rank);
                    return;
                }
                _ => {}
            }
            match msg {
                FleetMsg::Serve { run, exp, listen } => {
                    assert_eq!(run.receiver, rank);
                    assert_eq!(
                        exp.nics.len(),
                        if run.nic == NicChoice::All { 2 } else { 1 }
                    );
                    assert!(exp.nics.contains(&listen.to_string()));
                    self.queue.push_back(FleetEvent::Message {
                        rank,
                        msg: FleetMsg::Listening {
                            run: run.id,
                            probe_port: 1000,
                            bench_port: 1001,
                        },
                    });
                }
                FleetMsg::Send { run, from, to, .. } => {
                    assert_eq!(run.sender, rank);
                    // Addresses are 10.nic.0.rank: each side its own.
                    let last = |a: IpAddr| match a {
                        IpAddr::V4(v) => u32::from(v.octets()[3]),
                        IpAddr::V6(_) => u32::MAX,
                    };
                    assert_eq!((last(from), last(to)), (run.sender, run.receiver));
                    let gbps = (self.speed)(run.sender, run.receiver, run.nic);
                    let report = SideReport {
                        gbps: Some(gbps),
                        bytes: asked_bytes(&self.leader.cfg.exp),
                        wrong_bytes: Some(0),
                        ..SideReport::default()
                    };
                    // The receiver may be dead by now: then only the sender answers.
                    self.done(rank, run.id, PairSide::Sender, report.clone());
                    if !self.dead.contains(&run.receiver) {
                        self.done(run.receiver, run.id, PairSide::Receiver, report);
                    }
                }
                _ => {}
            }
        }

        /// Runs until the leader finishes: events first, then the clock to the next deadline.
        fn run(&mut self) {
            for _ in 0..1_000_000 {
                if self.finished {
                    return;
                }
                if let Some(e) = self.queue.pop_front() {
                    self.feed(e);
                    continue;
                }
                let t = self
                    .leader
                    .poll_timeout()
                    .expect("the leader waits for nothing and has not finished");
                self.now = self.now.max(t);
                self.feed(FleetEvent::Tick);
            }
            panic!("the simulation did not end");
        }

        fn join(&mut self, conn: u64, rank: u32, nics: u32) {
            self.feed(FleetEvent::Joined {
                conn,
                node: node(rank, nics),
            });
        }
    }

    #[test]
    fn a_healthy_fleet_fills_the_whole_matrix() {
        let mut sim = Sim::new(cfg(4, 2), 2);
        for r in 1..4 {
            sim.join(r as u64, r, 2);
        }
        sim.run();
        let scheduled = sim.leader.scheduled();
        assert_eq!(
            scheduled,
            4 * 3 * 3 * 2,
            "12 ordered pairs x (2 NICs + all) x 2 reps"
        );
        assert_eq!(sim.rows.len() as u32, scheduled);
        assert!(
            sim.rows.iter().all(|r| r.status == "ok"),
            "{:?}",
            sim.rows[0]
        );
        assert!(sim.lost.is_empty() && sim.refused.is_empty());
        assert_eq!(sim.rows.iter().filter(|r| r.nic == "all").count(), 24);
        assert!(sim
            .rows
            .iter()
            .filter(|r| r.nic == "all")
            .all(|r| r.sender_addr.contains(';')));
    }

    #[test]
    fn a_node_dying_mid_round_is_named_and_every_other_result_is_kept() {
        let mut sim = Sim::new(cfg(4, 1), 2);
        sim.faults.insert(2, Fault::DiesAtTask(3));
        for r in 1..4 {
            sim.join(r as u64, r, 2);
        }
        sim.run();
        assert_eq!(
            sim.rows.len() as u32,
            sim.leader.scheduled(),
            "a row per run"
        );
        assert_eq!(sim.lost.len(), 1);
        assert_eq!(sim.lost[0].0, 2);
        assert!(sim.lost[0].1.contains("closed"), "{}", sim.lost[0].1);
        // Runs without node 2 all measured; runs with it before it died measured too.
        for r in &sim.rows {
            let with2 = r.sender == 2 || r.receiver == 2;
            if !with2 {
                assert_eq!(r.status, "ok", "{r:?}");
            }
        }
        let with2: Vec<&FleetRow> = sim
            .rows
            .iter()
            .filter(|r| r.sender == 2 || r.receiver == 2)
            .collect();
        assert_eq!(
            with2.iter().filter(|r| r.status == "ok").count(),
            3,
            "its first three tasks (one side of a run each) finished"
        );
        assert!(with2
            .iter()
            .any(|r| r.status == "failed" && r.error.contains("node 2 lost")));
        assert!(with2
            .iter()
            .any(|r| r.status == "skipped" && r.error.contains("node 2 is out")));
    }

    #[test]
    fn a_hanging_node_meets_the_pair_deadline() {
        let mut sim = Sim::new(cfg(3, 1), 1);
        sim.faults.insert(1, Fault::HangsAtTask(0));
        let start = sim.now;
        sim.join(1, 1, 1);
        sim.join(2, 2, 1);
        sim.run();
        assert_eq!(sim.lost.len(), 1, "{:?}", sim.lost);
        assert_eq!(sim.lost[0].0, 1);
        assert!(
            sim.lost[0].1.contains("pair deadline of 120 s"),
            "{}",
            sim.lost[0].1
        );
        assert!(sim.now >= start + Duration::from_secs(120));
        assert_eq!(sim.rows.len() as u32, sim.leader.scheduled());
        let ok: Vec<_> = sim.rows.iter().filter(|r| r.status == "ok").collect();
        assert_eq!(ok.len(), 2, "0<->2 both ways");
        assert!(ok.iter().all(|r| r.sender != 1 && r.receiver != 1));
    }

    /// A refusal for now says so on the wire; a final one reads as before (a node of an older
    /// leader, whose refusals carry no `retry`, takes them as final).
    #[test]
    fn a_refusal_says_whether_to_try_again() {
        let now = FleetMsg::Refused {
            reason: "full".into(),
            retry: true,
        };
        let line = serde_json::to_string(&now).unwrap();
        assert_eq!(line, r#"{"msg":"refused","reason":"full","retry":true}"#);
        assert_eq!(serde_json::from_str::<FleetMsg>(&line).unwrap(), now);
        let old: FleetMsg = serde_json::from_str(r#"{"msg":"refused","reason":"no"}"#).unwrap();
        assert_eq!(
            old,
            FleetMsg::Refused {
                reason: "no".into(),
                retry: false
            }
        );
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"msg":"refused","reason":"no"}"#
        );
    }

    #[test]
    fn late_joiners_duplicates_and_strangers_are_refused_with_the_reason() {
        let mut sim = Sim::new(cfg(4, 1), 1);
        sim.join(10, 1, 1);
        sim.join(11, 1, 1);
        assert_eq!(sim.refused.len(), 1);
        assert!(sim.refused[0]
            .1
            .contains("rank 1 already joined from host n1"));
        sim.join(12, 0, 1);
        sim.join(13, 7, 1);
        sim.join(14, 2, 3);
        assert_eq!(sim.refused.len(), 4, "{:?}", sim.refused);
        assert!(sim.refused[1].1.contains("not a follower's rank"));
        assert!(sim.refused[3].1.contains("brings 3 NIC(s), the leader 1"));
        sim.join(15, 2, 1);
        // Rank 3 never comes: at the join deadline it is named, and the other three run.
        sim.run();
        assert_eq!(sim.lost.len(), 1);
        assert_eq!(sim.lost[0].0, 3);
        assert!(sim.lost[0].1.contains("never joined"));
        assert_eq!(sim.rows.len() as u32, sim.leader.scheduled());
        assert_eq!(sim.rows.iter().filter(|r| r.status == "ok").count(), 6);
        assert_eq!(sim.rows.iter().filter(|r| r.status == "skipped").count(), 6);
        // After the start, rank 3 is refused as late.
        sim.join(16, 3, 1);
        assert!(sim
            .refused
            .last()
            .unwrap()
            .1
            .contains("came after the fleet had started"));
        assert_eq!(sim.accepted, vec![(10, 1), (15, 2)]);
    }

    /// Issue 43 item 5: a node claiming an address no one can be reached at, or one that is
    /// another node's (the leader's included) or given twice, is refused with the reason; a
    /// node with its own addresses then joins.
    #[test]
    fn claimed_nic_addresses_that_cannot_be_the_nodes_own_are_refused() {
        let mut sim = Sim::new(cfg(3, 1), 2);
        let leaders = node(0, 2).addrs[1];
        let claims: [(Vec<IpAddr>, &str); 6] = [
            (
                vec![[0, 0, 0, 0].into(), [10, 1, 0, 1].into()],
                "unspecified",
            ),
            (
                vec![[10, 0, 0, 1].into(), [255, 255, 255, 255].into()],
                "broadcast",
            ),
            (
                vec![[224, 0, 0, 1].into(), [10, 1, 0, 1].into()],
                "multicast",
            ),
            (
                vec!["ff02::1".parse().unwrap(), [10, 1, 0, 1].into()],
                "multicast",
            ),
            (vec![[10, 0, 0, 1].into(), leaders], "which node 0 (n0) has"),
            (vec![[10, 0, 0, 1].into(), [10, 0, 0, 1].into()], "twice"),
        ];
        for (conn, (addrs, says)) in claims.iter().enumerate() {
            let claim = NodeInfo {
                addrs: addrs.clone(),
                ..node(1, 2)
            };
            sim.feed(FleetEvent::Joined {
                conn: conn as u64,
                node: claim,
            });
            let (c, why) = sim.refused.last().expect("refused");
            assert_eq!(*c, conn as u64);
            assert!(why.contains(says), "{addrs:?}: {why}");
        }
        sim.join(10, 1, 2);
        // Node 2 claiming node 1's second address.
        let claim = NodeInfo {
            addrs: vec![[10, 0, 0, 2].into(), node(1, 2).addrs[1]],
            ..node(2, 2)
        };
        sim.feed(FleetEvent::Joined {
            conn: 11,
            node: claim,
        });
        assert!(sim
            .refused
            .last()
            .unwrap()
            .1
            .contains("which node 1 (n1) has"));
        assert_eq!(sim.accepted, vec![(10, 1)]);
    }

    #[test]
    fn a_late_joiner_within_the_deadline_takes_part() {
        let mut sim = Sim::new(cfg(3, 1), 1);
        sim.join(1, 1, 1);
        sim.now += Duration::from_secs(59);
        sim.feed(FleetEvent::Tick);
        assert!(sim.rows.is_empty() && sim.lost.is_empty(), "still joining");
        sim.join(2, 2, 1);
        sim.run();
        assert_eq!(sim.rows.len(), 6);
        assert!(sim.rows.iter().all(|r| r.status == "ok"));
    }

    /// Issue 43 item 4: a node reporting `gbps 1e308`, `-5`, `bytes 2^64-1` or more wrong
    /// bytes than it moved gets its rows failed naming it, and no figure of it in the matrix.
    #[test]
    fn a_nodes_impossible_figures_fail_its_rows_naming_it() {
        let exp = Experiment::default();
        let good = SideReport {
            gbps: Some(10.0),
            p50_us: Some(100.0),
            bytes: asked_bytes(&exp),
            wrong_bytes: Some(0),
            ..SideReport::default()
        };
        assert_eq!(impossible(&good, &exp), None);
        for (bad, says) in [
            (
                SideReport {
                    gbps: Some(1e308),
                    ..good.clone()
                },
                "gbps",
            ),
            (
                SideReport {
                    gbps: Some(-5.0),
                    ..good.clone()
                },
                "gbps",
            ),
            (
                SideReport {
                    bytes: u64::MAX,
                    ..good.clone()
                },
                "were asked",
            ),
            (
                SideReport {
                    wrong_bytes: Some(u64::MAX),
                    ..good.clone()
                },
                "wrong bytes",
            ),
            (
                SideReport {
                    p50_us: Some(-1.0),
                    ..good.clone()
                },
                "p50",
            ),
            (
                SideReport {
                    setup_ms: Some(1e300),
                    ..good.clone()
                },
                "setup_ms",
            ),
        ] {
            let why = impossible(&bad, &exp).expect("refused");
            assert!(why.contains(says), "{why}");
        }
        let mut sim = Sim::new(cfg(3, 1), 1);
        sim.speed = |s, _, _| if s == 2 { 1e308 } else { 10.0 };
        sim.join(1, 1, 1);
        sim.join(2, 2, 1);
        sim.run();
        assert_eq!(sim.rows.len() as u32, sim.leader.scheduled());
        for row in &sim.rows {
            // Both sides report the speed of the sender in the simulation.
            if row.sender == 2 {
                assert_eq!(row.status, "failed", "{row:?}");
                assert!(
                    row.error.contains("node 2 reported impossible figures"),
                    "{row:?}"
                );
                assert_eq!(row.gbps, None, "{row:?}");
            } else {
                assert_eq!(row.status, "ok", "{row:?}");
            }
        }
    }

    #[test]
    fn wrong_or_unchecked_bytes_are_not_measurements() {
        let mut sim = Sim::new(cfg(2, 1), 1);
        sim.join(1, 1, 1);
        // Intercept: answer by hand.
        let serve = sim.rows.len();
        assert_eq!(serve, 0);
        let lead = &mut sim.leader;
        let now = sim.now;
        let run0 = lead.handle(
            FleetEvent::Message {
                rank: 1,
                msg: FleetMsg::Listening {
                    run: 0,
                    probe_port: 1,
                    bench_port: 2,
                },
            },
            now,
        );
        assert!(
            matches!(run0[0], FleetAction::Send { rank: 0, .. }),
            "{run0:?}"
        );
        let report = |w: Option<u64>| SideReport {
            gbps: Some(1.0),
            bytes: asked_bytes(&Experiment::default()),
            wrong_bytes: w,
            ..SideReport::default()
        };
        lead.handle(
            FleetEvent::Message {
                rank: 0,
                msg: FleetMsg::Done {
                    run: 0,
                    side: PairSide::Sender,
                    report: report(None),
                },
            },
            now,
        );
        let a = lead.handle(
            FleetEvent::Message {
                rank: 1,
                msg: FleetMsg::Done {
                    run: 0,
                    side: PairSide::Receiver,
                    report: report(Some(5)),
                },
            },
            now,
        );
        let FleetAction::Row(row) = &a[0] else {
            panic!("{a:?}")
        };
        assert_eq!(row.status, "wrong_bytes");
        assert_eq!(row.measured(), None);
    }
}
