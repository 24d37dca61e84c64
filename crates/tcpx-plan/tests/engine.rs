//! The plan engine: bad input gives clear messages with file:line:column, the sandbox holds,
//! budgets are enforced, every plan in plans/ checks out against both target sets, and a real
//! run over loopback (tcpx-bench in this process) records results, criteria and decisions.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tcpx_bench::BenchError;
use tcpx_plan::*;
use tcpx_report::{Completion, ResultRecord, SideFigures, Status, Verdict};

fn plans_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans")
}

fn loopback_targets() -> TargetSet {
    TargetSet::load(&plans_dir().join("targets/loopback.toml")).unwrap()
}

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
    Plan::from_source("t", &plans_dir(), src).estimate(&facts(), &loopback_targets())
}

fn dry_err(src: &str) -> String {
    dry(src).unwrap_err().to_string()
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let e = dry_err("let x = 1;\nlet y = (;\n");
    assert!(e.contains("t.rhai:2:"), "{e}");
    assert!(e.contains("syntax error"), "{e}");
}

#[test]
fn unknown_knobs_wrong_types_and_ranges_are_named() {
    let e = dry_err("let b = experiment(#{});\nlet e = b.with(#{ windw: 32 });\n");
    assert!(e.contains("t.rhai:2:"), "{e}");
    assert!(
        e.contains("unknown knob `windw`: did you mean `window`?"),
        "{e}"
    );
    let e = dry_err("experiment(#{ window: \"32\" });");
    assert!(
        e.contains("knob `window` wants a whole number, got text \"32\""),
        "{e}"
    );
    let e = dry_err("experiment(#{ channels: 0 });");
    assert!(
        e.contains("knob `channels` = 0 is out of range: 1..=64"),
        "{e}"
    );
    let e = dry_err("experiment(#{ chunk: \"3X\" });");
    assert!(e.contains("knob `chunk`"), "{e}");
    let e = dry_err("let b = experiment(#{});\nsweep(b, \"windows\", [1, 2]);");
    assert!(e.contains("did you mean `window`"), "{e}");
    let e = dry_err("let b = experiment(#{});\nb[\"chunkk\"]");
    assert!(e.contains("did you mean `chunk`"), "{e}");
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
    let e = dry_err("import \"../etc/passwd\" as p;");
    assert!(e.contains("only modules beside them"), "{e}");
    let e = dry_err("import \"/etc/passwd\" as p;");
    assert!(e.contains("only modules beside them"), "{e}");
    let e = dry_err("eval(\"1\")");
    assert!(e.contains("t.rhai:1:"), "{e}");
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
    let e = dry_err("chart(#{ kind: \"heatmap\", title: \"x\", x: \"chunk\" });");
    assert!(e.contains("heatmap needs x and y"), "{e}");
    let e = dry_err("chart(#{ kind: \"bar\", title: \"x\", metric: \"server_gb\" });");
    assert!(e.contains("did you mean `server_gbs`"), "{e}");
    let e = dry_err("chart(#{ kind: \"line\", title: \"x\", x: \"windw\" });");
    assert!(e.contains("did you mean `window`"), "{e}");
    let e = dry_err("target(\"dp1_gain_continu\")");
    assert!(e.contains("did you mean `dp1_gain_continue`"), "{e}");
    let e = dry_err("irq_state(\"eth1\")");
    assert!(e.contains("no NIC `eth1`") && e.contains("eth0"), "{e}");
    let e = dry_err("criterion(\"servr > 3 GB/s\", #{ status: \"ok\" })");
    assert!(e.contains("did you mean `server`"), "{e}");
    let e = dry_err("criterion(\"server > 3 us\", #{ status: \"ok\" })");
    assert!(e.contains("unit `us` does not fit"), "{e}");
    dry("let t = topology(); if t.cpus != 2 { throw \"cpus\"; } if nics()[0].driver != \"virtio_net\" { throw \"nic\"; }").unwrap();
}

#[test]
fn every_plan_checks_out_against_every_target_set() {
    let dir = plans_dir();
    let mut a3 = facts();
    a3.is_root = true;
    let sets = ["loopback", "a3-high"];
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
                assert!(
                    est.seconds < 60.0,
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

fn fig(s: &tcpx_bench::SideSummary) -> SideFigures {
    SideFigures {
        avg_us: s.avg_us,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        min_us: s.min_us,
        max_us: s.max_us,
        algbw_gbs: s.algbw_gbs,
        busbw_gbs: s.busbw_gbs,
        wrong_bytes: s.wrong_bytes,
    }
}

impl Runner for LocalRunner {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let base = ResultRecord {
            phase: phase.into(),
            experiment: exp.name(),
            label: exp.label(),
            knobs: exp.knobs.clone(),
            not_applied: Default::default(),
            status: Status::Ok,
            reason: None,
            size: None,
            chunk: None,
            send: None,
            recv: None,
            started_s: started,
            duration_s: 0.0,
            per_flow: Vec::new(),
            nic_plan: Default::default(),
        };
        let records = match tcpx_bench::run_local(
            &exp.bench(),
            "127.0.0.1:0".parse().unwrap(),
            &mut |_: &tcpx_bench::Measurement| {},
        ) {
            Ok(o) => o
                .measurements
                .iter()
                .map(|m| ResultRecord {
                    size: Some(m.size),
                    chunk: Some(m.chunk),
                    send: Some(fig(&m.send)),
                    recv: Some(fig(&m.recv)),
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
let b = experiment(#{ name: "b", sizes: ["1M"], iters: 3, warmup: 1, channels: 1, socks_per_channel: 1 });
let rs = sweep(b, "window", [8, 64]);
if rs[1].status != "skipped" { throw "window 64 should be skipped on the socket backend"; }
let r = rs[0];
let ok = criterion("server > 0.000001 GB/s", r);
let bad = criterion("server > 1000000 GB/s", r);
criterion("server > 1 GB/s", rs[1]);
not_evaluated("needs two NUMA nodes", "this machine has one");
if !ok || bad { throw "verdicts"; }
let g = gain(r, run(b.with(#{ window: 4 })));
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
    let src = "let b = experiment(#{ sizes: [\"256K\"], iters: 2, warmup: 0, channels: 1, socks_per_channel: 1, chunk: \"256K\" });\nrun(b);\nthrow \"boom\";";
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
