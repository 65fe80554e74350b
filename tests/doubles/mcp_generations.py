"""MCP search servers of each protocol generation, on 127.0.0.1, over streamable HTTP.

The `mcp` 2.3 SDK's server speaks both generations at one URL: the 2025-11-25 handshake
(`initialize`, a session under `Mcp-Session-Id`) and the stateless 2026-07-28 revision (routed by the
request's `MCP-Protocol-Version` header to the SDK's own 2026-07-28 handler). From it:

- `modern_only(app)`: a server that speaks ONLY 2026-07-28, as the TypeScript SDK 2.4 with
  `legacy: 'reject'` does: a request without a 2026-07-28 version header (`initialize`, a GET) is
  refused with HTTP 400 and JSON-RPC error -32022 in the SDK's own words (`data.supported`); what
  carries one is served by the SDK's 2026-07-28 handler;
- `handshake_only(app)`: a server that speaks only the handshake generation, as the docs agent's
  fastmcp 3.4 (`mcp` 1.x) does: a 2026-07-28 request is refused with HTTP 400 and -32600 in the
  words `mcp` 1.30 uses (probed against fastmcp 3.4.2: "Missing session ID" when stateful,
  "Unsupported protocol version: ..." when stateless);
- `refusing(supported)`: a server that speaks only revisions this client does not (a future one):
  every request refused with HTTP 400 and -32022, `data.supported` naming its own;
- `fastmcp_app(...)`: the same tools served by fastmcp 4 (on `mcp` 2.3) when it is installed.

Run as a program it serves an index (the demo's by default) in one of those ways, for the tests
that kill a server and start it again on the same port:

    python -m tests.doubles.mcp_generations --port 8765 --kind modern-only [--json] [--stateless]
        [--hold-after N]   # past N searches none is answered ("holding search N+1" on stdout)
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER, unsupported_protocol_version_rejection
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

from triage.app import demo_index_folders
from triage.domain.config import IndexFolder
from triage.search.index import SERVER_NAME, Index, build_server, search_tools
from triage.settings import load_config

#: the ways `serve` can serve the index
KINDS = ("sdk", "modern-only", "handshake-only", "fastmcp")

_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")


def _version(scope: Scope) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER), None)


async def _answer(send: Send, status: int, body: Mapping[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _refuse_version(send: Send, requested: str | None, supported: Sequence[str]) -> None:
    """HTTP 400 with the JSON-RPC -32022 error the SDK's 2026-07-28 handler gives."""
    rejection = unsupported_protocol_version_rejection(requested or "", supported)
    assert rejection is not None
    error = {"code": rejection.code, "message": rejection.message, "data": rejection.data}
    await _answer(send, 400, {"jsonrpc": "2.0", "id": None, "error": error})


def modern_only(app: ASGIApp) -> ASGIApp:
    """`app` (an `mcp` 2.3 streamable-HTTP app) speaking only 2026-07-28: the handshake refused."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _version(scope) not in MODERN_PROTOCOL_VERSIONS:
            await _refuse_version(send, _version(scope), MODERN_PROTOCOL_VERSIONS)
            return
        await app(scope, receive, send)

    return serve


def handshake_only(app: ASGIApp, *, stateless: bool = False) -> ASGIApp:
    """`app` speaking only the handshake generation, refusing 2026-07-28 as `mcp` 1.x does."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        version = _version(scope) if scope["type"] == "http" else None
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            if stateless:
                message = (
                    f"Bad Request: Unsupported protocol version: {version}. "
                    f"Supported versions: {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)}"
                )
            else:
                message = "Bad Request: Missing session ID"
            error = {"code": -32600, "message": message}
            await _answer(send, 400, {"jsonrpc": "2.0", "id": "server-error", "error": error})
            return
        await app(scope, receive, send)

    return serve


def refusing(supported: Sequence[str]) -> ASGIApp:
    """A server that speaks only the revisions `supported`: every request refused with -32022."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            while message["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
                message = await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await _refuse_version(send, _version(scope), supported)

    return serve


class _Hold:
    """Searches past the first `after` are never answered: each says so on standard output
    ("holding search N") and waits for good, so a test kills the server with searches in flight."""

    def __init__(self, after: int) -> None:
        self.after = after
        self._count = 0
        self._lock = threading.Lock()
        self._never = threading.Event()

    def wrap(self, fn: Callable[..., str]) -> Callable[..., str]:
        @functools.wraps(fn)
        def held(*args: Any, **kwargs: Any) -> str:
            with self._lock:
                self._count += 1
                number = self._count
            if number > self.after:
                print(f"holding search {number}", flush=True)
                self._never.wait()  # (sync tools run in worker threads: the server stays up)
            return fn(*args, **kwargs)

        return held


def _tools(index: Index, tools: Mapping[str, str], hold_after: int | None) -> dict[str, Callable[..., str]]:
    made = search_tools(index, tools)
    if hold_after is None:
        return made
    hold = _Hold(hold_after)
    return {name: hold.wrap(fn) for name, fn in made.items()}


def fastmcp_app(
    index: Index, tools: Mapping[str, str], *, json_response: bool, stateless: bool, hold_after: int | None = None
) -> ASGIApp:
    """The index's search tools served by fastmcp 4 (`mcp` 2.3 underneath)."""
    from fastmcp import FastMCP

    server = FastMCP(SERVER_NAME)
    for name, fn in _tools(index, tools, hold_after).items():
        server.tool(fn, name=name, description=fn.__doc__)
    app: ASGIApp = server.http_app(path="/mcp", json_response=json_response, stateless_http=stateless)
    return app


def index_app(
    kind: str,
    *,
    json_response: bool = False,
    stateless: bool = False,
    folders: Sequence[IndexFolder] = (),
    tools: Mapping[str, str] | None = None,
    hold_after: int | None = None,
) -> ASGIApp:
    """The index over `folders` (default: the demo's) with the configuration's tools, served the
    `kind` way (one of `KINDS`); past `hold_after` searches, none is answered."""
    index = Index.from_folders(list(folders) or demo_index_folders())
    tools = tools or load_config().tools
    if kind == "fastmcp":
        return fastmcp_app(index, tools, json_response=json_response, stateless=stateless, hold_after=hold_after)
    if hold_after is not None:
        server = MCPServer(SERVER_NAME)
        for name, fn in _tools(index, tools, hold_after).items():
            server.add_tool(fn, name=name, description=fn.__doc__)
    else:
        server = build_server(index, tools)
    app = server.streamable_http_app(host="127.0.0.1", json_response=json_response, stateless_http=stateless)
    if kind == "modern-only":
        return modern_only(app)
    if kind == "handshake-only":
        return handshake_only(app, stateless=stateless)
    assert kind == "sdk", kind
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve an index over MCP, one generation or both.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", choices=KINDS, default="sdk")
    parser.add_argument("--json", action="store_true", help="answer with JSON bodies, not SSE streams")
    parser.add_argument("--stateless", action="store_true", help="the SDK's stateless mode")
    parser.add_argument("--hold-after", type=int, help="answer this many searches, then hold every other")
    parser.add_argument("--folder", action="append", default=[], help="COLLECTION=PATH (default: the demo index)")
    args = parser.parse_args(argv)
    folders = [IndexFolder(collection=c, path=p) for c, _, p in (f.partition("=") for f in args.folder)]
    # the SDK's INFO lines name the sessions it creates ("Created new transport with session ID")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    app = index_app(
        args.kind, json_response=args.json, stateless=args.stateless, folders=folders, hold_after=args.hold_after
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
