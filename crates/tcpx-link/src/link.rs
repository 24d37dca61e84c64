//! The leader/follower link: JSON lines over TCP ([`LinkMsg`]), one message per line, each
//! written in one piece so a reader that sees its first byte gets the rest at once.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tcpx_bench::Experiment;
use tcpx_model::{NotApplied, Outside};

/// Version of the leader/follower link; both ends must match. 2: multi-process experiments
/// (`Ready.port` is the first of one port per flow) and NIC plans in `Done`. 3: `Abort`, and
/// an early `Done` that the leader reads while its processes still run. 4: the run token proved
/// both ways in the greeting (`Hello.nonce`/`proof`/`run`, `Auth`; [`crate::auth`]). 5: typed
/// knobs: `Prepare.outside` (the knobs beyond the bench experiment) replaces the untyped
/// `Prepare.knobs` map, and `Ready.not_applied` is keyed by knob.
pub const LINK_PROTOCOL: u32 = 5;
/// Longest line either side reads from the link: a message is a few kilobytes, and a peer that
/// sends more without a newline is not one of ours.
pub const MAX_LINE: u64 = 1 << 20;
/// Port the leader listens on for its follower unless told otherwise.
pub const DEFAULT_PLAN_PORT: u16 = 5310;

/// One message on the link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum LinkMsg {
    /// The greeting. The follower sends its `nonce`; the leader answers with its own, the `run`
    /// it serves and its `proof` of the run token over both nonces and `run`.
    Hello {
        protocol: u32,
        version: String,
        host: String,
        #[serde(default)]
        nonce: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proof: Option<String>,
        #[serde(default)]
        run: String,
    },
    /// Follower to leader, after the leader's greeting: the follower's proof of the run token.
    Auth {
        proof: String,
    },
    /// Run the server side of `exp`; `outside` are the plan's knobs beyond the bench (NICs,
    /// binding, IRQ policy).
    Prepare {
        exp: Box<Experiment>,
        outside: Outside,
    },
    /// Listening for the bench client on `port`; knobs this side could not apply. For a
    /// multi-process experiment `port` is the first control port: flow `i`'s server child
    /// listens on `port + i`.
    Ready {
        port: u16,
        not_applied: NotApplied,
    },
    /// This side cannot run it (the leader records the experiment as failed).
    Refused {
        reason: String,
    },
    /// The server side finished (error text when it failed), with the NICs its channels used
    /// (`flow 0: eth1,eth2; ...`) when it named NICs.
    Done {
        error: Option<String>,
        #[serde(default)]
        nic_plan: Option<String>,
    },
    /// Leader to follower, during a multi-process experiment: the leader's processes failed,
    /// stop the server processes now rather than letting them wait for clients that will not
    /// come. The follower still answers with `Done`. One that arrives after the follower's
    /// `Done` (the two crossed) is ignored.
    Abort {
        reason: String,
    },
    Bye,
}

impl LinkMsg {
    /// The message's name, for logs (a stranger's content is never echoed).
    pub fn kind(&self) -> &'static str {
        match self {
            LinkMsg::Hello { .. } => "hello",
            LinkMsg::Auth { .. } => "auth",
            LinkMsg::Prepare { .. } => "prepare",
            LinkMsg::Ready { .. } => "ready",
            LinkMsg::Refused { .. } => "refused",
            LinkMsg::Done { .. } => "done",
            LinkMsg::Abort { .. } => "abort",
            LinkMsg::Bye => "bye",
        }
    }
}

/// Why a link read failed.
#[derive(Debug)]
pub enum LinkError {
    Closed,
    Timeout,
    Other(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Closed => write!(f, "the connection was closed"),
            LinkError::Timeout => write!(f, "nothing arrived in time"),
            LinkError::Other(e) => write!(f, "{e}"),
        }
    }
}

/// The leader/follower connection.
pub struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

impl Link {
    pub fn new(stream: TcpStream) -> std::io::Result<Link> {
        stream.set_nodelay(true)?;
        let peer = stream.peer_addr()?;
        let local = stream.local_addr()?;
        Ok(Link {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            peer,
            local,
        })
    }

    pub fn send(&mut self, m: &LinkMsg) -> Result<(), LinkError> {
        send_json_line(&mut self.writer, m)
    }

