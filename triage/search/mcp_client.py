"""Re-search the index through an MCP search server (the agent's own, or `triage index serve`).

One session at a time, over streamable HTTP (optional bearer token) or stdio (a command line), held
by `triage.search.mcp_session.SessionKeeper` in a task of its own: a transport that dies mid-run
fails the calls in flight instead of cancelling the caller, and a session the server lost (a
restart, "Session not found") is replaced, each search caught by the loss made once more on the new
one. The protocol revision is negotiated per session (2026-07-28, stateless, where the server speaks
it, else the 2025-11-25 handshake: see `mcp_session`); on a stateless session a search whose
response stream broke is sent again at once under a new id. Calls share the session, at most
`concurrency` at a time, each with a deadline; identical calls are made once. A breaker per
collection (`Breaker`, below) stops asking a backend that fails the same way every time.

Errors: server down or unreachable (after the connect attempts) -> `SearchError`; at the first
contact, a bearer token refused (401/403), nothing at the MCP path (404/405), a configured tool the
server lacks (or no tools at all) -> `ConfigError`; the protocol refused (HTTP 400, -32022
unsupported version or -32020 header mismatch), at the first contact or mid-run -> `ConfigError`,
never retried; a tool error result, a time-out, or the docs agent's "Search failed: ..." text ->
`SearchFailed` (counted by the breaker); "Search rejected: ..." -> `SearchError`; a collection whose
breaker is open -> `SearchSuspended`.

A breaker per collection: stop asking a search backend that fails the same way every time.

The docs agent's server is a thin layer over a vector store. With the store down the server stays
up and every search fails alike ("Search failed: ...", or a time-out), so asking again for each of
the night's traces only adds a failure (or a whole time-out) per trace, and a pile of abandoned
calls can make the server drop the session. After `threshold` identical failures in a row the
collection's breaker opens: its searches are refused at once with `SearchSuspended` (the traces
that need the collection are listed undecided with the reason, never dropped), and one search is
let through every `probe_seconds` as a probe, so a backend that comes back is used again.

Identical means the same message once digits are masked (a request id or a port must not make
each failure look new). A different failure starts the count again; an answer resets it. A query
the server rejects (its own limit), a lost session (the session keeper's business) and a
cancelled call say nothing about the backend and are not counted either way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError

from triage.domain.kernel import clip
from triage.domain.records import Passage
from triage.errors import ConfigError, SearchError, SearchSuspended, TriageError, leaves
from triage.reading.passages import ERROR_PREFIXES, passages_from_output
from triage.retry import Clock, RetryPolicy, current_clock
from triage.search.mcp_session import (
    MCP_RECONNECT,
    MCP_RETRY,
    PROBE_SECONDS,
    TOKEN_SETTING,
    Endpoint,
    SessionKeeper,
    describe,
    protocol_refused,
    refusal,
)

log = logging.getLogger("triage")

_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class BreakerPolicy:
    """When a collection's searches stop, and how often a probe goes through while they do."""

    #: identical failures in a row that open the breaker
    threshold: int = 5
    #: seconds between probes while it is open
    probe_seconds: float = 30.0


@dataclass(frozen=True)
class Admission:
    """A search the breaker let through; `probe` when it is the one probe of an open breaker."""

    probe: bool = False


def signature(reason: str) -> str:
    """What makes two failures identical: the message, spaced once, any case, digits masked."""
    return _DIGITS.sub("#", " ".join(reason.split()).casefold())[:300]


