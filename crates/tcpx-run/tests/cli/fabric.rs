//! `tcpx-run fabric`: real namespaces, real veth pairs capped by tbf, real `tcpx-run bench`
//! processes inside them. Needs root and `ip netns` (CI has both); skipped visibly otherwise.
//! Each test has its own fabric id and state directory, and a guard that runs `fabric down`.

use crate::harness::{self, tcpx_run, RunWithDeadline as _};

use harness::{text, FabricGuard};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use tcpx_report::{stats, FigureStats};

fn namespaces() -> Vec<String> {
    let o = Command::new("ip")
        .args(["-j", "netns", "list"])
        .output_with_deadline()
        .unwrap();
    if o.stdout.iter().all(u8::is_ascii_whitespace) {
        return Vec::new();
    }
    let v: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    v.iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect()
}

fn status_of(f: &FabricGuard) -> Option<serde_json::Value> {
    let o = f.run(&["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let all: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    all.into_iter().find(|x| x["id"] == f.id)
}

/// None of the namespaces `gone` is left and `fabric status` no longer lists `f`.
#[track_caller]
fn assert_removed(f: &FabricGuard, gone: &[String]) {
    let ns = namespaces();
    assert!(gone.iter().all(|n| !ns.contains(n)), "{ns:?}");
    assert!(status_of(f).is_none());
}

/// `fabric up` of 2 NICs (and `extra`) that stops once its namespaces exist: the process and the
/// line it printed there.
fn paused_up(f: &FabricGuard, extra: &[&str]) -> (std::process::Child, String) {
    let args = [
        &[
            "up",
            "--id",
            f.id,
            "--nics",
            "2",
            "--test-pause-after-namespaces",
        ],
        extra,
    ]
    .concat();
    let mut up = f
        .cmd(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(up.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (up, line)
}

#[test]
fn a_killed_up_is_found_stale_by_status_doctor_and_topo_and_down_removes_it() {
    require_netns!("a_killed_up_is_found_stale_by_status_doctor_and_topo_and_down_removes_it");
    let f = FabricGuard::new("t-killed");
    let (mut up, line) = paused_up(&f, &[]);
    let paused: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(paused["paused"], "namespaces-added");
    // Killed half-way: no handler runs, the namespaces stay.
    up.kill().unwrap();
    up.wait().unwrap();
    assert!(namespaces().contains(&f.ns('a')));

    let st = status_of(&f).expect("the killed fabric is listed");
    assert_eq!(st["health"], "stale", "{st}");
    assert!(st["why"][0]
        .as_str()
        .unwrap()
        .contains("ended before finishing"));

    // doctor and topo name it (they read the state directory from the environment).
    let doctor = tcpx_run()
        .args(["doctor", "--json"])
        .env("TCPX_FABRIC_STATE_DIR", f.state.path())
        .run();
    let d: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let finding = d["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["check"] == "emulated fabric")
        .unwrap_or_else(|| panic!("doctor reports no stale fabric: {d}"));
    assert!(finding["detail"].as_str().unwrap().contains(f.id));
    assert_eq!(finding["status"], "warn");
    let topo = tcpx_run()
        .args(["topo", "--json", "--backend", "sysfs"])
        .env("TCPX_FABRIC_STATE_DIR", f.state.path())
        .run();
    assert!(topo.status.success(), "{}", text(&topo));
    let t: serde_json::Value = serde_json::from_slice(&topo.stdout).unwrap();
    assert!(
        t["stale_fabric"].as_str().unwrap().contains(f.id),
        "{}",
        t["stale_fabric"]
    );

    // A second up is refused and names what exists.
    let again = f.run(&["up", "--id", f.id, "--nics", "2"]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains(&f.ns('a')) && err.contains("fabric down --id t-killed"),
        "{err}"
    );

    let down = f.run(&["down", "--id", f.id]);
    assert!(down.status.success(), "{}", text(&down));
    assert_removed(&f, &[f.ns('a'), f.ns('b')]);
    assert!(!f.state.path().join(format!("{}.json", f.id)).exists());
}

#[test]
fn ctrl_c_during_up_removes_what_was_made() {
    require_netns!("ctrl_c_during_up_removes_what_was_made");
    let f = FabricGuard::new("t-sigint");
    let (mut up, line) = paused_up(&f, &[]);
    assert!(line.contains("namespaces-added"), "{line}");
    assert!(namespaces().contains(&f.ns('b')));
    // What Ctrl-C sends; then let `up` go on to its next step, where it sees the interrupt.
    let sig = Command::new("kill")
        .args(["-INT", &up.id().to_string()])
        .status()
        .unwrap();
    assert!(sig.success());
    {
        use std::io::Write;
        let mut stdin = up.stdin.take().unwrap();
        writeln!(stdin).unwrap();
    }
    let out = up.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{}",
        text(&out)
    );
    assert_removed(&f, &[f.ns('a'), f.ns('b')]);
}

#[test]
fn without_root_the_fabric_commands_refuse_and_change_nothing() {
    require_netns!("without_root_the_fabric_commands_refuse_and_change_nothing");
    let bin = harness::bin();
    // Dropping privileges needs setpriv and a binary the unprivileged user can run.
    let probe = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin,
            "--version",
        ])
        .output_with_deadline();
    match probe {
        Ok(o) if o.status.success() => {}
        other => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIP: without_root_the_fabric_commands_refuse_and_change_nothing: cannot run {bin} as uid 65534 via setpriv: {other:?}"
            );
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    // This test's own namespaces only: other tests bring their fabrics up and down meanwhile.
    let mine = || {
        namespaces()
            .into_iter()
            .filter(|n| n.ends_with("-t-noroot"))
            .collect::<Vec<_>>()
    };
    let before = mine();
    for args in [
        vec!["fabric", "up", "--id", "t-noroot", "--nics", "1"],
        vec!["fabric", "down", "--id", "t-noroot"],
    ] {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
            .args(&args)
            .arg("--state-dir")
            .arg(dir.path())
            .output_with_deadline()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("need root") && err.contains("65534"), "{err}");
    }
    assert_eq!(mine(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Receive-side GB/s (all timed iterations' bytes over their time) of one `bench` run over
/// `nics` of the fabric, and the client's output.
fn bench_gbs(f: &FabricGuard, nics: u32, port: u16) -> (f64, String) {
    let args = [
        "bench",
        "--size",
        "16M",
        "--iters",
        "8",
        "--warmup",
        "2",
        "--channels",
        "4",
        "--socks-per-channel",
        "1",
        "--verify",
        "off",
        "--no-csv",
        "--timeout",
        "60",
    ];
    let nics: Vec<u32> = (0..nics).collect();
    let stdout = f.bench(&args, &nics, port);
    let gbs = harness::recv_gbs(&stdout).unwrap_or_else(|| panic!("no JSON line in {stdout}"));
    (gbs, stdout)
}

/// Interleaved 1-NIC and 4-NIC runs; 7 a side give the ratio's bootstrap interval room to
/// shed a starved repetition.
const ROUNDS: u16 = 7;

/// Four NICs must carry at least this many times one: the roadmap's NIC scaling efficiency 0.8
/// (`nic_scaling_efficiency` of the target sets). The NICs run at 1 Gbit/s rather than the
/// target set's 2: four at 2 Gbit/s make 1 GB/s through debug-built sockets, which two cores
/// shared with parallel builds cannot always carry (measured at load 6-7: ratio 2.88, interval
/// [2.48, 3.07], the CPUs the bottleneck), while at 1 Gbit/s the NICs stay the bottleneck
/// (ratio 3.84, interval [3.70, 3.90] at load 7.7).
const SCALING_BAR: f64 = 3.2;

/// Nor more than this: four NICs cannot carry more than four times one (plus tbf's burst).
const SCALING_CEILING: f64 = 4.4;

/// Rounds at most, when the first ROUNDS leave the verdict INCONCLUSIVE.
const MAX_ROUNDS: u16 = 15;

#[test]
fn four_capped_nics_carry_about_four_times_one() {
    require_netns!("four_capped_nics_carry_about_four_times_one");
    let f = FabricGuard::up("t-scale", &["--nics", "4", "--rate", "1gbit", "--json"]);

    // Interleaved rounds, judged as a plan's criterion is (tcpx_report::stats): the ratio of the
    // medians with its bootstrap interval, PASS only when the whole interval clears the bar. A
    // run that loses the CPU for a while on a busy 2-core machine moves one repetition, not the
    // median. (Single iterations are no measure here: the sender runs a window ahead, so a
    // receive can find its bytes already queued.)
    // When the interval straddles the bar (INCONCLUSIVE: a burst of load from elsewhere), more
    // rounds narrow it, as a plan's `reps_to_settle` suggests, up to MAX_ROUNDS.
    let (mut one, mut four) = (Vec::new(), Vec::new());
    let mut round = 0u16;
    loop {
        let (g1, out1) = bench_gbs(&f, 1, 5401 + 2 * round);
        let (g4, out4) = bench_gbs(&f, 4, 5402 + 2 * round);
        assert!(out1.contains("flow 0: eth1,eth1,eth1,eth1"), "{out1}");
        assert!(out4.contains("flow 0: eth1,eth2,eth3,eth4"), "{out4}");
        one.push(g1);
        four.push(g4);
        round += 1;
        if round < ROUNDS {
            continue;
        }
        let r = stats::ratio_of_medians(&one, &four).unwrap();
        let settled = [
            stats::judge(r.lo, r.hi, ">=", SCALING_BAR),
            stats::judge(r.lo, r.hi, "<=", SCALING_CEILING),
        ]
        .iter()
        .all(|v| *v != Some(stats::Judgement::Inconclusive));
        if settled || round >= MAX_ROUNDS {
            break;
        }
    }
    let cap = 0.125; // 1 Gbit/s in GB/s
    let one_stats = FigureStats::of(&one).unwrap();
    let four_stats = FigureStats::of(&four).unwrap();
    let ratio = stats::ratio_of_medians(&one, &four).unwrap();
    let verdict = stats::judge(ratio.lo, ratio.hi, ">=", SCALING_BAR);
    let below_ceiling = stats::judge(ratio.lo, ratio.hi, "<=", SCALING_CEILING);
    eprintln!(
        "1 NIC: {} GB/s {one:.3?}\n4 NICs: {} GB/s {four:.3?}\nratio of medians {:.2} [{:.2}, {:.2}]: >= {SCALING_BAR} {verdict:?}, <= {SCALING_CEILING} {below_ceiling:?}",
        one_stats.text(3),
        four_stats.text(3),
        ratio.ratio,
        ratio.lo,
        ratio.hi
    );
    // The cap is real: one NIC cannot beat its 1 Gbit/s (tbf's 1 ms bucket is 125 KB of 16 MiB),
    // nor four NICs four times that.
    assert!(one_stats.median < cap * 1.1, "1 NIC at {one_stats:?}");
    assert!(
        four_stats.median < 4.0 * cap * 1.1,
        "4 NICs at {four_stats:?}"
    );
    // And four NICs carry about four times as much: the whole interval of the ratio between
    // the bar and the ceiling (PASS on both), not just its estimate.
    for (v, what) in [
        (verdict, format!(">= {SCALING_BAR}")),
        (below_ceiling, format!("<= {SCALING_CEILING}")),
    ] {
        assert_eq!(
            v,
            Some(stats::Judgement::Pass),
            "4 NICs vs 1: ratio of medians {:.2}, interval [{:.2}, {:.2}] not all {what}",
            ratio.ratio,
            ratio.lo,
            ratio.hi
        );
    }
}

#[test]
fn exec_runs_a_command_inside_a_node_and_passes_its_exit_status() {
    require_netns!("exec_runs_a_command_inside_a_node_and_passes_its_exit_status");
    let f = FabricGuard::up("t-exec", &["--nics", "2"]);
    let o = f.run(&[
        "exec", "b", "--id", f.id, "--", "ip", "-j", "addr", "show", "dev", "eth2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let links: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let addrs: Vec<&str> = links[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["local"].as_str())
        .collect();
    assert!(addrs.contains(&"10.231.1.2"), "{addrs:?}");
    let o = f.run(&["exec", "a", "--id", f.id, "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let none = f.run(&["exec", "a", "--id", "t-absent", "--", "true"]);
    assert_eq!(none.status.code(), Some(2), "{}", text(&none));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no fabric `t-absent`"));
}

#[test]
fn status_without_a_fabric_says_so() {
    require_netns!("status_without_a_fabric_says_so");
    let f = FabricGuard::new("t-none");
    assert!(status_of(&f).is_none());
    let o = f.run(&["down", "--id", f.id]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to remove"));
}

#[test]
fn a_killed_four_node_up_is_stale_and_down_removes_every_namespace() {
    require_netns!("a_killed_four_node_up_is_stale_and_down_removes_every_namespace");
    let f = FabricGuard::new("t-killed4");
    let (mut up, line) = paused_up(&f, &["--nodes", "4"]);
    assert!(line.contains("namespaces-added"), "{line}");
    up.kill().unwrap();
    up.wait().unwrap();
    let all = [f.ns('a'), f.ns('b'), f.ns('c'), f.ns('d'), f.switch_ns()];
    let ns = namespaces();
    assert!(all.iter().all(|n| ns.contains(n)), "{ns:?}");
    let st = status_of(&f).expect("the killed fabric is listed");
    assert_eq!(st["health"], "stale", "{st}");
    assert_eq!(st["state"]["nodes"], 4, "{st}");
    assert_eq!(
        st["namespaces_present"].as_array().unwrap().len(),
        5,
        "{st}"
    );

    let down = f.run(&["down", "--id", f.id]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        String::from_utf8_lossy(&down.stdout).contains(&f.switch_ns()),
        "{}",
        text(&down)
    );
    assert_removed(&f, &all);
    assert!(!f.state.path().join(format!("{}.json", f.id)).exists());
}

#[test]
fn a_four_node_fabric_comes_up_with_a_planted_fault_and_faults_are_set_and_cleared() {
    require_netns!(
        "a_four_node_fabric_comes_up_with_a_planted_fault_and_faults_are_set_and_cleared"
    );
    let f = FabricGuard::new("t-fault4");
    let up = f.run(&[
        "up",
        "--id",
        f.id,
        "--nodes",
        "4",
        "--nics",
        "2",
        "--rate",
        "1gbit",
        "--fault",
        "c:eth2:cap=250mbit",
        "--json",
    ]);
    assert!(up.status.success(), "{}", text(&up));
    let j: serde_json::Value = serde_json::from_slice(&up.stdout).unwrap();
    assert_eq!(j["nodes"].as_array().unwrap().len(), 4, "{j}");
    assert_eq!(j["nodes"][2]["namespace"], f.ns('c'));
    assert_eq!(j["nodes"][3]["nics"][1], "10.231.1.4");
    assert_eq!(j["state"]["switch_ns"], f.switch_ns());
    assert_eq!(j["state"]["faults"][0]["node"], "c", "{j}");

    // status: up, node C's eth2 capped both ways, the others at the fabric's rate.
    let st = status_of(&f).unwrap();
    assert_eq!(st["health"], "up", "{st}");
    let port = |st: &serde_json::Value, node: &str, nic: &str| {
        st["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == node && p["name"] == nic)
            .cloned()
            .unwrap_or_else(|| panic!("no {node} {nic}: {st}"))
    };
    let c2 = port(&st, "c", "eth2");
    assert_eq!(c2["rate_out"]["bits_per_s"], 250_000_000u64, "{c2}");
    assert_eq!(c2["rate_in"]["bits_per_s"], 250_000_000u64, "{c2}");
    assert_eq!(
        port(&st, "c", "eth1")["rate_out"]["bits_per_s"],
        1_000_000_000u64
    );
    let o = f.run(&["status"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("fault: node C eth2 capped at 250mbit"),
        "{}",
        text(&o)
    );

    // A NIC down and up again, the cap cleared.
    let o = f.run(&["fault", "--id", f.id, "d:eth1:down"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("fabric `{}`: set: node D eth1 down", f.id)
    );
    let st = status_of(&f).unwrap();
    assert_eq!(st["health"], "up", "{st}");
    assert_eq!(port(&st, "d", "eth1")["up"], false);
    let o = f.run(&["fault", "--id", f.id, "c:eth2:clear", "d:eth1:up", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let left: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(left, serde_json::json!([]));
    let st = status_of(&f).unwrap();
    assert_eq!(port(&st, "d", "eth1")["up"], true, "{st}");
    assert_eq!(
        port(&st, "c", "eth2")["rate_in"]["bits_per_s"],
        1_000_000_000u64
    );

    // Inside node C: its addresses, one per rail.
    let o = f.run(&[
        "exec", "c", "--id", f.id, "--", "ip", "-j", "addr", "show", "eth2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("10.231.1.3"));

    // Refused: a fault that does not parse, a node the fabric lacks, more nodes than 8.
    let bad = f.run(&["fault", "--id", f.id, "c:eth2:melt"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NODE:NIC:WHAT"));
    let absent = f.run(&["fault", "--id", f.id, "e:eth1:down"]);
    assert_eq!(absent.status.code(), Some(2), "{}", text(&absent));
    assert!(
        String::from_utf8_lossy(&absent.stderr).contains("has no node E eth1"),
        "{}",
        text(&absent)
    );
    let nine = f.run(&["up", "--id", "t-nine", "--nodes", "9"]);
    assert_eq!(nine.status.code(), Some(2), "{}", text(&nine));
    assert!(String::from_utf8_lossy(&nine.stderr).contains("give 2 to 8"));

    let down = f.run(&["down", "--id", f.id]);
    assert!(down.status.success(), "{}", text(&down));
    let ns = namespaces();
    assert!(ns.iter().all(|n| !n.ends_with("-t-fault4")), "{ns:?}");
}
