"""Reading scores: the window's votes, and which traces already carry a triage score (v3 API).

Reading traces: observations of many traces per request (v2 API), sessions, and the legacy API.

Detected once per run: a server without `/v2/observations` (404) is read through the legacy trace
and session API; one that refuses or ignores a traceId `any of` filter is read one trace at a time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote

import pydantic

from triage.domain.kernel import as_utc, iso_z, parse_time
from triage.domain.records import Observation, StoredScore, UnreadableTrace, Vote
from triage.domain.scores import score_id
from triage.domain.votes import BadVote, TraceRef, WindowVotes, in_window, stored_time
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged
from triage.sources.langfuse.wire import (
    ObservationsPage,
    ScoreRow,
    ScoresPage,
    chunks,
    id_batches,
    legacy_observation,
    newer,
    newer_observation,
    to_stored,
    to_vote,
    unreadable_vote,
    v2_observation,
    vote_value,
)

#: how far before a window's start a vote read reaches: a vote changed in the window keeps the
#: timestamp of its first write, and v3 filters on timestamps only (`votes`)
VOTE_LOOKBACK = timedelta(days=30)

SCORES_PAGE = 100  # v3 scores: more is a 400
IDS_PER_READ = 100  # ids per `?id=` read, matching the page size so one page answers it

_SCORE_PARAMS = {"from_timestamp": "fromTimestamp", "to_timestamp": "toTimestamp"}


class ScoreReads:
    def __init__(self, http: LangfuseHttp, vote_lookback: timedelta = VOTE_LOOKBACK) -> None:
        self.http = http
        self.vote_lookback = vote_lookback

    def rows(
        self, what: str, *, on_bad: Callable[[Any, pydantic.ValidationError], None] | None = None, **params: Any
    ) -> Iterator[ScoreRow]:
        """Every row of a v3 scores query, page by page (newest first); stops when the caller does.

        A row that breaks the API contract is a `LangfuseError`, or, given `on_bad`, handed to it
        and skipped (a vote read lists it as bad input and the night goes on).

        Plain HTTP, not `api.scores.get_many`: the SDK's response conversion costs about 15 ms per
        score row (measured: 1.5 s per 100-row page), more than the request itself.
        """
        query = {_SCORE_PARAMS.get(k, k): v for k, v in params.items() if v is not None}
        for key in ("fromTimestamp", "toTimestamp"):
            if key in query:
                query[key] = iso_z(query[key])

        def page(cursor: str | None) -> ScoresPage:
            page_query = {**query, "limit": SCORES_PAGE, **({"cursor": cursor} if cursor else {})}
            try:
                body = self.http.call(what, lambda: self.http.raw("GET", "api/public/v3/scores", params=page_query))
                return ScoresPage.model_validate(body)
            except HttpStatus as ex:
                raise fail(what, ex) from None
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex

        for raw in paged(page, what):
            try:
                row = ScoreRow.model_validate(raw)
            except pydantic.ValidationError as ex:
                if on_bad is None:
                    raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex
                on_bad(raw, ex)
                continue
            yield row

    def by_id(self, ids: Sequence[str], what: str, **params: Any) -> dict[str, ScoreRow]:
        """The current row of each id that exists, reading `?id=` in chunks of 100."""
        found: dict[str, ScoreRow] = {}
        for chunk in chunks(list(dict.fromkeys(ids)), IDS_PER_READ):
            wanted = set(chunk)
            for row in self.rows(what, id=",".join(chunk), **params):
                if row.id in wanted and newer(row, found.get(row.id)):
                    found[row.id] = row
                if wanted <= found.keys():
                    break  # every id found: no need for the next page (older rows of the same ids)
        return found

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The votes cast or changed in the window (`in_window`), the current row of each; and the
        rows that cannot be read, each with its reason.

        v3 filters scores by timestamp only, and a changed vote keeps its first timestamp (the
        upsert rule), so the read reaches `vote_lookback` further back and keeps the rows whose
        timestamp or updatedAt is in the window, as they arrive. Held as votes from the first read
        on, not as score rows: a night's rows (metadata, subject) held twice over (the window read
        and the re-read) were about 5 KB per vote at the peak, for a `Vote` of about 1.5 KB."""
        start, end = as_utc(start), as_utc(end)
        newest: dict[str, _Held] = {}
        broken: dict[str, BadVote] = {}  # rows that break the contract, by id
        nameless: list[BadVote] = []  # ... and those without an id

        def set_aside(raw: Any, error: pydantic.ValidationError) -> None:
            bad = unreadable_vote(raw, error)
            if bad.id is None:
                nameless.append(bad)
            else:
                broken[bad.id] = bad

        def set_aside_in_window(raw: Any, error: pydantic.ValidationError) -> None:
            # a broken row whose times can be read and are outside the window is another night's
            times = _raw_times(raw)
            if times is None or in_window(*times, start, end):
                set_aside(raw, error)

        # no `value` filter: a changed vote can leave a stale row that such a filter still matches
        for row in self.rows(
            "reading votes",
            on_bad=set_aside_in_window,
            name=score_name,
            from_timestamp=start - self.vote_lookback,
            to_timestamp=end,
            fields="subject,details",
        ):
            held = newest.get(row.id)
            if held is None and not in_window(as_utc(row.timestamp), as_utc(row.updated_at), start, end):
                continue  # cast and last changed outside the window
            if held is None or _order(row) > held.order:
                newest[row.id] = _Held.of(row)
        # The window may hold an old row of a vote changed since (its new row is outside the
        # window): re-read the thumbs-down candidates by id, which returns the current row.
        down = [sid for sid, held in newest.items() if held.may_be_down]
        for chunk in chunks(down, IDS_PER_READ):  # the reads `by_id` makes, a chunk's rows at a time
            current = self.by_id(
                chunk, "re-reading votes", on_bad=set_aside, name=score_name, fields="subject,details"
            )
            for sid, row in current.items():
                newest[sid] = _Held.of(row)
        read = WindowVotes(votes=[], bad=nameless)
        for sid, held in newest.items():
            if sid in broken:
                read.bad.append(broken.pop(sid))  # its current row breaks the contract
            elif isinstance(held.vote, Vote):
                read.votes.append(held.vote)
            elif held.vote is not None:
                read.bad.append(held.vote)
        read.bad.extend(broken.values())
        read.votes.sort(key=lambda v: (v.timestamp, v.id))
        return read

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        # held as stored scores from the first read on, not as score rows (the worklist reads
        # eight nights of signature scores: every row of them held twice over grew with the window)
        newest: dict[str, tuple[tuple[datetime, datetime], StoredScore]] = {}
        for name in dict.fromkeys(names):
            for row in self.rows(
                f"reading {name} scores",
                name=name,
                from_timestamp=as_utc(start),
                to_timestamp=as_utc(end),
                fields="subject,details,annotation",
            ):
                held = newest.get(row.id)
                order = _order(row)
                if held is None or order > held[0]:
                    newest[row.id] = (order, to_stored(row))
        return sorted((stored for _, stored in newest.values()), key=lambda s: (s.timestamp, s.id))

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        by_id = {score_id(t, score_name, rule_version): t for t in dict.fromkeys(trace_ids)}
        found = self.by_id(list(by_id), "reading triaged traces", name=score_name)
        return {by_id[sid] for sid in found}


