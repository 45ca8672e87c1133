
// ---- deltanet.cu: Qwen3.5's hybrid layers (Gated DeltaNet, the output gate, the shared
// expert's gate) and the CPU's logf ----
// Each kernel does the CPU's arithmetic (`model/deltanet.rs`, `model/moe.rs`) in its order,
// every float operation explicitly rounded (nothing contracted into an fma the CPU does not
// make), with the CPU's expf (`cpu_expf`, moe.cu) and logf (`cpu_logf`), so that its host
// emulation (`cuda/emulate_deltanet.rs`) and the CPU give the same bits. A sequence's
// recurrent state is the CPU's layout (`Hybrid::state_offset`): per linear layer, the conv
// inputs kept (channel by channel, `taps - 1` each), then one s x s matrix per value head.

// 1/c and log c (f64 bits) of glibc's logf table (`expf.rs`'s LOG_TABLE), interleaved.
__device__ const unsigned long long CPU_LOG_TABLE[32] = {
    0x3ff661ec79f8f3beull, 0xbfd57bf7808caadeull, 0x3ff571ed4aaf883dull, 0xbfd2bef0a7c06ddbull,
    0x3ff49539f0f010b0ull, 0xbfd01eae7f513a67ull, 0x3ff3c995b0b80385ull, 0xbfcb31d8a68224e9ull,
    0x3ff30d190c8864a5ull, 0xbfc6574f0ac07758ull, 0x3ff25e227b0b8ea0ull, 0xbfc1aa2bc79c8100ull,
    0x3ff1bb4a4a1a343full, 0xbfba4e76ce8c0e5eull, 0x3ff12358f08ae5baull, 0xbfb1973c5a611cccull,
    0x3ff0953f419900a7ull, 0xbfa252f438e10c1eull, 0x3ff0000000000000ull, 0x0000000000000000ull,
    0x3fee608cfd9a47acull, 0x3faaa5aa5df25984ull, 0x3feca4b31f026aa0ull, 0x3fbc5e53aa362eb4ull,
    0x3feb2036576afce6ull, 0x3fc526e57720db08ull, 0x3fe9c2d163a1aa2dull, 0x3fcbc2860d224770ull,
    0x3fe886e6037841edull, 0x3fd1058bc8a07ee1ull, 0x3fe767dcf5534862ull, 0x3fd4043057b6ee09ull
};

// ln x rounded to f32 exactly as the CPU's `log_f32` (glibc's FMA `logf`).
__device__ float cpu_logf(float x) {
    unsigned ix = __float_as_uint(x);
    if (ix == 0x3f800000u) return 0.0f;
    if (ix - 0x00800000u >= 0x7f800000u - 0x00800000u) {
        if (ix * 2u == 0u) return __int_as_float(0xff800000);
        if (ix == 0x7f800000u) return x;
        if ((ix & 0x80000000u) || ix * 2u >= 0xff000000u) return __int_as_float(0x7fc00000);
        ix = __float_as_uint(__fmul_rn(x, 8388608.0f)) - (23u << 23);
    }
    unsigned tmp = ix - 0x3f330000u;
    int i = (int)((tmp >> 19) % 16u);
    int k = ((int)tmp) >> 23;
    double z = (double)__uint_as_float(ix - (tmp & 0xff800000u));
    double invc = __longlong_as_double((long long)CPU_LOG_TABLE[2 * i]);
    double logc = __longlong_as_double((long long)CPU_LOG_TABLE[2 * i + 1]);
    const double ln2 = __longlong_as_double(0x3fe62e42fefa39efLL);
    const double a0 = __longlong_as_double((long long)0xbfd00ea348b88334ull);
    const double a1 = __longlong_as_double(0x3fd5575b0be00b6aLL);
    const double a2 = __longlong_as_double((long long)0xbfdffffef20a4123ull);
    double r = __fma_rn(z, invc, -1.0);
    double y0 = __fma_rn((double)k, ln2, logc);
    double r2 = __dmul_rn(r, r);
    double y = __fma_rn(a1, r, a2);
    y = __fma_rn(a0, r2, y);
    return __double2float_rn(__fma_rn(y, r2, __dadd_rn(y0, r)));
}

// SiLU as the CPU's `silu_in_place`: x / (1 + e^(-x - 0)).
__device__ inline float cpu_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, cpu_expf(__fsub_rn(-x, 0.0f))));
}

// The CPU's `rms_scale` of n values: each square in f32, summed in f64 in order, the mean
// rounded to f32, 1 / sqrtf(mean + eps).
__device__ float cpu_rms_scale(const float* x, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss = __dadd_rn(ss, (double)__fmul_rn(x[i], x[i]));
    float mean = __double2float_rn(__ddiv_rn(ss, (double)n));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// Step::Conv, one thread per (channel, sequence): the causal conv1d of the channel over the
// `taps - 1` inputs the sequence's state keeps and its `n` new rows (`spans[2q]` the first
// row, `spans[2q + 1]` n), the taps summed in order in f32, then SiLU into `out`; the state
// then keeps the last `taps - 1` inputs. `states[q]` is sequence q's state, `off` the layer's
// conv inputs in it.
extern "C" __global__ void delta_conv(const float* mixed, float* out, const unsigned long long* states, long off,
                                      const int* spans, int seqs, int cd, int taps, const float* w) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int q = blockIdx.y;
    if (c >= cd || q >= seqs) return;
    int r0 = spans[2 * q], n = spans[2 * q + 1];
    if (n == 0) return;
    int keep = taps - 1;
    float* kept = (float*)states[q] + off + (long)c * keep;
    const float* wc = w + (long)c * taps;
    for (int i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int t = 0; t < taps; t++) {
            int at = i + t;
            float x = at < keep ? kept[at] : mixed[(long)(r0 + at - keep) * cd + c];
            sum = __fadd_rn(sum, __fmul_rn(x, wc[t]));
        }
        out[(long)(r0 + i) * cd + c] = cpu_silu(sum);
    }
    // Input n + j of the window becomes kept input j (n >= 1: read before it is written).
    for (int j = 0; j < keep; j++) {
        int at = n + j;
        kept[j] = at < keep ? kept[at] : mixed[(long)(r0 + at - keep) * cd + c];
    }
}

