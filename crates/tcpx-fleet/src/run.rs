//! The fleet's drivers: the leader (rank 0: the link's listener, one reader thread per node,
//! the protocol machine of [`super::proto`] on the real clock, its own node's pair runs, the
//! files) and a follower (connect, greet, carry out what the leader sends until `Bye`).
//!
//! The link is JSON lines over TCP; the greeting proves the run token both ways
//! ([`tcpx_link::auth`]: follower's nonce in `Hello`, leader's nonce and proof in `Welcome`, the
//! follower's proof in `Auth`), and a link beyond loopback without a token is refused. Every
//! wait has a deadline: the join deadline, the pair deadline (both in the machine), the
//! greeting's [`GREETING_WAIT`] (one for a connection's whole greeting, however it trickles),
//! and a follower's [`FleetOptions::idle_limit`] without word from its leader. Strangers on the
//! leader's port cannot keep a node out (its acceptor): those that have not said hello give
//! way to newcomers, and a node turned away from a full port tries again until its join
//! deadline. Every row goes to `matrix.csv` as it ends (one whole-row append), and `matrix.json`
//! is rewritten whole through a temporary name every [`JSON_EVERY`], so a run cut short leaves
//! every result it had.

use std::collections::{HashMap, VecDeque};
use std::io::BufReader;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcpx_report::fleet::{FleetDoc, FleetEnd, FleetFiles, FleetNode, FleetStart, FleetWriter};

use super::error::FleetError;
use super::node::{self, NodeCtx};
use super::options::{check_size, FleetOptions};
use super::outliers::findings;
use super::proto::{
    FleetAction, FleetConfig, FleetEvent, FleetLeader, FleetMsg, NodeInfo, FLEET_PROTOCOL, MAX_NICS,
};
use tcpx_link::auth::{self, RunToken};
use tcpx_link::{drain_and_close, recv_json_line, send_json_line, shown, Closing, LinkError};
use tcpx_model::{remaining, Backoff};

