"""The MCP session a run searches through, kept alive across server restarts and lost sessions.

The search server is rolled while the nightly job runs (the docs agent's chart restarts it on every
merge), and a server may forget a session (idle time-out, another replica, its own restart): under
the streamable-HTTP transport it then answers 404 "Session not found", and the transport's rule is
that such a client starts a new session. So `SessionKeeper` holds one session in a task of its own
and, when a call finds it lost (or the transport dies under it), opens a new one: connect and
initialise retried by the `reconnect` policy, which holds the run's budget. While it renews, calls
wait for the new session (the caller retries its search once on it). If it cannot renew, the server
is down: calls fail at once, and a call `probe_seconds` later tries one connect again.

The first contact is different: the `retry` policy (a server starting beside the job gets a moment),
and what it finds wrong with the configuration ends the run before any trace is judged (exit 3): a
404 or 405 at the MCP path (a wrong `TRIAGE_MCP_URL`), a refused token, a configured tool the server
lacks, a server with no tools at all, a server that refuses every protocol revision triage speaks.

Two generations of the protocol: the 2025-11-25 handshake (`initialize`, then a session the server
keeps under `Mcp-Session-Id`) and the stateless 2026-07-28 revision (no handshake, no session: each
request carries its version; `server/discover` says what the server speaks). Each session is opened
by the SDK's own negotiation (`mcp.Client`, `mode="auto"`): `server/discover` first, the newest
revision both sides speak adopted, else the handshake. So one client reaches the docs agent's
fastmcp 3.x (handshake only), the `mcp` 2.x and fastmcp 4.x servers (both) and servers that refuse
the handshake. A session of a stateless server cannot be lost; its "renewal" is a new negotiation,
which also follows a server rolled from one generation to the other. A refusal of the protocol (HTTP
400 with JSON-RPC error -32022, unsupported version, or -32020, header mismatch) is a `ConfigError`:
retrying cannot change the versions a server speaks.
"""

from __future__ import annotations

import logging
import math
import shlex
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client, ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from triage.errors import ConfigError, SearchError, TriageError, leaves
from triage.retry import Clock, RetryPolicy, current_clock

log = logging.getLogger("triage")

TOKEN_SETTING = "TRIAGE_MCP_TOKEN"
URL_SETTING = "TRIAGE_MCP_URL"

#: the first contact: 3 attempts, 1 s then 2 s apart (a server starting beside the job gets a moment)
MCP_RETRY = RetryPolicy(attempts=3, initial=1.0, maximum=2.0, jitter=0.0)
#: renewing a lost session: 6 attempts over about 11 s (0.5, 1, 2, 4, 4 s apart), enough for a rolled
#: server to come back (the docs agent's is back in about 3 s); the run's budget still bounds it
MCP_RECONNECT = RetryPolicy(attempts=6, initial=0.5, maximum=4.0, jitter=0.0)
#: while the server is down, a call this often tries one connect again
PROBE_SECONDS = 30.0

#: what a server says when it no longer knows the session: its own JSON-RPC error at HTTP 404
#: ("Session not found"), the SDK's stand-in for a bare 404 ("Session terminated"), or, to a call
#: in flight when the session ended, a JSON-response server's 500 ("Session terminated before ...")
_LOST_MESSAGES = ("session not found", "session terminated")


class _HttpRefused(Exception):
    """Raised from the HTTP response hook, so a refusal is told apart from a dead server."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: a URL (with an optional bearer token) or a command line (stdio)."""

    url: str | None
    command: tuple[str, ...] = ()
    token: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """For messages: never includes the token."""
        return self.url or f"stdio command `{shlex.join(self.command)}`"


#: the JSON-RPC errors by which a server refuses the protocol itself (the request's version, or
#: its headers against its body): configuration, never an outage
PROTOCOL_REFUSALS = (types.UNSUPPORTED_PROTOCOL_VERSION, types.HEADER_MISMATCH)
#: every revision this client speaks, oldest first (for messages)
SPOKEN = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)


@dataclass(frozen=True)
class Live:
    """An open session: `number` 1 is the run's first, each renewal adds one; `version` the
    protocol revision negotiated for it."""

    client: Client
    number: int
    version: str

    @property
    def stateless(self) -> bool:
        """A 2026-07-28 (or later) session: the server keeps nothing, each request stands alone."""
        return self.version in MODERN_PROTOCOL_VERSIONS


