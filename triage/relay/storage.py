"""The relay's storage port: what it has accepted (the ledger) and what it has yet to deliver (the
outbox), behind one small protocol (`Storage`) with two implementations: SQLite (`sqlite.py`: one
file, one process: the default, a laptop, a single replica) and PostgreSQL (`postgres.py`: any
number of replicas on one database). `commits.GroupCommit`, the one group commit, is the only
writer on either.

- `feedback`: one row per score id the relay ever wrote: its answer, author, name, the first
  write's timestamp (kept forever, so a changed vote overwrites in Langfuse, which upserts only on
  the same id and timestamp) and the current body (NULL once retracted).
- `outbox`: operations (`put` a body, `delete` an id) not yet confirmed by the sink. A newer
  operation on an id replaces an older one that is not in flight, so a voter who flips ten times
  costs one delivery. Deterministic ids make a redelivery after a crash harmless. An operation the
  sink refuses for good is set aside (`dead`), on its own.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from triage.domain.scores import BadScore, ScoreBody

#: SQLite's INTEGER: a Python int beyond it raises OverflowError inside `executemany`, which would
#: fail every request of the batch (a turn of 2**63 hung its group commit)
_INT_MAX = 2**63 - 1
#: the most (answer, author) groups one listing page holds
MAX_PAGE = 1000

Where = Literal["store", "outbox"]
Key = tuple[str, str]
#: what a delivery step settles: the seqs delivered, the ones to retry (when, why), the ones set aside (why)
Settlement = tuple[list[int], dict[int, tuple[float, str]], dict[int, str]]


@dataclass
class Row:
    """One score id in the ledger: whose, about which answer, its first timestamp, its current body."""

    id: str
    answer: str
    author: str
    name: str
    kind: str
    trace_id: str | None
    session_id: str | None
    turn: int | None
    timestamp: str
    body: ScoreBody | None
    updated_at: str

    def params(self) -> tuple[Any, ...]:
        """The row's SQL parameters; `BadScore` for one that cannot be stored (checked per request,
        so a bad one fails its own request, never its batch)."""
        if self.turn is not None and not 0 <= self.turn <= _INT_MAX:
            raise BadScore(f"turn {self.turn} is out of range")
        body = self.body.encoded() if self.body is not None else None
        return (self.id, self.answer, self.author, self.name, self.kind, self.trace_id, self.session_id,
                self.turn, self.timestamp, body, self.updated_at)  # fmt: skip


@dataclass
class Op:
    """One write for the sink: put a score body, or delete a score id."""

    op: Literal["put", "delete"]
    score_id: str
    body: ScoreBody | None = None
    seq: int = 0
    attempts: int = 0


@dataclass(frozen=True)
class ListingPage:
    """What one listing page asks the storage for: the live rows of the first `groups` (answer,
    author) pairs after `after` (in byte order of answer, then author) that pass the filters.
    `verdict_name`/`verdict_values`: only pairs whose live `verdict_name` row has one of the values."""

    trace_id: str | None = None
    session_id: str | None = None
    author: str | None = None
    verdict_name: str | None = None
    verdict_values: tuple[str, ...] = ()
    after: Key | None = None
    groups: int = 100


def encode_cursor(key: Key) -> str:
    """A listing's position, opaque to clients (they pass `next_cursor` back as they got it)."""
    return base64.urlsafe_b64encode(json.dumps(list(key), ensure_ascii=False).encode()).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> Key:
    """The position `encode_cursor` gave; ValueError for anything else."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a cursor") from None
    if not (isinstance(data, list) and len(data) == 2 and all(isinstance(x, str) for x in data)):
        raise ValueError("not a cursor")
    return data[0], data[1]


def row_of(r: Any) -> Row:
    """A ledger row from either storage's result row (SQLite's `sqlite3.Row`, PostgreSQL's dict)."""
    return Row(
        id=r["id"],
        answer=r["answer"],
        author=r["author"],
        name=r["name"],
        kind=r["kind"],
        trace_id=r["trace_id"],
        session_id=r["session_id"],
        turn=r["turn"],
        timestamp=r["timestamp"],
        body=decode_body(r["body"]),
        updated_at=r["updated_at"],
    )


