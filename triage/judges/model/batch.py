"""The night's judge calls through the OpenAI Batch API (what a night costs: `domain.records.cost`).

    runner = BatchRunner(client, retry=policy)
    outcome = await runner.run({"t1:containment": body, ...}, deadline=cronjob_deadline - margin)
    outcome.answered["t1:containment"].completion   # an openai ChatCompletion
    outcome.left                                    # custom_id -> Left: send these directly

A request is the body the judge would POST to `/v1/chat/completions`, keyed by a `custom_id` the
caller chooses. `run` uploads the requests as a JSONL file (`purpose="batch"`), creates a batch per
file (`completion_window="24h"`), polls its status in (injectable) clock time, reads the output and
error files when it ends, and returns every custom_id exactly once: answered, or left with a reason.

The contract followed (OpenAI's published one, which many compatible servers copy or lack):
- input line `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}`; at most
  50,000 lines and 200 MB a file (`max_requests`, `max_bytes`: more are split over several batches);
- batch statuses `validating`, `in_progress`, `finalizing`, then `completed`; `failed` (the file
  was rejected: `errors.data`), `expired` (the 24 h window ran out; what finished is still in the
  output), `cancelling` then `cancelled` (partial output);
- output and error files: one line per custom_id, in any order,
  `{"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error": {"code",
  "message"} | null}`; the error file holds the requests that failed (a non-200 `status_code`, or an
  error such as `batch_expired`, `batch_cancelled`, `request_timeout`).

Deadline: `run(..., deadline=...)` is an absolute time (on the clock's `now()`), set by the caller
below the CronJob's own. Polling stops there; a batch still running is cancelled, and for up to
`cancel_grace` seconds more the runner waits for it to reach `cancelled` and reads its partial
output. So `run` returns by `deadline + cancel_grace` (plus one request's timeout); the caller keeps
that and the time for its direct calls below the CronJob's deadline.

Retries: every request (upload, create, status, cancel, file download) is retried by the shared
`triage.retry` policy (429, 5xx, 408, 409, connection errors; `Retry-After` honoured), never past the
deadline. A status poll that still fails is not fatal: the next poll asks again. A create that
failed in flight is not repeated blindly: the runner first looks for a batch already made from the
same input file, so a lost response never runs the requests twice. Polling itself is not a retry:
its waits are the back-off of the `poll` policy (`POLL`: from 10 s, by 1.5, up to 120 s), the last
one clipped to end at the deadline (tenacity's deadline stop would end up to a whole interval early).

Errors (`triage.errors` cannot gain classes from this module's change, so they live here, under the
closest existing class, `JudgeError`):

    JudgeError
    └── BatchRunError          batch mode cannot be used for this run: send every request directly
        └── BatchUnsupported  the server has no Batch API (404/405/501, "not found"/"unsupported")

Both are raised only before any batch exists (the probe, the first upload and create). Once one
batch exists, every later failure (a chunk not submitted, a batch lost by a restarted server, an
unreadable file or line, garbage where a chat completion should be) becomes a `Left` with its reason.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Literal, TypeVar

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, ValidationError

from triage.domain.kernel import one_line
from triage.domain.records import Tokens
from triage.errors import JudgeError
from triage.judges.model.exchange import Transient, short, wait_headers
from triage.retry import Clock, RetryPolicy, async_sleep, current_clock

ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
WINDOW: Literal["24h"] = "24h"
#: OpenAI's limits per input file (`client.batches.create`'s documentation)
MAX_REQUESTS = 50_000
MAX_BYTES = 200_000_000
#: how much of a server's unusable answer a reason quotes
CLIP = 160
#: how the status polls wait: the policy's back-off alone (from 10 s, half as long again each time, up
#: to 2 minutes, no jitter); no limit of polls: the deadline ends them
POLL = RetryPolicy(attempts=None, initial=10.0, factor=1.5, maximum=120.0, jitter=0.0)

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
Status = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class BatchRunError(JudgeError):
    """Batch mode cannot be used for this run; the requests are to be sent directly."""


class BatchUnsupported(BatchRunError):
    """The server has no Batch API (many OpenAI-compatible servers: vLLM, Ollama, llama.cpp)."""


# --- what a run returns -------------------------------------------------------------------------

#: why a request has no answer:
#: - `deadline`: its batch was still running at the deadline and was cancelled before it ran
#: - `expired`: its batch's 24 h window ran out before it ran
#: - `cancelled`: its batch was cancelled by someone else
#: - `failed`: it ran and failed (`status_code` says how; 4xx other than 408/409/429 will fail again)
#: - `rejected`: the server rejected its batch's input file (status `failed`)
#: - `unreadable`: its output line, its answer or its batch's file did not follow the contract
#: - `missing`: its batch ended but neither file has a line for it
#: - `not_submitted`: its file was never accepted (upload or create failed, too large, no time left)
#: - `lost`: the server no longer knows its batch (a restart without state), or its status stayed
#:   unreadable
LeftKind = Literal[
    "deadline", "expired", "cancelled", "failed", "rejected", "unreadable", "missing", "not_submitted", "lost"
]


@dataclass(frozen=True)
class Answered:
    """A request the batch answered with HTTP 200 and a chat completion."""

    custom_id: str
    completion: ChatCompletion
    batch_id: str
    request_id: str | None = None


@dataclass(frozen=True)
class Left:
    """A request the batch did not answer: the caller sends it directly (or not, if not `retryable`)."""

    custom_id: str
    kind: LeftKind
    reason: str
    retryable: bool = True
    status_code: int | None = None
    batch_id: str | None = None


@dataclass(frozen=True)
class BatchRecord:
    """One batch the run created, as it ended."""

    id: str
    input_file_id: str | None
    status: str
    requests: int
    #: request_counts (total, completed, failed) as the server last reported them
    counts: tuple[int, int, int] | None
    cancelled_by_us: bool
    polls: int


@dataclass
class BatchOutcome:
    """Every custom_id of a run exactly once: in `answered` or in `left`."""

    order: list[str]
    answered: dict[str, Answered] = field(default_factory=dict)
    left: dict[str, Left] = field(default_factory=dict)
    batches: list[BatchRecord] = field(default_factory=list)
    #: output lines ignored: not JSON, naming no custom_id of the run, or repeating one already read
    stray_lines: int = 0

    def left_ids(self) -> list[str]:
        """The custom_ids with no answer, in the order the requests were given."""
        return [cid for cid in self.order if cid in self.left]

    def tokens(self) -> Tokens:
        """Tokens the answered requests used, from each completion's `usage`."""
        total = Tokens()
        for answered in self.answered.values():
            total = total + tokens_of(answered.completion)
        return total

    def _settle(self, item: Answered | Left) -> bool:
        """Record `item` unless its custom_id is already settled; whether it was recorded."""
        cid = item.custom_id
        if cid in self.answered or cid in self.left:
            return False
        if isinstance(item, Answered):
            self.answered[cid] = item
        else:
            self.left[cid] = item
        return True


