//! The Rhai engine and the plan API registered in it. docs/PLANS.md is the reference for every
//! function; this file keeps the behaviour.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use rhai::{Array, Dynamic, Engine, EvalAltResult, Map, Module, ModuleResolver, Position, Scope};
use serde_json::{json, Value};
use tcpx_report::sequential::{self, Design, Outcome, SequentialRecord, StopReason};
use tcpx_report::stats::{self, Difference, Judgement};
use tcpx_report::{
    ChartKind, ChartSpec, Completion, CriterionResult, DecisionRecord, FigureStats, NamedFigure,
    NoiseInfo, PhaseInfo, Ranking, ResultRecord, RunReport, Status, Verdict, METRICS,
};

use crate::knobs::{knob_names, suggest, PlanExperiment, KNOBS, NOT_CONFIGURATION};
use crate::system::{KnobSupport, RunOutcome, Runner, SystemFacts};
use crate::targets::{detect_platform, TargetSet};

type RResult<T> = Result<T, Box<EvalAltResult>>;

/// Most configurations one `matrix()`, `sweep()` or `compare()` call may run (docs/PLANS.md):
/// a larger call is refused at its file:line:col before any configuration is built.
pub const MAX_CONFIGURATIONS: usize = 10_000;

/// Plan files and the modules they import larger than this are refused (docs/PLANS.md).
pub const MAX_PLAN_BYTES: u64 = 1 << 20;

/// Most experiments a whole plan may run (its dry pass keeps every one's name and result).
pub const MAX_PLAN_EXPERIMENTS: usize = 100_000;

/// Rhai's data-size limits, which count nested values: an array of [`MAX_CONFIGURATIONS`]
/// results (a few hundred map entries and array items each, after the real pass) must fit.
/// What a script builds itself is bounded by these and by the operation limit.
const MAX_MAP_ENTRIES: usize = 8_000_000;
const MAX_ARRAY_ITEMS: usize = 2_000_000;
/// Rhai counts every string nested in a value against this too: the names, labels and knob
/// texts of [`MAX_CONFIGURATIONS`] results take a few MiB.
const MAX_STRING_BYTES: usize = 16 << 20;

/// Engine limits: a plan that runs away is stopped with a message instead of hanging.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_operations: u64,
    pub max_call_levels: usize,
    pub max_expr_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_operations: 5_000_000,
            max_call_levels: 32,
            max_expr_depth: 64,
        }
    }
}

/// Why a plan could not run at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// Syntax or run-time error in the script, with `file:line:column`.
    #[error("{0}")]
    Script(String),
    /// The plan would run longer than the budget.
    #[error("{0}")]
    Budget(String),
    #[error("{0}")]
    Setup(String),
}

/// An experiment value in scripts.
#[derive(Debug, Clone)]
pub struct Exp(pub PlanExperiment);

/// What the dry pass found: how many experiments and how long they should take.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub experiments: usize,
    /// Runner calls: the experiments times their repetitions.
    pub runs: usize,
    pub seconds: f64,
    /// The worst case: every sequential comparison running to its most rounds.
    pub worst_seconds: f64,
    /// Experiment names in run order.
    pub names: Vec<String>,
}

/// Estimates above this many seconds (a day) are worth a warning even without `--budget`.
pub const LONG_ESTIMATE_S: f64 = 86_400.0;

impl Estimate {
    /// A warning when the estimate is longer than a day (or not a finite number), so that a
    /// plan which would run for years does not pass a dry run in silence.
    pub fn warning(&self) -> Option<String> {
        if self.seconds.is_finite() && self.seconds <= LONG_ESTIMATE_S {
            return None;
        }
        Some(format!(
            "the plan is estimated to run about {:.0} s ({:.1} days, {} experiments): check its sizes and iterations, or pass --budget to refuse such runs",
            self.seconds,
            self.seconds / LONG_ESTIMATE_S,
            self.experiments
        ))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Dry,
    Real,
}

struct State {
    mode: Mode,
    runner: Option<Rc<RefCell<dyn Runner>>>,
    facts: SystemFacts,
    targets: TargetSet,
    report: RunReport,
    phase: String,
    t0: Instant,
    est_s: f64,
    /// Estimate with every sequential comparison at its most rounds.
    worst_s: f64,
    /// `--budget`: sequential rounds stop once the run has used it.
    budget_s: Option<f64>,
    /// Sequential comparisons so far (their ids in result maps start at 1).
    comparisons: i64,
    names: HashSet<String>,
    /// Per base name, the `#n` suffix to try next, so repeats are named in constant time.
    next_suffix: HashMap<String, usize>,
    order: Vec<String>,
    /// Runner calls planned and made (one per repetition).
    runs: usize,
    done_runs: usize,
    /// A/A spread measured by `measure_noise`, if the plan did.
    noise_measured: Option<f64>,
    fatal: Option<String>,
    on_update: Box<dyn FnMut(&RunReport)>,
}

type Shared = Rc<RefCell<State>>;

fn err<T>(msg: impl Into<String>) -> RResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(msg.into()),
        Position::NONE,
    )))
}

/// Rhai value -> JSON (knob values, maps for criteria).
pub fn to_json(d: &Dynamic) -> Result<Value, String> {
    if d.is_unit() {
        Ok(Value::Null)
    } else if let Ok(i) = d.as_int() {
        Ok(json!(i))
    } else if let Ok(f) = d.as_float() {
        Ok(json!(f))
    } else if let Ok(b) = d.as_bool() {
        Ok(json!(b))
    } else if d.is_string() {
        Ok(json!(d.clone().into_string().unwrap_or_default()))
    } else if d.is_array() {
        let a = d.clone().cast::<Array>();
        a.iter()
            .map(to_json)
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array)
    } else if d.is_map() {
        let m = d.clone().cast::<Map>();
        let mut o = serde_json::Map::new();
        for (k, v) in &m {
            o.insert(k.to_string(), to_json(v)?);
        }
        Ok(Value::Object(o))
    } else {
        Err(format!(
            "a value of type {} cannot be used here",
            d.type_name()
        ))
    }
}

/// JSON -> Rhai value.
pub fn to_dynamic(v: &Value) -> Dynamic {
    match v {
        Value::Null => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Dynamic::from(i),
            None => Dynamic::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Dynamic::from(s.clone()),
        Value::Array(a) => Dynamic::from(a.iter().map(to_dynamic).collect::<Array>()),
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, v) in o {
                m.insert(k.as_str().into(), to_dynamic(v));
            }
            Dynamic::from(m)
        }
    }
}

fn value_text(knob: &str, v: &Value) -> String {
    match v {
        Value::Number(n) if matches!(knob, "chunk" | "sock_buf" | "size") => n
            .as_u64()
            .map_or_else(|| n.to_string(), tcpx_bench::format_size),
        Value::Null => "auto".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if knob == "sizes" => a
            .iter()
            .filter_map(Value::as_u64)
            .map(tcpx_bench::format_size)
            .collect::<Vec<_>>()
            .join("+"),
        _ => v.to_string(),
    }
}

/// `base.with(map)`: a new experiment with the knobs of `map` changed (checked), a derived name
/// and label unless the map gives them.
fn with(base: &PlanExperiment, changes: &Map) -> Result<PlanExperiment, String> {
    let mut e = base.clone();
    let mut pairs = Vec::new();
    for (k, v) in changes {
        let j = to_json(v).map_err(|m| format!("knob `{k}`: {m}"))?;
        e.set(k, &j).map_err(|x| x.to_string())?;
        // How often it runs is not part of what it is: `repeat` leaves names and labels alone.
        if k != "name" && k != "label" && k != "repeat" {
            let stored = if k == "size" {
                e.knobs.get("sizes").cloned().unwrap_or(Value::Null)
            } else {
                e.knobs.get(k.as_str()).cloned().unwrap_or(Value::Null)
            };
            let key = if k == "size" { "sizes" } else { k.as_str() };
            pairs.push((key.to_string(), value_text(key, &stored)));
        }
    }
    if !changes.contains_key("name") && !pairs.is_empty() {
        let suffix: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{k}{v}").replace([' ', '/'], ""))
            .collect();
        e.knobs.insert(
            "name".into(),
            json!(format!("{}-{}", base.name(), suffix.join("-"))),
        );
    }
    if !changes.contains_key("label") && !pairs.is_empty() {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        e.knobs.insert("label".into(), json!(text.join(" ")));
    }
    Ok(e)
}

fn estimate_s(t: &TargetSet, e: &PlanExperiment) -> f64 {
    t.setup_s + e.total_bytes() as f64 * 2.0 / (t.estimate_gbs * 1e9)
}

/// Each repetition's main record: its largest size, or its only record when it did not run.
fn main_per_rep(records: &[ResultRecord]) -> Vec<&ResultRecord> {
    let mut reps: Vec<u32> = records.iter().map(|r| r.rep).collect();
    reps.sort_unstable();
    reps.dedup();
    reps.iter()
        .filter_map(|rep| {
            records
                .iter()
                .filter(|r| r.rep == *rep)
                .max_by_key(|r| r.size.unwrap_or(0))
        })
        .collect()
}

fn stats_map(f: &FigureStats) -> Dynamic {
    let mut m = Map::new();
    m.insert("median".into(), Dynamic::from(f.median));
    m.insert("lo".into(), Dynamic::from(f.ci95_lo));
    m.insert("hi".into(), Dynamic::from(f.ci95_hi));
    m.insert("min".into(), Dynamic::from(f.min));
    m.insert("max".into(), Dynamic::from(f.max));
    m.insert("n".into(), Dynamic::from(f.n as i64));
    m.insert("level".into(), Dynamic::from(f.level));
    m.insert(
        "reps".into(),
        Dynamic::from(f.reps.iter().map(|v| Dynamic::from(*v)).collect::<Array>()),
    );
    Dynamic::from(m)
}

