//! The reader's bounds and checks on real files in a temporary directory.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tcpx_watch::read::{read_dir, Limits, ReadError};
use tcpx_watch::record::Dir;

fn one_process(dir: &std::path::Path) {
    write(
        dir,
        "h",
        1,
        &[
            start("h", 1, UNIX0, &["eth1"]),
            interval(
                1.0,
                1.0,
                vec![comm(
                    1,
                    Dir::Send,
                    0,
                    "00000000000000aa",
                    100,
                    1,
                    Some(5),
                    vec![0, 0, 0, 1],
                )],
            ),
            end(1.5),
        ],
    );
}

#[test]
fn a_line_over_the_limit_is_an_error_naming_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    one_process(d.path());
    let huge = format!(
        "{}\n{{\"kind\":\"end\",\"t\":2.0,\"pad\":\"{}\"}}\n",
        lines(&[start("g", 2, UNIX0, &["eth1"])]).trim_end(),
        "x".repeat(10_000)
    );
    std::fs::write(d.path().join("watch-g-2.jsonl"), huge).unwrap();
    let limits = Limits {
        max_line_bytes: 4096,
        ..Limits::default()
    };
    let e = read_dir(d.path(), &limits).unwrap_err();
    assert!(matches!(e, ReadError::LongLine { line: 2, .. }), "{e}");
    assert!(e.to_string().contains("watch-g-2.jsonl:2"), "{e}");
    // Within a larger bound the same file reads.
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    assert_eq!(w.processes.len(), 2);
}

#[test]
fn too_many_files_and_too_many_bytes_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for pid in 0..5 {
        write(
            d.path(),
            "h",
            pid,
            &[start("h", pid, UNIX0, &["eth1"]), end(1.0)],
        );
    }
    let e = read_dir(
        d.path(),
        &Limits {
            max_files: 4,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, ReadError::TooManyFiles { limit: 4, .. }), "{e}");
    assert_eq!(
        read_dir(d.path(), &Limits::default())
            .unwrap()
            .processes
            .len(),
        5
    );
    let e = read_dir(
        d.path(),
        &Limits {
            max_total_bytes: 600,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, ReadError::TooManyBytes { limit: 600, .. }),
        "{e}"
    );
}

#[test]
fn a_truncated_last_line_is_left_for_later_but_a_broken_middle_line_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let mut text = lines(&[
        start("h", 1, UNIX0, &["eth1"]),
        interval(
            1.0,
            1.0,
            vec![comm(
                1,
                Dir::Send,
                0,
                "00000000000000aa",
                100,
                1,
                None,
                vec![1],
            )],
        ),
    ]);
    text.push_str("{\"kind\":\"interval\",\"t\":2.0,\"dt_s\":1.0,\"comms\":[{\"comm\":1,\"di");
    std::fs::write(d.path().join("watch-h-1.jsonl"), &text).unwrap();
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    assert_eq!(w.processes[0].runs[0].intervals.len(), 1);
    assert!(
        w.notes
            .iter()
            .any(|n| n.contains("watch-h-1.jsonl:3") && n.contains("still being written")),
        "{:?}",
        w.notes
    );
    // The same text with a newline after it is a broken line in the middle of a file.
    text.push_str("\n{\"kind\":\"end\",\"t\":3.0}\n");
    std::fs::write(d.path().join("watch-h-1.jsonl"), &text).unwrap();
    let e = read_dir(d.path(), &Limits::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("watch-h-1.jsonl:3: not a watch record"),
        "{e}"
    );
}

#[test]
fn a_link_in_the_directory_is_not_followed() {
    let d = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    one_process(elsewhere.path());
    std::os::unix::fs::symlink(
        elsewhere.path().join("watch-h-1.jsonl"),
        d.path().join("watch-h-1.jsonl"),
    )
    .unwrap();
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    assert!(w.processes.is_empty(), "{:?}", w.processes);
    assert!(
        w.notes
            .iter()
            .any(|n| n.contains("symbolic link, not followed")),
        "{:?}",
        w.notes
    );
}

