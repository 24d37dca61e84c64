//! The control protocol of one experiment as sans-IO state machines, the way
//! `tcpx-orchestrate`'s link protocol is written: [`Server`] (the receiver) and [`Client`] (the
//! sender) are `handle(event, now) -> actions` plus `poll_timeout()`, and know nothing of
//! sockets, threads or clocks. The drivers (`run_server`, `run_client`) carry out the actions
//! (send a message, or do one local step: open the backend, pin, listen, move the bytes of one
//! iteration, ...) and feed back what happened: the step's result, a message read from the
//! control connection, the connection's end, or the passing of `poll_timeout`.
//!
//! The exchange (the wire format of [`PROTOCOL`] 1, unchanged): the client says
//! `Hello{protocol, version, experiment}`; the server answers `Welcome`, or `Refuse` naming both
//! values when they differ. Per flow the server listens and sends the channels' `Handles`, the
//! client connects. Per message size and iteration the server posts its receives and says
//! `Ready`, then both move the bytes (the start barrier; under `barrier: size` the timed
//! iterations follow one `Ready` as one transfer, back to back); after the last iteration of a size the
//! server sends its `Result`, the client answers with its own (the end barrier and timing swap),
//! and both hold the same [`Measurement`]. The server ends with `Bye`. A side that fails after
//! the handshake tells its peer `Abort{reason}`; a side that cannot run at all still meets its
//! peer for up to [`TELL_PEER_WAIT`] to refuse its hello (server) or abort after the welcome
//! (client), so the other operator reads the cause rather than a timeout.
//!
//! Invariants: every wait for a message has a deadline (`poll_timeout` is `Some` whenever no
//! step is asked for and the machine is not over); at most one step is asked for at a time, as
//! the last action of a batch; a failure names the experiment, the peer and the stage (size,
//! iteration); a machine that is over stays over (only a failed last `Bye` still turns its
//! success into an error).

use std::fmt::Display;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{format_size, Differences, Experiment, Measurement, Side, SideResult, PROTOCOL};

/// How long a side that cannot run waits for its peer, to tell it why (so that the other
/// machine's operator reads the cause, not a timeout).
pub const TELL_PEER_WAIT: Duration = Duration::from_secs(5);

/// Why an experiment did not produce results. The message names the peer, the experiment and
/// where it stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BenchError {
    /// The experiment's values are unusable; nothing was started.
    #[error("invalid experiment: {0}")]
    Invalid(String),
    /// The two sides were started with different settings.
    #[error("{0}")]
    Mismatch(String),
    /// Something failed while setting up or running.
    #[error("{0}")]
    Failed(String),
    /// The peer closed the control connection or asked to stop: the echo of a failure on the
    /// other side rather than a cause here.
    #[error("{0}")]
    PeerGone(String),
}

/// A control message, as it travels (JSON, tagged by `msg`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    Hello {
        protocol: u32,
        version: String,
        experiment: Box<Experiment>,
    },
    Welcome,
    Refuse {
        reason: String,
    },
    /// Listener handles of one flow, one per channel (receiver -> sender).
    Handles {
        flow: u32,
        handles: Vec<Vec<u8>>,
    },
    /// The receiver has posted iteration `iter` of size `size_index` and starts its clock.
    Ready {
        size_index: u32,
        iter: u32,
    },
    /// A side's timings for one size (end barrier).
    Result {
        size_index: u32,
        result: Box<SideResult>,
    },
    /// The sender of this message failed; the text says why.
    Abort {
        reason: String,
    },
    Bye,
}

impl Msg {
    /// The message's name, for logs (never its content, which a stranger may have chosen).
    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "hello",
            Msg::Welcome => "welcome",
            Msg::Refuse { .. } => "refuse",
            Msg::Handles { .. } => "handles",
            Msg::Ready { .. } => "ready",
            Msg::Result { .. } => "result",
            Msg::Abort { .. } => "abort",
            Msg::Bye => "bye",
        }
    }
}

/// This build's version, which both sides must share.
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The hello a client of this build says for `exp`.
pub fn hello(exp: &Experiment) -> Msg {
    Msg::Hello {
        protocol: PROTOCOL,
        version: version(),
        experiment: Box::new(exp.clone()),
    }
}

