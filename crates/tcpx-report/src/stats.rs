//! Statistics over repetitions, pure functions with no IO: medians, a distribution-free
//! interval for the median, the interval of a ratio of two medians, and the three-valued
//! verdict of an interval against a threshold.
//!
//! * The interval for one median is the order-statistic (binomial) interval: with the
//!   repetitions sorted, `[x(k), x(n+1-k)]` covers the true median with probability
//!   `1 - 2 P(Binomial(n, 1/2) < k)`, whatever the distribution. The widest `k` with at least
//!   95 % is taken; below 6 repetitions no `k` reaches 95 %, so the interval is `[min, max]`
//!   and [`FigureStats::level`] says what it covers (75 % at 3, 94 % at 5).
//! * The interval of a ratio of medians is a percentile bootstrap with a fixed seed (the same
//!   data always give the same interval). With 3 repetitions a side it is
//!   `[min B / max A, max B / min A]`.
//! * [`judge`]: PASS when the whole interval satisfies the comparison, FAIL when none of it
//!   does, INCONCLUSIVE otherwise, with [`reps_to_settle`] estimating how many repetitions would
//!   likely decide it (the interval narrows as 1/sqrt(n)).

use serde::{Deserialize, Serialize};

/// Nominal coverage of every interval here.
pub const LEVEL: f64 = 0.95;

/// Bootstrap resamples for a ratio interval.
const RESAMPLES: usize = 2000;
/// Seed of the bootstrap generator: fixed, so a report is reproducible from its data.
const SEED: u64 = 0x7c9f_5eed_2026_0012;

pub use tcpx_model::median;

pub mod robust;
pub(crate) use tcpx_model::median_sorted;

/// P(Binomial(n, 1/2) <= k).
pub(crate) fn binom_half_cdf(n: usize, k: usize) -> f64 {
    // Terms C(n, i) / 2^n built up in log space so large n does not overflow.
    let ln2n = n as f64 * std::f64::consts::LN_2;
    let mut ln_c = 0.0f64; // ln C(n, 0)
    let mut sum = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        sum += (ln_c - ln2n).exp();
    }
    sum.min(1.0)
}

/// The order-statistic interval for the median of sorted `s`: `(lo, hi, coverage)`.
fn median_interval(s: &[f64], level: f64) -> (f64, f64, f64) {
    let n = s.len();
    let coverage = |k: usize| 1.0 - 2.0 * binom_half_cdf(n, k - 1);
    let mut k = 1;
    while k < n.div_ceil(2) && coverage(k + 1) >= level {
        k += 1;
    }
    (s[k - 1], s[n - k], coverage(k).max(0.0))
}

/// Every figure the report gives for one metric of one configuration: the repetitions as
/// measured and their summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureStats {
    /// Each repetition's value, in repetition order.
    pub reps: Vec<f64>,
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Interval for the median (see the module doc), nominally 95 %.
    pub ci95_lo: f64,
    pub ci95_hi: f64,
    /// What the interval really covers (below 0.95 with fewer than 6 repetitions).
    pub level: f64,
}

impl FigureStats {
    /// `None` for no values or a value that is not a number.
    pub fn of(reps: &[f64]) -> Option<FigureStats> {
        if reps.is_empty() || reps.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = reps.to_vec();
        s.sort_by(f64::total_cmp);
        let (lo, hi, level) = median_interval(&s, LEVEL);
        Some(FigureStats {
            reps: reps.to_vec(),
            n: reps.len(),
            median: median_sorted(&s),
            min: s[0],
            max: s[s.len() - 1],
            ci95_lo: lo,
            ci95_hi: hi,
            level,
        })
    }

    /// `1.234 [1.100, 1.300] n=3 75%`: the median, its interval and what the interval really
    /// covers (below 95 % with fewer than 6 repetitions).
    pub fn text(&self, digits: usize) -> String {
        format!(
            "{:.digits$} [{:.digits$}, {:.digits$}] n={} {:.0}%",
            self.median,
            self.ci95_lo,
            self.ci95_hi,
            self.n,
            self.level * 100.0
        )
    }
}

