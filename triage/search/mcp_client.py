"""Re-search the index through an MCP search server (the agent's own, or `triage index serve`).

One session per run, over streamable HTTP (optional bearer token) or stdio (a command line). The
session lives in a background task of its own, so a transport that dies mid-run fails the calls in
flight (as `SearchError`, one trace each) instead of cancelling the caller. Calls share the session,
at most `concurrency` at a time, each with a deadline; identical calls are made once.

Errors: server down or unreachable (after 3 connect attempts) -> `SearchError`; bearer token
refused (401/403) -> `ConfigError`; a configured tool the server lacks -> `ConfigError`; a tool
error result or the docs agent's "Search failed: ..." / "Search rejected: ..." text -> `SearchError`.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from triage.domain.records import Passage
from triage.errors import ConfigError, SearchError, TriageError, leaves
from triage.reading.passages import ERROR_PREFIXES, passages_from_output
from triage.retry import RetryPolicy

TOKEN_SETTING = "TRIAGE_MCP_TOKEN"


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a bearer token may hold

#: connecting: 3 attempts, 1 s then 2 s apart (a server starting beside the job gets a moment)
MCP_RETRY = RetryPolicy(attempts=3, initial=1.0, maximum=2.0, jitter=0.0)

#: answers kept for identical calls. Small on purpose: the Researcher in front of this client
#: already shares identical queries (its own bounded cache), and each answer holds top_k passages
#: of up to a few KB: 4096 answers were about 20-25 MB of a night's peak RSS, flat only once full.
CACHE_SIZE = 256


class _AuthRefused(Exception):
    """Raised from the HTTP response hook, so a refused token is told apart from a dead server."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def result_text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def parse_result(result: types.CallToolResult, tool: str, collection: str | None) -> list[Passage]:
    """Passages of a tool result; `SearchError` when the result is an error (flag or text)."""
    text = result_text(result)
    stripped = text.strip()
    if result.is_error:
        raise SearchError(f"search tool {tool} returned an error: {_short(stripped) or '(no message)'}")
    if stripped.startswith(ERROR_PREFIXES):
        raise SearchError(f"search tool {tool}: {_short(stripped)}")
    return passages_from_output(text, result.structured_content, collection)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Errors out of the transport


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.error.message}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class _Pending:
    done: anyio.Event = field(default_factory=anyio.Event)
    result: list[Passage] | None = None
    error: BaseException | None = None


# ---------------------------------------------------------------------------------------------


