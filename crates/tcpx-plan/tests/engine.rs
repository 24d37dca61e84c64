//! The plan engine: bad input gives clear messages with file:line:column, the sandbox holds,
//! budgets are enforced, every plan in plans/ checks out against both target sets, and a real
//! run over loopback (tcpx-bench in this process) records results, criteria and decisions.

use std::cell::RefCell;
use std::rc::Rc;

use tcpx_bench::BenchError;
use tcpx_model::Knob;
use tcpx_plan::*;
use tcpx_report::sequential::StopReason;
use tcpx_report::{Completion, ResultRecord, SideFigures, Status, Verdict};

mod common;
use common::{plans_dir, targets as loopback_targets};

fn facts() -> SystemFacts {
    SystemFacts {
        cpus: 2,
        hostname: "test".into(),
        nics: vec![NicFact {
            name: "eth0".into(),
            driver: "virtio_net".into(),
            ..NicFact::default()
        }],
        ..SystemFacts::default()
    }
}

fn dry(src: &str) -> Result<Estimate, PlanError> {
    common::dry_on(&facts(), src)
}

fn dry_err(src: &str) -> String {
    dry(src).unwrap_err().to_string()
}

/// The dry pass of each source fails, its error containing each of the source's texts.
fn refused(cases: &[(&str, &[&str])]) {
    for (src, says) in cases {
        let e = dry_err(src);
        for text in *says {
            assert!(e.contains(text), "{src}: {e}");
        }
    }
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let e = dry_err("let x = 1;\nlet y = (;\n");
    assert!(e.contains("t.rhai:2:"), "{e}");
    assert!(e.contains("syntax error"), "{e}");
}

#[test]
fn unknown_knobs_wrong_types_and_ranges_are_named() {
    let e = dry_err("let b = experiment(#{});\nlet e = b.with_knobs(#{ windw: 32 });\n");
    assert!(e.contains("t.rhai:2:"), "{e}");
    assert!(
        e.contains("unknown knob `windw`: did you mean `window`?"),
        "{e}"
    );
    refused(&[
        (
            "experiment(#{ window: \"32\" });",
            &["knob `window` wants a whole number or \"auto\", got text \"32\""],
        ),
        (
            "experiment(#{ channels: 0 });",
            &["knob `channels` = 0 is out of range: 1..=64"],
        ),
        ("experiment(#{ chunk: \"3X\" });", &["knob `chunk`"]),
        (
            "let b = experiment(#{});\nsweep(b, \"windows\", [1, 2]);",
            &["did you mean `window`"],
        ),
        (
            "let b = experiment(#{});\nb[\"chunkk\"]",
            &["did you mean `chunk`"],
        ),
    ]);
}

#[test]
fn runaway_scripts_are_stopped() {
    let e = dry_err("let i = 0;\nloop { i += 1; }");
    assert!(e.contains("operation limit"), "{e}");
    let e = dry_err("fn f(n) { f(n + 1) }\nf(0);");
    assert!(e.contains("t.rhai:"), "{e}");
    assert!(
        e.to_lowercase().contains("stack") || e.contains("call"),
        "{e}"
    );
}

#[test]
fn the_sandbox_has_no_files_programs_or_eval() {
    refused(&[
        (
            "import \"../etc/passwd\" as p;",
            &["only modules beside them"],
        ),
        (
            "import \"/etc/passwd\" as p;",
            &["only modules beside them"],
        ),
        ("eval(\"1\")", &["t.rhai:1:"]),
    ]);
    for f in [
        "open_file(\"/etc/passwd\")",
        "system(\"ls\")",
        "read_file(\"x\")",
    ] {
        let e = dry_err(f);
        assert!(
            e.contains("not found") || e.contains("Function"),
            "{f}: {e}"
        );
    }
    // Importing the shared module beside the plan works.
    dry("import \"common\" as c;\nlet b = c::base(\"x\");").unwrap();
}

