//! An injectable file-system root for `/sys` and `/proc`, so that everything that reads (or, in
//! `tcpx-affinity`, writes) kernel files can run on a fixture tree in tests.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Kernel files are small (the largest, /proc/interrupts, is a few MiB at most); reading at most
/// this much keeps a misplaced fixture (a pipe, a huge file) from hanging or exhausting memory.
const MAX_ATTR_BYTES: u64 = 16 << 20;

/// A directory standing for `/` when reading `sys/...` and `proc/...`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SysRoot {
    root: PathBuf,
}

impl Default for SysRoot {
    fn default() -> Self {
        Self::live()
    }
}

impl SysRoot {
    /// The running system's own `/`.
    pub fn live() -> Self {
        Self {
            root: PathBuf::from("/"),
        }
    }

    /// A fixture tree (or `/`, which is the same as [`SysRoot::live`]).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// True when this is the running system, where hwloc and privilege checks apply.
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` is an absolute-looking path such as `/sys/class/net`; it is placed under the root.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.root.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// Read a kernel attribute file as text (at most 16 MiB: /proc/interrupts of a 200-CPU machine
    /// passes 1 MiB), with the path in the error.
    pub fn read(&self, rel: impl AsRef<Path>) -> std::io::Result<String> {
        let path = self.path(rel);
        let file = std::fs::File::open(&path).map_err(|e| annotate(e, &path))?;
        let mut text = String::new();
        file.take(MAX_ATTR_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| annotate(e, &path))?;
        Ok(text)
    }

    /// [`SysRoot::read`] trimmed, or `None` when the file is absent or unreadable (many sysfs
    /// attributes are optional or refuse reads, e.g. `speed` of a link that is down).
    pub fn read_opt(&self, rel: impl AsRef<Path>) -> Option<String> {
        self.read(rel).ok().map(|s| s.trim().to_string())
    }

    /// Canonical path of `rel` with symlinks resolved, expressed again relative to the root
    /// (`/sys/devices/pci0000:00/...`), so fixture trees and the live system look the same.
    pub fn canonical(&self, rel: impl AsRef<Path>) -> Option<PathBuf> {
        let real = std::fs::canonicalize(self.path(rel)).ok()?;
        let root = std::fs::canonicalize(&self.root).ok()?;
        let inner = real.strip_prefix(&root).ok()?;
        Some(Path::new("/").join(inner))
    }

    /// File names in a directory, sorted; empty when the directory is absent.
    pub fn list_dir(&self, rel: impl AsRef<Path>) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(rel))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The last component of a symlink's target (e.g. the driver name of `device/driver`).
    pub fn link_name(&self, rel: impl AsRef<Path>) -> Option<String> {
        let target = std::fs::read_link(self.path(rel)).ok()?;
        target
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
    }
}

fn annotate(e: std::io::Error, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Reads `reader` to its end when that is at most `limit` bytes; `None` for a longer one (or an
/// endless one, like `/dev/zero`), known after reading `limit + 1` bytes. Every bounded file read
/// of the workspace goes through it.
pub fn read_at_most(reader: impl Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// Opens `path` for reading when it is a regular file (a link to one is followed), and refuses
/// anything else naming the path and what it is: a FIFO (whose plain `open` waits for a writer
/// forever), a device (`/dev/zero` is endless), a socket or a directory. The open is
/// non-blocking, so a FIFO is refused at once; the type is checked on the opened file (`fstat`),
/// so nothing can swap the path between the check and the read. Every input file of the
/// workspace that a user names (plans, modules, target sets, tuned files, token files, hwloc XML,
/// IRQ backups, fabric state files) is opened through it, and read with a bound
/// ([`read_at_most`], [`read_bounded`]).
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let ft = file.metadata()?.file_type();
    if ft.is_file() {
        return Ok(file);
    }
    let kind = if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "{} is {kind}, not a regular file: give the path of a file",
            path.display()
        ),
    ))
}

/// Reads the regular file `path` ([`open_regular`]) whole when it holds at most `limit` bytes;
/// a longer one is an `InvalidData` error naming the file and the limit, never cut short.
pub fn read_bounded_bytes(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    read_at_most(file, limit)?.ok_or_else(|| too_large(path, limit))
}

fn too_large(path: &Path, limit: u64) -> std::io::Error {
    let limit = if limit >= 1 << 20 {
        format!("{} MiB", limit >> 20)
    } else {
        format!("{limit} bytes")
    };
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} is larger than {limit}, the limit for this file: is it the right one?",
            path.display(),
        ),
    )
}

/// Reads `path` as text of at most `limit` bytes: a longer (or endless) file is an `InvalidData`
/// error naming the file and the limit after reading `limit + 1` bytes, and anything but a
/// regular file is refused unread ([`open_regular`]).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    let bytes = read_bounded_bytes(path, limit)?;
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// `f(path)` on a thread, its answer within 10 s or a failure saying it hung.
    fn within_deadline<T: Send + 'static>(
        path: &Path,
        f: fn(&Path) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let (tx, rx) = mpsc::channel();
        let p = path.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(f(&p));
        });
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("reading {} hung", path.display()))
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_at_once_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        // A link to a FIFO is followed to it and refused too.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for (p, kind) in [
            (fifo.as_path(), "a FIFO"),
            (link.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
        ] {
            let e = within_deadline(p, |p| read_bounded(p, 1 << 20))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&p.display().to_string()) && e.contains(kind),
                "{}: {e}",
                p.display()
            );
        }
    }

    #[test]
    fn links_to_regular_files_are_followed_and_long_files_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "12345").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_bounded(&link, 5).unwrap(), "12345");
        let e = read_bounded_bytes(&link, 4).unwrap_err().to_string();
        assert!(
            e.contains(&link.display().to_string()) && e.contains("larger than 4 bytes"),
            "{e}"
        );
    }
}
