//! System samplers for an experiment's duration: per-CPU time split (`/proc/stat`), IRQ counts per
//! CPU and per NIC (`/proc/interrupts` deltas), NIC counters (`/sys/class/net/*/statistics`) and
//! TCP retransmits (`/proc/net/snmp`). One background thread reads the files at a fixed interval;
//! the measured threads never wait on it.
//!
//! ```no_run
//! # use tcpx_affinity::sampler::Sampler;
//! # use tcpx_topo::SysRoot;
//! let handle = Sampler::start(SysRoot::live(), std::time::Duration::from_millis(200))?;
//! // ... run the experiment ...
//! let report = handle.stop()?;          // bounded: never waits more than the stop deadline
//! println!("hot cores: {:?}", report.summary.hot_cores);
//! report.write_csv(std::fs::File::create("samples.csv")?)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tcpx_topo::SysRoot;

use crate::interrupts::{Interrupts, IrqId};
use crate::irqmap::map_queue_irqs;

/// A CPU counts as hot above this average busy percentage.
pub const HOT_CPU_BUSY_PCT: f64 = 50.0;
/// How long `stop` waits for the sampler thread beyond one interval.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("{0} (samplers read /proc and /sys under the root; is it mounted?)")]
    Io(#[from] std::io::Error),
    #[error("{path}: {why}")]
    Malformed { path: String, why: String },
    #[error("the interval must be at least 1 ms, got {0:?}")]
    BadInterval(Duration),
    #[error(
        "the sampler thread did not stop within {0:?} (is /proc hanging?); its samples are lost"
    )]
    StopTimeout(Duration),
    #[error("the sampler thread panicked")]
    Panicked,
}

/// Jiffies of one CPU line of `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    pub fn busy(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }
    pub fn total(&self) -> u64 {
        self.busy() + self.idle + self.iowait
    }
    fn delta(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }
}

/// NIC counters from `/sys/class/net/<nic>/statistics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NicCounters {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TcpCounters {
    pub out_segs: u64,
    pub retrans_segs: u64,
}

/// Everything read at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Seconds since the sampler started.
    pub t_s: f64,
    pub cpu: BTreeMap<u32, CpuTimes>,
    /// Sum of all numbered (device) IRQs per CPU.
    pub irqs_per_cpu: BTreeMap<u32, u64>,
    /// NIC queue IRQs per NIC per CPU.
    pub nic_irqs: BTreeMap<String, BTreeMap<u32, u64>>,
    pub nic: BTreeMap<String, NicCounters>,
    pub tcp: Option<TcpCounters>,
    /// This process's user + system CPU time in clock ticks (live root only: a fixture's
    /// `/proc/self` is not this process).
    pub process_cpu_ticks: Option<u64>,
}

/// utime + stime of `/proc/self/stat` (fields 14 and 15; the command name may contain spaces,
/// so count from the last ')').
pub fn read_process_cpu_ticks(root: &SysRoot) -> Option<u64> {
    if !root.is_live() {
        return None;
    }
    let text = root.read("/proc/self/stat").ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks_per_s() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as f64,
        _ => 100.0,
    }
}

/// What reading needs to know once: which IRQ belongs to which NIC.
#[derive(Debug, Clone, Default)]
pub struct IrqOwners(pub BTreeMap<u32, String>);

impl IrqOwners {
    pub fn discover(root: &SysRoot) -> Self {
        let Ok(text) = root.read("/proc/interrupts") else {
            return Self::default();
        };
        let Ok(parsed) = Interrupts::parse(&text) else {
            return Self::default();
        };
        Self(
            map_queue_irqs(&parsed, root)
                .into_iter()
                .map(|q| (q.irq, q.nic))
                .collect(),
        )
    }
}

fn malformed(root: &SysRoot, rel: &str, why: impl Into<String>) -> SampleError {
    SampleError::Malformed {
        path: root.path(rel).display().to_string(),
        why: why.into(),
    }
}

