"""The stored score: the one record where collecting, triaging and acting meet.

- `ScoreBody`: a score as every writer stores it (the job, the worklist, the relay, promote), in
  Langfuse's POST shape on the wire (`wire`) and read back from it (`from_wire`).
- Ids that never change and never collide: the job's `score_id` (trace, name, rule version: a
  rerun overwrites) and the relay's `relay_score_id` (a JSON-encoded tuple: parts that hold `:`
  cannot run into each other; ids written with the older `legacy_relay_id` keep theirs, the
  relay's ledger remembers them).
- Authors: `normalise_author` once, for the relay, calibrate and promote alike; `is_end_user`.
- Bounds every door checks: `MAX_TURN`, `parse_turn`, `LANGFUSE_TEXT_MAX`, `unencodable`.

Langfuse upserts a score only when both its id and its timestamp match an existing row, so both
are deterministic: the job's timestamp is the trace's start time, the relay's the first write's.

The job's verdicts as stored: what its scores' metadata holds, and its current decision per trace.

The job writes three scores per triaged trace (`triage_layer`, `triage_component`,
`triage_signature`); their metadata are `VerdictMeta` and `SignatureMeta`, written with
`to_metadata` and read with `from_stored` (a stored row is untrusted: a field of the wrong kind
reads as missing, never as an error). `current_scores` is the one rule for "the job's current
decision per trace" that calibrate, queue, eval, promote and the worklist share: this rule
version's row where there is one, else the newest; people's annotations under the same names
are not the job's.
"""

from __future__ import annotations

import json
import math
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from triage.domain.kernel import iso_ms, ms_utc, parse_time
from triage.domain.records import Facts, Layer, StoredScore, is_the_jobs
from triage.errors import InputError

# Fixed forever: changing it would orphan every score written before.
NAMESPACE = uuid.UUID("6f0e3c1a-3f43-4c52-9d1e-7a1b2c3d4e5f")

DataType = Literal["BOOLEAN", "NUMERIC", "CATEGORICAL", "CORRECTION", "TEXT"]
DATA_TYPES: tuple[DataType, ...] = ("BOOLEAN", "NUMERIC", "CATEGORICAL", "CORRECTION", "TEXT")
#: Langfuse refuses a TEXT score longer than this (its data model: 1-500 characters)
LANGFUSE_TEXT_MAX = 500
#: a turn is an index into a conversation; beyond this it is no turn (and no SQLite INTEGER)
MAX_TURN = 2**31 - 1
#: how the relay names end users (`user:<subject>`, `user:anonymous`): their verdicts are votes
END_USER = "user:"


def score_id(trace_id: str, score_name: str, rule_version: str) -> str:
    """The id of the job's `score_name` score on `trace_id` under `rule_version`. Score names and
    rule versions hold no `:` (the configuration checks), so the parts cannot run into each other."""
    return str(uuid.uuid5(NAMESPACE, f"{trace_id}:{score_name}:{rule_version}"))


def relay_score_id(name: str, answer: str, author: str) -> str:
    """The id of `author`'s `name` score on `answer` (`trace:<id>`, `session:<id>:<turn>`)."""
    return str(uuid.uuid5(NAMESPACE, json.dumps(["relay", name, answer, author], ensure_ascii=False)))


def legacy_relay_id(name: str, answer: str, author: str) -> str:
    """The id the relay gave before `relay_score_id`: parts joined with `:`, so reviewer `ana` on
    trace `t:user` and end user `user:ana` on trace `t` met. Kept to recognise such rows only."""
    return str(uuid.uuid5(NAMESPACE, f"relay:{name}:{answer}:{author}"))


def score_timestamp(trace_start: datetime | None, fallback: datetime) -> datetime:
    """The trace's start time (UTC, millisecond precision), or `fallback` when it has none."""
    return ms_utc(trace_start or fallback)


# -- authors and turns -------------------------------------------------------------------------


