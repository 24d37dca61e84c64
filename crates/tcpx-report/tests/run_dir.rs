//! Writes a whole run directory from records and checks every file: CSV columns, charts of all
//! three kinds as PNG and SVG (drawn with the bundled font), summary.md, index.html, exit codes,
//! the index and the comparison.

mod common;

use common::report;
use tcpx_report::index::{compare, compare_markdown, index_html, index_markdown, scan};
use tcpx_report::*;

#[test]
fn a_run_directory_holds_every_file_and_every_knob() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("20261122T000000Z-demo");
    let r = report(false);
    let w = write_run(&r, &dir).unwrap();
    if let Ok(keep) = std::env::var("TCPX_REPORT_KEEP") {
        write_run(&r, std::path::Path::new(&keep)).unwrap();
    }
    assert!(w.chart_errors.is_empty(), "{:?}", w.chart_errors);

    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for col in [
        "knob.window",
        "knob.chunk",
        "knob.irq_policy",
        "recv.algbw_gbs",
        "send.p99_us",
        "not_applied",
    ] {
        assert!(header.contains(col), "{col} missing from {header}");
    }
    assert_eq!(
        csv.lines().count(),
        1 + 18 + 6,
        "header, 3 repetitions of 6 configurations, 6 summary rows"
    );
    for col in ["row", "rep", "server_gbs.ci95_lo", "server_gbs.ci95_hi"] {
        assert!(
            header.split(',').any(|h| h == col),
            "{col} missing from {header}"
        );
    }
    let summary_rows: Vec<&str> = csv.lines().filter(|l| l.starts_with("summary,")).collect();
    assert_eq!(summary_rows.len(), 6);
    // window 32, chunk 1M: repetitions at 0.98, 1.0 and 1.02 of 2.5 GB/s.
    let row = summary_rows
        .iter()
        .find(|l| l.contains("w32-c1048576"))
        .unwrap();
    assert!(
        row.starts_with("summary,,3,")
            && row.contains(",2.5000,")
            && row.contains(",2.4500,2.5500,2.2050,2.2950,"),
        "{row}"
    );
    assert!(csv.contains("not supported by this backend"));
    assert!(csv.contains("irq_policy: loopback has no IRQs"));
    let samples = std::fs::read_to_string(dir.join("samples.csv")).unwrap();
    assert!(samples.contains("cpu0,busy_pct,12.5"), "{samples}");

    for id in ["bars", "lines", "heat"] {
        let png = std::fs::read(dir.join(format!("charts/{id}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{id}.png is a PNG");
        assert!(
            png.len() > 5000,
            "{id}.png has content ({} bytes)",
            png.len()
        );
        let svg = std::fs::read_to_string(dir.join(format!("charts/{id}.svg"))).unwrap();
        assert!(
            svg.contains(&format!("{id} title")),
            "{id}.svg has its title"
        );
    }
    let lines = std::fs::read_to_string(dir.join("charts/lines.svg")).unwrap();
    let texts: Vec<&str> = lines
        .split("<text")
        .skip(1)
        .map(|t| t.split("</text>").next().unwrap_or(""))
        .collect();
    assert!(
        lines.contains("chunk=256K") && lines.contains("\n64\n"),
        "legend and axis labels: {texts:?}"
    );
    let heat = std::fs::read_to_string(dir.join("charts/heat.svg")).unwrap();
    assert!(
        heat.contains("n/a") && heat.contains("2.500 [2.450, 2.550]"),
        "missing cell and value with its interval shown"
    );
    let bars = std::fs::read_to_string(dir.join("charts/bars.svg")).unwrap();
    assert!(
        bars.contains("2.500 [2.450, 2.550] n=3"),
        "bar labels give median [lo, hi] n"
    );
    // Every repetition is drawn as a point: 3 per configuration that ran (4 of 6).
    assert!(
        bars.matches("<circle").count() >= 12,
        "{}",
        bars.matches("<circle").count()
    );

    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        md.contains("**PASS**")
            && md.contains("**INCONCLUSIVE**")
            && md.contains("about 12 repetitions would likely settle it")
            && md.contains("0.020 [-0.100, 0.300] n=3")
            && md.contains("Decision Point 1")
            && md.contains("charts/heat.png")
            && md.contains("tied within noise")
            && md.contains("differences smaller than 5.0% are not counted"),
        "{md}"
    );
    assert!(md.contains("| 2.500 [2.450, 2.550] n=3 75% |"), "{md}");
    // Tables say what their intervals really cover.
    assert!(md.contains("the interval's real level"), "{md}");
    assert!(md.contains("ok (3 of 3 ran)"), "{md}");
    assert!(md.contains("irq_policy: not applied here (loopback has no IRQs)"));
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert_eq!(html.matches("data:image/png;base64,").count(), 3);
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "self-contained"
    );

    let back = load_run(&dir).unwrap();
    assert_eq!(
        (back.records.len(), &back.criteria, &back.charts),
        (r.records.len(), &r.criteria, &r.charts)
    );
    let s = back
        .summaries
        .iter()
        .find(|s| s.experiment == "w32-c1048576")
        .unwrap();
    let f = &s.figures["server_gbs"];
    assert_eq!((f.n, f.reps.len()), (3, 3));
    assert!((f.median - 2.5).abs() < 1e-9 && (f.ci95_lo - 2.45).abs() < 1e-9);
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    for key in [
        "\"reps\"",
        "\"median\"",
        "\"ci95_lo\"",
        "\"ci95_hi\"",
        "\"n\"",
    ] {
        assert!(json.contains(key), "{key} missing from report.json");
    }
    assert!(
        r.verdict_line()
            .starts_with("INCONCLUSIVE (no criterion failed"),
        "{}",
        r.verdict_line()
    );
    assert_eq!(r.exit_code(), 0);
    assert_eq!(report(true).exit_code(), 1);
    let mut inc = report(false);
    inc.completion = Completion::Incomplete("follower lost".into());
    assert_eq!(inc.exit_code(), 2);
    assert!(inc.verdict_line().contains("follower lost"));
}

#[test]
fn index_and_comparison_cover_all_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = report(false);
    let mut b = report(true);
    b.stamp = "20261122T010000Z".into();
    for r in &mut b.records {
        if let Some(f) = &mut r.recv {
            f.algbw_gbs *= 1.5;
        }
    }
    write_run(&a, &tmp.path().join("A")).unwrap();
    write_run(&b, &tmp.path().join("B")).unwrap();
    std::fs::create_dir(tmp.path().join("not-a-run")).unwrap();
    let (entries, bad) = scan(tmp.path()).unwrap();
    assert_eq!(entries.len(), 2);
    assert!(bad.is_empty());
    let md = index_markdown(&entries, &bad);
    assert!(md.contains("[A](A/index.html)") && md.contains("FAIL (1 of 2"));
    assert!(index_html(&entries, &bad).contains("B/index.html"));
    let rows = compare(&a, &b);
    assert_eq!(rows.len(), 6);
    let d = rows[0].server_delta().unwrap();
    assert!((d - 0.5).abs() < 1e-9, "{d}");
    assert!(
        rows.iter().any(|r| r.server_delta().is_none()),
        "skipped rows have no delta"
    );
    assert!(compare_markdown("A", &a, "B", &b).contains("+50.0%"));
    assert!(scan(&tmp.path().join("missing")).is_err());
}
