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

The run's totals are `ChatExchange.usage`, with the prompt tokens the server had cached (its
`usage.prompt_tokens_details.cached_tokens`) and the part answered in batches; `RecentUsage` (the
last section) keeps each trace's own figure for the most recent traces only, so the judge's memory
is O(1) in the run.

`ChatExchange.verified` is the exchange both model judges make: a reply checked in code, one more
try told which checks failed, then `JudgeRejected`; `model_retry` their retry policy.

Batch mode (`batch`, `judges.model.rounds`): a call's first attempt is asked through a round of the
Batch API; what the round does not answer, every retry and a downgrade of the format go directly.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, Protocol, TypeVar

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ValidationError

from triage.domain.kernel import one_line
from triage.domain.records import Usage
from triage.errors import ConfigError, JudgeError, JudgeRejected
from triage.judges.model import prompts
from triage.retry import Budget, Clock, RetryPolicy


class BatchLane(Protocol):
    """Where a call's first attempt goes in batch mode (`judges.model.rounds.BatchCollector`): an
    answer from a round of the Batch API, or None for a call the round left to be asked directly.
    A port, so this exchange does not import the rounds that import it back."""

    async def ask(self, body: Mapping[str, Any], *, trace_id: str, call: str) -> ChatCompletion | None: ...


StructuredMode = Literal["auto", "json_schema", "json_object", "none"]
_MODES: tuple[Literal["json_schema", "json_object", "none"], ...] = ("json_schema", "json_object", "none")

T = TypeVar("T", bound=BaseModel)

#: how much of a model's unusable reply an error message quotes
CLIP = 160


class Unusable(Exception):
    """A reply that is not usable output (not JSON, a refusal, wrong shape, cut off)."""

    def __init__(self, reason: str, refusal: bool = False) -> None:
        super().__init__(reason)
        self.refusal = refusal


class Transient(Exception):
    """A failure worth another attempt (throttled, server error, connection), before classification
    (the Batch API runner, `judges.model.batch`, retries its requests on it too)."""

    def __init__(self, error: openai.APIError) -> None:
        super().__init__(str(error))
        self.error = error


def _retryable(ex: BaseException) -> bool:
    return isinstance(ex, Transient | Unusable)


def wait_headers(ex: BaseException) -> Mapping[str, str] | None:
    """The headers of a throttled or failed request, whose `Retry-After` says how long to wait."""
    if isinstance(ex, Transient):
        response = getattr(ex.error, "response", None)
        return response.headers if response is not None else None
    return None


def model_retry(
    max_retries: int,
    backoff_base: float,
    backoff_max: float,
    clock: Clock | None,
    budget: Budget | None,
) -> RetryPolicy:
    """The retry policy of a model judge's exchange, from the judge's knobs."""
    return RetryPolicy(
        attempts=max_retries + 1,
        initial=backoff_base,
        maximum=backoff_max,
        max_retry_after=backoff_max,
        clock=clock,
        budget=budget,
    )


