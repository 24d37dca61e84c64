//! Who is slow: robust statistics over the fleet matrix.
//!
//! For each NIC choice (`nic0`, `nic1`, ..., `all`) a pair's figure is the median GB/s over its
//! repetitions, and a node's score is the median over every pair it is in, sending or receiving.
//! A node is below its peers when its score is at least [`Thresholds::below_pct`] under the
//! median of the other nodes' scores *and* that gap is at least [`Thresholds::robust_z`] scaled
//! median absolute deviations (MAD x 1.4826, floored at [`Thresholds::scale_floor_pct`] of the
//! median so that a fleet of equal figures flags nothing). Each finding carries the same gap
//! taken repetition by repetition, lowest and highest, as its interval, and nothing is named
//! unless it is below in every repetition (a gap one repetition reverses is the machine's noise,
//! not the node's).
//!
//! Median and MAD because one slow member must not move the yardstick it is measured with: a
//! slow NIC on one node of four drags 2 of each other node's 6 pair figures down, which leaves
//! their medians where they were.
//!
//! Naming: a node below on every NIC alone is a slow *node*; below on some NICs, a slow *NIC*
//! of that node; fine on each NIC alone but below with all together, slow *with all NICs* (the
//! host's PCIe, memory or CPU rather than a link). A pair below the other pairs whose nodes are
//! both unflagged is a slow *pair* (a path through the fabric). A NIC below the same pairs'
//! other NICs on most pairs, with no node's NIC to blame, is a slow *rail* (the only finding a
//! two-node fleet can make: its two nodes share every pair). Lost nodes and failed runs are
//! findings of their own.

use std::collections::{BTreeMap, BTreeSet};

use tcpx_report::fleet::{Finding, FindingKind, FleetNode, FleetRow};
use tcpx_report::stats::median;

pub use tcpx_report::stats::robust::Thresholds;
use tcpx_report::stats::robust::{self, gap_range};

/// Each ordered pair's figure (sender, receiver) on one NIC choice.
type PairFigures = BTreeMap<(u32, u32), f64>;

/// A node's standing on one NIC choice.
#[derive(Debug, Clone, PartialEq)]
struct Standing {
    score: f64,
    peers: f64,
    below_pct: f64,
    z: f64,
    range: Option<(f64, f64)>,
    flagged: bool,
}

/// The figures of one NIC choice: measured rows only.
struct NicFigures<'a> {
    rows: Vec<&'a FleetRow>,
}

impl NicFigures<'_> {
    fn pair_medians(&self) -> PairFigures {
        let mut by: BTreeMap<(u32, u32), Vec<f64>> = BTreeMap::new();
        for r in &self.rows {
            if let Some(v) = r.measured() {
                by.entry((r.sender, r.receiver)).or_default().push(v);
            }
        }
        by.into_iter()
            .filter_map(|(k, v)| median(&v).map(|m| (k, m)))
            .collect()
    }

    /// Node scores from `pairs` (pair figure per ordered pair).
    fn scores(pairs: &PairFigures) -> BTreeMap<u32, f64> {
        let mut by: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        for (&(s, r), &v) in pairs {
            by.entry(s).or_default().push(v);
            by.entry(r).or_default().push(v);
        }
        by.into_iter()
            .filter_map(|(k, v)| median(&v).map(|m| (k, m)))
            .collect()
    }

    fn reps(&self) -> BTreeSet<u32> {
        self.rows.iter().map(|r| r.rep).collect()
    }

    fn rep_pairs(&self, rep: u32) -> PairFigures {
        self.rows
            .iter()
            .filter(|r| r.rep == rep)
            .filter_map(|r| r.measured().map(|v| ((r.sender, r.receiver), v)))
            .collect()
    }
}

/// Every figure of `figures` but `key`'s: what `key`'s figure is compared with.
fn all_but<K: PartialEq>(figures: &BTreeMap<K, f64>, key: &K) -> Vec<f64> {
    figures
        .iter()
        .filter(|(k, _)| *k != key)
        .map(|(_, &v)| v)
        .collect()
}

/// How far `x` is under the median of `others`, with the robust scale of `all`:
/// `(peers, below_pct, z)`.
fn standing(x: f64, others: &[f64], all: &[f64], t: &Thresholds) -> Option<(f64, f64, f64)> {
    robust::standing(x, others, all, t).map(|s| (s.peers, s.below_pct, s.z))
}

