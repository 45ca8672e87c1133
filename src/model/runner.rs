//! A loaded model on its device: the one forward pass runs on the CPU or, with the `cuda`
//! feature, on a GPU, behind the same call. The engine holds a [`Model`] and never asks which.

use super::arch::ModelConfig;
use super::device::{DeviceSpec, KvPool};
use super::error::Result;
use super::kv::{KvSeq, SeqStep};
use super::transformer::{Scratch, Transformer, WeightDType};
use crate::model::checkpoint::Checkpoint;
use crate::weights::source::ModelFiles;

/// Positions per KV block, on every device (the engine's block size).
pub const KV_BLOCK_TOKENS: usize = 16;

/// A model's weights on the device that runs its forward pass.
pub struct Model {
    llama: Transformer,
    #[cfg(feature = "cuda")]
    cuda: Option<super::cuda::CudaModel>,
}

impl Model {
    /// Places a loaded model on `device`: the CPU uses it as it is; a GPU gets its weights
    /// uploaded once and a KV pool in its memory. `cuda` without the feature is an error.
    pub fn new(llama: Transformer, device: DeviceSpec) -> Result<Model> {
        Model::with_kv_limit(llama, device, None)
    }

    /// [`Model::new`] with a GPU's KV pool held to at most `kv_limit` bytes (by default it
    /// takes 90% of the memory left after the weights, less 1 GiB); ignored on the CPU, whose
    /// KV grows in host memory.
    pub fn with_kv_limit(
        llama: Transformer,
        device: DeviceSpec,
        kv_limit: Option<usize>,
    ) -> Result<Model> {
        device.check_built()?;
        #[cfg(not(feature = "cuda"))]
        let _ = kv_limit;
        match device {
            DeviceSpec::Cpu => Ok(Model {
                llama,
                #[cfg(feature = "cuda")]
                cuda: None,
            }),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(n) => {
                let mut llama = llama;
                let cuda = super::cuda::CudaModel::load(&llama, n, KV_BLOCK_TOKENS, kv_limit)?;
                // The weights live on the device now: only the embedding stays on the host.
                super::cuda::release_host_matrices(&mut llama);
                Ok(Model {
                    llama,
                    cuda: Some(cuda),
                })
            }
            #[cfg(not(feature = "cuda"))]
            DeviceSpec::Cuda(_) => unreachable!("check_built refuses cuda without the feature"),
        }
    }

    /// Loads only the weights of resolved model files (a GGUF file or a checkpoint folder; no
    /// tokenizer or template needed, e.g. for a throughput benchmark of random weights) onto
    /// `device`.
    pub fn load_weights(
        files: &ModelFiles,
        dtype: WeightDType,
        device: DeviceSpec,
    ) -> Result<Model> {
        device.check_built()?;
        let llama = if files.checkpoint {
            let mut ck = Checkpoint::open(&files.weights)?;
            Transformer::from_checkpoint(&mut ck, dtype)?
        } else {
            Transformer::from_gguf_path(&files.weights, dtype)?
        };
        Model::new(llama, device)
    }

    /// Floats of recurrent state each sequence holds (0 without linear-attention layers).
    pub fn state_len(&self) -> usize {
        self.llama.state_len()
    }

    pub fn config(&self) -> &ModelConfig {
        self.llama.config()
    }

    /// The host model: configuration and weights as loaded; on a GPU, only the configuration,
    /// the embedding and the RoPE tables (the matrices were released after the upload).
    pub fn transformer(&self) -> &Transformer {
        &self.llama
    }

    pub fn device(&self) -> DeviceSpec {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            return c.spec();
        }
        DeviceSpec::Cpu
    }

    /// The device's name for manifests (`cpu`, or the GPU's name as its driver reports it).
    pub fn device_name(&self) -> String {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            return c.device_name().to_string();
        }
        "cpu".into()
    }

    /// The launches of the GPU's forward pass (its plan lowered), on a GPU.
    #[cfg(feature = "cuda")]
    pub fn gpu_lowering(&self) -> Option<&super::lowering::Lowering> {
        self.cuda.as_ref().map(|c| c.lowering())
    }

    /// Test support: whether the GPU's adjacent plan steps share launches (the default) or each
    /// step is launched alone (the reference the fused launches must equal bit for bit).
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_fusion(&mut self, fuse: bool) {
        if let Some(c) = &mut self.cuda {
            c.set_fusion(self.llama.plan(), fuse);
        }
    }

    /// Test support: the GPU's latent-attention heads' matrices launched one head at a time,
    /// not as one launch over every head; how many layers had that launch (0 without a GPU
    /// model).
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_mla_per_head(&mut self) -> usize {
        self.cuda.as_mut().map_or(0, |c| c.set_mla_per_head())
    }

    /// Test support: the GPU's grouped MoE expert launches in row tiles of one expert on every
    /// step (decode included), not row by row.
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_moe_tiles(&mut self) {
        if let Some(c) = &mut self.cuda {
            c.set_moe_tiles();
        }
    }

    /// Test support: the GPU's MoE experts launched one by one, not as grouped launches over
    /// every routed row; how many layers had the grouped launches (0 without a GPU model).
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_moe_per_expert(&mut self) -> usize {
        self.cuda.as_mut().map_or(0, |c| c.set_moe_per_expert())
    }

    /// Test support: the GPU's attention on the kernels for wide heads (latent attention's)
    /// whatever the model's head size; they must give the narrow kernels' bits.
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_wide_attention(&mut self) {
        if let Some(c) = &mut self.cuda {
            c.set_wide_attention(self.llama.plan());
        }
    }

    /// Test support: whether the GPU captures decode steps as CUDA graphs and replays them
    /// (the default from `CANDOR_CUDA_GRAPHS=1`); the steps replayed so far.
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn set_gpu_graphs(&mut self, on: bool) {
        if let Some(c) = &mut self.cuda {
            c.set_graphs(on);
        }
    }

    /// Test support: how many GPU steps were replayed from a captured CUDA graph.
    #[cfg(all(feature = "cuda", any(test, feature = "testkit")))]
    pub fn gpu_graph_replays(&self) -> usize {
        self.cuda.as_ref().map_or(0, |c| c.graph_replays())
    }

    /// The pool KV blocks must come from, when the KV lives in a device's memory.
    pub fn kv_pool(&self) -> Option<KvPool> {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            return Some(c.pool().clone());
        }
        None
    }

    /// One packed step ([`Transformer::forward`]'s contract) on the model's device. On the CPU it
    /// cannot fail; on a GPU a driver or kernel failure is an error.
    pub fn forward<'s, K: KvSeq>(
        &self,
        seqs: &mut [SeqStep<'_, K>],
        scratch: &'s mut Scratch,
    ) -> Result<&'s [f32]> {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            c.forward(&self.llama, seqs, scratch.logits_mut())?;
            return Ok(scratch.logits_mut().as_slice());
        }
        Ok(self.llama.forward(seqs, scratch))
    }
}

impl From<Transformer> for Model {
    /// A model on the CPU.
    fn from(llama: Transformer) -> Model {
        Model {
            llama,
            #[cfg(feature = "cuda")]
            cuda: None,
        }
    }
}
