//! Parsers for numeric command-line values, shared by the subcommands: each checks the range
//! the value will be used in (a `Duration`, a syscall's C type) and names the flag when it
//! refuses, so a bad value is an exit-2 usage error, never a panic or a silent truncation.

use anyhow::{anyhow, bail, Result};

/// A whole number for flag `--name`, at least 0, that fits a `u32`.
pub fn count(name: &str, text: &str) -> Result<u32> {
    let t = text.trim();
    let v: i128 = t
        .parse()
        .map_err(|_| anyhow!("--{name} `{text}` is not a whole number"))?;
    if v < 0 {
        bail!("--{name} is {v}: it must not be negative");
    }
    u32::try_from(v).map_err(|_| anyhow!("--{name} {v} is too large (at most {})", u32::MAX))
}

/// A number of seconds for flag `--name`: finite, more than 0 and at most `max`.
pub fn seconds(name: &str, text: &str, max: f64) -> Result<f64> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| anyhow!("--{name} `{text}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        bail!("--{name} `{text}`: give a positive number of seconds");
    }
    if v > max {
        bail!("--{name} {text} s is more than the {max} s this tool accepts");
    }
    Ok(v)
}

/// clap value parser for `--budget`: seconds, 0 or more (finite).
pub fn budget_seconds(text: &str) -> std::result::Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{text}`: give 0 or more seconds"));
    }
    Ok(v)
}

/// Longest wait a whole-seconds flag accepts (a week): `Instant::now() + wait` must not overflow.
pub const MAX_WAIT_S: u64 = 7 * 86_400;

/// clap value parser for whole-second waits: 1..=[`MAX_WAIT_S`].
pub fn wait_seconds(text: &str) -> std::result::Result<u64, String> {
    let v: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of seconds"))?;
    if !(1..=MAX_WAIT_S).contains(&v) {
        return Err(format!(
            "{v} s: give 1..={MAX_WAIT_S} seconds (a week at most)"
        ));
    }
    Ok(v)
}

/// Most cores per NUMA node a binding rule may name.
pub const MAX_RULE_CORES: usize = 4096;

/// clap value parser for core counts of a binding rule: 0..=[`MAX_RULE_CORES`].
pub fn rule_cores(text: &str) -> std::result::Result<usize, String> {
    let v: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of cores"))?;
    if v > MAX_RULE_CORES {
        return Err(format!("{v} cores: give 0..={MAX_RULE_CORES}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let e = count("iters", bad).unwrap_err().to_string();
            assert!(e.contains("--iters"), "{bad}: {e}");
        }
    }

    #[test]
    fn seconds_are_finite_positive_and_bounded() {
        assert_eq!(seconds("timeout", "2.5", 10.0).unwrap(), 2.5);
        for bad in ["0", "-1", "NaN", "inf", "1e20", "11", "", "x"] {
            let e = seconds("timeout", bad, 10.0).unwrap_err().to_string();
            assert!(e.contains("--timeout"), "{bad}: {e}");
        }
        assert_eq!(budget_seconds("0").unwrap(), 0.0);
        assert!(budget_seconds("-5").unwrap_err().contains("0 or more"));
        assert!(budget_seconds("NaN").is_err());
    }

    #[test]
    fn waits_and_rule_cores_are_bounded() {
        assert_eq!(wait_seconds("300").unwrap(), 300);
        for bad in ["0", "-1", "18446744073709551615", "604801", "x", ""] {
            assert!(wait_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(rule_cores("0").unwrap(), 0);
        assert!(rule_cores("18446744073709551615").is_err());
        assert!(rule_cores("-1").is_err());
    }
}
