"""`triage check`: the agent on its regression cases, through real HTTP (an OpenAI-compatible chat
endpoint and a custom JSON API, `tests/doubles/agent_server.py`), a local command, and the demo;
results in the embedded store and in Langfuse (the stand-in validating every dataset-run exchange
against ../shared/langfuse/openapi.yml); a rerun under the same run name adds no run item; exit 7
on a case that passed before and fails now, and under --min-pass.

The cases' expectations here are mostly `must_cite` and `tool_behavior`, which the check judges
decide in code, so the outcomes below do not move when the judges' text rules are tuned.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.doubles.agent_server import AgentStandIn, Reply
from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import trace_line
from tests.sources.test_langfuse import backend_for
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.check import CheckOptions, default_run_name, run_check
from triage.cli import cli
from triage.domain.checks import (
    CHECK_SCORE,
    AgentRun,
    CaseReport,
    CaseResult,
    CheckCase,
    CheckResult,
    ExpectationCheck,
    Outcome,
    ToolUse,
    check_score_id,
    placeholder_trace_id,
    status_of,
)
from triage.domain.config import AgentEndpointConfig
from triage.domain.records import Usage
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode, JudgeError
from triage.settings import load_config
from triage.sinks.report import render_check
from triage.sources.agents import pointer, read_reply, read_sources, shown_url, substitute, urls_in
from triage.sources.store import Store

DATASET = "triage-regressions"
NOW = datetime.now(UTC).replace(microsecond=0)
TOOLS = load_config().tools
PAGE = "https://www.kubeflow.org/docs/components/"


def url(name: str) -> str:
    return f"{PAGE}{name}/"


def item(
    item_id: str,
    question: str,
    *,
    cite: str | None = None,
    tool: str | None = None,
    layer: str = "retrieval",
    owners: tuple[str, ...] = ("kubeflow/docs-agent",),
    signature: str | None = None,
    status: str = "ACTIVE",
    dataset: str = DATASET,
    **expected: Any,
) -> DatasetItem:
    if cite:
        expected["must_cite"] = [cite]
    # the runner's tests check the page alone, said explicitly; what a layer implies
    # (`Expected.derived`) is the judges' subject (tests/judges/test_expectations.py)
    expected.setdefault("answers", False)
    expected.setdefault("rests_on", False)
    if tool:
        expected["tool_behavior"] = tool
    return DatasetItem.model_validate(
        {
            "id": item_id,
            "dataset_name": dataset,
            "input": {"question": question, "session_id": None},
            "expected_output": {"expectation": "a test case", **expected},
            "metadata": {"layer": layer, "owners": list(owners), "signature": signature or f"sig-{item_id}"},
            "source_trace_id": f"prod-{item_id}",
            "status": status,
        }
    )


def fill(path: Path, items: list[DatasetItem], dataset: str = DATASET) -> None:
    with Store(path) as store:
        store.ensure_dataset(dataset, "regression cases", {})
        assert store.upsert_dataset_items(items).failed == {}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["check", *args], env=env, catch_exceptions=False, prog_name="triage")


def results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["result"]["case"]["item_id"]: c["status"] for c in data["cases"]}


def write_config(path: Path, agent: str, **check: Any) -> Path:
    lines = [agent.strip(), "", "[check]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in {"trace_wait_seconds": 0, **check}.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def openai_config(path: Path, agent: AgentStandIn, **check: Any) -> Path:
    agent_table = f'[agent_endpoint]\nkind = "openai"\nurl = "{agent.url}/v1"\nmodel = "docs-agent"'
    return write_config(path, agent_table, **check)


def http_config(path: Path, agent: AgentStandIn, **check: Any) -> Path:
    return write_config(
        path,
        f"""
