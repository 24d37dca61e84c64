//! `tcpx-run fabric up|down|status|exec`: an emulated two-node fabric on this machine (network
//! namespaces joined by rate-capped veth pairs, `tcpx-fabric`; what is printed comes from
//! `tcpx_fabric::text`), and the stale-fabric line that `doctor` and `topo` print.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
pub use tcpx_fabric::stale_summary;
use tcpx_fabric::{text, Fabric, Node, Rate, Spec, Step, Topology, UpOptions};

#[derive(clap::Args, Debug)]
pub struct FabricArgs {
    #[command(subcommand)]
    pub command: FabricCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum FabricCommand {
    /// Create node A and node B (namespaces tcpx-a-<id>, tcpx-b-<id>) joined by N NICs (root).
    Up(UpArgs),
    /// Remove a fabric: processes inside it, its namespaces, links, qdiscs and state file (root).
    Down(DownArgs),
    /// Show every fabric on this machine and whether it is up, being created or stale.
    Status(StatusArgs),
    /// Run a command inside node A or node B (root): `fabric exec b -- tcpx-run follow --leader 10.231.0.1`.
    Exec(ExecArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum NodeArg {
    /// Node A (the leader's side; addresses 10.231.k.1).
    A,
    /// Node B (the follower's side; addresses 10.231.k.2).
    B,
}

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    #[arg(value_enum)]
    pub node: NodeArg,
    #[arg(long, default_value = tcpx_fabric::DEFAULT_ID)]
    pub id: String,
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Emulated NICs (veth pairs eth1..ethN); at most 4 with --topology a3-high.
    #[arg(long, default_value_t = 4)]
    pub nics: u32,
    /// Cap of each direction of each NIC, in bits per second (2gbit, 500mbit, 2G).
    #[arg(long, default_value = "2gbit")]
    pub rate: Rate,
    /// One-way delay per direction (5ms, 250us); needs the kernel's sch_netem.
    #[arg(long)]
    pub delay: Option<tcpx_fabric::Delay>,
    /// NUMA/PCI placement given to the emulated NICs and GPUs: a3-high or flat.
    #[arg(long, default_value = "a3-high")]
    pub topology: Topology,
    /// Fabric id (names the namespaces and the state file); several can exist at once.
    #[arg(long, default_value = tcpx_fabric::DEFAULT_ID)]
    pub id: String,
    /// State directory (default: $TCPX_FABRIC_STATE_DIR, else /run/tcpx-fabric).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Print the fabric as JSON.
    #[arg(long)]
    pub json: bool,
    /// Test hook: after the namespaces exist, print `{"paused":"namespaces-added"}` on stdout
    /// and wait for a line on stdin, so a test can kill `up` half-way.
    #[arg(long, hide = true)]
    pub test_pause_after_namespaces: bool,
}

#[derive(clap::Args, Debug)]
pub struct DownArgs {
    #[arg(long, default_value = tcpx_fabric::DEFAULT_ID)]
    pub id: String,
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

fn dir(d: &Option<PathBuf>) -> PathBuf {
    d.clone().unwrap_or_else(tcpx_fabric::default_state_dir)
}

/// Prints a value as pretty JSON and returns success.
macro_rules! print_json {
    ($v:expr) => {{
        println!("{}", serde_json::to_string_pretty($v)?);
        Ok(ExitCode::SUCCESS)
    }};
}

pub fn run(args: &FabricArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        FabricCommand::Up(a) => up(a),
        FabricCommand::Down(a) => {
            tcpx_fabric::require_root()?;
            let r = tcpx_fabric::down(&a.id, &dir(&a.state_dir))?;
            if a.json {
                return print_json!(&r);
            }
            println!("{}", text::down_summary(&r));
            Ok(ExitCode::SUCCESS)
        }
        FabricCommand::Status(a) => {
            let all =
                tcpx_fabric::status(&dir(&a.state_dir)).context("reading the fabric status")?;
            if a.json {
                return print_json!(&all);
            }
            print!("{}", text::render_all(&all));
            Ok(ExitCode::SUCCESS)
        }
        FabricCommand::Exec(a) => {
            tcpx_fabric::require_root()?;
            let node = match a.node {
                NodeArg::A => Node::A,
                NodeArg::B => Node::B,
            };
            let (mut cmd, ns) = text::exec_command(&a.id, &dir(&a.state_dir), node, &a.command)?;
            let status = cmd
                .status()
                .with_context(|| format!("starting `{}` in {ns}", a.command[0]))?;
            // The command's own exit status is this command's.
            Ok(ExitCode::from(text::exit_code(status)))
        }
    }
}

fn up(a: &UpArgs) -> anyhow::Result<ExitCode> {
    // Refuse before installing handlers or touching anything.
    tcpx_fabric::require_root()?;
    let spec = Spec {
        id: a.id.clone(),
        nics: a.nics,
        rate: a.rate,
        delay: a.delay,
        topology: a.topology,
        state_dir: dir(&a.state_dir),
    };
    let cancel = tcpx_fabric::cancel_on_signals().map_err(anyhow::Error::msg)?;
    let pause = a.test_pause_after_namespaces;
    let mut on_step = |s: Step| {
        if pause && s == Step::NamespacesAdded {
            println!("{}", serde_json::json!({ "paused": "namespaces-added" }));
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        }
    };
    let opts = UpOptions {
        cancel: Some(&cancel),
        on_step: Some(&mut on_step),
    };
    let fabric = Fabric::up_with(&spec, opts)?;
    if !tcpx_fabric::netem_available() {
        eprintln!(
            "tcpx-run fabric: note: this kernel has no sch_netem, so NICs are rate-capped only (no --delay)"
        );
    }
    if a.json {
        return print_json!(&text::to_json(&fabric));
    }
    print!("{}", text::describe(&fabric));
    Ok(ExitCode::SUCCESS)
}