/// The result map a script sees for one experiment: every metric is the median over the
/// repetitions that ran (largest message size), `stats` holds each metric's interval and
/// repetitions, `reps` each repetition's figures.
fn result_map(exp: &PlanExperiment, phase: &str, records: &[ResultRecord], dry: bool) -> Map {
    let mut m = Map::new();
    let mains = main_per_rep(records);
    let ok: Vec<&ResultRecord> = mains
        .iter()
        .copied()
        .filter(|r| r.status == Status::Ok)
        .collect();
    let bad = mains.iter().find(|r| r.status != Status::Ok);
    let status = if dry {
        "planned"
    } else if mains.is_empty() {
        "failed"
    } else {
        bad.map_or("ok", |r| r.status.as_str())
    };
    m.insert("name".into(), Dynamic::from(exp.name()));
    m.insert("label".into(), Dynamic::from(exp.label()));
    m.insert("phase".into(), Dynamic::from(phase.to_string()));
    m.insert("status".into(), Dynamic::from(status.to_string()));
    m.insert("ok".into(), Dynamic::from(status == "ok"));
    let reason = bad.and_then(|r| {
        r.reason.as_ref().map(|why| {
            if mains.len() > 1 {
                format!("repetition {} of {}: {why}", r.rep, mains.len())
            } else {
                why.clone()
            }
        })
    });
    m.insert("reason".into(), reason.map_or(Dynamic::UNIT, Dynamic::from));
    m.insert(
        "size".into(),
        mains
            .iter()
            .filter_map(|r| r.size)
            .max()
            .map_or(Dynamic::UNIT, |s| Dynamic::from(s as i64)),
    );
    m.insert("n".into(), Dynamic::from(ok.len() as i64));
    m.insert("repeat".into(), Dynamic::from(mains.len() as i64));
    let mut stats = Map::new();
    // Iteration percentiles are taken over every iteration of every repetition where kept.
    let (pooled, _) = tcpx_report::pool_iterations(&ok);
    for (name, _) in METRICS {
        if let Some(v) = pooled.get(*name) {
            m.insert((*name).into(), Dynamic::from(*v));
            let vals: Vec<f64> = ok.iter().filter_map(|r| r.metric(name)).collect();
            if let Some(f) = (vals.len() == ok.len())
                .then(|| FigureStats::of(&vals))
                .flatten()
            {
                stats.insert((*name).into(), stats_map(&f));
            }
            continue;
        }
        let vals: Vec<f64> = ok.iter().filter_map(|r| r.metric(name)).collect();
        let f = (vals.len() == ok.len())
            .then(|| FigureStats::of(&vals))
            .flatten();
        m.insert(
            (*name).into(),
            f.as_ref()
                .map_or(Dynamic::UNIT, |f| Dynamic::from(f.median)),
        );
        if let Some(f) = &f {
            stats.insert((*name).into(), stats_map(f));
        }
    }
    m.insert("stats".into(), Dynamic::from(stats));
    let reps: Array = mains
        .iter()
        .map(|r| {
            let mut x = Map::new();
            x.insert("rep".into(), Dynamic::from(i64::from(r.rep)));
            x.insert(
                "status".into(),
                Dynamic::from(r.status.as_str().to_string()),
            );
            for (name, _) in METRICS {
                x.insert(
                    (*name).into(),
                    r.metric(name).map_or(Dynamic::UNIT, Dynamic::from),
                );
            }
            Dynamic::from(x)
        })
        .collect();
    m.insert("reps".into(), Dynamic::from(reps));
    m.insert(
        "knobs".into(),
        to_dynamic(&Value::Object(exp.knobs.clone().into_iter().collect())),
    );
    let mut na = serde_json::Map::new();
    for r in &mains {
        for (k, v) in &r.not_applied {
            na.entry(k.clone()).or_insert_with(|| json!(v));
        }
    }
    m.insert("not_applied".into(), to_dynamic(&Value::Object(na)));
    // Per flow (GPU) figures of the largest size, medians over the repetitions:
    // [#{ flow, server_gbs, client_gbs }, ...].
    let per_flow: Vec<Value> = ok
        .first()
        .map(|first| {
            first
                .per_flow
                .iter()
                .map(|f| {
                    let pick = |g: fn(&tcpx_report::FlowFigures) -> f64| {
                        let v: Vec<f64> = ok
                            .iter()
                            .filter_map(|r| r.per_flow.iter().find(|p| p.flow == f.flow))
                            .map(g)
                            .collect();
                        stats::median(&v).unwrap_or(0.0)
                    };
                    json!({ "flow": f.flow, "server_gbs": pick(|p| p.recv_gbs), "client_gbs": pick(|p| p.send_gbs) })
                })
                .collect()
        })
        .unwrap_or_default();
    m.insert("per_flow".into(), to_dynamic(&Value::Array(per_flow)));
    let nic_plan: serde_json::Map<String, Value> = mains
        .first()
        .map(|r| {
            r.nic_plan
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect()
        })
        .unwrap_or_default();
    m.insert("nic_plan".into(), to_dynamic(&Value::Object(nic_plan)));
    m
}

/// Runs `exps` as one comparison: each `repeat` times, repetition `r` in the order rotated
/// by `r` (A B C, B C A, C A B, ...) so that drift over time reaches every configuration alike.
/// The runner is called once per repetition; results keep every repetition.
fn run_many(st: &Shared, exps: Vec<PlanExperiment>, sequential: bool) -> RResult<Vec<Map>> {
    let mut exps = exps;
    let sequential = sequential && exps.len() >= 2;
    let (mode, phase, runner) = {
        let mut s = st.borrow_mut();
        if let Some(f) = &s.fatal {
            return err(format!("the run cannot go on: {f}"));
        }
        if s.phase.is_empty() {
            s.phase = "main".into();
            s.report.phases.push(PhaseInfo {
                name: "main".into(),
                description: String::new(),
            });
        }
        if s.names.len() + exps.len() > MAX_PLAN_EXPERIMENTS {
            return err(format!(
                "this call would take the plan past {MAX_PLAN_EXPERIMENTS} experiments (the limit of a plan; {} so far, {} more asked): split it into several plans",
                s.names.len(),
                exps.len()
            ));
        }
        for exp in &mut exps {
            // Names are unique within a run: a second experiment of the same name gets #2, #3.
            // A per-name counter keeps this constant-time for many repeats of one name.
            let base = exp.name();
            let mut name = base.clone();
            if s.names.contains(&name) {
                let mut n = s.next_suffix.get(&base).copied().unwrap_or(2);
                loop {
                    name = format!("{base}#{n}");
                    n += 1;
                    if !s.names.contains(&name) {
                        break;
                    }
                }
                s.next_suffix.insert(base, n);
            }
            exp.knobs.insert("name".into(), json!(name));
            let one = estimate_s(&s.targets, exp);
            s.est_s += one * f64::from(exp.repeat());
            let worst = if sequential {
                exp.repeat().max(s.targets.max_rounds())
            } else {
                exp.repeat()
            };
            s.worst_s += one * f64::from(worst);
            s.runs += exp.repeat() as usize;
            s.names.insert(exp.name());
            s.order.push(exp.name());
        }
        (s.mode, s.phase.clone(), s.runner.clone())
    };
    if mode == Mode::Dry {
        return Ok(exps
            .iter()
            .map(|e| result_map(e, &phase, &[], true))
            .collect());
    }
    let Some(runner) = runner else {
        return err("no runner is attached to this plan run");
    };
    let k = exps.len();
    let rounds = exps.iter().map(PlanExperiment::repeat).max().unwrap_or(1);
    let (max_rounds, max_s, budget_s, cmp_id) = {
        let mut s = st.borrow_mut();
        if sequential {
            s.comparisons += 1;
        }
        (
            s.targets.max_rounds().max(rounds),
            s.targets.max_comparison_s(),
            s.budget_s,
            if sequential { s.comparisons } else { 0 },
        )
    };
    let design = Design::new(max_rounds as usize);
    let t_cmp = Instant::now();
    let mut records: Vec<Vec<ResultRecord>> = vec![Vec::new(); k];
    // A repetition that was skipped or failed ends its configuration's repetitions: the result
    // is skipped or failed whatever the others would measure, and a failure is not noise.
    let mut ended = vec![false; k];
    let mut rep: u32 = 0;
    let mut stopped: Option<(StopReason, String)> = None;
    loop {
        if rep >= rounds {
            if !sequential {
                break;
            }
            // A look: every pair decided, nothing left to decide, or the budget used up.
            let (reason, why) = look(st, &exps, &phase, &records, &design);
            if let Some(r) = reason {
                stopped = Some((r, why));
                break;
            }
            let plan_used = st.borrow().t0.elapsed().as_secs_f64();
            let out = if rep >= max_rounds {
                Some(format!(
                    "its most rounds ({max_rounds}, the target set's max_rounds)"
                ))
            } else if t_cmp.elapsed().as_secs_f64() >= max_s {
                Some(format!(
                    "its most seconds ({max_s:.0} s, the target set's max_comparison_s)"
                ))
            } else {
                budget_s
                    .filter(|b| plan_used >= *b)
                    .map(|b| format!("the run's --budget ({b:.0} s)"))
            };
            if let Some(out) = out {
                stopped = Some((StopReason::Budget, format!("{out} ran out: {why}")));
                break;
            }
        }
        for i in rotation(k, rep as usize) {
            let exp = &exps[i];
            // A sequential comparison runs every configuration in every round (the largest
            // `repeat` among them first), so rounds stay pairs; otherwise each its own `repeat`.
            if (!sequential && rep >= exp.repeat()) || ended[i] {
                continue;
            }
            let started = st.borrow().t0.elapsed().as_secs_f64();
            let outcome: RunOutcome = runner.borrow_mut().run(exp, &phase, started);
            let mut s = st.borrow_mut();
            let mut got = outcome.records;
            for r in &mut got {
                r.rep = rep + 1;
            }
            ended[i] = got.is_empty() || got.iter().any(|r| r.status != Status::Ok);
            s.report.records.extend(got.iter().cloned());
            records[i].extend(got);
            s.report.samples.extend(outcome.samples);
            s.done_runs += 1;
            if let Some(f) = outcome.fatal {
                s.fatal = Some(f.clone());
                s.report.completion = Completion::Incomplete(f.clone());
                let snapshot = s.report.clone();
                (s.on_update)(&snapshot);
                return err(f);
            }
            let mut snapshot = s.report.clone();
            snapshot.completion = Completion::Incomplete(format!(
                "in progress or interrupted after {} runs",
                s.done_runs
            ));
            (s.on_update)(&snapshot);
        }
        rep += 1;
    }
    if let Some((stop, why)) = stopped {
        st.borrow_mut().report.sequential.push(SequentialRecord {
            phase: phase.clone(),
            configurations: exps.iter().map(PlanExperiment::label).collect(),
            rounds: rep as usize,
            max_rounds: design.max_rounds,
            seconds: t_cmp.elapsed().as_secs_f64(),
            stop,
            why,
            method: design.method(),
        });
    }
    Ok(exps
        .iter()
        .zip(&records)
        .map(|(e, r)| {
            let mut m = result_map(e, &phase, r, false);
            if sequential {
                m.insert("comparison".into(), Dynamic::from(cmp_id));
                m.insert("max_rounds".into(), Dynamic::from(design.max_rounds as i64));
            }
            m
        })
        .collect())
}

