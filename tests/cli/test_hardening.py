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
        env = server.env
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


# --- no secret is ever printed ------------------------------------------------------------------

TOKEN = "mcp-token-0123456789abcdef"


def _searched_night(tmp_path: Path) -> None:
    """One thumbs-down whose agent passage is off-topic: deciding it needs the re-search."""
    needs = trace_line(
        "needs",
        "How do I limit the number of trials?",
        "No idea.",
        [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile.")],
        at=NOW - timedelta(hours=2),
    )
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(needs) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_token_with_a_trailing_newline_is_used_stripped_and_never_printed(
    tmp_path: Path, virtual_time: object
) -> None:
    _searched_night(tmp_path)
    env = {"TRIAGE_MCP_URL": f"http://127.0.0.1:{_free_port()}/mcp", "TRIAGE_MCP_TOKEN": TOKEN + "\n"}
    result = _invoke(["feedback", "--report"], env)
    assert result.exit_code == 4  # the search server is down: degraded, not a crash
    assert "Illegal header" not in result.output
    assert TOKEN not in result.stdout and TOKEN not in result.stderr


def test_a_token_no_header_can_carry_is_a_configuration_error_that_does_not_echo_it(tmp_path: Path) -> None:
    _searched_night(tmp_path)
    env = {"TRIAGE_MCP_URL": "http://127.0.0.1:9/mcp", "TRIAGE_MCP_TOKEN": "mcp-token\n0123456789abcdef"}
    result = _invoke(["feedback", "--report"], env)
    assert result.exit_code == 3
    assert "TRIAGE_MCP_TOKEN" in result.output
    assert "0123456789abcdef" not in result.output


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_judge_error_that_quotes_the_key_never_prints_it(tmp_path: Path, log_format: str) -> None:
    from tests.doubles.openai_server import OpenAIServer, Reply

    key = "sk-live-0123456789abcdefXYZ"
    _searched_night(tmp_path)

    def responder(_: Any) -> Reply:
        return Reply.status_error(401, f"Incorrect API key provided: {key}. Check it at your account page.")

    with OpenAIServer(responder=responder) as server:
        env = {"OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": key, "TRIAGE_JUDGE_MODEL": "m"}
        result = _invoke(["feedback", "--report", "--judge", "llm", "--log-format", log_format], env)
    assert result.exit_code == 3
    assert key not in result.stdout and key not in result.stderr
    assert "refused the credentials" in result.stderr


def test_credentials_in_any_reported_text_are_masked() -> None:
    from triage.redact import Redactor

    redact = Redactor(["tok-0123456789\n"])
    assert redact("Illegal header value b'Bearer tok-0123456789\\n'") == "Illegal header value b'Bearer ***'"
    assert "sk-proj-abcdefghijklmnop" not in redact("key sk-proj-abcdefghijklmnop refused")
    assert redact('{"api_key": "abcdef123456"}') == '{"api_key": "***"}'
    ordinary = "Set maxTrialCount to 5; the token budget of the model was exceeded"
    assert redact(ordinary) == ordinary


# --- control and bidi characters never reach the report or the log ---------------------------------

HOSTILE = (
    "\x1bc\x1b]0;owned\x07 BEL\x07 NUL\x00 BS\x08 \u202eevil\u202c \u2066iso\u2069 zero\u200bwidth \ufeffbom"
)
INVISIBLE = ["\x1b", "\x07", "\x00", "\x08", "\u202e", "\u202c", "\u2066", "\u2069", "\u200b", "\ufeff"]


def test_control_and_bidi_characters_are_stripped_and_user_text_is_capped(tmp_path: Path) -> None:
    at = NOW - timedelta(hours=2)
    hostile = trace_line(
        "hostile" + "\u202e", "What is Katib?" + HOSTILE, "A tuner.", [], comment=HOSTILE, at=at
    )
    huge = trace_line("huge", "What is KFP?", "Pipelines.", [], comment="x" * 1_000_000, at=at)
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(hostile) + "\n" + json.dumps(huge) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    result = _invoke(["feedback", "--report"])
    assert result.exit_code == 0, result.output
    for char in INVISIBLE:
        assert char not in result.stdout, repr(char)
        assert char not in result.stderr, repr(char)
    assert "owned" in result.stdout  # the text itself stays, only the characters that act on a viewer go
    assert len(result.stdout) < 20_000  # a 1 MB comment is cut in the report (the trace keeps it whole)


# --- exit codes keep their contract ------------------------------------------------------------


def _config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "triage.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("missing_index_folder", 3),
        ("binary_config", 3),
        ("store_not_sqlite", 3),
        ("store_in_missing_folder", 3),
        ("empty_tools", 3),
        ("non_ascii_key", 3),
    ],
)
def test_bad_configuration_is_exit_3_not_a_crash(tmp_path: Path, setup: str, code: int) -> None:
    args, env = ["feedback"], {}
    if setup == "missing_index_folder":
        args += [
            "--config",
            str(_config_file(tmp_path, f'[[index]]\ncollection = "docs"\npath = "{tmp_path}/nope"\n')),
        ]
    elif setup == "binary_config":
        binary = tmp_path / "config.toml"
        binary.write_bytes(b"\xff\xfe\x00\x01binary")
        args += ["--config", str(binary)]
    elif setup == "store_not_sqlite":
        not_a_store = tmp_path / "store.sqlite"
        not_a_store.write_text("this is not a database, just text " * 100)
        env["TRIAGE_STORE"] = str(not_a_store)
    elif setup == "store_in_missing_folder":
        env["TRIAGE_STORE"] = str(tmp_path / "no" / "such" / "store.sqlite")
    elif setup == "empty_tools":
        args += ["--config", str(_config_file(tmp_path, "[tools]\n"))]
    elif setup == "non_ascii_key":
        env.update({"OPENAI_API_KEY": "sk-cl\u00e9-0123456789", "TRIAGE_JUDGE_MODEL": "m"})
    result = _invoke(args, env)
    assert result.exit_code == code, result.output
    assert "unexpected failure" not in result.output
    if setup == "store_in_missing_folder":
        assert not (tmp_path / "no").exists()  # not silently created
    if setup == "non_ascii_key":
        assert "OPENAI_API_KEY" in result.output and "cl\u00e9" not in result.output


