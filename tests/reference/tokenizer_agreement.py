#!/usr/bin/env python3
"""Reference token ids from llama.cpp's llama-tokenize for vocab-only GGUF files.

For every <name>.gguf in DIR this writes <name>.expected.jsonl: one line per sample text,
{"text": ..., "ids": [...]} as `llama-tokenize --ids` prints them (BOS as the model asks,
special tokens parsed). The Rust test `tokenizer_agreement_with_llama_cpp` (tests/it/arch.rs,
run with CANDOR_TOKENIZER_GGUFS=DIR and `-- --ignored`) compares Candor's tokenizer against these files.

Make the GGUFs with llama.cpp's converter from real tokenizer files, e.g. for a folder with
tokenizer.json, tokenizer_config.json and a config.json naming the architecture:
  python3 convert_hf_to_gguf.py FOLDER --vocab-only --outfile DIR/name.gguf

Run: python3 tests/reference/tokenizer_agreement.py DIR [LLAMA_BIN_DIR]
Not run by CI.
"""
import glob
import json
import os
import subprocess
import sys

SAMPLES = [
    "Hello world",
    " Hello world",
    "Hello  world,   it's   2024!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you've seen THEY'LL and we'd.",
    "12345 678 9 1000000 3.14159 -42",
    "def f(x):\n    return x ** 2  # square\n",
    "\n\n\nthree newlines then text\n",
    "\t tabs\tand  spaces \t",
    "   ",
    "",
    "a",
    "Ünïcödé façade naïve café",
    "Привет, как дела?",
    "日本語のテキストと漢字",
    "中文分词测试，标点符号。",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "שלום עולם",
    "emoji 😀🎉👍🏽 and 🇫🇷",
    "mixed123abc456DEF",
    "URL: https://example.com/path?a=1&b=2#frag",
    "email me at someone@example.org!",
    "<s> a special token in text </s>",
    "<|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<start_of_turn>user\nHello<end_of_turn>\n",
    "<|user|>\nQuestion?<|end|>\n<|assistant|>",
    "Ŀ weird bytes \u00a0 nbsp \u200b zero-width",
    "{\"json\": [1, 2, {\"k\": null}]}",
    "....!!!???---___",
    "CamelCaseIdentifiers and snake_case_names",
    "A long sentence, with several clauses; some punctuation: and a final period.",
    "Line one\r\nLine two\rLine three",
    "   leading and trailing spaces   ",
    "😀",
    "\u0301combining accent first",
    "ﬁ ligature and ẞ",
    "x" * 40,
    "The year 1999 and 2000s, 1,234,567.89",
]


def main():
    d = sys.argv[1]
    bin_dir = sys.argv[2] if len(sys.argv) > 2 else "/work/tools/llama-build/bin"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = bin_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    for gguf in sorted(glob.glob(os.path.join(d, "*.gguf"))):
        out = gguf[: -len(".gguf")] + ".expected.jsonl"
        with open(out, "w", encoding="utf-8") as f:
            for text in SAMPLES:
                r = subprocess.run(
                    [os.path.join(bin_dir, "llama-tokenize"), "-m", gguf, "-p", text,
                     "--ids", "--log-disable"],
                    capture_output=True,
                    env=env,
                )
                if r.returncode != 0:
                    print(gguf, "failed on", repr(text), r.stderr.decode()[-300:])
                    continue
                line = r.stdout.decode().strip().splitlines()[-1]
                f.write(json.dumps({"text": text, "ids": json.loads(line)}, ensure_ascii=False) + "\n")
        print(out)


if __name__ == "__main__":
    main()
