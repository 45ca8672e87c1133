#!/usr/bin/env python3
"""Independent reference values for Candor's agreement statistics (src/stats/agreement.rs).

Computes, with scikit-learn and statsmodels (not with Candor's code), the kappas that the Rust
tests check to the printed precision:

  - textbook tables: Cohen's kappa (Wikipedia's examples; a 3x3 table with the large-sample
    standard error of Fleiss, Cohen and Everitt 1969, statsmodels' std_kappa) and Fleiss'
    kappa (Fleiss 1971, Wikipedia's worked example);
  - Auto-J's published verdicts in both orders against the Auto-J pairwise labels: Cohen's
    kappa per order, the confusion matrices, kappa between the two orders, consistency and
    first-position preference;
  - PandaLM's three annotators: pairwise Cohen's kappa and Fleiss' kappa (the human ceiling);
  - ReaLMistake's published open detectors against the expert labels: Cohen's kappa per
    detector (all prompts pooled, and per prompt), and Fleiss' kappa across the detectors.

Run: python3 -m venv /tmp/kvenv && /tmp/kvenv/bin/pip install numpy scikit-learn statsmodels
     /tmp/kvenv/bin/python tests/reference/agreement_reference.py [DATA_DIR]
DATA_DIR defaults to ../shared/data. The values the tests quote were printed with numpy 2.4.6,
scikit-learn 1.9.1, statsmodels 0.15.0 (agreement_reference.txt beside this script).

Category codes follow Candor's: A (response 1 better) = 0, B = 1, tie = 2 for the pairwise
sets; error = 1, no_error = 0 for ReaLMistake (a null prediction is left out and counted).
"""
import json
import os
import sys
import zipfile
from collections import defaultdict

import numpy as np
from sklearn.metrics import cohen_kappa_score, confusion_matrix
from statsmodels.stats.inter_rater import cohens_kappa, fleiss_kappa, aggregate_raters

DATA = sys.argv[1] if len(sys.argv) > 1 else "../shared/data"


def kappa_line(name, table):
    r = cohens_kappa(np.asarray(table, float))
    n = int(np.asarray(table).sum())
    print(f"{name}: kappa {r.kappa:.4f} se {r.std_kappa:.4f} "
          f"ci [{r.kappa_low:.4f}, {r.kappa_upp:.4f}] n {n}")


def cohen_pairs(name, a, b, labels):
    k = cohen_kappa_score(a, b, labels=labels)
    table = confusion_matrix(a, b, labels=labels)
    r = cohens_kappa(table.astype(float))
    assert abs(r.kappa - k) < 1e-12, (r.kappa, k)
    agree = float(np.mean(np.asarray(a) == np.asarray(b)))
    print(f"{name}: kappa {k:.4f} se {r.std_kappa:.4f} ci [{r.kappa_low:.4f}, "
          f"{r.kappa_upp:.4f}] agreement {agree:.4f} n {len(a)} "
          f"confusion {table.tolist()}")


def textbook():
    print("== textbook")
    kappa_line("wikipedia 20/5/10/15", [[20, 5], [10, 15]])
    kappa_line("wikipedia 45/15/25/15", [[45, 15], [25, 15]])
    kappa_line("wikipedia 25/35/5/35", [[25, 35], [5, 35]])
    kappa_line("3x3 106/10/4/22/28/10/2/12/6", [[106, 10, 4], [22, 28, 10], [2, 12, 6]])
    fleiss_1971 = np.array([
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ])
    print(f"fleiss 1971 (wikipedia): kappa {fleiss_kappa(fleiss_1971, method='fleiss'):.4f}")


