//! The watch shim (`crates/tcpx-watch-plugin`) in front of the workspace's test plugin, loaded by
//! `tcpx-run bench --transport netplugin` as NCCL would load it (`NCCL_NET_PLUGIN=tcpxwatch`,
//! found on `LD_LIBRARY_PATH`; the real plugin in `TCPX_WATCH_INNER`): what it counts equals
//! what the bench moved, a missing real plugin fails as a missing plugin does, its files stay
//! within their bound, and the plugin's properties reach the bench unchanged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use tcpx_test_support::test_plugin_so;

const MIB: u64 = 1 << 20;

/// `tcpx-run bench --transport netplugin` with the shim installed in `lib` and `env` added.
fn bench(lib: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tcpx-run"));
    cmd.args(["bench", "--transport", "netplugin", "--no-csv"])
        .args(args);
    if !args.contains(&"--timeout") {
        cmd.args(["--timeout", "60"]);
    }
    cmd.env("LD_LIBRARY_PATH", lib)
        .env("NCCL_NET_PLUGIN", "tcpxwatch")
        .env("TCPX_WATCH_INNER", test_plugin_so())
        .env("TCPX_TEST_PLUGIN_MODE", "host")
        .env_remove("TCPX_TEST_PLUGIN_FAULT")
        .env_remove("TCPX_NETPLUGIN_DEV")
        .env_remove("TCPX_WATCH_DIR")
        .env_remove("TCPX_WATCH_PROM")
        .env_remove("TCPX_WATCH_MAX_MB")
        .env_remove("TCPX_WATCH_INTERVAL_MS")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run tcpx-run bench")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_verified(o: &Output) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("# Wrong bytes : 0"), "{out}");
}

/// The one JSON-lines file the process wrote in `dir` (and its rotated predecessor, if any).
fn lines_file(dir: &Path) -> (PathBuf, Option<PathBuf>) {
    let mut current = Vec::new();
    let mut rotated = Vec::new();
    for e in std::fs::read_dir(dir).expect("TCPX_WATCH_DIR exists") {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".jsonl") {
            current.push(p);
        } else if name.ends_with(".jsonl.1") {
            rotated.push(p);
        }
    }
    assert_eq!(current.len(), 1, "one file per process: {current:?}");
    assert!(rotated.len() <= 1, "one rotated file at most: {rotated:?}");
    (current.remove(0), rotated.pop())
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Per comm of the last interval: (dir, link, bytes, requests).
fn last_interval(recs: &[Value]) -> Vec<(String, String, u64, u64)> {
    let last = recs
        .iter()
        .rev()
        .find(|r| r["kind"] == "interval")
        .expect("an interval line");
    last["comms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["dir"].as_str().unwrap().to_string(),
                c["link"].as_str().unwrap().to_string(),
                c["bytes"].as_u64().unwrap(),
                c["requests"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Send and receive totals, and that each link's two ends agree.
fn check_links(comms: &[(String, String, u64, u64)]) -> (u64, u64) {
    let sum = |dir: &str| -> u64 { comms.iter().filter(|c| c.0 == dir).map(|c| c.2).sum() };
    for send in comms.iter().filter(|c| c.0 == "send") {
        let recv: Vec<_> = comms
            .iter()
            .filter(|c| c.0 == "recv" && c.1 == send.1)
            .collect();
        assert_eq!(
            recv.len(),
            1,
            "one recv comm with link {}: {comms:?}",
            send.1
        );
        assert_eq!(
            (recv[0].2, recv[0].3),
            (send.2, send.3),
            "link {}: both ends count the same bytes and requests",
            send.1
        );
    }
    (sum("send"), sum("recv"))
}

#[test]
fn bytes_per_comm_in_the_last_interval_equal_what_the_bench_moved() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let watch = tempfile::tempdir().unwrap();
    let dir = watch.path().join("watch");
    let o = bench(
        lib.path(),
        &[
            "--size", "1M,3M", "--iters", "3", "--warmup", "1", "--chunk", "256K",
        ],
        &[
            ("TCPX_WATCH_DIR", dir.to_str().unwrap()),
            ("TCPX_WATCH_INTERVAL_MS", "100"),
        ],
    );
    assert_verified(&o);
    let (file, rotated) = lines_file(&dir);
    assert!(rotated.is_none());
    let recs = records(&file);
    assert_eq!(recs[0]["kind"], "start", "{:?}", recs[0]);
    assert_eq!(recs[0]["inner_name"], "tcpx-test-plugin");
    assert_eq!(recs[0]["inner_api"], 7);
    assert_eq!(
        recs[0]["api"], 9,
        "tcpx-ffi takes the newest table the shim offers"
    );
    assert_eq!(recs.last().unwrap()["kind"], "end");
    let comms = last_interval(&recs);
    assert!(comms.len() >= 2, "{comms:?}");
    let (sent, received) = check_links(&comms);
    // Every size moves (warmup + iters) messages of its size, once each way.
    let moved = (MIB + 3 * MIB) * (1 + 3);
    assert_eq!((sent, received), (moved, moved), "{comms:?}");
    // Every comm's set-up was timed, with the comm's link.
    let conns: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "conn").collect();
    for (dir, link, _, _) in &comms {
        let call = if dir == "send" { "connect" } else { "accept" };
        assert!(
            conns
                .iter()
                .any(|c| c["call"] == call && c["link"] == link.as_str() && c["ok"] == true),
            "no {call} line for link {link}: {conns:?}"
        );
    }
    assert!(conns.iter().any(|c| c["call"] == "listen"), "{conns:?}");
}

#[test]
fn a_missing_real_plugin_fails_as_loading_a_missing_plugin_does() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let missing = "/nonexistent/libnccl-net-nothing.so";
    let args = ["--size", "1M", "--iters", "1", "--warmup", "0"];
    let direct = bench(lib.path(), &args, &[("NCCL_NET_PLUGIN", missing)]);
    let watch = tempfile::tempdir().unwrap();
    let shim = bench(
        lib.path(),
        &args,
        &[
            ("TCPX_WATCH_INNER", missing),
            ("TCPX_WATCH_DIR", watch.path().to_str().unwrap()),
        ],
    );
    let (_, direct_err) = text(&direct);
    let (_, shim_err) = text(&shim);
    assert_eq!(direct.status.code(), Some(2), "{direct_err}");
    assert_eq!(shim.status.code(), direct.status.code(), "{shim_err}");
    // Both name the path with the loader's own words.
    let dlerror = "cannot open shared object file";
    assert!(
        direct_err.contains(missing) && direct_err.contains(dlerror),
        "{direct_err}"
    );
    assert!(
        shim_err.contains(missing) && shim_err.contains(dlerror),
        "{shim_err}"
    );
    assert!(shim_err.contains("system error"), "{shim_err}");
    assert!(!shim_err.contains("panicked"), "{shim_err}");
    // Nothing was recorded for a shim that could not load what it wraps.
    assert_eq!(std::fs::read_dir(watch.path()).unwrap().count(), 0);
}

