//! The control protocol's two machines against each other, without sockets or threads: a
//! [`Sim`] carries each side's messages to the other in order (or loses one), carries out the
//! local steps (the data connections and transfers meet their peer's, as real ones do), lets a
//! step take virtual time, kills a side after any number of its actions, and moves a virtual
//! clock to the next deadline whenever nothing else can happen. A machine that waits with no
//! deadline leaves the simulation stuck, which fails the test.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use tcpx_bench::proto::{Action, BenchError, Client, Event, Machine, Msg, Server};
use tcpx_bench::{Experiment, Measurement, Side, SideResult};

/// Peer labels the machines put into their messages: text only, no socket is ever opened here.
const SERVER: &str = "10.0.0.1:5201";
const CLIENT: &str = "10.0.0.2:40000";

fn experiment() -> Experiment {
    Experiment {
        name: "e".into(),
        sizes: vec![4096, 1 << 20],
        warmup: 1,
        iters: 2,
        flows: 2,
        channels: 2,
        timeout_s: 30.0,
        ..Experiment::default()
    }
}

fn stall() -> Duration {
    experiment().timeout()
}

/// A step that meets the peer's: the data connections of a flow, or one iteration's transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Meet {
    Data(u32),
    /// Size, first iteration, iterations carried.
    Transfer(u32, u32, u32),
}

/// One side of the simulation.
struct End {
    m: Box<dyn Machine>,
    side: Side,
    /// The step being carried out: when it is done at the earliest, and when it gives up
    /// waiting for its peer.
    step: Option<(Action, Instant, Option<Instant>)>,
    inbox: VecDeque<Msg>,
    /// Steps that meet the peer, once started.
    met: HashSet<Meet>,
    measured: Vec<Measurement>,
    /// Sends and steps carried out.
    actions: usize,
    sent: Vec<Msg>,
    dead: bool,
    told_closed: bool,
}

impl End {
    fn new(m: impl Machine + 'static, side: Side) -> Self {
        End {
            m: Box::new(m),
            side,
            step: None,
            inbox: VecDeque::new(),
            met: HashSet::new(),
            measured: vec![],
            actions: 0,
            sent: vec![],
            dead: false,
            told_closed: false,
        }
    }

    fn over(&self) -> bool {
        self.dead || self.m.outcome().is_some()
    }

    fn error(&self) -> String {
        match self.m.outcome() {
            Some(Err(e)) => e.to_string(),
            other => panic!("{:?} should have failed, ended {other:?}", self.side),
        }
    }
}

type Lose = Box<dyn FnMut(Side, &mut Msg) -> bool>;
type Slow = Box<dyn FnMut(Side, &Action) -> Duration>;

struct Sim {
    now: Instant,
    server: End,
    client: End,
    /// Messages that never arrive (true), or arrive changed.
    lose: Lose,
    /// How long a local step takes.
    slow: Slow,
    /// The side that dies after carrying out this many actions.
    kill: Option<(Side, usize)>,
    /// What happened, for the message of a failed test.
    trace: Vec<String>,
}

fn meet(a: &Action) -> Option<Meet> {
    match a {
        Action::AcceptData { flow, .. } | Action::ConnectData { flow, .. } => {
            Some(Meet::Data(*flow))
        }
        Action::Transfer {
            size_index,
            iter,
            laps,
            ..
        } => Some(Meet::Transfer(*size_index, *iter, *laps)),
        _ => None,
    }
}

fn give_up(a: &Action, now: Instant) -> Option<Instant> {
    match a {
        Action::AcceptData { deadline, .. } | Action::ConnectData { deadline, .. } => {
            Some(*deadline)
        }
        Action::Transfer { stall, .. } => Some(now + *stall),
        _ => None,
    }
}

fn result(side: Side, si: u32) -> SideResult {
    SideResult {
        wrong_bytes: (side == Side::Recv).then_some(0),
        flow_iter_secs: vec![vec![0.001; 2]; 2],
        ..SideResult::of_times(side, vec![0.001 * f64::from(si + 1); 2])
    }
}