def describe(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.error.message}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def protocol_refused(exc: BaseException) -> bool:
    """Whether `exc` is the server refusing the protocol: a version it does not speak (-32022), or
    headers that do not match the request (-32020), or a handshake answered with a version this
    client does not know."""
    if isinstance(exc, MCPError):
        return exc.code in PROTOCOL_REFUSALS
    return isinstance(exc, RuntimeError) and str(exc).startswith("Unsupported protocol version from the server")


def refusal(where: str, exc: BaseException) -> ConfigError:
    """The configuration error a protocol refusal stands for: what each side speaks, or (a header
    mismatch) that something between the two rewrites the requests."""
    if isinstance(exc, MCPError) and exc.code == types.HEADER_MISMATCH:
        return ConfigError(
            f"the search server at {where} refused the MCP protocol ({describe(exc)}): the requests' "
            "MCP headers do not match their bodies when they reach it; check what sits between triage and "
            f"the server (a proxy or gateway rewriting or dropping Mcp-* headers), or {URL_SETTING}"
        )
    offered = ""
    if isinstance(exc, MCPError) and exc.code == types.UNSUPPORTED_PROTOCOL_VERSION:
        try:
            supported = types.UnsupportedProtocolVersionErrorData.model_validate(exc.error.data).supported
        except ValidationError:
            supported = []
        offered = f"; it speaks {', '.join(supported)}" if supported else ""
    return ConfigError(
        f"the search server at {where} refused the MCP protocol ({describe(exc)}{offered}; triage speaks "
        f"{', '.join(SPOKEN)}): point {URL_SETTING} at a server that speaks one of them, or upgrade triage"
    )


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, anyio.get_cancelled_exc_class())


def session_lost(exc: BaseException) -> bool:
    """Whether a call's error means its session is gone (not that the search itself failed)."""
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return True
    if isinstance(exc, MCPError):
        if exc.code == types.CONNECTION_CLOSED:
            return True
        # a server in JSON-response mode answers the calls in flight when it ends a session with
        # a 500 / INTERNAL_ERROR "Session terminated before the request completed"
        return exc.code in (types.INVALID_REQUEST, types.INTERNAL_ERROR) and exc.error.message.casefold().startswith(
            _LOST_MESSAGES
        )
    return False


async def _all_tools(session: ClientSession) -> list[str]:
    """Every tool the server lists, across pages (a server may page its list: a tool on page two is
    as real as one on page one)."""
    names: list[str] = []
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        listed = await session.list_tools(params=params)
        names += [tool.name for tool in listed.tools]
        cursor = listed.next_cursor
        if not cursor or cursor in seen:  # a server handing out the same cursor again would loop
            return names
        seen.add(cursor)


async def _json_rpc_error(response: httpx2.Response) -> bool:
    """Whether an HTTP error's body is a JSON-RPC error (an MCP server's own answer)."""
    if not response.headers.get("content-type", "").lower().startswith("application/json"):
        return False
    try:
        body = await response.aread()  # kept by the response: the SDK reads it again
        return isinstance(types.jsonrpc_message_adapter.validate_json(body, by_name=False), types.JSONRPCError)
    except (httpx2.StreamError, ValidationError):
        return False