fn node_standings(f: &NicFigures, t: &Thresholds) -> BTreeMap<u32, Standing> {
    let scores = NicFigures::scores(&f.pair_medians());
    let all: Vec<f64> = scores.values().copied().collect();
    let per_rep: Vec<BTreeMap<u32, f64>> = f
        .reps()
        .into_iter()
        .map(|rep| NicFigures::scores(&f.rep_pairs(rep)))
        .collect();
    let mut out = BTreeMap::new();
    for (&node, &score) in &scores {
        let others = all_but(&scores, &node);
        let Some((peers, below, z)) = standing(score, &others, &all, t) else {
            continue;
        };
        let rep_gaps: Vec<f64> = per_rep
            .iter()
            .filter_map(|s| {
                let x = *s.get(&node)?;
                let o = all_but(s, &node);
                let p = median(&o)?;
                (p > 0.0).then(|| (x / p - 1.0) * 100.0)
            })
            .collect();
        let range = gap_range(&rep_gaps);
        out.insert(
            node,
            Standing {
                score,
                peers,
                below_pct: below,
                z,
                range,
                // And below in every repetition: a gap that one repetition reverses is noise.
                flagged: robust::flagged(
                    &robust::Standing {
                        peers,
                        below_pct: below,
                        z,
                    },
                    range,
                    t,
                ),
            },
        );
    }
    out
}

