//! What one plan run produced, as plain data (serde), independent of how it is written out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tcpx_model::{Knob, NotApplied};

use crate::stats::FigureStats;

/// One side's figures for one message size, declared in tcpx-model so that tcpx-bench's
/// summaries convert to it without this crate depending on the benchmark.
pub use tcpx_model::SideFigures;

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
    /// Every knob as asked (numbers, strings, booleans, arrays), written as an object by knob
    /// name in name order. A record whose object names a knob this version does not have is
    /// refused when read (serde's `unknown variant` error names it), never read without it.
    pub knobs: KnobValues,
    /// Knobs whose effect could not be applied on this machine, with the reason; knobs absent
    /// here were applied (or need no action).
    pub not_applied: NotApplied,
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
    /// Which repetition of its experiment this is, from 1 (0: the runner's own record, before
    /// the plan engine numbered it).
    #[serde(default)]
    pub rep: u32,
}

/// A record's knobs and their values, keyed by knob: JSON and iteration by knob name
/// ([`Knob`]'s order), as the map keyed by name that it replaced.
pub type KnobValues = BTreeMap<Knob, Value>;

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

/// The NIC plan of each side on one line:
/// `leader: flow 0: 127.0.0.2,127.0.0.3 | follower: ...`.
pub fn nic_plan_text(r: &ResultRecord) -> String {
    r.nic_plan
        .iter()
        .map(|(side, plan)| format!("{side}: {plan}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

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
            .get(&Knob::Flows)
            .and_then(Value::as_f64)
            .filter(|f| *f >= 1.0)
            .unwrap_or(1.0)
    }

    /// A knob as display text (`-` when absent or null).
    pub fn knob_text(&self, knob: Knob) -> String {
        knob_text(&self.knobs, knob)
    }
}

/// Knob `knob` of `knobs` as display text: a string as it is, any other value as JSON, `-` when
/// absent or null.
fn knob_text(knobs: &KnobValues, knob: Knob) -> String {
    match knobs.get(&knob) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// A criterion's verdict: PASS and FAIL when the whole interval of the figure is on one side of
/// the threshold, INCONCLUSIVE when the interval straddles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The interval reaches both sides of the threshold: more repetitions (or less noise) are
    /// needed; does not fail the run.
    Inconclusive,
    /// Could not be judged (the experiment it needs did not run here); does not fail the run,
    /// and the report says why.
    NotEvaluated,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Inconclusive => "INCONCLUSIVE",
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
    /// The interval of the judged value (a metric's median, a gain), when it came from
    /// repetitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95_lo: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci95_hi: Option<f64>,
    /// Repetitions behind the value (the smaller side for a comparison).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    /// INCONCLUSIVE: about how many repetitions would likely settle it (`None`: the estimate
    /// sits on the threshold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reps_to_settle: Option<usize>,
    /// Every figure the value was computed from, by name (`server_gbs of pinned`), with each
    /// repetition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<NamedFigure>,
}

/// A figure a criterion used, with its repetitions and summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedFigure {
    pub name: String,
    #[serde(flatten)]
    pub stats: FigureStats,
}

impl CriterionResult {
    /// A criterion with a verdict and detail and no figures.
    pub fn plain(text: &str, verdict: Verdict, detail: String) -> CriterionResult {
        CriterionResult {
            phase: String::new(),
            text: text.into(),
            verdict,
            actual: None,
            threshold: None,
            detail,
            ci95_lo: None,
            ci95_hi: None,
            n: None,
            reps_to_settle: None,
            figures: Vec::new(),
        }
    }
}

