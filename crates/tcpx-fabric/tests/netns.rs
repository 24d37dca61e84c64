//! Real fabrics in real network namespaces (needs root and `ip netns`; skipped visibly otherwise).
//! Each test uses its own fabric id and state directory, so they run in parallel, and a guard
//! removes its fabric whatever happens.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::{namespaces, root_links, Cleanup};
use tcpx_fabric::sys::{self, Op, QdiscEntry};
use tcpx_fabric::{Fabric, FabricError, Health, Node, Phase, Rate, Spec, Step, UpOptions};

/// A two-node fabric with `nics` NICs at 2 Gbit/s.
fn spec(id: &str, nics: u32) -> (Spec, Cleanup) {
    common::spec(id, 2, nics, "2gbit")
}

fn root_qdiscs() -> BTreeSet<String> {
    let l: Vec<QdiscEntry> = sys::query(&Op::QdiscShowHere).unwrap();
    l.into_iter()
        .map(|q| {
            format!(
                "{}:{}:{}",
                q.dev.unwrap_or_default(),
                q.kind,
                q.handle.unwrap_or_default()
            )
        })
        .collect()
}

/// The health of fabric `id` (status lists every fabric on the machine, other tests' too).
fn health_of(id: &str, dir: &Path) -> Option<Health> {
    tcpx_fabric::status(dir)
        .unwrap()
        .into_iter()
        .find(|x| x.id == id)
        .map(|x| x.health)
}

fn assert_nothing_of(id: &str, dir: &Path, links: &BTreeSet<String>, qdiscs: &BTreeSet<String>) {
    let ns = namespaces();
    assert!(
        !ns.contains(&format!("tcpx-a-{id}")) && !ns.contains(&format!("tcpx-b-{id}")),
        "namespaces left: {ns:?}"
    );
    assert!(
        root_links().is_subset(links),
        "links appeared in the root namespace: {:?}",
        root_links().difference(links).collect::<Vec<_>>()
    );
    assert!(
        root_qdiscs().is_subset(qdiscs),
        "qdiscs appeared in the root namespace: {:?}",
        root_qdiscs().difference(qdiscs).collect::<Vec<_>>()
    );
    assert!(!dir.join(format!("{id}.json")).exists(), "state file left");
}

