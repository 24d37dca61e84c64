//! The fleet's schedule: a round-robin tournament (the circle method) of disjoint node pairs,
//! run in both directions, on every NIC alone and on all NICs together, repeated.
//!
//! Each [`Slot`] is a set of pair runs that go at once: no node is in two of them, so a slot
//! measures every pair in it without one pair's traffic taking from another's. An even fleet of
//! `n` nodes has `n - 1` tournament rounds of `n / 2` pairs; an odd one gets a stand-in node
//! ("bye"), so it has `n` rounds with one node idle in each. Every round runs twice, once per
//! direction, so each ordered pair (sender, receiver) appears exactly once per NIC choice and
//! repetition.

use serde::{Deserialize, Serialize};

/// Which NICs a pair run uses: NIC `i` of both nodes (rail `i`), or every NIC together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NicChoice {
    /// NIC number `i` of each node's list.
    Nic(u32),
    /// All NICs of each node together, one channel on each.
    All,
}

impl NicChoice {
    /// `nic0`, `nic1`, ... or `all`: the label of CSV rows and report sections.
    pub fn label(self) -> String {
        match self {
            NicChoice::Nic(i) => format!("nic{i}"),
            NicChoice::All => "all".into(),
        }
    }

    /// The choice a label names (`nic3`, `all`).
    pub fn from_label(label: &str) -> Option<NicChoice> {
        if label == "all" {
            return Some(NicChoice::All);
        }
        label.strip_prefix("nic")?.parse().ok().map(NicChoice::Nic)
    }

    /// The choices of a fleet whose nodes have `nics` NICs each: every NIC alone, then all of
    /// them together (only when there are two or more; with one NIC, `nic0` is all of them).
    pub fn all_for(nics: u32) -> Vec<NicChoice> {
        let mut v: Vec<NicChoice> = (0..nics).map(NicChoice::Nic).collect();
        if nics > 1 {
            v.push(NicChoice::All);
        }
        v
    }
}

/// One measurement: `sender` sends to `receiver` (which runs the bench server) over `nic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairRun {
    /// Index of this run in the whole schedule (the task id on the wire).
    pub id: u32,
    pub sender: u32,
    pub receiver: u32,
    pub nic: NicChoice,
    /// Repetition, from 0.
    pub rep: u32,
}

/// Pair runs that go at once: no node is in two of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Tournament round (0-based) this slot belongs to.
    pub round: u32,
    pub runs: Vec<PairRun>,
}

/// Most pair runs one fleet run may schedule: the schedule and the matrix are held in memory
/// (a row is a few hundred bytes), and a run that long would take days. 128 nodes with four
/// NICs (five choices) and three repetitions is 243,840.
pub const MAX_RUNS: u64 = 250_000;

/// Pair runs [`schedule`] makes for `n` nodes, `choices` NIC choices and `reps` repetitions.
pub fn runs_for(n: u32, choices: usize, reps: u32) -> u64 {
    let n = u64::from(n);
    n * n.saturating_sub(1) * choices as u64 * u64::from(reps)
}

/// The tournament rounds for `n` nodes as unordered pairs `(a, b)` with `a < b`: `n - 1` rounds
/// of `n / 2` pairs for even `n`, `n` rounds of `(n - 1) / 2` pairs for odd `n` (one node
/// idle each round). Every unordered pair appears exactly once.
pub fn tournament(n: u32) -> Vec<Vec<(u32, u32)>> {
    if n < 2 {
        return Vec::new();
    }
    // Odd: a stand-in node `n`; whoever meets it sits the round out.
    let m = if n % 2 == 0 { n } else { n + 1 };
    let mut rounds = Vec::with_capacity(m as usize - 1);
    for r in 0..m - 1 {
        let mut pairs = Vec::with_capacity(m as usize / 2);
        // Circle method: node m-1 stays put, the others rotate by one position per round.
        let pos = |i: u32| -> u32 {
            if i == m - 1 {
                m - 1
            } else {
                (i + r) % (m - 1)
            }
        };
        for i in 0..m / 2 {
            let (a, b) = (pos(i), pos(m - 1 - i));
            if a < n && b < n {
                pairs.push((a.min(b), a.max(b)));
            }
        }
        pairs.sort_unstable();
        rounds.push(pairs);
    }
    rounds
}

