//! `validate()` in a plan: the runner gets the run's tuned variables so far, and the criterion
//! is judged on the gain's interval (N/A with the runner's reason when it cannot run).

use std::cell::RefCell;
use std::rc::Rc;

use tcpx_plan::*;
use tcpx_report::Verdict;

mod common;
use common::plans_dir;

/// Measures `channels x 1 GB/s` (so more channels win beyond noise) and answers `validate`
/// with a fixed outcome, keeping the variables it was given.
struct Runner1 {
    facts: SystemFacts,
    answer: Validation,
    given: Rc<RefCell<Vec<(String, String)>>>,
}

impl Runner for Runner1 {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let ch = f64::from(exp.bench.channels);
        common::measured_at(exp, phase, started, ch)
    }
    fn validate(&mut self, tuned: &[(String, String)]) -> Validation {
        *self.given.borrow_mut() = tuned.to_vec();
        self.answer.clone()
    }
}

const PLAN: &str = r#"
let base = experiment(#{ sizes: ["1M"], iters: 1, warmup: 0, repeat: 3 });
let rs = compare([base.with_knobs(#{ name: "one", channels: 1 }), base.with_knobs(#{ name: "four", channels: 4 })]);
best(rs);
let g = validate();
"#;

fn run(answer: Validation) -> (tcpx_report::CriterionResult, Vec<(String, String)>) {
    let given = Rc::new(RefCell::new(Vec::new()));
    let runner = Rc::new(RefCell::new(Runner1 {
        facts: SystemFacts {
            cpus: 2,
            ..SystemFacts::default()
        },
        answer,
        given: given.clone(),
    }));
    let targets = TargetSet::load(&plans_dir().join("targets/loopback.toml")).unwrap();
    let report = Plan::from_source("v", &plans_dir(), PLAN)
        .execute(runner, &targets, Box::new(|_| {}))
        .unwrap();
    let c = report
        .criteria
        .iter()
        .find(|c| c.text.contains("NCCL's defaults"))
        .unwrap_or_else(|| panic!("{:?}", report.criteria))
        .clone();
    let given = given.borrow().clone();
    (c, given)
}

fn measured(gain: f64, lo: f64, hi: f64) -> Validation {
    Validation::Measured {
        gain,
        lo,
        hi,
        detail: "64M".into(),
    }
}

#[test]
fn the_runner_gets_the_winners_variables_and_the_interval_decides() {
    let (c, given) = run(measured(1.8, 1.7, 1.9));
    assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
    assert!(c.detail.contains("gain 1.800 [1.700, 1.900]"), "{c:?}");
    // Four channels won beyond noise: its variables went to the runner.
    assert!(
        given.contains(&("NCCL_NCHANNELS_PER_NET_PEER".to_string(), "4".to_string())),
        "{given:?}"
    );
    assert_eq!(run(measured(0.8, 0.7, 0.9)).0.verdict, Verdict::Fail);
    assert_eq!(
        run(measured(1.0, 0.9, 1.1)).0.verdict,
        Verdict::Inconclusive
    );
}

#[test]
fn a_runner_that_cannot_validate_gives_na_with_its_reason() {
    let (c, _) = run(Validation::NotAvailable("no libnccl here".into()));
    assert_eq!(c.verdict, Verdict::NotEvaluated);
    assert_eq!(c.detail, "no libnccl here");
}

#[test]
fn validate_counts_in_the_estimate_only_where_it_can_run() {
    let targets = TargetSet::load(&plans_dir().join("targets/loopback.toml")).unwrap();
    let plan = Plan::from_source("v", &plans_dir(), PLAN);
    let estimate = |facts: &SystemFacts| plan.estimate_with(facts, &targets, None).unwrap();
    let bare = SystemFacts {
        cpus: 2,
        ..SystemFacts::default()
    };
    let mut able = bare.clone();
    able.transports = vec!["socket".into(), "nccl".into()];
    able.gpus = vec![GpuFact::default(), GpuFact::default()];
    let mut one_gpu = able.clone();
    one_gpu.gpus.truncate(1);
    let (b, a, o) = (estimate(&bare), estimate(&able), estimate(&one_gpu));
    assert!(
        (a.seconds - b.seconds - VALIDATE_ESTIMATE_S).abs() < 1e-9,
        "{} vs {}",
        a.seconds,
        b.seconds
    );
    assert_eq!(o.seconds, b.seconds);
    assert_eq!(a.runs, b.runs, "validate() is not an experiment run");
}