/// One look of a sequential comparison on `server_gbs`: the configuration with the best median
/// against each other one that ran, by the paired interval of `design`. Returns why it stops
/// (`None`: go on) and a sentence on each pair.
fn look(
    st: &Shared,
    exps: &[PlanExperiment],
    phase: &str,
    records: &[Vec<ResultRecord>],
    design: &Design,
) -> (Option<StopReason>, String) {
    let maps: Vec<Map> = exps
        .iter()
        .zip(records)
        .map(|(e, r)| result_map(e, phase, r, false))
        .collect();
    let ran: Vec<(usize, FigureStats)> = maps
        .iter()
        .enumerate()
        .filter(|(_, m)| map_get(m, "ok").as_bool().unwrap_or(false))
        .filter_map(|(i, m)| figure_of(m, "server_gbs").map(|f| (i, f)))
        .collect();
    if ran.len() < 2 {
        return (
            Some(StopReason::CannotDecide),
            format!(
                "{} of {} configurations ran (skipped or failed ones cannot be compared)",
                ran.len(),
                exps.len()
            ),
        );
    }
    let Some((top, top_f)) = ran
        .iter()
        .max_by(|a, b| a.1.median.total_cmp(&b.1.median))
        .cloned()
    else {
        return (Some(StopReason::CannotDecide), String::new());
    };
    let noise = noise_level(st);
    let label = |i: usize| exps[i].label();
    let (mut open, mut compared, mut parts) = (0, 0, Vec::new());
    for (i, f) in &ran {
        if *i == top {
            continue;
        }
        if same_experiment(&maps[top], &maps[*i]).is_some() {
            parts.push(format!("{}: the same experiment here", label(*i)));
            continue;
        }
        compared += 1;
        let Some(p) = sequential::paired(&top_f.reps, &f.reps, design) else {
            open += 1;
            continue;
        };
        let o = p.outcome(noise);
        if o == Outcome::Undecided {
            open += 1;
        }
        parts.push(format!(
            "{} / {}: {:.3} [{:.3}, {:.3}] {}",
            label(*i),
            label(top),
            p.ratio,
            p.lo,
            p.hi,
            outcome_word(o)
        ));
    }
    let why = format!(
        "{} after {} rounds (noise {:.1}%)",
        parts.join("; "),
        top_f.n,
        noise * 100.0
    );
    if compared == 0 {
        (Some(StopReason::CannotDecide), why)
    } else if open == 0 {
        (Some(StopReason::Decided), why)
    } else {
        (None, why)
    }
}

fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Higher => "higher",
        Outcome::Lower => "lower",
        Outcome::Equivalent => "equivalent within noise",
        Outcome::Undecided => "undecided",
    }
}

/// The order of `k` configurations in repetition `rep`: rotated left by `rep`.
pub fn rotation(k: usize, rep: usize) -> Vec<usize> {
    (0..k).map(|i| (i + rep) % k.max(1)).collect()
}

fn metric_name(word: &str) -> Option<&'static str> {
    let alias = match word {
        "server" | "recv" => "server_gbs",
        "client" | "send" => "client_gbs",
        "busbw" => "busbw_gbs",
        "server_per_gpu" | "per_gpu" => "server_gbs_per_flow",
        "client_per_gpu" => "client_gbs_per_flow",
        "p50" => "p50_us",
        "p99" => "p99_us",
        other => other,
    };
    METRICS.iter().map(|(n, _)| *n).find(|n| *n == alias)
}

fn compare(actual: f64, op: &str, threshold: f64) -> Result<bool, String> {
    Ok(match op {
        ">" => actual > threshold,
        ">=" => actual >= threshold,
        "<" => actual < threshold,
        "<=" => actual <= threshold,
        "==" => (actual - threshold).abs() <= 1e-9 * threshold.abs().max(1.0),
        _ => return Err(format!("comparison `{op}`: use >, >=, <, <= or ==")),
    })
}

/// A threshold that is NaN or infinite judges nothing: refused, naming the criterion.
fn finite_threshold(text: &str, t: f64) -> Result<f64, String> {
    if t.is_finite() {
        Ok(t)
    } else {
        Err(format!(
            "criterion `{text}`: the threshold {t} is not a finite number"
        ))
    }
}

/// `server > 3.5 GB/s` -> (metric, op, threshold).
fn parse_criterion(text: &str) -> Result<(&'static str, String, f64), String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let usage = || {
        format!(
            "criterion `{text}` is not `<metric> <op> <number> [unit]` (e.g. \"server > 3.5 GB/s\"); for other checks pass a condition: criterion(text, true_or_false)"
        )
    };
    if words.len() < 3 || words.len() > 4 {
        return Err(usage());
    }
    let metric = metric_name(words[0]).ok_or_else(|| {
        let all: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
        let hint = suggest(words[0], all.iter().copied().chain(["server", "client"]))
            .map(|s| format!(" (did you mean `{s}`?)"))
            .unwrap_or_default();
        format!(
            "criterion `{text}`: unknown metric `{}`{hint}; metrics: server, client, {}",
            words[0],
            all.join(", ")
        )
    })?;
    let threshold: f64 = words[2].parse().map_err(|_| usage())?;
    finite_threshold(text, threshold)?;
    compare(0.0, words[1], 0.0).map_err(|e| format!("criterion `{text}`: {e}"))?;
    if let Some(unit) = words.get(3) {
        let ok = match *unit {
            "GB/s" => metric.contains("_gbs"),
            "us" => metric.ends_with("_us"),
            "bytes" => metric == "wrong_bytes",
            _ => false,
        };
        if !ok {
            return Err(format!(
                "criterion `{text}`: unit `{unit}` does not fit metric `{metric}` (GB/s for *_gbs, us for *_us)"
            ));
        }
    }
    Ok((metric, words[1].to_string(), threshold))
}

/// What one `validate()` adds to a plan's estimate where it can run (libnccl and two GPUs):
/// 20 NCCL processes (send/recv and all-reduce, default and tuned, 5 repetitions each), each an
/// NCCL init over NET/Socket plus 25 transfers of 64 MiB, taken as 5 s apiece. A rough figure,
/// not a measurement: it keeps a plan that validates from looking free against `--budget`.
pub const VALIDATE_ESTIMATE_S: f64 = 100.0;

/// `validate()`: the run's tuned settings so far (tuned.env) against NCCL's defaults through
/// the runner, recorded as a criterion (N/A with the reason where it cannot run); returns the
/// gain (tuned / default busbw) or `()`.
fn validate_tuned(st: &Shared) -> Dynamic {
    let (mode, runner, tuned) = {
        let s = st.borrow();
        let mut r = s.report.clone();
        r.summaries = tcpx_report::summarise(r.records.iter());
        (
            s.mode,
            s.runner.clone(),
            tcpx_report::tuned::Tuned::from_report(&r).pairs(),
        )
    };
    if mode == Mode::Dry {
        let mut s = st.borrow_mut();
        if s.facts.transports.iter().any(|t| t == "nccl") && s.facts.gpus.len() >= 2 {
            s.est_s += VALIDATE_ESTIMATE_S;
        }
        return Dynamic::UNIT;
    }
    let text = "the tuned settings beat NCCL's defaults (libnccl send/recv, gain > 1)";
    let outcome = match runner {
        _ if tuned.is_empty() => {
            crate::system::Validation::NotAvailable("no tuned settings yet".into())
        }
        Some(r) => r.borrow_mut().validate(&tuned),
        None => crate::system::Validation::NotAvailable("no runner is attached".into()),
    };
    match outcome {
        crate::system::Validation::NotAvailable(why) => {
            push_criterion(st, CriterionResult::plain(text, Verdict::NotEvaluated, why));
            Dynamic::UNIT
        }
        crate::system::Validation::Measured {
            gain,
            lo,
            hi,
            detail,
        } => {
            let verdict = if lo > 1.0 {
                Verdict::Pass
            } else if hi <= 1.0 {
                Verdict::Fail
            } else {
                Verdict::Inconclusive
            };
            push_criterion(
                st,
                CriterionResult::plain(
                    text,
                    verdict,
                    format!("gain {gain:.3} [{lo:.3}, {hi:.3}]: {detail}"),
                ),
            );
            Dynamic::from(gain)
        }
    }
}

fn push_criterion(st: &Shared, c: CriterionResult) -> bool {
    let pass = c.verdict == Verdict::Pass;
    let mut s = st.borrow_mut();
    let mut c = c;
    c.phase = s.phase.clone();
    s.report.criteria.push(c);
    pass
}

fn map_get(m: &Map, k: &str) -> Dynamic {
    m.get(k).cloned().unwrap_or(Dynamic::UNIT)
}

fn as_f64(d: &Dynamic) -> Option<f64> {
    d.as_float()
        .ok()
        .or_else(|| d.as_int().ok().map(|i| i as f64))
}

/// The statistics of `metric` in a result map, rebuilt from its repetitions.
fn figure_of(r: &Map, metric: &str) -> Option<FigureStats> {
    let stats = map_get(r, "stats");
    if !stats.is_map() {
        return None;
    }
    let f = map_get(&stats.cast::<Map>(), metric);
    if !f.is_map() {
        return None;
    }
    let reps = map_get(&f.cast::<Map>(), "reps");
    if !reps.is_array() {
        return None;
    }
    let vals: Vec<f64> = reps.cast::<Array>().iter().filter_map(as_f64).collect();
    FigureStats::of(&vals)
}

fn verdict_of(j: Judgement) -> Verdict {
    match j {
        Judgement::Pass => Verdict::Pass,
        Judgement::Fail => Verdict::Fail,
        Judgement::Inconclusive => Verdict::Inconclusive,
    }
}

/// A criterion over an interval: three-valued, with how many repetitions would settle it.
#[allow(clippy::too_many_arguments)]
fn interval_criterion(
    text: &str,
    estimate: f64,
    lo: f64,
    hi: f64,
    n: usize,
    op: &str,
    threshold: f64,
    detail: String,
    figures: Vec<NamedFigure>,
) -> RResult<CriterionResult> {
    let j = stats::judge(lo, hi, op, threshold).map_or_else(
        || err(format!("comparison `{op}`: use >, >=, <, <= or ==")),
        Ok,
    )?;
    Ok(CriterionResult {
        actual: Some(estimate),
        threshold: Some(threshold),
        ci95_lo: Some(lo),
        ci95_hi: Some(hi),
        n: Some(n),
        reps_to_settle: (j == Judgement::Inconclusive)
            .then(|| stats::reps_to_settle(estimate, lo, hi, n, threshold))
            .flatten(),
        figures,
        ..CriterionResult::plain(text, verdict_of(j), detail)
    })
}

fn criterion_on_result(st: &Shared, text: &str, r: &Map) -> RResult<bool> {
    let (metric, op, threshold) = parse_criterion(text).map_or_else(err, Ok)?;
    let name = map_get(r, "name").into_string().unwrap_or_default();
    let status = map_get(r, "status").into_string().unwrap_or_default();
    let c = match figure_of(r, metric) {
        Some(f) if status == "ok" => interval_criterion(
            text,
            f.median,
            f.ci95_lo,
            f.ci95_hi,
            f.n,
            &op,
            threshold,
            format!(
                "{metric} of {name}, median of {} repetitions, order-statistic interval covering {:.0}%",
                f.n,
                f.level * 100.0
            ),
            vec![NamedFigure {
                name: format!("{metric} of {name}"),
                stats: f,
            }],
        )?,
        _ => CriterionResult {
            threshold: Some(threshold),
            ..CriterionResult::plain(
                text,
                Verdict::NotEvaluated,
                format!(
                    "{name} is {status}{}",
                    map_get(r, "reason")
                        .into_string()
                        .map(|x| format!(": {x}"))
                        .unwrap_or_default()
                ),
            )
        },
    };
    Ok(push_criterion(st, c))
}

