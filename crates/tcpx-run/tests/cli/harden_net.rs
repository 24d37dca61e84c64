//! Hardening of everything the tool exposes to the network, round 2 (issue 27): stray and
//! hostile connections on every port it listens on (the plan port, the bench control port), the
//! run token between leader and follower, out-of-range durations at every boundary (flags,
//! variables, the link), malformed HOST:PORT strings, and the two-node bench and plan across
//! the nodes of an emulated fabric (namespaces the test makes itself; skipped visibly without
//! root). Everything else runs on 127.0.0.1; every wait ends with a process's own deadline.

use crate::harness::{self, tcpx_run, RunWithDeadline as _};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::time::{Duration, Instant};

use harness::{bin, plan_dir, text, FabricGuard};
use tcpx_link::auth::RunToken;
use tcpx_link::{Link, LinkMsg};
use tcpx_orchestrate::proto::{Action, Credentials, Event, Follower};

const TOKEN: &str = "test-run-token-0123456789";

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A file holding the test's run token.
fn token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("token");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    p
}

/// A plan of one small experiment that runs (not skipped), with the target sets next to it;
/// its criterion passes on any machine.
fn tiny_plan() -> (tempfile::TempDir, std::path::PathBuf) {
    plan_dir(
        "tiny",
        "let b = experiment(#{ sizes: [\"1M\"], iters: 2, warmup: 0, sample: false });\nlet r = run(b);\ncriterion(\"server > 0.000001 GB/s\", r);\n",
    )
}

/// Reads `err` line by line until one contains `what`; every line read so far. Panics with
/// them when the stream ends first (the process exited: its own deadline is the test's).
fn wait_for_line(err: &mut BufReader<ChildStderr>, what: &str, seen: &mut String) {
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("never printed `{what}`:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains(what) {
            return;
        }
    }
}

/// A leader over loopback with the test's token file, waiting for its follower: the process,
/// its stderr and the address it listens on.
fn leader(
    plan: &std::path::Path,
    reports: &std::path::Path,
    token: &std::path::Path,
) -> (Child, BufReader<ChildStderr>, String) {
    let token = token.to_str().unwrap();
    harness::spawn_leader(plan, &["--token-file", token], reports)
}

/// `tcpx-run follow` against `addr`, with `token` in the environment (or none).
fn follower(addr: &str, token: Option<&str>) -> Command {
    let mut c = Command::new(bin());
    c.args(["follow", "--leader", addr, "--connect-timeout", "20"])
        .env_remove("TCPX_RUN_TOKEN")
        .stdout(Stdio::null());
    if let Some(t) = token {
        c.env("TCPX_RUN_TOKEN", t);
    }
    c
}

#[test]
fn strangers_on_the_plan_port_are_dropped_and_the_follower_still_joins() {
    let (d, plan) = tiny_plan();
    let reports = tempfile::tempdir().unwrap();
    let token = token_file(d.path());
    let (l, mut err, addr) = leader(&plan, reports.path(), &token);
    let mut seen = String::new();

    // Connect and close at once (a port scan).
    let s = TcpStream::connect(&addr).unwrap();
    let from = s.local_addr().unwrap().to_string();
    drop(s);
    wait_for_line(
        &mut err,
        &format!("dropped a connection from {from}"),
        &mut seen,
    );

    // An HTTP probe: dropped, and the leader closes it.
    let mut s = TcpStream::connect(&addr).unwrap();
    let from = s.local_addr().unwrap().to_string();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_for_line(
        &mut err,
        &format!("dropped a connection from {from}"),
        &mut seen,
    );
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);

    // A silent connection stays open through the rest: it holds nothing up.
    let silent = TcpStream::connect(&addr).unwrap();

    // A follower with another token: it refuses the leader (whose proof does not match), the
    // leader drops it and goes on waiting.
    let wrong = follower(&addr, Some("another-token-0123456789"))
        .stderr(Stdio::piped())
        .output_with_deadline()
        .unwrap();
    harness::assert_refused(
        &wrong,
        &[
            "the leader did not prove this side's run token",
            "TCPX_RUN_TOKEN",
        ],
    );
    wait_for_line(&mut err, "the follower refused this leader", &mut seen);

    // The real follower, with the token in a file.
    let good = tcpx_run()
        .args(["follow", "--leader", &addr, "--connect-timeout", "20"])
        .arg("--token-file")
        .arg(&token)
        .env_remove("TCPX_RUN_TOKEN")
        .run();
    assert!(good.status.success(), "{}", text(&good));
    err.read_to_string(&mut seen).unwrap();
    let out = l.wait_with_output().unwrap();
    drop(silent);
    assert_eq!(out.status.code(), Some(0), "{seen}");
    // The experiment ran (a skipped one would be N/A).
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[PASS]"),
        "{}",
        text(&out)
    );
    assert!(seen.contains("(run token proven both ways)"), "{seen}");
    assert!(!seen.contains("panicked"), "{seen}");
}

