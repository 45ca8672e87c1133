#!/usr/bin/env bash
# The prefix cache's share of prompt tokens on a hybrid model against a dense one (issue #43):
#
#   CANDOR_DATA=DIR benches/hybrid_prefix.sh [LIMIT]
#
# Writes a tiny random qwen35 (Gated DeltaNet hybrid) and a tiny random qwen3 (dense), both
# with the default model's tokenizer and chat template (benches/write_tiny_hybrid_chat.py), and
# runs the same branching Fennec run (LIMIT items, 2 branches) with each as candidate and
# judge, then with the default model; prints each run's prompt tokens computed and reused.
# Needs `candor setup` (the default model) and llama.cpp's gguf-py ($LLAMA_CPP_SRC).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
limit=${1:-3}
src=${LLAMA_CPP_SRC:-/work/tools/llama/llama_cpp_python-0.3.36/vendor/llama.cpp}
# CANDOR_BIN: a built candor to use instead of building the release binary.
if [ -z "${CANDOR_BIN:-}" ]; then cargo build --release >&2; fi
bin=${CANDOR_BIN:-$root/target/release/candor}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tok=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
python3 benches/write_tiny_hybrid_chat.py "$tok" "$tmp/hybrid.gguf" --src "$src" >&2
python3 benches/write_tiny_hybrid_chat.py "$tok" "$tmp/dense.gguf" --dense --src "$src" >&2
for m in "$tmp/hybrid.gguf" "$tmp/dense.gguf" default; do
    out="$tmp/run-$(basename "$m" .gguf)"
    CANDOR_NO_CACHE=1 CANDOR_OFFLINE=1 "$bin" run fennec --model "$m" --judge "$m" \
        --limit "$limit" --branches 2 --max-new-tokens 32 --judge-max-new-tokens 64 \
        --out "$out" 2>/dev/null >/dev/null
    jq -r --arg m "$(basename "$m")" \
        '"\($m): \(.prefill_tokens_computed) computed, \(.prefill_tokens_reused) reused, share \(100 * .prefill_tokens_reused / (.prefill_tokens_computed + .prefill_tokens_reused) | floor)%"' \
        "$out/engine.json"
done