impl Sim {
    fn new(server_exp: Experiment, client_exp: Experiment) -> Sim {
        let now = Instant::now();
        let (s, sa) = Server::new(server_exp, SERVER);
        let (c, ca) = Client::new(client_exp, SERVER);
        let mut sim = Sim {
            now,
            server: End::new(s, Side::Recv),
            client: End::new(c, Side::Send),
            lose: Box::new(|_, _| false),
            slow: Box::new(|_, _| Duration::ZERO),
            kill: None,
            trace: vec![],
        };
        sim.act(Side::Recv, sa);
        sim.act(Side::Send, ca);
        sim
    }

    fn pair() -> Sim {
        Sim::new(experiment(), experiment())
    }

    fn end(&self, side: Side) -> &End {
        match side {
            Side::Recv => &self.server,
            Side::Send => &self.client,
        }
    }

    fn end_mut(&mut self, side: Side) -> &mut End {
        match side {
            Side::Recv => &mut self.server,
            Side::Send => &mut self.client,
        }
    }

    /// `side`'s end and its peer's.
    fn end_and_peer(&mut self, side: Side) -> (&mut End, &mut End) {
        match side {
            Side::Recv => (&mut self.server, &mut self.client),
            Side::Send => (&mut self.client, &mut self.server),
        }
    }

    fn killed(&self, side: Side) -> bool {
        self.end(side).dead
    }

    fn over(&self, side: Side) -> bool {
        self.end(side).over()
    }

    /// Carries out a side's actions: messages go to the peer's inbox (unless lost), a step
    /// becomes pending.
    fn act(&mut self, side: Side, actions: Vec<Action>) {
        for mut a in actions {
            if let Some((victim, after)) = self.kill {
                let done = self.end(side).actions;
                if victim == side && done >= after && !matches!(a, Action::Measured(_)) {
                    self.trace.push(format!("{side:?} dies before {a:?}"));
                    self.end_mut(side).dead = true;
                    return;
                }
            }
            self.trace.push(format!("{side:?} does {a:?}"));
            let lost = match &mut a {
                Action::Send(m) => (self.lose)(side, m),
                _ => false,
            };
            let now = self.now;
            let slow = (self.slow)(side, &a);
            let (me, peer) = self.end_and_peer(side);
            match a {
                Action::Measured(m) => me.measured.push(*m),
                Action::Send(m) => {
                    me.actions += 1;
                    me.sent.push(m.clone());
                    if !lost {
                        peer.inbox.push_back(m);
                    }
                }
                step_action => {
                    me.actions += 1;
                    assert!(me.step.is_none(), "two steps at once: {step_action:?}");
                    if let Some(k) = meet(&step_action) {
                        me.met.insert(k);
                    }
                    let until = give_up(&step_action, now);
                    me.step = Some((step_action, now + slow, until));
                }
            }
        }
    }

    fn tell(&mut self, side: Side, e: Event) {
        self.trace.push(format!("{side:?} hears {e:?}"));
        let now = self.now;
        let actions = self.end_mut(side).m.handle(e, now);
        self.act(side, actions);
    }

