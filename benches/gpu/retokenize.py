#!/usr/bin/env python3
"""Gives a random-weight GGUF a real tokenizer and chat template, for an end-to-end protocol
run at a real shape (the random models carry a placeholder vocabulary that no text tokenizes to).

  retokenize.py extract SRC.gguf VOCAB.gguf       SRC's tokenizer.* keys alone (no tensors):
                                                  a small file to carry to the GPU machine
  retokenize.py apply MODEL.gguf VOCAB.gguf OUT.gguf
                                                  MODEL's tensors and other keys with VOCAB's
                                                  tokenizer; the token list padded with unused
                                                  tokens `<unused_N>` (type 5) to MODEL's
                                                  embedding rows

The tensor data is copied byte for byte (its offsets are relative to the data section, which
starts at the next alignment after the new header). Standard library only.
"""
import os
import shutil
import struct
import sys

# GGUF value types: (struct format, size) of the fixed-size ones; 8 string, 9 array.
FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, f, path):
        self.f, self.path = f, path

    def take(self, fmt):
        size = struct.calcsize("<" + fmt)
        b = self.f.read(size)
        if len(b) != size:
            sys.exit(f"{self.path}: truncated at byte {self.f.tell()}")
        return struct.unpack("<" + fmt, b)[0]

    def string(self):
        n = self.take("Q")
        return self.f.read(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype in FIXED:
            return self.take(FIXED[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        sys.exit(f"{self.path}: unknown GGUF value type {vtype} at byte {self.f.tell()}")


def pack_string(s):
    b = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def pack_value(vtype, v):
    if vtype in FIXED:
        return struct.pack("<" + FIXED[vtype], v)
    if vtype == STRING:
        return pack_string(v)
    et, vals = v
    return struct.pack("<IQ", et, len(vals)) + b"".join(pack_value(et, x) for x in vals)


def read(path):
    """(keys as [(key, type, value)], tensor infos as [(name, dims, type, offset)], data start)."""
    with open(path, "rb") as f:
        r = Reader(f, path)
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
        if version != 3:
            sys.exit(f"{path}: GGUF version {version}, expected 3")
        keys = []
        for _ in range(n_kv):
            k = r.string()
            t = r.take("I")
            keys.append((k, t, r.value(t)))
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.take("Q") for _ in range(r.take("I"))]
            infos.append((name, dims, r.take("I"), r.take("Q")))
        align = next((v for k, _, v in keys if k == "general.alignment"), 32)
        start = f.tell() + (-f.tell() % align)
    return keys, infos, start, align


def write(path, keys, infos, align, data_from=None):
    with open(path + ".part", "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(keys)))
        for k, t, v in keys:
            f.write(pack_string(k) + struct.pack("<I", t) + pack_value(t, v))
        for name, dims, t, off in infos:
            f.write(pack_string(name) + struct.pack("<I", len(dims)))
            f.write(b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, off))
        f.write(b"\0" * (-f.tell() % align))
        if data_from:
            src, start = data_from
            with open(src, "rb") as s:
                s.seek(start)
                shutil.copyfileobj(s, f, 64 << 20)
    os.replace(path + ".part", path)


def extract(src, out):
    keys, _, _, align = read(src)
    tok = [k for k in keys if k[0].startswith("tokenizer.")]
    if not any(k[0] == "tokenizer.ggml.tokens" for k in tok):
        sys.exit(f"{src}: no tokenizer.ggml.tokens")
    write(out, tok, [], align)
    print(f"{out}: {len(tok)} tokenizer keys from {src}")


def apply(model, vocab, out):
    keys, infos, start, align = read(model)
    tok = [k for k in read(vocab)[0] if k[0].startswith("tokenizer.")]
    rows = next((dims[1] for name, dims, _, _ in infos if name == "token_embd.weight"), None)
    if rows is None:
        sys.exit(f"{model}: no token_embd.weight")
    by = {k: (t, v) for k, t, v in tok}
    tokens = by["tokenizer.ggml.tokens"][1][1]
    if len(tokens) > rows:
        sys.exit(f"{vocab}: {len(tokens)} tokens, more than {model}'s {rows} embedding rows")
    pad = rows - len(tokens)
    new = []
    for k, t, v in tok:
        et, vals = v if t == ARRAY else (None, None)
        if k == "tokenizer.ggml.tokens":
            v = (et, vals + [f"<unused_{i}>" for i in range(len(vals), rows)])
        elif k == "tokenizer.ggml.token_type":
            v = (et, vals + [5] * pad)
        elif k == "tokenizer.ggml.scores":
            v = (et, vals + [0.0] * pad)
        new.append((k, t, v))
    kept = [k for k in keys if not k[0].startswith("tokenizer.")]
    write(out, kept + new, infos, align, data_from=(model, start))
    print(f"{out}: {model}'s {len(infos)} tensors, {len(tokens)} tokens from {vocab} + {pad} unused")


def main():
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "extract":
        extract(a[1], a[2])
    elif len(a) == 4 and a[0] == "apply":
        apply(a[1], a[2], a[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