#[test]
fn the_files_stay_within_their_bound_over_a_long_run() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let watch = tempfile::tempdir().unwrap();
    let prom = watch.path().join("tcpx.prom");
    let bound = 20_000u64; // TCPX_WATCH_MAX_MB=0.02
    let (iters, size) = (400u64, MIB);
    let o = bench(
        lib.path(),
        &[
            "--size",
            "1M",
            "--iters",
            &iters.to_string(),
            "--warmup",
            "1",
            "--chunk",
            "256K",
        ],
        &[
            ("TCPX_WATCH_DIR", watch.path().to_str().unwrap()),
            ("TCPX_WATCH_INTERVAL_MS", "100"),
            ("TCPX_WATCH_MAX_MB", "0.02"),
            ("TCPX_WATCH_PROM", prom.to_str().unwrap()),
        ],
    );
    assert_verified(&o);
    let (file, rotated) = lines_file(watch.path());
    let rotated = rotated.expect("the run was long enough to rotate");
    let total =
        std::fs::metadata(&file).unwrap().len() + std::fs::metadata(&rotated).unwrap().len();
    assert!(total <= bound, "{total} bytes on disk, bound {bound}");
    let (old, new) = (records(&rotated), records(&file));
    for recs in [&old, &new] {
        assert_eq!(recs[0]["kind"], "start", "each file names its devices");
    }
    let intervals = old
        .iter()
        .chain(&new)
        .filter(|r| r["kind"] == "interval")
        .count();
    assert!(intervals >= 2, "{intervals} intervals");
    assert_eq!(new.last().unwrap()["kind"], "end");
    // Rotation loses no count: the last interval still has every byte.
    let (sent, received) = check_links(&last_interval(&new));
    assert_eq!((sent, received), (size * (iters + 1), size * (iters + 1)));
    // The Prometheus textfile agrees with the last interval.
    let prom_text = std::fs::read_to_string(&prom).unwrap();
    assert!(
        prom_text.contains("# TYPE tcpx_watch_bytes_total counter"),
        "{prom_text}"
    );
    let prom_sent: u64 = prom_text
        .lines()
        .filter(|l| l.starts_with("tcpx_watch_bytes_total{") && l.contains("dir=\"send\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(prom_sent, sent, "{prom_text}");
    let leftovers: Vec<_> = std::fs::read_dir(watch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// What the bench logs about the NIC it uses (`nic=`, `speed_mbps=`, `device=`).
fn nic_lines(o: &Output) -> Vec<String> {
    let (_, err) = text(o);
    err.lines()
        .filter(|l| l.contains("netplugin backend ready"))
        .map(|l| {
            l.split_whitespace()
                .filter(|w| {
                    w.starts_with("nic=")
                        || w.starts_with("speed_mbps=")
                        || w.starts_with("device=")
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn properties_reach_the_bench_unchanged_through_the_shim() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let args = ["--size", "1M", "--iters", "2", "--warmup", "0"];
    let log = ("RUST_LOG", "tcpx_transport=info");
    let plugin = test_plugin_so().to_str().unwrap();
    for mode in ["host", "unpack"] {
        let mode_env = ("TCPX_TEST_PLUGIN_MODE", mode);
        let direct = bench(
            lib.path(),
            &args,
            &[("NCCL_NET_PLUGIN", plugin), log, mode_env],
        );
        let watch = tempfile::tempdir().unwrap();
        let dir = ("TCPX_WATCH_DIR", watch.path().to_str().unwrap());
        let recorded = bench(lib.path(), &args, &[log, mode_env, dir]);
        let passthrough = bench(lib.path(), &args, &[log, mode_env]);
        for o in [&direct, &recorded, &passthrough] {
            assert_verified(o);
        }
        let want = nic_lines(&direct);
        assert!(!want.is_empty() && want[0].contains("nic=lo"), "{want:?}");
        assert_eq!(nic_lines(&recorded), want, "{mode}: recording shim");
        assert_eq!(nic_lines(&passthrough), want, "{mode}: pass-through shim");
        let (file, _) = lines_file(watch.path());
        let start = &records(&file)[0];
        assert_eq!(start["devices"][0]["name"], "lo");
        assert_eq!(
            start["devices"][0]["pci_path"],
            "/sys/devices/virtual/net/lo"
        );
        assert_eq!(start["devices"][0]["speed_mbps"], 100_000);
        // Unpack receives report no sizes: their posted sizes are counted (and said to be), still
        // exact here since the bench posts each receive at its message's size.
        let recs = records(&file);
        let (sent, received) = check_links(&last_interval(&recs));
        assert_eq!((sent, received), (2 * MIB, 2 * MIB), "{mode}");
        let last = recs.iter().rev().find(|r| r["kind"] == "interval").unwrap();
        for c in last["comms"].as_array().unwrap() {
            let by_post = c["posted_sized"].as_u64().unwrap();
            let want = if mode == "unpack" && c["dir"] == "recv" {
                c["requests"].as_u64().unwrap()
            } else {
                0
            };
            assert_eq!(by_post, want, "{mode}: {c}");
        }
    }
}

#[test]
fn an_error_of_the_real_plugin_is_recorded_with_its_call_and_code() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let watch = tempfile::tempdir().unwrap();
    let o = bench(
        lib.path(),
        &[
            "--size",
            "1M",
            "--iters",
            "2",
            "--warmup",
            "0",
            "--chunk",
            "256K",
            // The receiver waits for what never comes: a short deadline ends it.
            "--timeout",
            "5",
        ],
        &[
            ("TCPX_WATCH_DIR", watch.path().to_str().unwrap()),
            ("TCPX_TEST_PLUGIN_FAULT", "isend:3@3"),
        ],
    );
    let (out, err) = text(&o);
    assert_ne!(
        o.status.code(),
        Some(0),
        "the fault fails the bench: {out}\n{err}"
    );
    assert!(err.contains("internal error (3) from isend"), "{err}");
    let (file, _) = lines_file(watch.path());
    let recs = records(&file);
    let errors: Vec<&Value> = recs.iter().filter(|r| r["kind"] == "error").collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (&errors[0]["call"], &errors[0]["code"]),
        (&Value::from("isend"), &Value::from(3))
    );
    let comm = errors[0]["comm"]
        .as_u64()
        .expect("the error names its comm");
    let last = recs.iter().rev().find(|r| r["kind"] == "interval").unwrap();
    let counted = last["comms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["comm"] == comm)
        .expect("the failing comm is recorded");
    assert_eq!(counted["errors"], 1, "{counted}");
    assert_eq!(
        recs.last().unwrap()["kind"],
        "end",
        "a failed run still ends its file"
    );
}
