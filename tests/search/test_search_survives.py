"""The re-search survives what a night throws at it, and stops asking what keeps failing (#27).

- a real `triage index serve` restarted in the middle of a real `triage feedback` run, and one that
  drops the run's session mid-run: the client opens a new session, every trace is triaged, exit 0;
- a live server whose backend fails every search: each collection's breaker stops calling it, and
  every trace is listed with the reason, exit 4; a probe uses the backend again once it is back;
- configuration errors found at the first contact (nothing at the MCP path, a tool the server
  lacks, a server with no tools): exit 3, before any trace is judged.

The servers are real: `triage index serve` subprocesses over the shared corpus, or MCP servers of
the `mcp` package run by uvicorn in a thread, reached over HTTP on 127.0.0.1. Sessions exist only
under the 2025-11-25 handshake (a 2026-07-28 server keeps none), so the tests of lost sessions serve
the handshake only, as the docs agent's fastmcp 3.4 does (`tests/doubles/mcp_generations.py`);
tests/search/test_mcp_generations.py has the stateless revision.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
import uvicorn
from click.testing import CliRunner
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp

from tests.doubles import mcp_generations as generations
from tests.doubles.clock import VirtualClock
from tests.doubles.fakes import FakeJudge, FakeSearcher, FakeSource
from tests.factories import NOW, trace_line
from tests.search.test_mcp import TOOLS, _free_port, _serve_command, _wait_for_port, needs_corpus
from triage.app import run_setup
from triage.cli import cli
from triage.domain.records import Passage
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.errors import ConfigError, ExitCode, SearchError, SearchSuspended
from triage.retry import use_clock
from triage.search.mcp_client import (
    MCP_RETRY,
    Admission,
    Breaker,
    BreakerPolicy,
    McpSearcher,
    SearchFailed,
    signature,
)
from triage.settings import load_config
from triage.sources.store import Store

FAILED = "Search failed: <MilvusException: (code=2, message=Fail connecting to server on milvus:19530)>"
TOPICS = [
    "the number of parallel Katib trials",
    "caching for one pipeline task",
    "idle notebook culling",
    "a contributor on my profile",
    "a file metrics collector",
]


def _import_traces(n: int) -> list[str]:
    """`n` thumbs-down traces whose agent retrieved nothing useful, so each verdict needs the
    re-search (does the index hold the answer?); every question, comment and agent query distinct."""
    at = datetime.now(UTC) - timedelta(hours=2)
    rows = [
        trace_line(
            f"t{i:03d}",
            f"How do I set up {TOPICS[i % len(TOPICS)]} (case {i})?",
            "No idea.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile.")],
            comment=f"that did not help {i}",
            at=at,
        )
        for i in range(n)
    ]
    with Store(os.environ["TRIAGE_STORE"]) as store:
        store.import_lines([json.dumps(row) for row in rows], "test")
    return [row["traceId"] for row in rows]


# ---------------------------------------------------------------------------------------------
# real processes: `triage index serve` and `triage feedback`


class _Process:
    """A subprocess whose standard error is read line by line as it comes."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8"
        )
        self.stdout = ""
        self._readers = [
            threading.Thread(target=self._read_err, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    @property
    def stderr(self) -> str:
        with self._seen:
            return "".join(self.lines)

    def wait_for(self, text: str, limit: float = 60.0) -> None:
        with self._seen:
            if not self._seen.wait_for(lambda: any(text in line for line in self.lines), timeout=limit):
                raise AssertionError(f"no {text!r} within {limit} s; stderr so far:\n{''.join(self.lines)}")

    def finish(self, limit: float = 180.0) -> int:
        code = self.proc.wait(timeout=limit)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish(limit=20)


def _index_server(port: int, handshake_only: bool = False) -> _Process:
    """`triage index serve` over the corpus on `port`; its log one line per record (a wide
    terminal for the `rich` handler the MCP server logs through). `handshake_only`: the same index
    and tools served as the docs agent's fastmcp 3.4 serves (the 2025-11-25 handshake only, JSON
    bodies), by `tests/doubles/mcp_generations.py`: the one generation with sessions to lose."""
    command = _serve_command("--host", "127.0.0.1", "--port", str(port))
    if handshake_only:
        folders = [arg for flag, arg in zip(command, command[1:], strict=False) if flag == "--folder"]
        command = [sys.executable, "-m", "tests.doubles.mcp_generations", "--port", str(port)]
        command += ["--kind", "handshake-only", "--json", *(f"--folder={folder}" for folder in folders)]
    server = _Process(command, env={**os.environ, "COLUMNS": "400"})
    try:
        _wait_for_port(port, limit=30.0)
    except BaseException:
        server.kill()
        raise
    return server


def _feedback(url: str) -> _Process:
    return _Process(
        [sys.executable, "-m", "triage", "feedback", "--report"], env={**os.environ, "TRIAGE_MCP_URL": url}
    )


def _assert_all_triaged(run: _Process, n: int) -> None:
    code = run.finish()
    assert code == 0, run.stderr[-3000:]
    assert f"{n} thumbs-down: {n} triaged, 0 not triaged" in run.stdout
    # the proof the server went away mid-run and the run carried on: its session was renewed
    assert "search session 2 open at" in run.stderr, run.stderr[-3000:]


@needs_corpus
def test_a_server_restarted_mid_run_costs_no_trace() -> None:
    n = 120
    _import_traces(n)
    port = _free_port()
    server = _index_server(port)
    url = f"http://127.0.0.1:{port}/mcp"
    run = _feedback(url)
    try:
        run.wait_for("to triage")  # the session is open and the traces start streaming
        time.sleep(0.5)  # some searches made on the first session (120 traces take about 4 s)
        assert run.proc.poll() is None
        server.kill()  # the Pod is replaced: gone at once, back on the same address moments later
        server = _index_server(port)
        _assert_all_triaged(run, n)
    finally:
        run.kill()
        server.kill()


_SESSION_ID = re.compile(r"Created new transport with session ID: ([0-9a-f]{16,})")


@needs_corpus
def test_a_server_that_drops_the_session_mid_run_costs_no_trace() -> None:
    n = 120
    _import_traces(n)
    port = _free_port()
    server = _index_server(port, handshake_only=True)
    url = f"http://127.0.0.1:{port}/mcp"
    run = _feedback(url)
    try:
        run.wait_for("to triage")
        time.sleep(0.5)
        assert run.proc.poll() is None
        sessions = _SESSION_ID.findall(server.stderr)
        assert sessions, server.stderr
        # the server ends the session, as an idle time-out or an eviction would: from now on it
        # answers that session's requests 404 "Session not found"
        for session in sessions:
            httpx.delete(url, headers={"mcp-session-id": session}, timeout=10).raise_for_status()
        _assert_all_triaged(run, n)
        assert len(_SESSION_ID.findall(server.stderr)) == len(sessions) + 1  # the new session
    finally:
        run.kill()
        server.kill()


# ---------------------------------------------------------------------------------------------
# MCP servers of the `mcp` package, in a thread


@contextmanager
def _serving(app: ASGIApp) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    _wait_for_port(port)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class _Backend:
    """The docs agent's three tools over a vector store that can be down (`down`), or hang for
    `hang` seconds; `calls` counts the searches that reached it."""

    def __init__(self, down: bool = False, hang: float = 0.0) -> None:
        self.down, self.hang = down, hang
        self.hold = False  # calls wait, counted in `held`, until it is cleared
        self.held = 0
        self.calls = 0
        self.first_call: float | None = None
        self.server = MCPServer("fake docs agent")
        for name in TOOLS:
            self.server.add_tool(self._tool(name), name=name, structured_output=False)

    def _tool(self, name: str) -> Any:
        async def search(query: str, top_k: int = 5) -> str:
            self.calls += 1
            self.first_call = self.first_call or time.monotonic()
            if self.hang:
                await anyio.sleep(self.hang)
            if self.hold:
                self.held += 1
                while self.hold:
                    await anyio.sleep(0.01)
            if self.down:
                return FAILED
            return f"### Result 1 (score: 1.0000)\n**Source:** https://example.test/{name}\n\n{query}\n"

        return search

    def app(self, json_response: bool = False, handshake_only: bool = False) -> ASGIApp:
        """The server (both protocol generations), or `handshake_only` as the docs agent's fastmcp 3.4
        is: sessions exist only under the 2025-11-25 handshake (2026-07-28 keeps none to lose)."""
        app = self.server.streamable_http_app(host="127.0.0.1", json_response=json_response)
        return generations.handshake_only(app) if handshake_only else app


def test_a_backend_failing_every_search_is_asked_a_bounded_number_of_times(tmp_path: Path) -> None:
    n = 100
    traces = _import_traces(n)
    backend = _Backend(down=True)
    # no waiting for the backend to come back (that is `test_no_verdict_without_search`'s, in
    # virtual time): this one measures the calls a night makes to a backend that stays down
    config = tmp_path / "triage.toml"
    config.write_text("[search]\noutage_wait_seconds = 0\n")
    with _serving(backend.app()) as url:
        result = CliRunner().invoke(
            cli, ["feedback", "--report"], env={"TRIAGE_MCP_URL": url, "TRIAGE_CONFIG": str(config)},
            catch_exceptions=False,
        )  # fmt: skip
        ended = time.monotonic()
    # The real behaviour: the breakers stop the calls. 100 traces x 3 collections x 2 queries (the
    # question, and the question with the comment; the agent searched the question itself) are
    # 600 searches, and the code before the breakers made all 600. Each collection's breaker lets
    # 5 failures through, plus at most the 7 others already under way (8 at once), and no probe
    # comes due within its 30 s (24 calls in all, measured).
    assert backend.calls <= len(TOOLS) * (5 + 7), backend.calls
    assert result.exit_code == 4, result.output
    assert f"{n} thumbs-down: 0 triaged, {n} not triaged" in result.stdout
    assert f"## Not triaged ({n})" in result.stdout
    # each trace listed with the reason: the backend's own failure, or the breaker's suspension
    # that quotes it
    undecided = dict(re.findall(r"undecided (t\d+): (.*)", result.stderr))
    assert sorted(undecided) == traces
    for reason in undecided.values():
        assert reason.startswith("search unavailable ("), reason
        assert "Fail connecting to server on milvus" in reason, reason
    assert "searches of the docs collection suspended after 5 identical failures in a row" in result.stderr
    # The issue's bound (the run ends within 30 s of the first failures), asserted generously: a
    # failure here is instant, so a breaker-less run is slow only by its hundreds of calls; the
    # number of calls above is the measure that matters (speed is for the benchmarks).
    assert backend.first_call is not None and ended - backend.first_call < 30.0


@pytest.mark.anyio
async def test_time_outs_open_the_breaker_and_a_probe_finds_the_backend_back() -> None:
    clock = VirtualClock()
    backend = _Backend(hang=5.0)
    policy = BreakerPolicy(threshold=3, probe_seconds=30.0)
    with _serving(backend.app()) as url:
        searcher = McpSearcher(url=url, tools=TOOLS, timeout=0.3, concurrency=1, breaker=policy, clock=clock)
        async with searcher:
            for i in range(3):
                with pytest.raises(SearchFailed, match="timed out"):
                    await searcher.search(f"q{i}", "docs", 5)
            assert backend.calls == 3
            # open: refused at once, the backend not asked, the reason given
            with pytest.raises(SearchSuspended, match=r"docs collection suspended after 3 .*timed out"):
                await searcher.search("q3", "docs", 5)
            assert backend.calls == 3
            # the other collections have breakers of their own
            with pytest.raises(SearchFailed):
                await searcher.search("q3", "code", 5)
            # the probe: 30 s later one search goes through; the backend is still slow
            clock.elapsed += 30.0
            with pytest.raises(SearchFailed, match="timed out"):
                await searcher.search("q4", "docs", 5)
            with pytest.raises(SearchSuspended):
                await searcher.search("q5", "docs", 5)
            assert backend.calls == 5
            # the backend is back: the next probe answers, and the collection is searched again
            backend.hang = 0.0
            clock.elapsed += 30.0
            assert await searcher.search("q6", "docs", 5)
            assert await searcher.search("q7", "docs", 5)
            assert searcher.breakers["docs"].refused == 2 and not searcher.breakers["docs"].is_open


class _IssuesSuspended(FakeSearcher):
    """Every collection answers (nothing found) but issues, whose breaker is open."""

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        if collection == "issues":
            raise SearchSuspended("issues", f"searches of the issues collection suspended: {FAILED}")
        return await super().search(query, collection, top_k)


@pytest.mark.parametrize(
    ("facts", "layer"),
    [
        # "nothing in the index holds it" cannot be known with a collection unsearched
        ({"retrieved_has_answer": False, "index_has_answer": False, "answer_declined": True}, None),
        # nor anything else: the passages the issues would have added can change every fact (an
        # answer found in the docs may be outranked by a clearer one in the issues), and the judge
        # is not even asked (#37 item 1)
        ({"retrieved_has_answer": False, "index_has_answer": True, "answer_collection": "docs"}, None),
    ],
)
def test_a_trace_that_needs_a_suspended_collection_is_listed_with_the_reason(
    facts: dict[str, Any], layer: str | None
) -> None:
    row = trace_line(
        "gap",
        "Can Katib post a Slack message when an experiment is done?",
        "I could not find that.",
        [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile.")],
    )
    judge = FakeJudge().enqueue(facts)
    clock = VirtualClock()
    with use_clock(clock):  # the run waits out the suspension (in virtual time), then lists it
        result = asyncio.run(
            run_feedback(
                sources=Sources.of(FakeSource.from_rows([row])),
                judge=judge,
                config=load_config(),
                options=RunOptions(now=NOW, concurrency=1, progress_seconds=0.0),
                setup=run_setup(RunOptions(now=NOW, concurrency=1, progress_seconds=0.0), load_config()),
                searcher=_IssuesSuspended(answers={}),
            )
        )
    assert judge.history == [] and clock.elapsed == load_config().search.outage_wait_seconds
    if layer is not None:
        assert [e.layer.value for e in result.entries] == [layer] and result.exit_code == ExitCode.OK
        return
    [listed] = result.skipped
    assert listed.undecided.kind == "unavailable" and result.entries == []
    assert listed.undecided.reason.startswith(
        "search unavailable (the issues collection: searches of the issues collection suspended"
    )
    assert result.exit_code == ExitCode.DEGRADED


# ---------------------------------------------------------------------------------------------
# lost sessions and a server that goes away, against the client


@pytest.mark.anyio
async def test_a_forgotten_session_is_replaced_and_the_search_made_again_on_it() -> None:
    backend = _Backend()
    with _serving(backend.app(handshake_only=True)) as url:
        async with McpSearcher(url=url, tools=TOOLS) as searcher:
            assert await searcher.search("before", "docs", 5)
            manager = backend.server.session_manager
            # the server forgets every session (a restart behind the same address, another
            # replica): it now answers the client's session 404 "Session not found"
            manager._server_instances.clear()
            found = await searcher.search("after", "docs", 5)
            assert [p.text for p in found] == ["after"]
            assert searcher.sessions == 2
            assert searcher.calls == 3  # "after" twice: on the lost session, then on the new one
            assert len(manager._server_instances) == 1


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
@pytest.mark.anyio
async def test_calls_in_flight_when_the_server_ends_the_session_are_made_again_on_a_new_one(
    json_response: bool,
) -> None:
    """The server ends the session (idle time-out, eviction, DELETE) while searches wait on it. In
    JSON-response mode it answers each of them 500 / INTERNAL_ERROR "Session terminated before the
    request completed" (`triage index serve` runs that way): a lost session, not a failed search."""
    backend = _Backend()
    with _serving(backend.app(json_response=json_response, handshake_only=True)) as url:
        async with McpSearcher(url=url, tools=TOOLS) as searcher, anyio.create_task_group() as group:
            found: dict[str, list[str]] = {}

            async def search(query: str) -> None:
                found[query] = [p.text for p in await searcher.search(query, "docs", 5)]

            backend.hold = True
            for query in ("one", "two", "three"):
                group.start_soon(search, query)
            with anyio.fail_after(10):
                while backend.held < 3:
                    await anyio.sleep(0.01)
            manager = backend.server.session_manager
            [session] = list(manager._server_instances)
            async with httpx.AsyncClient() as client:
                (await client.delete(url, headers={"mcp-session-id": session})).raise_for_status()
            backend.hold = False
        assert found == {"one": ["one"], "two": ["two"], "three": ["three"]}
        assert searcher.sessions == 2
        assert backend.calls == 6  # each search reached the backend on both sessions


@needs_corpus
@pytest.mark.anyio
async def test_a_server_down_for_longer_fails_searches_at_once_and_is_probed_until_back() -> None:
    clock = VirtualClock()
    port = _free_port()
    server = _index_server(port)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with McpSearcher(url=url, tools=TOOLS, timeout=5.0, retry=MCP_RETRY.with_(clock=clock)) as searcher:
            assert await searcher.search("katib", "docs", 1)
            server.kill()
            # renewing fails (six connects, the waits in virtual time): the search fails ...
            with pytest.raises(SearchError, match="unreachable"):
                await searcher.search("pipelines", "docs", 1)
            assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]
            # ... and the next ones at once, without a connect, until a probe is due
            calls = searcher.calls
            with pytest.raises(SearchError, match="unreachable"):
                await searcher.search("notebooks", "docs", 1)
            assert searcher.calls == calls
            server = _index_server(port)
            clock.elapsed += 30.0
            assert await searcher.search("notebooks", "docs", 1)
            assert searcher.sessions == 2
    finally:
        server.kill()


# ---------------------------------------------------------------------------------------------
# configuration errors at the first contact: exit 3 before any trace is judged


def _assert_config_error_before_judging(result: Any, message: str) -> None:
    assert result.exit_code == 3, result.output
    assert message in result.stderr
    assert "to triage" not in result.stderr  # the run never planned, let alone judged, a trace
    assert "undecided" not in result.stderr and result.stdout == ""


@needs_corpus
def test_a_wrong_mcp_path_is_a_config_error_before_any_trace_is_judged() -> None:
    _import_traces(3)
    port = _free_port()
    server = _index_server(port)
    try:
        started = time.monotonic()
        result = CliRunner().invoke(
            cli, ["feedback", "--report"], env={"TRIAGE_MCP_URL": f"http://127.0.0.1:{port}/wrong"}
        )
        took = time.monotonic() - started
    finally:
        server.kill()
    _assert_config_error_before_judging(result, "answered HTTP 404 at the MCP path")
    assert "TRIAGE_MCP_URL" in result.stderr
    assert took < 5.0  # not retried: a wrong path stays wrong (three attempts took 3 s and more)


@needs_corpus
def test_an_unknown_tool_is_a_config_error_before_any_trace_is_judged(tmp_path: Path) -> None:
    _import_traces(3)
    config = tmp_path / "triage.toml"
    config.write_text('[tools]\nsearch_kubeflow_docs = "docs"\nsearch_slack_threads = "slack"\n')
    port = _free_port()
    server = _index_server(port)
    try:
        env = {"TRIAGE_MCP_URL": f"http://127.0.0.1:{port}/mcp", "TRIAGE_CONFIG": str(config)}
        result = CliRunner().invoke(cli, ["feedback", "--report"], env=env)
    finally:
        server.kill()
    _assert_config_error_before_judging(result, "has no tool search_slack_threads")


def test_a_server_with_no_tools_is_a_config_error_before_any_trace_is_judged() -> None:
    _import_traces(3)
    with _serving(Server("prompts only").streamable_http_app(host="127.0.0.1")) as url:
        result = CliRunner().invoke(cli, ["feedback", "--report"], env={"TRIAGE_MCP_URL": url})
    _assert_config_error_before_judging(result, "offers no tools")


@pytest.mark.anyio
async def test_tools_listed_over_several_pages_are_all_seen() -> None:
    names = list(TOOLS)

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        page = int(params.cursor) if params and params.cursor else 0
        tool = types.Tool(name=names[page], input_schema={"type": "object"})
        return types.ListToolsResult(tools=[tool], next_cursor=str(page + 1) if page + 1 < len(names) else None)

    server = Server("paged", on_list_tools=list_tools)
    with _serving(server.streamable_http_app(host="127.0.0.1")) as url:
        async with McpSearcher(url=url, tools=TOOLS, retry=MCP_RETRY.with_(clock=VirtualClock())) as searcher:
            assert searcher.server_name == "paged"


@pytest.mark.anyio
async def test_a_404_at_the_first_contact_is_not_retried() -> None:
    clock = VirtualClock()
    with _serving(_Backend().app()) as url:
        with pytest.raises(ConfigError, match=r"answered HTTP 404 at the MCP path: .*TRIAGE_MCP_URL"):
            async with McpSearcher(url=url + "/nothing-here", tools=TOOLS, retry=MCP_RETRY.with_(clock=clock)):
                pass
    assert clock.sleeps == []


# ---------------------------------------------------------------------------------------------
# the breaker alone


def test_only_identical_failures_in_a_row_open_the_breaker() -> None:
    clock = VirtualClock()
    breaker = Breaker("docs", BreakerPolicy(threshold=3, probe_seconds=10.0), clock)
    fail = "search tool t: Search failed: timeout after {} ms (request {})"
    for i in range(2):
        breaker.failed(breaker.admit(), fail.format(100 + i, i))  # digits differ: still identical
    breaker.failed(breaker.admit(), "search tool t: Search failed: index missing")  # another failure
    breaker.failed(breaker.admit(), fail.format(1, 1))
    breaker.succeeded(breaker.admit())  # an answer starts the count again
    for i in range(2):
        breaker.failed(breaker.admit(), fail.format(i, i))
    breaker.released(breaker.admit())  # a rejected query says nothing about the backend
    assert not breaker.is_open
    breaker.failed(breaker.admit(), fail.format(7, 7))
    assert breaker.is_open
    with pytest.raises(SearchSuspended) as refused:
        breaker.admit()
    assert refused.value.collection == "docs" and "timeout after 7 ms" in str(refused.value)
    # one probe at a time, every probe_seconds; a probe that ends saying nothing frees the turn
    clock.elapsed += 10.0
    probe = breaker.admit()
    assert probe == Admission(probe=True)
    with pytest.raises(SearchSuspended):
        breaker.admit()
    breaker.released(probe)
    breaker.succeeded(breaker.admit())
    assert not breaker.is_open and breaker.opened == 1 and breaker.refused == 2


def test_failure_signatures_mask_digits_and_spacing() -> None:
    assert signature("Search failed:  port 19530\n(id 12)") == signature("search failed: port 1 (id 9)")
    assert signature("Search failed: a") != signature("Search failed: b")
