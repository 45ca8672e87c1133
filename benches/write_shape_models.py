#!/usr/bin/env python3
"""Random-weight models of real shapes for CPU speed measurements (issue #26), written from a
seed and quantized by llama.cpp's own `llama-quantize`, as the files users download are.

  write_shape_models.py OUT_DIR [--shape qwen2.5-1.5b|llama3-8b|tiny-qwen2] [--types Q4_K_M,Q8_0]
                        [--llama-bin DIR] [--seed N]

writes OUT_DIR/<shape>.F16.gguf (every matrix F16, norms F32, biases F32 where the architecture
has them), then runs `llama-quantize F16 OUT TYPE` for each type (default: Q4_K_M and Q8_0,
llama.cpp's own mix of tensor types: Q4_K with Q6_K for the output and for some attn_v and
ffn_down in Q4_K_M). Weights are standard normal / sqrt(fan-in) from numpy's PCG64 with the given
seed, so every run of the script writes the same bytes. The vocabulary is a placeholder byte-level
list of the real size (gpt2 model, no merges), which llama.cpp and Candor both load; speed does
not depend on the values or on the tokens. Needs numpy only (and llama-quantize).
Never commit the output: the F16 8B file is 16 GB.
"""
import argparse
import os
import struct
import subprocess
import sys

import numpy as np

SHAPES = {
    # Qwen2.5-1.5B-Instruct: q/k/v biases, tied embeddings.
    "qwen2.5-1.5b": dict(arch="qwen2", dim=1536, layers=28, heads=12, kv_heads=2, ffn=8960,
                         vocab=151936, ctx=32768, theta=1000000.0, eps=1e-6, tied=True, bias=True),
    # Llama-3-8B-Instruct.
    "llama3-8b": dict(arch="llama", dim=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
                      vocab=128256, ctx=8192, theta=500000.0, eps=1e-5, tied=False, bias=False),
    # Qwen3-30B-A3B's per-layer shape (issue #42) with 4 of its 48 layers (the per-layer
    # ratio against llama.cpp is the same): head 128 (q 4096 wide), q/k norms, 128 experts of
    # FFN 768, 8 used per token.
    "qwen3-30b-a3b-4l": dict(arch="qwen3moe", dim=2048, layers=4, heads=32, kv_heads=4,
                             head_dim=128, ffn=6144, experts=128, used=8, expert_ffn=768,
                             qk_norm=True, vocab=151936, ctx=40960, theta=1000000.0, eps=1e-6,
                             tied=False, bias=False),
    # A tiny qwen3moe of the same layout, for checking the script itself in seconds.
    "tiny-qwen3moe": dict(arch="qwen3moe", dim=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                          ffn=512, experts=8, used=2, expert_ffn=256, qk_norm=True, vocab=1024,
                          ctx=2048, theta=1000000.0, eps=1e-6, tied=True, bias=False),
    # A tiny qwen2 of the same layout, for checking the script itself in seconds.
    "tiny-qwen2": dict(arch="qwen2", dim=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=1024,
                       ctx=2048, theta=1000000.0, eps=1e-6, tied=True, bias=True),
}

GGML_F32, GGML_F16 = 0, 1
ALIGN = 32


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == 4:  # u32
        out += struct.pack("<I", value)
    elif vtype == 6:  # f32
        out += struct.pack("<f", value)
    elif vtype == 8:  # string
        out += gguf_string(value)
    elif vtype == 9:  # array: (element type, values)
        et, vals = value
        out += struct.pack("<IQ", et, len(vals))
        if et == 8:
            out += b"".join(gguf_string(v) for v in vals)
        else:
            out += np.asarray(vals, dtype="<i4").tobytes()
    else:
        raise ValueError(vtype)
    return out


def tensors(s):
    """(name, shape outermost first, kind) in file order; kind: matrix (its last dimension the
    input features; 3-d for experts, outermost), norm or bias."""
    d = s["dim"]
    hd = s.get("head_dim", d // s["heads"])
    qd, kvd = s["heads"] * hd, s["kv_heads"] * hd
    out = [("token_embd.weight", (s["vocab"], d), "matrix")]
    for i in range(s["layers"]):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (d,), "norm"))
        for name, rows in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
            out.append((p + name + ".weight", (rows, d), "matrix"))
            if s["bias"]:
                out.append((p + name + ".bias", (rows,), "bias"))
        if s.get("qk_norm"):
            out += [(p + "attn_q_norm.weight", (hd,), "norm"),
                    (p + "attn_k_norm.weight", (hd,), "norm")]
        out += [
            (p + "attn_output.weight", (d, qd), "matrix"),
            (p + "ffn_norm.weight", (d,), "norm"),
        ]
        if "experts" in s:
            e, f = s["experts"], s["expert_ffn"]
            out += [
                (p + "ffn_gate_inp.weight", (e, d), "matrix"),
                (p + "ffn_gate_exps.weight", (e, f, d), "matrix"),
                (p + "ffn_up_exps.weight", (e, f, d), "matrix"),
                (p + "ffn_down_exps.weight", (e, d, f), "matrix"),
            ]
        else:
            out += [
                (p + "ffn_gate.weight", (s["ffn"], d), "matrix"),
                (p + "ffn_up.weight", (s["ffn"], d), "matrix"),
                (p + "ffn_down.weight", (d, s["ffn"]), "matrix"),
            ]
    out.append(("output_norm.weight", (d,), "norm"))
    if not s["tied"]:
        out.append(("output.weight", (s["vocab"], d), "matrix"))
    return out


