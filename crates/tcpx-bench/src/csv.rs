//! `tcpx-run bench`'s CSV rows (one per side and size, appended to a file across runs) and its
//! raw samples file.

use std::path::Path;

use crate::{Measurement, Outcome};

/// The columns of `tcpx-run bench`'s CSV file (one row per side and size).
pub const CSV_HEADER: &[&str] = &[
    "timestamp",
    "name",
    "role",
    "peer",
    "transport",
    "memory",
    "flows",
    "channels",
    "socks_per_channel",
    "chunk",
    "window",
    "verify",
    "size",
    "iters",
    "warmup",
    "side",
    "time_us",
    "p50_us",
    "p99_us",
    "min_us",
    "max_us",
    "algbw_gbs",
    "busbw_gbs",
    "wrong_bytes",
    "pinned_cpus",
    "cpu_s_per_gb",
    "busy_pct",
    "softirq_share_pct",
    // Knobs that shape the transfer, added after the figures so that the columns before them
    // keep their places; empty where the knob was left at its default (`staging_ring`: auto).
    "sock_buf",
    "zero_copy_min",
    "barrier",
    "staging_ring",
    "worker_cpus",
];

/// The two rows (send side, receive side) of one measurement under [`CSV_HEADER`], with the
/// run's `role`, `peer` label and start time `stamp` (Unix seconds). A column the knob table
/// gives a knob (`tcpx_model::KnobSpec::csv`) shows the experiment's value of that knob, as
/// `Experiment::get_knob` writes it; `size`, `chunk` and `window` show what this measurement used.
pub fn csv_rows(m: &Measurement, role: &str, peer: &str, stamp: u64) -> Vec<Vec<String>> {
    [&m.send, &m.recv]
        .into_iter()
        .map(|s| {
            let figures = s.figures();
            CSV_HEADER
                .iter()
                .map(|&column| {
                    run_cell(column, m, s, &figures, role, peer, stamp).unwrap_or_else(|| {
                        tcpx_model::KNOBS
                            .iter()
                            .find(|k| k.csv == Some(column))
                            .and_then(|k| m.experiment.get_knob(k.knob))
                            .map(|v| v.join(","))
                            .unwrap_or_default()
                    })
                })
                .collect()
        })
        .collect()
}

/// The cell of `column` that shows something of the run or of side `s` (`figures`: its
/// figures); `None` for a column that shows a knob as the experiment holds it.
fn run_cell(
    column: &str,
    m: &Measurement,
    s: &crate::SideSummary,
    figures: &tcpx_model::SideFigures,
    role: &str,
    peer: &str,
    stamp: u64,
) -> Option<String> {
    Some(match column {
        "timestamp" => stamp.to_string(),
        "role" => role.to_string(),
        "peer" => peer.to_string(),
        // The measured size, and the chunk it used ("auto" resolved).
        "size" => m.size.to_string(),
        "chunk" => m.chunk.to_string(),
        "window" => m.experiment.window_for(m.size).to_string(),
        "side" => s.side.as_str().to_string(),
        "pinned_cpus" => s
            .pinning
            .as_ref()
            .map_or_else(String::new, |p| p.actual.clone()),
        "cpu_s_per_gb" => opt(s.cpu.as_ref().and_then(|c| c.cpu_s_per_gb)),
        "busy_pct" => opt(s.cpu.as_ref().map(|c| c.busy_pct)),
        "softirq_share_pct" => opt(s.cpu.as_ref().map(|c| c.softirq_share_pct)),
        // This file's name for the average.
        "time_us" => return figures.csv_cell("avg_us"),
        _ => return figures.csv_cell(column),
    })
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| format!("{v:.4}"))
}

