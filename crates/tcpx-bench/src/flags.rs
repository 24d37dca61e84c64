//! An experiment given as text (command-line flags, environment variables) checked into an
//! [`Experiment`], and the control address of a side: every refusal names its flag, so a bad
//! value is a usage error, never a panic or a silent truncation.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::{
    parse_size, parse_sizes, Backend, CpuSet, Experiment, Memory, NicPolicy, MAX_TIMEOUT_S,
};

/// A whole number for flag `--name`, at least 0, that fits a `u32`.
pub fn count(name: &str, text: &str) -> Result<u32, String> {
    let t = text.trim();
    let v: i128 = t
        .parse()
        .map_err(|_| format!("--{name} `{text}` is not a whole number"))?;
    if v < 0 {
        return Err(format!("--{name} is {v}: it must not be negative"));
    }
    u32::try_from(v).map_err(|_| format!("--{name} {v} is too large (at most {})", u32::MAX))
}

/// A number of seconds for flag `--name`: finite, more than 0 and at most `max`.
pub fn seconds(name: &str, text: &str, max: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("--{name} `{text}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "--{name} `{text}`: give a positive number of seconds"
        ));
    }
    if v > max {
        return Err(format!(
            "--{name} {text} s is more than the {max} s this tool accepts"
        ));
    }
    Ok(v)
}

/// A byte count for flag `--name` (K, M, G = powers of 1024).
pub fn size(name: &str, text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| format!("--{name}: {e}"))
}

/// A cpu list for flag `--name`; the error names the flag and the list.
pub fn cpus(name: &str, text: Option<&str>) -> Result<Option<CpuSet>, String> {
    text.map(|c| c.parse().map_err(|e| format!("--{name} `{c}`: {e}")))
        .transpose()
}

/// An experiment as `tcpx-run bench`'s flags give it, each value still text.
#[derive(Clone, Debug, Default)]
pub struct ExperimentFlags {
    pub name: String,
    pub transport: String,
    pub memory: String,
    /// `--size`: one size, a list or a doubling range.
    pub size: String,
    pub iters: String,
    pub warmup: String,
    pub flows: String,
    pub channels: String,
    pub socks_per_channel: String,
    pub chunk: Option<String>,
    pub window: String,
    pub verify: bool,
    pub sock_buf: Option<String>,
    pub zero_copy_min: Option<String>,
    pub timeout: String,
    pub send_cpus: Option<String>,
    pub recv_cpus: Option<String>,
    pub sample_ms: Option<String>,
    /// `KEY=VALUE` backend settings.
    pub env: Vec<String>,
    pub nics: Vec<String>,
    pub nic_policy: String,
    pub multi_process: bool,
}

