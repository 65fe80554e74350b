"""The one way the relay writes its ledger: group commits, on either storage (`storage.Storage`:
the SQLite file, or PostgreSQL shared by replicas).

Requests (`run`, on the event loop) queue their work; the first to arrive starts a batch, the
requests already read join it, and the batch runs as one transaction: every request's function
inside it, then one COMMIT before any of them is answered. The delivery worker's steps (`call`,
`deliver`, `due_in`, from its thread) go through the same code, under the same lock, or (where the
storage holds a delivery's claims in a transaction of their own) beside it.

Failures stay where they belong: a request whose function refuses (a `Problem`) or whose rows
cannot be stored (`BadScore`) fails alone; a ledger that cannot commit (disk full, file gone,
database unreachable) fails the batch with `LedgerDown`, which the relay answers 503 with
Retry-After: it never writes around its ledger. No failure leaves a request unanswered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from triage.errors import ConfigError, SourceError
from triage.relay.sqlite import SqliteStorage
from triage.relay.storage import Op, Reads, Settlement, Storage, Tx, Where
from triage.relay.web import Problem

log = logging.getLogger("triage.relay")
T = TypeVar("T")
#: a batch another replica's transaction made fail (a deadlock victim) is run again this often
_TRANSIENT_TRIES = 3


class LedgerDown(SourceError):
    """The ledger could not commit (disk full, file gone, locked): nothing of the batch is durable."""


@dataclass
class _Item(Generic[T]):
    fn: Callable[[Tx], T]
    keys: list[tuple[str, str]]
    future: asyncio.Future[tuple[T, list[Op], Where]] | None = None


_Outcome = tuple[Any, list[Op] | None, BaseException | None]


def is_database_url(location: Path | str) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def open_storage(location: Path | str, now: Callable[[], float], *, inline: bool) -> Storage:
    """The storage at `location`: a PostgreSQL URL (`postgresql://...`), else a SQLite file."""
    if is_database_url(location):
        if inline:
            raise ConfigError(
                "a PostgreSQL ledger is shared by replicas, so its sink must be Langfuse (the embedded "
                "store is one file on one machine)"
            )
        from triage.relay.postgres import PostgresStorage  # psycopg only where PostgreSQL is used

        return PostgresStorage(str(location), now)
    return SqliteStorage(str(location), now, inline=inline)


class GroupCommit:
    """The ledger's storage, its writer, and the group commit over it."""

    def __init__(
        self,
        path: Path | str | Storage,
        *,
        now: Callable[[], float],
        after_commit: Callable[[list[Op]], object] | None = None,
        max_batch: int = 512,
    ) -> None:
        self.now = now
        #: called with the batch's ops once committed (the embedded store's inline delivery);
        #: raising puts the ops in the outbox instead
        self.after_commit = after_commit
        self.max_batch = max_batch
        #: with an inline sink (the embedded store) the store's own commit makes a write durable and
        #: the outbox is used only when it fails; else the outbox commit must reach the disk first
        self.inline = after_commit is not None
        if isinstance(path, str | Path):
            self.storage = open_storage(path, now, inline=self.inline)
        else:
            self.storage = path
        #: where the ledger is, for messages: a file's path, never a database URL (it holds a password)
        self.path = str(path) if isinstance(path, str | Path) and not is_database_url(path) else self.storage.name
        self.reads: Reads = self.storage.reads
        self._lock = threading.Lock()
        #: the writer's own thread for the batches that leave the event loop: listings run off the
        #: loop too (the default executor), and a page of them must not hold a commit up
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-ledger")
        self._pending: list[_Item[Any]] = []
        self._committing = False
        #: inline mode: the store failed and the outbox holds writes the worker has yet to deliver
        #: (a previous process may have left some)
        self._backlog = self.inline and self.storage.has_backlog()
        if self._backlog:
            self.storage.durable(True)
        self.closed = False
        if self.inline:
            self._redeliver()

    def _redeliver(self) -> None:
        """Deliver again what the last inline batch kept (its store commit may never have come:
        the process was killed between the two commits); into the outbox if the store fails."""
        pending = self.storage.inline_pending()
        if not pending:
            return
        log.info("delivering the last batch again (%d ops) after a restart", len(pending),
                 extra={"event": "inline_redelivery"})  # fmt: skip
        with self._lock:
            try:
                assert self.after_commit is not None
                self.after_commit(pending)
            except Exception as ex:
                log.warning("the store failed, writes kept in the outbox: %s", ex, extra={"event": "store_down"})
                if self._to_outbox(pending) is None:
                    return  # kept for the next start
            self.storage.begin(())
            self.storage.mark_inline([])
            self.storage.commit()

    def checkpoint(self) -> None:
        """The storage's housekeeping (SQLite: copy the write-ahead log into the file without
        blocking the writer), off the request path."""
        if not self.closed:
            self.storage.housekeeping()

    def ready(self) -> str | None:
        """None when the storage would take a write now, else why not (readiness, beside the
        service's own record of refused writes): PostgreSQL probes that the server is reachable and
        takes writes (not a standby, not read-only); SQLite's one writer is this process."""
        if self.closed:
            return "the ledger is closed"
        return self.storage.ready()

    # -- writing ---------------------------------------------------------------------------------

    def call(self, fn: Callable[[Tx], T]) -> T:
        """Run `fn` in a transaction of its own, now, on the caller's thread (the delivery worker's
        claims and results); raises what it raised, or `LedgerDown`."""
        if self.closed:
            raise LedgerDown("the ledger is closed")
        with self._lock:
            outcomes = self._prepare([_Item(fn, [])])
            where = self._conclude(outcomes)
        result, _, error = outcomes[0]
        if error is not None:
            raise error
        if isinstance(where, LedgerDown):
            raise where
        return result  # type: ignore[no-any-return]

    async def run(
        self, fn: Callable[[Tx], T], keys: Sequence[tuple[str, str]] = ()
    ) -> tuple[T, list[Op], Where]:
        """Run `fn` in the next group commit with the ledger rows of `keys` ((answer, author)
        pairs); its result, its ops, and where they are durable (the store, or the outbox)."""
        if self.closed:
            raise Problem(503, "the relay is shutting down", {"Retry-After": "5"})
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[T, list[Op], Where]] = loop.create_future()
        self._pending.append(_Item(fn, list(keys), future))
        if not self._committing:
            self._committing = True
            loop.create_task(self._commit_pending())
        return await future

    async def _commit_pending(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(0)  # requests already read join this batch
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                try:
                    outcomes, where = await self._commit(batch)
                except BaseException as ex:  # nothing may leave a request unanswered
                    for item in batch:
                        self._settle(item, (None, None, None), LedgerDown(f"the batch failed: {ex!r}"))
                    if not isinstance(ex, Exception):
                        raise
                    log.exception("a group commit failed", extra={"event": "ledger_down"})
                    continue
                for item, outcome in zip(batch, outcomes, strict=True):
                    self._settle(item, outcome, where)
        finally:
            self._committing = False

    async def _commit(self, batch: list[_Item[Any]]) -> tuple[list[_Outcome], Where | LedgerDown]:
        loop = asyncio.get_running_loop()
        if self.storage.remote:
            # its calls wait on the network and on other replicas' transactions (a key another
            # replica is writing): never on the event loop
            return await loop.run_in_executor(self._writer, self._commit_blocking, batch)
        self._lock.acquire()
        try:
            outcomes = self._prepare(batch)
            if self._refused(outcomes) or (self.inline and not self._backlog):
                # the ledger's commit does not wait for the disk (synchronous=NORMAL: the store's
                # commit makes the write durable) and the store's write is one transaction with one
                # fsync: run here, that costs less than handing it to a thread, which waits for the
                # GIL behind this loop at every SQLite call (measured: 1,240/s against 1,030-1,140/s)
                return outcomes, self._conclude(outcomes)
            return outcomes, await loop.run_in_executor(self._writer, self._finish, outcomes)  # an fsynced commit
        finally:
            self._lock.release()

    def _commit_blocking(self, batch: list[_Item[Any]]) -> tuple[list[_Outcome], Where | LedgerDown]:
        """A whole group commit on this thread (a remote storage). A batch that lost a deadlock
        to another replica runs again: its functions read only the rows the retry reads anew."""
        with self._lock:
            for attempt in range(1, _TRANSIENT_TRIES + 1):
                outcomes = self._prepare(batch)
                failed = outcomes[0][2] if outcomes else None
                if (
                    attempt < _TRANSIENT_TRIES
                    and isinstance(failed, LedgerDown)
                    and all(error is failed for _, _, error in outcomes)
                    and failed.__cause__ is not None
                    and self.storage.transient(failed.__cause__)
                ):
                    continue
                break
            return outcomes, self._conclude(outcomes)

    @staticmethod
    def _settle(item: _Item[Any], outcome: _Outcome, where: Where | LedgerDown) -> None:
        future = item.future
        if future is None or future.done():  # the client went away
            return
        result, ops, error = outcome
        if error is not None:
            future.set_exception(error)
        elif isinstance(where, LedgerDown):
            future.set_exception(where)
        else:
            future.set_result((result, ops or [], where))

    def _prepare(self, batch: Sequence[_Item[Any]]) -> list[_Outcome]:
        """Everything of a group commit but the COMMIT: read the batch's rows, run each request's
        function, write the rows (and the outbox). A failure of the ledger itself fails every
        request of the batch (rolled back); a request's own failure, only that request."""
        storage = self.storage
        if self._backlog and not storage.has_backlog():
            self._backlog = False  # the worker caught up: the store takes writes inline again
            storage.durable(False)
        outcomes: list[_Outcome] = []
        try:
            keys = {k for item in batch for k in item.keys}
            db = storage.begin(sorted(keys))
            cache = storage.prefetch(keys) if keys else {}
            params: list[tuple[Any, ...]] = []
            queued: list[Op] = []
            for item in batch:
                tx = Tx(cache, self.now, db, storage.check)
                try:
                    result = item.fn(tx)
                    tx.seal()
                except storage.errors:
                    raise  # the ledger itself failed: the whole batch
                except Exception as ex:  # a refused request (Problem, BadScore): only this one fails
                    outcomes.append((None, None, ex))
                    continue
                params += tx.params
                queued += tx.ops
                outcomes.append((result, tx.ops, None))
            if params:
                storage.store_rows(params)
            if not self.inline or self._backlog:
                # behind a backlog, a write queues too: delivered inline, it would be overwritten
                # by an older write of the same id that the worker delivers later
                storage.enqueue(queued, self.now())
            if self.inline:
                # the store commits after the ledger: a process killed in between would leave the
                # ledger ahead (a cleared field the store still holds, which a retried request no
                # longer clears). The batch's ops are kept until the next transaction and delivered
                # again at start-up; behind a backlog the outbox keeps them instead
                storage.mark_inline([] if self._backlog else queued)
        except Exception as ex:
            down = self._rollback(ex)
            return [(None, None, down)] * len(batch)
        return outcomes

    @staticmethod
    def _refused(outcomes: list[_Outcome]) -> bool:
        """Every request of the batch refused, or the batch failed: nothing to commit."""
        return all(error is not None for _, _, error in outcomes)

    def _conclude(self, outcomes: list[_Outcome]) -> Where | LedgerDown:
        """Commit the prepared batch (`_finish`), or end a transaction that wrote nothing."""
        if not self._refused(outcomes):
            return self._finish(outcomes)
        self.storage.rollback()  # or already rolled back (the batch failed)
        return "store"

    def _rollback(self, ex: BaseException) -> LedgerDown:
        self.storage.rollback()
        log.error("the ledger could not commit: %s", ex, extra={"event": "ledger_down"})
        down = LedgerDown(str(ex))
        down.__cause__ = ex
        return down

    def _finish(self, outcomes: list[_Outcome]) -> Where | LedgerDown:
        """COMMIT, then (inline sink) deliver; where the batch's writes are durable."""
        try:
            self.storage.commit()
        except self.storage.errors as ex:
            return self._rollback(ex)
        committed = [op for _, ops, _ in outcomes if ops for op in ops]
        if self.after_commit is None or self._backlog:
            return "outbox"
        if committed:
            try:
                self.after_commit(committed)
            except Exception as ex:  # the store failed: the outbox keeps the ops for the worker
                log.warning("the store failed, writes kept in the outbox: %s", ex, extra={"event": "store_down"})
                return self._to_outbox(committed) or LedgerDown(f"the store failed ({ex}), so did the outbox")
        return "store"

    def _to_outbox(self, ops: list[Op]) -> Where | None:
        """Inline delivery failed: make the ops durable in the outbox (fsynced); None if that fails."""
        storage = self.storage
        try:
            storage.durable(True)
            storage.begin(())
            storage.enqueue(ops, self.now())
            storage.mark_inline([])  # the outbox keeps them now
            storage.commit()
            self._backlog = True  # until the worker drains it, commits are fsynced (FULL stays)
            return "outbox"
        except storage.errors:
            storage.rollback()
            try:
                storage.durable(False)
            except storage.errors:
                pass
            return None

    # -- delivering --------------------------------------------------------------------------------

    def deliver(self, limit: int, send: Callable[[list[Op]], Settlement]) -> int:
        """One delivery step: claim up to `limit` due ops, `send` them (the sink's call: no writer
        lock held), settle what came of them; how many were claimed. Raises `LedgerDown`, or the
        storage's own error, when the ledger fails."""
        if self.closed:
            raise LedgerDown("the ledger is closed")
        storage = self.storage
        if storage.holds_claims:
            # PostgreSQL: the claims are row locks of a transaction that spans the sink's call, so
            # no other replica delivers these ops, nor a newer op of their ids, until they are
            # settled; a replica that dies mid-delivery releases them with its connection
            return storage.deliver(limit, self.now, send)
        ops = self.call(lambda tx: storage.claim(tx, limit))
        if not ops:
            return 0
        done, retry, dead = send(ops)
        self.call(lambda tx: storage.settle(tx, done, retry, dead))
        return len(ops)

    def exclusively(self, name: str, fn: Callable[[], object]) -> bool:
        """Run `fn` unless another replica is running the `name` step right now (then skip it: the
        caller tries again later); whether it ran. One process on SQLite: it always runs."""
        if self.closed:
            return False
        return self.storage.exclusively(name, fn)

    def due_in(self) -> float | None:
        """Seconds until the next undelivered op is due (0: one is); None when none waits."""
        if self.closed:
            raise LedgerDown("the ledger is closed")
        if self.storage.holds_claims:
            return self.storage.due_in(None)  # its own connection: never behind the writer
        return self.call(lambda tx: self.storage.due_in(tx))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with self._lock:
            self.storage.close()
        self._writer.shutdown(wait=False)
