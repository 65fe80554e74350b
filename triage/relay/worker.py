"""The delivery worker: takes due operations from the outbox in batches, delivers them, and backs
off (exponentially, or as long as a 429's `Retry-After` asks) while the sink fails.

`run_once` is one step (tests drive it in virtual time); `start` runs steps on a thread, waking
when the writer enqueues something or the next retry is due.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from functools import partial

from triage.relay.commits import Ledger
from triage.relay.ledger import Op, Settlement
from triage.relay.problems import DeliveryFailed
from triage.relay.sinks import Sink
from triage.retry import Clock

log = logging.getLogger("triage.relay")

#: how often the WAL checkpoints (the store's, the ledger's) run: a checkpoint's fsync delays the
#: commits beside it, and small ones every quarter second delay them less than one a second did
#: (bench/relay.py at 16 voters: p99 36-42 ms against 48-53 ms, interleaved runs)
HOUSEKEEPING_SECONDS = 0.25
#: how often a replica on a shared ledger runs the sink's housekeeping (under a database lock)
SHARED_HOUSEKEEPING_SECONDS = 5.0
#: the longest a sink's Retry-After is honoured (seconds)
MAX_RETRY_AFTER = 60.0


class Worker:
    def __init__(
        self,
        ledger: Ledger,
        sink: Sink,
        clock: Clock,
        *,
        batch_max: int = 500,
        batch_wait: float = 0.25,
        max_attempts: int = 20,
        initial: float = 0.5,
        maximum: float = 30.0,
    ) -> None:
        self.ledger = ledger
        self.sink = sink
        self.clock = clock
        self.batch_max = batch_max
        self.batch_wait = batch_wait
        self.max_attempts = max_attempts
        self.initial = initial
        self.maximum = maximum
        self.delivered = 0
        self.failures = 0
        self.dead = 0
        self.last_error: str | None = None
        self.housekeeping_failures = 0
        self._failing: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def backoff(self, attempts: int) -> float:
        wait: float = self.initial * 2 ** min(attempts, 30) + random.uniform(0, self.initial)
        return min(wait, self.maximum)

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
                # a server's Retry-After is honoured up to a cap: one of a day parked a batch of
                # acknowledged writes for a day
                wait = min(problem.wait, MAX_RETRY_AFTER) if problem.wait is not None else self.backoff(op.attempts)
                retry[op.seq] = (now + wait, str(problem))
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

