//! Fixture helpers: the trees live in tcpx-topo's tests/fixtures (one source for both crates);
//! tests that write get their own copy in a temporary directory.

#![allow(dead_code)]

use tcpx_affinity::{IrqPolicy, Spread};
use tcpx_topo::{derive, discover, Backend, BindingRule, SysRoot};

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

/// The A3-high policy: each NIC's TX IRQs on its TX cores, RX IRQs on its RX cores.
pub fn a3_policy(root: &SysRoot) -> IrqPolicy {
    let topo = discover(root, Backend::Sysfs).unwrap();
    let plan = derive(&topo, &BindingRule::default());
    IrqPolicy {
        tx: plan.tx_bindings,
        rx: plan.rx_bindings,
        spread: Spread::OnePerQueue,
    }
}
