//! Both machines against each other, without sockets or threads: a [`Pair`] carries each
//! side's sent messages to the other in order (or holds them, to make two cross), and a virtual
//! clock drives every timeout.

use super::*;
use tcpx_link::auth::RunToken;

/// A leader and a follower joined by two in-memory queues, on a virtual clock.
struct Pair {
    now: Instant,
    leader: Leader,
    follower: Follower,
    to_follower: Vec<LinkMsg>,
    to_leader: Vec<LinkMsg>,
    /// Actions other than `Send`, per side, in order.
    leader_did: Vec<Action>,
    follower_did: Vec<Action>,
}

const IDLE: Duration = Duration::from_secs(900);

fn token(t: &str) -> Option<RunToken> {
    Some(RunToken::parse(t, "test").unwrap())
}

fn creds(t: Option<RunToken>, nonce: u8) -> Credentials {
    Credentials {
        token: t,
        nonce: format!("{nonce:02x}").repeat(tcpx_link::auth::NONCE_LEN),
    }
}

/// A leader and a follower with these tokens, on a virtual clock.
fn machines(
    leader_token: &str,
    follower_token: &str,
    now: Instant,
) -> (Leader, Follower, Vec<Action>) {
    let leader = Leader::new(now, creds(token(leader_token), 1), "plan p");
    let (follower, hello) = Follower::new("node-b", IDLE, now, creds(token(follower_token), 2));
    (leader, follower, hello)
}

impl Pair {
    fn new() -> Pair {
        Pair::with_tokens("run-token-0123456789", "run-token-0123456789")
    }

    fn with_tokens(leader_token: &str, follower_token: &str) -> Pair {
        let now = Instant::now();
        let (leader, follower, hello) = machines(leader_token, follower_token, now);
        let mut p = Pair {
            now,
            leader,
            follower,
            to_follower: vec![],
            to_leader: vec![],
            leader_did: vec![],
            follower_did: vec![],
        };
        p.follower_acts(hello);
        p
    }

    /// A pair that has greeted each other.
    fn greeted() -> Pair {
        let mut p = Pair::new();
        p.run();
        assert!(p.leader.is_idle());
        assert!(p.leader_did.is_empty() && p.follower_did.is_empty());
        p
    }

    fn leader_acts(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(m) => self.to_follower.push(m),
                other => self.leader_did.push(other),
            }
        }
    }

    fn follower_acts(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(m) => self.to_leader.push(m),
                other => self.follower_did.push(other),
            }
        }
    }

    fn tell_leader(&mut self, e: Event) {
        let a = self.leader.handle(e, self.now);
        self.leader_acts(a);
    }

    fn tell_follower(&mut self, e: Event) {
        let a = self.follower.handle(e, self.now);
        self.follower_acts(a);
    }

    /// Delivers every queued message, both ways, until both queues are empty.
    fn run(&mut self) {
        while !self.to_follower.is_empty() || !self.to_leader.is_empty() {
            for m in std::mem::take(&mut self.to_leader) {
                self.tell_leader(Event::Received(m));
            }
            for m in std::mem::take(&mut self.to_follower) {
                self.tell_follower(Event::Received(m));
            }
        }
    }

    /// Moves the clock to `d` from now and tells each side whose deadline passed.
    fn advance(&mut self, d: Duration) {
        self.now += d;
        if self.leader.poll_timeout().is_some_and(|t| t <= self.now) {
            self.tell_leader(Event::Timeout);
        }
        if self.follower.poll_timeout().is_some_and(|t| t <= self.now) {
            self.tell_follower(Event::Timeout);
        }
    }

    /// The leader starts an experiment and the follower prepares it: both are then running.
    fn start(&mut self, multi: bool) {
        let exp = Experiment {
            multi_process: multi,
            timeout_s: 10.0,
            ..Experiment::default()
        };
        self.tell_leader(Event::Start {
            exp: Box::new(exp),
            outside: Default::default(),
        });
        self.run();
        assert!(matches!(
            self.follower_did.pop(),
            Some(Action::Prepare { .. })
        ));
        self.tell_follower(Event::Prepared(Ok((5400, Default::default()))));
        self.run();
        assert!(matches!(
            self.leader_did.pop(),
            Some(Action::Run { port: 5400, .. })
        ));
    }
}

