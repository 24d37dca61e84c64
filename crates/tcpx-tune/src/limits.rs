//! What a tune may spend and measure, from the text its caller was given: each value checked
//! against its range, each error naming the flag to fix.

use tcpx_plan::search::{Budget, MAX_POINTS};

/// The most minutes a tune may take (a day).
pub const MAX_MINUTES: f64 = 24.0 * 60.0;

/// The search's budget: `minutes` in (0, a day], `points` 2 to [`MAX_POINTS`]; and the point
/// measurement's own limits: `iters` 1 to 10000, `warmup` at most 10000, `point_timeout` 5 to
/// 3600 seconds.
pub fn budget(
    minutes: f64,
    points: usize,
    iters: u32,
    warmup: u32,
    point_timeout: u64,
) -> Result<Budget, String> {
    if !(minutes.is_finite() && minutes > 0.0 && minutes <= MAX_MINUTES) {
        return Err(format!(
            "--minutes {minutes}: give more than 0 and at most 1440"
        ));
    }
    if !(2..=MAX_POINTS).contains(&points) {
        return Err(format!("--points {points}: give 2 to {MAX_POINTS}"));
    }
    if iters == 0 || iters > 10_000 || warmup > 10_000 {
        return Err("--iters must be 1 to 10000 and --warmup at most 10000".into());
    }
    if !(5..=3600).contains(&point_timeout) {
        return Err(format!(
            "--point-timeout {point_timeout}: give 5 to 3600 seconds"
        ));
    }
    Ok(Budget {
        points,
        seconds: minutes * 60.0,
    })
}

/// The message sizes a point measures: at least one, none of 0 bytes.
pub fn sizes(text: &str) -> Result<Vec<u64>, String> {
    let sizes = tcpx_model::parse_sizes(text).map_err(|e| format!("--size: {e}"))?;
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(format!("--size `{text}`: give sizes of 1 byte or more"));
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_is_held_to_its_range_naming_its_flag() {
        let b = budget(2.0, 40, 20, 5, 120).unwrap();
        assert_eq!((b.points, b.seconds), (40, 120.0));
        for (m, p, i, w, t, says) in [
            (0.0, 40, 20, 5, 120, "--minutes 0"),
            (f64::NAN, 40, 20, 5, 120, "--minutes NaN"),
            (1441.0, 40, 20, 5, 120, "--minutes"),
            (2.0, 1, 20, 5, 120, "--points 1"),
            (2.0, MAX_POINTS + 1, 20, 5, 120, "--points"),
            (2.0, 40, 0, 5, 120, "--iters"),
            (2.0, 40, 20, 10_001, 120, "--warmup"),
            (2.0, 40, 20, 5, 4, "--point-timeout 4"),
        ] {
            let e = budget(m, p, i, w, t).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        assert_eq!(sizes("1M,4M").unwrap(), [1 << 20, 4 << 20]);
        assert!(sizes("0").unwrap_err().contains("1 byte or more"));
        assert!(sizes("lots").unwrap_err().starts_with("--size: "));
    }
}
