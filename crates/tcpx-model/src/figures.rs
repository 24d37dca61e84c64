//! What one side measured for one message size, in the units nccl-tests prints.

use serde::{Deserialize, Serialize};

/// One side's figures for one message size (nccl-tests units; GB/s = 1e9 bytes/s): what a
/// benchmark side summarises and what a report records, so both speak one type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideFigures {
    pub avg_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// Wrong bytes seen by the receiver when verifying; `None` when not checked.
    pub wrong_bytes: Option<u64>,
    /// Each timed iteration's time in microseconds (a side may thin them evenly), for
    /// percentiles over all repetitions of a configuration; empty where not kept (the node rows
    /// of a multi-process run, whose processes are not in lockstep).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iter_us: Vec<f64>,
}

impl SideFigures {
    /// The CSV columns of the figures a results file shows, in order (`iter_us` is not one).
    pub const CSV_COLUMNS: [&'static str; 8] = [
        "avg_us",
        "p50_us",
        "p99_us",
        "min_us",
        "max_us",
        "algbw_gbs",
        "busbw_gbs",
        "wrong_bytes",
    ];

    /// The cell of figure `column` (one of [`Self::CSV_COLUMNS`]): times to 3 decimals, GB/s to
    /// 4, wrong bytes empty where not checked; `None` for any other column.
    pub fn csv_cell(&self, column: &str) -> Option<String> {
        Some(match column {
            "avg_us" => format!("{:.3}", self.avg_us),
            "p50_us" => format!("{:.3}", self.p50_us),
            "p99_us" => format!("{:.3}", self.p99_us),
            "min_us" => format!("{:.3}", self.min_us),
            "max_us" => format!("{:.3}", self.max_us),
            "algbw_gbs" => format!("{:.4}", self.algbw_gbs),
            "busbw_gbs" => format!("{:.4}", self.busbw_gbs),
            "wrong_bytes" => self.wrong_bytes.map_or_else(String::new, |w| w.to_string()),
            _ => return None,
        })
    }
}

/// The fastest link any figure may claim, in bytes per second: 10 TB/s. Generous on purpose
/// (an H200's NVLink moves about 0.9 TB/s, eight 400 Gb/s NICs 0.4 TB/s): a figure beyond it is
/// no fast machine but a peer's error or lie, and is refused wherever figures cross a process
/// or host boundary.
pub const FASTEST_BYTES_PER_S: f64 = 1e13;
/// The longest time one figure may claim, in seconds (a week): every wait of a run ends long
/// before, and a time beyond it turns into infinity or overflows once scaled.
pub const LONGEST_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// Checks `secs` as the time `bytes` took: finite, positive, at most [`LONGEST_SECONDS`] and
/// not below what the bytes need at [`FASTEST_BYTES_PER_S`]. The error names `what` and the
/// value.
pub fn check_time(what: &str, secs: f64, bytes: u64) -> Result<(), String> {
    let floor = bytes as f64 / FASTEST_BYTES_PER_S;
    if !secs.is_finite() || secs <= 0.0 || secs > LONGEST_SECONDS {
        return Err(format!(
            "{what} {secs:e} s is not a time (finite, positive, at most {LONGEST_SECONDS} s)"
        ));
    }
    if secs < floor {
        return Err(format!(
            "{what} {secs:e} s for {bytes} B is faster than any link ({} TB/s)",
            FASTEST_BYTES_PER_S / 1e12
        ));
    }
    Ok(())
}

/// Checks a rate in GB/s: finite, not negative, not beyond [`FASTEST_BYTES_PER_S`].
pub fn check_gbs(what: &str, gbs: f64) -> Result<(), String> {
    if !gbs.is_finite() || gbs < 0.0 || gbs * 1e9 > FASTEST_BYTES_PER_S {
        return Err(format!(
            "{what} {gbs:e} GB/s is not a rate any link has (0 to {} GB/s)",
            FASTEST_BYTES_PER_S / 1e9
        ));
    }
    Ok(())
}

