//! Hugging Face checkpoints: a folder with `config.json` and `*.safetensors` (headers and
//! shards validated by [`crate::weights::safetensors`]), read as a [`TensorSource`] under GGUF
//! tensor names. Tensor data is read through candle's memory-mapped safetensors reader.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device};
use memmap2::Mmap;
use rayon::prelude::*;
use serde_json::Value as Json;

use crate::model::arch::{llama3_rope_factors, Arch, ArchSpec, ModelConfig, TensorSource};
use crate::model::deltanet::Hybrid;
use crate::model::error::{ModelError, Result};
use crate::weights::mapped::MappedBytes;
use crate::weights::safetensors::checkpoint_shards;
use crate::weights::stored::StoredType;

fn st_err(path: &Path, msg: impl Into<String>) -> ModelError {
    ModelError::Safetensors {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Whether the checkpoint's output projection is its embedding: `tie_word_embeddings`, else
/// the architecture's default in transformers. As in transformers, a tied checkpoint's stored
/// `lm_head.weight`, if any, is not used (nor counted as unread), and an untied one needs it.
fn tied_embeddings(json: &Json, arch: Arch) -> bool {
    let text = json.get("text_config").unwrap_or(json);
    text.get("tie_word_embeddings")
        .or_else(|| json.get("tie_word_embeddings"))
        .and_then(Json::as_bool)
        .unwrap_or(ArchSpec::of(arch).hf_tie_default)
}

/// A Hugging Face checkpoint opened for loading: its resolved configuration and validated,
/// memory-mapped safetensors files.
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    json: Json,
    st: MmapedSafetensors,
    /// Tensor name -> (dtype, shape) from the validated headers.
    entries: HashMap<String, (String, Vec<usize>)>,
    /// Tensor name -> its bytes in its shard's memory map (weight matrices are read in place).
    places: HashMap<String, MappedBytes>,
    /// Prefix of the language model's tensors (`model.`, `model.language_model.`, ...).
    prefix: String,
    /// Hugging Face names of the tensors the forward pass has read: every language-model
    /// tensor must be among them ([`Checkpoint::unread_tensors`]).
    read: std::collections::BTreeSet<String>,
    /// The output projection is the embedding ([`tied_embeddings`]).
    tied: bool,
}

/// The output projection's name under a language-model prefix.
fn lm_head_name(prefix: &str) -> String {
    // Qwen3.5's image-text checkpoints keep the head outside `model.`.
    if prefix == "model." || prefix == "model.language_model." {
        "lm_head.weight".to_string()
    } else {
        // Multimodal Gemma 3: `language_model.lm_head.weight` when present.
        format!("{}lm_head.weight", prefix.trim_end_matches("model."))
    }
}

impl Checkpoint {
    /// Opens a checkpoint folder: reads `config.json`, validates every safetensors header and
    /// the shard index.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let config_path = dir.join("config.json");
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
        let json: Json = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: config_path.clone(),
            key: "(file)".into(),
            msg: format!("not valid JSON: {e}"),
        })?;
        let config = ModelConfig::from_hf_config(&config_path, &json)?;
        let shards = checkpoint_shards(dir)?;
        let mut entries = HashMap::new();
        let mut places = HashMap::new();
        for (path, h) in &shards {
            let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
            // SAFETY: mapped read-only; like every mmap reader we rely on the file not being
            // truncated or rewritten while the model is in use.
            let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?);
            // Its float weights are read in place from it, as a GGUF file's.
            crate::weights::mapped::advise_huge_pages(&map);
            // The data section is the file's last `data_len` bytes (checked by `read_header`).
            let data_start = map
                .len()
                .checked_sub(h.data_len)
                .ok_or_else(|| st_err(path, "the file changed size since its header was read"))?;
            for t in &h.tensors {
                entries.insert(t.name.clone(), (t.dtype.clone(), t.shape.clone()));
                let bytes = MappedBytes::new(map.clone(), data_start + t.begin, t.end - t.begin)
                    .ok_or_else(|| {
                        st_err(path, format!("tensor `{}`: outside the file", t.name))
                    })?;
                places.insert(t.name.clone(), bytes);
            }
        }
        let prefix = ["model.", "model.language_model.", "language_model.model."]
            .into_iter()
            .find(|p| entries.contains_key(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| {
                st_err(
                    dir,
                    "no `model.embed_tokens.weight` (nor a language_model variant)",
                )
            })?
            .to_string();
        let tied = tied_embeddings(&json, config.arch);
        let lm_head = lm_head_name(&prefix);
        if !tied && !entries.contains_key(&lm_head) {
            return Err(ModelError::Config {
                path: config_path,
                key: "tie_word_embeddings".into(),
                msg: format!(
                    "false (or absent, false for {}), but the checkpoint has no `{lm_head}`",
                    config.arch.gguf_name()
                ),
            });
        }
        let paths: Vec<&PathBuf> = shards.iter().map(|(p, _)| p).collect();
        // SAFETY: the files are mapped read-only; like every mmap reader we rely on them not
        // being truncated while the model is loading.
        let st = unsafe { MmapedSafetensors::multi(&paths) }
            .map_err(|e| st_err(dir, format!("mapping: {e}")))?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            json: crate::model::arch::hf_text_config(&config_path, &json)?,
            st,
            entries,
            places,
            prefix,
            read: Default::default(),
            tied,
        })
    }

    /// The language-model tensors the forward pass has not read, sorted: a feature Candor does
    /// not implement (biases where the architecture has none, extra norms, ...). A multimodal
    /// checkpoint's vision tower and projector are outside the language model and not counted,
    /// nor the `rotary_emb.inv_freq` buffers old checkpoints store (transformers recomputes
    /// them).
    pub fn unread_tensors(&self) -> Vec<String> {
        let lm_head = (!self.tied).then(|| lm_head_name(&self.prefix));
        let mut names: Vec<String> = self
            .entries
            .keys()
            .filter(|n| n.starts_with(&self.prefix) || lm_head.as_ref() == Some(*n))
            .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
            .filter(|n| !self.read.contains(n.as_str()))
            .cloned()
            .collect();
        names.sort();
        names
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Whether the checkpoint tensor `hf` belongs to a layer at or after `n_layer` (a
    /// multi-token-prediction layer kept after the trunk's).
    pub fn beyond_trunk(&self, hf: &str, n_layer: usize) -> bool {
        hf.strip_prefix(&self.prefix)
            .and_then(|r| r.strip_prefix("layers."))
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, _)| n.parse::<usize>().ok())
            .is_some_and(|n| n >= n_layer)
    }

    /// A hybrid model's linear-attention geometry from `config.json` (`None` for the others).
    pub fn hybrid(&self) -> Result<Option<Hybrid>> {
        Hybrid::from_hf(&self.dir.join("config.json"), &self.json, &self.config)
    }

    /// The Hugging Face name of a GGUF tensor name, for this architecture.
    pub fn hf_name(&self, gguf: &str) -> Option<String> {
        let p = &self.prefix;
        match gguf {
            "token_embd.weight" => return Some(format!("{p}embed_tokens.weight")),
            "output_norm.weight" => return Some(format!("{p}norm.weight")),
            // Tied: the embedding, and a stored head goes unused, as in transformers.
            "output.weight" if self.tied => return None,
            "output.weight" => return Some(lm_head_name(p)),
            _ => {}
        }
        let rest = gguf.strip_prefix("blk.")?;
        let (layer, name) = rest.split_once('.')?;
        // Parameters without a `.weight`: gpt-oss's per-head sink logits, Qwen3.5's decay,
        // GLM-4.5's expert selection bias.
        let bare = match name {
            "attn_sinks.weight" => Some("self_attn.sinks"),
            "ssm_a" => Some("linear_attn.A_log"),
            "ssm_dt.bias" => Some("linear_attn.dt_bias"),
            "exp_probs_b.bias" => Some("mlp.gate.e_score_correction_bias"),
            _ => None,
        };
        if let Some(hf) = bare {
            return Some(format!("{p}layers.{layer}.{hf}"));
        }
        let (base, kind) = name.rsplit_once('.')?;
        if matches!(
            self.config.arch,
            Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next
        ) {
            // Qwen3.5's and Qwen3-Next's linear attention and shared expert (Qwen3-Next fuses
            // q|k|v|z and β|α per key head, as its GGUF's `ssm_in` and `ssm_ba`).
            let hf = match base {
                "ssm_in" => Some("linear_attn.in_proj_qkvz"),
                "ssm_ba" => Some("linear_attn.in_proj_ba"),
                "attn_qkv" => Some("linear_attn.in_proj_qkv"),
                "attn_gate" => Some("linear_attn.in_proj_z"),
                "ssm_beta" => Some("linear_attn.in_proj_b"),
                "ssm_alpha" => Some("linear_attn.in_proj_a"),
                "ssm_conv1d" => Some("linear_attn.conv1d"),
                "ssm_norm" => Some("linear_attn.norm"),
                "ssm_out" => Some("linear_attn.out_proj"),
                "ffn_gate_shexp" => Some("mlp.shared_expert.gate_proj"),
                "ffn_up_shexp" => Some("mlp.shared_expert.up_proj"),
                "ffn_down_shexp" => Some("mlp.shared_expert.down_proj"),
                "ffn_gate_inp_shexp" => Some("mlp.shared_expert_gate"),
                _ => None,
            };
            if let Some(hf) = hf {
                return Some(format!("{p}layers.{layer}.{hf}.{kind}"));
            }
        }
        let gemma = self.config.arch.is_gemma();
        let oss = self.config.arch == Arch::GptOss;
        let glm = self.config.arch == Arch::Glm4Moe;
        let hf = match base {
            "attn_norm" => "input_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_qkv" => "self_attn.qkv_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "post_attention_norm" => "post_attention_layernorm",
            "ffn_norm" if gemma => "pre_feedforward_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "post_ffw_norm" => "post_feedforward_layernorm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" if self.config.arch.fused() => "mlp.gate_up_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            // The router: Mixtral's, Qwen3-MoE's.
            "ffn_gate_inp" if self.mixtral() => "block_sparse_moe.gate",
            "ffn_gate_inp" if oss => "mlp.router",
            // GLM-4.5's shared experts.
            "ffn_gate_shexp" if glm => "mlp.shared_experts.gate_proj",
            "ffn_up_shexp" if glm => "mlp.shared_experts.up_proj",
            "ffn_down_shexp" if glm => "mlp.shared_experts.down_proj",
            "ffn_gate_inp" => "mlp.gate",
            _ => return None,
        };
        Some(format!("{p}layers.{layer}.{hf}.{kind}"))
    }
}

