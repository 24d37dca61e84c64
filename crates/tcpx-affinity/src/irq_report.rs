//! What `tcpx-run irq` shows and how it holds a policy: NIC queue IRQs with their affinity and
//! the CPUs they actually fired on, a per-NIC summary, a policy from NCCL-style specs or derived
//! from the topology, its plan and a backup's restore preview as text, and a timed hold that
//! restores on SIGINT/SIGTERM/SIGHUP.
//!
//! Not for: deciding or writing affinities (that is [`crate::policy`]); this module reads and
//! formats, except [`hold`], which applies through [`IrqPlan::apply_guarded`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tcpx_topo::{
    derive, discover, Backend, BindingParseError, BindingRule, BindingSpec, TopoError,
};

use crate::{
    queue_irqs, Applied, Backup, CpuSet, Direction, IrqError, IrqPlan, IrqPolicy, Restored, Spread,
    SysRoot,
};

/// One NIC queue IRQ as `irq show` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct QueueIrqRow {
    pub irq: u32,
    pub nic: String,
    pub queue: Option<u32>,
    pub direction: String,
    pub name: String,
    /// `smp_affinity` as a cpu list; `?` when unreadable.
    pub smp_affinity: String,
    /// `effective_affinity_list`; `?` when unreadable.
    pub effective: String,
    /// Interrupts counted on all CPUs.
    pub count: u64,
    /// CPUs with a non-zero count.
    pub fired_on: String,
}

/// One NIC's queue IRQs by direction (IRQ numbers as ranges the way cpu lists are written).
#[derive(Clone, Debug, Serialize)]
pub struct NicIrqRow {
    pub nic: String,
    pub numa: Option<u32>,
    pub tx_irqs: String,
    pub rx_irqs: String,
    pub txrx_irqs: String,
    pub control_irqs: String,
    /// Union of the IRQs' `smp_affinity`.
    pub allowed_cpus: String,
    /// Union of the CPUs they fired on.
    pub fired_on: String,
    pub count: u64,
}

/// `irq show`'s view: every queue IRQ and one summary row per NIC (sorted by name).
#[derive(Clone, Debug, Default)]
pub struct IrqView {
    pub queue_irqs: Vec<QueueIrqRow>,
    pub nics: Vec<NicIrqRow>,
}

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

/// Reads the queue IRQs under `root` with their affinity and counts, and sums them per NIC
/// (with the NIC's NUMA node when the topology can be read).
pub fn irq_view(root: &SysRoot) -> Result<IrqView, IrqError> {
    let (parsed, queues) = queue_irqs(root)?;
    let mut rows = Vec::new();
    let mut per_nic: BTreeMap<String, NicIrqs> = BTreeMap::new();
    for q in &queues {
        let dir = format!("/proc/irq/{}", q.irq);
        let mask = root
            .read_opt(format!("{dir}/smp_affinity"))
            .and_then(|m| CpuSet::parse_mask(&m).ok());
        let line = parsed.get(q.irq);
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
        let total = line.map_or(0, |l| l.total());
        let sum = per_nic.entry(q.nic.clone()).or_default();
        match q.direction {
            Direction::Tx => sum.tx.insert(q.irq),
            Direction::Rx => sum.rx.insert(q.irq),
            Direction::Combined => sum.txrx.insert(q.irq),
            Direction::Control => sum.control.insert(q.irq),
        };
        if let Some(a) = &mask {
            sum.allowed = sum.allowed.union(a);
        }
        sum.fired = sum.fired.union(&fired);
        sum.count += total;
        rows.push(QueueIrqRow {
            irq: q.irq,
            nic: q.nic.clone(),
            queue: q.queue,
            direction: q.direction.to_string(),
            name: q.name.clone(),
            smp_affinity: mask.map_or("?".to_string(), |s| s.to_string()),
            effective: root
                .read_opt(format!("{dir}/effective_affinity_list"))
                .unwrap_or_else(|| "?".into()),
            count: total,
            fired_on: fired.to_string(),
        });
    }
    // The NIC's NUMA node, from the topology (best effort: the IRQ view stands without it).
    let topo = discover(root, Backend::Auto).ok();
    let numa_of = |nic: &str| -> Option<u32> {
        let t = topo.as_ref()?;
        t.numa_of(t.nic(nic)?.pci.as_ref()?)
    };
    let nics = per_nic
        .iter()
        .map(|(nic, s)| NicIrqRow {
            nic: nic.clone(),
            numa: numa_of(nic),
            tx_irqs: s.tx.to_string(),
            rx_irqs: s.rx.to_string(),
            txrx_irqs: s.txrx.to_string(),
            control_irqs: s.control.to_string(),
            allowed_cpus: s.allowed.to_string(),
            fired_on: s.fired.to_string(),
            count: s.count,
        })
        .collect();
    Ok(IrqView {
        queue_irqs: rows,
        nics,
    })
}

