// Matmuls with the CPU's arithmetic (appended to kernels.cu; the host emulates every kernel
// here line for line in `emulate.rs`, and its tests check the emulation against the CPU's
// `QWeight::matmul` bit for bit).
//
// Quantized weights: the activations are quantized on the device to the 8-bit blocks the CPU
// uses for that weight type (Q8_0, Q8_1 or Q8_K, `quantize_q8` / `quantize_q8k`, the CPU's
// `QuantizedRows::quantize`); per weight block the exact integer dot products (`dp4a`; lanes
// may split them any way: integers add exactly), then one float expression per block with the
// CPU's operations (`__fmul_rn` / `__fadd_rn`: nothing contracted into an fma), written to
// shared memory, and each output's terms added in block order from 0 by one thread (`acc +
// term`, as the CPU's `block_update`). The work split depends on (n, k) and the format alone.
//
// Weights are repacked at upload (`repack.rs`) into three regions, each block's part 16-byte
// aligned: A, the quants (QB bytes per block: one 16-byte load per lane and part); B, 16 bytes
// of per-block metadata (k-quant scales); C, per-block scalars (f16 scales, Q5 high bits,
// MXFP4's exponent byte).
//
// Float weights (F32 / F16 / BF16): one warp per output, element t in lane t % 32 by fused
// multiply-adds in k order, the lanes summed in the CPU's tree (`scalar::dot_by`) and the
// k % 32 tail added in order.

#define MQ_THREADS 128
#define MQ_RO 4
#define MQ_UNITS 4
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The CPU's `round_even` (nearest, ties to even, saturated to i8; NaN gives 0).
__device__ __forceinline__ int round_even_i8(float v) {
    int q = __float2int_rn(v);
    return q < -128 ? -128 : (q > 127 ? 127 : q);
}

__device__ __forceinline__ float f16_round(float v) { return half_to_float(float_to_half(v)); }

// One Q8_0 (kind 0) or Q8_1 (kind 1) block of 32 activations, as `quantize_q8_block`: lane l
// of a warp holds element l in `v` and writes its quant at `*q`; lane 0 writes the block's d at
// `*d` and its s (Q8_1: f16(sum * d)) at `*s` or its integer sum (Q8_0) at `*sum_out`.
__device__ __forceinline__ void q8_block(float v, int lane, int kind, signed char* q, float* d,
                                         float* s, int* sum_out) {
    float a = fmaxf(0.0f, fabsf(v));
    for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, off));
    float id = a != 0.0f ? 127.0f / a : 0.0f;
    int qi = round_even_i8(__fmul_rn(v, id));
    *q = (signed char)qi;
    int sum = qi;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, off);
    if (lane == 0) {
        float dd = a / 127.0f;
        *d = f16_round(dd);
        if (kind == 1) {
            *s = f16_round(__fmul_rn((float)sum, dd));
        } else {
            *sum_out = sum;
        }
    }
}

// One Q8_K block of 256 activations, as `quantize_q8k_block`: lane l of a warp holds elements
// 8l .. 8l + 8 in `v`. The scale comes from the element of largest magnitude, the first of
// equal ones. Writes the lane's quants at `qs` (the block's element 8l), the sums of every 16
// quants at `sums` (the block's first), and d at `*d`.
__device__ __forceinline__ void q8k_block(const float* v, int lane, signed char* qs, int* sums,
                                          float* d) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float av = fabsf(v[j]);
        if (av > amax) {
            amax = av;
            mx = v[j];
            idx = lane * 8 + j;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float oa = __shfl_xor_sync(FULL_MASK, amax, off);
        float om = __shfl_xor_sync(FULL_MASK, mx, off);
        int oi = __shfl_xor_sync(FULL_MASK, idx, off);
        if (oa > amax || (oa == amax && oi < idx)) {
            amax = oa;
            mx = om;
            idx = oi;
        }
    }
    int q[8];
    float iscale = amax == 0.0f ? 0.0f : -127.0f / mx;
    int s8 = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        q[j] = amax == 0.0f ? 0 : round_even_i8(__fmul_rn(iscale, v[j]));
        s8 += q[j];
    }
    u32 lo = (u32)(q[0] & 0xFF) | ((u32)(q[1] & 0xFF) << 8) | ((u32)(q[2] & 0xFF) << 16) | ((u32)(q[3] & 0xFF) << 24);
    u32 hi = (u32)(q[4] & 0xFF) | ((u32)(q[5] & 0xFF) << 8) | ((u32)(q[6] & 0xFF) << 16) | ((u32)(q[7] & 0xFF) << 24);
    *(uint2*)qs = make_uint2(lo, hi);
    int s16 = s8 + __shfl_xor_sync(FULL_MASK, s8, 1);
    if (lane % 2 == 0) sums[lane / 2] = s16;
    if (lane == 0) *d = amax == 0.0f ? 0.0f : 1.0f / iscale;
}