/// What `best()` found among a set of configurations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    pub phase: String,
    pub metric: String,
    /// The configuration with the best median.
    pub best: String,
    /// Configurations whose interval reaches within noise of the best: not distinguishable.
    pub tied: Vec<String>,
    /// Configurations that are the same experiment as the best here (they differ only in knobs
    /// that were not applied).
    pub identical: Vec<String>,
    /// False when every configuration was the same experiment: nothing was ranked.
    pub ranked: bool,
    /// The noise level the ties were judged with.
    pub noise: f64,
    /// One sentence for the report.
    pub text: String,
    /// Labels of every configuration ranked (the best, tied, identical and the others): the
    /// knobs in which they differ are the knobs this ranking decided.
    #[serde(default)]
    pub candidates: Vec<String>,
    /// The interval the ties were judged with: its method and real level.
    #[serde(default)]
    pub method: String,
}

/// The noise level comparisons are judged with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseInfo {
    /// The target set's `noise_floor` (a stated minimum) or, when nothing was measured, its `noise`.
    pub floor: f64,
    /// Measured run-to-run spread of an A/A comparison, when the plan measured it.
    pub measured: Option<f64>,
    /// What comparisons use: the measured spread when the plan measured one (raised to the
    /// target set's `noise_floor` when that is larger and states a reason), else the target set's
    /// `noise`.
    pub used: f64,
    /// Which applied, in words (`measured`, `target set floor: <reason>`, `target set default`).
    #[serde(default)]
    pub source: String,
    pub detail: String,
    /// Experiment names of the A/A runs (never recommended as a configuration).
    #[serde(default)]
    pub runs: Vec<String>,
}

/// One configuration at one message size over all its repetitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub phase: String,
    pub experiment: String,
    pub label: String,
    pub size: Option<u64>,
    pub chunk: Option<u64>,
    /// `ok` when every repetition ran; else the first other status.
    pub status: Status,
    pub reason: Option<String>,
    /// Repetitions recorded and those that ran.
    pub reps: usize,
    pub n_ok: usize,
    pub knobs: KnobValues,
    pub not_applied: NotApplied,
    /// Each metric of [`METRICS`] measured in the repetitions that ran.
    pub figures: BTreeMap<String, FigureStats>,
    /// Iteration percentiles over every iteration of every repetition that ran
    /// (`p50_us`, `p99_us`, `send_p50_us`, `send_p99_us`), where each repetition kept its
    /// iteration times; [`Summary::metric`] prefers them to the median of per-repetition values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pooled: BTreeMap<String, f64>,
    /// How many iterations `pooled` was taken over, per side (`recv`, `send`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pooled_iterations: BTreeMap<String, usize>,
}

impl Summary {
    pub fn figure(&self, metric: &str) -> Option<&FigureStats> {
        self.figures.get(metric)
    }
    /// The figure a table shows for `metric`: an iteration percentile pooled over every
    /// repetition where there is one, else the median over the repetitions.
    pub fn metric(&self, metric: &str) -> Option<f64> {
        self.pooled
            .get(metric)
            .copied()
            .or_else(|| self.figure(metric).map(|f| f.median))
    }
    /// A knob as display text (`-` when absent or null).
    pub fn knob_text(&self, knob: Knob) -> String {
        knob_text(&self.knobs, knob)
    }
}

/// The repetitions of one configuration that ran, and the first that did not.
pub fn split_by_outcome<'a>(
    reps: &[&'a ResultRecord],
) -> (Vec<&'a ResultRecord>, Option<&'a ResultRecord>) {
    let ok = reps
        .iter()
        .copied()
        .filter(|r| r.status == Status::Ok)
        .collect();
    let other = reps.iter().copied().find(|r| r.status != Status::Ok);
    (ok, other)
}

/// Why repetition `r` (one of `reps`) did not run: its reason, naming the repetition when
/// there were several.
pub fn repetition_reason(r: &ResultRecord, reps: usize) -> Option<String> {
    r.reason.as_ref().map(|why| {
        if reps > 1 {
            format!("repetition {} of {reps}: {why}", r.rep)
        } else {
            why.clone()
        }
    })
}