/// What a machine hears from its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// [`Action::Prepare`] ended: `Err` says why this side cannot run the experiment.
    Prepared(Result<(), String>),
    /// The control connection is up, with `peer` (server: a client's first message follows).
    Connected { peer: String },
    /// A message arrived on the control connection.
    Received(Msg),
    /// The peer closed the control connection (end of stream, reset, broken pipe).
    Closed,
    /// Reading the control connection failed otherwise (the text says how).
    ControlFailed(String),
    /// `poll_timeout` passed (the driver may send it early; it is ignored then).
    Timeout,
    /// The step asked for is done.
    Done,
    /// [`Action::Listen`] is done: the handles of the flow's listeners, one per channel.
    Listening { handles: Vec<Vec<u8>> },
    /// [`Action::Summarise`] is done: this side's result for the size.
    Summarised(Box<SideResult>),
    /// The step asked for, or sending a message, failed; the text says why.
    Failed(String),
}

/// What a machine asks its driver to do. Every action but `Send` and `Measured` is a local step
/// that the driver reports back with the event its doc names (or [`Event::Failed`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this message on the control connection.
    Send(Msg),
    /// Open the backend and check the experiment against it: [`Event::Prepared`].
    Prepare,
    /// Server: wait for a client's connection and its first message until `deadline`:
    /// [`Event::Connected`] then [`Event::Received`], or [`Event::Timeout`].
    AcceptClient { deadline: Instant },
    /// Client: connect to the server, retrying until `deadline`: [`Event::Connected`].
    Connect { deadline: Instant },
    /// Pin this side's threads: [`Event::Done`].
    Pin,
    /// Choose the NICs of every channel: [`Event::Done`].
    PlanNics,
    /// Server: open the listeners of local flow `flow`: [`Event::Listening`].
    Listen { flow: u32 },
    /// Server: accept the data connections of local flow `flow` by `deadline`: [`Event::Done`],
    /// or what the control connection brings meanwhile ([`Event::Received`], [`Event::Closed`]:
    /// a client that aborts or exits after the welcome), which ends the wait.
    AcceptData { flow: u32, deadline: Instant },
    /// Client: connect the channels of local flow `flow` to these handles by `deadline`:
    /// [`Event::Done`].
    ConnectData {
        flow: u32,
        handles: Vec<Vec<u8>>,
        deadline: Instant,
    },
    /// Allocate and register the buffers of size `size_index`: [`Event::Done`].
    OpenSize { size_index: u32 },
    /// Get iteration `iter` ready (start the samplers at the first timed one; fill or poison the
    /// buffers when verifying): [`Event::Done`].
    StartIteration { size_index: u32, iter: u32 },
    /// Move the bytes of iterations `iter..iter + laps` back to back as one transfer (`laps` is
    /// 1 but for the timed iterations under [`tcpx_model::Barrier::Size`]), each wait at most
    /// `stall`: [`Event::Done`].
    Transfer {
        size_index: u32,
        iter: u32,
        laps: u32,
        stall: Duration,
    },
    /// Deregister the buffers of size `size_index`: [`Event::Done`].
    CloseSize { size_index: u32 },
    /// Stop the samplers and sum up this side's result for the size: [`Event::Summarised`].
    Summarise { size_index: u32 },
    /// Both sides agreed on this result (for progress and the outcome).
    Measured(Box<Measurement>),
}

/// What a driver needs of either machine.
pub trait Machine {
    /// Feeds one event in, at `now`; returns what to do, in order.
    fn handle(&mut self, event: Event, now: Instant) -> Vec<Action>;
    /// When the driver must send [`Event::Timeout`]; `None` while no message is awaited.
    fn poll_timeout(&self) -> Option<Instant>;
    /// How the experiment ended on this side, once the machine is over.
    fn outcome(&self) -> Option<&Result<(), BenchError>>;
    /// The peer's control address (a placeholder until the server has a client).
    fn peer(&self) -> &str;
}

impl Machine for Server {
    fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        Server::handle(self, event, now)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.c.deadline
    }
    fn outcome(&self) -> Option<&Result<(), BenchError>> {
        self.c.outcome.as_ref()
    }
    fn peer(&self) -> &str {
        &self.c.peer
    }
}

