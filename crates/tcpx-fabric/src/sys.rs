//! iproute2 (`ip`, `tc`) as subprocesses: every invocation is an [`Op`] whose argument vector is
//! built in one place, run with a deadline; queries use `-j` and are parsed as JSON.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde::Deserialize;

use crate::spec::{Delay, Loss, Rate};
use crate::FabricError;

/// Longest any single `ip`/`tc` call may take (they take milliseconds; a hung one is a bug).
const TOOL_DEADLINE: Duration = Duration::from_secs(20);

/// Where a tbf sits: alone at the root, or under a netem root qdisc (handle 1:).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TbfParent {
    Root,
    UnderNetem,
}

/// One iproute2 invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    NetnsAdd(String),
    NetnsDel(String),
    NetnsList,
    NetnsPids(String),
    /// In namespace `ns`, a veth pair: `name` stays in `ns`, its peer `peer_name` goes to `peer_ns`.
    VethAdd {
        ns: String,
        name: String,
        peer_ns: String,
        peer_name: String,
    },
    /// A bridge without STP that forwards as soon as a port is up (the emulated switch's rail).
    BridgeAdd {
        ns: String,
        name: String,
    },
    /// Makes `dev` a port of bridge `master`.
    SetMaster {
        ns: String,
        dev: String,
        master: String,
    },
    AddrAdd {
        ns: String,
        dev: String,
        addr: std::net::Ipv4Addr,
        prefix: u8,
    },
    LinkUp {
        ns: String,
        dev: String,
    },
    LinkDown {
        ns: String,
        dev: String,
    },
    /// A netem root qdisc (handle 1:) with a delay and/or a random loss; `replace` changes or
    /// replaces whatever root qdisc is there (a fault on a running fabric), else adds one.
    Netem {
        ns: String,
        dev: String,
        delay: Option<Delay>,
        loss: Option<Loss>,
        replace: bool,
    },
    /// A tbf cap; `replace` changes the existing one in place (or grafts it), else adds one.
    Tbf {
        ns: String,
        dev: String,
        rate: Rate,
        parent: TbfParent,
        replace: bool,
    },
    /// Qdiscs of `dev` with their counters (`tc -s`).
    QdiscStats {
        ns: String,
        dev: String,
    },
    /// `nft` inside namespace `ns` with these arguments (a loss fault's table and its rule).
    Nft {
        ns: String,
        args: Vec<String>,
    },
    /// `iptables` inside namespace `ns` with these arguments (a loss fault's chain and rule).
    Iptables {
        ns: String,
        args: Vec<String>,
    },
    AddrShow(String),
    LinkShow(String),
    QdiscShow {
        ns: String,
        dev: String,
    },
    /// All links of the namespace this process is in (the root namespace for the CLI).
    LinkShowHere,
    /// All qdiscs of the namespace this process is in.
    QdiscShowHere,
}

/// tbf's bucket: 1 ms at line rate, at least 128 KiB so a 64 KiB GSO segment always fits.
pub fn tbf_burst_bytes(rate: Rate) -> u64 {
    (rate.bytes_per_s() / 1000).max(128 * 1024)
}

/// Longest a packet may wait in tbf's queue before it is dropped; generous, so TCP sees a
/// bottleneck that queues rather than one that drops.
const TBF_LATENCY_MS: u64 = 50;