// Q8_0 (kind 0: sums = the block's integer sum) or Q8_1 (kind 1: s = f16(sum * d)) blocks of
// 32 activations, as `quantize_q8_block`: one warp per block. Grid (ceil(k / 32 / 8), m),
// 256 threads.
extern "C" __global__ void quantize_q8(const float* x, int k, int kind, signed char* qs, float* d,
                                      float* s, int* sums) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int nb = k / 32;
    int b = blockIdx.x * (blockDim.x / WARP) + warp;
    int r = blockIdx.y;
    if (b >= nb) return;
    long e = (long)r * k + b * 32 + lane;
    q8_block(x[e], lane, kind, qs + e, d + (long)r * nb + b, s + (long)r * nb + b,
             sums + (long)r * nb + b);
}

// Q8_K blocks of 256 activations, as `quantize_q8k_block`: one warp per block, lane l holding
// elements 8l .. 8l + 8. The scale comes from the element of largest magnitude, the first of
// equal ones. Writes the quants, d, and the sums of every 16 quants. Grid (ceil(k / 256 / 8),
// m), 256 threads.
extern "C" __global__ void quantize_q8k(const float* x, int k, signed char* qs, float* d, int* sums) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int nb = k / 256;
    int b = blockIdx.x * (blockDim.x / WARP) + warp;
    int r = blockIdx.y;
    if (b >= nb) return;
    long e0 = (long)r * k + b * 256 + lane * 8;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = x[e0 + j];
    q8k_block(v, lane, qs + e0, sums + (long)r * (k / 16) + b * 16, d + (long)r * nb + b);
}

// Four bits (bit i of `v`) to bit 4 of byte i.
__device__ __forceinline__ int bits_to_b4(u32 v) {
    return (int)(((v & 1u) << 4) | ((v & 2u) << 11) | ((v & 4u) << 18) | ((v & 8u) << 25));
}

// Quants per block part (QB / P bytes are 16 for every format), parts per block P, bytes of
// region A per block QB, of region B MB, of region C SB (see repack.rs).
template <int T> struct Fmt;
template <> struct Fmt<W_Q8_0> { enum { P = 2, QB = 32, MB = 0, SB = 2, BLOCK = 32 }; };
template <> struct Fmt<W_Q4_0> { enum { P = 1, QB = 16, MB = 0, SB = 2, BLOCK = 32 }; };
template <> struct Fmt<W_Q4_1> { enum { P = 1, QB = 16, MB = 0, SB = 4, BLOCK = 32 }; };
template <> struct Fmt<W_Q5_0> { enum { P = 1, QB = 16, MB = 0, SB = 8, BLOCK = 32 }; };
template <> struct Fmt<W_Q5_1> { enum { P = 1, QB = 16, MB = 0, SB = 8, BLOCK = 32 }; };
template <> struct Fmt<W_Q4_K> { enum { P = 8, QB = 128, MB = 16, SB = 0, BLOCK = 256 }; };
template <> struct Fmt<W_Q5_K> { enum { P = 8, QB = 160, MB = 16, SB = 0, BLOCK = 256 }; };
template <> struct Fmt<W_Q6_K> { enum { P = 8, QB = 192, MB = 16, SB = 2, BLOCK = 256 }; };
template <> struct Fmt<W_MXFP4> { enum { P = 1, QB = 16, MB = 0, SB = 1, BLOCK = 32 }; };

__device__ __forceinline__ int4 ld16(const void* p) { return *(const int4*)p; }