impl Machine for Client {
    fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        Client::handle(self, event, now)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.c.deadline
    }
    fn outcome(&self) -> Option<&Result<(), BenchError>> {
        self.c.outcome.as_ref()
    }
    fn peer(&self) -> &str {
        &self.c.peer
    }
}

/// What both machines share: the experiment, the peer, the deadline and the end.
#[derive(Debug)]
struct Common {
    exp: Experiment,
    peer: String,
    deadline: Option<Instant>,
    /// Set once the machine is over.
    outcome: Option<Result<(), BenchError>>,
}

/// Where a machine is, in the words both sides' errors use.
enum Stage {
    /// Before the peer has greeted: what this side is waiting for.
    BeforeHandshake(&'static str),
    Handshake,
    Pinning,
    ChoosingNics,
    DataChannels,
    Size(u32),
    Iteration(u32, u32),
    EndOfSize(u32),
    End,
}

impl Common {
    fn stage_text(&self, stage: Stage) -> String {
        match stage {
            Stage::BeforeHandshake(waiting) => waiting.into(),
            Stage::Handshake => "during the handshake".into(),
            Stage::Pinning => "while pinning threads".into(),
            Stage::ChoosingNics => "while choosing NICs".into(),
            Stage::DataChannels => "while connecting the data channels".into(),
            Stage::Size(si) => format!("at size {}", self.size(si)),
            Stage::Iteration(si, iter) => format!("at size {}, iteration {iter}", self.size(si)),
            Stage::EndOfSize(si) => format!("at the end of size {}", self.size(si)),
            Stage::End => "at the end".into(),
        }
    }

    fn fail(&self, stage: &str, what: impl Display) -> BenchError {
        BenchError::Failed(format!(
            "experiment '{}' with peer {} failed {stage}: {what}",
            self.exp.name, self.peer
        ))
    }

    fn size(&self, si: u32) -> String {
        self.exp
            .sizes
            .get(si as usize)
            .map_or_else(|| format!("#{si}"), |&s| format_size(s))
    }

    fn iterations(&self) -> u32 {
        self.exp.warmup + self.exp.iters
    }

    /// Iterations the transfer starting at `iter` carries: under a per-size barrier the timed
    /// ones all at once, else one.
    fn laps(&self, iter: u32) -> u32 {
        match self.exp.barrier {
            tcpx_model::Barrier::Size if iter == self.exp.warmup => self.exp.iters.max(1),
            _ => 1,
        }
    }

    fn sizes(&self) -> u32 {
        self.exp.sizes.len() as u32
    }

    fn stall(&self) -> Duration {
        self.exp.timeout()
    }

    fn wait_from(&mut self, now: Instant) {
        self.deadline = Some(now + self.stall());
    }

    /// How waiting for a message ended, when it ended without one (`None`: the event is not
    /// about the control connection).
    fn lost(&self, stage: &str, event: &Event) -> Option<BenchError> {
        let peer = &self.peer;
        Some(match event {
            Event::Closed => BenchError::PeerGone(
                self.fail(
                    stage,
                    format_args!(
                        "peer {peer} closed the control connection (did it exit or crash?)"
                    ),
                )
                .to_string(),
            ),
            Event::Received(Msg::Abort { reason }) => BenchError::PeerGone(
                self.fail(
                    stage,
                    format_args!("the peer stopped: {}", crate::shown(reason, 400)),
                )
                    .to_string(),
            ),
            Event::Timeout => self.fail(
                stage,
                format_args!(
                    "peer {peer} sent nothing for {} s (is it stuck? raise --timeout for slow runs)",
                    self.exp.timeout_s
                ),
            ),
            Event::ControlFailed(e) => {
                self.fail(stage, format_args!("control connection with {peer}: {e}"))
            }
            Event::Failed(e) => self.fail(stage, e),
            _ => return None,
        })
    }

    /// [`Common::lost`], or else an event the `side`'s machine has no use for in `state`.
    fn lost_or_stray(
        &self,
        side: &str,
        stage: &str,
        event: &Event,
        state: &dyn std::fmt::Debug,
    ) -> BenchError {
        self.lost(stage, event).unwrap_or_else(|| {
            self.fail(
                stage,
                format_args!("internal: the {side} got {event:?} in state {state:?}"),
            )
        })
    }

