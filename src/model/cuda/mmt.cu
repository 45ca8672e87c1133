// Quantized matmuls on the int8 tensor cores for many rows (prefill), with the same bits as
// the dp4a kernels of mmq.cu and the CPU's `QWeight::matmul` (appended after mmq.cu; the host
// emulates this kernel lane by lane in `emulate_mmt.rs`, MMA fragments as the PTX ISA lays
// them out, and its tests check it against the CPU bit for bit).
//
// Why the bits are the same: per (row, output, weight block) the kernel forms the same exact
// integers `sumi` / `summ` as `block_ints` (int8 × int8 products summed in int32 by
// `mma.sync.aligned.m16n8k32` / `m16n8k16 .s32.s8.s8.s32`, then times the sub-block scales
// and less the stored offsets as integers: integer sums are exact in any order), then the
// CPU's float expression for the block (`block_expr`, shared with mmq.cu), and adds the terms
// to one accumulator per output in block order from 0. Nothing in it depends on m beyond which
// tile a row falls in, and no row's arithmetic depends on another's.
//
// Block: MT_THREADS threads, a tile of MT_BM rows × MT_BN outputs; warp w takes rows
// 32 (w / 2) .. + 32 (two m16 tiles) and outputs 32 (w % 2) .. + 32 (four n8 tiles). k is
// walked in stages of MT_SK = 256 elements (one k-quant block, or 8 blocks of 32): the
// stage's activations (int8, as quantize_q8 / quantize_q8k wrote them) and weights (unpacked
// to int8 by mmq.cu's `unpack`: 4/5/6-bit values without their offsets, MXFP4's signed
// values) go to shared memory, rows MT_LD = MT_SK + 16 bytes apart so that the fragment
// loads of a warp fall in 32 distinct banks, with the weights' integer sub-block scales and
// the activations' integer sums (Q4_K / Q5_K: per row the sums of its 8 sub-blocks of 32,
// `xpair`, added in pairs from Q8_K's sums of 16 while staging). The float scales of the
// stage's blocks are staged too, once per stage by all the threads: the activations' `ad`
// (and `as`) of the tile's 64 rows, the weights' `load_wscale` of its 64 outputs (clamped to
// row m - 1 / output n - 1 past the ends, as the terms of those are never stored), so the
// sub-steps and the epilogue read no global memory. Then per 32 (16 for Q6_K's scale groups)
// elements one MMA per (m tile, n tile), each from zero, folded into `sumi` by the output's
// sub-block scale (k-quants) or turned into the block's term at once (blocks of 32). The
// k-quants' epilogue takes each of a thread's 4 rows' 8 sub-block sums and each of its 8
// outputs' 8 mins (`wsc`) with one 16-byte shared load per stage for the mins' `summ`.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "m16n8k16 with integer type"),
// lane = 4 g + q: A (rows × k) register 0 = row g, k 4q .. 4q + 3 (low byte first), 1 = row
// g + 8, 2 = row g, k 16 + 4q, 3 = row g + 8, k 16 + 4q (k16: registers 0 and 1 only);
// B (k × outputs, "col") register 0 = output g, k 4q .., 1 = output g, k 16 + 4q (k16:
// register 0); D: registers 0, 1 = row g, outputs 2q, 2q + 1; 2, 3 = row g + 8.

#define MT_THREADS 128
#define MT_BM 64
#define MT_BN 64
#define MT_SK 256
#define MT_LD (MT_SK + 16)

__device__ __forceinline__ void mma_k32(int* d, const int* a, const int* b) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#else
    __trap();  // never launched below compute 8.0 (`Kernels::mma` is false there)
#endif
}

__device__ __forceinline__ void mma_k16(int* d, const int* a, const int* b) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%7, %7, %7, %7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(0));
#else
    __trap();
#endif
}

// Where part p's 16 + 16 unpacked quants (`WPart::lo`, `hi`) lie in their block (elements).
template <int T>
__device__ __forceinline__ void part_cols(int p, int* lo, int* hi) {
    if (T == W_Q8_0) {
        *lo = 16 * p;
        *hi = -1;
    } else if (T == W_Q4_0 || T == W_Q4_1 || T == W_Q5_0 || T == W_Q5_1 || T == W_MXFP4) {
        *lo = 0;
        *hi = 16;
    } else if (T == W_Q4_K || T == W_Q5_K) {
        int c = p / 2, h = p % 2;
        *lo = 64 * c + 16 * h;
        *hi = 64 * c + 32 + 16 * h;
    } else {
        int g0 = 8 * (p / 4) + 2 * ((p / 2) % 2) + p % 2;
        *lo = 16 * g0;
        *hi = 16 * (g0 + 4);
    }
}

