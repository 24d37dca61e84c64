//! `tcpx-run watch` end to end: the watch shim (`crates/tcpx-watch-plugin`) in front of the
//! workspace's test plugin, loaded by `tcpx-run bench --transport netplugin` as NCCL loads it,
//! one bench process per device side by side with one device planted slow (the test plugin's
//! `slow_dev` fault): `tcpx-run watch DIR --json` names that device and no other, and counts
//! what each bench moved. Then `--follow` on files as a job leaves them: it ends with the job,
//! on Ctrl-C, and at `--for`. A binary of its own (not a module of `tests/cli`): the verdict is
//! about speed, and the CLI binary's other tests would share the CPUs with its benches.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use tcpx_test_support::{test_plugin_so, wait_within};
use tcpx_watch::record::{CommCounters, Device, Dir, End, Histogram, Interval, Record, Start};

const MIB: u64 = 1 << 20;

fn tcpx_run() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tcpx-run"));
    cmd.env_remove("RUST_LOG");
    cmd
}

/// `tcpx-run watch ARGS`, its output through files (a pipe read only after the exit could fill
/// and stop it), within 60 s.
fn watch(args: &[&str]) -> Output {
    let out = tempfile::tempdir().unwrap();
    let (so, se) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut child = tcpx_run()
        .arg("watch")
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(60),
        Duration::from_millis(20),
    )
    .expect("tcpx-run watch ended within 60 s");
    Output {
        status,
        stdout: std::fs::read(&so).unwrap(),
        stderr: std::fs::read(&se).unwrap(),
    }
}