class McpSearcher:
    """A `Searcher` over an MCP search server. Use as `async with McpSearcher(...) as searcher`."""

    def __init__(
        self,
        *,
        url: str | None = None,
        command: Sequence[str] | None = None,
        token: str | None = None,
        tools: Mapping[str, str],
        timeout: float = 30.0,
        concurrency: int = 8,
        env: Mapping[str, str] | None = None,
        retry: RetryPolicy = MCP_RETRY,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        if bool(url) == bool(command):
            raise ConfigError("the MCP search server needs exactly one of a URL or a command line")
        if not tools:
            raise ConfigError("no search tools are configured ([tools] in the config)")
        if token is not None and not _HEADER_SAFE.fullmatch(token):
            # never echo it: the HTTP library's own message would print the whole header
            raise ConfigError(
                f"{TOKEN_SETTING} holds characters an HTTP header cannot carry (a line break or a control "
                "character): set it to the bare token"
            )
        self._url = url
        self._command = list(command or [])
        self._token = token
        self._tools = dict(tools)
        self._tool_of: dict[str, str] = {}
        for tool, collection in self._tools.items():
            self._tool_of.setdefault(collection, tool)  # the first tool configured for a collection
        self._timeout = timeout
        self._gate = anyio.Semaphore(max(1, concurrency))
        self._env = dict(env or {})
        self._retry = retry
        self._session: ClientSession | None = None
        self._broken: SearchError | None = None
        self._closing = anyio.Event()
        self._task_group: Any = None
        self._cache: dict[tuple[str, str, int], list[Passage]] = {}
        self._cache_size = cache_size
        self._inflight: dict[tuple[str, str, int], _Pending] = {}
        #: tool calls made, and calls answered from the cache (for the run summary)
        self.calls = 0
        self.cache_hits = 0
        self.server_name: str | None = None

    @property
    def where(self) -> str:
        """Where the server is, for messages (never includes the token)."""
        return self._url or f"stdio command `{shlex.join(self._command)}`"

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> McpSearcher:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            await self._task_group.start(self._own_session)
        except BaseException:
            self._closing.set()
            await self._task_group.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()
        try:
            await self._task_group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # the task group wraps the caller's own exception: hand it back unwrapped
            if exc is not None and all(leaf is exc for leaf in leaves(group)):
                return None
            raise

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        if self._url:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}

            async def refuse_auth(response: httpx2.Response) -> None:
                if response.status_code in (401, 403):
                    raise _AuthRefused(response.status_code)

            http = httpx2.AsyncClient(
                headers=headers,
                # connect bounded by the call timeout; the long-lived GET stream may idle longer
                timeout=httpx2.Timeout(min(self._timeout, 10.0), read=max(self._timeout, 300.0)),
                event_hooks={"response": [refuse_auth]},
            )
            async with http, streamable_http_client(self._url, http_client=http) as (read, write):
                yield read, write
        else:
            params = StdioServerParameters(command=self._command[0], args=self._command[1:], env=self._env)
            async with stdio_client(params, errlog=sys.stderr) as (read, write):
                yield read, write

    def _failure(self, exc: BaseException) -> TriageError:
        """The error a failed connect attempt stands for."""
        found = leaves(exc)
        for leaf in found:
            if isinstance(leaf, _AuthRefused):
                hint = "missing" if not self._token else "refused"
                return ConfigError(
                    f"the search server at {self.where} refused the bearer token ({hint}, {leaf}): "
                    f"check {TOKEN_SETTING}"
                )
            if isinstance(leaf, ConfigError):
                return leaf
        cause = "; ".join(dict.fromkeys(_describe(leaf) for leaf in found if not _is_cancel(leaf)))
        return SearchError(f"search server unreachable at {self.where}: {cause or _describe(exc)}")

    async def _own_session(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Connect (retried by the policy), then hold the session open until the searcher closes."""
        started = anyio.Event()

        def retryable(error: BaseException) -> bool:
            return isinstance(error, SearchError) and not started.is_set()

        async for attempt in self._retry.async_retrying(retryable):
            with attempt:
                await self._hold_session(task_status, started)

    async def _hold_session(self, task_status: Any, started: anyio.Event) -> None:
        try:
            async with (
                self._transport() as (read, write),
                ClientSession(read, write, read_timeout_seconds=self._timeout) as session,
            ):
                with anyio.fail_after(self._timeout):
                    init = await session.initialize()
                    listed = await session.list_tools()
                offered = sorted(tool.name for tool in listed.tools)
                missing = [tool for tool in self._tools if tool not in offered]
                if missing:
                    raise ConfigError(
                        f"the search server at {self.where} has no tool {', '.join(missing)} "
                        f"(it offers: {', '.join(offered) or 'none'}); check [tools] in the config"
                    )
                self.server_name = init.server_info.name
                self._session = session
                started.set()
                task_status.started()
                await self._closing.wait()
                self._session = None
        except Exception as exc:  # an ExceptionGroup from the transport's task groups, mostly
            self._session = None
            error = self._failure(exc)
            if started.is_set():
                # the server went away mid-run: later calls fail fast, the caller carries on
                self._broken = SearchError(f"search server connection lost at {self.where}: {error}")
                return
            raise error from exc

    # -- searching ------------------------------------------------------------------------------

    def tool_for(self, collection: str) -> str:
        try:
            return self._tool_of[collection]
        except KeyError:
            raise ConfigError(f"no search tool is configured for collection {collection!r}") from None

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        tool = self.tool_for(collection)
        key = (query, collection, top_k)
        if key in self._cache:
            self.cache_hits += 1
            return list(self._cache[key])
        pending = self._inflight.get(key)
        if pending is not None:  # the same call is on its way: share its answer
            self.cache_hits += 1
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            return list(pending.result or [])
        pending = self._inflight[key] = _Pending()
        try:
            passages = await self._call(tool, query, collection, top_k)
        except BaseException as exc:
            pending.error = exc if isinstance(exc, TriageError) else SearchError(_describe(exc))
            raise
        else:
            pending.result = self._cache[key] = passages
            if len(self._cache) > self._cache_size:  # bounded: drop the oldest answer
                del self._cache[next(iter(self._cache))]
            return list(passages)
        finally:
            del self._inflight[key]
            pending.done.set()

    async def _call(self, tool: str, query: str, collection: str, top_k: int) -> list[Passage]:
        if self._broken is not None:
            raise self._broken
        session = self._session
        if session is None:
            raise SearchError(f"the search session at {self.where} is not open")
        async with self._gate:
            self.calls += 1
            try:
                # the SDK's read timeout answers a slow call; fail_after also bounds a stuck transport
                with anyio.fail_after(self._timeout + 1.0):
                    result = await session.call_tool(
                        tool, {"query": query, "top_k": top_k}, read_timeout_seconds=self._timeout
                    )
            except (MCPError, TimeoutError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
                if self._broken is not None:
                    raise self._broken from exc
                raise SearchError(f"search tool {tool} at {self.where} failed: {_describe(exc)}") from exc
        return parse_result(result, tool, collection)


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, anyio.get_cancelled_exc_class())
