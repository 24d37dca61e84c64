//! Hardening of the command line: every case found by trying the tool as a new user would, and a
//! table-driven sweep of every numeric and list flag of `bench` (0, 1, type max, max + 1, huge,
//! negative, NaN, empty, garbage) asserting no panic, exit status 0 or 2 with the flag named,
//! and nothing written outside the --csv file.

use crate::harness::{self, tcpx_run};

use std::path::Path;
use std::process::{Command, Output};

use harness::{bin, plan_dir};

fn run_in(dir: &Path, args: &[&str]) -> Output {
    tcpx_run().current_dir(dir).args(args).run()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A bench run that is refused: status 2, no panic, the message names `flag`.
fn refused(args: &[&str], flag: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![
        "bench", "--size", "4K", "--iters", "1", "--warmup", "0", "--no-csv",
    ];
    all.extend_from_slice(args);
    let o = run_in(dir.path(), &all);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
    assert!(e.contains(flag), "{args:?} should name {flag}: {e}");
    e
}

#[test]
fn a_timeout_too_large_for_a_duration_is_refused_not_a_panic() {
    refused(&["--timeout", "1e20"], "--timeout");
    refused(&["--timeout", "NaN"], "--timeout");
    refused(&["--timeout", "-1"], "--timeout");
}

#[test]
fn a_socket_buffer_beyond_the_kernels_int_is_refused() {
    let e = refused(&["--sock-buf", "4G"], "sock-buf");
    assert!(e.contains("1073741823"), "{e}");
}

#[test]
fn cpu_lists_outside_this_machine_are_refused_before_anything_starts() {
    let e = refused(&["--send-cpus", "999"], "--send-cpus");
    assert!(e.contains("999"), "{e}");
    // A list partly outside is refused too, not run with a "(MISMATCH)" line.
    refused(&["--send-cpus", "0,999"], "--send-cpus");
    refused(&["--recv-cpus", "4095"], "--recv-cpus");
}

/// In server/client mode the server checks its own list before listening, and the client that
/// comes is told that cause instead of a timeout and a wrong flag.
#[test]
fn a_server_with_a_bad_cpu_list_tells_its_client_why() {
    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    drop(listener);
    let common = [
        "bench", "--size", "4K", "--iters", "1", "--warmup", "0", "--no-csv",
    ];
    let server = Command::new(bin())
        .current_dir(dir.path())
        .args(common)
        .args(["--role", "server", "--peer", "127.0.0.1", "--port", &port])
        .args(["--recv-cpus", "999", "--timeout", "20"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let client = run_in(
        dir.path(),
        &[
            common.as_slice(),
            &["--role", "client", "--peer", "127.0.0.1", "--port", &port],
            &["--recv-cpus", "999", "--timeout", "20"],
        ]
        .concat(),
    );
    let server_out = server.wait_with_output().unwrap();
    assert_eq!(server_out.status.code(), Some(2));
    assert!(stderr(&server_out).contains("--recv-cpus"));
    let e = stderr(&client);
    assert_eq!(client.status.code(), Some(2), "{e}");
    assert!(
        e.contains("--recv-cpus"),
        "the client should hear the cause: {e}"
    );
    assert!(!e.contains("socks-per-channel"), "{e}");
}

#[test]
fn an_empty_nic_list_is_refused() {
    refused(&["--nics", ","], "--nics");
    refused(&["--nics", "127.0.0.1,"], "--nics");
}

#[test]
fn a_device_as_csv_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(
        dir.path(),
        &[
            "bench",
            "--size",
            "4K",
            "--iters",
            "1",
            "--csv",
            "/dev/full",
        ],
    );
    harness::assert_refused(&o, &["not a regular file"]);
    assert!(o.stdout.iter().all(|&b| b != 0), "NUL bytes printed");
}

#[test]
fn a_directory_as_samples_csv_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let e = refused(&["--sample-ms", "10", "--samples-csv", &d], "--samples-csv");
    assert!(e.contains("is a directory"), "{e}");
}

/// This machine's MemAvailable, KiB.
fn mem_available_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Whether this machine has less than `gib` GiB available; says so on stderr when it has more
/// (the caller then skips).
fn has_less_memory_than(gib: u64) -> bool {
    let avail_kib = mem_available_kib();
    if avail_kib * 1024 >= gib << 30 {
        eprintln!("skipped: this machine has {avail_kib} KiB available, more than {gib} GiB");
        return false;
    }
    true
}

#[test]
fn buffers_beyond_available_memory_are_refused_with_the_numbers() {
    // Two sides of 4 flows x 16G = 128G: more than this machine has (checked, not assumed).
    if !has_less_memory_than(128) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(
        dir.path(),
        &[
            "bench", "--size", "16G", "--flows", "4", "--iters", "1", "--no-csv",
        ],
    );
    harness::assert_refused(&o, &["MemAvailable", "128.0 GiB"]);
}

#[test]
fn a_baseline_beyond_available_memory_is_refused_with_the_numbers() {
    // A sender's and a receiver's buffer of 100G: 200G, more than this machine has (checked).
    if !has_less_memory_than(200) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(dir.path(), &["baseline", "--size", "100G", "--iters", "1"]);
    let e = harness::assert_refused(&o, &["MemAvailable", "200.0 GiB"]);
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_negative_budget_is_one_usage_error() {
    let (d, plan) = plan_dir("p", "run(experiment(#{ size: \"4K\", iters: 1 }));");
    let p = plan.to_str().unwrap();
    for args in [
        vec!["plan", p, "--dry-run", "--budget", "-5"],
        vec![p, "--dry-run", "--budget", "-5"],
        vec![p, "--dry-run", "--budget=-5"],
        vec![p, "--dry-run", "--budget", "NaN"],
    ] {
        let o = run_in(d.path(), &args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(!e.contains("error: error:"), "{args:?}: {e}");
        assert!(e.contains("--budget"), "{args:?}: {e}");
    }
}

#[test]
fn a_dry_run_estimated_above_a_day_warns() {
    let (d, plan) = plan_dir(
        "long",
        "let b = experiment(#{ size: \"1G\", iters: 1000000, warmup: 0 });\n\
         for i in 0..10 { run(b); }",
    );
    let o = run_in(d.path(), &[plan.to_str().unwrap(), "--dry-run"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(e.contains("checking plan"), "{e}");
    assert!(e.contains("warning:") && e.contains("days"), "{e}");
}

#[test]
fn an_unwritable_report_directory_is_refused_before_the_first_experiment() {
    let (d, plan) = plan_dir(
        "p",
        "run(experiment(#{ size: \"4K\", iters: 1, warmup: 0 }));",
    );
    let o = run_in(
        d.path(),
        &[plan.to_str().unwrap(), "--reports", "/dev/null/reports"],
    );
    harness::assert_refused(&o, &["report directory", "--reports"]);
    // Refused before running: no result line was printed.
    assert!(!String::from_utf8_lossy(&o.stdout).contains("GB/s"));
}

/// Every numeric and list flag of `bench` at its edges: no panic; accepted (0) or refused (2)
/// naming the flag; nothing written but the --csv file.
#[test]
fn bench_flags_at_their_edges_never_panic_and_name_the_flag() {
    const VALUES: &[&str] = &[
        "0",
        "1",
        "4294967295",
        "4294967296",
        "18446744073709551616",
        "-1",
        "NaN",
        "",
        "x1",
        "1e400",
    ];
    // Each flag with the words a refusal may name it by (the backend's own messages say
    // "sockets per channel"; an unknown NIC is named as "NIC `x`").
    const FLAGS: &[(&str, &[&str])] = &[
        ("--size", &["size"]),
        ("--iters", &["iters"]),
        ("--warmup", &["warmup"]),
        ("--flows", &["flows"]),
        ("--channels", &["channels"]),
        (
            "--socks-per-channel",
            &["socks-per-channel", "sockets per channel"],
        ),
        ("--chunk", &["chunk"]),
        ("--window", &["window"]),
        ("--sock-buf", &["sock-buf"]),
        ("--timeout", &["timeout"]),
        ("--sample-ms", &["sample"]),
        ("--port", &["port"]),
        ("--send-cpus", &["send-cpus"]),
        ("--recv-cpus", &["recv-cpus"]),
        ("--nics", &["nics", "NIC `"]),
        ("--env", &["env"]),
    ];
    // Sizes that would be accepted and large would run a long transfer: the size row takes
    // its edges from the 64 GiB-per-side limit instead of u32's.
    const SIZE_VALUES: &[&str] = &[
        "0", "1", "65G", "1T", "16E", "-1", "NaN", "", "x1", "1e400", "4K..1K",
    ];
    let cases: Vec<(&str, &[&str], &str)> = FLAGS
        .iter()
        .flat_map(|&(flag, names)| {
            let values = if flag == "--size" {
                SIZE_VALUES
            } else {
                VALUES
            };
            values.iter().map(move |&v| (flag, names, v))
        })
        .collect();
    let mut failures = Vec::new();
    // A few at a time: most are refused at once, the accepted ones run a 4K transfer.
    for batch in cases.chunks(8) {
        let running: Vec<_> = batch
            .iter()
            .map(|&(flag, names, value)| {
                let dir = tempfile::tempdir().unwrap();
                let csv = dir.path().join("out.csv");
                // Small settings for the flags not under test (a flag may be given once).
                let mut args = vec!["bench".to_string()];
                for small in ["--iters=1", "--warmup=0", "--timeout=10", "--size=4K"] {
                    if !small.starts_with(&format!("{flag}=")) {
                        args.push(small.into());
                    }
                }
                let arg = format!("{flag}={value}");
                args.push(arg.clone());
                args.push(format!("--csv={}", csv.display()));
                let child = Command::new(bin())
                    .current_dir(dir.path())
                    .args(&args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (dir, arg, names, child)
            })
            .collect();
        for (dir, arg, names, child) in running {
            let o = child.wait_with_output().unwrap();
            let e = stderr(&o);
            let written: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|f| f != "out.csv")
                .collect();
            let ok = match o.status.code() {
                Some(0) => true,
                Some(2) => names.iter().any(|n| e.contains(n)),
                _ => false,
            };
            if !ok || e.contains("panicked") || !written.is_empty() {
                failures.push(format!(
                    "{arg}: status {:?}, wrote {written:?}: {}",
                    o.status.code(),
                    e.lines().last().unwrap_or("")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
