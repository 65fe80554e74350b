"""The embedded store: observations and scores in SQLite, in Langfuse's field names.

Used when no Langfuse credentials are set: `triage import` loads an export into it and
`triage feedback` reads votes and traces from it and writes scores to it, as it would to Langfuse.
A trace's release and version (Langfuse trace fields) are kept on its rows, as v2 observations
carry them; `triage releases` counts them with a GROUP BY.

Its datasets and their runs are mixins of their own (`sources.store_datasets`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from triage.domain.kernel import iso_ms as iso
from triage.domain.ports import SourceStats
from triage.domain.records import Observation, StoredScore, UnreadableTrace, Vote, WriteOutcome
from triage.domain.release_counts import ReleaseAnswers, ReleaseCounts, TracePlace
from triage.domain.scores import PersonMeta, ScoreBody, score_id
from triage.domain.votes import BadVote, TraceRef, WindowVotes, in_window, read_vote, stored_time
from triage.errors import ConfigError
from triage.sources.export_file import (
    OBS_FIELDS,
    SCORE_FIELDS,
    ImportCounts,
    export_lines,
    parse_stamp,
    read_export,
)
from triage.sources.store_datasets import DatasetRunTables, DatasetTables

SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    id TEXT PRIMARY KEY, traceId TEXT NOT NULL, type TEXT, name TEXT, parentObservationId TEXT,
    startTime TEXT NOT NULL, endTime TEXT, input TEXT, output TEXT, metadata TEXT, sessionId TEXT,
    userId TEXT, environment TEXT, level TEXT, statusMessage TEXT, updatedAt TEXT, release TEXT, version TEXT
);
CREATE INDEX IF NOT EXISTS observations_trace ON observations (traceId);
CREATE INDEX IF NOT EXISTS observations_session ON observations (sessionId);
CREATE TABLE IF NOT EXISTS scores (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, value REAL, stringValue TEXT, dataType TEXT,
    traceId TEXT, sessionId TEXT, observationId TEXT, comment TEXT, metadata TEXT, userId TEXT,
    timestamp TEXT NOT NULL, source TEXT, environment TEXT, createdAt TEXT, updatedAt TEXT
);
CREATE INDEX IF NOT EXISTS scores_name_time ON scores (name, timestamp);
-- a vote changed keeps its first timestamp: the window also selects on its change time
CREATE INDEX IF NOT EXISTS scores_name_updated ON scores (name, updatedAt);
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY, description TEXT, metadata TEXT, createdAt TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dataset_items (
    id TEXT PRIMARY KEY, datasetName TEXT NOT NULL REFERENCES datasets (name), input TEXT,
    expectedOutput TEXT, metadata TEXT, sourceTraceId TEXT, sourceObservationId TEXT,
    status TEXT NOT NULL DEFAULT 'ACTIVE', createdAt TEXT NOT NULL, updatedAt TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS dataset_items_dataset ON dataset_items (datasetName);
CREATE TABLE IF NOT EXISTS dataset_runs (
    id TEXT PRIMARY KEY, datasetName TEXT NOT NULL, name TEXT NOT NULL, description TEXT, metadata TEXT,
    createdAt TEXT NOT NULL, updatedAt TEXT NOT NULL, UNIQUE (datasetName, name)
);
CREATE TABLE IF NOT EXISTS dataset_run_items (
    id TEXT PRIMARY KEY, runId TEXT NOT NULL REFERENCES dataset_runs (id), datasetItemId TEXT NOT NULL,
    traceId TEXT NOT NULL, outcome TEXT, result TEXT, createdAt TEXT NOT NULL, UNIQUE (runId, datasetItemId)
);
"""

#: each trace of a query once, from its root observations: its start, release and version (blank: none)
_ROOTS = (
    "SELECT traceId, min(startTime) AS started, max(nullif(trim(release), '')) AS release, "
    "max(nullif(trim(version), '')) AS version FROM observations WHERE parentObservationId IS NULL"
)
#: columns added to `observations` after its first release, added to older store files on opening
ADDED_OBSERVATION_COLUMNS = ("release", "version")
#: ids per `IN (...)` of one query (SQLite allows at least 999 variables)
IDS_PER_QUERY = 900

_UPSERT_SCORE = (
    "INSERT INTO scores (id, name, value, stringValue, dataType, traceId, sessionId, comment, "
    "metadata, userId, timestamp, source, environment, createdAt, updatedAt) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET value = excluded.value, stringValue = excluded.stringValue, "
    "dataType = excluded.dataType, comment = excluded.comment, metadata = excluded.metadata, "
    "userId = excluded.userId, updatedAt = excluded.updatedAt"
)