# --- the runner ---------------------------------------------------------------------------------


class _Counts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class _LineError(BaseModel):
    code: str | None = None
    message: str | None = None
    line: int | None = None


class _Errors(BaseModel):
    data: list[_LineError] | None = None


class _BatchState(BaseModel):
    """What the runner reads of a batch object: lenient with the rest (compatible servers differ in
    the fields they add or leave out), strict on these."""

    model_config = ConfigDict(extra="ignore")

    id: str
    status: Status
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: _Errors | None = None
    request_counts: _Counts | None = None


class _FileRef(BaseModel):
    id: str


@dataclass
class _Chunk:
    """Consecutive requests within both file limits, spooled to a temporary file as JSONL (a night's
    requests, about 27 KB each, are never all in memory at once as lines, let alone twice); with
    `too_large`, a lone request over the byte limit, never sent."""

    ids: list[str] = field(default_factory=list)
    size: int = 0
    file: IO[bytes] | None = None
    too_large: bool = False


@dataclass
class _Job:
    """One submitted batch and what the run knows of it."""

    batch: _BatchState
    ids: tuple[str, ...]
    polls: int = 0
    cancelled_by_us: bool = False
    #: the server no longer knows the batch, or its status could not be read: why
    lost: str | None = None
    trouble: str | None = None

    @property
    def done(self) -> bool:
        return self.lost is not None or self.batch.status in TERMINAL


