//! What the shim records, in fixed tables made once at `init`: a comm table (one entry per comm,
//! kept to the end so that counters stay cumulative), a slot arena for requests in flight, and
//! bounded queues of set-up and error events for the writer.
//!
//! The data path (`isend`/`irecv`/`test`) touches only atomics: a request takes a free slot of
//! its comm's block (or of a shared overflow region) by compare-and-swap, and the slot's address
//! is what NCCL gets as the request, so `test` finds its comm and post time without a lookup.
//! Nothing is allocated per request; a request that finds no free slot is passed through
//! untracked and counted (`dropped.lat_samples`, `dropped.requests`). Set-up calls (listen,
//! connect, accept, close) take a mutex, never the data path.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Comms recorded over the life of the process; more are passed through and counted.
pub const MAX_TRACKED_COMMS: usize = 2048;
/// Tracked comms open at once (each holds a block of slots).
pub const MAX_OPEN_TRACKED: usize = 1024;
/// Request slots per comm: NCCL keeps at most `NCCL_NET_MAX_REQUESTS` (32) per comm in flight.
pub const SLOTS_PER_COMM: usize = 32;
/// Slots shared by all comms once a comm's own are taken.
pub const OVERFLOW_SLOTS: usize = 4096;
/// Latency bucket bounds: 1, 2, 4, ... 2^24 microseconds; one more bucket counts above.
pub const LAT_BOUNDS: usize = 25;
pub const LAT_BUCKETS: usize = LAT_BOUNDS + 1;
/// Error lines written per interval; the rest are only counted (the comms' `errors` count all).
pub const ERROR_LINES_PER_INTERVAL: usize = 20;
/// Set-up events queued between two writes; more are counted, not written.
pub const MAX_CONN_EVENTS: usize = 8192;
/// Connects in progress (a NULL comm answered, NCCL to call again) remembered at once.
pub const MAX_PENDING_CONNECTS: usize = 1024;
/// Bytes of the connect handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = tcpx_ffi::abi::NCCL_NET_HANDLE_MAXSIZE;

/// Which end of a connection a comm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Send,
    Recv,
}

impl Dir {
    pub fn as_str(self) -> &'static str {
        match self {
            Dir::Send => "send",
            Dir::Recv => "recv",
        }
    }
}

/// The latency bucket of a post-to-completion time: the first bound (1, 2, 4, ... 2^24 us) at
/// or above it, or [`LAT_BOUNDS`] above the last.
pub fn lat_bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    ((64 - (us - 1).leading_zeros()) as usize).min(LAT_BOUNDS)
}

/// The upper bound of bucket `i` in microseconds (`i < LAT_BOUNDS`).
pub fn lat_bound_us(i: usize) -> u64 {
    1u64 << i
}

