#!/usr/bin/env python3
"""`candor serve` spoken to with the `openai` Python package (PyPI), a client no one here wrote.

Checks chat, streaming (the deltas join into the plain reply), `response_format` json_schema
(the reply parses and follows the schema) and `seed` (the same request twice, and once among
other requests in flight, gives the same text). Prints one line per check; exits 1 on a
failure. Usage: openai_client.py BASE_URL [API_KEY]   (BASE_URL like http://127.0.0.1:8000)
"""
import concurrent.futures
import json
import sys

import openai

base = sys.argv[1].rstrip("/") + "/v1"
client = openai.OpenAI(base_url=base, api_key=sys.argv[2] if len(sys.argv) > 2 else "none")
failures = 0


def check(name, ok, detail=""):
    global failures
    failures += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")


def chat(**kw):
    args = dict(model="default", max_tokens=40)
    args.update(kw)
    return client.chat.completions.create(**args)


print(f"openai {openai.__version__} against {base}")
models = [m.id for m in client.models.list()]
check("models.list", models == ["default"], str(models))

msgs = [{"role": "user", "content": "What is the capital of France?"}]
r = chat(messages=msgs, temperature=0)
plain = r.choices[0].message.content
check("chat", bool(plain) and r.usage.completion_tokens > 0, repr(plain))

stream = chat(messages=msgs, temperature=0, stream=True)
parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
check("streaming deltas join into the plain reply", "".join(parts) == plain,
      f"{len(parts)} chunks")

schema = {"type": "object",
          "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}
r = chat(messages=[{"role": "user", "content": "Describe Paris as JSON."}], temperature=0,
         max_tokens=80,
         response_format={"type": "json_schema",
                          "json_schema": {"name": "city", "schema": schema, "strict": True}})
text = r.choices[0].message.content
try:
    obj = json.loads(text)
    ok = isinstance(obj.get("city"), str) and isinstance(obj.get("population"), int) \
        and set(obj) == {"city", "population"}
except ValueError:
    ok = False
check("response_format json_schema", ok, text)

sampled = dict(messages=[{"role": "user", "content": "Write a short poem about the sea."}],
               temperature=0.9, top_p=0.95, seed=1234, max_tokens=48)
first = chat(**sampled).choices[0].message.content
second = chat(**sampled).choices[0].message.content
check("seed: same request twice, same text", first == second, repr(first[:60]))
other = chat(**dict(sampled, seed=99)).choices[0].message.content
check("seed: another seed, another text", other != first, repr(other[:60]))
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    futs = [pool.submit(chat, **dict(sampled, seed=s)) for s in (1, 2, 3, 1234, 5, 6, 7, 8)]
    under_load = [f.result().choices[0].message.content for f in futs]
check("seed: same text among 7 other requests in flight", under_load[3] == first)

try:
    chat(messages=msgs, model="no-such-model")
    check("unknown model -> 404", False)
except openai.NotFoundError as e:
    check("unknown model -> openai.NotFoundError (404)", True, str(e)[:80])
try:
    chat(messages=msgs, max_tokens=10**6)
    check("max_tokens over the context -> 400", False)
except openai.BadRequestError as e:
    check("max_tokens over the context -> openai.BadRequestError (400)", True, str(e)[:80])

print(f"{failures} failures")
sys.exit(1 if failures else 0)
