"""Per-trace state stays bounded: after K traces the judge and the search caches hold O(1) of them.

The nightly run's memory grew with the window partly because the LLM judge kept a `Usage` per
trace id for the whole run (read by no sink), and because reading the window's votes held every
score row twice over (the window read, then the re-read by id) before any became a `Vote`. These
tests count, rather than time or weigh: the sizes of every container the judge owns must not grow
from K to 3K traces, the caches never pass their bound, and the score rows alive while the votes
are read are about a page's worth. The model is an `httpx.MockTransport` answering with the honest scripted
replies of `tests.doubles.openai_server.keyword_responder` (no server, no sleep).
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
import weakref
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest

from tests.doubles.fakes import FakeJudge, FakeSearcher, FakeSource, passage
from tests.doubles.langfuse_server import LangfuseStandIn, iso
from tests.doubles.openai_server import keyword_responder
from tests.factories import NOW, trace_line
from triage.app import run_setup
from triage.domain.outcome import Entry, RunResult
from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Layer, Passage, ToolCall, Trace, Vote
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.judges.llm import LLMJudge
from triage.judges.model import replies
from triage.judges.model.exchange import RecentUsage
from triage.judges.offline import text as text_module
from triage.search.local import Researcher
from triage.search.mcp_client import McpSearcher
from triage.settings import load_config
from triage.sources.langfuse.backend import LangfuseBackend
from triage.sources.langfuse.reads import SCORES_PAGE, ScoreReads
from triage.sources.langfuse.wire import ScoreRow

COMPONENTS = load_config().components
TEXT = "Set parallelTrialCount in the Experiment spec to run more Katib trials at the same time."


def _completion(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    reply = keyword_responder(body)
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(reply)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        },
    )


def _trace(n: int) -> Trace:
    passages = [
        Passage(
            id="R1",
            source_url="https://www.kubeflow.org/docs/components/katib/experiment/",
            collection="docs",
            title="Katib experiments",
            text=f"{TEXT} (variant {n})",
        )
    ]
    output = f"### Result 1\n**Source:** {passages[0].source_url}\n\n{passages[0].text}"
    call = ToolCall(
        id="o1", name="search_kubeflow_docs", args={"query": f"katib {n}"}, output=output, collection="docs"
    )
    return Trace(
        id=f"trace-{n:05d}",
        question=f"How do I run more Katib trials in parallel, case {n}?",
        answer="Set `parallelTrialCount` in the Experiment spec.",
        tool_calls=[call],
        passages=passages,
    )


def _research(n: int) -> list[Passage]:
    return [
        Passage(
            id="S1",
            source_url="https://www.kubeflow.org/docs/components/katib/",
            collection="docs",
            text=f"{TEXT} {n}",
        )
    ]


def _sizes(
    obj: Any, path: str = "judge", depth: int = 3, seen: set[int] | None = None
) -> Iterator[tuple[str, int]]:
    """(attribute path, len) of every container reachable through triage-owned objects' attributes."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    for name, value in vars(obj).items():
        where = f"{path}.{name}"
        if isinstance(value, Mapping | list | set | tuple | dict):
            yield where, len(value)
        if type(value).__module__.startswith("triage.") and hasattr(value, "__dict__"):
            yield from _sizes(value, where, depth - 1, seen)


async def _judge_range(judge: LLMJudge, start: int, stop: int) -> None:
    for n in range(start, stop):
        trace = _trace(n)
        base = Facts(agent_searched=True, agent_searched_collections=["docs"])
        facts = await judge.judge(JudgeRequest(trace, _research(n), "it did not say where", base))
        assert facts.retrieved_has_answer is not None  # a real, verified exchange


@pytest.mark.anyio
async def test_llm_judge_holds_constant_state_per_trace() -> None:
    transport = httpx.MockTransport(_completion)
    async with openai.AsyncOpenAI(
        base_url="http://judge.test/v1", api_key="test", http_client=httpx.AsyncClient(transport=transport)
    ) as client:
        judge = LLMJudge(client=client, model="judge-test", components=COMPONENTS, recent_traces=8)
        await _judge_range(judge, 0, 20)
        after_k = dict(_sizes(judge))
        await _judge_range(judge, 20, 60)
        after_3k = dict(_sizes(judge))

    grown = {k: (after_k.get(k), v) for k, v in after_3k.items() if v > after_k.get(k, 0)}
    assert not grown, f"judge state grew with the number of traces: {grown}"
    # the run's totals are still exact
    assert (judge.usage.calls, judge.usage.input_tokens, judge.usage.output_tokens) == (120, 12000, 2400)
    # the most recent traces' own usage is still there, the oldest is forgotten
    assert len(judge.usage_by_trace) == 8
    assert judge.usage_by_trace["trace-00059"].calls == 2
    assert "trace-00000" not in judge.usage_by_trace
    # the containment schema is built once per set combination, not per trace
    assert replies._containment_schema.cache_info().currsize <= 16


