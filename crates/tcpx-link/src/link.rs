//! The leader/follower link: JSON lines over TCP ([`LinkMsg`]), one message per line, each
//! written in one piece so a reader that sees its first byte gets the rest at once.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

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

impl std::error::Error for LinkError {}

/// The leader/follower connection.
pub struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The begun line a read left when its time ran out (the rest is read by the next one).
    partial: Vec<u8>,
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
            partial: Vec::new(),
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
        if !self.reader.buffer().is_empty() || !self.partial.is_empty() {
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

    /// The next message, waiting at most `wait` for the whole of its line: a peer that sends a
    /// byte now and then cannot stretch it. A line begun when the time ran out is kept for the
    /// next read.
    pub fn recv(&mut self, wait: Duration) -> Result<LinkMsg, LinkError> {
        let deadline = Instant::now() + wait;
        let got = read_line_by(&mut self.reader, &mut self.partial, Some(deadline));
        self.taken(got).unwrap_or(Err(LinkError::Timeout))
    }

    /// The message of a read that ended with a whole line, an error for one that ended
    /// otherwise (the begun line dropped), `None` while the line is still arriving.
    fn taken(&mut self, got: std::io::Result<LineEnd>) -> Option<Result<LinkMsg, LinkError>> {
        match got {
            Ok(LineEnd::Pending) => None,
            Ok(LineEnd::Line) => Some(parse_line(&std::mem::take(&mut self.partial))),
            other => {
                self.partial.clear();
                Some(Err(line_error(other)))
            }
        }
    }

    /// The next message if its whole line has arrived, else `None` at once (what did arrive is
    /// kept): for serving several connections from one thread. The end of the connection, an
    /// overlong line and read errors are `Some(Err(..))`.
    pub fn poll(&mut self) -> Option<Result<LinkMsg, LinkError>> {
        if let Err(e) = self.reader.get_ref().set_nonblocking(true) {
            return Some(Err(LinkError::Other(e.to_string())));
        }
        let got = read_line_by(&mut self.reader, &mut self.partial, None);
        // The reader and writer share one open file: back to blocking for both.
        let _ = self.reader.get_ref().set_nonblocking(false);
        self.taken(got)
    }

    /// Whether part of a line has arrived and its rest not yet.
    pub fn line_begun(&self) -> bool {
        !self.partial.is_empty()
    }

    /// The connection itself, for closing it elsewhere ([`Closing`]).
    pub fn into_stream(self) -> TcpStream {
        self.writer
    }
}

/// How [`read_line_by`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnd {
    /// The line is whole (its newline included).
    Line,
    /// The peer closed the connection.
    Closed,
    /// More than [`MAX_LINE`] bytes without a newline.
    TooLong,
    /// The deadline passed, or (non-blocking) nothing more is there yet; what arrived is kept.
    Pending,
}

/// Reads from `reader` into `line` up to and including the next newline, until `deadline` for
/// the whole line (`None`: no deadline, or at once for a non-blocking socket). Each read waits
/// only for what is left, so a peer that trickles a byte at a time cannot stretch the line's
/// deadline, as a per-read timeout would let it.
pub fn read_line_by(
    reader: &mut BufReader<TcpStream>,
    line: &mut Vec<u8>,
    deadline: Option<Instant>,
) -> std::io::Result<LineEnd> {
    loop {
        if reader.buffer().is_empty() {
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left.max(Duration::from_millis(1))),
                    _ => return Ok(LineEnd::Pending),
                },
                None => None,
            };
            reader.get_ref().set_read_timeout(wait)?;
        }
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) => match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    return Ok(LineEnd::Pending)
                }
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted => {
                    return Ok(LineEnd::Closed)
                }
                _ => return Err(e),
            },
        };
        if buf.is_empty() {
            return Ok(LineEnd::Closed);
        }
        let (take, whole) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if line.len() as u64 > MAX_LINE {
            return Ok(LineEnd::TooLong);
        }
        if whole {
            return Ok(LineEnd::Line);
        }
    }
}

/// The error for a read that ended without a line.
fn line_error(end: std::io::Result<LineEnd>) -> LinkError {
    match end {
        Ok(LineEnd::Line) => LinkError::Other("internal: a whole line taken for an error".into()),
        Ok(LineEnd::Closed) => LinkError::Closed,
        Ok(LineEnd::Pending) => LinkError::Timeout,
        Ok(LineEnd::TooLong) => LinkError::Other(format!(
            "a message longer than {MAX_LINE} bytes: the peer does not speak this protocol"
        )),
        Err(e) => LinkError::Other(e.to_string()),
    }
}

