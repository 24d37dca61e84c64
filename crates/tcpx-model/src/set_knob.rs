//! An [`Experiment`]'s knobs set and read by [`Knob`], as text: what the command line gives and
//! what a plan's checked values are written as. One function per direction, so the command line,
//! the plan API, CSV and tuned.env reach every field the same way, and every refusal names the
//! knob's flag, so that a bad value is a usage error, never a panic or a silent truncation.
//!
//! A number is held to its range in the knob table ([`crate::KNOBS`]) here and nowhere else:
//! [`Experiment::check_ranges`] sends an experiment that arrived whole (the link, a flow
//! process's JSON) through the same functions.

use crate::{format_size, parse_size, parse_sizes, CpuSet, Experiment, Knob, Outside};

/// A whole number for flag `--name`, at least 0, that fits a `u32`.
pub fn count(name: &str, text: &str) -> Result<u32, String> {
    let t = text.trim();
    let v: i128 = t
        .parse()
        .map_err(|_| format!("--{name} `{text}` is not a whole number"))?;
    if v < 0 {
        return Err(format!("--{name} is {v}: it must not be negative"));
    }
    u32::try_from(v).map_err(|_| format!("--{name} {v} is too large (at most {})", u32::MAX))
}

/// A number of seconds for flag `--name`: finite, more than 0 and at most `max`.
pub fn seconds(name: &str, text: &str, max: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("--{name} `{text}` is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "--{name} `{text}`: give a positive number of seconds"
        ));
    }
    if v > max {
        return Err(format!(
            "--{name} {text} s is more than the {max} s this tool accepts"
        ));
    }
    Ok(v)
}

/// A byte count for flag `--name` (K, M, G = powers of 1024).
pub fn size(name: &str, text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| format!("--{name}: {e}"))
}

/// The name `knob`'s refusals give it: its flag, else its plan name.
fn flag_of(knob: Knob) -> &'static str {
    let spec = knob.spec();
    spec.flag.unwrap_or(spec.name)
}

/// `--flag VALUE is out of range: give MIN..=MAX`, from the knob table.
fn out_of_range(knob: Knob, value: &str) -> String {
    format!(
        "--{} {} is out of range: give {}",
        flag_of(knob),
        value.trim(),
        knob.spec().kind.range_text().unwrap_or_default()
    )
}

/// A whole number for `knob`, within its range in the knob table.
pub fn whole(knob: Knob, text: &str) -> Result<u32, String> {
    let v = count(flag_of(knob), text)?;
    if knob.spec().kind.admits(v.into()) {
        Ok(v)
    } else {
        Err(out_of_range(knob, text))
    }
}

/// A byte count for `knob`, within its range in the knob table.
pub fn bytes(knob: Knob, text: &str) -> Result<u64, String> {
    let v = size(flag_of(knob), text)?;
    if knob.spec().kind.admits(v.into()) {
        Ok(v)
    } else {
        Err(out_of_range(knob, text))
    }
}

/// Seconds for `knob`, within its range in the knob table.
pub fn secs(knob: Knob, text: &str) -> Result<f64, String> {
    let v = seconds(flag_of(knob), text, f64::MAX)?;
    if knob.spec().kind.admits_float(v) {
        Ok(v)
    } else {
        Err(out_of_range(knob, text))
    }
}

/// A list of message sizes for `knob`, each within its range in the knob table.
fn size_list(knob: Knob, text: &str) -> Result<Vec<u64>, String> {
    let sizes = parse_sizes(text).map_err(|e| format!("--{}: {e}", flag_of(knob)))?;
    match sizes.iter().find(|&&s| !knob.spec().kind.admits(s.into())) {
        Some(&s) => Err(out_of_range(knob, &format_size(s))),
        None => Ok(sizes),
    }
}

/// A cpu list for flag `--name`; the error names the flag and the list.
pub fn cpus(name: &str, text: Option<&str>) -> Result<Option<CpuSet>, String> {
    text.map(|c| c.parse().map_err(|e| format!("--{name} `{c}`: {e}")))
        .transpose()
}

/// On or off for flag `--name` (`on`/`off` as the command line writes it, `true`/`false` as
/// plans and reports do).
pub fn switch(name: &str, text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        other => Err(format!("--{name} `{other}`: use on or off")),
    }
}

const SINGLE_PROCESS: &str = "single-process";
const MULTI_PROCESS: &str = "multi-process";

