//! An experiment given as text (command-line flags, environment variables) checked into an
//! [`Experiment`], and the control address of a side: every refusal names its flag, so a bad
//! value is a usage error, never a panic or a silent truncation.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};

pub use tcpx_model::Knob;
use tcpx_model::{KnobKind, KNOBS};

use crate::Experiment;

pub use tcpx_model::set_knob::{count, cpus, seconds, size};

/// An experiment as `tcpx-run bench`'s flags give it: each knob's values, still text, keyed by
/// the knob (a flag given several times, or a list, has several values).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExperimentFlags(pub BTreeMap<Knob, Vec<String>>);

impl ExperimentFlags {
    /// These flags with `knob` set to `value`.
    pub fn with(mut self, knob: Knob, value: &str) -> Self {
        self.0.insert(knob, vec![value.to_string()]);
        self
    }

    /// The experiment these flags describe, each value parsed and range-checked (the first bad
    /// one named), a knob not given at its default; [`Experiment::validate`] is the caller's
    /// next step.
    pub fn experiment(&self) -> Result<Experiment, String> {
        let mut exp = Experiment::default();
        for knob in parse_order() {
            if let Some(values) = self.0.get(&knob) {
                exp.set_knob(knob, values)?;
            }
        }
        Ok(exp)
    }
}

/// The command-line knobs in the order their values are checked: the timeout, then the other
/// numbers and lists in table order, then the typed words (cpu lists, NIC policy, memory,
/// transport), so that of several bad flags the one named first stays the same.
fn parse_order() -> Vec<Knob> {
    let rank = |s: &tcpx_model::KnobSpec| match s.flag_kind() {
        KnobKind::Float { .. } => 0,
        KnobKind::Cpus => 2,
        KnobKind::Choice(_) | KnobKind::Memory if s.switch.is_none() => 3,
        _ => 1,
    };
    let mut specs: Vec<_> = KNOBS.iter().filter(|s| s.flag.is_some()).collect();
    specs.sort_by_key(|s| rank(s));
    // The typed words are checked last first: NIC policy, memory, then the transport.
    let words = specs
        .iter()
        .position(|s| rank(s) == 3)
        .unwrap_or(specs.len());
    specs[words..].reverse();
    specs.iter().map(|s| s.knob).collect()
}

/// An experiment sent as JSON to a flow process, checked.
pub fn experiment_from_json(json: &str) -> Result<Experiment, String> {
    let exp: Experiment = serde_json::from_str(json).map_err(|e| {
        format!("--experiment-json is not an experiment of this tcpx-run version: {e}")
    })?;
    exp.validate(None).map_err(|e| e.to_string())?;
    Ok(exp)
}

/// The control address from `--peer` (HOST, HOST:PORT, an IPv6 address with or without a
/// port; `default_host` when there is none) and `--port` for a host without one.
pub fn control_addr(
    peer: Option<&str>,
    port: u16,
    default_host: &str,
) -> Result<SocketAddr, String> {
    let text = peer.unwrap_or(default_host);
    if text.trim().is_empty() {
        return Err("--peer ``: give HOST or HOST:PORT".into());
    }
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let with_port = if text.contains(':') {
        text.to_string()
    } else {
        format!("{text}:{port}")
    };
    // Malformed text is refused here, before it reaches the resolver.
    check_host_port(&with_port).map_err(|e| format!("--peer: {e}"))?;
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve --peer `{text}`: {e}"))?
        .next()
        .ok_or_else(|| format!("--peer `{text}` resolves to no address"))
}

