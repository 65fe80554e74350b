"""A search outage in the middle of a night, in real time (#37 items 3 and 4).

    python bench/outage.py                      # 1,200 thumbs-down, the search down 300 s mid-night
    python bench/outage.py --traces 300 --outage 90 --json /tmp/outage.json

Synthetic thumbs-down traces over ../shared/corpus (`bench/_traces.py`) in an embedded store, the
offline judge, the re-search over the corpus's embedded index. First an undisturbed night on its
own store; then the same night on a fresh store with the search down for `--outage` seconds,
starting once a third of the traces' searches are made (every search refused at once, as the
breakers refuse them), under cronjob.yaml's retry policy emulated: an attempt, and while it
exits other than 0, another 10 s then 20 s later (backoffLimit 2). Real time, real sleeps: the
suite's version is tests/engine/test_no_verdict_without_search.py, in virtual time.

Prints: the attempts (exit code, triaged, undecided, seconds), the traces whose layer differs from
the undisturbed night's (must be 0), the traces left untriaged (must be 0), and the traces the judge
was asked about more than once (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _traces import TraceFactory, corpus_missing, folders  # noqa: E402

from triage.app import run_setup  # noqa: E402
from triage.domain.outcome import RunResult  # noqa: E402
from triage.domain.ports import JudgeRequest  # noqa: E402
from triage.domain.records import Facts, Passage  # noqa: E402
from triage.engine.run import Sources, run_feedback  # noqa: E402
from triage.engine.stream import RunOptions  # noqa: E402
from triage.errors import ExitCode, SearchSuspended  # noqa: E402
from triage.judges.heuristic import HeuristicJudge  # noqa: E402
from triage.search.index import Index  # noqa: E402
from triage.search.local import LocalSearcher  # noqa: E402
from triage.settings import load_config  # noqa: E402
from triage.sources.store import Store  # noqa: E402

DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus"
BACK_OFFS = (0.0, 10.0, 20.0)  # cronjob.yaml: backoffLimit 2, Kubernetes' 10 s, 20 s back-off


class CountedJudge(HeuristicJudge):
    """The offline judge, counting the traces it is asked about (a model's bill)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: Counter[str] = Counter()

    async def judge(self, request: JudgeRequest) -> Facts:
        self.sent[request.trace.id] += 1
        return await super().judge(request)


class Outage:
    """The embedded index, down for `seconds` of real time from its `after`-th search on."""

    def __init__(self, inner: LocalSearcher, after: int, seconds: float) -> None:
        self.inner, self.after, self.seconds = inner, after, seconds
        self.searches = self.refused = 0
        self.began: float | None = None

    async def __aenter__(self) -> Outage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        self.searches += 1
        if self.began is None and self.searches > self.after:
            self.began = time.monotonic()
            print(f"  search down at search {self.searches}, for {self.seconds:g} s", file=sys.stderr)
        if self.began is not None and time.monotonic() < self.began + self.seconds:
            self.refused += 1
            raise SearchSuspended(collection, f"searches of the {collection} collection suspended: Search failed")
        return await self.inner.search(query, collection, top_k)


def _run(store: Store, judge: HeuristicJudge, searcher: Any) -> RunResult:
    options = RunOptions(now=datetime.now(UTC), write=True, concurrency=8, progress_seconds=30.0)
    return asyncio.run(
        run_feedback(sources=Sources.of(store), judge=judge, config=load_config(None), options=options,
        setup=run_setup(options, load_config(None)),
                     searcher=searcher)
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=1200)
    parser.add_argument("--outage", type=float, default=300.0, help="seconds the search is down")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if problem := corpus_missing(args.corpus):
        print(problem, file=sys.stderr)
        return 2
    factory = TraceFactory(args.corpus)
    lines = [json.dumps(r) for r in factory.records(args.traces, datetime.now(UTC))]
    index = Index.from_folders(folders(args.corpus))
    with tempfile.TemporaryDirectory() as tmp:
        with Store(Path(tmp) / "calm.sqlite") as calm:
            calm.import_lines(lines, "bench")
            started = time.monotonic()
            undisturbed = _run(calm, HeuristicJudge(), LocalSearcher(index))
            calm_seconds = time.monotonic() - started
        layers = {e.trace_id: e.layer.value for e in undisturbed.entries}
        print(f"undisturbed: {len(layers)} triaged in {calm_seconds:.1f} s", file=sys.stderr)

        judge = CountedJudge()
        outage = Outage(LocalSearcher(index), after=undisturbed.search_calls // 3, seconds=args.outage)
        attempts: list[dict[str, Any]] = []
        got: dict[str, str] = {}
        with Store(Path(tmp) / "night.sqlite") as night:
            night.import_lines(lines, "bench")
            for back_off in BACK_OFFS:
                time.sleep(back_off)
                started = time.monotonic()
                result = _run(night, judge, outage)
                got.update({e.trace_id: e.layer.value for e in result.entries})
                seconds = round(time.monotonic() - started, 1)
                attempts.append({"exit": int(result.exit_code), "triaged": len(result.entries),
                                 "undecided": len(result.skipped), "seconds": seconds})  # fmt: skip
                print(f"  attempt {len(attempts)}: {attempts[-1]}", file=sys.stderr)
                if result.exit_code == ExitCode.OK:
                    break
    figures = {
        "traces": args.traces,
        "outage_seconds": args.outage,
        "undisturbed_seconds": round(calm_seconds, 1),
        "attempts": attempts,
        "job": "complete" if attempts[-1]["exit"] == 0 else "failed",
        "searches_refused": outage.refused,
        "untriaged": len(set(layers) - set(got)),
        "layers_differing": sum(1 for t, layer in got.items() if layers.get(t) != layer),
        "judged_twice": sum(1 for n in judge.sent.values() if n > 1),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    ok = figures["untriaged"] == figures["layers_differing"] == figures["judged_twice"] == 0
    return 0 if ok and figures["job"] == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