/// Groups `records` by experiment and size (first-seen order) and summarises each group.
pub fn summarise<'a>(records: impl Iterator<Item = &'a ResultRecord>) -> Vec<Summary> {
    let mut groups: Vec<(String, Option<u64>, Vec<&ResultRecord>)> = Vec::new();
    for r in records {
        match groups
            .iter_mut()
            .find(|(e, s, _)| *e == r.experiment && *s == r.size)
        {
            Some(g) => g.2.push(r),
            None => groups.push((r.experiment.clone(), r.size, vec![r])),
        }
    }
    groups
        .into_iter()
        .map(|(experiment, size, rs)| {
            let first = rs[0];
            let (ok, other) = split_by_outcome(&rs);
            let mut figures = BTreeMap::new();
            for (m, _) in METRICS {
                let vals: Vec<f64> = ok.iter().filter_map(|r| r.metric(m)).collect();
                if vals.len() == ok.len() {
                    if let Some(f) = FigureStats::of(&vals) {
                        figures.insert((*m).to_string(), f);
                    }
                }
            }
            let (pooled, pooled_iterations) = pool_iterations(&ok);
            let mut not_applied = NotApplied::new();
            for r in &rs {
                for (k, v) in &r.not_applied {
                    not_applied.entry(*k).or_insert_with(|| v.clone());
                }
            }
            Summary {
                phase: first.phase.clone(),
                experiment,
                label: first.label.clone(),
                size,
                chunk: first.chunk,
                status: other.map_or(Status::Ok, |r| r.status),
                reason: other.and_then(|r| repetition_reason(r, rs.len())),
                reps: rs.len(),
                n_ok: ok.len(),
                knobs: first.knobs.clone(),
                not_applied,
                figures,
                pooled,
                pooled_iterations,
            }
        })
        .collect()
}

/// Nearest-rank percentile `p` (0..=100) of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Which side's figures of a record.
type PickSide = fn(&ResultRecord) -> Option<&SideFigures>;

/// p50 and p99 of each side (`p50_us`, `p99_us`, `send_p50_us`, `send_p99_us`) over the
/// iterations of all `ok` repetitions together, for the sides where every one of them kept its
/// iteration times; with how many iterations each side's were taken over (`recv`, `send`).
pub fn pool_iterations(ok: &[&ResultRecord]) -> (BTreeMap<String, f64>, BTreeMap<String, usize>) {
    let mut pooled = BTreeMap::new();
    let mut counts = BTreeMap::new();
    let sides: [(&str, &str, PickSide); 2] = [
        ("recv", "", |r| r.recv.as_ref()),
        ("send", "send_", |r| r.send.as_ref()),
    ];
    for (side, prefix, pick) in sides {
        if ok.is_empty()
            || !ok
                .iter()
                .all(|r| pick(r).is_some_and(|f| !f.iter_us.is_empty()))
        {
            continue;
        }
        let mut all: Vec<f64> = ok
            .iter()
            .filter_map(|r| pick(r))
            .flat_map(|f| f.iter_us.iter().copied())
            .filter(|t| t.is_finite())
            .collect();
        if all.is_empty() {
            continue;
        }
        all.sort_by(f64::total_cmp);
        pooled.insert(format!("{prefix}p50_us"), percentile(&all, 50.0));
        pooled.insert(format!("{prefix}p99_us"), percentile(&all, 99.0));
        counts.insert(side.to_string(), all.len());
    }
    (pooled, counts)
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "error")]
pub enum Completion {
    #[default]
    Complete,
    /// Stopped early (peer lost, script error, interrupted): the error, results so far kept.
    Incomplete(String),
}

