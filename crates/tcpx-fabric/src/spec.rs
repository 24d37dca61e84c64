//! What a fabric is asked to be: NIC count, per-direction rate, optional delay, placement.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A line rate in bits per second (tc's `bit` unit: k, m, g are powers of 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rate {
    pub bits_per_s: u64,
}

impl Rate {
    pub const fn gbit(g: u64) -> Rate {
        Rate {
            bits_per_s: g * 1_000_000_000,
        }
    }

    /// Bytes per second, the unit `tc -j` reports tbf rates in.
    pub fn bytes_per_s(self) -> u64 {
        self.bits_per_s / 8
    }

    /// GB/s (1e9 bytes/s), the unit bandwidth is reported in.
    pub fn gbs(self) -> f64 {
        self.bits_per_s as f64 / 8e9
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_s;
        for (div, unit) in [
            (1_000_000_000, "gbit"),
            (1_000_000, "mbit"),
            (1_000, "kbit"),
        ] {
            if b >= div && b % div == 0 {
                return write!(f, "{}{unit}", b / div);
            }
        }
        write!(f, "{b}bit")
    }
}

/// Why a fabric description was refused; each message names the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("rate `{0}` is not understood: give bits per second with a unit, e.g. 2gbit, 500mbit, 2G (k, m, g = powers of 1000)")]
    BadRate(String),
    #[error("rate must be above zero")]
    ZeroRate,
    #[error("delay `{0}` is not understood: give a duration such as 5ms, 250us or 0.5ms")]
    BadDelay(String),
    #[error("loss `{0}` is not understood: give a share above 0 and below 100%, e.g. 5% or 0.5% (or a fraction, 0.05)")]
    BadLoss(String),
    #[error("loss `{0}` would drop every packet, which the loss rules cannot express (nft's random draw stops below 100%): take the NIC down instead (NODE:NIC:down)")]
    TotalLoss(String),
    #[error("topology `{0}` is unknown: choose a3-high or flat")]
    BadTopology(String),
    #[error("{nics} NICs asked for: give 1 to {max} ({why})")]
    BadNicCount {
        nics: u32,
        max: u32,
        why: &'static str,
    },
    #[error("{0} nodes asked for: give 2 to 8 (two are joined by veth pairs directly, more by a switch)")]
    BadNodeCount(u32),
    #[error("fabric id `{0}` is not usable: 1 to 20 characters from a-z, 0-9 and '-' (it names namespaces and the state file)")]
    BadId(String),
}

impl FromStr for Rate {
    type Err = SpecError;

    /// `2gbit`, `2Gbit/s`, `500mbit`, `2G`, `2000000000` (plain bits per second).
    fn from_str(s: &str) -> Result<Rate, SpecError> {
        let bad = || SpecError::BadRate(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_suffix("/s").unwrap_or(&t);
        let t = t
            .strip_suffix("bps")
            .or_else(|| t.strip_suffix("bit"))
            .unwrap_or(t);
        let (num, mult) = match t.chars().last() {
            Some('k') => (&t[..t.len() - 1], 1e3),
            Some('m') => (&t[..t.len() - 1], 1e6),
            Some('g') => (&t[..t.len() - 1], 1e9),
            Some('t') => (&t[..t.len() - 1], 1e12),
            _ => (t, 1.0),
        };
        let v: f64 = num.trim().parse().map_err(|_| bad())?;
        if !v.is_finite() || v < 0.0 {
            return Err(bad());
        }
        let bits = (v * mult).round();
        if bits < 1.0 {
            return Err(SpecError::ZeroRate);
        }
        if bits > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(Rate {
            bits_per_s: bits as u64,
        })
    }
}

/// A one-way delay added to each direction (netem), in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delay {
    pub us: u64,
}

impl fmt::Display for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.us % 1000 == 0 {
            write!(f, "{}ms", self.us / 1000)
        } else {
            write!(f, "{}us", self.us)
        }
    }
}

impl FromStr for Delay {
    type Err = SpecError;

    /// `5ms`, `250us`, `0.5ms`, `1s`.
    fn from_str(s: &str) -> Result<Delay, SpecError> {
        let bad = || SpecError::BadDelay(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        let (num, mult) = if let Some(n) = t.strip_suffix("us") {
            (n, 1.0)
        } else if let Some(n) = t.strip_suffix("ms") {
            (n, 1e3)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1e6)
        } else {
            return Err(bad());
        };
        let v: f64 = num.trim().parse().map_err(|_| bad())?;
        if !v.is_finite() || v < 0.0 || v * mult > 60e6 {
            return Err(bad());
        }
        Ok(Delay {
            us: (v * mult).round() as u64,
        })
    }
}

/// A share of packets dropped at random, in parts per million (`5%` is 50000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Loss {
    pub ppm: u32,
}

impl Loss {
    /// The share as a fraction (0.05 for 5%).
    pub fn fraction(self) -> f64 {
        f64::from(self.ppm) / 1e6
    }

