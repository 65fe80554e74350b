"""The HTTP API (Starlette): authentication, limits, bodies to requests, errors to statuses.

Statuses: 200 written to the store the job reads (or a listing), 201 created (mode=create), 202
durable in the outbox (Langfuse gets it from there), 400 malformed body or missing id, 401 missing
or bad credentials, 403 a credential used beyond its grant, 404 nothing to replace or delete,
409 create-only and the voter already has feedback, 413 body over the limit, 422 undeclared
score name (enforce) or a value wrong for its type, 429 per-client rate limit (Retry-After), 503
(with Retry-After) no store, the outbox is full, or the relay's ledger cannot commit: nothing was
written, the same request may be sent again.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from triage.domain.scores import END_USER
from triage.redact import printable, redact
from triage.relay.openapi import openapi_document
from triage.relay.problems import Problem
from triage.relay.ratelimit import RateLimiter
from triage.relay.requests import (
    Answer,
    decode,
    parse_answer,
    parse_feedback,
    parse_score,
    parse_target,
)
from triage.relay.service import Mode, Relay, end_user
from triage.relay.tokens import Grant, TokenError, is_feedback_token, verify_token

log = logging.getLogger("triage.relay")


@dataclass(frozen=True)
class Credentials:
    """The gateway's bearer token and the key that signs feedback tokens; neither: a laptop."""

    gateway_token: str | None = None
    signing_key: str | None = None

    @property
    def open(self) -> bool:
        return not self.gateway_token and not self.signing_key


@dataclass(frozen=True)
class Caller:
    kind: str  # "open" (no credentials configured), "gateway", "token"
    grant: Grant | None = None


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _clean(message: str) -> str:
    """What an error may say: secrets masked, no control characters, short."""
    return printable(redact(message))[:400]


class _Dispatch:
    """The ASGI app: the relay's own routes straight to their endpoint, the rest to Starlette.
    Starlette's middleware and router cost about a tenth of the relay's CPU per vote, and the
    relay's frame (`RelayApp._guard`) already turns every failure into a response."""

    def __init__(
        self, direct: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]], fallback: Starlette
    ) -> None:
        self.direct = direct
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            endpoint = self.direct.get((scope["path"], scope["method"]))
            if endpoint is not None:
                scope["app"] = self.fallback
                response = await endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.fallback(scope, receive, send)


