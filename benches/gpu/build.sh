#!/usr/bin/env bash
# Builds, on this machine (no GPU or CUDA installation needed), what the GPU check runs, into
# target/gpu/ (each piece under the device tool's 64 MiB carry limit):
#   target/gpu/bin.tar.xz   candor (release, --features cuda) and the test binaries (the lib's
#                           unit tests and tests/it), stripped;
#   target/gpu/llama.tar.xz llama.cpp's source as vendored in llama-cpp-python 0.3.36
#                           (LLAMA_SRC, default /work/tools/llama_cpp_python-0.3.36), trimmed;
#   target/gpu-model/part.* the default model in pieces (one carry each).
# Then on the GPU machine: benches/gpu/run.sh (see its header for the calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu
rm -rf "$out" target/gpu-model target/gpu-stage
mkdir -p "$out" target/gpu-model target/gpu-stage
cargo build --release --features cuda
cp target/release/candor target/gpu-stage/candor
# The test binaries (dev profile, dependencies optimised): their paths from cargo's messages.
cargo test --features cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        name = {"lib": "unit", "test": m["target"]["name"]}.get(m["target"]["kind"][0])
        if name:
            shutil.copy(m["executable"], "target/gpu-stage/" + name)
'
strip target/gpu-stage/*
# The test binaries read their fixtures under the path they were built in (run.sh links it).
pwd > target/gpu-stage/build-root
tar -C target/gpu-stage -cJf "$out/bin.tar.xz" .
src=${LLAMA_SRC:-/work/tools/llama_cpp_python-0.3.36}/vendor/llama.cpp
if [[ -d "$src" ]]; then
  tar -C "$src" -cJf "$out/llama.tar.xz" --exclude=models --exclude=docs --exclude=tests \
    --exclude=examples --exclude=benches --exclude='*.gguf' .
fi
split -b 60M models/SmolLM2-135M-Instruct.Q4_1.gguf target/gpu-model/part.
ls -la "$out" target/gpu-model
