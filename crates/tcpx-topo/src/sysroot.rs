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

/// Reads `path` as text of at most `limit` bytes: a longer (or endless, like `/dev/zero`) file
/// is an `InvalidData` error naming the file and the limit after reading `limit + 1` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let Some(bytes) = read_at_most(file, limit)? else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is larger than {} MiB, the limit for this file: is it the right one?",
                path.display(),
                limit >> 20
            ),
        ));
    };
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text: {e}", path.display()),
        )
    })
}
