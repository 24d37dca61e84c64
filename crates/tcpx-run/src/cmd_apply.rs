//! `tcpx-run apply <report dir | tuned.env | tuned.json>`: the tuned settings of a plan run as
//! `export` lines or job snippets (`--format slurm|torchrun|k8s`), and its IRQ policy applied
//! through `irq apply` (`--irq`: dry run unless `--yes`; backup, verify, `irq reset` to undo).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use tcpx_report::tuned::{parse_env, snippet, SnippetFormat, Tuned};

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

/// What a tuned file gives `apply`.
pub struct Loaded {
    pub vars: Vec<(String, String)>,
    pub irq_policy: Option<String>,
    pub irq_tx: Option<String>,
    pub irq_rx: Option<String>,
    pub source: PathBuf,
}

/// Reads a report directory (its tuned.json, else tuned.env), a tuned.json or a tuned.env.
pub fn load(path: &Path) -> Result<Loaded> {
    let file = if path.is_dir() {
        let json = path.join("tuned.json");
        if json.is_file() {
            json
        } else {
            path.join("tuned.env")
        }
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "reading {} (give a plan run's report directory, or its tuned.env or tuned.json)",
            file.display()
        )
    })?;
    if file.extension().is_some_and(|e| e == "json") {
        let t: Tuned = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a tuned.json of this version", file.display()))?;
        return Ok(Loaded {
            vars: t.pairs(),
            irq_policy: t.irq_policy,
            irq_tx: t.irq_tx,
            irq_rx: t.irq_rx,
            source: file,
        });
    }
    let parsed = parse_env(&text).with_context(|| format!("reading {}", file.display()))?;
    Ok(Loaded {
        vars: parsed.vars,
        irq_policy: parsed.irq_policy,
        irq_tx: None,
        irq_rx: None,
        source: file,
    })
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
    print!("{}", snippet(format, &t.vars));
    if let Some(p) = &t.irq_policy {
        eprintln!(
            "tcpx-run apply: the run also chose IRQ policy `{p}`: `tcpx-run apply --irq {}` applies it",
            a.path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn apply_irq(a: &ApplyArgs, t: &Loaded) -> Result<ExitCode> {
    use crate::cmd_irq::{IrqAction, IrqArgs, PolicyArgs, SpreadArg};
    let (tx, rx) = match t.irq_policy.as_deref() {
        None | Some("default") => {
            println!(
                "{}: the chosen configuration leaves IRQs as they are; nothing to apply",
                t.source.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        // NCCL's TX/RX cores: as the run recorded them, else derived here from the topology.
        Some("nccl") => (t.irq_tx.clone(), t.irq_rx.clone()),
        Some(other) => bail!(
            "IRQ policy `{other}` is not applied by `apply`: use `tcpx-run irq apply --tx SPEC --rx SPEC` with the cores you want"
        ),
    };
    let defaults = tcpx_topo::BindingRule::default();
    let args = IrqArgs {
        root: a.root.clone(),
        backup: a.backup.clone(),
        json: false,
        action: IrqAction::Apply {
            policy: PolicyArgs {
                tx,
                rx,
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
