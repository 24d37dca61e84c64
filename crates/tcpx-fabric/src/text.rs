//! What the `fabric` commands show: a fabric described after `up` (text and JSON), what `down`
//! removed, each fabric's status, the one line `doctor` and `topo` print for stale fabrics, and
//! the `exec` command inside a node with its exit status. Pure functions over the fabric's types
//! (apart from [`stale_summary`] and [`exec_command`], which read the state directory), so a
//! command-line front end only parses arguments and prints.

use std::path::Path;
use std::process::{Command, ExitStatus};

use crate::{Fabric, FabricError, FabricStatus, Health, Node, Phase, Rate, DEFAULT_ID};

/// A fabric as JSON (`fabric up --json`): its state, each node's namespace and NIC addresses
/// (`node_a`, `node_b`, and every node in order under `nodes`), and whether this kernel has
/// sch_netem.
pub fn to_json(f: &Fabric) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = f
        .nodes()
        .into_iter()
        .map(|n| serde_json::json!({ "node": n, "namespace": f.ns(n), "nics": f.addrs(n) }))
        .collect();
    serde_json::json!({
        "state": f.state,
        "node_a": { "namespace": f.ns(Node::A), "nics": f.addrs(Node::A) },
        "node_b": { "namespace": f.ns(Node::B), "nics": f.addrs(Node::B) },
        "nodes": nodes,
        "netem_available": crate::netem_available(),
    })
}

/// A fabric in words (`fabric up`): NICs, rate, delay, placement, each node's namespace and
/// `--nics`, and how to use and remove it.
pub fn describe(f: &Fabric) -> String {
    let s = &f.state;
    let mut out = format!(
        "fabric `{}`: {}{} NIC(s) at {} per direction ({:.3} GB/s), {}, placement {}\n",
        s.id,
        if s.switch_ns.is_some() {
            format!("{} nodes, ", s.nodes)
        } else {
            String::new()
        },
        s.nics,
        s.rate,
        s.rate.gbs(),
        s.delay.map_or("no added delay".to_string(), |d| format!(
            "{d} one-way delay"
        )),
        s.topology
    );
    for node in f.nodes() {
        out += &format!(
            "  {}: namespace {}  --nics {}\n",
            node.label(),
            f.ns(node),
            f.nics_arg(node)
        );
    }
    if let Some(sw) = &s.switch_ns {
        out += &format!(
            "  switch: namespace {sw}, one bridge per NIC ({}), port <node>-ethK for each node's NIC\n",
            (0..s.nics)
                .map(crate::bridge_name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for fault in &s.faults {
        out += &format!("  fault: {fault}\n");
    }
    out += &format!(
        "  run in a node: ip netns exec {} tcpx-run ...; remove: tcpx-run fabric down{}\n",
        s.ns_a,
        if s.id == DEFAULT_ID {
            String::new()
        } else {
            format!(" --id {}", s.id)
        }
    );
    out
}

/// What `down` removed, in one line.
pub fn down_summary(r: &crate::DownReport) -> String {
    if !r.removed_anything() {
        return format!("fabric `{}`: nothing to remove", r.id);
    }
    format!(
        "fabric `{}` removed: namespaces {}{}{}",
        r.id,
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
    )
}

/// One fabric's status (`fabric status`): its health, what its state says, each NIC's rates.
pub fn render_status(f: &FabricStatus) -> String {
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
        let delay = s
            .delay
            .map_or("no delay".to_string(), |d| format!("{d} delay"));
        match &s.switch_ns {
            None => {
                out += &format!(
                    "  {} NIC(s) at {}, {delay}, placement {}; namespaces {} (node A), {} (node B)\n",
                    s.nics, s.rate, s.topology, s.ns_a, s.ns_b
                )
            }
            Some(sw) => {
                out += &format!(
                    "  {} nodes behind switch {sw}, {} NIC(s) each at {}, {delay}, placement {}; namespaces {}\n",
                    s.nodes,
                    s.nics,
                    s.rate,
                    s.topology,
                    s.namespaces().join(", ")
                )
            }
        }
        for fault in &s.faults {
            out += &format!("  fault: {fault}\n");
        }
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
    for p in &f.ports {
        let r = |x: Option<Rate>| x.map_or("no tbf".to_string(), |r| r.to_string());
        out += &format!(
            "  {} {}: {}  out {}  in {}{}{}\n",
            p.node.label(),
            p.name,
            p.addr,
            r(p.rate_out),
            r(p.rate_in),
            if p.netem { ", netem" } else { "" },
            if p.up { "" } else { ", DOWN" }
        );
    }
    if f.health == Health::Up && !f.links_checked {
        out += "  (links and qdiscs not checked: that needs root)\n";
    }
    out
}

/// Every fabric of `all` at once (`fabric status` without `--json`).
pub fn render_all(all: &[FabricStatus]) -> String {
    if all.is_empty() {
        return "no emulated fabric on this machine\n".to_string();
    }
    all.iter().map(render_status).collect()
}

/// One line naming each stale fabric of `stale` and why; `None` when there is none.
pub fn stale_line(stale: &[FabricStatus]) -> Option<String> {
    let line = stale
        .iter()
        .filter(|f| f.is_stale())
        .map(|f| match &f.health {
            Health::Stale { why } => format!("fabric `{}`: {}", f.id, why.join("; ")),
            _ => format!("fabric `{}`", f.id),
        })
        .collect::<Vec<_>>()
        .join("; ");
    (!line.is_empty()).then_some(line)
}

/// One line per stale fabric, for `doctor` and `topo` on the live machine; `None` when there is
/// none (or when `root` is a fixture tree, or the state cannot be read: then nothing is claimed).
pub fn stale_summary(root: &Path) -> Option<String> {
    if root != Path::new("/") {
        return None;
    }
    stale_line(&crate::stale(&crate::default_state_dir()).ok()?)
}

/// Why `fabric exec` cannot run its command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(
        "fabric `{0}` is not up (its `fabric up` did not finish): `tcpx-run fabric status` says why"
    )]
    NotUp(String),
    #[error("name the program to run after `--`")]
    NoProgram,
}

