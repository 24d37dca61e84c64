//! nccl-tests tables: a commented header with the settings, one row per size with the
//! receiver's figures in nccl-tests' column positions (size count type redop root time algbw
//! busbw #wrong), extras after them, and nccl-tests' footer.

use crate::{format_size, Experiment, Measurement};

/// The header's chunk and window lines: what each size runs with and, where the automatic rule
/// chose, from what (`# 256M: chunk 4M, window 32 (auto: 16 sockets, 256M message, host
/// memory)`); sizes that run alike share one line (`# 1M..64M: ...`), at most 8 lines.
pub fn transfer_lines(exp: &Experiment) -> String {
    // Runs of consecutive sizes with the same chunk and window.
    let mut runs: Vec<(u64, u64, (u64, u32))> = Vec::new();
    for &size in &exp.sizes {
        let key = (exp.chunk_for(size), exp.window_for(size));
        match runs.last_mut() {
            Some((_, last, k)) if *k == key => *last = size,
            _ => runs.push((size, size, key)),
        }
    }
    let mut out = String::new();
    let shown = runs.len().min(8);
    for &(first, last, _) in &runs[..shown] {
        let sizes = if first == last {
            format_size(first)
        } else {
            format!("{}..{}", format_size(first), format_size(last))
        };
        out.push_str(&format!("# {sizes}: {}\n", exp.transfer_text(last)));
    }
    if runs.len() > shown {
        out.push_str(&format!(
            "# ... {} more size groups, each with its own chunk and window\n",
            runs.len() - shown
        ));
    }
    out
}

/// The `#` lines above the table: settings and column names.
pub fn header(exp: &Experiment, role: &str, peer: &str) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# tcpx-run bench '{}'  role {role}  peer {peer}\n",
        exp.name
    ));
    s.push_str(&format!(
        "# transport {}  memory {}  flows {}  channels {}  socks/channel {}\n",
        exp.transport, exp.memory, exp.flows, exp.channels, exp.socks_per_channel
    ));
    s.push_str(&transfer_lines(exp));
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
    s.push_str(
        "#  columns 1-9 as nccl-tests (receiver's figures: what arrived); after #wrong: receiver p50/p99, sender time/algbw\n",
    );
    s.push_str(&format!(
        "#{:>12} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "p50",
        "p99",
        "s_time",
        "s_algbw"
    ));
    s.push_str(&format!(
        "#{:>12} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(us)",
        "(us)",
        "(GB/s)"
    ));
    s
}

/// One row per size in nccl-tests' column order: the receiver's time, algbw, busbw and wrong
/// bytes in columns 6 to 9, then the extras.
fn row(m: &Measurement) -> String {
    let r = &m.recv;
    let wrong = r
        .wrong_bytes
        .map_or_else(|| "N/A".to_string(), |w| w.to_string());
    format!(
        " {:>12} {:>12} {:>8} {:>6} {:>6} {:>10.1} {:>8.2} {:>8.2} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>8.2}",
        m.size,
        m.size,
        "uint8",
        "none",
        -1,
        r.avg_us,
        r.algbw_gbs,
        r.busbw_gbs,
        wrong,
        r.p50_us,
        r.p99_us,
        m.send.avg_us,
        m.send.algbw_gbs
    )
}

/// The row of one measurement, then `#` lines for per-flow figures, pinning and CPU cost where
/// the experiment asked for them, and the socket spread ([`crate::sockets::line`]) where the
/// backend counted two or more sockets.
pub fn rows(m: &Measurement) -> String {
    let mut out = row(m);
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
    // Stragglers: the receiver's per-socket figures (each socket's bytes are the same on both
    // ends once a size is over), the sender's where the receiver has none.
    let spread = [&m.recv, &m.send]
        .into_iter()
        .find_map(|s| s.socket_spread.as_ref().map(|sp| (s.side, sp)));
    if let Some((side, sp)) = spread {
        out.push('\n');
        out.push_str(&crate::sockets::line(side.as_str(), sp));
    }
    for s in [&m.send, &m.recv] {
        if let Some(c) = &s.socket_calls {
            out.push('\n');
            out.push_str(&crate::sockets::calls_line(s.side.as_str(), c));
        }
    }
    out
}

/// nccl-tests' footer (`# Out of bounds values`, `# Avg bus bandwidth    : X`, over the
/// receiver's rows) and the total of wrong bytes.
pub fn footer(ms: &[Measurement]) -> String {
    let wrong: u64 = ms.iter().filter_map(|m| m.recv.wrong_bytes).sum();
    let checked = ms.iter().any(|m| m.recv.wrong_bytes.is_some());
    let avg = if ms.is_empty() {
        0.0
    } else {
        ms.iter().map(|m| m.recv.busbw_gbs).sum::<f64>() / ms.len() as f64
    };
    let oob = match (checked, wrong) {
        (false, _) => "N/A (verify off)".to_string(),
        (true, 0) => "0 OK".to_string(),
        (true, w) => format!("{w} FAILED"),
    };
    format!(
        "# Out of bounds values : {oob}\n# Avg bus bandwidth    : {avg:.3} \n#\n# Wrong bytes : {}",
        if checked {
            wrong.to_string()
        } else {
            "not checked".into()
        }
    )
}

