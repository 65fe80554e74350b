"""The bodies the relay takes and the answers it gives, as models, and the OpenAPI description
generated from them (`relay.openapi.openapi_document`): the models are the parsers, so the description cannot
drift from what the server accepts (schemathesis checks the running relay against it:
tests/relay/test_relay_fuzz.py).

Spellings: a chat form (`{"contextId", "turn", "value": "up"|"down", "comment"}`, modelled on the
Kubeflow docs agent's feedback design; its widget sends no votes yet), triage's own camelCase
names and their snake_case spellings, and K2View's 1-based `turnNumber`: each field lists the
spellings it accepts (`_spelled`), the first its own. Limits come from the domain: the verdict's
categories are `domain.review.Verdict`, its fields' longest values the declared score model's
(`RelayConfig.max_text`, given as the validation context), a score's name `MAX_SCORE_NAME`.

A malformed body or a missing id is a 400 naming the field; a value of the wrong kind for its field
is a 422. Every refusal comes out of a model and goes through one mapping, `problem_of`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SkipValidation,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from triage.domain.config import (
    MAX_SCORE_NAME,
    VERDICT_FIELD_SPECS,
    VERDICT_FIELDS,
    CalibrationConfig,
    RelayConfig,
    ReviewNames,
    VerdictFieldSpec,
)
from triage.domain.review import VERDICTS, Verdict
from triage.domain.scores import END_USER, MAX_TURN, normalise_author, parse_turn, unencodable
from triage.relay.access import answer_key
from triage.relay.web import Problem

MAX_ID = 200
MAX_COMMENT = 4000
#: the longest value of a verdict's field whose score the model does not declare (monitor mode)
DEFAULT_MAX_TEXT = 500
#: a JSON escape of a UTF-16 surrogate: only then can the decoded body hold text UTF-8 cannot encode
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_UNPRINTABLE = "\\x00-\\x1f\\x7f-\\x9f\\u200b-\\u200f\\u202a-\\u202e\\u2066-\\u2069"
#: an id as the description states it: printable (no control, format or bidi character), not blank
_ID_PATTERN = f"^[^{_UNPRINTABLE}]*[^\\s{_UNPRINTABLE}][^{_UNPRINTABLE}]*$"


# -- what a body asks for ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What the feedback is about: a trace, or a session and its 0-based turn."""

    trace_id: str | None = None
    session_id: str | None = None
    turn: int | None = None

    @property
    def key(self) -> str:
        return answer_key(self.trace_id, self.session_id, self.turn)

    @classmethod
    def from_key(cls, key: str) -> Answer:
        """The answer `key` names (`trace:<id>`, `session:<id>:<turn>`: the turn is last, a number)."""
        kind, _, rest = key.partition(":")
        if kind == "trace" and rest:
            return cls(trace_id=rest)
        session, _, turn = rest.rpartition(":")
        if kind == "session" and session and turn.isascii() and turn.isdigit():
            return cls(session_id=session, turn=int(turn))
        raise ValueError(f"not an answer: {key!r}")

    def subject(self) -> dict[str, Any]:
        """The Langfuse attachment: exactly one of traceId or sessionId."""
        return {"traceId": self.trace_id} if self.trace_id else {"sessionId": self.session_id}

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.trace_id:
            out["traceId"] = self.trace_id
        if self.session_id is not None:
            out["sessionId"] = self.session_id
        if self.turn is not None:
            out["turn"] = self.turn
        return out


@dataclass
class Feedback:
    """What the service writes for one POST/PUT body: a vote (value, comment) and/or a verdict (its
    fields, replaced whole); for a DELETE, whose feedback on the answer goes."""

    answer: Answer
    value: bool | None = None
    comment: str | None = None
    verdict: dict[str, str] | None = None  # None: the request says nothing about the verdict
    user: str | None = None  # an end user named by the gateway
    reviewer: str | None = None  # a project member
    author: str | None = None  # DELETE: whose feedback
    environment: str = "default"


# -- the fields: each checks itself and says why it refuses -------------------------------------------