    /// What the pending step of `side` yields now, if it can end now (`None`: not yet).
    fn finish_step(&mut self, side: Side) -> Option<Vec<Event>> {
        let peer_over = self.over(other(side));
        let peer_alive = !self.killed(other(side));
        let now = self.now;
        let (me, peer) = self.end_and_peer(side);
        let (action, ready_at, until) = me.step.as_ref()?;
        if *ready_at > now {
            return None;
        }
        let events = match action {
            Action::Prepare => vec![Event::Prepared(Ok(()))],
            Action::AcceptClient { .. } => {
                let first = me.inbox.pop_front()?;
                vec![
                    Event::Connected {
                        peer: CLIENT.into(),
                    },
                    Event::Received(first),
                ]
            }
            Action::Connect { .. } if peer_alive => vec![Event::Connected {
                peer: SERVER.into(),
            }],
            Action::Connect { .. } => vec![Event::Failed("connection refused".into())],
            Action::Listen { flow } => vec![Event::Listening {
                handles: vec![vec![*flow as u8]; 2],
            }],
            Action::Summarise { size_index } => {
                vec![Event::Summarised(Box::new(result(side, *size_index)))]
            }
            // The server's driver watches the control connection while it accepts: a message
            // (a client's abort after the welcome) ends the wait.
            Action::AcceptData { .. } if !me.inbox.is_empty() => me
                .inbox
                .pop_front()
                .map(Event::Received)
                .into_iter()
                .collect(),
            a => match meet(a) {
                Some(k) if peer.met.contains(&k) => vec![Event::Done],
                Some(_) if peer_over => {
                    vec![Event::Failed("the peer closed its data connections".into())]
                }
                Some(_) if until.is_some_and(|u| u <= now) => {
                    vec![Event::Failed(format!(
                        "no progress for {} s",
                        stall().as_secs()
                    ))]
                }
                Some(_) => return None,
                None => vec![Event::Done],
            },
        };
        me.step = None;
        Some(events)
    }

    /// One thing that can happen now for `side`; false when nothing can.
    fn progress(&mut self, side: Side) -> bool {
        if self.killed(side) || self.over(side) {
            return false;
        }
        if let Some(events) = self.finish_step(side) {
            for e in events {
                self.tell(side, e);
            }
            return true;
        }
        let (me, peer) = self.end_and_peer(side);
        if me.step.is_some() {
            return false;
        }
        assert!(
            me.m.poll_timeout().is_some(),
            "{side:?} waits with no step and no deadline"
        );
        if let Some(m) = me.inbox.pop_front() {
            self.tell(side, Event::Received(m));
            return true;
        }
        if peer.dead && !me.told_closed {
            me.told_closed = true;
            self.tell(side, Event::Closed);
            return true;
        }
        false
    }

    /// The next time something is due: a deadline, a slow step's end, a step's giving up.
    fn next_due(&self) -> Option<Instant> {
        let mut due = vec![];
        for end in [&self.server, &self.client] {
            if !end.over() {
                due.extend(end.m.poll_timeout());
                if let Some((_, at, until)) = &end.step {
                    due.push(*at);
                    due.extend(*until);
                }
            }
        }
        due.into_iter().filter(|&t| t > self.now).min()
    }

    /// Runs until both sides are over (or dead); panics when a live side waits for nothing.
    fn run(&mut self) {
        for _ in 0..100_000 {
            if self.over(Side::Recv) && self.over(Side::Send) {
                return;
            }
            if self.progress(Side::Recv) || self.progress(Side::Send) {
                continue;
            }
            // Nothing can happen now: move to the next deadline.
            let Some(t) = self.next_due() else {
                panic!(
                    "stuck: nothing due and a side not over\n{}",
                    self.trace.join("\n")
                );
            };
            self.now = t;
            for side in [Side::Recv, Side::Send] {
                let end = self.end(side);
                let due = !end.over() && end.m.poll_timeout() <= Some(t);
                if due && self.server_side_step_is_accept(side) {
                    // The accept loop gave up: the step ends with the timeout.
                    self.server.step = None;
                }
                if due && self.end(side).step.is_none() {
                    self.tell(side, Event::Timeout);
                }
            }
        }
        panic!("no end after 100000 events\n{}", self.trace.join("\n"));
    }

    fn server_side_step_is_accept(&self, side: Side) -> bool {
        side == Side::Recv && matches!(self.server.step, Some((Action::AcceptClient { .. }, _, _)))
    }

    fn elapsed(&self, since: Instant) -> Duration {
        self.now - since
    }
}

fn other(side: Side) -> Side {
    match side {
        Side::Send => Side::Recv,
        Side::Recv => Side::Send,
    }
}

