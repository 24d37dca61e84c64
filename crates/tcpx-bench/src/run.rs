//! The two roles of an experiment and the in-process pairing of both (`local`).

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tcpx_gpu::{pattern_byte, verify_pattern};
use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::socket::{connect_retry, SocketConfig};
use tcpx_transport::{Handle, Memory, MrId, RecvComm, SendComm, Transport};

use crate::control::{Control, Msg};
use crate::Differences;
use crate::{format_size, Experiment, Measurement, Side, SideResult, PROTOCOL};

/// Why an experiment did not produce results. The message names the peer, the experiment and
/// where it stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The experiment's values are unusable; nothing was started.
    #[error("invalid experiment: {0}")]
    Invalid(String),
    /// The two sides were started with different settings.
    #[error("{0}")]
    Mismatch(String),
    /// Something failed while setting up or running.
    #[error("{0}")]
    Failed(String),
    /// The peer closed the control connection or asked to stop: the echo of a failure on the
    /// other side rather than a cause here.
    #[error("{0}")]
    PeerGone(String),
}

/// Everything one side knows at the end.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub experiment: Experiment,
    /// This side's role.
    pub side: Side,
    /// The peer's control address.
    pub peer: String,
    /// One per message size, in order.
    pub measurements: Vec<Measurement>,
    /// This side's raw samples per message size, when sampling was asked for.
    pub samples: Vec<(u64, tcpx_affinity::SampleReport)>,
    /// Which NIC each channel of this side used, when the experiment named NICs.
    pub nic_plan: Option<crate::nics::NicPlan>,
}

/// Told about each result as soon as both sides agreed on it, so long runs show progress.
pub trait Progress: Send {
    fn measured(&mut self, m: &Measurement);
}

impl<F: FnMut(&Measurement) + Send> Progress for F {
    fn measured(&mut self, m: &Measurement) {
        self(m)
    }
}

fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

fn seed(size_index: u32, iter: u32, flow: u32) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ (u64::from(size_index) << 40 | u64::from(iter) << 12 | u64::from(flow))
}

/// Counts bytes that differ from the pattern, in parallel blocks.
fn count_wrong(buf: &[u8], seed: u64) -> u64 {
    const BLOCK: usize = 1 << 20;
    buf.par_chunks(BLOCK)
        .enumerate()
        .map(|(i, block)| {
            let base = (i * BLOCK) as u64;
            match verify_pattern(block, seed, base) {
                None => 0,
                Some(first) => block[first..]
                    .iter()
                    .enumerate()
                    .filter(|(j, &b)| b != pattern_byte(seed, base + (first + j) as u64))
                    .count() as u64,
            }
        })
        .sum()
}

fn fill(buf: &mut [u8], seed: u64) {
    const BLOCK: usize = 1 << 20;
    buf.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(i, block)| tcpx_gpu::fill_pattern(block, seed, (i * BLOCK) as u64));
}

/// Pins the calling thread (and so every thread it starts, socket workers included) to a CPU list
/// and puts the previous mask back when dropped, so one experiment's pinning never leaks into the
/// next one run by the same thread.
struct PinGuard {
    previous: Option<tcpx_affinity::CpuSet>,
}

fn pin_side(
    cpus: Option<&tcpx_model::CpuSet>,
) -> Result<(PinGuard, Option<crate::Pinning>), String> {
    let Some(list) = cpus else {
        return Ok((PinGuard { previous: None }, None));
    };
    let set: tcpx_affinity::CpuSet = list.cpus().iter().copied().collect();
    let previous = tcpx_affinity::current_thread_affinity().map_err(|e| e.to_string())?;
    let report = tcpx_affinity::pin_current_thread(&set).map_err(|e| {
        format!("pinning to cpus {list} failed: {e} (this thread may use cpus {previous}; check the list against `nproc` and the cgroup's cpuset)")
    })?;
    Ok((
        PinGuard {
            previous: Some(previous),
        },
        Some(crate::Pinning {
            expected: report.expected.to_string(),
            actual: report.actual.to_string(),
        }),
    ))
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous.take() {
            if let Err(e) = tcpx_affinity::pin_current_thread(&prev) {
                tracing::warn!("could not restore this thread's cpu mask {prev}: {e}");
            }
        }
    }
}

/// Samplers around the timed iterations of one size.
struct SizeSampler(Option<tcpx_affinity::SamplerHandle>);

