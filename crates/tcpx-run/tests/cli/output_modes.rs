//! Every output mode of `tcpx-run bench` (the table on stdout; `--json`: one document on stdout,
//! the table on stderr) through every backend CI can run: the socket backend and the workspace's
//! test plugin in host and in unpack mode. The plugin runs with `TCPX_TEST_PLUGIN_WARN_THREAD=1`:
//! each receive completes only after a helper thread of the plugin has logged a WARN through
//! NCCL's logger, as Google's GPUDirect-TCPX plugin does on every host-memory receive. Before the
//! fix, `--json` held stderr's lock for the whole run, so that thread waited forever and the run
//! moved nothing (issue 29); these runs would then fail at their `--timeout` instead of passing.

use std::process::Command;
use std::time::Duration;

use crate::harness;
use harness::test_plugin_so;

/// A backend as the CLI selects it: `--transport` and the environment it needs.
struct Backend {
    label: &'static str,
    transport: &'static str,
    env: Vec<(&'static str, String)>,
}

fn backends() -> Vec<Backend> {
    let so = test_plugin_so().to_string_lossy().into_owned();
    let plugin = |mode: &'static str| {
        vec![
            ("NCCL_NET_PLUGIN", so.clone()),
            ("TCPX_TEST_PLUGIN_MODE", mode.to_string()),
            ("TCPX_TEST_PLUGIN_WARN_THREAD", "1".to_string()),
        ]
    };
    vec![
        Backend {
            label: "socket",
            transport: "socket",
            env: Vec::new(),
        },
        Backend {
            label: "test plugin, host mode",
            transport: "netplugin",
            env: plugin("host"),
        },
        Backend {
            label: "test plugin, unpack mode",
            transport: "netplugin",
            env: plugin("unpack"),
        },
    ]
}

/// Longest a run may take here (each moves 5 MiB 4 times); a run past it is killed and fails.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

/// Runs `b` in table or JSON mode and checks it succeeded: its stdout and stderr.
fn bench(b: &Backend, json: bool) -> (String, String) {
    let mut cmd = Command::new(harness::bin());
    cmd.args(["bench", "--transport", b.transport, "--size", "1M,4M"])
        .args(["--iters", "3", "--warmup", "1", "--chunk", "1M"])
        .args(["--channels", "2", "--timeout", "20", "--no-csv"])
        .env_remove("RUST_LOG")
        .env_remove("TCPX_TEST_PLUGIN_FAULT")
        .env_remove("TCPX_NETPLUGIN_DEV")
        .envs(b.env.iter().map(|(k, v)| (k, v)));
    if json {
        cmd.arg("--json");
    }
    // The stall this test guards against is a hang: wait with a deadline.
    let mode = if json { "--json" } else { "table" };
    harness::run_ok_within(&format!("{} ({mode})", b.label), &mut cmd, RUN_DEADLINE)
}

/// The nccl-tests rows of `text`: one per size, #wrong (column 9) 0.
fn assert_table(label: &str, text: &str) {
    let rows: Vec<&str> = text.lines().filter(|l| l.contains(" uint8 ")).collect();
    assert_eq!(rows.len(), 2, "{label}: one row per size:\n{text}");
    for row in rows {
        assert_eq!(row.split_whitespace().nth(8), Some("0"), "{label}: {row}");
    }
    assert!(text.contains("# Wrong bytes : 0"), "{label}:\n{text}");
}

#[test]
fn the_table_mode_moves_verified_bytes_through_every_backend() {
    for b in backends() {
        let (out, err) = bench(&b, false);
        assert_table(b.label, &out);
        if b.transport == "netplugin" {
            assert!(err.contains("helper thread: receive"), "{}: {err}", b.label);
        }
    }
}

#[test]
fn the_json_mode_moves_verified_bytes_through_every_backend() {
    for b in backends() {
        let (out, err) = bench(&b, true);
        // stdout is the document alone; the table went to stderr, next to the plugin's warnings.
        let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
            panic!("{}: stdout is not one JSON document ({e}):\n{out}", b.label)
        });
        assert_eq!(
            doc["measurements"].as_array().map(Vec::len),
            Some(2),
            "{}",
            b.label
        );
        assert_eq!(doc["end"]["wrong_bytes"], 0, "{}: {out}", b.label);
        assert_eq!(
            doc["start"]["experiment"]["transport"], b.transport,
            "{}",
            b.label
        );
        assert_table(b.label, &err);
        if b.transport == "netplugin" {
            assert!(err.contains("helper thread: receive"), "{}: {err}", b.label);
        }
    }
}