#[test]
fn a_clean_run_ends_both_sides_with_the_same_measurements() {
    let mut sim = Sim::pair();
    sim.run();
    assert_eq!(sim.server.m.outcome(), Some(&Ok(())));
    assert_eq!(sim.client.m.outcome(), Some(&Ok(())));
    assert_eq!(sim.server.measured.len(), 2);
    assert_eq!(sim.server.measured, sim.client.measured);
    assert_eq!(sim.client.measured[1].size, 1 << 20);
    // The exchange, as it travels: hello, welcome, handles per flow, ready per iteration,
    // results per size, bye.
    let kinds = |sent: &[Msg]| sent.iter().map(Msg::kind).collect::<Vec<_>>().join(" ");
    assert_eq!(kinds(&sim.client.sent), "hello result result");
    assert_eq!(
        kinds(&sim.server.sent),
        "welcome handles handles ready ready ready result ready ready ready result bye"
    );
    // Handles carry the global flow ids; a flow process of a multi-process run has its own.
    assert!(matches!(sim.server.sent[2], Msg::Handles { flow: 1, .. }));
}

/// A per-size barrier: one ready before the warm-up iteration and one before the timed ones,
/// which both sides move as one transfer; the results are swapped as before.
#[test]
fn a_per_size_barrier_moves_the_timed_iterations_as_one_transfer() {
    let exp = Experiment {
        barrier: tcpx_model::Barrier::Size,
        ..experiment()
    };
    let mut sim = Sim::new(exp.clone(), exp);
    sim.run();
    assert_eq!(sim.server.m.outcome(), Some(&Ok(())));
    assert_eq!(sim.client.m.outcome(), Some(&Ok(())));
    assert_eq!(sim.server.measured, sim.client.measured);
    assert_eq!(sim.server.measured.len(), 2);
    let kinds = |sent: &[Msg]| sent.iter().map(Msg::kind).collect::<Vec<_>>().join(" ");
    assert_eq!(
        kinds(&sim.server.sent),
        "welcome handles handles ready ready result ready ready result bye"
    );
    for end in [&sim.server, &sim.client] {
        let mut transfers: Vec<Meet> = end
            .met
            .iter()
            .copied()
            .filter(|m| matches!(m, Meet::Transfer(..)))
            .collect();
        transfers.sort_by_key(|m| match m {
            Meet::Transfer(s, i, _) => (*s, *i),
            Meet::Data(_) => (0, 0),
        });
        assert_eq!(
            transfers,
            [
                Meet::Transfer(0, 0, 1),
                Meet::Transfer(0, 1, 2),
                Meet::Transfer(1, 0, 1),
                Meet::Transfer(1, 1, 2)
            ],
            "{:?}",
            end.side
        );
    }
    // Without warm-up the first transfer carries every iteration.
    let exp = Experiment {
        barrier: tcpx_model::Barrier::Size,
        warmup: 0,
        ..experiment()
    };
    let mut sim = Sim::new(exp.clone(), exp);
    sim.run();
    assert_eq!(sim.client.m.outcome(), Some(&Ok(())));
    assert!(sim.client.met.contains(&Meet::Transfer(0, 0, 2)));
}

/// One side with a per-size barrier and one without: refused at the hello, naming both.
#[test]
fn a_barrier_on_one_side_only_is_refused() {
    let exp = Experiment {
        barrier: tcpx_model::Barrier::Size,
        ..experiment()
    };
    let mut sim = Sim::new(experiment(), exp);
    sim.run();
    let e = sim.client.error();
    assert!(e.contains("barrier: null vs \"size\""), "{e}");
}

#[test]
fn a_flow_process_sends_the_handles_of_its_global_flow() {
    let exp = Experiment {
        flow_index: Some(3),
        flows: 4,
        multi_process: true,
        ..experiment()
    };
    let mut sim = Sim::new(exp.clone(), exp);
    sim.run();
    assert_eq!(sim.client.m.outcome(), Some(&Ok(())));
    let flows: Vec<u32> = sim
        .server
        .sent
        .iter()
        .filter_map(|m| match m {
            Msg::Handles { flow, .. } => Some(*flow),
            _ => None,
        })
        .collect();
    assert_eq!(flows, [3]);
}

