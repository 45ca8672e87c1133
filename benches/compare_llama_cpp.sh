#!/usr/bin/env bash
# Side-by-side batch-1 prefill/decode speed of Candor (benches/throughput.rs) and llama.cpp
# (llama-batched-bench) on one GGUF file, 2 threads, 128-token prompt, 64 decoded tokens:
# the two alternate REPEATS times, then the medians are printed. Not run by CI.
#
# Usage: benches/compare_llama_cpp.sh MODEL.gguf [REPEATS] [LLAMA_BIN_DIR]
# THROUGHPUT_BIN may name an already built throughput bench binary (else `cargo bench` builds it).
set -euo pipefail
model=${1:?usage: $0 MODEL.gguf [REPEATS] [LLAMA_BIN_DIR]}
repeats=${2:-5}
bin=${3:-/work/tools/llama-build/bin}
if [[ -z "${THROUGHPUT_BIN:-}" ]]; then
  cargo bench --bench throughput --no-run
  THROUGHPUT_BIN=$(ls -t target/release/deps/throughput-* | grep -v '\.d$' | head -1)
fi
cand_pp=(); cand_tg=(); llama_pp=(); llama_tg=()
for i in $(seq "$repeats"); do
  out=$("$THROUGHPUT_BIN" --model "$model" | grep '^batch  1:')
  cand_pp+=("$(sed -E 's/.*prefill +([0-9.]+).*/\1/' <<<"$out")")
  cand_tg+=("$(sed -E 's/.*decode +([0-9.]+).*/\1/' <<<"$out")")
  # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
  row=$("$bin/llama-batched-bench" -m "$model" -c 1024 -b 512 -ub 512 -npp 128 -ntg 64 -npl 1 \
        -t 2 -tb 2 2>/dev/null | grep -E '^\|\s+128 \|')
  llama_pp+=("$(awk -F'|' '{gsub(/ /,"",$7); print $7}' <<<"$row")")
  llama_tg+=("$(awk -F'|' '{gsub(/ /,"",$9); print $9}' <<<"$row")")
  echo "run $i: candor prefill ${cand_pp[-1]} decode ${cand_tg[-1]} | llama.cpp prefill ${llama_pp[-1]} decode ${llama_tg[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "median of $repeats, $(basename "$model"), 2 threads, prompt 128, decode 64, batch 1:"
echo "candor    prefill $(median "${cand_pp[@]}") tok/s   decode $(median "${cand_tg[@]}") tok/s"
echo "llama.cpp prefill $(median "${llama_pp[@]}") tok/s   decode $(median "${llama_tg[@]}") tok/s"