/// The noise level comparisons use and which rule gave it: the measured A/A spread (raised to
/// the target set's `noise_floor` where that is larger, with its stated reason), else the target
/// set's `noise`.
fn noise_choice(st: &Shared) -> (f64, String) {
    let s = st.borrow();
    let default = s.targets.thresholds.get("noise").copied().unwrap_or(0.0);
    match (s.noise_measured, s.targets.noise_floor()) {
        (Some(m), Some((f, why))) if f > m => (
            f,
            format!(
                "target set floor {:.1}% (above the measured {:.1}%): {why}",
                f * 100.0,
                m * 100.0
            ),
        ),
        (Some(m), _) => (m, format!("measured by this run's A/A: {:.1}%", m * 100.0)),
        (None, _) => (
            default,
            format!(
                "the target set's default {:.1}%: this run measured no A/A (measure_noise)",
                default * 100.0
            ),
        ),
    }
}

fn noise_level(st: &Shared) -> f64 {
    noise_choice(st).0
}

/// The method and level of a bootstrap ratio interval, for labels.
const BOOTSTRAP_METHOD: &str =
    "bootstrap percentile interval of the ratio of medians, nominal 95% (not sequential)";

/// The sequential design two result maps share when they come from one sequential comparison
/// with as many rounds each (their repetitions are then pairs, round by round).
fn shared_design(a: &Map, b: &Map, na: usize, nb: usize) -> Option<Design> {
    let id = |m: &Map| map_get(m, "comparison").as_int().ok().filter(|i| *i > 0);
    let (ia, ib) = (id(a)?, id(b)?);
    let rounds = map_get(a, "max_rounds").as_int().ok()?;
    (ia == ib && na == nb && rounds > 0).then(|| Design::new(rounds as usize))
}

/// Knobs in which `a` and `b` (result maps) differ, and whether every one of them was not
/// applied on at least one side: then they are the same experiment here.
fn same_experiment(a: &Map, b: &Map) -> Option<Vec<String>> {
    let knobs = |m: &Map| to_json(&map_get(m, "knobs")).unwrap_or(Value::Null);
    let na = |m: &Map| to_json(&map_get(m, "not_applied")).unwrap_or(Value::Null);
    let (ka, kb, na_a, na_b) = (knobs(a), knobs(b), na(a), na(b));
    let (Some(ka), Some(kb)) = (ka.as_object(), kb.as_object()) else {
        return None;
    };
    let mut differ = Vec::new();
    for k in ka.keys().chain(kb.keys()) {
        if NOT_CONFIGURATION.contains(&k.as_str()) || differ.contains(k) {
            continue;
        }
        if ka.get(k) != kb.get(k) {
            let not_applied = na_a.get(k).is_some() || na_b.get(k).is_some();
            if !not_applied {
                return None;
            }
            differ.push(k.clone());
        }
    }
    // The very same knobs are an A/A comparison: the statistics decide, not this.
    (!differ.is_empty()).then_some(differ)
}