#[test]
fn a_slow_device_behind_the_shim_is_named_and_no_other() {
    let lib = tempfile::tempdir().unwrap();
    tcpx_test_support::install_watch_plugin(lib.path());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("watch");
    // Four devices, one bench per device at once (the netplugin backend opens one device per
    // process), each paced by the test plugin: device 1 moves 1 MiB per 2 s, the others 1 MiB
    // per 0.2 s and ten times the iterations, so that every bench runs about 3 s whatever the
    // machine. The pace is far under what a debug build can move on a loaded 2-core machine
    // (about 50 MiB/s per core, with the bench's fill and check): a device is then as fast as its
    // pace, not as its share of the CPUs, and only device 1 stands out.
    let iters = |dev: u64| if dev == 1 { 24u64 } else { 240 };
    const SIZE: u64 = 64 << 10;
    let mut children: Vec<_> = (0..4u64)
        .map(|dev| {
            tcpx_run()
                .args([
                    "bench",
                    "--transport",
                    "netplugin",
                    "--no-csv",
                    "--timeout",
                    "120",
                    "--size",
                    "64K",
                    "--warmup",
                    "1",
                    "--iters",
                ])
                .arg(iters(dev).to_string())
                .env("LD_LIBRARY_PATH", lib.path())
                .env("NCCL_NET_PLUGIN", "tcpxwatch")
                .env("TCPX_WATCH_INNER", test_plugin_so())
                .env("TCPX_WATCH_DIR", &dir)
                .env("TCPX_WATCH_INTERVAL_MS", "100")
                .env("TCPX_TEST_PLUGIN_MODE", "host")
                .env("TCPX_TEST_PLUGIN_DEVICES", "4")
                .env(
                    "TCPX_TEST_PLUGIN_FAULT",
                    "slow_dev:0:200000,slow_dev:1:2000000,slow_dev:2:200000,slow_dev:3:200000",
                )
                .env("TCPX_NETPLUGIN_DEV", dev.to_string())
                .env_remove("TCPX_WATCH_MAX_MB")
                .env_remove("TCPX_WATCH_PROM")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(tmp.path().join(format!("bench{dev}.err"))).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    for (dev, c) in children.iter_mut().enumerate() {
        let status = wait_within(c, Duration::from_secs(240), Duration::from_millis(50));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "bench on device {dev}"
        );
    }
    let html = tmp.path().join("watch.html");
    let o = watch(&[
        dir.to_str().unwrap(),
        "--json",
        "--html",
        html.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let verdicts = doc["verdicts"].as_array().unwrap();
    // On failure, each NIC's figures say how far apart the devices ran.
    let figures: Vec<String> = doc["summary"]["nics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            format!(
                "dev {}: {} GB/s total per window {}",
                n["dev"], n["send"]["gbps"], n["total_gbps_windows"]
            )
        })
        .collect();
    assert_eq!(verdicts.len(), 1, "{verdicts:#?}\n{}", figures.join("\n"));
    assert_eq!(verdicts[0]["kind"], "slow_nic", "{verdicts:#?}");
    assert!(
        verdicts[0]["subject"].as_str().unwrap().ends_with(" lo#1"),
        "{verdicts:#?}"
    );
    // Each device carried what its bench moved, each way: (warm-up + iterations) x 64 KiB.
    let nics = doc["summary"]["nics"].as_array().unwrap();
    assert_eq!(nics.len(), 4, "{nics:#?}");
    for n in nics {
        let dev = n["dev"].as_u64().unwrap();
        assert_eq!(n["send"]["bytes"], (iters(dev) + 1) * SIZE, "{n:#?}");
        assert_eq!(n["recv"]["bytes"], (iters(dev) + 1) * SIZE, "{n:#?}");
    }
    assert_eq!(doc["summary"]["processes"].as_array().unwrap().len(), 4);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<svg") && page.contains("slow NIC"),
        "the HTML report"
    );
    // The table form says the same.
    let o = watch(&[dir.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("slow NIC: ") && out.contains("lo#1"), "{out}");
}

/// A job's files as the shim leaves them: two NICs, `windows` intervals of 0.2 s, and an end
/// line when `ended`.
fn synthetic(dir: &Path, pid: u32, windows: usize, ended: bool) {
    let le: Vec<f64> = (0..8).map(|i| f64::from(1u32 << i)).collect();
    let mut lines = vec![Record::Start(Start {
        v: 1,
        t: 0.0,
        unix_s: 1_764_390_000.0,
        host: "h".into(),
        pid,
        inner: "/x/libnccl-net.so".into(),
        inner_name: "X".into(),
        api: 8,
        devices: ["eth1", "eth2"]
            .iter()
            .enumerate()
            .map(|(i, n)| Device {
                dev: i as u32,
                name: n.to_string(),
                pci_path: String::new(),
                speed_mbps: 100_000,
                max_comms: 8,
            })
            .collect(),
    })];
    for w in 1..=windows as u64 {
        lines.push(Record::Interval(Interval {
            t: w as f64 * 0.2,
            dt_s: 0.2,
            comms: (0..2)
                .map(|dev| CommCounters {
                    comm: dev + 1,
                    dir: Dir::Send,
                    dev: dev as u32,
                    link: format!("{:016x}", dev + 1),
                    bytes: w * 100 * MIB,
                    requests: w * 100,
                    errors: 0,
                    inflight: 0,
                    lat_us: Histogram {
                        le: le.clone(),
                        counts: vec![0, 0, 0, w * 100, 0, 0, 0, 0, 0],
                    },
                    lat_sum_us: Some(w * 600),
                    closed: false,
                })
                .collect(),
            dropped: Default::default(),
            omitted_comms: 0,
        }));
    }
    if ended {
        lines.push(Record::End(End {
            t: windows as f64 * 0.2 + 0.05,
        }));
    }
    let text: String = lines
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(dir.join(format!("watch-h-{pid}.jsonl")), text).unwrap();
}

#[test]
fn follow_ends_with_the_job_and_prints_a_line_per_nic_per_window() {
    let d = tempfile::tempdir().unwrap();
    synthetic(d.path(), 7, 5, true);
    let o = watch(&[d.path().to_str().unwrap(), "--follow", "--interval", "0.2"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("every process wrote its end line"), "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
    // 5 windows x 2 NICs, each 100 MiB per 0.2 s.
    assert_eq!(lines.len(), 10, "{out}");
    let gbps = format!("{:.3}", 100.0 * MIB as f64 / 0.2 / 1e9);
    assert!(
        lines
            .iter()
            .all(|l| l.contains(&format!("send {gbps} GB/s"))),
        "{out}"
    );
    assert!(out.contains("verdict: nothing stands out"), "{out}");
}

#[test]
fn follow_of_a_running_job_ends_on_ctrl_c_and_at_its_deadline() {
    let d = tempfile::tempdir().unwrap();
    synthetic(d.path(), 8, 5, false);
    // --for: ends by itself.
    let o = watch(&[
        d.path().to_str().unwrap(),
        "--follow",
        "--interval",
        "0.2",
        "--for",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--for reached"));

    // Ctrl-C once it has shown a window.
    let mut child = tcpx_run()
        .args([
            "watch",
            d.path().to_str().unwrap(),
            "--follow",
            "--interval",
            "0.2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    assert!(
        first.as_deref().is_ok_and(|l| l.starts_with("t=")),
        "{first:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(20),
        Duration::from_millis(20),
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "ends cleanly on Ctrl-C"
    );
    let rest: Vec<String> = rx.iter().collect();
    reader.join().unwrap();
    assert!(
        rest.iter().any(|l| l.contains("nothing stands out")),
        "{rest:?}"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("interrupted"), "{err}");
}

#[test]
fn an_empty_directory_with_the_shim_expected_is_named() {
    let d = tempfile::tempdir().unwrap();
    let o = watch(&[d.path().to_str().unwrap(), "--expect-plugin"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        out.contains("no shim: no process wrote a watch file"),
        "{out}"
    );
    let missing = d.path().join("absent");
    let o = watch(&[missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("check that the directory exists"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn apply(args: &[&str]) -> Output {
    let mut child = tcpx_run()
        .arg("apply")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(60),
        Duration::from_millis(20),
    )
    .expect("tcpx-run apply ended within 60 s");
    let mut out = child.wait_with_output().unwrap();
    out.status = status;
    out
}

#[test]
fn apply_watch_puts_the_shim_in_front_of_the_tuned_plugin_and_refuses_a_socket_pin() {
    let d = tempfile::tempdir().unwrap();
    let tuned = d.path().join("tuned.env");
    std::fs::write(
        &tuned,
        "NCCL_NET_PLUGIN=/usr/local/tcpx/lib64/libnccl-net.so\nNCCL_SOCKET_NTHREADS=4\n",
    )
    .unwrap();
    let t = tuned.to_str().unwrap();
    let o = apply(&[t, "--watch", "--watch-dir", "/var/log/tcpx-watch"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        out,
        "export NCCL_SOCKET_NTHREADS=4\nexport NCCL_NET_PLUGIN=tcpxwatch\n\
         export TCPX_WATCH_INNER=/usr/local/tcpx/lib64/libnccl-net.so\n\
         export TCPX_WATCH_DIR=/var/log/tcpx-watch\n"
    );
    let o = apply(&[t, "--watch", "--format", "k8s"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("- name: NCCL_NET_PLUGIN\n    value: \"tcpxwatch\"")
            && out.contains("- name: TCPX_WATCH_DIR\n    value: \"/tmp/tcpx-watch\""),
        "{out}"
    );
    // Without --watch the run's own plugin, unchanged.
    let o = apply(&[t]);
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("export NCCL_NET_PLUGIN=/usr/local/tcpx/lib64/libnccl-net.so"));
    std::fs::write(&tuned, "NCCL_NET=Socket\nNCCL_SOCKET_NTHREADS=4\n").unwrap();
    let o = apply(&[t, "--watch", "--format", "slurm"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("NCCL_NET=Socket with no NCCL_NET_PLUGIN") && err.contains("no net plugin"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
}