/// The follower's side of the greeting, by hand over a real socket (the library's state
/// machine): a follower that joins and then does nothing, holding the leader in its run.
fn join_by_hand(addr: &str) -> Link {
    let mut link = Link::new(TcpStream::connect(addr).unwrap()).unwrap();
    let creds = Credentials {
        token: Some(RunToken::parse(TOKEN, "test").unwrap()),
        nonce: tcpx_link::auth::nonce().unwrap(),
    };
    let (mut f, hello) = Follower::new("by-hand", Duration::from_secs(60), Instant::now(), creds);
    let send_all = |link: &mut Link, acts: Vec<Action>| {
        for a in acts {
            match a {
                Action::Send(m) => link.send(&m).unwrap(),
                other => panic!("the greeting failed: {other:?}"),
            }
        }
    };
    send_all(&mut link, hello);
    // The leader's greeting with its proof; the answer is ours.
    let m = link.recv(Duration::from_secs(30)).unwrap();
    let answer = f.handle(Event::Received(m), Instant::now());
    assert!(
        matches!(&answer[..], [Action::Send(LinkMsg::Auth { .. })]),
        "{answer:?}"
    );
    send_all(&mut link, answer);
    assert_eq!(f.run(), "plan tiny");
    link
}

#[test]
fn a_second_follower_is_refused_at_once_while_the_run_goes_on() {
    let (d, plan) = tiny_plan();
    let reports = tempfile::tempdir().unwrap();
    let token = token_file(d.path());
    let (mut l, mut err, addr) = leader(&plan, reports.path(), &token);
    let mut seen = String::new();
    let mut first = join_by_hand(&addr);
    wait_for_line(&mut err, "joined (run token proven both ways)", &mut seen);
    // The leader now waits for our answer to its first experiment; a second follower, even
    // with the right token, is told at once that this run has its follower.
    let second = follower(&addr, Some(TOKEN))
        .stderr(Stdio::piped())
        .output_with_deadline()
        .unwrap();
    harness::assert_refused(
        &second,
        &[
            "the leader refused this follower",
            "with its follower at",
            "one follower per run",
        ],
    );
    // The run was not disturbed: the first follower still has its experiment to answer.
    assert!(matches!(
        first.recv(Duration::from_secs(30)),
        Ok(LinkMsg::Prepare { .. })
    ));
    drop(first);
    err.read_to_string(&mut seen).unwrap();
    assert_eq!(l.wait().unwrap().code(), Some(2), "{seen}");
    assert!(seen.contains("refused a connection from"), "{seen}");
}

/// A bench run's arguments past the role: two timed iterations of `size`, no warm-up, no CSV,
/// a `timeout_s` deadline.
fn two_iterations(size: &str, timeout_s: u32) -> Vec<String> {
    let timeout = timeout_s.to_string();
    ["--size", size, "--iters", "2", "--warmup", "0", "--no-csv"]
        .into_iter()
        .chain(["--timeout", &timeout])
        .map(String::from)
        .collect()
}