impl Checkpoint {
    /// Whether this is a Mixtral checkpoint (its MoE tensors' names).
    fn mixtral(&self) -> bool {
        self.json.get("model_type").and_then(Json::as_str) == Some("mixtral")
    }

    /// The Hugging Face names of the GGUF expert tensor `gguf` (`blk.N.ffn_{gate,up,down}_exps
    /// .weight`), one per expert of the model's: Qwen3-MoE's `mlp.experts.{e}.*_proj`,
    /// Mixtral's `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up) and `w2` (down).
    fn expert_names(&self, gguf: &str) -> Option<Vec<String>> {
        let experts = self.config.moe?.experts;
        let (layer, name) = gguf.strip_prefix("blk.")?.split_once('.')?;
        let mixtral = self.mixtral();
        let (block, proj) = match (name, mixtral) {
            ("ffn_gate_exps.weight", false) => ("mlp", "gate_proj"),
            ("ffn_up_exps.weight", false) => ("mlp", "up_proj"),
            ("ffn_down_exps.weight", false) => ("mlp", "down_proj"),
            ("ffn_gate_exps.weight", true) => ("block_sparse_moe", "w1"),
            ("ffn_up_exps.weight", true) => ("block_sparse_moe", "w3"),
            ("ffn_down_exps.weight", true) => ("block_sparse_moe", "w2"),
            _ => return None,
        };
        let p = &self.prefix;
        Some(
            (0..experts)
                .map(|e| format!("{p}layers.{layer}.{block}.experts.{e}.{proj}.weight"))
                .collect(),
        )
    }

