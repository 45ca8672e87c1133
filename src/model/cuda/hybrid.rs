//! Qwen3.5's hybrid layers on the device: a linear-attention layer's weights ([`DevDelta`]),
//! qwen35moe's (and DeepSeek's) shared expert ([`DevShared`]), the linear layers' and output
//! gate's step buffers ([`HybridBufs`]), the
//! launches of `deltanet.cu`, and a sequence's recurrent state in device memory
//! ([`DeviceState`]).
//!
//! The state belongs to the engine's sequence as its KV blocks do: each sequence holds one
//! buffer of the CPU's layout (`Hybrid::state_offset`), which the kernels update in place; a
//! fork copies it on the device; the prefix cache's snapshots and resumes copy it to and from
//! the host. This module runs nothing of the plan's order (`forward.rs` does).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::kernels::{dev_err, ew, ptr, DevWeight, Gpu, MatmulPath, Result};
use super::weights::upload_weight;
use crate::model::deltanet::{transpose, DeltaNet, Hybrid};
use crate::model::moe::SharedExpert;

/// A linear-attention layer's weights beside its q|k|v and output projections.
pub(super) struct DevDelta {
    pub(super) z: DevWeight,
    pub(super) beta: DevWeight,
    pub(super) alpha: DevWeight,
    pub(super) conv: CudaSlice<f32>,
    pub(super) dt_bias: CudaSlice<f32>,
    pub(super) a: CudaSlice<f32>,
    pub(super) norm: CudaSlice<f32>,
}

/// Uploads layer `i`'s linear-attention weights (its conv of `taps` taps channel by channel,
/// as in the file, the layout the kernel reads).
pub(super) fn upload_delta(
    gpu: &Gpu,
    i: usize,
    d: &DeltaNet,
    taps: usize,
    path: MatmulPath,
) -> Result<DevDelta> {
    let n = |s: &str| format!("blk.{i}.{s}");
    Ok(DevDelta {
        z: upload_weight(gpu, &n("attn_gate.weight"), &d.z, path)?,
        beta: upload_weight(gpu, &n("ssm_beta.weight"), &d.beta, path)?,
        alpha: upload_weight(gpu, &n("ssm_alpha.weight"), &d.alpha, path)?,
        conv: gpu.upload("ssm_conv1d", &transpose(&d.conv, taps, d.conv.len() / taps))?,
        dt_bias: gpu.upload("ssm_dt.bias", &d.dt_bias)?,
        a: gpu.upload("ssm_a", &d.a)?,
        norm: gpu.upload("ssm_norm", &d.norm)?,
    })
}

/// A shared expert's matrices on the device.
pub(super) struct DevShared {
    pub(super) gate: DevWeight,
    pub(super) up: DevWeight,
    pub(super) down: DevWeight,
    /// The sigmoid gate's vector (Qwen3.5-MoE); none for DeepSeek's ungated shared experts.
    pub(super) gate_inp: Option<DevWeight>,
}

/// Uploads layer `i`'s shared expert.
pub(super) fn upload_shared(
    gpu: &Gpu,
    i: usize,
    s: &SharedExpert,
    path: MatmulPath,
) -> Result<DevShared> {
    let n = |t: &str| format!("blk.{i}.{t}");
    Ok(DevShared {
        gate: upload_weight(gpu, &n("ffn_gate_shexp.weight"), &s.gate, path)?,
        up: upload_weight(gpu, &n("ffn_up_shexp.weight"), &s.up, path)?,
        down: upload_weight(gpu, &n("ffn_down_shexp.weight"), &s.down, path)?,
        gate_inp: s
            .gate_inp
            .as_ref()
            .map(|w| upload_weight(gpu, &n("ffn_gate_inp_shexp.weight"), w, path))
            .transpose()?,
    })
}

/// The hybrid layers' step buffers: the mixed q|k|v channels and their convolution, the gate
/// `z`, β's and the decay's logits (linear layers); the output gate (full-attention layers);
/// the shared expert's gate/up outputs, gate logits and gated output. (Each sequence's
/// (first row, rows) and state address come with the step's inputs.)
pub(super) struct HybridBufs {
    pub(super) mixed: CudaSlice<f32>,
    pub(super) conv: CudaSlice<f32>,
    pub(super) z: CudaSlice<f32>,
    pub(super) beta: CudaSlice<f32>,
    pub(super) alpha: CudaSlice<f32>,
    pub(super) gate: CudaSlice<f32>,
}

impl HybridBufs {
    /// Buffers for `rows` rows of a model whose queries are `q_dim` wide, geometry `h`.
    pub(super) fn new(g: &Gpu, rows: usize, q_dim: usize, h: &Hybrid) -> Result<HybridBufs> {
        Ok(HybridBufs {
            mixed: g.zeros("mixed q|k|v", rows * h.conv_dim())?,
            conv: g.zeros("conv", rows * h.conv_dim())?,
            z: g.zeros("z", rows * h.value_dim())?,
            beta: g.zeros("beta", rows * h.v_heads)?,
            alpha: g.zeros("decay", rows * h.v_heads)?,
            gate: g.zeros("output gate", rows * q_dim)?,
        })
    }
}

