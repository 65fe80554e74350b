"""The CLI run as the container runs it: the manifest's command line, settings from the environment only.

Each run is a subprocess with a cleared environment (only what the Pod would have, plus PATH/HOME/TMPDIR),
stdin closed and no terminal, exactly the `command` + `args` of cronjob.yaml. The data lives in the
embedded store (filled with `triage import`) or, for the Langfuse path, in the local Langfuse stand-in
(tests/doubles/langfuse_server.py) on 127.0.0.1. Checked: exit codes and the podFailurePolicy action each one
triggers in the manifests, the log lines (text and JSON), shard coverage, and that secret values set
in the environment never appear in stdout or stderr.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import trace_line

ROOT = Path(__file__).resolve().parents[2]
CRONJOB = ROOT / "cronjob.yaml"
INDEXED = ROOT / "cronjob-indexed.yaml"
OPENAI_KEY = "sk-test-OPENAI-5f3a9c1e7b"  # known values that must never be printed
MCP_TOKEN = "mcp-test-TOKEN-8d2e4b6a0c"
LF_PUBLIC = "pk-lf-test-3c7e1a"
LF_SECRET = "sk-lf-test-SECRET-b94f2d8e61"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (debug|info|warning|error|critical) +\S")
PLAN = re.compile(r"(\d+) already triaged, (\d+) to triage")

pytestmark = pytest.mark.slow  # every test starts the CLI as a subprocess


def _cronjob(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return next(d for d in yaml.safe_load_all(fh) if d and d.get("kind") == "CronJob")


def _container(path: Path) -> dict[str, Any]:
    return _cronjob(path)["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]


def command_line() -> list[str]:
    """The container's command and args, read from the manifest (so they cannot drift apart)."""
    container = _container(CRONJOB)
    assert _container(INDEXED)["args"] == container["args"]
    return [*container["command"], *container["args"]]


