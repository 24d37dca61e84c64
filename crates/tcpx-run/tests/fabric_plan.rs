//! A plan run on the emulated fabric, end to end: `tcpx-run fabric up`, then the real
//! phase3_multi_nic plan with `--fabric` (leader re-executed in node A, follower started in node
//! B, flow processes in both), reduced by a target set written here (1 and 2 NICs at 1 Gbit/s,
//! one 4 MiB size, few iterations, one repetition). Checks that NIC scaling is judged from data
//! (not N/A), that the channels ran on the emulated NICs, and that no process is left in either
//! namespace and nothing of the fabric after `down`. Needs root and `ip netns` (CI has both);
//! skipped visibly otherwise.

mod common;

use std::process::{Command, Output};

fn skip_reason() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        return Some(format!("not root (euid {uid:?})"));
    }
    match Command::new("ip").args(["-j", "netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("`ip` not runnable: {e}")),
    }
}

/// The fabric of this test, in its own state directory; `fabric down` when dropped.
struct FabricGuard {
    id: &'static str,
    state: tempfile::TempDir,
}

impl FabricGuard {
    fn fabric(&self, args: &[&str]) -> Output {
        Command::new(common::bin())
            .arg("fabric")
            .arg(args[0])
            .arg("--state-dir")
            .arg(self.state.path())
            .args(&args[1..])
            .output()
            .unwrap()
    }
}

