"""The outside systems the engine talks to, as small ports.

- `VoteSource`: where users' votes are read (Langfuse, or the embedded SQLite store).
- `TraceSource`: where traces are read, with links to them in a UI.
- `ScoreSink`: where triage scores are written, and which traces already carry one.
- `ScoreReader`: every score of some names in a window (people's labels, the job's own verdicts).
- `ReleaseSource`: the answers per release of a window, where a trace belongs, the votes cast in
  a window (the release watch: `triage releases`, the report's Releases section).
  `ReadsInTraceOrder`: its votes and the job's scores in trace order, a page at a time, for a
  source that can sort them (the embedded store): the watch's memory is then the releases'.
- `Searcher`: an independent search of the index (the MCP server, or the embedded index).
- `Judge`: turns a trace (and the re-searched passages) into `Facts`, asked by one `JudgeRequest`.
- `SearchMore`: a judge's own follow-up search, in its words, for the trace it is judging.
- `DatasetRuns`: `triage check`'s dataset runs (Langfuse's experiment runs, or the embedded
  store's `dataset_runs`): the runs of a dataset, a run's results, a run's new results.

The three data ports are synchronous (the engine calls them from a worker thread, in batches);
Langfuse and the store implement all three, and count their requests in a `SourceStats`.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from triage.domain.checks import CheckRun, RunItemResult
from triage.domain.records import (
    Facts,
    Observation,
    Passage,
    StoredScore,
    Trace,
    UnreadableTrace,
    Usage,
    Vote,
    WriteOutcome,
)
from triage.domain.release_counts import ReleaseAnswers, TracePlace
from triage.domain.scores import ScoreBody
from triage.domain.votes import TraceRef, WindowVotes
from triage.domain.worklist import DatasetWriteOutcome


@dataclass
class SourceStats:
    """Counters of one outside system. Thread-safe: a source is shared between worker threads."""

    #: requests made so far, retries included (0 for an embedded store)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1


class VoteSource(Protocol):
    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """Every current vote named `score_name` cast or changed in [start, end) (`votes.in_window`),
        newest row per id; and the rows of that name that cannot be read, each with its reason."""
        ...


class TraceSource(Protocol):
    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        """For each session, its traces with the start time of their root observations, in that
        order (ties by id): a turn indexes it, a vote without one is placed by time
        (`votes.rated_trace`)."""
        ...

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        """The observations of each trace, de-duplicated by id keeping the newest row; or why a
        trace's rows cannot be read (that trace alone)."""
        ...

    def trace_url(self, trace_id: str) -> str | None:
        """A link to the trace in a UI, where there is one. No I/O: the link base is resolved when
        the source opens, so this is safe on the event loop."""
        ...

    def root_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        """Every trace whose root observation started in [start, end), with its session (`triage votes`)."""
        ...


class ScoreSink(Protocol):
    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        """The trace ids that already carry a `score_name` score written under `rule_version`."""
        ...

    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        """Write scores and confirm each by reading it back."""
        ...


class ScoreReader(Protocol):
    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        """The current row of every score with one of `names` timestamped in [start, end)."""
        ...


@runtime_checkable
class DatasetRuns(Protocol):
    """Where `triage check` keeps its runs, beside the dataset's items (Langfuse, the embedded store).
    Synchronous, like the data ports."""

    def dataset_runs(self, dataset: str) -> list[CheckRun]:
        """Every run of the dataset, newest first; [] when it has none (or there is no dataset)."""
        ...

    def dataset_run_results(self, run: CheckRun) -> dict[str, RunItemResult]:
        """The run's results by dataset item id; a case in the run whose result cannot be read
        has no outcome."""
        ...

    def write_dataset_run(self, run: CheckRun, results: Sequence[RunItemResult]) -> DatasetWriteOutcome:
        """Add these results to the run (made when missing), each linked to its trace; a case the
        run already holds is never added twice (`triage check` calls this once per batch as its
        cases finish, and two runs of one name may call it at once). A result the run holds
        DECIDED (a pass or a fail) is final; one it holds undecided is replaced by the result sent.
        A result too large for the store is never sent: `RunItemResult.of` clips it.
        `written`/`failed` are by dataset item id."""
        ...


