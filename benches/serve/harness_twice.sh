#!/usr/bin/env bash
# inspect-ai's `openai-api` provider against `candor serve`, run twice: the completions of
# the two runs must be identical (exit 1 otherwise). Needs `inspect` (pip install inspect-ai)
# on PATH and a server: harness_twice.sh BASE_URL [API_KEY] [SAMPLING...]
# e.g. harness_twice.sh http://127.0.0.1:8000 none --temperature 0.7 --seed 7
set -euo pipefail
base="${1:?BASE_URL}"; key="${2:-none}"; shift 2 || shift $#
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
export CANDOR_BASE_URL="$base/v1" CANDOR_API_KEY="$key"
for run in 1 2; do
    (cd "$here" && inspect eval inspect_task.py --model openai-api/candor/default \
        --max-tokens 32 --max-connections 8 "$@" --log-dir "$out/run$run" \
        --log-format json --display plain) | tail -n 6
    f="$(ls "$out/run$run"/*.json)"
    python3 - "$f" > "$out/run$run.txt" <<'PY'
import json, sys
log = json.load(open(sys.argv[1]))
for s in sorted(log["samples"], key=lambda s: s["id"]):
    print(json.dumps({"id": s["id"], "completion": s["output"]["completion"]}))
PY
done
echo "--- completions (run 1) ---"; cat "$out/run1.txt"
if cmp -s "$out/run1.txt" "$out/run2.txt"; then
    echo "IDENTICAL: $(wc -l < "$out/run1.txt") completions, two runs"
else
    echo "DIFFERENT:"; diff "$out/run1.txt" "$out/run2.txt" || true; exit 1
fi
