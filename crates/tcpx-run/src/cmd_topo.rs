//! `tcpx-run topo`: CPUs, NUMA nodes, GPUs, NICs and the derived binding table (the IRQ plan's
//! step 2.1) with NCCL-style TX/RX binding strings, and how the running node's GPUs reach each
//! other (NVLink / PCIe path / peer access, as `nvidia-smi topo -m` shows them).

use std::path::PathBuf;
use std::process::ExitCode;

use tcpx_gpu::{GpuLink, GpuLinks};
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
    #[arg(long, default_value_t = BindingRule::default().reserved_cores, value_parser = crate::args::rule_cores)]
    pub reserved_cores: usize,
    /// Cores given to TX and, after them, to RX on each NUMA node
    #[arg(long, default_value_t = BindingRule::default().cores_per_direction, value_parser = crate::args::rule_cores)]
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
    // The link view comes from the running driver, so it describes this node only.
    let links = if args.root == std::path::Path::new("/") {
        tcpx_gpu::gpu_links().map_err(|e| e.to_string())
    } else {
        Err(
            "not read: --root points at a fixture tree, and GPU links come from the running \
             driver"
                .into(),
        )
    };
    let stale_fabric = crate::cmd_fabric::stale_summary(&args.root);
    if args.json {
        let out = serde_json::json!({
            "topology": topo,
            "plan": plan,
            "gpu_links": gpu_links_json(&links),
            "stale_fabric": stale_fabric,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&topo, &plan));
        print!("\n{}", render_gpu_links(&links));
        if let Some(s) = &stale_fabric {
            println!("\nStale emulated fabric (`tcpx-run fabric down --id <id>` removes it): {s}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `topo --json` form of the link view: `{"error": why}` when there is none.
pub fn gpu_links_json(links: &Result<GpuLinks, String>) -> serde_json::Value {
    let l = match links {
        Ok(l) => l,
        Err(e) => return serde_json::json!({ "error": e }),
    };
    let gpus: Vec<_> = l
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({
                "index": g.index,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "active_nvlinks": g.active_nvlinks,
            })
        })
        .collect();
    let pairs: Vec<_> = l
        .links
        .iter()
        .map(|k| {
            serde_json::json!({
                "from": k.from,
                "to": k.to,
                "label": k.label(&l.gpus),
                "peer_access": k.peer_access,
                "perf_rank": k.perf_rank,
                "access_supported": k.access_supported,
                "native_atomics": k.native_atomics,
                "nvlink": k.nvlink,
                "pcie": k.pcie.map(|p| p.label()),
            })
        })
        .collect();
    serde_json::json!({
        "gpus": gpus,
        "links": pairs,
        "nvml": match &l.nvml { Ok(()) => "ok".to_string(), Err(e) => e.clone() },
    })
}

/// A square matrix with row and column heads `GPU<i>`, `cell(row, col)` off the diagonal.
fn gpu_matrix(l: &GpuLinks, diagonal: &str, cell: impl Fn(&GpuLink) -> String) -> String {
    let mut header = vec![String::new()];
    header.extend(l.gpus.iter().map(|g| format!("GPU{}", g.index)));
    let rows: Vec<Vec<String>> = l
        .gpus
        .iter()
        .map(|a| {
            let mut r = vec![format!("GPU{}", a.index)];
            r.extend(l.gpus.iter().map(|b| {
                if a.index == b.index {
                    diagonal.to_string()
                } else {
                    l.link(a.index, b.index).map_or("-".into(), &cell)
                }
            }));
            r
        })
        .collect();
    let header: Vec<&str> = header.iter().map(|s| s.as_str()).collect();
    table(&header, &rows)
}

/// The link view as text: one line saying why there is none, or the GPUs, the
/// `nvidia-smi topo -m`-style matrix and the peer-access / performance-rank matrix.
pub fn render_gpu_links(links: &Result<GpuLinks, String>) -> String {
    let l = match links {
        Ok(l) => l,
        Err(e) => return format!("GPU links: none ({e})\n"),
    };
    let mut out = String::new();
    out.push_str(&format!(
        "GPU links ({} GPU(s) the CUDA driver sees; {}):\n",
        l.gpus.len(),
        match &l.nvml {
            Ok(()) => "NVLink and PCIe path from NVML".to_string(),
            Err(e) => format!("no NVLink/PCIe view: {e}"),
        }
    ));
    for g in &l.gpus {
        out.push_str(&format!(
            "  GPU{} {} {}{}\n",
            g.index,
            g.pci_bus_id,
            g.name,
            g.active_nvlinks
                .map_or(String::new(), |n| format!(", {n} NVLink(s) active"))
        ));
    }
    if l.gpus.len() < 2 {
        out.push_str("  (one GPU: no pairs)\n");
        return out;
    }
    out.push_str("Link matrix (as nvidia-smi topo -m):\n");
    out.push_str(&gpu_matrix(l, "X", |k| k.label(&l.gpus)));
    out.push_str("Peer access / CUDA performance rank (row GPU reading column GPU):\n");
    out.push_str(&gpu_matrix(l, "-", |k| {
        format!(
            "{}/{}",
            if k.peer_access { "yes" } else { "no" },
            k.perf_rank.map_or("-".to_string(), |r| r.to_string())
        )
    }));
    out.push_str(
        "Legend: X = self, NV# = NVLink (# active links), PIX = one PCIe switch, PXB = several \
         PCIe switches, PHB = a PCIe host bridge, NODE = host bridges of one NUMA node, SYS = \
         across NUMA nodes, ? = NVML could not tell; peer access no = copies go through host \
         memory\n",
    );
    out
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
        for line in scaled_rule_notes(topo, &plan.rule) {
            out.push_str(&format!("  {line}\n"));
        }
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

/// For every NUMA node too small for the binding rule, the rule as scaled there, so the printed
/// rule is never one that was silently not applied.
pub fn scaled_rule_notes(topo: &Topology, rule: &BindingRule) -> Vec<String> {
    let nodes: Vec<Option<u32>> = if topo.numa_nodes.is_empty() {
        vec![None]
    } else {
        topo.numa_nodes.iter().map(|n| Some(n.id)).collect()
    };
    nodes
        .into_iter()
        .filter_map(|numa| {
            let cores = topo.cores_of(numa).len();
            let (reserved, per) = rule.scaled_for(cores);
            ((reserved, per) != (rule.reserved_cores, rule.cores_per_direction)).then(|| {
                format!(
                    "NUMA node {}: {cores} cores, fewer than the rule's {} ({} skipped + 2 x {}), so it is scaled in proportion to the {}-core node it was read from: skip {reserved}, then {per} TX and {per} RX",
                    numa.map_or_else(|| "(none)".to_string(), |n| n.to_string()),
                    rule.reserved_cores + 2 * rule.cores_per_direction,
                    rule.reserved_cores,
                    rule.cores_per_direction,
                    tcpx_topo::REFERENCE_CORES_PER_NODE,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_gpu::{GpuNode, PciePath};

    fn fixture_topo(name: &str) -> Topology {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tcpx-topo/tests/fixtures")
            .join(name);
        discover(&SysRoot::new(&root), Backend::Sysfs).unwrap()
    }

    #[test]
    fn a_rule_scaled_down_on_small_nodes_is_said_with_what_is_applied() {
        let small = fixture_topo("single-socket-lo");
        let notes = scaled_rule_notes(&small, &BindingRule::default());
        assert!(!notes.is_empty());
        assert!(
            notes[0].contains("scaled in proportion") && notes[0].contains("skip 0"),
            "{notes:?}"
        );
        // A3-high's 52-core nodes take the rule as it is: nothing to say.
        let a3 = fixture_topo("a3-high");
        assert!(scaled_rule_notes(&a3, &BindingRule::default()).is_empty());
    }

    fn links(n: usize, nvml: bool) -> GpuLinks {
        let gpus = (0..n)
            .map(|i| GpuNode {
                index: i,
                name: "NVIDIA H200".into(),
                pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + 0x10 * i),
                active_nvlinks: nvml.then_some(18),
            })
            .collect();
        let mut pairs = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    // GPUs 0-1 on NVLink, the rest over PCIe across NUMA nodes.
                    let nv = a + b == 1;
                    pairs.push(GpuLink {
                        from: a,
                        to: b,
                        peer_access: nv,
                        perf_rank: Some(if nv { 0 } else { 2 }),
                        access_supported: Some(nv),
                        native_atomics: Some(nv),
                        nvlink: nvml.then_some(nv),
                        pcie: nvml.then_some(PciePath::System),
                    });
                }
            }
        }
        GpuLinks {
            gpus,
            links: pairs,
            nvml: if nvml {
                Ok(())
            } else {
                Err("NVML (libnvidia-ml.so.1) could not be loaded".into())
            },
        }
    }

    #[test]
    fn the_link_matrix_reads_like_nvidia_smi() {
        let out = render_gpu_links(&Ok(links(3, true)));
        let row = |name: &str| -> Vec<String> {
            out.lines()
                .find(|l| l.trim_start().starts_with(name) && l.contains("NV18"))
                .unwrap_or_else(|| panic!("no matrix row {name}:\n{out}"))
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(row("GPU0"), ["GPU0", "X", "NV18", "SYS"]);
        assert_eq!(row("GPU1"), ["GPU1", "NV18", "X", "SYS"]);
        assert!(
            out.contains("GPU2 0000:38:00.0 NVIDIA H200, 18 NVLink(s) active"),
            "{out}"
        );
        let peer = out
            .lines()
            .skip_while(|l| !l.starts_with("Peer access"))
            .find(|l| l.trim_start().starts_with("GPU2"))
            .unwrap();
        assert_eq!(
            peer.split_whitespace().collect::<Vec<_>>(),
            ["GPU2", "no/2", "no/2", "-"]
        );
        assert!(out.contains("NVLink and PCIe path from NVML"), "{out}");
    }

    #[test]
    fn without_nvml_cells_are_unknown_and_the_reason_is_given() {
        let out = render_gpu_links(&Ok(links(2, false)));
        assert!(
            out.contains("no NVLink/PCIe view: NVML (libnvidia-ml.so.1)"),
            "{out}"
        );
        let gpu0 = out
            .lines()
            .find(|l| l.trim_start().starts_with("GPU0") && l.contains(" X"))
            .unwrap();
        assert_eq!(
            gpu0.split_whitespace().collect::<Vec<_>>(),
            ["GPU0", "X", "?"]
        );
        let v = gpu_links_json(&Ok(links(2, false)));
        assert_eq!(v["links"][0]["label"], "?");
        assert!(v["links"][0]["nvlink"].is_null());
        assert_eq!(v["links"][0]["peer_access"], true);
    }

    #[test]
    fn no_gpu_is_one_line_and_one_gpu_has_no_pairs() {
        let none = render_gpu_links(&Err("no GPU: libcuda.so.1 missing".into()));
        assert_eq!(none, "GPU links: none (no GPU: libcuda.so.1 missing)\n");
        assert_eq!(
            gpu_links_json(&Err("x".into())),
            serde_json::json!({ "error": "x" })
        );
        let one = render_gpu_links(&Ok(links(1, true)));
        assert!(
            one.contains("(one GPU: no pairs)") && !one.contains("Link matrix"),
            "{one}"
        );
        let v = gpu_links_json(&Ok(links(3, true)));
        assert_eq!(v["links"].as_array().unwrap().len(), 6);
        assert_eq!(v["links"][0]["label"], "NV18");
        assert_eq!(v["links"][1]["pcie"], "SYS");
        assert_eq!(v["nvml"], "ok");
    }
}
