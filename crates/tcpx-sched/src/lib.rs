//! tcpx-sched: the sans-IO core that lays one transfer over channels.
//!
//! A transfer of `size` bytes is cut into chunks of `chunk` bytes (the last one may be shorter),
//! each chunk is given to a channel (round-robin or weighted), and every channel keeps a FIFO window
//! of at most `window` requests in flight. The [`Schedule`] answers three questions for the IO layer:
//! what may be posted next, which request of a channel to test, and which finished receive to
//! consume; the IO layer tells it what happened. Both sides of a transfer build the same schedule
//! from the same [`SchedConfig`], so chunk `k` of channel `c` is the `k`-th request on that channel
//! on both ends: matching is FIFO per channel, as in NCCL's net API.
//!
//! The rules it enforces are the strictest ones the backends have (GPUDirect-TCPX's): test only the
//! oldest request of a channel, complete and consume in FIFO order, free a receive's window slot only
//! when it is consumed.
//!
//! [`nic`] decides which NIC carries which channel (NUMA-local, closest-by-PCI, round-robin,
//! explicit), from plain data about NICs and GPUs.
//!
//! Not for: sockets, threads, clocks or memory. Nothing here performs IO or blocks, so every
//! behaviour is tested deterministically (see the property tests).
//!
//! # How it works
//!
//! `Schedule` lays a transfer of `size` bytes out as chunks over channels (round-robin or smooth
//! weighted round-robin) and answers: what may be posted (`next_post`), which request of a channel to
//! test (`next_test`), which receive to consume (`next_consume`); the IO layer reports back
//! (`posted`, `completed`, `consumed`). Pure state machine, property-tested.
//!
//! `Schedule::repeated` makes one transfer of several laps of the same message (back-to-back
//! iterations on one buffer): chunk indices run on over the laps, so channel assignment and the
//! windows continue across a lap's end and the next lap is posted while this one drains; a lap's
//! chunk waits until the previous lap is done with the same bytes (`bytes_free`), and
//! `lap_is_done` says when a lap has finished.
//!
//! Invariants: every byte is in exactly one chunk of each lap; a channel never has more than
//! `window` requests holding a slot; no two requests in flight share bytes; requests complete and
//! are consumed in FIFO order per channel; a receive holds its slot until consumed; the same
//! `SchedConfig` and lap count yield the same per-channel sequences on both sides (this is what
//! makes FIFO matching between peers work).
//!
//! `nic` gives each channel of a flow one NIC (`assign_channels(policy, nics, gpu, flow, channels)`)
//! from plain data (`NicInfo`: name, address, NUMA node, PCI path, up; `GpuPlace`: the flow's GPU's
//! NUMA node and PCI path): `numa-local` (up NICs on the GPU's node, round-robin), `closest-pci`
//! (longest shared PCI path prefix, the C++ ChannelManager's score; ties round-robin), `round-robin`
//! (channel c of flow f on NIC (f*channels + c) mod n), `explicit` (listed names/addresses in
//! channel order). Unknown or down listed NICs, no NIC on the GPU's node: errors that say what to
//! check. An unknown GPU place (no GPU, host memory) makes every up NIC local and equally close.

#![forbid(unsafe_code)]

pub mod nic;

use std::collections::VecDeque;
use std::fmt;

/// How chunks are given to channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// Chunk `i` goes to channel `i % channels`.
    RoundRobin,
    /// Smooth weighted round-robin: channel `c` gets about `weights[c] / sum(weights)` of the chunks,
    /// interleaved rather than in runs (the nginx upstream algorithm). A weight of 0 gets nothing.
    Weighted(Vec<u32>),
}

/// Which side of the transfer this schedule drives: the model's [`tcpx_model::Side`] (new code
/// names it so). It decides when a window slot is free again: a send request frees its slot when
/// its test reports it done, a receive request only once it was consumed (TCPX recycles bounce
/// pages then).
pub use tcpx_model::Side as Role;

/// Everything both sides must agree on to lay a transfer out the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedConfig {
    /// Bytes in the transfer.
    pub size: u64,
    /// Bytes per chunk (one request). The last chunk holds the remainder.
    pub chunk: u64,
    /// Requests in flight per channel, at most.
    pub window: usize,
    /// Number of channels.
    pub channels: usize,
    /// How chunks are spread over channels.
    pub assignment: Assignment,
}

