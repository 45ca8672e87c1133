#!/usr/bin/env python3
"""A quote-heavy `candor serve` request with and without drafts, timed end to end (issue #45).

  spec_serve.py CANDOR_BIN [--rounds 3] [--threads 2] [--max-tokens 1400] [--model default]

Starts one server with `--draft lookup` and sends the same kind of request alternately without
drafts (`"speculative.n_max": 0`) and with them (the server's own draft length): "repeat all of
the text above" after a ~1,250-token passage, greedy, up to --max-tokens new tokens, so the
reply quotes the whole passage. Each request's passage opens with its own number, so the prefix
cache cannot give a later request the earlier one's prompt (every request pays its prefill, as
a client's new document would). Prints each request's wall time and completion tokens, the
medians and their ratio, and the server's draft counters from `/health`; exits 1 if a drafted
reply differs from the plain reply to the same prompt. Run it on a quiet machine.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

SENTENCES = [
    "The committee met on Tuesday to review the budget for the coming year.",
    "It approved the library's new roof and postponed the park renovation until spring.",
    "The treasurer was asked to report on the water utility's rising costs by March.",
    "Two members objected to the delay, citing safety concerns at the playground.",
    "Residents who spoke at the meeting asked for longer opening hours at the pool.",
    "The mayor promised a public hearing on the bus routes before the summer.",
]


def passage(n):
    body = " ".join(SENTENCES[i % len(SENTENCES)] + f" (item {i})" for i in range(60))
    return (f"Minutes, part {n}. {body}\n\nRepeat all of the text above, word for word, from "
            "the first sentence to the last.")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.load(r)
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=1400)
    ap.add_argument("--model", default="default")
    a = ap.parse_args()
    server = subprocess.Popen(
        [a.bin, "serve", "--model", a.model, "--port", "0", "--threads", str(a.threads),
         "--draft", "lookup"], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if "listening on" not in line:
            sys.exit(f"spec_serve.py: the server did not start: {line!r}")
        base = line.split("listening on", 1)[1].strip()
        times = {"plain": [], "lookup": []}
        failed = False
        for n in range(a.rounds):
            replies = {}
            # Alternate which goes first, so drift hits both.
            order = ["plain", "lookup"] if n % 2 == 0 else ["lookup", "plain"]
            for kind in order:
                body = {"model": a.model, "temperature": 0, "max_tokens": a.max_tokens,
                        "messages": [{"role": "user", "content": passage(n)}]}
                if kind == "plain":
                    body["speculative.n_max"] = 0
                secs, out = post(base + "/v1/chat/completions", body)
                replies[kind] = out["choices"][0]["message"]["content"]
                tokens = out["usage"]["completion_tokens"]
                times[kind].append(secs)
                print(f"request {n} {kind}: {secs:.2f} s, {tokens} completion tokens, "
                      f"prompt {out['usage']['prompt_tokens']} tokens", flush=True)
            if replies["plain"] != replies["lookup"]:
                print(f"request {n}: the drafted reply differs from the plain one", flush=True)
                failed = True
        p, d = statistics.median(times["plain"]), statistics.median(times["lookup"])
        print(f"median of {a.rounds}: plain {p:.2f} s, lookup {d:.2f} s, speed-up {p / d:.2f}x")
        with urllib.request.urlopen(base + "/health", timeout=60) as r:
            print("health:", json.dumps(json.load(r)))
        sys.exit(1 if failed else 0)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
