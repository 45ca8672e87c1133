//! Gated DeltaNet, the linear attention of Qwen3.5's hybrid layers (llama.cpp's
//! `src/models/qwen35.cpp` and `delta-net-base.cpp`; Yang et al., "Gated Delta Networks",
//! 2024): the geometry read from the GGUF ([`Hybrid`]), a layer's weights ([`DeltaNet`]) and
//! the steps the plan names (`Step::DeltaProject`, `Conv`, `DeltaRule`, `GatedNorm`), plus
//! the full-attention layers' output gate.
//!
//! A linear-attention layer keeps, per sequence, a fixed-size recurrent state instead of
//! keys and values: the last `taps − 1` inputs of its causal conv1d and one `S × S` matrix
//! per value head (row-major, a row per key index). That state belongs to the engine (behind
//! `KvSeq::state`); this module reads and updates it. There is ONE recurrence for every path:
//! each new row is folded into the state by the same per-token update in the same arithmetic
//! order (llama.cpp's fused `gated_delta_net` CPU op), whether it arrives in a prefill chunk of
//! any size, after a prefix-cache resume or in a decode step; sequences and heads are
//! independent, so neither the batch nor the thread count changes a bit.

use candle_core::quantized::gguf_file::{Content, Value};
use rayon::prelude::*;

use super::arch::{ArchSpec, ModelConfig, TensorSource};
use super::error::{ModelError, Result};
use super::expf::{exp_f32, exp_shifted_in_place, log_f32};
use super::kv::{KvSeq, SeqStep};
use super::quant::QWeight;
use super::transformer::WeightDType;
use crate::weights::gguf::md_usize;

/// The linear-attention geometry of a hybrid model and which layers are linear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hybrid {
    /// Taps of the causal conv1d (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Query/key heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads, each with its own state (`ssm.time_step_rank`).
    pub v_heads: usize,
    /// The head size `S` of queries, keys and values (`ssm.state_size`).
    pub head_dim: usize,
    /// Per layer, whether it is linear attention (llama.cpp: `attention.recurrent_layers`,
    /// else all but every `full_attention_interval`-th layer, default 4).
    pub linear: Vec<bool>,
    /// Value heads grouped by key head (Qwen3-Next: value head `h` reads key head
    /// `h / (v_heads / k_heads)`), else tiled (Qwen3.5: `h mod k_heads`).
    pub grouped: bool,
}

fn meta_err(key: &str, msg: String) -> ModelError {
    ModelError::Metadata {
        key: key.into(),
        msg,
    }
}

/// Which of the trunk's layers are linear attention: `attention.recurrent_layers` (one flag per
/// layer of `block_count`, the nextn layers' included; llama.cpp's converter writes it from
/// `layer_types`), else all but every `interval`-th layer (llama.cpp's rule when it is absent).
fn linear_layers(content: &Content, c: &ModelConfig, interval: usize) -> Result<Vec<bool>> {
    let key = format!("{}.attention.recurrent_layers", c.architecture);
    let flags = match content.metadata.get(&key) {
        None => return Ok((0..c.n_layer).map(|i| (i + 1) % interval != 0).collect()),
        Some(Value::Array(flags)) => flags,
        Some(_) => return Err(meta_err(&key, "expected an array of booleans".into())),
    };
    let n_all = md_usize(content, &format!("{}.block_count", c.architecture))?;
    if flags.len() != n_all {
        return Err(meta_err(
            &key,
            format!("{} flags for {n_all} layers", flags.len()),
        ));
    }
    flags[..c.n_layer]
        .iter()
        .map(|v| v.to_bool().map_err(|e| meta_err(&key, e.to_string())))
        .collect()
}

/// The checks both readers make of a linear-attention geometry: `Err((0, message))` for the
/// conv1d's taps, `Err((1, message))` for the heads (each reader names its own key).
fn check_geometry(
    conv_kernel: usize,
    k_heads: usize,
    v_heads: usize,
    head_dim: usize,
) -> std::result::Result<(), (usize, String)> {
    if !(1..=16).contains(&conv_kernel) {
        return Err((0, format!("{conv_kernel} taps (1 to 16 supported)")));
    }
    if head_dim == 0 || k_heads == 0 || v_heads == 0 || !v_heads.is_multiple_of(k_heads) {
        return Err((
            1,
            format!("{k_heads} key heads do not divide {v_heads} value heads of {head_dim}"),
        ));
    }
    Ok(())
}

