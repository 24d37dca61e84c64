//! Reading a watch directory: every `watch-<host>-<pid>.jsonl` (its rotated `.jsonl.1` first),
//! within bounds, each record checked before anything is computed from it.
//!
//! Bounds ([`Limits`]): how many files, how long one line, how many bytes in all. A file is opened
//! without following a link and without blocking (a FIFO named like a watch file is refused at
//! once rather than waited on); a link or anything but a regular file is skipped and said so.
//! The last line of a file that has no newline yet is a line the shim is still writing: left for
//! the next read, not an error.
//!
//! Checks (a peer's figures are input like any other): times, rates and bounds finite and not
//! negative; a process's clock (`t`) never going back; each comm's counters never going back
//! between intervals (a new `start` line is a restart: its counters begin again); histograms
//! whose counts match their bounds. An impossible figure is an error naming the file and line.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::record::{CommCounters, Conn, Dir, End, ErrorRecord, Interval, Record, Start};

/// How much of a directory is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Watch files (current and rotated) at most.
    pub max_files: usize,
    /// One line's bytes at most (a longer line is an error).
    pub max_line_bytes: usize,
    /// All files' bytes together at most.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 4096,
            max_line_bytes: 4 << 20,
            max_total_bytes: 2 << 30,
        }
    }
}

/// Why a directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{dir}: {source} (check that the directory exists and is readable)")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: {source}")]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{dir} holds more than {limit} watch files: point at one job's directory (or raise the file limit)")]
    TooManyFiles { dir: PathBuf, limit: usize },
    #[error("the watch files hold more than {limit} bytes together (at {file}): point at one job's directory, or raise the byte limit")]
    TooManyBytes { file: PathBuf, limit: u64 },
    #[error("{file}:{line}: longer than {limit} bytes: not a line the watch shim writes")]
    LongLine {
        file: PathBuf,
        line: usize,
        limit: usize,
    },
    #[error("{file}:{line}: not a watch record ({why})")]
    Parse {
        file: PathBuf,
        line: usize,
        why: String,
    },
    #[error("{file}:{line}: impossible figure: {what} (the file is damaged, or was not written by the watch shim)")]
    Figure {
        file: PathBuf,
        line: usize,
        what: String,
    },
}

/// One process's life between two `start` lines (a restart begins a new one). A run whose
/// `start` was rotated away has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    pub start: Option<Start>,
    pub conns: Vec<Conn>,
    pub intervals: Vec<Interval>,
    /// Per interval (same index), per comm (same order): the shim's `posted_sized` count
    /// ([`crate::record::posted_sized`]); a receive comm's non-zero count makes its bytes an
    /// upper bound.
    pub posted_sized: Vec<Vec<u64>>,
    pub errors: Vec<ErrorRecord>,
    pub end: Option<End>,
}

impl Run {
    /// Wall-clock seconds of `t` in this run, where its start gave the clock.
    pub fn unix(&self, t: f64) -> Option<f64> {
        self.start.as_ref().map(|s| s.unix_s + t)
    }
}

/// One process that loaded the shim.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub host: String,
    pub pid: u32,
    /// The files read, oldest first.
    pub files: Vec<PathBuf>,
    pub runs: Vec<Run>,
}

/// Everything read from one directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchDir {
    /// By (host, pid).
    pub processes: Vec<Process>,
    /// Entries not read, each with why (links, not regular files, a line still being written).
    pub notes: Vec<String>,
}

/// `watch-<host>-<pid>.jsonl` or `...jsonl.1` -> (host, pid, rotated).
pub fn parse_file_name(name: &str) -> Option<(String, u32, bool)> {
    let rest = name.strip_prefix("watch-")?;
    let (stem, rotated) = match rest.strip_suffix(".jsonl.1") {
        Some(s) => (s, true),
        None => (rest.strip_suffix(".jsonl")?, false),
    };
    let (host, pid) = stem.rsplit_once('-')?;
    if host.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((host.to_string(), pid.parse().ok()?, rotated))
}

