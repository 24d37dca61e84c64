//! `unpack`: the GPUDirect-TCPX receive unpack kernel against a plain device-to-device copy of the
//! same bytes. Each receive's fragment list is shaped like TCPX's (`tcpx_ffi::unpack::
//! synthetic_layout`: fragments of up to 4 KiB, one per bounce page, pages shuffled); a batch of
//! receives, each in its own bounce region and destination range, is timed with CUDA events:
//! one kernel launch per receive (as the netplugin backend does, back to back, without the
//! per-receive completion event the data path adds), one launch for the whole batch
//! (the kernel's own bandwidth), and one `cuMemcpyDtoDAsync` per receive of the same byte count.
//! The unpacked bytes are checked on the GPU after the timed runs (the bounce pages hold the
//! pattern scattered on the host by `tcpx_ffi::unpack::scatter`, so a kernel that copies
//! nothing, or the wrong fragment, fails the run).

use anyhow::{bail, Result};
use serde_json::json;
use tcpx_ffi::unpack::{scatter, synthetic_layout};
use tcpx_gpu::{Device, UnpackCopy, UnpackTable};

use crate::{emit, human, median, parse_list};

/// Bytes the batch should cover, so that it does not sit in the GPU's L2 cache (50 MiB on H100).
const BATCH_BYTES: usize = 256 << 20;
/// The target: unpack at least this share of the copy's bandwidth.
pub const TARGET_RATIO: f64 = 0.70;

/// Fragment lists for `batch` receives of `n` bytes: receive `i` reads bounce region `i` (of
/// `bounce_len` bytes) and writes `i * n..` of the destination. Returns the per-receive lists
/// (sources shifted to their region, destinations relative to the receive) and `bounce_len`.
pub fn batch_layout(
    n: usize,
    batch: usize,
    min_fragment: usize,
    seed: u64,
) -> (Vec<Vec<UnpackCopy>>, usize) {
    let mut lists = Vec::with_capacity(batch);
    let mut bounce_len = 0;
    for i in 0..batch {
        let l = synthetic_layout(n, min_fragment, seed + i as u64);
        bounce_len = bounce_len.max(l.bounce_len);
        lists.push(l);
    }
    let copies = lists
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l.metas
                .iter()
                .map(|m| UnpackCopy {
                    src_off: (i * bounce_len) as u32 + m.src_off,
                    len: m.len,
                    dst_off: m.dst_off,
                })
                .collect()
        })
        .collect();
    (copies, bounce_len)
}

