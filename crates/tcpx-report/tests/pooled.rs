//! Iteration percentiles of a configuration are taken over every iteration of every
//! repetition together, not as a median of per-repetition percentiles.

// Only `rec` of the shared fixtures is needed here.
#[allow(dead_code)]
mod common;

use common::rec;
use tcpx_report::summarise;

#[test]
fn p50_and_p99_pool_every_iteration_of_every_repetition() {
    // Repetition 1 took 1..=100 us per iteration, repetition 2 took 101..=200 us.
    let mut a = rec(8, 1 << 20, Some(2.0));
    let mut b = rec(8, 1 << 20, Some(2.0));
    b.rep = 2;
    a.recv.as_mut().unwrap().iter_us = (1..=100).map(f64::from).collect();
    b.recv.as_mut().unwrap().iter_us = (101..=200).map(f64::from).collect();
    let s = &summarise([a, b].iter())[0];
    // Over the 200 iterations: nearest-rank p50 is the 100th value, p99 the 198th.
    assert_eq!(s.pooled.get("p50_us"), Some(&100.0));
    assert_eq!(s.pooled.get("p99_us"), Some(&198.0));
    assert_eq!(s.pooled_iterations.get("recv"), Some(&200));
    assert_eq!(s.metric("p99_us"), Some(198.0));
    // Each repetition's own p99 (99 and 198) has a median that is neither: pooling is not that.
    assert_ne!(s.figure("p99_us").map(|f| f.median), Some(198.0));
    // The sender kept no iteration times here: its percentiles stay per-repetition medians.
    assert!(!s.pooled.contains_key("send_p50_us"));
    assert_eq!(
        s.metric("send_p50_us"),
        s.figure("send_p50_us").map(|f| f.median)
    );
}

#[test]
fn a_repetition_without_iteration_times_leaves_the_percentiles_unpooled() {
    let mut a = rec(8, 1 << 20, Some(2.0));
    let mut b = rec(8, 1 << 20, Some(2.0));
    b.rep = 2;
    a.recv.as_mut().unwrap().iter_us = vec![5.0; 10];
    let s = &summarise([a, b].iter())[0];
    assert!(s.pooled.is_empty(), "{:?}", s.pooled);
    assert_eq!(s.metric("p50_us"), s.figure("p50_us").map(|f| f.median));
}
