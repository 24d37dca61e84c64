//! The straggler rule shared by fleet qualification (`tcpx-fleet`'s outliers) and `tcpx-run
//! watch`: a member is below its peers when its figure is at least [`Thresholds::below_pct`]
//! under the median of the others' figures *and* that gap is at least [`Thresholds::robust_z`]
//! scaled median absolute deviations (MAD x 1.4826, floored at [`Thresholds::scale_floor_pct`]
//! of the peers' median so that equal figures flag nothing), and it is named only when it is
//! below in every repetition (a gap one repetition reverses is noise).
//!
//! Median and MAD because one slow member must not move the yardstick it is measured with.

use tcpx_model::median;

/// When a figure counts as below its peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// At least this many percent under the peers' median.
    pub below_pct: f64,
    /// And at least this many scaled MADs under it.
    pub robust_z: f64,
    /// The scale (MAD x 1.4826) is at least this percentage of the median.
    pub scale_floor_pct: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            below_pct: 10.0,
            robust_z: 3.5,
            scale_floor_pct: 2.0,
        }
    }
}

/// Median absolute deviation from `center` (0 for no values).
pub fn mad(v: &[f64], center: f64) -> f64 {
    let d: Vec<f64> = v.iter().map(|x| (x - center).abs()).collect();
    median(&d).unwrap_or(0.0)
}

/// Where one figure stands against its peers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    /// The median of the other members' figures.
    pub peers: f64,
    /// How far the figure is from `peers`, in percent (negative: below).
    pub below_pct: f64,
    /// The same gap in robust scale units (negative: below).
    pub z: f64,
}

/// How far `x` is from the median of `others`, with the robust scale of `all` (every member's
/// figure, `x` included). None when the peers' median is missing or not positive.
pub fn standing(x: f64, others: &[f64], all: &[f64], t: &Thresholds) -> Option<Standing> {
    let peers = median(others)?;
    if peers <= 0.0 {
        return None;
    }
    let center = median(all)?;
    let scale = (1.4826 * mad(all, center)).max(t.scale_floor_pct / 100.0 * peers);
    Some(Standing {
        peers,
        below_pct: (x / peers - 1.0) * 100.0,
        z: (x - peers) / scale,
    })
}

/// The same rule on the logarithms of the figures, for rates whose noise is a ratio rather than
/// an amount (a process's GB/s halved by a neighbour's burst on a shared CPU): the scale is the
/// spread of the figures' ratios, the floor `scale_floor_pct` read as a ratio (ln(1 + pct/100)).
/// `peers` and `below_pct` stay in the figures' own units; `z` is in log units. Figures at or
/// below 0 count as a millionth of the peers' median (a log needs a positive number).
pub fn standing_ratio(x: f64, others: &[f64], all: &[f64], t: &Thresholds) -> Option<Standing> {
    let peers = median(others)?;
    if peers.is_nan() || peers <= 0.0 || !x.is_finite() {
        return None;
    }
    let ln = |v: f64| v.max(peers * 1e-6).ln();
    let logs: Vec<f64> = all.iter().map(|v| ln(*v)).collect();
    let center = median(&logs)?;
    let scale = (1.4826 * mad(&logs, center)).max((1.0 + t.scale_floor_pct / 100.0).ln());
    Some(Standing {
        peers,
        below_pct: (x / peers - 1.0) * 100.0,
        z: (ln(x) - peers.ln()) / scale,
    })
}

/// The lowest and highest of the per-repetition gaps, if any.
pub fn gap_range(gaps: &[f64]) -> Option<(f64, f64)> {
    gaps.iter().copied().fold(None, |acc, g| match acc {
        None => Some((g, g)),
        Some((lo, hi)) => Some((f64::min(lo, g), f64::max(hi, g))),
    })
}

/// Whether `s` is below its peers by both thresholds and below in every repetition (`range`:
/// the per-repetition gaps' lowest and highest, None when there were no repetitions to check).
pub fn flagged(s: &Standing, range: Option<(f64, f64)>, t: &Thresholds) -> bool {
    s.below_pct <= -t.below_pct && s.z <= -t.robust_z && range.is_none_or(|(_, hi)| hi < 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_figures_flag_nothing_and_a_slow_one_is_flagged() {
        let t = Thresholds::default();
        let all = [10.0, 10.0, 10.0, 10.0];
        let s = standing(10.0, &all[1..], &all, &t).unwrap();
        assert_eq!(s.below_pct, 0.0);
        assert!(!flagged(&s, Some((0.0, 0.0)), &t));
        let all = [5.0, 10.0, 10.1, 9.9];
        let s = standing(5.0, &all[1..], &all, &t).unwrap();
        assert!((s.below_pct + 50.0).abs() < 1e-9, "{s:?}");
        assert!(flagged(&s, Some((-55.0, -45.0)), &t));
        // One repetition where it was not below: not named.
        assert!(!flagged(&s, Some((-55.0, 1.0)), &t));
        assert_eq!(gap_range(&[-3.0, -9.0, -1.0]), Some((-9.0, -1.0)));
        assert_eq!(gap_range(&[]), None);
        assert!(standing(1.0, &[], &[1.0], &t).is_none());
        assert!(standing(1.0, &[0.0], &[1.0, 0.0], &t).is_none());
    }

    #[test]
    fn the_ratio_form_judges_a_twentyfold_gap_among_peers_that_differ_twofold() {
        let t = Thresholds::default();
        // Peers 0.5 .. 1.0 (noise as ratios), one at 0.03: linear z cannot reach 3.5 ...
        let all = [0.03, 0.5, 0.75, 1.0];
        let lin = standing(0.03, &all[1..], &all, &t).unwrap();
        assert!(lin.z > -t.robust_z, "{lin:?}");
        // ... the ratio form does, and flags none of the peers.
        let s = standing_ratio(0.03, &all[1..], &all, &t).unwrap();
        assert!(flagged(&s, Some((-97.0, -80.0)), &t), "{s:?}");
        assert_eq!(s.peers, 0.75);
        for (i, &x) in all.iter().enumerate().skip(1) {
            let others: Vec<f64> = all
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, v)| *v)
                .collect();
            let p = standing_ratio(x, &others, &all, &t).unwrap();
            assert!(!flagged(&p, None, &t), "{x}: {p:?}");
        }
        // Equal figures: nothing; a zero is far below, and finite.
        let eq = [1.0, 1.0, 1.0];
        assert!(!flagged(
            &standing_ratio(1.0, &eq[1..], &eq, &t).unwrap(),
            None,
            &t
        ));
        let z = standing_ratio(0.0, &[1.0, 1.0], &[0.0, 1.0, 1.0], &t).unwrap();
        assert!(z.z.is_finite() && z.below_pct == -100.0, "{z:?}");
    }
}