// MXFP4's values (`kvalues_mxfp4`, doubled E2M1) as bytes: codes 0..7 in the first pair of
// words, 8..15 in the second.
#define KV_MXFP4_LO0 0x03020100u
#define KV_MXFP4_LO1 0x0C080604u
#define KV_MXFP4_HI0 0xFDFEFF00u
#define KV_MXFP4_HI1 0xF4F8FAFCu

// Four MXFP4 codes (the low nibbles of the bytes of `q`, each 0..15) to their i8 values, byte
// for byte: `__byte_perm` (byte n of the result is byte `(s >> 4n) & 7` of the pair y:x; the
// selector holds the four codes' low three bits) looks each up in the table of codes 0..7 and
// in that of 8..15, and the code's bit 3 picks one.
__device__ __forceinline__ int mxfp4_values(u32 q) {
    u32 t = q | (q >> 4);
    u32 sel = ((t & 0xFFu) | ((t >> 8) & 0xFF00u)) & 0x7777u;
    u32 pos = __byte_perm(KV_MXFP4_LO0, KV_MXFP4_LO1, sel);
    u32 neg = __byte_perm(KV_MXFP4_HI0, KV_MXFP4_HI1, sel);
    u32 mask = ((q & 0x08080808u) >> 3) * 0xFFu;
    return (int)((pos & ~mask) | (neg & mask));
}

// The 6-bit scale and min of sub-block j of the 12 scale bytes at `q` (as integers).
__device__ __forceinline__ void scale_min_i(int j, const u8* q, int* sc, int* mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Part p of a weight block, unpacked once for all the rows of a tile: 16 quants per `lo` /
// `hi` (bytes, the stored offset not subtracted), the two scales and mins of its sub-blocks
// (k-quants) and two indices (Q4_K / Q5_K: c and h; Q6_K: the two groups of 16).
struct WPart {
    int lo[4], hi[4];
    int s0, s1, m0, m1, i0, i1;
};

template <int T>
__device__ __forceinline__ void unpack(const u8* A, const u8* B, const u8* C, long blk, int p, WPart& w) {
    typedef Fmt<T> F;
    const u8* qa = A + blk * F::QB;
    if (T == W_Q8_0) {
        int4 q = ld16(qa + 16 * p);
        w.lo[0] = q.x; w.lo[1] = q.y; w.lo[2] = q.z; w.lo[3] = q.w;
    } else if (T == W_MXFP4) {
        // Elements 0..15 in the low nibbles, 16..31 in the high ones, as Q4_0; their values.
        int4 q = ld16(qa);
        int v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w.lo[j] = mxfp4_values((u32)v[j] & 0x0F0F0F0Fu);
            w.hi[j] = mxfp4_values(((u32)v[j] >> 4) & 0x0F0F0F0Fu);
        }
    } else if (T == W_Q4_0 || T == W_Q4_1 || T == W_Q5_0 || T == W_Q5_1) {
        int4 q = ld16(qa);
        int v[4] = {q.x, q.y, q.z, q.w};
        u32 qh = (T == W_Q5_0 || T == W_Q5_1) ? *(const u32*)(C + blk * 8 + 4) : 0u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w.lo[j] = v[j] & 0x0F0F0F0F;
            w.hi[j] = (v[j] >> 4) & 0x0F0F0F0F;
            if (T == W_Q5_0 || T == W_Q5_1) {
                w.lo[j] |= bits_to_b4(qh >> (4 * j));
                w.hi[j] |= bits_to_b4(qh >> (16 + 4 * j));
            }
        }
    } else if (T == W_Q4_K || T == W_Q5_K) {
        // Part p: bytes 16p .. 16p + 16 of the nibbles, sub-blocks 2c (low nibbles) and 2c + 1
        // (high), elements 64c + 16h + i and 64c + 32 + 16h + i.
        int c = p / 2, h = p % 2;
        int4 q = ld16(qa + (T == W_Q5_K ? 32 : 0) + 16 * p);
        int v[4] = {q.x, q.y, q.z, q.w};
        int hv[4] = {0, 0, 0, 0};
        if (T == W_Q5_K) {
            int4 qh = ld16(qa + 16 * h);
            hv[0] = qh.x; hv[1] = qh.y; hv[2] = qh.z; hv[3] = qh.w;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w.lo[j] = v[j] & 0x0F0F0F0F;
            w.hi[j] = (v[j] >> 4) & 0x0F0F0F0F;
            if (T == W_Q5_K) {
                w.lo[j] |= (int)((((u32)hv[j] >> (2 * c)) & 0x01010101u) << 4);
                w.hi[j] |= (int)((((u32)hv[j] >> (2 * c + 1)) & 0x01010101u) << 4);
            }
        }
        const u8* sc12 = B + blk * 16 + 4;
        scale_min_i(2 * c, sc12, &w.s0, &w.m0);
        scale_min_i(2 * c + 1, sc12, &w.s1, &w.m1);
        w.i0 = c;
        w.i1 = h;
    } else if (T == W_Q6_K) {
        // Part p = 4n + 2hh + s: low-nibble bytes 16p .. 16p + 16 and high bits at 128 + 32n +
        // 16s; groups of 16 g_lo = 8n + 2hh + s (low nibbles) and g_hi = g_lo + 4 (high).
        int n = p / 4, hh = (p / 2) % 2, s = p % 2;
        int4 ql = ld16(qa + 16 * p);
        int4 qh = ld16(qa + 128 + 32 * n + 16 * s);
        int lw[4] = {ql.x, ql.y, ql.z, ql.w};
        int hw[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w.lo[j] = (lw[j] & 0x0F0F0F0F) | (int)((((u32)hw[j] >> (2 * hh)) & 0x03030303u) << 4);
            w.hi[j] = ((lw[j] >> 4) & 0x0F0F0F0F) | (int)((((u32)hw[j] >> (2 * hh + 4)) & 0x03030303u) << 4);
        }
        w.i0 = 8 * n + 2 * hh + s;
        w.i1 = w.i0 + 4;
        const signed char* sc = (const signed char*)(B + blk * 16);
        w.s0 = sc[w.i0];
        w.s1 = sc[w.i1];
    }
}

