"""The relay's HTTP frame, below its endpoints: what a refusal is (`Problem`), how a request
reaches its endpoint (the relay's own routes straight to their function, CORS, a 405 that names
every method a path has), uvicorn's protocol with the head limits it lacks, and the counters of
`/metrics`.

The protocol's limits, measured: without them twenty unfinished 10 MB headers took the relay from
56 MB to about 250-290 MB, and half-sent requests were held for ever (600 of them exhausted a
512-descriptor limit and every new client was refused). A head over `max_head_bytes` is answered
431, one not complete within `head_seconds` of its first byte (or of the connection, for a client
that sends nothing) 408; either closes the connection. uvicorn's own `limit_concurrency` bounds
the rest.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from triage.errors import TriageError
from triage.redact import printable, redact


class Problem(TriageError):
    """A request the relay refuses: `status` (400, 401, 403, 404, 409, 413, 422, 429, 503) and a
    message that names the field."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


# -- routing -------------------------------------------------------------------------------------


def json_response(status: int, body: object, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


class Cors:
    """The browser origins allowed to call the API (`[relay] cors_origins`; none: no CORS headers,
    a browser on another origin is refused by the browser itself)."""

    HEADERS = "Authorization, Content-Type, X-Feedback-Token"

    def __init__(self, origins: list[str]) -> None:
        self.origins = frozenset(o.rstrip("/") for o in origins)

    def headers(self, origin: str | None) -> dict[str, str]:
        if origin is None or origin.rstrip("/") not in self.origins:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight(self, origin: str | None, methods: list[str]) -> Response:
        allowed = self.headers(origin)
        if not allowed:
            return json_response(403, {"error": "this origin is not allowed (the relay's [relay] cors_origins)"})
        return Response(status_code=204, headers={
            **allowed,
            "Access-Control-Allow-Methods": ", ".join(methods),
            "Access-Control-Allow-Headers": self.HEADERS,
            "Access-Control-Max-Age": "600",
        })  # fmt: skip


class Dispatch:
    """The ASGI app: the relay's own routes straight to their endpoint, the rest to Starlette.
    Starlette's middleware and router cost about a tenth of the relay's CPU per vote, and the
    relay's frame (`RelayApp._guard`) already turns every failure into a response. A known path
    with another method is a 405 naming every method the path has; `OPTIONS` is CORS's preflight."""

    def __init__(
        self,
        direct: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]],
        fallback: Starlette,
        cors: Cors,
    ) -> None:
        self.direct = direct
        self.fallback = fallback
        self.cors = cors
        self.methods: dict[str, list[str]] = {}
        for path, method in direct:
            self.methods.setdefault(path, []).append(method)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            path, method = scope["path"], scope["method"]
            endpoint = self.direct.get((path, method))
            methods = self.methods.get(path)
            if endpoint is not None or methods is not None:
                scope["app"] = self.fallback
                request = Request(scope, receive, send)
                origin = request.headers.get("origin")
                if endpoint is not None:
                    response = await endpoint(request)
                elif method == "OPTIONS" and methods is not None:
                    response = self.cors.preflight(origin, methods)
                else:
                    allow = ", ".join([*(methods or []), "OPTIONS"])
                    response = json_response(405, {"error": f"{method} is not allowed here: {allow}"}, {"Allow": allow})
                response.headers.update(self.cors.headers(origin))
                await response(scope, receive, send)
                return
        await self.fallback(scope, receive, send)


# -- the protocol: the request head's size and time -----------------------------------------


STATUS = {408: b"408 Request Timeout", 431: b"431 Request Header Fields Too Large"}


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools) with the two limits it lacks: the size of a request's head
    (request line and headers) and the time a client may take to send it."""

    #: set per server by `limited` (a subclass per configuration)
    max_head_bytes = 32 * 1024
    head_seconds = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._stop_timer()
        why = "the request head came too slowly"
        self._head_timer = self.loop.call_later(self.head_seconds, self._refuse, 408, why)

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # only a head still unfinished after this data counts: a body in the same packet does not
        if self._in_head and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._refuse(431, f"the request head is over {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # a keep-alive connection's next request
            self._start_head()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_timer()
        super().on_headers_complete()

    def _refuse(self, status: int, message: str) -> None:
        if not self._in_head or self.transport.is_closing():
            return
        body = ('{"error": "' + message + '"}').encode()
        self.transport.write(
            b"HTTP/1.1 " + STATUS[status] + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
        )  # fmt: skip
        self.transport.close()


def limited(max_head_bytes: int, head_seconds: float) -> type[GuardedHttpTools]:
    """The protocol class for one server's limits."""
    limits = {"max_head_bytes": max_head_bytes, "head_seconds": head_seconds}
    return type("LimitedHttpTools", (GuardedHttpTools,), limits)


# -- /metrics ------------------------------------------------------------------------------------


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    # label values can come from clients (a monitor-mode score name): never a secret, never a control
    labels = tuple((k, printable(redact(v))) for k, v in labels)
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + inner + "}"


class Metrics:
    """Counters for `/metrics`, in Prometheus' text format (no client library needed for a handful)."""

    HELP = {
        "relay_requests_total": ("counter", "HTTP requests by route and status"),
        "relay_outcomes_total": ("counter", "what accepted writes became: stored, queued, direct, refused"),
        "relay_undeclared_scores_total": ("counter", "scores whose name the model does not declare (monitor mode)"),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def inc(self, metric: str, amount: int = 1, **labels: str) -> None:
        with self._lock:
            self._counts[(metric, tuple(sorted(labels.items())))] += amount

    def value(self, metric: str, **labels: str) -> int:
        with self._lock:
            return self._counts[(metric, tuple(sorted(labels.items())))]

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        lines: list[str] = []
        with self._lock:
            counts = sorted(self._counts.items())
        for name, (kind, text) in self.HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            lines += [f"{n}{_labels(labels)} {v}" for (n, labels), v in counts if n == name]
        for name, (text, value) in gauges.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
