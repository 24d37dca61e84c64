//! Verdicts over repetitions, end to end: `tcpx-run` runs a plan over loopback with the real
//! `loopback` target set (3 repetitions, then sequential rounds up to 30; noise 25 % as nothing
//! is measured). The same configuration compared with itself (A/A) is never called a winner or
//! a significant gain; a configuration made clearly slower is reported as significantly slower
//! once the sequential design decides it, and the report files carry the rounds, why the
//! comparison stopped and the intervals.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tcpx-run")
}

fn plans() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans")
}

/// A plan directory with the real loopback target set and common module, plus `name.rhai`.
fn plan_dir(name: &str, src: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("targets")).unwrap();
    std::fs::copy(
        plans().join("targets/loopback.toml"),
        d.path().join("targets/loopback.toml"),
    )
    .unwrap();
    std::fs::copy(plans().join("common.rhai"), d.path().join("common.rhai")).unwrap();
    let p = d.path().join(format!("{name}.rhai"));
    std::fs::write(&p, src).unwrap();
    (d, p)
}

/// Held while a plan runs. Run at once, the two plans share the CPUs, and the other plan's load
/// changes from arm to arm (its slow arm leaves CPUs free, its fast one takes them): an A/A arm
/// that happens to run beside the one more often measures slower for a reason the plan did not
/// make. CI once saw the A/A pair called significant with both tests running together.
static ONE_PLAN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the plan and returns (stdout, report.json, results.csv, summary.md).
fn run_plan(name: &str, src: &str) -> (String, serde_json::Value, String, String) {
    // A test that failed while holding it has released the machine all the same.
    let _alone = ONE_PLAN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (dir, plan) = plan_dir(name, src);
    let reports = dir.path().join("reports");
    let out = Command::new(bin())
        .arg(&plan)
        .arg("--targets")
        .arg("loopback")
        .arg("--reports")
        .arg(&reports)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "{stdout}\n{stderr}"
    );
    let run = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report.json")).unwrap()).unwrap();
    let csv = std::fs::read_to_string(run.join("results.csv")).unwrap();
    let md = std::fs::read_to_string(run.join("summary.md")).unwrap();
    (stdout, json, csv, md)
}

