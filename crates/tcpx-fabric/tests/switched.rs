//! Fabrics of more than two nodes (a switch namespace with one bridge per NIC index) and faults
//! set on running fabrics, with real TCP and UDP sockets made inside the node namespaces (needs
//! root and `ip netns`; skipped visibly otherwise). Each test uses its own fabric id and state
//! directory, and a guard removes its fabric whatever happens.

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{namespaces, root_links, spec};
use tcpx_fabric::{
    Fabric, FabricError, FaultClass, FaultKind, Health, Layout, LossMethod, Node, PortStatus, Rate,
};

fn status_of(id: &str, dir: &Path) -> tcpx_fabric::FabricStatus {
    tcpx_fabric::status(dir)
        .unwrap()
        .into_iter()
        .find(|x| x.id == id)
        .unwrap_or_else(|| panic!("fabric {id} not listed"))
}

fn port(st: &tcpx_fabric::FabricStatus, node: Node, nic: u32) -> &PortStatus {
    st.ports
        .iter()
        .find(|p| p.node == node && p.name == format!("eth{}", nic + 1))
        .unwrap_or_else(|| panic!("no port {node} eth{}: {st:?}", nic + 1))
}

/// A TCP listener inside `node` on its NIC `k` address (an ephemeral port).
fn listen(f: &Fabric, node: Node, k: u32) -> TcpListener {
    let addr = SocketAddr::from((f.addrs(node)[k as usize], 0));
    f.run_in(node, || TcpListener::bind(addr))
        .unwrap()
        .unwrap_or_else(|e| panic!("listening in {node} on {addr}: {e}"))
}

/// A TCP connection from inside `node` to `to`, within `timeout`.
fn connect(
    f: &Fabric,
    node: Node,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    f.run_in(node, || TcpStream::connect_timeout(&to, timeout))
        .unwrap()
}

/// Bytes no two connections share: the pair, NIC and position are in every byte.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `len` bytes from `from`'s NIC `k` to `to`'s and back, each side checking what arrived, and
/// that the connection's local address is `from`'s NIC `k` (so it took that NIC's rail).
fn exchange(f: &Fabric, from: Node, to: Node, k: u32, len: usize) {
    let l = listen(f, to, k);
    let dest = l.local_addr().unwrap();
    let seed = (from.index() * 16 + to.index() * 4 + k) as u8;
    let server = std::thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = vec![0u8; len];
        s.read_exact(&mut got).unwrap();
        assert!(
            got == pattern(seed, len),
            "bytes differ at {dest} from {peer}"
        );
        s.write_all(&pattern(seed.wrapping_add(1), len)).unwrap();
        peer
    });
    let mut c = connect(f, from, dest, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{from} eth{} to {dest}: {e}", k + 1));
    assert_eq!(
        c.local_addr().unwrap().ip(),
        f.addrs(from)[k as usize],
        "{from} to {dest} left by another NIC"
    );
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(&pattern(seed, len)).unwrap();
    let mut back = vec![0u8; len];
    c.read_exact(&mut back).unwrap();
    assert!(
        back == pattern(seed.wrapping_add(1), len),
        "reply bytes differ"
    );
    let peer = server.join().unwrap();
    assert_eq!(peer.ip(), f.addrs(from)[k as usize]);
}

/// GB/s of one `len`-byte transfer from `from` to `to` over NIC `k` (sender's clock, from the
/// first byte written until the receiver has acknowledged every byte).
fn transfer_gbs(f: &Fabric, from: Node, to: Node, k: u32, len: usize) -> f64 {
    let l = listen(f, to, k);
    let dest = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0;
        while n < len {
            let r = s.read(&mut buf).unwrap();
            assert!(r > 0, "connection closed after {n} of {len} bytes");
            n += r;
        }
        s.write_all(b"k").unwrap();
    });
    let mut c = connect(f, from, dest, Duration::from_secs(5)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let chunk = vec![7u8; 1 << 16];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        c.write_all(&chunk[..n]).unwrap();
        sent += n;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    server.join().unwrap();
    len as f64 / secs / 1e9
}

