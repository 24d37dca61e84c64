//! xtask: repository chores as `cargo xtask <command>` (alias in .cargo/config.toml).
//!
//! Not for: anything the shipped tools need at run time.

#![forbid(unsafe_code)]

mod bench;
mod calibrate;
mod ci;
mod gpu_test;
mod report;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "tcpx-lab repository tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the GPU tests and benchmarks, bundle them with their shared libraries into
    /// .device-bundle/, and write .device-bundle/run.sh to run on a GPU machine.
    GpuTest(gpu_test::GpuTestArgs),
    /// Format check, clippy (warnings denied) and every test: what CI runs.
    Ci {
        /// Only the Python package's step (wheel, install, pytest).
        #[arg(long)]
        python_only: bool,
    },
    /// tcpx-run's socket backend against plain multi-stream TCP on loopback, as a markdown table.
    Bench(bench::BenchArgs),
    /// Index of the plan runs in reports/ (index.md, index.html), or `--compare A B`.
    Report(report::ReportArgs),
    /// The verdict statistics on effects of known size (emulated fabric and loopback; root).
    Calibrate(calibrate::CalibrateArgs),
}

fn workspace_root() -> PathBuf {
    // xtask/ sits directly under the workspace root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::GpuTest(args) => gpu_test::run(&workspace_root(), args),
        Cmd::Ci { python_only: false } => ci::run(&workspace_root()),
        Cmd::Ci { python_only: true } => ci::python_tests(&workspace_root()),
        Cmd::Bench(args) => bench::run(&workspace_root(), args),
        Cmd::Report(args) => report::run(&workspace_root(), args),
        Cmd::Calibrate(args) => calibrate::run(&workspace_root(), args),
    }
}
