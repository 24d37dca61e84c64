//! GPU tests: real CUDA on a real GPU. Without one they print `SKIP: ...` (see
//! `tcpx_gpu::testing`); `cargo xtask gpu-test` runs them on the device machine with
//! `TCPX_REQUIRE_GPU=1`, where skipping is a failure.

use tcpx_gpu::testing::{gpu_required, gpus_or_skip};
use tcpx_gpu::{fill_pattern, pattern_byte, verify_pattern, Device, GpuError, PAGE};

const MIB: usize = 1 << 20;

#[test]
fn missing_gpu_or_bad_index_is_an_error_not_a_panic() {
    match tcpx_gpu::device_count() {
        Err(e) => {
            // No driver here: every entry point must say so, naming what to check.
            assert!(
                !gpu_required(),
                "TCPX_REQUIRE_GPU is set but CUDA is unusable: {e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("libcuda.so.1") || msg.contains("no GPU"),
                "{msg}"
            );
            assert_eq!(Device::open(0).unwrap_err(), e);
            assert!(Device::by_pci_bus_id("0000:00:00.0").is_err());
        }
        Ok(count) => {
            match Device::open(count) {
                Err(GpuError::IndexOutOfRange { index, count: c }) => {
                    assert_eq!((index, c), (count, count))
                }
                other => panic!("index {count} of {count} GPUs gave {other:?}"),
            }
            assert!(matches!(
                Device::by_pci_bus_id("ffff:ff:1f.7"),
                Err(GpuError::BusIdNotFound { .. })
            ));
            assert!(matches!(
                Device::by_pci_bus_id("not a bus id"),
                Err(GpuError::BusIdNotFound { .. })
            ));
        }
    }
}

#[test]
fn gpu_devices_open_by_index_and_pci_bus_id() {
    let Some(gpus) = gpus_or_skip("gpu_devices_open_by_index_and_pci_bus_id", 1) else {
        return;
    };
    let count = tcpx_gpu::device_count().unwrap();
    for i in 0..count {
        let d = Device::open(i).unwrap();
        assert_eq!(d.index(), i);
        assert!(d.pci_bus_id().contains(':'), "bus id {:?}", d.pci_bus_id());
        let again = Device::by_pci_bus_id(d.pci_bus_id()).unwrap();
        assert_eq!(
            again.index(),
            i,
            "bus id {} maps back to GPU {}",
            d.pci_bus_id(),
            again.index()
        );
        let lower = Device::by_pci_bus_id(&d.pci_bus_id().to_lowercase()).unwrap();
        assert_eq!(lower.index(), i, "lower-case bus id as sysfs prints it");
        let (free, total) = d.memory_info().unwrap();
        assert!(free > 0 && free <= total);
        assert!(d.multiprocessor_count() > 0);
        eprintln!(
            "{d:?}: cc {:?}, {} SMs, {free}/{total} bytes free",
            d.compute_capability(),
            d.multiprocessor_count()
        );
    }
    drop(gpus);
}

#[test]
fn gpu_buffers_are_page_aligned_and_oom_is_reported() {
    let Some(gpus) = gpus_or_skip("gpu_buffers_are_page_aligned_and_oom_is_reported", 1) else {
        return;
    };
    let d = &gpus[0];
    let bufs: Vec<_> = [1, 100, PAGE - 1, PAGE + 1, 3 * MIB + 5]
        .iter()
        .map(|&n| d.alloc(n).unwrap())
        .collect();
    for b in &bufs {
        assert_eq!(b.device_ptr() % PAGE as u64, 0, "{b:?}");
    }
    let pinned = d.alloc_pinned(PAGE + 3).unwrap();
    assert_eq!(pinned.as_ptr() as usize % PAGE, 0);
    assert!(pinned.as_slice().unwrap().iter().all(|&b| b == 0));
    assert_eq!(d.alloc(0).unwrap_err(), GpuError::ZeroSize);
    let (_, total) = d.memory_info().unwrap();
    match d.alloc(total + (1 << 30)) {
        Err(GpuError::OutOfDeviceMemory {
            device, requested, ..
        }) => {
            assert_eq!(device, 0);
            assert!(requested > total);
        }
        other => panic!("allocating more than the GPU has gave {other:?}"),
    }
    // The failed allocation left the GPU usable.
    let b = d.alloc(MIB).unwrap();
    let s = d.new_stream().unwrap();
    s.fill_pattern(&b, 0, MIB, 1, 0).unwrap();
    assert_eq!(s.verify_pattern(&b, 0, MIB, 1, 0).unwrap(), None);
    assert!(matches!(
        s.fill_pattern(&b, 1, MIB, 1, 0),
        Err(GpuError::OutOfBounds { .. })
    ));
}