#[test]
fn budgets_ask_for_yes() {
    let plan = Plan::from_source(
        "t",
        &plans_dir(),
        "let b = experiment(#{ size: \"64M\", iters: 100 });\nsweep(b, \"window\", [1, 2, 4, 8]);",
    );
    let t = loopback_targets();
    let est = plan.estimate(&facts(), &t).unwrap();
    assert_eq!(est.experiments, 4);
    assert!(est.seconds > 50.0, "{est:?}");
    let e = plan
        .check_budget(&facts(), &t, Some(10.0), false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("more than --budget 10 s") && e.contains("--yes"),
        "{e}"
    );
    plan.check_budget(&facts(), &t, Some(10.0), true).unwrap();
    plan.check_budget(&facts(), &t, Some(1e6), false).unwrap();
    // The worst case: the sweep (a sequential comparison) at its 30 rounds instead of 3; a
    // single run() is not sequential.
    assert!(
        (est.worst_seconds / est.seconds - 30.0 / 3.0).abs() < 1e-9,
        "{est:?}"
    );
    let alone = Plan::from_source("t", &plans_dir(), "run(experiment(#{ size: \"64M\" }));")
        .estimate(&facts(), &t)
        .unwrap();
    assert_eq!(alone.worst_seconds, alone.seconds);
    // Criteria and decisions add rounds only within their comparison's most rounds: the worst
    // case is the same.
    let judged = Plan::from_source(
        "t",
        &plans_dir(),
        "let b = experiment(#{ size: \"64M\", iters: 100 });\nlet rs = sweep(b, \"window\", [1, 2, 4, 8]);\ncriterion(\"gain >= 20%\", gain_ci(rs[0], rs[3]), \">=\", 0.2);\ndecision(\"d\", \"q\", holds(gain_ci(rs[0], rs[1]), \">\", 0.1), \"y\", \"n\");",
    )
    .estimate(&facts(), &t)
    .unwrap();
    assert_eq!(
        (judged.seconds, judged.worst_seconds),
        (est.seconds, est.worst_seconds)
    );
}

#[test]
fn root_only_requests_without_root_say_so() {
    let e = dry_err("require_root(\"change IRQ affinity\");");
    assert!(
        e.contains("needs root to change IRQ affinity") && e.contains("sudo"),
        "{e}"
    );
    let mut f = facts();
    f.is_root = true;
    Plan::from_source("t", &plans_dir(), "require_root(\"x\");")
        .estimate(&f, &loopback_targets())
        .unwrap();
}

#[test]
fn charts_targets_and_system_queries_are_checked() {
    refused(&[
        (
            "chart(#{ kind: \"heatmap\", title: \"x\", x: \"chunk\" });",
            &["heatmap needs x and y"],
        ),
        (
            "chart(#{ kind: \"bar\", title: \"x\", metric: \"server_gb\" });",
            &["did you mean `server_gbs`"],
        ),
        (
            "chart(#{ kind: \"line\", title: \"x\", x: \"windw\" });",
            &["did you mean `window`"],
        ),
        (
            "target(\"dp1_gain_continu\")",
            &["did you mean `dp1_gain_continue`"],
        ),
        ("irq_state(\"eth1\")", &["no NIC `eth1`", "eth0"]),
        (
            "criterion(\"servr > 3 GB/s\", #{ status: \"ok\" })",
            &["did you mean `server`"],
        ),
        (
            "criterion(\"server > 3 us\", #{ status: \"ok\" })",
            &["unit `us` does not fit"],
        ),
    ]);
    dry("let t = topology(); if t.cpus != 2 { throw \"cpus\"; } if nics()[0].driver != \"virtio_net\" { throw \"nic\"; }").unwrap();
}

