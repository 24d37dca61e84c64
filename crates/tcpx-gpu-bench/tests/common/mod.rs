//! What the GPU transport tests share: comms between a sending and a receiving transport, and
//! one memory registered on every comm of a side.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::{Listener, Memory, MrId, RecvComm, SendComm, Transport, TransportError};

/// `channels` comms: the sending ends and the receiving ends.
pub type CommPair = (Vec<Box<dyn SendComm>>, Vec<Box<dyn RecvComm>>);

/// Opens `channels` comms from transport `st` to transport `rt` (accepting in a thread), each
/// within `deadline`.
pub fn connect_pairs(
    st: &dyn Transport,
    rt: &dyn Transport,
    channels: usize,
    deadline: Instant,
) -> CommPair {
    let mut ls: Vec<_> = (0..channels).map(|_| rt.listen().unwrap()).collect();
    connect_listeners(st, &mut ls, deadline)
}

/// Connects `st` to each of the listeners `ls` (accepting in a thread), each within `deadline`.
pub fn connect_listeners(
    st: &dyn Transport,
    ls: &mut [Box<dyn Listener>],
    deadline: Instant,
) -> CommPair {
    let hs: Vec<_> = ls.iter().map(|l| l.handle()).collect();
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            ls.iter_mut()
                .map(|l| l.accept(deadline).unwrap())
                .collect::<Vec<_>>()
        });
        let c: Vec<_> = hs
            .iter()
            .map(|h| st.connect(h, deadline).unwrap())
            .collect();
        (c, a.join().unwrap())
    })
}

/// Registers `src` on every sending comm and `dst` on every receiving one.
pub fn register((send, recv): &mut CommPair, src: &Memory, dst: &Memory) -> (Vec<MrId>, Vec<MrId>) {
    let smr = send.iter_mut().map(|c| c.reg_mr(src).unwrap());
    let smr = smr.collect();
    let rmr = recv.iter_mut().map(|c| {
        c.reg_mr(dst)
            .unwrap_or_else(|e| panic!("registering the receive buffer: {e}"))
    });
    (smr, rmr.collect())
}

/// `size` bytes round-robin over `channels` in requests of `chunk` bytes (at most `size`),
/// `window` in flight per channel.
pub fn schedule(size: usize, chunk: u64, window: usize, channels: usize) -> SchedConfig {
    SchedConfig {
        size: size as u64,
        chunk: chunk.min(size as u64),
        window,
        channels,
        assignment: Assignment::RoundRobin,
    }
}

/// Both ends of one transfer: the transport, its comms and their registrations.
pub struct Side<'a, C: ?Sized> {
    pub transport: &'a dyn Transport,
    pub comms: &'a mut [Box<C>],
    pub mrs: &'a [MrId],
}

/// One transfer under `cfg` with `tag`, received at `recv_base`, through the shared driver
/// (`stall`: the longest wait without progress): what the sender and the receiver each met.
pub fn drive(
    send: Side<'_, dyn SendComm>,
    recv: Side<'_, dyn RecvComm>,
    cfg: SchedConfig,
    (recv_base, tag): (usize, u32),
    stall: Duration,
) -> (Result<(), TransportError>, Result<(), TransportError>) {
    std::thread::scope(|s| {
        let cfg2 = cfg.clone();
        let r = s.spawn(move || -> Result<(), TransportError> {
            let mut x = Transfer::new(cfg2, Role::Recv, recv_base, tag)?;
            x.run(
                recv.transport,
                &mut Comms::Recv(recv.comms, recv.mrs),
                stall,
            )
        });
        let sent = Transfer::new(cfg, Role::Send, 0, tag).and_then(|mut x| {
            x.run(
                send.transport,
                &mut Comms::Send(send.comms, send.mrs),
                stall,
            )
        });
        (sent, r.join().unwrap())
    })
}
