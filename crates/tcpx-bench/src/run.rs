//! The two roles of an experiment and the in-process pairing of both (`local`): the driver of the
//! protocol machines of [`crate::proto`] (the control connection, its deadlines) and the local
//! steps they ask for (the backend, pinning, listeners and connections, buffers, transfers), one
//! `Worker` for either side.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tcpx_gpu::{pattern_byte, verify_pattern};
use tcpx_sched::nic::NodePlaces;
use tcpx_sched::{Assignment, Role, SchedConfig};
use tcpx_transport::driver::{Comms, Transfer};
use tcpx_transport::registry::BackendEnv;
use tcpx_transport::socket::{connect_retry, SocketConfig};
use tcpx_transport::{Handle, Memory, MrId, RecvComm, SendComm, Transport};

use crate::control::Control;
pub use crate::proto::BenchError;
use crate::proto::{self, Action, Event, Machine, Msg};
use crate::{Experiment, Measurement, Side, SideResult};

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

/// Opens the experiment's backend with this process's settings `backends`, given `gpu` for GPU
/// memory, and checks the experiment against it; `sides` is how many sides this process runs (2
/// for a local run), for the per-process limits.
fn open_transport(
    exp: &Experiment,
    backends: &BackendEnv,
    sides: u32,
    gpu: Option<tcpx_gpu::Device>,
) -> Result<Arc<dyn Transport>, BenchError> {
    let config = tcpx_transport::registry::BackendConfig::for_experiment(exp, backends)
        .map_err(BenchError::Invalid)?;
    let gpu = gpu.map(|device| tcpx_transport::registry::GpuMemory {
        device,
        staging_ring: Some(exp.staging_ring_bytes() as usize),
    });
    let t: Arc<dyn Transport> = tcpx_transport::registry::open(&config, gpu)
        .map_err(|e| BenchError::Invalid(e.to_string()))?;
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
fn prepare_side(
    exp: &Experiment,
    backends: &BackendEnv,
    side: Side,
) -> Result<Arc<dyn Transport>, BenchError> {
    check_side_cpus(exp, side)?;
    let gpu = crate::gpu_mem::side_gpu(exp, side).map_err(BenchError::Invalid)?;
    open_transport(exp, backends, 1, gpu)
}

fn sched(exp: &Experiment, size: u64) -> SchedConfig {
    SchedConfig {
        size,
        chunk: exp.chunk_for(size),
        window: exp.window_for(size) as usize,
        channels: exp.channels as usize,
        assignment: Assignment::RoundRobin,
    }
}

/// One iteration's times: the slowest flow's, and each flow's own.
struct LapTimes {
    slowest: f64,
    per_flow: Vec<f64>,
}

/// Runs the iterations of one transfer of every flow at once (`go` moves one flow's and says
/// when each of its iterations ended); returns each iteration's times. A flow's iteration
/// lasts from its previous iteration's end (the first: from the common start) to its last
/// byte; the slowest's, from the previous iteration's end on every flow to the end of this
/// one on every flow. With one iteration: the wall time of the slowest and each flow's time.
fn run_flows<C: Send>(
    exp: &Experiment,
    flows: &mut [C],
    mrs: &[Vec<MrId>],
    go: impl Fn(&mut C, &[MrId]) -> Result<Vec<Instant>, String> + Sync,
) -> Result<Vec<LapTimes>, String> {
    let t0 = Instant::now();
    let ends: Vec<Vec<Instant>> = if flows.len() == 1 {
        vec![go(&mut flows[0], &mrs[0]).map_err(|e| format!("flow {}: {e}", exp.flow_id(0)))?]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = flows
                .iter_mut()
                .zip(mrs)
                .map(|(f, m)| s.spawn(|| go(f, m)))
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
    Ok(lap_times(t0, &ends))
}

/// Each iteration's times from every flow's iteration ends ([`run_flows`]).
fn lap_times(t0: Instant, ends: &[Vec<Instant>]) -> Vec<LapTimes> {
    let laps = ends.iter().map(Vec::len).min().unwrap_or(0);
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    let all_done = |lap: usize| ends.iter().map(|e| e[lap]).max().unwrap_or(t0);
    (0..laps)
        .map(|lap| {
            let before = |e: &Vec<Instant>| if lap == 0 { t0 } else { e[lap - 1] };
            let all_before = if lap == 0 { t0 } else { all_done(lap - 1) };
            LapTimes {
                slowest: secs(all_before, all_done(lap)),
                per_flow: ends.iter().map(|e| secs(before(e), e[lap])).collect(),
            }
        })
        .collect()
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

/// This side's local work: the steps its protocol machine asks for, carried out on the calling
/// thread (pinning applies to it and the threads it starts).
struct Worker<'a> {
    exp: &'a Experiment,
    /// This process's backend settings, read from its environment by the binary.
    backends: &'a BackendEnv,
    /// NIC and GPU places the caller gave (an emulated fabric node).
    places: Option<&'a NodePlaces>,
    side: Side,
    transport: Option<Arc<dyn Transport>>,
    /// This side's address of the control connection (where the peer reached it).
    local: Option<IpAddr>,
    _pin: Option<PinGuard>,
    pinning: Option<crate::Pinning>,
    nic_plan: Option<crate::nics::NicPlan>,
    /// The listeners of the flow being connected (server).
    listeners: Vec<Box<dyn tcpx_transport::Listener>>,
    send_flows: Vec<Vec<Box<dyn SendComm>>>,
    recv_flows: Vec<Vec<Box<dyn RecvComm>>>,
    size: Option<SizeRun>,
    samples: Vec<(u64, tcpx_affinity::SampleReport)>,
}

/// What one message size holds while it runs.
struct SizeRun {
    size: u64,
    bufs: crate::gpu_mem::Bufs,
    mrs: Vec<Vec<MrId>>,
    times: Vec<f64>,
    flow_times: Vec<Vec<f64>>,
    spans: Vec<crate::MonoSpan>,
    wrong: u64,
    sampler: SizeSampler,
    /// The comms' per-socket payload counters before the first timed iteration
    /// ([`Worker::socket_counts`]); `None` until then.
    sockets_before: Option<SocketCounts>,
}

/// Per flow, per channel: each socket's counters so far (`None`: the backend does not count).
type SocketCounts = Vec<Vec<Option<Vec<tcpx_transport::SocketStat>>>>;

/// What each socket moved between `before` and `after`, labelled with its flow, channel and NIC.
fn socket_bytes(
    exp: &Experiment,
    nic_plan: Option<&crate::nics::NicPlan>,
    before: &SocketCounts,
    after: &SocketCounts,
) -> Vec<crate::sockets::SocketBytes> {
    let mut out = Vec::new();
    for (k, (b_flow, a_flow)) in before.iter().zip(after).enumerate() {
        for (c, (b, a)) in b_flow.iter().zip(a_flow).enumerate() {
            let (Some(b), Some(a)) = (b, a) else { continue };
            let nic = nic_plan
                .and_then(|p| p.per_flow.get(k))
                .and_then(|f| f.get(c))
                .map(|n| n.name.clone());
            for (i, (b, a)) in b.iter().zip(a).enumerate() {
                out.push(crate::sockets::SocketBytes {
                    id: crate::sockets::SocketId {
                        flow: exp.flow_id(k as u32),
                        channel: c as u32,
                        socket: i as u32,
                        nic: nic.clone(),
                    },
                    bytes: a.bytes.saturating_sub(b.bytes),
                    busy_ns: a.busy_ns.saturating_sub(b.busy_ns),
                    pieces: a.pieces.saturating_sub(b.pieces),
                    calls: a.calls.saturating_sub(b.calls),
                    blocked_calls: a.blocked_calls.saturating_sub(b.blocked_calls),
                    waits: a.waits.saturating_sub(b.waits),
                    around_cache_bytes: a.around_cache_bytes.saturating_sub(b.around_cache_bytes),
                    cpu: a.cpu,
                });
            }
        }
    }
    out
}

impl<'a> Worker<'a> {
    fn new(exp: &'a Experiment, env: &'a SideEnv, side: Side) -> Self {
        Worker {
            exp,
            backends: &env.backends,
            places: env.places.as_ref(),
            side,
            transport: None,
            local: None,
            _pin: None,
            pinning: None,
            nic_plan: None,
            listeners: Vec::new(),
            send_flows: Vec::new(),
            recv_flows: Vec::new(),
            size: None,
            samples: Vec::new(),
        }
    }

    fn transport(&self) -> Result<&dyn Transport, String> {
        self.transport
            .as_deref()
            .ok_or_else(|| "internal: the backend is not open".to_string())
    }

    /// Every comm's per-socket payload counters now ([`SendComm::socket_stats`]).
    fn socket_counts(&self) -> SocketCounts {
        match self.side {
            Side::Send => self
                .send_flows
                .iter()
                .map(|f| f.iter().map(|c| c.socket_stats()).collect())
                .collect(),
            Side::Recv => self
                .recv_flows
                .iter()
                .map(|f| f.iter().map(|c| c.socket_stats()).collect())
                .collect(),
        }
    }

    fn size_run(&mut self) -> Result<&mut SizeRun, String> {
        self.size
            .as_mut()
            .ok_or_else(|| "internal: no message size is open".to_string())
    }

    /// [`Action::AcceptData`] while watching the control connection: the accepts run on a
    /// thread of their own, and a message or the end of the connection (a client that aborts or
    /// exits after the welcome) ends the wait at once with that event, instead of the accept
    /// timing out at `deadline`. An abandoned accept ends by its own deadline.
    fn accept_data_watching(&mut self, ctl: &mut Control, deadline: Instant) -> Event {
        let listeners = std::mem::take(&mut self.listeners);
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tcpx-accept-data".into())
            .spawn(move || {
                // The receiver is gone when the peer ended the wait first.
                let _ = tx.send(accept_all(listeners, deadline));
            });
        if let Err(e) = spawned {
            return Event::Failed(format!(
                "starting the thread that accepts the data channels: {e}"
            ));
        }
        // The accepts end by `deadline` themselves; this bounds the wait should a backend's
        // accept overrun it.
        let backstop = deadline + ACCEPT_OVERRUN;
        loop {
            match rx.recv_timeout(CONTROL_WATCH) {
                Ok(Ok(comms)) => {
                    self.recv_flows.push(comms);
                    return Event::Done;
                }
                Ok(Err(e)) => return Event::Failed(e),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Event::Failed(
                        "the thread that accepts the data channels panicked".into(),
                    )
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            match ctl.readable_now() {
                Ok(false) => {}
                Ok(true) => {
                    let read_by = Instant::now() + self.exp.timeout();
                    return match read(Some(ctl), Some(read_by)) {
                        Event::Timeout => Event::ControlFailed(format!(
                            "a control message from {} was cut off",
                            ctl.peer
                        )),
                        event => event,
                    };
                }
                Err(e) => return Event::ControlFailed(e.to_string()),
            }
            if Instant::now() >= backstop {
                return Event::Failed(format!(
                    "accepting the data channels went on {} s past its deadline (is the backend stuck?)",
                    ACCEPT_OVERRUN.as_secs()
                ));
            }
        }
    }

    /// Carries out one local step; `Err` is reported as [`Event::Failed`].
    fn step(&mut self, action: Action) -> Result<Event, String> {
        let exp = self.exp;
        match action {
            Action::Prepare => Ok(Event::Prepared(
                match prepare_side(exp, self.backends, self.side) {
                    Ok(t) => {
                        self.transport = Some(t);
                        Ok(())
                    }
                    Err(BenchError::Invalid(why)) => Err(why),
                    Err(e) => Err(e.to_string()),
                },
            )),
            Action::Pin => {
                let (guard, pinning) = pin_side(exp.cpus(self.side))?;
                self._pin = Some(guard);
                self.pinning = pinning;
                Ok(Event::Done)
            }
            Action::PlanNics => {
                self.nic_plan = crate::nics::plan_nics(exp, self.places)?;
                Ok(Event::Done)
            }
            Action::Listen { flow } => {
                let transport = self.transport()?;
                let listeners = (0..exp.channels as usize)
                    .map(|c| match &self.nic_plan {
                        Some(p) => transport.listen_on(p.per_flow[flow as usize][c].addr),
                        None => listen_where_control_arrived(transport, self.local),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let handles = listeners
                    .iter()
                    .map(|l| l.handle().as_bytes().to_vec())
                    .collect();
                self.listeners = listeners;
                Ok(Event::Listening { handles })
            }
            Action::AcceptData { deadline, .. } => {
                let comms = accept_all(std::mem::take(&mut self.listeners), deadline)?;
                self.recv_flows.push(comms);
                Ok(Event::Done)
            }
            Action::ConnectData {
                flow,
                handles,
                deadline,
            } => {
                let transport = self.transport()?;
                let comms = handles
                    .into_iter()
                    .enumerate()
                    .map(|(c, h)| {
                        let h = Handle::from_bytes(h)?;
                        match &self.nic_plan {
                            Some(p) => transport.connect_from(
                                &h,
                                p.per_flow[flow as usize][c].addr,
                                deadline,
                            ),
                            None => transport.connect(&h, deadline),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                self.send_flows.push(comms);
                Ok(Event::Done)
            }
            Action::OpenSize { size_index } => {
                let size = exp.sizes[size_index as usize];
                let bufs = crate::gpu_mem::Bufs::new(exp, self.side, size)?;
                let mrs = match self.side {
                    Side::Send => register(&mut self.send_flows, &bufs, |f, m| {
                        f.iter_mut().map(|c| c.reg_mr(m)).collect()
                    }),
                    Side::Recv => register(&mut self.recv_flows, &bufs, |f, m| {
                        f.iter_mut().map(|c| c.reg_mr(m)).collect()
                    }),
                }
                .map_err(|e| e.to_string())?;
                let iters = exp.iters as usize;
                // The timing vectors are reserved fallibly, like the buffers.
                let reserve = || -> Result<Vec<f64>, String> {
                    let mut v = Vec::new();
                    v.try_reserve_exact(iters).map_err(|e| {
                        format!(
                            "reserving the timings of {iters} iterations: {e} ({})",
                            crate::limits::host_memory_limits()
                        )
                    })?;
                    Ok(v)
                };
                let flow_times = (0..bufs.len())
                    .map(|_| reserve())
                    .collect::<Result<_, _>>()?;
                self.size = Some(SizeRun {
                    size,
                    flow_times,
                    bufs,
                    mrs,
                    times: reserve()?,
                    spans: Vec::new(),
                    wrong: 0,
                    sampler: SizeSampler(None),
                    sockets_before: None,
                });
                Ok(Event::Done)
            }
            Action::StartIteration { size_index, iter } => {
                let side = self.side;
                let counts = (iter == exp.warmup).then(|| self.socket_counts());
                let run = self.size_run()?;
                if iter == exp.warmup {
                    run.sampler = SizeSampler::start(exp)?;
                    run.sockets_before = counts;
                }
                if exp.verify {
                    match side {
                        Side::Recv => run.bufs.poison()?,
                        Side::Send => {
                            for flow in 0..run.bufs.len() {
                                let seed = seed(size_index, iter, exp.flow_id(flow as u32));
                                run.bufs.fill(flow, seed, fill)?;
                            }
                        }
                    }
                }
                Ok(Event::Done)
            }
            Action::Transfer {
                size_index,
                iter,
                laps,
                stall,
            } => {
                let run = self
                    .size
                    .as_mut()
                    .ok_or("internal: no message size is open")?;
                let sched = sched(exp, run.size);
                let transport = self.transport.as_deref().ok_or("internal: no backend")?;
                let started = crate::monotonic_ns();
                let move_flow = |role: Role, comms: &mut Comms<'_>| {
                    let mut t = Transfer::repeated(sched.clone(), role, 0, 0, u64::from(laps))
                        .map_err(|e| e.to_string())?;
                    t.run(transport, comms, stall).map_err(|e| e.to_string())?;
                    t.lap_ends()
                        .iter()
                        .map(|e| e.ok_or_else(|| "internal: an iteration never ended".to_string()))
                        .collect::<Result<Vec<Instant>, String>>()
                };
                let lap_times = match self.side {
                    Side::Send => run_flows(exp, &mut self.send_flows, &run.mrs, |f, m| {
                        move_flow(Role::Send, &mut Comms::Send(f, m))
                    }),
                    Side::Recv => run_flows(exp, &mut self.recv_flows, &run.mrs, |f, m| {
                        move_flow(Role::Recv, &mut Comms::Recv(f, m))
                    }),
                }?;
                if exp.verify && self.side == Side::Recv {
                    for flow in 0..run.bufs.len() {
                        let seed = seed(size_index, iter, exp.flow_id(flow as u32));
                        run.wrong += run.bufs.count_wrong(flow, seed, count_wrong)?;
                    }
                }
                if iter >= exp.warmup {
                    let mut at = started;
                    for lap in lap_times {
                        if exp.multi_process {
                            run.spans.push(crate::MonoSpan::lasting(at, lap.slowest));
                        }
                        at += (lap.slowest * 1e9) as u64;
                        run.times.push(lap.slowest);
                        for (all, t) in run.flow_times.iter_mut().zip(lap.per_flow) {
                            all.push(t);
                        }
                    }
                }
                Ok(Event::Done)
            }
            Action::CloseSize { .. } => {
                let run = self
                    .size
                    .as_ref()
                    .ok_or("internal: no message size is open")?;
                match self.side {
                    Side::Send => deregister(&mut self.send_flows, &run.mrs, |f, m| {
                        f.iter_mut().zip(m).try_for_each(|(c, &id)| c.dereg_mr(id))
                    }),
                    Side::Recv => deregister(&mut self.recv_flows, &run.mrs, |f, m| {
                        f.iter_mut().zip(m).try_for_each(|(c, &id)| c.dereg_mr(id))
                    }),
                }
                .map_err(|e| e.to_string())?;
                Ok(Event::Done)
            }
            Action::Summarise { .. } => {
                let run = self
                    .size
                    .take()
                    .ok_or("internal: no message size is open")?;
                let moved = run.size * u64::from(exp.local_flows()) * u64::from(exp.iters);
                let (cpu, raw) = run.sampler.stop(moved)?;
                let socket_bytes = match &run.sockets_before {
                    Some(before) => {
                        socket_bytes(exp, self.nic_plan.as_ref(), before, &self.socket_counts())
                    }
                    None => Vec::new(),
                };
                self.samples.extend(raw.map(|r| (run.size, r)));
                Ok(Event::Summarised(Box::new(SideResult {
                    side: self.side,
                    iter_secs: run.times,
                    wrong_bytes: (exp.verify && self.side == Side::Recv).then_some(run.wrong),
                    pinning: self.pinning.clone(),
                    cpu,
                    flow_iter_secs: run.flow_times,
                    iter_spans: run.spans,
                    socket_bytes,
                })))
            }
            other => Err(format!("internal: {other:?} is not a local step")),
        }
    }
}

/// Accepts the data connections of one flow by `deadline`: every channel's accept at once, as
/// NCCL progresses its connections (a plugin's accept can take seconds of its own: Google's
/// GPUDirect-TCPX sleeps 5 s after each, for flow steering, and channel after channel that added
/// up past the deadline).
fn accept_all(
    mut listeners: Vec<Box<dyn tcpx_transport::Listener>>,
    deadline: Instant,
) -> Result<Vec<Box<dyn RecvComm>>, String> {
    std::thread::scope(|s| {
        let waits: Vec<_> = listeners
            .iter_mut()
            .map(|l| s.spawn(move || l.accept(deadline)))
            .collect();
        waits
            .into_iter()
            .enumerate()
            .map(|(c, w)| {
                w.join().unwrap_or_else(|_| {
                    Err(tcpx_transport::TransportError::Failed(format!(
                        "the accept of channel {c} panicked"
                    )))
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(|e| e.to_string())
}

/// How often a wait on something else (the data accepts, the greetings of the control port's
/// connections) looks at the control connection or the listener.
const CONTROL_WATCH: Duration = Duration::from_millis(20);

/// How long past its deadline the driver waits for a backend's data accept to return.
const ACCEPT_OVERRUN: Duration = Duration::from_secs(5);

/// Where this side's control connection comes from.
enum Rendezvous<'l> {
    /// Server: clients connect here.
    Listen(&'l TcpListener),
    /// Client: the server listens there.
    Connect(SocketAddr),
}

/// Carries out a machine's actions and feeds it what happened until it is over: the one driver
/// of both sides. Returns the measurements the machine agreed on with its peer.
fn drive<M: Machine>(
    machine: &mut M,
    mut actions: Vec<Action>,
    worker: &mut Worker<'_>,
    rendezvous: Rendezvous<'_>,
    progress: &mut dyn Progress,
) -> Result<Vec<Measurement>, BenchError> {
    let exp = worker.exp;
    let mut ctl: Option<Control> = None;
    let mut events = std::collections::VecDeque::new();
    let mut measurements = Vec::new();
    loop {
        let mut step = None;
        for action in actions.drain(..) {
            match action {
                Action::Send(msg) => {
                    let sent = match ctl.as_mut() {
                        Some(c) => c.send(&msg).map_err(|e| e.to_string()),
                        None => Err("internal: no control connection to send on".into()),
                    };
                    if let Err(e) = sent {
                        events.push_back(Event::Failed(e));
                        break;
                    }
                }
                Action::Measured(m) => {
                    progress.measured(&m);
                    measurements.push(*m);
                }
                Action::AcceptClient { deadline } => {
                    let Rendezvous::Listen(listener) = rendezvous else {
                        events.push_back(Event::Failed("internal: a client cannot accept".into()));
                        break;
                    };
                    match accept_client(listener, deadline, exp.timeout()) {
                        Ok(Some((c, first))) => {
                            worker.local = c.local;
                            events.push_back(Event::Connected {
                                peer: c.peer.clone(),
                            });
                            events.push_back(Event::Received(first));
                            ctl = Some(c);
                        }
                        Ok(None) => events.push_back(Event::Timeout),
                        Err(e) => events.push_back(Event::Failed(e)),
                    }
                }
                Action::Connect { deadline } => {
                    let Rendezvous::Connect(peer) = rendezvous else {
                        events.push_back(Event::Failed("internal: a server cannot connect".into()));
                        break;
                    };
                    let connected = connect_retry(peer, &SocketConfig::default(), deadline)
                        .map_err(|e| e.to_string())
                        .and_then(|s| Control::new(s, exp.timeout()).map_err(|e| e.to_string()));
                    match connected {
                        Ok(c) => {
                            worker.local = c.local;
                            ctl = Some(c);
                            events.push_back(Event::Connected {
                                peer: peer.to_string(),
                            });
                        }
                        Err(e) => events.push_back(Event::Failed(e)),
                    }
                }
                other => step = Some(other),
            }
        }
        if events.is_empty() {
            if let Some(outcome) = machine.outcome() {
                return outcome.clone().map(|()| measurements);
            }
            match step.take() {
                Some(Action::AcceptData { flow, deadline }) => {
                    events.push_back(match ctl.as_mut() {
                        Some(c) => worker.accept_data_watching(c, deadline),
                        None => worker
                            .step(Action::AcceptData { flow, deadline })
                            .unwrap_or_else(Event::Failed),
                    })
                }
                Some(s) => events.push_back(worker.step(s).unwrap_or_else(Event::Failed)),
                None => events.push_back(read(ctl.as_mut(), machine.poll_timeout())),
            }
        }
        let Some(event) = events.pop_front() else {
            continue;
        };
        let mut now = Instant::now();
        if event == Event::Timeout {
            // The socket or the accept loop said the wait is over: it is, for the machine too.
            now = now.max(machine.poll_timeout().unwrap_or(now));
        }
        actions = machine.handle(event, now);
    }
}

/// Reads the next control message, waiting until `deadline`.
fn read(ctl: Option<&mut Control>, deadline: Option<Instant>) -> Event {
    let (Some(ctl), Some(deadline)) = (ctl, deadline) else {
        return Event::ControlFailed(
            "internal: the protocol waits for a message with no connection or no deadline".into(),
        );
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Event::Timeout;
    }
    if let Err(e) = ctl.set_read_timeout(left) {
        return Event::ControlFailed(e.to_string());
    }
    match ctl.recv() {
        Ok(m) => Event::Received(m),
        Err(e) => match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => Event::Closed,
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Event::Timeout,
            _ => Event::ControlFailed(e.to_string()),
        },
    }
}

/// Why a stray connection on the control port was dropped.
fn stray_error(peer: &str, e: &std::io::Error, wait: Duration) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            format!("peer {peer} closed the control connection (did it exit or crash?)")
        }
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("peer {peer} sent nothing for {} s", wait.as_secs_f64())
        }
        _ => format!("control connection with {peer}: {e}"),
    }
}

/// How long an accepted control connection may take to say hello before it is dropped as a
/// stray (a port scan, a health probe): a client sends its hello as soon as it connects.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// How many accepted control connections may be waited on for their hello at once; beyond it
/// the oldest is closed, so silent strangers can neither hold up the client nor pile up.
const MAX_UNIDENTIFIED: usize = 8;

/// Reads the first message of an accepted control connection within `wait`: the connection and
/// that message when it is this protocol's `Hello` (or an `Abort` from a client that cannot
/// run), else why the connection is dropped.
fn greet(
    stream: std::net::TcpStream,
    wait: Duration,
    heard: &AtomicBool,
) -> Result<(Control, Msg), String> {
    // Whether anything arrives is told before it is read: see `Unidentified::spoke`.
    let mut byte = [0u8; 1];
    if stream.set_read_timeout(Some(wait)).is_ok() && matches!(stream.peek(&mut byte), Ok(1)) {
        heard.store(true, Ordering::Release);
    }
    let mut ctl = Control::new(stream, wait).map_err(|e| format!(": {e}"))?;
    match ctl.recv() {
        Ok(m @ (Msg::Hello { .. } | Msg::Abort { .. })) => Ok((ctl, m)),
        Ok(other) => Err(format!(": it sent {} instead of a hello", other.kind())),
        Err(e) => Err(format!(
            " that does not speak this protocol: {}",
            stray_error(&ctl.peer, &e, wait)
        )),
    }
}

/// A control connection whose first message is awaited on a thread of its own.
struct Unidentified {
    id: u64,
    peer: String,
    /// Another handle on the connection, to close it (which ends its thread's read).
    stream: std::net::TcpStream,
    /// When it was accepted: its whole greeting has [`HELLO_WAIT`].
    since: Instant,
    /// Set by its greeting thread once bytes arrived, before it reads them.
    heard: Arc<AtomicBool>,
}

impl Unidentified {
    /// Whether it has sent anything: bytes wait on the socket, or its greeting thread saw them
    /// (and may be reading them). The thread sets the flag before it reads, so no hello is
    /// missed between the two.
    fn spoke(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        if self.heard.load(Ordering::Acquire) {
            return true;
        }
        let mut byte = [0u8; 1];
        matches!(
            recv(
                self.stream.as_raw_fd(),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
            ),
            Ok(1)
        )
    }

    fn drop_because(self, why: &str) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        tracing::warn!(
            "dropped a connection from {} on the control port: {why}",
            self.peer
        );
    }
}

/// Accepts the client: the first connection whose first message is this protocol's `Hello` (or
/// an `Abort` from a client that cannot run), with that message. Every connection is greeted on
/// a thread of its own, so strangers that stay silent do not delay the client; at most
/// [`MAX_UNIDENTIFIED`] are greeted at once. Connections that close, stay silent for
/// [`HELLO_WAIT`], send something else or are still unidentified when the client is found are
/// dropped with a warning, and the wait goes on until `deadline` (`None`: no client came).
fn accept_client(
    listener: &TcpListener,
    deadline: Instant,
    stall: Duration,
) -> Result<Option<(Control, Msg)>, String> {
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("accepting the client: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut pending: std::collections::VecDeque<Unidentified> = Default::default();
    let drop_all = |pending: &mut std::collections::VecDeque<Unidentified>, why: &str| {
        for u in pending.drain(..) {
            u.drop_because(why);
        }
    };
    let mut next_id = 0u64;
    loop {
        // Take every connection waiting now.
        loop {
            let (stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    drop_all(&mut pending, "the control port failed");
                    return Err(format!("accepting the client: {e}"));
                }
            };
            let peer = from.to_string();
            // Greetings already read come first: a connection that said hello is never closed
            // for a newcomer that has not (the greeting threads may be ahead of this loop).
            while let Ok((id, greeted)) = rx.try_recv() {
                if let Some(found) = settle(&mut pending, id, greeted, stall)? {
                    return Ok(Some(found));
                }
            }
            if pending.len() >= MAX_UNIDENTIFIED {
                // The oldest that has sent nothing goes; one whose hello is on its way (bytes
                // waiting, or being read) only when every one has spoken.
                let at = pending.iter().position(|u| !u.spoke()).unwrap_or(0);
                if let Some(oldest) = pending.remove(at) {
                    oldest.drop_because(&format!(
                        "it had not said hello, and at most {MAX_UNIDENTIFIED} connections that have not said hello are held at once"
                    ));
                }
            }
            let handle = stream
                .set_nonblocking(false)
                .and_then(|()| stream.try_clone());
            let handle = match handle {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!("dropped a connection from {peer} on the control port: {e}");
                    continue;
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = HELLO_WAIT.min(left).max(Duration::from_millis(1));
            let id = next_id;
            next_id += 1;
            let tx = tx.clone();
            let heard = Arc::new(AtomicBool::new(false));
            let heard_by_thread = Arc::clone(&heard);
            let spawned = std::thread::Builder::new()
                .name("tcpx-greet".into())
                .spawn(move || {
                    // The receiver is gone once the client was found.
                    let _ = tx.send((id, greet(stream, wait, &heard_by_thread)));
                });
            if let Err(e) = spawned {
                let _ = handle.shutdown(std::net::Shutdown::Both);
                tracing::warn!(
                    "dropped a connection from {peer} on the control port: no thread to greet it: {e}"
                );
                continue;
            }
            pending.push_back(Unidentified {
                id,
                peer,
                stream: handle,
                since: Instant::now(),
                heard,
            });
        }
        // Greetings already read settle before any wait runs out: on a loaded machine the sweep
        // above can outlast HELLO_WAIT while the client's hello sits read in the channel.
        while let Ok((id, greeted)) = rx.try_recv() {
            if let Some(found) = settle(&mut pending, id, greeted, stall)? {
                return Ok(Some(found));
            }
        }
        // The whole greeting has HELLO_WAIT: one that trickles its frame a byte at a time is
        // closed then (which ends its thread's read), whatever each read waited.
        while pending
            .front()
            .is_some_and(|u| u.since.elapsed() >= HELLO_WAIT)
        {
            if let Some(u) = pending.pop_front() {
                u.drop_because(&format!(
                    "it did not say hello within {} s",
                    HELLO_WAIT.as_secs()
                ));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop_all(
                &mut pending,
                "it had not said hello when the wait for the client ended",
            );
            return Ok(None);
        }
        let Ok((id, greeted)) = rx.recv_timeout(CONTROL_WATCH.min(left)) else {
            continue;
        };
        if let Some(found) = settle(&mut pending, id, greeted, stall)? {
            return Ok(Some(found));
        }
    }
}

/// What connection `id`'s greeting came to: the client (every other pending connection
/// dropped), or `None` when it was a stranger (logged) or dropped already.
fn settle(
    pending: &mut std::collections::VecDeque<Unidentified>,
    id: u64,
    greeted: Result<(Control, Msg), String>,
    stall: Duration,
) -> Result<Option<(Control, Msg)>, String> {
    // A connection dropped already (as the oldest) was logged then.
    let Some(at) = pending.iter().position(|u| u.id == id) else {
        return Ok(None);
    };
    let Some(u) = pending.remove(at) else {
        return Ok(None);
    };
    match greeted {
        Ok((mut ctl, m)) => {
            for other in pending.drain(..) {
                other.drop_because("it had not said hello when the client did");
            }
            ctl.set_timeout(stall).map_err(|e| e.to_string())?;
            Ok(Some((ctl, m)))
        }
        Err(why) => {
            tracing::warn!(
                "dropped a connection from {} on the control port{why}",
                u.peer
            );
            Ok(None)
        }
    }
}

/// What the caller knows of where this side runs that the bench does not look up itself: the
/// process's backend settings (read from its environment by the binary) and, in an emulated
/// fabric node, the places of its NICs and GPUs. `Default` is every backend setting at its
/// default and the machine's own places.
#[derive(Debug, Clone, Default)]
pub struct SideEnv {
    pub backends: BackendEnv,
    pub places: Option<NodePlaces>,
}

impl From<BackendEnv> for SideEnv {
    fn from(backends: BackendEnv) -> SideEnv {
        SideEnv {
            backends,
            places: None,
        }
    }
}

/// The receiving side: listens on `listener` for one client and runs the experiment with it,
/// every backend setting at its default (see [`run_server_with`]).
pub fn run_server(
    exp: &Experiment,
    listener: TcpListener,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    run_server_with(exp, &SideEnv::default(), listener, progress)
}

/// [`run_server`] with what the caller knows of this side's surroundings (`env`: the backend
/// settings the binary read from its environment, NIC places in an emulated fabric node).
pub fn run_server_with(
    exp: &Experiment,
    env: &SideEnv,
    listener: TcpListener,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let (machine, actions) = proto::Server::new(exp.clone(), &addr);
    run_side(
        exp,
        env,
        Side::Recv,
        machine,
        actions,
        Rendezvous::Listen(&listener),
        progress,
    )
}

/// The sending side: connects to the server at `peer` (retrying until the timeout) and runs,
/// every backend setting at its default (see [`run_client_with`]).
pub fn run_client(
    exp: &Experiment,
    peer: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    run_client_with(exp, &SideEnv::default(), peer, progress)
}

/// [`run_client`] with what the caller knows of this side's surroundings ([`SideEnv`]).
pub fn run_client_with(
    exp: &Experiment,
    env: &SideEnv,
    peer: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    let (machine, actions) = proto::Client::new(exp.clone(), &peer.to_string());
    run_side(
        exp,
        env,
        Side::Send,
        machine,
        actions,
        Rendezvous::Connect(peer),
        progress,
    )
}

/// Runs one side's machine (started with `actions`) to its end with a worker for `side`: what
/// this side knows at the end.
fn run_side<M: Machine>(
    exp: &Experiment,
    env: &SideEnv,
    side: Side,
    mut machine: M,
    actions: Vec<Action>,
    rendezvous: Rendezvous<'_>,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    let mut worker = Worker::new(exp, env, side);
    let measurements = drive(&mut machine, actions, &mut worker, rendezvous, progress)?;
    Ok(Outcome {
        experiment: exp.clone(),
        side,
        peer: machine.peer().to_string(),
        measurements,
        samples: std::mem::take(&mut worker.samples),
        nic_plan: worker.nic_plan.take(),
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

/// Both sides in one process over loopback (`bind` picks the address, port 0 a free one).
/// Returns the client's outcome; the server's agrees with it by construction of the protocol.
pub fn run_local(
    exp: &Experiment,
    bind: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    run_local_with(exp, &SideEnv::default(), bind, progress)
}

/// [`run_local`] with what the caller knows of this side's surroundings ([`SideEnv`]).
pub fn run_local_with(
    exp: &Experiment,
    env: &SideEnv,
    bind: SocketAddr,
    progress: &mut dyn Progress,
) -> Result<Outcome, BenchError> {
    // Check first so a bad value is reported once, not by both threads.
    open_transport(exp, &env.backends, 2, None)?;
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
                run_server_with(exp, env, listener, &mut |_: &Measurement| {})
            })
            .map_err(|e| BenchError::Failed(format!("starting the local server thread: {e}")))?;
        let client = run_client_with(exp, env, addr, progress);
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
mod lap_time_tests {
    use super::*;

    #[test]
    fn iteration_times_run_from_the_previous_end_per_flow_and_over_all_flows() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Flow 0 ends its iterations at 10, 20, 30 ms; flow 1 at 12, 19, 35 ms.
        let ends = vec![vec![at(10), at(20), at(30)], vec![at(12), at(19), at(35)]];
        let laps = lap_times(t0, &ends);
        let ms = |s: f64| (s * 1e3).round() as u64;
        let slowest: Vec<u64> = laps.iter().map(|l| ms(l.slowest)).collect();
        assert_eq!(
            slowest,
            [12, 8, 15],
            "from every flow's end to every flow's end"
        );
        let flow1: Vec<u64> = laps.iter().map(|l| ms(l.per_flow[1])).collect();
        assert_eq!(flow1, [12, 7, 16], "each flow from its own previous end");
        // The iteration times add up to the run: nothing is lost between iterations.
        assert_eq!(slowest.iter().sum::<u64>(), 35);
        // One iteration: the slowest flow's time from the common start.
        let one = lap_times(t0, &[vec![at(5)], vec![at(9)]]);
        assert_eq!((ms(one[0].slowest), ms(one[0].per_flow[0])), (9, 5));
    }
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

#[cfg(test)]
mod control_watch_tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    fn experiment() -> Experiment {
        Experiment {
            name: "e".into(),
            sizes: vec![64 << 10],
            iters: 1,
            warmup: 0,
            flows: 1,
            channels: 2,
            timeout_s: 20.0,
            ..Experiment::default()
        }
    }

    fn send(s: &mut TcpStream, m: &Msg) {
        let body = serde_json::to_vec(m).unwrap();
        s.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        s.write_all(&body).unwrap();
    }

    fn recv(s: &mut TcpStream) -> Msg {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// A client by hand that goes away once the server waits for the data connections (it got
    /// the handles), by aborting or by closing: the server ends with that, naming the stage,
    /// rather than with its accept timing out.
    #[test]
    fn a_client_leaving_after_the_welcome_ends_the_servers_accept_with_its_reason() {
        for abort in [Some("no GPU here"), None] {
            let exp = experiment();
            let listener = bind_control("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr().unwrap();
            let e = std::thread::scope(|s| {
                let server = s.spawn(|| run_server(&exp, listener, &mut |_: &Measurement| {}));
                let mut c = TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                send(&mut c, &proto::hello(&exp));
                assert_eq!(recv(&mut c), Msg::Welcome);
                assert!(matches!(recv(&mut c), Msg::Handles { flow: 0, .. }));
                if let Some(reason) = abort {
                    send(
                        &mut c,
                        &Msg::Abort {
                            reason: reason.into(),
                        },
                    );
                }
                drop(c);
                server.join().unwrap().unwrap_err()
            });
            let text = e.to_string();
            assert!(matches!(e, BenchError::PeerGone(_)), "{text}");
            assert!(
                text.contains("failed while connecting the data channels"),
                "{text}"
            );
            match abort {
                Some(reason) => assert!(
                    text.ends_with(&format!("the peer stopped: {reason}")),
                    "{text}"
                ),
                None => assert!(text.contains("closed the control connection"), "{text}"),
            }
        }
    }

    /// Silent strangers on the control port, more than are held unidentified at once, then a
    /// client: its hello is taken while the strangers are still open and silent (no stranger's
    /// greeting wait ran out first), and every stranger's connection is closed by then.
    #[test]
    fn silent_strangers_do_not_hold_up_the_client_and_are_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let strangers: Vec<TcpStream> = (0..MAX_UNIDENTIFIED + 3)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut c = TcpStream::connect(addr).unwrap();
        send(&mut c, &proto::hello(&experiment()));
        let deadline = Instant::now() + Duration::from_secs(20);
        let (ctl, first) = accept_client(&listener, deadline, Duration::from_secs(20))
            .unwrap()
            .expect("the client was accepted");
        assert_eq!(ctl.peer, c.local_addr().unwrap().to_string());
        assert_eq!(first.kind(), "hello");
        for mut s in strangers {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            // Closed by the server (end of stream or reset), not left open until a timeout.
            match s.read(&mut [0u8; 1]) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("stranger {:?}: {other:?}", s.local_addr()),
            }
        }
    }

    /// Issue 43 item 7: a client whose hello is there, followed at once by 30 silent strangers
    /// (all accepted in one sweep, before its greeting thread has told the loop), is served,
    /// not closed as the oldest unidentified connection.
    #[test]
    fn a_client_that_spoke_is_not_evicted_by_silent_strangers_after_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        send(&mut c, &proto::hello(&experiment()));
        let strangers: Vec<TcpStream> =
            (0..30).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (ctl, first) = accept_client(&listener, deadline, Duration::from_secs(20))
            .unwrap()
            .expect("the client was accepted");
        assert_eq!(ctl.peer, c.local_addr().unwrap().to_string());
        assert_eq!(first.kind(), "hello");
        drop(strangers);
    }
}