class _Failed(Exception):
    """A request that failed for good (after the policy's retries), or answered garbage."""

    def __init__(self, reason: str, error: openai.APIError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error

    @property
    def status(self) -> int | None:
        return getattr(self.error, "status_code", None)


def _retryable(ex: BaseException) -> bool:
    return isinstance(ex, Transient)


class BatchRunner:
    """Sends chat-completion requests through the Batch API of one OpenAI-compatible server.

    `client`: the judge's `openai.AsyncOpenAI` (its own retries are turned off here; `retry` does
    them). `clock`: None for the retry policy's clock, else `current_clock()` (virtual in tests).
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        *,
        retry: RetryPolicy | None = None,
        clock: Clock | None = None,
        max_requests: int = MAX_REQUESTS,
        max_bytes: int = MAX_BYTES,
        poll: RetryPolicy = POLL,
        cancel_grace: float = 120.0,
        timeout: float = 120.0,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        if max_requests < 1 or max_bytes < 1:
            raise ValueError("max_requests and max_bytes must be at least 1")
        if poll.initial <= 0 or poll.factor < 1 or poll.maximum < poll.initial or cancel_grace < 0:
            raise ValueError("polling: 0 < poll.initial <= poll.maximum, poll.factor >= 1, cancel_grace >= 0")
        self._client = client.with_options(max_retries=0, timeout=timeout)
        self.retry = retry or RetryPolicy()
        self._clock = clock
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.poll = poll
        self.cancel_grace = cancel_grace
        self.metadata = dict(metadata or {})
        #: HTTP requests made to the files and batches endpoints, failed ones included
        self.requests = 0
        self._supported = False

    @property
    def clock(self) -> Clock:
        return self._clock or self.retry.clock or current_clock()

    # -- the run -------------------------------------------------------------------------------

    async def probe(self, until: float | None = None) -> None:
        """Raise `BatchUnsupported` when the server has no Batch API (`GET /v1/batches?limit=1`),
        `BatchRunError` when it cannot say. Asked once per runner; no retry starts after `until` (the
        clock's monotonic time)."""
        if self._supported:
            return
        try:
            raw = await self._call(
                "list batches", lambda: self._client.batches.with_raw_response.list(limit=1), until=until
            )
            page = _json(raw.text, "the batch list")
            if not (
                isinstance(page, dict) and page.get("object") == "list" and isinstance(page.get("data"), list)
            ):
                raise _Failed(f"the batch list is not a list object: {one_line(raw.text, CLIP)}")
        except _Failed as ex:
            raise _classify(ex, "GET /v1/batches", probing=True) from ex.error
        self._supported = True

    async def run(self, requests: Mapping[str, Mapping[str, Any]], *, deadline: datetime) -> BatchOutcome:
        """Answer `requests` (custom_id -> chat-completion body) through batches, by `deadline`.

        Raises `BatchUnsupported` / `BatchRunError` only before any batch exists (nothing was sent
        then: the caller sends everything directly); `ValueError` for requests no batch accepts.
        """
        if deadline.tzinfo is None:
            raise ValueError("deadline must be timezone-aware")
        clock = self.clock
        end = clock.monotonic() + (deadline - clock.now()).total_seconds()
        outcome = BatchOutcome(order=list(requests))
        chunks = self._spool(requests)  # refuses a request no batch accepts before anything is sent
        try:
            if not chunks:
                return outcome
            await self.probe(until=end)
            jobs = await self._submit_all(chunks, outcome, end)
        finally:
            for chunk in chunks:
                if chunk.file is not None:
                    chunk.file.close()

        await self._poll(jobs, end)
        grace_end = max(clock.monotonic(), end) + self.cancel_grace
        running = [job for job in jobs if not job.done]
        for job in running:
            await self._cancel(job, grace_end)
        await self._poll(running, grace_end)
        for job in jobs:
            await self._collect(job, outcome, grace_end)
        return outcome

    def _stopped(self) -> bool:
        """The run's budget is spent or cancelled (SIGTERM): stop polling now, as at the deadline."""
        budget = self.retry.budget
        return budget is not None and budget.spent()

    def _spool(self, requests: Mapping[str, Mapping[str, Any]]) -> list[_Chunk]:
        """The requests as JSONL in consecutive chunks within both limits, each in a temporary file
        (the caller closes them); a lone request over the byte limit is a chunk of its own, `too_large`.
        Raises `ValueError` for a request no batch accepts, before any file is written."""
        for cid, body in requests.items():
            _check(cid, body)
        chunks: list[_Chunk] = []
        current: _Chunk | None = None
        try:
            for cid, body in requests.items():
                data = _line(cid, body)
                if len(data) > self.max_bytes:
                    chunks.append(_Chunk([cid], len(data), too_large=True))
                    continue
                full = current is not None and (
                    len(current.ids) >= self.max_requests or current.size + len(data) > self.max_bytes
                )
                if current is None or full:
                    current = _Chunk(file=tempfile.TemporaryFile())  # noqa: SIM115 - closed by `run`
                    chunks.append(current)
                assert current.file is not None
                current.file.write(data)
                current.ids.append(cid)
                current.size += len(data)
        except BaseException:
            for chunk in chunks:
                if chunk.file is not None:
                    chunk.file.close()
            raise
        return chunks

    async def _submit_all(self, chunks: list[_Chunk], outcome: BatchOutcome, end: float) -> list[_Job]:
        """A batch per chunk; what cannot be sent is settled as left."""
        clock = self.clock
        jobs: list[_Job] = []
        for chunk in chunks:
            if chunk.too_large:
                reason = f"its request alone is over the batch file limit of {self.max_bytes} bytes"
                outcome._settle(Left(chunk.ids[0], "not_submitted", reason))
                continue
            if clock.monotonic() >= end or self._stopped():
                for cid in chunk.ids:
                    outcome._settle(Left(cid, "not_submitted", "the deadline came before it was sent"))
                continue
            try:
                jobs.append(await self._submit(chunk, len(jobs) + 1, end))
            except _Failed as ex:
                if not jobs:
                    raise _classify(ex, "the first batch", probing=False) from ex.error
                for cid in chunk.ids:
                    outcome._settle(Left(cid, "not_submitted", ex.reason))
            finally:
                if chunk.file is not None:  # uploaded (or not): its lines are not needed any more
                    chunk.file.close()
        return jobs

    async def _submit(self, chunk: _Chunk, number: int, end: float) -> _Job:
        name = f"triage-batch-{number}.jsonl"
        spooled = chunk.file
        assert spooled is not None
        spooled.flush()  # httpx declares the file's size on disk as the part's length
        raw = await self._call(
            "upload the input file",
            # streamed from the file (httpx reads it from the start on every attempt)
            lambda: self._client.files.with_raw_response.create(
                file=(name, spooled, "application/jsonl"), purpose="batch"
            ),
            until=end,
        )
        uploaded = _parsed(_FileRef, raw.text, "the uploaded file")
        attempts = 0

        async def create() -> Any:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and (found := await self._made_from(uploaded.id)) is not None:
                return found  # the first create went through; its answer was lost on the way
            return await self._client.batches.with_raw_response.create(
                input_file_id=uploaded.id,
                endpoint=ENDPOINT,
                completion_window=WINDOW,
                metadata=self.metadata or None,
            )

        answer = await self._call("create the batch", create, until=end)
        batch = (
            answer
            if isinstance(answer, _BatchState)
            else _parsed(_BatchState, answer.text, "the created batch")
        )
        return _Job(batch=batch, ids=tuple(chunk.ids))

    async def _made_from(self, file_id: str) -> _BatchState | None:
        """A batch already created from `file_id`, among the server's most recent ones."""
        try:
            self.requests += 1
            raw = await self._client.batches.with_raw_response.list(limit=100)
            page = json.loads(raw.text)
            for item in page.get("data", []) if isinstance(page, dict) else []:
                if isinstance(item, dict) and item.get("input_file_id") == file_id:
                    return _BatchState.model_validate(item)
        except (openai.APIError, ValueError, ValidationError):
            return None
        return None

    async def _poll(self, jobs: list[_Job], until: float) -> None:
        """Ask each unfinished batch its status until all are done or `until` (or the budget) ends."""
        clock = self.clock
        polls = 0
        while any(not job.done for job in jobs):
            left = until - clock.monotonic()
            if left <= 0 or self._stopped():
                return
            polls += 1
            await async_sleep(clock, self.retry.budget, min(self.poll.backoff(polls), left))
            for job in jobs:
                if not job.done:
                    await self._refresh(job, until)

    async def _refresh(self, job: _Job, until: float) -> None:
        job.polls += 1
        batches = self._client.batches.with_raw_response
        failed = await self._batch_state(job, "batch status", batches.retrieve, "the batch status", until)
        if failed is not None:
            job.trouble = failed.reason  # asked again at the next poll

    async def _cancel(self, job: _Job, until: float) -> None:
        job.cancelled_by_us = True
        batches = self._client.batches.with_raw_response
        failed = await self._batch_state(job, "cancel the batch", batches.cancel, "the cancelled batch", until)
        if failed is not None:
            # it may have ended meanwhile (a cancel of a finished batch is refused): look again
            job.trouble = f"cancel refused: {failed.reason}"
            await self._refresh(job, until)

    async def _batch_state(
        self, job: _Job, what: str, request: Callable[[str], Awaitable[Any]], state: str, until: float
    ) -> _Failed | None:
        """`request` about the job's batch (a status read, a cancel) and the batch's state it answers
        (`state` names it in an error); the failure, unless it lost the batch (a 404: the server no
        longer knows it)."""
        try:
            raw = await self._call(what, lambda: request(job.batch.id), until=until)
            job.batch = _parsed(_BatchState, raw.text, state)
            job.trouble = None
        except _Failed as ex:
            if ex.status != 404:
                return ex
            job.lost = f"the server no longer knows batch {job.batch.id} (restarted without its state?)"
        return None

    # -- reading what a batch left -------------------------------------------------------------

    async def _collect(self, job: _Job, outcome: BatchOutcome, until: float) -> None:
        batch = job.batch
        counts = batch.request_counts
        outcome.batches.append(
            BatchRecord(
                id=batch.id,
                input_file_id=batch.input_file_id,
                status="lost" if job.lost else batch.status,
                requests=len(job.ids),
                counts=(counts.total, counts.completed, counts.failed) if counts else None,
                cancelled_by_us=job.cancelled_by_us,
                polls=job.polls,
            )
        )
        ids = set(job.ids)
        if job.lost is not None:
            for cid in job.ids:
                outcome._settle(Left(cid, "lost", job.lost, batch_id=batch.id))
            return
        if batch.status == "failed":
            self._rejected(job, outcome)
            return
        unread: str | None = None
        for file_id, what in ((batch.output_file_id, "output"), (batch.error_file_id, "error")):
            if not file_id:
                continue
            try:
                text = await self._download(file_id, what, until)
            except _Failed as ex:
                unread = f"its batch's {what} file {file_id} could not be read: {ex.reason}"
                continue
            cancelled: LeftKind = "deadline" if job.cancelled_by_us else "cancelled"
            for row in text.splitlines():
                if row.strip():
                    outcome.stray_lines += not self._read_line(row, ids, batch.id, cancelled, outcome)
        for cid in job.ids:
            outcome._settle(self._unanswered(cid, job, unread))

    def _rejected(self, job: _Job, outcome: BatchOutcome) -> None:
        """A batch whose input file the server refused: each line's own error, else the batch's."""
        errors = job.batch.errors.data if job.batch.errors and job.batch.errors.data else []
        by_line = {e.line: e for e in errors if e.line is not None}
        summary = "; ".join(_error_text(e.code, e.message, e.line) for e in errors[:3]) or "no reason given"
        for number, cid in enumerate(job.ids, start=1):
            own = by_line.get(number)
            reason = (
                f"the server rejected this line: {_error_text(own.code, own.message, None)}"
                if own
                else f"the server rejected its batch's input file: {summary}"
            )
            outcome._settle(Left(cid, "rejected", reason, batch_id=job.batch.id))

    async def _download(self, file_id: str, what: str, until: float) -> str:
        async def content() -> str:
            return (await self._client.files.content(file_id)).text

        return await self._call(f"read the {what} file", content, until=until)

    def _read_line(
        self, row: str, ids: set[str], batch_id: str, cancelled: LeftKind, outcome: BatchOutcome
    ) -> bool:
        """Settle the custom_id one output or error line names; False for a line ignored."""
        try:
            data = json.loads(row)
        except ValueError:
            return False
        cid = data.get("custom_id") if isinstance(data, dict) else None
        if not isinstance(cid, str) or cid not in ids:
            return False
        assert isinstance(data, dict)
        error, response = data.get("error"), data.get("response")
        if isinstance(error, dict) and error:
            code, message = error.get("code"), error.get("message")
            kind: LeftKind = {"batch_expired": "expired", "batch_cancelled": cancelled}.get(
                str(code), "failed"
            )
            return outcome._settle(Left(cid, kind, _error_text(code, message, None), batch_id=batch_id))
        if not isinstance(response, dict):
            return outcome._settle(
                Left(
                    cid,
                    "unreadable",
                    f"its line has neither a response nor an error: {one_line(row, CLIP)}",
                    batch_id=batch_id,
                )
            )
        status, body = response.get("status_code"), response.get("body")
        request_id = response.get("request_id") if isinstance(response.get("request_id"), str) else None
        if status != 200:
            detail = body.get("error") if isinstance(body, dict) else None
            message = detail.get("message") if isinstance(detail, dict) else body
            code = status if isinstance(status, int) else None
            return outcome._settle(
                Left(
                    cid,
                    "failed",
                    f"HTTP {status}: {one_line(str(message), CLIP)}",
                    retryable=code is None or code >= 500 or code in (408, 409, 429),
                    status_code=code,
                    batch_id=batch_id,
                )
            )
        try:
            completion = ChatCompletion.model_validate(body)
        except ValidationError as ex:
            first = ex.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            return outcome._settle(
                Left(
                    cid,
                    "unreadable",
                    f"its answer is not a chat completion ({where}: {first['msg']})",
                    batch_id=batch_id,
                )
            )
        return outcome._settle(Answered(cid, completion, batch_id, request_id))

    def _unanswered(self, cid: str, job: _Job, unread: str | None) -> Left:
        """Why `cid`, which no line settled, has no answer."""
        batch = job.batch
        status = batch.status
        if unread is not None:
            return Left(cid, "unreadable", unread, batch_id=batch.id)
        if status == "expired":
            return Left(cid, "expired", "its batch expired before it ran", batch_id=batch.id)
        if status == "cancelled" and not job.cancelled_by_us:
            return Left(cid, "cancelled", "its batch was cancelled (not by this run)", batch_id=batch.id)
        if status == "cancelled" or status not in TERMINAL:
            # cancelled by this run at the deadline, or still running after the grace: never ran here
            why = f"; {job.trouble}" if job.trouble else ""
            seen = "was" if status == "cancelled" else "was still (last seen)"
            return Left(
                cid,
                "deadline",
                f"the deadline came before it ran: its batch {seen} {status}{why}",
                batch_id=batch.id,
            )
        return Left(
            cid, "missing", f"its batch {status}, but no output or error line names it", batch_id=batch.id
        )

    # -- one request, with retries ---------------------------------------------------------------

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]], *, until: float | None) -> T:
        """`fn()` with the retry policy, no retry starting past `until` (a clock monotonic time)."""
        policy = self.retry if self.retry.clock is not None else self.retry.with_(clock=self.clock)
        if until is not None:
            left = max(until - self.clock.monotonic(), 0.0)
            policy = policy.with_(deadline=left if policy.deadline is None else min(policy.deadline, left))
        retrying = policy.async_retrying(_retryable, retry_after=wait_headers)
        try:
            async for attempt in retrying:
                with attempt:
                    self.requests += 1
                    try:
                        return await fn()
                    except (
                        openai.RateLimitError,
                        openai.InternalServerError,
                        openai.APIConnectionError,
                    ) as ex:
                        raise Transient(ex) from ex
                    except openai.APIStatusError as ex:
                        if ex.status_code >= 500 or ex.status_code in (408, 409):
                            raise Transient(ex) from ex
                        raise _Failed(f"{what}: {short(ex)}", ex) from ex
        except Transient as ex:
            number = retrying.statistics.get("attempt_number", 1)
            raise _Failed(f"{what}: {short(ex.error)} (after {number} attempts)", ex.error) from ex.error
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