    /// Whether the checkpoint tensor `hf` is a norm stored as `w` for `1 + w`
    /// ([`Arch::norm_plus_one`]; Qwen3.5's gated norm of its linear attention is not).
    fn plus_one(&self, hf: &str) -> bool {
        self.config.arch.norm_plus_one()
            && hf.ends_with("norm.weight")
            && !hf.ends_with("linear_attn.norm.weight")
    }

    /// The shape the checkpoint stores a GGUF tensor of `shape` in, where the two differ:
    /// Qwen3.5's and Qwen3-Next's conv1d `[channels, 1, taps]` and shared expert gate
    /// `[1, dim]` (llama.cpp's converter squeezes both).
    fn stored_shape(&self, gguf: &str, shape: &[usize]) -> Vec<usize> {
        let qwen35 = matches!(
            self.config.arch,
            Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next
        );
        match shape {
            [c, k] if qwen35 && gguf.ends_with("ssm_conv1d.weight") => vec![*c, 1, *k],
            [d] if qwen35 && gguf.ends_with("ffn_gate_inp_shexp.weight") => vec![1, *d],
            _ => shape.to_vec(),
        }
    }

    /// The Hugging Face name and stored type of a GGUF-named tensor, after checking its shape.
    fn lookup(&self, name: &str, shape: &[usize]) -> Result<(String, GgmlDType)> {
        let hf = self
            .hf_name(name)
            .filter(|n| self.entries.contains_key(n))
            .ok_or_else(|| {
                ModelError::MissingTensor(format!(
                    "{name} ({} in {})",
                    self.hf_name(name).unwrap_or_default(),
                    self.dir.display()
                ))
            })?;
        self.stored_type(hf, shape)
    }

