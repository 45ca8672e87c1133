#!/usr/bin/env bash
# Speculative decoding against plain decoding, in one sitting (issue #45):
#
#   benches/spec.sh
#
# Builds the release binary, waits until the 1-minute load average is below $SPEC_MAX_LOAD
# (giving up after $SPEC_WAIT seconds), prints the load before each measurement, then times
# with the default model, each case plain and with drafts (the outputs must be identical, or
# the script fails):
#   1. a quote-heavy request at batch 1 (`candor generate`: repeat a ~1,000-token passage), then
#      the same kind of request through `candor serve` end to end (benches/spec_serve.py: one
#      server with --draft lookup, requests alternately with `"speculative.n_max": 0`);
#   2. FB-Bench checklist judgements and Fennec judge steps at batch 1 (`candor run` with
#      --judge-draft lookup; needs the data, $CANDOR_DATA), then the judge steps alone:
#      replayed one by one through `candor generate`, decode time only;
#   3. the same runs at batch 16 and 64, with as many items as the batch holds (at least
#      SPEC_LIMIT) so the batch is full (drafting turns itself off there: no slower expected);
#   4. with SPEC_TARGET and SPEC_DRAFT set (e.g. real-shape random GGUFs written by
#      benches/write_shape_models.py), the quote request on the target with the draft model,
#      printing the draft time and acceptance that `candor generate` reports (the cost model).
# Settings: SPEC_MAX_LOAD (1.0), SPEC_WAIT (1800), SPEC_THREADS (2), SPEC_LIMIT (2 items),
# SPEC_BATCHES (the protocol runs' batch sizes, "1 16 64"), SPEC_PROTOCOLS ("fbbench fennec"),
# SPEC_REPEATS (1: each protocol run plain then drafted this many times, alternating; the
# medians and every pair are printed), SPEC_QUOTE (1; 0 skips case 1).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
max_load=${SPEC_MAX_LOAD:-1.0}
wait_s=${SPEC_WAIT:-1800}
threads=${SPEC_THREADS:-2}
limit=${SPEC_LIMIT:-2}
cargo build --release >&2
bin=$root/target/release/candor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

quiet() {
    local waited=0
    while awk -v m="$max_load" '{exit !($1 >= m)}' /proc/loadavg; do
        if [ "$waited" -ge "$wait_s" ]; then
            echo "load stayed at or above $max_load for ${wait_s}s: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
            exit 1
        fi
        sleep 10
        waited=$((waited + 10))
    done
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
}

secs() { # command... -> prints wall seconds, output of the command to $tmp/last.err
    local t0 t1
    t0=$(date +%s.%N)
    "$@" 2>"$tmp/last.err" >/dev/null
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}

# 1. Quote a ~1,000-token passage.
python3 - "$tmp/quote.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "benches")
from spec_serve import SENTENCES as sentences  # the same passage as the serve case
passage = " ".join(sentences[i % len(sentences)] + f" (item {i})" for i in range(60))
# (Asked to "quote the following passage", the default model stops after two sentences; asked
# to repeat the text above, it copies for all of its 512 tokens.)
msg = passage + "\n\nRepeat all of the text above, word for word, from the first sentence to the last."
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"id": "quote", "messages": [{"role": "user", "content": msg}]}) + "\n")
PY
gen() { # out extra...
    local out=$1; shift
    "$bin" generate --prompts "$tmp/quote.jsonl" --max-new-tokens 512 --batch-size 1 \
        --threads "$threads" --out "$out" "$@"
}
if [ "${SPEC_QUOTE:-1}" = 1 ]; then
quiet
p=$(secs gen "$tmp/plain.jsonl")
quiet
d=$(secs gen "$tmp/lookup.jsonl" --draft lookup)
drafts=$(grep '^drafts:' "$tmp/last.err" || true)
cmp <(jq -c '.output_ids' "$tmp/plain.jsonl") <(jq -c '.output_ids' "$tmp/lookup.jsonl")
echo "quote, batch 1: plain ${p}s, lookup ${d}s, speed-up $(echo "$p / $d" | bc -l | cut -c1-5)x; $drafts"
pd=$(jq -r .decode_ms "$tmp/plain.jsonl"); dd=$(jq -r .decode_ms "$tmp/lookup.jsonl")
echo "quote, batch 1, decode alone: plain ${pd} ms, lookup ${dd} ms, speed-up $(echo "$pd / $dd" | bc -l | cut -c1-5)x"
# The same without the draft length's cost cap (CANDOR_DRAFT_COST=0), in the same sitting.
quiet
u=$(CANDOR_DRAFT_COST=0 secs gen "$tmp/uncapped.jsonl" --draft lookup)
drafts=$(grep '^drafts:' "$tmp/last.err" || true)
cmp <(jq -c '.output_ids' "$tmp/plain.jsonl") <(jq -c '.output_ids' "$tmp/uncapped.jsonl")
echo "quote, batch 1, no cost cap: lookup ${u}s, speed-up $(echo "$p / $u" | bc -l | cut -c1-5)x; $drafts"
quiet
python3 benches/spec_serve.py "$bin" --threads "$threads"
fi
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# The judge steps of a finished run alone, replayed one at a time (`candor generate` with each
# step's recorded messages and params), plain and with lookup drafts: decode time only (the
# prefill and the candidates' replies left out). Every replayed reply must equal the run's.
judge_steps() { # proto run-dir
    local proto=$1 dir=$2
    jq -c 'select(.actor == "judge") | {id: (.item + "|" + .key), messages, params}' \
        "$dir/samples.jsonl" >"$tmp/$proto-judge.jsonl"
    jq -r 'select(.actor == "judge") | .output.text' "$dir/samples.jsonl" >"$tmp/$proto-judge-run.txt"
    replay() { # out extra...
        local out=$1; shift
        "$bin" generate --prompts "$tmp/$proto-judge.jsonl" --batch-size 1 --threads "$threads" \
            --out "$out" "$@"
    }
    quiet
    secs replay "$tmp/$proto-judge-plain.jsonl" >/dev/null
    quiet
    secs replay "$tmp/$proto-judge-lookup.jsonl" --draft lookup >/dev/null
    local drafts
    drafts=$(grep '^drafts:' "$tmp/last.err" || true)
    cmp <(jq -r '.text' "$tmp/$proto-judge-plain.jsonl") "$tmp/$proto-judge-run.txt" \
        || { echo "$proto judge steps: the replay differs from the run" >&2; exit 1; }
    cmp <(jq -c '.output_ids' "$tmp/$proto-judge-plain.jsonl") \
        <(jq -c '.output_ids' "$tmp/$proto-judge-lookup.jsonl") \
        || { echo "$proto judge steps: drafted replies differ" >&2; exit 1; }
    local sum='[.[] | {ms: .decode_ms, n: ((.output_ids | length) - 1)}] | {ms: (map(.ms) | add), n: (map(.n) | add), steps: length}'
    local pl dl
    pl=$(jq -s -c "$sum" "$tmp/$proto-judge-plain.jsonl")
    dl=$(jq -s -c "$sum" "$tmp/$proto-judge-lookup.jsonl")
    echo "$proto judge steps alone, batch 1: $(jq -r '"\(.steps) steps, \(.n) decoded tokens"' <<<"$pl"); decode plain $(jq -r '.ms / 1000' <<<"$pl")s, lookup $(jq -r '.ms / 1000' <<<"$dl")s, speed-up $(echo "$(jq -r .ms <<<"$pl") / $(jq -r .ms <<<"$dl")" | bc -l | cut -c1-5)x; $drafts"
}

