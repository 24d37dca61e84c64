//! Several runs' decided settings as one: `tcpx-run apply RUN1 RUN2 ...` merges the variables
//! each run's tuned.env exports (only what that plan decided, see [`crate::tuned`]) and names
//! every conflict (one variable set to different values by different runs) with the run each
//! value came from. How a conflict is settled is the caller's [`OnConflict`].

use crate::safe::{comment, env_name, env_value, shell_word};
use crate::tuned::{TunedFile, IRQ_DIRECTIVE};

/// What to do when runs set one variable to different values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// Refuse: nothing is printed, the conflicts are the error.
    Error,
    /// Leave the variable out (NCCL's default applies).
    Omit,
    /// Take the value of the first run that sets it (in the order given).
    First,
    /// Take the value of the last run that sets it.
    Last,
}

/// One variable of the merged set and the runs it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedVar {
    pub name: String,
    pub value: String,
    /// The runs that set this value (several when they agree).
    pub runs: Vec<String>,
    /// The other values other runs gave, when it was a conflict settled by first/last.
    pub overruled: Vec<(String, String)>,
}

/// One variable set to different values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub name: String,
    /// `(value, run)` in the order given.
    pub values: Vec<(String, String)>,
}

impl Conflict {
    pub fn text(&self) -> String {
        let vs: Vec<String> = self
            .values
            .iter()
            .map(|(v, r)| format!("{v} (from {r})"))
            .collect();
        format!("{} is set to {}", self.name, vs.join(" and "))
    }
}

/// The merged settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Merged {
    pub vars: Vec<MergedVar>,
    pub conflicts: Vec<Conflict>,
    /// The IRQ policy and the run it came from, when the runs agree on one (or one sets it).
    pub irq_policy: Option<(String, String)>,
}

impl Merged {
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.vars
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect()
    }

    /// A merged tuned.env: every variable with a comment naming its run(s), then the conflicts.
    pub fn env_text(&self) -> String {
        let mut s = String::from(
            "# tuned.env merged by `tcpx-run apply` from several plan runs: each variable names the\n\
             # run it came from; only knobs those plans decided are set.\n",
        );
        for v in &self.vars {
            s.push_str(&format!("# from {}", comment(&v.runs.join(", "))));
            if !v.overruled.is_empty() {
                let o: Vec<String> = v
                    .overruled
                    .iter()
                    .map(|(val, r)| format!("{val} from {r}"))
                    .collect();
                s.push_str(&format!(
                    " (conflict: overruled {})",
                    comment(&o.join(", "))
                ));
            }
            s.push('\n');
            // A name or value no shell line can carry safely is left out, saying why.
            match env_name(&v.name).and_then(|n| env_value(n, &v.value)) {
                Ok(_) => s.push_str(&format!("{}={}\n", v.name, shell_word(&v.value))),
                Err(e) => s.push_str(&format!("# not set: {}\n", comment(&e.to_string()))),
            }
        }
        let left_out: Vec<&Conflict> = self
            .conflicts
            .iter()
            .filter(|c| !self.vars.iter().any(|v| v.name == c.name))
            .collect();
        if !left_out.is_empty() {
            s.push_str("\n# --- conflicts left out (not set)\n");
            for c in left_out {
                s.push_str(&format!("# {}\n", comment(&c.text())));
            }
        }
        if let Some((p, run)) = &self.irq_policy {
            s.push_str(&format!(
                "\n# --- IRQ policy (from {}): `tcpx-run apply --irq` applies it\n{IRQ_DIRECTIVE} {}\n",
                comment(run),
                comment(p)
            ));
        }
        s
    }
}