fn fatal(did: &[Action]) -> &str {
    match did.last() {
        Some(Action::Fatal(why)) => why,
        other => panic!("expected a fatal error, got {other:?}"),
    }
}

#[test]
fn an_experiment_runs_and_the_run_ends_with_bye() {
    let mut p = Pair::greeted();
    p.start(false);
    p.tell_follower(Event::RunEnded {
        error: None,
        nic_plan: Some("flow 0: 127.0.0.2".into()),
    });
    p.tell_leader(Event::LocalEnded { failed: false });
    p.run();
    assert_eq!(
        p.leader_did.pop(),
        Some(Action::Finished {
            follower_error: None,
            follower_nic_plan: Some("flow 0: 127.0.0.2".into())
        })
    );
    assert!(p.leader.is_idle());
    p.tell_leader(Event::Finish);
    p.run();
    assert_eq!(p.follower_did.pop(), Some(Action::Bye { served: 1 }));
    assert!(p.follower.is_over() && p.follower.poll_timeout().is_none());
}

#[test]
fn a_refused_experiment_is_skipped_and_the_next_one_runs() {
    let mut p = Pair::greeted();
    p.tell_leader(Event::Start {
        exp: Box::default(),
        outside: Default::default(),
    });
    p.run();
    p.follower_did.clear();
    p.tell_follower(Event::Prepared(Err("8 NICs asked for".into())));
    p.run();
    assert!(
        matches!(p.leader_did.pop(), Some(Action::Skip(r)) if r == "the follower cannot run it: 8 NICs asked for")
    );
    p.start(false);
}

#[test]
fn a_version_mismatch_ends_both_sides_naming_both_versions() {
    let now = Instant::now();
    let (mut leader, mut follower, _) =
        machines("run-token-0123456789", "run-token-0123456789", now);
    let old = LinkMsg::Hello {
        protocol: 2,
        version: "0.0.9".into(),
        host: "b".into(),
        nonce: String::new(),
        proof: None,
        run: String::new(),
    };
    let acts = leader.handle(Event::Received(old.clone()), now);
    let why = fatal(&acts).to_string();
    assert!(
        why.contains(&format!(
            "follower speaks link protocol 2 (tcpx-run 0.0.9), this leader {LINK_PROTOCOL}"
        )),
        "{why}"
    );
    // The follower is told why before the leader drops it.
    assert!(
        matches!(&acts[0], Action::Send(LinkMsg::Refused { reason }) if reason == &why),
        "{acts:?}"
    );
    let why = fatal(&follower.handle(Event::Received(old), now)).to_string();
    assert!(
        why.contains("leader speaks link protocol 2")
            && why.contains(&format!("this follower {LINK_PROTOCOL}")),
        "{why}"
    );
    assert!(follower.is_over());
    // Finished machines stay finished.
    assert!(follower.handle(Event::Timeout, now + IDLE).is_empty());
}

#[test]
fn a_peer_that_never_greets_times_out_on_both_sides() {
    let now = Instant::now();
    let (mut leader, mut follower, _) =
        machines("run-token-0123456789", "run-token-0123456789", now);
    // Early timeouts are ignored.
    assert!(leader.handle(Event::Timeout, now).is_empty());
    let later = now + HELLO_WAIT;
    assert!(fatal(&leader.handle(Event::Timeout, later)).contains("follower's greeting"));
    assert!(fatal(&follower.handle(Event::Timeout, later)).contains("leader's greeting"));
}