fn why_same(a: &Map, b: &Map, knobs: &[String]) -> String {
    let na = |m: &Map, k: &str| {
        let v = map_get(m, "not_applied");
        if v.is_map() {
            map_get(&v.cast::<Map>(), k).into_string().ok()
        } else {
            None
        }
    };
    knobs
        .iter()
        .map(|k| {
            let why = na(b, k).or_else(|| na(a, k)).unwrap_or_default();
            format!("{k} not applied ({why})")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `gain_ci(a, b)`: the relative change of `b` over `a` (ratio of medians - 1) with its interval,
/// judged against the noise level; `()` when either did not run.
fn gain_ci(st: &Shared, a: &Dynamic, b: &Dynamic, metric: &str) -> RResult<Dynamic> {
    let metric = metric_name(metric)
        .map_or_else(|| err(format!("gain_ci: unknown metric `{metric}`")), Ok)?;
    if !a.is_map() || !b.is_map() {
        return Ok(Dynamic::UNIT);
    }
    let (a, b) = (a.clone().cast::<Map>(), b.clone().cast::<Map>());
    let ok = |m: &Map| map_get(m, "ok").as_bool().unwrap_or(false);
    if !ok(&a) || !ok(&b) {
        return Ok(Dynamic::UNIT);
    }
    let (Some(fa), Some(fb)) = (figure_of(&a, metric), figure_of(&b, metric)) else {
        return Ok(Dynamic::UNIT);
    };
    let name = |m: &Map| map_get(m, "name").into_string().unwrap_or_default();
    // The same result on both sides (the best is the baseline): the same measurements, a gain
    // of exactly 0, not two samples to resample.
    let noise = noise_level(st);
    let design = shared_design(&a, &b, fa.n, fb.n);
    let mut level = stats::LEVEL;
    let mut decisive = true;
    let mut method = BOOTSTRAP_METHOD.to_string();
    let mut paired_outcome = None;
    let r = if name(&a) == name(&b) {
        stats::Ratio {
            ratio: 1.0,
            lo: 1.0,
            hi: 1.0,
            n_a: fa.n,
            n_b: fb.n,
        }
    } else if let Some(d) = design {
        let Some(p) = sequential::paired(&fa.reps, &fb.reps, &d) else {
            return Ok(Dynamic::UNIT);
        };
        level = p.level;
        decisive = p.decisive;
        paired_outcome = Some(p.outcome(noise));
        method = if p.decisive {
            d.method()
        } else {
            format!(
                "paired sign-test interval of {} rounds, covering {:.0}% on its own: before the sequential design's first look (round {}), so it decides nothing",
                p.n,
                p.level * 100.0,
                d.first_look
            )
        };
        stats::Ratio {
            ratio: p.ratio,
            lo: p.lo,
            hi: p.hi,
            n_a: p.n,
            n_b: p.n,
        }
    } else {
        match stats::ratio_of_medians(&fa.reps, &fb.reps) {
            Some(r) => r,
            None => return Ok(Dynamic::UNIT),
        }
    };
    let label = |m: &Map| map_get(m, "label").into_string().unwrap_or_default();
    let mut m = Map::new();
    m.insert("kind".into(), Dynamic::from("gain".to_string()));
    m.insert("metric".into(), Dynamic::from(metric.to_string()));
    m.insert("value".into(), Dynamic::from(r.ratio - 1.0));
    m.insert("lo".into(), Dynamic::from(r.lo - 1.0));
    m.insert("hi".into(), Dynamic::from(r.hi - 1.0));
    m.insert("n".into(), Dynamic::from(r.n_a.min(r.n_b) as i64));
    m.insert("noise".into(), Dynamic::from(noise));
    m.insert("level".into(), Dynamic::from(level));
    m.insert("method".into(), Dynamic::from(method.clone()));
    m.insert("decisive".into(), Dynamic::from(decisive));
    m.insert("a".into(), Dynamic::from(name(&a)));
    m.insert("b".into(), Dynamic::from(name(&b)));
    m.insert("a_stats".into(), stats_map(&fa));
    m.insert("b_stats".into(), stats_map(&fb));
    let same = same_experiment(&a, &b);
    m.insert("identical".into(), Dynamic::from(same.is_some()));
    let (significant, why) = match &same {
        Some(knobs) => (
            false,
            format!(
                "{} and {} are the same experiment here: {}",
                label(&a),
                label(&b),
                why_same(&a, &b, knobs)
            ),
        ),
        None if !decisive => (
            false,
            format!(
                "{:+.1}% [{:+.1}%, {:+.1}%]: undecided ({method})",
                (r.ratio - 1.0) * 100.0,
                (r.lo - 1.0) * 100.0,
                (r.hi - 1.0) * 100.0,
            ),
        ),
        None => match paired_outcome.map_or_else(
            || r.difference(noise),
            |o| match o {
                Outcome::Higher => Difference::Higher,
                Outcome::Lower => Difference::Lower,
                _ => Difference::Tied,
            },
        ) {
            Difference::Tied => (
                false,
                format!(
                    "{:+.1}% [{:+.1}%, {:+.1}%]: within noise ({:.1}%)",
                    (r.ratio - 1.0) * 100.0,
                    (r.lo - 1.0) * 100.0,
                    (r.hi - 1.0) * 100.0,
                    noise * 100.0
                ),
            ),
            _ => (
                true,
                format!(
                    "{:+.1}% [{:+.1}%, {:+.1}%]: beyond noise ({:.1}%)",
                    (r.ratio - 1.0) * 100.0,
                    (r.lo - 1.0) * 100.0,
                    (r.hi - 1.0) * 100.0,
                    noise * 100.0
                ),
            ),
        },
    };
    m.insert("significant".into(), Dynamic::from(significant));
    m.insert("why".into(), Dynamic::from(why));
    Ok(Dynamic::from(m))
}

fn is_estimate(d: &Dynamic) -> bool {
    d.is_map()
        && map_get(&d.clone().cast::<Map>(), "kind")
            .into_string()
            .ok()
            .as_deref()
            == Some("gain")
}

fn figure_from_stats_map(d: &Dynamic) -> Option<FigureStats> {
    if !d.is_map() {
        return None;
    }
    let reps = map_get(&d.clone().cast::<Map>(), "reps");
    if !reps.is_array() {
        return None;
    }
    FigureStats::of(
        &reps
            .cast::<Array>()
            .iter()
            .filter_map(as_f64)
            .collect::<Vec<_>>(),
    )
}

/// A criterion on an estimate from `gain_ci`: three-valued on its interval; not evaluated when
/// the two configurations are the same experiment here.
fn criterion_on_estimate(
    text: &str,
    e: &Map,
    op: &str,
    threshold: f64,
) -> RResult<CriterionResult> {
    let why = map_get(e, "why").into_string().unwrap_or_default();
    if map_get(e, "identical").as_bool().unwrap_or(false) {
        return Ok(CriterionResult {
            threshold: Some(threshold),
            ..CriterionResult::plain(text, Verdict::NotEvaluated, why)
        });
    }
    if !map_get(e, "decisive").as_bool().unwrap_or(true) {
        let f = |k: &str| as_f64(&map_get(e, k));
        return Ok(CriterionResult {
            actual: f("value"),
            threshold: Some(threshold),
            ci95_lo: f("lo"),
            ci95_hi: f("hi"),
            n: f("n").map(|n| n as usize),
            ..CriterionResult::plain(text, Verdict::Inconclusive, why)
        });
    }
    let f = |k: &str| as_f64(&map_get(e, k)).unwrap_or(f64::NAN);
    let metric = map_get(e, "metric").into_string().unwrap_or_default();
    let mut figures = Vec::new();
    for (side, key) in [("a", "a_stats"), ("b", "b_stats")] {
        if let Some(stats) = figure_from_stats_map(&map_get(e, key)) {
            let who = map_get(e, side).into_string().unwrap_or_default();
            figures.push(NamedFigure {
                name: format!("{metric} of {who}"),
                stats,
            });
        }
    }
    let n = as_f64(&map_get(e, "n")).unwrap_or(0.0) as usize;
    interval_criterion(
        text,
        f("value"),
        f("lo"),
        f("hi"),
        n,
        op,
        threshold,
        format!(
            "gain of {} over {}: {why}; interval: {}",
            map_get(e, "b").into_string().unwrap_or_default(),
            map_get(e, "a").into_string().unwrap_or_default(),
            map_get(e, "method").into_string().unwrap_or_default()
        ),
        figures,
    )
}

/// `holds(x, op, threshold)`: true when the whole interval of `x` (an estimate from `gain_ci`
/// or a result's metric through `holds(r, "server > 3")`) satisfies it, false when none of it
/// does, () when it is inconclusive or `x` is ().
fn holds(x: &Dynamic, op: &str, threshold: f64) -> RResult<Dynamic> {
    if x.is_unit() {
        return Ok(Dynamic::UNIT);
    }
    if is_estimate(x) {
        let e = x.clone().cast::<Map>();
        if map_get(&e, "identical").as_bool().unwrap_or(false)
            || !map_get(&e, "decisive").as_bool().unwrap_or(true)
        {
            return Ok(Dynamic::UNIT);
        }
        let lo = as_f64(&map_get(&e, "lo")).unwrap_or(f64::NAN);
        let hi = as_f64(&map_get(&e, "hi")).unwrap_or(f64::NAN);
        return Ok(match stats::judge(lo, hi, op, threshold) {
            Some(Judgement::Pass) => Dynamic::from(true),
            Some(Judgement::Fail) => Dynamic::from(false),
            Some(Judgement::Inconclusive) => Dynamic::UNIT,
            None => return err(format!("holds: comparison `{op}`: use >, >=, <, <= or ==")),
        });
    }
    if let Some(v) = as_f64(x) {
        return compare(v, op, threshold)
            .map(Dynamic::from)
            .map_or_else(err, Ok);
    }
    err(format!(
        "holds: give an estimate from gain_ci, a number or (), got {}",
        x.type_name()
    ))
}

fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').chars().take(60).collect()
}

fn check_knob_name(what: &str, k: &str) -> RResult<()> {
    if KNOBS.iter().any(|x| x.name == k) {
        return Ok(());
    }
    let hint = suggest(k, knob_names())
        .map(|s| format!(": did you mean `{s}`?"))
        .unwrap_or_default();
    err(format!("chart {what} `{k}` is not a knob{hint}"))
}

fn chart(st: &Shared, m: &Map) -> RResult<()> {
    const KEYS: &[&str] = &[
        "id", "title", "kind", "metric", "x", "y", "series", "results", "phase",
    ];
    for k in m.keys() {
        if !KEYS.contains(&k.as_str()) {
            let hint = suggest(k, KEYS.iter().copied())
                .map(|s| format!(": did you mean `{s}`?"))
                .unwrap_or_default();
            return err(format!(
                "chart: unknown key `{k}`{hint} (keys: {})",
                KEYS.join(", ")
            ));
        }
    }
    let text = |k: &str| -> RResult<Option<String>> {
        match m.get(k) {
            None => Ok(None),
            Some(d) if d.is_unit() => Ok(None),
            Some(d) if d.is_string() => Ok(d.clone().into_string().ok()),
            Some(d) => err(format!("chart: `{k}` wants text, got {}", d.type_name())),
        }
    };
    let title = text("title")?.map_or_else(|| err("chart: give a title"), Ok)?;
    let kind = match text("kind")?.as_deref() {
        Some("bar") => ChartKind::Bar,
        Some("line") => ChartKind::Line,
        Some("heatmap") => ChartKind::Heatmap,
        Some(other) => {
            return err(format!(
                "chart kind `{other}`: use \"bar\", \"line\" or \"heatmap\""
            ))
        }
        None => return err("chart: give a kind: \"bar\", \"line\" or \"heatmap\""),
    };
    let metric = text("metric")?.unwrap_or_else(|| "server_gbs".into());
    let metric = metric_name(&metric)
        .map_or_else(
            || {
                let all: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
                let hint = suggest(&metric, all.iter().copied())
                    .map(|s| format!(": did you mean `{s}`?"))
                    .unwrap_or_default();
                err(format!("chart metric `{metric}` is unknown{hint}"))
            },
            Ok,
        )?
        .to_string();
    let (x, y, series) = (text("x")?, text("y")?, text("series")?);
    match kind {
        ChartKind::Line if x.is_none() => return err("a line chart needs x: the knob varied"),
        ChartKind::Heatmap if x.is_none() || y.is_none() => {
            return err("a heatmap needs x and y: the two knobs varied")
        }
        _ => {}
    }
    for (what, k) in [("x", &x), ("y", &y), ("series", &series)] {
        if let Some(k) = k {
            check_knob_name(what, k)?;
        }
    }
    let experiments: Vec<String> = match m.get("results") {
        None => vec![],
        Some(d) if d.is_array() => d
            .clone()
            .cast::<Array>()
            .iter()
            .filter(|r| r.is_map())
            .map(|r| {
                map_get(&r.clone().cast::<Map>(), "name")
                    .into_string()
                    .unwrap_or_default()
            })
            .collect(),
        Some(d) => {
            return err(format!(
                "chart: `results` wants an array of results, got {}",
                d.type_name()
            ))
        }
    };
    let mut s = st.borrow_mut();
    let phase = text("phase")?.or_else(|| Some(s.phase.clone()));
    let given = text("id")?;
    // The id names the chart's files: checked here, in the dry pass, not at report time.
    if let Some(id) = given.as_deref().filter(|id| {
        id.is_empty()
            || id.len() > 100
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        return err(format!(
            "chart: id `{}` may hold only letters, digits, _ and - (1 to 100 of them): it names the chart's files",
            tcpx_report::safe::comment(id)
        ));
    }
    let mut id = given.unwrap_or_else(|| slug(&title));
    if id.is_empty() {
        id = "chart".into();
    }
    let base = id.clone();
    let mut n = 2;
    while s.report.charts.iter().any(|c| c.id == id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    s.report.charts.push(ChartSpec {
        id,
        title,
        kind,
        metric,
        x,
        y,
        series,
        experiments,
        phase,
    });
    Ok(())
}

/// `best(results)`: the result with the best median, with `tied` (labels of those whose
/// interval reaches within noise of it), `identical` (the same experiment here: they differ
/// only in knobs not applied), `ranked` (false when all were the same experiment) and
/// `clear_winner`; recorded in the report's rankings.
fn best_of(st: &Shared, results: &Array, metric: &str) -> RResult<Dynamic> {
    let metric =
        metric_name(metric).map_or_else(|| err(format!("best: unknown metric `{metric}`")), Ok)?;
    let lower_is_better = metric.ends_with("_us") || metric == "wrong_bytes";
    let mut cands: Vec<(Map, FigureStats)> = Vec::new();
    for r in results {
        if r.is_unit() {
            continue;
        }
        if !r.is_map() {
            return err("best: give an array of results (from run, sweep, matrix or compare)");
        }
        let m = r.clone().cast::<Map>();
        if !map_get(&m, "ok").as_bool().unwrap_or(false) {
            continue;
        }
        if let Some(f) = figure_of(&m, metric) {
            cands.push((m, f));
        }
    }
    let Some(top_i) = (0..cands.len()).max_by(|&i, &j| {
        let (a, b) = (cands[i].1.median, cands[j].1.median);
        // Ties in the median keep the first.
        let o = if lower_is_better {
            b.total_cmp(&a)
        } else {
            a.total_cmp(&b)
        };
        o.then(j.cmp(&i))
    }) else {
        return Ok(Dynamic::UNIT);
    };
    let noise = noise_level(st);
    let (top, top_f) = cands[top_i].clone();
    let label = |m: &Map| map_get(m, "label").into_string().unwrap_or_default();
    let mut tied = Vec::new();
    let mut identical = Vec::new();
    let mut same_why = Vec::new();
    let mut methods: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (i, (m, f)) in cands.iter().enumerate() {
        if i == top_i {
            continue;
        }
        if let Some(knobs) = same_experiment(&top, m) {
            identical.push(label(m));
            same_why.push(why_same(&top, m, &knobs));
            continue;
        }
        let d = match shared_design(&top, m, top_f.n, f.n) {
            Some(design) => {
                methods.insert(design.method());
                sequential::paired(&top_f.reps, &f.reps, &design).map(|p| match p.outcome(noise) {
                    Outcome::Higher => Difference::Higher,
                    Outcome::Lower => Difference::Lower,
                    _ => Difference::Tied,
                })
            }
            None => {
                methods.insert(BOOTSTRAP_METHOD.to_string());
                stats::ratio_of_medians(&top_f.reps, &f.reps).map(|r| r.difference(noise))
            }
        };
        let worse = match d {
            Some(d) if lower_is_better => d == Difference::Higher,
            Some(d) => d == Difference::Lower,
            None => false,
        };
        if !worse {
            tied.push(label(m));
        }
    }
    let ranked = !(cands.len() > 1 && identical.len() == cands.len() - 1);
    let clear = cands.len() > 1 && tied.is_empty() && identical.is_empty();
    same_why.dedup();
    let figure = format!("{metric} {}", top_f.text(3));
    let text = if !ranked {
        format!(
            "not ranked: {} and {} are the same experiment here ({})",
            label(&top),
            identical.join(", "),
            same_why.join("; ")
        )
    } else {
        let mut t = format!("best {figure}: {}", label(&top));
        if clear {
            t.push_str(&format!(
                ", ahead of every other configuration beyond noise ({:.1}%)",
                noise * 100.0
            ));
        } else if !tied.is_empty() {
            t.push_str(&format!(
                ", tied within noise ({:.1}%) with {}: no winner among them",
                noise * 100.0,
                tied.join(", ")
            ));
        }
        if !identical.is_empty() {
            t.push_str(&format!(
                "; the same experiment here as {} ({})",
                identical.join(", "),
                same_why.join("; ")
            ));
        }
        t
    };
    {
        let mut s = st.borrow_mut();
        let phase = s.phase.clone();
        s.report.rankings.push(Ranking {
            phase,
            metric: metric.to_string(),
            best: label(&top),
            tied: tied.clone(),
            identical: identical.clone(),
            ranked,
            noise,
            text: text.clone(),
            candidates: cands.iter().map(|(m, _)| label(m)).collect(),
            method: methods.into_iter().collect::<Vec<_>>().join("; "),
        });
    }
    let mut out = top;
    let arr = |v: &[String]| Dynamic::from(v.iter().cloned().map(Dynamic::from).collect::<Array>());
    out.insert("tied".into(), arr(&tied));
    out.insert("identical".into(), arr(&identical));
    out.insert("ranked".into(), Dynamic::from(ranked));
    out.insert("clear_winner".into(), Dynamic::from(clear));
    out.insert("ranking".into(), Dynamic::from(text));
    Ok(Dynamic::from(out))
}

/// Rounds of an A/A noise measurement, at least.
const NOISE_ROUNDS: u32 = 12;

/// `measure_noise(exp)`: runs `exp` twice as an A/A comparison (repetitions interleaved) and
/// takes the spread of the ratio of the two medians (the farther end of its interval from 1)
/// as the measured noise; comparisons then use it, never less than the target set's `noise`.
fn measure_noise(st: &Shared, exp: PlanExperiment) -> RResult<f64> {
    let name = exp.name();
    let label = exp.label();
    // At least 12 rounds: the sign-test interval then reaches 95 % with the two most extreme
    // ratios on each side left out, so one disturbed round does not set the noise band.
    let rounds = exp.repeat().max(NOISE_ROUNDS);
    let arm = |i: u32| {
        let mut e = exp.clone();
        e.knobs.insert("repeat".into(), json!(rounds));
        e.knobs
            .insert("name".into(), json!(format!("{name}-aa{i}")));
        e.knobs
            .insert("label".into(), json!(format!("{label} (A/A run {i})")));
        e
    };
    let rs = run_many(st, vec![arm(1), arm(2)], false)?;
    // Recorded so that no A/A run is ever recommended as a configuration (tuned.env).
    if let Some(n) = st.borrow_mut().report.noise.as_mut() {
        n.runs.extend((1..=2).map(|i| format!("{name}-aa{i}")));
    }
    let fig = |m: &Map| {
        map_get(m, "ok")
            .as_bool()
            .unwrap_or(false)
            .then(|| figure_of(m, "server_gbs"))
            .flatten()
    };
    let (Some(a), Some(b)) = (fig(&rs[0]), fig(&rs[1])) else {
        if st.borrow().mode == Mode::Real {
            st.borrow_mut().report.notes.push(format!(
                "noise: the A/A runs of {label} did not both run; the target set's floor is used"
            ));
        }
        return Ok(noise_level(st));
    };
    // The A/A runs are pairs, round by round: the sign-test interval of their ratios at 95 %.
    let single = Design {
        max_rounds: a.n.max(1),
        looks: 1,
        first_look: 6.min(a.n.max(1)),
        per_look_level: stats::LEVEL,
    };
    let Some(r) = sequential::paired(&a.reps, &b.reps, &single) else {
        return Ok(noise_level(st));
    };
    let spread = (r.hi - 1.0).max(1.0 - r.lo).max(0.0);
    {
        let mut s = st.borrow_mut();
        s.noise_measured = Some(s.noise_measured.map_or(spread, |m| m.max(spread)));
    }
    let (used, source) = noise_choice(st);
    let mut s = st.borrow_mut();
    let floor = s.targets.noise_floor().map_or(0.0, |(f, _)| f);
    let runs = s.report.noise.take().map(|n| n.runs).unwrap_or_default();
    s.report.noise = Some(NoiseInfo {
        floor,
        runs,
        measured: s.noise_measured,
        used,
        source,
        detail: format!(
            "A/A: {label} twice, {} rounds interleaved: median ratio {:.3} [{:.3}, {:.3}] ({:.0}% sign-test interval of the paired ratios); the noise band is its farther end from 1",
            r.n, r.ratio, r.lo, r.hi, r.level * 100.0
        ),
    });
    Ok(used)
}

fn gain(a: &Dynamic, b: &Dynamic, metric: &str) -> RResult<Dynamic> {
    let metric =
        metric_name(metric).map_or_else(|| err(format!("gain: unknown metric `{metric}`")), Ok)?;
    let get = |d: &Dynamic| -> Option<f64> {
        if d.is_map() {
            as_f64(&map_get(&d.clone().cast::<Map>(), metric))
        } else {
            None
        }
    };
    Ok(match (get(a), get(b)) {
        (Some(x), Some(y)) if x > 0.0 => Dynamic::from(y / x - 1.0),
        _ => Dynamic::UNIT,
    })
}

/// The name `base.with(...)` is registered under: `with` is a reserved word in Rhai, so method
/// calls spelled `.with(` are renamed to this same-length name before compiling (positions in
/// error messages stay right).
const WITH_FN: &str = "w1th";

/// Renames `.with` method calls (outside strings and comments) to [`WITH_FN`].
pub fn desugar_with(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut last_sig: u8 = 0; // last significant byte outside strings/comments
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = src[i..].find('\n').map_or(b.len(), |n| i + n);
            out.push_str(&src[i..end]);
            i = end;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = src[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
            out.push_str(&src[i..end]);
            i = end;
            continue;
        }
        if c == b'"' || c == b'`' || c == b'\'' {
            let mut j = i + 1;
            while j < b.len() && b[j] != c {
                if b[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            let end = (j + 1).min(b.len());
            out.push_str(&src[i..end]);
            i = end;
            last_sig = c;
            continue;
        }
        if last_sig == b'.'
            && src[i..].starts_with("with")
            && !b
                .get(i + 4)
                .is_some_and(|x| x.is_ascii_alphanumeric() || *x == b'_')
        {
            out.push_str(WITH_FN);
            i += 4;
            last_sig = b'h';
            continue;
        }
        let ch = src[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        if !ch.is_whitespace() {
            last_sig = if ch.is_ascii() { ch as u8 } else { b'x' };
        }
        i += ch.len_utf8();
    }
    out
}

/// Resolves `import "name"` to `name.rhai` beside the plan, and nothing else: no paths, no
/// other directories.
struct PlanDirResolver {
    dir: PathBuf,
}

impl ModuleResolver for PlanDirResolver {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> RResult<rhai::Shared<Module>> {
        let bad = || {
            Box::new(EvalAltResult::ErrorRuntime(
                Dynamic::from(format!(
                    "cannot import `{path}`: plans may import only modules beside them, by plain name such as \"common\""
                )),
                pos,
            ))
        };
        if path.is_empty()
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad());
        }
        let file = self.dir.join(format!("{path}.rhai"));
        let text = tcpx_report::safe::read_bounded(&file, MAX_PLAN_BYTES, "a plan module")
            .map_err(|e| {
                if file.exists() {
                    Box::new(EvalAltResult::ErrorRuntime(
                        Dynamic::from(format!("cannot import `{path}`: {e:#}")),
                        pos,
                    ))
                } else {
                    bad()
                }
            })?;
        let mut ast = engine.compile(desugar_with(&text)).map_err(|e| {
            Box::new(EvalAltResult::ErrorInModule(
                path.to_string(),
                Box::new(EvalAltResult::ErrorRuntime(
                    Dynamic::from(format!(
                        "{}:{}:{}: {}",
                        file.display(),
                        e.1.line().unwrap_or(0),
                        e.1.position().unwrap_or(0),
                        e.0
                    )),
                    e.1,
                )),
                pos,
            ))
        })?;
        ast.set_source(file.display().to_string());
        let m = Module::eval_ast_as_new(Scope::new(), &ast, engine)?;
        Ok(rhai::Shared::new(m))
    }
}

fn build_engine(st: &Shared, dir: &Path, limits: Limits) -> Engine {
    let mut engine = Engine::new();
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(limits.max_call_levels);
    engine.set_max_expr_depths(limits.max_expr_depth, limits.max_expr_depth);
    engine.set_max_string_size(MAX_STRING_BYTES);
    engine.set_max_array_size(MAX_ARRAY_ITEMS);
    engine.set_max_map_size(MAX_MAP_ENTRIES);
    engine.set_max_modules(16);
    engine.disable_symbol("eval");
    engine.set_module_resolver(PlanDirResolver {
        dir: dir.to_path_buf(),
    });
    {
        let st = st.clone();
        engine.on_print(move |s| {
            st.borrow_mut().report.notes.push(s.to_string());
        });
    }
    engine.on_debug(|_, _, _| {});
    engine.register_type_with_name::<Exp>("Experiment");
    engine.register_fn("to_string", |e: &mut Exp| {
        format!("experiment {} ({})", e.0.name(), e.0.label())
    });
    engine.register_fn("to_debug", |e: &mut Exp| format!("{:?}", e.0.knobs));
    engine.register_indexer_get(|e: &mut Exp, k: &str| -> RResult<Dynamic> {
        match e.0.knobs.get(k) {
            Some(v) => Ok(to_dynamic(v)),
            None if k == "label" => Ok(Dynamic::from(e.0.label())),
            None => {
                let hint = suggest(k, knob_names())
                    .map(|s| format!(": did you mean `{s}`?"))
                    .unwrap_or_default();
                err(format!("unknown knob `{k}`{hint}"))
            }
        }
    });
    engine.register_get("name", |e: &mut Exp| e.0.name());
    engine.register_get("label", |e: &mut Exp| e.0.label());

    {
        let st = st.clone();
        engine.register_fn("experiment", move |m: Map| -> RResult<Exp> {
            let base = st.borrow().targets.base.clone();
            let mut e = PlanExperiment::defaults();
            for (k, v) in &base {
                e.set(k, v).map_or_else(|x| err(x.to_string()), Ok)?;
            }
            for (k, v) in &m {
                let j = to_json(v).map_or_else(|x| err(format!("knob `{k}`: {x}")), Ok)?;
                e.set(k, &j).map_or_else(|x| err(x.to_string()), Ok)?;
            }
            Ok(Exp(e))
        });
    }
    engine.register_fn(WITH_FN, |e: &mut Exp, m: Map| -> RResult<Exp> {
        with(&e.0, &m).map(Exp).map_or_else(err, Ok)
    });
    {
        let st = st.clone();
        engine.register_fn("estimate_s", move |e: Exp| -> f64 {
            estimate_s(&st.borrow().targets, &e.0)
        });
    }
    for arity in [1usize, 2] {
        let st = st.clone();
        let f = move |name: &str, desc: &str| {
            let mut s = st.borrow_mut();
            if !s.report.phases.iter().any(|p| p.name == name) {
                s.report.phases.push(PhaseInfo {
                    name: name.to_string(),
                    description: desc.to_string(),
                });
            }
            s.phase = name.to_string();
        };
        if arity == 1 {
            engine.register_fn("phase", move |name: &str| f(name, ""));
        } else {
            engine.register_fn("phase", f);
        }
    }
    {
        let st = st.clone();
        engine.register_fn("run", move |e: Exp| -> RResult<Map> {
            run_many(&st, vec![e.0], false).map(|mut v| v.pop().unwrap_or_default())
        });
    }
    {
        let st = st.clone();
        engine.register_fn("compare", move |exps: Array| -> RResult<Array> {
            let exps = exps
                .into_iter()
                .map(|d| {
                    let t = d.type_name();
                    d.try_cast::<Exp>().map(|e| e.0).map_or_else(
                        || {
                            err(format!(
                                "compare: give an array of experiments, got a {t} in it"
                            ))
                        },
                        Ok,
                    )
                })
                .collect::<RResult<Vec<_>>>()?;
            if exps.is_empty() {
                return err("compare: give at least one experiment");
            }
            if exps.len() > MAX_CONFIGURATIONS {
                return err(format!(
                    "compare: {} experiments, more than the limit of {MAX_CONFIGURATIONS} per call",
                    exps.len()
                ));
            }
            Ok(run_many(&st, exps, true)?
                .into_iter()
                .map(Dynamic::from)
                .collect())
        });
    }
    {
        let st = st.clone();
        engine.register_fn("validate", move || -> Dynamic { validate_tuned(&st) });
    }
    {
        let st = st.clone();
        engine.register_fn("not_applied_here", move |e: Exp| -> Map {
            let runner = st.borrow().runner.clone();
            let mut m = Map::new();
            if let Some(r) = runner {
                for (k, v) in r.borrow().not_applied(&e.0) {
                    m.insert(k.into(), Dynamic::from(v));
                }
            }
            m
        });
    }

    {
        let st = st.clone();
        engine.register_fn(
            "sweep",
            move |base: Exp, knob: &str, values: Array| -> RResult<Array> {
                if values.is_empty() {
                    return err(format!("sweep over `{knob}` has no values"));
                }
                if values.len() > MAX_CONFIGURATIONS {
                    return err(format!(
                        "sweep over `{knob}`: {} values, more than the limit of {MAX_CONFIGURATIONS} configurations per call (split it)",
                        values.len()
                    ));
                }
                let exps = values
                    .iter()
                    .map(|v| {
                        let mut m = Map::new();
                        m.insert(knob.into(), v.clone());
                        with(&base.0, &m).map_or_else(|x| err(format!("sweep: {x}")), Ok)
                    })
                    .collect::<RResult<Vec<_>>>()?;
                Ok(run_many(&st, exps, true)?
                    .into_iter()
                    .map(Dynamic::from)
                    .collect())
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn("matrix", move |base: Exp, axes: Map| -> RResult<Array> {
            // The number of combinations first, so that a huge one is refused unbuilt.
            let mut count: usize = 1;
            for (k, vals) in &axes {
                let n = vals.read_lock::<Array>().map(|a| a.len()).unwrap_or(1);
                count = count.saturating_mul(n.max(1));
                if n == 0 {
                    return err(format!("matrix: `{k}` has no values"));
                }
            }
            if count > MAX_CONFIGURATIONS {
                let sizes: Vec<String> = axes
                    .iter()
                    .map(|(k, v)| {
                        let n = v.read_lock::<Array>().map(|a| a.len()).unwrap_or(1);
                        format!("{k}: {n}")
                    })
                    .collect();
                return err(format!(
                    "matrix: {count} combinations ({}), more than the limit of {MAX_CONFIGURATIONS} configurations per call: split the matrix or fix some knobs",
                    sizes.join(" x ")
                ));
            }
            let mut combos: Vec<Map> = vec![Map::new()];
            for (k, vals) in &axes {
                if !vals.is_array() {
                    return err(format!("matrix: `{k}` wants an array of values"));
                }
                let vals = vals.clone().cast::<Array>();
                if vals.is_empty() {
                    return err(format!("matrix: `{k}` has no values"));
                }
                combos = combos
                    .into_iter()
                    .flat_map(|c| {
                        vals.iter().map(move |v| {
                            let mut c = c.clone();
                            c.insert(k.clone(), v.clone());
                            c
                        })
                    })
                    .collect();
            }
            let exps = combos
                .iter()
                .map(|c| with(&base.0, c).map_or_else(|x| err(format!("matrix: {x}")), Ok))
                .collect::<RResult<Vec<_>>>()?;
            Ok(run_many(&st, exps, true)?
                .into_iter()
                .map(Dynamic::from)
                .collect())
        });
    }
    engine.register_fn("fmt", |x: Dynamic, digits: i64| -> String {
        match as_f64(&x) {
            Some(v) => format!("{v:.*}", digits.clamp(0, 12) as usize),
            None => "n/a".into(),
        }
    });
    engine.register_fn("pct", |x: Dynamic| -> String {
        match as_f64(&x) {
            Some(v) => format!("{:+.1}%", v * 100.0),
            None => "n/a".into(),
        }
    });
    {
        let st = st.clone();
        engine.register_fn("best", move |r: Array| best_of(&st, &r, "server_gbs"));
    }
    {
        let st = st.clone();
        engine.register_fn("best", move |r: Array, metric: &str| {
            best_of(&st, &r, metric)
        });
    }
    {
        let st = st.clone();
        engine.register_fn("gain_ci", move |a: Dynamic, b: Dynamic| {
            gain_ci(&st, &a, &b, "server_gbs")
        });
    }
    {
        let st = st.clone();
        engine.register_fn("gain_ci", move |a: Dynamic, b: Dynamic, metric: &str| {
            gain_ci(&st, &a, &b, metric)
        });
    }
    engine.register_fn(
        "holds",
        |x: Dynamic, op: &str, t: Dynamic| -> RResult<Dynamic> {
            let t = as_f64(&t).map_or_else(|| err("holds: the threshold must be a number"), Ok)?;
            let t = finite_threshold("holds", t).map_or_else(err, Ok)?;
            holds(&x, op, t)
        },
    );
    engine.register_fn("significant", |x: Dynamic| -> RResult<Dynamic> {
        if x.is_unit() {
            return Ok(Dynamic::UNIT);
        }
        if !is_estimate(&x) {
            return err(format!(
                "significant: give an estimate from gain_ci or (), got {}",
                x.type_name()
            ));
        }
        Ok(map_get(&x.cast::<Map>(), "significant"))
    });
    {
        let st = st.clone();
        engine.register_fn("noise", move || noise_level(&st));
    }
    {
        let st = st.clone();
        engine.register_fn("measure_noise", move |e: Exp| -> RResult<f64> {
            measure_noise(&st, e.0)
        });
    }
    engine.register_fn("gain", |a: Dynamic, b: Dynamic| gain(&a, &b, "server_gbs"));
    engine.register_fn("gain", |a: Dynamic, b: Dynamic, metric: &str| {
        gain(&a, &b, metric)
    });
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |text: &str, what: Dynamic| -> RResult<bool> {
                if what.is_map() {
                    return criterion_on_result(&st, text, &what.cast::<Map>());
                }
                let (verdict, detail) = if let Ok(b) = what.as_bool() {
                    (if b { Verdict::Pass } else { Verdict::Fail }, String::new())
                } else if what.is_unit() {
                    (
                        Verdict::NotEvaluated,
                        "no value: what it needs did not run here".to_string(),
                    )
                } else {
                    return err(format!(
                        "criterion `{text}`: give a result map, true/false, or (); got {}",
                        what.type_name()
                    ));
                };
                Ok(push_criterion(
                    &st,
                    CriterionResult::plain(text, verdict, detail),
                ))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn(
            "criterion",
            move |text: &str, actual: Dynamic, op: &str, threshold: Dynamic| -> RResult<bool> {
                let t = as_f64(&threshold).map_or_else(
                    || {
                        err(format!(
                            "criterion `{text}`: the threshold must be a number"
                        ))
                    },
                    Ok,
                )?;
                let t = finite_threshold(text, t).map_or_else(err, Ok)?;
                let c = match as_f64(&actual) {
                    // 0.0 / 0.0 and the like: not a value to judge.
                    Some(a) if !a.is_finite() => CriterionResult {
                        threshold: Some(t),
                        ..CriterionResult::plain(
                            text,
                            Verdict::NotEvaluated,
                            format!("the value is {a}, not a finite number: nothing to judge"),
                        )
                    },
                    Some(a) => CriterionResult {
                        actual: Some(a),
                        threshold: Some(t),
                        ..CriterionResult::plain(
                            text,
                            if compare(a, op, t).map_or_else(err, Ok)? {
                                Verdict::Pass
                            } else {
                                Verdict::Fail
                            },
                            String::new(),
                        )
                    },
                    None if is_estimate(&actual) => {
                        criterion_on_estimate(text, &actual.cast::<Map>(), op, t)?
                    }
                    None if actual.is_unit() => CriterionResult {
                        threshold: Some(t),
                        ..CriterionResult::plain(
                            text,
                            Verdict::NotEvaluated,
                            "no value: what it needs did not run here".into(),
                        )
                    },
                    None => {
                        return err(format!(
                            "criterion `{text}`: the value must be a number or (), got {}",
                            actual.type_name()
                        ))
                    }
                };
                Ok(push_criterion(&st, c))
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn("not_evaluated", move |text: &str, why: &str| {
            push_criterion(
                &st,
                CriterionResult::plain(text, Verdict::NotEvaluated, why.into()),
            );
        });
    }
    {
        let st = st.clone();
        engine.register_fn(
            "decision",
            move |name: &str,
                  question: &str,
                  answer: Dynamic,
                  yes: &str,
                  no: &str|
                  -> RResult<bool> {
                let a = if answer.is_unit() {
                    None
                } else {
                    Some(answer.as_bool().map_or_else(
                        |t| {
                            err(format!(
                                "decision `{name}`: the answer must be true, false or (), got {t}"
                            ))
                        },
                        Ok,
                    )?)
                };
                let taken = a.unwrap_or(false);
                let mut s = st.borrow_mut();
                let phase = s.phase.clone();
                s.report.decisions.push(DecisionRecord {
                    phase,
                    name: name.into(),
                    question: question.into(),
                    answer: a,
                    branch_taken: if taken { yes } else { no }.into(),
                    branch_not_taken: if taken { no } else { yes }.into(),
                    detail: if a.is_none() {
                        format!("UNANSWERED: what it needs was not measured here or its interval was inconclusive; the plan follows its default branch: {no}")
                    } else {
                        String::new()
                    },
                });
                Ok(taken)
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn("chart", move |m: Map| chart(&st, &m));
    }
    {
        let st = st.clone();
        engine.register_fn("note", move |t: &str| {
            st.borrow_mut().report.notes.push(t.to_string());
        });
    }
    {
        let st = st.clone();
        engine.register_fn("platform", move || -> String {
            detect_platform(&st.borrow().facts).to_string()
        });
    }
    {
        let st = st.clone();
        engine.register_fn("targets_name", move || -> String {
            st.borrow().targets.name.clone()
        });
    }
    {
        let st = st.clone();
        engine.register_fn("target", move |key: &str| -> RResult<Dynamic> {
            let s = st.borrow();
            if let Some(v) = s.targets.thresholds.get(key) {
                return Ok(Dynamic::from(*v));
            }
            if let Some(v) = s.targets.settings.get(key) {
                return Ok(to_dynamic(v));
            }
            let hint = suggest(key, s.targets.keys())
                .map(|k| format!(": did you mean `{k}`?"))
                .unwrap_or_default();
            err(format!(
                "target set `{}` has no `{key}`{hint} (use has_target(\"{key}\") for optional ones)",
                s.targets.name
            ))
        });
    }
    {
        let st = st.clone();
        engine.register_fn("has_target", move |key: &str| -> bool {
            let s = st.borrow();
            s.targets.thresholds.contains_key(key) || s.targets.settings.contains_key(key)
        });
    }
    {
        let st = st.clone();
        engine.register_fn("topology", move || -> Dynamic {
            to_dynamic(&serde_json::to_value(&st.borrow().facts).unwrap_or(Value::Null))
        });
    }
    {
        let st = st.clone();
        engine.register_fn("nics", move || -> Array {
            st.borrow()
                .facts
                .nics
                .iter()
                .map(|n| to_dynamic(&serde_json::to_value(n).unwrap_or(Value::Null)))
                .collect()
        });
    }
    {
        let st = st.clone();
        engine.register_fn("irq_state", move |nic: &str| -> RResult<Array> {
            let s = st.borrow();
            match s.facts.nics.iter().find(|n| n.name == nic) {
                Some(n) => Ok(n
                    .irqs
                    .iter()
                    .map(|i| to_dynamic(&serde_json::to_value(i).unwrap_or(Value::Null)))
                    .collect()),
                None => {
                    let names: Vec<&str> = s.facts.nics.iter().map(|n| n.name.as_str()).collect();
                    let hint = suggest(nic, names.iter().copied())
                        .map(|k| format!(": did you mean `{k}`?"))
                        .unwrap_or_default();
                    err(format!(
                        "no NIC `{nic}` on this machine{hint} (NICs: {})",
                        names.join(", ")
                    ))
                }
            }
        });
    }
    {
        let st = st.clone();
        engine.register_fn("bindings", move || -> Map {
            let s = st.borrow();
            let mut m = Map::new();
            m.insert("tx".into(), Dynamic::from(s.facts.tx_bindings.clone()));
            m.insert("rx".into(), Dynamic::from(s.facts.rx_bindings.clone()));
            m
        });
    }
    {
        let st = st.clone();
        engine.register_fn("is_root", move || st.borrow().facts.is_root);
    }
    {
        let st = st.clone();
        engine.register_fn("require_root", move |why: &str| -> RResult<()> {
            if st.borrow().facts.is_root {
                Ok(())
            } else {
                err(format!(
                    "this plan needs root to {why}: run it with sudo (or as a user with CAP_SYS_ADMIN over /proc/irq); see docs/A3_SETUP.md"
                ))
            }
        });
    }
    engine
}

/// Formats a Rhai error as `file:line:column: message`.
fn script_error(file: &str, e: &EvalAltResult) -> String {
    script_error_raw(file, e).replace(WITH_FN, "with")
}

fn script_error_raw(file: &str, e: &EvalAltResult) -> String {
    if let EvalAltResult::ErrorTooManyOperations(pos) = e {
        return format!(
            "{file}:{}:{}: the plan ran past its operation limit (an endless loop?); raise --max-operations if it is really that long",
            pos.line().unwrap_or(0),
            pos.position().unwrap_or(0)
        );
    }
    // The innermost position is the most useful one (inside a called function or module).
    let mut pos = e.position();
    let mut inner = e;
    let mut src = None;
    loop {
        match inner {
            EvalAltResult::ErrorInFunctionCall(_, s, i, _) => {
                if !s.is_empty() {
                    src = Some(s.clone());
                }
                inner = i;
                if !inner.position().is_none() && src.is_none() {
                    pos = inner.position();
                }
            }
            EvalAltResult::ErrorInModule(_, i, _) => {
                inner = i;
            }
            _ => break,
        }
    }
    let msg = match e {
        EvalAltResult::ErrorRuntime(d, _) => d.to_string(),
        other => {
            let t = other.to_string();
            // Rhai appends " (line L, position P)"; the prefix has it already.
            match t.rfind(" (line ") {
                Some(i) => t[..i].to_string(),
                None => t,
            }
        }
    };
    match src {
        Some(s) => format!(
            "{file}:{}:{}: {msg} (in {s})",
            pos.line().unwrap_or(0),
            pos.position().unwrap_or(0)
        ),
        None => format!(
            "{file}:{}:{}: {msg}",
            pos.line().unwrap_or(0),
            pos.position().unwrap_or(0)
        ),
    }
}

/// What one pass gives: the report, the estimate (typical, worst case) in seconds, the
/// experiment names in order and the runner calls.
type PassResult = (RunReport, (f64, f64), Vec<String>, usize);

/// A plan file, read and compiled.
pub struct Plan {
    pub path: PathBuf,
    /// File stem.
    pub name: String,
    source: String,
    pub limits: Limits,
    /// `--budget` in seconds: sequential comparisons stop adding rounds once the run used it.
    pub budget_s: Option<f64>,
}

struct DryRunner {
    facts: SystemFacts,
    support: Option<KnobSupport>,
}

impl Runner for DryRunner {
    fn facts(&self) -> &SystemFacts {
        &self.facts
    }
    fn run(&mut self, _: &PlanExperiment, _: &str, _: f64) -> RunOutcome {
        RunOutcome::default()
    }
    fn not_applied(&self, exp: &PlanExperiment) -> BTreeMap<String, String> {
        self.support.as_ref().map(|f| f(exp)).unwrap_or_default()
    }
}

impl Plan {
    /// Reads `path`; syntax is checked by [`Plan::estimate`] and [`Plan::execute`].
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let source =
            tcpx_report::safe::read_bounded(path, MAX_PLAN_BYTES, "a plan").map_err(|e| {
                PlanError::Setup(format!(
                "cannot read plan {}: {e:#} (plans live in plans/, e.g. plans/phase1_window.rhai)",
                path.display()
            ))
            })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plan".into());
        Ok(Plan {
            path: path.to_path_buf(),
            name,
            source,
            limits: Limits::default(),
            budget_s: None,
        })
    }

    /// From text (tests); `dir` is where imports are looked up.
    pub fn from_source(name: &str, dir: &Path, source: &str) -> Plan {
        Plan {
            path: dir.join(format!("{name}.rhai")),
            name: name.into(),
            source: source.into(),
            limits: Limits::default(),
            budget_s: None,
        }
    }

    fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }

    fn file(&self) -> String {
        self.path.display().to_string()
    }

    fn go(
        &self,
        mode: Mode,
        runner: Option<Rc<RefCell<dyn Runner>>>,
        facts: SystemFacts,
        targets: &TargetSet,
        on_update: Box<dyn FnMut(&RunReport)>,
    ) -> Result<PassResult, PlanError> {
        let report = RunReport {
            plan: self.name.clone(),
            plan_path: self.file(),
            stamp: tcpx_report::utc_stamp(),
            started_utc: tcpx_report::utc_now_iso(),
            finished_utc: String::new(),
            platform: detect_platform(&facts).into(),
            targets: targets.name.clone(),
            setup: BTreeMap::new(),
            phases: vec![],
            records: vec![],
            samples: vec![],
            criteria: vec![],
            decisions: vec![],
            charts: vec![],
            notes: vec![],
            completion: Completion::Complete,
            rankings: vec![],
            noise: Some(NoiseInfo {
                floor: targets.noise_floor().map_or(0.0, |(f, _)| f),
                measured: None,
                used: targets.thresholds.get("noise").copied().unwrap_or(0.0),
                source: format!(
                    "the target set's default {:.1}%: this run measured no A/A (measure_noise)",
                    targets.thresholds.get("noise").copied().unwrap_or(0.0) * 100.0
                ),
                detail: "the plan did not measure an A/A spread: the target set's `noise` is used"
                    .into(),
                runs: vec![],
            }),
            sequential: vec![],
            summaries: vec![],
        };
        let st: Shared = Rc::new(RefCell::new(State {
            mode,
            runner,
            facts,
            targets: targets.clone(),
            report,
            phase: String::new(),
            t0: Instant::now(),
            est_s: 0.0,
            worst_s: 0.0,
            budget_s: self.budget_s,
            comparisons: 0,
            names: HashSet::new(),
            next_suffix: HashMap::new(),
            order: vec![],
            runs: 0,
            done_runs: 0,
            noise_measured: None,
            fatal: None,
            on_update,
        }));
        let engine = build_engine(&st, &self.dir(), self.limits);
        let ast = engine.compile(desugar_with(&self.source)).map_err(|e| {
            PlanError::Script(format!(
                "{}:{}:{}: syntax error: {}",
                self.file(),
                e.1.line().unwrap_or(0),
                e.1.position().unwrap_or(0),
                e.0
            ))
        })?;
        let result = engine.run_ast_with_scope(&mut Scope::new(), &ast);
        drop(engine);
        let mut s = st.borrow_mut();
        let mut report = s.report.clone();
        report.finished_utc = tcpx_report::utc_now_iso();
        match (result, &s.fatal) {
            (_, Some(f)) => report.completion = Completion::Incomplete(f.clone()),
            (Ok(()), None) => report.completion = Completion::Complete,
            (Err(e), None) => {
                let msg = script_error(&self.file(), &e);
                if mode == Mode::Dry || report.records.is_empty() {
                    return Err(PlanError::Script(msg));
                }
                report.completion = Completion::Incomplete(msg);
            }
        }
        let est = (s.est_s, s.worst_s);
        let order = std::mem::take(&mut s.order);
        Ok((report, est, order, s.runs))
    }

    /// Runs the plan without running experiments: checks every knob, criterion and chart it
    /// reaches and adds up the estimated time. Decisions take their `no` branch.
    pub fn estimate(
        &self,
        facts: &SystemFacts,
        targets: &TargetSet,
    ) -> Result<Estimate, PlanError> {
        self.estimate_with(facts, targets, None)
    }

    /// [`Plan::estimate`] with `support` answering `not_applied_here(exp)` as the real runner
    /// will, so the dry pass takes the same branches.
    pub fn estimate_with(
        &self,
        facts: &SystemFacts,
        targets: &TargetSet,
        support: Option<KnobSupport>,
    ) -> Result<Estimate, PlanError> {
        let dry: Rc<RefCell<dyn Runner>> = Rc::new(RefCell::new(DryRunner {
            facts: facts.clone(),
            support,
        }));
        let (_, (seconds, worst_seconds), names, runs) = self.go(
            Mode::Dry,
            Some(dry),
            facts.clone(),
            targets,
            Box::new(|_| {}),
        )?;
        Ok(Estimate {
            experiments: names.len(),
            runs,
            seconds,
            worst_seconds,
            names,
        })
    }

    /// [`Plan::estimate`], refused with a message when it exceeds `budget_s` unless `yes`.
    pub fn check_budget(
        &self,
        facts: &SystemFacts,
        targets: &TargetSet,
        budget_s: Option<f64>,
        yes: bool,
    ) -> Result<Estimate, PlanError> {
        self.check_budget_with(facts, targets, budget_s, yes, None)
    }

    /// [`Plan::check_budget`] with a [`KnobSupport`] for the dry pass.
    pub fn check_budget_with(
        &self,
        facts: &SystemFacts,
        targets: &TargetSet,
        budget_s: Option<f64>,
        yes: bool,
        support: Option<KnobSupport>,
    ) -> Result<Estimate, PlanError> {
        if let Some(b) = budget_s.filter(|b| !(b.is_finite() && *b >= 0.0)) {
            return Err(PlanError::Setup(format!(
                "--budget {b}: give 0 or more seconds"
            )));
        }
        let est = self.estimate_with(facts, targets, support)?;
        if let Some(b) = budget_s {
            if est.seconds > b && !yes {
                return Err(PlanError::Budget(format!(
                    "plan {} would run about {:.0} s ({} experiments, {} runs with their repetitions, estimated at {} GB/s from target set `{}`), more than --budget {b:.0} s: pass --yes to run it anyway, or a larger --budget",
                    self.file(),
                    est.seconds,
                    est.experiments,
                    est.runs,
                    targets.estimate_gbs,
                    targets.name
                )));
            }
        }
        Ok(est)
    }

    /// Runs the plan with `runner`; `on_update` sees the report after every experiment (to
    /// write it out, so an interrupted run keeps its results). A script error before any
    /// experiment ran is an `Err`; later ones end the report as incomplete.
    pub fn execute(
        &self,
        runner: Rc<RefCell<dyn Runner>>,
        targets: &TargetSet,
        on_update: Box<dyn FnMut(&RunReport)>,
    ) -> Result<RunReport, PlanError> {
        let facts = runner.borrow().facts().clone();
        let (mut report, _, _, _) =
            self.go(Mode::Real, Some(runner), facts.clone(), targets, on_update)?;
        if !facts.peer.is_empty() {
            report.setup.insert("follower".into(), facts.peer.clone());
        }
        report.setup.insert("host".into(), facts.hostname.clone());
        for w in &facts.warnings {
            report.notes.push(format!("system: {w}"));
        }
        Ok(report)
    }
}