    /// The stored type of the checkpoint's tensor `hf`, after checking its shape.
    fn stored_type(&self, hf: String, shape: &[usize]) -> Result<(String, GgmlDType)> {
        let dtype = self.entry(&hf, shape)?;
        let ggml = float_type(&hf, &dtype)?;
        Ok((hf, ggml))
    }

    /// The entry `hf` after checking it exists with `shape`: its dtype.
    fn entry(&self, hf: &str, shape: &[usize]) -> Result<String> {
        let (dtype, found) = self.entries.get(hf).ok_or_else(|| {
            ModelError::MissingTensor(format!("{hf} (in {})", self.dir.display()))
        })?;
        if found.as_slice() != shape {
            return Err(ModelError::TensorShape {
                name: hf.to_string(),
                expected: format!("{shape:?}"),
                found: format!("{found:?}"),
            });
        }
        Ok(dtype.clone())
    }
}

/// The ggml type of the float safetensors dtype `dtype` of tensor `hf` (F32, F16, BF16).
fn float_type(hf: &str, dtype: &str) -> Result<GgmlDType> {
    match dtype {
        "F32" => Ok(GgmlDType::F32),
        "F16" => Ok(GgmlDType::F16),
        "BF16" => Ok(GgmlDType::BF16),
        other => Err(ModelError::UnsupportedTensorType {
            name: hf.to_string(),
            dtype: format!("{other} (supported: F32, F16, BF16)"),
        }),
    }
}

/// Where a gpt-oss GGUF expert tensor (`blk.N.ffn_{gate,up,down}_exps.{weight,bias}`) lies
/// in a gpt-oss checkpoint: the experts' gate and up come fused, one row (MXFP4) or column
/// (float) of each in turn (`gate_up[..., ::2]` is the gate, as transformers splits it).
#[derive(Debug, Clone, PartialEq)]
enum OssExperts {
    /// As OpenAI publishes them: `{proj}_blocks` (`[experts, rows, columns / 32, 16]`, two
    /// E2M1 codes a byte, the element of even index in the low nibble) and `{proj}_scales`
    /// (`[experts, rows, columns / 32]`, E8M0 exponents), rows the outputs. `half`: the gate
    /// (0) or up (1) rows of `gate_up_proj`'s, `None` for `down_proj`'s.
    Mxfp4 {
        blocks: String,
        scales: String,
        half: Option<usize>,
    },
    /// Dequantized (transformers' parameters): `[experts, columns, rows]`, the inputs first.
    Float { hf: String, half: Option<usize> },
    /// `{proj}_bias`: `[experts, rows]`.
    Bias { hf: String, half: Option<usize> },
}

impl OssExperts {
    /// The checkpoint tensors it is read from.
    fn sources(&self) -> Vec<String> {
        match self {
            OssExperts::Mxfp4 { blocks, scales, .. } => vec![blocks.clone(), scales.clone()],
            OssExperts::Float { hf, .. } | OssExperts::Bias { hf, .. } => vec![hf.clone()],
        }
    }
}

