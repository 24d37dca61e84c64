//! How an experiment's channels are given to NICs.

use std::str::FromStr;

/// How channels are given to NICs; `tcpx_sched::nic` does the placing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NicPolicy {
    /// Every NIC named, channel `c` of flow `f` on NIC `(f * channels + c) % n`.
    #[default]
    RoundRobin,
    /// The NICs on the GPU's NUMA node.
    NumaLocal,
    /// The NICs whose PCI path is closest to the GPU's.
    ClosestPci,
    /// Channel `c` takes entry `c % n` of the experiment's NIC list.
    Explicit,
}

/// A NIC policy text that names none of the policies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NIC policy `{0}` is unknown: choose round-robin, numa-local, closest-pci or explicit (channel c takes --nics entry c)")]
pub struct UnknownNicPolicy(pub String);

impl NicPolicy {
    /// Every policy, in the order users are shown them.
    pub const ALL: [NicPolicy; 4] = [
        NicPolicy::RoundRobin,
        NicPolicy::NumaLocal,
        NicPolicy::ClosestPci,
        NicPolicy::Explicit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NicPolicy::RoundRobin => "round-robin",
            NicPolicy::NumaLocal => "numa-local",
            NicPolicy::ClosestPci => "closest-pci",
            NicPolicy::Explicit => "explicit",
        }
    }
}

crate::display_as_word!(NicPolicy, name);

impl FromStr for NicPolicy {
    type Err = UnknownNicPolicy;

    /// The names, and the short forms `tcpx_sched` has always taken (`rr`, `numa`, `pci`).
    fn from_str(s: &str) -> Result<Self, UnknownNicPolicy> {
        match s.trim() {
            "round-robin" | "rr" => Ok(NicPolicy::RoundRobin),
            "numa-local" | "numa" => Ok(NicPolicy::NumaLocal),
            "closest-pci" | "pci" => Ok(NicPolicy::ClosestPci),
            "explicit" => Ok(NicPolicy::Explicit),
            other => Err(UnknownNicPolicy(other.to_string())),
        }
    }
}

crate::serde_as_text!(
    NicPolicy,
    "round-robin, numa-local, closest-pci or explicit"
);