def decode_body(text: str | None) -> ScoreBody | None:
    """A stored body, as a score; `BadScore` for one that is no score or that no sink could send
    (text that is not UTF-8, left by an older relay): both storages' claims set such an op aside,
    on its own, before any sink sees it."""
    if not text:
        return None
    body = ScoreBody.from_wire(json.loads(text))
    body.encoded()
    return body


class Tx:
    """What a request's function sees: the rows of the (answer, author) pairs it declared, and the
    writes it makes, applied only once it has returned (a refused request leaves nothing). Rows
    are read for the whole batch at once and written with one statement, so a batch costs a
    handful of storage calls whatever its size."""

    def __init__(
        self,
        cache: dict[Key, dict[str, Row]],
        now: Callable[[], float],
        db: Any = None,
        check: Callable[[Row], None] | None = None,
    ) -> None:
        self.cache = cache
        #: the transaction's connection (sqlite3, or psycopg): the delivery worker's SQLite steps use it
        self.db = db
        self.now = now
        self.ops: list[Op] = []
        self.rows_written: list[Row] = []
        self.params: list[tuple[Any, ...]] = []
        self._check = check

    def rows(self, answer: str, author: str) -> list[Row]:
        return list(self.cache.get((answer, author), {}).values())

    def put(self, row: Row) -> None:
        """Record the score's current body and its delivery."""
        assert row.body is not None
        self.ops.append(Op("put", row.id, row.body))
        self.rows_written.append(row)

    def retract(self, row: Row, updated_at: str) -> None:
        """The score is gone (its body NULL, its first timestamp kept); deliver the delete."""
        self.ops.append(Op("delete", row.id))
        self.rows_written.append(replace(row, body=None, updated_at=updated_at))

    def seal(self) -> None:
        """Encode the writes (raising `BadScore` for this request alone) and let the batch's later
        requests see them."""
        if self._check is not None:
            for row in self.rows_written:
                self._check(row)
        self.params = [row.params() for row in self.rows_written]
        for row in self.rows_written:
            self.cache.setdefault((row.answer, row.author), {})[row.name] = row


# -- the port --------------------------------------------------------------------------------------


class Reads(Protocol):
    """The storage's reads for listings, readiness and metrics, apart from the writer (thread-safe)."""

    def page(self, page: ListingPage) -> list[Row]:
        """The live rows of one listing page, ordered by answer, author, name."""
        ...

    def depth(self) -> tuple[int, int, float | None]:
        """Undelivered operations, set-aside ones, and the age of the oldest undelivered (seconds)."""
        ...

    def set_aside(self, limit: int = 20) -> list[tuple[str, str]]:
        """The newest operations set aside for good: (score id, why)."""
        ...