def normalise_author(text: str) -> str:
    """One spelling per author: Unicode compatibility forms folded (NFKC: a full-width colon is
    a colon) and whitespace trimmed and made single; the end-user prefix in any case. `User:x`,
    ` user:x` and `user：x` are all the end user `user:x`. A project member's name is case-folded
    (`Ana` is `ana`); an end user's subject keeps its case, as identity providers' subjects are
    case-sensitive (folding them could merge two people)."""
    text = " ".join(unicodedata.normalize("NFKC", text).split())
    if text[: len(END_USER)].casefold() == END_USER:
        return END_USER + text[len(END_USER) :].strip()
    return text.casefold()


def is_end_user(author: str | None) -> bool:
    """Whether `author` names an end user (whose verdicts are votes, never reviews)."""
    return author is not None and normalise_author(author).startswith(END_USER)


def parse_turn(value: object) -> int | None:
    """A 0-based turn from a stored or posted value: a non-negative int, or a string of ASCII
    digits, at most `MAX_TURN`; None for anything else (`"²"` is a digit to `isdigit`, not to `int`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 10:
            return None
        value = int(text)
    if not isinstance(value, int) or not 0 <= value <= MAX_TURN:
        return None
    return value


def unencodable(data: object, path: str = "") -> str | None:
    """The path of the first text in `data` (JSON values: keys too) that UTF-8 cannot encode (a
    lone UTF-16 surrogate: a browser cutting an emoji in half), or None."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(the value)"
        return None
    if isinstance(data, Mapping):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if unencodable(str(key)) is not None:
                return where.encode("utf-8", "backslashreplace").decode()
            found = unencodable(value, where)
            if found is not None:
                return found
    elif isinstance(data, list | tuple):
        for number, value in enumerate(data):
            found = unencodable(value, f"{path}[{number}]")
            if found is not None:
                return found
    return None


# -- the score body ----------------------------------------------------------------------------


class BadScore(InputError):
    """A stored or posted score body that is not a score (its reason says which field)."""


