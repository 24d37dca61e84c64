//! CPU unpack of TCPX-shaped fragment lists against one contiguous copy of the same bytes.
//!
//! `cargo bench -p tcpx-ffi --bench unpack_cpu` prints, per receive size and fragment shape, the
//! bandwidth of `apply_load_metas` and of a plain `copy_from_slice`, in GB/s (1e9 bytes/s), and
//! their ratio. This is the CPU reference that the GPU unpack kernel's benchmark mirrors; the bytes
//! are checked once per case so a fast-but-wrong unpack cannot report a number.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tcpx_ffi::unpack::{apply_load_metas, scatter, synthetic_layout};

/// Runs `f` repeatedly for at least `budget`; returns bytes per second for `bytes` per call.
fn rate(bytes: usize, budget: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm caches and page tables
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < budget {
        f();
        calls += 1;
    }
    (bytes as f64 * calls as f64) / started.elapsed().as_secs_f64()
}

fn main() {
    let budget = Duration::from_millis(
        std::env::var("UNPACK_BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400),
    );
    println!(
        "{:>10} {:>22} {:>10} {:>12} {:>12} {:>7}",
        "size (B)", "fragments", "count", "unpack GB/s", "memcpy GB/s", "ratio"
    );
    for len in [512 << 10, 1 << 20, 2 << 20, 4 << 20] {
        for (shape, min_fragment) in [("4 KiB pages, aligned", 4096), ("2-4 KiB, unaligned", 2048)]
        {
            let layout = synthetic_layout(len, min_fragment, len as u64);
            let data: Vec<u8> = (0..len).map(|i| (i * 131 + 17) as u8).collect();
            let mut bounce = vec![0u8; layout.bounce_len];
            scatter(&layout.metas, &data, &mut bounce).expect("layout fits");
            let mut dst = vec![0u8; len];
            apply_load_metas(&layout.metas, &bounce, &mut dst).expect("layout fits");
            assert!(dst == data, "unpack produced wrong bytes");

            let unpack = rate(len, budget, || {
                apply_load_metas(black_box(&layout.metas), black_box(&bounce), &mut dst)
                    .expect("layout fits");
                black_box(&dst);
            });
            let copy = rate(len, budget, || {
                dst.copy_from_slice(black_box(&data));
                black_box(&dst);
            });
            println!(
                "{len:>10} {shape:>22} {:>10} {:>12.2} {:>12.2} {:>6.0}%",
                layout.metas.len(),
                unpack / 1e9,
                copy / 1e9,
                100.0 * unpack / copy
            );
        }
    }
}
