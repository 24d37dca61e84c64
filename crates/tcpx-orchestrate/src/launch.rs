//! Launcher environments (Slurm, torchrun, Open MPI/PMI, JobSet): who leads, who follows.

/// Rank and leader as a launcher describes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub rank: u32,
    /// Leader host, when the launcher says.
    pub leader: Option<String>,
    /// Which launcher: `slurm`, `torchrun`, `openmpi`, `pmi`, `jobset`.
    pub source: &'static str,
}

/// First host of a Slurm node list: `a3-[001-002,7],b` -> `a3-001`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut depth = 0;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let first = &list[..end];
    match first.find('[') {
        None => Some(first.to_string()),
        Some(i) => {
            let inner = first[i + 1..].trim_end_matches(']');
            let item = inner.split(',').next()?;
            let start = item.split('-').next()?;
            Some(format!("{}{}", &first[..i], start))
        }
    }
}

/// Reads rank and leader from a launcher's environment (`get` is `std::env::var` in use).
/// `TCPX_LEADER` overrides the leader host of any launcher.
pub fn launch_from_env(get: impl Fn(&str) -> Option<String>) -> Option<Launch> {
    let num = |k: &str| get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let explicit = get("TCPX_LEADER").filter(|s| !s.is_empty());
    let (rank, mut leader, source) = if let Some(r) = num("SLURM_PROCID") {
        let nodes = get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"));
        (r, nodes.as_deref().and_then(first_slurm_host), "slurm")
    } else if let (Some(r), Some(_)) = (num("RANK"), get("MASTER_ADDR")) {
        (r, get("MASTER_ADDR"), "torchrun")
    } else if let Some(r) = num("OMPI_COMM_WORLD_RANK") {
        (r, get("MASTER_ADDR"), "openmpi")
    } else if let Some(r) = num("PMI_RANK") {
        (r, get("MASTER_ADDR"), "pmi")
    } else if let Some(r) = num("JOB_COMPLETION_INDEX") {
        (r, get("MASTER_ADDR"), "jobset")
    } else {
        return None;
    };
    if explicit.is_some() {
        leader = explicit;
    }
    Some(Launch {
        rank,
        leader,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launchers_give_rank_and_leader() {
        let l = launch_from_env(env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_JOB_NODELIST", "a3-[007-008]"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (1, Some("a3-007"), "slurm")
        );
        let l = launch_from_env(env(&[("RANK", "0"), ("MASTER_ADDR", "10.0.0.2")])).unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (0, Some("10.0.0.2"), "torchrun")
        );
        let l = launch_from_env(env(&[("OMPI_COMM_WORLD_RANK", "1")])).unwrap();
        assert_eq!((l.rank, l.leader, l.source), (1, None, "openmpi"));
        let l = launch_from_env(env(&[("PMI_RANK", "0"), ("TCPX_LEADER", "h0")])).unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (0, Some("h0"), "pmi")
        );
        let l = launch_from_env(env(&[
            ("JOB_COMPLETION_INDEX", "1"),
            ("MASTER_ADDR", "js-0"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.leader.as_deref(), l.source),
            (1, Some("js-0"), "jobset")
        );
        assert_eq!(launch_from_env(env(&[("RANK", "x")])), None);
        assert_eq!(launch_from_env(env(&[])), None);
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_slurm_host("n1,n2").as_deref(), Some("n1"));
        assert_eq!(
            first_slurm_host("gpu-[01-04,07],cpu1").as_deref(),
            Some("gpu-01")
        );
        assert_eq!(first_slurm_host("a3-[9,10]").as_deref(), Some("a3-9"));
        assert_eq!(first_slurm_host(""), None);
    }
}
