"""The three outside systems the job talks to, as small interfaces.

- `Backend`: where votes, traces and scores live (Langfuse, or the embedded SQLite store).
  Synchronous; the pipeline calls it from a worker thread, in batches.
- `Searcher`: an independent search of the index (MCP server, or the embedded index in-process).
- `Judge`: turns a trace (and the re-searched passages) into `Facts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from .models import Facts, Observation, Passage, ScoreWrite, Trace, Usage, Vote, WriteOutcome


@runtime_checkable
class Backend(Protocol):
    """Votes in, traces in, scores out."""

    #: requests made to the outside system so far (0 for an embedded store)
    request_count: int

    def votes(self, score_name: str, start: datetime, end: datetime) -> list[Vote]:
        """Every current vote named `score_name` with a timestamp in [start, end), newest row per id."""
        ...

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        """For each session, its trace ids ordered by the start time of their root observations."""
        ...

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation]]:
        """The observations of each trace, de-duplicated by id keeping the newest row."""
        ...

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        """The trace ids that already carry a `score_name` score written under `rule_version`."""
        ...

    def write_scores(self, scores: Sequence[ScoreWrite]) -> WriteOutcome:
        """Write scores and confirm each by reading it back."""
        ...

    def trace_url(self, trace_id: str) -> str | None:
        """A link to the trace in a UI, where there is one."""
        ...


class Searcher(Protocol):
    """One search of one collection. Raises `SearchError` when the search cannot be made."""

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]: ...


class Judge(Protocol):
    """Establishes facts about one trace. Raises `JudgeError` (or `JudgeRejected`)."""

    #: stored with every verdict, e.g. "heuristic", "llm:gpt-4o-mini", "replay:facts.jsonl"
    name: str
    #: the version of the prompts (or rules) that produced the facts
    prompt_version: str | None
    #: False for a judge that needs no re-search (a replay)
    needs_research: bool

    @property
    def usage(self) -> Usage:
        """Model calls and tokens spent so far."""
        ...

    async def judge(
        self, trace: Trace, research: list[Passage] | None, comment: str | None, base: Facts
    ) -> Facts:
        """Return `base` (the facts the trace proves) completed with the judged facts."""
        ...
