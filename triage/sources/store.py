"""The embedded store: observations and scores in SQLite, in Langfuse's field names.

Used when no Langfuse credentials are set: `triage import` loads an export into it and
`triage feedback` reads votes and traces from it and writes scores to it, as it would to Langfuse.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from triage import jsonl
from triage.domain.conversations import TraceRef
from triage.domain.datasets import DatasetItem, DatasetWriteOutcome
from triage.domain.ports import SourceStats
from triage.domain.records import Observation, StoredScore, UnreadableTrace, Vote, WriteOutcome
from triage.domain.scores import PersonMeta, ScoreBody, score_id
from triage.domain.votes import BadVote, WindowVotes, in_window, read_vote, stored_time
from triage.errors import ConfigError, InputError

SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    id TEXT PRIMARY KEY, traceId TEXT NOT NULL, type TEXT, name TEXT, parentObservationId TEXT,
    startTime TEXT NOT NULL, endTime TEXT, input TEXT, output TEXT, metadata TEXT, sessionId TEXT,
    userId TEXT, environment TEXT, level TEXT, statusMessage TEXT, updatedAt TEXT
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
"""

_OBS_FIELDS = (
    "id traceId type name parentObservationId startTime endTime input output metadata sessionId userId "
    "environment level statusMessage updatedAt"
).split()
_SCORE_FIELDS = (
    "id name value stringValue dataType traceId sessionId observationId comment metadata userId timestamp "
    "source environment createdAt updatedAt"
).split()


def iso(value: datetime) -> str:
    """One sortable text form for every time in the store (UTC, milliseconds, `Z`)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def _parse_time(value: Any, where: str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as ex:
        raise InputError(f"{where}: not an ISO-8601 time: {value!r}") from ex


def _as_raw(value: Any) -> str | None:
    """Input/output are stored as Langfuse sends them: JSON-encoded strings."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def vote_span(traces_file: Path) -> tuple[datetime, datetime]:
    """The oldest and the newest vote time of an import file."""
    stamps = []
    for number, line in jsonl.lines(traces_file.read_text(encoding="utf-8")):
        where = f"{traces_file}, line {number}"
        try:
            row = jsonl.parse(line)
        except ValueError as ex:
            raise InputError(f"{where}: not JSON: {ex}") from None
        scores = row.get("scores") if isinstance(row, dict) else None
        for score in scores if isinstance(scores, list) else []:
            stamps.append(_parse_time(score.get("timestamp") if isinstance(score, dict) else None, where))
    if not stamps:
        raise InputError(f"{traces_file} holds no votes")
    return min(stamps), max(stamps)


def vote_shift(traces_file: Path, now: datetime, before: timedelta = timedelta(hours=1)) -> timedelta:
    """How far to move an import file so its newest vote lands `before` now (demo and eval data)."""
    return (now - before) - vote_span(traces_file)[1]


@dataclass
class ImportCounts:
    traces: int = 0
    observations: int = 0
    scores: int = 0


_UPSERT_SCORE = (
    "INSERT INTO scores (id, name, value, stringValue, dataType, traceId, sessionId, comment, "
    "metadata, userId, timestamp, source, environment, createdAt, updatedAt) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET value = excluded.value, stringValue = excluded.stringValue, "
    "dataType = excluded.dataType, comment = excluded.comment, metadata = excluded.metadata, "
    "userId = excluded.userId, updatedAt = excluded.updatedAt"
)