@dataclass(frozen=True, slots=True)
class ScoreBody:
    """A score as stored: on a trace, or on a session (a turn, when there is one, is metadata).

    The value is the wire value: a number for BOOLEAN (0/1) and NUMERIC, text for CATEGORICAL,
    TEXT and CORRECTION. `source` is Langfuse's (`API`; `ANNOTATION` for a reviewer's score in
    Langfuse's own UI). `timestamp` is fixed at the first write (Langfuse upserts on id and
    timestamp), so a changed value overwrites.
    """

    id: str
    name: str
    value: float | str
    data_type: DataType
    timestamp: datetime
    trace_id: str | None = None
    session_id: str | None = None
    comment: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    environment: str = "default"
    source: str = "API"
    #: the Langfuse score config it fits (the relay's declared model), or None
    config_id: str | None = None

    def __post_init__(self) -> None:
        if not self.id or not self.name:
            raise BadScore("a score needs an id and a name")
        if (self.trace_id is None) == (self.session_id is None):
            raise BadScore(f"score {self.id}: on exactly one of a trace or a session")
        if self.data_type not in DATA_TYPES:
            raise BadScore(f"score {self.id}: data type {self.data_type!r} is none of {', '.join(DATA_TYPES)}")
        numeric = self.data_type in ("BOOLEAN", "NUMERIC")
        if numeric != (isinstance(self.value, int | float) and not isinstance(self.value, bool)):
            raise BadScore(f"score {self.id}: a {self.data_type} score's value is {'a number' if numeric else 'text'}")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise BadScore(f"score {self.id}: the value must be finite")
        if self.data_type == "BOOLEAN" and self.value not in (0, 1):
            raise BadScore(f"score {self.id}: a BOOLEAN score is 0 or 1")
        if self.data_type == "TEXT" and not 1 <= len(str(self.value)) <= LANGFUSE_TEXT_MAX:
            raise BadScore(f"score {self.id}: a TEXT score is 1 to {LANGFUSE_TEXT_MAX} characters")
        if self.timestamp.tzinfo is None:
            raise BadScore(f"score {self.id}: the timestamp needs a time zone")

    @property
    def subject(self) -> str:
        return f"trace:{self.trace_id}" if self.trace_id is not None else f"session:{self.session_id}"

    def wire(self) -> dict[str, Any]:
        """Langfuse's POST body (camelCase; exactly one of traceId and sessionId)."""
        body: dict[str, Any] = {"id": self.id}
        if self.trace_id is not None:
            body["traceId"] = self.trace_id
        else:
            body["sessionId"] = self.session_id
        body.update(
            name=self.name,
            value=self.value,
            dataType=self.data_type,
            comment=self.comment,
            metadata=dict(self.metadata),
            environment=self.environment,
            source=self.source,
            # newer servers upsert on (id, timestamp); older ones ignore it and stamp the receive time
            timestamp=iso_ms(self.timestamp),
        )
        if self.config_id is not None:
            body["configId"] = self.config_id
        return body

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> ScoreBody:
        """The body `wire` wrote (the relay's ledger and outbox keep it so); `BadScore` when it is none."""
        try:
            metadata = body.get("metadata") or {}
            if not isinstance(metadata, Mapping):
                raise BadScore("metadata must be an object")
            value = body["value"]
            if isinstance(value, bool):
                value = int(value)
            return cls(
                id=str(body["id"]),
                name=str(body["name"]),
                value=value,
                data_type=body["dataType"],
                timestamp=parse_time(str(body["timestamp"])),
                trace_id=body.get("traceId"),
                session_id=None if body.get("traceId") is not None else body.get("sessionId"),
                comment=body.get("comment"),
                metadata=dict(metadata),
                environment=str(body.get("environment") or "default"),
                source=str(body.get("source") or "API"),
                config_id=body.get("configId"),
            )
        except (KeyError, TypeError, ValueError) as ex:
            raise BadScore(f"not a score body: {type(ex).__name__}: {ex}") from None

    def encoded(self) -> str:
        """The body as JSON text; `BadScore` when a text in it cannot be UTF-8 (checked at the
        door; here so that a body from an older ledger cannot poison a batch)."""
        text = json.dumps(self.wire(), ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadScore(f"score {self.id}: {unencodable(self.wire())} is not UTF-8 text") from None
        return text


@dataclass(frozen=True, slots=True)
class PersonMeta:
    """Who wrote a person's score and about which answer: the relay's metadata on every vote,
    verdict and channel score (`userId` and `reviewer` alike name the author)."""

    author: str
    answer: str
    session_id: str | None = None
    turn: int | None = None

    def to_metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"userId": self.author, "reviewer": self.author, "answer": self.answer}
        if self.session_id is not None:
            meta["sessionId"] = self.session_id
        if self.turn is not None:
            meta["turn"] = self.turn
        return meta

    @classmethod
    def from_stored(cls, metadata: object) -> PersonMeta | None:
        """The record in a stored score's metadata; None when it holds none (not the relay's)."""
        if not isinstance(metadata, Mapping):
            return None
        author, answer = metadata.get("reviewer", metadata.get("userId")), metadata.get("answer")
        if not isinstance(author, str) or not isinstance(answer, str):
            return None
        session = metadata.get("sessionId")
        return cls(
            author=author,
            answer=answer,
            session_id=session if isinstance(session, str) else None,
            turn=parse_turn(metadata.get("turn")),
        )


_LAYERS = {layer.value for layer in Layer}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def facts_of(raw: object) -> Facts | None:
    """Facts from stored or logged JSON; None when it holds none (a wrong kind reads as missing)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return Facts.model_validate(raw)
    except ValidationError:
        return None


def _meta(metadata: object) -> Mapping[str, Any]:
    return metadata if isinstance(metadata, Mapping) else {}


def _rule_version(meta: Mapping[str, Any]) -> str | None:
    """The rule version a job score's metadata names, as text (None: it names none)."""
    version = meta.get("rule_version")
    return str(version) if version is not None else None


