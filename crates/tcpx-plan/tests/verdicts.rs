//! What the verdicts conclude from given figures, deterministically: the plan engine runs a
//! comparison against a runner that returns chosen figures (a fixed pseudo-random wobble around
//! each configuration's speed), so no other load on the machine can move the outcome. The same
//! configuration compared with itself (A/A) is never called a winner or a significant gain,
//! whatever wobble its rounds see; a configuration clearly slower is reported as significantly
//! slower once the sequential design decides it (at its first look, round 10).
//!
//! (tcpx-run's `cli::plan_verdicts` runs a comparison through the binary over loopback and
//! checks the report files' shape, not these claims.)

use std::cell::RefCell;
use std::rc::Rc;

use tcpx_plan::{Plan, PlanExperiment, RunOutcome, Runner, SystemFacts};
use tcpx_report::sequential::StopReason;
use tcpx_report::{RunReport, Verdict};

mod common;
use common::{facts, measured_at, plans_dir, targets};

/// Returns each call's server GB/s: the configuration's speed (by experiment name; 1.0 GB/s for
/// a name not listed) times a wobble in [1 - spread, 1 + spread] from a fixed sequence of
/// `seed`, which differs from call to call as a real machine's does.
struct ChosenFigures {
    facts: SystemFacts,
    speeds: Vec<(&'static str, f64)>,
    spread: f64,
    state: u64,
}

impl ChosenFigures {
    fn new(speeds: Vec<(&'static str, f64)>, spread: f64, seed: u64) -> ChosenFigures {
        ChosenFigures {
            facts: facts(),
            speeds,
            spread,
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// The next wobble factor (xorshift64: the same sequence for the same seed, every run).
    fn wobble(&mut self) -> f64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let unit = (self.state >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + self.spread * (2.0 * unit - 1.0)
    }
}

impl Runner for ChosenFigures {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }

    fn run(&mut self, exp: &PlanExperiment, phase: &str, started_s: f64) -> RunOutcome {
        let name = exp.name();
        let speed = self
            .speeds
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(1.0, |(_, s)| *s);
        let gbs = speed * self.wobble();
        measured_at(exp, phase, started_s, gbs)
    }
}

/// Runs plan source `src` against `runner` with the loopback target set (noise band 25 %, at
/// most 30 rounds): the report.
fn run(src: &str, runner: ChosenFigures) -> RunReport {
    let plan = Plan::from_source("verdicts", &plans_dir(), src);
    plan.execute(Rc::new(RefCell::new(runner)), &targets(), Box::new(|_| {}))
        .unwrap_or_else(|e| panic!("the plan did not run: {e}"))
}

const AA: &str = r#"
phase("A/A");
let b = experiment(#{ name: "aa", sizes: ["16M"], iters: 8, warmup: 1, sample: false });
let rs = compare([b.with_knobs(#{ name: "A", label: "A" }), b.with_knobs(#{ name: "A2", label: "A again" })]);
let w = best(rs);
let g = gain_ci(rs[0], rs[1]);
criterion("A again beats A beyond noise", g, ">", noise());
criterion("A beats A again beyond noise", gain_ci(rs[1], rs[0]), ">", noise());
decision("AA", "is A again faster?", holds(g, ">", noise()), "yes", "no");
if w != () { note(`significant: ${significant(g)}, clear winner: ${w.clear_winner}`); }
"#;

#[test]
fn the_same_configuration_twice_is_never_a_winner_or_a_gain() {
    // Wobbles of up to 10 % and 20 % either way (a loaded machine's), each over 20 sequences.
    for spread in [0.1, 0.2] {
        for seed in 1..=20 {
            let report = run(AA, ChosenFigures::new(vec![], spread, seed));
            let case = format!("spread {spread}, seed {seed}");
            for c in &report.criteria {
                assert_ne!(c.verdict, Verdict::Pass, "{case}: {c:?}");
            }
            // "No" (the whole interval lies below +noise) or UNANSWERED, never "yes".
            assert_ne!(report.decisions[0].answer, Some(true), "{case}");
            assert!(
                report
                    .notes
                    .iter()
                    .any(|n| n.contains("significant: false, clear winner: false")),
                "{case}: {:?}",
                report.notes
            );
            assert!(
                report.rankings[0].text.contains("tied within noise"),
                "{case}: {}",
                report.rankings[0].text
            );
            // Past the 3 repetitions (nothing is decided before round 10), within the budget.
            for s in &report.sequential {
                assert!((10..=30).contains(&s.rounds), "{case}: {s:?}");
                assert!(
                    matches!(s.stop, StopReason::Decided | StopReason::Budget),
                    "{case}: {s:?}"
                );
                assert!(s.method.contains("Bonferroni"), "{case}: {s:?}");
            }
        }
    }
}

#[test]
fn a_clearly_slower_configuration_is_reported_as_significant() {
    let src = r#"
phase("slow vs fast");
let b = experiment(#{ name: "x", sizes: ["8M"], iters: 4, warmup: 1, verify: true, sample: false });
let rs = compare([
    b.with_knobs(#{ name: "slow", label: "1 socket, 16K requests, 1 in flight", socks_per_channel: 1, chunk: "16K", window: 1 }),
    b.with_knobs(#{ name: "fast", label: "4 sockets, 1M requests, 16 in flight", socks_per_channel: 4, chunk: "1M", window: 16 }),
]);
let w = best(rs);
let g = gain_ci(rs[0], rs[1]);
criterion("fast beats slow beyond noise", g, ">", noise());
if w != () { note(`winner ${w.name}, clear ${w.clear_winner}, significant ${significant(g)}, ${g.why}`); }
"#;
    // Three times faster, as four pipelined sockets are against one with tiny requests; each
    // side wobbling by up to 20 %.
    for seed in 1..=20 {
        let report = run(
            src,
            ChosenFigures::new(vec![("slow", 1.0), ("fast", 3.0)], 0.2, seed),
        );
        let case = format!("seed {seed}");
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("winner fast, clear true, significant true")),
            "{case}: {:?}",
            report.notes
        );
        let c = &report.criteria[0];
        assert_eq!(c.verdict, Verdict::Pass, "{case}: {c:?}");
        assert!(
            c.ci95_lo.is_some_and(|lo| lo > 0.25),
            "{case}: the whole interval is beyond the 25 % noise floor: {c:?}"
        );
        assert!(
            c.detail.contains("interval: sequential"),
            "{case}: {}",
            c.detail
        );
        assert!(
            report.rankings[0]
                .text
                .contains("ahead of every other configuration beyond noise"),
            "{case}: {}",
            report.rankings[0].text
        );
        // Decided at the design's first look: every round has fast ahead by far.
        let seq = &report.sequential[0];
        assert_eq!(
            (seq.rounds, seq.stop),
            (10, StopReason::Decided),
            "{case}: {seq:?}"
        );
    }
}

#[test]
fn a_gain_within_the_noise_band_is_not_significant() {
    // 10 % faster every round, no wobble: real, but inside the 25 % band the plan trusts.
    let src = r#"
let b = experiment(#{ name: "x", sizes: ["8M"], iters: 4, warmup: 1, sample: false });
let rs = compare([b.with_knobs(#{ name: "A" }), b.with_knobs(#{ name: "B" })]);
let w = best(rs);
let g = gain_ci(rs[0], rs[1]);
criterion("B beats A beyond noise", g, ">", noise());
if w != () { note(`significant: ${significant(g)}, clear winner: ${w.clear_winner}`); }
"#;
    let report = run(
        src,
        ChosenFigures::new(vec![("A", 1.0), ("B", 1.1)], 0.0, 1),
    );
    assert_ne!(
        report.criteria[0].verdict,
        Verdict::Pass,
        "{:?}",
        report.criteria
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("significant: false, clear winner: false")),
        "{:?}",
        report.notes
    );
}