// Step::DeltaRule's first part, one thread per (row, query or key head) then per (row, value
// head): each q/k head (`qk_heads` of s after each other at the start of the row's `cd`
// convolved channels) times its rms scale (eps `n_eps` = eps / s) times `inv` = 1 / sqrt(s);
// beta = sigmoid(beta); alpha = softplus(alpha + dt_bias) * a.
extern "C" __global__ void delta_prep(float* conv, float* beta, float* alpha, const float* dt_bias, const float* a,
                                      int rows, int cd, int s, int qk_heads, int v_heads, float n_eps, float inv) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long nqk = (long)rows * qk_heads;
    if (i < nqk) {
        float* x = conv + (i / qk_heads) * cd + (long)(i % qk_heads) * s;
        float scale = cpu_rms_scale(x, s, n_eps);
        for (int c = 0; c < s; c++) x[c] = __fmul_rn(__fmul_rn(x[c], scale), inv);
        return;
    }
    i -= nqk;
    if (i >= (long)rows * v_heads) return;
    int v = (int)(i % v_heads);
    beta[i] = cpu_sigmoid(beta[i]);
    float x = __fadd_rn(alpha[i], dt_bias[v]);
    float sp = x > 20.0f ? x : cpu_logf(__fadd_rn(1.0f, cpu_expf(x)));
    alpha[i] = __fmul_rn(sp, a[v]);
}

// Step::DeltaRule, one block of s threads per (value head, sequence): the head's state matrix
// S, row-major (m[i * s + j]: key index i, value index j; thread j owns column j, so a warp's
// loads of one row are coalesced), one token at a time: S <- S e^g, delta = (v - S^T k) beta,
// S <- S + k delta^T (an fma per element, as the CPU's `mul_add`), out = S^T q / sqrt(s); each
// column's sums in index order. Value head v reads key head (v / k_div) % k_heads: k_div 1
// tiles the key heads (Qwen3.5), k_div = v_heads / k_heads groups the value heads by key head
// (Qwen3-Next). The token's q, k and v are staged in shared memory (3 s floats).
extern "C" __global__ void delta_rule(const float* conv, const float* beta, const float* alpha,
                                      const unsigned long long* states, long off, const int* spans, int cd, int kd,
                                      int s, int k_div, int k_heads, int v_heads, float inv, float* out) {
    extern __shared__ float staged[];
    int v = blockIdx.x, q = blockIdx.y, j = threadIdx.x;
    int r0 = spans[2 * q], n = spans[2 * q + 1];
    int kh = (v / k_div) % k_heads;
    float* m = (float*)states[q] + off + (long)v * s * s + j;
    float *sq = staged, *sk = staged + s, *sv = staged + 2 * s;
    for (int t = 0; t < n; t++) {
        const float* row = conv + (long)(r0 + t) * cd;
        sq[j] = row[kh * s + j];
        sk[j] = row[kd + kh * s + j];
        sv[j] = row[2 * kd + v * s + j];
        __syncthreads();
        long bi = (long)(r0 + t) * v_heads + v;
        float b = beta[bi], decay = cpu_expf(alpha[bi]);
        float dot = 0.0f;
        for (int i = 0; i < s; i++) {
            float x = __fmul_rn(m[(long)i * s], decay);
            m[(long)i * s] = x;
            dot = __fadd_rn(dot, __fmul_rn(x, sk[i]));
        }
        float d = __fmul_rn(__fsub_rn(sv[j], dot), b);
        float o = 0.0f;
        for (int i = 0; i < s; i++) {
            float x = __fmaf_rn(sk[i], d, m[(long)i * s]);
            m[(long)i * s] = x;
            o = __fadd_rn(o, __fmul_rn(x, sq[i]));
        }
        out[(long)(r0 + t) * v_heads * s + (long)v * s + j] = __fmul_rn(o, inv);
        __syncthreads();
    }
}

// Step::GatedNorm, one thread per (row, value head): attn = attn * rms_scale * w * silu(z),
// the products left to right.
extern "C" __global__ void gated_norm(float* attn, const float* z, const float* w, int s, long heads, float eps) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= heads) return;
    float* o = attn + i * s;
    const float* zz = z + i * s;
    float scale = cpu_rms_scale(o, s, eps);
    for (int c = 0; c < s; c++) o[c] = __fmul_rn(__fmul_rn(__fmul_rn(o[c], scale), w[c]), cpu_silu(zz[c]));
}

// Step::OutGate: attn = attn * sigmoid(gate), element by element.
extern "C" __global__ void out_gate(float* attn, const float* gate, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) attn[i] = __fmul_rn(attn[i], cpu_sigmoid(gate[i]));
}

// The shared expert's gate (Step::SharedExpert's last part): each row of `out` (dim wide)
// times sigmoid(its logit).
extern "C" __global__ void shared_gate(float* out, const float* logit, int dim, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = __fmul_rn(out[i], cpu_sigmoid(logit[i / dim]));
}
