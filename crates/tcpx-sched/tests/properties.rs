//! Property tests: random configurations driven by random (but valid) event orders.

use proptest::prelude::*;
use tcpx_sched::{Assignment, Chunk, Role, SchedConfig, Schedule};

fn config() -> impl Strategy<Value = SchedConfig> {
    (1u64..600, 1usize..6, 1usize..5)
        .prop_flat_map(|(size, channels, window)| {
            let weights = prop::collection::vec(0u32..4, channels)
                .prop_filter("one weight > 0", |w| w.iter().any(|&x| x > 0));
            let assignment = prop_oneof![
                Just(Assignment::RoundRobin),
                weights.prop_map(Assignment::Weighted)
            ];
            (
                Just(size),
                1u64..=size,
                Just(window),
                Just(channels),
                assignment,
            )
        })
        .prop_map(|(size, chunk, window, channels, assignment)| SchedConfig {
            size,
            chunk,
            window,
            channels,
            assignment,
        })
}

/// Drives a schedule to the end, choosing among the legal moves with `picks`; returns the chunks in
/// the order they were posted and, per channel, the order they finished. `laps` repetitions of
/// the message make one transfer.
fn drive(cfg: &SchedConfig, role: Role, picks: &[u8], laps: u64) -> (Vec<Chunk>, Vec<Vec<u64>>) {
    let mut s = Schedule::repeated(cfg.clone(), role, laps).unwrap();
    let mut finished_in_lap = vec![0u64; laps as usize];
    // Message offsets with a request in flight: no two may share bytes.
    let mut lent = std::collections::HashSet::new();
    let mut posted = Vec::new();
    let mut finished = vec![Vec::new(); cfg.channels];
    let mut step = 0usize;
    while !s.is_done() {
        let mut moves: Vec<(u8, usize)> = Vec::new();
        if s.next_post().is_some() {
            moves.push((0, 0));
        }
        for c in 0..cfg.channels {
            if s.next_test(c).is_some() {
                moves.push((1, c));
            }
            if role == Role::Recv && s.next_consume(c).is_some() {
                moves.push((2, c));
            }
            // Invariant: a window is never exceeded.
            assert!(s.in_flight(c) <= cfg.window);
        }
        assert!(!moves.is_empty(), "schedule stalled before the end");
        let pick = picks.get(step % picks.len().max(1)).copied().unwrap_or(0) as usize;
        step += 1;
        let (kind, c) = moves[pick % moves.len()];
        match kind {
            0 => {
                let ch = s.next_post().unwrap();
                s.posted(&ch).unwrap();
                assert!(
                    lent.insert(ch.offset),
                    "two requests in flight on the same bytes: {ch}"
                );
                posted.push(ch);
            }
            1 => {
                let ch = s.next_test(c).unwrap();
                s.completed(&ch, ch.len).unwrap();
                if role == Role::Send {
                    finished[c].push(ch.seq);
                    finished_in_lap[ch.lap as usize] += 1;
                    lent.remove(&ch.offset);
                }
            }
            _ => {
                let ch = s.next_consume(c).unwrap();
                s.consumed(&ch).unwrap();
                finished[c].push(ch.seq);
                finished_in_lap[ch.lap as usize] += 1;
                lent.remove(&ch.offset);
            }
        }
        // A lap is done exactly when all of its chunks are finished.
        for (lap, &n) in finished_in_lap.iter().enumerate() {
            assert_eq!(s.lap_is_done(lap as u64), n == cfg.chunk_count());
        }
    }
    assert_eq!(s.bytes_done(), cfg.size * laps);
    assert_eq!(s.total_bytes(), cfg.size * laps);
    (posted, finished)
}

proptest! {
    #[test]
    fn every_byte_exactly_once_per_lap_window_kept_fifo_kept(cfg in config(), picks in prop::collection::vec(any::<u8>(), 1..64), recv in any::<bool>(), laps in 1u64..4) {
        let role = if recv { Role::Recv } else { Role::Send };
        let (posted, finished) = drive(&cfg, role, &picks, laps);

        // Every byte of the message covered exactly once in every lap.
        for lap in 0..laps {
            let mut spans: Vec<(u64, u64)> =
                posted.iter().filter(|c| c.lap == lap).map(|c| (c.offset, c.len)).collect();
            spans.sort();
            let mut at = 0;
            for (off, len) in spans {
                prop_assert_eq!(off, at);
                prop_assert!(len > 0 && len <= cfg.chunk);
                at += len;
            }
            prop_assert_eq!(at, cfg.size);
        }
        // Indices run over the laps in order: lap l holds indices l*n .. (l+1)*n.
        let n = cfg.chunk_count();
        prop_assert!(posted.iter().all(|c| c.index / n == c.lap));

        // FIFO: per channel, posting and finishing follow the sequence numbers.
        for (c, done) in finished.iter().enumerate() {
            let seqs: Vec<u64> = posted.iter().filter(|x| x.channel == c).map(|x| x.seq).collect();
            prop_assert!(seqs.iter().enumerate().all(|(i, &s)| s == i as u64));
            prop_assert!(done.iter().enumerate().all(|(i, &s)| s == i as u64));
        }
    }

    #[test]
    fn both_sides_derive_the_same_channel_sequences(cfg in config(), laps in 1u64..4) {
        let send = Schedule::repeated(cfg.clone(), Role::Send, laps).unwrap();
        let recv = Schedule::repeated(cfg.clone(), Role::Recv, laps).unwrap();
        for c in 0..cfg.channels {
            prop_assert!(send.channel_chunks(c).eq(recv.channel_chunks(c)));
        }
    }

    #[test]
    fn weighted_shares_follow_weights(weights in prop::collection::vec(0u32..5, 1..6), n in 1u64..400) {
        prop_assume!(weights.iter().any(|&w| w > 0));
        let total: u64 = weights.iter().map(|&w| w as u64).sum();
        let cfg = SchedConfig { size: n, chunk: 1, window: 1, channels: weights.len(), assignment: Assignment::Weighted(weights.clone()) };
        let s = Schedule::new(cfg, Role::Send).unwrap();
        for (c, &w) in weights.iter().enumerate() {
            let got = s.channel_chunks(c).count() as f64;
            let want = n as f64 * w as f64 / total as f64;
            // Smooth WRR never strays more than one chunk from the exact share.
            prop_assert!((got - want).abs() <= 1.0 + 1e-9, "channel {} got {} want {}", c, got, want);
        }
    }
}
