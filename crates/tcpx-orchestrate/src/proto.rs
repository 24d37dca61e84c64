//! The leader/follower protocol as sans-IO state machines, the quinn-proto way: each side is
//! `handle(event, now) -> actions` plus `poll_timeout()`, and knows nothing of sockets, threads
//! or clocks. The drivers ([`serve`](crate::serve) and [`LeaderRunner`](crate::LeaderRunner))
//! read the [`Link`](crate::Link), feed what arrived (or the passing of `poll_timeout`) in, and
//! carry out the actions. Tests drive both machines against each other with a virtual clock.
//!
//! The exchange: the follower sends `Hello` with a fresh nonce; the leader answers with its
//! own `Hello` (its nonce, the run, and its proof of the run token over both nonces and the run,
//! [`tcpx_link::auth`]); the follower checks the proof and answers `Auth` with its own, which the
//! leader checks. A side whose peer does not prove the token, or speaks another protocol version,
//! sends `Refused` with the reason and ends (both versions named on a mismatch); the leader's
//! driver then drops that connection and keeps waiting for its follower. Then per experiment the leader sends `Prepare`, the follower answers `Ready` (or
//! `Refused`), both run, the follower sends `Done`. In a multi-process experiment either side
//! may end early: the follower's `Done` with an error stops the leader's processes at once, and
//! the leader sends `Abort` when its own processes failed first. An `Abort` that crosses the
//! follower's `Done` arrives while the follower waits for the next experiment and is ignored.
//!
//! Invariants: every wait has a deadline (`poll_timeout` is `Some` whenever a message is
//! awaited); a machine that returned a `Finish`/`Fatal` action stays finished.

use std::time::{Duration, Instant};

use tcpx_bench::Experiment;
use tcpx_model::{NotApplied, Outside};

use tcpx_link::auth::{self, RunToken};
use tcpx_link::{LinkMsg, LINK_PROTOCOL};

/// How long either side waits for the other's greeting.
pub const HELLO_WAIT: Duration = Duration::from_secs(30);
/// How long the leader waits for `Ready` after `Prepare`.
pub const READY_WAIT: Duration = Duration::from_secs(60);
/// How long the leader waits for `Done` beyond the experiment's own timeout.
pub const DONE_SLACK: Duration = Duration::from_secs(30);

/// What a machine hears from its driver.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message arrived on the link.
    Received(LinkMsg),
    /// The peer closed the link.
    Closed,
    /// The link failed (the text says how).
    LinkFailed(String),
    /// `poll_timeout` passed (the driver may also send it early; it is ignored then).
    Timeout,
    /// Follower: the experiment asked for is prepared (`Ok`: the port to connect to and the knobs
    /// not applied) or cannot run here (`Err`: why).
    Prepared(Result<(u16, NotApplied), String>),
    /// Follower: this side's run ended (error text when it failed) with its NIC plan.
    RunEnded {
        error: Option<String>,
        nic_plan: Option<String>,
    },
    /// Leader: run this experiment.
    Start {
        exp: Box<Experiment>,
        outside: Outside,
    },
    /// Leader: this side's run ended; `failed` when it did.
    LocalEnded { failed: bool },
    /// Leader: the plan is over.
    Finish,
}

/// What a machine asks its driver to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send this message on the link.
    Send(LinkMsg),
    /// Follower: prepare this experiment (knobs, listener or reserved ports), then report
    /// [`Event::Prepared`].
    Prepare {
        exp: Box<Experiment>,
        outside: Outside,
    },
    /// Leader: run the client side against the follower's `port`; `not_applied` are the
    /// follower's knobs it could not apply. Report [`Event::LocalEnded`].
    Run { port: u16, not_applied: NotApplied },
    /// Leader: the follower cannot run the experiment; record it as skipped with this reason.
    Skip(String),
    /// Stop this side's flow processes now, for this reason (the run then ends with an error).
    StopProcesses(String),
    /// Leader: the experiment is over; the follower's error and NIC plan.
    Finished {
        follower_error: Option<String>,
        follower_nic_plan: Option<String>,
    },
    /// The link is unusable: end the run with this error.
    Fatal(String),
    /// Follower: the leader said goodbye after this many experiments.
    Bye { served: u32 },
}