/// A small deterministic generator (SplitMix64) for the bootstrap (and the crate's simulations).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn resample_median(xs: &[f64], rng: &mut SplitMix, buf: &mut Vec<f64>) -> f64 {
    buf.clear();
    buf.extend((0..xs.len()).map(|_| xs[rng.below(xs.len())]));
    buf.sort_by(f64::total_cmp);
    median_sorted(buf)
}

fn percentile_sorted(s: &[f64], p: f64) -> f64 {
    // Nearest rank, outward: the lower bound rounds down, the upper up.
    let pos = p * (s.len() - 1) as f64;
    if p < 0.5 {
        s[pos.floor() as usize]
    } else {
        s[pos.ceil() as usize]
    }
}

/// The ratio `median(b) / median(a)` and its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub n_a: usize,
    pub n_b: usize,
}

/// The ratio of medians `b / a` with its seeded percentile-bootstrap 95 % interval; `None`
/// when a side is empty, holds a non-finite value, or a median of `a` could be 0.
pub fn ratio_of_medians(a: &[f64], b: &[f64]) -> Option<Ratio> {
    if a.is_empty() || b.is_empty() || a.iter().chain(b).any(|x| !x.is_finite()) {
        return None;
    }
    if a.iter().any(|x| *x <= 0.0) || b.iter().any(|x| *x < 0.0) {
        return None;
    }
    let ratio = median(b)? / median(a)?;
    let mut rng = SplitMix(SEED);
    let mut buf = Vec::with_capacity(a.len().max(b.len()));
    let mut rs: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let ma = resample_median(a, &mut rng, &mut buf);
            let mb = resample_median(b, &mut rng, &mut buf);
            mb / ma
        })
        .collect();
    rs.sort_by(f64::total_cmp);
    let alpha = (1.0 - LEVEL) / 2.0;
    Some(Ratio {
        ratio,
        lo: percentile_sorted(&rs, alpha).min(ratio),
        hi: percentile_sorted(&rs, 1.0 - alpha).max(ratio),
        n_a: a.len(),
        n_b: b.len(),
    })
}

/// How a comparison came out against a noise band `1 ± noise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Difference {
    /// The whole interval of `b / a` lies above `1 + noise`.
    Higher,
    /// The whole interval lies below `1 - noise`.
    Lower,
    /// Otherwise: no difference beyond noise can be claimed.
    Tied,
}

impl Ratio {
    pub fn difference(&self, noise: f64) -> Difference {
        if self.lo > 1.0 + noise {
            Difference::Higher
        } else if self.hi < 1.0 - noise {
            Difference::Lower
        } else {
            Difference::Tied
        }
    }
}

/// `b` is tied with `a` within `noise` (the interval of `b / a` reaches into `1 ± noise`).
pub fn tied(a: &[f64], b: &[f64], noise: f64) -> Option<bool> {
    ratio_of_medians(a, b).map(|r| r.difference(noise) == Difference::Tied)
}

/// A three-valued verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    Pass,
    Fail,
    Inconclusive,
}

fn holds(v: f64, op: &str, t: f64) -> Option<bool> {
    Some(match op {
        ">" => v > t,
        ">=" => v >= t,
        "<" => v < t,
        "<=" => v <= t,
        "==" => (v - t).abs() <= 1e-9 * t.abs().max(1.0),
        _ => return None,
    })
}

/// The interval `[lo, hi]` against `op threshold`: PASS when every value in it satisfies the
/// comparison, FAIL when none does, INCONCLUSIVE otherwise; `None` for an unknown `op`.
pub fn judge(lo: f64, hi: f64, op: &str, threshold: f64) -> Option<Judgement> {
    let (a, b) = (holds(lo, op, threshold)?, holds(hi, op, threshold)?);
    let inside = lo <= threshold && threshold <= hi;
    Some(match (a, b) {
        (true, true) => Judgement::Pass,
        (false, false) if op != "==" || !inside => Judgement::Fail,
        _ => Judgement::Inconclusive,
    })
}