fn dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

impl IrqView {
    /// The two tables `irq show` prints (queue IRQs, then NICs), or one line saying there is
    /// no queue IRQ under `root`.
    pub fn to_text(&self, root: &SysRoot) -> String {
        if self.queue_irqs.is_empty() {
            return format!(
                "No NIC queue IRQs found in {} (loopback and virtual interfaces have none).\n",
                root.path("/proc/interrupts").display()
            );
        }
        let mut out = format!(
            "{:>5}  {:<8} {:>5}  {:<4}  {:<20} {:<10} {:>12}  {:<12} name\n",
            "IRQ", "NIC", "queue", "dir", "affinity", "effective", "count", "fired on"
        );
        for r in &self.queue_irqs {
            out += &format!(
                "{:>5}  {:<8} {:>5}  {:<4}  {:<20} {:<10} {:>12}  {:<12} {}\n",
                r.irq,
                r.nic,
                r.queue.map_or("-".to_string(), |q| q.to_string()),
                r.direction,
                r.smp_affinity,
                r.effective,
                r.count,
                r.fired_on,
                r.name
            );
        }
        out += "\n";
        out += &format!(
            "{:<8} {:>4}  {:<14} {:<14} {:<14} {:<8} {:<20} {:<14} {:>12}\n",
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
        for r in &self.nics {
            out += &format!(
                "{:<8} {:>4}  {:<14} {:<14} {:<14} {:<8} {:<20} {:<14} {:>12}\n",
                dash(&r.nic),
                r.numa.map_or("-".to_string(), |n| n.to_string()),
                dash(&r.tx_irqs),
                dash(&r.rx_irqs),
                dash(&r.txrx_irqs),
                dash(&r.control_irqs),
                dash(&r.allowed_cpus),
                dash(&r.fired_on),
                r.count
            );
        }
        out
    }
}

/// Why a policy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("reading the topology to derive IRQ cores")]
    Topology(#[source] TopoError),
    #[error(transparent)]
    Spec(#[from] BindingParseError),
    #[error("--{flag}: NIC `{nic}` is not on this machine ({root}/sys/class/net has: {known}); name NICs that exist here")]
    UnknownNic {
        flag: &'static str,
        nic: String,
        root: String,
        known: String,
    },
}

/// The policy from NCCL-style `tx`/`rx` specs; a direction not given is derived from the
/// topology under `root` with `rule`.
pub fn policy_from(
    root: &SysRoot,
    tx: Option<&str>,
    rx: Option<&str>,
    rule: &BindingRule,
    spread: Spread,
) -> Result<IrqPolicy, PolicyError> {
    let derived = if tx.is_none() || rx.is_none() {
        let topo = discover(root, Backend::Auto).map_err(PolicyError::Topology)?;
        Some(derive(&topo, rule))
    } else {
        None
    };
    let present = root.list_dir("/sys/class/net");
    // A NIC named in a given spec must exist here: one that does not would be ignored silently.
    let spec = |flag: &'static str, given: Option<&str>, derived: Option<BindingSpec>| match given {
        Some(s) => {
            let spec = BindingSpec::parse(s)?;
            if let Some(e) = spec.entries.iter().find(|e| !present.contains(&e.nic)) {
                return Err(PolicyError::UnknownNic {
                    flag,
                    nic: e.nic.clone(),
                    root: root
                        .root()
                        .display()
                        .to_string()
                        .trim_end_matches('/')
                        .to_string(),
                    known: if present.is_empty() {
                        "nothing".into()
                    } else {
                        present.join(", ")
                    },
                });
            }
            Ok(spec)
        }
        None => Ok(derived.unwrap_or_default()),
    };
    Ok(IrqPolicy {
        tx: spec("tx", tx, derived.as_ref().map(|p| p.tx_bindings.clone()))?,
        rx: spec("rx", rx, derived.as_ref().map(|p| p.rx_bindings.clone()))?,
        spread,
    })
}

/// A policy and its plan as `irq plan` prints them: the specs, the changes, what stays
/// untouched and how many IRQs would change.
pub fn plan_text(policy: &IrqPolicy, plan: &IrqPlan) -> String {
    let mut out = format!(
        "Policy: TX {:?}, RX {:?}\n",
        policy.tx.to_string(),
        policy.rx.to_string()
    );
    if plan.changes.is_empty() {
        out += "No NIC queue IRQ is covered by the policy.\n";
    } else {
        out += &plan.to_table();
    }
    for u in &plan.untouched {
        out += &format!("  untouched: {u}\n");
    }
    out += &format!(
        "{} of {} IRQs would change.\n",
        plan.pending().count(),
        plan.changes.len()
    );
    out
}

/// What `irq reset` without `--yes` shows: each saved IRQ's affinity now and after restoring.
pub fn restore_preview(root: &SysRoot, backup: &Path, saved: &Backup) -> String {
    let mut out = format!(
        "Backup {} (pid {}) would restore:\n",
        backup.display(),
        saved.pid
    );
    for e in &saved.entries {
        let now = root
            .read_opt(format!("/proc/irq/{}/smp_affinity", e.irq))
            .unwrap_or_else(|| "?".into());
        out += &format!("  IRQ {:>5}: {} -> {}\n", e.irq, now, e.smp_affinity);
    }
    out
}

/// What `irq apply --yes` says once applied: how many IRQs, the backup and the command that
/// undoes it (with `--root` for a fixture tree).
pub fn applied_line(root: &SysRoot, applied: &Applied) -> String {
    format!(
        "Applied and verified {} IRQ(s). Backup: {}. Undo with: tcpx-run irq{} reset --yes --backup {}",
        applied.written.len(),
        applied.backup.display(),
        if root.is_live() {
            String::new()
        } else {
            format!(" --root {}", root.root().display())
        },
        applied.backup.display()
    )
}

/// Applies `plan` (backup at `backup`), calls `applied` once it is verified, keeps it for
/// `hold`, then restores it. SIGINT, SIGTERM and SIGHUP end the hold at once: the policy is
/// restored and [`HoldEnd::Signalled`] says which signal, for the binary to exit with 128 + its
/// number (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process ended by that signal.
/// The signals are blocked in the calling thread (and the threads it starts later), so call it
/// from a process that starts no child afterwards.
pub fn hold(
    plan: &IrqPlan,
    backup: &Path,
    hold: Duration,
    applied: impl FnOnce(),
) -> Result<HoldEnd, HoldError> {
    let signals = watch_signals().map_err(HoldError::Signals)?;
    let guard = plan.apply_guarded(backup)?;
    applied();
    match signals.recv_timeout(hold) {
        Ok(signal) => {
            let restored = crate::restore_all_active();
            drop(guard);
            Ok(HoldEnd::Signalled { signal, restored })
        }
        Err(_) => Ok(HoldEnd::Elapsed(guard.restore()?)),
    }
}

/// How a [`hold`] ended.
#[derive(Debug)]
pub enum HoldEnd {
    /// The hold time passed; the policy was restored.
    Elapsed(Restored),
    /// A signal ended it; `restored` IRQ affinity backups were restored.
    Signalled {
        signal: nix::sys::signal::Signal,
        restored: usize,
    },
}

impl HoldEnd {
    /// The exit status a shell gives a process ended by the signal (128 + its number), or
    /// `None` when the hold ran its time.
    pub fn signal_status(&self) -> Option<u8> {
        match self {
            HoldEnd::Elapsed(_) => None,
            HoldEnd::Signalled { signal, .. } => u8::try_from(128 + *signal as i32).ok(),
        }
    }
}

/// Why a hold failed.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// The signal handling could not be set up (nothing was applied).
    #[error("{0}")]
    Signals(String),
    #[error(transparent)]
    Irq(#[from] IrqError),
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread and waits for them on a thread of its own,
/// which passes the first one on (see [`hold`]).
fn watch_signals() -> Result<std::sync::mpsc::Receiver<nix::sys::signal::Signal>, String> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block()
        .map_err(|e| format!("blocking signals for the hold: {e}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("tcpx-irq-signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                // After the hold the receiver is gone and there is nothing left to restore.
                let _ = tx.send(sig);
            }
        })
        .map_err(|e| format!("starting the signal thread for the hold: {e}"))?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a3() -> SysRoot {
        SysRoot::new(tcpx_test_support::fixture_dir("a3-high"))
    }