__device__ __forceinline__ int dot16(const int* w, int4 a) {
    return dp4a(w[0], a.x, dp4a(w[1], a.y, dp4a(w[2], a.z, dp4a(w[3], a.w, 0))));
}

// The integer parts of an unpacked part against one activation row (`aq` at the block's first
// quant, `asum` at its first integer sum): `*si` the part's share of sumi, `*sm` of summ
// (k-quants; 0 elsewhere). The block's parts' shares add up to the CPU's `block_ints`.
template <int T>
__device__ __forceinline__ void row_ints(const WPart& w, int p, const signed char* aq, const int* asum,
                                         int* si, int* sm) {
    *sm = 0;
    if (T == W_Q8_0) {
        *si = dot16(w.lo, ld16(aq + 16 * p));
    } else if (T == W_Q4_0 || T == W_Q4_1 || T == W_Q5_0 || T == W_Q5_1 || T == W_MXFP4) {
        int s = dot16(w.lo, ld16(aq)) + dot16(w.hi, ld16(aq + 16));
        // Q4_0 / Q5_0: the stored offset (8 / 16) times the block's activation sum.
        if (T == W_Q4_0) s -= 8 * asum[0];
        if (T == W_Q5_0) s -= 16 * asum[0];
        *si = s;
    } else if (T == W_Q4_K || T == W_Q5_K) {
        int c = w.i0, h = w.i1;
        int d0 = dot16(w.lo, ld16(aq + 64 * c + 16 * h));
        int d1 = dot16(w.hi, ld16(aq + 64 * c + 32 + 16 * h));
        *si = w.s0 * d0 + w.s1 * d1;
        // The mins once per sub-block pair (the h == 0 part): the sums of its 16-element groups.
        if (h == 0) *sm = w.m0 * (asum[4 * c] + asum[4 * c + 1]) + w.m1 * (asum[4 * c + 2] + asum[4 * c + 3]);
    } else if (T == W_Q6_K) {
        int d0 = dot16(w.lo, ld16(aq + 16 * w.i0));
        int d1 = dot16(w.hi, ld16(aq + 16 * w.i1));
        *si = w.s0 * (d0 - 32 * asum[w.i0]) + w.s1 * (d1 - 32 * asum[w.i1]);
    }
}

