//! `tcpx-run irq show|plan|apply|reset`: NIC queue IRQs and their affinity; a policy derived from
//! the topology (or given as NCCL-style specs) planned, applied (only with --yes) and reset.
//! The views and the hold are `tcpx_affinity::irq_report`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tcpx_affinity::irq_report::{
    applied_line, irq_view, plan_text, policy_from, restore_preview, HoldEnd,
};
use tcpx_affinity::{default_backup_path, find_stale_backup, read_backup, reset, Spread};
use tcpx_topo::{BindingRule, SysRoot};

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
    #[arg(long, default_value_t = BindingRule::default().cores_per_direction, value_parser = crate::args::direction_cores)]
    pub cores_per_direction: usize,
}

impl PolicyArgs {
    fn policy(&self, root: &SysRoot) -> anyhow::Result<tcpx_affinity::IrqPolicy> {
        let rule = BindingRule {
            reserved_cores: self.reserved_cores,
            cores_per_direction: self.cores_per_direction,
        };
        let spread = match self.spread {
            SpreadArg::OnePerQueue => Spread::OnePerQueue,
            SpreadArg::WholeSet => Spread::WholeSet,
        };
        Ok(policy_from(
            root,
            self.tx.as_deref(),
            self.rx.as_deref(),
            &rule,
            spread,
        )?)
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
    let view = irq_view(root)?;
    if json {
        crate::print_json(serde_json::json!({ "queue_irqs": view.queue_irqs, "nics": view.nics }))?;
    } else {
        print!("{}", view.to_text(root));
    }
    Ok(ExitCode::SUCCESS)
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
        crate::print_json(serde_json::json!({ "policy": policy, "plan": plan }))?;
    } else if !json {
        print!("{}", plan_text(&policy, &plan));
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
            let end = tcpx_affinity::irq_report::hold(
                &plan,
                backup,
                Duration::from_secs(secs),
                || {
                    println!(
                        "Applied and verified {pending} IRQ(s); holding for up to {secs} s (Ctrl-C or SIGTERM restores now)."
                    );
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                },
            )?;
            match end {
                HoldEnd::Elapsed(restored) => {
                    println!("Hold over: restored {} IRQ(s).", restored.irqs.len());
                    Ok(ExitCode::SUCCESS)
                }
                HoldEnd::Signalled { signal, restored } => {
                    eprintln!(
                        "tcpx-run: {signal} received; restored {restored} IRQ affinity backup(s)"
                    );
                    Ok(ExitCode::from(end.signal_status().unwrap_or(1)))
                }
            }
        }
        Some((true, backup)) => {
            let applied = plan.apply(backup)?;
            if json {
                crate::print_json(serde_json::json!({ "applied": applied, "plan": plan }))?;
            } else {
                println!("{}", applied_line(root, &applied));
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
            crate::print_json(serde_json::json!({ "backup": saved }))?;
        } else {
            print!("{}", restore_preview(root, backup, &saved));
            println!("Dry run: nothing was written. Add --yes to restore.");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let restored = reset(root, backup)?;
    if json {
        crate::print_json(serde_json::json!({ "restored": restored }))?;
    } else {
        println!(
            "Restored {} IRQ(s) from {}; backup removed.",
            restored.irqs.len(),
            backup.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
