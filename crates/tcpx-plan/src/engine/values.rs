//! Script values: errors raised from Rust, JSON <-> Rhai through rhai's serde support, and
//! reading result maps.

use rhai::{Dynamic, EvalAltResult, Map, Position};
use serde::Serialize;
use serde_json::Value;

pub(crate) type RResult<T> = Result<T, Box<EvalAltResult>>;

/// A run-time error for the script; Rhai gives it the position of the call that raised it.
pub(crate) fn err<T>(msg: impl Into<String>) -> RResult<T> {
    Err(Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(msg.into()),
        Position::NONE,
    )))
}

/// Rhai value -> JSON (knob values, maps for criteria). Values JSON cannot hold (functions,
/// experiments, timestamps, blobs) are refused, naming their type.
pub(crate) fn to_json(d: &Dynamic) -> Result<Value, String> {
    // A variable a closure captured is shared: read through it.
    let d = d.flatten_clone();
    rhai::serde::from_dynamic::<Value>(&d).map_err(|e| match *e {
        EvalAltResult::ErrorMismatchOutputType(_, found, _) => {
            format!("a value of type {found} cannot be used here")
        }
        _ => format!("a value of type {} cannot be used here", d.type_name()),
    })
}

/// Any serializable value (JSON, facts, figures) -> Rhai value; `()` for what Rhai cannot hold
/// (nothing the engine passes).
pub(crate) fn to_dynamic<T: Serialize + ?Sized>(v: &T) -> Dynamic {
    rhai::serde::to_dynamic(v).unwrap_or(Dynamic::UNIT)
}

pub(crate) fn map_get(m: &Map, k: &str) -> Dynamic {
    m.get(k).cloned().unwrap_or(Dynamic::UNIT)
}

/// A number (integer or float) as f64.
pub(crate) fn as_f64(d: &Dynamic) -> Option<f64> {
    d.as_float()
        .ok()
        .or_else(|| d.as_int().ok().map(|i| i as f64))
}

/// The text under `k`, or "" when there is none.
pub(crate) fn text_of(m: &Map, k: &str) -> String {
    map_get(m, k).into_string().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trips_through_rhai() {
        let v = json!({ "a": 1, "b": [1.5, "x", null, true], "c": { "d": u64::MAX } });
        let d = to_dynamic(&v);
        let back = to_json(&d).unwrap();
        assert_eq!(back["a"], json!(1));
        assert_eq!(back["b"], json!([1.5, "x", null, true]));
        // Beyond i64: a float, as JSON numbers are read back.
        assert_eq!(back["c"]["d"].as_f64(), Some(u64::MAX as f64));
        assert!(d.is_map());
    }

    #[test]
    fn values_json_cannot_hold_are_refused_by_type() {
        let e = to_json(&Dynamic::from(rhai::FnPtr::new("f").unwrap())).unwrap_err();
        assert!(e.contains("cannot be used here"), "{e}");
        #[derive(Clone)]
        struct Opaque;
        let e = to_json(&Dynamic::from(Opaque)).unwrap_err();
        assert!(
            e.contains("Opaque") && e.contains("cannot be used here"),
            "{e}"
        );
    }
}
