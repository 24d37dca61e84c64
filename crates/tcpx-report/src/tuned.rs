//! The tuning result as settings a job sets: `tuned.env` and `tuned.json` in a run directory.
//!
//! [`choose`] picks the configuration a run recommends: the best of the plan's last ranked
//! `best()`, or, when others are tied with it within noise, the cheapest of the tied set (fewer
//! channels, then fewer sockets, then fewer threads, then fewer knobs the run could not apply). Without a ranked `best()` the same rule
//! runs over everything measured: the highest median, the set tied with it (same phase and size,
//! ratio interval reaching into the noise band) and its cheapest. A/A runs (`measure_noise`) are
//! never chosen. Only knobs the plan varied and decided (they differ among the configurations
//! the choice was made from, and acted on both sides) are exported; the chosen configuration's
//! other knobs are listed as "not tuned by this plan (base value X)". [`map_knobs`] turns its knobs into the
//! environment variables NCCL, the GPUDirect-TCPX plugin, the seed benchmark and `tcpx-run bench`
//! read; knobs that no NCCL variable expresses are listed as such with the reason, never
//! invented. [`Tuned::env_text`] is `tuned.env` (every variable line with a comment giving its
//! evidence: experiment, median and interval), and [`parse_env`] reads such a file back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{refuse, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tcpx_model::equivalence::{Equivalence, How, Unless, EQUIVALENCES};
use tcpx_model::{Knob, NcclEquivalent, WorkerThreads};

use crate::record::{KnobValues, RunReport, Status, Summary};
use crate::safe::{comment, env_name, env_value, read_bounded, shell_word, yaml_string};
use crate::stats;

/// `tuned.env` and `tuned.json` larger than this are refused (a real one is a few KiB).
pub const MAX_TUNED_BYTES: u64 = 1 << 20;

/// The prefixes of every variable a tuned file sets: NCCL (and its plugins), the seed benchmark
/// and `tcpx-run bench`. `apply` and `validate` refuse a file that sets anything else (a
/// planted `LD_PRELOAD`, `PATH` or `BASH_ENV` would reach every job that evaluates it).
pub const TUNED_PREFIXES: [&str; 3] = ["NCCL_", "UCCL_TCPX_", "TCPX_"];

/// A variable a tuned file may set: a name ([`crate::safe::env_name`]) with one of
/// [`TUNED_PREFIXES`], and a value of one printable line.
pub fn check_tuned_variable(name: &str, value: &str) -> Result<()> {
    env_name(name)?;
    if !TUNED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        refuse!(
            "`{name}` is not a variable tuned files set (they set {}* only)",
            TUNED_PREFIXES.join("*, ")
        );
    }
    env_value(name, value)?;
    Ok(())
}

pub use tcpx_model::equivalence::{
    nccl_socket_split, Reader, NCCL_MAX_SOCKETS, NCCL_MAX_SOCKET_THREADS, NCCL_STEPS,
};

/// `report.setup` keys the plan runner fills so the mapping can name machine-specific values.
pub const SETUP_TX_BINDINGS: &str = "NCCL_GPUDIRECTTCPX_TX_BINDINGS";
pub const SETUP_RX_BINDINGS: &str = "NCCL_GPUDIRECTTCPX_RX_BINDINGS";
pub const SETUP_NET_PLUGIN: &str = "NCCL_NET_PLUGIN";

/// The directive line in `tuned.env` that carries the IRQ policy (not an environment variable).
pub const IRQ_DIRECTIVE: &str = "# tcpx-irq-policy:";

/// One variable of `tuned.env`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunedVariable {
    pub name: String,
    pub value: String,
    pub reader: Reader,
    /// The knob(s) it follows from, as `knob=value`.
    pub from: String,
    /// Why this value: the experiment, its median and interval.
    pub evidence: String,
}

/// A knob of the chosen configuration that no NCCL variable expresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoEquivalent {
    pub knob: String,
    pub value: String,
    pub reason: String,
}

/// The configuration a run recommends and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chosen {
    pub phase: String,
    pub experiment: String,
    pub label: String,
    pub size: Option<u64>,
    /// Bytes per request the experiment really used (the `chunk` knob resolved).
    pub chunk: Option<u64>,
    /// The figure it was ranked by, its median and interval over the repetitions.
    pub metric: String,
    pub median: f64,
    pub ci95_lo: f64,
    pub ci95_hi: f64,
    pub level: f64,
    pub n: usize,
    /// Configurations tied with the best (the cheapest of them and the best was chosen).
    pub tied_set: Vec<String>,
    /// One sentence: how it was chosen.
    pub why: String,
    /// Its knobs, as [`crate::ResultRecord::knobs`] (an object by knob name).
    pub knobs: KnobValues,
}

impl Chosen {
    /// `phase/label: metric median [lo, hi] n=N`.
    pub fn evidence(&self) -> String {
        format!(
            "{}/{}: {} {:.3} [{:.3}, {:.3}] n={} ({:.0}% interval)",
            self.phase,
            self.label,
            self.metric,
            self.median,
            self.ci95_lo,
            self.ci95_hi,
            self.n,
            self.level * 100.0
        )
    }

    fn knob_text(&self, knob: Knob) -> Option<String> {
        match self.knobs.get(&knob)? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            v => Some(v.to_string()),
        }
    }

    fn knob_u64(&self, knob: Knob) -> Option<u64> {
        self.knobs.get(&knob).and_then(Value::as_u64)
    }
}

/// What `tuned.env` and `tuned.json` hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tuned {
    pub plan: String,
    pub stamp: String,
    /// `None` when the run measured no configuration; the files then say so.
    pub chosen: Option<Chosen>,
    pub variables: Vec<TunedVariable>,
    pub no_equivalent: Vec<NoEquivalent>,
    /// The IRQ policy of the chosen configuration when it is not `default`: applied with
    /// `tcpx-run apply --irq`, not through the environment.
    pub irq_policy: Option<String>,
    /// Knobs the plan varied and decided (they differ among the configurations the choice was
    /// made from, and acted here): only their variables are exported.
    #[serde(default)]
    pub decided_knobs: Vec<String>,
    /// Knobs of the chosen configuration the plan never varied (or that did not act here):
    /// `(knob, base value)`, listed as "not tuned by this plan" and not exported.
    #[serde(default)]
    pub not_tuned: Vec<(String, String)>,
    /// IRQ CPU specs (NCCL style) the policy stands for, where the run knew them.
    #[serde(default)]
    pub irq_tx: Option<String>,
    #[serde(default)]
    pub irq_rx: Option<String>,
    pub notes: Vec<String>,
}

/// Cost of a configuration for choosing among tied ones: channels, sockets, threads, then the
/// knobs the run could not apply (a setting nothing measured is not worth recommending over an
/// equal configuration that needs no such setting).
fn cost(s: &Summary) -> (u64, u64, u64, usize) {
    let g = |k: Knob| s.knobs.get(&k).and_then(Value::as_u64).unwrap_or(1);
    let flows = g(Knob::Flows);
    let channels = g(Knob::Channels);
    let socks = g(Knob::SocksPerChannel);
    // As many threads as the backend runs per channel (a backend this build does not know
    // counts one per channel).
    let threads = s
        .knobs
        .get(&Knob::Transport)
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<tcpx_model::Backend>().ok())
        .map_or(WorkerThreads::PerChannel, |b| b.capabilities().threads)
        .of(flows * channels, socks);
    (
        flows * channels,
        flows * channels * socks,
        threads,
        s.not_applied.len(),
    )
}

/// The summary of `label` in `phase` at its largest measured size.
fn summary_of<'a>(report: &'a RunReport, phase: &str, label: &str) -> Option<&'a Summary> {
    report
        .summaries
        .iter()
        .filter(|s| s.phase == phase && s.label == label && s.status == Status::Ok)
        .max_by_key(|s| s.size.unwrap_or(0))
}

/// True for the runs of an A/A comparison (`measure_noise`): they measure noise and are never
/// recommended, even when one of them happened to measure the highest figure.
fn is_noise_run(report: &RunReport, s: &Summary) -> bool {
    report
        .noise
        .as_ref()
        .is_some_and(|n| n.runs.contains(&s.experiment))
}

/// The noise level the run judged ties with: the one it used, else its rankings', else none.
fn noise_of(report: &RunReport) -> f64 {
    report
        .noise
        .as_ref()
        .map(|n| n.used)
        .or_else(|| report.rankings.last().map(|r| r.noise))
        .unwrap_or(0.0)
}

