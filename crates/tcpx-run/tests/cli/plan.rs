//! `tcpx-run plans/x.rhai` and `tcpx-run follow` as processes over loopback: a plan writes its
//! report directory, a failed criterion gives exit code 1, a budget asks for --yes, a bad plan
//! names file:line:column, and a follower that vanishes ends the run with exit code 2 and the
//! results so far kept.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{self, tcpx_run, RunWithDeadline as _};
use harness::{bin, plan_command, plan_dir, plans};

fn run_dirs(reports: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(reports)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn the_window_plan_runs_to_completion_and_writes_its_report() {
    let reports = tempfile::tempdir().unwrap();
    let out = plan_command(&plans().join("phase1_window.rhai"), reports.path())
        .arg("--targets")
        .arg("loopback")
        .output_with_deadline()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "{stdout}\n{stderr}"
    );
    let dirs = run_dirs(reports.path());
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let d = &dirs[0];
    assert!(d
        .file_name()
        .unwrap()
        .to_string_lossy()
        .ends_with("-phase1_window"));
    for f in [
        "index.html",
        "summary.md",
        "results.csv",
        "samples.csv",
        "report.json",
    ] {
        assert!(d.join(f).is_file(), "{f} missing");
    }
    let csv = std::fs::read_to_string(d.join("results.csv")).unwrap();
    assert!(
        csv.contains("not supported by this backend"),
        "window 64/128: {csv}"
    );
    assert!(
        csv.lines().filter(|l| l.contains(",ok,")).count() >= 4,
        "{csv}"
    );
    assert!(d.join("charts/bandwidth-over-window.png").is_file());
    assert!(stdout.contains("report: "), "{stdout}");
    // Issue 43: no experiment used a net plugin, so no word about the plugin's chunk.
    assert!(!stderr.contains("plugin chunk"), "{stderr}");
}

#[test]
fn a_failed_criterion_exits_1_and_a_bare_subcommand_works() {
    let (_d, p) = plan_dir(
        "fails",
        "let b = experiment(#{ sizes: [\"1M\"], iters: 2, warmup: 0 });\nlet r = run(b);\ncriterion(\"server > 1000000 GB/s\", r);\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let out = tcpx_run()
        .arg("plan")
        .arg(&p)
        .arg("--reports")
        .arg(reports.path())
        .run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("[FAIL] server > 1000000 GB/s"), "{stdout}");
    let md = std::fs::read_to_string(run_dirs(reports.path())[0].join("summary.md")).unwrap();
    assert!(md.contains("**FAIL**"), "{md}");
}

#[test]
fn bad_plans_and_budgets_stop_before_running_anything() {
    let (_d, p) = plan_dir(
        "bad",
        "let b = experiment(#{});\nrun(b.with_knobs(#{ windw: 32 }));\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let out = plan_command(&p, reports.path())
        .output_with_deadline()
        .unwrap();
    harness::assert_refused(&out, &["bad.rhai:2:", "did you mean `window`"]);
    assert!(
        run_dirs(reports.path()).is_empty(),
        "nothing ran, no report"
    );

    let out = tcpx_run()
        .arg(plans().join("phase1_chunk.rhai"))
        .args(["--budget", "0.01", "--reports"])
        .arg(reports.path())
        .run();
    harness::assert_refused(&out, &["--budget", "--yes"]);

    let out = tcpx_run()
        .arg(plans().join("phase1_chunk.rhai"))
        .arg("--dry-run")
        .run();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        5,
        "five chunk sizes"
    );
}

#[test]
fn a_follower_that_disappears_ends_the_run_with_results_kept() {
    let (_d, p) = plan_dir(
        "lost",
        "let b = experiment(#{ sizes: [\"1M\"], iters: 2, warmup: 0, sample: false });\nsweep(b, \"window\", [4, 8, 16]);\n",
    );
    let reports = tempfile::tempdir().unwrap();
    // The leader says where it waits; the follower connects there.
    let (mut leader, mut err, addr) = harness::spawn_leader(&p, &[], reports.path());
    let follower = Command::new(bin())
        .args(["follow", "--leader", &addr, "--fail-after", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(
        follower.code(),
        Some(101),
        "the follower aborted on purpose"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = leader.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{rest}");
    assert!(rest.contains("disappeared"), "{rest}");
    let dirs = run_dirs(reports.path());
    assert_eq!(dirs.len(), 1);
    let json = std::fs::read_to_string(dirs[0].join("report.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["completion"]["state"], "incomplete", "{json}");
    let records = report["records"].as_array().unwrap();
    assert_eq!(
        records[0]["status"], "ok",
        "the first experiment's result is kept"
    );
    assert_eq!(records[0]["experiment"], "base-window4");
}

#[test]
fn the_same_command_on_every_rank_leads_follows_or_exits_by_node_and_local_rank() {
    let (_d, p) = plan_dir(
        "ranks",
        "let b = experiment(#{ sizes: [\"1M\"], iters: 2, warmup: 0, sample: false });\nlet r = run(b);\ncriterion(\"server > 0.000001 GB/s\", r);\n",
    );
    let reports = tempfile::tempdir().unwrap();
    // A free port for the plan link (bound and released: the leader takes it next).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    // torchrun --nnodes 2 --nproc-per-node 2: ranks 0, 1 on node 0 and 2, 3 on node 1.
    let launch = |rank: u32| {
        let mut c = plan_command(&p, reports.path());
        c.env("RANK", rank.to_string())
            .env("LOCAL_RANK", (rank % 2).to_string())
            .env("GROUP_RANK", (rank / 2).to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("TCPX_PLAN_PORT", &port)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let leader = launch(0);
    let idle: Vec<_> = [1, 3].into_iter().map(launch).collect();
    let follower = launch(2);
    // Local rank 1 of each node exits at once, successfully, saying why.
    for (rank, p) in [1, 3].into_iter().zip(idle) {
        let o = p.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "rank {rank}: {err}");
        assert!(
            err.contains(&format!("rank {rank} is local rank 1 of node {}", rank / 2))
                && err.contains("only local rank 0 of each node takes part"),
            "{err}"
        );
    }
    let f = follower.wait_with_output().unwrap();
    let l = leader.wait_with_output().unwrap();
    let (lout, lerr) = (
        String::from_utf8_lossy(&l.stdout),
        String::from_utf8_lossy(&l.stderr),
    );
    assert_eq!(l.status.code(), Some(0), "{lout}\n{lerr}");
    assert!(f.status.success(), "{}", String::from_utf8_lossy(&f.stderr));
    assert!(
        String::from_utf8_lossy(&f.stderr).contains("rank 2 (torchrun) follows"),
        "{}",
        String::from_utf8_lossy(&f.stderr)
    );
    assert!(lout.contains("[PASS]"), "{lout}");
    assert_eq!(
        run_dirs(reports.path()).len(),
        1,
        "only the leader writes a report"
    );
}
