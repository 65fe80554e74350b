"""Plumbing for the Langfuse API: one httpx client, plain JSON requests on it, retries, counting.

No part of the `langfuse` SDK is imported: even its generated REST client (`langfuse.api`) can
only be imported after the package's `__init__`, which loads the tracing client (OpenTelemetry's
SDK and exporters, protobuf, numpy: about 18 MB of resident memory and 280 modules, for two calls
triage made through it). The answers are checked against the SDK 5.x models' shapes instead
(`wire.BatchAnswer`, `wire.ProjectsPage`).

Every request is retried here (`triage.retry`), not by the SDK (its retries skip transport errors
and timeouts): 429 waits for `Retry-After`, 5xx, 408, 409, timeouts and dropped connections back
off exponentially, within the policy's deadline. 401/403 become `ConfigError`; anything else that
fails becomes `LangfuseError`, or `HttpStatus` for the caller to classify.

Links to traces in the Langfuse UI: the project id is read once, when the source opens.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
import pydantic
from tenacity import RetryCallState

from triage.domain.config import LangfuseLimits
from triage.domain.ports import SourceStats
from triage.errors import ConfigError, LangfuseError
from triage.retry import Clock, PaceExceeded, Pacer, Rate, RetryPolicy
from triage.sources.langfuse.wire import ProjectsPage

log = logging.getLogger("triage.sources.langfuse")

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

#: the default for Langfuse: until a 90 s deadline per call, waits from 0.5 s to 30 s (a Langfuse
#: that is down at the start of the run ends it within about two minutes)
LANGFUSE_RETRY = RetryPolicy(attempts=None, deadline=90.0, initial=0.5, maximum=30.0)


class HttpStatus(Exception):
    """A non-2xx answer, before it is classified."""

    def __init__(self, status: int, headers: dict[str, str] | None, body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.body = body

    def detail(self) -> str:
        text = self.body if isinstance(self.body, str) else json.dumps(self.body, default=str)
        return f"HTTP {self.status}: {text[:300]}"


def retryable(ex: BaseException) -> bool:
    if isinstance(ex, HttpStatus):
        return ex.status in {408, 409, 429} or ex.status >= 500
    return isinstance(ex, httpx.TransportError)  # timeouts, refused and dropped connections


def _wait_headers(ex: BaseException) -> Mapping[str, str] | None:
    """A 429's headers, whose `Retry-After` says how long to wait; other failures back off."""
    if isinstance(ex, HttpStatus) and ex.status == 429:
        return ex.headers
    return None


def short(ex: BaseException) -> str:
    if isinstance(ex, HttpStatus):
        return f"HTTP {ex.status}"
    return type(ex).__name__


def fail(what: str, ex: HttpStatus) -> LangfuseError:
    return LangfuseError(f"{what} failed: {ex.detail()}")


def parsed(what: str, model: type[M], body: Any) -> M:
    """An answer's `body` as a `model`; LangfuseError when it does not match the API contract."""
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as ex:
        raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex


ApiGroup = Literal["general", "datasets", "metrics", "ingestion"]
_DATASET_PATHS = ("/datasets", "/dataset-items", "/dataset-run-items", "/experiments", "/experiment-items")
#: the longest a request waits for its slot before the budget counts as spent (a day's metrics
#: budget spent is no reason to wait a day): a minute's window, and some
MAX_PACE_WAIT = 120.0
#: a window kept this much longer than Langfuse's: our clock and theirs differ, and a request
#: reaches them some time after it leaves
PACE_MARGIN = 1.0


def api_group(path: str) -> ApiGroup:
    """Which of Langfuse Cloud's rate-limit groups a request's path counts against."""
    if "/otel/" in path or path.endswith("/ingestion"):
        return "ingestion"
    if "/metrics" in path:
        return "metrics"
    if any(part in path for part in _DATASET_PATHS):
        return "datasets"
    return "general"


def pacers(limits: LangfuseLimits | None, clock: Clock | None = None) -> dict[ApiGroup, Pacer]:
    """One pacer per group the limits name (ingestion is not limited by them)."""
    if limits is None:
        return {}
    rates: dict[ApiGroup, list[Rate]] = {
        "general": [Rate(limits.general_per_minute, 60.0 + PACE_MARGIN)] if limits.general_per_minute else [],
        "datasets": [Rate(limits.datasets_per_minute, 60.0 + PACE_MARGIN)] if limits.datasets_per_minute else [],
        "metrics": [
            *([Rate(limits.metrics_per_hour, 3600.0 + PACE_MARGIN)] if limits.metrics_per_hour else []),
            *([Rate(limits.metrics_per_day, 86400.0 + PACE_MARGIN)] if limits.metrics_per_day else []),
        ],
    }
    return {group: Pacer(r, clock=clock, max_wait=MAX_PACE_WAIT) for group, r in rates.items() if r}