/// `tcpx-run bench --role server` on a free loopback port for a 64 KiB, two-iteration run
/// with a `timeout_s` deadline, past the line that says it listens.
struct BenchServer {
    child: Child,
    err: BufReader<ChildStderr>,
    seen: String,
    addr: String,
    args: Vec<String>,
}

impl BenchServer {
    fn listening(timeout_s: u32) -> Self {
        let port = harness::free_ports(1).to_string();
        let args = two_iterations("64K", timeout_s);
        let (child, mut err) = harness::spawn_reading_stderr(
            Command::new(bin())
                .args(["bench", "--role", "server", "--peer", "127.0.0.1"])
                .args(["--port", &port])
                .args(&args),
            Stdio::null(),
        );
        let mut seen = String::new();
        wait_for_line(&mut err, "server listening on", &mut seen);
        let addr = format!("127.0.0.1:{port}");
        BenchServer {
            child,
            err,
            seen,
            addr,
            args,
        }
    }

    /// Runs the matching client, which must succeed, then waits for the server, which must
    /// succeed too: all the server printed.
    fn serve_client(mut self) -> String {
        let client = tcpx_run()
            .args(["bench", "--role", "client", "--peer", &self.addr])
            .args(&self.args)
            .run();
        assert!(client.status.success(), "{}", text(&client));
        self.err.read_to_string(&mut self.seen).unwrap();
        let seen = self.seen;
        assert!(self.child.wait().unwrap().success(), "{seen}");
        seen
    }
}

#[test]
fn strangers_on_the_bench_control_port_are_dropped_and_the_client_still_runs() {
    let server = BenchServer::listening(30);
    let addr = server.addr.clone();
    // Connect and close; an HTTP probe (its first bytes read as a 542 MB frame); a frame of
    // garbage JSON. Each is dropped in turn and the server keeps waiting.
    drop(TcpStream::connect(&addr).unwrap());
    let mut http = TcpStream::connect(&addr).unwrap();
    http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut junk = TcpStream::connect(&addr).unwrap();
    junk.write_all(&[3, 0, 0, 0, b'{', b'x', b'}']).unwrap();
    let seen = server.serve_client();
    assert_eq!(
        seen.matches("dropped a connection from").count(),
        3,
        "{seen}"
    );
    // Item 29: stderr is not a terminal here, so no colour codes.
    assert!(!seen.contains('\u{1b}'), "ANSI escapes in {seen:?}");
}

/// Silent strangers (connect, say nothing) opened on the bench control port before the client:
/// the server greets them side by side, holds at most its limit of them unidentified (closing
/// the oldest beyond it, naming the limit), and serves the client as soon as it says hello;
/// every stranger is logged as dropped.
#[test]
fn silent_strangers_on_the_bench_control_port_do_not_hold_up_the_client() {
    const STRANGERS: usize = 12;
    let server = BenchServer::listening(20);
    let addr = server.addr.clone();
    let strangers: Vec<TcpStream> = (0..STRANGERS)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let seen = server.serve_client();
    for s in &strangers {
        let me = s.local_addr().unwrap();
        assert_eq!(
            seen.matches(&format!("dropped a connection from {me} "))
                .count(),
            1,
            "stranger {me}: {seen}"
        );
    }
    // Beyond the limit the oldest are closed as the next ones come, before the client.
    assert!(
        seen.matches("at most 8 connections that have not said hello are held at once")
            .count()
            >= STRANGERS - 8,
        "{seen}"
    );
    // The client was served while the rest were still unidentified: no stranger's silence was
    // waited out first.
    assert!(!seen.contains("sent nothing for"), "{seen}");
}