impl SideFigures {
    /// Checks the figures of a side that moved `bytes` per iteration (all its flows): every
    /// time a [`check_time`] of those bytes, every rate a [`check_gbs`], the order of the
    /// percentiles kept. The one check of a side's figures wherever they cross a boundary (the
    /// bench control connection, flow processes, the report).
    pub fn check(&self, bytes: u64) -> Result<(), String> {
        for (what, us) in [
            ("avg_us", self.avg_us),
            ("p50_us", self.p50_us),
            ("p99_us", self.p99_us),
            ("min_us", self.min_us),
            ("max_us", self.max_us),
        ] {
            check_time(what, us / 1e6, bytes)?;
        }
        check_gbs("algbw", self.algbw_gbs)?;
        check_gbs("busbw", self.busbw_gbs)?;
        if !(self.min_us <= self.p50_us && self.p50_us <= self.p99_us && self.p99_us <= self.max_us)
        {
            return Err(format!(
                "the times are out of order (min {} <= p50 {} <= p99 {} <= max {} us)",
                self.min_us, self.p50_us, self.p99_us, self.max_us
            ));
        }
        for (i, us) in self.iter_us.iter().enumerate() {
            check_time(&format!("iteration {i}"), us / 1e6, bytes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(us: f64, gbs: f64) -> SideFigures {
        SideFigures {
            avg_us: us,
            p50_us: us,
            p99_us: us,
            min_us: us,
            max_us: us,
            algbw_gbs: gbs,
            busbw_gbs: gbs,
            wrong_bytes: Some(0),
            iter_us: vec![us],
        }
    }

    /// Issue 43 item 4: what a relay wrote into a peer's timings (1e308, -0.5 and 1e-300 s,
    /// NaN, infinity, 1e294 GB/s, -5 GB/s) is refused; a real run's figures pass.
    #[test]
    fn impossible_figures_are_refused_and_real_ones_pass() {
        let mib = 1 << 20;
        assert_eq!(figures(100.0, 10.49).check(mib), Ok(()));
        for us in [
            1e308 * 1e6,
            -0.5e6,
            1e-300 * 1e6,
            f64::NAN,
            f64::INFINITY,
            0.0,
        ] {
            assert!(figures(us, 1.0).check(mib).is_err(), "{us}");
        }
        // 1 MiB in 0.01 us would be 100 TB/s.
        let e = figures(0.01, 1.0).check(mib).unwrap_err();
        assert!(e.contains("faster than any link"), "{e}");
        for gbs in [1.05e294, -5.0, f64::NAN, 1e5] {
            assert!(figures(100.0, gbs).check(mib).is_err(), "{gbs}");
        }
        let mut f = figures(100.0, 10.0);
        f.min_us = 200.0;
        assert!(f.check(mib).unwrap_err().contains("out of order"));
        f = figures(100.0, 10.0);
        f.iter_us.push(-1.0);
        assert!(f.check(mib).unwrap_err().contains("iteration 1"));
    }

    #[test]
    fn every_csv_column_has_a_cell_and_nothing_else_does() {
        let f = SideFigures {
            avg_us: 1.0,
            p50_us: 2.0,
            p99_us: 3.0,
            min_us: 0.5,
            max_us: 4.0,
            algbw_gbs: 1.25,
            busbw_gbs: 1.25,
            wrong_bytes: None,
            iter_us: vec![],
        };
        let cells: Vec<String> = SideFigures::CSV_COLUMNS
            .iter()
            .map(|c| f.csv_cell(c).unwrap())
            .collect();
        assert_eq!(
            cells,
            ["1.000", "2.000", "3.000", "0.500", "4.000", "1.2500", "1.2500", ""]
        );
        assert_eq!(f.csv_cell("iter_us"), None);
    }
}
