// Candor's CUDA kernels, compiled at run time with NVRTC (no CUDA headers needed: half
// floats are converted with PTX `cvt`). Every kernel is batch-invariant: the value of an
// output element is computed by one fixed sequence of operations that depends on its own
// inputs only, never on the number of rows in the step, their neighbours, or the grid shape.
//   * matmul: one warp per (1 or MM_OUTS output features, group of rows); lane `l` accumulates
//     the k-chunks `c * 256 + l * 8 .. + 8` in order, then the 32 partial sums are added in one
//     fixed tree and lane 0's result is the value. A row's sum does not depend on its group or
//     on how many outputs its warp takes.
//   * norms: one block per row, fixed strided partial sums and a fixed tree.
//   * attention: KV positions split into chunks of `attn_chunk_len(p)` absolute positions, a
//     length that depends on the row's own position p only (32 up to 1,023, then at most 32
//     chunks), one warp per (row, head, chunk) with an online softmax over the chunk in
//     position order, then the chunks combined in order.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define WARP 32
#define ATTN_MIN_CHUNK 32
#define ATTN_MAX_CHUNKS 32
#define MAX_HD_PER_LANE 8
#define WIDE_HD_PER_LANE 18
#define MM_ROWS 8
#define MM_OUTS 4
#define NEG_INF __int_as_float(0xff800000)

// Weight types (the host's `WeightKind` discriminants).
#define W_F32 0
#define W_F16 1
#define W_BF16 2
#define W_Q8_0 3
#define W_Q4_0 4
#define W_Q4_1 5
#define W_Q4_K 6
#define W_Q6_K 7
#define W_Q5_0 8
#define W_Q5_1 9
#define W_Q5_K 10
#define W_MXFP4 11

__device__ __forceinline__ float half_to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 float_to_half(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_float(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

// A little-endian f16 at an address with no alignment guarantee.
__device__ __forceinline__ float half_at(const u8* p) {
    return half_to_float((u16)p[0] | ((u16)p[1] << 8));
}

// Sum of a warp's 32 values in one fixed order, broadcast from lane 0.
// The attention chunk length of a row at position p: 32 positions while that makes at most 32
// chunks, else the next power of two above p over 32 (at most 32 chunks). The row's own
// position alone decides it, never the step's other rows. Same as `attn_chunk_len` in Rust.
__device__ __forceinline__ int attn_chunk_len(int p) {
    int np2 = p == 0 ? 1 : 1 << (32 - __clz(p));
    int len = np2 / ATTN_MAX_CHUNKS;
    return len > ATTN_MIN_CHUNK ? len : ATTN_MIN_CHUNK;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, off);
    }
    return __shfl_sync(0xffffffffu, v, 0);
}

