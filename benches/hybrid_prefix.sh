#!/usr/bin/env bash
# The prefix cache's share of prompt tokens on a hybrid model against a dense one (issue #43):
#
#   CANDOR_DATA=DIR benches/hybrid_prefix.sh [LIMIT]
#
# Writes a tiny random qwen35 (Gated DeltaNet hybrid) and a tiny random qwen3 (dense), both
# with the default model's tokenizer and chat template (benches/write_tiny_hybrid_chat.py), and
# 1. runs the same branching Fennec run (LIMIT items, 2 branches) with each as candidate and
#    judge, then with the default model; prints each run's prompt tokens computed and reused
#    (the runs' prompts differ: random replies end their chains at other steps);
# 2. like for like: replays the default model's run's prompts (its samples.jsonl, in that
#    order) through `candor generate --batch-size 1` with each of the three models, which
#    prints the prompt tokens computed and taken from the prefix cache.
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
prompts="$tmp/prompts.jsonl"
jq -c '{id: "\(.item)/\(.key)", messages}' "$tmp/run-default/samples.jsonl" >"$prompts"
n=$(wc -l <"$prompts")
for m in "$tmp/hybrid.gguf" "$tmp/dense.gguf" default; do
    # Replies are cut at 8 tokens: no Fennec prompt extends an earlier one's reply.
    line=$(CANDOR_OFFLINE=1 "$bin" generate --model "$m" --prompts "$prompts" --batch-size 1 \
        --max-new-tokens 8 --out "$tmp/replay-$(basename "$m" .gguf).jsonl" 2>&1 >/dev/null |
        grep -o 'prompt tokens: [0-9]* computed, [0-9]* from the prefix cache')
    computed=$(echo "$line" | sed 's/prompt tokens: \([0-9]*\) computed.*/\1/')
    reused=$(echo "$line" | sed 's/.*computed, \([0-9]*\) from.*/\1/')
    echo "replay of the default run's $n prompts, $(basename "$m"): $computed computed, $reused reused, share $((100 * reused / (computed + reused)))%"
done
