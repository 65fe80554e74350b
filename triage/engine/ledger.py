"""The run's ledger: every thumbs-down ends here, triaged (an `Entry`) or listed (`Skipped`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from triage.domain.outcome import Entry, RunResult, Skipped, shorten
from triage.domain.ports import TraceSource
from triage.domain.records import Undecided, UndecidedKind, Vote
from triage.domain.votes import BadVote
from triage.redact import redact

log = logging.getLogger("triage")


def comments(votes: Sequence[Vote]) -> list[str]:
    """The votes' non-empty comments, stripped."""
    return [v.comment.strip() for v in votes if v.comment and v.comment.strip()]


class Ledger:
    """Writes entries and skipped votes into `result`, with links from `traces`."""

    def __init__(self, result: RunResult, traces: TraceSource) -> None:
        self.result = result
        self.traces = traces

    def add(self, entry: Entry) -> None:
        self.result.entries.append(entry)

    def skip(
        self,
        votes: Sequence[Vote],
        trace_id: str | None,
        kind: UndecidedKind,
        reason: str,
        question: str | None = None,
    ) -> None:
        self._list([v.id for v in votes], trace_id, kind, reason, question, comments(votes))

    def unreadable(self, bad: BadVote) -> None:
        """A row of the vote score that cannot be read: bad input, listed with its reason."""
        on = f" (on session {bad.session_id})" if bad.session_id else ""
        said = [bad.comment.strip()] if bad.comment and bad.comment.strip() else []
        reason = f"the vote cannot be read{on}: {bad.reason}"
        self._list([bad.id or "(no id)"], bad.trace_id, "bad_input", reason, said=said)

    def _list(
        self,
        vote_ids: list[str],
        trace_id: str | None,
        kind: UndecidedKind,
        reason: str,
        question: str | None = None,
        said: list[str] | None = None,
    ) -> None:
        # reasons often quote an outside system's error text: never let a secret through
        reason = redact(reason)
        undecided = Undecided(vote_ids=vote_ids, trace_id=trace_id, kind=kind, reason=reason)
        url = self.traces.trace_url(trace_id) if trace_id else None
        self.result.skipped.append(Skipped(undecided, shorten(question) if question else None, said or [], url))
        log.warning(
            "undecided %s: %s",
            trace_id or ",".join(undecided.vote_ids),
            reason,
            extra={"event": "undecided", "trace_id": trace_id, "kind": kind},
        )