pub fn parse_proc_stat(root: &SysRoot) -> Result<BTreeMap<u32, CpuTimes>, SampleError> {
    let text = root.read("/proc/stat")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(cpu) = it
            .next()
            .and_then(|k| k.strip_prefix("cpu"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let v: Vec<u64> = it.map(|x| x.parse().unwrap_or(0)).collect();
        if v.len() < 7 {
            return Err(malformed(
                root,
                "/proc/stat",
                format!("cpu{cpu} has {} fields", v.len()),
            ));
        }
        out.insert(
            cpu,
            CpuTimes {
                user: v[0],
                nice: v[1],
                system: v[2],
                idle: v[3],
                iowait: v[4],
                irq: v[5],
                softirq: v[6],
                steal: v.get(7).copied().unwrap_or(0),
            },
        );
    }
    if out.is_empty() {
        return Err(malformed(root, "/proc/stat", "no cpuN lines"));
    }
    Ok(out)
}

pub fn parse_tcp_snmp(root: &SysRoot) -> Option<TcpCounters> {
    let text = root.read("/proc/net/snmp").ok()?;
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let get = |k: &str| -> Option<u64> {
        let i = names.iter().position(|n| *n == k)?;
        values.get(i)?.parse().ok()
    };
    Some(TcpCounters {
        out_segs: get("OutSegs")?,
        retrans_segs: get("RetransSegs")?,
    })
}

pub fn read_nic_counters(root: &SysRoot) -> BTreeMap<String, NicCounters> {
    let mut out = BTreeMap::new();
    for nic in root.list_dir("/sys/class/net") {
        let get = |k: &str| -> u64 {
            root.read_opt(format!("/sys/class/net/{nic}/statistics/{k}"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        out.insert(
            nic.clone(),
            NicCounters {
                rx_bytes: get("rx_bytes"),
                tx_bytes: get("tx_bytes"),
                rx_packets: get("rx_packets"),
                tx_packets: get("tx_packets"),
                rx_dropped: get("rx_dropped"),
                tx_dropped: get("tx_dropped"),
            },
        );
    }
    out
}

impl Snapshot {
    /// IRQs of `nic`'s queues counted on `cpu` (0 where none were).
    pub fn nic_irqs_on(&self, nic: &str, cpu: u32) -> u64 {
        self.nic_irqs
            .get(nic)
            .and_then(|m| m.get(&cpu))
            .copied()
            .unwrap_or(0)
    }

    /// Each CPU of this snapshot that `earlier` has too, with its times since `earlier`.
    fn cpu_deltas<'a>(
        &'a self,
        earlier: &'a Snapshot,
    ) -> impl Iterator<Item = (u32, CpuTimes)> + 'a {
        self.cpu
            .iter()
            .filter_map(|(cpu, now)| Some((*cpu, now.delta(earlier.cpu.get(cpu)?))))
    }

    /// Read everything once. `t_s` is stamped by the caller's clock.
    pub fn read(root: &SysRoot, owners: &IrqOwners, t_s: f64) -> Result<Self, SampleError> {
        let cpu = parse_proc_stat(root)?;
        let mut irqs_per_cpu: BTreeMap<u32, u64> = BTreeMap::new();
        let mut nic_irqs: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
        if let Ok(text) = root.read("/proc/interrupts") {
            let parsed = Interrupts::parse(&text)
                .map_err(|e| malformed(root, "/proc/interrupts", e.to_string()))?;
            for line in &parsed.lines {
                let IrqId::Num(irq) = line.id else { continue };
                let owner = owners.0.get(&irq);
                for (i, &count) in line.counts.iter().enumerate() {
                    let cpu = parsed.cpus[i];
                    *irqs_per_cpu.entry(cpu).or_default() += count;
                    if let Some(nic) = owner {
                        *nic_irqs
                            .entry(nic.clone())
                            .or_default()
                            .entry(cpu)
                            .or_default() += count;
                    }
                }
            }
        }
        Ok(Self {
            t_s,
            cpu,
            irqs_per_cpu,
            nic_irqs,
            nic: read_nic_counters(root),
            tcp: parse_tcp_snmp(root),
            process_cpu_ticks: read_process_cpu_ticks(root),
        })
    }
}

/// One raw sample value (long format: one row per source/subject/metric and interval end).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleRow {
    /// End of the interval, seconds since the sampler started.
    pub t_s: f64,
    /// `cpu`, `irq`, `nic` or `tcp`.
    pub source: &'static str,
    /// `cpu3`, `eth1`, `eth1/cpu3`, `tcp`.
    pub subject: String,
    pub metric: &'static str,
    pub value: f64,
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Rows for the interval between two snapshots.
pub fn rows_between(a: &Snapshot, b: &Snapshot) -> Vec<SampleRow> {
    let mut rows = Vec::new();
    let t = b.t_s;
    let dt = (b.t_s - a.t_s).max(1e-9);
    for (cpu, d) in b.cpu_deltas(a) {
        let total = d.total();
        let subject = format!("cpu{cpu}");
        for (metric, v) in [
            ("busy_pct", pct(d.busy(), total)),
            ("user_pct", pct(d.user + d.nice, total)),
            ("system_pct", pct(d.system, total)),
            ("irq_pct", pct(d.irq, total)),
            ("softirq_pct", pct(d.softirq, total)),
        ] {
            rows.push(SampleRow {
                t_s: t,
                source: "cpu",
                subject: subject.clone(),
                metric,
                value: v,
            });
        }
    }
    for (nic, per_cpu) in &b.nic_irqs {
        for (cpu, now) in per_cpu {
            let before = a.nic_irqs_on(nic, *cpu);
            let d = now.saturating_sub(before);
            if d > 0 {
                rows.push(SampleRow {
                    t_s: t,
                    source: "irq",
                    subject: format!("{nic}/cpu{cpu}"),
                    metric: "irqs",
                    value: d as f64,
                });
            }
        }
    }
    for (nic, now) in &b.nic {
        let Some(before) = a.nic.get(nic) else {
            continue;
        };
        let d = |x: u64, y: u64| x.saturating_sub(y) as f64;
        for (metric, v) in [
            ("rx_gbps", d(now.rx_bytes, before.rx_bytes) / dt / 1e9),
            ("tx_gbps", d(now.tx_bytes, before.tx_bytes) / dt / 1e9),
            ("rx_packets", d(now.rx_packets, before.rx_packets)),
            ("tx_packets", d(now.tx_packets, before.tx_packets)),
            ("rx_dropped", d(now.rx_dropped, before.rx_dropped)),
            ("tx_dropped", d(now.tx_dropped, before.tx_dropped)),
        ] {
            rows.push(SampleRow {
                t_s: t,
                source: "nic",
                subject: nic.clone(),
                metric,
                value: v,
            });
        }
    }
    if let (Some(x), Some(y)) = (a.process_cpu_ticks, b.process_cpu_ticks) {
        rows.push(SampleRow {
            t_s: t,
            source: "process",
            subject: "self".into(),
            metric: "cpu_pct",
            value: 100.0 * y.saturating_sub(x) as f64 / clock_ticks_per_s() / dt,
        });
    }
    if let (Some(x), Some(y)) = (&a.tcp, &b.tcp) {
        rows.push(SampleRow {
            t_s: t,
            source: "tcp",
            subject: "tcp".into(),
            metric: "retrans_segs",
            value: y.retrans_segs.saturating_sub(x.retrans_segs) as f64,
        });
        rows.push(SampleRow {
            t_s: t,
            source: "tcp",
            subject: "tcp".into(),
            metric: "out_segs",
            value: y.out_segs.saturating_sub(x.out_segs) as f64,
        });
    }
    rows
}

/// Average CPU time split of one CPU (or all, `cpu = None`) over the whole run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuUsage {
    pub cpu: Option<u32>,
    pub busy_pct: f64,
    pub user_pct: f64,
    pub system_pct: f64,
    pub irq_pct: f64,
    pub softirq_pct: f64,
}

fn usage(cpu: Option<u32>, d: &CpuTimes) -> CpuUsage {
    let total = d.total();
    CpuUsage {
        cpu,
        busy_pct: pct(d.busy(), total),
        user_pct: pct(d.user + d.nice, total),
        system_pct: pct(d.system, total),
        irq_pct: pct(d.irq, total),
        softirq_pct: pct(d.softirq, total),
    }
}

/// How one NIC's queue IRQs spread over CPUs during the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IrqBalance {
    pub nic: String,
    pub total: u64,
    pub per_cpu: BTreeMap<u32, u64>,
    pub busiest_cpu: Option<u32>,
    /// Share of the NIC's IRQs that landed on its busiest CPU (100 = all on one CPU).
    pub busiest_share_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NicDelta {
    pub nic: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// GB/s = 1e9 bytes/s over the sampled duration.
    pub rx_gbps: f64,
    pub tx_gbps: f64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub dropped: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpDelta {
    pub out_segs: u64,
    pub retrans_segs: u64,
    pub retrans_pct: f64,
}

/// The run's summary: what goes into an experiment's measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleSummary {
    pub duration_s: f64,
    pub samples: usize,
    pub all_cpus: CpuUsage,
    pub cpus: Vec<CpuUsage>,
    /// CPUs busier than [`HOT_CPU_BUSY_PCT`], busiest first.
    pub hot_cores: Vec<u32>,
    /// Softirq time as a share of all busy CPU time (network receive processing lives here).
    pub softirq_share_pct: f64,
    pub irqs_per_cpu: BTreeMap<u32, u64>,
    pub irq_balance: Vec<IrqBalance>,
    pub nics: Vec<NicDelta>,
    pub tcp: Option<TcpDelta>,
    /// CPU seconds this process used (all its threads), live root only: the tool's own cost,
    /// separate from whatever else the machine was doing.
    pub process_cpu_s: Option<f64>,
}

/// Summary between the first and last snapshot of a run.
pub fn summarize(first: &Snapshot, last: &Snapshot, samples: usize) -> SampleSummary {
    let duration_s = (last.t_s - first.t_s).max(0.0);
    let mut all = CpuTimes::default();
    let mut cpus = Vec::new();
    for (cpu, d) in last.cpu_deltas(first) {
        all = CpuTimes {
            user: all.user + d.user,
            nice: all.nice + d.nice,
            system: all.system + d.system,
            idle: all.idle + d.idle,
            iowait: all.iowait + d.iowait,
            irq: all.irq + d.irq,
            softirq: all.softirq + d.softirq,
            steal: all.steal + d.steal,
        };
        cpus.push(usage(Some(cpu), &d));
    }
    let mut hot: Vec<&CpuUsage> = cpus
        .iter()
        .filter(|c| c.busy_pct > HOT_CPU_BUSY_PCT)
        .collect();
    hot.sort_by(|a, b| b.busy_pct.total_cmp(&a.busy_pct));
    let irqs_per_cpu = last
        .irqs_per_cpu
        .iter()
        .map(|(cpu, n)| {
            (
                *cpu,
                n.saturating_sub(first.irqs_per_cpu.get(cpu).copied().unwrap_or(0)),
            )
        })
        .collect();
    let irq_balance = last
        .nic_irqs
        .iter()
        .map(|(nic, per)| {
            let per_cpu: BTreeMap<u32, u64> = per
                .iter()
                .map(|(cpu, n)| {
                    let before = first.nic_irqs_on(nic, *cpu);
                    (*cpu, n.saturating_sub(before))
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            let total: u64 = per_cpu.values().sum();
            let busiest = per_cpu
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(c, n)| (*c, *n));
            IrqBalance {
                nic: nic.clone(),
                total,
                busiest_cpu: busiest.map(|b| b.0),
                busiest_share_pct: busiest.map_or(0.0, |b| pct(b.1, total)),
                per_cpu,
            }
        })
        .collect();
    let nics = last
        .nic
        .iter()
        .filter_map(|(nic, now)| {
            let b = first.nic.get(nic)?;
            let rx = now.rx_bytes.saturating_sub(b.rx_bytes);
            let tx = now.tx_bytes.saturating_sub(b.tx_bytes);
            let per_s = |x: u64| {
                if duration_s > 0.0 {
                    x as f64 / duration_s / 1e9
                } else {
                    0.0
                }
            };
            Some(NicDelta {
                nic: nic.clone(),
                rx_bytes: rx,
                tx_bytes: tx,
                rx_gbps: per_s(rx),
                tx_gbps: per_s(tx),
                rx_packets: now.rx_packets.saturating_sub(b.rx_packets),
                tx_packets: now.tx_packets.saturating_sub(b.tx_packets),
                dropped: (now.rx_dropped + now.tx_dropped)
                    .saturating_sub(b.rx_dropped + b.tx_dropped),
            })
        })
        .collect();
    let tcp = match (&first.tcp, &last.tcp) {
        (Some(a), Some(b)) => {
            let out = b.out_segs.saturating_sub(a.out_segs);
            let re = b.retrans_segs.saturating_sub(a.retrans_segs);
            Some(TcpDelta {
                out_segs: out,
                retrans_segs: re,
                retrans_pct: pct(re, out),
            })
        }
        _ => None,
    };
    let process_cpu_s = match (first.process_cpu_ticks, last.process_cpu_ticks) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / clock_ticks_per_s()),
        _ => None,
    };
    SampleSummary {
        process_cpu_s,
        duration_s,
        samples,
        softirq_share_pct: pct(all.softirq, all.busy()),
        all_cpus: usage(None, &all),
        hot_cores: hot.iter().filter_map(|c| c.cpu).collect(),
        cpus,
        irqs_per_cpu,
        irq_balance,
        nics,
        tcp,
    }
}