impl SizeSampler {
    fn start(exp: &Experiment) -> Result<Self, String> {
        match exp.sample_ms {
            None => Ok(SizeSampler(None)),
            Some(ms) => tcpx_affinity::Sampler::start(
                tcpx_affinity::SysRoot::live(),
                Duration::from_millis(ms.into()),
            )
            .map(|h| SizeSampler(Some(h)))
            .map_err(|e| format!("starting the samplers: {e} (is /proc mounted and readable?)")),
        }
    }

    /// Stops sampling; returns the cost summary for `bytes` moved and the raw report.
    fn stop(
        self,
        bytes: u64,
    ) -> Result<(Option<crate::CpuCost>, Option<tcpx_affinity::SampleReport>), String> {
        match self.0 {
            None => Ok((None, None)),
            Some(h) => {
                let r = h
                    .stop()
                    .map_err(|e| format!("stopping the samplers: {e}"))?;
                Ok((
                    Some(crate::CpuCost::from_summary(&r.summary, bytes)),
                    Some(r),
                ))
            }
        }
    }
}

/// Opens the experiment's backend and checks the experiment against it; `sides` is how many
/// sides this process runs (2 for a local run), for the per-process limits.
fn open_transport(exp: &Experiment, sides: u32) -> Result<Arc<dyn Transport>, BenchError> {
    let cfg = SocketConfig {
        socks: exp.socks_per_channel as usize,
        sock_buf: exp.sock_buf.map(|b| b as usize),
        zero_copy_min: exp.zero_copy_min.map(|b| b as usize),
        ..SocketConfig::default()
    };
    use tcpx_transport::registry::{self, Backend, BackendConfig};
    let invalid = |e: tcpx_transport::TransportError| BenchError::Invalid(e.to_string());
    let backend: Backend = exp.transport.name().parse().map_err(invalid)?;
    let config = if backend == Backend::NetPlugin {
        // The plugin's settings come from the experiment, not from whatever this process's
        // environment happens to hold.
        BackendConfig::NetPlugin(
            crate::gpu_mem::netplugin_config(exp).map_err(BenchError::Invalid)?,
        )
    } else {
        BackendConfig::from_env(backend, cfg).map_err(invalid)?
    };
    let t: Arc<dyn Transport> = registry::open(&config, None).map_err(invalid)?;
    exp.validate(Some(&t.limits()))
        .map_err(BenchError::Invalid)?;
    crate::limits::check_process_limits(
        exp,
        sides,
        t.max_comms(),
        crate::limits::open_file_limit(),
    )
    .map_err(BenchError::Invalid)?;
    crate::limits::check_host_memory(exp, sides, crate::limits::mem_available())
        .map_err(BenchError::Invalid)?;
    Ok(t)
}

/// Checks a side's CPU list against the CPUs this process may run on (online and in its
/// cpuset), before anything starts: pinning to a CPU outside it either fails late or silently
/// pins to fewer CPUs.
fn check_side_cpus(exp: &Experiment, side: Side) -> Result<(), BenchError> {
    let (flag, list) = match side {
        Side::Send => ("send-cpus", &exp.send_cpus),
        Side::Recv => ("recv-cpus", &exp.recv_cpus),
    };
    let Some(list) = list else {
        return Ok(());
    };
    let wanted: tcpx_affinity::CpuSet = list.cpus().iter().copied().collect();
    let allowed = tcpx_affinity::current_thread_affinity()
        .map_err(|e| BenchError::Invalid(format!("--{flag}: reading this thread's cpus: {e}")))?;
    let outside = wanted.difference(&allowed);
    if outside.is_empty() {
        return Ok(());
    }
    Err(BenchError::Invalid(format!(
        "--{flag} `{list}`: cpu(s) {outside} are not ones this process may run on here (allowed: {allowed}; see `nproc` and the cgroup's cpuset)"
    )))
}

/// One side's backend, ready for the experiment's memory on this machine.
fn prepare_side(exp: &Experiment, side: Side) -> Result<Arc<dyn Transport>, BenchError> {
    check_side_cpus(exp, side)?;
    crate::gpu_mem::transport_for(exp, side, open_transport(exp, 1)?).map_err(BenchError::Invalid)
}

/// How long a side that cannot run waits for its peer, to tell it why (so that the other
/// machine's operator reads the cause, not a timeout).
const TELL_PEER_WAIT: Duration = Duration::from_secs(5);