pub fn run(sizes: &str, min_fragment: usize, iters: usize, gpu: usize) -> Result<()> {
    let sizes = parse_list(sizes)?;
    if sizes.is_empty() {
        bail!("no sizes given");
    }
    if let Some(&big) = sizes.iter().find(|&&n| n == 0 || n > 4 << 20) {
        bail!(
            "receive size {big} is outside 1..=4 MiB: one GPUDirect-TCPX receive carries at most 4 MiB"
        );
    }
    let g = Device::open(gpu)?;
    let s = g.new_stream()?;
    let mut all_ok = true;
    for &n in &sizes {
        let batch = (BATCH_BYTES / n).max(16);
        let seed = 0x7C9u64 + n as u64;
        let (lists, bounce_len) = batch_layout(n, batch, min_fragment, seed);
        if (batch * bounce_len) as u64 > u32::MAX as u64 {
            bail!("a batch of {batch} x {bounce_len} bounce bytes does not fit 32-bit offsets");
        }
        let fragments = lists[0].len();
        // Host image of the bounce regions: receive i's pattern bytes (absolute offset i * n, so
        // the whole destination is one pattern run) scattered over its pages.
        let mut host_bounce = vec![0u8; batch * bounce_len];
        let mut data = vec![0u8; n];
        for (i, list) in lists.iter().enumerate() {
            tcpx_gpu::fill_pattern(&mut data, seed, (i * n) as u64);
            let metas: Vec<tcpx_ffi::abi::LoadMeta> = list
                .iter()
                .map(|c| tcpx_ffi::abi::LoadMeta {
                    src_off: c.src_off - (i * bounce_len) as u32,
                    len: c.len,
                    dst_off: c.dst_off,
                })
                .collect();
            let region = &mut host_bounce[i * bounce_len..(i + 1) * bounce_len];
            scatter(&metas, &data, region)?;
        }
        let bounce = g.alloc(batch * bounce_len)?;
        bounce.write_from_host(0, &host_bounce)?;
        drop(host_bounce);
        let dst = g.alloc(batch * n)?;
        let tables: Vec<UnpackTable> = lists
            .iter()
            .map(|l| g.upload_unpack_table(l))
            .collect::<Result<_, _>>()?;
        let whole: Vec<UnpackCopy> = lists
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.iter().map(move |c| UnpackCopy {
                    dst_off: c.dst_off + (i * n) as u64,
                    ..*c
                })
            })
            .collect();
        let whole = g.upload_unpack_table(&whole)?;

        let poison = |s: &tcpx_gpu::Stream| s.fill_pattern(&dst, 0, batch * n, 5, 0);
        let check = |s: &tcpx_gpu::Stream, what: &str| -> Result<()> {
            let wrong = s.count_pattern_errors(&dst, 0, batch * n, seed, 0)?;
            if wrong != 0 {
                bail!(
                    "unpack ({what}) of {batch} receives of {}: {wrong} bytes wrong",
                    human(n)
                );
            }
            Ok(())
        };
        // Per-receive launches, as the data path does.
        poison(&s)?;
        let mut per_recv = Vec::new();
        for it in 0..=iters {
            let e0 = s.record()?;
            for (i, t) in tables.iter().enumerate() {
                s.unpack_table_queued(&bounce, t, &dst, i * n)?;
            }
            let e1 = s.record()?;
            let secs = e1.elapsed_since(&e0)?.as_secs_f64();
            if it > 0 {
                per_recv.push(secs);
            }
        }
        check(&s, "one launch per receive")?;
        // One launch for the batch.
        poison(&s)?;
        let mut batched = Vec::new();
        for it in 0..=iters {
            let e0 = s.record()?;
            s.unpack_table_queued(&bounce, &whole, &dst, 0)?;
            let e1 = s.record()?;
            let secs = e1.elapsed_since(&e0)?.as_secs_f64();
            if it > 0 {
                batched.push(secs);
            }
        }
        check(&s, "one launch per batch")?;
        // The same bytes as contiguous device-to-device copies, one per receive.
        let mut copy = Vec::new();
        for it in 0..=iters {
            let e0 = s.record()?;
            for i in 0..batch {
                s.copy_device(&bounce, i * bounce_len, &dst, i * n, n)?;
            }
            let e1 = s.record()?;
            let secs = e1.elapsed_since(&e0)?.as_secs_f64();
            if it > 0 {
                copy.push(secs);
            }
        }
        let bytes = (batch * n) as f64;
        let (u, b, c) = (
            bytes / median(per_recv) / 1e9,
            bytes / median(batched) / 1e9,
            bytes / median(copy) / 1e9,
        );
        let (ratio, ratio_batched) = (u / c, b / c);
        let ok = ratio >= TARGET_RATIO;
        all_ok &= ok;
        println!(
            "unpack GPU{gpu} {:>5}/recv  {fragments:4} fragments (min {min_fragment} B)  x{batch}  \
             per-recv launch {u:7.1} GB/s  batched {b:7.1} GB/s  d2d copy {c:7.1} GB/s  \
             ratio {ratio:.2} (batched {ratio_batched:.2}, target >= {TARGET_RATIO})  {}  verified",
            human(n),
            if ok { "PASS" } else { "BELOW TARGET" }
        );
        emit(json!({
            "kind": "unpack", "gpu": gpu, "device": g.name(), "bytes_per_recv": n,
            "fragments_per_recv": fragments, "min_fragment": min_fragment, "batch": batch,
            "unpack_gbps": u, "unpack_batched_gbps": b, "copy_gbps": c,
            "ratio": ratio, "ratio_batched": ratio_batched, "target_ratio": TARGET_RATIO,
            "meets_target": ok, "verified": true,
        }));
    }
    if !all_ok {
        println!("unpack: some sizes are below {TARGET_RATIO} of the copy's bandwidth");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_layouts_give_each_receive_its_own_bounce_region() {
        let (lists, bounce_len) = batch_layout(512 << 10, 4, 4096, 9);
        assert_eq!(lists.len(), 4);
        assert_eq!(
            bounce_len,
            512 << 10,
            "4 KiB fragments: one page each, no slack"
        );
        for (i, l) in lists.iter().enumerate() {
            assert_eq!(l.len(), 128);
            let covered: u64 = l.iter().map(|c| u64::from(c.len)).sum();
            assert_eq!(covered, 512 << 10);
            for c in l {
                let lo = (i * bounce_len) as u32;
                assert!(c.src_off >= lo && c.src_off + c.len <= lo + bounce_len as u32);
                assert!(c.dst_off + u64::from(c.len) <= 512 << 10);
            }
        }
        assert_ne!(lists[0], lists[1], "every receive has its own shuffle");
    }
}