[agent_endpoint]
kind = "http"
url = "{agent.url}/ask"
request = {{ input = {{ question = "{{question}}" }}, stream = false }}
answer_path = "/result/answer"
sources_path = "/result/citations"
trace_id_path = "/trace/id"
tool_calls_path = "/steps"
""",
        **check,
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite"  # TRIAGE_STORE (conftest)


@pytest.fixture
def quick(virtual_time: VirtualClock) -> Iterator[VirtualClock]:
    """Retry back-offs in virtual time (the case's own time-out stays real)."""
    yield virtual_time


# -- the OpenAI-compatible agent: right, wrong and failing answers, through real HTTP --------------

QUESTIONS = {
    "right": "How do I pass an artifact between components?",
    "wrong": "How do I make the metrics collector read a file?",
    "down": "Why is the notebook stuck?",
    "flaky": "How do I add a contributor to my profile?",
    "limited": "How do I turn off caching?",
    "slow": "How do I compile a pipeline?",
    "garbage": "Which kustomize version do I need?",
}


def openai_cases() -> list[DatasetItem]:
    return [item(f"c-{key}", question, cite=url(key)) for key, question in QUESTIONS.items()]


def openai_script() -> dict[str, Reply]:
    right = {k: Reply(text=f"See the guide: {url(k)}.") for k in ("right", "flaky", "limited")}
    return {
        QUESTIONS["right"]: right["right"],
        QUESTIONS["wrong"]: Reply(text=f"Use stdout. Source: {url('somewhere-else')}"),
        QUESTIONS["down"]: Reply(status=500),
        QUESTIONS["flaky"]: Reply(text=right["flaky"].text, status=503, fail_first=1),
        QUESTIONS["limited"]: Reply(text=right["limited"].text, status=429, fail_first=1, headers={"Retry-After": "7"}),
        QUESTIONS["slow"]: Reply(text=f"{url('slow')}", delay=3.0),
        QUESTIONS["garbage"]: Reply(raw=b"<html>Bad gateway</html>"),
    }


@pytest.mark.slow
def test_an_openai_agent_answering_right_wrong_and_failing(tmp_path: Path, store: Path, quick: VirtualClock) -> None:
    fill(store, openai_cases())
    with AgentStandIn(openai_script()) as agent:
        config = openai_config(tmp_path / "triage.toml", agent)
        out = tmp_path / "out.json"
        run = invoke("--config", str(config), "--judge", "offline", "--timeout", "1", "--output", str(out))
        assert run.exit_code == ExitCode.UNCHECKED, run.output  # 3 of 7 cases unchecked: over [check] max_unchecked
        data = results(out)
        assert statuses(data) == {
            "c-right": "fixed",
            "c-wrong": "still_failing",
            "c-down": "error",
            "c-flaky": "fixed",  # a 503, then the answer: tried again
            "c-limited": "fixed",  # a 429: its Retry-After honoured (in virtual time), then the answer
            "c-slow": "error",
            "c-garbage": "error",
        }
        errors = {c["result"]["case"]["item_id"]: c["result"]["run"]["error"] for c in data["cases"]}
        assert errors["c-down"].startswith("HTTP 500")
        assert errors["c-slow"] == "no answer within 1 s"
        assert "not JSON" in errors["c-garbage"] and "Bad gateway" in errors["c-garbage"]
        assert agent.asked(QUESTIONS["down"]) == 3  # [check] attempts
        assert agent.asked(QUESTIONS["flaky"]) == 2
        assert agent.asked(QUESTIONS["garbage"]) == 1  # a reply that cannot be read is not asked again
        assert 7.0 in quick.sleeps  # the 429's Retry-After
        first = agent.requests[0].body
        assert first["model"] == "docs-agent" and first["messages"][-1]["role"] == "user"
    assert data["passed"] == 3 and data["counts"]["error"] == 3
    report = run.stdout
    assert report.startswith(f"# Check of `{DATASET}`")
    assert "## Agent errors (3)" in report and "## Still failing (1)" in report and "## Fixed (3)" in report
    # the results are a run of the embedded store: answered cases only (an agent error is not written)
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT datasetItemId, outcome FROM dataset_run_items ORDER BY 1").fetchall()
        runs = db.execute("SELECT name, metadata FROM dataset_runs").fetchall()
    assert rows == [("c-flaky", "pass"), ("c-limited", "pass"), ("c-right", "pass"), ("c-wrong", "fail")]
    assert runs[0][0] == data["run_name"] and json.loads(runs[0][1])["created_by"] == "triage check"


# -- a rerun, the previous run, the gates -----------------------------------------------------------


@pytest.mark.slow
def test_a_rerun_adds_no_run_item_and_asks_only_the_errors_again(
    tmp_path: Path, store: Path, quick: VirtualClock
) -> None:
    fill(store, openai_cases())
    with AgentStandIn(openai_script()) as agent:
        config = str(openai_config(tmp_path / "triage.toml", agent))
        first = invoke("--config", config, "--judge", "offline", "--timeout", "1", "--run-name", "nightly-1")
        assert first.exit_code == ExitCode.UNCHECKED, first.output
        asked = len(agent.requests)
        out = tmp_path / "again.json"
        again = invoke(
            "--config", config, "--judge", "offline", "--timeout", "1", "--run-name", "nightly-1", "--output", str(out)
        )
        assert again.exit_code == ExitCode.UNCHECKED, again.output  # the three errors again
        # only the three agent errors are asked again (three tries each for the 500, one for the
        # others; the slow one once more); the four answered cases keep their results
        new = agent.requests[asked:]
        assert {r.question for r in new} == {QUESTIONS[k] for k in ("down", "slow", "garbage")}
    data = results(out)
    kept = {c["result"]["case"]["item_id"] for c in data["cases"] if c["kept"]}
    assert kept == {"c-right", "c-wrong", "c-flaky", "c-limited"}
    assert statuses(data)["c-right"] == "fixed" and data["previous_run"] is None
    with sqlite3.connect(store) as db:
        count = db.execute("SELECT count(*), count(DISTINCT datasetItemId) FROM dataset_run_items").fetchone()
        runs = db.execute("SELECT count(*) FROM dataset_runs").fetchone()
    assert count == (4, 4) and runs == (1,)


@pytest.mark.slow
def test_a_case_that_passed_in_the_previous_run_and_fails_now_exits_7(tmp_path: Path, store: Path) -> None:
    fill(store, [item("c-a", "Question A?", cite=url("a")), item("c-b", "Question B?", cite=url("b"))])
    script = {"Question A?": Reply(text=f"See {url('a')}"), "Question B?": Reply(text=f"See {url('x')}")}
    with AgentStandIn(script) as agent:
        config = str(openai_config(tmp_path / "triage.toml", agent))
        assert invoke("--config", config, "--judge", "offline", "--run-name", "r1").exit_code == 0
        script["Question A?"].text = f"See {url('elsewhere')}"  # the release broke A
        script["Question B?"].text = f"See {url('b')}"  # and fixed B
        out = tmp_path / "r2.json"
        second = invoke("--config", config, "--judge", "offline", "--run-name", "r2", "--output", str(out))
    assert second.exit_code == ExitCode.REGRESSED
    data = results(out)
    assert data["previous_run"] == "r1"
    assert statuses(data) == {"c-a": "newly_failing", "c-b": "fixed"}
    assert {c["result"]["case"]["item_id"]: c["previous"] for c in data["cases"]} == {"c-a": "pass", "c-b": "fail"}
    assert "**1 case passed in the previous run and fails now.**" in second.stdout
    assert results(out)["regressed"] == ["c-a"]
    assert "## Newly failing (1)" in second.stdout


@pytest.mark.slow
def test_a_pass_rate_under_min_pass_exits_7(tmp_path: Path, store: Path) -> None:
    fill(store, [item("c-a", "Question A?", cite=url("a")), item("c-b", "Question B?", cite=url("b"))])
    script = {"Question A?": Reply(text=f"See {url('a')}"), "Question B?": Reply(text=f"See {url('x')}")}
    with AgentStandIn(script) as agent:
        config = str(openai_config(tmp_path / "triage.toml", agent))
        gated = invoke("--config", config, "--judge", "offline", "--min-pass", "0.75")
        assert gated.exit_code == ExitCode.REGRESSED  # 1 of 2 passes: 50% < 75%
        assert "**failed**" in gated.stdout
        assert invoke("--config", config, "--judge", "offline", "--min-pass", "0.5").exit_code == 0
        # the gate in the configuration, the option over it
        config_gated = str(openai_config(tmp_path / "gated.toml", agent, min_pass=0.9))
        assert invoke("--config", config_gated, "--judge", "offline").exit_code == ExitCode.REGRESSED
        assert invoke("--config", config_gated, "--judge", "offline", "--min-pass", "0.5").exit_code == 0


# -- a custom JSON API ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_custom_json_api_gets_the_question_as_one_json_value(tmp_path: Path, store: Path) -> None:
    tricky = 'Does "{question}" \\ {"x": 1} break\nthe template? </s>'
    fill(
        store,
        [
            item("c-tricky", tricky, cite=url("tricky")),
            item("c-routed", "Why does my TrainJob crash?", tool="call search_github_issues (the issues collection)"),
            item("c-misrouted", "Why does my notebook hang?", tool="call search_github_issues (the issues collection)"),
        ],
    )
    script = {
        tricky: Reply(text="Yes.", sources=[url("tricky")], trace_id="t-1"),
        "Why does my TrainJob crash?": Reply(
            text="See the issue.",
            tool_calls=[{"tool": "search_github_issues", "args": {"query": "trainjob crash"}}],
        ),
        "Why does my notebook hang?": Reply(
            text="See the docs.", tool_calls=[{"name": "search_kubeflow_docs", "arguments": '{"query": "hang"}'}]
        ),
    }
    with AgentStandIn(script) as agent:
        config = str(http_config(tmp_path / "triage.toml", agent))
        out = tmp_path / "out.json"
        run = invoke("--config", config, "--judge", "offline", "--output", str(out))
        assert run.exit_code == 0, run.output
        bodies = {r.question: r.body for r in agent.requests}
    assert bodies[tricky] == {"input": {"question": tricky}, "stream": False}
    data = results(out)
    assert statuses(data) == {"c-tricky": "fixed", "c-routed": "fixed", "c-misrouted": "still_failing"}
    runs = {c["result"]["case"]["item_id"]: c["result"]["run"] for c in data["cases"]}
    assert runs["c-tricky"]["trace_id"] == "t-1" and runs["c-tricky"]["sources"] == [url("tricky")]
    assert runs["c-routed"]["tool_calls"] == [
        {"name": "search_github_issues", "collection": "issues", "args": {"query": "trainjob crash"}}
    ]
    with sqlite3.connect(store) as db:
        traces = dict(db.execute("SELECT datasetItemId, traceId FROM dataset_run_items").fetchall())
    assert traces["c-tricky"] == "t-1"  # the agent's trace; the others a placeholder derived from the run
    assert len({traces["c-routed"], traces["c-misrouted"]}) == 2


def test_reading_replies() -> None:
    reply = {"a": [{"b/c": {"~d": "x"}}], "n": None}
    assert pointer(reply, "/a/0/b~1c/~0d") == "x"
    assert pointer(reply, "/a/1") is not reply and pointer(reply, "/a/1") is pointer(reply, "/zzz")
    assert substitute({"q": "{question}", "k": ["pre {question}", 3]}, 'a "b"') == {
        "q": 'a "b"',
        "k": ['pre a "b"', 3],
    }
    assert urls_in("See https://a.org/x. And (https://b.org/y), https://a.org/x") == [
        "https://a.org/x",
        "https://b.org/y",
    ]
    assert read_sources([{"url": "u1"}, "u2", {"source": "u3"}, {"title": "none"}, 4]) == ["u1", "u2", "u3"]
    endpoint = AgentEndpointConfig(kind="http", url="http://x/ask")
    run = read_reply({"answer": "Docs at https://d.org/p.", "trace_id": 12}, endpoint, TOOLS)
    assert (run.sources, run.trace_id, run.tool_calls) == (["https://d.org/p"], "12", None)
    with pytest.raises(Exception, match="no answer at /answer"):
        read_reply({"text": "hi"}, endpoint, TOOLS)


def test_a_bad_agent_configuration_is_exit_3(tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", '[agent_endpoint]\nkind = "http"')
    run = CliRunner().invoke(cli, ["check", "--config", str(config)], prog_name="triage")
    assert run.exit_code == ExitCode.CONFIG and "needs a url" in run.output
    both = CliRunner().invoke(cli, ["check", "--agent-url", "http://x", "--agent-command", "x"], prog_name="triage")
    assert both.exit_code == ExitCode.USAGE


# -- a local command --------------------------------------------------------------------------------

AGENT_SCRIPT = """
import json, sys
question = sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()
if "boom" in question:
    print("the model is down", file=sys.stderr)
    sys.exit(3)
if sys.argv[1] == "json":
    calls = [{"name": "search_kubeflow_docs"}]
    print(json.dumps({"answer": "See the page.", "sources": [{"url": "%s"}], "tool_calls": calls}))
else:
    print("It is in %s." if "cache" in question else "I do not know.")
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["json", "text"])
def test_a_local_command_agent(tmp_path: Path, store: Path, quick: VirtualClock, mode: str) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT % (url("cache"), url("cache")), encoding="utf-8")
    fill(store, [item("c-cache", "How do I cache?", cite=url("cache")), item("c-boom", "boom?", cite=url("x"))])
    if mode == "json":  # the question on standard input, a JSON reply
        agent = f'command = ["{sys.executable}", "{script}", "json"]\noutput = "json"'
    else:  # the question as an argument, the text of standard output the answer
        agent = f'command = ["{sys.executable}", "{script}", "text", "{{question}}"]\ninput = "argument"'
    config = write_config(
        tmp_path / "triage.toml", f'[agent_endpoint]\nkind = "command"\n{agent}', attempts=2, max_unchecked=0.5
    )
    out = tmp_path / "out.json"
    run = invoke("--config", str(config), "--judge", "offline", "--output", str(out))
    assert run.exit_code == 0, run.output
    data = results(out)
    assert statuses(data) == {"c-cache": "fixed", "c-boom": "error"}
    boom = next(c for c in data["cases"] if c["result"]["case"]["item_id"] == "c-boom")
    assert boom["result"]["run"]["error"] == "the command exited with 3: the model is down"
    assert data["agent"] == "command:" + sys.executable


@pytest.mark.slow
def test_agent_command_option(tmp_path: Path, store: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT % (url("cache"), url("cache")), encoding="utf-8")
    fill(store, [item("c-cache", "How do I cache?", cite=url("cache"))])
    run = invoke("--agent-command", f"{sys.executable} {script} text", "--judge", "offline")
    assert run.exit_code == 0, run.output
    assert "1 of 1 cases pass" in run.stdout


@pytest.mark.slow
def test_release_records_each_signature_whose_cases_all_pass_as_fixed_in_it(tmp_path: Path, store: Path) -> None:
    from triage.domain.tracker import latest_states

    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT % (url("cache"), url("cache")), encoding="utf-8")
    fill(
        store,
        [
            item("c-cache", "How do I cache?", cite=url("cache"), signature="sig-cache"),
            item("c-cache-2", "How do I cache steps?", cite=url("cache"), signature="sig-cache"),
            item("c-other", "How do I scale?", cite=url("scale"), signature="sig-scale"),
        ],
    )
    out = tmp_path / "out.json"
    command = f"{sys.executable} {script} text"
    run = invoke(
        "--agent-command", command, "--judge", "offline", "--max-unchecked", "1", "--release", "2026.12.1",
        "--output", str(out),
    )  # fmt: skip
    assert run.exit_code == 0, run.output
    data = results(out)
    # every case of sig-cache passes; sig-scale's is not a pass (it cites the cache page)
    assert data["release"] == "2026.12.1" and data["fixed"] == ["sig-cache"]
    assert "Release `2026.12.1`: 1 failure signature fixed in it" in run.stdout
    with Store(store) as db:
        rows = db.scores([load_config().scores.signature_state], NOW - timedelta(days=1), NOW + timedelta(days=1))
    states, bad = latest_states(rows)
    assert bad == [] and set(states) == {"sig-cache"}
    assert states["sig-cache"].fixed_in == "2026.12.1" and states["sig-cache"].is_fixed
    assert states["sig-cache"].fixed_by == data["run_name"]


# -- bad items, an empty dataset ------------------------------------------------------------------


@pytest.mark.slow
def test_bad_items_are_listed_never_a_crash(tmp_path: Path, store: Path) -> None:
    good = item("c-good", "Question A?", cite=url("a"))
    no_question = item("c-empty", "x", cite=url("a")).model_copy(update={"input": {"question": "  "}})
    nothing = item("c-nothing", "Question C?").model_copy(update={"expected_output": {"expectation": "?"}})
    archived = item("c-archived", "Question D?", cite=url("a"))
    fill(store, [good, no_question, nothing, archived])
    with sqlite3.connect(store) as db:
        db.execute("UPDATE dataset_items SET status = 'ARCHIVED' WHERE id = 'c-archived'")
    with AgentStandIn({"Question A?": Reply(text=f"See {url('a')}")}) as agent:
        out = tmp_path / "out.json"
        run = invoke("--agent-url", agent.url + "/v1", "--judge", "offline", "--output", str(out))
    assert run.exit_code == 0, run.output
    data = results(out)
    assert statuses(data) == {"c-good": "fixed"}
    assert {b["item_id"]: b["reason"] for b in data["bad_items"]} == {
        "c-empty": "item c-empty: its input holds no question",
        "c-nothing": "item c-nothing: its expected output states nothing to check",
    }
    assert "## Items that are no case (2)" in run.stdout


def test_a_dataset_with_no_cases_is_an_input_error(store: Path) -> None:
    fill(store, [])
    run = CliRunner().invoke(cli, ["check", "--agent-url", "http://127.0.0.1:9/v1"], prog_name="triage")
    assert run.exit_code == ExitCode.ERROR and "holds no active cases" in run.output


# -- the runner with fakes: the judge's failures, statuses ----------------------------------------


class FakeJudge:
    """Decides `must_cite` by the sources; raises for a question with "judge-down"; says nothing
    about a question with "silent"."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    @property
    def usage(self) -> Usage:
        return Usage(calls=self.calls)

    async def aclose(self) -> None:
        return None

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
        self.calls += 1
        if "judge-down" in case.question:
            raise JudgeError("the model server is down")
        if "silent" in case.question:
            return []
        cited = any(u in run.sources for u in case.expected.must_cite)
        return [ExpectationCheck(name="must_cite", passed=cited, evidence=f"sources {run.sources}")]


class FakeAgent:
    name = "fake-agent"

    def __init__(self, answers: dict[str, AgentRun | Exception]) -> None:
        self.answers = answers

    async def aclose(self) -> None:
        return None

    async def ask(self, question: str) -> AgentRun:
        answer = self.answers[question]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_runner_never_passes_what_the_judge_did_not_decide() -> None:
    items = {
        i.id: i
        for i in [
            item("a", "cites?", cite=url("a")),
            item("b", "judge-down?", cite=url("a")),
            item("c", "silent?", cite=url("a")),
            item("d", "crash?", cite=url("a")),
        ]
    }
    agent = FakeAgent(
        {
            "cites?": AgentRun(answer="yes", sources=[url("a")]),
            "judge-down?": AgentRun(answer="yes", sources=[url("a")]),
            "silent?": AgentRun(answer="yes", sources=[url("a")]),
            "crash?": RuntimeError("adapter bug"),
        }
    )
    with Store(":memory:") as db:
        db.ensure_dataset(DATASET, "", {})
        db.upsert_dataset_items(list(items.values()))
        options = CheckOptions(dataset=DATASET, run_name="r", now=NOW)
        result = asyncio.run(run_check(items, agent=agent, judge=FakeJudge(), runs=db, options=options, tools=TOOLS))
        stored = db.dataset_run_results(db.dataset_runs(DATASET)[0])
    by_id = {c.result.case.item_id: c.result for c in result.cases}
    assert {k: r.outcome for k, r in by_id.items()} == {"a": "pass", "b": "undecided", "c": "undecided", "d": "error"}
    assert by_id["b"].checks[0].evidence == "the judge could not decide: the model server is down"
    assert by_id["c"].checks[0].evidence == "the judge gave no decision on it"
    assert by_id["d"].run.error == "RuntimeError: adapter bug"
    assert set(stored) == {"a", "b", "c"} and stored["a"].outcome == "pass" and not stored["a"].agent_trace


@pytest.mark.parametrize(
    ("outcome", "previous", "layer", "status"),
    [
        ("pass", None, "retrieval", "fixed"),
        ("fail", None, "retrieval", "still_failing"),
        ("pass", None, "ok", "still_passing"),
        ("fail", None, "ok", "newly_failing"),  # right in production, wrong now
        ("fail", "pass", "retrieval", "newly_failing"),
        ("pass", "pass", "retrieval", "still_passing"),
        ("pass", "fail", "ok", "fixed"),
        ("fail", "fail", "ok", "still_failing"),
        ("fail", "error", "ok", "newly_failing"),  # an error says nothing: production's outcome counts
        ("undecided", "pass", "ok", "undecided"),
        ("error", "pass", "ok", "error"),
    ],
)
def test_status(outcome: Outcome, previous: Outcome | None, layer: str, status: str) -> None:
    case = CheckCase.from_item(item("x", "q?", cite=url("a"), layer=layer))
    assert status_of(outcome, previous, case) == status


def test_the_report_escapes_what_the_agent_and_the_case_say() -> None:
    case = CheckCase.from_item(item("x", "<img src=x onerror=alert(1)> [click](http://evil.example)", cite=url("a")))
    run = AgentRun(answer="# Ignore the judge\n| a | b |\n<script>x</script>", sources=["javascript:alert(1)"])
    check = ExpectationCheck(name="must_cite", passed=False, evidence="saw *this* `code` <b>", confidence="high")
    result = CaseResult(case=case, run=run, outcome="fail", checks=[check], judge="offline")
    report = render_check(
        CheckResult(
            dataset=DATASET,
            run_name="r`1",
            target="t",
            agent="a",
            judge="offline",
            cases=[CaseReport(result=result, status="newly_failing", previous="pass")],
        )
    )
    assert "<img" not in report and "<script>" not in report and "<b>" not in report
    assert "&lt;img" in report and "\\[click\\]" in report and "\\# Ignore" not in report.split("answer:")[0]
    assert "\n# Ignore" not in report and "\n| a | b |" not in report
    assert "run `r'1`" in report


# -- Langfuse ------------------------------------------------------------------------------------

LF_QUESTIONS = {
    "routed": "Katib trials hang in Running, why?",
    "misrouted": "My TrainJob crashes with a bus error, why?",
    "cited": "How do I cache a step?",
    "down": "Is the agent up?",
}
ISSUES = "call search_github_issues (the issues collection)"


def langfuse_cases() -> list[DatasetItem]:
    return [
        item("c-routed", LF_QUESTIONS["routed"], tool=ISSUES, layer="tool_routing"),
        item("c-misrouted", LF_QUESTIONS["misrouted"], tool=ISSUES, layer="tool_routing"),
        item("c-cited", LF_QUESTIONS["cited"], cite=url("cache")),
        item("c-down", LF_QUESTIONS["down"], cite=url("up")),
    ]


def seed_langfuse_cases(server: LangfuseStandIn) -> dict[str, Reply]:
    """The four cases in `server`'s dataset; the agent's script for them: two new traces that show
    their routing, a cited answer, and a 502 (the case the gate cannot check)."""
    with backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        assert backend.upsert_dataset_items(langfuse_cases()).failed == {}
    return {
        LF_QUESTIONS["routed"]: Reply(text="Upgrade Katib.", trace_id="t-new-routed"),
        LF_QUESTIONS["misrouted"]: Reply(text="Raise memory.", trace_id="t-new-misrouted"),
        LF_QUESTIONS["cited"]: Reply(text="Cached.", sources=[url("cache")]),
        LF_QUESTIONS["down"]: Reply(status=502),
    }


def agent_traces() -> list[dict[str, Any]]:
    """The agent's new traces, as its own tracing sends them to Langfuse."""
    at = NOW - timedelta(minutes=1)
    issue = ("search_github_issues", "https://github.com/kubeflow/katib/issues/2417", "Trials hang: fixed in 0.18.")
    docs = ("search_kubeflow_docs", url("trainer"), "TrainJob basics.")
    return [
        trace_line("t-new-routed", LF_QUESTIONS["routed"], "Upgrade Katib.", [issue], vote=None, at=at),
        trace_line("t-new-misrouted", LF_QUESTIONS["misrouted"], "Raise memory.", [docs], vote=None, at=at),
    ]


@pytest.mark.slow
def test_langfuse_dataset_runs_once_and_every_exchange_matches_the_spec(
    tmp_path: Path,
    quick: VirtualClock,
    openapi: Any,  # noqa: F811
) -> None:
    with LangfuseStandIn(records=agent_traces()) as server:
        script = seed_langfuse_cases(server)
        server.reset_log()
        with AgentStandIn(script) as agent:
            config = str(http_config(tmp_path / "triage.toml", agent, attempts=1, max_unchecked=0.5))
            env = {**server.env, "TRIAGE_CONFIRM_WAIT_SECONDS": "5"}
            out = tmp_path / "r1.json"
            first = invoke("--config", config, "--judge", "offline", "--run-name", "r1", "--output", str(out), env=env)
            assert first.exit_code == 0, first.output
            data = results(out)
            assert statuses(data) == {
                "c-routed": "fixed",  # its new trace shows the issues search
                "c-misrouted": "still_failing",  # its new trace shows the docs search only
                "c-cited": "fixed",
                "c-down": "error",
            }
            routed = next(c for c in data["cases"] if c["result"]["case"]["item_id"] == "c-routed")
            assert routed["result"]["run"]["tool_calls"][0]["name"] == "search_github_issues"
            assert routed["result"]["run"]["retrieved"][0]["source_url"].endswith("/issues/2417")
            items = server.run_items_of(DATASET, "r1")
            links = {i["datasetItemId"]: i["traceId"] for i in items}
            assert links == {
                "c-routed": "t-new-routed",  # the agent's new traces
                "c-misrouted": "t-new-misrouted",
                "c-cited": placeholder_trace_id(DATASET, "r1", "c-cited"),  # no trace id in its reply
            }  # the agent error is not in the run
            scores = {r["id"]: r for r in server.score_rows() if r["name"] == CHECK_SCORE}
            for i in items:
                score = scores[check_score_id(DATASET, "r1", i["datasetItemId"], i["traceId"])]
                assert score["traceId"] == i["traceId"]
            assert {s["stringValue"] for s in scores.values()} == {"pass", "fail"}

            # the same run name again: nothing is posted twice, only the agent error is asked again
            asked = len(agent.requests)
            again = invoke("--config", config, "--judge", "offline", "--run-name", "r1", env=env)
            assert again.exit_code == 0, again.output
            assert [r.question for r in agent.requests[asked:]] == [LF_QUESTIONS["down"]]
            assert len(server.run_items_of(DATASET, "r1")) == 3
            assert len([r for r in server.score_rows() if r["name"] == CHECK_SCORE]) == 3

            # a new run: compared with r1; the cited case breaks, so exit 7
            script[LF_QUESTIONS["cited"]].sources = [url("elsewhere")]
            out2 = tmp_path / "r2.json"
            second = invoke(
                "--config", config, "--judge", "offline", "--run-name", "r2", "--output", str(out2), env=env
            )
            assert second.exit_code == ExitCode.REGRESSED, second.output
            assert results(out2)["previous_run"] == "r1"
            assert statuses(results(out2))["c-cited"] == "newly_failing"
        # the error shapes: a run that does not exist, a run item for an unknown item
        import httpx

        auth = (server.public_key, server.secret_key)
        dataset_id = httpx.get(f"{server.url}/api/public/v2/datasets/{DATASET}", auth=auth).json()["id"]
        missing_run = {"datasetId": dataset_id, "runName": "no"}
        httpx.get(f"{server.url}/api/public/dataset-run-items", params=missing_run, auth=auth)
        unknown_item = {"runName": "r", "datasetItemId": "no"}
        httpx.post(f"{server.url}/api/public/dataset-run-items", json=unknown_item, auth=auth)
        httpx.get(f"{server.url}/api/public/datasets/{DATASET}/runs/r1", auth=auth)
        httpx.get(f"{server.url}/api/public/datasets/nope/runs", auth=auth)
        checked = {validate(openapi, entry) for entry in server.log}
    assert {
        f"GET /api/public/datasets/{DATASET}/runs 200",
        "GET /api/public/datasets/nope/runs 404",
        f"GET /api/public/datasets/{DATASET}/runs/r1 200",
        "GET /api/public/dataset-run-items 200",
        "GET /api/public/dataset-run-items 404",
        "POST /api/public/dataset-run-items 200",
        "POST /api/public/dataset-run-items 404",
        "POST /api/public/scores 202 (SDK contract)",
        "GET /api/public/v3/scores 200",
        "GET /api/public/v2/observations 200",
    } <= checked
    assert "unvalidated" not in checked


# -- the demo, on embedded defaults -----------------------------------------------------------------


@pytest.mark.slow
def test_check_on_embedded_defaults_runs_the_demo(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    run = invoke("--output", str(out))
    data = results(out)
    assert run.exit_code == data["exit_code"] == ExitCode.OK  # no previous run: no gate
    assert data["agent"] == "demo" and data["judge"] == "offline" and "demo" in data["target"]
    assert len(data["cases"]) == 29 and data["bad_items"] == [] and data["written"] == 29
    counts = data["counts"]
    # the demo agent fixes some failures and not others
    assert counts["fixed"] >= 10 and counts["still_failing"] >= 1 and counts["error"] == 0
    fixed_layers = {c["result"]["case"]["layer"] for c in data["cases"] if c["status"] == "fixed"}
    assert {"retrieval", "tool_routing", "agent_skipped_retrieval"} <= fixed_layers
    assert "## Fixed" in run.stdout and "## Still failing" in run.stdout
    # deterministic: the same statuses on a second run
    again = tmp_path / "again.json"
    invoke("--output", str(again))
    assert statuses(results(again)) == statuses(data)
    # nothing left behind: the demo's store is temporary (TRIAGE_STORE is untouched)
    assert not Path(str(tmp_path / "store.sqlite")).exists()


def test_default_run_name() -> None:
    assert default_run_name(datetime(2026, 12, 3, 7, 20, 12, 345000, tzinfo=UTC)) == "check-2026-12-03T07:20:12Z"


def test_tool_use_of_the_demo_agent_names_the_configured_tools() -> None:
    from triage.app import demo_index_folders
    from triage.search.agent import DECLINE, DemoAgent
    from triage.search.index import Index

    agent = DemoAgent(Index.from_folders(demo_index_folders()), TOOLS)
    crash = agent.answer("Kubeflow pods crash with too many open files, why?")
    assert [c.collection for c in crash.tool_calls or []] == ["docs", "issues"]
    assert crash.sources == ["https://github.com/kubeflow/manifests/issues/2867"]
    assert crash.tool_calls and crash.tool_calls[1] == ToolUse(
        name="search_github_issues", collection="issues", args=crash.tool_calls[1].args
    )
    assert agent.answer("Is there an official Kubeflow mobile app for my phone?").answer == DECLINE


def test_the_gate_is_the_previous_run_and_min_pass() -> None:
    def report(status: str, previous: Outcome | None, outcome: Outcome = "fail") -> CaseReport:
        case = CheckCase.from_item(item("x", "q?", cite=url("a"), layer="ok"))
        result = CaseResult(case=case, run=AgentRun(answer="a"), outcome=outcome, judge="j")
        return CaseReport(result=result, status=status, previous=previous)  # type: ignore[arg-type]

    def check(*cases: CaseReport, **kw: Any) -> CheckResult:
        return CheckResult(dataset=DATASET, run_name="r", target="t", agent="a", judge="j", cases=list(cases), **kw)

    # right in production, wrong now, with no result in a previous run: reported, not gated
    assert check(report("newly_failing", None)).exit_code == ExitCode.OK
    assert check(report("newly_failing", "pass")).exit_code == ExitCode.REGRESSED
    assert check(report("still_passing", "pass", "pass"), min_pass=1.0).exit_code == ExitCode.OK
    assert check(report("still_failing", "fail"), min_pass=0.5).exit_code == ExitCode.REGRESSED
    assert check(min_pass=0.5).exit_code == ExitCode.REGRESSED  # no case: no rate, so under any gate
    assert check(report("fixed", "fail", "pass"), not_written={"x": "down"}).exit_code == ExitCode.NOT_WRITTEN


@pytest.mark.slow
def test_langfuse_never_posts_a_case_the_run_holds(quick: VirtualClock) -> None:
    """The backend reads the run's items before it posts (Langfuse takes no run item id): the same
    results written twice make one run item each; an archived case is refused with the reason."""
    from triage.domain.checks import CheckRun, RunItemResult

    with LangfuseStandIn() as server:
        with backend_for(server) as backend:
            backend.ensure_dataset(DATASET, "cases", {})
            backend.upsert_dataset_items([item("c-1", "q1?", cite=url("a")), item("c-2", "q2?", cite=url("a"))])
            server._dataset_items["c-2"]["status"] = "ARCHIVED"  # a maintainer archived it meanwhile
            run = CheckRun(dataset=DATASET, name="r", created_at=NOW, metadata={"created_by": "triage check"})
            results = [RunItemResult(item_id=i, trace_id=f"t-{i}", outcome="pass") for i in ("c-1", "c-2")]
            first = backend.write_dataset_run(run, results)
            second = backend.write_dataset_run(run, results)
            runs = backend.dataset_runs(DATASET)
            read = backend.dataset_run_results(runs[0])
    assert first.written == ["c-1"] and "Dataset item not found" in first.failed["c-2"]
    assert second.written == ["c-1"]
    assert len(server.run_items_of(DATASET, "r")) == 1
    assert [r.name for r in runs] == ["r"] and runs[0].by_check and runs[0].created_at == NOW
    assert read["c-1"].outcome == "pass" and read["c-1"].trace_id == "t-c-1"


def test_an_agents_address_is_shown_without_what_may_carry_a_key() -> None:
    # the report and the logs name the agent: a key in the userinfo, the query or the fragment stays out
    shown = shown_url("https://bot:s3cret@agent.example:8443/v1/chat?api_key=k3y#frag")
    assert shown == "https://agent.example:8443/v1/chat"
    assert "s3cret" not in shown and "k3y" not in shown
    assert shown_url(None) == "?" and shown_url("no scheme") == "?"