class LangfuseHttp:
    """The shared client. Synchronous; safe to share between threads. With `limits`, every
    request (retries included: Cloud counts them) waits for its slot in its group's budget."""

    def __init__(
        self,
        *,
        public_key: str,
        secret_key: str,
        base_url: str,
        timeout: float,
        retry: RetryPolicy,
        stats: SourceStats,
        httpx_client: httpx.Client | None = None,
        limits: LangfuseLimits | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.pacers = pacers(limits, clock)
        self.timeout = timeout
        self.retry = retry
        self.stats = stats
        self._auth = httpx.BasicAuth(public_key, secret_key)
        self._own_client = httpx_client is None
        self._http = httpx_client or httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16)
        )
        hooks = self._http.event_hooks
        # every request the client sends, retries included, passes this hook
        self._http.event_hooks = {**hooks, "request": [*hooks.get("request", []), self._count]}
        #: set when a call gave up on an outage (transport errors, 5xx, 429): later calls make one
        #: attempt each, so a Langfuse that is plainly down costs one deadline, not one per batch
        self.down: str | None = None

    def close(self) -> None:
        if self._own_client:
            self._http.close()

    def _count(self, request: httpx.Request) -> None:
        pacer = self.pacers.get(api_group(request.url.path))
        if pacer is not None:
            try:
                pacer.wait()
            except PaceExceeded as ex:
                where = f"{request.method} {request.url.path}"
                raise LangfuseError(f"{where}: {ex} ([langfuse] in the configuration)") from None
        self.stats.count_request()

    def call(self, what: str, fn: Callable[[], T], *, retry: RetryPolicy | None = None) -> T:
        """Run one request with retries; classify what finally fails."""

        def attempt() -> T:
            try:
                return fn()
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.info(
                "langfuse %s: retrying after %s (attempt %d)",
                what,
                short(error) if error else "?",
                state.attempt_number,
            )

        policy = retry or self.retry
        if self.down is not None:
            policy = policy.with_(attempts=1)
        retrying = policy.retrying(retryable, retry_after=_wait_headers, before_sleep=before_sleep)
        try:
            result = retrying(attempt)
        except (HttpStatus, httpx.TransportError) as ex:
            if retryable(ex) and self.down is None:
                self.down = short(ex)
                log.warning(
                    "langfuse %s: gave up (%s); until Langfuse answers again, each call makes one attempt",
                    what,
                    short(ex),
                    extra={"event": "langfuse_down"},
                )
            self._classify(what, ex)
            raise
        if self.down is not None:
            log.info("langfuse answers again", extra={"event": "langfuse_up"})
            self.down = None
        return result

    def _classify(self, what: str, ex: HttpStatus | httpx.TransportError) -> None:
        """Raise what a final failure stands for; return to let an `HttpStatus` through."""
        if isinstance(ex, HttpStatus):
            if ex.status in {401, 403}:
                raise ConfigError(
                    f"Langfuse refused the credentials ({what}, HTTP {ex.status}): check LANGFUSE_PUBLIC_KEY "
                    "and LANGFUSE_SECRET_KEY, and that LANGFUSE_BASE_URL points at their project"
                ) from None
            return
        raise LangfuseError(f"{what}: {type(ex).__name__}: {ex} (gave up)") from ex

    def raw(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One plain request through the shared client; the decoded JSON of a 2xx answer."""
        response = self._http.request(
            method,
            f"{self.base_url}/{path}",
            params=params,
            json=json_body,
            headers=headers,
            auth=self._auth,
            timeout=self.timeout,
        )
        if response.status_code == 204:  # a DELETE's answer: no body
            return {}
        try:
            body = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested too deep to decode
            body = response.text
        if not 200 <= response.status_code < 300:
            raise HttpStatus(response.status_code, dict(response.headers), body)
        if isinstance(body, str):
            raise LangfuseError(f"{method} {path}: the answer is not JSON")
        return body


def paged(fetch: Callable[[str | None], Any], what: str) -> Iterator[Any]:
    """The rows of every page of a cursor-paged listing, newest first, until the caller stops."""
    cursor: str | None = None
    seen: set[str] = set()
    while True:
        page = fetch(cursor)
        yield from page.data
        cursor = page.meta.cursor
        if not cursor:
            return
        if cursor in seen:
            raise LangfuseError(f"{what}: the server repeated a page cursor")
        seen.add(cursor)


log = logging.getLogger("triage.sources.langfuse")

#: a link is a convenience: a few quick tries, never the whole deadline of a data read
LINKS_RETRY = RetryPolicy(attempts=3, initial=0.5, maximum=2.0)


class TraceLinks:
    """`url(trace_id)` with no I/O, after `resolve()` has read the project id (or failed to)."""

    def __init__(self, base_url: str, project_id: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.project_id = project_id

    def resolve(self, http: LangfuseHttp, retry: RetryPolicy = LINKS_RETRY) -> None:
        """Read the project id. Without one there are no links (logged); refused keys raise."""
        try:
            projects = http.call(
                "reading the project",
                lambda: ProjectsPage.model_validate(http.raw("GET", "api/public/projects")),
                retry=retry,
            )
            self.project_id = projects.data[0].id if projects.data else None
        except (LangfuseError, HttpStatus) as ex:
            log.warning("no trace links: the project could not be read (%s)", short(ex))
            self.project_id = None

    def url(self, trace_id: str) -> str | None:
        if self.project_id is None:
            return None
        return f"{self.base_url}/project/{quote(self.project_id, safe='')}/traces/{quote(trace_id, safe='')}"