#[test]
fn a_fifo_in_the_directory_is_refused_without_hanging() {
    let d = tempfile::tempdir().unwrap();
    one_process(d.path());
    let fifo = d.path().join("watch-f-9.jsonl");
    nix::unistd::mkfifo(
        &fifo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let started = Instant::now();
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(w.processes.len(), 1);
    assert!(
        w.notes
            .iter()
            .any(|n| n.contains("watch-f-9.jsonl: a FIFO, refused")),
        "{:?}",
        w.notes
    );
}

#[test]
fn impossible_figures_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let counters = |bytes| {
        vec![comm(
            1,
            Dir::Send,
            0,
            "00000000000000aa",
            bytes,
            1,
            None,
            vec![1],
        )]
    };
    write(
        d.path(),
        "h",
        1,
        &[
            start("h", 1, UNIX0, &["eth1"]),
            interval(1.0, 1.0, counters(1000)),
            interval(2.0, 1.0, counters(500)),
        ],
    );
    let e = read_dir(d.path(), &Limits::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("watch-h-1.jsonl:3: impossible figure")
            && e.contains("bytes went back from 1000 to 500"),
        "{e}"
    );

    // Across a restart (a new start line) the counters begin again: fine.
    write(
        d.path(),
        "h",
        1,
        &[
            start("h", 1, UNIX0, &["eth1"]),
            interval(1.0, 1.0, counters(1000)),
            start("h", 1, UNIX0 + 5.0, &["eth1"]),
            interval(1.0, 1.0, counters(500)),
        ],
    );
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    assert_eq!(w.processes[0].runs.len(), 2);

    // A clock going back, a negative duration, a histogram that does not fit its bounds.
    for (bad, what) in [
        (
            lines(&[start("h", 1, UNIX0, &["eth1"]), interval(2.0, 1.0, vec![]), interval(1.0, 1.0, vec![])]),
            "clock went back",
        ),
        (
            lines(&[start("h", 1, UNIX0, &["eth1"])])
                + "{\"kind\":\"conn\",\"t\":1,\"dev\":0,\"call\":\"accept\",\"took_s\":-1,\"ok\":true}\n",
            "took_s = -1",
        ),
        (
            lines(&[start("h", 1, UNIX0, &["eth1"])])
                + "{\"kind\":\"interval\",\"t\":1,\"dt_s\":1,\"comms\":[{\"comm\":1,\"dir\":\"send\",\"dev\":0,\"bytes\":1,\"requests\":1,\"lat_us\":{\"le\":[1,2],\"counts\":[1,0,0,0]}}]}\n",
            "4 latency counts for 2 bounds",
        ),
        (
            "{\"kind\":\"start\",\"v\":1,\"t\":0,\"unix_s\":1e999,\"host\":\"h\",\"pid\":1,\"inner\":\"x\",\"api\":7}\n".to_string(),
            "",
        ),
    ] {
        std::fs::write(d.path().join("watch-h-1.jsonl"), &bad).unwrap();
        let e = read_dir(d.path(), &Limits::default()).unwrap_err().to_string();
        assert!(e.contains("watch-h-1.jsonl:") && e.contains(what), "{what}: {e}");
    }
}

#[test]
fn the_rotated_file_is_read_before_the_current_one_and_its_repeated_start_continues_the_run() {
    let d = tempfile::tempdir().unwrap();
    let c = |t: f64, bytes| {
        interval(
            t,
            1.0,
            vec![comm(
                1,
                Dir::Send,
                0,
                "00000000000000aa",
                bytes,
                1,
                None,
                vec![1],
            )],
        )
    };
    std::fs::write(
        d.path().join("watch-h-1.jsonl.1"),
        lines(&[start("h", 1, UNIX0, &["eth1"]), c(1.0, 100), c(2.0, 200)]),
    )
    .unwrap();
    std::fs::write(
        d.path().join("watch-h-1.jsonl"),
        lines(&[start("h", 1, UNIX0, &["eth1"]), c(3.0, 300), end(3.5)]),
    )
    .unwrap();
    let w = read_dir(d.path(), &Limits::default()).unwrap();
    let p = &w.processes[0];
    assert_eq!(p.files.len(), 2);
    assert!(p.files[0].to_string_lossy().ends_with(".jsonl.1"));
    assert_eq!(p.runs.len(), 1, "a repeated start line is not a restart");
    let ts: Vec<f64> = p.runs[0].intervals.iter().map(|i| i.t).collect();
    assert_eq!(ts, vec![1.0, 2.0, 3.0]);
    assert!(p.runs[0].end.is_some());
}
