//! What one plan run produced, as plain data (serde), independent of how it is written out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One side's figures for one message size (nccl-tests units; GB/s = 1e9 bytes/s).
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
}

/// One flow's (one GPU's) share of a result: each side's GB/s for that flow alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowFigures {
    pub flow: u32,
    pub send_gbs: f64,
    pub recv_gbs: f64,
    /// Wrong bytes this flow's receiver saw, where counted per flow (multi-process children).
    pub wrong_bytes: Option<u64>,
    /// The leader's process that carried this flow, in a multi-process run.
    #[serde(default)]
    pub pid: Option<u32>,
}

/// What became of one experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Measured.
    Ok,
    /// Not run, for a reason that is not an error (e.g. a backend limit); `reason` says which.
    Skipped,
    /// Started and failed; `reason` holds the error.
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skipped => "skipped",
            Status::Failed => "failed",
        }
    }
}

/// One experiment at one message size (or, when it did not run, the experiment alone), with
/// every knob it was asked to run with and every figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    pub phase: String,
    /// Experiment name (unique within a run).
    pub experiment: String,
    /// Short configuration label for tables and bar charts, e.g. `window=32`.
    pub label: String,
    /// Every knob as asked, by name (numbers, strings, booleans, arrays).
    pub knobs: BTreeMap<String, Value>,
    /// Knobs whose effect could not be applied on this machine, with the reason; knobs absent
    /// here were applied (or need no action).
    pub not_applied: BTreeMap<String, String>,
    pub status: Status,
    pub reason: Option<String>,
    pub size: Option<u64>,
    pub chunk: Option<u64>,
    pub send: Option<SideFigures>,
    pub recv: Option<SideFigures>,
    /// Seconds since the run started when this experiment started, and how long it took.
    pub started_s: f64,
    pub duration_s: f64,
    /// Per flow (per GPU), in flow order, when the runner knows them; `send`/`recv` are the
    /// node's figures (all flows together).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_flow: Vec<FlowFigures>,
    /// Which NIC each channel used, per side (`leader`, `follower`), as `flow 0: eth1,eth2; ...`;
    /// empty when the experiment named no NICs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nic_plan: BTreeMap<String, String>,
}

/// Metric names usable in criteria and charts, with what they mean.
pub const METRICS: &[(&str, &str)] = &[
    ("server_gbs", "receiver (server) algorithm bandwidth, GB/s"),
    ("client_gbs", "sender (client) algorithm bandwidth, GB/s"),
    (
        "server_gbs_per_flow",
        "server_gbs divided by flows: per GPU when a flow is a GPU",
    ),
    ("client_gbs_per_flow", "client_gbs divided by flows"),
    ("recv_gbs", "same as server_gbs"),
    ("send_gbs", "same as client_gbs"),
    (
        "busbw_gbs",
        "receiver bus bandwidth, GB/s (equals algbw for point-to-point)",
    ),
    (
        "avg_us",
        "receiver average time per iteration, microseconds",
    ),
    ("p50_us", "receiver median time per iteration, microseconds"),
    (
        "p99_us",
        "receiver 99th percentile time per iteration, microseconds",
    ),
    (
        "send_p50_us",
        "sender median time per iteration, microseconds",
    ),
    ("send_p99_us", "sender 99th percentile, microseconds"),
    (
        "wrong_bytes",
        "bytes that differed from the pattern (receiver)",
    ),
];

impl ResultRecord {
    /// The value of a metric named in [`METRICS`]; `None` when not measured or unknown.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let r = self.recv.as_ref();
        let s = self.send.as_ref();
        match name {
            "server_gbs" | "recv_gbs" => r.map(|f| f.algbw_gbs),
            "client_gbs" | "send_gbs" => s.map(|f| f.algbw_gbs),
            "server_gbs_per_flow" => r.map(|f| f.algbw_gbs / self.flows()),
            "client_gbs_per_flow" => s.map(|f| f.algbw_gbs / self.flows()),
            "busbw_gbs" => r.map(|f| f.busbw_gbs),
            "avg_us" => r.map(|f| f.avg_us),
            "p50_us" => r.map(|f| f.p50_us),
            "p99_us" => r.map(|f| f.p99_us),
            "send_p50_us" => s.map(|f| f.p50_us),
            "send_p99_us" => s.map(|f| f.p99_us),
            "wrong_bytes" => r.and_then(|f| f.wrong_bytes).map(|w| w as f64),
            _ => None,
        }
    }

    /// The `flows` knob (1 when absent).
    pub fn flows(&self) -> f64 {
        self.knobs
            .get("flows")
            .and_then(Value::as_f64)
            .filter(|f| *f >= 1.0)
            .unwrap_or(1.0)
    }

    /// A knob as display text (`-` when absent or null).
    pub fn knob_text(&self, name: &str) -> String {
        match self.knobs.get(name) {
            None | Some(Value::Null) => "-".into(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }
    }
}

/// A pass/fail verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// Could not be judged (the experiment it needs did not run here); does not fail the run,
    /// and the report says why.
    NotEvaluated,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotEvaluated => "N/A",
        }
    }
}

/// One criterion and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionResult {
    pub phase: String,
    /// As written in the plan, e.g. `server > 3.5 GB/s`.
    pub text: String,
    pub verdict: Verdict,
    /// The measured value and the threshold it was held against, when numeric.
    pub actual: Option<f64>,
    pub threshold: Option<f64>,
    /// Which experiment it was judged on, or why it could not be judged.
    pub detail: String,
}

