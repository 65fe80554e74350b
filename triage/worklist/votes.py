"""The review view (`triage votes`): conversations of a window with their votes, filtered.

Read through the ports: the window's votes (`VoteSource.votes`), its traces (`TraceSource.root_traces`),
the traces of each session (`session_traces`); a vote on a trace that started before the window
is placed by reading that trace's observations (its root's session).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from triage.domain.conversations import FILTERS, ConversationList, TraceRef, group_conversations
from triage.domain.kernel import window
from triage.domain.ports import TraceSource, VoteSource
from triage.errors import UsageError

log = logging.getLogger("triage")


@dataclass(frozen=True)
class VotesOptions:
    since_hours: float = 24 * 7
    filter: str = "any"
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def list_conversations(
    votes_source: VoteSource,
    traces: TraceSource,
    vote_score: str,
    options: VotesOptions,
) -> ConversationList:
    if options.filter not in FILTERS:
        raise UsageError(f"unknown filter {options.filter!r}: one of {', '.join(FILTERS)}")
    start, end = window(options.now, options.since_hours)
    read = votes_source.votes(vote_score, start, end)
    votes = read.votes
    for bad in read.bad:
        log.warning("vote %s cannot be read: %s", bad.id or "(no id)", bad.reason, extra={"event": "bad_vote"})
    refs = {ref.trace_id: ref for ref in traces.root_traces(start, end)}
    outside = sorted({v.trace_id for v in votes if v.trace_id and v.trace_id not in refs})
    if outside:
        for trace_id, found in traces.observations(outside).items():
            if isinstance(found, list) and found:
                roots = [o for o in found if o.parent_observation_id is None or o.is_root_observation]
                root = min(roots or found, key=lambda o: o.start_time)
                refs[trace_id] = TraceRef(trace_id=trace_id, session_id=root.session_id, start_time=root.start_time)
            else:
                refs[trace_id] = TraceRef(trace_id=trace_id)  # not readable (yet): its own conversation
    sessions = sorted(
        {r.session_id for r in refs.values() if r.session_id}
        | {v.session_id for v in votes if v.session_id and not v.trace_id}
    )
    session_traces = traces.session_traces(sessions) if sessions else {}
    rows = group_conversations(refs.values(), votes, session_traces)
    kept = [c for c in rows if FILTERS[options.filter](c)]
    for conversation in kept:
        if conversation.first_trace:
            conversation.url = traces.trace_url(conversation.first_trace)
    return ConversationList(
        start=start, end=end, filter=options.filter, total=len(rows), conversations=kept, bad_votes=read.bad
    )
