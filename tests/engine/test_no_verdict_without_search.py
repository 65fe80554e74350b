"""No verdict without its evidence, and no vote left behind by an outage (#37 items 3 and 4).

- a trace whose re-search did not happen in full (the server down from the start, one collection
  suspended, the search gone for minutes mid-night) is never decided from less evidence: it is
  left undecided with the reason and never sent to the judge, and the rerun gives it exactly the
  layer an undisturbed run gives (the demo's 29 with the offline judge; 1,200 generated traces);
- a search outage of five minutes in the middle of a 1,200-trace night is waited out under the
  CronJob's retry policy (three attempts, 10 s and 20 s apart, emulated) in virtual time: every
  thumbs-down triaged, the layers of an undisturbed run, no trace sent to the model twice;
- the next night takes up what a failed night left (the window reaches back to the last complete
  run's marker, at most the lookback), and never redoes what was triaged.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.fakes import FakeSource, passage
from tests.factories import NOW, trace_line
from triage.app import DEMO_DIR, demo_index_folders, demo_shift, run_setup
from triage.domain.config import TriageConfig
from triage.domain.kernel import window
from triage.domain.outcome import RunResult
from triage.domain.ports import Judge, JudgeRequest, Searcher
from triage.domain.records import Facts, Passage, ToolCall, Trace, Usage
from triage.engine.run import RUN_MARKER, Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.engine.verdicts import OutageWait, needs_research
from triage.errors import ExitCode, SearchError, SearchSuspended
from triage.judges.heuristic import HeuristicJudge
from triage.retry import use_clock
from triage.search.index import Index
from triage.search.local import LocalSearcher
from triage.settings import load_config
from triage.sources.store import Store

# -- the doubles: a judge that counts what it is sent, and searches that fail ------------------


class Counted:
    """A judge whose every request is counted per trace, as a model's bill would be."""

    def __init__(self, inner: Judge, sent: Counter[str] | None = None) -> None:
        self.inner = inner
        self.name, self.prompt_version = inner.name, inner.prompt_version
        self.needs_research, self.can_skip_grounding = inner.needs_research, inner.can_skip_grounding
        self.sent: Counter[str] = sent if sent is not None else Counter()

    @property
    def usage(self) -> Usage:
        return self.inner.usage

    async def judge(self, request: JudgeRequest) -> Facts:
        self.sent[request.trace.id] += 1
        return await self.inner.judge(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ResearchJudge:
    """A stand-in model whose facts rest on the re-search, as a model's do (and the offline
    judge's: its word pool and its better-passage-elsewhere check): shown less, it says otherwise.
    Cheap, so a 1,200-trace night runs in seconds."""

    name: str = "research-model"
    prompt_version: str | None = "r-1"
    needs_research: bool = True
    can_skip_grounding: bool = False

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.usage = Usage()

    async def judge(self, request: JudgeRequest) -> Facts:
        self.sent[request.trace.id] += 1
        h = int(hashlib.sha256(request.trace.id.encode()).hexdigest()[:8], 16)
        found = request.research or []
        docs = [p for p in found if p.collection == "docs"]
        issues = [p for p in found if p.collection == "issues"]
        return request.base.model_copy(
            update={
                # a clearly better passage elsewhere (in the docs) says the agent's was not it
                "retrieved_has_answer": h % 4 == 0 or (h % 4 == 1 and not docs),
                "index_has_answer": bool(docs or issues) and h % 3 != 0,
                "answer_collection": "issues" if issues and not docs else "docs",
                "answer_grounded": h % 2 == 0,
                "answer_declined": h % 5 == 0,
            }
        )

    async def aclose(self) -> None:
        return None


class Synthetic:
    """A search server over nothing: each (query, collection) finds a passage or none, by hash."""

    async def __aenter__(self) -> Synthetic:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        h = int(hashlib.sha256(f"{query}|{collection}".encode()).hexdigest()[:8], 16)
        if h % 3 == 0:
            return []
        return [passage(f"{collection} passage {h % 97}", f"https://example.org/{collection}/{h % 97}", collection)]


class DownFromStart:
    """A search server that cannot be reached when the run opens it."""

    async def __aenter__(self) -> Searcher:
        raise SearchError("search server unreachable at http://127.0.0.1:9/mcp")

    async def __aexit__(self, *exc: object) -> None:
        return None


class Suspended:
    """Every collection answers but `collection`, whose breaker is open."""

    def __init__(self, inner: Any, collection: str) -> None:
        self.inner, self.collection = inner, collection

    async def __aenter__(self) -> Suspended:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        if collection == self.collection:
            raise SearchSuspended(collection, f"searches of the {collection} collection suspended: Search failed")
        result: list[Passage] = await self.inner.search(query, collection, top_k)
        return result


class Outage:
    """The inner search, down (every search fails at once, as the breakers refuse them) from its
    `after`-th search on, for `seconds` of `clock`'s time."""

    def __init__(self, inner: Any, clock: VirtualClock, after: int, seconds: float) -> None:
        self.inner, self.clock, self.after, self.seconds = inner, clock, after, seconds
        self.searches = 0
        self.refused = 0
        self.began: float | None = None

    async def __aenter__(self) -> Outage:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        self.searches += 1
        if self.began is None and self.searches > self.after:
            self.began = self.clock.monotonic()
        if self.began is not None and self.clock.monotonic() < self.began + self.seconds:
            self.refused += 1
            raise SearchSuspended(collection, f"searches of the {collection} collection suspended: Search failed")
        result: list[Passage] = await self.inner.search(query, collection, top_k)
        return result


def _run(backend: Any, judge: Any, searcher: Any, config: TriageConfig | None = None, **options: Any) -> RunResult:
    settings: dict[str, Any] = {"now": NOW, "write": True, "concurrency": 4, "progress_seconds": 3600.0, **options}
    return asyncio.run(
        run_feedback(
            sources=Sources.of(backend),
            judge=judge,
            config=config or load_config(),
            options=RunOptions(**settings), setup=run_setup(RunOptions(**settings), config or load_config()),
            searcher=searcher,
        )
    )


def _layers(*results: RunResult) -> dict[str, str]:
    return {e.trace_id: e.layer.value for r in results for e in r.entries}


# -- the demo's 29, with the offline judge ------------------------------------------------------


def _demo_store(path: Path) -> Store:
    traces = DEMO_DIR / "traces.jsonl"
    store = Store(path)
    store.import_file(traces, shift=demo_shift(traces, NOW))
    return store


def _demo_index() -> LocalSearcher:
    return LocalSearcher(Index.from_folders(demo_index_folders()))


Disturb = Callable[[LocalSearcher, VirtualClock], Any]
DISTURBANCES: dict[str, Disturb] = {
    "down from the start": lambda index, clock: DownFromStart(),
    "the issues collection suspended": lambda index, clock: Suspended(index, "issues"),
    "down for 5 minutes after 40 searches": lambda index, clock: Outage(index, clock, after=40, seconds=300.0),
}


@pytest.mark.parametrize("disturbance", sorted(DISTURBANCES))
def test_the_demo_with_the_search_disturbed_then_up_gets_the_undisturbed_layers(
    tmp_path: Path, disturbance: str
) -> None:
    with _demo_store(tmp_path / "calm.sqlite") as calm:
        undisturbed = _layers(_run(calm, HeuristicJudge(), _demo_index()))
    assert len(undisturbed) == 29

    clock = VirtualClock(start=NOW)
    judge = Counted(HeuristicJudge())
    with use_clock(clock), _demo_store(tmp_path / "night.sqlite") as night:
        first = _run(night, judge, DISTURBANCES[disturbance](_demo_index(), clock))
        second = _run(night, judge, _demo_index())

    # what the disturbed run decided, it decided as an undisturbed run does; the rest it listed
    assert {t: undisturbed[t] for t in _layers(first)} == _layers(first)
    for listed in first.skipped:
        assert listed.undecided.kind == "unavailable", listed.undecided
        assert listed.undecided.reason.startswith("search unavailable ("), listed.undecided.reason
    # the rerun finishes the rest, redoing nothing: together, exactly the undisturbed layers
    assert second.already_triaged == len(first.entries)
    assert _layers(first, second) == undisturbed
    assert second.exit_code == ExitCode.OK and second.skipped == []
    # no trace sent to the judge twice (a model's bill), none sent without its re-search
    assert max(judge.sent.values()) == 1
    if disturbance == "down from the start":
        # only a trace that made no search call needs no re-search (the rule reads no judged fact)
        assert set(_layers(first).values()) == {"agent_skipped_retrieval"} and len(first.entries) == 4
        assert len(first.skipped) == 25 and first.exit_code == ExitCode.DEGRADED
    if disturbance.startswith("down for"):
        # waited out in the run itself: nothing left for the rerun
        assert first.exit_code == ExitCode.OK and len(first.entries) == 29 and clock.elapsed >= 300.0


# -- a 1,200-trace night with the search down 5 minutes in the middle ---------------------------

TOPICS = ("Katib trials", "pipeline caching", "notebook culling", "profile contributors", "metrics collectors")


def _night_rows(n: int, at_hours: float = 2.0, prefix: str = "t") -> list[dict[str, Any]]:
    """`n` thumbs-down traces, every question distinct; one in ten made no search call."""
    rows = []
    for i in range(n):
        searches = [] if i % 10 == 0 else [("search_kubeflow_docs", f"https://example.org/docs/{i}", "Pipelines.")]
        question = f"How do I configure {TOPICS[i % len(TOPICS)]} (case {prefix}{i})?"
        rows.append(trace_line(f"{prefix}{i:04d}", question, "Set it in the spec.", searches,
                               at=NOW - timedelta(hours=at_hours)))  # fmt: skip
    return rows


def _job(source: FakeSource, judge: Any, searcher: Any, clock: VirtualClock) -> list[RunResult]:
    """The Job under cronjob.yaml's retry policy, emulated: an attempt, and while it fails (exit
    other than 0) another 10 s, then 20 s later (backoffLimit 2), each a process of its own."""
    attempts = []
    for back_off in (0.0, 10.0, 20.0):
        clock.sleep(back_off)
        attempts.append(_run(source, judge, searcher, now=clock.now(), concurrency=8, batch_size=100))
        if attempts[-1].exit_code == ExitCode.OK:
            break
    return attempts


def test_a_five_minute_search_outage_mid_night_is_waited_out_under_the_jobs_retry_policy() -> None:
    n = 1200
    rows = _night_rows(n)
    calm_judge = ResearchJudge()
    undisturbed = _layers(_run(FakeSource.from_rows(rows), calm_judge, Synthetic(), concurrency=8))
    assert len(undisturbed) == n and len(set(undisturbed.values())) >= 5

    clock = VirtualClock(start=NOW)
    judge = ResearchJudge()
    source = FakeSource.from_rows(rows)
    searcher = Outage(Synthetic(), clock, after=5000, seconds=300.0)  # about the 550th trace's searches
    with use_clock(clock):
        attempts = _job(source, judge, searcher, clock)

    assert searcher.began is not None and searcher.refused > 0  # the outage happened, mid-night
    assert len(attempts) == 1 and attempts[0].exit_code == ExitCode.OK, attempts[-1].skipped[:3]
    assert clock.elapsed >= 300.0  # the run waited it out, in virtual time
    # every thumbs-down triaged, each with the layer of an undisturbed night
    assert _layers(*attempts) == undisturbed
    # no trace sent to the model twice, and none sent while its re-search was missing
    assert max(judge.sent.values()) == 1 and sum(judge.sent.values()) == sum(calm_judge.sent.values())


def test_an_outage_longer_than_the_wait_leaves_undecided_and_the_rerun_finishes_exactly() -> None:
    n = 300
    rows = _night_rows(n)
    undisturbed = _layers(_run(FakeSource.from_rows(rows), ResearchJudge(), Synthetic(), concurrency=8))

    clock = VirtualClock(start=NOW)
    judge = ResearchJudge()
    source = FakeSource.from_rows(rows)
    # down for two hours from the 1,000th search: past the run's wait and all three attempts
    searcher = Outage(Synthetic(), clock, after=1000, seconds=7200.0)
    with use_clock(clock):
        attempts = _job(source, judge, searcher, clock)
        assert [a.exit_code for a in attempts] == [ExitCode.DEGRADED] * 3
        clock.sleep(7200.0)
        rerun = _run(source, judge, searcher, now=clock.now(), concurrency=8)
    # whatever was decided during the outage is as the undisturbed night has it; the rest the
    # rerun finishes, each trace judged once in all
    assert rerun.exit_code == ExitCode.OK
    assert _layers(*attempts, rerun) == undisturbed
    assert max(judge.sent.values()) == 1
    # listed with the reason: the search, never a judge that could not tell
    assert all(s.undecided.reason.startswith("search unavailable (") for a in attempts for s in a.skipped)


# -- the next night takes up what a failed night left ------------------------------------------


def test_the_night_after_a_failed_one_takes_up_its_thumbs_down_and_redoes_nothing() -> None:
    rows = [
        *_night_rows(20, at_hours=26.0, prefix="a"),  # night 0's (before NOW - 24 h)
        *_night_rows(30, at_hours=2.0, prefix="b"),  # night 1's
        *_night_rows(10, at_hours=-22.0, prefix="c"),  # night 2's
    ]
    source = FakeSource.from_rows(rows)
    judge = ResearchJudge()
    night0 = _run(source, judge, Synthetic(), now=NOW - timedelta(hours=24))
    assert night0.exit_code == ExitCode.OK and len(night0.entries) == 20
    assert [s.name for s in source.stored.values()].count(RUN_MARKER) == 1  # complete: marked
    night1 = _run(source, judge, DownFromStart())  # the search down all night, and for its retries
    assert night1.exit_code == ExitCode.DEGRADED and len(night1.skipped) == 27
    assert [s.name for s in source.stored.values()].count(RUN_MARKER) == 1  # incomplete: no marker
    night2 = _run(source, judge, Synthetic(), now=NOW + timedelta(hours=24))

    # night 2's window reaches back to where night 0 ended: night 1's thumbs-down are in it
    assert night2.start == night0.end - timedelta(minutes=load_config().window.overlap_minutes)
    assert sorted(e.trace_id for e in night2.entries) == sorted(
        [s.undecided.trace_id or "" for s in night1.skipped] + [f"c{i:04d}" for i in range(10)]
    )
    assert night2.already_triaged == 3  # night 1's own verdicts (no search call), not redone
    assert night2.exit_code == ExitCode.OK and max(judge.sent.values()) == 1


def test_a_dry_run_and_a_first_run_keep_the_nights_window() -> None:
    source = FakeSource.from_rows(_night_rows(3, at_hours=30.0))  # older than the night
    for write in (False, True):
        result = _run(source, ResearchJudge(), Synthetic(), write=write)
        assert result.start == window(NOW, 24, lag_minutes=15, overlap_minutes=60)[0]
        assert result.entries == []


def test_the_window_reaches_back_to_the_last_complete_run_at_most_the_lookback() -> None:
    end = NOW - timedelta(minutes=15)
    night = window(NOW, 24, lag_minutes=15, overlap_minutes=60)
    assert night == (end - timedelta(hours=25), end)
    # two nights ago: back to it, with the overlap
    since = end - timedelta(hours=48)
    assert window(NOW, 24, lag_minutes=15, overlap_minutes=60, since=since, lookback_days=7)[0] == since - timedelta(
        hours=1
    )
    # ten days ago: the lookback bounds it
    since = end - timedelta(days=10)
    assert window(NOW, 24, lag_minutes=15, overlap_minutes=60, since=since, lookback_days=7)[0] == end - timedelta(
        days=7
    )
    # last night's run: the night's window, never shorter
    since = end - timedelta(hours=2)
    assert window(NOW, 24, lag_minutes=15, overlap_minutes=60, since=since, lookback_days=7) == night


# -- which traces need the re-search, and the wait's end ---------------------------------------


def test_only_a_trace_with_no_search_call_is_decided_without_the_re_search() -> None:

    def trace(calls: list[ToolCall]) -> Trace:
        return Trace(id="t", question="q?", answer="a.", tool_calls=calls)

    searched = ToolCall(id="c", name="search_kubeflow_docs", args={"query": "q"}, collection="docs")
    fetched = ToolCall(id="f", name="fetch_url", args={"url": "https://x"})
    assert needs_research(trace([searched]), "issues")
    assert not needs_research(trace([]), "issues") and not needs_research(trace([fetched]), "issues")


def test_sigterm_ends_the_wait_for_the_search_at_once() -> None:
    async def scenario() -> tuple[bool, bool, float]:
        clock = VirtualClock()
        stop = asyncio.Event()
        wait = OutageWait(seconds=600.0, stop=stop, clock=clock)
        first = await wait.again("down")  # a turn waited
        stop.set()
        return first, await wait.again("down"), clock.elapsed

    first, after_sigterm, waited = asyncio.run(scenario())
    assert first and not after_sigterm and waited == 15.0


def test_a_search_down_when_the_night_starts_is_waited_for_with_a_new_searcher_each_turn() -> None:
    """A search outage that began before 03:00 was not waited for (a searcher is entered once): the
    night listed every trace that needs it and the Job's retries, 30 s apart, met the same outage.
    Now the run opens a new searcher every turn of the run's one wait."""
    n = 200
    rows = _night_rows(n)
    calm = ResearchJudge()
    undisturbed = _layers(_run(FakeSource.from_rows(rows), calm, Synthetic(), concurrency=8))
    clock = VirtualClock(start=NOW)
    opened: list[float] = []

    def reopen() -> Any:
        opened.append(clock.elapsed)
        return DownFromStart() if clock.elapsed < 120.0 else Synthetic()  # back after two minutes

    judge = ResearchJudge()
    with use_clock(clock):
        result = asyncio.run(
            run_feedback(
                sources=Sources.of(FakeSource.from_rows(rows)),
                judge=judge,
                config=load_config(),
                options=RunOptions(now=NOW, write=True, concurrency=8, progress_seconds=3600.0),
                setup=run_setup(
                    RunOptions(now=NOW, write=True, concurrency=8, progress_seconds=3600.0),
                    load_config(),
                ),
                searcher=DownFromStart(),
                reopen=reopen,
            )
        )
    assert result.exit_code == ExitCode.OK, result.skipped[:3]
    assert _layers(result) == undisturbed
    assert 120.0 <= clock.elapsed < 200.0 and len(opened) >= 8  # a try every 15 s, then up
    assert max(judge.sent.values()) == 1 and sum(judge.sent.values()) == sum(calm.sent.values())


def test_a_search_down_at_the_start_for_longer_than_the_wait_is_listed_once_the_wait_is_spent() -> None:
    rows = _night_rows(20)
    clock = VirtualClock(start=NOW)
    config = load_config()
    config = config.model_copy(update={"search": config.search.model_copy(update={"outage_wait_seconds": 60.0})})
    judge = ResearchJudge()
    with use_clock(clock):
        result = asyncio.run(
            run_feedback(
                sources=Sources.of(FakeSource.from_rows(rows)),
                judge=judge,
                config=config,
                options=RunOptions(now=NOW, write=True, concurrency=4, progress_seconds=3600.0),
                setup=run_setup(RunOptions(now=NOW, write=True, concurrency=4, progress_seconds=3600.0), config),
                searcher=DownFromStart(),
                reopen=DownFromStart,
            )
        )
    assert result.exit_code == ExitCode.DEGRADED
    assert 60.0 <= clock.elapsed < 80.0  # the run's one wait, not one per trace
    assert sum(judge.sent.values()) == 0  # nothing judged without its re-search
