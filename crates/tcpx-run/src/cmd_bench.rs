//! `tcpx-run bench`: one experiment as server, client or both (local), printed as an
//! nccl-tests table (or, with `--json`, one JSON document on stdout and the table on stderr) and
//! appended to a CSV file.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use tcpx_bench::{BenchError, Experiment, Measurement, Outcome};
use tcpx_orchestrate::{ChildErrorKind, ChildReport};
use tcpx_report::CsvAppender;

/// Default control port.
pub const DEFAULT_PORT: u16 = 5299;

/// `--transport`'s help: every backend the registry knows.
pub fn transport_help() -> String {
    format!(
        "Backend moving the bytes: {} (`tcpx-run doctor` says which can open here)",
        tcpx_transport::registry::Backend::ALL
            .map(|b| b.name())
            .join(", ")
    )
}

/// `--memory`'s help: every memory kind `tcpx-bench` places buffers in.
pub const MEMORY_HELP: &str = "Where buffers live: host, cuda (flow f on GPU f on both sides) or \
     cuda:S,R (sender's flows from GPU S, receiver's from GPU R)";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchRole {
    /// Receives; listens for the client.
    Server,
    /// Sends; connects to the server given by --peer.
    Client,
    /// Both, in this process, over loopback.
    Local,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which side this process plays.
    #[arg(long, value_enum, default_value = "local")]
    role: BenchRole,
    /// Client: the server's address (HOST or HOST:PORT). Server: the address to listen on.
    #[arg(long)]
    peer: Option<String>,
    /// Control port (server listens, client connects) when --peer gives none.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Message sizes: 64M, a list 1M,4M or a doubling range 1M..1G (K, M, G = powers of 1024).
    #[arg(long, default_value = "64M", allow_hyphen_values = true)]
    size: String,
    /// Timed iterations per size.
    #[arg(long, default_value = "20", allow_hyphen_values = true)]
    iters: String,
    /// Warm-up iterations per size (not timed).
    #[arg(long, default_value = "5", allow_hyphen_values = true)]
    warmup: String,
    /// Independent flows run at once (one per GPU on GPU runs).
    #[arg(
        long,
        visible_alias = "gpus",
        env = "TCPX_FLOWS",
        default_value = "1",
        allow_hyphen_values = true
    )]
    flows: String,
    /// Channels (comms) per flow.
    #[arg(
        long,
        env = "TCPX_CHANNELS",
        default_value = "2",
        allow_hyphen_values = true
    )]
    channels: String,
    /// Sockets per channel.
    #[arg(
        long,
        env = "TCPX_SOCKS_PER_CHANNEL",
        default_value = "4",
        allow_hyphen_values = true
    )]
    socks_per_channel: String,
    /// Bytes per request; default min(512K, size).
    #[arg(long, env = "TCPX_CHUNK", allow_hyphen_values = true)]
    chunk: Option<String>,
    /// Requests in flight per channel.
    #[arg(
        long,
        env = "TCPX_WINDOW",
        default_value = "16",
        allow_hyphen_values = true
    )]
    window: String,
    #[arg(long, env = "TCPX_TRANSPORT", default_value = "socket", help = transport_help())]
    transport: String,
    #[arg(long, env = "TCPX_MEMORY", default_value = "host", help = MEMORY_HELP)]
    memory: String,
    /// Check every received byte.
    #[arg(long, value_enum, default_value = "on")]
    verify: OnOff,
    /// SO_SNDBUF/SO_RCVBUF to ask for (default: Linux autotuning).
    #[arg(long, env = "TCPX_SOCK_BUF", allow_hyphen_values = true)]
    sock_buf: Option<String>,
    /// Longest wait for any progress or for the peer, seconds.
    #[arg(long, default_value = "30", allow_hyphen_values = true)]
    timeout: String,
    /// CPUs for the sending side's threads (cpu list such as 0-3,8); socket workers inherit it.
    #[arg(long)]
    send_cpus: Option<String>,
    /// CPUs for the receiving side's threads.
    #[arg(long)]
    recv_cpus: Option<String>,
    /// Sample CPU/IRQ/NIC/TCP counters every MS milliseconds during timed iterations.
    #[arg(long, value_name = "MS", allow_hyphen_values = true)]
    sample_ms: Option<String>,
    /// Write this side's raw samples (t_s,source,subject,metric,value per size) to this CSV file.
    #[arg(long)]
    samples_csv: Option<PathBuf>,
    /// Backend setting KEY=VALUE (NCCL_* and plugin variables), repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Experiment name for tables and CSV.
    #[arg(long, default_value = "bench")]
    name: String,
    /// CSV file to append results to.
    #[arg(long, default_value = "reports/bench.csv")]
    csv: PathBuf,
    /// Do not write CSV.
    #[arg(long)]
    no_csv: bool,
    /// Print one JSON document on stdout (tool, version, host, time, experiment, every figure)
    /// and nothing else; the table goes to stderr.
    #[arg(long)]
    json: bool,
    /// This side's NICs, comma-separated interface names (eth1,eth2) or local addresses
    /// (127.0.0.2,127.0.0.3 emulate two NICs on loopback); channels bind to them per --nic-policy.
    #[arg(long, value_delimiter = ',')]
    nics: Vec<String>,
    /// How channels are given to --nics: round-robin, numa-local, closest-pci, explicit.
    #[arg(long, default_value = "round-robin")]
    nic_policy: String,
    /// One process per flow (a `tcpx-run bench` child per GPU, flow i on control port PORT+i),
    /// supervised by this one, instead of all flows in this process.
    #[arg(long)]
    multi_process: bool,
    /// (Internal, for multi-process children) the experiment as JSON; other settings are ignored.
    #[arg(long, hide = true)]
    experiment_json: Option<String>,
    /// (Internal, for multi-process children) write this process's `ChildReport` (measurements,
    /// NIC plan, typed error) to this file for the parent to read.
    #[arg(long, hide = true)]
    report_json: Option<PathBuf>,
    /// Test hook (server only): accept the client's control connection, then exit with status 3,
    /// as a child that crashes mid-experiment would.
    #[arg(long, hide = true)]
    test_exit_after_accept: bool,
    /// Test hook (client only): exit with status 3 before connecting, as a child that dies
    /// early would; its server is left waiting for a client that never comes.
    #[arg(long, hide = true)]
    test_exit_before_connect: bool,
}