/// A whole line as a message; what a peer sent is shown in an error only cut and escaped.
fn parse_line<M: DeserializeOwned>(line: &[u8]) -> Result<M, LinkError> {
    serde_json::from_slice(line).map_err(|e| {
        // serde's error quotes the peer's text too (an unknown variant, say).
        LinkError::Other(format!(
            "unreadable message `{}`: {}",
            shown(String::from_utf8_lossy(line).trim(), 80),
            shown(&e.to_string(), 160)
        ))
    })
}

/// Connections being closed gently ([`drain_and_close`]) side by side from one thread, none
/// waiting on another: each has shut its direction and is drained until the peer closes or its
/// own time is up. [`Closing::poll`] reads what is there without blocking.
#[derive(Default)]
pub struct Closing {
    conns: Vec<(TcpStream, Instant, usize)>,
}

impl Closing {
    /// Most connections held closing at once; beyond it the oldest is closed outright.
    const MAX: usize = 64;

    /// Shuts our direction of `stream` and keeps it until the peer closes or `wait` passes.
    pub fn add(&mut self, stream: TcpStream, wait: Duration) {
        let _ = stream.shutdown(std::net::Shutdown::Write);
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        if self.conns.len() >= Self::MAX {
            self.conns.remove(0);
        }
        self.conns.push((stream, Instant::now() + wait, 64 * 1024));
    }

    /// Drains what arrived, without blocking; closes those whose peer closed or whose time is up.
    pub fn poll(&mut self) {
        use std::io::Read;
        let now = Instant::now();
        let mut buf = [0u8; 4096];
        self.conns.retain_mut(|(s, until, left)| {
            if now >= *until {
                return false;
            }
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return false,
                    Ok(n) if n >= *left => return false,
                    Ok(n) => *left -= n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
        });
    }

    /// Whether none is left.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Finishes on a thread of its own (the caller goes on at once).
    pub fn finish_in_background(mut self) {
        if self.conns.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("tcpx-closing".into())
            .spawn(move || {
                while !self.conns.is_empty() {
                    self.poll();
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        // Without a thread the connections close outright (dropped with the closure).
        drop(spawned);
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

/// The next JSON line from `reader` as a message; `wait` bounds the whole line (`None`: until
/// the connection ends). A line is at most [`MAX_LINE`] bytes, and what a peer sent is shown in
/// an error only cut and escaped. A line begun when the time ran out is lost: a reader that
/// reads on after a timeout keeps its [`Link`] (or calls [`read_line_by`]).
pub fn recv_json_line<M: DeserializeOwned>(
    reader: &mut BufReader<TcpStream>,
    wait: Option<Duration>,
) -> Result<M, LinkError> {
    let deadline = wait.map(|w| Instant::now() + w);
    let mut line = Vec::new();
    match read_line_by(reader, &mut line, deadline) {
        Ok(LineEnd::Line) => parse_line(&line),
        other => Err(line_error(other)),
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

/// Connects to `addr`, retrying until `deadline` (the leader may start later); `Other` says
/// what the last attempt met.
pub fn connect_until(addr: &str, deadline: Instant) -> Result<TcpStream, LinkError> {
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
            return Err(LinkError::Other(format!("could not reach the leader at {addr} ({last}): is `tcpx-run plans/<plan>.rhai` running there, and is the port open?")));
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

/// The variable that names the plan port when `--port` does not (read by the binary).
pub const PLAN_PORT_ENV: &str = "TCPX_PLAN_PORT";

/// [`PLAN_PORT_ENV`]'s value (`env_value`, read by the caller) unless a port was `given`,
/// checked: a value that is not a port 1..=65535 is an error naming the variable, never a silent
/// fall back to the default.
pub fn checked_env_plan_port(
    given: Option<u16>,
    env_value: Option<String>,
) -> Result<Option<String>, String> {
    if given.is_some() {
        return Ok(None);
    }
    if let Some(p) = &env_value {
        match p.trim().parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => {
                return Err(format!(
                    "{PLAN_PORT_ENV}={}: not a port number 1..=65535 (unset it or fix it; --port overrides it)",
                    p.escape_debug()
                ))
            }
        }
    }
    Ok(env_value)
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
    fn a_plan_port_variable_that_is_no_port_is_refused_naming_it() {
        let env = |v: &str| Some(v.to_string());
        assert_eq!(checked_env_plan_port(None, env(" 6100")), Ok(env(" 6100")));
        assert_eq!(checked_env_plan_port(None, None), Ok(None));
        // --port given: the variable is not read, whatever it holds.
        assert_eq!(checked_env_plan_port(Some(7000), env("junk")), Ok(None));
        for bad in ["0", "65536", "port", "-1", "61\n00"] {
            let e = checked_env_plan_port(None, env(bad)).unwrap_err();
            assert!(
                e.starts_with("TCPX_PLAN_PORT=") && e.contains("--port overrides it"),
                "{bad}: {e}"
            );
        }
    }

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
