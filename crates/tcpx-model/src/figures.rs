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