/// One request's worth of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunk {
    /// Position in the whole transfer, 0-based (over every lap).
    pub index: u64,
    /// The lap (repetition of the message) it belongs to, 0-based; 0 in a transfer of one lap.
    pub lap: u64,
    /// Channel that carries it.
    pub channel: usize,
    /// Position of this chunk among its channel's chunks, 0-based (the FIFO sequence number).
    pub seq: u64,
    /// Byte offset in the message (every lap covers the same bytes).
    pub offset: u64,
    /// Length in bytes (> 0).
    pub len: u64,
}

/// Why a configuration or an event was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("transfer size is 0: give a size of at least 1 byte")]
    ZeroSize,
    #[error("chunk size is 0: give a chunk of at least 1 byte")]
    ZeroChunk,
    #[error("chunk ({chunk} B) is larger than the transfer ({size} B): use a chunk <= size")]
    ChunkLargerThanSize { chunk: u64, size: u64 },
    #[error("window is 0: at least one request per channel must be allowed in flight")]
    ZeroWindow,
    #[error("channels is 0: give at least one channel")]
    ZeroChannels,
    #[error("{weights} weights given for {channels} channels: give one weight per channel")]
    WeightCount { weights: usize, channels: usize },
    #[error("every channel weight is 0: at least one channel must carry data")]
    AllWeightsZero,
    #[error("transfer of {size} B in chunks of {chunk} B makes too many chunks ({chunks}); raise the chunk size")]
    TooManyChunks { size: u64, chunk: u64, chunks: u64 },
    #[error("a transfer of 0 laps: give at least one")]
    ZeroLaps,
    #[error("{laps} laps of {per_lap} chunks make too many chunks; run fewer laps or raise the chunk size")]
    TooManyLaps { laps: u64, per_lap: u64 },
    #[error("chunk {index} cannot be posted now: {reason}")]
    NotPostable { index: u64, reason: &'static str },
    #[error(
        "channel {channel}: chunk {got} reported out of FIFO order, expected chunk {expected:?}"
    )]
    OutOfOrder {
        channel: usize,
        expected: Option<u64>,
        got: u64,
    },
    #[error("channel {channel}: chunk {index} completed with {got} B, expected {expected} B")]
    WrongLength {
        channel: usize,
        index: u64,
        expected: u64,
        got: u64,
    },
    #[error("channel {channel} does not exist (there are {channels})")]
    NoSuchChannel { channel: usize, channels: usize },
    #[error("consume is only for receive schedules")]
    ConsumeOnSend,
}

/// Upper bound on chunks in one transfer; keeps the per-channel index lists small.
pub const MAX_CHUNKS: u64 = 1 << 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Posted,
    Completed,
}

#[derive(Debug, Clone)]
struct ChannelState {
    /// Chunk indices of this channel, in FIFO order.
    chunks: Vec<u64>,
    /// Next position in `chunks` to post.
    next: usize,
    /// Requests holding a window slot, oldest first.
    in_flight: VecDeque<(Chunk, SlotState)>,
}

/// The schedule of one transfer on one side. See the crate docs for the protocol.
#[derive(Debug, Clone)]
pub struct Schedule {
    cfg: SchedConfig,
    role: Role,
    /// Chunks of one lap (one message).
    per_lap: u64,
    /// Chunks of every lap.
    chunks: u64,
    /// Unfinished chunks of each lap.
    lap_left: Vec<u64>,
    /// Per chunk position in the message, how many laps have finished it (empty for one lap):
    /// a lap's chunk is posted only once the previous lap is done with the same bytes, so no
    /// two requests in flight ever share memory.
    laps_finished_at: Vec<u64>,
    channels: Vec<ChannelState>,
    bytes_done: u64,
    chunks_done: u64,
}

