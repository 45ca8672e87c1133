#!/usr/bin/env python3
"""A tiny random model that chats: the seeded random F32 layers of the test fixtures' tiny
`qwen35` (Gated DeltaNet hybrid, tests/fixtures/quant/make_tiny_hybrid_reference.py: 4 layers,
256 wide) or, with `--dense`, their dense `qwen3` (make_tiny_quant_reference.py), with the
tokenizer and chat template of another GGUF (e.g. the default model), for measuring what the
prefix cache saves on a hybrid model against a dense one in a protocol run
(benches/hybrid_prefix.sh). Replies are random text, alike for both: the prompts, and so what
they share, are the protocol's.

Usage: python3 write_tiny_hybrid_chat.py TOKENIZER_GGUF OUT_GGUF [--dense] [--src LLAMA_CPP_DIR]
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fixtures", "quant"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--src", default="/work/tools/llama/llama_cpp_python-0.3.36/vendor/llama.cpp")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.src, "gguf-py"))
    import gguf
    import make_tiny_hybrid_reference as h
    import make_tiny_quant_reference as d

    ref = gguf.GGUFReader(a.tokenizer)
    vocab = len(ref.fields["tokenizer.ggml.tokens"].data)
    for m in (h, d):
        m.VOCAB, m.CTX = vocab, 8192

    def write_rest(w, ts):
        # The reference file's tokenizer keys (vocabulary, merges, special ids, template).
        for name, field in ref.fields.items():
            if not name.startswith("tokenizer."):
                continue
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
            else:
                w.add_key_value(name, field.contents(), vtype)
        for name, _, v in ts:
            w.add_tensor(name, v)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    h.write_rest = d.write_rest = write_rest
    gguf_py = os.path.join(a.src, "gguf-py")
    if a.dense:
        d.write_f32("qwen3", a.out, gguf_py)
    else:
        h.write_f32(a.out, gguf_py)
    arch = "qwen3" if a.dense else "qwen35"
    print(f"{a.out}: {arch}, vocabulary of {vocab} from {a.tokenizer}")


if __name__ == "__main__":
    main()
