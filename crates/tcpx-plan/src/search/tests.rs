//! The search on simulated objectives with known optima: deterministic (seeded), each point
//! costing one simulated second.

use super::*;

fn dim(name: &str, n: usize) -> Dim {
    Dim {
        name: name.into(),
        levels: (0..n).map(|i| i.to_string()).collect(),
    }
}

fn space(levels: &[usize]) -> Space {
    Space::new(
        levels
            .iter()
            .enumerate()
            .map(|(i, &n)| dim(&format!("k{i}"), n))
            .collect(),
    )
    .unwrap()
}

/// Multiplicative noise of at most `amp` either way, fixed by the point's id and a seed.
fn noise(id: usize, seed: u64, amp: f64) -> f64 {
    let mut r = Rng(seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
    let u = (r.next() % 1_000_000) as f64 / 1_000_000.0;
    1.0 + amp * (2.0 * u - 1.0)
}

/// Runs `search` against `f` to the end, each point costing `cost_s`; returns the outcome.
fn drive(
    search: &mut Search,
    f: &dyn Fn(&[usize]) -> Result<f64, String>,
    amp: f64,
    seed: u64,
    cost_s: f64,
) -> Outcome {
    let mut elapsed = 0.0;
    let mut guard = 0;
    while let Step::Measure(r) = search.next(elapsed) {
        let v = f(&r.coords).map(|v| v * noise(r.id, seed, amp));
        search.record(r.id, v, cost_s).unwrap();
        elapsed += cost_s;
        guard += 1;
        assert!(guard <= MAX_POINTS, "the search never ended");
    }
    search.outcome()
}

/// A model of NCCL's point-to-point path as measured on one H200 (issue 42's table): sockets
/// alone lift it from 2.7 to about 4.2 and stop at the channel/chunk bottleneck; channels or
/// chunk alone do nothing; only sockets, channels x chunk and buffers together reach the optimum. Levels:
/// k0 sockets (5), k1 channels (5), k2 chunk (6), k3 buffer (5).
fn bottlenecks(c: &[usize]) -> Result<f64, String> {
    let (s, ch, k, b) = (c[0] as f64, c[1] as f64, c[2] as f64, c[3] as f64);
    let sockets = 2.7 + 4.5 * s;
    let pipeline = 4.2 + 3.0 * (ch - 1.0).max(0.0) * k;
    let buffers = 4.4 + if k > 0.0 { 4.5 * b } else { 0.0 };
    Ok(sockets.min(pipeline).min(buffers))
}

const BOTTLENECK_OPTIMUM: f64 = 20.7;

/// Changes one knob at a time from the base, keeping each knob's best level: what the search
/// must do better than.
fn one_at_a_time(
    space: &Space,
    base: &[usize],
    f: &dyn Fn(&[usize]) -> Result<f64, String>,
) -> f64 {
    let mut cur = base.to_vec();
    let mut best = f(&cur).unwrap_or(0.0);
    for d in 0..space.dims.len() {
        for l in 0..space.dims[d].levels.len() {
            let mut p = cur.clone();
            p[d] = l;
            if let Ok(v) = f(&p) {
                if v > best * (1.0 + NOISE) {
                    best = v;
                    cur = p;
                }
            }
        }
    }
    best
}

#[test]
fn one_at_a_time_stops_at_the_first_bottleneck_and_the_search_does_not() {
    let sp = space(&[5, 5, 6, 5]);
    let base = vec![0, 1, 0, 0];
    let oat = one_at_a_time(&sp, &base, &bottlenecks);
    let base_v = bottlenecks(&base).unwrap();
    assert!(
        oat / base_v < 1.7,
        "the model must defeat one-at-a-time: it reached {oat} from {base_v}"
    );
    for seed in 0..12 {
        let mut s = Search::new(
            sp.clone(),
            base.clone(),
            Budget {
                points: 60,
                seconds: 1e9,
            },
            seed,
        )
        .unwrap();
        let out = drive(&mut s, &bottlenecks, 0.0, seed, 1.0);
        let w = out.winner.clone().expect("a winner");
        let v = bottlenecks(&w).unwrap();
        assert!(
            v >= 0.95 * BOTTLENECK_OPTIMUM,
            "seed {seed}: the search stopped at {v} ({}), optimum {BOTTLENECK_OPTIMUM}",
            sp.describe(&w)
        );
        assert!(
            s.records().len() <= 60,
            "seed {seed}: over the point budget"
        );
    }
}

#[test]
fn with_three_percent_noise_the_search_still_reaches_the_optimum_region() {
    let sp = space(&[5, 5, 6, 5]);
    let base = vec![0, 1, 0, 0];
    for seed in 0..8 {
        let mut s = Search::new(
            sp.clone(),
            base.clone(),
            Budget {
                points: 80,
                seconds: 1e9,
            },
            seed,
        )
        .unwrap();
        let out = drive(&mut s, &bottlenecks, 0.03, seed, 1.0);
        let w = out.winner.expect("a winner");
        let v = bottlenecks(&w).unwrap();
        assert!(
            v >= 0.9 * BOTTLENECK_OPTIMUM,
            "seed {seed}: {v} at {}",
            sp.describe(&w)
        );
        assert!(!out.winner_samples.is_empty());
        assert!(!out.base_samples.is_empty(), "the base is always measured");
    }
}

#[test]
fn a_separable_objective_finds_its_known_optimum_exactly() {
    // Peak at (3, 1, 4): a product of single-knob bumps.
    let f = |c: &[usize]| -> Result<f64, String> {
        let bump = |x: usize, at: usize| 1.0 / (1.0 + (x as f64 - at as f64).powi(2));
        Ok(10.0 * bump(c[0], 3) * bump(c[1], 1) * bump(c[2], 4))
    };
    let sp = space(&[6, 4, 7]);
    let mut s = Search::new(
        sp,
        vec![0, 0, 0],
        Budget {
            points: 40,
            seconds: 1e9,
        },
        7,
    )
    .unwrap();
    let out = drive(&mut s, &f, 0.0, 7, 1.0);
    assert_eq!(out.winner, Some(vec![3, 1, 4]));
}

#[test]
fn failing_points_are_recorded_never_recommended_and_the_search_goes_on() {
    // The plugin's case: many sockets with many channels fails the job; the optimum borders it.
    let f = |c: &[usize]| -> Result<f64, String> {
        if c[0] + c[1] >= 6 {
            return Err("NCCL error: unhandled system error".into());
        }
        Ok(1.0 + c[0] as f64 * 2.0 + c[1] as f64 * 1.5 + c[2] as f64 * 0.1)
    };
    let sp = space(&[5, 5, 3]);
    for seed in 0..6 {
        let mut s = Search::new(
            sp.clone(),
            vec![0, 0, 0],
            Budget {
                points: 40,
                seconds: 1e9,
            },
            seed,
        )
        .unwrap();
        let out = drive(&mut s, &f, 0.0, seed, 1.0);
        let failures = s.records().iter().filter(|r| r.value.is_err()).count();
        assert!(
            failures > 0,
            "seed {seed}: the design never met the failing region"
        );
        assert!(
            s.records()
                .iter()
                .any(|r| r.value.is_err() && r.id + 1 < s.records().len()),
            "seed {seed}: the search stopped at its first failure"
        );
        let w = out.winner.expect("a winner");
        assert!(
            f(&w).is_ok(),
            "seed {seed}: a failing point was recommended"
        );
        assert!(f(&w).unwrap() >= 0.9 * 10.7, "seed {seed}: {:?}", w);
    }
}

#[test]
fn of_a_tied_plateau_the_cheapest_is_taken() {
    // Anything with k0 >= 2 reaches the same 10: the cheapest of the plateau is (2, 0).
    let f = |c: &[usize]| -> Result<f64, String> {
        Ok(if c[0] >= 2 { 10.0 } else { 4.0 + c[0] as f64 })
    };
    let sp = space(&[5, 4]);
    let mut s = Search::new(
        sp,
        vec![0, 0],
        Budget {
            points: 30,
            seconds: 1e9,
        },
        3,
    )
    .unwrap();
    let out = drive(&mut s, &f, 0.0, 3, 1.0);
    let w = out.winner.unwrap();
    assert_eq!(f(&w).unwrap(), 10.0);
    assert_eq!(cost(&w), 2, "not the cheapest of the plateau: {w:?}");
}

#[test]
fn the_seconds_budget_stops_the_search() {
    let sp = space(&[5, 5, 6, 5]);
    let mut s = Search::new(
        sp,
        vec![0, 1, 0, 0],
        Budget {
            points: 500,
            seconds: 100.0,
        },
        1,
    )
    .unwrap();
    drive(&mut s, &bottlenecks, 0.0, 1, 10.0);
    assert!(
        s.records().len() <= 10,
        "{} points of 10 s in a 100 s budget",
        s.records().len()
    );
}

#[test]
fn the_same_seed_asks_for_the_same_points() {
    let sp = space(&[5, 5, 6, 5]);
    let run = |seed| {
        let mut s = Search::new(
            sp.clone(),
            vec![0, 1, 0, 0],
            Budget {
                points: 50,
                seconds: 1e9,
            },
            seed,
        )
        .unwrap();
        drive(&mut s, &bottlenecks, 0.02, seed, 1.0);
        s.records()
            .iter()
            .map(|r| r.coords.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn ablation_says_which_knobs_mattered_at_the_winner() {
    let sp = space(&[5, 5, 6, 5]);
    let base = vec![0, 1, 0, 0];
    let mut s = Search::new(
        sp,
        base.clone(),
        Budget {
            points: 80,
            seconds: 1e9,
        },
        2,
    )
    .unwrap();
    let out = drive(&mut s, &bottlenecks, 0.0, 2, 1.0);
    let w = out.winner.clone().unwrap();
    // Putting sockets back to one socket costs the winner most of its speed.
    let sockets = out
        .effects
        .iter()
        .find(|e| e.dim == "k0")
        .expect("k0 changed");
    assert!(sockets.gain.unwrap() > 3.0, "{:?}", out.effects);
    assert_eq!(
        out.effects.len(),
        (0..4).filter(|&d| w[d] != base[d]).count(),
        "one effect per knob the winner changed"
    );
}

#[test]
fn impossible_figures_are_failures_and_unknown_ids_are_refused() {
    let mut s = Search::new(
        space(&[3]),
        vec![0],
        Budget {
            points: 5,
            seconds: 1e9,
        },
        0,
    )
    .unwrap();
    let Step::Measure(r) = s.next(0.0) else {
        panic!("a first point")
    };
    assert!(s.record(r.id + 1, Ok(1.0), 1.0).is_err());
    s.record(r.id, Ok(f64::INFINITY), 1.0).unwrap();
    assert!(s.records()[0].value.is_err());
    assert!(s.record(r.id, Ok(1.0), 1.0).is_err(), "recorded twice");
}

#[test]
fn a_space_refuses_what_it_cannot_search() {
    assert!(Space::new(vec![]).is_err());
    assert!(Space::new(vec![dim("a", 0)]).is_err());
    assert!(Space::new(vec![dim("a", 2), dim("a", 3)]).is_err());
    assert!(Space::new(vec![Dim {
        name: "a".into(),
        levels: vec!["1".into(), "1".into()]
    }])
    .is_err());
    assert!(Space::new((0..17).map(|i| dim(&format!("d{i}"), 2)).collect()).is_err());
    let sp = space(&[2, 3]);
    assert!(Search::new(
        sp.clone(),
        vec![0],
        Budget {
            points: 10,
            seconds: 1.0
        },
        0
    )
    .is_err());
    assert!(Search::new(
        sp.clone(),
        vec![0, 3],
        Budget {
            points: 10,
            seconds: 1.0
        },
        0
    )
    .is_err());
    assert!(Search::new(
        sp.clone(),
        vec![0, 0],
        Budget {
            points: 1,
            seconds: 1.0
        },
        0
    )
    .is_err());
    assert!(Search::new(
        sp,
        vec![0, 0],
        Budget {
            points: 10,
            seconds: f64::NAN
        },
        0
    )
    .is_err());
}

#[test]
fn when_every_point_fails_there_is_no_winner() {
    let mut s = Search::new(
        space(&[3, 3]),
        vec![0, 0],
        Budget {
            points: 12,
            seconds: 1e9,
        },
        0,
    )
    .unwrap();
    let out = drive(&mut s, &|_| Err("no GPU".into()), 0.0, 0, 1.0);
    assert_eq!(out.winner, None);
    assert_eq!(out.decision, Decision::NoneSucceeded);
    assert!(s.records().len() <= 12);
}
