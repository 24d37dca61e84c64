//! What the tcpx-watch net-plugin shim (`crates/tcpx-watch-plugin`) wrote while a real job ran,
//! read back and judged: `tcpx-run watch DIR`.
//!
//! For: summarising a finished job's directory or following a running one; naming an idle or
//! slow NIC or link, start-up stalls, errors, and a job that never ran through the shim.
//! Not for: the shim itself (a C-boundary cdylib that only writes), measuring anything (the
//! figures are the job's own).
//!
//! # How it works
//!
//! [`record`] is the contract of the shim's JSON lines; [`read`] reads a directory within
//! [`read::Limits`] and checks every figure (a file written by a peer is input like any other);
//! [`summary`] turns cumulative counters into GB/s per process, NIC and link per time window,
//! latency percentiles and start-up times; [`verdict`] applies the fleet's straggler rule
//! (`tcpx_report::stats::robust`) with the windows as repetitions; [`fallback`] reads NCCL's log
//! for a job that used another network; [`present`] writes the table, JSON and HTML.
//! [`watch`] is the whole of it for one directory, [`follow`] the live loop; [`deploy`] is the
//! variables `tcpx-run apply --watch` adds.

pub mod deploy;
pub mod fallback;
pub mod present;
pub mod read;
pub mod record;
pub mod summary;
pub mod verdict;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use present::WatchReport;
pub use read::{Limits, ReadError};
pub use summary::{Summary, SummaryOptions};
pub use verdict::{Verdict, VerdictKind, VerdictOptions};

/// What `tcpx-run watch` was asked.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub limits: Limits,
    pub summary: SummaryOptions,
    pub verdicts: VerdictOptions,
    /// The user expected every process to load the shim (`--expect-plugin`).
    pub expect_plugin: bool,
    /// NCCL's debug log (`--nccl-log`).
    pub nccl_log: Option<PathBuf>,
}

/// Why a watch could not be made.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("--nccl-log {path}: {why}")]
    NcclLog { path: PathBuf, why: String },
}

/// Reads the first [`tcpx_transport::nccl::log::MAX_LOG_BYTES`] of NCCL's log (its INIT lines
/// come first; a long run's log can be far larger), refusing a FIFO or device unread.
fn read_nccl_log(path: &Path) -> Result<fallback::NcclLogFacts, WatchError> {
    use std::io::Read;
    let fail = |why: String| WatchError::NcclLog {
        path: path.to_path_buf(),
        why,
    };
    let file = tcpx_topo::open_regular(path).map_err(|e| fail(e.to_string()))?;
    let mut text = Vec::new();
    file.take(tcpx_transport::nccl::log::MAX_LOG_BYTES as u64)
        .read_to_end(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    Ok(fallback::read_nccl_log(&String::from_utf8_lossy(&text)))
}

/// Reads, summarises and judges `dir`.
pub fn watch(dir: &Path, o: &WatchOptions) -> Result<WatchReport, WatchError> {
    let nccl = o.nccl_log.as_deref().map(read_nccl_log).transpose()?;
    let read = read::read_dir(dir, &o.limits)?;
    let summary = summary::summarise(&read, &o.summary);
    let mut verdicts = fallback::fallback_verdicts(&read, o.expect_plugin, nccl.as_ref());
    verdicts.extend(verdict::verdicts(&summary, &o.verdicts));
    Ok(WatchReport {
        dir: dir.display().to_string(),
        summary,
        verdicts,
    })
}

/// How a [`follow`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowEnd {
    /// Every process that wrote a file wrote its end line.
    JobEnded,
    /// `stop` was set (Ctrl-C).
    Stopped,
    /// The deadline passed.
    Deadline,
}

/// Follows a running job: every `poll` re-reads `dir` and hands `line` one line per NIC for each
/// window that every process has passed and that was not shown yet. Ends when the job ends,
/// when `stop` is set, or at `deadline`; every wait is at most `poll` (and checks `stop` every
/// 100 ms).
pub fn follow(
    dir: &Path,
    o: &WatchOptions,
    poll: Duration,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    mut line: impl FnMut(&str),
) -> Result<(WatchReport, FollowEnd), WatchError> {
    let poll = poll.max(Duration::from_millis(100));
    // The wall-clock start of the next window to show.
    let mut shown_until: Option<f64> = None;
    loop {
        let read = read::read_dir(dir, &o.limits)?;
        let s = summary::summarise(&read, &o.summary);
        let latest = read
            .processes
            .iter()
            .flat_map(|p| p.runs.iter())
            .filter_map(|r| r.unix(r.intervals.last()?.t))
            .fold(f64::NEG_INFINITY, f64::max);
        // Wall-clock seconds near 1.7e9 hold about 2e-7 s: compare with a slack of the window.
        let slack = s.window_s * 1e-3;
        for w in 0..s.windows {
            let start = s.origin_unix_s + w as f64 * s.window_s;
            let end = start + s.window_s;
            if shown_until.is_some_and(|u| start < u - slack) || end > latest + slack {
                continue;
            }
            for l in present::follow_lines(&s, w) {
                line(&l);
            }
            shown_until = Some(end);
        }
        let ended = !read.processes.is_empty()
            && read
                .processes
                .iter()
                .all(|p| p.runs.last().is_some_and(|r| r.end.is_some()));
        let end = if ended {
            Some(FollowEnd::JobEnded)
        } else if stop.load(Ordering::SeqCst) {
            Some(FollowEnd::Stopped)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(FollowEnd::Deadline)
        } else {
            None
        };
        if let Some(end) = end {
            return Ok((watch(dir, o)?, end));
        }
        let until = Instant::now() + poll;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            let left = until.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }
}