@runtime_checkable
class ReleaseSource(Protocol):
    """What the release watch reads besides votes' and verdicts' scores (Langfuse, the embedded store)."""

    def release_answers(self, start: datetime, end: datetime) -> ReleaseAnswers:
        """The answers (traces) started in [start, end) per release, as cheaply as the source can
        count them (Langfuse: its metrics API, else paging the traces), and how they were counted."""
        ...

    def trace_places(self, trace_ids: Sequence[str]) -> dict[str, TracePlace]:
        """Each trace's release, version and start; a trace the source does not know is left out."""
        ...

    def cast_votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The votes named `score_name` cast in [start, end), the current row of each (no look-back
        for votes changed later: the release watch counts an answer's vote in its own window)."""
        ...


@runtime_checkable
class ReadsInTraceOrder(Protocol):
    """A `ReleaseSource` that reads the window's votes and scores sorted by trace id, as it goes
    (never the whole window at once): the release watch counts each trace as its rows arrive."""

    def votes_in_trace_order(self, score_name: str, start: datetime, end: datetime) -> Iterator[Vote]:
        """`cast_votes(...).votes` sorted by `trace_id`, the votes on a session (no trace) first."""
        ...

    def scores_in_trace_order(self, names: Sequence[str], start: datetime, end: datetime) -> Iterator[StoredScore]:
        """`ScoreReader.scores` sorted by `trace_id`, the scores on no trace first."""
        ...


@runtime_checkable
class PacedSource(Protocol):
    """A source that keeps a request budget (Langfuse's `[langfuse]`): it says what a night of
    `traces` more traces costs in requests and time, printed before the run starts."""

    def request_plan(self, traces: int) -> str | None:
        """One sentence for the log; None when no budget is set."""
        ...


class Backend(VoteSource, TraceSource, ScoreSink, ScoreReader, Protocol):
    """One system that is all four (Langfuse, the embedded store), with its counters."""

    stats: SourceStats


class Searcher(Protocol):
    """One search of one collection. Raises `SearchError` when the search cannot be made."""

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]: ...


#: a judge's follow-up search for one trace: its queries (in the index's vocabulary, where the
#: question's words missed) against every collection, the passages not yet seen, numbered on from
#: the re-search's S ids; [] when nothing new was found or the search failed
SearchMore = Callable[[Sequence[str]], Awaitable[list[Passage]]]


@dataclass(frozen=True)
class JudgeRequest:
    """One trace to judge: what the judge may read, and which facts it is asked to establish."""

    trace: Trace
    #: the passages the re-search found (S1..); None when there was no re-search
    research: list[Passage] | None
    #: the users' comments on the trace, joined; never evidence, only the complaint
    comment: str | None
    #: the facts already known, to be completed: those the trace proves, or a cascade's settled ones
    base: Facts
    #: establish `answer_grounded` and `answer_declined`; False keeps them as in `base` where the
    #: judge `can_skip_grounding` (a judge that cannot skip them establishes them anyway)
    grounding: bool = True
    #: establish the containment facts; False keeps them as in `base` (a cascade that settled them)
    containment: bool = True
    #: the judge's own follow-up search, for when the passages it was given do not hold the answer
    search_more: SearchMore | None = None

    @classmethod
    def of(
        cls,
        trace: Trace,
        research: list[Passage] | None = None,
        comment: str | None = None,
        *,
        search_more: SearchMore | None = None,
    ) -> JudgeRequest:
        """A request for every fact, from the facts the trace itself proves."""
        base = Facts(agent_searched=trace.searched, agent_searched_collections=sorted(trace.searched_collections))
        return cls(trace, research, comment, base, search_more=search_more)


class Judge(Protocol):
    """Establishes facts about one trace. Raises `JudgeError` (or `JudgeRejected`)."""

    #: stored with every verdict, e.g. "heuristic", "llm:gpt-4o-mini", "replay:facts.jsonl"
    name: str
    #: the version of the prompts (or rules) that produced the facts
    prompt_version: str | None
    #: False for a judge that needs no re-search (a replay)
    needs_research: bool
    #: True when `grounding=False` saves work (the LLM judge skips its grounding call)
    can_skip_grounding: bool

    @property
    def usage(self) -> Usage:
        """Model calls and tokens spent so far."""
        ...

    async def judge(self, request: JudgeRequest) -> Facts:
        """Return `request.base` completed with the judged facts, as the request asks."""
        ...

    async def aclose(self) -> None:
        """Release what the judge holds (a model client's connections), on the run's event loop."""
        ...
