//! `tcpx-run doctor` as a user runs it: on this machine (no TCPX: it must say so and exit 0, or 1
//! with `--require tcpx`), and on the A3-high fixture tree with a real plugin (the workspace's
//! test plugin in unpack mode) and real rxdm-style Unix sockets.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Output;

use crate::harness;
use harness::test_plugin_so;

const TCPX_VARS: &[&str] = &[
    "NCCL_NET_PLUGIN",
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX",
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME",
    "NCCL_GPUDIRECTTCPX_CTRL_DEV",
    "NCCL_GPUDIRECTTCPX_TX_BINDINGS",
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS",
];

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = harness::TestCmd::new(["doctor"]);
    cmd.args(args);
    for v in TCPX_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.run();
    let out = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.code().is_some(),
        "doctor died: {}",
        String::from_utf8_lossy(&stderr)
    );
    (status.code().unwrap(), out)
}

fn a3_fixture() -> PathBuf {
    harness::fixture_dir("a3-high")
}

#[test]
fn without_tcpx_doctor_says_so_and_fails_only_when_required() {
    let empty = tempfile::tempdir().unwrap();
    let prefix = empty.path().join("no-rxdm");
    let prefix = prefix.to_str().unwrap();
    let (code, out) = doctor(&["--unix-prefix", prefix], &[]);
    if out.contains("GPUDirect-TCPX: usable") {
        println!("SKIP: this machine has a working TCPX stack");
        return;
    }
    assert_eq!(code, 0, "{out}");
    harness::assert_says(
        &out,
        &[
            "GPUDirect-TCPX is not available on this machine",
            "[absent ] net plugin",
            "libnccl-net.so",
            "[absent ] rxdm sockets",
            "fix: start the receive data-path manager",
        ],
    );

    let (code, out) = doctor(&["--unix-prefix", prefix, "--require", "tcpx"], &[]);
    assert_eq!(code, 1, "{out}");

    let (code, out) = doctor(&["--unix-prefix", prefix, "--json"], &[]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tcpx_usable"], false);
    assert!(v["findings"].as_array().unwrap().len() >= 5);
}

/// A directory holding real Unix sockets named as GPUDirect-TCPX connects to them.
fn rxdm_dir() -> (tempfile::TempDir, Vec<UnixListener>) {
    let dir = tempfile::tempdir().unwrap();
    let socks = ["rx_rule_manager", "rx_rule_uninstall"]
        .iter()
        .map(|n| UnixListener::bind(dir.path().join(n)).unwrap())
        .collect();
    (dir, socks)
}

/// `tcpx-run doctor --require tcpx` on the A3 tree with the test plugin in unpack mode, a
/// working rxdm directory and control NIC eth0, plus `args`.
fn doctor_a3_tcpx(args: &[&str]) -> (i32, String) {
    let (rxdm, _socks) = rxdm_dir();
    let (plugin, root) = (test_plugin_so(), a3_fixture());
    let mut all = vec![
        "--root",
        root.to_str().unwrap(),
        "--plugin",
        plugin.to_str().unwrap(),
        "--unix-prefix",
        rxdm.path().to_str().unwrap(),
        "--ctrl-dev",
        "eth0",
        "--require",
        "tcpx",
    ];
    all.extend_from_slice(args);
    doctor(&all, &[("TCPX_TEST_PLUGIN_MODE", "unpack")])
}

const A3_TX: &str = "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177";
const A3_RX: &str = "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191";

#[test]
fn on_an_a3_tree_with_plugin_and_rxdm_every_check_passes() {
    let (code, out) = doctor_a3_tcpx(&[
        "--ifname",
        "eth1,eth2,eth3,eth4",
        "--tx-bindings",
        A3_TX,
        "--rx-bindings",
        A3_RX,
    ]);
    assert_eq!(code, 0, "{out}");
    harness::assert_says(
        &out,
        &[
            "GPUDirect-TCPX: usable here",
            "tcpx-test-plugin (v7 ABI)",
            "Unpack { version: 7 }",
            "2 socket(s)",
            "socket: available",
            "[  ok   ] data NIC eth3",
            "200 Gb/s, driver gve, NUMA 1",
            "[  ok   ] gpus             8 NVIDIA GPU(s)",
        ],
    );
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn bindings_off_the_nics_numa_node_are_named() {
    let (code, out) = doctor_a3_tcpx(&[
        "--ifname",
        "eth1,eth9",
        "--tx-bindings",
        "eth1:60-73;eth7:1",
    ]);
    assert_eq!(code, 1, "{out}");
    harness::assert_says(
        &out,
        &[
            "eth1: CPUs 60-73 are not on its NUMA node 0",
            "no such interface: eth7",
            "[ FAIL  ] data NIC eth9",
            "tx_bindings failed",
        ],
    );
}

#[test]
fn an_rxdm_directory_without_the_rule_sockets_fails_naming_the_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let _only = UnixListener::bind(dir.path().join("rx_rule_manager")).unwrap();
    let (_, out) = doctor(&["--unix-prefix", dir.path().to_str().unwrap()], &[]);
    assert!(out.contains("[ FAIL  ] rxdm sockets"), "{out}");
    assert!(out.contains("not `rx_rule_uninstall`"), "{out}");
}
