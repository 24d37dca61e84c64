//! `tcpx-run irq show|plan|apply|reset`: NIC queue IRQs and their affinity; a policy derived from
//! the topology (or given as NCCL-style specs) planned, applied (only with --yes) and reset.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tcpx_affinity::{
    default_backup_path, find_stale_backup, queue_irqs, read_backup, reset, CpuSet, Direction,
    IrqPolicy, Spread,
};
use tcpx_topo::{derive, discover, Backend, BindingRule, BindingSpec, SysRoot};

/// Look at NIC queue IRQs and steer them to the NICs' TX/RX cores (dry run unless --yes).
#[derive(clap::Args, Debug)]
pub struct IrqArgs {
    /// Read and write /proc and /sys under this directory instead of / (a fixture tree)
    #[arg(long, default_value = "/", global = true)]
    pub root: PathBuf,
    /// Backup file for apply/reset [default: <root>/run/tcpx-lab/irq-backup.json]
    #[arg(long, global = true)]
    pub backup: Option<PathBuf>,
    /// Print JSON instead of tables
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: IrqAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum IrqAction {
    /// NIC queue IRQs with NIC, queue, direction, affinity and counts
    Show,
    /// What `apply` would change (never writes)
    Plan(PolicyArgs),
    /// Back up, write and verify the policy; without --yes only shows the plan
    Apply {
        #[command(flatten)]
        policy: PolicyArgs,
        /// Really write /proc/irq/*/smp_affinity (needs root on the live system)
        #[arg(long)]
        yes: bool,
        /// Keep the policy only for this many seconds, then restore (Ctrl-C / SIGTERM restore
        /// at once); without it the change stays until `irq reset`
        #[arg(long, value_name = "SECONDS", requires = "yes", value_parser = crate::args::wait_seconds)]
        hold: Option<u64>,
    },
    /// Restore the affinity saved by `apply`; without --yes only shows what would be restored
    Reset {
        #[arg(long)]
        yes: bool,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum SpreadArg {
    /// queue q's IRQ on the q-th CPU of the set
    #[default]
    OnePerQueue,
    /// every IRQ on the whole set
    WholeSet,
}

#[derive(clap::Args, Debug)]
pub struct PolicyArgs {
    /// TX IRQ cores as an NCCL spec ("eth1:8-21;eth2:..."); default: derived from the topology
    #[arg(long)]
    pub tx: Option<String>,
    /// RX IRQ cores as an NCCL spec; default: derived from the topology
    #[arg(long)]
    pub rx: Option<String>,
    #[arg(long, value_enum, default_value_t = SpreadArg::OnePerQueue)]
    pub spread: SpreadArg,
    /// For derived specs: cores at the start of each NUMA node left out
    #[arg(long, default_value_t = BindingRule::default().reserved_cores, value_parser = crate::args::rule_cores)]
    pub reserved_cores: usize,
    /// For derived specs: cores per direction on each NUMA node
    #[arg(long, default_value_t = BindingRule::default().cores_per_direction, value_parser = crate::args::rule_cores)]
    pub cores_per_direction: usize,
}

impl PolicyArgs {
    fn policy(&self, root: &SysRoot) -> anyhow::Result<IrqPolicy> {
        let derived = if self.tx.is_none() || self.rx.is_none() {
            let topo = discover(root, Backend::Auto)
                .context("reading the topology to derive IRQ cores")?;
            let rule = BindingRule {
                reserved_cores: self.reserved_cores,
                cores_per_direction: self.cores_per_direction,
            };
            Some(derive(&topo, &rule))
        } else {
            None
        };
        let spec =
            |given: &Option<String>, derived: Option<BindingSpec>| -> anyhow::Result<BindingSpec> {
                match given {
                    Some(s) => Ok(BindingSpec::parse(s)?),
                    None => Ok(derived.unwrap_or_default()),
                }
            };
        Ok(IrqPolicy {
            tx: spec(&self.tx, derived.as_ref().map(|p| p.tx_bindings.clone()))?,
            rx: spec(&self.rx, derived.as_ref().map(|p| p.rx_bindings.clone()))?,
            spread: match self.spread {
                SpreadArg::OnePerQueue => Spread::OnePerQueue,
                SpreadArg::WholeSet => Spread::WholeSet,
            },
        })
    }
}

pub fn run(args: &IrqArgs) -> anyhow::Result<ExitCode> {
    let root = SysRoot::new(&args.root);
    let backup = args
        .backup
        .clone()
        .unwrap_or_else(|| default_backup_path(&root));
    // A leftover backup means IRQs are still changed by an earlier apply: say so up front.
    let stale = find_stale_backup(&root, &backup)?;
    let reset_action = matches!(args.action, IrqAction::Reset { .. });
    if let (Some(s), false) = (&stale, reset_action) {
        eprintln!("tcpx-run: note: {s}");
    }
    match &args.action {
        IrqAction::Show => show(&root, args.json),
        IrqAction::Plan(p) => plan(&root, p, args.json, None, None),
        IrqAction::Apply { policy, yes, hold } => plan(
            &root,
            policy,
            args.json,
            Some((*yes, backup.as_path())),
            *hold,
        ),
        IrqAction::Reset { yes } => do_reset(&root, &backup, *yes, args.json),
    }
}

fn show(root: &SysRoot, json: bool) -> anyhow::Result<ExitCode> {
    let (parsed, queues) = queue_irqs(root)?;
    let mut rows = Vec::new();
    let mut per_nic: std::collections::BTreeMap<String, NicIrqs> = Default::default();
    for q in &queues {
        let dir = format!("/proc/irq/{}", q.irq);
        let affinity = root
            .read_opt(format!("{dir}/smp_affinity"))
            .and_then(|m| CpuSet::parse_mask(&m).ok())
            .map_or("?".to_string(), |s| s.to_string());
        let effective = root
            .read_opt(format!("{dir}/effective_affinity_list"))
            .unwrap_or_else(|| "?".into());
        let line = parsed.get(q.irq);
        let total = line.map_or(0, |l| l.total());
        // Where this IRQ actually fired: CPUs with a non-zero count.
        let fired: CpuSet = line
            .map(|l| {
                l.counts
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(i, _)| parsed.cpus[i])
                    .collect()
            })
            .unwrap_or_default();
        let sum = per_nic.entry(q.nic.clone()).or_default();
        match q.direction {
            Direction::Tx => sum.tx.insert(q.irq),
            Direction::Rx => sum.rx.insert(q.irq),
            Direction::Combined => sum.txrx.insert(q.irq),
            Direction::Control => sum.control.insert(q.irq),
        };
        if let Some(a) = root
            .read_opt(format!("{dir}/smp_affinity"))
            .and_then(|m| CpuSet::parse_mask(&m).ok())
        {
            sum.allowed = sum.allowed.union(&a);
        }
        sum.fired = sum.fired.union(&fired);
        sum.count += total;
        rows.push(serde_json::json!({
            "irq": q.irq, "nic": q.nic, "queue": q.queue, "direction": q.direction.to_string(),
            "name": q.name, "smp_affinity": affinity, "effective": effective,
            "count": total, "fired_on": fired.to_string(),
        }));
    }
    // The NIC's NUMA node, from the topology (best effort: the IRQ view stands without it).
    let topo = discover(root, Backend::Auto).ok();
    let numa_of = |nic: &str| -> Option<u32> {
        let t = topo.as_ref()?;
        t.numa_of(t.nic(nic)?.pci.as_ref()?)
    };
    let nic_rows: Vec<serde_json::Value> = per_nic
        .iter()
        .map(|(nic, s)| {
            serde_json::json!({
                "nic": nic, "numa": numa_of(nic),
                "tx_irqs": s.tx.to_string(), "rx_irqs": s.rx.to_string(),
                "txrx_irqs": s.txrx.to_string(), "control_irqs": s.control.to_string(),
                "allowed_cpus": s.allowed.to_string(), "fired_on": s.fired.to_string(),
                "count": s.count,
            })
        })
        .collect();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "queue_irqs": rows, "nics": nic_rows })
            )?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!(
            "No NIC queue IRQs found in {} (loopback and virtual interfaces have none).",
            root.path("/proc/interrupts").display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>5}  {:<8} {:>5}  {:<4}  {:<20} {:<10} {:>12}  {:<12} name",
        "IRQ", "NIC", "queue", "dir", "affinity", "effective", "count", "fired on"
    );
    for r in &rows {
        let s = |k: &str| match &r[k] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            v => v.to_string(),
        };
        println!(
            "{:>5}  {:<8} {:>5}  {:<4}  {:<20} {:<10} {:>12}  {:<12} {}",
            s("irq"),
            s("nic"),
            s("queue"),
            s("direction"),
            s("smp_affinity"),
            s("effective"),
            s("count"),
            s("fired_on"),
            s("name")
        );
    }
    println!();
    println!(
        "{:<8} {:>4}  {:<14} {:<14} {:<14} {:<8} {:<20} {:<14} {:>12}",
        "NIC",
        "NUMA",
        "TX IRQs",
        "RX IRQs",
        "TxRx IRQs",
        "ctrl",
        "allowed CPUs",
        "fired on",
        "count"
    );
    for r in &nic_rows {
        let s = |k: &str| match &r[k] {
            serde_json::Value::String(s) if s.is_empty() => "-".into(),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            v => v.to_string(),
        };
        println!(
            "{:<8} {:>4}  {:<14} {:<14} {:<14} {:<8} {:<20} {:<14} {:>12}",
            s("nic"),
            s("numa"),
            s("tx_irqs"),
            s("rx_irqs"),
            s("txrx_irqs"),
            s("control_irqs"),
            s("allowed_cpus"),
            s("fired_on"),
            s("count")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One NIC's IRQs by direction (IRQ numbers kept as ranges the way cpu lists are).
#[derive(Default)]
struct NicIrqs {
    tx: CpuSet,
    rx: CpuSet,
    txrx: CpuSet,
    control: CpuSet,
    allowed: CpuSet,
    fired: CpuSet,
    count: u64,
}

fn plan(
    root: &SysRoot,
    args: &PolicyArgs,
    json: bool,
    apply: Option<(bool, &Path)>,
    hold: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let policy = args.policy(root)?;
    let plan = policy.plan(root)?;
    let pending = plan.pending().count();
    if json && !matches!(apply, Some((true, _))) {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "policy": policy, "plan": plan }))?
        );
    } else if !json {
        println!(
            "Policy: TX {:?}, RX {:?}",
            policy.tx.to_string(),
            policy.rx.to_string()
        );
        if plan.changes.is_empty() {
            println!("No NIC queue IRQ is covered by the policy.");
        } else {
            print!("{}", plan.to_table());
        }
        for u in &plan.untouched {
            println!("  untouched: {u}");
        }
        println!("{pending} of {} IRQs would change.", plan.changes.len());
    }
    match apply {
        None => Ok(ExitCode::SUCCESS),
        Some((false, _)) => {
            if !json {
                println!("Dry run: nothing was written. Add --yes to apply.");
            }
            Ok(ExitCode::SUCCESS)
        }
        Some((true, backup)) if hold.is_some() => {
            let secs = hold.unwrap_or(0);
            restore_on_signal()?;
            let guard = plan.apply_guarded(backup)?;
            println!(
                "Applied and verified {pending} IRQ(s); holding for up to {secs} s (Ctrl-C or SIGTERM restores now)."
            );
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(std::time::Duration::from_secs(secs));
            let restored = guard.restore()?;
            println!("Hold over: restored {} IRQ(s).", restored.irqs.len());
            Ok(ExitCode::SUCCESS)
        }
        Some((true, backup)) => {
            let applied = plan.apply(backup)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "applied": applied, "plan": plan })
                    )?
                );
            } else {
                println!(
                    "Applied and verified {} IRQ(s). Backup: {}. Undo with: tcpx-run irq{} reset --yes --backup {}",
                    applied.written.len(),
                    applied.backup.display(),
                    if root.is_live() { String::new() } else { format!(" --root {}", root.root().display()) },
                    applied.backup.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn do_reset(root: &SysRoot, backup: &Path, yes: bool, json: bool) -> anyhow::Result<ExitCode> {
    let Some(saved) = read_backup(backup)? else {
        println!("No backup at {}: nothing to restore.", backup.display());
        return Ok(ExitCode::SUCCESS);
    };
    if !yes {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "backup": saved }))?
            );
        } else {
            println!(
                "Backup {} (pid {}) would restore:",
                backup.display(),
                saved.pid
            );
            for e in &saved.entries {
                let now = root
                    .read_opt(format!("/proc/irq/{}/smp_affinity", e.irq))
                    .unwrap_or_else(|| "?".into());
                println!("  IRQ {:>5}: {} -> {}", e.irq, now, e.smp_affinity);
            }
            println!("Dry run: nothing was written. Add --yes to restore.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let restored = reset(root, backup)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "restored": restored }))?
        );
    } else {
        println!(
            "Restored {} IRQ(s) from {}; backup removed.",
            restored.irqs.len(),
            backup.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and in the threads it starts later) and
/// waits for them on a thread of its own, which restores every guarded IRQ policy and exits with
/// 128 + the signal's number, the status a shell gives a process ended by that signal (130 for
/// Ctrl-C, 143 for SIGTERM). Only for the hold, which starts no child process (a child would
/// inherit the blocked signals).
fn restore_on_signal() -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()
        .map_err(|e| anyhow::anyhow!("blocking signals for the hold: {e}"))?;
    std::thread::Builder::new()
        .name("tcpx-irq-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                let n = tcpx_affinity::restore_all_active();
                eprintln!("tcpx-run: {sig} received; restored {n} IRQ affinity backup(s)");
                std::process::exit(128 + sig as i32);
            }
        })
        .map_err(|e| anyhow::anyhow!("starting the signal thread for the hold: {e}"))?;
    Ok(())
}
