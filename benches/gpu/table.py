#!/usr/bin/env python3
"""Tables for benches/gpu/run.sh, from the logs of one call.

  table.py kernels KERNELS_JSONL   per matmul: legacy vs integer kernels, against the copy rate;
                                   attention per layer and decode step
  table.py targets OUT_DIR         issue #44's target table (bench.log, llama.log, hf.log,
                                   moe-speed.log: the MoE shape, kernels.jsonl) with each
                                   target's verdict, and the end-to-end runs (e2e.log)

Only the standard library; missing logs give "–" cells, never an error.
"""
import json
import os
import sys


def lines(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def kernels(path):
    rows = lines(path)
    copy = next((r["copy_gbps"] for r in rows if "copy_gbps" in r), None)
    print(f"copy rate (device to device, read + write): {copy} GB/s")
    key = lambda r: (r["type"], r["shape"], r["m"])
    by = {}
    for r in rows:
        if "path" in r:
            by.setdefault(key(r), {})[r["path"]] = r
    # `integer` is the kernel the shape dispatches to (its `kernel` field); `integer-dp4a` /
    # `integer-mma` the other integer kernel on the same shape (from 16 rows).
    print(f"{'type':5} {'shape':12} {'m':>4} | {'legacy us':>10} {'integer us':>10} {'kernel':>6} "
          f"{'speed-up':>8} | {'int GB/s':>8} {'bw frac':>7} {'int TOPS':>8} | {'other':>6} "
          f"{'other us':>9} {'TOPS':>6}")
    for k in sorted(by):
        leg, new = by[k].get("legacy"), by[k].get("integer")
        alt = by[k].get("integer-dp4a") or by[k].get("integer-mma")
        lu = f"{leg['us']:.1f}" if leg else "–"
        nu = f"{new['us']:.1f}" if new else "–"
        kn = (new.get("kernel") or "–") if new else "–"
        sp = f"{leg['us'] / new['us']:.2f}x" if leg and new else "–"
        gb = f"{new['gbps']:.0f}" if new else "–"
        bf = f"{new['bw_frac']:.2f}" if new else "–"
        tp = f"{new['tops']:.2f}" if new else "–"
        an = (alt.get("kernel") or "–") if alt else "–"
        au = f"{alt['us']:.1f}" if alt else "–"
        at = f"{alt['tops']:.2f}" if alt else "–"
        print(f"{k[0]:5} {k[1]:12} {k[2]:>4} | {lu:>10} {nu:>10} {kn:>6} {sp:>8} | {gb:>8} {bf:>7} "
              f"{tp:>8} | {an:>6} {au:>9} {at:>6}")
    # Attention, one layer at the 8B shape (its 32 layers walked in turn): per decode step.
    att = [r for r in rows if "attention" in r]
    if att:
        print(f"\n{'attention':9} {'rows':>4} {'positions':>9} {'chunks':>6} | {'us/layer':>8} "
              f"{'ms/step':>7} | {'GB/s':>6} {'bw frac':>7}")
        for r in att:
            print(f"{r['attention']:9} {r['rows']:>4} {r['positions']:>9} {r['chunks']:>6} | "
                  f"{r['us']:>8.1f} {r['per_token_ms']:>7.3f} | {r['gbps']:>6.0f} {r['bw_frac']:>7.2f}")


def targets(out):
    # The MoE shape's lines (both engines) are in moe-speed.log.
    moe = lines(os.path.join(out, "moe-speed.log"))
    candor = lines(os.path.join(out, "bench.log")) + [r for r in moe if "prefill_tok_s" in r]
    llama = lines(os.path.join(out, "llama.log")) + [r for r in moe if "speed_tg" in r]
    hf = lines(os.path.join(out, "hf.log"))
    krows = lines(os.path.join(out, "kernels.jsonl"))
    copy = next((r["copy_gbps"] for r in krows if "copy_gbps" in r), None)

    def cand(file, path, b):
        return next((r for r in candor if r.get("file") == file and r.get("path") == path
                     and r.get("batch_size") == b), None)

    def ll(file, b):
        return next((r for r in llama if r.get("file") == file and r.get("pl") == b), None)

    def fmt(v):
        return "–" if v is None else f"{v:,.1f}"

    files = [("8b-q4_k_m", "llama3-8b.Q4_K_M.gguf"), ("8b-q8_0", "llama3-8b.Q8_0.gguf"),
             ("smollm2-q4_1", "smollm2.Q4_1.gguf"),
             ("30b-a3b-q4_k_m", "qwen3-30b-a3b-16l.Q4_K_M.gguf")]
    print("| file | engine | batch 1 prefill / decode tok/s | batch 16 | batch 64 |")
    print("| --- | --- | --- | --- | --- |")
    for cf, lf in files:
        cells = []
        for b in (1, 16, 64):
            r = cand(cf, "integer", b)
            cells.append(f"{fmt(r and r['prefill_tok_s'])} / {fmt(r and r['decode_tok_s'])}")
        r = cand(cf, "integer", 1) or {}
        how = ", CUDA graphs" if r.get("graphs") == "1" else ""
        print(f"| {cf} | Candor (integer kernels{how}) | " + " | ".join(cells) + " |")
        if cf == "8b-q4_k_m":
            for path, label in (("nographs", "Candor (no CUDA graphs)"),
                                ("short", "Candor (16-token prompts)")):
                rs = [cand(cf, path, b) for b in (1, 16, 64)]
                if any(rs):
                    print(f"| {cf} | {label} | " + " | ".join(
                        f"{fmt(r['prefill_tok_s'])} / {fmt(r['decode_tok_s'])}" if r else ""
                        for r in rs) + " |")
            r = cand(cf, "legacy", 1)
            if r:
                print(f"| {cf} | Candor (legacy kernels) | {fmt(r['prefill_tok_s'])} / "
                      f"{fmt(r['decode_tok_s'])} | | |")
            r = cand(cf, "unfused", 1)
            if r:
                print(f"| {cf} | Candor (each plan step its own launch) | "
                      f"{fmt(r['prefill_tok_s'])} / {fmt(r['decode_tok_s'])} | | |")
            r = cand(cf, "dp4a", 16)
            if r:
                print(f"| {cf} | Candor (dp4a, no tensor cores) | | {fmt(r['prefill_tok_s'])} / "
                      f"{fmt(r['decode_tok_s'])} | |")
        if cf == "30b-a3b-q4_k_m":
            rs = [cand(cf, "per-expert", b) for b in (1, 16, 64)]
            if any(rs):
                print(f"| {cf} | Candor (a launch per expert) | " + " | ".join(
                    f"{fmt(r['prefill_tok_s'])} / {fmt(r['decode_tok_s'])}" if r else ""
                    for r in rs) + " |")
        cells = []
        for b in (1, 16, 64):
            r = ll(lf, b)
            cells.append(f"{fmt(r and r['speed_pp'])} / {fmt(r and r['speed_tg'])}")
        print(f"| {cf} | llama.cpp CUDA | " + " | ".join(cells) + " |")
    cells = []
    for b in (1, 16, 64):
        r = next((x for x in hf if x.get("batch_size") == b), None)
        cells.append(f"{fmt(r and r['prefill_tok_s'])} / {fmt(r and r['decode_tok_s'])}")
    print("| 8b bf16 | transformers | " + " | ".join(cells) + " |")

    e2e = lines(os.path.join(out, "e2e.log"))
    if e2e:
        print()
        print("End to end: `candor run refutebench --subset qa/single`, the random 8B Q4_K_M file "
              "with the default model's tokenizer as candidate and judge, 64 new tokens per reply:")
        print()
        print("| device | items | exit | wall s | prompt tokens computed (reused) | tokens generated "
              "| generated tok/s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in e2e:
            print(f"| {r['e2e']} | {r['items']} | {r['rc']} | {r['seconds']:.1f} | "
                  f"{r['prompt_tokens'] if r['prompt_tokens'] is not None else '–'} "
                  f"({r['reused'] if r['reused'] is not None else '–'}) | "
                  f"{fmt(r['generated'])} | {fmt(r['gen_tok_s'])} |")
        g = next((r for r in e2e if r["e2e"] == "cuda" and r["items"] == 4 and r["rc"] == 0), None)
        c = next((r for r in e2e if r["e2e"] == "cpu" and r["items"] == 4 and r["rc"] == 0), None)
        if g and c:
            print(f"\nThe same 4 items: the GPU {c['seconds'] / g['seconds']:.1f}x the CPU's speed "
                  "(wall time, model loading included).")

    print()
    gib = 4.58 * 2**30  # the 8B Q4_K_M file's weights, read once per decode step
    def verdict(name, ok, detail):
        state = "–" if ok is None else ("MET" if ok else "not met")
        print(f"- {name}: {state} ({detail})")
    c1, l1 = cand("8b-q4_k_m", "integer", 1), ll("llama3-8b.Q4_K_M.gguf", 1)
    if c1 and l1 and copy:
        frac = c1["decode_tok_s"] * gib / (copy * 1e9)
        verdict("batch-1 decode >= 1.5x llama.cpp and >= 60% of copy bandwidth",
                c1["decode_tok_s"] >= 1.5 * l1["speed_tg"] and frac >= 0.6,
                f"{c1['decode_tok_s'] / l1['speed_tg']:.2f}x, {100 * frac:.0f}% of {copy:.0f} GB/s")
    else:
        verdict("batch-1 decode >= 1.5x llama.cpp and >= 60% of copy bandwidth", None, "missing")
    for b in (16, 64):
        c, l = cand("8b-q4_k_m", "integer", b), ll("llama3-8b.Q4_K_M.gguf", b)
        verdict(f"batch-{b} decode >= 1.2x llama.cpp", c and l and c["decode_tok_s"] >= 1.2 * l["speed_tg"],
                f"{c['decode_tok_s'] / l['speed_tg']:.2f}x" if c and l else "missing")
    for b in (1, 16):
        c, l = cand("8b-q4_k_m", "integer", b), ll("llama3-8b.Q4_K_M.gguf", b)
        verdict(f"batch-{b} prefill >= 1.0x llama.cpp", c and l and c["prefill_tok_s"] >= l["speed_pp"],
                f"{c['prefill_tok_s'] / l['speed_pp']:.2f}x" if c and l else "missing")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("kernels", "targets"):
        sys.exit(__doc__)
    {"kernels": kernels, "targets": targets}[sys.argv[1]](sys.argv[2])


if __name__ == "__main__":
    main()
