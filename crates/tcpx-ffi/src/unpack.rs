//! The receive-side unpack of GPUDirect-TCPX, as plain descriptor logic.
//!
//! A finished TCPX receive leaves its bytes scattered over 4 KiB pages of a bounce buffer and a
//! list of [`LoadMeta`] fragments saying where each piece goes: copy `len` bytes from
//! `bounce + src_off` to `destination + dst_off`. [`apply_load_metas`] does that on the CPU, with
//! every range checked; the CUDA kernel in `tcpx-gpu` performs the same copies on the GPU and must
//! agree with it byte for byte (the tests compare both against the sent bytes).

use crate::abi::{LoadMeta, NetUnpackMeta, UNPACK_MAX_FRAGMENTS, UNPACK_PAGE, UNPACK_SLOTS};

/// A fragment list that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnpackError {
    #[error("unpack slot {0} does not exist (slots 0..16)")]
    BadSlot(usize),
    #[error("{count} fragments for one receive, more than the {max} a slot holds")]
    TooManyFragments { count: u64, max: usize },
    #[error("fragment {index} reads bounce bytes {src_off}+{len}, outside the {bounce_len}-byte bounce buffer")]
    SourceOutOfRange {
        index: usize,
        src_off: u32,
        len: u32,
        bounce_len: usize,
    },
    #[error(
        "fragment {index} writes bytes {dst_off}+{len}, outside the {dst_len}-byte receive buffer"
    )]
    DestinationOutOfRange {
        index: usize,
        dst_off: u64,
        len: u32,
        dst_len: usize,
    },
}

/// Checks a fragment count read from `netUnpackMeta.cnt`.
pub fn check_count(count: u64) -> Result<usize, UnpackError> {
    if count > UNPACK_MAX_FRAGMENTS as u64 {
        return Err(UnpackError::TooManyFragments {
            count,
            max: UNPACK_MAX_FRAGMENTS,
        });
    }
    Ok(count as usize)
}

/// The fragments of a finished receive in `slot`: reads `cnt[slot]` (after an acquire fence, so
/// the fragments the plugin stored before it are visible) and the first `cnt` entries of
/// `mem[slot]`. For a GPU layer that maps `netUnpackMeta` on the host, and for the CPU unpack.
///
/// # Safety
/// `meta` must point to a live `netUnpackMeta` readable from this thread, and the plugin must
/// have reported the receive in `slot` done and not yet been handed it back (`irecvConsumed`), so
/// that it does not write the slot while the returned slice lives.
pub unsafe fn read_slot<'a>(
    meta: *const NetUnpackMeta,
    slot: usize,
) -> Result<&'a [LoadMeta], UnpackError> {
    if slot >= UNPACK_SLOTS {
        return Err(UnpackError::BadSlot(slot));
    }
    // SAFETY: the caller guarantees `meta` is live and readable; `slot` is in range.
    let count = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*meta).cnt[slot])) };
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let count = check_count(count)?;
    // SAFETY: `mem[slot]` holds UNPACK_MAX_FRAGMENTS entries and `count` is at most that; the
    // plugin finished writing them before storing the count (caller's guarantee).
    Ok(unsafe {
        std::slice::from_raw_parts(
            std::ptr::addr_of!((*meta).mem[slot]).cast::<LoadMeta>(),
            count,
        )
    })
}

/// Checks every fragment against the destination (and the bounce buffer, when its size is known)
/// and returns the bytes the fragments carry in total.
pub fn check_load_metas(
    metas: &[LoadMeta],
    dst_len: usize,
    bounce_len: Option<usize>,
) -> Result<usize, UnpackError> {
    check_count(metas.len() as u64)?;
    let mut total = 0usize;
    for (index, m) in metas.iter().enumerate() {
        let dst_end = m.dst_off.checked_add(u64::from(m.len));
        if dst_end.is_none_or(|end| end > dst_len as u64) {
            return Err(UnpackError::DestinationOutOfRange {
                index,
                dst_off: m.dst_off,
                len: m.len,
                dst_len,
            });
        }
        if let Some(bounce_len) = bounce_len {
            if u64::from(m.src_off) + u64::from(m.len) > bounce_len as u64 {
                return Err(UnpackError::SourceOutOfRange {
                    index,
                    src_off: m.src_off,
                    len: m.len,
                    bounce_len,
                });
            }
        }
        total += m.len as usize;
    }
    Ok(total)
}

/// The fragments of one receive as the GPU kernel's table: every fragment checked against the
/// receive's `dst_len` bytes first (the bounce buffer's size is not known for GPUDirect-TCPX), so
/// a bad list is an error here instead of a write outside the receive buffer on the GPU. The
/// entries are the same 16 bytes as `loadMeta`.
pub fn gpu_copies(
    metas: &[LoadMeta],
    dst_len: usize,
) -> Result<Vec<tcpx_gpu::UnpackCopy>, UnpackError> {
    check_load_metas(metas, dst_len, None)?;
    Ok(metas
        .iter()
        .map(|m| tcpx_gpu::UnpackCopy {
            src_off: m.src_off,
            len: m.len,
            dst_off: m.dst_off,
        })
        .collect())
}

