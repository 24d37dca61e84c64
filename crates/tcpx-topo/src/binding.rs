//! NCCL / GPUDirect-TCPX binding specs: `"eth1:8-21,112-125;eth2:8-21,112-125"`.
//!
//! The form of `NCCL_GPUDIRECTTCPX_{TX,RX}_BINDINGS` and `..._{TX,RX}_IRQ_BINDINGS`: NIC name, a
//! colon, a cpu list; entries separated by `;`. The TCPX plugin reads at most
//! [`MAX_RANGES_PER_NIC`] ranges per NIC, so [`BindingSpec::validate_for_tcpx`] checks that.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

/// The GPUDirect-TCPX plugin keeps at most this many cpu ranges per NIC.
pub const MAX_RANGES_PER_NIC: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("binding spec {input:?}: {why} (expected e.g. \"eth1:8-21,112-125;eth2:8-21\")")]
pub struct BindingParseError {
    pub input: String,
    pub why: String,
}

/// One NIC's cpu set in a binding spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicBinding {
    pub nic: String,
    pub cpus: CpuSet,
}

/// An ordered list of NIC -> cpu set entries (order is kept as written: NCCL does not sort).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingSpec {
    pub entries: Vec<NicBinding>,
}

impl BindingSpec {
    pub fn parse(input: &str) -> Result<Self, BindingParseError> {
        let err = |why: String| BindingParseError {
            input: input.to_string(),
            why,
        };
        let mut entries: Vec<NicBinding> = Vec::new();
        for part in input.split(';') {
            let part = part.trim();
            if part.is_empty() {
                continue; // a trailing ';' is common in hand-written env vars
            }
            let (nic, list) = part
                .split_once(':')
                .ok_or_else(|| err(format!("entry {part:?} has no ':'")))?;
            let nic = nic.trim();
            if nic.is_empty() || nic.contains(char::is_whitespace) {
                return Err(err(format!("entry {part:?} has no usable NIC name")));
            }
            if entries.iter().any(|e| e.nic == nic) {
                return Err(err(format!("NIC {nic} appears twice")));
            }
            let cpus = CpuSet::parse_list(list).map_err(|e| err(e.to_string()))?;
            if cpus.is_empty() {
                return Err(err(format!("NIC {nic} has an empty cpu list")));
            }
            entries.push(NicBinding {
                nic: nic.to_string(),
                cpus,
            });
        }
        Ok(Self { entries })
    }

    pub fn push(&mut self, nic: impl Into<String>, cpus: CpuSet) {
        self.entries.push(NicBinding {
            nic: nic.into(),
            cpus,
        });
    }

    pub fn get(&self, nic: &str) -> Option<&CpuSet> {
        self.entries.iter().find(|e| e.nic == nic).map(|e| &e.cpus)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Errors that the TCPX plugin would trip over: too many ranges for one NIC.
    pub fn validate_for_tcpx(&self) -> Result<(), String> {
        for e in &self.entries {
            let n = e.cpus.ranges().len();
            if n > MAX_RANGES_PER_NIC {
                return Err(format!(
                    "{}: {} cpu ranges, the TCPX plugin reads at most {MAX_RANGES_PER_NIC}",
                    e.nic, n
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for BindingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{}:{}", e.nic, e.cpus))
            .collect();
        f.write_str(&parts.join(";"))
    }
}

impl FromStr for BindingSpec {
    type Err = BindingParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NCCL_TX: &str =
        "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177";

    #[test]
    fn round_trip_nccl_tx() {
        let spec = BindingSpec::parse(NCCL_TX).unwrap();
        assert_eq!(spec.entries.len(), 4);
        assert_eq!(spec.get("eth3").unwrap().to_list_string(), "60-73,164-177");
        assert_eq!(spec.to_string(), NCCL_TX);
        assert!(spec.validate_for_tcpx().is_ok());
    }

    #[test]
    fn tolerates_spaces_and_trailing_semicolon() {
        let spec = BindingSpec::parse(" eth1: 0-3 ; eth2:4;").unwrap();
        assert_eq!(spec.to_string(), "eth1:0-3;eth2:4");
    }

    #[test]
    fn rejects_bad_specs() {
        crate::assert_rejects(
            BindingSpec::parse,
            &["eth1", ":0-3", "eth1:", "eth1:0-3;eth1:4", "eth1:x"],
        );
    }

    #[test]
    fn too_many_ranges_for_tcpx() {
        let spec = BindingSpec::parse("eth1:0,2,4,6,8,10,12,14,16").unwrap();
        let e = spec.validate_for_tcpx().unwrap_err();
        assert!(e.contains("9 cpu ranges"), "{e}");
    }
}
