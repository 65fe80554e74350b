"""The MCP client speaks both generations of the protocol (#37 item 5), against real servers.

The 2025-11-25 handshake (`initialize`, a session) and the stateless 2026-07-28 revision (no
handshake, no session, `server/discover`): the client negotiates the newest revision a server offers
(the SDK's own `mode="auto"`) and falls back to the handshake. Servers, each a subprocess on
127.0.0.1 serving the demo index (`tests/doubles/mcp_generations.py`): the `mcp` SDK's in its three
modes (both generations), one that speaks ONLY 2026-07-28 (the handshake refused with -32022, as the
TypeScript SDK's `legacy: 'reject'`), one that speaks only the handshake (as the docs agent's
fastmcp 3.4), and fastmcp 4. For each, the demo's 29 traces come out with the facts and layers of
the in-process run although the server is killed and started again in the middle of the run.

Then what the revision asks of a client: a request whose stream broke is sent again under a new
id, and a refusal of the protocol (-32022, -32020) is a configuration error (exit 3), never retried.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.doubles import mcp_generations as generations
from tests.doubles.clock import VirtualClock
from tests.search.test_mcp import _free_port, _wait_for_port
from tests.search.test_search_survives import _import_traces, _serving
from triage.app import DEMO_DIR, demo_index_folders, demo_shift, run_setup
from triage.cli import cli
from triage.domain.outcome import RunResult
from triage.domain.records import Passage
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.errors import ConfigError
from triage.judges.heuristic import HeuristicJudge
from triage.search.index import Index
from triage.search.local import LocalSearcher
from triage.search.mcp_client import MCP_RETRY, McpSearcher
from triage.settings import load_config
from triage.sources.store import Store

NOW = datetime.now(UTC)
#: a revision this client does not speak
FUTURE = "2099-01-01"

try:
    import fastmcp  # noqa: F401

    HAS_FASTMCP = True
except ImportError:  # pragma: no cover - the test extra installs it
    HAS_FASTMCP = False


# ---------------------------------------------------------------------------------------------
# the demo, in process and through a server


@dataclass(frozen=True)
class Outcome:
    """What a demo run decided: each trace's layer and component, and its facts as written."""

    layers: dict[str, tuple[str, str | None]]
    facts: dict[str, dict[str, Any]]
    skipped: list[str]
    exit_code: int


def _demo(searcher: Any, folder: Path) -> Outcome:
    """`triage demo`'s run (`triage.app.run_demo`) with `searcher` for the re-search."""
    traces = DEMO_DIR / "traces.jsonl"
    facts_file = folder / "facts.jsonl"
    with Store(folder / "demo.sqlite") as store:
        store.import_file(traces, shift=demo_shift(traces, NOW))
        result: RunResult = asyncio.run(
            run_feedback(
                sources=Sources.of(store),
                judge=HeuristicJudge(),
                config=load_config(),
                options=RunOptions(now=NOW, facts_file=facts_file, progress_seconds=0.0),
                setup=run_setup(RunOptions(now=NOW, facts_file=facts_file, progress_seconds=0.0), load_config()),
                searcher=searcher,
            )
        )
    facts = [json.loads(line) for line in facts_file.read_text().splitlines()]
    return Outcome(
        layers={e.trace_id: (e.layer.value, e.component) for e in result.entries},
        facts={row["trace_id"]: row for row in facts},
        skipped=[f"{s.undecided.trace_id}: {s.undecided.reason}" for s in result.skipped],
        exit_code=int(result.exit_code),
    )


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    folder = tmp_path_factory.mktemp("in-process")
    outcome = _demo(LocalSearcher(Index.from_folders(demo_index_folders())), folder)
    assert len(outcome.layers) == 29 and outcome.skipped == [] and outcome.exit_code == 0
    return outcome