impl Op {
    /// The program and its arguments.
    pub fn argv(&self) -> (&'static str, Vec<String>) {
        fn v(parts: &[&str]) -> Vec<String> {
            parts.iter().map(|s| s.to_string()).collect()
        }
        match self {
            Op::NetnsAdd(n) => ("ip", v(&["netns", "add", n])),
            Op::NetnsDel(n) => ("ip", v(&["netns", "del", n])),
            Op::NetnsList => ("ip", v(&["-j", "netns", "list"])),
            Op::NetnsPids(n) => ("ip", v(&["netns", "pids", n])),
            Op::VethAdd {
                ns,
                name,
                peer_ns,
                peer_name,
            } => (
                "ip",
                v(&[
                    "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer_name,
                    "netns", peer_ns,
                ]),
            ),
            Op::BridgeAdd { ns, name } => (
                "ip",
                v(&[
                    "-n",
                    ns,
                    "link",
                    "add",
                    name,
                    "type",
                    "bridge",
                    "stp_state",
                    "0",
                    "forward_delay",
                    "0",
                ]),
            ),
            Op::SetMaster { ns, dev, master } => {
                ("ip", v(&["-n", ns, "link", "set", dev, "master", master]))
            }
            Op::AddrAdd {
                ns,
                dev,
                addr,
                prefix,
            } => (
                "ip",
                v(&[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{addr}/{prefix}"),
                    "dev",
                    dev,
                ]),
            ),
            Op::LinkUp { ns, dev } => ("ip", v(&["-n", ns, "link", "set", dev, "up"])),
            Op::LinkDown { ns, dev } => ("ip", v(&["-n", ns, "link", "set", dev, "down"])),
            Op::Netem {
                ns,
                dev,
                delay,
                loss,
                replace,
            } => {
                let verb = if *replace { "replace" } else { "add" };
                let mut a = v(&[
                    "-n", ns, "qdisc", verb, "dev", dev, "root", "handle", "1:", "netem",
                ]);
                if let Some(d) = delay {
                    a.extend(["delay".into(), format!("{}us", d.us)]);
                }
                if let Some(l) = loss {
                    a.extend(["loss".into(), l.tc_percent()]);
                }
                ("tc", a)
            }
            Op::Tbf {
                ns,
                dev,
                rate,
                parent,
                replace,
            } => {
                let verb = if *replace { "replace" } else { "add" };
                let mut a = v(&["-n", ns, "qdisc", verb, "dev", dev]);
                match parent {
                    TbfParent::Root => a.push("root".into()),
                    TbfParent::UnderNetem => a.extend(v(&["parent", "1:1", "handle", "10:"])),
                }
                a.extend([
                    "tbf".into(),
                    "rate".into(),
                    format!("{}bit", rate.bits_per_s),
                    "burst".into(),
                    tbf_burst_bytes(*rate).to_string(),
                    "latency".into(),
                    format!("{TBF_LATENCY_MS}ms"),
                ]);
                ("tc", a)
            }
            Op::QdiscStats { ns, dev } => (
                "tc",
                v(&["-n", ns, "-s", "-j", "qdisc", "show", "dev", dev]),
            ),
            Op::Nft { ns, args } => {
                let mut a = v(&["netns", "exec", ns, "nft"]);
                a.extend(args.iter().cloned());
                ("ip", a)
            }
            Op::Iptables { ns, args } => {
                let mut a = v(&["netns", "exec", ns, "iptables"]);
                a.extend(args.iter().cloned());
                ("ip", a)
            }
            Op::AddrShow(ns) => ("ip", v(&["-n", ns, "-j", "addr", "show"])),
            Op::LinkShow(ns) => ("ip", v(&["-n", ns, "-j", "link", "show"])),
            Op::QdiscShow { ns, dev } => ("tc", v(&["-n", ns, "-j", "qdisc", "show", "dev", dev])),
            Op::LinkShowHere => ("ip", v(&["-j", "link", "show"])),
            Op::QdiscShowHere => ("tc", v(&["-j", "qdisc", "show"])),
        }
    }

    /// The command line as a user would type it, for error messages.
    pub fn display(&self) -> String {
        let (p, a) = self.argv();
        format!("{p} {}", a.join(" "))
    }
}

