"""The release watch's reads on Langfuse (`domain.ports.ReleaseSource`): the answers per release of
a window, where a trace belongs, the votes cast in a window.

Answers per release, the cheapest way the server offers (the log says which was used):

1. `GET /api/public/v2/metrics` (Cloud, Langfuse v4): the `observations` view, root observations
   only (`isRootObservation`: one per trace), counted by `release`, `version` and time bucket.
   One request a night, however many answers.
2. `GET /api/public/metrics` (v1, self-hosted Langfuse v3; deprecated, gone on v4): the `traces`
   view, counted the same way. One request.
3. Neither (`404`, `405`, `501`, or a `400` refusing the query, as an older server does): the
   window's traces paged, 1000 root observations a request from `/v2/observations`
   (`fields=core,basic,trace_context`: the start, `version` and `release`), or on a v3 server
   `GET /api/public/traces?fields=core`, 100 a request. Where each trace belongs goes, a page at a
   time, into a temporary SQLite file (`_Places`), which counts them (a GROUP BY) and answers
   `trace_places` after: a million traces are not a million objects in memory.

The time buckets give each release its first and last sighting (the releases' order): the finest
bucket whose rows fit the metrics API's row limit (`hour` for up to two weeks, then `day`,
`week`); an answer that reaches the limit may be cut, so the next coarser bucket is asked, and
past the coarsest the traces are paged. Counts arrive as numbers or as text (ClickHouse's
integers in JSON): both are read. A bucket the server filled with nothing (count 0) is skipped.

Only counts come from the metrics API. Votes and verdicts are read as rows (the v3 scores API, as
the nightly job reads them): an answer voted twice is one voted answer, a vote on a conversation
counts for the turn it rates, and a trace's verdict is the job's current one
(`domain.scores.current_scores`). The metrics API can give none of the three. Where each voted or
triaged trace belongs: root observations with a `traceId` `any of` filter, 100 traces a request
(one a request on a server that refuses the filter); on a v3 server, the window's traces paged
once.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote

import pydantic

from triage.domain.kernel import as_utc, iso_z, parse_time
from triage.domain.release_counts import ReleaseAnswers, ReleaseCounts, TracePlace
from triage.domain.votes import WindowVotes
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged
from triage.sources.langfuse.reads import ScoreReads, legacy_traces
from triage.sources.langfuse.wire import ObservationsPage, id_batches

log = logging.getLogger("triage.sources.langfuse")

#: the metrics API's largest `row_limit`
METRICS_ROW_LIMIT = 1000
#: answers that say "this server cannot answer this metrics query": try the next way
METRICS_UNAVAILABLE = frozenset({400, 404, 405, 501})
#: time buckets, finest first, and how long each is
BUCKETS: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}
OBS_PAGE = 1000  # v2 observations: the documented maximum
LEGACY_PAGE = 100  # GET /traces: more is a 400
PLACE_FIELDS = "core,basic,trace_context"  # start (core), version (basic), release (trace_context)
_ROOTS = {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True}


@dataclass(frozen=True)
class MetricsEndpoint:
    """One version of the metrics API and the query that counts answers per release on it."""

    name: str
    path: str
    view: str
    filters: tuple[dict[str, Any], ...] = ()

    def query(self, start: datetime, end: datetime, bucket: str) -> dict[str, Any]:
        return {
            "view": self.view,
            "dimensions": [{"field": "release"}, {"field": "version"}],
            "metrics": [{"measure": "count", "aggregation": "count"}],
            "filters": list(self.filters),
            "timeDimension": {"granularity": bucket},
            "fromTimestamp": iso_z(start),
            # the metrics API's end is inclusive; the window's is not
            "toTimestamp": iso_z(end - timedelta(milliseconds=1)),
            "config": {"row_limit": METRICS_ROW_LIMIT},
        }


METRICS_V2 = MetricsEndpoint("Langfuse's metrics API (v2)", "api/public/v2/metrics", "observations", (_ROOTS,))
METRICS_V1 = MetricsEndpoint("Langfuse's metrics API (v1)", "api/public/metrics", "traces")


def first_bucket(start: datetime, end: datetime) -> str:
    """The finest bucket likely to fit the row limit for a window this long (two weeks of hours are
    336 rows a release and version; more releases reach the limit, and the next bucket is asked)."""
    span = end - start
    return "hour" if span <= timedelta(days=14) else "day" if span <= timedelta(days=180) else "week"


class MetricsRow(pydantic.BaseModel):
    """One row of a metrics answer: the dimensions asked, the count (`<aggregation>_<measure>`)."""

    model_config = pydantic.ConfigDict(extra="ignore")

    release: str | None = None
    version: str | None = None
    count: int = pydantic.Field(alias="count_count", ge=0)
    time_dimension: datetime

    @pydantic.field_validator("time_dimension", mode="before")
    @classmethod
    def _time(cls, value: Any) -> datetime:
        # ClickHouse writes "2026-12-01 07:00:00" (or a date, for day buckets): naive means UTC
        return as_utc(parse_time(str(value)))

    @pydantic.field_validator("count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value


class MetricsAnswer(pydantic.BaseModel):
    data: list[MetricsRow]


def _pages_of(rows: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    """`rows` in lists of `size`: a page's worth at a time."""
    page: list[dict[str, Any]] = []
    for row in rows:
        page.append(row)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


