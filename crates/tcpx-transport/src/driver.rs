//! Drives one transfer, laid out by a `tcpx_sched::Schedule`, over a set of comms (one per channel).
//!
//! This is the only place where the sans-IO schedule meets real requests: post what the schedule
//! allows, test the one request per channel it names, consume finished receives in order. The
//! benchmark and the endpoint both use it, so both obey the same discipline.

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

fn context(e: TransportError, doing: &str, chunk: &Chunk) -> TransportError {
    match e {
        TransportError::Failed(m) => TransportError::Failed(format!("{m} (while {doing} {chunk})")),
        other => other,
    }
}