// The 8 shorts at p (16-byte aligned; one 16-byte load), low half of each word first.
__device__ __forceinline__ void ld8s(const short* p, int* v) {
    int4 w = *(const int4*)p;
    int x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = (int)(short)x[i];
        v[2 * i + 1] = x[i] >> 16;
    }
}

// y[r][o] (= or +=, `add`) for rows r0 <= r < min(r0 + MT_BM, m), outputs o0 <= o <
// min(o0 + MT_BN, n): one block's tile. Arguments as mmq_body's. (`mmt_` launches a grid of
// ceil(m / MT_BM) · ceil(n / MT_BN) tiles, the row tile fastest: the row tiles of one slice of
// outputs run together and share its weights in L2; `mmte_` a grid of expert row tiles.)
template <int T>
__device__ void mmt_body(const signed char* aq, const float* ad, const float* as, const int* asum, int m,
                         const u8* w, long b_off, long c_off, int n, int k, float* y, int add, int r0,
                         int o0) {
    typedef Fmt<T> F;
    const bool KQ = F::BLOCK == 256;
    const bool MINS = T == W_Q4_K || T == W_Q5_K;     // the mins' summ, from xpair and wsc
    const bool XS = T == W_Q4_1 || T == W_Q5_1;       // the activations' `as`
    const bool WM = XS || MINS;                       // the weights' `WScale::m`
    const int SB = MT_SK / F::BLOCK;  // blocks per stage: 1 or 8
    const int SL = SB == 1 ? 1 : SB + 1;  // scale slots per row / output (blocks of 32: padded)
    const int UNITS = MT_BN * SB * F::P;
    const int SUMS = KQ ? 16 : 8;  // integer activation sums per row and stage
    __shared__ __align__(16) signed char xs[MT_BM * MT_LD];
    __shared__ __align__(16) signed char ws[MT_BN * MT_LD];
    // Per output: k-quants' sub-block scales (Q4_K / Q5_K: 8 scales then 8 mins, the mins one
    // 16-byte load; Q6_K: 16).
    __shared__ __align__(16) short wsc[MT_BN * 16];
    // Per row: the stage's integer activation sums (Q6_K: of every 16; Q8_0, Q4_0, Q5_0: of
    // each block).
    __shared__ short xsum[MT_BM * 16];
    // Per row (Q4_K / Q5_K): the sums of its 8 sub-blocks of 32 (the pairs of Q8_K's sums of
    // 16; |sum| <= 32 * 128 fits a short), one 16-byte load.
    __shared__ __align__(16) short xpair[MT_BM * 8];
    // Per row and block of the stage: the activations' float scales `ad` (xd) and `as` (xa,
    // Q4_1 / Q5_1); per output and block: the weights' `WScale` d (wd) and m (wmn). Slot
    // r * SL + cb: with SL = 9 the rows (outputs) a warp reads at once fall in distinct banks.
    __shared__ float xd[MT_BM * SL];
    __shared__ float xa[MT_BM * SL];
    __shared__ float wd[MT_BN * SL];
    __shared__ float wmn[MT_BN * SL];
    const u8* A = w;
    const u8* B = w + b_off;
    const u8* C = w + c_off;
    int nb = k / F::BLOCK;
    int t = threadIdx.x, warp = t / WARP, lane = t % WARP;
    int g = lane >> 2, q = lane & 3;
    int wm = warp >> 1, wn = warp & 1;
    // This thread's rows (local): 32 wm + 16 i + g + 8 h; outputs: 32 wn + 8 j + 2 q + e.
    float acc[2][4][4];
    int sumi[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += MT_SK) {
        int b0 = k0 / F::BLOCK;
        // Activations: 16 bytes per thread and step, zero past m and k.
#pragma unroll
        for (int it = 0; it < MT_BM * (MT_SK / 16) / MT_THREADS; it++) {
            int u = it * MT_THREADS + t;
            int r = u / (MT_SK / 16), c = u % (MT_SK / 16);
            int4 v = make_int4(0, 0, 0, 0);
            if (r0 + r < m && k0 + 16 * c < k) v = ld16(aq + (long)(r0 + r) * k + k0 + 16 * c);
            *(int4*)(xs + r * MT_LD + 16 * c) = v;
        }
        // The activations' integer sums (Q8_K: 16 per block, Q4_K / Q5_K summed in pairs;
        // Q8_0: one per block; Q8_1: none).
        if (MINS) {
#pragma unroll
            for (int it = 0; it < MT_BM * 8 / MT_THREADS; it++) {
                int u = it * MT_THREADS + t;
                int r = u / 8, sb = u % 8;
                int v = 0;
                if (r0 + r < m) {
                    const int* sr = asum + (long)(r0 + r) * (k / 16) + b0 * 16 + 2 * sb;
                    v = sr[0] + sr[1];
                }
                xpair[r * 8 + sb] = (short)v;
            }
        } else if (F::BLOCK == 256 || T == W_Q8_0 || T == W_Q4_0 || T == W_Q5_0) {
#pragma unroll
            for (int it = 0; it < MT_BM * SUMS / MT_THREADS; it++) {
                int u = it * MT_THREADS + t;
                int r = u / SUMS, c = u % SUMS;
                int v = 0;
                if (KQ) {
                    if (r0 + r < m) v = asum[(long)(r0 + r) * (k / 16) + b0 * 16 + c];
                } else {
                    if (r0 + r < m && b0 + c < nb) v = asum[(long)(r0 + r) * nb + b0 + c];
                }
                xsum[r * 16 + c] = (short)v;
            }
        }
        // The float scales of the stage's blocks: unit u < MT_BM * SB = (row, block), then
        // (output, block); rows and outputs past m and n clamped to the last one (their terms
        // are never stored), blocks past nb zero (never read). Not unrolled: unrolled, the 8
        // iterations' loads of the blocks of 32 take Q8_0 to 152 bytes of spills.
#pragma unroll 1
        for (int it = 0; it < (MT_BM + MT_BN) * SB / MT_THREADS; it++) {
            int u = it * MT_THREADS + t;
            if (u < MT_BM * SB) {
                int r = u / SB, cb = u % SB, b = b0 + cb;
                long rr = r0 + r < m ? r0 + r : m - 1;
                xd[r * SL + cb] = b < nb ? ad[rr * nb + b] : 0.0f;
                if (XS) xa[r * SL + cb] = b < nb ? as[rr * nb + b] : 0.0f;
            } else {
                int o = (u - MT_BM * SB) / SB, cb = u % SB, b = b0 + cb;
                long oo = o0 + o < n ? o0 + o : n - 1;
                WScale sc;
                sc.d = 0.0f;
                sc.m = 0.0f;
                if (b < nb) sc = load_wscale<T>(B, C, oo * nb + b);
                wd[o * SL + cb] = sc.d;
                if (WM) wmn[o * SL + cb] = sc.m;
            }
        }
        // Weights: unit u = (output, block, part), unpacked once, zero past n and nb.
#pragma unroll
        for (int it = 0; it < UNITS / MT_THREADS; it++) {
            int u = it * MT_THREADS + t;
            int o = u / (SB * F::P), rem = u % (SB * F::P);
            int cb = rem / F::P, p = rem % F::P;
            int b = b0 + cb;
            bool live = o0 + o < n && b < nb;
            WPart wp;
            if (live) unpack<T>(A, B, C, (long)(o0 + o) * nb + b, p, wp);
            int lo, hi;
            part_cols<T>(p, &lo, &hi);
            signed char* dst = ws + o * MT_LD + cb * F::BLOCK;
            *(int4*)(dst + lo) = live ? make_int4(wp.lo[0], wp.lo[1], wp.lo[2], wp.lo[3]) : make_int4(0, 0, 0, 0);
            if (T != W_Q8_0) {
                *(int4*)(dst + hi) = live ? make_int4(wp.hi[0], wp.hi[1], wp.hi[2], wp.hi[3]) : make_int4(0, 0, 0, 0);
            }
            if (T == W_Q4_K || T == W_Q5_K) {
                if (p % 2 == 0) {
                    int c2 = p;  // sub-blocks 2c, 2c + 1 with c = p / 2
                    wsc[o * 16 + c2] = (short)(live ? wp.s0 : 0);
                    wsc[o * 16 + c2 + 1] = (short)(live ? wp.s1 : 0);
                    wsc[o * 16 + 8 + c2] = (short)(live ? wp.m0 : 0);
                    wsc[o * 16 + 8 + c2 + 1] = (short)(live ? wp.m1 : 0);
                }
            } else if (T == W_Q6_K) {
                int g0 = lo / 16;
                wsc[o * 16 + g0] = (short)(live ? wp.s0 : 0);
                wsc[o * 16 + g0 + 4] = (short)(live ? wp.s1 : 0);
            }
        }
        __syncthreads();
        if (KQ) {
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) sumi[i][j][c] = 0;
        }
        // Sub-steps: 32 elements (Q6_K: 16, one scale group) each.
        const int KS = T == W_Q6_K ? 16 : 32;
#pragma unroll 1
        for (int s = 0; s < MT_SK / KS; s++) {
            if (!KQ && b0 + s >= nb) break;
            int kk = KS * s;
            int a[2][4], bq[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const signed char* xr = xs + (32 * wm + 16 * i + g) * MT_LD + kk + 4 * q;
                a[i][0] = *(const int*)xr;
                a[i][1] = *(const int*)(xr + 8 * MT_LD);
                if (KS == 32) {
                    a[i][2] = *(const int*)(xr + 16);
                    a[i][3] = *(const int*)(xr + 8 * MT_LD + 16);
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const signed char* wr = ws + (32 * wn + 8 * j + g) * MT_LD + kk + 4 * q;
                bq[j][0] = *(const int*)wr;
                if (KS == 32) bq[j][1] = *(const int*)(wr + 16);
            }
            if (KQ) {
                // Fold each MMA by its output's sub-block scale (Q6_K: less the offset 32
                // times the group's activation sum).
                int sc[4][2];
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) sc[j][e] = wsc[(32 * wn + 8 * j + 2 * q + e) * 16 + s];
                int xo[2][2];
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        xo[i][h] = T == W_Q6_K ? 32 * (int)xsum[(32 * wm + 16 * i + g + 8 * h) * 16 + s] : 0;
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int d[4];
                        if (KS == 32) mma_k32(d, a[i], bq[j]);
                        else mma_k16(d, a[i], bq[j]);
#pragma unroll
                        for (int c = 0; c < 4; c++) sumi[i][j][c] += sc[j][c & 1] * (d[c] - xo[i][c >> 1]);
                    }
            } else {
                // A block of 32: its term at once, from the staged scales of block b0 + s.
                float dx[2][2], sx[2][2];
                int off[2][2];
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int rl = 32 * wm + 16 * i + g + 8 * h;
                        dx[i][h] = xd[rl * SL + s];
                        sx[i][h] = XS ? xa[rl * SL + s] : 0.0f;
                        // Q4_0 / Q5_0: the stored offset (8 / 16) times the block's sum.
                        if (T == W_Q4_0 || T == W_Q5_0) off[i][h] = (T == W_Q4_0 ? 8 : 16) * (int)xsum[rl * 16 + s];
                        else off[i][h] = 0;
                    }
                WScale wsv[4][2];
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int ol = 32 * wn + 8 * j + 2 * q + e;
                        wsv[j][e].d = wd[ol * SL + s];
                        wsv[j][e].m = WM ? wmn[ol * SL + s] : 0.0f;
                    }
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        int d[4];
                        mma_k32(d, a[i], bq[j]);
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            float term = block_expr<T>(wsv[j][c & 1], d[c] - off[i][c >> 1], 0, dx[i][c >> 1], sx[i][c >> 1]);
                            acc[i][j][c] = __fadd_rn(acc[i][j][c], term);
                        }
                    }
            }
        }
        if (KQ) {
            // The block's term: sumi, the mins' summ (Q4_K / Q5_K), the CPU's expression. Each
            // row's 8 sub-block sums and each output's 8 mins are one 16-byte load per stage.
            float dx[2][2];
            int px[2][2][8];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int rl = 32 * wm + 16 * i + g + 8 * h;
                    dx[i][h] = xd[rl];
                    if (MINS) ld8s(xpair + rl * 8, px[i][h]);
                }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int ol = 32 * wn + 8 * j + 2 * q + e;
                    WScale wv;
                    wv.d = wd[ol];
                    wv.m = WM ? wmn[ol] : 0.0f;
                    int mn[8];
                    if (MINS) ld8s(wsc + ol * 16 + 8, mn);
