//! One experiment outside a plan, as `tcpx-run bench` runs it: this process as server, client
//! or both over loopback, its flows in this process or one flow process per flow
//! ([`Standalone::run_multi_process`], supervised here), each size's table rows written as they
//! come, CSV rows appended, raw samples written, and the `--json` document.
//!
//! Not for: parsing flags (`tcpx_bench::flags`) or deciding where text goes: the caller passes a
//! [`TextOut`] that opens the stream for human text each time it is needed (stdout, or stderr
//! when stdout carries the JSON document).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tcpx_bench::csv::{csv_rows, write_samples, CSV_HEADER};
use tcpx_bench::{BenchError, Experiment, Measurement, Outcome};
use tcpx_report::CsvAppender;

use crate::error::{chain, Cause, FlowsError};
use crate::figures::{aggregate, figures_table, single_process_figures};
use crate::process::{children_limit, flow_children, FlowSide};
use crate::{ChildError, ChildErrorKind, ChildReport, Launcher};
pub use tcpx_link::launch::host_name;

/// Opens the stream human text goes to; called once per block of lines (also from the thread
/// that measures, hence `Sync`).
pub type TextOut<'a> = &'a (dyn Fn() -> Box<dyn Write> + Sync);

/// Which side this process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchRole {
    /// Receives; listens for the client.
    Server,
    /// Sends; connects to the server.
    Client,
    /// Both, in this process, over loopback.
    Local,
}

impl BenchRole {
    /// Every role, in the order `--help` lists them.
    pub const ALL: [BenchRole; 3] = [BenchRole::Server, BenchRole::Client, BenchRole::Local];

    /// The role whose word ([`BenchRole::as_str`]) is `word`.
    pub fn from_word(word: &str) -> Option<BenchRole> {
        BenchRole::ALL.into_iter().find(|r| r.as_str() == word)
    }

    /// The word tables, CSV rows and JSON documents use.
    pub fn as_str(self) -> &'static str {
        match self {
            BenchRole::Server => "server",
            BenchRole::Client => "client",
            BenchRole::Local => "local",
        }
    }
}

/// A run to make: the experiment, the side, where the peer is and where results go.
pub struct Standalone {
    pub role: BenchRole,
    /// Client: the server's address (HOST or HOST:PORT). Server: the address to listen on.
    pub peer: Option<String>,
    /// Control port when `peer` gives none.
    pub port: u16,
    pub exp: Experiment,
    /// CSV file to append rows to.
    pub csv: Option<PathBuf>,
    /// File for this side's raw samples.
    pub samples_csv: Option<PathBuf>,
    /// This process's backend settings and, in an emulated fabric node, its NIC places, as the
    /// binary read them.
    pub side_env: tcpx_bench::SideEnv,
}

/// What a run measured, for the caller's JSON document and child report.
pub struct StandaloneResult {
    /// How the peer is named in tables and the JSON document.
    pub peer_label: String,
    /// Every size's measurement (every flow's, in multi-process runs).
    pub measurements: Vec<Measurement>,
    /// Which NICs the channels used, when the experiment named NICs.
    pub nic_plan: Option<String>,
    /// CSV rows that could not be appended (the run itself finished).
    pub csv_error: Option<tcpx_report::Error>,
    /// Received bytes that differ from what was sent.
    pub wrong_bytes: u64,
}

impl StandaloneResult {
    /// The `--json` document of the run (iperf3 style, `tcpx_bench::table::json_document`),
    /// stamped with `tool`, `version`, this host and now.
    pub fn json_document(
        &self,
        tool: &str,
        version: &str,
        role: BenchRole,
        exp: &Experiment,
    ) -> serde_json::Value {
        let info = tcpx_bench::table::RunInfo {
            tool: tool.into(),
            version: version.into(),
            host: host_name(),
            timestamp: tcpx_report::utc_now_iso(),
            timestamp_unix: unix_now(),
            role: role.as_str().into(),
            peer: self.peer_label.clone(),
        };
        tcpx_bench::table::json_document(&info, exp, &self.measurements, self.nic_plan.clone())
    }

    /// The report a flow process writes when its run succeeded.
    pub fn child_report(&self) -> ChildReport {
        ChildReport {
            measurements: self.measurements.clone(),
            nic_plan: self.nic_plan.clone(),
            error: None,
        }
    }
}

