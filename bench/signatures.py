"""How well failure signatures group: paraphrases of a case against unrelated cases.

    python bench/signatures.py

A person would put a paraphrase (evals/kubeflow/paraphrases.jsonl: the same failure, asked in
other words) in the same item as its case; two different cases of the same layer and component
are unrelated (the set has no duplicates). Signatures only ever compare questions of the same
layer and component, so only those pairs are counted. For each similarity measure and threshold:
how many paraphrase pairs are grouped (want all) and how many unrelated pairs are (want none),
on the dev split (where the threshold is chosen) and the test split (reported, not used to choose).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triage.domain.worklist import similarity, topic_terms  # noqa: E402

Measure = Callable[[frozenset[str], frozenset[str]], float]


def overlap(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


MEASURES: dict[str, Measure] = {"overlap": overlap, "dice": similarity, "jaccard": jaccard}
THRESHOLDS = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]


def pairs(split: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    cases = {c["id"]: c for c in map(json.loads, (ROOT / "evals/kubeflow/cases.jsonl").read_text().splitlines())}
    paraphrases = list(map(json.loads, (ROOT / "evals/kubeflow/paraphrases.jsonl").read_text().splitlines()))
    chosen = [p for p in paraphrases if split == "all" or cases[p["id"]]["split"] == split]
    same = [(p["question"], cases[p["id"]]["question"], cases[p["id"]]["component"]) for p in chosen]
    pool = [c for c in cases.values() if split == "all" or c["split"] == split]
    unrelated = [
        (a["question"], b["question"], a["component"])
        for a, b in combinations(pool, 2)
        if a["layer"] == b["layer"] and a["component"] == b["component"]
    ]
    # a paraphrase against every other case of its layer and component is unrelated too
    for p in chosen:
        case = cases[p["id"]]
        unrelated += [
            (p["question"], other["question"], case["component"])
            for other in pool
            if other["id"] != case["id"] and (other["layer"], other["component"]) == (case["layer"], case["component"])
        ]
    return same, unrelated


def main() -> int:
    splits = {split: pairs(split) for split in ("dev", "test", "all")}
    print("| measure | threshold | split | paraphrases grouped | unrelated grouped |")
    print("|---|---:|---|---:|---:|")
    for name, measure in MEASURES.items():
        for threshold in THRESHOLDS:
            for split, (same, unrelated) in splits.items():
                hit = sum(measure(topic_terms(a, c), topic_terms(b, c)) >= threshold for a, b, c in same)
                wrong = sum(measure(topic_terms(a, c), topic_terms(b, c)) >= threshold for a, b, c in unrelated)
                print(f"| {name} | {threshold} | {split} | {hit}/{len(same)} | {wrong}/{len(unrelated)} |")
    # chosen on dev only: the measure with the widest margin between the least similar paraphrase
    # and the most similar unrelated pair, its threshold in the middle of that margin
    same, unrelated = splits["dev"]
    margins = {}
    for name, measure in MEASURES.items():
        low = min(measure(topic_terms(a, c), topic_terms(b, c)) for a, b, c in same)
        high = max(measure(topic_terms(a, c), topic_terms(b, c)) for a, b, c in unrelated)
        margins[name] = (low - high, (low + high) / 2, low, high)
        print(f"\ndev {name}: least similar paraphrase {low:.2f}, most similar unrelated {high:.2f}")
    name = max(margins, key=lambda n: margins[n][0])
    print(f"\nchosen on dev: {name} >= {margins[name][1]:.2f} (margin {margins[name][0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
