"""What a `triage feedback` process imports: its resident memory is mostly the libraries it loads.

Each run is the real command in a fresh interpreter (`python -m triage`), which lists the
top-level packages in `sys.modules` as it exits. The embedded store with the heuristic judge
needs no model client, no MCP stack and no Langfuse; with Langfuse the source speaks plain JSON
and must not import the `langfuse` SDK, whose top-level package loads OpenTelemetry's SDK,
protobuf and numpy (about 18 MB; bench/README.md, "Memory").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.factories import katib_traces

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MARK = "imported-packages:"

# run the real entry point; list the top-level packages at exit (after the command's sys.exit)
PROBE = f"""
import atexit, runpy, sys
atexit.register(lambda: print({MARK!r}, *sorted({{m.split(".")[0] for m in sys.modules}}), file=sys.stderr))
sys.argv = ["triage", *sys.argv[1:]]
runpy.run_module("triage", run_name="__main__")
"""

#: never needed by these runs: the LLM judge's client, the MCP client and server stack, the
#: Langfuse SDK and what its top level brings (tracing, protobuf, numpy)
HEAVY = {"openai", "mcp", "mcp_types", "langfuse", "numpy", "opentelemetry", "google", "starlette", "uvicorn"}


def packages(args: list[str], env: Mapping[str, str]) -> tuple[set[str], str]:
    """The top-level packages the command had imported when it exited, and its log."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "LANGFUSE_", "OPENAI_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**clean, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stderr.splitlines() if line.startswith(MARK))
    return set(line.removeprefix(MARK).split()), done.stderr


def test_feedback_on_the_embedded_store_with_the_heuristic_judge(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    packages(["demo", "--store", str(store)], {})  # the demo's votes and traces, in a store we keep
    loaded, log = packages(["feedback", "--since-hours", "24", "--force"], {"TRIAGE_STORE": str(store)})
    assert "triaged 29, not triaged 0" in log  # the run did the work
    assert loaded & HEAVY == set()


def test_feedback_on_langfuse_does_not_import_the_langfuse_sdk() -> None:
    now = datetime.now(UTC)
    traces = katib_traces("t", 3, now - timedelta(hours=2))
    with LangfuseStandIn(records=traces) as server:
        env = server.env
        loaded, _ = packages(["feedback", "--since-hours", "24", "--write", "--judge", "heuristic"], env)
        # the run read the project (links) and wrote both scores per trace as a list
        assert server.requests("/api/public/projects")
        assert len(server.score_rows()) >= 2 * len(traces)
    assert "httpx" in loaded
    assert loaded & HEAVY == set()
