//! Knobs each side applies for itself: thread binding, IRQ policy, NICs and NIC policy, and
//! the answer to "which knobs cannot act here" decided without running anything.

use std::net::IpAddr;

use tcpx_affinity::{CpuSet, IrqGuard, SysRoot};
use tcpx_model::{
    Experiment, GpuMemoryPath, IrqPolicy, Knob, NicPolicy, NotApplied, Outside, Side, ThreadBinding,
};
use tcpx_plan::SystemFacts;

/// The CPUs to pin the experiment's threads on `side` to (the sender takes the TX bindings, the
/// receiver the RX ones): `Ok(None)` for no binding, `Err(reason)` when the binding asked for
/// cannot act here.
pub(crate) fn binding_for(
    outside: &Outside,
    facts: &SystemFacts,
    side: Side,
) -> Result<Option<CpuSet>, String> {
    let online: CpuSet = (0..facts.cpus).collect();
    let set = match outside.thread_binding {
        ThreadBinding::None => return Ok(None),
        ThreadBinding::NumaLocal => {
            let node = facts
                .numa_nodes
                .first()
                .ok_or("no NUMA node is known here")?;
            CpuSet::parse_list(&node.cpus).map_err(|e| e.to_string())?
        }
        ThreadBinding::Nccl => {
            let spec = match side {
                Side::Send => &facts.tx_bindings,
                Side::Recv => &facts.rx_bindings,
            };
            if spec.is_empty() {
                return Err(
                    "no NCCL TX/RX bindings derive on this machine (no GPU/NIC pairs)".into(),
                );
            }
            let parsed = tcpx_affinity::BindingSpec::parse(spec).map_err(|e| e.to_string())?;
            let first = parsed
                .entries
                .first()
                .ok_or("the derived binding is empty")?;
            first.cpus.clone()
        }
    };
    if set.is_empty() {
        return Err("the binding has no CPUs".into());
    }
    if facts.cpus > 0 && set == online {
        return Err(format!(
            "the binding is every online CPU ({}), so pinning would change nothing",
            set.to_list_string()
        ));
    }
    Ok(Some(set))
}

/// What became of an IRQ policy request.
pub(crate) enum IrqOutcome {
    NotRequested,
    /// Could not act here; the experiment still runs.
    NotApplied(String),
    /// Must not run without it (root missing): the experiment is skipped with this reason.
    Refused(String),
    /// Applied; restored when the guard is dropped or restored.
    Applied(IrqGuard),
}

/// Applies the IRQ policy the knobs ask for on this node, if it can act here.
pub(crate) fn irq_for(outside: &Outside, facts: &SystemFacts, loopback: bool) -> IrqOutcome {
    if outside.irq_policy == IrqPolicy::Default {
        return IrqOutcome::NotRequested;
    }
    let kind = outside.irq_policy.name();
    if loopback {
        return IrqOutcome::NotApplied(
            "the traffic runs over loopback, which has no NIC queue IRQs".into(),
        );
    }
    if !facts.is_root {
        return IrqOutcome::Refused(format!(
            "irq_policy `{kind}` needs root (it writes /proc/irq/*/smp_affinity): run the plan with sudo, or leave irq_policy at \"default\""
        ));
    }
    if facts.tx_bindings.is_empty() || facts.rx_bindings.is_empty() {
        return IrqOutcome::NotApplied(
            "no TX/RX core sets derive on this machine (no GPU/NIC pairs)".into(),
        );
    }
    let root = SysRoot::live();
    // The same policy `tcpx-run apply --irq` applies from the run's tuned.env.
    let policy = match tcpx_affinity::choice::policy_at(kind, &root, None) {
        Ok(Some(p)) => p,
        Ok(None) => return IrqOutcome::NotRequested,
        Err(e) => return IrqOutcome::NotApplied(e),
    };
    let plan = match policy.plan(&root) {
        Ok(p) => p,
        Err(e) => return IrqOutcome::NotApplied(format!("planning the IRQ policy: {e}")),
    };
    // Ctrl-C / SIGTERM while applied: restore, then exit (the report so far is on disk).
    tcpx_affinity::install_signal_restore();
    match plan.apply_guarded(&tcpx_affinity::default_backup_path(&root)) {
        Ok(g) => IrqOutcome::Applied(g),
        Err(e) => IrqOutcome::NotApplied(format!("applying the IRQ policy: {e} (rolled back)")),
    }
}

