//! The plan API's knob checks (types and ranges from the model's knob table) and
//! [`PlanExperiment`]: a `tcpx_model::Experiment` plus the knobs that act outside the bench
//! (`tcpx_model::Outside`: NICs, IRQ policy, thread binding, sampling) and the plan's own
//! (label, repetitions, plugin chunk), typed. Scripts and reports see its knobs as a map by name
//! ([`PlanExperiment::knobs`]), each value in the type the knob table gives it.

use std::collections::{BTreeMap, BTreeSet};

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

/// The error for `value` outside `kind`'s range in the knob table.
fn out_of_range(name: &str, value: String, kind: &KnobKind) -> KnobError {
    KnobError::Range {
        name: name.into(),
        value,
        range: kind.range_text().unwrap_or_default(),
    }
}

fn size_of(name: &str, v: &Value, kind: &KnobKind) -> Result<u64, KnobError> {
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
    if !kind.admits(n.into()) {
        return Err(out_of_range(name, format_size(n), kind));
    }
    Ok(n)
}

/// Checks `v` against knob `name` and returns its normal form (sizes as numbers).
pub fn check(name: &str, v: &Value) -> Result<Value, KnobError> {
    checked(name, v).map(|(_, v)| v)
}

/// [`check`], with the knob `name` names.
fn checked(name: &str, v: &Value) -> Result<(Knob, Value), KnobError> {
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
    let value = match knob.kind {
        KnobKind::Int { .. } => {
            let i = match v {
                Value::Number(n) => n.as_i64().ok_or_else(|| type_err("a whole number"))?,
                _ => return Err(type_err("a whole number")),
            };
            if !knob.kind.admits(i.into()) {
                return Err(out_of_range(name, i.to_string(), &knob.kind));
            }
            Ok(json!(i))
        }
        KnobKind::OptInt { .. } => match v {
            Value::Null => Ok(Value::Null),
            Value::String(s) if s == "auto" => Ok(Value::Null),
            Value::Number(n) => {
                let i = n
                    .as_i64()
                    .ok_or_else(|| type_err("a whole number or \"auto\""))?;
                if !knob.kind.admits(i.into()) {
                    return Err(out_of_range(name, i.to_string(), &knob.kind));
                }
                Ok(json!(i))
            }
            _ => Err(type_err("a whole number or \"auto\"")),
        },
        KnobKind::Size { .. } => Ok(json!(size_of(name, v, &knob.kind)?)),
        KnobKind::OptSize { .. } => match v {
            Value::Null => Ok(Value::Null),
            Value::String(s) if s == "auto" => Ok(Value::Null),
            _ => Ok(json!(size_of(name, v, &knob.kind)?)),
        },
        KnobKind::Sizes { .. } => {
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
                                .map(|&s| size_of(name, &json!(s), &knob.kind).map(|n| json!(n)))
                                .collect::<Result<Vec<_>, _>>()
                                .map(Value::Array)
                                .map(|v| (knob.knob, v))
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
                .map(|i| size_of(name, i, &knob.kind).map(|n| json!(n)))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array)
        }
        KnobKind::Float { .. } => {
            let f = match v {
                Value::Number(n) => n.as_f64().ok_or_else(|| type_err("a number"))?,
                _ => return Err(type_err("a number")),
            };
            if !knob.kind.admits_float(f) {
                return Err(out_of_range(name, f.to_string(), &knob.kind));
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
    }?;
    Ok((knob.knob, value))
}

/// The knobs every plan experiment's knob map lists, set or not; the others
/// ([`Knob::Label`], [`Knob::ZeroCopyMin`]) are listed once a plan sets them, so that maps of
/// experiments that leave them alone read as they always have.
const ALWAYS_LISTED: &[Knob] = &[
    Knob::Name,
    Knob::Transport,
    Knob::Memory,
    Knob::Sizes,
    Knob::Iters,
    Knob::Warmup,
    Knob::Flows,
    Knob::Channels,
    Knob::SocksPerChannel,
    Knob::Chunk,
    Knob::Window,
    Knob::PluginChunk,
    Knob::Verify,
    Knob::SockBuf,
    Knob::TimeoutS,
    Knob::Nics,
    Knob::NicPolicy,
    Knob::IrqPolicy,
    Knob::ThreadBinding,
    Knob::ProcessMode,
    Knob::Sample,
    Knob::Repeat,
];

/// An experiment as a plan holds it: the bench experiment, the knobs that act outside the bench
/// (as they travel to the follower) and the plan's own bookkeeping, every value already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanExperiment {
    /// What the bench runs. Its `nics` stay empty: each side of a run names its own NICs (the
    /// runner fills them in); a plan's NIC count is [`Outside::nics`].
    pub bench: Experiment,
    /// NICs per side, IRQ policy, thread binding, sampling.
    pub outside: Outside,
    /// Configuration label in tables and charts; `None`: the name.
    pub label: Option<String>,
    /// Repetitions (at least 1).
    pub repeat: u32,
    /// GPUDirect-TCPX's NCCL_DYNAMIC_CHUNK_SIZE (netplugin only); `None`: the leader's.
    pub plugin_chunk: Option<u64>,
    /// Knobs beyond [`ALWAYS_LISTED`] a plan set, listed in [`PlanExperiment::knobs`].
    listed: BTreeSet<Knob>,
}

