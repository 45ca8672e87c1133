#!/usr/bin/env bash
# The GPU check of issue #8, run on the lent GPU machine after benches/gpu/build.sh here. One
# stage per call of the device tool (each under its 10-minute limit; files stay while the
# machine is warm):
#   run(carry=["target/gpu"],               command="benches/gpu/run.sh check")
#   run(carry=["target/gpu-model/part.aa"], command="true")
#   run(carry=["target/gpu-model/part.ab"], command="benches/gpu/run.sh tests")
#   run(command="benches/gpu/run.sh bench-default")
#   run(command="benches/gpu/run.sh models")      # random Llama-3-8B-shaped weights
#   run(command="benches/gpu/run.sh bench-8b")
#   run(command="benches/gpu/run.sh hf")          # transformers, same bf16 weights
#   run(command="benches/gpu/run.sh llama-build"); run(command="benches/gpu/run.sh llama")
# Or, once bin.tar.xz and the model parts are carried (the first three calls above with
# `true` as the command), everything in one call within the device tool's 10 minutes:
#   run(command="benches/gpu/run.sh all", timeout_s=600)
# which runs check, tests, bench-default, then the Llama-3-8B-shape comparison at batch
# 1/16/64 (Q4_K_M for candor, its bf16 checkpoint for transformers), each stage under its own
# timeout, going on after a failing stage and listing every stage's exit status; llama.cpp's
# CUDA build does not fit beside them: BATCHES="1 16 64" for the llama-build and llama calls.
# Output lines go to stdout and to $OUT/<stage>.log.
set -euo pipefail
root=$(pwd)
g=$root/target/gpu
m=/tmp/candor-models
stage=${1:?stage: all | check | tests | bench-default | models | bench-8b | hf | llama-build | llama}
if [[ $stage == all ]]; then
  # Each stage in its own process (its own log); seconds each may take, within 570 in all.
  start=$SECONDS status=()
  for s in check:45 tests:240 bench-default:45 models:90 bench-8b:60 hf:90; do
    name=${s%%:*} limit=${s##*:} left=$((570 - (SECONDS - start)))
    (( limit > left )) && limit=$left
    if (( limit < 20 )); then status+=("$name: not run (out of time)"); continue; fi
    rc=0
    BATCHES="1 16 64" WHAT=q4_k_m timeout "$limit" "$0" "$name" || rc=$?
    status+=("$name: exit $rc$( ((rc == 124)) && echo ' (timed out)')")
  done
  printf '%s\n' "${status[@]}" | tee "${OUT:-/tmp}/all.log"
  exit 0
fi
log=${OUT:-/tmp}/$stage.log
exec > >(tee -a "$log") 2>&1
# NVRTC and the CUDA runtime pieces from PyTorch's pip packages; the driver from the system.
nv=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$(ls -d "$nv"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
[[ -x $g/candor ]] || tar -C "$g" -xJf "$g/bin.tar.xz"
# The test binaries read their fixtures under the path they were built in (build.sh records it).
built=$(cat "$g/build-root" 2>/dev/null || echo /work/main)
[[ -e $built ]] || { mkdir -p "$(dirname "$built")" && ln -s "$root" "$built"; }
model=$g/model.gguf
if [[ ! -f $model && -f $root/target/gpu-model/part.ab ]]; then
  cat "$root"/target/gpu-model/part.* > "$model"
fi
export CANDOR_TEST_MODEL=$model
# The GPU tests fail instead of skipping when the GPU cannot be used.
export CANDOR_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bench() { "$g/candor" bench --device cuda "$@" | head -1; }
case $stage in
  check)
    "$g/candor" devices --check-kernels
    "$g/unit" cuda:: --nocapture ;;
  tests)
    "$g/unit" cuda:: --nocapture
    "$g/it" gpu:: --nocapture --test-threads 1 ;;
  bench-default)
    for b in ${BATCHES:-1 16 64 256}; do bench --model "$model" --prompt-tokens 128 --new-tokens 64 --batch-size $b; done
    bench --model "$model" --prompt-tokens 1024 --new-tokens 64 --batch-size 1 ;;
  models)
    python3 benches/gpu/write_models.py $m --what "${WHAT:-q4_k_m,q8_0,bf16}" ;;
  bench-8b)
    for f in $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf $m/llama3-8b-bf16; do
      [[ -e $f ]] || continue
      for b in ${BATCHES:-1 16 64 256}; do bench --model "$f" --prompt-tokens 512 --new-tokens 64 --batch-size $b; done
    done ;;
  hf)
    # transformers needs the bf16 checkpoint (written by `models` unless WHAT leaves it out).
    [[ -d $m/llama3-8b-bf16 ]] || python3 benches/gpu/write_models.py $m --what bf16
    python3 benches/gpu/hf_bench.py $m/llama3-8b-bf16 --prompt-tokens 512 --new-tokens 64 --batch-size ${BATCHES:-1 16 64 256} ;;
  llama-build)
    mkdir -p /tmp/llama && tar -C /tmp/llama -xJf "$g/llama.tar.xz"
    cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build /tmp/llama/build --target llama-batched-bench -j 16 ;;
  llama)
    npl=$(echo ${BATCHES:-1 16 64 256} | tr ' ' ,)
    for f in $model $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf; do
      [[ -e $f ]] || continue
      /tmp/llama/build/bin/llama-batched-bench -m "$f" -ngl 999 -c 200000 -b 2048 -ub 512 \
        -npp 512 -ntg 64 -npl "$npl" --output-format jsonl 2>/dev/null | grep speed_tg
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