    /// The failure for a peer's result of size `si` that no real run can have
    /// ([`SideResult::check`]), naming the peer; `None` for a possible one.
    fn impossible(&self, stage: &str, si: u32, theirs: &SideResult) -> Option<BenchError> {
        let size = self.exp.sizes.get(si as usize).copied().unwrap_or(0);
        let bytes = size.saturating_mul(u64::from(self.exp.local_flows()));
        let e = theirs.check(bytes, self.exp.iters).err()?;
        Some(self.fail(
            stage,
            format_args!(
                "peer {} sent impossible figures: {}",
                self.peer,
                crate::shown(&e, 300)
            ),
        ))
    }

    fn unexpected(&self, stage: &str, got: &Msg, wanted: &str) -> BenchError {
        self.fail(
            stage,
            format_args!("protocol error: expected {wanted}, got {got:?}"),
        )
    }

    /// Ends the machine; after the handshake a failure is told to the peer (best effort).
    fn end(&mut self, r: Result<(), BenchError>, tell_peer: bool) -> Vec<Action> {
        self.deadline = None;
        let out = match &r {
            Err(e) if tell_peer => vec![Action::Send(Msg::Abort {
                reason: e.to_string(),
            })],
            _ => vec![],
        };
        self.outcome = Some(r);
        out
    }

    /// Ends a side that cannot run the experiment once the peer has greeted it: tells the peer
    /// why (`as_msg`: the server's refusal, the client's abort), naming this `side`.
    fn end_cannot_run(
        &mut self,
        side: &str,
        why: BenchError,
        as_msg: impl FnOnce(String) -> Msg,
    ) -> Vec<Action> {
        let reason = format!(
            "the {side} cannot run experiment '{}': {why}",
            self.exp.name
        );
        let mut out = vec![Action::Send(as_msg(reason))];
        out.extend(self.end(Err(why), false));
        out
    }

    fn measurement(&self, si: u32, send: &SideResult, recv: &SideResult) -> Action {
        let size = self.exp.sizes.get(si as usize).copied().unwrap_or(0);
        let bytes = size * u64::from(self.exp.local_flows());
        Action::Measured(Box::new(Measurement {
            experiment: self.exp.clone(),
            size,
            chunk: self.exp.chunk_for(size),
            send: send.summarise(bytes),
            recv: recv.summarise(bytes),
        }))
    }
}

/// The server's states, in the order they come.
#[derive(Debug, Clone, PartialEq)]
enum SState {
    Preparing,
    /// This side cannot run: refuse the hello of a client that comes within the wait.
    CannotRun {
        why: BenchError,
    },
    AwaitClient,
    AwaitHello,
    Pinning,
    PlanningNics,
    Listening {
        k: u32,
    },
    AcceptingData {
        k: u32,
    },
    OpeningSize {
        si: u32,
    },
    StartingIteration {
        si: u32,
        iter: u32,
    },
    Transferring {
        si: u32,
        iter: u32,
    },
    ClosingSize {
        si: u32,
    },
    Summarising {
        si: u32,
    },
    AwaitResult {
        si: u32,
        mine: Box<SideResult>,
    },
    /// `Bye` is on its way: over, unless sending it fails.
    SentBye,
    Over,
}

/// The receiving side of the control protocol.
#[derive(Debug)]
pub struct Server {
    c: Common,
    state: SState,
    /// Where it listens, for the error when no client comes.
    listening_on: String,
}

impl Server {
    /// A server for `exp` that listens at `listening_on`; its first action opens the backend.
    pub fn new(exp: Experiment, listening_on: &str) -> (Server, Vec<Action>) {
        let s = Server {
            c: Common {
                exp,
                peer: "(not connected yet)".into(),
                deadline: None,
                outcome: None,
            },
            state: SState::Preparing,
            listening_on: listening_on.into(),
        };
        (s, vec![Action::Prepare])
    }