fn verdict(json: &serde_json::Value, text_starts: &str) -> String {
    json["criteria"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"].as_str().unwrap().starts_with(text_starts))
        .unwrap_or_else(|| panic!("no criterion `{text_starts}`: {}", json["criteria"]))["verdict"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_same_configuration_twice_is_never_a_winner_or_a_gain() {
    let src = r#"
phase("A/A");
let b = experiment(#{ name: "aa", sizes: ["16M"], iters: 8, warmup: 1, sample: false });
let rs = compare([b.with_knobs(#{ name: "A", label: "A" }), b.with_knobs(#{ name: "A2", label: "A again" })]);
let w = best(rs);
let g = gain_ci(rs[0], rs[1]);
criterion("A again beats A beyond noise", g, ">", noise());
criterion("A beats A again beyond noise", gain_ci(rs[1], rs[0]), ">", noise());
decision("AA", "is A again faster?", holds(g, ">", noise()), "yes", "no");
// The dry pass that checks the plan first has no figures: best() and gain_ci() give ().
if w != () { note(`significant: ${significant(g)}, clear winner: ${w.clear_winner}`); }
chart(#{ kind: "bar", title: "A/A", results: rs });
"#;
    let (stdout, json, csv, md) = run_plan("aa", src);
    for c in ["A again beats A", "A beats A again"] {
        assert_ne!(verdict(&json, c), "pass", "{c}: {stdout}");
    }
    // "No" (the whole interval lies below +noise) or UNANSWERED, never "yes".
    assert_ne!(
        json["decisions"][0]["answer"],
        serde_json::Value::Bool(true),
        "{}",
        json["decisions"]
    );
    let notes = json["notes"].to_string();
    assert!(
        notes.contains("significant: false, clear winner: false"),
        "{notes}"
    );
    let ranking = json["rankings"][0]["text"].as_str().unwrap();
    assert!(ranking.contains("tied within noise"), "{ranking}");
    // The comparison went on past the 3 repetitions (nothing is decided before round 10) and
    // says how many rounds it took and why it stopped. A criterion the compare's own rounds
    // leave undecided adds rounds and records them too; each record counts every round so far,
    // so the last one has them all.
    let records = json["sequential"].as_array().unwrap();
    let seq = &records[0];
    let first_rounds = seq["rounds"].as_u64().unwrap() as usize;
    assert!((10..=30).contains(&first_rounds), "{seq}");
    for r in records {
        assert!(
            ["decided", "budget"].contains(&r["stop"].as_str().unwrap()),
            "{r}"
        );
        assert!(r["method"].as_str().unwrap().contains("Bonferroni"), "{r}");
    }
    let counts: Vec<usize> = records
        .iter()
        .map(|r| r["rounds"].as_u64().unwrap() as usize)
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    let rounds = *counts.last().unwrap();
    assert!(rounds <= 30, "{counts:?}");
    assert!(md.contains("## Sequential comparisons"), "{md}");
    // Rounds interleaved A A2, A2 A, A A2, ..., then the summary rows.
    let reps: Vec<(String, String)> = csv
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("rep,"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[4].to_string(), f[1].to_string())
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("A", "1"),
        ("A2", "1"),
        ("A2", "2"),
        ("A", "2"),
        ("A", "3"),
        ("A2", "3"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(&reps[..6], want, "{csv}");
    assert_eq!(reps.len(), 2 * rounds, "{csv}");
    assert_eq!(csv.lines().filter(|l| l.starts_with("summary,")).count(), 2);
    // Every figure a criterion used carries its repetitions and interval.
    let figs = &json["criteria"][0]["figures"];
    for f in figs.as_array().unwrap() {
        for k in ["reps", "median", "ci95_lo", "ci95_hi", "n"] {
            assert!(!f[k].is_null(), "{k} missing in {f}");
        }
        // The first criterion saw at least the compare's rounds and at most all of them.
        let n = f["reps"].as_array().unwrap().len();
        assert!((first_rounds..=rounds).contains(&n), "{n} reps in {f}");
        assert!(md.contains(&format!("n={n} ")), "{md}");
    }
    assert!(
        md.contains("UNANSWERED") || md.contains("answer: no"),
        "{md}"
    );
}

#[test]
fn a_clearly_slower_configuration_is_reported_as_significant() {
    // One socket with tiny requests, one in flight, verifying every byte, against four sockets
    // with large requests pipelined: several times slower on any machine.
    let src = r#"
phase("slow vs fast");
let b = experiment(#{ name: "x", sizes: ["8M"], iters: 4, warmup: 1, verify: true, sample: false });
let rs = compare([
    b.with_knobs(#{ name: "slow", label: "1 socket, 16K requests, 1 in flight", socks_per_channel: 1, chunk: "16K", window: 1 }),
    b.with_knobs(#{ name: "fast", label: "4 sockets, 1M requests, 16 in flight", socks_per_channel: 4, chunk: "1M", window: 16 }),
]);
let w = best(rs);
let g = gain_ci(rs[0], rs[1]);
criterion("fast beats slow beyond noise", g, ">", noise());
if w != () { note(`winner ${w.name}, clear ${w.clear_winner}, significant ${significant(g)}, ${g.why}`); }
"#;
    let (stdout, json, _csv, _md) = run_plan("slowfast", src);
    let notes = json["notes"].to_string();
    assert!(
        notes.contains("winner fast, clear true, significant true"),
        "{notes}\n{stdout}"
    );
    assert_eq!(
        verdict(&json, "fast beats slow"),
        "pass",
        "{}",
        json["criteria"]
    );
    let c = &json["criteria"][0];
    assert!(
        c["ci95_lo"].as_f64().unwrap() > 0.25,
        "the whole interval is beyond the 25 % noise floor: {c}"
    );
    assert!(json["rankings"][0]["text"]
        .as_str()
        .unwrap()
        .contains("ahead of every other configuration beyond noise"));
    // Decided at the design's first look, or later on a busy machine.
    let seq = &json["sequential"][0];
    assert_eq!(seq["stop"], "decided", "{seq}");
    assert!(seq["rounds"].as_u64().unwrap() >= 10, "{seq}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("interval: sequential"),
        "{c}"
    );
}