#pragma unroll
                    for (int i = 0; i < 2; i++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            int c = 2 * h + e;
                            int summ = 0;
                            if (MINS) {
#pragma unroll
                                for (int sb = 0; sb < 8; sb++) summ += mn[sb] * px[i][h][sb];
                            }
                            float term = block_expr<T>(wv, sumi[i][j][c], summ, dx[i][h], 0.0f);
                            acc[i][j][c] = __fadd_rn(acc[i][j][c], term);
                        }
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int r = r0 + 32 * wm + 16 * i + g + 8 * (c >> 1);
                int o = o0 + 32 * wn + 8 * j + 2 * q + (c & 1);
                if (r < m && o < n) {
                    float* yo = y + (long)r * n + o;
                    *yo = add ? __fadd_rn(*yo, acc[i][j][c]) : acc[i][j][c];
                }
            }
}

// MINB: blocks per SM the registers must allow. 3 (12 warps: more latency hidden, as a stage's
// loads are not overlapped within a block) caps registers at 168: ptxas -arch=sm_90 (NVRTC
// 13.0) fits every type but Q6_K without spills (143-168 registers), Q6_K with 24 bytes.
// Q5_K kept 2 (217 registers; 272 bytes of spills at 3) until the epilogue's sums and the
// scales were staged once per stage: from sm_90 it now fits 168 without spills and takes 3;
// below (sm_80: 44 bytes of spills at 3, none in 194 registers at 2) it keeps 2.
#if __CUDA_ARCH__ >= 900
#define MT_MINB_Q5K 3
#else
#define MT_MINB_Q5K 2
#endif
// Mixture-of-Experts rows grouped by expert (`moe_group`'s order) on the tensor cores, every
// expert in one launch: block (x, y) is row tile x of the table `moe_tiles` wrote (expert,
// first grouped row of its segment, the segment's rows, the tile's first row in it; 0 rows:
// past the last tile, nothing to do) and output tile y, `mmt_body` on the expert's weight at
// wtab[expert] and its segment's activations, scales, sums and output (`mmqe_body`'s offsets).
// So each row gets the bits of a launch per expert on its expert's rows alone, with no host
// read of the experts' row counts. Grid (the most tiles `pairs` rows can take, ceil(n /
// MT_BN)); `add` is not taken.
template <int T>
__device__ void mmte_body(const signed char* aq, const float* ad, const float* as, const int* asum,
                          const int* tiles, const unsigned long long* wtab, long b_off, long c_off,
                          int n, int k, float* y) {
    typedef Fmt<T> F;
    const int* tile = tiles + 4 * (long)blockIdx.x;
    int rows = tile[2];
    if (rows == 0) return;
    long start = tile[1];
    long nb = k / F::BLOCK;
    long sums = nb * (F::BLOCK == 256 ? 16 : 1);
    const u8* w = (const u8*)wtab[tile[0]];
    mmt_body<T>(aq + start * k, ad + start * nb, as + start * nb, asum + start * sums, rows, w, b_off,
                c_off, n, k, y + start * n, 0, tile[3], blockIdx.y * MT_BN);
}

