//! The tuning result as something to deploy, end to end over loopback: a plan run leaves
//! tuned.env/tuned.json, `tcpx-run bench` with tuned.env sourced runs the chosen configuration,
//! `apply --format` snippets parse (bash -n, a YAML parser), the bench table has nccl-tests'
//! columns where awk users look for them, and `--json` is one JSON document.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{self, tcpx_run, RunWithDeadline as _};

use harness::text;
use harness::{bin, plan_dir};

/// Runs plan `plan` with the loopback target set, writing under `reports`, and checks that it
/// ran to its verdict (exit 0 or 1, not a usage or run error).
fn run_on_loopback(plan: &Path, reports: &Path) -> Output {
    let out = harness::plan_command(plan, reports)
        .arg("--targets")
        .arg("loopback")
        .output_with_deadline()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "{}",
        text(&out)
    );
    out
}

fn plan_run(reports: &Path) -> PathBuf {
    let (_d, p) = plan_dir(
        "tune",
        r#"
let base = experiment(#{ sizes: ["1M"], iters: 2, warmup: 0, window: 4, chunk: "256K", repeat: 3 });
let rs = compare([
    base.with_knobs(#{ name: "small", label: "small", channels: 1, socks_per_channel: 1 }),
    base.with_knobs(#{ name: "big", label: "big", channels: 2, socks_per_channel: 2 }),
]);
best(rs);
let g = validate();
note(`validate: ${g}`);
"#,
    );
    let out = run_on_loopback(&p, reports);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("tuned settings: "), "{stdout}");
    let dirs: Vec<PathBuf> = std::fs::read_dir(reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

fn bash(script: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .output_with_deadline()
        .unwrap()
}

#[test]
fn a_plan_runs_tuned_env_reproduces_its_winner_and_apply_snippets_parse() {
    let reports = tempfile::tempdir().unwrap();
    let dir = plan_run(reports.path());
    let env = std::fs::read_to_string(dir.join("tuned.env")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tuned.json")).unwrap()).unwrap();
    let chosen = &json["chosen"];
    let label = chosen["label"].as_str().unwrap();
    assert!(["small", "big"].contains(&label), "{json}");
    let channels = chosen["knobs"]["channels"].as_u64().unwrap();
    let socks = chosen["knobs"]["socks_per_channel"].as_u64().unwrap();
    // The files agree with each other and carry evidence for every variable.
    assert!(
        env.contains(&format!("NCCL_NCHANNELS_PER_NET_PEER={channels}\n")),
        "{env}"
    );
    assert!(
        env.contains(&format!("NCCL_SOCKET_NTHREADS={socks}\n")),
        "{env}"
    );
    // The plan varied channels and sockets only: window, chunk and transport are the base
    // values, listed as not tuned and not exported.
    for not_set in [
        "NCCL_P2P_NET_CHUNKSIZE=",
        "NCCL_BUFFSIZE=",
        "UCCL_TCPX_WINDOW_SIZE=",
    ] {
        assert!(!env.contains(not_set), "{not_set} was not decided: {env}");
    }
    assert!(
        env.contains("# window: not tuned by this plan (base value 4)"),
        "{env}"
    );
    assert!(
        env.contains("# transport: not tuned by this plan (base value socket)"),
        "{env}"
    );
    assert!(env.contains(&format!("/{label}: server_gbs ")), "{env}");
    // When the two are tied the cheaper one is chosen; when one wins, it is the winner.
    let ranking = &serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(dir.join("report.json")).unwrap(),
    )
    .unwrap()["rankings"][0];
    if ranking["tied"].as_array().unwrap().is_empty() {
        assert_eq!(ranking["best"], label);
    } else {
        assert_eq!(label, "small", "the cheaper of a tied set: {ranking}");
    }

    // The plan's validate(): a criterion, N/A with the reason where libnccl or two GPUs are
    // missing (CI), else judged on the gain's interval.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let c = report["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"].as_str().unwrap().contains("NCCL's defaults"))
        .unwrap_or_else(|| panic!("no validate criterion: {report}"));
    if c["verdict"] == "not_evaluated" {
        let why = c["detail"].as_str().unwrap();
        assert!(why.contains("nccl") || why.contains("GPU"), "{c}");
    } else {
        assert!(c["detail"].as_str().unwrap().contains("gain "), "{c}");
    }

    // tuned.env sourced into a new bench: the bench runs (and prints) the same knobs.
    let script = format!(
        "set -a; . '{}'; set +a; exec '{}' bench --size 1M --iters 1 --warmup 0 --no-csv",
        dir.join("tuned.env").display(),
        bin()
    );
    let out = bash(&script);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!("channels {channels}  socks/channel {socks}")),
        "{table}"
    );

    // apply: export lines that bash accepts and that set the same values.
    let apply =
        |args: &[&str]| harness::stdout_ok(&tcpx_run().arg("apply").arg(&dir).args(args).run());
    let shell = apply(&[]);
    let o = bash(&format!(
        "set -e\n{shell}\necho \"$NCCL_NCHANNELS_PER_NET_PEER\""
    ));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        channels.to_string(),
        "{}",
        text(&o)
    );
    for format in ["slurm", "torchrun"] {
        let s = apply(&["--format", format]);
        let check = Command::new("bash")
            .args(["-n", "-c", &s])
            .output_with_deadline()
            .unwrap();
        assert!(check.status.success(), "{format}: {s}\n{}", text(&check));
    }
    let slurm = apply(&["--format", "slurm"]);
    assert!(slurm.starts_with("#SBATCH --export=ALL,"), "{slurm}");
    let torchrun = apply(&["--format", "torchrun"]);
    assert!(torchrun.trim_end().ends_with("torchrun"), "{torchrun}");
    let k8s = apply(&["--format", "k8s"]);
    let doc: serde_norway::Value = serde_norway::from_str(&k8s).unwrap();
    let envs = doc["env"].as_sequence().unwrap();
    assert_eq!(envs.len(), json["variables"].as_array().unwrap().len());
    assert!(envs.iter().any(
        |e| e["name"].as_str() == Some("NCCL_NCHANNELS_PER_NET_PEER")
            && e["value"].as_str() == Some(channels.to_string().as_str())
    ));
    // The same from the tuned.env file alone.
    let from_env = tcpx_run().arg("apply").arg(dir.join("tuned.env")).run();
    assert_eq!(String::from_utf8_lossy(&from_env.stdout), shell);
    // No IRQ policy in this plan: --irq has nothing to do and says so.
    let irq = apply(&["--irq"]);
    assert!(irq.contains("nothing to apply"), "{irq}");
}

#[test]
fn apply_refuses_what_it_cannot_read() {
    let d = tempfile::tempdir().unwrap();
    let o = tcpx_run().arg("apply").arg(d.path()).run();
    harness::assert_refused(&o, &["tuned.env"]);
    let bad = d.path().join("tuned.env");
    std::fs::write(&bad, "NCCL_X=$(reboot)\n").unwrap();
    let o = tcpx_run().arg("apply").arg(&bad).run();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn the_table_has_nccl_tests_columns_and_json_is_one_document() {
    // Parsed the way nccl-tests users do: awk on rows that do not start with '#'.
    let script = format!(
        "'{}' bench --size 1M,2M --iters 2 --warmup 0 --no-csv | awk '!/^#/ && NF {{ print $1, $6, $7, $8, $9 }}'",
        bin()
    );
    let o = bash(&script);
    assert!(o.status.success(), "{}", text(&o));
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert_eq!(rows.len(), 2, "one row per size: {rows:?}");
    assert_eq!(rows[0][0], "1048576");
    assert_eq!(rows[1][0], "2097152");
    for r in &rows {
        let time: f64 = r[1].parse().unwrap();
        let algbw: f64 = r[2].parse().unwrap();
        let busbw: f64 = r[3].parse().unwrap();
        assert!(time > 0.0 && algbw > 0.0, "{r:?}");
        assert_eq!(algbw, busbw, "send/recv: busbw = algbw");
        // algbw is size / time (GB/s = 1e9 B/s), to the printed precision.
        let size: f64 = r[0].parse().unwrap();
        let expect = size / (time * 1e-6) / 1e9;
        assert!(
            (algbw - expect).abs() <= 0.01 + expect * 0.01,
            "{r:?} vs {expect}"
        );
        assert_eq!(r[4], "0", "#wrong");
    }
    let foot = bash(&format!(
        "'{}' bench --size 1M --iters 1 --warmup 0 --no-csv | grep '^# Avg bus bandwidth    : '",
        bin()
    ));
    assert!(foot.status.success(), "{}", text(&foot));

    // --json: stdout is one JSON document and nothing else; the table went to stderr.
    let o = tcpx_run()
        .args([
            "bench", "--size", "1M", "--iters", "1", "--warmup", "0", "--no-csv", "--json",
        ])
        .run();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
    let start = &v["start"];
    assert!(
        start["version"].as_str().unwrap().contains("(git "),
        "{start}"
    );
    assert!(!start["host"].as_str().unwrap().is_empty());
    assert!(
        start["timestamp"].as_str().unwrap().ends_with('Z'),
        "{start}"
    );
    assert_eq!(start["experiment"]["channels"], 2);
    assert_eq!(v["measurements"][0]["size"], 1048576);
    assert!(v["measurements"][0]["recv"]["algbw_gbs"].as_f64().unwrap() > 0.0);
    assert_eq!(v["end"]["wrong_bytes"], 0);
    assert!(String::from_utf8_lossy(&o.stderr).contains("# Avg bus bandwidth"));
}

#[test]
fn help_and_version_tell_the_truth() {
    let help = tcpx_run().args(["bench", "--help"]).run();
    let help = String::from_utf8_lossy(&help.stdout);
    for b in ["socket", "netplugin", "nccl", "cudap2p"] {
        assert!(help.contains(b), "--transport lists {b}:\n{help}");
    }
    assert!(help.contains("cuda:S,R"), "{help}");
    for v in [
        "TCPX_CHANNELS",
        "TCPX_TRANSPORT",
        "TCPX_WINDOW",
        "TCPX_CHUNK",
    ] {
        assert!(help.contains(&format!("[env: {v}")), "{v}:\n{help}");
    }
    // Completions: a bash script bash accepts, offering the subcommands.
    let tmp = tempfile::NamedTempFile::new().unwrap();
    let c = bash(&format!(
        "'{}' completions bash > '{p}' && bash -n '{p}' && grep -c validate '{p}'",
        bin(),
        p = tmp.path().display()
    ));
    assert!(c.status.success(), "{}", text(&c));
    let v = tcpx_run().arg("--version").run();
    let v = String::from_utf8_lossy(&v.stdout);
    assert!(v.starts_with("tcpx-run ") && v.contains("(git "), "{v}");
}

#[test]
fn validate_says_na_with_the_reason_where_nccl_or_two_gpus_are_missing() {
    let d = tempfile::tempdir().unwrap();
    let env = d.path().join("tuned.env");
    std::fs::write(&env, "NCCL_SOCKET_NTHREADS=4\nNCCL_NSOCKS_PERTHREAD=4\n").unwrap();
    let o = tcpx_run()
        .args([
            "validate", "--json", "--reps", "1", "--iters", "1", "--size", "1M",
        ])
        .arg(&env)
        .run();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Issue 43: N/A (nothing validated) is exit status 4, not 0.
    let want = if v["status"] == "n/a" { 4 } else { 0 };
    assert_eq!(o.status.code(), Some(want), "{}", text(&o));
    assert_eq!(v["start"]["tool"], "tcpx-run validate");
    let cs = v["collectives"].as_array().unwrap();
    let names: Vec<&str> = cs
        .iter()
        .map(|c| c["collective"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sendrecv", "allreduce"], "{v}");
    match v["status"].as_str().unwrap() {
        // This is what CI (no GPU, no libnccl) sees: each collective N/A, the reason naming what
        // is missing.
        "n/a" => {
            for c in cs {
                assert_eq!(c["status"], "n/a", "{v}");
                let why = c["reason"].as_str().unwrap();
                assert!(why.contains("libnccl") || why.contains("GPU"), "{why}");
            }
        }
        // On a machine with libnccl and two GPUs: a gain with its interval for the size.
        "ok" => {
            for c in cs {
                let s = &c["sizes"][0];
                assert_eq!(s["size"], 1048576);
                assert!(s["gain"].as_f64().is_some(), "{v}");
            }
        }
        other => panic!("status {other}: {v}"),
    }
    // The table says N/A (or gives the rows) for both collectives.
    let o = tcpx_run()
        .args(["validate", "--reps", "1", "--iters", "1", "--size", "1M"])
        .arg(&env)
        .run();
    assert_eq!(o.status.code(), Some(want), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    for c in ["sendrecv", "allreduce"] {
        assert!(
            t.contains(&format!("# {c}: N/A: "))
                || t.lines().any(|l| l.trim_start().starts_with(c)),
            "{t}"
        );
    }
    let o = tcpx_run().args(["validate", "--gpus", "0"]).arg(&env).run();
    harness::assert_refused(&o, &["S,R"]);
    // Issue 43: a --net-plugin path that names no file was accepted.
    let missing = d.path().join("no-such-plugin.so");
    let o = tcpx_run()
        .args([
            "validate",
            "--reps",
            "1",
            "--iters",
            "1",
            "--size",
            "1M",
            "--net-plugin",
        ])
        .arg(&missing)
        .arg(&env)
        .run();
    harness::assert_refused(&o, &["--net-plugin", "no-such-plugin.so", "no such file"]);
    // --help says what one GPU means.
    let o = tcpx_run().args(["validate", "--help"]).run();
    let h = String::from_utf8_lossy(&o.stdout);
    assert!(h.contains("one GPU") && h.contains("0,0"), "{h}");
}

#[test]
fn apply_irq_goes_through_irq_apply_with_backup_and_reset() {
    // The A3-high fixture tree stands in for /proc and /sys.
    let tmp = tcpx_test_support::writable_fixture("a3-high");
    let root = tmp.path().to_str().unwrap();
    let mask = |irq: u32| {
        std::fs::read_to_string(tmp.path().join(format!("proc/irq/{irq}/smp_affinity"))).unwrap()
    };
    let original = mask(58);
    let env = tmp.path().join("tuned.env");
    std::fs::write(&env, "NCCL_SOCKET_NTHREADS=4\n# tcpx-irq-policy: nccl\n").unwrap();
    let apply = |extra: &[&str]| {
        harness::stdout_ok(
            &tcpx_run()
                .arg("apply")
                .arg(&env)
                .args(["--irq", "--root", root])
                .args(extra)
                .run(),
        )
    };
    let dry = apply(&[]);
    assert!(dry.contains("Dry run: nothing was written"), "{dry}");
    assert_eq!(mask(58), original);
    let done = apply(&["--yes"]);
    assert!(done.contains("Applied and verified 64 IRQ(s)"), "{done}");
    assert_ne!(
        mask(58),
        original,
        "eth1 RX queue 0 moved to NCCL's RX cores"
    );
    assert!(tmp.path().join("run/tcpx-lab/irq-backup.json").exists());
    // `irq reset` puts back what the backup holds.
    let reset = || {
        let out = tcpx_run()
            .args(["irq", "--root", root, "reset", "--yes"])
            .run();
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(mask(58), original);
    };
    reset();
    // numa-local: every CPU of the NIC's NUMA node, through the same machinery.
    std::fs::write(
        &env,
        "NCCL_SOCKET_NTHREADS=4\n# tcpx-irq-policy: numa-local\n",
    )
    .unwrap();
    let done = apply(&["--yes"]);
    assert!(done.contains("Applied and verified 64 IRQ(s)"), "{done}");
    let set = |irq: u32| tcpx_topo::CpuSet::parse_mask(&mask(irq)).unwrap();
    // eth1's RX queue 0 (IRQ 58) and TX queue 0 (IRQ 50) on the first CPU of NUMA node 0, and
    // eth3's (IRQ 92, NUMA node 1) on the first CPU of node 1: not on NCCL's split halves.
    assert_eq!(set(58).to_string(), "0", "{done}");
    assert_eq!(set(50).to_string(), "0", "{done}");
    assert_eq!(set(92).to_string(), "52", "{done}");
    reset();
    // A policy the machine cannot express says why and changes nothing.
    let lo = tcpx_test_support::writable_fixture("single-socket-lo");
    for policy in ["nccl", "numa-local"] {
        std::fs::write(&env, format!("# tcpx-irq-policy: {policy}\n")).unwrap();
        let o = tcpx_run()
            .arg("apply")
            .arg(&env)
            .args(["--irq", "--yes", "--root"])
            .arg(lo.path())
            .run();
        harness::assert_refused(&o, &["no data NIC"]);
        assert!(!lo.path().join("run/tcpx-lab/irq-backup.json").exists());
    }
    std::fs::write(&env, "NCCL_SOCKET_NTHREADS=4\n# tcpx-irq-policy: nccl\n").unwrap();
    // The exports of the same file say where the IRQ part went.
    let o = tcpx_run().arg("apply").arg(&env).run();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--irq"),
        "{}",
        text(&o)
    );
}

/// Runs `src` as plan `name` over loopback with 1M messages and 2 iterations (everything else
/// from the loopback target set) and returns its report directory.
fn small_plan_run(reports: &Path, name: &str, src: &str) -> PathBuf {
    let (d, p) = plan_dir(name, src);
    let t = d.path().join("targets/loopback.toml");
    let toml = std::fs::read_to_string(&t)
        .unwrap()
        .replace("sizes = [\"4M\", \"16M\"]", "sizes = [\"1M\"]")
        .replace("iters = 10", "iters = 2");
    std::fs::write(&t, toml).unwrap();
    run_on_loopback(&p, reports);
    std::fs::read_dir(reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&format!("-{name}")))
        .unwrap()
}

#[test]
fn phase1_affinity_exports_nothing_it_did_not_decide() {
    let reports = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans/phase1_affinity.rhai"),
    )
    .unwrap();
    let dir = small_plan_run(reports.path(), "phase1_affinity", &src);
    let env = std::fs::read_to_string(dir.join("tuned.env")).unwrap();
    let vars = tcpx_report::tuned::parse_env(&env).unwrap().vars;
    // The plan varies thread binding only: channels, sockets, chunk and window are the base
    // values and must not be exported. Binding itself has no NCCL variable (numa-local) or did
    // not act here (one NUMA node): nothing is exported at all.
    assert!(vars.is_empty(), "{vars:?}\n{env}");
    for k in ["channels", "socks_per_channel", "chunk", "window"] {
        assert!(
            env.contains(&format!("# {k}: not tuned by this plan (base value ")),
            "{k}: {env}"
        );
    }
    // The report says how its comparison ended and which noise level applied.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let seq = &report["sequential"][0];
    assert!(seq["rounds"].as_u64().unwrap() >= 3, "{seq}");
    assert!(
        ["decided", "budget", "cannot_decide"].contains(&seq["stop"].as_str().unwrap()),
        "{seq}"
    );
    assert!(
        report["noise"]["source"]
            .as_str()
            .unwrap()
            .starts_with("measured by this run's A/A"),
        "{}",
        report["noise"]
    );
}

#[test]
fn apply_merges_three_runs_names_conflicts_and_each_value_s_run() {
    let reports = tempfile::tempdir().unwrap();
    let run = |name: &str, axis: &str| {
        small_plan_run(
            reports.path(),
            name,
            &format!(
                r#"
let base = experiment(#{{ sizes: ["1M"], iters: 2, warmup: 0, window: 4, chunk: "256K", channels: 1 }});
best({axis});
"#
            ),
        )
    };
    // window x 256K chunks is 512K or 1M; window 4 x 32K/64K chunks is 128K or 256K: the two
    // runs always disagree on NCCL_BUFFSIZE.
    let window = run("win", r#"sweep(base, "window", [2, 4])"#);
    let chunk = run("chk", r#"sweep(base, "chunk", ["32K", "64K"])"#);
    let channels = run("chan", r#"sweep(base, "channels", [1, 2])"#);
    let apply = |args: &[&str]| {
        tcpx_run()
            .arg("apply")
            .args([&window, &chunk, &channels])
            .args(args)
            .run()
    };
    let refused = apply(&[]);
    harness::assert_refused(&refused, &["NCCL_BUFFSIZE is set to", "-win)", "-chk)"]);
    assert!(refused.stdout.is_empty());

    let env = apply(&["--on-conflict", "last", "--format", "env"]);
    assert!(env.status.success(), "{}", text(&env));
    let merged = String::from_utf8_lossy(&env.stdout);
    let vars = tcpx_report::tuned::parse_env(&merged).unwrap().vars;
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    // Each run contributes what it decided, and each value names its run.
    assert!(get("UCCL_TCPX_WINDOW_SIZE").is_some(), "{merged}");
    assert!(get("UCCL_TCPX_CHUNK_BYTES").is_some(), "{merged}");
    assert!(get("NCCL_NCHANNELS_PER_NET_PEER").is_some(), "{merged}");
    assert!(merged.contains("(conflict: overruled "), "{merged}");
    for (k, run) in [
        ("UCCL_TCPX_WINDOW_SIZE", "-win"),
        ("NCCL_NCHANNELS_PER_NET_PEER", "-chan"),
    ] {
        let i = merged.find(&format!("\n{k}=")).unwrap();
        let comment = merged[..i].lines().last().unwrap();
        assert!(
            comment.starts_with("# from ") && comment.ends_with(run),
            "{comment}"
        );
    }
    // The same set works as job snippets.
    for format in ["slurm", "torchrun"] {
        let o = apply(&["--on-conflict", "last", "--format", format]);
        assert!(o.status.success(), "{}", text(&o));
        let s = String::from_utf8_lossy(&o.stdout);
        let check = Command::new("bash")
            .args(["-n", "-c", &s])
            .output_with_deadline()
            .unwrap();
        assert!(check.status.success(), "{format}: {s}\n{}", text(&check));
        assert!(s.contains("NCCL_NCHANNELS_PER_NET_PEER="), "{s}");
    }
    let k8s = apply(&["--on-conflict", "last", "--format", "k8s"]);
    let doc: serde_norway::Value =
        serde_norway::from_str(&String::from_utf8_lossy(&k8s.stdout)).unwrap();
    assert_eq!(doc["env"].as_sequence().unwrap().len(), vars.len());
}
