//! `tcpx-run fabric up|down|status`: an emulated two-node fabric on this machine (network
//! namespaces joined by rate-capped veth pairs, `tcpx-fabric`), and the stale-fabric line that
//! `doctor` and `topo` print.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tcpx_fabric::{Fabric, FabricStatus, Health, Node, Rate, Spec, Step, Topology, UpOptions};

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

pub fn run(args: &FabricArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        FabricCommand::Up(a) => up(a),
        FabricCommand::Down(a) => down(a),
        FabricCommand::Status(a) => status(a),
        FabricCommand::Exec(a) => exec(a),
    }
}

fn exec(a: &ExecArgs) -> anyhow::Result<ExitCode> {
    tcpx_fabric::require_root()?;
    let fabric = Fabric::open(&a.id, &dir(&a.state_dir))?;
    if fabric.state.phase != tcpx_fabric::Phase::Up {
        anyhow::bail!(
            "fabric `{}` is not up (its `fabric up` did not finish): `tcpx-run fabric status` says why",
            a.id
        );
    }
    let node = match a.node {
        NodeArg::A => Node::A,
        NodeArg::B => Node::B,
    };
    let (program, args) = a
        .command
        .split_first()
        .context("name the program to run after `--`")?;
    let mut cmd = fabric.command_in(node, program);
    cmd.args(args);
    // Marked, so NIC policies of runs in there take the fabric's emulated placement.
    fabric.mark(&mut cmd, node);
    let status = cmd
        .status()
        .with_context(|| format!("starting `{program}` in {}", fabric.ns(node)))?;
    // The command's own exit status is this command's (a signal death reads as 128 + signal).
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
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
    let fabric = Fabric::up_with(
        &spec,
        UpOptions {
            cancel: Some(&cancel),
            on_step: Some(&mut on_step),
        },
    )?;
    if !tcpx_fabric::netem_available() {
        eprintln!(
            "tcpx-run fabric: note: this kernel has no sch_netem, so NICs are rate-capped only (no --delay)"
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&fabric_json(&fabric))?);
    } else {
        print!("{}", describe(&fabric));
    }
    Ok(ExitCode::SUCCESS)
}

fn fabric_json(f: &Fabric) -> serde_json::Value {
    serde_json::json!({
        "state": f.state,
        "node_a": { "namespace": f.ns(Node::A), "nics": f.addrs(Node::A) },
        "node_b": { "namespace": f.ns(Node::B), "nics": f.addrs(Node::B) },
        "netem_available": tcpx_fabric::netem_available(),
    })
}

fn join_addrs(f: &Fabric, node: Node) -> String {
    f.addrs(node)
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn describe(f: &Fabric) -> String {
    let s = &f.state;
    let mut out = format!(
        "fabric `{}`: {} NIC(s) at {} per direction ({:.3} GB/s), {}, placement {}\n",
        s.id,
        s.nics,
        s.rate,
        s.rate.gbs(),
        s.delay.map_or("no added delay".to_string(), |d| format!(
            "{d} one-way delay"
        )),
        s.topology
    );
    out += &format!(
        "  node A: namespace {}  --nics {}\n",
        s.ns_a,
        join_addrs(f, Node::A)
    );
    out += &format!(
        "  node B: namespace {}  --nics {}\n",
        s.ns_b,
        join_addrs(f, Node::B)
    );
    out += &format!(
        "  run in a node: ip netns exec {} tcpx-run ...; remove: tcpx-run fabric down{}\n",
        s.ns_a,
        if s.id == tcpx_fabric::DEFAULT_ID {
            String::new()
        } else {
            format!(" --id {}", s.id)
        }
    );
    out
}

fn down(a: &DownArgs) -> anyhow::Result<ExitCode> {
    tcpx_fabric::require_root()?;
    let r = tcpx_fabric::down(&a.id, &dir(&a.state_dir))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if !r.removed_anything() {
        println!("fabric `{}`: nothing to remove", a.id);
    } else {
        println!(
            "fabric `{}` removed: namespaces {}{}{}",
            a.id,
            if r.namespaces_removed.is_empty() {
                "none".to_string()
            } else {
                r.namespaces_removed.join(", ")
            },
            r.state_file_removed
                .as_ref()
                .map_or(String::new(), |p| format!(", state file {p}")),
            if r.pids_killed.is_empty() {
                String::new()
            } else {
                format!(", processes killed {:?}", r.pids_killed)
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn status(a: &StatusArgs) -> anyhow::Result<ExitCode> {
    let all = tcpx_fabric::status(&dir(&a.state_dir)).context("reading the fabric status")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        println!("no emulated fabric on this machine");
    }
    for f in &all {
        print!("{}", render_status(f));
    }
    Ok(ExitCode::SUCCESS)
}

fn render_status(f: &FabricStatus) -> String {
    let head = match &f.health {
        Health::Up => "up".to_string(),
        Health::Creating { pid } => format!("being created by pid {pid}"),
        Health::Stale { why } => format!(
            "STALE ({}): remove it with `tcpx-run fabric down --id {}`",
            why.join("; "),
            f.id
        ),
    };
    let mut out = format!("fabric `{}`: {head}\n", f.id);
    if let Some(s) = &f.state {
        out += &format!(
            "  {} NIC(s) at {}, {}, placement {}; namespaces {} (node A), {} (node B)\n",
            s.nics,
            s.rate,
            s.delay
                .map_or("no delay".to_string(), |d| format!("{d} delay")),
            s.topology,
            s.ns_a,
            s.ns_b
        );
    }
    for n in &f.nics {
        let r = |x: Option<Rate>| x.map_or("no tbf".to_string(), |r| r.to_string());
        out += &format!(
            "  {}: {} <-> {}  A->B {}  B->A {}{}\n",
            n.name,
            n.addr_a,
            n.addr_b,
            r(n.rate_a_to_b),
            r(n.rate_b_to_a),
            if n.netem { ", netem" } else { "" }
        );
    }
    if f.health == Health::Up && !f.links_checked {
        out += "  (links and qdiscs not checked: that needs root)\n";
    }
    out
}

/// One line per stale fabric, for `doctor` and `topo` on the live machine; None when there is
/// none (or when `root` is a fixture tree, or the state cannot be read: then nothing is claimed).
pub fn stale_summary(root: &Path) -> Option<String> {
    if root != Path::new("/") {
        return None;
    }
    let stale = tcpx_fabric::stale(&tcpx_fabric::default_state_dir()).ok()?;
    if stale.is_empty() {
        return None;
    }
    Some(
        stale
            .iter()
            .map(|f| match &f.health {
                Health::Stale { why } => format!("fabric `{}`: {}", f.id, why.join("; ")),
                _ => format!("fabric `{}`", f.id),
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}
