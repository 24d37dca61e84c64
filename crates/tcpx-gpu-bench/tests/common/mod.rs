//! What the GPU transport tests share: one memory registered on every comm of a side, and rounds
//! of a pattern transfer from one GPU to another through the shared driver (comms opened and both
//! sides run by `tcpx_transport::driver`).

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_gpu::{Device, DeviceBuffer, Stream};

use tcpx_sched::{Assignment, SchedConfig};
use tcpx_transport::driver::{connect_in_process, run_both_sides, CommPair, Side};
use tcpx_transport::{Memory, MrId, RecvComm, SendComm, Transport, TransportError};

/// One comm from `st` to `rt` ([`connect_in_process`]) within `deadline`: its send and receive
/// ends.
pub fn one_comm(
    st: &dyn Transport,
    rt: &dyn Transport,
    deadline: Instant,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (mut send, mut recv) = connect_in_process(st, rt, 1, deadline).unwrap();
    (send.pop().unwrap(), recv.pop().unwrap())
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

/// GPU 1 where there is one, else GPU 0 again (`g`: the GPUs the test got, at least one).
pub fn second_gpu_or_first(g: &[Device]) -> Device {
    if tcpx_gpu::device_count().unwrap() > 1 {
        Device::open(1).unwrap()
    } else {
        g[0].clone()
    }
}

/// Bytes of poison on each side of the message in a [`gpu_rounds`] destination: the message is
/// received at this offset.
pub const POISON: usize = 4096;

/// One round of [`gpu_rounds`], to be checked.
pub struct GpuRound<'a> {
    pub round: u64,
    /// The pattern seed the sender sent.
    pub seed: u64,
    pub sent: Result<(), TransportError>,
    pub received: Result<(), TransportError>,
    /// The receiving GPU's stream and the destination: poison (pattern seed 5), the message at
    /// [`POISON`], poison.
    pub stream: &'a Stream,
    pub dst: &'a DeviceBuffer,
}

/// Connects `cfg.channels` comms from transport `st` to transport `rt` ([`connect_in_process`])
/// and sends `size` bytes under `cfg` from GPU `g0` to GPU `g1` over them, twice (`timeout`: for
/// connecting, and the longest stall of a transfer): round `r` sends pattern seed `first_seed + r`
/// with tag `r`, received at [`POISON`] into a freshly poisoned destination, both sides through
/// [`run_both_sides`]; `check` looks at each round, then the poison around the message is checked
/// untouched (`label` names the test in those failures). Gives the comms back, each with its
/// registration.
pub fn gpu_rounds(
    label: &str,
    (st, rt): (&dyn Transport, &dyn Transport),
    (g0, g1): (&Device, &Device),
    (size, cfg): (usize, SchedConfig),
    (first_seed, timeout): (u64, Duration),
    mut check: impl FnMut(GpuRound<'_>),
) -> CommPair {
    let mut comms = connect_in_process(st, rt, cfg.channels, Instant::now() + timeout).unwrap();
    let src = Arc::new(g0.alloc(size).unwrap());
    let dst = Arc::new(g1.alloc(size + 2 * POISON).unwrap());
    let (s0, s1) = (g0.new_stream().unwrap(), g1.new_stream().unwrap());
    let (smr, rmr) = register(
        &mut comms,
        &Memory::Cuda(src.clone()),
        &Memory::Cuda(dst.clone()),
    );
    let (mut send, mut recv) = comms;
    for round in 0..2u64 {
        let seed = first_seed + round;
        s0.fill_pattern(&src, 0, size, seed, 0).unwrap();
        s1.fill_pattern(&dst, 0, size + 2 * POISON, 5, 0).unwrap(); // poison
        s0.synchronize().unwrap();
        s1.synchronize().unwrap();
        let (sent, received) = run_both_sides(
            &cfg,
            round as u32,
            1,
            Side::new(st, &mut send, &smr, 0),
            Side::new(rt, &mut recv, &rmr, POISON),
            timeout,
        );
        check(GpuRound {
            round,
            seed,
            sent: sent.map(drop),
            received: received.map(drop),
            stream: &s1,
            dst: &dst,
        });
        assert_eq!(
            s1.verify_pattern(&dst, 0, POISON, 5, 0).unwrap(),
            None,
            "{label}: bytes before the received message were written"
        );
        let after = POISON + size;
        assert_eq!(
            s1.verify_pattern(&dst, after, POISON, 5, after as u64)
                .unwrap(),
            None,
            "{label}: bytes after the received message were written"
        );
    }
    (send, recv)
}
