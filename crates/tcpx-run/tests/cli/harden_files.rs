//! Hardening of files, shells and plans, end to end through the real binary (issue 27, the
//! files half): oversized and endless inputs for every command that reads a file, injection
//! bytes in names, labels and values that reach tuned.env and `apply`'s snippets, `kill -9`
//! during report writes, concurrent runs in one reports directory, IRQ backups under the wrong
//! root, and runs that measured nothing.

use crate::harness::{self, tcpx_run, RunWithDeadline as _};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use harness::{bin, copy_tree, fixture_dir, plan_command, plan_dir};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `tcpx-run args` run by bash after `limits` (a fixed `ulimit`/`trap` line, never user input);
/// the arguments reach tcpx-run as bash's positional parameters, so none is parsed by the shell.
fn under_limits(limits: &str, args: &[&str]) -> Command {
    let mut script = format!("{limits}; exec \"$0\"");
    for i in 0..args.len() {
        script.push_str(&format!(" \"${}\"", i + 1));
    }
    let mut c = Command::new("bash");
    c.arg("-c").arg(script).arg(bin()).args(args);
    c
}

/// `tcpx-run args` under an address-space limit of 2 GiB, so that an unbounded read fails
/// (allocation) instead of taking the machine's memory.
fn limited(args: &[&str]) -> Output {
    under_limits("ulimit -v 2097152", args)
        .stdin(Stdio::null())
        .output_with_deadline()
        .unwrap()
}

/// Refused with status 2, no panic, the message naming `path` and its limit (or, for a
/// device such as /dev/zero, that it is not a regular file).
fn refused_for_size(args: &[&str], path: &str, limit: &str) {
    let o = limited(args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
    let says = if path == "/dev/zero" || path.ends_with("/zero.rhai") {
        "is a character device, not a regular file".to_string()
    } else {
        format!("larger than {limit}")
    };
    assert!(
        e.contains(path) && e.contains(&says),
        "{args:?} should name {path} and say `{says}`: {e}"
    );
}

/// A writable copy of a fixture tree.
fn writable_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    copy_tree(&fixture_dir(name), &root);
    (d, root)
}

#[test]
fn endless_and_huge_inputs_are_refused_naming_the_file_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    // A 4 GiB file that takes no disk space.
    let huge = |name: &str| {
        let p = dir.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(4 << 30).unwrap();
        p.display().to_string()
    };
    let (plan, json, env, xml, toml) = (
        huge("huge.rhai"),
        huge("tuned.json"),
        huge("tuned.env"),
        huge("m.xml"),
        huge("t.toml"),
    );
    let zero_plan = dir.path().join("zero.rhai");
    std::os::unix::fs::symlink("/dev/zero", &zero_plan).unwrap();
    let zero_plan = zero_plan.display().to_string();
    let reports = dir.path().join("reports").display().to_string();
    let (_d, small) = plan_dir("small", "run(experiment(#{ size: \"4K\" }));\n");
    let small = small.display().to_string();
    let a3 = fixture_dir("a3-high").display().to_string();
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (vec!["plan", "/dev/zero"], "/dev/zero", "1 MiB"),
        (vec![&zero_plan, "--dry-run"], &zero_plan, "1 MiB"),
        (vec![&plan, "--dry-run"], &plan, "1 MiB"),
        (
            vec![
                &small,
                "--targets",
                &toml,
                "--dry-run",
                "--reports",
                &reports,
            ],
            &toml,
            "1 MiB",
        ),
        (vec!["apply", "/dev/zero"], "/dev/zero", "1 MiB"),
        (vec!["apply", &json], &json, "1 MiB"),
        (vec!["apply", &env, "--format", "k8s"], &env, "1 MiB"),
        (vec!["validate", "/dev/zero"], "/dev/zero", "1 MiB"),
        (vec!["validate", &json], &json, "1 MiB"),
        (
            vec!["topo", "--root", &a3, "--hwloc-xml", "/dev/zero"],
            "/dev/zero",
            "64 MiB",
        ),
        (
            vec!["topo", "--root", &a3, "--hwloc-xml", &xml],
            &xml,
            "64 MiB",
        ),
        (
            vec![
                "irq",
                "--root",
                &a3,
                "--backup",
                "/dev/zero",
                "reset",
                "--yes",
            ],
            "/dev/zero",
            "16 MiB",
        ),
    ];
    for (args, path, limit) in &cases {
        refused_for_size(args, path, limit);
    }
}