_REFUSED = "relay_refused"
#: what the absence of a required field is called
_MISSING = {
    "source": "source is missing: the channel that writes the score",
    "name": "name is missing: the score's name",
}


def _refuse(status: int, message: str) -> PydanticCustomError:
    """A field's refusal with the relay's status and message (`problem_of` answers with them)."""
    return PydanticCustomError(_REFUSED, "{message}", {"status": status, "message": message})


def _id(value: Any, info: ValidationInfo) -> Any:
    """A non-blank string of at most MAX_ID printable characters: no control (C0, DEL, C1), format
    (bidi, zero-width) or unassigned character."""
    if not isinstance(value, str) or not value.strip():
        raise _refuse(400, f"{info.field_name} must be a non-empty string")
    if len(value) > MAX_ID or not value.isprintable():
        raise _refuse(400, f"{info.field_name} must be at most {MAX_ID} printable characters")
    return value


def _score_name(value: Any, info: ValidationInfo) -> Any:
    """An id no longer than a declared score's name may be."""
    if len(_id(value, info)) > MAX_SCORE_NAME:
        raise _refuse(400, f"name must be at most {MAX_SCORE_NAME} characters")
    return value


def _text(value: Any, info: ValidationInfo, limit: int) -> Any:
    if not isinstance(value, str):
        raise _refuse(400, f"{info.field_name} must be a string")
    if len(value) > limit:
        raise _refuse(422, f"{info.field_name} is {len(value)} characters; at most {limit}")
    return value


def _limits(info: ValidationInfo) -> Mapping[str, int]:
    """The verdict's fields' longest values: the declared model's, as the relay passes them."""
    context = info.context if isinstance(info.context, Mapping) else {}
    limits: Mapping[str, int] = context.get("max_text", {})
    return limits


def _comment(value: Any, info: ValidationInfo) -> Any:
    return _text(value, info, MAX_COMMENT)


def _verdict_text(value: Any, info: ValidationInfo) -> Any:
    """A field of the verdict ("" is kept: sent empty, the field is cleared)."""
    return _text(value, info, _limits(info).get(str(info.field_name), DEFAULT_MAX_TEXT))


def _vote(value: Any) -> bool | None:
    """up/down, true/false, 1/0; "" is no rating (a note without one)."""
    if value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in {"up", "down", "thumbs_up", "thumbs_down", "true", "false"}:
        return value.lower() in {"up", "thumbs_up", "true"}
    raise _refuse(422, "value must be up or down (also true/false or 1/0; \"\" for a note without a rating)")


def _end_user(user: str) -> str | None:
    """The end user's subject, spelled once (`normalise_author`), without a `user:` written out."""
    user = normalise_author(f"{END_USER}{user}").removeprefix(END_USER)
    if user.casefold().startswith(END_USER):
        user = user[len(END_USER) :].strip()  # the prefix written out by the client
    return user or None


def _reviewer(reviewer: str) -> str:
    """A project member, spelled once; never an end user."""
    reviewer = normalise_author(reviewer)
    if reviewer.startswith(END_USER):
        raise _refuse(400, f"reviewer names a project member; an end user is userId (not {END_USER}...)")
    if not reviewer:
        raise _refuse(400, "reviewer must be a non-empty string")
    return reviewer


# the constraints describe a field in the OpenAPI description; the validator listed after them
# runs before them and refuses in the relay's words (listed first, it hides the pattern from the
# description)
Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID, pattern=_ID_PATTERN), BeforeValidator(_id)]
EndUser = Annotated[Id, AfterValidator(_end_user)]
Reviewer = Annotated[Id, AfterValidator(_reviewer)]
Author = Annotated[Id, AfterValidator(normalise_author)]
ScoreName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_SCORE_NAME, pattern=_ID_PATTERN), BeforeValidator(_score_name)
]
Comment = Annotated[str, StringConstraints(max_length=MAX_COMMENT), BeforeValidator(_comment)]
VerdictText = Annotated[str, BeforeValidator(_verdict_text)]
#: how the description states a vote (`_vote` also takes thumbs_up/thumbs_down and any case)
_VOTE_SPELLINGS = TypeAdapter(Literal["up", "down", ""] | bool | Literal[0, 1] | None).json_schema()
Vote = Annotated[bool | None, BeforeValidator(_vote), WithJsonSchema(_VOTE_SPELLINGS)]