    /// As tc's netem takes it: `5%`, `0.25%`.
    pub fn tc_percent(self) -> String {
        format!("{self}")
    }
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.ppm / 10_000;
        let rest = self.ppm % 10_000;
        if rest == 0 {
            write!(f, "{whole}%")
        } else {
            let frac = format!("{rest:04}");
            write!(f, "{whole}.{}%", frac.trim_end_matches('0'))
        }
    }
}

impl FromStr for Loss {
    type Err = SpecError;

    /// `5%`, `0.5%`, or a fraction `0.05`; above 0 and below 100% (all of a NIC's packets
    /// dropped is the `down` fault; nft's rules cannot say it, issue 43 item 9).
    fn from_str(s: &str) -> Result<Loss, SpecError> {
        let bad = || SpecError::BadLoss(s.to_string());
        let t = s.trim();
        let (num, scale) = match t.strip_suffix('%') {
            Some(n) => (n, 1e4),
            None => (t, 1e6),
        };
        let v: f64 = num.trim().parse().map_err(|_| bad())?;
        let ppm = (v * scale).round();
        if ppm == 1e6 {
            return Err(SpecError::TotalLoss(s.trim().chars().take(40).collect()));
        }
        if !ppm.is_finite() || !(1.0..1e6).contains(&ppm) {
            return Err(bad());
        }
        Ok(Loss { ppm: ppm as u32 })
    }
}

/// Where each emulated NIC (and GPU) is said to sit, for the NIC policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// GCP A3-high's placement (the `tcpx-topo` a3-high fixture): NIC k is A3's eth(k+1), with
    /// its NUMA node and PCI path; eight GPUs as on A3. At most 4 NICs.
    A3High,
    /// No placement: every NIC and GPU has an unknown NUMA node and no PCI path, so every NIC
    /// counts as local to every GPU.
    Flat,
}

impl Topology {
    pub const NAMES: &'static [&'static str] = &["a3-high", "flat"];

    /// The most NICs this placement describes.
    pub fn max_nics(self) -> u32 {
        match self {
            Topology::A3High => 4,
            Topology::Flat => 64,
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Topology::A3High => "a3-high",
            Topology::Flat => "flat",
        })
    }
}

impl FromStr for Topology {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Topology, SpecError> {
        match s.trim() {
            "a3-high" | "a3" => Ok(Topology::A3High),
            "flat" => Ok(Topology::Flat),
            other => Err(SpecError::BadTopology(other.to_string())),
        }
    }
}

/// How the nodes are joined: derived from the node count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Two nodes, NIC k of node A joined to NIC k of node B by one veth pair (a /30 each).
    Pairs,
    /// Three to eight nodes behind one switch namespace (`tcpx-sw-<id>`) holding one bridge per
    /// NIC index (rail-aligned, as A3's NICs are): NIC k of every node is a veth into bridge k,
    /// one /24 per rail.
    Switched,
}

impl Layout {
    /// The layout of a fabric of `nodes` nodes.
    pub fn for_nodes(nodes: u32) -> Layout {
        if nodes <= 2 {
            Layout::Pairs
        } else {
            Layout::Switched
        }
    }
}

/// The fewest and most nodes a fabric has.
pub const MIN_NODES: u32 = 2;
pub const MAX_NODES: u32 = 8;

/// The default fabric id: namespaces `tcpx-a-fabric` and `tcpx-b-fabric`.
pub const DEFAULT_ID: &str = "fabric";

/// Where state files live unless `TCPX_FABRIC_STATE_DIR` says otherwise: tmpfs, so they vanish
/// at reboot together with the namespaces they describe.
pub const DEFAULT_STATE_DIR: &str = "/run/tcpx-fabric";

/// The state directory in effect (`TCPX_FABRIC_STATE_DIR` or [`DEFAULT_STATE_DIR`]).
pub fn default_state_dir() -> PathBuf {
    std::env::var_os("TCPX_FABRIC_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// Checks a fabric id: short, lower-case letters, digits and '-' (it ends up in namespace names).
pub fn check_id(id: &str) -> Result<(), SpecError> {
    let ok = !id.is_empty()
        && id.len() <= 20
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError::BadId(id.to_string()))
    }
}

/// One fabric to bring up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Names the namespaces (`tcpx-a-<id>`, `tcpx-b-<id>`, ..., and `tcpx-sw-<id>` for the
    /// switch of more than two nodes) and the state file; several fabrics with different ids can
    /// exist at once (tests use one each).
    pub id: String,
    /// 2 to 8 nodes ([`Layout::for_nodes`]).
    pub nodes: u32,
    pub nics: u32,
    /// Each direction of each NIC is capped at this rate.
    pub rate: Rate,
    /// One-way delay per direction; needs the kernel's sch_netem.
    pub delay: Option<Delay>,
    pub topology: Topology,
    pub state_dir: PathBuf,
}

