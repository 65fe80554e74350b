"""The PostgreSQL ledger's tables and statements, the helpers its storage shares, and its reads
(`PostgresReads`: listings, the outbox's depth, the set-aside writes). `postgres.py` writes."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from triage.relay.ledger import (
    Key,
    Page,
    Row,
    page_query,
    row_of,
)
from triage.relay.problems import Problem

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

    def page(self, page: Page) -> list[Row]:
        sql, params = page_query(page, value="(body::json ->> 'value')", param="%s")
        return [row_of(r) for r in self._select(sql.format(feedback="relay_feedback"), params)]

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