impl Drop for FabricGuard {
    fn drop(&mut self) {
        let _ = self.fabric(&["down", "--id", self.id]);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn netns_pids(ns: &str) -> String {
    let o = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn namespaces() -> String {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The emulated-a3 target set, reduced so the plan runs in seconds.
fn reduced_targets(dir: &std::path::Path) -> std::path::PathBuf {
    let src = std::fs::read_to_string(common::plans().join("targets/emulated-a3.toml")).unwrap();
    let mut out = String::new();
    for line in src.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        let line = match key {
            "sizes" => "sizes = [\"4M\"]",
            "iters" => "iters = 5",
            "warmup" => "warmup = 1",
            "nics" => "nics = [1, 2]",
            "gpus" => "gpus = 2",
            "fabric_nics" => "fabric_nics = 2",
            "fabric_rate_gbit" => "fabric_rate_gbit = 1.0",
            "nic_line_rate_gbs" => "nic_line_rate_gbs = 0.125",
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    assert!(
        out.contains("nics = [1, 2]"),
        "emulated-a3.toml changed shape:\n{out}"
    );
    let p = dir.join("targets/emulated-a3.toml");
    std::fs::write(&p, out).unwrap();
    p
}

#[test]
fn phase3_multi_nic_on_the_fabric_judges_nic_scaling_and_leaves_nothing_behind() {
    if let Some(why) = skip_reason() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIP: phase3_multi_nic_on_the_fabric_judges_nic_scaling_and_leaves_nothing_behind: {why}"
        );
        return;
    }
    let f = FabricGuard {
        id: "t-plan",
        state: tempfile::tempdir().unwrap(),
    };
    let up = f.fabric(&["up", "--id", f.id, "--nics", "2", "--rate", "1gbit"]);
    assert!(up.status.success(), "{}", text(&up));

    let plan_src = std::fs::read_to_string(common::plans().join("phase3_multi_nic.rhai")).unwrap();
    let (dir, plan) = common::plan_dir("phase3_multi_nic", &plan_src);
    let targets = reduced_targets(dir.path());
    let reports = dir.path().join("reports");
    let run = Command::new(common::bin())
        .arg("plan")
        .arg(&plan)
        .arg("--targets")
        .arg(&targets)
        .args(["--fabric", f.id, "--follower-timeout", "60", "--yes"])
        .arg("--reports")
        .arg(&reports)
        .env("TCPX_FABRIC_STATE_DIR", f.state.path())
        .output()
        .unwrap();
    let out = text(&run);
    // 0: all criteria pass, 1: some fail (a loaded machine may scale less); never 2.
    assert!(matches!(run.status.code(), Some(0 | 1)), "{out}");
    assert!(out.contains("follower in node B (tcpx-b-t-plan)"), "{out}");

    // Nothing of the run is left inside either node.
    assert_eq!(netns_pids("tcpx-a-t-plan"), "", "processes left in node A");
    assert_eq!(netns_pids("tcpx-b-t-plan"), "", "processes left in node B");

    let run_dir = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .expect("a report directory")
        .unwrap()
        .path();
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("report.json")).unwrap()).unwrap();
    let criteria = report["criteria"].as_array().unwrap();
    let scaling: Vec<&serde_json::Value> = criteria
        .iter()
        .filter(|c| c["text"].as_str().unwrap_or("").contains("NICs give"))
        .collect();
    assert_eq!(scaling.len(), 1, "{criteria:#?}");
    let verdict = scaling[0]["verdict"].as_str().unwrap();
    assert!(
        ["pass", "fail", "inconclusive"].contains(&verdict),
        "NIC scaling was not judged from data: {:#}\n{out}",
        scaling[0]
    );
    // Two NICs at 1 Gbit/s each carry clearly more than one: a run whose channels shared one
    // veth (or loopback) would gain nothing.
    let gain = scaling[0]["actual"].as_f64().unwrap();
    assert!(
        gain > 0.3,
        "2 NICs gained only {gain:.2} over 1: {:#}",
        scaling[0]
    );
    let absolute: Vec<_> = criteria
        .iter()
        .filter(|c| c["text"].as_str().unwrap_or("").starts_with("absolute A3"))
        .collect();
    assert_eq!(absolute.len(), 1, "{criteria:#?}");
    assert_eq!(absolute[0]["verdict"], "not_evaluated");
    assert!(absolute[0]["detail"].as_str().unwrap().contains("emulated"));
    assert!(
        report["notes"]
            .to_string()
            .contains("not covered by the emulated fabric"),
        "{:#}",
        report["notes"]
    );
    assert_eq!(
        report["setup"]["fabric"]
            .as_str()
            .map(|s| s.contains("emulated")),
        Some(true)
    );
    let results = report["records"].as_array().unwrap();
    let ok: Vec<_> = results.iter().filter(|r| r["status"] == "ok").collect();
    assert!(ok.len() >= 4, "{results:#?}");
    let plans =
        serde_json::to_string(&ok.iter().map(|r| &r["nic_plan"]).collect::<Vec<_>>()).unwrap();
    assert!(
        plans.contains("eth2"),
        "channels did not use the emulated NICs: {plans}"
    );

    // The bandwidth-over-NICs chart draws the line-rate ceiling the NICs allow.
    let svgs: Vec<String> = std::fs::read_dir(run_dir.join("charts"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        svgs.iter().any(|s| s.contains("line-rate ceiling")),
        "no chart shows the line-rate ceiling ({} SVGs)",
        svgs.len()
    );

    let down = f.fabric(&["down", "--id", f.id]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(!namespaces().contains("t-plan"), "{}", namespaces());
    assert!(std::fs::read_dir(f.state.path()).unwrap().next().is_none());
}

/// Polls `f` until it holds or `limit` passes; whether it held.
fn eventually(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn killing_the_plan_command_stops_the_leader_follower_and_flows_in_both_nodes() {
    if let Some(why) = skip_reason() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIP: killing_the_plan_command_stops_the_leader_follower_and_flows_in_both_nodes: {why}"
        );
        return;
    }
    let f = FabricGuard {
        id: "t-kill",
        state: tempfile::tempdir().unwrap(),
    };
    let up = f.fabric(&["up", "--id", f.id, "--nics", "2", "--rate", "100mbit"]);
    assert!(up.status.success(), "{}", text(&up));
    let plan_src = std::fs::read_to_string(common::plans().join("phase3_multi_nic.rhai")).unwrap();
    let (dir, plan) = common::plan_dir("phase3_multi_nic", &plan_src);
    let targets = reduced_targets(dir.path());
    // Slow enough (100 Mbit/s, 16 MiB) that the run is still going when it is killed.
    let slow = std::fs::read_to_string(&targets)
        .unwrap()
        .replace("sizes = [\"4M\"]", "sizes = [\"16M\"]");
    std::fs::write(&targets, slow).unwrap();
    let mut run = Command::new(common::bin())
        .arg("plan")
        .arg(&plan)
        .arg("--targets")
        .arg(&targets)
        .args(["--fabric", f.id, "--yes"])
        .arg("--reports")
        .arg(dir.path().join("reports"))
        .env("TCPX_FABRIC_STATE_DIR", f.state.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let both_busy = eventually(std::time::Duration::from_secs(60), || {
        !netns_pids("tcpx-a-t-kill").is_empty() && !netns_pids("tcpx-b-t-kill").is_empty()
    });
    assert!(both_busy, "the leader and follower never ran in the fabric");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = run.wait();
    let gone = eventually(std::time::Duration::from_secs(20), || {
        netns_pids("tcpx-a-t-kill").is_empty() && netns_pids("tcpx-b-t-kill").is_empty()
    });
    assert!(
        gone,
        "left behind: node A [{}], node B [{}]",
        netns_pids("tcpx-a-t-kill"),
        netns_pids("tcpx-b-t-kill")
    );
}
