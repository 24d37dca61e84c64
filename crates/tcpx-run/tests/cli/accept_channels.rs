//! The server side of `tcpx-run bench` accepts all of a flow's channels at once, as NCCL
//! progresses its connections. Google's GPUDirect-TCPX plugin sleeps 5 s in each accept (its
//! flow-steering wait), so a server accepting channel after channel ran past a 20 s deadline at
//! 4 channels (issue 29: "the server's accept of channel 3 times out"). The test plugin's
//! `accept_together:4` fault lets no accept finish before all 4 listeners are being accepted:
//! one accept at a time then never finishes, and the run fails at its `--timeout`.

use std::time::Duration;

use crate::harness;
use harness::test_plugin_so;

/// Longest the run may take here; past it, it is killed and the test fails.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn four_channels_connect_when_no_accept_finishes_alone() {
    let so = test_plugin_so().to_string_lossy().into_owned();
    let (stdout, _) = harness::tcpx_run()
        .args(["bench", "--transport", "netplugin", "--size", "1M"])
        .args(["--iters", "2", "--warmup", "1", "--chunk", "256K"])
        .args(["--channels", "4", "--timeout", "10", "--no-csv"])
        .env_remove("RUST_LOG")
        .env_remove("TCPX_NETPLUGIN_DEV")
        .env_remove("TCPX_TEST_PLUGIN_WARN_THREAD")
        .env("NCCL_NET_PLUGIN", &so)
        .env("TCPX_TEST_PLUGIN_MODE", "host")
        .env("TCPX_TEST_PLUGIN_FAULT", "accept_together:4")
        .deadline(RUN_DEADLINE)
        .ok();
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains(" uint8 ")).collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(rows[0].split_whitespace().nth(8), Some("0"), "{}", rows[0]);
}