/// A lost barrier message: the side waiting for it fails at its deadline, naming the peer and
/// the step, and tells the other side.
#[test]
fn a_lost_ready_fails_at_the_deadline_naming_the_peer_and_the_iteration() {
    let mut sim = Sim::pair();
    sim.lose = Box::new(|side, m| {
        side == Side::Recv
            && matches!(
                m,
                Msg::Ready {
                    size_index: 1,
                    iter: 2
                }
            )
    });
    let t0 = sim.now;
    sim.run();
    let e = sim.client.error();
    assert_eq!(
        e,
        format!("experiment 'e' with peer {SERVER} failed at size 1M, iteration 2: peer {SERVER} sent nothing for 30 s (is it stuck? raise --timeout for slow runs)")
    );
    // The server's transfer gave up, or it heard the client's abort: either way it names the
    // same iteration.
    let s = sim.server.error();
    assert!(
        s.contains(&format!(
            "with peer {CLIENT} failed at size 1M, iteration 2"
        )),
        "{s}"
    );
    assert!(sim
        .client
        .sent
        .iter()
        .any(|m| matches!(m, Msg::Abort { .. })));
    // Nothing waited past one timeout beyond the start of that iteration.
    assert!(
        sim.elapsed(t0) <= stall() + Duration::from_secs(1),
        "{:?}",
        sim.elapsed(t0)
    );
}

#[test]
fn a_lost_result_fails_both_sides_at_the_end_of_that_size() {
    for (loser, size) in [(Side::Recv, 0u32), (Side::Send, 1)] {
        let mut sim = Sim::pair();
        sim.lose = Box::new(move |side, m| {
            side == loser && matches!(m, Msg::Result { size_index, .. } if *size_index == size)
        });
        sim.run();
        let name = ["4K", "1M"][size as usize];
        let (c, s) = (sim.client.error(), sim.server.error());
        assert!(
            c.contains(&format!("peer {SERVER} failed at the end of size {name}"))
                || (loser == Side::Send
                    && c.contains(&format!("peer {SERVER} failed at the end: "))),
            "{c}"
        );
        assert!(
            s.contains(&format!("peer {CLIENT} failed at the end of size {name}: peer {CLIENT} sent nothing for 30 s")),
            "{s}"
        );
    }
}

#[test]
fn lost_handles_fail_the_client_while_connecting_the_data_channels() {
    let mut sim = Sim::pair();
    sim.lose = Box::new(|side, m| side == Side::Recv && matches!(m, Msg::Handles { flow: 1, .. }));
    sim.run();
    let c = sim.client.error();
    assert!(
        c.ends_with(&format!("failed while connecting the data channels: peer {SERVER} sent nothing for 30 s (is it stuck? raise --timeout for slow runs)")),
        "{c}"
    );
    let s = sim.server.error();
    assert!(
        s.contains("failed while connecting the data channels"),
        "{s}"
    );
}

/// A lost hello: the server waits for a client until its timeout and says where it listens.
#[test]
fn a_lost_hello_leaves_the_server_waiting_until_its_timeout() {
    let mut sim = Sim::pair();
    sim.lose = Box::new(|_, m| matches!(m, Msg::Hello { .. }));
    let t0 = sim.now;
    sim.run();
    assert_eq!(
        sim.server.error(),
        format!("experiment 'e' with peer (not connected yet) failed while waiting for the client: no client connected to {SERVER} in time (start the client with --peer pointing here, or raise --timeout)")
    );
    assert!(sim
        .client
        .error()
        .contains("failed during the handshake: peer"));
    assert_eq!(sim.elapsed(t0), stall());
}