// Numeric flags are parsed by crate::args (ranges checked, the flag named).
use crate::args::count;

fn size(name: &str, text: &str) -> Result<u64> {
    tcpx_bench::parse_size(text).map_err(|e| anyhow::anyhow!("--{name}: {e}"))
}

impl BenchArgs {
    pub fn experiment(&self) -> Result<Experiment> {
        if let Some(json) = &self.experiment_json {
            let exp: Experiment = serde_json::from_str(json)
                .context("--experiment-json is not an experiment of this tcpx-run version")?;
            exp.validate(None).map_err(|e| anyhow::anyhow!("{e}"))?;
            return Ok(exp);
        }
        let timeout = crate::args::seconds("timeout", &self.timeout, tcpx_bench::MAX_TIMEOUT_S)?;
        let exp = Experiment {
            name: self.name.clone(),
            transport: self.transport.clone(),
            memory: self.memory.clone(),
            sizes: tcpx_bench::parse_sizes(&self.size)
                .map_err(|e| anyhow::anyhow!("--size: {e}"))?,
            iters: count("iters", &self.iters)?,
            warmup: count("warmup", &self.warmup)?,
            flows: count("flows", &self.flows)?,
            channels: count("channels", &self.channels)?,
            socks_per_channel: count("socks-per-channel", &self.socks_per_channel)?,
            chunk: self
                .chunk
                .as_deref()
                .map(|c| size("chunk", c))
                .transpose()?,
            window: count("window", &self.window)?,
            verify: self.verify == OnOff::On,
            sock_buf: self
                .sock_buf
                .as_deref()
                .map(|c| size("sock-buf", c))
                .transpose()?,
            timeout_s: timeout,
            send_cpus: self.send_cpus.clone(),
            recv_cpus: self.recv_cpus.clone(),
            sample_ms: self
                .sample_ms
                .as_deref()
                .map(|m| count("sample-ms", m))
                .transpose()?,
            env: self
                .env
                .iter()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                    _ => Err(anyhow::anyhow!("--env `{kv}`: write it as KEY=VALUE")),
                })
                .collect::<Result<_>>()?,
            nics: self.nics.iter().map(|n| n.trim().to_string()).collect(),
            nic_policy: self.nic_policy.clone(),
            multi_process: self.multi_process,
            flow_index: None,
        };
        if self.samples_csv.is_some() && exp.sample_ms.is_none() {
            bail!("--samples-csv needs --sample-ms to say how often to sample");
        }
        if let Some(p) = &self.samples_csv {
            // A path that cannot be written is refused before the run, not after it.
            tcpx_report::check_writable_file(p)
                .map_err(|e| anyhow::anyhow!("--samples-csv: {e:#}"))?;
        }
        exp.validate(None).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(exp)
    }

    fn address(&self, default_host: &str) -> Result<SocketAddr> {
        let text = self.peer.as_deref().unwrap_or(default_host);
        let with_port = if text.parse::<SocketAddr>().is_ok()
            || text
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok())
        {
            text.to_string()
        } else if text.contains(':') {
            format!("[{text}]:{}", self.port)
        } else {
            format!("{text}:{}", self.port)
        };
        with_port
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve --peer `{text}`"))?
            .next()
            .with_context(|| format!("--peer `{text}` resolves to no address"))
    }
}