def pod_action(exit_code: int, manifest: Path = CRONJOB) -> str:
    """What the manifest's podFailurePolicy does with a Pod that exited with `exit_code` (first match)."""
    rules = _cronjob(manifest)["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    for rule in rules:
        on_exit = rule.get("onExitCodes")
        if on_exit and (exit_code in on_exit["values"]) == (on_exit["operator"] == "In"):
            return rule["action"]
    return "Count"  # no rule matched: the default, counted against the backoff limit


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.lines = [line for line in proc.stderr.splitlines() if line.strip()]

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def events(self) -> list[str]:
        return [line.get("event", "") for line in self.json_lines()]

    def plan(self) -> tuple[int, int]:
        """(already triaged, to triage) from the plan line."""
        found = [PLAN.search(line) for line in self.lines]
        (match,) = [m for m in found if m]
        return int(match.group(1)), int(match.group(2))

    def __repr__(self) -> str:
        return f"exit {self.code}\n--- stderr\n{self.stderr}\n--- stdout\n{self.stdout[:2000]}"


def run_container(tmp_path: Path, env: dict[str, str], args: list[str] | None = None) -> Run:
    """The manifest's command line, environment from `env` only, stdin closed, no TTY."""
    base = {
        # what the image provides: the interpreter's bin directory on PATH; the manifest's TMPDIR/HOME
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "LANG": "C.UTF-8",
        # the checkout under test, even when the venv's editable install points at another clone
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [*command_line(), *(args or [])],
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return Run(proc)


def traces(count: int) -> list[dict[str, Any]]:
    """`count` thumbs-down traces from the last few hours: some answered from search, some not."""
    now = datetime.now(UTC)
    rows = []
    for i in range(count):
        at = now - timedelta(hours=2, minutes=7 * i)
        if i % 3 == 0:
            rows.append(
                trace_line(f"t{i}", f"How do I compile pipeline number {i} with kfp?", "Run kfp.", [], at=at)
            )
        else:
            search = (
                "search_kubeflow_docs",
                "https://www.kubeflow.org/docs/components/katib/",
                "Katib overview.",
            )
            rows.append(
                trace_line(
                    f"t{i}", f"How do I tune experiment {i} in Katib?", "Use a trial.", [search], at=at
                )
            )
    return rows


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    """An embedded store filled by `triage import`, run the same way (environment only)."""
    data = tmp_path / "export.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in traces(9)), encoding="utf-8")
    path = tmp_path / "store.sqlite"
    proc = subprocess.run(
        [Path(sys.executable).parent / "triage", "import", str(data)],
        env={
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TRIAGE_STORE": str(path),
            "PYTHONPATH": str(ROOT),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "imported 9 traces" in proc.stdout
    yield path


def _no_secrets(run: Run, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in run.stdout and secret not in run.stderr, f"{secret!r} leaked"


def test_nightly_run_json_logs_report_and_rerun(tmp_path: Path, store: Path) -> None:
    env = {
        "TRIAGE_STORE": str(store),
        "TRIAGE_LOG_FORMAT": "json",  # as the manifest's ConfigMap sets it
        "OPENAI_API_KEY": OPENAI_KEY,  # set, but unused: no TRIAGE_JUDGE_MODEL -> the heuristic judge
        "TRIAGE_MCP_TOKEN": MCP_TOKEN,
    }
    first = run_container(tmp_path, env)
    assert first.code == 0, first
    lines = first.json_lines()  # every stderr line is one JSON object
    assert all({"time", "level", "message"} <= line.keys() for line in lines)
    events = first.events()
    assert events[0] == "start" and "plan" in events and "progress" in events
    assert events[-1] == "summary" and events.count("summary") >= 3
    assert first.plan() == (0, 9)
    assert any(line["message"].startswith("summary: written: 18 scores") for line in lines)  # 2 per trace
    assert first.stdout.startswith("# Triage of thumbs-down answers")  # the report goes to stdout only
    assert not any(line.lstrip().startswith("#") for line in first.stderr.splitlines())
    _no_secrets(first, OPENAI_KEY, MCP_TOKEN)

    # the Job's retry or a second run: everything is already triaged, nothing is written twice
    second = run_container(tmp_path, env)
    assert second.code == 0, second
    assert second.plan() == (9, 0)
    assert any(line["message"].startswith("summary: written: 0 scores") for line in second.json_lines())


@pytest.mark.parametrize(
    ("env", "args"),
    [({}, []), ({"TRIAGE_LOG_FORMAT": "json"}, ["--log-format", "text"])],
    ids=["default", "flag"],
)
def test_text_log_lines(tmp_path: Path, store: Path, env: dict[str, str], args: list[str]) -> None:
    run = run_container(tmp_path, {"TRIAGE_STORE": str(store), **env}, args)
    assert run.code == 0, run
    assert run.lines and all(TEXT_LINE.match(line) for line in run.lines), run.lines
    assert any("summary: thumbs-down 9" in line for line in run.lines)


def test_log_format_flag_selects_json(tmp_path: Path, store: Path) -> None:
    run = run_container(tmp_path, {"TRIAGE_STORE": str(store)}, ["--log-format", "json"])
    assert run.code == 0, run
    assert run.events()[0] == "start"


def test_indexed_shards_cover_every_vote_once(tmp_path: Path, store: Path) -> None:
    """The Indexed Job's Pods: JOB_COMPLETION_INDEX 0..N-1 and the manifest's TRIAGE_SHARD_COUNT."""
    env_vars = {e["name"]: e.get("value") for e in _container(INDEXED)["env"]}
    count = int(env_vars["TRIAGE_SHARD_COUNT"])
    taken = []
    for index in range(count):
        run = run_container(
            tmp_path,
            {
                "TRIAGE_STORE": str(store),
                "TRIAGE_LOG_FORMAT": "json",
                "JOB_COMPLETION_INDEX": str(index),
                "TRIAGE_SHARD_COUNT": str(count),
            },
        )
        assert run.code == 0, run
        already, todo = run.plan()
        assert already == 0, f"shard {index} saw votes another shard took"
        taken.append(todo)
    assert sum(taken) == 9
    after = run_container(tmp_path, {"TRIAGE_STORE": str(store)})
    assert after.plan() == (9, 0)


@pytest.mark.parametrize(
    "env",
    [
        {"TRIAGE_CONFIG": "/nonexistent/triage.toml"},
        {"JOB_COMPLETION_INDEX": "1"},  # an Indexed Pod without TRIAGE_SHARD_COUNT
        {"JOB_COMPLETION_INDEX": "4", "TRIAGE_SHARD_COUNT": "4"},  # completions > TRIAGE_SHARD_COUNT
        {"LANGFUSE_PUBLIC_KEY": LF_PUBLIC},  # half the Langfuse credentials
        {"TRIAGE_LOG_FORMAT": "yaml"},
    ],
    ids=["config-file", "no-shard-count", "index-out-of-range", "half-credentials", "bad-log-format"],
)
def test_configuration_errors_exit_3_and_fail_the_job(
    tmp_path: Path, store: Path, env: dict[str, str]
) -> None:
    run = run_container(tmp_path, {"TRIAGE_STORE": str(store), "OPENAI_API_KEY": OPENAI_KEY, **env})
    assert run.code == 3, run
    assert run.stderr.strip() and not run.stdout  # a reason in the log, no report
    assert pod_action(3) == "FailJob" and pod_action(3, INDEXED) == "FailJob"
    _no_secrets(run, OPENAI_KEY)


def test_configuration_error_is_a_json_line_in_json_mode(tmp_path: Path, store: Path) -> None:
    run = run_container(
        tmp_path,
        {"TRIAGE_STORE": str(store), "TRIAGE_LOG_FORMAT": "json", "TRIAGE_CONFIG": "/nonexistent.toml"},
    )
    assert run.code == 3, run
    last = run.json_lines()[-1]  # every line parses, the fatal one included
    assert last["level"] == "error" and last["exit_code"] == 3
    assert "config file not found" in last["message"]


def test_search_unavailable_is_degraded_exit_4_and_retried(tmp_path: Path, store: Path) -> None:
    # a port on 127.0.0.1 with nothing listening: the search server is down for the whole run
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # the run waits for the search ([search] outage_wait_seconds, 600 in cronjob.yaml): a short wait
    # here, in real time, then the traces that need it are listed
    config = tmp_path / "triage.toml"
    config.write_text("[search]\noutage_wait_seconds = 5\n", encoding="utf-8")
    run = run_container(
        tmp_path,
        {
            "TRIAGE_STORE": str(store),
            "TRIAGE_LOG_FORMAT": "json",
            "TRIAGE_MCP_URL": f"http://127.0.0.1:{port}/mcp",
            "TRIAGE_MCP_TOKEN": MCP_TOKEN,
            "TRIAGE_CONFIG": str(config),
        },
    )
    assert run.code == 4, run
    events = run.events()
    assert "search_unavailable" in events and "undecided" in events
    assert "search_waiting" in events  # waited before listing them
    assert run.stdout.startswith("# Triage")  # the rest is still triaged and reported
    assert pod_action(4) == "Count" and pod_action(4, INDEXED) == "Count"
    _no_secrets(run, MCP_TOKEN)


def test_usage_error_exits_2_and_fails_the_job(tmp_path: Path, store: Path) -> None:
    run = run_container(tmp_path, {"TRIAGE_STORE": str(store)}, ["--shard", "5/4"])
    assert run.code == 2, run
    assert pod_action(2) == "FailJob" and pod_action(2, INDEXED) == "FailJob"


def _basic(public: str, secret: str) -> str:
    return base64.b64encode(f"{public}:{secret}".encode()).decode()


def test_langfuse_run_never_prints_the_keys(tmp_path: Path) -> None:
    """The production path: Langfuse keys from the Secret, JSON logs, against the local stand-in."""
    with LangfuseStandIn(records=traces(6), public_key=LF_PUBLIC, secret_key=LF_SECRET) as server:
        env = {
            "LANGFUSE_BASE_URL": server.url,
            "LANGFUSE_PUBLIC_KEY": LF_PUBLIC,
            "LANGFUSE_SECRET_KEY": LF_SECRET,
            "OPENAI_API_KEY": OPENAI_KEY,
            "TRIAGE_MCP_TOKEN": MCP_TOKEN,
            "TRIAGE_LOG_FORMAT": "json",
        }
        run = run_container(tmp_path, env)
        assert run.code == 0, run
        assert run.plan() == (0, 6)
        assert any(r.method == "POST" and r.path == "/api/public/scores" for r in server.log)
        _no_secrets(run, LF_SECRET, OPENAI_KEY, MCP_TOKEN, _basic(LF_PUBLIC, LF_SECRET))

        # refused credentials: configuration/authentication error, the Job fails at once
        wrong = "sk-lf-test-WRONG-0a1b2c3d4e"
        refused = run_container(tmp_path, {**env, "LANGFUSE_SECRET_KEY": wrong})
        assert refused.code == 3, refused
        assert pod_action(refused.code) == "FailJob"
        _no_secrets(refused, wrong, LF_SECRET, _basic(LF_PUBLIC, wrong))
