//! `tcpx-run tune` end to end over loopback: the socket backend tuned for real and its winner
//! checked against a full grid of the same space measured here; the run directory's files; a
//! search whose every point fails; the refusals.

use std::path::Path;

use crate::harness::{self, tcpx_run};

use harness::{assert_refused, stdout_ok, text};

/// `tcpx-run bench` of one socket-backend configuration over loopback: receiver GB/s.
fn bench_gbs(chunk: &str, window: &str, layout: &str) -> f64 {
    let (c, s) = layout.split_once('x').unwrap();
    let out = tcpx_run()
        .args([
            "bench",
            "--role",
            "local",
            "--transport",
            "socket",
            "--size",
            "8M",
        ])
        .args(["--iters", "3", "--warmup", "1", "--no-csv", "--json"])
        .args(["--chunk", chunk, "--window", window, "--channels", c])
        .args(["--socks-per-channel", s])
        .run();
    let doc: serde_json::Value = serde_json::from_str(&stdout_ok(&out)).unwrap();
    doc["measurements"][0]["recv"]["busbw_gbs"]
        .as_f64()
        .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A speed claim timed on loopback: in the one CLI test binary it shares the CPUs with the
/// other modules' runs and failed once in CI for that reason. The search's claims are tested
/// deterministically in tcpx-plan (`search`); run this one alone with `--ignored`.
#[test]
#[ignore = "times loopback runs; run alone: cargo test -p tcpx-run --test cli tune:: -- --ignored"]
fn a_socket_tune_over_loopback_lands_near_the_best_of_the_full_grid() {
    let reports = tempfile::tempdir().unwrap();
    // A space with a real gap: 16 KiB requests one at a time are several times slower than
    // 1 MiB requests 16 deep, whatever the layout.
    let out = tcpx_run()
        .args([
            "tune", "socket", "--size", "8M", "--iters", "3", "--warmup", "1",
        ])
        .args(["--space", "chunk=16K,1M", "--space", "window=1,16"])
        .args(["--space", "layout=1x1,2x2", "--points", "20", "--seed", "3"])
        .arg("--reports")
        .arg(reports.path())
        .run();
    let stdout = stdout_ok(&out);
    let dir = std::fs::read_dir(reports.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tune.json")).unwrap()).unwrap();
    let run = &doc["run"];
    let dims = run["space"]["dims"].as_array().unwrap();
    let winner: Vec<String> = run["outcome"]["winner"]
        .as_array()
        .unwrap()
        .iter()
        .zip(dims)
        .map(|(i, d)| {
            d["levels"][i.as_u64().unwrap() as usize]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        run["points"].as_array().unwrap().len() <= 20,
        "over the point budget"
    );
    // The full grid, each point three times in alternating order.
    let mut grid: Vec<(Vec<String>, Vec<f64>)> = Vec::new();
    for chunk in ["16K", "1M"] {
        for window in ["1", "16"] {
            for layout in ["1x1", "2x2"] {
                grid.push((vec![chunk.into(), window.into(), layout.into()], Vec::new()));
            }
        }
    }
    // Three rounds, alternating direction: on a loaded 2-core machine two samples of a
    // configuration differed by more than the margin below (seen once).
    for rep in 0..3 {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..8).collect()
        } else {
            (0..8).rev().collect()
        };
        for i in order {
            let k = grid[i].0.clone();
            grid[i].1.push(bench_gbs(&k[0], &k[1], &k[2]));
        }
    }
    let best = grid
        .iter()
        .map(|(_, v)| median(v.clone()))
        .fold(0.0f64, f64::max);
    let won = grid
        .iter()
        .find(|(k, _)| *k == winner)
        .map(|(_, v)| median(v.clone()))
        .unwrap();
    assert!(
        won >= 0.6 * best,
        "tune chose {winner:?} at {won:.2} GB/s in the grid, whose best is {best:.2} GB/s\n{}",
        text(&out)
    );
    // The run directory: what a user opens.
    let env = std::fs::read_to_string(dir.join("tuned.env")).unwrap();
    assert!(
        env.contains(&format!("export TCPX_CHUNK={}", winner[0])),
        "{env}"
    );
    assert!(
        env.contains(&format!("export TCPX_WINDOW={}", winner[1])),
        "{env}"
    );
    let svg = std::fs::read_to_string(dir.join("search.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let csv = std::fs::read_to_string(dir.join("points.csv")).unwrap();
    assert!(
        csv.starts_with("id,phase,chunk,window,layout,status,gbs"),
        "{csv}"
    );
    assert!(std::fs::read_to_string(dir.join("summary.md"))
        .unwrap()
        .contains("## Which settings mattered"));
    assert!(
        stdout.contains("winner:") && stdout.contains("gain:"),
        "{stdout}"
    );
}

#[test]
fn a_search_whose_every_point_fails_recommends_nothing_and_says_why() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has a GPU, so GPU memory would not fail here");
        return;
    }
    let reports = tempfile::tempdir().unwrap();
    let out = tcpx_run()
        .args([
            "tune", "socket", "--memory", "cuda:0,0", "--size", "1M", "--points", "4",
        ])
        .args(["--space", "window=4,8", "--point-timeout", "30"])
        .arg("--reports")
        .arg(reports.path())
        .run();
    assert_refused(&out, &["no point of the search succeeded"]);
    let dir = std::fs::read_dir(reports.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("Points that failed"), "{summary}");
    let env = std::fs::read_to_string(dir.join("tuned.env")).unwrap();
    assert!(!env.contains("export "), "{env}");
}

#[test]
fn bad_subjects_spaces_and_budgets_are_refused_naming_what_to_fix() {
    let refused = |args: &[&str], says: &[&str]| {
        tcpx_run().arg("tune").args(args).refused(says);
    };
    refused(&["ib"], &["unknown subject `ib`", "nccl", "tcpx", "socket"]);
    refused(
        &["tcpx", "--space", "NCCL_NSOCKS_PERTHREAD=1,16", "--dry-run"],
        &["NCCL_NSOCKS_PERTHREAD=16", "GPUDirect-TCPX", "1..=8"],
    );
    refused(
        &["nccl", "--space", "LD_PRELOAD=/tmp/x.so", "--dry-run"],
        &["`LD_PRELOAD` is not a setting"],
    );
    refused(
        &["socket", "--space", "window=0,4", "--dry-run"],
        &["window=0"],
    );
    refused(&["socket", "--points", "1", "--dry-run"], &["--points 1"]);
    refused(&["socket", "--minutes", "0", "--dry-run"], &["--minutes"]);
}

#[test]
fn a_dry_run_lists_the_default_space_of_nccls_own_variables() {
    let out = tcpx_run().args(["tune", "nccl", "--dry-run"]).run();
    let s = stdout_ok(&out);
    for v in [
        "NCCL_NCHANNELS_PER_NET_PEER=default,",
        "NCCL_P2P_NET_CHUNKSIZE=default,",
        "NCCL_BUFFSIZE=default,",
        "NCCL_NSOCKS_PERTHREAD=default,",
        "NCCL_SOCKET_NTHREADS=default,",
    ] {
        assert!(s.contains(v), "{v} missing:\n{s}");
    }
}