/// Either side dies after each of its actions in turn: the survivor always ends, within a
/// timeout of the death, with an error naming the experiment, the peer and its stage (or
/// succeeds when the dead side had sent all it had to).
#[test]
fn a_peer_dying_at_each_step_ends_the_other_side_with_its_stage() {
    let mut clean = Sim::pair();
    clean.run();
    for victim in [Side::Send, Side::Recv] {
        let total = match victim {
            Side::Send => clean.client.actions,
            Side::Recv => clean.server.actions,
        };
        let mut stages = HashSet::new();
        for after in 0..=total {
            let mut sim = Sim::pair();
            sim.kill = Some((victim, after));
            let t0 = sim.now;
            sim.run();
            assert!(
                sim.elapsed(t0) <= stall() * 2,
                "{victim:?} dead after {after}: the survivor took {:?}",
                sim.elapsed(t0)
            );
            let (survivor, sent_all, peer) = match victim {
                Side::Send => (
                    sim.server.m.outcome().cloned(),
                    sim.client.sent.len() == clean.client.sent.len(),
                    CLIENT,
                ),
                Side::Recv => (
                    sim.client.m.outcome().cloned(),
                    sim.server.sent.len() == clean.server.sent.len(),
                    SERVER,
                ),
            };
            match survivor {
                Some(Ok(())) => assert!(
                    sent_all,
                    "{victim:?} dead after {after}: the survivor succeeded\n{}",
                    sim.trace.join("\n")
                ),
                Some(Err(e)) => {
                    assert!(!sent_all, "{victim:?} dead after {after} had sent all: {e}");
                    let text = e.to_string();
                    let stage = text
                        .split(" failed ")
                        .nth(1)
                        .and_then(|r| r.split(':').next())
                        .unwrap_or_else(|| panic!("no stage in {text}"));
                    assert!(text.starts_with("experiment 'e' with peer "), "{text}");
                    if !stage.starts_with("while waiting for the client") {
                        assert!(text.contains(&format!("with peer {peer} failed")), "{text}");
                    }
                    if matches!(e, BenchError::PeerGone(_)) {
                        assert!(text.contains("closed the control connection"), "{text}");
                    }
                    stages.insert(stage.to_string());
                }
                None => panic!("the survivor of {victim:?} dead after {after} did not end"),
            }
        }
        // Every kind of wait was hit by some death.
        let want: &[&str] = match victim {
            Side::Send => &[
                "while waiting for the client",
                "at the end of size 4K",
                "at the end of size 1M",
            ],
            Side::Recv => &[
                "while connecting",
                "during the handshake",
                "while connecting the data channels",
                "at size 4K, iteration 0",
                "at size 1M, iteration 2",
                "at the end of size 1M",
                "at the end",
            ],
        };
        for w in want {
            assert!(
                stages.contains(*w),
                "{victim:?}: no death ended in '{w}': {stages:?}"
            );
        }
    }
}

#[test]
fn mismatched_settings_are_refused_with_both_values() {
    let client = Experiment {
        iters: 7,
        ..experiment()
    };
    let mut sim = Sim::new(experiment(), client);
    sim.run();
    let s = sim.server.m.outcome().cloned().unwrap().unwrap_err();
    let c = sim.client.m.outcome().cloned().unwrap().unwrap_err();
    assert!(matches!(s, BenchError::Mismatch(_)), "{s:?}");
    assert!(matches!(c, BenchError::Mismatch(_)), "{c:?}");
    assert!(s.to_string().contains("iters: 2 vs 7"), "{s}");
    assert_eq!(
        c.to_string(),
        format!("the server at {SERVER} refused: {s}")
    );
    // Nothing after the refusal: no abort, no handles.
    assert_eq!(sim.server.sent.len(), 1);
}

#[test]
fn another_protocol_version_is_refused_naming_both() {
    let now = Instant::now();
    let (mut s, _) = Server::new(experiment(), SERVER);
    let a = s.handle(Event::Prepared(Ok(())), now);
    assert!(matches!(a[..], [Action::AcceptClient { .. }]));
    s.handle(
        Event::Connected {
            peer: CLIENT.into(),
        },
        now,
    );
    let a = s.handle(
        Event::Received(Msg::Hello {
            protocol: 2,
            version: "9.9.9\u{1b}[31m".into(),
            experiment: Box::new(experiment()),
        }),
        now,
    );
    let reason = match &a[..] {
        [Action::Send(Msg::Refuse { reason })] => reason.clone(),
        other => panic!("{other:?}"),
    };
    let mine = tcpx_bench::proto::version();
    assert_eq!(
        reason,
        format!("version mismatch: this side (server) protocol 1 tcpx-run {mine}, client protocol 2 tcpx-run 9.9.9\\u{{1b}}[31m")
    );
    assert_eq!(s.outcome(), Some(&Err(BenchError::Mismatch(reason))));
    assert!(s.poll_timeout().is_none());
}

