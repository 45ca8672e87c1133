#!/usr/bin/env python3
"""Expected values of `candor compare` on the authors' published outputs, computed from the
raw files with numpy, scipy and statsmodels (none of Candor's code).

FB-Bench v3 (13 models judged by GPT-4o, fbbench/v3/judgments/*.jsonl): for the chosen models,
every pair on the three headline metrics. An item's value is the `score` the authors' code
recorded (x100); Error Correction and Response Maintenance are means over task types of the
per-task mean, Overall the mean over (scenario, task) groups (the authors' notebook).
Differences over the items both models have, standard error sqrt(sum_g s_g^2 / (G^2 n_g)),
smallest detectable difference (z_.975 + z_.8) se; the test is of the difference as the
metric weighs its items: exact McNemar (scipy binomtest) for 0/1 items that all weigh the same
(one group, or groups of equal size), otherwise the sign-flip test of the weighted differences
w_i d_i, w_i = 1 / (G n_g) (every pattern up to 20 differing items, else its normal
approximation, scipy) -- so Response Maintenance, 0/1 items averaged over task types of
unequal size, has the stratified sign flip. Paired percentile bootstrap, Holm (statsmodels)
across all comparisons. The bootstrap uses the SplitMix64 stream documented in
src/stats/paired.rs, written here again with numpy.

ReaLMistake (detector_outputs_open.zip, decrypted in memory): every pair of the 7 open
detectors on accuracy per (item, prompt) (a null prediction is wrong), the same choice of test,
Holm across the 21 pairs.

Usage: python3 compare_reference.py [DATA_ROOT] [fbbench MODEL ...]
(default data root ../shared/data; default models: the four of tests/it/compare.rs).
Prints the lines tests/it/compare.rs expects (compare_reference.txt beside this script; with
`--mcnemar-unweighted`, the earlier choice, McNemar for every 0/1 metric, and a count of the
Holm decisions that differ from the weighted tests, on the given models).
"""

import glob
import hashlib
import io
import json
import math
import os
import sys
import zipfile

import numpy as np
from scipy.stats import binomtest, norm
from statsmodels.stats.multitest import multipletests

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
RESAMPLES, EXACT_MAX = 1000, 20
Z = norm.ppf(0.975) + norm.ppf(0.8)
DEFAULT_MODELS = ["Qwen2.5-72B-Instruct", "claude-3-5-sonnet-20241022",
                  "gpt-4o-2024-05-13", "phi-4"]


def splitmix(seed, count):
    """The first `count` outputs of SplitMix64 seeded with `seed` (output k is the mix of
    seed + k * GOLDEN)."""
    with np.errstate(over="ignore"):
        k = np.arange(1, count + 1, dtype=np.uint64)
        z = np.uint64(seed) + k * GOLDEN
        z = (z ^ (z >> np.uint64(30))) * M1
        z = (z ^ (z >> np.uint64(27))) * M2
        return z ^ (z >> np.uint64(31))


