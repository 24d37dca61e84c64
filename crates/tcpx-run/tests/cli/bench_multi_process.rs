//! `tcpx-run bench --multi-process` as a user runs it: real child processes on loopback, per-GPU
//! and per-node figures, and the faults (a flow count that differs between the nodes, a child
//! killed mid-run) reported by name.

use crate::harness::{self, RunWithDeadline as _};

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bench(args: &[&str]) -> Command {
    let mut c = Command::new(harness::bin());
    c.arg("bench").args(args);
    if !args.contains(&"--iters") {
        c.args(["--iters", "3"]);
    }
    c.args([
        "--no-csv",
        "--size",
        "1M",
        "--warmup",
        "1",
        "--channels",
        "2",
        "--socks-per-channel",
        "1",
        "--timeout",
        "15",
    ]);
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Runs a `--multi-process` server on `port` (in the background) and a client against it, each
/// with its own extra arguments; returns the client's and then the server's output.
fn multi_process_pair(port: &str, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    let server_role = [
        "--role",
        "server",
        "--multi-process",
        "--peer",
        "127.0.0.1",
        "--port",
        port,
    ];
    let server = bench(&[&server_role[..], server_args].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let peer = format!("127.0.0.1:{port}");
    let client_role = ["--role", "client", "--multi-process", "--peer", &peer];
    let client = bench(&[&client_role[..], client_args].concat())
        .output_with_deadline()
        .unwrap();
    (client, server.wait_with_output().unwrap())
}

#[test]
fn two_nodes_of_two_flows_each_report_per_gpu_and_per_node_figures() {
    let port = harness::free_ports(2).to_string();
    let (client, server) = multi_process_pair(
        &port,
        &["--flows", "2", "--nics", "127.0.0.2,127.0.0.3"],
        &["--flows", "2", "--nics", "127.0.0.4"],
    );
    for (who, o) in [("client", &client), ("server", &server)] {
        let (out, err) = text(o);
        assert!(o.status.success(), "{who} failed:\n{out}\n{err}");
        assert!(
            out.contains("per-GPU and per-node bandwidth (multi-process"),
            "{out}"
        );
        // Figure lines: `#  <size> <flow|node> <send> <recv> <wrong>`.
        let figure = |l: &str, what: &str| {
            let t: Vec<&str> = l.split_whitespace().collect();
            t.len() == 6 && t[0] == "#" && t[1] == "1048576" && t[2] == what
        };
        let node = out
            .lines()
            .find(|l| figure(l, "node"))
            .unwrap_or_else(|| panic!("{who}: no node line in\n{out}"));
        assert!(node.trim_end().ends_with(" 0"), "no wrong bytes: {node}");
        for flow in ["0", "1"] {
            assert!(
                out.lines().any(|l| figure(l, flow)),
                "{who}: flow {flow} missing:\n{out}"
            );
        }
    }
}

#[test]
fn a_different_flow_count_on_the_other_node_is_refused_with_both_values() {
    let port = harness::free_ports(3).to_string();
    let (client, server) = multi_process_pair(&port, &["--flows", "2"], &["--flows", "3"]);
    let (_, cerr) = text(&client);
    let (_, serr) = text(&server);
    assert!(!client.status.success() && !server.status.success());
    assert!(cerr.contains("flows: 2 vs 3"), "client:\n{cerr}");
    assert!(serr.contains("flows: 2 vs 3"), "server:\n{serr}");
}

/// Child processes of `parent` (from /proc/<pid>/stat's ppid field).
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

#[test]
fn a_killed_flow_process_stops_the_rest_and_is_named() {
    let port = harness::free_ports(2).to_string();
    let parent = bench(&[
        "--role",
        "local",
        "--multi-process",
        "--flows",
        "2",
        "--port",
        &port,
        "--iters",
        "1000000",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait (bounded) until all four children (2 flows x server/client) run, then kill one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        let kids = children_of(parent.id());
        if kids.len() == 4 {
            break kids[0];
        }
        if Instant::now() >= deadline || kids.len() > 4 {
            let out = parent.wait_with_output().unwrap();
            panic!("children did not start: {kids:?}\n{:?}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let started = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let out = parent.wait_with_output().unwrap();
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("pid {victim}) was killed by signal 9")),
        "the killed process is named:\n{err}"
    );
    assert!(err.contains("stopped the others"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(14),
        "the rest stopped promptly, not after the 15 s progress timeout"
    );
    assert!(
        children_of(std::process::id()).iter().all(|&p| p != victim),
        "no child left behind"
    );
}

#[test]
fn single_process_binds_channels_to_named_nics_and_prints_per_gpu_figures() {
    let out = bench(&[
        "--role",
        "local",
        "--flows",
        "2",
        "--nics",
        "127.0.0.2,127.0.0.3",
        "--nic-policy",
        "explicit",
    ])
    .output_with_deadline()
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("# nics 127.0.0.2,127.0.0.3  policy explicit"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "# channels on NICs: flow 0: 127.0.0.2,127.0.0.3; flow 1: 127.0.0.2,127.0.0.3"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("per-GPU and per-node bandwidth (single process"),
        "{stdout}"
    );
}

#[test]
fn a_missing_nic_or_an_empty_explicit_list_is_a_clear_error() {
    let out = bench(&["--role", "local", "--nics", "tcpx-no-such-if0"])
        .output_with_deadline()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("NIC `tcpx-no-such-if0` does not exist here") && err.contains("ip addr"),
        "{err}"
    );
    let out = bench(&["--role", "local", "--nic-policy", "explicit"])
        .output_with_deadline()
        .unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--nic-policy explicit needs --nics"), "{err}");
}