/// Reads every watch file of `dir` (see the module doc).
pub fn read_dir(dir: &Path, limits: &Limits) -> Result<WatchDir, ReadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| ReadError::Dir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut notes = Vec::new();
    // (host, pid) -> [rotated, current]
    let mut found: BTreeMap<(String, u32), [Option<PathBuf>; 2]> = BTreeMap::new();
    let mut files = 0usize;
    for entry in entries {
        let entry = entry.map_err(|source| ReadError::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some((host, pid, rotated)) = name.to_str().and_then(parse_file_name) else {
            continue;
        };
        let path = entry.path();
        // The entry itself, not what a link points at.
        let kind = entry.file_type().map_err(|source| ReadError::Io {
            file: path.clone(),
            source,
        })?;
        if kind.is_symlink() {
            notes.push(format!(
                "{}: a symbolic link, not followed (the shim writes regular files)",
                path.display()
            ));
            continue;
        }
        if !kind.is_file() {
            let what = if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            notes.push(format!("{}: {what}, refused", path.display()));
            continue;
        }
        files += 1;
        if files > limits.max_files {
            return Err(ReadError::TooManyFiles {
                dir: dir.to_path_buf(),
                limit: limits.max_files,
            });
        }
        found.entry((host, pid)).or_default()[usize::from(!rotated)] = Some(path);
    }
    let mut total = 0u64;
    let mut processes = Vec::new();
    for ((host, pid), pair) in found {
        let mut reader = ProcessReader::default();
        let mut read_files = Vec::new();
        for path in pair.into_iter().flatten() {
            read_file(&path, limits, &mut total, &mut reader, &mut notes)?;
            read_files.push(path);
        }
        let runs = reader.finish();
        // The start line's host as the shim read it (the file name's is made file-safe).
        let host = runs
            .iter()
            .find_map(|r| r.start.as_ref().map(|s| s.host.clone()))
            .unwrap_or(host);
        processes.push(Process {
            host,
            pid,
            files: read_files,
            runs,
        });
    }
    Ok(WatchDir { processes, notes })
}

/// Opens `path` without following a link and without blocking, and refuses anything but a
/// regular file (checked on the open file, so a swap after the directory listing is caught).
fn open_regular(path: &Path) -> Result<File, ReadError> {
    let io = |source| ReadError::Io {
        file: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(io(std::io::Error::other(
            "not a regular file: refused (the shim writes regular files)",
        )));
    }
    Ok(file)
}

fn read_file(
    path: &Path,
    limits: &Limits,
    total: &mut u64,
    reader: &mut ProcessReader,
    notes: &mut Vec<String>,
) -> Result<(), ReadError> {
    let file = open_regular(path)?;
    let io = |source| ReadError::Io {
        file: path.to_path_buf(),
        source,
    };
    let budget = limits.max_total_bytes.saturating_sub(*total);
    // One byte beyond the budget tells a file that is too big from one that fits exactly.
    let mut input = BufReader::new(file.take(budget.saturating_add(1)));
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        line_no += 1;
        let n = (&mut input)
            .take(limits.max_line_bytes as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(io)?;
        if n == 0 {
            break;
        }
        *total += n as u64;
        if *total > limits.max_total_bytes {
            return Err(ReadError::TooManyBytes {
                file: path.to_path_buf(),
                limit: limits.max_total_bytes,
            });
        }
        let complete = buf.last() == Some(&b'\n');
        let body = if complete {
            &buf[..buf.len() - 1]
        } else {
            &buf[..]
        };
        if body.len() > limits.max_line_bytes {
            return Err(ReadError::LongLine {
                file: path.to_path_buf(),
                line: line_no,
                limit: limits.max_line_bytes,
            });
        }
        let text = match std::str::from_utf8(body) {
            Ok(t) => t.trim(),
            Err(_) if !complete => {
                notes.push(partial_note(path, line_no));
                break;
            }
            Err(e) => {
                return Err(ReadError::Parse {
                    file: path.to_path_buf(),
                    line: line_no,
                    why: e.to_string(),
                })
            }
        };
        if text.is_empty() {
            continue;
        }
        let record = match Record::parse(text) {
            Ok(r) => r,
            // The shim is still writing this line.
            Err(_) if !complete => {
                notes.push(partial_note(path, line_no));
                break;
            }
            Err(e) => {
                return Err(ReadError::Parse {
                    file: path.to_path_buf(),
                    line: line_no,
                    why: e.to_string(),
                })
            }
        };
        let posted = match &record {
            Record::Interval(_) => {
                crate::record::posted_sized(text).map_err(|e| ReadError::Parse {
                    file: path.to_path_buf(),
                    line: line_no,
                    why: e.to_string(),
                })?
            }
            _ => Vec::new(),
        };
        reader
            .push(record, posted)
            .map_err(|what| ReadError::Figure {
                file: path.to_path_buf(),
                line: line_no,
                what,
            })?;
    }
    Ok(())
}

