#!/usr/bin/env python3
"""Random-weight models of a real shape for GPU speed measurements (the weights cannot be
fetched on the GPU machine, and speed does not depend on their values).

  write_models.py OUT_DIR [--shape llama3-8b|smollm2|tiny] [--what q4_k_m,q8_0,q4_1,bf16]

writes OUT_DIR/<shape>.Q4_K_M.gguf (Q4_K matrices, Q6_K output and ffn_down/attn_v of every
other layer, as llama.cpp's Q4_K_M mix), OUT_DIR/<shape>.Q8_0.gguf, and OUT_DIR/<shape>-bf16/
(config.json and sharded bf16 safetensors, for transformers and for Candor's checkpoint
loader), OUT_DIR/<shape>.Q4_1.gguf (Q4_1 matrices, Q8_0 embedding: the default model's mix;
`--shape smollm2` is the default model's shape, with tied embeddings). The GGUFs carry a placeholder byte-level vocabulary so that llama.cpp loads them too.
Only numpy is needed for the GGUFs; torch and safetensors for the checkpoint.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# The GGUF key/value encoding is shared with the CPU shape models' writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from write_shape_models import gguf_string, kv  # noqa: E402

SHAPES = {
    # Llama-3-8B: dim 4096, 32 layers, 32 heads / 8 KV heads, FFN 14336, vocab 128256.
    "llama3-8b": dict(dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                      ctx=8192, theta=500000.0),
    # SmolLM2-135M (the default model): dim 576, 30 layers, 9 heads / 3 KV heads, FFN 1536,
    # vocab 49152, tied embeddings.
    "smollm2": dict(dim=576, layers=30, heads=9, kv_heads=3, ffn=1536, vocab=49152,
                    ctx=8192, theta=100000.0, tied=True),
    "tiny": dict(dim=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=1024, ctx=2048,
                 theta=10000.0),
}

# ggml types: (id, elements per block, bytes per block)
TYPES = {"F32": (0, 1, 4), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q6_K": (14, 256, 210)}
RNG = np.random.default_rng(8)


def f16(x):
    return np.frombuffer(np.float16(x).tobytes(), dtype=np.uint8)


def blocks(kind, n_elems, scale):
    """Random blocks whose values are about `scale` in size."""
    _, per, size = TYPES[kind]
    nb = n_elems // per
    b = RNG.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if kind == "Q8_0":
        b[:, 0:2] = f16(scale / 64)
    elif kind == "Q4_1":
        b[:, 0:2] = f16(scale / 4)  # d
        b[:, 2:4] = f16(-2 * scale)  # m
    elif kind == "Q4_K":
        b[:, 0:2] = f16(scale / 256)  # d
        b[:, 2:4] = f16(scale / 512)  # dmin
    elif kind == "Q6_K":
        b[:, 192:208] = RNG.integers(1, 32, size=(nb, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = f16(scale / 512)
    return b.tobytes()


def write_gguf(path, s, mix):
    d, hd = s["dim"], s["dim"] // s["heads"]
    kvd = s["kv_heads"] * hd
    tensors = [("token_embd.weight", (s["vocab"], d), mix("embd", 0))]
    for i in range(s["layers"]):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", (d,), "F32"),
            (p + "attn_q.weight", (d, d), mix("q", i)),
            (p + "attn_k.weight", (kvd, d), mix("k", i)),
            (p + "attn_v.weight", (kvd, d), mix("v", i)),
            (p + "attn_output.weight", (d, d), mix("o", i)),
            (p + "ffn_norm.weight", (d,), "F32"),
            (p + "ffn_gate.weight", (s["ffn"], d), mix("gate", i)),
            (p + "ffn_up.weight", (s["ffn"], d), mix("up", i)),
            (p + "ffn_down.weight", (d, s["ffn"]), mix("down", i)),
        ]
    tensors += [("output_norm.weight", (d,), "F32")]
    if not s.get("tied"):
        tensors += [("output.weight", (s["vocab"], d), mix("out", 0))]
    a = "llama"
    vocab = [f"<t{i}>" for i in range(s["vocab"])]
    meta = [
        kv("general.architecture", 8, a),
        kv("general.name", 8, "random " + os.path.basename(path)),
        kv(f"{a}.block_count", 4, s["layers"]),
        kv(f"{a}.context_length", 4, s["ctx"]),
        kv(f"{a}.embedding_length", 4, d),
        kv(f"{a}.feed_forward_length", 4, s["ffn"]),
        kv(f"{a}.attention.head_count", 4, s["heads"]),
        kv(f"{a}.attention.head_count_kv", 4, s["kv_heads"]),
        kv(f"{a}.rope.freq_base", 6, s["theta"]),
        kv(f"{a}.attention.layer_norm_rms_epsilon", 6, 1e-5),
        kv("tokenizer.ggml.model", 8, "gpt2"),
        kv("tokenizer.ggml.pre", 8, "default"),
        kv("tokenizer.ggml.tokens", 9, (8, vocab)),
        kv("tokenizer.ggml.token_type", 9, (5, [1] * len(vocab))),
        kv("tokenizer.ggml.merges", 9, (8, [])),
        kv("tokenizer.ggml.bos_token_id", 4, 0),
        kv("tokenizer.ggml.eos_token_id", 4, 1),
    ]
    align = 32
    infos, offset = b"", 0
    sizes = []
    for name, shape, kind in tensors:
        tid, per, size = TYPES[kind]
        n = int(np.prod(shape))
        nbytes = n // per * size
        dims = tuple(reversed(shape))  # ggml: fastest-varying dimension first
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", x) for x in dims)
        infos += struct.pack("<IQ", tid, offset)
        sizes.append(nbytes)
        offset += (nbytes + align - 1) // align * align
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        f.write(infos)
        f.write(b"\0" * (-f.tell() % align))
        for (name, shape, kind), nbytes in zip(tensors, sizes):
            n = int(np.prod(shape))
            if kind == "F32":
                data = np.ones(n, dtype=np.float32).tobytes()
            else:
                data = blocks(kind, n, 1.0 / np.sqrt(shape[-1]))
            assert len(data) == nbytes
            f.write(data)
            f.write(b"\0" * (-nbytes % align))
    print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB)")


def q4_k_m(role, layer):
    if role == "out":
        return "Q6_K"
    if role in ("v", "down") and layer % 2 == 0:
        return "Q6_K"
    return "Q4_K"


def write_bf16(out, s):
    import torch
    from safetensors.torch import save_file

    d, hd = s["dim"], s["dim"] // s["heads"]
    kvd = s["kv_heads"] * hd
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
        "intermediate_size": s["ffn"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "vocab_size": s["vocab"], "max_position_embeddings": s["ctx"], "rms_norm_eps": 1e-5,
        "rope_theta": s["theta"], "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(8)

    def rand(*shape):
        return (torch.randn(*shape, generator=g, device=dev) / shape[-1] ** 0.5).to(torch.bfloat16).cpu()

    shards, shard, size, index = [], {}, 0, {}
    def flush():
        nonlocal shard, size
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
            shards.append(name)
            for k in shard:
                index[k] = name
            shard, size = {}, 0
    def add(name, t):
        nonlocal size
        shard[name] = t
        size += t.numel() * 2
        if size > 4 << 30:
            flush()
    add("model.embed_tokens.weight", rand(s["vocab"], d))
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", torch.ones(d, dtype=torch.bfloat16))
        add(p + "self_attn.q_proj.weight", rand(d, d))
        add(p + "self_attn.k_proj.weight", rand(kvd, d))
        add(p + "self_attn.v_proj.weight", rand(kvd, d))
        add(p + "self_attn.o_proj.weight", rand(d, d))
        add(p + "post_attention_layernorm.weight", torch.ones(d, dtype=torch.bfloat16))
        add(p + "mlp.gate_proj.weight", rand(s["ffn"], d))
        add(p + "mlp.up_proj.weight", rand(s["ffn"], d))
        add(p + "mlp.down_proj.weight", rand(d, s["ffn"]))
    add("model.norm.weight", torch.ones(d, dtype=torch.bfloat16))
    add("lm_head.weight", rand(s["vocab"], d))
    flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    print(f"wrote {out} ({len(shards)} shards)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--what", default="q4_k_m,q8_0,bf16")
    a = ap.parse_args()
    s = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    what = a.what.split(",")
    if "q4_k_m" in what:
        write_gguf(os.path.join(a.out, f"{a.shape}.Q4_K_M.gguf"), s, q4_k_m)
    if "q8_0" in what:
        write_gguf(os.path.join(a.out, f"{a.shape}.Q8_0.gguf"), s, lambda r, i: "Q8_0")
    if "q4_1" in what:
        write_gguf(os.path.join(a.out, f"{a.shape}.Q4_1.gguf"), s,
                   lambda r, i: "Q8_0" if r == "embd" else "Q4_1")
    if "bf16" in what:
        write_bf16(os.path.join(a.out, f"{a.shape}-bf16"), s)


if __name__ == "__main__":
    main()