class RelayApp:
    """Builds the Starlette app around one `Relay` (None: no store configured, every write 503)."""

    def __init__(
        self,
        relay: Relay | None,
        credentials: Credentials,
        *,
        clock_now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.relay = relay
        self.credentials = credentials
        config = relay.config if relay else None
        self.max_body = config.max_body_bytes if config else 64 * 1024
        self.limiter = RateLimiter(
            config.rate_per_second if config else 20.0, config.rate_burst if config else 40, clock_now
        )
        endpoints: list[tuple[str, str, Callable[[Request], Awaitable[Response]]]] = [
            ("/api/feedback", "POST", self._guard(self.post_feedback)),
            ("/api/feedback", "PUT", self._guard(self.put_feedback)),
            ("/api/feedback", "DELETE", self._guard(self.delete_feedback)),
            ("/api/feedback", "GET", self._guard(self.get_feedback)),
            ("/api/scores", "POST", self._guard(self.post_score)),
            ("/healthz", "GET", self.healthz),
            ("/readyz", "GET", self.readyz),
            ("/metrics", "GET", self.metrics_page),
            ("/openapi.json", "GET", self.openapi),
        ]
        #: everything else (404, 405, HEAD, a trailing slash) is Starlette's to answer
        self.starlette = Starlette(routes=[Route(path, fn, methods=[method]) for path, method, fn in endpoints])
        self.app = _Dispatch({(path, method): fn for path, method, fn in endpoints}, self.starlette)

    # -- the frame around every API call --------------------------------------------------------

    def _guard(
        self, handler: Callable[[Request, Caller], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            started = time.perf_counter()
            try:
                caller = self._authenticate(request)
                if self.relay is None:
                    raise Problem(503, "no store is configured: the relay cannot write anything")
                response = await handler(request, caller)
            except Problem as problem:
                response = _json(problem.status, {"error": _clean(problem.message)}, problem.headers)
            except Exception:
                log.exception("internal error", extra={"event": "crash"})
                response = _json(500, {"error": "internal error"})
            self._count(request, response, started)
            return response

        return run

    def _count(self, request: Request, response: Response, started: float) -> None:
        route = request.scope["path"]
        if self.relay is not None:
            self.relay.metrics.inc(
                "relay_requests_total", route=route, method=request.method, status=str(response.status_code)
            )
        # refusals and failures at info; the flow of accepted writes at debug (it is in /metrics):
        # a JSON line per vote cost a quarter of the relay's throughput
        level = logging.INFO if response.status_code >= 400 else logging.DEBUG
        if not log.isEnabledFor(level):
            return
        log.log(
            level,
            "%s %s %d",
            request.method,
            route,
            response.status_code,
            extra={
                "event": "request",
                "method": request.method,
                "path": route,
                "status": response.status_code,
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "client": request.client.host if request.client else None,
            },
        )

    def _authenticate(self, request: Request) -> Caller:
        header = request.headers.get("authorization")
        if self.credentials.open:
            return Caller("open")
        if not header or not header.lower().startswith("bearer "):
            raise Problem(401, "missing credentials: Authorization: Bearer <gateway token or feedback token>",
                          {"WWW-Authenticate": "Bearer"})  # fmt: skip
        token = header[7:].strip()
        if is_feedback_token(token) and self.credentials.signing_key:
            try:
                return Caller("token", verify_token(self.credentials.signing_key, token))
            except TokenError as ex:
                raise Problem(401, str(ex), {"WWW-Authenticate": "Bearer"}) from None
        if self.credentials.gateway_token and hmac.compare_digest(
            token.encode(), self.credentials.gateway_token.encode()
        ):
            return Caller("gateway")
        raise Problem(401, "bad credentials", {"WWW-Authenticate": "Bearer"})

    async def _body(self, request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise Problem(413, f"the body is over {self.max_body} bytes")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.max_body:
                raise Problem(413, f"the body is over {self.max_body} bytes")
        return decode(bytes(data))

    def _limit(self, key: str) -> None:
        wait = self.limiter.take(key)
        if wait is not None:
            raise Problem(429, "too many requests from this client", {"Retry-After": str(int(wait))})

    def _client_key(self, request: Request, caller: Caller, named: str | None) -> str:
        if caller.grant is not None:
            return f"token:{caller.grant.subject}"
        if named:
            return f"named:{named}"
        return f"addr:{request.client.host if request.client else '?'}"

    @staticmethod
    def _granted(caller: Caller, answer: Answer, user: str | None, reviewer: str | None) -> str | None:
        """A feedback token's author (`user:<subject>`), after checking the request stays inside it."""
        grant = caller.grant
        if grant is None:
            return None
        if grant.answer != answer.key:
            raise Problem(403, "this feedback token is for another answer")
        if reviewer is not None or (user is not None and user != grant.subject):
            raise Problem(403, "a feedback token writes as its own subject only")
        return end_user(grant.subject)

    # -- the API -------------------------------------------------------------------------------

    async def _write(self, request: Request, caller: Caller, mode: Mode) -> Response:
        assert self.relay is not None
        if caller.grant is not None:
            self._limit(self._client_key(request, caller, None))
        req = parse_feedback(await self._body(request), max_text=self.relay.max_text())
        author = self._granted(caller, req.answer, req.user, req.reviewer)
        if author is None:
            author = req.reviewer or end_user(req.user)
            self._limit(self._client_key(request, caller, author if (req.reviewer or req.user) else None))
        written = await self.relay.feedback(req, author, mode)
        status = 201 if mode == "create" else 200 if written.where != "outbox" else 202
        return _json(status, {**written.body(), "author": author, **req.answer.public()})

    async def post_feedback(self, request: Request, caller: Caller) -> Response:
        mode = request.query_params.get("mode", "upsert")
        if mode not in ("upsert", "create"):
            raise Problem(400, "mode must be upsert or create (PUT replaces)")
        return await self._write(request, caller, "create" if mode == "create" else "upsert")

    async def put_feedback(self, request: Request, caller: Caller) -> Response:
        return await self._write(request, caller, "replace")

    async def delete_feedback(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        has_body = request.headers.get("content-length") not in (None, "0")
        data = await self._body(request) if has_body else dict(request.query_params)
        target_req = parse_target(data)
        answer = target_req.answer
        granted = self._granted(caller, answer, target_req.user, target_req.reviewer)
        if granted is not None:
            if target_req.author not in (None, granted):
                raise Problem(403, "a feedback token retracts its own feedback only")
            target = granted
            self._limit(self._client_key(request, caller, None))
        else:
            actor = target_req.reviewer or end_user(target_req.user)
            target = target_req.author or (end_user(target_req.user) if target_req.user else actor)
            if not target.startswith(END_USER) and target != actor:
                raise Problem(403, "another member's feedback is theirs to retract")
            self._limit(self._client_key(request, caller, actor))
        written = await self.relay.delete(answer, target)
        status = 200 if written.where != "outbox" else 202
        return _json(status, {**written.body(), "author": target, **answer.public()})

    async def get_feedback(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        query = dict(request.query_params)
        self._limit(self._client_key(request, caller, None))
        trace_id = query.get("traceId")
        session_id = query.get("sessionId") or query.get("contextId")
        reviewer = query.get("reviewer") or query.get("author")
        verdict = query.get("verdict")
        if caller.grant is not None:
            # a browser sees its own feedback on its own answer only
            answer = parse_answer(query)
            self._granted(caller, answer, None, None)
            items = self.relay.listing(trace_id=answer.trace_id, session_id=answer.session_id,
                                       author=end_user(caller.grant.subject))  # fmt: skip
            items = [i for i in items if i.get("turn") == answer.turn or answer.trace_id]
            return _json(200, {"data": items})
        if not any((trace_id, session_id, reviewer, verdict)):
            raise Problem(400, "name what to list: traceId, sessionId, reviewer or verdict")
        if verdict is not None and verdict not in ("positive", "negative", "false_alarm"):
            raise Problem(422, "verdict must be one of positive, negative, false_alarm")
        items = self.relay.listing(trace_id=trace_id, session_id=session_id, author=reviewer, verdict=verdict)
        return _json(200, {"data": items})

    async def post_score(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        if caller.grant is not None:
            raise Problem(403, "a feedback token writes votes and verdicts only (/api/feedback)")
        req = parse_score(await self._body(request))
        self._limit(f"source:{req.source}")
        written = await self.relay.score(req)
        status = 200 if written.where != "outbox" else 202
        return _json(status, {**written.body(), "source": req.source, "name": req.name})

    # -- operations ------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        if self.relay is None:
            return _json(503, {"status": "no store configured"})
        pending, dead, lag = self.relay.outbox_depth()
        reachable = self.relay.sink.reachable() if self.relay.sink.inline else True
        body: dict[str, Any] = {
            "status": "ok" if reachable else "store unreachable",
            "store": self.relay.sink.name,
            "outbox": {"pending": pending, "set_aside": dead, "oldest_seconds": lag},
        }
        if dead:  # each write a sink refused for good, listed on its own (the newest 20)
            body["outbox"]["set_aside_recent"] = [
                {"id": score_id, "error": _clean(error)} for score_id, error in self.relay.ledger.reads.set_aside()
            ]
        if self.relay.worker is not None:
            body["delivery"] = {
                "last_error": self.relay.worker.last_error and _clean(self.relay.worker.last_error)
            }
        return _json(200 if reachable else 503, body)

    async def metrics_page(self, request: Request) -> Response:
        if self.relay is None:
            return PlainTextResponse("", status_code=503)
        pending, dead, lag = self.relay.outbox_depth()
        gauges = {
            "relay_outbox_depth": ("operations not yet delivered", float(pending)),
            "relay_outbox_set_aside": ("operations the sink refused for good", float(dead)),
            "relay_delivery_lag_seconds": ("age of the oldest undelivered operation", lag or 0.0),
        }
        if self.relay.worker is not None:
            gauges["relay_delivered_total"] = (
                "operations delivered by the worker",
                float(self.relay.worker.delivered),
            )
        requests = getattr(self.relay.sink, "requests", None)
        if requests is not None:
            gauges["relay_langfuse_requests_total"] = ("requests sent to Langfuse", float(requests))
        return PlainTextResponse(self.relay.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        return Response(json.dumps(openapi_document()), media_type="application/json")
