"""The evaluation set (evals/kubeflow) through `triage eval`, in one command, with the perfect model.

    python bench/evalset.py                                   # heuristic, replay, llm-perfect, cascade-perfect
    python bench/evalset.py --judge heuristic --split test    # one judge, one split
    python bench/evalset.py --json /tmp/eval.json --figures   # every figure as JSON; recall and shortcuts

Writes the set out (`evals/kubeflow/verify.py --write-set`: traces, labels, a config indexing the
corpus and the set's issue threads), starts the *perfect model* (tests/doubles/perfect_model.py)
when a `*-perfect` judge is asked for, and runs `triage eval` on it: each judge through a real
`triage feedback` run (in `triage eval`'s own process), its decisions read back from a fresh
embedded store and calibrated against the labels (layer accuracy, kappa, per fact, component,
owner, calls per trace, misses).

The perfect model is an OpenAI-compatible server on 127.0.0.1, reached through the real `openai`
client, that answers every judge prompt from the set's labels, using only what the prompt shows:
what a cap or a missed re-search keeps from the prompt costs it the case too, so `llm-perfect`
and `cascade-perfect` measure the job, not a model.

Every run's row carries its sure part beside the layer accuracy: the verdicts whose every judged
fact on the rule's path is `high`, their accuracy and the share of the cases they cover.

`--figures` also prints, computed in-process over the same index and traces: the re-search's
recall on the index-has-answer cases, the precision of each of the cascade's shortcuts, and the
offline judge's `high` facts per split (right of all; every one should be).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
EVALS = ROOT / "evals" / "kubeflow"
MODEL = "perfect-model"
JUDGES = {
    "heuristic": "heuristic",
    "replay": "replay",
    "llm-perfect": "llm-perfect=llm",
    "cascade-perfect": "cascade-perfect=cascade",
}


def _verifier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify", EVALS / "verify.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["verify"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", action="append", choices=sorted(JUDGES), help="repeatable; default: all four")
    parser.add_argument("--split", help="only this split (dev or test); default: each, and all")
    parser.add_argument("--json", type=Path, help="also write the evaluation report as JSON here")
    parser.add_argument("--figures", action="store_true", help="re-search recall and shortcut precision")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    verify = _verifier()
    corpus_root: Path = verify.DEFAULT_CORPUS
    if not (corpus_root / "kubeflow-docs").is_dir():
        print(f"skipped: the shared corpus is not here ({corpus_root})")
        return 0
    from tests.doubles.perfect_model import PerfectModel
    from triage.domain.review import EvalReport
    from triage.sinks.report import render_eval
    from triage.sources.export_file import vote_shift

    cases = verify.load_cases()
    corpus = verify.Corpus.load(corpus_root)
    judges = args.judge or list(JUDGES)
    with tempfile.TemporaryDirectory() as tmp, PerfectModel(cases, corpus) as model:
        work = Path(tmp)
        verify.write_set(cases, corpus, work / "set", corpus_root)
        out = work / "eval.json"
        command = [sys.executable, "-m", "triage", "eval", str(work / "set"), "--format", "json", "--output", str(out)]
        for judge in judges:
            command += ["--judge", JUDGES[judge]]
        if args.split:
            command += ["--split", args.split]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TRIAGE_JUDGE"))}
        env.update(OPENAI_BASE_URL=model.url, OPENAI_API_KEY="perfect", TRIAGE_JUDGE_MODEL=MODEL)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
        if not out.is_file():
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        report = EvalReport.model_validate_json(out.read_text(encoding="utf-8"))
        print(render_eval(report), end="")
        print(f"\n`llm-perfect` and `cascade-perfect`: {model.calls} calls to the perfect model in all.")
        if model.unknown:
            print(f"The perfect model did not know {len(model.unknown)} questions: {sorted(model.unknown)[:5]}")
        if args.json:
            args.json.write_text(out.read_text(encoding="utf-8"), encoding="utf-8")
        if args.figures:
            from bench._evalfigures import figures

            traces = work / "set" / "traces.jsonl"
            lines = [line for line in traces.read_text(encoding="utf-8").splitlines() if line.strip()]
            shift = vote_shift(traces, datetime.now(UTC))
            asyncio.run(figures(cases, lines, work / "set" / "triage.toml", work, shift))
    return 0 if done.returncode == 0 else done.returncode


if __name__ == "__main__":
    sys.exit(main())
