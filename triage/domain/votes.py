"""Votes as the job reads them, whichever store holds them (pure: no I/O).

- `in_window`: which votes a window holds. Langfuse upserts a score only when its id and its
  timestamp both match, so the relay keeps a vote's first timestamp when the user changes it, and
  the change shows in `updatedAt` alone. A window therefore holds every vote *cast or changed* in
  it: a thumbs-up on Monday turned down on Wednesday is Wednesday night's.
- `read_vote`: one stored row's fields made a `Vote`, or a `BadVote` naming the field that cannot
  be read. One bad row is listed as bad input; it never costs the night its other votes.
- `WindowVotes`: what a `VoteSource` answers for a window, the votes and the rows set aside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from triage.domain.kernel import clip, parse_time
from triage.domain.records import Vote
from triage.domain.scores import MAX_TURN, parse_turn

#: how much of a bad value a reason quotes (the rest may be anything a client sent)
QUOTED_CHARS = 40


@dataclass(frozen=True, slots=True)
class BadVote:
    """A row of the vote score that is no readable vote, with the reason. `value` is the row's
    value when that much could be read (None: unknown, so it may be a thumbs-down)."""

    id: str | None
    reason: str
    trace_id: str | None = None
    session_id: str | None = None
    value: float | None = None
    comment: str | None = None  # what the user said, when that much could be read

    @property
    def may_be_thumbs_down(self) -> bool:
        return self.value is None or self.value == 0

    @property
    def subject(self) -> str:
        """What a shard hashes: the trace, else the session, as for a readable vote."""
        if self.trace_id:
            return self.trace_id
        if self.session_id:
            return f"session:{self.session_id}"
        return f"vote:{self.id}"


@dataclass(frozen=True, slots=True)
class WindowVotes:
    """The votes cast or changed in a window, and the rows of the vote score that cannot be read."""

    votes: list[Vote]
    bad: list[BadVote] = field(default_factory=list)


def in_window(timestamp: datetime, updated_at: datetime | None, start: datetime, end: datetime) -> bool:
    """Whether a vote belongs to [start, end): cast (`timestamp`) or last changed (`updatedAt`) in it."""
    return start <= timestamp < end or (updated_at is not None and start <= updated_at < end)


def stored_time(value: object, name: str) -> datetime:
    """A stored time (an aware datetime, or ISO-8601 text; naive means UTC); ValueError naming
    `name` when it is none."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            return parse_time(value)
        except ValueError:
            pass
    raise ValueError(f"{name} {quoted(value)} is not an ISO-8601 time")


def quoted(value: object) -> str:
    """`value` for a reason: its repr, cut short (it may be anything a client sent)."""
    try:
        text = repr(value)
    except RecursionError:  # JSON nested about as deep as the parser allows
        return f"a {type(value).__name__} nested too deeply"
    return clip(text, QUOTED_CHARS)


def _number(value: object) -> float | None:
    """A vote's value as a finite float (a boolean is 0 or 1); None when it is none."""
    if not isinstance(value, bool | int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def _text(value: object) -> str | None:
    """A non-empty string, else None (absent)."""
    return value if isinstance(value, str) and value else None


def read_vote(
    *,
    vote_id: object,
    value: object,
    timestamp: datetime,
    updated_at: datetime | None,
    trace_id: object = None,
    session_id: object = None,
    turn: object = None,
    comment: object = None,
    user_id: object = None,
    environment: object = None,
) -> Vote | BadVote:
    """One row's fields as a `Vote`, or a `BadVote` with the first field that cannot be read.

    A trace wins over a session; `turn` (the session's 0-based answer, from the score's metadata)
    is read on session votes only, strictly (`parse_turn`: ASCII digits, at most `MAX_TURN`). A
    session vote without a turn is a vote too: it rates the session's latest answer at its time
    (`conversations.rated_trace`), and the review view counts it on its session.
    """
    ident, trace, session = _text(vote_id), _text(trace_id), _text(session_id)
    number = _number(value)

    said = comment if isinstance(comment, str) else None

    def bad(reason: str) -> BadVote:
        return BadVote(
            id=ident,
            reason=reason,
            trace_id=trace,
            session_id=None if trace else session,
            value=number,
            comment=said,
        )

    if ident is None:
        return bad("the row has no id" if vote_id is None else f"its id {quoted(vote_id)} is not text")
    for name, raw, text in (("traceId", trace_id, trace), ("sessionId", session_id, session)):
        if raw is not None and raw != "" and text is None:
            return bad(f"its {name} {quoted(raw)} is not text")
    if number is None:
        return bad(f"its value {quoted(value)} is not a number")
    if trace is None and session is None:
        return bad("it is on neither a trace nor a session")
    answer: int | None = None
    if trace is None and turn is not None:
        answer = parse_turn(turn)
        if answer is None:
            return bad(
                f"its metadata.turn {quoted(turn)} is not a turn (a whole number from 0 to {MAX_TURN})"
            )
    if comment is not None and not isinstance(comment, str):
        return bad(f"its comment {quoted(comment)} is not text")
    if environment is not None and not isinstance(environment, str):
        return bad(f"its environment {quoted(environment)} is not text")
    return Vote(
        id=ident,
        value=number,
        timestamp=timestamp,
        trace_id=trace,
        session_id=None if trace else session,
        turn=answer,
        comment=comment,
        # who voted is shown, never decided on: a voter id that is no scalar is dropped, not the vote
        user_id=str(user_id) if isinstance(user_id, str | int) and not isinstance(user_id, bool) else None,
        updated_at=updated_at,
        environment=environment or "default",
    )
