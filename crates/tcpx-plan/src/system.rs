//! What a plan may know about the machine (read-only facts) and the one thing it may ask for:
//! running an experiment, through [`Runner`], which the caller (tcpx-run) implements.

use std::rc::Rc;

use serde::{Deserialize, Serialize};
use tcpx_model::NotApplied;
use tcpx_report::{ResultRecord, SampleRecord};

use crate::knobs::PlanExperiment;

/// A NIC queue IRQ and where it may run now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IrqFact {
    pub irq: u32,
    /// `tx`, `rx`, `txrx` or `other`.
    pub direction: String,
    pub queue: Option<u32>,
    /// Current smp_affinity_list, e.g. `0-15`.
    pub affinity: String,
}

/// One network interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicFact {
    pub name: String,
    pub driver: String,
    pub numa_node: Option<u32>,
    pub speed_mbps: Option<u64>,
    pub irqs: Vec<IrqFact>,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFact {
    pub bus_id: String,
    pub numa_node: Option<u32>,
    /// The nearest NIC by PCI path, when known.
    pub nic: Option<String>,
}

/// A NUMA node and its CPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NumaFact {
    pub id: u32,
    /// CPU list, e.g. `0-51,104-155`.
    pub cpus: String,
}

/// Everything a plan can read about the machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemFacts {
    pub hostname: String,
    pub cpus: u32,
    pub numa_nodes: Vec<NumaFact>,
    pub gpus: Vec<GpuFact>,
    pub nics: Vec<NicFact>,
    /// NCCL-style TX/RX binding strings derived from the topology (empty when none derive).
    pub tx_bindings: String,
    pub rx_bindings: String,
    /// Effective uid 0 (IRQ affinity changes need it).
    pub is_root: bool,
    /// Backends this build and machine can run.
    pub transports: Vec<String>,
    /// Where the follower is: `loopback (in-process)`, or an address.
    pub peer: String,
    /// Things that could not be read (no hwloc, no /proc/interrupts), for the report.
    pub warnings: Vec<String>,
}

/// What running one experiment gave.
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// One per message size when it ran; one skipped/failed record when it did not.
    pub records: Vec<ResultRecord>,
    pub samples: Vec<SampleRecord>,
    /// Set when the run cannot go on (the follower vanished): the plan stops, results so far
    /// are kept, and the report is marked incomplete with this message.
    pub fatal: Option<String>,
}

/// Runs experiments for a plan. Implementations apply every knob they can and record the ones
/// they cannot in [`ResultRecord::not_applied`] with the reason, and turn experiments the
/// backend cannot do (e.g. a window beyond its limit) into `Skipped` records rather than errors.
pub trait Runner {
    fn facts(&self) -> &SystemFacts;
    /// `phase` and `started_s` go into the records.
    fn run(&mut self, exp: &PlanExperiment, phase: &str, started_s: f64) -> RunOutcome;
    /// Knobs of `exp` this runner cannot apply here, with the reason, without running anything
    /// (what `not_applied_here(exp)` answers in plans). Default: none.
    fn not_applied(&self, _exp: &PlanExperiment) -> NotApplied {
        NotApplied::new()
    }
    /// libnccl send/recv with NCCL's defaults against the same with `tuned` (the run's
    /// tuned.env variables), what `validate()` in a plan does. Default: not possible here.
    fn validate(&mut self, _tuned: &[(String, String)]) -> Validation {
        Validation::NotAvailable("this runner cannot run libnccl comparisons".into())
    }
}

/// What a default-vs-tuned libnccl comparison gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// It could not run here (no libnccl, fewer than two GPUs): the reason.
    NotAvailable(String),
    /// Tuned / default receiver busbw at the largest size, with its 95 % interval, and a
    /// sentence with every size's figures.
    Measured {
        gain: f64,
        lo: f64,
        hi: f64,
        detail: String,
    },
}

/// Answers [`Runner::not_applied`] during the dry pass, before any runner exists.
pub type KnobSupport = Rc<dyn Fn(&PlanExperiment) -> NotApplied>;
