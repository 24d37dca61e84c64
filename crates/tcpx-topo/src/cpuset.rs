//! Sets of logical CPUs and their two text forms used by Linux and NCCL.
//!
//! * cpu lists: `"8-21,112-125"` (sysfs `cpulist`, `taskset -c`, NCCL bindings)
//! * hex masks: `"ffff,ffffffff,..."` (`/proc/irq/N/smp_affinity`): 32-bit words, most significant
//!   first, comma separated, as the kernel's `%*pb` format prints them for any CPU count.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Highest CPU number we accept from text (the cpu-list parser is `tcpx_model`'s).
pub use tcpx_model::MAX_CPU;

/// Why a cpu list or mask could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetParseError {
    #[error("cpu list {input:?}: {why} (expected e.g. \"0-3,8,10-11\")")]
    List { input: String, why: String },
    #[error("cpu mask {input:?}: {why} (expected comma-grouped hex words, e.g. \"ff,00000003\")")]
    Mask { input: String, why: String },
}

/// An ordered set of logical CPU numbers (Linux OS indexes).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parse a cpu list such as `"0-3,8,10-11"`. Whitespace around items is ignored; an empty
    /// string (what sysfs prints for an empty set) gives the empty set.
    pub fn parse_list(input: &str) -> Result<Self, CpuSetParseError> {
        tcpx_model::parse_cpu_list(input)
            .map(Self)
            .map_err(|e| CpuSetParseError::List {
                input: e.input,
                why: e.why,
            })
    }

    /// Parse a kernel hex mask (`/proc/irq/N/smp_affinity`, sysfs `cpumap`): comma separated 32-bit
    /// words, most significant first. Words may be shorter than 8 digits.
    pub fn parse_mask(input: &str) -> Result<Self, CpuSetParseError> {
        let err = |why: String| CpuSetParseError::Mask {
            input: input.to_string(),
            why,
        };
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Err(err("empty".into()));
        }
        let words: Vec<&str> = trimmed.split(',').collect();
        let mut set = BTreeSet::new();
        for (pos_from_right, word) in words.iter().rev().enumerate() {
            let word = word.trim().trim_start_matches("0x");
            if word.is_empty() || word.len() > 8 {
                return Err(err(format!("word {word:?} must have 1 to 8 hex digits")));
            }
            let bits =
                u32::from_str_radix(word, 16).map_err(|_| err(format!("{word:?} is not hex")))?;
            for bit in 0..32u32 {
                if bits & (1 << bit) != 0 {
                    let cpu = pos_from_right as u64 * 32 + u64::from(bit);
                    if cpu > u64::from(MAX_CPU) {
                        return Err(err(format!("bit {cpu} is above the Linux limit {MAX_CPU}")));
                    }
                    set.insert(cpu as u32);
                }
            }
        }
        Ok(Self(set))
    }

    /// Format as the kernel prints a mask of `nr_cpus` bits: 32-bit words most significant first,
    /// the first word only as wide as the remaining bits need (`nr_cpus = 208` gives
    /// `"ffff,ffffffff,..."` with 6 full words). `nr_cpus` is raised to cover the highest member.
    pub fn to_mask_string(&self, nr_cpus: u32) -> String {
        let needed = self.last().map_or(1, |m| m + 1);
        let nbits = nr_cpus.max(needed).max(1);
        let nwords = nbits.div_ceil(32);
        let mut words = vec![0u32; nwords as usize];
        for &cpu in &self.0 {
            words[(cpu / 32) as usize] |= 1 << (cpu % 32);
        }
        let top_bits = match nbits % 32 {
            0 => 32,
            r => r,
        };
        let top_digits = top_bits.div_ceil(4) as usize;
        let mut out = String::new();
        for (i, word) in words.iter().enumerate().rev() {
            if i + 1 == words.len() {
                out.push_str(&format!("{word:0top_digits$x}"));
            } else {
                out.push_str(&format!(",{word:08x}"));
            }
        }
        out
    }

    /// The compact list form, `"8-21,112-125"`; empty string for the empty set.
    pub fn to_list_string(&self) -> String {
        self.ranges()
            .iter()
            .map(|&(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Maximal runs of consecutive CPUs, as inclusive `(first, last)` pairs.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for &cpu in &self.0 {
            match out.last_mut() {
                Some((_, last)) if *last + 1 == cpu => *last = cpu,
                _ => out.push((cpu, cpu)),
            }
        }
        out
    }

    pub fn insert(&mut self, cpu: u32) -> bool {
        self.0.insert(cpu)
    }
    pub fn remove(&mut self, cpu: u32) -> bool {
        self.0.remove(&cpu)
    }
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }
    pub fn last(&self) -> Option<u32> {
        self.0.last().copied()
    }
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl Extend<u32> for CpuSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        self.0.extend(iter)
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_list(s)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list_string())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({:?})", self.to_list_string())
    }
}