#[test]
fn four_nodes_reach_each_other_on_every_nic_and_down_leaves_nothing() {
    require_netns!("four_nodes_reach_each_other_on_every_nic_and_down_leaves_nothing");
    let links = root_links();
    let (s, c) = spec("t-sw4", 4, 2, "1gbit");
    let f = Fabric::up(&s).unwrap();
    assert_eq!(f.layout(), Layout::Switched);
    assert_eq!(f.node_count(), 4);
    let names: Vec<String> = f.state.namespaces();
    assert_eq!(
        names,
        [
            "tcpx-a-t-sw4",
            "tcpx-b-t-sw4",
            "tcpx-c-t-sw4",
            "tcpx-d-t-sw4",
            "tcpx-sw-t-sw4"
        ]
    );
    assert!(names.iter().all(|n| namespaces().contains(n)));
    assert_eq!(root_links(), links, "the root namespace changed");
    assert_eq!(
        f.addrs(Node::new(3).unwrap()),
        [Ipv4Addr::new(10, 231, 0, 4), Ipv4Addr::new(10, 231, 1, 4)]
    );

    let st = status_of("t-sw4", c.dir.path());
    assert_eq!(st.health, Health::Up, "{st:?}");
    assert!(st.links_checked && st.nics.is_empty());
    assert_eq!(st.ports.len(), 8);
    for p in &st.ports {
        assert!(p.up, "{p:?}");
        assert_eq!(p.rate_out, Some(Rate::gbit(1)), "{p:?}");
        assert_eq!(p.rate_in, Some(Rate::gbit(1)), "{p:?}");
    }

    // Every pair, every NIC, bytes both ways.
    let nodes = f.nodes();
    for (i, &a) in nodes.iter().enumerate() {
        for &b in &nodes[i + 1..] {
            for k in 0..2 {
                exchange(&f, a, b, k, 64 * 1024);
            }
        }
    }
    // The rails are separate: node A's eth1 address is not reachable over rail 2 (the kernel
    // routes it by eth1, never eth2).
    let out = f
        .command_in(Node::new(2).unwrap(), "ip")
        .args(["-j", "route", "get", "10.231.1.1"])
        .output()
        .unwrap();
    let routes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(routes[0]["dev"], "eth2");

    // Damage found: a rail's bridge removed behind the fabric's back makes it stale, naming it.
    let gone = std::process::Command::new("ip")
        .args(["-n", "tcpx-sw-t-sw4", "link", "del", "br2"])
        .status()
        .unwrap();
    assert!(gone.success());
    match status_of("t-sw4", c.dir.path()).health {
        Health::Stale { why } => {
            assert!(
                why.contains(&"bridge br2 is missing in tcpx-sw-t-sw4".to_string()),
                "{why:?}"
            )
        }
        h => panic!("{h:?}"),
    }

    let r = f.down().unwrap();
    assert_eq!(r.namespaces_removed, names);
    let left = namespaces();
    assert!(
        names.iter().all(|n| !left.contains(n)),
        "namespaces left: {left:?}"
    );
    assert_eq!(root_links(), links);
    assert!(!c.dir.path().join("t-sw4.json").exists());
    assert!(tcpx_fabric::status(c.dir.path())
        .unwrap()
        .iter()
        .all(|x| x.id != "t-sw4"));
}

