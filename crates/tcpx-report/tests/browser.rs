//! Opens the report pages in a real headless Chromium (Debian's `chromium`) and checks that they
//! render, that every chart image decodes (the page's own script counts them into the DOM), and
//! that the browser logged no console message at all (errors, failed loads). Prints
//! `SKIP: ...` where chromium is not installed (`apt-get install -y chromium`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tcpx_report::index::{compare_html, index_html, scan};
use tcpx_test_support::wait_within;

fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TCPX_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| ["chromium", "chromium-browser"].map(|n| d.join(n)))
        .find(|p| p.is_file())
}

struct Rendered {
    dom: String,
    console: Vec<String>,
}

/// Loads `page` headless and returns the DOM after load plus every console line logged.
fn render(browser: &Path, page: &Path) -> Rendered {
    let profile = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let (out, err) = (out_dir.path().join("dom"), out_dir.path().join("log"));
    let url = format!("file://{}", page.canonicalize().unwrap().display());
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("starting chromium");
    let status = wait_within(
        &mut child,
        Duration::from_secs(90),
        Duration::from_millis(100),
    )
    .unwrap_or_else(|| panic!("chromium did not finish {url} within 90 s"));
    let dom = std::fs::read_to_string(&out).unwrap();
    let log = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "chromium failed on {url}: {log}");
    let console = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("net::ERR_") || l.contains("Uncaught"))
        .map(String::from)
        .collect();
    Rendered { dom, console }
}

fn attr(dom: &str, name: &str) -> Option<String> {
    let key = format!("{name}=\"");
    let i = dom.find(&key)? + key.len();
    Some(dom[i..].split('"').next()?.to_string())
}

