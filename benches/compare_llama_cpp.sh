#!/usr/bin/env bash
# Candor (`candor bench`) beside llama.cpp (`llama-batched-bench`) on one GGUF file, same
# definitions (S_PP = B*PP / T_PP, S_TG = B*TG / T_TG, aggregate over the batch), 2 threads,
# prompts of 128 and 1024 tokens at batch 1, 4 and 16, the two run back to back for every
# configuration, REPEATS times; prints the medians as the README table. Not run by CI; run it
# on a quiet machine (the load average is printed with the table).
#
# Usage: benches/compare_llama_cpp.sh [MODEL.gguf] [REPEATS] [LLAMA_BIN_DIR]
# (defaults: the default model, 3 repeats, /work/tools/llama-build/bin)
# The machine's limits (`candor bench --limits-only`: read bandwidth over all threads, the
# kernels' integer dot-product peak) are measured first, and each row gains the fraction of
# them reached: decode = bytes of weights and KV read per step / step time against the
# bandwidth, prefill = integer multiply-adds per token x tok/s against the peak; the same
# bytes and multiply-adds (Candor's count for the file) for both engines. A shared VM's read
# bandwidth moves within minutes (43-70 GB/s on one host in one hour), so it is measured again
# between the runs (0.4 s each): each run's decode fraction is against the mean of the
# measurements just before and just after it, and the row gives the median of those.
# Environment: NEW_TOKENS (default 64), THREADS (default 2),
# PROMPTS (default "128 1024"), BATCHES (default "1 4 16"),
# CANDOR_BIN (an already built candor binary; else `cargo build --release` builds it).
set -euo pipefail
model=$(realpath -m "${1:-$(dirname "$0")/../models/SmolLM2-135M-Instruct.Q4_1.gguf}")
cd "$(dirname "$0")/.."
repeats=${2:-3}
bin=${3:-/work/tools/llama-build/bin}
ntg=${NEW_TOKENS:-64}
threads=${THREADS:-2}
prompts=${PROMPTS:-128 1024}
batches=${BATCHES:-1 4 16}
[[ -f "$model" ]] || { echo "compare_llama_cpp.sh: model not found: $model (run candor setup)" >&2; exit 1; }
[[ -x "$bin/llama-batched-bench" ]] || { echo "compare_llama_cpp.sh: no llama-batched-bench in $bin" >&2; exit 1; }
if [[ -z "${CANDOR_BIN:-}" ]]; then
  cargo build --release --quiet
  CANDOR_BIN=target/release/candor
fi

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# llama-batched-bench writes `"key": value`, candor bench `"key":value`.
json_field() { sed -E "s/.*\"$1\": *([0-9.]+).*/\1/" <<<"$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

limits=$("$CANDOR_BIN" bench --limits --limits-only --threads "$threads")
bw=$(json_field read_gb_s "$limits"); peak=$(json_field int8_gmac_s "$limits")
pct() { awk -v x="$1" -v l="$2" 'BEGIN { printf "%.0f%%", (l > 0 ? 100 * x / l : 0) }'; }
read_bw() { json_field read_gb_s "$("$CANDOR_BIN" bench --limits --limits-only --threads "$threads")"; }
# A run's decode GB/s (bytes per step x steps/s, steps/s = aggregate tok/s / batch) over the
# mean of the bandwidths measured around it: frac TOK_S BW_BEFORE BW_AFTER.
frac() { awk -v s="$step_bytes" -v t="$1" -v b="$b" -v x="$2" -v y="$3" \
             'BEGIN { print s * t / b / 1e9 / ((x + y) / 2) }'; }
rows=(); bws=("$bw")
for pp in $prompts; do
  for b in $batches; do
    c_pp=(); c_tg=(); l_pp=(); l_tg=(); c_df=(); l_df=()
    for i in $(seq "$repeats"); do
      bw0=$(read_bw)
      line=$("$CANDOR_BIN" bench --model "$model" --prompt-tokens "$pp" --new-tokens "$ntg" \
             --batch-size "$b" --threads "$threads" | head -1)
      bw1=$(read_bw)
      cline=$line
      c_pp+=("$(json_field prefill_tok_s "$line")"); c_tg+=("$(json_field decode_tok_s "$line")")
      step_bytes=$(json_field decode_bytes_per_step "$line"); macs=$(json_field int_macs_per_token "$line")
      ctx=$(( b * (pp + ntg) + 16 ))
      line=$("$bin/llama-batched-bench" -m "$model" -c "$ctx" -b 2048 -ub 512 -npp "$pp" \
             -ntg "$ntg" -npl "$b" -t "$threads" -tb "$threads" --output-format jsonl 2>/dev/null \
             | grep '"speed_pp"' | tail -1)
      l_pp+=("$(json_field speed_pp "$line")"); l_tg+=("$(json_field speed_tg "$line")")
      bw2=$(read_bw); bws+=("$bw0" "$bw1" "$bw2")
      c_df+=("$(frac "${c_tg[-1]}" "$bw0" "$bw1")"); l_df+=("$(frac "${l_tg[-1]}" "$bw1" "$bw2")")
      echo "prompt $pp batch $b run $i: candor prefill ${c_pp[-1]} decode ${c_tg[-1]}" \
           "| llama.cpp prefill ${l_pp[-1]} decode ${l_tg[-1]}" >&2
    done
    cp=$(median "${c_pp[@]}"); ct=$(median "${c_tg[@]}")
    lp=$(median "${l_pp[@]}"); lt=$(median "${l_tg[@]}")
    # Prefill GMAC/s = macs * tok/s / 1e9 against the peak; decode: the runs' fractions (frac).
    pf() { pct "$(awk -v m="$macs" -v t="$1" 'BEGIN { print m * t / 1e9 }')" "$peak"; }
    df() { awk -v f="$(median "$@")" 'BEGIN { printf "%.0f%%", 100 * f }'; }
    rows+=("| $pp | $b | $cp | $lp | $(ratio "$cp" "$lp") | $(pf "$cp") / $(pf "$lp") | $ct | $lt | $(ratio "$ct" "$lt") | $(df "${c_df[@]}") / $(df "${l_df[@]}") |")
  done
done
echo
echo "$(basename "$model"), $threads threads, $ntg decoded tokens, median of $repeats; load: $(uptime | sed 's/.*load average: //')"
lo=$(printf '%s\n' "${bws[@]}" | sort -g | head -1); hi=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
printf 'read bandwidth measured %d times, between the runs: %.1f GB/s median, %.1f to %.1f (each run'"'"'s decode fraction is against the measurements around it)\n' \
  "${#bws[@]}" "$(median "${bws[@]}")" "$lo" "$hi"
echo "limits ($threads threads): read ${bw} GB/s first, int8 dot peak ${peak} GMAC/s ($(json_field int8_gmac_s_per_thread "$limits") per thread, $(sed -E 's/.*"dot_instruction":"([^"]*)".*/\1/' <<<"$limits")); weights $(json_field layer_weight_bytes "$cline") + $(json_field output_weight_bytes "$cline") bytes, $(json_field int_macs_per_token "$cline") integer MACs per token"
echo
echo "| prompt tokens | batch | Candor prefill tok/s | llama.cpp prefill tok/s | ratio | % of int8 peak (Candor / llama.cpp) | Candor decode tok/s | llama.cpp decode tok/s | ratio | % of read bandwidth (Candor / llama.cpp) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
