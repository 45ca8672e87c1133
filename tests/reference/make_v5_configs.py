#!/usr/bin/env python3
"""Each tiny fixture's config.json as transformers 5 writes it.

transformers 5 keeps a model's RoPE in one `rope_parameters` object (per layer type for
Gemma 3) where earlier versions wrote `rope_theta`, `rope_scaling` and `rope_local_base_freq`.
For each architecture under tests/fixtures/tiny/ this loads the committed checkpoint with
transformers >= 5, saves its config again and keeps the result as config.v5.json beside
config.json. It first checks that transformers 5 reads the checkpoint as the model the
reference was made with: the first prompt's last-position logits within 1e-4 of
reference.json's (written by make_tiny.py under transformers 4).

Run: python3 tests/reference/make_v5_configs.py [arch ...]
Not run by CI: the committed config.v5.json files are its output.
"""
import json
import os
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tiny")


def main():
    assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
    archs = sys.argv[1:] or sorted(os.listdir(FIXTURES))
    torch.set_num_threads(1)
    for arch in archs:
        d = os.path.join(FIXTURES, arch)
        with open(os.path.join(d, "reference.json")) as f:
            run = json.load(f)["runs"][0]
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            logits = model(torch.tensor([run["prompt"]])).logits[0, -1]
        diff = (logits - torch.tensor(run["last_logits"])).abs().max().item()
        assert diff < 1e-4, f"{arch}: transformers 5's logits differ by {diff}"
        with tempfile.TemporaryDirectory() as tmp:
            # The config as loaded (the model above was loaded in f32, its config says so).
            transformers.AutoConfig.from_pretrained(d).save_pretrained(tmp)
            with open(os.path.join(tmp, "config.json")) as f:
                text = f.read()
        with open(os.path.join(d, "config.v5.json"), "w") as f:
            f.write(text)
        print(arch, f"config.v5.json written (logits within {diff:.1e})")


if __name__ == "__main__":
    main()
