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
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from triage.domain.config import TriageConfig
from triage.domain.kernel import Window, iso_z
from triage.domain.outcome import RunResult, Shard
from triage.domain.ports import (
    Backend,
    Judge,
    PacedSource,
    ReleaseSource,
    ScoreReader,
    ScoreSink,
    Searcher,
    SourceStats,
    TraceSource,
    VoteSource,
)
from triage.domain.records import Vote, WriteOutcome
from triage.domain.review import JudgeMeasure
from triage.domain.scores import ScoreBody, score_id
from triage.domain.votes import TurnPending, rated_trace
from triage.domain.worklist import NIGHTS
from triage.engine.releases import gather_releases
from triage.engine.stream import RunOptions, Stream
from triage.engine.verdicts import Flight, Ledger, OutageWait, VerdictMaker
from triage.engine.worklist import build_worklist, signature_batches, signature_states
from triage.errors import ExitCode, SearchError, SourceError
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


async def _reach_back(sources: Sources, options: RunOptions, window: Window) -> Window:
    """The window reaching back to the last complete run, at most the lookback
    (`Window.reaching_back_to`). No marker at all is a first run: its window is the night's, since
    no earlier night of this store left anything. Only with `write`: a dry run records nothing, and
    shows the night's window. A marker that cannot be read costs the reach, never the run."""
    if not options.write or sources.history is None or window.lookback <= timedelta(0):
        return window
    try:
        since = await asyncio.to_thread(last_complete, sources.history, window.end, options.shard)
    except SourceError as ex:
        log.warning("the last complete run could not be read (%s): tonight's window only", ex,
                    extra={"event": "marker_unavailable"})  # fmt: skip
        return window
    if since is None:
        return window
    reached = window.reaching_back_to(since)
    if reached.start < window.start:
        log.info("reaching back to %s for what earlier runs left (the last complete run ended %s)",
                 reached.start.isoformat(timespec="minutes"), since.isoformat(timespec="minutes"),
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


@dataclass(frozen=True)
class RunSetup:
    """What the application hands the engine for one run beyond its options (`triage.app.run_setup`):
    the window it reads, the judge for a trace no search can serve (a turn that made no search:
    the offline judge's facts suffice), and what the report shows of the judge (its last
    measurement against people, read at the end; a cached input token's price). The run's `RunResult` is built from
    these and the run alone: nothing fills it afterwards."""

    window: Window
    no_search_judge: Judge
    #: the judge's last measurement against people, read once the run is done (None: unmeasured)
    measure: Callable[[str], JudgeMeasure | None] | None = None
    #: a cached input token's price (per M tokens); None: the input price
    cached_input_price: float | None = None


async def run_feedback(
    *,
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    setup: RunSetup,
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
        return await _run(sources, judge, config, options, setup, searcher, stop, flight, reopen)


async def _run(
    sources: Sources,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    setup: RunSetup,
    searcher: AbstractAsyncContextManager[Searcher] | None,
    stop: asyncio.Event,
    flight: Flight | None = None,
    reopen: SearcherFactory | None = None,
) -> RunResult:
    started = time.monotonic()
    window = await _reach_back(sources, options, setup.window)
    start, end = window.start, window.end
    result = RunResult(
        start=start,
        end=end,
        write=options.write,
        judge=judge.name,
        shard=options.shard,
        input_price=config.judge.input_price_per_mtok,
        output_price=config.judge.output_price_per_mtok,
        cached_input_price=setup.cached_input_price,
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
                no_search_judge=setup.no_search_judge,
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
    placed: dict[str, str | None] = {}  # tonight's answers' releases, read by the release watch
    if sources.history is not None and sources.releases is not None and not stop.is_set():
        await _releases(sources, result, config, options, placed)
    if options.write and result.worklist is not None and sources.history is not None and not stop.is_set():
        await _write_states(sources, result, config, placed)
    result.usage = judge.usage
    if setup.measure is not None:  # after the run, as the report's last read
        result.judge_measure = await asyncio.to_thread(setup.measure, judge.name)
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


async def _write_states(
    sources: Sources, result: RunResult, config: TriageConfig, placed: dict[str, str | None]
) -> None:
    """Tonight's state of each signature seen tonight (`engine.worklist.signature_states`), its
    members' releases as the release watch read them (no read of its own), written after the run's
    verdicts and signatures. A failure costs the states, never the verdicts or the signatures."""
    assert sources.history is not None and result.worklist is not None
    try:
        states = await asyncio.to_thread(
            signature_states, sources.history, placed, result.worklist, result.entries, result, config
        )
        if not states:
            return
        result.signature_states = {state.signature: state for state in states}
        bodies = [state.score(config.scores.signature_state) for state in states]
        outcome = await asyncio.to_thread(sources.scores.write_scores, bodies)
    except SourceError as ex:
        log.warning("no signature states tonight: %s", ex, extra={"event": "states_unavailable"})
        return
    if outcome.failed:
        log.warning("%d signature states not confirmed (the next night writes them): %s", len(outcome.failed),
                    next(iter(outcome.failed.values())), extra={"event": "states_not_written"})  # fmt: skip


async def _already_triaged(scores: ScoreSink, trace_ids: list[str], config: TriageConfig) -> set[str]:
    """The traces the rule's current version has a verdict on: reads of `TRIAGED_PER_READ` ids, a
    few at once (the default thread pool's size), since no judging starts before they are done."""
    chunks = [trace_ids[i : i + TRIAGED_PER_READ] for i in range(0, len(trace_ids), TRIAGED_PER_READ)]
    found = await asyncio.gather(
        *(asyncio.to_thread(scores.triaged, chunk, config.scores.layer, config.rule_version) for chunk in chunks)
    )
    return set().union(*found)


# -- the release watch: each release of the window, and each against the one before it ---------


async def _releases(
    sources: Sources, result: RunResult, config: TriageConfig, options: RunOptions, placed: dict[str, str | None]
) -> None:
    """The report's Releases section: tonight and the nights before it (as the worklist's trend),
    since a release usually lives for days and is compared with the one before it. A failure here
    costs the section, never the run's verdicts."""
    assert sources.history is not None and sources.releases is not None
    length = timedelta(hours=options.since_hours)
    start = result.end - length * (NIGHTS + 1)
    try:
        shown = await asyncio.to_thread(
            gather_releases, sources.releases, sources.traces, sources.history, config, start, result.end,
            tonight=result.entries, placed=placed,
        )  # fmt: skip
    except SourceError as ex:
        log.warning("no releases tonight: they could not be read: %s", ex, extra={"event": "releases_unavailable"})
        return
    result.releases = shown if shown.watch.releases else None