def _spelled(*names: str, description: str | None = None) -> Any:
    """A field that accepts each of `names`, the first its own (the others are listed in its
    description). The first spelling present with a value wins."""
    also = f"also {', '.join(names[1:])}" if names[1:] else None
    text = "; ".join(t for t in (description, also) if t) or None
    return Field(default=None, validation_alias=AliasChoices(*names), description=text)


# -- the bodies --------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    #: fields where null means something; elsewhere a null is as good as leaving the field out
    null_means: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in cls.null_means}
        return data


def _names_an_answer_schema(schema: dict[str, Any]) -> None:
    """The description says what `_names_an_answer` checks: a `traceId`, or a `sessionId` with its
    turn (a `sessionId` alone was described as valid and refused: schemathesis found it). The
    other spellings (`contextId`, `trace_id`, ...) stay accepted, as documented, outside the schema."""
    text = {"type": "string", "minLength": 1}
    turn = {"type": "integer"}
    schema["anyOf"] = [
        {"required": ["traceId"], "properties": {"traceId": text}},
        {"required": ["sessionId", "turn"], "properties": {"sessionId": text, "turn": turn}},
        {"required": ["sessionId", "turnNumber"], "properties": {"sessionId": text, "turnNumber": turn}},
    ]


class AnswerRef(_Body):
    """The answer: `traceId`, or `sessionId` (also `contextId`) with `turn` (or `turnNumber`)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_names_an_answer_schema)

    traceId: Id | None = _spelled("traceId", "trace_id")
    sessionId: Id | None = _spelled("sessionId", "session_id", "contextId")  # contextId: the chat form's
    turn: Annotated[int, Field(ge=0, le=MAX_TURN)] | None = Field(
        default=None, description="0-based turn of the answer in the session"
    )
    turnNumber: Annotated[int, Field(ge=1, le=MAX_TURN)] | None = _spelled(
        "turnNumber", "turn_number", description="1-based turn (K2View's form)"
    )

    @field_validator("turn", "turnNumber", mode="before")
    @classmethod
    def _turn(cls, value: Any, info: ValidationInfo) -> Any:
        """A JSON integer or a string of ASCII digits; a `turnNumber` beside a `turn` is not read."""
        if info.field_name == "turnNumber" and info.data.get("turn") is not None:
            return None
        low = 1 if info.field_name == "turnNumber" else 0
        number = parse_turn(value)
        if number is None or number < low:
            raise _refuse(400, f"{info.field_name} must be an integer from {low} to {MAX_TURN}")
        return number

    @model_validator(mode="after")
    def _names_an_answer(self) -> Self:
        if not self.traceId:
            if self.sessionId is None:
                raise _refuse(400, "traceId is missing (or sessionId, also as contextId, with turn)")
            if self.turn is None and self.turnNumber is None:
                raise _refuse(400, "turn is missing: a vote on a session names its 0-based turn (or turnNumber)")
        return self

    @property
    def answer(self) -> Answer:
        turn = self.turn
        if turn is None and self.turnNumber is not None:
            turn = self.turnNumber - 1  # K2View counts from 1
        if self.traceId:
            return Answer(trace_id=self.traceId, session_id=self.sessionId, turn=turn)
        return Answer(session_id=self.sessionId, turn=turn)


def _feedback_schema(schema: dict[str, Any]) -> None:
    """An example, and each field of the verdict's longest value as the default score model
    declares it (a relay's `[relay]` table may declare others: it checks its own)."""
    _names_an_answer_schema(schema)
    schema["example"] = {"sessionId": "c-42", "turn": 0, "value": "down", "comment": "the link is dead"}
    limits = RelayConfig().max_text(ReviewNames.of(CalibrationConfig()))
    for field in VERDICT_FIELDS:
        if field in limits:
            schema["properties"][field]["anyOf"][0]["maxLength"] = limits[field]


#: the verdict and its fields, in the order the relay writes them
_VERDICT = ("verdict", *VERDICT_FIELDS)


class _Said(AnswerRef):
    """What a feedback body says besides the verdict's fields: a vote, its comment, the verdict."""

    value: Vote = _spelled("value", "rating", description='the vote: up/down, true/false or 1/0; "" or absent for none')
    comment: Comment | None = Field(default=None, description="the vote's comment; alone, a note")
    # its category is checked with the others' lengths known (`_says_something`), as it always was
    verdict: Annotated[Literal[Verdict, ""], SkipValidation, BeforeValidator(_verdict_text)] | None = None


def _verdict_field(spec: VerdictFieldSpec) -> tuple[Any, Any]:
    """A field of the verdict as the body takes it: its name and its camelCase spelling."""
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), spec.name)
    return VerdictText | None, _spelled(*dict.fromkeys((spec.name, camel)), description=spec.description)


