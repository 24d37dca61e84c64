//! Strangers on a socket-backend data listener (issue 27): one that connects and stays silent,
//! one that connects and closes, one that sends garbage. Each is dropped, and the real peer's
//! sockets are still accepted before the deadline. Real sockets on 127.0.0.0/8: the listener
//! gets an address of its own so that /proc/net/tcp names its port.

use std::io::Write;
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use tcpx_transport::socket::{SocketConfig, SocketTransport};
use tcpx_transport::Transport;

/// The port of the socket listening on `ip` (from /proc/net/tcp), if exactly one does.
fn listening_port(ip: [u8; 4]) -> Option<u16> {
    let want = format!("{:02X}{:02X}{:02X}{:02X}", ip[3], ip[2], ip[1], ip[0]);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = f.get(1)?.split_once(':')?;
            (addr == want && f.get(3) == Some(&"0A")).then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect();
    (ports.len() == 1).then(|| ports[0])
}

#[test]
fn strangers_on_a_data_listener_are_dropped_and_the_peer_still_gets_through() {
    let ip = [127, 77, 27, 1];
    let t = SocketTransport::new(SocketConfig {
        socks: 2,
        ..SocketConfig::default()
    })
    .unwrap();
    let mut listener = t.listen_on(IpAddr::from(ip)).unwrap();
    let port = listening_port(ip).expect("the listener on 127.77.27.1");
    let to = (IpAddr::from(ip), port);
    // Silent (held open through the test), closed at once, and garbage.
    let _silent = TcpStream::connect(to).unwrap();
    drop(TcpStream::connect(to).unwrap());
    let mut junk = TcpStream::connect(to).unwrap();
    junk.write_all(&[0xAB; 20]).unwrap();
    let handle = listener.handle();
    let deadline = Instant::now() + Duration::from_secs(30);
    let sender = std::thread::spawn(move || {
        let t = SocketTransport::new(SocketConfig {
            socks: 2,
            ..SocketConfig::default()
        })
        .unwrap();
        t.connect(&handle, deadline).map(|_| ())
    });
    let accepted = listener.accept(deadline);
    assert!(accepted.is_ok(), "{:?}", accepted.err());
    // Served within its deadline: a silent stray that held the listener until then would let
    // the peer in only from the backlog afterwards, long after a bench's other side gave up.
    assert!(
        Instant::now() < deadline,
        "the silent stray held the listener until its deadline"
    );
    sender.join().unwrap().unwrap();
}
