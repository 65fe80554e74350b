"""A vote on a session without a turn rates the session's latest answer at the vote's time (#27 A).

Hopsworks' rule, the one users expect: a thumb under a chat rates the answer on screen when it was
clicked, so the latest trace of the session that started at or before the vote's timestamp; a
trace started after the vote answers a later question. Until such a trace has arrived the vote is
pending and listed, like a turn that has not arrived. Before, such a vote was dropped as bad input.

The rule (`domain.votes.rated_trace`) is exercised the ways a night reaches it: the engine
on fakes, and `triage feedback` for real on the embedded store and on the Langfuse stand-in (each
source orders a session's traces and gives their start times itself).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from tests.doubles.fakes import FakeJudge, FakeSource
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.engine.test_engine_fakes import DOCS_URL, EARLY, OK, QUESTION, run
from tests.engine.test_engine_fakes import NOW as FAKE_NOW
from tests.engine.test_job_score_path import feedback  # the same `triage feedback` run, no window lag
from tests.factories import trace_line
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.errors import ExitCode
from triage.sources.store import Store


def no_turn_vote(vote_id: str, session_id: str, at: datetime) -> dict[str, Any]:
    """A thumbs-down on a session with no turn in its metadata (a widget that knows only the chat);
    its comment names it, so the report shows which trace it went to."""
    score = {"id": vote_id, "name": "user_feedback", "dataType": "BOOLEAN", "value": 0, "comment": f"said {vote_id}",
             "sessionId": session_id, "metadata": {"source": "widget"}, "timestamp": at.isoformat()}  # fmt: skip
    return {"traceId": None, "observations": [], "scores": [score]}


def turn(trace_id: str, session_id: str, at: datetime) -> dict[str, Any]:
    """One answer of a session, started `at`, searched, no vote of its own."""
    return trace_line(
        trace_id, QUESTION, f"Answer {trace_id}.", [("search_kubeflow_docs", DOCS_URL, EARLY)],
        at=at, session_id=session_id, vote=None,
    )  # fmt: skip


def conversation(start: datetime) -> list[dict[str, Any]]:
    """Session `chat` with three answers (ids out of start order, so the order is the times'),
    a vote between the second and the third, a vote at the very start of the first; session
    `later` whose only answer started after its vote; session `empty` with no answer yet."""
    return [
        turn("c-second", "chat", start + timedelta(minutes=2)),
        turn("c-first", "chat", start),
        turn("c-third", "chat", start + timedelta(minutes=10)),
        no_turn_vote("v-mid", "chat", start + timedelta(minutes=5)),
        turn("x-only", "exact", start),
        no_turn_vote("v-exact", "exact", start),  # at the trace's own start: at or before
        turn("l-after", "later", start + timedelta(minutes=8)),
        no_turn_vote("v-before", "later", start + timedelta(minutes=7)),
        no_turn_vote("v-empty", "empty", start + timedelta(minutes=7)),
    ]


RATED = {"v-mid": "c-second", "v-exact": "x-only"}
PENDING = {"v-before": "later", "v-empty": "empty"}


def test_the_engine_triages_the_latest_answer_at_the_votes_time_and_lists_the_rest_as_pending() -> None:
    rows: list[Mapping[str, Any]] = conversation(FAKE_NOW - timedelta(hours=4))
    source = FakeSource.from_rows(rows)
    judge = FakeJudge().enqueue(OK).enqueue(OK)
    result = run(source, judge)

    assert {e.trace_id: e.comments for e in result.entries} == {t: [f"said {v}"] for v, t in RATED.items()}
    assert sorted(c.trace_id for c in judge.history) == sorted(RATED.values())
    assert {s.undecided.vote_ids[0]: s.undecided.kind for s in result.skipped} == dict.fromkeys(PENDING, "pending")
    for skipped in result.skipped:
        session = PENDING[skipped.undecided.vote_ids[0]]
        assert f"session {session} has no trace started by its vote" in skipped.undecided.reason
    assert result.exit_code == ExitCode.OK  # pending is listed, not an error


# -- `triage feedback` for real -------------------------------------------------------------------

NOW = datetime.now(UTC).replace(microsecond=0)
def check_night(result: Result, summary: dict[str, Any]) -> None:
    assert result.exit_code == ExitCode.OK, result.output
    assert summary["triaged"] == len(RATED) and summary["not_triaged"] == {"pending": len(PENDING)}
    report, listed = result.stdout.split("## Not triaged")
    for vote_id, trace_id in RATED.items():
        entry = report.split(f"trace `{trace_id}`")[1].split("\n- ")[0]
        assert f"user said: said {vote_id}" in entry
    for other in ("c-first", "c-third", "l-after"):
        assert f"trace `{other}`" not in report  # neither an earlier answer nor one after the vote
    for session in PENDING.values():
        assert f"pending: session {session} has no trace started by its vote" in listed


def test_feedback_on_the_embedded_store(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in conversation(NOW - timedelta(hours=3))], "chat")
    env = {"TRIAGE_STORE": str(path), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
    check_night(*feedback(env, tmp_path))


@pytest.mark.slow
def test_feedback_on_langfuse(openapi: Any, tmp_path: Path) -> None:  # noqa: F811
    with LangfuseStandIn(records=conversation(NOW - timedelta(hours=3))) as server:
        check_night(*feedback({**server.env, "LANGFUSE_TIMEOUT": "5"}, tmp_path))
        for entry in server.log:
            validate(openapi, entry)
