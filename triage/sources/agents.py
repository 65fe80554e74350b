"""Reaching the agent `triage check` checks (`domain.checks.Agent`), the three ways agents are deployed:

- `OpenAIChatAgent`: an OpenAI-compatible chat endpoint (`POST {url}/chat/completions`): the
  question is the user message (after the configured system message), the reply's first message
  the answer, the URLs in it the sources;
- `HttpJsonAgent`: any JSON API: the configured request body, each `{question}` in its strings
  replaced by the question (in the decoded value, before it is encoded: a question holding quotes,
  braces or newlines stays one JSON string), POSTed; JSON pointers say where the reply holds the
  answer, the sources, the passages retrieved, the trace id and the tool calls;
- `CommandAgent`: a local command (no shell), the question on standard input or as the argument
  that reads `{question}`; standard output is the answer (text) or a JSON object read with the
  same pointers. It runs in a session of its own with only the environment it is given (never
  triage's keys), and the whole session is killed when its case is over.

The agent answer format (docs/commands.md, "The agent's answer format") is what the default
pointers read: `answer`, `sources`, `retrieved` (passages: `text`, `source_url`, `title`,
`collection`, `id`), `tool_calls` (`name`, `collection`, `args`) and `trace_id`.

A reply is read strictly: at most `MAX_REPLY_BYTES`, counted while it arrives (a larger one is
dropped unread, a command writing more is killed), and every text in it must be encodable as UTF-8
(a JSON reply may escape a lone surrogate, `"\\ud83d"`, which nothing downstream can write): one
that is not is the case's error (`bad input: ...`), never the run's crash.

Each case gets `timeout` seconds in all; within them a try that fails for a passing reason (a
transport error, a try's own time-out, 408, 429 with its `Retry-After`, a 5xx, a command that
exits non-zero) is tried again through `retry.RetryPolicy`. Whatever still fails (and a reply that
cannot be read: not JSON, no answer where the configuration says) is the case's `AgentRun.error`,
never an exception: one case's failure is that case's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from triage.domain.checks import AgentRun, ToolUse
from triage.domain.config import QUESTION, AgentEndpointConfig
from triage.domain.kernel import one_line
from triage.domain.records import Passage
from triage.retry import RetryPolicy, current_clock

#: the default tries: a passing failure is tried again after 0.5 s, 1 s, ... (at most 10 s)
AGENT_RETRY = RetryPolicy(attempts=3, initial=0.5, maximum=10.0)
#: an error message keeps this much of what the agent said
ERROR_CHARS = 300
#: a reply larger than this is not read (an agent's answer is text, not a download)
MAX_REPLY_BYTES = 8 * 1024 * 1024
#: of an error reply's body and a command's standard error, this much is kept for the message
ERROR_BYTES = 16 * 1024
#: a command's output is read this much at a time
CHUNK_BYTES = 64 * 1024

_URL = re.compile(r"https?://[^\s<>()\[\]{}\"'`|\\^]+")
_SOURCE_KEYS = ("url", "source_url", "source", "href", "link", "uri")


class AgentFailure(Exception):
    """A try that failed. `retryable`: the same question may get an answer on another try;
    `headers`: the reply's, where its `Retry-After` says how long to wait."""

    def __init__(self, message: str, *, retryable: bool, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(shown_text(message))  # it may quote the reply: always writable text
        self.retryable = retryable
        self.headers = dict(headers or {})


# -- reading a JSON reply ----------------------------------------------------------------------


_MISSING = object()


def pointer(document: Any, path: str) -> Any:
    """The value at a JSON pointer (RFC 6901: `/a/0/b`, `~1` for `/`, `~0` for `~`), or `_MISSING`."""
    if path == "":
        return document
    if not path.startswith("/"):
        return _MISSING
    node = document
    for raw in path[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            if token not in node:
                return _MISSING
            node = node[token]
        elif isinstance(node, list):
            if not token.isdigit() or int(token) >= len(node):
                return _MISSING
            node = node[int(token)]
        else:
            return _MISSING
    return node


def urls_in(text: str) -> list[str]:
    """The URLs written in a text, in order, each once (a trailing `.`, `,` or `:` is the sentence's)."""
    return list(dict.fromkeys(m.rstrip(".,;:!?*_") for m in _URL.findall(text)))


def read_sources(value: Any) -> list[str]:
    """Sources as replies give them: a URL, a list of URLs, or objects with a `url` (or `source`...)."""
    items = value if isinstance(value, list) else [value]
    found: list[str] = []
    for item in items:
        if isinstance(item, str) and item.strip():
            found.append(item.strip())
        elif isinstance(item, Mapping):
            url = next(
                (item[k] for k in _SOURCE_KEYS if isinstance(item.get(k), str) and item[k].strip()), None
            )
            if url is not None:
                found.append(url.strip())
    return list(dict.fromkeys(found))


def read_passages(value: Any) -> list[Passage]:
    """Passages as replies give them: objects with a `text` and a `source_url` (or `url`...), and
    optionally a `title`, a `collection`, an `id` (else `R1`, `R2`... by position) and a `score`.
    An item with no text is no passage (the judge has nothing to read in it)."""
    if not isinstance(value, list):
        return []
    found: list[Passage] = []
    for n, item in enumerate(value, start=1):
        if not isinstance(item, Mapping):
            continue
        text = item.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        url = next((item[k] for k in ("source_url", *_SOURCE_KEYS) if _text_or_none(item.get(k))), None)
        given, score = item.get("id"), item.get("score")
        named = isinstance(given, str | int) and not isinstance(given, bool) and given != ""
        found.append(
            Passage(
                id=str(given) if named else f"R{n}",
                source_url=url.strip() or None if isinstance(url, str) else None,
                collection=_text_or_none(item.get("collection")),
                title=_text_or_none(item.get("title")),
                text=text,
                score=float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
            )
        )  # fmt: skip
    return found


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def read_tool_calls(value: Any, tools: Mapping[str, str]) -> list[ToolUse] | None:
    """Tool calls as replies give them: objects with a `name` (or `tool`, or OpenAI's `function`),
    their arguments (an object, or JSON text), and a `collection` (else the configured tool's)."""
    if not isinstance(value, list):
        return None
    calls: list[ToolUse] = []
    for item in value:
        if not isinstance(item, Mapping):
            continue
        raw_function = item.get("function")
        function: Mapping[str, Any] = raw_function if isinstance(raw_function, Mapping) else {}
        name = item.get("name") or item.get("tool") or function.get("name")
        if not isinstance(name, str) or not name:
            continue
        args = item.get("args", item.get("arguments", function.get("arguments")))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"input": args}
        collection = item.get("collection")
        calls.append(
            ToolUse(
                name=name,
                collection=collection if isinstance(collection, str) else tools.get(name),
                args=dict(args) if isinstance(args, Mapping) else {},
            )
        )
    return calls


def substitute(template: Any, question: str) -> Any:
    """The request body: `template` with every `{question}` in its strings (keys too) replaced by
    the question. The substitution happens in decoded values, so the question is always a JSON
    string's content, however it is spelled."""
    if isinstance(template, str):
        return template.replace(QUESTION, question)
    if isinstance(template, Mapping):
        return {substitute(k, question): substitute(v, question) for k, v in template.items()}
    if isinstance(template, list):
        return [substitute(v, question) for v in template]
    return template


def read_reply(document: Any, endpoint: AgentEndpointConfig, tools: Mapping[str, str]) -> AgentRun:
    """An `AgentRun` from a decoded reply, by the endpoint's pointers. Raises `AgentFailure`
    (not retried) when the reply holds no answer where the configuration says."""
    answer = pointer(document, endpoint.answer_pointer)
    if not isinstance(answer, str):
        shape = "absent" if answer is _MISSING else type(answer).__name__
        raise AgentFailure(
            f"the reply has no answer at {endpoint.answer_pointer} ({shape}): {_excerpt(document)}",
            retryable=False,
        )
    sources_value = pointer(document, endpoint.sources_path) if endpoint.sources_path else _MISSING
    sources = read_sources(sources_value) if sources_value is not _MISSING else urls_in(answer)
    trace = pointer(document, endpoint.trace_id_path) if endpoint.trace_id_path else _MISSING
    calls_value = pointer(document, endpoint.tool_calls_path) if endpoint.tool_calls_path else _MISSING
    retrieved = pointer(document, endpoint.retrieved_path) if endpoint.retrieved_path else _MISSING
    return checked(AgentRun(
        answer=answer,
        sources=sources,
        retrieved=read_passages(retrieved) if retrieved is not _MISSING else [],
        trace_id=str(trace)
        if isinstance(trace, str | int) and not isinstance(trace, bool) and trace != ""
        else None,
        tool_calls=read_tool_calls(calls_value, tools) if calls_value is not _MISSING else None,
    ))  # fmt: skip


# -- reading strictly: text that can be written -------------------------------------------------


def shown_text(text: str) -> str:
    """`text` as it can be written anywhere: what UTF-8 cannot encode (a lone surrogate) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def checked(run: AgentRun) -> AgentRun:
    """The run, when every text in it can be encoded as UTF-8. Raises `AgentFailure` (`bad input`,
    not retried) naming the first field that cannot: a reply's text is read strictly at the
    adapter, so no lone surrogate reaches the judge, the report or a store."""
    where = run.unwritable()
    if where is not None:
        raise AgentFailure(f"bad input: the reply's {where} is not UTF-8 text (a lone surrogate)", retryable=False)
    return run


def _excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return one_line(text, ERROR_CHARS)


def _decode(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError as ex:
        raise AgentFailure(f"bad input: {what} is not UTF-8 (byte {ex.start})", retryable=False) from None
    except (ValueError, RecursionError):
        text = body.decode("utf-8", "replace")
        raise AgentFailure(
            f"{what} is not JSON: {one_line(text, ERROR_CHARS) or '(empty)'}", retryable=False
        ) from None


# -- the three agents --------------------------------------------------------------------------


@dataclass
class _Asking:
    """What every agent shares: the time a case may take, the tries within it."""

    timeout: float
    retry: RetryPolicy

    async def run(self, attempt: Any) -> AgentRun:
        """`attempt()` tried as the policy says, within the case's time; its failures as the run's error."""
        clock = current_clock()
        started = clock.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                retrying = self.retry.async_retrying(
                    lambda ex: isinstance(ex, AgentFailure) and ex.retryable,
                    retry_after=lambda ex: ex.headers if isinstance(ex, AgentFailure) else None,
                )
                run: AgentRun | None = None
                async for try_ in retrying:
                    with try_:
                        run = checked(await attempt())
                assert run is not None
        except TimeoutError:
            run = AgentRun(error=f"no answer within {self.timeout:g} s")
        except AgentFailure as ex:
            run = AgentRun(error=str(ex))
        return run.model_copy(update={"seconds": round(clock.monotonic() - started, 3)})


class _Agent:
    """What the three agents are made of: the endpoint, the tools' names, the asking."""

    def __init__(
        self,
        endpoint: AgentEndpointConfig,
        *,
        tools: Mapping[str, str],
        timeout: float,
        retry: RetryPolicy = AGENT_RETRY,
        max_reply_bytes: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.tools = dict(tools)
        self.max_reply_bytes = max_reply_bytes or MAX_REPLY_BYTES
        self._asking = _Asking(timeout, retry)
        self._open()

    def _open(self) -> None:
        """What an agent holds open from the start (the HTTP agents: their client); `aclose` closes it."""

    async def aclose(self) -> None:
        return None


class _HttpAgent(_Agent):
    """The HTTP plumbing of the two HTTP agents: one client, statuses to failures."""

    def _open(self) -> None:
        self._client = httpx.AsyncClient(timeout=self._asking.timeout, headers=self.endpoint.headers)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _post(self, url: str, body: Any) -> tuple[Any, httpx.Headers]:
        try:
            async with self._client.stream("POST", url, json=body) as response:
                failed = response.status_code >= 400
                # an error's body is only quoted: its start is enough, and it is never over the cap
                cap = ERROR_BYTES if failed else self.max_reply_bytes
                content = await _read_capped(response, cap, cut=failed)
        except httpx.TransportError as ex:  # refused, dropped, a try's own time-out
            raise AgentFailure(
                f"{type(ex).__name__}: {one_line(str(ex), ERROR_CHARS)}", retryable=True
            ) from None
        except httpx.RequestError as ex:  # a body that cannot be decoded (its content encoding)
            raise AgentFailure(
                f"{type(ex).__name__}: {one_line(str(ex), ERROR_CHARS)}", retryable=False
            ) from None
        if failed:
            retryable = response.status_code in (408, 409, 425, 429) or response.status_code >= 500
            raise AgentFailure(
                f"HTTP {response.status_code}: {one_line(content.decode('utf-8', 'replace'), ERROR_CHARS)}",
                retryable=retryable,
                headers=response.headers,
            )
        return _decode(content, f"the reply (HTTP {response.status_code})"), response.headers

    async def _ask(self, url: str, body: Any) -> AgentRun:
        """POST `body` to `url` within the case's time and tries; the reply read as the agent's run."""

        async def attempt() -> AgentRun:
            reply, headers = await self._post(url, body)
            return self._trace_header(read_reply(reply, self.endpoint, self.tools), headers)

        return await self._asking.run(attempt)

    def _trace_header(self, run: AgentRun, headers: httpx.Headers) -> AgentRun:
        name = self.endpoint.trace_id_header
        if run.trace_id is None and name and headers.get(name):
            return run.model_copy(update={"trace_id": headers[name].strip()})
        return run


async def _read_capped(response: httpx.Response, cap: int, *, cut: bool = False) -> bytes:
    """The body, read as it arrives and counted: past `cap` bytes the reading stops (the connection
    is dropped) and the try fails, or, with `cut`, what was read is the body."""
    declared = response.headers.get("content-length", "")
    if not cut and declared.isdigit() and int(declared) > cap:
        raise AgentFailure(f"the reply is over {cap} bytes ({declared} declared)", retryable=False)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():  # decoded: a compressed reply counts as it unpacks
        size += len(chunk)
        if size > cap:
            if cut:
                chunks.append(chunk[: len(chunk) - (size - cap)])
                break
            raise AgentFailure(f"the reply is over {cap} bytes", retryable=False)
        chunks.append(chunk)
    return b"".join(chunks)


def shown_url(url: str | None) -> str:
    """An agent's address as the report and the logs show it: no user, password, query or
    fragment, which may carry a key (`https://key@host/...`, `...?api_key=...`)."""
    if not url:
        return "?"
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else "?"


class OpenAIChatAgent(_HttpAgent):
    """An OpenAI-compatible chat endpoint."""

    @property
    def name(self) -> str:
        return f"openai:{shown_url(self.endpoint.url)} ({self.endpoint.model})"

    @property
    def url(self) -> str:
        base = (self.endpoint.url or "").rstrip("/")
        return base if base.endswith("/chat/completions") else f"{base}/chat/completions"

    async def ask(self, question: str) -> AgentRun:
        messages = []
        if self.endpoint.system_prompt:
            messages.append({"role": "system", "content": self.endpoint.system_prompt})
        messages.append({"role": "user", "content": question})
        return await self._ask(self.url, {"model": self.endpoint.model, "messages": messages})


class HttpJsonAgent(_HttpAgent):
    """Any JSON API, described by the configuration."""

    @property
    def name(self) -> str:
        return f"http:{shown_url(self.endpoint.url)}"

    async def ask(self, question: str) -> AgentRun:
        return await self._ask(self.endpoint.url or "", substitute(self.endpoint.request, question))


class CommandAgent(_Agent):
    """A local command: one process per try, in a session of its own (its children with it), with
    only `env` for its environment; the whole session is killed when the try ends (its time is up,
    its output is over the cap, or it answered and left something running)."""

    def __init__(
        self,
        endpoint: AgentEndpointConfig,
        *,
        tools: Mapping[str, str],
        timeout: float,
        retry: RetryPolicy = AGENT_RETRY,
        max_reply_bytes: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(endpoint, tools=tools, timeout=timeout, retry=retry, max_reply_bytes=max_reply_bytes)
        #: the command's whole environment (settings.agent_environment): nothing is inherited
        self.env = dict(env or {})

    @property
    def name(self) -> str:
        return f"command:{self.endpoint.command[0] if self.endpoint.command else '?'}"

    async def ask(self, question: str) -> AgentRun:
        if shown_text(question) != question:  # no pipe or argument can carry it
            return AgentRun(error="bad input: the question is not UTF-8 text (a lone surrogate)")
        by_argument = self.endpoint.input == "argument"
        argv = [a.replace(QUESTION, question) if by_argument else a for a in self.endpoint.command]
        stdin = None if by_argument else question.encode("utf-8")

        async def attempt() -> AgentRun:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=self.env,
                    start_new_session=True,  # its own process group: its children go when it goes
                )
            except OSError as ex:
                raise AgentFailure(
                    f"the command cannot start: {ex.strerror or ex}", retryable=False
                ) from None
            feeding = asyncio.ensure_future(_feed(process, stdin))
            errors = asyncio.ensure_future(_read_stream(process.stderr, ERROR_BYTES, cut=True))
            try:
                out = await _read_stream(process.stdout, self.max_reply_bytes, what="the command wrote")
                await process.wait()
                err = await errors
            finally:  # the try is over, however: the command and whatever it started go with it
                _kill_session(process.pid)
                if process.returncode is None:
                    await process.wait()
                for task in (feeding, errors):
                    task.cancel()
                await asyncio.gather(feeding, errors, return_exceptions=True)
            if process.returncode != 0:
                said = one_line(err.decode("utf-8", "replace"), ERROR_CHARS) or "(nothing on stderr)"
                raise AgentFailure(f"the command exited with {process.returncode}: {said}", retryable=True)
            if self.endpoint.output == "json":
                return read_reply(_decode(out, "the command's output"), self.endpoint, self.tools)
            try:
                answer = out.decode("utf-8").strip()
            except UnicodeDecodeError as ex:
                raise AgentFailure(
                    f"bad input: the command's output is not UTF-8 (byte {ex.start})", retryable=False
                ) from None
            if not answer:
                raise AgentFailure("the command wrote no answer", retryable=False)
            return AgentRun(answer=answer, sources=urls_in(answer))

        return await self._asking.run(attempt)


async def _feed(process: asyncio.subprocess.Process, data: bytes | None) -> None:
    """The question on the command's standard input (a command that does not read it is no error)."""
    if data is None or process.stdin is None:
        return
    try:
        process.stdin.write(data)
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def _read_stream(
    stream: asyncio.StreamReader | None, cap: int, *, cut: bool = False, what: str = ""
) -> bytes:
    """A pipe read to its end, counted as it arrives: past `cap` bytes, a failure (the caller kills
    the command), or, with `cut`, the rest is read and dropped (standard error: its start is kept)."""
    if stream is None:
        return b""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(CHUNK_BYTES):
        if size + len(chunk) > cap:
            if not cut:
                raise AgentFailure(f"{what} over {cap} bytes", retryable=False)
            chunk = chunk[: max(cap - size, 0)]
        size += len(chunk)
        if chunk:
            chunks.append(chunk)
    return b"".join(chunks)


def _kill_session(pid: int) -> None:
    """Kill the process group `pid` leads (the command's session): the command and its children."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def make_agent(
    endpoint: AgentEndpointConfig,
    *,
    tools: Mapping[str, str],
    timeout: float,
    attempts: int,
    retry: RetryPolicy = AGENT_RETRY,
    env: Mapping[str, str] | None = None,
) -> OpenAIChatAgent | HttpJsonAgent | CommandAgent:
    """The agent an `[agent_endpoint]` describes (checked by the caller: `endpoint.problems()`).
    `env`: a command's whole environment (`settings.agent_environment`); the HTTP agents need none."""
    policy = retry.with_(attempts=attempts)
    if endpoint.kind == "command":
        return CommandAgent(endpoint, tools=tools, timeout=timeout, retry=policy, env=env)
    if endpoint.kind == "http":
        return HttpJsonAgent(endpoint, tools=tools, timeout=timeout, retry=policy)
    return OpenAIChatAgent(endpoint, tools=tools, timeout=timeout, retry=policy)
