"""Queue-driven fakes of the ports (`triage.domain.ports`), in the manner of simonw/llm's `MockModel`:
a test `enqueue()`s what the next call answers (or raises) and reads back `history`.

- `FakeJudge`: a `Judge`; each `judge()` call takes the next queued facts update or exception.
- `FakeSearcher`: a `Searcher` (and its async context manager); queued results, or fixed `answers`.
- `FakeSource`: an in-memory `Backend` (votes, traces, scores) seeded from records, that keeps the
  scores written and fails the calls a test chooses.

A fake asked for something it was not given fails loudly (`AssertionError`, naming the call)
rather than inventing an answer. Inside a run the engine lists such a trace as an internal error.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from triage.domain.ports import JudgeRequest, SourceStats
from triage.domain.records import (
    Facts,
    Observation,
    Passage,
    StoredScore,
    UnreadableTrace,
    Usage,
    Vote,
    WriteOutcome,
)
from triage.domain.scores import ScoreBody, score_id
from triage.domain.votes import TraceRef, WindowVotes, in_window

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from triage.domain.ports import Backend, Judge, Searcher

# --------------------------------------------------------------------------- judge


@dataclass(frozen=True)
class JudgeCall:
    """One `judge()` call (its `JudgeRequest`) as the fake saw it."""

    trace_id: str
    research: list[Passage] | None
    comment: str | None
    grounding: bool
    base: Facts


class FakeJudge:
    """A `Judge` that answers from a queue.

    `enqueue({"retrieved_has_answer": True, ...})` makes the next call return the `base` facts it is
    given, updated with that dict (validated: an unknown field fails); `enqueue(JudgeError("..."))`
    makes it raise. With `trace_id=`, the answer is kept for that trace (so the order in which
    concurrent traces reach the judge does not matter); otherwise any trace takes it, in order.
    """

    def __init__(
        self,
        *,
        name: str = "fake",
        prompt_version: str | None = "fake-1",
        needs_research: bool = True,
        can_skip_grounding: bool = False,
        tokens_per_call: tuple[int, int] = (0, 0),
    ) -> None:
        self.name = name
        self.prompt_version = prompt_version
        self.needs_research = needs_research
        self.can_skip_grounding = can_skip_grounding
        self.tokens_per_call = tokens_per_call
        self.history: list[JudgeCall] = []
        self.closed = False
        self._queue: deque[dict[str, Any] | BaseException] = deque()
        self._by_trace: dict[str, deque[dict[str, Any] | BaseException]] = {}
        self._usage = Usage()

    @property
    def usage(self) -> Usage:
        """One call per answer returned, with `tokens_per_call` (input, output) tokens each."""
        return self._usage

    def enqueue(self, *answers: dict[str, Any] | BaseException, trace_id: str | None = None) -> FakeJudge:
        queue = self._queue if trace_id is None else self._by_trace.setdefault(trace_id, deque())
        queue.extend(answers)
        return self

    @property
    def pending(self) -> int:
        """Answers queued and not yet taken."""
        return len(self._queue) + sum(len(q) for q in self._by_trace.values())

    async def aclose(self) -> None:
        self.closed = True

    async def judge(self, request: JudgeRequest) -> Facts:
        trace, base = request.trace, request.base
        self.history.append(JudgeCall(trace.id, request.research, request.comment, request.grounding, base))
        queue = self._by_trace.get(trace.id) or self._queue
        if not queue:
            raise AssertionError(
                f"FakeJudge: judge() called for trace {trace.id!r} with no answer queued "
                f"(call {len(self.history)}); enqueue() one"
            )
        answer = queue.popleft()
        if isinstance(answer, BaseException):
            raise answer
        tokens_in, tokens_out = self.tokens_per_call
        self._usage.add(Usage(calls=1, input_tokens=tokens_in, output_tokens=tokens_out))
        return Facts.model_validate({**base.model_dump(), **answer})


# --------------------------------------------------------------------------- searcher


@dataclass(frozen=True)
class SearchCall:
    query: str
    collection: str
    top_k: int


def passage(
    text: str, url: str | None = None, collection: str | None = "docs", title: str | None = None
) -> Passage:
    """A passage as a searcher returns it (the researcher renumbers ids S1..)."""
    return Passage(id="P", text=text, source_url=url, collection=collection, title=title)


class FakeSearcher:
    """A `Searcher`, entered as an async context manager like the real ones.

    Each search takes the next `enqueue()`d result (a list of passages, or an exception to raise);
    with the queue empty it answers from `answers`, keyed by `(query, collection)` or by `query`
    (a query the mapping does not know finds nothing). With neither, a search fails the test.
    `enter_error` makes entering it fail (a search server that is down).
    """

    def __init__(
        self,
        answers: Mapping[str | tuple[str, str], Sequence[Passage]] | None = None,
        *,
        enter_error: BaseException | None = None,
    ) -> None:
        self.answers = answers
        self.enter_error = enter_error
        self.history: list[SearchCall] = []
        self.entered = 0
        self.exited = 0
        self._queue: deque[Sequence[Passage] | BaseException] = deque()

    def enqueue(self, *results: Sequence[Passage] | BaseException) -> FakeSearcher:
        self._queue.extend(results)
        return self

    async def __aenter__(self) -> FakeSearcher:
        self.entered += 1
        if self.enter_error is not None:
            raise self.enter_error
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.exited += 1

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        self.history.append(SearchCall(query, collection, top_k))
        if self._queue:
            result = self._queue.popleft()
            if isinstance(result, BaseException):
                raise result
            return list(result)
        if self.answers is None:
            raise AssertionError(
                f"FakeSearcher: search({query!r}, {collection!r}) with nothing queued and no answers"
            )
        found = self.answers.get((query, collection), self.answers.get(query, []))
        return list(found)


# --------------------------------------------------------------------------- source


@dataclass(frozen=True)
class SourceCall:
    method: str
    args: tuple[Any, ...]


_IO_METHODS = frozenset({"votes", "session_traces", "observations", "triaged", "write_scores", "scores"})


class FakeSource:
    """An in-memory `Backend`: votes, observations and scores, with `history` and `stats`.

    Every call but `trace_url` counts as one request in `stats`. `fail(method, error, ...)` makes
    the next calls of `method` raise those errors, in order; `lose(trace_id, ...)` makes writes on
    those traces come back unconfirmed (in `WriteOutcome.failed`), as a write that never lands.
    Written scores are kept in `stored` (by id, upserted) and every batch in `write_batches`.
    """

    def __init__(
        self,
        *,
        votes: Iterable[Vote] = (),
        observations: Iterable[Observation] = (),
        sessions: Mapping[str, Sequence[str]] | None = None,
        triaged: Iterable[str] = (),
        vote_name: str = "user_feedback",
        url_base: str | None = "https://langfuse.test/traces/",
    ) -> None:
        self.stats = SourceStats()
        self.vote_name = vote_name
        self.url_base = url_base
        self._votes = list(votes)
        self._observations: dict[str, list[Observation]] = {}
        for obs in observations:
            self._observations.setdefault(obs.trace_id, []).append(obs)
        self._sessions = {s: list(t) for s, t in sessions.items()} if sessions is not None else None
        self._triaged = set(triaged)
        self.history: list[SourceCall] = []
        self.stored: dict[str, ScoreBody] = {}
        self.write_batches: list[list[ScoreBody]] = []
        self._failures: dict[str, deque[BaseException]] = {}
        self._lost: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], **kwargs: Any) -> FakeSource:
        """Seeded from rows in the import format (`tests.factories.trace_line`, `session_vote`):
        `{"traceId", "observations": [...], "scores": [...]}`. Scores named `vote_name` become votes."""
        vote_name = kwargs.get("vote_name", "user_feedback")
        observations: list[Observation] = []
        votes: list[Vote] = []
        for row in rows:
            for obs in row.get("observations") or []:
                data = {**obs, "traceId": obs.get("traceId") or row.get("traceId")}
                for key in ("input", "output"):
                    if data.get(key) is not None and not isinstance(data[key], str):
                        data[key] = json.dumps(data[key])
                observations.append(Observation.model_validate(data))
            for score in row.get("scores") or []:
                if score.get("name") == vote_name:
                    votes.append(_vote(score))
        return cls(votes=votes, observations=observations, **kwargs)

    # -- test controls ------------------------------------------------------------------------

    def fail(self, method: str, *errors: BaseException) -> FakeSource:
        """The next calls of `method` raise `errors`, one per call."""
        if method not in _IO_METHODS:
            raise ValueError(f"FakeSource has no failing method {method!r}; one of {sorted(_IO_METHODS)}")
        with self._lock:
            self._failures.setdefault(method, deque()).extend(errors)
        return self

    def lose(self, *trace_ids: str, reason: str = "not readable after 60 s") -> FakeSource:
        """Writes of scores on these traces are not confirmed (reported failed with `reason`)."""
        with self._lock:
            self._lost.update(dict.fromkeys(trace_ids, reason))
        return self

    def calls(self, method: str) -> list[SourceCall]:
        return [c for c in self.history if c.method == method]

    def written(self, name: str | None = None) -> list[ScoreBody]:
        """The confirmed scores, by trace id then name; only those named `name` if given."""
        found = [s for s in self.stored.values() if name is None or s.name == name]
        return sorted(found, key=lambda s: (s.trace_id, s.name))

    def _call(self, method: str, *args: Any) -> None:
        with self._lock:
            self.history.append(SourceCall(method, args))
            if method in _IO_METHODS:
                self.stats.count_request()
            failures = self._failures.get(method)
            error = failures.popleft() if failures else None
        if error is not None:
            raise error

    # -- ScoreReader ----------------------------------------------------------------------------

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        self._call("scores", list(names), start, end)
        with self._lock:
            rows = [s for s in self.stored.values() if s.name in names and start <= s.timestamp < end]
        return [
            StoredScore(id=s.id, name=s.name, trace_id=s.trace_id, data_type=s.data_type, value=s.value,
                        comment=s.comment, metadata=s.metadata, source="API", timestamp=s.timestamp)
            for s in sorted(rows, key=lambda s: (s.timestamp, s.id))
        ]  # fmt: skip

    # -- VoteSource ---------------------------------------------------------------------------

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        self._call("votes", score_name, start, end)
        if score_name != self.vote_name:
            return WindowVotes(votes=[])
        found = [v for v in self._votes if in_window(v.timestamp, v.updated_at, start, end)]
        return WindowVotes(votes=sorted(found, key=lambda v: (v.timestamp, v.id)))

    # -- TraceSource --------------------------------------------------------------------------

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        self._call("session_traces", tuple(session_ids))
        roots: dict[str, datetime] = {}  # trace id -> its root's start
        starts: dict[str, dict[str, datetime]] = {s: {} for s in session_ids}
        for trace_id, observations in self._observations.items():
            for obs in observations:
                if obs.parent_observation_id is None:
                    roots[trace_id] = min(obs.start_time, roots.get(trace_id, obs.start_time))
                    if obs.session_id in starts:
                        starts[obs.session_id][trace_id] = roots[trace_id]
        if self._sessions is not None:  # the order given; a start where the trace's root is known
            return {
                s: [TraceRef(trace_id=t, session_id=s, start_time=roots.get(t)) for t in self._sessions.get(s, [])]
                for s in session_ids
            }
        return {
            s: [
                TraceRef(trace_id=t, session_id=s, start_time=start)
                for t, start in sorted(traces.items(), key=lambda kv: (kv[1], kv[0]))
            ]
            for s, traces in starts.items()
        }

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        self._call("observations", tuple(trace_ids))
        return {t: list(self._observations.get(t, [])) for t in trace_ids}

    def trace_url(self, trace_id: str) -> str | None:
        self._call("trace_url", trace_id)
        return None if self.url_base is None else f"{self.url_base}{trace_id}"

    # -- ScoreSink ----------------------------------------------------------------------------

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        self._call("triaged", tuple(trace_ids), score_name, rule_version)
        with self._lock:
            return {
                t
                for t in trace_ids
                if t in self._triaged or score_id(t, score_name, rule_version) in self.stored
            }

    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        self._call("write_scores", tuple(scores))
        outcome = WriteOutcome()
        with self._lock:
            self.write_batches.append(list(scores))
            for score in scores:
                if score.trace_id in self._lost:
                    outcome.failed[score.id] = self._lost[score.trace_id]
                else:
                    self.stored[score.id] = score
                    outcome.confirmed.append(score.id)
        return outcome


def _vote(score: Mapping[str, Any]) -> Vote:
    metadata = score.get("metadata") if isinstance(score.get("metadata"), dict) else {}
    turn = metadata.get("turn") if metadata else None
    trace_id = score.get("traceId")
    return Vote(
        id=score["id"],
        trace_id=trace_id,
        session_id=None if trace_id else score.get("sessionId"),
        turn=int(turn) if isinstance(turn, int | str) and str(turn).isdigit() else None,
        value=float(score["value"]),
        comment=score.get("comment"),
        user_id=score.get("userId"),
        timestamp=_time(score["timestamp"]),
        updated_at=_time(score["updatedAt"]) if score.get("updatedAt") else None,
        environment=score.get("environment") or "default",
    )


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))


if TYPE_CHECKING:
    # mypy checks that the fakes satisfy the ports
    _judge: Judge = FakeJudge()
    _searcher: Searcher = FakeSearcher()
    _searcher_cm: AbstractAsyncContextManager[Searcher] = FakeSearcher()
    _backend: Backend = FakeSource()
