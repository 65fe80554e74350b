"""Langfuse's wire shapes and their mapping to triage's records (pure: no I/O).

Rows triage reads (ScoreV3, ObservationV2, the legacy trace and session bodies) become `Vote` and
`Observation`; a `ScoreBody` becomes one POST body; the answers to a list POST and to the project
read are checked against the shapes of SDK 5.x's models (`BatchAnswer`, `ProjectsPage`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import pydantic

from triage.domain.kernel import as_utc, bounded_batches
from triage.domain.records import Observation, StoredScore, Vote
from triage.domain.scores import ScoreBody
from triage.domain.votes import BadVote, read_vote

T = TypeVar("T")

TRACES_PER_READ = 100  # trace ids per JSON `any of` filter
FILTER_CHARS = 6000  # and at most this much filter text, to stay well inside URL limits
POST_BYTES = 512 * 1024  # score chunks well under the 1 MiB body limit
POST_SCORES = 500


class ScoreRow(pydantic.BaseModel):
    """One ScoreV3 row, only the fields triage reads."""

    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)

    id: str
    name: str
    data_type: str = pydantic.Field(alias="dataType")
    value: Any = None
    timestamp: datetime
    updated_at: datetime = pydantic.Field(alias="updatedAt")
    environment: str | None = None
    comment: str | None = None
    metadata: Any = None
    subject: dict[str, Any] | None = None
    author_user_id: str | None = pydantic.Field(default=None, alias="authorUserId")
    source: str | None = None


class ScoresMeta(pydantic.BaseModel):
    cursor: str | None = None


class ScoresPage(pydantic.BaseModel):
    """A v3 scores page; its rows stay raw, each is read on its own (`ScoreReads.rows`), so one
    row that breaks the contract can be set aside alone (a vote read lists it and goes on)."""

    data: list[Any]
    meta: ScoresMeta


class ObservationsPage(pydantic.BaseModel):
    """A v2 observations page; its rows stay raw, each is read on its own (`v2_observation`)."""

    data: list[dict[str, Any]]
    meta: ScoresMeta


class _Answer(pydantic.BaseModel):
    """An answer body as the SDK models it: extra fields allowed, frozen."""

    model_config = pydantic.ConfigDict(extra="allow", frozen=True)


class BatchError(_Answer):
    message: str


class BatchResults(_Answer):
    """A list POST's 207: how many scores were accepted and rejected; the errors carry no id."""

    accepted: int
    rejected: int
    errors: list[BatchError]


class BatchAccepted(_Answer):
    """A list POST's 202."""

    message: Literal["Accepted"] = "Accepted"


#: the answer to `POST /api/public/scores` with a list (SDK 5.x's `CreateScoresResponse`)
BatchAnswer = pydantic.TypeAdapter(BatchResults | BatchAccepted)


class Project(_Answer):
    id: str


class ProjectsPage(_Answer):
    """`GET /api/public/projects`: the key's project (links need only its id)."""

    data: list[Project]


def chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def raw_io(value: Any) -> str | None:
    """input/output as the v2 API sends them (a JSON-encoded string), whatever shape arrived."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def encoded(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def newer(row: ScoreRow, than: ScoreRow | None) -> bool:
    """Whether score row `row` is newer than `than`: later timestamp, then later updatedAt."""
    if than is None:
        return True
    return (as_utc(row.timestamp), as_utc(row.updated_at)) > (
        as_utc(than.timestamp),
        as_utc(than.updated_at),
    )


def newer_observation(obs: Observation, than: Observation | None) -> bool:
    if than is None:
        return True
    if obs.updated_at is None:
        return False
    return than.updated_at is None or as_utc(obs.updated_at) > as_utc(than.updated_at)


def vote_value(row: ScoreRow) -> float | None:
    if row.data_type not in {"BOOLEAN", "NUMERIC"}:
        return None  # a categorical or text score is not a vote
    value = row.value
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None  # a categorical or text score is not a vote


def to_vote(row: ScoreRow) -> Vote | BadVote | None:
    """A score row as a vote; a `BadVote` when one of its fields cannot be read (`read_vote`);
    None when it is no vote (a categorical or text score, an experiment's)."""
    if row.data_type not in {"BOOLEAN", "NUMERIC"}:
        return None
    metadata = row.metadata if isinstance(row.metadata, dict) else {}
    subject = row.subject or {}
    kind = subject.get("kind")
    trace_id = session_id = turn = None
    if kind == "trace":
        trace_id = subject.get("id")
    elif kind == "observation":
        trace_id = subject.get("traceId")
    elif kind == "session":
        session_id = subject.get("id")
        turn = metadata.get("turn")
    elif kind is not None:
        return None  # an experiment score is not a user's vote
    user = metadata.get("userId") or metadata.get("user_id") or row.author_user_id
    return read_vote(
        vote_id=row.id,
        value=row.value,
        timestamp=as_utc(row.timestamp),
        updated_at=as_utc(row.updated_at),
        trace_id=trace_id,
        session_id=session_id,
        turn=turn,
        comment=row.comment,
        user_id=user,
        environment=row.environment,
    )


def unreadable_vote(raw: object, error: pydantic.ValidationError) -> BadVote:
    """A vote-score row that breaks the API contract (a missing id, a timestamp that is no time), set aside."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the row"
    fields = raw if isinstance(raw, dict) else {}
    ident = fields.get("id")
    return BadVote(id=ident if isinstance(ident, str) and ident else None, reason=f"{where}: {first['msg']}")


def v2_observation(raw: dict[str, Any]) -> Observation:
    """One ObservationV2 row, tolerant of fields triage does not read. Raises ValidationError."""
    row = {**raw, "input": raw_io(raw.get("input")), "output": raw_io(raw.get("output"))}
    row["traceId"] = row.get("traceId") or ""
    row["type"] = row.get("type") or "SPAN"
    return Observation.model_validate(row)


def legacy_observation(raw: dict[str, Any], trace: dict[str, Any], trace_id: str) -> Observation:
    """One observation of a legacy `GET /traces/{id}` body. Raises KeyError or ValidationError."""
    return Observation(
        id=raw["id"],
        traceId=raw.get("traceId") or trace_id,
        type=raw.get("type") or "SPAN",
        name=raw.get("name"),
        parentObservationId=raw.get("parentObservationId"),
        startTime=raw["startTime"],
        endTime=raw.get("endTime"),
        # the legacy API parses input/output (a JSON string arrives as a plain str): re-encode
        # every value so the reader sees the v2 API's raw-string shape
        input=encoded(raw.get("input")),
        output=encoded(raw.get("output")),
        metadata=raw.get("metadata"),
        sessionId=trace.get("sessionId"),
        userId=trace.get("userId"),
        environment=raw.get("environment") or trace.get("environment"),
        isRootObservation=raw.get("parentObservationId") is None,
        level=raw.get("level"),
        statusMessage=raw.get("statusMessage"),
        updatedAt=raw.get("updatedAt"),
    )


def id_batches(ids: Sequence[str]) -> Iterator[list[str]]:
    """Trace ids in batches of at most TRACES_PER_READ and FILTER_CHARS of filter text."""
    return bounded_batches(
        ids, lambda trace_id: len(json.dumps(trace_id)) + 2, most=TRACES_PER_READ, limit=FILTER_CHARS
    )


def post_chunks(scores: Iterable[ScoreBody]) -> Iterator[list[ScoreBody]]:
    """Scores in chunks whose JSON body stays well under the 1 MiB limit."""
    return bounded_batches(
        scores,
        lambda score: len(json.dumps(score.wire(), default=str).encode()) + 1,
        most=POST_SCORES,
        limit=POST_BYTES,
        base=2,
    )


def to_stored(row: ScoreRow) -> StoredScore:
    """Any score row as calibration reads it: the trace it is on, its value, who wrote it."""
    subject = row.subject or {}
    kind = subject.get("kind")
    trace_id = subject.get("id") if kind == "trace" else subject.get("traceId") if kind == "observation" else None
    value = row.value
    if isinstance(value, bool):
        value = float(value)
    elif not isinstance(value, int | float | str):
        value = None
    metadata = row.metadata if isinstance(row.metadata, dict) else {}
    author = row.author_user_id or metadata.get("reviewer")
    return StoredScore(
        id=row.id,
        name=row.name,
        trace_id=str(trace_id) if trace_id is not None else None,
        data_type=row.data_type,
        value=value,
        comment=row.comment,
        metadata=row.metadata,
        author=str(author) if author is not None else None,
        source=row.source,
        timestamp=as_utc(row.timestamp),
    )
