#!/usr/bin/env bash
# Builds, on this machine (no GPU or CUDA installation needed), what the GPU check runs, into
# target/gpu/ (together under the device tool's 64 MiB carry limit; the script says if not):
#   target/gpu/bin.tar.xz   candor (release, --features cuda), the lib's unit tests (`unit`),
#                           tests/it (`it`) and the kernel timings (`kernels`, the bench
#                           benches/kernels.rs), stripped;
#   target/gpu/vocab.gguf.xz the default model's tokenizer keys (needs `candor setup` first);
#   target/gpu/data.tar.xz  RefuteBench's QA data, for the end-to-end stage;
#   target/gpu/llama.tar.xz llama.cpp's source as vendored in llama-cpp-python 0.3.36, trimmed:
#                           from LLAMA_SRC (an unpacked llama-cpp-python source tree) or
#                           LLAMA_SDIST (its .tar.gz, e.g. from `pip download --no-deps
#                           --no-binary :all: llama-cpp-python==0.3.36`, which needs cmake).
# Then on the GPU machine, in one call: benches/gpu/run.sh (see its header).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu
rm -rf "$out" target/gpu-stage
mkdir -p "$out" target/gpu-stage
cargo build --release --features cuda
cp target/release/candor target/gpu-stage/candor
# The test binaries (dev profile, dependencies optimised) and the kernel bench (release): their
# paths from cargo's messages.
pick='
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = m["target"]["kind"][0]
    name = {"lib": "unit", "test": m["target"]["name"], "bench": m["target"]["name"]}.get(kind)
    if name and (m.get("profile", {}).get("test") or kind == "bench"):
        shutil.copy(m["executable"], "target/gpu-stage/" + name)
'
cargo test --features cuda --no-run --message-format=json 2>/dev/null | python3 -c "$pick"
cargo bench --features cuda --bench kernels --no-run --message-format=json 2>/dev/null \
  | python3 -c "$pick"
strip target/gpu-stage/*
# The test binaries read their fixtures under the path they were built in (run.sh links it).
pwd > target/gpu-stage/build-root
tar -C target/gpu-stage -cJf "$out/bin.tar.xz" .
# For the end-to-end stage: the default model's tokenizer and chat template (retokenize.py gives
# them to the random 8B file) and RefuteBench's QA data (the GPU machine has no network).
python3 benches/gpu/retokenize.py extract models/SmolLM2-135M-Instruct.Q4_1.gguf target/gpu-stage/vocab.gguf
xz -c target/gpu-stage/vocab.gguf > "$out/vocab.gguf.xz"
data=${CANDOR_DATA:-../shared/data}
[[ -d $data/refutebench/qa ]] || { echo "no RefuteBench data at $data (CANDOR_DATA)" >&2; exit 1; }
tar -C "$data" -cJf "$out/data.tar.xz" refutebench/qa
src=${LLAMA_SRC:-}
if [[ -z $src && -n ${LLAMA_SDIST:-} ]]; then
  mkdir -p target/llama-sdist && tar -C target/llama-sdist -xzf "$LLAMA_SDIST"
  src=$(ls -d target/llama-sdist/llama_cpp_python-*/ | head -1)
fi
for d in /work/tools/llama_cpp_python-0.3.36 /work/tools/src/llama_cpp_python-0.3.36; do
  [[ -z $src && -d $d ]] && src=$d
done
src=${src%/}/vendor/llama.cpp
# Excludes anchored at the top: tools/mtmd/models holds sources.
if [[ -d "$src" ]]; then
  tar -C "$src" -cJf "$out/llama.tar.xz" --exclude=./models --exclude=./docs --exclude=./tests \
    --exclude=./examples --exclude=./benches --exclude=./media --exclude=./tools/ui \
    --exclude='*.gguf' --exclude=.git .
else
  echo "no llama.cpp source at $src (LLAMA_SRC / LLAMA_SDIST): llama.tar.xz not written" >&2
fi
ls -la "$out" target/gpu-stage
total=$(du -cb "$out"/* | tail -1 | cut -f1)
echo "target/gpu: $((total >> 20)) MiB (the device tool carries at most 64 MiB with the tree)"
(( total < 60 << 20 )) || { echo "target/gpu is too large to carry" >&2; exit 1; }
