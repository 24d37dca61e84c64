//! Per-flow and per-node figures of a run, the same table for single- and multi-process runs.

use tcpx_bench::{covered_ns, Measurement, MonoSpan, SideSummary};

use crate::supervise::ChildResult;

/// One flow's figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowFigure {
    pub flow: u32,
    pub send_gbs: f64,
    pub recv_gbs: f64,
    pub wrong_bytes: Option<u64>,
}

/// How a node figure was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeBasis {
    /// All flows' bytes over the slowest flow's time per iteration (one process runs the flows
    /// in lockstep).
    Lockstep,
    /// All flows' bytes over the wall-clock time at least one flow was transferring (the
    /// processes' iteration spans on CLOCK_MONOTONIC): flows that did not overlap in time count
    /// one after the other, so the node never reads more than its NICs carried.
    WallClock,
    /// The flows' own GB/s summed: results without iteration spans (older versions). Flows that
    /// did not overlap in time sum to more than the node moved.
    SummedFlows,
}

impl NodeBasis {
    /// How the node line of a table was computed, in words.
    pub fn describe(self) -> &'static str {
        match self {
            NodeBasis::Lockstep => "node: all flows' bytes over the slowest flow's time",
            NodeBasis::WallClock => {
                "node: all flows' bytes over the wall-clock time any flow was transferring"
            }
            NodeBasis::SummedFlows => {
                "node: the flows' GB/s summed (no iteration timestamps: an upper bound when flows did not overlap)"
            }
        }
    }
}

/// Per-flow and per-node figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeFigures {
    pub size: u64,
    pub per_flow: Vec<FlowFigure>,
    /// Node send GB/s: all flows' bytes over the node's time, as [`SizeFigures::node_basis`]
    /// says.
    pub node_send_gbs: f64,
    pub node_recv_gbs: f64,
    pub node_basis: NodeBasis,
    pub wrong_bytes: Option<u64>,
}

fn sum_wrong(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.fold(None, |acc, w| match (acc, w) {
        (None, w) => w,
        (a, None) => a,
        (Some(a), Some(b)) => Some(a + b),
    })
}

/// One side's node GB/s over the wall-clock time its flows were transferring: every flow's
/// bytes (`size` per timed iteration) over the time covered by at least one iteration span;
/// `None` when a flow has no spans.
fn wall_clock_gbs(size: u64, sides: &[&SideSummary]) -> Option<f64> {
    if sides.is_empty() || sides.iter().any(|s| s.iter_spans.is_empty()) {
        return None;
    }
    let bytes: u64 = sides.iter().map(|s| size * s.iter_spans.len() as u64).sum();
    let spans: Vec<MonoSpan> = sides.iter().flat_map(|s| s.iter_spans.clone()).collect();
    let ns = covered_ns(&spans);
    // Bytes per nanosecond are GB/s (1e9 B/s).
    Some(if ns > 0 {
        bytes as f64 / ns as f64
    } else {
        0.0
    })
}

/// Figures of a multi-process run: one result per flow (for a `local` run where both sides are
/// children, each flow's first child counts; both sides agree on the figures). The node figure
/// is wall-clock ([`NodeBasis::WallClock`]) when every flow reported its iteration spans, the
/// flows' GB/s summed otherwise ([`NodeBasis::SummedFlows`]).
pub fn aggregate(children: &[ChildResult]) -> Vec<SizeFigures> {
    let mut by_flow: Vec<&ChildResult> = Vec::new();
    for c in children {
        if !by_flow.iter().any(|b| b.flow == c.flow) {
            by_flow.push(c);
        }
    }
    by_flow.sort_by_key(|c| c.flow);
    let sizes: Vec<u64> = by_flow
        .first()
        .map(|c| c.measurements.iter().map(|m| m.size).collect())
        .unwrap_or_default();
    sizes
        .iter()
        .map(|&size| {
            let found: Vec<(&ChildResult, &Measurement)> = by_flow
                .iter()
                .filter_map(|c| {
                    c.measurements
                        .iter()
                        .find(|m| m.size == size)
                        .map(|m| (*c, m))
                })
                .collect();
            let per_flow: Vec<FlowFigure> = found
                .iter()
                .map(|(c, m)| FlowFigure {
                    flow: c.flow,
                    send_gbs: m.send.algbw_gbs,
                    recv_gbs: m.recv.algbw_gbs,
                    wrong_bytes: m.recv.wrong_bytes,
                })
                .collect();
            let sends: Vec<&SideSummary> = found.iter().map(|(_, m)| &m.send).collect();
            let recvs: Vec<&SideSummary> = found.iter().map(|(_, m)| &m.recv).collect();
            let (node_send_gbs, node_recv_gbs, node_basis) =
                match (wall_clock_gbs(size, &sends), wall_clock_gbs(size, &recvs)) {
                    (Some(s), Some(r)) => (s, r, NodeBasis::WallClock),
                    _ => (
                        per_flow.iter().map(|f| f.send_gbs).sum(),
                        per_flow.iter().map(|f| f.recv_gbs).sum(),
                        NodeBasis::SummedFlows,
                    ),
                };
            SizeFigures {
                size,
                node_send_gbs,
                node_recv_gbs,
                node_basis,
                wrong_bytes: sum_wrong(per_flow.iter().map(|f| f.wrong_bytes)),
                per_flow,
            }
        })
        .collect()
}