/// Every finding of a fleet matrix, most serious first: lost nodes, failed runs, slow nodes,
/// NICs, all-NIC bottlenecks, pairs.
pub fn findings(rows: &[FleetRow], nodes: &[FleetNode], t: &Thresholds) -> Vec<Finding> {
    let host = |r: u32| {
        nodes
            .iter()
            .find(|n| n.rank == r)
            .map(|n| n.host.clone())
            .unwrap_or_default()
    };
    let blank = |kind: FindingKind, node: Option<u32>| Finding {
        kind,
        node,
        host: node.map(host).unwrap_or_default(),
        nic: String::new(),
        peer: None,
        gbps: None,
        peers_gbps: None,
        below_pct: None,
        below_pct_range: None,
        robust_z: None,
        text: String::new(),
    };
    let mut out = Vec::new();
    let lost: BTreeSet<u32> = nodes
        .iter()
        .filter(|n| !n.lost.is_empty())
        .map(|n| n.rank)
        .collect();
    for n in nodes.iter().filter(|n| !n.lost.is_empty()) {
        let mut f = blank(FindingKind::Lost, Some(n.rank));
        f.text = format!("node {} ({}) is out of the run: {}", n.rank, n.host, n.lost);
        out.push(f);
    }
    // Failed runs between nodes that are both still in. Where every failure of a NIC choice
    // has one node at an end, with two or more partners, that node's NIC is named (a NIC down
    // or unreachable); else one finding per pair and NIC.
    let bad: Vec<&FleetRow> = rows
        .iter()
        .filter(|r| {
            (r.status == "failed" || r.status == "wrong_bytes")
                && !lost.contains(&r.sender)
                && !lost.contains(&r.receiver)
        })
        .collect();
    let mut failed_labels: Vec<&str> = bad.iter().map(|r| r.nic.as_str()).collect();
    failed_labels.sort_unstable();
    failed_labels.dedup();
    for label in failed_labels {
        let here: Vec<&&FleetRow> = bad.iter().filter(|r| r.nic == label).collect();
        let mut ends: BTreeSet<u32> = here.iter().flat_map(|r| [r.sender, r.receiver]).collect();
        ends.retain(|&n| {
            let partners: BTreeSet<u32> = here
                .iter()
                .filter_map(|r| match (r.sender == n, r.receiver == n) {
                    (true, _) => Some(r.receiver),
                    (_, true) => Some(r.sender),
                    _ => None,
                })
                .collect();
            here.iter().all(|r| r.sender == n || r.receiver == n) && partners.len() >= 2
        });
        if let Some(&n) = ends.iter().next() {
            let total = rows
                .iter()
                .filter(|r| r.nic == label && (r.sender == n || r.receiver == n))
                .count();
            let mut f = blank(FindingKind::Failed, Some(n));
            f.nic = label.to_string();
            f.text = format!(
                "node {n} ({}) {label}: {} of its {total} runs failed, and no run on {label} without it did (a NIC down or unreachable?): {}",
                f.host,
                here.len(),
                here[0].error
            );
            out.push(f);
            continue;
        }
        let mut per_pair: BTreeMap<(u32, u32), (u32, String)> = BTreeMap::new();
        for r in &here {
            per_pair
                .entry((r.sender, r.receiver))
                .or_insert((0, r.error.clone()))
                .0 += 1;
        }
        for ((s, r), (count, error)) in per_pair {
            let mut f = blank(FindingKind::Failed, Some(s));
            f.peer = Some(r);
            f.nic = label.to_string();
            f.text = format!("{count} run(s) {s} -> {r} on {label} failed: {error}");
            out.push(f);
        }
    }

    let mut labels: Vec<String> = Vec::new();
    for r in rows {
        if !labels.contains(&r.nic) {
            labels.push(r.nic.clone());
        }
    }
    let figures = |label: &str| NicFigures {
        rows: rows.iter().filter(|r| r.nic == label).collect(),
    };
    let per_nic: Vec<(String, BTreeMap<u32, Standing>)> = labels
        .iter()
        .map(|l| (l.clone(), node_standings(&figures(l), t)))
        .collect();
    let singles: Vec<&(String, BTreeMap<u32, Standing>)> =
        per_nic.iter().filter(|(l, _)| l != "all").collect();
    let ranks: BTreeSet<u32> = per_nic
        .iter()
        .flat_map(|(_, s)| s.keys().copied())
        .collect();
    // A node's NIC choice named above as failing: its few runs from before (a NIC taken down
    // mid-run) are no yardstick, so it is not judged slow there, and not a pair's end either.
    let failed_nics: BTreeSet<(u32, String)> = out
        .iter()
        .filter(|f| f.kind == FindingKind::Failed && f.peer.is_none())
        .filter_map(|f| Some((f.node?, f.nic.clone())))
        .collect();
    // Flagged (node, label) pairs, for the pair findings' exclusions.
    let mut flagged: BTreeSet<(u32, String)> = failed_nics.clone();
    let pct_text = |s: &Standing| {
        let range = s
            .range
            .map(|(lo, hi)| format!(", {lo:.0}% .. {hi:.0}% over the repetitions"))
            .unwrap_or_default();
        format!(
            "{:.2} GB/s against its peers' {:.2} ({:.0}%{range}; robust z {:.1})",
            s.score, s.peers, s.below_pct, s.z
        )
    };
    for &node in &ranks {
        let slow: Vec<(&String, &Standing)> = singles
            .iter()
            .filter(|(l, _)| !failed_nics.contains(&(node, l.clone())))
            .filter_map(|(l, s)| s.get(&node).filter(|s| s.flagged).map(|s| (l, s)))
            .collect();
        if singles.len() >= 2 && slow.len() == singles.len() {
            let scores: Vec<f64> = slow.iter().map(|(_, s)| s.score).collect();
            let peers: Vec<f64> = slow.iter().map(|(_, s)| s.peers).collect();
            let below: Vec<f64> = slow.iter().map(|(_, s)| s.below_pct).collect();
            let zs: Vec<f64> = slow.iter().map(|(_, s)| s.z).collect();
            let lo = slow
                .iter()
                .filter_map(|(_, s)| s.range.map(|r| r.0))
                .fold(f64::INFINITY, f64::min);
            let hi = slow
                .iter()
                .filter_map(|(_, s)| s.range.map(|r| r.1))
                .fold(f64::NEG_INFINITY, f64::max);
            let mut f = blank(FindingKind::Node, Some(node));
            f.gbps = median(&scores);
            f.peers_gbps = median(&peers);
            f.below_pct = median(&below);
            f.robust_z = median(&zs);
            f.below_pct_range = lo.is_finite().then_some((lo, hi));
            f.text = format!(
                "node {node} ({}) is below its peers on every NIC: {}",
                f.host,
                slow.iter()
                    .map(|(l, s)| format!("{l} {}", pct_text(s)))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            out.push(f);
        } else {
            for (l, s) in &slow {
                let mut f = blank(FindingKind::Nic, Some(node));
                f.nic = l.to_string();
                f.gbps = Some(s.score);
                f.peers_gbps = Some(s.peers);
                f.below_pct = Some(s.below_pct);
                f.below_pct_range = s.range;
                f.robust_z = Some(s.z);
                let only = if singles.len() == 1 {
                    " (its only NIC: the node and the NIC cannot be told apart)"
                } else {
                    ""
                };
                f.text = format!("node {node} ({}) {l}{only}: {}", f.host, pct_text(s));
                out.push(f);
            }
        }
        for (l, _) in &slow {
            flagged.insert((node, l.to_string()));
        }
        if let Some(s) = per_nic
            .iter()
            .find(|(l, _)| l == "all")
            .filter(|_| !failed_nics.contains(&(node, "all".to_string())))
            .and_then(|(_, s)| s.get(&node))
            .filter(|s| s.flagged)
        {
            if slow.is_empty() {
                let mut f = blank(FindingKind::AllNics, Some(node));
                f.nic = "all".into();
                f.gbps = Some(s.score);
                f.peers_gbps = Some(s.peers);
                f.below_pct = Some(s.below_pct);
                f.below_pct_range = s.range;
                f.robust_z = Some(s.z);
                f.text = format!(
                    "node {node} ({}) is fine on each NIC alone but below its peers with all together (the host's PCIe, memory or CPUs rather than a link): {}",
                    f.host,
                    pct_text(s)
                );
                out.push(f);
            }
            flagged.insert((node, "all".into()));
        }
    }
    // Rails: NIC i against the same pairs' other NICs, where no node's NIC i was named (two
    // nodes cannot tell their ends apart; the same NIC slow everywhere is not one node's).
    let single_labels: Vec<&String> = labels.iter().filter(|l| *l != "all").collect();
    if single_labels.len() >= 2 {
        let medians: Vec<(&String, PairFigures)> = single_labels
            .iter()
            .map(|l| (*l, figures(l).pair_medians()))
            .collect();
        for (label, pairs) in &medians {
            if flagged.iter().any(|(_, l)| l == *label) {
                continue;
            }
            // Per pair: this NIC over the median of the pair's other NICs.
            let ratios: Vec<f64> = pairs
                .iter()
                .filter_map(|(k, &v)| {
                    let others: Vec<f64> = medians
                        .iter()
                        .filter(|(l, _)| l != label)
                        .filter_map(|(_, p)| p.get(k).copied())
                        .collect();
                    let o = median(&others)?;
                    (o > 0.0).then_some(v / o)
                })
                .collect();
            let Some(mid) = median(&ratios) else {
                continue;
            };
            let below = (mid - 1.0) * 100.0;
            // Below in every repetition: the median over pairs of this NIC's figure over the
            // pair's other NICs, repetition by repetition.
            let per_rep_below = |rep: u32| -> Option<f64> {
                let figs: Vec<PairFigures> = single_labels
                    .iter()
                    .map(|l| figures(l).rep_pairs(rep))
                    .collect();
                let mine_at = single_labels.iter().position(|l| *l == *label)?;
                let r: Vec<f64> = figs[mine_at]
                    .iter()
                    .filter_map(|(k, &v)| {
                        let o: Vec<f64> = figs
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| *i != mine_at)
                            .filter_map(|(_, p)| p.get(k).copied())
                            .collect();
                        let o = median(&o)?;
                        (o > 0.0).then_some(v / o)
                    })
                    .collect();
                median(&r).map(|m| (m - 1.0) * 100.0)
            };
            let reps: BTreeSet<u32> = rows.iter().map(|r| r.rep).collect();
            let every_rep = reps
                .iter()
                .filter_map(|&r| per_rep_below(r))
                .all(|b| b < 0.0);
            // Most pairs, not a few: three quarters of them below by the threshold.
            let under = ratios
                .iter()
                .filter(|r| (*r - 1.0) * 100.0 <= -t.below_pct)
                .count();
            if below <= -t.below_pct && under * 4 >= ratios.len() * 3 && every_rep {
                let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let g: Vec<f64> = pairs.values().copied().collect();
                let mut f = blank(FindingKind::Rail, None);
                f.nic = label.to_string();
                f.gbps = median(&g);
                f.peers_gbps = f.gbps.map(|g| g / mid);
                f.below_pct = Some(below);
                f.below_pct_range = Some(((lo - 1.0) * 100.0, (hi - 1.0) * 100.0));
                f.text = format!(
                    "{label} is {:.0}% below the other NICs on {under} of {} pairs (pair by pair {:.0}% .. {:.0}%), and no single node's {label} explains it: {}",
                    -below,
                    ratios.len(),
                    (lo - 1.0) * 100.0,
                    (hi - 1.0) * 100.0,
                    if ranks.len() <= 2 {
                        "with two nodes, either end may be the slow one (add a third node to tell)"
                    } else {
                        "the same NIC on every node: its switch, cabling or configuration"
                    }
                );
                out.push(f);
                for &n in &ranks {
                    flagged.insert((n, label.to_string()));
                }
            }
        }
    }
    // Pairs: below the other pairs of the NIC choice, neither node flagged there.
    for label in &labels {
        let fig = figures(label);
        let pairs = fig.pair_medians();
        let any_flag = |n: u32| {
            flagged.contains(&(n, label.clone()))
                || (label == "all" && flagged.iter().any(|(m, _)| *m == n))
        };
        let all: Vec<f64> = pairs.values().copied().collect();
        for (&(s, r), &v) in &pairs {
            if any_flag(s) || any_flag(r) {
                continue;
            }
            let others = all_but(&pairs, &(s, r));
            let Some((peers, below, z)) = standing(v, &others, &all, t) else {
                continue;
            };
            let rep_gaps: Vec<f64> = fig
                .rows
                .iter()
                .filter(|x| x.sender == s && x.receiver == r)
                .filter_map(|x| x.measured())
                .map(|x| (x / peers - 1.0) * 100.0)
                .collect();
            let every_rep = rep_gaps.iter().all(|g| *g < 0.0);
            if below <= -t.below_pct && z <= -t.robust_z && every_rep {
                let lo = rep_gaps.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = rep_gaps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut f = blank(FindingKind::Pair, Some(s));
                f.peer = Some(r);
                f.nic = label.clone();
                f.gbps = Some(v);
                f.peers_gbps = Some(peers);
                f.below_pct = Some(below);
                f.below_pct_range = lo.is_finite().then_some((lo, hi));
                f.robust_z = Some(z);
                f.text = format!(
                    "{s} ({}) -> {r} ({}) on {label}: {v:.2} GB/s against the other pairs' {peers:.2} ({below:.0}%; robust z {z:.1}); both nodes are fine with others: the path between them",
                    host(s),
                    host(r)
                );
                out.push(f);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{schedule, NicChoice};

    fn nodes(n: u32) -> Vec<FleetNode> {
        (0..n)
            .map(|r| FleetNode {
                rank: r,
                host: format!("n{r}"),
                nics: vec![],
                addrs: vec![],
                lost: String::new(),
            })
            .collect()
    }

    /// A full matrix for `n` nodes with 2 NICs (+ all) and 3 repetitions, each run's GB/s from
    /// `speed`, with a deterministic +-`noise_pct` wobble.
    fn matrix(n: u32, noise_pct: f64, speed: impl Fn(u32, u32, &str) -> f64) -> Vec<FleetRow> {
        let slots = schedule(n, &NicChoice::all_for(2), 3);
        let mut rows = Vec::new();
        for (k, run) in slots.iter().flat_map(|s| s.runs.iter()).enumerate() {
            let wobble = [0.0, 1.0, -1.0, 0.5, -0.5][k % 5] * noise_pct / 100.0;
            let nic = run.nic.label();
            let v = speed(run.sender, run.receiver, &nic) * (1.0 + wobble);
            rows.push(FleetRow {
                run: run.id,
                rep: run.rep,
                round: 0,
                nic,
                sender: run.sender,
                sender_host: format!("n{}", run.sender),
                sender_addr: String::new(),
                receiver: run.receiver,
                receiver_host: format!("n{}", run.receiver),
                receiver_addr: String::new(),
                size: 1,
                bytes: 1,
                wrong_bytes: Some(0),
                gbps: Some(v),
                p50_us: None,
                connect_ms: None,
                accept_ms: None,
                first_byte_ms: None,
                setup_ms: None,
                status: "ok".into(),
                error: String::new(),
            });
        }
        rows
    }

    /// A NIC at half rate on `node`: any run through it goes at most half as fast; with all
    /// NICs together it carries half its share.
    fn half_nic(node: u32, nic: &'static str) -> impl Fn(u32, u32, &str) -> f64 {
        move |s, r, l| {
            let through = s == node || r == node;
            match l {
                "all" if !through => 20.0,
                _ if !through => 10.0,
                "all" => 20.0 * 0.75,
                x if x == nic => 5.0,
                _ => 10.0,
            }
        }
    }

    /// `r` ended with `status` and `error` instead of a figure.
    fn unmeasured(r: &mut FleetRow, status: &str, error: &str) {
        r.status = status.into();
        r.gbps = None;
        r.error = error.into();
    }

    fn names(f: &[Finding]) -> Vec<(FindingKind, Option<u32>, String, Option<u32>)> {
        f.iter()
            .map(|f| (f.kind, f.node, f.nic.clone(), f.peer))
            .collect()
    }

    #[test]
    fn an_equal_fleet_and_a_noisy_healthy_one_name_nothing() {
        for n in [2, 3, 4, 8] {
            let rows = matrix(n, 0.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
            assert!(findings(&rows, &nodes(n), &Thresholds::default()).is_empty());
            let rows = matrix(n, 4.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
            let f = findings(&rows, &nodes(n), &Thresholds::default());
            assert!(f.is_empty(), "n={n}: {f:?}");
        }
    }

    #[test]
    fn a_planted_slow_nic_is_named_and_nothing_else() {
        for n in [3, 4, 5, 8] {
            let rows = matrix(n, 3.0, half_nic(2, "nic1"));
            let f = findings(&rows, &nodes(n), &Thresholds::default());
            assert_eq!(
                names(&f),
                vec![(FindingKind::Nic, Some(2), "nic1".to_string(), None)],
                "n={n}: {f:#?}"
            );
            let below = f[0].below_pct.unwrap();
            // Three nodes: the two peers share half their pairs with node 2, so the gap reads smaller.
            assert!((-55.0..=-30.0).contains(&below), "n={n}: {below}");
            let (lo, hi) = f[0].below_pct_range.unwrap();
            assert!(
                lo <= below + 0.01 && hi >= below - 0.01 && hi < -20.0,
                "{lo} {hi}"
            );
            assert!(f[0].text.contains("node 2 (n2) nic1"), "{}", f[0].text);
        }
    }

    #[test]
    fn a_gap_that_one_repetition_reverses_is_not_named() {
        // Node 1 at half speed in repetitions 0 and 1 (its medians read slow), at 1.5 times in
        // repetition 2: the machine's noise, not the node.
        let mut rows = matrix(4, 2.0, |s, r, l| {
            let base = if l == "all" { 20.0 } else { 10.0 };
            if s == 1 || r == 1 {
                base * 0.5
            } else {
                base
            }
        });
        for r in rows
            .iter_mut()
            .filter(|r| r.rep == 2 && (r.sender == 1 || r.receiver == 1))
        {
            r.gbps = r.gbps.map(|g| g * 3.0);
        }
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert!(f.is_empty(), "{f:#?}");
        // The same without the reversal is named.
        for r in rows
            .iter_mut()
            .filter(|r| r.rep == 2 && (r.sender == 1 || r.receiver == 1))
        {
            r.gbps = r.gbps.map(|g| g / 3.0);
        }
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::Node, Some(1), String::new(), None)],
            "{f:#?}"
        );
    }

    #[test]
    fn a_slow_node_is_named_once_as_a_node() {
        let rows = matrix(4, 2.0, |s, r, l| {
            let base = if l == "all" { 20.0 } else { 10.0 };
            if s == 3 || r == 3 {
                base * 0.6
            } else {
                base
            }
        });
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::Node, Some(3), String::new(), None)],
            "{f:#?}"
        );
        assert!(f[0].text.contains("every NIC"));
    }

    #[test]
    fn a_slow_pair_and_an_all_nic_bottleneck_are_told_from_nodes() {
        // 1 -> 3 on nic0 at 40%: a path, not a node.
        let rows = matrix(5, 2.0, |s, r, l| match l {
            "all" => 20.0,
            "nic0" if s == 1 && r == 3 => 4.0,
            _ => 10.0,
        });
        let f = findings(&rows, &nodes(5), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::Pair, Some(1), "nic0".to_string(), Some(3))],
            "{f:#?}"
        );
        // Node 0 fine on each NIC alone, at 60% with both.
        let rows = matrix(4, 2.0, |s, r, l| match l {
            "all" if s == 0 || r == 0 => 12.0,
            "all" => 20.0,
            _ => 10.0,
        });
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::AllNics, Some(0), "all".to_string(), None)],
            "{f:#?}"
        );
    }

    #[test]
    fn a_slow_rail_is_named_where_no_node_explains_it() {
        // Two nodes, nic1 at half: node scores are equal by construction; the rail is named.
        let rows = matrix(2, 2.0, |_, _, l| match l {
            "nic1" => 5.0,
            "all" => 15.0,
            _ => 10.0,
        });
        let f = findings(&rows, &nodes(2), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::Rail, None, "nic1".to_string(), None)],
            "{f:#?}"
        );
        assert!(f[0].text.contains("either end"), "{}", f[0].text);
        let below = f[0].below_pct.unwrap();
        assert!((-55.0..=-45.0).contains(&below), "{below}");
        // Two healthy nodes: nothing.
        let rows = matrix(2, 3.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
        assert!(findings(&rows, &nodes(2), &Thresholds::default()).is_empty());
    }

    #[test]
    fn a_nic_whose_every_run_failed_is_named_as_that_nodes_nic() {
        let mut rows = matrix(4, 2.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
        for r in rows
            .iter_mut()
            .filter(|r| r.nic == "nic1" && (r.sender == 2 || r.receiver == 2))
        {
            unmeasured(r, "failed", "receiver: connecting: no route to host");
        }
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![(FindingKind::Failed, Some(2), "nic1".to_string(), None)],
            "{f:#?}"
        );
        assert!(
            f[0].text.contains("18 of its 18 runs failed"),
            "{}",
            f[0].text
        );
    }

    #[test]
    fn a_nic_that_fails_mid_run_is_not_also_judged_slow_on_its_runs_from_before() {
        // Node 3's nic1 goes down after its first run on nic1, which was slower than its peers'
        // (the one figure left is its score there); with all NICs the same.
        let mut rows = matrix(4, 2.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
        for l in ["nic1", "all"] {
            let mut first = true;
            for r in rows
                .iter_mut()
                .filter(|r| r.nic == l && (r.sender == 3 || r.receiver == 3))
            {
                if std::mem::take(&mut first) {
                    r.gbps = r.gbps.map(|g| g * 0.7);
                } else {
                    unmeasured(r, "failed", "sender: NIC `eth2` is down");
                }
            }
        }
        let f = findings(&rows, &nodes(4), &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![
                (FindingKind::Failed, Some(3), "all".to_string(), None),
                (FindingKind::Failed, Some(3), "nic1".to_string(), None),
            ],
            "{f:#?}"
        );
    }

    #[test]
    fn lost_nodes_and_failed_runs_are_findings_and_do_not_blame_others() {
        let mut rows = matrix(4, 2.0, |_, _, l| if l == "all" { 20.0 } else { 10.0 });
        for r in rows.iter_mut().filter(|r| r.sender == 1 || r.receiver == 1) {
            unmeasured(r, "skipped", "skipped: node 1 is out");
        }
        let bad = rows
            .iter_mut()
            .find(|r| r.sender == 0 && r.receiver == 2)
            .unwrap();
        bad.status = "wrong_bytes".into();
        bad.wrong_bytes = Some(7);
        let mut ns = nodes(4);
        ns[1].lost = "the connection was closed".into();
        let f = findings(&rows, &ns, &Thresholds::default());
        assert_eq!(
            names(&f),
            vec![
                (FindingKind::Lost, Some(1), String::new(), None),
                (FindingKind::Failed, Some(0), "nic0".to_string(), Some(2)),
            ],
            "{f:#?}"
        );
        assert!(f[0].text.contains("closed"));
    }
}
