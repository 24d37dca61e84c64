//! The GPU link view of `tcpx-run topo`: how the running node's GPUs reach each other
//! (NVLink, PCIe path, peer access, CUDA's performance rank) as text in the style of
//! `nvidia-smi topo -m`, and as JSON. Only formats a [`GpuLinks`] read by [`crate::gpu_links`].

use crate::{GpuLink, GpuLinks};

/// The running node's GPU links when `live` (the caller reads the live machine), else why
/// not: they come from the running driver, so they describe this node only, never a fixture.
pub fn links_here(live: bool) -> Result<GpuLinks, String> {
    if live {
        crate::gpu_links().map_err(|e| e.to_string())
    } else {
        Err(
            "not read: --root points at a fixture tree, and GPU links come from the running \
             driver"
                .into(),
        )
    }
}

/// The `topo --json` form of the link view: `{"error": why}` when there is none.
pub fn gpu_links_json(links: &Result<GpuLinks, String>) -> serde_json::Value {
    let l = match links {
        Ok(l) => l,
        Err(e) => return serde_json::json!({ "error": e }),
    };
    let gpus: Vec<_> = l
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({
                "index": g.index,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "active_nvlinks": g.active_nvlinks,
            })
        })
        .collect();
    let pairs: Vec<_> = l
        .links
        .iter()
        .map(|k| {
            serde_json::json!({
                "from": k.from,
                "to": k.to,
                "label": k.label(&l.gpus),
                "peer_access": k.peer_access,
                "perf_rank": k.perf_rank,
                "access_supported": k.access_supported,
                "native_atomics": k.native_atomics,
                "nvlink": k.nvlink,
                "pcie": k.pcie.map(|p| p.label()),
            })
        })
        .collect();
    serde_json::json!({
        "gpus": gpus,
        "links": pairs,
        "nvml": match &l.nvml { Ok(()) => "ok".to_string(), Err(e) => e.clone() },
    })
}

/// A square matrix with row and column heads `GPU<i>`, `cell(row, col)` off the diagonal.
fn gpu_matrix(l: &GpuLinks, diagonal: &str, cell: impl Fn(&GpuLink) -> String) -> String {
    let mut header = vec![String::new()];
    header.extend(l.gpus.iter().map(|g| format!("GPU{}", g.index)));
    let rows: Vec<Vec<String>> = l
        .gpus
        .iter()
        .map(|a| {
            let mut r = vec![format!("GPU{}", a.index)];
            r.extend(l.gpus.iter().map(|b| {
                if a.index == b.index {
                    diagonal.to_string()
                } else {
                    l.link(a.index, b.index).map_or("-".into(), &cell)
                }
            }));
            r
        })
        .collect();
    let header: Vec<&str> = header.iter().map(|s| s.as_str()).collect();
    tcpx_topo::render::table(&header, &rows)
}

