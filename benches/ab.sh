#!/usr/bin/env bash
# Times the CPU forward pass of two commits alternately on a real-shape random model (issue #42):
#
#   benches/ab.sh OLD NEW
#
# builds each commit's release binary (a git worktree per commit under $AB_DIR, one shared
# target dir so dependencies compile once; each binary is kept as $AB_DIR/bin/candor-<sha>),
# writes a Qwen2.5-1.5B-shape Q4_K_M file with $AB_LAYERS layers (benches/write_shape_models.py
# --random-blocks; real per-layer shapes, fewer layers), then runs `candor bench` $AB_ROUNDS
# times per build, alternating OLD NEW, NEW OLD, ... so drift in the machine hits both. Each run
# waits until the 1-minute load average is below $AB_MAX_LOAD (others compiling would make the
# figures meaningless) and gives up after $AB_WAIT seconds of waiting. Prints every run's line
# with the load before it and the process's CPU seconds, then the median per build of each
# figure and of the CPU seconds, and the ratio NEW/OLD.
#
# Settings (environment): AB_DIR (default target/ab), AB_MODEL (a GGUF instead of the random
# file), AB_LAYERS (8), AB_ROUNDS (3), AB_THREADS (2), AB_PROMPT (128), AB_NEW (32),
# AB_BATCH (1,16), AB_DTYPE (native; f32 dequantizes every weight: the float kernels),
# AB_MAX_LOAD (1.0), AB_WAIT (1800).
set -euo pipefail

if [ $# -ne 2 ]; then
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
root=$(git rev-parse --show-toplevel)
cd "$root"
old=$(git rev-parse --verify "$1^{commit}")
new=$(git rev-parse --verify "$2^{commit}")
dir=${AB_DIR:-$root/target/ab}
layers=${AB_LAYERS:-8}
rounds=${AB_ROUNDS:-3}
threads=${AB_THREADS:-2}
max_load=${AB_MAX_LOAD:-1.0}
wait_s=${AB_WAIT:-1800}
mkdir -p "$dir/bin" "$dir/models"

build() { # sha -> $dir/bin/candor-<sha>
    local sha=$1 wt="$dir/wt-${1:0:12}" bin="$dir/bin/candor-$1"
    if [ -x "$bin" ]; then return; fi
    [ -d "$wt" ] || git worktree add --detach "$wt" "$sha" >&2
    (cd "$wt" && CARGO_TARGET_DIR="$dir/target" nice cargo build --release --locked --bin candor >&2)
    cp "$dir/target/release/candor" "$bin"
}
build "$old"
build "$new"

model=${AB_MODEL:-$dir/models/qwen2.5-1.5b-${layers}l.Q4_K_M.gguf}
if [ ! -f "$model" ]; then
    python3 "$root/benches/write_shape_models.py" "$dir/models" --shape qwen2.5-1.5b \
        --layers "$layers" --random-blocks >&2
fi

load() { cut -d' ' -f1 /proc/loadavg; }
wait_quiet() {
    local waited=0
    while awk -v l="$(load)" -v m="$max_load" 'BEGIN { exit !(l >= m) }'; do
        if [ "$waited" -ge "$wait_s" ]; then
            echo "ab.sh: the load stayed at or above $max_load for ${wait_s}s (now $(load)):" \
                "not measured" >&2
            exit 3
        fi
        sleep 10
        waited=$((waited + 10))
    done
}

out="$dir/runs-${old:0:12}-${new:0:12}.jsonl"
: >"$out"
echo "model $model (${AB_DTYPE:-native}), $threads threads, P ${AB_PROMPT:-128}, N ${AB_NEW:-32}, batches ${AB_BATCH:-1,16}, $rounds rounds"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for which in $order; do
        if [ "$which" = old ]; then sha=$old; else sha=$new; fi
        wait_quiet
        before=$(load)
        # The process's CPU seconds (user + system) beside its wall-clock figures: less moved
        # by other processes than the rates, though not immune to them (shared caches).
        /usr/bin/time -f '%U %S' -o "$dir/cpu" "$dir/bin/candor-$sha" bench --model "$model" \
            --threads "$threads" --prompt-tokens "${AB_PROMPT:-128}" \
            --new-tokens "${AB_NEW:-32}" --batch-size "${AB_BATCH:-1,16}" --dtype "${AB_DTYPE:-native}" 2>/dev/null |
            grep '^{' >"$dir/lines"
        cpu=$(awk '{ print $1 + $2 }' "$dir/cpu")
        while read -r line; do
            echo "{\"build\":\"$which\",\"round\":$r,\"load\":$before,\"cpu_s\":$cpu,\"run\":$line}"
        done <"$dir/lines" | tee -a "$out"
    done
done

python3 - "$out" "$old" "$new" <<'EOF'
import json, statistics, sys
path, old, new = sys.argv[1:]
runs = [json.loads(l) for l in open(path)]
loads = [r["load"] for r in runs]
print(f"load before the runs: min {min(loads):.2f}, max {max(loads):.2f}")
print(f"{'batch':>5} {'figure':<14} {'old ' + old[:9]:>14} {'new ' + new[:9]:>14} {'new/old':>8}")
for b in sorted({r["run"]["batch_size"] for r in runs}):
    for fig in ("prefill_tok_s", "decode_tok_s"):
        med = {w: statistics.median(r["run"][fig] for r in runs
                                    if r["build"] == w and r["run"]["batch_size"] == b)
               for w in ("old", "new")}
        print(f"{b:>5} {fig:<14} {med['old']:>14.2f} {med['new']:>14.2f} "
              f"{med['new'] / med['old']:>8.3f}")
# One CPU figure per process (every batch size of a run together).
cpu = {w: statistics.median([c for _, c in {(r["round"], r["cpu_s"]) for r in runs
                                             if r["build"] == w}])
       for w in ("old", "new")}
print(f"{'all':>5} {'cpu_s (run)':<14} {cpu['old']:>14.2f} {cpu['new']:>14.2f} "
      f"{cpu['new'] / cpu['old']:>8.3f}")
EOF