class _Server:
    """`tests/doubles/mcp_generations.py` serving the demo index in a subprocess on `port`; the
    first one holds every search past the `hold_after`th (`holding` is set once one is held)."""

    def __init__(self, port: int, args: list[str], hold_after: int) -> None:
        self.port, self.args = port, args
        self.starts = 0
        self.holding = threading.Event()
        self.proc = self._start(["--hold-after", str(hold_after)])

    def _start(self, more: list[str]) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "tests.doubles.mcp_generations", "--port", str(self.port), *self.args, *more]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        try:
            _wait_for_port(self.port, limit=60.0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        self.starts += 1
        return proc

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("holding search"):
                self.holding.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def restart(self) -> None:
        """The Pod replaced: gone at once (SIGKILL: no goodbye), back on the same address."""
        self.proc.kill()
        self.proc.wait()
        self.proc = self._start([])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@dataclass
class _RestartingMidRun:
    """The run's searcher (`inner`), and a task that restarts `server` once it holds a search: the
    searches under way then were sent and never answered. The restart blocks the event loop, so
    the new server is up by the time they go on (no wait to time)."""

    inner: McpSearcher
    server: _Server
    _group: Any = None
    #: searches under way when the server was restarted (None: not restarted)
    restarted_with: int | None = None
    under_way: int = 0
    started: int = 0

    async def __aenter__(self) -> _RestartingMidRun:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._restart_when_held)
        await self.inner.__aenter__()
        return self

    async def _restart_when_held(self) -> None:
        while not self.server.holding.is_set():
            await anyio.sleep(0.01)
        self.restarted_with = self.under_way
        self.server.restart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        self.started += 1
        self.under_way += 1
        try:
            return await self.inner.search(query, collection, top_k)
        finally:
            self.under_way -= 1

    @property
    def made_again(self) -> int:
        """Calls made more than once: every call, less one per search that was not a cache hit."""
        return self.inner.calls - (self.started - self.inner.cache_hits)


KINDS = [
    pytest.param(["--kind", "sdk"], LATEST_MODERN_VERSION, id="mcp-sse"),
    pytest.param(["--kind", "sdk", "--stateless"], LATEST_MODERN_VERSION, id="mcp-stateless"),
    pytest.param(["--kind", "sdk", "--json"], LATEST_MODERN_VERSION, id="mcp-json"),
    pytest.param(["--kind", "modern-only"], LATEST_MODERN_VERSION, id="2026-only-sse"),
    pytest.param(["--kind", "modern-only", "--json"], LATEST_MODERN_VERSION, id="2026-only-json"),
    pytest.param(["--kind", "handshake-only"], LATEST_HANDSHAKE_VERSION, id="handshake-only"),
    pytest.param(["--kind", "handshake-only", "--json"], LATEST_HANDSHAKE_VERSION, id="handshake-only-json"),
    pytest.param(
        ["--kind", "fastmcp"],
        LATEST_MODERN_VERSION,
        id="fastmcp4",
        marks=pytest.mark.skipif(not HAS_FASTMCP, reason="fastmcp 4 is not installed (the test extra has it)"),
    ),
]


@pytest.mark.parametrize(("args", "version"), KINDS)
def test_the_demo_through_each_server_restarted_mid_run_is_the_in_process_run(
    args: list[str], version: str, in_process: Outcome, tmp_path: Path
) -> None:
    server = _Server(_free_port(), args, hold_after=40)  # of the run's 231 searches
    try:
        searcher = _RestartingMidRun(McpSearcher(url=server.url, tools=load_config().tools), server)
        outcome = _demo(searcher, tmp_path)
    finally:
        server.stop()
    assert outcome.skipped == [] and outcome.exit_code == 0
    assert outcome.layers == in_process.layers
    assert outcome.facts == in_process.facts
    # the server went away with searches sent and unanswered, and came back: each was made again
    assert server.starts == 2 and searcher.restarted_with, searcher
    assert searcher.made_again >= 1, searcher
    assert searcher.inner.protocol_version == version
    if version == LATEST_HANDSHAKE_VERSION:
        assert searcher.inner.sessions == 2  # the restarted server forgot the session: renewed


# ---------------------------------------------------------------------------------------------
# a protocol refused: configuration, exit 3, never retried


@pytest.fixture
def future_server() -> Iterator[str]:
    """A server that speaks only a revision newer than any this client knows."""
    with _serving(generations.refusing([FUTURE])) as url:
        yield url


@pytest.mark.anyio
async def test_a_server_refusing_every_revision_we_speak_is_a_config_error_not_retried(future_server: str) -> None:
    clock = VirtualClock()
    refused = rf"refused the MCP protocol \(MCP error -32022.*it speaks {FUTURE}"
    with pytest.raises(ConfigError, match=refused) as caught:
        async with McpSearcher(url=future_server, tools=load_config().tools, retry=MCP_RETRY.with_(clock=clock)):
            pass
    assert LATEST_MODERN_VERSION in str(caught.value) and "TRIAGE_MCP_URL" in str(caught.value)
    assert clock.sleeps == []  # one attempt: the versions a server speaks do not change in a second


