"""The streaming part of a run: read traces in batches, judge them concurrently, write in batches.

    produce (one task)  --traces queue-->  work (`concurrency` tasks)  --scores queue-->  write (one task)

Both queues are bounded, so memory stays flat however large the window: when judging lags, reads
wait; when writes lag, judges wait.
"""

from __future__ import annotations

import asyncio
import logging

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry
from triage.domain.ports import ScoreSink, TraceSource
from triage.domain.records import Observation, Trace, UnreadableTrace, Vote
from triage.domain.scores import ScoreBody
from triage.engine.ledger import Ledger
from triage.engine.options import RunOptions
from triage.engine.progress import Progress
from triage.engine.verdicts import VerdictMaker
from triage.errors import ConfigError, InputError, SourceError, TriageError, leaves
from triage.reading.trace import read_trace

log = logging.getLogger("triage")

STOPPED = "the run was stopped (SIGTERM) before this trace was triaged"

_Written = tuple[Entry, list[ScoreBody], list[Vote]]


class Stream:
    """One pass over `trace_ids`; each trace's votes travel with it and are dropped once it is done."""

    def __init__(
        self,
        *,
        traces: TraceSource,
        scores: ScoreSink,
        config: TriageConfig,
        options: RunOptions,
        ledger: Ledger,
        verdicts: VerdictMaker,
        stop: asyncio.Event,
    ) -> None:
        self.traces, self.scores, self.config, self.options = traces, scores, config, options
        self.ledger, self.verdicts, self.stop = ledger, verdicts, stop
        # one batch ahead of the judges is enough: the next read (one request) lands long before a
        # batch is judged, and every queued trace holds its tool outputs and passages
        self._traces: asyncio.Queue[tuple[Trace, list[Vote]] | None] = asyncio.Queue(
            maxsize=options.batch_size
        )
        self._scores: asyncio.Queue[_Written | None] = asyncio.Queue(maxsize=2 * options.batch_size)
        self.progress = Progress(0, options.progress_seconds)

    async def run(self, by_trace: dict[str, list[Vote]], trace_ids: list[str]) -> None:
        self.progress = Progress(len(trace_ids), self.options.progress_seconds)
        try:
            # a failure anywhere (refused credentials) cancels the rest instead of leaving it blocked
            async with asyncio.TaskGroup() as everything:
                everything.create_task(self._write())
                async with asyncio.TaskGroup() as readers_and_judges:
                    readers_and_judges.create_task(self._produce(by_trace, trace_ids))
                    for _ in range(self.options.concurrency):
                        readers_and_judges.create_task(self._work())
                await self._scores.put(None)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        self.progress.tick(force=True)

    # -- reading ------------------------------------------------------------------------------

    def _read(self, chunk: list[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        return self.traces.observations(chunk)

    async def _produce(self, by_trace: dict[str, list[Vote]], trace_ids: list[str]) -> None:
        size = self.options.batch_size
        for i in range(0, len(trace_ids), size):
            chunk = trace_ids[i : i + size]
            if self.stop.is_set():
                for trace_id in chunk:
                    self.ledger.skip(by_trace.pop(trace_id), trace_id, "unavailable", STOPPED)
                continue
            try:
                found = await asyncio.to_thread(self._read, chunk)
            except SourceError as ex:  # refused credentials (ConfigError) are not: they end the run
                for trace_id in chunk:
                    reason = f"could not read the trace: {ex}"
                    self.ledger.skip(by_trace.pop(trace_id), trace_id, "unavailable", reason)
                    self.progress.tick()
                continue
            for trace_id in chunk:
                votes = by_trace.pop(trace_id)
                url = self.traces.trace_url(trace_id)
                rows = found.pop(trace_id, [])  # the raw rows go once read, not after the whole batch
                if isinstance(rows, UnreadableTrace):
                    self.ledger.skip(votes, trace_id, "bad_input", rows.reason)
                    self.progress.tick()
                    continue
                try:
                    trace = read_trace(trace_id, rows, self.config.tools, url)
                except InputError as ex:
                    self.ledger.skip(votes, trace_id, "bad_input", str(ex))
                    self.progress.tick()
                    continue
                except Exception as ex:
                    # a reader bug on one trace must not cost the others their triage: list it, go on
                    log.exception("internal error reading trace %s", trace_id, extra={"event": "error"})
                    reason = f"internal error reading the trace: {type(ex).__name__}: {ex}"
                    self.ledger.skip(votes, trace_id, "error", reason)
                    self.progress.tick()
                    continue
                await self._traces.put((trace, votes))
        for _ in range(self.options.concurrency):
            await self._traces.put(None)

    # -- judging ------------------------------------------------------------------------------

    async def _work(self) -> None:
        while (item := await self._traces.get()) is not None:
            trace, votes = item
            if self.stop.is_set():
                self.ledger.skip(votes, trace.id, "unavailable", STOPPED, trace.question)
                continue
            try:
                outcome = await self.verdicts.triage(trace, votes)
            except ConfigError:
                raise  # refused credentials fail every trace alike: end the run (exit 3)
            except Exception as ex:
                # a bug must not cost the other traces their triage: list this one, go on
                log.exception("internal error on trace %s", trace.id, extra={"event": "error"})
                reason = f"internal error: {type(ex).__name__}: {ex}"
                self.ledger.skip(votes, trace.id, "error", reason, trace.question)
                outcome = None
            if outcome is not None:
                entry, writes = outcome
                self.ledger.add(entry)
                if self.options.write:
                    await self._scores.put((entry, writes, votes))
            self.progress.tick()

    # -- writing ------------------------------------------------------------------------------

    async def _write(self) -> None:
        batch: list[_Written] = []
        while (item := await self._scores.get()) is not None:
            batch.append(item)
            if len(batch) >= self.options.batch_size:
                await self._flush(batch)
                batch = []
        if batch:
            await self._flush(batch)

    async def _flush(self, batch: list[_Written]) -> None:
        writes = [w for _, ws, _ in batch for w in ws]
        try:
            outcome = await asyncio.to_thread(self.scores.write_scores, writes)
            confirmed, failed = set(outcome.confirmed), outcome.failed
        except SourceError as ex:
            confirmed, failed = set(), {w.id: str(ex) for w in writes}
        for entry, ws, votes in batch:
            missing = [failed.get(w.id, "not confirmed") for w in ws if w.id not in confirmed]
            if missing:
                self.ledger.skip(
                    votes,
                    entry.trace_id,
                    "not_written",
                    f"triaged as {entry.layer.value}, but the score was not written: {missing[0]}",
                    entry.question,
                )
            else:
                entry.written = True
                self.ledger.result.written += len(ws)


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report out of nested task groups: a `TriageError` (it has an exit code) first."""
    errors = leaves(group)
    return next((e for e in errors if isinstance(e, TriageError)), errors[0])