impl Hybrid {
    /// The geometry of a hybrid architecture's `config.json` (transformers' Qwen3.5 keys,
    /// each required: transformers' defaults are those of the largest model): `linear_*`,
    /// the linear layers from `layer_types` (`linear_attention`), else all but every
    /// `full_attention_interval`-th (default 4). A checkpoint keeps its value heads grouped
    /// by key head ([`Hybrid::grouped`]); llama.cpp's converter reorders them into tiles.
    /// `None` for the other architectures.
    pub fn from_hf(
        path: &std::path::Path,
        json: &serde_json::Value,
        c: &ModelConfig,
    ) -> Result<Option<Hybrid>> {
        if !ArchSpec::of(c.arch).hybrid {
            return Ok(None);
        }
        let bad = |key: &str, msg: String| ModelError::Config {
            path: path.to_path_buf(),
            key: key.into(),
            msg,
        };
        let get = |k: &str| -> Result<usize> {
            match json.get(k) {
                Some(v) => v
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(k, format!("expected an unsigned integer, found {v}"))),
                None => Err(bad(k, "missing".into())),
            }
        };
        let conv_kernel = get("linear_conv_kernel_dim")?;
        let head_dim = get("linear_key_head_dim")?;
        let value_dim = get("linear_value_head_dim")?;
        let k_heads = get("linear_num_key_heads")?;
        let v_heads = get("linear_num_value_heads")?;
        if value_dim != head_dim {
            return Err(bad(
                "linear_value_head_dim",
                format!("{value_dim}: only value heads as wide as key heads ({head_dim})"),
            ));
        }
        let linear = match json.get("layer_types").and_then(|t| t.as_array()) {
            Some(types) if types.len() != c.n_layer => {
                return Err(bad(
                    "layer_types",
                    format!("{} entries for {} layers", types.len(), c.n_layer),
                ))
            }
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(bad("layer_types", format!("{t}: not a layer type"))),
                })
                .collect::<Result<Vec<bool>>>()?,
            None => {
                let interval = match json.get("full_attention_interval") {
                    Some(_) => get("full_attention_interval")?,
                    None => 4,
                };
                if interval == 0 {
                    return Err(bad("full_attention_interval", "0".into()));
                }
                (0..c.n_layer).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        check_geometry(conv_kernel, k_heads, v_heads, head_dim)
            .map_err(|(i, msg)| bad(["linear_conv_kernel_dim", "linear_num_key_heads"][i], msg))?;
        Ok(Some(Hybrid {
            conv_kernel,
            k_heads,
            v_heads,
            head_dim,
            linear,
            grouped: true,
        }))
    }

    /// The geometry of a hybrid architecture's GGUF (`None` for the others).
    pub fn from_gguf(content: &Content, c: &ModelConfig) -> Result<Option<Hybrid>> {
        if !ArchSpec::of(c.arch).hybrid {
            return Ok(None);
        }
        let key = |k: &str| format!("{}.{k}", c.architecture);
        let get = |k: &str| md_usize(content, &key(k)).map_err(ModelError::from);
        let conv_kernel = get("ssm.conv_kernel")?;
        let head_dim = get("ssm.state_size")?;
        let v_heads = get("ssm.time_step_rank")?;
        let k_heads = get("ssm.group_count")?;
        let inner = get("ssm.inner_size")?;
        check_geometry(conv_kernel, k_heads, v_heads, head_dim)
            .map_err(|(i, msg)| meta_err(&key(["ssm.conv_kernel", "ssm.group_count"][i]), msg))?;
        if inner != v_heads * head_dim {
            return Err(meta_err(
                &key("ssm.inner_size"),
                format!("{inner} is not {v_heads} value heads of {head_dim}"),
            ));
        }
        let interval = match content
            .metadata
            .contains_key(&key("full_attention_interval"))
        {
            true => get("full_attention_interval")?,
            false => 4,
        };
        if interval == 0 {
            return Err(meta_err(&key("full_attention_interval"), "0".into()));
        }
        let grouped = ArchSpec::of(c.arch).grouped_ssm;
        Ok(Some(Hybrid {
            conv_kernel,
            k_heads,
            v_heads,
            head_dim,
            linear: linear_layers(content, c, interval)?,
            grouped,
        }))
    }

    /// Qwen3-Next's fused rows, `widths[j]` rows of part `j` after each other per key head,
    /// split: each part's rows over all key heads, in order.
    pub fn grouped_rows<const N: usize>(&self, widths: [usize; N]) -> [Vec<usize>; N] {
        let per: usize = widths.iter().sum();
        let mut at = 0;
        widths.map(|w| {
            let part = (0..self.k_heads)
                .flat_map(|g| g * per + at..g * per + at + w)
                .collect();
            at += w;
            part
        })
    }

    /// The key (and query) head value head `v` reads: `v / (v_heads / k_heads)` when the value
    /// heads are grouped by key head, else `v mod k_heads`.
    pub fn k_head(&self, v: usize) -> usize {
        (v / self.k_div()) % self.k_heads
    }

    /// Value heads per step of the key head: `v_heads / k_heads` when grouped, else 1
    /// ([`Hybrid::k_head`] is `(v / k_div) mod k_heads`, the GPU kernel's arithmetic).
    pub fn k_div(&self) -> usize {
        match self.grouped {
            true => self.v_heads / self.k_heads,
            false => 1,
        }
    }

    /// Width of the keys (and of the queries).
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    /// Width of the values (and of the layer's output before its projection).
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the conv1d: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub(super) fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    fn layer_state_len(&self) -> usize {
        self.conv_state_len() + self.v_heads * self.head_dim * self.head_dim
    }

    /// Floats of recurrent state one sequence holds: every linear layer's conv inputs and
    /// delta-rule matrices.
    pub fn state_len(&self) -> usize {
        self.linear.iter().filter(|&&l| l).count() * self.layer_state_len()
    }

    /// Where layer `l`'s state starts in a sequence's state.
    pub(super) fn state_offset(&self, l: usize) -> usize {
        self.linear[..l].iter().filter(|&&x| x).count() * self.layer_state_len()
    }
}

