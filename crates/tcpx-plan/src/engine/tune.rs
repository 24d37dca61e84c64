//! `tune(base, space, budget)`: the tune search ([`crate::search`]) in a plan, every point an
//! experiment the plan's runner runs, recorded like any other.
//!
//! `space` maps each knob to vary to its levels, cheapest first: a plan knob (`chunk`,
//! `window`, `channels`, `socks_per_channel`, ...) or one of the backend's own settings (an
//! `NCCL_*` variable of [`tcpx_model::setting::SETTINGS`], with the level `"default"` for
//! leaving it unset). `budget` gives `points` (default 40), `seconds` (default 600), `seed`
//! (default 1) and `network` (`"socket"` or `"tcpx"`): the network NCCL is pinned to
//! (`NCCL_NET`) in every point and whose limits the settings are checked against. A point that
//! sets backend settings runs in fresh flow processes (`process_mode: "multi-process"`), since
//! NCCL reads its environment once per process. Each distinct configuration is one experiment
//! (`tune-N`), a configuration measured again is another repetition of it, so its figures sit
//! together in results.csv. The search's winner is recorded as the phase's ranking (tuned.env
//! takes it). The result map has `winner`, `base` and `finalists` (result maps), `gain` (`ratio`, `lo`, `hi`: winner over
//! base), `decision`, `effects` (what each changed knob is worth at the winner), `points`,
//! `failed` and `path` (every point in order).

use std::collections::BTreeMap;
use std::time::Instant;

use rhai::{Array, Dynamic, Engine, Map};
use tcpx_model::setting::{self, Network};
use tcpx_model::Knob;
use tcpx_report::{ResultRecord, Status};

use super::experiments::estimate_s;
use super::runs::{record_run, result_map, start_phase};
use super::values::{err, map_get, RResult};
use super::{Mode, Shared, MAX_PLAN_EXPERIMENTS};
use crate::knobs::PlanExperiment;
use crate::search::{Budget, Decision, Dim, Search, Space, Step};

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[("tune", 3)];

/// The level that leaves a backend setting unset.
const DEFAULT_LEVEL: &str = "default";

/// One dimension: a plan knob or a backend setting.
#[derive(Clone)]
enum DimKind {
    Knob,
    Setting,
}

/// The text of one level as the script gave it.
fn level_text(v: &Dynamic) -> Result<String, String> {
    if let Some(s) = v.clone().try_cast::<rhai::ImmutableString>() {
        return Ok(s.to_string());
    }
    if let Ok(i) = v.as_int() {
        return Ok(i.to_string());
    }
    if let Ok(f) = v.as_float() {
        return Ok(f.to_string());
    }
    if let Ok(b) = v.as_bool() {
        return Ok(b.to_string());
    }
    Err(format!(
        "a level must be a number or text, got {}",
        v.type_name()
    ))
}

/// `exp` with `coords`' levels set.
fn point(
    base: &PlanExperiment,
    space: &Space,
    kinds: &[DimKind],
    coords: &[usize],
    pin: Option<Network>,
    name: &str,
) -> Result<PlanExperiment, String> {
    let network = pin.unwrap_or(Network::Socket);
    let mut e = base.clone();
    let mut settings = false;
    for ((d, k), &i) in space.dims.iter().zip(kinds).zip(coords) {
        let level = &d.levels[i];
        match k {
            DimKind::Knob => {
                let j = serde_json::from_str::<serde_json::Value>(level)
                    .unwrap_or_else(|_| serde_json::Value::String(level.clone()));
                e.set(&d.name, &j).map_err(|x| x.to_string())?;
            }
            DimKind::Setting => {
                settings = true;
                if level != DEFAULT_LEVEL {
                    // As NCCL parses it: plain digits (it reads `2M` as 2).
                    let spec = setting::spec(network, &d.name)
                        .ok_or_else(|| format!("`{}` is not a setting of this network", d.name))?;
                    let value = spec.text(spec.parse(level)?);
                    e.set_backend_setting(&d.name, &value)?;
                }
            }
        }
    }
    if let Some(n) = pin {
        e.set_backend_setting("NCCL_NET", n.nccl_net_name())?;
        settings = true;
    }
    if settings {
        e.bench.multi_process = true;
    }
    e.rename(name.to_string());
    e.relabel(format!("{name}: {}", space.describe(coords)));
    Ok(e)
}