impl ExperimentFlags {
    /// The experiment these flags describe, each value parsed and range-checked (the first bad
    /// one named); [`Experiment::validate`] is the caller's next step.
    pub fn experiment(&self) -> Result<Experiment, String> {
        let timeout = seconds("timeout", &self.timeout, MAX_TIMEOUT_S)?;
        let mut exp = Experiment {
            name: self.name.clone(),
            // The typed values are read after every number, in the order validation checks
            // them, so that the first bad flag named is the one it always was.
            transport: Backend::default(),
            memory: Memory::default(),
            sizes: parse_sizes(&self.size).map_err(|e| format!("--size: {e}"))?,
            iters: count("iters", &self.iters)?,
            warmup: count("warmup", &self.warmup)?,
            flows: count("flows", &self.flows)?,
            channels: count("channels", &self.channels)?,
            socks_per_channel: count("socks-per-channel", &self.socks_per_channel)?,
            chunk: self
                .chunk
                .as_deref()
                .map(|c| size("chunk", c))
                .transpose()?,
            window: count("window", &self.window)?,
            verify: self.verify,
            sock_buf: self
                .sock_buf
                .as_deref()
                .map(|c| size("sock-buf", c))
                .transpose()?,
            zero_copy_min: self
                .zero_copy_min
                .as_deref()
                .map(|c| size("zero-copy-min", c))
                .transpose()?,
            timeout_s: timeout,
            send_cpus: None,
            recv_cpus: None,
            sample_ms: self
                .sample_ms
                .as_deref()
                .map(|m| count("sample-ms", m))
                .transpose()?,
            env: self
                .env
                .iter()
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                    _ => Err(format!("--env `{kv}`: write it as KEY=VALUE")),
                })
                .collect::<Result<_, String>>()?,
            nics: self.nics.iter().map(|n| n.trim().to_string()).collect(),
            nic_policy: NicPolicy::default(),
            multi_process: self.multi_process,
            flow_index: None,
        };
        exp.send_cpus = cpus("send-cpus", self.send_cpus.as_deref())?;
        exp.recv_cpus = cpus("recv-cpus", self.recv_cpus.as_deref())?;
        exp.nic_policy = self.nic_policy.parse().map_err(|e| format!("{e}"))?;
        exp.memory = self.memory.parse().map_err(|e| format!("{e}"))?;
        exp.transport = self.transport.parse().map_err(|e| format!("{e}"))?;
        Ok(exp)
    }
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
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let shown = addr.escape_debug().to_string();
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("`{shown}` has no port: give HOST:PORT"));
    };
    if host.contains(':') || host.starts_with('[') {
        return Err(format!(
            "`{shown}` is not an address: write IPv6 in brackets with a port ([::1]:5310)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => {
            return Err(format!(
                "`{shown}`: the port `{}` is not a number 1..=65535",
                port.escape_debug()
            ))
        }
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-'))
        && host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.')
        // Digits and dots that are no IPv4 address (`999.1.1.1`) are a typo, not a name.
        && !host.bytes().all(|c| c.is_ascii_digit() || c == b'.');
    if !name_ok {
        return Err(format!(
            "`{shown}` is not HOST:PORT: HOST must be an IP address or a host name of letters, digits, `-` and `.`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_host_port_strings_are_refused_before_any_lookup() {
        for good in [
            "127.0.0.1:5310",
            "[::1]:5310",
            "localhost:1",
            "node-a.example:65535",
        ] {
            assert!(check_host_port(good).is_ok(), "{good}");
        }
        for bad in [
            "::::",
            "127.0.0.1:99999",
            "127.0.0.1:80:0",
            "999.1.1.1:5",
            "a b:1",
            "host:",
            "host",
            ":5",
            "-a:5",
            "a..b:5",
            "h\n:5",
        ] {
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
        ExperimentFlags {
            name: "bench".into(),
            transport: "socket".into(),
            memory: "host".into(),
            size: "1M..4M".into(),
            iters: "20".into(),
            warmup: "5".into(),
            flows: "1".into(),
            channels: "2".into(),
            socks_per_channel: "4".into(),
            window: "16".into(),
            verify: true,
            timeout: "30".into(),
            nic_policy: "round-robin".into(),
            ..ExperimentFlags::default()
        }
    }

    #[test]
    fn flags_become_an_experiment_and_a_bad_one_is_named() {
        let mut f = flags();
        f.env = vec!["NCCL_X=1".into()];
        f.chunk = Some("512K".into());
        let e = f.experiment().unwrap();
        assert_eq!(e.sizes, [1 << 20, 2 << 20, 4 << 20]);
        assert_eq!(e.chunk, Some(512 << 10));
        assert_eq!(e.env.get("NCCL_X").map(String::as_str), Some("1"));
        e.validate(None).unwrap();
        f.env = vec!["=1".into()];
        assert_eq!(
            f.experiment().unwrap_err(),
            "--env `=1`: write it as KEY=VALUE"
        );
        let mut f = flags();
        f.window = "-2".into();
        assert_eq!(
            f.experiment().unwrap_err(),
            "--window is -2: it must not be negative"
        );
        let mut f = flags();
        f.timeout = "0".into();
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