@pytest.mark.parametrize("hours", ["nan", "inf", "1e9", "-1"])
def test_since_hours_must_be_a_real_window(hours: str) -> None:
    result = _invoke(["feedback", "--since-hours", hours])
    assert result.exit_code == 2, result.output


def test_a_report_file_in_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(_deep_night()[1]) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    result = _invoke(["feedback", "--write", "--report-file", str(tmp_path / "missing" / "report.md")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
    again = _invoke(["feedback", "--write"])
    assert "already triaged 0" in again.stderr  # the refused run wrote nothing


def test_a_crash_under_json_logs_is_a_json_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import triage.app

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(triage.app.Triage, "feedback", crash)
    result = _invoke(["feedback", "--log-format", "json"])
    assert result.exit_code == 1
    last = json.loads(result.stderr.strip().splitlines()[-1])
    assert last["level"] == "error" and "unexpected failure: RuntimeError: boom" in last["message"]


def test_a_judge_answering_html_lists_the_trace_instead_of_crashing(virtual_time: object) -> None:
    import asyncio

    import httpx
    import openai

    from triage.domain.ports import JudgeRequest
    from triage.domain.records import Facts, Passage, ToolCall, Trace
    from triage.errors import JudgeRejected
    from triage.judges.llm import LLMJudge
    from triage.settings import load_config

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, text="<html><body>proxy login</body></html>", headers={"content-type": "text/html"}
        )

    async def judge_once() -> None:
        client = openai.AsyncOpenAI(
            api_key="x",
            base_url="http://judge.test/v1",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(html)),
            max_retries=0,
        )
        judge = LLMJudge(client=client, model="m", components=load_config(None).components)
        trace = Trace(
            id="t",
            question="How do I set maxTrialCount?",
            answer="Set it.",
            tool_calls=[ToolCall(id="c", name="search_kubeflow_docs", collection="docs")],
            passages=[Passage(id="R1", text="maxTrialCount limits the trials.")],
        )
        try:
            await judge.judge(
                JudgeRequest(trace, [], None, Facts(agent_searched=True, agent_searched_collections=["docs"]))
            )
        finally:
            await judge.aclose()

    with pytest.raises(JudgeRejected, match="did not answer a chat completion"):
        asyncio.run(judge_once())