impl PlanExperiment {
    /// The defaults: `Experiment::default()` named `base`, plus single-process, one NIC
    /// (round-robin), no IRQ policy, no binding, sampling on.
    pub fn defaults() -> Self {
        PlanExperiment {
            bench: Experiment {
                name: "base".into(),
                ..Experiment::default()
            },
            outside: Outside::default(),
            label: None,
            repeat: 1,
            plugin_chunk: None,
            listed: BTreeSet::new(),
        }
    }

    /// Sets one knob after checking it (`size` sets `sizes`).
    pub fn set(&mut self, name: &str, v: &Value) -> Result<(), KnobError> {
        let (knob, v) = checked(name, v)?;
        let knob = if knob == Knob::Size {
            Knob::Sizes
        } else {
            knob
        };
        let values: Vec<String> = text_of(&v).into_iter().collect();
        let set = match self.outside.set_knob(knob, &values) {
            Ok(false) => match self.set_own(knob, &values) {
                Ok(false) => self.bench.set_knob(knob, &values),
                other => other,
            },
            other => other,
        };
        // A checked value always parses; were one not to, the refusal says why.
        set.map_err(|range| KnobError::Range {
            name: name.into(),
            value: v.to_string(),
            range,
        })?;
        if !ALWAYS_LISTED.contains(&knob) {
            self.listed.insert(knob);
        }
        Ok(())
    }

    /// Renames the experiment.
    pub fn rename(&mut self, name: String) {
        self.bench.name = name;
    }

    /// Gives the experiment its own label.
    pub fn relabel(&mut self, label: String) {
        self.label = Some(label);
        self.listed.insert(Knob::Label);
    }

