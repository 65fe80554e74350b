"""A local stand-in of OpenAI's Batch API (files and batches) and of chat completions, on 127.0.0.1.

    with BatchServer(responder=keyword_responder, clock=virtual.monotonic) as server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test")
        ...
        server.count("cancel")  # requests per route; server.batches, server.files: the state

It follows OpenAI's published contract (../shared/notes/cost.md, "The batch contract"; the SDK's
`client.files` / `client.batches` resources):
- `POST /v1/files` (multipart: `file`, `purpose`) -> a file object; `GET /v1/files/{id}`,
  `GET /v1/files/{id}/content` (the bytes), `DELETE /v1/files/{id}`;
- `POST /v1/batches` (`input_file_id`, `endpoint`, `completion_window: "24h"`, `metadata`) -> a batch
  in `validating`; `GET /v1/batches` (a list), `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`;
- `POST /v1/chat/completions`: the same answers, directly (the caller's fallback).

A batch moves when it is asked (each retrieve is a step), never on its own:
`validating` -> (the input file checked, all or nothing) `failed` with `errors.data`, or
`in_progress`; in progress, each retrieve runs a share of the requests (by retrieves:
`polls_to_complete`, or by time on `clock`: `seconds_to_complete`); when all have run,
`finalizing`, then `completed`. A cancel makes it `cancelling`, then (after `cancel_polls`
retrieves) `cancelled`. Ending writes the output file (the 200 lines, in reverse order: "in any
order") and the error file (non-200 lines, and `batch_expired` / `batch_cancelled` lines for the
requests that never ran). `request_counts` follow.

The input is checked as OpenAI does, the whole file failing on any bad line (error codes are this
stand-in's own where OpenAI's exact ones are not published): a JSON object per line, `custom_id` a
unique string, `method` POST, `url` the batch's endpoint, a `body` naming its `model`; at most
`max_requests` lines and `max_bytes` bytes.

Answers come from `responder(body)`, as in `tests.doubles.openai_server` (a dict: JSON content of
the assistant message; a string: raw content; a `Reply`: any status or content), plus `RawBody`
(a response body that is not a chat completion) and `RawLine` (an output line that is not JSON).

Faults (`Faults`): a server without the batch endpoints (`unsupported=404`, like vLLM and Ollama;
405 or 501 also), expiry at a given retrieve (partial output), per-request failures by custom_id,
garbage answers on a route, transient 503s on a route, answers lost after the work was done (a
502 after a create), lines missing from the output, and
`restart(keep_state=...)`. A restart closes the listener and every open connection and listens
again on the same port; with `keep_state=True` (OpenAI's behaviour: batches outlive a server) the
batches go on where they were, with `keep_state=False` (an in-memory server such as a test double
or a crashed single replica) every file and batch is forgotten and their ids answer 404.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.doubles.openai_server import PrefixCache, Reply

ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class RawBody:
    """A 200 response whose body is this (not a chat completion)."""

    body: Any


@dataclass(frozen=True)
class RawLine:
    """The request's output line replaced by this text (not JSON)."""

    text: str


Answer = Reply | RawBody | RawLine | dict[str, Any] | str
Responder = Callable[[dict[str, Any]], Answer]