/// A leader by hand (the library's accept and greeting, no token: loopback) and `tcpx-run
/// follow` started with `cmd`'s settings, joined: the link and the follower process.
fn hand_leader(cmd: impl FnOnce(&str) -> Command) -> (Link, Child) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let child = cmd(&addr)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (link, _) = tcpx_orchestrate::accept_follower(
        &listener,
        Instant::now() + Duration::from_secs(30),
        None,
        "plan by-hand",
    )
    .unwrap();
    (link, child)
}

fn bye(mut link: Link, child: Child) -> Output {
    link.send(&LinkMsg::Bye).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_follower_refuses_out_of_range_durations_from_its_leader_without_a_panic() {
    let (mut link, child) = hand_leader(|addr| {
        let mut c = Command::new(bin());
        c.args(["follow", "--leader", addr, "--connect-timeout", "20"]);
        c
    });
    // (JSON has no infinity: serde writes it as null, which is unreadable, not out of range.)
    for t in [-1.0, 1e308, 0.0] {
        let exp = tcpx_bench::Experiment {
            timeout_s: t,
            ..tcpx_bench::Experiment::default()
        };
        link.send(&LinkMsg::Prepare {
            exp: Box::new(exp),
            outside: Default::default(),
        })
        .unwrap();
        match link.recv(Duration::from_secs(30)) {
            Ok(LinkMsg::Refused { reason }) => assert!(
                reason.contains("out of range") && reason.contains("timeout"),
                "{t}: {reason}"
            ),
            other => panic!("{t}: {other:?}"),
        }
    }
    let o = bye(link, child);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        stderr_of(&o).contains("served 3 experiments"),
        "{}",
        text(&o)
    );
}

#[test]
fn follow_takes_its_leader_from_tcpx_leader_or_master_addr_without_a_rank() {
    for var in ["TCPX_LEADER", "MASTER_ADDR"] {
        let (link, child) = hand_leader(|addr| {
            let mut c = Command::new(bin());
            c.args(["follow", "--connect-timeout", "20"])
                .env_remove("TCPX_LEADER")
                .env_remove("MASTER_ADDR")
                .env_remove("RANK")
                .env(var, addr);
            c
        });
        let o = bye(link, child);
        assert!(o.status.success(), "{var}: {}", text(&o));
        assert!(
            stderr_of(&o).contains(&format!("(from {var})")),
            "{}",
            text(&o)
        );
    }
}

/// A command that must be refused at once: status 2, no panic, the message names `name`.
fn refused(mut c: Command, name: &str) -> String {
    let e = harness::assert_refused(&c.output_with_deadline().unwrap(), &[name]);
    assert!(!e.contains("panicked"), "{e}");
    e
}

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args).env_remove("TCPX_RUN_TOKEN");
    c
}

#[test]
fn malformed_host_port_strings_are_refused_before_any_lookup() {
    for bad in ["::::", "127.0.0.1:99999", "a b:1", "999.1.2.3", "host:0"] {
        let e = refused(
            cmd(&["follow", "--leader", bad, "--connect-timeout", "1"]),
            "--leader",
        );
        // Refused for its form, not after asking the resolver or trying to connect.
        assert!(
            !e.contains("resolving") && !e.contains("could not reach"),
            "{bad}: {e}"
        );
    }
    let mut c = cmd(&["follow", "--connect-timeout", "1"]);
    c.env("TCPX_LEADER", "127.0.0.1:99999");
    refused(c, "TCPX_LEADER");
    let (_d, plan) = tiny_plan();
    let mut c = Command::new(bin());
    c.arg(&plan)
        .args(["--listen", "127.0.0.1:99999", "--follower-timeout", "1"]);
    refused(c, "--listen");
    for bad in ["::::", "127.0.0.1:99999", "a b"] {
        let e = refused(
            cmd(&[
                "bench",
                "--role",
                "client",
                "--peer",
                bad,
                "--size",
                "4K",
                "--no-csv",
                "--timeout",
                "1",
            ]),
            "--peer",
        );
        assert!(!e.contains("cannot resolve"), "{bad}: {e}");
    }
    refused(cmd(&["baseline", "--bind", "127.0.0.1:80"]), "--bind");
}

