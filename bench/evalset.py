"""Layer accuracy on the evaluation set (evals/kubeflow), through the real CLI, offline.

    python bench/evalset.py [--judge heuristic] [--split all|dev|test]

Loads the set's traces into a fresh embedded store (votes moved to an hour ago), indexes the
corpus (docs + Katib examples) and the set's own issue threads, runs `triage feedback` with the
judge named (the default: the offline heuristic) and with the true facts replayed, and prints
layer accuracy per split and per layer, per-fact accuracy on searched cases, and the misses; then
component and owner accuracy (the `triage_component` score written, and its `owners`, against the
labelled component and the owners `triage.domain.ownership.owners` gives the labelled layer and
component), with the component misses and which source decided them (`component_from`).
A measurement, not `triage eval` (the calibration issue): no kappa, no model judges yet.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EVALS = ROOT / "evals" / "kubeflow"
FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")


def _verifier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify", EVALS / "verify.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["verify"] = module
    spec.loader.exec_module(module)
    return module


def _run(judge: str, store: Path, config: Path, facts: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "OPENAI_", "TRIAGE_"))}
    env["TRIAGE_STORE"] = str(store)
    command = [sys.executable, "-m", "triage", "feedback", "--since-hours", "48", "--force", "--write"]
    command += ["--config", str(config), "--judge", judge, "--facts-file", str(facts)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)


def _layers(facts_file: Path) -> dict[str, dict[str, Any]]:
    from triage.domain.records import Facts
    from triage.domain.rule import Undetermined, decide

    out: dict[str, dict[str, Any]] = {}
    for line in facts_file.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        trace_id = record.pop("trace_id")
        for key in ("judge", "prompt_version"):
            record.pop(key, None)
        facts = Facts.model_validate(record)
        try:
            layer = decide(facts).value
        except Undetermined as ex:
            layer = f"undecided ({ex.missing})"
        out[trace_id.removeprefix("eval-")] = {"layer": layer, "facts": record}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", default="heuristic")
    args = parser.parse_args()
    verify = _verifier()
    corpus_root: Path = verify.DEFAULT_CORPUS
    if not (corpus_root / "kubeflow-docs").is_dir():
        print(f"skipped: the shared corpus is not here ({corpus_root})")
        return 0
    from triage.sources.store import Store

    cases = verify.load_cases()
    corpus = verify.Corpus.load(corpus_root)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = [json.dumps(verify.trace_record(case, corpus, n)) for n, case in enumerate(cases)]
        newest = verify.BASE_TIME + timedelta(minutes=20 * len(cases))
        shift = datetime.now(UTC) - timedelta(hours=1) - newest
        config = work / "triage.toml"
        config.write_text(
            "".join(
                f'[[index]]\ncollection = "{name}"\npath = "{path}"\n\n'
                for name, path in (
                    ("docs", corpus_root / "kubeflow-docs"),
                    ("code", corpus_root / "katib-examples"),
                    ("issues", EVALS / "issues"),
                )
            )
        )
        truth = work / "truth.jsonl"
        truth.write_text(
            "".join(json.dumps({"trace_id": f"eval-{c['id']}", **c["facts"]}) + "\n" for c in cases)
        )
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for name, judge in ((args.judge, args.judge), ("replay", f"replay:{truth}")):
            store = work / f"{name}.sqlite"
            with Store(store) as db:
                db.import_lines(lines, "evalset", shift=shift)
            facts_file = work / f"{name}.facts.jsonl"
            done = _run(judge, store, config, facts_file)
            if done.returncode not in (0, 4):
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            results[name] = _layers(facts_file) if facts_file.exists() else {}
            with Store(store) as db:
                for row in db.scores_named("triage_component"):
                    found = results[name].setdefault(row["traceId"].removeprefix("eval-"), {})
                    metadata = json.loads(row["metadata"] or "{}")
                    found["component"] = row["stringValue"]
                    found["owners"] = metadata.get("owners")
                    found["component_from"] = metadata.get("component_from")
    _print(cases, results)
    _print_components(cases, results)
    return 0


def _print_components(cases: list[dict[str, Any]], results: dict[str, dict[str, dict[str, Any]]]) -> None:
    from triage.config import load_config
    from triage.domain.ownership import owners
    from triage.domain.records import Layer

    config = load_config()
    print("\n| judge | split | cases | component right | accuracy | owners right | accuracy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, found in results.items():
        for split in ("dev", "test", "all"):
            chosen = [c for c in cases if split == "all" or c["split"] == split]
            comp = sum(found.get(c["id"], {}).get("component") == c["component"] for c in chosen)
            own = sum(
                found.get(c["id"], {}).get("owners") == owners(Layer(c["layer"]), c["component"], config)
                for c in chosen
            )
            n = len(chosen)
            print(f"| {name} | {split} | {n} | {comp} | {comp / n:.2f} | {own} | {own / n:.2f} |")
    for name, found in results.items():
        misses = [c for c in cases if found.get(c["id"], {}).get("component") != c["component"]]
        print(
            f"\n{name}, component misses (case: true -> found, decided by): "
            + ", ".join(
                f"{c['id']}: {c['component']} -> {found.get(c['id'], {}).get('component', 'not triaged')}"
                f" ({found.get(c['id'], {}).get('component_from')})"
                for c in misses
            )
        )


def _print(cases: list[dict[str, Any]], results: dict[str, dict[str, dict[str, Any]]]) -> None:
    print("| judge | split | cases | layer right | accuracy |")
    print("|---|---|---:|---:|---:|")
    for name, found in results.items():
        for split in ("dev", "test", "all"):
            chosen = [c for c in cases if split == "all" or c["split"] == split]
            right = sum(found.get(c["id"], {}).get("layer") == c["layer"] for c in chosen)
            print(f"| {name} | {split} | {len(chosen)} | {right} | {right / len(chosen):.2f} |")
    for name, found in results.items():
        per_layer: dict[str, Counter[str]] = defaultdict(Counter)
        for case in cases:
            per_layer[case["layer"]]["n"] += 1
            per_layer[case["layer"]]["right"] += found.get(case["id"], {}).get("layer") == case["layer"]
        print(f"\n{name}, per true layer: " + ", ".join(
            f"{layer} {c['right']}/{c['n']}" for layer, c in sorted(per_layer.items())
        ))  # fmt: skip
        searched = [c for c in cases if c["facts"]["agent_searched"] and c["id"] in found]
        per_fact = []
        for fact in FACTS:
            known = [c for c in searched if c["facts"].get(fact) is not None]
            right = sum(found[c["id"]]["facts"].get(fact) == c["facts"][fact] for c in known)
            per_fact.append(f"{fact} {right}/{len(known)}")
        print(f"{name}, per fact on searched cases: " + ", ".join(per_fact))
        misses = [c for c in cases if found.get(c["id"], {}).get("layer") != c["layer"]]
        confusion = Counter((c["layer"], found.get(c["id"], {}).get("layer", "not triaged")) for c in misses)
        print(
            f"{name}, misses (true -> found): "
            + ", ".join(f"{a} -> {b} x{n}" for (a, b), n in confusion.most_common())
        )


if __name__ == "__main__":
    sys.exit(main())
