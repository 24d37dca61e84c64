//! The tuning search: which configurations of a space of several knobs to measure, in what
//! order, within a budget of points and seconds, and which one to recommend.
//!
//! Sans-IO: [`Search::next`] says what to measure next ([`Step::Measure`]) or that the search is
//! over; [`Search::record`] hears the figure (or why the point failed) and what it cost in
//! seconds. Nothing here runs, sleeps or reads a clock: the caller passes the seconds spent, so
//! the search is tested on simulated objectives exactly as it runs on real ones.
//!
//! Why this strategy. The settings that move a network transport pay together (NCCL's
//! point-to-point path on one H200 went 2.7 -> 4.2 GB/s with 16 sockets alone, no better with 4
//! channels alone, and 13-16 GB/s only with sockets, channels, chunk and buffer changed at once),
//! so a search that changes one knob at a time from the defaults stops near the first bottleneck,
//! and a full grid of five knobs at five levels (3,125 points of several seconds each) does not
//! fit a budget of minutes. The search is the racing scheme of iterated racing (Birattari et al.,
//! "F-Race", 2002; López-Ibáñez et al., "irace", 2016) over a space-filling start:
//! 1. **Base**: the defaults, measured first (what every gain is against).
//! 2. **Design**: a Latin hypercube sample (McKay, Beckman and Conover, 1979) over the levels:
//!    every knob at every level about equally often, all knobs varied at once, so a gain that
//!    needs several knobs together is seen without searching for it.
//! 3. **Refine**: pattern search (Hooke and Jeeves, 1961) from the best points: one level up or
//!    down in each knob, then in pairs of knobs (the interactions), a successful move repeated
//!    in its direction; a local optimum restarts from the next best design point.
//! 4. **Race**: the best few configurations measured again in rotating order (successive
//!    halving: the clearly slower ones leave after each round) until one is ahead beyond noise,
//!    or the tied set is known and its cheapest is taken. "Ahead" is the bootstrap interval of
//!    the ratio of medians against the noise band, not the plan's group-sequential design: a
//!    race's finalists and rounds are not fixed in advance, which that design needs.
//! 5. **Ablation**: the winner with each knob put back to its base level, once each, which says
//!    which knobs mattered at the winner (interactions included, unlike per-knob averages).
//!
//! A point that fails (an error, a hang past its deadline, wrong bytes) is recorded with its
//! reason and never recommended; the search goes on around it. Levels are listed cheapest first
//! (fewer sockets, smaller buffers): of a tied set the one with the lowest level indices wins.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;
use tcpx_report::stats::{median, ratio_of_medians, Difference};

/// The most knobs a space may vary.
pub const MAX_DIMS: usize = 16;
/// The most levels one knob may take.
pub const MAX_LEVELS: usize = 64;
/// The most points one search may measure.
pub const MAX_POINTS: usize = 10_000;

/// One knob of a space: its name and the values it takes, cheapest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dim {
    pub name: String,
    pub levels: Vec<String>,
}

/// The knobs a search varies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Space {
    pub dims: Vec<Dim>,
}

impl Space {
    /// A space of `dims`: at least one knob, at most [`MAX_DIMS`], each with 1 to [`MAX_LEVELS`]
    /// distinct levels, names distinct.
    pub fn new(dims: Vec<Dim>) -> Result<Space, String> {
        if dims.is_empty() {
            return Err("a tune space needs at least one knob to vary".into());
        }
        if dims.len() > MAX_DIMS {
            return Err(format!(
                "a tune space varies at most {MAX_DIMS} knobs ({} given)",
                dims.len()
            ));
        }
        for (i, d) in dims.iter().enumerate() {
            if d.levels.is_empty() || d.levels.len() > MAX_LEVELS {
                return Err(format!(
                    "`{}`: give 1 to {MAX_LEVELS} values ({} given)",
                    d.name,
                    d.levels.len()
                ));
            }
            if dims[..i].iter().any(|o| o.name == d.name) {
                return Err(format!("`{}` is varied twice in one tune space", d.name));
            }
            for (j, l) in d.levels.iter().enumerate() {
                if d.levels[..j].contains(l) {
                    return Err(format!("`{}`: the value `{l}` is listed twice", d.name));
                }
            }
        }
        Ok(Space { dims })
    }

