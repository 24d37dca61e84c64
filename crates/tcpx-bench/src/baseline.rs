//! The yardstick: a plain multi-stream TCP sender and receiver over loopback, with nothing of
//! this tool in between (no schedule, no control protocol, no verification). `cargo xtask bench`
//! runs it next to `tcpx-run bench` with the same number of sockets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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

/// Sends `iters` messages of `size` bytes, each cut evenly over `streams` TCP connections, from
/// one set of threads to another over `bind` (a loopback address). Timed from the first byte
/// written to the last byte read.
pub fn run(
    bind: &str,
    streams: usize,
    size: usize,
    iters: usize,
) -> std::io::Result<BaselineResult> {
    if streams == 0 || size == 0 || iters == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "streams, size and iters must be >= 1",
        ));
    }
    let listener = TcpListener::bind(format!("{bind}:0"))?;
    let addr: SocketAddr = listener.local_addr()?;
    let per = size.div_ceil(streams);
    let mut pairs = Vec::new();
    for _ in 0..streams {
        let tx = TcpStream::connect(addr)?;
        let (rx, _) = listener.accept()?;
        tx.set_nodelay(true)?;
        rx.set_nodelay(true)?;
        pairs.push((tx, rx));
    }
    let t0 = Instant::now();
    std::thread::scope(|s| -> std::io::Result<()> {
        let mut hs = Vec::new();
        for (mut tx, mut rx) in pairs {
            hs.push(s.spawn(move || -> std::io::Result<()> {
                let buf = vec![0x5Au8; per];
                for _ in 0..iters {
                    tx.write_all(&buf)?;
                }
                Ok(())
            }));
            hs.push(s.spawn(move || -> std::io::Result<()> {
                let mut buf = vec![0u8; per];
                for _ in 0..iters {
                    rx.read_exact(&mut buf)?;
                }
                Ok(())
            }));
        }
        for h in hs {
            h.join()
                .map_err(|_| std::io::Error::other("baseline thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(BaselineResult {
        streams,
        bytes: (per * streams * iters) as u64,
        secs: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn moves_the_bytes_it_claims() {
        let r = super::run("127.0.0.1", 3, 1 << 20, 4).unwrap();
        assert_eq!(r.bytes, 3 * (1u64 << 20).div_ceil(3) * 4);
        assert!(r.gbps() > 0.0);
        assert!(super::run("127.0.0.1", 0, 1, 1).is_err());
    }
}
