//! CPU lists as Linux and NCCL write them (`8-21,112-125`): the one parser of that text.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// Highest CPU number accepted from text. Linux allows up to 8192 (`CONFIG_NR_CPUS` max); a
/// bigger number in input is a typo, not a machine.
pub const MAX_CPU: u32 = 8191;

/// Why a cpu list could not be read: the text and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cpu list {input:?}: {why} (expected e.g. \"0-3,8,10-11\")")]
pub struct CpuListError {
    pub input: String,
    pub why: String,
}

/// Parses a cpu list such as `"0-3,8,10-11"`. Whitespace around items is ignored; an empty
/// string (what sysfs prints for an empty set) gives the empty set.
pub fn parse_cpu_list(input: &str) -> Result<BTreeSet<u32>, CpuListError> {
    let err = |why: String| CpuListError {
        input: input.to_string(),
        why,
    };
    let mut set = BTreeSet::new();
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Ok(set);
    }
    for item in trimmed.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(err("empty item between commas".into()));
        }
        let parse_cpu = |s: &str| -> Result<u32, CpuListError> {
            let n: u32 = s
                .trim()
                .parse()
                .map_err(|_| err(format!("{s:?} is not a CPU number")))?;
            if n > MAX_CPU {
                return Err(err(format!("CPU {n} is above the Linux limit {MAX_CPU}")));
            }
            Ok(n)
        };
        match item.split_once('-') {
            Some((a, b)) => {
                let (lo, hi) = (parse_cpu(a)?, parse_cpu(b)?);
                if lo > hi {
                    return Err(err(format!("range {item:?} runs backwards")));
                }
                set.extend(lo..=hi);
            }
            None => {
                set.insert(parse_cpu(item)?);
            }
        }
    }
    Ok(set)
}

/// The CPUs a side's threads are pinned to, as the cpu list it was given: the text is kept as
/// written (it is what reports and the pinning read-back show), the set is checked on parsing.
#[derive(Debug, Clone)]
pub struct CpuSet {
    text: String,
    cpus: BTreeSet<u32>,
}

impl CpuSet {
    /// The list as it was written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The CPU numbers, ascending.
    pub fn cpus(&self) -> &BTreeSet<u32> {
        &self.cpus
    }

    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

impl PartialEq for CpuSet {
    /// Two lists are the same value when written the same (what both sides compare on the wire).
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CpuSet {}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for CpuSet {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<Self, CpuListError> {
        Ok(CpuSet {
            text: s.to_string(),
            cpus: parse_cpu_list(s)?,
        })
    }
}

crate::serde_as_text!(CpuSet, "a cpu list such as \"0-3,8\"");