/// Without a ranked `best()`: the highest median `metric` among the configurations that are not
/// A/A runs, and every configuration of its phase and size whose median is not below it beyond
/// noise (the interval of their ratio reaches into `1 ± noise`, as `best()` judges ties).
/// Returns the top's phase, the tied set (top first) and the sentence saying how.
fn tied_with_highest<'a>(
    report: &'a RunReport,
    metric: &str,
) -> Option<(String, Vec<&'a Summary>, String)> {
    let reps = |s: &Summary| s.figure(metric).map(|f| f.reps.clone());
    let candidates: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|s| s.status == Status::Ok && s.metric(metric).is_some())
        .filter(|s| !is_noise_run(report, s))
        .collect();
    let top = *candidates.iter().max_by(|a, b| {
        let m = |s: &Summary| s.metric(metric).unwrap_or(0.0);
        m(a).total_cmp(&m(b))
    })?;
    let noise = noise_of(report);
    let top_reps = reps(top)?;
    let mut set = vec![top];
    // Configurations that differ from the top only in knobs not applied (on either) are the
    // same experiment here: tied with it whatever their figures say.
    let same_experiment = |s: &Summary| {
        s.knobs.keys().chain(top.knobs.keys()).all(|k| {
            NOT_CONFIGURATION.contains(k)
                || s.knobs.get(k) == top.knobs.get(k)
                || s.not_applied.contains_key(k)
                || top.not_applied.contains_key(k)
        })
    };
    let (mut others, mut identical) = (0, 0);
    for s in candidates.iter().copied() {
        if std::ptr::eq(s, top) || s.phase != top.phase || s.size != top.size {
            continue;
        }
        others += 1;
        if same_experiment(s) {
            identical += 1;
            set.push(s);
            continue;
        }
        let tied = reps(s)
            .and_then(|r| stats::ratio_of_medians(&top_reps, &r))
            .is_some_and(|r| r.difference(noise) != stats::Difference::Lower);
        if tied {
            set.push(s);
        }
    }
    let skipped = report
        .summaries
        .iter()
        .filter(|s| is_noise_run(report, s))
        .count();
    let aa = if skipped > 0 {
        ", A/A runs left out"
    } else {
        ""
    };
    let labels: Vec<&str> = set.iter().map(|s| s.label.as_str()).collect();
    let how = if identical > 0 && identical + 1 == set.len() {
        format!(
            "the plan called no ranked best(): {{{}}} were the same experiment here (they differ only in knobs that were not applied), so the cheapest (fewest channels, sockets, threads, then knobs not applied) of them{aa}",
            labels.join(", ")
        )
    } else if identical > 0 {
        format!(
            "the plan called no ranked best(): the cheapest (fewest channels, sockets, threads, then knobs not applied) of the set that was the same experiment here or tied within noise ({:.1}%) with the highest median {metric} {{{}}}{aa}",
            noise * 100.0,
            labels.join(", ")
        )
    } else if others == 0 {
        format!(
            "the plan called no ranked best(): the only configuration measured at its phase and size{aa}"
        )
    } else if set.len() > 1 {
        format!(
            "the plan called no ranked best(): the cheapest (fewest channels, sockets, threads, then knobs not applied) of the set tied within noise ({:.1}%) with the highest median {metric} {{{}}}{aa}",
            noise * 100.0,
            labels.join(", ")
        )
    } else {
        format!(
            "the plan called no ranked best(): the highest median {metric}, ahead of the others beyond noise ({:.1}%){aa}",
            noise * 100.0
        )
    };
    Some((top.phase.clone(), set, how))
}

/// Knobs that are not configuration (names, labels, repetitions, sampling).
const NOT_CONFIGURATION: &[Knob] = &[Knob::Name, Knob::Label, Knob::Repeat, Knob::Sample];

/// The knobs the choice decided: those that differ among the configurations it was made from
/// (the last ranked `best()`'s candidates, else every configuration of the chosen one's phase),
/// leaving out knobs the run could not apply on either side (those compared the same
/// experiment).
fn decided_knobs(report: &RunReport, c: &Chosen) -> BTreeSet<Knob> {
    let ranking = report.rankings.iter().rev().find(|r| r.ranked);
    let pool: Vec<&Summary> = report
        .summaries
        .iter()
        .filter(|s| s.status == Status::Ok && !is_noise_run(report, s) && s.phase == c.phase)
        .filter(|s| match ranking {
            Some(r) if r.phase == c.phase && !r.candidates.is_empty() => {
                r.candidates.contains(&s.label)
            }
            _ => true,
        })
        .collect();
    let not_applied: BTreeSet<Knob> = pool
        .iter()
        .filter(|s| s.experiment == c.experiment)
        .flat_map(|s| s.not_applied.keys().copied())
        .collect();
    let mut out = BTreeSet::new();
    for s in &pool {
        for (k, v) in &s.knobs {
            // A knob that did not act on either side compared the same experiment.
            if NOT_CONFIGURATION.contains(k)
                || not_applied.contains(k)
                || s.not_applied.contains_key(k)
            {
                continue;
            }
            if c.knobs.get(k) != Some(v) {
                out.insert(*k);
            }
        }
    }
    out
}

/// The knobs a variable follows from: `from` reads `knob=value` or `a=1 x b=2`.
fn from_knobs(from: &str) -> Vec<String> {
    from.split(" x ")
        .filter_map(|part| part.split_once('=').map(|(k, _)| k.trim().to_string()))
        .collect()
}

/// How the plan API's `tune()` names the ranking it records: tuned.env's "why" line then gives
/// the search's own decision.
pub const TUNE_RANKING_METHOD: &str = "tune race";

/// The configuration a run recommends (see the module doc); `None` when nothing ran.
/// `report.summaries` must be filled (as [`crate::write_run`] does).
pub fn choose(report: &RunReport) -> Option<Chosen> {
    let ranking = report.rankings.iter().rev().find(|r| r.ranked);
    let ranked = ranking.and_then(|r| {
        let mut labels = vec![r.best.clone()];
        labels.extend(r.tied.iter().cloned());
        let members: Vec<&Summary> = labels
            .iter()
            .filter_map(|l| summary_of(report, &r.phase, l))
            .filter(|s| !is_noise_run(report, s))
            .collect();
        let how = if r.method.starts_with(TUNE_RANKING_METHOD) {
            // tune() recorded its own decision: its text says how the race ended.
            r.text.clone()
        } else if members.len() < 2 {
            format!(
                "the best of the last best() ({} in phase {})",
                r.metric, r.phase
            )
        } else {
            format!(
                "the cheapest (fewest channels, sockets, threads, then knobs not applied) of the last best()'s tied set {{{}}} ({} in phase {}, noise {:.1}%)",
                labels.join(", "),
                r.metric,
                r.phase,
                r.noise * 100.0
            )
        };
        (!members.is_empty()).then(|| (r.metric.clone(), members, how))
    });
    let (metric, members, how) = match ranked {
        Some(r) => r,
        None => {
            let metric = "server_gbs".to_string();
            let (_, set, how) = tied_with_highest(report, &metric)?;
            (metric, set, how)
        }
    };
    let set: Vec<String> = members.iter().map(|s| s.label.clone()).collect();
    // min_by_key keeps the first of equal costs: the best itself when it is among the cheapest.
    let pick = members.iter().copied().min_by_key(|s| cost(s))?;
    let f = pick.figure(&metric).or_else(|| pick.figure("server_gbs"))?;
    let tied_set = if set.len() > 1 {
        set.clone()
    } else {
        Vec::new()
    };
    Some(Chosen {
        phase: pick.phase.clone(),
        experiment: pick.experiment.clone(),
        label: pick.label.clone(),
        size: pick.size,
        chunk: pick.chunk,
        metric: if pick.figure(&metric).is_some() {
            metric
        } else {
            "server_gbs".into()
        },
        median: f.median,
        ci95_lo: f.ci95_lo,
        ci95_hi: f.ci95_hi,
        level: f.level,
        n: f.n,
        tied_set,
        why: how,
        knobs: pick.knobs.clone(),
    })
}

/// The chosen configuration's knobs as variables, and the knobs no NCCL variable expresses:
/// the rows of [`tcpx_model::equivalence::EQUIVALENCES`] in order, then `tcpx-run bench`'s own
/// variables from the knob table. `setup` is the run's setup (bindings and plugin recorded by
/// the plan runner).
pub fn map_knobs(
    c: &Chosen,
    setup: &BTreeMap<String, String>,
) -> (Vec<TunedVariable>, Vec<NoEquivalent>) {
    let ev = c.evidence();
    let mut vars = Vec::new();
    let mut none = Vec::new();
    let transport = c
        .knob_text(Knob::Transport)
        .unwrap_or_else(|| "socket".into());
    let backend = transport.parse::<tcpx_model::Backend>().ok();
    // What NCCL runs for the backend, as the backend states it.
    let nccl = backend.map(|b| b.capabilities().nccl);
    let facts = Facts {
        c,
        setup,
        transport: &transport,
        backend,
        nccl,
        // Through the nccl backend, chunk and window are the tool's ncclSend/ncclRecv calls;
        // NCCL cuts each call into its own network chunks (NCCL_P2P_NET_CHUNKSIZE in the
        // experiment's env), so they have no NCCL variable.
        nccl_calls: nccl == Some(NcclEquivalent::Itself),
    };
    for rule in EQUIVALENCES {
        for found in facts.apply(rule) {
            match found {
                Found::Var { name, value, from } => vars.push(TunedVariable {
                    name,
                    value,
                    reader: rule.reader,
                    from,
                    evidence: ev.clone(),
                }),
                Found::Nothing { value, reason } => none.push(NoEquivalent {
                    knob: rule.knob.name().into(),
                    value,
                    reason: reason.into(),
                }),
            }
        }
    }
    // tcpx-run bench's own fallbacks, so that sourcing the file reproduces the configuration.
    // Every knob with a variable in the knob table, in its order.
    for spec in tcpx_model::knob::with_env() {
        let Some(name) = spec.env else { continue };
        let value = match spec.knob {
            // The chunk the chosen configuration ran with ("auto" resolved).
            Knob::Chunk => c.chunk.map(|v| v.to_string()),
            Knob::SockBuf => c.knob_text(spec.knob).filter(|b| b != "auto"),
            _ => c.knob_text(spec.knob),
        };
        if let Some(v) = value {
            vars.push(TunedVariable {
                name: name.into(),
                value: v.clone(),
                reader: Reader::TcpxRun,
                from: format!("{}={v}", spec.name),
                evidence: ev.clone(),
            });
        }
    }
    // File order: grouped by reader (stable, so each group keeps the order above).
    vars.sort_by_key(|v| v.reader);
    (vars, none)
}