# 2-3. Judge steps in protocol runs.
if [ -n "${CANDOR_DATA:-}" ]; then
    for proto in ${SPEC_PROTOCOLS:-fbbench fennec}; do
        for b in ${SPEC_BATCHES:-1 16 64}; do
            items=$((b > limit ? b : limit))
            run() { # out extra...
                local out=$1; shift
                CANDOR_NO_CACHE=1 CANDOR_OFFLINE=1 "$bin" run "$proto" --model default \
                    --judge default --limit "$items" --max-new-tokens 32 \
                    --judge-max-new-tokens 512 --constrain on --batch-size "$b" \
                    --threads "$threads" --out "$out" "$@"
            }
            ps=(); ds=()
            for r in $(seq "${SPEC_REPEATS:-1}"); do
                rm -rf "$tmp/$proto-$b-plain" "$tmp/$proto-$b-lookup"
                quiet
                ps+=("$(secs run "$tmp/$proto-$b-plain")")
                quiet
                ds+=("$(secs run "$tmp/$proto-$b-lookup" --judge-draft lookup)")
                cmp "$tmp/$proto-$b-plain/samples.jsonl" "$tmp/$proto-$b-lookup/samples.jsonl" \
                    || { echo "$proto batch $b: samples differ" >&2; exit 1; }
                echo "$proto, batch $b, pair $r: plain ${ps[-1]}s, lookup ${ds[-1]}s, ratio $(echo "${ps[-1]} / ${ds[-1]}" | bc -l | cut -c1-5)"
            done
            p=$(median "${ps[@]}"); d=$(median "${ds[@]}")
            acc=$(jq -c '.[0] | {acceptance_rate, tokens_per_verify_step, verify_steps, drafted, accepted, steps_without_drafts_for_batch_size}' "$tmp/$proto-$b-lookup/drafts.json")
            echo "$proto, batch $b ($items items, median of ${#ps[@]}): plain ${p}s, lookup ${d}s, speed-up $(echo "$p / $d" | bc -l | cut -c1-5)x; $acc"
            if [ "$b" = 1 ]; then
                judge_steps "$proto" "$tmp/$proto-$b-plain"
                quiet
                u=$(CANDOR_DRAFT_COST=0 secs run "$tmp/$proto-$b-uncapped" --judge-draft lookup)
                cmp "$tmp/$proto-$b-plain/samples.jsonl" "$tmp/$proto-$b-uncapped/samples.jsonl" \
                    || { echo "$proto batch $b (no cost cap): samples differ" >&2; exit 1; }
                acc=$(jq -c '.[0] | {acceptance_rate, tokens_per_verify_step}' "$tmp/$proto-$b-uncapped/drafts.json")
                echo "$proto, batch $b, no cost cap: lookup ${u}s, speed-up $(echo "$p / $u" | bc -l | cut -c1-5)x; $acc"
            fi
        done
    done
else
    echo "CANDOR_DATA not set: protocol runs skipped"
fi

# 4. A draft model.
if [ -n "${SPEC_TARGET:-}" ] && [ -n "${SPEC_DRAFT:-}" ]; then
    quiet
    p=$(secs gen "$tmp/t-plain.jsonl" --model "$SPEC_TARGET")
    quiet
    d=$(secs gen "$tmp/t-draft.jsonl" --model "$SPEC_TARGET" --draft "$SPEC_DRAFT" --draft-fixed)
    drafts=$(grep '^drafts:' "$tmp/last.err" || true)
    cmp <(jq -c '.output_ids' "$tmp/t-plain.jsonl") <(jq -c '.output_ids' "$tmp/t-draft.jsonl")
    echo "draft model: target plain ${p}s, with draft ${d}s; $drafts"
fi