def test_a_refused_protocol_ends_the_night_with_exit_3_before_any_trace_is_judged(future_server: str) -> None:
    _import_traces(3)
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["feedback", "--report"], env={"TRIAGE_MCP_URL": future_server})
    took = time.monotonic() - started
    assert result.exit_code == 3, result.output
    assert "refused the MCP protocol" in result.stderr
    assert "unreachable" not in result.stderr
    assert "to triage" not in result.stderr and "undecided" not in result.stderr and result.stdout == ""
    assert took < 5.0  # not retried (three attempts took 3 s and more)


# ---------------------------------------------------------------------------------------------
# what the 2026-07-28 revision asks of a client mid-run, against the SDK's 2026-07-28 handler


@dataclass
class _Tampering:
    """ASGI middleware in front of a 2026-07-28 server, doing `answer` to the tool calls it picks
    (`pick(n)`, n counting the tool calls from 1) instead of passing them on; records the tool
    calls' JSON-RPC ids."""

    app: ASGIApp
    pick: Callable[[int], bool]
    answer: Callable[[Send], Awaitable[None]]
    ids: list[Any] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or dict(scope["headers"]).get(b"mcp-method") != b"tools/call":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if not body:  # the client went away before sending it (a run ending)
            return
        self.ids.append(json.loads(body)["id"])
        if self.pick(len(self.ids)):
            await self.answer(send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _stream_without_a_response(send: Send) -> None:
    """A response stream that ends before the response: a restart, a proxy cutting it."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b": keep-alive\n\n"})


async def _header_mismatch(send: Send) -> None:
    """What a 2026-07-28 server answers when a request's headers do not match its body (-32020),
    e.g. behind a proxy that rewrites them."""
    error = {"code": -32020, "message": "Header mismatch: Mcp-Name does not match params.name"}
    payload = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def _modern_app() -> ASGIApp:
    return generations.index_app("modern-only")


@pytest.mark.anyio
async def test_a_broken_stream_is_sent_again_under_a_new_id_on_the_same_session() -> None:
    tampering = _Tampering(_modern_app(), pick=lambda n: n == 1, answer=_stream_without_a_response)
    tools: Mapping[str, str] = load_config().tools
    with _serving(tampering) as url:
        async with McpSearcher(url=url, tools=tools) as searcher:
            found = await searcher.search("katib early stopping", "docs", 2)
            assert searcher.protocol_version == LATEST_MODERN_VERSION
            assert searcher.sessions == 1 and searcher.calls == 2  # no renewal: nothing to renew
    assert len(found) == 2 and all(p.source_url for p in found)
    assert len(tampering.ids) == 2 and tampering.ids[0] != tampering.ids[1]
    assert not searcher.breakers["docs"].is_open


@pytest.mark.anyio
async def test_a_header_mismatch_mid_run_is_a_config_error_not_a_failed_search() -> None:
    tampering = _Tampering(_modern_app(), pick=lambda n: True, answer=_header_mismatch)
    with _serving(tampering) as url:
        async with McpSearcher(url=url, tools=load_config().tools) as searcher:
            with pytest.raises(ConfigError, match=r"refused the MCP protocol \(MCP error -32020"):
                await searcher.search("katib early stopping", "docs", 2)
            # the SDK re-listed the tools and sent it once more, as the revision says; then it is ours
            assert len(tampering.ids) == 2 and searcher.calls == 1
            assert searcher.breakers["docs"].refused == 0 and not searcher.breakers["docs"].is_open


def test_a_protocol_refused_mid_run_ends_the_night_with_exit_3() -> None:
    _import_traces(3)
    tampering = _Tampering(_modern_app(), pick=lambda n: True, answer=_header_mismatch)
    with _serving(tampering) as url:
        result = CliRunner().invoke(cli, ["feedback", "--report"], env={"TRIAGE_MCP_URL": url})
    assert result.exit_code == 3, result.output
    assert "refused the MCP protocol (MCP error -32020" in result.stderr and "Mcp-* headers" in result.stderr
    assert "unreachable" not in result.stderr and "search unavailable" not in result.stderr