/// What one equivalence row found for the chosen configuration.
enum Found {
    Var {
        name: String,
        value: String,
        /// The knob(s) it follows from, as `knob=value`.
        from: String,
    },
    Nothing {
        value: String,
        reason: &'static str,
    },
}

/// What the rows of the equivalence table are applied to.
struct Facts<'a> {
    c: &'a Chosen,
    setup: &'a BTreeMap<String, String>,
    transport: &'a str,
    backend: Option<tcpx_model::Backend>,
    nccl: Option<NcclEquivalent>,
    nccl_calls: bool,
}

impl Facts<'_> {
    fn net_plugin(&self) -> bool {
        self.nccl == Some(NcclEquivalent::NetPlugin)
    }

    /// What `rule` makes of the chosen configuration, in the order tuned.env writes it.
    fn apply(&self, rule: &Equivalence) -> Vec<Found> {
        let c = self.c;
        let knob = rule.knob;
        let var = |i: usize, value: String, from: String| Found::Var {
            name: rule.vars[i].to_string(),
            value,
            from,
        };
        let nothing = |value: String, reason: &'static str| Found::Nothing { value, reason };
        match rule.how {
            How::RecordedPlugin { unrecorded } => match self.nccl {
                Some(NcclEquivalent::NetPlugin) => match self.setup.get(SETUP_NET_PLUGIN) {
                    Some(p) => vec![var(0, p.clone(), format!("{knob}={}", self.transport))],
                    None => vec![nothing(self.transport.into(), unrecorded)],
                },
                Some(NcclEquivalent::Closest(why)) => vec![nothing(self.transport.into(), why)],
                Some(NcclEquivalent::Itself) | None => vec![],
            },
            How::Number { plugin_only, auto } => {
                if plugin_only && !self.net_plugin() {
                    return vec![];
                }
                match (c.knob_u64(knob), auto) {
                    (Some(v), _) => vec![var(0, v.to_string(), format!("{knob}={v}"))],
                    (None, Some((v, why))) => {
                        vec![var(0, v.to_string(), format!("{knob}=auto ({why})"))]
                    }
                    (None, None) => vec![],
                }
            }
            How::BackendSettings => {
                let Some(Value::Object(env)) = c.knobs.get(&knob) else {
                    return vec![];
                };
                env.iter()
                    .filter(|(k, _)| {
                        *k == "NCCL_NET"
                            || tcpx_model::setting::SETTINGS.iter().any(|s| s.var == *k)
                    })
                    .filter_map(|(k, v)| {
                        // The backend's own variable, untranslated.
                        Some(Found::Var {
                            name: k.clone(),
                            value: v.as_str()?.to_string(),
                            from: format!("{knob}={k}={}", v.as_str()?),
                        })
                    })
                    .collect()
            }
            How::SocketSplit { too_many } => match c.knob_u64(knob) {
                None => vec![],
                Some(k) => match nccl_socket_split(k) {
                    Some((t, s)) => {
                        let from = format!("{knob}={k}");
                        vec![
                            var(0, t.to_string(), from.clone()),
                            var(1, s.to_string(), from),
                        ]
                    }
                    None => vec![nothing(k.to_string(), too_many)],
                },
            },
            How::Chunk { nccl_calls } => {
                let Some(chunk) = c.chunk else {
                    return vec![];
                };
                match (nccl_calls, self.nccl_calls) {
                    (Some(why), true) => vec![nothing(chunk.to_string(), why)],
                    _ => vec![var(0, chunk.to_string(), self.chunk_from(chunk))],
                }
            }
            How::WindowTimesChunk { too_deep } => {
                let (Some(chunk), Some(w), false) = (c.chunk, c.knob_u64(knob), self.nccl_calls)
                else {
                    return vec![];
                };
                if w <= NCCL_STEPS {
                    vec![var(
                        0,
                        (w * chunk).to_string(),
                        format!("{knob}={w} x {}={chunk}", Knob::Chunk),
                    )]
                } else {
                    vec![nothing(w.to_string(), too_deep)]
                }
            }
            How::RecordedBindings {
                word,
                unrecorded,
                other,
            } => match c.knob_text(knob).as_deref() {
                None | Some("none") => vec![],
                Some(w) if w == word => {
                    match (
                        self.setup.get(SETUP_TX_BINDINGS),
                        self.setup.get(SETUP_RX_BINDINGS),
                    ) {
                        (Some(tx), Some(rx)) => vec![
                            var(0, tx.clone(), format!("{knob}={word}")),
                            var(1, rx.clone(), format!("{knob}={word}")),
                        ],
                        _ => vec![nothing(word.into(), unrecorded)],
                    }
                }
                Some(w) => vec![nothing(w.into(), other)],
            },
            How::Nothing { unless, why } => {
                let plain = match unless {
                    Unless::Word(default) => c.knob_text(knob).is_none_or(|t| t == default),
                    Unless::AtMostOne => c.knob_u64(knob).is_none_or(|n| n <= 1),
                    Unless::OneNic => c.knob_u64(Knob::Nics).unwrap_or(1) <= 1,
                };
                match c.knob_text(knob).filter(|_| !plain) {
                    Some(v) => vec![nothing(v, why)],
                    None => vec![],
                }
            }
        }
    }

    /// `chunk=...` for the chunk the configuration ran with, `auto` explained.
    fn chunk_from(&self, chunk: u64) -> String {
        match self.c.knob_text(Knob::Chunk) {
            Some(t) if t != "auto" => format!("{}={t}", Knob::Chunk),
            _ => {
                // Auto is the backend's own default (tcpx_model::Capabilities::default_chunk).
                let default = self
                    .backend
                    .unwrap_or(tcpx_model::Backend::Socket)
                    .capabilities()
                    .default_chunk
                    .describe();
                format!("{}=auto ({default} = {chunk})", Knob::Chunk)
            }
        }
    }
}

impl Tuned {
    /// The recommendation of `report` (summaries filled).
    pub fn from_report(report: &RunReport) -> Tuned {
        let chosen = choose(report);
        let (all_vars, all_none) = chosen
            .as_ref()
            .map(|c| map_knobs(c, &report.setup))
            .unwrap_or_default();
        let decided = chosen
            .as_ref()
            .map(|c| decided_knobs(report, c))
            .unwrap_or_default();
        // Only what the plan decided is exported; the rest is listed with its base value.
        let mut not_tuned: BTreeMap<String, String> = BTreeMap::new();
        let base_value = |k: &str| {
            chosen
                .as_ref()
                .zip(Knob::from_name(k))
                .and_then(|(c, k)| c.knob_text(k))
                .unwrap_or_else(|| "unset".into())
        };
        // Whether the plan decided the knob a variable or a missing equivalent names.
        let is_decided = |name: &str| Knob::from_name(name).is_some_and(|k| decided.contains(&k));
        let mut decided_vars = Vec::new();
        for v in all_vars {
            let knobs = from_knobs(&v.from);
            if knobs.iter().any(|k| is_decided(k)) {
                decided_vars.push(v);
            } else {
                for k in knobs {
                    let value = base_value(&k);
                    not_tuned.entry(k).or_insert(value);
                }
            }
        }
        let mut no_equivalent = Vec::new();
        for n in all_none {
            if is_decided(&n.knob) {
                no_equivalent.push(n);
            } else {
                not_tuned.entry(n.knob.clone()).or_insert(n.value);
            }
        }
        // A value no shell line or job snippet can carry (a control character in a recorded
        // path or binding) is listed instead of set.
        let mut variables = Vec::new();
        for v in decided_vars {
            match env_name(&v.name).and_then(|n| env_value(n, &v.value)) {
                Ok(_) => variables.push(v),
                Err(e) => no_equivalent.push(NoEquivalent {
                    knob: v.from.clone(),
                    value: v.value.clone(),
                    reason: format!("not set: {e}"),
                }),
            }
        }
        let irq_policy = chosen
            .as_ref()
            .filter(|_| decided.contains(&Knob::IrqPolicy))
            .and_then(|c| c.knob_text(Knob::IrqPolicy))
            .filter(|p| p != "default");
        let mut notes = Vec::new();
        if chosen.is_none() {
            notes.push("no configuration was measured: nothing to recommend".into());
        }
        if matches!(report.completion, crate::Completion::Incomplete(_)) {
            notes.push("the run did not complete: the choice is among what ran".into());
        }
        Tuned {
            plan: report.plan.clone(),
            stamp: report.stamp.clone(),
            chosen,
            variables,
            no_equivalent,
            // The recorded bindings are NCCL's TX/RX cores: what the `nccl` policy stands for.
            irq_tx: (irq_policy.as_deref() == Some("nccl"))
                .then(|| report.setup.get(SETUP_TX_BINDINGS).cloned())
                .flatten(),
            irq_rx: (irq_policy.as_deref() == Some("nccl"))
                .then(|| report.setup.get(SETUP_RX_BINDINGS).cloned())
                .flatten(),
            irq_policy,
            decided_knobs: decided.iter().map(|k| k.name().to_string()).collect(),
            not_tuned: not_tuned.into_iter().collect(),
            notes,
        }
    }