/// Copies every fragment from `bounce` into `dst`; returns the bytes copied.
pub fn apply_load_metas(
    metas: &[LoadMeta],
    bounce: &[u8],
    dst: &mut [u8],
) -> Result<usize, UnpackError> {
    let total = check_load_metas(metas, dst.len(), Some(bounce.len()))?;
    for m in metas {
        let (src, dst_off, len) = (m.src_off as usize, m.dst_off as usize, m.len as usize);
        dst[dst_off..dst_off + len].copy_from_slice(&bounce[src..src + len]);
    }
    Ok(total)
}

/// A fragment list shaped like GPUDirect-TCPX's, with the bounce buffer size it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticLayout {
    pub metas: Vec<LoadMeta>,
    pub bounce_len: usize,
}

/// Lays a receive of `len` bytes out as TCPX does, for tests and benchmarks (the CPU reference
/// here, the GPU kernel's benchmark in `tcpx-gpu`): fragments of `min_fragment..=4096` bytes in
/// destination order, each in its own 4 KiB page of the bounce buffer, the pages shuffled. With
/// `min_fragment == 4096` every fragment is a whole, page-aligned page; below that, fragments sit
/// at random offsets inside their page, so sources are rarely aligned. Deterministic per `seed`.
pub fn synthetic_layout(len: usize, min_fragment: usize, seed: u64) -> SyntheticLayout {
    let min_fragment = min_fragment.clamp(1, UNPACK_PAGE);
    let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move |bound: usize| -> usize {
        // xorshift64*: cheap, deterministic, good enough to break ordering assumptions.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        (rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as usize % bound.max(1)
    };
    let mut lens = Vec::new();
    let mut off = 0usize;
    while off < len {
        let want = min_fragment + next(UNPACK_PAGE - min_fragment + 1);
        let flen = want.min(len - off);
        lens.push(flen);
        off += flen;
    }
    let mut pages: Vec<usize> = (0..lens.len()).collect();
    for i in (1..pages.len()).rev() {
        let j = next(i + 1);
        pages.swap(i, j);
    }
    let mut metas = Vec::with_capacity(lens.len());
    let mut dst = 0u64;
    for (k, &flen) in lens.iter().enumerate() {
        let in_page = next(UNPACK_PAGE - flen + 1);
        metas.push(LoadMeta {
            src_off: (pages[k] * UNPACK_PAGE + in_page) as u32,
            len: flen as u32,
            dst_off: dst,
        });
        dst += flen as u64;
    }
    SyntheticLayout {
        bounce_len: lens.len() * UNPACK_PAGE,
        metas,
    }
}

