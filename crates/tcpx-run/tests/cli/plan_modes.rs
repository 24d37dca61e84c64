//! Plans that use `process_mode: "multi-process"` and `nics`, run as a user runs them: real
//! `tcpx-run` processes on loopback. One process per flow on each side with node figures in the
//! record, channels bound to the emulated NICs 127.0.0.2/.3, a flow process that dies failing its
//! experiment (named) while the plan goes on, and knob errors named before anything runs.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{self, tcpx_run, RunWithDeadline as _};
use harness::{plan_dir, plans};

/// The one run directory's report.json.
fn report(reports: &Path) -> Value {
    let dirs: Vec<PathBuf> = std::fs::read_dir(reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let text = std::fs::read_to_string(dirs[0].join("report.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn records<'a>(report: &'a Value, experiment: &str) -> Vec<&'a Value> {
    report["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["experiment"] == experiment)
        .collect()
}

fn run_plan(p: &Path, reports: &Path) -> (Option<i32>, String, String) {
    let out = harness::plan_command(p, reports)
        .args(["--targets", "loopback"])
        .output_with_deadline()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn multi_process_runs_one_process_per_flow_on_each_side_and_records_node_figures() {
    let (_d, p) = plan_dir(
        "mp",
        r#"let b = experiment(#{ sizes: ["1M", "2M"], iters: 3, warmup: 1, sample: false, flows: 2, channels: 1, repeat: 1 });
let m = run(b.with_knobs(#{ name: "mp", process_mode: "multi-process" }));
let s = run(b.with_knobs(#{ name: "sp", process_mode: "single-process" }));
criterion("multi-process ran", m.ok && !("process_mode" in m.not_applied) && m.per_flow.len() == 2);
criterion("single-process ran", s.ok && s.per_flow.len() == 2);
"#,
    );
    let reports = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_plan(&p, reports.path());
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let r = report(reports.path());
    let mp = records(&r, "mp");
    assert_eq!(mp.len(), 2, "one record per size: {mp:?}");
    let leader = std::process::id();
    for rec in &mp {
        assert_eq!(rec["status"], "ok", "{rec}");
        assert!(rec["not_applied"].get("process_mode").is_none(), "{rec}");
        let flows = rec["per_flow"].as_array().unwrap();
        assert_eq!(
            flows
                .iter()
                .map(|f| f["flow"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [0, 1]
        );
        // Each flow ran in its own process (its own pid, not the plan runner's), and each child's
        // receiver counted its own flow's bytes.
        let pids: Vec<u64> = flows.iter().map(|f| f["pid"].as_u64().unwrap()).collect();
        assert_ne!(pids[0], pids[1], "{rec}");
        assert!(!pids.contains(&u64::from(leader)));
        for f in flows {
            assert_eq!(f["wrong_bytes"], 0, "{rec}");
        }
        // Node figures: all flows' bytes over the wall-clock time any was transferring, as
        // tcpx_flows::figures::aggregate does: at most the flows' GB/s summed (reached
        // only when they ran side by side the whole time).
        for (side, key) in [("recv", "recv_gbs"), ("send", "send_gbs")] {
            let gbs: Vec<f64> = flows.iter().map(|f| f[key].as_f64().unwrap()).collect();
            let sum: f64 = gbs.iter().sum();
            let node = rec[side]["algbw_gbs"].as_f64().unwrap();
            assert!(
                node > 0.0 && node <= sum * (1.0 + 1e-9),
                "{side}: node {node} above the sum {sum}: {rec}"
            );
        }
        assert_eq!(rec["recv"]["wrong_bytes"], 0, "{rec}");
    }
    // Single process: per-flow figures from one process, none with a pid of its own.
    let sp = records(&r, "sp");
    assert_eq!(sp.len(), 2);
    for rec in &sp {
        assert_eq!(rec["status"], "ok", "{rec}");
        let flows = rec["per_flow"].as_array().unwrap();
        assert_eq!(flows.len(), 2, "{rec}");
        assert!(flows.iter().all(|f| f["pid"].is_null()), "{rec}");
    }
    assert!(stdout.contains("[PASS] multi-process ran"), "{stdout}");
}

#[test]
fn two_nics_on_loopback_put_the_channels_on_127_0_0_2_and_127_0_0_3_in_both_modes() {
    let (_d, p) = plan_dir(
        "nics",
        r#"let b = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, sample: false, flows: 2, channels: 2, nics: 2, repeat: 1 });
run(b.with_knobs(#{ name: "sp-2nic" }));
run(b.with_knobs(#{ name: "mp-2nic", process_mode: "multi-process" }));
run(b.with_knobs(#{ name: "sp-1nic", nics: 1, nic_policy: "closest-pci" }));
"#,
    );
    let reports = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_plan(&p, reports.path());
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let r = report(reports.path());
    let want = "flow 0: 127.0.0.2,127.0.0.3; flow 1: 127.0.0.2,127.0.0.3";
    for name in ["sp-2nic", "mp-2nic"] {
        let rec = records(&r, name)[0];
        assert_eq!(rec["status"], "ok", "{rec}");
        assert!(rec["not_applied"].get("nics").is_none(), "{rec}");
        assert_eq!(rec["nic_plan"]["leader"], want, "{rec}");
        assert_eq!(rec["nic_plan"]["follower"], want, "{rec}");
    }
    // One NIC: the default address, no placement; a policy then has nothing to act on.
    let one = records(&r, "sp-1nic")[0];
    assert_eq!(one["status"], "ok", "{one}");
    assert!(one.get("nic_plan").is_none(), "{one}");
    assert!(
        one["not_applied"]["nic_policy"]
            .as_str()
            .unwrap()
            .contains("no NICs are placed"),
        "{one}"
    );
    let csv = std::fs::read_to_string(
        std::fs::read_dir(reports.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("results.csv"),
    )
    .unwrap();
    assert!(csv.lines().next().unwrap().ends_with(",per_flow,nic_plan"));
    assert!(csv.contains(&format!("leader: {want}")), "{csv}");
}

/// Runs plan `p` as leader on 127.0.0.1 with `leader_args` and a `tcpx-run follow` process with
/// `follower_args`; returns the leader's exit code and stderr, and the follower's output.
fn leader_and_follower(
    p: &Path,
    reports: &Path,
    leader_args: &[&str],
    follower_args: &[&str],
) -> (Option<i32>, String, std::process::Output) {
    let (mut leader, mut err, addr) = harness::spawn_leader(p, leader_args, reports);
    let follower = tcpx_run()
        .args(["follow", "--leader", &addr])
        .args(follower_args)
        .run();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = leader.wait().unwrap();
    (status.code(), rest, follower)
}

const THREE_EXPERIMENTS: &str = r#"let b = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, sample: false, flows: 2, channels: 1, timeout_s: 20.0, repeat: 1 });
run(b.with_knobs(#{ name: "mp-first", process_mode: "multi-process" }));
run(b.with_knobs(#{ name: "mp-after", process_mode: "multi-process" }));
run(b.with_knobs(#{ name: "sp-after" }));
"#;

/// Runs `plan` as leader and follower with the given (test hook) arguments. Both must end well,
/// the experiment "mp-first" must have failed with a reason holding every `want`, and each of
/// `later` must have run. Returns the follower's stderr.
fn first_fails_rest_run(
    name: &str,
    plan: &str,
    leader_args: &[&str],
    follower_args: &[&str],
    want: &[&str],
    later: &[&str],
) -> String {
    let (_d, p) = plan_dir(name, plan);
    let reports = tempfile::tempdir().unwrap();
    let (code, stderr, follower) =
        leader_and_follower(&p, reports.path(), leader_args, follower_args);
    let ferr = String::from_utf8_lossy(&follower.stderr).into_owned();
    assert!(follower.status.success(), "{ferr}");
    assert_eq!(code, Some(0), "{stderr}");
    let r = report(reports.path());
    assert_eq!(r["completion"]["state"], "complete", "{r}");
    let first = records(&r, "mp-first");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0]["status"], "failed", "{}", first[0]);
    let reason = first[0]["reason"].as_str().unwrap();
    for w in want {
        assert!(reason.contains(w), "`{w}` missing from: {reason}");
    }
    for name in later {
        let recs = records(&r, name);
        assert_eq!(recs.len(), 1, "{name}");
        assert_eq!(recs[0]["status"], "ok", "{}", recs[0]);
    }
    ferr
}

#[test]
fn a_flow_process_that_dies_fails_its_experiment_by_name_and_the_plan_goes_on() {
    // Flow 0 of the first experiment is given far more iterations than it can finish before flow
    // 1 dies, so it is still running then and must be stopped: with 2 iterations it sometimes
    // ended on its own first, and the reason rightly said "none (all had ended)".
    let plan = THREE_EXPERIMENTS.replacen(
        r#"name: "mp-first","#,
        r#"name: "mp-first", iters: 1000000,"#,
        1,
    );
    assert_ne!(plan, THREE_EXPERIMENTS);
    // The follower's server process for flow 1 exits (status 3) once its client connected.
    let ferr = first_fails_rest_run(
        "dies",
        &plan,
        &[],
        &["--fail-flow", "1"],
        &[
            // The dead process, how it ended and the end of its error output.
            "flow 1 (server, pid",
            "exited with status 3",
            "test hook --test-exit-after-accept",
            // The other flow's process, stopped and named.
            "flow 0 (server, pid",
        ],
        &["mp-after", "sp-after"],
    );
    assert!(ferr.contains("served 3 experiments"), "{ferr}");
}

#[test]
fn a_flow_process_that_cannot_bind_its_port_says_so_instead_of_hanging() {
    // The leader's client for flow 1 finds nobody to connect to; it is stopped when the
    // follower's `Done` reports the failure (not after the 20 s timeout).
    // The follower keeps flow 1's reserved port bound: its server process cannot take it.
    first_fails_rest_run(
        "port",
        THREE_EXPERIMENTS,
        &[],
        &["--hold-port", "1"],
        &[
            "follower's server processes: flow 1 (server, pid",
            "is in use",
            // Flow 0's client saw its server stopped, or both were stopped on the
            // follower's news: either way the leader names its side.
            "leader's client processes: ",
        ],
        &["mp-after", "sp-after"],
    );
}

/// One flow per side, so the failing side's process is the only one and nothing else ends the
/// run: the other side's process would wait (its server for a client, its client retrying to
/// connect) until the 300 s timeout unless it is told. The reason says it was told.
const ONE_FLOW_THEN_ONE_MORE: &str = r#"let b = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, sample: false, flows: 1, channels: 1, timeout_s: 300.0, repeat: 1 });
run(b.with_knobs(#{ name: "mp-first", process_mode: "multi-process" }));
run(b.with_knobs(#{ name: "mp-after", process_mode: "multi-process" }));
"#;

#[test]
fn the_leader_stops_its_clients_when_the_follower_reports_its_processes_failed() {
    // The follower's server for flow 0 cannot bind its port: the leader's client would retry
    // connecting for 300 s.
    first_fails_rest_run(
        "told-leader",
        ONE_FLOW_THEN_ONE_MORE,
        &[],
        &["--hold-port", "0"],
        &[
            "leader's client processes: the follower's processes failed first",
            "stopped: flow 0 (client, pid",
            "follower: follower's server processes: flow 0 (server, pid",
            "is in use",
        ],
        &["mp-after"],
    );
}

#[test]
fn the_follower_stops_its_servers_when_the_leader_says_its_processes_failed() {
    // The leader's client for flow 0 exits before connecting: the follower's server would wait
    // 300 s for it.
    first_fails_rest_run(
        "told-follower",
        ONE_FLOW_THEN_ONE_MORE,
        &["--test-fail-client-flow", "0"],
        &[],
        &[
            "leader's client processes: flow 0 (client, pid",
            "exited with status 3: tcpx-run bench: test hook --test-exit-before-connect",
            "follower: follower's server processes: stopped at the leader's request (the leader's processes failed); stopped: flow 0 (server, pid",
        ],
        &["mp-after"],
    );
}

#[test]
fn bad_nic_policy_and_memory_values_are_named_before_anything_runs() {
    for (knob, value, want) in [
        (
            "nic_policy",
            "\"sideways\"",
            "knob `nic_policy` = \"sideways\" is out of range: one of round-robin, numa-local, closest-pci",
        ),
        (
            "memory",
            "\"cuda:1\"",
            "knob `memory` = \"cuda:1\" is out of range: memory `cuda:1`: use host, cuda",
        ),
        (
            "process_mode",
            "\"multi-proces\"",
            "did you mean \"multi-process\"",
        ),
    ] {
        let (_d, p) = plan_dir(
            "bad",
            &format!("let b = experiment(#{{}});\nrun(b.with_knobs(#{{ {knob}: {value} }}));\n"),
        );
        let reports = tempfile::tempdir().unwrap();
        let (code, stdout, stderr) = run_plan(&p, reports.path());
        assert_eq!(code, Some(2), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("bad.rhai:2:") && stderr.contains(want),
            "{knob}: {stderr}"
        );
        assert_eq!(
            std::fs::read_dir(reports.path()).unwrap().count(),
            0,
            "nothing ran"
        );
    }
}

#[test]
fn the_phase2_plan_compares_single_and_multi_process_at_each_nic_count() {
    let reports = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) =
        run_plan(&plans().join("phase2_single_process.rhai"), reports.path());
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let r = report(reports.path());
    for name in [
        "multi-process-1nic",
        "single-process-1nic",
        "multi-process-2nic",
        "single-process-2nic",
    ] {
        let recs = records(&r, name);
        assert!(!recs.is_empty(), "{name} ran");
        for rec in recs {
            assert_eq!(rec["status"], "ok", "{rec}");
            let na = &rec["not_applied"];
            assert!(
                na.get("process_mode").is_none() && na.get("nics").is_none(),
                "{rec}"
            );
            assert_eq!(rec["per_flow"].as_array().unwrap().len(), 2, "{rec}");
        }
    }
    let dir = std::fs::read_dir(reports.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(dir
        .join("charts/single-vs-multi-process-over-nics.png")
        .is_file());
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    // Loopback figures cannot decide NIC scaling or layouts: the criteria say why.
    assert!(
        md.contains("bandwidth scales with NICs") && md.contains("emulated NICs are addresses"),
        "{md}"
    );
    assert!(md.contains("1 NIC(s): single process"), "{md}");
    assert!(md.contains("one process per GPU, 2 NICs"), "{md}");
}

#[test]
fn a_multi_process_experiment_its_children_refuse_is_skipped_like_a_single_process_one() {
    let (_d, p) = plan_dir(
        "gpu",
        r#"let b = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, sample: false, flows: 1, channels: 1, memory: "cuda:0,1" });
run(b.with_knobs(#{ name: "gpu-sp" }));
run(b.with_knobs(#{ name: "gpu-mp", process_mode: "multi-process" }));
"#,
    );
    let reports = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = run_plan(&p, reports.path());
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let r = report(reports.path());
    let sp = records(&r, "gpu-sp")[0];
    if sp["status"] == "ok" {
        println!("SKIP: this machine has GPUs, so nothing refuses --memory cuda here");
        return;
    }
    assert_eq!(sp["status"], "skipped", "{sp}");
    let mp = records(&r, "gpu-mp")[0];
    assert_eq!(mp["status"], "skipped", "{mp}");
    let reason = mp["reason"].as_str().unwrap();
    assert!(
        reason.contains("flow 0 (client, pid") && reason.contains("invalid experiment"),
        "{reason}"
    );
}
