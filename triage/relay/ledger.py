"""The relay's storage: what it has accepted (the ledger) and what it has yet to deliver (the
outbox), behind one small port (`Storage`) with two implementations: SQLite here (one file, one
process: the default, a laptop, a single replica) and PostgreSQL (`postgres.py`: any number of
replicas on one database). `commits.Ledger`, the one group commit, is the only writer on either.

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
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from triage.domain.scores import BadScore, ScoreBody, normalise_author

SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY, answer TEXT NOT NULL, author TEXT NOT NULL, name TEXT NOT NULL,
    kind TEXT NOT NULL, trace_id TEXT, session_id TEXT, turn INTEGER, timestamp TEXT NOT NULL,
    body TEXT, updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_answer ON feedback (answer, author);
CREATE INDEX IF NOT EXISTS feedback_trace ON feedback (trace_id);
CREATE INDEX IF NOT EXISTS feedback_session ON feedback (session_id);
CREATE INDEX IF NOT EXISTS feedback_author ON feedback (author);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, score_id TEXT NOT NULL, op TEXT NOT NULL, body TEXT,
    enqueued REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL DEFAULT 0,
    claimed INTEGER NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0, error TEXT
);
CREATE INDEX IF NOT EXISTS outbox_id ON outbox (score_id);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (dead, claimed, next_at);
"""
#: `PRAGMA user_version`: 1 = authors spelled by `normalise_author`
VERSION = 1
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
class Page:
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


def decode_body(text: str | None) -> ScoreBody | None:
    return ScoreBody.from_wire(json.loads(text)) if text else None


def _row(r: sqlite3.Row) -> Row:
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

    def page(self, page: Page) -> list[Row]:
        """The live rows of one listing page, ordered by answer, author, name."""
        ...

    def depth(self) -> tuple[int, int, float | None]:
        """Undelivered operations, set-aside ones, and the age of the oldest undelivered (seconds)."""
        ...

    def set_aside(self, limit: int = 20) -> list[tuple[str, str]]:
        """The newest operations set aside for good: (score id, why)."""
        ...


class Storage(Protocol):
    """Where the ledger and the outbox live. `commits.Ledger` drives a write as: `begin(keys)` (the
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
    #: transaction through the writer (`claim`, `settle`, `due_in` via `Ledger.call`)
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


# -- SQLite ------------------------------------------------------------------------------------------


def enqueue(db: sqlite3.Connection, ops: Sequence[Op], now: float, *, dead: dict[int, str] | None = None) -> None:
    """Put ops in the outbox; the newest op on an id replaces an older one that is not in flight.
    `dead`: ops (by index in `ops`) to set aside at once, with their reason."""
    if not ops:
        return
    newest = {op.score_id: op for op in ops}
    db.executemany(
        "DELETE FROM outbox WHERE score_id = ? AND claimed = 0 AND dead = 0", [(i,) for i in newest]
    )
    top = db.execute("SELECT coalesce(max(seq), 0) FROM outbox").fetchone()[0]
    top = max(int(top), int(db.execute("SELECT coalesce(max(seq), 0) FROM sqlite_sequence").fetchone()[0]))
    reasons = {id(ops[i]): why for i, why in (dead or {}).items()}
    for number, op in enumerate(newest.values(), start=top + 1):
        op.seq = number
    for op in ops:  # a superseded op shares its successor's seq: delivering that one covers both
        op.seq = newest[op.score_id].seq
    db.executemany(
        "INSERT INTO outbox (seq, score_id, op, body, enqueued, next_at, dead, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(op.seq, op.score_id, op.op, encoded(op), now, now, int(id(op) in reasons), reasons.get(id(op)))
         for op in newest.values()],
    )  # fmt: skip


def encoded(op: Op) -> str | None:
    if op.body is None:
        return None
    try:
        return op.body.encoded()
    except BadScore:  # kept as readable text so it can be set aside and listed, never sent
        return json.dumps(op.body.wire(), ensure_ascii=True)


def store_rows(db: sqlite3.Connection, params: Sequence[tuple[Any, ...]]) -> None:
    db.executemany(
        "INSERT INTO feedback (id, answer, author, name, kind, trace_id, session_id, turn, timestamp, body, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
        "body = excluded.body, updated_at = excluded.updated_at",
        params,
    )


def prefetch(db: sqlite3.Connection, keys: set[Key]) -> dict[Key, dict[str, Row]]:
    """The rows of every (answer, author) pair, in one indexed query (a row-value `IN (VALUES ...)`
    scans the table)."""
    cache: dict[Key, dict[str, Row]] = {k: {} for k in keys}
    query = (
        "SELECT f.* FROM json_each(?) AS j JOIN feedback AS f "
        "ON f.answer = json_extract(j.value, '$[0]') AND f.author = json_extract(j.value, '$[1]')"
    )
    for r in db.execute(query, (json.dumps(sorted(keys)),)):
        row = _row(r)
        cache[(row.answer, row.author)][row.name] = row
    return cache


def connect(path: str, *, inline: bool) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    # outbox mode: a commit is on disk before the client hears of it (inline mode: the store's is)
    db.execute("PRAGMA synchronous=NORMAL" if inline else "PRAGMA synchronous=FULL")
    # no checkpoint inside a commit (once every ~1000 pages, 10-40 ms on this path, measured):
    # the delivery worker runs `checkpoint` every second
    db.execute("PRAGMA wal_autocheckpoint=0")
    return db


def open_file(path: str, *, inline: bool) -> sqlite3.Connection:
    """The writer's connection, the schema in place and authors spelled once (an older file's
    authors are respelled in place: their rows keep their ids, so a changed vote still overwrites)."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = connect(path, inline=inline)
    db.executescript(SCHEMA)
    if int(db.execute("PRAGMA user_version").fetchone()[0]) < VERSION:
        db.execute("BEGIN IMMEDIATE")
        authors = [r[0] for r in db.execute("SELECT DISTINCT author FROM feedback")]
        db.executemany(
            "UPDATE OR IGNORE feedback SET author = ? WHERE author = ?",
            [(normalise_author(a), a) for a in authors if normalise_author(a) != a],
        )
        db.execute(f"PRAGMA user_version = {VERSION}")
        db.execute("COMMIT")
    db.execute("UPDATE outbox SET claimed = 0, next_at = 0")  # what a previous process had in flight
    return db