/// Writes this side's raw samples, one block per size, with the size as the first column.
pub fn write_samples(path: &Path, outcome: &Outcome) -> Result<(), String> {
    let mut text = String::from("size,t_s,source,subject,metric,value\n");
    for (size, report) in &outcome.samples {
        let mut block = Vec::new();
        report.write_csv(&mut block).map_err(|e| e.to_string())?;
        for line in String::from_utf8_lossy(&block).lines().skip(1) {
            text.push_str(&format!("{size},{line}\n"));
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    // Write aside and rename, so a reader never sees half a file. The temporary file is created
    // exclusively (a link planted at its name is removed, never written through), and the
    // rename replaces a link at `path` rather than following it.
    let tmp = path.with_extension("csv.tmp");
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
    };
    let written = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp).and_then(|()| create())
        }
        r => r,
    }
    .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
    .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "writing {} (through {}): {e}",
            path.display(),
            tmp.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Side, SideResult};

    /// A 1 MiB measurement of experiment `n` (2 channels of 1 socket, window 1).
    fn measurement() -> Measurement {
        let e = crate::flags::ExperimentFlags::default()
            .with(crate::flags::Knob::Name, "n")
            .with(crate::flags::Knob::Sizes, "1M")
            .with(crate::flags::Knob::Iters, "2")
            .with(crate::flags::Knob::Warmup, "0")
            .with(crate::flags::Knob::Channels, "2")
            .with(crate::flags::Knob::SocksPerChannel, "1")
            .with(crate::flags::Knob::Window, "1")
            .with(crate::flags::Knob::TimeoutS, "5")
            .experiment()
            .unwrap();
        // Built from JSON so that fields added later (all defaulted) need no change here.
        let side = |side: Side| -> SideResult {
            serde_json::from_value(serde_json::json!({
                "side": side,
                "iter_secs": [0.001, 0.002],
                "wrong_bytes": (side == Side::Recv).then_some(0),
            }))
            .unwrap()
        };
        Measurement {
            experiment: e,
            size: 1 << 20,
            chunk: 1 << 20,
            send: side(Side::Send).summarise(1 << 20),
            recv: side(Side::Recv).summarise(1 << 20),
        }
    }

    /// Issue 43 item 8: a link planted at the samples file's temporary name (or its own name)
    /// is not written through.
    #[test]
    fn samples_are_not_written_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        let path = dir.path().join("s.csv");
        std::os::unix::fs::symlink(&victim, path.with_extension("csv.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let m = measurement();
        let outcome = Outcome {
            experiment: m.experiment.clone(),
            side: Side::Send,
            peer: String::new(),
            measurements: vec![m],
            samples: vec![],
            nic_plan: None,
        };
        write_samples(&path, &outcome).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert!(!path.with_extension("csv.tmp").exists());
    }

    #[test]
    fn rows_have_one_cell_per_column_for_each_side() {
        let m = measurement();
        let rows = csv_rows(&m, "local", "loopback", 7);
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r.len(), CSV_HEADER.len());
            assert_eq!(r[0], "7");
        }
        assert_eq!(
            rows[0][..16].join(","),
            "7,n,local,loopback,socket,host,1,2,1,1048576,1,true,1048576,2,0,send"
        );
        assert_eq!(rows[0][15], "send");
        assert_eq!(rows[1][15], "recv");
        assert_eq!(rows[1][23], "0");
        assert_eq!(rows[0][23], "");
    }

    /// The knobs that shape a transfer are in the row, so that rows timed or staged differently
    /// can be told apart; a knob left at its default leaves its cell empty (barrier and
    /// worker_cpus excepted, which always have a value).
    #[test]
    fn rows_say_how_the_transfer_was_shaped() {
        let cell = |m: &Measurement, column: &str| {
            let i = CSV_HEADER.iter().position(|c| *c == column).unwrap();
            csv_rows(m, "local", "loopback", 7)[1][i].clone()
        };
        const SHAPING: [&str; 5] = [
            "sock_buf",
            "zero_copy_min",
            "barrier",
            "staging_ring",
            "worker_cpus",
        ];
        let mut m = measurement();
        assert_eq!(
            SHAPING.map(|c| cell(&m, c)),
            ["", "", "iteration", "", "auto"]
        );
        let mut e = m.experiment.clone();
        for (knob, value) in [
            (tcpx_model::Knob::SockBuf, "4M"),
            (tcpx_model::Knob::ZeroCopyMin, "64K"),
            (tcpx_model::Knob::Barrier, "size"),
            (tcpx_model::Knob::StagingRing, "32M"),
            (tcpx_model::Knob::WorkerCpus, "own"),
        ] {
            e.set_knob(knob, &[value]).unwrap();
        }
        m.experiment = e;
        assert_eq!(
            SHAPING.map(|c| cell(&m, c)),
            ["4194304", "65536", "size", "33554432", "own"]
        );
    }

    /// The CSV's knob columns are the knob table's: each column is a knob's (as the table names
    /// it) or a figure of the run, and every knob the table gives a column has it.
    #[test]
    fn the_knob_columns_are_the_knob_tables() {
        let m = measurement();
        let figures = m.send.figures();
        for column in CSV_HEADER {
            let knob = tcpx_model::KNOBS.iter().find(|s| s.csv == Some(column));
            assert!(
                knob.is_some() || run_cell(column, &m, &m.send, &figures, "r", "p", 0).is_some(),
                "CSV column `{column}` is neither a figure nor a knob of tcpx_model::KNOBS"
            );
        }
        for spec in tcpx_model::KNOBS {
            if let Some(c) = spec.csv {
                assert!(
                    CSV_HEADER.contains(&c),
                    "knob {} has no column {c}",
                    spec.name
                );
            }
        }
    }
}
