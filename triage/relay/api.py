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

import asyncio
import functools
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from triage.domain.review import VERDICTS
from triage.domain.scores import END_USER
from triage.redact import printable, redact
from triage.relay.access import (
    Grant,
    Proxies,
    RateLimiter,
    SessionKeys,
    TokenError,
    is_feedback_token,
    verify_token,
)
from triage.relay.bodies import Answer, decode, parse_answer, parse_feedback, parse_score, parse_target
from triage.relay.openapi import openapi_document
from triage.relay.service import Mode, Relay, end_user
from triage.relay.web import Cors, Dispatch, Problem, json_response

log = logging.getLogger("triage.relay")


@dataclass(frozen=True)
class Credentials:
    """The gateway's bearer token, the key that signs feedback tokens, the keys that verify the
    gateway's session JWTs; none of them: a laptop."""

    gateway_token: str | None = None
    signing_key: str | None = None
    sessions: SessionKeys | None = None

    @property
    def open(self) -> bool:
        return not self.gateway_token and not self.signing_key and self.sessions is None


@dataclass(frozen=True)
class Caller:
    """Who is calling: "open" (no credentials configured), "gateway" (its bearer token: it may name
    the user or the reviewer), "token" (a browser's feedback token: one answer, one subject), or
    "session" (a browser's session JWT: its subject, on any answer)."""

    kind: Literal["open", "gateway", "token", "session"]
    grant: Grant | None = None
    subject: str | None = None

    @property
    def person(self) -> str | None:
        """The end user the credential itself names (a token's or a session's subject)."""
        return self.grant.subject if self.grant is not None else self.subject