#[test]
fn a_side_that_cannot_run_tells_its_peer_why() {
    // The server cannot run: it refuses the hello with the reason.
    let mut sim = Sim::pair();
    let (s, _) = Server::new(experiment(), SERVER);
    sim.server = End::new(s, Side::Recv);
    sim.server.step = None;
    let t0 = sim.now;
    sim.tell(Side::Recv, Event::Prepared(Err("no GPU here".into())));
    sim.run();
    assert_eq!(
        sim.server.m.outcome(),
        Some(&Err(BenchError::Invalid("no GPU here".into())))
    );
    assert_eq!(
        sim.client.error(),
        format!("the server at {SERVER} refused: the server cannot run experiment 'e': invalid experiment: no GPU here")
    );
    assert_eq!(sim.elapsed(t0), Duration::ZERO);

    // The client cannot run: it says hello and aborts after the welcome.
    let mut sim = Sim::pair();
    let (c, _) = Client::new(experiment(), SERVER);
    sim.client = End::new(c, Side::Send);
    sim.tell(Side::Send, Event::Prepared(Err("no GPU here".into())));
    sim.run();
    assert_eq!(
        sim.client.m.outcome(),
        Some(&Err(BenchError::Invalid("no GPU here".into())))
    );
    assert!(matches!(
        sim.client.sent.last(),
        Some(Msg::Abort { reason }) if reason == "the client cannot run experiment 'e': invalid experiment: no GPU here"
    ));
    assert_eq!(
        sim.server.error(),
        format!("experiment 'e' with peer {CLIENT} failed while connecting the data channels: the peer stopped: the client cannot run experiment 'e': invalid experiment: no GPU here")
    );

    // Nobody comes: the side that cannot run gives up after the short wait, not the timeout.
    let now = Instant::now();
    let (mut s, _) = Server::new(experiment(), SERVER);
    let a = s.handle(Event::Prepared(Err("no GPU here".into())), now);
    let Some(Action::AcceptClient { deadline }) = a.first().cloned() else {
        panic!("{a:?}")
    };
    assert_eq!(deadline, now + tcpx_bench::proto::TELL_PEER_WAIT);
    assert!(s.handle(Event::Timeout, deadline).is_empty());
    assert_eq!(
        s.outcome(),
        Some(&Err(BenchError::Invalid("no GPU here".into())))
    );
}

/// A slow side within the timeout only delays the run; beyond it, the waiting side fails with
/// the stage and what to raise.
#[test]
fn a_slow_side_succeeds_within_the_timeout_and_fails_clearly_beyond_it() {
    for (slow_side, slow_step, stage) in [
        (
            Side::Recv,
            "start",
            format!("peer {SERVER} failed at size 1M, iteration 1"),
        ),
        (
            Side::Send,
            "summarise",
            format!("peer {CLIENT} failed at the end of size 4K"),
        ),
    ] {
        for (by, ok) in [
            (stall() - Duration::from_secs(1), true),
            (stall() + Duration::from_secs(1), false),
        ] {
            let mut sim = Sim::pair();
            sim.slow = Box::new(move |side, a| {
                let hit = side == slow_side
                    && match a {
                        Action::StartIteration {
                            size_index: 1,
                            iter: 1,
                        } => slow_step == "start",
                        Action::Summarise { size_index: 0 } => slow_step == "summarise",
                        _ => false,
                    };
                if hit {
                    by
                } else {
                    Duration::ZERO
                }
            });
            sim.run();
            let waiting = match slow_side {
                Side::Recv => sim.client.m.outcome().cloned(),
                Side::Send => sim.server.m.outcome().cloned(),
            };
            if ok {
                assert_eq!(waiting, Some(Ok(())), "{slow_step} slow by {by:?}");
                assert_eq!(sim.server.measured, sim.client.measured);
            } else {
                let e = waiting.unwrap().unwrap_err().to_string();
                assert!(e.contains(&stage), "{e}");
                assert!(
                    e.ends_with(
                        "sent nothing for 30 s (is it stuck? raise --timeout for slow runs)"
                    ),
                    "{e}"
                );
            }
        }
    }
}