    fn stage(&self) -> String {
        use SState::*;
        self.c.stage_text(match &self.state {
            Preparing | CannotRun { .. } | AwaitClient => {
                Stage::BeforeHandshake("while waiting for the client")
            }
            AwaitHello => Stage::Handshake,
            Pinning => Stage::Pinning,
            PlanningNics => Stage::ChoosingNics,
            Listening { .. } | AcceptingData { .. } => Stage::DataChannels,
            OpeningSize { si } => Stage::Size(*si),
            StartingIteration { si, iter } | Transferring { si, iter } => {
                Stage::Iteration(*si, *iter)
            }
            ClosingSize { si } | Summarising { si } | AwaitResult { si, .. } => {
                Stage::EndOfSize(*si)
            }
            SentBye | Over => Stage::End,
        })
    }

    /// Fails the experiment at the current stage; after the handshake the client is told.
    fn fail(&mut self, e: BenchError) -> Vec<Action> {
        let body = !matches!(
            self.state,
            SState::Preparing | SState::CannotRun { .. } | SState::AwaitClient | SState::AwaitHello
        );
        self.state = SState::Over;
        self.c.end(Err(e), body)
    }

    fn open_size(&mut self, si: u32) -> Vec<Action> {
        if si >= self.c.sizes() {
            self.state = SState::SentBye;
            self.c.deadline = None;
            self.c.outcome = Some(Ok(()));
            return vec![Action::Send(Msg::Bye)];
        }
        self.state = SState::OpeningSize { si };
        vec![Action::OpenSize { size_index: si }]
    }

    fn start_iteration(&mut self, si: u32, iter: u32) -> Vec<Action> {
        if iter >= self.c.iterations() {
            self.state = SState::ClosingSize { si };
            return vec![Action::CloseSize { size_index: si }];
        }
        self.state = SState::StartingIteration { si, iter };
        vec![Action::StartIteration {
            size_index: si,
            iter,
        }]
    }

    fn listen(&mut self, k: u32) -> Vec<Action> {
        if k >= self.c.exp.local_flows() {
            return self.open_size(0);
        }
        self.state = SState::Listening { k };
        vec![Action::Listen { flow: k }]
    }

