"""Request bodies to what they ask for (pure): the answer, the vote, the verdict, the named people.

Accepts a chat form (`{"contextId", "turn", "value": "up"|"down", "comment"}`, modelled on the
Kubeflow docs agent's feedback design; its widget sends no votes yet), triage's own camelCase names
and their snake_case spellings, and K2View's 1-based `turnNumber`. A malformed body or a missing id
is a 400 naming the field; a value of the wrong kind for its score is a 422.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from triage.domain.relay import VERDICT_FIELDS
from triage.domain.scores import END_USER, MAX_TURN, normalise_author, parse_turn, unencodable
from triage.relay.problems import Problem
from triage.relay.tokens import answer_key

VERDICTS = ("positive", "negative", "false_alarm")
#: issue_category: these, or any string up to 64 characters, kept as written
ISSUE_CATEGORIES = ("wrong_answer", "missing_info", "wrong_tool", "refused", "unsafe", "other")
MAX_ID = 200
MAX_COMMENT = 4000
MAX_SCORE_NAME = 64  # as a declared score's name
ANONYMOUS = f"{END_USER}anonymous"
#: a JSON escape of a UTF-16 surrogate: only then can the decoded body hold text UTF-8 cannot encode
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

_ALIASES = {
    "traceId": ("traceId", "trace_id"),
    "sessionId": ("sessionId", "session_id", "contextId"),
    "turn": ("turn",),
    "turnNumber": ("turnNumber", "turn_number"),
    "value": ("value", "rating"),
    "comment": ("comment",),
    "userId": ("userId", "user_id", "user"),
    "reviewer": ("reviewer",),
    "author": ("author",),
    "environment": ("environment",),
    "verdict": ("verdict",),
    "issue_category": ("issue_category", "issueCategory"),
    "corrected_answer": ("corrected_answer", "correctedAnswer"),
    "expected_tool_behavior": ("expected_tool_behavior", "expectedToolBehavior"),
    "note": ("note",),
    "source": ("source",),
    "name": ("name",),
}


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
    """One POST/PUT body: a vote (value, comment) and/or a verdict (its fields, replaced whole)."""

    answer: Answer
    value: bool | None = None
    comment: str | None = None
    verdict: dict[str, str] | None = None  # None: the request says nothing about the verdict
    user: str | None = None  # an end user named by the gateway
    reviewer: str | None = None  # a project member
    author: str | None = None  # DELETE: whose feedback
    environment: str = "default"
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def has_vote(self) -> bool:
        return self.value is not None


@dataclass
class ScoreIn:
    """`POST /api/scores`: one score from a named channel, checked against the declared model."""

    answer: Answer
    source: str
    name: str
    value: Any
    comment: str | None
    environment: str


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


def _get(data: dict[str, Any], name: str) -> Any:
    for alias in _ALIASES[name]:
        if alias in data and data[alias] is not None:
            return data[alias]
    return None


def _text(data: dict[str, Any], name: str, limit: int, *, status: int = 422) -> str | None:
    value = _get(data, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Problem(400, f"{name} must be a string")
    if len(value) > limit:
        raise Problem(status, f"{name} is {len(value)} characters; at most {limit}")
    return value


def _id(data: dict[str, Any], name: str) -> str | None:
    value = _get(data, name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise Problem(400, f"{name} must be a non-empty string")
    # printable: no control (C0, DEL, C1), format (bidi, zero-width) or unassigned characters
    if len(value) > MAX_ID or not value.isprintable():
        raise Problem(400, f"{name} must be at most {MAX_ID} printable characters")
    return value


def _int(value: Any, name: str, low: int) -> int:
    """An integer from `low` to `MAX_TURN`, as a JSON integer or a string of ASCII digits."""
    number = parse_turn(value)
    if number is None or number < low:
        raise Problem(400, f"{name} must be an integer from {low} to {MAX_TURN}")
    return number


def parse_answer(data: dict[str, Any]) -> Answer:
    trace_id = _id(data, "traceId")
    session_id = _id(data, "sessionId")
    turn: int | None = None
    if _get(data, "turn") is not None:
        turn = _int(_get(data, "turn"), "turn", 0)
    elif _get(data, "turnNumber") is not None:
        turn = _int(_get(data, "turnNumber"), "turnNumber", 1) - 1  # K2View counts from 1
    if trace_id:
        return Answer(trace_id=trace_id, session_id=session_id, turn=turn)
    if session_id is None:
        raise Problem(400, "traceId is missing (or sessionId, also as contextId, with turn)")
    if turn is None:
        raise Problem(400, "turn is missing: a vote on a session names its 0-based turn (or turnNumber)")
    return Answer(session_id=session_id, turn=turn)


def parse_vote_value(value: Any) -> bool | None:
    """up/down, true/false, 1/0; "" is no rating (a note without one)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in {"up", "down", "thumbs_up", "thumbs_down", "true", "false"}:
        return value.lower() in {"up", "thumbs_up", "true"}
    raise Problem(422, "value must be up or down (also true/false or 1/0; \"\" for a note without a rating)")