/// A linear-attention layer's weights besides its input projection of q|k|v (the layer's
/// fused `qkv`, `attn_qkv`) and its output projection (the layer's `wo`, `ssm_out`).
pub(super) struct DeltaNet {
    /// The output gate `z` (`attn_gate`, value width).
    pub(super) z: QWeight,
    /// β's logits per value head (`ssm_beta`).
    pub(super) beta: QWeight,
    /// The decay's logits per value head (`ssm_alpha`).
    pub(super) alpha: QWeight,
    /// The conv1d's taps (`ssm_conv1d`, `conv_dim × taps` in the file) held tap by tap,
    /// `taps × conv_dim`, oldest input first: the layout of the row-by-row conv
    /// ([`transpose`] gives the file's back, as the GPU's kernel reads it).
    pub(super) conv: Vec<f32>,
    /// The decay's bias per value head (`ssm_dt.bias`).
    pub(super) dt_bias: Vec<f32>,
    /// `−exp(A_log)` per value head (`ssm_a`).
    pub(super) a: Vec<f32>,
    /// The gated norm's weight, one head wide (`ssm_norm`).
    pub(super) norm: Vec<f32>,
}

impl DeltaNet {
    /// Layer `l`'s tensors, matrices held as `dtype` says, and its fused q|k|v projection
    /// (`attn_qkv`). Qwen3-Next's layout ([`Hybrid::grouped`]) is split into the same
    /// matrices: β and α from `ssm_ba` (per key head, its value heads' β then their α), and
    /// in an older file without `attn_qkv` q|k|v and `z` from `ssm_in` (per key head, its q,
    /// k, then its value heads' v and z), their rows gathered in the order the other layout
    /// stores them (llama.cpp's views of the fused products; a row's products depend on that
    /// row alone, so the bits are the same).
    pub(super) fn load(
        src: &mut dyn TensorSource,
        l: usize,
        h: &Hybrid,
        dim: usize,
        dtype: WeightDType,
    ) -> Result<(DeltaNet, QWeight)> {
        let name = |s: &str| format!("blk.{l}.{s}");
        let mat = |src: &mut dyn TensorSource, n: &str, shape: &[usize]| {
            super::transformer::build_matrix(src, n, shape, dtype)
        };
        let rows = |src: &mut dyn TensorSource, n: &str, shape: &[usize], rows: &[usize]| {
            super::transformer::build_matrix_rows(src, n, shape, rows, dtype)
        };
        let (s, r) = (h.head_dim, h.v_heads / h.k_heads);
        let legacy = h.grouped
            && !src.has_tensor(&name("attn_qkv.weight"))
            && src.has_tensor(&name("ssm_in.weight"));
        let (qkv, z) = if legacy {
            let [q, k, v, z] = h.grouped_rows([s, s, r * s, r * s]);
            let shape = [h.conv_dim() + h.value_dim(), dim];
            let qkv: Vec<usize> = [q, k, v].concat();
            (
                rows(src, &name("ssm_in.weight"), &shape, &qkv)?,
                rows(src, &name("ssm_in.weight"), &shape, &z)?,
            )
        } else {
            (
                mat(src, &name("attn_qkv.weight"), &[h.conv_dim(), dim])?,
                mat(src, &name("attn_gate.weight"), &[h.value_dim(), dim])?,
            )
        };
        // Qwen3-Next's files fuse β and α per key head; a Qwen3.5 checkpoint (its value heads
        // grouped too) keeps them apart.
        let (beta, alpha) = if h.grouped && !src.has_tensor(&name("ssm_beta.weight")) {
            let [b, a] = h.grouped_rows([r, r]);
            let shape = [2 * h.v_heads, dim];
            (
                rows(src, &name("ssm_ba.weight"), &shape, &b)?,
                rows(src, &name("ssm_ba.weight"), &shape, &a)?,
            )
        } else {
            (
                mat(src, &name("ssm_beta.weight"), &[h.v_heads, dim])?,
                mat(src, &name("ssm_alpha.weight"), &[h.v_heads, dim])?,
            )
        };
        let vector = |src: &mut dyn TensorSource, n: String, shape: &[usize]| {
            let q = src.read_tensor(&n, shape)?;
            super::transformer::to_f32_vec(&n, &q)
        };
        let conv = vector(
            src,
            name("ssm_conv1d.weight"),
            &[h.conv_dim(), h.conv_kernel],
        )?;
        let delta = DeltaNet {
            z,
            beta,
            alpha,
            conv: transpose(&conv, h.conv_dim(), h.conv_kernel),
            dt_bias: vector(src, name("ssm_dt.bias"), &[h.v_heads])?,
            a: vector(src, name("ssm_a"), &[h.v_heads])?,
            norm: vector(src, name("ssm_norm.weight"), &[h.head_dim])?,
        };
        Ok((delta, qkv))
    }

