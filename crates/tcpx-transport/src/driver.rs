//! Drives one transfer, laid out by a `tcpx_sched::Schedule`, over a set of comms (one per channel).
//!
//! This is the only place where the sans-IO schedule meets real requests: post what the schedule
//! allows, test the one request per channel it names, consume finished receives in order. The
//! benchmark and the endpoint both use it, so both obey the same discipline.
//!
//! Where both sides live in one process (the one-host GPU benchmark, the backends' tests),
//! [`connect_in_process`] opens their comms and [`run_both_sides`] runs the two sides of a
//! transfer at once, the receiving one in a thread of its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tcpx_sched::{Chunk, Role, SchedConfig, Schedule};

use crate::{MrId, RecvComm, RequestId, Result, SendComm, Transport, TransportError};

/// One side of a transfer in progress.
pub struct Transfer {
    sched: Schedule,
    /// Offset of the transfer's first byte in the registered memory.
    base: usize,
    reqs: HashMap<u64, RequestId>,
    tag: u32,
    /// When each lap's last chunk finished on this side.
    lap_ends: Vec<Option<Instant>>,
}

/// The comms of one side, one per channel, with the memory registered on each.
pub enum Comms<'a> {
    Send(&'a mut [Box<dyn SendComm>], &'a [MrId]),
    Recv(&'a mut [Box<dyn RecvComm>], &'a [MrId]),
}

impl Comms<'_> {
    fn channels(&self) -> usize {
        match self {
            Comms::Send(c, _) => c.len(),
            Comms::Recv(c, _) => c.len(),
        }
    }

    fn peer(&self, ch: usize) -> String {
        match self {
            Comms::Send(c, _) => c[ch].peer(),
            Comms::Recv(c, _) => c[ch].peer(),
        }
    }
}

impl Transfer {
    /// A transfer of `cfg.size` bytes starting at `base` in the registered memory.
    pub fn new(cfg: SchedConfig, role: Role, base: usize, tag: u32) -> Result<Self> {
        Self::repeated(cfg, role, base, tag, 1)
    }

    /// `laps` back-to-back repetitions of the message of `cfg.size` bytes at `base`, as one
    /// transfer ([`Schedule::repeated`]): the next lap is posted while this one drains.
    pub fn repeated(
        cfg: SchedConfig,
        role: Role,
        base: usize,
        tag: u32,
        laps: u64,
    ) -> Result<Self> {
        let sched = Schedule::repeated(cfg, role, laps)?;
        Ok(Transfer {
            lap_ends: vec![None; sched.laps() as usize],
            sched,
            base,
            reqs: HashMap::new(),
            tag,
        })
    }

    /// When each lap finished on this side (its last send completed, or its last receive was
    /// consumed); `None` for a lap not finished yet.
    pub fn lap_ends(&self) -> &[Option<Instant>] {
        &self.lap_ends
    }

    fn stamp_lap(&mut self, lap: u64) {
        if self.sched.lap_is_done(lap) {
            if let Some(end) = self.lap_ends.get_mut(lap as usize) {
                end.get_or_insert_with(Instant::now);
            }
        }
    }

    pub fn is_done(&self) -> bool {
        self.sched.is_done()
    }

    pub fn bytes_done(&self) -> u64 {
        self.sched.bytes_done()
    }

    pub fn schedule(&self) -> &Schedule {
        &self.sched
    }

