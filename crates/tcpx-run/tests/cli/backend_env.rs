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
        ("TCPX_SOCKET_THREADS", "4K"),
        ("TCPX_SOCKET_PIECE", "huge"),
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

#[test]
fn socket_settings_in_range_run_and_out_of_range_ones_are_refused_naming_the_variable() {
    let out = bench(&[("TCPX_SOCKET_THREADS", "1"), ("TCPX_SOCKET_PIECE", "256K")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Out of range for the backend: refused by the socket backend, naming the variables.
    let out = bench(&[("TCPX_SOCKET_THREADS", "65")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("TCPX_SOCKET_THREADS"), "{err}");
}
