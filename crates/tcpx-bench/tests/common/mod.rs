//! What tcpx-bench's in-process experiment tests share: a loopback address to bind and the
//! shape of a small experiment.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::net::SocketAddr;

use tcpx_bench::Experiment;

/// 127.0.0.1 on a port the system picks.
pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two flows of 2 channels x 2 sockets, 256 KiB chunks, a window of 4, 3 timed iterations after
/// 1 warm-up and a 10 s timeout; each test sets its sizes and what else it varies.
pub fn two_flows(name: &str) -> Experiment {
    Experiment {
        name: name.into(),
        iters: 3,
        warmup: 1,
        flows: 2,
        channels: 2,
        socks_per_channel: 2,
        chunk: Some(256 << 10),
        window: Some(4),
        timeout_s: 10.0,
        ..Experiment::default()
    }
}