/// Who produced a result and where: the head of a `--json` document.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    pub tool: String,
    /// Package version and git commit.
    pub version: String,
    pub host: String,
    /// UTC, ISO 8601.
    pub timestamp: String,
    pub timestamp_unix: u64,
    pub role: String,
    pub peer: String,
}

/// One JSON document for a whole bench run, iperf3 `-J` style: `start` (who, where, when, the
/// experiment), `measurements` (every figure of every size, both sides), `end` (what the
/// footer says).
pub fn json_document(
    info: &RunInfo,
    exp: &Experiment,
    measurements: &[Measurement],
    nic_plan: Option<String>,
) -> serde_json::Value {
    let wrong: Option<u64> = measurements
        .iter()
        .any(|m| m.recv.wrong_bytes.is_some())
        .then(|| measurements.iter().filter_map(|m| m.recv.wrong_bytes).sum());
    let avg = if measurements.is_empty() {
        0.0
    } else {
        measurements.iter().map(|m| m.recv.busbw_gbs).sum::<f64>() / measurements.len() as f64
    };
    serde_json::json!({
        "start": {
            "tool": info.tool,
            "version": info.version,
            "host": info.host,
            "timestamp": info.timestamp,
            "timestamp_unix": info.timestamp_unix,
            "role": info.role,
            "peer": info.peer,
            "experiment": exp,
            // Each size's chunk and window, and where they came from (the header's lines).
            "transfer": exp
                .sizes
                .iter()
                .map(|&size| serde_json::json!({
                    "size": size,
                    "chunk": exp.chunk_for(size),
                    "window": exp.window_for(size),
                    "chosen": exp.transfer_text(size),
                }))
                .collect::<Vec<_>>(),
            "units": "GB/s = 1e9 bytes/s; times in microseconds; recv = receiver (what arrived)",
        },
        "measurements": measurements,
        "end": {
            "avg_busbw_gbs": avg,
            "wrong_bytes": wrong,
            "nic_plan": nic_plan,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Side, SideResult};

    /// The header says per size what the automatic rule chose and from what, groups sizes that
    /// run alike, names a given chunk or window as given, and the --json start says the same.
    #[test]
    fn the_header_says_what_auto_chose_and_why() {
        let exp = Experiment {
            channels: 1,
            socks_per_channel: 16,
            sizes: vec![1 << 20, 16 << 20, 256 << 20, 512 << 20],
            ..Experiment::default()
        };
        let h = header(&exp, "local", "loopback");
        assert!(
            h.contains("# 1M: chunk 512K, window 32 (auto: 16 sockets, 1M message, host memory)\n"),
            "{h}"
        );
        assert!(
            h.contains("# 16M: chunk 1M, window 32 (auto: 16 sockets, 16M message, host memory)\n"),
            "{h}"
        );
        assert!(
            h.contains(
                "# 256M..512M: chunk 4M, window 32 (auto: 16 sockets, 512M message, host memory)\n"
            ),
            "{h}"
        );
        let given = Experiment {
            chunk: Some(8 << 20),
            window: Some(4),
            sizes: vec![256 << 20],
            ..exp.clone()
        };
        assert!(
            header(&given, "local", "loopback").contains("# 256M: chunk 8M, window 4 (given)\n")
        );
        let gpu = Experiment {
            memory: tcpx_model::Memory::Cuda,
            sizes: vec![256 << 20],
            ..exp
        };
        assert!(header(&gpu, "local", "loopback").contains(
            "# 256M: chunk 16M, window 32 (auto: 16 sockets, 256M message, GPU memory staged through host)"
        ));
        let info = RunInfo {
            tool: "t".into(),
            version: "v".into(),
            host: "h".into(),
            timestamp: "0".into(),
            timestamp_unix: 0,
            role: "local".into(),
            peer: "p".into(),
        };
        let doc = json_document(&info, &gpu, &[], None);
        assert_eq!(doc["start"]["transfer"][0]["chunk"], 16 << 20);
        assert_eq!(doc["start"]["transfer"][0]["window"], 32);
    }

    #[test]
    fn rows_line_up_with_the_header() {
        let exp = Experiment::default();
        let send = SideResult::of_times(Side::Send, vec![0.001]);
        let recv = SideResult {
            wrong_bytes: Some(3),
            ..SideResult::of_times(Side::Recv, vec![0.002])
        }
        .summarise(1 << 20);
        let send = send.summarise(1 << 20);
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
        // Fields as awk numbers them ($1 = size ... $9 = #wrong): the receiver's figures.
        let row = rows(&m);
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f.len(), 13, "{row}");
        assert_eq!(&f[..5], ["1048576", "1048576", "uint8", "none", "-1"]);
        assert_eq!(
            f[5], "2000.0",
            "time is the receiver's (2 ms), not the sender's"
        );
        assert_eq!(f[8], "3", "#wrong");
        assert_eq!(f[11], "1000.0", "sender's time after #wrong");
        let names: Vec<&str> = h.lines().rev().nth(1).unwrap()[1..]
            .split_whitespace()
            .collect();
        assert_eq!(
            &names[..9],
            ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"]
        );
        let foot = footer(&[m]);
        assert!(foot.contains("# Out of bounds values : 3 FAILED"), "{foot}");
        assert!(foot.contains("# Avg bus bandwidth    : 0.524"), "{foot}");
        assert!(foot.contains("Wrong bytes : 3"), "{foot}");
    }
}