def test_recent_usage_is_bounded_and_keeps_in_flight_counts() -> None:
    recent = RecentUsage(limit=3)
    first = recent.start("a")
    for name in "bcdef":
        recent.start(name).calls += 1
    first.calls += 2  # a trace still being judged keeps counting into its own record
    assert list(recent) == ["d", "e", "f"]
    assert first.calls == 2
    assert recent.start("f") is recent["f"]  # judged again: the same record
    assert recent.setdefault("f") is recent["f"]
    with pytest.raises(ValueError):
        RecentUsage(limit=0)


@pytest.mark.anyio
async def test_researcher_cache_is_bounded() -> None:
    searcher = FakeSearcher(answers={})
    researcher = Researcher(searcher, ["docs", "code"], top_k=5, use_comment=True, cache_size=16)
    for n in range(100):
        trace = _trace(n)
        await researcher.research(trace, f"comment {n}")
    assert len(researcher._cache) <= 16
    # every query new (the question, with the comment, the agent's query): nothing from the cache
    assert researcher.calls == 100 * 2 * 3


@pytest.mark.anyio
async def test_mcp_result_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    searcher = McpSearcher(
        url="http://search.test/mcp", tools={"search_kubeflow_docs": "docs"}, cache_size=32
    )

    async def call(tool: str, query: str, collection: str, top_k: int) -> list[Passage]:
        return [passage(f"{query} result {i}", url=f"https://example.test/{i}") for i in range(top_k)]

    monkeypatch.setattr(searcher, "_call", call)
    for n in range(200):
        found = await searcher.search(f"question {n}", "docs", 5)
        assert len(found) == 5
    assert await searcher.search("question 199", "docs", 5)  # a repeat is answered from the cache
    assert searcher.cache_hits == 1
    assert len(searcher._cache) <= 32
    assert not searcher._inflight


def _vote_record(n: int, now: datetime) -> dict[str, Any]:
    """A trace with no observations and one thumbs-down vote (all the vote read needs)."""
    score = {
        "id": f"vote-{n:05d}",
        "name": "user_feedback",
        "dataType": "BOOLEAN",
        "value": 0,
        "comment": f"did not answer my question ({n})",
        "traceId": f"trace-{n:05d}",
        "timestamp": iso(now - timedelta(hours=2, seconds=n)),
        "userId": "voter-1",
        "metadata": {"page": "docs", "n": n},
        "environment": "production",
    }
    return {"traceId": f"trace-{n:05d}", "observations": [], "scores": [score]}


def test_reading_the_votes_holds_a_page_of_score_rows_not_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of the window (and of the re-read by id) become votes page by page: the score rows
    alive at any point are about a page's worth, however many votes the window holds."""
    now = datetime.now(UTC).replace(microsecond=0)
    votes_in_window = 6 * SCORES_PAGE
    refs: dict[int, weakref.ref[ScoreRow]] = {}  # one per score row still alive
    most = 0
    rows = ScoreReads.rows

    def counted_rows(self: ScoreReads, what: str, **params: Any) -> Iterator[ScoreRow]:
        nonlocal most
        for row in rows(self, what, **params):
            key = id(row)
            refs[key] = weakref.ref(row, lambda _, key=key: refs.pop(key, None))
            most = max(most, len(refs))
            yield row
            del row

    monkeypatch.setattr(ScoreReads, "rows", counted_rows)
    with LangfuseStandIn() as server:
        server.load(_vote_record(n, now) for n in range(votes_in_window))
        with LangfuseBackend(
            public_key=server.public_key,
            secret_key=server.secret_key,
            base_url=server.url,
            timeout=5.0,
            deadline_seconds=10.0,
        ) as backend:
            votes = backend.votes("user_feedback", now - timedelta(days=1), now).votes
    assert len(votes) == votes_in_window and all(v.is_thumbs_down for v in votes)
    assert votes[0].comment == f"did not answer my question ({votes_in_window - 1})"  # oldest first
    # a page being read and one re-read chunk at most (the old code held all 600, then 1,200)
    assert most <= 2 * SCORES_PAGE, f"{most} score rows alive at once for {votes_in_window} votes"


def test_a_vote_held_until_its_trace_is_triaged_carries_no_per_instance_dict() -> None:
    """Every vote of the window is held until its trace is done: a slotted record, no dict or set."""
    vote = Vote(id="v1", value=0.0, timestamp=datetime.now(UTC), trace_id="t1")
    assert not hasattr(vote, "__dict__")
    assert vote.is_thumbs_down
    with pytest.raises(ValueError):
        Vote(id="v2", value=0.0, timestamp=datetime.now(UTC), session_id="s1", turn=-1)