    /// Every matrix besides the layer's q|k|v and output projections.
    pub(super) fn matrices(&self) -> [&QWeight; 3] {
        [&self.z, &self.beta, &self.alpha]
    }
}

/// A row-major `rows × cols` matrix transposed (`cols × rows`).
pub(super) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    debug_assert_eq!(m.len(), rows * cols);
    let mut out = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// The linear-attention steps' buffers (and the full-attention output gate's).
#[derive(Debug, Default)]
pub struct DeltaScratch {
    /// The mixed q|k|v channels (`conv_dim` per row), then their convolution.
    pub(super) mixed: Vec<f32>,
    pub(super) conv: Vec<f32>,
    pub(super) z: Vec<f32>,
    pub(super) beta: Vec<f32>,
    pub(super) alpha: Vec<f32>,
    /// The full-attention layers' output gate (`q_dim` per row).
    pub(super) gate: Vec<f32>,
    /// A sequence's kept conv inputs, `(taps − 1) × conv_dim`, oldest first.
    pub(super) kept: Vec<f32>,
}

impl DeltaScratch {
    pub(super) fn prepare(&mut self, h: &Hybrid, q_dim: usize, rows: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.mixed, rows * h.conv_dim());
        fit(&mut self.conv, rows * h.conv_dim());
        fit(&mut self.z, rows * h.value_dim());
        fit(&mut self.beta, rows * h.v_heads);
        fit(&mut self.alpha, rows * h.v_heads);
        fit(&mut self.gate, rows * q_dim);
        fit(&mut self.kept, (h.conv_kernel - 1) * h.conv_dim());
    }
}