    /// The variables as (name, value), in file order.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.variables
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect()
    }

    /// The text of `tuned.env`.
    pub fn env_text(&self) -> String {
        let mut s = format!(
            "# tuned.env: the configuration plan `{}` (run {}) recommends, as environment variables.\n\
             # Use it with `set -a; . ./tuned.env; set +a`, or `tcpx-run apply <this file>`\n\
             # (--format slurm|torchrun|k8s for job snippets, --irq for the IRQ policy).\n",
            comment(&self.plan),
            comment(&self.stamp)
        );
        match &self.chosen {
            Some(c) => {
                s.push_str(&format!(
                    "# chosen: {} (experiment {}, phase {}{}): {}\n# why: {}\n",
                    comment(&c.label),
                    comment(&c.experiment),
                    comment(&c.phase),
                    c.size.map_or_else(String::new, |z| format!(", size {z} B")),
                    comment(&c.evidence()),
                    comment(&c.why)
                ));
            }
            None => s.push_str("# chosen: nothing (no configuration was measured)\n"),
        }
        for n in &self.notes {
            s.push_str(&format!("# note: {}\n", comment(n)));
        }
        for reader in [Reader::Nccl, Reader::Seed, Reader::TcpxRun] {
            let vs: Vec<&TunedVariable> = self
                .variables
                .iter()
                .filter(|v| v.reader == reader)
                .collect();
            if vs.is_empty() {
                continue;
            }
            s.push_str(&format!("\n# --- {}\n", reader.heading()));
            for v in vs {
                s.push_str(&format!(
                    "# {}: {}\n",
                    comment(&v.from),
                    comment(&v.evidence)
                ));
                // A name or value no shell line can carry safely is left out, saying why.
                match env_name(&v.name).and_then(|n| env_value(n, &v.value)) {
                    Ok(_) => s.push_str(&format!("{}={}\n", v.name, shell_word(&v.value))),
                    Err(e) => s.push_str(&format!("# not set: {}\n", comment(&e.to_string()))),
                }
            }
        }
        if !self.not_tuned.is_empty() {
            s.push_str(
                "\n# --- knobs this plan did not decide (not exported: keep your own settings)\n",
            );
            for (k, v) in &self.not_tuned {
                s.push_str(&format!(
                    "# {}: not tuned by this plan (base value {})\n",
                    comment(k),
                    comment(v)
                ));
            }
        }
        if !self.no_equivalent.is_empty() {
            s.push_str("\n# --- knobs with no NCCL equivalent (not set above)\n");
            for n in &self.no_equivalent {
                s.push_str(&format!(
                    "# {}={}: {}\n",
                    comment(&n.knob),
                    comment(&n.value),
                    comment(&n.reason)
                ));
            }
        }
        if let Some(p) = &self.irq_policy {
            s.push_str(&format!(
                "\n# --- IRQ policy: not an environment variable; `tcpx-run apply --irq` applies it\n{IRQ_DIRECTIVE} {}\n",
                comment(p)
            ));
        }
        s
    }
}

/// Writes `tuned.env` and `tuned.json` for `report` (summaries filled) into `dir`.
pub fn write_tuned(report: &RunReport, dir: &Path) -> Result<Vec<PathBuf>> {
    let t = Tuned::from_report(report);
    let env = dir.join("tuned.env");
    let json = dir.join("tuned.json");
    crate::atomic_file::write_file(&env, t.env_text().as_bytes())?;
    crate::atomic_file::write_file(&json, &serde_json::to_vec_pretty(&t)?)?;
    Ok(vec![env, json])
}

/// What a `tuned.env` holds: its variables in file order and the IRQ policy directive.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvFile {
    pub vars: Vec<(String, String)>,
    pub irq_policy: Option<String>,
}

/// Reads `NAME=VALUE` lines (optionally `export NAME=VALUE`, values bare or single-quoted as
/// [`crate::safe::shell_word`] writes them) and the IRQ directive; comments and blank lines are skipped.
pub fn parse_env(text: &str) -> Result<EnvFile> {
    let mut vars = Vec::new();
    let mut lines: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut irq = None;
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(p) = l.strip_prefix(IRQ_DIRECTIVE) {
            irq = Some(p.trim().to_string());
            continue;
        }
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let l = l.strip_prefix("export ").unwrap_or(l).trim_start();
        let Some((name, raw)) = l.split_once('=') else {
            refuse!("line {}: `{}` is not NAME=VALUE", i + 1, comment(line));
        };
        env_name(name).with_context(|| format!("line {}", i + 1))?;
        let value = unquote(raw).with_context(|| format!("line {}", i + 1))?;
        env_value(name, &value).with_context(|| format!("line {}", i + 1))?;
        // Set twice, both lines were exported and the last won only by order: which one was
        // meant is not this tool's guess.
        if let Some(first) = lines.get(name) {
            refuse!(
                "line {}: {name} is set again (first on line {first}): a tuned file sets each variable once; remove one of the two",
                i + 1
            );
        }
        lines.insert(name.to_string(), i + 1);
        vars.push((name.to_string(), value));
    }
    Ok(EnvFile {
        vars,
        irq_policy: irq,
    })
}

fn unquote(raw: &str) -> Result<String> {
    let mut out = String::new();
    let mut rest = raw;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('\'') {
            let Some(end) = r.find('\'') else {
                refuse!("unterminated single quote in `{raw}`");
            };
            out.push_str(&r[..end]);
            rest = &r[end + 1..];
        } else if let Some(r) = rest.strip_prefix('\\') {
            let mut cs = r.chars();
            match cs.next() {
                Some(c) => out.push(c),
                None => refuse!("trailing backslash in `{raw}`"),
            }
            rest = cs.as_str();
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            if c.is_whitespace() || "\"$`;&|<>(){}".contains(c) {
                refuse!("`{raw}`: only bare or single-quoted values are read (found `{c}`)");
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    Ok(out)
}

/// What a tuned file gives `apply` and `validate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunedFile {
    pub vars: Vec<(String, String)>,
    pub irq_policy: Option<String>,
    /// NCCL's TX/RX specs as the run recorded them (tuned.json, `nccl` policy only).
    pub irq_tx: Option<String>,
    pub irq_rx: Option<String>,
    /// The file read.
    pub source: PathBuf,
}

impl TunedFile {
    /// The run's name for messages: its report directory's name (`<stamp>-<plan>`) when the file
    /// is a run's tuned.env or tuned.json, else the path read.
    pub fn run_name(&self) -> String {
        let is_tuned = self
            .source
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "tuned.env" || n == "tuned.json");
        match (is_tuned, self.source.parent().and_then(|p| p.file_name())) {
            (true, Some(d)) => d.to_string_lossy().into_owned(),
            _ => self.source.display().to_string(),
        }
    }
}

/// Reads a report directory (its tuned.json, else tuned.env), a tuned.json or a tuned.env.
pub fn load(path: &Path) -> Result<TunedFile> {
    let file = match (path.is_dir(), path.join("tuned.json").is_file()) {
        (true, true) => path.join("tuned.json"),
        (true, false) => path.join("tuned.env"),
        _ => path.to_path_buf(),
    };
    let text =
        read_bounded(&file, MAX_TUNED_BYTES, "a tuned.env or tuned.json").with_context(|| {
            format!(
                "reading {} (give a plan run's report directory, or its tuned.env or tuned.json)",
                file.display()
            )
        })?;
    if file.extension().is_some_and(|e| e == "json") {
        let t: Tuned = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a tuned.json of this version", file.display()))?;
        let mut seen = std::collections::HashSet::new();
        for v in &t.variables {
            check_tuned_variable(&v.name, &v.value)
                .with_context(|| format!("{}: refusing its variables", file.display()))?;
            if !seen.insert(v.name.as_str()) {
                refuse!(
                    "{}: {} is set twice: a tuned file sets each variable once; remove one of the two",
                    file.display(),
                    v.name
                );
            }
        }
        return Ok(TunedFile {
            vars: t.pairs(),
            irq_policy: t.irq_policy,
            irq_tx: t.irq_tx,
            irq_rx: t.irq_rx,
            source: file,
        });
    }
    let parsed = parse_env(&text).with_context(|| format!("reading {}", file.display()))?;
    for (k, v) in &parsed.vars {
        check_tuned_variable(k, v)
            .with_context(|| format!("{}: refusing its variables", file.display()))?;
    }
    Ok(TunedFile {
        vars: parsed.vars,
        irq_policy: parsed.irq_policy,
        irq_tx: None,
        irq_rx: None,
        source: file,
    })
}

/// The longest value NCCL's conf-file reader keeps (it copies 1023 bytes).
pub const NCCL_CONF_MAX_VALUE: usize = 1023;