#[test]
fn gpu_pattern_matches_the_host_pattern_at_any_offset() {
    let Some(gpus) = gpus_or_skip("gpu_pattern_matches_the_host_pattern_at_any_offset", 1) else {
        return;
    };
    let d = &gpus[0];
    let s = d.new_stream().unwrap();
    let size = 4 * MIB + 123;
    let buf = d.alloc(size).unwrap();
    let mut host = vec![0u8; size];
    // (offset into the buffer, length, absolute message offset): unaligned on every side.
    for (off, len, at, seed) in [
        (0usize, size, 0u64, 11u64),
        (3, 1000, 5, 12),
        (8, 4 * MIB, 1 << 33, 13),
        (1, 7, 9, 14),
        (17, 3 * MIB + 1, 3, 15),
    ] {
        s.fill_pattern(&buf, off, len, seed, at).unwrap();
        s.synchronize().unwrap();
        buf.read_to_host(off, &mut host[..len]).unwrap();
        assert_eq!(
            verify_pattern(&host[..len], seed, at),
            None,
            "GPU fill {off}+{len}@{at} read on host"
        );
        assert_eq!(
            s.verify_pattern(&buf, off, len, seed, at).unwrap(),
            None,
            "GPU verify"
        );
        assert_eq!(host[0], pattern_byte(seed, at));
    }
    // Host fills, GPU verifies and names the first corrupted byte exactly.
    fill_pattern(&mut host, 99, 77);
    buf.write_from_host(0, &host).unwrap();
    assert_eq!(s.verify_pattern(&buf, 0, size, 99, 77).unwrap(), None);
    for bad in [0usize, 5, 8, 4095, 2 * MIB + 3, size - 1] {
        let mut h = host.clone();
        h[bad] ^= 0x10;
        if bad + 9 < size {
            h[bad + 9] ^= 0x01; // a later error must not mask the first
        }
        buf.write_from_host(0, &h).unwrap();
        assert_eq!(
            s.verify_pattern(&buf, 0, size, 99, 77).unwrap(),
            Some(bad as u64)
        );
    }
    assert_eq!(
        s.verify_pattern(&buf, 0, size, 98, 77).unwrap(),
        Some(0),
        "wrong seed"
    );
    // Counting: exact is 0; three flipped bytes (one in an unaligned tail) count 3.
    buf.write_from_host(0, &host).unwrap();
    assert_eq!(s.count_pattern_errors(&buf, 0, size, 99, 77).unwrap(), 0);
    assert_eq!(
        s.count_pattern_errors(&buf, 3, size - 3, 99, 80).unwrap(),
        0,
        "unaligned view"
    );
    let mut h = host.clone();
    for bad in [5usize, 6, size - 1] {
        h[bad] ^= 0x80;
    }
    buf.write_from_host(0, &h).unwrap();
    assert_eq!(s.count_pattern_errors(&buf, 0, size, 99, 77).unwrap(), 3);
    assert_eq!(
        s.count_pattern_errors(&buf, 7, size - 7, 99, 84).unwrap(),
        1,
        "only the last one in range"
    );
}