impl Action {
    /// The reason to stop this side's flow processes, where `actions` hold one: what a side's
    /// supervisor asks the protocol while its children run.
    pub fn stop_reason(actions: Vec<Action>) -> Option<String> {
        actions.into_iter().find_map(|a| match a {
            Action::StopProcesses(r) => Some(r),
            _ => None,
        })
    }
}

fn mismatch(peer_role: &str, me: &str, protocol: u32, version: &str) -> String {
    // The version comes from a peer that has not proved the run token yet.
    let version = tcpx_link::shown(version, 40);
    format!(
        "the {peer_role} speaks link protocol {protocol} (tcpx-run {version}), this {me} {LINK_PROTOCOL}: run the same tcpx-run build on both nodes"
    )
}

fn greeting(host: &str, nonce: &str, proof: Option<String>, run: &str) -> LinkMsg {
    LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: host.into(),
        nonce: nonce.into(),
        proof,
        run: run.into(),
    }
}

/// What a side needs to prove itself and check its peer: the run token (`None`: none, which
/// proves an empty key), and this side's fresh nonce (from [`auth::nonce`]).
#[derive(Clone, Debug)]
pub struct Credentials {
    pub token: Option<RunToken>,
    pub nonce: String,
}

/// What a peer that fails the token check is told, and what this side reports.
fn token_mismatch(peer_role: &str, token: Option<&RunToken>) -> String {
    let mine = if token.is_some() {
        "this side's run token"
    } else {
        "an empty token (this side has no run token)"
    };
    format!(
        "the {peer_role} did not prove {mine}: give both sides the same token (TCPX_RUN_TOKEN in the environment, or --token-file FILE on both command lines)"
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FState {
    AwaitHello,
    Idle,
    Preparing,
    Running { multi: bool },
    Over,
}

/// The follower's side of the link.
pub struct Follower {
    state: FState,
    deadline: Option<Instant>,
    idle: Duration,
    served: u32,
    multi: bool,
    creds: Credentials,
    run: String,
}

impl Follower {
    /// A follower that greets the leader now; `host` goes into its `Hello`. `idle` is the
    /// longest wait for the leader's next experiment.
    pub fn new(
        host: &str,
        idle: Duration,
        now: Instant,
        creds: Credentials,
    ) -> (Follower, Vec<Action>) {
        let hello = greeting(host, &creds.nonce, None, "");
        let f = Follower {
            state: FState::AwaitHello,
            deadline: Some(now + HELLO_WAIT),
            idle,
            served: 0,
            multi: false,
            creds,
            run: String::new(),
        };
        (f, vec![Action::Send(hello)])
    }

    /// The run the leader said it serves (checked with its proof), once greeted.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// When the driver must send [`Event::Timeout`]; `None` while no message is awaited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Experiments the leader asked for so far (refused ones included).
    pub fn served(&self) -> u32 {
        self.served
    }

    /// Whether the machine ended (a `Bye` or `Fatal` was returned).
    pub fn is_over(&self) -> bool {
        self.state == FState::Over
    }

    fn fatal(&mut self, why: String) -> Vec<Action> {
        self.state = FState::Over;
        self.deadline = None;
        vec![Action::Fatal(why)]
    }

    fn idle_from(&mut self, now: Instant) {
        self.state = FState::Idle;
        self.deadline = Some(now + self.idle);
    }

    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use FState::*;
        match (self.state, event) {
            (Over, _) => vec![],
            (_, Event::Timeout) if self.deadline.is_none_or(|d| now < d) => vec![],
            (
                AwaitHello,
                Event::Received(LinkMsg::Hello {
                    protocol,
                    nonce,
                    proof,
                    run,
                    ..
                }),
            ) if protocol == LINK_PROTOCOL => {
                let token = self.creds.token.as_ref();
                let mine = &self.creds.nonce;
                let proven = run.len() <= auth::MAX_RUN_LEN
                    && auth::valid_nonce(&nonce)
                    && proof.as_deref().is_some_and(|p| {
                        auth::verify(token, auth::Role::Leader, mine, &nonce, &run, p)
                    });
                if !proven {
                    let why = token_mismatch("leader", token);
                    let mut out = vec![Action::Send(LinkMsg::Refused {
                        reason: "the leader's proof of the run token does not match the follower's: give both sides the same token (TCPX_RUN_TOKEN or --token-file)".into(),
                    })];
                    out.extend(self.fatal(why));
                    return out;
                }
                let proof = auth::prove(token, auth::Role::Follower, mine, &nonce, &run);
                self.run = run;
                self.idle_from(now);
                vec![Action::Send(LinkMsg::Auth { proof })]
            }
            (AwaitHello, Event::Received(LinkMsg::Hello { protocol, version, .. })) => {
                self.fatal(mismatch("leader", "follower", protocol, &version))
            }
            (AwaitHello, Event::Received(LinkMsg::Refused { reason })) => {
                self.fatal(format!(
                    "the leader refused this follower: {}",
                    tcpx_link::shown(&reason, 400)
                ))
            }
            (AwaitHello, Event::Closed) => self.fatal(
                "the leader closed the connection during the greeting: see its output for why it dropped this follower (another version, another run token)".into(),
            ),
            (AwaitHello, Event::Received(other)) => {
                self.fatal(format!(
                    "the leader sent {} instead of a greeting",
                    other.kind()
                ))
            }
            (AwaitHello, Event::Timeout) => self.fatal(format!(
                "waiting for the leader's greeting: nothing arrived in {} s",
                HELLO_WAIT.as_secs()
            )),
            (Idle, Event::Received(LinkMsg::Bye)) => {
                self.state = Over;
                self.deadline = None;
                vec![Action::Bye {
                    served: self.served,
                }]
            }
            // The leader's stop request crossed our `Done`: that experiment is over already.
            (Idle, Event::Received(LinkMsg::Abort { .. })) => vec![],
            (Idle, Event::Received(LinkMsg::Prepare { exp, outside })) => {
                // Counted when asked for, refused or not.
                self.served += 1;
                self.state = Preparing;
                self.deadline = None;
                self.multi = exp.multi_process;
                vec![Action::Prepare { exp, outside }]
            }
            (Idle, Event::Received(other)) => self.fatal(format!(
                "the leader sent {other:?} where an experiment was expected"
            )),
            (Idle, Event::Timeout) => self.fatal(format!(
                "the leader sent nothing for {} s: giving up",
                self.idle.as_secs()
            )),
            (Preparing, Event::Prepared(Ok((port, not_applied)))) => {
                self.state = Running { multi: self.multi };
                vec![Action::Send(LinkMsg::Ready { port, not_applied })]
            }
            (Preparing, Event::Prepared(Err(reason))) => {
                self.idle_from(now);
                vec![Action::Send(LinkMsg::Refused { reason })]
            }
            (Running { .. }, Event::RunEnded { error, nic_plan }) => {
                self.idle_from(now);
                vec![Action::Send(LinkMsg::Done { error, nic_plan })]
            }
            // Only a multi-process run reads the link while it runs.
            (Running { multi: true }, Event::Received(LinkMsg::Abort { reason })) => {
                vec![Action::StopProcesses(format!(
                    "stopped at the leader's request ({reason})"
                ))]
            }
            (Running { .. }, Event::Received(other)) => vec![Action::StopProcesses(format!(
                "the leader sent {other:?} during the run"
            ))],
            (Running { .. }, Event::Closed) => vec![Action::StopProcesses(
                "lost the leader during the run (the connection was closed)".into(),
            )],
            (Running { .. }, Event::LinkFailed(e)) => vec![Action::StopProcesses(format!(
                "lost the leader during the run ({e})"
            ))],
            (_, Event::Closed) => self.fatal(format!(
                "the leader closed the connection without saying goodbye (did it crash? see its output) after {} experiments",
                self.served
            )),
            (_, Event::LinkFailed(e)) => self.fatal(format!("reading from the leader: {e}")),
            (state, event) => self.fatal(format!(
                "internal: the follower got {event:?} in state {state:?}"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LState {
    AwaitHello,
    AwaitAuth,
    Idle,
    AwaitReady,
    Running,
    AwaitDone,
    Over,
}

/// The leader's side of the link.
pub struct Leader {
    state: LState,
    deadline: Option<Instant>,
    multi: bool,
    timeout: Duration,
    /// The follower's `Done`, when it came while this side still ran.
    early: Option<(Option<String>, Option<String>)>,
    /// How the link was lost while this side still ran.
    gone: Option<String>,
    creds: Credentials,
    /// What the leader says it runs (in its greeting, under its proof).
    run: String,
    /// The follower's nonce, once greeted.
    their_nonce: String,
}

impl Leader {
    /// A leader that waits for its follower's greeting from now; `run` (the plan, say) goes
    /// into its greeting and proof.
    pub fn new(now: Instant, creds: Credentials, run: &str) -> Leader {
        Leader {
            state: LState::AwaitHello,
            deadline: Some(now + HELLO_WAIT),
            multi: false,
            timeout: Duration::ZERO,
            early: None,
            gone: None,
            creds,
            run: run.chars().take(auth::MAX_RUN_LEN / 4).collect(),
            their_nonce: String::new(),
        }
    }

    /// Refuses the peer with `why` (told to it, then the end of this machine).
    fn refuse(&mut self, why: String) -> Vec<Action> {
        let mut out = vec![Action::Send(LinkMsg::Refused {
            reason: why.clone(),
        })];
        out.extend(self.fatal(why));
        out
    }

    /// When the driver must send [`Event::Timeout`]; `None` while no message is awaited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the greeting is done and no experiment runs.
    pub fn is_idle(&self) -> bool {
        self.state == LState::Idle
    }

    /// Whether a message is awaited (the driver should read the link).
    pub fn awaits_message(&self) -> bool {
        matches!(
            self.state,
            LState::AwaitHello | LState::AwaitAuth | LState::AwaitReady | LState::AwaitDone
        ) || (self.state == LState::Running
            && self.multi
            && self.early.is_none()
            && self.gone.is_none())
    }

    fn fatal(&mut self, why: String) -> Vec<Action> {
        self.state = LState::Over;
        self.deadline = None;
        vec![Action::Fatal(why)]
    }

    fn lost(&mut self, when: &str, how: &str) -> Vec<Action> {
        self.fatal(format!("the follower disappeared {when} ({how})"))
    }

    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Action> {
        use LState::*;
        match (self.state, event) {
            (Over, _) => vec![],
            (_, Event::Timeout) if self.deadline.is_none_or(|d| now < d) => vec![],
            (
                AwaitHello,
                Event::Received(LinkMsg::Hello {
                    protocol, version, ..
                }),
            ) if protocol != LINK_PROTOCOL => {
                self.refuse(mismatch("follower", "leader", protocol, &version))
            }
            (AwaitHello, Event::Received(LinkMsg::Hello { nonce, .. })) => {
                if !auth::valid_nonce(&nonce) {
                    return self.refuse("the follower's greeting has no valid nonce".into());
                }
                let token = self.creds.token.as_ref();
                let proof = auth::prove(
                    token,
                    auth::Role::Leader,
                    &nonce,
                    &self.creds.nonce,
                    &self.run,
                );
                self.their_nonce = nonce;
                self.state = AwaitAuth;
                self.deadline = Some(now + HELLO_WAIT);
                vec![Action::Send(greeting(
                    "",
                    &self.creds.nonce,
                    Some(proof),
                    &self.run,
                ))]
            }
            (AwaitHello, Event::Received(other)) => self.fatal(format!(
                "the follower sent {} instead of a greeting",
                other.kind()
            )),
            (AwaitHello, Event::Timeout) => self.fatal(format!(
                "waiting for the follower's greeting: nothing arrived in {} s",
                HELLO_WAIT.as_secs()
            )),
            (AwaitAuth, Event::Received(LinkMsg::Auth { proof })) => {
                let token = self.creds.token.as_ref();
                if auth::verify(
                    token,
                    auth::Role::Follower,
                    &self.their_nonce,
                    &self.creds.nonce,
                    &self.run,
                    &proof,
                ) {
                    self.state = Idle;
                    self.deadline = None;
                    vec![]
                } else {
                    let why = token_mismatch("follower", token);
                    self.refuse(why)
                }
            }
            (AwaitAuth, Event::Received(LinkMsg::Refused { reason })) => {
                // Before the token is proven this may be anyone: its text escaped and cut.
                self.fatal(format!(
                    "the follower refused this leader: {}",
                    tcpx_link::shown(&reason, 400)
                ))
            }
            (AwaitAuth, Event::Received(other)) => self.fatal(format!(
                "the follower sent {} instead of its proof of the run token",
                other.kind()
            )),
            (AwaitAuth, Event::Timeout) => self.fatal(format!(
                "waiting for the follower's proof of the run token: nothing arrived in {} s",
                HELLO_WAIT.as_secs()
            )),
            (AwaitHello, Event::Closed) => {
                self.fatal("the connection was closed before any greeting".into())
            }
            (AwaitHello | AwaitAuth, Event::LinkFailed(e)) => {
                self.fatal(format!("it does not speak this protocol ({e})"))
            }
            (AwaitAuth, Event::Closed) => {
                self.fatal("the follower closed the connection during the greeting".into())
            }
            (Idle, Event::Start { exp, outside }) => {
                self.state = AwaitReady;
                self.deadline = Some(now + READY_WAIT);
                self.multi = exp.multi_process;
                self.timeout = exp.timeout();
                self.early = None;
                self.gone = None;
                vec![Action::Send(LinkMsg::Prepare { exp, outside })]
            }
            (Idle, Event::Finish) => {
                self.state = Over;
                vec![Action::Send(LinkMsg::Bye)]
            }
            (AwaitReady, Event::Received(LinkMsg::Ready { port, not_applied })) => {
                self.state = Running;
                self.deadline = None;
                vec![Action::Run { port, not_applied }]
            }
            (AwaitReady, Event::Received(LinkMsg::Refused { reason })) => {
                self.state = Idle;
                self.deadline = None;
                vec![Action::Skip(format!(
                    "the follower cannot run it: {reason}"
                ))]
            }
            (AwaitReady, Event::Received(other)) => {
                self.fatal(format!("the follower sent {other:?} instead of ready"))
            }
            (AwaitReady, Event::Timeout) => self.lost("at the start", "nothing arrived in time"),
            (AwaitReady, Event::Closed) => self.lost("at the start", "the connection was closed"),
            (AwaitReady, Event::LinkFailed(e)) => self.lost("at the start", &e),
            // Read while our processes run (multi-process): a failed `Done` stops them.
            (Running, Event::Received(LinkMsg::Done { error, nic_plan }))
                if self.early.is_none() =>
            {
                let failed = error.is_some();
                self.early = Some((error, nic_plan));
                if failed {
                    vec![Action::StopProcesses(
                        "the follower's processes failed first (its error follows)".into(),
                    )]
                } else {
                    vec![]
                }
            }
            (Running, Event::Received(other)) if self.early.is_none() => {
                self.early = Some((Some(format!("unexpected message {other:?}")), None));
                vec![Action::StopProcesses(format!(
                    "the follower sent {other:?} during the run"
                ))]
            }
            (Running, Event::Closed) if self.gone.is_none() => {
                self.gone = Some("the connection was closed".into());
                vec![Action::StopProcesses(
                    "lost the follower during the run (the connection was closed)".into(),
                )]
            }
            (Running, Event::LinkFailed(e)) if self.gone.is_none() => {
                let stop = format!("lost the follower during the run ({e})");
                self.gone = Some(e);
                vec![Action::StopProcesses(stop)]
            }
            (Running, Event::LocalEnded { failed }) => {
                if let Some(how) = self.gone.take() {
                    return self.lost("during the run", &how);
                }
                let mut out = Vec::new();
                if let Some((follower_error, follower_nic_plan)) = self.early.take() {
                    self.state = Idle;
                    out.push(Action::Finished {
                        follower_error,
                        follower_nic_plan,
                    });
                    return out;
                }
                if self.multi && failed {
                    // Our processes failed first: the follower's may wait for clients that will
                    // not come. If its `Done` crosses this, it ignores the request.
                    out.push(Action::Send(LinkMsg::Abort {
                        reason: "the leader's processes failed".into(),
                    }));
                }
                self.state = AwaitDone;
                self.deadline = Some(now + self.timeout + DONE_SLACK);
                out
            }
            (AwaitDone, Event::Received(LinkMsg::Done { error, nic_plan })) => {
                self.state = Idle;
                self.deadline = None;
                vec![Action::Finished {
                    follower_error: error,
                    follower_nic_plan: nic_plan,
                }]
            }
            (AwaitDone, Event::Received(other)) => {
                self.state = Idle;
                self.deadline = None;
                vec![Action::Finished {
                    follower_error: Some(format!("unexpected message {other:?}")),
                    follower_nic_plan: None,
                }]
            }
            (AwaitDone, Event::Timeout) => self.lost("during the run", "nothing arrived in time"),
            (AwaitDone, Event::Closed) => self.lost("during the run", "the connection was closed"),
            (AwaitDone, Event::LinkFailed(e)) => self.lost("during the run", &e),
            (_, Event::Closed) => self.lost("between experiments", "the connection was closed"),
            (_, Event::LinkFailed(e)) => self.lost("between experiments", &e),
            (state, event) => self.fatal(format!(
                "internal: the leader got {event:?} in state {state:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests;
