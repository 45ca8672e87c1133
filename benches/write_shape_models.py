#!/usr/bin/env python3
"""Random-weight models of real shapes for CPU speed measurements (issue #26), written from a
seed and quantized by llama.cpp's own `llama-quantize`, as the files users download are.

  write_shape_models.py OUT_DIR [--shape qwen2.5-1.5b|llama3-8b|llama3.2-1b|qwen3-30b-a3b-4l|gpt-oss-20b-4l|qwen3.5-4b|...]
                        [--types Q4_K_M,Q8_0] [--llama-bin DIR] [--seed N] [--layers N] [--random-blocks]

writes OUT_DIR/<shape>.F16.gguf (every matrix F16, norms F32, biases F32 where the architecture
has them), then runs `llama-quantize F16 OUT TYPE` for each type (default: Q4_K_M and Q8_0,
llama.cpp's own mix of tensor types: Q4_K with Q6_K for the output and for some attn_v and
ffn_down in Q4_K_M). Weights are standard normal / sqrt(fan-in) from numpy's PCG64 with the given
seed, so every run of the script writes the same bytes. The vocabulary is a placeholder byte-level
list of the real size (gpt2 model, no merges), which llama.cpp and Candor both load; speed does
not depend on the values or on the tokens. Needs numpy only (and llama-quantize).

`--layers N` keeps the shape's per-layer sizes with N layers (files named `<shape>-<N>l.*`): the
per-token time scales with the layers, so ratios between builds stay. `--random-blocks` writes
OUT_DIR/<shape>.Q4_K_M.gguf directly, without llama-quantize: random Q4_K/Q6_K block bytes with
fixed scales (d = 1/(256 sqrt(fan-in)), as benches/gpu/write_models.py) in llama-quantize's
Q4_K_M mix (Q6_K for the output, or the token embedding when tied, and for attn_v and ffn_down
of the layers its `use_more_bits` picks). For gpt-oss shapes it writes OUT_DIR/<shape>.MXFP4_MOE.gguf
instead, in llama-quantize's MXFP4_MOE mix: random MXFP4 expert blocks (one E8M0 exponent per
tensor, values about 1/sqrt(fan-in)), every other matrix random Q8_0 blocks, the router F32.
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
    # Llama-3.2-1B-Instruct, the usual draft model for Llama-3-8B (issue #45): the same
    # vocabulary, head 64, tied embeddings.
    "llama3.2-1b": dict(arch="llama", dim=2048, layers=16, heads=32, kv_heads=8, ffn=8192,
                        vocab=128256, ctx=131072, theta=500000.0, eps=1e-5, tied=True,
                        bias=False),
    # Qwen3-30B-A3B (issue #42), all 48 layers: head 128 (q 4096 wide), q/k norms, 128
    # experts of FFN 768, 8 used per token (the GPU check's MoE shape, issue #44).
    "qwen3-30b-a3b": dict(arch="qwen3moe", dim=2048, layers=48, heads=32, kv_heads=4,
                          head_dim=128, ffn=6144, experts=128, used=8, expert_ffn=768,
                          qk_norm=True, vocab=151936, ctx=40960, theta=1000000.0, eps=1e-6,
                          tied=False, bias=False),
    # gpt-oss-20b's per-layer shape (issue #42) with 4 of its 24 layers: head 64 (q 4096 wide),
    # q/k/v/o biases, attention sinks, a 128-position window on alternate layers, YaRN RoPE,
    # 32 experts of FFN 2880 with biases, 4 used per token, a biased router. Quantize with
    # `--types MXFP4_MOE` (MXFP4 experts, as the published files).
    "gpt-oss-20b-4l": dict(arch="gpt-oss", dim=2880, layers=4, heads=64, kv_heads=8, head_dim=64,
                           ffn=2880, experts=32, used=4, expert_ffn=2880, vocab=201088,
                           ctx=131072, theta=150000.0, eps=1e-5, tied=False, bias=True,
                           oss=True, window=128, yarn=(32.0, 4096)),
    # Qwen3.5-4B (issue #43): 32 layers, 3 of every 4 Gated DeltaNet (16 key heads and 32 value
    # heads of 128, conv of 4 taps), every 4th full attention (16/4 heads of 256, the query
    # projection twice as wide for its output gate, q/k norms, RoPE over a quarter of each head
    # in sections [11, 11, 10]), FFN 9216, tied embeddings, a 248,320-token vocabulary.
    "qwen3.5-4b": dict(arch="qwen35", dim=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                       ffn=9216, qk_norm=True, vocab=248320, ctx=262144, theta=10000000.0,
                       eps=1e-6, tied=True, bias=False,
                       linear=dict(interval=4, conv=4, state=128, k_heads=16, v_heads=32),
                       rope_dim=64, sections=[11, 11, 10, 0]),
    # Qwen3.5-35B-A3B's per-layer shape (issue #43), 40 layers in the real file: those layers
    # (16/2 heads of 256) with 256 experts of FFN 512, 8 used, and a shared expert of FFN 512
    # behind a sigmoid gate; untied. Use --layers 4 or 8 (one or two groups of four).
    "qwen3.5-35b-a3b": dict(arch="qwen35moe", dim=2048, layers=40, heads=16, kv_heads=2,
                            head_dim=256, ffn=512, experts=256, used=8, expert_ffn=512,
                            shared_ffn=512, qk_norm=True, vocab=248320, ctx=262144,
                            theta=10000000.0, eps=1e-6, tied=False, bias=False,
                            linear=dict(interval=4, conv=4, state=128, k_heads=16, v_heads=32),
                            rope_dim=64, sections=[11, 11, 10, 0]),
    # DeepSeek-V2-Lite (GGUF `deepseek2`, the layout of DeepSeek-V3/R1 and GLM-4.7-Flash):
    # Multi-head Latent Attention (16 heads, no query rank, kv_lora_rank 512, 128 + 64
    # query/key and 128 value dimensions per head, absorbed: attn_k_b / attn_v_b), the first
    # layer dense (FFN 10944), then 64 experts of FFN 1408, 6 used, softmax, and 2 ungated
    # shared experts. Use --layers 4 (one dense and three MoE layers).
    "deepseek-v2-lite": dict(arch="deepseek2", dim=2048, layers=27, heads=16, kv_heads=1,
                             ffn=10944, experts=64, used=6, expert_ffn=1408, vocab=102400,
                             ctx=163840, theta=10000.0, eps=1e-6, tied=False, bias=False,
                             mla=dict(q_lora=0, kv_lora=512, nope=128, rope=64, v_head=128,
                                      shared=2, dense_lead=1, gating=1)),
    # A tiny qwen3moe of the same layout, for checking the script itself in seconds.
    "tiny-qwen3moe": dict(arch="qwen3moe", dim=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                          ffn=512, experts=8, used=2, expert_ffn=256, qk_norm=True, vocab=1024,
                          ctx=2048, theta=1000000.0, eps=1e-6, tied=True, bias=False),
    # A tiny gpt-oss of gpt-oss-20b's layout (biases, sinks, a 16-position window on alternate
    # layers, YaRN, 8 experts of FFN 256 with biases, 2 used), for the GPU check's MoE stage.
    "tiny-gpt-oss": dict(arch="gpt-oss", dim=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                         ffn=512, experts=8, used=2, expert_ffn=256, vocab=1024, ctx=2048,
                         theta=150000.0, eps=1e-5, tied=False, bias=True, oss=True, window=16,
                         yarn=(32.0, 4096)),
    # A tiny qwen2 of the same layout, for checking the script itself in seconds.
    "tiny-qwen2": dict(arch="qwen2", dim=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=1024,
                       ctx=2048, theta=1000000.0, eps=1e-6, tied=True, bias=True),
}

# Qwen3-30B-A3B with 4 of its 48 layers, for the CPU (the per-layer ratio against llama.cpp
# is the same).
SHAPES["qwen3-30b-a3b-4l"] = dict(SHAPES["qwen3-30b-a3b"], layers=4)

GGML_F32, GGML_F16 = 0, 1
ALIGN = 32
# ggml block types: (id, elements per block, bytes per block)
BLOCKS = {"Q4_K": (12, 256, 144), "Q6_K": (14, 256, 210), "Q8_0": (8, 32, 34),
          "MXFP4": (39, 32, 17)}


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
    lin = s.get("linear")
    for i in range(s["layers"]):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (d,), "norm"))
        if lin:
            out += hybrid_attention(s, p, i)
            out += feed_forward(s, p)
            continue
        if "mla" in s:
            out += latent_attention(s, p, i)
            continue
        for name, rows in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
            out.append((p + name + ".weight", (rows, d), "matrix"))
            if s["bias"]:
                out.append((p + name + ".bias", (rows,), "bias"))
        if s.get("qk_norm"):
            out += [(p + "attn_q_norm.weight", (hd,), "norm"),
                    (p + "attn_k_norm.weight", (hd,), "norm")]
        out.append((p + "attn_output.weight", (d, qd), "matrix"))
        oss = s.get("oss", False)
        if oss:
            out += [(p + "attn_output.bias", (d,), "bias"),
                    (p + "attn_sinks.weight", (s["heads"],), "bias")]
        out.append((p + ("post_attention_norm.weight" if oss else "ffn_norm.weight"), (d,), "norm"))
        out += feed_forward(s, p)
    out.append(("output_norm.weight", (d,), "norm"))
    if not s["tied"]:
        out.append(("output.weight", (s["vocab"], d), "matrix"))
    return out


def latent_attention(s, p, i):
    """A deepseek2 layer (llama.cpp's deepseek2.cpp with MLA absorbed): the queries (one
    matrix, or a low-rank pair), the compressed KV, per-head attn_k_b / attn_v_b, then the FFN:
    dense for the leading layers, else experts beside ungated shared experts."""
    d, m = s["dim"], s["mla"]
    h, qk = s["heads"], m["nope"] + m["rope"]
    if m["q_lora"]:
        out = [(p + "attn_q_a.weight", (m["q_lora"], d), "matrix"),
               (p + "attn_q_a_norm.weight", (m["q_lora"],), "norm"),
               (p + "attn_q_b.weight", (h * qk, m["q_lora"]), "matrix")]
    else:
        out = [(p + "attn_q.weight", (h * qk, d), "matrix")]
    out += [(p + "attn_kv_a_mqa.weight", (m["kv_lora"] + m["rope"], d), "matrix"),
            (p + "attn_kv_a_norm.weight", (m["kv_lora"],), "norm"),
            (p + "attn_k_b.weight", (h, m["kv_lora"], m["nope"]), "matrix"),
            (p + "attn_v_b.weight", (h, m["v_head"], m["kv_lora"]), "matrix"),
            (p + "attn_output.weight", (d, h * m["v_head"]), "matrix"),
            (p + "ffn_norm.weight", (d,), "norm")]
    if int(p.split(".")[1]) < m["dense_lead"]:
        f = s["ffn"]
        return out + [(p + "ffn_gate.weight", (f, d), "matrix"),
                      (p + "ffn_up.weight", (f, d), "matrix"),
                      (p + "ffn_down.weight", (d, f), "matrix")]
    e, f = s["experts"], s["expert_ffn"]
    sh = f * m["shared"]
    return out + [(p + "ffn_gate_inp.weight", (e, d), "matrix"),
                  (p + "ffn_gate_exps.weight", (e, f, d), "matrix"),
                  (p + "ffn_up_exps.weight", (e, f, d), "matrix"),
                  (p + "ffn_down_exps.weight", (e, d, f), "matrix"),
                  (p + "ffn_gate_shexp.weight", (sh, d), "matrix"),
                  (p + "ffn_up_shexp.weight", (sh, d), "matrix"),
                  (p + "ffn_down_shexp.weight", (d, sh), "matrix")]


def hybrid_attention(s, p, i):
    """A qwen35 layer's attention block (as llama.cpp's qwen35.cpp reads it): Gated DeltaNet on
    three of every `interval` layers, gated full attention on the last; then the FFN pre-norm
    `post_attention_norm`."""
    d, lin = s["dim"], s["linear"]
    hd = s["head_dim"]
    qd, kvd = s["heads"] * hd, s["kv_heads"] * hd
    if (i + 1) % lin["interval"] != 0:
        key_dim, value_dim = lin["state"] * lin["k_heads"], lin["state"] * lin["v_heads"]
        vh = lin["v_heads"]
        out = [(p + "attn_qkv.weight", (2 * key_dim + value_dim, d), "matrix"),
               (p + "attn_gate.weight", (value_dim, d), "matrix"),
               (p + "ssm_beta.weight", (vh, d), "matrix"),
               (p + "ssm_alpha.weight", (vh, d), "matrix"),
               (p + "ssm_conv1d.weight", (2 * key_dim + value_dim, lin["conv"]), "bias"),
               (p + "ssm_dt.bias", (vh,), "bias"),
               (p + "ssm_a", (vh,), "negative"),
               (p + "ssm_norm.weight", (lin["state"],), "norm"),
               (p + "ssm_out.weight", (d, value_dim), "matrix")]
    else:
        out = [(p + "attn_q.weight", (2 * qd, d), "matrix"),
               (p + "attn_k.weight", (kvd, d), "matrix"),
               (p + "attn_v.weight", (kvd, d), "matrix"),
               (p + "attn_q_norm.weight", (hd,), "norm"),
               (p + "attn_k_norm.weight", (hd,), "norm"),
               (p + "attn_output.weight", (d, qd), "matrix")]
    return out + [(p + "post_attention_norm.weight", (d,), "norm")]


def feed_forward(s, p):
    """The layer's FFN: dense, or routed experts (gpt-oss: with biases), with a sigmoid-gated
    shared expert where the shape has one (qwen35moe)."""
    d, out = s["dim"], []
    oss = s.get("oss", False)
    if "experts" in s:
        e, f = s["experts"], s["expert_ffn"]
        mats = [("ffn_gate_inp", (e, d)), ("ffn_gate_exps", (e, f, d)),
                ("ffn_up_exps", (e, f, d)), ("ffn_down_exps", (e, d, f))]
        for name, shape in mats:
            out.append((p + name + ".weight", shape, "matrix"))
            if oss:  # gpt-oss: router and expert biases
                out.append((p + name + ".bias", shape[:-1], "bias"))
    else:
        out += [
            (p + "ffn_gate.weight", (s["ffn"], d), "matrix"),
            (p + "ffn_up.weight", (s["ffn"], d), "matrix"),
            (p + "ffn_down.weight", (d, s["ffn"]), "matrix"),
        ]
    if "shared_ffn" in s:
        f = s["shared_ffn"]
        out += [(p + "ffn_gate_inp_shexp.weight", (d,), "bias"),
                (p + "ffn_gate_shexp.weight", (f, d), "matrix"),
                (p + "ffn_up_shexp.weight", (f, d), "matrix"),
                (p + "ffn_down_shexp.weight", (d, f), "matrix")]
    return out


def byte_chars():
    """GPT-2's byte-level alphabet (`bytes_to_unicode`): the character standing for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def metadata(s, name, file_type=1):
    a = s["arch"]
    # The 256 byte tokens first, so that any text encodes (one token a byte), then placeholders.
    vocab = byte_chars() + [f"<t{i}>" for i in range(256, s["vocab"])]
    extra = []
    if "head_dim" in s:
        extra += [kv(f"{a}.attention.key_length", 4, s["head_dim"]),
                  kv(f"{a}.attention.value_length", 4, s["head_dim"])]
    if "experts" in s:
        extra += [kv(f"{a}.expert_count", 4, s["experts"]),
                  kv(f"{a}.expert_used_count", 4, s["used"]),
                  kv(f"{a}.expert_feed_forward_length", 4, s["expert_ffn"])]
    if "shared_ffn" in s:
        extra.append(kv(f"{a}.expert_shared_feed_forward_length", 4, s["shared_ffn"]))
    if "mla" in s:
        m = s["mla"]
        extra += [kv(f"{a}.attention.q_lora_rank", 4, m["q_lora"]),
                  kv(f"{a}.attention.kv_lora_rank", 4, m["kv_lora"]),
                  kv(f"{a}.attention.key_length", 4, m["kv_lora"] + m["rope"]),
                  kv(f"{a}.attention.value_length", 4, m["kv_lora"]),
                  kv(f"{a}.attention.key_length_mla", 4, m["nope"] + m["rope"]),
                  kv(f"{a}.attention.value_length_mla", 4, m["v_head"]),
                  kv(f"{a}.rope.dimension_count", 4, m["rope"]),
                  kv(f"{a}.leading_dense_block_count", 4, m["dense_lead"]),
                  kv(f"{a}.expert_shared_count", 4, m["shared"]),
                  kv(f"{a}.expert_gating_func", 4, m["gating"])]
    if "linear" in s:
        lin = s["linear"]
        extra += [kv(f"{a}.full_attention_interval", 4, lin["interval"]),
                  kv(f"{a}.ssm.conv_kernel", 4, lin["conv"]),
                  kv(f"{a}.ssm.inner_size", 4, lin["state"] * lin["v_heads"]),
                  kv(f"{a}.ssm.state_size", 4, lin["state"]),
                  kv(f"{a}.ssm.time_step_rank", 4, lin["v_heads"]),
                  kv(f"{a}.ssm.group_count", 4, lin["k_heads"]),
                  kv(f"{a}.rope.dimension_count", 4, s["rope_dim"]),
                  kv(f"{a}.rope.dimension_sections", 9, (5, s["sections"]))]
    if "window" in s:
        extra.append(kv(f"{a}.attention.sliding_window", 4, s["window"]))
    if "yarn" in s:
        factor, orig = s["yarn"]
        extra += [kv(f"{a}.rope.scaling.type", 8, "yarn"),
                  kv(f"{a}.rope.scaling.factor", 6, factor),
                  kv(f"{a}.rope.scaling.original_context_length", 4, orig)]
    return extra + [
        kv("general.architecture", 8, a),
        kv("general.name", 8, name),
        kv("general.file_type", 4, file_type),  # 1: mostly F16, 15: Q4_K_M
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


def q4_k_m_type(s, name):
    """The block type llama-quantize's Q4_K_M gives matrix `name` (llama.cpp
    `llama_tensor_get_type`: Q6_K for the output, or for the token embedding when it is tied;
    for attn_v and ffn_down where `use_more_bits`; Q4_K elsewhere)."""
    n = s["layers"]
    if name == "output.weight" or (name == "token_embd.weight" and s["tied"]):
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def mxfp4_moe_type(s, name):
    """The block type llama-quantize's MXFP4_MOE gives matrix `name`: MXFP4 for the experts,
    Q8_0 for every other matrix."""
    return "MXFP4" if "_exps." in name else "Q8_0"


def random_blocks(rng, kind, n_elems, cols):
    """Random `kind` blocks with fixed scales, values about 1/sqrt(cols) in size."""
    _, per, size = BLOCKS[kind]
    nb = n_elems // per
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    scale = np.float32(1.0 / np.sqrt(cols))
    f16 = lambda x: np.frombuffer(np.float16(x).tobytes(), dtype=np.uint8)  # noqa: E731
    if kind == "Q4_K":
        b[:, 0:2] = f16(scale / 256)  # d
        b[:, 2:4] = f16(scale / 512)  # dmin
    elif kind == "Q8_0":  # d, then random i8 quants (about 74 in size)
        b[:, 0:2] = f16(scale / 74)
    elif kind == "MXFP4":  # E8M0 exponent (d = 2^(e - 128)), then random E2M1 codes (about 6)
        b[:, 0] = int(round(128 + np.log2(scale / 6)))
    else:  # Q6_K: signed 6-bit scales, then d
        b[:, 192:208] = rng.integers(1, 32, size=(nb, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = f16(scale / 512)
    return b.tobytes()


def write_f16(path, s, seed):
    write_gguf(path, s, seed, lambda name: "F16", file_type=1)


def write_gguf(path, s, seed, matrix_type, file_type):
    """Writes the shape with each matrix in `matrix_type(name)` (F16 values from the seeded
    normal, or random blocks), norms and biases F32."""
    rng = np.random.default_rng(seed)
    ts = tensors(s)
    meta = metadata(s, "random " + os.path.basename(path), file_type)
    infos, offset, sizes, types = b"", 0, [], []
    for name, shape, kind in ts:
        # The router stays F32 (llama-quantize never quantizes it).
        router = name.endswith("ffn_gate_inp.weight")
        t = matrix_type(name) if kind == "matrix" and not router else "F32"
        n = int(np.prod(shape))
        if t in BLOCKS:
            gtype, per, size = BLOCKS[t]
            nbytes = n // per * size
        else:
            gtype, width = (GGML_F16, 2) if t == "F16" else (GGML_F32, 4)
            nbytes = n * width
        dims = tuple(reversed(shape))  # ggml: fastest-varying dimension first
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", x) for x in dims)
        infos += struct.pack("<IQ", gtype, offset)
        sizes.append(nbytes)
        types.append(t)
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(meta)))
        for m in meta:
            f.write(m)
        f.write(infos)
        f.write(b"\0" * (-f.tell() % ALIGN))
        for (name, shape, kind), nbytes, t in zip(ts, sizes, types):
            if kind == "norm":
                f.write((1.0 + 0.1 * rng.standard_normal(shape[0], dtype=np.float32)).tobytes())
            elif kind == "negative":  # ssm_a = -exp(A_log)
                n = int(np.prod(shape))
                f.write((-np.exp(0.5 * rng.standard_normal(n, dtype=np.float32))).tobytes())
            elif kind == "bias":
                n = int(np.prod(shape))
                f.write((0.1 * rng.standard_normal(n, dtype=np.float32)).tobytes())
            elif t in BLOCKS:
                f.write(random_blocks(rng, t, int(np.prod(shape)), shape[-1]))
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
    ap.add_argument("--layers", type=int, help="the shape's layers, this many of them")
    ap.add_argument("--random-blocks", action="store_true",
                    help="write Q4_K_M directly (random blocks), without llama-quantize")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    stem = a.shape
    if a.layers is not None:
        if a.layers < 1:
            sys.exit("write_shape_models.py: --layers must be at least 1")
        s["layers"], stem = a.layers, f"{a.shape}-{a.layers}l"
    os.makedirs(a.out, exist_ok=True)
    if a.random_blocks:
        # llama.cpp's file types: 15 Q4_K_M, 38 MXFP4_MOE.
        mix, pick, ftype = ("Q4_K_M", q4_k_m_type, 15)
        if s.get("oss"):
            mix, pick, ftype = ("MXFP4_MOE", mxfp4_moe_type, 38)
        dst = os.path.join(a.out, f"{stem}.{mix}.gguf")
        if not os.path.exists(dst):
            write_gguf(dst, s, a.seed, lambda name: pick(s, name), file_type=ftype)
        return
    f16 = os.path.join(a.out, f"{stem}.F16.gguf")
    if not os.path.exists(f16):
        write_f16(f16, s, a.seed)
    quantize = os.path.join(a.llama_bin, "llama-quantize")
    for t in filter(None, a.types.split(",")):
        dst = os.path.join(a.out, f"{stem}.{t}.gguf")
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
