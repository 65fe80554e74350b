"""The Langfuse source: votes and traces in, triage scores out (see ../shared/notes/langfuse.md).

Calls are plain JSON requests on an injected httpx client, in the shapes of the `langfuse` SDK
5.x's REST client (score POSTs as a list, or one object each for servers that speak the older
contract; v3 score reads, v2 observation reads, the legacy trace and session reads). The SDK
itself is not imported: see `http`. The parts: `http` (plumbing, retries), `scores` and `traces` (reads),
`writes` (both write contracts and the read-back), `links` (UI links), `wire` (shapes, mapping),
`annotations` (score configs and annotation queues for `triage queue`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx

from triage.domain.conversations import TraceRef
from triage.domain.datasets import DatasetItem, DatasetWriteOutcome
from triage.domain.ports import SourceStats
from triage.domain.records import Observation, StoredScore, UnreadableTrace, WriteOutcome
from triage.domain.scores import ScoreBody
from triage.domain.votes import WindowVotes
from triage.errors import ConfigError
from triage.retry import Budget, Clock, RetryPolicy
from triage.sources.langfuse.annotations import LangfuseAnnotations
from triage.sources.langfuse.datasets import DatasetWrites
from triage.sources.langfuse.http import LANGFUSE_RETRY, LangfuseHttp
from triage.sources.langfuse.links import LINKS_RETRY, TraceLinks
from triage.sources.langfuse.scores import VOTE_LOOKBACK, ScoreReads
from triage.sources.langfuse.traces import TraceReads
from triage.sources.langfuse.writes import ScoreWrites


class LangfuseBackend:
    """Vote source, trace source and score sink on Langfuse's public API (`triage.domain.ports`).

    Synchronous; safe to share between threads. Open it (`with`) before use: opening reads the
    project id for trace links, so `trace_url` never does I/O.
    """

    def __init__(
        self,
        *,
        public_key: str,
        secret_key: str,
        base_url: str,
        timeout: float = 30.0,
        deadline_seconds: float = 90.0,
        confirm_wait_seconds: float = 60.0,
        httpx_client: httpx.Client | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        confirm_first_wait: float = 1.0,
        clock: Clock | None = None,
        budget: Budget | None = None,
        vote_lookback: timedelta = VOTE_LOOKBACK,
    ) -> None:
        """`vote_lookback`: how far before a window a vote read reaches for votes changed in it
        (they keep their first timestamp; `ScoreReads.votes`)."""
        if not public_key or not secret_key:
            raise ConfigError("Langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY")
        self.stats = SourceStats()
        self.retry: RetryPolicy = LANGFUSE_RETRY.with_(
            deadline=deadline_seconds, initial=backoff_initial, maximum=backoff_max, clock=clock, budget=budget
        )
        self._http = LangfuseHttp(
            public_key=public_key,
            secret_key=secret_key,
            base_url=base_url,
            timeout=timeout,
            retry=self.retry,
            stats=self.stats,
            httpx_client=httpx_client,
        )
        self.base_url = self._http.base_url
        self._scores = ScoreReads(self._http, vote_lookback)
        self._traces = TraceReads(self._http)
        self._writes = ScoreWrites(
            self._http,
            self._scores,
            confirm_wait=confirm_wait_seconds,
            confirm_first_wait=confirm_first_wait,
            clock=clock,
        )
        self._links = TraceLinks(self.base_url)
        self._datasets = DatasetWrites(self._http)
        self._links_retry = LINKS_RETRY.with_(clock=clock, budget=budget)

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> LangfuseBackend:
        """Resolve what later calls need without I/O (the project id for links)."""
        self._links.resolve(self._http, self._links_retry)
        return self

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LangfuseBackend:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def annotations(self) -> LangfuseAnnotations:
        """Score configs, annotation queues and the job's decisions, on the same client (`triage queue`)."""
        return LangfuseAnnotations(self._http)

    # -- VoteSource -----------------------------------------------------------------------------

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        return self._scores.votes(score_name, start, end)

    # -- TraceSource ----------------------------------------------------------------------------

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        return self._traces.session_traces(session_ids)

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        return self._traces.observations(trace_ids)

    def trace_url(self, trace_id: str) -> str | None:
        return self._links.url(trace_id)

    def root_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        return self._traces.root_traces(start, end)

    # -- ScoreSink ------------------------------------------------------------------------------

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        return self._scores.triaged(trace_ids, score_name, rule_version)

    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        return self._writes.write(scores)

    # -- ScoreReader ----------------------------------------------------------------------------

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        return self._scores.scores(names, start, end)

    # -- DatasetSink (`triage promote`) ----------------------------------------------------------

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        return self._datasets.ensure_dataset(name, description, metadata)

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        return self._datasets.dataset_items(name)

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        return self._datasets.upsert_dataset_items(items)
