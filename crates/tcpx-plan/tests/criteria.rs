//! Typed criteria: `check(...)` and the criterion text are read into a `Check` where they enter
//! the API (bad ones refused at the call's file:line:column, in the dry pass too), and judged
//! the same whichever way the check was written. Also the old `.with(` method: refused, naming
//! `with_knobs`.

use std::cell::RefCell;
use std::rc::Rc;

use tcpx_plan::*;
use tcpx_report::Verdict;

mod common;
use common::{dry, facts, plans_dir, targets as loopback_targets};

fn dry_err(src: &str) -> String {
    dry(src).unwrap_err().to_string()
}

#[test]
fn bad_checks_are_refused_at_their_file_line_and_column() {
    for (src, at, says) in [
        (
            "let x = 1;\nlet c = check(\"servr\", \">\", 1.0);",
            "t.rhai:2:9:",
            "did you mean `server`",
        ),
        (
            "let c = check(\"server\", \"=>\", 1.0);",
            "t.rhai:1:9:",
            "comparison `=>`: use >, >=, <, <= or ==",
        ),
        (
            "let c = check(\"server\", \">\", 0.0 / 0.0);",
            "t.rhai:1:9:",
            "not a finite number",
        ),
        (
            "let c = check(\"server\", \">\", \"3\");",
            "t.rhai:1:9:",
            "the threshold must be a number",
        ),
        (
            "\n\n  let c = check(\"server > 3 us\");",
            "t.rhai:3:11:",
            "unit `us` does not fit metric `server_gbs`",
        ),
        (
            "let c = check(\"target: server > 9 GB/s\");",
            "t.rhai:1:9:",
            "is not `<metric> <op> <number> [unit]`",
        ),
        (
            // A check is refused where it is built, even when what it would judge did not run.
            "criterion(\"x\", check(\"p99\", \"<\", 1.0 / 0.0), ());",
            "t.rhai:1:16:",
            "not a finite number",
        ),
        (
            "criterion(check(\"server\", \">\", 1.0), 3.0);",
            "t.rhai:1:1:",
            "give a result map or ()",
        ),
        (
            "criterion(\"x\", 1.0, \"~\", 1.0);",
            "t.rhai:1:1:",
            "comparison `~`: use >, >=, <, <= or ==",
        ),
        (
            "holds((), \"=<\", 1.0);",
            "t.rhai:1:1:",
            "holds: comparison `=<`",
        ),
    ] {
        let e = dry_err(src);
        assert!(e.contains(at) && e.contains(says), "{src}: {e}");
    }
}

#[test]
fn the_string_form_is_still_read_as_a_check() {
    let e = dry_err("let b = experiment(#{});\nlet r = run(b);\ncriterion(\"servr > 3 GB/s\", r);");
    assert!(
        e.contains("t.rhai:3:1:") && e.contains("did you mean `server`"),
        "{e}"
    );
    // Not a map: any words, a condition.
    dry("criterion(\"target: anything at all\", ());").unwrap();
}

#[test]
fn checks_print_and_read_back() {
    dry(r#"
let c = check("server_per_gpu", ">=", 9);
if c.to_string() != "server_gbs_per_flow >= 9 GB/s" { throw c.to_string(); }
if c.metric != "server_gbs_per_flow" || c.op != ">=" || c.threshold != 9.0 { throw "fields"; }
let d = check(c.to_string());
if d.to_string() != c.to_string() { throw d.to_string(); }
if check("p99 < 5000").to_string() != "p99_us < 5000" { throw "no unit given, none shown"; }
"#)
    .unwrap();
}

#[test]
fn the_old_with_method_names_its_replacement() {
    let e = dry_err("let b = experiment(#{});\nlet w = b.with(#{ window: 8 });\n");
    assert!(e.contains("t.rhai:2:") && e.contains("with_knobs"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("old.rhai"),
        "fn wide(b) {\n    b.with(#{ channels: 4 })\n}\n",
    )
    .unwrap();
    let e = Plan::from_source("t", dir.path(), "import \"old\" as o;")
        .estimate(&facts(), &loopback_targets())
        .unwrap_err()
        .to_string();
    assert!(e.contains("old.rhai:2:") && e.contains("with_knobs"), "{e}");
}

/// Measures `window x 1 GB/s` on both sides, every repetition alike.
struct ByWindow {
    facts: SystemFacts,
}

impl Runner for ByWindow {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started: f64) -> RunOutcome {
        let w = f64::from(exp.bench.window_for(exp.bench.sizes[0]));
        common::measured_at(exp, phase, started, w)
    }
}

#[test]
fn a_check_judges_as_its_text_does() {
    let src = r#"
let r = run(experiment(#{ name: "w8", window: 8, repeat: 6 }));
criterion("server > 4 GB/s", r);
criterion(check("server", ">", 4), r);
criterion("per GPU above 4", check("server_per_gpu", ">", 4.0), r);
criterion("server > 16 GB/s", r);
criterion(check("server > 16 GB/s"), r);
criterion("p99 under 100 us", check("p99", "<", 100), r);
criterion("not run", check("server", ">", 1), ());
"#;
    let plan = Plan::from_source("t", &plans_dir(), src);
    let runner = Rc::new(RefCell::new(ByWindow { facts: facts() }));
    let report = plan
        .execute(runner, &loopback_targets(), Box::new(|_| {}))
        .unwrap();
    let got: Vec<(&str, Verdict)> = report
        .criteria
        .iter()
        .map(|c| (c.text.as_str(), c.verdict))
        .collect();
    assert_eq!(
        got,
        [
            ("server > 4 GB/s", Verdict::Pass),
            ("server_gbs > 4 GB/s", Verdict::Pass),
            ("per GPU above 4", Verdict::Pass),
            ("server > 16 GB/s", Verdict::Fail),
            ("server_gbs > 16 GB/s", Verdict::Fail),
            ("p99 under 100 us", Verdict::Fail),
            ("not run", Verdict::NotEvaluated),
        ]
    );
    // The same judgement whichever way it was written: figures, interval and detail alike.
    let (a, b) = (&report.criteria[0], &report.criteria[1]);
    assert_eq!(
        (a.actual, a.threshold, a.ci95_lo, a.ci95_hi, a.n, &a.detail),
        (b.actual, b.threshold, b.ci95_lo, b.ci95_hi, b.n, &b.detail)
    );
    assert_eq!(a.actual, Some(8.0));
    assert_eq!(report.criteria[6].threshold, Some(1.0));
}

#[test]
fn the_irq_matrix_judges_its_per_gpu_targets_on_a3_high() {
    // Its labels are not criterion texts ("target: ..."): a typed check carries the metric.
    let dir = plans_dir();
    let targets = TargetSet::load(&dir.join("targets/a3-high.toml")).unwrap();
    let plan = Plan::load(&dir.join("irq_matrix.rhai")).unwrap();
    let runner = Rc::new(RefCell::new(ByWindow { facts: facts() }));
    let report = plan.execute(runner, &targets, Box::new(|_| {})).unwrap();
    assert_eq!(report.completion, tcpx_report::Completion::Complete);
    for (label, threshold) in [("target: ", 9.0), ("stretch: ", 15.0)] {
        let c = report
            .criteria
            .iter()
            .find(|c| c.text.starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` criterion in {:?}", report.criteria));
        assert_eq!(c.threshold, Some(threshold), "{c:?}");
        assert!(
            matches!(c.verdict, Verdict::Pass | Verdict::Fail) && c.actual.is_some(),
            "judged on the best result's server_gbs_per_flow: {c:?}"
        );
    }
}
