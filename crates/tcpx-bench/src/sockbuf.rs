//! What the kernel grants for a `sock_buf`: SO_SNDBUF/SO_RCVBUF set on a probe TCP socket of this
//! process and read back with getsockopt, so a run shows the buffer it really had next to the one
//! asked for (Linux doubles the value for its bookkeeping and caps it at `net.core.wmem_max` /
//! `net.core.rmem_max`, silently).

use nix::sys::socket::{
    getsockopt, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType,
};

/// Asked-for and granted socket buffer sizes, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantedSockBuf {
    pub asked: u64,
    pub send: usize,
    pub recv: usize,
}

impl GrantedSockBuf {
    /// One line for a run's header.
    pub fn line(&self) -> String {
        format!(
            "sock-buf: asked {} B; the kernel granted send {} B, recv {} B (it doubles the value and caps it at net.core.wmem_max / rmem_max)",
            self.asked, self.send, self.recv
        )
    }
}

/// Sets `asked` as SO_SNDBUF and SO_RCVBUF on a fresh TCP socket and reads back what was granted.
/// `asked` must fit `setsockopt`'s int ([`crate::MAX_SOCK_BUF`]); larger values are refused.
pub fn probe_sock_buf(asked: u64) -> Result<GrantedSockBuf, String> {
    if asked == 0 || asked > crate::MAX_SOCK_BUF {
        return Err(format!(
            "sock-buf {asked} is outside 1..={}",
            crate::MAX_SOCK_BUF
        ));
    }
    let size = usize::try_from(asked).map_err(|_| format!("sock-buf {asked} does not fit"))?;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("opening a probe socket: {e}"))?;
    setsockopt(&fd, sockopt::SndBuf, &size).map_err(|e| format!("SO_SNDBUF {size}: {e}"))?;
    setsockopt(&fd, sockopt::RcvBuf, &size).map_err(|e| format!("SO_RCVBUF {size}: {e}"))?;
    let send = getsockopt(&fd, sockopt::SndBuf).map_err(|e| format!("reading SO_SNDBUF: {e}"))?;
    let recv = getsockopt(&fd, sockopt::RcvBuf).map_err(|e| format!("reading SO_RCVBUF: {e}"))?;
    Ok(GrantedSockBuf { asked, send, recv })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctl(name: &str) -> usize {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn the_granted_size_is_read_back_from_the_kernel() {
        let rmem_max = sysctl("rmem_max");
        let small = 16 * 1024;
        let g = probe_sock_buf(small as u64).unwrap();
        if small <= rmem_max {
            assert_eq!(g.recv, 2 * small, "{g:?}");
        }
        // Above the cap the kernel grants the cap (doubled), not what was asked.
        let big = rmem_max + (1 << 20);
        if big as u64 <= crate::MAX_SOCK_BUF {
            let g = probe_sock_buf(big as u64).unwrap();
            assert_eq!(g.recv, 2 * rmem_max, "{g:?}");
            assert!(g.line().contains(&format!("asked {big} B")));
        }
        assert!(probe_sock_buf(4 << 30).is_err());
        assert!(probe_sock_buf(0).is_err());
    }
}