/// The server cannot run: if a client connects within [`TELL_PEER_WAIT`], refuse its hello with
/// the reason (best effort).
fn refuse_waiting_client(exp: &Experiment, listener: &TcpListener, e: &BenchError) {
    let wait = TELL_PEER_WAIT.min(exp.timeout());
    let Ok(Some((stream, _))) =
        tcpx_transport::socket::accept_until(listener, Instant::now() + wait)
    else {
        return;
    };
    let Ok(mut ctl) = Control::new(stream, wait) else {
        return;
    };
    if let Ok(Msg::Hello { .. }) = ctl.recv() {
        let _ = ctl.send(&Msg::Refuse {
            reason: format!("the server cannot run experiment '{}': {e}", exp.name),
        });
    }
}

/// The client cannot run: if the server answers within [`TELL_PEER_WAIT`], say hello and then
/// abort with the reason (best effort), so the server stops now instead of at its timeout.
fn abort_server(exp: &Experiment, peer: SocketAddr, e: &BenchError) {
    let wait = TELL_PEER_WAIT.min(exp.timeout());
    let Ok(stream) = connect_retry(peer, &SocketConfig::default(), Instant::now() + wait) else {
        return;
    };
    let Ok(mut ctl) = Control::new(stream, wait) else {
        return;
    };
    let hello = Msg::Hello {
        protocol: PROTOCOL,
        version: version(),
        experiment: exp.clone(),
    };
    if ctl.send(&hello).is_ok() {
        if let Ok(Msg::Welcome) = ctl.recv() {
            let _ = ctl.send(&Msg::Abort {
                reason: format!("the client cannot run experiment '{}': {e}", exp.name),
            });
        }
    }
}

/// One side's running state: where it is, for error messages.
struct Ctx<'a> {
    exp: &'a Experiment,
    peer: String,
    stage: String,
}

impl Ctx<'_> {
    fn fail(&self, what: impl std::fmt::Display) -> BenchError {
        BenchError::Failed(format!(
            "experiment '{}' with peer {} failed {}: {what}",
            self.exp.name, self.peer, self.stage
        ))
    }

    /// `e` (from [`Ctx::fail`]) as the echo of a peer that went away.
    fn gone(&self, e: BenchError) -> BenchError {
        BenchError::PeerGone(e.to_string())
    }

    fn stall(&self) -> Duration {
        self.exp.timeout()
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.stall()
    }
}

/// Reads the next control message, turning an `Abort` from the peer into an error.
fn expect(ctl: &mut Control, ctx: &Ctx<'_>) -> Result<Msg, BenchError> {
    match ctl.recv() {
        Ok(Msg::Abort { reason }) => {
            Err(ctx.gone(ctx.fail(format_args!("the peer stopped: {reason}"))))
        }
        Ok(m) => Ok(m),
        Err(e) => {
            let err = ctx.fail(control_error(&ctl.peer, &e, ctx.exp.timeout_s));
            match e.kind() {
                std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe => Err(ctx.gone(err)),
                _ => Err(err),
            }
        }
    }
}

fn control_error(peer: &str, e: &std::io::Error, timeout: f64) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            format!("peer {peer} closed the control connection (did it exit or crash?)")
        }
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("peer {peer} sent nothing for {timeout} s (is it stuck? raise --timeout for slow runs)")
        }
        _ => format!("control connection with {peer}: {e}"),
    }
}

fn unexpected(ctx: &Ctx<'_>, got: &Msg, wanted: &str) -> BenchError {
    ctx.fail(format_args!(
        "protocol error: expected {wanted}, got {got:?}"
    ))
}

/// Tells the peer why this side stops (best effort), then returns the error.
fn abort(ctl: &mut Control, e: BenchError) -> BenchError {
    let _ = ctl.send(&Msg::Abort {
        reason: e.to_string(),
    });
    e
}

fn sched(exp: &Experiment, size: u64) -> SchedConfig {
    SchedConfig {
        size,
        chunk: exp.chunk_for(size),
        window: exp.window as usize,
        channels: exp.channels as usize,
        assignment: Assignment::RoundRobin,
    }
}

struct SendFlow {
    comms: Vec<Box<dyn SendComm>>,
}

struct RecvFlow {
    comms: Vec<Box<dyn RecvComm>>,
}