/// Issue 43 item 3: a FIFO as any input file hung in open() forever. Each command refuses it at
/// once (well within the deadline), naming the path and that it is a FIFO.
#[test]
fn fifos_as_any_input_are_refused_at_once_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = |name: &str| {
        let p = dir.path().join(name);
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        p.display().to_string()
    };
    let (plan, module, toml, tuned, xml, backup, token) = (
        fifo("fifo.rhai"),
        fifo("m.rhai"),
        fifo("t.toml"),
        fifo("tuned.env"),
        fifo("m.xml"),
        fifo("backup.json"),
        fifo("token"),
    );
    let importer = dir.path().join("p.rhai");
    std::fs::write(
        &importer,
        "import \"m\" as m;\nrun(experiment(#{ size: \"4K\" }));\n",
    )
    .unwrap();
    let importer = importer.display().to_string();
    let reports = dir.path().join("reports").display().to_string();
    let (_d, small) = plan_dir("small", "run(experiment(#{ size: \"4K\" }));\n");
    let small = small.display().to_string();
    let a3 = fixture_dir("a3-high").display().to_string();
    let loopback = harness::plans()
        .join("targets/loopback.toml")
        .display()
        .to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![&plan, "--dry-run"], &plan),
        (
            vec![
                &importer,
                "--dry-run",
                "--reports",
                &reports,
                "--targets",
                &loopback,
            ],
            &module,
        ),
        (
            vec![
                &small,
                "--targets",
                &toml,
                "--dry-run",
                "--reports",
                &reports,
            ],
            &toml,
        ),
        (vec!["apply", &tuned], &tuned),
        (vec!["validate", &tuned], &tuned),
        (vec!["topo", "--root", &a3, "--hwloc-xml", &xml], &xml),
        (
            vec!["irq", "--root", &a3, "--backup", &backup, "reset", "--yes"],
            &backup,
        ),
        (
            vec!["follow", "--leader", "127.0.0.1:9", "--token-file", &token],
            &token,
        ),
        (
            vec![
                "fleet",
                "--rank",
                "0",
                "--nodes",
                "2",
                "--nics",
                "127.0.0.1",
                "--token-file",
                &token,
            ],
            &token,
        ),
    ];
    for (args, path) in &cases {
        let child = Command::new(bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = harness::output_within(child, Duration::from_secs(30))
            .unwrap_or_else(|o| panic!("{args:?} hung on the FIFO: {}", stderr(&o)));
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
        assert!(
            e.contains(path) && e.contains("FIFO"),
            "{args:?} should name the FIFO {path}: {e}"
        );
        assert!(!e.contains("did you mean"), "{args:?}: {e}");
    }
}

/// Issue 43 item 1: a module importing itself aborted tcpx-run (exit 134, a stack overflow);
/// it is refused at the import, exit 2.
#[test]
fn an_import_cycle_is_refused_with_exit_2_not_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.rhai"), "import \"m\" as s;\n").unwrap();
    let plan = dir.path().join("p.rhai");
    std::fs::write(&plan, "import \"m\" as s;\nphase(\"x\");\n").unwrap();
    let loopback = harness::plans().join("targets/loopback.toml");
    let child = Command::new(bin())
        .arg(&plan)
        .arg("--dry-run")
        .arg("--targets")
        .arg(&loopback)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = harness::output_within(child, Duration::from_secs(60))
        .unwrap_or_else(|o| panic!("the cycle hung: {}", stderr(&o)));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("p.rhai:1:8:") && e.contains("import cycle") && e.contains("m.rhai -> m.rhai"),
        "{e}"
    );
}

