"""The command line: help, exit codes (the CronJob's contract), import. The docs kept in step with it:
tests/test_docs.py."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.doubles.clock import VirtualClock
from tests.factories import lines, trace_line
from triage.cli import cli

DOCS_URL = "https://www.kubeflow.org/docs/components/katib/early-stopping/"


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False, prog_name="triage")
    return result.exit_code, result.stdout, result.stderr


def all_commands() -> list[tuple[list[str], click.Command]]:
    found: list[tuple[list[str], click.Command]] = []

    def walk(path: list[str], command: click.Command) -> None:
        found.append((path, command))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk([*path, name], sub)

    walk([], cli)
    return found


@pytest.mark.parametrize("path", [p for p, _ in all_commands()], ids=lambda p: " ".join(p) or "triage")
def test_every_command_has_useful_help(path: list[str]) -> None:
    code, out, _ = invoke(*path, "--help")
    assert code == 0
    assert out.startswith("Usage: triage")
    description = out.split("\n\n")[1].strip()
    assert len(description) > 20, f"{path}: help has no description"


def test_empty_store_is_a_clean_run() -> None:
    code, out, err = invoke("feedback", "--report")
    assert code == 0
    assert out.startswith("# Triage of thumbs-down answers")
    assert "0 thumbs-down" in out
    assert "summary: thumbs-down 0" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["feedback", "--shard", "4/4"], "shard index must be in 0..3"),
        (["feedback", "--shard", "x"], "expected I/N"),
        (["feedback", "--since-hours", "0"], "--since-hours"),
        (["feedback", "--concurrency", "0"], "--concurrency"),
        (["feedback", "--no-such-option"], "No such option"),
        (["import"], "Missing argument"),
        (["index", "serve", "--folder", "nonsense"], "expected COLLECTION=PATH"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, _, err = invoke(*args)
    assert code == 2
    assert message in err


def test_configuration_errors_exit_3(tmp_path: Path) -> None:
    code, _, err = invoke("feedback", env={"LANGFUSE_PUBLIC_KEY": "pk-lf-1"})
    assert (code, err) == (
        3,
        "Error: Langfuse needs both keys: set LANGFUSE_SECRET_KEY "
        "(or unset the other to use the embedded store)\n",
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\nteam = 1")
    code, _, err = invoke("feedback", "--config", str(bad))
    assert code == 3 and "is not valid TOML" in err
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[agent]\nteam = "x"\nbogus = 1\n')
    code, _, err = invoke("feedback", "--config", str(wrong))
    assert code == 3 and "agent.bogus: Extra inputs are not permitted" in err
    code, _, err = invoke("feedback", env={"JOB_COMPLETION_INDEX": "1"})
    assert code == 3 and "TRIAGE_SHARD_COUNT" in err
    code, _, err = invoke("feedback", env={"TRIAGE_SHARD_COUNT": "many"})
    assert code == 3 and "TRIAGE_SHARD_COUNT" in err
    code, _, err = invoke("feedback", "--judge", "llm")
    assert code == 3 and "set TRIAGE_JUDGE_MODEL" in err
    code, _, err = invoke("feedback", "--judge", "oracle")
    assert code == 3 and "unknown judge 'oracle'" in err


def test_import_rejects_a_bad_line_and_loads_nothing(tmp_path: Path) -> None:
    good = lines(trace_line("t1", "q?", "a."))[0]
    path = tmp_path / "export.jsonl"
    path.write_text(good + "\n{not json\n")
    code, _, err = invoke("import", str(path))
    assert code == 1 and f"{path}, line 2: not JSON" in err
    path.write_text(good + "\n")
    code, out, _ = invoke("import", str(path))
    assert code == 0 and out.startswith("imported 1 traces, 1 observations, 1 scores into ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_search_server_down_degrades_the_run_exit_4(tmp_path: Path, virtual_time: VirtualClock) -> None:
    at = datetime.now(UTC) - timedelta(hours=2)
    path = tmp_path / "export.jsonl"
    path.write_text(
        "\n".join(
            lines(
                # needs the re-search: the agent's passage is off-topic
                trace_line(
                    "needs",
                    "How do I limit the number of trials?",
                    "No idea.",
                    [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile.")],
                    at=at,
                ),
                # needs no re-search: the agent never searched
                trace_line("skipped", "How do I limit the number of trials?", "Use maxTrials.", [], at=at),
            )
        )
        + "\n"
    )
    assert invoke("import", str(path))[0] == 0
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    code, out, err = invoke("feedback", "--report", env={"TRIAGE_MCP_URL": dead})
    assert code == 4
    assert "search unavailable" in err
    # three connection attempts, then the run's one wait for the search ([search]
    # outage_wait_seconds, 600): a new client every 15 s, each with its three attempts, then listed
    assert virtual_time.sleeps[:3] == [1.0, 2.0, 15.0]
    assert 600.0 <= sum(virtual_time.sleeps) < 640.0
    assert "### agent_skipped_retrieval (1)" in out
    assert "## Not triaged (1)" in out and "`needs`" in out


def test_json_logs_are_one_object_per_line() -> None:
    code, _, err = invoke("feedback", "--log-format", "json")
    assert code == 0
    events = [json.loads(line) for line in err.splitlines()]
    assert {"start", "plan", "summary"} <= {e.get("event") for e in events}
    assert all({"time", "level", "message"} <= set(e) for e in events)


def test_empty_settings_count_as_unset() -> None:
    code, _, err = invoke("feedback", env={"TRIAGE_CONFIG": "", "TRIAGE_MCP_URL": "", "TRIAGE_JUDGE_MODEL": ""})
    assert code == 0, err
    assert "judge heuristic" in err
