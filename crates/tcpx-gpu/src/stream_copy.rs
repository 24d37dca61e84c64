//! A copy whose stores bypass the cache (non-temporal, "streaming" stores): the destination's
//! lines are written to memory without first being read into the cache. Copying bytes a socket
//! read delivered into a small cache-resident buffer on into a large buffer that is not in the
//! cache costs one write of the destination this way, where an ordinary copy (the kernel's
//! `copy_to_user` included) reads each destination line in before writing it.

/// Whether [`copy_streaming`] uses streaming stores on this build's CPU (SSE2, every x86-64);
/// elsewhere it is an ordinary copy, which saves nothing.
pub const STREAMING_STORES: bool = cfg!(target_arch = "x86_64");

/// Copies `src` into `dst` (the shorter length of the two) with streaming stores where the CPU has
/// them (SSE2, every x86-64), and an ordinary copy elsewhere. The bytes are in memory, visible to
/// other threads through the usual release/acquire, when it returns.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LINE: usize = 64;
        let head = dst.as_ptr().align_offset(16).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let body = (n - head) / LINE * LINE;
        let (d, s) = (
            dst[head..head + body].as_mut_ptr(),
            src[head..head + body].as_ptr(),
        );
        let mut i = 0;
        while i < body {
            // SAFETY: `i + 64 <= body`, so the four 16-byte loads read inside `src[head..head +
            // body]` and the four stores write inside `dst[head..head + body]`; `d + i` is 16-byte
            // aligned (`head` aligned `d`, and `i` is a multiple of 64), as `_mm_stream_si128`
            // requires; unaligned loads have no alignment requirement; SSE2 is part of x86-64.
            unsafe {
                let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
                let e = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
                _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
                _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
                _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
            }
            i += LINE;
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
        // SAFETY: a store fence has no preconditions; it orders the streaming stores above
        // before any later store (their weak ordering would otherwise let a flag written after
        // this copy become visible before the bytes).
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::copy_streaming;

    #[test]
    fn every_alignment_and_length_is_copied_exactly_and_nothing_past_it() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..40 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 3000] {
                let mut dst = vec![0xeeu8; 4096 + 64];
                copy_streaming(&mut dst[off..off + len], &src[off % 13..off % 13 + len]);
                assert_eq!(
                    &dst[off..off + len],
                    &src[off % 13..off % 13 + len],
                    "off {off} len {len}"
                );
                assert!(
                    dst[..off].iter().all(|&b| b == 0xee),
                    "off {off} len {len}: before"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0xee),
                    "off {off} len {len}: after"
                );
            }
        }
    }

    #[test]
    fn unequal_lengths_copy_the_shorter() {
        let mut dst = [0u8; 100];
        copy_streaming(&mut dst, &[9u8; 70]);
        assert!(dst[..70].iter().all(|&b| b == 9) && dst[70..].iter().all(|&b| b == 0));
        let mut short = [0u8; 10];
        copy_streaming(&mut short, &[5u8; 300]);
        assert_eq!(short, [5u8; 10]);
    }
}
