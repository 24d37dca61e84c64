//! What a flow process tells its parent: one JSON document ([`ChildReport`]) written to the path
//! the parent gave it, read back once the process ended. Results and errors cross the process
//! boundary typed; the parent never reads a child's human-readable output to decide anything
//! (its stderr is only quoted in error messages).

use std::path::Path;

use serde::{Deserialize, Serialize};
use tcpx_bench::{BenchError, Experiment, Measurement};

/// Why a flow process failed, as far as the parent's decisions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildErrorKind {
    /// The experiment cannot run here (no GPU, a backend limit); nothing was started. A plan
    /// records it as skipped.
    Invalid,
    /// The two sides were started with different settings.
    Mismatch,
    /// The peer went away or asked to stop: a consequence of a failure elsewhere, not a cause.
    PeerGone,
    /// Anything else.
    Failed,
}

/// A flow process's error: its kind and its message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildError {
    pub kind: ChildErrorKind,
    pub message: String,
}

/// Everything a flow process reports to its parent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChildReport {
    /// One per message size, in order (empty when it failed).
    pub measurements: Vec<Measurement>,
    /// Which NICs its channels used (`flow 1: eth1,eth2`), when the experiment named NICs.
    pub nic_plan: Option<String>,
    /// Set when it failed.
    pub error: Option<ChildError>,
}

impl ChildError {
    /// The kind and message of a bench error.
    pub fn from_bench(e: &BenchError) -> ChildError {
        let kind = match e {
            BenchError::Invalid(_) => ChildErrorKind::Invalid,
            BenchError::Mismatch(_) => ChildErrorKind::Mismatch,
            BenchError::PeerGone(_) => ChildErrorKind::PeerGone,
            BenchError::Failed(_) => ChildErrorKind::Failed,
        };
        ChildError {
            kind,
            message: e.to_string(),
        }
    }
}

impl ChildReport {
    /// A report of a failure.
    pub fn failed(kind: ChildErrorKind, message: impl Into<String>) -> ChildReport {
        ChildReport {
            error: Some(ChildError {
                kind,
                message: message.into(),
            }),
            ..ChildReport::default()
        }
    }

    /// Writes the report to `path` (aside, then renamed, so the parent never reads half of it).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }

    /// Checks what the process reports against what it was asked (`asked`: its experiment), as
    /// figures from any other process are (issue 43 item 4): one measurement per asked size, in
    /// order and of that size; both sides' figures possible (`SideFigures::check` against one
    /// flow's bytes, since a flow process's times are its own flow's), and its per-flow rates
    /// too. A report of a failure has no figures to check.
    pub fn check(&self, asked: &Experiment) -> Result<(), String> {
        if self.error.is_some() {
            return Ok(());
        }
        if self.measurements.len() != asked.sizes.len() {
            return Err(format!(
                "{} measurements for the {} sizes asked",
                self.measurements.len(),
                asked.sizes.len()
            ));
        }
        for (m, &size) in self.measurements.iter().zip(&asked.sizes) {
            if m.size != size {
                return Err(format!(
                    "a measurement of {} B where {size} B were asked",
                    m.size
                ));
            }
            for s in [&m.send, &m.recv] {
                let side = s.side;
                s.figures()
                    .check(size)
                    .map_err(|e| format!("{side} side at {size} B: {e}"))?;
                for (f, &gbs) in s.flow_gbs.iter().enumerate() {
                    tcpx_model::check_gbs(&format!("{side} side at {size} B, flow {f}"), gbs)?;
                }
            }
        }
        Ok(())
    }

    /// Reads a report a process wrote to `path`; the error says what was wrong with it.
    pub fn read(path: &Path) -> Result<ChildReport, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err("it wrote no report (did it crash before the end?)".into())
            }
            Err(e) => return Err(format!("reading its report {}: {e}", path.display())),
        };
        serde_json::from_str(&text).map_err(|e| format!("its report is unreadable: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_round_trip_and_a_missing_one_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("flow0.json");
        assert!(ChildReport::read(&p)
            .unwrap_err()
            .contains("wrote no report"));
        let r = ChildReport {
            nic_plan: Some("flow 0: 127.0.0.2".into()),
            ..ChildReport::failed(ChildErrorKind::PeerGone, "peer closed")
        };
        r.write(&p).unwrap();
        let back = ChildReport::read(&p).unwrap();
        assert_eq!(back.error, r.error);
        assert_eq!(back.nic_plan, r.nic_plan);
        std::fs::write(&p, "{not json").unwrap();
        assert!(ChildReport::read(&p).unwrap_err().contains("unreadable"));
        let e = ChildError::from_bench(&BenchError::Invalid("no GPU".into()));
        assert_eq!(e.kind, ChildErrorKind::Invalid);
        assert!(e.message.contains("no GPU"));
    }
}
