//! clap value parsers for numeric command-line values, shared by the subcommands: each checks
//! the range the value will be used in (a `Duration`, a core count) so a bad value is an exit-2
//! usage error, never a panic or a silent truncation. `bench`'s values are checked by
//! `tcpx_bench::flags`, which names the flag.

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

/// clap value parser for `--max-operations`: 1 or more (0 would remove the guard against
/// endless loops).
pub fn max_operations(text: &str) -> std::result::Result<u64, String> {
    let v: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of operations"))?;
    if v == 0 {
        return Err(
            "0 would remove the guard against endless loops: give 1 or more (the default is 5000000)"
                .into(),
        );
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

/// clap value parser for `--cores-per-direction`: 1..=[`MAX_RULE_CORES`] (0 would give every
/// NIC empty bindings).
pub fn direction_cores(text: &str) -> std::result::Result<usize, String> {
    match rule_cores(text)? {
        0 => Err("0 cores would leave TX and RX without cores: give 1 or more".into()),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_zero_or_more_seconds() {
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
        assert!(direction_cores("0").unwrap_err().contains("1 or more"));
        assert_eq!(direction_cores("14").unwrap(), 14);
        assert!(max_operations("0").is_err());
        assert_eq!(max_operations("1").unwrap(), 1);
    }
}
