//! Hardening round 2 of the plan engine (issue 27): `matrix()` and `sweep()` take thousands
//! of configurations and refuse more than the documented limit at file:line:col before
//! building any of them; plan files and the modules they import are read with a bound;
//! NaN thresholds and a negative target-set noise are refused.

mod common;

use std::path::Path;

use tcpx_plan::*;

use common::{facts, plans_dir, targets};

/// `src` after a line defining `upto(n)` (the array 1..=n), dry-run: errors are at line + 1.
fn dry(src: &str) -> Result<Estimate, PlanError> {
    common::dry(&format!(
        "fn upto(n) {{ let a = []; for i in 1..=n {{ a.push(i); }} a }}\n{src}"
    ))
}

/// 2,000 configurations from one `matrix()` and 1,500 from one `sweep()`: Rhai's default
/// size limits stopped both at about 200 ("Size of object map too large").
#[test]
fn matrix_and_sweep_take_thousands_of_configurations() {
    let est = dry(
        "let b = experiment(#{ size: \"4K\", iters: 1, warmup: 0, repeat: 1 });\n\
         let rs = matrix(b, #{ window: upto(40), channels: upto(50) });\n\
         let s = sweep(b, \"window\", upto(1500));\n",
    )
    .unwrap();
    assert_eq!(est.experiments, 3500);
}

#[test]
fn a_matrix_beyond_the_limit_is_refused_at_its_call_before_it_is_built() {
    // 4.1 M combinations reached 17.7 GB in the dry pass.
    let e = dry("let b = experiment(#{ size: \"4K\" });\n\
         let v = upto(45);\n\
         let rs = matrix(b, #{ window: v, channels: v, socks_per_channel: v, chunk: v });\n")
    .unwrap_err()
    .to_string();
    assert!(e.contains("t.rhai:4:10"), "{e}");
    assert!(
        e.contains("4100625 combinations") && e.contains("10000"),
        "{e}"
    );
    let e = dry("let b = experiment(#{ size: \"4K\" });\n\
         sweep(b, \"window\", upto(10001));\n")
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.rhai:3:1:") && e.contains("10001 values"),
        "{e}"
    );
}

#[test]
fn a_plan_past_the_experiment_limit_of_a_plan_is_refused() {
    let e = dry(&format!(
        "let b = experiment(#{{ size: \"4K\" }});\n\
         for i in 0..11 {{ sweep(b, \"iters\", upto({})); }}\n",
        MAX_CONFIGURATIONS
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(&format!("past {MAX_PLAN_EXPERIMENTS} experiments")),
        "{e}"
    );
}

#[test]
fn nan_thresholds_are_refused_and_nan_values_are_not_judged() {
    for src in [
        "criterion(\"server > NaN GB/s\", run(experiment(#{ size: \"4K\" })));",
        "criterion(\"x\", 1.0, \">\", 0.0 / 0.0);",
        "holds(1.0, \">\", 1.0 / 0.0);",
    ] {
        let e = dry(src).unwrap_err().to_string();
        assert!(
            e.contains("t.rhai:2:") && e.contains("not a finite number"),
            "{src}: {e}"
        );
    }
    // A NaN value is not an error (it is N/A: harden_files_cli runs one and reads the report).
    dry("criterion(\"ratio > 1\", 0.0 / 0.0, \">\", 1.0);").unwrap();
}

#[test]
fn target_sets_with_a_noise_out_of_range_or_nan_thresholds_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(plans_dir().join("targets/loopback.toml")).unwrap();
    for (bad, says) in [
        ("noise = -5", "noise = -5 is out of range"),
        ("noise = 1.5", "noise = 1.5 is out of range"),
        ("noise = nan", "`noise` = NaN is not a finite number"),
    ] {
        let p = dir.path().join("t.toml");
        std::fs::write(&p, text.replace("noise = 0.25", bad)).unwrap();
        let e = TargetSet::load(&p).unwrap_err();
        assert!(e.contains(says) && e.contains("t.toml"), "{bad}: {e}");
    }
    let e = TargetSet::load(Path::new("/dev/zero")).unwrap_err();
    assert!(e.contains("/dev/zero is larger than 1 MiB"), "{e}");
}

#[test]
fn endless_or_huge_plan_files_and_imports_are_refused_naming_the_limit() {
    let e = Plan::load(Path::new("/dev/zero"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/dev/zero is larger than 1 MiB (the limit for a plan)"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("big.rhai"),
        vec![b' '; (MAX_PLAN_BYTES + 1) as usize],
    )
    .unwrap();
    let e = Plan::from_source("t", dir.path(), "import \"big\" as b;\n")
        .estimate(&facts(), &targets())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("larger than 1 MiB (the limit for a plan module)"),
        "{e}"
    );
}

#[test]
fn a_chart_id_that_cannot_name_a_file_is_refused_in_the_dry_pass() {
    for id in ["../x", "a b", "", "a/b", "x\ny"] {
        let e = dry(&format!(
            "let r = run(experiment(#{{ size: \"4K\" }}));\nchart(#{{ title: \"t\", kind: \"bar\", id: {id:?}, metric: \"server\", results: [r] }});\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("t.rhai:3:") && e.contains("may hold only letters"),
            "{id:?}: {e}"
        );
    }
}