/// What the `nics` knob becomes on one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NicChoice {
    /// One NIC over loopback, or a backend that picks its NICs: the backend's default address.
    Default,
    /// These NICs, for `Experiment::nics` (loopback addresses or interface names).
    Use(Vec<String>),
    /// The backend cannot place channels on NICs: runs without a NIC choice, reason recorded.
    NotApplied(String),
    /// This side has fewer usable NICs than asked: the experiment is skipped with the reason.
    Missing(String),
}

/// The interfaces a real fabric's channels may use, best first: up, not loopback, with an IPv4
/// address; the NICs the topology pairs with GPUs (the data NICs) before the others.
pub(crate) fn usable_nics(
    interfaces: &[tcpx_bench::nics::Interface],
    facts: &SystemFacts,
) -> Vec<String> {
    let usable = |i: &&tcpx_bench::nics::Interface| {
        i.up && i.name != "lo"
            && i.addrs
                .iter()
                .any(|a| matches!(a, IpAddr::V4(v4) if !v4.is_loopback()))
    };
    let mut out: Vec<String> = Vec::new();
    for nic in facts.gpus.iter().filter_map(|g| g.nic.as_deref()) {
        if !out.iter().any(|n| n == nic) && interfaces.iter().filter(usable).any(|i| i.name == nic)
        {
            out.push(nic.to_string());
        }
    }
    for i in interfaces.iter().filter(usable) {
        if !out.contains(&i.name) {
            out.push(i.name.clone());
        }
    }
    out
}

/// This side's NICs for the `nics` knob. Over loopback, one NIC keeps the backend's default
/// address (127.0.0.1) and N NICs are the emulated 127.0.0.2 ..= 127.0.0.(N+1) (all on `lo`).
/// Across machines (or namespaces), N NICs are the first N of [`usable_nics`], one NIC included:
/// the backend's default address is this side's own loopback, which the peer cannot reach. Only
/// the socket backend binds channels to NICs.
pub(crate) fn nics_for(
    exp: &Experiment,
    outside: &Outside,
    facts: &SystemFacts,
    loopback: bool,
) -> NicChoice {
    let n = u64::from(outside.nics.max(1));
    // The backend says whether its channels take the NICs they are given.
    let not_applied = exp.transport.capabilities().nics.not_applied();
    if n == 1 && (loopback || not_applied.is_some()) {
        return NicChoice::Default;
    }
    if let Some(why) = not_applied {
        return NicChoice::NotApplied(why.into());
    }
    if loopback {
        return NicChoice::Use((2..=n + 1).map(|i| format!("127.0.0.{i}")).collect());
    }
    let interfaces = match tcpx_bench::nics::local_interfaces() {
        Ok(i) => i,
        Err(e) => return NicChoice::Missing(e),
    };
    let usable = usable_nics(&interfaces, facts);
    if (usable.len() as u64) < n {
        return NicChoice::Missing(format!(
            "{n} NICs asked for, but this machine has {} usable (up, not loopback, with an IPv4 address){}: lower `nics`, or bring more interfaces up",
            usable.len(),
            if usable.is_empty() {
                String::new()
            } else {
                format!(": {}", usable.join(", "))
            }
        ));
    }
    NicChoice::Use(usable.into_iter().take(n as usize).collect())
}

/// Why `nic_policy` cannot act, if it cannot: one NIC or none placed, or emulated NICs with no
/// NUMA node or PCI place (numa-local and closest-pci then go round-robin).
pub(crate) fn nic_policy_not_applied(
    exp: &Experiment,
    choice: &NicChoice,
    loopback: bool,
) -> Option<String> {
    let policy = exp.nic_policy;
    if policy == NicPolicy::RoundRobin {
        return None;
    }
    match choice {
        NicChoice::Use(_) if loopback => Some(format!(
            "emulated loopback NICs have no NUMA node or PCI place, so {policy} gives channels round-robin"
        )),
        NicChoice::Use(_) => None,
        _ => Some("no NICs are placed for this experiment (nics is 1, or the backend picks them)".into()),
    }
}

