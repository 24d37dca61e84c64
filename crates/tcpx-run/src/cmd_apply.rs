//! `tcpx-run apply <report dir | tuned.env | tuned.json>`: the tuned settings of a plan run as
//! `export` lines or job snippets (`--format slurm|torchrun|k8s`), and its IRQ policy applied
//! through `irq apply` (`--irq`: dry run unless `--yes`; backup, verify, `irq reset` to undo).
//! Several runs (`apply RUN1 RUN2 ...`) are merged into one set: each variable names its run,
//! and a variable set to different values is a conflict, refused unless `--on-conflict` says
//! how to settle it (`tcpx_report::merge`). `--watch` adds the variables that put the watch
//! shim in front of the plugin the settings name (`tcpx_watch::deploy`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use tcpx_report::merge::{merge, OnConflict};
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
    /// The file NCCL_CONF_FILE names: NAME=VALUE lines NCCL sets at init (its plugin sees them)
    NcclConf,
    /// A tuned.env (for several runs: the merged file, each variable naming its run)
    Env,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictArg {
    /// Refuse, naming each conflict and the run of each value
    Error,
    /// Leave conflicting variables out (listed in the output as comments)
    Omit,
    /// The value of the first run given that sets it
    First,
    /// The value of the last run given that sets it
    Last,
}

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// Plan runs' report directories, or their tuned.env / tuned.json; several are merged
    #[arg(required = true, num_args = 1..=64)]
    pub paths: Vec<PathBuf>,
    /// With several runs: what to do when they set a variable to different values
    #[arg(long, value_enum, default_value = "error")]
    pub on_conflict: ConflictArg,
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
    /// Put the watch shim in front of the plugin the settings name (NCCL_NET_PLUGIN=tcpxwatch,
    /// TCPX_WATCH_INNER, TCPX_WATCH_DIR); `tcpx-run watch DIR` reads what it writes
    #[arg(long, conflicts_with = "irq")]
    pub watch: bool,
    /// With --watch: the directory the shim writes into, on the job's nodes
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/tmp/tcpx-watch",
        requires = "watch"
    )]
    pub watch_dir: String,
}

/// The variables to print: the run's, with the watch shim's where --watch asks.
fn with_watch(a: &ApplyArgs, vars: Vec<(String, String)>) -> Result<Vec<(String, String)>> {
    if !a.watch {
        return Ok(vars);
    }
    if a.format == FormatArg::Env {
        bail!("--watch prints variables for a job (--format shell|slurm|torchrun|k8s|nccl-conf); --format env is the run's own tuned.env");
    }
    tcpx_watch::deploy::with_watch(&vars, &a.watch_dir).map_err(|e| anyhow::anyhow!("--watch: {e}"))
}

fn snippet_format(f: FormatArg) -> Option<SnippetFormat> {
    Some(match f {
        FormatArg::Shell => SnippetFormat::Shell,
        FormatArg::Slurm => SnippetFormat::Slurm,
        FormatArg::Torchrun => SnippetFormat::Torchrun,
        FormatArg::K8s => SnippetFormat::K8s,
        FormatArg::NcclConf => SnippetFormat::NcclConf,
        FormatArg::Env => return None,
    })
}

pub fn run(a: &ApplyArgs) -> Result<ExitCode> {
    if a.paths.len() > 1 {
        return run_merged(a);
    }
    let path = &a.paths[0];
    let t = load(path)?;
    if a.irq {
        return apply_irq(a, &t);
    }
    if t.vars.is_empty() {
        bail!(
            "{} sets no variables (the run measured no configuration?)",
            t.source.display()
        );
    }
    let vars = with_watch(a, t.vars.clone())?;
    match snippet_format(a.format) {
        Some(format) => print!(
            "{}",
            snippet(format, &vars).map_err(|e| anyhow::anyhow!("{}: {e}", t.source.display()))?
        ),
        None => {
            let m = merge(&[(t.run_name(), t.clone())], OnConflict::Error);
            print!("{}", m.env_text());
        }
    }
    if let Some(p) = &t.irq_policy {
        eprintln!(
            "tcpx-run apply: the run also chose IRQ policy `{}`: `tcpx-run apply --irq {}` applies it",
            tcpx_report::safe::comment(p),
            tcpx_report::safe::shell_arg(&path.display().to_string())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `apply RUN1 RUN2 ...`: the runs' decided variables as one set.
fn run_merged(a: &ApplyArgs) -> Result<ExitCode> {
    if a.irq {
        bail!("--irq applies one run's IRQ policy: give one run (the merged set names its run with --format env)");
    }
    let mut runs = Vec::new();
    for p in &a.paths {
        let t = load(p)?;
        runs.push((t.run_name(), t));
    }
    let on = match a.on_conflict {
        ConflictArg::Error => OnConflict::Error,
        ConflictArg::Omit => OnConflict::Omit,
        ConflictArg::First => OnConflict::First,
        ConflictArg::Last => OnConflict::Last,
    };
    let m = merge(&runs, on);
    if !m.conflicts.is_empty() {
        let list: Vec<String> = m
            .conflicts
            .iter()
            .map(|c| format!("  {}", c.text()))
            .collect();
        if on == OnConflict::Error {
            bail!(
                "the runs disagree:\n{}\nchoose with --on-conflict first|last (take that run's value) or omit (leave the variable out)",
                list.join("\n")
            );
        }
        eprintln!(
            "tcpx-run apply: conflicts settled by --on-conflict {:?}:\n{}",
            a.on_conflict,
            list.join("\n")
        );
    }
    if m.vars.is_empty() {
        bail!("the runs set no variables together (did their plans decide any knob?)");
    }
    let vars = with_watch(a, m.pairs())?;
    match snippet_format(a.format) {
        Some(format) => print!(
            "{}",
            snippet(format, &vars).map_err(|e| anyhow::anyhow!("merged runs: {e}"))?
        ),
        None => print!("{}", m.env_text()),
    }
    for v in &m.vars {
        eprintln!(
            "tcpx-run apply: {}={} from {}",
            tcpx_report::safe::comment(&v.name),
            tcpx_report::safe::comment(&v.value),
            tcpx_report::safe::comment(&v.runs.join(", "))
        );
    }
    if let Some((p, run)) = &m.irq_policy {
        eprintln!(
            "tcpx-run apply: {} also chose IRQ policy `{}`: `tcpx-run apply --irq <that run>` applies it",
            tcpx_report::safe::comment(run),
            tcpx_report::safe::comment(p)
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
