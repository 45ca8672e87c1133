// Kernels that cover several adjacent plan steps in one launch (`model::lowering`), appended
// after kernels.cu and mmq.cu. Each computes exactly the expressions of the kernels it
// replaces, in the same order, so a fused launch writes the bits the separate ones write.

// `rms_norm` of each row (grid: rows; block: a power of two, at most 1024: the same partial
// sums and tree as `rms_norm`, so the same scale), its normed values written to y as
// `rms_norm` writes them, and also quantized into the activation blocks of `kind` (0 Q8_0,
// 1 Q8_1: `quantize_q8`'s expressions, one warp per block of 32; 2 Q8_K: `quantize_q8k`'s, one
// warp per block of 256), at the offsets those kernels write for a row of `dim` values. The
// value quantized is recomputed with the expression y holds (`x * scale * w`, no addition:
// nothing to contract), so it is y's value.
extern "C" __global__ void rms_norm_q8(const float* x, const float* w, float* y, int dim, float eps,
                                      int kind, signed char* qs, float* d, float* s, int* sums) {
    int r = blockIdx.x;
    long base = (long)r * dim;
    float scale = rms_norm_row(x + base, w, y + base, dim, eps);
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int warps = blockDim.x / WARP;
    if (kind != 2) {
        int nb = dim / 32;
        for (int b = warp; b < nb; b += warps) {
            int c = b * 32 + lane;
            long e = base + c;
            q8_block(x[e] * scale * w[c], lane, kind, qs + e, d + (long)r * nb + b,
                     s + (long)r * nb + b, sums + (long)r * nb + b);
        }
        return;
    }
    int nb = dim / 256;
    for (int b = warp; b < nb; b += warps) {
        int c0 = b * 256 + lane * 8;
        long e0 = base + c0;
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = x[e0 + j] * scale * w[c0 + j];
        q8k_block(v, lane, qs + e0, sums + (long)r * (dim / 16) + b * 16, d + (long)r * nb + b);
    }
}

// q, k and v of each row plus their biases (when bq is not null: `add_bias`'s `x + b`), RoPE
// of the first `rd` dimensions of every query and key head (`rope`'s expression), the
// queries written back to q, the keys and values stored into their KV block slots as f16
// (`kv_write`'s layout). One thread per (row, head of q | k | v, pair of dimensions): pair p
// below rd / 2 is RoPE's pair (adjacent, or halves with neox), above it the pair of
// unrotated dimensions rd + 2 (p - rd / 2) and the next. k and v in memory are left as the
// projection wrote them (nothing reads them after the KV write).
extern "C" __global__ void rope_kv_write(float* q, const float* k, const float* v, const float* bq,
                                        const float* bk, const float* bv, const float* cs, int rows,
                                        int heads, int kv_heads, int hd, int rd, int neox, u16* pool,
                                        const int* row_block, const int* row_slot, int stride,
                                        int layer, int bt, long block_len) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = hd / 2, rpairs = rd / 2;
    int all = heads + 2 * kv_heads;
    long total = (long)rows * all * pairs;
    if (i >= total) return;
    int p = (int)(i % pairs);
    long rh = i / pairs;
    int h = (int)(rh % all);
    int r = (int)(rh / all);
    int a, b;
    if (p < rpairs) {
        a = neox ? p : 2 * p;
        b = neox ? p + rpairs : 2 * p + 1;
    } else {
        a = rd + 2 * (p - rpairs);
        b = a + 1;
    }
    int kv_dim = kv_heads * hd;
    const float* src;
    const float* bias;
    int col;
    if (h < heads) {
        col = h * hd;
        src = q + (long)r * heads * hd;
        bias = bq;
    } else if (h < heads + kv_heads) {
        col = (h - heads) * hd;
        src = k + (long)r * kv_dim;
        bias = bk;
    } else {
        col = (h - heads - kv_heads) * hd;
        src = v + (long)r * kv_dim;
        bias = bv;
    }
    float x0 = src[col + a], x1 = src[col + b];
    if (bq != 0) {
        x0 = __fadd_rn(x0, bias[col + a]);
        x1 = __fadd_rn(x1, bias[col + b]);
    }
    if (h < heads + kv_heads && p < rpairs) {
        float c = cs[(long)r * rd + 2 * p];
        float sn = cs[(long)r * rd + 2 * p + 1];
        float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
        x0 = y0;
        x1 = y1;
    }
    if (h < heads) {
        float* dst = q + (long)r * heads * hd + col;
        dst[a] = x0;
        dst[b] = x1;
        return;
    }
    int is_value = h >= heads + kv_heads;
    long at = (long)row_block[r] * block_len + ((long)(layer * 2 + is_value) * bt + row_slot[r]) * stride + col;
    pool[at + a] = float_to_half(x0);
    pool[at + b] = float_to_half(x1);
}
