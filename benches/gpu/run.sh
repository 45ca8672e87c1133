#!/usr/bin/env bash
# The GPU check of issues #8 and #30, run on the lent GPU machine after benches/gpu/build.sh
# here. The device tool carries at most 64 MiB a call and keeps a machine warm only 30 s
# between calls, so the default model travels in three pieces over three calls made back to back:
#   run(carry=["target/gpu", "target/gpu-model/part.aa"], command="benches/gpu/run.sh first")
#   run(carry=["target/gpu-model/part.ab"], command="true")
#   run(carry=["target/gpu-model/part.ac"], command="benches/gpu/run.sh rest", timeout_s=600)
# `first` starts, in their own process sessions so that they go on after the call returns,
# llama.cpp's CUDA build (llama-batched-bench) and the random-weight Llama-3-8B-shape models
# (Q4_K_M for Candor and llama.cpp, bf16 for transformers and Candor), then checks that the
# kernels compile and runs the kernel unit tests. `rest` runs the tests on the default model
# and the tiny models of every architecture, the default model's speed, then the 8B-shape
# comparison at batch 1/16/64 (Candor, transformers, llama.cpp CUDA), each stage under its own
# timeout, going on after a failing stage and listing every stage's exit status last.
# Single stages: check | tests | tiny | bench-default | models | bench-8b | bench-8b-quick | hf |
# llama-build | llama. `quick`: one call with target/gpu alone (see the stage).
# Output lines go to stdout and to $OUT/<stage>.log (the background stages' logs are copied
# into the `rest` call's $OUT).
set -euo pipefail
root=$(pwd)
g=$root/target/gpu
m=/tmp/candor-models
stage=${1:?stage: all | check | tests | bench-default | models | bench-8b | hf | llama-build | llama}
bg=/tmp/candor-bg
# Runs the stages given as name:seconds, each in its own process and under its own timeout,
# within $budget seconds in all; lists every stage's exit status last.
stages() {
  local start=$SECONDS status=() s name limit left rc
  for s in "$@"; do
    name=${s%%:*} limit=${s##*:} left=$((budget - (SECONDS - start)))
    (( limit > left )) && limit=$left
    if (( limit < 20 )); then status+=("$name: not run (out of time)"); continue; fi
    rc=0
    timeout "$limit" "$0" "$name" || rc=$?
    status+=("$name: exit $rc$( ((rc == 124)) && echo ' (timed out)' || true) in $((SECONDS - start))s")
  done
  printf '%s\n' "${status[@]}" | tee -a "${OUT:-/tmp}/all.log"
}
# Waits (at most $2 seconds) for a background stage to finish; its exit status.
wait_bg() {
  local t=0
  while [[ ! -f $bg/$1.rc ]] && (( t < $2 )); do sleep 2; t=$((t + 2)); done
  [[ -f $bg/$1.rc ]] || { echo "$1: still running after ${2}s"; return 1; }
  return "$(cat "$bg/$1.rc")"
}
export BATCHES=${BATCHES:-1 16 64}
case $stage in
  all)
    budget=570 WHAT=q4_k_m stages check:45 tests:240 bench-default:45 models:90 bench-8b:60 hf:90
    exit 0 ;;
  first)
    mkdir -p "$bg"
    # Unpacked once here, before the background stages could race each other to it.
    [[ -x $g/candor ]] || tar -C "$g" -xJf "$g/bin.tar.xz"
    for s in llama-build models; do
      OUT=$bg WHAT=q4_k_m,bf16 setsid nohup bash -c "'$0' $s; echo \$? > $bg/$s.rc" \
        > /dev/null 2>&1 < /dev/null &
    done
    budget=240 stages check:120
    exit 0 ;;
  quick)
    # One call, no default model (bin.tar.xz alone): the kernels, the tiny models of every
    # architecture (GPU against CPU and llama.cpp, batch invariance) and the 8B-shape speed.
    mkdir -p "$bg"
    [[ -x $g/candor ]] || tar -C "$g" -xJf "$g/bin.tar.xz"
    OUT=$bg WHAT=q4_k_m setsid nohup bash -c "'$0' models; echo \$? > $bg/models.rc" \
      > /dev/null 2>&1 < /dev/null &
    budget=${BUDGET:-190} stages check:30 tiny:80 bench-8b-quick:120
    cp "$bg"/models.log "${OUT:-/tmp}/" 2>/dev/null || true
    exit 0 ;;
  rest)
    budget=570 stages tests:220 bench-default:40 bench-8b:120 hf:100 llama:90
    cp "$bg"/*.log "${OUT:-/tmp}/" 2>/dev/null || true
    exit 0 ;;
esac
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
parts=("$root"/target/gpu-model/part.a{a,b,c})
if [[ ! -f $model && -f ${parts[2]} ]]; then
  cat "${parts[@]}" > "$model.$$"
  if [[ $(sha256sum < "$model.$$" | cut -d' ' -f1) == "$(cat "$g/model.sha256")" ]]; then
    mv "$model.$$" "$model"
  else
    rm -f "$model.$$"
    echo "the default model's pieces do not add up to its sha256" >&2
  fi
fi
export CANDOR_TEST_MODEL=$model
# The GPU tests fail instead of skipping when the GPU cannot be used.
export CANDOR_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
bench() { "$g/candor" bench --device cuda "$@" | grep "^{"; }
case $stage in
  check)
    "$g/candor" devices --check-kernels
    "$g/unit" cuda:: --nocapture ;;
  tests)
    "$g/it" gpu:: --nocapture --test-threads 1 ;;
  tiny)
    "$g/it" gpu::gpu_tiny_models --nocapture --test-threads 1 ;;
  bench-8b-quick)
    [[ -d $bg ]] && { wait_bg models 90 || echo "models: exit $?"; }
    f=$m/llama3-8b.Q4_K_M.gguf
    bench --model "$f" --prompt-tokens 512 --new-tokens 16 --batch-size 1,16
    bench --model "$f" --prompt-tokens 128 --new-tokens 16 --batch-size 64 ;;
  bench-default)
    bench --model "$model" --prompt-tokens 128 --new-tokens 64 --batch-size "$(echo $BATCHES | tr ' ' ,)"
    bench --model "$model" --prompt-tokens 1024 --new-tokens 64 --batch-size 1 ;;
  models)
    python3 benches/gpu/write_models.py $m --what "${WHAT:-q4_k_m,q8_0,bf16}" ;;
  bench-8b)
    [[ -d $bg ]] && { wait_bg models 150 || echo "models: exit $?"; }
    for f in $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf $m/llama3-8b-bf16; do
      [[ -e $f ]] || continue
      bench --model "$f" --prompt-tokens 512 --new-tokens 64 --batch-size "$(echo $BATCHES | tr ' ' ,)"
    done ;;
  hf)
    # transformers needs the bf16 checkpoint (written by `models` unless WHAT leaves it out).
    [[ -d $bg ]] && { wait_bg models 150 || echo "models: exit $?"; }
    [[ -d $m/llama3-8b-bf16 ]] || python3 benches/gpu/write_models.py $m --what bf16
    python3 benches/gpu/hf_bench.py $m/llama3-8b-bf16 --prompt-tokens 512 --new-tokens 64 --batch-size $BATCHES ;;
  llama-build)
    mkdir -p /tmp/llama && tar -C /tmp/llama -xJf "$g/llama.tar.xz"
    # FlashAttention kernels left out (GGML_CUDA_FA=OFF): they are most of the build's time,
    # which has to fit beside the other stages; llama.cpp then attends with its matmul path.
    cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
      -DGGML_CUDA_FA=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF
    nice -n 10 cmake --build /tmp/llama/build --target llama-batched-bench -j "${JOBS:-12}" ;;
  llama)
    [[ -d $bg ]] && { wait_bg llama-build 240 || { echo "llama-build: exit $?"; tail -20 "$bg/llama-build.log"; exit 1; }; }
    npl=$(echo $BATCHES | tr ' ' ,)
    for f in $model $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf; do
      [[ -e $f ]] || continue
      /tmp/llama/build/bin/llama-batched-bench -m "$f" -ngl 999 -c 40960 -b 2048 -ub 512 \
        -npp 512 -ntg 64 -npl "$npl" --output-format jsonl 2>/dev/null | grep speed_tg
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
