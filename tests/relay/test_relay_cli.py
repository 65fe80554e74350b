"""`triage relay` as a command: exit 3 for an incoherent configuration, and on a laptop with no
set-up, votes posted over HTTP appear in the next `triage feedback` report."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tests.relay.test_relay import free_port
from triage.app import DEMO_DIR
from triage.cli import cli
from triage.domain.config import RelayConfig
from triage.errors import ExitCode
from triage.settings import load_config


def test_an_open_relay_refuses_any_address_but_loopback() -> None:
    result = CliRunner().invoke(cli, ["relay", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code == ExitCode.CONFIG
    assert "serves on 127.0.0.1 only, not 0.0.0.0" in result.output and "TRIAGE_RELAY_TOKEN" in result.output


def test_an_incoherent_score_model_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "triage.toml"
    config.write_text(
        '[relay]\nsources = []\n[[relay.scores]]\nname = "tone"\ndata_type = "TEXT"\n'
        '[[relay.scores]]\nname = "tone"\ndata_type = "TEXT"\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(cli, ["relay", "--config", str(config), "--port", "1"])
    assert result.exit_code == ExitCode.CONFIG
    assert "score 'tone' is declared twice" in result.output and "no source is declared" in result.output


def test_the_default_model_is_coherent_and_problems_are_named() -> None:
    config = load_config()
    assert config.relay.problems(["user_feedback", "verdict"]) == []
    model = RelayConfig(sources=[{"name": "human", "scores": ["user_feedback", "nope"]}])  # type: ignore[list-item]
    problems = model.problems(["user_feedback", "verdict"])
    assert "source 'human' writes 'nope', which is not declared" in problems
    assert "the 'human' source must be allowed to write 'verdict' (the relay writes it)" in problems


def test_a_secret_token_setting_is_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_RELAY_TOKEN", "bad token with spaces")
    result = CliRunner().invoke(cli, ["relay", "--port", "1"])
    assert result.exit_code == ExitCode.CONFIG and "spaces" not in result.output


@pytest.mark.slow
def wait_healthy(server: subprocess.Popen[str], url: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline and server.poll() is None, "the relay did not start"
        time.sleep(0.1)


def test_relay_then_feedback_sees_the_votes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
    env["TRIAGE_STORE"] = str(tmp_path / "store.sqlite")
    triage = [sys.executable, "-m", "triage"]
    subprocess.run([*triage, "import", str(DEMO_DIR / "traces.jsonl")], env=env, check=True, capture_output=True)
    port = free_port()
    server = subprocess.Popen(
        [*triage, "relay", "--port", str(port), "--log-format", "json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(server, url)
        down = {"traceId": "demo-gen-max-trials", "userId": "bob", "value": "down", "comment": "wrong limit"}
        assert httpx.post(f"{url}/api/feedback", json=down).status_code == 200
        session = {"contextId": "no-such-session", "turn": 0, "value": "down"}
        assert httpx.post(f"{url}/api/feedback", json=session).status_code == 200
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=20)
    assert server.returncode == 0, stderr
    assert "Bearer" not in stderr and '"event": "relay_stop"' in stderr
    config = tmp_path / "lag0.toml"
    config.write_text("[window]\nlag_minutes = 0\n", encoding="utf-8")
    report = subprocess.run(
        [*triage, "feedback", "--since-hours", "1", "--config", str(config), "--report"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert "2 thumbs-down: 1 triaged, 1 not triaged" in report.stdout, report.stdout + report.stderr
    assert "demo-gen-max-trials" in report.stdout and "wrong limit" in report.stdout
    assert "session no-such-session has 0 trace(s) so far; turn 0 has not arrived" in report.stdout


def test_sigterm_stops_the_relay_within_its_grace_even_with_a_client_that_never_finishes(tmp_path: Path) -> None:
    """Issue 25, defect 4: a request that never got an answer kept SIGTERM from stopping the relay.
    A client that sends half a request and waits is given the grace period, no longer."""
    import signal
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
    env.update(TRIAGE_STORE=str(tmp_path / "store.sqlite"), TRIAGE_RELAY_SHUTDOWN_SECONDS="1")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "triage", "relay", "--port", str(port), "--log-format", "json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(server, url)
        assert httpx.post(f"{url}/api/feedback", json={"traceId": "t", "value": "down"}).status_code == 200
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST /api/feedback HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"traceId\":")
        time.sleep(0.2)
        server.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, stderr = server.communicate(timeout=15)
        took = time.monotonic() - started
        half.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, stderr
    assert took < 6, f"took {took:.1f} s to stop"


def test_a_store_the_relay_cannot_write_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a read-only store the relay never opened exited 1 (an internal error, retried by
    Kubernetes for ever) instead of 3 (configuration, named). Read-only is SQLite's own (every
    connection opened `mode=ro`): root writes whatever a file's mode says."""
    import sqlite3

    from click.testing import CliRunner

    import triage.relay.sqlite as ledger_module
    import triage.sources.store as store_module
    from triage.cli import cli

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_"))}
    store = tmp_path / "store.sqlite"
    env["TRIAGE_STORE"] = str(store)
    triage = [sys.executable, "-m", "triage"]
    subprocess.run([*triage, "import", str(DEMO_DIR / "traces.jsonl")], env=env, check=True, capture_output=True)
    sqlite3.connect(tmp_path / "relay.sqlite").close()  # the ledger beside it exists, as after a first run
    real = sqlite3.connect

    def read_only(path: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.pop("uri", None)
        return real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)

    monkeypatch.setattr(store_module.sqlite3, "connect", read_only)
    monkeypatch.setattr(ledger_module.sqlite3, "connect", read_only)

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the relay served a store it cannot write")

    monkeypatch.setattr("triage.relay.server.serve", never)
    for key in [k for k in os.environ if k.startswith(("TRIAGE_", "LANGFUSE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TRIAGE_STORE", str(store))
    done = CliRunner().invoke(cli, ["relay", "--port", str(free_port())], prog_name="triage")
    assert done.exit_code == 3, (done.output, done.exception)
    assert "store.sqlite" in done.output or "relay.sqlite" in done.output, done.output
