
// ---- moe.cu: Mixture-of-Experts steps (route, group, combine) and the CPU's expf ----
// Each kernel does the CPU's arithmetic (`model/moe.rs`, `model/expf.rs`) in its order, every
// float operation explicitly rounded (`__fadd_rn` etc.: nothing contracted into an fma), so
// that its host emulation (`cuda/emulate_moe.rs`) and the CPU give the same bits.

// 2^(i/32) as f64 bits, minus i << 47 (`expf.rs`'s TABLE).
__device__ const unsigned long long CPU_EXP_TABLE[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull
};

// e^x rounded to f32 exactly as the CPU's `exp_f32` (glibc's FMA `expf`).
__device__ float cpu_expf(float x) {
    if (x < __int_as_float(0xc2cff1b4)) return 0.0f;
    if (x > __int_as_float(0x42b17217)) return __int_as_float(0x7f800000);
    const double inv_ln2_n = __longlong_as_double(0x3ff71547652b82feLL) * 32.0;
    const double shift = __longlong_as_double(0x4338000000000000LL);
    const double c0 = __longlong_as_double(0x3fac6af84b912394LL) / 32768.0;
    const double c1 = __longlong_as_double(0x3fcebfce50fac4f3LL) / 1024.0;
    const double c2 = __longlong_as_double(0x3fe62e42ff0c52d6LL) / 32.0;
    double xd = (double)x;
    double kd = __fma_rn(inv_ln2_n, xd, shift);
    unsigned long long ki = (unsigned long long)__double_as_longlong(kd);
    kd = __dsub_rn(kd, shift);
    double r = __fma_rn(inv_ln2_n, xd, -kd);
    double s = __longlong_as_double((long long)(CPU_EXP_TABLE[ki % 32] + (ki << 47)));
    double z = __fma_rn(c0, r, c1);
    double r2 = __dmul_rn(r, r);
    double y = __fma_rn(c2, r, 1.0);
    return __double2float_rn(__dmul_rn(__fma_rn(z, r2, y), s));
}

// ggml's soft_max as the CPU's `softmax_in_place`: e^(x - max), the sum in f64 in order,
// each times (float)(1 / sum).
__device__ void cpu_softmax(float* x, int n) {
    float mx = NEG_INF;
    for (int i = 0; i < n; i++) mx = fmaxf(mx, x[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = cpu_expf(__fsub_rn(x[i], mx));
        sum = __dadd_rn(sum, (double)x[i]);
    }
    float inv = __double2float_rn(__ddiv_rn(1.0, sum));
    for (int i = 0; i < n; i++) x[i] = __fmul_rn(x[i], inv);
}

// Rust's `f32::total_cmp` key: a larger key is a larger float in the total order.
__device__ inline int total_key(float v) {
    int k = __float_as_int(v);
    return k ^ (int)(((unsigned)(k >> 31)) >> 1);
}

// ggml's sigmoid with the CPU's expf: 1 / (1 + e^-x).
__device__ inline float cpu_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, cpu_expf(-x)));
}

// The largest at most MOE_MAX_GROUPS expert groups (DeepSeek-V3 has 8).
#define MOE_MAX_GROUPS 64

// Group-limited routing as `moe.rs`'s `keep_best_groups`: `sel` (experts wide) in `groups`
// groups of consecutive experts, each scored by the sum of its two largest values (by the total
// order, the larger first), the `best` best groups kept (ties to the lower group) and every
// other group's values set to -inf.
__device__ void keep_best_groups(float* sel, int experts, int groups, int best) {
    float score[MOE_MAX_GROUPS];
    bool kept[MOE_MAX_GROUPS];
    int per = experts / groups;
    for (int g = 0; g < groups; g++) {
        float a = NEG_INF, b = NEG_INF;
        for (int i = 0; i < per; i++) {
            float v = sel[g * per + i];
            if (total_key(v) > total_key(a)) {
                b = a;
                a = v;
            } else if (total_key(v) > total_key(b)) {
                b = v;
            }
        }
        score[g] = __fadd_rn(a, b);
        kept[g] = false;
    }
    for (int j = 0; j < best; j++) {
        int top = -1, tk = 0;
        for (int g = 0; g < groups; g++) {
            if (kept[g]) continue;
            int k = total_key(score[g]);
            if (top < 0 || k > tk) { top = g; tk = k; }
        }
        kept[top] = true;
    }
    for (int g = 0; g < groups; g++)
        if (!kept[g])
            for (int i = 0; i < per; i++) sel[g * per + i] = NEG_INF;
}