/// Checks an experiment built from flags before anything runs: `samples_csv` needs sampling and
/// must be writable, then [`Experiment::validate`].
pub fn check(exp: &Experiment, samples_csv: Option<&Path>) -> Result<(), FlowsError> {
    if samples_csv.is_some() && exp.sample_ms.is_none() {
        return Err(FlowsError::Refused(
            "--samples-csv needs --sample-ms to say how often to sample".into(),
        ));
    }
    if let Some(p) = samples_csv {
        // A path that cannot be written is refused before the run, not after it.
        tcpx_report::check_writable_file(p).map_err(|e| {
            let e: Cause = e.into();
            FlowsError::Refused(format!("--samples-csv: {}", chain(&*e)))
        })?;
    }
    exp.validate(None)
        .map_err(|e| FlowsError::Refused(e.to_string()))?;
    Ok(())
}

/// The report a flow process writes when its run failed (`e`: the binary's error, with whatever
/// context it added): the bench error's kind when there is one anywhere in its chain (itself, or
/// behind a [`FlowsError`]), else a plain failure with the whole chain as the message.
pub fn child_report_for(e: &(dyn std::error::Error + 'static)) -> ChildReport {
    let mut layer = Some(e);
    let mut bench = None;
    while let Some(l) = layer {
        bench = l
            .downcast_ref::<BenchError>()
            .or_else(|| l.downcast_ref::<FlowsError>().and_then(FlowsError::bench));
        if bench.is_some() {
            break;
        }
        layer = l.source();
    }
    match bench {
        Some(b) => ChildReport {
            error: Some(ChildError::from_bench(b)),
            ..ChildReport::default()
        },
        None => ChildReport::failed(ChildErrorKind::Failed, chain(e)),
    }
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), where unbound sockets
/// take their ports.
pub fn ephemeral_range() -> Option<(u16, u16)> {
    let t = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = t.split_whitespace().map(|x| x.parse::<u16>().ok());
    Some((it.next()??, it.next()??))
}

/// Why the control ports `base..base+flows` of a multi-process run are at risk: inside the
/// ephemeral `range`, where this run's own data sockets take their ports, one may hold a
/// flow's control port before that flow's process binds it. `None` when they lie outside.
pub fn control_ports_in_ephemeral_range(
    base: u16,
    flows: u32,
    range: (u16, u16),
) -> Option<String> {
    let last = u32::from(base).saturating_add(flows.max(1) - 1);
    let (lo, hi) = range;
    if last < u32::from(lo) || u32::from(base) > u32::from(hi) {
        return None;
    }
    let below = u32::from(lo).saturating_sub(flows.max(1));
    Some(format!(
        "control ports {base}..={last} (--port {base}, one per flow) lie in the kernel's ephemeral port range {lo}-{hi} (net.ipv4.ip_local_port_range), where this run's data sockets take their ports: one may take a flow's control port first (`address in use`); give --port {below} or lower, or one above {hi}"
    ))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Standalone {
    /// The GPUs where a local nccl run puts both sides of a flow on one GPU (`gpus` GPUs here),
    /// one entry per such flow's GPU: those flows need a process per side, each its own NCCL
    /// host ([`crate::process::nccl_host_id`]), so such a run goes multi-process.
    pub fn nccl_shared_gpus(&self, gpus: usize) -> Vec<usize> {
        if self.role != BenchRole::Local || self.exp.flow_index.is_some() {
            return Vec::new();
        }
        let mut shared: Vec<usize> = (0..self.exp.flows as usize)
            .filter_map(|f| tcpx_transport::nccl::process::shared_gpu(&self.exp, f, gpus))
            .collect();
        shared.sort_unstable();
        shared.dedup();
        shared
    }

    /// Whether this run starts a process per flow (with `gpus` GPUs here): when asked for
    /// (multi-process), or for a local nccl run whose sides share a GPU, since NCCL refuses two
    /// ranks on one GPU of one host and each side must be its own NCCL host. A flow process
    /// itself never does.
    pub fn runs_a_process_per_flow(&self, gpus: usize) -> bool {
        if self.exp.flow_index.is_some() {
            return false;
        }
        self.exp.multi_process
            || (tcpx_transport::nccl::process::ranks_may_share_gpu(&self.exp)
                && !self.nccl_shared_gpus(gpus).is_empty())
    }

    /// The control address: `peer` (or `default_host`) with `port` when it names none.
    pub fn address(&self, default_host: &str) -> Result<SocketAddr, FlowsError> {
        tcpx_bench::flags::control_addr(self.peer.as_deref(), self.port, default_host)
            .map_err(FlowsError::Refused)
    }

    fn open_csv(&self) -> Result<Option<CsvAppender>, FlowsError> {
        self.csv
            .as_deref()
            .map(|p| CsvAppender::open(p, CSV_HEADER))
            .transpose()
            .map_err(|e| FlowsError::Output(e.into()))
    }

    fn need_peer(&self) -> Result<(), FlowsError> {
        if self.role == BenchRole::Client && self.peer.is_none() {
            return Err(FlowsError::Refused(
                "--role client needs --peer HOST[:PORT], the server's address".into(),
            ));
        }
        Ok(())
    }

    /// All flows in this process: the header, each size's rows as measured, the footer, the
    /// NIC plan and per-flow figures, then CSV rows and samples.
    pub fn run_in_process(&self, text: TextOut<'_>) -> Result<StandaloneResult, FlowsError> {
        let exp = &self.exp;
        let role = self.role.as_str();
        let csv = self.open_csv()?;
        let stamp = unix_now();
        self.need_peer()?;
        let (addr, peer_label) = match self.role {
            BenchRole::Client => {
                let addr = self.address("")?;
                (addr, addr.to_string())
            }
            BenchRole::Server => (self.address("0.0.0.0")?, "(first client)".to_string()),
            BenchRole::Local => {
                let addr = self.address("127.0.0.1")?;
                // Local runs pick a free port unless one was asked for, so two can run side by side.
                let addr = if self.peer.is_none() {
                    SocketAddr::new(addr.ip(), 0)
                } else {
                    addr
                };
                (addr, "loopback (in process)".to_string())
            }
        };
        let mut out = text();
        writeln!(out, "{}", tcpx_bench::table::header(exp, role, &peer_label))?;
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
        let mode = self.side_env.backends.cudap2p_mode;
        for line in cudap2p_routes(exp, mode, self.role != BenchRole::Local) {
            writeln!(out, "# {line}")?;
        }
        out.flush()?;
        let mut csv_error: Option<tcpx_report::Error> = None;
        let result: Result<Outcome, BenchError> = {
            let mut progress = |m: &Measurement| {
                let mut out = text();
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
            match self.role {
                BenchRole::Local => {
                    tcpx_bench::run_local_with(exp, &self.side_env, addr, &mut progress)
                }
                BenchRole::Client => {
                    tcpx_bench::run_client_with(exp, &self.side_env, addr, &mut progress)
                }
                BenchRole::Server => {
                    let listener = tcpx_bench::bind_control(addr)?;
                    eprintln!("tcpx-run: server listening on {}", listener.local_addr()?);
                    tcpx_bench::run_server_with(exp, &self.side_env, listener, &mut progress)
                }
            }
        };
        let outcome = result?;
        writeln!(out, "{}", tcpx_bench::table::footer(&outcome.measurements))?;
        let nic_plan = outcome.nic_plan.as_ref().map(|p| p.describe(exp));
        if let Some(plan) = &nic_plan {
            writeln!(out, "# channels on NICs: {plan}")?;
        }
        if exp.flows > 1 && exp.flow_index.is_none() {
            let figs = single_process_figures(&outcome.measurements);
            writeln!(out, "{}", figures_table("single process", &figs))?;
        }
        if let Some(c) = &csv {
            writeln!(out, "# results appended to {}", c.path().display())?;
        }
        if let Some(p) = &self.samples_csv {
            write_samples(p, &outcome).map_err(|e| FlowsError::Output(e.into()))?;
            writeln!(out, "# samples written to {}", p.display())?;
        }
        out.flush()?;
        let wrong_bytes = outcome
            .measurements
            .iter()
            .filter_map(|m| m.recv.wrong_bytes)
            .sum();
        Ok(StandaloneResult {
            peer_label,
            measurements: outcome.measurements,
            nic_plan,
            csv_error,
            wrong_bytes,
        })
    }

    /// One flow process per flow (both sides' for `Local`), flow `i` on control port PORT + `i`,
    /// started by `launcher` and supervised here; prints each flow's rows and the per-GPU and
    /// per-node figures.
    pub fn run_multi_process(
        &self,
        launcher: &dyn Launcher,
        text: TextOut<'_>,
    ) -> Result<StandaloneResult, FlowsError> {
        let exp = &self.exp;
        let role = self.role.as_str();
        self.need_peer()?;
        let base = match self.role {
            BenchRole::Client => self.address("")?,
            BenchRole::Server => self.address("0.0.0.0")?,
            BenchRole::Local => self.address("127.0.0.1")?,
        };
        if base.port() == 0 {
            return Err(FlowsError::Refused(
                "--multi-process needs a fixed base port (flow i uses PORT+i): give --port".into(),
            ));
        }
        if let Some(w) = ephemeral_range()
            .and_then(|r| control_ports_in_ephemeral_range(base.port(), exp.flows, r))
        {
            eprintln!("tcpx-run: warning: {w}");
        }
        let sides: &[FlowSide] = match self.role {
            BenchRole::Server => &[FlowSide::Server],
            BenchRole::Client => &[FlowSide::Client],
            BenchRole::Local => &[FlowSide::Server, FlowSide::Client],
        };
        let flows = flow_children(launcher, exp, sides, base, &[])?;
        let limit = children_limit(exp);
        let mut out = text();
        let peer = format!("{} processes from port {}", flows.specs.len(), base);
        writeln!(out, "{}", tcpx_bench::table::header(exp, role, &peer))?;
        if tcpx_transport::nccl::process::ranks_may_share_gpu(exp) {
            let ids = tcpx_transport::nccl::shared_gpu_host_ids(2);
            for gpu in self.nccl_shared_gpus(tcpx_gpu::device_count().unwrap_or(0)) {
                writeln!(
                    out,
                    "# nccl: {}, one process each",
                    tcpx_transport::nccl::describe_shared_gpu(gpu, &ids)
                )?;
            }
        }
        out.flush()?;
        let log_dir = flows.dir;
        let supervised = crate::supervise::supervise(flows.specs, limit);
        // Also after a failed run: a plugin that did not load is often why it failed.
        for line in crate::process::nccl_network_summary(exp, log_dir.path()) {
            writeln!(out, "# {line}")?;
        }
        drop(log_dir);
        let children = supervised?;
        let csv = self.open_csv()?;
        let stamp = unix_now();
        let mut all = Vec::new();
        for c in &children {
            // Both sides of a local run agree on every figure: the client's rows are enough.
            if self.role == BenchRole::Local && c.role == "server" {
                continue;
            }
            for m in &c.measurements {
                writeln!(out, "# flow {} ({}):", c.flow, c.role)?;
                writeln!(out, "{}", tcpx_bench::table::rows(m))?;
                if let Some(csv) = &csv {
                    let label = format!("flow {} ({} process)", c.flow, c.role);
                    for row in csv_rows(m, role, &label, stamp) {
                        csv.append(&row).map_err(|e| FlowsError::Output(e.into()))?;
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
        out.flush()?;
        Ok(StandaloneResult {
            peer_label: format!("multi-process from {base}"),
            measurements: all,
            nic_plan: None,
            csv_error: None,
            wrong_bytes: figs.iter().filter_map(|f| f.wrong_bytes).sum(),
        })
    }
}

/// For `--transport cudap2p` copying in `mode` (the binary's `TCPX_CUDAP2P_MODE`): which GPU
/// copies from which, over which link (NVLink count or PCIe
/// path, peer access), one line per flow of this process. Best effort: nothing where the GPUs
/// cannot be opened (the run itself then reports why).
pub fn cudap2p_routes(
    exp: &Experiment,
    mode: tcpx_transport::cudap2p::CopyMode,
    cross_process: bool,
) -> Vec<String> {
    use tcpx_transport::cudap2p::{describe_route, CopyMode};
    if !exp.transport.capabilities().copies_between_gpus() {
        return Vec::new();
    }
    let Ok(gpus) = tcpx_gpu::device_count() else {
        return Vec::new();
    };
    (0..exp.local_flows())
        .filter_map(|k| {
            let flow = exp.flow_id(k) as usize;
            let (send, recv) = exp.memory.flow_gpus(flow, gpus)?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn control_ports_in_the_ephemeral_range_are_named_with_the_range() {
        let r = (32768, 60999);
        assert!(control_ports_in_ephemeral_range(5299, 64, r).is_none());
        assert!(control_ports_in_ephemeral_range(61000, 4, r).is_none());
        let w = control_ports_in_ephemeral_range(45000, 64, r).unwrap();
        assert!(
            w.starts_with("control ports 45000..=45063 (--port 45000, one per flow) lie in the kernel's ephemeral port range 32768-60999"),
            "{w}"
        );
        // Ending inside it counts too.
        assert!(control_ports_in_ephemeral_range(32760, 16, r).is_some());
        // A flow count no experiment passes validation with is still no panic.
        assert!(control_ports_in_ephemeral_range(65535, u32::MAX, r).is_none());
    }

    use super::*;
    use tcpx_bench::flags::Knob;

    fn exp() -> Experiment {
        tcpx_bench::flags::ExperimentFlags::default()
            .with(Knob::Name, "t")
            .with(Knob::Sizes, "64K")
            .with(Knob::Iters, "2")
            .with(Knob::Warmup, "1")
            .with(Knob::Channels, "1")
            .with(Knob::SocksPerChannel, "1")
            .with(Knob::Window, "2")
            .with(Knob::TimeoutS, "20")
            .experiment()
            .unwrap()
    }

    #[test]
    fn samples_need_sampling_and_a_file_and_bad_experiments_are_refused() {
        let e = exp();
        check(&e, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let err = check(&e, Some(&dir.path().join("s.csv"))).unwrap_err();
        assert!(err.to_string().contains("needs --sample-ms"), "{err}");
        let mut sampled = e.clone();
        sampled.sample_ms = Some(10);
        let err = check(&sampled, Some(dir.path())).unwrap_err();
        assert!(err.to_string().starts_with("--samples-csv: "), "{err}");
        let mut bad = e;
        bad.channels = 0;
        assert!(check(&bad, None).is_err());
    }

    #[test]
    fn a_client_without_a_peer_is_refused_before_anything_runs() {
        let s = Standalone {
            role: BenchRole::Client,
            peer: None,
            port: 5299,
            exp: exp(),
            csv: None,
            samples_csv: None,
            side_env: Default::default(),
        };
        let text = || -> Box<dyn Write> { Box::new(std::io::sink()) };
        let e = s.run_in_process(&text).err().unwrap();
        assert_eq!(
            e.to_string(),
            "--role client needs --peer HOST[:PORT], the server's address"
        );
    }

    #[test]
    fn a_local_run_measures_over_loopback_and_appends_csv_rows() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("b.csv");
        let s = Standalone {
            role: BenchRole::Local,
            peer: None,
            port: 5299,
            exp: exp(),
            csv: Some(csv.clone()),
            samples_csv: None,
            side_env: Default::default(),
        };
        let text = || -> Box<dyn Write> { Box::new(std::io::sink()) };
        let r = s.run_in_process(&text).unwrap();
        assert_eq!(r.peer_label, "loopback (in process)");
        assert_eq!(r.measurements.len(), 1);
        assert_eq!(r.wrong_bytes, 0);
        assert!(r.csv_error.is_none());
        let rows = std::fs::read_to_string(&csv).unwrap();
        // Header plus one row per side.
        assert_eq!(rows.lines().count(), 3, "{rows}");
        let doc = r.json_document("t", "0", BenchRole::Local, &s.exp);
        assert_eq!(doc["start"]["role"], "local");
    }

    #[test]
    fn a_local_nccl_run_on_one_gpu_names_it_for_two_nccl_hosts() {
        let mut e = exp();
        e.transport = tcpx_bench::Backend::Nccl;
        e.memory = "cuda".parse().unwrap();
        let mut s = Standalone {
            role: BenchRole::Local,
            peer: None,
            port: 5299,
            exp: e,
            csv: None,
            samples_csv: None,
            side_env: Default::default(),
        };
        assert_eq!(s.nccl_shared_gpus(1), vec![0]);
        assert_eq!(s.nccl_shared_gpus(0), Vec::<usize>::new());
        s.exp.memory = "cuda:0,1".parse().unwrap();
        assert_eq!(s.nccl_shared_gpus(2), Vec::<usize>::new());
        assert_eq!(s.nccl_shared_gpus(1), vec![0]);
        // Three flows on 2 GPUs (`cuda`: flow f on GPU f mod 2 on both sides): each GPU once.
        s.exp.memory = "cuda".parse().unwrap();
        s.exp.flows = 3;
        assert_eq!(s.nccl_shared_gpus(2), vec![0, 1]);
        // A server or client process is one side: its host is its own already.
        s.role = BenchRole::Server;
        assert_eq!(s.nccl_shared_gpus(1), Vec::<usize>::new());
    }

    #[test]
    fn child_reports_keep_the_bench_errors_kind() {
        let e = anyhow::Error::from(BenchError::Invalid("x".into()));
        let r = child_report_for(e.as_ref());
        assert!(r.error.is_some());
        let plain = child_report_for(anyhow::anyhow!("boom").context("running").as_ref());
        // Behind this crate's error, as the binary gets it from a run, and behind the binary's
        // context too.
        let wrapped = anyhow::Error::from(FlowsError::from(BenchError::Invalid("x".into())))
            .context("the bench");
        assert!(child_report_for(wrapped.as_ref()).error.is_some());
        assert_eq!(plain.error.unwrap().message, "running: boom");
    }
}