    /// Whether a message (or the end of the connection) is waiting, without blocking: then
    /// [`Link::recv`] returns at once, as a peer writes each message in one piece.
    pub fn readable(&mut self) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let stream = self.reader.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let waiting = match stream.peek(&mut byte) {
            // Data, or end of file (0): either way `recv` has something to say.
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        // The reader and writer share one open file: back to blocking for both.
        let _ = stream.set_nonblocking(false);
        waiting
    }

    /// The next message if one (or the end of the connection) is already waiting, else `None`
    /// at once: for checking the link between other work.
    pub fn try_recv(&mut self) -> Option<Result<LinkMsg, LinkError>> {
        // A peer writes each message in one piece, so the rest of a begun line is moments away.
        self.readable().then(|| self.recv(Duration::from_secs(5)))
    }

    /// Closes after what was sent has a chance to arrive: the peer may have written to us (its
    /// greeting) after our last read, and closing a socket with unread data resets it, which
    /// can discard our last message at the peer. Shuts down our direction, then drains the peer's
    /// (at most `wait` and 64 KiB) until it closes too.
    pub fn close_gently(self, wait: Duration) {
        drain_and_close(self.writer, wait);
    }

    pub fn recv(&mut self, wait: Duration) -> Result<LinkMsg, LinkError> {
        recv_json_line(&mut self.reader, Some(wait))
    }
}

/// Writes `m` as one JSON line, in one piece (a reader that sees its first byte gets the rest
/// at once), giving up after 30 s: the framing of this link and of the fleet's.
pub fn send_json_line<M: Serialize>(stream: &mut TcpStream, m: &M) -> Result<(), LinkError> {
    let mut line = serde_json::to_string(m).map_err(|e| LinkError::Other(e.to_string()))?;
    line.push('\n');
    stream
        .set_write_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| LinkError::Other(e.to_string()))?;
    stream
        .write_all(line.as_bytes())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted => LinkError::Closed,
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => LinkError::Timeout,
            _ => LinkError::Other(e.to_string()),
        })
}

/// The next JSON line from `reader` as a message; `wait` bounds it (`None`: until the
/// connection ends). A line is at most [`MAX_LINE`] bytes, and what a peer sent is shown in an
/// error only cut and escaped.
pub fn recv_json_line<M: DeserializeOwned>(
    reader: &mut BufReader<TcpStream>,
    wait: Option<Duration>,
) -> Result<M, LinkError> {
    reader
        .get_ref()
        .set_read_timeout(wait.map(|w| w.max(Duration::from_millis(1))))
        .map_err(|e| LinkError::Other(e.to_string()))?;
    let mut line = String::new();
    match std::io::Read::take(&mut *reader, MAX_LINE).read_line(&mut line) {
        Ok(0) => Err(LinkError::Closed),
        Ok(n) if n as u64 >= MAX_LINE && !line.ends_with('\n') => Err(LinkError::Other(format!(
            "a message longer than {MAX_LINE} bytes: the peer does not speak this protocol"
        ))),
        Ok(_) => serde_json::from_str(&line).map_err(|e| {
            // serde's error quotes the peer's text too (an unknown variant, say).
            LinkError::Other(format!(
                "unreadable message `{}`: {}",
                shown(line.trim(), 80),
                shown(&e.to_string(), 160)
            ))
        }),
        Err(e) => Err(match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => LinkError::Timeout,
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
                LinkError::Closed
            }
            _ => LinkError::Other(e.to_string()),
        }),
    }
}

/// Text a peer sent, cut and escaped for an error or a log line ([`tcpx_bench::shown`]): before
/// the peer has proved the run token it may be anyone's.
pub use tcpx_bench::shown;

