//! `tcpx-run bench` as users run it: real processes, real loopback sockets.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness;

fn tcpx() -> Command {
    let mut c = Command::new(harness::bin());
    c.env("RUST_LOG", "error");
    c
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = harness::tcpx_run()
        .env("RUST_LOG", "error")
        .args(args)
        .run();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(!se.contains("panicked"), "no panic on any input: {se}");
    (out.status.code().unwrap_or(-1), so, se)
}

#[test]
fn local_run_prints_the_table_and_appends_whole_csv_rows() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("r/bench.csv");
    let csv_s = csv.to_str().unwrap();
    let args = [
        "bench", "--role", "local", "--size", "1M,2M", "--iters", "2", "--warmup", "1", "--csv",
        csv_s,
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("#        size        count     type  redop   root"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(" uint8 ")).count(),
        2,
        "one row per size:\n{out}"
    );
    assert!(out.contains("# Wrong bytes : 0"), "{out}");
    let (code, _, _) = run(&args);
    assert_eq!(code, 0);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1 + 8,
        "one header, then 4 rows per run:\n{text}"
    );
    let cols = lines[0].split(',').count();
    assert!(
        lines.iter().all(|l| l.split(',').count() == cols),
        "every row whole:\n{text}"
    );
}

/// Starts a server on a free port and returns it with the address it printed.
fn server(
    extra: &[&str],
) -> (
    std::process::Child,
    String,
    BufReader<std::process::ChildStdout>,
    std::thread::JoinHandle<String>,
) {
    let (mut child, mut err) = harness::spawn_reading_stderr(
        tcpx()
            .args([
                "bench",
                "--role",
                "server",
                "--peer",
                "127.0.0.1:0",
                "--no-csv",
            ])
            .args(extra),
        Stdio::piped(),
    );
    // With --json the table header goes to stderr too, before the address line.
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("the server exited without printing its address:\n{seen}");
        }
        if let Some(a) = line.trim().strip_prefix("tcpx-run: server listening on ") {
            break a.to_string();
        }
        seen.push_str(&line);
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    let stderr = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, addr, out, stderr)
}

/// The `--json` document: all of stdout, one JSON value.
fn json_doc(text: &str) -> serde_json::Value {
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{text}"))
}

#[test]
fn server_and_client_processes_agree_on_the_results() {
    let common = ["--size", "1M,4M", "--iters", "3", "--warmup", "1", "--json"];
    let (mut srv, addr, mut srv_out, _) = server(&common);
    let (code, cli_out, cli_err) = run(&[
        &["bench", "--role", "client", "--peer", &addr, "--no-csv"][..],
        &common,
    ]
    .concat());
    assert_eq!(code, 0, "{cli_out}\n{cli_err}");
    let mut srv_text = String::new();
    std::io::Read::read_to_string(&mut srv_out, &mut srv_text).unwrap();
    assert!(srv.wait().unwrap().success(), "{srv_text}");
    let (a, b) = (json_doc(&srv_text), json_doc(&cli_out));
    assert_eq!(a["start"]["role"], "server");
    assert_eq!(b["start"]["role"], "client");
    let (a, b) = (&a["measurements"], &b["measurements"]);
    assert_eq!(a, b, "both processes print the same measurements");
    assert_eq!(a.as_array().unwrap().len(), 2);
    assert_eq!(a[0]["recv"]["wrong_bytes"], 0);
}

#[test]
fn client_dying_mid_run_makes_the_server_fail_naming_peer_and_experiment() {
    let args = [
        "--size",
        "1M,256M",
        "--iters",
        "1000",
        "--warmup",
        "0",
        "--timeout",
        "5",
        "--name",
        "doomed",
    ];
    let (mut srv, addr, mut srv_out, srv_err) = server(&args);
    let mut cli = tcpx()
        .args(["bench", "--role", "client", "--peer", &addr, "--no-csv"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first size is done on the client (its rows are printed), so the kill lands
    // in the middle of the 256M iterations.
    let mut cli_out = BufReader::new(cli.stdout.take().unwrap());
    let mut line = String::new();
    while cli_out.read_line(&mut line).unwrap() > 0 && !line.contains(" uint8 ") {
        line.clear();
    }
    assert!(line.contains(" uint8 "), "client printed its first result");
    cli.kill().unwrap();
    let _ = cli.wait();
    let t0 = Instant::now();
    let status = srv.wait().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "server gave up within its deadline"
    );
    assert_eq!(status.code(), Some(2));
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut srv_out, &mut rest).unwrap();
    assert!(
        !rest.contains("# Wrong bytes"),
        "no results claimed for a run that failed:\n{rest}"
    );
    let err = srv_err.join().unwrap();
    assert!(
        err.contains("experiment 'doomed'") && err.contains("127.0.0.1:"),
        "names experiment and peer:\n{err}"
    );
    assert!(err.contains("closed"), "says the peer went away:\n{err}");
}

#[test]
fn mismatched_processes_both_refuse_showing_both_values() {
    let (mut srv, addr, _out, srv_err) =
        server(&["--channels", "2", "--size", "1M", "--timeout", "5"]);
    let (code, _, err) = run(&[
        "bench",
        "--role",
        "client",
        "--peer",
        &addr,
        "--no-csv",
        "--channels",
        "4",
        "--size",
        "1M",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("channels: 2 vs 4"), "{err}");
    assert_eq!(srv.wait().unwrap().code(), Some(2));
    assert!(srv_err.join().unwrap().contains("channels: 2 vs 4"));
}

#[test]
fn bad_input_gets_a_clear_message_and_no_panic() {
    let cases: &[(&[&str], &str)] = &[
        (&["--iters", "-1"], "--iters is -1"),
        (
            &["--iters", "0"],
            "--iters 0 is out of range: give 1..=1000000",
        ),
        (
            &["--size", "1M", "--chunk", "2M"],
            "chunk 2M is larger than the message size 1M",
        ),
        (
            &["--window", "64"],
            "window 64 is beyond what transport `socket` allows",
        ),
        (&["--size", "-3M"], "negative"),
        (&["--size", "12Q"], "unknown unit"),
        (
            &["--channels", "0"],
            "--channels 0 is out of range: give 1..=64",
        ),
        (&["--socks-per-channel", "65"], "give 1..=64"),
        (&["--timeout", "soon"], "not a number of seconds"),
        (&["--transport", "pigeon"], "unknown transport"),
    ];
    for (args, want) in cases {
        let (code, out, err) = run(&[&["bench", "--role", "local", "--no-csv"][..], args].concat());
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in:\n{err}");
    }
    let (code, _, err) = run(&["bench", "--role", "client", "--no-csv"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs --peer"), "{err}");
}

#[test]
fn unreachable_peer_is_retried_until_the_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let peer = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    let (code, _, err) = run(&[
        "bench",
        "--role",
        "client",
        "--peer",
        &peer,
        "--no-csv",
        "--timeout",
        "1",
    ]);
    assert!(t0.elapsed() >= Duration::from_secs(1) && t0.elapsed() < Duration::from_secs(10));
    assert_eq!(code, 2);
    assert!(err.contains(&peer) && err.contains("attempts"), "{err}");
}
