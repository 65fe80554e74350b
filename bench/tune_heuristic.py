"""Choose the offline judge's containment thresholds on the evaluation set's `dev` cases; report
`test` for the choice (never used to choose).

    python evals/kubeflow/verify.py --write-set /tmp/kf-set
    python bench/tune_heuristic.py /tmp/kf-set [--top 10]

The traces are read back from a store and re-searched once, the way the job does it (the job's
`read_trace` and `Researcher` over the set's index); then every combination of the grid below is
applied to `triage.judges.heuristic` and the heuristic judge is run over every trace in
process, the layer decided by the job's rule. Prints the best combinations by dev layer accuracy
(ties: the one nearest the shipped values), with their test figure beside, and the shipped values'
figures. The grid is small on purpose: 47 points of dev per layer are few, and a finer grid only
fits noise.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

GRID: dict[str, list[float]] = {
    "HOLD_THRESHOLD": [0.55, 0.6, 0.65, 0.7, 0.75],
    "OUTRANK_MARGIN": [0.1, 0.15, 0.2, 0.25, 0.3],
    "ANSWER_WEIGHT": [0.2, 0.3, 0.4, 0.5],
    "INDEX_THRESHOLD": [0.45, 0.5, 0.55, 0.6, 0.65, 0.7],
    "TOPIC_SHARE": [0.4, 0.5, 0.6],
}


async def _load(set_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], str]:
    from triage.reading.trace import read_trace
    from triage.search.index import Index
    from triage.search.local import LocalSearcher, Researcher
    from triage.settings import load_config
    from triage.sources.export_file import vote_shift
    from triage.sources.store import Store

    config = load_config(set_dir / "triage.toml")
    labels = [
        json.loads(line) for line in (set_dir / "labels.jsonl").read_text().splitlines() if line.strip()
    ]
    lines = [line for line in (set_dir / "traces.jsonl").read_text().splitlines() if line.strip()]
    index = Index.from_folders(config.index)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "s.sqlite") as db:
        db.import_lines(lines, "evalset", shift=vote_shift(set_dir / "traces.jsonl", datetime.now(UTC)))
        observations = db.observations([row["trace_id"] for row in labels])
    researcher = Researcher.configured(LocalSearcher(index), config)
    traces: dict[str, Any] = {}
    research: dict[str, Any] = {}
    comments = {row["trace_id"]: row.get("comment") for row in labels}
    for row in labels:
        obs = observations[row["trace_id"]]
        assert isinstance(obs, list)
        trace = read_trace(row["trace_id"], obs, config.tools)
        traces[row["trace_id"]] = trace
        if trace.searched:
            research[row["trace_id"]] = await researcher.research(
                trace, comments.get(row["trace_id"]) or None
            )
    return labels, traces, research, config.agent.issues_collection


#: the heuristic's signals per (trace, subject share): containment scores depend on nothing else,
#: every other threshold is read when the facts are made, so each trace is scored once per share
_SIGNALS: dict[tuple[str, float], Any] = {}
_ORIGINAL: list[Any] = []


async def _accuracy(
    labels: list[dict[str, Any]], traces: dict[str, Any], research: dict[str, Any], issues: str
) -> dict[str, float]:
    from triage.domain.ports import JudgeRequest
    from triage.domain.rule import Undetermined, decide
    from triage.engine.verdicts import empty_answer_facts
    from triage.judges import heuristic
    from triage.judges.offline import containment as cont

    judge = heuristic.HeuristicJudge()
    right: dict[str, list[int]] = {}
    for row in labels:
        trace = traces[row["trace_id"]]
        key = (row["trace_id"], cont.TOPIC_SHARE)
        if not _ORIGINAL:
            _ORIGINAL.append(heuristic.signals)
        if key not in _SIGNALS:
            _SIGNALS[key] = _ORIGINAL[0](trace, research.get(row["trace_id"]))
        heuristic.signals = lambda *_, key=key: _SIGNALS[key]  # type: ignore[assignment]
        facts = await judge.judge(JudgeRequest.of(trace, research.get(row["trace_id"])))
        if not trace.answer.strip():
            facts = empty_answer_facts(facts)
        try:
            ok = decide(facts, issues).value == row["layer"]
        except Undetermined:
            ok = False
        for group in (row.get("split") or "all", "all"):
            right.setdefault(group, []).append(int(ok))
    return {group: sum(v) / len(v) for group, v in right.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", type=Path, help="a set written by verify.py --write-set")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from triage.judges.offline import containment as cont

    labels, traces, research, issues = asyncio.run(_load(args.set))
    shipped = {name: getattr(cont, name) for name in GRID}
    base = asyncio.run(_accuracy(labels, traces, research, issues))
    print(f"shipped {shipped}: dev {base['dev']:.3f}, test {base['test']:.3f}")
    results: list[tuple[float, float, dict[str, float], dict[str, float]]] = []
    names = list(GRID)
    for values in itertools.product(*(GRID[n] for n in names)):
        point = dict(zip(names, values, strict=True))
        for name, value in point.items():
            setattr(cont, name, value)
        figures = asyncio.run(_accuracy(labels, traces, research, issues))
        distance = sum(abs(point[n] - shipped[n]) for n in names)
        results.append((figures["dev"], -distance, point, figures))
    for name, value in shipped.items():
        setattr(cont, name, value)
    results.sort(key=lambda r: (r[0], r[1]), reverse=True)
    print(f"\nbest {args.top} of {len(results)} by dev layer accuracy (ties: nearest the shipped values):")
    for dev, _, point, figures in results[: args.top]:
        print(f"  dev {dev:.3f}  test {figures['test']:.3f}  {point}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
