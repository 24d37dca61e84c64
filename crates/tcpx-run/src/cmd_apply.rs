//! `tcpx-run apply <report dir | tuned.env | tuned.json>`: the tuned settings of a plan run as
//! `export` lines or job snippets (`--format slurm|torchrun|k8s`), and its IRQ policy applied
//! through `irq apply` (`--irq`: dry run unless `--yes`; backup, verify, `irq reset` to undo).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use tcpx_report::tuned::{load, snippet, SnippetFormat, TunedFile};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// `export NAME=VALUE` lines (eval or source them)
    Shell,
    /// An `#SBATCH --export=ALL,...` line for a Slurm batch script
    Slurm,
    /// An environment prefix for a torchrun command line
    Torchrun,
    /// A Kubernetes container `env:` list (YAML)
    K8s,
}

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// A plan run's report directory, or its tuned.env / tuned.json
    pub path: PathBuf,
    /// How to print the variables
    #[arg(long, value_enum, default_value = "shell")]
    pub format: FormatArg,
    /// Apply the run's IRQ policy instead of printing variables (through `irq apply`: without
    /// --yes only shows the plan)
    #[arg(long)]
    pub irq: bool,
    /// With --irq: really write /proc/irq/*/smp_affinity (needs root)
    #[arg(long, requires = "irq")]
    pub yes: bool,
    /// With --irq --yes: keep the policy this many seconds, then restore
    #[arg(long, value_name = "SECONDS", requires = "yes")]
    pub hold: Option<u64>,
    /// With --irq: read and write /proc and /sys under this directory (a fixture tree)
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// With --irq: backup file [default: <root>/run/tcpx-lab/irq-backup.json]
    #[arg(long)]
    pub backup: Option<PathBuf>,
}

pub fn run(a: &ApplyArgs) -> Result<ExitCode> {
    let t = load(&a.path)?;
    if a.irq {
        return apply_irq(a, &t);
    }
    if t.vars.is_empty() {
        bail!(
            "{} sets no variables (the run measured no configuration?)",
            t.source.display()
        );
    }
    let format = match a.format {
        FormatArg::Shell => SnippetFormat::Shell,
        FormatArg::Slurm => SnippetFormat::Slurm,
        FormatArg::Torchrun => SnippetFormat::Torchrun,
        FormatArg::K8s => SnippetFormat::K8s,
    };
    print!(
        "{}",
        snippet(format, &t.vars).map_err(|e| anyhow::anyhow!("{}: {e}", t.source.display()))?
    );
    if let Some(p) = &t.irq_policy {
        eprintln!(
            "tcpx-run apply: the run also chose IRQ policy `{}`: `tcpx-run apply --irq {}` applies it",
            tcpx_report::safe::comment(p),
            tcpx_report::safe::shell_arg(&a.path.display().to_string())
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn apply_irq(a: &ApplyArgs, t: &TunedFile) -> Result<ExitCode> {
    use crate::cmd_irq::{IrqAction, IrqArgs, PolicyArgs, SpreadArg};
    let name = t.irq_policy.as_deref().unwrap_or("default");
    let recorded = t.irq_tx.as_deref().zip(t.irq_rx.as_deref());
    let root = tcpx_topo::SysRoot::new(&a.root);
    // The policy as the plan run computes it, from the topology under --root.
    let Some(policy) = tcpx_affinity::choice::policy_at(name, &root, recorded)
        .map_err(|e| anyhow::anyhow!("{}: {e}", t.source.display()))?
    else {
        println!(
            "{}: the chosen configuration leaves IRQs as they are; nothing to apply",
            t.source.display()
        );
        return Ok(ExitCode::SUCCESS);
    };
    let defaults = tcpx_topo::BindingRule::default();
    let args = IrqArgs {
        root: a.root.clone(),
        backup: a.backup.clone(),
        json: false,
        action: IrqAction::Apply {
            policy: PolicyArgs {
                tx: Some(policy.tx.to_string()),
                rx: Some(policy.rx.to_string()),
                spread: SpreadArg::OnePerQueue,
                reserved_cores: defaults.reserved_cores,
                cores_per_direction: defaults.cores_per_direction,
            },
            yes: a.yes,
            hold: a.hold,
        },
    };
    crate::cmd_irq::run(&args)
}
