"""The one way the relay writes its ledger: group commits.

Requests (`run`, on the event loop) queue their work; the first to arrive starts a batch, the
requests already read join it, and the batch runs as one transaction: every request's function
inside it, then one COMMIT before any of them is answered. The delivery worker's steps (`call`,
from its thread) are batches of one through the same code, under the same lock.

Failures stay where they belong: a request whose function refuses (a `Problem`) or whose rows
cannot be stored (`BadScore`) fails alone; a ledger that cannot commit (disk full, file gone)
fails the batch with `LedgerDown`, which the relay answers 503 with Retry-After: it never writes
around its ledger. No failure leaves a request unanswered.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from triage.errors import SourceError
from triage.relay import ledger as storage
from triage.relay.ledger import Op, Reads, Tx, Where
from triage.relay.problems import Problem

log = logging.getLogger("triage.relay")
T = TypeVar("T")


class LedgerDown(SourceError):
    """The ledger could not commit (disk full, file gone, locked): nothing of the batch is durable."""


@dataclass
class _Item(Generic[T]):
    fn: Callable[[Tx], T]
    keys: list[tuple[str, str]]
    future: asyncio.Future[tuple[T, list[Op], Where]] | None = None


_Outcome = tuple[Any, list[Op] | None, BaseException | None]


class Ledger:
    """The ledger file (`ledger.py`), its one writer connection, and the group commit over it."""

    def __init__(
        self,
        path: Path | str,
        *,
        now: Callable[[], float],
        after_commit: Callable[[list[Op]], object] | None = None,
        max_batch: int = 512,
    ) -> None:
        self.path = str(path)
        self.now = now
        #: called with the batch's ops once committed (the embedded store's inline delivery);
        #: raising puts the ops in the outbox instead
        self.after_commit = after_commit
        self.max_batch = max_batch
        #: with an inline sink (the embedded store) the store's own commit makes a write durable and
        #: the outbox is used only when it fails; else the outbox commit must reach the disk first
        self.inline = after_commit is not None
        self._db = storage.open_file(self.path, inline=self.inline)
        self.reads = Reads(self.path, now, self._db)
        self._lock = threading.Lock()
        self._pending: list[_Item[Any]] = []
        self._committing = False
        #: inline mode: the store failed and the outbox holds writes the worker has yet to deliver
        #: (a previous process may have left some)
        self._backlog = self.inline and self._has_backlog()
        if self._backlog:
            self._db.execute("PRAGMA synchronous=FULL")
        self.closed = False

    def _has_backlog(self) -> bool:
        return self._db.execute("SELECT 1 FROM outbox WHERE dead = 0 LIMIT 1").fetchone() is not None

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the file without blocking the writer (the worker's
        housekeeping, off the request path)."""
        if self.path == ":memory:" or self.closed:
            return
        db = sqlite3.connect(self.path, timeout=1)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    # -- writing ---------------------------------------------------------------------------------

    def call(self, fn: Callable[[Tx], T]) -> T:
        """Run `fn` in a transaction of its own, now, on the caller's thread (the delivery worker's
        claims and results); raises what it raised, or `LedgerDown`."""
        if self.closed:
            raise LedgerDown("the ledger is closed")
        with self._lock:
            outcomes = self._prepare([_Item(fn, [])])
            where = self._finish(outcomes) if outcomes[0][2] is None else self._abandon()
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
        self._lock.acquire()
        try:
            outcomes = self._prepare(batch)
            if all(error is not None for _, _, error in outcomes):
                return outcomes, self._abandon()  # every request refused, or the batch failed
            if self.inline and not self._backlog:
                # the ledger's commit does not wait for the disk (synchronous=NORMAL: the store's
                # commit makes the write durable) and the store's write is one transaction with one
                # fsync: run here, that costs less than handing it to a thread, which waits for the
                # GIL behind this loop at every SQLite call (measured: 1,240/s against 1,030-1,140/s)
                return outcomes, self._finish(outcomes)
            return outcomes, await asyncio.to_thread(self._finish, outcomes)  # an fsynced commit
        finally:
            self._lock.release()

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
        db = self._db
        if self._backlog and not self._has_backlog():
            self._backlog = False  # the worker caught up: the store takes writes inline again
            db.execute("PRAGMA synchronous=NORMAL")
        outcomes: list[_Outcome] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            keys = {k for item in batch for k in item.keys}
            cache = storage.prefetch(db, keys) if keys else {}
            params: list[tuple[Any, ...]] = []
            queued: list[Op] = []
            for item in batch:
                tx = Tx(cache, self.now, db)
                try:
                    result = item.fn(tx)
                    tx.seal()
                except sqlite3.Error:
                    raise  # the ledger itself failed: the whole batch
                except Exception as ex:  # a refused request (Problem, BadScore): only this one fails
                    outcomes.append((None, None, ex))
                    continue
                params += tx.params
                queued += tx.ops
                outcomes.append((result, tx.ops, None))
            if params:
                storage.store_rows(db, params)
            if not self.inline or self._backlog:
                # behind a backlog, a write queues too: delivered inline, it would be overwritten
                # by an older write of the same id that the worker delivers later
                storage.enqueue(db, queued, self.now())
        except Exception as ex:
            self._rollback(ex)
            down = LedgerDown(str(ex))
            return [(None, None, down)] * len(batch)
        return outcomes

    def _abandon(self) -> Where:
        """End a transaction that wrote nothing (every request in it was refused)."""
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # already rolled back (the batch failed)
        return "store"

    def _rollback(self, ex: BaseException) -> None:
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        log.error("the ledger could not commit: %s", ex, extra={"event": "ledger_down"})

    def _finish(self, outcomes: list[_Outcome]) -> Where | LedgerDown:
        """COMMIT, then (inline sink) deliver; where the batch's writes are durable."""
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as ex:
            self._rollback(ex)
            return LedgerDown(str(ex))
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
        db = self._db
        try:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            storage.enqueue(db, ops, self.now())
            db.execute("COMMIT")
            self._backlog = True  # until the worker drains it, commits are fsynced (FULL stays)
            return "outbox"
        except sqlite3.Error:
            for statement in ("ROLLBACK", "PRAGMA synchronous=NORMAL"):
                try:
                    db.execute(statement)
                except sqlite3.Error:
                    pass
            return None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with self._lock:
            self.reads.close(self._db)
            self._db.close()
