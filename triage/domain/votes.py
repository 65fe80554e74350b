"""Votes as the job reads them, whichever store holds them (pure: no I/O).

- `in_window`: which votes a window holds. Langfuse upserts a score only when its id and its
  timestamp both match, so the relay keeps a vote's first timestamp when the user changes it, and
  the change shows in `updatedAt` alone. A window therefore holds every vote *cast or changed* in
  it: a thumbs-up on Monday turned down on Wednesday is Wednesday night's.
- `read_vote`: one stored row's fields made a `Vote`, or a `BadVote` naming the field that cannot
  be read. One bad row is listed as bad input; it never costs the night its other votes.
- `WindowVotes`: what a `VoteSource` answers for a window, the votes and the rows set aside.

Conversations and their votes: the review view's rows and filters (pure: no I/O).

A conversation is a session; a trace without a session is a conversation of its own. Its counts are
the votes of the window on it (a vote on a session, or on one of its traces), with or without a
note (the vote's comment), and how many traces it has.

`rated_trace` is the one rule for which answer a vote on a session rates (the job triages that trace).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.kernel import clip, iso_ms, parse_time
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
    (`rated_trace`), and the review view counts it on its session.
    """
    ident, trace, session = _text(vote_id), _text(trace_id), _text(session_id)
    number = _number(value)
    on_session = None if trace else session  # a trace wins over a session

    said = comment if isinstance(comment, str) else None

    def bad(reason: str) -> BadVote:
        return BadVote(
            id=ident,
            reason=reason,
            trace_id=trace,
            session_id=on_session,
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
        session_id=on_session,
        turn=answer,
        comment=comment,
        # who voted is shown, never decided on: a voter id that is no scalar is dropped, not the vote
        user_id=str(user_id) if isinstance(user_id, str | int) and not isinstance(user_id, bool) else None,
        updated_at=updated_at,
        environment=environment or "default",
    )


#: the newest comments a conversation row keeps (the rest stay in the store)
MAX_COMMENTS = 5


class TraceRef(BaseModel):
    """A trace's place: its id, its session (if any) and when it started."""

    model_config = ConfigDict(extra="forbid")

    trace_id: str
    session_id: str | None = None
    start_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class TurnPending:
    """A session vote whose rated trace has not arrived (yet), and why: listed, never dropped."""

    reason: str


def rated_trace(vote: Vote, session: Sequence[TraceRef]) -> str | TurnPending:
    """The trace a vote on a session rates, given the session's traces in start order.

    With a turn (0-based, in its metadata): the session's `turn`-th trace. Without one: the latest
    trace that started at or before the vote's timestamp (Hopsworks' rule: a vote on a conversation
    rates its latest turn at the vote's time); a trace started after the vote answers a later
    question, so it is never the one rated. Either way, while that trace is not there (Langfuse
    ingests traces late) the vote is pending.
    """
    if vote.turn is not None:
        if vote.turn < len(session):
            return session[vote.turn].trace_id
        return TurnPending(
            f"session {vote.session_id} has {len(session)} trace(s) so far; turn {vote.turn} has not arrived"
        )
    # (start, id): the session's own order, whatever order the traces came in
    started = [(t.start_time, t.trace_id) for t in session if t.start_time and t.start_time <= vote.timestamp]
    if started:
        return max(started)[1]
    return TurnPending(
        f"session {vote.session_id} has no trace started by its vote at {iso_ms(vote.timestamp)} so far; "
        "without a turn, a vote rates the latest answer at its time"
    )


class Conversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal["session", "trace"]
    traces: int = 0
    up: int = 0
    down: int = 0
    notes: int = 0
    started: datetime | None = None
    last_vote: datetime | None = None
    #: the newest comments first, at most MAX_COMMENTS
    comments: list[str] = Field(default_factory=list)
    #: the first trace, to link to
    first_trace: str | None = None
    url: str | None = None

    @property
    def votes(self) -> int:
        return self.up + self.down


