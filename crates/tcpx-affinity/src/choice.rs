//! The IRQ policies a plan chooses by name (the `irq_policy` knob) as an [`IrqPolicy`] for one
//! machine: what a plan run applies during an experiment and what `tcpx-run apply --irq` applies
//! from its tuned.env, computed the same way from the topology.
//!
//! - `default`: the IRQs stay as they are (no policy).
//! - `nccl`: each data NIC's TX queue IRQs on NCCL's TX cores and RX queue IRQs on its RX cores
//!   (`tcpx_topo::derive`: the NIC's NUMA node, reserved cores left out, split in two).
//! - `numa-local`: each data NIC's TX and RX queue IRQs on every CPU of the NIC's NUMA node.
//!
//! Queue q's IRQ goes to the q-th CPU of its set ([`Spread::OnePerQueue`]) in both. A policy that
//! cannot be expressed on the machine (no data NIC, a NIC whose NUMA node is unknown) is an
//! error saying why.

use tcpx_topo::{derive, discover, Backend, BindingRule, BindingSpec, SysRoot, Topology};

use crate::policy::{IrqPolicy, Spread};

/// Every value of the `irq_policy` knob.
pub const POLICY_NAMES: &[&str] = &[DEFAULT_POLICY, NCCL_POLICY, NUMA_LOCAL_POLICY];

/// The `irq_policy` that leaves the IRQs as the machine has them.
const DEFAULT_POLICY: &str = "default";
/// The `irq_policy` that puts a NIC's IRQs on the CPUs NCCL's TX/RX bindings give it (a policy
/// named after NCCL's bindings, not the nccl backend).
const NCCL_POLICY: &str = "nccl";
/// The `irq_policy` that spreads a NIC's IRQs over its NUMA node's CPUs.
const NUMA_LOCAL_POLICY: &str = "numa-local";

/// The policy `name` stands for on `topo`: `Ok(None)` for `default`, `Err(why)` when it cannot be
/// expressed here or the name is unknown.
pub fn policy_for(
    name: &str,
    topo: &Topology,
    rule: &BindingRule,
) -> Result<Option<IrqPolicy>, String> {
    let plan = derive(topo, rule);
    let no_data_nic = || {
        format!(
            "irq_policy `{name}` has no NIC to act on: no data NIC derives from the topology under {} (no GPU/NIC pairs, no physical NIC)",
            topo.root
        )
    };
    let (tx, rx) = match name {
        DEFAULT_POLICY => return Ok(None),
        NCCL_POLICY => {
            if plan.tx_bindings.is_empty() || plan.rx_bindings.is_empty() {
                return Err(no_data_nic());
            }
            (plan.tx_bindings, plan.rx_bindings)
        }
        NUMA_LOCAL_POLICY => {
            let mut set = BindingSpec::default();
            for row in plan.rows.iter().filter(|r| r.data_nic) {
                let node = row
                    .numa
                    .and_then(|id| topo.numa_nodes.iter().find(|n| n.id == id))
                    .filter(|n| !n.cpus.is_empty())
                    .ok_or_else(|| {
                        format!(
                            "irq_policy `numa-local`: the NUMA node of {} is not known, so its IRQs have no NUMA-local CPUs",
                            row.nic
                        )
                    })?;
                set.push(row.nic.clone(), node.cpus.clone());
            }
            if set.is_empty() {
                return Err(no_data_nic());
            }
            (set.clone(), set)
        }
        other => {
            return Err(format!(
                "unknown irq_policy `{other}`: one of {}",
                POLICY_NAMES.join(", ")
            ))
        }
    };
    Ok(Some(IrqPolicy {
        tx,
        rx,
        spread: Spread::OnePerQueue,
    }))
}

/// [`policy_for`] on the machine under `root` (its topology read there), with the default
/// binding rule; `recorded` (NCCL's TX/RX specs as a run recorded them) stand for `nccl` when
/// given, so the policy applied is the one measured.
pub fn policy_at(
    name: &str,
    root: &SysRoot,
    recorded: Option<(&str, &str)>,
) -> Result<Option<IrqPolicy>, String> {
    if let (NCCL_POLICY, Some((tx, rx))) = (name, recorded) {
        let parse = |s: &str| BindingSpec::parse(s).map_err(|e| format!("recorded spec: {e}"));
        return Ok(Some(IrqPolicy {
            tx: parse(tx)?,
            rx: parse(rx)?,
            spread: Spread::OnePerQueue,
        }));
    }
    if name == DEFAULT_POLICY {
        return Ok(None);
    }
    let topo = discover(root, Backend::Auto).map_err(|e| {
        format!(
            "reading the topology under {} for irq_policy `{name}`: {e}",
            root.root().display()
        )
    })?;
    policy_for(name, &topo, &BindingRule::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> SysRoot {
        SysRoot::new(tcpx_test_support::fixture_dir(name))
    }

    #[test]
    fn every_policy_of_the_knob_is_expressed_on_a3_high() {
        let root = fixture("a3-high");
        assert_eq!(policy_at("default", &root, None).unwrap(), None);
        let nccl = policy_at("nccl", &root, None).unwrap().unwrap();
        let local = policy_at("numa-local", &root, None).unwrap().unwrap();
        // NCCL's sets are disjoint halves of the node; numa-local is the whole node for both.
        let (tx, rx) = (nccl.tx.get("eth1").unwrap(), nccl.rx.get("eth1").unwrap());
        assert!(tx.intersection(rx).is_empty(), "{tx} {rx}");
        let node = local.tx.get("eth1").unwrap();
        assert_eq!(local.rx.get("eth1"), Some(node));
        assert!(tx.is_subset(node) && rx.is_subset(node) && node.len() > tx.len() + rx.len());
        // eth3 sits on the other NUMA node: its CPUs do not overlap eth1's.
        assert!(local.tx.get("eth3").unwrap().intersection(node).is_empty());
        assert_eq!(nccl.tx.entries.len(), local.tx.entries.len());
        // Recorded specs stand for nccl as given.
        let rec = policy_at("nccl", &root, Some(("eth1:8-9", "eth1:10-11")))
            .unwrap()
            .unwrap();
        assert_eq!(rec.tx.to_string(), "eth1:8-9");
        assert!(policy_at("nccl", &root, Some(("eth1:x", "eth1:1"))).is_err());
    }

    #[test]
    fn a_policy_that_cannot_be_expressed_says_why() {
        let lo = fixture("single-socket-lo");
        for name in ["nccl", "numa-local"] {
            let e = policy_at(name, &lo, None).unwrap_err();
            assert!(e.contains("no data NIC"), "{name}: {e}");
        }
        let e = policy_at("numa-locale", &fixture("a3-high"), None).unwrap_err();
        assert!(e.contains("one of default, nccl, numa-local"), "{e}");
        let e = policy_at("nccl", &SysRoot::new("/nonexistent-tcpx-root"), None).unwrap_err();
        assert!(e.contains("reading the topology"), "{e}");
    }

    #[test]
    fn numa_local_needs_the_nics_numa_node() {
        let root = fixture("a3-high");
        let mut topo = discover(&root, Backend::Sysfs).unwrap();
        topo.numa_nodes.retain(|n| n.id != 1);
        let e = policy_for("numa-local", &topo, &BindingRule::default()).unwrap_err();
        assert!(e.contains("NUMA node of eth3"), "{e}");
    }
}
