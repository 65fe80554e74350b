"""Where the relay's writes land, and how: the embedded store (inline, in the writer's batch) or
Langfuse (from the outbox, batched), each through the sources' one write path; and the delivery
worker, which takes due operations from the outbox in batches, delivers them, and backs off
(`retry.RetryPolicy`: exponentially, or as long as a 429's `Retry-After` asks, up to a cap) while
the sink fails.

`Worker.run_once` is one step (tests drive it in virtual time); `start` runs steps on a thread,
waking when the writer enqueues something or the next retry is due.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import Literal, Protocol

import httpx

from triage.domain.config import RelayConfig
from triage.domain.review import ensure_configs
from triage.domain.scores import ScoreBody
from triage.errors import SourceError, TriageError
from triage.relay.commits import GroupCommit
from triage.relay.storage import Op, Settlement
from triage.retry import Clock, RetryPolicy
from triage.sources.langfuse.annotations import LangfuseAnnotations
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp
from triage.sources.langfuse.reads import ScoreReads
from triage.sources.langfuse.writes import ScoreWrites, failure
from triage.sources.store import Store

log = logging.getLogger("triage.relay")


class DeliveryFailed(SourceError):
    """A write the sink did not take. `retryable`: Langfuse was down, slow or rate-limiting;
    `permanent`: it can never be taken (no retry: set aside at once, alone)."""

    def __init__(
        self, message: str, *, retryable: bool = True, wait: float | None = None, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.retryable = retryable and not permanent
        self.permanent = permanent
        self.wait = wait


# -- the sinks ------------------------------------------------------------------------------------


#: one attempt per call: the outbox is the retry (with its own back-off), so a request never waits
ONE_ATTEMPT = RetryPolicy(attempts=1)


class Sink(Protocol):
    """Where writes land: `deliver` takes the ops of a batch, in order."""

    name: str
    #: True: deliver in the writer's batch, before the requests are answered (the embedded store)
    inline: bool

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        """Deliver ops in order; the ones that failed, by seq (empty: all delivered). Raises
        `DeliveryFailed` when none could be (the sink is down)."""
        ...

    def reachable(self) -> bool: ...

    def close(self) -> None: ...


def _store_op(op: Op) -> tuple[Literal["put"], ScoreBody] | tuple[Literal["delete"], str]:
    return ("put", op.body) if op.op == "put" and op.body is not None else ("delete", op.score_id)


def coalesce(ops: Sequence[Op]) -> list[Op]:
    """The newest op per score id, in order of seq (older ones are superseded)."""
    newest: dict[str, Op] = {}
    for op in sorted(ops, key=lambda o: o.seq):
        newest.pop(op.score_id, None)
        newest[op.score_id] = op
    return list(newest.values())


class StoreSink:
    name = "store"
    inline = True

    def __init__(self, store: Store) -> None:
        self.store = store
        store.use_wal()  # one fsync per batch: the relay's latency is mostly this commit

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        # in order (a put then a delete of one id must end deleted), in one transaction: one fsync
        # per batch however its puts and deletes interleave
        try:
            self.store.apply_score_ops([_store_op(op) for op in ops])
        except sqlite3.OperationalError:
            raise  # the store is down (disk, lock): the outbox keeps every op
        except Exception:
            # one op the store cannot take must not fail its batch-mates: find it alone
            return self._one_by_one(ops)
        return {}

    def _one_by_one(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        failed: dict[int, DeliveryFailed] = {}
        for op in ops:
            try:
                self.store.apply_score_ops([_store_op(op)])
            except sqlite3.OperationalError:
                raise
            except Exception as ex:
                failed[op.seq] = DeliveryFailed(f"the store refused it: {type(ex).__name__}: {ex}", permanent=True)
        return failed

    def housekeeping(self) -> None:
        self.store.checkpoint()

    def reachable(self) -> bool:
        try:
            self.store.scores_named("__relay_ready__")
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.store.close()


class LangfuseSink:
    name = "langfuse"
    inline = False

    def __init__(self, http: LangfuseHttp, model: RelayConfig | None = None) -> None:
        self.http = http
        self.writes = ScoreWrites(http, ScoreReads(http), confirm_wait=0, confirm_first_wait=0)
        #: the declared model, mapped to Langfuse score configs on the worker's first chance
        self.model = model
        self.config_ids: dict[str, str] = {}
        self._configs_synced = model is None
        self._configs_tried = -1e9

    @property
    def requests(self) -> int:
        """Requests sent to Langfuse so far (the metrics page's count)."""
        return self.http.stats.requests

    def housekeeping(self) -> None:
        """Map the declared model to Langfuse score configs (once; again a minute after a failure)."""
        if self._configs_synced or self.model is None or time.monotonic() - self._configs_tried < 60:
            return
        self._configs_tried = time.monotonic()
        try:
            specs = [spec for score in self.model.scores if (spec := score.config_spec()) is not None]
            found = ensure_configs(LangfuseAnnotations(self.http), specs)
            for name, problem in found.misfits.items():
                log.warning(
                    "Langfuse score config %r differs from the declared model (%s): its scores go without it",
                    name,
                    problem,
                    extra={"event": "score_config_mismatch"},
                )
            self.config_ids = found.ids
            self._configs_synced = True
        except (HttpStatus, httpx.TransportError, TriageError) as ex:
            log.warning(
                "score configs not synced (again in a minute): %s",
                failure(ex).reason,
                extra={"event": "score_config"},
            )

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        """Puts through `ScoreWrites.write` (no read-back: the outbox retries), deletes through
        `ScoreWrites.delete`. Raises `DeliveryFailed` when Langfuse took nothing (it is down)."""
        failed: dict[int, DeliveryFailed] = {}
        ops = coalesce(ops)
        # a body no sink could send never gets here: the claim set it aside (storage.decode_body)
        puts = {op.score_id: op for op in ops if op.op == "put" and op.body is not None}
        if puts:
            bodies = [replace(op.body, config_id=self.config_ids.get(op.body.name)) for op in puts.values() if op.body]
            outcome = self.writes.write(bodies, confirm=False, retry=ONE_ATTEMPT)
            retryable = set(outcome.retryable)
            if not outcome.confirmed and set(outcome.failed) == retryable:
                first = next(iter(outcome.failed.values()))
                raise DeliveryFailed(first, wait=outcome.wait)  # Langfuse is down: nothing of this batch went
            for score_id, reason in outcome.failed.items():
                failed[puts[score_id].seq] = DeliveryFailed(
                    reason, retryable=score_id in retryable, wait=outcome.wait if score_id in retryable else None
                )
        deletes = {op.score_id: op for op in ops if op.op == "delete"}
        for score_id, problem in self.writes.delete(list(deletes), retry=ONE_ATTEMPT).items():
            seq = deletes[score_id].seq
            failed[seq] = DeliveryFailed(problem.reason, retryable=problem.retryable, wait=problem.wait)
        return failed

    def reachable(self) -> bool:
        try:
            self.http.call(
                "checking Langfuse", lambda: self.http.raw("GET", "api/public/projects"), retry=ONE_ATTEMPT
            )
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.http.close()


# -- the delivery worker ---------------------------------------------------------------------


#: how often the WAL checkpoints (the store's, the ledger's) run: a checkpoint's fsync delays the
#: commits beside it, and small ones every quarter second delay them less than one a second did
#: (bench/relay.py at 16 voters: p99 36-42 ms against 48-53 ms, interleaved runs)
HOUSEKEEPING_SECONDS = 0.25
#: how often a replica on a shared ledger runs the sink's housekeeping (under a database lock)
SHARED_HOUSEKEEPING_SECONDS = 5.0
#: the longest a sink's Retry-After is honoured (seconds): one of a day parked a batch of
#: acknowledged writes for a day
MAX_RETRY_AFTER = 60.0
#: how long a failed delivery waits: as long as the sink asked, up to the cap, else exponential
#: back-off with jitter; no limit of attempts (the outbox keeps an op until it is delivered or set aside)
BACKOFF = RetryPolicy(attempts=None, initial=0.5, maximum=30.0, max_retry_after=MAX_RETRY_AFTER)


@dataclass(eq=False)  # the constructor stores what it is given; one worker is one thread: compared by identity
class Worker:
    """Delivers the outbox to an outbox-delivered sink (Langfuse), or the backlog an inline one
    (the embedded store) could not take, in batches, with back-off; on a thread or step by step."""

    ledger: GroupCommit
    sink: Sink
    clock: Clock
    _: KW_ONLY
    batch_max: int = 500
    batch_wait: float = 0.25
    max_attempts: int = 20
    policy: RetryPolicy = BACKOFF
    # what it has done (metrics), and its thread
    delivered: int = field(default=0, init=False)
    failures: int = field(default=0, init=False)
    dead: int = field(default=0, init=False)
    last_error: str | None = field(default=None, init=False)
    housekeeping_failures: int = field(default=0, init=False)
    _failing: set[str] = field(default_factory=set, init=False)
    _wake: threading.Event = field(default_factory=threading.Event, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def backoff(self, attempts: int, asked: float | None = None) -> float:
        """Seconds until an op that failed `attempts` times is tried again (`asked`: the sink's
        Retry-After), by the one retry policy: this is its attempt number `attempts + 1`."""
        return self.policy.backoff(attempts + 1, asked)

    def run_once(self) -> int:
        """Deliver one batch of due operations; how many were delivered."""
        return self._step()[1]

    def _step(self) -> tuple[int, int]:
        """One delivery step through the ledger (which claims, and settles what `_send` says):
        (ops claimed, ops delivered)."""
        delivered = 0

        def send(ops: list[Op]) -> Settlement:
            nonlocal delivered
            done, retry, dead = self._send(ops)
            delivered = len(done)
            return done, retry, dead

        claimed = self.ledger.deliver(self.batch_max, send)
        return claimed, delivered

    def _send(self, ops: list[Op]) -> Settlement:
        """Deliver `ops` to the sink; what became of each: delivered, to retry (when, why), set aside."""
        now = self.clock.now().timestamp()
        try:
            failed = self.sink.deliver(ops)
        except DeliveryFailed as down:
            failed = {op.seq: down for op in ops}
        except Exception as ex:  # a bug in a sink must not stop delivery for good
            log.exception("delivery crashed", extra={"event": "delivery_crash"})
            failed = {op.seq: DeliveryFailed(f"{type(ex).__name__}: {ex}") for op in ops}
        retry: dict[int, tuple[float, str]] = {}
        dead: dict[int, str] = {}
        for op in ops:
            problem = failed.get(op.seq)
            if problem is None:
                continue
            if problem.permanent or (not problem.retryable and op.attempts + 1 >= self.max_attempts):
                dead[op.seq] = str(problem)
            else:
                retry[op.seq] = (now + self.backoff(op.attempts, problem.wait), str(problem))
        done = [op.seq for op in ops if op.seq not in failed]
        self.delivered += len(done)
        self.dead += len(dead)
        if failed:
            self.failures += 1
            self.last_error = str(next(iter(failed.values())))
            log.warning(
                "delivery to %s failed for %d of %d operations: %s (kept in the outbox)",
                self.sink.name,
                len(failed),
                len(ops),
                self.last_error,
                extra={"event": "delivery_failed"},
            )
        else:
            self.last_error = None
        return done, retry, dead

    def _housekeep(self, what: str, step: Callable[[], object]) -> None:
        """One housekeeping step. A failure is logged once when it starts and once when it ends,
        and counted every time (`relay_housekeeping_failures_total`): a read-only store logged a
        warning every quarter second, 14,400 lines an hour."""
        try:
            step()
        except Exception as ex:
            self.housekeeping_failures += 1
            if what not in self._failing:
                self._failing.add(what)
                log.warning("%s checkpoint failed (again silently, counted in /metrics): %s", what, ex,
                            extra={"event": "checkpoint_failed"})  # fmt: skip
            return
        if what in self._failing:
            self._failing.discard(what)
            log.info("%s checkpoint works again", what, extra={"event": "checkpoint_recovered"})

    def drain(self, rounds: int = 1000) -> None:
        """Deliver until nothing is due (tests, shutdown)."""
        for _ in range(rounds):
            if not self._step()[0]:
                return

    # -- the thread ------------------------------------------------------------------------------

    def notify(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="relay-delivery", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        checkpointed = self.clock.monotonic()
        shared_at = -SHARED_HOUSEKEEPING_SECONDS
        while not self._stop.is_set():
            if self.clock.monotonic() - checkpointed >= HOUSEKEEPING_SECONDS:
                checkpointed = self.clock.monotonic()
                housekeeping = getattr(self.sink, "housekeeping", None)
                if housekeeping is not None and not self.ledger.storage.remote:
                    self._housekeep("store", housekeeping)  # the store's WAL checkpoint, off the request path
                elif housekeeping is not None and self.clock.monotonic() - shared_at >= SHARED_HOUSEKEEPING_SECONDS:
                    # replicas: Langfuse's score configs made by one at a time (two at once would
                    # make each config twice); a lock in the database, so not every quarter second
                    shared_at = self.clock.monotonic()
                    self._housekeep("sink", partial(self.ledger.exclusively, "sink-housekeeping", housekeeping))
                self._housekeep("ledger", self.ledger.checkpoint)  # and the ledger's
            try:
                wait = self.ledger.due_in()
            except Exception:  # the ledger is closing or failing: try again shortly
                wait = 1.0
            if wait is None or wait > 0:
                self._wake.wait(timeout=min(wait if wait is not None else HOUSEKEEPING_SECONDS, HOUSEKEEPING_SECONDS))
                self._wake.clear()
                continue
            if self.batch_wait:
                self._stop.wait(self.batch_wait)  # let a batch fill: fewer requests per vote
            try:
                while not self._stop.is_set():
                    claimed, _ = self._step()
                    if claimed == 0:
                        # due, yet nothing to claim: another replica holds it (or an older op of
                        # its id) in flight; it settles within its delivery, so look again soon
                        self._wake.wait(timeout=HOUSEKEEPING_SECONDS)
                        self._wake.clear()
                    if claimed < self.batch_max:
                        break
            except Exception:
                log.exception("delivery step failed", extra={"event": "delivery_crash"})
                self._stop.wait(1.0)

    def stop(self, drain_seconds: float = 5.0) -> None:
        """Stop the thread; first try for a while to deliver what is due (SIGTERM)."""
        self._stop.set()
        self._wake.set()
        deadline = self.clock.monotonic() + drain_seconds
        if self._thread is not None:
            self._thread.join(timeout=drain_seconds)  # a delivery in flight ends within its time-out
        while self.clock.monotonic() < deadline and not (self._thread and self._thread.is_alive()):
            try:
                if not self._step()[0]:
                    break
            except Exception:
                break