// A weight block's float scales: `d` (MXFP4: `e8m0_half` of its exponent byte; and `m`: Q4_1 /
// Q5_1's min, the k-quants' dmin).
struct WScale {
    float d, m;
};

template <int T>
__device__ __forceinline__ WScale load_wscale(const u8* B, const u8* C, long blk) {
    WScale s;
    if (T == W_Q8_0 || T == W_Q4_0 || T == W_Q5_0) {
        s.d = half_to_float(*(const u16*)(C + blk * Fmt<T>::SB));
        s.m = 0.0f;
    } else if (T == W_MXFP4) {
        s.d = e8m0_half(C[blk]);
        s.m = 0.0f;
    } else if (T == W_Q4_1 || T == W_Q5_1) {
        u32 dm = *(const u32*)(C + blk * Fmt<T>::SB);
        s.d = half_to_float((u16)(dm & 0xFFFF));
        s.m = half_to_float((u16)(dm >> 16));
    } else if (T == W_Q4_K || T == W_Q5_K) {
        u32 dm = *(const u32*)(B + blk * 16);
        s.d = half_to_float((u16)(dm & 0xFFFF));
        s.m = half_to_float((u16)(dm >> 16));
    } else {
        s.d = half_to_float(*(const u16*)(C + blk * 2));
        s.m = 0.0f;
    }
    return s;
}

// The CPU's `block_update` expression for one block and one activation row (the integer
// kernels here and the tensor-core kernels of `mmt.cu` both use it).
template <int T>
__device__ __forceinline__ float block_expr(WScale w, int sumi, int summ, float dx, float sx) {
    if (T == W_Q8_0 || T == W_Q4_0 || T == W_Q5_0 || T == W_MXFP4) {
        return __fmul_rn(__fmul_rn((float)sumi, w.d), dx);
    } else if (T == W_Q4_1 || T == W_Q5_1) {
        return __fadd_rn(__fmul_rn(__fmul_rn((float)sumi, w.d), dx), __fmul_rn(w.m, sx));
    } else if (T == W_Q4_K || T == W_Q5_K) {
        return __fsub_rn(__fmul_rn(__fmul_rn(dx, w.d), (float)sumi), __fmul_rn(__fmul_rn(dx, w.m), (float)summ));
    } else {
        return __fmul_rn(__fmul_rn(dx, w.d), (float)sumi);
    }
}

// The float term of block `blk` for one activation row: the CPU's `block_update` expression.
template <int T>
__device__ __forceinline__ float block_term(const u8* B, const u8* C, long blk, int sumi, int summ,
                                            float dx, float sx) {
    return block_expr<T>(load_wscale<T>(B, C, blk), sumi, summ, dx, sx);
}