/// ggml's MXFP4 block (its E8M0 scale byte, then 16 bytes: element `i` in the low nibble of
/// byte `i`, element `16 + i` in its high nibble) of an MX block as OpenAI's checkpoints and
/// transformers store it (`codes`: element `2j` in the low nibble of byte `j`, `2j + 1` in its
/// high nibble) with its scale byte: llama.cpp's converter's repacking.
fn mxfp4_block(scale: u8, codes: &[u8]) -> [u8; 17] {
    let code = |e: usize| (codes[e / 2] >> (4 * (e % 2))) & 0xF;
    let mut out = [0u8; 17];
    out[0] = scale;
    for i in 0..16 {
        out[1 + i] = code(i) | (code(i + 16) << 4);
    }
    out
}

/// A read-only anonymous map of `len` bytes written by `fill`: bytes a checkpoint stores in
/// another layout, handed on as the file's own mapped bytes are.
fn anonymous_map(len: usize, fill: impl FnOnce(&mut [u8])) -> std::io::Result<Arc<Mmap>> {
    let mut map = memmap2::MmapMut::map_anon(len.max(1))?;
    fill(&mut map[..len]);
    Ok(Arc::new(map.make_read_only()?))
}

impl Checkpoint {
    /// [`OssExperts`] of a GGUF tensor name, for a gpt-oss checkpoint: MXFP4 blocks where the
    /// checkpoint has them, else the float parameter.
    fn oss_experts(&self, gguf: &str) -> Option<OssExperts> {
        if self.config.arch != Arch::GptOss {
            return None;
        }
        let (layer, name) = gguf.strip_prefix("blk.")?.split_once('.')?;
        let (base, kind) = name.rsplit_once('.')?;
        let (proj, half) = match base {
            "ffn_gate_exps" => ("gate_up_proj", Some(0)),
            "ffn_up_exps" => ("gate_up_proj", Some(1)),
            "ffn_down_exps" => ("down_proj", None),
            _ => return None,
        };
        let pre = format!("{}layers.{layer}.mlp.experts.{proj}", self.prefix);
        Some(match kind {
            "bias" => OssExperts::Bias {
                hf: format!("{pre}_bias"),
                half,
            },
            "weight" if self.entries.contains_key(&format!("{pre}_blocks")) => OssExperts::Mxfp4 {
                blocks: format!("{pre}_blocks"),
                scales: format!("{pre}_scales"),
                half,
            },
            "weight" => OssExperts::Float { hf: pre, half },
            _ => return None,
        })
    }

    /// Each expert's matrix of the GGUF tensor `name` (`shape`: experts, rows, columns) from
    /// a gpt-oss checkpoint, in the layout the GGUF llama.cpp's converter writes holds it:
    /// MXFP4 blocks repacked, float matrices transposed (each the gate or up half of the
    /// fused gate and up where `half` says).
    fn read_oss_experts(
        &mut self,
        name: &str,
        t: &OssExperts,
        shape: [usize; 3],
    ) -> Result<(StoredType, Vec<MappedBytes>)> {
        let [experts, rows, cols] = shape;
        let fused = |half: Option<usize>| if half.is_some() { 2 * rows } else { rows };
        let bad = |msg: String| st_err(&self.dir, format!("`{name}`: {msg}"));
        let (stored, per, map) = match t {
            OssExperts::Mxfp4 {
                blocks,
                scales,
                half,
            } => {
                if !cols.is_multiple_of(32) {
                    return Err(bad(format!("{cols} columns are not whole MXFP4 blocks")));
                }
                let (all, groups) = (fused(*half), cols / 32);
                for (hf, shape, what) in [
                    (blocks, vec![experts, all, groups, 16], "blocks"),
                    (scales, vec![experts, all, groups], "scales"),
                ] {
                    let dtype = self.entry(hf, &shape)?;
                    if dtype != "U8" {
                        return Err(ModelError::UnsupportedTensorType {
                            name: hf.clone(),
                            dtype: format!("{dtype} (MXFP4 {what} are U8)"),
                        });
                    }
                }
                let (b, s) = (self.places[blocks].bytes(), self.places[scales].bytes());
                let per = rows * groups * 17;
                // A row of blocks per task (gpt-oss-120b has 3.6e9 blocks).
                let map = anonymous_map(experts * per, |out| {
                    out.par_chunks_exact_mut(groups * 17)
                        .enumerate()
                        .for_each(|(i, dst)| {
                            let (e, r) = (i / rows, i % rows);
                            let row = e * all + half.map_or(r, |h| 2 * r + h);
                            for (g, d) in dst.chunks_exact_mut(17).enumerate() {
                                let at = row * groups + g;
                                d.copy_from_slice(&mxfp4_block(s[at], &b[at * 16..at * 16 + 16]));
                            }
                        });
                });
                (StoredType::Mxfp4, per, map)
            }
            OssExperts::Float { hf, half } => {
                let dtype = self.entry(hf, &[experts, cols, fused(*half)])?;
                let ggml = float_type(hf, &dtype)?;
                let size = ggml.type_size();
                let src = self.places[hf].bytes();
                let width = fused(*half);
                let per = rows * cols * size;
                // GGUF element (e, r, c) is the checkpoint's (e, c, r) (of the half's columns).
                let map = anonymous_map(experts * per, |out| {
                    out.par_chunks_exact_mut(cols * size)
                        .enumerate()
                        .for_each(|(i, dst)| {
                            let (e, r) = (i / rows, i % rows);
                            let col = half.map_or(r, |h| 2 * r + h);
                            for (c, d) in dst.chunks_exact_mut(size).enumerate() {
                                let at = ((e * cols + c) * width + col) * size;
                                d.copy_from_slice(&src[at..at + size]);
                            }
                        });
                });
                (StoredType::Ggml(ggml), per, map)
            }
            OssExperts::Bias { .. } => return Err(bad("a bias, not a matrix".into())),
        };
        let map = map.map_err(|e| ModelError::io(&self.dir, e))?;
        for hf in t.sources() {
            self.read.insert(hf);
        }
        let parts = (0..experts)
            .map(|e| MappedBytes::new(map.clone(), e * per, per).expect("experts × per bytes"))
            .collect();
        Ok((stored, parts))
    }

