//! What the fabric tests share: whether namespaces can be made here (and a visible skip where
//! not), a fabric spec with its own id and state directory and the guard that removes it, and
//! what the root namespace holds.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::collections::BTreeSet;

use tcpx_fabric::sys::{self, LinkEntry, Op};
use tcpx_fabric::Spec;

/// Why fabric tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    match sys::run(&Op::NetnsList) {
        Ok(_) => None,
        Err(e) => Some(format!("`ip netns` unavailable: {e}")),
    }
}

/// Skips the test visibly (`SKIP: <test>: <reason>` on the process's stderr, past libtest's
/// capture, where `cargo xtask ci` lists it) when namespaces cannot be made here.
macro_rules! require_netns {
    ($test:expr) => {
        if let Some(why) = common::skip_reason() {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "SKIP: {}: {why}", $test);
            return;
        }
    };
}

/// Removes the fabric (and its state directory) when the test ends, pass or fail.
pub struct Cleanup {
    pub id: String,
    pub dir: tempfile::TempDir,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = tcpx_fabric::down(&self.id, self.dir.path());
    }
}

/// A fabric of `nodes` nodes with `nics` NICs each at `rate` (`1gbit`, `200mbit`), as fabric
/// `id` in a state directory of its own, and the guard that removes it.
pub fn spec(id: &str, nodes: u32, nics: u32, rate: &str) -> (Spec, Cleanup) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spec::new(nics, rate.parse().unwrap());
    s.id = id.into();
    s.nodes = nodes;
    s.state_dir = dir.path().to_path_buf();
    (s, Cleanup { id: id.into(), dir })
}

/// The machine's network namespaces.
pub fn namespaces() -> BTreeSet<String> {
    let l: Vec<sys::NetnsEntry> = sys::query(&Op::NetnsList).unwrap();
    l.into_iter().map(|n| n.name).collect()
}

/// The links of the root namespace (this process's).
pub fn root_links() -> BTreeSet<String> {
    let l: Vec<LinkEntry> = sys::query(&Op::LinkShowHere).unwrap();
    l.into_iter().map(|n| n.ifname).collect()
}
