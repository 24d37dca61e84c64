//! Running experiments: `phase`, `run`, `compare`, `sweep` and `matrix`, the result maps
//! scripts get back, and sequential comparisons that add rounds until they are decided.

use std::collections::BTreeMap;
use std::time::Instant;

use rhai::{Array, Dynamic, Engine, Map};
use serde::Serialize;
use tcpx_report::sequential::{self, Design, Outcome, SequentialRecord, StopReason};
use tcpx_report::{stats, Completion, FigureStats, PhaseInfo, ResultRecord, Status, METRICS};

use super::experiments::{estimate_s, with_knobs};
use super::figures::{figure_of, noise_level, same_experiment};
use super::values::{err, map_get, to_dynamic, RResult};
use super::{Mode, Shared, MAX_CONFIGURATIONS, MAX_PLAN_EXPERIMENTS};
use crate::knobs::PlanExperiment;
use crate::system::RunOutcome;

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[
    ("phase", 1),
    ("phase", 2),
    ("run", 1),
    ("compare", 1),
    ("sweep", 3),
    ("matrix", 2),
];

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

/// A metric's statistics as scripts see them (`r.stats.server_gbs.lo`).
#[derive(Serialize)]
struct StatsView<'a> {
    median: f64,
    lo: f64,
    hi: f64,
    min: f64,
    max: f64,
    n: usize,
    level: f64,
    reps: &'a [f64],
}

pub(super) fn stats_map(f: &FigureStats) -> Dynamic {
    to_dynamic(&StatsView {
        median: f.median,
        lo: f.ci95_lo,
        hi: f.ci95_hi,
        min: f.min,
        max: f.max,
        n: f.n,
        level: f.level,
        reps: &f.reps,
    })
}

/// One flow's (GPU's) figures in a result's `per_flow`.
#[derive(Serialize)]
struct FlowView {
    flow: u32,
    server_gbs: f64,
    client_gbs: f64,
}