impl SchedConfig {
    /// Checks the configuration; every refusal says what to change.
    pub fn validate(&self) -> Result<u64, SchedError> {
        if self.size == 0 {
            return Err(SchedError::ZeroSize);
        }
        if self.chunk == 0 {
            return Err(SchedError::ZeroChunk);
        }
        if self.chunk > self.size {
            return Err(SchedError::ChunkLargerThanSize {
                chunk: self.chunk,
                size: self.size,
            });
        }
        if self.window == 0 {
            return Err(SchedError::ZeroWindow);
        }
        if self.channels == 0 {
            return Err(SchedError::ZeroChannels);
        }
        if let Assignment::Weighted(w) = &self.assignment {
            if w.len() != self.channels {
                return Err(SchedError::WeightCount {
                    weights: w.len(),
                    channels: self.channels,
                });
            }
            if w.iter().all(|&x| x == 0) {
                return Err(SchedError::AllWeightsZero);
            }
        }
        let chunks = self.size.div_ceil(self.chunk);
        if chunks > MAX_CHUNKS {
            return Err(SchedError::TooManyChunks {
                size: self.size,
                chunk: self.chunk,
                chunks,
            });
        }
        Ok(chunks)
    }

    /// Number of chunks the transfer is cut into (after [`SchedConfig::validate`]).
    pub fn chunk_count(&self) -> u64 {
        self.size.div_ceil(self.chunk.max(1))
    }
}

/// Channel of every chunk, in chunk order.
fn assign(cfg: &SchedConfig, chunks: u64) -> Vec<Vec<u64>> {
    let mut per_channel = vec![Vec::new(); cfg.channels];
    match &cfg.assignment {
        Assignment::RoundRobin => {
            for i in 0..chunks {
                per_channel[(i % cfg.channels as u64) as usize].push(i);
            }
        }
        Assignment::Weighted(weights) => {
            // Smooth weighted round-robin: every step each channel gains its weight, the richest
            // channel takes the chunk and pays the total. Ties go to the lowest channel index, so
            // both ends derive the same sequence.
            let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
            let mut current = vec![0i64; weights.len()];
            for i in 0..chunks {
                let mut best = 0usize;
                for (c, &w) in weights.iter().enumerate() {
                    current[c] += i64::from(w);
                    if current[c] > current[best] {
                        best = c;
                    }
                }
                current[best] -= total;
                per_channel[best].push(i);
            }
        }
    }
    per_channel
}

impl Schedule {
    /// Builds the schedule of one side. Fails with a message naming the bad value.
    pub fn new(cfg: SchedConfig, role: Role) -> Result<Self, SchedError> {
        Self::repeated(cfg, role, 1)
    }

    /// The schedule of `laps` back-to-back repetitions of the same message, laid out as one
    /// transfer: chunk `i` of lap `l` has index `l * chunks_per_lap + i` and the message offset
    /// of chunk `i`, and chunks go to channels by index over the whole transfer, so the windows
    /// stay full across the laps' boundaries (the next message is posted while this one drains,
    /// as NCCL's proxy does for back-to-back operations on one buffer).
    pub fn repeated(cfg: SchedConfig, role: Role, laps: u64) -> Result<Self, SchedError> {
        let per_lap = cfg.validate()?;
        if laps == 0 {
            return Err(SchedError::ZeroLaps);
        }
        let chunks = per_lap
            .checked_mul(laps)
            .filter(|&c| c <= MAX_CHUNKS)
            .ok_or(SchedError::TooManyLaps { laps, per_lap })?;
        let channels = assign(&cfg, chunks)
            .into_iter()
            .map(|chunks| ChannelState {
                chunks,
                next: 0,
                in_flight: VecDeque::with_capacity(cfg.window),
            })
            .collect();
        Ok(Schedule {
            cfg,
            role,
            per_lap,
            chunks,
            lap_left: vec![per_lap; laps as usize],
            laps_finished_at: if laps > 1 {
                vec![0; per_lap as usize]
            } else {
                Vec::new()
            },
            channels,
            bytes_done: 0,
            chunks_done: 0,
        })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Total number of chunks, over every lap.
    pub fn chunk_count(&self) -> u64 {
        self.chunks
    }

    /// Number of laps (repetitions of the message).
    pub fn laps(&self) -> u64 {
        self.lap_left.len() as u64
    }

    /// Whether every chunk of `lap` is finished (sent, or received and consumed).
    pub fn lap_is_done(&self, lap: u64) -> bool {
        self.lap_left.get(lap as usize) == Some(&0)
    }

    /// The chunk with transfer index `index`, or `None` past the end.
    pub fn chunk(&self, index: u64) -> Option<Chunk> {
        if index >= self.chunks {
            return None;
        }
        // Lookup through the channel lists keeps one source of truth for the assignment.
        self.channels.iter().enumerate().find_map(|(c, st)| {
            st.chunks
                .binary_search(&index)
                .ok()
                .map(|seq| self.make_chunk(c, seq))
        })
    }

    fn make_chunk(&self, channel: usize, seq: usize) -> Chunk {
        let index = self.channels[channel].chunks[seq];
        let offset = (index % self.per_lap) * self.cfg.chunk;
        Chunk {
            index,
            lap: index / self.per_lap,
            channel,
            seq: seq as u64,
            offset,
            len: self.cfg.chunk.min(self.cfg.size - offset),
        }
    }

    /// Chunks of one channel in FIFO order (what the other side will see on that channel).
    pub fn channel_chunks(&self, channel: usize) -> impl Iterator<Item = Chunk> + '_ {
        (0..self.channels[channel].chunks.len()).map(move |seq| self.make_chunk(channel, seq))
    }

