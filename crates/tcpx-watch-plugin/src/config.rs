//! The shim's settings, read once from the environment at `init`. Each value is bounded; a value
//! that does not parse is named in a warning and its default used, so a typo in a monitoring
//! variable never stops a job.

use std::path::PathBuf;

/// Where the shim writes and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `TCPX_WATCH_INNER`: the real plugin, as NCCL_NET_PLUGIN would name it (`None`: NCCL's
    /// default name, `libnccl-net.so`).
    pub inner: Option<String>,
    /// `TCPX_WATCH_DIR`: where the JSON lines go; `None`: the shim only passes calls through.
    pub dir: Option<PathBuf>,
    /// `TCPX_WATCH_INTERVAL_MS`, 100..=60000 (default 1000).
    pub interval_ms: u64,
    /// `TCPX_WATCH_MAX_MB` (default 64, 0.01..=4096, fractions allowed) in bytes: the bound on one
    /// process's file and its one rotated predecessor together.
    pub max_bytes: u64,
    /// `TCPX_WATCH_PROM`: a Prometheus textfile path, or a directory to hold
    /// `tcpx-watch-<pid>.prom`.
    pub prom: Option<PathBuf>,
}

pub const INTERVAL_MS_DEFAULT: u64 = 1000;
pub const INTERVAL_MS_RANGE: (u64, u64) = (100, 60_000);
pub const MAX_MB_DEFAULT: f64 = 64.0;
pub const MAX_MB_RANGE: (f64, f64) = (0.01, 4096.0);

impl Config {
    /// Reads the settings through `get` (the process environment in the plugin, a map in tests);
    /// every problem is returned as a sentence for NCCL's log, the setting falling back.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut warnings = Vec::new();
        let nonempty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let interval_ms = match nonempty("TCPX_WATCH_INTERVAL_MS") {
            None => INTERVAL_MS_DEFAULT,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) => {
                    let c = n.clamp(INTERVAL_MS_RANGE.0, INTERVAL_MS_RANGE.1);
                    if c != n {
                        warnings.push(format!(
                            "TCPX_WATCH_INTERVAL_MS={n} is outside {}..={}: using {c}",
                            INTERVAL_MS_RANGE.0, INTERVAL_MS_RANGE.1
                        ));
                    }
                    c
                }
                Err(_) => {
                    warnings.push(format!(
                        "TCPX_WATCH_INTERVAL_MS={v:?} is not a whole number of milliseconds: \
                         using {INTERVAL_MS_DEFAULT}"
                    ));
                    INTERVAL_MS_DEFAULT
                }
            },
        };
        let max_mb = match nonempty("TCPX_WATCH_MAX_MB") {
            None => MAX_MB_DEFAULT,
            Some(v) => match v.trim().parse::<f64>() {
                Ok(n) if n.is_finite() => {
                    let c = n.clamp(MAX_MB_RANGE.0, MAX_MB_RANGE.1);
                    if c != n {
                        warnings.push(format!(
                            "TCPX_WATCH_MAX_MB={n} is outside {}..={}: using {c}",
                            MAX_MB_RANGE.0, MAX_MB_RANGE.1
                        ));
                    }
                    c
                }
                _ => {
                    warnings.push(format!(
                        "TCPX_WATCH_MAX_MB={v:?} is not a number of MB (1e6 bytes): using \
                         {MAX_MB_DEFAULT}"
                    ));
                    MAX_MB_DEFAULT
                }
            },
        };
        let config = Config {
            inner: nonempty("TCPX_WATCH_INNER"),
            dir: nonempty("TCPX_WATCH_DIR").map(PathBuf::from),
            interval_ms,
            max_bytes: (max_mb * 1e6) as u64,
            prom: nonempty("TCPX_WATCH_PROM").map(PathBuf::from),
        };
        if config.dir.is_none() && config.prom.is_some() {
            warnings.push(
                "TCPX_WATCH_PROM is set without TCPX_WATCH_DIR: nothing is recorded, the shim \
                 only passes calls through (set TCPX_WATCH_DIR too)"
                    .into(),
            );
        }
        (config, warnings)
    }

    /// Whether the shim records anything (otherwise it only passes calls through).
    pub fn records(&self) -> bool {
        self.dir.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_without_variables_pass_through_only() {
        let (c, w) = read(&[]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.inner, None);
        assert!(!c.records());
        assert_eq!(c.interval_ms, 1000);
        assert_eq!(c.max_bytes, 64_000_000);
    }

    #[test]
    fn values_are_bounded_and_bad_ones_named() {
        let (c, w) = read(&[
            ("TCPX_WATCH_DIR", "/tmp/w"),
            ("TCPX_WATCH_INTERVAL_MS", "5"),
            ("TCPX_WATCH_MAX_MB", "1e9"),
            ("TCPX_WATCH_INNER", "gpudirecttcpx"),
        ]);
        assert!(c.records());
        assert_eq!(c.interval_ms, 100);
        assert_eq!(c.max_bytes, 4_096_000_000);
        assert_eq!(c.inner.as_deref(), Some("gpudirecttcpx"));
        assert_eq!(w.len(), 2, "{w:?}");
        let (c, w) = read(&[
            ("TCPX_WATCH_INTERVAL_MS", "fast"),
            ("TCPX_WATCH_MAX_MB", "NaN"),
            ("TCPX_WATCH_PROM", "/tmp/x.prom"),
        ]);
        assert_eq!((c.interval_ms, c.max_bytes), (1000, 64_000_000));
        assert!(w.iter().any(|l| l.contains("\"fast\"")), "{w:?}");
        assert!(w.iter().any(|l| l.contains("\"NaN\"")), "{w:?}");
        assert!(
            w.iter().any(|l| l.contains("without TCPX_WATCH_DIR")),
            "{w:?}"
        );
        let (c, _) = read(&[("TCPX_WATCH_MAX_MB", "0.02")]);
        assert_eq!(c.max_bytes, 20_000);
    }
}