@dataclass(frozen=True)
class _Ask(Generic[T]):
    """One call's request, as every attempt at it sends it (a retry told which checks failed
    is a new one, with the longer conversation)."""

    call: str
    messages: list[dict[str, str]]
    schema: dict[str, Any]
    reply_type: type[T]
    #: the trace's usage the answers add to (and the exchange's totals)
    usage: Usage
    trace_id: str = ""


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
        batch: BatchLane | None = None,
    ) -> None:
        self.model = model
        self.retry = retry
        #: batch mode (`triage feedback --batch`): a call's first attempt is asked through it
        self.batch = batch
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

    async def complete(self, ask: _Ask[T], *, batchable: bool = True) -> tuple[str, T]:
        """One answered, parsed reply (raw text and model), with retries. In batch mode
        (`batchable`, and a collector given) the first attempt is asked through a batch round;
        what the round does not answer, and every retry, goes directly."""
        retrying = self.retry.async_retrying(_retryable, retry_after=wait_headers)
        batched = batchable and self.batch is not None
        try:
            async for attempt in retrying:
                with attempt:
                    first, batched = batched, False
                    return await self._attempt(ask, first)
        except Transient as ex:
            number = retrying.statistics.get("attempt_number", 1)
            raise JudgeError(
                f"model {self.model} unavailable after {number} attempts: {short(ex.error)}"
            ) from ex.error
        except Unusable as ex:
            what = "refused to judge" if ex.refusal else "kept answering unusable output"
            raise JudgeRejected(f"{ask.call}: model {self.model} {what}: {ex}") from None
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def verified(
        self,
        call: str,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        reply_type: type[T],
        verify: Callable[[T], list[str]],
        usage: Usage,
        *,
        trace_id: str = "",
        what: str,
    ) -> T:
        """A reply that passes `verify` (the checks in code, a list of problems): a reply that fails
        gets one more try, told which checks failed, then `JudgeRejected` ("`what` failed
        verification twice: ..."). In batch mode the first round is asked through a batch; the retry
        goes directly (a few calls are not worth another batch's wait)."""
        ask = _Ask(call, messages, schema, reply_type, usage, trace_id)
        problems: list[str] = []
        for round_ in (1, 2):
            raw, reply = await self.complete(ask, batchable=round_ == 1)
            problems = verify(reply)
            if not problems:
                return reply
            if round_ == 1:
                # one more try, told which checks failed (ids and check names only: no quoted text)
                retry = prompts.render("verification_retry.j2", problems=problems[:10])
                messages = [
                    *ask.messages,
                    {"role": "assistant", "content": raw},
                    {"role": "user", "content": retry},
                ]
                ask = replace(ask, messages=messages)  # the same call, with the longer conversation
        raise JudgeRejected(f"{what} failed verification twice: " + "; ".join(problems[:5]))

    async def _attempt(self, ask: _Ask[T], batched: bool = False) -> tuple[str, T]:
        while True:  # a downgrade of the response format is not an attempt: ask again at once
            mode = self.mode
            through_batch, batched = batched, False  # a round is asked once; a downgrade goes directly
            try:
                completion, in_batch = await self._request(ask, mode, through_batch)
            except openai.BadRequestError as ex:
                if self._downgrade(mode, ex):
                    continue
                raise JudgeError(f"model {self.model} refused the request: {short(ex)}") from ex
            except (openai.AuthenticationError, openai.PermissionDeniedError) as ex:
                raise ConfigError(f"the judge's model server refused the credentials: {short(ex)}") from ex
            except openai.NotFoundError as ex:
                raise ConfigError(f"model {self.model!r} not found on the judge's server: {short(ex)}") from ex
            except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError) as ex:
                raise Transient(ex) from ex  # APITimeoutError is an APIConnectionError
            except openai.APIStatusError as ex:
                if ex.status_code >= 500 or ex.status_code in (408, 409):
                    raise Transient(ex) from ex
                raise JudgeError(f"model {self.model} failed: {short(ex)}") from ex
            self._count(completion, ask.usage, in_batch)
            return self._parse(completion, ask.reply_type, mode)

    async def _request(self, ask: _Ask[T], mode: str, batched: bool = False) -> tuple[Any, bool]:
        """The completion, and whether a batch round answered it (`batched`: ask a round first)."""
        kwargs: dict[str, Any] = {}
        if mode == "json_schema":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": ask.call, "strict": True, "schema": ask.schema},
            }
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        if self._send_temperature:
            kwargs["temperature"] = 0
        if batched and self.batch is not None:
            body = {"model": self.model, "messages": ask.messages, **kwargs}
            answer = await self.batch.ask(body, trace_id=ask.trace_id, call=ask.call)
            if answer is not None:
                return answer, True
            # not answered in a round (left by it, past the deadline, no Batch API): directly, once
        async with self._semaphore:
            self.requests += 1
            create = self._client.chat.completions.create
            return await create(model=self.model, messages=ask.messages, **kwargs), False  # type: ignore[arg-type]

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

    def _count(self, completion: Any, usage: Usage, batched: bool = False) -> None:
        got = Usage(calls=1)
        if getattr(completion, "usage", None) is not None:
            got.input_tokens = completion.usage.prompt_tokens or 0
            got.output_tokens = completion.usage.completion_tokens or 0
            # the prompt-cache hit: `usage.prompt_tokens_details.cached_tokens` (OpenAI's chat completions)
            details = getattr(completion.usage, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            got.cached_input_tokens = min(cached, got.input_tokens) if isinstance(cached, int) and cached > 0 else 0
        if batched:
            got.batch_calls = got.calls
            got.batch_input_tokens = got.input_tokens
            got.batch_cached_input_tokens = got.cached_input_tokens
            got.batch_output_tokens = got.output_tokens
        self.usage.add(got)
        usage.add(got)

    def _parse(self, completion: Any, reply_type: type[T], mode: str) -> tuple[str, T]:
        if not hasattr(completion, "choices"):
            # the openai client hands back the raw body when it is not JSON (a proxy's HTML page)
            raise Unusable(f"the server did not answer a chat completion: {one_line(str(completion), CLIP)}")
        if not completion.choices:
            raise Unusable("the reply has no choices")
        choice = completion.choices[0]
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            raise Unusable(one_line(refusal, CLIP), refusal=True)
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
                raise Unusable(f"not JSON: {one_line(content, CLIP)}", refusal=refused) from None
        try:
            return content, reply_type.model_validate(data)
        except ValidationError as ex:
            first = ex.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise Unusable(f"wrong shape at {where or 'top level'}: {first['msg']}") from None


def short(ex: Exception, limit: int = 300) -> str:
    """A failed request in one line: its status and the server's message (the judge's calls and the
    Batch API runner's)."""
    status = getattr(ex, "status_code", None)
    body = getattr(ex, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    if isinstance(body, dict) and isinstance(body.get("detail"), str):  # FastAPI's 404 (vLLM)
        message = message or body["detail"]
    text = one_line(str(message or ex), limit)
    return f"HTTP {status}: {text}" if status else text


# -- usage per trace ---------------------------------------------------------------------------------
#
# The run's totals are `ChatExchange.usage`; nothing in a run reads a trace's own figure (the
# report and the summary show totals). This map answers "what did trace X cost" for the traces
# judged last (tests and debugging), and forgets the oldest beyond `limit`: a night of 5,000 traces
# once kept 5,000 entries (about 0.6 KB each) for no reader.

#: traces whose usage is remembered: far more than are judged at once (the judge's concurrency)
RECENT_TRACES = 256


class RecentUsage(Mapping[str, Usage]):
    """trace id -> `Usage`, least recently started out beyond `limit`.

    `start(trace_id)` hands out the `Usage` a trace's calls add to. A trace still being judged
    when it drops out keeps counting into its own object (and into the exchange's totals); only
    the lookup by id is lost.
    """

    def __init__(self, limit: int = RECENT_TRACES) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._items: OrderedDict[str, Usage] = OrderedDict()

    def start(self, trace_id: str) -> Usage:
        """The usage record of `trace_id` (the same one when it is judged again)."""
        usage = self._items.get(trace_id)
        if usage is None:
            usage = self._items[trace_id] = Usage()
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(trace_id)
        return usage

    def setdefault(self, trace_id: str, default: Usage | None = None) -> Usage:
        """`start`, under the dict name earlier callers used (`default` is ignored)."""
        return self.start(trace_id)

    def __getitem__(self, trace_id: str) -> Usage:
        return self._items[trace_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