def metadata(s, name):
    a = s["arch"]
    vocab = [f"<t{i}>" for i in range(s["vocab"])]
    extra = []
    if "head_dim" in s:
        extra += [kv(f"{a}.attention.key_length", 4, s["head_dim"]),
                  kv(f"{a}.attention.value_length", 4, s["head_dim"])]
    if "experts" in s:
        extra += [kv(f"{a}.expert_count", 4, s["experts"]),
                  kv(f"{a}.expert_used_count", 4, s["used"]),
                  kv(f"{a}.expert_feed_forward_length", 4, s["expert_ffn"])]
    return extra + [
        kv("general.architecture", 8, a),
        kv("general.name", 8, name),
        kv("general.file_type", 4, 1),  # mostly F16
        kv(f"{a}.block_count", 4, s["layers"]),
        kv(f"{a}.context_length", 4, s["ctx"]),
        kv(f"{a}.embedding_length", 4, s["dim"]),
        kv(f"{a}.feed_forward_length", 4, s["ffn"]),
        kv(f"{a}.attention.head_count", 4, s["heads"]),
        kv(f"{a}.attention.head_count_kv", 4, s["kv_heads"]),
        kv(f"{a}.rope.freq_base", 6, s["theta"]),
        kv(f"{a}.attention.layer_norm_rms_epsilon", 6, s["eps"]),
        kv("tokenizer.ggml.model", 8, "gpt2"),
        kv("tokenizer.ggml.pre", 8, "default"),
        kv("tokenizer.ggml.tokens", 9, (8, vocab)),
        kv("tokenizer.ggml.token_type", 9, (5, [1] * len(vocab))),
        kv("tokenizer.ggml.merges", 9, (8, [])),
        kv("tokenizer.ggml.bos_token_id", 4, 0),
        kv("tokenizer.ggml.eos_token_id", 4, 1),
    ]


def write_f16(path, s, seed):
    rng = np.random.default_rng(seed)
    ts = tensors(s)
    meta = metadata(s, "random " + os.path.basename(path))
    infos, offset, sizes = b"", 0, []
    for name, shape, kind in ts:
        # The router stays F32 (llama-quantize never quantizes it).
        f32 = kind != "matrix" or name.endswith("ffn_gate_inp.weight")
        gtype, width = (GGML_F32, 4) if f32 else (GGML_F16, 2)
        nbytes = int(np.prod(shape)) * width
        dims = tuple(reversed(shape))  # ggml: fastest-varying dimension first
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", x) for x in dims)
        infos += struct.pack("<IQ", gtype, offset)
        sizes.append(nbytes)
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(meta)))
        for m in meta:
            f.write(m)
        f.write(infos)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for (name, shape, kind), nbytes in zip(ts, sizes):
            if kind == "norm":
                f.write((1.0 + 0.1 * rng.standard_normal(shape[0], dtype=np.float32)).tobytes())
            elif kind == "bias":
                f.write((0.1 * rng.standard_normal(shape[0], dtype=np.float32)).tobytes())
            else:
                cols = shape[-1]
                rows = int(np.prod(shape[:-1]))
                scale = np.float32(1.0 / np.sqrt(cols))
                step = max(1, (1 << 24) // cols)  # ~16M values at a time
                dtype = "<f4" if nbytes == int(np.prod(shape)) * 4 else "<f2"
                for r0 in range(0, rows, step):
                    n = min(step, rows - r0)
                    x = rng.standard_normal((n, cols), dtype=np.float32)
                    x *= scale
                    f.write(x.astype(dtype).tobytes())
            f.write(b"\0" * (-nbytes % ALIGN))
    os.replace(tmp, path)
    print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("--llama-bin", default="/work/tools/llama-build/bin")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    s = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    f16 = os.path.join(a.out, f"{a.shape}.F16.gguf")
    if not os.path.exists(f16):
        write_f16(f16, s, a.seed)
    quantize = os.path.join(a.llama_bin, "llama-quantize")
    for t in filter(None, a.types.split(",")):
        dst = os.path.join(a.out, f"{a.shape}.{t}.gguf")
        if os.path.exists(dst):
            continue
        if not os.access(quantize, os.X_OK):
            sys.exit(f"write_shape_models.py: no llama-quantize in {a.llama_bin} (--llama-bin)")
        subprocess.run([quantize, f16, dst + ".part", t, str(a.threads)], check=True,
                       stdout=subprocess.DEVNULL)
        os.replace(dst + ".part", dst)
        print(f"wrote {dst} ({os.path.getsize(dst) / 2**30:.2f} GiB)", flush=True)


if __name__ == "__main__":
    main()
