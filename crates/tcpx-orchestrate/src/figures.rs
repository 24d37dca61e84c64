//! Per-flow and per-node figures of a run, the same table for single- and multi-process runs.

use tcpx_bench::Measurement;

use crate::supervise::ChildResult;

/// One flow's figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowFigure {
    pub flow: u32,
    pub send_gbs: f64,
    pub recv_gbs: f64,
    pub wrong_bytes: Option<u64>,
}

/// Per-flow and per-node figures for one size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeFigures {
    pub size: u64,
    pub per_flow: Vec<FlowFigure>,
    /// Node send GB/s: all flows' bytes over the node (single process: over the slowest flow's
    /// time; multi-process: sum of the flows' own GB/s, as the processes are not in lockstep).
    pub node_send_gbs: f64,
    pub node_recv_gbs: f64,
    pub wrong_bytes: Option<u64>,
}

fn sum_wrong(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.fold(None, |acc, w| match (acc, w) {
        (None, w) => w,
        (a, None) => a,
        (Some(a), Some(b)) => Some(a + b),
    })
}

/// Figures of a multi-process run: one result per flow (for a `local` run where both sides are
/// children, each flow's first child counts; both sides agree on the figures).
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
            let per_flow: Vec<FlowFigure> = by_flow
                .iter()
                .filter_map(|c| {
                    c.measurements
                        .iter()
                        .find(|m| m.size == size)
                        .map(|m| (c, m))
                })
                .map(|(c, m)| FlowFigure {
                    flow: c.flow,
                    send_gbs: m.send.algbw_gbs,
                    recv_gbs: m.recv.algbw_gbs,
                    wrong_bytes: m.recv.wrong_bytes,
                })
                .collect();
            SizeFigures {
                size,
                node_send_gbs: per_flow.iter().map(|f| f.send_gbs).sum(),
                node_recv_gbs: per_flow.iter().map(|f| f.recv_gbs).sum(),
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
            side,
            iter_secs: vec![secs],
            wrong_bytes: wrong,
            pinning: None,
            cpu: None,
            flow_iter_secs: vec![vec![secs]],
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
    }
}