#[test]
fn every_plan_checks_out_against_every_target_set() {
    let dir = plans_dir();
    let mut a3 = facts();
    a3.is_root = true;
    let sets = ["loopback", "a3-high", "gpu-one"];
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_none_or(|e| e != "rhai") || p.file_stem().unwrap() == "common" {
            continue;
        }
        for s in sets {
            let t = TargetSet::load(&dir.join(format!("targets/{s}.toml"))).unwrap();
            let est = Plan::load(&p)
                .unwrap()
                .estimate(&a3, &t)
                .unwrap_or_else(|e| panic!("{} with {s}: {e}", p.display()));
            assert!(est.experiments >= 2, "{}: {est:?}", p.display());
            if s == "loopback" {
                // Three repetitions of everything and an A/A noise measurement.
                assert!(
                    est.seconds < 180.0,
                    "{} is quick on loopback: {est:?}",
                    p.display()
                );
            }
        }
        n += 1;
    }
    assert!(n >= 8, "the eight phase plans at least, found {n}");
}

/// Runs experiments for real with tcpx-bench over loopback in this process.
struct LocalRunner {
    facts: SystemFacts,
}

impl Runner for LocalRunner {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let base = exp.record(phase, started);
        let records = match tcpx_bench::run_local(
            &exp.bench_to_run(),
            "127.0.0.1:0".parse().unwrap(),
            &mut |_: &tcpx_bench::Measurement| {},
        ) {
            Ok(o) => o
                .measurements
                .iter()
                .map(|m| ResultRecord {
                    size: Some(m.size),
                    chunk: Some(m.chunk),
                    send: Some(m.send.figures()),
                    recv: Some(m.recv.figures()),
                    ..base.clone()
                })
                .collect(),
            Err(BenchError::Invalid(r)) => vec![ResultRecord {
                status: Status::Skipped,
                reason: Some(r),
                ..base
            }],
            Err(e) => vec![ResultRecord {
                status: Status::Failed,
                reason: Some(e.to_string()),
                ..base
            }],
        };
        RunOutcome {
            records,
            ..RunOutcome::default()
        }
    }
}

