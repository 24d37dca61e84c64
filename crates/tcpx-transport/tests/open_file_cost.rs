//! The socket backend's answer to "what does a comm cost in open files" against the files a real
//! comm holds (counted in /proc/self/fd). Alone in its test binary, so no other test's sockets
//! are counted.

use std::time::{Duration, Instant};

use tcpx_transport::registry::{self, Backend, BackendConfig};
use tcpx_transport::socket::SocketConfig;

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn a_socket_comm_holds_no_more_files_than_its_capabilities_say() {
    let socks = 4u64;
    let cfg = BackendConfig::Socket(SocketConfig {
        socks: socks as usize,
        ..SocketConfig::default()
    });
    let t = registry::open(&cfg, None).unwrap();
    let per_comm = Backend::Socket
        .capabilities()
        .open_files
        .per_comm(socks)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = open_files();
    let mut listener = t.listen().unwrap();
    let handle = listener.handle();
    let t2 = t.clone();
    let sender = std::thread::spawn(move || t2.connect(&handle, deadline));
    let recv = listener.accept(deadline).unwrap();
    let send = sender.join().unwrap().unwrap();
    // Both ends of one comm in this process, the listener still open: the most it holds.
    let held = open_files() - before;
    assert!(
        held <= 2 * per_comm,
        "one comm of {socks} sockets, both ends, holds {held} files; the capability says at most {} ({per_comm} a side)",
        2 * per_comm
    );
    assert!(held >= 2 * socks, "{held} files for {socks} sockets a side");
    drop((listener, recv, send));
}
