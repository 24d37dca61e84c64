// Pattern fill and verify, compiled at run time by NVRTC (see cuda.rs).
// pattern_word must stay identical to pattern.rs: byte b of a message is byte b % 8 (little
// endian) of pattern_word(seed, b / 8).

typedef unsigned long long u64;
typedef unsigned char u8;

__device__ __forceinline__ u64 pattern_word(u64 seed, u64 word_index) {
    u64 z = seed + (word_index + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Calls f(at, v, whole) for each pattern word overlapping message bytes
// byte_offset..byte_offset + len that falls to this thread (a grid-stride loop): `at` is the
// absolute message offset of the word's first byte, `v` the word, and `whole` says that all 8 of
// its bytes are in the range and that their address in `base` (which holds message byte
// byte_offset) is 8-aligned, so the word may be accessed as one u64.
template <typename F>
__device__ __forceinline__ void for_each_pattern_word(const u8* base, u64 len, u64 seed,
                                                      u64 byte_offset, F f) {
    const u64 end = byte_offset + len;
    const u64 first_word = byte_offset / 8;
    const u64 words = (end + 7) / 8 - first_word;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const u64 w = first_word + i;
        const u64 at = w * 8;  // absolute offset of the word's first byte
        const u8* p = base + (at - byte_offset);  // may lie before base for the head word: not whole then
        f(at, pattern_word(seed, w), at >= byte_offset && at + 8 <= end && (((u64)p) & 7) == 0);
    }
}

// dst points at the byte whose absolute message offset is byte_offset; len bytes are written.
extern "C" __global__ void tcpx_fill_pattern(u8* dst, u64 len, u64 seed, u64 byte_offset) {
    const u64 end = byte_offset + len;
    for_each_pattern_word(dst, len, seed, byte_offset, [&](u64 at, u64 v, bool whole) {
        if (whole) {
            *(u64*)(dst + (at - byte_offset)) = v;
        } else {
            for (int b = 0; b < 8; ++b) {
                const u64 a = at + b;
                if (a >= byte_offset && a < end) dst[a - byte_offset] = (u8)(v >> (8 * b));
            }
        }
    });
}

// Writes into *first_bad the lowest index into src whose byte differs from the pattern; the
// caller sets *first_bad to ~0 before the launch.
extern "C" __global__ void tcpx_verify_pattern(const u8* src, u64 len, u64 seed, u64 byte_offset,
                                               u64* first_bad) {
    const u64 end = byte_offset + len;
    for_each_pattern_word(src, len, seed, byte_offset, [&](u64 at, u64 v, bool whole) {
        if (whole) {
            const u64 got = *(const u64*)(src + (at - byte_offset));
            if (got != v) {
                int b = 0;
                while (((got >> (8 * b)) & 0xff) == ((v >> (8 * b)) & 0xff)) ++b;
                atomicMin(first_bad, at + b - byte_offset);
            }
        } else {
            for (int b = 0; b < 8; ++b) {
                const u64 a = at + b;
                if (a >= byte_offset && a < end && src[a - byte_offset] != (u8)(v >> (8 * b))) {
                    atomicMin(first_bad, a - byte_offset);
                    break;
                }
            }
        }
    });
}

// TCPX receive unpack: the NIC scattered a message over pages of a bounce buffer; entry i says
// "copy len bytes from bounce + src_off to dst + dst_off" (the plugin's loadMeta, 16 bytes).
// One block per entry; 8-byte copies when both ends are 8-aligned, else bytes.
struct UnpackCopy {
    unsigned int src_off;
    unsigned int len;
    u64 dst_off;
};

extern "C" __global__ void tcpx_unpack(const u8* bounce, u8* dst, const UnpackCopy* copies, u64 count) {
    for (u64 e = blockIdx.x; e < count; e += gridDim.x) {
        const UnpackCopy c = copies[e];
        const u8* s = bounce + c.src_off;
        u8* d = dst + c.dst_off;
        const u64 n = c.len;
        if ((((u64)s) & 7) == 0 && (((u64)d) & 7) == 0) {
            const u64 words = n / 8;
            for (u64 i = threadIdx.x; i < words; i += blockDim.x) ((u64*)d)[i] = ((const u64*)s)[i];
            for (u64 i = words * 8 + threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
        } else {
            for (u64 i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
        }
    }
}

// Adds to *wrong the number of bytes of src that differ from the pattern (the caller zeroes it).
extern "C" __global__ void tcpx_count_pattern_errors(const u8* src, u64 len, u64 seed, u64 byte_offset,
                                                     u64* wrong) {
    const u64 end = byte_offset + len;
    u64 mine = 0;
    for_each_pattern_word(src, len, seed, byte_offset, [&](u64 at, u64 v, bool whole) {
        if (whole) {
            const u64 diff = *(const u64*)(src + (at - byte_offset)) ^ v;
            if (diff != 0) {
                for (int b = 0; b < 8; ++b) mine += ((diff >> (8 * b)) & 0xff) != 0;
            }
        } else {
            for (int b = 0; b < 8; ++b) {
                const u64 a = at + b;
                if (a >= byte_offset && a < end && src[a - byte_offset] != (u8)(v >> (8 * b))) ++mine;
            }
        }
    });
    if (mine != 0) atomicAdd(wrong, mine);
}

// TCPX receive unpack for the data path: a group of UNPACK_GROUP threads per fragment (real
// fragments are at most a 4 KiB page, so a whole block per fragment leaves most threads idle, and
// one warp per fragment leaves each lane a long chain of dependent loads when a receive holds only
// a few hundred fragments), copies as wide as the alignment of both ends allows (16 or 8 bytes, or
// 8-byte funnel shifts when the two ends are misaligned to each other), four loads in flight per
// thread before the stores. The host launches THREADS / UNPACK_GROUP groups per block
// (`Stream::unpack_raw`); the two must agree.
#define UNPACK_GROUP 128

struct alignas(16) V16 {
    u64 a;
    u64 b;
};

template <typename T>
__device__ __forceinline__ void group_copy(const u8* s, u8* d, u64 n, unsigned lane) {
    const u64 G = UNPACK_GROUP;
    const u64 v = n / sizeof(T);
    const T* sv = (const T*)s;
    T* dv = (T*)d;
    u64 i = lane;
    for (; i + 3 * G < v; i += 4 * G) {
        const T x0 = sv[i], x1 = sv[i + G], x2 = sv[i + 2 * G], x3 = sv[i + 3 * G];
        dv[i] = x0;
        dv[i + G] = x1;
        dv[i + 2 * G] = x2;
        dv[i + 3 * G] = x3;
    }
    for (; i < v; i += G) dv[i] = sv[i];
    for (u64 b = v * sizeof(T) + lane; b < n; b += G) d[b] = s[b];
}

// Source and destination misaligned relative to each other (the NIC's fragments start anywhere
// in their page and land back to back in the message): a few single-byte stores align the
// destination to 8 bytes, then every aligned 8-byte store is built from the two aligned source
// words that hold its bytes (a funnel shift). Reading a whole aligned word that holds a wanted
// byte never leaves the page that byte is in, so it stays inside the bounce buffer.
__device__ __forceinline__ void group_copy_shifted(const u8* s, u8* d, u64 n, unsigned lane) {
    const u64 G = UNPACK_GROUP;
    u64 head = (8 - (((u64)d) & 7)) & 7;
    if (head > n) head = n;
    if (lane < head) d[lane] = s[lane];
    s += head;
    d += head;
    n -= head;
    const u64 words = n / 8;
    const unsigned shift = (unsigned)(((u64)s) & 7);
    const u64* sw = (const u64*)(s - shift);
    u64* dw = (u64*)d;
    u64 i = lane;
    if (shift == 0) {
        for (; i < words; i += G) dw[i] = sw[i];
    } else {
        const unsigned r = shift * 8, l = 64 - r;
        for (; i + 3 * G < words; i += 4 * G) {
            const u64 a0 = sw[i], a1 = sw[i + 1], b0 = sw[i + G], b1 = sw[i + G + 1];
            const u64 c0 = sw[i + 2 * G], c1 = sw[i + 2 * G + 1];
            const u64 e0 = sw[i + 3 * G], e1 = sw[i + 3 * G + 1];
            dw[i] = (a0 >> r) | (a1 << l);
            dw[i + G] = (b0 >> r) | (b1 << l);
            dw[i + 2 * G] = (c0 >> r) | (c1 << l);
            dw[i + 3 * G] = (e0 >> r) | (e1 << l);
        }
        for (; i < words; i += G) dw[i] = (sw[i] >> r) | (sw[i + 1] << l);
    }
    for (u64 b = words * 8 + lane; b < n; b += G) d[b] = s[b];
}

extern "C" __global__ void tcpx_unpack_warp(const u8* bounce, u8* dst, const UnpackCopy* copies,
                                            u64 count) {
    const unsigned lane = threadIdx.x % UNPACK_GROUP;
    const u64 groups = blockDim.x / UNPACK_GROUP;
    const u64 stride = (u64)gridDim.x * groups;
    for (u64 e = (u64)blockIdx.x * groups + threadIdx.x / UNPACK_GROUP; e < count; e += stride) {
        const UnpackCopy c = copies[e];
        const u8* s = bounce + c.src_off;
        u8* d = dst + c.dst_off;
        const u64 align = ((u64)s) | ((u64)d);
        if ((align & 15) == 0) {
            group_copy<V16>(s, d, c.len, lane);
        } else if ((align & 7) == 0) {
            group_copy<u64>(s, d, c.len, lane);
        } else {
            group_copy_shifted(s, d, c.len, lane);
        }
    }
}