/// The figure a point's records give: the receiver's busbw at the largest size, or why it has
/// none.
fn figure(records: &[ResultRecord]) -> Result<f64, String> {
    let Some(main) = records.iter().max_by_key(|r| r.size.unwrap_or(0)) else {
        return Err("the runner returned no record".into());
    };
    if let Some(bad) = records.iter().find(|r| r.status != Status::Ok) {
        return Err(format!(
            "{}: {}",
            bad.status.as_str(),
            bad.reason.clone().unwrap_or_default()
        ));
    }
    main.recv
        .as_ref()
        .map(|f| f.busbw_gbs)
        .ok_or_else(|| "no receiver figure".to_string())
}

fn tune(st: &Shared, base: PlanExperiment, space_map: Map, budget_map: Map) -> RResult<Map> {
    let opt_int = |k: &str, d: i64| -> RResult<i64> {
        let v = map_get(&budget_map, k);
        if v.is_unit() {
            return Ok(d);
        }
        v.as_int()
            .map_err(|_| format!("tune: budget `{k}` wants a whole number").into())
    };
    for k in budget_map.keys() {
        if !["points", "seconds", "seed", "network"].contains(&k.as_str()) {
            return err(format!(
                "tune: unknown budget key `{k}` (points, seconds, seed, network)"
            ));
        }
    }
    let points = opt_int("points", 40)?;
    let seed = opt_int("seed", 1)?;
    let seconds = {
        let v = map_get(&budget_map, "seconds");
        if v.is_unit() {
            600.0
        } else {
            v.as_float()
                .or_else(|_| v.as_int().map(|i| i as f64))
                .map_err(|_| "tune: budget `seconds` wants a number".to_string())?
        }
    };
    let pin = {
        let v = map_get(&budget_map, "network");
        if v.is_unit() {
            None
        } else {
            let t = v.into_string().map_err(|_| "tune: `network` wants text")?;
            Some(t.parse::<Network>().map_err(|e| format!("tune: {e}"))?)
        }
    };
    let network = pin.unwrap_or(Network::Socket);
    let mut dims = Vec::new();
    let mut kinds = Vec::new();
    let mut base_coords = Vec::new();
    for (name, levels) in &space_map {
        let name = name.to_string();
        let Some(levels) = levels.clone().try_cast::<Array>() else {
            return err(format!("tune: `{name}` wants an array of levels"));
        };
        let texts = levels
            .iter()
            .map(level_text)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("tune: `{name}`: {e}"))?;
        let kind = if let Some(spec) = setting::spec(network, &name) {
            for t in &texts {
                if t != DEFAULT_LEVEL {
                    spec.parse(t).map_err(|e| format!("tune: {e}"))?;
                }
            }
            DimKind::Setting
        } else if Knob::from_name(&name).is_some_and(|k| k.spec().in_plan) {
            for t in &texts {
                let mut probe = base.clone();
                let j = serde_json::from_str::<serde_json::Value>(t)
                    .unwrap_or_else(|_| serde_json::Value::String(t.clone()));
                probe
                    .set(&name, &j)
                    .map_err(|x| format!("tune: `{name}`: {x}"))?;
            }
            DimKind::Knob
        } else {
            return err(format!(
                "tune: `{name}` is neither a plan knob nor a setting of {} (NCCL's and the \
                 network's variables: `tcpx-run tune nccl --dry-run` lists them)",
                network.nccl_net_name()
            ));
        };
        let at = match kind {
            DimKind::Setting => texts.iter().position(|t| t == DEFAULT_LEVEL),
            DimKind::Knob => {
                let now = base.value(Knob::from_name(&name).expect("checked"));
                texts.iter().position(|t| {
                    serde_json::from_str::<serde_json::Value>(t)
                        .unwrap_or_else(|_| serde_json::Value::String(t.clone()))
                        == now
                })
            }
        };
        base_coords.push(at.unwrap_or(0));
        kinds.push(kind);
        dims.push(Dim {
            name,
            levels: texts,
        });
    }
    let space = Space::new(dims).map_err(|e| format!("tune: {e}"))?;
    let budget = Budget {
        points: usize::try_from(points).unwrap_or(0),
        seconds,
    };
    // Every point an experiment name of its own at most: within the plan's limit.
    {
        let s = st.borrow();
        if s.names.len() + budget.points > MAX_PLAN_EXPERIMENTS {
            return err(format!(
                "tune: {} points would take the plan past {MAX_PLAN_EXPERIMENTS} experiments",
                budget.points
            ));
        }
    }
    let key_space = space.clone();
    let key_kinds = kinds.clone();
    let mut search = Search::new(space.clone(), base_coords.clone(), budget, seed as u64)
        .map_err(|e| format!("tune: {e}"))?
        .with_key(move |c| {
            // NCCL's clamps make some points one configuration.
            let vars: BTreeMap<String, String> = key_space
                .dims
                .iter()
                .zip(&key_kinds)
                .zip(c)
                .filter(|((d, k), &i)| {
                    matches!(k, DimKind::Setting) && d.levels[i] != DEFAULT_LEVEL
                })
                .map(|((d, _), &i)| (d.name.clone(), d.levels[i].clone()))
                .collect();
            let knobs: Vec<String> = key_space
                .dims
                .iter()
                .zip(&key_kinds)
                .zip(c)
                .filter(|((_, k), _)| matches!(k, DimKind::Knob))
                .map(|((d, _), &i)| format!("{}={}", d.name, d.levels[i]))
                .collect();
            let eff = setting::effective(network, &vars)
                .map(|e| format!("{:?}", e.values))
                .unwrap_or_else(|_| format!("{c:?}"));
            format!("{eff} {knobs:?}")
        });
    let (mode, phase, runner) = {
        let mut s = st.borrow_mut();
        start_phase(&mut s)?;
        let one = estimate_s(&s.targets, &base);
        let n = budget.points as f64;
        s.est_s += (one * n).min(seconds);
        s.worst_s += (one * n).min(seconds);
        s.runs += budget.points;
        (s.mode, s.phase.clone(), s.runner.clone())
    };
    if mode == Mode::Dry {
        // The configurations it may measure, named as the real run names them.
        let planned = budget
            .points
            .min(space.size().min(usize::MAX as u128) as usize);
        {
            let mut s = st.borrow_mut();
            let mut n = 1;
            for _ in 0..planned {
                while s.names.contains(&format!("tune-{n}")) {
                    n += 1;
                }
                let name = format!("tune-{n}");
                s.names.insert(name.clone());
                s.order.push(name);
            }
        }
        let mut m = Map::new();
        m.insert("planned".into(), Dynamic::from(true));
        m.insert("points".into(), Dynamic::from(budget.points as i64));
        m.insert(
            "configurations".into(),
            Dynamic::from(space.size().min(i64::MAX as u128) as i64),
        );
        m.insert("winner".into(), Dynamic::UNIT);
        return Ok(m);
    }
    let Some(runner) = runner else {
        return err("no runner is attached to this plan run");
    };
    // Configurations by key: their experiment and every record.
    let mut configs: Vec<(String, PlanExperiment, Vec<ResultRecord>)> = Vec::new();
    let mut path = Array::new();
    let t0 = Instant::now();
    while let Step::Measure(req) = search.next(t0.elapsed().as_secs_f64()) {
        let key = space.describe(&req.coords);
        let idx = match configs.iter().position(|(k, _, _)| *k == key) {
            Some(i) => i,
            None => {
                let mut s = st.borrow_mut();
                let mut n = configs.len() + 1;
                let mut name = format!("tune-{n}");
                while s.names.contains(&name) {
                    n += 1;
                    name = format!("tune-{n}");
                }
                let exp = point(&base, &space, &kinds, &req.coords, pin, &name)
                    .map_err(|e| format!("tune: {e}"))?;
                s.names.insert(name.clone());
                s.order.push(name);
                configs.push((key, exp, Vec::new()));
                configs.len() - 1
            }
        };
        let started = st.borrow().t0.elapsed().as_secs_f64();
        let t = Instant::now();
        let outcome = runner.borrow_mut().run(&configs[idx].1, &phase, started);
        let cost = t.elapsed().as_secs_f64();
        let rep = configs[idx].2.iter().map(|r| r.rep).max().unwrap_or(0) + 1;
        let got = record_run(st, outcome, rep)?;
        let value = figure(&got);
        configs[idx].2.extend(got);
        let mut p = Map::new();
        p.insert("id".into(), Dynamic::from(req.id as i64));
        p.insert(
            "phase".into(),
            Dynamic::from(req.phase.as_str().to_string()),
        );
        p.insert("config".into(), Dynamic::from(configs[idx].1.name()));
        p.insert("label".into(), Dynamic::from(space.describe(&req.coords)));
        match &value {
            Ok(v) => p.insert("gbs".into(), Dynamic::from(*v)),
            Err(e) => p.insert("failed".into(), Dynamic::from(e.clone())),
        };
        path.push(Dynamic::from(p));
        search
            .record(req.id, value, cost)
            .map_err(|e| format!("tune: {e}"))?;
    }
    let outcome = search.outcome();
    // The search's decision is the plan's ranking of this phase: tuned.env takes its winner,
    // and the knobs that differ among the configurations measured are the ones it decided.
    if let Some(w) = &outcome.winner {
        let key = space.describe(w);
        if let Some((_, exp, _)) = configs.iter().find(|(k, _, _)| *k == key) {
            let candidates: Vec<String> = configs
                .iter()
                .filter(|(_, _, r)| figure(r).is_ok())
                .map(|(_, e, _)| e.label())
                .collect();
            let text = format!(
                "tune: {} ({}) of {} configurations measured in {} points",
                exp.label(),
                match &outcome.decision {
                    Decision::Clear => "ahead of the other finalists beyond noise".to_string(),
                    Decision::CheapestOfTied { others } => format!(
                        "the cheapest of {} finalists tied within noise",
                        others.len() + 1
                    ),
                    _ => "the highest median when the budget ended the race".to_string(),
                },
                candidates.len(),
                search.records().len()
            );
            st.borrow_mut().report.rankings.push(tcpx_report::Ranking {
                phase: phase.clone(),
                metric: "server_gbs".into(),
                best: exp.label(),
                tied: Vec::new(),
                identical: Vec::new(),
                ranked: candidates.len() > 1,
                noise: crate::search::NOISE,
                text,
                candidates,
                method: format!(
                    "{}: ratio of medians, bootstrap 95% interval",
                    tcpx_report::tuned::TUNE_RANKING_METHOD
                ),
            });
        }
    }
    let result_of = |coords: &[usize]| -> Dynamic {
        let key = space.describe(coords);
        configs
            .iter()
            .find(|(k, _, _)| *k == key)
            .map_or(Dynamic::UNIT, |(_, e, r)| {
                Dynamic::from(result_map(e, &phase, r, false))
            })
    };
    let mut m = Map::new();
    m.insert(
        "winner".into(),
        outcome
            .winner
            .as_ref()
            .map_or(Dynamic::UNIT, |w| result_of(w)),
    );
    m.insert("base".into(), result_of(&base_coords));
    m.insert(
        "finalists".into(),
        Dynamic::from(
            outcome
                .finalists
                .iter()
                .map(|c| result_of(&c.coords))
                .filter(|d| !d.is_unit())
                .collect::<Array>(),
        ),
    );
    let gain = tcpx_report::stats::ratio_of_medians(&outcome.base_samples, &outcome.winner_samples);
    m.insert(
        "gain".into(),
        gain.map_or(Dynamic::UNIT, |g| {
            let mut x = Map::new();
            x.insert("ratio".into(), Dynamic::from(g.ratio));
            x.insert("lo".into(), Dynamic::from(g.lo));
            x.insert("hi".into(), Dynamic::from(g.hi));
            Dynamic::from(x)
        }),
    );
    let decision = match &outcome.decision {
        Decision::Clear => "clear",
        Decision::CheapestOfTied { .. } => "cheapest_of_tied",
        Decision::Undecided => "undecided",
        Decision::NoneSucceeded => "none_succeeded",
    };
    m.insert("decision".into(), Dynamic::from(decision.to_string()));
    m.insert(
        "effects".into(),
        Dynamic::from(
            outcome
                .effects
                .iter()
                .map(|e| {
                    let mut x = Map::new();
                    x.insert("knob".into(), Dynamic::from(e.dim.clone()));
                    x.insert("winner".into(), Dynamic::from(e.winner_level.clone()));
                    x.insert("base".into(), Dynamic::from(e.base_level.clone()));
                    x.insert("gain".into(), e.gain.map_or(Dynamic::UNIT, Dynamic::from));
                    Dynamic::from(x)
                })
                .collect::<Array>(),
        ),
    );
    let records = search.records();
    m.insert("points".into(), Dynamic::from(records.len() as i64));
    m.insert(
        "failed".into(),
        Dynamic::from(records.iter().filter(|r| r.value.is_err()).count() as i64),
    );
    m.insert("path".into(), Dynamic::from(path));
    Ok(m)
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    let st = st.clone();
    engine.register_fn(
        "tune",
        move |base: PlanExperiment, space: Map, budget: Map| -> RResult<Map> {
            tune(&st, base, space, budget)
        },
    );
}
