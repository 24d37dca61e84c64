//! Issue 43 item 6: escape sequences, bells, carriage returns and line feeds from a peer (a
//! failed run's reason) or from the plan (labels, notes, criteria, names) reach summary.md,
//! results.csv, index.html and the terminal's summary escaped, never raw; HTML stays
//! HTML-escaped.

mod common;

use common::report;
use tcpx_report::*;

/// Red text, a bell, a carriage return that rewrites the line, a fake line and markup.
const HOSTILE: &str = "\x1b[31mred\x07\rfollower joined: 127.0.0.9\nfake line <b>bold</b>";
/// The same as every report file writes it.
const ESCAPED: &str = r"\x1b[31mred\x07\rfollower joined: 127.0.0.9\nfake line";

fn hostile_report() -> RunReport {
    let mut r = report(false);
    r.plan = format!("demo{HOSTILE}");
    r.platform = HOSTILE.into();
    r.setup.insert("peer".into(), HOSTILE.into());
    r.phases[0].description = format!("window x chunk{HOSTILE}");
    r.notes.push(HOSTILE.into());
    r.criteria[0].text = format!("server > 1 GB/s{HOSTILE}");
    r.criteria[0].detail = HOSTILE.into();
    r.decisions[0].name = format!("DP1{HOSTILE}");
    r.decisions[0].detail = HOSTILE.into();
    r.rankings[0].text = HOSTILE.into();
    // One chart is enough here (titles reach index.html as alt text and captions).
    r.charts.truncate(1);
    r.charts[0].title = format!("bars{HOSTILE}");
    r.samples[0].subject = HOSTILE.into();
    for (i, rec) in r.records.iter_mut().enumerate() {
        rec.label = format!("{}{HOSTILE}", rec.label);
        rec.not_applied
            .insert(tcpx_model::Knob::Window, HOSTILE.into());
        if i % 2 == 0 {
            // A follower's error, as it arrived.
            rec.status = Status::Failed;
            rec.reason = Some(format!("follower said: {HOSTILE}"));
            rec.send = None;
            rec.recv = None;
        }
    }
    r
}

fn assert_no_raw_controls(what: &str, text: &str) {
    for (bad, name) in [('\x1b', "ESC"), ('\x07', "BEL"), ('\r', "CR")] {
        assert!(
            !text.contains(bad),
            "{what} holds a raw {name}:\n{}",
            text.escape_debug()
        );
    }
    for fake in ["\nfake line", "\nfollower joined", "\rfollower joined"] {
        assert!(!text.contains(fake), "{what} holds the fake line {fake:?}");
    }
}

#[test]
fn control_characters_from_peers_and_plans_are_escaped_in_every_report_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let r = hostile_report();
    write_run(&r, &dir).unwrap();

    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_no_raw_controls("results.csv", &csv);
    assert!(csv.contains(ESCAPED), "{csv}");
    // Still one row per line: header, 18 repetitions, 6 summary rows.
    assert_eq!(csv.lines().count(), 1 + 18 + 6, "{csv}");
    let mut rows = csv::Reader::from_reader(csv.as_bytes());
    let reason = rows.headers().unwrap().iter().position(|h| h == "reason");
    let first = rows.records().next().unwrap().unwrap();
    assert_eq!(
        &first[reason.unwrap()],
        format!("follower said: {ESCAPED} <b>bold</b>")
    );
    let samples = std::fs::read_to_string(dir.join("samples.csv")).unwrap();
    assert_no_raw_controls("samples.csv", &samples);
    assert_eq!(samples.lines().count(), 2, "{samples}");

    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert_no_raw_controls("summary.md", &md);
    assert!(md.contains(r"\x1b[31mred\x07\rfollower joined"), "{md}");

    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert_no_raw_controls("index.html", &html);
    assert!(
        html.contains(&format!("{ESCAPED} &lt;b&gt;bold&lt;/b&gt;")),
        "{html}"
    );
    assert!(
        !html.contains("<b>bold</b>"),
        "markup from text in index.html"
    );

    let console = r.console_summary(&dir);
    assert_no_raw_controls("the console summary", &console);
    assert!(
        console.contains(r"\x1b[31mred\x07\rfollower joined"),
        "{console}"
    );

    // An incomplete run's error (whatever stopped it, a peer's words included).
    let mut r = r;
    r.completion = Completion::Incomplete(HOSTILE.into());
    r.charts.clear();
    write_run(&r, &dir).unwrap();
    for f in ["summary.md", "index.html", "results.csv"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        assert_no_raw_controls(f, &text);
    }
    assert_no_raw_controls("the console summary", &r.console_summary(&dir));
}
