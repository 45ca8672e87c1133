#!/usr/bin/env python3
"""A tiny seeded random gpt-oss model as OpenAI publishes its checkpoints, and its float
reference.

Writes under tests/fixtures/tiny/:
  gpt-oss/       config.json (with `quantization_config` of `quant_method` mxfp4) and
                 model.safetensors: the experts as MXFP4 blocks and scales
                 (`mlp.experts.{gate_up,down}_proj_{blocks,scales}`, uint8: random codes,
                 exponents 2^-5..2^-2), everything else bf16, as openai/gpt-oss-20b; and
                 reference.json: transformers' greedy continuations with the experts
                 dequantized (`Mxfp4Config(dequantize=True)`), run in float32 with eager
                 attention (tokens, top-2 gaps, the prompt's last-position logits), YaRN's
                 ramp ends rounded to whole pairs as llama.cpp rounds them (`truncate` true;
                 the checkpoint's config says false, as gpt-oss's does)
  gpt-oss-bf16/  config.json and model.safetensors of the same model as transformers saves it
                 dequantized (`mlp.experts.gate_up_proj` [experts, hidden, 2 * ffn] with gate
                 and up interleaved, `down_proj` [experts, ffn, hidden]; bf16 holds every
                 MXFP4 value exactly), as the BF16 copies on the Hub are
With --gguf it also converts both with llama.cpp's convert_hf_to_gguf.py (LLAMA_CPP=path to
the llama.cpp source) to OUT/gpt-oss.gguf and OUT/gpt-oss-bf16.gguf (`--outtype bf16`: each
tensor in the checkpoint's own type, the MXFP4 experts repacked), with a byte-level
BPE tokenizer trained on the README; the converter's pre-tokenizer check, which knows only
published tokenizers' hashes, is told `gpt-2` (the vocabulary plays no part in the weights).

Run (transformers >= 5): python3 tests/reference/make_tiny_gpt_oss.py [--gguf] [--out DIR]
Not run by CI: the committed fixtures are its output.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny import FIXTURES, ROOT, SEED, VOCAB, prompts, write_reference  # noqa: E402

CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=6,
    # gpt-oss's own context, YaRN (factor 32 over 4096, transformers' defaults) and base.
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# As openai/gpt-oss-20b's config.json.
QUANTIZATION = dict(
    quant_method="mxfp4",
    modules_to_not_convert=[
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
)


def write_mxfp4(out_dir):
    config = transformers.GptOssConfig(**CONFIG)
    torch.manual_seed(SEED)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Norms start at 1, biases and sinks at 0: randomise them all.
            if "norm" in name or name.endswith("bias") or name.endswith("sinks"):
                p.copy_(p + 0.3 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            cfg = json.load(f)
    g = torch.Generator().manual_seed(SEED + 1)
    e, d, f_ = CONFIG["num_local_experts"], CONFIG["hidden_size"], CONFIG["intermediate_size"]
    for layer in range(CONFIG["num_hidden_layers"]):
        pre = f"model.layers.{layer}.mlp.experts."
        for proj, rows, cols in (("gate_up_proj", 2 * f_, d), ("down_proj", d, f_)):
            del tensors[pre + proj]
            tensors[pre + proj + "_blocks"] = torch.randint(
                0, 256, (e, rows, cols // 32, 16), generator=g, dtype=torch.uint8
            )
            tensors[pre + proj + "_scales"] = torch.randint(
                122, 126, (e, rows, cols // 32), generator=g, dtype=torch.uint8
            )
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = QUANTIZATION
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def load_dequantized(ckpt, truncate=None):
    config = transformers.AutoConfig.from_pretrained(ckpt)
    if truncate is not None:
        config.rope_parameters["truncate"] = truncate
    return transformers.GptOssForCausalLM.from_pretrained(
        ckpt,
        config=config,
        dtype=torch.float32,
        attn_implementation="eager",
        quantization_config=transformers.Mxfp4Config(dequantize=True),
    ).eval()


def write_bf16(model, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, name), os.path.join(out_dir, name))


def train_tokenizer(work):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([os.path.join(ROOT, "README.md")], trainer)
    path = os.path.join(work, "tokenizer.json")
    tok.save(path)
    return path


def to_gguf(name, ckpt, work, tokenizer):
    llama_cpp = os.environ.get(
        "LLAMA_CPP", "/work/tools/llama/llama_cpp_python-0.3.36/vendor/llama.cpp"
    )
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(ckpt, d)
    shutil.copy(tokenizer, os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                       tokenizer_class="PreTrainedTokenizerFast"), f)
    out = os.path.join(work, f"{name}.gguf")
    script = os.path.join(llama_cpp, "convert_hf_to_gguf.py")
    run = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {llama_cpp!r})\n"
        f"sys.path.insert(1, {os.path.join(llama_cpp, 'gguf-py')!r})\n"
        "import conversion.base as base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        f"sys.argv = [{script!r}, {d!r}, '--outtype', 'bf16', '--outfile', {out!r}]\n"
        f"runpy.run_path({script!r}, run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", run], check=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", action="store_true")
    ap.add_argument("--out", default="/tmp/candor-tiny")
    a = ap.parse_args()
    assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
    torch.set_num_threads(1)
    mx = os.path.join(FIXTURES, "gpt-oss")
    bf = os.path.join(FIXTURES, "gpt-oss-bf16")
    write_mxfp4(mx)
    model = load_dequantized(mx)
    # The reference rounds YaRN's ramp ends to whole pairs (`truncate`), as llama.cpp does
    # whatever the config says; gpt-oss's config says false (its checkpoint keeps that).
    write_reference(load_dequantized(mx, truncate=True), mx, "gpt-oss", rope_truncate=True)
    write_bf16(model, bf)
    # The saved BF16 copy is the same model: the same logits.
    again = transformers.GptOssForCausalLM.from_pretrained(
        bf, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([prompts()[2]])
    with torch.no_grad():
        diff = (again(ids).logits - model(ids).logits).abs().max().item()
    assert diff == 0.0, f"the BF16 copy's logits differ by {diff}"
    print("written:", mx, bf)
    if a.gguf:
        os.makedirs(a.out, exist_ok=True)
        tok = train_tokenizer(a.out)
        for name, ckpt in (("gpt-oss", mx), ("gpt-oss-bf16", bf)):
            print(name, "gguf:", to_gguf(name, ckpt, a.out, tok))


if __name__ == "__main__":
    main()