    /// How many configurations the space holds (saturating).
    pub fn size(&self) -> u128 {
        self.dims
            .iter()
            .fold(1u128, |n, d| n.saturating_mul(d.levels.len() as u128))
    }

    /// `name=value` pairs of a point.
    pub fn values(&self, coords: &[usize]) -> Vec<(String, String)> {
        self.dims
            .iter()
            .zip(coords)
            .map(|(d, &i)| (d.name.clone(), d.levels[i].clone()))
            .collect()
    }

    /// `name=value name=value` of a point.
    pub fn describe(&self, coords: &[usize]) -> String {
        self.values(coords)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What a search may spend: measured points and seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    pub points: usize,
    pub seconds: f64,
}

/// Which stage asked for a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Base,
    Design,
    Refine,
    Race,
    Ablation,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Base => "base",
            Phase::Design => "design",
            Phase::Refine => "refine",
            Phase::Race => "race",
            Phase::Ablation => "ablation",
        }
    }
}

/// One measurement the search asks for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    /// Its number, from 0, in the order asked.
    pub id: usize,
    pub coords: Vec<usize>,
    pub phase: Phase,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Measure(Request),
    /// The budget is spent or the race decided: read [`Search::outcome`].
    Done,
}

/// One measured point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointRecord {
    pub id: usize,
    pub coords: Vec<usize>,
    pub phase: Phase,
    /// The figure (higher is better), or why the point failed.
    pub value: Result<f64, String>,
    /// Seconds the measurement took.
    pub cost_s: f64,
}

/// How the winner was chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    /// Ahead of every other finalist beyond the noise band.
    Clear,
    /// Tied within noise with `others` (their coordinates): the cheapest of the set was taken.
    CheapestOfTied { others: Vec<Vec<usize>> },
    /// Only one configuration succeeded, or the budget ended the race undecided (the highest
    /// median was taken).
    Undecided,
    /// No point succeeded.
    NoneSucceeded,
}

/// A finalist of the race.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub coords: Vec<usize>,
    pub samples: Vec<f64>,
}

/// What a knob did at the winner: the winner's median over the figure with only this knob put
/// back to its base level (above 1: the knob's change helped).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Effect {
    pub dim: String,
    pub winner_level: String,
    pub base_level: String,
    /// `None` where the ablated point failed (then the change was needed for the point to run).
    pub gain: Option<f64>,
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub winner: Option<Vec<usize>>,
    pub decision: Decision,
    /// Every figure of the winner.
    pub winner_samples: Vec<f64>,
    /// Every figure of the base point.
    pub base_samples: Vec<f64>,
    pub finalists: Vec<Candidate>,
    pub effects: Vec<Effect>,
}

/// The noise band a race treats as no difference: 3 %, the spread seen between repetitions of
/// one configuration on loopback and on the GPU machine (docs/PERFORMANCE.md).
pub const NOISE: f64 = 0.03;
/// Race samples per finalist after which an undecided pair counts as tied.
pub const RACE_SAMPLES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Base,
    Design,
    Refine,
    Race,
    Ablation,
    Done,
}

/// Deterministic pseudo-random numbers (SplitMix64): the same seed, the same search.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The search (see the module documentation).
pub struct Search {
    space: Space,
    base: Vec<usize>,
    budget: Budget,
    rng: Rng,
    records: Vec<PointRecord>,
    pending: Option<Request>,
    stage: Stage,
    queue: VecDeque<Vec<usize>>,
    /// Refine: the point climbed from, and the neighbours still to try around it.
    climb: Option<Vec<usize>>,
    neighbours: VecDeque<Vec<usize>>,
    /// Refine: points already climbed from (local optima or restarts).
    climbed: Vec<Vec<usize>>,
    /// Race: the finalists still in, and the round.
    alive: Vec<Vec<usize>>,
    round: usize,
    race_order: VecDeque<Vec<usize>>,
    decision: Option<Decision>,
    winner: Option<Vec<usize>>,
    key: PointKey,
}

