//! The Rhai engine and the plan API registered in it. docs/PLANS.md is the reference for every
//! function. The engine is put together from a [`sandbox`] and API modules that each register
//! their own functions; [`Plan`] runs a plan through it, once without experiments (the dry
//! pass) and once for real.

mod check;
mod criteria;
mod experiments;
mod figures;
mod machine;
mod reports;
mod runs;
mod sandbox;
mod statistics;
mod tune;
mod validate;
mod values;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use rhai::{Engine, EvalAltResult, Scope};
use tcpx_report::{Completion, NoiseInfo, RunReport};

pub use check::{Check, Metric, Op, Unit};
pub use sandbox::{Limits, MAX_CONFIGURATIONS, MAX_PLAN_EXPERIMENTS};
pub use validate::VALIDATE_ESTIMATE_S;

use crate::knobs::PlanExperiment;
use crate::limits::MAX_PLAN_BYTES;
use crate::system::{KnobSupport, RunOutcome, Runner, SystemFacts};
use crate::targets::{detect_platform, TargetSet};

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
    /// Every sequential comparison so far by id, with its rounds: criteria and decisions on
    /// two of its configurations may add rounds to it.
    open: HashMap<i64, runs::Comparison>,
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

/// The plan API: the sandbox, then each module's functions, all sharing the run's state.
fn build_engine(st: &Shared, plan: &Path, limits: Limits) -> Engine {
    let mut engine = sandbox::engine(plan, limits);
    experiments::register(&mut engine, st);
    runs::register(&mut engine, st);
    statistics::register(&mut engine, st);
    criteria::register(&mut engine, st);
    reports::register(&mut engine, st);
    machine::register(&mut engine, st);
    validate::register(&mut engine, st);
    tune::register(&mut engine, st);
    engine
}

/// Formats a Rhai error as `file:line:column: message`.
fn script_error(file: &str, e: &EvalAltResult) -> String {
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
    let msg = match (e, inner) {
        (EvalAltResult::ErrorRuntime(d, _), _) => d.to_string(),
        // An error inside an imported module: its own message (which names where in the
        // module), without Rhai's wrapping.
        (EvalAltResult::ErrorInModule(..), EvalAltResult::ErrorRuntime(d, _)) => d.to_string(),
        (other, _) => {
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
    fn not_applied(&self, exp: &PlanExperiment) -> tcpx_model::NotApplied {
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

    fn file(&self) -> String {
        self.path.display().to_string()
    }

    /// The state one pass of this plan starts from: an empty report, nothing run yet.
    fn state(
        &self,
        mode: Mode,
        runner: Option<Rc<RefCell<dyn Runner>>>,
        facts: SystemFacts,
        targets: &TargetSet,
        on_update: Box<dyn FnMut(&RunReport)>,
    ) -> Shared {
        let report = RunReport {
            plan: self.name.clone(),
            plan_path: self.file(),
            stamp: tcpx_report::utc_stamp(),
            started_utc: tcpx_report::utc_now_iso(),
            finished_utc: String::new(),
            platform: detect_platform(&facts).into(),
            targets: targets.name.clone(),
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
            ..RunReport::default()
        };
        Rc::new(RefCell::new(State {
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
            open: HashMap::new(),
            names: HashSet::new(),
            next_suffix: HashMap::new(),
            order: vec![],
            runs: 0,
            done_runs: 0,
            noise_measured: None,
            fatal: None,
            on_update,
        }))
    }

    fn go(
        &self,
        mode: Mode,
        runner: Option<Rc<RefCell<dyn Runner>>>,
        facts: SystemFacts,
        targets: &TargetSet,
        on_update: Box<dyn FnMut(&RunReport)>,
    ) -> Result<PassResult, PlanError> {
        let st = self.state(mode, runner, facts, targets, on_update);
        let engine = build_engine(&st, &self.path, self.limits);
        let ast =
            sandbox::compile(&engine, &self.file(), &self.source).map_err(PlanError::Script)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    type Register = fn(&mut Engine, &Shared);
    /// (name, number of arguments) of each function a module lists.
    type Api = &'static [(&'static str, usize)];

    /// Every API module with what it should register.
    const MODULES: &[(&str, Register, Api)] = &[
        ("experiments", experiments::register, experiments::API),
        ("runs", runs::register, runs::API),
        ("statistics", statistics::register, statistics::API),
        ("criteria", criteria::register, criteria::API),
        ("reports", reports::register, reports::API),
        ("machine", machine::register, machine::API),
        ("validate", validate::register, validate::API),
        ("tune", tune::register, tune::API),
    ];

    fn state() -> Shared {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans");
        let targets = TargetSet::load(&dir.join("targets/loopback.toml")).unwrap();
        Plan::from_source("t", &dir, "").state(
            Mode::Dry,
            None,
            SystemFacts::default(),
            &targets,
            Box::new(|_| {}),
        )
    }

    /// (name, number of parameters) of every function `engine` has beyond Rhai's own, sorted.
    fn functions(engine: &Engine) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = engine
            .gen_fn_signatures(false)
            .iter()
            .map(|sig| {
                let (name, rest) = sig.split_once('(').unwrap_or((sig, ""));
                let params = rest.split_once(')').map_or("", |(p, _)| p).trim();
                let n = if params.is_empty() {
                    0
                } else {
                    params.split(',').count()
                };
                (name.to_string(), n)
            })
            .collect();
        out.sort();
        out
    }

    fn sorted(api: &[(&str, usize)]) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = api.iter().map(|(n, a)| (n.to_string(), *a)).collect();
        v.sort();
        v
    }

    #[test]
    fn each_api_module_registers_what_it_lists() {
        let st = state();
        for (name, register, api) in MODULES {
            let mut engine = Engine::new_raw();
            register(&mut engine, &st);
            assert_eq!(functions(&engine), sorted(api), "module {name}");
        }
    }

    #[test]
    fn the_engine_is_the_sandbox_and_the_modules_and_nothing_else() {
        let st = state();
        let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plans/t.rhai");
        let engine = build_engine(&st, &plan, Limits::default());
        let bare = sandbox::engine(&plan, Limits::default());
        let mut want: Vec<(String, usize)> = functions(&bare);
        for (_, _, api) in MODULES {
            want.extend(sorted(api));
        }
        want.sort();
        assert_eq!(functions(&engine), want);
        // The sandbox adds no function of its own to Rhai's.
        assert_eq!(functions(&bare), functions(&Engine::new()));
    }
}
