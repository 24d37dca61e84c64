//! The socket option that no safe crate offers: `SO_ZEROCOPY`, which lets a socket's sends
//! flagged `MSG_ZEROCOPY` lend their pages to the kernel instead of copying them (Linux 4.14 and
//! later). Sending and reading the completions back are safe calls (nix); only setting the option
//! is here.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `SO_ZEROCOPY` from the Linux UAPI (`asm-generic/socket.h`; the same on x86 and arm).
pub const SO_ZEROCOPY: libc::c_int = 60;
/// `sock_extended_err.ee_origin` of a zero-copy completion (`linux/errqueue.h`).
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `sock_extended_err.ee_code` bit: the kernel copied the data after all (always over loopback).
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// Turns `SO_ZEROCOPY` on for `sock`. Fails with the kernel's error (`ENOPROTOOPT` before 4.14).
pub fn enable_zero_copy(sock: &impl AsFd) -> io::Result<()> {
    set_int(sock, SO_ZEROCOPY, 1)
}

/// Sets a `SOL_SOCKET` option that takes an `int`.
fn set_int(sock: &impl AsFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    let on: libc::c_int = value;
    // SAFETY: the descriptor is open for the duration of the borrow; `optval` points to a live
    // `c_int` and `optlen` is its size, as setsockopt(2) requires for an int option.
    let r = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP socket takes the option (every kernel this project runs on has it); a descriptor
    /// that is no socket is refused with the kernel's error, not a crash.
    #[test]
    fn tcp_sockets_take_zero_copy_and_other_descriptors_are_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        enable_zero_copy(&stream).unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let e = enable_zero_copy(&file).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK), "{e}");
    }
}