/// The result map a script sees for one experiment: every metric is the median over the
/// repetitions that ran (largest message size), `stats` holds each metric's interval and
/// repetitions, `reps` each repetition's figures.
pub(super) fn result_map(
    exp: &PlanExperiment,
    phase: &str,
    records: &[ResultRecord],
    dry: bool,
) -> Map {
    let mut m = Map::new();
    let mains = main_per_rep(records);
    let (ok, bad) = tcpx_report::split_by_outcome(&mains);
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
    let reason = bad.and_then(|r| tcpx_report::repetition_reason(r, mains.len()));
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
    m.insert("knobs".into(), to_dynamic(&exp.knobs()));
    let mut na: BTreeMap<&str, &str> = BTreeMap::new();
    for r in &mains {
        for (k, v) in &r.not_applied {
            na.entry(k.name()).or_insert(v.as_str());
        }
    }
    m.insert("not_applied".into(), to_dynamic(&na));
    // Per flow (GPU) figures of the largest size, medians over the repetitions:
    // [#{ flow, server_gbs, client_gbs }, ...].
    let per_flow: Vec<FlowView> = ok
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
                    FlowView {
                        flow: f.flow,
                        server_gbs: pick(|p| p.recv_gbs),
                        client_gbs: pick(|p| p.send_gbs),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    m.insert("per_flow".into(), to_dynamic(&per_flow));
    let no_plan = BTreeMap::new();
    let nic_plan = mains.first().map_or(&no_plan, |r| &r.nic_plan);
    m.insert("nic_plan".into(), to_dynamic(nic_plan));
    m
}

/// [`run_many`] of `exps` as a sequential comparison (`compare`, `sweep`, `matrix`): the results
/// as the script's array.
fn compared(st: &Shared, exps: Vec<PlanExperiment>) -> RResult<Array> {
    Ok(run_many(st, exps, true)?
        .into_iter()
        .map(Dynamic::from)
        .collect())
}

/// Runs `exps` as one comparison: each `repeat` times, repetition `r` in the order rotated
/// by `r` (A B C, B C A, C A B, ...) so that drift over time reaches every configuration alike.
/// The runner is called once per repetition; results keep every repetition.
pub(super) fn run_many(
    st: &Shared,
    exps: Vec<PlanExperiment>,
    sequential: bool,
) -> RResult<Vec<Map>> {
    let mut exps = exps;
    let sequential = sequential && exps.len() >= 2;
    let (mode, phase, runner) = {
        let mut s = st.borrow_mut();
        start_phase(&mut s)?;
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
            exp.rename(name);
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
    if runner.is_none() {
        return err("no runner is attached to this plan run");
    }
    let k = exps.len();
    let rounds = exps.iter().map(PlanExperiment::repeat).max().unwrap_or(1);
    let (max_rounds, max_s, cmp_id) = {
        let mut s = st.borrow_mut();
        if sequential {
            s.comparisons += 1;
        }
        (
            s.targets.max_rounds().max(rounds),
            s.targets.max_comparison_s(),
            if sequential { s.comparisons } else { 0 },
        )
    };
    let mut cmp = Comparison {
        id: cmp_id,
        exps,
        phase,
        records: vec![Vec::new(); k],
        ended: vec![false; k],
        rounds: 0,
        design: Design::new(max_rounds as usize),
        max_rounds,
        max_s,
        seconds: 0.0,
    };
    let t_cmp = Instant::now();
    let mut stopped: Option<(StopReason, String)> = None;
    loop {
        if cmp.rounds >= rounds {
            if !sequential {
                break;
            }
            // A look: every pair decided, nothing left to decide, or the budget used up.
            let (reason, why) = look(st, &cmp.exps, &cmp.phase, &cmp.records, &cmp.design);
            if let Some(r) = reason {
                stopped = Some((r, why));
                break;
            }
            if let Some(out) = cmp.budget_out(st, t_cmp) {
                stopped = Some((StopReason::Budget, format!("{out} ran out: {why}")));
                break;
            }
        }
        cmp.round(st, sequential)?;
    }
    cmp.seconds += t_cmp.elapsed().as_secs_f64();
    if let Some((stop, why)) = stopped {
        st.borrow_mut()
            .report
            .sequential
            .push(cmp.record(stop, why));
    }
    let out = cmp
        .exps
        .iter()
        .zip(&cmp.records)
        .map(|(e, r)| cmp.result(e, r))
        .collect();
    if sequential {
        // Kept so that a criterion or decision on two of its configurations can add rounds.
        st.borrow_mut().open.insert(cmp_id, cmp);
    }
    Ok(out)
}

/// A sequential comparison's configurations and every round they ran; kept after `compare`,
/// `sweep` or `matrix` returned, so that a criterion or decision on two of its configurations
/// that its rounds so far leave undecided can add interleaved rounds (within the same budget
/// and the same design, so the error rate is the design's, whatever is concluded at a look).
pub(super) struct Comparison {
    /// Its id in result maps (`comparison`; 0 for configurations run alone).
    id: i64,
    exps: Vec<PlanExperiment>,
    phase: String,
    records: Vec<Vec<ResultRecord>>,
    /// A repetition that was skipped or failed ends its configuration's repetitions: the result
    /// is skipped or failed whatever the others would measure, and a failure is not noise.
    ended: Vec<bool>,
    /// Rounds run so far.
    rounds: u32,
    design: Design,
    max_rounds: u32,
    max_s: f64,
    /// Seconds its rounds took so far.
    seconds: f64,
}

impl Comparison {
    /// What of its budget ran out (rounds, its seconds, or the run's `--budget`), if anything;
    /// `t` is when the current stretch of rounds began.
    fn budget_out(&self, st: &Shared, t: Instant) -> Option<String> {
        let plan_used = st.borrow().t0.elapsed().as_secs_f64();
        let budget_s = st.borrow().budget_s;
        let (max_rounds, max_s) = (self.max_rounds, self.max_s);
        if self.rounds >= max_rounds {
            Some(format!(
                "its most rounds ({max_rounds}, the target set's max_rounds)"
            ))
        } else if self.seconds + t.elapsed().as_secs_f64() >= max_s {
            Some(format!(
                "its most seconds ({max_s:.0} s, the target set's max_comparison_s)"
            ))
        } else {
            budget_s
                .filter(|b| plan_used >= *b)
                .map(|b| format!("the run's --budget ({b:.0} s)"))
        }
    }

    /// Runs one round: every configuration once, in the order rotated by the round.
    fn round(&mut self, st: &Shared, sequential: bool) -> RResult<()> {
        let Some(runner) = st.borrow().runner.clone() else {
            return err("no runner is attached to this plan run");
        };
        let rep = self.rounds;
        for i in rotation(self.exps.len(), rep as usize) {
            let exp = &self.exps[i];
            // A sequential comparison runs every configuration in every round (the largest
            // `repeat` among them first), so rounds stay pairs; otherwise each its own `repeat`.
            if (!sequential && rep >= exp.repeat()) || self.ended[i] {
                continue;
            }
            let started = st.borrow().t0.elapsed().as_secs_f64();
            let outcome: RunOutcome = runner.borrow_mut().run(exp, &self.phase, started);
            let got = record_run(st, outcome, rep + 1)?;
            self.ended[i] = got.is_empty() || got.iter().any(|r| r.status != Status::Ok);
            self.records[i].extend(got);
        }
        self.rounds += 1;
        Ok(())
    }

    /// The report's record of this comparison (or of rounds a criterion added to it).
    fn record(&self, stop: StopReason, why: String) -> SequentialRecord {
        SequentialRecord {
            phase: self.phase.clone(),
            configurations: self.exps.iter().map(PlanExperiment::label).collect(),
            rounds: self.rounds as usize,
            max_rounds: self.design.max_rounds,
            seconds: self.seconds,
            stop,
            why,
            method: self.design.method(),
        }
    }

    /// The result map of `exp` from `records`, with the comparison's id and budget when it is one.
    fn result(&self, exp: &PlanExperiment, records: &[ResultRecord]) -> Map {
        let mut m = result_map(exp, &self.phase, records, false);
        if self.id > 0 {
            m.insert("comparison".into(), Dynamic::from(self.id));
            m.insert(
                "max_rounds".into(),
                Dynamic::from(self.design.max_rounds as i64),
            );
        }
        m
    }

    /// The current result map of the configuration named `name`.
    fn result_of(&self, name: &str) -> Option<Map> {
        let i = self.exps.iter().position(|e| e.name() == name)?;
        Some(self.result(&self.exps[i], &self.records[i]))
    }
}

/// The current result maps of configurations `a` and `b` of sequential comparison `id` (with
/// every round added since the maps a script holds were made); `None` when `id` is not a
/// comparison of this run or they are not both in it.
pub(super) fn current_results(st: &Shared, id: i64, a: &str, b: &str) -> Option<(Map, Map)> {
    let s = st.borrow();
    let cmp = s.open.get(&id)?;
    Some((cmp.result_of(a)?, cmp.result_of(b)?))
}

/// Result map `m` with every round its sequential comparison has now, when it is from one.
pub(super) fn current_result(st: &Shared, m: Map) -> Map {
    let id = map_get(&m, "comparison").as_int().ok().filter(|i| *i > 0);
    let name = map_get(&m, "name").into_string().unwrap_or_default();
    id.and_then(|id| st.borrow().open.get(&id)?.result_of(&name))
        .unwrap_or(m)
}

/// Adds interleaved rounds to sequential comparison `id` until `settled` says the paired
/// interval of `metric` of `b` over `a` decides what `what` (a criterion or decision, for the
/// report) asks, or the comparison's budget runs out; records the rounds it added and why they
/// stopped. `None` when nothing could be added (no such comparison, a dry run, not both in it).
pub(super) fn extend_comparison(
    st: &Shared,
    id: i64,
    (a, b): (&str, &str),
    metric: &str,
    what: &str,
    settled: &dyn Fn(&sequential::Paired) -> bool,
) -> RResult<Option<StopReason>> {
    if st.borrow().mode == Mode::Dry || st.borrow().fatal.is_some() {
        return Ok(None);
    }
    let Some(mut cmp) = st.borrow_mut().open.remove(&id) else {
        return Ok(None);
    };
    let (Some(ia), Some(ib)) = (
        cmp.exps.iter().position(|e| e.name() == a),
        cmp.exps.iter().position(|e| e.name() == b),
    ) else {
        st.borrow_mut().open.insert(id, cmp);
        return Ok(None);
    };
    let before = cmp.rounds;
    let t = Instant::now();
    let paired_now = |cmp: &Comparison| {
        let fa = figure_of(&cmp.result(&cmp.exps[ia], &cmp.records[ia]), metric)?;
        let fb = figure_of(&cmp.result(&cmp.exps[ib], &cmp.records[ib]), metric)?;
        sequential::paired(&fa.reps, &fb.reps, &cmp.design)
    };
    let (stop, why) = loop {
        let p = paired_now(&cmp);
        let state = p.as_ref().map_or_else(
            || "no paired figures".to_string(),
            |p| {
                format!(
                    "{:.3} [{:.3}, {:.3}] after {} rounds",
                    p.ratio, p.lo, p.hi, p.n
                )
            },
        );
        if cmp.ended[ia] || cmp.ended[ib] {
            break (
                StopReason::CannotDecide,
                format!("{what}: a configuration it compares failed or was skipped ({state})"),
            );
        }
        if let Some(p) = &p {
            if p.decisive && settled(p) {
                break (StopReason::Decided, format!("{what}: decided, {state}"));
            }
        }
        if let Some(out) = cmp.budget_out(st, t) {
            break (
                StopReason::Budget,
                format!("{what}: {out} ran out, still undecided: {state}"),
            );
        }
        if let Err(e) = cmp.round(st, true) {
            cmp.seconds += t.elapsed().as_secs_f64();
            st.borrow_mut().open.insert(id, cmp);
            return Err(e);
        }
    };
    cmp.seconds += t.elapsed().as_secs_f64();
    let added = cmp.rounds - before;
    let mut s = st.borrow_mut();
    // Decided by rounds it already had (an earlier criterion added them): nothing to record.
    if added > 0 || stop != StopReason::Decided {
        let why = format!("{why} ({added} rounds added for it)");
        s.report.sequential.push(cmp.record(stop, why));
    }
    s.open.insert(id, cmp);
    Ok(Some(stop))
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

/// Refuses to go on after a fatal error, and opens the phase `main` when a plan runs
/// experiments before naming a phase.
pub(super) fn start_phase(s: &mut super::State) -> RResult<()> {
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
    Ok(())
}

/// Adds one runner call's records (as repetition `rep`) and samples to the report and shows
/// the report so far; a fatal outcome ends the run. Returns the records.
pub(super) fn record_run(st: &Shared, outcome: RunOutcome, rep: u32) -> RResult<Vec<ResultRecord>> {
    let mut s = st.borrow_mut();
    let mut got = outcome.records;
    for r in &mut got {
        r.rep = rep;
    }
    s.report.records.extend(got.iter().cloned());
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
    Ok(got)
}

/// The order of `k` configurations in repetition `rep`: rotated left by `rep`.
pub fn rotation(k: usize, rep: usize) -> Vec<usize> {
    (0..k).map(|i| (i + rep) % k.max(1)).collect()
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
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
        engine.register_fn("run", move |e: PlanExperiment| -> RResult<Map> {
            run_many(&st, vec![e], false).map(|mut v| v.pop().unwrap_or_default())
        });
    }
    {
        let st = st.clone();
        engine.register_fn("compare", move |exps: Array| -> RResult<Array> {
            let exps = exps
                .into_iter()
                .map(|d| {
                    let t = d.type_name();
                    d.try_cast::<PlanExperiment>().map_or_else(
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
            compared(&st, exps)
        });
    }

    {
        let st = st.clone();
        engine.register_fn(
            "sweep",
            move |base: PlanExperiment, knob: &str, values: Array| -> RResult<Array> {
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
                        with_knobs(&base, &m).map_or_else(|x| err(format!("sweep: {x}")), Ok)
                    })
                    .collect::<RResult<Vec<_>>>()?;
                compared(&st, exps)
            },
        );
    }
    {
        let st = st.clone();
        engine.register_fn("matrix", move |base: PlanExperiment, axes: Map| -> RResult<Array> {
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
                .map(|c| with_knobs(&base, c).map_or_else(|x| err(format!("matrix: {x}")), Ok))
                .collect::<RResult<Vec<_>>>()?;
            compared(&st, exps)
        });
    }
}
