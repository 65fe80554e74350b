"""The nightly job: votes in, verdicts and scores out. `run_feedback` is the one core call.

Every thumbs-down ends either triaged (and written, with `write`), or listed as `Undecided` with a
reason. The flow: read the window's votes, group them by trace (sessions resolved), drop traces
already triaged under this rule version, then stream the rest (`triage.engine.stream`).

The run's lifecycle: opening the searcher (degraded when it is down) and honouring SIGTERM.

Votes grouped by trace: a vote on a session goes to the trace it rates (`domain.votes.rated_trace`).

Nothing left behind: with `write`, the window reaches back to where the last complete run ended
(`RUN_MARKER`, a score on a trace id of its own that a complete `write` run leaves), at most
`[window] lookback_days` (a first run, with no marker, has the night's window), so an outage, a
failed Job or a skipped night costs no vote: the next night triages what they left; traces already triaged stay skipped.

After the traces: signatures and the trend, read from the scores already stored, written back.

The history is the `triage_signature` scores of tonight and the 7 nights before (each carries its
layer, component and owners in metadata), so there is no state besides the scores: Langfuse or
the embedded store answers for every night, and another tool can read the same.

Then the release watch over the same nights (`gather_releases`, also `triage releases`): the
answers per release from the source, each answer's votes and current verdict, each release
against the one before it (`domain.releases`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import chain, groupby
from typing import TypeVar

from triage.domain.config import TriageConfig
from triage.domain.kernel import iso_z
from triage.domain.outcome import Entry, RunResult, Shard
from triage.domain.ports import (
    Backend,
    Judge,
    PacedSource,
    ReadsInTraceOrder,
    ReleaseSource,
    ScoreReader,
    ScoreSink,
    Searcher,
    SourceStats,
    TraceSource,
    VoteSource,
)
from triage.domain.records import Layer, StoredScore, Vote, WriteOutcome
from triage.domain.releases import (
    ALPHA,
    Per,
    ReleaseCounts,
    ReleaseRows,
    ReleaseTally,
    ReleaseWindow,
    TraceRow,
    gate,
    merge_answers,
    watch,
)
from triage.domain.rule import owners as rule_owners
from triage.domain.scores import JobScoreNames, ScoreBody, SignatureMeta, current_scores, score_id
from triage.domain.votes import TurnPending, rated_trace
from triage.domain.worklist import NIGHTS, Member, Night, Signature, Worklist, assign
from triage.engine.stream import Flight, Ledger, OutageWait, RunOptions, Stream, VerdictMaker, window
from triage.errors import ExitCode, SearchError, SourceError, UsageError
from triage.judges.heuristic import HeuristicJudge
from triage.retry import Budget, stop_on_sigterm
from triage.search.local import Researcher
from triage.sinks.exports import open_facts_file

log = logging.getLogger("triage")


#: a new searcher, for a run whose first contact failed (a searcher is entered once)
SearcherFactory = Callable[[], AbstractAsyncContextManager[Searcher]]


@asynccontextmanager
async def open_searcher(
    searcher: AbstractAsyncContextManager[Searcher] | None,
    *,
    reopen: SearcherFactory | None = None,
    outage: OutageWait | None = None,
) -> AsyncIterator[tuple[Searcher | None, str | None]]:
    """Enter the searcher: (searcher, None), or (None, why) when there is none or it cannot be
    reached; then the run goes on without re-search (degraded). A search down at the start is
    waited for as one down mid-run is, within the same wait (`outage`: the run's, once), a new
    searcher from `reopen` each turn. What the first contact finds wrong with the configuration (a
    refused token, nothing at the MCP path, a tool the server lacks) is a `ConfigError`: it ends the
    run (exit 3) before any trace is judged."""
    if searcher is None:
        yield None, "no search configured"
        return
    while True:
        try:
            entered = await searcher.__aenter__()
            break
        except SearchError as ex:  # a ConfigError is not: it ends the run
            if reopen is None or outage is None or not await outage.again(str(ex)):
                log.warning("search unavailable: %s", ex, extra={"event": "search_unavailable"})
                yield None, str(ex)
                return
            searcher = reopen()
    try:
        yield entered, None
    finally:
        await searcher.__aexit__(None, None, None)


def votes_by_trace(traces: TraceSource, votes: list[Vote], ledger: Ledger) -> dict[str, list[Vote]]:
    """Trace id -> its votes. A vote on neither a trace nor a session is bad input; a session vote
    whose trace has not arrived yet (its turn, or without one its latest answer at the vote's time)
    is pending. Both are listed."""
    by_trace: dict[str, list[Vote]] = {}
    session_votes = [v for v in votes if not v.trace_id]
    sessions = traces.session_traces(sorted({v.session_id for v in session_votes if v.session_id}))
    for vote in votes:
        if vote.trace_id:
            by_trace.setdefault(vote.trace_id, []).append(vote)
            continue
        if not vote.session_id:
            ledger.skip([vote], None, "bad_input", "vote is on neither a trace nor a session")
            continue
        rated = rated_trace(vote, sessions.get(vote.session_id, []))
        if isinstance(rated, TurnPending):
            ledger.skip([vote], None, "pending", rated.reason)
        else:
            by_trace.setdefault(rated, []).append(vote)
    return by_trace


TITLE_CHARS = 120


def night_of(stamp: datetime, end: datetime, length: timedelta) -> int:
    """0 for tonight's window (end - length, end], 1 for the one before, ..."""
    return max(0, int((end - stamp) / length))


def known_signatures(
    rows: Sequence[StoredScore], end: datetime, length: timedelta, config: TriageConfig
) -> tuple[list[Signature], list[Night]]:
    """The signatures and night counts the stored signature scores describe."""
    nights = [Night(n, end - length * (n + 1), end - length * n) for n in range(NIGHTS + 1)]
    sigs: dict[str, Signature] = {}
    for row in sorted(rows, key=lambda r: (r.timestamp, r.id)):
        meta = SignatureMeta.from_stored(row.metadata)
        if row.trace_id is None or not isinstance(row.value, str) or meta.rule_version != config.rule_version:
            continue
        night = night_of(row.timestamp, end, length)
        if night > NIGHTS:
            continue
        sig = sigs.get(row.value)
        if sig is None:
            sig = sigs[row.value] = Signature(
                id=row.value,
                layer=meta.layer,
                component=meta.component,
                terms=frozenset(meta.terms),
                title=meta.title,
            )
        sig.add(night, row.trace_id, row.timestamp)
        nights[night].count(meta.layer, meta.owners)
    return list(sigs.values()), nights


def build_worklist(
    history: ScoreReader, entries: Sequence[Entry], result: RunResult, config: TriageConfig, length: timedelta
) -> Worklist:
    """Assign tonight's entries to signatures (known ones first) and count the nights.

    A night is `length` long (the run's `--since-hours`, without the overlap), counted back from
    the window's end; this run's own entries count as tonight wherever their trace started."""
    rows = history.scores([config.scores.signature], result.end - length * (NIGHTS + 1), result.end + length)
    known, nights = known_signatures(rows, result.end, length, config)
    already = {trace_id for sig in known for trace_id in sig.tonight}
    members = [
        Member(e.trace_id, e.layer.value, e.component, e.question, e.start) for e in entries
    ]
    chosen = assign(members, known)
    for entry in entries:
        sig = chosen[entry.trace_id]
        entry.signature = sig.id
        if entry.trace_id not in already:
            nights[0].count(entry.layer.value, entry.owners)
    seen = {sig.id: sig for sig in [*known, *chosen.values()]}
    tonight = sorted((s for s in seen.values() if s.tonight), key=lambda s: (-len(s.tonight), s.id))
    resolved = sorted((s for s in seen.values() if not s.tonight), key=lambda s: (-s.count, s.id))
    return Worklist(signatures=tonight, resolved=resolved, nights=nights)


def signature_scores(entries: Sequence[Entry], worklist: Worklist, config: TriageConfig) -> list[ScoreBody]:
    """One `triage_signature` score per entry, with what later nights need to read it back."""
    by_id = {sig.id: sig for sig in worklist.signatures}
    name = config.scores.signature
    out = []
    for entry in entries:
        if entry.signature is None or entry.score_time is None or not entry.written:
            continue  # a verdict not written has no signature score either: a rerun writes both
        sig = by_id[entry.signature]
        out.append(
            ScoreBody(
                data_type="CATEGORICAL",
                id=score_id(entry.trace_id, name, config.rule_version),
                trace_id=entry.trace_id,
                name=name,
                value=sig.id,
                comment=f"{sig.layer} / {sig.component}",
                metadata=SignatureMeta(
                    layer=entry.layer.value,
                    component=entry.component,
                    owners=entry.owners,
                    terms=sorted(sig.terms),
                    title=sig.title[:TITLE_CHARS],
                    rule_version=config.rule_version,
                ).to_metadata(),
                timestamp=entry.score_time,
                environment=entry.environment,
            )
        )
    return out


def signature_batches(
    entries: Sequence[Entry], worklist: Worklist, config: TriageConfig, size: int
) -> Iterator[list[ScoreBody]]:
    """`signature_scores` a batch of at most `size` entries at a time (each batch made only when
    asked for), so that the scores to write, and their read-back, never grow with the window."""
    step = max(1, size)
    for start in range(0, len(entries), step):
        writes = signature_scores(entries[start : start + step], worklist, config)
        if writes:
            yield writes


TRIAGED_PER_READ = 100
#: signature batches written (and read back) at once: memory stays a few batches whatever the window
SIGNATURE_WRITES_AT_ONCE = 16


@dataclass(frozen=True)
class Sources:
    """Where a run reads votes and traces and writes scores, and whose requests it counts."""

    votes: VoteSource
    traces: TraceSource
    scores: ScoreSink
    stats: SourceStats
    #: the scores of earlier nights (signatures, trends); None: no worklist
    history: ScoreReader | None = None
    #: the answers per release (the report's Releases section, with `history`); None: no section
    releases: ReleaseSource | None = None

    @classmethod
    def of(cls, backend: Backend) -> Sources:
        """All of them from one system (Langfuse, or the embedded store)."""
        releases = backend if isinstance(backend, ReleaseSource) else None
        return cls(
            votes=backend, traces=backend, scores=backend, stats=backend.stats, history=backend, releases=releases
        )


# -- the run marker: where the last complete run ended ------------------------------------------

#: the score a complete `--write` run leaves (CATEGORICAL `complete`, timestamped at its window's
#: end), on a trace id of its own per shard (`marker_trace`). A score, not a file: Langfuse or the
#: embedded store already hold the job's state, a Pod's disk does not outlive it, and every shard
#: and every retry reads the same one. Written with the last batch of signature scores, so a night
#: costs no request more
RUN_MARKER = "triage_run"
COMPLETE = "complete"


def marker_trace(shard: Shard) -> str:
    """The trace id the marker is scored on (no trace of the agent's: it rates no answer), one per
    shard, since each shard answers for its own votes only."""
    return "triage-run" if shard.count == 1 else f"triage-run-{shard.index}-of-{shard.count}"


#: how far back a marker is looked for: one a night, so a year is a few pages of one read
MARKER_READ = timedelta(days=366)


def last_complete(history: ScoreReader, end: datetime, shard: Shard) -> datetime | None:
    """Where the latest complete run's window ended (None: no run ever completed here)."""
    rows = history.scores([RUN_MARKER], end - MARKER_READ, end)
    done = [r.timestamp for r in rows if r.trace_id == marker_trace(shard) and r.value == COMPLETE]
    return max(done, default=None)


def marker_score(result: RunResult, shard: Shard, config: TriageConfig) -> ScoreBody | None:
    """This run's marker, when it is complete: every thumbs-down of its window triaged and written
    (or listed for a reason no rerun changes: bad input, a turn still pending); else None."""
    if result.exit_code != ExitCode.OK:
        return None
    on = marker_trace(shard)
    return ScoreBody(
        data_type="CATEGORICAL",
        id=score_id(on, RUN_MARKER, iso_z(result.end)),  # one a run: never an upsert across runs
        trace_id=on,
        name=RUN_MARKER,
        value=COMPLETE,
        comment=f"triage feedback complete for {iso_z(result.start)} .. {iso_z(result.end)}",
        metadata={"start": iso_z(result.start), "rule_version": config.rule_version},
        timestamp=result.end,
    )


async def _reach_back(
    sources: Sources, options: RunOptions, config: TriageConfig, start: datetime, end: datetime
) -> datetime:
    """The window's start reaching back to the last complete run, at most the lookback
    (`kernel.window`). No marker at all is a first run: its window is the night's, since no earlier
    night of this store left anything. Only with `write`: a dry run records nothing, and shows the
    night's window. A marker that cannot be read costs the reach, never the run."""
    if not options.write or sources.history is None or config.window.lookback_days <= 0:
        return start
    try:
        since = await asyncio.to_thread(last_complete, sources.history, end, options.shard)
    except SourceError as ex:
        log.warning("the last complete run could not be read (%s): tonight's window only", ex,
                    extra={"event": "marker_unavailable"})  # fmt: skip
        return start
    if since is None:
        return start
    reached, _ = window(options, config, since)
    if reached < start:
        log.info("reaching back to %s for what earlier runs left (the last complete run ended %s)",
                 reached.isoformat(timespec="minutes"), since.isoformat(timespec="minutes"),
                 extra={"event": "reach_back"})  # fmt: skip
    return reached


def with_marker(batches: Iterable[list[ScoreBody]], marker: ScoreBody | None) -> Iterator[list[ScoreBody]]:
    """`batches`, the last one carrying `marker` (alone, when there is no batch)."""
    last: list[ScoreBody] | None = None
    for batch in batches:
        if last is not None:
            yield last
        last = batch
    if marker is not None:
        last = [*(last or []), marker]
    if last is not None:
        yield last


def _marker_failed(outcome: WriteOutcome, marker: ScoreBody) -> None:
    if marker.id in outcome.failed:
        log.warning("the run's marker was not written (tomorrow reaches further back): %s",
                    outcome.failed[marker.id], extra={"event": "marker_not_written"})  # fmt: skip


async def _mark(sources: Sources, body: ScoreBody) -> None:
    """Leave this run's marker; one not written costs tomorrow a longer reach back, nothing else."""
    try:
        outcome = await asyncio.to_thread(sources.scores.write_scores, [body])
    except SourceError as ex:
        outcome = WriteOutcome(failed={body.id: str(ex)})
    _marker_failed(outcome, body)


async def run_feedback(
    *,
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    searcher: AbstractAsyncContextManager[Searcher] | None = None,
    budget: Budget | None = None,
    flight: Flight | None = None,
    reopen: SearcherFactory | None = None,
) -> RunResult:
    """Triage every thumbs-down in the window. The one core function behind `triage feedback`.

    SIGTERM, from the first read on, stops new work: traces in flight finish and are written, the
    rest are listed, and `budget` (shared with the outside systems' retries) is cancelled so no
    call waits out a back-off while the Pod's grace period runs. `flight` (batch mode) is told when
    each trace starts and ends."""
    stop = asyncio.Event()  # set on SIGTERM
    with stop_on_sigterm(stop, budget, doing="finishing the traces in flight, listing the rest"):
        return await _run(sources, judge, config, options, searcher, stop, flight, reopen)


async def _run(
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    searcher: AbstractAsyncContextManager[Searcher] | None,
    stop: asyncio.Event,
    flight: Flight | None = None,
    reopen: SearcherFactory | None = None,
) -> RunResult:
    started = time.monotonic()
    start, end = window(options, config)
    start = await _reach_back(sources, options, config, start, end)
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
        # one wait for the search, at the start and mid-run alike: cronjob.yaml's deadline counts one
        outage = OutageWait(seconds=config.search.outage_wait_seconds, stop=stop)
        opened = open_searcher(searcher if judge.needs_research else None, reopen=reopen, outage=outage)
        async with opened as (live, down_reason):
            researcher = Researcher.configured(live, config) if live is not None else None
            verdicts = VerdictMaker(
                judge=judge,
                no_search_judge=HeuristicJudge(),
                config=config,
                ledger=ledger,
                researcher=researcher,
                # none configured (only in-process callers pass none): no re-search is expected
                search_down=down_reason if judge.needs_research and searcher is not None else None,
                facts_out=facts_out,
                concurrency=options.concurrency,
                flight=flight,
                outage=outage,
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
            if isinstance(sources.traces, PacedSource) and (plan := sources.traces.request_plan(len(trace_ids))):
                log.info("%s", plan, extra={"event": "request_plan"})
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
    marker = marker_score(result, options.shard, config) if options.write else None
    if sources.history is not None and not stop.is_set():
        marker = await _worklist(sources, result, config, options, marker)
    if marker is not None:  # no signature batch carried it
        await _mark(sources, marker)
    if sources.history is not None and sources.releases is not None and not stop.is_set():
        await _releases(sources, result, config, options)
    result.usage = judge.usage
    result.requests = sources.stats.requests
    result.elapsed = time.monotonic() - started
    return result


async def _worklist(
    sources: Sources, result: RunResult, config: TriageConfig, options: RunOptions, marker: ScoreBody | None
) -> ScoreBody | None:
    """Signatures and the trend; a failure here costs the worklist, never the run's verdicts. The
    run's `marker` goes with the last signature batch: returned when none carried it."""
    assert sources.history is not None
    try:
        length = timedelta(hours=options.since_hours)
        result.worklist = await asyncio.to_thread(
            build_worklist, sources.history, result.entries, result, config, length
        )
    except SourceError as ex:
        log.warning("no worklist tonight: the earlier nights' scores could not be read: %s", ex,
                    extra={"event": "worklist_unavailable"})  # fmt: skip
        return marker
    if not options.write:
        return marker
    # in batches of `batch_size`, as the verdicts are: every write is confirmed by reading it back,
    # and the whole window's signature scores with their read-back rows at once grew with the window.
    # A few batches at once: each waits about a second for Langfuse to ingest before its read-back,
    # and one after the other those waits were the run's longest tail (11 s at 1,000 traces)
    confirmed = 0
    failed: dict[str, str] = {}
    gate = asyncio.Semaphore(SIGNATURE_WRITES_AT_ONCE)
    loop = asyncio.get_running_loop()

    async def write(writes: list[ScoreBody], threads: ThreadPoolExecutor) -> None:
        nonlocal confirmed
        try:
            outcome = await loop.run_in_executor(threads, sources.scores.write_scores, writes)
        except SourceError as ex:
            outcome = WriteOutcome(failed={w.id: str(ex) for w in writes})
        finally:
            gate.release()
        if marker is not None and any(w is marker for w in writes):
            _marker_failed(outcome, marker)
            outcome = WriteOutcome(
                confirmed=[i for i in outcome.confirmed if i != marker.id],
                failed={i: why for i, why in outcome.failed.items() if i != marker.id},
            )
        confirmed += len(outcome.confirmed)
        failed.update(outcome.failed)

    # threads of their own: a write mostly waits, and the default pool has cores + 4 of them
    with ThreadPoolExecutor(SIGNATURE_WRITES_AT_ONCE, thread_name_prefix="signatures") as threads:
        async with asyncio.TaskGroup() as writing:
            batches = signature_batches(result.entries, result.worklist, config, options.batch_size)
            for writes in with_marker(batches, marker):
                await gate.acquire()  # the next batch is made only once one of the few in flight is done
                writing.create_task(write(writes, threads))
    result.signatures_written = confirmed
    if failed:
        # the verdicts stand; tomorrow's run reads tonight's signatures only where they landed
        log.warning("%d signature scores not confirmed (a rerun writes them): %s", len(failed),
                    next(iter(failed.values())), extra={"event": "signatures_not_written"})  # fmt: skip
    return None


async def _already_triaged(scores: ScoreSink, trace_ids: list[str], config: TriageConfig) -> set[str]:
    """The traces the rule's current version has a verdict on: reads of `TRIAGED_PER_READ` ids, a
    few at once (the default thread pool's size), since no judging starts before they are done."""
    chunks = [trace_ids[i : i + TRIAGED_PER_READ] for i in range(0, len(trace_ids), TRIAGED_PER_READ)]
    found = await asyncio.gather(
        *(asyncio.to_thread(scores.triaged, chunk, config.scores.layer, config.rule_version) for chunk in chunks)
    )
    return set().union(*found)


# -- the release watch: each release of the window, and each against the one before it ---------


T = TypeVar("T")
#: the traces placed per `trace_places` call while the release watch counts (Langfuse: ten
#: requests of 100 ids; the store: two queries)
TRACES_PER_PLACE = 1000
Verdict = tuple[Layer | None, str | None, str | None]  # a trace's layer, component, signature


def _in_trace_order(items: Iterable[T], trace_of: Callable[[T], str], what: str) -> Iterator[T]:
    """`items` as they come, checked to be in trace order: the count of a trace is made from its
    rows together, so a source out of order would count a trace twice."""
    last = ""
    for item in items:
        trace = trace_of(item)
        if trace < last:
            raise SourceError(f"the {what} did not come in trace order ({trace!r} after {last!r})")
        last = trace
        yield item


def _verdicts(
    stored: Iterator[StoredScore], names: JobScoreNames, rule_version: str, tonight: Sequence[Entry]
) -> Iterator[tuple[str, Verdict]]:
    """Each trace's current verdict (`current_scores` of its stored scores, tonight's entry over
    them), in trace order, from the stored scores in trace order."""
    tonight_by = {e.trace_id: (e.layer, e.component, e.signature) for e in tonight}

    def held() -> Iterator[tuple[str, Verdict]]:
        for trace_id, group in groupby(stored, key=lambda score: score.trace_id):
            if trace_id is None or trace_id in tonight_by:
                continue
            for job in current_scores(list(group), names, rule_version).values():
                signature = job.signature.value if job.signature is not None else None
                text = signature if isinstance(signature, str) else None
                yield trace_id, (job.layer_value, job.component_value, text)

    return heapq.merge(held(), sorted(tonight_by.items()), key=lambda item: item[0])


def _count_voted(
    source: ReleaseSource,
    traces: TraceSource,
    scores: ScoreReader,
    config: TriageConfig,
    start: datetime,
    end: datetime,
    tonight: Sequence[Entry],
    components: dict[Layer, set[str]],
) -> tuple[ReleaseRows, int, int]:
    """The window's votes and verdicts counted per release (`ReleaseTally`), one trace at a time:
    the votes and the job's scores are read in trace order (a `ReadsInTraceOrder` source sorts them
    as it reads, a page at a time; another is read whole and sorted), merged, and each trace placed
    (`trace_places`, `TRACES_PER_PLACE` at a time) and counted. Memory: the releases', plus the
    votes on conversations (placed first) and tonight's entries, not the window's votes. Also the
    votes on answers from outside the window, and those whose rated turn is not there yet. Adds to
    `components` each layer's components."""
    names = JobScoreNames(layer=config.scores.layer, component=config.scores.component,
                          signature=config.scores.signature)  # fmt: skip
    score_names = [config.scores.layer, config.scores.component, config.scores.signature]
    votes: Iterator[Vote]
    stored: Iterator[StoredScore]
    if isinstance(source, ReadsInTraceOrder):
        votes = source.votes_in_trace_order(config.scores.vote, start, end)
    else:
        votes = iter(sorted(source.cast_votes(config.scores.vote, start, end).votes, key=lambda v: v.trace_id or ""))
    if isinstance(scores, ReadsInTraceOrder):
        stored = scores.scores_in_trace_order(score_names, start, end)
    else:
        stored = iter(sorted(scores.scores(score_names, start, end), key=lambda s: s.trace_id or ""))
    votes = _in_trace_order(votes, lambda v: v.trace_id or "", "votes")
    stored = _in_trace_order(stored, lambda s: s.trace_id or "", "job's scores")
    # the votes on a conversation (no trace) come first: each for the turn it rates, as the job places it
    on_sessions: list[Vote] = []
    first = next(votes, None)
    while first is not None and not first.trace_id:
        on_sessions.append(first)
        first = next(votes, None)
    session_ids = sorted({v.session_id for v in on_sessions if v.session_id})
    sessions = traces.session_traces(session_ids) if session_ids else {}
    rated: list[tuple[str, Vote]] = []
    unplaced = 0
    for vote in on_sessions:
        turn = rated_trace(vote, sessions.get(vote.session_id, [])) if vote.session_id else None
        if isinstance(turn, str):
            rated.append((turn, vote))
        else:
            unplaced += 1
    rated.sort(key=lambda item: item[0])
    on_traces = ((v.trace_id or "", v) for v in chain([first] if first is not None else [], votes))
    voted = heapq.merge(on_traces, rated, key=lambda item: item[0])
    tagged: Iterator[tuple[str, Vote | Verdict]] = heapq.merge(
        voted, _verdicts(stored, names, config.rule_version, tonight), key=lambda item: item[0]
    )
    tally = ReleaseTally()
    outside = 0

    def count(chunk: list[tuple[str, list[Vote | Verdict]]]) -> None:
        nonlocal outside
        places = source.trace_places([trace_id for trace_id, _ in chunk])
        for trace_id, said in chunk:
            place = places.get(trace_id)
            if place is not None and not start <= place.start < end:
                place = None
            rows: list[TraceRow] = []
            for item in said:
                if isinstance(item, Vote):
                    if place is None:
                        outside += 1
                    else:
                        rows.append(TraceRow(trace_id=trace_id, release=place.release, version=place.version,
                                             timestamp=place.start, vote=item.value))  # fmt: skip
                    continue
                layer, component, signature = item
                if place is None or (layer is None and signature is None):
                    continue
                rows.append(TraceRow(trace_id=trace_id, release=place.release, version=place.version,
                                     timestamp=place.start, layer=layer, signature=signature))  # fmt: skip
                if layer is not None:
                    components.setdefault(layer, set()).add(component or config.agent.default_component)
            if rows:
                tally.add(trace_id, rows)

    chunk: list[tuple[str, list[Vote | Verdict]]] = []
    for trace_id, group in groupby(tagged, key=lambda item: item[0]):
        chunk.append((trace_id, [item for _, item in group]))
        if len(chunk) >= TRACES_PER_PLACE:
            count(chunk)
            chunk = []
    if chunk:
        count(chunk)
    return tally.result(), outside, unplaced


def gather_releases(
    source: ReleaseSource,
    traces: TraceSource,
    scores: ScoreReader,
    config: TriageConfig,
    start: datetime,
    end: datetime,
    *,
    tonight: Sequence[Entry] = (),
    alpha: float = ALPHA,
    per: Per = "answers",
    gate_pair: tuple[str, str] | None = None,
) -> ReleaseWindow:
    """The releases of the answers started in [start, end), each against the one before it
    (`domain.releases.watch`); with `gate_pair` (candidate, baseline), the release gate between
    those two (`domain.releases.gate`), a `UsageError` naming the window's releases when one of
    them has no answer in it.

    The answers per release come from the source (`release_answers`: Langfuse's metrics API, the
    store's GROUP BY). Then, per answer of the window: its votes cast in the window (a vote on a
    conversation counts for the turn it rates, as the job places it), and its failure's layer and
    signature, the job's current verdict (`current_scores`), tonight's `tonight` entries over the
    stored ones; read in trace order and counted one answer at a time (`_count_voted`). The owners
    of a layer are the configuration's (`rule.owners`) for the components its failures were given.
    Releases are ordered by first seen at the source's resolution, then in version order."""
    answers = source.release_answers(start, end)
    notes: list[str] = []
    counts: list[ReleaseCounts] = []
    components: dict[Layer, set[str]] = {}
    if answers.releases:
        read, outside, unplaced = _count_voted(source, traces, scores, config, start, end, tonight, components)
        counts = merge_answers(answers.releases, read.releases, answers.resolution)
        if outside:
            notes.append(f"{outside} votes on answers that started before the window (or are unknown): not counted")
        if unplaced:
            notes.append(f"{unplaced} votes on a conversation whose rated turn is not there yet: not counted")
        if read.notes:
            notes.append(f"{len(read.notes)} answers whose rows disagree, e.g. {read.notes[0].reason}")

    def owners_of(layer: Layer) -> list[str]:
        found = sorted(components.get(layer) or {config.agent.default_component})
        return list(dict.fromkeys(o for component in found for o in rule_owners(layer, component, config)))

    watched = watch(counts, alpha=alpha, per=per, owners=owners_of, resolution=answers.resolution)
    log.info(
        "releases %s .. %s: %d, answers counted by %s; worse than the one before: %s",
        start.isoformat(timespec="minutes"),
        end.isoformat(timespec="minutes"),
        len(watched.releases),
        answers.counted_by,
        ", ".join(watched.flagged) or "none",
        extra={"event": "releases", "flagged": watched.flagged},
    )
    for note in notes:
        log.info("releases: %s", note, extra={"event": "releases_note"})
    gated = None
    if gate_pair is not None:
        by_name = {c.release: c for c in counts}
        unknown = [name for name in gate_pair if name not in by_name]
        if unknown:
            found = ", ".join(sorted(by_name)) or "none"
            raise UsageError(
                f"release {', '.join(map(repr, unknown))} has no answer started between {iso_z(start)} and "
                f"{iso_z(end)} (--since-hours); the releases of that window: {found}"
            )
        candidate, baseline = gate_pair
        if candidate == baseline:
            raise UsageError(f"--candidate and --baseline name the same release ({candidate!r})")
        gated = gate(by_name[candidate], by_name[baseline], alpha, per=per, owners=owners_of)
    return ReleaseWindow(
        start=start, end=end, counted_by=answers.counted_by, unreleased=answers.unreleased,
        watch=watched, gate=gated, notes=notes,
    )  # fmt: skip


async def _releases(sources: Sources, result: RunResult, config: TriageConfig, options: RunOptions) -> None:
    """The report's Releases section: tonight and the nights before it (as the worklist's trend),
    since a release usually lives for days and is compared with the one before it. A failure here
    costs the section, never the run's verdicts."""
    assert sources.history is not None and sources.releases is not None
    length = timedelta(hours=options.since_hours)
    start = result.end - length * (NIGHTS + 1)
    try:
        shown = await asyncio.to_thread(
            gather_releases, sources.releases, sources.traces, sources.history, config, start, result.end,
            tonight=result.entries,
        )  # fmt: skip
    except SourceError as ex:
        log.warning("no releases tonight: they could not be read: %s", ex, extra={"event": "releases_unavailable"})
        return
    result.releases = shown if shown.watch.releases else None
