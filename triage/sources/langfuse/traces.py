"""Reading traces: observations of many traces per request (v2 API), sessions, and the legacy API.

Detected once per run: a server without `/v2/observations` (404) is read through the legacy trace
and session API; one that refuses or ignores a traceId `any of` filter is read one trace at a time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import quote

import pydantic

from triage.domain.conversations import TraceRef
from triage.domain.kernel import as_utc, iso_z, parse_time
from triage.domain.records import Observation, UnreadableTrace
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged
from triage.sources.langfuse.wire import (
    ObservationsPage,
    chunks,
    id_batches,
    legacy_observation,
    newer_observation,
    v2_observation,
)

log = logging.getLogger("triage.sources.langfuse")

OBS_PAGE = 1000  # v2 observations: the documented maximum
SESSIONS_PER_READ = 100
OBS_FIELDS = "core,basic,time,io,metadata"

_PARAMS = {"trace_id": "traceId"}


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
        query = {_PARAMS.get(k, k): v for k, v in params.items() if v is not None}

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
        page = 1
        while True:
            what = f"listing traces (legacy API, page {page})"
            params = {
                "fromTimestamp": iso_z(start),
                "toTimestamp": iso_z(end),
                "page": page,
                "limit": SESSIONS_PER_READ,
                "fields": "core",
            }
            try:
                body = self.http.call(what, partial(self.http.raw, "GET", "api/public/traces", params=params))
            except HttpStatus as ex:
                raise fail(what, ex) from None
            try:
                for trace in body["data"]:
                    stamp = as_utc(parse_time(trace["timestamp"]))
                    refs.setdefault(
                        trace["id"], TraceRef(trace_id=trace["id"], session_id=trace.get("sessionId"), start_time=stamp)
                    )
                total_pages = int(body["meta"]["totalPages"])
            except (KeyError, TypeError, ValueError, AttributeError) as ex:
                raise LangfuseError(f"{what}: the answer does not match the API contract: {ex!r}") from ex
            if page >= total_pages:
                break
            page += 1
        return sorted(refs.values(), key=lambda r: (r.start_time or start, r.trace_id))