@dataclass
class _Tally:
    answers: int = 0
    first: datetime | None = None
    last: datetime | None = None
    versions: dict[str, int] = field(default_factory=dict)

    def add(self, version: str | None, answers: int, first: datetime, last: datetime) -> None:
        self.answers += answers
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)
        if version:
            self.versions[version] = self.versions.get(version, 0) + answers


def _text(value: Any) -> str | None:
    """A release or version as triage keeps it: stripped text, None when blank or absent."""
    return value.strip() or None if isinstance(value, str) else None


def _place(raw: dict[str, Any], start: datetime) -> TracePlace:
    """A trace's place from a row that carries its release and version (a v2 root observation with
    `basic` and `trace_context`, or a legacy trace)."""
    return TracePlace(release=_text(raw.get("release")), version=_text(raw.get("version")), start=start)


def _counts(tallies: dict[str, _Tally], start: datetime) -> list[ReleaseCounts]:
    out = []
    for name, tally in tallies.items():
        assert tally.first is not None and tally.last is not None
        version = max(tally.versions.items(), key=lambda kv: (kv[1], kv[0]))[0] if tally.versions else None
        first = max(tally.first, start)  # a bucket may begin before the window
        out.append(
            ReleaseCounts(
                release=name, version=version, first_seen=first, last_seen=max(first, tally.last),
                answers=tally.answers, votes=0, thumbs_down=0,
            )  # fmt: skip
        )
    return out


#: trace ids per `IN (...)` of one `_Places` query (SQLite allows at least 999 variables)
_IDS_PER_QUERY = 900


