"""An export file (`triage import`, the demo, the evaluation sets): one trace per line,
`{"traceId", "observations": [...], "scores": [...]}`, read and checked whole before the store
writes any of it. Times are kept in the store's one text form (`iso`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from triage import jsonl
from triage.domain.kernel import iso_ms as iso
from triage.domain.kernel import parse_time
from triage.domain.records import Observation
from triage.domain.votes import quoted
from triage.errors import InputError

OBS_FIELDS = (
    "id traceId type name parentObservationId startTime endTime input output metadata sessionId userId "
    "environment level statusMessage updatedAt release version"
).split()
#: the trace's release and version (Langfuse trace fields, on each of its rows as v2 observations
#: carry them): text or null, as the store keeps them
TRACE_TEXT = ("release", "version")
SCORE_FIELDS = (
    "id name value stringValue dataType traceId sessionId observationId comment metadata userId timestamp "
    "source environment createdAt updatedAt"
).split()
#: the score fields stored as the file has them, as text (value, the times and metadata are read)
SCORE_TEXT = (
    "id name stringValue dataType traceId sessionId observationId comment userId source environment createdAt"
).split()


def parse_stamp(value: Any, where: str) -> datetime:
    """A time of the file (ISO-8601, `domain.kernel.parse_time`: naive means UTC); `InputError`
    naming `where` when it is none."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_time(str(value))
    except ValueError as ex:
        raise InputError(f"{where}: not an ISO-8601 time: {value!r}") from ex


def _as_raw(value: Any) -> str | None:
    """Input/output are stored as Langfuse sends them: JSON-encoded strings."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def vote_span(traces_file: Path) -> tuple[datetime, datetime]:
    """The oldest and the newest vote time of an import file (its lines read as `read_export` reads them)."""
    stamps = []
    for number, line in enumerate(export_lines(traces_file), start=1):
        if not line.strip():
            continue
        where = f"{traces_file}, line {number}"
        row = _parse_line(line, where)
        scores = row.get("scores") if isinstance(row, dict) else None
        for score in scores if isinstance(scores, list) else []:
            stamps.append(parse_stamp(score.get("timestamp") if isinstance(score, dict) else None, where))
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


@dataclass
class Export:
    """A file's rows in the store's columns, and what they count."""

    observations: list[dict[str, Any]] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)
    counts: ImportCounts = field(default_factory=ImportCounts)


def export_lines(path: Path) -> list[str]:
    """The lines of an export file (split on "\\n" only), each checked to be UTF-8."""
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
    return lines


def _parse_line(line: str, where: str) -> Any:
    """One line's value (`jsonl.parse`: not too deep, no lone surrogate, which SQLite could not
    store); `InputError` naming `where` and why."""
    try:
        return jsonl.parse(line)
    except json.JSONDecodeError as ex:
        raise InputError(f"{where}: not JSON: {ex}") from None
    except ValueError as ex:
        raise InputError(f"{where}: {ex}") from None


def read_export(lines: Sequence[str], source: str, shift: timedelta = timedelta(0)) -> Export:
    """Every row of an export, checked; `InputError` naming the line for the first bad one.
    `shift` moves every time by the same amount (the demo stamps its votes relative to now)."""
    export = Export()
    observations, scores, counts = export.observations, export.scores, export.counts
    trace_lines: dict[str, int] = {}  # trace id -> the line that holds it
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        row = _parse_line(line, where)
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
            observations.append(observation_row(obs, trace_id, where, shift))
        for score in row.get("scores") or []:
            scores.append(score_row(score, where, shift))
    counts.observations, counts.scores = len(observations), len(scores)
    return export


def observation_row(obs: Any, trace_id: Any, where: str, shift: timedelta) -> dict[str, Any]:
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
    for key in TRACE_TEXT:
        if data.get(key) is not None and not isinstance(data[key], str):
            what = f"observation {data.get('id')!r}"
            raise InputError(f"{where}: {what}: {key} must be text or null, not {quoted(data[key])}")
    try:
        parsed = Observation.model_validate(data)
    except ValidationError as ex:
        first = ex.errors()[0]
        raise InputError(
            f"{where}: observation {data.get('id')!r}: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        ) from ex
    row = {f: data.get(f) for f in OBS_FIELDS}
    row["startTime"] = iso(parsed.start_time + shift)
    row["endTime"] = iso(parsed.end_time + shift) if parsed.end_time else None
    row["updatedAt"] = iso(parsed.updated_at + shift) if parsed.updated_at else row["startTime"]
    row["metadata"] = json.dumps(data["metadata"]) if data.get("metadata") is not None else None
    return row

def score_row(score: Any, where: str, shift: timedelta) -> dict[str, Any]:
    if not isinstance(score, dict):
        raise InputError(f"{where}: a score must be an object")
    for name in SCORE_TEXT:
        # a TEXT column: SQLite refuses an object or a list, and stores a number where every
        # reader expects text (a vote whose comment is 7 would be bad input on every night)
        if score.get(name) is not None and not isinstance(score[name], str):
            what = f"score {score['id']!r}" if isinstance(score.get("id"), str) else "a score"
            raise InputError(f"{where}: {what}: {name} must be text or null, not {quoted(score[name])}")
    if not score.get("id") or not score.get("name"):
        raise InputError(f"{where}: a score needs at least an id and a name")
    if not score.get("traceId") and not score.get("sessionId"):
        raise InputError(f"{where}: score {score['id']!r} is on neither a trace nor a session")
    row = {f: score.get(f) for f in SCORE_FIELDS}
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
    stamp = parse_stamp(score.get("timestamp"), where) + shift
    row["timestamp"] = iso(stamp)
    row["updatedAt"] = (
        iso(parse_stamp(score["updatedAt"], where) + shift)
        if score.get("updatedAt")
        else row["timestamp"]
    )
    row["metadata"] = json.dumps(score["metadata"]) if score.get("metadata") is not None else None
    return row

