//! The plan API's knob checks (types and ranges from the model's knob table) and
//! [`PlanExperiment`]: a `tcpx_model::Experiment` plus the knobs that act outside the bench (NICs,
//! IRQ policy, thread binding, process layout).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tcpx_model::{format_size, parse_size, parse_sizes, Experiment, Knob, Memory, Outside};

pub use tcpx_model::knob::{KnobKind, KnobSpec};

/// Every knob a plan may set, in the order reports list them: the plan rows of the model's knob
/// table ([`tcpx_model::KNOBS`]), where each knob is declared once.
pub const KNOBS: &[KnobSpec] = tcpx_model::PLAN_KNOBS;

/// Knobs that say how an experiment is run or named, not what is measured: two experiments
/// differing only in these are the same configuration.
pub const NOT_CONFIGURATION: &[&str] = &["name", "label", "repeat", "sample"];

/// Knob names for messages.
pub fn knob_names() -> Vec<&'static str> {
    KNOBS.iter().map(|k| k.name).collect()
}

/// `did you mean` for an unknown name, from `candidates` (Jaro-Winkler, then prefix match).
pub fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in candidates {
        let s = strsim::jaro_winkler(name, c).max(if c.starts_with(name) || name.starts_with(c) {
            0.85
        } else {
            0.0
        });
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((c, s));
        }
    }
    best.filter(|(_, s)| *s >= 0.75).map(|(c, _)| c)
}

/// Why a knob value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KnobError {
    #[error("unknown knob `{name}`{hint} (knobs: {all})")]
    Unknown {
        name: String,
        hint: String,
        all: String,
    },
    #[error("knob `{name}` wants {wanted}, got {got}")]
    Type {
        name: String,
        wanted: String,
        got: String,
    },
    #[error("knob `{name}` = {value} is out of range: {range}")]
    Range {
        name: String,
        value: String,
        range: String,
    },
}

/// A knob value as scripts and reports see it.
pub type KnobValue = Value;

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "() (nothing)".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) if n.is_f64() => format!("decimal {n}"),
        Value::Number(n) => format!("whole number {n}"),
        Value::String(s) => format!("text \"{s}\""),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "a map".into(),
    }
}

fn size_of(name: &str, v: &Value, min: u64, max: u64) -> Result<u64, KnobError> {
    let type_err = || KnobError::Type {
        name: name.into(),
        wanted: "a byte count (a whole number or a size such as \"512K\", \"4M\")".into(),
        got: describe(v),
    };
    let n = match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) if i >= 0 => i as u64,
            Some(i) => {
                return Err(KnobError::Range {
                    name: name.into(),
                    value: i.to_string(),
                    range: "it must not be negative".into(),
                })
            }
            None => return Err(type_err()),
        },
        Value::String(s) => parse_size(s).map_err(|e| KnobError::Type {
            name: name.into(),
            wanted: "a byte count such as \"512K\" or \"4M\"".into(),
            got: format!("\"{s}\" ({e})"),
        })?,
        _ => return Err(type_err()),
    };
    if n < min || n > max {
        return Err(KnobError::Range {
            name: name.into(),
            value: format_size(n),
            range: format!("{}..={}", format_size(min), format_size(max)),
        });
    }
    Ok(n)
}