/// This side's NICs for an experiment (leader and follower each pick their own): `Ok(Some)` to
/// place channels on, `Ok(None)` for the backend's default; what cannot act (`nics`,
/// `nic_policy`) goes into `not_applied` with the reason. `Err` when NICs asked for are missing.
pub(crate) fn side_nics(
    exp: &Experiment,
    outside: &Outside,
    facts: &SystemFacts,
    loopback: bool,
    not_applied: &mut NotApplied,
) -> Result<Option<Vec<String>>, String> {
    let choice = nics_for(exp, outside, facts, loopback);
    if let Some(r) = nic_policy_not_applied(exp, &choice, loopback) {
        not_applied.insert(Knob::NicPolicy, r);
    }
    match choice {
        NicChoice::Default => Ok(None),
        NicChoice::Use(nics) => Ok(Some(nics)),
        NicChoice::NotApplied(r) => {
            not_applied.insert(Knob::Nics, r);
            Ok(None)
        }
        NicChoice::Missing(r) => Err(r),
    }
}

/// Knobs the leader cannot apply for an experiment with `knobs` on this machine, with the reason,
/// decided without running anything (the runner's answer to `not_applied_here(exp)`).
pub(crate) fn knobs_not_applied(
    exp: &Experiment,
    outside: &Outside,
    facts: &SystemFacts,
    loopback: bool,
) -> NotApplied {
    let mut na = NotApplied::new();
    let choice = nics_for(exp, outside, facts, loopback);
    match &choice {
        NicChoice::NotApplied(r) => {
            na.insert(Knob::Nics, r.clone());
        }
        NicChoice::Missing(r) => {
            na.insert(Knob::Nics, format!("{r}; the experiment will be skipped"));
        }
        NicChoice::Default | NicChoice::Use(_) => {}
    }
    if let Some(r) = nic_policy_not_applied(exp, &choice, loopback) {
        na.insert(Knob::NicPolicy, r);
    }
    if outside.irq_policy != IrqPolicy::Default {
        if loopback {
            na.insert(
                Knob::IrqPolicy,
                "the traffic runs over loopback, which has no NIC queue IRQs".into(),
            );
        } else if !facts.is_root {
            na.insert(
                Knob::IrqPolicy,
                "needs root: the experiment will be skipped".into(),
            );
        } else if facts.tx_bindings.is_empty() || facts.rx_bindings.is_empty() {
            na.insert(
                Knob::IrqPolicy,
                "no TX/RX core sets derive on this machine (no GPU/NIC pairs)".into(),
            );
        }
    }
    if let Err(r) = binding_for(outside, facts, Side::Send) {
        na.insert(Knob::ThreadBinding, r);
    }
    if exp.zero_copy_min.is_some() && !exp.transport.capabilities().takes_zero_copy() {
        na.insert(
            Knob::ZeroCopyMin,
            format!(
                "the {} backend sends through libnccl or GPU copies, not sockets this tool drives",
                exp.transport
            ),
        );
    }
    if !exp.worker_cpus.is_auto()
        && exp.transport.capabilities().threads != tcpx_model::WorkerThreads::PerSocket
    {
        na.insert(
            Knob::WorkerCpus,
            format!(
                "the {} backend's bytes are moved by libnccl's or its own threads, not socket workers of this tool",
                exp.transport
            ),
        );
    }
    if exp.staging_ring.is_some() {
        let staged = exp.transport.capabilities().gpu_memory == GpuMemoryPath::Staged;
        if exp.memory == tcpx_model::Memory::Host {
            na.insert(
                Knob::StagingRing,
                "host memory is sent as it is: only GPU memory is staged".into(),
            );
        } else if !staged {
            na.insert(
                Knob::StagingRing,
                format!(
                    "the {} backend carries GPU memory itself: only a host-memory backend stages it",
                    exp.transport
                ),
            );
        }
    }
    na
}

