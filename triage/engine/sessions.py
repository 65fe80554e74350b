"""Votes grouped by trace: a vote on a session goes to the trace it rates (`conversations.rated_trace`)."""

from __future__ import annotations

from triage.domain.conversations import TurnPending, rated_trace
from triage.domain.ports import TraceSource
from triage.domain.records import Vote
from triage.engine.ledger import Ledger


def votes_by_trace(traces: TraceSource, votes: list[Vote], ledger: Ledger) -> dict[str, list[Vote]]:
    """Trace id -> its votes. A vote on neither a trace nor a session is bad input; a session vote
    whose trace has not arrived yet (its turn, or without one its latest answer at the vote's time)
    is pending. Both are listed."""
    by_trace: dict[str, list[Vote]] = {}
    session_votes = [v for v in votes if not v.trace_id]
    sessions = traces.session_traces(sorted({v.session_id for v in session_votes if v.session_id}))
    for vote in votes:
        if vote.trace_id:
            by_trace.setdefault(vote.trace_id, []).append(vote)
            continue
        if not vote.session_id:
            ledger.skip([vote], None, "bad_input", "vote is on neither a trace nor a session")
            continue
        rated = rated_trace(vote, sessions.get(vote.session_id, []))
        if isinstance(rated, TurnPending):
            ledger.skip([vote], None, "pending", rated.reason)
        else:
            by_trace.setdefault(rated, []).append(vote)
    return by_trace
