"""The relay's API as models: what each body may hold and what each answer holds. `openapi.py`
builds `/openapi.json` from them, and the answers are built with them, so the description cannot
drift from the server (schemathesis checks the running relay against it: tests/test_relay_fuzz.py).

The request models state the limits the parsers in `requests.py` enforce (the same constants);
the parsers stay the judges of meaning (which ids go together, what a value means for its score).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from triage.domain.scores import MAX_TURN
from triage.relay.requests import MAX_COMMENT, MAX_ID, MAX_SCORE_NAME

_UNPRINTABLE = "\\x00-\\x1f\\x7f-\\x9f\\u200b-\\u200f\\u202a-\\u202e\\u2066-\\u2069"
#: an id: printable characters (no control, format or bidi character), not blank, at most MAX_ID
_ID_PATTERN = f"^[^{_UNPRINTABLE}]*[^\\s{_UNPRINTABLE}][^{_UNPRINTABLE}]*$"
Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID, pattern=_ID_PATTERN)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class AnswerRef(_Body):
    """The answer: `traceId`, or `sessionId` (also `contextId`) with `turn` (or `turnNumber`)."""

    traceId: Id | None = None
    sessionId: Id | None = None
    contextId: Id | None = Field(default=None, description="the chat form's name for sessionId")
    turn: int | None = Field(default=None, ge=0, le=MAX_TURN, description="0-based turn of the answer in the session")
    turnNumber: int | None = Field(default=None, ge=1, le=MAX_TURN, description="1-based turn (K2View's form)")


class FeedbackIn(AnswerRef):
    """A vote and/or a verdict (`POST`, `PUT /api/feedback`)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"example": {"contextId": "c-42", "turn": 0, "value": "down", "comment": "the link is dead"}},
    )
    value: Literal["up", "down", ""] | bool | Literal[0, 1] | None = Field(
        default=None, description='the vote: up/down, true/false or 1/0; "" or absent for none'
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT, description="the vote's comment; alone, a note")
    userId: Id | None = Field(default=None, description="the end user (gateway only): user:<userId>")
    reviewer: Id | None = Field(default=None, description="a project member writing a verdict (gateway only)")
    verdict: Literal["positive", "negative", "false_alarm"] | None = None
    issue_category: str | None = Field(default=None, max_length=64, description="wrong_answer, missing_info, ...")
    corrected_answer: str | None = Field(default=None, description="a CORRECTION score (traces only)")
    expected_tool_behavior: str | None = Field(default=None, max_length=500)
    note: str | None = Field(default=None, max_length=500)
    environment: Id | None = None


class TargetIn(AnswerRef):
    """Whose feedback to retract (`DELETE /api/feedback`, body or query)."""

    userId: Id | None = None
    reviewer: Id | None = None
    author: Id | None = Field(default=None, description="whose feedback (user:<id> for an end user)")


class ScoreIn(AnswerRef):
    """One score from a named channel (`POST /api/scores`)."""

    source: Id
    name: str = Field(min_length=1, max_length=MAX_SCORE_NAME)
    value: bool | float | str
    comment: str | None = Field(default=None, max_length=MAX_COMMENT)
    environment: Id | None = None


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

    model_config = ConfigDict(extra="allow")  # a verdict's fields, by the configured names
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


MODELS: tuple[type[BaseModel], ...] = (FeedbackIn, TargetIn, ScoreIn, WrittenOut, ListingOut, ProblemOut)
