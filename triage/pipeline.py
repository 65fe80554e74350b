"""The nightly job: votes in, verdicts and scores out.

Streaming, so memory stays flat however large the window: traces are read in batches into a
bounded queue, judged concurrently, and their scores written in batches by one writer task.
Every thumbs-down ends either triaged (and written, with `write`), or `Undecided` with a reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

from .config import TriageConfig
from .errors import (
    ConfigError,
    InputError,
    JudgeError,
    JudgeRejected,
    SearchError,
    SourceError,
    TriageError,
    leaves,
)
from .heuristic import HeuristicJudge
from .interfaces import Backend, Judge, Searcher
from .models import (
    Facts,
    Layer,
    Observation,
    Passage,
    ScoreWrite,
    Trace,
    Undecided,
    UndecidedKind,
    Usage,
    Verdict,
    Vote,
)
from .ownership import component_from_sources, find_component, owners
from .reader import read_trace
from .rule import Undetermined, decide, explain
from .scores import score_id, score_timestamp
from .search import Researcher

log = logging.getLogger("triage")

EXIT_OK, EXIT_ERROR, EXIT_DEGRADED, EXIT_NOT_WRITTEN = 0, 1, 4, 5
QUESTION_CHARS = 160


@dataclass(frozen=True)
class Shard:
    """This process's share of the votes: `index` of `count`, by a stable hash of the trace."""

    index: int = 0
    count: int = 1

    def owns(self, key: str) -> bool:
        if self.count == 1:
            return True
        # never the builtin hash(): it is salted per process, and every shard must agree
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index


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


@dataclass
class Entry:
    """One triaged trace, as the report shows it."""

    trace_id: str
    layer: Layer
    component: str
    owners: list[str]
    reason: str
    question: str
    comments: list[str]
    url: str | None
    injection_suspected: bool = False
    written: bool = False


@dataclass
class Skipped:
    """One thumbs-down that was not triaged, as the report shows it."""

    undecided: Undecided
    question: str | None
    comments: list[str]
    url: str | None = None


@dataclass
class RunResult:
    start: datetime
    end: datetime
    votes_seen: int = 0
    thumbs_down: int = 0
    already_triaged: int = 0
    entries: list[Entry] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    written: int = 0
    write: bool = False
    usage: Usage = field(default_factory=Usage)
    judge: str = ""
    search_calls: int = 0
    requests: int = 0
    elapsed: float = 0.0
    input_price: float = 0.0
    output_price: float = 0.0
    shard: Shard = field(default_factory=Shard)

    @property
    def layer_counts(self) -> Counter[str]:
        return Counter(entry.layer.value for entry in self.entries)

    @property
    def not_written(self) -> list[Skipped]:
        return [s for s in self.skipped if s.undecided.kind == "not_written"]

    @property
    def degraded(self) -> list[Skipped]:
        return [s for s in self.skipped if s.undecided.kind in ("unavailable", "rejected")]

    @property
    def cost(self) -> float:
        return (
            self.usage.input_tokens * self.input_price + self.usage.output_tokens * self.output_price
        ) / 1_000_000

    @property
    def exit_code(self) -> int:
        """0 done; 1 an internal error on some trace; 5 some scores not confirmed as written;
        4 some traces undecided for a retryable reason."""
        if any(s.undecided.kind == "error" for s in self.skipped):
            return EXIT_ERROR
        if self.not_written:
            return EXIT_NOT_WRITTEN
        if self.degraded:
            return EXIT_DEGRADED
        return EXIT_OK


