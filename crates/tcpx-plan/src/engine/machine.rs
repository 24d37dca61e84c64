//! What a plan may read about the machine and its target set: `platform`, `targets_name`,
//! `target`, `has_target`, `topology`, `nics`, `irq_state`, `bindings`, `is_root`,
//! `require_root`. Read-only: the facts were gathered before the plan started.

use rhai::{Array, Dynamic, Engine, Map};

use super::values::{err, to_dynamic, RResult};
use super::Shared;
use crate::knobs::suggest;
use crate::targets::detect_platform;

/// What this module registers (name, number of arguments).
#[cfg(test)]
pub(super) const API: &[(&str, usize)] = &[
    ("platform", 0),
    ("targets_name", 0),
    ("target", 1),
    ("has_target", 1),
    ("topology", 0),
    ("nics", 0),
    ("irq_state", 1),
    ("bindings", 0),
    ("is_root", 0),
    ("require_root", 1),
];

pub(super) fn register(engine: &mut Engine, st: &Shared) {
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
            to_dynamic(&st.borrow().facts)
        });
    }
    {
        let st = st.clone();
        engine.register_fn("nics", move || -> Array {
            st.borrow().facts.nics.iter().map(to_dynamic).collect()
        });
    }
    {
        let st = st.clone();
        engine.register_fn("irq_state", move |nic: &str| -> RResult<Array> {
            let s = st.borrow();
            match s.facts.nics.iter().find(|n| n.name == nic) {
                Some(n) => Ok(n.irqs.iter().map(to_dynamic).collect()),
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
}
