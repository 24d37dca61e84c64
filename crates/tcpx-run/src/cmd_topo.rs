//! `tcpx-run topo`: CPUs, NUMA nodes, GPUs, NICs and the derived binding table (the IRQ plan's
//! step 2.1) with NCCL-style TX/RX binding strings.

use std::path::PathBuf;
use std::process::ExitCode;

use tcpx_topo::{derive, discover, Backend, BindingRule, SysRoot, TopoPlan, Topology};

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// hwloc for the running system, sysfs for a --root fixture
    #[default]
    Auto,
    Hwloc,
    Sysfs,
}

/// Show where CPUs, NUMA nodes, GPUs and NICs are, and the TX/RX cores derived for each NIC.
#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// Read /sys and /proc under this directory instead of / (a fixture tree)
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print JSON (topology and derived plan) instead of tables
    #[arg(long)]
    pub json: bool,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Read CPUs, NUMA nodes and the PCI tree from this hwloc XML export (`lstopo m.xml` on the
    /// machine whose /sys tree --root points at) instead
    #[arg(long, value_name = "FILE", conflicts_with = "backend")]
    pub hwloc_xml: Option<PathBuf>,
    /// Cores at the start of each NUMA node left out of TX/RX bindings
    #[arg(long, default_value_t = BindingRule::default().reserved_cores)]
    pub reserved_cores: usize,
    /// Cores given to TX and, after them, to RX on each NUMA node
    #[arg(long, default_value_t = BindingRule::default().cores_per_direction)]
    pub cores_per_direction: usize,
}

impl TopoArgs {
    pub fn rule(&self) -> BindingRule {
        BindingRule {
            reserved_cores: self.reserved_cores,
            cores_per_direction: self.cores_per_direction,
        }
    }
    pub fn backend(&self) -> Backend {
        if let Some(xml) = &self.hwloc_xml {
            return Backend::HwlocXml(xml.clone());
        }
        match self.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Hwloc => Backend::Hwloc,
            BackendArg::Sysfs => Backend::Sysfs,
        }
    }
}

pub fn run(args: &TopoArgs) -> anyhow::Result<ExitCode> {
    let root = SysRoot::new(&args.root);
    let topo = discover(&root, args.backend())?;
    let plan = derive(&topo, &args.rule());
    if args.json {
        let out = serde_json::json!({ "topology": topo, "plan": plan });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&topo, &plan));
    }
    Ok(ExitCode::SUCCESS)
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), |x| x.to_string())
}

/// A plain text table with columns as wide as their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        format!("  {}\n", s.join("  ").trim_end())
    };
    let mut out = line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out
}

pub fn render(topo: &Topology, plan: &TopoPlan) -> String {
    let mut out = String::new();
    let source = match topo.source {
        tcpx_topo::Source::HwlocAndSysfs => "hwloc + sysfs",
        tcpx_topo::Source::Sysfs => "sysfs",
    };
    let threads = topo.cores.iter().map(|c| c.cpus.len()).max().unwrap_or(1);
    out.push_str(&format!(
        "Machine (root {}, read with {source}): {} CPUs online, {} cores ({} thread(s) per core), {} package(s), {} NUMA node(s); IRQ masks are {} CPUs wide\n",
        topo.root,
        topo.cpus.len(),
        topo.cores.len(),
        threads,
        topo.packages.len(),
        topo.numa_nodes.len(),
        topo.nr_possible_cpus
    ));
    for n in &topo.numa_nodes {
        out.push_str(&format!(
            "  NUMA {}: cpus {} (physical {}, hyperthreads {})\n",
            n.id,
            n.cpus,
            topo.physical_cpus(Some(n.id)),
            if topo.hyperthread_cpus(Some(n.id)).is_empty() {
                "none".to_string()
            } else {
                topo.hyperthread_cpus(Some(n.id)).to_string()
            }
        ));
    }
    out.push('\n');
    if topo.gpus.is_empty() {
        out.push_str(
            "GPUs: none found (looked for PCI vendor 0x10de with class 0x0300 or 0x0302)\n",
        );
    } else {
        out.push_str("GPUs:\n");
        let rows: Vec<Vec<String>> = topo
            .gpus
            .iter()
            .map(|g| {
                let pairing = plan.pairings.iter().find(|p| p.gpu == g.index);
                vec![
                    g.index.to_string(),
                    g.pci.bus_id.clone(),
                    opt(&topo.numa_of(&g.pci)),
                    g.model
                        .clone()
                        .unwrap_or_else(|| format!("10de:{:04x}", g.pci.device)),
                    pairing
                        .and_then(|p| p.nic.clone())
                        .unwrap_or_else(|| "-".into()),
                    pairing.map_or("-".into(), |p| p.shared_path_len.to_string()),
                ]
            })
            .collect();
        out.push_str(&table(
            &["GPU", "bus id", "NUMA", "model", "NIC", "shared PCI path"],
            &rows,
        ));
    }
    out.push('\n');
    if plan.rows.is_empty() {
        out.push_str("NICs: no physical NIC (only virtual interfaces)\n");
    } else {
        out.push_str("NICs (binding table):\n");
        let rows: Vec<Vec<String>> = plan
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.nic.clone(),
                    opt(&r.driver),
                    opt(&r.bus_id),
                    r.speed_mbps
                        .map_or("-".into(), |s| format!("{} Gb/s", s / 1000)),
                    r.state.clone(),
                    opt(&r.numa),
                    r.physical_cores.to_string(),
                    if r.hyperthreads.is_empty() {
                        "-".into()
                    } else {
                        r.hyperthreads.to_string()
                    },
                    r.tx.to_string(),
                    r.rx.to_string(),
                    if r.gpus.is_empty() {
                        "-".into()
                    } else {
                        r.gpus
                            .iter()
                            .map(|g| g.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    },
                    if r.data_nic {
                        "yes".into()
                    } else {
                        "no".into()
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "NIC",
                "driver",
                "bus id",
                "speed",
                "state",
                "NUMA",
                "physical cores",
                "hyperthreads",
                "TX cores",
                "RX cores",
                "GPUs",
                "data",
            ],
            &rows,
        ));
    }
    let virtual_nics: Vec<&str> = topo
        .nics
        .iter()
        .filter(|n| n.is_virtual)
        .map(|n| n.name.as_str())
        .collect();
    if !virtual_nics.is_empty() {
        out.push_str(&format!(
            "Virtual interfaces: {}\n",
            virtual_nics.join(", ")
        ));
    }
    out.push('\n');
    if plan.tx_bindings.is_empty() {
        out.push_str("NCCL bindings: none (no data NIC)\n");
    } else {
        out.push_str(&format!(
            "NCCL bindings (rule: skip {} cores per NUMA node, then {} TX and {} RX cores with their hyperthreads):\n",
            plan.rule.reserved_cores, plan.rule.cores_per_direction, plan.rule.cores_per_direction
        ));
        out.push_str(&format!(
            "  NCCL_GPUDIRECTTCPX_TX_BINDINGS=\"{}\"\n",
            plan.tx_bindings
        ));
        out.push_str(&format!(
            "  NCCL_GPUDIRECTTCPX_RX_BINDINGS=\"{}\"\n",
            plan.rx_bindings
        ));
        for spec in [&plan.tx_bindings, &plan.rx_bindings] {
            if let Err(e) = spec.validate_for_tcpx() {
                out.push_str(&format!("  warning: {e}\n"));
            }
        }
    }
    for w in &topo.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}
