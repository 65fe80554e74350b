"""Builders for traces in the import format (one JSON object per trace), for tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def markdown_results(*passages: tuple[str, str]) -> str:
    return "\n---\n".join(
        f"### Result {i} (score: 0.{9 - i})\n**Source:** {url}\n\n{text}"
        for i, (url, text) in enumerate(passages, 1)
    )


def trace_line(
    trace_id: str,
    question: str,
    answer: str,
    searches: list[tuple[str, str, str]] | None = None,
    *,
    comment: str | None = "wrong",
    vote: float | None = 0,
    at: datetime | None = None,
    session_id: str | None = None,
    vote_id: str | None = None,
) -> dict[str, Any]:
    """A trace with a root observation and one TOOL observation per (tool, url, text) search."""
    start = at or NOW - timedelta(hours=2)
    observations: list[dict[str, Any]] = [
        {
            "id": f"{trace_id}-root",
            "traceId": trace_id,
            "type": "AGENT",
            "name": "docs-agent",
            "parentObservationId": None,
            "startTime": start.isoformat(),
            "sessionId": session_id,
            "input": json.dumps(question),
            "output": json.dumps(answer),
        }
    ]
    for n, (tool, url, text) in enumerate(searches or []):
        observations.append(
            {
                "id": f"{trace_id}-tool{n}",
                "traceId": trace_id,
                "type": "TOOL",
                "name": tool,
                "parentObservationId": f"{trace_id}-root",
                "startTime": (start + timedelta(seconds=n + 1)).isoformat(),
                "sessionId": session_id,
                "input": json.dumps({"query": question}),
                "output": json.dumps(markdown_results((url, text))),
            }
        )
    scores = []
    if vote is not None:
        scores.append(
            {
                "id": vote_id or f"vote-{trace_id}",
                "name": "user_feedback",
                "dataType": "BOOLEAN",
                "value": vote,
                "comment": comment,
                "traceId": trace_id,
                "timestamp": (start + timedelta(minutes=1)).isoformat(),
            }
        )
    return {"traceId": trace_id, "observations": observations, "scores": scores}


def session_vote(
    vote_id: str, session_id: str, turn: int, at: datetime, comment: str = "bad"
) -> dict[str, Any]:
    return {
        "traceId": None,
        "observations": [],
        "scores": [
            {
                "id": vote_id,
                "name": "user_feedback",
                "dataType": "BOOLEAN",
                "value": 0,
                "comment": comment,
                "sessionId": session_id,
                "metadata": {"turn": turn},
                "timestamp": at.isoformat(),
            }
        ],
    }


def lines(*rows: dict[str, Any]) -> list[str]:
    return [json.dumps(r) for r in rows]


KATIB_URL = "https://www.kubeflow.org/docs/components/katib/experiment/"


def katib_traces(prefix: str, n: int, at: datetime) -> list[dict[str, Any]]:
    """`n` thumbs-down katib traces, answered from their one retrieved passage, `at` minus i minutes:
    a small night on a Langfuse stand-in."""
    return [
        trace_line(
            f"{prefix}{i}",
            f"How do I configure a katib experiment trial {i}?",
            "Use the trial template in the experiment spec.",
            [
                (
                    "search_kubeflow_docs",
                    KATIB_URL,
                    "A katib experiment configures each trial with a trial template.",
                )
            ],
            at=at - timedelta(minutes=i),
        )
        for i in range(n)
    ]
