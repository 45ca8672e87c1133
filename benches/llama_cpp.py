"""Measures llama.cpp (through llama-cpp-python) prefill and batch-1 decode throughput on the
default model with 2 threads, for the README's comparison table with `cargo bench --bench throughput`."""
import sys, time
from llama_cpp import Llama

path = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
llm = Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=2048, n_batch=512, verbose=False)
prompt = [int(x) for x in (list(range(1000, 1512)))]

def prefill(n):
    llm.reset(); t = time.perf_counter(); llm.eval(prompt[:n]); return n / (time.perf_counter() - t)

def decode(n):
    llm.reset(); llm.eval(prompt[:32]); t = time.perf_counter()
    tok = 1000
    for _ in range(n):
        llm.eval([tok]); tok = 1000 + (tok * 7) % 500
    return n / (time.perf_counter() - t)

prefill(128); decode(16)  # warm up
p = sorted(prefill(512) for _ in range(3))[1]
d = sorted(decode(128) for _ in range(3))[1]
print(f"llama.cpp prefill 512 tokens: {p:.1f} tok/s; decode batch 1: {d:.1f} tok/s (median of 3, 2 threads)")