    /// Whether the previous lap is done with the bytes of chunk `index` (always, in lap 0).
    fn bytes_free(&self, index: u64) -> bool {
        let (lap, pos) = (index / self.per_lap, (index % self.per_lap) as usize);
        lap == 0 || self.laps_finished_at.get(pos) == Some(&lap)
    }

    /// The next chunk that may be posted: the lowest transfer index among channels that have an
    /// unposted chunk, a free window slot and (in a later lap) the previous lap done with the
    /// same bytes. `None` when nothing may be posted now or all is posted.
    pub fn next_post(&self) -> Option<Chunk> {
        let mut best: Option<(u64, usize)> = None;
        for (c, st) in self.channels.iter().enumerate() {
            if st.in_flight.len() >= self.cfg.window {
                continue;
            }
            if let Some(&idx) = st.chunks.get(st.next) {
                if self.bytes_free(idx) && best.is_none_or(|(b, _)| idx < b) {
                    best = Some((idx, c));
                }
            }
        }
        best.map(|(_, c)| self.make_chunk(c, self.channels[c].next))
    }

    /// The next chunk of `channel` that may be posted, if its window has room.
    pub fn next_post_on(&self, channel: usize) -> Option<Chunk> {
        let st = self.channels.get(channel)?;
        if st.in_flight.len() >= self.cfg.window || st.next >= st.chunks.len() {
            return None;
        }
        self.bytes_free(st.chunks[st.next])
            .then(|| self.make_chunk(channel, st.next))
    }

    /// Records that `chunk` was posted. It must be its channel's next chunk and a slot must be free.
    pub fn posted(&mut self, chunk: &Chunk) -> Result<(), SchedError> {
        if !self.bytes_free(chunk.index) {
            return Err(SchedError::NotPostable {
                index: chunk.index,
                reason: "the previous lap's request for the same bytes is not finished",
            });
        }
        let window = self.cfg.window;
        let ch = self.channel_mut(chunk.channel)?;
        if ch.chunks.get(ch.next) != Some(&chunk.index) {
            return Err(SchedError::NotPostable {
                index: chunk.index,
                reason: "it is not its channel's next unposted chunk",
            });
        }
        if ch.in_flight.len() >= window {
            return Err(SchedError::NotPostable {
                index: chunk.index,
                reason: "its channel's window is full",
            });
        }
        ch.next += 1;
        ch.in_flight.push_back((*chunk, SlotState::Posted));
        Ok(())
    }

    /// The one request of `channel` that may be tested now: its oldest posted, unfinished request.
    pub fn next_test(&self, channel: usize) -> Option<Chunk> {
        self.channels
            .get(channel)?
            .in_flight
            .iter()
            .find(|(_, s)| *s == SlotState::Posted)
            .map(|(c, _)| *c)
    }