#[test]
fn up_builds_capped_pairs_and_down_leaves_nothing() {
    require_netns!("up_builds_capped_pairs_and_down_leaves_nothing");
    let links = root_links();
    let qdiscs = root_qdiscs();
    let (s, c) = spec("t-updown", 3);
    let f = Fabric::up(&s).unwrap();
    assert_eq!(f.state.phase, Phase::Up);
    assert!(namespaces().contains("tcpx-a-t-updown"));
    // Nothing of the fabric is visible from the root namespace.
    assert_eq!(root_links(), links);

    let st = tcpx_fabric::status(c.dir.path()).unwrap();
    let me = st.iter().find(|x| x.id == "t-updown").unwrap();
    assert_eq!(me.health, Health::Up, "{me:?}");
    assert!(me.links_checked);
    assert_eq!(me.nics.len(), 3);
    for n in &me.nics {
        assert_eq!(n.rate_a_to_b, Some(Rate::gbit(2)));
        assert_eq!(n.rate_b_to_a, Some(Rate::gbit(2)));
    }

    // Each NIC's peer is reached over its own pair: inside node A, the kernel routes node A's
    // eth2 address to node B's eth2 address directly (no traffic is sent).
    let out = f
        .command_in(Node::A, "ip")
        .args(["-j", "route", "get", "10.231.1.2", "from", "10.231.1.1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let routes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(routes[0]["dev"], "eth2");

    // A second `up` is refused and names what exists; the fabric is untouched.
    match Fabric::up(&s) {
        Err(FabricError::Exists { what, .. }) => {
            assert!(what.contains("tcpx-a-t-updown"), "{what}");
            assert!(what.contains("state file"), "{what}");
        }
        other => panic!("second up: {other:?}"),
    }
    assert_eq!(health_of("t-updown", c.dir.path()), Some(Health::Up));

    let r = f.down().unwrap();
    assert_eq!(r.namespaces_removed.len(), 2);
    assert!(r.state_file_removed.is_some());
    assert_nothing_of("t-updown", c.dir.path(), &links, &qdiscs);
    assert_eq!(health_of("t-updown", c.dir.path()), None);
    // Down again: nothing to do, no error.
    assert!(!tcpx_fabric::down("t-updown", c.dir.path())
        .unwrap()
        .removed_anything());
}

#[test]
fn a_cancelled_up_removes_what_it_made() {
    require_netns!("a_cancelled_up_removes_what_it_made");
    let links = root_links();
    let qdiscs = root_qdiscs();
    let (s, c) = spec("t-cancel", 4);
    let cancel = AtomicBool::new(false);
    let mut seen = Vec::new();
    let mut on_step = |st: Step| {
        seen.push(st);
        if st == Step::NicReady(1) {
            // What a Ctrl-C mid-way does: the flag is checked after this step.
            cancel.store(true, std::sync::atomic::Ordering::SeqCst);
            assert!(namespaces().contains("tcpx-b-t-cancel"));
        }
    };
    let r = Fabric::up_with(
        &s,
        UpOptions {
            cancel: Some(&cancel),
            on_step: Some(&mut on_step),
        },
    );
    assert_eq!(r.unwrap_err(), FabricError::Cancelled);
    assert_eq!(
        seen,
        [
            Step::StateWritten,
            Step::NamespacesAdded,
            Step::NicReady(0),
            Step::NicReady(1)
        ]
    );
    assert_nothing_of("t-cancel", c.dir.path(), &links, &qdiscs);
}

#[test]
fn a_failing_step_removes_what_it_made() {
    require_netns!("a_failing_step_removes_what_it_made");
    let links = root_links();
    let qdiscs = root_qdiscs();
    let (s, c) = spec("t-fail", 2);
    // Make NIC 1's veth creation fail for real: a link named eth2 already sits in node B when
    // the fabric wants to put eth2's peer there.
    let mut on_step = |st: Step| {
        if st == Step::NamespacesAdded {
            let ok = std::process::Command::new("ip")
                .args([
                    "-n",
                    "tcpx-b-t-fail",
                    "link",
                    "add",
                    "eth2",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "other",
                ])
                .status()
                .unwrap();
            assert!(ok.success());
        }
    };
    let r = Fabric::up_with(
        &s,
        UpOptions {
            cancel: None,
            on_step: Some(&mut on_step),
        },
    );
    match r {
        Err(FabricError::ToolFailed { cmd, .. }) => assert!(cmd.contains("eth2"), "{cmd}"),
        other => panic!("expected the eth2 step to fail: {other:?}"),
    }
    assert_nothing_of("t-fail", c.dir.path(), &links, &qdiscs);
}

#[test]
fn namespaces_without_state_are_reported_stale_and_down_removes_them() {
    require_netns!("namespaces_without_state_are_reported_stale_and_down_removes_them");
    let (s, c) = spec("t-orphan", 1);
    // A fabric whose state file was lost: its namespaces exist, nothing describes them.
    let f = Fabric::up(&s).unwrap();
    std::fs::remove_file(c.dir.path().join("t-orphan.json")).unwrap();
    let stale = tcpx_fabric::stale(c.dir.path()).unwrap();
    let me = stale.iter().find(|x| x.id == "t-orphan").expect("reported");
    assert!(me.state.is_none());
    assert_eq!(me.namespaces_present.len(), 2);
    // Up refuses while the leftovers exist.
    assert!(matches!(Fabric::up(&s), Err(FabricError::Exists { .. })));
    let r = tcpx_fabric::down("t-orphan", c.dir.path()).unwrap();
    assert_eq!(r.namespaces_removed.len(), 2);
    assert!(!namespaces().contains(&f.ns(Node::A)));
    // A damaged fabric (node B's namespace removed behind its back) is stale too.
    let f = Fabric::up(&s).unwrap();
    sys::run(&Op::NetnsDel(f.ns(Node::B))).unwrap();
    match health_of("t-orphan", c.dir.path()).unwrap() {
        Health::Stale { why } => assert!(why[0].contains("tcpx-b-t-orphan"), "{why:?}"),
        h => panic!("{h:?}"),
    }
    f.down().unwrap();
}

#[test]
fn without_root_nothing_is_attempted() {
    // The check itself, for any uid (the CLI test drops privileges for real).
    assert_eq!(
        tcpx_fabric::check_root(1000),
        Err(FabricError::NotRoot { euid: 1000 })
    );
    assert!(tcpx_fabric::check_root(0).is_ok());
    assert!(FabricError::NotRoot { euid: 1000 }
        .to_string()
        .contains("need root"));
}

#[test]
fn a_delay_uses_netem_where_the_kernel_has_it_and_is_refused_where_not() {
    require_netns!("a_delay_uses_netem_where_the_kernel_has_it_and_is_refused_where_not");
    let (mut s, c) = spec("t-delay", 1);
    s.delay = Some("2ms".parse().unwrap());
    match Fabric::up(&s) {
        Ok(f) => {
            assert!(tcpx_fabric::netem_available());
            let st = tcpx_fabric::status(c.dir.path()).unwrap();
            let me = st.iter().find(|x| x.id == "t-delay").unwrap();
            assert_eq!(me.health, Health::Up, "{me:?}");
            assert!(me.nics[0].netem);
            assert_eq!(me.nics[0].rate_a_to_b, Some(Rate::gbit(2)));
            f.down().unwrap();
        }
        Err(e) => {
            assert_eq!(e, FabricError::NetemMissing);
            assert!(!tcpx_fabric::netem_available());
            eprintln!("this kernel has no sch_netem: checked that --delay is refused");
            assert!(!namespaces().contains("tcpx-a-t-delay"));
        }
    }
}