#[test]
fn variables_out_of_range_are_errors_that_name_the_variable() {
    for bad in ["abc", "70000", "0"] {
        let mut c = cmd(&["follow", "--leader", "127.0.0.1", "--connect-timeout", "1"]);
        c.env("TCPX_PLAN_PORT", bad);
        refused(c, &format!("TCPX_PLAN_PORT={bad}"));
    }
    // --port overrides the variable: then it is not even read.
    let free = harness::free_ports(1).to_string();
    let mut c = cmd(&[
        "follow",
        "--leader",
        "127.0.0.1",
        "--port",
        &free,
        "--connect-timeout",
        "1",
    ]);
    c.env("TCPX_PLAN_PORT", "abc");
    let e = refused(c, "could not reach the leader");
    assert!(!e.contains("TCPX_PLAN_PORT"), "{e}");
    let (_d, plan) = tiny_plan();
    let mut c = Command::new(bin());
    c.arg(&plan).arg("--dry-run").env("TCPX_PLAN_PORT", "abc");
    refused(c, "TCPX_PLAN_PORT=abc");
    let mut c = cmd(&["bench", "--size", "4K", "--no-csv"]);
    c.env("TCPX_WINDOW", "abc");
    let e = refused(c, "TCPX_WINDOW=abc");
    assert!(e.contains("it sets --window"), "{e}");
    let mut c = cmd(&[
        "follow",
        "--leader",
        "127.0.0.1:1",
        "--connect-timeout",
        "1",
    ]);
    c.env("TCPX_RUN_TOKEN", "short");
    refused(c, "TCPX_RUN_TOKEN: the run token has 5 bytes");
}

#[test]
fn durations_and_guards_out_of_range_are_refused_at_every_flag() {
    let (_d, plan) = tiny_plan();
    let plan_cmd = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.arg(&plan).args(args);
        c
    };
    for bad in ["0", "-1", "1e308", "NaN"] {
        refused(
            plan_cmd(&["--follower-timeout", bad, "--dry-run"]),
            "--follower-timeout",
        );
        refused(
            cmd(&["follow", "--leader", "127.0.0.1", "--connect-timeout", bad]),
            "--connect-timeout",
        );
        refused(
            cmd(&["follow", "--leader", "127.0.0.1", "--idle-timeout", bad]),
            "--idle-timeout",
        );
    }
    for bad in ["-1", "1e308", "NaN", "inf"] {
        refused(
            cmd(&["bench", "--size", "4K", "--no-csv", "--timeout", bad]),
            "--timeout",
        );
    }
    // Item 14: 0 operations would remove the endless-loop guard.
    refused(
        plan_cmd(&["--max-operations", "0", "--dry-run"]),
        "--max-operations",
    );
    // Item 24: no cores per direction would print empty bindings.
    refused(
        cmd(&["topo", "--backend", "sysfs", "--cores-per-direction", "0"]),
        "--cores-per-direction",
    );
}

