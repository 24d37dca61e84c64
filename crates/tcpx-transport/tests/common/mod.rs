//! What the backend tests share: comms opened in pairs and one byte-exact transfer through the
//! shared schedule driver, whatever the backend.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use tcpx_gpu::{fill_pattern, verify_pattern};
use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::{HostBuffer, Memory, RecvComm, SendComm, Transport, TransportError};

/// The deadline for connecting and accepting.
pub fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

/// `channels` comms from a sender to a receiver on one transport.
pub type CommPair = (Vec<Box<dyn SendComm>>, Vec<Box<dyn RecvComm>>);

/// Opens `channels` comms from a sender to a receiver on `t` (accepting in a thread).
pub fn comms(t: &dyn Transport, channels: usize) -> CommPair {
    let mut listeners: Vec<_> = (0..channels).map(|_| t.listen().unwrap()).collect();
    let handles: Vec<_> = listeners.iter().map(|l| l.handle()).collect();
    std::thread::scope(|s| {
        let acc = s.spawn(|| {
            listeners
                .iter_mut()
                .map(|l| l.accept(soon()).unwrap())
                .collect::<Vec<_>>()
        });
        let send = handles
            .iter()
            .map(|h| t.connect(h, soon()).unwrap())
            .collect::<Vec<_>>();
        (send, acc.join().unwrap())
    })
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

/// Moves `cfg.size` bytes from `src` over the sending comms into `dst` at `recv_base` on the
/// receiving ones, through the shared driver (`stall`: its longest wait without progress); the
/// first error of either side.
pub fn drive(
    t: &dyn Transport,
    comms: CommPair,
    (src, dst): (&Memory, &Memory),
    cfg: SchedConfig,
    recv_base: usize,
    stall: Duration,
) -> Result<(), TransportError> {
    let (mut send, mut recv) = comms;
    let smr: Vec<_> = send.iter_mut().map(|c| c.reg_mr(src).unwrap()).collect();
    let rmr: Vec<_> = recv.iter_mut().map(|c| c.reg_mr(dst).unwrap()).collect();
    std::thread::scope(|s| {
        let cfg2 = cfg.clone();
        let r = s.spawn(move || {
            let mut x = Transfer::new(cfg2, Role::Recv, recv_base, 0)?;
            x.run(t, &mut Comms::Recv(&mut recv, &rmr), stall)
        });
        let mut x = Transfer::new(cfg, Role::Send, 0, 0)?;
        let sent = x.run(t, &mut Comms::Send(&mut send, &smr), stall);
        let received = r.join().unwrap();
        received?;
        sent
    })
}

/// One transfer of `cfg.size` bytes between host buffers over `comms` ([`drive`]). The receive
/// buffer must hold the sent pattern at [`RECV_OFFSET`] and nothing else.
pub fn transfer(
    t: &dyn Transport,
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
    drive(t, comms, mems, cfg, RECV_OFFSET, stall)?;
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
