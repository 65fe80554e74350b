"""The offline judge on the evaluation set: what `triage eval` reports, plus adversarial cases and
how often each confidence level is right.

    python evals/kubeflow/verify.py --write-set /tmp/kf-set
    python bench/heuristic_eval.py /tmp/kf-set [--judge heuristic] [--json FILE]

Runs `triage eval SET --judge J --format json --keep DIR` (the real `triage feedback` underneath),
then reads the kept facts file against the set's labels: layer accuracy per split and on the cases
tagged `adversarial:*`, the sure part (verdicts whose every judged fact on the rule's path is `high`:
how many, how many right), and, per fact and confidence (`high` / `medium` / `low`), how many of the
judge's facts agree with the label (on searched cases; `agent_searched` is proven by the trace).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")
LEVELS = ("high", "medium", "low", "none")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def measure(set_dir: Path, judge: str, keep: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "triage", "eval", str(set_dir), "--judge", judge, "--format", "json"]
    done = subprocess.run([*command, "--keep", str(keep)], capture_output=True, text=True, check=False)
    if not done.stdout.strip():
        raise SystemExit(f"triage eval failed ({done.returncode}):\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    slug = judge.split(":")[0]
    from triage.domain.records import Facts
    from triage.domain.rule import walk

    labels = {row["trace_id"]: row for row in _read_jsonl(set_dir / "labels.jsonl")}
    found = {row.pop("trace_id"): row for row in _read_jsonl(keep / f"{slug}.facts.jsonl")}
    layers: Counter[tuple[str, str]] = Counter()
    confidence: Counter[tuple[str, str, bool]] = Counter()
    for trace_id, label in labels.items():
        record = found.get(trace_id)
        groups = [label.get("split") or "all", "all"]
        if any(tag.startswith("adversarial:") for tag in label.get("tags", [])):
            groups += ["adversarial", f"adversarial {label.get('split') or 'all'}"]
        layer = None
        sure = False
        if record is not None:
            record = {k: v for k, v in record.items() if k not in ("judge", "prompt_version")}
            facts = Facts.model_validate(record)
            path = walk(facts)
            layer = path.layer.value if path.layer is not None else None
            sure = path.sure
            if label["facts"].get("agent_searched"):
                for name in FACTS:
                    value = getattr(facts, name)
                    if value is None:
                        continue
                    evidence = facts.evidence.get(name)
                    level = (evidence.confidence if evidence else None) or "none"
                    confidence[(name, level, value == label["facts"][name])] += 1
        for group in groups:
            layers[(group, "n")] += 1
            layers[(group, "right")] += layer == label["layer"]
            layers[(group, "sure")] += sure
            layers[(group, "sure right")] += sure and layer == label["layer"]
    splits = sorted({group for group, _ in layers})
    by_level: dict[str, dict[str, list[int]]] = {}
    for name in FACTS:
        for level in LEVELS:
            right, wrong = confidence[(name, level, True)], confidence[(name, level, False)]
            if right + wrong:
                by_level.setdefault(name, {})[level] = [right, right + wrong]
    return {
        "eval": report,
        "layer_accuracy": {g: layers[(g, "right")] / layers[(g, "n")] for g in splits},
        "cases": {g: layers[(g, "n")] for g in splits},
        "sure": {g: [layers[(g, "sure right")], layers[(g, "sure")]] for g in splits},
        "confidence": by_level,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "| split | cases | layer accuracy | sure part: right / sure | sure part: coverage |",
        "|---|---:|---:|---:|---:|",
    ]
    for group, accuracy in result["layer_accuracy"].items():
        right, sure = result["sure"][group]
        cases = result["cases"][group]
        lines.append(f"| {group} | {cases} | {accuracy:.2f} | {right}/{sure} | {sure / cases:.2f} |")
    lines += ["", "| fact | " + " | ".join(LEVELS[:3]) + " |", "|---|---:|---:|---:|"]
    for name, levels in result["confidence"].items():
        cells = []
        for level in LEVELS[:3]:
            right, total = levels.get(level, [0, 0])
            cells.append(f"{right}/{total} ({right / total:.2f})" if total else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("set", type=Path, help="a folder written by verify.py --write-set")
    parser.add_argument("--judge", default="heuristic")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="heuristic-eval-") as tmp:
        result = measure(args.set, args.judge, Path(tmp))
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
