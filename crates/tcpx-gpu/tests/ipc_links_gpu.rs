//! CUDA IPC export and the node's GPU link view on real GPUs (the cross-process copies themselves
//! are tested with the `cudap2p` backend in tcpx-transport). Skip visibly without a GPU.

use tcpx_gpu::testing::gpus_or_skip;

#[test]
fn ipc_export_names_the_allocation_and_the_buffer_inside_it() {
    let Some(gpus) = gpus_or_skip(
        "ipc_export_names_the_allocation_and_the_buffer_inside_it",
        1,
    ) else {
        return;
    };
    for len in [1usize, 10_000, 3 << 20] {
        let b = gpus[0].alloc(len).unwrap();
        let e = b.ipc_export().unwrap();
        assert_eq!(e.len, len as u64);
        // The buffer starts at most a page into its allocation (alloc rounds up to 4 KiB).
        assert!(e.offset <= tcpx_gpu::PAGE as u64, "{e:?}");
        assert!(e.alloc_len >= e.offset + e.len, "{e:?}");
        assert_ne!(e.handle.0, [0u8; tcpx_gpu::IPC_HANDLE_BYTES], "{e:?}");
        // Exporting again is allowed and names the same allocation.
        assert_eq!(b.ipc_export().unwrap().offset, e.offset);
    }
    let (a, b) = (gpus[0].alloc(4096).unwrap(), gpus[0].alloc(4096).unwrap());
    assert_ne!(
        a.ipc_export().unwrap().handle,
        b.ipc_export().unwrap().handle,
        "two allocations share a handle"
    );
}

#[test]
fn gpu_links_cover_every_ordered_pair() {
    let Some(gpus) = gpus_or_skip("gpu_links_cover_every_ordered_pair", 1) else {
        return;
    };
    let n = tcpx_gpu::device_count().unwrap();
    let l = tcpx_gpu::gpu_links().unwrap();
    eprintln!("gpu_links: {l:#?}");
    assert_eq!(l.gpus.len(), n);
    assert_eq!(l.links.len(), n * (n - 1));
    for (g, d) in l.gpus.iter().zip(0..n) {
        assert_eq!(g.index, d);
        // The bus id matches what opening the GPU reports.
        if d < gpus.len() {
            assert_eq!(
                g.pci_bus_id.to_ascii_lowercase(),
                gpus[d].pci_bus_id().to_ascii_lowercase()
            );
        }
    }
    if l.nvml.is_ok() {
        for k in &l.links {
            assert!(
                k.pcie.is_some() || k.nvlink.is_some(),
                "NVML answered but said nothing about {} -> {}: {k:?}",
                k.from,
                k.to
            );
        }
    }
    if n >= 2 {
        let s = tcpx_gpu::gpu_link_summary(0, 1);
        eprintln!("GPU 0 -> GPU 1: {s}");
        assert!(!s.starts_with("link unknown"), "{s}");
        assert_eq!(
            s.contains(", peer access"),
            l.link(0, 1).unwrap().peer_access,
            "{s}"
        );
    }
}