// Routing, one thread per row: the router's logits (rows x experts, from the router's matmul)
// plus the bias (when given), then `gating` 0 (softmax, top-k), 1 (softmax, top-k,
// renormalised), 2 (top-k of the logits, softmax over them), or DeepSeek's 3 + 2 * sigmoid +
// renormalised (`forward.rs`'s `gating_code`): softmax or sigmoid probabilities, the experts
// chosen by the probabilities plus `sel_bias` (when given) in `select` (rows x experts), only
// among the `best` best of `groups` groups (`groups` 0: no groups), weighed by the
// probabilities, renormalised or not, times `scale`. The k largest rank first, equal values to
// the lower expert index (`moe.rs`'s `rank`). Writes each row's experts and weights in rank
// order.
extern "C" __global__ void moe_route(float* logits, const float* bias, int rows, int experts, int used,
                                     int gating, int* chosen, float* weights, const float* sel_bias,
                                     float* select, int groups, int best, float scale) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float* p = logits + (long)r * experts;
    if (bias) for (int e = 0; e < experts; e++) p[e] = __fadd_rn(p[e], bias[e]);
    bool deepseek = gating >= 3;
    bool normalize = gating == 1 || (deepseek && (gating - 3) % 2 == 1);
    if (gating >= 5) {
        for (int e = 0; e < experts; e++) p[e] = cpu_sigmoid(p[e]);
    } else if (gating != 2) {
        cpu_softmax(p, experts);
    }
    // The values ranked: the probabilities, or DeepSeek's selection scores.
    const float* rk = p;
    if (deepseek) {
        float* sel = select + (long)r * experts;
        for (int e = 0; e < experts; e++) sel[e] = sel_bias ? __fadd_rn(p[e], sel_bias[e]) : p[e];
        if (groups > 0) keep_best_groups(sel, experts, groups, best);
        rk = sel;
    }
    int* ch = chosen + (long)r * used;
    float* w = weights + (long)r * used;
    for (int j = 0; j < used; j++) {
        int top = -1, tk = 0;
        for (int e = 0; e < experts; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken = taken || ch[i] == e;
            if (taken) continue;
            int k = total_key(rk[e]);
            if (top < 0 || k > tk) { top = e; tk = k; }
        }
        ch[j] = top;
        w[j] = p[top];
    }
    if (gating == 2) cpu_softmax(w, used);
    if (normalize) {
        double sum = 0.0;
        for (int j = 0; j < used; j++) sum = __dadd_rn(sum, (double)w[j]);
        // At least 2^-14 (f16's smallest normal), as ggml's clamp.
        float s = fmaxf(__double2float_rn(sum), 1.0f / 16384.0f);
        for (int j = 0; j < used; j++) w[j] = __fdiv_rn(w[j], s);
    }
    if (deepseek && scale != 1.0f)
        for (int j = 0; j < used; j++) w[j] = __fmul_rn(w[j], scale);
}

// Rows grouped by expert, one block of `experts` threads (at most 1024): thread e lists the
// (row, rank) pairs routed to expert e in row order after those of experts 0..e-1. `idx[g]` is
// the row of grouped position g, `slot[r * used + k]` the grouped position of row r's rank k,
// `counts[e]` expert e's rows, `gexp[g]` the expert of grouped position g. Fixed by the routing
// alone: no atomics.
extern "C" __global__ void moe_group(const int* chosen, int pairs, int used, int experts, int* idx, int* slot,
                                     int* counts, int* gexp) {
    extern __shared__ int n_of[];
    int e = threadIdx.x;
    int n = 0;
    if (e < experts)
        for (int i = 0; i < pairs; i++) n += chosen[i] == e;
    n_of[e] = n;
    __syncthreads();
    if (e >= experts) return;
    int g = 0;
    for (int j = 0; j < e; j++) g += n_of[j];
    counts[e] = n;
    for (int i = 0; i < pairs; i++) {
        if (chosen[i] != e) continue;
        idx[g] = i / used;
        slot[i] = g;
        gexp[g] = e;
        g++;
    }
}