def page_query(page: Page, *, value: str, param: str = "?") -> tuple[str, list[Any]]:
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


class SqliteReads:
    """A read connection for listings and metrics, apart from the writer's."""

    def __init__(self, path: str, now: Callable[[], float], writer: sqlite3.Connection) -> None:
        self.now = now
        self._writer = writer
        self._db = connect(path, inline=True) if path != ":memory:" else writer
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._db is not self._writer:
            self._db.close()

    def select(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())

    def page(self, page: Page) -> list[Row]:
        sql, params = page_query(page, value="json_extract(body, '$.value')")
        return [_row(r) for r in self.select(sql.format(feedback="feedback"), params)]

    def depth(self) -> tuple[int, int, float | None]:
        rows = self.select(
            "SELECT sum(dead = 0) AS pending, sum(dead = 1) AS dead, min(CASE WHEN dead = 0 THEN enqueued END) "
            "AS oldest FROM outbox"
        )
        pending, dead, oldest = rows[0]["pending"] or 0, rows[0]["dead"] or 0, rows[0]["oldest"]
        lag = max(0.0, self.now() - oldest) if oldest is not None else None
        return int(pending), int(dead), lag

    def set_aside(self, limit: int = 20) -> list[tuple[str, str]]:
        rows = self.select("SELECT score_id, error FROM outbox WHERE dead = 1 ORDER BY seq DESC LIMIT ?", (limit,))
        return [(r["score_id"], r["error"] or "") for r in rows]