impl Spec {
    /// Two nodes with `nics` NICs at `rate`, A3 placement, no delay, the default id and state
    /// directory.
    pub fn new(nics: u32, rate: Rate) -> Spec {
        Spec {
            id: DEFAULT_ID.to_string(),
            nodes: 2,
            nics,
            rate,
            delay: None,
            topology: Topology::A3High,
            state_dir: default_state_dir(),
        }
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        check_id(&self.id)?;
        if !(MIN_NODES..=MAX_NODES).contains(&self.nodes) {
            return Err(SpecError::BadNodeCount(self.nodes));
        }
        let max = self.topology.max_nics();
        if self.nics == 0 || self.nics > max {
            return Err(SpecError::BadNicCount {
                nics: self.nics,
                max,
                why: match self.topology {
                    Topology::A3High => "A3-high has 4 data NICs; use --topology flat for more",
                    Topology::Flat => "one /30 subnet and one veth pair per NIC",
                },
            });
        }
        if self.rate.bits_per_s == 0 {
            return Err(SpecError::ZeroRate);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_tc_units() {
        assert_eq!("2gbit".parse::<Rate>().unwrap(), Rate::gbit(2));
        assert_eq!("2Gbit/s".parse::<Rate>().unwrap(), Rate::gbit(2));
        assert_eq!("2G".parse::<Rate>().unwrap(), Rate::gbit(2));
        assert_eq!("500mbit".parse::<Rate>().unwrap().bits_per_s, 500_000_000);
        assert_eq!("1.5g".parse::<Rate>().unwrap().bits_per_s, 1_500_000_000);
        assert_eq!("1000".parse::<Rate>().unwrap().bits_per_s, 1000);
        assert_eq!(Rate::gbit(2).to_string(), "2gbit");
        assert_eq!("1500mbit".parse::<Rate>().unwrap().to_string(), "1500mbit");
        assert_eq!(Rate::gbit(2).bytes_per_s(), 250_000_000);
        for bad in ["", "fast", "-1g", "2x", "gbit"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} parsed");
        }
        assert_eq!("0g".parse::<Rate>(), Err(SpecError::ZeroRate));
    }

    #[test]
    fn losses_parse_as_percent_or_fraction() {
        assert_eq!("5%".parse::<Loss>().unwrap().ppm, 50_000);
        assert_eq!("0.05".parse::<Loss>().unwrap().ppm, 50_000);
        assert_eq!("0.25%".parse::<Loss>().unwrap().to_string(), "0.25%");
        assert_eq!("99.9999%".parse::<Loss>().unwrap().ppm, 999_999);
        // Issue 43 item 9: 100% was accepted and nft could not apply it.
        for total in ["100%", "1", "1.0", " 100 % "] {
            let e = total.parse::<Loss>().unwrap_err().to_string();
            assert!(
                e.contains("drop every packet") && e.contains("down"),
                "{total}: {e}"
            );
        }
        assert_eq!("12.5%".parse::<Loss>().unwrap().tc_percent(), "12.5%");
        for bad in ["", "0%", "101%", "-1%", "x%", "2", "0.00001%"] {
            assert!(bad.parse::<Loss>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn delays_parse() {
        assert_eq!("5ms".parse::<Delay>().unwrap().us, 5000);
        assert_eq!("250us".parse::<Delay>().unwrap().us, 250);
        assert_eq!("0.5ms".parse::<Delay>().unwrap().us, 500);
        assert_eq!("1s".parse::<Delay>().unwrap().us, 1_000_000);
        assert_eq!("0.5ms".parse::<Delay>().unwrap().to_string(), "500us");
        for bad in ["5", "ms", "-1ms", "5 parsecs"] {
            assert!(bad.parse::<Delay>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn specs_are_checked() {
        let mut s = Spec::new(4, Rate::gbit(2));
        assert!(s.validate().is_ok());
        s.nics = 5;
        assert!(matches!(
            s.validate(),
            Err(SpecError::BadNicCount { max: 4, .. })
        ));
        s.topology = Topology::Flat;
        assert!(s.validate().is_ok());
        s.nics = 0;
        assert!(s.validate().is_err());
        s.nics = 1;
        for bad in ["", "A", "a b", "x/y", "123456789012345678901"] {
            s.id = bad.into();
            assert!(matches!(s.validate(), Err(SpecError::BadId(_))), "{bad}");
        }
        s.id = "ok".into();
        for bad in [0, 1, 9] {
            s.nodes = bad;
            assert_eq!(s.validate(), Err(SpecError::BadNodeCount(bad)));
        }
        s.nodes = 8;
        assert!(s.validate().is_ok());
        assert_eq!(Layout::for_nodes(2), Layout::Pairs);
        assert_eq!(Layout::for_nodes(3), Layout::Switched);
        assert_eq!("a3-high".parse::<Topology>().unwrap(), Topology::A3High);
        assert!("dgx".parse::<Topology>().is_err());
    }
}
