#!/usr/bin/env bash
# Builds, on this machine (no GPU or CUDA installation needed), what the GPU check runs, into
# target/gpu/ (each piece under the device tool's 64 MiB carry limit):
#   target/gpu/bin.tar.xz   candor (release, --features cuda) and the test binaries (the lib's
#                           unit tests and tests/it), stripped;
#   target/gpu/llama.tar.xz llama.cpp's source as vendored in llama-cpp-python 0.3.36
#                           (LLAMA_SRC, default /work/tools/llama_cpp_python-0.3.36), trimmed;
#   target/gpu-model/part.* the default model in three pieces (one carry each).
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
src=${LLAMA_SRC:-}
for d in /work/tools/llama_cpp_python-0.3.36 /work/tools/src/llama_cpp_python-0.3.36; do
  [[ -z $src && -d $d ]] && src=$d
done
src=$src/vendor/llama.cpp
# Excludes anchored at the top: tools/mtmd/models holds sources.
if [[ -d "$src" ]]; then
  tar -C "$src" -cJf "$out/llama.tar.xz" --exclude=./models --exclude=./docs --exclude=./tests \
    --exclude=./examples --exclude=./benches --exclude=./media --exclude=./tools/ui \
    --exclude='*.gguf' --exclude=.git .
else
  echo "no llama.cpp source at $src (LLAMA_SRC): llama.tar.xz not written" >&2
fi
# The default model in three pieces sized for the three calls of run.sh's header (each call
# carries at most 64 MiB with the working tree): the first beside bin.tar.xz and llama.tar.xz.
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
first=$(( (56 << 20) - $(stat -c %s "$out/bin.tar.xz") - $(stat -c %s "$out/llama.tar.xz" 2>/dev/null || echo 0) ))
piece() { dd if="$model" of="target/gpu-model/part.$1" iflag=skip_bytes,count_bytes bs=1M \
  skip="$2" ${3:+count=$3} status=none; }
piece aa 0 "$first"
piece ab "$first" $((56 << 20))
piece ac $((first + (56 << 20)))
sha256sum < "$model" | cut -d' ' -f1 > "$out/model.sha256"
ls -la "$out" target/gpu-model
