//! `tcpx-run fabric up|down|status|exec|fault`: an emulated fabric of 2 to 8 nodes on this machine
//! (network namespaces joined by rate-capped veth pairs, or through a switch namespace beyond two
//! nodes, `tcpx-fabric`; what is printed comes from `tcpx_fabric::text`), faults set on it, and
//! the stale-fabric line that `doctor` and `topo` print.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
pub use tcpx_fabric::stale_summary;
use tcpx_fabric::{text, Fabric, FaultChange, Node, Rate, Spec, Step, Topology, UpOptions};

#[derive(clap::Args, Debug)]
pub struct FabricArgs {
    #[command(subcommand)]
    pub command: FabricCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum FabricCommand {
    /// Create node A and node B (namespaces tcpx-a-<id>, tcpx-b-<id>) joined by N NICs, or up to
    /// 8 nodes behind a switch with --nodes (root).
    Up(UpArgs),
    /// Remove a fabric: processes inside it, its namespaces, links, qdiscs and state file (root).
    Down(DownArgs),
    /// Show every fabric on this machine and whether it is up, being created or stale.
    Status(StatusArgs),
    /// Run a command inside a node (root): `fabric exec b -- tcpx-run follow --leader 10.231.0.1`.
    Exec(ExecArgs),
    /// Set or clear faults on a running fabric (root): `fabric fault c:eth2:cap=500mbit`,
    /// `b:eth1:loss=5%`, `d:eth3:down`; undo with `up`, `uncap`, `no-loss` or `clear`.
    Fault(FaultArgs),
}

/// A node's letter: a (the leader's side, addresses 10.231.k.1), b (10.231.k.2), c, ... h.
fn parse_node(s: &str) -> Result<Node, String> {
    Node::from_letter(s).ok_or_else(|| format!("`{s}` is not a node: give a letter from a to h"))
}

/// Which fabric a command acts on: its id, in the state directory given (else the default).
#[derive(clap::Args, Debug)]
pub struct FabricAt {
    #[arg(long, default_value = tcpx_fabric::DEFAULT_ID)]
    pub id: String,
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl FabricAt {
    fn state_dir(&self) -> PathBuf {
        dir(&self.state_dir)
    }
}

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// The node: a (the leader's side; addresses 10.231.k.1), b (10.231.k.2), c, ... h.
    #[arg(value_parser = parse_node)]
    pub node: Node,
    #[command(flatten)]
    pub fabric: FabricAt,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct FaultArgs {
    /// NODE:NIC:WHAT, one or more: c:eth2:cap=500mbit, b:eth1:loss=5%, d:eth3:down; c:eth2:up,
    /// c:eth2:uncap, b:eth1:no-loss, c:eth2:clear undo them.
    #[arg(required = true)]
    pub changes: Vec<FaultChange>,
    #[command(flatten)]
    pub fabric: FabricAt,
    /// Print the faults in effect afterwards as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Nodes, 2 to 8: two are joined by veth pairs, more through a switch namespace
    /// (tcpx-sw-<id>) with one bridge per NIC; namespaces tcpx-a-<id>, tcpx-b-<id>, tcpx-c-<id>, ...
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
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
    /// A fault set once the fabric is up, NODE:NIC:WHAT (repeatable): c:eth2:cap=500mbit,
    /// b:eth1:loss=5%, d:eth3:down (see `fabric fault`).
    #[arg(long = "fault")]
    pub faults: Vec<FaultChange>,
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
    #[command(flatten)]
    pub fabric: FabricAt,
    #[arg(long)]
    pub json: bool,
    /// Remove the fabric even though its state file says a `fabric up` (a live pid) is still
    /// bringing it up: for a stale state file whose pid is some other process.
    #[arg(long)]
    pub force: bool,
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
            let r = tcpx_fabric::down_with(&a.fabric.id, &a.fabric.state_dir(), a.force)?;
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
            let (mut cmd, ns) =
                text::exec_command(&a.fabric.id, &a.fabric.state_dir(), a.node, &a.command)?;
            let status = cmd
                .status()
                .with_context(|| format!("starting `{}` in {ns}", a.command[0]))?;
            // The command's own exit status is this command's.
            Ok(ExitCode::from(text::exit_code(status)))
        }
        FabricCommand::Fault(a) => {
            tcpx_fabric::require_root()?;
            let mut fabric = Fabric::open(&a.fabric.id, &a.fabric.state_dir())?;
            for c in &a.changes {
                let line = fabric.apply(c)?;
                if !a.json {
                    println!("fabric `{}`: {line}", a.fabric.id);
                }
            }
            if a.json {
                return print_json!(&fabric.faults());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn up(a: &UpArgs) -> anyhow::Result<ExitCode> {
    // Refuse before installing handlers or touching anything.
    tcpx_fabric::require_root()?;
    let spec = Spec {
        id: a.id.clone(),
        nodes: a.nodes,
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
    let mut fabric = Fabric::up_with(&spec, opts)?;
    for c in &a.faults {
        if let Err(e) = fabric.apply(c) {
            // A fabric without the fault asked for would mislead: remove it, as any failed `up`.
            let removed = fabric.down();
            return Err(anyhow::Error::new(e).context(format!(
                "setting a fault on fabric `{}` failed, so it was removed again{}",
                a.id,
                removed
                    .err()
                    .map_or(String::new(), |e| format!(" (removing it failed too: {e})"))
            )));
        }
    }
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