// y[r][o] (= or +=, `add`) for rows r < m, outputs o < n: the quantized product. Grid
// ceil(m / MR) * ceil(n / MQ_RO) blocks, the row tile fastest: the row tiles of one slice of
// outputs are neighbours, so they find its weights in L2. Block MQ_THREADS threads. k is split into chunks of CB blocks
// (CB = MQ_UNITS * MQ_THREADS / (MQ_RO * P), from the format alone): in a chunk, unit u of the
// MQ_RO * CB * P (output, block, part) units goes to thread u % MQ_THREADS, which unpacks the
// part's weights once for the tile's rows; a block's P parts are P neighbouring lanes of one
// warp, their integers added by shuffles; the part-0 lane writes
// the block's terms; then thread t < MR * MQ_RO adds its (row t / MQ_RO, output t % MQ_RO)
// terms in block order to its accumulator. `aq` / `ad` / `as` / `asum`: the quantized rows
// (k quants, k / BLOCK scales, k / 32 Q8_1 sums, k / 16 (Q8_K) or k / 32 (Q8_0) integer sums).
template <int T, int MR>
__device__ void mmq_body(const signed char* aq, const float* ad, const float* as, const int* asum,
                         int m, const u8* w, long b_off, long c_off, int n, int k, float* y, int add) {
    typedef Fmt<T> F;
    const int CB = MQ_UNITS * MQ_THREADS / (MQ_RO * F::P);
    // Rows of CB + 1 terms: the chain threads' reads fall in distinct banks.
    const int TS = CB + 1;
    __shared__ float terms[MR * MQ_RO * TS];
    const u8* A = w;
    const u8* B = w + b_off;
    const u8* C = w + c_off;
    int nb = k / F::BLOCK;
    int tiles = (m + MR - 1) / MR;
    int r0 = (blockIdx.x % tiles) * MR, o0 = (blockIdx.x / tiles) * MQ_RO;
    int nr = m - r0 < MR ? m - r0 : MR;
    int t = threadIdx.x;
    int sums_per_block = F::BLOCK == 256 ? 16 : 1;
    float acc = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += CB) {
#pragma unroll
        for (int it = 0; it < MQ_UNITS; it++) {
            int u = it * MQ_THREADS + t;
            int o = u / (CB * F::P);
            int rem = u % (CB * F::P);
            int cb = rem / F::P, p = rem % F::P;
            int b = b0 + cb;
            bool live = o0 + o < n && b < nb;
            long blk = (long)(o0 + o) * nb + b;
            WPart wp;
            if (live) unpack<T>(A, B, C, blk, p, wp);
#pragma unroll
            for (int r = 0; r < MR; r++) {
                if (r < nr) {
                    int si = 0, sm = 0;
                    if (live) {
                        long row = r0 + r;
                        row_ints<T>(wp, p, aq + row * k + (long)b * F::BLOCK,
                                    asum + row * (k / F::BLOCK) * sums_per_block + (long)b * sums_per_block,
                                    &si, &sm);
                    }
#pragma unroll
                    for (int off = F::P / 2; off > 0; off >>= 1) {
                        si += __shfl_xor_sync(FULL_MASK, si, off);
                        sm += __shfl_xor_sync(FULL_MASK, sm, off);
                    }
                    if (live && p == 0) {
                        long row = r0 + r;
                        float dx = ad[row * nb + b];
                        float sx = (T == W_Q4_1 || T == W_Q5_1) ? as[row * nb + b] : 0.0f;
                        terms[(r * MQ_RO + o) * TS + cb] = block_term<T>(B, C, blk, si, sm, dx, sx);
                    }
                }
            }
        }
        __syncthreads();
        if (t < MR * MQ_RO) {
            int r = t / MQ_RO, o = t % MQ_RO;
            int nc = nb - b0 < CB ? nb - b0 : CB;
            if (r < nr && o0 + o < n) {
                const float* tr = terms + (r * MQ_RO + o) * TS;
                for (int j = 0; j < nc; j++) acc = __fadd_rn(acc, tr[j]);
            }
        }
        __syncthreads();
    }
    if (t < MR * MQ_RO) {
        int r = t / MQ_RO, o = t % MQ_RO;
        if (r < nr && o0 + o < n) {
            float* yo = y + (long)(r0 + r) * n + o0 + o;
            *yo = add ? __fadd_rn(*yo, acc) : acc;
        }
    }
}

// Float weights: one warp per output (MQ_RO warps per block), MR rows at a time. Grid as
// mmq_body's. The CPU's `dot_by`: lane l adds elements c + l (c a multiple of 32 below
// 32 * floor(k / 32)) by fused multiply-adds in order; then (L[l] + L[l + 8]) + (L[l + 16] +
// L[l + 24]) for l < 8, h[l] = v[l] + v[l + 4], (h0 + h2) + (h1 + h3), then the tail in order.
template <int T, int MR>
__device__ void mmf_body(const float* x, int m, const u8* w, int n, int k, float* y, int add) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int tiles = (m + MR - 1) / MR;
    int o = (blockIdx.x / tiles) * MQ_RO + warp;
    int r0 = (blockIdx.x % tiles) * MR;
    int nr = m - r0 < MR ? m - r0 : MR;
    if (o >= n) return;
    int full = k / 32 * 32;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.0f;
    for (int c = 0; c < full; c += 32) {
        float wv;
        long e = (long)o * k + c + lane;
        if (T == W_F32) wv = ((const float*)w)[e];
        else if (T == W_F16) wv = half_to_float(((const u16*)w)[e]);
        else wv = bf16_to_float(((const u16*)w)[e]);
#pragma unroll
        for (int r = 0; r < MR; r++) {
            if (r < nr) acc[r] = fmaf(x[(long)(r0 + r) * k + c + lane], wv, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < MR; r++) {
        if (r < nr) {
            float v = acc[r];
            v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, 8));
            v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, 16));
            v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, 4));
            v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, 2));
            v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, 1));
            if (lane == 0) {
                const float* xr = x + (long)(r0 + r) * k;
                for (int e = full; e < k; e++) {
                    float wv;
                    long i = (long)o * k + e;
                    if (T == W_F32) wv = ((const float*)w)[i];
                    else if (T == W_F16) wv = half_to_float(((const u16*)w)[i]);
                    else wv = bf16_to_float(((const u16*)w)[i]);
                    v = fmaf(xr[e], wv, v);
                }
                float* yo = y + (long)(r0 + r) * n + o;
                *yo = add ? __fadd_rn(*yo, v) : v;
            }
        }
    }
}