fn partial_note(path: &Path, line: usize) -> String {
    format!(
        "{}:{line}: a line still being written, left for the next read",
        path.display()
    )
}

/// Splits one process's records into runs and checks them as they come.
#[derive(Default)]
struct ProcessReader {
    runs: Vec<Run>,
    last_t: Option<f64>,
    /// Each comm's last counters in the current run.
    last: BTreeMap<(u64, Dir), CommCounters>,
}

fn finite_non_negative(what: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(format!("{what} = {v} (a finite number, not negative)"))
    }
}

impl ProcessReader {
    fn current(&mut self) -> &mut Run {
        if self.runs.is_empty() {
            self.runs.push(Run::default());
        }
        let at = self.runs.len() - 1;
        &mut self.runs[at]
    }

    /// `posted`: an interval's `posted_sized` per comm (empty for other records).
    fn push(&mut self, record: Record, mut posted: Vec<u64>) -> Result<(), String> {
        if let Some(t) = record.t() {
            finite_non_negative("t", t)?;
            // A start line begins a clock (or repeats the first one's t = 0 in a new file).
            if !matches!(record, Record::Start(_)) {
                if let Some(last) = self.last_t.filter(|last| t < *last) {
                    return Err(format!(
                        "t = {t} after t = {last}: the process's clock went back"
                    ));
                }
                self.last_t = Some(t);
            }
        }
        match record {
            Record::Start(s) => {
                finite_non_negative("unix_s", s.unix_s)?;
                // Each new file begins with the process's start line again: the same init, a
                // continuation rather than a restart.
                let same = self
                    .runs
                    .last()
                    .and_then(|r| r.start.as_ref())
                    .is_some_and(|p| p.unix_s == s.unix_s && p.pid == s.pid && p.host == s.host);
                if same {
                    return Ok(());
                }
                self.runs.push(Run {
                    start: Some(s),
                    ..Run::default()
                });
                self.last.clear();
                self.last_t = None;
            }
            Record::Conn(c) => {
                finite_non_negative("took_s", c.took_s)?;
                self.current().conns.push(c);
            }
            Record::Interval(i) => {
                finite_non_negative("dt_s", i.dt_s)?;
                for c in &i.comms {
                    if let Some(p) = c.lat_us.problem() {
                        return Err(format!("comm {}: {p}", c.comm));
                    }
                    if let Some(prev) = self.last.get(&(c.comm, c.dir)) {
                        let back = |what: &str, now: u64, was: u64| {
                            if now < was {
                                Err(format!(
                                    "comm {} ({}): {what} went back from {was} to {now} with no restart between",
                                    c.comm,
                                    c.dir.as_str()
                                ))
                            } else {
                                Ok(())
                            }
                        };
                        back("bytes", c.bytes, prev.bytes)?;
                        back("requests", c.requests, prev.requests)?;
                        back("errors", c.errors, prev.errors)?;
                        if let (Some(now), Some(was)) = (c.lat_sum_us, prev.lat_sum_us) {
                            back("lat_sum_us", now, was)?;
                        }
                        if prev.lat_us.le == c.lat_us.le {
                            for (now, was) in c.lat_us.counts.iter().zip(&prev.lat_us.counts) {
                                back("a latency count", *now, *was)?;
                            }
                        }
                    }
                }
                for c in &i.comms {
                    self.last.insert((c.comm, c.dir), c.clone());
                }
                posted.resize(i.comms.len(), 0);
                let run = self.current();
                run.intervals.push(i);
                run.posted_sized.push(posted);
            }
            Record::Error(e) => self.current().errors.push(e),
            Record::End(e) => self.current().end = Some(e),
            Record::Unknown => {}
        }
        Ok(())
    }

    fn finish(self) -> Vec<Run> {
        self.runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(
            parse_file_name("watch-a3-host-0-4242.jsonl"),
            Some(("a3-host-0".into(), 4242, false))
        );
        assert_eq!(
            parse_file_name("watch-h-7.jsonl.1"),
            Some(("h".into(), 7, true))
        );
        for bad in [
            "watch-h.jsonl",
            "watch--7.jsonl",
            "watch-h-7x.jsonl",
            "watch-h-7.jsonl.2",
            "other-h-7.jsonl",
            "watch-h-99999999999.jsonl",
        ] {
            assert_eq!(parse_file_name(bad), None, "{bad}");
        }
    }
}