    /// Records that the test of `chunk` reported done with `bytes` transferred.
    pub fn completed(&mut self, chunk: &Chunk, bytes: u64) -> Result<(), SchedError> {
        let role = self.role;
        let ch = self.channel_mut(chunk.channel)?;
        let pos = ch
            .in_flight
            .iter()
            .position(|(_, s)| *s == SlotState::Posted);
        let expected = pos.map(|p| ch.in_flight[p].0);
        match (pos, expected) {
            (Some(p), Some(e)) if e.index == chunk.index => {
                if bytes != e.len {
                    return Err(SchedError::WrongLength {
                        channel: chunk.channel,
                        index: chunk.index,
                        expected: e.len,
                        got: bytes,
                    });
                }
                match role {
                    Role::Send => {
                        // Only the oldest can be Posted-first for sends, so p == 0.
                        ch.in_flight.remove(p);
                    }
                    Role::Recv => ch.in_flight[p].1 = SlotState::Completed,
                }
                if role == Role::Send {
                    self.finish(chunk, bytes);
                }
                Ok(())
            }
            _ => Err(SchedError::OutOfOrder {
                channel: chunk.channel,
                expected: expected.map(|c| c.index),
                got: chunk.index,
            }),
        }
    }

    /// The receive of `channel` that may be consumed now: its oldest request, if it completed.
    pub fn next_consume(&self, channel: usize) -> Option<Chunk> {
        match self.channels.get(channel)?.in_flight.front() {
            Some((c, SlotState::Completed)) => Some(*c),
            _ => None,
        }
    }

    /// Records that the completed receive `chunk` was consumed, freeing its window slot.
    pub fn consumed(&mut self, chunk: &Chunk) -> Result<(), SchedError> {
        if self.role != Role::Recv {
            return Err(SchedError::ConsumeOnSend);
        }
        let ch = self.channel_mut(chunk.channel)?;
        match ch.in_flight.front() {
            Some((c, SlotState::Completed)) if c.index == chunk.index => {
                let (c, _) = ch.in_flight.pop_front().expect("front exists");
                self.finish(&c, c.len);
                Ok(())
            }
            front => Err(SchedError::OutOfOrder {
                channel: chunk.channel,
                expected: front.map(|(c, _)| c.index),
                got: chunk.index,
            }),
        }
    }

    fn finish(&mut self, chunk: &Chunk, bytes: u64) {
        self.bytes_done += bytes;
        self.chunks_done += 1;
        if let Some(left) = self.lap_left.get_mut(chunk.lap as usize) {
            *left -= 1;
        }
        let pos = (chunk.index % self.per_lap) as usize;
        if let Some(done) = self.laps_finished_at.get_mut(pos) {
            *done += 1;
        }
    }

    fn channel_mut(&mut self, channel: usize) -> Result<&mut ChannelState, SchedError> {
        let channels = self.channels.len();
        self.channels
            .get_mut(channel)
            .ok_or(SchedError::NoSuchChannel { channel, channels })
    }