/// `x / (1 + e^−x)` in place, the exponentials a vector at a time (as the feed-forward SiLU).
fn silu_in_place(x: &mut [f32]) {
    let mut e = [0f32; 256];
    for x in x.chunks_mut(e.len()) {
        let e = &mut e[..x.len()];
        for (e, x) in e.iter_mut().zip(x.iter()) {
            *e = -*x;
        }
        exp_shifted_in_place(e, 0.0);
        for (x, e) in x.iter_mut().zip(e.iter()) {
            *x /= 1.0 + e;
        }
    }
}

/// ggml's `sigmoid`: `1 / (1 + expf(−x))`.
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// ggml's `softplus`: `x` above 20, else `logf(1 + expf(x))` (glibc's `logf`, the same bits
/// everywhere: [`log_f32`]).
pub(super) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        log_f32(1.0 + exp_f32(x))
    }
}

/// ggml's `rms_norm` scale of `x` (each square in f32, summed in f64, the mean rounded to
/// f32, `1 / sqrtf(mean + eps)`).
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// One token of the gated delta rule through one value head's state (see [`DeltaNet::rule`]).
struct Token<'a> {
    k: &'a [f32],
    q: &'a [f32],
    val: &'a [f32],
    beta: f32,
    decay: f32,
    inv: f32,
}

impl Token<'_> {
    /// `S ← S · decay`, `δ = (v − Sᵀk) · β`, `S ← S + k δᵀ`, `o = Sᵀq · inv`; `m` is `S`
    /// row-major (`m[i·S + j]`: key index `i`, value index `j`), so a state row is one value
    /// per output column and the columns' sums run side by side in vector lanes. Each column
    /// `j` is `column`'s arithmetic (the test's reference), its sums in index order, whatever block it falls in.
    /// On x86-64 with AVX2 and FMA it runs as code compiled for them (the fused multiply-add
    /// one instruction, not a libm call per element; the loops vectorized); the operations,
    /// and so the bits, are the same.
    fn through(&self, m: &mut [f32], o: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { self.through_avx2(m, o) };
        }
        self.through_any(m, o)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn through_avx2(&self, m: &mut [f32], o: &mut [f32]) {
        self.through_any(m, o)
    }

    /// Blocks of [`COLS`] columns (then 8, then one), each through both of its passes while
    /// in cache: columns are independent, so the block sizes change no bit.
    #[inline(always)]
    fn through_any(&self, m: &mut [f32], o: &mut [f32]) {
        let s = o.len();
        let mut j0 = 0;
        while j0 + COLS <= s {
            self.block::<COLS>(m, j0, o);
            j0 += COLS;
        }
        while j0 + 8 <= s {
            self.block::<8>(m, j0, o);
            j0 += 8;
        }
        while j0 < s {
            self.block::<1>(m, j0, o);
            j0 += 1;
        }
    }

    /// Columns `j0..j0 + W` of the state: `column`'s arithmetic for each, the columns in lanes.
    #[inline(always)]
    fn block<const W: usize>(&self, m: &mut [f32], j0: usize, o: &mut [f32]) {
        let s = o.len();
        let (k, q) = (&self.k[..s], &self.q[..s]);
        let mut acc = [0f32; W];
        for (i, &ki) in k.iter().enumerate() {
            let row: &mut [f32; W] = (&mut m[i * s + j0..i * s + j0 + W]).try_into().unwrap();
            for (x, a) in row.iter_mut().zip(acc.iter_mut()) {
                *x *= self.decay;
                *a += *x * ki;
            }
        }
        let mut delta = [0f32; W];
        for ((d, &v), &a) in delta.iter_mut().zip(&self.val[j0..j0 + W]).zip(&acc) {
            *d = (v - a) * self.beta;
        }
        let mut acc = [0f32; W];
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            let row: &mut [f32; W] = (&mut m[i * s + j0..i * s + j0 + W]).try_into().unwrap();
            for ((x, a), &d) in row.iter_mut().zip(acc.iter_mut()).zip(&delta) {
                *x = ki.mul_add(d, *x);
                *a += *x * qi;
            }
        }
        for (o, &a) in o[j0..j0 + W].iter_mut().zip(&acc) {
            *o = a * self.inv;
        }
    }
}

