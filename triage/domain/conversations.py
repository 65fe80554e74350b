"""Conversations and their votes: the review view's rows and filters (pure: no I/O).

A conversation is a session; a trace without a session is a conversation of its own. Its counts are
the votes of the window on it (a vote on a session, or on one of its traces), with or without a
note (the vote's comment), and how many traces it has.

`rated_trace` is the one rule for which answer a vote on a session rates (the job triages that trace).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.kernel import iso_ms
from triage.domain.records import Vote
from triage.domain.votes import BadVote

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
