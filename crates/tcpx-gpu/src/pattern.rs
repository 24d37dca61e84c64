//! The verification pattern shared by the host and the GPU.
//!
//! Byte `b` of a transfer (counted from the start of the whole message) is byte `b % 8`, little
//! endian, of [`pattern_word`]`(seed, b / 8)`. Because the pattern is a function of the absolute
//! offset, any piece of a message can be filled or checked on its own (one socket per piece, one
//! staging slot per piece) and the pieces still agree. The CUDA kernels in `kernels.cu` compute the
//! very same function; `tests::gpu_and_host_agree` in the GPU tests holds them to it.

/// The `word_index + 1`-th output of splitmix64 started at `seed`: cheap, stateless, and every bit
/// depends on both arguments, so a byte that lands at the wrong offset or in the wrong message
/// (another seed) is caught.
#[inline]
pub fn pattern_word(seed: u64, word_index: u64) -> u64 {
    let mut z = seed.wrapping_add(
        word_index
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern byte at absolute offset `byte`.
#[inline]
pub fn pattern_byte(seed: u64, byte: u64) -> u8 {
    (pattern_word(seed, byte / 8) >> ((byte % 8) * 8)) as u8
}

/// Fills `buf` with the pattern bytes `byte_offset .. byte_offset + buf.len()`.
pub fn fill_pattern(buf: &mut [u8], seed: u64, byte_offset: u64) {
    // Head: bytes up to the next 8-byte boundary of the absolute offset.
    let head = (((8 - byte_offset % 8) % 8) as usize).min(buf.len());
    for (i, b) in buf[..head].iter_mut().enumerate() {
        *b = pattern_byte(seed, byte_offset + i as u64);
    }
    let rest = &mut buf[head..];
    let first_word = (byte_offset + head as u64) / 8;
    let tail_word = first_word + (rest.len() / 8) as u64;
    let mut chunks = rest.chunks_exact_mut(8);
    for (i, chunk) in (&mut chunks).enumerate() {
        chunk.copy_from_slice(&pattern_word(seed, first_word + i as u64).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let word = pattern_word(seed, tail_word).to_le_bytes();
        tail.copy_from_slice(&word[..tail.len()]);
    }
}

/// Checks that `buf` holds the pattern bytes `byte_offset .. byte_offset + buf.len()`; on a
/// mismatch returns the index into `buf` of the first wrong byte.
pub fn verify_pattern(buf: &[u8], seed: u64, byte_offset: u64) -> Option<usize> {
    let head = (((8 - byte_offset % 8) % 8) as usize).min(buf.len());
    for (i, &b) in buf[..head].iter().enumerate() {
        if b != pattern_byte(seed, byte_offset + i as u64) {
            return Some(i);
        }
    }
    let first_word = (byte_offset + head as u64) / 8;
    let rest = &buf[head..];
    let mut chunks = rest.chunks_exact(8);
    for (i, chunk) in (&mut chunks).enumerate() {
        let want = pattern_word(seed, first_word + i as u64).to_le_bytes();
        if chunk != want {
            let j = chunk
                .iter()
                .zip(want)
                .position(|(a, b)| *a != b)
                .unwrap_or(0);
            return Some(head + i * 8 + j);
        }
    }
    let tail = chunks.remainder();
    let want = pattern_word(seed, first_word + (rest.len() / 8) as u64).to_le_bytes();
    let at = head + rest.len() - tail.len();
    tail.iter()
        .zip(want)
        .position(|(a, b)| *a != b)
        .map(|j| at + j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // splitmix64 seeded with 0: the first outputs as published with the algorithm.
        assert_eq!(pattern_word(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(pattern_word(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_ne!(pattern_word(1, 0), pattern_word(0, 0));
    }

    #[test]
    fn pieces_at_any_offset_match_the_whole() {
        let mut whole = vec![0u8; 1000];
        fill_pattern(&mut whole, 42, 0);
        for (start, len) in [
            (0, 1),
            (1, 7),
            (3, 13),
            (8, 8),
            (9, 0),
            (5, 995),
            (992, 8),
            (17, 64),
        ] {
            let mut piece = vec![0u8; len];
            fill_pattern(&mut piece, 42, start as u64);
            assert_eq!(piece, &whole[start..start + len], "piece {start}+{len}");
            assert_eq!(
                verify_pattern(&whole[start..start + len], 42, start as u64),
                None
            );
        }
        for (i, &b) in whole.iter().enumerate() {
            assert_eq!(b, pattern_byte(42, i as u64));
        }
    }

    #[test]
    fn verify_names_the_first_wrong_byte() {
        let mut buf = vec![0u8; 300];
        fill_pattern(&mut buf, 7, 5);
        for bad in [0usize, 2, 3, 4, 10, 150, 297, 299] {
            let mut b = buf.clone();
            b[bad] ^= 0x40;
            if bad + 1 < b.len() {
                b[bad + 1] ^= 1; // a later error must not hide the first
            }
            assert_eq!(verify_pattern(&b, 7, 5), Some(bad), "flip at {bad}");
        }
        assert_eq!(verify_pattern(&buf, 8, 5), Some(0), "another seed");
        assert_eq!(
            verify_pattern(&buf, 7, 6).map(|i| i < 8),
            Some(true),
            "shifted by one"
        );
        assert_eq!(verify_pattern(&[], 7, 5), None);
    }
}
