//! Connections that have been accepted but have not yet said who they are (issue 43 item 7).
//!
//! A listener that read one connection's greeting at a time, blocking, gave each silent
//! stranger (a port scan, a probe) its whole wait in turn, and a trickle of one byte at a time
//! renewed the read timeout with every byte. Here every accepted connection is a [`Greeting`]:
//! read without blocking, side by side with the others ([`wait_any`] polls the listener and all
//! of them at once), each with one deadline for its whole greeting that its bytes cannot move.
//! A real peer greets the moment it connects, so strangers around it delay it by nothing.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Most connections greeting at once on one listener, beyond the ones a real peer needs: past
/// this the oldest that has sent nothing is closed to make room (a flood of silent connections
/// costs file descriptors, never the peer that has begun its greeting).
pub(crate) const MAX_GREETING: usize = 64;

/// One accepted connection and what it has sent of its greeting.
pub(crate) struct Greeting {
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
    /// The greeting's bytes so far (`got` of them).
    pub(crate) bytes: Vec<u8>,
    got: usize,
    /// When it was accepted, and when its whole greeting must have arrived.
    accepted: Instant,
    by: Instant,
}

/// What a read of a [`Greeting`] found.
#[derive(Debug)]
pub(crate) enum Step {
    /// Not whole yet and still within its time.
    Waiting,
    /// All the bytes asked for have arrived.
    Whole,
    /// To be dropped, for this reason.
    Drop(String),
}

impl Greeting {
    /// `stream` (made non-blocking) with `wait` for a greeting of `want` bytes, no later than
    /// `deadline`.
    pub(crate) fn new(
        stream: TcpStream,
        from: SocketAddr,
        want: usize,
        wait: Duration,
        deadline: Instant,
    ) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        let accepted = Instant::now();
        let by = accepted
            .checked_add(wait)
            .map_or(deadline, |t| t.min(deadline));
        Ok(Greeting {
            stream,
            from,
            bytes: vec![0; want],
            got: 0,
            accepted,
            by,
        })
    }

    /// Asks for `want` bytes in all (a framed greeting, once its length is read).
    pub(crate) fn want(&mut self, want: usize) {
        self.bytes.resize(want, 0);
    }

    /// Reads what has arrived, up to the bytes asked for, without blocking; past its deadline
    /// and not whole, a [`Step::Drop`] saying what it sent in how long.
    pub(crate) fn read(&mut self) -> Step {
        while self.got < self.bytes.len() {
            match (&self.stream).read(&mut self.bytes[self.got..]) {
                Ok(0) => {
                    return Step::Drop(format!(
                        "it closed the connection after {} of {} greeting bytes",
                        self.got,
                        self.bytes.len()
                    ))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Step::Drop(format!("reading its greeting: {e}")),
            }
        }
        if self.got == self.bytes.len() {
            Step::Whole
        } else if Instant::now() >= self.by {
            Step::Drop(self.late())
        } else {
            Step::Waiting
        }
    }

    /// `sent no greeting within 5.0 s` or `sent 3 of 20 greeting bytes within 5.0 s`.
    fn late(&self) -> String {
        let secs = self
            .by
            .saturating_duration_since(self.accepted)
            .as_secs_f64();
        if self.got == 0 {
            format!("it sent no greeting within {secs:.1} s")
        } else {
            format!(
                "it sent {} of {} greeting bytes within {secs:.1} s",
                self.got,
                self.bytes.len()
            )
        }
    }

    /// Made blocking again, for the caller to keep.
    pub(crate) fn into_stream(self) -> io::Result<TcpStream> {
        self.stream.set_nonblocking(false)?;
        Ok(self.stream)
    }
}

/// Takes every connection waiting on `listener` (non-blocking) into `pending`, each a
/// [`Greeting`] of `want` bytes read at once; beyond `max` greetings, the oldest that has sent
/// nothing (else the oldest) is closed and handed to `dropped` with the reason.
pub(crate) fn take_waiting(
    listener: &TcpListener,
    pending: &mut Vec<Greeting>,
    want: usize,
    wait: Duration,
    deadline: Instant,
    max: usize,
    dropped: &mut dyn FnMut(&Greeting, &str),
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                let mut g = Greeting::new(stream, from, want, wait, deadline)?;
                // Whatever it sent with its connect counts before a newcomer may evict it.
                if let Step::Drop(why) = g.read() {
                    dropped(&g, &why);
                    continue;
                }
                pending.push(g);
                if pending.len() > max {
                    let i = pending.iter().position(|g| g.got == 0).unwrap_or(0);
                    let g = pending.remove(i);
                    dropped(
                        &g,
                        &format!("{max} connections were greeting at once and it had sent nothing"),
                    );
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            // A connection reset before it was taken, or a signal: nothing to do.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Waits until `listener` has a connection to take, one of `pending` has bytes (or its end),
/// or the earliest of `until` and their deadlines has come (at most a second at a time).
pub(crate) fn wait_any(
    listener: &TcpListener,
    pending: &[Greeting],
    until: Instant,
) -> io::Result<()> {
    let until = pending.iter().map(|g| g.by).fold(until, Instant::min);
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(());
    }
    // Rounded up, so that a wait never ends just short of a deadline and spins.
    let ms = (left.as_micros().div_ceil(1000)).min(1000) as u16;
    let mut fds: Vec<PollFd<'_>> = std::iter::once(listener.as_fd())
        .chain(pending.iter().map(|g| g.stream.as_fd()))
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A trickle of bytes does not extend a greeting's deadline: it is dropped when its whole
    /// wait is over, saying how much it sent.
    #[test]
    fn a_trickling_greeting_is_dropped_when_its_whole_wait_is_over() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut trickle = TcpStream::connect(addr).unwrap();
        let (stream, from) = listener.accept().unwrap();
        let wait = Duration::from_millis(300);
        let mut g = Greeting::new(stream, from, 20, wait, Instant::now() + wait * 10).unwrap();
        let started = Instant::now();
        // A byte every 50 ms: 19 of the 20 would take 0.95 s, and a read timeout renewed by
        // every byte would have waited for all of them and 0.3 s more.
        let gap = Duration::from_millis(50);
        let mut sent = 0;
        let mut last: Option<Instant> = None;
        let why = loop {
            if sent < 19 && last.is_none_or(|t| t.elapsed() >= gap) {
                trickle.write_all(&[0]).unwrap();
                sent += 1;
                last = Some(Instant::now());
            }
            match g.read() {
                Step::Waiting => wait_any(
                    &listener,
                    std::slice::from_ref(&g),
                    Instant::now() + gap / 5,
                )
                .unwrap(),
                Step::Whole => panic!("the greeting was whole"),
                Step::Drop(why) => break why,
            }
            assert!(
                started.elapsed() < wait * 3,
                "still waiting after {sent} bytes"
            );
        };
        assert!(started.elapsed() >= wait - Duration::from_millis(5));
        assert!(g.got < 19, "{} bytes arrived", g.got);
        assert!(why.ends_with("greeting bytes within 0.3 s"), "{why}");
        let mut silent = Greeting::new(
            TcpStream::connect(addr).unwrap(),
            addr,
            20,
            Duration::ZERO,
            Instant::now(),
        )
        .unwrap();
        match silent.read() {
            Step::Drop(why) => assert_eq!(why, "it sent no greeting within 0.0 s"),
            s => panic!("{s:?}"),
        }
    }
}