def _raw_times(raw: Any) -> tuple[datetime, datetime | None] | None:
    """The timestamp and updatedAt of a row that breaks the contract, when both can be read."""
    if not isinstance(raw, dict):
        return None
    try:
        updated = raw.get("updatedAt")
        return stored_time(raw.get("timestamp"), "timestamp"), (
            stored_time(updated, "updatedAt") if updated is not None else None
        )
    except ValueError:
        return None


def _order(row: ScoreRow) -> tuple[datetime, datetime]:
    """Which of two rows of a score is newer (`wire.newer`): later timestamp, then later updatedAt."""
    return as_utc(row.timestamp), as_utc(row.updated_at)


@dataclass(frozen=True, slots=True)
class _Held:
    """What `votes` keeps of the newest row of a score id: its order, its value, its vote (None
    when the row is no vote: a categorical score, an experiment's; a `BadVote` when it cannot be read)."""

    order: tuple[datetime, datetime]
    value: float | None
    vote: Vote | BadVote | None

    @property
    def may_be_down(self) -> bool:
        """A thumbs-down candidate, whose current row is re-read."""
        return self.value == 0 or (isinstance(self.vote, BadVote) and self.vote.may_be_thumbs_down)

    @classmethod
    def of(cls, row: ScoreRow) -> _Held:
        return cls(_order(row), vote_value(row), to_vote(row))