/// Checks a `HOST:PORT` string before any lookup: an IP address (IPv6 in brackets) with a
/// port, or a host name of letters, digits, `-` and `.` (labels of 1..=63, 253 bytes in all) and
/// a port 1..=65535. The error says what is wrong, without echoing control characters.
pub fn check_host_port(addr: &str) -> Result<(), String> {
    tcpx_model::Peer::parse_host_port(addr)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_host_port_strings_are_refused_before_any_lookup() {
        // `tcpx_model::Peer::parse_host_port` decides (its vocabulary test walks the malformed
        // forms); here: the flag check is that parser, a port required.
        for good in ["127.0.0.1:5310", "[::1]:5310", "node-a.example:65535"] {
            assert!(check_host_port(good).is_ok(), "{good}");
        }
        for bad in ["127.0.0.1:99999", "host", "a b:1"] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
        // --peer: an IP without a port takes the default; the malformed ones never resolve.
        assert_eq!(
            control_addr(Some("127.0.0.1"), 7, "").unwrap().to_string(),
            "127.0.0.1:7"
        );
        assert_eq!(
            control_addr(Some("::1"), 7, "").unwrap().to_string(),
            "[::1]:7"
        );
        for bad in ["::::", "127.0.0.1:99999", "a b"] {
            let e = control_addr(Some(bad), 7, "").unwrap_err();
            assert!(e.starts_with("--peer: "), "{bad}: {e}");
        }
    }

    #[test]
    fn counts_are_whole_non_negative_and_fit_u32() {
        assert_eq!(count("iters", " 7 ").unwrap(), 7);
        assert_eq!(count("iters", "4294967295").unwrap(), u32::MAX);
        for bad in [
            "4294967296",
            "-1",
            "1e3",
            "",
            "x",
            "NaN",
            "99999999999999999999999999999999999999999",
        ] {
            let e = count("iters", bad).unwrap_err();
            assert!(e.contains("--iters"), "{bad}: {e}");
        }
    }

    #[test]
    fn seconds_are_finite_positive_and_bounded() {
        assert_eq!(seconds("timeout", "2.5", 10.0).unwrap(), 2.5);
        for bad in ["0", "-1", "NaN", "inf", "1e20", "11", "", "x"] {
            let e = seconds("timeout", bad, 10.0).unwrap_err();
            assert!(e.contains("--timeout"), "{bad}: {e}");
        }
    }

    fn flags() -> ExperimentFlags {
        ExperimentFlags::default().with(Knob::Sizes, "1M..4M")
    }

    #[test]
    fn flags_become_an_experiment_and_a_bad_one_is_named() {
        let mut f = flags().with(Knob::Chunk, "512K");
        f.0.insert(Knob::Env, vec!["NCCL_X=1".into()]);
        let e = f.experiment().unwrap();
        assert_eq!(e.sizes, [1 << 20, 2 << 20, 4 << 20]);
        assert_eq!(e.chunk, Some(512 << 10));
        assert_eq!(e.env.get("NCCL_X").map(String::as_str), Some("1"));
        e.validate(None).unwrap();
        f.0.insert(Knob::Env, vec!["=1".into()]);
        assert_eq!(
            f.experiment().unwrap_err(),
            "--env `=1`: write it as KEY=VALUE"
        );
        let f = flags().with(Knob::Window, "-2");
        assert_eq!(
            f.experiment().unwrap_err(),
            "--window is -2: it must not be negative"
        );
        let f = flags().with(Knob::TimeoutS, "0");
        assert!(f.experiment().unwrap_err().starts_with("--timeout"));
    }

    #[test]
    fn experiments_as_json_round_trip_and_garbage_is_refused() {
        let e = flags().experiment().unwrap();
        let back = experiment_from_json(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back.sizes, e.sizes);
        assert!(experiment_from_json("{}")
            .unwrap_err()
            .starts_with("--experiment-json is not an experiment"));
    }

    #[test]
    fn control_addresses_take_the_port_when_none_is_given() {
        assert_eq!(
            control_addr(None, 5299, "127.0.0.1").unwrap(),
            "127.0.0.1:5299".parse().unwrap()
        );
        assert_eq!(
            control_addr(Some("127.0.0.2:7"), 5299, "").unwrap(),
            "127.0.0.2:7".parse().unwrap()
        );
        assert_eq!(
            control_addr(Some("::1"), 9, "").unwrap(),
            "[::1]:9".parse().unwrap()
        );
        assert!(control_addr(Some(""), 9, "")
            .unwrap_err()
            .contains("--peer ``"));
    }
}
