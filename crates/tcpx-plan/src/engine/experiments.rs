//! Experiments in scripts: the `Experiment` type, `experiment(map)`, `exp.with_knobs(map)`, its
//! knobs by index and name, `estimate_s(exp)` and `not_applied_here(exp)`.

use rhai::{Dynamic, Engine, Map};
use serde_json::Value;
use tcpx_model::{format_size, Knob, KnobKind};

use super::values::{err, to_dynamic, to_json, RResult};
use super::Shared;
use crate::knobs::{knob_names, suggest, PlanExperiment};
use crate::targets::TargetSet;

/// The method that derives an experiment: `base.with_knobs(#{ window: 32 })`. (`with` itself is
/// a reserved word in Rhai; [`super::sandbox`] answers `.with(` with this name.)
pub(crate) const WITH_KNOBS: &str = "with_knobs";

/// What this module registers (name, number of arguments, the receiver counted).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[
    ("to_string", 1),
    ("to_debug", 1),
    ("index$get$", 2),
    ("get$name", 1),
    ("get$label", 1),
    ("experiment", 1),
    ("with_knobs", 2),
    ("estimate_s", 1),
    ("not_applied_here", 1),
];

/// A knob's value as derived names and labels show it: byte counts as sizes (`4M`), by the
/// knob's type in the table.
fn value_text(knob: Knob, v: &Value) -> String {
    match (knob.spec().kind, v) {
        (_, Value::Null) => "auto".into(),
        (KnobKind::Size { .. } | KnobKind::OptSize { .. }, Value::Number(n)) => {
            n.as_u64().map_or_else(|| n.to_string(), format_size)
        }
        (KnobKind::Sizes { .. }, Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(format_size)
            .collect::<Vec<_>>()
            .join("+"),
        (_, Value::String(s)) => s.clone(),
        _ => v.to_string(),
    }
}

/// `base.with_knobs(map)`: a new experiment with the knobs of `map` changed (checked), a
/// derived name and label unless the map gives them.
/// Knobs whose change leaves a derived name and label alone.
const NOT_NAMING: &[Knob] = &[Knob::Name, Knob::Label, Knob::Repeat];

pub(super) fn with_knobs(base: &PlanExperiment, changes: &Map) -> Result<PlanExperiment, String> {
    let mut e = base.clone();
    let mut pairs = Vec::new();
    for (k, v) in changes {
        let j = to_json(v).map_err(|m| format!("knob `{k}`: {m}"))?;
        e.set(k, &j).map_err(|x| x.to_string())?;
        // How often it runs is not part of what it is: `repeat` leaves names and labels alone.
        if let Some(knob) = Knob::from_name(k).filter(|k| !NOT_NAMING.contains(k)) {
            let knob = if knob == Knob::Size {
                Knob::Sizes
            } else {
                knob
            };
            pairs.push((knob, value_text(knob, &e.value(knob))));
        }
    }
    if !changes.contains_key("name") && !pairs.is_empty() {
        let suffix: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{k}{v}").replace([' ', '/'], ""))
            .collect();
        e.rename(format!("{}-{}", base.name(), suffix.join("-")));
    }
    if !changes.contains_key("label") && !pairs.is_empty() {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        e.relabel(text.join(" "));
    }
    Ok(e)
}

pub(super) fn estimate_s(t: &TargetSet, e: &PlanExperiment) -> f64 {
    t.setup_s + e.total_bytes() as f64 * 2.0 / (t.estimate_gbs * 1e9)
}

pub(super) fn register(engine: &mut Engine, st: &Shared) {
    engine.register_type_with_name::<PlanExperiment>("Experiment");
    engine.register_fn("to_string", |e: &mut PlanExperiment| {
        format!("experiment {} ({})", e.name(), e.label())
    });
    engine.register_fn("to_debug", |e: &mut PlanExperiment| {
        // As the map by name it was: `{"channels": Number(2), ...}`.
        let knobs = e.knobs();
        let by_name: std::collections::BTreeMap<&str, &serde_json::Value> =
            knobs.iter().map(|(k, v)| (k.name(), v)).collect();
        format!("{by_name:?}")
    });
    engine.register_indexer_get(|e: &mut PlanExperiment, k: &str| -> RResult<Dynamic> {
        match Knob::from_name(k).and_then(|knob| e.knobs().remove(&knob)) {
            Some(v) => Ok(to_dynamic(&v)),
            None if k == "label" => Ok(Dynamic::from(e.label())),
            None => {
                let hint = suggest(k, knob_names())
                    .map(|s| format!(": did you mean `{s}`?"))
                    .unwrap_or_default();
                err(format!("unknown knob `{k}`{hint}"))
            }
        }
    });
    engine.register_get("name", |e: &mut PlanExperiment| e.name());
    engine.register_get("label", |e: &mut PlanExperiment| e.label());

    {
        let st = st.clone();
        engine.register_fn("experiment", move |m: Map| -> RResult<PlanExperiment> {
            let base = st.borrow().targets.base.clone();
            let mut e = PlanExperiment::defaults();
            for (k, v) in &base {
                e.set(k, v).map_or_else(|x| err(x.to_string()), Ok)?;
            }
            for (k, v) in &m {
                let j = to_json(v).map_or_else(|x| err(format!("knob `{k}`: {x}")), Ok)?;
                e.set(k, &j).map_or_else(|x| err(x.to_string()), Ok)?;
            }
            Ok(e)
        });
    }
    engine.register_fn(
        WITH_KNOBS,
        |e: &mut PlanExperiment, m: Map| -> RResult<PlanExperiment> {
            with_knobs(e, &m).map_or_else(err, Ok)
        },
    );
    {
        let st = st.clone();
        engine.register_fn("estimate_s", move |e: PlanExperiment| -> f64 {
            estimate_s(&st.borrow().targets, &e)
        });
    }
    {
        let st = st.clone();
        engine.register_fn("not_applied_here", move |e: PlanExperiment| -> Map {
            let runner = st.borrow().runner.clone();
            let mut m = Map::new();
            if let Some(r) = runner {
                for (k, v) in r.borrow().not_applied(&e) {
                    m.insert(k.name().into(), Dynamic::from(v));
                }
            }
            m
        });
    }
}