    /// Does every step that can be done now without waiting. Returns whether anything happened.
    pub fn step(&mut self, comms: &mut Comms<'_>) -> Result<bool> {
        if comms.channels() != self.sched.channels() {
            return Err(TransportError::Usage(format!(
                "transfer laid out over {} channels but {} comms given",
                self.sched.channels(),
                comms.channels()
            )));
        }
        let mut progressed = false;
        // Post as much as the windows allow.
        while let Some(chunk) = self.sched.next_post() {
            let off = self.base + chunk.offset as usize;
            let len = chunk.len as usize;
            let posted = match comms {
                Comms::Send(c, mrs) => {
                    c[chunk.channel].isend(mrs[chunk.channel], off, len, self.tag)
                }
                Comms::Recv(c, mrs) => {
                    c[chunk.channel].irecv(mrs[chunk.channel], off, len, self.tag)
                }
            }
            .map_err(|e| context(e, "posting", &chunk))?;
            match posted {
                Some(req) => {
                    self.sched.posted(&chunk)?;
                    self.reqs.insert(chunk.index, req);
                    progressed = true;
                }
                // The backend is full; try again on the next step.
                None => break,
            }
        }
        for ch in 0..self.sched.channels() {
            // Test only the oldest open request of the channel.
            if let Some(chunk) = self.sched.next_test(ch) {
                let req = self.reqs[&chunk.index];
                let done = match comms {
                    Comms::Send(c, _) => c[ch].test(req),
                    Comms::Recv(c, _) => c[ch].test(req),
                }
                .map_err(|e| context(e, "testing", &chunk))?;
                if let Some(bytes) = done {
                    self.sched.completed(&chunk, bytes as u64)?;
                    if self.sched.role() == Role::Send {
                        self.reqs.remove(&chunk.index);
                        self.stamp_lap(chunk.lap);
                    }
                    progressed = true;
                }
            }
            if let Comms::Recv(c, _) = comms {
                while let Some(chunk) = self.sched.next_consume(ch) {
                    let req = self
                        .reqs
                        .remove(&chunk.index)
                        .expect("posted receive has a request");
                    c[ch]
                        .consume(req)
                        .map_err(|e| context(e, "consuming", &chunk))?;
                    self.sched.consumed(&chunk)?;
                    self.stamp_lap(chunk.lap);
                    progressed = true;
                }
            }
        }
        Ok(progressed)
    }

    /// Steps until done. Fails if nothing moves for `stall` (naming the channel and chunk waited
    /// on) or the transport reports an error.
    pub fn run(
        &mut self,
        transport: &dyn Transport,
        comms: &mut Comms<'_>,
        stall: Duration,
    ) -> Result<()> {
        let mut last_progress = Instant::now();
        while !self.is_done() {
            let seen = transport.activity();
            if self.step(comms)? {
                last_progress = Instant::now();
                continue;
            }
            if last_progress.elapsed() >= stall {
                return Err(self.stalled(comms, stall));
            }
            transport.wait_activity(seen, Duration::from_millis(2));
        }
        Ok(())
    }

    fn stalled(&self, comms: &Comms<'_>, stall: Duration) -> TransportError {
        let waiting = (0..self.sched.channels())
            .find_map(|ch| self.sched.next_test(ch))
            .or_else(|| self.sched.next_post());
        let (what, ch) = match waiting {
            Some(c) => (format!("{c}"), c.channel),
            None => ("the next request".to_string(), 0),
        };
        TransportError::Timeout {
            what: format!(
                "progress on {what} with peer {} ({} of {} bytes done)",
                comms.peer(ch),
                self.sched.bytes_done(),
                self.sched.total_bytes()
            ),
            secs: stall.as_secs_f64(),
            hint: "is the peer still running and posting the same sizes, chunks and channels?"
                .into(),
        }
    }
}

/// The sending and the receiving ends of the same comms, channel by channel.
pub type CommPair = (Vec<Box<dyn SendComm>>, Vec<Box<dyn RecvComm>>);

/// Opens `channels` comms from `sender` to `receiver` when both are in this process: listens on
/// `receiver`, accepts in a thread while `sender` connects to each handle in turn, each within
/// `deadline`. For this the handles need not travel out of band, as they must between two
/// processes (there [`crate::endpoint`] carries them). A connect's error comes before the accept's
/// (a failed connect leaves the accept waiting until `deadline`); a panicked accept thread is an
/// error too, and comes first.
pub fn connect_in_process(
    sender: &dyn Transport,
    receiver: &dyn Transport,
    channels: usize,
    deadline: Instant,
) -> Result<CommPair> {
    let mut listeners = (0..channels)
        .map(|_| receiver.listen())
        .collect::<Result<Vec<_>>>()?;
    let handles: Vec<_> = listeners.iter().map(|l| l.handle()).collect();
    std::thread::scope(|s| {
        let accepting = s.spawn(|| {
            listeners
                .iter_mut()
                .map(|l| l.accept(deadline))
                .collect::<Result<Vec<_>>>()
        });
        let send = handles
            .iter()
            .map(|h| sender.connect(h, deadline))
            .collect::<Result<Vec<_>>>();
        // A panicked accept is the cause of whatever the connects met, so it is reported first.
        let recv = accepting.join().map_err(|_| {
            TransportError::Failed(format!(
                "the thread accepting {channels} comm(s) on backend `{}` panicked. Check: the \
                 panic message printed above it",
                receiver.name()
            ))
        })?;
        Ok((send?, recv?))
    })
}