class SqliteStorage:
    """The ledger in one SQLite file with one writer connection (used under `commits.Ledger`'s
    lock): `BEGIN IMMEDIATE` serialises every writer, so `begin` has nothing to lock by key."""

    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)
    remote = False
    holds_claims = False

    def __init__(self, path: str, now: Callable[[], float], *, inline: bool) -> None:
        self.path = path
        self.now = now
        self.db = open_file(path, inline=inline)
        self.reads = SqliteReads(path, now, self.db)
        self.closed = False

    def begin(self, keys: Sequence[Key]) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def prefetch(self, keys: set[Key]) -> dict[Key, dict[str, Row]]:
        return prefetch(self.db, keys)

    def store_rows(self, params: Sequence[tuple[Any, ...]]) -> None:
        store_rows(self.db, params)  # looked up at each call: a test replaces it with a failing one

    def enqueue(self, ops: Sequence[Op], now: float, *, dead: dict[int, str] | None = None) -> None:
        enqueue(self.db, ops, now, dead=dead)

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        try:
            self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # no transaction open (it failed, or was never begun)

    def check(self, row: Row) -> None:
        return None  # SQLite holds any text `Row.params` accepts

    def transient(self, ex: BaseException) -> bool:
        return False  # one writer: no other transaction to lose to

    def has_backlog(self) -> bool:
        return self.db.execute("SELECT 1 FROM outbox WHERE dead = 0 LIMIT 1").fetchone() is not None

    def durable(self, full: bool) -> None:
        self.db.execute("PRAGMA synchronous=FULL" if full else "PRAGMA synchronous=NORMAL")

    def claim(self, tx: Tx, limit: int) -> list[Op]:
        return claim(tx, limit)

    def settle(self, tx: Tx, done: Sequence[int], retry: dict[int, tuple[float, str]], dead: dict[int, str]) -> None:
        settle(tx, done, retry, dead)

    def due_in(self, tx: Tx | None) -> float | None:
        assert tx is not None
        return due_in(tx)

    def deliver(self, limit: int, now: Callable[[], float], send: Callable[[list[Op]], Settlement]) -> int:
        raise NotImplementedError("SQLite's claims go through the writer (holds_claims is False)")

    def housekeeping(self) -> None:
        """Copy the write-ahead log into the file without blocking the writer (off the request path)."""
        if self.path == ":memory:" or self.closed:
            return
        db = sqlite3.connect(self.path, timeout=1)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def exclusively(self, name: str, fn: Callable[[], object]) -> bool:
        fn()  # one process: no other replica to take turns with
        return True

    def ready(self) -> str | None:
        return None  # the one writer is this process: the service knows how its last write went

    def close(self) -> None:
        self.closed = True
        self.reads.close()
        self.db.close()


# -- the delivery worker's steps on SQLite (each one transaction, through `Ledger.call`) ------------


def claim(tx: Tx, limit: int) -> list[Op]:
    assert tx.db is not None
    rows = tx.db.execute(
        "SELECT seq, score_id, op, body, attempts FROM outbox WHERE dead = 0 AND claimed = 0 AND next_at <= ? "
        "ORDER BY seq LIMIT ?",
        (tx.now() + 0.001, limit),  # a millisecond of slack for float timestamps
    ).fetchall()
    tx.db.executemany("UPDATE outbox SET claimed = 1 WHERE seq = ?", [(r["seq"],) for r in rows])
    ops: list[Op] = []
    for r in rows:
        try:
            body = decode_body(r["body"])
        except (BadScore, ValueError) as ex:  # an older file's body that is no score: set aside
            tx.db.execute("UPDATE outbox SET dead = 1, claimed = 0, error = ? WHERE seq = ?", (str(ex)[:300], r["seq"]))
            continue
        ops.append(Op(r["op"], r["score_id"], body, r["seq"], r["attempts"]))
    return ops


def settle(tx: Tx, done: Sequence[int], retry: dict[int, tuple[float, str]], dead: dict[int, str]) -> None:
    """Delivered ops leave; failed ones wait for their next attempt unless a newer op on their id
    replaced them (retrying one after the newer went through would bring back the old value);
    refused ones are set aside."""
    assert tx.db is not None
    tx.db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in done])
    tx.db.executemany(
        "DELETE FROM outbox WHERE seq = ? AND EXISTS "
        "(SELECT 1 FROM outbox AS newer WHERE newer.score_id = outbox.score_id AND newer.seq > outbox.seq)",
        [(seq,) for seq in [*retry, *dead]],
    )
    tx.db.executemany(
        "UPDATE outbox SET claimed = 0, attempts = attempts + 1, next_at = ?, error = ? WHERE seq = ?",
        [(at, error[:300], seq) for seq, (at, error) in retry.items()],
    )
    tx.db.executemany(
        "UPDATE outbox SET claimed = 0, dead = 1, attempts = attempts + 1, error = ? WHERE seq = ?",
        [(error[:300], seq) for seq, error in dead.items()],
    )


def due_in(tx: Tx) -> float | None:
    """Seconds until the next undelivered op is due (0 when one is); None when none waits."""
    assert tx.db is not None
    r = tx.db.execute("SELECT min(next_at) AS at FROM outbox WHERE dead = 0 AND claimed = 0").fetchone()
    return wait_until(r["at"], tx.now())


def wait_until(at: float | None, now: float) -> float | None:
    """`due_in`'s answer from the earliest due time."""
    if at is None:
        return None
    wait = float(at) - now
    return wait if wait > 0.001 else 0.0