def _stamp(at: datetime) -> str:
    """A start as `_Places` keeps it: UTC text that sorts as the times do (to the microsecond)."""
    return as_utc(at).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Places:
    """Where each paged trace belongs (its release, version and start), in a temporary SQLite file
    that SQLite deletes when it is closed: the memory of a page, not of the window."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("", check_same_thread=False)  # "": a temporary file on disk
        self._db.execute("CREATE TABLE places (traceId TEXT PRIMARY KEY, release TEXT, version TEXT, start TEXT)")

    def keep(self, places: Iterable[tuple[str, TracePlace]], *, earliest: bool) -> None:
        """Each trace's place; for a trace already there, the earlier (`earliest`: a trace's rows
        may repeat) or the first kept."""
        rows = ((t, p.release, p.version, _stamp(p.start)) for t, p in places)
        on_conflict = "DO UPDATE SET release = excluded.release, version = excluded.version, start = excluded.start "
        self._db.executemany(
            "INSERT INTO places VALUES (?, ?, ?, ?) ON CONFLICT (traceId) "
            + (on_conflict + "WHERE excluded.start < places.start" if earliest else "DO NOTHING"),
            rows,
        )

    def get(self, trace_ids: Sequence[str]) -> dict[str, TracePlace]:
        found: dict[str, TracePlace] = {}
        for i in range(0, len(trace_ids), _IDS_PER_QUERY):
            chunk = trace_ids[i : i + _IDS_PER_QUERY]
            for trace_id, release, version, start in self._db.execute(
                f"SELECT * FROM places WHERE traceId IN ({', '.join('?' * len(chunk))})", chunk
            ):
                found[trace_id] = TracePlace(release=release, version=version, start=parse_time(start))
        return found

    def counted(self, start: datetime) -> ReleaseAnswers:
        """The answers per release (and those with none), as `_by_metrics` counts its rows."""
        tallies: dict[str, _Tally] = {}
        unreleased = 0
        for release, version, answers, first, last in self._db.execute(
            "SELECT release, version, count(*), min(start), max(start) FROM places GROUP BY release, version"
        ):
            if release is None:
                unreleased += answers
            else:
                tallies.setdefault(release, _Tally()).add(version, answers, parse_time(first), parse_time(last))
        return ReleaseAnswers(releases=_counts(tallies, start), unreleased=unreleased, counted_by="paging")


class LangfuseReleases:
    """The `ReleaseSource` of `LangfuseBackend`, on its client (and its retries and counters)."""

    def __init__(self, http: LangfuseHttp) -> None:
        self.http = http
        #: None until tried; False: the server has no metrics API answering the query
        self.metrics: MetricsEndpoint | None | bool = None
        self.legacy = False  # True: /v2/observations answers 404 (Langfuse v3)
        self.filter_any_of = True  # False: the server refused a traceId `any of` filter
        #: the traces of a window that was paged: where each belongs, and the window
        self._paged: tuple[datetime, datetime, _Places] | None = None
        self._window: tuple[datetime, datetime] | None = None  # the last window counted

    # -- answers per release --------------------------------------------------------------------

    def release_answers(self, start: datetime, end: datetime) -> ReleaseAnswers:
        start, end = as_utc(start), as_utc(end)
        self._window = (start, end)
        before = self.http.stats.requests
        why: list[str] = []
        for endpoint in (METRICS_V2, METRICS_V1):
            if self.metrics is False or (isinstance(self.metrics, MetricsEndpoint) and self.metrics is not endpoint):
                continue
            try:
                counted = self._by_metrics(endpoint, start, end)
            except HttpStatus as ex:
                if ex.status not in METRICS_UNAVAILABLE:
                    raise fail(f"counting answers per release ({endpoint.name})", ex) from None
                why.append(f"GET /{endpoint.path} answers HTTP {ex.status}")
                log.info("%s: trying the next way to count answers per release", why[-1])
                continue
            if counted is None:
                why.append(f"{endpoint.name} reaches its row limit at every bucket")
                continue
            self.metrics = endpoint
            return self._done(counted, endpoint.name, before)
        self.metrics = False
        answers = self._by_paging(start, end)
        how = f"paging Langfuse's {'traces (legacy API)' if self.legacy else 'root observations'}"
        return self._done(answers, f"{how} ({'; '.join(why) or 'no metrics API'})", before)

    def _done(self, answers: ReleaseAnswers, how: str, before: int) -> ReleaseAnswers:
        requests = self.http.stats.requests - before
        log.info(
            "answers per release counted by %s: %d releases, %d answers without one, %d requests",
            how,
            len(answers.releases),
            answers.unreleased,
            requests,
            extra={"event": "release_answers", "counted_by": how, "requests": requests},
        )
        return answers.model_copy(update={"counted_by": how})

    def _by_metrics(self, endpoint: MetricsEndpoint, start: datetime, end: datetime) -> ReleaseAnswers | None:
        """The counts from one metrics endpoint, at the finest bucket that is not cut; None when
        every bucket reaches the row limit (raises `HttpStatus` for the caller to classify)."""
        buckets = list(BUCKETS)
        for bucket in buckets[buckets.index(first_bucket(start, end)) :]:
            what = f"counting answers per release ({endpoint.name}, {bucket} buckets)"
            query = json.dumps(endpoint.query(start, end, bucket), separators=(",", ":"))
            body = self.http.call(what, partial(self.http.raw, "GET", endpoint.path, params={"query": query}))
            try:
                rows = MetricsAnswer.model_validate(body).data
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: the answer does not match the API contract: {ex}") from None
            if len(rows) >= METRICS_ROW_LIMIT:
                log.info("%s: %d rows, the row limit: asking coarser buckets", what, len(rows))
                continue
            tallies: dict[str, _Tally] = {}
            unreleased = 0
            for row in rows:
                if row.count == 0:
                    continue
                release = _text(row.release)
                if release is None:
                    unreleased += row.count
                    continue
                last = min(row.time_dimension + BUCKETS[bucket], end) - timedelta(milliseconds=1)
                tallies.setdefault(release, _Tally()).add(_text(row.version), row.count, row.time_dimension, last)
            return ReleaseAnswers(
                releases=_counts(tallies, start), unreleased=unreleased, counted_by=endpoint.name,
                resolution=BUCKETS[bucket],
            )  # fmt: skip
        return None

    def _by_paging(self, start: datetime, end: datetime) -> ReleaseAnswers:
        return self._page_window(start, end).counted(start)

    def _page_window(self, start: datetime, end: datetime) -> _Places:
        """Every trace started in [start, end): v2 root observations, else the legacy trace list;
        kept a page at a time in a `_Places`."""
        if self._paged is not None and self._paged[:2] == (start, end):
            return self._paged[2]
        places = _Places()
        if not self.legacy:
            try:
                rows = self._root_rows(
                    "paging the window's traces", filter=json.dumps([_ROOTS]),
                    fromStartTime=iso_z(start), toStartTime=iso_z(end),
                )  # fmt: skip
                for page in _pages_of(rows, OBS_PAGE):
                    held: dict[str, TracePlace] = {}
                    self._keep(held, page)
                    places.keep(held.items(), earliest=True)
            except HttpStatus as ex:
                if ex.status != 404:
                    raise fail("paging the window's traces", ex) from None
                log.info("GET /api/public/v2/observations answers 404: paging the legacy trace list")
                self.legacy = True
                places = _Places()
        if self.legacy:
            places = self._legacy_window(start, end)
        self._paged = (start, end, places)
        return places

    def _legacy_window(self, start: datetime, end: datetime) -> _Places:
        places = _Places()

        def take(trace: Any, stamp: datetime) -> None:
            places.keep([(trace["id"], _place(trace, stamp))], earliest=False)

        legacy_traces(self.http, "paging the window's traces", start, end, limit=LEGACY_PAGE, take=take)
        return places

    # -- where traces belong ----------------------------------------------------------------------

    def trace_places(self, trace_ids: Sequence[str]) -> dict[str, TracePlace]:
        ids = list(dict.fromkeys(trace_ids))
        places = self._paged[2].get(ids) if self._paged is not None else {}
        missing = [t for t in ids if t not in places]
        if self._paged is not None and (self.legacy or not missing):
            return places  # a v3 server: the window's traces were paged; the others are outside it
        for batch in id_batches(missing):
            if self.legacy:
                break
            try:
                self._keep(places, self._batch(batch))
            except HttpStatus as ex:
                if ex.status != 404:
                    raise fail(f"reading where {len(batch)} traces belong", ex) from None
                self.legacy = True
        if self.legacy:
            if self._window is not None:  # a v3 server: the window's traces paged once, not one by one
                return places | self._page_window(*self._window).get(missing)
            for trace_id in missing:
                places.update(self._legacy_place(trace_id))
        return places

    def _batch(self, batch: list[str]) -> Iterator[dict[str, Any]]:
        what = f"reading where {len(batch)} traces belong"
        if self.filter_any_of:
            condition = [{"type": "stringOptions", "column": "traceId", "operator": "any of", "value": batch}, _ROOTS]
            try:
                rows = list(self._root_rows(what, filter=json.dumps(condition)))
            except HttpStatus as ex:
                if ex.status not in {400, 422}:
                    raise
                log.info("the server refused a traceId `any of` filter: reading one trace per request")
                self.filter_any_of = False
            else:
                wanted = set(batch)
                if all(r.get("traceId") in wanted for r in rows):
                    yield from rows
                    return
                log.info("the server ignored the traceId filter: reading one trace per request")
                self.filter_any_of = False
        for trace_id in batch:
            yield from self._root_rows(f"reading where trace {trace_id} belongs", traceId=trace_id,
                                       filter=json.dumps([_ROOTS]))  # fmt: skip

    def _legacy_place(self, trace_id: str) -> dict[str, TracePlace]:
        what = f"reading where trace {trace_id} belongs (legacy API)"
        path = f"api/public/traces/{quote(trace_id, safe='')}"
        try:
            body = self.http.call(what, partial(self.http.raw, "GET", path, params={"fields": "core"}))
        except HttpStatus as ex:
            if ex.status == 404:
                return {}
            raise fail(what, ex) from None
        try:
            stamp = as_utc(parse_time(body["timestamp"]))
        except (KeyError, TypeError, ValueError) as ex:
            raise LangfuseError(f"{what}: the answer does not match the API contract: {ex!r}") from ex
        return {trace_id: _place(body, stamp)}

    def _root_rows(self, what: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Raw root-observation rows of a v2 query, page by page (raises `HttpStatus`)."""

        def page(cursor: str | None) -> ObservationsPage:
            query = {**params, "fields": PLACE_FIELDS, "limit": OBS_PAGE, **({"cursor": cursor} if cursor else {})}
            body = self.http.call(what, partial(self.http.raw, "GET", "api/public/v2/observations", params=query))
            try:
                return ObservationsPage.model_validate(body)
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: the page does not match the API contract: {ex}") from None

        yield from paged(page, what)

    @staticmethod
    def _keep(places: dict[str, TracePlace], rows: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> None:
        """Each trace's earliest root row (a trace may have unmerged duplicate rows)."""
        for row in rows:
            try:
                trace_id = row["traceId"]
                stamp = as_utc(parse_time(row["startTime"]))
            except (KeyError, TypeError, ValueError) as ex:
                raise LangfuseError(f"an observation row does not match the API contract: {ex!r}") from ex
            held = places.get(trace_id)
            if held is None or stamp < held.start:
                places[trace_id] = _place(row, stamp)

    # -- votes ----------------------------------------------------------------------------------

    def cast_votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The nightly job's vote read (`ScoreReads.votes`) with no look-back."""
        return ScoreReads(self.http, vote_lookback=timedelta(0)).votes(score_name, start, end)