#: the filters people use on feedback (K2View's, Langfuse's score filters), by name
FILTERS: dict[str, Callable[[Conversation], bool]] = {
    "all": lambda c: True,
    "any": lambda c: c.votes > 0,
    "none": lambda c: c.votes == 0,
    "has-positive": lambda c: c.up > 0,
    "has-negative": lambda c: c.down > 0,
    "has-notes": lambda c: c.notes > 0,
    "positive-only": lambda c: c.up > 0 and c.down == 0,
    "negative-only": lambda c: c.down > 0 and c.up == 0,
    "mixed": lambda c: c.up > 0 and c.down > 0,
}


def vote_direction(vote: Vote) -> Literal["up", "down"] | None:
    """A thumbs-down is 0, a thumbs-up anything above (a rating scale's top); other values are no vote."""
    if vote.value == 0:
        return "down"
    if vote.value > 0:
        return "up"
    return None


def group_conversations(
    traces: Iterable[TraceRef],
    votes: Iterable[Vote],
    session_traces: Mapping[str, Sequence[TraceRef]],
) -> list[Conversation]:
    """One row per conversation that started in the window or has a vote in it.

    `traces`: the traces known (those of the window, and those the votes are on); `session_traces`:
    every trace of each session, in order. Rows are ordered newest first (last vote, else start).
    """
    refs = {ref.trace_id: ref for ref in traces}
    rows: dict[str, Conversation] = {}

    def row(conversation_id: str, kind: Literal["session", "trace"]) -> Conversation:
        held = rows.get(conversation_id)
        if held is None:
            held = rows[conversation_id] = Conversation(id=conversation_id, kind=kind)
        return held

    for ref in refs.values():
        conversation = row(ref.session_id, "session") if ref.session_id else row(ref.trace_id, "trace")
        if ref.start_time is not None and (conversation.started is None or ref.start_time < conversation.started):
            conversation.started = ref.start_time
            conversation.first_trace = ref.trace_id
        elif conversation.first_trace is None:
            conversation.first_trace = ref.trace_id

    comments: dict[str, list[tuple[datetime, str, str]]] = {}
    for vote in votes:
        direction = vote_direction(vote)
        if direction is None:
            continue
        if vote.trace_id:
            placed = refs.get(vote.trace_id)
            session = placed.session_id if placed is not None else None
            conversation = row(session, "session") if session else row(vote.trace_id, "trace")
            if conversation.first_trace is None:
                conversation.first_trace = vote.trace_id
        elif vote.session_id:
            conversation = row(vote.session_id, "session")
        else:
            continue  # a vote on nothing: the sources set such a row aside as a `BadVote`
        if direction == "up":
            conversation.up += 1
        else:
            conversation.down += 1
        # a changed vote keeps its first timestamp: its last change is when it was last voted
        voted = max(vote.timestamp, vote.updated_at) if vote.updated_at is not None else vote.timestamp
        if vote.comment and vote.comment.strip():
            conversation.notes += 1
            comments.setdefault(conversation.id, []).append((voted, vote.id, vote.comment.strip()))
        if conversation.last_vote is None or voted > conversation.last_vote:
            conversation.last_vote = voted

    for conversation in rows.values():
        if conversation.kind == "session":
            known = session_traces.get(conversation.id) or []
            conversation.traces = len(known) or sum(1 for r in refs.values() if r.session_id == conversation.id)
            if conversation.first_trace is None and known:
                conversation.first_trace = known[0].trace_id
        else:
            conversation.traces = 1
        newest = sorted(comments.get(conversation.id, []), reverse=True)
        conversation.comments = [text for _, _, text in newest[:MAX_COMMENTS]]

    def order(c: Conversation) -> tuple[str, str]:
        stamp = c.last_vote or c.started
        return (stamp.isoformat() if stamp else "", c.id)

    return sorted(rows.values(), key=order, reverse=True)


class ConversationList(BaseModel):
    """`triage votes`: the window, the filter, and the conversations it kept."""

    model_config = ConfigDict(extra="forbid")

    start: datetime
    end: datetime
    filter: str
    #: conversations in the window before the filter
    total: int
    conversations: list[Conversation] = Field(default_factory=list)
    #: rows of the vote score that cannot be read, with their reasons (counted nowhere, listed)
    bad_votes: list[BadVote] = Field(default_factory=list)
