//! What the backend tests share: comms opened in pairs and one byte-exact transfer through the
//! shared schedule driver, whatever the backend.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use tcpx_gpu::{fill_pattern, verify_pattern};
use tcpx_sched::{Assignment, SchedConfig};
use tcpx_transport::driver::{connect_in_process, run_both_sides, Side};
use tcpx_transport::{HostBuffer, Memory, Transport, TransportError};

pub use tcpx_transport::driver::CommPair;

/// The deadline for connecting and accepting.
pub fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

/// Opens `channels` comms from a sender to a receiver on `t` ([`connect_in_process`]).
pub fn comms(t: &dyn Transport, channels: usize) -> CommPair {
    connect_in_process(t, t, channels, soon()).unwrap()
}

/// A schedule of `size` bytes in `chunk`-byte requests, `window` in flight on each of `channels`.
pub fn schedule(
    size: usize,
    chunk: u64,
    window: usize,
    channels: usize,
    assignment: Assignment,
) -> SchedConfig {
    SchedConfig {
        size: size as u64,
        chunk,
        window,
        channels,
        assignment,
    }
}

/// Where a transfer lands in the receive buffer: the bytes before it must stay untouched.
pub const RECV_OFFSET: usize = 4096;

/// Moves `cfg.size` bytes from `src` over the sending comms of transport `st` into `dst` at
/// `recv_base` on the receiving ones of `rt`, both sides through the shared driver
/// ([`run_both_sides`]; `stall`: its longest wait without progress); the first error of either
/// side.
pub fn drive(
    ends: (&dyn Transport, &dyn Transport),
    mut comms: CommPair,
    mems: (&Memory, &Memory),
    cfg: SchedConfig,
    recv_base: usize,
    stall: Duration,
) -> Result<(), TransportError> {
    drive_on(ends, &mut comms, mems, cfg, recv_base, stall)
}

/// [`drive`] over comms the caller keeps (to read their counters after).
pub fn drive_on(
    (st, rt): (&dyn Transport, &dyn Transport),
    (send, recv): &mut CommPair,
    (src, dst): (&Memory, &Memory),
    cfg: SchedConfig,
    recv_base: usize,
    stall: Duration,
) -> Result<(), TransportError> {
    let smr: Vec<_> = send.iter_mut().map(|c| c.reg_mr(src).unwrap()).collect();
    let rmr: Vec<_> = recv.iter_mut().map(|c| c.reg_mr(dst).unwrap()).collect();
    let (sent, received) = run_both_sides(
        &cfg,
        0,
        1,
        Side::new(st, send, &smr, 0),
        Side::new(rt, recv, &rmr, recv_base),
        stall,
    );
    received?;
    sent.map(drop)
}

/// One [`transfer`] under `cfg` over `cfg.channels` fresh comms of `t` ([`comms`]).
pub fn transfer_on(
    t: &dyn Transport,
    cfg: SchedConfig,
    stall: Duration,
) -> Result<(), TransportError> {
    transfer((t, t), comms(t, cfg.channels), cfg, stall)
}

/// One transfer of `cfg.size` bytes between host buffers over `comms` from transport `st` to
/// `rt` ([`drive`]). The receive buffer must hold the sent pattern at [`RECV_OFFSET`] and nothing
/// else.
pub fn transfer(
    (st, rt): (&dyn Transport, &dyn Transport),
    comms: CommPair,
    cfg: SchedConfig,
    stall: Duration,
) -> Result<(), TransportError> {
    let size = cfg.size as usize;
    let src = HostBuffer::new(size).unwrap();
    let dst = HostBuffer::new(size + RECV_OFFSET).unwrap();
    fill_pattern(&mut src.span_all().unwrap(), 11, 0);
    dst.span_all().unwrap().fill(0xEE);
    let mems = (&Memory::Host(src.clone()), &Memory::Host(dst.clone()));
    drive((st, rt), comms, mems, cfg, RECV_OFFSET, stall)?;
    let all = dst.span_all().unwrap();
    assert!(
        all[..RECV_OFFSET].iter().all(|&b| b == 0xEE),
        "bytes before the receive offset untouched"
    );
    assert_eq!(
        verify_pattern(&all[RECV_OFFSET..], 11, 0),
        None,
        "received bytes differ from what was sent"
    );
    Ok(())
}