/// Runs one iteration of every flow at once; returns the wall time of the slowest and each
/// flow's own time (from the common start to its last byte).
fn run_flows<C: Send>(
    exp: &Experiment,
    flows: &mut [C],
    mrs: &[Vec<MrId>],
    go: impl Fn(&mut C, &[MrId]) -> Result<(), String> + Sync,
) -> Result<(f64, Vec<f64>), String> {
    let t0 = Instant::now();
    let timed = |f: &mut C, m: &[MrId]| go(f, m).map(|()| t0.elapsed().as_secs_f64());
    let per_flow: Vec<f64> = if flows.len() == 1 {
        vec![timed(&mut flows[0], &mrs[0]).map_err(|e| format!("flow {}: {e}", exp.flow_id(0)))?]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = flows
                .iter_mut()
                .zip(mrs)
                .map(|(f, m)| s.spawn(|| timed(f, m)))
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| match h.join() {
                    Ok(r) => r.map_err(|e| format!("flow {}: {e}", exp.flow_id(i as u32))),
                    Err(_) => Err(format!("flow {i}: worker thread panicked")),
                })
                .collect::<Result<Vec<_>, _>>()
        })?
    };
    Ok((t0.elapsed().as_secs_f64(), per_flow))
}

fn measurement(exp: &Experiment, size: u64, send: &SideResult, recv: &SideResult) -> Measurement {
    let bytes = size * u64::from(exp.local_flows());
    Measurement {
        experiment: exp.clone(),
        size,
        chunk: exp.chunk_for(size),
        send: send.summarise(bytes),
        recv: recv.summarise(bytes),
    }
}

/// Binds the control listener, naming the port when it is taken.
pub fn bind_control(addr: SocketAddr) -> Result<TcpListener, BenchError> {
    TcpListener::bind(addr)
        .map_err(|e| BenchError::Failed(listen_error(addr, &e, unprivileged_port_start())))
}

/// The lowest port an ordinary user may listen on (`net.ipv4.ip_unprivileged_port_start`).
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(1024)
}

/// What to tell the user when listening on `addr` failed with `e`.
fn listen_error(addr: SocketAddr, e: &std::io::Error, first_free_port: u16) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "port {} on {} is in use: pick another with --port, or stop what holds it (ss -ltnp 'sport = :{}')",
            addr.port(),
            addr.ip(),
            addr.port()
        ),
        std::io::ErrorKind::PermissionDenied if addr.port() < first_free_port => format!(
            "cannot listen on {addr}: {e}: ports below {first_free_port} need root (or CAP_NET_BIND_SERVICE); pick port {first_free_port} or above with --port"
        ),
        _ => format!("cannot listen on {addr}: {e} (is the address on this machine?)"),
    }
}

/// The receiving side: listens on `listener` for one client and runs the experiment with it.
pub fn run_server(
    exp: &Experiment,
    listener: TcpListener,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    let transport = match prepare_side(exp, Side::Recv) {
        Ok(t) => t,
        Err(e) => {
            refuse_waiting_client(exp, &listener, &e);
            return Err(e);
        }
    };
    let mut ctx = Ctx {
        exp,
        peer: "(not connected yet)".into(),
        stage: "while waiting for the client".into(),
    };
    let (mut ctl, hello) = accept_client(&listener, &ctx)?;
    ctx.peer = ctl.peer.clone();
    ctx.stage = "during the handshake".into();
    let theirs = match hello {
        Msg::Hello {
            protocol,
            version: v,
            experiment,
        } => {
            if protocol != PROTOCOL || v != version() {
                let reason = format!(
                    "version mismatch: this side (server) protocol {PROTOCOL} tcpx-run {}, client protocol {protocol} tcpx-run {v}",
                    version()
                );
                let _ = ctl.send(&Msg::Refuse {
                    reason: reason.clone(),
                });
                return Err(BenchError::Mismatch(reason));
            }
            experiment
        }
        other => return Err(unexpected(&ctx, &other, "hello")),
    };
    let diffs = exp.differences(&theirs);
    if !diffs.is_empty() {
        let reason = format!(
            "experiment '{}': server and client were started with different settings (server vs client):\n  {}",
            exp.name,
            diffs.join("\n  ")
        );
        let _ = ctl.send(&Msg::Refuse {
            reason: reason.clone(),
        });
        return Err(BenchError::Mismatch(reason));
    }
    ctl.send(&Msg::Welcome).map_err(|e| ctx.fail(e))?;
    server_body(exp, &*transport, &mut ctl, &mut ctx, progress).map_err(|e| abort(&mut ctl, e))
}