/// Columns of the delta rule's state that one block of [`Token::through`] runs side by side:
/// 64 floats, eight AVX2 registers of sums, so that the additions of one column (a chain in
/// index order) wait on no other's.
const COLS: usize = 64;

/// Column `j` of one token through the state, one element at a time: the arithmetic every
/// block of [`Token::through`] does for it (the reference of its test).
#[cfg(test)]
fn column(t: &Token<'_>, m: &mut [f32], j: usize) -> f32 {
    let s = t.k.len();
    let mut dot = 0f32;
    for i in 0..s {
        m[i * s + j] *= t.decay;
        dot += m[i * s + j] * t.k[i];
    }
    let d = (t.val[j] - dot) * t.beta;
    let mut o = 0f32;
    for i in 0..s {
        m[i * s + j] = t.k[i].mul_add(d, m[i * s + j]);
        o += m[i * s + j] * t.q[i];
    }
    o * t.inv
}

/// `attn = attn · sigmoid(gate)`, element by element (the full-attention output gate).
pub(super) fn out_gate(attn: &mut [f32], gate: &[f32]) {
    for (a, &g) in attn.iter_mut().zip(gate) {
        *a *= sigmoid(g);
    }
}

/// The query projection's rows (each head's query then its gate, `2 · q_dim` per row) split
/// into the queries and the gate.
pub(super) fn split_gate(fused: &[f32], hd: usize, q: &mut [f32], gate: &mut [f32]) {
    for (i, pair) in fused.chunks_exact(2 * hd).enumerate() {
        q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
        gate[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
    }
}

impl DeltaNet {
    /// `Step::DeltaProject`: `xb` times the fused q|k|v matrix, the gate `z`, β's and the
    /// decay's logits.
    pub(super) fn project(&self, qkv: &QWeight, xb: &[f32], rows: usize, d: &mut DeltaScratch) {
        QWeight::matmul_shared(
            &[qkv, &self.z, &self.beta, &self.alpha],
            xb,
            rows,
            &mut [
                &mut d.mixed[..rows * qkv.rows()],
                &mut d.z[..rows * self.z.rows()],
                &mut d.beta[..rows * self.beta.rows()],
                &mut d.alpha[..rows * self.alpha.rows()],
            ],
        );
    }

    /// `Step::Conv`: each sequence's causal conv1d of its mixed channels over the inputs its
    /// state keeps and its new rows (llama.cpp's `ssm_conv`: the taps summed in order, in
    /// f32), then SiLU; the state keeps the last `taps − 1` inputs.
    pub(super) fn conv<K: KvSeq>(
        &self,
        h: &Hybrid,
        l: usize,
        seqs: &mut [SeqStep<'_, K>],
        spans: &[(usize, usize, usize)],
        d: &mut DeltaScratch,
    ) {
        let (cd, taps) = (h.conv_dim(), h.conv_kernel);
        let kept_len = taps - 1;
        let off = h.state_offset(l);
        // Row by row, every channel at once (each channel's taps still summed in order from
        // 0.0, so the same bits as one channel at a time): the rows are contiguous, where a
        // channel at a time read and wrote one value per cache line. 512-token prefill on a
        // 2-core Zen 5 EPYC, the two builds alternated: Qwen3.5-4B-8l 224.7 → 256.0 tok/s,
        // Qwen3.5-35B-A3B-16l 145.5 → 177.2 (docs/speed-history.md, 2026-11-29).
        let w = &self.conv;
        let DeltaScratch {
            mixed, conv, kept, ..
        } = &mut *d;
        let prev = &mut kept[..kept_len * cd];
        for (seq, &(r0, n, _)) in seqs.iter_mut().zip(spans) {
            let state = &mut seq.kv.state_mut()[off..off + h.conv_state_len()];
            for c in 0..cd {
                for j in 0..kept_len {
                    prev[j * cd + c] = state[c * kept_len + j];
                }
            }
            // Input `i` of the window: a kept input, then the new rows.
            let input = |i: usize| -> &[f32] {
                if i < kept_len {
                    &prev[i * cd..(i + 1) * cd]
                } else {
                    let r = r0 + i - kept_len;
                    &mixed[r * cd..(r + 1) * cd]
                }
            };
            for i in 0..n {
                let out = &mut conv[(r0 + i) * cd..(r0 + i + 1) * cd];
                out.fill(0.0);
                for t in 0..taps {
                    let (x, wt) = (input(i + t), &w[t * cd..(t + 1) * cd]);
                    for ((o, &x), &wt) in out.iter_mut().zip(x).zip(wt) {
                        *o += x * wt;
                    }
                }
            }
            // The state keeps the window's last `taps − 1` inputs.
            for j in 0..kept_len {
                let x = input(n + j);
                for (c, &v) in x.iter().enumerate() {
                    state[c * kept_len + j] = v;
                }
            }
        }
        let rows: usize = spans.iter().map(|s| s.1).sum();
        silu_in_place(&mut conv[..rows * cd]);
    }

    /// `Step::DeltaRule`: the queries and keys L2-normed (llama.cpp's `rms_norm` with
    /// `eps / S` times `1 / sqrt(S)`), β = sigmoid, the decay `g = softplus(α + dt) · a`; then
    /// per sequence and value head, one token at a time: `S ← S · e^g`,
    /// `δ = (v − Sᵀk) · β`, `S ← S + k δᵀ`, `out = Sᵀq / sqrt(S)` (value head `h` reads
    /// key head [`Hybrid::k_head`]: `h mod k_heads` as llama.cpp's broadcast, or Qwen3-Next's
    /// `h / (v_heads / k_heads)` as its repeat-interleave). Output into `out` (value width per
    /// row).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rule<K: KvSeq>(
        &self,
        h: &Hybrid,
        l: usize,
        eps: f32,
        seqs: &mut [SeqStep<'_, K>],
        spans: &[(usize, usize, usize)],
        d: &mut DeltaScratch,
        out: &mut [f32],
    ) {
        let (cd, s, kd, vd) = (h.conv_dim(), h.head_dim, h.key_dim(), h.value_dim());
        let rows: usize = spans.iter().map(|x| x.1).sum();
        let (n_eps, inv) = (eps / s as f32, 1.0 / (s as f32).sqrt());
        for r in 0..rows {
            for head in d.conv[r * cd..r * cd + 2 * kd].chunks_exact_mut(s) {
                let scale = rms_scale(head, n_eps);
                for v in head.iter_mut() {
                    *v = *v * scale * inv;
                }
            }
            for v in 0..h.v_heads {
                let i = r * h.v_heads + v;
                d.beta[i] = sigmoid(d.beta[i]);
                d.alpha[i] = softplus(d.alpha[i] + self.dt_bias[v]) * self.a[v];
            }
        }
        let off = h.state_offset(l) + h.conv_state_len();
        let d = &*d;
        for (seq, &(r0, n, _)) in seqs.iter_mut().zip(spans) {
            let states = &mut seq.kv.state_mut()[off..off + h.v_heads * s * s];
            let heads: Vec<Vec<f32>> = states
                .par_chunks_mut(s * s)
                .enumerate()
                .map(|(v, m)| {
                    let kh = h.k_head(v);
                    let mut o = vec![0f32; n * s];
                    for t in 0..n {
                        let row = &d.conv[(r0 + t) * cd..(r0 + t + 1) * cd];
                        let q = &row[kh * s..(kh + 1) * s];
                        let k = &row[kd + kh * s..kd + (kh + 1) * s];
                        let val = &row[2 * kd + v * s..2 * kd + (v + 1) * s];
                        let i = (r0 + t) * h.v_heads + v;
                        let (beta, decay) = (d.beta[i], exp_f32(d.alpha[i]));
                        let o = &mut o[t * s..(t + 1) * s];
                        let step = Token {
                            k,
                            q,
                            val,
                            beta,
                            decay,
                            inv,
                        };
                        step.through(m, o);
                    }
                    o
                })
                .collect();
            for (v, o) in heads.iter().enumerate() {
                for t in 0..n {
                    out[(r0 + t) * vd + v * s..][..s].copy_from_slice(&o[t * s..(t + 1) * s]);
                }
            }
        }
    }

    /// `Step::GatedNorm`: each value head's output RMS-normed times the norm's weight, times
    /// `silu(z)`.
    pub(super) fn gated_norm(
        &self,
        h: &Hybrid,
        eps: f32,
        rows: usize,
        d: &mut DeltaScratch,
        out: &mut [f32],
    ) {
        let s = h.head_dim;
        let z = &mut d.z[..rows * h.value_dim()];
        silu_in_place(z);
        for (o, z) in out[..rows * h.value_dim()]
            .chunks_exact_mut(s)
            .zip(z.chunks_exact(s))
        {
            let scale = rms_scale(o, eps);
            for ((x, &w), &g) in o.iter_mut().zip(&self.norm).zip(z) {
                *x = *x * scale * w * g;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid() -> Hybrid {
        Hybrid {
            grouped: false,
            conv_kernel: 4,
            k_heads: 2,
            v_heads: 4,
            head_dim: 8,
            linear: vec![true, false, true, false],
        }
    }

    /// The blocked recurrence is [`column`] column by column, to the bit, for head sizes that
    /// take every block width (64, 8 and single columns), over several tokens, on values whose
    /// sums depend on the order of the additions; and the order does matter for them.
    #[test]
    fn blocked_recurrence_is_the_column_by_column_one() {
        let mut seed = 7u64;
        let mut draw = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
            v * if (seed >> 20).is_multiple_of(5) {
                1e4
            } else {
                1.0
            }
        };
        for s in [128, 75, 24, 5] {
            let mut got: Vec<f32> = (0..s * s).map(|_| draw()).collect();
            let mut want = got.clone();
            for t in 0..3 {
                let (k, q, val): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                    (0..s).map(|_| draw()).collect(),
                    (0..s).map(|_| draw()).collect(),
                    (0..s).map(|_| draw()).collect(),
                );
                let tok = Token {
                    k: &k,
                    q: &q,
                    val: &val,
                    beta: 0.7,
                    decay: 0.9,
                    inv: 0.125,
                };
                let mut o = vec![0f32; s];
                tok.through(&mut got, &mut o);
                for (j, &o) in o.iter().enumerate() {
                    let w = column(&tok, &mut want, j);
                    assert_eq!(o.to_bits(), w.to_bits(), "S {s}, token {t}, column {j}");
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "S {s}, token {t}: the states differ");
            }
        }
        // The order matters for such values: a column's dot summed backwards differs.
        let s = 128;
        let (m, k): (Vec<f32>, Vec<f32>) = (
            (0..s).map(|_| draw()).collect(),
            (0..s).map(|_| draw()).collect(),
        );
        let fwd = m.iter().zip(&k).fold(0f32, |a, (x, y)| a + x * y);
        let back = m.iter().zip(&k).rev().fold(0f32, |a, (x, y)| a + x * y);
        assert_ne!(fwd.to_bits(), back.to_bits());
    }

    #[test]
    fn state_sizes_and_offsets() {
        let h = hybrid();
        assert_eq!(h.conv_dim(), 2 * 16 + 32);
        let per = 3 * 64 + 4 * 64;
        assert_eq!(h.state_len(), 2 * per);
        assert_eq!(h.state_offset(2), per);
        assert_eq!(h.state_offset(3), 2 * per);
    }
}