/// One side's part in [`run_both_sides`]: its transport, its comms (one per channel) with the
/// memory registered on each, and where the transfer starts in that memory.
pub struct Side<'a, C: ?Sized> {
    transport: &'a dyn Transport,
    comms: &'a mut [Box<C>],
    mrs: &'a [MrId],
    base: usize,
}

impl<'a, C: ?Sized> Side<'a, C> {
    /// The side on `transport` moving through `comms`, with `mrs[c]` registered on `comms[c]`,
    /// from or into offset `base` of that memory.
    pub fn new(
        transport: &'a dyn Transport,
        comms: &'a mut [Box<C>],
        mrs: &'a [MrId],
        base: usize,
    ) -> Self {
        Side {
            transport,
            comms,
            mrs,
            base,
        }
    }
}

/// Moves `laps` repetitions of the message laid out by `cfg` ([`Transfer::repeated`]) with `tag`
/// from `send` to `recv` when both sides are in this process: the receiving side runs in a
/// thread, the sending side on this one, each through [`Transfer::run`] (`stall`: the longest
/// wait without progress). Gives what each side met, the sender's first, each with its finished
/// [`Transfer`] (for its lap times). A side that fails leaves the other to stall out.
pub fn run_both_sides(
    cfg: &SchedConfig,
    tag: u32,
    laps: u64,
    send: Side<'_, dyn SendComm>,
    recv: Side<'_, dyn RecvComm>,
    stall: Duration,
) -> (Result<Transfer>, Result<Transfer>) {
    let run = |role, base, transport: &dyn Transport, comms: &mut Comms<'_>| {
        let mut x = Transfer::repeated(cfg.clone(), role, base, tag, laps)?;
        x.run(transport, comms, stall)?;
        Ok(x)
    };
    std::thread::scope(|s| {
        let receiving = s.spawn(|| {
            let comms = &mut Comms::Recv(recv.comms, recv.mrs);
            run(Role::Recv, recv.base, recv.transport, comms)
        });
        let comms = &mut Comms::Send(send.comms, send.mrs);
        let sent = run(Role::Send, send.base, send.transport, comms);
        let received = receiving.join().unwrap_or_else(|_| {
            Err(TransportError::Failed(format!(
                "the thread receiving the transfer on backend `{}` panicked. Check: the panic \
                 message printed above it",
                recv.transport.name()
            )))
        });
        (sent, received)
    })
}

fn context(e: TransportError, doing: &str, chunk: &Chunk) -> TransportError {
    match e {
        TransportError::Failed(m) => TransportError::Failed(format!("{m} (while {doing} {chunk})")),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::{SocketConfig, SocketTransport};
    use crate::{Handle, Limits, Listener};

    fn loopback() -> SocketTransport {
        let bind = "127.0.0.1".parse().unwrap();
        SocketTransport::new(SocketConfig {
            bind,
            ..SocketConfig::default()
        })
        .unwrap()
    }

    /// A receiving backend whose accept panics (a bug in a backend).
    struct PanickingAccept(SocketTransport);

    struct PanickingListener(Box<dyn Listener>);

    impl Listener for PanickingListener {
        fn handle(&self) -> Handle {
            self.0.handle()
        }

        fn accept(&mut self, _: Instant) -> Result<Box<dyn RecvComm>> {
            panic!("accept failed on purpose");
        }
    }

    impl Transport for PanickingAccept {
        fn name(&self) -> &str {
            "panicking-accept"
        }

        fn limits(&self) -> Limits {
            self.0.limits()
        }

        fn listen(&self) -> Result<Box<dyn Listener>> {
            Ok(Box::new(PanickingListener(self.0.listen()?)))
        }

        fn connect(&self, handle: &Handle, deadline: Instant) -> Result<Box<dyn SendComm>> {
            self.0.connect(handle, deadline)
        }
    }

    #[test]
    fn a_panicked_accept_thread_is_an_error_that_says_what_to_check() {
        let (st, rt) = (loopback(), PanickingAccept(loopback()));
        let deadline = Instant::now() + Duration::from_secs(2);
        let Err(e) = connect_in_process(&st, &rt, 2, deadline) else {
            panic!("comms opened although the accept thread panicked");
        };
        assert_eq!(
            e.to_string(),
            "the thread accepting 2 comm(s) on backend `panicking-accept` panicked. Check: the \
             panic message printed above it"
        );
    }
}