#[test]
fn gpu_pinned_copies_round_trip_and_are_timed() {
    let Some(gpus) = gpus_or_skip("gpu_pinned_copies_round_trip_and_are_timed", 1) else {
        return;
    };
    let d = &gpus[0];
    let (s1, s2) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let len = 64 * MIB;
    let (src, dst) = (d.alloc(len).unwrap(), d.alloc(len).unwrap());
    let mut staging = d.alloc_pinned(len).unwrap();
    s1.fill_pattern(&src, 0, len, 5, 0).unwrap();
    let t0 = s1.record().unwrap();
    // Two halves, so offsets inside both buffers are exercised.
    s1.copy_to_host(&src, 0, &mut staging, 0, len / 2).unwrap();
    s1.copy_to_host(&src, len / 2, &mut staging, len / 2, len / 2)
        .unwrap();
    let t1 = s1.record().unwrap();
    // Host access waits for the queued copies by itself.
    assert_eq!(verify_pattern(staging.as_slice().unwrap(), 5, 0), None);
    s2.wait_event(&t1).unwrap();
    s2.copy_to_device(&staging, 0, &dst, 0, len).unwrap();
    let t2 = s2.record().unwrap();
    assert_eq!(s2.verify_pattern(&dst, 0, len, 5, 0).unwrap(), None);
    let d2h = t1.elapsed_since(&t0).unwrap();
    let h2d = t2.elapsed_since(&t1).unwrap();
    assert!(d2h.as_nanos() > 0 && h2d.as_nanos() > 0);
    eprintln!(
        "pinned copies of {len} bytes: device->host {:.1} GB/s, host->device {:.1} GB/s",
        len as f64 / d2h.as_secs_f64() / 1e9,
        len as f64 / h2d.as_secs_f64() / 1e9
    );
    // Overwriting the host side after the copy finished leaves the device copy intact.
    staging.as_mut_slice().unwrap().fill(0);
    assert_eq!(s2.verify_pattern(&dst, 0, len, 5, 0).unwrap(), None);
    assert!(matches!(
        s1.copy_to_host(&src, 0, &mut staging, 1, len),
        Err(GpuError::OutOfBounds { .. })
    ));
}

#[test]
fn gpu_copy_between_two_gpus_is_byte_exact() {
    let Some(gpus) = gpus_or_skip("gpu_copy_between_two_gpus_is_byte_exact", 2) else {
        return;
    };
    let (g0, g1) = (&gpus[0], &gpus[1]);
    let len = 32 * MIB + 8;
    let a = g0.alloc(len).unwrap();
    let b = g1.alloc(len).unwrap();
    let s0 = g0.new_stream().unwrap();
    let s1 = g1.new_stream().unwrap();
    s0.fill_pattern(&a, 0, len, 21, 4096).unwrap();
    s0.synchronize().unwrap();
    s1.copy_device(&a, 0, &b, 0, len).unwrap();
    assert_eq!(s1.verify_pattern(&b, 0, len, 21, 4096).unwrap(), None);
    assert!(matches!(
        s0.fill_pattern(&b, 0, 8, 1, 0),
        Err(GpuError::WrongDevice { .. })
    ));
}

#[test]
fn gpu_span_copies_hold_their_range_until_done() {
    let Some(gpus) = gpus_or_skip("gpu_span_copies_hold_their_range_until_done", 1) else {
        return;
    };
    let d = &gpus[0];
    let s = d.new_stream().unwrap();
    let len = 8 * MIB;
    let host = tcpx_gpu::HostBuffer::new(len).unwrap();
    let pin = tcpx_gpu::HostPin::new(d, &host).unwrap();
    let (src, dst) = (d.alloc(len).unwrap(), d.alloc(len).unwrap());
    s.fill_pattern(&src, 0, len, 31, 0).unwrap();
    // Two halves in flight at once; while a copy holds its range, the range cannot be lent again.
    let lo = s
        .copy_device_to_span(&src, 0, host.span(0, len / 2).unwrap())
        .unwrap();
    let hi = s
        .copy_device_to_span(&src, len / 2, host.span(len / 2, len / 2).unwrap())
        .unwrap();
    assert!(host.span(0, 1).is_err(), "range lent to a copy in flight");
    let lo = lo.wait(std::time::Duration::from_secs(30)).unwrap();
    drop(hi); // waits for the copy itself
    assert_eq!(verify_pattern(&lo, 31, 0), None);
    drop(lo);
    let all = host.span_all().unwrap();
    assert_eq!(verify_pattern(&all, 31, 0), None);
    let back = s.copy_span_to_device(all, &dst, 0).unwrap();
    let all = back.wait(std::time::Duration::from_secs(30)).unwrap();
    assert_eq!(s.verify_pattern(&dst, 0, len, 31, 0).unwrap(), None);
    assert!(matches!(
        s.copy_span_to_device(all, &dst, 1),
        Err(GpuError::OutOfBounds { .. })
    ));
    drop(pin);
    assert!(
        host.span_all().is_ok(),
        "a failed enqueue gives the span back"
    );
}