/// One decision point and the branch taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub phase: String,
    /// Short name, e.g. `Decision Point 1`.
    pub name: String,
    pub question: String,
    /// The answer (`None`: could not be answered here, the `no` branch was taken).
    pub answer: Option<bool>,
    pub branch_taken: String,
    pub branch_not_taken: String,
    pub detail: String,
}

/// Chart shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChartKind {
    /// One bar per configuration (label).
    Bar,
    /// A line over a numeric knob (`x`), one line per value of `series` when given.
    Line,
    /// A grid over two knobs (`x`, `y`), coloured by the metric.
    Heatmap,
}

/// A chart declared by the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChartSpec {
    /// File stem under charts/.
    pub id: String,
    pub title: String,
    pub kind: ChartKind,
    /// Metric from [`METRICS`].
    pub metric: String,
    /// Knob on the x axis (line, heatmap); bar charts use the labels.
    pub x: Option<String>,
    /// Knob on the y axis (heatmap).
    pub y: Option<String>,
    /// Knob that splits lines (line).
    pub series: Option<String>,
    /// Experiments to draw (names); empty = all of `phase`.
    pub experiments: Vec<String>,
    pub phase: Option<String>,
}

/// A phase of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseInfo {
    pub name: String,
    pub description: String,
}

/// One sampler value (CPU, IRQ, NIC counters) taken during an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub experiment: String,
    pub t_s: f64,
    pub source: String,
    pub subject: String,
    pub metric: String,
    pub value: f64,
}

/// Whether the run got to its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "error")]
pub enum Completion {
    Complete,
    /// Stopped early (peer lost, script error, interrupted): the error, results so far kept.
    Incomplete(String),
}

/// Everything one plan run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Plan name (file stem) and the path it was read from.
    pub plan: String,
    pub plan_path: String,
    /// `20261122T111500Z`, also the directory prefix.
    pub stamp: String,
    pub started_utc: String,
    pub finished_utc: String,
    /// Detected or chosen platform and the target set used.
    pub platform: String,
    pub targets: String,
    /// Leader and follower addresses, the transport(s) used.
    pub setup: BTreeMap<String, String>,
    pub phases: Vec<PhaseInfo>,
    pub records: Vec<ResultRecord>,
    pub samples: Vec<SampleRecord>,
    pub criteria: Vec<CriterionResult>,
    pub decisions: Vec<DecisionRecord>,
    pub charts: Vec<ChartSpec>,
    /// Messages from the plan (`note(...)`) and the runner.
    pub notes: Vec<String>,
    pub completion: Completion,
}

impl RunReport {
    /// 0: complete and no criterion failed; 1: complete, some criterion failed; 2: incomplete.
    pub fn exit_code(&self) -> u8 {
        if matches!(self.completion, Completion::Incomplete(_)) {
            2
        } else if self.criteria.iter().any(|c| c.verdict == Verdict::Fail) {
            1
        } else {
            0
        }
    }

    /// One line: `PASS` / `FAIL (n of m criteria failed)` / `INCOMPLETE: error`.
    pub fn verdict_line(&self) -> String {
        let failed = self
            .criteria
            .iter()
            .filter(|c| c.verdict == Verdict::Fail)
            .count();
        let na = self
            .criteria
            .iter()
            .filter(|c| c.verdict == Verdict::NotEvaluated)
            .count();
        let na_text = if na > 0 {
            format!(", {na} not evaluated here")
        } else {
            String::new()
        };
        match &self.completion {
            Completion::Incomplete(e) => format!("INCOMPLETE: {e}"),
            Completion::Complete if failed > 0 => format!(
                "FAIL ({failed} of {} criteria failed{na_text})",
                self.criteria.len()
            ),
            Completion::Complete => {
                format!("PASS ({} criteria{na_text})", self.criteria.len())
            }
        }
    }

    /// Records of `spec`'s experiments (or its phase), largest size per experiment, in run
    /// order; the figures charts and criteria use.
    pub fn chart_records(&self, spec: &ChartSpec) -> Vec<&ResultRecord> {
        let wanted = |r: &ResultRecord| {
            if !spec.experiments.is_empty() {
                spec.experiments.iter().any(|e| e == &r.experiment)
            } else if let Some(p) = &spec.phase {
                &r.phase == p
            } else {
                true
            }
        };
        largest_per_experiment(self.records.iter().filter(|r| wanted(r)))
    }

    /// Names of all knobs used by any record, sorted.
    pub fn knob_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .records
            .iter()
            .flat_map(|r| r.knobs.keys().cloned())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// Keeps, per experiment, the record of its largest size (or its only record), in first-seen
/// order.
pub fn largest_per_experiment<'a>(
    records: impl Iterator<Item = &'a ResultRecord>,
) -> Vec<&'a ResultRecord> {
    let mut order: Vec<&str> = Vec::new();
    let mut best: BTreeMap<&str, &ResultRecord> = BTreeMap::new();
    for r in records {
        match best.get(r.experiment.as_str()) {
            None => {
                order.push(&r.experiment);
                best.insert(&r.experiment, r);
            }
            Some(prev) if r.size.unwrap_or(0) > prev.size.unwrap_or(0) => {
                best.insert(&r.experiment, r);
            }
            Some(_) => {}
        }
    }
    order
        .into_iter()
        .filter_map(|n| best.get(n).copied())
        .collect()
}
