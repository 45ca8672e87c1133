#!/usr/bin/env python3
"""transformers beside `candor bench` on the GPU: a bf16 checkpoint, `generate` with padding
(an attention mask over the batch), greedy. Definitions as llama-batched-bench's: prefill tok/s
= B*P / T_prefill, decode tok/s = B*N / T_decode (aggregate over the batch).

  hf_bench.py CHECKPOINT_DIR --prompt-tokens P --new-tokens N --batch-size B [B ...]

Prints one JSON line per batch size.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[1])
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to("cuda").eval()
    vocab = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    for b in a.batch_size:
        ids = torch.randint(2, vocab, (b, a.prompt_tokens), generator=g, device="cuda")
        mask = torch.ones_like(ids)
        mask[0, :1] = 0  # padding present, so the masked path is the one timed
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4,
                           min_new_tokens=4, do_sample=False)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize()
            t_pp = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=a.new_tokens,
                           min_new_tokens=a.new_tokens, do_sample=False)
            torch.cuda.synchronize()
            t_all = time.perf_counter() - t0
        t_tg = max(t_all - t_pp, 1e-9)
        print(json.dumps({
            "engine": "transformers", "model": a.model, "batch_size": b,
            "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
            "prefill_tok_s": round(b * a.prompt_tokens / t_pp, 2),
            "decode_tok_s": round(b * a.new_tokens / t_tg, 2),
        }), flush=True)


if __name__ == "__main__":
    main()