class Breaker:
    """One collection's breaker (closed, or open with at most one probe in flight)."""

    def __init__(self, collection: str, policy: BreakerPolicy | None = None, clock: Clock | None = None) -> None:
        self.collection = collection
        self.policy = policy or BreakerPolicy()
        self._clock = clock
        self._signature: str | None = None
        self._in_a_row = 0
        #: why it is open (the latest failure); None while closed
        self.reason: str | None = None
        self._next_probe = 0.0
        self._probing = False
        #: searches refused while open, and how often it opened (for logs and tests)
        self.refused = 0
        self.opened = 0

    @property
    def clock(self) -> Clock:
        return self._clock or current_clock()

    @property
    def is_open(self) -> bool:
        return self.reason is not None

    def admit(self) -> Admission:
        """Let a search through, or raise `SearchSuspended` while open and no probe is due."""
        if self.reason is None:
            return Admission()
        if not self._probing and self.clock.monotonic() >= self._next_probe:
            self._probing = True
            return Admission(probe=True)
        self.refused += 1
        raise SearchSuspended(
            self.collection,
            f"searches of the {self.collection} collection suspended after {self.policy.threshold} identical "
            f"failures in a row (tried again every {self.policy.probe_seconds:g} s): {self.reason}",
        )

    def succeeded(self, admission: Admission) -> None:
        if self.reason is not None:
            log.warning(
                "searches of the %s collection answer again: resumed", self.collection,
                extra={"event": "search_resumed", "collection": self.collection},
            )  # fmt: skip
        self.reason, self._signature, self._in_a_row, self._probing = None, None, 0, False

    def failed(self, admission: Admission, reason: str) -> None:
        """A failure of the backend behind the collection (an error result, a time-out)."""
        now = self.clock.monotonic()
        if admission.probe:
            # still down: the next probe waits its turn again; the latest reason is the one to show
            self.reason, self._probing, self._next_probe = reason, False, now + self.policy.probe_seconds
            return
        if self.reason is not None:
            return  # a search let through before it opened, failing late: already counted in
        found = signature(reason)
        self._in_a_row = self._in_a_row + 1 if found == self._signature else 1
        self._signature = found
        if self._in_a_row >= self.policy.threshold:
            self.reason, self._next_probe = reason, now + self.policy.probe_seconds
            self.opened += 1
            log.warning(
                "searches of the %s collection suspended after %d identical failures in a row, tried again "
                "every %g s; the traces that need it are listed undecided: %s",
                self.collection, self._in_a_row, self.policy.probe_seconds, reason,
                extra={"event": "search_suspended", "collection": self.collection},
            )  # fmt: skip

    def released(self, admission: Admission) -> None:
        """A search that ended saying nothing about the backend (a rejected query, a lost session,
        a cancellation): a probe's turn goes to the next search."""
        if admission.probe:
            self._probing = False


__all__ = ["MCP_RECONNECT", "MCP_RETRY", "McpSearcher", "SearchFailed", "parse_result", "passages_from_output"]

_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what a bearer token may hold
_REJECTED = "Search rejected:"

#: answers kept for identical calls. Small on purpose: the Researcher in front of this client
#: already shares identical queries (its own bounded cache), and each answer holds top_k passages
#: of up to a few KB: 4096 answers were about 20-25 MB of a night's peak RSS, flat only once full.
CACHE_SIZE = 256


class SearchFailed(SearchError):
    """The backend behind a search tool failed this search (an error result, the docs agent's
    "Search failed: ...", a time-out): what a collection's breaker counts. A rejected query is not."""


def result_text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def parse_result(result: types.CallToolResult, tool: str, collection: str | None) -> list[Passage]:
    """Passages of a tool result; `SearchFailed` when the result is an error (flag or "Search
    failed:" text), `SearchError` when the server rejected the query ("Search rejected:")."""
    text = result_text(result)
    stripped = text.strip()
    if result.is_error:
        raise SearchFailed(f"search tool {tool} returned an error: {_short(stripped) or '(no message)'}")
    if stripped.startswith(_REJECTED):
        raise SearchError(f"search tool {tool}: {_short(stripped)}")
    if stripped.startswith(ERROR_PREFIXES):
        raise SearchFailed(f"search tool {tool}: {_short(stripped)}")
    return passages_from_output(text, result.structured_content, collection)


def _short(text: str, limit: int = 300) -> str:
    return clip(" ".join(text.split()), limit)


