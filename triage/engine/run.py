"""The nightly job: votes in, verdicts and scores out. `run_feedback` is the one core call.

Every thumbs-down ends either triaged (and written, with `write`), or listed as `Undecided` with a
reason. The flow: read the window's votes, group them by trace (sessions resolved), drop traces
already triaged under this rule version, then stream the rest (`triage.engine.stream`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta

from triage.domain.config import TriageConfig
from triage.domain.outcome import RunResult
from triage.domain.ports import (
    Backend,
    Judge,
    ScoreReader,
    ScoreSink,
    Searcher,
    SourceStats,
    TraceSource,
    VoteSource,
)
from triage.domain.records import WriteOutcome
from triage.engine.ledger import Ledger
from triage.engine.lifecycle import open_searcher, stop_on_sigterm
from triage.engine.options import RunOptions, window
from triage.engine.sessions import votes_by_trace
from triage.engine.stream import Stream
from triage.engine.verdicts import VerdictMaker
from triage.engine.worklist import build_worklist, signature_batches
from triage.errors import SourceError
from triage.judges.heuristic import HeuristicJudge
from triage.retry import Budget
from triage.search.local import Researcher
from triage.sinks.exports import open_facts_file

log = logging.getLogger("triage")

TRIAGED_PER_READ = 100


@dataclass(frozen=True)
class Sources:
    """Where a run reads votes and traces and writes scores, and whose requests it counts."""

    votes: VoteSource
    traces: TraceSource
    scores: ScoreSink
    stats: SourceStats
    #: the scores of earlier nights (signatures, trends); None: no worklist
    history: ScoreReader | None = None

    @classmethod
    def of(cls, backend: Backend) -> Sources:
        """All of them from one system (Langfuse, or the embedded store)."""
        return cls(votes=backend, traces=backend, scores=backend, stats=backend.stats, history=backend)


async def run_feedback(
    *,
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    searcher: AbstractAsyncContextManager[Searcher] | None = None,
    budget: Budget | None = None,
) -> RunResult:
    """Triage every thumbs-down in the window. The one core function behind `triage feedback`.

    SIGTERM, from the first read on, stops new work: traces in flight finish and are written, the
    rest are listed, and `budget` (shared with the outside systems' retries) is cancelled so no
    call waits out a back-off while the Pod's grace period runs."""
    stop = asyncio.Event()  # set on SIGTERM
    with stop_on_sigterm(stop, budget):
        return await _run(sources, judge, config, options, searcher, stop)


async def _run(
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    searcher: AbstractAsyncContextManager[Searcher] | None,
    stop: asyncio.Event,
) -> RunResult:
    started = time.monotonic()
    start, end = window(options, config)
    result = RunResult(
        start=start,
        end=end,
        write=options.write,
        judge=judge.name,
        shard=options.shard,
        input_price=config.judge.input_price_per_mtok,
        output_price=config.judge.output_price_per_mtok,
    )
    log.info(
        "window %s .. %s, judge %s%s",
        start.isoformat(timespec="minutes"),
        end.isoformat(timespec="minutes"),
        judge.name,
        f", shard {options.shard.index}/{options.shard.count}" if options.shard.count > 1 else "",
        extra={"event": "start"},
    )
    read = await asyncio.to_thread(sources.votes.votes, config.scores.vote, start, end)
    result.votes_seen = len(read.votes) + len(read.bad)
    down = [
        v for v in read.votes if v.is_thumbs_down and options.shard.owns(v.trace_id or f"session:{v.session_id}")
    ]
    # a row that cannot be read may be a thumbs-down: listed as bad input, never a crash
    unreadable = [b for b in read.bad if b.may_be_thumbs_down and options.shard.owns(b.subject)]
    result.thumbs_down = len(down) + len(unreadable)
    del read

    ledger = Ledger(result, sources.traces)
    for bad in unreadable:
        ledger.unreadable(bad)
    with open_facts_file(options.facts_file) as facts_out:
        async with open_searcher(searcher if judge.needs_research else None) as (live, down_reason):
            researcher = Researcher.configured(live, config) if live is not None else None
            verdicts = VerdictMaker(
                judge=judge,
                no_search_judge=HeuristicJudge(),
                config=config,
                ledger=ledger,
                researcher=researcher,
                search_down=down_reason if judge.needs_research else None,
                facts_out=facts_out,
                concurrency=options.concurrency,
            )
            by_trace = await asyncio.to_thread(votes_by_trace, sources.traces, down, ledger)
            # from here each trace's votes travel with it and are dropped once it is done, so memory
            # stays flat however large the window
            del down
            trace_ids = sorted(by_trace)
            if not options.force and trace_ids:
                done = await _already_triaged(sources.scores, trace_ids, config)
                result.already_triaged = len(done)
                trace_ids = [t for t in trace_ids if t not in done]
                for trace_id in done:
                    del by_trace[trace_id]
            log.info(
                "%d votes, %d thumbs-down on %d traces; %d already triaged, %d to triage",
                result.votes_seen,
                result.thumbs_down,
                len(trace_ids) + result.already_triaged,
                result.already_triaged,
                len(trace_ids),
                extra={"event": "plan", "to_triage": len(trace_ids)},
            )
            stream = Stream(
                traces=sources.traces,
                scores=sources.scores,
                config=config,
                options=options,
                ledger=ledger,
                verdicts=verdicts,
                stop=stop,
            )
            await stream.run(by_trace, trace_ids)
            result.search_calls = researcher.calls if researcher else 0
    if sources.history is not None and not stop.is_set():
        await _worklist(sources, result, config, options)
    result.usage = judge.usage
    result.requests = sources.stats.requests
    result.elapsed = time.monotonic() - started
    return result


async def _worklist(sources: Sources, result: RunResult, config: TriageConfig, options: RunOptions) -> None:
    """Signatures and the trend; a failure here costs the worklist, never the run's verdicts."""
    assert sources.history is not None
    try:
        length = timedelta(hours=options.since_hours)
        result.worklist = await asyncio.to_thread(
            build_worklist, sources.history, result.entries, result, config, length
        )
    except SourceError as ex:
        log.warning("no worklist tonight: the earlier nights' scores could not be read: %s", ex,
                    extra={"event": "worklist_unavailable"})  # fmt: skip
        return
    if not options.write:
        return
    # in batches of `batch_size`, as the verdicts are: every write is confirmed by reading it back,
    # and the whole window's signature scores with their read-back rows at once grew with the window
    confirmed = 0
    failed: dict[str, str] = {}
    for writes in signature_batches(result.entries, result.worklist, config, options.batch_size):
        try:
            outcome = await asyncio.to_thread(sources.scores.write_scores, writes)
        except SourceError as ex:
            outcome = WriteOutcome(failed={w.id: str(ex) for w in writes})
        confirmed += len(outcome.confirmed)
        failed.update(outcome.failed)
    result.signatures_written = confirmed
    if failed:
        # the verdicts stand; tomorrow's run reads tonight's signatures only where they landed
        log.warning("%d signature scores not confirmed (a rerun writes them): %s", len(failed),
                    next(iter(failed.values())), extra={"event": "signatures_not_written"})  # fmt: skip


async def _already_triaged(scores: ScoreSink, trace_ids: list[str], config: TriageConfig) -> set[str]:
    done: set[str] = set()
    for i in range(0, len(trace_ids), TRIAGED_PER_READ):
        chunk = trace_ids[i : i + TRIAGED_PER_READ]
        done |= await asyncio.to_thread(scores.triaged, chunk, config.scores.layer, config.rule_version)
    return done
