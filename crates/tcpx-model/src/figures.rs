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

#[cfg(test)]
mod tests {
    use super::*;

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
