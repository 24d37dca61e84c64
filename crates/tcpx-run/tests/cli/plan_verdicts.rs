//! The report files of a plan's comparison, end to end: `tcpx-run` runs an A/A comparison over
//! loopback with the real `loopback` target set (3 repetitions, then sequential rounds up to 30)
//! and the files carry what the verdicts rest on: the interleaved rounds in results.csv, each
//! sequential record's rounds, reason to stop and method in report.json, every figure's
//! repetitions and interval, and the sequential section in summary.md.
//!
//! A smoke test of the shape, not of the statistics: what the verdicts conclude from given
//! figures (an A/A pair never a winner, a clearly slower configuration significant) is tested
//! deterministically in tcpx-plan (`tests/verdicts.rs`), with a runner that returns chosen
//! figures, where no other load on the machine can move it.

use crate::harness::{Dir, TestCmd};

#[test]
fn a_comparison_writes_its_rounds_stops_and_intervals_into_the_report_files() {
    let dir = Dir::new();
    let plan = dir.plan(
        "aa",
        r#"
phase("A/A");
let b = experiment(#{ name: "aa", sizes: ["4M"], iters: 4, warmup: 1, sample: false });
let rs = compare([b.with_knobs(#{ name: "A", label: "A" }), b.with_knobs(#{ name: "A2", label: "A again" })]);
let g = gain_ci(rs[0], rs[1]);
criterion("A again beats A beyond noise", g, ">", noise());
decision("AA", "is A again faster?", holds(g, ">", noise()), "yes", "no");
chart(#{ kind: "bar", title: "A/A", results: rs });
"#,
    );
    let reports = dir.join("reports");
    let out = TestCmd::new([plan.as_os_str()])
        .args(["--targets", "loopback", "--reports"])
        .arg(&reports)
        .run();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // 0 or 1: whether the criterion passes is the statistics' business, not this test's.
    assert!(
        matches!(out.status.code(), Some(0) | Some(1)),
        "{}",
        crate::harness::text(&out)
    );
    let run = std::fs::read_dir(&reports)
        .unwrap()
        .next()
        .expect("a report directory")
        .unwrap()
        .path();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report.json")).unwrap()).unwrap();
    let csv = std::fs::read_to_string(run.join("results.csv")).unwrap();
    let md = std::fs::read_to_string(run.join("summary.md")).unwrap();

    let verdict = json["criteria"][0]["verdict"].as_str().unwrap();
    assert!(
        ["pass", "fail", "inconclusive"].contains(&verdict),
        "{verdict}: {stdout}"
    );
    assert_eq!(json["decisions"].as_array().unwrap().len(), 1, "{json}");
    // The comparison went on past the 3 repetitions (the design decides nothing before round
    // 10) and says how many rounds it took and why it stopped. A criterion the compare's own
    // rounds leave undecided adds rounds and records them too; each record counts every round
    // so far, so the last one has them all.
    let records = json["sequential"].as_array().unwrap();
    let first_rounds = records[0]["rounds"].as_u64().unwrap() as usize;
    assert!((10..=30).contains(&first_rounds), "{}", records[0]);
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
    // Every figure the criterion used carries its repetitions and interval.
    let figs = &json["criteria"][0]["figures"];
    for f in figs.as_array().unwrap() {
        for k in ["reps", "median", "ci95_lo", "ci95_hi", "n"] {
            assert!(!f[k].is_null(), "{k} missing in {f}");
        }
        let n = f["reps"].as_array().unwrap().len();
        assert!((first_rounds..=rounds).contains(&n), "{n} reps in {f}");
        assert!(md.contains(&format!("n={n} ")), "{md}");
    }
    let c = &json["criteria"][0];
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("interval: sequential"),
        "{c}"
    );
}