/// How `tcpx-run apply` prints the variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnippetFormat {
    /// `export NAME=VALUE` lines for a shell.
    Shell,
    /// An `#SBATCH --export=ALL,...` line for a Slurm batch script.
    Slurm,
    /// An environment prefix for a torchrun command line.
    Torchrun,
    /// A Kubernetes container `env:` list (YAML).
    K8s,
    /// The file `NCCL_CONF_FILE` names (or `~/.nccl.conf`, `/etc/nccl.conf`): NCCL sets each
    /// `NAME=VALUE` line in its process environment at init (never over a variable already set
    /// there), before it loads a net plugin, so the plugin's own variables reach it too (NCCL
    /// 2.28 `src/misc/param.cc` setEnvFile). Values are taken raw: no quoting, 1023 bytes at most.
    NcclConf,
}

/// The variables as a snippet for `format`; a name that is not `[A-Z_][A-Z0-9_]*` or a value
/// with a control character is refused (nothing unchecked reaches a shell or YAML).
pub fn snippet(format: SnippetFormat, vars: &[(String, String)]) -> Result<String> {
    for (k, v) in vars {
        env_name(k).and_then(|k| env_value(k, v))?;
    }
    let mut s = String::new();
    match format {
        SnippetFormat::Shell => {
            for (k, v) in vars {
                s.push_str(&format!("export {k}={}\n", shell_word(v)));
            }
        }
        SnippetFormat::Slurm => {
            // --export splits its list on commas, so values holding one go in the script body.
            // Only values of plain characters go in the list (no commas, quotes, blanks, `#`).
            let (plain, comma): (Vec<_>, Vec<_>) = vars.iter().partition(|(_, v)| {
                !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.:/=+@%".contains(c))
            });
            let list: Vec<String> = plain.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if list.is_empty() {
                s.push_str("#SBATCH --export=ALL\n");
            } else {
                s.push_str(&format!("#SBATCH --export=ALL,{}\n", list.join(",")));
            }
            if !comma.is_empty() {
                s.push_str(
                    "# values with commas, quotes or blanks cannot go through --export: set in the script body\n",
                );
                for (k, v) in comma {
                    s.push_str(&format!("export {k}={}\n", shell_word(v)));
                }
            }
        }
        SnippetFormat::Torchrun => {
            s.push_str("# environment prefix: append torchrun's own arguments to the last line\n");
            for (k, v) in vars {
                s.push_str(&format!("{k}={} \\\n", shell_word(v)));
            }
            s.push_str("torchrun\n");
        }
        SnippetFormat::NcclConf => {
            s.push_str(
                "# for NCCL_CONF_FILE: NCCL sets each line in its environment at init (a variable \
                 already set wins), before it loads a net plugin\n",
            );
            for (k, v) in vars {
                if !k.starts_with("NCCL_") {
                    s.push_str(&format!(
                        "# {k} is not NCCL's: set it in the job's environment\n"
                    ));
                    continue;
                }
                if v.len() > NCCL_CONF_MAX_VALUE || v.trim() != v {
                    refuse!(
                        "{k}: NCCL's conf file takes values of at most {NCCL_CONF_MAX_VALUE} \
                         bytes without surrounding blanks; set it in the environment instead"
                    );
                }
                s.push_str(&format!("{k}={v}\n"));
            }
        }
        SnippetFormat::K8s => {
            s.push_str("env:\n");
            for (k, v) in vars {
                s.push_str(&format!("  - name: {k}\n    value: {}\n", yaml_string(v)));
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Ranking;
    use crate::stats::FigureStats;
    use serde_json::json;

    fn summary(label: &str, knobs: Value, gbs: &[f64]) -> Summary {
        let knobs: KnobValues = serde_json::from_value(knobs).unwrap();
        let mut figures = BTreeMap::new();
        figures.insert("server_gbs".into(), FigureStats::of(gbs).unwrap());
        Summary {
            phase: "p".into(),
            experiment: format!("exp-{label}"),
            label: label.into(),
            size: Some(64 << 20),
            chunk: Some(512 << 10),
            status: Status::Ok,
            reason: None,
            reps: gbs.len(),
            n_ok: gbs.len(),
            knobs,
            not_applied: tcpx_model::NotApplied::new(),
            figures,
            pooled: BTreeMap::new(),
            pooled_iterations: BTreeMap::new(),
        }
    }

    fn report(summaries: Vec<Summary>, rankings: Vec<Ranking>) -> RunReport {
        RunReport {
            plan: "plan".into(),
            plan_path: "plans/plan.rhai".into(),
            stamp: "20261123T000000Z".into(),
            platform: "loopback".into(),
            rankings,
            summaries,
            ..RunReport::default()
        }
    }

    fn ranking(best: &str, tied: &[&str]) -> Ranking {
        Ranking {
            phase: "p".into(),
            metric: "server_gbs".into(),
            best: best.into(),
            tied: tied.iter().map(|s| s.to_string()).collect(),
            identical: vec![],
            ranked: true,
            noise: 0.05,
            text: String::new(),
            candidates: vec![],
            method: String::new(),
        }
    }

    fn knobs(channels: u64, socks: u64, window: u64) -> Value {
        json!({"transport": "socket", "memory": "host", "flows": 1, "channels": channels,
               "socks_per_channel": socks, "window": window, "chunk": "auto",
               "irq_policy": "default", "thread_binding": "none"})
    }

    /// A run's tuned file is named by its report directory; any other file by its path.
    #[test]
    fn an_nccl_conf_file_holds_ncclss_variables_raw_and_refuses_what_nccl_would_cut() {
        let vars = vec![
            ("NCCL_NSOCKS_PERTHREAD".to_string(), "4".to_string()),
            ("NCCL_NET".to_string(), "Socket".to_string()),
            ("TCPX_WINDOW".to_string(), "32".to_string()),
        ];
        let c = snippet(SnippetFormat::NcclConf, &vars).unwrap();
        let lines: Vec<&str> = c.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines, ["NCCL_NSOCKS_PERTHREAD=4", "NCCL_NET=Socket"]);
        assert!(c.contains("# TCPX_WINDOW is not NCCL's"), "{c}");
        let long = vec![("NCCL_X".to_string(), "a".repeat(1024))];
        assert!(snippet(SnippetFormat::NcclConf, &long).is_err());
        let padded = vec![("NCCL_X".to_string(), " 4".to_string())];
        assert!(snippet(SnippetFormat::NcclConf, &padded).is_err());
    }

    #[test]
    fn a_tuned_file_is_named_by_its_run_directory() {
        let file = |p: &str| TunedFile {
            vars: Vec::new(),
            irq_policy: None,
            irq_tx: None,
            irq_rx: None,
            source: PathBuf::from(p),
        };
        assert_eq!(
            file("reports/20261124-phase1/tuned.env").run_name(),
            "20261124-phase1"
        );
        assert_eq!(
            file("reports/20261124-phase1/tuned.json").run_name(),
            "20261124-phase1"
        );
        assert_eq!(file("mine.env").run_name(), "mine.env");
        assert_eq!(file("tuned.env").run_name(), "tuned.env");
    }

    #[test]
    fn the_cheapest_of_a_tied_set_is_chosen_and_a_clear_best_wins() {
        let ss = vec![
            summary("big", knobs(4, 8, 8), &[10.0, 10.2, 10.1]),
            summary("small", knobs(2, 4, 8), &[9.9, 10.0, 10.1]),
            summary("slow", knobs(1, 1, 8), &[3.0, 3.1, 3.0]),
        ];
        let tied = report(ss.clone(), vec![ranking("big", &["small"])]);
        let c = choose(&tied).unwrap();
        assert_eq!(c.label, "small");
        assert_eq!(c.tied_set, vec!["big", "small"]);
        assert!(c.why.contains("cheapest"), "{}", c.why);
        let clear = report(ss.clone(), vec![ranking("big", &[])]);
        assert_eq!(choose(&clear).unwrap().label, "big");
        // No ranking at all: big has the highest median, small is tied with it and cheaper.
        let c = choose(&report(ss, vec![])).unwrap();
        assert_eq!(c.label, "small");
        assert_eq!(c.tied_set, vec!["big", "small"]);
        assert!(choose(&report(vec![], vec![])).is_none());
    }

    #[test]
    fn of_equal_cost_the_configuration_without_unapplied_knobs_is_chosen() {
        // Pinning was not applied (it would change nothing here): the pinned configuration ran
        // as the unpinned one did, so measuring higher by chance does not make pinning a setting
        // to recommend.
        let mut pinned = summary("pinned", knobs(1, 2, 8), &[2.0, 2.2, 1.9]);
        pinned
            .not_applied
            .insert(Knob::ThreadBinding, "every CPU already".into());
        let unpinned = summary("unpinned", knobs(1, 2, 8), &[1.9, 2.1, 1.9]);
        for rankings in [vec![], vec![ranking("pinned", &["unpinned"])]] {
            let c = choose(&report(vec![pinned.clone(), unpinned.clone()], rankings)).unwrap();
            assert_eq!(c.label, "unpinned", "{}", c.why);
            assert_eq!(c.tied_set, vec!["pinned", "unpinned"]);
            assert!(c.why.contains("knobs not applied"), "{}", c.why);
        }
    }

    fn noise(floor: f64, runs: &[&str]) -> Option<crate::record::NoiseInfo> {
        Some(crate::record::NoiseInfo {
            floor,
            measured: None,
            used: floor,
            detail: String::new(),
            runs: runs.iter().map(|s| s.to_string()).collect(),
            source: String::new(),
        })
    }

    #[test]
    fn without_a_ranking_an_aa_run_is_never_chosen_and_ties_go_to_the_cheapest() {
        // As phase1_affinity on a VM: pinning is not applied, so best() ranked nothing, and the
        // first A/A run happened to measure the highest median.
        let ss = vec![
            summary(
                "threads unpinned (A/A run 1)",
                knobs(4, 8, 8),
                &[12.0, 12.2, 12.1],
            ),
            summary(
                "threads unpinned (A/A run 2)",
                knobs(4, 8, 8),
                &[9.0, 9.1, 9.2],
            ),
            summary("pinned", knobs(4, 8, 8), &[10.2, 10.1, 10.3]),
            summary("unpinned", knobs(2, 4, 8), &[10.0, 10.2, 9.9]),
            summary("slow", knobs(1, 1, 8), &[3.0, 3.1, 3.0]),
        ];
        let mut r = report(ss, vec![]);
        r.noise = noise(
            0.05,
            &[
                "exp-threads unpinned (A/A run 1)",
                "exp-threads unpinned (A/A run 2)",
            ],
        );
        let c = choose(&r).unwrap();
        assert_eq!(c.label, "unpinned", "cheapest of the tied set: {c:?}");
        assert_eq!(c.tied_set, vec!["pinned", "unpinned"]);
        assert!(
            c.why.contains("tied within noise (5.0%)") && c.why.contains("A/A runs left out"),
            "{}",
            c.why
        );
        // Without the record of which runs were A/A, the A/A run would win: the record decides.
        r.noise = noise(0.05, &[]);
        assert_eq!(choose(&r).unwrap().label, "threads unpinned (A/A run 1)");
    }

    #[test]
    fn without_a_ranking_a_clear_winner_beyond_noise_is_chosen_even_when_dearer() {
        let ss = vec![
            summary("fast", knobs(4, 8, 8), &[10.0, 10.1, 10.2, 10.1, 10.0]),
            summary("cheap", knobs(1, 1, 8), &[5.0, 5.1, 5.0, 5.2, 5.1]),
        ];
        let mut r = report(ss, vec![]);
        r.noise = noise(0.05, &[]);
        let c = choose(&r).unwrap();
        assert_eq!(c.label, "fast");
        assert!(c.tied_set.is_empty());
        assert!(
            c.why.contains("ahead of the others beyond noise"),
            "{}",
            c.why
        );
        // Issue 43: the same two when the knobs they differ in were not applied here (threads
        // pinned on a 2-core VM): the same experiment, not "ahead beyond noise".
        let mut same = r.clone();
        for s in &mut same.summaries {
            for k in [Knob::Channels, Knob::SocksPerChannel] {
                s.not_applied.insert(k, "not on this machine".into());
            }
        }
        let c = choose(&same).unwrap();
        assert!(
            c.why.contains("were the same experiment here") && !c.why.contains("ahead"),
            "{}",
            c.why
        );
        assert_eq!(c.label, "cheap");
        // One configuration alone is not "ahead of the others".
        let mut alone = r.clone();
        alone.summaries.truncate(1);
        let c = choose(&alone).unwrap();
        assert!(
            c.why.contains("the only configuration measured"),
            "{}",
            c.why
        );
        // A wider noise band (the A/A spread was 60 %) ties them: the cheap one is chosen.
        r.noise = noise(0.6, &[]);
        assert_eq!(choose(&r).unwrap().label, "cheap");
        // A configuration at another size is not compared with the top.
        let mut other = summary("small-size", knobs(1, 1, 8), &[9.9, 10.0, 10.1]);
        other.size = Some(1 << 20);
        let mut r = report(
            vec![summary("fast", knobs(4, 8, 8), &[10.0, 10.1, 10.2]), other],
            vec![],
        );
        r.noise = noise(0.05, &[]);
        assert_eq!(choose(&r).unwrap().label, "fast");
        r.summaries[1].size = Some(64 << 20);
        assert_eq!(
            choose(&r).unwrap().label,
            "small-size",
            "same size: tied and cheaper"
        );
    }

    #[test]
    fn a_ranked_best_that_is_an_aa_run_gives_way_to_its_tied_set() {
        let ss = vec![
            summary("aa", knobs(1, 1, 8), &[10.0, 10.1, 10.2]),
            summary("b", knobs(4, 8, 8), &[10.0, 10.0, 10.1]),
        ];
        let mut r = report(ss, vec![ranking("aa", &["b"])]);
        r.noise = noise(0.05, &["exp-aa"]);
        assert_eq!(choose(&r).unwrap().label, "b");
    }

    fn var<'a>(vs: &'a [TunedVariable], name: &str) -> Option<&'a str> {
        vs.iter().find(|v| v.name == name).map(|v| v.value.as_str())
    }

    #[test]
    fn knobs_map_to_nccl_seed_and_bench_variables() {
        let r = report(vec![summary("a", knobs(4, 4, 4), &[7.5, 7.4, 7.6])], vec![]);
        let c = choose(&r).unwrap();
        let (vs, none) = map_knobs(&c, &BTreeMap::new());
        for (name, value) in [
            ("NCCL_NCHANNELS_PER_NET_PEER", "4"),
            ("NCCL_SOCKET_NTHREADS", "4"),
            ("NCCL_NSOCKS_PERTHREAD", "1"),
            ("NCCL_P2P_NET_CHUNKSIZE", "524288"),
            // Window 4 x 512K.
            ("NCCL_BUFFSIZE", "2097152"),
            ("UCCL_TCPX_NUM_CHANNELS", "4"),
            ("UCCL_TCPX_WINDOW_SIZE", "4"),
            ("UCCL_TCPX_CHUNK_BYTES", "524288"),
            ("TCPX_CHANNELS", "4"),
            ("TCPX_CHUNK", "524288"),
        ] {
            assert_eq!(var(&vs, name), Some(value), "{name}");
        }
        assert_eq!(
            var(&vs, "NCCL_NET_PLUGIN"),
            None,
            "socket backend: no plugin"
        );
        assert!(vs.iter().all(|v| v.evidence.contains("server_gbs 7.500")));
        assert!(none.iter().any(|n| n.knob == "transport"));
    }

    /// The zero-copy threshold a run chose reaches tuned.env under the knob table's names: Google's
    /// NCCL_MIN_ZCOPY_SIZE for a netplugin target, TCPX_ZERO_COPY_MIN for tcpx-run bench.
    #[test]
    fn the_zero_copy_threshold_goes_out_under_the_tables_names() {
        let k = json!({"transport": "netplugin", "zero_copy_min": 65536});
        let r = report(vec![summary("z", k, &[5.0])], vec![]);
        let (vs, _) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        assert_eq!(var(&vs, "NCCL_MIN_ZCOPY_SIZE"), Some("65536"));
        assert_eq!(var(&vs, "TCPX_ZERO_COPY_MIN"), Some("65536"));
        let k = json!({"transport": "socket", "zero_copy_min": 65536});
        let r = report(vec![summary("s", k, &[5.0])], vec![]);
        let (vs, _) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        assert_eq!(
            var(&vs, "NCCL_MIN_ZCOPY_SIZE"),
            None,
            "only the plugin reads it"
        );
        let k = json!({"transport": "netplugin"});
        let r = report(vec![summary("n", k, &[5.0])], vec![]);
        let (vs, _) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        assert_eq!(
            var(&vs, "NCCL_MIN_ZCOPY_SIZE"),
            None,
            "not chosen, not written"
        );
    }

    /// Through the nccl backend a chunk is one ncclSend/ncclRecv call, which NCCL cuts by its own
    /// network chunk: tuned.env gives NCCL no chunk or buffer from it, and says why; an auto chunk
    /// reads as the backend's default, the whole message.
    #[test]
    fn the_nccl_backends_chunk_is_its_calls_not_nccls_network_chunk() {
        let k = json!({"transport": "nccl", "memory": "cuda:0,0", "chunk": "auto", "window": 4});
        let mut s = summary("n", k, &[5.0]);
        s.chunk = Some(64 << 20);
        let r = report(vec![s], vec![]);
        let (vs, none) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        assert_eq!(var(&vs, "NCCL_P2P_NET_CHUNKSIZE"), None);
        assert_eq!(var(&vs, "NCCL_BUFFSIZE"), None);
        let chunk = none
            .iter()
            .find(|n| n.knob == "chunk")
            .expect("chunk listed");
        assert!(chunk.reason.contains("ncclSend"), "{}", chunk.reason);
        let seed = vs
            .iter()
            .find(|v| v.name == "UCCL_TCPX_CHUNK_BYTES")
            .unwrap();
        assert_eq!(seed.from, "chunk=auto (the whole message = 67108864)");
        // The socket backend's auto chunk still maps, and reads as its own default.
        let r = report(vec![summary("s", knobs(1, 1, 4), &[5.0])], vec![]);
        let (vs, _) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        let v = vs
            .iter()
            .find(|v| v.name == "NCCL_P2P_NET_CHUNKSIZE")
            .unwrap();
        assert_eq!(v.from, "chunk=auto (min(512K, size) = 524288)");
    }

    #[test]
    fn knobs_nccl_cannot_express_are_listed_not_invented() {
        let k = json!({"transport": "netplugin", "channels": 2, "socks_per_channel": 24,
                       "window": 32, "sock_buf": "4M", "thread_binding": "numa-local",
                       "nics": 2, "nic_policy": "round-robin", "flows": 2,
                       "process_mode": "multi-process"});
        let r = report(vec![summary("a", k, &[5.0])], vec![]);
        let c = choose(&r).unwrap();
        let (vs, none) = map_knobs(&c, &BTreeMap::new());
        let listed: Vec<&str> = none.iter().map(|n| n.knob.as_str()).collect();
        for k in [
            "window",
            "sock_buf",
            "thread_binding",
            "nics",
            "nic_policy",
            "flows",
            "process_mode",
            "transport",
        ] {
            assert!(listed.contains(&k), "{k} missing from {listed:?}");
        }
        assert_eq!(var(&vs, "NCCL_BUFFSIZE"), None, "window 32 > NCCL_STEPS");
        assert_eq!(
            var(&vs, "NCCL_NET_PLUGIN"),
            None,
            "plugin path not recorded"
        );
        assert_eq!(var(&vs, "NCCL_GPUDIRECTTCPX_TX_BINDINGS"), None);
        // 24 sockets: 12 threads x 2 sockets each.
        assert_eq!(var(&vs, "NCCL_SOCKET_NTHREADS"), Some("12"));
        assert_eq!(var(&vs, "NCCL_NSOCKS_PERTHREAD"), Some("2"));
        // A GPUDirect-TCPX target always carries the plugin's chunk (its own default 0 stalls).
        assert_eq!(var(&vs, "NCCL_DYNAMIC_CHUNK_SIZE"), Some("524288"));
        let k = json!({"transport": "netplugin", "plugin_chunk": 1_048_576});
        let r = report(vec![summary("b", k, &[5.0])], vec![]);
        let (vs2, _) = map_knobs(&choose(&r).unwrap(), &BTreeMap::new());
        assert_eq!(var(&vs2, "NCCL_DYNAMIC_CHUNK_SIZE"), Some("1048576"));
        // With the plugin and bindings recorded, they are set.
        let mut setup = BTreeMap::new();
        setup.insert(
            SETUP_NET_PLUGIN.to_string(),
            "/usr/lib/libnccl-net.so".to_string(),
        );
        setup.insert(
            SETUP_TX_BINDINGS.to_string(),
            "eth1:8-21;eth2:8-21".to_string(),
        );
        setup.insert(
            SETUP_RX_BINDINGS.to_string(),
            "eth1:22-35;eth2:22-35".to_string(),
        );
        let mut c2 = c.clone();
        c2.knobs.insert(Knob::ThreadBinding, json!("nccl"));
        let (vs, _) = map_knobs(&c2, &setup);
        assert_eq!(var(&vs, "NCCL_NET_PLUGIN"), Some("/usr/lib/libnccl-net.so"));
        assert_eq!(
            var(&vs, "NCCL_GPUDIRECTTCPX_RX_BINDINGS"),
            Some("eth1:22-35;eth2:22-35")
        );
    }

    #[test]
    fn only_knobs_the_plan_varied_and_decided_are_exported() {
        // As phase1_affinity on a VM: only thread_binding varies, and it did not act here.
        let base = json!({"transport": "socket", "channels": 1, "socks_per_channel": 2,
                          "window": 16, "chunk": "512K", "thread_binding": "none"});
        let mut pinned_knobs = base.clone();
        pinned_knobs["thread_binding"] = json!("numa-local");
        let mut pinned = summary("pinned", pinned_knobs, &[1.0, 1.02, 0.98]);
        pinned
            .not_applied
            .insert(Knob::ThreadBinding, "one NUMA node here".into());
        let r = report(
            vec![summary("unpinned", base, &[1.0, 1.01, 0.99]), pinned],
            vec![],
        );
        let t = Tuned::from_report(&r);
        assert!(t.variables.is_empty(), "{:?}", t.variables);
        assert!(t.decided_knobs.is_empty(), "{:?}", t.decided_knobs);
        let text = t.env_text();
        assert!(parse_env(&text).unwrap().vars.is_empty(), "{text}");
        for k in ["channels", "socks_per_channel", "window", "chunk"] {
            assert!(
                t.not_tuned.iter().any(|(n, _)| n == k),
                "{k} missing from {:?}",
                t.not_tuned
            );
        }
        assert!(
            text.contains("# channels: not tuned by this plan (base value 1)"),
            "{text}"
        );

        // A window sweep: the window (and what it sets) is exported, channels are not.
        let w = |win: u64, gbs: &[f64]| {
            summary(
                &format!("window={win}"),
                json!({"transport": "socket", "channels": 1, "socks_per_channel": 2,
                       "window": win, "chunk": "512K"}),
                gbs,
            )
        };
        let r = report(
            vec![w(1, &[0.5, 0.52, 0.49]), w(16, &[1.2, 1.25, 1.22])],
            vec![],
        );
        let t = Tuned::from_report(&r);
        assert_eq!(t.decided_knobs, ["window"]);
        let names: Vec<&str> = t.variables.iter().map(|v| v.name.as_str()).collect();
        assert!(names.contains(&"UCCL_TCPX_WINDOW_SIZE") && names.contains(&"TCPX_WINDOW"));
        assert!(
            !names
                .iter()
                .any(|n| n.contains("NCHANNELS") || *n == "TCPX_CHANNELS"),
            "{names:?}"
        );
    }

    #[test]
    fn socket_split_respects_nccl_limits() {
        assert_eq!(nccl_socket_split(1), Some((1, 1)));
        assert_eq!(nccl_socket_split(16), Some((16, 1)));
        assert_eq!(nccl_socket_split(17), Some((1, 17)));
        assert_eq!(nccl_socket_split(64), Some((16, 4)));
        assert_eq!(nccl_socket_split(65), None);
        assert_eq!(nccl_socket_split(0), None);
    }

    #[test]
    fn env_text_round_trips_through_the_parser() {
        // Two configurations differing in every knob: all of them decided.
        let mut r = report(
            vec![
                summary(
                    "a",
                    json!({"transport": "socket", "channels": 2, "socks_per_channel": 4,
                           "window": 16, "irq_policy": "nccl", "thread_binding": "nccl"}),
                    &[4.0, 4.2],
                ),
                summary(
                    "b",
                    json!({"transport": "socket", "channels": 1, "socks_per_channel": 2,
                           "window": 8, "irq_policy": "default", "thread_binding": "none"}),
                    &[1.0, 1.1],
                ),
            ],
            vec![],
        );
        r.setup
            .insert(SETUP_TX_BINDINGS.into(), "eth1:8-21;eth2:8-21".into());
        r.setup
            .insert(SETUP_RX_BINDINGS.into(), "eth1:22-35;eth2:22-35".into());
        let t = Tuned::from_report(&r);
        let text = t.env_text();
        let parsed = parse_env(&text).unwrap();
        assert_eq!(parsed.vars, t.pairs());
        assert_eq!(parsed.irq_policy.as_deref(), Some("nccl"));
        assert!(text.contains("NCCL_GPUDIRECTTCPX_TX_BINDINGS='eth1:8-21;eth2:8-21'"));
        // Every variable line is preceded by its evidence comment.
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if !l.starts_with('#') && l.contains('=') {
                assert!(lines[i - 1].contains("server_gbs"), "{l}");
            }
        }
        assert!(parse_env("X=$(rm -rf /)").is_err());
        assert!(parse_env("1X=2").is_err());
        assert_eq!(
            parse_env("export A='it'\\''s'\n").unwrap().vars,
            vec![("A".to_string(), "it's".to_string())]
        );
    }

    #[test]
    fn snippets_keep_every_variable() {
        let vars = vec![
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "x:1-2,3;y".to_string()),
        ];
        let slurm = snippet(SnippetFormat::Slurm, &vars).unwrap();
        assert!(slurm.starts_with("#SBATCH --export=ALL,A=1\n"), "{slurm}");
        assert!(slurm.contains("export B='x:1-2,3;y'"), "{slurm}");
        let t = snippet(SnippetFormat::Torchrun, &vars).unwrap();
        assert!(t.contains("A=1 \\\nB='x:1-2,3;y' \\\ntorchrun"), "{t}");
        let k = snippet(SnippetFormat::K8s, &vars).unwrap();
        assert!(k.contains("  - name: B\n    value: \"x:1-2,3;y\""), "{k}");
        let sh = snippet(SnippetFormat::Shell, &vars).unwrap();
        assert_eq!(parse_env(&sh).unwrap().vars, vars);
    }

    // --- injection: arbitrary bytes through names, labels and values (issue 27, items 2 and 3)

    use proptest::prelude::*;
    use std::process::Command;

    /// Text with what breaks shells, comments and YAML, among ordinary characters.
    fn hostile() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[a-zA-Z0-9 _=:;,.'\"`$()\\\\\n\r\t\x00\x1b\x7f\u{85}\u{2028}\u{feff}#-]{0,24}",
            Just("x\n$(touch pwned)\n".to_string()),
            Just("x\r\ntouch pwned #".to_string()),
            Just("'; touch pwned; '".to_string()),
        ]
    }

    /// `script` sourced by a bash with an empty environment in an empty directory: the
    /// variables it exported (bash's own left out), and the files it left beside it.
    fn source_in_bash(script: &str, tail: &str) -> (BTreeMap<String, String>, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f.sh"), script).unwrap();
        let syntax = Command::new("bash")
            .arg("-n")
            .arg("f.sh")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            syntax.status.success(),
            "bash -n: {}\n{script}",
            String::from_utf8_lossy(&syntax.stderr)
        );
        let out = Command::new("bash")
            .args([
                "--norc",
                "--noprofile",
                "-c",
                &format!("set -a; . ./f.sh{tail}; set +a; env -0"),
            ])
            .env_clear()
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut env = BTreeMap::new();
        for kv in out.stdout.split(|b| *b == 0).filter(|kv| !kv.is_empty()) {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=').unwrap();
            if !["PWD", "SHLVL", "_", "OLDPWD"].contains(&k) {
                env.insert(k.to_string(), v.to_string());
            }
        }
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.retain(|f| f != "f.sh");
        (env, files)
    }

    fn hostile_report(label: &str, plan: &str, value: &str, plugin: &str) -> RunReport {
        let k = json!({"transport": "netplugin", "channels": 2, "socks_per_channel": 4,
                       "memory": value, "sock_buf": value, "thread_binding": value,
                       "irq_policy": value, "window": 4});
        let mut s = summary(label, k, &[4.0, 4.2, 4.1]);
        s.phase = label.to_string();
        s.experiment = format!("{value}{label}");
        // A slower configuration differing in every knob above, so that each is decided (only
        // decided knobs are exported); numbers where the hostile side has strings, so the two
        // never coincide.
        let base = json!({"transport": "socket", "channels": 1, "socks_per_channel": 1,
                          "memory": 0, "sock_buf": 0, "thread_binding": 0,
                          "irq_policy": 0, "window": 1});
        let mut b = summary(&format!("{label}base"), base, &[1.0, 1.1, 1.0]);
        b.phase = label.to_string();
        b.experiment = format!("{value}{label}base");
        let mut r = report(vec![s, b], vec![]);
        r.plan = plan.into();
        r.stamp = value.into();
        r.notes.push(value.into());
        r.setup.insert(SETUP_NET_PLUGIN.into(), plugin.into());
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// tuned.env from a report whose labels, names and values hold anything: `bash -n`
        /// accepts it, sourcing it sets exactly the variables tuned.json lists with their values
        /// and runs nothing, and the parser reads the same variables back.
        #[test]
        fn tuned_env_sources_exactly_its_variables(
            label in hostile(), plan in hostile(), value in hostile(), plugin in hostile()
        ) {
            let t = Tuned::from_report(&hostile_report(&label, &plan, &value, &plugin));
            let text = t.env_text();
            let (env, files) = source_in_bash(&text, "");
            let want: BTreeMap<String, String> = t.pairs().into_iter().collect();
            prop_assert_eq!(&env, &want, "{}", text);
            prop_assert!(files.is_empty(), "sourcing ran something: {:?}\n{}", files, text);
            prop_assert_eq!(parse_env(&text).unwrap().vars, t.pairs());
            // Every variable a value could reach is set or listed as not set.
            prop_assert!(want.contains_key("TCPX_MEMORY")
                || t.no_equivalent.iter().any(|n| n.reason.contains("TCPX_MEMORY")));
        }

        /// Every `apply` format, for any names and values: refused, or the shell forms source
        /// to exactly the variables, the Slurm line stays one line and the YAML parses back.
        #[test]
        fn snippets_carry_exactly_the_variables_or_are_refused(
            // Valid names under the tuned prefixes (a bare `_`, `PATH` or `UID` means something to
            // bash itself), or anything.
            vars in proptest::collection::vec((prop_oneof!["(NCCL|TCPX|UCCL_TCPX)_[A-Z0-9_]{0,8}", hostile()], hostile()), 1..4)
        ) {
            // One value per name, as a file gives them.
            let mut seen = std::collections::BTreeSet::new();
            let vars: Vec<(String, String)> = vars.into_iter().filter(|(k, _)| seen.insert(k.clone())).collect();
            let valid = vars.iter().all(|(k, v)| crate::safe::is_env_name(k) && env_value(k, v).is_ok());
            let shell = snippet(SnippetFormat::Shell, &vars);
            prop_assert_eq!(shell.is_ok(), valid);
            if !valid {
                for f in [SnippetFormat::Slurm, SnippetFormat::Torchrun, SnippetFormat::K8s] {
                    prop_assert!(snippet(f, &vars).is_err());
                }
                return Ok(());
            }
            let want: BTreeMap<String, String> = vars.iter().cloned().collect();
            let (env, files) = source_in_bash(&shell.unwrap(), "");
            prop_assert_eq!(&env, &want);
            prop_assert!(files.is_empty());
            // torchrun: the prefix applies to the command on its last line.
            let t = snippet(SnippetFormat::Torchrun, &vars).unwrap();
            let t = format!("torchrun() {{ env -0 > env.out; }}\n{t}");
            let (_, files) = source_in_bash(&t, "");
            prop_assert_eq!(files, vec!["env.out".to_string()]);
            // Slurm: one #SBATCH line whose list holds plain values only; the rest is shell.
            let slurm = snippet(SnippetFormat::Slurm, &vars).unwrap();
            let first = slurm.lines().next().unwrap();
            prop_assert!(first.starts_with("#SBATCH --export=ALL"));
            let mut got: BTreeMap<String, String> = first["#SBATCH --export=ALL".len()..]
                .split(',').filter(|x| !x.is_empty())
                .map(|kv| { let (k, v) = kv.split_once('=').unwrap(); (k.to_string(), v.to_string()) })
                .collect();
            let (body, files) = source_in_bash(&slurm, "");
            prop_assert!(files.is_empty());
            got.extend(body);
            prop_assert_eq!(&got, &want);
            // Kubernetes: the YAML parses to the same list.
            #[derive(serde::Deserialize)]
            struct Item { name: String, value: String }
            #[derive(serde::Deserialize)]
            struct Doc { env: Vec<Item> }
            let k = snippet(SnippetFormat::K8s, &vars).unwrap();
            let doc: Doc = serde_norway::from_str(&k).map_err(|e| TestCaseError::fail(format!("{e}: {k}")))?;
            let got: BTreeMap<String, String> = doc.env.into_iter().map(|i| (i.name, i.value)).collect();
            prop_assert_eq!(&got, &want);
        }
    }

    #[test]
    fn a_planted_command_in_a_label_does_not_run_when_tuned_env_is_sourced() {
        let r = hostile_report(
            "x\n$(touch pwned)\n",
            "p\r\ntouch pwned",
            "v'$(touch pwned)'",
            "/lib/p.so",
        );
        let text = Tuned::from_report(&r).env_text();
        let (env, files) = source_in_bash(&text, "");
        assert!(files.is_empty(), "{files:?}\n{text}");
        assert_eq!(
            env.get("NCCL_NET_PLUGIN").map(String::as_str),
            Some("/lib/p.so")
        );
        assert_eq!(
            env.get("TCPX_MEMORY").map(String::as_str),
            Some("v'$(touch pwned)'")
        );
    }

    #[test]
    fn apply_refuses_names_and_values_that_could_break_out() {
        for (k, v) in [
            ("EVIL;touch x", "1"),
            ("", "1"),
            ("A B", "1"),
            ("a", "1"),
            ("A", "1\n#SBATCH --x"),
            ("A", "\0"),
        ] {
            let vars = vec![(k.to_string(), v.to_string())];
            for f in [
                SnippetFormat::Shell,
                SnippetFormat::Slurm,
                SnippetFormat::Torchrun,
                SnippetFormat::K8s,
            ] {
                assert!(snippet(f, &vars).is_err(), "{k:?}={v:?} {f:?}");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut t = Tuned::from_report(&report(
            vec![
                summary("a", knobs(1, 1, 1), &[1.0]),
                summary("b", knobs(2, 2, 2), &[0.5]),
            ],
            vec![],
        ));
        t.variables[0].name = "EVIL;touch x".into();
        let p = dir.path().join("tuned.json");
        std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(
            e.contains("tuned.json") && e.contains("`EVIL;touch x` is not a variable name"),
            "{e}"
        );
        // A valid name outside what tuned files set (a planted LD_PRELOAD) is refused too.
        t.variables[0].name = "LD_PRELOAD".into();
        std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(
            e.contains("`LD_PRELOAD` is not a variable tuned files set"),
            "{e}"
        );
        // Issue 43: a variable listed twice in a tuned.json is refused as in a tuned.env.
        if t.variables.len() >= 2 {
            t.variables[0].name = t.variables[1].name.clone();
            std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
            let e = format!("{:#}", load(&p).unwrap_err());
            assert!(e.contains("is set twice"), "{e}");
        }
        let env = dir.path().join("tuned.env");
        std::fs::write(&env, "NCCL_X=1\nPATH=/tmp\n").unwrap();
        let e = format!("{:#}", load(&env).unwrap_err());
        assert!(e.contains("tuned.env") && e.contains("`PATH`"), "{e}");
        let e = format!("{:#}", load(Path::new("/dev/zero")).unwrap_err());
        assert!(e.contains("/dev/zero is a character device"), "{e}");
        // Issue 43: one variable set twice exported both lines.
        std::fs::write(&env, "NCCL_X=1\n# c\nexport NCCL_X=2\n").unwrap();
        let e = format!("{:#}", load(&env).unwrap_err());
        assert!(
            e.contains("line 3: NCCL_X is set again (first on line 1)"),
            "{e}"
        );
    }
}
