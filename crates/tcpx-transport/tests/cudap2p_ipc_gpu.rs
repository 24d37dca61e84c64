//! Backend `cudap2p` across two processes of one node (CUDA IPC + the Unix control socket): this
//! test binary starts a second copy of itself as the sender (`--exact <test> --nocapture`, the role
//! and the listen handles in environment variables), receives into its own GPU and checks the
//! bytes on the GPU with the pattern kernels. Skips visibly without the GPUs it needs (runs under
//! `cargo xtask gpu-test`).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::cudap2p::{CopyMode, CudaP2pTransport};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::{Handle, Memory, Transport, TransportError};

/// Set in the sender process: `<send gpu>,<mode>,<handles as hex, comma separated>`.
const CHILD_ENV: &str = "TCPX_CUDAP2P_IPC_TEST_SENDER";
const SEED: u64 = 0x1bc_2024;
const SIZE: usize = (64 << 20) + 4096;
const CHANNELS: usize = 2;

fn sched() -> SchedConfig {
    SchedConfig {
        size: SIZE as u64,
        chunk: 4 << 20,
        window: 8,
        channels: CHANNELS,
        assignment: Assignment::RoundRobin,
    }
}

/// Runs this process's side (`role`, matching `comms`) of the transfer [`sched`] lays out, waiting
/// at most 20 s without progress.
fn run_side(t: &dyn Transport, role: Role, comms: &mut Comms<'_>) -> Result<(), TransportError> {
    Transfer::new(sched(), role, 0, 0)?.run(t, comms, Duration::from_secs(20))
}

/// Tests a request of a size-mismatched pair (`test`) until it fails, waiting on `t`'s activity
/// for up to 20 s, and returns the failure's message; a request that finishes instead fails the
/// test with `finished(bytes)`.
fn mismatch_reported(
    t: &dyn Transport,
    mut test: impl FnMut() -> Result<Option<usize>, TransportError>,
    finished: impl Fn(usize) -> String,
) -> String {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match test() {
            Ok(Some(n)) => panic!("{}", finished(n)),
            Ok(None) => {
                assert!(Instant::now() < end, "the mismatch was never reported");
                t.wait_activity(t.activity(), Duration::from_millis(10));
            }
            Err(e) => return e.to_string(),
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex handle"))
        .collect()
}

fn mode_name(m: CopyMode) -> &'static str {
    m.as_str()
}

/// The sender's part, run in the child process.
fn sender(spec: &str) {
    let mut parts = spec.split(',');
    let gpu: usize = parts.next().unwrap().parse().unwrap();
    let mode = CopyMode::parse(parts.next().unwrap()).unwrap();
    let send_len: usize = parts.next().unwrap().parse().unwrap();
    let handles: Vec<Handle> = parts
        .map(|h| Handle::from_bytes(unhex(h)).unwrap())
        .collect();
    let dev = tcpx_gpu::Device::open(gpu).expect("sender opens its GPU");
    let src = Arc::new(dev.alloc(SIZE).unwrap());
    let s = dev.new_stream().unwrap();
    s.fill_pattern(&src, 0, SIZE, SEED, 0).unwrap();
    s.synchronize().unwrap();
    let t = CudaP2pTransport::new(mode);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut comms: Vec<_> = handles
        .iter()
        .map(|h| t.connect(h, deadline).expect("sender connects"))
        .collect();
    let mrs: Vec<_> = comms
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Cuda(src.clone())).unwrap())
        .collect();
    if send_len != 0 {
        // The size-mismatch case: one request larger than the receiver's.
        let req = comms[0].isend(mrs[0], 0, send_len, 0).unwrap().unwrap();
        let err = mismatch_reported(
            &t,
            || comms[0].test(req),
            |n| format!("a too-large send finished ({n} B)"),
        );
        assert!(err.contains("both sides must post the same sizes"), "{err}");
        eprintln!("sender saw: {err}");
        return;
    }
    run_side(&t, Role::Send, &mut Comms::Send(&mut comms, &mrs)).expect("sender's transfer");
    for (c, m) in comms.iter_mut().zip(&mrs) {
        c.dereg_mr(*m).unwrap();
    }
    // Dropping the comms waits until the receiver has closed its mappings of `src`.
    drop(comms);
}

/// Starts this test again in a child process as the sender.
fn spawn_sender(
    test: &str,
    gpu: usize,
    mode: CopyMode,
    send_len: usize,
    handles: &[Handle],
) -> Child {
    let spec = format!(
        "{gpu},{},{send_len},{}",
        mode_name(mode),
        handles
            .iter()
            .map(|h| hex(h.as_bytes()))
            .collect::<Vec<_>>()
            .join(",")
    );
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdin(Stdio::null())
        .spawn()
        .expect("start the sender process")
}

