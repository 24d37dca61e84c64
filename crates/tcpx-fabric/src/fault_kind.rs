//! Faults as described and recorded: what is wrong with a NIC ([`FaultKind`]), how a loss is
//! made ([`LossMethod`]), a fault as the state file holds it ([`Fault`]) and a change asked for on
//! the command line ([`FaultChange`]). The state file ([`crate::fabric::State`]) holds these;
//! making and undoing them on a running fabric is [`crate::fault`]'s.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::placement::{self, Node};
use crate::spec::{Loss, Rate, SpecError};

/// What is wrong with a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// Capped at this rate in both directions (instead of the fabric's rate).
    Cap(Rate),
    /// This share of packets dropped in both directions.
    Loss(Loss),
    /// Administratively down inside the node.
    Down,
}

impl FaultKind {
    pub fn class(self) -> FaultClass {
        match self {
            FaultKind::Cap(_) => FaultClass::Cap,
            FaultKind::Loss(_) => FaultClass::Loss,
            FaultKind::Down => FaultClass::Down,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::Cap(r) => write!(f, "capped at {r}"),
            FaultKind::Loss(l) => write!(f, "{l} loss"),
            FaultKind::Down => f.write_str("down"),
        }
    }
}

/// A kind of fault without its value: what [`crate::Fabric::clear_fault`] removes. A NIC has at
/// most one fault of each class; setting one again replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultClass {
    Cap,
    Loss,
    Down,
}

/// How a loss fault drops packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossMethod {
    /// A netem qdisc's `loss` on both ends of the link (the kernel has sch_netem).
    Netem,
    /// An nftables `numgen random` drop rule on the NIC's output and input in the node's
    /// namespace (no sch_netem; needs `nft`).
    Nftables,
    /// An iptables `statistic --mode random` drop rule on the NIC's output and input in the
    /// node's namespace (no sch_netem, no `nft`; needs `iptables`).
    Iptables,
}

impl fmt::Display for LossMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossMethod::Netem => "netem",
            LossMethod::Nftables => "nftables",
            LossMethod::Iptables => "iptables",
        })
    }
}

/// A fault as set and recorded in the state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub node: Node,
    /// The NIC, 0-based (`eth<nic+1>`).
    pub nic: u32,
    pub kind: FaultKind,
    /// For a loss: how it is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<LossMethod>,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.node.label(),
            placement::nic_name(self.nic),
            self.kind
        )?;
        if let Some(m) = self.method {
            write!(f, " ({m})")?;
        }
        Ok(())
    }
}

/// One change asked for on the command line: `c:eth2:cap=500mbit`, `c:eth2:loss=5%`,
/// `c:eth2:down`, and to undo them `c:eth2:up`, `c:eth2:uncap`, `c:eth2:no-loss`,
/// `c:eth2:clear` (all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultChange {
    pub node: Node,
    pub nic: u32,
    pub action: FaultAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    Set(FaultKind),
    Clear(FaultClass),
    ClearAll,
}

/// Why a fault change was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault `{text}`: {why}; the form is NODE:NIC:WHAT, e.g. c:eth2:cap=500mbit, b:eth1:loss=5%, d:eth3:down (undo: up, uncap, no-loss, clear)")]
pub struct FaultParseError {
    pub text: String,
    pub why: String,
}

impl FromStr for FaultChange {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<FaultChange, FaultParseError> {
        let err = |why: String| FaultParseError {
            text: s.chars().take(80).collect(),
            why,
        };
        let mut parts = s.trim().splitn(3, ':');
        let (Some(node), Some(nic), Some(what)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(err("three parts separated by `:` are needed".into()));
        };
        let node = Node::from_letter(node)
            .ok_or_else(|| err(format!("`{node}` is not a node (a to h)")))?;
        let nic = nic
            .trim()
            .strip_prefix("eth")
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| err(format!("`{nic}` is not a NIC (eth1, eth2, ...)")))?
            - 1;
        let action = match what.trim().split_once('=') {
            Some(("cap", r)) => FaultAction::Set(FaultKind::Cap(
                r.parse().map_err(|e: SpecError| err(e.to_string()))?,
            )),
            Some(("loss", l)) => FaultAction::Set(FaultKind::Loss(
                l.parse().map_err(|e: SpecError| err(e.to_string()))?,
            )),
            Some((other, _)) => return Err(err(format!("`{other}=` is not a fault"))),
            None => match what.trim() {
                "down" => FaultAction::Set(FaultKind::Down),
                "up" => FaultAction::Clear(FaultClass::Down),
                "uncap" => FaultAction::Clear(FaultClass::Cap),
                "no-loss" => FaultAction::Clear(FaultClass::Loss),
                "clear" => FaultAction::ClearAll,
                other => return Err(err(format!("`{other}` is not a fault"))),
            },
        };
        Ok(FaultChange { node, nic, action })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_parse_and_bad_ones_say_the_form() {
        let c: FaultChange = "c:eth2:cap=500mbit".parse().unwrap();
        assert_eq!(c.node, Node::new(2).unwrap());
        assert_eq!(c.nic, 1);
        assert_eq!(
            c.action,
            FaultAction::Set(FaultKind::Cap("500mbit".parse().unwrap()))
        );
        let l: FaultChange = "B:eth1:loss=5%".parse().unwrap();
        assert_eq!(
            l.action,
            FaultAction::Set(FaultKind::Loss(Loss { ppm: 50_000 }))
        );
        assert_eq!(
            "d:eth4:down".parse::<FaultChange>().unwrap().action,
            FaultAction::Set(FaultKind::Down)
        );
        assert_eq!(
            "d:eth4:up".parse::<FaultChange>().unwrap().action,
            FaultAction::Clear(FaultClass::Down)
        );
        assert_eq!(
            "a:eth1:clear".parse::<FaultChange>().unwrap().action,
            FaultAction::ClearAll
        );
        for bad in [
            "",
            "c",
            "c:eth2",
            "z:eth1:down",
            "c:eth0:down",
            "c:wlan0:down",
            "c:eth1:explode",
            "c:eth1:cap=fast",
            "c:eth1:loss=200%",
            "c:eth1:mtu=9000",
        ] {
            let e = bad.parse::<FaultChange>().unwrap_err().to_string();
            assert!(e.contains("the form is NODE:NIC:WHAT"), "{bad}: {e}");
        }
    }

    #[test]
    fn faults_read_as_what_they_do_and_round_trip_through_the_state() {
        let f = Fault {
            node: Node::new(2).unwrap(),
            nic: 1,
            kind: FaultKind::Loss("2%".parse().unwrap()),
            method: Some(LossMethod::Nftables),
        };
        assert_eq!(f.to_string(), "node C eth2 2% loss (nftables)");
        let j = serde_json::to_string(&f).unwrap();
        assert_eq!(
            j,
            r#"{"node":"c","nic":1,"kind":{"loss":{"ppm":20000}},"method":"nftables"}"#
        );
        assert_eq!(serde_json::from_str::<Fault>(&j).unwrap(), f);
        let down = Fault {
            node: Node::A,
            nic: 0,
            kind: FaultKind::Down,
            method: None,
        };
        assert_eq!(down.to_string(), "node A eth1 down");
        assert_eq!(
            serde_json::to_string(&down).unwrap(),
            r#"{"node":"a","nic":0,"kind":"down"}"#
        );
    }
}
