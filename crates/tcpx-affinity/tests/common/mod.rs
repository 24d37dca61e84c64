//! Fixture helpers: the trees live in tcpx-topo's tests/fixtures (one source for both crates);
//! tests that write get their own copy in a temporary directory.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tcpx_topo::SysRoot;

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tcpx-topo/tests/fixtures")
        .join(name)
}

pub fn fixture(name: &str) -> SysRoot {
    SysRoot::new(fixture_dir(name))
}

/// Copy a tree, recreating symlinks as symlinks (their relative targets stay inside the copy).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let ty = entry.file_type().unwrap();
        if ty.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ty.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A temporary directory on tmpfs (/dev/shm) when there is one: fixture copies are ~1,700 small
/// files, which a loaded disk creates slowly.
pub fn fast_tempdir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("tcpx-fixture-")
            .tempdir_in(shm)
        {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A writable copy of a fixture; keep the TempDir alive as long as the root is used.
pub fn writable_fixture(name: &str) -> (tempfile::TempDir, SysRoot) {
    let dir = fast_tempdir();
    copy_tree(&fixture_dir(name), dir.path());
    let root = SysRoot::new(dir.path());
    (dir, root)
}