/// Everything one plan run produced. The default is a complete run of nothing, for filling in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// What each `best()` found: the best configuration and those tied with it.
    #[serde(default)]
    pub rankings: Vec<Ranking>,
    /// The noise level comparisons were judged with.
    #[serde(default)]
    pub noise: Option<NoiseInfo>,
    /// Every sequential comparison: rounds it took and why it stopped.
    #[serde(default)]
    pub sequential: Vec<crate::sequential::SequentialRecord>,
    /// Each configuration and size over its repetitions (written by [`crate::write_run`]).
    #[serde(default)]
    pub summaries: Vec<Summary>,
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

    /// Experiment runs that measured something (status ok).
    pub fn measured(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.status == Status::Ok)
            .count()
    }

    /// True when the run completed without measuring anything (every experiment skipped or
    /// failed, or none asked for): its criteria judged nothing, so it is not a PASS.
    pub fn nothing_measured(&self) -> bool {
        matches!(self.completion, Completion::Complete) && self.measured() == 0
    }

    /// Whether any experiment ran over a net plugin (its backend, by its `transport` knob, says
    /// NCCL runs it as one).
    pub fn used_a_net_plugin(&self) -> bool {
        self.records.iter().any(|r| {
            r.knobs
                .get(&Knob::Transport)
                .and_then(|v| v.as_str())
                .and_then(|t| t.parse::<tcpx_model::Backend>().ok())
                .is_some_and(|b| b.capabilities().loads_a_net_plugin())
        })
    }

    /// One line: `PASS` / `FAIL (n of m criteria failed)` / `NOTHING MEASURED (...)` /
    /// `INCOMPLETE: error`.
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
        let open = self
            .criteria
            .iter()
            .filter(|c| c.verdict == Verdict::Inconclusive)
            .count();
        let mut na_text = String::new();
        if open > 0 {
            na_text.push_str(&format!(", {open} inconclusive"));
        }
        if na > 0 {
            na_text.push_str(&format!(", {na} not evaluated here"));
        }
        match &self.completion {
            Completion::Incomplete(e) => format!("INCOMPLETE: {e}"),
            Completion::Complete if failed > 0 => format!(
                "FAIL ({failed} of {} criteria failed{na_text})",
                self.criteria.len()
            ),
            Completion::Complete if self.nothing_measured() => {
                let count = |st: Status| self.records.iter().filter(|r| r.status == st).count();
                let (skipped, failed) = (count(Status::Skipped), count(Status::Failed));
                if skipped + failed == 0 {
                    format!(
                        "NOTHING MEASURED (the plan ran no experiment; {} criteria{na_text})",
                        self.criteria.len()
                    )
                } else {
                    format!(
                        "NOTHING MEASURED (every experiment was refused: {skipped} skipped, {failed} failed; {} criteria{na_text})",
                        self.criteria.len()
                    )
                }
            }
            Completion::Complete if open > 0 => format!(
                "INCONCLUSIVE (no criterion failed; {} criteria{na_text})",
                self.criteria.len()
            ),
            Completion::Complete => {
                format!("PASS ({} criteria{na_text})", self.criteria.len())
            }
        }
    }

    /// Summaries of `spec`'s experiments (or its phase) over their repetitions, largest size
    /// per experiment, in run order: what charts draw.
    pub fn chart_summaries(&self, spec: &ChartSpec) -> Vec<Summary> {
        let keep: Vec<&ResultRecord> = self.chart_records(spec);
        let wanted: Vec<(&str, Option<u64>)> = keep
            .iter()
            .map(|r| (r.experiment.as_str(), r.size))
            .collect();
        summarise(
            self.records
                .iter()
                .filter(|r| wanted.contains(&(r.experiment.as_str(), r.size))),
        )
    }

    /// Records of `spec`'s experiments (or its phase), largest size per experiment, in run
    /// order (one repetition each).
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

    /// All knobs used by any record, sorted by name.
    pub fn knobs_used(&self) -> Vec<Knob> {
        let used: std::collections::BTreeSet<Knob> = self
            .records
            .iter()
            .flat_map(|r| r.knobs.keys().copied())
            .collect();
        used.into_iter().collect()
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
