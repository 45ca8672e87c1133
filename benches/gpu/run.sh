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
# Output lines go to stdout and to $OUT/<stage>.log.
set -euo pipefail
root=$(pwd)
g=$root/target/gpu
m=/tmp/candor-models
stage=${1:?stage: check | tests | bench-default | models | bench-8b | hf | llama-build | llama}
log=${OUT:-/tmp}/$stage.log
exec > >(tee -a "$log") 2>&1
# NVRTC and the CUDA runtime pieces from PyTorch's pip packages; the driver from the system.
nv=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$(ls -d "$nv"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
# The test binaries read their fixtures under the path they were built in.
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$root" /work/main; }
[[ -x $g/candor ]] || tar -C "$g" -xJf "$g/bin.tar.xz"
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
    for b in 1 16 64 256; do bench --model "$model" --prompt-tokens 128 --new-tokens 64 --batch-size $b; done
    bench --model "$model" --prompt-tokens 1024 --new-tokens 64 --batch-size 1 ;;
  models)
    python3 benches/gpu/write_models.py $m ;;
  bench-8b)
    for f in $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf $m/llama3-8b-bf16; do
      for b in 1 16 64 256; do bench --model "$f" --prompt-tokens 512 --new-tokens 64 --batch-size $b; done
    done ;;
  hf)
    python3 benches/gpu/hf_bench.py $m/llama3-8b-bf16 --prompt-tokens 512 --new-tokens 64 --batch-size 1 16 64 256 ;;
  llama-build)
    mkdir -p /tmp/llama && tar -C /tmp/llama -xJf "$g/llama.tar.xz"
    cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    cmake --build /tmp/llama/build --target llama-batched-bench -j 16 ;;
  llama)
    for f in $model $m/llama3-8b.Q4_K_M.gguf $m/llama3-8b.Q8_0.gguf; do
      /tmp/llama/build/bin/llama-batched-bench -m "$f" -ngl 999 -c 200000 -b 2048 -ub 512 \
        -npp 512 -ntg 64 -npl 1,16,64,256 --output-format jsonl 2>/dev/null | grep speed_tg
    done ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