# --- helpers ------------------------------------------------------------------------------------


def _check(cid: object, body: object) -> None:
    """Refuse a request no batch accepts (`ValueError`)."""
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"a custom_id must be a non-empty string, not {cid!r}")
    if not isinstance(body, Mapping) or not body.get("model"):
        raise ValueError(f"request {cid!r}: the body must be a chat-completion request naming its model")
    if body.get("stream"):
        raise ValueError(f"request {cid!r}: a batch cannot stream")


def _line(cid: str, body: Mapping[str, Any]) -> bytes:
    """One JSONL line of the input file, newline included."""
    line = {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": dict(body)}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise _Failed(f"{what} is not JSON: {one_line(text, CLIP)}") from None


def _parsed(cls: type[M], text: str, what: str) -> M:
    """`text` as a `cls`, or `_Failed` saying how it is not one (garbage is a reason, not a crash)."""
    data = _json(text, what)
    try:
        return cls.model_validate(data)
    except ValidationError as ex:
        first = ex.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise _Failed(
            f"{what} is not a {cls.__name__} ({where}: {first['msg']}): {one_line(text, CLIP)}"
        ) from None


_UNSUPPORTED = re.compile(
    r"not found|unsupported|not supported|not implemented|unknown (?:url|endpoint|route|path)|no route|invalid url",
    re.IGNORECASE,
)


def _classify(ex: _Failed, where: str, *, probing: bool) -> BatchRunError:
    """A failure before any batch exists: the server has no Batch API, or batch mode is unusable."""
    status = ex.status
    if status in (404, 405, 501) or (status in (400, 422) and _UNSUPPORTED.search(ex.reason)):
        return BatchUnsupported(f"the server has no Batch API ({where}: {ex.reason})")
    if probing and ex.error is None:  # 200 with garbage: a proxy or a web app, not a batch server
        return BatchUnsupported(f"the server has no Batch API ({where}: {ex.reason})")
    return BatchRunError(f"batch mode unavailable ({where}): {ex.reason}")


def _error_text(code: object, message: object, line: int | None) -> str:
    where = f"line {line}: " if line is not None else ""
    return one_line(f"{where}{code or 'error'}: {message or 'no message'}", CLIP)


def tokens_of(completion: ChatCompletion) -> Tokens:
    """A completion's tokens (`usage.prompt_tokens_details.cached_tokens` for the cached part)."""
    usage = completion.usage
    if usage is None:
        return Tokens()
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Tokens(usage.prompt_tokens or 0, cached, usage.completion_tokens or 0)
