"""The streaming part of a run: read traces in batches, judge them concurrently, write in batches.

    produce (one task)  --traces queue-->  work (`concurrency` tasks)  --scores queue-->  write (one task)

Both queues are bounded, so memory stays flat however large the window: when judging lags, reads
wait; when writes lag, judges wait.

How a run is asked for (`RunOptions`): the window's length, writing, concurrency, shard and facts file.

`now` is a field of every command's options record (this one, and calibrate's, queue's, promote's,
votes' and eval's): the moment the window ends at, the current time unless a caller fixes it.

A progress line every few seconds, for a log read without a terminal (`Progress`).

Each trace goes to `engine.verdicts.VerdictMaker` (one trace to one verdict) and ends in the run's
`Ledger`, triaged or listed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry, Shard
from triage.domain.ports import ScoreSink, TraceSource
from triage.domain.records import (
    Observation,
    Trace,
    UnreadableTrace,
    Vote,
)
from triage.domain.scores import ScoreBody
from triage.engine.verdicts import Ledger, VerdictMaker
from triage.errors import (
    ConfigError,
    InputError,
    SourceError,
    TriageError,
    leaves,
)
from triage.reading.trace import read_trace


@dataclass
class RunOptions:
    since_hours: float = 24.0
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    write: bool = False
    force: bool = False
    concurrency: int = 8
    batch_size: int = 100
    shard: Shard = field(default_factory=Shard)
    facts_file: Path | None = None
    progress_seconds: float = 5.0
    #: `--batch`: the model judge's calls go through the Batch API (`judges.model.rounds`); the run
    #: then judges up to its cap of traces at once, so their calls share a round
    batch_mode: bool = False


log = logging.getLogger("triage")


class Progress:
    """done/total, rate and ETA, logged at most every `every` seconds (and once at the end)."""

    def __init__(self, total: int, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.every, self.clock = total, every, clock
        self.started = self.last = clock()
        self.done = 0

    def tick(self, force: bool = False) -> None:
        self.done += 0 if force else 1
        now = self.clock()
        if not force and now - self.last < self.every:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        log.info(
            "progress %d/%d (%d%%) %.1f traces/s ETA %ds",
            self.done,
            self.total,
            100 * self.done // max(self.total, 1),
            rate,
            round(eta),
            extra={"event": "progress", "done": self.done, "total": self.total},
        )


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
        # a trace per worker: `concurrency` judged while as many more search (`VerdictMaker`'s two
        # gates). Batch mode's traces all wait on one round at once: no gate may hold one back
        self.workers = options.concurrency * (1 if options.batch_mode else 2)

    async def run(self, by_trace: dict[str, list[Vote]], trace_ids: list[str]) -> None:
        self.progress = Progress(len(trace_ids), self.options.progress_seconds)
        try:
            # a failure anywhere (refused credentials) cancels the rest instead of leaving it blocked
            async with asyncio.TaskGroup() as everything:
                everything.create_task(self._write())
                async with asyncio.TaskGroup() as readers_and_judges:
                    readers_and_judges.create_task(self._produce(by_trace, trace_ids))
                    for _ in range(self.workers):
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
        for _ in range(self.workers):
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
                self.ledger.wrote(len(ws))


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report out of nested task groups: a `TriageError` (it has an exit code) first."""
    errors = leaves(group)
    return next((e for e in errors if isinstance(e, TriageError)), errors[0])