/// Serialized as the cpu list string, the form people read and NCCL takes.
impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_list_string())
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse_list(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trip_and_ranges() {
        let s = CpuSet::parse_list("8-21,112-125").unwrap();
        assert_eq!(s.len(), 28);
        assert!(s.contains(8) && s.contains(21) && s.contains(112) && !s.contains(22));
        assert_eq!(s.to_list_string(), "8-21,112-125");
        let messy = CpuSet::parse_list(" 3, 1-2 ,0,7,5-6 ").unwrap();
        assert_eq!(messy.to_list_string(), "0-3,5-7");
        assert_eq!(CpuSet::parse_list("").unwrap(), CpuSet::new());
        assert_eq!(CpuSet::parse_list("4").unwrap().to_list_string(), "4");
    }

    #[test]
    fn list_rejects_garbage() {
        crate::assert_rejects(
            CpuSet::parse_list,
            &["1-", "a", "5-3", "1,,2", "9000", "-1", "1-2-3"],
        );
    }

    #[test]
    fn mask_formats_like_the_kernel() {
        let two = CpuSet::parse_list("0-1").unwrap();
        assert_eq!(two.to_mask_string(2), "3");
        assert_eq!(CpuSet::parse_list("1").unwrap().to_mask_string(2), "2");
        // 208 CPUs: a 16-bit top word (4 digits) then 6 full words.
        let all = CpuSet::parse_list("0-207").unwrap();
        assert_eq!(
            all.to_mask_string(208),
            format!("ffff{}", ",ffffffff".repeat(6))
        );
        let tx = CpuSet::parse_list("8-21,112-125").unwrap();
        let mask = tx.to_mask_string(208);
        assert_eq!(
            mask,
            "0000,00000000,00000000,3fff0000,00000000,00000000,003fff00"
        );
        assert_eq!(CpuSet::parse_mask(&mask).unwrap(), tx);
        // 64 CPUs: exactly two full words.
        assert_eq!(
            CpuSet::parse_list("0,63").unwrap().to_mask_string(64),
            "80000000,00000001"
        );
        // The width grows to cover a member beyond nr_cpus.
        assert_eq!(
            CpuSet::parse_list("40").unwrap().to_mask_string(8),
            "100,00000000"
        );
    }

    #[test]
    fn mask_parse_accepts_short_words_and_rejects_garbage() {
        assert_eq!(CpuSet::parse_mask("3\n").unwrap().to_list_string(), "0-1");
        assert_eq!(CpuSet::parse_mask("1,0").unwrap().to_list_string(), "32");
        assert_eq!(CpuSet::parse_mask("00000000").unwrap(), CpuSet::new());
        crate::assert_rejects(CpuSet::parse_mask, &["", "xyz", "123456789", "1,,2"]);
    }

    #[test]
    fn serde_uses_list_form() {
        let s = CpuSet::parse_list("0-3,8").unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"0-3,8\"");
        let back: CpuSet = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