/// Checks `v` against knob `name` and returns its normal form (sizes as numbers).
pub fn check(name: &str, v: &Value) -> Result<Value, KnobError> {
    let Some(knob) = KNOBS.iter().find(|k| k.name == name) else {
        let hint = suggest(name, knob_names())
            .map(|s| format!(": did you mean `{s}`?"))
            .unwrap_or_default();
        return Err(KnobError::Unknown {
            name: name.into(),
            hint,
            all: knob_names().join(", "),
        });
    };
    let type_err = |wanted: &str| KnobError::Type {
        name: name.into(),
        wanted: wanted.into(),
        got: describe(v),
    };
    match knob.kind {
        KnobKind::Int { min, max } => {
            let i = match v {
                Value::Number(n) => n.as_i64().ok_or_else(|| type_err("a whole number"))?,
                _ => return Err(type_err("a whole number")),
            };
            if i < min || i > max {
                return Err(KnobError::Range {
                    name: name.into(),
                    value: i.to_string(),
                    range: format!("{min}..={max}"),
                });
            }
            Ok(json!(i))
        }
        KnobKind::Size { min, max } => Ok(json!(size_of(name, v, min, max)?)),
        KnobKind::OptSize { min, max } => match v {
            Value::Null => Ok(Value::Null),
            Value::String(s) if s == "auto" => Ok(Value::Null),
            _ => Ok(json!(size_of(name, v, min, max)?)),
        },
        KnobKind::Sizes { min, max } => {
            let items = match v {
                Value::Array(a) => a.clone(),
                Value::Number(_) => vec![v.clone()],
                Value::String(s) => {
                    return parse_sizes(s)
                        .map_err(|e| KnobError::Type {
                            name: name.into(),
                            wanted: "sizes such as [\"1M\", \"4M\"] or \"1M..64M\"".into(),
                            got: format!("\"{s}\" ({e})"),
                        })
                        .and_then(|sizes| {
                            sizes
                                .iter()
                                .map(|&s| size_of(name, &json!(s), min, max).map(|n| json!(n)))
                                .collect::<Result<Vec<_>, _>>()
                                .map(Value::Array)
                        })
                }
                _ => return Err(type_err("an array of byte counts")),
            };
            if items.is_empty() {
                return Err(KnobError::Range {
                    name: name.into(),
                    value: "[]".into(),
                    range: "give at least one size".into(),
                });
            }
            items
                .iter()
                .map(|i| size_of(name, i, min, max).map(|n| json!(n)))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        KnobKind::Float { min, max } => {
            let f = match v {
                Value::Number(n) => n.as_f64().ok_or_else(|| type_err("a number"))?,
                _ => return Err(type_err("a number")),
            };
            if !(f >= min && f <= max) {
                return Err(KnobError::Range {
                    name: name.into(),
                    value: f.to_string(),
                    range: format!("{min}..={max}"),
                });
            }
            Ok(json!(f))
        }
        KnobKind::Bool => match v {
            Value::Bool(_) => Ok(v.clone()),
            _ => Err(type_err("true or false")),
        },
        KnobKind::Choice(words) => match v {
            Value::String(s) if words.contains(&s.as_str()) => Ok(v.clone()),
            Value::String(s) => {
                let hint = suggest(s, words.iter().copied())
                    .map(|w| format!(" (did you mean \"{w}\"?)"))
                    .unwrap_or_default();
                Err(KnobError::Range {
                    name: name.into(),
                    value: format!("\"{s}\""),
                    range: format!("one of {}{hint}", words.join(", ")),
                })
            }
            _ => Err(type_err(&format!("one of {}", words.join(", ")))),
        },
        // Cpu lists, settings and NIC names are command-line knobs, which plans do not set;
        // their text is kept as given.
        KnobKind::Text | KnobKind::Cpus | KnobKind::Settings | KnobKind::Names => match v {
            Value::String(_) => Ok(v.clone()),
            _ => Err(type_err("text")),
        },
        KnobKind::Memory => match v {
            Value::String(s) => match s.parse::<Memory>() {
                Ok(_) => Ok(v.clone()),
                Err(e) => Err(KnobError::Range {
                    name: name.into(),
                    value: format!("\"{s}\""),
                    range: e.to_string(),
                }),
            },
            _ => Err(type_err("host, cuda or cuda:S,R")),
        },
    }
}

/// An experiment as a plan holds it: every knob, already checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanExperiment {
    pub knobs: BTreeMap<String, Value>,
}

impl PlanExperiment {
    /// The defaults: `Experiment::default()` plus single-process, one NIC
    /// (round-robin), no IRQ policy, no binding, sampling on.
    pub fn defaults() -> Self {
        let e = Experiment::default();
        let mut k = BTreeMap::new();
        k.insert("name".into(), json!("base"));
        k.insert("transport".into(), json!(e.transport));
        k.insert("memory".into(), json!(e.memory));
        k.insert("sizes".into(), json!(e.sizes));
        k.insert("iters".into(), json!(e.iters));
        k.insert("warmup".into(), json!(e.warmup));
        k.insert("flows".into(), json!(e.flows));
        k.insert("channels".into(), json!(e.channels));
        k.insert("socks_per_channel".into(), json!(e.socks_per_channel));
        k.insert("chunk".into(), Value::Null);
        k.insert("window".into(), json!(e.window));
        k.insert("plugin_chunk".into(), Value::Null);
        k.insert("verify".into(), json!(e.verify));
        k.insert("sock_buf".into(), Value::Null);
        k.insert("timeout_s".into(), json!(e.timeout_s));
        k.insert("nics".into(), json!(1));
        k.insert("nic_policy".into(), json!(e.nic_policy));
        k.insert("irq_policy".into(), json!("default"));
        k.insert("thread_binding".into(), json!("none"));
        k.insert("process_mode".into(), json!("single-process"));
        k.insert("sample".into(), json!(true));
        k.insert("repeat".into(), json!(1));
        PlanExperiment { knobs: k }
    }

