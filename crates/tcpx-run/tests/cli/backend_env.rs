//! The backends' settings come from the binary's environment, read once before anything runs:
//! a bad value stops the command naming its variable, before anything runs.

use crate::harness::tcpx_run;

fn bench(vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = tcpx_run();
    cmd.args(["bench", "--transport", "socket", "--channels", "1"])
        .args(["--socks-per-channel", "2", "--size", "1M", "--iters", "1"])
        .args(["--warmup", "0", "--no-csv"]);
    for v in [
        "TCPX_SOCKET_PIECE",
        "TCPX_SOCKET_CALL",
        "TCPX_SOCKET_THREADS",
        "TCPX_SOCKET_STRIPE",
        "TCPX_SOCKET_BLOCKING",
        "TCPX_SOCKET_RCVLOWAT",
        "TCPX_SOCKET_BUSY_POLL",
        "TCPX_CUDAP2P_MODE",
        "TCPX_NCCL_GPU",
        "TCPX_NETPLUGIN_DEV",
    ] {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().copied()).run()
}

#[test]
fn a_bad_backend_variable_stops_the_run_naming_it() {
    for (name, bad) in [
        ("TCPX_CUDAP2P_MODE", "sideways"),
        ("TCPX_NCCL_GPU", "first"),
    ] {
        let out = bench(&[(name, bad)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}={bad} ran: {err}");
        assert!(err.contains(name), "{name}={bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The socket layout switches were measured and removed (docs/PERFORMANCE.md): the binary no
/// longer reads them, so values the old parser refused change nothing and the run goes through.
#[test]
fn the_removed_socket_switches_are_not_read() {
    let out = bench(&[
        ("TCPX_SOCKET_THREADS", "65"),
        ("TCPX_SOCKET_PIECE", "huge"),
        ("TCPX_SOCKET_CALL", "1"),
        ("TCPX_SOCKET_STRIPE", "x"),
        ("TCPX_SOCKET_BLOCKING", "x"),
        ("TCPX_SOCKET_RCVLOWAT", "1G"),
        ("TCPX_SOCKET_BUSY_POLL", "x"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("TCPX_SOCKET"), "{err}");
}
