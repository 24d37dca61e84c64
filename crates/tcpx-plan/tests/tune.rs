//! `tune(base, space, budget)` in a plan: a runner that answers like NCCL's point-to-point
//! path on one H200 (a bottleneck model: sockets, channels x chunk and buffers pay only
//! together), the winner in the report and in tuned.env untranslated, the refusals.

use std::cell::RefCell;
use std::rc::Rc;

use tcpx_plan::{Plan, PlanExperiment, RunOutcome, Runner, SystemFacts};

mod common;
use common::{facts, measured_at, plans_dir, targets};

/// GB/s from the experiment's NCCL settings; records what each point asked for.
struct NcclModel {
    facts: SystemFacts,
    seen: Vec<PlanExperiment>,
}

fn setting(e: &PlanExperiment, k: &str, default: f64) -> f64 {
    e.bench
        .env
        .get(k)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(default)
}

impl Runner for NcclModel {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        self.seen.push(exp.clone());
        let threads = setting(exp, "NCCL_SOCKET_NTHREADS", 0.0);
        let socks = threads.max(1.0)
            * setting(exp, "NCCL_NSOCKS_PERTHREAD", 1.0).min(64.0 / threads.max(1.0));
        let ch = setting(exp, "NCCL_NCHANNELS_PER_NET_PEER", 2.0);
        let chunk = setting(exp, "NCCL_P2P_NET_CHUNKSIZE", 131072.0) / 131072.0;
        let buff = setting(exp, "NCCL_BUFFSIZE", 4194304.0) / 4194304.0;
        let sockets = 2.7 * socks.powf(0.75);
        let pipeline = 4.2 + 1.2 * (ch - 1.0) * chunk.log2();
        let buffers = 4.4 + if chunk > 1.0 { 4.5 * buff.log2() } else { 0.0 };
        measured_at(
            exp,
            phase,
            started,
            sockets.min(pipeline).min(buffers).max(0.1),
        )
    }
}

const PLAN: &str = r#"
let base = experiment(#{ name: "nccl", transport: "nccl", memory: "cuda:0,0", sizes: ["256M"] });
let t = tune(base, #{
    NCCL_SOCKET_NTHREADS: ["default", 1, 2, 4, 8],
    NCCL_NSOCKS_PERTHREAD: ["default", 2, 4, 8],
    NCCL_NCHANNELS_PER_NET_PEER: ["default", 4, 8, 16],
    NCCL_P2P_NET_CHUNKSIZE: ["default", "512K", "1M", "2M", "4M"],
    NCCL_BUFFSIZE: ["default", "8M", "16M", "32M"],
}, #{ points: 60, seconds: 600, seed: 2, network: "socket" });
if t.winner == () { throw "no winner"; }
if t.gain.ratio < 3.0 { throw `gain ${t.gain.ratio}`; }
if t.points > 60 { throw "over budget"; }
"#;

#[test]
fn a_plans_tune_finds_what_only_pays_together_and_hands_it_over_untranslated() {
    let runner = Rc::new(RefCell::new(NcclModel {
        facts: facts(),
        seen: Vec::new(),
    }));
    let report = Plan::from_source("t", &plans_dir(), PLAN)
        .execute(runner.clone(), &targets(), Box::new(|_| {}))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        matches!(report.completion, tcpx_report::Completion::Complete),
        "{:?}",
        report.completion
    );
    let seen = &runner.borrow().seen;
    assert!(
        seen.len() <= 60 && seen.len() >= 20,
        "{} points",
        seen.len()
    );
    for e in seen {
        // NCCL reads its environment once per process: every point runs in fresh ones, pinned.
        assert!(e.bench.multi_process, "{}", e.name());
        assert_eq!(
            e.bench.env.get("NCCL_NET").map(String::as_str),
            Some("Socket")
        );
    }
    // One experiment per configuration: a configuration measured again is a repetition.
    let names: std::collections::BTreeSet<&str> = report
        .records
        .iter()
        .map(|r| r.experiment.as_str())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("tune-")), "{names:?}");
    assert!(
        report.records.iter().any(|r| r.rep > 1),
        "the race measured nothing twice"
    );
    let mut full = report.clone();
    full.summaries = tcpx_report::summarise(full.records.iter());
    let tuned = tcpx_report::tuned::Tuned::from_report(&full);
    let vars = tuned.pairs();
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("NCCL_NET").as_deref(), Some("Socket"), "{vars:?}");
    assert!(
        get("NCCL_P2P_NET_CHUNKSIZE").is_some() && get("NCCL_BUFFSIZE").is_some(),
        "the winner's own settings, as NCCL reads them: {vars:?}"
    );
    let why = &tuned.chosen.as_ref().expect("a choice").why;
    assert!(
        why.starts_with("tune: "),
        "tuned.env says how the search decided: {why}"
    );
    assert!(
        get("NCCL_MIN_NCHANNELS").is_none(),
        "no channel count translated onto collectives' variables: {vars:?}"
    );
}

#[test]
fn tune_refuses_spaces_and_budgets_it_cannot_run_at_the_plans_line() {
    let dry = |src: &str| {
        Plan::from_source("t", &plans_dir(), src)
            .estimate(&facts(), &targets())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let base = "let b = experiment(#{ transport: \"nccl\", memory: \"cuda:0,0\" });\n";
    for (body, says) in [
        (
            "tune(b, #{ LD_PRELOAD: [\"x\"] }, #{});",
            "`LD_PRELOAD` is neither a plan knob",
        ),
        (
            "tune(b, #{ NCCL_NSOCKS_PERTHREAD: [1, 16] }, #{ network: \"tcpx\" });",
            "1..=8",
        ),
        ("tune(b, #{ window: [0, 4] }, #{});", "window"),
        (
            "tune(b, #{ window: [4, 8] }, #{ pionts: 3 });",
            "unknown budget key `pionts`",
        ),
        ("tune(b, #{ window: [4, 8] }, #{ points: 1 });", "points"),
        (
            "tune(b, #{ window: [4, 8] }, #{ network: \"ib\" });",
            "unknown network",
        ),
        ("tune(b, #{}, #{});", "at least one knob"),
    ] {
        let e = dry(&format!("{base}{body}")).unwrap_err();
        assert!(e.contains(says) && e.contains("t.rhai:2:"), "{body}: {e}");
    }
    dry(&format!(
        "{base}let t = tune(b, #{{ window: [4, 8, 16] }}, #{{ points: 10 }});\nif !t.planned {{ throw \"dry\"; }}"
    ))
    .unwrap();
}