def autoj():
    print("== auto-j")
    d = os.path.join(DATA, "fennec/auto-j")
    label = [json.loads(l)["label"] for l in open(os.path.join(d, "testdata_pairwise.jsonl"))]
    normal = [json.loads(l)["output"] for l in open(os.path.join(d, "pairwise_example_output.jsonl"))]
    swap = {0: 1, 1: 0, 2: 2}
    exchanged = [swap[json.loads(l)["output"]]
                 for l in open(os.path.join(d, "pairwise_exchange_example_output.jsonl"))]
    # Auto-J's codes are Candor's: 0 = response 1 (A), 1 = response 2 (B), 2 = tie.
    labels = [0, 1, 2]
    cohen_pairs("normal vs label", normal, label, labels)
    cohen_pairs("exchanged vs label", exchanged, label, labels)
    cohen_pairs("normal vs exchanged", normal, exchanged, labels)
    n = len(label)
    agreement = sum(a == l and b == l for a, b, l in zip(normal, exchanged, label)) / n
    consistency = sum(a == b for a, b in zip(normal, exchanged)) / n
    first = sum(a == 0 and b == 1 for a, b in zip(normal, exchanged)) / n
    second = sum(a == 1 and b == 0 for a, b in zip(normal, exchanged)) / n
    print(f"agreement {100 * agreement:.2f} consistency {100 * consistency:.2f} "
          f"first_position {100 * first:.2f} second_position {100 * second:.2f} n {n}")


def pandalm():
    print("== pandalm")
    items = json.load(open(os.path.join(DATA, "fennec/pandalm/testset-v1.json")))
    # PandaLM's codes: 0 = tie, 1 = response 1, 2 = response 2; to Candor's A/B/tie.
    code = {1: 0, 2: 1, 0: 2}
    ann = [[code[it[f"annotator{i}"]] for it in items] for i in (1, 2, 3)]
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        cohen_pairs(f"annotator{i + 1} vs annotator{j + 1}", ann[i], ann[j], [0, 1, 2])
    table, _ = aggregate_raters(np.array(ann).T, n_cat=3)
    print(f"fleiss three annotators: kappa {fleiss_kappa(table, method='fleiss'):.4f} "
          f"n {len(items)}")


def realmistake():
    print("== realmistake")
    z = zipfile.ZipFile(os.path.join(DATA, "realmistake/detector_outputs_open.zip"))
    code = {"error": 1, "no_error": 0}
    # (detector, prompt) -> list of (unit, label, prediction or None)
    rows = defaultdict(list)
    for name in sorted(z.namelist()):
        if not name.endswith(".jsonl"):
            continue
        parts = name.split("/")
        task, response_model, detector, stem = parts[2], parts[3], parts[4], parts[5]
        prompt = int(stem.rsplit("_", 1)[1].split(".")[0])
        for line_no, line in enumerate(z.open(name, pwd=b"open-realmistake").read().decode().splitlines()):
            if not line.strip():
                continue
            r = json.loads(line)
            p = r["prediction"]
            rows[(detector, prompt)].append(
                ((task, response_model, line_no, prompt), code[r["label"]],
                 None if p is None else code[p]))
    detectors = sorted({d for d, _ in rows})
    for det in detectors:
        pooled_g, pooled_p, missing = [], [], 0
        for prompt in (1, 2, 3, 4):
            g = [l for _, l, p in rows[(det, prompt)] if p is not None]
            p = [p for _, _, p in rows[(det, prompt)] if p is not None]
            miss = len(rows[(det, prompt)]) - len(p)
            missing += miss
            pooled_g += g
            pooled_p += p
            # Rater order: the detector's prediction first, the expert label second.
            cohen_pairs(f"{det} prompt {prompt} (no verdict {miss})", p, g, [0, 1])
        cohen_pairs(f"{det} all prompts (no verdict {missing})", pooled_p, pooled_g, [0, 1])
    # Fleiss across detectors: units (task, response model, line, prompt) that every detector
    # gave a verdict on.
    by_unit = defaultdict(dict)
    for (det, _), rs in rows.items():
        for unit, _, p in rs:
            by_unit[unit][det] = p
    complete = [u for u, v in by_unit.items()
                if len(v) == len(detectors) and all(x is not None for x in v.values())]
    ratings = np.array([[by_unit[u][d] for d in detectors] for u in sorted(complete)])
    table, _ = aggregate_raters(ratings, n_cat=2)
    print(f"fleiss {len(detectors)} detectors: kappa {fleiss_kappa(table, method='fleiss'):.4f} "
          f"n {len(complete)} of {len(by_unit)}")


if __name__ == "__main__":
    textbook()
    autoj()
    pandalm()
    realmistake()