/// Summary plus raw rows of one sampled run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleReport {
    pub summary: SampleSummary,
    pub rows: Vec<SampleRow>,
}

impl SampleReport {
    /// `t_s,source,subject,metric,value` rows (no field contains a comma).
    pub fn write_csv(&self, mut w: impl Write) -> std::io::Result<()> {
        writeln!(w, "t_s,source,subject,metric,value")?;
        for r in &self.rows {
            writeln!(
                w,
                "{:.3},{},{},{},{}",
                r.t_s, r.source, r.subject, r.metric, r.value
            )?;
        }
        w.flush()
    }
}

/// Starts samplers.
pub struct Sampler;

/// A running sampler; [`SamplerHandle::stop`] ends it and returns the report.
pub struct SamplerHandle {
    stop_tx: mpsc::Sender<()>,
    result_rx: mpsc::Receiver<Result<SampleReport, SampleError>>,
    interval: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    /// Take a first snapshot now (so a missing `/proc` fails here, not at the end), then sample
    /// every `interval` on a background thread until stopped.
    pub fn start(root: SysRoot, interval: Duration) -> Result<SamplerHandle, SampleError> {
        if interval < Duration::from_millis(1) {
            return Err(SampleError::BadInterval(interval));
        }
        let owners = IrqOwners::discover(&root);
        let t0 = Instant::now();
        let first = Snapshot::read(&root, &owners, 0.0)?;
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (result_tx, result_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tcpx-sampler".into())
            .spawn(move || {
                let mut rows = Vec::new();
                let mut prev = first.clone();
                let mut samples = 1;
                let mut next_tick = t0 + interval;
                let result = loop {
                    let wait = next_tick.saturating_duration_since(Instant::now());
                    let stopping = match stop_rx.recv_timeout(wait) {
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                        Err(RecvTimeoutError::Timeout) => false,
                    };
                    next_tick += interval;
                    match Snapshot::read(&root, &owners, t0.elapsed().as_secs_f64()) {
                        Ok(snap) => {
                            rows.extend(rows_between(&prev, &snap));
                            prev = snap;
                            samples += 1;
                        }
                        Err(e) => break Err(e),
                    }
                    if stopping {
                        break Ok(SampleReport {
                            summary: summarize(&first, &prev, samples),
                            rows,
                        });
                    }
                };
                let _ = result_tx.send(result);
            })
            .map_err(SampleError::Io)?;
        Ok(SamplerHandle {
            stop_tx,
            result_rx,
            interval,
            thread: Some(thread),
        })
    }
}

impl SamplerHandle {
    /// Stop, waiting at most one interval plus [`STOP_GRACE`].
    pub fn stop(self) -> Result<SampleReport, SampleError> {
        let deadline = self.interval + STOP_GRACE;
        self.stop_within(deadline)
    }

    /// Stop, waiting at most `deadline` for the final snapshot.
    pub fn stop_within(mut self, deadline: Duration) -> Result<SampleReport, SampleError> {
        let _ = self.stop_tx.send(());
        match self.result_rx.recv_timeout(deadline) {
            Ok(result) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                result
            }
            Err(RecvTimeoutError::Timeout) => Err(SampleError::StopTimeout(deadline)),
            Err(RecvTimeoutError::Disconnected) => Err(SampleError::Panicked),
        }
    }
}
