//! Experiments a backend or a process cannot hold are refused before anything runs, with the
//! limit named, and a peer process learns why instead of waiting for its timeout.

use std::io::{BufRead, Read};
use std::process::{Command, ExitStatus, Output, Stdio};

use crate::harness::{self, tcpx_run, RunWithDeadline as _};
use harness::test_plugin_so;

#[test]
fn more_channels_than_the_plugin_allows_are_refused_naming_its_limit() {
    let out = tcpx_run()
        .args(["bench", "--transport", "netplugin", "--channels", "8"])
        .args(["--size", "1M", "--iters", "1", "--warmup", "0", "--no-csv"])
        .env("NCCL_NET_PLUGIN", test_plugin_so())
        .env("TCPX_TEST_PLUGIN_MAX_COMMS", "4")
        .env_remove("TCPX_TEST_PLUGIN_FAULT")
        .env_remove("TCPX_TEST_PLUGIN_MODE")
        .env_remove("TCPX_NETPLUGIN_DEV")
        .run();
    // A local run holds both sides: 8 channels x 2 = 16 comms against the plugin's 4.
    let err = harness::assert_refused(
        &out,
        &["need 16 comms", "allows 4", "at most 2 channels per flow"],
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A bench server and its client on loopback with 8 channels x 8 sockets, the one whose role
/// is `low_role` under `ulimit -n 100`, run to the end (each has a 20 s deadline): the server's
/// exit status and stderr, and the client's output.
fn pair_with_low_open_file_limit(low_role: &str) -> (ExitStatus, String, Output) {
    let exe = harness::bin();
    let common = [
        "--channels",
        "8",
        "--socks-per-channel",
        "8",
        "--size",
        "1M",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--timeout",
        "20",
        "--no-csv",
    ];
    let side = |role: &str| {
        let mut cmd = if role == low_role {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg("ulimit -n 100 && exec \"$0\" \"$@\"")
                .arg(exe);
            sh
        } else {
            Command::new(exe)
        };
        cmd.args(["bench", "--role", role]);
        cmd
    };
    let (mut server, mut err) = harness::spawn_reading_stderr(
        side("server").args(["--peer", "127.0.0.1:0"]).args(common),
        Stdio::null(),
    );
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("tcpx-run: server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string();
    let client = side("client")
        .args(["--peer", &addr])
        .args(common)
        .output_with_deadline()
        .unwrap();
    let mut server_err = String::new();
    err.read_to_string(&mut server_err).unwrap();
    (server.wait().unwrap(), server_err, client)
}

/// The server runs under a low open-file limit that cannot hold 8 channels x 8 sockets; the
/// client, on an ordinary limit, is told why by the server rather than timing out.
#[test]
fn a_server_that_cannot_open_its_sockets_tells_the_client_why() {
    let (server_status, server_err, client) = pair_with_low_open_file_limit("server");
    let client_err = String::from_utf8_lossy(&client.stderr);
    assert!(!server_status.success(), "{server_err}");
    // 8 channels x (8 sockets x 4 files + a listener) + headroom = 328 files against 100.
    assert!(
        server_err.contains("open-file limit (ulimit -n) is 100")
            && server_err.contains("about 328 open files"),
        "server: {server_err}"
    );
    assert!(!client.status.success(), "{client_err}");
    assert!(
        client_err.contains("refused")
            && client_err.contains("the server cannot run")
            && client_err.contains("ulimit -n"),
        "client: {client_err}"
    );
}

/// The mirror of the test above: the client runs under the low open-file limit, so it cannot
/// run; it says hello and aborts right after the welcome. The server, which is by then waiting
/// for the data channels' connections, reports the client's own reason at once instead of
/// waiting out its timeout and blaming the accept.
#[test]
fn a_client_that_cannot_open_its_sockets_tells_the_server_why() {
    let (server_status, server_err, client) = pair_with_low_open_file_limit("client");
    let client_err = String::from_utf8_lossy(&client.stderr);
    assert!(!client.status.success(), "{client_err}");
    assert!(
        client_err.contains("open-file limit (ulimit -n) is 100"),
        "client: {client_err}"
    );
    assert!(!server_status.success(), "{server_err}");
    assert!(
        server_err.contains("while connecting the data channels")
            && server_err.contains("the client cannot run")
            && server_err.contains("ulimit -n"),
        "server: {server_err}"
    );
    assert!(!server_err.contains("timed out"), "server: {server_err}");
}