/// FNV-1a over the connect handle: both ends compute it over the same 128 bytes (the listener
/// after `listen` fills them, the connector before its first `connect`), so the send comm and
/// the recv comm of one connection carry the same link id.
pub fn link_id(handle: &[u8]) -> u64 {
    handle.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One comm's counters, cumulative since init.
pub struct CommStats {
    pub id: u64,
    pub dir: Dir,
    pub dev: i32,
    pub link: u64,
    pub bytes: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Requests posted with a slot (so `posted - requests` is what is in flight).
    pub posted: AtomicU64,
    pub lat: [AtomicU64; LAT_BUCKETS],
    pub lat_sum_ns: AtomicU64,
    /// Completions the plugin reported no size for, counted at their posted size (an upper
    /// bound for a receive: NCCL posts a whole step; GPUDirect-TCPX reports no sizes).
    pub posted_sized: AtomicU64,
    pub closed: AtomicBool,
}

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const POSTED: u8 = 2;
/// Done, held for `irecvConsumed` (an unpack receive NCCL hands back after it).
const HELD: u8 = 3;

/// A request in flight: what NCCL holds as the request pointer.
pub struct Slot {
    state: AtomicU8,
    inner: AtomicPtr<c_void>,
    stats: AtomicPtr<CommStats>,
    posted_ns: AtomicU64,
    /// Posted bytes (the sum over a grouped receive): what `test` counts when the plugin does
    /// not write sizes (GPUDirect-TCPX's unpack receives).
    size: AtomicU64,
    n: AtomicU32,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(FREE),
            inner: AtomicPtr::new(std::ptr::null_mut()),
            stats: AtomicPtr::new(std::ptr::null_mut()),
            posted_ns: AtomicU64::new(0),
            size: AtomicU64::new(0),
            n: AtomicU32::new(0),
        }
    }

    /// The real plugin's request this slot stands for.
    pub fn inner(&self) -> *mut c_void {
        self.inner.load(Ordering::Acquire)
    }

    pub fn n(&self) -> u32 {
        self.n.load(Ordering::Relaxed)
    }

    pub fn posted_size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Fills a claimed slot once the real plugin gave its request; NCCL gets the slot after.
    pub fn post(
        &self,
        inner: *mut c_void,
        stats: &'static CommStats,
        posted_ns: u64,
        size: u64,
        n: u32,
    ) {
        self.inner.store(inner, Ordering::Relaxed);
        self.stats
            .store((stats as *const CommStats).cast_mut(), Ordering::Relaxed);
        self.posted_ns.store(posted_ns, Ordering::Relaxed);
        self.size.store(size, Ordering::Relaxed);
        self.n.store(n, Ordering::Relaxed);
        self.state.store(POSTED, Ordering::Release);
        stats.posted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> Option<&'static CommStats> {
        let p = self.stats.load(Ordering::Relaxed);
        // SAFETY: a slot's stats pointer is NULL or a leaked, never-freed CommStats.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Gives the slot back.
    pub fn release(&self) {
        self.state.store(FREE, Ordering::Release);
    }

    /// Records a completion at `now_ns` of the bytes the plugin reported (`None`: it reported
    /// none, the posted size counts); `hold` keeps the slot for `irecvConsumed`.
    pub fn complete(&self, reported: Option<u64>, now_ns: u64, hold: bool) {
        if let Some(s) = self.stats() {
            let bytes = reported.unwrap_or_else(|| {
                s.posted_sized.fetch_add(1, Ordering::Relaxed);
                self.size.load(Ordering::Relaxed)
            });
            s.bytes.fetch_add(bytes, Ordering::Relaxed);
            s.requests.fetch_add(1, Ordering::Relaxed);
            let took = now_ns.saturating_sub(self.posted_ns.load(Ordering::Relaxed));
            s.lat[lat_bucket(took)].fetch_add(1, Ordering::Relaxed);
            s.lat_sum_ns.fetch_add(took, Ordering::Relaxed);
        }
        self.state
            .store(if hold { HELD } else { FREE }, Ordering::Release);
    }

    pub fn is_posted(&self) -> bool {
        self.state.load(Ordering::Acquire) == POSTED
    }

    /// Done and held for `irecvConsumed`.
    pub fn is_held(&self) -> bool {
        self.state.load(Ordering::Acquire) == HELD
    }
}

/// A set-up call that finished.
#[derive(Debug, Clone)]
pub struct ConnEvent {
    pub t: f64,
    pub comm: u64,
    pub dir: Option<Dir>,
    pub dev: i32,
    pub link: u64,
    pub call: &'static str,
    pub took_s: f64,
    pub ok: bool,
    pub code: i32,
}

/// A call of the real plugin that returned an error.
#[derive(Debug, Clone)]
pub struct ErrorEvent {
    pub t: f64,
    pub comm: Option<u64>,
    pub dev: Option<i32>,
    pub link: Option<u64>,
    pub call: &'static str,
    pub code: i32,
}

struct PendingConnect {
    handle_addr: usize,
    /// The handle as the real plugin left it after the last "not yet": the next call with these
    /// bytes at this address is its retry.
    after: [u8; HANDLE_BYTES],
    start_ns: u64,
    link: u64,
    seq: u64,
}

/// What was left out because a table was full.
#[derive(Default)]
pub struct Dropped {
    pub comms: AtomicU64,
    pub lat_samples: AtomicU64,
    /// Requests passed through without a slot: their bytes are in no comm's counters.
    pub requests: AtomicU64,
    pub error_lines: AtomicU64,
    pub conn_lines: AtomicU64,
}

