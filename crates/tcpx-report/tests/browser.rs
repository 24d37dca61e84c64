//! Opens the report pages in a real headless Chromium (Debian's `chromium`) and checks that they
//! render, that every chart image decodes (the page's own script counts them into the DOM), and
//! that the browser logged no console message at all (errors, failed loads). Prints
//! `SKIP: ...` where chromium is not installed (`apt-get install -y chromium`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tcpx_report::index::{compare_html, index_html, scan};

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
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {url} within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
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
