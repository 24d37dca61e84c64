//! tcpx-run: the command line over the tcpx-lab crates. Each subcommand lives in its own module
//! and only parses arguments, calls a library crate and prints; the work is done in the crates.
//!
//! Exit status: 0 done (and, for plans, every criterion passed); 1 a result that fails (wrong
//! bytes received, or a plan's criterion failed); 2 the command could not complete: a usage error (clap's own, or a value out of range,
//! always naming the flag) or a failure while running (the message says which). Both are 2 so
//! that scripts need one check for "no trustworthy result"; the message tells them apart.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod backend_env;
mod cmd_apply;
mod cmd_baseline;
mod cmd_bench;
mod cmd_doctor;
mod cmd_fabric;
mod cmd_fleet;
mod cmd_follow;
mod cmd_irq;
mod cmd_plan;
mod cmd_topo;
mod cmd_tune;
mod cmd_validate;
mod cmd_watch;
mod flow_launcher;

/// `--version` and the `version` of every `--json` document: the package version and the git
/// commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("TCPX_GIT_COMMIT"),
    ")"
);

/// Measure and tune point-to-point GPU transfers over TCP.
#[derive(Parser)]
#[command(
    name = "tcpx-run",
    version = VERSION,
    about,
    long_about = None,
    after_help = "Exit status: 0 done; 1 wrong bytes or a failed plan criterion; 2 could not complete (usage error or failure; the message says which)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One experiment between a server (receiver) and a client (sender), or both locally.
    Bench(Box<cmd_bench::BenchArgs>),
    /// Plain multi-stream TCP over loopback: the yardstick `bench` is compared against.
    Baseline(cmd_baseline::BaselineArgs),
    /// Check GPUDirect-TCPX's prerequisites (plugin, rxdm, NICs, bindings, user) and say what to fix.
    Doctor(cmd_doctor::DoctorArgs),
    /// CPUs, NUMA nodes, GPUs, NICs and the TX/RX cores derived for each NIC.
    Topo(cmd_topo::TopoArgs),
    /// NIC queue IRQs: show, plan, apply (dry run unless --yes), reset.
    Irq(cmd_irq::IrqArgs),
    /// Run a plan (same as `tcpx-run plans/x.rhai`): experiments, criteria, report directory.
    Plan(cmd_plan::PlanArgs),
    /// Serve a plan leader's experiments from this node (the other side of a plan run).
    Follow(cmd_follow::FollowArgs),
    /// Fleet qualification: every pair of N nodes measured per NIC, the slow node, NIC or pair named.
    Fleet(Box<cmd_fleet::FleetArgs>),
    /// An emulated two-node fabric here: namespaces joined by rate-capped NICs (up, down, status).
    Fabric(cmd_fabric::FabricArgs),
    /// A plan run's tuned settings as export lines or job snippets, or its IRQ policy applied.
    Apply(cmd_apply::ApplyArgs),
    /// libnccl send/recv with NCCL's defaults vs a run's tuned settings, interleaved: the gain.
    Validate(cmd_validate::ValidateArgs),
    /// Search a backend's own settings (NCCL's, the plugin's, the socket backend's) within a budget.
    Tune(Box<cmd_tune::TuneArgs>),
    /// What the watch shim saw in a job: GB/s per NIC and link, start-up times, idle or slow NICs.
    Watch(Box<cmd_watch::WatchArgs>),
    /// Shell completions: `tcpx-run completions bash > /etc/bash_completion.d/tcpx-run`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// `tcpx-run plans/x.rhai [options]`: a plan file given as the command.
    #[command(external_subcommand)]
    External(Vec<String>),
}

/// Prints a `--json` document, pretty, on stdout.
pub fn print_json(doc: serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // Under `ulimit -v`, glibc's 64 MiB arena per contending thread would use up the limit and
    // abort the run on a small allocation; two arenas leave it to what the run allocates.
    tcpx_ffi::malloc::cap_malloc_arenas_under_address_limit(2);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only for a terminal: logs and pipes get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    // An IRQ policy applied for an experiment is restored on Ctrl-C / SIGTERM, then the run ends
    // as an interrupted one.
    tcpx_affinity::restore_on_interrupt(|restored| {
        eprintln!("tcpx-affinity: interrupted; restored {restored} IRQ affinity backup(s)");
        std::process::exit(130);
    });
    let result = match &cli.command {
        Command::Bench(a) => cmd_bench::run(a),
        Command::Baseline(a) => cmd_baseline::run(a),
        Command::Doctor(a) => cmd_doctor::run(a),
        Command::Topo(a) => cmd_topo::run(a),
        Command::Irq(a) => cmd_irq::run(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Follow(a) => cmd_follow::run(a),
        Command::Fabric(a) => cmd_fabric::run(a),
        Command::Fleet(a) => cmd_fleet::run(a),
        Command::Apply(a) => cmd_apply::run(a),
        Command::Validate(a) => cmd_validate::run(a),
        Command::Tune(a) => cmd_tune::run(a),
        Command::Watch(a) => cmd_watch::run(a),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "tcpx-run", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::External(w) => cmd_plan::run_external(w),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tcpx-run: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