/// Everything recorded in one process.
pub struct Recorder {
    t0: Instant,
    comms: Box<[AtomicPtr<CommStats>]>,
    next_comm: AtomicU64,
    next_id: AtomicU64,
    arena: Box<[Slot]>,
    free_blocks: Mutex<Vec<u32>>,
    overflow_hint: AtomicU32,
    pub dropped: Dropped,
    conns: Mutex<Vec<ConnEvent>>,
    errors: Mutex<Vec<ErrorEvent>>,
    pending: Mutex<Vec<PendingConnect>>,
    pending_seq: AtomicU64,
}

/// A comm's place in the recorder: its counters and its block of slots, when it got both.
pub struct Tracked {
    pub stats: &'static CommStats,
    pub block: u32,
}

impl Recorder {
    pub fn new() -> Recorder {
        let arena: Vec<Slot> = (0..MAX_OPEN_TRACKED * SLOTS_PER_COMM + OVERFLOW_SLOTS)
            .map(|_| Slot::new())
            .collect();
        Recorder {
            t0: Instant::now(),
            comms: (0..MAX_TRACKED_COMMS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            next_comm: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            arena: arena.into_boxed_slice(),
            free_blocks: Mutex::new((0..MAX_OPEN_TRACKED as u32).rev().collect()),
            overflow_hint: AtomicU32::new(0),
            dropped: Dropped::default(),
            conns: Mutex::new(Vec::with_capacity(64)),
            errors: Mutex::new(Vec::with_capacity(ERROR_LINES_PER_INTERVAL)),
            pending: Mutex::new(Vec::new()),
            pending_seq: AtomicU64::new(0),
        }
    }

    /// Nanoseconds since init.
    pub fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Seconds since init.
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn secs(ns: u64) -> f64 {
        ns as f64 / 1e9
    }

    /// A new comm id, and its counters and slots where the tables have room.
    pub fn new_comm(&self, dir: Dir, dev: i32, link: u64) -> (u64, Option<Tracked>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let block = self
            .free_blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let Some(block) = block else {
            self.dropped.comms.fetch_add(1, Ordering::Relaxed);
            return (id, None);
        };
        let index = self.next_comm.fetch_add(1, Ordering::Relaxed) as usize;
        if index >= MAX_TRACKED_COMMS {
            self.give_back_block(block);
            self.dropped.comms.fetch_add(1, Ordering::Relaxed);
            return (id, None);
        }
        let stats: &'static CommStats = Box::leak(Box::new(CommStats {
            id,
            dir,
            dev,
            link,
            bytes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            posted: AtomicU64::new(0),
            lat: std::array::from_fn(|_| AtomicU64::new(0)),
            lat_sum_ns: AtomicU64::new(0),
            posted_sized: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }));
        self.comms[index].store((stats as *const CommStats).cast_mut(), Ordering::Release);
        (id, Some(Tracked { stats, block }))
    }

    /// A closed comm's block goes back, and any overflow slot it still held (its slots freed;
    /// NCCL tests nothing on a closed comm).
    pub fn close_comm(&self, t: &Tracked) {
        t.stats.closed.store(true, Ordering::Relaxed);
        let mine = (t.stats as *const CommStats).cast_mut();
        for s in &self.arena[MAX_OPEN_TRACKED * SLOTS_PER_COMM..] {
            let state = s.state.load(Ordering::Acquire);
            if (state == POSTED || state == HELD) && s.stats.load(Ordering::Relaxed) == mine {
                s.release();
            }
        }
        self.give_back_block(t.block);
    }

    fn give_back_block(&self, block: u32) {
        let start = block as usize * SLOTS_PER_COMM;
        for s in &self.arena[start..start + SLOTS_PER_COMM] {
            s.release();
        }
        self.free_blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(block);
    }

    /// Claims a free slot: the comm's own block first (from `hint`), then the overflow region.
    pub fn claim(&self, block: u32, hint: &AtomicU32) -> Option<&Slot> {
        let start = block as usize * SLOTS_PER_COMM;
        let h = hint.load(Ordering::Relaxed) as usize;
        for k in 0..SLOTS_PER_COMM {
            let i = (h + k) % SLOTS_PER_COMM;
            let s = &self.arena[start + i];
            if s.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                hint.store(((i + 1) % SLOTS_PER_COMM) as u32, Ordering::Relaxed);
                return Some(s);
            }
        }
        // A receive held for `irecvConsumed` by a caller that never hands receives back (only
        // NCCL does, and it keeps far fewer than a block in flight): the oldest is taken back.
        let oldest = self.arena[start..start + SLOTS_PER_COMM]
            .iter()
            .filter(|s| s.state.load(Ordering::Relaxed) == HELD)
            .min_by_key(|s| s.posted_ns.load(Ordering::Relaxed));
        if let Some(s) = oldest {
            if s.state
                .compare_exchange(HELD, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(s);
            }
        }
        let base = MAX_OPEN_TRACKED * SLOTS_PER_COMM;
        let h = self.overflow_hint.load(Ordering::Relaxed) as usize;
        for k in 0..OVERFLOW_SLOTS {
            let i = (h + k) % OVERFLOW_SLOTS;
            let s = &self.arena[base + i];
            if s.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.overflow_hint
                    .store(((i + 1) % OVERFLOW_SLOTS) as u32, Ordering::Relaxed);
                return Some(s);
            }
        }
        self.dropped.lat_samples.fetch_add(1, Ordering::Relaxed);
        self.dropped.requests.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The slot `request` points to, if it is one of the arena's (NCCL gets a slot's address
    /// for every tracked request; anything else is the real plugin's own request).
    pub fn slot_of(&self, request: *mut c_void) -> Option<&Slot> {
        let base = self.arena.as_ptr() as usize;
        let size = std::mem::size_of::<Slot>();
        let addr = request as usize;
        let end = base + self.arena.len() * size;
        if addr < base || addr >= end || (addr - base) % size != 0 {
            return None;
        }
        Some(&self.arena[(addr - base) / size])
    }

    /// Every comm recorded so far.
    pub fn comms(&self) -> impl Iterator<Item = &'static CommStats> + '_ {
        let n = (self.next_comm.load(Ordering::Acquire) as usize).min(MAX_TRACKED_COMMS);
        self.comms[..n].iter().filter_map(|p| {
            let p = p.load(Ordering::Acquire);
            // SAFETY: published pointers are leaked CommStats, never freed.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }

    pub fn conn_event(&self, e: ConnEvent) {
        let mut q = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < MAX_CONN_EVENTS {
            q.push(e);
        } else {
            self.dropped.conn_lines.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues an error line without blocking (a busy or full queue only counts it).
    pub fn error_event(&self, e: ErrorEvent) {
        match self.errors.try_lock() {
            Ok(mut q) if q.len() < ERROR_LINES_PER_INTERVAL => q.push(e),
            _ => {
                self.dropped.error_lines.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The events queued since the last call, set-up ones first.
    pub fn take_events(&self) -> (Vec<ConnEvent>, Vec<ErrorEvent>) {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|p| p.into_inner()));
        let mut errs = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        let errors = errs.drain(..).collect();
        (conns, errors)
    }

    /// A connect call is starting with `handle` at `addr`: the start time and link id of its
    /// first try (this call, or an earlier one NCCL is retrying).
    pub fn connect_begin(
        &self,
        addr: usize,
        handle: &[u8; HANDLE_BYTES],
        now_ns: u64,
    ) -> (u64, u64) {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pending
            .iter()
            .find(|p| p.handle_addr == addr && p.after == *handle)
        {
            return (p.start_ns, p.link);
        }
        (now_ns, link_id(handle))
    }

    /// The real plugin answered "not yet": remember the handle as it left it.
    pub fn connect_not_yet(
        &self,
        addr: usize,
        after: &[u8; HANDLE_BYTES],
        start_ns: u64,
        link: u64,
    ) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.pending_seq.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = pending.iter_mut().find(|p| p.handle_addr == addr) {
            p.after = *after;
            p.start_ns = start_ns;
            p.link = link;
            p.seq = seq;
            return;
        }
        if pending.len() >= MAX_PENDING_CONNECTS {
            // The oldest is a connect NCCL gave up on: forget it.
            if let Some(oldest) = (0..pending.len()).min_by_key(|&i| pending[i].seq) {
                pending.swap_remove(oldest);
            }
        }
        pending.push(PendingConnect {
            handle_addr: addr,
            after: *after,
            start_ns,
            link,
            seq,
        });
    }

    /// The connect at `addr` finished (a comm or an error).
    pub fn connect_done(&self, addr: usize) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|p| p.handle_addr != addr);
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_powers_of_two_microseconds() {
        assert_eq!(lat_bucket(0), 0);
        assert_eq!(lat_bucket(1000), 0);
        assert_eq!(lat_bucket(1001), 1);
        assert_eq!(lat_bucket(2000), 1);
        assert_eq!(lat_bucket(3000), 2);
        assert_eq!(lat_bucket(4000), 2);
        assert_eq!(lat_bucket(4001), 3);
        assert_eq!(lat_bucket((1 << 24) * 1000), 24);
        assert_eq!(lat_bucket((1 << 24) * 1000 + 1), 25);
        assert_eq!(lat_bucket(u64::MAX), 25);
        for i in 0..LAT_BOUNDS {
            assert_eq!(lat_bucket(lat_bound_us(i) * 1000), i);
        }
    }

    #[test]
    fn link_ids_differ_by_handle_and_agree_on_equal_bytes() {
        let a = [7u8; HANDLE_BYTES];
        let mut b = a;
        b[127] = 8;
        assert_eq!(link_id(&a), link_id(&a.clone()));
        assert_ne!(link_id(&a), link_id(&b));
    }

    #[test]
    fn slots_are_claimed_without_allocation_and_overflow_is_counted() {
        let r = Recorder::new();
        let (_, t) = r.new_comm(Dir::Send, 0, 1);
        let t = t.expect("room");
        let hint = AtomicU32::new(0);
        let mut held = Vec::new();
        for _ in 0..SLOTS_PER_COMM + OVERFLOW_SLOTS {
            let s = r.claim(t.block, &hint).expect("a slot");
            s.post(std::ptr::null_mut(), t.stats, 0, 1, 1);
            held.push(s as *const Slot as *mut c_void);
        }
        assert!(r.claim(t.block, &hint).is_none());
        assert_eq!(r.dropped.lat_samples.load(Ordering::Relaxed), 1);
        // Every slot handed out is found again by address, and nothing else is.
        for p in &held {
            assert!(r.slot_of(*p).is_some());
        }
        assert!(r.slot_of((held[0] as usize + 1) as *mut c_void).is_none());
        assert!(r.slot_of(std::ptr::null_mut()).is_none());
        let s = r.slot_of(held[0]).unwrap();
        s.complete(Some(100), 5_000, false);
        assert_eq!(t.stats.bytes.load(Ordering::Relaxed), 100);
        assert_eq!(t.stats.lat[lat_bucket(5_000)].load(Ordering::Relaxed), 1);
        assert!(r.claim(t.block, &hint).is_some());
        // Closing the comm frees its overflow slots too.
        r.close_comm(&t);
        let (_, t2) = r.new_comm(Dir::Send, 0, 2);
        let t2 = t2.expect("the block came back");
        for _ in 0..SLOTS_PER_COMM + OVERFLOW_SLOTS {
            r.claim(t2.block, &hint).expect("every slot is free again");
        }
    }

    #[test]
    fn the_comm_table_is_bounded() {
        let r = Recorder::new();
        let mut tracked = 0;
        for i in 0..MAX_OPEN_TRACKED + 5 {
            if r.new_comm(Dir::Recv, 0, i as u64).1.is_some() {
                tracked += 1;
            }
        }
        assert_eq!(tracked, MAX_OPEN_TRACKED);
        assert_eq!(r.dropped.comms.load(Ordering::Relaxed), 5);
        assert_eq!(r.comms().count(), MAX_OPEN_TRACKED);
    }

    #[test]
    fn a_connect_retry_is_known_by_the_handle_the_plugin_left() {
        let r = Recorder::new();
        let first = [1u8; HANDLE_BYTES];
        let (start, link) = r.connect_begin(0x1000, &first, 10);
        assert_eq!((start, link), (10, link_id(&first)));
        let mut after = first;
        after[20] = 9; // the plugin keeps its connect state in the handle
        r.connect_not_yet(0x1000, &after, start, link);
        assert_eq!(r.connect_begin(0x1000, &after, 50), (10, link));
        // Another connect at the same address with fresh bytes is a new one.
        let other = [2u8; HANDLE_BYTES];
        assert_eq!(r.connect_begin(0x1000, &other, 60), (60, link_id(&other)));
        r.connect_done(0x1000);
        assert_eq!(r.connect_begin(0x1000, &after, 70), (70, link_id(&after)));
    }
}