@dataclass
class _Pending:
    done: anyio.Event = field(default_factory=anyio.Event)
    result: list[Passage] | None = None
    error: BaseException | None = None


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
        reconnect: RetryPolicy | None = None,
        breaker: BreakerPolicy | None = None,
        probe_seconds: float = PROBE_SECONDS,
        clock: Clock | None = None,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        """`retry` is the first contact's policy; `reconnect` renews a lost session (default
        `MCP_RECONNECT` on `retry`'s clock and budget); `probe_seconds` apart, a call tries the
        server again once renewing failed. `clock` (default `retry`'s, else the current one) times
        the probes and the breakers."""
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
        self._tools = dict(tools)
        self._tool_of: dict[str, str] = {}
        for tool, collection in self._tools.items():
            self._tool_of.setdefault(collection, tool)  # the first tool configured for a collection
        self._timeout = timeout
        self._gate = anyio.Semaphore(max(1, concurrency))
        clock = clock or retry.clock
        self._keeper = SessionKeeper(
            Endpoint(url=url, command=tuple(command or ()), token=token, env=dict(env or {})),
            tools=list(self._tools),
            timeout=timeout,
            retry=retry,
            reconnect=reconnect,
            probe_seconds=probe_seconds,
            clock=clock,
        )
        policy = breaker or BreakerPolicy()
        self.breakers = {c: Breaker(c, policy, clock) for c in dict.fromkeys(self._tools.values())}
        self._task_group: Any = None
        self._cache: dict[tuple[str, str, int], list[Passage]] = {}
        self._cache_size = cache_size
        self._inflight: dict[tuple[str, str, int], _Pending] = {}
        #: tool calls made (a search retried on a new session counts twice), and calls answered
        #: from the cache (for the run summary)
        self.calls = 0
        self.cache_hits = 0

    @property
    def where(self) -> str:
        """Where the server is, for messages (never includes the token)."""
        return self._keeper.where

    @property
    def server_name(self) -> str | None:
        return self._keeper.server_name

    @property
    def protocol_version(self) -> str | None:
        """The MCP revision negotiated with the server (its latest session's): 2026-07-28 where
        the server speaks it, else the handshake's 2025-11-25 (or older)."""
        return self._keeper.version

    @property
    def sessions(self) -> int:
        """Sessions opened so far: 1, plus one per renewal."""
        return self._keeper.sessions

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> McpSearcher:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            await self._task_group.start(self._keeper.keep)
        except BaseException:
            await self._keeper.close()
            await self._task_group.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        graceful = self._keeper.holding
        await self._keeper.close()
        if not graceful:
            # renewing or down: no session to end, and no reason to wait out a back-off or a connect
            self._task_group.cancel_scope.cancel()
        try:
            await self._task_group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # the task group wraps the caller's own exception: hand it back unwrapped
            if exc is not None and all(leaf is exc for leaf in leaves(group)):
                return None
            raise

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
            pending.error = exc if isinstance(exc, TriageError) else SearchError(describe(exc))
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
        """One search through the collection's breaker: it refuses the search while open
        (`SearchSuspended`) and hears how the backend answered. Admitted only once the search holds
        a place in the gate, so the searches queued behind a failing backend are refused at once
        instead of going out after the breaker opened."""
        breaker = self.breakers[collection]
        async with self._gate:
            admission = breaker.admit()
            try:
                result = await self._call_tool(tool, {"query": query, "top_k": top_k})
                passages = parse_result(result, tool, collection)
            except SearchFailed as exc:
                breaker.failed(admission, str(exc))
                raise
            except BaseException:
                breaker.released(admission)
                raise
        breaker.succeeded(admission)
        return passages

    async def _call_tool(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """The call on the current session. On a stateless (2026-07-28) session, a request whose
        response stream broke is sent again at once, under a new id (the revision's rule: nothing
        resumes it); a call whose session was lost is made once more on a new one (waiting while it
        is renewed, within the reconnect policy). A refusal of the protocol is a `ConfigError`."""
        resent = renewed = False
        while True:
            live = await self._keeper.session()
            self.calls += 1
            try:
                # the SDK's read timeout answers a slow call; fail_after also bounds a stuck transport
                with anyio.fail_after(self._timeout + 1.0):
                    return await live.client.call_tool(tool, arguments, read_timeout_seconds=self._timeout)
            except (
                MCPError, TimeoutError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream
            ) as exc:  # fmt: skip
                if protocol_refused(exc):
                    # (the SDK already re-listed the tools and resent once on a header mismatch)
                    raise refusal(self.where, exc) from exc
                if not resent and self._keeper.stream_broke(live, exc):
                    resent = True
                    log.info(
                        "search tool %s at %s: the response stream broke (%s): sent again",
                        tool, self.where, describe(exc), extra={"event": "search_resent"},
                    )  # fmt: skip
                    continue
                if not self._keeper.lost(live, exc):
                    raise SearchFailed(f"search tool {tool} at {self.where} failed: {describe(exc)}") from exc
                if renewed:
                    raise SearchError(
                        f"search tool {tool} at {self.where}: the session was lost twice in one call "
                        f"({describe(exc)})"
                    ) from exc
                renewed = True