    /// Requests currently holding a slot on `channel`.
    pub fn in_flight(&self, channel: usize) -> usize {
        self.channels.get(channel).map_or(0, |c| c.in_flight.len())
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Bytes whose requests are finished (sends completed, receives consumed).
    pub fn bytes_done(&self) -> u64 {
        self.bytes_done
    }

    /// Bytes of every lap together.
    pub fn total_bytes(&self) -> u64 {
        self.cfg.size * self.laps()
    }

    /// True once every chunk is finished.
    pub fn is_done(&self) -> bool {
        self.chunks_done == self.chunks
    }
}

impl fmt::Display for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk {} (", self.index)?;
        if self.lap > 0 {
            write!(f, "lap {}, ", self.lap)?;
        }
        write!(
            f,
            "channel {}, seq {}, bytes {}..{})",
            self.channel,
            self.seq,
            self.offset,
            self.offset + self.len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(size: u64, chunk: u64, window: usize, channels: usize) -> SchedConfig {
        SchedConfig {
            size,
            chunk,
            window,
            channels,
            assignment: Assignment::RoundRobin,
        }
    }

    #[test]
    fn bad_configs_are_refused_with_the_value() {
        assert_eq!(cfg(0, 1, 1, 1).validate(), Err(SchedError::ZeroSize));
        assert_eq!(cfg(10, 0, 1, 1).validate(), Err(SchedError::ZeroChunk));
        let e = cfg(10, 11, 1, 1).validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "chunk (11 B) is larger than the transfer (10 B): use a chunk <= size"
        );
        assert_eq!(cfg(10, 1, 0, 1).validate(), Err(SchedError::ZeroWindow));
        assert_eq!(cfg(10, 1, 1, 0).validate(), Err(SchedError::ZeroChannels));
        let mut c = cfg(10, 1, 1, 2);
        c.assignment = Assignment::Weighted(vec![1]);
        assert_eq!(
            c.validate(),
            Err(SchedError::WeightCount {
                weights: 1,
                channels: 2
            })
        );
        c.assignment = Assignment::Weighted(vec![0, 0]);
        assert_eq!(c.validate(), Err(SchedError::AllWeightsZero));
        assert!(matches!(
            cfg(u64::MAX, 1, 1, 1).validate(),
            Err(SchedError::TooManyChunks { .. })
        ));
    }

    #[test]
    fn round_robin_layout_and_short_tail() {
        let s = Schedule::new(cfg(10, 4, 2, 2), Role::Send).unwrap();
        let c0: Vec<_> = s
            .channel_chunks(0)
            .map(|c| (c.index, c.offset, c.len))
            .collect();
        let c1: Vec<_> = s
            .channel_chunks(1)
            .map(|c| (c.index, c.offset, c.len))
            .collect();
        assert_eq!(c0, vec![(0, 0, 4), (2, 8, 2)]);
        assert_eq!(c1, vec![(1, 4, 4)]);
        assert_eq!(s.chunk(2).unwrap().seq, 1);
        assert_eq!(s.chunk(3), None);
    }

    #[test]
    fn weighted_is_smooth_and_proportional() {
        let mut c = cfg(7, 1, 8, 3);
        c.assignment = Assignment::Weighted(vec![5, 1, 1]);
        let s = Schedule::new(c, Role::Send).unwrap();
        let seq: Vec<usize> = (0..7).map(|i| s.chunk(i).unwrap().channel).collect();
        // nginx's documented example for weights {5,1,1}: a a b a c a a
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn weight_zero_channel_gets_nothing() {
        let mut c = cfg(100, 1, 8, 3);
        c.assignment = Assignment::Weighted(vec![1, 0, 3]);
        let s = Schedule::new(c, Role::Send).unwrap();
        assert_eq!(s.channel_chunks(1).count(), 0);
        assert_eq!(s.channel_chunks(0).count(), 25);
        assert_eq!(s.channel_chunks(2).count(), 75);
    }

    #[test]
    fn window_limits_posts_and_send_completion_frees_a_slot() {
        let mut s = Schedule::new(cfg(8, 1, 2, 1), Role::Send).unwrap();
        let a = s.next_post().unwrap();
        s.posted(&a).unwrap();
        let b = s.next_post().unwrap();
        s.posted(&b).unwrap();
        assert_eq!(s.next_post(), None, "window of 2 is full");
        let third = s.chunk(2).unwrap();
        assert!(matches!(
            s.posted(&third),
            Err(SchedError::NotPostable { .. })
        ));
        assert_eq!(s.next_test(0), Some(a));
        // Completing the younger request first breaks FIFO.
        assert!(matches!(
            s.completed(&b, 1),
            Err(SchedError::OutOfOrder { .. })
        ));
        assert!(matches!(
            s.completed(&a, 0),
            Err(SchedError::WrongLength { .. })
        ));
        s.completed(&a, 1).unwrap();
        assert_eq!(s.next_post(), Some(third));
        assert!(matches!(s.consumed(&b), Err(SchedError::ConsumeOnSend)));
    }

    #[test]
    fn receive_slot_is_held_until_consumed() {
        let mut s = Schedule::new(cfg(3, 1, 1, 1), Role::Recv).unwrap();
        let a = s.next_post().unwrap();
        s.posted(&a).unwrap();
        assert_eq!(s.next_consume(0), None, "not completed yet");
        s.completed(&a, 1).unwrap();
        assert_eq!(
            s.next_post(),
            None,
            "completed but not consumed: slot still held"
        );
        assert_eq!(s.next_test(0), None, "nothing left to test");
        assert_eq!(s.next_consume(0), Some(a));
        s.consumed(&a).unwrap();
        assert_eq!(s.bytes_done(), 1);
        assert!(s.next_post().is_some());
    }

    #[test]
    fn next_post_prefers_lowest_index_across_channels() {
        let mut s = Schedule::new(cfg(6, 1, 1, 3), Role::Send).unwrap();
        let order: Vec<u64> = (0..3)
            .map(|_| {
                let c = s.next_post().unwrap();
                s.posted(&c).unwrap();
                c.index
            })
            .collect();
        assert_eq!(order, vec![0, 1, 2]);
        // Channel 1 finishes first: its next chunk (4) is the only one postable.
        let c1 = s.next_test(1).unwrap();
        s.completed(&c1, 1).unwrap();
        assert_eq!(s.next_post().unwrap().index, 4);
        assert_eq!(s.next_post_on(0), None);
    }

    #[test]
    fn laps_repeat_the_message_and_keep_the_windows_full_across_their_boundary() {
        // 3 chunks per lap (4+4+2 bytes), 2 laps, one channel with a window of 2.
        let mut s = Schedule::repeated(cfg(10, 4, 2, 1), Role::Recv, 2).unwrap();
        assert_eq!((s.chunk_count(), s.laps(), s.total_bytes()), (6, 2, 20));
        let spans: Vec<(u64, u64, u64)> = s
            .channel_chunks(0)
            .map(|c| (c.lap, c.offset, c.len))
            .collect();
        assert_eq!(
            spans,
            vec![
                (0, 0, 4),
                (0, 4, 4),
                (0, 8, 2),
                (1, 0, 4),
                (1, 4, 4),
                (1, 8, 2)
            ]
        );
        let post = |s: &mut Schedule| {
            let c = s.next_post().unwrap();
            s.posted(&c).unwrap();
            c
        };
        let (a, b) = (post(&mut s), post(&mut s));
        for c in [a, b] {
            s.completed(&c, c.len).unwrap();
            s.consumed(&c).unwrap();
        }
        let last_of_lap0 = post(&mut s);
        // Lap 1's first chunk is posted before lap 0 has drained.
        let first_of_lap1 = post(&mut s);
        assert_eq!((last_of_lap0.lap, first_of_lap1.lap), (0, 1));
        assert!(!s.lap_is_done(0));
        s.completed(&last_of_lap0, 2).unwrap();
        assert!(!s.lap_is_done(0), "a receive finishes when consumed");
        s.consumed(&last_of_lap0).unwrap();
        assert!(s.lap_is_done(0) && !s.lap_is_done(1));
        assert_eq!(
            first_of_lap1.to_string(),
            "chunk 3 (lap 1, channel 0, seq 3, bytes 0..4)"
        );
        assert_eq!(
            last_of_lap0.to_string(),
            "chunk 2 (channel 0, seq 2, bytes 8..10)"
        );
    }

    #[test]
    fn zero_or_too_many_laps_are_refused() {
        assert_eq!(
            Schedule::repeated(cfg(10, 1, 1, 1), Role::Send, 0).unwrap_err(),
            SchedError::ZeroLaps
        );
        let e = Schedule::repeated(cfg(1 << 20, 1, 1, 1), Role::Send, 1 << 10).unwrap_err();
        assert_eq!(
            e,
            SchedError::TooManyLaps {
                laps: 1 << 10,
                per_lap: 1 << 20
            }
        );
        assert!(e.to_string().contains("run fewer laps"));
    }

    #[test]
    fn a_lap_waits_for_the_previous_lap_to_finish_the_same_bytes() {
        // 2 chunks per lap on 2 channels with room for 4 each: lap 1's chunk 0 (index 2, on
        // channel 0) waits until lap 0's chunk 0 is finished.
        let mut s = Schedule::repeated(cfg(2, 1, 4, 2), Role::Send, 3).unwrap();
        let a = s.next_post().unwrap();
        s.posted(&a).unwrap();
        let b = s.next_post().unwrap();
        s.posted(&b).unwrap();
        assert_eq!(s.next_post(), None, "both positions still in flight");
        assert_eq!(s.next_post_on(0), None);
        let early = s.channel_chunks(0).nth(1).unwrap();
        assert_eq!((early.index, early.lap, early.offset), (2, 1, 0));
        assert!(matches!(
            s.posted(&early),
            Err(SchedError::NotPostable { .. })
        ));
        s.completed(&b, 1).unwrap();
        // Position 1 is free again, but lap 1's chunk there (index 3) is on channel 1 behind
        // nothing: it may go; position 0 still waits.
        assert_eq!(s.next_post().map(|c| c.index), Some(3));
        s.completed(&a, 1).unwrap();
        assert_eq!(s.next_post().map(|c| c.index), Some(2));
    }
}