# the verdict's fields, one per line of `domain.config.VERDICT_FIELD_SPECS` (declared there once); a
# type checker sees `_Said` only, and the code reads them by name (`verdict_fields`)
if TYPE_CHECKING:
    _WithVerdictFields = _Said
else:
    _WithVerdictFields = create_model(
        "_WithVerdictFields", __base__=_Said, **{spec.name: _verdict_field(spec) for spec in VERDICT_FIELD_SPECS}
    )


class _Rating(_WithVerdictFields):
    """What a feedback body says: a vote and/or a verdict, the verdict's fields as
    `domain.config.VERDICT_FIELD_SPECS` declares them."""

    @model_validator(mode="after")
    def _says_something(self, info: ValidationInfo) -> Self:
        if self.verdict and self.verdict not in VERDICTS:
            raise _refuse(422, f"verdict must be one of {', '.join(VERDICTS)}")
        verdict = self.verdict_fields()
        if verdict and "corrected_answer" in verdict and not self.traceId:
            raise _refuse(400, "corrected_answer needs a traceId (Langfuse keeps no correction on a session)")
        if self.value is None and verdict is None:
            if not self.comment:
                raise _refuse(400, "value is missing (up or down), and there is no comment or verdict either")
            limit = _limits(info).get("note", DEFAULT_MAX_TEXT)
            if len(self.comment) > limit:
                raise _refuse(422, f"a comment without a rating is a note: at most {limit}")
            self.note = self.comment  # a note without a rating
            self.comment = None
        return self

    def verdict_fields(self) -> dict[str, str] | None:
        """The verdict's fields this body sets, the ones sent empty left out; None when it sends
        none of them (the verdict stays as it is)."""
        sent = self.model_fields_set.intersection(_VERDICT)
        if not sent:
            return None
        return {name: value for name in _VERDICT if name in sent and (value := getattr(self, name))}


