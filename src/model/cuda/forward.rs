//! The model on a device and its packed forward pass (one step).

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::devices::open_gpu;
use super::kernels::DevWeight;
use super::kernels::{dev_err, ew, matmul_path, ptr, ActBufs, Gpu, MatmulPath, Result, ATTN_CHUNK};
use super::pool::{new_pool, KvPool};
use super::weights::{check_fits, upload_weight, DevLayer};
use crate::model::arch::{Activation, ModelConfig};
use crate::model::device::DeviceSpec;
use crate::model::error::ModelError;
use crate::model::kv::{KvSeq, Logits, SeqStep};
use crate::model::quant::QWeight;
use crate::model::transformer::{GateUp, Qkv, Transformer};

/// Device buffers of one step, grown to the largest step seen.
#[derive(Default)]
struct Buffers {
    rows: usize,
    chunks: usize,
    x: Option<CudaSlice<f32>>,
    xb: Option<CudaSlice<f32>>,
    q: Option<CudaSlice<f32>>,
    k: Option<CudaSlice<f32>>,
    v: Option<CudaSlice<f32>>,
    attn: Option<CudaSlice<f32>>,
    gate: Option<CudaSlice<f32>>,
    up: Option<CudaSlice<f32>>,
    fused: Option<CudaSlice<f32>>,
    part: Option<CudaSlice<f32>>,
    /// Quantized activations for the integer matmuls.
    act: Option<ActBufs>,
    /// The step's small inputs and its logits, reused across steps (grown to a power of two
    /// when a step needs more): no device allocation in a step that fits.
    positions: Option<CudaSlice<i32>>,
    table_offsets: Option<CudaSlice<i32>>,
    tables: Option<CudaSlice<i32>>,
    row_blocks: Option<CudaSlice<i32>>,
    row_slots: Option<CudaSlice<i32>>,
    wanted: Option<CudaSlice<i32>>,
    rope: Option<CudaSlice<f32>>,
    rope_swa: Option<CudaSlice<f32>>,
    logits: Option<CudaSlice<f32>>,
}

/// Copies `v` into the reused device buffer `slot`, growing it first when it is too small;
/// its device address.
fn stage<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    slot: &mut Option<CudaSlice<T>>,
    what: &str,
    v: &[T],
) -> Result<u64> {
    grow(g, slot, what, v.len())?;
    let b = slot.as_mut().expect("grown");
    if !v.is_empty() {
        g.stream
            .memcpy_htod(v, b)
            .map_err(|e| dev_err(&format!("uploading {what}"), e))?;
    }
    Ok(ptr(b, &g.stream))
}

/// Grows the reused device buffer `slot` to hold at least `len` values.
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    slot: &mut Option<CudaSlice<T>>,
    what: &str,
    len: usize,
) -> Result<()> {
    if slot.as_ref().is_none_or(|b| b.len() < len.max(1)) {
        *slot = Some(g.zeros(what, len.max(1).next_power_of_two())?);
    }
    Ok(())
}

/// A model's weights on a CUDA device, with its KV pool.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    spec: DeviceSpec,
    name: String,
    layers: Vec<DevLayer>,
    output_norm: CudaSlice<f32>,
    /// The output projection (the embedding when tied).
    output: DevWeight,
    pool: KvPool,
    block_tokens: usize,
    buffers: Mutex<Buffers>,
}

