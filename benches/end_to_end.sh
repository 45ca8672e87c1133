#!/usr/bin/env bash
# End-to-end wall time of two candor binaries on the same runs, back to back, and a check that
# their samples.jsonl are byte-identical. Not run by CI.
#
# Usage: benches/end_to_end.sh OLD_CANDOR NEW_CANDOR [WORKDIR]
#   e.g. benches/end_to_end.sh /work/main/target/release/candor target/release/candor
# Runs (default model, 2 threads, generation cache off so every step is computed):
#   candor run refutebench --limit 16 --judge default
#   candor run fennec --limit 8
# EXTRA (env) adds options to every run, e.g. EXTRA="--max-new-tokens 64" for a quick check;
# ONLY (env) keeps the runs of one protocol, e.g. ONLY=refutebench.
# Measure on a quiet machine: the load average is printed before each run.
# The samples can only be identical if both binaries compute the same arithmetic: issue #9's
# baseline is e8e3199 (before #9) with 4c60f99 applied (#7's activation rounding as ggml's x86
# quantize_row_q8_0/q8_1, which changes greedy tokens at near-ties):
#   git worktree add --detach /tmp/pre9 e8e3199 && git -C /tmp/pre9 cherry-pick --no-commit 4c60f99
set -euo pipefail
old=${1:?usage: $0 OLD_CANDOR NEW_CANDOR [WORKDIR]}
new=${2:?usage: $0 OLD_CANDOR NEW_CANDOR [WORKDIR]}
work=${3:-$(mktemp -d)}
read -r -a extra <<<"${EXTRA:-}"
runs=(
  "refutebench --limit 16 --judge default"
  "fennec --limit 8"
)
status=0
for r in "${runs[@]}"; do
  name=${r%% *}
  [[ -n "${ONLY:-}" && "$name" != "$ONLY" ]] && continue
  read -r -a args <<<"$r"
  times=()
  for which in old new; do
    bin=${!which}
    dir="$work/$name-$which"
    rm -rf "$dir"
    echo "== $which: $bin run $r ${extra[*]:-} ($(uptime | sed 's/.*load/load/'))"
    start=$(date +%s.%N)
    "$bin" run "${args[@]}" --threads 2 --no-cache --out "$dir" "${extra[@]}" >/dev/null
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
    echo "   ${times[-1]} s"
    if [[ -f "$dir/engine.json" ]]; then tr -d '\n ' <"$dir/engine.json"; echo; fi
  done
  if cmp -s "$work/$name-old/samples.jsonl" "$work/$name-new/samples.jsonl"; then
    same="identical samples.jsonl"
  else
    same="samples.jsonl DIFFER"
    status=1
  fi
  printf '%s: old %.1f s, new %.1f s, speed-up %.2fx, %s\n' "$name" "${times[0]}" "${times[1]}" \
    "$(echo "${times[0]} / ${times[1]}" | bc -l)" "$same"
done
echo "run directories in $work"
exit $status