@dataclass(frozen=True)
class VerdictMeta:
    """The metadata of the job's layer and component scores."""

    facts: Facts | None
    judge: str | None
    prompt_version: str | None
    rule_version: str | None
    owners: list[str] = field(default_factory=list)
    component_from: str | None = None
    votes: list[str] = field(default_factory=list)
    #: the verdict is sure (every judged fact the rule read is `high`: `RulePath.sure`), else a
    #: suggestion; None where a stored row does not say (written before the flag)
    sure: bool | None = None

    @property
    def certainty(self) -> str | None:
        """`sure` or `suggestion` (None: not stated), as the metadata spells it for people."""
        return None if self.sure is None else "sure" if self.sure else "suggestion"

    def to_metadata(self) -> dict[str, Any]:
        return {
            "facts": self.facts.model_dump(mode="json") if self.facts is not None else None,
            "judge": self.judge,
            "prompt_version": self.prompt_version,
            "rule_version": self.rule_version,
            "owners": list(self.owners),
            "component_from": self.component_from,
            "votes": list(self.votes),
            "sure": self.sure,
            "certainty": self.certainty,
        }

    @classmethod
    def from_stored(cls, metadata: object) -> VerdictMeta:
        meta = _meta(metadata)
        return cls(
            facts=facts_of(meta.get("facts")),
            judge=_text(meta.get("judge")),
            prompt_version=_text(meta.get("prompt_version")),
            rule_version=_rule_version(meta),
            owners=_texts(meta.get("owners")),
            component_from=_text(meta.get("component_from")),
            votes=_texts(meta.get("votes")),
            sure=sure if isinstance(sure := meta.get("sure"), bool) else None,
        )


@dataclass(frozen=True)
class SignatureMeta:
    """The metadata of the job's signature score: what later nights need to read it back."""

    layer: str
    component: str
    owners: list[str]
    terms: list[str]
    title: str
    rule_version: str | None

    def to_metadata(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "component": self.component,
            "owners": list(self.owners),
            "terms": sorted(self.terms),
            "title": self.title,
            "rule_version": self.rule_version,
        }

    @classmethod
    def from_stored(cls, metadata: object) -> SignatureMeta:
        meta = _meta(metadata)
        return cls(
            layer=str(meta.get("layer", "")),
            component=str(meta.get("component", "")),
            owners=_texts(meta.get("owners")),
            terms=_texts(meta.get("terms")),
            title=str(meta.get("title", "")),
            rule_version=_rule_version(meta),
        )


@dataclass
class JobScores:
    """The job's current scores on one trace (None: it wrote none of that name)."""

    layer: StoredScore | None = None
    component: StoredScore | None = None
    signature: StoredScore | None = None

    @property
    def verdict(self) -> VerdictMeta:
        return VerdictMeta.from_stored(self.layer.metadata if self.layer else None)

    @property
    def layer_value(self) -> Layer | None:
        value = self.layer.value if self.layer is not None else None
        return Layer(value) if isinstance(value, str) and value in _LAYERS else None

    @property
    def component_value(self) -> str | None:
        value = self.component.value if self.component is not None else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class JobScoreNames:
    layer: str
    component: str | None = None
    signature: str | None = None


def current_scores(
    scores: Sequence[StoredScore], names: JobScoreNames, rule_version: str, *, current_only: bool = False
) -> dict[str, JobScores]:
    """Per trace, the job's current layer, component and signature scores: this rule version's
    row where there is one, else the newest (ties: the larger id). With `current_only`, this rule
    version's only (the id the job gives it)."""
    named = ((names.layer, "layer"), (names.component, "component"), (names.signature, "signature"))
    slots = {name: slot for name, slot in named if name is not None}
    out: dict[str, JobScores] = {}

    def rank(score: StoredScore) -> tuple[bool, datetime, str]:
        return (str(_meta(score.metadata).get("rule_version")) == rule_version, score.timestamp, score.id)

    for score in scores:
        slot = slots.get(score.name)
        if slot is None or score.trace_id is None or not is_the_jobs(score):
            continue
        if current_only and score.id != score_id(score.trace_id, score.name, rule_version):
            continue
        held = out.setdefault(score.trace_id, JobScores())
        current: StoredScore | None = getattr(held, slot)
        if current is None or rank(score) > rank(current):
            setattr(held, slot, score)
    return out