#[test]
fn a_follower_that_never_answers_prepare_is_lost_after_the_ready_wait() {
    let mut p = Pair::greeted();
    p.tell_leader(Event::Start {
        exp: Box::default(),
        outside: Default::default(),
    });
    p.to_follower.clear(); // the Prepare is lost: the follower never answers
    p.advance(READY_WAIT - Duration::from_millis(1));
    assert!(p.leader_did.is_empty());
    p.advance(Duration::from_millis(1));
    let why = fatal(&p.leader_did);
    assert!(
        why.contains("disappeared at the start") && why.contains("nothing arrived"),
        "{why}"
    );
}

#[test]
fn a_follower_that_never_says_done_is_lost_after_its_timeout_and_slack() {
    let mut p = Pair::greeted();
    p.start(false);
    p.tell_leader(Event::LocalEnded { failed: false });
    // timeout_s 10 + DONE_SLACK.
    p.advance(Duration::from_secs(10) + DONE_SLACK - Duration::from_millis(1));
    assert!(p.leader_did.is_empty());
    p.advance(Duration::from_millis(1));
    assert!(fatal(&p.leader_did).contains("disappeared during the run"));
}

#[test]
fn an_idle_leader_is_given_up_after_the_idle_timeout() {
    let mut p = Pair::greeted();
    p.advance(IDLE);
    assert!(fatal(&p.follower_did).contains("sent nothing for 900 s"));
}

#[test]
fn a_leader_that_vanishes_between_experiments_is_named_with_the_count() {
    let mut p = Pair::greeted();
    p.start(false);
    p.tell_follower(Event::RunEnded {
        error: None,
        nic_plan: None,
    });
    p.tell_follower(Event::Closed);
    assert!(
        fatal(&p.follower_did).contains("without saying goodbye")
            && fatal(&p.follower_did).contains("after 1 experiments")
    );
}

/// Multi-process: the follower's flow process died after its client connected (or could not
/// bind its held port): its failed `Done` reaches the leader while the leader's processes still
/// run, and stops them at once; the leader then reports the follower's error.
#[test]
fn a_follower_process_dying_stops_the_leaders_processes_at_once() {
    let mut p = Pair::greeted();
    p.start(true);
    assert!(p.leader.awaits_message());
    p.tell_follower(Event::RunEnded {
        error: Some("flow 1 (server, pid 7) exited with status 3".into()),
        nic_plan: None,
    });
    p.run();
    assert!(
        matches!(p.leader_did.pop(), Some(Action::StopProcesses(r)) if r.contains("follower's processes failed first"))
    );
    assert!(!p.leader.awaits_message());
    p.tell_leader(Event::LocalEnded { failed: true });
    // No Abort: the follower is done already.
    assert!(p.to_follower.is_empty());
    assert!(matches!(
        p.leader_did.pop(),
        Some(Action::Finished { follower_error: Some(e), .. }) if e.contains("status 3")
    ));
}

/// Multi-process: the leader's processes failed first, so it sends `Abort`; the follower stops
/// its processes and still answers `Done`.
#[test]
fn the_leaders_abort_stops_the_followers_processes() {
    let mut p = Pair::greeted();
    p.start(true);
    p.tell_leader(Event::LocalEnded { failed: true });
    p.run();
    assert!(
        matches!(p.follower_did.pop(), Some(Action::StopProcesses(r)) if r.contains("leader's request (the leader's processes failed)"))
    );
    p.tell_follower(Event::RunEnded {
        error: Some("stopped".into()),
        nic_plan: None,
    });
    p.run();
    assert!(matches!(
        p.leader_did.pop(),
        Some(Action::Finished {
            follower_error: Some(_),
            ..
        })
    ));
    assert!(p.leader.is_idle());
}

