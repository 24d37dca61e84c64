//! tcpx-report: result records and the files a plan run is written to.
//!
//! * [`CsvAppender`]: appends rows to a CSV file so that a row is either written whole or not at
//!   all (one `write` of the whole encoded row to a file opened for appending; the header is
//!   written only into an empty file, and a header that differs from the file's is refused).
//! * [`record`]: [`RunReport`] and its parts: one [`ResultRecord`] per experiment and message
//!   size with every knob and every figure, criteria and decisions with their verdicts, the
//!   declared charts, samples; [`RunReport::exit_code`] (0 all pass, 1 some fail, 2 incomplete).
//! * [`write_run`]: writes `results.csv`, `samples.csv`, `report.json`, `charts/*.png|svg`,
//!   `summary.md` and a self-contained `index.html` into a run directory.
//! * [`chart`]: bar, line and heatmap charts with plotters and a bundled font (DejaVu Sans), so no
//!   system font is needed.
//! * [`index`]: the index over many run directories and the comparison of two runs.
//! * [`stats`]: medians, intervals for a median and for a ratio of medians, three-valued
//!   verdicts: the statistics behind every figure a report gives over repetitions.
//! * [`tuned`]: the configuration a run recommends as `tuned.env` / `tuned.json`: knobs mapped
//!   to NCCL, GPUDirect-TCPX and seed-benchmark variables, with the evidence for each.
//! * [`fleet`]: the files of a fleet run: the pair matrix (CSV, JSON) and its HTML report with a
//!   heatmap per NIC and the verdict table.
//! * [`safe`]: the one quoting module every writer of shell, comment and YAML text uses, and
//!   bounded reading of input files.
//! * [`Error`]: why a file could not be written or read; every message names the file and what
//!   to check, with the whole chain of its cause.
//!
//! Not for: running experiments (that is `tcpx-bench`) or deciding what to run (`tcpx-plan`).

#![forbid(unsafe_code)]

mod atomic_file;
pub mod chart;
mod console;
mod error;
pub mod fleet;
mod html;
pub mod index;
pub mod merge;
mod outdir;
pub mod record;
pub mod safe;
pub mod sequential;
pub mod stats;
mod time;
pub mod tuned;
mod write;

pub use atomic_file::write_file;
pub use chart::{render_chart, series_svg, ChartFiles, Series, LINE_RATE_SETUP_KEY};
pub use error::{Error, Result};
pub use html::esc as html_escape;
pub use outdir::{
    check_writable_file, create_run_dir, fallback_dir, prepare_run_dir, write_run_or_fallback,
    Saved, MAX_SAME_NAME_RUNS,
};
pub use record::{
    pool_iterations, repetition_reason, split_by_outcome, summarise, ChartKind, ChartSpec,
    Completion, CriterionResult, DecisionRecord, FlowFigures, KnobValues, NamedFigure, NoiseInfo,
    PhaseInfo, Ranking, ResultRecord, RunReport, SampleRecord, SideFigures, Status, Summary,
    Verdict, METRICS,
};
pub use stats::FigureStats;
pub use time::{utc_now_iso, utc_stamp};
pub use write::{load_run, write_run, Written, MAX_REPORT_JSON_BYTES};

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{refuse, Context};

/// Appends whole rows to a CSV file with a fixed header.
pub struct CsvAppender {
    path: PathBuf,
    header: Vec<String>,
}