#[test]
fn a_capped_nic_measures_lower_and_status_shows_the_cap_until_cleared() {
    require_netns!("a_capped_nic_measures_lower_and_status_shows_the_cap_until_cleared");
    let (s, c) = spec("t-cap", 4, 2, "200mbit");
    let mut f = Fabric::up(&s).unwrap();
    let (b, cn) = (Node::B, Node::new(2).unwrap());
    let fault = f
        .set_fault(b, 1, FaultKind::Cap("50mbit".parse().unwrap()))
        .unwrap();
    assert_eq!(fault.to_string(), "node B eth2 capped at 50mbit");
    let st = status_of("t-cap", c.dir.path());
    assert_eq!(st.health, Health::Up, "{st:?}");
    assert_eq!(
        st.state.as_ref().unwrap().faults,
        std::slice::from_ref(&fault)
    );
    let slow: Rate = "50mbit".parse().unwrap();
    assert_eq!(port(&st, b, 1).rate_out, Some(slow));
    assert_eq!(port(&st, b, 1).rate_in, Some(slow));
    assert_eq!(port(&st, b, 0).rate_in, Some("200mbit".parse().unwrap()));
    assert_eq!(port(&st, cn, 1).rate_out, Some("200mbit".parse().unwrap()));

    // 2 MB from node C to node B over each NIC, one after the other: at 200 vs 50 Mbit/s the
    // capped NIC takes about 4 times as long; a ratio above 2 is asked for, so a loaded machine
    // slowing the fast NIC down to half its cap still passes.
    let fast_gbs = transfer_gbs(&f, cn, b, 0, 2_000_000);
    let slow_gbs = transfer_gbs(&f, cn, b, 1, 2_000_000);
    eprintln!("node C to node B: eth1 {fast_gbs:.4} GB/s, capped eth2 {slow_gbs:.4} GB/s");
    assert!(
        slow_gbs <= slow.gbs() * 1.25,
        "the 50mbit NIC moved {slow_gbs:.4} GB/s"
    );
    assert!(
        fast_gbs / slow_gbs > 2.0,
        "eth1 {fast_gbs:.4} GB/s vs capped eth2 {slow_gbs:.4} GB/s"
    );

    let cleared = f.clear_fault(b, 1, FaultClass::Cap).unwrap();
    assert_eq!(cleared, [fault]);
    let st = status_of("t-cap", c.dir.path());
    assert_eq!(st.health, Health::Up, "{st:?}");
    assert!(st.state.as_ref().unwrap().faults.is_empty());
    assert_eq!(port(&st, b, 1).rate_in, Some("200mbit".parse().unwrap()));
    // Nothing left to clear; a NIC the fabric lacks is refused with what it has.
    assert!(f.clear_fault(b, 1, FaultClass::Cap).unwrap().is_empty());
    let e = f
        .set_fault(Node::new(4).unwrap(), 0, FaultKind::Down)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("has no node E eth1: it has 4 nodes (a to d) and 2 NIC(s) each"),
        "{e}"
    );
}

#[test]
fn a_loss_fault_drops_packets_that_its_counters_count_by_every_method_here() {
    require_netns!("a_loss_fault_drops_packets_that_its_counters_count_by_every_method_here");
    let methods = tcpx_fabric::loss_methods();
    if methods.is_empty() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIP: a_loss_fault_drops_packets_that_its_counters_count_by_every_method_here: neither sch_netem nor nft nor iptables here"
        );
        return;
    }
    let (s, c) = spec("t-loss", 4, 2, "1gbit");
    let mut f = Fabric::up(&s).unwrap();
    // What set_fault picks: the first method offered.
    let auto = f
        .set_fault(
            Node::new(2).unwrap(),
            1,
            FaultKind::Loss("1%".parse().unwrap()),
        )
        .unwrap();
    assert_eq!(auto.method, Some(methods[0]));
    for m in &methods {
        eprintln!("loss by {m}");
        loss_is_counted(&mut f, c.dir.path(), *m);
    }
    let missing: Vec<LossMethod> = [
        LossMethod::Netem,
        LossMethod::Nftables,
        LossMethod::Iptables,
    ]
    .into_iter()
    .filter(|m| !methods.contains(m))
    .collect();
    for m in missing {
        let e = f
            .set_loss_using(Node::A, 0, "5%".parse().unwrap(), m)
            .unwrap_err();
        assert!(e.to_string().contains("is not possible here"), "{e}");
    }
    f.down().unwrap();
}