def _clean(message: str) -> str:
    """What an error may say: secrets masked, no control characters, short."""
    return printable(redact(message))[:400]


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
        self.body_seconds = config.body_seconds if config else 10.0
        self.limiter = RateLimiter(
            config.rate_per_second if config else 20.0, config.rate_burst if config else 40, clock_now
        )
        self.proxies = Proxies(config.trusted_proxies if config else [])
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
        self.app = Dispatch(
            {(path, method): fn for path, method, fn in endpoints},
            self.starlette,
            Cors(config.cors_origins if config else []),
        )

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
                response = json_response(problem.status, {"error": _clean(problem.message)}, problem.headers)
            except Exception:
                log.exception("internal error", extra={"event": "crash"})
                response = json_response(500, {"error": "internal error"})
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
        """The caller, from `X-Feedback-Token` (a feedback token that crosses a gateway owning
        `Authorization`) or `Authorization: Bearer` (a feedback token, a session JWT, the gateway's
        token)."""
        if self.credentials.open:
            return Caller("open")
        creds = self.credentials
        refused = {"WWW-Authenticate": "Bearer"}
        feedback = request.headers.get("x-feedback-token")
        header = request.headers.get("authorization")
        token = header[7:].strip() if header and header.lower().startswith("bearer ") else None
        if feedback is None and token is not None and is_feedback_token(token):
            feedback = token
        try:
            if feedback is not None and creds.signing_key:
                return Caller("token", verify_token(creds.signing_key, feedback.strip()))
            if token is None:
                raise Problem(401, "missing credentials: Authorization: Bearer <gateway token, session token or "
                              "feedback token>, or X-Feedback-Token", refused)  # fmt: skip
            if creds.sessions is not None and SessionKeys.looks_like(token):
                return Caller("session", subject=creds.sessions.subject(token))
        except TokenError as ex:
            raise Problem(401, str(ex), refused) from None
        if creds.gateway_token and hmac.compare_digest(token.encode(), creds.gateway_token.encode()):
            return Caller("gateway")
        raise Problem(401, "bad credentials", refused)

    async def _body(self, request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise Problem(413, f"the body is over {self.max_body} bytes")
        data = bytearray()
        try:
            async with asyncio.timeout(self.body_seconds):  # a body trickled in holds no one for ever
                async for chunk in request.stream():
                    data += chunk
                    if len(data) > self.max_body:
                        raise Problem(413, f"the body is over {self.max_body} bytes")
        except TimeoutError:
            raise Problem(408, f"the body did not arrive within {self.body_seconds:g} s") from None
        return decode(bytes(data))

    def _limit(self, key: str) -> None:
        wait = self.limiter.take(key)
        if wait is not None:
            raise Problem(429, "too many requests from this client", {"Retry-After": str(int(wait))})

    def _client_key(self, request: Request, caller: Caller, named: str | None) -> str:
        """Whose rate bucket: the verified subject, else the user or reviewer the gateway names,
        else the client's address (behind a trusted proxy, the address it forwards)."""
        if caller.person is not None:
            return f"{caller.kind}:{caller.person}"
        if named:
            return f"named:{named}"
        return f"addr:{self.proxies.client(request)}"

    @staticmethod
    def _granted(caller: Caller, answer: Answer, user: str | None, reviewer: str | None) -> tuple[str, Answer] | None:
        """The author (`user:<subject>`) and the answer a token or a session writes on, after checking
        the request stays inside its credential; None for the gateway and an open relay. A feedback
        token's answer is its own: nothing in the body (an extra sessionId, a turn) can move it."""
        subject = caller.person
        if subject is None:
            return None
        if reviewer is not None or (user is not None and user != subject):
            raise Problem(403, "a browser's credential writes as its own subject only")
        if caller.grant is not None:
            if caller.grant.answer != answer.key:
                raise Problem(403, "this feedback token is for another answer")
            answer = Answer.from_key(caller.grant.answer)
        return end_user(subject), answer

    # -- the API -------------------------------------------------------------------------------

    async def _write(self, request: Request, caller: Caller, mode: Mode) -> Response:
        assert self.relay is not None
        if caller.person is not None:
            self._limit(self._client_key(request, caller, None))
        req = parse_feedback(await self._body(request), max_text=self.relay.max_text())
        granted = self._granted(caller, req.answer, req.user, req.reviewer)
        if granted is not None:
            author, answer = granted
            req = replace(req, answer=answer)
        else:
            author = req.reviewer or end_user(req.user)
            self._limit(self._client_key(request, caller, author if (req.reviewer or req.user) else None))
        written = await self.relay.feedback(req, author, mode)
        status = 201 if mode == "create" else 200 if written.where != "outbox" else 202
        return json_response(status, {**written.body(), "author": author, **req.answer.public()})

    async def post_feedback(self, request: Request, caller: Caller) -> Response:
        mode = request.query_params.get("mode", "upsert")
        if mode not in ("upsert", "create"):
            raise Problem(400, "mode must be upsert or create (PUT replaces)")
        return await self._write(request, caller, "create" if mode == "create" else "upsert")

    async def put_feedback(self, request: Request, caller: Caller) -> Response:
        return await self._write(request, caller, "replace")

    async def delete_feedback(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        # a body, with its length or chunked (a chunked DELETE was read from the query alone)
        has_body = request.headers.get("content-length") not in (None, "0") or "chunked" in request.headers.get(
            "transfer-encoding", ""
        ).lower()
        data = await self._body(request) if has_body else dict(request.query_params)
        target_req = parse_target(data)
        answer = target_req.answer
        granted = self._granted(caller, answer, target_req.user, target_req.reviewer)
        if granted is not None:
            target, answer = granted
            if target_req.author not in (None, target):
                raise Problem(403, "a browser's credential retracts its own feedback only")
            self._limit(self._client_key(request, caller, None))
        else:
            actor = target_req.reviewer or end_user(target_req.user)
            target = target_req.author or (end_user(target_req.user) if target_req.user else actor)
            if not target.startswith(END_USER) and target != actor:
                raise Problem(403, "another member's feedback is theirs to retract")
            self._limit(self._client_key(request, caller, actor))
        written = await self.relay.delete(answer, target)
        status = 200 if written.where != "outbox" else 202
        return json_response(status, {**written.body(), "author": target, **answer.public()})

    async def get_feedback(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        query = dict(request.query_params)
        self._limit(self._client_key(request, caller, None))
        trace_id = query.get("traceId")
        session_id = query.get("sessionId") or query.get("contextId")
        reviewer = query.get("reviewer") or query.get("author")
        verdict = query.get("verdict")
        limit_text = query.get("limit", "100")
        if not (limit_text.isascii() and limit_text.isdigit()) or len(limit_text) > 6:
            raise Problem(400, "limit must be a whole number from 1 to 1000")
        limit, cursor = int(limit_text), query.get("cursor")
        granted = self._granted(caller, parse_answer(query), None, None) if caller.person is not None else None
        if granted is not None:
            # a browser sees its own feedback on its own answer only
            author, answer = granted
            items, after = await asyncio.to_thread(
                functools.partial(self.relay.listing, limit=limit, cursor=cursor),
                trace_id=answer.trace_id, session_id=answer.session_id, author=author,
            )  # fmt: skip
            items = [i for i in items if i.get("turn") == answer.turn or answer.trace_id]
            return json_response(200, {"data": items, "next_cursor": after})
        if not any((trace_id, session_id, reviewer, verdict)):
            raise Problem(400, "name what to list: traceId, sessionId, reviewer or verdict")
        if verdict is not None and verdict not in VERDICTS:
            raise Problem(422, f"verdict must be one of {', '.join(VERDICTS)}")
        # off the event loop: a listing of thousands held every vote up behind it (1-1.6 s for 20,000)
        items, after = await asyncio.to_thread(
            functools.partial(self.relay.listing, limit=limit, cursor=cursor),
            trace_id=trace_id, session_id=session_id, author=reviewer, verdict=verdict,
        )  # fmt: skip
        return json_response(200, {"data": items, "next_cursor": after})

    async def post_score(self, request: Request, caller: Caller) -> Response:
        assert self.relay is not None
        if caller.person is not None:
            raise Problem(403, "a browser's credential writes votes and verdicts only (/api/feedback)")
        req = parse_score(await self._body(request))
        self._limit(f"source:{req.source}")
        written = await self.relay.score(req)
        status = 200 if written.where != "outbox" else 202
        return json_response(status, {**written.body(), "source": req.source, "name": req.name})

    # -- operations ------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        if self.relay is None:
            return json_response(503, {"status": "no store configured"})
        try:
            return await asyncio.to_thread(self._readiness)  # a probe of the database is I/O
        except Problem as problem:  # the ledger cannot be read (its database is down)
            return json_response(503, {"status": _clean(problem.message)}, problem.headers)

    def _readiness(self) -> Response:
        assert self.relay is not None
        pending, dead, lag = self.relay.outbox_depth()
        reachable = self.relay.sink.reachable() if self.relay.sink.inline else True
        unwritable = self.relay.ledger.ready() or ("writes failing" if self.relay.writes_failing() else None)
        ready = reachable and unwritable is None
        body: dict[str, Any] = {
            "status": "ok" if ready else "store unreachable" if not reachable else _clean(str(unwritable)),
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
        return json_response(200 if ready else 503, body)

    async def metrics_page(self, request: Request) -> Response:
        if self.relay is None:
            return PlainTextResponse("", status_code=503)
        try:
            pending, dead, lag = self.relay.outbox_depth()
        except Problem as problem:  # the ledger cannot be read: say so, without a traceback
            return PlainTextResponse(f"# {_clean(problem.message)}\n", status_code=503)
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
            gauges["relay_housekeeping_failures_total"] = (
                "WAL checkpoints of the store or the ledger that failed",
                float(self.relay.worker.housekeeping_failures),
            )
        requests = getattr(self.relay.sink, "requests", None)
        if requests is not None:
            gauges["relay_langfuse_requests_total"] = ("requests sent to Langfuse", float(requests))
        return PlainTextResponse(self.relay.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        return Response(json.dumps(openapi_document()), media_type="application/json")