// The row tiles of the grouped rows for `mmte_`: for each expert in order with counts[e] > 0
// rows (its segment starts after the earlier experts' rows), a tile every `tile_rows` of them,
// each 4 ints (expert, segment start, segment rows, first row in the segment); the rest of
// the `max_tiles` entries get 0 rows. One thread: a few hundred entries.
extern "C" __global__ void moe_tiles(const int* counts, int experts, int tile_rows, int* tiles, int max_tiles) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int t = 0, start = 0;
    for (int e = 0; e < experts; e++) {
        int n = counts[e];
        for (int r0 = 0; r0 < n && t < max_tiles; r0 += tile_rows, t++) {
            tiles[4 * t] = e;
            tiles[4 * t + 1] = start;
            tiles[4 * t + 2] = n;
            tiles[4 * t + 3] = r0;
        }
        start += n;
    }
    for (; t < max_tiles; t++) {
        tiles[4 * t] = 0;
        tiles[4 * t + 1] = 0;
        tiles[4 * t + 2] = 0;
        tiles[4 * t + 3] = 0;
    }
}

// x[p][c] += bias of expert gexp[p] (its address btab[gexp[p]]) at c, for the grouped rows p:
// `add_bias`'s add, each row with its own expert's bias.
extern "C" __global__ void add_bias_experts(float* x, const int* gexp, const unsigned long long* btab, int width,
                                            long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float* b = (const float*)btab[gexp[i / width]];
    x[i] += b[i % width];
}

// x[p][c] *= scale[gexp[p]] for the grouped rows p: `scale`'s product, each row by its own
// expert's output scale (Gemma 4's `ffn_down_exps.scale`).
extern "C" __global__ void scale_experts(float* x, const int* gexp, const float* scale, int width, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    x[i] = __fmul_rn(x[i], scale[gexp[i / width]]);
}

// xb[r] = sum over k of w[r, k] * out[slot[r, k]], ranks in order: the first product, then
// each next product added (ggml's `mul`, then chained `add`s; `moe.rs`'s `combine`).
extern "C" __global__ void moe_combine(const float* out, const int* slot, const float* w, int used, int dim,
                                       float* xb, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long r = i / dim;
    int c = (int)(i % dim);
    float acc = 0.0f;
    for (int k = 0; k < used; k++) {
        float v = __fmul_rn(out[(long)slot[r * used + k] * dim + c], w[r * used + k]);
        acc = k == 0 ? v : __fadd_rn(acc, v);
    }
    xb[i] = acc;
}

// The gated activations with the CPU's expf, in `transformer.rs`'s `gated` order:
// act 0 SwiGLU-OAI, g = min(g, 7), g / (1 + e^(1.702 * -g)) * (clamp(u, -7, 7) + 1);
// act 1 SiLU, g / (1 + e^-g) * u (the experts' SiLU; dense layers keep `gated_act`).
extern "C" __global__ void gated_act_cpu(float* g, const float* u, long total, int act) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float v = g[i], uu = u[i];
    if (act == 0) {
        v = fminf(v, 7.0f);
        float e = cpu_expf(__fsub_rn(__fmul_rn(1.702f, -v), 0.0f));
        if (uu < -7.0f) uu = -7.0f;
        if (uu > 7.0f) uu = 7.0f;
        g[i] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, e)), __fadd_rn(uu, 1.0f));
    } else {
        float e = cpu_expf(__fsub_rn(-v, 0.0f));
        g[i] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, e)), uu);
    }
}