/// 40% loss on node C's eth1 by `method`: datagrams from node C to node A over eth1 are dropped,
/// the fault's counters count them, and once cleared every datagram arrives.
fn loss_is_counted(f: &mut Fabric, dir: &Path, method: LossMethod) {
    let (a, cn) = (Node::A, Node::new(2).unwrap());
    let rx_addr = SocketAddr::from((f.addrs(a)[0], 0));
    let tx_addr = SocketAddr::from((f.addrs(cn)[0], 0));
    let rx = f.run_in(a, || UdpSocket::bind(rx_addr)).unwrap().unwrap();
    let tx = f.run_in(cn, || UdpSocket::bind(tx_addr)).unwrap().unwrap();
    let to = rx.local_addr().unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    // One datagram before the fault: node C knows node A's MAC address from here on, so no
    // address resolution is in the way of what is counted.
    tx.send_to(b"hello", to).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(rx.recv_from(&mut buf).unwrap().0, 5);

    let fault = f
        .set_loss_using(cn, 0, "40%".parse().unwrap(), method)
        .unwrap();
    assert_eq!(fault.method, Some(method));
    let st = status_of("t-loss", dir);
    assert_eq!(st.health, Health::Up, "{st:?}");
    assert!(st.state.unwrap().faults.contains(&fault));

    // 100 datagrams at 40% loss: no drop at all has a chance of 0.6^100.
    const SENT: u64 = 100;
    let mut refused = 0;
    for i in 0..SENT {
        match tx.send_to(&i.to_be_bytes(), to) {
            Ok(_) => {}
            // A netfilter drop on output: the kernel says so to the sender.
            Err(e) if e.kind() == ErrorKind::PermissionDenied => refused += 1,
            Err(e) => panic!("send {i}: {e}"),
        }
    }
    let drops = f.loss_drops(cn, 0).unwrap();
    assert!(drops > 0, "{method}: no drop counted");
    assert!(drops < SENT, "{method}: everything dropped ({drops})");
    // Receive until all that was not dropped arrived (or the deadline says it will not).
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (got.len() as u64) + drops < SENT && Instant::now() < deadline {
        match rx.recv_from(&mut buf) {
            Ok((8, _)) => {
                got.insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
            }
            Ok((n, _)) => panic!("a datagram of {n} bytes"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let got = got.len() as u64;
    assert!(got < SENT, "{method}: nothing was lost");
    if method == LossMethod::Netem {
        // netem counts what it dropped on both ends (an ARP probe too, now and then).
        assert!(got + drops >= SENT, "{got} arrived, {drops} dropped");
    } else {
        // Exact: every dropped datagram was refused to the sender and counted by the rule
        // (IPv4 only, so no IPv6 neighbour discovery is counted).
        assert_eq!(refused, drops, "{method}");
        assert_eq!(got + drops, SENT, "{method}");
    }

    let cleared = f.clear_fault(cn, 0, FaultClass::Loss).unwrap();
    assert_eq!(cleared, [fault]);
    assert_eq!(f.loss_drops(cn, 0).unwrap(), 0);
    assert_eq!(status_of("t-loss", dir).health, Health::Up);
    for i in 0..20u64 {
        tx.send_to(&i.to_be_bytes(), to).unwrap();
        let (n, _) = rx.recv_from(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            i.to_be_bytes(),
            "{method}: datagram {i} after the loss was cleared"
        );
    }
}

#[test]
fn a_nic_taken_down_refuses_connections_while_the_others_work() {
    require_netns!("a_nic_taken_down_refuses_connections_while_the_others_work");
    let (s, c) = spec("t-nicdown", 4, 2, "1gbit");
    let mut f = Fabric::up(&s).unwrap();
    let (a, d) = (Node::A, Node::new(3).unwrap());
    let fault = f.set_fault(d, 1, FaultKind::Down).unwrap();
    assert_eq!(fault.to_string(), "node D eth2 down");
    let st = status_of("t-nicdown", c.dir.path());
    assert_eq!(
        st.health,
        Health::Up,
        "a recorded fault is not damage: {st:?}"
    );
    assert!(!port(&st, d, 1).up);
    assert!(port(&st, d, 0).up && port(&st, a, 1).up);

    // Into node D over eth2: nobody answers node A's address resolution on that rail, so the
    // kernel gives up (3 probes, 1 s apart) and says the host is unreachable. Waited for to the
    // end: a resolution still under way when the NIC comes back would fail the next connect too.
    let l = listen(&f, d, 0);
    let on_eth2 = SocketAddr::from((f.addrs(d)[1], l.local_addr().unwrap().port()));
    let e = connect(&f, a, on_eth2, Duration::from_secs(20)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::HostUnreachable, "{e:?}");
    // Out of node D over eth2: no route at all while the NIC is down.
    let la = listen(&f, a, 1);
    let e = connect(&f, d, la.local_addr().unwrap(), Duration::from_secs(2)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NetworkUnreachable, "{e:?}");
    // eth1 of node D, and eth2 between the other nodes, still carry bytes.
    exchange(&f, a, d, 0, 64 * 1024);
    exchange(&f, a, Node::B, 1, 64 * 1024);

    // Up again: eth2 of node D carries bytes once more.
    assert_eq!(f.clear_fault(d, 1, FaultClass::Down).unwrap(), [fault]);
    let st = status_of("t-nicdown", c.dir.path());
    assert_eq!(st.health, Health::Up, "{st:?}");
    assert!(port(&st, d, 1).up);
    exchange(&f, a, d, 1, 64 * 1024);
    f.down().unwrap();
}

#[test]
fn faults_on_a_two_node_fabric_shape_the_shared_pair() {
    require_netns!("faults_on_a_two_node_fabric_shape_the_shared_pair");
    let (s, c) = spec("t-pairfault", 2, 2, "1gbit");
    let mut f = Fabric::up(&s).unwrap();
    assert_eq!(f.layout(), Layout::Pairs);
    assert!(f.state.switch_ns.is_none());
    f.set_fault(Node::B, 0, FaultKind::Cap("100mbit".parse().unwrap()))
        .unwrap();
    f.set_fault(Node::A, 1, FaultKind::Down).unwrap();
    let st = status_of("t-pairfault", c.dir.path());
    assert_eq!(st.health, Health::Up, "{st:?}");
    // Node B's eth1 is the other end of node A's eth1: both directions are capped.
    let slow = Some("100mbit".parse().unwrap());
    assert_eq!(st.nics[0].rate_a_to_b, slow);
    assert_eq!(st.nics[0].rate_b_to_a, slow);
    assert_eq!(st.nics[1].rate_a_to_b, Some(Rate::gbit(1)));
    let e = connect(
        &f,
        Node::B,
        SocketAddr::from((f.addrs(Node::A)[1], 9)),
        Duration::from_secs(2),
    )
    .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::HostUnreachable),
        "{e:?}"
    );
    exchange(&f, Node::A, Node::B, 0, 16 * 1024);
    // A state file names its faults, so `down` of a faulty fabric removes everything.
    let r = tcpx_fabric::down("t-pairfault", c.dir.path()).unwrap();
    assert_eq!(r.namespaces_removed.len(), 2);
    assert!(!namespaces().contains("tcpx-a-t-pairfault"));
}

#[test]
fn an_interrupted_four_node_up_removes_the_switch_too() {
    require_netns!("an_interrupted_four_node_up_removes_the_switch_too");
    let (s, c) = spec("t-swcancel", 4, 2, "1gbit");
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let mut on_step = |st: tcpx_fabric::Step| {
        if st == tcpx_fabric::Step::NicReady(0) {
            assert!(namespaces().contains("tcpx-sw-t-swcancel"));
            cancel.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let r = Fabric::up_with(
        &s,
        tcpx_fabric::UpOptions {
            cancel: Some(&cancel),
            on_step: Some(&mut on_step),
        },
    );
    assert_eq!(r.unwrap_err(), FabricError::Cancelled);
    let ns = namespaces();
    assert!(
        ns.iter().all(|n| !n.ends_with("-t-swcancel")),
        "left: {ns:?}"
    );
    assert!(!c.dir.path().join("t-swcancel.json").exists());
}