#[test]
fn report_pages_render_with_their_charts_and_no_console_messages() {
    let Some(browser) = chromium() else {
        println!("SKIP: chromium is not installed (apt-get install -y chromium); report pages not checked in a browser");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();

    // The detector itself: a broken image and a console error must be seen.
    let bad = tmp.path().join("bad.html");
    std::fs::write(
        &bad,
        format!(
            "<!DOCTYPE html><html><head><link rel=\"icon\" href=\"data:,\"></head><body><img class=\"chart\" src=\"data:image/png;base64,AAAA\"><script>console.error('deliberate');</script>{}</body></html>",
            "<script>window.addEventListener('load',function(){var i=document.querySelectorAll('img.chart');var ok=0;i.forEach(function(x){if(x.complete&&x.naturalWidth>0)ok++;});document.body.setAttribute('data-charts-loaded',String(ok));document.body.setAttribute('data-charts-total',String(i.length));});</script>"
        ),
    )
    .unwrap();
    let r = render(&browser, &bad);
    assert!(
        r.console.iter().any(|l| l.contains("deliberate")),
        "console error not detected: {:?}",
        r.console
    );
    assert_eq!(
        attr(&r.dom, "data-charts-loaded").as_deref(),
        Some("0"),
        "{}",
        r.dom
    );

    // A run page, the index and a comparison.
    let run_a = tmp.path().join("A");
    let run_b = tmp.path().join("B");
    tcpx_report::write_run(&common::report(false), &run_a).unwrap();
    tcpx_report::write_run(&common::report(true), &run_b).unwrap();
    let (entries, bad_runs) = scan(tmp.path()).unwrap();
    let index = tmp.path().join("index.html");
    std::fs::write(&index, index_html(&entries, &bad_runs)).unwrap();
    let cmp = tmp.path().join("compare.html");
    std::fs::write(
        &cmp,
        compare_html("A", &entries[0].report, "B", &entries[1].report),
    )
    .unwrap();

    let r = render(&browser, &run_a.join("index.html"));
    assert!(r.console.is_empty(), "console messages: {:?}", r.console);
    assert!(
        r.dom.contains("id=\"verdict\"") && r.dom.contains("PASS"),
        "verdict shown"
    );
    assert!(r.dom.contains("id=\"criteria\"") && r.dom.contains("Decision Point 1"));
    assert_eq!(
        attr(&r.dom, "data-charts-total").as_deref(),
        Some("3"),
        "{}",
        &r.dom[..r.dom.len().min(400)]
    );
    assert_eq!(
        attr(&r.dom, "data-charts-loaded").as_deref(),
        Some("3"),
        "every chart decoded"
    );

    let r = render(&browser, &index);
    assert!(r.console.is_empty(), "console messages: {:?}", r.console);
    assert!(r.dom.contains("A/index.html") && r.dom.contains("B/index.html"));
    assert_eq!(attr(&r.dom, "data-charts-total").as_deref(), Some("0"));

    let r = render(&browser, &cmp);
    assert!(r.console.is_empty(), "console messages: {:?}", r.console);
    assert!(r.dom.contains("id=\"compare\""));
}

#[test]
fn the_fleet_report_renders_its_heatmaps_and_verdicts_with_no_console_messages() {
    use tcpx_report::fleet::{
        write_fleet, Finding, FindingKind, FleetDoc, FleetEnd, FleetNode, FleetRow, FleetStart,
    };
    let Some(browser) = chromium() else {
        println!("SKIP: chromium is not installed (apt-get install -y chromium); the fleet report not checked in a browser");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for nic in ["nic0", "nic1", "all"] {
        for s in 0..3u32 {
            for r in (0..3u32).filter(|&r| r != s) {
                let slow = nic == "nic1" && (s == 2 || r == 2);
                rows.push(FleetRow {
                    run: rows.len() as u32,
                    rep: 0,
                    round: 0,
                    nic: nic.into(),
                    sender: s,
                    sender_host: format!("n{s}"),
                    sender_addr: format!("10.0.0.{s}"),
                    receiver: r,
                    receiver_host: format!("n{r}"),
                    receiver_addr: format!("10.0.0.{r}"),
                    size: 1 << 20,
                    bytes: 20 << 20,
                    wrong_bytes: Some(0),
                    gbps: Some(if slow { 5.0 } else { 10.0 }),
                    p50_us: Some(100.0),
                    connect_ms: Some(0.1),
                    accept_ms: Some(0.1),
                    first_byte_ms: Some(0.2),
                    setup_ms: Some(30.0),
                    status: "ok".into(),
                    error: String::new(),
                });
            }
        }
    }
    let scheduled = rows.len() as u32;
    let doc = FleetDoc {
        start: FleetStart {
            tool: "tcpx-run fleet".into(),
            version: "test".into(),
            started: "2026-01-01T00:00:00Z".into(),
            nodes: (0..3)
                .map(|r| FleetNode {
                    rank: r,
                    host: format!("n{r}"),
                    nics: vec!["eth1".into(), "eth2".into()],
                    addrs: vec![format!("10.0.0.{r}"), format!("10.1.0.{r}")],
                    lost: String::new(),
                })
                .collect(),
            experiment: serde_json::json!({"sizes": [1048576]}),
            reps: 1,
            scheduled,
        },
        rows,
        end: FleetEnd {
            findings: vec![Finding {
                kind: FindingKind::Nic,
                node: Some(2),
                host: "n2".into(),
                nic: "nic1".into(),
                peer: None,
                gbps: Some(5.0),
                peers_gbps: Some(7.5),
                below_pct: Some(-33.0),
                below_pct_range: Some((-35.0, -30.0)),
                robust_z: Some(-16.0),
                text: "node 2 (n2) nic1".into(),
            }],
            complete: true,
        },
    };
    let files = write_fleet(tmp.path(), &doc).unwrap();
    let r = render(&browser, &files.html);
    assert!(r.console.is_empty(), "console messages: {:?}", r.console);
    assert!(r.dom.contains("id=\"verdict\"") && r.dom.contains("slow NIC"));
    for nic in ["nic0", "nic1", "all"] {
        assert!(
            r.dom.contains(&format!("data-nic=\"{nic}\"")),
            "heatmap {nic} rendered"
        );
    }
    // The slow cells are drawn in another colour than the healthy ones.
    assert!(r.dom.contains(">5.00</td>") && r.dom.contains(">10.00</td>"));
}
