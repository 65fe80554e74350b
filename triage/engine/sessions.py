"""Votes grouped by trace: a vote on a session goes to the `turn`-th trace of that session."""

from __future__ import annotations

from triage.domain.ports import TraceSource
from triage.domain.records import Vote
from triage.engine.ledger import Ledger


def votes_by_trace(traces: TraceSource, votes: list[Vote], ledger: Ledger) -> dict[str, list[Vote]]:
    """Trace id -> its votes. A vote on neither a trace nor a session, or a session vote without a
    turn, is bad input; a turn whose trace has not arrived yet is pending. Both are listed."""
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
        session = sessions.get(vote.session_id, [])
        if vote.turn is None:
            ledger.skip(
                [vote], None, "bad_input", f"session vote on {vote.session_id} has no turn in its metadata"
            )
        elif vote.turn < len(session):
            by_trace.setdefault(session[vote.turn], []).append(vote)
        else:
            ledger.skip(
                [vote],
                None,
                "pending",
                f"session {vote.session_id} has {len(session)} trace(s) so far; turn {vote.turn} has not arrived",
            )
    return by_trace