#[test]
fn a_dry_run_under_a_launcher_rank_never_follows() {
    let (_d, plan) = tiny_plan();
    let port = harness::free_ports(1).to_string();
    let o = tcpx_run()
        .arg(&plan)
        .args(["--dry-run", "--follower-timeout", "5"])
        .env("RANK", "1")
        .env("LOCAL_RANK", "0")
        .env("GROUP_RANK", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("TCPX_PLAN_PORT", &port)
        .env_remove("TCPX_RUN_TOKEN")
        .run();
    assert!(o.status.success(), "{}", text(&o));
    // The experiments it would run, one a line.
    assert!(!o.stdout.is_empty(), "{}", text(&o));
    assert!(
        !stderr_of(&o).contains("follows the leader"),
        "{}",
        text(&o)
    );
}

#[test]
fn multi_process_control_ports_in_the_ephemeral_range_are_warned_about() {
    // A port the kernel just handed out as ephemeral lies in the range by definition.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = cmd(&[
        "bench",
        "--role",
        "client",
        "--peer",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--multi-process",
        "--flows",
        "2",
        "--size",
        "4K",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--no-csv",
        "--timeout",
        "1",
    ])
    .output_with_deadline()
    .unwrap();
    let e = stderr_of(&o);
    assert!(
        e.contains(&format!("control ports {port}..={}", port + 1))
            && e.contains("net.ipv4.ip_local_port_range"),
        "{}",
        text(&o)
    );
}

/// `tcpx-run ARGS` inside node `node` of fabric `f`.
fn in_node(f: &FabricGuard, node: char, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &f.ns(node), bin()])
        .args(args)
        .env_remove("TCPX_RUN_TOKEN");
    c
}

#[test]
fn the_two_node_bench_runs_across_fabric_nodes_without_nics() {
    require_netns!("the_two_node_bench_runs_across_fabric_nodes_without_nics");
    let f = FabricGuard::up("t-netbench", &["--nics", "1", "--rate", "1gbit"]);
    let mut args = two_iterations("256K", 20);
    args.extend(["--port", "5411"].map(String::from));
    // As the README says: the server listens on every address of node B, the client names B.
    let mut server = in_node(&f, 'b', &["bench", "--role", "server", "--peer", "0.0.0.0"]);
    let (mut server, mut err) = harness::spawn_reading_stderr(server.args(&args), Stdio::null());
    let mut seen = String::new();
    wait_for_line(&mut err, "server listening on", &mut seen);
    let mut client = in_node(
        &f,
        'a',
        &["bench", "--role", "client", "--peer", "10.231.0.2"],
    );
    client.args(&args);
    let c = client.output_with_deadline().unwrap();
    err.read_to_string(&mut seen).unwrap();
    let s = server.wait().unwrap();
    assert!(c.status.success(), "client: {}\nserver: {seen}", text(&c));
    assert!(s.success(), "server: {seen}");
}

#[test]
fn a_plan_across_fabric_nodes_needs_the_run_token_on_both_sides() {
    require_netns!("a_plan_across_fabric_nodes_needs_the_run_token_on_both_sides");
    let f = FabricGuard::up("t-nettoken", &["--nics", "1", "--rate", "1gbit"]);
    let (d, plan) = tiny_plan();
    let plan = plan.to_str().unwrap();
    let token = token_file(d.path());
    let reports = tempfile::tempdir().unwrap();
    let listen = ["--listen", "0.0.0.0:5412", "--targets", "loopback"];

    // Listening on every address without a token is refused before it listens.
    let mut c = in_node(&f, 'a', &[plan]);
    c.args(listen).args(["--follower-timeout", "5"]);
    let e = refused(c, "TCPX_RUN_TOKEN");
    assert!(e.contains("--token-file") && e.contains("--listen"), "{e}");

    let mut leader = in_node(&f, 'a', &[plan]);
    leader
        .args(listen)
        .args(["--follower-timeout", "60", "--token-file"])
        .arg(&token)
        .arg("--reports")
        .arg(reports.path());
    let (leader, mut err) = harness::spawn_reading_stderr(&mut leader, Stdio::piped());
    let mut seen = String::new();
    wait_for_line(&mut err, "waiting for a follower on", &mut seen);
    let follow = [
        "follow",
        "--leader",
        "10.231.0.1:5412",
        "--connect-timeout",
        "20",
    ];
    // A follower without the token refuses to serve a leader beyond its machine.
    let e = refused(in_node(&f, 'b', &follow), "TCPX_RUN_TOKEN");
    assert!(e.contains("needs a run token"), "{e}");
    wait_for_line(&mut err, "dropped a connection from 10.231.0.2", &mut seen);
    // With it (in the environment), the plan runs across the nodes without --nics.
    let mut good = in_node(&f, 'b', &follow);
    good.env("TCPX_RUN_TOKEN", TOKEN);
    let g = good.output_with_deadline().unwrap();
    err.read_to_string(&mut seen).unwrap();
    let l = leader.wait_with_output().unwrap();
    assert!(g.status.success(), "follower: {}\nleader: {seen}", text(&g));
    assert_eq!(l.status.code(), Some(0), "leader: {seen}\n{}", text(&l));
    assert!(
        String::from_utf8_lossy(&l.stdout).contains("[PASS]"),
        "{}",
        text(&l)
    );
}

