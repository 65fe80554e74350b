"""Unit-test helpers for the Langfuse client over `httpx.MockTransport`: no sockets, no sleeps.

A `Router` answers (method, path) with queued replies, then with a standing one, and records every
request it sees in `history`. The builders return bodies in the shapes of Langfuse's API contract
(../shared/langfuse/openapi.yml): a v3 scores page, a v2 observations page, the projects list, and
the answers of `POST /api/public/scores` (200 on the older contract, 202 and 207 on the newer).

    router = Router().on("GET", PROJECTS, error(429, headers={"Retry-After": "2"}), reply(200, projects()))
    backend = LangfuseBackend(..., httpx_client=router.client(), clock=VirtualClock())
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

BASE_URL = "https://langfuse.test"
PROJECTS = "/api/public/projects"
SCORES = "/api/public/scores"
SCORES_V3 = "/api/public/v3/scores"
OBSERVATIONS_V2 = "/api/public/v2/observations"


@dataclass(frozen=True)
class Reply:
    """One answer, built afresh for every request it serves (an httpx.Response is read only once)."""

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def response(self) -> httpx.Response:
        if self.body is None:
            return httpx.Response(self.status, headers=dict(self.headers))
        if isinstance(self.body, str):
            return httpx.Response(self.status, text=self.body, headers=dict(self.headers))
        return httpx.Response(self.status, json=self.body, headers=dict(self.headers))


#: what a route answers: a reply, a function of the request, or an exception to raise
#: (an `httpx.TransportError` such as `httpx.ConnectError("refused")` acts as a dropped connection)
Handler = Callable[[httpx.Request], Reply | httpx.Response]
Answer = Reply | Handler | BaseException


def reply(status: int = 200, body: Any = None, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, body, dict(headers or {}))


def error(status: int, message: str | None = None, headers: Mapping[str, str] | None = None) -> Reply:
    """An error answer with Langfuse's `{"message": ...}` body."""
    return reply(status, {"message": message or f"HTTP {status}"}, headers)


@dataclass
class _Route:
    queued: deque[Answer]
    then: Answer | None


class Router:
    """The MockTransport handler: (method, path) -> queued answers, then a standing one.

    More than `max_requests` requests fail the test (AssertionError, which no retry loop retries),
    so a retry loop that never gives up fails fast instead of spinning in virtual time.
    """

    def __init__(self, max_requests: int = 500) -> None:
        self._routes: dict[tuple[str, str], _Route] = {}
        self.history: list[httpx.Request] = []
        self.max_requests = max_requests

    def on(self, method: str, path: str, *answers: Answer, then: Answer | None = None) -> Router:
        """Answer `method path` with `answers` in turn, then with `then` for every later request.
        A request past the queue with no `then` fails the test (AssertionError)."""
        self._routes[(method.upper(), path)] = _Route(deque(answers), then)
        return self

    def enqueue(self, method: str, path: str, *answers: Answer) -> Router:
        """Queue more answers on an existing route (ahead of its standing answer)."""
        self._routes[(method.upper(), path)].queued.extend(answers)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.history.append(request)
        if len(self.history) > self.max_requests:
            raise AssertionError(f"more than {self.max_requests} requests: a retry loop that never stops?")
        route = self._routes.get((request.method, request.url.path))
        if route is None:
            raise AssertionError(f"unexpected request: {request.method} {request.url}")
        if route.queued:
            answer = route.queued.popleft()
        elif route.then is not None:
            answer = route.then
        else:
            raise AssertionError(f"no answer left for {request.method} {request.url}")
        if isinstance(answer, BaseException):
            raise answer
        out = answer if isinstance(answer, Reply) else answer(request)
        return out.response() if isinstance(out, Reply) else out

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self), **kwargs)

    def requests(self, method: str | None = None, path: str | None = None) -> list[httpx.Request]:
        return [
            r
            for r in self.history
            if (method is None or r.method == method.upper()) and (path is None or r.url.path == path)
        ]


def body(request: httpx.Request) -> Any:
    """The decoded JSON body of a recorded request."""
    return json.loads(request.content)


def params(request: httpx.Request) -> dict[str, str]:
    """The query parameters of a recorded request (the last value of each)."""
    return dict(request.url.params)


