//! nccl-tests style tables: a commented header with the settings, one row per size and side.

use crate::{format_size, Experiment, Measurement, SideSummary};

/// The `#` lines above the table: settings and column names.
pub fn header(exp: &Experiment, role: &str, peer: &str) -> String {
    let chunk = exp
        .chunk
        .map_or_else(|| "auto(<=512K)".to_string(), format_size);
    let mut s = String::new();
    s.push_str(&format!(
        "# tcpx-run bench '{}'  role {role}  peer {peer}\n",
        exp.name
    ));
    s.push_str(&format!(
        "# transport {}  memory {}  flows {}  channels {}  socks/channel {}  chunk {chunk}  window {}\n",
        exp.transport, exp.memory, exp.flows, exp.channels, exp.socks_per_channel, exp.window
    ));
    if !exp.nics.is_empty() {
        s.push_str(&format!(
            "# nics {}  policy {}\n",
            exp.nics.join(","),
            exp.nic_policy
        ));
    }
    if let Some(i) = exp.flow_index {
        s.push_str(&format!(
            "# process of flow {i} of {} (multi-process)\n",
            exp.flows
        ));
    }
    s.push_str(&format!(
        "# warmup {}  iters {}  verify {}  (GB/s = 1e9 bytes/s over all flows; busbw = algbw for send/recv)\n#\n",
        exp.warmup,
        exp.iters,
        if exp.verify { "on" } else { "off" }
    ));
    s.push_str(&format!(
        "#{:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "side",
        "time",
        "p50",
        "p99",
        "algbw",
        "busbw",
        "#wrong"
    ));
    s.push_str(&format!(
        "#{:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", ""
    ));
    s
}

fn row(size: u64, s: &SideSummary) -> String {
    let wrong = s
        .wrong_bytes
        .map_or_else(|| "N/A".to_string(), |w| w.to_string());
    format!(
        " {:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>8.2} {:>7}",
        size,
        size,
        "uint8",
        "none",
        -1,
        s.side.as_str(),
        s.avg_us,
        s.p50_us,
        s.p99_us,
        s.algbw_gbs,
        s.busbw_gbs,
        wrong
    )
}

/// The two rows (send, then recv) of one measurement, then `#` lines for pinning and CPU cost
/// where the experiment asked for them.
pub fn rows(m: &Measurement) -> String {
    let mut out = format!("{}\n{}", row(m.size, &m.send), row(m.size, &m.recv));
    for s in [&m.send, &m.recv] {
        // Per-GPU figures where there is more than one flow, or this process is one of several.
        if s.flow_gbs.len() > 1 || m.experiment.flow_index.is_some() {
            let per: Vec<String> = s
                .flow_gbs
                .iter()
                .enumerate()
                .map(|(k, g)| format!("flow {} {g:.2}", m.experiment.flow_id(k as u32)))
                .collect();
            out.push_str(&format!(
                "\n#   {} per-flow GB/s: {}",
                s.side.as_str(),
                per.join(", ")
            ));
        }
        if let Some(p) = &s.pinning {
            let verdict = if p.expected == p.actual {
                "ok"
            } else {
                "MISMATCH"
            };
            out.push_str(&format!(
                "\n#   {} threads pinned: expected cpus {}, actual {} ({verdict})",
                s.side.as_str(),
                p.expected,
                p.actual
            ));
        }
        if let Some(c) = &s.cpu {
            let per_gb = c
                .cpu_s_per_gb
                .map_or_else(|| "n/a".to_string(), |v| format!("{v:.3}"));
            let hot = if c.hot_cores.is_empty() {
                "none".to_string()
            } else {
                c.hot_cores
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            out.push_str(&format!(
                "\n#   {} cpu: {per_gb} CPU-s/GB (process), machine busy {:.0}%, softirq {:.0}% of busy, hot cores {hot}, retrans {}",
                s.side.as_str(),
                c.busy_pct,
                c.softirq_share_pct,
                c.retrans_pct.map_or_else(|| "n/a".to_string(), |r| format!("{r:.3}%"))
            ));
        }
    }
    out
}

/// Sum of wrong bytes over all rows, as nccl-tests prints `# Out of bounds values`.
pub fn footer(ms: &[Measurement]) -> String {
    let wrong: u64 = ms.iter().filter_map(|m| m.recv.wrong_bytes).sum();
    let checked = ms.iter().any(|m| m.recv.wrong_bytes.is_some());
    let avg = if ms.is_empty() {
        0.0
    } else {
        ms.iter().map(|m| m.recv.busbw_gbs).sum::<f64>() / ms.len() as f64
    };
    format!(
        "# Wrong bytes : {}\n# Avg bus bandwidth (recv) : {avg:.3} GB/s",
        if checked {
            wrong.to_string()
        } else {
            "not checked".into()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Side, SideResult};

    #[test]
    fn rows_line_up_with_the_header() {
        let exp = Experiment::default();
        let send = SideResult {
            side: Side::Send,
            iter_secs: vec![0.001],
            wrong_bytes: None,
            pinning: None,
            cpu: None,
            flow_iter_secs: vec![],
        }
        .summarise(1 << 20);
        let recv = SideResult {
            side: Side::Recv,
            iter_secs: vec![0.002],
            wrong_bytes: Some(3),
            pinning: None,
            cpu: None,
            flow_iter_secs: vec![],
        }
        .summarise(1 << 20);
        let m = Measurement {
            experiment: exp.clone(),
            size: 1 << 20,
            chunk: 1 << 19,
            send,
            recv,
        };
        let h = header(&exp, "local", "127.0.0.1:1");
        let cols = h.lines().last().unwrap().len();
        for r in rows(&m).lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(r.len(), cols, "row width equals header width:\n{h}\n{r}");
        }
        assert!(
            rows(&m).contains("N/A") && rows(&m).lines().nth(1).unwrap().trim_end().ends_with('3')
        );
        assert!(footer(&[m]).contains("Wrong bytes : 3"));
    }
}