// ---- Issue 43: slow strangers, a stranger's text ----

/// A stranger that sends `prefix` at once and then one byte of a line that never ends every
/// 50 ms, until `stop` or 60 s (its own end, so the test ends even when the leader is stuck).
fn trickler(
    addr: &str,
    prefix: Vec<u8>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut s = TcpStream::connect(addr).unwrap();
    std::thread::spawn(move || {
        let _ = s.write_all(&prefix);
        let until = Instant::now() + Duration::from_secs(60);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
            if s.write_all(b"x").is_err() {
                return;
            }
            // The trickle's pace, not a synchronisation.
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// The greeting line a follower opens with (no token: loopback), as a stranger would copy it.
fn hello_line() -> Vec<u8> {
    let hello = LinkMsg::Hello {
        protocol: tcpx_link::LINK_PROTOCOL,
        version: "stranger".into(),
        host: "stranger".into(),
        nonce: tcpx_link::auth::nonce().unwrap(),
        proof: None,
        run: String::new(),
    };
    let mut line = serde_json::to_vec(&hello).unwrap();
    line.push(b'\n');
    line
}

/// Issue 43 item 2: a connection trickling a line that never ends cannot keep the leader's
/// accept past its deadline (each read waited anew for the next byte, so the leader stayed
/// until the stranger left).
#[test]
fn a_trickling_stranger_cannot_hold_the_plan_port_past_its_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = trickler(&addr, b"{".to_vec(), stop.clone());
    let started = Instant::now();
    let r = tcpx_orchestrate::accept_follower(
        &listener,
        started + Duration::from_millis(1500),
        None,
        "plan by-hand",
    );
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    t.join().unwrap();
    let e = r.err().expect("no follower came");
    assert!(e.to_string().contains("did not complete"), "{e}");
    assert!(took < Duration::from_secs(5), "the accept took {took:?}");
}

/// Issue 43 item 2: two tricklers (one before its greeting, one that greeted properly and then
/// trickles its proof) are served side by side with the real follower, which joins at once.
#[test]
fn the_follower_joins_while_strangers_trickle_on_the_plan_port() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut greeted = hello_line();
    greeted.extend_from_slice(b"{\"msg\":\"auth\",\"proof\":\"");
    let strangers = [
        trickler(&addr, b"{\"msg\":".to_vec(), stop.clone()),
        trickler(&addr, greeted, stop.clone()),
    ];
    let accepting = std::thread::spawn(move || {
        tcpx_orchestrate::accept_follower(
            &listener,
            Instant::now() + Duration::from_secs(30),
            None,
            "plan by-hand",
        )
        .map(|(link, _)| link.peer)
    });
    // The follower's side of the greeting by hand (no token: loopback).
    let started = Instant::now();
    let mut link = Link::new(TcpStream::connect(&addr).unwrap()).unwrap();
    let me = link.local;
    let creds = Credentials {
        token: None,
        nonce: tcpx_link::auth::nonce().unwrap(),
    };
    let (mut f, hello) = Follower::new("by-hand", Duration::from_secs(60), Instant::now(), creds);
    for a in hello {
        let Action::Send(m) = a else { panic!("{a:?}") };
        link.send(&m).unwrap();
    }
    let m = link.recv(Duration::from_secs(30)).unwrap();
    for a in f.handle(Event::Received(m), Instant::now()) {
        let Action::Send(m) = a else { panic!("{a:?}") };
        link.send(&m).unwrap();
    }
    let joined = accepting.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in strangers {
        s.join().unwrap();
    }
    assert_eq!(joined.unwrap(), me);
    // Well before any stranger's line or greeting ran out.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Issue 43 item 6: a stranger that greets and then "refuses" the leader with escape
/// sequences, a carriage return, a fake log line and 900 KB: the leader's stderr line is
/// escaped and cut.
#[test]
fn a_strangers_refusal_reaches_the_leaders_stderr_escaped_and_cut() {
    let (d, plan) = tiny_plan();
    let reports = tempfile::tempdir().unwrap();
    let token = token_file(d.path());
    let (mut l, mut err, addr) = leader(&plan, reports.path(), &token);
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&hello_line()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    r.read_line(&mut greeting).unwrap();
    assert!(greeting.contains("hello"), "{greeting}");
    let reason = format!(
        "\u{1b}]0;owned\u{7}\u{1b}[2J\rtcpx-run: follower 10.0.0.9 joined (run token proven both ways)\n{}",
        "z".repeat(900_000)
    );
    let mut line = serde_json::to_vec(&LinkMsg::Refused { reason }).unwrap();
    line.push(b'\n');
    s.write_all(&line).unwrap();
    let mut seen = String::new();
    wait_for_line(&mut err, "the follower refused this leader", &mut seen);
    let _ = l.kill();
    let _ = l.wait();
    let printed = seen.lines().last().unwrap();
    assert!(!printed.chars().any(char::is_control), "{printed:?}");
    assert!(printed.len() < 2000, "{} bytes", printed.len());
    // The fake log line stays inside the escaped reason, never a line of its own.
    assert!(
        !seen
            .lines()
            .any(|l| l.starts_with("tcpx-run: follower 10.0.0.9")),
        "{seen:?}"
    );
}

/// Issue 43 (minor): a follower whose server side reports an error in its `Done` after the
/// client side measured fails the experiment with that error (it was dropped, the run `ok`).
#[test]
fn a_followers_error_fails_the_experiment_though_the_client_side_succeeded() {
    let (d, plan) = tiny_plan();
    let reports = tempfile::tempdir().unwrap();
    let token = token_file(d.path());
    let (l, mut err, addr) = leader(&plan, reports.path(), &token);
    let mut seen = String::new();
    let mut link = join_by_hand(&addr);
    let exp = match link.recv(Duration::from_secs(30)) {
        Ok(LinkMsg::Prepare { exp, .. }) => exp,
        other => panic!("{other:?}"),
    };
    // A real bench server answers the leader's client, then the follower says it failed.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        tcpx_bench::run_server(&exp, listener, &mut |_: &tcpx_bench::Measurement| {}).is_ok()
    });
    link.send(&LinkMsg::Ready {
        port,
        not_applied: Default::default(),
    })
    .unwrap();
    assert!(server.join().unwrap(), "the bench server failed");
    link.send(&LinkMsg::Done {
        error: Some("writing the samples: No space left on device".into()),
        nic_plan: None,
    })
    .unwrap();
    assert!(matches!(
        link.recv(Duration::from_secs(30)),
        Ok(LinkMsg::Bye)
    ));
    drop(link);
    err.read_to_string(&mut seen).unwrap();
    let out = l.wait_with_output().unwrap();
    let all = format!("{seen}{}", String::from_utf8_lossy(&out.stdout));
    // The run says so (nothing measured exits 0 unless --require-measured).
    assert!(all.contains("1 failed"), "{all}");
    assert!(
        all.contains("the follower's side failed: writing the samples: No space left on device"),
        "{all}"
    );
}
