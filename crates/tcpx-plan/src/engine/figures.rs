//! What result maps hold, read the same way by runs, statistics and criteria: a metric's
//! figures (rebuilt from its repetitions), whether a value is a gain estimate, whether two
//! results are the same experiment (they differ only in knobs not applied), and the noise level
//! comparisons are judged against.

use rhai::{Array, Dynamic, Map};
use serde_json::Value;
use tcpx_report::FigureStats;

use super::values::{as_f64, map_get, to_json};
use super::Shared;
use crate::knobs::NOT_CONFIGURATION;

/// The statistics of `metric` in a result map, rebuilt from its repetitions.
pub(super) fn figure_of(r: &Map, metric: &str) -> Option<FigureStats> {
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

/// The noise level comparisons use and which rule gave it: the measured A/A spread (raised to
/// the target set's `noise_floor` where that is larger, with its stated reason), else the target
/// set's `noise`.
pub(super) fn noise_choice(st: &Shared) -> (f64, String) {
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

pub(super) fn noise_level(st: &Shared) -> f64 {
    noise_choice(st).0
}

/// Knobs in which `a` and `b` (result maps) differ, and whether every one of them was not
/// applied on at least one side: then they are the same experiment here.
pub(super) fn same_experiment(a: &Map, b: &Map) -> Option<Vec<String>> {
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

pub(super) fn why_same(a: &Map, b: &Map, knobs: &[String]) -> String {
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

pub(super) fn is_estimate(d: &Dynamic) -> bool {
    d.is_map()
        && map_get(&d.clone().cast::<Map>(), "kind")
            .into_string()
            .ok()
            .as_deref()
            == Some("gain")
}

pub(super) fn figure_from_stats_map(d: &Dynamic) -> Option<FigureStats> {
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