    /// Feeds one event in, at `now`; returns what to do, in order.
    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use SState::*;
        if matches!(event, Event::Timeout) && self.c.deadline.is_none_or(|d| now < d) {
            return vec![];
        }
        match (&self.state, event) {
            (Over, _) => vec![],
            // The last message did not go out: the client would not see the end.
            (SentBye, Event::Failed(e)) => {
                let e = self.c.fail("at the end", e);
                self.state = Over;
                self.c.end(Err(e), true)
            }
            (SentBye, _) => vec![],
            (Preparing, Event::Prepared(Ok(()))) => {
                self.state = AwaitClient;
                let deadline = now + self.c.stall();
                self.c.deadline = Some(deadline);
                vec![Action::AcceptClient { deadline }]
            }
            (Preparing, Event::Prepared(Err(why))) => {
                let deadline = now + TELL_PEER_WAIT.min(self.c.stall());
                self.state = CannotRun {
                    why: BenchError::Invalid(why),
                };
                self.c.deadline = Some(deadline);
                vec![Action::AcceptClient { deadline }]
            }
            (CannotRun { why }, event) => {
                let why = why.clone();
                match event {
                    Event::Connected { peer } => {
                        self.c.peer = peer;
                        vec![]
                    }
                    Event::Received(Msg::Hello { .. }) => {
                        self.state = Over;
                        self.c
                            .end_cannot_run("server", why, |reason| Msg::Refuse { reason })
                    }
                    _ => {
                        self.state = Over;
                        self.c.end(Err(why), false)
                    }
                }
            }
            (AwaitClient, Event::Connected { peer }) => {
                self.c.peer = peer;
                self.state = AwaitHello;
                self.c.wait_from(now);
                vec![]
            }
            (AwaitClient, Event::Timeout) => {
                let e = self.c.fail(
                    &self.stage(),
                    format_args!(
                        "no client connected to {} in time (start the client with --peer pointing here, or raise --timeout)",
                        self.listening_on
                    ),
                );
                self.fail(e)
            }
            (AwaitClient, Event::Failed(e)) => {
                let e = self
                    .c
                    .fail(&self.stage(), format_args!("accepting the client: {e}"));
                self.fail(e)
            }
            (
                AwaitHello,
                Event::Received(Msg::Hello {
                    protocol,
                    version: v,
                    experiment,
                }),
            ) => {
                if protocol != PROTOCOL || v != version() {
                    let reason = format!(
                        "version mismatch: this side (server) protocol {PROTOCOL} tcpx-run {}, client protocol {protocol} tcpx-run {}",
                        version(),
                        crate::shown(&v, 40)
                    );
                    return self.refuse(reason);
                }
                let diffs = self.c.exp.differences(&experiment);
                if !diffs.is_empty() {
                    let reason = format!(
                        "experiment '{}': server and client were started with different settings (server vs client):\n  {}",
                        self.c.exp.name,
                        diffs.join("\n  ")
                    );
                    return self.refuse(reason);
                }
                self.state = Pinning;
                self.c.deadline = None;
                vec![Action::Send(Msg::Welcome), Action::Pin]
            }
            (AwaitHello, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e = self.c.unexpected(&self.stage(), &m, "hello");
                self.fail(e)
            }
            (Pinning, Event::Done) => {
                self.state = PlanningNics;
                vec![Action::PlanNics]
            }
            (PlanningNics, Event::Done) => self.listen(0),
            (&Listening { k }, Event::Listening { handles }) => {
                self.state = AcceptingData { k };
                let flow = self.c.exp.flow_id(k);
                vec![
                    Action::Send(Msg::Handles { flow, handles }),
                    Action::AcceptData {
                        flow: k,
                        deadline: now + self.c.stall(),
                    },
                ]
            }
            (&AcceptingData { k }, Event::Done) => self.listen(k + 1),
            (&OpeningSize { si }, Event::Done) => self.start_iteration(si, 0),
            (&StartingIteration { si, iter }, Event::Done) => {
                self.state = Transferring { si, iter };
                vec![
                    Action::Send(Msg::Ready {
                        size_index: si,
                        iter,
                    }),
                    Action::Transfer {
                        size_index: si,
                        iter,
                        laps: self.c.laps(iter),
                        stall: self.c.stall(),
                    },
                ]
            }
            (&Transferring { si, iter }, Event::Done) => {
                let next = iter + self.c.laps(iter);
                self.start_iteration(si, next)
            }
            (&ClosingSize { si }, Event::Done) => {
                self.state = Summarising { si };
                vec![Action::Summarise { size_index: si }]
            }
            (&Summarising { si }, Event::Summarised(mine)) => {
                let out = vec![Action::Send(Msg::Result {
                    size_index: si,
                    result: mine.clone(),
                })];
                self.state = AwaitResult { si, mine };
                self.c.wait_from(now);
                out
            }
            (AwaitResult { si, mine }, Event::Received(Msg::Result { size_index, result }))
                if size_index == *si && result.side == Side::Send =>
            {
                let (si, mine) = (*si, mine.clone());
                if let Some(e) = self.c.impossible(&self.stage(), si, &result) {
                    return self.fail(e);
                }
                self.c.deadline = None;
                let mut out = vec![self.c.measurement(si, &result, &mine)];
                out.extend(self.open_size(si + 1));
                out
            }
            (AwaitResult { .. }, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e = self.c.unexpected(&self.stage(), &m, "the client's result");
                self.fail(e)
            }
            (_, event) => {
                let e = self
                    .c
                    .lost_or_stray("server", &self.stage(), &event, &self.state);
                self.fail(e)
            }
        }
    }

    fn refuse(&mut self, reason: String) -> Vec<Action> {
        self.state = SState::Over;
        let mut out = vec![Action::Send(Msg::Refuse {
            reason: reason.clone(),
        })];
        out.extend(self.c.end(Err(BenchError::Mismatch(reason)), false));
        out
    }
}

/// The client's states, in the order they come.
#[derive(Debug, Clone, PartialEq)]
enum CState {
    Preparing,
    /// This side cannot run: say hello and abort after the welcome, if the server answers
    /// within the wait.
    CannotRun {
        why: BenchError,
        wait: Duration,
    },
    Connecting,
    AwaitWelcome,
    Pinning,
    PlanningNics,
    AwaitHandles {
        k: u32,
    },
    ConnectingData {
        k: u32,
    },
    OpeningSize {
        si: u32,
    },
    StartingIteration {
        si: u32,
        iter: u32,
    },
    AwaitReady {
        si: u32,
        iter: u32,
    },
    Transferring {
        si: u32,
        iter: u32,
    },
    ClosingSize {
        si: u32,
    },
    AwaitResult {
        si: u32,
    },
    Summarising {
        si: u32,
        theirs: Box<SideResult>,
    },
    AwaitBye,
    Over,
}