impl Experiment {
    /// Sets `knob` from its values as text: one for most knobs; each occurrence for `env`
    /// (`KEY=VALUE`) and each name for `nics`; none leaves an optional knob (`chunk`,
    /// `sock_buf`, `zero_copy_min`, cpu lists, `sample_ms`) unset. The error names the knob's
    /// flag. `Ok(false)`: the knob acts outside the bench (a plan's label, repeat, plugin chunk,
    /// IRQ policy, thread binding, sampling), so an experiment has no place for it. `nics` here
    /// is this side's NIC names, as on the command line; a plan's NIC count is
    /// [`crate::Outside`]'s.
    pub fn set_knob<S: AsRef<str>>(&mut self, knob: Knob, values: &[S]) -> Result<bool, String> {
        let spec = knob.spec();
        let flag = spec.flag.unwrap_or(spec.name);
        let first = values.first().map(AsRef::as_ref);
        let one = || first.ok_or_else(|| format!("--{flag}: give a value"));
        let word = |e: &dyn std::fmt::Display| e.to_string();
        match knob {
            Knob::Name => self.name = one()?.to_string(),
            Knob::Transport => self.transport = one()?.parse().map_err(|e| word(&e))?,
            Knob::Memory => self.memory = one()?.parse().map_err(|e| word(&e))?,
            Knob::Sizes | Knob::Size => self.sizes = size_list(knob, one()?)?,
            Knob::Iters => self.iters = whole(knob, one()?)?,
            Knob::Warmup => self.warmup = whole(knob, one()?)?,
            Knob::Flows => self.flows = whole(knob, one()?)?,
            Knob::Channels => self.channels = whole(knob, one()?)?,
            Knob::SocksPerChannel => self.socks_per_channel = whole(knob, one()?)?,
            Knob::Chunk => self.chunk = first.map(|t| bytes(knob, t)).transpose()?,
            Knob::Window => {
                self.window = first
                    .filter(|t| t.trim() != "auto")
                    .map(|t| whole(knob, t))
                    .transpose()?
            }
            Knob::Verify => self.verify = switch(flag, one()?)?,
            Knob::SockBuf => self.sock_buf = first.map(|t| bytes(knob, t)).transpose()?,
            Knob::ZeroCopyMin => self.zero_copy_min = first.map(|t| bytes(knob, t)).transpose()?,
            Knob::Barrier => self.barrier = one()?.parse()?,
            Knob::WorkerCpus => self.worker_cpus = one()?.parse()?,
            Knob::StagingRing => self.staging_ring = first.map(|t| bytes(knob, t)).transpose()?,
            Knob::TimeoutS => self.timeout_s = secs(knob, one()?)?,
            Knob::Nics => {
                self.nics = values
                    .iter()
                    .map(|n| n.as_ref().trim().to_string())
                    .collect()
            }
            Knob::NicPolicy => self.nic_policy = one()?.parse().map_err(|e| word(&e))?,
            Knob::ProcessMode => {
                self.multi_process = match one()? {
                    MULTI_PROCESS => true,
                    SINGLE_PROCESS => false,
                    other => {
                        return Err(format!(
                            "process mode `{other}`: use {SINGLE_PROCESS} or {MULTI_PROCESS}"
                        ))
                    }
                }
            }
            Knob::SendCpus => self.send_cpus = cpus(flag, first)?,
            Knob::RecvCpus => self.recv_cpus = cpus(flag, first)?,
            Knob::SampleMs => self.sample_ms = first.map(|m| whole(knob, m)).transpose()?,
            Knob::Env => {
                self.env = values
                    .iter()
                    .map(|kv| match kv.as_ref().split_once('=') {
                        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                        _ => Err(format!("--{flag} `{}`: write it as KEY=VALUE", kv.as_ref())),
                    })
                    .collect::<Result<_, String>>()?
            }
            Knob::Label
            | Knob::PluginChunk
            | Knob::IrqPolicy
            | Knob::ThreadBinding
            | Knob::Sample
            | Knob::Repeat => return Ok(false),
        }
        Ok(true)
    }

    /// Every number of the experiment within its knob's range in the knob table, checked as
    /// [`Experiment::set_knob`] checks a flag: an experiment that arrived whole (the link's,
    /// a flow process's JSON) is held to the same ranges as one built from flags or a plan.
    pub fn check_ranges(&self) -> Result<(), String> {
        for spec in crate::KNOBS.iter().filter(|s| s.flag_kind().has_range()) {
            if let Some(text) = self.get_knob(spec.knob) {
                Experiment::default().set_knob(spec.knob, &text)?;
            }
        }
        Ok(())
    }