    /// The expert biases `hf` (`[experts, rows]`, its gate or up half where `half` says) as
    /// the GGUF's F32 `[experts, rows]` tensor of `shape`.
    fn read_oss_bias(&mut self, hf: &str, half: Option<usize>, shape: &[usize]) -> Result<QTensor> {
        let &[experts, rows] = shape else {
            return Err(st_err(&self.dir, format!("`{hf}`: expected 2 dimensions")));
        };
        let width = if half.is_some() { 2 * rows } else { rows };
        self.entry(hf, &[experts, width])?;
        self.read.insert(hf.to_string());
        let t = self
            .st
            .load(hf, &Device::Cpu)
            .map_err(|e| st_err(&self.dir, format!("tensor `{hf}`: {e}")))?
            .to_dtype(DType::F32)?;
        let t = match half {
            // (experts, rows, 2): the gate's at 0, the up's at 1.
            Some(h) => t.reshape((experts, rows, 2))?.narrow(2, h, 1)?.squeeze(2)?,
            None => t,
        };
        Ok(QTensor::quantize(&t.contiguous()?, GgmlDType::F32)?)
    }
}

impl TensorSource for Checkpoint {
    fn source_path(&self) -> &Path {
        &self.dir
    }

    fn has_tensor(&self, name: &str) -> bool {
        if let Some(t) = self.oss_experts(name) {
            return t.sources().iter().all(|n| self.entries.contains_key(n));
        }
        match self.expert_names(name) {
            Some(names) => names.iter().all(|n| self.entries.contains_key(n)),
            None => self
                .hf_name(name)
                .is_some_and(|n| self.entries.contains_key(&n)),
        }
    }

    fn read_experts_mapped(
        &mut self,
        name: &str,
        shape: [usize; 3],
    ) -> Result<(StoredType, Vec<MappedBytes>)> {
        if let Some(t) = self.oss_experts(name) {
            return self.read_oss_experts(name, &t, shape);
        }
        let names = self
            .expert_names(name)
            .filter(|n| n.len() == shape[0])
            .ok_or_else(|| {
                ModelError::MissingTensor(format!("{name} (no per-expert tensors for it)"))
            })?;
        let mut stored = None;
        let mut parts = Vec::with_capacity(names.len());
        for hf in names {
            if !self.entries.contains_key(&hf) {
                return Err(ModelError::MissingTensor(format!(
                    "{name} ({hf} in {})",
                    self.dir.display()
                )));
            }
            let (hf, ggml) = self.stored_type(hf, &shape[1..])?;
            // One stored type for every expert, as in the GGUF's 3-d tensor.
            let first = *stored.get_or_insert(ggml);
            if first != ggml {
                return Err(ModelError::UnsupportedTensorType {
                    name: hf,
                    dtype: format!("{ggml:?}, where the layer's first expert is {first:?}"),
                });
            }
            self.read.insert(hf.clone());
            parts.push(self.places[&hf].clone());
        }
        let stored =
            stored.ok_or_else(|| ModelError::MissingTensor(format!("{name}: no experts")))?;
        Ok((StoredType::Ggml(stored), parts))
    }