#: a write-ahead log past this size is checkpointed whole and cut back to nothing: passive
#: checkpoints alone never caught up with a writer under sustained load (the fault benchmark: the
#: relay's logs reached 420-576 MB in 20 s, and a 1 GiB volume would fill in under a minute)
WAL_LIMIT = 32 * 1024 * 1024


def checkpoint_wal(path: str) -> None:
    """Copy the write-ahead log into the database file without blocking its writer (PASSIVE); once
    the log is over `WAL_LIMIT`, all of it, then truncate it (this waits for the writer's current
    commit, a pause of some milliseconds once every few tens of MB)."""
    if path == ":memory:":
        return
    wal = Path(f"{path}-wal")
    mode = "TRUNCATE" if wal.is_file() and wal.stat().st_size > WAL_LIMIT else "PASSIVE"
    db = sqlite3.connect(path, timeout=1)
    try:
        db.execute(f"PRAGMA wal_checkpoint({mode})")
    finally:
        db.close()


class Store(DatasetTables, DatasetRunTables):
    """A SQLite file (or `:memory:`): a vote source, trace source and score sink (`Backend`)."""

    def __init__(self, path: Path | str, *, create_folder: bool = True, create: bool = True) -> None:
        """Opens (or creates) the store. `create_folder=False`: a missing folder is an error (a
        mistyped TRIAGE_STORE must not quietly become an empty store that reports 0 votes).
        `create=False`, for a command that only reads: a missing file is an error too, naming it."""
        self.path = str(path)
        self.stats = SourceStats()  # stays at 0: an embedded store makes no requests
        if self.path != ":memory:":
            if not create and not Path(self.path).is_file():
                raise ConfigError(
                    f"there is no embedded store at {self.path} (check TRIAGE_STORE; `triage import` makes one)"
                )
            folder = Path(self.path).parent
            if not folder.is_dir() and not create_folder:
                raise ConfigError(f"the embedded store's folder does not exist: {folder} (check TRIAGE_STORE)")
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as ex:  # read-only, not a folder, no permission: configuration, exit 3
                raise ConfigError(f"the embedded store's folder {folder} cannot be made: {ex.strerror or ex}") from None
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._lock = threading.Lock()
            with self._lock:
                self._db.executescript(SCHEMA)
                self._add_columns()
        except sqlite3.Error as ex:
            raise ConfigError(f"{self.path} is not a triage store (SQLite): {ex}") from ex

    def _add_columns(self) -> None:
        """A store made before a column was added gets it (empty for the rows already there)."""
        held = {row["name"] for row in self._db.execute("PRAGMA table_info(observations)")}
        for column in ADDED_OBSERVATION_COLUMNS:
            if column not in held:
                self._db.execute(f"ALTER TABLE observations ADD COLUMN {column} TEXT")
        self._db.commit()

    def close(self) -> None:
        self._db.close()

    def check_writable(self) -> None:
        """`ConfigError` naming the file when it cannot be written (read-only file, folder or
        mount): for a long-lived writer such as `triage relay`, found at start, not at its first
        vote (it was an internal error, exit 1)."""
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:  # a write, rolled back: SQLite refuses it where the file, folder or mount is read-only
                    self._db.execute("CREATE TABLE triage_write_probe (x)")
                finally:
                    self._db.execute("ROLLBACK")
        except sqlite3.Error as ex:
            raise ConfigError(f"the embedded store {self.path} cannot be written: {ex}") from None

    def use_wal(self) -> None:
        """Write-ahead logging, each commit on disk (one fsync instead of the rollback journal's
        several): for a long-lived writer such as `triage relay`, while `triage feedback` reads.
        The mode stays with the file."""
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # no checkpoint inside a commit (tens of ms, once every ~1000 pages): `checkpoint` does it
            self._db.execute("PRAGMA wal_autocheckpoint=0")

    def checkpoint(self) -> None:
        """Copy the write-ahead log into the file (after `use_wal`): `checkpoint_wal`."""
        checkpoint_wal(self.path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            yield self._db

    # -- loading -----------------------------------------------------------------------------

    def import_lines(self, lines: Sequence[str], source: str, shift: timedelta = timedelta(0)) -> ImportCounts:
        """Load an export (`export_file.read_export`): the whole file is validated before anything
        is written, so a bad line loses nothing."""
        export = read_export(lines, source, shift)
        with self._tx() as db:
            db.executemany(
                f"INSERT OR REPLACE INTO observations ({', '.join(OBS_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(OBS_FIELDS))})",
                [tuple(o.get(f) for f in OBS_FIELDS) for o in export.observations],
            )
            db.executemany(
                f"INSERT OR REPLACE INTO scores ({', '.join(SCORE_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(SCORE_FIELDS))})",
                [tuple(r.get(f) for f in SCORE_FIELDS) for r in export.scores],
            )
        return export.counts

    def import_file(self, path: Path, shift: timedelta = timedelta(0)) -> ImportCounts:
        return self.import_lines(export_lines(path), str(path), shift)

    # -- the ports: VoteSource, TraceSource, ScoreSink ----------------------------------------

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The votes cast or changed in [start, end) (`in_window`), and the rows that cannot be
        read, each with its reason (a bad row never fails the read)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM scores WHERE name = ? AND ((timestamp >= ? AND timestamp < ?) "
                "OR (updatedAt >= ? AND updatedAt < ?)) ORDER BY timestamp DESC",
                (score_name, iso(start), iso(end), iso(start), iso(end)),
            ).fetchall()
        read = WindowVotes(votes=[])
        for row in rows:
            vote = self._vote(row, start, end)
            if isinstance(vote, Vote):
                read.votes.append(vote)
            elif vote is not None:
                read.bad.append(vote)
        return read

    @staticmethod
    def _vote(row: sqlite3.Row, start: datetime, end: datetime) -> Vote | BadVote | None:
        """One stored row as a vote; None when it is outside the window after all (SQL compared
        the times as text)."""
        ident, trace, session = (row[k] if isinstance(row[k], str) else None for k in ("id", "traceId", "sessionId"))
        try:
            stamp = stored_time(row["timestamp"], "its timestamp")
            updated = stored_time(row["updatedAt"], "its updatedAt") if row["updatedAt"] is not None else None
        except ValueError as ex:
            return BadVote(id=ident, reason=str(ex), trace_id=trace, session_id=None if trace else session)
        if not in_window(stamp, updated, start, end):
            return None
        try:
            meta = json.loads(row["metadata"]) if row["metadata"] else {}
        except (TypeError, ValueError, RecursionError):
            if not trace:  # a session vote's turn is in its metadata
                return BadVote(id=ident, reason="its metadata is not JSON, so its turn cannot be read",
                               session_id=session)  # fmt: skip
            meta = {}
        return read_vote(
            vote_id=row["id"],
            value=-1.0 if row["value"] is None else row["value"],  # no number: a text score, no vote
            timestamp=stamp,
            updated_at=updated,
            trace_id=row["traceId"],
            session_id=row["sessionId"],
            turn=meta.get("turn") if isinstance(meta, dict) else None,
            comment=row["comment"],
            user_id=row["userId"],
            environment=row["environment"],
        )

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        found: dict[str, list[TraceRef]] = {s: [] for s in session_ids}
        if not session_ids:
            return found
        with self._lock:
            rows = self._db.execute(
                f"SELECT sessionId, traceId, min(startTime) AS started FROM observations "
                f"WHERE sessionId IN ({', '.join('?' * len(session_ids))}) AND parentObservationId IS NULL "
                f"GROUP BY sessionId, traceId ORDER BY sessionId, started, traceId",
                list(session_ids),
            ).fetchall()
        for row in rows:
            try:
                started: datetime | None = stored_time(row["started"], "its start")
            except ValueError:  # a row another tool left: still in its place, never placed by time
                started = None
            session = row["sessionId"]
            found[session].append(TraceRef(trace_id=row["traceId"], session_id=session, start_time=started))
        return found

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        found: dict[str, list[Observation] | UnreadableTrace] = {t: [] for t in trace_ids}
        if not trace_ids:
            return found
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM observations WHERE traceId IN ({', '.join('?' * len(trace_ids))})",
                list(trace_ids),
            ).fetchall()
        for row in rows:
            trace_id = row["traceId"]
            rows_so_far = found[trace_id]
            if isinstance(rows_so_far, UnreadableTrace):
                continue
            data = dict(row)
            try:
                data["metadata"] = json.loads(data["metadata"]) if data["metadata"] else None
                data["isRootObservation"] = data["parentObservationId"] is None
                rows_so_far.append(Observation.model_validate(data))
            except (ValueError, RecursionError) as ex:  # ValidationError is a ValueError
                found[trace_id] = UnreadableTrace(reason=f"a stored observation cannot be read: {str(ex)[:200]}")
        return found

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        wanted = {score_id(t, score_name, rule_version): t for t in trace_ids}
        if not wanted:
            return set()
        with self._lock:
            rows = self._db.execute(
                f"SELECT id FROM scores WHERE id IN ({', '.join('?' * len(wanted))})", list(wanted)
            ).fetchall()
        return {wanted[row["id"]] for row in rows}

    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        """The job's writes: the same upsert as the relay's (`put_scores`); a commit is the read-back."""
        self.put_scores(scores)
        return WriteOutcome(confirmed=[s.id for s in scores])

    def trace_url(self, trace_id: str) -> str | None:
        return None

    def root_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        with self._lock:
            rows = self._db.execute(
                "SELECT traceId, sessionId, min(startTime) AS started FROM observations "
                "WHERE parentObservationId IS NULL AND startTime >= ? AND startTime < ? "
                "GROUP BY traceId ORDER BY started, traceId",
                (iso(start), iso(end)),
            ).fetchall()
        return [
            TraceRef(
                trace_id=row["traceId"],
                session_id=row["sessionId"] or None,
                start_time=parse_stamp(row["started"], "store"),
            )
            for row in rows
        ]

    # -- ReleaseSource (the release watch) --------------------------------------------------------

    def release_answers(self, start: datetime, end: datetime) -> ReleaseAnswers:
        """One GROUP BY over the window's root observations: answers per release and version, and
        when each release was first and last seen. A release's version is its most common one."""
        with self._lock:
            rows = self._db.execute(
                "SELECT release, version, count(*) AS answers, min(started) AS first, max(started) AS last FROM ("
                f"{_ROOTS} AND startTime >= ? AND startTime < ? GROUP BY traceId"
                ") GROUP BY release, version ORDER BY release, answers DESC, version",
                (iso(start), iso(end)),
            ).fetchall()
        unreleased = 0
        found: dict[str, ReleaseCounts] = {}
        for row in rows:
            if row["release"] is None:
                unreleased += row["answers"]
                continue
            first, last = parse_stamp(row["first"], "store"), parse_stamp(row["last"], "store")
            held = found.get(row["release"])
            if held is None:  # its most common version comes first
                found[row["release"]] = ReleaseCounts(
                    release=row["release"], version=row["version"], first_seen=first, last_seen=last,
                    answers=row["answers"], votes=0, thumbs_down=0,
                )  # fmt: skip
                continue
            found[row["release"]] = held.model_copy(
                update={
                    "answers": held.answers + row["answers"],
                    "first_seen": min(held.first_seen, first),
                    "last_seen": max(held.last_seen, last),
                }
            )
        return ReleaseAnswers(releases=list(found.values()), unreleased=unreleased, counted_by="the embedded store")

    def trace_places(self, trace_ids: Sequence[str]) -> dict[str, TracePlace]:
        ids = list(dict.fromkeys(trace_ids))
        places: dict[str, TracePlace] = {}
        for i in range(0, len(ids), IDS_PER_QUERY):
            chunk = ids[i : i + IDS_PER_QUERY]
            with self._lock:
                rows = self._db.execute(
                    f"{_ROOTS} AND traceId IN ({', '.join('?' * len(chunk))}) GROUP BY traceId", chunk
                ).fetchall()
            for row in rows:
                places[row["traceId"]] = TracePlace(
                    release=row["release"], version=row["version"], start=parse_stamp(row["started"], "store")
                )
        return places

    def cast_votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The embedded store keeps one row per vote: `votes` is already this read."""
        return self.votes(score_name, start, end)

    # -- ReadsInTraceOrder (the release watch, in the memory of its releases) ----------------------

    def votes_in_trace_order(self, score_name: str, start: datetime, end: datetime) -> Iterator[Vote]:
        """`votes`' votes, sorted by SQLite (trace ids as text, byte order: Python's order of str;
        NULL and '', the votes on a session, first), read a page at a time (`_streamed`)."""
        rows = self._streamed(
            "SELECT * FROM scores WHERE name = ? AND ((timestamp >= ? AND timestamp < ?) "
            "OR (updatedAt >= ? AND updatedAt < ?)) ORDER BY traceId, id",
            (score_name, iso(start), iso(end), iso(start), iso(end)),
        )
        for row in rows:
            vote = self._vote(row, start, end)
            if isinstance(vote, Vote):
                yield vote

    def scores_in_trace_order(self, names: Sequence[str], start: datetime, end: datetime) -> Iterator[StoredScore]:
        """`scores`, sorted by trace id (those on none first), read a page at a time."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return iter(())
        rows = self._streamed(
            f"SELECT * FROM scores WHERE name IN ({','.join('?' * len(wanted))}) AND timestamp >= ? "
            "AND timestamp < ? ORDER BY traceId, id",
            (*wanted, iso(start), iso(end)),
        )
        return (self._stored_score(row) for row in rows)

    #: rows fetched at once by `_streamed`
    STREAM_PAGE = 1000

    def _streamed(self, sql: str, params: Sequence[Any]) -> Iterator[sqlite3.Row]:
        """A query's rows, `STREAM_PAGE` at a time, on a connection of their own: SQLite sorts (on
        disk past its cache), the store's lock is not held while the caller works between pages,
        and no more than a page is in memory. An in-memory store has one connection: its rows are
        read at once (such a store is small)."""
        if self.path == ":memory:":
            with self._lock:
                rows = self._db.execute(sql, params).fetchall()
            yield from rows
            return
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            cursor = db.execute(sql, params)
            while page := cursor.fetchmany(self.STREAM_PAGE):
                yield from page
        finally:
            db.close()

    # -- DatasetSink (`triage promote`): datasets and dataset_items, upserted by id as Langfuse does

    # -- the relay's writes (`triage relay`) -------------------------------------------------------

    def put_scores(self, bodies: Sequence[ScoreBody]) -> None:
        """Upsert scores (any data type, on a trace or a session).

        As Langfuse does for the same id and timestamp: the value, comment and metadata are
        replaced; id, timestamp, subject and createdAt stay as first written. One transaction.
        """
        self.apply_score_ops([("put", body) for body in bodies])

    def delete_scores(self, ids: Sequence[str]) -> None:
        """Remove scores by id (a retracted vote or a verdict field left out); unknown ids are fine."""
        self.apply_score_ops([("delete", i) for i in ids])

    def apply_score_ops(self, ops: Sequence[tuple[Literal["put"], ScoreBody] | tuple[Literal["delete"], str]]) -> None:
        """Puts (`("put", body)`, as `put_scores`) and deletes (`("delete", id)`) in this order,
        in one transaction: one commit (one fsync in WAL mode) however they interleave."""
        now = iso(datetime.now(UTC))
        with self._tx() as db:
            puts: list[tuple[Any, ...]] = []
            for op in ops:
                if op[0] == "put":
                    puts.append(self._post_row(op[1], now))
                    continue
                if puts:
                    db.executemany(_UPSERT_SCORE, puts)
                    puts = []
                db.execute("DELETE FROM scores WHERE id = ?", (op[1],))
            if puts:
                db.executemany(_UPSERT_SCORE, puts)

    @staticmethod
    def _post_row(body: ScoreBody, now: str) -> tuple[Any, ...]:
        number, text = (None, body.value) if isinstance(body.value, str) else (float(body.value), None)
        person = PersonMeta.from_stored(body.metadata)
        return (
            body.id, body.name, number, text, body.data_type, body.trace_id, body.session_id, body.comment,
            json.dumps(dict(body.metadata)), person.author if person else None, iso(body.timestamp), body.source,
            body.environment, now, now,
        )  # fmt: skip

    # -- ScoreReader ----------------------------------------------------------------------------

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM scores WHERE name IN ({marks}) AND timestamp >= ? AND timestamp < ? "
                "ORDER BY timestamp, id",
                (*wanted, iso(start), iso(end)),
            ).fetchall()
        return [self._stored_score(row) for row in rows]

    @staticmethod
    def _stored_score(row: sqlite3.Row) -> StoredScore:
        metadata = json.loads(row["metadata"]) if row["metadata"] else None
        reviewer = metadata.get("reviewer") if isinstance(metadata, dict) else None
        author = reviewer if reviewer is not None else row["userId"]
        return StoredScore(
            id=row["id"],
            name=row["name"],
            trace_id=row["traceId"],
            data_type=row["dataType"],
            value=row["stringValue"] if row["stringValue"] is not None else row["value"],
            comment=row["comment"],
            metadata=metadata,
            author=str(author) if author is not None else None,
            source=row["source"],
            timestamp=parse_stamp(row["timestamp"], "store"),
        )

    # -- inspection (tests, `triage scores`) ---------------------------------------------------

    def scores_named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM scores WHERE name = ? ORDER BY traceId", (name,)
            ).fetchall()
        return [dict(r) for r in rows]