#[test]
fn a_real_run_records_results_criteria_decisions_and_charts() {
    let src = r#"
phase("P", "a test phase");
let b = experiment(#{ name: "b", sizes: ["1M"], iters: 3, warmup: 1, channels: 1, socks_per_channel: 1, repeat: 1 });
let rs = sweep(b, "window", [8, 64]);
if rs[1].status != "skipped" { throw "window 64 should be skipped on the socket backend"; }
let r = rs[0];
let ok = criterion("server > 0.000001 GB/s", r);
let bad = criterion("server > 1000000 GB/s", r);
criterion("server > 1 GB/s", rs[1]);
not_evaluated("needs two NUMA nodes", "this machine has one");
if !ok || bad { throw "verdicts"; }
let g = gain(r, run(b.with_knobs(#{ window: 4 })));
decision("DP", "faster?", g > 0.0, "go on", "stop");
chart(#{ kind: "line", title: "w", x: "window", results: rs });
"#;
    let plan = Plan::from_source("real", &plans_dir(), src);
    let updates = Rc::new(RefCell::new(0));
    let u = updates.clone();
    let runner = Rc::new(RefCell::new(LocalRunner { facts: facts() }));
    let report = plan
        .execute(
            runner,
            &loopback_targets(),
            Box::new(move |_| *u.borrow_mut() += 1),
        )
        .unwrap();
    assert_eq!(report.completion, Completion::Complete);
    assert_eq!(
        *updates.borrow(),
        3,
        "the report is handed out after every experiment"
    );
    let names: Vec<&str> = report
        .records
        .iter()
        .map(|r| r.experiment.as_str())
        .collect();
    assert_eq!(names, ["b-window8", "b-window64", "b-window4"]);
    assert_eq!(report.records[1].status, Status::Skipped);
    assert!(report.records[1]
        .reason
        .as_deref()
        .unwrap()
        .contains("32 requests in flight"));
    let verdicts: Vec<Verdict> = report.criteria.iter().map(|c| c.verdict).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Pass,
            Verdict::Fail,
            Verdict::NotEvaluated,
            Verdict::NotEvaluated
        ]
    );
    assert_eq!(report.criteria[3].detail, "this machine has one");
    assert!(
        report.criteria[2].detail.contains("skipped"),
        "{}",
        report.criteria[2].detail
    );
    assert_eq!(report.exit_code(), 1, "a failed criterion sets exit code 1");
    assert_eq!(report.decisions.len(), 1);
    let d = &report.decisions[0];
    assert_eq!(
        d.branch_taken,
        if d.answer == Some(true) {
            "go on"
        } else {
            "stop"
        }
    );
    assert_eq!(report.charts[0].experiments, ["b-window8", "b-window64"]);
    assert_eq!(report.phases[0].name, "P");
}

#[test]
fn a_script_error_after_experiments_keeps_them_and_marks_the_run_incomplete() {
    let src = "let b = experiment(#{ sizes: [\"256K\"], iters: 2, warmup: 0, channels: 1, socks_per_channel: 1, chunk: \"256K\", repeat: 1 });\nrun(b);\nthrow \"boom\";";
    let plan = Plan::from_source("err", &plans_dir(), src);
    let runner = Rc::new(RefCell::new(LocalRunner { facts: facts() }));
    let report = plan
        .execute(runner, &loopback_targets(), Box::new(|_| {}))
        .unwrap();
    assert_eq!(report.records.len(), 1);
    match &report.completion {
        Completion::Incomplete(e) => {
            assert!(e.contains("err.rhai:3:") && e.contains("boom"), "{e}")
        }
        c => panic!("{c:?}"),
    }
    assert_eq!(report.exit_code(), 2);
}

/// A runner whose figures are given per experiment and repetition: the engine's scheduling
/// and statistics are what these tests check (the real runner is tested end to end in
/// tcpx-run's plan tests).
struct FakeRunner {
    facts: SystemFacts,
    /// Experiment name -> server GB/s of each successive call.
    gbs: Vec<(&'static str, Vec<f64>)>,
    /// Knobs this runner "cannot apply", with the reason.
    not_applied: Vec<(Knob, &'static str)>,
    calls: Rc<RefCell<Vec<String>>>,
}

impl Runner for FakeRunner {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let name = exp.name();
        let seen = self.calls.borrow().iter().filter(|n| **n == name).count();
        self.calls.borrow_mut().push(name.clone());
        let key = name.trim_end_matches(['1', '2']);
        let key = key.strip_suffix("-aa").unwrap_or(&name);
        let gbs = self
            .gbs
            .iter()
            .find(|(n, _)| *n == name || *n == key)
            .map(|(_, v)| v[seen % v.len()])
            .unwrap_or(1.0);
        let side = |g: f64| SideFigures {
            avg_us: 1e3 / g,
            p50_us: 1e3 / g,
            p99_us: 1.2e3 / g,
            min_us: 0.9e3 / g,
            max_us: 1.3e3 / g,
            algbw_gbs: g,
            busbw_gbs: g,
            wrong_bytes: Some(0),
            iter_us: Vec::new(),
        };
        let not_applied = self
            .not_applied
            .iter()
            .filter(|(k, _)| {
                exp.knobs()
                    .get(k)
                    .and_then(|v| v.as_str())
                    .is_some_and(|v| v != "none")
            })
            .map(|(k, why)| (*k, why.to_string()))
            .collect();
        let failed = name == "E";
        RunOutcome {
            records: vec![ResultRecord {
                not_applied,
                status: if failed { Status::Failed } else { Status::Ok },
                reason: failed.then(|| "the follower's flow 1 died".to_string()),
                size: Some(1 << 20),
                chunk: Some(1 << 19),
                send: Some(side(gbs)),
                recv: Some(side(gbs)),
                duration_s: 0.01,
                ..exp.record(phase, started)
            }],
            ..RunOutcome::default()
        }
    }
}

fn fake_run(
    src: &str,
    gbs: Vec<(&'static str, Vec<f64>)>,
    not_applied: Vec<(Knob, &'static str)>,
) -> (tcpx_report::RunReport, Vec<String>) {
    fake_run_on(src, gbs, not_applied, loopback_targets())
}

/// Loopback targets whose comparisons may take at most `rounds` rounds.
fn targets_with(pairs: &[(&str, f64)], settings: &[(&str, &str)]) -> TargetSet {
    let mut t = loopback_targets();
    for (k, v) in pairs {
        t.thresholds.insert(k.to_string(), *v);
    }
    for (k, v) in settings {
        t.settings.insert(k.to_string(), serde_json::json!(v));
    }
    t
}

fn fake_run_on(
    src: &str,
    gbs: Vec<(&'static str, Vec<f64>)>,
    not_applied: Vec<(Knob, &'static str)>,
    targets: TargetSet,
) -> (tcpx_report::RunReport, Vec<String>) {
    let calls = Rc::new(RefCell::new(Vec::new()));
    let runner = Rc::new(RefCell::new(FakeRunner {
        facts: facts(),
        gbs,
        not_applied,
        calls: calls.clone(),
    }));
    let plan = Plan::from_source("fake", &plans_dir(), src);
    let report = plan.execute(runner, &targets, Box::new(|_| {})).unwrap();
    let c = calls.borrow().clone();
    (report, c)
}

#[test]
fn compared_configurations_run_their_repetitions_in_rotating_order() {
    let src = r#"
let b = experiment(#{ name: "x", repeat: 3 });
let rs = compare([b.with_knobs(#{ name: "A" }), b.with_knobs(#{ name: "B" }), b.with_knobs(#{ name: "C", repeat: 2 })]);
if rs[0].n != 3 || rs[2].n != 3 { throw `repetitions: ${rs[0].n} ${rs[2].n}`; }
if rs[1].reps.len() != 3 || rs[1].stats.server_gbs.reps.len() != 3 { throw "every repetition is kept"; }
let alone = run(b.with_knobs(#{ name: "D", repeat: 2 }));
let broken = compare([b.with_knobs(#{ name: "E" }), b.with_knobs(#{ name: "F" })]);
if broken[0].ok || broken[0].repeat != 1 || !broken[1].ok { throw `E fails once and ends: ${broken[0]}`; }
let swept = sweep(b.with_knobs(#{ repeat: 2 }), "window", [8, 16]);
"#;
    // At most 3 rounds a comparison: nothing can be decided, so no round is added.
    let (report, calls) = fake_run_on(
        src,
        vec![("A", vec![1.0, 2.0, 3.0]), ("B", vec![5.0, 4.0, 6.0])],
        vec![],
        targets_with(&[("max_rounds", 3.0)], &[]),
    );
    assert_eq!(report.completion, Completion::Complete, "{report:?}");
    assert_eq!(
        calls,
        [
            "A",
            "B",
            "C", // repetition 1
            "B",
            "C",
            "A", // 2: rotated by one
            "C",
            "A",
            "B", // 3: in a comparison every configuration runs every round
            "D",
            "D", // one configuration alone: back to back
            "E",
            "F",
            "F",
            "F", // E failed in its first repetition: not repeated
            "x-window8",
            "x-window16",
            "x-window16",
            "x-window8", // a sweep is a comparison
            "x-window8",
            "x-window16", // undecided after its 2 repetitions: a third round (max_rounds 3)
        ]
    );
    let reps: Vec<(&str, u32)> = report
        .records
        .iter()
        .map(|r| (r.experiment.as_str(), r.rep))
        .collect();
    assert_eq!(
        &reps[..8],
        [
            ("A", 1),
            ("B", 1),
            ("C", 1),
            ("B", 2),
            ("C", 2),
            ("A", 2),
            ("C", 3),
            ("A", 3)
        ]
    );
    // Each comparison says how many rounds it took and why it stopped.
    let seq = &report.sequential;
    assert_eq!(seq.len(), 3, "{seq:?}");
    assert_eq!((seq[0].rounds, seq[0].stop), (3, StopReason::Budget));
    assert!(seq[0].why.contains("its most rounds (3"), "{}", seq[0].why);
    assert_eq!(
        seq[1].stop,
        StopReason::CannotDecide,
        "E failed: {:?}",
        seq[1]
    );
    let s = tcpx_report::summarise(report.records.iter());
    let a = s.iter().find(|s| s.experiment == "A").unwrap();
    let f = &a.figures["server_gbs"];
    assert_eq!((f.n, f.median, f.min, f.max), (3, 2.0, 1.0, 3.0));
    assert_eq!(f.reps, [1.0, 2.0, 3.0], "in repetition order");
}

#[test]
fn best_names_a_winner_only_beyond_noise_and_lists_ties() {
    let src = r#"
let b = experiment(#{ name: "x", repeat: 3 });
let rs = compare([b.with_knobs(#{ name: "A", window: 8 }), b.with_knobs(#{ name: "B", window: 16 }), b.with_knobs(#{ name: "C", window: 32 })]);
let all = best(rs);
if all.name != "C" || !all.clear_winner || all.tied.len() != 0 { throw `C should win clearly: ${all}`; }
let ab = best([rs[0], rs[1]]);
if ab.clear_winner || ab.tied.len() != 1 { throw `A and B are tied: ${ab}`; }
let g = gain_ci(rs[0], rs[2]);
if !significant(g) { throw `A -> C is significant: ${g}`; }
if significant(gain_ci(rs[0], rs[1])) { throw "A -> B is within noise"; }
let self_gain = gain_ci(rs[0], rs[0]);
if self_gain.lo != 0.0 || self_gain.hi != 0.0 { throw `a result against itself: ${self_gain}`; }
criterion("C > A by at least 50%", g, ">=", 0.5);
criterion("server > 1.5 GB/s", rs[2]);
criterion("server > 2.05 GB/s", rs[2]);
criterion("server > 3 GB/s", rs[2]);
let answer = holds(gain_ci(rs[0], rs[1]), ">", 0.0);
if answer != () { throw `inconclusive gives (): ${answer}`; }
decision("DP", "did B help?", answer, "yes branch", "no branch");
"#;
    let (report, _) = fake_run(
        src,
        vec![
            ("A", vec![1.0, 1.01, 0.99]),
            ("B", vec![1.02, 1.0, 1.01]),
            ("C", vec![2.0, 2.1, 1.9]),
        ],
        vec![],
    );
    assert_eq!(report.completion, Completion::Complete, "{report:?}");
    let v: Vec<Verdict> = report.criteria.iter().map(|c| c.verdict).collect();
    assert_eq!(
        v,
        [
            Verdict::Pass,
            Verdict::Pass,
            Verdict::Inconclusive,
            Verdict::Fail
        ]
    );
    let inc = &report.criteria[2];
    // The comparison went on until it was decided: C ahead of both at round 10, the first look
    // of the sequential design (30 rounds at most).
    assert_eq!(
        (inc.ci95_lo, inc.ci95_hi, inc.n),
        (Some(1.9), Some(2.1), Some(10))
    );
    assert_eq!(&inc.figures[0].stats.reps[..3], [2.0, 2.1, 1.9]);
    let seq = &report.sequential[0];
    assert_eq!((seq.rounds, seq.stop), (10, StopReason::Decided), "{seq:?}");
    assert!(seq.method.contains("sign-test") && seq.method.contains("Bonferroni"));
    assert!(
        report.rankings[0].method.contains("sequential"),
        "{:?}",
        report.rankings[0]
    );
    let gain = &report.criteria[0];
    assert_eq!(gain.figures.len(), 2, "both sides' repetitions: {gain:?}");
    assert_eq!(report.rankings.len(), 2);
    assert!(
        report.rankings[0]
            .text
            .contains("ahead of every other configuration beyond noise"),
        "{}",
        report.rankings[0].text
    );
    assert!(
        report.rankings[1].text.contains("tied within noise"),
        "{}",
        report.rankings[1].text
    );
    let d = &report.decisions[0];
    assert_eq!((d.answer, d.branch_taken.as_str()), (None, "no branch"));
    assert!(
        d.detail.starts_with("UNANSWERED") && d.detail.contains("default branch: no branch"),
        "{}",
        d.detail
    );
    assert!(
        report
            .verdict_line()
            .contains("1 of 4 criteria failed, 1 inconclusive"),
        "{}",
        report.verdict_line()
    );
}

#[test]
fn a_knob_not_applied_makes_configurations_identical_and_unranked() {
    let src = r#"
let b = experiment(#{ name: "x", repeat: 3 });
let rs = compare([b.with_knobs(#{ name: "unpinned", thread_binding: "none" }), b.with_knobs(#{ name: "pinned", thread_binding: "numa-local" })]);
let w = best(rs);
if w.ranked { throw `not ranked: ${w}`; }
let g = gain_ci(rs[0], rs[1]);
if !g.identical || significant(g) { throw `identical: ${g}`; }
criterion("affinity gain >= 20%", g, ">=", 0.2);
"#;
    // Pinned "measures" 50 % faster: noise in an unapplied knob must still not rank it.
    let (report, _) = fake_run(
        src,
        vec![
            ("unpinned", vec![1.0, 1.0, 1.0]),
            ("pinned", vec![1.5, 1.5, 1.5]),
        ],
        vec![(Knob::ThreadBinding, "one NUMA node here")],
    );
    assert_eq!(report.completion, Completion::Complete, "{report:?}");
    assert_eq!(report.criteria[0].verdict, Verdict::NotEvaluated);
    assert!(
        report.criteria[0].detail.contains("same experiment here"),
        "{}",
        report.criteria[0].detail
    );
    assert!(!report.rankings[0].ranked);
    assert!(
        report.rankings[0].text.starts_with("not ranked:")
            && report.rankings[0]
                .text
                .contains("thread_binding not applied (one NUMA node here)"),
        "{}",
        report.rankings[0].text
    );
}

#[test]
fn measured_noise_replaces_the_default_and_a_stated_floor_raises_it() {
    let src = r#"
let b = experiment(#{ name: "base", repeat: 3 });
let before = noise();
let n = measure_noise(b);
if before != target("noise") { throw "without a measurement the target set's noise applies"; }
if noise() != n { throw "comparisons use the measured noise"; }
"#;
    // A/A arms 40 % apart: a spread above loopback's 25 % floor.
    let (report, calls) = fake_run(
        src,
        vec![
            ("base-aa1", vec![1.0, 1.0, 1.0]),
            ("base-aa2", vec![1.4, 1.4, 1.4]),
        ],
        vec![],
    );
    assert_eq!(report.completion, Completion::Complete, "{report:?}");
    // Twenty rounds at least (the sign-test interval at 95 % then leaves out five rounds at
    // each end), interleaved.
    assert_eq!(calls.len(), 40, "{calls:?}");
    assert_eq!(
        &calls[..4],
        ["base-aa1", "base-aa2", "base-aa2", "base-aa1"]
    );
    let n = report.noise.unwrap();
    assert!(
        (n.measured.unwrap() - 0.4).abs() < 1e-9 && n.used == n.measured.unwrap(),
        "{n:?}"
    );
    assert!(n.source.starts_with("measured by this run's A/A"), "{n:?}");
    assert!(
        n.detail.contains("20 rounds") && n.detail.contains("96%"),
        "{n:?}"
    );
    // The A/A runs are named, so tuned.env never recommends one.
    assert_eq!(n.runs, ["base-aa1", "base-aa2"]);

    // A quiet A/A (1 % apart) gives a narrow band; a target set may raise it, saying why.
    let quiet = vec![
        ("base-aa1", vec![1.0, 1.0, 1.0]),
        ("base-aa2", vec![1.01, 1.01, 1.01]),
    ];
    let (report, _) = fake_run(src, quiet.clone(), vec![]);
    let n = report.noise.unwrap();
    assert!((n.used - 0.01).abs() < 1e-9, "{n:?}");
    let raised = targets_with(
        &[("noise_floor", 0.05)],
        &[("noise_floor_why", "NIC firmware varies 5% between boots")],
    );
    let (report, _) = fake_run_on(src, quiet, vec![], raised);
    let n = report.noise.unwrap();
    assert_eq!((n.used, n.floor), (0.05, 0.05), "{n:?}");
    assert!(
        n.source.contains("target set floor 5.0%") && n.source.contains("firmware"),
        "{n:?}"
    );
}

#[test]
fn criteria_and_decisions_add_rounds_to_their_comparison_until_decided() {
    let src = r#"
let b = experiment(#{ name: "x", repeat: 3 });
let rs = compare([b.with_knobs(#{ name: "A", window: 8 }), b.with_knobs(#{ name: "B", window: 16 })]);
if rs[1].n != 10 { throw `the comparison itself stops at its first look: ${rs[1].n}`; }
let early = gain_ci(rs[0], rs[1]);
criterion("gain >= 20%", early, ">=", 0.2);
// The same (now stale) estimate again: settled by the rounds already added, none more.
criterion("gain >= 20% again", early, ">=", 0.2);
let g = gain_ci(rs[0], rs[1]);
if g.n != 17 { throw `later estimates see the added rounds: ${g.n}`; }
if best(rs).n != 17 { throw "best sees them too"; }
let cd = compare([b.with_knobs(#{ name: "C", window: 2 }), b.with_knobs(#{ name: "D", window: 4 })]);
let answer = holds(gain_ci(cd[0], cd[1]), ">=", 0.5);
if answer != () { throw `a gain whose rounds straddle 50% stays undecided: ${answer}`; }
decision("DP", "D at least 50% faster?", answer, "yes", "no");
"#;
    // B is 50 % faster but one round in ten only 10 %: against the 25 % noise band the
    // comparison decides at round 10 (its first look), while `gain >= 20%` still straddles
    // (the interval is [min, max] there) until the sign-test interval may leave out two rounds.
    // D is 30 % or 70 % faster by turns: decided against the band at round 10, never on 50 %.
    let b = [1.1, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5];
    let (report, calls) = fake_run(
        src,
        vec![
            ("A", vec![1.0]),
            ("B", b.to_vec()),
            ("C", vec![1.0]),
            ("D", vec![1.3, 1.7]),
        ],
        vec![],
    );
    assert_eq!(report.completion, Completion::Complete, "{report:?}");
    for c in &report.criteria {
        assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
        assert_eq!((c.n, c.ci95_lo), (Some(17), Some(0.5)), "{c:?}");
    }
    let seq = &report.sequential;
    assert_eq!(seq.len(), 4, "{seq:?}");
    assert_eq!((seq[0].rounds, seq[0].stop), (10, StopReason::Decided));
    assert_eq!((seq[1].rounds, seq[1].stop), (17, StopReason::Decided));
    assert!(
        seq[1].why.contains("criterion `gain >= 20%`") && seq[1].why.contains("7 rounds added"),
        "{}",
        seq[1].why
    );
    // The decision's `holds` on a gain whose interval straddles its threshold: rounds to the
    // comparison's budget, then UNANSWERED.
    assert_eq!((seq[2].rounds, seq[2].stop), (10, StopReason::Decided));
    assert_eq!((seq[3].rounds, seq[3].stop), (30, StopReason::Budget));
    assert!(
        seq[3].why.contains("holds(gain >= 0.5)") && seq[3].why.contains("its most rounds (30"),
        "{}",
        seq[3].why
    );
    assert_eq!(report.decisions[0].answer, None);
    // Rounds stay pairs: both configurations ran every round, in rotating order.
    assert_eq!(calls.len(), 2 * 17 + 2 * 30, "{calls:?}");
    assert_eq!(&calls[20..24], ["A", "B", "B", "A"]);
    let reps: Vec<u32> = report
        .records
        .iter()
        .filter(|r| r.experiment == "D")
        .map(|r| r.rep)
        .collect();
    assert_eq!(reps, (1..=30).collect::<Vec<u32>>());
}