/// `command` (program and arguments) to be run inside `node` of fabric `id`, marked with the
/// fabric and node (so NIC policies of runs in there take the emulated placement); refused
/// unless the fabric is up. Returns the namespace too, for messages.
pub fn exec_command(
    id: &str,
    state_dir: &Path,
    node: Node,
    command: &[String],
) -> Result<(Command, String), ExecError> {
    let fabric = Fabric::open(id, state_dir)?;
    if fabric.state.phase != Phase::Up {
        return Err(ExecError::NotUp(id.to_string()));
    }
    if node.index() >= fabric.state.nodes {
        return Err(ExecError::Fabric(FabricError::NotInFabric {
            id: id.to_string(),
            what: node.label().to_string(),
            nodes: fabric.state.nodes,
            nics: fabric.state.nics,
        }));
    }
    let (program, args) = command.split_first().ok_or(ExecError::NoProgram)?;
    let mut cmd = fabric.command_in(node, program);
    cmd.args(args);
    fabric.mark(&mut cmd, node);
    Ok((cmd, fabric.ns(node).to_string()))
}

/// A command's exit status as this process's exit code: its own code, 128 + signal for a signal
/// death (as shells report it), clamped to 0..=255.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    code.clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DownReport, NicStatus, State, Topology};
    use std::os::unix::process::ExitStatusExt;

    fn state(id: &str) -> State {
        State {
            id: id.into(),
            ns_a: format!("tcpx-a-{id}"),
            ns_b: format!("tcpx-b-{id}"),
            nodes: 2,
            switch_ns: None,
            nics: 2,
            rate: "2gbit".parse().unwrap(),
            delay: None,
            topology: Topology::A3High,
            creator_pid: 1,
            phase: Phase::Up,
            faults: Vec::new(),
        }
    }

    fn fabric(id: &str) -> Fabric {
        Fabric {
            state: state(id),
            state_dir: "/nonexistent".into(),
        }
    }

    #[test]
    fn a_fabric_is_described_with_its_nics_and_how_to_remove_it() {
        let d = describe(&fabric(DEFAULT_ID));
        assert!(
            d.starts_with("fabric `fabric`: 2 NIC(s) at 2gbit per direction (0.250 GB/s), no added delay, placement a3-high\n"),
            "{d}"
        );
        assert!(
            d.contains("node A: namespace tcpx-a-fabric  --nics 10.231.0.1,10.231.1.1"),
            "{d}"
        );
        assert!(d.contains("node B: namespace tcpx-b-fabric  --nics 10.231.0.2,10.231.1.2"));
        assert!(
            d.trim_end().ends_with("remove: tcpx-run fabric down"),
            "{d}"
        );
        let other = describe(&fabric("lab"));
        assert!(other.contains("fabric down --id lab"), "{other}");
        let j = to_json(&fabric("lab"));
        assert_eq!(j["node_b"]["namespace"], "tcpx-b-lab");
        assert_eq!(j["node_a"]["nics"][1], "10.231.1.1");
        assert_eq!(j["state"]["nics"], 2);
    }

    #[test]
    fn a_four_node_fabric_is_described_node_by_node_with_its_switch_and_faults() {
        let mut f = fabric("big");
        f.state.nodes = 4;
        f.state.switch_ns = Some("tcpx-sw-big".into());
        f.state.faults.push(crate::Fault {
            node: Node::new(2).unwrap(),
            nic: 1,
            kind: crate::FaultKind::Cap("500mbit".parse().unwrap()),
            method: None,
        });
        let d = describe(&f);
        assert!(
            d.starts_with("fabric `big`: 4 nodes, 2 NIC(s) at 2gbit per direction"),
            "{d}"
        );
        assert!(
            d.contains("node C: namespace tcpx-c-big  --nics 10.231.0.3,10.231.1.3\n"),
            "{d}"
        );
        assert!(d.contains("node D: namespace tcpx-d-big  --nics 10.231.0.4,10.231.1.4"));
        assert!(
            d.contains("switch: namespace tcpx-sw-big, one bridge per NIC (br1, br2)"),
            "{d}"
        );
        assert!(d.contains("fault: node C eth2 capped at 500mbit\n"), "{d}");
        let j = to_json(&f);
        assert_eq!(j["nodes"][3]["namespace"], "tcpx-d-big");
        assert_eq!(j["nodes"][2]["node"], "c");
        assert_eq!(j["nodes"][2]["nics"][1], "10.231.1.3");
        assert_eq!(j["state"]["faults"][0]["node"], "c");
        let mut st = status("big", Health::Up);
        st.state = Some(f.state.clone());
        st.links_checked = true;
        st.ports = vec![crate::PortStatus {
            node: Node::new(2).unwrap(),
            name: "eth2".into(),
            addr: "10.231.1.3".parse().unwrap(),
            rate_out: Some("500mbit".parse().unwrap()),
            rate_in: Some("500mbit".parse().unwrap()),
            up: false,
            netem: false,
        }];
        let t = render_status(&st);
        assert!(
            t.contains("4 nodes behind switch tcpx-sw-big, 2 NIC(s) each at 2gbit, no delay, placement a3-high; namespaces tcpx-a-big, tcpx-b-big, tcpx-c-big, tcpx-d-big, tcpx-sw-big"),
            "{t}"
        );
        assert!(
            t.contains("  fault: node C eth2 capped at 500mbit\n"),
            "{t}"
        );
        assert!(
            t.contains("  node C eth2: 10.231.1.3  out 500mbit  in 500mbit, DOWN\n"),
            "{t}"
        );
    }

    #[test]
    fn down_says_what_it_removed_or_that_there_was_nothing() {
        let nothing = DownReport {
            id: "x".into(),
            ..DownReport::default()
        };
        assert_eq!(down_summary(&nothing), "fabric `x`: nothing to remove");
        let r = DownReport {
            id: "x".into(),
            namespaces_removed: vec!["tcpx-a-x".into(), "tcpx-b-x".into()],
            pids_killed: vec![42],
            state_file_removed: Some("/run/tcpx-fabric/x.json".into()),
        };
        assert_eq!(
            down_summary(&r),
            "fabric `x` removed: namespaces tcpx-a-x, tcpx-b-x, state file /run/tcpx-fabric/x.json, processes killed [42]"
        );
        let only_state = DownReport {
            id: "x".into(),
            state_file_removed: Some("/s/x.json".into()),
            ..DownReport::default()
        };
        assert_eq!(
            down_summary(&only_state),
            "fabric `x` removed: namespaces none, state file /s/x.json"
        );
    }

    fn status(id: &str, health: Health) -> FabricStatus {
        FabricStatus {
            id: id.into(),
            ns_a: format!("tcpx-a-{id}"),
            ns_b: format!("tcpx-b-{id}"),
            state: Some(state(id)),
            namespaces_present: Vec::new(),
            health,
            nics: Vec::new(),
            ports: Vec::new(),
            links_checked: false,
        }
    }

    #[test]
    fn status_shows_health_state_and_each_nic() {
        let mut up = status("a", Health::Up);
        up.links_checked = true;
        up.nics = vec![NicStatus {
            name: "eth1".into(),
            addr_a: "10.231.0.1".parse().unwrap(),
            addr_b: "10.231.0.2".parse().unwrap(),
            rate_a_to_b: Some("2gbit".parse().unwrap()),
            rate_b_to_a: None,
            netem: true,
        }];
        let t = render_status(&up);
        assert!(t.starts_with("fabric `a`: up\n"), "{t}");
        assert!(
            t.contains("2 NIC(s) at 2gbit, no delay, placement a3-high; namespaces tcpx-a-a (node A), tcpx-b-a (node B)"),
            "{t}"
        );
        assert!(
            t.contains("eth1: 10.231.0.1 <-> 10.231.0.2  A->B 2gbit  B->A no tbf, netem"),
            "{t}"
        );
        assert!(!t.contains("not checked"), "{t}");
        let unchecked = render_status(&status("b", Health::Up));
        assert!(unchecked.contains("(links and qdiscs not checked: that needs root)"));
        let creating = render_status(&status("c", Health::Creating { pid: 7 }));
        assert!(creating.starts_with("fabric `c`: being created by pid 7"));
        let stale = status(
            "d",
            Health::Stale {
                why: vec!["no state file".into(), "its creator died".into()],
            },
        );
        assert!(render_status(&stale).starts_with(
            "fabric `d`: STALE (no state file; its creator died): remove it with `tcpx-run fabric down --id d`"
        ));
        assert_eq!(render_all(&[]), "no emulated fabric on this machine\n");
        assert_eq!(
            render_all(&[up.clone(), stale.clone()]),
            render_status(&up) + &render_status(&stale)
        );
    }

    #[test]
    fn the_stale_line_names_each_stale_fabric_and_only_those() {
        assert_eq!(stale_line(&[]), None);
        assert_eq!(stale_line(&[status("ok", Health::Up)]), None);
        let s = |id: &str, why: &str| {
            status(
                id,
                Health::Stale {
                    why: vec![why.into()],
                },
            )
        };
        assert_eq!(
            stale_line(&[
                s("x", "no state file"),
                status("ok", Health::Up),
                s("y", "half made")
            ])
            .as_deref(),
            Some("fabric `x`: no state file; fabric `y`: half made")
        );
        // A fixture tree says nothing about this machine's fabrics.
        assert_eq!(stale_summary(Path::new("/some/fixture")), None);
    }

    #[test]
    fn exec_refuses_a_missing_fabric_and_an_unfinished_one_and_passes_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = vec!["true".to_string()];
        let missing = exec_command("nope", dir.path(), Node::A, &cmd).unwrap_err();
        assert!(
            missing.to_string().contains("no fabric `nope`"),
            "{missing}"
        );
        let mut half = state("half");
        half.phase = Phase::Creating;
        std::fs::write(
            dir.path().join("half.json"),
            serde_json::to_string(&half).unwrap(),
        )
        .unwrap();
        let e = exec_command("half", dir.path(), Node::B, &cmd).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fabric `half` is not up (its `fabric up` did not finish): `tcpx-run fabric status` says why"
        );
        std::fs::write(
            dir.path().join("up.json"),
            serde_json::to_string(&state("up")).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            exec_command("up", dir.path(), Node::A, &[]),
            Err(ExecError::NoProgram)
        ));
        let c = exec_command("up", dir.path(), Node::new(2).unwrap(), &cmd).unwrap_err();
        assert_eq!(
            c.to_string(),
            "fabric `up` has no node C: it has 2 nodes (a to b) and 2 NIC(s) each (eth1 to eth2)"
        );
        let (c, ns) =
            exec_command("up", dir.path(), Node::B, &["echo".into(), "hi".into()]).unwrap();
        assert_eq!(ns, "tcpx-b-up");
        assert_eq!(c.get_program(), "ip");
        let args: Vec<_> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["netns", "exec", "tcpx-b-up", "echo", "hi"]);
        assert!(c.get_envs().any(|(k, _)| k == crate::FABRIC_ENV));
        // Exit codes: the command's own; a signal death as 128 + signal.
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