log = logging.getLogger("triage.sources.langfuse")

OBS_PAGE = 1000  # v2 observations: the documented maximum
SESSIONS_PER_READ = 100
OBS_FIELDS = "core,basic,time,io,metadata"

_TRACE_PARAMS = {"trace_id": "traceId"}


def _first(ex: Exception) -> str:
    """The first problem of a validation error, in one line (the full text is logged once)."""
    if isinstance(ex, pydantic.ValidationError):
        error = ex.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc']) or 'row'}: {error['msg']}"
    return str(ex).splitlines()[0][:200]


class TraceReads:
    def __init__(self, http: LangfuseHttp) -> None:
        self.http = http
        self.legacy: bool | None = None  # True: /v2/observations answers 404 (Langfuse v3)
        self.filter_any_of = True  # False: the server refused a traceId `any of` filter
        #: trace id -> why its rows cannot be read (a row breaks the contract in a field triage reads)
        self.unreadable: dict[str, str] = {}

    def _pages(self, what: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Raw rows, page by page. Plain HTTP, not the SDK: its page model rejects a whole page for one
        row that breaks the contract in a field triage never reads (`projectId: null`)."""
        query = {_TRACE_PARAMS.get(k, k): v for k, v in params.items() if v is not None}

        def page(cursor: str | None) -> ObservationsPage:
            page_query = {**query, "limit": OBS_PAGE, **({"cursor": cursor} if cursor else {})}
            body = self.http.call(what, lambda: self.http.raw("GET", "api/public/v2/observations", params=page_query))
            try:
                return ObservationsPage.model_validate(body)
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: the page does not match the API contract: {_first(ex)}") from None

        yield from paged(page, what)

    def _v2_rows(self, what: str, **params: Any) -> list[Observation] | None:
        """All rows of a v2 observations query; None when the server has no such endpoint (404).
        A row that breaks the contract in a field triage reads marks its trace unreadable."""
        if self.legacy:
            return None
        try:
            raw_rows = list(self._pages(what, **params))
        except HttpStatus as ex:
            if ex.status == 404:
                log.info("GET /api/public/v2/observations answers 404: reading the legacy trace API")
                self.legacy = True
                return None
            raise
        self.legacy = False
        rows: list[Observation] = []
        first_error: str | None = None
        for raw in raw_rows:
            try:
                rows.append(v2_observation(raw))
            except (pydantic.ValidationError, TypeError, ValueError) as ex:
                trace_id = str(raw.get("traceId")) if isinstance(raw, dict) else "?"
                self.unreadable.setdefault(trace_id, f"an observation does not match the API contract: {_first(ex)}")
                first_error = first_error or str(ex)
        if first_error is not None:
            # the whole validation error once, not once per trace
            log.warning("%s: some observation rows do not match the API contract: %s", what, first_error[:2000])
        return rows

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        ids = list(dict.fromkeys(trace_ids))
        result: dict[str, dict[str, Observation]] = {t: {} for t in ids}
        for batch in id_batches(ids):
            rows = self._batch_rows(batch)
            if rows is None:
                break  # legacy server: read every trace below
            for obs in rows:
                if obs.trace_id in result and newer_observation(obs, result[obs.trace_id].get(obs.id)):
                    result[obs.trace_id][obs.id] = obs
        if self.legacy:
            for trace_id in ids:
                result[trace_id] = {o.id: o for o in self._legacy_trace(trace_id)}
        out: dict[str, list[Observation] | UnreadableTrace] = {}
        for trace_id, found in result.items():
            reason = self.unreadable.pop(trace_id, None)
            out[trace_id] = (
                UnreadableTrace(reason=reason)
                if reason is not None
                else sorted(found.values(), key=lambda o: (o.start_time, o.id))
            )
        return out

    def _batch_rows(self, batch: list[str]) -> list[Observation] | None:
        what = f"reading observations of {len(batch)} traces"
        if self.filter_any_of:
            condition = [{"type": "stringOptions", "column": "traceId", "operator": "any of", "value": batch}]
            try:
                rows = self._v2_rows(what, filter=json.dumps(condition), fields=OBS_FIELDS)
            except HttpStatus as ex:
                if ex.status not in {400, 422}:
                    raise fail(what, ex) from None
                log.info("the server refused a traceId `any of` filter: reading one trace per request")
                self.filter_any_of = False
            else:
                wanted = set(batch)
                if rows is None or all(r.trace_id in wanted for r in rows):
                    return rows
                # rows of other traces: the filter was ignored, so this server cannot batch
                log.info("the server ignored the traceId filter: reading one trace per request")
                self.filter_any_of = False
        out: list[Observation] = []
        for trace_id in batch:
            try:
                rows = self._v2_rows(f"reading trace {trace_id}", trace_id=trace_id, fields=OBS_FIELDS)
            except HttpStatus as ex:
                raise fail(f"reading trace {trace_id}", ex) from None
            if rows is None:
                return None
            out.extend(rows)
        return out

    def _legacy_trace(self, trace_id: str) -> list[Observation]:
        what = f"reading trace {trace_id} (legacy API)"
        path = f"api/public/traces/{quote(trace_id, safe='')}"
        try:
            body = self.http.call(
                what, lambda: self.http.raw("GET", path, params={"fields": "core,io,observations"})
            )
        except HttpStatus as ex:
            if ex.status == 404:
                return []  # not (yet) there
            raise fail(what, ex) from None
        out: dict[str, Observation] = {}
        for raw in body.get("observations") or []:
            try:
                obs = legacy_observation(raw, body, trace_id)
            except (KeyError, pydantic.ValidationError) as ex:
                raise LangfuseError(f"{what}: an observation does not match the API contract: {ex}") from ex
            if newer_observation(obs, out.get(obs.id)):
                out[obs.id] = obs
        return list(out.values())

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        ids = list(dict.fromkeys(session_ids))
        starts: dict[str, dict[str, datetime]] = {s: {} for s in ids}
        for chunk in chunks(ids, SESSIONS_PER_READ):
            what = f"reading {len(chunk)} sessions"
            condition = [
                {"type": "stringOptions", "column": "sessionId", "operator": "any of", "value": chunk},
                {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True},
            ]
            try:
                rows = self._v2_rows(what, filter=json.dumps(condition), fields="core,basic,time")
            except HttpStatus as ex:
                raise fail(what, ex) from None
            if rows is None:
                break
            self.unreadable.clear()  # a session read only orders traces; their own read reports them
            for row in rows:
                if row.session_id in starts and row.trace_id:
                    traces = starts[row.session_id]
                    start = as_utc(row.start_time)
                    if row.trace_id not in traces or start < traces[row.trace_id]:
                        traces[row.trace_id] = start
        if self.legacy:
            for session_id in ids:
                starts[session_id] = self._legacy_session(session_id)
        return {
            s: [
                TraceRef(trace_id=t, session_id=s, start_time=start)
                for t, start in sorted(traces.items(), key=lambda kv: (kv[1], kv[0]))
            ]
            for s, traces in starts.items()
        }

    def _legacy_session(self, session_id: str) -> dict[str, datetime]:
        what = f"reading session {session_id} (legacy API)"
        try:
            path = f"api/public/sessions/{quote(session_id, safe='')}"
            body = self.http.call(what, lambda: self.http.raw("GET", path))
        except HttpStatus as ex:
            if ex.status == 404:
                return {}
            raise fail(what, ex) from None
        out: dict[str, datetime] = {}
        for trace in body.get("traces") or []:
            try:
                out[trace["id"]] = as_utc(parse_time(trace["timestamp"]))
            except (KeyError, ValueError, AttributeError) as ex:
                raise LangfuseError(f"{what}: a trace does not match the API contract: {ex}") from ex
        return out

    # -- the traces of a window (`triage votes`) ------------------------------------------------

    def root_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        """The root observations started in [start, end): one per trace, with its session."""
        what = "listing the traces of the window"
        condition = [{"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True}]
        try:
            rows = self._v2_rows(
                what,
                filter=json.dumps(condition),
                fromStartTime=iso_z(start),
                toStartTime=iso_z(end),
                fields="core,basic,time",
            )
        except HttpStatus as ex:
            raise fail(what, ex) from None
        self.unreadable.clear()  # a listing only places traces; reading one reports its rows
        if rows is None:
            return self._legacy_traces(start, end)
        refs: dict[str, TraceRef] = {}
        for row in rows:
            if not row.trace_id:
                continue
            held = refs.get(row.trace_id)
            started = as_utc(row.start_time)
            if held is None or (held.start_time is not None and started < held.start_time):
                refs[row.trace_id] = TraceRef(trace_id=row.trace_id, session_id=row.session_id, start_time=started)
        return sorted(refs.values(), key=lambda r: (r.start_time or start, r.trace_id))

    def _legacy_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        """`GET /api/public/traces` (Langfuse v3), page by page: its `timestamp` is the trace's start."""
        refs: dict[str, TraceRef] = {}

        def take(trace: Any, stamp: datetime) -> None:
            refs.setdefault(
                trace["id"], TraceRef(trace_id=trace["id"], session_id=trace.get("sessionId"), start_time=stamp)
            )

        legacy_traces(self.http, "listing traces", start, end, limit=SESSIONS_PER_READ, take=take)
        return sorted(refs.values(), key=lambda r: (r.start_time or start, r.trace_id))


def legacy_traces(
    http: LangfuseHttp,
    doing: str,
    start: datetime,
    end: datetime,
    *,
    limit: int,
    take: Callable[[Any, datetime], None],
) -> None:
    """Page `GET /api/public/traces` (Langfuse v3) over a window, handing `take` each trace and its
    start (`timestamp`); an answer `take` cannot read is off the API contract."""
    page = 1
    while True:
        what = f"{doing} (legacy API, page {page})"
        params = {
            "fromTimestamp": iso_z(start), "toTimestamp": iso_z(end), "page": page, "limit": limit, "fields": "core",
        }  # fmt: skip
        try:
            body = http.call(what, partial(http.raw, "GET", "api/public/traces", params=params))
        except HttpStatus as ex:
            raise fail(what, ex) from None
        try:
            for trace in body["data"]:
                take(trace, as_utc(parse_time(trace["timestamp"])))
            total_pages = int(body["meta"]["totalPages"])
        except (KeyError, TypeError, ValueError, AttributeError) as ex:
            raise LangfuseError(f"{what}: the answer does not match the API contract: {ex!r}") from ex
        if page >= total_pages:
            return
        page += 1
