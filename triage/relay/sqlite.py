"""The relay's ledger and outbox in one SQLite file (`SqliteStorage`): the default, for a laptop
and a single replica. One process writes it, through `commits.GroupCommit`'s group commits.

A delivery's claim is a lease: the outbox row keeps the time it was claimed (`claimed`, 0 when
free), and a claim older than `LEASE_SECONDS` is taken again. A delivery whose result could not
be recorded (a full disk at `settle`) is then retried instead of staying claimed until a restart;
a redelivery is harmless (the same ids and timestamps).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from triage.domain.scores import BadScore, normalise_author
from triage.errors import ConfigError
from triage.relay.storage import (
    Key,
    ListingPage,
    Op,
    Row,
    Settlement,
    Tx,
    decode_body,
    encoded,
    page_query,
    row_of,
    wait_until,
)
from triage.sources.store import checkpoint_wal

#: a claim older than this is taken again (its delivery's result was never recorded). One worker
#: thread claims, delivers and settles in turn, so a claim cannot lapse under a delivery in flight:
#: the lease only bounds how long a failed settle keeps its ops waiting
LEASE_SECONDS = 10.0

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
-- inline mode: the last batch's ops, kept until the next batch, delivered again at start-up
CREATE TABLE IF NOT EXISTS inline_batch (ops TEXT NOT NULL);
"""
#: `PRAGMA user_version`: 1 = authors spelled by `normalise_author`
VERSION = 1


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
        row = row_of(r)
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

    def page(self, page: ListingPage) -> list[Row]:
        sql, params = page_query(page, value="json_extract(body, '$.value')")
        return [row_of(r) for r in self.select(sql.format(feedback="feedback"), params)]

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
    """The ledger in one SQLite file with one writer connection (used under `commits.GroupCommit`'s
    lock): `BEGIN IMMEDIATE` serialises every writer, so `begin` has nothing to lock by key."""

    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)
    remote = False
    holds_claims = False

    def __init__(self, path: str, now: Callable[[], float], *, inline: bool) -> None:
        self.path = path
        self.now = now
        try:
            self.db = open_file(path, inline=inline)
        except (sqlite3.Error, OSError) as ex:  # read-only, not SQLite, no folder: configuration, exit 3
            raise ConfigError(f"the relay's ledger {path} cannot be opened for writing: {ex}") from None
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

    def mark_inline(self, ops: Sequence[Op]) -> None:
        self.db.execute("DELETE FROM inline_batch")
        if ops:
            kept = [[op.op, op.score_id, encoded(op)] for op in ops]
            self.db.execute("INSERT INTO inline_batch (ops) VALUES (?)", (json.dumps(kept),))

    def inline_pending(self) -> list[Op]:
        ops: list[Op] = []
        for (text,) in self.db.execute("SELECT ops FROM inline_batch").fetchall():
            for kind, score_id, body in json.loads(text):
                try:
                    ops.append(Op(kind, score_id, decode_body(body)))
                except (BadScore, ValueError):
                    continue  # no store could take it: it was set aside when it was written
        return ops

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
        """Copy the write-ahead log into the file, off the request path (`checkpoint_wal`)."""
        if self.path == ":memory:" or self.closed:
            return
        checkpoint_wal(self.path)

    def exclusively(self, name: str, fn: Callable[[], object]) -> bool:
        fn()  # one process: no other replica to take turns with
        return True

    def ready(self) -> str | None:
        return None  # the one writer is this process: the service knows how its last write went

    def close(self) -> None:
        self.closed = True
        self.reads.close()
        self.db.close()


# -- the delivery worker's steps on SQLite (each one transaction, through `GroupCommit.call`) ------------


def claim(tx: Tx, limit: int) -> list[Op]:
    assert tx.db is not None
    now = tx.now()
    rows = tx.db.execute(
        "SELECT seq, score_id, op, body, attempts, EXISTS (SELECT 1 FROM outbox AS newer WHERE "
        "newer.score_id = outbox.score_id AND newer.seq > outbox.seq) AS superseded FROM outbox "
        "WHERE dead = 0 AND (claimed = 0 OR claimed < ?) AND next_at <= ? AND NOT EXISTS (SELECT 1 FROM "
        "outbox AS older WHERE older.score_id = outbox.score_id AND older.seq < outbox.seq AND older.dead = 0) "
        "ORDER BY seq LIMIT ?",
        (now - LEASE_SECONDS, now + 0.001, limit),  # a millisecond of slack for float timestamps
    ).fetchall()
    # an op waits while an older one on its id is still claimed (its result unrecorded): delivered
    # first, the older one's redelivery would bring back the old value. A lapsed claim that a newer
    # op has replaced is dropped, which lets the newer one go next
    tx.db.executemany("DELETE FROM outbox WHERE seq = ?", [(r["seq"],) for r in rows if r["superseded"]])
    rows = [r for r in rows if not r["superseded"]]
    tx.db.executemany("UPDATE outbox SET claimed = ? WHERE seq = ?", [(now, r["seq"]) for r in rows])
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
    r = tx.db.execute(
        "SELECT min(CASE WHEN claimed = 0 THEN next_at ELSE claimed + ? END) AS at FROM outbox WHERE dead = 0",
        (LEASE_SECONDS,),
    ).fetchone()
    return wait_until(r["at"], tx.now())


