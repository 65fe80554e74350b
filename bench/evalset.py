"""Layer accuracy on the evaluation set (evals/kubeflow), through the real CLI, offline.

    python bench/evalset.py [--judge heuristic|llm|cascade ...] [--no-replay] [--misses] [--figures]

Loads the set's traces into a fresh embedded store (votes moved to an hour ago), indexes the
corpus (docs + Katib examples) and the set's own issue threads, runs `triage feedback` with each
judge named (the default: the offline heuristic) and with the true facts replayed, and prints
layer accuracy per split and per layer, per-fact accuracy on searched cases, and the misses.

`llm` and `cascade` run against the *perfect model* (tests/doubles/perfect_model.py): an
OpenAI-compatible server on 127.0.0.1 that answers every judge prompt from the set's labels,
reached through the real `openai` client (OPENAI_BASE_URL, OPENAI_API_KEY, TRIAGE_JUDGE_MODEL set
as triage/settings.py reads them). Both must reach 94/94: that is the job's ceiling.

`--figures` also prints, computed in-process over the same index and traces: the re-search's
recall on the index-has-answer cases (every `needs` string among the re-searched passages, and
among the ones the judge is shown) and the precision of each of the cascade's cheap shortcuts
on the whole set. A measurement, not `triage eval` (the calibration issue): no kappa.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EVALS = ROOT / "evals" / "kubeflow"
FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")
MODEL = "perfect-model"


def _verifier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify", EVALS / "verify.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["verify"] = module
    spec.loader.exec_module(module)
    return module


def _run(
    judge: str, store: Path, config: Path, facts: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "OPENAI_", "TRIAGE_"))}
    env["TRIAGE_STORE"] = str(store)
    env.update(extra_env or {})
    command = [sys.executable, "-m", "triage", "feedback", "--since-hours", "48", "--force"]
    command += ["--config", str(config), "--judge", judge, "--facts-file", str(facts)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)


def _layers(facts_file: Path) -> dict[str, dict[str, Any]]:
    from triage.domain.records import Facts
    from triage.domain.rule import Undetermined, decide

    out: dict[str, dict[str, Any]] = {}
    for line in facts_file.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        trace_id = record.pop("trace_id")
        judge = record.pop("judge", None)
        record.pop("prompt_version", None)
        facts = Facts.model_validate(record)
        try:
            layer = decide(facts).value
        except Undetermined as ex:
            layer = f"undecided ({ex.missing})"
        out[trace_id.removeprefix("eval-")] = {"layer": layer, "facts": record, "judge": judge}
    return out


def write_config(work: Path, corpus_root: Path) -> Path:
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
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--judge",
        action="append",
        help="heuristic (default), llm or cascade (both against the perfect model); repeatable",
    )
    parser.add_argument("--no-replay", action="store_true", help="skip the true facts replayed")
    parser.add_argument("--misses", action="store_true", help="list every miss with its case id")
    parser.add_argument("--figures", action="store_true", help="re-search recall and shortcut precision")
    args = parser.parse_args()
    judges: list[str] = args.judge or ["heuristic"]
    verify = _verifier()
    corpus_root: Path = verify.DEFAULT_CORPUS
    if not (corpus_root / "kubeflow-docs").is_dir():
        print(f"skipped: the shared corpus is not here ({corpus_root})")
        return 0
    from triage.sources.store import Store

    cases = verify.load_cases()
    corpus = verify.Corpus.load(corpus_root)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = [json.dumps(verify.trace_record(case, corpus, n)) for n, case in enumerate(cases)]
        newest = verify.BASE_TIME + timedelta(minutes=20 * len(cases))
        shift = datetime.now(UTC) - timedelta(hours=1) - newest
        config = write_config(work, corpus_root)
        truth = work / "truth.jsonl"
        truth.write_text(
            "".join(json.dumps({"trace_id": f"eval-{c['id']}", **c["facts"]}) + "\n" for c in cases)
        )
        results: dict[str, dict[str, dict[str, Any]]] = {}
        runs = [(j, j) for j in judges] + ([] if args.no_replay else [("replay", f"replay:{truth}")])
        for name, judge in runs:
            store = work / f"{name}.sqlite"
            with Store(store) as db:
                db.import_lines(lines, "evalset", shift=shift)
            facts_file = work / f"{name}.facts.jsonl"
            started = time.monotonic()
            if judge in ("llm", "cascade"):
                from tests.doubles.perfect_model import PerfectModel

                with PerfectModel(cases, corpus) as model:
                    env = {
                        "OPENAI_BASE_URL": model.url,
                        "OPENAI_API_KEY": "perfect",
                        "TRIAGE_JUDGE_MODEL": MODEL,
                    }
                    done = _run(judge, store, config, facts_file, env)
                    name = f"{judge}-perfect"
                    if model.unknown:
                        print(f"{name}: the perfect model did not know {len(model.unknown)} questions")
                    timings[name + " calls"] = model.calls
            else:
                done = _run(judge, store, config, facts_file)
            timings[name] = time.monotonic() - started
            if done.returncode not in (0, 4):
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            results[name] = _layers(facts_file) if facts_file.exists() else {}
        _print(cases, results, args.misses)
        print(
            "\nwall seconds per run: "
            + ", ".join(f"{k} {v:.1f}" for k, v in timings.items() if "calls" not in k)
        )
        for key, value in timings.items():
            if key.endswith(" calls"):
                print(
                    f"{key.removesuffix(' calls')}: {value:.0f} model calls ({value / len(cases):.2f} per trace)"
                )
        if args.figures:
            from bench._evalfigures import figures

            asyncio.run(figures(cases, lines, config, work, shift))
    return 0


def _print(cases: list[dict[str, Any]], results: dict[str, dict[str, dict[str, Any]]], misses: bool) -> None:
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
        right_component = sum(
            found.get(c["id"], {}).get("facts", {}).get("component") == c["component"] for c in cases
        )
        print(f"{name}, the component fact equals the label (may be unset): {right_component}/{len(cases)}")
        missed = [c for c in cases if found.get(c["id"], {}).get("layer") != c["layer"]]
        confusion = Counter((c["layer"], found.get(c["id"], {}).get("layer", "not triaged")) for c in missed)
        print(
            f"{name}, misses (true -> found): "
            + ", ".join(f"{a} -> {b} x{n}" for (a, b), n in confusion.most_common())
        )
        if misses:
            for case in missed:
                got = found.get(case["id"], {})
                wrong = [f for f in FACTS if got.get("facts", {}).get(f) != case["facts"][f]]
                print(
                    f"  {case['id']} {case['layer']} -> {got.get('layer', 'not triaged')}; facts off: {wrong}"
                )


if __name__ == "__main__":
    sys.exit(main())
