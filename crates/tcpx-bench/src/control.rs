//! The control connection: length-prefixed JSON messages with a deadline on every read.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::proto::Msg;

/// Largest control message accepted (handles and timings are small).
const MAX_FRAME: usize = 16 << 20;

pub(crate) struct Control {
    stream: TcpStream,
    pub peer: String,
    /// This side's address of the connection (where the peer reached us).
    pub local: Option<std::net::IpAddr>,
}

impl Control {
    pub fn new(stream: TcpStream, timeout: Duration) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into());
        let local = stream.local_addr().ok().map(|a| a.ip());
        Ok(Control {
            stream,
            peer,
            local,
        })
    }

    /// The read and write timeout from now on.
    pub fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream.set_write_timeout(Some(timeout))
    }

    /// The read timeout from now on (writes keep theirs).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))
    }

    /// Whether the peer has sent something (`Ok(true)`: a message, or the end of the stream, is
    /// ready for [`Control::recv`]), without waiting.
    pub fn readable_now(&mut self) -> std::io::Result<bool> {
        self.stream.set_nonblocking(true)?;
        let peeked = self.stream.peek(&mut [0u8; 1]);
        self.stream.set_nonblocking(false)?;
        match peeked {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
            // A reset or another error: `recv` reports it.
            Err(_) => Ok(true),
        }
    }

    pub fn send(&mut self, msg: &Msg) -> std::io::Result<()> {
        let body = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame)
    }

    pub fn recv(&mut self) -> std::io::Result<Msg> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("control message of {len} bytes: the peer does not speak this protocol"),
            ));
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        // serde's error quotes the peer's text (an unknown message name), which may be a
        // stranger's: cut and escaped.
        serde_json::from_slice(&body).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "unreadable control message ({}): is the peer another tcpx-run version?",
                    crate::shown(&e.to_string(), 160)
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stranger's unknown message name, which serde's error quotes, reaches the error cut and
    /// with its escape sequences escaped.
    #[test]
    fn a_strangers_message_name_in_the_error_is_escaped_and_cut() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut b = Control::new(l.accept().unwrap().0, Duration::from_secs(30)).unwrap();
        // JSON escapes, so the decoded name holds ESC and BEL.
        let body = format!(r#"{{"msg":"\u001b]0;owned\u0007{}"}}"#, "z".repeat(100_000));
        a.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        a.write_all(body.as_bytes()).unwrap();
        let e = b.recv().unwrap_err().to_string();
        assert!(e.starts_with("unreadable control message"), "{e}");
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.len() < 400, "{} bytes", e.len());
        assert_eq!(crate::shown("a\u{1b}b", 10), "a\\u{1b}b");
        assert_eq!(crate::shown("abcdef", 3), "abc...");
    }
}
