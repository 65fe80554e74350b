"""The relay's ledger and outbox in PostgreSQL (`TRIAGE_RELAY_DATABASE_URL`): any number of
replicas accept writes and share delivery, with the SQLite ledger's semantics.

- Writers: a batch takes `pg_advisory_xact_lock` on a hash of each (answer, author) it touches, in
  sorted order (two batches wanting the same keys queue, never deadlock), before it reads their
  rows; so create-only (409), replace (404) and the first write's timestamp hold across replicas.
  The locks end with the transaction, and with the connection of a replica that dies.
- Delivery: a worker claims due ops with `FOR UPDATE SKIP LOCKED` in a transaction that spans the
  sink's call and settles them before it commits, so no two replicas deliver one op; an op is
  claimable only when no older op on its id is left (one in flight holds its row lock until it is
  settled and gone), so a superseded op is never delivered after its successor. A writer replaces
  the waiting ops of an id (`SKIP LOCKED`: never one in flight), and a claim drops an op that a
  newer one on its id covers.
- Every connection comes from one pool per process (psycopg 3), checked before use, so a restarted
  database costs no failed batch; the reads (`PostgresReads`: listings, the outbox's depth, the
  set-aside writes) take their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from triage.domain.scores import BadScore
from triage.errors import ConfigError
from triage.relay import storage
from triage.relay.storage import Key, ListingPage, Op, Row, Settlement, Tx
from triage.relay.web import Problem

log = logging.getLogger("triage.relay")

SCHEMA = """
CREATE TABLE IF NOT EXISTS relay_feedback (
    id TEXT COLLATE "C" PRIMARY KEY, answer TEXT COLLATE "C" NOT NULL, author TEXT COLLATE "C" NOT NULL,
    name TEXT COLLATE "C" NOT NULL, kind TEXT NOT NULL, trace_id TEXT, session_id TEXT, turn BIGINT,
    timestamp TEXT NOT NULL, body TEXT, updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS relay_feedback_answer ON relay_feedback (answer, author);
CREATE INDEX IF NOT EXISTS relay_feedback_trace ON relay_feedback (trace_id);
CREATE INDEX IF NOT EXISTS relay_feedback_session ON relay_feedback (session_id);
CREATE INDEX IF NOT EXISTS relay_feedback_author ON relay_feedback (author);
CREATE TABLE IF NOT EXISTS relay_outbox (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, score_id TEXT NOT NULL, op TEXT NOT NULL,
    body TEXT, enqueued DOUBLE PRECISION NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL DEFAULT 0, dead BOOLEAN NOT NULL DEFAULT false, error TEXT
);
CREATE INDEX IF NOT EXISTS relay_outbox_id ON relay_outbox (score_id, seq);
CREATE TABLE IF NOT EXISTS relay_meta (version INTEGER NOT NULL);
"""
#: `relay_outbox.seq` is an identity of CACHE 1 (the default): every session draws the next number,
#: so the ops of one id, whose writers the advisory locks serialise, get seqs in commit order
#: relay_meta.version: 1 = this schema
VERSION = 1
#: the advisory lock replicas starting at once take to create the schema one at a time
SCHEMA_LOCK = 0x7472696167650001
#: every session: a writer waits this long for another replica's batch on the same keys before
#: its own batch fails (503, Retry-After), and a transaction left idle this long (a frozen
#: replica's) is ended by the server, its locks with it. A delivery's own transaction, idle over the
#: sink's call, lifts the latter (its replica's death ends it: the connection goes).
SESSION_SETTINGS = (
    "SET lock_timeout = '5s'; SET idle_in_transaction_session_timeout = '60s'; "
    "SET statement_timeout = '30s'; SET client_encoding = 'UTF8'"
)
#: how long a caller waits for a pooled connection
POOL_WAIT = 5.0
COLUMNS = "id, answer, author, name, kind, trace_id, session_id, turn, timestamp, body, updated_at"

#: due ops nobody holds whose id has no older op left, oldest first; `superseded`: a newer op on
#: the id covers it (dropped, not delivered; picked whenever it is due or not, so it never blocks
#: its successor)
CLAIM = """
SELECT o.seq, o.score_id, o.op, o.body, o.attempts,
       EXISTS (SELECT 1 FROM relay_outbox AS n WHERE n.score_id = o.score_id AND n.seq > o.seq) AS superseded
FROM relay_outbox AS o
WHERE NOT o.dead
  AND NOT EXISTS (SELECT 1 FROM relay_outbox AS p WHERE p.score_id = o.score_id AND p.seq < o.seq AND NOT p.dead)
  AND (o.next_at <= %s OR EXISTS (SELECT 1 FROM relay_outbox AS n WHERE n.score_id = o.score_id AND n.seq > o.seq))
ORDER BY o.seq
LIMIT %s
FOR UPDATE OF o SKIP LOCKED
"""
DUE = """
SELECT min(CASE WHEN EXISTS (SELECT 1 FROM relay_outbox AS n WHERE n.score_id = o.score_id AND n.seq > o.seq)
                THEN 0 ELSE o.next_at END)
FROM relay_outbox AS o
WHERE NOT o.dead
  AND NOT EXISTS (SELECT 1 FROM relay_outbox AS p WHERE p.score_id = o.score_id AND p.seq < o.seq AND NOT p.dead)
"""


def lock_key(key: Key) -> int:
    """The advisory lock of an (answer, author) pair: 64 bits of a hash every replica computes alike
    (Python's `hash` is salted per process). Two pairs sharing one only queue behind each other."""
    digest = hashlib.blake2b(json.dumps(list(key), ensure_ascii=False).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def describe(url: str) -> str:
    """Where the database is, for messages: host, port and database, never the password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(an unreadable TRIAGE_RELAY_DATABASE_URL)"
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{host}{port}/{parts.get('dbname') or parts.get('user') or ''}"


def storable(text: str) -> bool:
    """Whether PostgreSQL's text can hold `text` (no NUL, UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def reason_of(ex: BaseException) -> str:
    return " ".join(str(ex).split())[:300] or type(ex).__name__


class PostgresReads:
    """Listings, readiness and metrics on pooled connections (any thread). A database that cannot be
    read is a 503 with Retry-After, like one that cannot commit."""

    def __init__(self, pool: ConnectionPool[Any], now: Callable[[], float]) -> None:
        self.pool = pool
        self.now = now

    def _select(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        try:
            with self.pool.connection(timeout=POOL_WAIT) as conn, conn.cursor(row_factory=dict_row) as cur:
                rows: list[dict[str, Any]] = cur.execute(sql, params).fetchall()
                return rows
        except psycopg.Error as ex:
            raise Problem(
                503, f"the relay's ledger cannot be read ({reason_of(ex)}); try again", {"Retry-After": "5"}
            ) from None

    def page(self, page: ListingPage) -> list[Row]:
        sql, params = storage.page_query(page, value="(body::json ->> 'value')", param="%s")
        return [storage.row_of(r) for r in self._select(sql.format(feedback="relay_feedback"), params)]

    def depth(self) -> tuple[int, int, float | None]:
        [r] = self._select(
            "SELECT count(*) FILTER (WHERE NOT dead) AS pending, count(*) FILTER (WHERE dead) AS dead, "
            "min(enqueued) FILTER (WHERE NOT dead) AS oldest FROM relay_outbox"
        )
        oldest = r["oldest"]
        lag = max(0.0, self.now() - oldest) if oldest is not None else None
        return int(r["pending"]), int(r["dead"]), lag

    def set_aside(self, limit: int = 20) -> list[tuple[str, str]]:
        rows = self._select(
            "SELECT score_id, error FROM relay_outbox WHERE dead ORDER BY seq DESC LIMIT %s", (limit,)
        )
        return [(r["score_id"], r["error"] or "") for r in rows]


class PostgresStorage:
    """The ledger in PostgreSQL, shared by every replica. The writer's steps (`begin` ...
    `commit`) run under `commits.GroupCommit`'s lock, one batch at a time per process, on one pooled
    connection each."""

    name = "postgres"
    errors: tuple[type[Exception], ...] = (psycopg.Error,)
    remote = True
    holds_claims = True

    def __init__(self, url: str, now: Callable[[], float], *, pool_size: int = 10) -> None:
        self.now = now
        self.where = describe(url)
        self._create_schema(url)
        self.pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=2,
            max_size=pool_size,
            kwargs={"connect_timeout": 5, "application_name": "triage-relay"},
            configure=self._configure,
            # a connection the server dropped (a restart, a failover) is found before a batch uses it
            check=ConnectionPool.check_connection,
            name="triage-relay",
            open=False,
        )
        try:
            self.pool.open(wait=True, timeout=10)
        except psycopg.Error as ex:
            self.pool.close()
            raise ConfigError(
                f"the relay's PostgreSQL ledger at {self.where} cannot be reached: {reason_of(ex)}"
            ) from None
        self.reads = PostgresReads(self.pool, now)
        self._conn: psycopg.Connection[Any] | None = None

    def _create_schema(self, url: str) -> None:
        """The tables, created once however many replicas start at once; refused (exit 3) when the
        database cannot be reached or is not UTF-8."""
        try:
            with psycopg.connect(url, connect_timeout=10, application_name="triage-relay") as conn:
                encoding = conn.execute("SHOW server_encoding").fetchone()
                if encoding is None or str(encoding[0]).upper() not in ("UTF8", "UTF-8"):
                    raise ConfigError(
                        f"the relay's PostgreSQL database {self.where} is {encoding and encoding[0]}, not UTF8 "
                        "(votes and comments are any text): create it with ENCODING 'UTF8'"
                    )
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                conn.execute(SCHEMA)
                if conn.execute("SELECT 1 FROM relay_meta").fetchone() is None:
                    conn.execute("INSERT INTO relay_meta (version) VALUES (%s)", (VERSION,))
                conn.commit()
        except psycopg.Error as ex:
            raise ConfigError(
                f"the relay's PostgreSQL ledger at {self.where} cannot be opened: {reason_of(ex)} "
                "(check TRIAGE_RELAY_DATABASE_URL)"
            ) from None

    @staticmethod
    def _configure(conn: psycopg.Connection[Any]) -> None:
        conn.execute(SESSION_SETTINGS)
        conn.commit()

    # -- the writer's transaction (under the group commit's lock) ------------------------------------

    def _db(self) -> psycopg.Connection[Any]:
        assert self._conn is not None, "no transaction is open"
        return self._conn

    def begin(self, keys: Sequence[Key]) -> psycopg.Connection[Any]:
        self._conn = self.pool.getconn(timeout=POOL_WAIT)
        locks = sorted({lock_key(k) for k in keys})
        if locks:
            # every writer takes them ascending, so two batches that share keys wait in turn and
            # never deadlock; one statement for all (a function scan of the array yields its
            # elements in order), where one a lock cost the server and psycopg a statement each
            self._conn.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS l(k)", (locks,))
        return self._conn

    def prefetch(self, keys: set[Key]) -> dict[Key, dict[str, Row]]:
        """The rows of every (answer, author) pair, read after their locks: what the replica that
        held them last committed is seen."""
        cache: dict[Key, dict[str, Row]] = {k: {} for k in keys}
        # a key PostgreSQL cannot hold has no rows: its request is refused alone, by `check`
        ordered = sorted(k for k in keys if storable(k[0]) and storable(k[1]))
        with self._db().cursor(row_factory=dict_row) as cur:
            cur.execute(
                f"SELECT {COLUMNS} FROM relay_feedback WHERE (answer, author) IN "
                "(SELECT a, b FROM unnest(%s::text[], %s::text[]) AS k(a, b))",
                ([a for a, _ in ordered], [b for _, b in ordered]),
            )
            for r in cur:
                row = storage.row_of(r)
                cache[(row.answer, row.author)][row.name] = row
        return cache

    def store_rows(self, params: Sequence[tuple[Any, ...]]) -> None:
        # one statement for the batch; an id written twice in it keeps its last row (the later
        # request saw the earlier one: same first timestamp), as SQLite's one-by-one upserts end
        last = list({p[0]: p for p in params}.values())
        columns = [list(column) for column in zip(*last, strict=True)]
        self._db().execute(
            f"INSERT INTO relay_feedback ({COLUMNS}) SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], "
            "%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[]) "
            "ON CONFLICT (id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at",
            columns,
        )

    def enqueue(self, ops: Sequence[Op], now: float, *, dead: dict[int, str] | None = None) -> None:
        """The newest op per id joins the outbox; the waiting ops of those ids go (one in flight is
        row-locked: skipped, it settles first and its successor waits for it)."""
        if not ops:
            return
        db = self._db()
        newest = {op.score_id: op for op in ops}
        reasons = {id(ops[i]): why for i, why in (dead or {}).items()}
        fresh = list(newest.values())
        # one statement: the DELETE (a CTE) sees the snapshot before the INSERT, as when it ran first
        rows = db.execute(
            "WITH gone AS (DELETE FROM relay_outbox WHERE seq IN (SELECT seq FROM relay_outbox WHERE "
            "score_id = ANY(%s) AND NOT dead FOR UPDATE SKIP LOCKED)) "
            "INSERT INTO relay_outbox (score_id, op, body, enqueued, next_at, dead, error) SELECT * FROM "
            "unnest(%s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[], %s::bool[], %s::text[]) "
            "RETURNING seq, score_id",
            (
                list(newest),
                [op.score_id for op in fresh],
                [op.op for op in fresh],
                [storage.encoded(op) for op in fresh],
                [now] * len(fresh),
                [now] * len(fresh),
                [id(op) in reasons for op in fresh],
                [reasons.get(id(op)) for op in fresh],
            ),
        ).fetchall()
        seqs = {score_id: seq for seq, score_id in rows}
        for op in ops:  # a superseded op shares its successor's seq, as on SQLite
            op.seq = seqs[op.score_id]

    def commit(self) -> None:
        conn = self._db()
        conn.commit()
        self._conn = None
        self.pool.putconn(conn)

    def rollback(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.rollback()
        except psycopg.Error:
            pass  # the connection is gone: the pool discards it
        finally:
            self.pool.putconn(conn)

    def check(self, row: Row) -> None:
        """PostgreSQL's text holds no NUL and only UTF-8: a row with either fails its request alone."""
        for text in (row.id, row.answer, row.author, row.name, row.kind, row.trace_id, row.session_id):
            if text is not None and not storable(text):
                raise BadScore(f"{text[:40]!r} holds a NUL character or is not UTF-8 text")

    def transient(self, ex: BaseException) -> bool:
        return isinstance(ex, pg_errors.DeadlockDetected | pg_errors.SerializationFailure)

    def has_backlog(self) -> bool:
        return False  # never inline (its sink is Langfuse): every write goes through the outbox

    def durable(self, full: bool) -> None:
        return None  # a commit waits for the server's WAL flush (synchronous_commit): always durable

    def mark_inline(self, ops: Sequence[Op]) -> None:
        return None  # never inline

    def inline_pending(self) -> list[Op]:
        return []

    # -- delivery (the worker's thread, its own connection) ------------------------------------------

    def claim(self, tx: Tx, limit: int) -> list[Op]:
        raise NotImplementedError("PostgreSQL claims live in `deliver`'s transaction")

    def settle(self, tx: Tx, done: Sequence[int], retry: dict[int, tuple[float, str]], dead: dict[int, str]) -> None:
        raise NotImplementedError("PostgreSQL settles in `deliver`'s transaction")

    def deliver(self, limit: int, now: Callable[[], float], send: Callable[[list[Op]], Settlement]) -> int:
        with self.pool.connection(timeout=POOL_WAIT) as conn:  # commits at the end, rolls back on a raise
            # idle over the sink's call on purpose: only this replica's death may end it early
            conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            rows = conn.execute(CLAIM, (now() + 0.001, limit)).fetchall()  # a millisecond of slack
            gone = [seq for seq, _, _, _, _, superseded in rows if superseded]
            ops: list[Op] = []
            broken: dict[int, str] = {}
            for seq, score_id, op, body, attempts, superseded in rows:
                if superseded:
                    continue
                try:
                    ops.append(Op(op, score_id, storage.decode_body(body), seq, attempts))
                except (BadScore, ValueError) as ex:  # a body that is no score: set aside
                    broken[seq] = str(ex)
            if gone:
                conn.execute("DELETE FROM relay_outbox WHERE seq = ANY(%s)", (gone,))
            if ops:
                done, retry, dead = send(ops)
                broken.update(dead)
            else:
                done, retry = [], {}
            self._settle(conn, done, retry, broken)
        return len(rows)

    @staticmethod
    def _settle(
        conn: psycopg.Connection[Any], done: Sequence[int], retry: dict[int, tuple[float, str]], dead: dict[int, str]
    ) -> None:
        """Delivered ops leave; a failed one waits for its next attempt unless a newer op on its id
        replaced it meanwhile (retrying it after the newer one went through would bring back the
        old value); a refused one is set aside."""
        if done:
            conn.execute("DELETE FROM relay_outbox WHERE seq = ANY(%s)", (list(done),))
        failed = [*retry, *dead]
        if failed:
            conn.execute(
                "DELETE FROM relay_outbox AS o WHERE o.seq = ANY(%s) AND EXISTS "
                "(SELECT 1 FROM relay_outbox AS n WHERE n.score_id = o.score_id AND n.seq > o.seq)",
                (failed,),
            )
        if retry:
            conn.execute(
                "UPDATE relay_outbox AS o SET attempts = o.attempts + 1, next_at = v.at, error = v.error "
                "FROM unnest(%s::bigint[], %s::float8[], %s::text[]) AS v(seq, at, error) WHERE o.seq = v.seq",
                (list(retry), [at for at, _ in retry.values()], [why[:300] for _, why in retry.values()]),
            )
        if dead:
            conn.execute(
                "UPDATE relay_outbox AS o SET dead = true, attempts = o.attempts + 1, error = v.error "
                "FROM unnest(%s::bigint[], %s::text[]) AS v(seq, error) WHERE o.seq = v.seq",
                (list(dead), [why[:300] for why in dead.values()]),
            )

    def due_in(self, tx: Tx | None) -> float | None:
        """Seconds until an op is due (0: one is, perhaps in flight at another replica: its claim
        then finds nothing and the worker waits a moment); None when none waits."""
        with self.pool.connection(timeout=POOL_WAIT) as conn:
            row = conn.execute(DUE).fetchone()
        return storage.wait_until(row[0] if row else None, self.now())

    def housekeeping(self) -> None:
        return None  # the server checkpoints and vacuums on its own

    def exclusively(self, name: str, fn: Callable[[], object]) -> bool:
        """One replica at a time: a transaction-scoped try-lock on `name`, held while `fn` runs (a
        replica that dies lets go with its connection)."""
        with self.pool.connection(timeout=POOL_WAIT) as conn:
            conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            row = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (lock_key(("exclusively", name)),)).fetchone()
            if not row or not row[0]:
                return False
            fn()
        return True

    def ready(self) -> str | None:
        """A write this replica could commit now: a pooled connection, and a server that takes
        writes (not a standby, not read-only), probed without writing anything."""
        try:
            with self.pool.connection(timeout=2) as conn:
                conn.execute("UPDATE relay_meta SET version = version WHERE false")
        except psycopg.Error as ex:
            return f"the PostgreSQL ledger at {self.where} takes no writes: {reason_of(ex)}"
        return None

    def close(self) -> None:
        self.rollback()
        self.pool.close(timeout=5)
