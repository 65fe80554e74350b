"""A local stand-in for the agent `triage check` checks, on 127.0.0.1, over real HTTP.

    with AgentStandIn({"How do I X?": Reply(text="Do Y. https://docs/x"), ...}) as agent:
        agent.url            # http://127.0.0.1:PORT
        agent.asked("How do I X?")  # how many times the question arrived

It speaks two contracts, the ways agents are deployed:

- `POST /v1/chat/completions`: OpenAI-compatible chat (the question is the last user message; the
  reply a `chat.completion` whose message is the answer, the trace id in an `x-trace-id` header);
- `POST /ask`: a custom JSON API: the body must hold `{"input": {"question": ...}}` (the question as
  one JSON string, as a configured template puts it); the reply is
  `{"result": {"answer", "citations": [{"url"}]}, "trace": {"id"}, "steps": [{"tool", "collection",
  "args"}]}`.

Each question is answered by its scripted `Reply` (else `default`): an answer, an error status
(`status`, for the first `fail_first` tries or for all of them), a delay (a time-out), or raw bytes
that are not JSON (garbage). Every request is recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """How the stand-in answers one question."""

    text: str | None = None
    sources: list[str] | None = None
    trace_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    #: an error status, for every try (`fail_first` 0) or for the first `fail_first` tries
    status: int = 200
    fail_first: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    #: seconds before answering (longer than the case's time-out: a time-out)
    delay: float = 0.0
    #: sent as the body instead of JSON (garbage)
    raw: bytes | None = None


@dataclass
class Request:
    path: str
    body: Any
    question: str | None


class AgentStandIn:
    def __init__(self, script: Mapping[str, Reply] | None = None, default: Reply | None = None) -> None:
        self.script = dict(script or {})
        self.default = default or Reply(text="I do not know.")
        self.requests: list[Request] = []
        self._tries: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> AgentStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def asked(self, question: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.question == question)

    # -- answering ---------------------------------------------------------------------------

    def answer(self, path: str, raw: bytes) -> tuple[int, dict[str, str], bytes, float]:
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, {}, b'{"error": "not JSON"}', 0.0
        question = _question(path, body)
        with self._lock:
            self.requests.append(Request(path, body, question))
            if question is None:
                return 400, {}, json.dumps({"error": f"no question in the body at {path}"}).encode(), 0.0
            self._tries[question] += 1
            tries = self._tries[question]
        reply = self.script.get(question, self.default)
        failing = reply.status >= 400 and (reply.fail_first == 0 or tries <= reply.fail_first)
        if failing:
            return reply.status, reply.headers, json.dumps({"error": "scripted failure"}).encode(), reply.delay
        if reply.raw is not None:
            return 200, {}, reply.raw, reply.delay
        headers = dict(reply.headers)
        if path == "/v1/chat/completions":
            if reply.trace_id:
                headers["x-trace-id"] = reply.trace_id
            data: dict[str, Any] = {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "agent"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": "stop"}
                ],
            }
        else:
            data = {
                "result": {
                    "answer": reply.text,
                    "citations": [{"url": u, "title": "t"} for u in reply.sources or []],
                },
                "trace": {"id": reply.trace_id},
                "steps": reply.tool_calls or [],
            }
        return 200, headers, json.dumps(data).encode(), reply.delay


def _question(path: str, body: Any) -> str | None:
    if path == "/v1/chat/completions":
        messages = body.get("messages") if isinstance(body, dict) else None
        users = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
        return users[-1] if users and isinstance(users[-1], str) else None
    if path == "/ask":
        inner = body.get("input") if isinstance(body, dict) else None
        question = inner.get("question") if isinstance(inner, dict) else None
        return question if isinstance(question, str) else None
    return None


def _handler(standin: AgentStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base signature
            pass

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path not in ("/v1/chat/completions", "/ask"):
                status, headers, data, delay = 404, {}, b'{"error": "not found"}', 0.0
            else:
                status, headers, data, delay = standin.answer(self.path, raw)
            if delay:
                time.sleep(delay)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up (its time-out)

    return Handler
