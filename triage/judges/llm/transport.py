"""One chat exchange with the judge's model server: request, structured-output fallback, parsing,
usage counting and retries (`triage.retry`).

The openai client's own retries are off (`max_retries=0`); 429, 5xx, 408, 409, timeouts,
connection errors and malformed replies (invalid JSON, refusals, wrong shape) are retried here with
the shared policy (honouring `Retry-After` and `retry-after-ms`), so every attempt passes the
judge's own semaphore and is counted. When the attempts are spent: `JudgeError` (unavailable), or
`JudgeRejected` when the model kept answering unusable output. Refused credentials and an unknown
model are `ConfigError`.

Structured output: `auto` tries a strict `json_schema`; a 400 that names the response format
downgrades the exchange (once, for all later calls) to `json_object`, then to plain JSON parsing.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from triage.domain.records import Usage
from triage.errors import ConfigError, JudgeError, JudgeRejected
from triage.retry import RetryPolicy

StructuredMode = Literal["auto", "json_schema", "json_object", "none"]
_MODES: tuple[Literal["json_schema", "json_object", "none"], ...] = ("json_schema", "json_object", "none")

T = TypeVar("T", bound=BaseModel)


class Unusable(Exception):
    """A reply that is not usable output (not JSON, a refusal, wrong shape, cut off)."""

    def __init__(self, reason: str, refusal: bool = False) -> None:
        super().__init__(reason)
        self.refusal = refusal


class _Transient(Exception):
    """A failure worth another attempt (throttled, server error, connection), before classification."""

    def __init__(self, error: openai.APIError) -> None:
        super().__init__(str(error))
        self.error = error


def _retryable(ex: BaseException) -> bool:
    return isinstance(ex, _Transient | Unusable)


def _wait_headers(ex: BaseException) -> Mapping[str, str] | None:
    """The headers of a throttled or failed request, whose `Retry-After` says how long to wait."""
    if isinstance(ex, _Transient):
        response = getattr(ex.error, "response", None)
        return response.headers if response is not None else None
    return None


class ChatExchange:
    """Requests to one model on one server, shared by every call of a judge."""

    def __init__(
        self,
        *,
        client: openai.AsyncOpenAI,
        model: str,
        retry: RetryPolicy,
        concurrency: int,
        timeout: float,
        structured: StructuredMode = "auto",
    ) -> None:
        self.model = model
        self.retry = retry
        self.usage = Usage()
        #: HTTP requests made, including failed ones (usage.calls counts answered ones)
        self.requests = 0
        self._client = client.with_options(timeout=timeout, max_retries=0)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._fixed = structured != "auto"
        self.mode: Literal["json_schema", "json_object", "none"] = (
            "json_schema" if structured == "auto" else structured
        )
        self._send_temperature = True

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(
        self, call: str, messages: list[dict[str, str]], schema: dict[str, Any], reply_type: type[T], usage: Usage
    ) -> tuple[str, T]:
        """One answered, parsed reply (raw text and model), with retries."""
        retrying = self.retry.async_retrying(_retryable, retry_after=_wait_headers)
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(call, messages, schema, reply_type, usage)
        except _Transient as ex:
            number = retrying.statistics.get("attempt_number", 1)
            raise JudgeError(
                f"model {self.model} unavailable after {number} attempts: {short(ex.error)}"
            ) from ex.error
        except Unusable as ex:
            what = "refused to judge" if ex.refusal else "kept answering unusable output"
            raise JudgeRejected(f"{call}: model {self.model} {what}: {ex}") from None
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _attempt(
        self, call: str, messages: list[dict[str, str]], schema: dict[str, Any], reply_type: type[T], usage: Usage
    ) -> tuple[str, T]:
        while True:  # a downgrade of the response format is not an attempt: ask again at once
            mode = self.mode
            try:
                completion = await self._request(call, messages, schema, mode)
            except openai.BadRequestError as ex:
                if self._downgrade(mode, ex):
                    continue
                raise JudgeError(f"model {self.model} refused the request: {short(ex)}") from ex
            except (openai.AuthenticationError, openai.PermissionDeniedError) as ex:
                raise ConfigError(f"the judge's model server refused the credentials: {short(ex)}") from ex
            except openai.NotFoundError as ex:
                raise ConfigError(f"model {self.model!r} not found on the judge's server: {short(ex)}") from ex
            except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError) as ex:
                raise _Transient(ex) from ex  # APITimeoutError is an APIConnectionError
            except openai.APIStatusError as ex:
                if ex.status_code >= 500 or ex.status_code in (408, 409):
                    raise _Transient(ex) from ex
                raise JudgeError(f"model {self.model} failed: {short(ex)}") from ex
            self._count(completion, usage)
            return self._parse(completion, reply_type, mode)

    async def _request(self, call: str, messages: list[dict[str, str]], schema: dict[str, Any], mode: str) -> Any:
        kwargs: dict[str, Any] = {}
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": call, "strict": True, "schema": schema},
            }
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        if self._send_temperature:
            kwargs["temperature"] = 0
        async with self._semaphore:
            self.requests += 1
            return await self._client.chat.completions.create(model=self.model, messages=messages, **kwargs)  # type: ignore[arg-type]

    def _downgrade(self, mode: str, ex: openai.BadRequestError) -> bool:
        """After a 400: fall back to a format (or no temperature) the server accepts. Sticky."""
        text = short(ex, 2000).lower()
        if self._send_temperature and "temperature" in text:
            self._send_temperature = False  # reasoning models accept only their default temperature
            return True
        if self._fixed or mode == "none":
            return False
        if not any(
            w in text for w in ("response_format", "json_schema", "json_object", "response format", "schema")
        ):
            return False
        if self.mode == mode:  # concurrent calls may all fail on the same mode: step down once
            self.mode = _MODES[_MODES.index(mode) + 1]
        return True

    def _count(self, completion: Any, usage: Usage) -> None:
        got = Usage(calls=1)
        if getattr(completion, "usage", None) is not None:
            got.input_tokens = completion.usage.prompt_tokens or 0
            got.output_tokens = completion.usage.completion_tokens or 0
        self.usage.add(got)
        usage.add(got)

    def _parse(self, completion: Any, reply_type: type[T], mode: str) -> tuple[str, T]:
        if not hasattr(completion, "choices"):
            # the openai client hands back the raw body when it is not JSON (a proxy's HTML page)
            raise Unusable(f"the server did not answer a chat completion: {clip(str(completion))}")
        if not completion.choices:
            raise Unusable("the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise Unusable(clip(refusal), refusal=True)
        content = (message.content or "").strip()
        if choice.finish_reason == "length":
            raise Unusable("the reply was cut off at the token limit")
        if not content:
            raise Unusable("the reply is empty")
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", content)  # a fenced block is still JSON
        try:
            data = json.loads(text)
        except ValueError:
            data = None
            if mode == "none" and "{" in text:
                try:
                    data = json.loads(text[text.index("{") : text.rindex("}") + 1])
                except ValueError:
                    data = None
            if data is None:
                refused = bool(
                    re.match(r"(?:I'?m sorry|I am sorry|I can(?:no|')t|I (?:will|won)'?t|Sorry)", text, re.I)
                )
                raise Unusable(f"not JSON: {clip(content)}", refusal=refused) from None
        try:
            return content, reply_type.model_validate(data)
        except ValidationError as ex:
            first = ex.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise Unusable(f"wrong shape at {where or 'top level'}: {first['msg']}") from None


def clip(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit] + "..."


def short(ex: Exception, limit: int = 300) -> str:
    status = getattr(ex, "status_code", None)
    body = getattr(ex, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    text = clip(str(message or ex), limit)
    return f"HTTP {status}: {text}" if status else text


