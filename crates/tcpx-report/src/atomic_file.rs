//! Files written whole or not at all: into a temporary name in the same directory, then renamed
//! into place, with IO errors that say what to check. Below every module that writes a file.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The temporary name `path` is written under before it is renamed into place: hidden, in the
/// same directory (so the rename is atomic), unique to this process, extension kept (chart
/// backends choose the format by it).
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!(".{stem}.{}.tmp{ext}", std::process::id()))
}

/// Writes `bytes` to `path` whole or not at all: into [`temp_path`], then renamed over `path`,
/// so a reader (or a run killed mid-write) sees the old file or the new one, never a part. On
/// failure the temporary file is removed and the error names the file and what to check.
/// A link at `path` itself is replaced by the file, never followed: the rename replaces the
/// directory entry, and the temporary file is created exclusively ([`create_temp`]).
///
/// The bytes are written into an unnamed file of the directory first (`O_TMPFILE`) and only
/// then linked under the temporary name, so a run killed during the write (Ctrl-C while a
/// large samples.csv is written) leaves nothing behind; where the file system has no unnamed
/// files, the temporary name is created first as before.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let named = || {
        create_temp(&tmp).and_then(|mut f| {
            use std::io::Write;
            f.write_all(bytes)
        })
    };
    let written = match write_unnamed(path, bytes) {
        // No /proc to link through (or no linkat): the named way, whose errors are the ones
        // to report.
        Some(Ok(file)) => link_unnamed(&file, &tmp).or_else(|_| named()),
        Some(Err(e)) => Err(e),
        None => named(),
    };
    finish_temp(&tmp, path, written)
}

/// `bytes` in a new unnamed file (`O_TMPFILE`) in `path`'s directory; `None` where the file
/// system or kernel has none (then the caller names the file first).
fn write_unnamed(path: &Path, bytes: &[u8]) -> Option<std::io::Result<std::fs::File>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o644)
        .open(dir);
    match file {
        Ok(mut f) => Some(f.write_all(bytes).map(|()| f)),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) =>
        {
            None
        }
        Err(e) => Some(Err(e)),
    }
}

/// Gives the unnamed `file` the name `tmp` (removing a leftover of that name first, never
/// writing through it: a link cannot replace an entry).
fn link_unnamed(file: &std::fs::File, tmp: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let link = || {
        nix::unistd::linkat(
            nix::fcntl::AT_FDCWD,
            proc_path.as_str(),
            nix::fcntl::AT_FDCWD,
            tmp,
            nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
        )
        .map_err(std::io::Error::from)
    };
    match link() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(tmp)?;
            link()
        }
        r => r,
    }
}

/// Creates `tmp` as a new, empty regular file of this process, never opening what is there:
/// `O_CREAT | O_EXCL` (which refuses a symbolic link too), and a leftover of that name (a
/// link someone planted, or a file of an earlier process of the same id) is removed first, not
/// written through.
pub(crate) fn create_temp(tmp: &Path) -> std::io::Result<std::fs::File> {
    let open = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(tmp)?;
            open()
        }
        r => r,
    }
}

/// [`temp_path`] of `path`, created empty by [`create_temp`], for a writer that opens it by
/// name itself (the chart backends): what it opens is the file this process just made.
pub(crate) fn reserve_temp(path: &Path) -> Result<PathBuf> {
    let tmp = temp_path(path);
    create_temp(&tmp).map_err(|e| io_error(e, &format!("creating {}", tmp.display())))?;
    Ok(tmp)
}