/// Issue 43 item 10: under `ulimit -v 200000` a multi-process plan aborted or panicked the
/// leader (threads or buffers that could not be had, or glibc's 64 MiB arena per contending
/// thread using up the limit, which tcpx-run now caps): the run ends without a panic or an
/// abort, an experiment that cannot have its memory failing with an error naming what failed.
#[test]
fn a_low_address_space_limit_fails_experiments_not_the_leader() {
    let (_d, plan) = plan_dir(
        "mp",
        "run(experiment(#{ sizes: [\"16M\"], flows: 4, channels: 1, iters: 2, warmup: 0, \
         sample: false, process_mode: \"multi-process\", repeat: 1 }));\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let loopback = harness::plans().join("targets/loopback.toml");
    let (plan, reports, loopback) = (
        plan.display().to_string(),
        reports.path().display().to_string(),
        loopback.display().to_string(),
    );
    let child = under_limits(
        "ulimit -v 200000",
        &[
            &plan,
            "--targets",
            &loopback,
            "--reports",
            &reports,
            "--yes",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let o = harness::output_within(child, Duration::from_secs(120))
        .unwrap_or_else(|o| panic!("the run hung: {}", stderr(&o)));
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    assert!(
        !matches!(o.status.code(), Some(101) | Some(134) | None),
        "{:?}: {e}",
        o.status
    );
}

/// Runs the plan `plan` with its reports under `reports`, which it must pass; its run directory.
fn run_plan(plan: &Path, reports: &Path) -> PathBuf {
    let o = plan_command(plan, reports).output_with_deadline().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::read_dir(reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// A tuned.json planted with names and values that would break out of `export`, `#SBATCH`, a
/// torchrun prefix or YAML: every format refuses it, naming the file, and prints nothing.
#[test]
fn apply_refuses_hostile_names_and_values_in_every_format() {
    let (_d, p) = plan_dir(
        "t",
        // Two channel counts, so that tuned.json exports a decided variable to plant into.
        "run(experiment(#{ size: \"1M\", iters: 1, warmup: 0, channels: 1 }));\n\
         run(experiment(#{ size: \"1M\", iters: 1, warmup: 0, channels: 2 }));\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let run = run_plan(&p, reports.path());
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("tuned.json")).unwrap()).unwrap();
    for (name, value) in [
        ("EVIL;touch pwned", "524288"),
        ("LD_PRELOAD", "/tmp/evil.so"),
        ("BASH_ENV", "/tmp/evil.sh"),
        ("", "1"),
        ("A B", "1"),
        ("lower", "1"),
        ("NCCL_X", "1\n#SBATCH --wrap='touch pwned'"),
        ("NCCL_X", "1\r\ntouch pwned"),
        ("NCCL_X", "a\u{0}b"),
        ("NCCL_X", "\u{2028}- name: X"),
    ] {
        let mut t = good.clone();
        t["variables"][0]["name"] = name.into();
        t["variables"][0]["value"] = value.into();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tuned.json");
        std::fs::write(&file, serde_json::to_vec(&t).unwrap()).unwrap();
        for format in ["shell", "slurm", "torchrun", "k8s"] {
            let o = tcpx_run()
                .arg("apply")
                .arg(&file)
                .args(["--format", format])
                .run();
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{name:?}={value:?} {format}: {e}");
            assert!(stdout(&o).is_empty(), "{name:?} {format}: {}", stdout(&o));
            assert!(e.contains("tuned.json"), "{e}");
            assert_eq!(e.lines().count(), 1, "the error is one line: {e}");
        }
    }
}

/// A tuned.env of bytes that are not text, or with a line no parser should take: refused,
/// naming the file and the line.
#[test]
fn apply_refuses_tuned_env_files_that_are_not_plain_assignments() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuned.env");
    for (bytes, says) in [
        (&b"NCCL_X=\xff\xfe\n"[..], "not UTF-8"),
        (b"NCCL_X=1\nEVIL;touch pwned=1\n", "line 2"),
        (b"NCCL_X='a\rb'\n", "control character"),
        (b"NCCL_X=$(touch pwned)\n", "line 1"),
        (b"export lower=1\n", "not a variable name"),
        (
            b"NCCL_X=1\nLD_PRELOAD=/tmp/evil.so\n",
            "`LD_PRELOAD` is not a variable tuned files set",
        ),
    ] {
        std::fs::write(&file, bytes).unwrap();
        let o = tcpx_run()
            .arg("apply")
            .arg(&file)
            .current_dir(dir.path())
            .run();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bytes:?}: {e}");
        assert!(
            e.contains("tuned.env") && e.contains(says),
            "{bytes:?}: {e}"
        );
        assert!(stdout(&o).is_empty());
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// The case: an experiment name and label holding a newline and `$(touch ...)`.
/// Sourcing tuned.env the README's way runs nothing and sets exactly its variables; `apply`
/// evaluated by bash and the k8s YAML carry the same values.
#[test]
fn a_planted_command_in_a_plan_reaches_no_shell() {
    let (_d, p) = plan_dir(
        "inject",
        // Two channel counts, so that the channel variable is decided and exported.
        "let b = experiment(#{ name: \"x\\n$(touch pwned)\\n\", label: \"l\\r\\ntouch pwned #\", size: \"1M\", iters: 1, warmup: 0, memory: \"host\" });\n\
         let c = experiment(#{ name: \"y\\n$(touch pwned)\\n\", label: \"m\\r\\ntouch pwned #\", size: \"1M\", iters: 1, warmup: 0, memory: \"host\", channels: 2 });\n\
         run(b);\nrun(c);\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let run = run_plan(&p, reports.path());
    let env = std::fs::read_to_string(run.join("tuned.env")).unwrap();
    assert!(
        env.contains("x\\n$(touch pwned)\\n"),
        "escaped in its comment: {env}"
    );
    let work = tempfile::tempdir().unwrap();
    let o = Command::new("bash")
        .args(["--norc", "--noprofile", "-c"])
        .arg(format!(
            "set -a; . '{}'; set +a; eval \"$('{}' apply '{}')\"; echo \"$TCPX_CHANNELS\"",
            run.join("tuned.env").display(),
            bin(),
            run.display()
        ))
        .current_dir(work.path())
        .output_with_deadline()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let channels = stdout(&o).trim().to_string();
    assert!(
        channels == "1" || channels == "2",
        "the chosen channel count: {channels:?}"
    );
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "sourcing or eval ran a planted command"
    );
    let o = tcpx_run()
        .arg("apply")
        .arg(&run)
        .args(["--format", "k8s"])
        .run();
    #[derive(serde::Deserialize)]
    struct Item {
        name: String,
        value: String,
    }
    #[derive(serde::Deserialize)]
    struct Doc {
        env: Vec<Item>,
    }
    let doc: Doc = serde_norway::from_str(&stdout(&o)).unwrap();
    assert!(doc
        .env
        .iter()
        .any(|i| i.name == "TCPX_CHANNELS" && i.value == channels));
}

/// A file of the run directory is whole: what a reader of that type needs is all there.
fn check_whole(path: &Path) {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let bytes = std::fs::read(path).unwrap();
    let text = || String::from_utf8(bytes.clone()).unwrap();
    match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => {
            let mut r = csv::Reader::from_reader(bytes.as_slice());
            let width = r.headers().unwrap().len();
            for rec in r.records() {
                let rec = rec.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(rec.len(), width, "{name}: a row cut short");
            }
            assert!(bytes.ends_with(b"\n"), "{name} ends mid-row");
        }
        Some("json") => {
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|e| panic!("{name} is not whole JSON: {e}"));
        }
        Some("html") => assert!(text().trim_end().ends_with("</html>"), "{name} cut"),
        Some("svg") => assert!(text().trim_end().ends_with("</svg>"), "{name} cut"),
        Some("png") => assert!(
            bytes.starts_with(b"\x89PNG") && bytes.ends_with(b"IEND\xaeB`\x82"),
            "{name} cut"
        ),
        Some("md") => assert!(text().starts_with("# ") && text().ends_with('\n'), "{name}"),
        Some("env") => assert!(
            Command::new("bash")
                .arg("-n")
                .arg(path)
                .status()
                .unwrap()
                .success(),
            "{name}"
        ),
        _ => {}
    }
}

/// Every file of a (killed) run directory, charts included, is whole; temporary files are
/// hidden (start with `.`), never under a report file's name.
fn check_run_dir(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let hidden = p.file_name().unwrap().to_string_lossy().starts_with('.');
        if p.is_dir() {
            n += check_run_dir(&p);
        } else if !hidden {
            check_whole(&p);
            n += 1;
        }
    }
    n
}

/// `kill -9` while a run writes its report, a dozen times at different moments: each file
/// present is whole (results.csv was left cut mid-row, index.html at 0 bytes, when files were
/// rewritten in place). A kill is sent when results.csv is seen empty or shrinking (caught
/// mid-rewrite), else after its k-th update.
#[test]
fn kill_9_during_report_writes_leaves_every_file_whole() {
    let (_d, p) = plan_dir(
        "killed",
        "let b = experiment(#{ size: \"1M\", iters: 1, warmup: 0, repeat: 1, sample: false });\n\
         let rs = sweep(b, \"window\", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]);\n\
         chart(#{ title: \"w\", kind: \"bar\", metric: \"server\", results: rs });\n",
    );
    let mut checked = 0;
    for k in 1..=12u32 {
        let reports = tempfile::tempdir().unwrap();
        let mut child = plan_command(&p, reports.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut updates, mut last_len, mut last_mtime) = (0u32, None::<u64>, None);
        loop {
            assert!(Instant::now() < deadline, "run {k}: no report writes seen");
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let results = std::fs::read_dir(reports.path())
                .unwrap()
                .next()
                .map(|e| e.unwrap().path().join("results.csv"));
            if let Some(m) = results.and_then(|r| std::fs::metadata(r).ok()) {
                let (len, mtime) = (m.len(), m.modified().ok());
                let shrank = last_len.is_some_and(|l| len < l) || len == 0;
                if last_mtime.is_some() && mtime != last_mtime {
                    updates += 1;
                }
                if shrank || updates >= k {
                    child.kill().unwrap();
                    break;
                }
                (last_len, last_mtime) = (Some(len), mtime);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        child.wait().unwrap();
        for run in std::fs::read_dir(reports.path()).unwrap() {
            checked += check_run_dir(&run.unwrap().path());
        }
    }
    assert!(checked > 12, "only {checked} files were checked");
}

/// UTC stamps (`20261124T000000Z`) of the next `n` seconds from now.
fn stamps(n: u64) -> Vec<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now..now + n)
        .map(|t| {
            let o = Command::new("date")
                .args(["-u", "-d", &format!("@{t}"), "+%Y%m%dT%H%M%SZ"])
                .output_with_deadline()
                .unwrap();
            stdout(&o).trim().to_string()
        })
        .collect()
}

/// Two runs in one reports directory in the same second: each keeps its own directory and
/// results. A run directory that exists already (another run's, of this second) is never
/// written into; two runs started together both finish with their results.
#[test]
fn runs_in_the_same_second_never_share_a_directory() {
    let (_d, p) = plan_dir(
        "same",
        "run(experiment(#{ size: \"1M\", iters: 1, warmup: 0, repeat: 1, sample: false }));\n",
    );
    let reports = tempfile::tempdir().unwrap();
    // Another run's directories for every second this test could start in.
    let taken: Vec<PathBuf> = stamps(120)
        .iter()
        .map(|s| reports.path().join(format!("{s}-same")))
        .collect();
    for t in &taken {
        std::fs::create_dir(t).unwrap();
        std::fs::write(t.join("results.csv"), "another run's\n").unwrap();
    }
    let start = || {
        plan_command(&p, reports.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    for t in &taken {
        assert_eq!(
            std::fs::read_to_string(t.join("results.csv")).unwrap(),
            "another run's\n",
            "{} was written into",
            t.display()
        );
    }
    let dir_of = |o: &Output| {
        let out = stdout(o);
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("report: "))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        PathBuf::from(line).parent().unwrap().to_path_buf()
    };
    let (da, db) = (dir_of(&a), dir_of(&b));
    assert_ne!(da, db);
    for d in [&da, &db] {
        assert!(
            d.file_name()
                .unwrap()
                .to_string_lossy()
                .ends_with("-same-2")
                || d.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .ends_with("-same-3"),
            "{}",
            d.display()
        );
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("report.json")).unwrap()).unwrap();
        assert_eq!(r["records"].as_array().unwrap().len(), 1, "{}", d.display());
    }
}

