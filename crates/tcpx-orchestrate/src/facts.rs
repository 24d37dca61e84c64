//! Machine facts for plans (`SystemFacts`): topology, bindings, NICs and their IRQs.

use tcpx_affinity::SysRoot;
use tcpx_plan::{IrqFact, NicFact, NumaFact, SystemFacts};

fn read_euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The backends plans may use here, for `SystemFacts::transports`: each one the backend registry
/// (`tcpx_transport::registry::available`) could open. `netplugin` is not probed: opening a plugin
/// initialises it once per process, which would happen before an experiment's own plugin settings
/// (`env`) could reach it; plans that use it name it and the pre-check of each experiment answers.
pub(crate) fn available_transports() -> Vec<String> {
    use tcpx_transport::registry::{available, available_names, Backend, BackendConfig};
    let configs: Vec<BackendConfig> = Backend::ALL
        .into_iter()
        .filter(|b| !b.capabilities().loads_a_net_plugin())
        .map(BackendConfig::default_for)
        .collect();
    available_names(&available(&configs))
}

/// What plans may read about this machine.
pub(crate) fn gather_facts(peer: &str) -> SystemFacts {
    let root = SysRoot::live();
    let mut warnings = Vec::new();
    let mut facts = SystemFacts {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        is_root: read_euid() == Some(0),
        transports: available_transports(),
        peer: peer.to_string(),
        ..SystemFacts::default()
    };
    match tcpx_topo::discover(&root, tcpx_topo::Backend::Auto) {
        Ok(topo) => {
            facts.cpus = topo.cpus.len() as u32;
            facts.numa_nodes = topo
                .numa_nodes
                .iter()
                .map(|n| NumaFact {
                    id: n.id,
                    cpus: n.cpus.to_list_string(),
                })
                .collect();
            let plan = tcpx_topo::derive(&topo, &tcpx_topo::BindingRule::default());
            facts.tx_bindings = plan.tx_bindings.to_string();
            facts.rx_bindings = plan.rx_bindings.to_string();
            facts.gpus = topo
                .gpus
                .iter()
                .map(|g| tcpx_plan::GpuFact {
                    bus_id: g.pci.bus_id.clone(),
                    numa_node: g.pci.numa,
                    nic: plan
                        .pairings
                        .iter()
                        .find(|p| p.gpu == g.index)
                        .and_then(|p| p.nic.clone()),
                })
                .collect();
            facts.nics = topo
                .nics
                .iter()
                .map(|n| NicFact {
                    name: n.name.clone(),
                    driver: n.driver.clone().unwrap_or_default(),
                    numa_node: n.pci.as_ref().and_then(|p| p.numa),
                    speed_mbps: n.speed_mbps,
                    irqs: vec![],
                })
                .collect();
            warnings.extend(topo.warnings.iter().cloned());
        }
        Err(e) => warnings.push(format!("topology: {e}")),
    }
    match tcpx_affinity::queue_irqs(&root) {
        Ok((_, queues)) => {
            for q in queues {
                let affinity = root
                    .read_opt(format!("/proc/irq/{}/smp_affinity_list", q.irq))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                if let Some(n) = facts.nics.iter_mut().find(|n| n.name == q.nic) {
                    n.irqs.push(IrqFact {
                        irq: q.irq,
                        direction: format!("{:?}", q.direction).to_lowercase(),
                        queue: q.queue,
                        affinity,
                    });
                }
            }
        }
        Err(e) => warnings.push(format!("IRQs: {e}")),
    }
    facts.warnings = warnings;
    facts
}

#[cfg(test)]
mod tests {
    #[test]
    fn transports_come_from_the_registry_and_socket_is_always_there() {
        let t = super::available_transports();
        assert!(t.contains(&"socket".to_string()), "{t:?}");
        assert!(!t.contains(&"netplugin".to_string()), "{t:?}");
        // Without a CUDA driver the GPU backends cannot open, so they must not be listed.
        if tcpx_gpu::init().is_err() {
            assert!(!t.iter().any(|n| n == "nccl" || n == "cudap2p"), "{t:?}");
        }
    }
}