#define MMT(name, T, MINB)                                                                        \
    extern "C" __global__ void __launch_bounds__(MT_THREADS, MINB) mmt_##name(                   \
        const signed char* aq, const float* ad, const float* as, const int* asum, int m,          \
        const u8* w, long b_off, long c_off, int n, int k, float* y, int add) {                  \
        int tiles = (m + MT_BM - 1) / MT_BM;                                                      \
        mmt_body<T>(aq, ad, as, asum, m, w, b_off, c_off, n, k, y, add,                           \
                    (blockIdx.x % tiles) * MT_BM, (blockIdx.x / tiles) * MT_BN);                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(MT_THREADS, MINB) mmte_##name(                  \
        const signed char* aq, const float* ad, const float* as, const int* asum,                 \
        const int* tiles, const unsigned long long* wtab, long b_off, long c_off, int n, int k,   \
        float* y) {                                                                               \
        mmte_body<T>(aq, ad, as, asum, tiles, wtab, b_off, c_off, n, k, y);                       \
    }
MMT(q8_0, W_Q8_0, 3)
MMT(q4_0, W_Q4_0, 3)
MMT(q4_1, W_Q4_1, 3)
MMT(q5_0, W_Q5_0, 3)
MMT(q5_1, W_Q5_1, 3)
MMT(q4_k, W_Q4_K, 3)
MMT(q5_k, W_Q5_K, MT_MINB_Q5K)
MMT(q6_k, W_Q6_K, 3)
MMT(mxfp4, W_MXFP4, 3)
