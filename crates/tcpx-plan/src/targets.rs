//! Per-platform target sets: the thresholds criteria are held against, the experiment settings a
//! platform runs with (sizes, iterations, backend), and the throughput used for time estimates.
//! They live as TOML files in `plans/targets/`; the platform is detected from the system facts
//! or chosen with `--targets NAME|FILE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::system::SystemFacts;

/// Rounds a sequential comparison may take unless the target set says otherwise: 30 lets the
/// last looks shed up to four disturbed rounds (a shared 2-core VM disturbs one run in ten or
/// more; at 20 rounds a 25 % effect was decided 16 times in 20 there, see docs/PLANS.md).
pub const DEFAULT_MAX_ROUNDS: u32 = 30;

/// One target set.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSet {
    pub name: String,
    pub description: String,
    /// Where it was read from.
    pub path: PathBuf,
    /// Knob values every `experiment(...)` starts from (after the built-in defaults).
    pub base: BTreeMap<String, Value>,
    /// Named thresholds for criteria and decisions (`target("phase1_server_gbs")`).
    pub thresholds: BTreeMap<String, f64>,
    /// Other values plans read (`target("affinity_binding")`), e.g. binding names.
    pub settings: BTreeMap<String, Value>,
    /// Expected GB/s and per-experiment setup seconds, for `--budget` estimates.
    pub estimate_gbs: f64,
    pub setup_s: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetFile {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    base: toml::Table,
    #[serde(default)]
    thresholds: BTreeMap<String, f64>,
    #[serde(default)]
    settings: toml::Table,
    estimate: Estimate,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Estimate {
    gbs: f64,
    setup_s: f64,
}

fn to_json(t: &toml::Table) -> Result<BTreeMap<String, Value>, String> {
    t.iter()
        .map(|(k, v)| {
            serde_json::to_value(v)
                .map(|j| (k.clone(), j))
                .map_err(|e| format!("{k}: {e}"))
        })
        .collect()
}

impl TargetSet {
    /// Reads and checks a target file (every `base` knob is checked like a plan's).
    pub fn load(path: &Path) -> Result<TargetSet, String> {
        let text =
            tcpx_report::safe::read_bounded(path, crate::limits::MAX_PLAN_BYTES, "a target set")
                .map_err(|e| format!("cannot read target set {}: {e:#}", path.display()))?;
        let f: TargetFile =
            toml::from_str(&text).map_err(|e| format!("target set {}: {e}", path.display()))?;
        let base = to_json(&f.base).map_err(|e| format!("target set {}: {e}", path.display()))?;
        let mut probe = crate::knobs::PlanExperiment::defaults();
        for (k, v) in &base {
            probe
                .set(k, v)
                .map_err(|e| format!("target set {} [base]: {e}", path.display()))?;
        }
        for (k, v) in &f.thresholds {
            if !v.is_finite() {
                return Err(format!(
                    "target set {}: threshold `{k}` = {v} is not a finite number",
                    path.display()
                ));
            }
        }
        if let Some(n) = f
            .thresholds
            .get("noise")
            .filter(|n| !(0.0..1.0).contains(*n))
        {
            return Err(format!(
                "target set {}: noise = {n} is out of range: a fraction of the median in [0, 1), e.g. 0.05 for 5%",
                path.display()
            ));
        }
        if !(f.estimate.gbs > 0.0 && f.estimate.setup_s >= 0.0) {
            return Err(format!(
                "target set {}: estimate.gbs must be > 0 and setup_s >= 0",
                path.display()
            ));
        }
        let where_ = path.display();
        if let Some(v) = f.thresholds.get("max_rounds") {
            if !(v.is_finite() && *v >= 1.0 && *v <= 1000.0) {
                return Err(format!(
                    "target set {where_}: max_rounds {v}: give 1..=1000 rounds per comparison"
                ));
            }
        }
        if let Some(v) = f.thresholds.get("max_comparison_s") {
            if !(v.is_finite() && *v > 0.0) {
                return Err(format!(
                    "target set {where_}: max_comparison_s {v}: give seconds above 0"
                ));
            }
        }
        if let Some(v) = f.thresholds.get("noise_floor") {
            let why = f.settings.get("noise_floor_why").and_then(|w| w.as_str());
            if !(v.is_finite() && (0.0..1.0).contains(v)) {
                return Err(format!(
                    "target set {where_}: noise_floor {v}: give a fraction in 0..1 (0.05 = 5%)"
                ));
            }
            if why.is_none_or(|w| w.trim().is_empty()) {
                return Err(format!(
                    "target set {where_}: noise_floor raises the measured noise, so [settings] must say why in noise_floor_why"
                ));
            }
        }
        Ok(TargetSet {
            name: f.name,
            description: f.description,
            path: path.to_path_buf(),
            base,
            thresholds: f.thresholds,
            settings: to_json(&f.settings)
                .map_err(|e| format!("target set {}: {e}", path.display()))?,
            estimate_gbs: f.estimate.gbs,
            setup_s: f.estimate.setup_s,
        })
    }

    /// Most rounds one sequential comparison may take (`max_rounds`, default
    /// [`DEFAULT_MAX_ROUNDS`]).
    pub fn max_rounds(&self) -> u32 {
        self.thresholds
            .get("max_rounds")
            .map_or(DEFAULT_MAX_ROUNDS, |v| v.clamp(1.0, 1000.0) as u32)
    }

    /// Most seconds one sequential comparison may take (`max_comparison_s`, default 300).
    pub fn max_comparison_s(&self) -> f64 {
        self.thresholds
            .get("max_comparison_s")
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .unwrap_or(300.0)
    }

    /// The stated floor under a measured noise level and its reason, where the set gives one.
    pub fn noise_floor(&self) -> Option<(f64, String)> {
        let f = *self.thresholds.get("noise_floor")?;
        let why = self.settings.get("noise_floor_why")?.as_str()?.to_string();
        Some((f, why))
    }

    /// Names of everything `target(key)` answers.
    pub fn keys(&self) -> Vec<&str> {
        self.thresholds
            .keys()
            .chain(self.settings.keys())
            .map(String::as_str)
            .collect()
    }
}

/// The target set name for a machine: `a3-high` where there are at least 8 GPUs and 4 gVNIC
/// NICs, `gpu-one` where there is exactly one GPU, else `loopback` (any other machine: small
/// sizes, relative criteria).
pub fn detect_platform(facts: &SystemFacts) -> &'static str {
    let gve = facts.nics.iter().filter(|n| n.driver == "gve").count();
    if facts.gpus.len() >= 8 && gve >= 4 {
        "a3-high"
    } else if facts.gpus.len() == 1 {
        // One GPU carries both sides (and NCCL's two ranks as two hosts): plans measure GPU
        // memory there without a hand-written target file.
        "gpu-one"
    } else {
        "loopback"
    }
}

/// Resolves `--targets` (a name looked up in `dir`, or a path to a .toml file), or the
/// detected platform's set when `choice` is `None`.
pub fn choose(dir: &Path, choice: Option<&str>, facts: &SystemFacts) -> Result<TargetSet, String> {
    let name = choice.unwrap_or_else(|| detect_platform(facts));
    let as_path = Path::new(name);
    let path = if name.ends_with(".toml") || as_path.components().count() > 1 {
        as_path.to_path_buf()
    } else {
        dir.join(format!("{name}.toml"))
    };
    // Only a path with nothing there is an unknown name; anything else that is there (a FIFO,
    // a directory) is refused by the bounded read, naming what it is.
    if !path.exists() {
        let known: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(|n| n.strip_suffix(".toml"))
                            .map(String::from)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let hint = crate::knobs::suggest(name, known.iter().map(String::as_str))
            .map(|s| format!(" (did you mean `{s}`?)"))
            .unwrap_or_default();
        return Err(format!(
            "no target set `{name}` at {}{hint}; known: {}",
            path.display(),
            if known.is_empty() {
                "none (is the plans/targets directory there?)".to_string()
            } else {
                known.join(", ")
            }
        ));
    }
    TargetSet::load(&path)
}
