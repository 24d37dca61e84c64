//! `tcpx-run bench --transport netplugin` end to end: the CLI loads the workspace's test plugin
//! through NCCL_NET_PLUGIN (as a user would load GPUDirect-TCPX) and moves verified bytes through
//! it over loopback, in host mode and in TCPX-like unpack mode.

use crate::harness::{self, tcpx_run};
use harness::test_plugin_so;

fn bench(mode: &str, sizes: &str, chunk: &str) -> (i32, String, String) {
    let out = tcpx_run()
        .args([
            "bench",
            "--transport",
            "netplugin",
            "--size",
            sizes,
            "--iters",
            "2",
            "--warmup",
            "1",
            "--chunk",
            chunk,
            "--no-csv",
        ])
        .env("NCCL_NET_PLUGIN", test_plugin_so())
        .env("TCPX_TEST_PLUGIN_MODE", mode)
        .env_remove("TCPX_TEST_PLUGIN_FAULT")
        .env_remove("TCPX_NETPLUGIN_DEV")
        .run();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_verified(code: i32, out: &str, err: &str) {
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("transport netplugin"), "{out}");
    assert!(out.contains("# Wrong bytes : 0"), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" uint8 ")).collect();
    assert_eq!(rows.len(), 2, "one row per size: {out}");
    for row in rows {
        // nccl-tests' column 9 (awk's $9) is #wrong.
        assert_eq!(
            row.split_whitespace().nth(8),
            Some("0"),
            "#wrong must be 0: {row}"
        );
    }
}

#[test]
fn bench_through_the_test_plugin_in_host_mode() {
    let (code, out, err) = bench("host", "1M,6M", "1M");
    assert_verified(code, &out, &err);
}

#[test]
fn bench_through_the_test_plugin_in_unpack_mode() {
    let (code, out, err) = bench("unpack", "4M,10M", "4M");
    assert_verified(code, &out, &err);
}

#[test]
fn chunks_over_4_mib_on_an_unpack_device_are_refused_up_front() {
    let (code, out, err) = bench("unpack", "8M", "8M");
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("chunk 8M") && err.contains("(4M)"), "{err}");
}

/// The plugin and its settings can come from the experiment (`--env`), not only from the process
/// environment: a plan that varies plugin settings per experiment needs exactly that.
#[test]
fn plugin_and_its_settings_come_from_the_experiment() {
    let so = test_plugin_so();
    let run = |plugin: &str| {
        tcpx_run()
            .args([
                "bench",
                "--transport",
                "netplugin",
                "--size",
                "1M",
                "--iters",
                "2",
                "--warmup",
                "0",
            ])
            .args(["--chunk", "256K", "--no-csv"])
            .arg(format!("--env=NCCL_NET_PLUGIN={plugin}"))
            .arg("--env=TCPX_TEST_PLUGIN_MODE=host")
            .env_remove("NCCL_NET_PLUGIN")
            .env_remove("TCPX_TEST_PLUGIN_MODE")
            .env_remove("TCPX_TEST_PLUGIN_FAULT")
            .env_remove("TCPX_NETPLUGIN_DEV")
            .run()
    };
    let ok = run(so.to_str().unwrap());
    let (out, err) = (
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr),
    );
    assert_eq!(ok.status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains("# Wrong bytes : 0"), "{out}");
    let bad = run("/nonexistent/libnccl-net-nothing.so");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/nonexistent/libnccl-net-nothing.so") && !err.contains("panicked"),
        "{err}"
    );
}