pub const CSV_HEADER: &[&str] = &[
    "timestamp",
    "name",
    "role",
    "peer",
    "transport",
    "memory",
    "flows",
    "channels",
    "socks_per_channel",
    "chunk",
    "window",
    "verify",
    "size",
    "iters",
    "warmup",
    "side",
    "time_us",
    "p50_us",
    "p99_us",
    "min_us",
    "max_us",
    "algbw_gbs",
    "busbw_gbs",
    "wrong_bytes",
    "pinned_cpus",
    "cpu_s_per_gb",
    "busy_pct",
    "softirq_share_pct",
];

fn csv_rows(m: &Measurement, role: &str, peer: &str, stamp: u64) -> Vec<Vec<String>> {
    let e = &m.experiment;
    [&m.send, &m.recv]
        .into_iter()
        .map(|s| {
            vec![
                stamp.to_string(),
                e.name.clone(),
                role.to_string(),
                peer.to_string(),
                e.transport.clone(),
                e.memory.clone(),
                e.flows.to_string(),
                e.channels.to_string(),
                e.socks_per_channel.to_string(),
                m.chunk.to_string(),
                e.window.to_string(),
                e.verify.to_string(),
                m.size.to_string(),
                e.iters.to_string(),
                e.warmup.to_string(),
                s.side.as_str().to_string(),
                format!("{:.3}", s.avg_us),
                format!("{:.3}", s.p50_us),
                format!("{:.3}", s.p99_us),
                format!("{:.3}", s.min_us),
                format!("{:.3}", s.max_us),
                format!("{:.4}", s.algbw_gbs),
                format!("{:.4}", s.busbw_gbs),
                s.wrong_bytes.map_or_else(String::new, |w| w.to_string()),
                s.pinning
                    .as_ref()
                    .map_or_else(String::new, |p| p.actual.clone()),
                opt(s.cpu.as_ref().and_then(|c| c.cpu_s_per_gb)),
                opt(s.cpu.as_ref().map(|c| c.busy_pct)),
                opt(s.cpu.as_ref().map(|c| c.softirq_share_pct)),
            ]
        })
        .collect()
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| format!("{v:.4}"))
}