/// What makes two points one configuration ([`Search::with_key`]).
type PointKey = Box<dyn Fn(&[usize]) -> String>;

impl Search {
    /// A search of `space` from `base` (each knob's level index of the defaults) within
    /// `budget`; `seed` fixes every random choice.
    pub fn new(space: Space, base: Vec<usize>, budget: Budget, seed: u64) -> Result<Self, String> {
        if base.len() != space.dims.len()
            || base
                .iter()
                .zip(&space.dims)
                .any(|(&i, d)| i >= d.levels.len())
        {
            return Err("the base point must give a level of every knob of the space".into());
        }
        if budget.points < 2 || budget.points > MAX_POINTS {
            return Err(format!(
                "a tune budget of {} points: give 2 to {MAX_POINTS}",
                budget.points
            ));
        }
        if !budget.seconds.is_finite() || budget.seconds <= 0.0 {
            return Err(format!(
                "a tune budget of {} seconds: give a positive number",
                budget.seconds
            ));
        }
        Ok(Search {
            space,
            base,
            budget,
            rng: Rng(seed ^ 0x7463_7078_2d6c_6162),
            records: Vec::new(),
            pending: None,
            stage: Stage::Base,
            queue: VecDeque::new(),
            climb: None,
            neighbours: VecDeque::new(),
            climbed: Vec::new(),
            alive: Vec::new(),
            round: 0,
            race_order: VecDeque::new(),
            decision: None,
            winner: None,
            key: Box::new(|c: &[usize]| format!("{c:?}")),
        })
    }