/// How long an accepted control connection may take to say hello before it is dropped as a
/// stray (a port scan, a health probe): a client sends its hello as soon as it connects.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// Accepts the client: the first connection whose first message is this protocol's `Hello` (or
/// an `Abort` from a client that cannot run). Connections that close, stay silent for
/// [`HELLO_WAIT`] or send something else are dropped with a warning, and the wait goes on until
/// the experiment's timeout.
fn accept_client(listener: &TcpListener, ctx: &Ctx<'_>) -> Result<(Control, Msg), BenchError> {
    let deadline = ctx.deadline();
    loop {
        let stream = match tcpx_transport::socket::accept_until(listener, deadline) {
            Ok(Some((stream, _))) => stream,
            Ok(None) => {
                return Err(ctx.fail(format_args!(
                    "no client connected to {} in time (start the client with --peer pointing here, or raise --timeout)",
                    listener.local_addr().map(|a| a.to_string()).unwrap_or_default()
                )))
            }
            Err(e) => return Err(ctx.fail(format_args!("accepting the client: {e}"))),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = HELLO_WAIT.min(left).max(Duration::from_millis(1));
        let mut ctl = Control::new(stream, wait).map_err(|e| ctx.fail(e))?;
        match ctl.recv() {
            Ok(m @ (Msg::Hello { .. } | Msg::Abort { .. })) => {
                ctl.set_timeout(ctx.stall()).map_err(|e| ctx.fail(e))?;
                let m = match m {
                    Msg::Abort { reason } => {
                        return Err(ctx.gone(BenchError::Failed(format!(
                            "experiment '{}' with peer {} failed during the handshake: the peer stopped: {reason}",
                            ctx.exp.name, ctl.peer
                        ))))
                    }
                    m => m,
                };
                return Ok((ctl, m));
            }
            Ok(other) => tracing::warn!(
                "dropped a connection from {} on the control port: it sent {} instead of a hello",
                ctl.peer,
                other.kind()
            ),
            Err(e) => tracing::warn!(
                "dropped a connection from {} on the control port that does not speak this protocol: {}",
                ctl.peer,
                control_error(&ctl.peer, &e, wait.as_secs_f64())
            ),
        }
    }
}

fn server_body(
    exp: &Experiment,
    transport: &dyn Transport,
    ctl: &mut Control,
    ctx: &mut Ctx<'_>,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    ctx.stage = "while pinning threads".into();
    let (_pin, pinning) = pin_side(exp.recv_cpus.as_ref()).map_err(|e| ctx.fail(e))?;
    ctx.stage = "while choosing NICs".into();
    let nic_plan = crate::nics::plan_nics(exp).map_err(|e| ctx.fail(e))?;
    ctx.stage = "while connecting the data channels".into();
    let mut flows = Vec::new();
    let mut samples = Vec::new();
    for k in 0..exp.local_flows() {
        let flow = exp.flow_id(k);
        let mut listeners = Vec::new();
        for c in 0..exp.channels as usize {
            let l = match &nic_plan {
                Some(p) => transport.listen_on(p.per_flow[k as usize][c].addr),
                None => listen_where_control_arrived(transport, ctl.local),
            };
            listeners.push(l.map_err(|e| ctx.fail(e))?);
        }
        let handles = listeners
            .iter()
            .map(|l| l.handle().as_bytes().to_vec())
            .collect();
        ctl.send(&Msg::Handles { flow, handles })
            .map_err(|e| ctx.fail(e))?;
        let deadline = ctx.deadline();
        let comms = listeners
            .iter_mut()
            .map(|l| l.accept(deadline))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ctx.fail(e))?;
        flows.push(RecvFlow { comms });
    }
    let mut measurements = Vec::new();
    for (si, &size) in exp.sizes.iter().enumerate() {
        let si = si as u32;
        ctx.stage = format!("at size {}", format_size(size));
        let bufs = crate::gpu_mem::Bufs::new(exp, Side::Recv, size).map_err(|e| ctx.fail(e))?;
        let mrs = register(&mut flows, &bufs, |f, m| {
            f.comms.iter_mut().map(|c| c.reg_mr(m)).collect()
        })
        .map_err(|e| ctx.fail(e))?;
        let mut times = Vec::with_capacity(exp.iters as usize);
        let mut flow_times = vec![Vec::with_capacity(exp.iters as usize); bufs.len()];
        let mut spans = Vec::new();
        let mut wrong = 0u64;
        let mut sampler = SizeSampler(None);
        for iter in 0..exp.warmup + exp.iters {
            ctx.stage = format!("at size {}, iteration {iter}", format_size(size));
            if iter == exp.warmup {
                sampler = SizeSampler::start(exp).map_err(|e| ctx.fail(e))?;
            }
            if exp.verify {
                bufs.poison().map_err(|e| ctx.fail(e))?;
            }
            ctl.send(&Msg::Ready {
                size_index: si,
                iter,
            })
            .map_err(|e| ctx.fail(e))?;
            let stall = ctx.stall();
            let started = crate::monotonic_ns();
            let (secs, per_flow) = run_flows(exp, &mut flows, &mrs, |f, m| {
                let mut t =
                    Transfer::new(sched(exp, size), Role::Recv, 0, 0).map_err(|e| e.to_string())?;
                t.run(transport, &mut Comms::Recv(&mut f.comms, m), stall)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| ctx.fail(e))?;
            if exp.verify {
                for flow in 0..bufs.len() {
                    let seed = seed(si, iter, exp.flow_id(flow as u32));
                    wrong += bufs
                        .count_wrong(flow, seed, count_wrong)
                        .map_err(|e| ctx.fail(e))?;
                }
            }
            if iter >= exp.warmup {
                if exp.multi_process {
                    spans.push(crate::MonoSpan::lasting(started, secs));
                }
                times.push(secs);
                for (all, t) in flow_times.iter_mut().zip(per_flow) {
                    all.push(t);
                }
            }
        }
        ctx.stage = format!("at the end of size {}", format_size(size));
        deregister(&mut flows, &mrs, |f, m| {
            f.comms
                .iter_mut()
                .zip(m)
                .try_for_each(|(c, &id)| c.dereg_mr(id))
        })
        .map_err(|e| ctx.fail(e))?;
        let moved = size * u64::from(exp.local_flows()) * u64::from(exp.iters);
        let (cpu, raw) = sampler.stop(moved).map_err(|e| ctx.fail(e))?;
        samples.extend(raw.map(|r| (size, r)));
        let mine = SideResult {
            side: Side::Recv,
            iter_secs: times,
            wrong_bytes: exp.verify.then_some(wrong),
            pinning: pinning.clone(),
            cpu,
            flow_iter_secs: flow_times,
            iter_spans: spans,
        };
        ctl.send(&Msg::Result {
            size_index: si,
            result: mine.clone(),
        })
        .map_err(|e| ctx.fail(e))?;
        let theirs = match expect(ctl, ctx)? {
            Msg::Result { size_index, result } if size_index == si && result.side == Side::Send => {
                result
            }
            other => return Err(unexpected(ctx, &other, "the client's result")),
        };
        let m = measurement(exp, size, &theirs, &mine);
        progress.measured(&m);
        measurements.push(m);
    }
    ctx.stage = "at the end".into();
    ctl.send(&Msg::Bye).map_err(|e| ctx.fail(e))?;
    Ok(Outcome {
        experiment: exp.clone(),
        side: Side::Recv,
        peer: ctx.peer.clone(),
        measurements,
        samples,
        nic_plan,
    })
}

/// A data listener without a NIC plan: on the address the client's control connection arrived
/// at (as iperf3 does), which is an address the client can reach, rather than the backend's
/// default (loopback for kernel sockets). Backends that cannot bind a chosen address listen where
/// they always do.
fn listen_where_control_arrived(
    transport: &dyn Transport,
    local: Option<IpAddr>,
) -> tcpx_transport::Result<Box<dyn tcpx_transport::Listener>> {
    match local {
        Some(ip) if !ip.is_unspecified() => match transport.listen_on(ip) {
            Err(tcpx_transport::TransportError::Unavailable { .. }) => transport.listen(),
            r => r,
        },
        _ => transport.listen(),
    }
}

fn register<F>(
    flows: &mut [F],
    bufs: &crate::gpu_mem::Bufs,
    reg: impl Fn(&mut F, &Memory) -> tcpx_transport::Result<Vec<MrId>>,
) -> tcpx_transport::Result<Vec<Vec<MrId>>> {
    flows
        .iter_mut()
        .enumerate()
        .map(|(i, f)| reg(f, &bufs.memory(i)))
        .collect()
}

fn deregister<F>(
    flows: &mut [F],
    mrs: &[Vec<MrId>],
    dereg: impl Fn(&mut F, &[MrId]) -> tcpx_transport::Result<()>,
) -> tcpx_transport::Result<()> {
    flows.iter_mut().zip(mrs).try_for_each(|(f, m)| dereg(f, m))
}

/// The sending side: connects to the server at `peer` (retrying until the timeout) and runs.
pub fn run_client(
    exp: &Experiment,
    peer: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    let transport = match prepare_side(exp, Side::Send) {
        Ok(t) => t,
        Err(e) => {
            abort_server(exp, peer, &e);
            return Err(e);
        }
    };
    let mut ctx = Ctx {
        exp,
        peer: peer.to_string(),
        stage: "while connecting".into(),
    };
    let stream =
        connect_retry(peer, &SocketConfig::default(), ctx.deadline()).map_err(|e| ctx.fail(e))?;
    let mut ctl = Control::new(stream, ctx.stall()).map_err(|e| ctx.fail(e))?;
    ctx.stage = "during the handshake".into();
    ctl.send(&Msg::Hello {
        protocol: PROTOCOL,
        version: version(),
        experiment: exp.clone(),
    })
    .map_err(|e| ctx.fail(e))?;
    match expect(&mut ctl, &ctx)? {
        Msg::Welcome => {}
        Msg::Refuse { reason } => {
            return Err(BenchError::Mismatch(format!(
                "the server at {peer} refused: {reason}"
            )))
        }
        other => return Err(unexpected(&ctx, &other, "welcome")),
    }
    client_body(exp, &*transport, &mut ctl, &mut ctx, progress).map_err(|e| abort(&mut ctl, e))
}

fn client_body(
    exp: &Experiment,
    transport: &dyn Transport,
    ctl: &mut Control,
    ctx: &mut Ctx<'_>,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    ctx.stage = "while pinning threads".into();
    let (_pin, pinning) = pin_side(exp.send_cpus.as_ref()).map_err(|e| ctx.fail(e))?;
    ctx.stage = "while choosing NICs".into();
    let nic_plan = crate::nics::plan_nics(exp).map_err(|e| ctx.fail(e))?;
    ctx.stage = "while connecting the data channels".into();
    let mut flows = Vec::new();
    let mut samples = Vec::new();
    for k in 0..exp.local_flows() {
        let want = exp.flow_id(k);
        let handles = match expect(ctl, ctx)? {
            Msg::Handles { flow, handles }
                if flow == want && handles.len() == exp.channels as usize =>
            {
                handles
            }
            other => return Err(unexpected(ctx, &other, &format!("handles of flow {want}"))),
        };
        let deadline = ctx.deadline();
        let comms = handles
            .into_iter()
            .enumerate()
            .map(|(c, h)| {
                let h = Handle::from_bytes(h)?;
                match &nic_plan {
                    Some(p) => transport.connect_from(&h, p.per_flow[k as usize][c].addr, deadline),
                    None => transport.connect(&h, deadline),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ctx.fail(e))?;
        flows.push(SendFlow { comms });
    }
    let mut measurements = Vec::new();
    for (si, &size) in exp.sizes.iter().enumerate() {
        let si = si as u32;
        ctx.stage = format!("at size {}", format_size(size));
        let bufs = crate::gpu_mem::Bufs::new(exp, Side::Send, size).map_err(|e| ctx.fail(e))?;
        let mrs = register(&mut flows, &bufs, |f, m| {
            f.comms.iter_mut().map(|c| c.reg_mr(m)).collect()
        })
        .map_err(|e| ctx.fail(e))?;
        let mut times = Vec::with_capacity(exp.iters as usize);
        let mut flow_times = vec![Vec::with_capacity(exp.iters as usize); bufs.len()];
        let mut spans = Vec::new();
        let mut sampler = SizeSampler(None);
        for iter in 0..exp.warmup + exp.iters {
            ctx.stage = format!("at size {}, iteration {iter}", format_size(size));
            if iter == exp.warmup {
                sampler = SizeSampler::start(exp).map_err(|e| ctx.fail(e))?;
            }
            if exp.verify {
                for flow in 0..bufs.len() {
                    let seed = seed(si, iter, exp.flow_id(flow as u32));
                    bufs.fill(flow, seed, fill).map_err(|e| ctx.fail(e))?;
                }
            }
            match expect(ctl, ctx)? {
                Msg::Ready {
                    size_index,
                    iter: i,
                } if size_index == si && i == iter => {}
                other => {
                    return Err(unexpected(
                        ctx,
                        &other,
                        &format!("ready for iteration {iter}"),
                    ))
                }
            }
            let stall = ctx.stall();
            let started = crate::monotonic_ns();
            let (secs, per_flow) = run_flows(exp, &mut flows, &mrs, |f, m| {
                let mut t =
                    Transfer::new(sched(exp, size), Role::Send, 0, 0).map_err(|e| e.to_string())?;
                t.run(transport, &mut Comms::Send(&mut f.comms, m), stall)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| ctx.fail(e))?;
            if iter >= exp.warmup {
                if exp.multi_process {
                    spans.push(crate::MonoSpan::lasting(started, secs));
                }
                times.push(secs);
                for (all, t) in flow_times.iter_mut().zip(per_flow) {
                    all.push(t);
                }
            }
        }
        ctx.stage = format!("at the end of size {}", format_size(size));
        deregister(&mut flows, &mrs, |f, m| {
            f.comms
                .iter_mut()
                .zip(m)
                .try_for_each(|(c, &id)| c.dereg_mr(id))
        })
        .map_err(|e| ctx.fail(e))?;
        let theirs = match expect(ctl, ctx)? {
            Msg::Result { size_index, result } if size_index == si && result.side == Side::Recv => {
                result
            }
            other => return Err(unexpected(ctx, &other, "the server's result")),
        };
        let moved = size * u64::from(exp.local_flows()) * u64::from(exp.iters);
        let (cpu, raw) = sampler.stop(moved).map_err(|e| ctx.fail(e))?;
        samples.extend(raw.map(|r| (size, r)));
        let mine = SideResult {
            side: Side::Send,
            iter_secs: times,
            wrong_bytes: None,
            pinning: pinning.clone(),
            cpu,
            flow_iter_secs: flow_times,
            iter_spans: spans,
        };
        ctl.send(&Msg::Result {
            size_index: si,
            result: mine.clone(),
        })
        .map_err(|e| ctx.fail(e))?;
        let m = measurement(exp, size, &mine, &theirs);
        progress.measured(&m);
        measurements.push(m);
    }
    ctx.stage = "at the end".into();
    match expect(ctl, ctx)? {
        Msg::Bye => {}
        other => return Err(unexpected(ctx, &other, "bye")),
    }
    Ok(Outcome {
        experiment: exp.clone(),
        side: Side::Send,
        peer: ctx.peer.clone(),
        measurements,
        samples,
        nic_plan,
    })
}

/// Both sides in one process over loopback (`bind` picks the address, port 0 a free one).
/// Returns the client's outcome; the server's agrees with it by construction of the protocol.
pub fn run_local(
    exp: &Experiment,
    bind: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    // Check first so a bad value is reported once, not by both threads.
    open_transport(exp, 2)?;
    check_side_cpus(exp, Side::Send)?;
    check_side_cpus(exp, Side::Recv)?;
    crate::gpu_mem::check_gpu_count(exp, Side::Send).map_err(BenchError::Invalid)?;
    crate::gpu_mem::check_gpu_count(exp, Side::Recv).map_err(BenchError::Invalid)?;
    let listener = bind_control(bind)?;
    let addr = listener
        .local_addr()
        .map_err(|e| BenchError::Failed(e.to_string()))?;
    std::thread::scope(|s| {
        let server = std::thread::Builder::new()
            .name("tcpx-local-server".into())
            .spawn_scoped(s, move || {
                run_server(exp, listener, &mut |_: &Measurement| {})
            })
            .map_err(|e| BenchError::Failed(format!("starting the local server thread: {e}")))?;
        let client = run_client(exp, addr, progress);
        let server = server
            .join()
            .map_err(|_| BenchError::Failed("the local server thread panicked".into()))?;
        match (client, server) {
            (Ok(c), Ok(_)) => Ok(c),
            // The side that failed first has the more useful message.
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            (Err(c), Err(srv)) => Err(match c {
                BenchError::PeerGone(_) => srv,
                c => c,
            }),
        }
    })
}

#[cfg(test)]
mod listen_error_tests {
    use super::*;

    #[test]
    fn a_privileged_port_says_so_instead_of_blaming_the_address() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let m = listen_error(addr, &denied, 1024);
        assert!(m.contains("below 1024 need root"), "{m}");
        assert!(!m.contains("is the address on this machine"), "{m}");
        let high: SocketAddr = "127.0.0.1:5299".parse().unwrap();
        let m = listen_error(high, &denied, 1024);
        assert!(m.contains("is the address on this machine"), "{m}");
        let busy = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        assert!(listen_error(high, &busy, 1024).contains("in use"));
    }
}