/// The sequences of one step as the linear-attention kernels take them: the device addresses
/// of `seqs` (first row, rows) pairs and of as many state addresses.
#[derive(Clone, Copy)]
pub(super) struct SeqArgs {
    pub(super) spans: u64,
    pub(super) states: u64,
    pub(super) seqs: usize,
}

/// Launches of `deltanet.cu`.
impl Gpu {
    /// `delta_conv` of layer `l`'s channels (`w` its taps) from `mixed` into `out`.
    pub(super) fn delta_conv(
        &self,
        mixed: u64,
        out: u64,
        q: SeqArgs,
        h: &Hybrid,
        l: usize,
        w: &CudaSlice<f32>,
    ) -> Result<()> {
        let s = &*self.stream;
        let pw = ptr(w, s);
        let (off, seqs, cd, taps) = (
            h.state_offset(l) as i64,
            q.seqs as i32,
            h.conv_dim() as i32,
            h.conv_kernel as i32,
        );
        let mut lb = s.launch_builder(&self.k.delta_conv);
        lb.arg(&mixed).arg(&out).arg(&q.states).arg(&off);
        lb.arg(&q.spans).arg(&seqs).arg(&cd).arg(&taps).arg(&pw);
        let cfg = LaunchConfig {
            grid_dim: ((h.conv_dim() as u32).div_ceil(128), q.seqs as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: mixed and out hold the step's rows × conv_dim floats, spans and states one
        // entry per sequence (each span inside the step's rows, each state `state_len`
        // floats); w holds conv_dim × taps.
        self.launched("delta_conv", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// `delta_prep` of `rows` rows.
    pub(super) fn delta_prep(
        &self,
        b: &HybridBufs,
        d: &DevDelta,
        h: &Hybrid,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let s = &*self.stream;
        let (pc, pb, pa) = (ptr(&b.conv, s), ptr(&b.beta, s), ptr(&b.alpha, s));
        let (pdt, pav) = (ptr(&d.dt_bias, s), ptr(&d.a, s));
        let sd = h.head_dim;
        let (n_eps, inv) = (eps / sd as f32, 1.0 / (sd as f32).sqrt());
        let (rows_i, cd, s_i, qk, vh) = (
            rows as i32,
            h.conv_dim() as i32,
            sd as i32,
            2 * h.k_heads as i32,
            h.v_heads as i32,
        );
        let mut lb = s.launch_builder(&self.k.delta_prep);
        lb.arg(&pc).arg(&pb).arg(&pa).arg(&pdt).arg(&pav);
        lb.arg(&rows_i).arg(&cd).arg(&s_i).arg(&qk).arg(&vh);
        lb.arg(&n_eps).arg(&inv);
        let threads = rows * (2 * h.k_heads + h.v_heads);
        // SAFETY: conv holds rows × conv_dim floats, beta and alpha rows × v_heads, dt_bias
        // and a v_heads.
        self.launched("delta_prep", unsafe { lb.launch(ew(threads)) })?;
        Ok(())
    }

    /// `delta_rule` of layer `l` into `out` (rows × value width).
    pub(super) fn delta_rule(
        &self,
        b: &HybridBufs,
        q: SeqArgs,
        h: &Hybrid,
        l: usize,
        out: u64,
    ) -> Result<()> {
        let s = &*self.stream;
        let (pc, pb, pa) = (ptr(&b.conv, s), ptr(&b.beta, s), ptr(&b.alpha, s));
        let sd = h.head_dim;
        let off = (h.state_offset(l) + h.conv_state_len()) as i64;
        let (cd, kd, s_i, k_div, kh, vh) = (
            h.conv_dim() as i32,
            h.key_dim() as i32,
            sd as i32,
            h.k_div() as i32,
            h.k_heads as i32,
            h.v_heads as i32,
        );
        let inv = 1.0 / (sd as f32).sqrt();
        let mut lb = s.launch_builder(&self.k.delta_rule);
        lb.arg(&pc)
            .arg(&pb)
            .arg(&pa)
            .arg(&q.states)
            .arg(&off)
            .arg(&q.spans);
        lb.arg(&cd)
            .arg(&kd)
            .arg(&s_i)
            .arg(&k_div)
            .arg(&kh)
            .arg(&vh)
            .arg(&inv)
            .arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (h.v_heads as u32, q.seqs as u32, 1),
            block_dim: (sd as u32, 1, 1),
            shared_mem_bytes: (3 * sd * 4) as u32,
        };
        // SAFETY: conv holds the step's rows × conv_dim floats, beta and alpha rows × v_heads,
        // out rows × value width; each state holds `state_len` floats; one thread per state
        // row (head_dim <= 1024, checked at load), 3 × head_dim floats staged.
        self.launched("delta_rule", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// `gated_norm` of `rows` rows of `attn` by `z` (value heads of `h`).
    pub(super) fn gated_norm(
        &self,
        attn: u64,
        z: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        h: &Hybrid,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let s = &*self.stream;
        let (pz, pw) = (ptr(z, s), ptr(w, s));
        let heads = rows * h.v_heads;
        let (s_i, heads_i) = (h.head_dim as i32, heads as i64);
        let mut lb = s.launch_builder(&self.k.gated_norm);
        lb.arg(&attn)
            .arg(&pz)
            .arg(&pw)
            .arg(&s_i)
            .arg(&heads_i)
            .arg(&eps);
        // SAFETY: attn and z hold rows × value width floats, w head_dim.
        self.launched("gated_norm", unsafe { lb.launch(ew(heads)) })?;
        Ok(())
    }

    /// `out_gate`: `attn *= sigmoid(gate)` over `total` values.
    pub(super) fn out_gate(&self, attn: u64, gate: &CudaSlice<f32>, total: usize) -> Result<()> {
        let s = &*self.stream;
        let (pg, t) = (ptr(gate, s), total as i64);
        let mut lb = s.launch_builder(&self.k.out_gate);
        lb.arg(&attn).arg(&pg).arg(&t);
        // SAFETY: attn and gate hold total floats.
        self.launched("out_gate", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `shared_gate`: each of `rows` rows of `out` (`dim` wide) times the sigmoid of its logit
    /// in `logit`.
    pub(super) fn shared_gate(&self, po: u64, pl: u64, dim: usize, rows: usize) -> Result<()> {
        let s = &*self.stream;
        let (dim_i, t) = (dim as i32, (rows * dim) as i64);
        let mut lb = s.launch_builder(&self.k.shared_gate);
        lb.arg(&po).arg(&pl).arg(&dim_i).arg(&t);
        // SAFETY: shared_out holds rows × dim floats, shared_logit rows.
        self.launched("shared_gate", unsafe { lb.launch(ew(rows * dim)) })?;
        Ok(())
    }
}

/// A sequence's recurrent state in device memory (a hybrid model's, `Transformer::state_len`
/// floats): written by the linear-attention kernels, copied on the device when cloned (a fork),
/// read back and written from the host for the prefix cache's snapshots and resumes.
pub struct DeviceState {
    gpu: Arc<Gpu>,
    buf: CudaSlice<f32>,
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceState({} floats)", self.buf.len())
    }
}

/// A failed device call on a state: the engine's calls have no error path (as a KV block's
/// copy), so it is a panic naming what failed.
fn state_failed(what: &str, e: impl std::fmt::Display) -> ! {
    panic!("CUDA: {what} a sequence's recurrent state failed: {e}")
}

impl DeviceState {
    /// A zero state of `len` floats (`len > 0`).
    pub(super) fn zeros(gpu: &Arc<Gpu>, len: usize) -> DeviceState {
        let buf = gpu
            .zeros("a recurrent state", len)
            .unwrap_or_else(|e| state_failed("allocating", e));
        DeviceState {
            gpu: Arc::clone(gpu),
            buf,
        }
    }

    /// The state `v`, uploaded.
    pub(super) fn from_host(gpu: &Arc<Gpu>, v: &[f32]) -> DeviceState {
        let buf = gpu
            .upload("a recurrent state", v)
            .unwrap_or_else(|e| state_failed("uploading", e));
        DeviceState {
            gpu: Arc::clone(gpu),
            buf,
        }
    }

    /// Floats held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it holds no floats (never: a model without a state has no `DeviceState`).
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// The device address the kernels update.
    pub fn addr(&self) -> u64 {
        ptr(&self.buf, &self.gpu.stream)
    }

    /// The state, read back (after every launch queued before).
    pub fn to_host(&self) -> Vec<f32> {
        let s = &self.gpu.stream;
        let v = s
            .clone_dtoh(&self.buf)
            .unwrap_or_else(|e| state_failed("reading", e));
        s.synchronize()
            .unwrap_or_else(|e| state_failed("reading", dev_err("synchronize", e)));
        v
    }

    /// Sets every float to zero (a sequence cut back to nothing).
    pub fn zero(&mut self) {
        let s = Arc::clone(&self.gpu.stream);
        s.memset_zeros(&mut self.buf)
            .unwrap_or_else(|e| state_failed("zeroing", e));
    }
}

impl Clone for DeviceState {
    fn clone(&self) -> DeviceState {
        let buf = self
            .gpu
            .stream
            .clone_dtod(&self.buf)
            .unwrap_or_else(|e| state_failed("copying", e));
        DeviceState {
            gpu: Arc::clone(&self.gpu),
            buf,
        }
    }
}