    /// Points whose `key` is equal are one configuration (e.g. equal once NCCL's own clamps are
    /// applied): measured once, and a neighbour equal to a measured point is skipped.
    pub fn with_key(mut self, key: impl Fn(&[usize]) -> String + 'static) -> Self {
        self.key = Box::new(key);
        self
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    pub fn records(&self) -> &[PointRecord] {
        &self.records
    }

    fn measured_points(&self) -> usize {
        self.records.len()
    }

    fn spent_s(&self) -> f64 {
        self.records.iter().map(|r| r.cost_s).sum()
    }

    /// Seconds one more point is expected to take: the median of those measured so far.
    fn point_cost(&self) -> f64 {
        let costs: Vec<f64> = self.records.iter().map(|r| r.cost_s).collect();
        median(&costs).unwrap_or(0.0)
    }

    /// Points left, counting the seconds left at the expected cost per point.
    fn points_left(&self, elapsed_s: f64) -> usize {
        let by_points = self.budget.points.saturating_sub(self.measured_points());
        let cost = self.point_cost();
        let left_s = (self.budget.seconds - elapsed_s.max(self.spent_s())).max(0.0);
        let by_time = if cost > 0.0 {
            (left_s / cost).floor() as usize
        } else {
            by_points
        };
        by_points.min(by_time)
    }

    /// Points kept for the race and the ablation.
    fn reserve(&self) -> usize {
        let ablation = self.space.dims.len();
        (self.budget.points / 4).max(4) + ablation.min(self.budget.points / 8)
    }

    /// The successful figures of every point with `key`.
    fn samples_of(&self, coords: &[usize]) -> Vec<f64> {
        let k = (self.key)(coords);
        self.records
            .iter()
            .filter(|r| (self.key)(&r.coords) == k)
            .filter_map(|r| r.value.as_ref().ok().copied())
            .collect()
    }

    fn failed(&self, coords: &[usize]) -> bool {
        let k = (self.key)(coords);
        self.records
            .iter()
            .any(|r| (self.key)(&r.coords) == k && r.value.is_err())
    }

    fn measured(&self, coords: &[usize]) -> bool {
        let k = (self.key)(coords);
        self.records.iter().any(|r| (self.key)(&r.coords) == k)
            || self
                .pending
                .as_ref()
                .is_some_and(|p| (self.key)(&p.coords) == k)
    }

    /// Distinct successful configurations, best first by median (ties: cheapest first).
    fn ranking(&self) -> Vec<(Vec<usize>, f64)> {
        let mut seen: BTreeMap<String, (Vec<usize>, Vec<f64>)> = BTreeMap::new();
        let mut bad: Vec<String> = Vec::new();
        for r in &self.records {
            let k = (self.key)(&r.coords);
            match &r.value {
                Ok(v) => seen
                    .entry(k)
                    .or_insert_with(|| (r.coords.clone(), Vec::new()))
                    .1
                    .push(*v),
                Err(_) => bad.push(k),
            }
        }
        let mut out: Vec<(Vec<usize>, f64)> = seen
            .into_iter()
            .filter(|(k, _)| !bad.contains(k))
            .filter_map(|(_, (c, vs))| median(&vs).map(|m| (c, m)))
            .collect();
        out.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| cost(&a.0).cmp(&cost(&b.0)))
        });
        out
    }

    fn request(&mut self, coords: Vec<usize>, phase: Phase) -> Step {
        let r = Request {
            id: self.records.len(),
            coords,
            phase,
        };
        self.pending = Some(r.clone());
        Step::Measure(r)
    }

    /// What to measure next, `elapsed_s` seconds after the search started.
    pub fn next(&mut self, elapsed_s: f64) -> Step {
        if let Some(p) = &self.pending {
            return Step::Measure(p.clone());
        }
        loop {
            if self.stage != Stage::Done && self.points_left(elapsed_s) == 0 {
                self.finish_race();
                self.stage = Stage::Done;
            }
            match self.stage {
                Stage::Base => {
                    self.stage = Stage::Design;
                    let b = self.base.clone();
                    return self.request(b, Phase::Base);
                }
                Stage::Design => {
                    if self.queue.is_empty() && !self.design_started() {
                        self.fill_design();
                    }
                    let explore_left = self.points_left(elapsed_s).saturating_sub(self.reserve());
                    match self.queue.pop_front() {
                        Some(c) if explore_left > 0 => {
                            if self.measured(&c) {
                                continue;
                            }
                            return self.request(c, Phase::Design);
                        }
                        _ => {
                            self.queue.clear();
                            self.stage = Stage::Refine;
                        }
                    }
                }
                Stage::Refine => {
                    let explore_left = self.points_left(elapsed_s).saturating_sub(self.reserve());
                    if explore_left == 0 {
                        self.start_race();
                        continue;
                    }
                    match self.next_neighbour() {
                        Some(c) => return self.request(c, Phase::Refine),
                        None => {
                            self.start_race();
                            continue;
                        }
                    }
                }
                Stage::Race => match self.next_racer() {
                    Some(c) => return self.request(c, Phase::Race),
                    None => {
                        self.stage = Stage::Ablation;
                        self.queue = self.ablation_points().into();
                    }
                },
                Stage::Ablation => match self.queue.pop_front() {
                    Some(c) => {
                        if self.measured(&c) {
                            continue;
                        }
                        return self.request(c, Phase::Ablation);
                    }
                    None => self.stage = Stage::Done,
                },
                Stage::Done => {
                    if self.winner.is_none() {
                        self.finish_race();
                    }
                    return Step::Done;
                }
            }
        }
    }

    fn design_started(&self) -> bool {
        self.records.iter().any(|r| r.phase == Phase::Design)
    }

    /// A Latin hypercube of `n` points over the level indices, `n` a third of the budget (at
    /// least a point more than the knobs, so every knob moves in several points).
    fn fill_design(&mut self) {
        let dims = self.space.dims.len();
        let n = (self.budget.points / 3)
            .max(dims + 2)
            .min(self.budget.points.saturating_sub(self.reserve() + 1))
            .max(1);
        let mut columns: Vec<Vec<usize>> = Vec::with_capacity(dims);
        for d in &self.space.dims {
            let l = d.levels.len();
            let mut strata: Vec<usize> = (0..n).collect();
            self.rng.shuffle(&mut strata);
            let col = strata
                .into_iter()
                .map(|s| {
                    // Stratum s of n covers levels [s*l/n, (s+1)*l/n): one of them at random.
                    let lo = s * l / n;
                    let hi = ((s + 1) * l).div_ceil(n).max(lo + 1).min(l);
                    lo + self.rng.below(hi - lo)
                })
                .collect();
            columns.push(col);
        }
        let mut seen: Vec<Vec<usize>> = Vec::new();
        for i in 0..n {
            let c: Vec<usize> = columns.iter().map(|col| col[i]).collect();
            if !seen.contains(&c) && c != self.base {
                seen.push(c);
            }
        }
        self.queue = seen.into();
    }

    /// The next untried neighbour of the point being climbed from, moving the climb when a
    /// neighbour beat it.
    fn next_neighbour(&mut self) -> Option<Vec<usize>> {
        loop {
            // Move to a better point if the last refine point beat the one climbed from.
            if let Some(from) = self.climb.clone() {
                let best_here = median(&self.samples_of(&from)).unwrap_or(f64::NEG_INFINITY);
                if let Some(last) = self.records.last() {
                    if last.phase == Phase::Refine {
                        if let Ok(v) = last.value {
                            if v > best_here * (1.0 + NOISE / 2.0) {
                                let to = last.coords.clone();
                                // Pattern move: the same step again, tried first.
                                let step: Vec<isize> = to
                                    .iter()
                                    .zip(&from)
                                    .map(|(&a, &b)| a as isize - b as isize)
                                    .collect();
                                self.climbed.push(from);
                                self.climb = Some(to.clone());
                                self.neighbours = self.neighbours_of(&to).into();
                                if let Some(p) = self.moved(&to, &step) {
                                    self.neighbours.retain(|n| *n != p);
                                    self.neighbours.push_front(p);
                                }
                            }
                        }
                    }
                }
            }
            if self.climb.is_none() {
                let start = self
                    .ranking()
                    .into_iter()
                    .map(|(c, _)| c)
                    .find(|c| !self.climbed.contains(c))?;
                self.neighbours = self.neighbours_of(&start).into();
                self.climb = Some(start);
            }
            while let Some(n) = self.neighbours.pop_front() {
                if !self.measured(&n) {
                    return Some(n);
                }
            }
            // A local optimum: restart from the next best point not climbed yet.
            if let Some(from) = self.climb.take() {
                self.climbed.push(from);
            }
        }
    }

    fn moved(&self, from: &[usize], step: &[isize]) -> Option<Vec<usize>> {
        let mut out = Vec::with_capacity(from.len());
        for ((&f, &s), d) in from.iter().zip(step).zip(&self.space.dims) {
            let v = f as isize + s;
            if v < 0 || v as usize >= d.levels.len() {
                return None;
            }
            out.push(v as usize);
        }
        Some(out)
    }

    /// One level up or down in each knob (random order), then in every pair of knobs.
    fn neighbours_of(&mut self, c: &[usize]) -> Vec<Vec<usize>> {
        let dims = c.len();
        let mut axis = Vec::new();
        for d in 0..dims {
            for s in [-1isize, 1] {
                let mut step = vec![0isize; dims];
                step[d] = s;
                if let Some(p) = self.moved(c, &step) {
                    axis.push(p);
                }
            }
        }
        self.rng.shuffle(&mut axis);
        let mut pairs = Vec::new();
        for a in 0..dims {
            for b in a + 1..dims {
                for (sa, sb) in [(1isize, 1isize), (1, -1), (-1, 1), (-1, -1)] {
                    let mut step = vec![0isize; dims];
                    step[a] = sa;
                    step[b] = sb;
                    if let Some(p) = self.moved(c, &step) {
                        pairs.push(p);
                    }
                }
            }
        }
        self.rng.shuffle(&mut pairs);
        axis.extend(pairs);
        axis
    }

    fn start_race(&mut self) {
        self.stage = Stage::Race;
        self.alive = self.ranking().into_iter().take(4).map(|(c, _)| c).collect();
        self.round = 0;
        self.race_order.clear();
    }

    /// The next finalist to measure again: rounds in rotating order; after each round the
    /// clearly slower finalists leave, and where the points left do not cover another round,
    /// the slower half.
    fn next_racer(&mut self) -> Option<Vec<usize>> {
        loop {
            if let Some(c) = self.race_order.pop_front() {
                return Some(c);
            }
            if self.round > 0 {
                self.cut_race();
            }
            if self.alive.len() < 2 || self.race_settled() {
                self.finish_race();
                return None;
            }
            let left = self.budget.points.saturating_sub(self.measured_points());
            let ablation = self.space.dims.len().min(self.budget.points / 8);
            if left < self.alive.len() + ablation {
                self.alive.truncate((self.alive.len() / 2).max(1));
                if self.alive.len() < 2 || left < self.alive.len() {
                    self.finish_race();
                    return None;
                }
            }
            let k = self.alive.len();
            let r = self.round % k;
            self.race_order = (0..k).map(|i| self.alive[(i + r) % k].clone()).collect();
            self.round += 1;
        }
    }

    /// Drops the finalists that are lower than the leader beyond noise, and failed ones.
    fn cut_race(&mut self) {
        let alive = std::mem::take(&mut self.alive);
        let mut alive: Vec<Vec<usize>> = alive.into_iter().filter(|c| !self.failed(c)).collect();
        alive.sort_by(|a, b| {
            let (ma, mb) = (
                median(&self.samples_of(a)).unwrap_or(0.0),
                median(&self.samples_of(b)).unwrap_or(0.0),
            );
            mb.total_cmp(&ma).then_with(|| cost(a).cmp(&cost(b)))
        });
        if let Some(lead) = alive.first().cloned() {
            let ls = self.samples_of(&lead);
            alive.retain(|c| *c == lead || !decided_lower(&ls, &self.samples_of(c)));
        }
        self.alive = alive;
    }

    /// Every finalist has [`RACE_SAMPLES`] figures: what is still tied stays tied.
    fn race_settled(&self) -> bool {
        self.alive
            .iter()
            .all(|c| self.samples_of(c).len() >= RACE_SAMPLES)
    }

    /// Picks the winner from the finalists (or, before a race, from everything measured).
    fn finish_race(&mut self) {
        if self.winner.is_some() {
            return;
        }
        let ranking = self.ranking();
        if ranking.is_empty() {
            self.decision = Some(Decision::NoneSucceeded);
            return;
        }
        let mut finalists: Vec<Vec<usize>> = if self.alive.is_empty() {
            ranking.iter().take(4).map(|(c, _)| c.clone()).collect()
        } else {
            self.alive.clone()
        };
        finalists.retain(|c| !self.failed(c));
        if finalists.is_empty() {
            finalists.push(ranking[0].0.clone());
        }
        finalists.sort_by(|a, b| {
            let (ma, mb) = (
                median(&self.samples_of(a)).unwrap_or(0.0),
                median(&self.samples_of(b)).unwrap_or(0.0),
            );
            mb.total_cmp(&ma).then_with(|| cost(a).cmp(&cost(b)))
        });
        let lead = finalists[0].clone();
        let ls = self.samples_of(&lead);
        let tied: Vec<Vec<usize>> = finalists[1..]
            .iter()
            .filter(|c| {
                let s = self.samples_of(c);
                s.len() >= 2
                    && ls.len() >= 2
                    && ratio_of_medians(&ls, &s)
                        .is_some_and(|r| r.difference(NOISE) == Difference::Tied)
            })
            .cloned()
            .collect();
        let decided_lower = finalists[1..]
            .iter()
            .all(|c| decided_lower(&ls, &self.samples_of(c)));
        let (winner, decision) = if finalists.len() == 1 {
            (lead, Decision::Undecided)
        } else if decided_lower {
            (lead, Decision::Clear)
        } else if !tied.is_empty() {
            let mut set = tied.clone();
            set.push(lead.clone());
            set.sort_by_key(|c| cost(c));
            let cheapest = set[0].clone();
            let others = set[1..].to_vec();
            (cheapest, Decision::CheapestOfTied { others })
        } else {
            (lead, Decision::Undecided)
        };
        self.alive = finalists;
        self.winner = Some(winner);
        self.decision = Some(decision);
    }

    fn ablation_points(&mut self) -> Vec<Vec<usize>> {
        self.finish_race();
        let Some(w) = self.winner.clone() else {
            return Vec::new();
        };
        (0..w.len())
            .filter(|&d| w[d] != self.base[d])
            .map(|d| {
                let mut p = w.clone();
                p[d] = self.base[d];
                p
            })
            .collect()
    }

    /// Hears the result of the point [`next`](Self::next) asked for (`id`); `value` is the
    /// figure (higher is better, finite and not negative) or why it failed.
    pub fn record(
        &mut self,
        id: usize,
        value: Result<f64, String>,
        cost_s: f64,
    ) -> Result<(), String> {
        let Some(p) = self.pending.take_if(|p| p.id == id) else {
            return Err(format!(
                "point {id} was not asked for (or was recorded already)"
            ));
        };
        let value = match value {
            Ok(v) if !v.is_finite() || v < 0.0 => Err(format!("an impossible figure ({v})")),
            other => other,
        };
        let cost_s = if cost_s.is_finite() && cost_s >= 0.0 {
            cost_s
        } else {
            0.0
        };
        self.records.push(PointRecord {
            id,
            coords: p.coords,
            phase: p.phase,
            value,
            cost_s,
        });
        Ok(())
    }

    /// The answer, once [`next`](Self::next) returned [`Step::Done`] (or at any time: the best
    /// so far).
    pub fn outcome(&mut self) -> Outcome {
        self.finish_race();
        let winner = self.winner.clone();
        let winner_samples = winner
            .as_ref()
            .map(|w| self.samples_of(w))
            .unwrap_or_default();
        let base_samples = self.samples_of(&self.base.clone());
        let finalists = self
            .alive
            .iter()
            .map(|c| Candidate {
                coords: c.clone(),
                samples: self.samples_of(c),
            })
            .collect();
        let effects = match &winner {
            Some(w) => {
                let wm = median(&winner_samples);
                (0..w.len())
                    .filter(|&d| w[d] != self.base[d])
                    .map(|d| {
                        let mut p = w.clone();
                        p[d] = self.base[d];
                        let s = self.samples_of(&p);
                        let dim = &self.space.dims[d];
                        Effect {
                            dim: dim.name.clone(),
                            winner_level: dim.levels[w[d]].clone(),
                            base_level: dim.levels[self.base[d]].clone(),
                            gain: match (wm, median(&s)) {
                                (Some(a), Some(b)) if b > 0.0 && !self.failed(&p) => Some(a / b),
                                _ => None,
                            },
                        }
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        Outcome {
            winner,
            decision: self.decision.clone().unwrap_or(Decision::NoneSucceeded),
            winner_samples,
            base_samples,
            finalists,
            effects,
        }
    }
}

/// Figures a finalist needs before it can be called slower than the leader: with fewer, a
/// bootstrap interval of the median is too narrow to trust.
pub const DECIDING_SAMPLES: usize = 3;

/// `other` is below `leader` beyond noise, each with at least [`DECIDING_SAMPLES`] figures.
fn decided_lower(leader: &[f64], other: &[f64]) -> bool {
    leader.len() >= DECIDING_SAMPLES
        && other.len() >= DECIDING_SAMPLES
        && ratio_of_medians(leader, other).is_some_and(|r| r.difference(NOISE) == Difference::Lower)
}

/// What a configuration costs: levels are listed cheapest first.
fn cost(c: &[usize]) -> usize {
    c.iter().sum()
}

#[cfg(test)]
mod tests;