/// The sending side of the control protocol.
#[derive(Debug)]
pub struct Client {
    c: Common,
    state: CState,
}

impl Client {
    /// A client for `exp` that will connect to `peer`; its first action opens the backend.
    pub fn new(exp: Experiment, peer: &str) -> (Client, Vec<Action>) {
        let c = Client {
            c: Common {
                exp,
                peer: peer.into(),
                deadline: None,
                outcome: None,
            },
            state: CState::Preparing,
        };
        (c, vec![Action::Prepare])
    }

    fn stage(&self) -> String {
        use CState::*;
        self.c.stage_text(match &self.state {
            Preparing | CannotRun { .. } | Connecting => Stage::BeforeHandshake("while connecting"),
            AwaitWelcome => Stage::Handshake,
            Pinning => Stage::Pinning,
            PlanningNics => Stage::ChoosingNics,
            AwaitHandles { .. } | ConnectingData { .. } => Stage::DataChannels,
            OpeningSize { si } => Stage::Size(*si),
            StartingIteration { si, iter }
            | AwaitReady { si, iter }
            | Transferring { si, iter } => Stage::Iteration(*si, *iter),
            ClosingSize { si } | AwaitResult { si } | Summarising { si, .. } => {
                Stage::EndOfSize(*si)
            }
            AwaitBye | Over => Stage::End,
        })
    }

    /// Fails the experiment at the current stage; after the handshake the server is told.
    fn fail(&mut self, e: BenchError) -> Vec<Action> {
        let body = !matches!(
            self.state,
            CState::Preparing
                | CState::CannotRun { .. }
                | CState::Connecting
                | CState::AwaitWelcome
        );
        self.state = CState::Over;
        self.c.end(Err(e), body)
    }

    fn open_size(&mut self, si: u32, now: Instant) -> Vec<Action> {
        if si >= self.c.sizes() {
            self.state = CState::AwaitBye;
            self.c.wait_from(now);
            return vec![];
        }
        self.state = CState::OpeningSize { si };
        vec![Action::OpenSize { size_index: si }]
    }

    fn start_iteration(&mut self, si: u32, iter: u32) -> Vec<Action> {
        if iter >= self.c.iterations() {
            self.state = CState::ClosingSize { si };
            return vec![Action::CloseSize { size_index: si }];
        }
        self.state = CState::StartingIteration { si, iter };
        vec![Action::StartIteration {
            size_index: si,
            iter,
        }]
    }

    fn await_handles(&mut self, k: u32, now: Instant) -> Vec<Action> {
        if k >= self.c.exp.local_flows() {
            return self.open_size(0, now);
        }
        self.state = CState::AwaitHandles { k };
        self.c.wait_from(now);
        vec![]
    }

