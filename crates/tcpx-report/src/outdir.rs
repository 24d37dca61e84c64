//! Where results go when the asked-for place cannot take them: a run directory is checked
//! before the first experiment, and a report that cannot be written there at the end is written
//! to a temporary directory instead, so that a finished run never loses its results.

use std::path::{Path, PathBuf};

use crate::error::{chain, refuse, Context, Result};

use crate::record::RunReport;
use crate::write::{write_run, Written};

/// Creates `dir` (and its parents) and checks that a file can be written in it, so that a run
/// whose report could not be saved is refused before it starts.
pub fn prepare_run_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "creating the report directory {} (is its parent writable? choose another with --reports)",
            dir.display()
        )
    })?;
    probe(dir)
}

/// Most run directories of one name tried (`name`, `name-2`, ... `name-1000`).
pub const MAX_SAME_NAME_RUNS: u32 = 1000;

/// Creates a new run directory `<parent>/<name>` for this run alone: created exclusively
/// (`mkdir`, not "create if missing"), so that two runs started in the same second never share
/// one; when `<name>` exists, `<name>-2`, `<name>-3`, ... Checks that a file can be written in
/// it, so a run whose report could not be saved is refused before it starts. Returns the
/// directory created.
pub fn create_run_dir(parent: &Path, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(parent).with_context(|| {
        format!(
            "creating {}, where the report directory goes (is its parent writable? choose another with --reports)",
            parent.display()
        )
    })?;
    for n in 1..=MAX_SAME_NAME_RUNS {
        let dir = match n {
            1 => parent.join(name),
            n => parent.join(format!("{name}-{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                probe(&dir)?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(crate::atomic_file::io_error(
                    e,
                    &format!("creating the report directory {}", dir.display()),
                ))
            }
        }
    }
    refuse!(
        "{} already holds {MAX_SAME_NAME_RUNS} run directories named {name}[-N]: remove some or choose another with --reports",
        parent.display()
    )
}

fn probe(dir: &Path) -> Result<()> {
    let probe = dir.join(format!(".tcpx-write-probe-{}", std::process::id()));
    // Created exclusively: a link planted at the probe's name is removed, not written through.
    let written = crate::atomic_file::create_temp(&probe).and_then(|mut f| {
        use std::io::Write;
        f.write_all(b"probe")
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&probe);
        return Err(crate::atomic_file::io_error(
            e,
            &format!(
                "writing {} ({} must be writable; choose another directory with --reports)",
                probe.display(),
                dir.display()
            ),
        ));
    }
    std::fs::remove_file(&probe).with_context(|| format!("removing {}", probe.display()))?;
    Ok(())
}

/// Checks, before a run, that `path` can later be written as a file: it is not a directory,
/// and its directory exists (created if needed) and is writable.
pub fn check_writable_file(path: &Path) -> Result<()> {
    if path.as_os_str().is_empty() {
        refuse!("the path is empty");
    }
    if path.is_dir() {
        refuse!(
            "{} is a directory: name a file in it, e.g. {}",
            path.display(),
            path.join("samples.csv").display()
        );
    }
    if let Ok(m) = std::fs::metadata(path) {
        if !m.is_file() {
            refuse!("{} is not a regular file", path.display());
        }
    }
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    probe(&dir)
}

/// The directory a report goes to when `wanted` cannot take it: a fresh directory under the
/// system's temporary directory, named after `wanted`.
pub fn fallback_dir(wanted: &Path) -> PathBuf {
    let name = wanted
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    std::env::temp_dir().join(format!("tcpx-run-{}-{name}", std::process::id()))
}

/// What [`write_run_or_fallback`] wrote, and why it went elsewhere when it did.
#[derive(Debug, Clone)]
pub struct Saved {
    pub written: Written,
    /// Why `wanted` could not take the report (then `written.dir` is the fallback).
    pub fallback_reason: Option<String>,
}

/// Writes the report into `wanted`; if that fails, into [`fallback_dir`]. An error only when
/// both fail (it names both).
pub fn write_run_or_fallback(report: &RunReport, wanted: &Path) -> Result<Saved> {
    match write_run(report, wanted) {
        Ok(written) => Ok(Saved {
            written,
            fallback_reason: None,
        }),
        Err(first) => {
            let other = fallback_dir(wanted);
            let written = write_run(report, &other).with_context(|| {
                format!(
                    "writing the report to {} failed ({}), and so did writing it to {}",
                    wanted.display(),
                    chain(&first),
                    other.display()
                )
            })?;
            Ok(Saved {
                written,
                fallback_reason: Some(chain(&first)),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_directories_are_created_exclusively_and_never_shared() {
        let parent = tempfile::tempdir().unwrap();
        let a = create_run_dir(parent.path(), "20261124T000000Z-p").unwrap();
        let b = create_run_dir(parent.path(), "20261124T000000Z-p").unwrap();
        let c = create_run_dir(parent.path(), "20261124T000000Z-p").unwrap();
        assert_eq!(a, parent.path().join("20261124T000000Z-p"));
        assert_eq!(b, parent.path().join("20261124T000000Z-p-2"));
        assert_eq!(c, parent.path().join("20261124T000000Z-p-3"));
        // Many at once, from threads: each gets its own.
        let dirs: Vec<PathBuf> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| create_run_dir(parent.path(), "same").unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let unique: std::collections::BTreeSet<_> = dirs.iter().collect();
        assert_eq!(unique.len(), 8, "{dirs:?}");
    }
}