def _who(data: dict[str, Any]) -> tuple[str | None, str | None]:
    """The end user's subject and the reviewer, each spelled once (`normalise_author`)."""
    user = _id(data, "userId")
    reviewer = _id(data, "reviewer")
    if reviewer is not None:
        reviewer = normalise_author(reviewer)
        if reviewer.startswith(END_USER):
            raise Problem(400, f"reviewer names a project member; an end user is userId (not {END_USER}...)")
        if not reviewer:
            raise Problem(400, "reviewer must be a non-empty string")
    if user is not None:
        user = normalise_author(f"{END_USER}{user}").removeprefix(END_USER)
        if user.casefold().startswith(END_USER):
            user = user[len(END_USER) :].strip()  # the prefix written out by the client
        user = user or None
    return user, reviewer


def parse_feedback(data: dict[str, Any], *, max_text: dict[str, int]) -> Feedback:
    answer = parse_answer(data)
    value = parse_vote_value(_get(data, "value"))
    comment = _text(data, "comment", MAX_COMMENT)
    verdict: dict[str, str] | None = None
    named = [n for n in ("verdict", *VERDICT_FIELDS) if _get(data, n) is not None]
    if named:
        verdict = {}
        for name in ("verdict", *VERDICT_FIELDS):
            text = _text(data, name, max_text.get(name, 500))
            if text is None or text == "":
                continue
            verdict[name] = text
        if "verdict" in verdict and verdict["verdict"] not in VERDICTS:
            raise Problem(422, f"verdict must be one of {', '.join(VERDICTS)}")
        if "corrected_answer" in verdict and not answer.trace_id:
            raise Problem(400, "corrected_answer needs a traceId (Langfuse keeps no correction on a session)")
    if value is None and verdict is None:
        if comment:
            verdict = {"note": comment}  # a note without a rating
            comment = None
            if len(verdict["note"]) > max_text.get("note", 500):
                raise Problem(422, f"a comment without a rating is a note: at most {max_text.get('note', 500)}")
        else:
            raise Problem(400, "value is missing (up or down), and there is no comment or verdict either")
    environment = _id(data, "environment") or "default"
    user, reviewer = _who(data)
    return Feedback(
        answer=answer,
        value=value,
        comment=comment,
        verdict=verdict,
        user=user,
        reviewer=reviewer,
        environment=environment,
        raw=data,
    )


def parse_target(data: dict[str, Any]) -> Feedback:
    """A DELETE: the answer, the acting member (reviewer) or end user, and whose feedback."""
    answer = parse_answer(data)
    user, reviewer = _who(data)
    author = _id(data, "author")
    return Feedback(
        answer=answer, user=user, reviewer=reviewer, author=normalise_author(author) if author else None
    )


def parse_score(data: dict[str, Any]) -> ScoreIn:
    answer = parse_answer(data)
    source = _id(data, "source")
    if source is None:
        raise Problem(400, "source is missing: the channel that writes the score")
    name = _id(data, "name")
    if name is None:
        raise Problem(400, "name is missing: the score's name")
    if len(name) > MAX_SCORE_NAME:
        raise Problem(400, f"name must be at most {MAX_SCORE_NAME} characters")
    if "value" not in data:
        raise Problem(400, "value is missing")
    return ScoreIn(
        answer=answer,
        source=source,
        name=name,
        value=data["value"],
        comment=_text(data, "comment", MAX_COMMENT),
        environment=_id(data, "environment") or "default",
    )
