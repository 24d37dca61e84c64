//! Records key their knobs by `tcpx_model::Knob` and keep the bytes they had when keyed by
//! name. `fixtures/written-before-knob-keys/` is a run directory the previous version (knobs
//! keyed by `String`) wrote from one report (its `record.json`: the first record as that
//! version's `serde_json::to_string` wrote it): read back and written again, every file is the
//! same, byte for byte. A record naming a knob this version does not have is refused, naming
//! the knob and the file, never read without it.

use std::path::{Path, PathBuf};

use tcpx_model::Knob;
use tcpx_report::{load_run, write_run, ResultRecord};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/written-before-knob-keys")
}

const FILES: [&str; 7] = [
    "report.json",
    "results.csv",
    "samples.csv",
    "summary.md",
    "tuned.env",
    "tuned.json",
    "index.html",
];

#[test]
fn a_run_written_with_knobs_keyed_by_name_is_rewritten_byte_for_byte() {
    let report = load_run(&fixture()).unwrap();
    let r = &report.records[0];
    assert_eq!(r.knobs[&Knob::Window], serde_json::json!(8));
    let w32 = &report.records[2];
    assert_eq!(
        w32.not_applied.keys().copied().collect::<Vec<_>>(),
        [Knob::SockBuf, Knob::ThreadBinding, Knob::Verify],
        "by name, not by declaration (verify is declared before sock_buf)"
    );
    let tmp = tempfile::tempdir().unwrap();
    write_run(&report, tmp.path()).unwrap();
    for f in FILES {
        let before = std::fs::read(fixture().join(f)).unwrap();
        let now = std::fs::read(tmp.path().join(f)).unwrap();
        assert!(
            before == now,
            "{f} differs:\n--- before\n{}\n--- now\n{}",
            String::from_utf8_lossy(&before),
            String::from_utf8_lossy(&now)
        );
    }
}

#[test]
fn a_record_line_round_trips_byte_for_byte() {
    let line = std::fs::read_to_string(fixture().join("record.json")).unwrap();
    let line = line.trim_end();
    let r: ResultRecord = serde_json::from_str(line).unwrap();
    assert_eq!(r.knobs[&Knob::Transport], serde_json::json!("socket"));
    assert_eq!(serde_json::to_string(&r).unwrap(), line);
    // A record with knobs not applied, in an order other than the knobs' declaration.
    let na = r#"{"phase":"p","experiment":"e","label":"e","knobs":{"memory":"host","sock_buf":null,"transport":"socket","verify":true},"not_applied":{"memory":"no GPU","sock_buf":"kernel default","transport":"no plugin","verify":"checked anyway"},"status":"skipped","reason":"why","size":null,"chunk":null,"send":null,"recv":null,"started_s":1.5,"duration_s":0.0,"rep":1}"#;
    let r: ResultRecord = serde_json::from_str(na).unwrap();
    assert_eq!(r.not_applied[&Knob::Verify], "checked anyway");
    assert_eq!(serde_json::to_string(&r).unwrap(), na);
}

/// The fixture's report.json with its first `"from"` key (a knob) renamed to `to`, in `dir`.
fn with_key_renamed(dir: &Path, file: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(fixture().join(file)).unwrap();
    let from = format!("\"{from}\":");
    assert!(text.contains(&from), "{from}");
    let path = dir.join(file);
    std::fs::write(&path, text.replacen(&from, &format!("\"{to}\":"), 1)).unwrap();
    path
}

#[test]
fn a_record_naming_a_knob_this_version_lacks_is_refused_naming_the_knob_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    // In `knobs` (the first "zero_copy_min" key is a record's knob).
    let path = with_key_renamed(tmp.path(), "report.json", "zero_copy_min", "socket_threads");
    let e = load_run(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("unknown variant `socket_threads`"),
        "{e}"
    );
    // In `not_applied`.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture().join("report.json")).unwrap();
    let renamed = text.replacen(
        "\"thread_binding\": \"one NUMA node here\"",
        "\"socket_threads\": \"one NUMA node here\"",
        1,
    );
    assert_ne!(renamed, text);
    std::fs::write(dir.path().join("report.json"), renamed).unwrap();
    let e = load_run(dir.path()).unwrap_err().to_string();
    assert!(e.contains("unknown variant `socket_threads`"), "{e}");
    // In tuned.json's chosen configuration: `apply` and `validate` refuse it the same way.
    let tuned = tempfile::tempdir().unwrap();
    let path = with_key_renamed(
        tuned.path(),
        "tuned.json",
        "zero_copy_min",
        "socket_threads",
    );
    let e = tcpx_report::tuned::load(&path).unwrap_err().to_string();
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("is not a tuned.json of this version")
            && e.contains("unknown variant `socket_threads`"),
        "{e}"
    );
    // The fixture itself loads.
    tcpx_report::tuned::load(&fixture().join("tuned.json")).unwrap();
}

/// A chart names its knobs by the plan's text: a name that is no knob draws as an unset knob
/// (`-`), as it did when knobs were looked up by name; the SVGs are the previous version's.
#[test]
fn charts_naming_unknown_knobs_draw_as_before() {
    let mut report = load_run(&fixture()).unwrap();
    let specs = std::fs::read_to_string(fixture().join("charts/specs.json")).unwrap();
    report.charts = serde_json::from_str(&specs).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for spec in &report.charts {
        let files = tcpx_report::render_chart(&report, spec, tmp.path()).unwrap();
        let before = std::fs::read(fixture().join(format!("charts/{}.svg", spec.id))).unwrap();
        let now = std::fs::read(&files.svg).unwrap();
        assert!(before == now, "charts/{}.svg differs", spec.id);
    }
}