    fn read_tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        if let Some(OssExperts::Bias { hf, half }) = self.oss_experts(name) {
            return self.read_oss_bias(&hf, half, shape);
        }
        let stored = self.stored_shape(name, shape);
        let (hf, mut ggml) = self.lookup(name, &stored)?;
        self.read.insert(hf.clone());
        let mut t = self
            .st
            .load(&hf, &Device::Cpu)
            .map_err(|e| st_err(&self.dir, format!("tensor `{hf}`: {e}")))?
            .reshape(shape)?;
        // Gemma's and Qwen3.5's norms multiply by `1 + w` (llama.cpp's converter stores the
        // sum).
        if self.plus_one(&hf) {
            // Kept in f32: `1 + w` is not exact in the stored 16-bit type.
            t = (t.to_dtype(DType::F32)? + 1.0)?;
            ggml = GgmlDType::F32;
        }
        // Qwen3.5's decay rates are stored as `A_log`, used (and converted) as `−exp(A_log)`:
        // in f32, as transformers computes it.
        if hf.ends_with("linear_attn.A_log") {
            t = t.to_dtype(DType::F32)?.exp()?.neg()?;
            ggml = GgmlDType::F32;
        }
        Ok(QTensor::quantize(&t, ggml)?)
    }

    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        let (hf, ggml) = self.lookup(name, shape)?;
        self.read.insert(hf.clone());
        if self.plus_one(&hf) {
            // Stored as `w`, used as `1 + w`: only `read_tensor` makes that change.
            return Err(st_err(
                &self.dir,
                format!("tensor `{hf}`: a norm stored as `w` is read with its `1 + w` change"),
            ));
        }
        Ok((ggml, self.places[&hf].clone()))
    }

    fn rope_factors(&mut self, config: &ModelConfig) -> Result<Option<Vec<f32>>> {
        let rs = self.json.get("rope_scaling").filter(|v| !v.is_null());
        if let (Some(lr), Some(rs)) = (config.long_rope, rs) {
            // LongRoPE's factor lists, as llama.cpp's converter writes them (f32).
            let key = match lr.long(config.context_len) {
                true => "long_factor",
                false => "short_factor",
            };
            let bad = |msg: String| ModelError::Config {
                path: self.dir.join("config.json"),
                key: format!("rope_scaling.{key}"),
                msg,
            };
            let list = rs
                .get(key)
                .and_then(Json::as_array)
                .ok_or_else(|| bad("missing".into()))?;
            if list.len() != config.rope_dim / 2 {
                return Err(bad(format!(
                    "{} factors for {} rotated pairs",
                    list.len(),
                    config.rope_dim / 2
                )));
            }
            return list
                .iter()
                .map(|v| {
                    v.as_f64()
                        .map(|x| x as f32)
                        .ok_or_else(|| bad(format!("{v} is not a number")))
                })
                .collect::<Result<Vec<f32>>>()
                .map(Some);
        }
        if config.arch != Arch::Llama && config.arch != Arch::Mistral {
            return Ok(None);
        }
        Ok(rs.and_then(|rs| llama3_rope_factors(config, rs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MX block whose element `e` holds code `(7e + 3) mod 16` (a checkpoint's byte `j`:
    /// element `2j` low, `2j + 1` high) repacks to ggml's: the scale byte, then byte `i` with
    /// element `i` low and element `16 + i` high.
    #[test]
    fn an_mx_block_repacks_into_ggml_s_nibble_order() {
        let code = |e: usize| ((7 * e + 3) % 16) as u8;
        let hf: Vec<u8> = (0..16)
            .map(|j| code(2 * j) | (code(2 * j + 1) << 4))
            .collect();
        let out = mxfp4_block(0x7c, &hf);
        assert_eq!(out[0], 0x7c);
        for i in 0..16 {
            assert_eq!(out[1 + i], code(i) | (code(16 + i) << 4), "byte {i}");
        }
    }
}