def http_date(stamp: datetime) -> str:
    """`stamp` as an HTTP date (the form a `Retry-After` header may take)."""
    return stamp.astimezone(UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")


def iso(stamp: datetime) -> str:
    stamp = stamp.astimezone(UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


# --------------------------------------------------------------------------- bodies


def score_v3(
    score_id: str,
    *,
    timestamp: datetime,
    name: str = "user_feedback",
    value: Any = 0,
    data_type: str = "BOOLEAN",
    subject: dict[str, Any] | None = None,
    comment: str | None = None,
    metadata: Any = None,
    updated_at: datetime | None = None,
    environment: str = "default",
) -> dict[str, Any]:
    """One ScoreV3 row with the `details` and `subject` groups. BOOLEAN values go out as booleans."""
    if data_type == "BOOLEAN" and not isinstance(value, bool):
        value = bool(value)
    row: dict[str, Any] = {
        "id": score_id,
        "projectId": "proj-test",
        "name": name,
        "dataType": data_type,
        "value": value,
        "source": "API",
        "timestamp": iso(timestamp),
        "environment": environment,
        "createdAt": iso(timestamp),
        "updatedAt": iso(updated_at or timestamp),
        "comment": comment,
        "configId": None,
        "metadata": metadata,
    }
    if subject is not None:
        row["subject"] = subject
    return row


def on_trace(trace_id: str) -> dict[str, Any]:
    return {"kind": "trace", "id": trace_id}


def on_observation(observation_id: str, trace_id: str) -> dict[str, Any]:
    return {"kind": "observation", "id": observation_id, "traceId": trace_id}


def on_session(session_id: str) -> dict[str, Any]:
    return {"kind": "session", "id": session_id}


def scores_page(
    rows: Iterable[dict[str, Any]], cursor: str | None = None, limit: int = 100
) -> dict[str, Any]:
    """A `GetScoresV3Response`: `meta.cursor` only when there is a next page."""
    meta: dict[str, Any] = {"limit": limit}
    if cursor:
        meta["cursor"] = cursor
    return {"data": list(rows), "meta": meta}


def scores_table(rows: Iterable[dict[str, Any]]) -> Handler:
    """A v3 scores read over fixed rows, honouring the `id` and `name` filters (comma lists)."""
    table = list(rows)

    def handle(request: httpx.Request) -> Reply:
        q = params(request)
        ids = set(q["id"].split(",")) if q.get("id") else None
        names = set(q["name"].split(",")) if q.get("name") else None
        found = [
            r for r in table if (ids is None or r["id"] in ids) and (names is None or r["name"] in names)
        ]
        return reply(200, scores_page(found))

    return handle


def observation_v2(
    observation_id: str,
    trace_id: str,
    *,
    start: datetime,
    type: str = "SPAN",
    name: str | None = None,
    parent: str | None = None,
    input: Any = None,
    output: Any = None,
    session_id: str | None = None,
    updated_at: datetime | None = None,
    metadata: Any = None,
) -> dict[str, Any]:
    """One ObservationV2 row (groups core, basic, time, io, metadata). `input`/`output` are sent as
    the API sends them: JSON-encoded strings."""
    return {
        "id": observation_id,
        "traceId": trace_id,
        "startTime": iso(start),
        "endTime": None,
        "projectId": "proj-test",
        "parentObservationId": parent,
        "type": type,
        "modelId": None,
        "inputPrice": None,
        "outputPrice": None,
        "totalPrice": None,
        "name": name,
        "level": "DEFAULT",
        "statusMessage": None,
        "version": None,
        "environment": "default",
        "bookmarked": False,
        "public": False,
        "userId": None,
        "sessionId": session_id,
        "isRootObservation": parent is None,
        "completionStartTime": None,
        "createdAt": iso(start),
        "updatedAt": iso(updated_at or start),
        "input": None if input is None else json.dumps(input),
        "output": None if output is None else json.dumps(output),
        "metadata": metadata,
    }


def observations_page(rows: Iterable[dict[str, Any]], cursor: str | None = None) -> dict[str, Any]:
    """An `ObservationsV2Response`."""
    meta: dict[str, Any] = {}
    if cursor:
        meta["cursor"] = cursor
    return {"data": list(rows), "meta": meta}


def projects(project_id: str = "proj-test") -> dict[str, Any]:
    """The `Projects` body of `GET /api/public/projects` (one project, as a project key sees it)."""
    return {
        "data": [
            {
                "id": project_id,
                "name": "test project",
                "organization": {"id": "org-test", "name": "test org"},
                "metadata": {},
            }
        ]
    }


def score_created(score_id: str) -> Reply:
    """The older contract's answer to one score object."""
    return reply(200, {"id": score_id})


def scores_accepted() -> Reply:
    """The newer contract: the whole list was queued."""
    return reply(202, {"message": "Accepted"})


def scores_partial(accepted: int, *messages: str) -> Reply:
    """The newer contract: some of the list was rejected. The errors carry no score id."""
    return reply(
        207, {"accepted": accepted, "rejected": len(messages), "errors": [{"message": m} for m in messages]}
    )