impl CsvAppender {
    /// Opens (creating it and its directory if needed) `path` for rows with `header`.
    pub fn open(path: &Path, header: &[&str]) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating directory {}", dir.display()))?;
        }
        refuse_link(path)?;
        // Never through a link (O_NOFOLLOW: one planted after the check fails the open), and a
        // FIFO does not block the open (O_NONBLOCK); what was opened is checked below.
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .with_context(|| {
                format!(
                    "opening {} for appending (is the directory writable?)",
                    path.display()
                )
            })?;
        // A device (/dev/full, /dev/zero) or a FIFO is not a CSV file: its "contents" would be
        // read as the header and rows would vanish.
        let meta = f
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        if !meta.is_file() {
            refuse!(
                "{} is not a regular file: give a file path for the CSV",
                path.display()
            );
        }
        let mut existing = String::new();
        f.seek(SeekFrom::Start(0))?;
        Read::by_ref(&mut f)
            .take(64 * 1024)
            .read_to_string(&mut existing)
            .with_context(|| format!("reading {}", path.display()))?;
        let wanted = encode(&header.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        if existing.is_empty() {
            f.write_all(wanted.as_bytes())
                .with_context(|| format!("writing the header of {}", path.display()))?;
        } else {
            let first = existing.lines().next().unwrap_or("");
            if first != wanted.trim_end() {
                refuse!(
                    "{} has a different header than this version writes:\n  file: {first}\n  ours: {}\nwrite to another file with --csv, or move the old one away",
                    path.display(),
                    wanted.trim_end()
                );
            }
            if !existing.ends_with('\n') && existing.len() < 64 * 1024 {
                refuse!(
                    "{} ends in a partial line: fix or move the file before appending",
                    path.display()
                );
            }
        }
        Ok(CsvAppender {
            path: path.to_path_buf(),
            header: header.iter().map(|s| s.to_string()).collect(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one row; it must have as many fields as the header.
    pub fn append(&self, row: &[String]) -> Result<()> {
        if row.len() != self.header.len() {
            refuse!(
                "row has {} fields, the header {}",
                row.len(),
                self.header.len()
            );
        }
        let line = encode(row)?;
        let mut f = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
            .with_context(|| format!("opening {} for appending", self.path.display()))?;
        if !f.metadata()?.is_file() {
            refuse!("{} is no longer a regular file", self.path.display());
        }
        // One write of the whole row: O_APPEND makes it land whole at the end.
        let n = f
            .write(line.as_bytes())
            .with_context(|| format!("appending to {}", self.path.display()))?;
        if n != line.len() {
            // A short write to a regular file means the disk is full; cut the partial row off.
            let len = f.metadata()?.len();
            let _ = f.set_len(len - n as u64);
            return Err(Error::Write(format!(
                "{} could not take a whole row (disk full?); nothing was appended",
                self.path.display()
            )));
        }
        f.sync_data()
            .with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(())
    }
}

/// Refuses `path` when it is a symbolic link: no writer of this crate writes through a link it
/// did not make (a link in an output directory could point anywhere the user can write).
pub fn refuse_link(path: &Path) -> Result<()> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        refuse!(
            "{} is a symbolic link: this tool does not write through links (remove it, or give the path it points to)",
            path.display()
        );
    }
    Ok(())
}

fn encode(fields: &[String]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    // One row per line, whatever a peer or a plan put in a cell (issue 43 item 6).
    w.write_record(fields.iter().map(|f| crate::safe::printable(f)))?;
    let bytes = w.into_inner().map_err(|e| Error::Write(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| Error::Write(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_append_whole_and_headers_are_checked() {
        let dir = std::env::temp_dir().join(format!("tcpx-report-test-{}", std::process::id()));
        let path = dir.join("sub/x.csv");
        let _ = std::fs::remove_dir_all(&dir);
        let a = CsvAppender::open(&path, &["a", "b"]).unwrap();
        a.append(&["1".into(), "x,y".into()]).unwrap();
        assert!(a.append(&["1".into()]).is_err());
        let again = CsvAppender::open(&path, &["a", "b"]).unwrap();
        again.append(&["2".into(), "z".into()]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a,b\n1,\"x,y\"\n2,z\n"
        );
        let e = CsvAppender::open(&path, &["a", "c"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("different header"), "{e}");
        std::fs::write(&path, "a,b\n1,").unwrap();
        assert!(CsvAppender::open(&path, &["a", "b"])
            .err()
            .unwrap()
            .to_string()
            .contains("partial line"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 43 item 8: an appended CSV is never written through a link, and a FIFO in its
    /// place is refused at once.
    #[test]
    fn links_and_fifos_are_not_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.csv");
        let link = dir.path().join("samples.csv");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = CsvAppender::open(&link, &["a"]).err().unwrap().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert!(!target.exists());
        let fifo = dir.path().join("fifo.csv");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(CsvAppender::open(&f, &["a"]).err().map(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO hung")
            .unwrap();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn devices_are_not_csv_files() {
        let e = CsvAppender::open(Path::new("/dev/full"), &["a"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
