//! A run report with records in every shape charts need, shared by the tests.

use std::collections::BTreeMap;

use serde_json::json;
use tcpx_model::Knob;
use tcpx_report::*;

pub fn fig(gbs: f64) -> SideFigures {
    SideFigures {
        avg_us: 1000.0 / gbs,
        p50_us: 990.0 / gbs,
        p99_us: 1200.0 / gbs,
        min_us: 900.0 / gbs,
        max_us: 1300.0 / gbs,
        algbw_gbs: gbs,
        busbw_gbs: gbs,
        wrong_bytes: Some(0),
        iter_us: Vec::new(),
    }
}

pub fn rec(window: u32, chunk: u64, gbs: Option<f64>) -> ResultRecord {
    let mut knobs = KnobValues::new();
    knobs.insert(Knob::Window, json!(window));
    knobs.insert(Knob::Chunk, json!(chunk));
    knobs.insert(Knob::IrqPolicy, json!("nccl"));
    let mut not_applied = tcpx_model::NotApplied::new();
    not_applied.insert(Knob::IrqPolicy, "loopback has no IRQs".to_string());
    ResultRecord {
        phase: "sweep".into(),
        experiment: format!("w{window}-c{chunk}"),
        label: format!("window={window} chunk={}K", chunk >> 10),
        knobs,
        not_applied,
        status: if gbs.is_some() {
            Status::Ok
        } else {
            Status::Skipped
        },
        reason: gbs
            .is_none()
            .then(|| "not supported by this backend".to_string()),
        size: Some(4 << 20),
        chunk: Some(chunk),
        send: gbs.map(|g| fig(g * 0.9)),
        recv: gbs.map(fig),
        started_s: 0.0,
        duration_s: 0.1,
        per_flow: Vec::new(),
        nic_plan: BTreeMap::new(),
        rep: 1,
    }
}

/// Three repetitions of `rec`, at 98 %, 100 % and 102 % of `gbs`.
pub fn reps(window: u32, chunk: u64, gbs: Option<f64>) -> Vec<ResultRecord> {
    [0.98, 1.0, 1.02]
        .iter()
        .enumerate()
        .map(|(i, k)| ResultRecord {
            rep: i as u32 + 1,
            ..rec(window, chunk, gbs.map(|g| g * k))
        })
        .collect()
}

pub fn report(fail: bool) -> RunReport {
    let mut records = Vec::new();
    for (i, w) in [16u32, 32, 64].into_iter().enumerate() {
        for (j, c) in [256u64 << 10, 1 << 20].into_iter().enumerate() {
            let v = (w != 64).then_some(1.0 + i as f64 + 0.5 * j as f64);
            records.extend(reps(w, c, v));
        }
    }
    let chart =
        |id: &str, kind, x: Option<&str>, y: Option<&str>, series: Option<&str>| ChartSpec {
            id: id.into(),
            title: format!("{id} title"),
            kind,
            metric: "server_gbs".into(),
            x: x.map(String::from),
            y: y.map(String::from),
            series: series.map(String::from),
            experiments: vec![],
            phase: Some("sweep".into()),
        };
    RunReport {
        plan: "demo".into(),
        plan_path: "plans/demo.rhai".into(),
        stamp: "20261122T000000Z".into(),
        started_utc: "2026-11-22T00:00:00Z".into(),
        finished_utc: "2026-11-22T00:01:00Z".into(),
        platform: "loopback".into(),
        targets: "loopback".into(),
        setup: BTreeMap::from([("follower".to_string(), "in-process".to_string())]),
        phases: vec![PhaseInfo {
            name: "sweep".into(),
            description: "window x chunk".into(),
        }],
        records,
        samples: vec![SampleRecord {
            experiment: "w16-c262144".into(),
            t_s: 0.5,
            source: "cpu".into(),
            subject: "cpu0".into(),
            metric: "busy_pct".into(),
            value: 12.5,
        }],
        criteria: vec![
            CriterionResult {
                phase: "sweep".into(),
                actual: Some(3.5),
                threshold: Some(1.0),
                ci95_lo: Some(3.43),
                ci95_hi: Some(3.57),
                n: Some(3),
                ..CriterionResult::plain(
                    "server > 1 GB/s",
                    if fail { Verdict::Fail } else { Verdict::Pass },
                    "best".into(),
                )
            },
            CriterionResult {
                phase: "sweep".into(),
                actual: Some(0.02),
                threshold: Some(0.2),
                ci95_lo: Some(-0.1),
                ci95_hi: Some(0.3),
                n: Some(3),
                reps_to_settle: Some(12),
                ..CriterionResult::plain("gain >= 20%", Verdict::Inconclusive, String::new())
            },
        ],
        decisions: vec![DecisionRecord {
            phase: "sweep".into(),
            name: "Decision Point 1".into(),
            question: "did it help?".into(),
            answer: Some(true),
            branch_taken: "continue".into(),
            branch_not_taken: "skip".into(),
            detail: String::new(),
        }],
        charts: vec![
            chart("bars", ChartKind::Bar, None, None, None),
            chart(
                "lines",
                ChartKind::Line,
                Some("window"),
                None,
                Some("chunk"),
            ),
            chart(
                "heat",
                ChartKind::Heatmap,
                Some("chunk"),
                Some("window"),
                None,
            ),
        ],
        notes: vec!["a note".into()],
        completion: Completion::Complete,
        rankings: vec![Ranking {
            phase: "sweep".into(),
            metric: "server_gbs".into(),
            best: "window=32 chunk=1024K".into(),
            tied: vec!["window=32 chunk=256K".into()],
            identical: vec![],
            ranked: true,
            noise: 0.05,
            text: "best server_gbs: window=32 chunk=1024K, tied within noise with window=32 chunk=256K".into(),
            candidates: vec![],
            method: String::new(),
        }],
        noise: Some(NoiseInfo {
            floor: 0.05,
            measured: Some(0.03),
            used: 0.05,
            detail: String::new(),
            runs: vec![],
            source: String::new(),
        }),
        sequential: vec![],
        summaries: vec![],
    }
}