/// A run in which every experiment was refused says NOTHING MEASURED, not PASS; exit 0 unless
/// `--require-measured`, which makes it 2. A NaN value under a criterion is N/A.
#[test]
fn a_run_that_measured_nothing_is_not_a_pass() {
    let (_d, p) = plan_dir(
        "refused",
        "let r = run(experiment(#{ size: \"4K\", iters: 1, warmup: 0, window: 128 }));\n\
         criterion(\"ratio > 1\", 0.0 / 0.0, \">\", 1.0);\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        plan_command(&p, reports.path())
            .args(extra)
            .output_with_deadline()
            .unwrap()
    };
    let o = run(&[]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.starts_with("plan refused: NOTHING MEASURED (every experiment was refused: 1 skipped"),
        "{out}"
    );
    assert!(!out.contains("PASS"), "{out}");
    assert!(out.contains("[N/A] ratio > 1"), "{out}");
    assert!(stderr(&o).contains("--require-measured"), "{}", stderr(&o));
    let o = run(&["--require-measured"]);
    harness::assert_refused(&o, &["error: no experiment measured anything here"]);
}

#[test]
fn irq_reset_with_the_wrong_root_keeps_the_backup_and_unknown_nics_are_refused() {
    let (_a, root) = writable_fixture("a3-high");
    let (_b, other) = writable_fixture("a3-high");
    let backup = tempfile::tempdir().unwrap();
    let backup = backup.path().join("irq-backup.json");
    let (root_s, other_s, backup_s) = (
        root.display().to_string(),
        other.display().to_string(),
        backup.display().to_string(),
    );
    let irq = |args: &[&str]| tcpx_run().arg("irq").args(args).run();
    let o = irq(&["--root", &root_s, "--backup", &backup_s, "apply", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(backup.exists());
    let o = irq(&["--root", &other_s, "--backup", &backup_s, "reset", "--yes"]);
    harness::assert_refused(&o, &["nothing was restored and the backup stays"]);
    assert!(
        backup.exists(),
        "the backup was deleted after restoring nothing"
    );
    let o = irq(&["--root", &root_s, "--backup", &backup_s, "reset", "--yes"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!backup.exists());
    // A NIC that is not there is refused, not silently left out.
    let o = irq(&[
        "--root",
        &root_s,
        "plan",
        "--tx",
        "eth1:8-9;eth9:10",
        "--rx",
        "eth1:22",
    ]);
    harness::assert_refused(&o, &["--tx: NIC `eth9` is not on this machine"]);
}

#[test]
fn validate_refuses_a_size_of_zero() {
    let o = tcpx_run()
        .args(["validate", "/nonexistent", "--size", "0"])
        .run();
    harness::assert_refused(&o, &["--size `0`"]);
}

#[test]
fn doctor_fails_bindings_that_name_no_nic() {
    let o = tcpx_run()
        .args(["doctor", "--root"])
        .arg(fixture_dir("a3-high"))
        .args(["--rx-bindings", ";;;", "--tx-bindings", " ; "])
        .env_remove("NCCL_GPUDIRECTTCPX_TX_BINDINGS")
        .env_remove("NCCL_GPUDIRECTTCPX_RX_BINDINGS")
        .run();
    let out = stdout(&o);
    for check in ["rx_bindings", "tx_bindings"] {
        let line = out
            .lines()
            .find(|l| l.contains(check))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(
            line.contains("FAIL") && line.contains("names no NIC"),
            "{line}"
        );
    }
}

/// `tcpx-run args` with a file-size limit of `kib` KiB (SIGXFSZ ignored, so a write past it
/// fails with EFBIG as a full disk fails a write with ENOSPC), with TMPDIR set to `tmp`.
fn with_file_limit(kib: u32, tmp: &Path, args: &[&str]) -> Output {
    under_limits(&format!("trap '' XFSZ; ulimit -f {kib}"), args)
        .env("TMPDIR", tmp)
        .output_with_deadline()
        .unwrap()
}

/// Names of everything under `dir`, recursively, relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.strip_prefix(dir).unwrap().display().to_string();
        if p.is_dir() {
            out.extend(tree(&p).into_iter().map(|n| format!("{name}/{n}")));
        }
        out.push(name);
    }
    out
}

/// A write that fails part way (a full disk, here a file-size limit) names the file, and
/// leaves no temporary file: the IRQ backup (an `irq-backup.json.tmp` was left behind), and
/// the report files of a plan run (each error names its file; the run exits 2 naming both
/// places it tried).
#[test]
fn a_write_that_fails_part_way_names_the_file_and_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (_a, root) = writable_fixture("a3-high");
    let backup_dir = tempfile::tempdir().unwrap();
    let backup = backup_dir.path().join("irq-backup.json");
    let o = with_file_limit(
        1,
        tmp.path(),
        &[
            "irq",
            "--root",
            root.to_str().unwrap(),
            "--backup",
            backup.to_str().unwrap(),
            "apply",
            "--yes",
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("irq-backup.json.tmp") && e.contains("File too large"),
        "{e}"
    );
    assert!(
        tree(backup_dir.path()).is_empty(),
        "{:?}",
        tree(backup_dir.path())
    );

    let (_d, p) = plan_dir(
        "full",
        "run(experiment(#{ size: \"1M\", iters: 1, warmup: 0, repeat: 1, sample: false }));\n",
    );
    let reports = tempfile::tempdir().unwrap();
    let o = with_file_limit(
        4,
        tmp.path(),
        &[
            p.to_str().unwrap(),
            "--reports",
            reports.path().to_str().unwrap(),
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("File too large") && e.contains(".tmp."), "{e}");
    assert!(e.contains(&reports.path().display().to_string()), "{e}");
    for dir in [reports.path(), tmp.path()] {
        let left: Vec<String> = tree(dir)
            .into_iter()
            .filter(|n| n.rsplit('/').next().unwrap().starts_with('.'))
            .collect();
        assert!(
            left.is_empty(),
            "temporary files left in {}: {left:?}",
            dir.display()
        );
    }
}

/// A file a non-root user may not read (an IRQ backup in root's 0700 directory): the error
/// names the file and says that it needs root.
#[test]
fn permission_denied_as_non_root_names_the_file_and_says_it_needs_root() {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: needs root to drop to another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let backup = dir.path().join("irq-backup.json");
    std::fs::write(&backup, "{}").unwrap();
    let root = fixture_dir("a3-high");
    let out = match Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
        .args(["irq", "--root", root.to_str().unwrap()])
        .args(["--backup", backup.to_str().unwrap(), "show"])
        .output_with_deadline()
    {
        Ok(o) => o,
        Err(e) => {
            println!("SKIP: setpriv not available ({e})");
            return;
        }
    };
    let e = stderr(&out);
    // setpriv itself says so when uid 65534 cannot execute the binary (a 0700 home, say).
    if matches!(out.status.code(), Some(126) | Some(127)) || e.starts_with("setpriv:") {
        println!("SKIP: uid 65534 cannot run {} here ({e})", bin());
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains(backup.to_str().unwrap())
            && e.contains("Permission denied")
            && e.contains("uid 65534")
            && e.contains("needs root"),
        "{e}"
    );
}