// The 6-bit scale and min of sub-block j of a Q4_K block's 12 scale bytes (ggml's
// get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* d, float* m) {
    if (j < 4) {
        *d = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *d = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Half the value of an E8M0 exponent byte, 2^(e - 128), subnormal for e < 2 (ggml's
// `ggml_e8m0_to_fp32_half`, the CPU's `layout::e8m0_half`): MXFP4's block scale.
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// MXFP4's E2M1 code `q` (0..15) doubled to an integer (ggml's `kvalues_mxfp4`).
__device__ __forceinline__ int kvalue_mxfp4(int q) {
    const int mag[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    return q < 8 ? mag[q] : -mag[q - 8];
}

// Eight consecutive weights of row `row` starting at element `e` (a multiple of 8, < k),
// with ggml's dequantization expressions.
template <int T>
__device__ __forceinline__ void load8(const u8* w, long row, int e, int k, float* out) {
    if (T == W_F32) {
        const float* p = (const float*)w + row * (long)k + e;
        for (int j = 0; j < 8; j++) out[j] = p[j];
    } else if (T == W_F16) {
        const u16* p = (const u16*)w + row * (long)k + e;
        for (int j = 0; j < 8; j++) out[j] = half_to_float(p[j]);
    } else if (T == W_BF16) {
        const u16* p = (const u16*)w + row * (long)k + e;
        for (int j = 0; j < 8; j++) out[j] = bf16_to_float(p[j]);
    } else if (T == W_Q8_0) {
        const u8* b = w + (row * (long)(k / 32) + e / 32) * 34;
        float d = half_at(b);
        const signed char* q = (const signed char*)(b + 2) + (e % 32);
        for (int j = 0; j < 8; j++) out[j] = (float)q[j] * d;
    } else if (T == W_Q4_0) {
        const u8* b = w + (row * (long)(k / 32) + e / 32) * 18;
        float d = half_at(b);
        const u8* qs = b + 2;
        int j0 = e % 32;
        for (int j = 0; j < 8; j++) {
            int i = j0 + j;
            int q = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
            out[j] = (float)(q - 8) * d;
        }
    } else if (T == W_Q4_1) {
        const u8* b = w + (row * (long)(k / 32) + e / 32) * 20;
        float d = half_at(b);
        float m = half_at(b + 2);
        const u8* qs = b + 4;
        int j0 = e % 32;
        for (int j = 0; j < 8; j++) {
            int i = j0 + j;
            int q = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
            out[j] = (float)q * d + m;
        }
    } else if (T == W_Q4_K) {
        const u8* b = w + (row * (long)(k / 256) + e / 256) * 144;
        float d = half_at(b);
        float dmin = half_at(b + 2);
        int j0 = e % 256;
        float sc, mn;
        scale_min_k4(j0 / 32, b + 4, &sc, &mn);
        float d1 = d * sc;
        float m1 = dmin * mn;
        const u8* qs = b + 16 + (j0 / 64) * 32;
        int within = j0 % 64;
        for (int j = 0; j < 8; j++) {
            int i = within + j;
            int q = i < 32 ? (qs[i] & 0xF) : (qs[i - 32] >> 4);
            out[j] = d1 * (float)q - m1;
        }
    } else if (T == W_Q5_0 || T == W_Q5_1) {
        // d (f16), [m (f16)], qh (32 high bits), qs[16]: element i's low nibble is qs[i]'s
        // (i < 16) or qs[i - 16]'s high one, its fifth bit qh's bit i.
        const int bytes = T == W_Q5_0 ? 22 : 24;
        const u8* b = w + (row * (long)(k / 32) + e / 32) * bytes;
        float d = half_at(b);
        float m = T == W_Q5_1 ? half_at(b + 2) : 0.0f;
        const u8* h = b + (T == W_Q5_0 ? 2 : 4);
        u32 qh = (u32)h[0] | ((u32)h[1] << 8) | ((u32)h[2] << 16) | ((u32)h[3] << 24);
        const u8* qs = h + 4;
        int j0 = e % 32;
        for (int j = 0; j < 8; j++) {
            int i = j0 + j;
            int lo = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
            int q = lo | (int)(((qh >> i) & 1u) << 4);
            if (T == W_Q5_0) {
                out[j] = (float)(q - 16) * d;
            } else {
                out[j] = (float)q * d + m;
            }
        }
    } else if (T == W_Q5_K) {
        // d, dmin (f16), scales[12] (as Q4_K), qh[32], qs[128] (ggml's dequantize_row_q5_K).
        const u8* b = w + (row * (long)(k / 256) + e / 256) * 176;
        float d = half_at(b);
        float dmin = half_at(b + 2);
        int j0 = e % 256;
        int sub = j0 / 32;
        float sc, mn;
        scale_min_k4(sub, b + 4, &sc, &mn);
        float d1 = d * sc;
        float m1 = dmin * mn;
        const u8* qh = b + 16;
        const u8* ql = b + 48 + (j0 / 64) * 32;
        int within = j0 % 64;
        for (int j = 0; j < 8; j++) {
            int i = within + j;
            int l = i % 32;
            int nib = i < 32 ? (ql[l] & 0xF) : (ql[l] >> 4);
            int q = nib + (((qh[l] >> sub) & 1) << 4);
            out[j] = d1 * (float)q - m1;
        }
    } else if (T == W_MXFP4) {
        // e (E8M0 exponent byte), qs[16] as Q4_0's nibbles; ggml's dequantize_row_mxfp4:
        // the code's doubled E2M1 value times half the exponent's value.
        const u8* b = w + (row * (long)(k / 32) + e / 32) * 17;
        float d = e8m0_half(b[0]);
        const u8* qs = b + 1;
        int j0 = e % 32;
        for (int j = 0; j < 8; j++) {
            int i = j0 + j;
            int q = i < 16 ? (qs[i] & 0xF) : (qs[i - 16] >> 4);
            out[j] = (float)kvalue_mxfp4(q) * d;
        }
    } else if (T == W_Q6_K) {
        const u8* b = w + (row * (long)(k / 256) + e / 256) * 210;
        const u8* ql = b;
        const u8* qh = b + 128;
        const signed char* sc = (const signed char*)(b + 192);
        float d = half_at(b + 208);
        int j0 = e % 256;
        int n = j0 / 128;
        int t = (j0 % 128) / 32;
        int l0 = j0 % 32;
        for (int j = 0; j < 8; j++) {
            int l = l0 + j;
            u8 low = ql[64 * n + 32 * (t % 2) + l];
            int nib = t < 2 ? (low & 0x0F) : (low >> 4);
            int q = nib | (((qh[32 * n + l] >> (2 * t)) & 3) << 4);
            int is = l / 16;
            out[j] = d * (float)sc[8 * n + is + 2 * t] * (float)(q - 32);
        }
    }
}

// y[r][o] = sum_k x[r][k] * W[o][k] for rows r < m, outputs o < n. Grid: (ceil(n / (warps *
// OUTS)), ceil(m / MM_ROWS)); block: 32 * warps threads. k is a multiple of 8. A warp takes
// OUTS consecutive outputs and MM_ROWS rows: each weight chunk is dequantized once for the
// rows, each activation chunk read once for the outputs. Every (row, output) value is the
// same chain of fmaf and the same tree whatever OUTS, the row group or the grid, so the host
// may choose OUTS by the step's row count without changing a bit.
template <int T, int OUTS>
__device__ void matmul_body(const float* x, int m, const u8* w, int n, int k, float* y) {
    int warps = blockDim.x / WARP;
    int o0 = (blockIdx.x * warps + threadIdx.x / WARP) * OUTS;
    int lane = threadIdx.x % WARP;
    int r0 = blockIdx.y * MM_ROWS;
    if (o0 >= n) return;
    int no = n - o0 < OUTS ? n - o0 : OUTS;
    int nr = m - r0 < MM_ROWS ? m - r0 : MM_ROWS;
    float acc[OUTS][MM_ROWS];
#pragma unroll
    for (int t = 0; t < OUTS; t++) {
#pragma unroll
        for (int i = 0; i < MM_ROWS; i++) acc[t][i] = 0.0f;
    }
    for (int e = lane * 8; e < k; e += WARP * 8) {
        float wv[OUTS][8];
#pragma unroll
        for (int t = 0; t < OUTS; t++) {
            if (t < no) {
                load8<T>(w, o0 + t, e, k, wv[t]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) wv[t][j] = 0.0f;
            }
        }
#pragma unroll
        for (int i = 0; i < MM_ROWS; i++) {
            if (i < nr) {
                const float* xr = x + (long)(r0 + i) * k + e;
                float xv[8];
#pragma unroll
                for (int j = 0; j < 8; j++) xv[j] = xr[j];
#pragma unroll
                for (int t = 0; t < OUTS; t++) {
                    float s = acc[t][i];
#pragma unroll
                    for (int j = 0; j < 8; j++) s = fmaf(xv[j], wv[t][j], s);
                    acc[t][i] = s;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < OUTS; t++) {
#pragma unroll
        for (int i = 0; i < MM_ROWS; i++) {
            if (t < no && i < nr) {
                float v = warp_sum(acc[t][i]);
                if (lane == 0) y[(long)(r0 + i) * n + o0 + t] = v;
            }
        }
    }
}

// One output per warp (steps of few rows: more warps in flight) and MM_OUTS per warp (steps of
// many rows: fewer reads per multiply-add).
#define MATMUL(name, T) \
    extern "C" __global__ void matmul_##name(const float* x, int m, const u8* w, int n, int k, float* y) { matmul_body<T, 1>(x, m, w, n, k, y); } \
    extern "C" __global__ void matmul_wide_##name(const float* x, int m, const u8* w, int n, int k, float* y) { matmul_body<T, MM_OUTS>(x, m, w, n, k, y); }
MATMUL(f32, W_F32)
MATMUL(f16, W_F16)
MATMUL(bf16, W_BF16)
MATMUL(q8_0, W_Q8_0)
MATMUL(q4_0, W_Q4_0)
MATMUL(q4_1, W_Q4_1)
MATMUL(q4_k, W_Q4_K)
MATMUL(q6_k, W_Q6_K)
MATMUL(q5_0, W_Q5_0)
MATMUL(q5_1, W_Q5_1)
MATMUL(q5_k, W_Q5_K)
MATMUL(mxfp4, W_MXFP4)

// The row at `x` RMS-normed into `y` (`x * scale * w`) by the whole block (blockDim a power of
// two, at most 1024): each thread's fma sum of squares over a stride of blockDim, the partial
// sums added in a tree, `1 / sqrtf(mean + eps)`; returns the scale. `rms_norm` and the fused
// `rms_norm_q8` both call it, so with the same block size they give the same bits.
__device__ float rms_norm_row(const float* x, const float* w, float* y, int dim, float eps) {
    __shared__ float part[1024];
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = x[i];
        s = fmaf(v, v, s);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    float scale = 1.0f / sqrtf(part[0] / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        y[i] = x[i] * scale * w[i];
    }
    return scale;
}

// y = x * (1 / sqrt(mean(x^2) + eps)) * w per row of `dim` values; one block per row (block
// size a power of two, at most 1024). In place when x == y.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int dim, float eps) {
    long base = (long)blockIdx.x * dim;
    rms_norm_row(x + base, w, y + base, dim, eps);
}

// x[i] += b[i % width] for i < total.
extern "C" __global__ void add_bias(float* x, const float* b, int width, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % width];
}

// x[i] *= s[i / width]: each row times its own factor (the queries' attention temperature).
extern "C" __global__ void scale_rows(float* x, const float* s, int width, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = __fmul_rn(x[i], s[i / width]);
}

// x[i] += y[i].
extern "C" __global__ void add_in_place(float* x, const float* y, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += y[i];
}

// g[i] = silu(g[i]) * u[i] (act 0) or gelu_tanh(g[i]) * u[i] (act 1).
extern "C" __global__ void gated_act(float* g, const float* u, long total, int act) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float v = g[i];
    if (act == 0) {
        v = v / (1.0f + expf(-v));
    } else {
        const float c = 0.7978846f;
        v = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
    }
    g[i] = v * u[i];
}

// x[i] = tanh(x[i] / cap) * cap.
extern "C" __global__ void softcap(float* x, float cap, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = tanhf(x[i] / cap) * cap;
}

// Columns [off, off + w) of each `width`-wide row of src into the w-wide rows of dst.
extern "C" __global__ void split_cols(const float* src, int width, int off, int w, float* dst, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long r = i / w;
    int c = (int)(i % w);
    dst[i] = src[r * width + off + c];
}

// dst row i = src row idx[i] (`dim` values each).
extern "C" __global__ void gather_rows(const float* src, const int* idx, int dim, float* dst, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long r = i / dim;
    int c = (int)(i % dim);
    dst[i] = src[(long)idx[r] * dim + c];
}

// Rotary embedding of the first `rd` dimensions of every head of every row. `cs` holds, per
// row, `rd / 2` interleaved (cos, sin) pairs. Adjacent pairs (neox == 0) or halves.
extern "C" __global__ void rope(float* x, const float* cs, int rows, int heads, int hd, int rd, int neox) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = rd / 2;
    long total = (long)rows * heads * pairs;
    if (i >= total) return;
    int p = (int)(i % pairs);
    long rh = i / pairs;
    int r = (int)(rh / heads);
    float* v = x + rh * hd;
    float c = cs[(long)r * rd + 2 * p];
    float s = cs[(long)r * rd + 2 * p + 1];
    int a = neox ? p : 2 * p;
    int b = neox ? p + pairs : 2 * p + 1;
    float x0 = v[a], x1 = v[b];
    // The CPU's `apply_rope` expression, nothing contracted into an fma: the same bits.
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// Stores each row's key and value (kv_dim wide, f32) into its KV block slot as f16. A block
// holds, for each layer, BT keys then BT values, each `stride` halves apart (the widest layer's
// kv_dim; every layer's own for models whose layers agree): ((layer * 2 + is_value) * BT +
// slot) * stride.
extern "C" __global__ void kv_write(const float* k, const float* v, u16* pool, const int* row_block,
                                   const int* row_slot, int rows, int kv_dim, int stride, int layer,
                                   int bt, long block_len) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long total = (long)rows * kv_dim;
    if (i >= total) return;
    int r = (int)(i / kv_dim);
    int c = (int)(i % kv_dim);
    long base = (long)row_block[r] * block_len;
    long ko = base + ((long)(layer * 2) * bt + row_slot[r]) * stride + c;
    long vo = base + ((long)(layer * 2 + 1) * bt + row_slot[r]) * stride + c;
    pool[ko] = float_to_half(k[i]);
    pool[vo] = float_to_half(v[i]);
}

// Attention, first pass. Grid: (max chunks, heads, rows); block: one warp. For row r (absolute
// position pos[r], its sequence's block table at table[table_off[r]]), query head h and chunk c,
// an online softmax over the keys at positions max(lo, c * CHUNK) ..= min(pos, c * CHUNK +
// CHUNK - 1), in order. Writes (max, sum, acc[hd]) to part[((r * heads + h) * chunks + c)].
template <int MAXP>
__device__ void attn_partial_body(const float* q, const u16* pool, const int* table,
                                  const int* table_off, const int* pos, int heads, int group,
                                  int hd, int kv_dim, int layer, int bt, long block_len,
                                  float scale, float cap, int window, int chunks, float* part) {
    int c = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    int lane = threadIdx.x;
    int p = pos[r];
    int cl = attn_chunk_len(p);
    int lo = window > 0 ? (p + 1 > window ? p + 1 - window : 0) : 0;
    int from = c * cl > lo ? c * cl : lo;
    int to = c * cl + cl - 1 < p ? c * cl + cl - 1 : p;
    float* out = part + ((long)(r * heads + h) * chunks + c) * (hd + 2);
    int per = hd / WARP;
    float qv[MAXP], acc[MAXP];
    const float* qr = q + ((long)r * heads + h) * hd;
    for (int i = 0; i < per; i++) {
        qv[i] = qr[lane + WARP * i];
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    int kvo = (h / group) * hd;
    const int* tab = table + table_off[r];
    for (int t = from; t <= to; t++) {
        long base = (long)tab[t / bt] * block_len;
        const u16* kr = pool + base + ((long)(layer * 2) * bt + t % bt) * kv_dim + kvo;
        const u16* vr = pool + base + ((long)(layer * 2 + 1) * bt + t % bt) * kv_dim + kvo;
        float d = 0.0f;
        for (int i = 0; i < per; i++) d = fmaf(qv[i], half_to_float(kr[lane + WARP * i]), d);
        float s = warp_sum(d) * scale;
        if (cap > 0.0f) s = tanhf(s / cap) * cap;
        if (s > m) {
            float corr = expf(m - s);
            l = l * corr + 1.0f;
            for (int i = 0; i < per; i++) acc[i] = acc[i] * corr + half_to_float(vr[lane + WARP * i]);
            m = s;
        } else {
            float e = expf(s - m);
            l += e;
            for (int i = 0; i < per; i++) acc[i] = fmaf(e, half_to_float(vr[lane + WARP * i]), acc[i]);
        }
    }
    if (lane == 0) {
        out[0] = m;
        out[1] = l;
    }
    for (int i = 0; i < per; i++) out[2 + lane + WARP * i] = acc[i];
}

extern "C" __global__ void attn_partial(const float* q, const u16* pool, const int* table,
                                       const int* table_off, const int* pos, int heads, int group,
                                       int hd, int kv_dim, int layer, int bt, long block_len,
                                       float scale, float cap, int window, int chunks, float* part) {
    attn_partial_body<MAX_HD_PER_LANE>(q, pool, table, table_off, pos, heads, group, hd, kv_dim,
                                       layer, bt, block_len, scale, cap, window, chunks, part);
}

// `attn_partial` for heads of up to WIDE_HD_PER_LANE * 32 dimensions (Multi-head Latent
// Attention's 576): the same operations, more of them per lane.
extern "C" __global__ void attn_partial_wide(const float* q, const u16* pool, const int* table,
                                            const int* table_off, const int* pos, int heads,
                                            int group, int hd, int kv_dim, int layer, int bt,
                                            long block_len, float scale, float cap, int window,
                                            int chunks, float* part) {
    attn_partial_body<WIDE_HD_PER_LANE>(q, pool, table, table_off, pos, heads, group, hd, kv_dim,
                                        layer, bt, block_len, scale, cap, window, chunks, part);
}

// Attention, first pass, one block per (chunk, KV head, row) serving the KV head's whole group
// of query heads: warp w takes query head kvh * group + w and runs exactly `attn_partial`'s
// sequence of operations (the same bits), but the keys and values come from a tile of ATTN_TILE
// positions staged once in shared memory for the group (`2 * ATTN_TILE * hd` halves of dynamic
// shared memory) instead of each query head reading them from the pool. Grid (max chunks,
// KV heads, rows); block 32 * group threads.
#define ATTN_TILE 32
extern "C" __global__ void attn_partial_gqa(const float* q, const u16* pool, const int* table,
                                           const int* table_off, const int* pos, int heads, int group,
                                           int hd, int kv_dim, int layer, int bt, long block_len,
                                           float scale, float cap, int window, int chunks, float* part) {
    extern __shared__ u16 kv_tile[];
    int c = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int h = kvh * group + warp;
    int p = pos[r];
    int cl = attn_chunk_len(p);
    int lo = window > 0 ? (p + 1 > window ? p + 1 - window : 0) : 0;
    int from = c * cl > lo ? c * cl : lo;
    int to = c * cl + cl - 1 < p ? c * cl + cl - 1 : p;
    float* out = part + ((long)(r * heads + h) * chunks + c) * (hd + 2);
    int per = hd / WARP;
    float qv[MAX_HD_PER_LANE], acc[MAX_HD_PER_LANE];
    const float* qr = q + ((long)r * heads + h) * hd;
    for (int i = 0; i < per; i++) {
        qv[i] = qr[lane + WARP * i];
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    int kvo = kvh * hd;
    const int* tab = table + table_off[r];
    u16* ks = kv_tile;
    u16* vs = kv_tile + ATTN_TILE * hd;
    // Whole 16-byte vectors of a position's keys and values: the pool is allocated aligned, and
    // every offset into it is a multiple of 8 halves when these are.
    bool vec16 = (hd % 8) == 0 && (kv_dim % 8) == 0 && (kvo % 8) == 0 && (block_len % 8) == 0;
    for (int t0 = from; t0 <= to; t0 += ATTN_TILE) {
        int nt = to - t0 + 1 < ATTN_TILE ? to - t0 + 1 : ATTN_TILE;
        if (vec16) {
            // 16-byte loads, each position's address computed once per 8 halves.
            int vec = hd / 8;
            for (int i = threadIdx.x; i < nt * vec; i += blockDim.x) {
                int tt = i / vec, j = i - tt * vec;
                int t = t0 + tt;
                long ko = (long)tab[t / bt] * block_len + ((long)(layer * 2) * bt + t % bt) * kv_dim + kvo + j * 8;
                ((int4*)ks)[i] = *(const int4*)(pool + ko);
                ((int4*)vs)[i] = *(const int4*)(pool + ko + (long)bt * kv_dim);
            }
        } else {
            for (int i = threadIdx.x; i < nt * hd; i += blockDim.x) {
                int tt = i / hd, d = i % hd;
                int t = t0 + tt;
                long base = (long)tab[t / bt] * block_len;
                ks[i] = pool[base + ((long)(layer * 2) * bt + t % bt) * kv_dim + kvo + d];
                vs[i] = pool[base + ((long)(layer * 2 + 1) * bt + t % bt) * kv_dim + kvo + d];
            }
        }
        __syncthreads();
        for (int tt = 0; tt < nt; tt++) {
            const u16* kr = ks + tt * hd;
            const u16* vr = vs + tt * hd;
            float d = 0.0f;
            for (int i = 0; i < per; i++) d = fmaf(qv[i], half_to_float(kr[lane + WARP * i]), d);
            float s = warp_sum(d) * scale;
            if (cap > 0.0f) s = tanhf(s / cap) * cap;
            if (s > m) {
                float corr = expf(m - s);
                l = l * corr + 1.0f;
                for (int i = 0; i < per; i++) acc[i] = acc[i] * corr + half_to_float(vr[lane + WARP * i]);
                m = s;
            } else {
                float e = expf(s - m);
                l += e;
                for (int i = 0; i < per; i++) acc[i] = fmaf(e, half_to_float(vr[lane + WARP * i]), acc[i]);
            }
        }
        __syncthreads();
    }
    if (lane == 0) {
        out[0] = m;
        out[1] = l;
    }
    for (int i = 0; i < per; i++) out[2 + lane + WARP * i] = acc[i];
}

// Attention, second pass: combines a (row, head)'s chunks in order into out[r][h * hd ..].
// Grid: (heads, rows); block: one warp. Chunks past the row's position have l == 0.
// With `sinks` (one logit per query head, gpt-oss), the head's sink joins the maximum and adds
// e^(sink - max) to the denominator after the chunks, weighing no value.
template <int MAXP>
__device__ void attn_combine_body(const float* part, const int* pos, int heads, int hd, int chunks,
                                  const float* sinks, float* out) {
    int h = blockIdx.x, r = blockIdx.y;
    int lane = threadIdx.x;
    int used = pos[r] / attn_chunk_len(pos[r]) + 1;
    const float* base = part + (long)(r * heads + h) * chunks * (hd + 2);
    float mx = NEG_INF;
    for (int c = 0; c < used; c++) {
        const float* pc = base + (long)c * (hd + 2);
        if (pc[1] > 0.0f && pc[0] > mx) mx = pc[0];
    }
    if (sinks && sinks[h] > mx) mx = sinks[h];
    int per = hd / WARP;
    float acc[MAXP];
    for (int i = 0; i < per; i++) acc[i] = 0.0f;
    float l = 0.0f;
    for (int c = 0; c < used; c++) {
        const float* pc = base + (long)c * (hd + 2);
        if (!(pc[1] > 0.0f)) continue;
        float f = expf(pc[0] - mx);
        l = fmaf(pc[1], f, l);
        for (int i = 0; i < per; i++) acc[i] = fmaf(pc[2 + lane + WARP * i], f, acc[i]);
    }
    if (sinks) l = __fadd_rn(l, expf(sinks[h] - mx));
    float inv = 1.0f / l;
    float* o = out + ((long)r * heads + h) * hd;
    for (int i = 0; i < per; i++) o[lane + WARP * i] = acc[i] * inv;
}

extern "C" __global__ void attn_combine(const float* part, const int* pos, int heads, int hd, int chunks,
                                        const float* sinks, float* out) {
    attn_combine_body<MAX_HD_PER_LANE>(part, pos, heads, hd, chunks, sinks, out);
}

// `attn_combine` for `attn_partial_wide`'s heads.
extern "C" __global__ void attn_combine_wide(const float* part, const int* pos, int heads, int hd,
                                             int chunks, const float* sinks, float* out) {
    attn_combine_body<WIDE_HD_PER_LANE>(part, pos, heads, hd, chunks, sinks, out);
}

// Copies `w` columns of each row: dst[r * dst_w + dst_off + i] = src[r * src_w + src_off + i]
// for i < w (a head's slice of a wider row, or back into one). total = rows * w.
extern "C" __global__ void copy_cols(const float* src, int src_w, int src_off, float* dst, int dst_w,
                                     int dst_off, int w, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long r = i / w;
    int c = (int)(i % w);
    dst[r * dst_w + dst_off + c] = src[r * src_w + src_off + c];
}

// Multi-head Latent Attention's key and value of each row (`mla.rs`'s `absorb`): from the
// normed latent (rows x kv_lora) and the RoPE part after the latent in ckv (rows x (kv_lora +
// rope)), k = [pe | latent] and v = [0 | latent], rope + kv_lora wide. total = rows * (rope +
// kv_lora).
extern "C" __global__ void mla_kv(const float* latent, const float* ckv, int kv_lora, int rope, float* k,
                                  float* v, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    int hd = kv_lora + rope;
    long r = i / hd;
    int c = (int)(i % hd);
    if (c < rope) {
        k[i] = ckv[r * hd + kv_lora + c];
        v[i] = 0.0f;
    } else {
        float x = latent[r * kv_lora + c - rope];
        k[i] = x;
        v[i] = x;
    }
}

// x[i] *= s for i < total (Gemma 4's layer output scale; its per-layer inputs' projection).
extern "C" __global__ void scale(float* x, float s, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = __fmul_rn(x[i], s);
}

// Gemma 4's per-layer inputs: proj[i] = (proj[i] + tok[i] * tok_scale) * input_scale, the
// CPU's expression (`gemma4.rs`'s `inputs`), nothing contracted.
extern "C" __global__ void ple_combine(float* proj, const float* tok, float tok_scale, float input_scale,
                                       long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) proj[i] = __fmul_rn(__fadd_rn(proj[i], __fmul_rn(tok[i], tok_scale)), input_scale);
}

// Copies whole KV blocks: dst slot i = src slot i (block_len halves each), for copy-on-write.
extern "C" __global__ void copy_block(u16* pool, int src, int dst, long block_len) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < block_len) pool[(long)dst * block_len + i] = pool[(long)src * block_len + i];
}
