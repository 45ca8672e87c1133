#!/usr/bin/env python3
"""Tiny seeded random models of every supported architecture, and their float references.

For each architecture this writes, under tests/fixtures/tiny/<arch>/:
  config.json, model.safetensors   a Hugging Face checkpoint (random weights from a fixed
                                   seed, stored as bf16; a few tens of KB, test-only)
  reference.json                   transformers' greedy continuations of fixed prompts, run in
                                   float32 with eager attention: tokens, the top-2 logit gap of
                                   every step, and the prompt's last-position logits
With --gguf it also writes, outside the repository (default /tmp/candor-tiny), a sentencepiece
tokenizer.model trained on the repository's README, and converts each checkpoint to an F32
GGUF with llama.cpp's convert_hf_to_gguf.py (LLAMA_CPP=path to the llama.cpp source).

Run: python3 tests/reference/make_tiny.py [--gguf] [--out DIR]
Not run by CI: the committed fixtures are its output.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tiny")
SEED = 7
VOCAB = 512
PROMPTS_SEED = 11
PROMPT_LENS = [5, 9, 17]
NEW_TOKENS = 16

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    # Larger than the usual 0.02 so that tiny models have peaked, well-separated logits.
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# Half the head rotated (8 dimensions, 4 pairs) in interleaved sections that fit it
# (Qwen3.5's [11, 11, 10] fit its 64 rotated dimensions).
QWEN35_ROPE = dict(
    rope_type="default",
    rope_theta=10000.0,
    partial_rotary_factor=0.5,
    mrope_section=[2, 1, 1],
    mrope_interleaved=True,
)

# The hybrids' tiny geometry: three Gated DeltaNet layers (two key heads, four value heads),
# then a full-attention one.
LINEAR_ATTENTION = dict(
    head_dim=16,
    num_hidden_layers=4,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    tie_word_embeddings=False,
)
# Their experts: four, two used, and a shared one.
EXPERTS = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)

ARCHS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_theta=10000.0,
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(rope_theta=10000.0, sliding_window=6, tie_word_embeddings=False),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(rope_theta=1000000.0, head_dim=16, tie_word_embeddings=True),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=6,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=6,
            # Six layers: llama.cpp's default pattern (five sliding, one full), which is also
            # what convert_hf_to_gguf.py leaves it to assume.
            num_hidden_layers=6,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False, pad_token_id=0),
    ),
    # transformers >= 5. Ministral 3: YaRN with its betas and `mscale_all_dim`, and Llama 4's
    # attention temperature, both over an original context of 8 so that a prompt of 17 steps
    # through them.
    "ministral3": (
        "Ministral3Config",
        "Ministral3ForCausalLM",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                type="yarn",
                rope_theta=1000000.0,
                factor=16.0,
                original_max_position_embeddings=8,
                max_position_embeddings=128,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale_all_dim=1.0,
                mscale=1.0,
                llama_4_scaling_beta=0.1,
            ),
        ),
    ),
    # transformers >= 5. No RoPE on every fourth layer (`no_rope_layers`), tied embeddings.
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(num_hidden_layers=4, rope_theta=5000000.0, tie_word_embeddings=True),
    ),
    # transformers >= 5. Gated DeltaNet layers (two key heads, four value heads: grouped),
    # then a full-attention layer with an output gate, partial RoPE and q/k norms.
    "qwen35": (
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        dict(LINEAR_ATTENTION, rope_parameters=QWEN35_ROPE),
    ),
    # transformers >= 5: qwen35's layers with experts (four, two used, renormalised) and a
    # sigmoid-gated shared expert.
    "qwen35moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(LINEAR_ATTENTION, **EXPERTS, rope_parameters=QWEN35_ROPE),
    ),
    # transformers >= 5: Qwen3-Next, q|k|v|z and β|α fused per key head, plain partial RoPE.
    "qwen3next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(
            LINEAR_ATTENTION,
            **EXPERTS,
            norm_topk_prob=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        ),
    ),
    # transformers >= 5: GLM-4.5, a dense layer then experts with DeepSeek's sigmoid routing
    # (selection bias, two groups of which one is used, weights renormalised and scaled), a
    # shared expert, q/k/v biases and norms, half the head rotated.
    "glm4moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            head_dim=16,
            num_hidden_layers=3,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            use_qk_norm=True,
            attention_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        ),
    ),
}


def prompts():
    g = torch.Generator().manual_seed(PROMPTS_SEED)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


def write_reference(ref_model, out_dir, arch, **extra):
    """reference.json: `ref_model`'s greedy continuations of the prompts, with the top-2 gap of
    every step and each prompt's last-position logits (`extra`: more fields to record)."""
    runs = []
    for ids in prompts():
        seq = list(ids)
        gaps = []
        first_logits = None
        with torch.no_grad():
            for step in range(NEW_TOKENS):
                # Full recomputation each step: no cache subtleties in the reference.
                logits = ref_model(torch.tensor([seq])).logits[0, -1].float()
                if first_logits is None:
                    first_logits = logits.tolist()
                top = torch.topk(logits, 2)
                gaps.append(float(top.values[0] - top.values[1]))
                seq.append(int(top.indices[0]))
        runs.append(
            dict(prompt=ids, tokens=seq[len(ids):], gaps=gaps, last_logits=first_logits)
        )
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(
            dict(
                arch=arch,
                transformers=transformers.__version__,
                torch=torch.__version__,
                seed=SEED,
                **extra,
                runs=runs,
            ),
            f,
        )