def fnv1a(seed, name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h ^= b
        h = (h * 0x100000001B3) % (1 << 64)
    return h ^ seed


def grouped_mean(d, g):
    sums = np.bincount(g, weights=d)
    ns = np.bincount(g)
    keep = ns > 0
    return float(np.mean(sums[keep] / ns[keep]))


def std_error(d, g):
    groups = np.unique(g)
    total = 0.0
    for k in groups:
        x = d[g == k]
        if len(x) > 1:
            total += np.var(x, ddof=1) / len(x)
    return math.sqrt(total / len(groups) ** 2)


def bootstrap(d, g, seed):
    n = len(d)
    x = splitmix(seed, n * RESAMPLES)
    zone = (2**64 - 1) - ((2**64 - 1) % n)
    assert int(x.max()) < zone, "a rejected draw: extend the script"
    idx = (x % np.uint64(n)).astype(np.int64).reshape(RESAMPLES, n)
    stats = np.sort([grouped_mean(d[i], g[i]) for i in idx])
    return np.percentile(stats, 2.5), np.percentile(stats, 97.5)


def sign_flip(d, g):
    ns = np.bincount(g)
    w = 1.0 / ((ns > 0).sum() * ns[g])
    a = (w * d)[d != 0]
    k = len(a)
    if k == 0:
        return 1.0, "sign_flip_exact"

    def count(signs):
        t = np.abs(signs @ a)
        return int((t >= abs(a.sum()) - 1e-9 * np.abs(a).sum()).sum())

    if k <= EXACT_MAX:
        masks = np.arange(2**k)[:, None]
        signs = np.where((masks >> np.arange(k)) & 1, 1.0, -1.0)
        return count(signs) / 2**k, "sign_flip_exact"
    # The sign-flip distribution's normal approximation (mean 0, variance sum a_i^2).
    p = min(1.0, 2 * norm.sf(abs(a.sum()) / math.sqrt((a * a).sum())))
    return p, "sign_flip_normal"


def item_id(r):
    """Candor's pairing id: whitespace-free texts (four files hold an earlier revision of 66
    items that differs from the dataset only in whitespace)."""
    h = hashlib.sha256()
    for part in (r["user_query"], r["origin_first_response"], r["feedback"]):
        h.update("".join(part.split()).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def fmt(x, dec):
    return f"{x:.{dec}f}"


def claim(c):
    dec = c["dec"]
    p = c["holm"]
    ptxt = "< 0.001" if p < 0.001 else f"= {p:.3f}"
    return (f"{c['a']} − {c['b']} = {c['diff']:+.{dec}f} [{fmt(c['low'], dec)}, "
            f"{fmt(c['high'], dec)}], p {ptxt} (Holm), n = {c['n']}")


def power(c):
    s = f"detectable ±{fmt(c['mdd'], c['dec'])}"
    if c["holm"] >= 0.05 and c["p"] >= 0.05 and c["diff"] != 0:
        need = math.ceil(c["n"] * (c["mdd"] / c["diff"]) ** 2)
        s += f"; ~{max(need, 1)} items would detect {fmt(abs(c['diff']), c['dec'])}"
    elif c["p"] < 0.05 <= c["holm"]:
        s += "; p < 0.05 alone, not after Holm"
    return s


def compare(protocol, metric, a, b, va, vb, binary, dec, unweighted=False):
    """va, vb: {id: (group, value)} of one metric; `unweighted`: McNemar for any 0/1 metric."""
    common = [i for i in va if i in vb]
    groups = sorted({va[i][0] for i in common})
    g = np.array([groups.index(va[i][0]) for i in common], dtype=np.int64)
    d = np.array([va[i][1] - vb[i][1] for i in common])
    universe = set(va) | set(vb)
    seed = fnv1a(0, f"{protocol}/{metric}/{a}/{b}")
    low, high = bootstrap(d, g, seed)
    sizes = np.bincount(g)
    equal = len(set(sizes[sizes > 0])) <= 1
    if binary and (equal or unweighted):
        plus, minus = int((d > 0).sum()), int((d < 0).sum())
        p = binomtest(plus, plus + minus, 0.5).pvalue if plus + minus else 1.0
        p, test = min(p, 1.0), "mcnemar_exact"
    else:
        p, test = sign_flip(d, g)
    se = std_error(d, g)
    return dict(a=a, b=b, metric=metric, n=len(common), left=len(universe) - len(common),
                diff=grouped_mean(d, g), low=low, high=high, p=p, mdd=Z * se, dec=dec,
                test=test)


def fbbench(root, models, unweighted=False):
    per_model = {}
    for m in models:
        path = os.path.join(root, "fbbench/v3/judgments", m + ".jsonl")
        rows = [json.loads(line) for line in open(path, encoding="utf-8")]
        metrics = {"error_correction": {}, "response_maintenance": {}, "overall": {}}
        for r in rows:
            i, ec = item_id(r), r["bench_type"] == "Error Correction"
            v = float(r["score"]) * 100.0
            metrics["error_correction" if ec else "response_maintenance"][i] = (r["task_type"], v)
            metrics["overall"][i] = (r["bench_type"] + "/" + r["task_type"], v)
        per_model[m] = metrics
    out = []
    for metric in ["error_correction", "response_maintenance", "overall"]:
        for x in range(len(models)):
            for y in range(x + 1, len(models)):
                a, b = models[x], models[y]
                out.append(compare("fbbench", metric, a, b, per_model[a][metric],
                                   per_model[b][metric], metric == "response_maintenance", 1,
                                   unweighted))
    return out


def realmistake(root):
    z = zipfile.ZipFile(os.path.join(root, "realmistake/detector_outputs_open.zip"))
    z.setpassword(b"open-realmistake")
    det = {}
    for name in sorted(z.namelist()):
        parts = name.split("/")
        if not parts[-1].startswith("baseline_errordetection_prompt_"):
            continue
        task, model, detector, file = parts[-4:]
        prompt = file[len("baseline_errordetection_"):-len(".jsonl")]
        group = f"{task}/{model}/{prompt}"
        for line in io.TextIOWrapper(z.open(name), encoding="utf-8"):
            r = json.loads(line)
            key = f"{r['metadata']['id']}/{prompt}"
            ok = 1.0 if r["prediction"] is not None and r["prediction"] == r["label"] else 0.0
            det.setdefault(detector, {})[key] = (group, ok)
    names = sorted(det)
    out = []
    for x in range(len(names)):
        for y in range(x + 1, len(names)):
            a, b = names[x], names[y]
            out.append(compare("realmistake", "accuracy", a, b, det[a], det[b], True, 3))
    return out


def with_holm(family):
    holm = multipletests([c["p"] for c in family], method="holm")[1]
    for c, h in zip(family, holm):
        c["holm"] = h
    return family


def main():
    args = sys.argv[1:]
    unweighted = "--mcnemar-unweighted" in args
    args = [a for a in args if a != "--mcnemar-unweighted"]
    root = args[0] if args else "../shared/data"
    models = sorted(args[1:] or DEFAULT_MODELS)
    if unweighted:
        # How many Holm decisions (p < 0.05 after Holm) the choice of test changes.
        old = with_holm(fbbench(root, models, unweighted=True))
        new = with_holm(fbbench(root, models))
        flips = [(o, n) for o, n in zip(old, new) if (o["holm"] < 0.05) != (n["holm"] < 0.05)]
        print(f"fbbench, {len(models)} models: {len(flips)} of {len(new)} Holm decisions differ "
              f"between McNemar on unweighted items and the weighted sign flip")
        for o, n in flips:
            print(f"  {n['metric']}: {n['a']} − {n['b']}: Holm p {o['holm']:.4f} "
                  f"(McNemar) vs {n['holm']:.4f} ({n['test']})")
        return
    for family in (fbbench(root, models), realmistake(root)):
        for c in with_holm(family):
            print(f"{c['metric']}: {claim(c)}  ({power(c)}; p unadjusted {c['p']:.4f}; "
                  f"test {c['test']}; left out {c['left']})")
        print()


if __name__ == "__main__":
    main()
