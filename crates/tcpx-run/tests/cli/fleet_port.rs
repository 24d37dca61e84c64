//! Strangers on the fleet leader's port (issue 43 item 7): 70 slow connections filled the
//! port's 66 places and the real node was dropped ("the connection was closed") and never tried
//! again. Now a connection that has not said hello gives way to a newcomer, one that has is never
//! closed for room, a node turned away because every place is taken by connections that have
//! greeted is told why and tries again within its join deadline. Real processes on loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::{bin, output_within, text};
use tcpx_fleet::proto::{FleetMsg, FLEET_PROTOCOL};

/// Small pair runs so the whole matrix takes seconds.
const BENCH: &[&str] = &[
    "--size",
    "256K",
    "--iters",
    "3",
    "--warmup",
    "1",
    "--channels",
    "1",
    "--socks-per-channel",
    "1",
    "--timeout",
    "10",
];

/// Connections the leader of a two-node fleet holds on its port (2 nodes + 64 spare).
const PLACES: usize = 66;

use super::fleet::Lines;

/// A two-node fleet's leader on 127.0.0.11 writing into `out`: the process, its stderr and the
/// address it waits for the node on.
fn leader(out: &Path) -> (Child, Lines, String) {
    let mut child = Command::new(bin())
        .args(["fleet", "--rank", "0", "--nodes", "2"])
        .args(["--listen", "127.0.0.11:0", "--nics", "127.0.0.11"])
        .args(["--reps", "1", "--join-timeout", "60", "--out"])
        .arg(out)
        .args(BENCH)
        .env_remove("TCPX_RUN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::new(&mut child);
    let addr = lines.until(|l| {
        l.strip_prefix("tcpx-run fleet: leading ")
            .and_then(|l| l.split("waiting for them on ").nth(1))
            .map(str::to_string)
    });
    (child, lines, addr)
}

/// Rank 1 of the fleet led at `addr`, on 127.0.0.12.
fn node(addr: &str) -> Child {
    Command::new(bin())
        .args(["fleet", "--rank", "1", "--nodes", "2", "--leader", addr])
        .args(["--nics", "127.0.0.12", "--join-timeout", "60"])
        .args(BENCH)
        .env_remove("TCPX_RUN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The leader ended with 0 or 1 (loopback on a busy machine may name something) and its matrix
/// is complete; the node ended 0. Returns the node's stderr.
#[track_caller]
fn both_finished(lead: Child, lines: Lines, node: Child, out: &Path) -> String {
    let node =
        output_within(node, Duration::from_secs(120)).unwrap_or_else(|o| panic!("{}", text(&o)));
    let lead =
        output_within(lead, Duration::from_secs(120)).unwrap_or_else(|o| panic!("{}", text(&o)));
    let said = lines.rest();
    assert!(
        node.status.success(),
        "the node: {}\nthe leader:\n{said}",
        text(&node)
    );
    assert!(
        matches!(lead.status.code(), Some(0 | 1)),
        "{}\n{said}",
        text(&lead)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("matrix.json")).unwrap()).unwrap();
    assert_eq!(doc["end"]["complete"], true, "{said}");
    assert!(
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "ok"),
        "{doc}\n{said}"
    );
    String::from_utf8_lossy(&node.stderr).into_owned()
}

/// 70 connections, half silent and half a byte into a hello, take the leader's places before the
/// node connects: the leader closes the oldest of them to make room, and the node joins and
/// the whole matrix is measured.
#[test]
fn seventy_slow_strangers_on_the_fleet_port_do_not_keep_the_node_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fleet");
    let (lead, mut lines, addr) = leader(&out);
    let strangers: Vec<TcpStream> = (0..70)
        .map(|i| {
            let mut s = TcpStream::connect(&addr).unwrap();
            if i % 2 == 1 {
                s.write_all(b"{").unwrap();
            }
            s
        })
        .collect();
    // Every stranger beyond the places has taken one of an older stranger's.
    for _ in PLACES..strangers.len() {
        lines.until(|l| l.contains("to make room").then_some(()));
    }
    let node = node(&addr);
    both_finished(lead, lines, node, &out);
    drop(strangers);
}

/// A stranger's whole hello as rank 1 of a two-node fleet (it never proves the token).
fn stranger_hello() -> Vec<u8> {
    let mut line = serde_json::to_vec(&FleetMsg::Hello {
        protocol: FLEET_PROTOCOL,
        version: "stranger".into(),
        rank: 1,
        nodes: 2,
        host: "stranger".into(),
        nics: vec![],
        addrs: vec![],
        nonce: tcpx_link::auth::nonce().unwrap(),
    })
    .unwrap();
    line.push(b'\n');
    line
}

/// Every place is taken by a connection that has said hello: none is closed for the node, which
/// is told the port is full and tries again; once the strangers leave, it joins.
#[test]
fn a_node_turned_away_from_a_full_port_is_told_why_and_tries_again() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fleet");
    let (lead, mut lines, addr) = leader(&out);
    let strangers: Vec<TcpStream> = (0..PLACES)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(&stranger_hello()).unwrap();
            s
        })
        .collect();
    // The leader's welcome on each: every stranger has its place and has said hello.
    for s in &strangers {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut first = [0u8; 1];
        assert_eq!((&*s).read(&mut first).unwrap(), 1, "no welcome");
    }
    let node = node(&addr);
    lines.until(|l| {
        (l.contains("refused a connection from") && l.contains("the leader's port is full"))
            .then_some(())
    });
    // No stranger that had said hello was closed for the node.
    assert!(!lines.seen.contains("to make room"), "{}", lines.seen);
    drop(strangers);
    let said = both_finished(lead, lines, node, &out);
    assert!(
        said.contains("the leader's port is full") && said.contains("trying again"),
        "{said}"
    );
}
