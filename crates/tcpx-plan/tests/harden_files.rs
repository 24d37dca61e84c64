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
    // A NaN value is not an error (it is N/A: tcpx-run's `cli::harden_files` runs one and reads the report).
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
}

#[test]
fn endless_or_huge_plan_files_and_imports_are_refused_naming_the_limit() {
    let e = Plan::load(Path::new("/dev/zero"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/dev/zero is a character device, not a regular file") && e.contains("a plan"),
        "{e}"
    );
    let e = TargetSet::load(Path::new("/dev/zero")).unwrap_err();
    assert!(e.contains("/dev/zero is a character device"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.rhai");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let e = Plan::load(&huge).err().unwrap().to_string();
    assert!(
        e.contains("huge.rhai is larger than 1 MiB (the limit for a plan)"),
        "{e}"
    );
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

/// `f()` on a thread, its answer within 20 s or a failure saying it hung.
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("it hung")
}

fn mkfifo(p: &Path) {
    assert!(std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .unwrap()
        .success());
}

/// Issue 43 item 3: a FIFO as the plan, a module or the target set hung in open() forever.
#[test]
fn fifos_as_plans_modules_and_target_sets_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("p.rhai");
    mkfifo(&fifo);
    let f = fifo.clone();
    let e = within_deadline(move || Plan::load(&f).err().map(|e| e.to_string())).unwrap();
    assert!(
        e.contains(&fifo.display().to_string()) && e.contains("FIFO"),
        "{e}"
    );
    let m = dir.path().join("m.rhai");
    mkfifo(&m);
    let d = dir.path().to_path_buf();
    let e = within_deadline(move || {
        Plan::from_source("t", &d, "import \"m\" as m;\n")
            .estimate(&facts(), &targets())
            .unwrap_err()
            .to_string()
    });
    assert!(e.contains("m.rhai is a FIFO"), "{e}");
    let t = dir.path().join("t.toml");
    mkfifo(&t);
    let t2 = t.clone();
    let e = within_deadline(move || TargetSet::load(&t2).unwrap_err());
    assert!(e.contains("t.toml is a FIFO"), "{e}");
    // Given as --targets: the FIFO is named, not taken for an unknown name ("did you mean").
    let d = dir.path().to_path_buf();
    let e = within_deadline(move || {
        tcpx_plan::choose_targets(&d, Some(t.to_str().unwrap()), &facts()).unwrap_err()
    });
    assert!(
        e.contains("t.toml is a FIFO") && !e.contains("did you mean"),
        "{e}"
    );
}

/// Issue 43 item 1: a module importing itself, a cycle of two and a plan importing itself
/// overflowed the stack (exit 134); each is refused at its `import`, with the chain.
#[test]
fn import_cycles_are_refused_at_the_import_not_by_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("selfish.rhai"), "import \"selfish\" as s;\n").unwrap();
    std::fs::write(d.join("a.rhai"), "fn f() { 1 }\nimport \"b\" as b;\n").unwrap();
    std::fs::write(d.join("b.rhai"), "import \"a\" as a;\n").unwrap();
    // A diamond is no cycle: both import c.
    std::fs::write(d.join("c.rhai"), "fn one() { 1 }\n").unwrap();
    std::fs::write(d.join("l.rhai"), "import \"c\" as c;\n").unwrap();
    std::fs::write(d.join("r.rhai"), "import \"c\" as c;\n").unwrap();
    // The runs happen on a thread of a small stack: a recursion would overflow it at once.
    let run = |name: &'static str, src: &'static str| {
        let d = d.to_path_buf();
        let t = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                Plan::from_source(name, &d, src)
                    .estimate(&facts(), &targets())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .unwrap();
        t.join().unwrap()
    };
    let e = run("p", "let x = 1;\nimport \"selfish\" as s;\nphase(\"x\");\n").unwrap_err();
    assert!(
        e.contains("p.rhai:2:8:")
            && e.contains("import cycle")
            && e.contains("p.rhai -> selfish.rhai -> selfish.rhai"),
        "{e}"
    );
    assert!(
        e.contains("`import \"selfish\"` at ") && e.contains("selfish.rhai:1:8"),
        "the cycle's own import is named: {e}"
    );
    assert!(
        !e.contains("Runtime error") && !e.contains("in module"),
        "one message, not Rhai's wrapping: {e}"
    );
    let e = run("p", "import \"a\" as a;\n").unwrap_err();
    assert!(
        e.contains("p.rhai:1:8:") && e.contains("p.rhai -> a.rhai -> b.rhai -> a.rhai"),
        "{e}"
    );
    let e = run("p", "import \"p\" as me;\n").unwrap_err();
    assert!(
        e.contains("p.rhai:1:8:") && e.contains("p.rhai -> p.rhai"),
        "{e}"
    );
    run(
        "p",
        "import \"l\" as l;\nimport \"r\" as r;\nimport \"c\" as c;\n",
    )
    .unwrap();
}