/// The link view as text: one line saying why there is none, or the GPUs, the
/// `nvidia-smi topo -m`-style matrix and the peer-access / performance-rank matrix.
pub fn render_gpu_links(links: &Result<GpuLinks, String>) -> String {
    let l = match links {
        Ok(l) => l,
        Err(e) => return format!("GPU links: none ({e})\n"),
    };
    let mut out = String::new();
    out.push_str(&format!(
        "GPU links ({} GPU(s) the CUDA driver sees; {}):\n",
        l.gpus.len(),
        match &l.nvml {
            Ok(()) => "NVLink and PCIe path from NVML".to_string(),
            Err(e) => format!("no NVLink/PCIe view: {e}"),
        }
    ));
    for g in &l.gpus {
        out.push_str(&format!(
            "  GPU{} {} {}{}\n",
            g.index,
            g.pci_bus_id,
            g.name,
            g.active_nvlinks
                .map_or(String::new(), |n| format!(", {n} NVLink(s) active"))
        ));
    }
    if l.gpus.len() < 2 {
        out.push_str("  (one GPU: no pairs)\n");
        return out;
    }
    out.push_str("Link matrix (as nvidia-smi topo -m):\n");
    out.push_str(&gpu_matrix(l, "X", |k| k.label(&l.gpus)));
    out.push_str("Peer access / CUDA performance rank (row GPU reading column GPU):\n");
    out.push_str(&gpu_matrix(l, "-", |k| {
        format!(
            "{}/{}",
            if k.peer_access { "yes" } else { "no" },
            k.perf_rank.map_or("-".to_string(), |r| r.to_string())
        )
    }));
    out.push_str(
        "Legend: X = self, NV# = NVLink (# active links), PIX = one PCIe switch, PXB = several \
         PCIe switches, PHB = a PCIe host bridge, NODE = host bridges of one NUMA node, SYS = \
         across NUMA nodes, ? = NVML could not tell; peer access no = copies go through host \
         memory\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GpuNode, PciePath};

    fn links(n: usize, nvml: bool) -> GpuLinks {
        let gpus = (0..n)
            .map(|i| GpuNode {
                index: i,
                name: "NVIDIA H200".into(),
                pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + 0x10 * i),
                active_nvlinks: nvml.then_some(18),
            })
            .collect();
        let mut pairs = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    // GPUs 0-1 on NVLink, the rest over PCIe across NUMA nodes.
                    let nv = a + b == 1;
                    pairs.push(GpuLink {
                        from: a,
                        to: b,
                        peer_access: nv,
                        perf_rank: Some(if nv { 0 } else { 2 }),
                        access_supported: Some(nv),
                        native_atomics: Some(nv),
                        nvlink: nvml.then_some(nv),
                        pcie: nvml.then_some(PciePath::System),
                    });
                }
            }
        }
        GpuLinks {
            gpus,
            links: pairs,
            nvml: if nvml {
                Ok(())
            } else {
                Err("NVML (libnvidia-ml.so.1) could not be loaded".into())
            },
        }
    }

    #[test]
    fn the_link_matrix_reads_like_nvidia_smi() {
        let out = render_gpu_links(&Ok(links(3, true)));
        let row = |name: &str| -> Vec<String> {
            out.lines()
                .find(|l| l.trim_start().starts_with(name) && l.contains("NV18"))
                .unwrap_or_else(|| panic!("no matrix row {name}:\n{out}"))
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(row("GPU0"), ["GPU0", "X", "NV18", "SYS"]);
        assert_eq!(row("GPU1"), ["GPU1", "NV18", "X", "SYS"]);
        assert!(
            out.contains("GPU2 0000:38:00.0 NVIDIA H200, 18 NVLink(s) active"),
            "{out}"
        );
        let peer = out
            .lines()
            .skip_while(|l| !l.starts_with("Peer access"))
            .find(|l| l.trim_start().starts_with("GPU2"))
            .unwrap();
        assert_eq!(
            peer.split_whitespace().collect::<Vec<_>>(),
            ["GPU2", "no/2", "no/2", "-"]
        );
        assert!(out.contains("NVLink and PCIe path from NVML"), "{out}");
    }

    #[test]
    fn without_nvml_cells_are_unknown_and_the_reason_is_given() {
        let out = render_gpu_links(&Ok(links(2, false)));
        assert!(
            out.contains("no NVLink/PCIe view: NVML (libnvidia-ml.so.1)"),
            "{out}"
        );
        let gpu0 = out
            .lines()
            .find(|l| l.trim_start().starts_with("GPU0") && l.contains(" X"))
            .unwrap();
        assert_eq!(
            gpu0.split_whitespace().collect::<Vec<_>>(),
            ["GPU0", "X", "?"]
        );
        let v = gpu_links_json(&Ok(links(2, false)));
        assert_eq!(v["links"][0]["label"], "?");
        assert!(v["links"][0]["nvlink"].is_null());
        assert_eq!(v["links"][0]["peer_access"], true);
    }

    #[test]
    fn no_gpu_is_one_line_and_one_gpu_has_no_pairs() {
        let none = render_gpu_links(&Err("no GPU: libcuda.so.1 missing".into()));
        assert_eq!(none, "GPU links: none (no GPU: libcuda.so.1 missing)\n");
        assert_eq!(
            gpu_links_json(&Err("x".into())),
            serde_json::json!({ "error": "x" })
        );
        let one = render_gpu_links(&Ok(links(1, true)));
        assert!(
            one.contains("(one GPU: no pairs)") && !one.contains("Link matrix"),
            "{one}"
        );
        let v = gpu_links_json(&Ok(links(3, true)));
        assert_eq!(v["links"].as_array().unwrap().len(), 6);
        assert_eq!(v["links"][0]["label"], "NV18");
        assert_eq!(v["links"][1]["pcie"], "SYS");
        assert_eq!(v["nvml"], "ok");
    }
}
