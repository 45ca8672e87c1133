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
use serde_json::Value as Json;

use crate::model::arch::{llama3_rope_factors, Arch, ArchSpec, ModelConfig, TensorSource};
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
    if prefix == "model." {
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
        let (base, kind) = name.rsplit_once('.')?;
        let gemma = self.config.arch.is_gemma();
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
        let (dtype, found) = &self.entries[&hf];
        if found.as_slice() != shape {
            return Err(ModelError::TensorShape {
                name: hf,
                expected: format!("{shape:?}"),
                found: format!("{found:?}"),
            });
        }
        let ggml = match dtype.as_str() {
            "F32" => GgmlDType::F32,
            "F16" => GgmlDType::F16,
            "BF16" => GgmlDType::BF16,
            other => {
                return Err(ModelError::UnsupportedTensorType {
                    name: hf,
                    dtype: format!("{other} (supported: F32, F16, BF16)"),
                })
            }
        };
        Ok((hf, ggml))
    }
}

impl TensorSource for Checkpoint {
    fn source_path(&self) -> &Path {
        &self.dir
    }

    fn has_tensor(&self, name: &str) -> bool {
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
        let (hf, mut ggml) = self.lookup(name, shape)?;
        self.read.insert(hf.clone());
        let mut t = self
            .st
            .load(&hf, &Device::Cpu)
            .map_err(|e| st_err(&self.dir, format!("tensor `{hf}`: {e}")))?;
        // Gemma's norms multiply by `1 + w` (llama.cpp's converter stores the sum).
        if self.config.arch.norm_plus_one() && hf.ends_with("norm.weight") {
            // Kept in f32: `1 + w` is not exact in the stored 16-bit type.
            t = (t.to_dtype(DType::F32)? + 1.0)?;
            ggml = GgmlDType::F32;
        }
        Ok(QTensor::quantize(&t, ggml)?)
    }

    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        let (hf, ggml) = self.lookup(name, shape)?;
        self.read.insert(hf.clone());
        if self.config.arch.norm_plus_one() && hf.ends_with("norm.weight") {
            // Stored as `w`, used as `1 + w`: only `read_tensor` makes that change.
            return Err(st_err(
                &self.dir,
                format!("tensor `{hf}`: a Gemma norm is read with its `1 + w` change"),
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