    /// Sets one knob after checking it (`size` sets `sizes`).
    pub fn set(&mut self, name: &str, v: &Value) -> Result<(), KnobError> {
        let v = check(name, v)?;
        if name == "size" {
            self.knobs.insert("sizes".into(), json!([v]));
        } else {
            self.knobs.insert(name.into(), v);
        }
        Ok(())
    }

    pub fn name(&self) -> String {
        self.text("name")
    }

    pub fn label(&self) -> String {
        match self.knobs.get("label") {
            Some(Value::String(s)) => s.clone(),
            _ => self.name(),
        }
    }

    /// A knob as text (strings bare, others as JSON).
    pub fn text(&self, name: &str) -> String {
        match self.knobs.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        }
    }

    /// How many repetitions to run (the `repeat` knob, at least 1).
    pub fn repeat(&self) -> u32 {
        (self.u64_of("repeat").clamp(1, 1000)) as u32
    }

    fn u64_of(&self, name: &str) -> u64 {
        self.knobs.get(name).and_then(Value::as_u64).unwrap_or(0)
    }

    pub fn sizes(&self) -> Vec<u64> {
        self.knobs
            .get("sizes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    }

    /// The bench experiment these knobs describe (the bench's own knobs only). `nics` is left
    /// empty: each side of a run names its own NICs (the runner fills them in); `process_mode`
    /// sets `multi_process`, whose children the runner starts.
    pub fn bench(&self) -> Experiment {
        let mut e = Experiment::default();
        let mut outside = Outside::default();
        for (knob, values) in self.texts() {
            // Values were checked when set (`check`), so they parse; a map built without `set`
            // keeps the bench's default for a value that does not.
            if outside.set_knob(knob, &values) != Ok(true) {
                let _ = e.set_knob(knob, &values);
            }
        }
        e.name = self.name();
        if e.transport == tcpx_model::Backend::NetPlugin {
            // Set before the plugin loads. Left unset ("auto"), the plan runner fills in the
            // leader's own value (the user's NCCL_DYNAMIC_CHUNK_SIZE, else Google's), so that
            // the follower and flow processes use what the leader does; never the plugin's 0.
            if let Some(chunk) = self.knobs.get("plugin_chunk").and_then(Value::as_u64) {
                e.env
                    .insert("NCCL_DYNAMIC_CHUNK_SIZE".into(), chunk.to_string());
            }
        }
        e
    }

    /// The knobs that act outside the bench, typed (as they travel to the follower).
    pub fn outside(&self) -> Outside {
        let mut o = Outside::default();
        for (knob, values) in self.texts() {
            let _ = o.set_knob(knob, &values);
        }
        o
    }

    /// Every knob set, as the text [`Experiment::set_knob`] and [`Outside::set_knob`] take:
    /// strings bare, numbers and booleans as written, lists joined by commas, `()` as no value.
    fn texts(&self) -> impl Iterator<Item = (Knob, Vec<String>)> + '_ {
        fn text(v: &Value) -> Option<String> {
            match v {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                Value::Array(a) => Some(a.iter().filter_map(text).collect::<Vec<_>>().join(",")),
                other => Some(other.to_string()),
            }
        }
        self.knobs.iter().filter_map(|(name, v)| {
            let knob = Knob::from_name(name)?;
            Some((knob, text(v).into_iter().collect()))
        })
    }

    /// Bytes every side moves in the whole experiment (warm-up included), for estimates.
    pub fn total_bytes(&self) -> u64 {
        let per_iter: u64 = self.sizes().iter().sum::<u64>() * self.u64_of("flows").max(1);
        per_iter * (self.u64_of("iters") + self.u64_of("warmup"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_knobs_suggest_the_nearest_name() {
        let e = check("windw", &json!(32)).unwrap_err().to_string();
        assert!(
            e.contains("unknown knob `windw`: did you mean `window`?"),
            "{e}"
        );
        let e = check("chunk_size", &json!(32)).unwrap_err().to_string();
        assert!(e.contains("did you mean `chunk`"), "{e}");
        let e = check("zzzz", &json!(1)).unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn wrong_types_and_ranges_are_named() {
        let e = check("window", &json!("32")).unwrap_err().to_string();
        assert_eq!(e, "knob `window` wants a whole number, got text \"32\"");
        let e = check("window", &json!(0)).unwrap_err().to_string();
        assert_eq!(e, "knob `window` = 0 is out of range: 1..=4096");
        let e = check("chunk", &json!("8G")).unwrap_err().to_string();
        assert!(e.contains("chunk` = 8G is out of range: 1..=1G"), "{e}");
        let e = check("irq_policy", &json!("ncl")).unwrap_err().to_string();
        assert!(e.contains("did you mean \"nccl\""), "{e}");
        assert_eq!(check("chunk", &json!("4M")).unwrap(), json!(4 << 20));
        assert_eq!(check("chunk", &json!("auto")).unwrap(), Value::Null);
        assert_eq!(
            check("sizes", &json!(["1M", 2048])).unwrap(),
            json!([1 << 20, 2048])
        );
        assert!(check("timeout_s", &json!(f64::NAN)).is_err());
    }

    #[test]
    fn memory_nic_policy_and_transport_values_are_checked() {
        for ok in ["host", "cuda", "cuda:0,4", "cuda:1,1"] {
            assert_eq!(check("memory", &json!(ok)).unwrap(), json!(ok), "{ok}");
        }
        let e = check("memory", &json!("gpu")).unwrap_err().to_string();
        assert!(
            e.starts_with("knob `memory` = \"gpu\" is out of range: memory `gpu`: use host, cuda")
                && e.contains("cuda:S,R"),
            "{e}"
        );
        let e = check("memory", &json!("cuda:0")).unwrap_err().to_string();
        assert!(e.contains("cuda:S,R"), "{e}");
        let e = check("memory", &json!(1)).unwrap_err().to_string();
        assert_eq!(
            e,
            "knob `memory` wants host, cuda or cuda:S,R, got whole number 1"
        );
        let e = check("nic_policy", &json!("round-robbin"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "knob `nic_policy` = \"round-robbin\" is out of range: one of round-robin, numa-local, closest-pci (did you mean \"round-robin\"?)"
        );
        assert!(check("nic_policy", &json!("explicit")).is_err());
        assert_eq!(
            check("transport", &json!("cudap2p")).unwrap(),
            json!("cudap2p")
        );
    }

    #[test]
    fn process_mode_and_nic_policy_reach_the_bench() {
        let mut e = PlanExperiment::defaults();
        assert_eq!(e.text("nic_policy"), "round-robin");
        e.set("process_mode", &json!("multi-process")).unwrap();
        e.set("nic_policy", &json!("closest-pci")).unwrap();
        e.set("memory", &json!("cuda:0,4")).unwrap();
        let b = e.bench();
        assert!(b.multi_process);
        assert_eq!(b.nic_policy, "closest-pci");
        assert_eq!(b.memory, "cuda:0,4");
        assert!(b.nics.is_empty(), "each side fills in its own NICs");
        assert_eq!(b.flow_index, None);
    }

    #[test]
    fn defaults_map_to_the_bench_defaults() {
        let d = PlanExperiment::defaults();
        let want = Experiment {
            name: "base".into(),
            ..Experiment::default()
        };
        assert_eq!(d.bench(), want);
        let mut e = d.clone();
        e.set("size", &json!("4M")).unwrap();
        assert_eq!(e.sizes(), vec![4 << 20]);
        assert_eq!(e.total_bytes(), (4 << 20) * 25);
    }

    #[test]
    fn a_netplugin_experiment_carries_the_plugin_chunk_the_plan_set() {
        let mut p = PlanExperiment::defaults();
        assert!(
            p.bench().env.is_empty(),
            "the socket backend gets no plugin variable"
        );
        p.set("transport", &json!("netplugin")).unwrap();
        assert_eq!(
            p.bench().env.get("NCCL_DYNAMIC_CHUNK_SIZE"),
            None,
            "auto: the plan runner fills in the leader's value"
        );
        p.set("plugin_chunk", &json!("1M")).unwrap();
        assert_eq!(
            p.bench()
                .env
                .get("NCCL_DYNAMIC_CHUNK_SIZE")
                .map(String::as_str),
            Some("1048576")
        );
        assert!(check("plugin_chunk", &json!(0)).is_err());
    }
}