/// Renames `tmp` (just written with `result`) to `path`, or removes it and says why.
pub(crate) fn finish_temp(tmp: &Path, path: &Path, result: std::io::Result<()>) -> Result<()> {
    let result = result
        .map_err(|e| io_error(e, &format!("writing {}", tmp.display())))
        .and_then(|()| {
            std::fs::rename(tmp, path).map_err(|e| {
                io_error(
                    e,
                    &format!("renaming {} to {}", tmp.display(), path.display()),
                )
            })
        });
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// The options that choose the directory report files go to: a plan run's and a fleet run's
/// (the same writers serve both, so a hint names both).
const DIR_OPTIONS: &str = "--reports, or --out for a fleet run";

/// An IO error with what was done, and a hint for the usual causes.
pub(crate) fn io_error(e: std::io::Error, doing: &str) -> Error {
    let hint = match e.raw_os_error() {
        Some(28) => {
            format!(": the file system is full (free space or choose another directory with {DIR_OPTIONS})")
        }
        Some(13) | Some(1) => {
            format!(": permission denied (choose a directory you can write, with {DIR_OPTIONS})")
        }
        Some(30) => {
            format!(": the file system is read-only (choose another directory with {DIR_OPTIONS})")
        }
        _ => String::new(),
    };
    Error::Io {
        doing: doing.to_string(),
        error: e,
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43 (minor): the hint for a full disk names the fleet's directory option too (a
    /// fleet run has no --reports).
    #[test]
    fn a_full_disk_hint_names_the_fleets_option_too() {
        let e = io_error(std::io::Error::from_raw_os_error(28), "writing matrix.csv");
        let e = e.to_string();
        assert!(
            e.contains("--out for a fleet run") && e.contains("--reports"),
            "{e}"
        );
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn files_are_replaced_whole_under_a_hidden_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("results.csv");
        let tmp = temp_path(&p);
        let tmp_name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(tmp_name.starts_with(".results.") && tmp_name.ends_with(".tmp.csv"));
        assert_eq!(
            temp_path(&dir.path().join("c.png")).extension().unwrap(),
            "png"
        );
        write_file(&p, b"a,b\n1,2\n").unwrap();
        write_file(&p, b"a,b\n3,4\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a,b\n3,4\n");
        assert_eq!(names(dir.path()), ["results.csv"]);
    }

    #[test]
    fn a_failed_write_names_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The place is taken by a non-empty directory: the rename fails after the write.
        let p = dir.path().join("index.html");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("x"), "x").unwrap();
        let e = format!("{:#}", write_file(&p, b"<html></html>").unwrap_err());
        assert!(e.contains(&p.display().to_string()), "{e}");
        assert_eq!(names(dir.path()), ["index.html"]);
        // A directory that does not exist: the error names the file it tried.
        let e = format!(
            "{:#}",
            write_file(&dir.path().join("gone/report.json"), b"{}").unwrap_err()
        );
        assert!(
            e.contains("gone/.report.") && e.contains("No such file"),
            "{e}"
        );
    }

    /// Issue 43 item 8: links planted at the file's name or at its temporary name are replaced,
    /// never written through.
    #[test]
    fn links_at_the_file_or_its_temporary_name_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        // A dangling link at the name and one at the temporary name.
        let p = out.join("report.json");
        std::os::unix::fs::symlink(elsewhere.join("a"), &p).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("b"), temp_path(&p)).unwrap();
        write_file(&p, b"{}").unwrap();
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        // A link to an existing file: that file keeps its contents.
        let victim = elsewhere.join("victim");
        std::fs::write(&victim, "mine").unwrap();
        let q = out.join("tuned.env");
        std::os::unix::fs::symlink(&victim, temp_path(&q)).unwrap();
        std::os::unix::fs::symlink(&victim, &q).unwrap();
        write_file(&q, b"X=1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(&q).unwrap(), "X=1\n");
        assert_eq!(names(&out), ["report.json", "tuned.env"]);
    }

    /// Issue 43, minor: Ctrl-C while a report file was written left `.samples.*.tmp.csv`. The
    /// child (this test binary again) rewrites a 64 MiB file in a loop; a signal that ends it
    /// lands during a write, and nothing but the whole file is left. The signal is SIGTERM, which
    /// ends a process mid-write as Ctrl-C's SIGINT does: a shell starts background jobs with
    /// SIGINT ignored (POSIX, without job control), and a test run started that way passes the
    /// ignored SIGINT on to this child, which has no handler of its own to override it.
    #[test]
    fn a_run_interrupted_while_writing_leaves_no_temporary_file() {
        const CHILD: &str = "TCPX_REPORT_TEST_WRITE_LOOP";
        if let Some(dir) = std::env::var_os(CHILD) {
            let bytes = vec![b'x'; 64 << 20];
            let p = Path::new(&dir).join("samples.csv");
            loop {
                write_file(&p, &bytes).unwrap();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "atomic_file::tests::a_run_interrupted_while_writing_leaves_no_temporary_file",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let done = dir.path().join("samples.csv");
        // Past the first whole write, the loop is writing the next one (or renaming it).
        while !done.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the child wrote nothing"
            );
            assert!(child.try_wait().unwrap().is_none(), "the child ended");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child outlived SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(names(dir.path()), ["samples.csv"]);
        assert_eq!(std::fs::metadata(&done).unwrap().len(), 64 << 20);
    }

    #[test]
    fn a_full_disk_is_named_with_the_file() {
        let e = io_error(
            std::io::Error::from_raw_os_error(28),
            "writing reports/x/.results.1.tmp.csv",
        )
        .to_string();
        assert!(
            e.starts_with("writing reports/x/.results.1.tmp.csv: No space left on device")
                && e.contains("the file system is full"),
            "{e}"
        );
    }
}