/// Merges `runs` (`(run name, file)`) in the given order. With [`OnConflict::Error`] the
/// conflicts are returned in `Merged::conflicts` and no conflicting variable is in `vars`:
/// the caller refuses.
pub fn merge(runs: &[(String, TunedFile)], on: OnConflict) -> Merged {
    let mut m = Merged::default();
    // name -> [(value, run)] in order.
    let mut seen: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (run, f) in runs {
        for (k, v) in &f.vars {
            match seen.iter_mut().find(|(n, _)| n == k) {
                Some((_, vs)) => vs.push((v.clone(), run.clone())),
                None => seen.push((k.clone(), vec![(v.clone(), run.clone())])),
            }
        }
    }
    for (name, vs) in seen {
        let mut distinct: Vec<&str> = vs.iter().map(|(v, _)| v.as_str()).collect();
        distinct.dedup();
        distinct.sort_unstable();
        distinct.dedup();
        let runs_of = |value: &str| -> Vec<String> {
            vs.iter()
                .filter(|(v, _)| v == value)
                .map(|(_, r)| r.clone())
                .collect()
        };
        if distinct.len() == 1 {
            m.vars.push(MergedVar {
                value: vs[0].0.clone(),
                runs: runs_of(&vs[0].0),
                name,
                overruled: vec![],
            });
            continue;
        }
        m.conflicts.push(Conflict {
            name: name.clone(),
            values: vs.clone(),
        });
        let pick = match on {
            OnConflict::Error | OnConflict::Omit => continue,
            OnConflict::First => vs[0].0.clone(),
            OnConflict::Last => vs[vs.len() - 1].0.clone(),
        };
        m.vars.push(MergedVar {
            runs: runs_of(&pick),
            overruled: vs.iter().filter(|(v, _)| *v != pick).cloned().collect(),
            value: pick,
            name,
        });
    }
    let irqs: Vec<(String, String)> = runs
        .iter()
        .filter_map(|(r, f)| f.irq_policy.clone().map(|p| (p, r.clone())))
        .collect();
    let mut policies: Vec<&str> = irqs.iter().map(|(p, _)| p.as_str()).collect();
    policies.sort_unstable();
    policies.dedup();
    match policies.len() {
        0 => {}
        1 => m.irq_policy = irqs.first().cloned(),
        _ => {
            m.conflicts.push(Conflict {
                name: "IRQ policy".into(),
                values: irqs.clone(),
            });
            m.irq_policy = match on {
                OnConflict::First => irqs.first().cloned(),
                OnConflict::Last => irqs.last().cloned(),
                _ => None,
            };
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn file(vars: &[(&str, &str)], irq: Option<&str>) -> TunedFile {
        TunedFile {
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            irq_policy: irq.map(String::from),
            irq_tx: None,
            irq_rx: None,
            source: PathBuf::from("x"),
        }
    }

    #[test]
    fn agreeing_runs_merge_and_conflicts_are_named_with_their_runs() {
        let runs = vec![
            (
                "window".to_string(),
                file(
                    &[
                        ("UCCL_TCPX_WINDOW_SIZE", "16"),
                        ("NCCL_BUFFSIZE", "8388608"),
                    ],
                    None,
                ),
            ),
            (
                "chunk".to_string(),
                file(
                    &[
                        ("NCCL_P2P_NET_CHUNKSIZE", "1048576"),
                        ("NCCL_BUFFSIZE", "16777216"),
                    ],
                    Some("nccl"),
                ),
            ),
            (
                "channels".to_string(),
                file(
                    &[
                        ("NCCL_NCHANNELS_PER_NET_PEER", "4"),
                        ("UCCL_TCPX_WINDOW_SIZE", "16"),
                    ],
                    None,
                ),
            ),
        ];
        let m = merge(&runs, OnConflict::Error);
        assert_eq!(m.conflicts.len(), 1);
        assert_eq!(
            m.conflicts[0].text(),
            "NCCL_BUFFSIZE is set to 8388608 (from window) and 16777216 (from chunk)"
        );
        assert!(!m.pairs().iter().any(|(k, _)| k == "NCCL_BUFFSIZE"));
        let w = m
            .vars
            .iter()
            .find(|v| v.name == "UCCL_TCPX_WINDOW_SIZE")
            .unwrap();
        assert_eq!(w.runs, ["window", "channels"]);
        assert_eq!(m.irq_policy, Some(("nccl".into(), "chunk".into())));

        let last = merge(&runs, OnConflict::Last);
        let b = last
            .vars
            .iter()
            .find(|v| v.name == "NCCL_BUFFSIZE")
            .unwrap();
        assert_eq!(
            (b.value.as_str(), b.runs.as_slice()),
            ("16777216", &["chunk".to_string()][..])
        );
        let text = last.env_text();
        assert!(
            text.contains(
                "# from chunk (conflict: overruled 8388608 from window)\nNCCL_BUFFSIZE=16777216\n"
            ),
            "{text}"
        );
        let parsed = crate::tuned::parse_env(&text).unwrap();
        assert_eq!(parsed.vars, last.pairs());
        assert_eq!(parsed.irq_policy.as_deref(), Some("nccl"));

        let omit = merge(&runs, OnConflict::Omit).env_text();
        assert!(
            omit.contains("# --- conflicts left out (not set)\n# NCCL_BUFFSIZE is set to"),
            "{omit}"
        );
        assert_eq!(
            merge(&runs, OnConflict::First)
                .vars
                .iter()
                .find(|v| v.name == "NCCL_BUFFSIZE")
                .unwrap()
                .value,
            "8388608"
        );
    }
}