    #[test]
    fn the_view_sums_queue_irqs_per_nic_with_its_numa_node() {
        let root = a3();
        let v = irq_view(&root).unwrap();
        assert!(!v.queue_irqs.is_empty());
        let total: u64 = v.queue_irqs.iter().map(|r| r.count).sum();
        assert_eq!(total, v.nics.iter().map(|n| n.count).sum::<u64>());
        let names: Vec<&str> = v.nics.iter().map(|n| n.nic.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert!(v.nics.iter().any(|n| n.numa.is_some()), "{:?}", v.nics);
        let text = v.to_text(&root);
        assert!(text.starts_with("  IRQ  NIC"), "{text}");
        assert_eq!(text.lines().count(), v.queue_irqs.len() + v.nics.len() + 3);
    }

    #[test]
    fn no_queue_irq_is_one_line_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = SysRoot::new(dir.path());
        let text = IrqView::default().to_text(&root);
        assert!(text.starts_with("No NIC queue IRQs found in "), "{text}");
        assert!(text.contains("/proc/interrupts"), "{text}");
    }

    #[test]
    fn given_specs_are_used_and_missing_ones_derived() {
        let root = a3();
        let p = policy_from(
            &root,
            Some("eth1:8-9"),
            None,
            &BindingRule::default(),
            Spread::WholeSet,
        )
        .unwrap();
        assert_eq!(p.tx.to_string(), "eth1:8-9");
        assert!(p.rx.to_string().contains("eth1:"), "{}", p.rx);
        let e = policy_from(
            &root,
            Some("eth1:x"),
            Some("eth1:1"),
            &BindingRule::default(),
            Spread::OnePerQueue,
        )
        .unwrap_err();
        assert!(matches!(e, PolicyError::Spec(_)));
        let plan = p.plan(&root).unwrap();
        let text = plan_text(&p, &plan);
        assert!(text.starts_with("Policy: TX \"eth1:8-9\", RX "), "{text}");
        assert!(text.ends_with(&format!("of {} IRQs would change.\n", plan.changes.len())));
    }

    #[test]
    fn a_nic_that_is_not_here_is_refused_naming_it_and_the_nics_that_are() {
        let root = a3();
        let e = policy_from(
            &root,
            Some("eth1:8-9;eth9:1"),
            Some("eth1:10"),
            &BindingRule::default(),
            Spread::OnePerQueue,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("--tx: NIC `eth9` is not on this machine"),
            "{e}"
        );
        assert!(e.contains("eth1, eth2"), "{e}");
        let e = policy_from(
            &root,
            Some("eth1:8"),
            Some("bogus:1"),
            &BindingRule::default(),
            Spread::OnePerQueue,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("--rx: NIC `bogus`"), "{e}");
    }
}