/// The inverse of [`apply_load_metas`]: puts `data` where the fragments say the plugin left it.
pub fn scatter(metas: &[LoadMeta], data: &[u8], bounce: &mut [u8]) -> Result<usize, UnpackError> {
    let total = check_load_metas(metas, data.len(), Some(bounce.len()))?;
    for m in metas {
        let (src, dst_off, len) = (m.src_off as usize, m.dst_off as usize, m.len as usize);
        bounce[src..src + len].copy_from_slice(&data[dst_off..dst_off + len]);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fragment: `len` bytes at `src_off` of the bounce buffer belong at `dst_off`.
    fn fragment(src_off: u32, len: u32, dst_off: u64) -> LoadMeta {
        LoadMeta {
            src_off,
            len,
            dst_off,
        }
    }

    /// Scatters `data` over pages of a bounce buffer in a shuffled order, like TCPX does.
    fn scatter_by_hand(data: &[u8], pages: usize) -> (Vec<u8>, Vec<LoadMeta>) {
        let mut bounce = vec![0xEEu8; pages * 4096];
        let mut order: Vec<usize> = (0..pages).collect();
        // Deterministic shuffle (LCG), enough to break any ordering assumption.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..order.len()).rev() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        let mut metas = Vec::new();
        let mut off = 0usize;
        let mut k = 0;
        while off < data.len() {
            let len = (data.len() - off).min(4096 - (k % 3) * 700);
            let in_page = (4096 - len) / 2;
            let src = order[k] * 4096 + in_page;
            bounce[src..src + len].copy_from_slice(&data[off..off + len]);
            metas.push(fragment(src as u32, len as u32, off as u64));
            off += len;
            k += 1;
        }
        (bounce, metas)
    }

    #[test]
    fn scattered_fragments_come_back_in_order() {
        let data: Vec<u8> = (0..300_001u32).map(|i| (i * 31 + 7) as u8).collect();
        let (bounce, metas) = scatter_by_hand(&data, 128);
        let mut dst = vec![0u8; data.len()];
        let n = apply_load_metas(&metas, &bounce, &mut dst).unwrap();
        assert_eq!(n, data.len());
        assert_eq!(dst, data);
    }

    #[test]
    fn synthetic_layouts_cover_every_byte_once_and_round_trip() {
        for (len, min) in [
            (1, 2048),
            (4096, 4096),
            (300_001, 2048),
            (4 << 20, 2048),
            (4 << 20, 4096),
        ] {
            let l = synthetic_layout(len, min, len as u64);
            assert!(
                l.metas.len() <= UNPACK_MAX_FRAGMENTS,
                "{len}: {} fragments",
                l.metas.len()
            );
            let mut next = 0u64;
            let mut pages = std::collections::HashSet::new();
            for m in &l.metas {
                assert_eq!(m.dst_off, next, "fragments in destination order, no gap");
                next += u64::from(m.len);
                let page = m.src_off as usize / UNPACK_PAGE;
                assert_eq!(
                    (m.src_off as usize + m.len as usize - 1) / UNPACK_PAGE,
                    page
                );
                assert!(pages.insert(page), "one fragment per page");
                if min == 4096 && m.len == 4096 {
                    assert_eq!(m.src_off as usize % UNPACK_PAGE, 0);
                }
            }
            assert_eq!(next, len as u64);
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            let mut bounce = vec![0u8; l.bounce_len];
            assert_eq!(scatter(&l.metas, &data, &mut bounce).unwrap(), len);
            let mut back = vec![0u8; len];
            assert_eq!(apply_load_metas(&l.metas, &bounce, &mut back).unwrap(), len);
            assert_eq!(back, data);
        }
        // Pages really are shuffled.
        let l = synthetic_layout(1 << 20, 4096, 1);
        assert!(l.metas.windows(2).any(|w| w[1].src_off < w[0].src_off));
    }

    #[test]
    fn slots_read_back_what_was_stored() {
        let layout = std::alloc::Layout::new::<NetUnpackMeta>();
        // SAFETY: non-zero size; all-zero bytes are a valid NetUnpackMeta.
        let meta = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<NetUnpackMeta>();
        assert!(!meta.is_null());
        // SAFETY: `meta` is our live allocation; no one else touches it.
        unsafe {
            (*meta).mem[3][0] = fragment(4096, 10, 0);
            (*meta).mem[3][1] = fragment(100, 5, 10);
            (*meta).cnt[3] = 2;
            let got = read_slot(meta, 3).unwrap();
            assert_eq!(got.len(), 2);
            assert_eq!(got[1], fragment(100, 5, 10));
            assert!(read_slot(meta, 0).unwrap().is_empty());
            assert_eq!(read_slot(meta, 16), Err(UnpackError::BadSlot(16)));
            (*meta).cnt[5] = 4096;
            assert!(matches!(
                read_slot(meta, 5),
                Err(UnpackError::TooManyFragments { .. })
            ));
            std::alloc::dealloc(meta.cast(), layout);
        }
    }

    #[test]
    fn gpu_copies_keep_every_fragment_and_refuse_writes_past_the_receive() {
        let l = synthetic_layout(3 << 20, 2048, 7);
        let copies = gpu_copies(&l.metas, 3 << 20).unwrap();
        assert_eq!(copies.len(), l.metas.len());
        for (c, m) in copies.iter().zip(&l.metas) {
            assert_eq!((c.src_off, c.len, c.dst_off), (m.src_off, m.len, m.dst_off));
        }
        // A receive buffer one byte short of the message: the last fragment is refused by index.
        let last = l.metas.len() - 1;
        assert_eq!(
            gpu_copies(&l.metas, (3 << 20) - 1).unwrap_err(),
            UnpackError::DestinationOutOfRange {
                index: last,
                dst_off: l.metas[last].dst_off,
                len: l.metas[last].len,
                dst_len: (3 << 20) - 1,
            }
        );
        assert!(gpu_copies(&[], 0).unwrap().is_empty());
    }

    #[test]
    fn out_of_range_fragments_are_refused_before_any_copy() {
        let bounce = vec![1u8; 8192];
        let mut dst = vec![0u8; 100];
        let bad_dst = [fragment(0, 10, 95)];
        assert!(matches!(
            apply_load_metas(&bad_dst, &bounce, &mut dst),
            Err(UnpackError::DestinationOutOfRange { index: 0, .. })
        ));
        let bad_src = [fragment(0, 10, 0), fragment(8190, 10, 10)];
        assert!(matches!(
            apply_load_metas(&bad_src, &bounce, &mut dst),
            Err(UnpackError::SourceOutOfRange { index: 1, .. })
        ));
        assert_eq!(dst, vec![0u8; 100], "nothing copied when a fragment is bad");
        let overflow = [fragment(0, 1, u64::MAX)];
        assert!(apply_load_metas(&overflow, &bounce, &mut dst).is_err());
        assert!(check_count(2049).is_err());
        assert_eq!(check_count(2048), Ok(2048));
    }
}