/// The leader's `Abort` and the follower's `Done` cross on the wire: the leader takes the
/// `Done`, the follower ignores the `Abort` (it waits for the next experiment), and the next
/// experiment runs normally.
#[test]
fn an_abort_crossing_done_is_ignored_and_the_next_experiment_runs() {
    let mut p = Pair::greeted();
    p.start(true);
    // Both sides end at once; neither has seen the other's message yet.
    p.tell_follower(Event::RunEnded {
        error: Some("flow 0 failed".into()),
        nic_plan: None,
    });
    p.tell_leader(Event::LocalEnded { failed: true });
    assert!(matches!(p.to_follower.as_slice(), [LinkMsg::Abort { .. }]));
    assert!(matches!(p.to_leader.as_slice(), [LinkMsg::Done { .. }]));
    p.run();
    assert!(p.follower_did.is_empty(), "{:?}", p.follower_did);
    assert!(matches!(p.leader_did.pop(), Some(Action::Finished { .. })));
    p.start(true);
    p.tell_follower(Event::RunEnded {
        error: None,
        nic_plan: None,
    });
    p.tell_leader(Event::LocalEnded { failed: false });
    p.run();
    assert_eq!(
        p.leader_did.pop(),
        Some(Action::Finished {
            follower_error: None,
            follower_nic_plan: None
        })
    );
    assert_eq!(p.follower.served(), 2);
}

#[test]
fn losing_the_link_during_a_multi_process_run_stops_the_processes_then_ends_the_run() {
    let mut p = Pair::greeted();
    p.start(true);
    p.tell_leader(Event::Closed);
    assert!(matches!(p.leader_did.pop(), Some(Action::StopProcesses(_))));
    p.tell_leader(Event::LocalEnded { failed: true });
    assert!(fatal(&p.leader_did).contains("disappeared during the run"));
    p.tell_follower(Event::LinkFailed("reset".into()));
    assert!(
        matches!(p.follower_did.pop(), Some(Action::StopProcesses(r)) if r.contains("lost the leader"))
    );
}

#[test]
fn both_sides_prove_the_run_token_before_any_experiment() {
    let mut p = Pair::new();
    p.run();
    assert!(p.leader.is_idle());
    assert!(p.leader_did.is_empty() && p.follower_did.is_empty());
    assert_eq!(p.follower.run(), "plan p");
}

#[test]
fn a_follower_with_another_token_is_refused_and_told_why() {
    let mut p = Pair::with_tokens("run-token-0123456789", "another-token-0123456");
    p.run();
    // The follower checks the leader's proof first: it refuses and ends; the leader, told,
    // drops it (its driver then waits for another).
    let f = fatal(&p.follower_did).to_string();
    assert!(
        f.contains("the leader did not prove this side's run token"),
        "{f}"
    );
    let l = fatal(&p.leader_did).to_string();
    assert!(
        l.starts_with(
            "the follower refused this leader: the leader's proof of the run token does not match"
        ),
        "{l}"
    );
    assert!(!p.leader.is_idle());
}

#[test]
fn a_follower_without_a_token_cannot_join_a_leader_with_one() {
    let now = Instant::now();
    let mut leader = Leader::new(now, creds(token("run-token-0123456789"), 1), "plan p");
    let (mut follower, hello) = Follower::new("b", IDLE, now, creds(None, 2));
    let Action::Send(hello) = &hello[0] else {
        panic!("{hello:?}")
    };
    let answer = leader.handle(Event::Received(hello.clone()), now);
    let Action::Send(answer) = &answer[0] else {
        panic!("{answer:?}")
    };
    let why = fatal(&follower.handle(Event::Received(answer.clone()), now)).to_string();
    assert!(why.contains("this side has no run token"), "{why}");
}