/// Whatever a peer sends, in any state, a machine answers without panicking, and a wrong
/// message where another is awaited ends it with a protocol error naming what was expected.
#[test]
fn a_wrong_message_is_a_protocol_error_naming_what_was_expected() {
    let mut sim = Sim::pair();
    // The server's first ready claims another iteration.
    sim.lose = Box::new(|side, m| {
        if side == Side::Recv
            && matches!(
                m,
                Msg::Ready {
                    size_index: 0,
                    iter: 0
                }
            )
        {
            *m = Msg::Ready {
                size_index: 0,
                iter: 1,
            };
        }
        false
    });
    sim.run();
    let e = sim.client.error();
    assert!(
        e.contains("failed at size 4K, iteration 0: protocol error: expected ready for iteration 0, got Ready { size_index: 0, iter: 1 }"),
        "{e}"
    );
    // A client told a `Bye` during the handshake.
    let now = Instant::now();
    let (mut c, _) = Client::new(experiment(), SERVER);
    c.handle(Event::Prepared(Ok(())), now);
    c.handle(
        Event::Connected {
            peer: SERVER.into(),
        },
        now,
    );
    let a = c.handle(Event::Received(Msg::Bye), now);
    assert!(a.is_empty(), "no abort before the handshake ends: {a:?}");
    assert!(c
        .outcome()
        .unwrap()
        .as_ref()
        .unwrap_err()
        .to_string()
        .ends_with("failed during the handshake: protocol error: expected welcome, got Bye"));
    // Over is over.
    assert!(c.handle(Event::Received(Msg::Welcome), now).is_empty());
    assert!(c
        .handle(Event::Timeout, now + Duration::from_secs(3600))
        .is_empty());
}

/// Issue 43 item 4: a relay rewriting one side's timings (1e308, -0.5 or 1e-300 s a timed
/// iteration, NaN, a wrong count) fails the other side's run naming the peer, instead of
/// measurements of infinite, negative or impossible rates.
#[test]
fn a_peers_impossible_timings_fail_the_run_naming_the_peer() {
    for (liar, secs) in [
        (Side::Recv, 1e308),
        (Side::Recv, -0.5),
        (Side::Send, 1e-300),
        (Side::Send, f64::NAN),
    ] {
        let mut sim = Sim::pair();
        sim.lose = Box::new(move |side, m| {
            if let Msg::Result { result, .. } = m {
                if side == liar {
                    result.iter_secs[0] = secs;
                }
            }
            false
        });
        sim.run();
        let (peer, victim) = match liar {
            Side::Recv => (SERVER, &sim.client),
            Side::Send => (CLIENT, &sim.server),
        };
        let e = victim.error();
        assert!(
            e.contains(&format!("peer {peer} sent impossible figures: iteration 0")),
            "{secs}: {e}"
        );
        assert!(
            victim.measured.is_empty(),
            "{secs}: measured {:?}",
            victim.measured
        );
    }
    // A result with fewer iteration times than were run.
    let mut sim = Sim::pair();
    sim.lose = Box::new(|side, m| {
        if let (Side::Recv, Msg::Result { result, .. }) = (side, m) {
            result.iter_secs.pop();
        }
        false
    });
    sim.run();
    assert!(
        sim.client
            .error()
            .contains("1 iteration times for 2 timed iterations"),
        "{}",
        sim.client.error()
    );
}
