"""The real `triage feedback` CLI against the Langfuse stand-in (LANGFUSE_* pointing at 127.0.0.1)."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.doubles.langfuse_server import LangfuseStandIn, iso
from tests.factories import trace_line
from triage.cli import cli
from triage.domain.scores import score_id

pytestmark = pytest.mark.slow

NOW = datetime.now(UTC)
KATIB = "https://www.kubeflow.org/docs/components/katib/experiment/"


def thumbs_down(n: int) -> list[dict[str, Any]]:
    return [
        trace_line(
            f"t{i:03d}",
            f"How do I configure a katib experiment trial {i}?",
            "Use the trial template in the experiment spec.",
            [
                (
                    "search_kubeflow_docs",
                    KATIB,
                    "A katib experiment configures each trial with a trial template.",
                )
            ],
            at=NOW - timedelta(hours=3, minutes=i),
        )
        for i in range(n)
    ]


def run(server: LangfuseStandIn, *args: str, secret: str | None = None, timeout: str = "5") -> Result:
    env = {
        "LANGFUSE_PUBLIC_KEY": server.public_key,
        "LANGFUSE_SECRET_KEY": secret or server.secret_key,
        "LANGFUSE_BASE_URL": server.url,
        "LANGFUSE_TIMEOUT": timeout,
    }
    command = ["feedback", "--since-hours", "24", "--write", "--judge", "heuristic", *args]
    return CliRunner().invoke(cli, command, env=env, catch_exceptions=False)


def scored(server: LangfuseStandIn, trace_ids: list[str]) -> set[str]:
    """Traces carrying both triage scores (rule version 1)."""
    ids = {row["id"] for row in server.score_rows()}
    return {
        t
        for t in trace_ids
        if score_id(t, "triage_layer", "1") in ids and score_id(t, "triage_component", "1") in ids
    }


def no_duplicate_rows(server: LangfuseStandIn) -> None:
    counts = Counter(row["id"] for row in server.score_rows(include_pending=True))
    assert [sid for sid, n in counts.items() if n > 1] == []


def test_200_thumbs_down_take_fewer_than_40_requests() -> None:
    traces = thumbs_down(200)
    with LangfuseStandIn(records=traces) as server:
        result = run(server)
        assert result.exit_code == 0, result.output
        assert scored(server, [t["traceId"] for t in traces]) == {t["traceId"] for t in traces}
        no_duplicate_rows(server)
        requests = len(server.log)
        assert requests < 40
        by_path = Counter(r.path for r in server.log)
        # scores: the marker, the votes, the signatures and their states (one read each)
        assert by_path["/api/public/v2/observations"] <= 4 and by_path["/api/public/scores"] <= 5
    match = re.search(r"backend requests (\d+) \(([\d.]+) per triaged trace\)", result.output)
    assert match and int(match.group(1)) == requests


def test_faults_end_scored_or_listed_and_a_rerun_completes(tmp_path: Path) -> None:
    traces = thumbs_down(200)
    trace_ids = [t["traceId"] for t in traces]
    report = tmp_path / "report.md"
    with LangfuseStandIn(records=traces, rate_limit_every=7, retry_after=0.1) as server:
        server.inject("status", status=500, count=2, path="/v2/observations")
        server.inject("status", status=503, path="/v3/scores")
        server.inject("slow", seconds=2.0, path="/v3/scores")  # beyond LANGFUSE_TIMEOUT=1
        server.inject("drop", path="/v3/scores")
        server.inject("status", status=413, path="/api/public/scores", method="POST")  # one batch refused
        server.schedule_restart(at_request=12, down_seconds=0.3)
        first = run(server, "--report-file", str(report), timeout="1")
        assert first.exit_code == 5, first.output  # some scores not written, and the run says so
        statuses = Counter(r.status for r in server.log)
        assert statuses[429] >= 1 and statuses[500] + statuses[503] >= 2 and statuses[0] >= 1
        done = scored(server, trace_ids)
        assert 0 < len(done) < 200
        listed = set(re.findall(r"trace `(t\d{3})`.*score NOT written", report.read_text()))
        assert listed == set(trace_ids) - done  # every vote: scored and confirmed, or listed
        no_duplicate_rows(server)

        second = run(server, timeout="1")
        assert second.exit_code == 0, second.output
        assert scored(server, trace_ids) == set(trace_ids)
        assert f"already triaged {len(done)}" in second.output
        no_duplicate_rows(server)


def test_session_vote_waits_for_its_turn_then_lands_on_the_right_trace() -> None:
    start = NOW - timedelta(hours=4)
    first_turn = trace_line("turn0", "What is katib?", "A tuning tool.", vote=None, at=start, session_id="s1")
    vote = {
        "id": "sv1",
        "name": "user_feedback",
        "dataType": "BOOLEAN",
        "value": 0,
        "comment": "the experiment answer was wrong",
        "sessionId": "s1",
        "metadata": {"turn": 1},
        "timestamp": iso(start + timedelta(minutes=2)),
    }
    with LangfuseStandIn(
        records=[first_turn, {"traceId": None, "observations": [], "scores": [vote]}]
    ) as server:
        early = run(server)
        assert early.exit_code == 0, early.output
        assert "pending" in early.output and scored(server, ["turn0"]) == set()
        later = trace_line(
            "turn1",
            "How do I configure a katib experiment trial?",
            "Use the trial template.",
            [
                (
                    "search_kubeflow_docs",
                    KATIB,
                    "A katib experiment configures each trial with a trial template.",
                )
            ],
            vote=None,
            at=start + timedelta(minutes=1),
            session_id="s1",
        )
        server.load([later])
        again = run(server)
        assert again.exit_code == 0, again.output
        assert scored(server, ["turn0", "turn1"]) == {"turn1"}


def test_a_legacy_server_is_read_through_the_old_trace_api() -> None:
    traces = thumbs_down(20)
    with LangfuseStandIn(records=traces, legacy=True) as server:
        result = run(server)
        assert result.exit_code == 0, result.output
        assert scored(server, [t["traceId"] for t in traces]) == {t["traceId"] for t in traces}
        assert len(server.requests("/v2/observations")) == 1
        assert len(server.requests("/api/public/traces/")) == 20


def test_refused_credentials_exit_3_without_the_secret() -> None:
    with LangfuseStandIn(records=thumbs_down(2)) as server:
        result = run(server, secret="sk-lf-not-the-right-one")
    assert result.exit_code == 3
    assert "LANGFUSE_SECRET_KEY" in result.output and "sk-lf-not-the-right-one" not in result.output