#[test]
fn a_forged_or_replayed_follower_proof_is_refused() {
    let now = Instant::now();
    let secret = "run-token-0123456789";
    let mut leader = Leader::new(now, creds(token(secret), 1), "plan p");
    let f_nonce = "ab".repeat(tcpx_link::auth::NONCE_LEN);
    let hello = LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: "x".into(),
        host: "evil".into(),
        nonce: f_nonce.clone(),
        proof: None,
        run: String::new(),
    };
    assert!(matches!(
        &leader.handle(Event::Received(hello.clone()), now)[..],
        [Action::Send(LinkMsg::Hello { proof: Some(_), .. })]
    ));
    let l_nonce = "01".repeat(tcpx_link::auth::NONCE_LEN);
    // A proof made as `role` over the two nonces: the leader refuses it as the follower's.
    let refuses = |leader: &mut Leader, role: tcpx_link::auth::Role| {
        let proof =
            tcpx_link::auth::prove(token(secret).as_ref(), role, &f_nonce, &l_nonce, "plan p");
        let acts = leader.handle(Event::Received(LinkMsg::Auth { proof }), now);
        assert!(
            fatal(&acts).contains("the follower did not prove"),
            "{acts:?}"
        );
        acts
    };
    // The leader's own proof sent back (a reflection) is not the follower's.
    let acts = refuses(&mut leader, tcpx_link::auth::Role::Leader);
    assert!(matches!(&acts[0], Action::Send(LinkMsg::Refused { .. })));
    // A proof made for another leader nonce (recorded from an earlier greeting) fails too.
    let mut leader = Leader::new(now, creds(token(secret), 3), "plan p");
    leader.handle(Event::Received(hello), now);
    refuses(&mut leader, tcpx_link::auth::Role::Follower);
}

#[test]
fn strangers_end_the_greeting_without_panics_and_on_time() {
    let now = Instant::now();
    let secret = "run-token-0123456789";
    // Closing at once, sending something else, a greeting without a nonce.
    let mut l = Leader::new(now, creds(token(secret), 1), "p");
    assert!(fatal(&l.handle(Event::Closed, now)).contains("before any greeting"));
    let mut l = Leader::new(now, creds(token(secret), 1), "p");
    assert!(fatal(&l.handle(Event::Received(LinkMsg::Bye), now)).contains("sent bye instead"));
    let mut l = Leader::new(now, creds(token(secret), 1), "p");
    let bare = LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: "x".into(),
        host: String::new(),
        nonce: "zz".into(),
        proof: None,
        run: String::new(),
    };
    assert!(fatal(&l.handle(Event::Received(bare), now)).contains("no valid nonce"));
    // One that greets and then says nothing is dropped after the greeting wait.
    let mut l = Leader::new(now, creds(token(secret), 1), "p");
    let hello = LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: "x".into(),
        host: String::new(),
        nonce: "ab".repeat(tcpx_link::auth::NONCE_LEN),
        proof: None,
        run: String::new(),
    };
    l.handle(Event::Received(hello), now);
    assert_eq!(l.poll_timeout(), Some(now + HELLO_WAIT));
    assert!(l.handle(Event::Timeout, now).is_empty());
    assert!(fatal(&l.handle(Event::Timeout, now + HELLO_WAIT)).contains("proof of the run token"));
}

#[test]
fn a_leader_refusal_ends_the_follower_with_the_reason() {
    let now = Instant::now();
    let (_, mut follower, _) = machines("run-token-0123456789", "run-token-0123456789", now);
    let why = fatal(&follower.handle(
        Event::Received(LinkMsg::Refused {
            reason: "this leader has a follower already".into(),
        }),
        now,
    ))
    .to_string();
    assert_eq!(
        why,
        "the leader refused this follower: this leader has a follower already"
    );
}

#[test]
fn a_huge_timeout_from_the_leader_does_not_panic_the_machines() {
    let mut p = Pair::greeted();
    for t in [1e308, -1.0, f64::NAN, f64::INFINITY] {
        let exp = tcpx_bench::Experiment {
            timeout_s: t,
            ..tcpx_bench::Experiment::default()
        };
        p.tell_leader(Event::Start {
            exp: Box::new(exp),
            outside: Default::default(),
        });
        p.run();
        p.tell_follower(Event::Prepared(Err("out of range".into())));
        p.run();
        assert!(p.leader.is_idle());
        p.leader_did.clear();
    }
}
