"""Batch mode for the night (`triage feedback --batch`): the model judge's calls gathered into rounds
of the Batch API (`judges.model.batch.BatchRunner`), every call answered once, in a batch or directly.

    collector = BatchCollector(deadline=started + timedelta(seconds=3600))
    judge = LLMJudge(..., batch=collector)         # attaches a runner on the judge's own client
    with collector.flying(trace.id): ...           # the engine: a trace, from its start to its verdict
    completion = await collector.ask(body, trace_id="t1", call="containment")  # None: send directly

How calls become rounds. The judge asks each call's first attempt here (`ChatExchange`); the call is
queued with a future and its trace waits. The queue goes as one round (one `BatchRunner.run`: a
batch per 50,000 requests) once every trace in flight waits on the collector, since nothing more can
come before answers do: the engine says which traces are in flight (`flying`), and in batch mode it
judges the window's traces all at once, up to `traces_at_once`. A trace still searching or parsing
holds the round back; one that stays busy for `quiet` seconds with no new call queued does not (the
round goes, and that trace joins the next). Without the engine's word (no trace flying) a round goes
once the queue has been still for `settle` seconds.

The answers resolve the futures. A trace that needs another call asks again, and those calls form the
next round: the cascade's grounding call after its containment call, the judge's follow-up over its
own search. A call the round leaves (failed, expired, cancelled at the deadline, unreadable: the
runner's `Left`) is answered None, and the judge sends it directly, once; so is every retry after a
first attempt, and every call after the deadline. Nothing is lost, and nothing is answered twice.

Deadline: a round is polled until `deadline` (the caller sets it below the CronJob's own; the runner
then cancels what still runs and reads its partial output). Once less is left than a round can use
(two first polls), every call goes directly.

A server without the Batch API (`BatchUnsupported`), or one where batch mode fails before any batch
exists (`BatchRunError`), is used directly for the rest of the run, and that is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from openai.types.chat import ChatCompletion

from triage.judges.model.batch import MAX_REQUESTS, BatchRunError, BatchRunner, BatchUnsupported
from triage.retry import Clock, current_clock

log = logging.getLogger("triage.judges.batch")

#: traces judged at once in batch mode, so their calls share a round; each holds its trace, passages
#: and prompts while it waits (about 0.1 MB), so the cap bounds memory as the concurrency did
TRACES_AT_ONCE = 1000


@dataclass
class _Call:
    trace_id: str
    body: Mapping[str, Any]
    future: asyncio.Future[ChatCompletion | None]


@dataclass(frozen=True)
class Round:
    """One round as it ended: its calls, answered in batches or left to be sent directly."""

    number: int
    calls: int
    answered: int
    #: why the rest were left (the runner's `Left.kind`, or `direct` when no batch was made)
    left: Mapping[str, int] = field(default_factory=dict)
    batches: int = 0
    seconds: float = 0.0


class BatchCollector:
    """See the module docstring. One per run; `attach` gives it the judge's runner."""

    def __init__(
        self,
        *,
        deadline: datetime,
        clock: Clock | None = None,
        traces_at_once: int = TRACES_AT_ONCE,
        settle: float = 0.05,
        quiet: float = 30.0,
        max_requests: int = MAX_REQUESTS,
    ) -> None:
        if deadline.tzinfo is None:
            raise ValueError("deadline must be timezone-aware")
        if traces_at_once < 1 or settle <= 0 or quiet < settle or max_requests < 1:
            raise ValueError("traces_at_once >= 1, 0 < settle <= quiet, max_requests >= 1")
        self.deadline = deadline
        self._clock = clock
        self.traces_at_once = traces_at_once
        self.settle = settle
        self.quiet = quiet
        self.max_requests = max_requests
        self.runner: BatchRunner | None = None
        #: why every call goes directly now (no Batch API, batch mode failed, the deadline); None: batching
        self.direct: str | None = None
        self.rounds: list[Round] = []
        self._queue: dict[str, _Call] = {}
        self._flying: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()
        self._last = 0.0  # when the last call was queued (real time: it is about tasks, not the clock)
        self._watcher: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._numbers = 0

    @property
    def clock(self) -> Clock:
        return self._clock or current_clock()

    @property
    def attached(self) -> bool:
        """A model judge asks through this collector (a judge that makes no model call never does)."""
        return self.runner is not None

    def attach(self, runner: BatchRunner) -> None:
        if self.runner is not None and self.runner is not runner:
            raise ValueError("a collector gathers the calls of one judge")
        self.runner = runner

    # -- the engine's side ---------------------------------------------------------------------

    @contextmanager
    def flying(self, trace_id: str) -> Iterator[None]:
        """`trace_id` is being triaged: a round waits for it to ask, or to finish."""
        self._flying[trace_id] += 1
        try:
            yield
        finally:
            self._flying[trace_id] -= 1
            if self._flying[trace_id] <= 0:
                del self._flying[trace_id]
            self._poke()

    # -- the judge's side ----------------------------------------------------------------------

    async def ask(self, body: Mapping[str, Any], *, trace_id: str, call: str) -> ChatCompletion | None:
        """The answer of a batch round to this chat-completion request; None: send it directly
        (no Batch API, too near the deadline, or its round left it)."""
        if not self._batching():
            return None
        future: asyncio.Future[ChatCompletion | None] = asyncio.get_running_loop().create_future()
        custom_id = self._custom_id(trace_id, call)
        self._queue[custom_id] = _Call(trace_id, body, future)
        self._waiting[trace_id] += 1
        self._last = time.monotonic()
        self._poke()
        try:
            return await future
        finally:
            queued = self._queue.get(custom_id)
            if queued is not None and queued.future is future:  # cancelled before its round went
                del self._queue[custom_id]
            self._waiting[trace_id] -= 1
            if self._waiting[trace_id] <= 0:
                del self._waiting[trace_id]

    def _custom_id(self, trace_id: str, call: str) -> str:
        """`<trace>:<call>`, unique in the queue (a batch file refuses a repeated custom_id)."""
        base = custom_id = f"{trace_id}:{call}"
        n = 1
        while custom_id in self._queue:
            n += 1
            custom_id = f"{base}:{n}"
        return custom_id

    def _batching(self) -> bool:
        if self.runner is None or self.direct is not None:
            return False
        left = (self.deadline - self.clock.now()).total_seconds()
        if left <= 2 * self.runner.poll.initial:
            self._go_direct("the batch deadline is near", event="batch_deadline")
            return False
        return True

    # -- rounds --------------------------------------------------------------------------------

    def _poke(self) -> None:
        """Watch the queue, unless already watching (or nothing is queued)."""
        if not self._queue or (self._watcher is not None and not self._watcher.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: nothing can be waiting
            return
        self._watcher = loop.create_task(self._watch())

    async def _watch(self) -> None:
        while self._queue:
            await asyncio.sleep(self.settle)
            if self._queue and self._due():
                self._send()

    def _due(self) -> bool:
        """Whether the queue goes now: every trace in flight waits (or, with none known, the queue
        has been still), it has been quiet too long, or it is as large as a batch."""
        still = time.monotonic() - self._last
        if len(self._queue) >= self.max_requests or still >= self.quiet:
            return True
        if not self._flying:
            return still >= self.settle
        return all(self._waiting[trace_id] > 0 for trace_id in self._flying)

    def _send(self) -> None:
        calls, self._queue = self._queue, {}
        self._numbers += 1
        task = asyncio.get_running_loop().create_task(self._round(self._numbers, calls))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _round(self, number: int, calls: dict[str, _Call]) -> None:
        runner = self.runner
        assert runner is not None
        started = time.monotonic()
        answers: dict[str, ChatCompletion] = {}
        left: Counter[str] = Counter()
        batches = 0
        try:
            if self._batching():  # the deadline may have come, or batch mode failed, meanwhile
                outcome = await runner.run({cid: c.body for cid, c in calls.items()}, deadline=self.deadline)
                answers = {cid: answered.completion for cid, answered in outcome.answered.items()}
                left.update(item.kind for item in outcome.left.values())
                batches = len(outcome.batches)
        except BatchUnsupported as ex:
            self._go_direct(str(ex), event="batch_unsupported")
        except BatchRunError as ex:
            self._go_direct(str(ex), event="batch_unavailable")
        except Exception as ex:  # never lose a call to a failure here: they go directly
            log.exception("batch round %d failed; its calls go directly", number, extra={"event": "error"})
            self._go_direct(f"batch mode failed: {type(ex).__name__}: {ex}", event="batch_unavailable")
        finally:
            for custom_id, call in calls.items():
                if not call.future.done():
                    call.future.set_result(answers.get(custom_id))
            direct = len(calls) - len(answers) - sum(left.values())
            if direct:
                left["direct"] += direct
            record = Round(number, len(calls), len(answers), dict(left), batches, time.monotonic() - started)
            self.rounds.append(record)
            log.info(
                "batch round %d: %d calls in %d batch(es), %d answered, %d sent directly%s, %.0f s",
                number,
                record.calls,
                batches,
                record.answered,
                record.calls - record.answered,
                f" ({', '.join(f'{kind} {n}' for kind, n in sorted(left.items()))})" if left else "",
                record.seconds,
                extra={"event": "batch_round", "calls": record.calls, "answered": record.answered},
            )

    def _go_direct(self, reason: str, *, event: str) -> None:
        if self.direct is not None:
            return
        self.direct = reason
        log.warning("%s: the judge's calls go directly from now", reason, extra={"event": event})

    async def aclose(self) -> None:
        """Stop watching; a round still running is cancelled (its calls answered None)."""
        tasks = [t for t in (self._watcher, *self._running) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
