//! Byte counts as people type them: `4096`, `512K`, `64M`, `1G`, `1MiB` (binary multiples, as in
//! nccl-tests), lists `1M,4M` and doubling ranges `1M..1G`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A byte count. On the wire (JSON) a plain number, as before; as text, [`format_size`]'s form.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    pub fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for Bytes {
    fn from(v: u64) -> Self {
        Bytes(v)
    }
}

impl From<Bytes> for u64 {
    fn from(b: Bytes) -> Self {
        b.0
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

impl FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s).map(Bytes)
    }
}

/// Parses one size. Suffixes K, M, G, T (optionally followed by `iB` or `B`) are powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "size `{text}` is negative: sizes are positive byte counts like 64M"
        ));
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "size `{text}` has no number: write it like 4096, 512K, 64M or 1G"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size `{text}` is too large"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "size `{text}` has an unknown unit `{other}`: use K, M, G or T (powers of 1024)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{text}` is too large"))
}

/// Parses a comma list of sizes or doubling ranges (`1M..1G` gives 1M, 2M, 4M, ... 1G).
pub fn parse_sizes(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((lo, hi)) = part.split_once("..") {
            let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
            if lo == 0 || lo > hi {
                return Err(format!(
                    "range `{part}` must go from a positive size up to a larger one"
                ));
            }
            let mut s = lo;
            while s <= hi {
                out.push(s);
                s = match s.checked_mul(2) {
                    Some(n) => n,
                    None => break,
                };
            }
        } else {
            out.push(parse_size(part)?);
        }
    }
    if out.is_empty() {
        return Err(format!("no size in `{text}`: write e.g. 64M or 1M..1G"));
    }
    Ok(out)
}

/// Formats a byte count the way [`parse_size`] reads it, exactly (`1536` stays `1536`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}
