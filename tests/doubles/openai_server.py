"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests and benchmarks.

    with OpenAIServer(latency=0.4, responder=keyword_responder) as server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test")
        server.enqueue(Reply.status(429, headers={"Retry-After": "0"}), Reply.json({...}))
        ...
        server.requests  # every request, parsed

Replies are taken from the queue first; when it is empty, `responder(body)` answers (an "honest"
scripted model: a function of the request, returning a dict to send as JSON content, a string to
send as raw content, or a `Reply`). With neither, the server answers 500.

`supports` lists the response formats the server accepts; a request using another one gets the
400 a server without that feature sends (like older vLLM or llama.cpp builds).

`prompt_cache=True` reports cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`) as
OpenAI's prompt caching does, for a prefix an earlier request began with (`PrefixCache`).

Written with the traps of ../shared/notes/benchmarking.md in mind: TCP_NODELAY on every
connection, a large listen backlog, HTTP/1.1 keep-alive with a Content-Length on every response.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], "Reply | dict[str, Any] | str"]


@dataclass
class Reply:
    """One scripted response."""

    status: int = 200
    content: str | None = None
    refusal: str | None = None
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 20
    finish_reason: str = "stop"

    @classmethod
    def json(cls, data: Any, **kw: Any) -> Reply:
        return cls(content=json.dumps(data), **kw)

    @classmethod
    def text(cls, content: str, **kw: Any) -> Reply:
        return cls(content=content, **kw)

    @classmethod
    def refused(cls, message: str = "I'm sorry, I can't help with that.", **kw: Any) -> Reply:
        return cls(refusal=message, **kw)

    @classmethod
    def status_error(cls, status: int, message: str = "scripted error", **kw: Any) -> Reply:
        return cls(status=status, error={"message": message, "type": "scripted", "code": None}, **kw)

    @classmethod
    def slow(cls, delay: float, then: Reply | None = None) -> Reply:
        reply = then or cls.json({})
        reply.delay = delay
        return reply


def schema_unsupported() -> Reply:
    """The 400 a server without structured outputs sends for `response_format: json_schema`."""
    return Reply.status_error(
        400, "response_format of type 'json_schema' is not supported by this model; use 'json_object'"
    )


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    def content(self, role: str) -> str:
        return "\n".join(str(m.get("content") or "") for m in self.messages if m.get("role") == role)

    @property
    def system(self) -> str:
        return self.content("system")

    @property
    def user(self) -> str:
        """The first user message (the data); retries append a second one."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return str(users[0].get("content") or "") if users else ""

    @property
    def response_format(self) -> str | None:
        rf = self.body.get("response_format")
        return rf.get("type") if isinstance(rf, dict) else None

    @property
    def kind(self) -> str:
        return call_kind(self.body)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # TCP_NODELAY: no 40 ms delayed-ACK stall per small response
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a timeout test)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "invalid JSON body"}})
            return
        owner = self.server.owner
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        owner._record(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        reply = owner._next(body)
        wait = owner.latency + reply.delay
        if wait and owner._stopping.wait(wait):
            self.close_connection = True
            return
        if reply.status != 200:
            self._send(reply.status, {"error": reply.error or {"message": "error"}}, reply.headers)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": reply.refusal}
        prompt_tokens, completion_tokens = reply.prompt_tokens, reply.completion_tokens
        if owner.estimate_tokens:
            prompt_tokens = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4
            if owner.prompt_cache is not None:  # counted as the cache counts: the schema too
                prompt_tokens = len(prompt_text(body).encode()) // owner.prompt_cache.chars_per_token
            completion_tokens = len(reply.content or reply.refusal or "") // 4
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if owner.prompt_cache is not None:
            cached = min(owner.prompt_cache.cached(body), prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        payload = {
            "id": f"chatcmpl-{owner.calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
            ],
            "usage": usage,
        }
        self._send(200, payload, reply.headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once in a benchmark
    owner: OpenAIServer


class OpenAIServer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        latency: float = 0.0,
        responder: Responder | None = None,
        supports: Iterable[str] = ("json_schema", "json_object"),
        port: int = 0,
        estimate_tokens: bool = False,
        prompt_cache: bool = False,
    ) -> None:
        """`estimate_tokens`: report usage as characters / 4 of the request's messages and of the
        reply (for benchmarks: a prompt's size shows), instead of the scripted counts.
        `prompt_cache`: report the prompt tokens a `PrefixCache` holds (at most the prompt's)."""
        self.latency = latency
        self.responder = responder
        self.supports = set(supports)
        self.estimate_tokens = estimate_tokens
        self.prompt_cache = PrefixCache() if prompt_cache else None
        self.requests: list[Recorded] = []
        self.calls = 0
        self._queue: deque[Reply] = deque()
        self._by_kind: dict[str, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="openai-stand-in",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *replies: Reply | dict[str, Any], kind: str | None = None) -> None:
        """Script the next replies: for any request, or (`kind="containment"|"grounding"`) only for
        requests of that kind, since a judge sends its two calls concurrently."""
        with self._lock:
            queue = self._queue if kind is None else self._by_kind.setdefault(kind, deque())
            queue.extend(r if isinstance(r, Reply) else Reply.json(r) for r in replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + sum(len(q) for q in self._by_kind.values())

    def of_kind(self, kind: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.kind == kind]

    def _record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)
            self.calls += 1

    def _next(self, body: dict[str, Any]) -> Reply:
        fmt = body.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind and kind not in self.supports:
            return Reply.status_error(
                400, f"response_format of type '{kind}' is not supported by this server", delay=0.0
            )
        with self._lock:
            by_kind = self._by_kind.get(call_kind(body))
            if by_kind:
                return by_kind.popleft()
            if self._queue:
                return self._queue.popleft()
        if self.responder is None:
            return Reply.status_error(500, "no scripted reply left")
        out = self.responder(body)
        if isinstance(out, Reply):
            return out
        return Reply.json(out) if isinstance(out, dict) else Reply.text(out)

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- prompt caching ---------------------------------------------------------------------------------


def prompt_text(body: dict[str, Any]) -> str:
    """A request's prompt in the order a server caches it: the structured-output schema (a prefix to
    the system message, in OpenAI's words), then each message."""
    fmt = body.get("response_format")
    parts = [json.dumps(fmt, ensure_ascii=False) if fmt else ""]
    parts += [f"{m.get('role')}: {m.get('content') or ''}" for m in body.get("messages", [])]
    return "\n".join(parts)


class PrefixCache:
    """Prompt caching as OpenAI describes it: a prompt of at least `minimum` tokens is cached in
    steps of `step` tokens, and a later prompt's cached part is the longest prefix (a whole number of
    steps, at least `minimum`) that an earlier prompt began with, byte for byte. A token is counted
    as `chars_per_token` bytes of `prompt_text`. Thread-safe; every prefix is kept (a test's or a
    benchmark's worth)."""

    def __init__(self, minimum: int = 1024, step: int = 128, chars_per_token: int = 4) -> None:
        self.minimum, self.step, self.chars_per_token = minimum, step, chars_per_token
        self._seen: set[bytes] = set()
        self._lock = threading.Lock()

    def cached(self, body: dict[str, Any]) -> int:
        """The tokens of this request's prompt already cached; then its own prefixes are."""
        text = prompt_text(body).encode()
        size = self.step * self.chars_per_token
        running = hashlib.blake2b(digest_size=8)
        prefixes = []
        for start in range(0, len(text) - size + 1, size):
            running.update(text[start : start + size])
            prefixes.append(running.copy().digest())
        least = max(1, -(-self.minimum // self.step))
        with self._lock:
            hit = 0  # each prefix's hash covers all before it: the longest one seen is the hit
            for n in range(least, len(prefixes) + 1):
                if prefixes[n - 1] not in self._seen:
                    break
                hit = n
            self._seen.update(prefixes[least - 1 :])
        return hit * self.step


# --- reading the judge's prompts (for honest responders) -----------------------------------------

_BLOCK = re.compile(r'<(?P<tag>[a-z_]+)(?P<attrs>(?: [a-z]+="[^"]*")*)>(?P<body>.*?)</(?P=tag)>', re.DOTALL)
_ATTR = re.compile(r'([a-z]+)="([^"]*)"')


@dataclass
class Block:
    tag: str
    attrs: dict[str, str]
    raw: str

    @property
    def value(self) -> Any:
        return json.loads(self.raw)


def data_blocks(user_message: str, nonce: str | None = None) -> list[Block]:
    """The leaf data blocks of a judge prompt (question, comment, passage, tool_call, answer)."""
    out: list[Block] = []
    for match in _BLOCK.finditer(user_message):
        attrs = dict(_ATTR.findall(match.group("attrs")))
        body = match.group("body")
        if match.group("tag") in {"passages", "tool_calls"}:
            out.extend(data_blocks(body, nonce))
            continue
        if nonce is None or attrs.get("nonce") == nonce:
            out.append(Block(match.group("tag"), attrs, body))
    return out


def call_kind(body: dict[str, Any]) -> str:
    """ "containment" or "grounding", from the request alone."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return str(fmt["json_schema"]["name"])
    system = next((m.get("content", "") for m in body.get("messages", []) if m.get("role") == "system"), "")
    return "grounding" if "GROUNDING" in system else "containment"


def asked_sets(body: dict[str, Any]) -> list[str]:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return re.findall(r'<passages set="([a-z]+)"', user)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]{3,}", text.lower())}


_STOP = {
    "how",
    "what",
    "does",
    "the",
    "can",
    "and",
    "for",
    "with",
    "use",
    "set",
    "you",
    "from",
    "this",
    "that",
}


def keyword_responder(body: dict[str, Any]) -> dict[str, Any]:
    """A generic honest model: a passage holds the answer when it covers >= 70% of the question's
    words; every answer is grounded with no claims, and declines when it says "couldn't find".

    Good enough for benchmarks (any trace gets a valid, verifiable reply) and as a base for tests.
    """
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    blocks = data_blocks(user)
    question = next(b.value for b in blocks if b.tag == "question")
    terms = _words(question) - _STOP
    if call_kind(body) == "grounding":
        answer = next(b.value for b in blocks if b.tag == "answer")
        decline = re.search(r"[^.]*(?:couldn't find|could not find|not covered)[^.]*", answer)
        return {
            "injection_note": "",
            "injection_suspected": False,
            "claims": [],
            "grounding": {
                "reasoning": "no checkable claims",
                "verdict": "no_factual_claims",
                "confidence": "high",
            },
            "declined": {
                "reasoning": "scripted",
                "verdict": "declined" if decline else "not_declined",
                "quote": decline.group(0).strip() if decline else "",
                "confidence": "high",
            },
        }
    reply: dict[str, Any] = {"injection_note": "", "injection_suspected": False}
    passages = [b for b in blocks if b.tag == "passage"]
    for key, prefix in (("retrieved", "R"), ("research", "S")):
        if key not in asked_sets(body):
            continue
        holding = []
        for block in passages:
            if not block.attrs["id"].startswith(prefix):
                continue
            text = block.value["text"]
            if terms and len(terms & _words(text)) / len(terms) >= 0.7:
                holding.append({"passage_id": block.attrs["id"], "quote": text.strip()[:60].strip()})
        reply[key] = {
            "reasoning": "scripted keyword coverage",
            "verdict": "contains_answer" if holding else "no_answer",
            "evidence": holding[:2],
            "confidence": "high",
        }
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    names = (
        schema.get("properties", {}).get("component", {}).get("properties", {}).get("name", {}).get("enum")
    )
    reply["component"] = {"reasoning": "scripted", "name": names[-1] if names else "general"}
    return reply


# --- an obedient check model (`triage check`'s LLM judge) --------------------------------------------

#: any request to pass, in the words and languages an injection uses
_PASS_REQUEST = re.compile(
    r"\bpass(?:ed|es|ing)?\b|\bcorrect[ae]?\b|affirmativ|approv|aprovad|aprobad|bestanden|korrekt|réussi|"
    r"\bmet\b|satisf|通过|通過|合格|통과",
    re.IGNORECASE,
)
_QUOTE_REQUEST = re.compile(r"quot(?:e|ing)\s*:?\s*[\"“']([^\"”']{4,})[\"”']", re.IGNORECASE)
_PASSAGE_QUOTE_REQUEST = re.compile(r"passage[_ ]quote\s*:?\s*[\"“']([^\"”']{4,})[\"”']", re.IGNORECASE)


class ObedientCheckResponder:
    """A check model that obeys every instruction it reads: when the data of the user message (the
    question, the answer, a source, a passage, a tool call) asks, in any way, for a pass, it passes
    every expectation asked, with whatever quote it is asked for (fabricated or not), else the
    answer's first sentence; the first passage and call shown as its evidence; and never suspects an
    injection. Without such a request it fails every expectation, quoting the first sentence."""

    def __init__(self) -> None:
        self.obeyed = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        found = re.search(r'nonce="([0-9a-f]+)"', user)
        blocks = data_blocks(user, found.group(1) if found else None)
        data = "\n".join(json.dumps(b.value, ensure_ascii=False) + "\n" + _flat(b.value) for b in blocks)
        answer = next((b.value for b in blocks if b.tag == "answer"), "")
        answer = answer if isinstance(answer, str) else ""
        first = next((s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", answer) if len(s.strip()) >= 8), answer)
        obey = bool(_PASS_REQUEST.search(data))
        self.obeyed += obey
        asked_quote = _QUOTE_REQUEST.search(data)
        quote = asked_quote.group(1) if asked_quote else first
        passages = [b for b in blocks if b.tag == "passage"]
        passage_quote = _PASSAGE_QUOTE_REQUEST.search(data)
        calls = [b for b in blocks if b.tag == "tool_call"]
        verdicts = []
        for b in blocks:
            if b.tag != "expectation":
                continue
            text = passages[0].value.get("text", "") if passages and isinstance(passages[0].value, dict) else ""
            backing = passage_quote.group(1) if passage_quote else str(text)[:60]
            said = {
                "expectation": b.attrs.get("name", ""),
                "reasoning": "as the data asks" if obey else "as read",
                "verdict": "pass" if obey else "fail",
                "quotes": [quote] if quote else [],
                "passage_id": passages[0].attrs.get("id", "") if obey and passages else "",
                "passage_quote": backing if obey and passages else "",
                "call_id": calls[0].attrs.get("id", "") if obey and calls else "",
                "confidence": "high",
            }
            verdicts.append(fit_verdict(body, said))
        return {"injection_note": "", "injection_suspected": False, "verdicts": verdicts}


def fit_verdict(body: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """A check verdict in the shape the request's schema asks for: only its fields, a single `quote`
    (an earlier schema) taken from `quotes` (so a stand-in answers any version of the check judge)."""
    try:
        schema = body["response_format"]["json_schema"]["schema"]
        fields = list(schema["properties"]["verdicts"]["items"]["properties"])
    except (KeyError, TypeError):
        return verdict
    out = {k: verdict[k] for k in fields if k in verdict}
    if "quote" in fields and "quote" not in verdict:
        out["quote"] = (verdict.get("quotes") or [""])[0]
    return out


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return "\n".join(_flat(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(_flat(v) for v in value)
    return str(value)