fn wait_child(mut child: Child, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "the sender process failed: {st}");
            return;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the sender process did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Receiver on GPU `recv_gpu` (this process), sender on `send_gpu` (a child process).
fn across_processes(test: &str, send_gpu: usize, recv_gpu: usize, mode: CopyMode) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        sender(&spec);
        return;
    }
    let need = send_gpu.max(recv_gpu) + 1;
    let Some(gpus) = tcpx_gpu::testing::gpus_or_skip(test, need) else {
        return;
    };
    let dev = &gpus[recv_gpu];
    let dst = Arc::new(dev.alloc(SIZE).unwrap());
    let s = dev.new_stream().unwrap();
    s.fill_pattern(&dst, 0, SIZE, SEED ^ 0xff, 0).unwrap();
    s.synchronize().unwrap();
    let t = CudaP2pTransport::new(mode);
    let mut listeners: Vec<_> = (0..CHANNELS).map(|_| t.listen().unwrap()).collect();
    let handles: Vec<Handle> = listeners.iter().map(|l| l.handle()).collect();
    let child = spawn_sender(test, send_gpu, mode, 0, &handles);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut comms: Vec<_> = listeners
        .iter_mut()
        .map(|l| l.accept(deadline).expect("the sender process connects"))
        .collect();
    assert!(
        comms[0].peer().contains(mode_name(mode)),
        "{}",
        comms[0].peer()
    );
    let mrs: Vec<_> = comms
        .iter_mut()
        .map(|c| c.reg_mr(&Memory::Cuda(dst.clone())).unwrap())
        .collect();
    let started = Instant::now();
    run_side(&t, Role::Recv, &mut Comms::Recv(&mut comms, &mrs)).expect("receiver's transfer");
    let secs = started.elapsed().as_secs_f64();
    let wrong = s.count_pattern_errors(&dst, 0, SIZE, SEED, 0).unwrap();
    assert_eq!(
        wrong, 0,
        "{mode:?}: GPU {recv_gpu} holds {wrong} wrong bytes of GPU {send_gpu}'s {SIZE}"
    );
    eprintln!(
        "{test}: {SIZE} B GPU {send_gpu} (pid {}) -> GPU {recv_gpu} (pid {}) in {:.1} ms ({:.1} GB/s \
         incl. first mapping; not a benchmark)",
        child.id(),
        std::process::id(),
        secs * 1e3,
        SIZE as f64 / secs / 1e9
    );
    for (c, m) in comms.iter_mut().zip(&mrs) {
        c.dereg_mr(*m).unwrap();
    }
    drop(comms);
    wait_child(child, Duration::from_secs(60));
}

#[test]
fn gpu0_to_gpu1_across_processes_receiver_pulls() {
    across_processes(
        "gpu0_to_gpu1_across_processes_receiver_pulls",
        0,
        1,
        CopyMode::Read,
    );
}

#[test]
fn gpu0_to_gpu1_across_processes_sender_pushes() {
    across_processes(
        "gpu0_to_gpu1_across_processes_sender_pushes",
        0,
        1,
        CopyMode::Write,
    );
}

#[test]
fn one_gpu_across_processes_receiver_pulls() {
    across_processes(
        "one_gpu_across_processes_receiver_pulls",
        0,
        0,
        CopyMode::Read,
    );
}

#[test]
fn one_gpu_across_processes_sender_pushes() {
    across_processes(
        "one_gpu_across_processes_sender_pushes",
        0,
        0,
        CopyMode::Write,
    );
}

/// A send larger than the matching receive fails on both sides with the sizes named.
#[test]
fn a_size_mismatch_across_processes_is_reported_on_both_sides() {
    const TEST: &str = "a_size_mismatch_across_processes_is_reported_on_both_sides";
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        sender(&spec);
        return;
    }
    let Some(gpus) = tcpx_gpu::testing::gpus_or_skip(TEST, 1) else {
        return;
    };
    let dst = Arc::new(gpus[0].alloc(1 << 20).unwrap());
    let t = CudaP2pTransport::new(CopyMode::Read);
    let mut l = t.listen().unwrap();
    let child = spawn_sender(TEST, 0, CopyMode::Read, 2 << 20, &[l.handle()]);
    let mut c = l
        .accept(Instant::now() + Duration::from_secs(30))
        .expect("the sender process connects");
    let mr = c.reg_mr(&Memory::Cuda(dst.clone())).unwrap();
    let req = c.irecv(mr, 0, 1 << 20, 0).unwrap().unwrap();
    let err = mismatch_reported(
        &t,
        || c.test(req),
        |n| format!("a receive of 1 MiB took a 2 MiB send ({n} B)"),
    );
    assert!(
        err.contains("a send of 2097152 B met a receive of 1048576 B"),
        "{err}"
    );
    drop(c);
    wait_child(child, Duration::from_secs(60));
}