/// Writes this side's raw samples, one block per size, with the size as the first column.
fn write_samples(path: &std::path::Path, outcome: &Outcome) -> Result<()> {
    let mut text = String::from("size,t_s,source,subject,metric,value\n");
    for (size, report) in &outcome.samples {
        let mut block = Vec::new();
        report.write_csv(&mut block)?;
        for line in String::from_utf8_lossy(&block).lines().skip(1) {
            text.push_str(&format!("{size},{line}\n"));
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // Write aside and rename, so a reader never sees half a file.
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

pub fn run(a: &BenchArgs) -> Result<ExitCode> {
    // A flow process dies with the process that started it.
    if let Err(e) = tcpx_orchestrate::flows::die_with_parent(
        std::env::var(tcpx_orchestrate::PARENT_PID_ENV)
            .ok()
            .as_deref(),
    ) {
        eprintln!("tcpx-run bench: {e}");
        return Ok(ExitCode::from(2));
    }
    let Some(report) = &a.report_json else {
        return run_side(a);
    };
    // The parent decides from the report alone: write one whatever happened.
    let result = run_side(a);
    let child_report = match &result {
        Ok(_) => None,
        Err(e) => Some(match e.downcast_ref::<BenchError>() {
            Some(b) => ChildReport {
                error: Some(tcpx_orchestrate::ChildError::from_bench(b)),
                ..ChildReport::default()
            },
            None => ChildReport::failed(ChildErrorKind::Failed, format!("{e:#}")),
        }),
    };
    if let Some(r) = child_report {
        if let Err(e) = r.write(report) {
            eprintln!(
                "tcpx-run bench: writing the report {}: {e}",
                report.display()
            );
        }
    }
    result
}

/// One side of the experiment (or the multi-process parent); writes the success report when
/// asked for one.
fn run_side(a: &BenchArgs) -> Result<ExitCode> {
    let exp = a.experiment()?;
    let role = match a.role {
        BenchRole::Server => "server",
        BenchRole::Client => "client",
        BenchRole::Local => "local",
    };
    if exp.multi_process && exp.flow_index.is_none() {
        return run_multi(a, &exp, role);
    }
    if a.test_exit_after_accept && a.role == BenchRole::Server {
        return exit_after_accept(a, &exp);
    }
    if a.test_exit_before_connect && a.role == BenchRole::Client {
        eprintln!("tcpx-run bench: test hook --test-exit-before-connect: exiting with status 3");
        std::process::exit(3);
    }
    let csv = if a.no_csv {
        None
    } else {
        Some(CsvAppender::open(&a.csv, CSV_HEADER)?)
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if a.role == BenchRole::Client && a.peer.is_none() {
        bail!("--role client needs --peer HOST[:PORT], the server's address");
    }
    let (addr, peer_label) = match a.role {
        BenchRole::Client => {
            let addr = a.address("")?;
            (addr, addr.to_string())
        }
        BenchRole::Server => {
            let addr = a.address("0.0.0.0")?;
            (addr, "(first client)".to_string())
        }
        BenchRole::Local => {
            let addr = a.address("127.0.0.1")?;
            // Local runs pick a free port unless one was asked for, so two can run side by side.
            let addr = if a.peer.is_none() {
                SocketAddr::new(addr.ip(), 0)
            } else {
                addr
            };
            (addr, "loopback (in process)".to_string())
        }
    };
    let mut out = human(a.json);
    writeln!(
        out,
        "{}",
        tcpx_bench::table::header(&exp, role, &peer_label)
    )?;
    if let Some(b) = exp.sock_buf {
        // The buffer the kernel grants, next to the one asked for.
        match tcpx_bench::sockbuf::probe_sock_buf(b) {
            Ok(g) => writeln!(out, "# {}", g.line())?,
            Err(e) => writeln!(
                out,
                "# sock-buf: could not read what the kernel grants: {e}"
            )?,
        }
    }
    for line in cudap2p_routes(&exp, a.role != BenchRole::Local) {
        writeln!(out, "# {line}")?;
    }
    out.flush()?;
    let mut csv_error: Option<anyhow::Error> = None;
    let result: Result<Outcome, BenchError> = {
        let mut progress = |m: &Measurement| {
            let mut out = human(a.json);
            let _ = writeln!(out, "{}", tcpx_bench::table::rows(m));
            let _ = out.flush();
            if let Some(c) = &csv {
                for row in csv_rows(m, role, &peer_label, stamp) {
                    if let Err(e) = c.append(&row) {
                        csv_error.get_or_insert(e);
                    }
                }
            }
        };
        match a.role {
            BenchRole::Local => tcpx_bench::run_local(&exp, addr, &mut progress),
            BenchRole::Client => tcpx_bench::run_client(&exp, addr, &mut progress),
            BenchRole::Server => {
                let listener = tcpx_bench::bind_control(addr)?;
                eprintln!("tcpx-run: server listening on {}", listener.local_addr()?);
                tcpx_bench::run_server(&exp, listener, &mut progress)
            }
        }
    };
    let outcome = result?;
    writeln!(out, "{}", tcpx_bench::table::footer(&outcome.measurements))?;
    if let Some(plan) = &outcome.nic_plan {
        writeln!(out, "# channels on NICs: {}", plan.describe(&exp))?;
    }
    if exp.flows > 1 && exp.flow_index.is_none() {
        let figs = tcpx_orchestrate::figures::single_process_figures(&outcome.measurements);
        writeln!(
            out,
            "{}",
            tcpx_orchestrate::figures::figures_table("single process", &figs)
        )?;
    }
    if let Some(c) = &csv {
        writeln!(out, "# results appended to {}", c.path().display())?;
    }
    if let Some(p) = &a.samples_csv {
        write_samples(p, &outcome)?;
        writeln!(out, "# samples written to {}", p.display())?;
    }
    if a.json {
        print_document(
            role,
            &peer_label,
            &exp,
            &outcome.measurements,
            outcome.nic_plan.as_ref().map(|p| p.describe(&exp)),
        )?;
    }
    if let Some(path) = &a.report_json {
        let r = ChildReport {
            measurements: outcome.measurements.clone(),
            nic_plan: outcome.nic_plan.as_ref().map(|p| p.describe(&exp)),
            error: None,
        };
        r.write(path)
            .with_context(|| format!("writing the report {}", path.display()))?;
    }
    if let Some(e) = csv_error {
        return Err(e.context("the run finished but its CSV rows could not all be written"));
    }
    let wrong: u64 = outcome
        .measurements
        .iter()
        .filter_map(|m| m.recv.wrong_bytes)
        .sum();
    if wrong > 0 {
        eprintln!("tcpx-run: {wrong} received bytes differ from what was sent");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the human text goes: stdout, or stderr when stdout carries the `--json` document.
fn human(json: bool) -> Box<dyn Write> {
    if json {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

/// This machine's name, as the kernel has it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The `--json` document: one line on stdout, nothing else there.
fn print_document(
    role: &str,
    peer: &str,
    exp: &Experiment,
    ms: &[Measurement],
    nic_plan: Option<String>,
) -> Result<()> {
    let info = tcpx_bench::table::RunInfo {
        tool: "tcpx-run bench".into(),
        version: crate::VERSION.into(),
        host: host_name(),
        timestamp: tcpx_report::utc_now_iso(),
        timestamp_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        role: role.into(),
        peer: peer.into(),
    };
    let doc = tcpx_bench::table::json_document(&info, exp, ms, nic_plan);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&doc)?)?;
    out.flush()?;
    Ok(())
}

/// The test hook behind `--test-exit-after-accept`: the client sees its control connection
/// close during the handshake, as when the server process dies.
fn exit_after_accept(a: &BenchArgs, exp: &Experiment) -> Result<ExitCode> {
    let listener = tcpx_bench::bind_control(a.address("0.0.0.0")?)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(exp.timeout_s);
    let peer = tcpx_transport::socket::accept_until(&listener, deadline)?
        .map(|(_, p)| p.to_string())
        .unwrap_or_else(|| "nobody (timed out)".into());
    eprintln!("tcpx-run bench: test hook --test-exit-after-accept: accepted {peer}, exiting with status 3");
    std::process::exit(3);
}

/// For `--transport cudap2p`: which GPU copies from which, over which link (NVLink count or PCIe
/// path, peer access), one line per flow of this process. Best effort: nothing where the GPUs
/// cannot be opened (the run itself then reports why).
fn cudap2p_routes(exp: &Experiment, cross_process: bool) -> Vec<String> {
    use tcpx_transport::cudap2p::{describe_route, CopyMode};
    if exp.transport != "cudap2p" {
        return Vec::new();
    }
    let Ok(gpus) = tcpx_gpu::device_count() else {
        return Vec::new();
    };
    let mode = CopyMode::parse(&std::env::var("TCPX_CUDAP2P_MODE").unwrap_or_default())
        .unwrap_or_default();
    (0..exp.local_flows())
        .filter_map(|k| {
            let flow = exp.flow_id(k) as usize;
            let (send, recv) = tcpx_bench::flow_gpus(&exp.memory, flow, gpus)?;
            let (copier, peer) = match mode {
                CopyMode::Read => (recv, send),
                CopyMode::Write => (send, recv),
            };
            let dev = tcpx_gpu::Device::open(copier).ok()?;
            Some(format!(
                "cudap2p flow {flow}: {}",
                describe_route(&dev, Some(peer), mode, cross_process)
            ))
        })
        .collect()
}

/// Multi-process mode: one child `tcpx-run bench` per flow (both sides' children for `local`),
/// flow `i` on control port PORT + `i`; prints per-GPU and per-node figures.
fn run_multi(a: &BenchArgs, exp: &Experiment, role: &str) -> Result<ExitCode> {
    use tcpx_orchestrate::figures::{aggregate, figures_table};
    use tcpx_orchestrate::flows::{children_limit, flow_children, FlowSide};
    use tcpx_orchestrate::supervise::supervise;
    if a.role == BenchRole::Client && a.peer.is_none() {
        bail!("--role client needs --peer HOST[:PORT], the server's address");
    }
    let base = match a.role {
        BenchRole::Client => a.address("")?,
        BenchRole::Server => a.address("0.0.0.0")?,
        BenchRole::Local => a.address("127.0.0.1")?,
    };
    if base.port() == 0 {
        bail!("--multi-process needs a fixed base port (flow i uses PORT+i): give --port");
    }
    let sides: &[FlowSide] = match a.role {
        BenchRole::Server => &[FlowSide::Server],
        BenchRole::Client => &[FlowSide::Client],
        BenchRole::Local => &[FlowSide::Server, FlowSide::Client],
    };
    let launcher = crate::flow_launcher::SelfLauncher::shared()?;
    let flows = flow_children(&*launcher, exp, sides, base, &[])?;
    let limit = children_limit(exp);
    let mut out = human(a.json);
    writeln!(
        out,
        "{}",
        tcpx_bench::table::header(
            exp,
            role,
            &format!("{} processes from port {}", flows.specs.len(), base)
        )
    )?;
    out.flush()?;
    let children = supervise(flows.specs, limit)?;
    drop(flows.dir);
    let csv = if a.no_csv {
        None
    } else {
        Some(CsvAppender::open(&a.csv, CSV_HEADER)?)
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut all = Vec::new();
    for c in &children {
        // Both sides of a local run agree on every figure: the client's rows are enough.
        if a.role == BenchRole::Local && c.role == "server" {
            continue;
        }
        for m in &c.measurements {
            writeln!(out, "# flow {} ({}):", c.flow, c.role)?;
            writeln!(out, "{}", tcpx_bench::table::rows(m))?;
            if let Some(csv) = &csv {
                let label = format!("flow {} ({} process)", c.flow, c.role);
                for row in csv_rows(m, role, &label, stamp) {
                    csv.append(&row)?;
                }
            }
        }
        all.extend(c.measurements.iter().cloned());
    }
    let figs = aggregate(&children);
    writeln!(out, "{}", figures_table("multi-process", &figs))?;
    if let Some(c) = &csv {
        writeln!(out, "# results appended to {}", c.path().display())?;
    }
    if a.json {
        print_document(role, &format!("multi-process from {base}"), exp, &all, None)?;
    }
    let wrong: u64 = figs.iter().filter_map(|f| f.wrong_bytes).sum();
    if wrong > 0 {
        eprintln!("tcpx-run: {wrong} received bytes differ from what was sent");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