def test_signature_scores_are_written_a_batch_at_a_time() -> None:
    """The worklist's signature scores go out `batch_size` at a time, like the verdicts: each write
    is confirmed by reading it back, and the whole window's scores with their read-back rows at
    once grew with the window. Every trace still gets its signature score."""
    traces = 35
    rows = [
        trace_line(
            f"t{n:03d}",
            f"How do I run more Katib trials in parallel, case {n}?",
            "Set `parallelTrialCount` in the Experiment spec.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/components/katib/", f"{TEXT} {n}")],
        )
        for n in range(traces)
    ]
    source = FakeSource.from_rows(rows)
    judge = FakeJudge()
    for _ in range(traces):
        judge.enqueue({"retrieved_has_answer": True, "answer_grounded": True, "answer_declined": False})
    config = load_config()
    result = asyncio.run(
        run_feedback(
            sources=Sources.of(source),
            judge=judge,
            config=config,
            options=RunOptions(now=NOW, concurrency=2, batch_size=10, progress_seconds=0.0, write=True),
            setup=run_setup(
                RunOptions(now=NOW, concurrency=2, batch_size=10, progress_seconds=0.0, write=True),
                config,
            ),
        )
    )
    # the last batch also carries the run's marker (`engine.run.RUN_MARKER`): it costs no request
    signature_batches = [
        [s for s in batch if s.name == config.scores.signature]
        for batch in source.write_batches
        if batch and batch[0].name == config.scores.signature
    ]
    assert [len(batch) for batch in signature_batches] == [10, 10, 10, 5]
    assert result.signatures_written == traces
    assert len(source.written(config.scores.signature)) == traces


def test_an_entry_held_until_the_run_ends_carries_no_per_instance_dict() -> None:
    """Every entry of the window is held until the run ends (the report, the worklist)."""
    entry = Entry(
        trace_id="t1", layer=Layer.OK, component="katib", owners=[], reason="", question="", comments=[], url=None
    )
    assert not hasattr(entry, "__dict__") and not hasattr(entry.findings, "__dict__")
    entry.signature = "sig-1"  # still filled in after the run (the worklist)
    with pytest.raises(AttributeError):
        entry.note = "x"  # type: ignore[attr-defined]


def _big_result(n: int) -> RunResult:
    start = datetime(2026, 11, 30, 3, tzinfo=UTC)
    entries = [
        Entry(
            trace_id=f"t{i}",
            layer=Layer.RETRIEVAL,
            component="katib",
            owners=["kubeflow/docs-agent"],
            reason="The passages do not hold the answer.",
            question=TEXT,
            comments=[TEXT * 8],
            url=None,
        )
        for i in range(n)
    ]
    return RunResult(start=start, end=start + timedelta(hours=24), entries=entries)


def test_the_run_result_has_a_short_repr() -> None:
    result = _big_result(2000)
    text = repr(result)
    assert len(text) < 300
    assert "2000 entries" in text and "exit 0" in text


def test_asyncio_run_returning_the_result_allocates_no_copy_of_it() -> None:
    """`asyncio.run` on the main thread puts SIGINT's handler back at the end; on Python 3.11 that
    formats the old handler (a partial holding the task, whose repr holds its result's repr) into
    an error message. With a dataclass repr of every entry, that was the nightly run's peak RSS
    (a transient of ~10 KB per trace, just before the summary)."""
    result = _big_result(2000)

    async def run() -> RunResult:
        return result

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        assert asyncio.run(run()) is result
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"asyncio.run allocated {peak} bytes around a result of 2,000 entries"


def test_the_word_set_memo_is_bounded_in_entries_and_in_text_length() -> None:
    """The offline judge's word sets are remembered (a chunk recurs across traces) by the text's
    digest, never the text; never for a very long text, and never more than the memo's entries."""
    memo = text_module._word_sets
    memo.clear()
    for i in range(memo.size + 500):
        text_module.word_set(f"chunk {i} " + "katib experiment trial parallelism " * 40)
    assert len(memo) == memo.size
    assert all(len(key) == 16 for key in memo._seen)  # digests: no text is kept alive
    memo.clear()
    long_text = "katib " * (memo.max_chars // 6 + 1)
    assert len(long_text) > memo.max_chars
    assert text_module.word_set(long_text) == frozenset({"katib"})
    assert len(memo) == 0


def test_word_union_is_the_word_set_of_the_joined_texts() -> None:
    texts = ["Katib's earlyStopping works", "with the StdOut\ncollector", "GPUs, TPUs and ＫＦＰ"]
    texts.append("設定のSparkApplication")
    assert text_module.word_union(texts) == text_module.word_set("\n".join(texts))


def test_squash_joined_is_the_squash_of_the_joined_texts() -> None:
    texts = ["  Katib  Trials \n", "", "   ", "\tEarly\nStopping ", "ＫＦＰ Ünïcode"]
    assert text_module.squash_joined(texts) == text_module.squash("\n".join(texts))
    assert text_module.squash_joined([]) == text_module.squash("")