impl CudaModel {
    /// Uploads `model`'s weights to CUDA device `ordinal` and sizes a KV pool of blocks of
    /// `block_tokens` positions from the memory left, at most `kv_limit` bytes when given.
    pub fn load(
        model: &Transformer,
        ordinal: usize,
        block_tokens: usize,
        kv_limit: Option<usize>,
    ) -> Result<CudaModel> {
        let c = &model.config;
        if !c.head_dim.is_multiple_of(32) || c.head_dim > 256 {
            return Err(ModelError::Device(format!(
                "cuda: head dimension {} is not supported on the GPU (a multiple of 32, at most 256)",
                c.head_dim
            )));
        }
        let gpu = open_gpu(ordinal)?;
        let name = gpu.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        check_fits(&gpu, ordinal, &name, model)?;
        let path = matmul_path();
        let mat = |name: String, w: &QWeight| upload_weight(&gpu, &name, w, path);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let qkv = match &l.qkv {
                Qkv::Split { q, k, v } => vec![
                    mat(n("attn_q.weight"), q)?,
                    mat(n("attn_k.weight"), k)?,
                    mat(n("attn_v.weight"), v)?,
                ],
                Qkv::Fused(w) => vec![mat(n("attn_qkv.weight"), w)?],
            };
            let gate_up = match &l.gate_up {
                GateUp::Split { gate, up } => vec![
                    mat(n("ffn_gate.weight"), gate)?,
                    mat(n("ffn_up.weight"), up)?,
                ],
                GateUp::Fused(w) => vec![mat(n("ffn_up.weight"), w)?],
            };
            let wo = mat(n("attn_output.weight"), &l.wo)?;
            let w_down = mat(n("ffn_down.weight"), &l.w_down)?;
            let vec = |what: &str, v: &[f32]| gpu.upload(what, v);
            let opt =
                |what: &str, v: &Option<Vec<f32>>| v.as_deref().map(|v| vec(what, v)).transpose();
            layers.push(DevLayer {
                attn_norm: vec("attn_norm", &l.attn_norm)?,
                qkv,
                bias: match &l.bias {
                    Some([a, b, c]) => Some([vec("bias", a)?, vec("bias", b)?, vec("bias", c)?]),
                    None => None,
                },
                qk_norm: match &l.qk_norm {
                    Some((a, b)) => Some((vec("q_norm", a)?, vec("k_norm", b)?)),
                    None => None,
                },
                wo,
                post_attn_norm: opt("post_attention_norm", &l.post_attn_norm)?,
                ffn_norm: vec("ffn_norm", &l.ffn_norm)?,
                gate_up,
                w_down,
                post_ffn_norm: opt("post_ffw_norm", &l.post_ffn_norm)?,
            });
        }
        let output = match &model.output {
            Some(w) => mat("output.weight".into(), w)?,
            None => mat("token_embd.weight".into(), &model.embedding)?,
        };
        let output_norm = gpu.upload("output_norm", &model.output_norm)?;
        let pool = new_pool(&gpu, c.n_layer * 2 * block_tokens * c.kv_dim(), kv_limit)?;
        Ok(CudaModel {
            gpu,
            spec: DeviceSpec::Cuda(ordinal),
            name,
            layers,
            output_norm,
            output,
            pool,
            block_tokens,
            buffers: Mutex::new(Buffers::default()),
        })
    }

    /// The device's name as the driver reports it (for manifests).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    pub fn spec(&self) -> DeviceSpec {
        self.spec
    }

    /// The model's KV pool (the engine allocates its blocks there).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// One packed step on the device; the wanted logits are copied into `logits` (rows back
    /// to back, sequences in order), as [`Transformer::forward`] returns them.
    pub fn forward<K: KvSeq>(
        &self,
        model: &Transformer,
        seqs: &mut [SeqStep<'_, K>],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &model.config;
        let (dim, q_dim, kv_dim, hd, rd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim, c.rope_dim);
        let bt = self.block_tokens;
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if rows == 0 {
            logits.clear();
            return Ok(());
        }

        // Host side: embeddings, RoPE tables, each row's position and KV block.
        let mut x = vec![0f32; rows * dim];
        let mut cs = vec![0f32; rows * rd];
        // Sliding-window layers' own RoPE table, only for models that have one.
        let swa_len = model.rope_swa_freqs.as_ref().map_or(0, |_| rows * rd);
        let mut cs_swa = vec![0f32; swa_len];
        let (mut pos, mut table_off, mut row_block, mut row_slot) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::new(),
            Vec::new(),
        );
        let mut table: Vec<u32> = Vec::new();
        let mut wanted: Vec<i32> = Vec::new();
        let mut r = 0;
        for seq in seqs.iter_mut() {
            let p0 = seq.kv.len();
            seq.kv.grow(seq.tokens.len());
            let off = table.len();
            seq.kv.device_blocks(&mut table);
            let blocks = table.len() - off;
            if blocks != (p0 + seq.tokens.len()).div_ceil(bt) {
                return Err(ModelError::Device(format!(
                    "cuda: a sequence's KV has {blocks} device blocks for {} positions (host KV \
                     given to a GPU model?)",
                    p0 + seq.tokens.len()
                )));
            }
            for (i, &t) in seq.tokens.iter().enumerate() {
                let xr = &mut x[(r + i) * dim..(r + i + 1) * dim];
                model.embedding.row_f32(t as usize, xr);
                if let Some(scale) = c.embed_scale {
                    xr.iter_mut().for_each(|v| *v *= scale);
                }
                let p = p0 + i;
                model.rope_freqs.cos_sin(p, &mut cs[(r + i) * rd..][..rd]);
                if let Some(f) = &model.rope_swa_freqs {
                    f.cos_sin(p, &mut cs_swa[(r + i) * rd..][..rd]);
                }
                pos.push(p as i32);
                table_off.push(off as i32);
                row_block.push(table[off + p / bt] as i32);
                row_slot.push((p % bt) as i32);
            }
            let n = seq.tokens.len();
            match seq.logits {
                Logits::None => {}
                Logits::Last if n > 0 => wanted.push((r + n - 1) as i32),
                Logits::Last => {}
                Logits::All => wanted.extend((r..r + n).map(|i| i as i32)),
            }
            r += n;
        }
        let table: Vec<i32> = table.into_iter().map(|s| s as i32).collect();
        let max_pos = *pos.iter().max().expect("rows > 0") as usize;
        let chunks = max_pos / ATTN_CHUNK + 1;

        let g = &self.gpu;
        let s = &*g.stream;
        let mut bufs = self.buffers.lock().expect("CUDA buffers lock");
        self.fit(&mut bufs, c, rows, chunks)?;
        let b = &mut *bufs;
        let (ppos, ptoff, ptab, prb, prs) = (
            stage(g, &mut b.positions, "positions", &pos)?,
            stage(g, &mut b.table_offsets, "table offsets", &table_off)?,
            stage(g, &mut b.tables, "block tables", &table)?,
            stage(g, &mut b.row_blocks, "row blocks", &row_block)?,
            stage(g, &mut b.row_slots, "row slots", &row_slot)?,
        );
        let pcs = stage(g, &mut b.rope, "rope", &cs)?;
        let pcs_swa = if cs_swa.is_empty() {
            None
        } else {
            Some(stage(g, &mut b.rope_swa, "rope", &cs_swa)?)
        };
        let bx = b.x.as_mut().expect("fit");
        g.stream
            .memcpy_htod(&x, bx)
            .map_err(|e| dev_err("uploading rows", e))?;

        let p = |o: &Option<CudaSlice<f32>>| ptr(o.as_ref().expect("fit"), s);
        let (px, pxb, pq, pk, pv, pattn, pgate, pup, pfused, ppart) = (
            p(&b.x),
            p(&b.xb),
            p(&b.q),
            p(&b.k),
            p(&b.v),
            p(&b.attn),
            p(&b.gate),
            p(&b.up),
            p(&b.fused),
            p(&b.part),
        );
        let pool = self.pool.base();
        let block_len = self.pool.0.block_len as i64;
        let act = b.act.as_ref().expect("fit");

        for (l, (layer, dl)) in model.layers.iter().zip(&self.layers).enumerate() {
            g.rms_norm(px, &dl.attn_norm, pxb, rows, dim, c.rms_eps)?;
            if dl.qkv.len() == 3 {
                // One quantization of xb for the three (when their kinds agree).
                let qz = g.matmul_into(&dl.qkv[0], pxb, rows, pq, act, None, false)?;
                let qz = g.matmul_into(&dl.qkv[1], pxb, rows, pk, act, qz, false)?;
                g.matmul_into(&dl.qkv[2], pxb, rows, pv, act, qz, false)?;
            } else {
                let width = q_dim + 2 * kv_dim;
                g.matmul_into(&dl.qkv[0], pxb, rows, pfused, act, None, false)?;
                g.split(pfused, width, 0, q_dim, pq, rows)?;
                g.split(pfused, width, q_dim, kv_dim, pk, rows)?;
                g.split(pfused, width, q_dim + kv_dim, kv_dim, pv, rows)?;
            }
            if let Some([bq, bk, bv]) = &dl.bias {
                g.add_bias(pq, bq, q_dim, rows * q_dim)?;
                g.add_bias(pk, bk, kv_dim, rows * kv_dim)?;
                g.add_bias(pv, bv, kv_dim, rows * kv_dim)?;
            }
            if let Some((nq, nk)) = &dl.qk_norm {
                g.rms_norm(pq, nq, pq, rows * c.n_head, hd, c.rms_eps)?;
                g.rms_norm(pk, nk, pk, rows * c.n_kv_head, hd, c.rms_eps)?;
            }
            let cs = match (pcs_swa, layer.swa) {
                (Some(t), true) => t,
                _ => pcs,
            };
            g.rope(pq, cs, rows, c.n_head, hd, rd, c.rope_neox)?;
            g.rope(pk, cs, rows, c.n_kv_head, hd, rd, c.rope_neox)?;
            {
                let (rows_i, kv_i, l_i, bt_i) = (rows as i32, kv_dim as i32, l as i32, bt as i32);
                let mut lb = s.launch_builder(&g.k.kv_write);
                lb.arg(&pk).arg(&pv).arg(&pool).arg(&prb).arg(&prs);
                lb.arg(&rows_i)
                    .arg(&kv_i)
                    .arg(&l_i)
                    .arg(&bt_i)
                    .arg(&block_len);
                // SAFETY: k and v hold rows × kv_dim values; every row's block and slot were
                // given by its sequence's KV (grown above, so inside the pool).
                unsafe { lb.launch(ew(rows * kv_dim)) }.map_err(|e| dev_err("kv_write", e))?;
            }
            {
                let (heads, group, hd_i, kv_i, l_i, bt_i) = (
                    c.n_head as i32,
                    (c.n_head / c.n_kv_head) as i32,
                    hd as i32,
                    kv_dim as i32,
                    l as i32,
                    bt as i32,
                );
                let (scale, cap) = (c.attn_scale, c.attn_softcap.unwrap_or(0.0));
                let window = c.window(l).map_or(0, |w| w as i32);
                let chunks_i = chunks as i32;
                // The group kernel stages each tile of K/V once for the query heads of a KV
                // head (same bits as one warp per query head); the legacy path keeps the latter.
                let gqa = matmul_path() == MatmulPath::Integer;
                let kernel = if gqa {
                    &g.k.attn_partial_gqa
                } else {
                    &g.k.attn_partial
                };
                let mut lb = s.launch_builder(kernel);
                lb.arg(&pq).arg(&pool).arg(&ptab).arg(&ptoff).arg(&ppos);
                lb.arg(&heads)
                    .arg(&group)
                    .arg(&hd_i)
                    .arg(&kv_i)
                    .arg(&l_i)
                    .arg(&bt_i);
                lb.arg(&block_len)
                    .arg(&scale)
                    .arg(&cap)
                    .arg(&window)
                    .arg(&chunks_i);
                lb.arg(&ppart);
                let cfg = if gqa {
                    LaunchConfig {
                        grid_dim: (chunks as u32, c.n_kv_head as u32, rows as u32),
                        block_dim: (32 * group as u32, 1, 1),
                        // ATTN_TILE (32) positions of keys and of values, in halves.
                        shared_mem_bytes: (2 * 32 * hd * 2) as u32,
                    }
                } else {
                    LaunchConfig {
                        grid_dim: (chunks as u32, c.n_head as u32, rows as u32),
                        block_dim: (32, 1, 1),
                        shared_mem_bytes: 0,
                    }
                };
                // SAFETY: part holds rows × heads × chunks × (hd + 2) floats (fit); positions
                // and tables come from the sequences' KV, whose blocks cover every position;
                // the group kernel's tile is 2 × 32 × hd halves (hd <= 256: 32 KiB), its block
                // n_head / n_kv_head warps.
                unsafe { lb.launch(cfg) }.map_err(|e| dev_err("attn_partial", e))?;
                let mut lb = s.launch_builder(&g.k.attn_combine);
                lb.arg(&ppart)
                    .arg(&ppos)
                    .arg(&heads)
                    .arg(&hd_i)
                    .arg(&chunks_i)
                    .arg(&pattn);
                let cfg = LaunchConfig {
                    grid_dim: (c.n_head as u32, rows as u32, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: attn holds rows × q_dim floats.
                unsafe { lb.launch(cfg) }.map_err(|e| dev_err("attn_combine", e))?;
            }
            let post = dl.post_attn_norm.as_ref();
            project_residual(g, &dl.wo, pattn, rows, px, pxb, post, act, c)?;
            g.rms_norm(px, &dl.ffn_norm, pxb, rows, dim, c.rms_eps)?;
            let ffn = c.ffn_dim;
            if dl.gate_up.len() == 2 {
                let qz = g.matmul_into(&dl.gate_up[0], pxb, rows, pgate, act, None, false)?;
                g.matmul_into(&dl.gate_up[1], pxb, rows, pup, act, qz, false)?;
            } else {
                g.matmul_into(&dl.gate_up[0], pxb, rows, pfused, act, None, false)?;
                g.split(pfused, 2 * ffn, 0, ffn, pgate, rows)?;
                g.split(pfused, 2 * ffn, ffn, ffn, pup, rows)?;
            }
            {
                let total = (rows * ffn) as i64;
                let act = match c.activation {
                    Activation::Silu => 0i32,
                    // llama.cpp's CUDA backend computes GELU in f32, without the CPU's table.
                    Activation::GeluTanh | Activation::GeluTanhF16 => 1i32,
                };
                let mut lb = s.launch_builder(&g.k.gated_act);
                lb.arg(&pgate).arg(&pup).arg(&total).arg(&act);
                // SAFETY: gate and up hold rows × ffn floats.
                unsafe { lb.launch(ew(rows * ffn)) }.map_err(|e| dev_err("gated_act", e))?;
            }
            let post = dl.post_ffn_norm.as_ref();
            project_residual(g, &dl.w_down, pgate, rows, px, pxb, post, act, c)?;
        }

        // Final norm and output projection for the wanted rows only.
        let m = wanted.len();
        logits.clear();
        if m == 0 {
            s.synchronize().map_err(|e| dev_err("step", e))?;
            return Ok(());
        }
        let pw = stage(g, &mut b.wanted, "wanted rows", &wanted)?;
        {
            let (dim_i, total) = (dim as i32, (m * dim) as i64);
            let mut lb = s.launch_builder(&g.k.gather_rows);
            lb.arg(&px).arg(&pw).arg(&dim_i).arg(&pxb).arg(&total);
            // SAFETY: every wanted index is a row of this step; xb holds rows × dim floats.
            unsafe { lb.launch(ew(m * dim)) }.map_err(|e| dev_err("gather_rows", e))?;
        }
        g.rms_norm(pxb, &self.output_norm, pattn, m, dim, c.rms_eps)?;
        let vocab = c.vocab_size;
        grow(g, &mut b.logits, "logits", m * vocab)?;
        let out = b.logits.as_ref().expect("grown");
        let pout = ptr(out, s);
        g.matmul_into(&self.output, pattn, m, pout, act, None, false)?;
        if let Some(cap) = c.final_softcap {
            let total = (m * vocab) as i64;
            let mut lb = s.launch_builder(&g.k.softcap);
            lb.arg(&pout).arg(&cap).arg(&total);
            // SAFETY: out holds m × vocab floats.
            unsafe { lb.launch(ew(m * vocab)) }.map_err(|e| dev_err("softcap", e))?;
        }
        logits.resize(m * vocab, 0.0);
        g.stream
            .memcpy_dtoh(&out.slice(..m * vocab), logits.as_mut_slice())
            .map_err(|e| dev_err("downloading logits", e))?;
        s.synchronize().map_err(|e| dev_err("step", e))?;
        Ok(())
    }

    /// Grows the step buffers to `rows` rows and `chunks` attention chunks.
    fn fit(&self, b: &mut Buffers, c: &ModelConfig, rows: usize, chunks: usize) -> Result<()> {
        if rows <= b.rows && chunks <= b.chunks && b.x.is_some() {
            return Ok(());
        }
        let rows = rows.max(b.rows).next_power_of_two();
        let chunks = chunks.max(b.chunks);
        let g = &self.gpu;
        let wide = c.dim.max(c.q_dim());
        let fused = (c.q_dim() + 2 * c.kv_dim()).max(2 * c.ffn_dim);
        b.x = Some(g.zeros("x", rows * c.dim)?);
        b.xb = Some(g.zeros("xb", rows * c.dim)?);
        b.q = Some(g.zeros("q", rows * c.q_dim())?);
        b.k = Some(g.zeros("k", rows * c.kv_dim())?);
        b.v = Some(g.zeros("v", rows * c.kv_dim())?);
        b.attn = Some(g.zeros("attn", rows * wide)?);
        b.gate = Some(g.zeros("gate", rows * c.ffn_dim)?);
        b.up = Some(g.zeros("up", rows * c.ffn_dim)?);
        b.fused = Some(g.zeros("fused", if c.arch.fused() { rows * fused } else { 1 })?);
        b.part = Some(g.zeros(
            "attention partials",
            rows * c.n_head * chunks * (c.head_dim + 2),
        )?);
        let widest = c.dim.max(c.q_dim()).max(c.ffn_dim);
        b.act = Some(g.act_bufs(rows * widest.next_multiple_of(256))?);
        b.rows = rows;
        b.chunks = chunks;
        Ok(())
    }
}

/// `x += post_norm(x_in · Wᵀ)`: with no post-norm on the integer path one launch (the residual
/// added in the matmul's epilogue, the same `x + y` the CPU adds); else the product into
/// `scratch`, the norm, and the add.
#[allow(clippy::too_many_arguments)]
fn project_residual(
    g: &Gpu,
    w: &DevWeight,
    x_in: u64,
    rows: usize,
    x: u64,
    scratch: u64,
    post_norm: Option<&CudaSlice<f32>>,
    act: &ActBufs,
    c: &ModelConfig,
) -> Result<()> {
    if post_norm.is_none() && matmul_path() == MatmulPath::Integer {
        g.matmul_into(w, x_in, rows, x, act, None, true)?;
        return Ok(());
    }
    g.matmul_into(w, x_in, rows, scratch, act, None, false)?;
    if let Some(nw) = post_norm {
        g.rms_norm(scratch, nw, scratch, rows, c.dim, c.rms_eps)?;
    }
    g.add(x, scratch, rows * c.dim)
}
