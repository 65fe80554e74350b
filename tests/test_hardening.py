"""Regression tests for the hardening probe (issue 12): one bad trace never harms the others, no
secret is ever printed, bad input gets a clear error. Each test reproduces one finding."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import trace_line
from triage.cli import cli
from triage.reading.trace import parse_raw

NOW = datetime.now(UTC)
KATIB = "https://www.kubeflow.org/docs/components/katib/experiment/"
DEEP = "[" * 1000 + "1" + "]" * 1000  # 2 KB of JSON that a recursive decoder cannot read


def _invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def _deep_night() -> list[dict[str, Any]]:
    """Two searched thumbs-down traces; the first one's tool output is pathologically nested JSON."""
    at = NOW - timedelta(hours=2)
    deep = trace_line(
        "deep",
        "How do I set maxTrialCount?",
        "Set maxTrialCount.",
        [("search_kubeflow_docs", KATIB, "x")],
        at=at,
    )
    deep["observations"][1]["output"] = DEEP  # the raw JSON text, as the v2 API sends input/output
    fine = trace_line(
        "fine",
        "How do I configure a katib experiment trial?",
        "Use the trial template in the experiment spec.",
        [("search_kubeflow_docs", KATIB, "A katib experiment configures each trial with a trial template.")],
        at=at,
    )
    return [deep, fine]


def test_deeply_nested_json_is_read_as_text() -> None:
    assert parse_raw(DEEP) == DEEP
    shallow = "[" * 10 + "1" + "]" * 10
    assert parse_raw(shallow) != shallow  # ordinary nesting still decodes


def test_a_deeply_nested_tool_output_does_not_abort_the_night(tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join(json.dumps(t) for t in _deep_night()) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    result = _invoke(["feedback", "--write", "--report"])
    assert result.exit_code in (0, 4), result.output
    assert "2 thumbs-down: 2 triaged" in result.stdout


@pytest.mark.slow
def test_a_deeply_nested_tool_output_through_langfuse() -> None:
    with LangfuseStandIn(records=_deep_night()) as server:
        env = {
            "LANGFUSE_PUBLIC_KEY": server.public_key,
            "LANGFUSE_SECRET_KEY": server.secret_key,
            "LANGFUSE_BASE_URL": server.url,
        }
        result = _invoke(["feedback", "--write", "--report", "--judge", "heuristic"], env)
    assert result.exit_code in (0, 4), result.output
    assert "2 thumbs-down: 2 triaged" in result.stdout


def test_import_of_a_line_too_deep_to_read_names_the_line(tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    too_deep = '{"traceId": "t", "observations": ' + "[" * 100_000 + "]" * 100_000 + "}"
    export.write_text(json.dumps(_deep_night()[1]) + "\n" + too_deep + "\n")
    result = _invoke(["import", str(export)])
    assert result.exit_code == 1
    assert "line 2" in result.output and "nested too deeply" in result.output