/// Runs `f` on a thread pinned to `cpus` (threads it starts inherit the mask); the error text
/// when pinning failed or the kernel applied another mask.
pub(crate) fn run_pinned<T: Send>(
    cpus: Option<&CpuSet>,
    f: impl FnOnce() -> T + Send,
) -> (T, Option<String>) {
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let pin_error = cpus.and_then(|c| match tcpx_affinity::pin_current_thread(c) {
                Ok(r) if r.matches() => None,
                Ok(r) => Some(format!("pinned, but {r}")),
                Err(e) => Some(format!("pinning failed: {e}")),
            });
            (f(), pin_error)
        });
        match h.join() {
            Ok(x) => x,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use serde_json::Value;
    use tcpx_plan::{NumaFact, PlanExperiment};

    // The tests give knobs as a plan does (a map, each value checked by `PlanExperiment::set`);
    // these wrappers hand the functions the typed halves and key `not_applied` by name.

    /// `not_applied` keyed by knob name, as the tests write it.
    fn by_name(na: &NotApplied) -> BTreeMap<String, String> {
        na.iter()
            .map(|(k, v)| (k.name().to_string(), v.clone()))
            .collect()
    }

    fn typed(knobs: &BTreeMap<String, Value>) -> (Experiment, Outside) {
        let mut p = PlanExperiment::defaults();
        for (k, v) in knobs {
            p.set(k, v).unwrap();
        }
        (p.bench_to_run(), p.outside)
    }

    fn binding_for(
        knobs: &BTreeMap<String, Value>,
        facts: &SystemFacts,
        side: Side,
    ) -> Result<Option<CpuSet>, String> {
        super::binding_for(&typed(knobs).1, facts, side)
    }

    fn irq_for(knobs: &BTreeMap<String, Value>, facts: &SystemFacts, loopback: bool) -> IrqOutcome {
        super::irq_for(&typed(knobs).1, facts, loopback)
    }

    fn nics_for(knobs: &BTreeMap<String, Value>, facts: &SystemFacts, loopback: bool) -> NicChoice {
        let (e, o) = typed(knobs);
        super::nics_for(&e, &o, facts, loopback)
    }

    fn nic_policy_not_applied(
        knobs: &BTreeMap<String, Value>,
        choice: &NicChoice,
        loopback: bool,
    ) -> Option<String> {
        super::nic_policy_not_applied(&typed(knobs).0, choice, loopback)
    }

    fn side_nics(
        knobs: &BTreeMap<String, Value>,
        facts: &SystemFacts,
        loopback: bool,
        not_applied: &mut BTreeMap<String, String>,
    ) -> Result<Option<Vec<String>>, String> {
        let (e, o) = typed(knobs);
        let mut na = NotApplied::new();
        let r = super::side_nics(&e, &o, facts, loopback, &mut na);
        not_applied.extend(by_name(&na));
        r
    }

    fn knobs_not_applied(
        knobs: &BTreeMap<String, Value>,
        facts: &SystemFacts,
        loopback: bool,
    ) -> BTreeMap<String, String> {
        let (e, o) = typed(knobs);
        by_name(&super::knobs_not_applied(&e, &o, facts, loopback))
    }

    #[test]
    fn bindings_that_cannot_act_say_why() {
        let mut facts = SystemFacts {
            cpus: 4,
            numa_nodes: vec![NumaFact {
                id: 0,
                cpus: "0-3".into(),
            }],
            ..SystemFacts::default()
        };
        let knobs = |b: &str| BTreeMap::from([("thread_binding".to_string(), Value::from(b))]);
        assert_eq!(binding_for(&knobs("none"), &facts, Side::Send), Ok(None));
        let e = binding_for(&knobs("numa-local"), &facts, Side::Send).unwrap_err();
        assert!(e.contains("every online CPU"), "{e}");
        let e = binding_for(&knobs("nccl"), &facts, Side::Send).unwrap_err();
        assert!(e.contains("no GPU/NIC pairs"), "{e}");
        facts.numa_nodes.push(NumaFact {
            id: 1,
            cpus: "4-7".into(),
        });
        facts.cpus = 8;
        facts.tx_bindings = "eth1:1-2;eth2:3".into();
        assert_eq!(
            binding_for(&knobs("nccl"), &facts, Side::Send),
            Ok(Some(CpuSet::parse_list("1-2").unwrap()))
        );
        assert_eq!(
            binding_for(&knobs("numa-local"), &facts, Side::Recv),
            Ok(Some(CpuSet::parse_list("0-3").unwrap()))
        );
    }

    #[test]
    fn side_nics_places_channels_or_records_why_not() {
        let knobs = |n: u64, transport: &str, policy: &str| {
            BTreeMap::from([
                ("nics".to_string(), Value::from(n)),
                ("transport".to_string(), Value::from(transport)),
                ("nic_policy".to_string(), Value::from(policy)),
            ])
        };
        let facts = SystemFacts::default();
        let mut na = BTreeMap::new();
        let nics = side_nics(&knobs(2, "socket", "numa-local"), &facts, true, &mut na).unwrap();
        assert_eq!(nics.map(|n| n.len()), Some(2));
        assert!(na["nic_policy"].contains("round-robin"), "{na:?}");
        assert!(!na.contains_key("nics"));
        let mut na = BTreeMap::new();
        let nics = side_nics(&knobs(2, "netplugin", "round-robin"), &facts, true, &mut na);
        assert_eq!(nics, Ok(None));
        assert!(
            na["nics"].contains("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"),
            "{na:?}"
        );
        let mut na = BTreeMap::new();
        assert!(side_nics(&knobs(1, "socket", "round-robin"), &facts, true, &mut na) == Ok(None));
        assert!(na.is_empty());
    }

    #[test]
    fn nics_are_emulated_on_loopback_and_data_nics_come_first_on_a_fabric() {
        let knobs = |n: u64, transport: &str| {
            BTreeMap::from([
                ("nics".to_string(), Value::from(n)),
                ("transport".to_string(), Value::from(transport)),
            ])
        };
        let facts = SystemFacts::default();
        assert_eq!(
            nics_for(&knobs(1, "socket"), &facts, true),
            NicChoice::Default
        );
        assert_eq!(
            nics_for(&knobs(3, "socket"), &facts, true),
            NicChoice::Use(vec![
                "127.0.0.2".into(),
                "127.0.0.3".into(),
                "127.0.0.4".into()
            ])
        );
        assert!(matches!(
            nics_for(&knobs(2, "netplugin"), &facts, true),
            NicChoice::NotApplied(r) if r.contains("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME")
        ));
        assert!(matches!(
            nics_for(&knobs(2, "cudap2p"), &facts, false),
            NicChoice::NotApplied(r) if r.contains("no NIC")
        ));
        let ifc = |name: &str, addrs: &[&str], up: bool| tcpx_bench::nics::Interface {
            name: name.into(),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            up,
        };
        let interfaces = [
            ifc("lo", &["127.0.0.1"], true),
            ifc("eth0", &["10.0.0.2"], true),
            ifc("eth1", &["10.1.0.2"], true),
            ifc("eth2", &["10.2.0.2"], false),
            ifc("eth3", &["fd00::3"], true),
            ifc("eth4", &["10.4.0.2"], true),
        ];
        let gpu = |nic: &str| tcpx_plan::GpuFact {
            nic: Some(nic.into()),
            ..Default::default()
        };
        let facts = SystemFacts {
            gpus: vec![gpu("eth4"), gpu("eth4"), gpu("eth2"), gpu("eth1")],
            ..SystemFacts::default()
        };
        // GPU-paired NICs first (eth2 is down, eth3 has no IPv4), then the others; never lo.
        assert_eq!(usable_nics(&interfaces, &facts), ["eth4", "eth1", "eth0"]);
        // One NIC across machines is the first usable data NIC, never the default 127.0.0.1 (the
        // peer's own loopback there); other backends pick their NICs themselves.
        assert_eq!(
            nics_for(&knobs(1, "nccl"), &SystemFacts::default(), false),
            NicChoice::Default
        );
        match nics_for(&knobs(1, "socket"), &SystemFacts::default(), false) {
            NicChoice::Use(n) => {
                assert_eq!(n.len(), 1);
                assert_ne!(n[0], "lo");
                let live = tcpx_bench::nics::local_interfaces().unwrap();
                let first = usable_nics(&live, &SystemFacts::default());
                assert_eq!(n[0], first[0]);
            }
            NicChoice::Missing(r) => assert!(r.contains("1 NICs asked for"), "{r}"),
            other => panic!("{other:?}"),
        }
        let policy = BTreeMap::from([("nic_policy".to_string(), Value::from("numa-local"))]);
        let used = NicChoice::Use(vec!["127.0.0.2".into()]);
        assert!(nic_policy_not_applied(&policy, &used, true)
            .unwrap()
            .contains("no NUMA node or PCI place"));
        assert_eq!(nic_policy_not_applied(&policy, &used, false), None);
        assert!(nic_policy_not_applied(&policy, &NicChoice::Default, false).is_some());
    }

    #[test]
    fn more_nics_than_this_machine_has_skip_the_experiment_with_the_count() {
        let knobs = BTreeMap::from([
            ("nics".to_string(), Value::from(8)),
            ("transport".to_string(), Value::from("socket")),
        ]);
        let facts = SystemFacts::default();
        match nics_for(&knobs, &facts, false) {
            NicChoice::Missing(r) => {
                assert!(r.contains("8 NICs asked for, but this machine has"), "{r}");
                let na = knobs_not_applied(&knobs, &facts, false);
                assert!(
                    na["nics"].ends_with("the experiment will be skipped"),
                    "{na:?}"
                );
            }
            NicChoice::Use(n) => println!("SKIP: this machine has {} usable NICs", n.len()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn zero_copy_and_worker_cpus_are_not_applied_on_backends_without_our_workers() {
        let k = |t: &str| {
            BTreeMap::from([
                ("transport".to_string(), Value::from(t)),
                ("zero_copy_min".to_string(), Value::from(65536)),
            ])
        };
        let facts = SystemFacts::default();
        let na = knobs_not_applied(&k("nccl"), &facts, true);
        assert!(na["zero_copy_min"].contains("nccl"), "{na:?}");
        assert!(!knobs_not_applied(&k("socket"), &facts, true).contains_key("zero_copy_min"));
        assert!(!knobs_not_applied(&k("netplugin"), &facts, true).contains_key("zero_copy_min"));
        let own = |t: &str| {
            let mut m = k(t);
            m.insert("worker_cpus".to_string(), Value::from("own"));
            m
        };
        assert!(knobs_not_applied(&own("nccl"), &facts, true)["worker_cpus"].contains("nccl"));
        assert!(!knobs_not_applied(&own("socket"), &facts, true).contains_key("worker_cpus"));
        assert!(!knobs_not_applied(&k("nccl"), &facts, true).contains_key("worker_cpus"));
    }

    /// A staging ring acts only where GPU memory crosses a host-memory backend.
    #[test]
    fn a_staging_ring_is_not_applied_to_host_memory_or_backends_that_carry_gpu_memory() {
        let k = |t: &str, memory: &str| {
            BTreeMap::from([
                ("transport".to_string(), Value::from(t)),
                ("memory".to_string(), Value::from(memory)),
                ("staging_ring".to_string(), Value::from(16 << 20)),
            ])
        };
        let facts = SystemFacts::default();
        let na = knobs_not_applied(&k("socket", "host"), &facts, true);
        assert!(na["staging_ring"].contains("host memory"), "{na:?}");
        let na = knobs_not_applied(&k("netplugin", "cuda"), &facts, true);
        assert!(na["staging_ring"].contains("netplugin"), "{na:?}");
        let na = knobs_not_applied(&k("socket", "cuda"), &facts, true);
        assert!(!na.contains_key("staging_ring"), "{na:?}");
    }

    #[test]
    fn irq_policies_need_root_and_real_nics() {
        let facts = SystemFacts::default();
        let k = BTreeMap::from([("irq_policy".to_string(), Value::from("nccl"))]);
        assert!(
            matches!(irq_for(&k, &facts, true), IrqOutcome::NotApplied(r) if r.contains("loopback"))
        );
        assert!(
            matches!(irq_for(&k, &facts, false), IrqOutcome::Refused(r) if r.contains("needs root"))
        );
        let d = BTreeMap::from([("irq_policy".to_string(), Value::from("default"))]);
        assert!(matches!(
            irq_for(&d, &facts, false),
            IrqOutcome::NotRequested
        ));
    }
}