    /// The knobs only a plan has (label, repetitions, plugin chunk); `Ok(false)` for others.
    fn set_own(&mut self, knob: Knob, values: &[String]) -> Result<bool, String> {
        let first = values.first().map(String::as_str);
        match knob {
            Knob::Label => self.label = first.map(str::to_string),
            Knob::Repeat => self.repeat = tcpx_model::set_knob::whole(knob, first.unwrap_or("1"))?,
            Knob::PluginChunk => {
                self.plugin_chunk = first
                    .map(|t| tcpx_model::set_knob::bytes(knob, t))
                    .transpose()?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A knob only a plan has, as text; `None` for others.
    fn get_own(&self, knob: Knob) -> Option<Vec<String>> {
        match knob {
            Knob::Label => Some(self.label.iter().cloned().collect()),
            Knob::Repeat => Some(vec![self.repeat.to_string()]),
            Knob::PluginChunk => Some(self.plugin_chunk.iter().map(u64::to_string).collect()),
            _ => None,
        }
    }

    /// `knob`'s value as scripts and reports see it (sizes as byte counts, an unset optional
    /// knob as `()`), in the type the knob table gives it.
    pub fn value(&self, knob: Knob) -> Value {
        let texts = self
            .outside
            .get_knob(knob)
            .or_else(|| self.get_own(knob))
            .or_else(|| self.bench.get_knob(knob))
            .unwrap_or_default();
        let first = texts.first().map(String::as_str);
        let number = |t: &str| t.parse::<i64>().map_or(Value::Null, |n| json!(n));
        match (knob.spec().kind, first) {
            (_, None) => Value::Null,
            (
                KnobKind::Int { .. }
                | KnobKind::OptInt { .. }
                | KnobKind::Size { .. }
                | KnobKind::OptSize { .. },
                Some(t),
            ) => number(t),
            (KnobKind::Sizes { .. }, Some(t)) => Value::Array(t.split(',').map(number).collect()),
            (KnobKind::Float { .. }, Some(t)) => t.parse::<f64>().map_or(Value::Null, |f| json!(f)),
            (KnobKind::Bool, Some(t)) => json!(t == "true"),
            (_, Some(t)) => json!(t),
        }
    }

    /// Every knob the experiment lists, as reports record them (JSON: an object by knob name);
    /// the backend's own settings ([`Self::set_backend_setting`]) as an object under `env`.
    pub fn knobs(&self) -> tcpx_report::KnobValues {
        Knob::ALL
            .iter()
            .filter(|k| ALWAYS_LISTED.contains(k) || self.listed.contains(k))
            .map(|&k| {
                let v = match k {
                    Knob::Env => json!(self.bench.env),
                    _ => self.value(k),
                };
                (k, v)
            })
            .collect()
    }

    /// Sets one of the backend's own settings, a variable of
    /// [`tcpx_model::setting::SETTINGS`] (or `NCCL_NET`, the network pin) that the backend
    /// reads from its process environment (the nccl backend's flow processes get `NCCL_*`
    /// entries): what `tune` varies. Anything else is refused, so a plan never sets an arbitrary
    /// variable of a process.
    pub fn set_backend_setting(&mut self, var: &str, value: &str) -> Result<(), String> {
        let known = var == "NCCL_NET" || tcpx_model::setting::SETTINGS.iter().any(|s| s.var == var);
        if !known {
            return Err(format!(
                "`{var}` is not a backend setting tcpx-lab knows (NCCL_NET or a variable of the \
                 settings table: `tcpx-run tune nccl --dry-run` lists them)"
            ));
        }
        if value.is_empty() || value.chars().any(char::is_control) {
            return Err(format!("{var}: give a value of one printable line"));
        }
        self.bench.env.insert(var.to_string(), value.to_string());
        self.listed.insert(Knob::Env);
        Ok(())
    }

    pub fn name(&self) -> String {
        self.bench.name.clone()
    }

    pub fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| self.name())
    }

    /// How many repetitions to run (the `repeat` knob, at least 1).
    pub fn repeat(&self) -> u32 {
        self.repeat.clamp(1, 1000)
    }

    pub fn sizes(&self) -> Vec<u64> {
        self.bench.sizes.clone()
    }

    /// The bench experiment to run: [`PlanExperiment::bench`], with the plan's plugin chunk in
    /// a netplugin experiment's settings. `process_mode` has set `multi_process`, whose children
    /// the runner starts.
    pub fn bench_to_run(&self) -> Experiment {
        let mut e = self.bench.clone();
        if e.transport.capabilities().loads_a_net_plugin() {
            // Set before the plugin loads. Left unset ("auto"), the plan runner fills in the
            // leader's own value (the user's NCCL_DYNAMIC_CHUNK_SIZE, else Google's), so that
            // the follower and flow processes use what the leader does; never the plugin's 0.
            if let Some(chunk) = self.plugin_chunk {
                e.env
                    .insert("NCCL_DYNAMIC_CHUNK_SIZE".into(), chunk.to_string());
            }
        }
        e
    }

    /// The report record of this experiment in `phase`, started `started_s` into the run, that
    /// runners fill in: ran, every knob applied, nothing measured yet.
    pub fn record(&self, phase: &str, started_s: f64) -> tcpx_report::ResultRecord {
        tcpx_report::ResultRecord {
            phase: phase.into(),
            experiment: self.name(),
            label: self.label(),
            knobs: self.knobs(),
            not_applied: tcpx_model::NotApplied::new(),
            status: tcpx_report::Status::Ok,
            reason: None,
            size: None,
            chunk: None,
            send: None,
            recv: None,
            started_s,
            duration_s: 0.0,
            per_flow: Vec::new(),
            nic_plan: BTreeMap::new(),
            rep: 0,
        }
    }

    /// Bytes every side moves in the whole experiment (warm-up included), for estimates.
    pub fn total_bytes(&self) -> u64 {
        let b = &self.bench;
        let per_iter: u64 = b.sizes.iter().sum::<u64>() * u64::from(b.flows.max(1));
        per_iter * (u64::from(b.iters) + u64::from(b.warmup))
    }
}

/// A checked value as the text [`Experiment::set_knob`] and [`Outside::set_knob`] take: strings
/// bare, numbers and booleans as written, lists joined by commas, `()` as no value.
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => Some(a.iter().filter_map(text_of).collect::<Vec<_>>().join(",")),
        other => Some(other.to_string()),
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
        assert_eq!(
            e,
            "knob `window` wants a whole number or \"auto\", got text \"32\""
        );
        assert_eq!(check("window", &json!("auto")).unwrap(), Value::Null);
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
        assert_eq!(e.value(Knob::NicPolicy), json!("round-robin"));
        e.set("process_mode", &json!("multi-process")).unwrap();
        e.set("nic_policy", &json!("closest-pci")).unwrap();
        e.set("memory", &json!("cuda:0,4")).unwrap();
        let b = e.bench_to_run();
        assert!(b.multi_process);
        assert_eq!(b.nic_policy, "closest-pci");
        assert_eq!(b.memory, "cuda:0,4");
        assert!(b.nics.is_empty(), "each side fills in its own NICs");
        assert_eq!(b.flow_index, None);
    }

    /// The knob map reports record: the defaults list the same knobs with the same values as
    /// when the experiment was a map, and a knob set beyond them (`label`, `zero_copy_min`) is
    /// listed once set, with its value in the table's type.
    #[test]
    fn the_knob_map_lists_the_defaults_and_what_a_plan_set() {
        let d = PlanExperiment::defaults();
        let want = json!({
            "name": "base", "transport": "socket", "memory": "host", "sizes": [64 << 20],
            "iters": 20, "warmup": 5, "flows": 1, "channels": 2, "socks_per_channel": 4,
            "chunk": null, "window": null, "plugin_chunk": null, "verify": true, "sock_buf": null,
            "timeout_s": 30.0, "nics": 1, "nic_policy": "round-robin", "irq_policy": "default",
            "thread_binding": "none", "process_mode": "single-process", "sample": true,
            "repeat": 1
        });
        assert_eq!(serde_json::to_value(d.knobs()).unwrap(), want);
        assert_eq!(
            serde_json::to_string(&d.knobs()).unwrap(),
            serde_json::to_string(&want).unwrap(),
            "same text, timeout_s a decimal"
        );
        let mut e = d.clone();
        e.set("zero_copy_min", &json!("16K")).unwrap();
        e.set("label", &json!("mine")).unwrap();
        e.set("size", &json!("1M")).unwrap();
        e.set("timeout_s", &json!(12)).unwrap();
        e.set("chunk", &json!("256K")).unwrap();
        e.set("plugin_chunk", &json!("1M")).unwrap();
        e.set("nics", &json!(2)).unwrap();
        e.set("repeat", &json!(3)).unwrap();
        let k = e.knobs();
        assert_eq!(k[&Knob::ZeroCopyMin], json!(16384));
        assert_eq!(k[&Knob::Label], json!("mine"));
        assert_eq!(k[&Knob::Sizes], json!([1 << 20]));
        assert_eq!(k[&Knob::TimeoutS], json!(12.0));
        assert_eq!(k[&Knob::Chunk], json!(256 << 10));
        assert_eq!(k[&Knob::PluginChunk], json!(1 << 20));
        assert_eq!(k[&Knob::Nics], json!(2));
        assert_eq!(k[&Knob::Repeat], json!(3));
        assert!(!k.contains_key(&Knob::Size));
        assert_eq!(k.len(), want.as_object().unwrap().len() + 2);
        assert_eq!(
            (e.label(), e.repeat(), e.outside.nics),
            ("mine".into(), 3, 2)
        );
        assert!(
            e.bench.nics.is_empty(),
            "a plan's NIC count is the outside knob's"
        );
        e.set("zero_copy_min", &json!("auto")).unwrap();
        assert_eq!(
            e.knobs()[&Knob::ZeroCopyMin],
            Value::Null,
            "still listed, now unset"
        );
    }

    #[test]
    fn defaults_map_to_the_bench_defaults() {
        let d = PlanExperiment::defaults();
        let want = Experiment {
            name: "base".into(),
            ..Experiment::default()
        };
        assert_eq!(d.bench_to_run(), want);
        let mut e = d.clone();
        e.set("size", &json!("4M")).unwrap();
        assert_eq!(e.sizes(), vec![4 << 20]);
        assert_eq!(e.total_bytes(), (4 << 20) * 25);
    }

    #[test]
    fn a_netplugin_experiment_carries_the_plugin_chunk_the_plan_set() {
        let mut p = PlanExperiment::defaults();
        assert!(
            p.bench_to_run().env.is_empty(),
            "the socket backend gets no plugin variable"
        );
        p.set("transport", &json!("netplugin")).unwrap();
        assert_eq!(
            p.bench_to_run().env.get("NCCL_DYNAMIC_CHUNK_SIZE"),
            None,
            "auto: the plan runner fills in the leader's value"
        );
        p.set("plugin_chunk", &json!("1M")).unwrap();
        assert_eq!(
            p.bench_to_run()
                .env
                .get("NCCL_DYNAMIC_CHUNK_SIZE")
                .map(String::as_str),
            Some("1048576")
        );
        assert!(check("plugin_chunk", &json!(0)).is_err());
    }
}
