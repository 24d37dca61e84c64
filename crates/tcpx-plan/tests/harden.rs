//! Hardening of the plan engine: repeated experiment names are numbered in linear time, long
//! estimates warn, bad budgets are refused, and random knob maps never panic: each is either
//! accepted or refused with a message naming a knob of the map.

mod common;

use tcpx_plan::*;

use common::{dry, facts, plans_dir, targets};

#[test]
fn repeated_names_are_numbered_and_explicit_suffixes_are_not_reused() {
    let est = dry(
        "let b = experiment(#{ name: \"a\", size: \"4K\", iters: 1, warmup: 0 });\n\
         run(b); run(b.with_knobs(#{ name: \"a#3\" })); run(b); run(b); run(b);",
    )
    .unwrap();
    assert_eq!(est.names, ["a", "a#3", "a#2", "a#4", "a#5"]);
}

/// 30,000 runs of one name: with a scan over the earlier suffixes this took minutes (quadratic);
/// numbered from a per-name counter it stays within the default operation limit's time.
#[test]
fn many_repeats_of_one_name_are_all_numbered() {
    let n = 30_000;
    let est = dry(&format!(
        "let b = experiment(#{{ name: \"r\", size: \"4K\", iters: 1, warmup: 0 }});\n\
         for i in 0..{n} {{ run(b); }}"
    ))
    .unwrap();
    assert_eq!(est.experiments, n);
    assert_eq!(est.names.last().unwrap(), &format!("r#{n}"));
}

#[test]
fn estimates_over_a_day_warn() {
    let short = Estimate {
        experiments: 1,
        runs: 1,
        seconds: 60.0,
        worst_seconds: 60.0,
        names: vec!["a".into()],
    };
    assert_eq!(short.warning(), None);
    let long = Estimate {
        seconds: 687_194_763.0,
        ..short.clone()
    };
    let w = long.warning().unwrap();
    assert!(w.contains("687194763 s"), "{w}");
    assert!(Estimate {
        seconds: f64::INFINITY,
        ..short
    }
    .warning()
    .is_some());
}

#[test]
fn negative_or_nan_budgets_are_refused_not_compared() {
    let plan = Plan::from_source("t", &plans_dir(), "run(experiment(#{ size: \"4K\" }));");
    for b in [-5.0, f64::NAN, f64::NEG_INFINITY] {
        let e = plan
            .check_budget(&facts(), &targets(), Some(b), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--budget") && e.contains("0 or more"),
            "{b}: {e}"
        );
    }
    plan.check_budget(&facts(), &targets(), Some(1e9), false)
        .unwrap();
}

/// A small deterministic generator (xorshift64*), so a failure names its seed and reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// Values at and around every edge, in Rhai syntax.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "64",
    "65",
    "4096",
    "1000000",
    "1000001",
    "9223372036854775807",
    "-9223372036854775807",
    "0.0",
    "0.1",
    "-0.5",
    "1e300",
    "3600.0",
    "3600.5",
    "(0.0 / 0.0)",
    "true",
    "()",
    "\"\"",
    "\"4K\"",
    "\"1G\"",
    "\"2G\"",
    "\"99999999T\"",
    "\"-1\"",
    "\"x\"",
    "\",\"",
    "\"auto\"",
    "\"host\"",
    "\"cuda:9,9\"",
    "[]",
    "[1, 2]",
    "[\"4K\", \"1M\"]",
    "[\"4K\", -1]",
    "#{}",
];

#[test]
fn random_knob_maps_never_panic_and_refusals_name_a_knob() {
    let names: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..400 {
        let seed = rng.0;
        let n = 1 + rng.next() % 4;
        let mut keys = Vec::new();
        let mut fields = Vec::new();
        for _ in 0..n {
            let k = if rng.next() % 20 == 0 {
                "no_such_knob"
            } else {
                rng.pick(&names)
            };
            if keys.contains(&k) {
                continue;
            }
            keys.push(k);
            fields.push(format!("{k}: {}", rng.pick(VALUES)));
        }
        let src = format!(
            "let e = experiment(#{{ iters: 1, warmup: 0, size: \"4K\" }});\nrun(e.with_knobs(#{{ {} }}));",
            fields.join(", ")
        );
        let result = std::panic::catch_unwind(|| dry(&src));
        let Ok(result) = result else {
            panic!("case {case} (seed {seed:#x}) panicked on:\n{src}");
        };
        if let Err(e) = result {
            let e = e.to_string();
            assert!(
                keys.iter().any(|k| e.contains(k)),
                "case {case} (seed {seed:#x}): the refusal names no knob of the map:\n{src}\n{e}"
            );
        }
    }
}