    /// Feeds one event in, at `now`; returns what to do, in order.
    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use CState::*;
        if matches!(event, Event::Timeout) && self.c.deadline.is_none_or(|d| now < d) {
            return vec![];
        }
        match (&self.state, event) {
            (Over, _) => vec![],
            (Preparing, Event::Prepared(Ok(()))) => {
                self.state = Connecting;
                vec![Action::Connect {
                    deadline: now + self.c.stall(),
                }]
            }
            (Preparing, Event::Prepared(Err(why))) => {
                let wait = TELL_PEER_WAIT.min(self.c.stall());
                self.state = CannotRun {
                    why: BenchError::Invalid(why),
                    wait,
                };
                vec![Action::Connect {
                    deadline: now + wait,
                }]
            }
            (CannotRun { why, wait }, event) => {
                let (why, wait) = (why.clone(), *wait);
                match event {
                    Event::Connected { peer } if self.c.deadline.is_none() => {
                        self.c.peer = peer;
                        self.c.deadline = Some(now + wait);
                        vec![Action::Send(hello(&self.c.exp))]
                    }
                    Event::Received(Msg::Welcome) => {
                        self.state = Over;
                        self.c
                            .end_cannot_run("client", why, |reason| Msg::Abort { reason })
                    }
                    _ => {
                        self.state = Over;
                        self.c.end(Err(why), false)
                    }
                }
            }
            (Connecting, Event::Connected { peer }) => {
                self.c.peer = peer;
                self.state = AwaitWelcome;
                self.c.wait_from(now);
                vec![Action::Send(hello(&self.c.exp))]
            }
            (AwaitWelcome, Event::Received(Msg::Welcome)) => {
                self.state = Pinning;
                self.c.deadline = None;
                vec![Action::Pin]
            }
            (AwaitWelcome, Event::Received(Msg::Refuse { reason })) => {
                let e = BenchError::Mismatch(format!(
                    "the server at {} refused: {reason}",
                    self.c.peer
                ));
                self.fail(e)
            }
            (AwaitWelcome, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e = self.c.unexpected(&self.stage(), &m, "welcome");
                self.fail(e)
            }
            (Pinning, Event::Done) => {
                self.state = PlanningNics;
                vec![Action::PlanNics]
            }
            (PlanningNics, Event::Done) => self.await_handles(0, now),
            (&AwaitHandles { k }, Event::Received(Msg::Handles { flow, handles }))
                if flow == self.c.exp.flow_id(k)
                    && handles.len() == self.c.exp.channels as usize =>
            {
                self.state = ConnectingData { k };
                self.c.deadline = None;
                vec![Action::ConnectData {
                    flow: k,
                    handles,
                    deadline: now + self.c.stall(),
                }]
            }
            (&AwaitHandles { k }, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let want = self.c.exp.flow_id(k);
                let e = self
                    .c
                    .unexpected(&self.stage(), &m, &format!("handles of flow {want}"));
                self.fail(e)
            }
            (&ConnectingData { k }, Event::Done) => self.await_handles(k + 1, now),
            (&OpeningSize { si }, Event::Done) => self.start_iteration(si, 0),
            (&StartingIteration { si, iter }, Event::Done) => {
                self.state = AwaitReady { si, iter };
                self.c.wait_from(now);
                vec![]
            }
            (
                &AwaitReady { si, iter },
                Event::Received(Msg::Ready {
                    size_index,
                    iter: i,
                }),
            ) if size_index == si && i == iter => {
                self.state = Transferring { si, iter };
                self.c.deadline = None;
                vec![Action::Transfer {
                    size_index: si,
                    iter,
                    laps: self.c.laps(iter),
                    stall: self.c.stall(),
                }]
            }
            (&AwaitReady { iter, .. }, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e =
                    self.c
                        .unexpected(&self.stage(), &m, &format!("ready for iteration {iter}"));
                self.fail(e)
            }
            (&Transferring { si, iter }, Event::Done) => {
                let next = iter + self.c.laps(iter);
                self.start_iteration(si, next)
            }
            (&ClosingSize { si }, Event::Done) => {
                self.state = AwaitResult { si };
                self.c.wait_from(now);
                vec![]
            }
            (&AwaitResult { si }, Event::Received(Msg::Result { size_index, result }))
                if size_index == si && result.side == Side::Recv =>
            {
                if let Some(e) = self.c.impossible(&self.stage(), si, &result) {
                    return self.fail(e);
                }
                self.state = Summarising { si, theirs: result };
                self.c.deadline = None;
                vec![Action::Summarise { size_index: si }]
            }
            (AwaitResult { .. }, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e = self.c.unexpected(&self.stage(), &m, "the server's result");
                self.fail(e)
            }
            (Summarising { si, theirs }, Event::Summarised(mine)) => {
                let si = *si;
                let m = self.c.measurement(si, &mine, theirs);
                let mut out = vec![
                    Action::Send(Msg::Result {
                        size_index: si,
                        result: mine,
                    }),
                    m,
                ];
                out.extend(self.open_size(si + 1, now));
                out
            }
            (AwaitBye, Event::Received(Msg::Bye)) => {
                self.state = Over;
                self.c.end(Ok(()), false)
            }
            (AwaitBye, Event::Received(m)) if !matches!(m, Msg::Abort { .. }) => {
                let e = self.c.unexpected(&self.stage(), &m, "bye");
                self.fail(e)
            }
            (_, event) => {
                let e = self
                    .c
                    .lost_or_stray("client", &self.stage(), &event, &self.state);
                self.fail(e)
            }
        }
    }
}