def make(arch, out_dir):
    cfg_cls, model_cls, extra = ARCHS[arch]
    kwargs = dict(COMMON)
    kwargs.update(extra)
    config = getattr(transformers, cfg_cls)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = getattr(transformers, model_cls)(config).eval()
    # Norm weights are initialised to 1 (0 for Gemma and Qwen3.5); randomise them too so
    # that the (1 + w) convention and every norm are exercised, and Qwen3.5's decays.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("A_log", "dt_bias")):
                p.copy_(p + 0.3 * torch.randn_like(p))
            # Qwen3.5-MoE's router starts at 0 (every expert tied), and GLM's selection bias.
            if name.endswith(("mlp.gate.weight", "e_score_correction_bias")):
                p.copy_(0.3 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for extra_file in ("generation_config.json",):
        p = os.path.join(out_dir, extra_file)
        if os.path.exists(p):
            os.remove(p)
    # The reference runs in f32 on exactly the stored (bf16) weights.
    ref_model = getattr(transformers, model_cls).from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    write_reference(ref_model, out_dir, arch)
    return model


def train_tokenizer(work):
    import sentencepiece as spm

    text = os.path.join(work, "corpus.txt")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as src, open(
        text, "w", encoding="utf-8"
    ) as dst:
        dst.write(src.read())
    prefix = os.path.join(work, "tok")
    spm.SentencePieceTrainer.train(
        input=text,
        model_prefix=prefix,
        vocab_size=VOCAB,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
    )
    return prefix + ".model"


def to_gguf(arch, ckpt, work, tok_model):
    llama_cpp = os.environ.get(
        "LLAMA_CPP", "/work/tools/llama_cpp_python-0.3.36/vendor/llama.cpp"
    )
    d = os.path.join(work, arch)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(ckpt, d)
    shutil.copy(tok_model, os.path.join(d, "tokenizer.model"))
    out = os.path.join(work, f"{arch}-f32.gguf")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(llama_cpp, "gguf-py") + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run(
        [sys.executable, os.path.join(llama_cpp, "convert_hf_to_gguf.py"), d,
         "--outtype", "f32", "--outfile", out],
        check=True,
        env=env,
    )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", action="store_true")
    ap.add_argument("--out", default="/tmp/candor-tiny")
    ap.add_argument("archs", nargs="*", default=list(ARCHS))
    a = ap.parse_args()
    torch.set_num_threads(1)
    tok = None
    if a.gguf:
        os.makedirs(a.out, exist_ok=True)
        tok = train_tokenizer(a.out)
    for arch in a.archs:
        ckpt = os.path.join(FIXTURES, arch)
        make(arch, ckpt)
        print(arch, "checkpoint and reference written to", ckpt)
        if a.gguf:
            print(arch, "gguf:", to_gguf(arch, ckpt, a.out, tok))


if __name__ == "__main__":
    main()