class Store:
    """A SQLite file (or `:memory:`): a vote source, trace source and score sink (`Backend`)."""

    def __init__(self, path: Path | str, *, create_folder: bool = True) -> None:
        """Opens (or creates) the store. `create_folder=False`: a missing folder is an error (a
        mistyped TRIAGE_STORE must not quietly become an empty store that reports 0 votes)."""
        self.path = str(path)
        self.stats = SourceStats()  # stays at 0: an embedded store makes no requests
        if self.path != ":memory:":
            folder = Path(self.path).parent
            if not folder.is_dir() and not create_folder:
                raise ConfigError(f"the embedded store's folder does not exist: {folder} (check TRIAGE_STORE)")
            folder.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._lock = threading.Lock()
            with self._lock:
                self._db.executescript(SCHEMA)
        except sqlite3.Error as ex:
            raise ConfigError(f"{self.path} is not a triage store (SQLite): {ex}") from ex

    def close(self) -> None:
        self._db.close()

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
        """Copy the write-ahead log into the file without blocking writers (after `use_wal`)."""
        db = sqlite3.connect(self.path, timeout=1)
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._db:
            yield self._db

    # -- loading -----------------------------------------------------------------------------

    def import_lines(
        self, lines: Sequence[str], source: str, shift: timedelta = timedelta(0)
    ) -> ImportCounts:
        """Load an export: one trace per line, `{"traceId", "observations": [...], "scores": [...]}`.

        `shift` moves every time by the same amount (the demo stamps its votes relative to now).
        The whole file is validated before anything is written, so a bad line loses nothing.
        """
        observations: list[dict[str, Any]] = []
        scores: list[dict[str, Any]] = []
        counts = ImportCounts()
        trace_lines: dict[str, int] = {}  # trace id -> the line that holds it
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{source}, line {number}"
            try:
                row = json.loads(line)
            except ValueError as ex:
                raise InputError(f"{where}: not JSON: {ex}") from ex
            except RecursionError:
                raise InputError(f"{where}: JSON nested too deeply to read") from None
            if not isinstance(row, dict):
                raise InputError(f"{where}: expected an object with observations and scores")
            trace_id = row.get("traceId")
            if trace_id is not None and not isinstance(trace_id, str):
                raise InputError(f"{where}: traceId must be a string or null")
            if row.get("observations"):
                if trace_id is None:
                    raise InputError(f"{where}: observations need the line's traceId")
                if trace_id in trace_lines:
                    # merging two lines would silently combine two exports of one trace
                    raise InputError(f"{where}: trace {trace_id!r} is already on line {trace_lines[trace_id]}")
                trace_lines[trace_id] = number
                counts.traces += 1
            for obs in row.get("observations") or []:
                observations.append(self._observation_row(obs, trace_id, where, shift))
            for score in row.get("scores") or []:
                scores.append(self._score_row(score, where, shift))
        with self._tx() as db:
            db.executemany(
                f"INSERT OR REPLACE INTO observations ({', '.join(_OBS_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(_OBS_FIELDS))})",
                [tuple(o.get(f) for f in _OBS_FIELDS) for o in observations],
            )
            db.executemany(
                f"INSERT OR REPLACE INTO scores ({', '.join(_SCORE_FIELDS)}) "
                f"VALUES ({', '.join('?' * len(_SCORE_FIELDS))})",
                [tuple(s.get(f) for f in _SCORE_FIELDS) for s in scores],
            )
        counts.observations, counts.scores = len(observations), len(scores)
        return counts

    def import_file(self, path: Path, shift: timedelta = timedelta(0)) -> ImportCounts:
        try:
            data = Path(path).read_bytes()
        except OSError as ex:
            raise InputError(f"cannot read {path}: {ex.strerror or ex}") from ex
        lines: list[str] = []
        for number, raw in enumerate(data.split(b"\n"), start=1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\r"))
            except UnicodeDecodeError as ex:
                raise InputError(f"{path}, line {number}: not UTF-8 (byte {ex.start + 1} of the line)") from None
        return self.import_lines(lines, str(path), shift)

    @staticmethod
    def _observation_row(obs: Any, trace_id: Any, where: str, shift: timedelta) -> dict[str, Any]:
        if not isinstance(obs, dict):
            raise InputError(f"{where}: an observation must be an object")
        data = dict(obs)
        data.setdefault("traceId", trace_id)
        if data["traceId"] != trace_id:
            raise InputError(
                f"{where}: observation {data.get('id')!r} belongs to trace {data['traceId']!r}, "
                f"not to this line's trace {trace_id!r}"
            )
        for key in ("input", "output"):
            data[key] = _as_raw(data.get(key))
        try:
            parsed = Observation.model_validate(data)
        except ValidationError as ex:
            first = ex.errors()[0]
            raise InputError(
                f"{where}: observation {data.get('id')!r}: {'.'.join(map(str, first['loc']))}: {first['msg']}"
            ) from ex
        row = {f: data.get(f) for f in _OBS_FIELDS}
        row["startTime"] = iso(parsed.start_time + shift)
        row["endTime"] = iso(parsed.end_time + shift) if parsed.end_time else None
        row["updatedAt"] = iso(parsed.updated_at + shift) if parsed.updated_at else row["startTime"]
        row["metadata"] = json.dumps(data["metadata"]) if data.get("metadata") is not None else None
        return row

    @staticmethod
    def _score_row(score: Any, where: str, shift: timedelta) -> dict[str, Any]:
        if not isinstance(score, dict) or not score.get("id") or not score.get("name"):
            raise InputError(f"{where}: a score needs at least an id and a name")
        if not score.get("traceId") and not score.get("sessionId"):
            raise InputError(f"{where}: score {score['id']!r} is on neither a trace nor a session")
        row = {f: score.get(f) for f in _SCORE_FIELDS}
        value = score.get("value")
        if isinstance(value, bool):
            value = float(value)
        if score.get("dataType") in ("BOOLEAN", "NUMERIC") and not isinstance(value, int | float):
            # stored as text it would be no vote at all, and never listed
            raise InputError(f"{where}: score {score['id']!r} is {score['dataType']} but its value is {value!r}")
        if score.get("dataType") == "BOOLEAN" and value not in (0, 1):
            raise InputError(f"{where}: score {score['id']!r} is BOOLEAN but its value is {value!r} (0 or 1)")
        if isinstance(value, str):
            row["stringValue"], row["value"] = value, None
        elif value is not None and not isinstance(value, (int, float)):
            raise InputError(f"{where}: score {score['id']!r} has a value that is neither a number nor text")
        else:
            row["value"] = value
        stamp = _parse_time(score.get("timestamp"), where) + shift
        row["timestamp"] = iso(stamp)
        row["updatedAt"] = (
            iso(_parse_time(score["updatedAt"], where) + shift)
            if score.get("updatedAt")
            else row["timestamp"]
        )
        row["metadata"] = json.dumps(score["metadata"]) if score.get("metadata") is not None else None
        return row

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

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {s: [] for s in session_ids}
        if not session_ids:
            return found
        with self._lock:
            rows = self._db.execute(
                f"SELECT sessionId, traceId, min(startTime) AS started FROM observations "
                f"WHERE sessionId IN ({', '.join('?' * len(session_ids))}) AND parentObservationId IS NULL "
                f"GROUP BY sessionId, traceId ORDER BY sessionId, started",
                list(session_ids),
            ).fetchall()
        for row in rows:
            found[row["sessionId"]].append(row["traceId"])
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
                start_time=_parse_time(row["started"], "store"),
            )
            for row in rows
        ]

    # -- DatasetSink (`triage promote`): datasets and dataset_items, upserted by id as Langfuse does

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO datasets (name, description, metadata, createdAt) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING",
                (name, description, json.dumps(metadata), iso(datetime.now(UTC))),
            )
            return cursor.rowcount == 1

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM dataset_items WHERE datasetName = ? ORDER BY id", (name,)
            ).fetchall()
        return {
            row["id"]: DatasetItem(
                id=row["id"],
                dataset_name=row["datasetName"],
                input=json.loads(row["input"]) if row["input"] is not None else None,
                expected_output=json.loads(row["expectedOutput"]) if row["expectedOutput"] is not None else None,
                metadata=json.loads(row["metadata"]) if row["metadata"] else {},
                source_trace_id=row["sourceTraceId"],
                source_observation_id=row["sourceObservationId"],
                status=row["status"],
            )
            for row in rows
        }

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        now = iso(datetime.now(UTC))
        with self._tx() as db:
            for item in items:
                held = db.execute("SELECT datasetName FROM dataset_items WHERE id = ?", (item.id,)).fetchone()
                if held is not None and held["datasetName"] != item.dataset_name:
                    # as Langfuse: an id is unique in the project and cannot move to another dataset
                    outcome.failed[item.id] = (
                        f"the dataset item with id {item.id} already exists in a dataset other than {item.dataset_name}"
                    )
                    continue
                if db.execute("SELECT 1 FROM datasets WHERE name = ?", (item.dataset_name,)).fetchone() is None:
                    outcome.failed[item.id] = f"dataset {item.dataset_name} not found"
                    continue
                db.execute(
                    "INSERT INTO dataset_items (id, datasetName, input, expectedOutput, metadata, sourceTraceId, "
                    "sourceObservationId, createdAt, updatedAt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET input = excluded.input, expectedOutput = excluded.expectedOutput, "
                    "metadata = excluded.metadata, sourceTraceId = excluded.sourceTraceId, "
                    "sourceObservationId = excluded.sourceObservationId, updatedAt = excluded.updatedAt",
                    (
                        item.id,
                        item.dataset_name,
                        json.dumps(item.input, ensure_ascii=False),
                        json.dumps(item.expected_output, ensure_ascii=False),
                        json.dumps(item.metadata, ensure_ascii=False),
                        item.source_trace_id,
                        item.source_observation_id,
                        now,
                        now,
                    ),
                )
                outcome.written.append(item.id)
        return outcome

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
        out = []
        for row in rows:
            metadata = json.loads(row["metadata"]) if row["metadata"] else None
            reviewer = metadata.get("reviewer") if isinstance(metadata, dict) else None
            author = reviewer if reviewer is not None else row["userId"]
            out.append(
                StoredScore(
                    id=row["id"],
                    name=row["name"],
                    trace_id=row["traceId"],
                    data_type=row["dataType"],
                    value=row["stringValue"] if row["stringValue"] is not None else row["value"],
                    comment=row["comment"],
                    metadata=metadata,
                    author=str(author) if author is not None else None,
                    source=row["source"],
                    timestamp=_parse_time(row["timestamp"], "store"),
                )
            )
        return out

    # -- inspection (tests, `triage scores`) ---------------------------------------------------

    def scores_named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM scores WHERE name = ? ORDER BY traceId", (name,)
            ).fetchall()
        return [dict(r) for r in rows]