/// The same figures from a single-process run's measurements (per-flow from `flow_gbs`).
pub fn single_process_figures(ms: &[Measurement]) -> Vec<SizeFigures> {
    ms.iter()
        .map(|m| SizeFigures {
            size: m.size,
            per_flow: m
                .send
                .flow_gbs
                .iter()
                .zip(&m.recv.flow_gbs)
                .enumerate()
                .map(|(k, (&s, &r))| FlowFigure {
                    flow: m.experiment.flow_id(k as u32),
                    send_gbs: s,
                    recv_gbs: r,
                    // The receiver counts wrong bytes over all its flows together.
                    wrong_bytes: None,
                })
                .collect(),
            node_send_gbs: m.send.algbw_gbs,
            node_recv_gbs: m.recv.algbw_gbs,
            node_basis: NodeBasis::Lockstep,
            wrong_bytes: m.recv.wrong_bytes,
        })
        .collect()
}

/// A `#`-commented table: one line per size and flow, then the node's line.
pub fn figures_table(mode: &str, figs: &[SizeFigures]) -> String {
    let mut s = format!(
        "# per-GPU and per-node bandwidth ({mode}; GB/s = 1e9 B/s)\n#{:>12} {:>6} {:>10} {:>10} {:>8}",
        "size", "flow", "send", "recv", "#wrong"
    );
    let mut bases: Vec<NodeBasis> = Vec::new();
    for f in figs {
        if !bases.contains(&f.node_basis) {
            bases.push(f.node_basis);
            s.push_str(&format!("\n# {}", f.node_basis.describe()));
        }
    }
    let wrong = |w: Option<u64>| w.map_or_else(|| "-".to_string(), |w| w.to_string());
    for f in figs {
        for p in &f.per_flow {
            s.push_str(&format!(
                "\n#{:>12} {:>6} {:>10.2} {:>10.2} {:>8}",
                f.size,
                p.flow,
                p.send_gbs,
                p.recv_gbs,
                wrong(p.wrong_bytes)
            ));
        }
        s.push_str(&format!(
            "\n#{:>12} {:>6} {:>10.2} {:>10.2} {:>8}",
            f.size,
            "node",
            f.node_send_gbs,
            f.node_recv_gbs,
            wrong(f.wrong_bytes)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_bench::{Experiment, Side, SideResult};

    fn measured(flow: u32, secs: f64) -> Measurement {
        let exp = Experiment {
            flows: 2,
            flow_index: Some(flow),
            ..Experiment::default()
        };
        let side = |side, wrong| SideResult {
            wrong_bytes: wrong,
            flow_iter_secs: vec![vec![secs]],
            ..SideResult::of_times(side, vec![secs])
        };
        Measurement {
            experiment: exp,
            size: 1_000_000_000,
            chunk: 1 << 19,
            send: side(Side::Send, None).summarise(1_000_000_000),
            recv: side(Side::Recv, Some(flow.into())).summarise(1_000_000_000),
        }
    }

    #[test]
    fn node_figures_sum_the_flows_and_keep_one_result_per_flow() {
        let child = |flow, role: &str, secs| ChildResult {
            flow,
            role: role.into(),
            pid: 1,
            measurements: vec![measured(flow, secs)],
            nic_plan: None,
        };
        // Flow 1 listed first, and flow 0 twice (both sides of a local run).
        let figs = aggregate(&[
            child(1, "server", 0.5),
            child(0, "server", 0.25),
            child(0, "client", 0.25),
        ]);
        assert_eq!(figs.len(), 1);
        let f = &figs[0];
        assert_eq!(
            f.per_flow.iter().map(|p| p.flow).collect::<Vec<_>>(),
            [0, 1]
        );
        assert!((f.per_flow[0].recv_gbs - 4.0).abs() < 1e-9);
        assert!((f.node_recv_gbs - 6.0).abs() < 1e-9, "4 + 2 GB/s");
        assert_eq!(f.wrong_bytes, Some(1), "flow 1 reported one wrong byte");
        let table = figures_table("multi-process", &figs);
        assert!(table.contains("node") && table.contains("6.00"), "{table}");
        assert_eq!(
            f.node_basis,
            NodeBasis::SummedFlows,
            "no spans: the old sum"
        );
        assert!(
            table.contains("GB/s summed (no iteration timestamps"),
            "{table}"
        );
    }

    /// A flow's result for `size` bytes per iteration with one iteration at each of `spans`
    /// (nanoseconds), on both sides.
    fn spanned(flow: u32, size: u64, spans: &[(u64, u64)]) -> ChildResult {
        let spans: Vec<MonoSpan> = spans
            .iter()
            .map(|&(a, b)| MonoSpan {
                start_ns: a,
                end_ns: b,
            })
            .collect();
        let side = |side| SideResult {
            iter_spans: spans.clone(),
            ..SideResult::of_times(
                side,
                spans
                    .iter()
                    .map(|s| (s.end_ns - s.start_ns) as f64 / 1e9)
                    .collect(),
            )
        };
        ChildResult {
            flow,
            role: "client".into(),
            pid: 1,
            measurements: vec![Measurement {
                experiment: Experiment {
                    flows: 2,
                    flow_index: Some(flow),
                    multi_process: true,
                    ..Experiment::default()
                },
                size,
                chunk: 1 << 19,
                send: side(Side::Send).summarise(size),
                recv: side(Side::Recv).summarise(size),
            }],
            nic_plan: None,
        }
    }

    #[test]
    fn flows_that_did_not_overlap_in_time_do_not_add_up_beyond_the_nic() {
        // The fabric case: two processes over one 0.25 GB/s NIC, each moving 1 MB in 4 ms
        // (0.25 GB/s), one after the other. Summed they read 0.5 GB/s, twice what the NIC
        // carries; over the wall clock the node moved 2 MB in 8 ms.
        let mb = 1_000_000;
        let figs = aggregate(&[
            spanned(0, mb, &[(0, 4_000_000)]),
            spanned(1, mb, &[(4_000_000, 8_000_000)]),
        ]);
        let f = &figs[0];
        assert!((f.per_flow[0].recv_gbs - 0.25).abs() < 1e-9);
        assert!((f.per_flow[1].recv_gbs - 0.25).abs() < 1e-9);
        assert_eq!(f.node_basis, NodeBasis::WallClock);
        assert!((f.node_recv_gbs - 0.25).abs() < 1e-9, "{}", f.node_recv_gbs);
        assert!((f.node_send_gbs - 0.25).abs() < 1e-9, "{}", f.node_send_gbs);
        let table = figures_table("multi-process", &figs);
        assert!(table.contains("wall-clock time any flow"), "{table}");
    }

    #[test]
    fn overlapping_flows_add_up_and_gaps_between_iterations_do_not_count() {
        let mb = 1_000_000;
        // Side by side over two NICs: 2 MB in the same 4 ms, 0.5 GB/s.
        let both = aggregate(&[
            spanned(0, mb, &[(0, 4_000_000)]),
            spanned(1, mb, &[(0, 4_000_000)]),
        ]);
        assert!((both[0].node_recv_gbs - 0.5).abs() < 1e-9);
        // Half overlapping: 2 MB over the 6 ms at least one was moving.
        let half = aggregate(&[
            spanned(0, mb, &[(0, 4_000_000)]),
            spanned(1, mb, &[(2_000_000, 6_000_000)]),
        ]);
        assert!((half[0].node_recv_gbs - 2.0 / 6.0).abs() < 1e-9);
        // Two iterations each with a 10 ms pause (barrier, verification) between them, both
        // flows together: 4 MB over 8 ms of transfers, the pause not counted.
        let paused = aggregate(&[
            spanned(0, mb, &[(0, 4_000_000), (14_000_000, 18_000_000)]),
            spanned(1, mb, &[(0, 4_000_000), (14_000_000, 18_000_000)]),
        ]);
        assert!((paused[0].node_recv_gbs - 0.5).abs() < 1e-9);
        // One flow without spans (an older child): the sum, labelled.
        let mut old = spanned(1, mb, &[(4_000_000, 8_000_000)]);
        old.measurements[0].recv.iter_spans.clear();
        let mixed = aggregate(&[spanned(0, mb, &[(0, 4_000_000)]), old]);
        assert_eq!(mixed[0].node_basis, NodeBasis::SummedFlows);
        assert!((mixed[0].node_recv_gbs - 0.5).abs() < 1e-9);
    }

    #[test]
    fn spans_survive_the_child_report_and_old_reports_read_without_them() {
        let r = crate::ChildReport {
            measurements: spanned(0, 1000, &[(5, 9)]).measurements,
            ..crate::ChildReport::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        let back: crate::ChildReport = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.measurements[0].recv.iter_spans,
            [MonoSpan {
                start_ns: 5,
                end_ns: 9
            }]
        );
        // A report of a version before spans: the field is absent, and reads as empty.
        let old = text.replace(r#","iter_spans":[{"start_ns":5,"end_ns":9}]"#, "");
        assert!(!old.contains("iter_spans"), "{old}");
        let back: crate::ChildReport = serde_json::from_str(&old).unwrap();
        assert!(back.measurements[0].send.iter_spans.is_empty());
        assert_eq!(
            aggregate(&[ChildResult {
                flow: 0,
                role: "client".into(),
                pid: 1,
                measurements: back.measurements,
                nic_plan: None,
            }])[0]
                .node_basis,
            NodeBasis::SummedFlows
        );
    }
}