class Storage(Protocol):
    """Where the ledger and the outbox live. `commits.GroupCommit` drives a write as: `begin(keys)` (the
    batch's transaction, the (answer, author) pairs serialised against every other writer),
    `prefetch`, each request's function, `store_rows`, `enqueue`, then `commit` (or `rollback`).
    Nothing of the group commit itself is here: one mechanism, two backends."""

    #: "sqlite" or "postgres"
    name: str
    #: its own failures (the ledger failed: the whole batch), as opposed to a request's
    errors: tuple[type[Exception], ...]
    #: True: its calls wait on a network and on other replicas (a batch runs off the event loop)
    remote: bool
    #: True: a delivery's claim is a row lock held by the delivery's own transaction, over the
    #: sink's call (`deliver`); False: the claim is a committed mark, settled in a second
    #: transaction through the writer (`claim`, `settle`, `due_in` via `GroupCommit.call`)
    holds_claims: bool

    @property
    def reads(self) -> Reads: ...

    def begin(self, keys: Sequence[Key]) -> Any:
        """Open the batch's transaction, every writer of `keys` held off until it ends; the
        connection for `Tx.db`."""
        ...

    def prefetch(self, keys: set[Key]) -> dict[Key, dict[str, Row]]: ...

    def store_rows(self, params: Sequence[tuple[Any, ...]]) -> None: ...

    def enqueue(self, ops: Sequence[Op], now: float, *, dead: dict[int, str] | None = None) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """End the open transaction, if any, writing nothing; never raises."""
        ...

    def check(self, row: Row) -> None:
        """`BadScore` for a row this backend cannot hold (its request alone fails)."""
        ...

    def transient(self, ex: BaseException) -> bool:
        """True for a failure a retry of the same batch may not meet (a deadlock victim)."""
        ...

    def has_backlog(self) -> bool: ...

    def mark_inline(self, ops: Sequence[Op]) -> None:
        """Inline mode, inside the open transaction: keep the ops this batch delivers to the store
        after its commit, replacing the last batch's (`inline_pending` gives them back)."""
        ...

    def inline_pending(self) -> list[Op]:
        """The ops the last inline batch kept: delivered again at start-up (idempotent), for a
        process killed between the ledger's commit and the store's."""
        ...

    def durable(self, full: bool) -> None:
        """Inline mode: whether a commit waits for the disk (SQLite's synchronous)."""
        ...

    def claim(self, tx: Tx, limit: int) -> list[Op]: ...

    def settle(self, tx: Tx, done: Sequence[int], retry: dict[int, tuple[float, str]], dead: dict[int, str]) -> None:
        ...

    def due_in(self, tx: Tx | None) -> float | None: ...

    def deliver(self, limit: int, now: Callable[[], float], send: Callable[[list[Op]], Settlement]) -> int:
        """`holds_claims` storage: one delivery step in one transaction; how many ops were claimed."""
        ...

    def housekeeping(self) -> None: ...

    def exclusively(self, name: str, fn: Callable[[], object]) -> bool:
        """Run `fn` unless another replica runs the `name` step now; whether it ran."""
        ...

    def ready(self) -> str | None:
        """None when a write can commit now, else why not (the readiness probe)."""
        ...

    def close(self) -> None: ...


# -- shared by both implementations ----------------------------------------------------------


def encoded(op: Op) -> str | None:
    if op.body is None:
        return None
    try:
        return op.body.encoded()
    except BadScore:  # kept as readable text so it can be set aside and listed, never sent
        return json.dumps(op.body.wire(), ensure_ascii=True)


def page_query(page: ListingPage, *, value: str, param: str = "?") -> tuple[str, list[Any]]:
    """One listing page as SQL, for either backend: `value` extracts a body's value, `param` is
    the placeholder. The groups are chosen first (their filters hold for every row of a group:
    one answer, one author), then their live rows are read."""
    where, params = ["body IS NOT NULL"], []
    for column, wanted in (("trace_id", page.trace_id), ("session_id", page.session_id), ("author", page.author)):
        if wanted is not None:
            where.append(f"{column} = {param}")
            params.append(wanted)
    if page.after is not None:
        where.append(f"(answer, author) > ({param}, {param})")
        params += list(page.after)
    if page.verdict_name is not None:
        marks = ", ".join([param] * len(page.verdict_values))
        where.append(
            f"(answer, author) IN (SELECT answer, author FROM {{feedback}} WHERE name = {param} AND body IS NOT NULL "
            f"AND {value} IN ({marks}))"
        )
        params += [page.verdict_name, *page.verdict_values]
    sql = (
        "SELECT f.* FROM {feedback} AS f JOIN (SELECT DISTINCT answer, author FROM {feedback} WHERE "
        + " AND ".join(where)
        + f" ORDER BY answer, author LIMIT {param}) AS g ON f.answer = g.answer AND f.author = g.author "
        "WHERE f.body IS NOT NULL ORDER BY f.answer, f.author, f.name"
    )
    return sql, [*params, page.groups]


def wait_until(at: float | None, now: float) -> float | None:
    """`due_in`'s answer from the earliest due time."""
    if at is None:
        return None
    wait = float(at) - now
    return wait if wait > 0.001 else 0.0