/// Runs `op`, returning its stdout; a non-zero exit, a missing program or a hang is an error
/// naming the command and carrying its stderr.
pub fn run(op: &Op) -> Result<Vec<u8>, FabricError> {
    let (program, args) = op.argv();
    let child = Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| FabricError::ToolMissing {
            tool: program,
            err: e.to_string(),
        })?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        // Reads stdout and stderr together, then reaps the child.
        let r = child.wait_with_output();
        // The receiver may have given up (deadline); then nobody needs the result.
        let _ = tx.send(r);
    });
    let output = match rx.recv_timeout(TOOL_DEADLINE) {
        Ok(x) => x,
        Err(_) => {
            // The child is ours: stop it, then the reader thread finishes.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = reader.join();
            return Err(FabricError::ToolTimeout {
                cmd: op.display(),
                secs: TOOL_DEADLINE.as_secs(),
            });
        }
    };
    let _ = reader.join();
    let output = output.map_err(|e| FabricError::ToolFailed {
        cmd: op.display(),
        status: "not collected".into(),
        stderr: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(FabricError::ToolFailed {
            cmd: op.display(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(output.stdout)
}

/// Runs a `-j` query and parses its JSON (empty output is an empty list, as `ip -j netns list`
/// prints nothing when there are no namespaces).
pub fn query<T: serde::de::DeserializeOwned + Default>(op: &Op) -> Result<T, FabricError> {
    let out = run(op)?;
    if out.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&out).map_err(|e| FabricError::BadOutput {
        cmd: op.display(),
        err: e.to_string(),
    })
}

/// `ip -j netns list` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct NetnsEntry {
    pub name: String,
}

/// `ip -j addr show` / `ip -j link show` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct LinkEntry {
    pub ifname: String,
    #[serde(default)]
    pub flags: Vec<String>,
    /// RFC 2863 state: `UP` once the link has a carrier (a veth: when both ends are up).
    #[serde(default)]
    pub operstate: Option<String>,
    #[serde(default)]
    pub addr_info: Vec<AddrInfo>,
    /// The bridge this link is a port of.
    #[serde(default)]
    pub master: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AddrInfo {
    pub family: String,
    pub local: String,
    pub prefixlen: u8,
}

/// `tc -j qdisc show` entry.
#[derive(Debug, Clone, Deserialize)]
pub struct QdiscEntry {
    pub kind: String,
    #[serde(default)]
    pub dev: Option<String>,
    #[serde(default)]
    pub handle: Option<String>,
    #[serde(default)]
    pub options: serde_json::Value,
    /// Packets this qdisc dropped (`tc -s`): a netem loss, or a tbf queue overflow.
    #[serde(default)]
    pub drops: Option<u64>,
}

impl QdiscEntry {
    /// A tbf's rate in bytes per second, as tc reports it.
    pub fn tbf_rate_bytes(&self) -> Option<u64> {
        (self.kind == "tbf")
            .then(|| self.options.get("rate").and_then(serde_json::Value::as_u64))
            .flatten()
    }
}

/// The process ids in a namespace (`ip netns pids`: one decimal id per line).
pub fn netns_pids(ns: &str) -> Result<Vec<i32>, FabricError> {
    let op = Op::NetnsPids(ns.to_string());
    let out = run(&op)?;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .map(|w| {
            w.parse::<i32>().map_err(|e| FabricError::BadOutput {
                cmd: op.display(),
                err: format!("`{w}` is not a process id: {e}"),
            })
        })
        .collect()
}

/// Whether `tool --version` runs here (`nft`, `iptables`: the loss fault's fallbacks where the
/// kernel has no netem).
pub fn tool_runs(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this kernel can give a netem qdisc: built in or loaded (`/sys/module/sch_netem`), or
/// a module tc can have loaded on demand.
pub fn netem_available() -> bool {
    if std::path::Path::new("/sys/module/sch_netem").exists() {
        return true;
    }
    let Ok(rel) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let dir = std::path::Path::new("/lib/modules").join(rel.trim());
    let builtin = std::fs::read_to_string(dir.join("modules.builtin"))
        .map(|s| s.lines().any(|l| l.ends_with("/sch_netem.ko")))
        .unwrap_or(false);
    builtin
        || ["", ".xz", ".zst", ".gz"].iter().any(|ext| {
            dir.join(format!("kernel/net/sched/sch_netem.ko{ext}"))
                .exists()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_vectors() {
        let veth = Op::VethAdd {
            ns: "tcpx-a-x".into(),
            name: "eth1".into(),
            peer_ns: "tcpx-b-x".into(),
            peer_name: "eth1".into(),
        };
        assert_eq!(
            veth.display(),
            "ip -n tcpx-a-x link add eth1 type veth peer name eth1 netns tcpx-b-x"
        );
        let tbf = Op::Tbf {
            ns: "n".into(),
            dev: "eth2".into(),
            rate: Rate::gbit(2),
            parent: TbfParent::Root,
            replace: false,
        };
        assert_eq!(
            tbf.display(),
            "tc -n n qdisc add dev eth2 root tbf rate 2000000000bit burst 250000 latency 50ms"
        );
        let under = Op::Tbf {
            ns: "n".into(),
            dev: "eth2".into(),
            rate: Rate::gbit(1),
            parent: TbfParent::UnderNetem,
            replace: true,
        };
        assert!(under.display().contains(
            "qdisc replace dev eth2 parent 1:1 handle 10: tbf rate 1000000000bit burst 131072"
        ));
        let netem = Op::Netem {
            ns: "n".into(),
            dev: "eth1".into(),
            delay: None,
            loss: Some("2.5%".parse().unwrap()),
            replace: true,
        };
        assert_eq!(
            netem.display(),
            "tc -n n qdisc replace dev eth1 root handle 1: netem loss 2.5%"
        );
        let port = Op::VethAdd {
            ns: "tcpx-c-x".into(),
            name: "eth2".into(),
            peer_ns: "tcpx-sw-x".into(),
            peer_name: "c-eth2".into(),
        };
        assert!(port.display().ends_with("peer name c-eth2 netns tcpx-sw-x"));
        assert_eq!(
            Op::BridgeAdd {
                ns: "s".into(),
                name: "br1".into()
            }
            .display(),
            "ip -n s link add br1 type bridge stp_state 0 forward_delay 0"
        );
        let addr = Op::AddrAdd {
            ns: "n".into(),
            dev: "eth1".into(),
            addr: "10.231.0.1".parse().unwrap(),
            prefix: 30,
        };
        assert_eq!(addr.display(), "ip -n n addr add 10.231.0.1/30 dev eth1");
    }

    #[test]
    fn qdisc_json_gives_the_tbf_rate() {
        let q: Vec<QdiscEntry> = serde_json::from_str(
            r#"[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,"options":{"rate":250000000,"burst":262000,"lat":20000}}]"#,
        )
        .unwrap();
        assert_eq!(q[0].tbf_rate_bytes(), Some(250_000_000));
        let n: Vec<QdiscEntry> =
            serde_json::from_str(r#"[{"kind":"noqueue","handle":"0:","options":{}}]"#).unwrap();
        assert_eq!(n[0].tbf_rate_bytes(), None);
    }
}
