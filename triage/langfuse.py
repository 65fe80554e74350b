"""The Langfuse backend: votes and traces in, triage scores out (see ../shared/notes/langfuse.md).

Calls go through the `langfuse` package's Fern API client (`LangfuseAPI`) on an injected httpx
client; raw HTTP through the same httpx client only where the SDK has no call: the legacy trace
and session reads, and a single-object score POST for servers that speak the older contract.

Every request is retried here, not by the SDK (its retries skip transport errors and timeouts):
429 waits for `Retry-After`, 5xx, 408, 409, timeouts and dropped connections back off
exponentially, all under a per-call deadline. 401/403 become `ConfigError`; anything else that
fails becomes `LangfuseError`.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import pydantic
from langfuse.api.client import LangfuseAPI
from langfuse.api.core.api_error import ApiError
from langfuse.api.core.request_options import RequestOptions
from langfuse.api.scores.types.create_score_request import CreateScoreRequest
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential_jitter,
)

from .errors import ConfigError, LangfuseError
from .models import Observation, ScoreWrite, Vote, WriteOutcome
from .scores import score_id

log = logging.getLogger(__name__)

T = TypeVar("T")

SCORES_PAGE = 100  # v3 scores: more is a 400
IDS_PER_READ = 100  # ids per `?id=` read, matching the page size so one page answers it
OBS_PAGE = 1000  # v2 observations: the documented maximum
TRACES_PER_READ = 100  # trace ids per JSON `any of` filter
FILTER_CHARS = 6000  # and at most this much filter text, to stay well inside URL limits
SESSIONS_PER_READ = 100
POST_BYTES = 512 * 1024  # score chunks well under the 1 MiB body limit
POST_SCORES = 500
OBS_FIELDS = "core,basic,time,io,metadata"


_SCORE_PARAMS = {"from_timestamp": "fromTimestamp", "to_timestamp": "toTimestamp"}


class _ScoreRow(pydantic.BaseModel):
    """One ScoreV3 row, only the fields triage reads."""

    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)

    id: str
    name: str
    data_type: str = pydantic.Field(alias="dataType")
    value: Any = None
    timestamp: datetime
    updated_at: datetime = pydantic.Field(alias="updatedAt")
    environment: str | None = None
    comment: str | None = None
    metadata: Any = None
    subject: dict[str, Any] | None = None
    author_user_id: str | None = pydantic.Field(default=None, alias="authorUserId")


class _ScoresMeta(pydantic.BaseModel):
    cursor: str | None = None


class _ScoresPage(pydantic.BaseModel):
    data: list[_ScoreRow]
    meta: _ScoresMeta


class _HttpStatus(Exception):
    """A non-2xx answer, before it is classified."""

    def __init__(self, status: int, headers: dict[str, str] | None, body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.body = body

    def detail(self) -> str:
        text = self.body if isinstance(self.body, str) else json.dumps(self.body, default=str)
        return f"HTTP {self.status}: {text[:300]}"


def _retryable(ex: BaseException) -> bool:
    if isinstance(ex, _HttpStatus):
        return ex.status in {408, 409, 429} or ex.status >= 500
    return isinstance(ex, httpx.TransportError)  # timeouts, refused and dropped connections


def _retry_after(headers: dict[str, str]) -> float | None:
    """Seconds from a Retry-After header: a number (fractions allowed) or an HTTP date."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parsed = email.utils.parsedate_to_datetime(value) if value else None
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return max(0.0, (parsed - datetime.now(UTC)).total_seconds())


