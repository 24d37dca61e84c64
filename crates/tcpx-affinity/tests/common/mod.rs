//! Fixture helpers: the trees live in tcpx-topo's tests/fixtures (one source for both crates);
//! tests that write get their own copy in a temporary directory.

#![allow(dead_code)]

use tcpx_topo::SysRoot;

#[allow(unused_imports)]
pub use tcpx_test_support::{copy_tree, fast_tempdir, fixture_dir};

pub fn fixture(name: &str) -> SysRoot {
    SysRoot::new(fixture_dir(name))
}

/// A writable copy of a fixture; keep the TempDir alive as long as the root is used.
pub fn writable_fixture(name: &str) -> (tempfile::TempDir, SysRoot) {
    let dir = tcpx_test_support::writable_fixture(name);
    let root = SysRoot::new(dir.path());
    (dir, root)
}