/// Longest wait for a whole greeting: on the leader, from a connection's accept to its `Auth`
/// (however its bytes trickle in); on a node, for the leader's welcome.
pub const GREETING_WAIT: Duration = Duration::from_secs(30);
/// Connections the leader holds on its port beyond one per node: room for nodes that retry and
/// for strangers, whose greetings each take a thread until their deadline.
pub const SPARE_LINKS: usize = 64;
/// `matrix.json` is rewritten at most this often while rows come in (every row goes to
/// `matrix.csv` at once), and whenever a node is lost or the run ends.
pub const JSON_EVERY: Duration = Duration::from_secs(5);
/// The addresses of `entries` (each a local address, or an interface name: its first IPv4
/// address, else its first global IPv6 one), each checked to be bindable here.
pub fn resolve_nics(entries: &[String]) -> Result<Vec<IpAddr>, FleetError> {
    if entries.is_empty() {
        return Err(FleetError::Refused("no NICs: give this node's NICs with --nics (interface names such as eth1,eth2 or local addresses)".into()));
    }
    if entries.len() > MAX_NICS {
        return Err(FleetError::Refused(format!(
            "{} NICs: at most {MAX_NICS} per node",
            entries.len()
        )));
    }
    let interfaces = tcpx_bench::nics::local_interfaces().map_err(FleetError::Failed)?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.trim();
        let addr = match e.parse::<IpAddr>() {
            Ok(a) => a,
            Err(_) => {
                let Some(i) = interfaces.iter().find(|i| i.name == e) else {
                    return Err(FleetError::Refused(format!(
                        "NIC `{}` is neither an address nor an interface of this node ({}): check --nics",
                        shown(e, 64),
                        interfaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                };
                if !i.up {
                    return Err(FleetError::Refused(format!("NIC {e} is down: bring it up (ip link set {e} up) or leave it out of --nics")));
                }
                i.addrs
                    .iter()
                    .copied()
                    .find(IpAddr::is_ipv4)
                    .or_else(|| {
                        i.addrs.iter().copied().find(|a| match a {
                            IpAddr::V6(v) => (v.segments()[0] & 0xffc0) != 0xfe80,
                            IpAddr::V4(_) => false,
                        })
                    })
                    .ok_or_else(|| FleetError::Refused(format!("NIC {e} has no usable address: give it one, or name an address in --nics")))?
            }
        };
        TcpListener::bind((addr, 0)).map_err(|err| {
            FleetError::step(
                format!("NIC address {addr} ({e}) cannot be bound here: is it this node's?"),
                err,
            )
        })?;
        if out.contains(&addr) {
            return Err(FleetError::Refused(format!(
                "NIC address {addr} is given twice in --nics"
            )));
        }
        out.push(addr);
    }
    Ok(out)
}

fn write_msg(stream: &mut TcpStream, m: &FleetMsg) -> Result<(), LinkError> {
    send_json_line(stream, m)
}

/// The next message; `wait` bounds it (`None`: until the connection ends).
fn read_msg(
    reader: &mut BufReader<TcpStream>,
    wait: Option<Duration>,
) -> Result<FleetMsg, LinkError> {
    recv_json_line(reader, wait)
}

/// What reaches the leader's loop.
enum Inbox {
    Greeted {
        conn: u64,
        node: NodeInfo,
        stream: TcpStream,
    },
    Msg {
        conn: u64,
        msg: FleetMsg,
    },
    Closed {
        conn: u64,
        why: String,
    },
    Own(FleetMsg),
}

/// The run's name in the token proofs.
fn run_name(nodes: u32) -> String {
    format!("tcpx-run fleet of {nodes} nodes")
}

/// How far a connection on the leader's port has come, shared by its reader thread and the
/// acceptor: the acceptor may close one for room only while it is [`GREETING`], and closes
/// those not yet [`JOINED`] when the run ends.
const GREETING: u8 = 0;
/// Its hello is read: it said which node it is, and no newcomer may take its place.
const IDENTIFIED: u8 = 1;
/// Its greeting is whole and handed to the leader's loop, which closes it from then on.
const JOINED: u8 = 2;
/// Closed by the acceptor (for room, or at the end): its reader ends without a word.
const CLOSED: u8 = 3;

/// One connection on the leader's port and its reader thread.
struct PortConn {
    from: SocketAddr,
    /// The socket, for the acceptor to close (the reader's blocked read then ends).
    socket: TcpStream,
    state: Arc<AtomicU8>,
    reader: JoinHandle<()>,
}

/// The leader's half of the greeting on a new connection (whole by `by`); then its messages,
/// until it ends.
fn greet_and_read(
    conn: u64,
    stream: TcpStream,
    token: Option<RunToken>,
    nodes: u32,
    state: Arc<AtomicU8>,
    by: Instant,
    tx: mpsc::Sender<Inbox>,
) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    // The reason is sent, then the connection closed gently so that it arrives.
    let refuse = |mut s: TcpStream, reason: String| {
        eprintln!("tcpx-run fleet: refused a connection from {peer}: {reason}");
        let _ = write_msg(
            &mut s,
            &FleetMsg::Refused {
                reason,
                retry: false,
            },
        );
        drain_and_close(s, Duration::from_secs(2));
    };
    // What is left of the greeting's one deadline (zero once past: the read then ends at once).
    let left = || Some(remaining(by).unwrap_or(Duration::ZERO));
    let closed_by_acceptor = || state.load(Ordering::Acquire) == CLOSED;
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let hello = match read_msg(&mut reader, left()) {
        Ok(m) => m,
        Err(_) if closed_by_acceptor() => return,
        Err(LinkError::Timeout) => {
            eprintln!(
                "tcpx-run fleet: a connection from {peer} sent no whole greeting within {} s",
                GREETING_WAIT.as_secs()
            );
            return;
        }
        Err(e) => {
            eprintln!("tcpx-run fleet: a connection from {peer} sent no greeting: {e}");
            return;
        }
    };
    // From here it has said who it is: no newcomer closes it for room.
    if state
        .compare_exchange(GREETING, IDENTIFIED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let FleetMsg::Hello {
        protocol,
        version,
        rank,
        nodes: their_nodes,
        host,
        nics,
        addrs,
        nonce: follower_nonce,
    } = hello
    else {
        return refuse(writer, format!("expected hello, got {}", hello.kind()));
    };
    if protocol != FLEET_PROTOCOL {
        return refuse(
            writer,
            format!(
                "fleet protocol {protocol} (tcpx-run {}) but the leader speaks {FLEET_PROTOCOL}: run the same tcpx-run on every node",
                shown(&version, 64)
            ),
        );
    }
    if their_nodes != nodes {
        return refuse(
            writer,
            format!("the node was told the fleet has {their_nodes} nodes, the leader {nodes}: give every node the same --nodes"),
        );
    }
    if !auth::valid_nonce(&follower_nonce) || nics.len() > MAX_NICS || addrs.len() != nics.len() {
        return refuse(writer, "a malformed greeting".into());
    }
    let run = run_name(nodes);
    let Ok(leader_nonce) = auth::nonce() else {
        return;
    };
    let proof = auth::prove(
        token.as_ref(),
        auth::Role::Leader,
        &follower_nonce,
        &leader_nonce,
        &run,
    );
    if write_msg(
        &mut writer,
        &FleetMsg::Welcome {
            protocol: FLEET_PROTOCOL,
            nonce: leader_nonce.clone(),
            proof,
            run: run.clone(),
        },
    )
    .is_err()
    {
        return;
    }
    match read_msg(&mut reader, left()) {
        Ok(FleetMsg::Auth { proof })
            if auth::verify(
                token.as_ref(),
                auth::Role::Follower,
                &follower_nonce,
                &leader_nonce,
                &run,
                &proof,
            ) => {}
        Ok(_) => {
            return refuse(
                writer,
                format!("the run token's proof did not match: give every node the same {} (or --token-file)", auth::TOKEN_ENV),
            )
        }
        Err(_) if closed_by_acceptor() => return,
        Err(LinkError::Timeout) => {
            eprintln!(
                "tcpx-run fleet: {peer} did not finish its greeting within {} s",
                GREETING_WAIT.as_secs()
            );
            return;
        }
        Err(e) => {
            eprintln!("tcpx-run fleet: {peer} did not finish its greeting: {e}");
            return;
        }
    }
    if state
        .compare_exchange(IDENTIFIED, JOINED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let node = NodeInfo {
        rank,
        host: shown(&host, 256),
        nics: nics.iter().map(|n| shown(n, 64)).collect(),
        addrs,
    };
    if tx
        .send(Inbox::Greeted {
            conn,
            node,
            stream: writer,
        })
        .is_err()
    {
        return;
    }
    loop {
        match read_msg(&mut reader, None) {
            Ok(msg) => {
                if tx.send(Inbox::Msg { conn, msg }).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Inbox::Closed {
                    conn,
                    why: format!("its link to the leader ended: {e}"),
                });
                return;
            }
        }
    }
}

/// The leader's acceptor: every connection on `listener` gets a reader thread
/// ([`greet_and_read`]) with one deadline for its whole greeting, so connections greet side by
/// side and none waits on another. At most `nodes` + [`SPARE_LINKS`] are open at once; a
/// newcomer beyond that closes the oldest connection that has not yet said hello (a silent or
/// trickling stranger), never one that has, and when all have, the newcomer is told the port is
/// full and to try again (a node does, within its join deadline). Runs until `stop`; then closes
/// the connections still greeting and returns every reader thread to be joined.
fn accept_nodes(
    listener: &TcpListener,
    token: Option<RunToken>,
    nodes: u32,
    tx: &mpsc::Sender<Inbox>,
    stop: &AtomicBool,
) -> Vec<JoinHandle<()>> {
    let max_links = nodes as usize + SPARE_LINKS;
    let mut open: Vec<PortConn> = Vec::new();
    let mut ended: Vec<JoinHandle<()>> = Vec::new();
    // Refusals on their way out, closed gently side by side without holding up the accepts.
    let mut closing = Closing::default();
    let mut conn = 0u64;
    while !stop.load(Ordering::Relaxed) {
        closing.poll();
        let until = Instant::now() + Duration::from_millis(200);
        let (s, from) = match tcpx_transport::socket::accept_until(listener, until) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                eprintln!("tcpx-run fleet: accepting a node: {e}");
                continue;
            }
        };
        conn += 1;
        let (done, still): (Vec<PortConn>, Vec<PortConn>) = std::mem::take(&mut open)
            .into_iter()
            .partition(|c| c.reader.is_finished() || c.state.load(Ordering::Acquire) == CLOSED);
        open = still;
        ended.extend(done.into_iter().map(|c| c.reader));
        if open.len() >= max_links {
            // The oldest that has not said hello; the swap makes its reader's own progress and
            // this choice exclusive.
            let oldest = open.iter().position(|c| {
                c.state
                    .compare_exchange(GREETING, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
            match oldest {
                Some(i) => {
                    let c = open.remove(i);
                    let _ = c.socket.shutdown(std::net::Shutdown::Both);
                    eprintln!(
                        "tcpx-run fleet: closed a connection from {} that had said nothing whole, to make room ({max_links} connections open)",
                        c.from
                    );
                    ended.push(c.reader);
                }
                None => {
                    let reason = format!(
                        "the leader's port is full: {} connections have greeted (a fleet of {nodes} needs {nodes}); strangers on the port?",
                        open.len()
                    );
                    eprintln!("tcpx-run fleet: refused a connection from {from} for now: {reason}");
                    let mut s = s;
                    if s.set_nonblocking(false).is_ok()
                        && write_msg(
                            &mut s,
                            &FleetMsg::Refused {
                                reason,
                                retry: true,
                            },
                        )
                        .is_ok()
                    {
                        closing.add(s, Duration::from_secs(2));
                    }
                    continue;
                }
            }
        }
        if s.set_nonblocking(false).is_err() || s.set_nodelay(true).is_err() {
            continue;
        }
        let Ok(socket) = s.try_clone() else {
            continue;
        };
        let by = Instant::now() + GREETING_WAIT;
        let state = Arc::new(AtomicU8::new(GREETING));
        let (tx, token, id, shared) = (tx.clone(), token.clone(), conn, Arc::clone(&state));
        match std::thread::Builder::new()
            .name(format!("fleet-link-{id}"))
            .spawn(move || greet_and_read(id, s, token, nodes, shared, by, tx))
        {
            Ok(reader) => open.push(PortConn {
                from,
                socket,
                state,
                reader,
            }),
            Err(e) => eprintln!("tcpx-run fleet: no thread for a connection from {from}: {e}"),
        }
    }
    // Greetings still under way end now; joined nodes are the leader's loop's to close.
    for c in open {
        let greeting = [GREETING, IDENTIFIED].into_iter().any(|from| {
            c.state
                .compare_exchange(from, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if greeting {
            let _ = c.socket.shutdown(std::net::Shutdown::Both);
        }
        ended.push(c.reader);
    }
    closing.finish_in_background();
    ended
}

/// Closes a link whose reader is another thread: what was sent gets its chance to arrive
/// ([`drain_and_close`]), then both directions of the socket shut, so that reader's blocked
/// read ends even when the peer never closes (a node that hangs).
fn close_link(s: TcpStream) {
    let other = s.try_clone();
    drain_and_close(s, Duration::from_secs(2));
    if let Ok(o) = other {
        let _ = o.shutdown(std::net::Shutdown::Both);
    }
}

/// What a finished fleet run left.
#[derive(Debug)]
pub struct FleetOutcome {
    pub doc: FleetDoc,
    pub files: FleetFiles,
}

impl FleetOutcome {
    /// The pair runs measured with verified bytes.
    pub fn measured(&self) -> usize {
        self.doc
            .rows
            .iter()
            .filter(|r| r.measured().is_some())
            .count()
    }

    /// Whether the run found the fleet sound: every scheduled run measured, and nothing named.
    pub fn clean(&self) -> bool {
        let end = &self.doc.end;
        end.complete
            && end.findings.is_empty()
            && self.measured() as u32 == self.doc.start.scheduled
    }
}

fn doc_nodes(m: &FleetLeader, n: u32) -> Vec<FleetNode> {
    (0..n)
        .map(|r| {
            let info = m.nodes().find(|x| x.rank == r);
            FleetNode {
                rank: r,
                host: info.map(|i| i.host.clone()).unwrap_or_default(),
                nics: info.map(|i| i.nics.clone()).unwrap_or_default(),
                addrs: info
                    .map(|i| i.addrs.iter().map(IpAddr::to_string).collect())
                    .unwrap_or_default(),
                lost: m.lost(r).unwrap_or("").to_string(),
            }
        })
        .collect()
}

/// Leads a fleet run on `listener` (already bound; the caller has said where). `say` gets one
/// line per event worth a log line (a node joined or lost, a row written).
pub fn lead(
    o: &FleetOptions,
    listener: TcpListener,
    say: &mut dyn FnMut(&str),
) -> Result<FleetOutcome, FleetError> {
    check_size(o.nodes, o.nics.len(), o.reps)?;
    let local = listener.local_addr()?;
    auth::require_token(o.token.as_ref(), local.ip(), "the fleet leader listening")
        .map_err(FleetError::Refused)?;
    std::fs::create_dir_all(&o.out).map_err(|e| {
        FleetError::step(
            format!("creating the output directory {}", o.out.display()),
            e,
        )
    })?;
    let addrs = resolve_nics(&o.nics)?;
    let ctx = Arc::new(NodeCtx {
        backends: o.backends.clone(),
        addrs: addrs.clone(),
    });
    let own = NodeInfo {
        rank: 0,
        host: o.host.clone(),
        nics: o.nics.clone(),
        addrs,
    };
    let cfg = FleetConfig {
        nodes: o.nodes,
        reps: o.reps,
        exp: o.exp.clone(),
        join_wait: o.join_wait,
        pair_wait: o.pair_wait,
    };
    let mut machine = FleetLeader::new(cfg, own, Instant::now());
    let mut doc = FleetDoc {
        start: FleetStart {
            tool: "tcpx-run fleet".into(),
            version: o.version.clone(),
            started: tcpx_report::utc_now_iso(),
            nodes: doc_nodes(&machine, o.nodes),
            experiment: serde_json::to_value(&o.exp)?,
            reps: o.reps,
            scheduled: machine.scheduled(),
        },
        rows: Vec::new(),
        end: FleetEnd::default(),
    };
    let writer = FleetWriter::create(&o.out).map_err(FleetError::report)?;
    writer.document(&doc, false).map_err(FleetError::report)?;
    let mut json_written = Instant::now();

    let (tx, rx) = mpsc::channel::<Inbox>();
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (tx, stop) = (tx.clone(), Arc::clone(&stop));
        let token = o.token.clone();
        let nodes = o.nodes;
        std::thread::Builder::new()
            .name("fleet-accept".into())
            .spawn(move || accept_nodes(&listener, token, nodes, &tx, &stop))?
    };

    let mut pending: HashMap<u64, TcpStream> = HashMap::new();
    let mut conns: HashMap<u32, TcpStream> = HashMap::new();
    let mut rank_of: HashMap<u64, u32> = HashMap::new();
    let mut backlog: VecDeque<FleetEvent> = VecDeque::new();
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let result: Result<(), FleetError> = (|| {
        while !machine.is_over() {
            let event = match backlog.pop_front() {
                Some(e) => e,
                None => {
                    let wait = machine.poll_timeout().map_or(Duration::from_secs(1), |t| {
                        t.saturating_duration_since(Instant::now())
                    });
                    match rx.recv_timeout(wait) {
                        Ok(Inbox::Greeted { conn, node, stream }) => {
                            pending.insert(conn, stream);
                            FleetEvent::Joined { conn, node }
                        }
                        Ok(Inbox::Msg { conn, msg }) => match rank_of.get(&conn) {
                            Some(&rank) => FleetEvent::Message { rank, msg },
                            None => continue,
                        },
                        Ok(Inbox::Closed { conn, why }) => match rank_of.get(&conn) {
                            Some(&rank) => FleetEvent::Lost { rank, why },
                            None => continue,
                        },
                        Ok(Inbox::Own(msg)) => FleetEvent::Message { rank: 0, msg },
                        Err(mpsc::RecvTimeoutError::Timeout) => FleetEvent::Tick,
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            return Err(FleetError::Failed(
                                "the fleet leader's event channel closed".into(),
                            ))
                        }
                    }
                }
            };
            for action in machine.handle(event, Instant::now()) {
                match action {
                    FleetAction::Accept { conn, rank } => {
                        if let Some(s) = pending.remove(&conn) {
                            conns.insert(rank, s);
                            rank_of.insert(conn, rank);
                        }
                        let host = machine
                            .nodes()
                            .find(|n| n.rank == rank)
                            .map(|n| n.host.clone())
                            .unwrap_or_default();
                        say(&format!("node {rank} ({host}) joined"));
                        doc.start.nodes = doc_nodes(&machine, o.nodes);
                    }
                    FleetAction::Refuse { conn, reason } => {
                        say(&format!("refused a node: {reason}"));
                        if let Some(mut s) = pending.remove(&conn) {
                            let _ = write_msg(
                                &mut s,
                                &FleetMsg::Refused {
                                    reason,
                                    retry: false,
                                },
                            );
                            close_link(s);
                        }
                    }
                    FleetAction::Send { rank: 0, msg } => {
                        let tx = tx.clone();
                        if let Some(h) = node::execute(&ctx, msg, move |m| {
                            let _ = tx.send(Inbox::Own(m));
                        }) {
                            workers.push(h);
                        }
                    }
                    FleetAction::Send { rank, msg } => {
                        let sent = match conns.get_mut(&rank) {
                            Some(s) => write_msg(s, &msg).map_err(|e| e.to_string()),
                            None => Err("no link".into()),
                        };
                        if let Err(e) = sent {
                            if !matches!(msg, FleetMsg::Bye) {
                                backlog.push_back(FleetEvent::Lost {
                                    rank,
                                    why: format!("sending it {}: {e}", msg.kind()),
                                });
                            }
                        }
                    }
                    FleetAction::Row(row) => {
                        let figure = match (row.status.as_str(), row.gbps) {
                            ("ok", Some(g)) => format!("{g:.2} GB/s"),
                            _ => format!("{}: {}", row.status, row.error),
                        };
                        say(&format!(
                            "{} {} -> {} rep {}: {figure}",
                            row.nic, row.sender, row.receiver, row.rep
                        ));
                        writer.row(&row).map_err(FleetError::report)?;
                        doc.rows.push(row);
                        if json_written.elapsed() >= JSON_EVERY {
                            writer.document(&doc, false).map_err(FleetError::report)?;
                            json_written = Instant::now();
                        }
                    }
                    FleetAction::NodeLost { rank, why } => {
                        say(&format!("node {rank} is out of the run: {why}"));
                        doc.start.nodes = doc_nodes(&machine, o.nodes);
                        writer.document(&doc, false).map_err(FleetError::report)?;
                        json_written = Instant::now();
                    }
                    FleetAction::Finished => {}
                }
            }
            workers.retain(|h| !h.is_finished());
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    for (_, s) in conns.drain() {
        close_link(s);
    }
    for (_, s) in pending.drain() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    // The acceptor closes the greetings still under way; a greeting that became whole after the
    // loop ended reaches the channel, and its reader ends once its socket is shut here.
    let mut readers = acceptor.join().unwrap_or_default();
    let readers_by = Instant::now() + GREETING_WAIT;
    loop {
        while let Ok(m) = rx.try_recv() {
            if let Inbox::Greeted { stream, .. } = m {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        readers.retain(|h| !h.is_finished());
        if readers.is_empty() || remaining(readers_by).is_none() {
            break;
        }
        if let Ok(Inbox::Greeted { stream, .. }) = rx.recv_timeout(Duration::from_millis(50)) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
    // Our own node's runs end within their experiment's timeout.
    for h in workers {
        let _ = h.join();
    }
    result?;
    doc.start.nodes = doc_nodes(&machine, o.nodes);
    doc.end.findings = findings(&doc.rows, &doc.start.nodes, &o.thresholds);
    doc.end.complete = doc.rows.len() as u32 == doc.start.scheduled;
    writer.document(&doc, true).map_err(FleetError::report)?;
    let files = writer.files.clone();
    Ok(FleetOutcome { doc, files })
}

/// What a follower did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowOutcome {
    /// Pair-run sides it carried out.
    pub sides: u32,
}

enum FollowerInbox {
    Leader(Result<FleetMsg, LinkError>),
    Own(FleetMsg),
}

/// Why one attempt to join the leader did not get in.
enum JoinFailed {
    /// Worth another try within the join deadline: the leader's port was full, or the
    /// connection ended (or stayed silent) before the leader's welcome.
    ForNow(String),
    /// Another try would end the same (another token, protocol or fleet size; a refusal).
    ForGood(FleetError),
}

/// One attempt to join the leader at `leader` (connecting until `deadline`): the link once the
/// greeting is done both ways.
fn join_once(
    o: &FleetOptions,
    leader: &str,
    addrs: &[IpAddr],
    deadline: Instant,
) -> Result<(TcpStream, BufReader<TcpStream>), JoinFailed> {
    let stream = tcpx_link::connect_until(leader, deadline).map_err(|e| {
        JoinFailed::ForGood(FleetError::Failed(
            e.to_string()
                .replace("`tcpx-run plans/<plan>.rhai`", "`tcpx-run fleet` (rank 0)"),
        ))
    })?;
    let good = JoinFailed::ForGood;
    let peer: SocketAddr = stream.peer_addr().map_err(|e| good(e.into()))?;
    auth::require_token(
        o.token.as_ref(),
        peer.ip(),
        "a fleet node reaching its leader",
    )
    .map_err(|e| good(FleetError::Refused(e)))?;
    stream.set_nodelay(true).map_err(|e| good(e.into()))?;
    let mut writer = stream.try_clone().map_err(|e| good(e.into()))?;
    let mut reader = BufReader::new(stream);
    let nonce = auth::nonce().map_err(|e| {
        good(FleetError::step(
            "reading /dev/urandom for the greeting's nonce",
            e,
        ))
    })?;
    let hello = FleetMsg::Hello {
        protocol: FLEET_PROTOCOL,
        version: o.version.clone(),
        rank: o.rank,
        nodes: o.nodes,
        host: o.host.clone(),
        nics: o.nics.clone(),
        addrs: addrs.to_vec(),
        nonce: nonce.clone(),
    };
    match write_msg(&mut writer, &hello) {
        Ok(()) => {}
        Err(e @ (LinkError::Closed | LinkError::Timeout)) => {
            return Err(JoinFailed::ForNow(format!(
                "greeting the leader at {leader}: {e}"
            )))
        }
        Err(e) => {
            return Err(good(FleetError::Failed(format!(
                "greeting the leader at {leader}: {e}"
            ))))
        }
    }
    let welcome = match read_msg(&mut reader, Some(GREETING_WAIT)) {
        Ok(m) => m,
        Err(e @ (LinkError::Closed | LinkError::Timeout)) => {
            return Err(JoinFailed::ForNow(format!(
                "waiting for the leader's welcome at {leader}: {e}"
            )))
        }
        Err(e) => {
            return Err(good(FleetError::Failed(format!(
                "waiting for the leader's welcome at {leader}: {e}"
            ))))
        }
    };
    let (leader_nonce, proof, run) = match welcome {
        FleetMsg::Welcome {
            nonce, proof, run, ..
        } => (nonce, proof, run),
        FleetMsg::Refused { reason, retry } => {
            let why = format!("the leader refused this node: {}", shown(&reason, 1024));
            return Err(if retry {
                JoinFailed::ForNow(why)
            } else {
                good(FleetError::Refused(why))
            });
        }
        other => {
            return Err(good(FleetError::Failed(format!(
                "expected the leader's welcome, got {}",
                other.kind()
            ))))
        }
    };
    if run.len() > auth::MAX_RUN_LEN
        || !auth::verify(
            o.token.as_ref(),
            auth::Role::Leader,
            &nonce,
            &leader_nonce,
            &run,
            &proof,
        )
    {
        return Err(good(FleetError::Refused(format!(
            "the leader at {leader} did not prove the run token: give every node the same {} (or --token-file)",
            auth::TOKEN_ENV
        ))));
    }
    let mine = auth::prove(
        o.token.as_ref(),
        auth::Role::Follower,
        &nonce,
        &leader_nonce,
        &run,
    );
    write_msg(&mut writer, &FleetMsg::Auth { proof: mine }).map_err(|e| {
        good(FleetError::Failed(format!(
            "proving the run token to the leader: {e}"
        )))
    })?;
    Ok((writer, reader))
}

/// Follows the leader at `leader` (`HOST:PORT`) until it says `Bye`. A join the leader refused
/// for now (its port full of strangers) or that was dropped before the leader's welcome is
/// tried again, with growing pauses, until the join deadline.
pub fn follow(
    o: &FleetOptions,
    leader: &str,
    say: &mut dyn FnMut(&str),
) -> Result<FollowOutcome, FleetError> {
    let addrs = resolve_nics(&o.nics)?;
    let deadline = Instant::now() + o.join_wait;
    let mut pauses = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(5));
    let (mut writer, mut reader) = loop {
        match join_once(o, leader, &addrs, deadline) {
            Ok(link) => break link,
            Err(JoinFailed::ForGood(e)) => return Err(e),
            Err(JoinFailed::ForNow(why)) => {
                if !pauses.wait(deadline) || remaining(deadline).is_none() {
                    return Err(FleetError::Failed(format!(
                        "could not join the leader at {leader} within the join deadline ({} s): {why}",
                        o.join_wait.as_secs()
                    )));
                }
                say(&format!("{why}; trying again"));
            }
        }
    };
    say(&format!("rank {} joined the leader at {leader}", o.rank));

    let ctx = Arc::new(NodeCtx {
        backends: o.backends.clone(),
        addrs,
    });
    let (tx, rx) = mpsc::channel::<FollowerInbox>();
    let reader_thread = {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("fleet-leader-link".into())
            .spawn(move || loop {
                let m = read_msg(&mut reader, None);
                let end = m.is_err() || matches!(m, Ok(FleetMsg::Bye | FleetMsg::Refused { .. }));
                if tx.send(FollowerInbox::Leader(m)).is_err() || end {
                    return;
                }
            })?
    };
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut sides = 0u32;
    let result: Result<(), FleetError> = loop {
        match rx.recv_timeout(o.idle_limit()) {
            Ok(FollowerInbox::Leader(Ok(FleetMsg::Bye))) => break Ok(()),
            Ok(FollowerInbox::Leader(Ok(FleetMsg::Refused { reason, .. }))) => {
                break Err(FleetError::Refused(format!(
                    "the leader refused this node: {}",
                    shown(&reason, 1024)
                )))
            }
            Ok(FollowerInbox::Leader(Ok(
                msg @ (FleetMsg::Serve { .. } | FleetMsg::Send { .. }),
            ))) => {
                sides += 1;
                let tx = tx.clone();
                if let Some(h) = node::execute(&ctx, msg, move |m| {
                    let _ = tx.send(FollowerInbox::Own(m));
                }) {
                    workers.push(h);
                }
            }
            Ok(FollowerInbox::Leader(Ok(other))) => {
                eprintln!("tcpx-run fleet: ignored a {} from the leader", other.kind());
            }
            Ok(FollowerInbox::Leader(Err(e))) => {
                break Err(FleetError::Failed(format!(
                    "lost the leader at {leader}: {e} (did rank 0 stop? its output says why)"
                )))
            }
            Ok(FollowerInbox::Own(m)) => {
                if let Err(e) = write_msg(&mut writer, &m) {
                    break Err(FleetError::Failed(format!(
                        "reporting to the leader at {leader}: {e}"
                    )));
                }
            }
            Err(_) => {
                break Err(FleetError::Failed(format!(
                    "no word from the leader at {leader} for {} s: it hangs or its network does",
                    o.idle_limit().as_secs()
                )))
            }
        }
        workers.retain(|h| !h.is_finished());
    };
    close_link(writer);
    for h in workers {
        let _ = h.join();
    }
    let _ = reader_thread.join();
    result.map(|()| FollowOutcome { sides })
}