class FeedbackIn(_Rating):
    """A vote and/or a verdict (`POST`, `PUT /api/feedback`), and who sends it."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_feedback_schema)

    environment: Id = "default"
    userId: EndUser | None = _spelled(
        "userId", "user_id", "user", description="the end user (gateway only): user:<userId>"
    )
    reviewer: Reviewer | None = Field(default=None, description="a project member writing a verdict (gateway only)")

    def request(self) -> Feedback:
        return Feedback(
            answer=self.answer,
            value=self.value,
            comment=self.comment,
            verdict=self.verdict_fields(),
            user=self.userId,
            reviewer=self.reviewer,
            environment=self.environment,
        )


class TargetIn(AnswerRef):
    """Whose feedback to retract (`DELETE /api/feedback`, body or query)."""

    userId: EndUser | None = _spelled("userId", "user_id", "user")
    reviewer: Reviewer | None = None
    author: Author | None = Field(default=None, description="whose feedback (user:<id> for an end user)")


class ScoreIn(AnswerRef):
    """One score from a named channel (`POST /api/scores`), checked against the declared model by
    the service."""

    null_means = frozenset({"value"})  # a null value is a value, refused or not by its score's type

    source: Id
    name: ScoreName
    value: Annotated[Any, WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "number"}, {"type": "string"}]})]
    comment: Comment | None = None
    environment: Id = "default"


B = TypeVar("B", bound=AnswerRef)


def problem_of(error: ValidationError) -> Problem:
    """The relay's answer to a body a model refused: its first refusal (the fields are checked in
    the order the relay has always checked them) with the status and message its field gave."""
    first = error.errors(include_url=False)[0]
    field = ".".join(str(part) for part in first["loc"]) or "the body"
    context = first.get("ctx") or {}
    if first["type"] == _REFUSED:
        return Problem(int(context["status"]), str(context["message"]))
    if first["type"] == "missing":
        return Problem(400, _MISSING.get(field, f"{field} is missing"))
    return Problem(400, f"{field}: {first['msg']}")


def _validated(model: type[B], data: dict[str, Any], max_text: Mapping[str, int] | None = None) -> B:
    """`data` as `model`; else the Problem of its first refusal. A body is checked in stages, each a
    model the next extends (the answer, then what the body says, then who says it): the first stage
    that refuses answers, so a body with several faults hears of the one it always heard of. Only a
    refused body is checked again by stage."""
    context = {"max_text": max_text or {}}
    try:
        return model.model_validate(data, context=context)
    except ValidationError as ex:
        refused = ex
    for stage in reversed(model.__mro__[1:]):
        if isinstance(stage, type) and issubclass(stage, AnswerRef):
            try:
                stage.model_validate(data, context=context)
            except ValidationError as ex:
                refused = ex
                break
    raise problem_of(refused) from None


def decode(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise Problem(400, "the body is empty: expected a JSON object")
    try:
        # decoded here, strictly: `json.loads` of bytes decodes with `surrogatepass`, so a surrogate
        # sent as raw (CESU-8) bytes would pass as text
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Problem(400, "the body is not UTF-8 text") from None
    except ValueError as ex:
        raise Problem(400, f"the body is not JSON: {ex}") from None
    except RecursionError:
        raise Problem(400, "the body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise Problem(400, "the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(body) and (where := unencodable(data)) is not None:
        # a lone surrogate (half an emoji) would be accepted here and refused by every store
        raise Problem(400, f"{where} holds a lone UTF-16 surrogate: not text (send whole characters)")
    return data


def parse_answer(data: dict[str, Any]) -> Answer:
    return _validated(AnswerRef, data).answer


def parse_feedback(data: dict[str, Any], *, max_text: Mapping[str, int]) -> Feedback:
    """A vote and/or a verdict; `max_text`: the longest value of each verdict field (by its body
    name), as the relay's declared model allows (`RelayConfig.max_text`)."""
    return _validated(FeedbackIn, data, max_text).request()


def parse_target(data: dict[str, Any]) -> Feedback:
    """A DELETE: the answer, the acting member (reviewer) or end user, and whose feedback."""
    body = _validated(TargetIn, data)
    return Feedback(answer=body.answer, user=body.userId, reviewer=body.reviewer, author=body.author)


def parse_score(data: dict[str, Any]) -> ScoreIn:
    return _validated(ScoreIn, data)


# -- the answers ---------------------------------------------------------------------------------------


class WrittenOut(BaseModel):
    """A write's answer: the score ids written and cleared, where the write is durable now."""

    ids: list[str]
    cleared: list[str]
    stored: Literal["store", "outbox"]
    author: str | None = None
    source: str | None = None
    name: str | None = None
    traceId: str | None = None
    sessionId: str | None = None
    turn: int | None = None


class FeedbackItem(BaseModel):
    """One author's feedback on one answer."""

    model_config = ConfigDict(extra="allow")  # a verdict's fields, by their body names
    author: str
    vote: Literal["up", "down"] | None
    comment: str | None
    scores: dict[str, Any]
    updatedAt: str
    traceId: str | None = None
    sessionId: str | None = None
    turn: int | None = None


class ListingOut(BaseModel):
    data: list[FeedbackItem]
    next_cursor: str | None = None


class ProblemOut(BaseModel):
    """Every refusal: what was wrong, the field named."""

    error: str


# -- the OpenAPI description ---------------------------------------------------------------------------


