//! When each timed iteration ran, on a clock every process of a host shares.
//!
//! Per-iteration times say how fast each flow was; they cannot say whether the flows of
//! different processes moved bytes at the same time. CLOCK_MONOTONIC is one clock for the whole
//! host (network namespaces included, as they do not virtualise time), so the spans of every
//! process on one node lie on one time line and a node's figure can be taken over the time any
//! of its flows was transferring.

use serde::{Deserialize, Serialize};

/// One timed iteration's start and end, nanoseconds of CLOCK_MONOTONIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonoSpan {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl MonoSpan {
    /// The span that started at `start_ns` and lasted `secs`.
    pub fn lasting(start_ns: u64, secs: f64) -> MonoSpan {
        MonoSpan {
            start_ns,
            end_ns: start_ns + (secs.max(0.0) * 1e9).round() as u64,
        }
    }
}

/// Now on CLOCK_MONOTONIC, in nanoseconds (0 if the clock cannot be read, which Linux never
/// refuses for this clock).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Nanoseconds covered by at least one of `spans` (overlaps counted once).
pub fn covered_ns(spans: &[MonoSpan]) -> u64 {
    let mut s: Vec<MonoSpan> = spans.to_vec();
    s.sort_by_key(|x| x.start_ns);
    let mut total = 0;
    let mut open: Option<(u64, u64)> = None;
    for x in s {
        open = match open {
            Some((a, b)) if x.start_ns <= b => Some((a, b.max(x.end_ns))),
            Some((a, b)) => {
                total += b - a;
                Some((x.start_ns, x.end_ns.max(x.start_ns)))
            }
            None => Some((x.start_ns, x.end_ns.max(x.start_ns))),
        };
    }
    total + open.map_or(0, |(a, b)| b - a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(a: u64, b: u64) -> MonoSpan {
        MonoSpan {
            start_ns: a,
            end_ns: b,
        }
    }

    #[test]
    fn overlaps_count_once_and_gaps_not_at_all() {
        assert_eq!(covered_ns(&[]), 0);
        assert_eq!(covered_ns(&[span(10, 20)]), 10);
        // Disjoint, out of order: both lengths.
        assert_eq!(covered_ns(&[span(30, 40), span(0, 10)]), 20);
        // Overlapping and nested: the union [0, 25).
        assert_eq!(covered_ns(&[span(0, 10), span(5, 25), span(6, 7)]), 25);
        // Touching spans join.
        assert_eq!(covered_ns(&[span(0, 10), span(10, 20)]), 20);
    }

    #[test]
    fn the_clock_moves_forward_and_a_span_lasts_its_seconds() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
        assert_eq!(MonoSpan::lasting(100, 0.5e-6), span(100, 600));
    }
}