def shorten(text: str, limit: int = QUESTION_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _comments(votes: Sequence[Vote]) -> list[str]:
    return [v.comment.strip() for v in votes if v.comment and v.comment.strip()]


class Progress:
    """A progress line every few seconds (done/total, rate, ETA), for a log without a terminal."""

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


@asynccontextmanager
async def _open_searcher(
    searcher: AbstractAsyncContextManager[Searcher] | None,
) -> AsyncIterator[tuple[Searcher | None, str | None]]:
    """Enter the searcher; when it cannot be reached the run goes on without re-search (degraded)."""
    if searcher is None:
        yield None, "no search configured"
        return
    try:
        entered = await searcher.__aenter__()
    except ConfigError:
        raise
    except SearchError as ex:
        log.warning("search unavailable: %s", ex, extra={"event": "search_unavailable"})
        yield None, str(ex)
        return
    try:
        yield entered, None
    finally:
        await searcher.__aexit__(None, None, None)


class _Run:
    def __init__(
        self,
        backend: Backend,
        judge: Judge,
        config: TriageConfig,
        options: RunOptions,
        result: RunResult,
        researcher: Researcher | None,
        search_down: str | None,
        facts_out: IO[str] | None,
    ) -> None:
        self.backend, self.judge, self.config, self.options = backend, judge, config, options
        self.result, self.researcher, self.search_down, self.facts_out = (
            result,
            researcher,
            search_down,
            facts_out,
        )
        self.judge_gate = asyncio.Semaphore(options.concurrency)
        self.cheap_judge = HeuristicJudge()
        #: set on SIGTERM: traces in flight finish and are written, the rest are listed, not started
        self.stop = asyncio.Event()

    def skip(
        self,
        votes: Sequence[Vote],
        trace_id: str | None,
        kind: UndecidedKind,
        reason: str,
        question: str | None = None,
    ) -> None:
        undecided = Undecided(vote_ids=[v.id for v in votes], trace_id=trace_id, kind=kind, reason=reason)
        url = self.backend.trace_url(trace_id) if trace_id else None
        self.result.skipped.append(
            Skipped(undecided, shorten(question) if question else None, _comments(votes), url)
        )
        log.warning(
            "undecided %s: %s",
            trace_id or ",".join(undecided.vote_ids),
            reason,
            extra={"event": "undecided", "trace_id": trace_id, "kind": kind},
        )

    async def triage_one(self, trace: Trace, votes: list[Vote]) -> tuple[Entry, list[ScoreWrite]] | None:
        comment = "\n".join(_comments(votes)) or None
        base = Facts(
            agent_searched=trace.searched,
            agent_searched_collections=sorted(trace.searched_collections),
        )
        research: list[Passage] | None = None
        search_problem = self.search_down
        async with self.judge_gate:
            if self.judge.needs_research and self.researcher is not None and trace.searched:
                try:
                    research = await self.researcher.research(trace, comment)
                except SearchError as ex:
                    search_problem = str(ex)
            # the trace alone proves the layer when the agent never searched: no model is asked,
            # only the free checks run (invented specifics, decline phrases, injection)
            judge = self.judge if trace.searched else self.cheap_judge
            try:
                facts = await judge.judge(trace, research, comment, base)
            except JudgeRejected as ex:
                self.skip(votes, trace.id, "rejected", f"judge output rejected: {ex}", trace.question)
                return None
            except JudgeError as ex:
                self.skip(votes, trace.id, "unavailable", f"judge unavailable: {ex}", trace.question)
                return None
        try:
            layer = decide(facts, self.config.agent.issues_collection)
        except Undetermined as ex:
            why = (
                f"search unavailable ({search_problem})"
                if ex.missing == "index_has_answer" and (search_problem)
                else "the judge could not establish it"
            )
            self.skip(votes, trace.id, "unavailable", f"{ex}: {why}", trace.question)
            return None
        component = (
            component_from_sources(facts.answer_sources, self.config)
            or (facts.component if facts.component in self.config.components else None)
            or find_component([], trace.question, comment, self.config)
        )
        reason = explain(layer, facts)
        verdict = Verdict(
            trace_id=trace.id,
            layer=layer,
            component=component,
            owners=owners(layer, component, self.config),
            reason=reason,
            facts=facts,
            rule_version=self.config.rule_version,
            judge=self.judge.name,
            prompt_version=self.judge.prompt_version,
        )
        if self.facts_out is not None:
            # the local run file: what `--judge replay:FILE` reads back
            self.facts_out.write(json.dumps({"trace_id": trace.id, **facts.model_dump(mode="json")}) + "\n")
        entry = Entry(
            trace_id=trace.id,
            layer=layer,
            component=component,
            owners=verdict.owners,
            reason=reason,
            question=shorten(trace.question),
            comments=_comments(votes),
            url=trace.url,
            injection_suspected=facts.injection_suspected,
        )
        return entry, self.scores_for(verdict, trace, votes)

    def scores_for(self, verdict: Verdict, trace: Trace, votes: list[Vote]) -> list[ScoreWrite]:
        names = self.config.scores
        stamp = score_timestamp(trace.start_time, min(v.timestamp for v in votes))
        metadata = {
            "facts": verdict.facts.model_dump(mode="json"),
            "judge": verdict.judge,
            "prompt_version": verdict.prompt_version,
            "rule_version": verdict.rule_version,
            "owners": verdict.owners,
            "votes": [v.id for v in votes],
        }
        return [
            ScoreWrite(
                id=score_id(trace.id, name, verdict.rule_version),
                trace_id=trace.id,
                name=name,
                value=value,
                comment=verdict.reason,
                metadata=metadata,
                timestamp=stamp,
                environment=trace.environment,
            )
            for name, value in ((names.layer, verdict.layer.value), (names.component, verdict.component))
        ]


def window(options: RunOptions, config: TriageConfig) -> tuple[datetime, datetime]:
    """[start, end): `since_hours` ending `lag` before now, reaching `overlap` further back."""
    end = options.now - timedelta(minutes=config.window.lag_minutes)
    start = end - timedelta(hours=options.since_hours, minutes=config.window.overlap_minutes)
    return start, end


def _resolve_sessions(backend: Backend, votes: list[Vote], run: _Run) -> dict[str, list[Vote]]:
    """Votes grouped by trace id; a session vote goes to the `turn`-th trace of its session."""
    by_trace: dict[str, list[Vote]] = {}
    session_votes = [v for v in votes if not v.trace_id]
    sessions = backend.session_traces(sorted({v.session_id for v in session_votes if v.session_id}))
    for vote in votes:
        if vote.trace_id:
            by_trace.setdefault(vote.trace_id, []).append(vote)
            continue
        if not vote.session_id:
            run.skip([vote], None, "bad_input", "vote is on neither a trace nor a session")
            continue
        traces = sessions.get(vote.session_id, [])
        if vote.turn is None:
            run.skip(
                [vote], None, "bad_input", f"session vote on {vote.session_id} has no turn in its metadata"
            )
        elif vote.turn < len(traces):
            by_trace.setdefault(traces[vote.turn], []).append(vote)
        else:
            run.skip(
                [vote],
                None,
                "pending",
                f"session {vote.session_id} has {len(traces)} trace(s) so far; turn {vote.turn} has not arrived",
            )
    return by_trace


async def run_feedback(
    *,
    backend: Backend,
    judge: Judge,
    config: TriageConfig,
    options: RunOptions,
    searcher: AbstractAsyncContextManager[Searcher] | None = None,
) -> RunResult:
    """Triage every thumbs-down in the window. The one core function behind `triage feedback`."""
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
    votes = await asyncio.to_thread(backend.votes, config.scores.vote, start, end)
    result.votes_seen = len(votes)
    down = [
        v for v in votes if v.is_thumbs_down and options.shard.owns(v.trace_id or f"session:{v.session_id}")
    ]
    result.thumbs_down = len(down)

    try:
        facts_out = open(options.facts_file, "a", encoding="utf-8") if options.facts_file else None  # noqa: SIM115
    except OSError as ex:
        raise ConfigError(f"cannot write the facts file {options.facts_file}: {ex.strerror or ex}") from ex
    try:
        async with _open_searcher(searcher if judge.needs_research else None) as (live, down_reason):
            researcher = (
                Researcher(live, config.collections, config.search.top_k, config.search.use_comment)
                if live is not None
                else None
            )
            run = _Run(
                backend,
                judge,
                config,
                options,
                result,
                researcher,
                down_reason if judge.needs_research else None,
                facts_out,
            )
            by_trace = await asyncio.to_thread(_resolve_sessions, backend, down, run)
            # from here each trace's votes travel with it and are dropped once it is done, so memory
            # stays flat however large the window
            del votes, down
            trace_ids = sorted(by_trace)
            if not options.force and trace_ids:
                done: set[str] = set()
                for i in range(0, len(trace_ids), 100):
                    chunk = trace_ids[i : i + 100]
                    done |= await asyncio.to_thread(
                        backend.triaged, chunk, config.scores.layer, config.rule_version
                    )
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
            with _stop_on_sigterm(run.stop):
                await _stream(run, by_trace, trace_ids)
            result.search_calls = researcher.calls if researcher else 0
    finally:
        if facts_out:
            facts_out.close()
    result.usage = judge.usage
    result.requests = backend.request_count
    result.elapsed = time.monotonic() - started
    return result


@contextmanager
def _stop_on_sigterm(stop: asyncio.Event) -> Iterator[None]:
    """Kubernetes sends SIGTERM before it kills a Pod: finish what is in flight, write it, report."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, _on_sigterm, stop)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _on_sigterm(stop: asyncio.Event) -> None:
    log.warning("SIGTERM: finishing the traces in flight, listing the rest", extra={"event": "sigterm"})
    stop.set()


async def _stream(run: _Run, by_trace: dict[str, list[Vote]], trace_ids: list[str]) -> None:
    options, backend, result = run.options, run.backend, run.result
    progress = Progress(len(trace_ids), options.progress_seconds)
    traces: asyncio.Queue[tuple[Trace, list[Vote]] | None] = asyncio.Queue(maxsize=2 * options.batch_size)
    # bounded too: when writes lag, the judges wait instead of piling verdicts up in memory
    scores: asyncio.Queue[tuple[Entry, list[ScoreWrite], list[Vote]] | None] = asyncio.Queue(
        maxsize=2 * options.batch_size
    )

    def read(chunk: list[str]) -> tuple[dict[str, list[Observation]], dict[str, str | None]]:
        # trace_url may make its one request (the project id) on first use: keep it off the event loop
        return backend.observations(chunk), {t: backend.trace_url(t) for t in chunk}

    stopped = "the run was stopped (SIGTERM) before this trace was triaged"

    async def produce() -> None:
        for i in range(0, len(trace_ids), options.batch_size):
            chunk = trace_ids[i : i + options.batch_size]
            if run.stop.is_set():
                for trace_id in chunk:
                    run.skip(by_trace.pop(trace_id), trace_id, "unavailable", stopped)
                continue
            try:
                found, urls = await asyncio.to_thread(read, chunk)
            except ConfigError:
                raise
            except SourceError as ex:
                for trace_id in chunk:
                    run.skip(
                        by_trace.pop(trace_id), trace_id, "unavailable", f"could not read the trace: {ex}"
                    )
                    progress.tick()
                continue
            for trace_id in chunk:
                votes = by_trace.pop(trace_id)
                try:
                    trace = read_trace(trace_id, found.get(trace_id, []), run.config.tools, urls[trace_id])
                except InputError as ex:
                    run.skip(votes, trace_id, "bad_input", str(ex))
                    progress.tick()
                    continue
                await traces.put((trace, votes))
        for _ in range(options.concurrency):
            await traces.put(None)

    async def work() -> None:
        while (item := await traces.get()) is not None:
            trace, votes = item
            if run.stop.is_set():
                run.skip(votes, trace.id, "unavailable", stopped, trace.question)
                continue
            try:
                outcome = await run.triage_one(trace, votes)
            except ConfigError:
                raise  # refused credentials fail every trace alike: end the run (exit 3)
            except Exception as ex:
                # a bug must not cost the other traces their triage: list this one, go on
                log.exception("internal error on trace %s", trace.id, extra={"event": "error"})
                run.skip(
                    votes, trace.id, "error", f"internal error: {type(ex).__name__}: {ex}", trace.question
                )
                outcome = None
            if outcome is not None:
                entry, writes = outcome
                result.entries.append(entry)
                if options.write:
                    await scores.put((entry, writes, votes))
            progress.tick()

    async def flush(batch: list[tuple[Entry, list[ScoreWrite], list[Vote]]]) -> None:
        writes = [w for _, ws, _ in batch for w in ws]
        try:
            outcome = await asyncio.to_thread(backend.write_scores, writes)
            confirmed, failed = set(outcome.confirmed), outcome.failed
        except ConfigError:
            raise
        except SourceError as ex:
            confirmed, failed = set(), {w.id: str(ex) for w in writes}
        for entry, ws, votes in batch:
            missing = [failed.get(w.id, "not confirmed") for w in ws if w.id not in confirmed]
            if missing:
                run.skip(
                    votes,
                    entry.trace_id,
                    "not_written",
                    f"triaged as {entry.layer.value}, but the score was not written: {missing[0]}",
                    entry.question,
                )
            else:
                entry.written = True
                result.written += len(ws)

    async def write() -> None:
        batch: list[tuple[Entry, list[ScoreWrite], list[Vote]]] = []
        while (item := await scores.get()) is not None:
            batch.append(item)
            if len(batch) >= options.batch_size:
                await flush(batch)
                batch = []
        if batch:
            await flush(batch)

    try:
        # a failure anywhere (refused credentials) cancels the rest instead of leaving it blocked
        async with asyncio.TaskGroup() as everything:
            everything.create_task(write())
            async with asyncio.TaskGroup() as readers_and_judges:
                readers_and_judges.create_task(produce())
                for _ in range(options.concurrency):
                    readers_and_judges.create_task(work())
            await scores.put(None)
    except BaseExceptionGroup as group:
        raise _first_error(group) from None
    progress.tick(force=True)


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report out of nested task groups: a `TriageError` (it has an exit code) first."""
    errors = leaves(group)
    return next((e for e in errors if isinstance(e, TriageError)), errors[0])
