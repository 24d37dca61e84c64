//! The yardstick: a plain multi-stream TCP sender and receiver over loopback, with nothing of
//! this tool in between (no schedule, no control protocol, no verification). `cargo xtask bench`
//! runs it next to `tcpx-run bench` with the same number of sockets and the same message size.
//!
//! It does the same work as the benchmark: one message of `size` bytes sits in a sender buffer of
//! `size` bytes and lands in a receiver buffer of `size` bytes (DRAM-resident once `size` is past
//! the last-level cache, as the benchmark's are), cut into one contiguous slice per stream. Each
//! stream has its own sender thread (`write` of its slice) and receiver thread (`read` into the
//! same slice of the receiver buffer), at most `call` bytes per system call. Buffers are allocated and touched, connections made and
//! threads started before the clock starts; the clock stops when the last receiver has its bytes.
//! This is what `xtask/src/tcp_yardstick.c` does in plain C.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::Instant;

/// Result of one baseline run.
#[derive(Debug, Clone, Copy)]
pub struct BaselineResult {
    pub streams: usize,
    pub bytes: u64,
    pub secs: f64,
}

impl BaselineResult {
    /// GB/s (1e9 bytes/s).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / 1e9 / self.secs
    }
}

/// Sends a `size`-byte message `iters` times, cut evenly over `streams` TCP connections over
/// `bind` (a loopback address), each with a sender and a receiver thread moving at most `call`
/// bytes per `write`/`read` (0: a whole slice per call).
pub fn run(
    bind: &str,
    streams: usize,
    size: usize,
    iters: usize,
    call: usize,
) -> std::io::Result<BaselineResult> {
    if streams == 0 || size == 0 || iters == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "streams, size and iters must be >= 1",
        ));
    }
    crate::limits::check_baseline_memory(size as u64, crate::limits::mem_available())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let ip: std::net::IpAddr = bind.parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{}` is not an IP address", bind.escape_debug()),
        )
    })?;
    let listener = TcpListener::bind((ip, 0))?;
    let addr: SocketAddr = listener.local_addr()?;
    let per = size.div_ceil(streams);
    let call = if call == 0 { per } else { call };
    // Written through once, so every page is backed by its own memory before the clock starts.
    let tx = vec![0x5Au8; size];
    let mut rx = vec![0xA5u8; size];
    let mut pairs = Vec::new();
    for _ in 0..streams {
        let tx = TcpStream::connect(addr)?;
        let (rx, _) = listener.accept()?;
        tx.set_nodelay(true)?;
        rx.set_nodelay(true)?;
        pairs.push((tx, rx));
    }
    let start = Barrier::new(2 * streams + 1);
    let secs = std::thread::scope(|s| -> std::io::Result<f64> {
        let (mut senders, mut receivers) = (Vec::new(), Vec::new());
        for ((mut tx_sock, mut rx_sock), (src, dst)) in pairs
            .into_iter()
            .zip(tx.chunks(per).zip(rx.chunks_mut(per)))
        {
            let start = &start;
            senders.push(s.spawn(move || -> std::io::Result<()> {
                start.wait();
                for _ in 0..iters {
                    for part in src.chunks(call) {
                        tx_sock.write_all(part)?;
                    }
                }
                Ok(())
            }));
            receivers.push(s.spawn(move || -> std::io::Result<()> {
                start.wait();
                for _ in 0..iters {
                    for part in dst.chunks_mut(call) {
                        rx_sock.read_exact(part)?;
                    }
                }
                Ok(())
            }));
        }
        // `chunks` may give fewer slices than streams for tiny sizes: release the unused seats.
        for _ in senders.len()..streams {
            for _ in 0..2 {
                s.spawn(|| {
                    start.wait();
                });
            }
        }
        start.wait();
        let t0 = Instant::now();
        let mut result = Ok(());
        for h in receivers {
            let r = h
                .join()
                .map_err(|_| std::io::Error::other("baseline receiver thread panicked"))?;
            result = result.and(r);
        }
        let secs = t0.elapsed().as_secs_f64();
        for h in senders {
            let r = h
                .join()
                .map_err(|_| std::io::Error::other("baseline sender thread panicked"))?;
            result = result.and(r);
        }
        result.map(|()| secs)
    })?;
    Ok(BaselineResult {
        streams,
        bytes: (size * iters) as u64,
        secs,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn moves_the_bytes_it_claims() {
        let r = super::run("127.0.0.1", 3, 1 << 20, 4, 0).unwrap();
        assert_eq!(r.bytes, 4 << 20);
        let r = super::run("127.0.0.1", 2, 1 << 20, 2, 4096).unwrap();
        assert_eq!(r.bytes, 2 << 20);
        assert!(r.gbps() > 0.0);
        // More streams than bytes: the extra streams carry nothing and the run still ends.
        let r = super::run("127.0.0.1", 4, 2, 1, 1).unwrap();
        assert_eq!(r.bytes, 2);
        assert!(super::run("127.0.0.1", 0, 1, 1, 0).is_err());
    }
}