/// About how many repetitions would narrow an interval `[lo, hi]` around `estimate`, measured
/// with `n`, enough to clear `threshold` (half-width shrinking as 1/sqrt(n)); `None` when the
/// estimate sits on the threshold (no number of repetitions settles that).
pub fn reps_to_settle(estimate: f64, lo: f64, hi: f64, n: usize, threshold: f64) -> Option<usize> {
    let d = (estimate - threshold).abs();
    let half = ((hi - lo) / 2.0).max(0.0);
    if d <= 1e-12 * threshold.abs().max(1.0) || n == 0 {
        return None;
    }
    let need = (n as f64 * (half / d).powi(2)).ceil();
    Some((need as usize).max(n + 1).max(6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn medians_and_small_sample_intervals() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::NAN]), None);
        let s = FigureStats::of(&[1.2, 1.0, 1.1]).unwrap();
        assert_eq!((s.median, s.ci95_lo, s.ci95_hi, s.n), (1.1, 1.0, 1.2, 3));
        assert!((s.level - 0.75).abs() < 1e-12, "{}", s.level);
        assert_eq!(s.text(2), "1.10 [1.00, 1.20] n=3 75%");
        let one = FigureStats::of(&[2.0]).unwrap();
        assert_eq!((one.ci95_lo, one.ci95_hi, one.level), (2.0, 2.0, 0.0));
        assert!(FigureStats::of(&[]).is_none());
    }

    #[test]
    fn order_statistic_interval_reaches_95_percent_from_six_values() {
        let five = FigureStats::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert!((five.level - 0.9375).abs() < 1e-12);
        let six = FigureStats::of(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert!(six.level >= 0.95 && (six.ci95_lo, six.ci95_hi) == (1.0, 6.0));
        let xs: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = FigureStats::of(&xs).unwrap();
        // n = 20: k = 6, [x(6), x(15)] covers 95.86 %.
        assert_eq!((s.ci95_lo, s.ci95_hi), (6.0, 15.0));
        assert!((s.level - 0.9586).abs() < 1e-3, "{}", s.level);
    }

    #[test]
    fn three_valued_judgement_and_reps_to_settle() {
        assert_eq!(judge(1.1, 1.3, ">", 1.0), Some(Judgement::Pass));
        assert_eq!(judge(0.8, 0.9, ">", 1.0), Some(Judgement::Fail));
        assert_eq!(judge(0.9, 1.1, ">", 1.0), Some(Judgement::Inconclusive));
        assert_eq!(judge(0.9, 1.1, "<=", 1.0), Some(Judgement::Inconclusive));
        assert_eq!(judge(0.5, 0.9, "<=", 1.0), Some(Judgement::Pass));
        assert_eq!(judge(1.0, 1.0, "~", 1.0), None);
        // Half-width 0.1 at n = 3, 0.05 from the threshold: 4x the repetitions.
        assert_eq!(reps_to_settle(1.05, 0.95, 1.15, 3, 1.0), Some(12));
        assert_eq!(reps_to_settle(1.0, 0.9, 1.1, 3, 1.0), None);
    }

    #[test]
    fn clearly_different_samples_are_not_tied() {
        let a = [1.0, 1.02, 0.98, 1.01, 0.99];
        let b = [2.0, 2.1, 1.9, 2.05, 1.95];
        let r = ratio_of_medians(&a, &b).unwrap();
        assert!((r.ratio - 2.0).abs() < 1e-12);
        assert!(r.lo > 1.8 && r.hi < 2.2, "{r:?}");
        assert_eq!(r.difference(0.05), Difference::Higher);
        assert_eq!(
            ratio_of_medians(&b, &a).unwrap().difference(0.05),
            Difference::Lower
        );
        // Three a side: the interval is [min b / max a, max b / min a].
        let r3 = ratio_of_medians(&[1.0, 1.1, 1.2], &[2.0, 2.2, 2.4]).unwrap();
        assert!(
            (r3.lo - 2.0 / 1.2).abs() < 1e-12 && (r3.hi - 2.4).abs() < 1e-12,
            "{r3:?}"
        );
        assert!(ratio_of_medians(&[0.0], &[1.0]).is_none());
        assert_eq!(ratio_of_medians(&a, &b), ratio_of_medians(&a, &b), "seeded");
    }

    /// A noisy sample with a known median: 1 + lognormal-ish noise, median exactly `m`.
    fn sample(rng: &mut SplitMix, n: usize, m: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                // Sum of uniforms, centred: symmetric about 0, so the median of m * e^x is m.
                let u: f64 = (0..4)
                    .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64)
                    .sum();
                m * ((u - 2.0) * 0.3).exp()
            })
            .collect()
    }

    #[test]
    fn median_interval_covers_the_true_median_at_its_nominal_rate() {
        let mut rng = SplitMix(42);
        for n in [3usize, 5, 9, 15, 30] {
            let trials = 4000;
            let mut covered = 0;
            let mut level = 0.0;
            for _ in 0..trials {
                let s = FigureStats::of(&sample(&mut rng, n, 2.5)).unwrap();
                level = s.level;
                if s.ci95_lo <= 2.5 && 2.5 <= s.ci95_hi {
                    covered += 1;
                }
            }
            let rate = covered as f64 / trials as f64;
            // Exact for a continuous distribution: within sampling error of the stated level.
            assert!(
                (rate - level).abs() < 0.025,
                "n={n}: covered {rate}, stated {level}"
            );
            if n >= 6 {
                assert!(rate > 0.93, "n={n}: {rate}");
            }
        }
    }

    #[test]
    fn ratio_interval_covers_one_for_equal_medians_near_its_nominal_rate() {
        let mut rng = SplitMix(7);
        let trials = 600;
        let mut covered = 0;
        for _ in 0..trials {
            let a = sample(&mut rng, 9, 1.0);
            let b = sample(&mut rng, 9, 1.0);
            let r = ratio_of_medians(&a, &b).unwrap();
            if r.lo <= 1.0 && 1.0 <= r.hi {
                covered += 1;
            }
        }
        let rate = covered as f64 / trials as f64;
        assert!(
            rate > 0.9,
            "an A/A ratio interval covered 1 in only {rate} of trials"
        );
    }

    proptest! {
        #[test]
        fn a_ratio_of_identical_samples_is_tied(
            xs in proptest::collection::vec(0.01f64..100.0, 1..12),
            noise in 0.0f64..0.5,
        ) {
            let r = ratio_of_medians(&xs, &xs).unwrap();
            prop_assert!((r.ratio - 1.0).abs() < 1e-12);
            prop_assert!(r.lo <= 1.0 && r.hi >= 1.0, "{:?}", r);
            prop_assert_eq!(tied(&xs, &xs, noise), Some(true));
        }

        #[test]
        fn the_median_interval_holds_the_median_and_lies_within_the_range(
            xs in proptest::collection::vec(-1e6f64..1e6, 1..40),
        ) {
            let s = FigureStats::of(&xs).unwrap();
            prop_assert!(s.min <= s.ci95_lo && s.ci95_lo <= s.median);
            prop_assert!(s.median <= s.ci95_hi && s.ci95_hi <= s.max);
            prop_assert!((0.0..=1.0).contains(&s.level));
        }

        #[test]
        fn scaling_one_side_scales_the_ratio(
            xs in proptest::collection::vec(0.1f64..10.0, 2..9),
            k in 1.5f64..4.0,
        ) {
            let ys: Vec<f64> = xs.iter().map(|x| x * k).collect();
            let r = ratio_of_medians(&xs, &ys).unwrap();
            prop_assert!((r.ratio - k).abs() < 1e-9 * k);
            prop_assert!(r.lo <= k + 1e-9 && r.hi >= k - 1e-9);
        }
    }
}