def _chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _as_utc(stamp: datetime) -> datetime:
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def _raw_io(value: Any) -> str | None:
    """input/output as the v2 API sends them (a JSON-encoded string), whatever shape arrived."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _encoded(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


class LangfuseBackend:
    """`triage.interfaces.Backend` on Langfuse's public API. Synchronous; safe to share between threads."""

    def __init__(
        self,
        *,
        public_key: str,
        secret_key: str,
        base_url: str,
        timeout: float = 30.0,
        deadline_seconds: float = 600.0,
        confirm_wait_seconds: float = 60.0,
        httpx_client: httpx.Client | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        confirm_first_wait: float = 1.0,
    ) -> None:
        if not public_key or not secret_key:
            raise ConfigError("Langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY")
        self.base_url = base_url.rstrip("/")
        self.request_count = 0
        self._timeout = timeout
        self._deadline = deadline_seconds
        self._confirm_wait = confirm_wait_seconds
        self._confirm_first_wait = confirm_first_wait
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._auth = httpx.BasicAuth(public_key, secret_key)
        self._own_client = httpx_client is None
        self._http = httpx_client or httpx.Client(
            timeout=timeout, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16)
        )
        hooks = self._http.event_hooks
        # every request the client sends, retries included, passes this hook
        self._http.event_hooks = {**hooks, "request": [*hooks.get("request", []), self._count]}
        self._count_lock = threading.Lock()
        self._api = LangfuseAPI(
            base_url=self.base_url, username=public_key, password=secret_key, httpx_client=self._http
        )
        self._options: RequestOptions = {"max_retries": 0, "timeout_in_seconds": timeout}  # type: ignore[typeddict-item]
        # detected once per run
        self._legacy: bool | None = None  # True: /v2/observations answers 404 (Langfuse v3)
        self._filter_any_of = True  # False: the server refused a traceId `any of` filter
        self._list_contract: bool | None = None  # False: POST /scores takes one object only
        self._project_id: str | None = None
        self._project_fetched = False

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        if self._own_client:
            self._http.close()

    def __enter__(self) -> LangfuseBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, request: httpx.Request) -> None:
        with self._count_lock:
            self.request_count += 1

    def _wait(self, state: RetryCallState) -> float:
        ex = state.outcome.exception() if state.outcome else None
        if isinstance(ex, _HttpStatus) and ex.status == 429:
            after = _retry_after(ex.headers)
            if after is not None:
                return after
        return wait_exponential_jitter(
            initial=self._backoff_initial, max=self._backoff_max, jitter=self._backoff_initial
        )(state)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one request with retries under the deadline; classify what finally fails."""

        def attempt() -> T:
            try:
                return fn()
            except ApiError as ex:
                if ex.status_code is not None and 200 <= ex.status_code < 300:
                    raise LangfuseError(f"{what}: unreadable response body") from ex
                raise _HttpStatus(ex.status_code or 0, ex.headers, ex.body) from ex
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex

        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=self._wait,
            stop=stop_before_delay(self._deadline),
            reraise=True,
            before_sleep=lambda s: log.info(
                "langfuse %s: retrying after %s (attempt %d)", what, _describe(s), s.attempt_number
            ),
        )
        try:
            return retrying(attempt)
        except _HttpStatus as ex:
            if ex.status in {401, 403}:
                raise ConfigError(
                    f"Langfuse refused the credentials ({what}, HTTP {ex.status}): check LANGFUSE_PUBLIC_KEY "
                    "and LANGFUSE_SECRET_KEY, and that LANGFUSE_BASE_URL points at their project"
                ) from None
            raise
        except httpx.TransportError as ex:
            raise LangfuseError(f"{what}: {type(ex).__name__}: {ex} (gave up)") from ex

    def _raw(self, method: str, path: str, *, params: Any = None, json_body: Any = None) -> Any:
        """One plain request through the shared client; the decoded JSON of a 2xx answer."""
        response = self._http.request(
            method,
            f"{self.base_url}/{path}",
            params=params,
            json=json_body,
            auth=self._auth,
            timeout=self._timeout,
        )
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if not 200 <= response.status_code < 300:
            raise _HttpStatus(response.status_code, dict(response.headers), body)
        if isinstance(body, str):
            raise LangfuseError(f"{method} {path}: the answer is not JSON")
        return body

    @staticmethod
    def _fail(what: str, ex: _HttpStatus) -> LangfuseError:
        return LangfuseError(f"{what} failed: {ex.detail()}")

    # ------------------------------------------------------------------ scores (read)

    def _scores(self, what: str, **params: Any) -> Iterator[_ScoreRow]:
        """Every row of a v3 scores query, page by page (newest first); stops when the caller does.

        Plain HTTP, not `api.scores.get_many`: the SDK's response conversion costs about 15 ms per
        score row (measured: 1.5 s per 100-row page), more than the request itself.
        """
        query = {_SCORE_PARAMS.get(k, k): v for k, v in params.items() if v is not None}
        for key in ("fromTimestamp", "toTimestamp"):
            if key in query:
                query[key] = _as_utc(query[key]).isoformat().replace("+00:00", "Z")

        def page(cursor: str | None) -> _ScoresPage:
            page_query = {**query, "limit": SCORES_PAGE, **({"cursor": cursor} if cursor else {})}
            try:
                body = self._call(what, lambda: self._raw("GET", "api/public/v3/scores", params=page_query))
                return _ScoresPage.model_validate(body)
            except _HttpStatus as ex:
                raise self._fail(what, ex) from None
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex

        yield from _paged(page, what)

    def _scores_by_id(self, ids: Sequence[str], what: str, **params: Any) -> dict[str, _ScoreRow]:
        """The current row of each id that exists, reading `?id=` in chunks of 100."""
        found: dict[str, Any] = {}
        for chunk in _chunks(list(dict.fromkeys(ids)), IDS_PER_READ):
            wanted = set(chunk)
            for row in self._scores(what, id=",".join(chunk), **params):
                if row.id in wanted and _newer(row, found.get(row.id)):
                    found[row.id] = row
                if wanted <= found.keys():
                    break  # every id found: no need for the next page (older rows of the same ids)
        return found

    def votes(self, score_name: str, start: datetime, end: datetime) -> list[Vote]:
        newest: dict[str, _ScoreRow] = {}
        # no `value` filter: a changed vote can leave a stale row that such a filter still matches
        for row in self._scores(
            "reading votes",
            name=score_name,
            from_timestamp=_as_utc(start),
            to_timestamp=_as_utc(end),
            fields="subject,details",
        ):
            if _newer(row, newest.get(row.id)):
                newest[row.id] = row
        # The window may hold an old row of a vote changed since (its new row is outside the
        # window): re-read the thumbs-down candidates by id, which returns the current row.
        down = [sid for sid, row in newest.items() if _vote_value(row) == 0]
        if down:
            current = self._scores_by_id(down, "re-reading votes", name=score_name, fields="subject,details")
            newest.update(current)
        votes = []
        for row in newest.values():
            vote = _to_vote(row)
            if vote is not None:
                votes.append(vote)
        votes.sort(key=lambda v: (v.timestamp, v.id))
        return votes

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        by_id = {score_id(t, score_name, rule_version): t for t in dict.fromkeys(trace_ids)}
        found = self._scores_by_id(list(by_id), "reading triaged traces", name=score_name)
        return {by_id[sid] for sid in found}

    # ------------------------------------------------------------------ observations

    def _observation_pages(self, what: str, **params: Any) -> Iterator[Any]:
        def page(cursor: str | None) -> Any:
            return self._call(
                what,
                lambda: self._api.observations.get_many(
                    limit=OBS_PAGE, cursor=cursor, request_options=self._options, **params
                ),
            )

        yield from _paged(page, what)

    def _v2_rows(self, what: str, **params: Any) -> list[Any] | None:
        """All rows of a v2 observations query; None when the server has no such endpoint (404)."""
        if self._legacy:
            return None
        try:
            rows = list(self._observation_pages(what, **params))
        except _HttpStatus as ex:
            if ex.status == 404:
                log.info("GET /api/public/v2/observations answers 404: reading the legacy trace API")
                self._legacy = True
                return None
            raise
        self._legacy = False
        return rows

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation]]:
        ids = list(dict.fromkeys(trace_ids))
        result: dict[str, dict[str, Observation]] = {t: {} for t in ids}
        for batch in _id_batches(ids):
            rows = self._batch_rows(batch)
            if rows is None:
                break  # legacy server: read every trace below
            for row in rows:
                obs = _to_observation(row)
                if obs.trace_id in result and _newer_obs(obs, result[obs.trace_id].get(obs.id)):
                    result[obs.trace_id][obs.id] = obs
        if self._legacy:
            for trace_id in ids:
                result[trace_id] = {o.id: o for o in self._legacy_trace(trace_id)}
        return {t: sorted(obs.values(), key=lambda o: (o.start_time, o.id)) for t, obs in result.items()}

    def _batch_rows(self, batch: list[str]) -> list[Any] | None:
        what = f"reading observations of {len(batch)} traces"
        if self._filter_any_of:
            condition = [{"type": "stringOptions", "column": "traceId", "operator": "any of", "value": batch}]
            try:
                rows = self._v2_rows(what, filter=json.dumps(condition), fields=OBS_FIELDS)
            except _HttpStatus as ex:
                if ex.status not in {400, 422}:
                    raise self._fail(what, ex) from None
                log.info("the server refused a traceId `any of` filter: reading one trace per request")
                self._filter_any_of = False
            else:
                wanted = set(batch)
                if rows is None or all(r.trace_id in wanted for r in rows):
                    return rows
                # rows of other traces: the filter was ignored, so this server cannot batch
                log.info("the server ignored the traceId filter: reading one trace per request")
                self._filter_any_of = False
        out: list[Any] = []
        for trace_id in batch:
            try:
                rows = self._v2_rows(f"reading trace {trace_id}", trace_id=trace_id, fields=OBS_FIELDS)
            except _HttpStatus as ex:
                raise self._fail(f"reading trace {trace_id}", ex) from None
            if rows is None:
                return None
            out.extend(rows)
        return out

    def _legacy_trace(self, trace_id: str) -> list[Observation]:
        what = f"reading trace {trace_id} (legacy API)"
        try:
            body = self._call(
                what,
                lambda: self._raw(
                    "GET",
                    f"api/public/traces/{quote(trace_id, safe='')}",
                    params={"fields": "core,io,observations"},
                ),
            )
        except _HttpStatus as ex:
            if ex.status == 404:
                return []  # not (yet) there
            raise self._fail(what, ex) from None
        out: dict[str, Observation] = {}
        for raw in body.get("observations") or []:
            try:
                obs = Observation(
                    id=raw["id"],
                    traceId=raw.get("traceId") or trace_id,
                    type=raw.get("type") or "SPAN",
                    name=raw.get("name"),
                    parentObservationId=raw.get("parentObservationId"),
                    startTime=raw["startTime"],
                    endTime=raw.get("endTime"),
                    # the legacy API parses input/output (a JSON string arrives as a plain str):
                    # re-encode every value so the reader sees the v2 API's raw-string shape
                    input=_encoded(raw.get("input")),
                    output=_encoded(raw.get("output")),
                    metadata=raw.get("metadata"),
                    sessionId=body.get("sessionId"),
                    userId=body.get("userId"),
                    environment=raw.get("environment") or body.get("environment"),
                    isRootObservation=raw.get("parentObservationId") is None,
                    level=raw.get("level"),
                    statusMessage=raw.get("statusMessage"),
                    updatedAt=raw.get("updatedAt"),
                )
            except (KeyError, pydantic.ValidationError) as ex:
                raise LangfuseError(f"{what}: an observation does not match the API contract: {ex}") from ex
            if _newer_obs(obs, out.get(obs.id)):
                out[obs.id] = obs
        return list(out.values())

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[str]]:
        ids = list(dict.fromkeys(session_ids))
        starts: dict[str, dict[str, datetime]] = {s: {} for s in ids}
        for chunk in _chunks(ids, SESSIONS_PER_READ):
            what = f"reading {len(chunk)} sessions"
            condition = [
                {"type": "stringOptions", "column": "sessionId", "operator": "any of", "value": chunk},
                {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True},
            ]
            try:
                rows = self._v2_rows(what, filter=json.dumps(condition), fields="core,basic,time")
            except _HttpStatus as ex:
                raise self._fail(what, ex) from None
            if rows is None:
                break
            for row in rows:
                if row.session_id in starts and row.trace_id:
                    traces = starts[row.session_id]
                    start = _as_utc(row.start_time)
                    if row.trace_id not in traces or start < traces[row.trace_id]:
                        traces[row.trace_id] = start
        if self._legacy:
            for session_id in ids:
                starts[session_id] = self._legacy_session(session_id)
        return {
            s: [t for t, _ in sorted(traces.items(), key=lambda kv: (kv[1], kv[0]))]
            for s, traces in starts.items()
        }

    def _legacy_session(self, session_id: str) -> dict[str, datetime]:
        what = f"reading session {session_id} (legacy API)"
        try:
            body = self._call(what, lambda: self._raw("GET", f"api/public/sessions/{session_id}"))
        except _HttpStatus as ex:
            if ex.status == 404:
                return {}
            raise self._fail(what, ex) from None
        out: dict[str, datetime] = {}
        for trace in body.get("traces") or []:
            try:
                out[trace["id"]] = _as_utc(datetime.fromisoformat(trace["timestamp"].replace("Z", "+00:00")))
            except (KeyError, ValueError, AttributeError) as ex:
                raise LangfuseError(f"{what}: a trace does not match the API contract: {ex}") from ex
        return out

    # ------------------------------------------------------------------ scores (write)

    def write_scores(self, scores: Sequence[ScoreWrite]) -> WriteOutcome:
        unique = list({s.id: s for s in scores}.values())
        failed: dict[str, str] = {}
        notes: dict[str, str] = {}  # ids whose write was answered with a warning (207)
        sent: list[ScoreWrite] = []
        for chunk in _post_chunks(unique):
            if self._list_contract is not False:
                outcome = self._post_list(chunk)
                if outcome is None:  # the server speaks only the older contract
                    self._list_contract = False
                else:
                    self._list_contract = True
                    error, warning = outcome
                    for score in chunk:
                        if error:
                            failed[score.id] = error
                        else:
                            sent.append(score)
                            if warning:
                                notes[score.id] = warning
                    continue
            for score in chunk:
                error = self._post_one(score)
                if error:
                    failed[score.id] = error
                else:
                    sent.append(score)
        confirmed, unconfirmed = self._confirm(sent)
        for sid, reason in unconfirmed.items():
            failed[sid] = f"{reason}; {notes[sid]}" if sid in notes else reason
        return WriteOutcome(confirmed=confirmed, failed=failed)

    def _post_list(self, chunk: list[ScoreWrite]) -> tuple[str | None, str | None] | None:
        """POST a list. (error, warning) per chunk; None when the server wants one object per POST."""
        what = f"writing {len(chunk)} scores"
        request = [CreateScoreRequest(**_sdk_score(s)) for s in chunk]
        try:
            response = self._call(
                what, lambda: self._api.scores.create(request=request, request_options=self._options)
            )
        except _HttpStatus as ex:
            if ex.status in {400, 422} and self._list_contract is None:
                log.info(
                    "POST /api/public/scores refused a list (%s): writing one score per request", ex.status
                )
                return None
            return f"write refused: {ex.detail()}", None
        except LangfuseError as ex:
            return f"write failed: {ex}", None
        rejected = getattr(response, "rejected", 0) or 0
        if rejected:
            # 207: the errors carry no score id, so the read-back decides which ones landed
            messages = "; ".join(e.message for e in (getattr(response, "errors", None) or [])[:3])
            return None, f"the server rejected {rejected} of {len(chunk)} scores in the batch: {messages}"
        return None, None

    def _post_one(self, score: ScoreWrite) -> str | None:
        """POST one object (the older contract); an error message, or None."""
        what = f"writing score {score.id}"
        try:
            self._call(what, lambda: self._raw("POST", "api/public/scores", json_body=_wire_score(score)))
        except _HttpStatus as ex:
            return f"write refused: {ex.detail()}"
        except LangfuseError as ex:
            return f"write failed: {ex}"
        return None

    def _confirm(self, sent: Sequence[ScoreWrite]) -> tuple[list[str], dict[str, str]]:
        """Read the written scores back by id until each shows its value, or the wait is over."""
        pending = {s.id: s for s in sent}
        confirmed: list[str] = []
        seen_values: dict[str, str] = {}
        started = time.monotonic()
        delay = self._confirm_first_wait
        error: str | None = None
        while pending:
            remaining = self._confirm_wait - (time.monotonic() - started)
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            delay = min(max(delay * 2, 0.25), 10.0)
            try:
                rows = self._scores_by_id(list(pending), "confirming scores", fields="details")
            except LangfuseError as ex:
                error = f"could not read the score back: {ex}"
                break
            for sid, row in rows.items():
                score = pending.get(sid)
                if score is None:
                    continue
                if str(row.value) == score.value and row.name == score.name:
                    confirmed.append(sid)
                    del pending[sid]
                else:
                    seen_values[sid] = str(row.value)
        waited = time.monotonic() - started
        unconfirmed = {}
        for sid in pending:
            if error:
                unconfirmed[sid] = error
            elif sid in seen_values:
                expected = pending[sid].value
                unconfirmed[sid] = (
                    f"read back value {seen_values[sid]!r}, expected {expected!r} after {waited:.0f} s"
                )
            else:
                unconfirmed[sid] = (
                    f"not readable after {waited:.0f} s: Langfuse accepted the write but it has not landed"
                )
        order = {s.id: i for i, s in enumerate(sent)}
        return sorted(confirmed, key=order.__getitem__), unconfirmed

    # ------------------------------------------------------------------ links

    def trace_url(self, trace_id: str) -> str | None:
        if not self._project_fetched:
            try:
                projects = self._call(
                    "reading the project", lambda: self._api.projects.get(request_options=self._options)
                )
                self._project_id = projects.data[0].id if projects.data else None
            except (LangfuseError, _HttpStatus) as ex:
                log.warning("no trace links: the project could not be read (%s)", _short(ex))
                self._project_id = None
            self._project_fetched = True
        if self._project_id is None:
            return None
        return f"{self.base_url}/project/{quote(self._project_id, safe='')}/traces/{quote(trace_id, safe='')}"


# ---------------------------------------------------------------------- mapping helpers


def _paged(fetch: Callable[[str | None], Any], what: str) -> Iterator[Any]:
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


def _describe(state: RetryCallState) -> str:
    ex = state.outcome.exception() if state.outcome else None
    return _short(ex) if ex else "?"


def _short(ex: BaseException) -> str:
    if isinstance(ex, _HttpStatus):
        return f"HTTP {ex.status}"
    return type(ex).__name__


def _newer(row: _ScoreRow, than: _ScoreRow | None) -> bool:
    """Whether score row `row` is newer than `than`: later timestamp, then later updatedAt."""
    if than is None:
        return True
    return (_as_utc(row.timestamp), _as_utc(row.updated_at)) > (
        _as_utc(than.timestamp),
        _as_utc(than.updated_at),
    )


def _newer_obs(obs: Observation, than: Observation | None) -> bool:
    if than is None:
        return True
    if obs.updated_at is None:
        return False
    return than.updated_at is None or _as_utc(obs.updated_at) > _as_utc(than.updated_at)


def _vote_value(row: _ScoreRow) -> float | None:
    if row.data_type not in {"BOOLEAN", "NUMERIC"}:
        return None  # a categorical or text score is not a vote
    value = row.value
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return None  # a categorical or text score is not a vote


def _to_vote(row: _ScoreRow) -> Vote | None:
    value = _vote_value(row)
    if value is None:
        return None
    metadata = row.metadata if isinstance(row.metadata, dict) else {}
    subject = row.subject or {}
    kind = subject.get("kind")
    trace_id = session_id = None
    turn: int | None = None
    if kind == "trace":
        trace_id = subject.get("id")
    elif kind == "observation":
        trace_id = subject.get("traceId")
    elif kind == "session":
        session_id = subject.get("id")
        raw_turn = metadata.get("turn")
        if isinstance(raw_turn, int | str) and not isinstance(raw_turn, bool) and str(raw_turn).isdigit():
            turn = int(raw_turn)
    elif kind is not None:
        return None  # an experiment score is not a user's vote
    user = metadata.get("userId") or metadata.get("user_id") or row.author_user_id
    return Vote(
        id=row.id,
        trace_id=trace_id,
        session_id=session_id,
        turn=turn,
        value=value,
        comment=row.comment,
        user_id=str(user) if user is not None else None,
        timestamp=_as_utc(row.timestamp),
        updated_at=_as_utc(row.updated_at),
        environment=row.environment or "default",
    )


def _to_observation(row: Any) -> Observation:
    return Observation(
        id=row.id,
        traceId=row.trace_id or "",
        type=row.type or "SPAN",
        name=row.name,
        parentObservationId=row.parent_observation_id,
        startTime=row.start_time,
        endTime=row.end_time,
        input=_raw_io(row.input),
        output=_raw_io(row.output),
        metadata=row.metadata,
        sessionId=row.session_id,
        userId=row.user_id,
        environment=row.environment,
        isRootObservation=row.is_root_observation,
        level=row.level,
        statusMessage=row.status_message,
        updatedAt=row.updated_at,
    )


def _id_batches(ids: Sequence[str]) -> Iterator[list[str]]:
    """Trace ids in batches of at most TRACES_PER_READ and FILTER_CHARS of filter text."""
    batch: list[str] = []
    size = 0
    for trace_id in ids:
        cost = len(json.dumps(trace_id)) + 2
        if batch and (len(batch) >= TRACES_PER_READ or size + cost > FILTER_CHARS):
            yield batch
            batch, size = [], 0
        batch.append(trace_id)
        size += cost
    if batch:
        yield batch


def _wire_score(score: ScoreWrite) -> dict[str, Any]:
    """The camelCase body of one score."""
    return {
        "id": score.id,
        "traceId": score.trace_id,
        "name": score.name,
        "value": score.value,
        "dataType": score.data_type,
        "comment": score.comment,
        "metadata": score.metadata,
        "environment": score.environment,
        "source": "API",
        # newer servers upsert on (id, timestamp); older ones ignore it and stamp the receive time
        "timestamp": _as_utc(score.timestamp).isoformat().replace("+00:00", "Z"),
    }


def _sdk_score(score: ScoreWrite) -> dict[str, Any]:
    return {
        "id": score.id,
        "trace_id": score.trace_id,
        "name": score.name,
        "value": score.value,
        "data_type": score.data_type,
        "comment": score.comment,
        "metadata": score.metadata,
        "environment": score.environment,
        "source": "API",
        "timestamp": _as_utc(score.timestamp),
    }


def _post_chunks(scores: Iterable[ScoreWrite]) -> Iterator[list[ScoreWrite]]:
    """Scores in chunks whose JSON body stays well under the 1 MiB limit."""
    chunk: list[ScoreWrite] = []
    size = 2
    for score in scores:
        cost = len(json.dumps(_wire_score(score), default=str).encode()) + 1
        if chunk and (size + cost > POST_BYTES or len(chunk) >= POST_SCORES):
            yield chunk
            chunk, size = [], 2
        chunk.append(score)
        size += cost
    if chunk:
        yield chunk