/// The whole schedule: for each repetition, every tournament round on every NIC choice in each
/// direction (lower rank sending first, then the other way), each a [`Slot`]. The NIC choices
/// take turns within a round, so a machine's load drifting over the run touches them alike
/// rather than making one NIC look slower than another.
pub fn schedule(n: u32, nics: &[NicChoice], reps: u32) -> Vec<Slot> {
    let rounds = tournament(n);
    let mut slots = Vec::new();
    let mut id = 0u32;
    for rep in 0..reps {
        for (r, pairs) in rounds.iter().enumerate() {
            for &nic in nics {
                for forward in [true, false] {
                    let runs = pairs
                        .iter()
                        .map(|&(a, b)| {
                            let (sender, receiver) = if forward { (a, b) } else { (b, a) };
                            let run = PairRun {
                                id,
                                sender,
                                receiver,
                                nic,
                                rep,
                            };
                            id += 1;
                            run
                        })
                        .collect();
                    slots.push(Slot {
                        round: r as u32,
                        runs,
                    });
                }
            }
        }
    }
    slots
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn every_ordered_pair_once_per_nic_and_rep_and_no_node_twice_in_a_slot() {
        for n in 2..=9u32 {
            let nics = NicChoice::all_for(2);
            let reps = 3;
            let slots = schedule(n, &nics, reps);
            let mut seen: BTreeMap<(u32, u32, NicChoice, u32), u32> = BTreeMap::new();
            let mut ids = BTreeSet::new();
            for s in &slots {
                let mut busy = BTreeSet::new();
                for r in &s.runs {
                    assert_ne!(r.sender, r.receiver, "n={n}: a node paired with itself");
                    assert!(r.sender < n && r.receiver < n, "n={n}: {r:?}");
                    assert!(
                        busy.insert(r.sender),
                        "n={n}: node {} twice in a slot",
                        r.sender
                    );
                    assert!(busy.insert(r.receiver), "n={n}: node {} twice", r.receiver);
                    *seen
                        .entry((r.sender, r.receiver, r.nic, r.rep))
                        .or_default() += 1;
                    assert!(ids.insert(r.id), "n={n}: id {} twice", r.id);
                }
                // Each slot is a full round: n/2 pairs (an odd fleet leaves one node idle).
                assert_eq!(s.runs.len() as u32, n / 2, "n={n}");
            }
            let want = (n * (n - 1)) as usize * nics.len() * reps as usize;
            assert_eq!(seen.len(), want, "n={n}: ordered pairs missing");
            assert!(seen.values().all(|&c| c == 1), "n={n}: a pair ran twice");
            // Rounds: n-1 for even n, n for odd n; two slots (directions) per round.
            let rounds = if n % 2 == 0 { n - 1 } else { n };
            assert_eq!(tournament(n).len() as u32, rounds, "n={n}");
            assert_eq!(
                slots.len(),
                rounds as usize * 2 * nics.len() * reps as usize,
                "n={n}"
            );
            assert_eq!(ids.len(), want);
            assert_eq!(
                *ids.iter().last().unwrap() as usize,
                want - 1,
                "ids are dense"
            );
        }
    }

    #[test]
    fn run_counts_match_the_schedule() {
        for (n, nics, reps) in [(2, 1, 1), (5, 2, 3), (8, 4, 2)] {
            let choices = NicChoice::all_for(nics);
            let got: usize = schedule(n, &choices, reps)
                .iter()
                .map(|s| s.runs.len())
                .sum();
            assert_eq!(runs_for(n, choices.len(), reps), got as u64);
        }
        assert!(runs_for(128, 5, 3) <= MAX_RUNS);
        assert!(runs_for(4096, 5, 3) > MAX_RUNS);
    }

    #[test]
    fn tiny_fleets_and_nic_labels() {
        assert!(tournament(0).is_empty() && tournament(1).is_empty());
        assert_eq!(tournament(2), vec![vec![(0, 1)]]);
        assert_eq!(NicChoice::all_for(1), vec![NicChoice::Nic(0)]);
        assert_eq!(
            NicChoice::all_for(2),
            vec![NicChoice::Nic(0), NicChoice::Nic(1), NicChoice::All]
        );
        for c in NicChoice::all_for(4) {
            assert_eq!(NicChoice::from_label(&c.label()), Some(c));
        }
        assert_eq!(NicChoice::from_label("nicx"), None);
        assert_eq!(NicChoice::from_label("eth0"), None);
    }
}