def test_score_metadata_stays_bounded_however_much_the_answer_invents(tmp_path: Path) -> None:
    from triage.sources.store import Store

    invented = " ".join(f"--flag-{i}=value{i}" for i in range(60_000))  # 60k specifics seen nowhere
    line = trace_line(
        "invents",
        "How do I configure a katib experiment trial?",
        f"Use these flags: {invented}",
        [("search_kubeflow_docs", KATIB, "A katib experiment configures each trial with a trial template.")],
        at=NOW - timedelta(hours=2),
    )
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(line) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    result = _invoke(["feedback", "--write"])
    assert result.exit_code == 0, result.output
    with Store(tmp_path / "store.sqlite") as store:
        rows = store.scores_named("triage_layer")
    assert len(rows) == 1 and rows[0]["stringValue"] == "generation"
    assert len(rows[0]["metadata"]) < 32_000  # was 1.1 MB: HTTP 413 from Langfuse, every night
    assert "more" in json.loads(rows[0]["metadata"])["facts"]["unsupported_claims"][-1]


def test_a_trace_whose_rows_cannot_be_read_is_listed_and_the_others_are_triaged(tmp_path: Path) -> None:
    import sqlite3

    export = tmp_path / "export.jsonl"
    export.write_text("\n".join(json.dumps(t) for t in _deep_night()) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        db.execute("UPDATE observations SET metadata = '{not json' WHERE traceId = 'deep'")
    result = _invoke(["feedback", "--report"])
    assert result.exit_code == 0, result.output  # bad input is listed, not degraded
    assert "2 thumbs-down: 1 triaged, 1 not triaged" in result.stdout
    assert "bad_input: a stored observation cannot be read" in result.stdout


# --- `triage import` lets no bad input through ----------------------------------------------------


def _import_lines(tmp_path: Path, *rows: dict[str, Any] | bytes) -> Any:
    export = tmp_path / "export.jsonl"
    export.write_bytes(
        b"\n".join(r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows) + b"\n"
    )
    return _invoke(["import", str(export)])


def test_import_refuses_a_boolean_vote_that_is_not_0_or_1(tmp_path: Path) -> None:
    row = trace_line("t1", "What is Katib?", "A tuner.", [])
    row["scores"][0]["value"] = "zero"
    result = _import_lines(tmp_path, row)
    assert result.exit_code == 1
    assert "line 1" in result.output and "BOOLEAN" in result.output


def test_import_refuses_an_observation_of_another_trace(tmp_path: Path) -> None:
    row = trace_line("t1", "What is Katib?", "A tuner.", [("search_kubeflow_docs", KATIB, "Katib tunes.")])
    row["observations"][1]["traceId"] = "t2"
    result = _import_lines(tmp_path, row)
    assert result.exit_code == 1
    assert "belongs to trace 't2'" in result.output


def test_import_refuses_a_trace_on_two_lines(tmp_path: Path) -> None:
    row = trace_line("t1", "What is Katib?", "A tuner.", [])
    result = _import_lines(tmp_path, row, row)
    assert result.exit_code == 1
    assert "line 2" in result.output and "already on line 1" in result.output


def test_import_names_the_line_of_a_byte_that_is_not_utf8(tmp_path: Path) -> None:
    good = trace_line("t1", "What is Katib?", "A tuner.", [])
    result = _import_lines(
        tmp_path, good, b'{"traceId": "t2", "observations": [], "scores": [], "x": "\xff"}'
    )
    assert result.exit_code == 1
    assert "line 2" in result.output and "UTF-8" in result.output
    assert "unexpected failure" not in result.output


# --- Langfuse outages are bounded -------------------------------------------------------------


def _langfuse_env(url: str) -> dict[str, str]:
    return {
        "LANGFUSE_PUBLIC_KEY": "pk-lf-test",
        "LANGFUSE_SECRET_KEY": "sk-lf-test",
        "LANGFUSE_BASE_URL": url,
    }


def test_langfuse_down_at_start_ends_the_run_within_two_minutes(virtual_time: Any) -> None:
    result = _invoke(["feedback", "--report"], _langfuse_env(f"http://127.0.0.1:{_free_port()}"))
    assert result.exit_code == 1, result.output
    assert "gave up" in result.output
    assert virtual_time.elapsed <= 120  # by default: the 90 s deadline of one call, in virtual time


def test_after_one_call_gives_up_on_an_outage_the_next_ones_try_once(virtual_time: Any) -> None:
    from triage.errors import LangfuseError
    from triage.sources.langfuse.backend import LangfuseBackend

    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens: every request is refused
    backend = LangfuseBackend(public_key="pk-lf-t", secret_key="sk-lf-t", base_url=url, deadline_seconds=10)
    for _ in range(2):
        with pytest.raises(LangfuseError, match="gave up"):
            backend.triaged(["t1"], "triage_layer", "1")
    first_call = backend.stats.requests
    assert first_call > 3  # the first call retried until its deadline
    with pytest.raises(LangfuseError):
        backend.triaged(["t2"], "triage_layer", "1")
    assert backend.stats.requests == first_call + 1  # plainly down: one attempt, no back-off
    backend.close()


def _spawn_feedback(env: dict[str, str], *args: str) -> Any:
    """`triage feedback --report --judge heuristic` as a separate process (it gets signals)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "triage", "feedback", "--report", "--judge", "heuristic", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_sigterm_during_a_langfuse_outage_exits_within_30_s_with_the_summary() -> None:
    import os
    import signal
    import time

    records = [
        trace_line(
            f"t{i}",
            "How do I configure a katib experiment trial?",
            "Use the trial template.",
            [],
            at=NOW - timedelta(hours=2),
        )
        for i in range(20)
    ]
    with LangfuseStandIn(records=records) as server:
        env = {"PATH": os.environ["PATH"], **_langfuse_env(server.url)}
        env.update({"LANGFUSE_PUBLIC_KEY": server.public_key, "LANGFUSE_SECRET_KEY": server.secret_key})
        env["TRIAGE_LANGFUSE_DEADLINE_SECONDS"] = (
            "600"  # without SIGTERM the writes would retry for 10 minutes
        )
        # Langfuse goes away after the reads (the run marker's, the votes, triaged, observations)
        server.schedule_restart(at_request=6, down_seconds=600)
        proc = _spawn_feedback(env, "--write")
        deadline = time.monotonic() + 30
        while len(server.log) < 6 and time.monotonic() < deadline:  # until the reads are done
            time.sleep(0.1)
        time.sleep(2.0)  # the writes are now retrying against a Langfuse that is gone
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert took < 30, err
    assert proc.returncode in (4, 5), err
    assert "summary: thumbs-down 20" in err
    assert out.startswith("# Triage of thumbs-down answers")


@pytest.mark.slow
def test_sigterm_while_the_votes_are_read_is_exit_4_with_every_vote_listed() -> None:
    import os
    import signal
    import time

    records = [
        trace_line(f"t{i}", "What is Katib?", "A tuner.", [], at=NOW - timedelta(hours=2)) for i in range(3)
    ]
    with LangfuseStandIn(records=records) as server:
        server.inject("slow", seconds=3.0, path="/v3/scores")  # the first votes read takes 3 s
        env = {
            "PATH": os.environ["PATH"],
            **_langfuse_env(server.url),
            "LANGFUSE_PUBLIC_KEY": server.public_key,
            "LANGFUSE_SECRET_KEY": server.secret_key,
        }
        proc = _spawn_feedback(env)
        deadline = time.monotonic() + 20
        while not any("/v3/scores" in r.path for r in server.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the read is in flight
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err  # not 143: the run lists what it did not triage
    assert "3 thumbs-down: 0 triaged, 3 not triaged" in out
    assert "stopped (SIGTERM)" in out


def test_an_empty_answer_is_triaged_as_a_failure_not_listed_as_bad_input(tmp_path: Path) -> None:
    at = NOW - timedelta(hours=2)
    passage = "A katib experiment configures each trial with a trial template."
    empty = trace_line(
        "empty",
        "How do I configure a katib experiment trial?",
        "",
        [("search_kubeflow_docs", KATIB, passage)],
        at=at,
    )
    blank = trace_line(
        "blank",
        "How do I configure a katib experiment trial?",
        "  \n\t ",
        [("search_kubeflow_docs", KATIB, passage)],
        at=at,
    )
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps(empty) + "\n" + json.dumps(blank) + "\n")
    assert _invoke(["import", str(export)]).exit_code == 0
    facts_file = tmp_path / "facts.jsonl"
    result = _invoke(["feedback", "--report", "--facts-file", str(facts_file)])
    assert result.exit_code == 0, result.output
    assert "2 thumbs-down: 2 triaged, 0 not triaged" in result.stdout
    assert "### generation (2)" in result.stdout  # the passage held the answer; the agent gave none
    for line in facts_file.read_text().splitlines():
        facts = json.loads(line)
        assert facts["answer_grounded"] is False and facts["answer_declined"] is False