// Mixture-of-Experts rows grouped by expert (`moe_group`'s order), each by its own expert's
// weight in one launch: grouped row p (blockIdx.y) is one row of `mmq_body<T, 1>` on the
// weight at wtab[gexp[p]] (every expert's matrix of one shape, kind and layout: the same
// b_off, c_off), its activations, scales, sums and output at row p's offsets. So each row gets
// the bits of a launch per expert (any row tile gives a row the same bits), with no host read
// of the experts' row counts. Grid (ceil(n / MQ_RO), rows); `add` is not taken.
template <int T>
__device__ void mmqe_body(const signed char* aq, const float* ad, const float* as, const int* asum,
                          const int* gexp, const unsigned long long* wtab, long b_off, long c_off,
                          int n, int k, float* y) {
    typedef Fmt<T> F;
    long p = blockIdx.y;
    long nb = k / F::BLOCK;
    long sums = nb * (F::BLOCK == 256 ? 16 : 1);
    const u8* w = (const u8*)wtab[gexp[p]];
    mmq_body<T, 1>(aq + p * k, ad + p * nb, as + p * nb, asum + p * sums, 1, w, b_off, c_off, n, k,
                   y + p * n, 0);
}

#define MMQ(name, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS) mmqe_##name(                        \
        const signed char* aq, const float* ad, const float* as, const int* asum,                 \
        const int* gexp, const unsigned long long* wtab, long b_off, long c_off, int n, int k,    \
        float* y) {                                                                               \
        mmqe_body<T>(aq, ad, as, asum, gexp, wtab, b_off, c_off, n, k, y);                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS) mmq1_##name(                        \
        const signed char* aq, const float* ad, const float* as, const int* asum, int m,          \
        const u8* w, long b_off, long c_off, int n, int k, float* y, int add) {                  \
        mmq_body<T, 1>(aq, ad, as, asum, m, w, b_off, c_off, n, k, y, add);                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS) mmq8_##name(                        \
        const signed char* aq, const float* ad, const float* as, const int* asum, int m,          \
        const u8* w, long b_off, long c_off, int n, int k, float* y, int add) {                  \
        mmq_body<T, 8>(aq, ad, as, asum, m, w, b_off, c_off, n, k, y, add);                       \
    }
MMQ(q8_0, W_Q8_0)
MMQ(q4_0, W_Q4_0)
MMQ(q4_1, W_Q4_1)
MMQ(q5_0, W_Q5_0)
MMQ(q5_1, W_Q5_1)
MMQ(q4_k, W_Q4_K)
MMQ(q5_k, W_Q5_K)
MMQ(q6_k, W_Q6_K)
MMQ(mxfp4, W_MXFP4)

#define MMF(name, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS) mmq1_##name(                        \
        const float* x, int m, const u8* w, int n, int k, float* y, int add) {                    \
        mmf_body<T, 1>(x, m, w, n, k, y, add);                                                    \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MQ_THREADS) mmq8_##name(                        \
        const float* x, int m, const u8* w, int n, int k, float* y, int add) {                    \
        mmf_body<T, 8>(x, m, w, n, k, y, add);                                                    \
    }
MMF(f32, W_F32)
MMF(f16, W_F16)
MMF(bf16, W_BF16)