    /// `knob`'s values as text, in the form [`Experiment::set_knob`] takes back (sizes as one
    /// comma-separated list of byte counts; an unset optional knob as no value). `None`: the
    /// knob acts outside the bench, or (`size`) is written through another knob (`sizes`).
    pub fn get_knob(&self, knob: Knob) -> Option<Vec<String>> {
        let one = |s: String| Some(vec![s]);
        let opt = |v: Option<String>| Some(v.into_iter().collect());
        match knob {
            Knob::Name => one(self.name.clone()),
            Knob::Transport => one(self.transport.to_string()),
            Knob::Memory => one(self.memory.to_string()),
            Knob::Sizes => one(self
                .sizes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")),
            Knob::Iters => one(self.iters.to_string()),
            Knob::Warmup => one(self.warmup.to_string()),
            Knob::Flows => one(self.flows.to_string()),
            Knob::Channels => one(self.channels.to_string()),
            Knob::SocksPerChannel => one(self.socks_per_channel.to_string()),
            Knob::Chunk => opt(self.chunk.map(|c| c.to_string())),
            Knob::Window => opt(self.window.map(|w| w.to_string())),
            Knob::Verify => one(self.verify.to_string()),
            Knob::SockBuf => opt(self.sock_buf.map(|c| c.to_string())),
            Knob::ZeroCopyMin => opt(self.zero_copy_min.map(|c| c.to_string())),
            Knob::Barrier => one(self.barrier.to_string()),
            Knob::WorkerCpus => one(self.worker_cpus.to_string()),
            Knob::StagingRing => opt(self.staging_ring.map(|c| c.to_string())),
            Knob::TimeoutS => one(self.timeout_s.to_string()),
            Knob::Nics => Some(self.nics.clone()),
            Knob::NicPolicy => one(self.nic_policy.to_string()),
            Knob::ProcessMode => one(if self.multi_process {
                MULTI_PROCESS
            } else {
                SINGLE_PROCESS
            }
            .to_string()),
            Knob::SendCpus => opt(self.send_cpus.as_ref().map(CpuSet::to_string)),
            Knob::RecvCpus => opt(self.recv_cpus.as_ref().map(CpuSet::to_string)),
            Knob::SampleMs => opt(self.sample_ms.map(|m| m.to_string())),
            Knob::Env => Some(self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            Knob::Size
            | Knob::Label
            | Knob::PluginChunk
            | Knob::IrqPolicy
            | Knob::ThreadBinding
            | Knob::Sample
            | Knob::Repeat => None,
        }
    }
}

impl Outside {
    /// Sets a knob that acts outside the bench from its text (as [`Experiment::set_knob`]:
    /// the error names the knob); `Ok(false)` for a knob this does not hold. `nics` here is a
    /// plan's count of NICs per side.
    pub fn set_knob<S: AsRef<str>>(&mut self, knob: Knob, values: &[S]) -> Result<bool, String> {
        let name = knob.name();
        let one = || {
            values
                .first()
                .map(AsRef::as_ref)
                .ok_or_else(|| format!("{name}: give a value"))
        };
        match knob {
            Knob::Nics => self.nics = whole(knob, one()?)?,
            Knob::IrqPolicy => self.irq_policy = one()?.parse()?,
            Knob::ThreadBinding => self.thread_binding = one()?.parse()?,
            Knob::Sample => self.sample = switch(name, one()?)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A knob this holds, as text [`Outside::set_knob`] takes back; `None` for the others.
    pub fn get_knob(&self, knob: Knob) -> Option<Vec<String>> {
        let text = match knob {
            Knob::Nics => self.nics.to_string(),
            Knob::IrqPolicy => self.irq_policy.to_string(),
            Knob::ThreadBinding => self.thread_binding.to_string(),
            Knob::Sample => self.sample.to_string(),
            _ => return None,
        };
        Some(vec![text])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every knob an experiment holds reads back what was written, through text, and a knob it
    /// does not hold is said to act outside.
    #[test]
    fn every_experiment_knob_round_trips_through_text() {
        let mut e = Experiment::default();
        let set = |e: &mut Experiment, k: Knob, v: &[&str]| e.set_knob(k, v).unwrap();
        set(&mut e, Knob::Name, &["n"]);
        set(&mut e, Knob::Transport, &["netplugin"]);
        set(&mut e, Knob::Memory, &["cuda:0,1"]);
        set(&mut e, Knob::Sizes, &["1M..4M"]);
        set(&mut e, Knob::Chunk, &["256K"]);
        set(&mut e, Knob::Verify, &["off"]);
        set(&mut e, Knob::SockBuf, &["1M"]);
        set(&mut e, Knob::ZeroCopyMin, &["16K"]);
        set(&mut e, Knob::TimeoutS, &["2.5"]);
        set(&mut e, Knob::Nics, &["eth1", " eth2"]);
        set(&mut e, Knob::NicPolicy, &["closest-pci"]);
        set(&mut e, Knob::ProcessMode, &["multi-process"]);
        set(&mut e, Knob::SendCpus, &["0-3,8"]);
        set(&mut e, Knob::SampleMs, &["50"]);
        set(&mut e, Knob::Env, &["NCCL_X=1", "B=a=b"]);
        assert_eq!(e.sizes, [1 << 20, 2 << 20, 4 << 20]);
        assert_eq!(e.nics, ["eth1", "eth2"]);
        assert_eq!(e.env.get("B").map(String::as_str), Some("a=b"));
        assert!(e.multi_process && !e.verify);
        for &k in Knob::ALL {
            match e.get_knob(k) {
                Some(text) => {
                    let mut back = Experiment::default();
                    assert!(back.set_knob(k, &text).unwrap(), "{k}");
                    assert_eq!(back.get_knob(k), Some(text), "{k}");
                }
                None => {
                    let held = Experiment::default().set_knob(k, &["1"]);
                    assert!(k == Knob::Size || held == Ok(false), "{k}: {held:?}");
                }
            }
        }
    }

    #[test]
    fn outside_knobs_round_trip_and_leave_the_rest_to_the_experiment() {
        let mut o = Outside::default();
        assert_eq!(o.set_knob(Knob::Nics, &["2"]), Ok(true));
        assert_eq!(o.set_knob(Knob::IrqPolicy, &["nccl"]), Ok(true));
        assert_eq!(o.set_knob(Knob::ThreadBinding, &["numa-local"]), Ok(true));
        assert_eq!(o.set_knob(Knob::Sample, &["false"]), Ok(true));
        assert_eq!(o.set_knob(Knob::Window, &["2"]), Ok(false));
        assert!(o.set_knob(Knob::IrqPolicy, &["x"]).is_err());
        for &k in Knob::ALL {
            if let Some(text) = o.get_knob(k) {
                let mut back = Outside::default();
                assert_eq!(back.set_knob(k, &text), Ok(true), "{k}");
                assert_eq!(back.get_knob(k), Some(text), "{k}");
            }
        }
        assert_eq!(o.nics, 2);
        assert!(!o.sample);
    }

    #[test]
    fn a_bad_value_names_its_flag() {
        let mut e = Experiment::default();
        let mut err = |k: Knob, v: &str| e.set_knob(k, &[v]).unwrap_err();
        assert_eq!(
            err(Knob::Window, "-2"),
            "--window is -2: it must not be negative"
        );
        assert!(err(Knob::TimeoutS, "0").starts_with("--timeout"));
        assert!(err(Knob::Sizes, "x").starts_with("--size: "));
        assert!(err(Knob::SendCpus, "x").starts_with("--send-cpus `x`"));
        assert_eq!(err(Knob::Env, "=1"), "--env `=1`: write it as KEY=VALUE");
        assert!(err(Knob::Transport, "tcp").contains("tcp"));
        assert!(err(Knob::ProcessMode, "both").contains("multi-process"));
        assert!(e.set_knob::<&str>(Knob::Iters, &[]).is_err());
        assert_eq!(e.set_knob::<&str>(Knob::Chunk, &[]), Ok(true));
        assert_eq!(e.chunk, None);
        // Window, like chunk, is automatic when given no value or "auto".
        assert_eq!(e.set_knob(Knob::Window, &["8"]), Ok(true));
        assert_eq!(e.window, Some(8));
        assert_eq!(e.set_knob(Knob::Window, &["auto"]), Ok(true));
        assert_eq!(e.window, None);
        e.window = Some(8);
        assert_eq!(e.set_knob::<&str>(Knob::Window, &[]), Ok(true));
        assert_eq!(e.window, None);
    }
}
