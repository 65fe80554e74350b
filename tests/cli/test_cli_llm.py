"""`triage feedback` through the real openai client against a local OpenAI-compatible server."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.doubles.clock import VirtualClock
from tests.doubles.openai_server import OpenAIServer, keyword_responder
from triage.app import DEMO_DIR, demo_shift
from triage.cli import cli
from triage.settings import load_config
from triage.sources.store import Store

SECRET = "sk-test-0123456789abcdef"
#: the report's count line (how sure the verdicts are may follow the count of triaged ones)
ALL_TRIAGED = re.compile(r"29 thumbs-down: 29 triaged( \([^)]*\))?, 0 not triaged")


@pytest.fixture
def demo_store(tmp_path: Path) -> Path:
    path = tmp_path / "store.sqlite"
    traces = DEMO_DIR / "traces.jsonl"
    with Store(path) as store:
        store.import_file(traces, shift=demo_shift(traces, datetime.now(UTC)))
    return path


@pytest.mark.parametrize("judge", ["llm", "cascade"])
def test_feedback_with_a_model_judge_end_to_end(demo_store: Path, judge: str) -> None:
    with OpenAIServer(responder=keyword_responder) as server:
        env = {
            "TRIAGE_STORE": str(demo_store),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": SECRET,
            "TRIAGE_JUDGE_MODEL": "judge-model-1",
        }
        result = CliRunner().invoke(
            cli, ["feedback", "--report", "--write", "--judge", judge], env=env, catch_exceptions=False
        )
        calls = server.calls
        auth = {r.headers.get("authorization") for r in server.requests}
    assert result.exit_code == 0, result.stderr
    assert calls > 0
    assert auth == {f"Bearer {SECRET}"}
    out, err = result.stdout, result.stderr
    assert ALL_TRIAGED.search(out)
    assert f"judge {judge}" in err and f"{calls} calls" in err
    assert SECRET not in out and SECRET not in err
    with Store(demo_store) as store:
        rows = store.scores_named("triage_layer")
    assert len(rows) == 29
    # the judge that produced the facts is stored with every score: the model for traces that
    # searched, the heuristic for those that did not (no model is asked about them)
    judges = {r["stringValue"]: set() for r in rows}
    for r in rows:
        judges[r["stringValue"]].add(json.loads(r["metadata"])["judge"])
    assert judges.pop("agent_skipped_retrieval") == {"heuristic"}
    assert all(len(names) == 1 and "judge-model-1" in next(iter(names)) for names in judges.values())
    # a rerun of the same window makes no model call
    with OpenAIServer(responder=keyword_responder) as server:
        env["OPENAI_BASE_URL"] = f"{server.url}/v1"
        again = CliRunner().invoke(
            cli, ["feedback", "--write", "--judge", judge], env=env, catch_exceptions=False
        )
        assert again.exit_code == 0 and server.calls == 0


def test_judge_down_degrades_the_run(demo_store: Path, virtual_time: VirtualClock) -> None:
    env = {
        "TRIAGE_STORE": str(demo_store),
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # nothing listens on the discard port
        "OPENAI_API_KEY": SECRET,
        "TRIAGE_JUDGE_MODEL": "judge-model-1",
    }
    result = CliRunner().invoke(
        cli, ["feedback", "--report", "--judge", "llm"], env=env, catch_exceptions=False
    )
    assert result.exit_code == 4
    # traces with no search call need no model: they are still triaged
    assert "### agent_skipped_retrieval (4)" in result.stdout
    assert "judge unavailable" in result.stdout
    assert virtual_time.sleeps  # the judge retried, with its back-off, before giving up


def test_a_component_outside_the_catalogue_leaves_every_layer_decided(demo_store: Path) -> None:
    """A model that names a component the catalogue lacks: no reply is rejected, every trace is
    triaged, and the component comes from the sources, keywords or the default instead."""

    def unknown_component(body: dict[str, Any]) -> dict[str, Any]:
        reply = keyword_responder(body)
        if "component" in reply:
            reply["component"] = {"reasoning": "scripted", "name": "not-a-component"}
        return reply

    with OpenAIServer(responder=unknown_component) as server:
        env = {
            "TRIAGE_STORE": str(demo_store),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": SECRET,
            "TRIAGE_JUDGE_MODEL": "judge-model-1",
        }
        result = CliRunner().invoke(
            cli, ["feedback", "--report", "--write", "--judge", "llm"], env=env, catch_exceptions=False
        )
        containment_calls = len(server.of_kind("containment"))
    assert result.exit_code == 0, result.stderr
    assert ALL_TRIAGED.search(result.stdout)
    with Store(demo_store) as store:
        components = store.scores_named("triage_component")
    decided_by = {json.loads(r["metadata"])["component_from"] for r in components}
    assert len(components) == 29 and "judge" not in decided_by
    assert {r["stringValue"] for r in components} <= set(load_config().components)
    # one containment call per searched trace: none was retried for the component
    searched = sum(json.loads(r["metadata"])["judge"] != "heuristic" for r in components)
    assert containment_calls == searched


def test_the_summary_reports_cached_prompt_tokens_and_their_price(demo_store: Path, tmp_path: Path) -> None:
    """A server with prompt caching (the stand-in counts as OpenAI does): the calls after the first
    of each kind find the shared prefix cached, and the summary says how much, and what it costs."""
    summary_file = tmp_path / "summary.json"
    with OpenAIServer(responder=keyword_responder, estimate_tokens=True, prompt_cache=True) as server:
        env = {
            "TRIAGE_STORE": str(demo_store),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": SECRET,
            "TRIAGE_JUDGE_MODEL": "gpt-4o-mini",
        }
        result = CliRunner().invoke(
            cli,
            [
                "feedback",
                "--write",
                "--judge",
                "llm",
                "--concurrency",
                "1",
                "--summary-file",
                str(summary_file),
            ],
            env=env,
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.stderr
    summary = json.loads(summary_file.read_text())
    cached, total = summary["cached_input_tokens"], summary["input_tokens"]
    # 50 calls, two kinds: all but the first of each find their kind's prefix (1,024+ tokens) cached
    assert cached >= 48 * 1024 and cached < total
    assert summary["batch_calls"] == 0
    # gpt-4o-mini's cached input costs half its input price: the bill is below the direct estimate
    saved = cached * 0.15 / 2 / 1e6
    assert summary["cost_usd_billed"] == pytest.approx(summary["cost_usd"] - saved, abs=2e-6)
    assert f"{cached} of {total} input tokens cached ({cached / total:.0%})" in result.stderr