class SessionKeeper:
    """Holds the run's session: `session()` for calls, `lost()` when one finds it gone.

    Run `keep` in a task group with `await task_group.start(keeper.keep)`: it returns once the first
    session is open, or raises what the first contact found (`ConfigError`, else `SearchError`).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        tools: Sequence[str],
        timeout: float,
        retry: RetryPolicy = MCP_RETRY,
        reconnect: RetryPolicy | None = None,
        probe_seconds: float = PROBE_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._tools = list(tools)
        self._timeout = timeout
        self._retry = retry
        # the renewals wait on the same clock and spend the same budget as the first contact
        self._reconnect = reconnect or MCP_RECONNECT.with_(clock=retry.clock, budget=retry.budget)
        self._probe_seconds = probe_seconds
        self._clock = clock or retry.clock
        self._live: Live | None = None
        self._opened = 0
        #: why the server cannot be reached (renewing failed), and when a call may try again
        self._down: TriageError | None = None
        self._next_probe = 0.0
        self._probing = False
        self._closing = False
        #: replaced at every change of state: calls waiting for a session wait on it
        self._changed = anyio.Event()
        #: wakes `keep`: a session lost, a probe asked for, or the searcher closing
        self._wake = anyio.Event()
        self.server_name: str | None = None
        #: the protocol revision negotiated for the latest session (None before the first)
        self.version: str | None = None

    @property
    def where(self) -> str:
        return self.endpoint.where

    @property
    def sessions(self) -> int:
        """Sessions opened so far (1 unless one was renewed)."""
        return self._opened

    def _now(self) -> float:
        return (self._clock or current_clock()).monotonic()

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # -- for the calls ---------------------------------------------------------------------------

    async def session(self) -> Live:
        """The open session; waits while one is being renewed. Raises the reason (`SearchError`,
        or `ConfigError` when the server refused the token on a reconnect) while the server is down,
        except for the call that finds a probe due: that one waits for the probe's connect."""
        probed = False
        while True:
            if self._live is not None:
                return self._live
            if self._closing:
                raise SearchError(f"the search session at {self.where} is closed")
            if self._down is not None:
                if probed or self._probing or self._now() < self._next_probe:
                    raise self._down
                probed = self._probing = True
                self._wake.set()
            await self._changed.wait()

    def lost(self, live: Live, exc: BaseException) -> bool:
        """Whether `exc`, raised by a call on `live`, means that session is gone; if so, and it is
        still the current one, renewing it starts. A session already replaced counts as lost
        whatever its call raised: the call never had a chance on the new one."""
        if self._live is not live:
            return True
        if not session_lost(exc):
            return False
        log.warning(
            "search session %d at %s lost (%s): opening a new one", live.number, self.where, describe(exc),
            extra={"event": "search_session_lost"},
        )  # fmt: skip
        self._live = None
        self._wake.set()
        self._notify()
        return True

    def stream_broke(self, live: Live, exc: BaseException) -> bool:
        """Whether `exc`, raised by a call on `live`, is a stateless session's request whose
        response stream broke (a server restarting, a proxy cutting the stream) while the session
        is still the current one: the 2026-07-28 rule is to send it again under a new id (nothing
        resumes it), on the same session, for there is no session to renew."""
        return (
            live is self._live
            and live.stateless
            and isinstance(exc, MCPError)
            and exc.code == types.CONNECTION_CLOSED
        )

    def closing(self) -> bool:
        return self._closing

    @property
    def holding(self) -> bool:
        """Whether a session is open (closing then says goodbye to the server)."""
        return self._live is not None

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._notify()

    # -- the session's own task ------------------------------------------------------------------

    async def keep(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """The first contact, then the session held, renewed when lost, probed while down."""
        await self._connect(self._retry, task_status)
        while not self._closing:
            try:
                await self._connect(self._reconnect if self._down is None else self._reconnect.with_(attempts=1))
            except TriageError as error:
                if self.closing():  # (a method: mypy would keep the loop's narrowing of the field)
                    return
                if self._down is None:  # once per outage: a failed probe says nothing new
                    log.warning(
                        "search server at %s cannot be reached: %s; searches fail at once, tried again every %g s",
                        self.where, error, self._probe_seconds, extra={"event": "search_unavailable"},
                    )  # fmt: skip
                # down: calls fail at once until one is due to probe (it sets `_wake`)
                self._down, self._probing = error, False
                self._next_probe = self._now() + self._probe_seconds
                self._wake = anyio.Event()
                self._notify()
                if not self._closing:
                    await self._wake.wait()

    async def _connect(self, policy: RetryPolicy, task_status: Any = None) -> None:
        """Open a session (attempts by `policy`) and hold it until it is lost or the searcher closes."""
        first = task_status is not None

        def retryable(error: BaseException) -> bool:
            return isinstance(error, SearchError) and not self._closing

        async for attempt in policy.async_retrying(retryable):
            with attempt:
                await self._hold(first, task_status)

    async def _hold(self, first: bool, task_status: Any) -> None:
        established = False
        # cancelled when the session is lost: no goodbye (DELETE) to a server that no longer has it.
        # Until the session is open its deadline bounds the first contact (transport, negotiation,
        # tool list): the SDK's negotiation runs inside `Client`'s entry, where no fail_after can go
        with anyio.CancelScope(deadline=anyio.current_time() + self._timeout) as scope:
            try:
                # the SDK's own negotiation: server/discover at the newest revision, else initialize
                client = Client(self._transport(first), mode="auto", read_timeout_seconds=self._timeout, cache=None)
                async with client:
                    offered = await self._offered(client.session, first)
                    self._check_tools(offered, first)
                    scope.deadline = math.inf
                    self._opened += 1
                    live = Live(client, self._opened, client.protocol_version)
                    self._live, self._down, self._probing = live, None, False
                    self.version = live.version
                    info = client.server_info  # optional at 2026-07-28
                    self.server_name = info.name if info is not None else None
                    established = True
                    if self._opened > 1:
                        log.warning(
                            "search session %d open at %s (MCP %s)", self._opened, self.where, live.version,
                            extra={"event": "search_session_renewed"},
                        )  # fmt: skip
                    else:
                        log.info(
                            "search server at %s speaks MCP %s%s", self.where, live.version,
                            " (stateless)" if live.stateless else "", extra={"event": "search_session_open"},
                        )  # fmt: skip
                    self._wake = anyio.Event()
                    self._notify()
                    if first:
                        task_status.started()
                    if not self._closing:
                        await self._wake.wait()
                    if not self._closing:
                        scope.cancel()
                    self._live = None
            except Exception as exc:  # an ExceptionGroup from the transport's task groups, mostly
                reported = self._live is None  # a call found it lost first and said so
                self._live = None
                error = self._failure(exc)
                if not established:
                    raise error from exc
                # the transport died under an open session (the server went away): renew it
                if not reported:
                    log.warning(
                        "search session %d at %s lost (%s): opening a new one", self._opened, self.where, error,
                        extra={"event": "search_session_lost"},
                    )  # fmt: skip
                self._notify()
        if scope.cancelled_caught and not established and not self._closing:
            raise SearchError(f"search server unreachable at {self.where}: no session within {self._timeout:g} s")

    async def _offered(self, session: ClientSession, first: bool) -> list[str]:
        try:
            return await _all_tools(session)
        except MCPError as exc:
            if exc.code != types.METHOD_NOT_FOUND or not first:
                raise  # (on a renewal: a server mid-rollout, tried again like any failed connect)
            raise ConfigError(
                f"the search server at {self.where} offers no tools (tools/list: {describe(exc)}): "
                f"check {URL_SETTING}, it must name an MCP server with search tools"
            ) from None

    def _check_tools(self, offered: list[str], first: bool) -> None:
        missing = [tool for tool in self._tools if tool not in offered]
        if not missing:
            return
        message = (
            f"the search server at {self.where} has no tool {', '.join(missing)} "
            f"(it offers: {', '.join(sorted(offered)) or 'none'}); check [tools] in the config"
        )
        if first:
            raise ConfigError(message)
        # a server rolled mid-run to a version without the tool: its collection's searches fail and
        # its breaker stops them; the others go on
        log.warning("%s", message, extra={"event": "search_tool_missing"})

    @asynccontextmanager
    async def _transport(self, first: bool) -> AsyncIterator[tuple[Any, Any]]:
        endpoint = self.endpoint
        if endpoint.url:
            headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}

            async def refuse(response: httpx2.Response) -> None:
                if response.status_code in (401, 403):
                    raise _HttpRefused(response.status_code)
                # at the first contact, nothing at the MCP path is a wrong URL; later it is a lost
                # session (the SDK's business) or a server restarting behind an ingress
                request = response.request
                if first and response.status_code in (404, 405) and request.method == "POST":
                    # with a session id, a 404 is a lost session; with a JSON-RPC error, an MCP
                    # server's answer (a 2026-07-28 server says "method not found" with a 404)
                    if "mcp-session-id" not in request.headers and not await _json_rpc_error(response):
                        raise _HttpRefused(response.status_code)

            http = httpx2.AsyncClient(
                headers=headers,
                # connect bounded by the call timeout; the long-lived GET stream may idle longer
                timeout=httpx2.Timeout(min(self._timeout, 10.0), read=max(self._timeout, 300.0)),
                event_hooks={"response": [refuse]},
            )
            async with http, streamable_http_client(endpoint.url, http_client=http) as (read, write):
                yield read, write
        else:
            command = endpoint.command
            params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(endpoint.env))
            async with stdio_client(params, errlog=sys.stderr) as (read, write):
                yield read, write

    def _failure(self, exc: BaseException) -> TriageError:
        """The error a failed connect (or a dead transport) stands for."""
        found = leaves(exc)
        for leaf in found:
            if isinstance(leaf, _HttpRefused) and leaf.status in (401, 403):
                hint = "missing" if not self.endpoint.token else "refused"
                return ConfigError(
                    f"the search server at {self.where} refused the bearer token ({hint}, {leaf}): "
                    f"check {TOKEN_SETTING}"
                )
            if isinstance(leaf, _HttpRefused):
                return ConfigError(
                    f"the search server at {self.where} answered {leaf} at the MCP path: nothing serves MCP "
                    f"there; check the path in {URL_SETTING} (the docs agent's is /mcp)"
                )
            if isinstance(leaf, ConfigError):
                return leaf
            if protocol_refused(leaf):
                return refusal(self.where, leaf)
        cause = "; ".join(dict.fromkeys(describe(leaf) for leaf in found if not _is_cancel(leaf)))
        return SearchError(f"search server unreachable at {self.where}: {cause or describe(exc)}")