#[test]
fn gpu_unpack_gathers_scattered_fragments_byte_exact() {
    let Some(gpus) = gpus_or_skip("gpu_unpack_gathers_scattered_fragments_byte_exact", 1) else {
        return;
    };
    let d = &gpus[0];
    let s = d.new_stream().unwrap();
    // A message of 1 MiB + 333 bytes scattered over shuffled 4 KiB pages of a bounce buffer, with
    // fragments of varying length at unaligned page offsets, like the NIC leaves them.
    let msg_len = MIB + 333;
    let mut msg = vec![0u8; msg_len];
    fill_pattern(&mut msg, 61, 0);
    // Fragments are at least 4096 - 3 * 900 - 6 bytes long: enough pages for all of them.
    let pages = msg_len / 1024 + 2;
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut bounce = vec![0xEEu8; pages * 4096];
    let mut copies = Vec::new();
    let (mut off, mut k) = (0usize, 0usize);
    while off < msg_len {
        let len = (msg_len - off).min(4096 - (k % 4) * 900 - k % 7); // stays inside its page
        let src = order[k] * 4096 + (k % 7);
        bounce[src..src + len].copy_from_slice(&msg[off..off + len]);
        copies.push(tcpx_gpu::UnpackCopy {
            src_off: src as u32,
            len: len as u32,
            dst_off: off as u64,
        });
        off += len;
        k += 1;
    }
    let dbounce = d.alloc(bounce.len()).unwrap();
    dbounce.write_from_host(0, &bounce).unwrap();
    let dst = d.alloc(msg_len + 8192).unwrap();
    s.fill_pattern(&dst, 0, msg_len + 8192, 4, 0).unwrap();
    assert_eq!(s.unpack(&dbounce, &copies, &dst, 4096).unwrap(), msg_len);
    assert_eq!(s.verify_pattern(&dst, 4096, msg_len, 61, 0).unwrap(), None);
    assert_eq!(
        s.verify_pattern(&dst, 0, 4096, 4, 0).unwrap(),
        None,
        "before the target untouched"
    );
    let after = 4096 + msg_len;
    assert_eq!(
        s.verify_pattern(&dst, after, 4096, 4, after as u64)
            .unwrap(),
        None,
        "after untouched"
    );
    // The asynchronous, group-per-fragment path (UnpackTable + UnpackJob) gives the same bytes.
    s.fill_pattern(&dst, 0, msg_len + 8192, 4, 0).unwrap();
    let table = d.upload_unpack_table(&copies).unwrap();
    assert_eq!((table.fragments(), table.bytes()), (copies.len(), msg_len));
    let job = s.unpack_table(&dbounce, table, &dst, 4096).unwrap();
    job.wait_within(std::time::Duration::from_secs(30)).unwrap();
    assert!(job.is_complete().unwrap());
    assert_eq!(
        s.verify_pattern(&dst, 4096, msg_len, 61, 0).unwrap(),
        None,
        "unpack_table"
    );
    assert_eq!(s.verify_pattern(&dst, 0, 4096, 4, 0).unwrap(), None);
    assert_eq!(
        s.verify_pattern(&dst, after, 4096, 4, after as u64)
            .unwrap(),
        None
    );
    // A fragment reaching past either buffer is refused before any GPU work.
    let mut bad = copies.clone();
    bad[3].src_off = (bounce.len() - 10) as u32;
    assert!(matches!(
        s.unpack(&dbounce, &bad, &dst, 4096),
        Err(GpuError::OutOfBounds { .. })
    ));
    let mut bad = copies.clone();
    bad[0].dst_off = (msg_len + 8192) as u64;
    assert!(matches!(
        s.unpack(&dbounce, &bad, &dst, 0),
        Err(GpuError::OutOfBounds { .. })
    ));
    assert_eq!(s.unpack(&dbounce, &[], &dst, 0).unwrap(), 0);
}