/// [`Link::close_gently`] for a bare stream.
pub fn drain_and_close(stream: TcpStream, wait: Duration) {
    use std::io::Read;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    let mut left: usize = 64 * 1024;
    let mut s = &stream;
    while left > 0 {
        let Some(t) = deadline.checked_duration_since(Instant::now()) else {
            break;
        };
        if s.set_read_timeout(Some(t.max(Duration::from_millis(1))))
            .is_err()
        {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Connects to `addr`, retrying until `deadline` (the leader may start later).
pub fn connect_until(addr: &str, deadline: Instant) -> anyhow::Result<TcpStream> {
    let mut last = String::new();
    loop {
        match addr.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = format!("{a}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("resolving {addr}: {e}"),
        }
        if Instant::now() >= deadline {
            bail!("could not reach the leader at {addr} ({last}): is `tcpx-run plans/<plan>.rhai` running there, and is the port open?");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `HOST` or `HOST:PORT` -> `HOST:PORT`.
pub fn with_port(host: &str, port: u16) -> String {
    if host.parse::<SocketAddr>().is_ok() {
        return host.to_string();
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return SocketAddr::new(ip, port).to_string();
    }
    // A text with a colon names its port (or is malformed: `check_host_port` says how).
    if host.contains(':') {
        return host.to_string();
    }
    format!("{host}:{port}")
}

/// The plan port: the one `given`, else `env_value` (`TCPX_PLAN_PORT`, read by the caller), else
/// [`DEFAULT_PLAN_PORT`].
pub fn plan_port(given: Option<u16>, env_value: Option<&str>) -> u16 {
    given
        .or_else(|| env_value.and_then(|p| p.trim().parse().ok()))
        .unwrap_or(DEFAULT_PLAN_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Waits (at most 10 s, else fails saying `never`) until `link` is readable.
    fn until_readable(link: &mut Link, never: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !link.readable() {
            assert!(std::time::Instant::now() < deadline, "{never}");
            std::thread::yield_now();
        }
    }

    /// `readable` answers without blocking: nothing yet, a message waiting (left for `recv`),
    /// and the end of the connection.
    #[test]
    fn readable_tells_whether_recv_would_return_at_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = Link::new(TcpStream::connect(l.local_addr().unwrap()).unwrap()).unwrap();
        let mut b = Link::new(l.accept().unwrap().0).unwrap();
        assert!(!b.readable());
        a.send(&LinkMsg::Abort {
            reason: "test".into(),
        })
        .unwrap();
        a.send(&LinkMsg::Bye).unwrap();
        // The first message is read only by `recv`, and still there after asking.
        until_readable(&mut b, "the message never arrived");
        assert!(b.readable());
        assert!(matches!(
            b.recv(Duration::from_secs(5)),
            Ok(LinkMsg::Abort { reason }) if reason == "test"
        ));
        // The second may already sit in the reader's buffer: still readable.
        assert!(b.readable());
        assert!(matches!(b.recv(Duration::from_secs(5)), Ok(LinkMsg::Bye)));
        drop(a);
        until_readable(&mut b, "the close was never seen");
        assert!(matches!(
            b.recv(Duration::from_secs(5)),
            Err(LinkError::Closed)
        ));
    }

    /// A peer that sends an endless line is cut off at [`MAX_LINE`] with an error, and one
    /// that sends garbage is not echoed beyond 80 characters.
    #[test]
    fn lines_are_bounded_and_garbage_is_not_echoed_whole() {
        use std::io::Write;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut b = Link::new(l.accept().unwrap().0).unwrap();
        let writer = std::thread::spawn(move || {
            let junk = vec![b'x'; (MAX_LINE as usize) + 4096];
            let _ = a.write_all(&junk);
            let _ = a.write_all(b"\n");
            a
        });
        match b.recv(Duration::from_secs(30)) {
            Err(LinkError::Other(e)) => assert!(e.contains("longer than"), "{e}"),
            other => panic!("{other:?}"),
        }
        let mut a = writer.join().unwrap();
        a.write_all(format!("{}\n", "y".repeat(500)).as_bytes())
            .unwrap();
        // The rest of the long line, then the garbage line: unreadable, shown cut short.
        let mut shown = String::new();
        for _ in 0..2 {
            if let Err(LinkError::Other(e)) = b.recv(Duration::from_secs(30)) {
                shown = e;
            }
        }
        assert!(shown.starts_with("unreadable message"), "{shown}");
        assert!(shown.len() < 300, "{shown}");
    }

    /// A stranger's unknown message name (which serde's error quotes) reaches the error with
    /// its escape sequences escaped and its length cut.
    #[test]
    fn a_strangers_text_in_an_error_is_escaped_and_cut() {
        use std::io::Write;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut b = Link::new(l.accept().unwrap().0).unwrap();
        // JSON escapes, so the decoded name holds ESC and BEL.
        let name = format!(r"\u001b]0;owned\u0007{}", "z".repeat(10_000));
        a.write_all(format!("{{\"msg\":\"{name}\"}}\n").as_bytes())
            .unwrap();
        match b.recv(Duration::from_secs(30)) {
            Err(LinkError::Other(e)) => {
                assert!(!e.chars().any(char::is_control), "{e:?}");
                assert!(e.len() < 400, "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
