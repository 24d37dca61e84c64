//! `tcpx-run topo`'s text view of a [`Topology`] and its [`TopoPlan`]: the machine, its NUMA
//! nodes, GPUs with their paired NIC, the NIC binding table, and the NCCL binding strings with
//! the rule as applied on each node. Formats only; nothing is read here.

use crate::{BindingRule, TopoPlan, Topology};

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".to_string(), |x| x.to_string())
}

/// A plain text table with columns as wide as their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
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

/// The whole text view, as `tcpx-run topo` prints it.
pub fn render(topo: &Topology, plan: &TopoPlan) -> String {
    let mut out = String::new();
    let source = match topo.source {
        crate::Source::HwlocAndSysfs => "hwloc + sysfs",
        crate::Source::Sysfs => "sysfs",
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
            double_quoted(&plan.tx_bindings.to_string())
        ));
        out.push_str(&format!(
            "  NCCL_GPUDIRECTTCPX_RX_BINDINGS=\"{}\"\n",
            double_quoted(&plan.rx_bindings.to_string())
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
/// `text` for the inside of a shell double-quoted word, as printed for pasting: `$`, `` ` ``,
/// `"` and `\` escaped (interface names may hold `$` and backticks), control characters as
/// `\xNN` (visible, never a second line).
fn double_quoted(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '$' | '`' | '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            c if c.is_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

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
                    crate::REFERENCE_CORES_PER_NODE,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{discover, Backend, SysRoot};

    fn fixture_topo(name: &str) -> Topology {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
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

    #[test]
    fn the_view_names_the_machine_gpus_nics_and_bindings() {
        let a3 = fixture_topo("a3-high");
        let plan = crate::derive(&a3, &BindingRule::default());
        let text = render(&a3, &plan);
        assert!(text.starts_with("Machine (root "), "{text}");
        assert!(text.contains("NICs (binding table):"), "{text}");
        assert!(
            text.contains("NCCL_GPUDIRECTTCPX_TX_BINDINGS=\"eth1:"),
            "{text}"
        );
    }

    #[test]
    fn printed_bindings_expand_nothing_when_pasted_into_a_shell() {
        // Linux allows `$`, backticks and quotes in interface names.
        let name = "e$(touch x)`y`\"\\";
        let quoted = format!(
            "A=\"{}\"; printf %s \"$A\"",
            double_quoted(&format!("{name}:1-2"))
        );
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("bash")
            .args(["--norc", "-c", &quoted])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{name}:1-2"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(double_quoted("a\nb"), "a\\x0ab");
    }
}