@dataclass
class Faults:
    """What goes wrong, on purpose."""

    #: every files and batches route answers this status (a server without the Batch API)
    unsupported: int | None = None
    #: custom_id -> the HTTP status its request fails with, or an error code (its line has `error`)
    fail: dict[str, int | str] = field(default_factory=dict)
    #: the batch expires at this retrieve while in progress (what ran is in the output)
    expire_after_polls: int | None = None
    #: route -> how many answers on it are garbage (truncated JSON; for "list", an HTML page)
    garbage: dict[str, int] = field(default_factory=dict)
    #: route -> how many answers on it are 503s first
    transient: dict[str, int] = field(default_factory=dict)
    #: route -> how many times the route does its work but the answer is lost (a proxy's 502)
    lose_answers: dict[str, int] = field(default_factory=dict)
    #: custom_ids whose line never reaches either file
    drop: set[str] = field(default_factory=set)


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass
class StoredBatch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: int
    started: float  # on the server's clock
    status: str = "validating"
    requests: list[dict[str, Any]] = field(default_factory=list)
    ran: int = 0
    polls: int = 0
    cancel_polls_left: int = 0
    lines: dict[str, dict[str, Any] | str] = field(default_factory=dict)  # custom_id -> output line
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    times: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.times.get("in_progress"),
            "expires_at": self.created_at + 24 * 3600,
            "finalizing_at": self.times.get("finalizing"),
            "completed_at": self.times.get("completed"),
            "failed_at": self.times.get("failed"),
            "expired_at": self.times.get("expired"),
            "cancelling_at": self.times.get("cancelling"),
            "cancelled_at": self.times.get("cancelled"),
            "request_counts": dict(self.counts),
            "metadata": self.metadata,
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the project's other stand-ins
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._connections.add(self.connection)

    def finish(self) -> None:
        self.server.owner._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # closed by a restart

    def _send(self, status: int, data: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client, or a restart, closed it

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        status, data, content_type = self.server.owner._route(method, path, self.headers, raw)
        self._send(status, data, content_type)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    owner: BatchServer


Response = tuple[int, bytes, str]


def _json(status: int, payload: Any) -> Response:
    return status, json.dumps(payload).encode(), "application/json"


def _error(status: int, message: str, param: str | None = None) -> Response:
    return _json(
        status, {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    )


class BatchServer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        faults: Faults | None = None,
        clock: Callable[[], float] = time.monotonic,
        polls_to_complete: int = 2,
        seconds_to_complete: float | None = None,
        cancel_polls: int = 1,
        max_requests: int = 50_000,
        max_bytes: int = 200_000_000,
        cached_prompt_tokens: int = 0,
        prompt_cache: bool = False,
        port: int = 0,
    ) -> None:
        """`clock`: the server's time (seconds; a virtual clock's `monotonic` in tests). A batch
        runs all its requests in `polls_to_complete` retrieves, or, with `seconds_to_complete`, in
        that many seconds of `clock` after it was created. `cached_prompt_tokens`: reported in each
        answer's `usage.prompt_tokens_details`; with `prompt_cache`, what a `PrefixCache` holds of
        the request's prompt instead (OpenAI caches inside a batch too, best effort)."""
        self.responder = responder
        self.faults = faults or Faults()
        self.clock = clock
        self.polls_to_complete = max(polls_to_complete, 1)
        self.seconds_to_complete = seconds_to_complete
        self.cancel_polls = cancel_polls
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.cached_prompt_tokens = cached_prompt_tokens
        self.prompt_cache = PrefixCache() if prompt_cache else None
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, StoredBatch] = {}
        #: (method, path) of every request, in order
        self.log: list[tuple[str, str]] = []
        self.routes: Counter[str] = Counter()
        self.restarts = 0
        self._ids = itertools.count(1)
        self._epoch = time.time() - clock()
        self._lock = threading.RLock()
        self._connections: set[socket.socket] = set()
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- life ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> BatchServer:
        httpd = _Server(("127.0.0.1", self._port), _Handler)
        httpd.owner = self
        self._port = int(httpd.server_address[1])
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="batch-stand-in", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        for conn in list(self._connections):  # keep-alive connections die with the process
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._connections.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def restart(self, *, keep_state: bool = True) -> None:
        """Stop and listen again on the same port; `keep_state=False` forgets every file and batch.
        (`stop()`, then `come_back()` later, leaves the port closed in between: connections refused.)"""
        self.stop()
        self.come_back(keep_state=keep_state)

    def come_back(self, *, keep_state: bool = True) -> None:
        """Listen again on the same port after `stop()`, as a restarted server."""
        with self._lock:
            self.restarts += 1
            if not keep_state:
                self.files.clear()
                self.batches.clear()
        self.start()

    def __enter__(self) -> BatchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def count(self, route: str) -> int:
        """Requests on a route: list, upload, file, content, delete, create, status, cancel, chat."""
        with self._lock:
            return self.routes[route]

    # -- routing -------------------------------------------------------------------------------

    def _route(self, method: str, path: str, headers: Any, raw: bytes) -> Response:
        parts = path.strip("/").split("/")
        if parts[:1] == ["v1"]:
            parts = parts[1:]
        route = _route_name(method, parts)
        with self._lock:
            self.log.append((method, path))
            self.routes[route] += 1
            if route != "chat" and self.faults.unsupported is not None:
                status = self.faults.unsupported
                if status == 404:
                    return _json(404, {"detail": "Not Found"})  # FastAPI's, as vLLM answers
                return _json(
                    status, {"error": {"message": f"{method} {path} is not supported", "code": None}}
                )
            if self.faults.transient.get(route, 0) > 0:
                self.faults.transient[route] -= 1
                return _json(503, {"error": {"message": "temporarily unavailable", "code": None}})
            if self.faults.garbage.get(route, 0) > 0:
                self.faults.garbage[route] -= 1
                if route == "list":
                    return 200, b"<!doctype html><html><body>Welcome</body></html>", "text/html"
                return 200, b'{"id": "batch_', "application/json"
            handler = getattr(self, f"_on_{route}", None)
            if handler is None:
                return _json(404, {"detail": "Not Found"})
            response: Response = handler(parts, headers, raw)
            if self.faults.lose_answers.get(route, 0) > 0:
                self.faults.lose_answers[route] -= 1
                return _json(502, {"error": {"message": "bad gateway", "code": None}})
            return response

    def _on_chat(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "invalid JSON body")
        status, payload = self._answer(body)
        if isinstance(payload, RawLine):
            return 200, payload.text.encode(), "application/json"
        return _json(status, payload)

    def _on_upload(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        fields = _multipart(headers.get("Content-Type", ""), raw)
        if fields is None or "file" not in fields or "purpose" not in fields:
            return _error(400, "expected multipart/form-data with 'file' and 'purpose'")
        filename, data = fields["file"]
        purpose = fields["purpose"][1].decode()
        if purpose not in ("batch", "fine-tune", "assistants", "vision", "user_data", "evals"):
            return _error(400, f"'{purpose}' is not one of the supported purposes", "purpose")
        stored = StoredFile(self._id("file"), filename or "upload", purpose, data, self._now())
        self.files[stored.id] = stored
        return _json(200, stored.public())

    def _on_file(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        stored = self.files.get(parts[1])
        return (
            _json(200, stored.public()) if stored else _error(404, f"No such File object: {parts[1]}", "id")
        )

    def _on_content(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        stored = self.files.get(parts[1])
        if stored is None:
            return _error(404, f"No such File object: {parts[1]}", "id")
        return 200, stored.data, "application/octet-stream"

    def _on_delete(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        if self.files.pop(parts[1], None) is None:
            return _error(404, f"No such File object: {parts[1]}", "id")
        return _json(200, {"id": parts[1], "object": "file", "deleted": True})

    def _on_list(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        data = [b.public() for b in reversed(self.batches.values())]
        return _json(
            200,
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": False,
            },
        )

    def _on_create(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "invalid JSON body")
        file_id = body.get("input_file_id")
        stored = self.files.get(file_id) if isinstance(file_id, str) else None
        if stored is None:
            return _error(404, f"No such File object: {file_id}", "input_file_id")
        if stored.purpose != "batch":
            return _error(400, "the input file must be uploaded with purpose 'batch'", "input_file_id")
        if body.get("endpoint") != ENDPOINT:
            return _error(400, f"this server batches only {ENDPOINT}", "endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be '24h'", "completion_window")
        batch = StoredBatch(
            id=self._id("batch"),
            input_file_id=file_id,
            endpoint=ENDPOINT,
            completion_window="24h",
            metadata=body.get("metadata"),
            created_at=self._now(),
            started=self.clock(),
        )
        self.batches[batch.id] = batch
        return _json(200, batch.public())

    def _on_status(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        batch = self.batches.get(parts[1])
        if batch is None:
            return _error(404, f"No batch found with id '{parts[1]}'", "batch_id")
        self._advance(batch)
        return _json(200, batch.public())

    def _on_cancel(self, parts: list[str], headers: Any, raw: bytes) -> Response:
        batch = self.batches.get(parts[1])
        if batch is None:
            return _error(404, f"No batch found with id '{parts[1]}'", "batch_id")
        if batch.status in ("validating", "in_progress", "finalizing"):
            batch.status = "cancelling"
            batch.times["cancelling"] = self._now()
            batch.cancel_polls_left = self.cancel_polls
            if self.cancel_polls <= 0:
                self._end(batch, "cancelled")
        elif batch.status != "cancelling":
            return _error(400, f"Cannot cancel a batch with status '{batch.status}'.")
        return _json(200, batch.public())

    # -- a batch's life --------------------------------------------------------------------------

    def _advance(self, batch: StoredBatch) -> None:
        """One step, on each retrieve."""
        if batch.status == "validating":
            errors = self._validate(batch)
            if errors:
                batch.errors = errors
                batch.status = "failed"
                batch.times["failed"] = self._now()
            else:
                batch.status = "in_progress"
                batch.times["in_progress"] = self._now()
                batch.counts["total"] = len(batch.requests)
            return
        if batch.status == "in_progress":
            batch.polls += 1
            total = len(batch.requests)
            if self.seconds_to_complete is not None:
                share = (
                    (self.clock() - batch.started) / self.seconds_to_complete
                    if self.seconds_to_complete
                    else 1
                )
            else:
                share = batch.polls / self.polls_to_complete
            due = min(total, math.floor(total * min(max(share, 0.0), 1.0)))
            while batch.ran < due:
                self._run(batch, batch.requests[batch.ran])
                batch.ran += 1
            expiry = self.faults.expire_after_polls
            if expiry is not None and batch.polls >= expiry and batch.ran < total:
                self._end(batch, "expired")
            elif batch.ran >= total:
                batch.status = "finalizing"
                batch.times["finalizing"] = self._now()
            return
        if batch.status == "finalizing":
            self._end(batch, "completed")
            return
        if batch.status == "cancelling":
            batch.cancel_polls_left -= 1
            if batch.cancel_polls_left <= 0:
                self._end(batch, "cancelled")

    def _validate(self, batch: StoredBatch) -> list[dict[str, Any]]:
        stored = self.files.get(batch.input_file_id)
        if stored is None:
            return [{"code": "file_not_found", "message": "The input file no longer exists.", "line": None}]
        if not stored.data.strip():
            return [{"code": "empty_file", "message": "The batch input file is empty.", "line": None}]
        if len(stored.data) > self.max_bytes:
            return [{"code": "file_too_large", "message": f"over {self.max_bytes} bytes", "line": None}]
        rows = [r for r in stored.data.decode(errors="replace").splitlines() if r.strip()]
        if len(rows) > self.max_requests:
            message = f"{len(rows)} requests; at most {self.max_requests} a batch"
            return [{"code": "too_many_requests", "message": message, "line": None}]
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        requests = []
        for number, row in enumerate(rows, start=1):

            def bad(code: str, message: str, param: str | None = None, number: int = number) -> None:
                errors.append({"code": code, "message": message, "param": param, "line": number})

            try:
                line = json.loads(row)
            except ValueError:
                bad("invalid_json_line", "This line is not parseable as valid JSON.")
                continue
            if not isinstance(line, dict):
                bad("invalid_json_line", "Each line must be a JSON object.")
                continue
            cid = line.get("custom_id")
            if not isinstance(cid, str) or not cid:
                bad("missing_required_parameter", "custom_id is required.", "custom_id")
            elif cid in seen:
                bad("duplicate_custom_id", f"The custom_id '{cid}' is not unique.", "custom_id")
            else:
                seen.add(cid)
            if line.get("method") != "POST":
                bad("invalid_method", "Only POST is supported.", "method")
            if line.get("url") != batch.endpoint:
                bad("mismatched_url", f"The url must be the batch's endpoint {batch.endpoint}.", "url")
            body = line.get("body")
            if not isinstance(body, dict) or not body.get("model"):
                bad("missing_required_parameter", "body.model is required.", "body.model")
            requests.append(line)
        if not errors:
            batch.requests = requests
        return errors

    def _run(self, batch: StoredBatch, request: dict[str, Any]) -> None:
        cid = request["custom_id"]
        n = next(self._ids)
        line_id = f"batch_req_{n}"
        request_id = f"req_{n}"
        failure = self.faults.fail.get(cid)
        if isinstance(failure, str):
            message = "The request timed out." if failure == "request_timeout" else f"scripted {failure}"
            line: dict[str, Any] | str = {
                "id": line_id,
                "custom_id": cid,
                "response": None,
                "error": {"code": failure, "message": message},
            }
        elif isinstance(failure, int):
            line = {
                "id": line_id,
                "custom_id": cid,
                "response": {
                    "status_code": failure,
                    "request_id": request_id,
                    "body": {
                        "error": {"message": f"scripted HTTP {failure}", "type": "server_error", "code": None}
                    },
                },
                "error": None,
            }
        else:
            status, payload = self._answer(request["body"])
            if isinstance(payload, RawLine):
                line = payload.text
            else:
                response = {"status_code": status, "request_id": request_id, "body": payload}
                line = {"id": line_id, "custom_id": cid, "response": response, "error": None}
        batch.lines[cid] = line
        ok = isinstance(line, str) or (line.get("response") or {}).get("status_code") == 200
        batch.counts["completed" if ok else "failed"] += 1

    def _end(self, batch: StoredBatch, status: str) -> None:
        """Write the output and error files; the requests that never ran go to the error file."""
        code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status)
        for request in batch.requests[batch.ran :]:
            if code is None:
                break
            cid = request["custom_id"]
            message = (
                "This request could not be executed before the completion window expired."
                if code == "batch_expired"
                else "This request was not executed because the batch was cancelled."
            )
            batch.lines[cid] = {
                "id": f"batch_req_{next(self._ids)}",
                "custom_id": cid,
                "response": None,
                "error": {"code": code, "message": message},
            }
            batch.counts["failed"] += 1
        output, errors = [], []
        for cid, line in reversed(batch.lines.items()):  # "in any order"
            if cid in self.faults.drop:
                continue
            if isinstance(line, str):
                output.append(line)
            elif (line.get("response") or {}).get("status_code") == 200:
                output.append(json.dumps(line))
            else:
                errors.append(json.dumps(line))
        if output:
            batch.output_file_id = self._store(f"{batch.id}_output.jsonl", output)
        if errors:
            batch.error_file_id = self._store(f"{batch.id}_error.jsonl", errors)
        batch.status = status
        batch.times[status] = self._now()

    def _store(self, name: str, rows: list[str]) -> str:
        stored = StoredFile(
            self._id("file"), name, "batch_output", ("\n".join(rows) + "\n").encode(), self._now()
        )
        self.files[stored.id] = stored
        return stored.id

    def _answer(self, body: dict[str, Any]) -> tuple[int, Any]:
        """(status, response body) for one chat request, from the responder."""
        if self.responder is None:
            return 500, {"error": {"message": "no responder", "type": "server_error", "code": None}}
        out = self.responder(body)
        if isinstance(out, RawBody):
            return 200, out.body
        if isinstance(out, RawLine):
            return 200, out
        reply = (
            out if isinstance(out, Reply) else Reply.json(out) if isinstance(out, dict) else Reply.text(out)
        )
        if reply.status != 200:
            return reply.status, {"error": reply.error or {"message": "error"}}
        n = next(self._ids)
        hit = self.prompt_cache.cached(body) if self.prompt_cache is not None else self.cached_prompt_tokens
        cached = min(hit, reply.prompt_tokens)
        return 200, {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": self._now(),
            "model": body.get("model", "scripted"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content, "refusal": reply.refusal},
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    def _now(self) -> int:
        return int(self._epoch + self.clock())


def _route_name(method: str, parts: list[str]) -> str:
    match method, parts:
        case "POST", ["chat", "completions"]:
            return "chat"
        case "POST", ["files"]:
            return "upload"
        case "GET", ["files", _]:
            return "file"
        case "GET", ["files", _, "content"]:
            return "content"
        case "DELETE", ["files", _]:
            return "delete"
        case "GET", ["batches"]:
            return "list"
        case "POST", ["batches"]:
            return "create"
        case "GET", ["batches", _]:
            return "status"
        case "POST", ["batches", _, "cancel"]:
            return "cancel"
    return "unknown"


def _multipart(content_type: str, raw: bytes) -> dict[str, tuple[str | None, bytes]] | None:
    """The fields of a multipart/form-data body: name -> (filename, bytes)."""
    if not content_type.startswith("multipart/form-data"):
        return None
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw
    )
    if not message.is_multipart():
        return None
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = (part.get_filename(), payload)
    return fields
