"""A local HTTP stand-in for the parts of Langfuse's public API that triage uses.

Start it from a test or a benchmark::

    with LangfuseStandIn(records=load_jsonl(path)) as server:
        backend = LangfuseBackend(public_key=server.public_key, secret_key=server.secret_key,
                                  base_url=server.url)

It follows ../shared/langfuse/openapi.yml (tests validate the exchanges against it) and models the
behaviour that makes Langfuse tricky (see ../shared/notes/langfuse.md):

- newest-first keyset cursor paging with the documented page limits (v3 scores: max 100, else 400;
  v2 observations: max 1000);
- duplicate observation rows (same id, older `updatedAt`), returned unmerged;
- stale score rows: v3 de-duplicates with LIMIT 1 BY id AFTER the WHERE clause, so a `value` filter
  or a time window can return an outdated row of a changed vote;
- score writes are queued and become readable after `read_delay` seconds; the "worker" then upserts
  by (id, day of timestamp, name) only when id AND timestamp match, else appends a second physical
  row; `drop_score_ids` are dropped silently, as worker-side validation does;
- `POST /api/public/scores` in both contracts: one object -> 200 {id} (the spec file's contract) and
  a JSON list -> 202 {"message": "Accepted"} or 207 (SDK 5.x). `score_contract="single"` is an older
  server: lists are a 400 and the timestamp is ignored (the receive time is stamped);
- score configs (`/api/public/score-configs`: list, create with Langfuse's checks, get one) and
  annotation queues (`/api/public/annotation-queues`: list, create, get one; `.../{id}/items`: list,
  add), page-numbered (`page`, `limit` at most 100, `meta.totalPages`), newest first. A queue's
  name is unique (409); queue items are NOT de-duplicated: the same object POSTed twice makes two
  items (langfuse/langfuse#12938), which is why a client must list the items first;
- `DELETE /api/public/scores/{id}`: 204, every physical row of the id; 404 when there is none;
- 429 with Retry-After (every k-th request, or a requests-per-minute limit), scripted faults
  (status codes, slow responses, dropped connections before or after the request was processed),
  a restart (state kept, listener and open
  connections closed, then reopened on the same port), per-request latency, and a legacy mode where
  `/api/public/v2/observations` answers 404 (a Langfuse v3 server) and traces are read through
  `GET /api/public/traces/{id}` and `GET /api/public/sessions/{id}`;
- `v4=True`, a Langfuse v4 server (Cloud since 2026-11-16): the endpoints v4 removed answer 404
  (dataset run items, a dataset's runs, `/ingestion`, v1 metrics, the legacy trace, observation,
  session and v2 score reads), `POST /api/public/otel/v1/traces` takes OTLP/JSON spans and makes
  those with experiment attributes experiments and experiment items, which `GET
  /api/public/experiments` and `GET /api/public/experiment-items` list (see their block below);
  without it those three answer 404, as a v3 server without experiments;
- a request log (method, path, query, status, bodies) for counting requests and spec checks.

Data loads from the import format of notes/contracts.md (one trace per record).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.doubles.serving import Served, ThreadedServer

MAX_BODY = 1024 * 1024  # Langfuse's body limit for POST /scores
SCORE_FIELD_GROUPS = {"details", "subject", "annotation"}
OBS_FIELD_GROUPS = {
    "core",
    "basic",
    "time",
    "io",
    "metadata",
    "model",
    "usage",
    "prompt",
    "metrics",
    "trace_context",
}
DATA_TYPES = {"NUMERIC", "BOOLEAN", "CATEGORICAL", "TEXT", "CORRECTION"}


# --------------------------------------------------------------------------- helpers


def iso(stamp: datetime) -> str:
    """Langfuse's wire format: UTC, milliseconds, Z."""
    return stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def parse_time(text: str) -> datetime:
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.astimezone(UTC)


def _ms(stamp: datetime) -> datetime:
    return stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)


def _now() -> datetime:
    return _ms(datetime.now(UTC))


def _encode_cursor(key: list[Any], urlsafe: bool) -> str:
    raw = json.dumps(key).encode()
    return (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode().rstrip("=")


def _decode_cursor(text: str, urlsafe: bool) -> list[Any]:
    padded = text + "=" * (-len(text) % 4)
    raw = base64.urlsafe_b64decode(padded) if urlsafe else base64.b64decode(padded)
    key = json.loads(raw)
    if not isinstance(key, list):
        raise ValueError("cursor is not a key")
    return key


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of the import format, one trace per line."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


class HttpProblem(Exception):
    """An error answer: status plus a JSON message body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


# --------------------------------------------------------------------------- log and faults


@dataclass
class LoggedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    status: int  # 0 when the connection was dropped without an answer
    request_body: bytes = b""
    response_body: bytes = b""
    request_headers: dict[str, str] = field(default_factory=dict)
    response_content_type: str = "application/json"


@dataclass
class Fault:
    """A scripted fault for the next `count` matching requests."""

    kind: str  # "status" | "slow" | "drop" | "drop_after" | "429"
    count: int = 1
    path: str | None = None  # substring of the request path
    method: str | None = None
    status: int = 500
    seconds: float = 0.0  # "slow": delay before answering; "429": Retry-After


# --------------------------------------------------------------------------- the stand-in


class LangfuseStandIn(Served):
    """The stand-in server; see the module docstring. All knobs may be changed while it runs."""

    content_type = "application/json"

    def __init__(
        self,
        *,
        records: Iterable[dict[str, Any]] = (),
        public_key: str = "pk-lf-standin",
        secret_key: str = "sk-lf-standin",
        project_id: str = "proj-standin",
        host: str = "127.0.0.1",
        port: int = 0,
        read_delay: float = 0.0,
        latency: float = 0.0,
        legacy: bool = False,
        score_contract: str = "both",
        rate_limit_every: int | None = None,
        rate_limit_per_minute: int | None = None,
        retry_after: float = 1.0,
        filter_any_of: bool = True,
        record_bodies: bool = True,
        metrics_api: Iterable[str] = ("v1", "v2"),
        clock: Callable[[], float] = time.monotonic,
        v4: bool = False,
    ) -> None:
        if score_contract not in {"both", "single"}:
            raise ValueError("score_contract is 'both' (SDK 5.x server) or 'single' (older server)")
        self.public_key = public_key
        self.secret_key = secret_key
        self.project_id = project_id
        self._listener = ThreadedServer(host, port, name="langfuse-standin", queue_size=512)
        self.read_delay = read_delay
        self.latency = latency
        self.legacy = legacy
        self.score_contract = score_contract
        self.rate_limit_every = rate_limit_every
        self.rate_limit_per_minute = rate_limit_per_minute
        #: what `rate_limit_per_minute` is measured on (a virtual clock's, to test pacing in virtual time)
        self.clock = clock
        self.retry_after = retry_after
        self.filter_any_of = filter_any_of
        self.record_bodies = record_bodies
        #: which metrics API the server has: "v2" (`/api/public/v2/metrics`, Cloud and v4), "v1"
        #: (`/api/public/metrics`, v3; gone on v4); the others answer 404
        self.metrics_api = set(metrics_api)
        #: a Langfuse v4 server: experiments and OTLP ingestion, and the removed endpoints a 404
        self.v4 = v4
        #: OTLP spans as stored (one row per (trace id, span id, start): a span sent again with
        #: another start is a second row, as the events table keeps it), and what broke the
        #: experiment attributes' rules (for assertions)
        self._otel_spans: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.otel_problems: list[str] = []
        self.drop_score_ids: set[str] = set()
        #: `GET`/`POST /api/public/score-configs` (ScoreConfig objects, as the API returns them)

        self._lock = threading.RLock()
        self._obs_rows: list[dict[str, Any]] = []
        self._score_rows: list[dict[str, Any]] = []
        self._pending: list[tuple[float, dict[str, Any]]] = []  # (apply at, score event)
        self._seq = 0
        self._request_no = 0
        self._accepted_times: deque[float] = deque()
        self._faults: list[Fault] = []
        self._score_configs: list[dict[str, Any]] = []
        self._queues: list[dict[str, Any]] = []
        self._queue_items: list[dict[str, Any]] = []
        self._restart_at: tuple[int, float] | None = None
        self.log: list[LoggedRequest] = []

        self.load(records)

    # ----------------------------------------------------------------- lifecycle

    @property
    def env(self) -> dict[str, str]:
        """The environment that points triage at this server (a new dict each time: callers add to it)."""
        return {
            "LANGFUSE_PUBLIC_KEY": self.public_key,
            "LANGFUSE_SECRET_KEY": self.secret_key,
            "LANGFUSE_BASE_URL": self.url,
        }


    def restart(self, down_seconds: float = 0.0) -> None:
        """Close the listener and every open connection, stay down a while, reopen on the same port."""
        self.stop()
        if down_seconds:
            time.sleep(down_seconds)
        self.start()

    def schedule_restart(self, at_request: int, down_seconds: float = 0.2) -> None:
        """Restart when the `at_request`-th request (1-based, counted from now) arrives; it is dropped."""
        with self._lock:
            self._restart_at = (self._request_no + at_request, down_seconds)

    # ----------------------------------------------------------------- faults and log

    def inject(
        self,
        kind: str,
        *,
        count: int = 1,
        path: str | None = None,
        method: str | None = None,
        status: int = 500,
        seconds: float = 0.0,
    ) -> None:
        """Script a fault: "status" (answer `status`), "slow" (wait `seconds` first), "drop"
        (close the connection without an answer), "drop_after" (process the request, then close
        the connection without an answer: the write landed, the client cannot know), "429"
        (Retry-After `seconds`)."""
        if kind not in {"status", "slow", "drop", "drop_after", "429"}:
            raise ValueError(kind)
        with self._lock:
            self._faults.append(Fault(kind, count, path, method, status, seconds))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._restart_at = None
            self.rate_limit_every = None
            self.rate_limit_per_minute = None

    def requests(self, path_contains: str | None = None) -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.log if path_contains is None or path_contains in r.path]

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()

    # ----------------------------------------------------------------- data

    def load(self, records: Iterable[dict[str, Any]]) -> None:
        """Add traces in the import format (observations and scores land at once)."""
        for record in records:
            for obs in record.get("observations") or []:
                self.add_observation_row(obs)
            for score in record.get("scores") or []:
                self.add_score_row(score)

    def add_observation_row(
        self, obs: dict[str, Any], *, updated_at: datetime | None = None
    ) -> dict[str, Any]:
        """Store one physical observation row (an ObservationV2 object, camelCase)."""
        row = copy.deepcopy(obs)
        start = parse_time(row["startTime"])
        stamp = updated_at or (parse_time(row["updatedAt"]) if row.get("updatedAt") else start)
        row["_start"] = start
        row["_updated"] = stamp
        row.setdefault("parentObservationId", None)
        row.setdefault("isRootObservation", row["parentObservationId"] is None)
        row.setdefault("createdAt", iso(start))
        with self._lock:
            self._seq += 1
            row["_seq"] = self._seq
            self._obs_rows.append(row)
        return row

    def add_duplicate_observation(self, obs_id: str, age_seconds: float = 60.0, **changes: Any) -> None:
        """A second, OLDER physical row of an existing observation (as unmerged ClickHouse rows)."""
        with self._lock:
            newest = max((r for r in self._obs_rows if r["id"] == obs_id), key=lambda r: r["_updated"])
            row = {k: v for k, v in copy.deepcopy(newest).items() if not k.startswith("_")}
        row.update(changes)
        older = datetime.fromtimestamp(newest["_updated"].timestamp() - age_seconds, UTC)
        row["updatedAt"] = iso(older)
        self.add_observation_row(row, updated_at=older)

    def add_score_row(self, score: dict[str, Any], *, visible: bool = True) -> None:
        """Store one physical score row as if the worker had written it (no upsert).

        A visible row is history: it was written at its `updatedAt` (default: its timestamp) and
        created at its `createdAt` (default: its timestamp), as the embedded store's import has it;
        a row that is not visible yet is a write received now."""
        row = self._score_row(score, received=_now())
        if visible and score.get("timestamp"):
            row["createdAt"] = _ms(parse_time(score["createdAt"])) if score.get("createdAt") else row["timestamp"]
            row["updatedAt"] = _ms(parse_time(score["updatedAt"])) if score.get("updatedAt") else row["timestamp"]
        with self._lock:
            if visible:
                self._seq += 1
                row["_seq"] = self._seq
                self._score_rows.append(row)
            else:
                self._pending.append((time.monotonic() + self.read_delay, row))

    def score_rows(
        self, score_id: str | None = None, *, include_pending: bool = False
    ) -> list[dict[str, Any]]:
        """Physical score rows (all, or of one id), for assertions."""
        with self._lock:
            self._apply_due()
            rows = list(self._score_rows)
            if include_pending:
                rows += [event for _, event in self._pending]
        return [copy.deepcopy(r) for r in rows if score_id is None or r["id"] == score_id]

    def _score_row(self, score: dict[str, Any], received: datetime) -> dict[str, Any]:
        data_type = (score.get("dataType") or "NUMERIC").upper()
        value = score.get("value")
        string_value: str | None = None
        if data_type == "BOOLEAN":
            number = 1.0 if value in (True, 1, 1.0, "true", "True") else 0.0
            string_value = "True" if number else "False"
        elif data_type in {"CATEGORICAL", "TEXT", "CORRECTION"}:
            string_value = str(value)
            number = 0.0
        else:
            number = float(value)  # type: ignore[arg-type]
        metadata = dict(score.get("metadata") or {})
        if score.get("userId") and "userId" not in metadata:
            # Langfuse scores have no user field: the agent records the voter in metadata
            metadata["userId"] = score["userId"]
        stamp = parse_time(score["timestamp"]) if score.get("timestamp") else received
        return {
            "id": score.get("id") or str(uuid.uuid4()),
            "name": score["name"],
            "dataType": data_type,
            "value": number,
            "stringValue": string_value,
            "comment": score.get("comment"),
            "metadata": metadata,
            "traceId": score.get("traceId"),
            "observationId": score.get("observationId"),
            "sessionId": score.get("sessionId"),
            "datasetRunId": score.get("datasetRunId"),
            "environment": score.get("environment") or "default",
            "source": (score.get("source") or "API").upper(),
            "configId": score.get("configId"),
            "queueId": score.get("queueId"),
            "authorUserId": score.get("authorUserId"),
            "timestamp": _ms(stamp),
            "createdAt": received,
            "updatedAt": received,
        }

    def _apply_due(self) -> None:
        """The worker: apply queued score events whose time has come (upsert rule)."""
        now = time.monotonic()
        due = [event for at, event in self._pending if at <= now]
        if not due:
            return
        self._pending = [(at, event) for at, event in self._pending if at > now]
        index = {(r["id"], r["timestamp"], r["name"]): r for r in self._score_rows}
        for event in due:
            if event["id"] in self.drop_score_ids:
                continue  # worker-side validation drops silently
            match = index.get((event["id"], event["timestamp"], event["name"]))
            if match is None:
                index[(event["id"], event["timestamp"], event["name"])] = event
            if match is not None:
                # a true overwrite; id, timestamp, trace, environment and createdAt are frozen
                for key in ("value", "stringValue", "comment", "dataType", "source", "configId", "queueId"):
                    match[key] = event[key]
                match["metadata"] = _deep_merge(match.get("metadata") or {}, event.get("metadata") or {})
                match["updatedAt"] = event["updatedAt"]
            else:
                self._seq += 1
                event["_seq"] = self._seq
                self._score_rows.append(event)

    # ----------------------------------------------------------------- request handling

    def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """Answer one request; None means drop the connection without an answer."""
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        entry = LoggedRequest(
            method, path, query, 0, body if self.record_bodies else b"", request_headers=headers
        )
        with self._lock:
            self._request_no += 1
            number = self._request_no
            self.log.append(entry)
            fault = self._take_fault(method, path)
            restart = self._restart_at is not None and number >= self._restart_at[0]
            if restart:
                down = self._restart_at[1]  # type: ignore[index]
                self._restart_at = None
        if restart:
            threading.Thread(target=self.restart, args=(down,), daemon=True).start()
            return None
        if self.latency:
            time.sleep(self.latency)
        try:
            if fault is not None:
                if fault.kind == "drop":
                    return None
                if fault.kind == "slow":
                    time.sleep(fault.seconds)
                elif fault.kind == "429":
                    raise HttpProblem(429, "Rate limit exceeded", {"Retry-After": _fmt(fault.seconds)})
                elif fault.kind != "drop_after":
                    raise HttpProblem(fault.status, "Injected failure")
            self._check_auth(headers)
            self._check_rate(number)
            status, payload = self._route(method, path, query, body)
            out_headers: dict[str, str] = {}
            if fault is not None and fault.kind == "drop_after":
                entry.status = 0
                return None
        except HttpProblem as problem:
            status, payload, out_headers = problem.status, {"message": problem.message}, problem.headers
        data = b"" if status == 204 else json.dumps(payload).encode()
        entry.status = status
        if self.record_bodies:
            entry.response_body = data
        return status, out_headers, data

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if (fault.path is None or fault.path in path) and (
                fault.method is None or fault.method == method
            ):
                fault.count -= 1
                if fault.count <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _check_auth(self, headers: dict[str, str]) -> None:
        auth = headers.get("authorization", "")
        expected = "Basic " + base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode()
        if auth != expected:
            raise HttpProblem(401, "Invalid credentials. Confirm that you've configured the correct host.")

    def _check_rate(self, number: int) -> None:
        if self.rate_limit_every and number % self.rate_limit_every == 0:
            raise HttpProblem(429, "Rate limit exceeded", {"Retry-After": _fmt(self.retry_after)})
        if self.rate_limit_per_minute:
            now = self.clock()
            with self._lock:
                while self._accepted_times and self._accepted_times[0] <= now - 60:
                    self._accepted_times.popleft()
                if len(self._accepted_times) >= self.rate_limit_per_minute:
                    wait = self._accepted_times[0] + 60 - now
                    raise HttpProblem(
                        429, "Rate limit exceeded", {"Retry-After": str(max(1, math.ceil(wait)))}
                    )
                self._accepted_times.append(now)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, Any]:
        if self.v4 and removed_on_v4(method, path):
            raise HttpProblem(404, "Not Found")
        experiments = self._route_experiments(method, path, query, body)
        if experiments is not None:
            return experiments
        if method == "GET" and path == "/api/public/projects":
            return 200, self._projects()
        if method == "GET" and path == "/api/public/v3/scores":
            return 200, self._scores_v3(query)
        if method == "GET" and path == "/api/public/v2/observations":
            if self.legacy:
                raise HttpProblem(404, "Not Found")
            return 200, self._observations_v2(query)
        if method == "GET" and path.startswith("/api/public/traces/"):
            return 200, self._legacy_trace(path.removeprefix("/api/public/traces/"), query)
        if method == "GET" and path.startswith("/api/public/sessions/"):
            return 200, self._legacy_session(path.removeprefix("/api/public/sessions/"))
        if method == "POST" and path == "/api/public/scores":
            return self._post_scores(body)
        if method == "DELETE" and path.startswith("/api/public/scores/"):
            return self._delete_score(path.removeprefix("/api/public/scores/"))
        if path.startswith(("/api/public/score-configs", "/api/public/annotation-queues")):
            return self._route_review(method, path, query, body)
        if method == "GET" and path in METRICS_PATHS:
            return 200, metrics_answer(self, METRICS_PATHS[path], query)
        # -- datasets and the legacy trace list (triage promote, triage votes): see their block below
        routed = self._route_datasets(method, path, query, body)
        if routed is not None:
            return routed
        raise HttpProblem(404 if method in {"GET", "POST"} else 405, "Not Found")

    # ----------------------------------------------------------------- endpoints

    def _projects(self) -> dict[str, Any]:
        return {
            "data": [
                {
                    "id": self.project_id,
                    "name": "stand-in",
                    "organization": {"id": "org-standin", "name": "stand-in org"},
                    "metadata": {},
                }
            ]
        }

    def _scores_v3(self, query: dict[str, list[str]]) -> dict[str, Any]:
        q = {k: v[-1] for k, v in query.items()}
        limit = _int_param(q, "limit", 50)
        if not 1 <= limit <= 100:
            raise HttpProblem(400, "limit must be between 1 and 100")
        groups = _csv(q.get("fields"))
        unknown = set(groups) - SCORE_FIELD_GROUPS
        if unknown:
            raise HttpProblem(400, f"Unknown field group(s): {', '.join(sorted(unknown))}")
        for rejected in ("userId", "traceTags"):
            if rejected in q:
                raise HttpProblem(400, f"{rejected} is not supported")
        if sum(1 for k in ("traceId", "sessionId", "experimentId") if q.get(k)) > 1:
            raise HttpProblem(400, "traceId, sessionId and experimentId are mutually exclusive")
        if q.get("observationId") and not q.get("traceId"):
            raise HttpProblem(400, "observationId requires traceId")
        data_types = [t.upper() for t in _csv(q.get("dataType"))]
        if set(data_types) - DATA_TYPES:
            raise HttpProblem(400, "unknown dataType")
        values: list[Any] | None = None
        if q.get("value") is not None:
            if len(data_types) != 1 or data_types[0] not in {"NUMERIC", "BOOLEAN", "CATEGORICAL"}:
                raise HttpProblem(400, "value requires exactly one dataType of NUMERIC, BOOLEAN, CATEGORICAL")
            values = [_score_filter_value(data_types[0], v) for v in _csv(q["value"])]
        from_ts = _time_param(q, "fromTimestamp")
        to_ts = _time_param(q, "toTimestamp")
        cursor = None
        if q.get("cursor"):
            try:
                cursor = _decode_cursor(q["cursor"], urlsafe=True)
            except (ValueError, json.JSONDecodeError) as ex:
                raise HttpProblem(400, "invalid cursor") from ex

        # each filter parsed once, not once a row: the benchmark's reruns read 20,000 rows a request
        columns = {
            "id": "id",
            "name": "name",
            "environment": "environment",
            "configId": "configId",
            "queueId": "queueId",
            "authorUserId": "authorUserId",
            "traceId": "traceId",
            "sessionId": "sessionId",
            "observationId": "observationId",
            "experimentId": "datasetRunId",
        }
        wanted = [(column, set(_csv(q[key]))) for key, column in columns.items() if q.get(key)]
        sources = {s.upper() for s in _csv(q["source"])} if q.get("source") else None

        def where(r: dict[str, Any]) -> bool:
            for column, allowed in wanted:
                if r[column] not in allowed:
                    return False
            if sources is not None and r["source"] not in sources:
                return False
            if data_types and r["dataType"] not in data_types:
                return False
            if values is not None and _score_wire_value(r) not in values:
                return False
            if from_ts and r["timestamp"] < from_ts:
                return False
            if to_ts and r["timestamp"] >= to_ts:
                return False
            if cursor is not None and [iso(r["timestamp"]), r["id"]] >= cursor:
                return False
            return True

        with self._lock:
            self._apply_due()
            matched = [r for r in self._score_rows if where(r)]
        # ORDER BY timestamp DESC, id DESC, then LIMIT 1 BY id: de-duplication after the WHERE
        matched.sort(key=lambda r: (r["timestamp"], r["id"], r["updatedAt"], r["_seq"]), reverse=True)
        seen: set[str] = set()
        page: list[dict[str, Any]] = []
        for row in matched:
            if row["id"] in seen:
                continue
            seen.add(row["id"])
            page.append(row)
            if len(page) > limit:
                break
        more = len(page) > limit
        page = page[:limit]
        meta: dict[str, Any] = {"limit": limit}
        if more:
            meta["cursor"] = _encode_cursor([iso(page[-1]["timestamp"]), page[-1]["id"]], urlsafe=True)
        return {"data": [self._score_v3_out(r, groups) for r in page], "meta": meta}

    def _score_v3_out(self, r: dict[str, Any], groups: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": r["id"],
            "projectId": self.project_id,
            "name": r["name"],
            "dataType": r["dataType"],
            "value": _score_wire_value(r),
            "source": r["source"],
            "timestamp": iso(r["timestamp"]),
            "environment": r["environment"],
            "createdAt": iso(r["createdAt"]),
            "updatedAt": iso(r["updatedAt"]),
        }
        if "details" in groups:
            out.update(comment=r["comment"], configId=r["configId"], metadata=r["metadata"])
        if "annotation" in groups:
            out.update(authorUserId=r["authorUserId"], queueId=r["queueId"])
        if "subject" in groups:
            if r["observationId"]:
                out["subject"] = {"kind": "observation", "id": r["observationId"], "traceId": r["traceId"]}
            elif r["traceId"]:
                out["subject"] = {"kind": "trace", "id": r["traceId"]}
            elif r["sessionId"]:
                out["subject"] = {"kind": "session", "id": r["sessionId"]}
            elif r["datasetRunId"]:
                out["subject"] = {"kind": "experiment", "id": r["datasetRunId"]}
        return out

    def _observations_v2(self, query: dict[str, list[str]]) -> dict[str, Any]:
        q = {k: v[-1] for k, v in query.items()}
        limit = _int_param(q, "limit", 50)
        if not 1 <= limit <= 1000:
            raise HttpProblem(400, "limit must be between 1 and 1000")
        if q.get("parseIoAsJson", "false").lower() == "true":
            raise HttpProblem(400, "parseIoAsJson is deprecated; input/output are always raw strings")
        groups = {"core", *(_csv(q.get("fields")) or ["basic"])} & OBS_FIELD_GROUPS  # unknown: ignored
        expand = set(_csv(q.get("expandMetadata")))
        conditions = self._parse_filter(q.get("filter"))
        filtered_columns = {c["column"] for c in conditions}
        simple = {
            "name": "name",
            "userId": "userId",
            "sessionId": "sessionId",
            "type": "type",
            "traceId": "traceId",
            "level": "level",
            "parentObservationId": "parentObservationId",
            "version": "version",
        }
        for param, column in simple.items():
            if param in q and column not in filtered_columns:
                conditions.append(
                    {"type": "string", "column": column, "operator": "=", "value": q[param] or None}
                )
        if "isRootObservation" in q and "isRootObservation" not in filtered_columns:
            flag = q["isRootObservation"].lower() == "true"
            conditions.append(
                {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": flag}
            )
        if query.get("environment") and "environment" not in filtered_columns:
            conditions.append(
                {
                    "type": "stringOptions",
                    "column": "environment",
                    "operator": "any of",
                    "value": query["environment"],
                }
            )
        for param, op in (("fromStartTime", ">="), ("toStartTime", "<")):
            if q.get(param) and "startTime" not in filtered_columns:
                conditions.append(
                    {"type": "datetime", "column": "startTime", "operator": op, "value": q[param]}
                )
        cursor = None
        if q.get("cursor"):
            try:
                cursor = _decode_cursor(q["cursor"], urlsafe=False)
            except (ValueError, json.JSONDecodeError) as ex:
                raise HttpProblem(400, "invalid cursor") from ex

        def key(r: dict[str, Any]) -> list[Any]:
            return [iso(r["_start"]), r.get("traceId") or "", r["id"], r["_seq"]]

        with self._lock:
            rows = [r for r in self._obs_rows if all(_matches(r, c) for c in conditions)]
        rows = [r for r in rows if cursor is None or key(r) < cursor]
        rows.sort(key=key, reverse=True)  # start_time DESC, then trace and span id
        more = len(rows) > limit
        page = rows[:limit]
        meta: dict[str, Any] = {}
        if more:
            meta["cursor"] = _encode_cursor(key(page[-1]), urlsafe=False)
        return {"data": [self._obs_v2_out(r, groups, expand) for r in page], "meta": meta}

    def _parse_filter(self, text: str | None) -> list[dict[str, Any]]:
        if not text:
            return []
        try:
            conditions = json.loads(text)
        except json.JSONDecodeError as ex:
            raise HttpProblem(400, "filter is not valid JSON") from ex
        if not isinstance(conditions, list):
            raise HttpProblem(400, "filter must be a JSON array")
        for c in conditions:
            if not isinstance(c, dict) or not {"type", "column", "operator"} <= c.keys():
                raise HttpProblem(400, "each filter needs type, column and operator")
            if c["column"] not in OBS_COLUMNS:
                raise HttpProblem(400, f"unknown filter column {c['column']!r}")
            ops = FILTER_OPERATORS.get(c["type"])
            if ops is None or c["operator"] not in ops:
                raise HttpProblem(400, f"invalid operator {c['operator']!r} for type {c['type']!r}")
            if c["type"] in {"stringOptions", "categoryOptions", "arrayOptions"}:
                if not isinstance(c.get("value"), list):
                    raise HttpProblem(400, "options filters take a list value")
                if c["column"] == "traceId" and not self.filter_any_of:
                    raise HttpProblem(400, "Invalid filter: traceId is a string column")
        return conditions

    def _obs_v2_out(self, r: dict[str, Any], groups: set[str], expand: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": r["id"],
            "traceId": r.get("traceId"),
            "startTime": iso(r["_start"]),
            "endTime": r.get("endTime"),
            "projectId": self.project_id,
            "parentObservationId": r.get("parentObservationId"),
            "type": r.get("type", "SPAN"),
            # required by the spec's ObservationV2 even without the `model` group (null then)
            "modelId": None,
            "inputPrice": None,
            "outputPrice": None,
            "totalPrice": None,
        }
        if "basic" in groups:
            out.update(
                name=r.get("name"),
                level=r.get("level") or "DEFAULT",
                statusMessage=r.get("statusMessage"),
                version=r.get("version"),
                environment=r.get("environment") or "default",
                bookmarked=False,
                public=False,
                userId=r.get("userId"),
                sessionId=r.get("sessionId"),
                isRootObservation=bool(r.get("isRootObservation")),
            )
        if "time" in groups:
            out.update(completionStartTime=None, createdAt=r.get("createdAt"), updatedAt=iso(r["_updated"]))
        if "io" in groups:
            out.update(input=_raw_string(r.get("input")), output=_raw_string(r.get("output")))
        if "metadata" in groups:
            metadata = r.get("metadata")
            if isinstance(metadata, dict) and "io" not in groups:
                metadata = {
                    k: (v if k in expand or not isinstance(v, str) or len(v) <= 200 else v[:200])
                    for k, v in metadata.items()
                }
            out["metadata"] = metadata
        if "trace_context" in groups:
            out.update(tags=r.get("tags") or [], release=r.get("release"), traceName=r.get("traceName"))
        return out

    def _trace_rows(self, trace_id: str) -> list[dict[str, Any]]:
        """The merged rows of a trace, as the legacy endpoints show them (newest row per id)."""
        with self._lock:
            rows = [r for r in self._obs_rows if r.get("traceId") == trace_id]
        newest: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["id"] not in newest or r["_updated"] > newest[r["id"]]["_updated"]:
                newest[r["id"]] = r
        return sorted(newest.values(), key=lambda r: r["_start"])

    def _legacy_trace_body(self, trace_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        roots = [r for r in rows if r.get("parentObservationId") is None] or rows
        root = roots[0]
        return {
            "id": trace_id,
            "timestamp": iso(root["_start"]),
            "name": root.get("name"),
            "input": _parsed(root.get("input")),
            "output": _parsed(root.get("output")),
            "sessionId": root.get("sessionId"),
            "release": root.get("release"),
            "version": root.get("version"),
            "userId": root.get("userId"),
            "metadata": root.get("metadata"),
            "tags": [],
            "public": False,
            "environment": root.get("environment") or "default",
        }

    def _legacy_trace(self, trace_id: str, query: dict[str, list[str]]) -> dict[str, Any]:
        rows = self._trace_rows(trace_id)
        if not rows:
            raise HttpProblem(404, f"Trace {trace_id} not found within authorized project")
        fields = set(_csv(query.get("fields", [""])[-1])) or {
            "core",
            "io",
            "scores",
            "observations",
            "metrics",
        }
        body = self._legacy_trace_body(trace_id, rows)
        if "io" not in fields:
            body.update(input=None, output=None, metadata=None)
        observations = []
        if "observations" in fields:
            for r in rows:
                observations.append(
                    {
                        "id": r["id"],
                        "traceId": trace_id,
                        "type": r.get("type", "SPAN"),
                        "name": r.get("name"),
                        "startTime": iso(r["_start"]),
                        "endTime": r.get("endTime"),
                        "completionStartTime": None,
                        "model": None,
                        "modelParameters": None,
                        "input": _parsed(r.get("input")),  # the legacy API returns parsed JSON
                        "version": r.get("version"),
                        "metadata": r.get("metadata"),
                        "output": _parsed(r.get("output")),
                        "usage": {"input": 0, "output": 0, "total": 0, "unit": None},
                        "level": r.get("level") or "DEFAULT",
                        "statusMessage": r.get("statusMessage"),
                        "parentObservationId": r.get("parentObservationId"),
                        "promptId": None,
                        "usageDetails": {},
                        "costDetails": {},
                        "environment": r.get("environment") or "default",
                        "promptName": None,
                        "promptVersion": None,
                        "modelId": None,
                        "inputPrice": None,
                        "outputPrice": None,
                        "totalPrice": None,
                        "calculatedInputCost": None,
                        "calculatedOutputCost": None,
                        "calculatedTotalCost": None,
                        "latency": None,
                        "timeToFirstToken": None,
                    }
                )
        scores = []
        if "scores" in fields:
            with self._lock:
                self._apply_due()
                trace_scores = [s for s in self._score_rows if s["traceId"] == trace_id]
            for s in trace_scores:
                if s["dataType"] == "CORRECTION":
                    continue
                v1: dict[str, Any] = {
                    "id": s["id"],
                    "traceId": trace_id,
                    "name": s["name"],
                    "source": s["source"],
                    "observationId": s["observationId"],
                    "timestamp": iso(s["timestamp"]),
                    "createdAt": iso(s["createdAt"]),
                    "updatedAt": iso(s["updatedAt"]),
                    "authorUserId": s["authorUserId"],
                    "comment": s["comment"],
                    "metadata": s["metadata"],
                    "configId": s["configId"],
                    "queueId": s["queueId"],
                    "environment": s["environment"],
                    "dataType": s["dataType"],
                }
                if s["dataType"] != "TEXT":
                    v1["value"] = s["value"]
                if s["dataType"] != "NUMERIC":
                    v1["stringValue"] = s["stringValue"]
                scores.append(v1)
        body.update(
            htmlPath=f"/project/{self.project_id}/traces/{trace_id}",
            latency=None,
            totalCost=None,
            observations=observations,
            scores=scores,
        )
        return body

    def _legacy_session(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            trace_ids = {
                r["traceId"] for r in self._obs_rows if r.get("sessionId") == session_id and r.get("traceId")
            }
        traces = [self._legacy_trace_body(t, self._trace_rows(t)) for t in sorted(trace_ids)]
        if not traces:
            raise HttpProblem(404, f"Session {session_id} not found")
        return {
            "id": session_id,
            "createdAt": min(t["timestamp"] for t in traces),
            "projectId": self.project_id,
            "environment": traces[0]["environment"],
            "traces": traces,
        }

    def _post_scores(self, body: bytes) -> tuple[int, Any]:
        if len(body) > MAX_BODY:
            raise HttpProblem(413, "Request body larger than 1 MiB")
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as ex:
            raise HttpProblem(400, "Invalid JSON body") from ex
        received = _now()
        if isinstance(payload, list):
            if self.score_contract == "single":
                raise HttpProblem(400, "Invalid request data: expected object, received array")
            accepted, errors = [], []
            for item in payload:
                problem = _score_problem(item)
                if problem:
                    errors.append({"message": problem})
                else:
                    accepted.append(self._score_row(item, received))
            self._enqueue(accepted)
            if errors:
                return 207, {"accepted": len(accepted), "rejected": len(errors), "errors": errors}
            return 202, {"message": "Accepted"}
        problem = _score_problem(payload)
        if problem:
            raise HttpProblem(400, f"Invalid request data: {problem}")
        if self.score_contract == "single":
            # the older contract has no timestamp: the server stamps the receive time
            payload = {k: v for k, v in payload.items() if k != "timestamp"}
        row = self._score_row(payload, received)
        self._enqueue([row])
        return 200, {"id": row["id"]}

    def _delete_score(self, score_id: str) -> tuple[int, Any]:
        """`DELETE /api/public/scores/{id}`: every physical row of the id (pending ones too); 204."""
        with self._lock:
            self._apply_due()
            before = len(self._score_rows) + len(self._pending)
            self._score_rows = [r for r in self._score_rows if r["id"] != score_id]
            self._pending = [(at, e) for at, e in self._pending if e["id"] != score_id]
            if before == len(self._score_rows) + len(self._pending):
                raise HttpProblem(404, f"Score {score_id} not found")
        return 204, None

    def _enqueue(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            at = time.monotonic() + self.read_delay
            self._pending.extend((at, row) for row in rows)
            self._apply_due()

    # ----------------------------------------------------------------- score configs, annotation queues

    def score_configs(self) -> list[dict[str, Any]]:
        """Every score config, oldest first, as the API shows them."""
        with self._lock:
            return [self._config_out(c) for c in self._score_configs]

    def add_score_config(self, body: dict[str, Any], *, archived: bool = False) -> dict[str, Any]:
        """Store a score config as if someone had made it (no checks), for tests."""
        with self._lock:
            config = self._new_config(body)
            config["isArchived"] = archived
            self._score_configs.append(config)
            return self._config_out(config)

    def annotation_queues(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._queue_out(q) for q in self._queues]

    def queue_items(self, queue_id: str | None = None) -> list[dict[str, Any]]:
        """Every queue item (of one queue), oldest first."""
        with self._lock:
            return [
                self._item_out(i) for i in self._queue_items if queue_id is None or i["queueId"] == queue_id
            ]

    def _route_review(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:
        q = {k: v[-1] for k, v in query.items()}
        if path == "/api/public/score-configs":
            if method == "GET":
                with self._lock:
                    return 200, _paged(q, [self._config_out(c) for c in reversed(self._score_configs)])
            if method == "POST":
                return 200, self._create_config(_json_object(body))
        if method == "GET" and (match := re.fullmatch(r"/api/public/score-configs/([^/]+)", path)):
            with self._lock:
                config = next((c for c in self._score_configs if c["id"] == match.group(1)), None)
            if config is None:
                raise HttpProblem(404, "Score config not found")
            return 200, self._config_out(config)
        if path == "/api/public/annotation-queues":
            if method == "GET":
                with self._lock:
                    return 200, _paged(q, [self._queue_out(x) for x in reversed(self._queues)])
            if method == "POST":
                return 200, self._create_queue(_json_object(body))
        match = re.fullmatch(r"/api/public/annotation-queues/([^/]+)(/items)?", path)
        if match is not None:
            with self._lock:
                queue = next((x for x in self._queues if x["id"] == match.group(1)), None)
            if queue is None:
                raise HttpProblem(404, "Annotation queue not found")
            if not match.group(2) and method == "GET":
                return 200, self._queue_out(queue)
            if match.group(2) and method == "GET":
                status = q.get("status")
                if status is not None and status not in {"PENDING", "COMPLETED"}:
                    raise HttpProblem(400, "status must be PENDING or COMPLETED")
                with self._lock:
                    items = [
                        self._item_out(i)
                        for i in reversed(self._queue_items)
                        if i["queueId"] == queue["id"] and (status is None or i["status"] == status)
                    ]
                return 200, _paged(q, items)
            if match.group(2) and method == "POST":
                return 200, self._create_item(queue["id"], _json_object(body))
        raise HttpProblem(404 if method in {"GET", "POST"} else 405, "Not Found")

    def _new_config(self, body: dict[str, Any]) -> dict[str, Any]:
        now = iso(_now())
        categories = body.get("categories")
        if body.get("dataType") == "BOOLEAN":
            # Langfuse makes a boolean config's categories itself
            categories = [{"label": "True", "value": 1}, {"label": "False", "value": 0}]
        self._seq += 1
        return {
            "id": str(uuid.uuid4()),
            "name": body.get("name"),
            "createdAt": now,
            "updatedAt": now,
            "projectId": self.project_id,
            "dataType": body.get("dataType"),
            "isArchived": False,
            "minValue": body.get("minValue"),
            "maxValue": body.get("maxValue"),
            "categories": categories,
            "description": body.get("description"),
        }

    def _create_config(self, body: dict[str, Any]) -> dict[str, Any]:
        problem = _config_problem(body)
        if problem:
            raise HttpProblem(400, f"Invalid request data: {problem}")
        with self._lock:
            config = self._new_config(body)
            self._score_configs.append(config)  # names are not unique: a second POST makes a second config
            return self._config_out(config)

    def _config_out(self, config: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(config)

    def _create_queue(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"name", "description", "scoreConfigIds"}
        if unknown:
            raise HttpProblem(400, f"Invalid request data: unrecognized keys {sorted(unknown)}")
        name, ids = body.get("name"), body.get("scoreConfigIds")
        if not isinstance(name, str) or not name:
            raise HttpProblem(400, "Invalid request data: name is required")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise HttpProblem(400, "Invalid request data: scoreConfigIds must hold at least one id")
        if body.get("description") is not None and not isinstance(body["description"], str):
            raise HttpProblem(400, "Invalid request data: description must be a string")
        with self._lock:
            if any(x["name"] == name for x in self._queues):
                raise HttpProblem(409, "A queue with this name already exists.")
            known = {c["id"] for c in self._score_configs}
            if any(i not in known for i in ids):
                raise HttpProblem(
                    400, "At least one of the score config IDs cannot be found for the given project."
                )
            now = iso(_now())
            queue = {
                "id": str(uuid.uuid4()),
                "name": name,
                "description": body.get("description"),
                "scoreConfigIds": list(ids),
                "createdAt": now,
                "updatedAt": now,
            }
            self._queues.append(queue)
            return self._queue_out(queue)

    def _queue_out(self, queue: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(queue)

    def _create_item(self, queue_id: str, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"objectId", "objectType", "status"}
        if unknown:
            raise HttpProblem(400, f"Invalid request data: unrecognized keys {sorted(unknown)}")
        if not isinstance(body.get("objectId"), str):
            raise HttpProblem(400, "Invalid request data: objectId is required")
        if body.get("objectType") not in {"TRACE", "OBSERVATION", "SESSION"}:
            raise HttpProblem(400, "Invalid request data: objectType must be TRACE, OBSERVATION or SESSION")
        status = body.get("status") or "PENDING"
        if status not in {"PENDING", "COMPLETED"}:
            raise HttpProblem(400, "Invalid request data: status must be PENDING or COMPLETED")
        now = iso(_now())
        item = {
            "id": str(uuid.uuid4()),
            "queueId": queue_id,
            "objectId": body["objectId"],
            "objectType": body["objectType"],
            "status": status,
            "completedAt": now if status == "COMPLETED" else None,
            "createdAt": now,
            "updatedAt": now,
        }
        with self._lock:
            self._queue_items.append(item)  # no de-duplication, as in Langfuse
        return self._item_out(item)

    def _item_out(self, item: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(item)


    # ----------------------------------------------------------------- datasets (triage promote)
    #
    # As the server does (web/src/pages/api/public/dataset-items, v2/datasets): a dataset upserts on
    # its name; a dataset item upserts on its id, which is unique in the PROJECT: an id held by
    # another dataset is a 404 naming it, a missing dataset a 404 "Dataset not found"; fields sent
    # as null are left as they are (`?? undefined`), a new item is ACTIVE; every write is a new
    # item version (`dataset_item_versions`). Listing pages by number (from 1, limit <= 100),
    # newest item first. Also the legacy trace list (`GET /api/public/traces`, Langfuse v3).

    def _dataset_state(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(datasets by name, items by id), made on first use (kept out of __init__ for merging)."""
        with self._lock:
            if "_datasets" not in self.__dict__:
                self._datasets: dict[str, dict[str, Any]] = {}
                self._dataset_items: dict[str, dict[str, Any]] = {}
                self.dataset_item_versions: dict[str, int] = {}
            return self._datasets, self._dataset_items

    def dataset_items_of(self, name: str) -> list[dict[str, Any]]:
        """The items of one dataset (copies), for assertions."""
        _, items = self._dataset_state()
        with self._lock:
            return [copy.deepcopy(i) for i in items.values() if i["datasetName"] == name]

    def _route_datasets(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any] | None:
        routed = self._route_dataset_runs(method, path, query, body)
        if routed is not None:
            return routed
        if method == "GET" and path.startswith("/api/public/v2/datasets/"):
            return 200, self._get_dataset(path.removeprefix("/api/public/v2/datasets/"))
        if method == "POST" and path == "/api/public/v2/datasets":
            return 200, self._post_dataset(_json_body(body))
        if method == "GET" and path == "/api/public/dataset-items":
            return 200, self._list_dataset_items(query)
        if method == "POST" and path == "/api/public/dataset-items":
            if len(body) > 4_500_000:
                raise HttpProblem(413, "Request body larger than 4.5 MB")
            return 200, self._post_dataset_item(_json_body(body))
        if method == "GET" and path.startswith("/api/public/dataset-items/"):
            _, items = self._dataset_state()
            with self._lock:
                item = items.get(path.removeprefix("/api/public/dataset-items/"))
                if item is None:
                    raise HttpProblem(404, "Dataset item not found")
                return 200, self._dataset_item_body(item)
        if method == "GET" and path == "/api/public/traces":
            return 200, self._legacy_trace_list(query)
        return None

    def _dataset_body(self, dataset: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": dataset["id"],
            "name": dataset["name"],
            "description": dataset["description"],
            "metadata": dataset["metadata"],
            "inputSchema": None,
            "expectedOutputSchema": None,
            "projectId": self.project_id,
            "createdAt": iso(dataset["createdAt"]),
            "updatedAt": iso(dataset["updatedAt"]),
        }

    def _get_dataset(self, name: str) -> dict[str, Any]:
        datasets, _ = self._dataset_state()
        with self._lock:
            if name not in datasets:
                raise HttpProblem(404, "Dataset not found")
            return self._dataset_body(datasets[name])

    def _post_dataset(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
            raise HttpProblem(400, "Invalid request data: name is required")
        datasets, _ = self._dataset_state()
        now = _now()
        with self._lock:
            held = datasets.get(payload["name"])
            if held is None:
                held = datasets[payload["name"]] = {
                    "id": str(uuid.uuid4()),
                    "name": payload["name"],
                    "description": None,
                    "metadata": None,
                    "createdAt": now,
                }
            for key in ("description", "metadata"):
                if payload.get(key) is not None:
                    held[key] = payload[key]
            held["updatedAt"] = now
            return self._dataset_body(held)

    def _dataset_item_body(self, item: dict[str, Any]) -> dict[str, Any]:
        return {
            **{k: item[k] for k in ("id", "status", "input", "expectedOutput", "metadata", "datasetId", "datasetName")},
            "sourceTraceId": item["sourceTraceId"],
            "sourceObservationId": item["sourceObservationId"],
            "createdAt": iso(item["createdAt"]),
            "updatedAt": iso(item["updatedAt"]),
            "mediaReferences": [],
        }

    def _post_dataset_item(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("datasetName"), str):
            raise HttpProblem(400, "Invalid request data: datasetName is required")
        item_id = payload.get("id")
        if item_id is not None and (not isinstance(item_id, str) or len(item_id) > 255):
            raise HttpProblem(400, "Invalid request data: id must be a string of at most 255 characters")
        if payload.get("status") not in (None, "ACTIVE", "ARCHIVED"):
            raise HttpProblem(400, "Invalid request data: status is ACTIVE or ARCHIVED")
        datasets, items = self._dataset_state()
        now = _now()
        with self._lock:
            dataset = datasets.get(payload["datasetName"])
            if dataset is None:
                raise HttpProblem(404, "Dataset not found")
            item_id = item_id or str(uuid.uuid4())
            held = items.get(item_id)
            if held is not None and held["datasetId"] != dataset["id"]:
                raise HttpProblem(
                    404, f"The dataset item with id {item_id} already exists in a dataset other than {dataset['name']}"
                )
            if held is None:
                held = items[item_id] = {
                    "id": item_id,
                    "status": "ACTIVE",
                    "input": None,
                    "expectedOutput": None,
                    "metadata": None,
                    "sourceTraceId": None,
                    "sourceObservationId": None,
                    "datasetId": dataset["id"],
                    "datasetName": dataset["name"],
                    "createdAt": now,
                }
            for key in ("input", "expectedOutput", "metadata", "sourceTraceId", "sourceObservationId", "status"):
                if payload.get(key) is not None:
                    held[key] = copy.deepcopy(payload[key])
            held["updatedAt"] = now
            self.dataset_item_versions[item_id] = self.dataset_item_versions.get(item_id, 0) + 1
            return self._dataset_item_body(held)

    def _list_dataset_items(self, query: dict[str, list[str]]) -> dict[str, Any]:
        q = {k: v[-1] for k, v in query.items()}
        page = _int_param(q, "page", 1)
        limit = _int_param(q, "limit", 50)
        if page < 1 or not 0 <= limit <= 100:
            raise HttpProblem(400, "page must be > 0 and limit <= 100")
        datasets, items = self._dataset_state()
        with self._lock:
            dataset_id = None
            if q.get("datasetName"):
                if q["datasetName"] not in datasets:
                    raise HttpProblem(404, "Dataset not found")
                dataset_id = datasets[q["datasetName"]]["id"]
            matched = [
                i
                for i in items.values()
                if (dataset_id is None or i["datasetId"] == dataset_id)
                and (not q.get("sourceTraceId") or i["sourceTraceId"] == q["sourceTraceId"])
                and (not q.get("sourceObservationId") or i["sourceObservationId"] == q["sourceObservationId"])
            ]
            matched.sort(key=lambda i: (i["createdAt"], i["id"]), reverse=True)
            chunk = matched[(page - 1) * limit : page * limit] if limit else []
            data = [self._dataset_item_body(i) for i in chunk]
        total = len(matched)
        pages = math.ceil(total / limit) if limit else 0
        return {"data": data, "meta": {"page": page, "limit": limit, "totalItems": total, "totalPages": pages}}

    # ----------------------------------------------------------------- dataset runs (triage check)
    #
    # As the server does (web/src/pages/api/public/dataset-run-items.ts, datasets/[name]/runs): a run
    # item names an ACTIVE dataset item (else 404 "Dataset item not found") and a trace (traceId, or
    # an observation's; else 404); its run is found by (dataset, name) or created with the body's
    # description, metadata and createdAt (an existing run is left as it is). Every POST makes a NEW
    # run item with a new id: the server takes no id from the client, so posting the same case
    # twice makes two items (which is why a client reads a run's items first). Runs list newest
    # first, page-numbered; a run's items list by `datasetId` and `runName` (404 for no such run).

    def _run_state(self) -> tuple[dict[tuple[str, str], dict[str, Any]], list[dict[str, Any]]]:
        """(runs by (dataset id, name), run items), made on first use."""
        with self._lock:
            if "_runs" not in self.__dict__:
                self._runs: dict[tuple[str, str], dict[str, Any]] = {}
                self._run_items: list[dict[str, Any]] = []
            return self._runs, self._run_items

    def run_items_of(self, dataset_name: str, run_name: str) -> list[dict[str, Any]]:
        """The items of one run (copies), for assertions."""
        datasets, _ = self._dataset_state()
        runs, items = self._run_state()
        with self._lock:
            dataset = datasets.get(dataset_name)
            run = runs.get((dataset["id"], run_name)) if dataset else None
            return [copy.deepcopy(i) for i in items if run is not None and i["datasetRunId"] == run["id"]]

    def _route_dataset_runs(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any] | None:
        if method == "POST" and path == "/api/public/dataset-run-items":
            return 200, self._post_run_item(_json_body(body))
        if method == "GET" and path == "/api/public/dataset-run-items":
            return 200, self._list_run_items(query)
        match = re.fullmatch(r"/api/public/datasets/([^/]+)/runs(?:/([^/]+))?", path)
        if method == "GET" and match:
            if match.group(2) is None:
                return 200, self._list_runs(match.group(1), query)
            return 200, self._get_run(match.group(1), match.group(2))
        return None

    def _run_body(self, run: dict[str, Any], dataset: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": run["id"],
            "name": run["name"],
            "description": run["description"],
            "metadata": run["metadata"],
            "datasetId": dataset["id"],
            "datasetName": dataset["name"],
            "createdAt": iso(run["createdAt"]),
            "updatedAt": iso(run["updatedAt"]),
        }

    def _run_item_body(self, item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "createdAt": iso(item["createdAt"]), "updatedAt": iso(item["updatedAt"])}

    def _post_run_item(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise HttpProblem(400, "Invalid request data: expected object")
        for key in ("runName", "datasetItemId"):
            if not isinstance(payload.get(key), str) or not payload[key]:
                raise HttpProblem(400, f"Invalid request data: {key} is required")
        for key in ("runDescription", "traceId", "observationId", "createdAt"):
            if payload.get(key) is not None and not isinstance(payload[key], str):
                raise HttpProblem(400, f"Invalid request data: {key} must be a string")
        created = now = _now()
        if payload.get("createdAt"):
            try:
                created = _ms(parse_time(payload["createdAt"]))
            except ValueError:
                raise HttpProblem(400, "Invalid request data: createdAt is not a date-time") from None
        datasets, items = self._dataset_state()
        runs, run_items = self._run_state()
        with self._lock:
            item = items.get(payload["datasetItemId"])
            if item is None or item["status"] != "ACTIVE":
                raise HttpProblem(404, "Dataset item not found")
            trace_id = payload.get("traceId")
            if not trace_id and payload.get("observationId"):
                found = [r for r in self._obs_rows if r["id"] == payload["observationId"]]
                if not found:
                    raise HttpProblem(404, "Observation not found")
                trace_id = found[0]["traceId"]
            if not trace_id:
                raise HttpProblem(404, "Trace not found")
            dataset = next(d for d in datasets.values() if d["id"] == item["datasetId"])
            run = runs.get((dataset["id"], payload["runName"]))
            if run is None:
                run = runs[(dataset["id"], payload["runName"])] = {
                    "id": str(uuid.uuid4()),
                    "name": payload["runName"],
                    "description": payload.get("runDescription"),
                    "metadata": payload.get("metadata"),
                    "createdAt": created,
                    "updatedAt": now,
                }
            stored = {
                "id": str(uuid.uuid4()),  # the server's own id, every time
                "datasetRunId": run["id"],
                "datasetRunName": run["name"],
                "datasetItemId": item["id"],
                "traceId": trace_id,
                "observationId": payload.get("observationId"),
                "createdAt": created,
                "updatedAt": created,
            }
            run_items.append(stored)
            return self._run_item_body(stored)

    def _list_run_items(self, query: dict[str, list[str]]) -> dict[str, Any]:
        q = {k: v[-1] for k, v in query.items()}
        if not q.get("datasetId") or not q.get("runName"):
            raise HttpProblem(400, "Invalid request data: datasetId and runName are required")
        runs, run_items = self._run_state()
        with self._lock:
            run = runs.get((q["datasetId"], q["runName"]))
            if run is None:
                raise HttpProblem(404, "Dataset run not found for the given project and dataset id")
            rows = [self._run_item_body(i) for i in run_items if i["datasetRunId"] == run["id"]]
        rows.sort(key=lambda r: (r["createdAt"], r["id"]), reverse=True)
        return _paged(q, rows)

    def _dataset_named(self, name: str) -> dict[str, Any]:
        datasets, _ = self._dataset_state()
        with self._lock:
            dataset = datasets.get(name)
        if dataset is None:
            raise HttpProblem(404, "Dataset not found")
        return dataset

    def _list_runs(self, name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        dataset = self._dataset_named(name)
        runs, _ = self._run_state()
        with self._lock:
            rows = [self._run_body(r, dataset) for (did, _), r in runs.items() if did == dataset["id"]]
        rows.sort(key=lambda r: (r["createdAt"], r["id"]), reverse=True)
        return _paged({k: v[-1] for k, v in query.items()}, rows)

    def _get_run(self, name: str, run_name: str) -> dict[str, Any]:
        dataset = self._dataset_named(name)
        runs, run_items = self._run_state()
        with self._lock:
            run = runs.get((dataset["id"], run_name))
            if run is None:
                raise HttpProblem(404, "Dataset run not found")
            items = [self._run_item_body(i) for i in run_items if i["datasetRunId"] == run["id"]]
        return {**self._run_body(run, dataset), "datasetRunItems": items}

    def _legacy_trace_list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        q = {k: v[-1] for k, v in query.items()}
        page = _int_param(q, "page", 1)
        limit = _int_param(q, "limit", 50)
        if page < 1 or not 1 <= limit <= 100:
            raise HttpProblem(400, "page must be > 0 and limit between 1 and 100")
        from_ts, to_ts = _time_param(q, "fromTimestamp"), _time_param(q, "toTimestamp")
        with self._lock:
            trace_ids = sorted({r["traceId"] for r in self._obs_rows if r.get("traceId")})
        bodies = []
        for trace_id in trace_ids:
            body = self._legacy_trace_body(trace_id, self._trace_rows(trace_id))
            stamp = parse_time(body["timestamp"])
            if (from_ts and stamp < from_ts) or (to_ts and stamp >= to_ts):
                continue
            if q.get("sessionId") and body["sessionId"] != q["sessionId"]:
                continue
            body.update(htmlPath=f"/project/{self.project_id}/traces/{trace_id}", latency=None, totalCost=None)
            bodies.append(body)
        bodies.sort(key=lambda b: (b["timestamp"], b["id"]), reverse=True)
        total = len(bodies)
        return {
            "data": bodies[(page - 1) * limit : page * limit],
            "meta": {"page": page, "limit": limit, "totalItems": total, "totalPages": math.ceil(total / limit)},
        }

    # ----------------------------------------------------------------- experiments (Langfuse v4)
    #
    # `POST /api/public/otel/v1/traces` (OTLP/JSON; the OpenAPI file's request body): every span is
    # kept, keyed by (trace id, span id, start); a span carrying `langfuse.experiment.id` whose id is
    # its `langfuse.experiment.item.root_observation_id` is an experiment item, and the experiment is
    # what its spans say (name, description, metadata, dataset). Every span of a trace that holds
    # experiment spans must carry the five attributes the notes name (else `otel_problems` says
    # which). `GET /api/public/experiments` lists experiments by latest activity (their items' end),
    # `GET /api/public/experiment-items` items by start, newest first, both with a versioned base64url
    # cursor, `fromStartTime` required, `limit` at most 100; an item's scores are those on its trace.

    def otel_spans(self) -> list[dict[str, Any]]:
        """The stored spans (copies), for assertions."""
        with self._lock:
            return [copy.deepcopy(s) for s in self._otel_spans.values()]

    def _route_experiments(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any] | None:
        if path not in {"/api/public/otel/v1/traces", "/api/public/experiments", "/api/public/experiment-items"}:
            return None
        if not self.v4:
            raise HttpProblem(404, "Not Found")
        if method == "POST" and path == "/api/public/otel/v1/traces":
            if len(body) > 5_000_000:
                raise HttpProblem(413, "Request body larger than 5 MB")
            self._post_otel(_json_body(body))
            return 200, {}
        if method == "GET" and path == "/api/public/experiments":
            return 200, self._list_experiments({k: v[-1] for k, v in query.items()})
        if method == "GET" and path == "/api/public/experiment-items":
            return 200, self._list_experiment_items({k: v[-1] for k, v in query.items()})
        raise HttpProblem(405, "Method not allowed")

    def _post_otel(self, payload: Any) -> None:
        if not isinstance(payload, dict) or not isinstance(payload.get("resourceSpans"), list):
            raise HttpProblem(400, "Invalid request: resourceSpans is required")
        spans: list[dict[str, Any]] = []
        for resource in payload["resourceSpans"]:
            for scope in (resource or {}).get("scopeSpans") or []:
                for span in (scope or {}).get("spans") or []:
                    spans.append(_otel_span(span))
        with self._lock:
            for span in spans:
                self._otel_spans[(span["traceId"], span["spanId"], span["startNanos"])] = span
            traces = {s["traceId"] for s in spans if EXPERIMENT_KEYS[0] in s["attributes"]}
            for span in spans:
                missing = [k for k in EXPERIMENT_KEYS if k not in span["attributes"]]
                if span["traceId"] in traces and missing:
                    self.otel_problems.append(f"span {span['spanId']} lacks {', '.join(missing)}")

    def _experiment_items(self, q: dict[str, str]) -> list[dict[str, Any]]:
        """The item spans in [fromStartTime, toStartTime), newest first (under the lock)."""
        start = _time_param(q, "fromStartTime")
        if start is None:
            raise HttpProblem(400, "fromStartTime is required")
        end = _time_param(q, "toStartTime")
        items = [
            s
            for s in self._otel_spans.values()
            if s["attributes"].get(EXPERIMENT_KEYS[0])
            and s["attributes"].get("langfuse.experiment.item.root_observation_id") == s["spanId"]
            and s["start"] >= start
            and (end is None or s["start"] < end)
        ]
        items.sort(key=lambda s: (s["start"], s["spanId"]), reverse=True)
        return items

    def _list_experiments(self, q: dict[str, str]) -> dict[str, Any]:
        groups = _field_groups(q, {"core", "metadata", "scores"}, {"core"})
        limit = _int_param(q, "limit", 50)
        if not 1 <= limit <= 100:
            raise HttpProblem(400, "limit must be between 1 and 100")
        with self._lock:
            items = self._experiment_items(q)
            by_id: dict[str, list[dict[str, Any]]] = {}
            for span in items:
                by_id.setdefault(span["attributes"][EXPERIMENT_KEYS[0]], []).append(span)
            rows = []
            for exp_id, spans in by_id.items():
                first = max(spans, key=lambda s: s["end"])  # the newest says what the experiment is
                attrs = first["attributes"]
                row: dict[str, Any] = {
                    "id": exp_id,
                    "name": attrs.get("langfuse.experiment.name", ""),
                    "description": attrs.get("langfuse.experiment.description"),
                    "startTime": iso(min(s["start"] for s in spans)),
                    "endTime": iso(max(s["end"] for s in spans)),
                    "itemCount": len(spans),
                    "datasetId": attrs.get("langfuse.experiment.dataset.id"),
                }
                if "metadata" in groups:
                    row["metadata"] = _json_attr(attrs.get("langfuse.experiment.metadata"), {})
                if "scores" in groups:
                    row["scores"] = []  # experiment-level scores: triage writes none
                rows.append(row)
        rows = [
            r
            for r in rows
            if (not q.get("id") or r["id"] in _csv(q["id"]))
            and (not q.get("name") or r["name"] in _csv(q["name"]))
            and (not q.get("datasetId") or r["datasetId"] in _csv(q["datasetId"]))
        ]
        rows.sort(key=lambda r: (r["endTime"], r["id"]), reverse=True)
        return _cursor_page(q, rows, limit)

    def _list_experiment_items(self, q: dict[str, str]) -> dict[str, Any]:
        allowed = {"core", "dataset", "io", "metadata", "itemMetadata", "experimentMetadata", "scores"}
        groups = _field_groups(q, allowed, {"core", "dataset"})
        limit = _int_param(q, "limit", 50)
        if not 1 <= limit <= 100:
            raise HttpProblem(400, "limit must be between 1 and 100")
        score_limit = _int_param(q, "scoreLimit", 50)
        if not 1 <= score_limit <= 50:
            raise HttpProblem(400, "scoreLimit must be between 1 and 50")
        with self._lock:
            self._apply_due()
            spans = self._experiment_items(q)
            rows = []
            for span in spans:
                attrs = span["attributes"]
                if q.get("experimentId") and attrs[EXPERIMENT_KEYS[0]] not in _csv(q["experimentId"]):
                    continue
                if q.get("experimentName") and attrs.get("langfuse.experiment.name") not in _csv(q["experimentName"]):
                    continue
                if q.get("experimentItemId") and attrs.get("langfuse.experiment.item.id") not in _csv(
                    q["experimentItemId"]
                ):
                    continue
                if q.get("datasetId") and attrs.get("langfuse.experiment.dataset.id") not in _csv(q["datasetId"]):
                    continue
                rows.append(self._experiment_item_body(span, groups, score_limit))
        return _cursor_page(q, rows, limit)

    def _experiment_item_body(self, span: dict[str, Any], groups: set[str], score_limit: int) -> dict[str, Any]:
        attrs = span["attributes"]
        level = attrs.get("langfuse.observation.level")
        row: dict[str, Any] = {
            "id": span["spanId"],
            "traceId": span["traceId"],
            "startTime": iso(span["start"]),
            "endTime": iso(span["end"]),
            "level": level if level in {"DEBUG", "DEFAULT", "WARNING", "ERROR"} else "DEFAULT",
            "environment": attrs.get("langfuse.environment") or "default",
            "experimentId": attrs[EXPERIMENT_KEYS[0]],
            "experimentName": attrs.get("langfuse.experiment.name", ""),
            "experimentItemId": attrs.get("langfuse.experiment.item.id", ""),
        }
        if "dataset" in groups:
            row["experimentDatasetId"] = attrs.get("langfuse.experiment.dataset.id")
            row["experimentItemVersion"] = attrs.get("langfuse.experiment.item.version")
        if "io" in groups:
            row["input"] = _json_attr(attrs.get("langfuse.observation.input"), None)
            row["output"] = _json_attr(attrs.get("langfuse.observation.output"), None)
            row["expectedOutput"] = _json_attr(attrs.get("langfuse.experiment.item.expected_output"), None)
        if "metadata" in groups:
            prefix = "langfuse.observation.metadata."
            row["metadata"] = {k[len(prefix) :]: v for k, v in attrs.items() if k.startswith(prefix)}
        if "itemMetadata" in groups:
            row["experimentItemMetadata"] = _json_attr(attrs.get("langfuse.experiment.item.metadata"), None)
        if "experimentMetadata" in groups:
            row["experimentMetadata"] = _json_attr(attrs.get("langfuse.experiment.metadata"), None)
            row["experimentDescription"] = attrs.get("langfuse.experiment.description")
        if "scores" in groups:
            # the current row of each score on the item's trace (core fields: no `details` group here)
            newest: dict[str, dict[str, Any]] = {}
            for r in self._score_rows:
                held = newest.get(r["id"])
                if r["traceId"] == span["traceId"] and (
                    held is None or (r["updatedAt"], r["_seq"]) > (held["updatedAt"], held["_seq"])
                ):
                    newest[r["id"]] = r
            row["scores"] = [self._score_v3_out(r, []) for r in list(newest.values())[:score_limit]]
        return row


# --------------------------------------------------------------------------- filter evaluation


# --------------------------------------------------------------------------- experiments (Langfuse v4)

#: the attributes every span of an experiment item's trace carries (../shared/notes/langfuse.md)
EXPERIMENT_KEYS = (
    "langfuse.experiment.id",
    "langfuse.experiment.name",
    "langfuse.experiment.dataset.id",
    "langfuse.experiment.item.id",
    "langfuse.experiment.item.root_observation_id",
)
#: what Langfuse v4 removed (Cloud on 2026-11-16): a 404 there (../shared/notes/langfuse.md)
REMOVED_ON_V4 = (
    (("GET", "POST"), re.compile(r"/api/public/dataset-run-items")),
    (("GET", "DELETE"), re.compile(r"/api/public/datasets/[^/]+/runs(/[^/]+)?")),
    (("POST",), re.compile(r"/api/public/ingestion")),
    (("GET",), re.compile(r"/api/public/metrics")),
    (("GET",), re.compile(r"/api/public/traces(/[^/]+)?")),
    (("GET",), re.compile(r"/api/public/observations(/[^/]+)?")),
    (("GET",), re.compile(r"/api/public/v2/scores")),
    (("GET",), re.compile(r"/api/public/sessions(/[^/]+)?")),
)
HEX = re.compile(r"[0-9a-f]+")


def removed_on_v4(method: str, path: str) -> bool:
    return any(method in methods and pattern.fullmatch(path) for methods, pattern in REMOVED_ON_V4)


def _otel_nanos(value: Any, what: str) -> int:
    # OTLP/JSON: a decimal string (uint64); numbers are taken too
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise HttpProblem(400, f"Invalid span: {what} is not a time in nanoseconds")
    return int(value)


def _otel_value(value: Any) -> Any:
    if not isinstance(value, dict) or len(value) != 1:
        raise HttpProblem(400, "Invalid span: an attribute value holds one of stringValue, intValue, ...")
    (kind, inner), = value.items()
    if kind not in {"stringValue", "intValue", "doubleValue", "boolValue"}:
        raise HttpProblem(400, f"Invalid span: attribute value kind {kind} is not modelled")
    return int(inner) if kind == "intValue" else inner


def _otel_span(span: Any) -> dict[str, Any]:
    """One OTLP/JSON span as stored; a 400 for what the OTLP/JSON encoding does not allow."""
    if not isinstance(span, dict):
        raise HttpProblem(400, "Invalid span: not an object")
    for key, length in (("traceId", 32), ("spanId", 16)):
        value = span.get(key)
        if not isinstance(value, str) or len(value) != length or not HEX.fullmatch(value) or not value.strip("0"):
            raise HttpProblem(400, f"Invalid span: {key} is not {length} lowercase hex digits")
    start = _otel_nanos(span.get("startTimeUnixNano"), "startTimeUnixNano")
    end = _otel_nanos(span.get("endTimeUnixNano"), "endTimeUnixNano")
    attributes: dict[str, Any] = {}
    for pair in span.get("attributes") or []:
        if not isinstance(pair, dict) or not isinstance(pair.get("key"), str):
            raise HttpProblem(400, "Invalid span: an attribute has no key")
        attributes[pair["key"]] = _otel_value(pair.get("value"))

    def stamp(nanos: int) -> datetime:
        seconds, rest = divmod(nanos, 1_000_000_000)
        return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=rest // 1000)

    return {
        "traceId": span["traceId"],
        "spanId": span["spanId"],
        "parentSpanId": span.get("parentSpanId"),
        "name": span.get("name"),
        "startNanos": start,
        "start": _ms(stamp(start)),
        "end": _ms(stamp(max(start, end))),
        "attributes": attributes,
    }


def _json_attr(value: Any, default: Any) -> Any:
    """An attribute holding JSON (input, output, metadata), parsed; kept as text where it is none."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _field_groups(q: dict[str, str], allowed: set[str], default: set[str]) -> set[str]:
    groups = set(_csv(q.get("fields"))) or default
    unknown = groups - allowed
    if unknown:
        raise HttpProblem(400, f"Invalid fields: {', '.join(sorted(unknown))}")
    return groups


def _cursor_page(q: dict[str, str], rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of `rows` after the versioned base64url cursor; the next page's cursor when there is one."""
    offset = 0
    if q.get("cursor"):
        try:
            version, offset = _decode_cursor(q["cursor"], urlsafe=True)
            if version != "v1" or not isinstance(offset, int) or offset < 0:
                raise ValueError("not a cursor")
        except ValueError:
            raise HttpProblem(400, "Invalid cursor") from None
    page = rows[offset : offset + limit]
    meta: dict[str, Any] = {}
    if offset + limit < len(rows):
        meta["cursor"] = _encode_cursor(["v1", offset + limit], urlsafe=True)
    return {"data": page, "meta": meta}


CONFIG_NAME = re.compile(r"^[A-Za-z0-9_ .()\-]{1,35}$")


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"null")
    except json.JSONDecodeError as ex:
        raise HttpProblem(400, "Invalid JSON body") from ex
    if not isinstance(payload, dict):
        raise HttpProblem(400, "Invalid request data: expected object")
    return payload


def _paged(q: dict[str, str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A page-numbered listing as Langfuse's public API pages it (`publicApiPaginationZod`)."""
    page = _int_param(q, "page", 1)
    limit = _int_param(q, "limit", 50)
    if page < 1:
        raise HttpProblem(400, "page must be greater than 0")
    if not 1 <= limit <= 100:
        raise HttpProblem(400, "limit must be at most 100")
    total = len(rows)
    return {
        "data": rows[(page - 1) * limit : page * limit],
        "meta": {"page": page, "limit": limit, "totalItems": total, "totalPages": math.ceil(total / limit)},
    }


def _config_problem(body: dict[str, Any]) -> str | None:
    """Langfuse's checks of a new score config (`PostScoreConfigBody`)."""
    name = body.get("name")
    if not isinstance(name, str) or not CONFIG_NAME.match(name):
        return "name must be 1-35 letters, numbers, underscores, spaces, periods, parentheses or hyphens"
    data_type = body.get("dataType")
    if data_type not in {"NUMERIC", "BOOLEAN", "CATEGORICAL", "TEXT"}:
        return "dataType must be NUMERIC, BOOLEAN, CATEGORICAL or TEXT"
    if body.get("description") is not None and not isinstance(body["description"], str):
        return "description must be a string"
    categories = body.get("categories")
    bounds = [body.get("minValue"), body.get("maxValue")]
    if data_type == "NUMERIC":
        if categories is not None:
            return "numeric configs take no categories"
        low, high = bounds
        if any(b is not None and (isinstance(b, bool) or not isinstance(b, int | float)) for b in bounds):
            return "minValue and maxValue must be numbers"
        if low is not None and high is not None and high <= low:
            return "Maximum value must be greater than Minimum value"
        return None
    if any(b is not None for b in bounds):
        return f"{data_type.lower()} configs take no minValue or maxValue"
    if data_type in {"BOOLEAN", "TEXT"}:
        # absent, not even null: "Categories are autogenerated for boolean configs and cannot be passed"
        return f"{data_type.lower()} configs take no categories" if "categories" in body else None
    if not isinstance(categories, list) or not categories:
        return "categorical configs need at least one category"
    for c in categories:
        if not isinstance(c, dict) or not isinstance(c.get("label"), str) or not c["label"]:
            return "each category needs a label"
        if isinstance(c.get("value"), bool) or not isinstance(c.get("value"), int | float):
            return "each category needs a numeric value"
    labels = [c["label"] for c in categories]
    values = [c["value"] for c in categories]
    if len(set(labels)) < len(labels) or len(set(values)) < len(values):
        return "category labels and values must be unique"
    return None


OBS_COLUMNS = {
    "id",
    "type",
    "name",
    "traceId",
    "startTime",
    "endTime",
    "environment",
    "level",
    "statusMessage",
    "version",
    "userId",
    "sessionId",
    "isRootObservation",
    "parentObservationId",
    "traceName",
    "metadata",
}
FILTER_OPERATORS: dict[str, set[str]] = {
    "string": {"=", "contains", "does not contain", "starts with", "ends with"},
    "stringOptions": {"any of", "none of"},
    "categoryOptions": {"any of", "none of"},
    "arrayOptions": {"any of", "none of", "all of"},
    "datetime": {">", "<", ">=", "<="},
    "boolean": {"=", "<>"},
    "null": {"is null", "is not null"},
    "stringObject": {"=", "contains", "does not contain", "starts with", "ends with"},
}


def _column(r: dict[str, Any], column: str, key: str | None) -> Any:
    if column == "startTime":
        return r["_start"]
    if column == "endTime":
        return parse_time(r["endTime"]) if r.get("endTime") else None
    if column == "isRootObservation":
        return bool(r.get("isRootObservation"))
    if column == "metadata":
        metadata = r.get("metadata") or {}
        return metadata.get(key) if isinstance(metadata, dict) and key else None
    return r.get(column)


def _matches(r: dict[str, Any], c: dict[str, Any]) -> bool:
    actual = _column(r, c["column"], c.get("key"))
    kind, op, value = c["type"], c["operator"], c.get("value")
    if kind in {"stringOptions", "categoryOptions", "arrayOptions"}:
        hit = actual in value
        return hit if op == "any of" else not hit if op == "none of" else all(v == actual for v in value)
    if kind == "boolean":
        return (actual == bool(value)) if op == "=" else (actual != bool(value))
    if kind == "null":
        return (actual is None) if op == "is null" else (actual is not None)
    if kind == "datetime":
        if actual is None:
            return False
        bound = parse_time(value)
        return {">": actual > bound, "<": actual < bound, ">=": actual >= bound, "<=": actual <= bound}[op]
    text = "" if actual is None else str(actual)
    if op == "=":
        return actual == value if value is None else text == str(value)
    return {
        "contains": str(value) in text,
        "does not contain": str(value) not in text,
        "starts with": text.startswith(str(value)),
        "ends with": text.endswith(str(value)),
    }[op]


# --------------------------------------------------------------------------- small helpers


def _fmt(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


def _csv(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _int_param(q: dict[str, str], name: str, default: int) -> int:
    if q.get(name) in (None, ""):
        return default
    try:
        return int(q[name])
    except ValueError as ex:
        raise HttpProblem(400, f"{name} must be an integer") from ex


def _time_param(q: dict[str, str], name: str) -> datetime | None:
    if not q.get(name):
        return None
    try:
        return parse_time(q[name])
    except ValueError as ex:
        raise HttpProblem(400, f"{name} is not an ISO 8601 date-time") from ex


def _score_wire_value(r: dict[str, Any]) -> Any:
    if r["dataType"] == "BOOLEAN":
        return bool(r["value"])
    if r["dataType"] == "NUMERIC":
        return r["value"]
    return r["stringValue"]


def _score_filter_value(data_type: str, text: str) -> Any:
    if data_type == "BOOLEAN":
        if text not in {"true", "false"}:
            raise HttpProblem(400, "BOOLEAN values must be true or false")
        return text == "true"
    if data_type == "NUMERIC":
        try:
            number = float(text)
        except ValueError as ex:
            raise HttpProblem(400, "NUMERIC values must be numbers") from ex
        if not math.isfinite(number):
            raise HttpProblem(400, "NUMERIC values must be finite")
        return number
    return text


def _score_problem(score: Any) -> str | None:
    """The API-side validation of one CreateScoreRequest (the worker's is `drop_score_ids`)."""
    if not isinstance(score, dict):
        return "score must be an object"
    if not isinstance(score.get("name"), str) or not score["name"]:
        return "name is required"
    if "value" not in score:
        return "value is required"
    subjects = [k for k in ("traceId", "sessionId", "datasetRunId") if score.get(k)]
    if len(subjects) != 1:
        return "Provide exactly one of traceId, sessionId or datasetRunId"
    data_type = score.get("dataType") or "NUMERIC"
    if data_type not in DATA_TYPES:
        return f"invalid dataType {data_type}"
    value = score["value"]
    if data_type in {"CATEGORICAL", "TEXT", "CORRECTION"} and not isinstance(value, str):
        return f"{data_type} scores take a string value"
    if data_type in {"NUMERIC", "BOOLEAN"} and (
        isinstance(value, bool) or not isinstance(value, int | float)
    ):
        return f"{data_type} scores take a numeric value"
    if data_type == "BOOLEAN" and value not in (0, 1):
        return "BOOLEAN values must be 0 or 1"
    if data_type == "TEXT" and not 1 <= len(value) <= 500:
        return "TEXT values are 1-500 characters"
    if (score.get("source") or "API") not in {"API", "ANNOTATION"}:
        return "source must be API or ANNOTATION"
    if score.get("timestamp") is not None:
        try:
            parse_time(str(score["timestamp"]))
        except ValueError:
            return "timestamp is not an ISO 8601 date-time"
    return None


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except json.JSONDecodeError as ex:
        raise HttpProblem(400, "Invalid JSON body") from ex


def _raw_string(value: Any) -> str | None:
    """input/output as the v2 API sends them: JSON-encoded strings."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def _parsed(value: Any) -> Any:
    """input/output as the legacy API sends them: parsed JSON where it parses."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


# --------------------------------------------------------------------------- the metrics API
# `GET /api/public/v2/metrics` and `GET /api/public/metrics` (v1), as far as triage uses them: the
# query object is checked as the spec's description of the `query` parameter and the server's query
# builder check it (a bad query is a 400 naming why); the `count` measure of root observations (v2
# `observations` view) or traces (v1 `traces` view) is computed, grouped by the dimensions asked and
# the time bucket, each row keyed as the server keys it (dimension names, `time_dimension`,
# `<aggregation>_<measure>`, counts as text as ClickHouse's UInt64 arrive); without an `orderBy`, the
# buckets with no row are filled with a zero row (ClickHouse's WITH FILL). Other views and measures
# are a 400 ("not modelled"), so a test cannot rely on them by accident.

METRICS_PATHS = {"/api/public/v2/metrics": "v2", "/api/public/metrics": "v1"}
METRICS_VIEWS = {
    "v1": {"traces", "observations", "scores-numeric", "scores-categorical"},
    "v2": {"observations", "scores-numeric", "scores-boolean", "scores-categorical"},
}
#: the dimensions of the views the stand-in computes (the spec's lists)
METRICS_DIMENSIONS = {
    ("v1", "traces"): {
        "id", "name", "tags", "userId", "sessionId", "release", "version", "environment", "observationName",
        "scoreName",
    },
    ("v2", "observations"): {
        "environment", "type", "name", "level", "version", "tags", "release", "traceName", "traceRelease",
        "traceVersion", "providedModelName", "promptName", "promptVersion", "isRootObservation",
        "startTimeMonth",
    },
}
#: v2 refuses grouping by these (filter on them instead)
HIGH_CARDINALITY = {"id", "traceId", "userId", "sessionId", "parentObservationId"}
METRICS_AGGREGATIONS = {"sum", "avg", "count", "max", "min", "p50", "p75", "p90", "p95", "p99", "histogram"}
GRANULARITIES = {"auto", "minute", "hour", "day", "week", "month"}
METRICS_FILTER_TYPES = {*FILTER_OPERATORS, "number", "numberObject"}


def _bad(message: str) -> HttpProblem:
    return HttpProblem(400, f"Invalid query: {message}")


def _granularity(chosen: str, start: datetime, end: datetime) -> str:
    if chosen != "auto":
        return chosen
    hours = (end - start).total_seconds() / 3600  # Langfuse's rule: about 50 buckets
    for limit, name in ((2, "minute"), (72, "hour"), (1440, "day"), (8760, "week")):
        if hours < limit:
            return name
    return "month"


def _bucket(stamp: datetime, granularity: str) -> datetime:
    stamp = stamp.astimezone(UTC)
    if granularity == "minute":
        return stamp.replace(second=0, microsecond=0)
    if granularity == "hour":
        return stamp.replace(minute=0, second=0, microsecond=0)
    day = stamp.replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1) if granularity == "month" else day


def _next_bucket(stamp: datetime, granularity: str) -> datetime:
    if granularity == "month":
        return (stamp.replace(day=28) + timedelta(days=4)).replace(day=1)
    step = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1),
            "week": timedelta(weeks=1)}[granularity]  # fmt: skip
    return stamp + step


def _bucket_text(stamp: datetime, granularity: str) -> str:
    """As ClickHouse writes them: a DateTime for minutes and hours, a Date for the rest."""
    return stamp.strftime("%Y-%m-%d %H:%M:%S" if granularity in {"minute", "hour"} else "%Y-%m-%d")


def check_metrics_query(version: str, text: str | None) -> dict[str, Any]:
    """The query object, checked; `HttpProblem(400)` naming the first problem."""
    if not text:
        raise _bad("the query parameter is required")
    try:
        q = json.loads(text)
    except json.JSONDecodeError as ex:
        raise _bad("query is not valid JSON") from ex
    if not isinstance(q, dict):
        raise _bad("query must be a JSON object")
    known = {"view", "dimensions", "metrics", "filters", "timeDimension", "fromTimestamp", "toTimestamp",
             "orderBy", "config"}  # fmt: skip
    if unknown := sorted(set(q) - known):
        raise _bad(f"unknown keys {unknown}")
    if q.get("view") not in METRICS_VIEWS[version]:
        raise _bad(f"view must be one of {sorted(METRICS_VIEWS[version])}")
    metrics = q.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        raise _bad("at least one metric must be provided")
    for metric in metrics:
        if not isinstance(metric, dict) or not isinstance(metric.get("measure"), str):
            raise _bad("a metric needs a measure")
        if metric.get("aggregation") not in METRICS_AGGREGATIONS:
            raise _bad(f"invalid aggregation {metric.get('aggregation')!r}")
    dims = q.get("dimensions", [])
    if not isinstance(dims, list) or not all(isinstance(d, dict) and isinstance(d.get("field"), str) for d in dims):
        raise _bad("dimensions must be a list of {field}")
    for dim in dims:
        if version == "v2" and dim["field"] in HIGH_CARDINALITY:
            raise _bad(f"high cardinality dimension {dim['field']!r} cannot be grouped by; filter on it instead")
    filters = q.get("filters", [])
    if not isinstance(filters, list):
        raise _bad("filters must be a list")
    for f in filters:
        if not isinstance(f, dict) or not {"column", "operator", "type"} <= f.keys() or "value" not in f:
            raise _bad("a filter needs column, operator, value and type")
        if f["type"] not in METRICS_FILTER_TYPES:
            raise _bad(f"invalid filter type {f['type']!r}")
        if f["type"] in FILTER_OPERATORS and f["operator"] not in FILTER_OPERATORS[f["type"]]:
            raise _bad(f"invalid operator {f['operator']!r} for type {f['type']!r}")
        if f["type"] in {"stringObject", "numberObject"} and not f.get("key"):
            raise _bad(f"{f['type']} filters need a key")
    time_dim = q.get("timeDimension")
    if time_dim is not None and (not isinstance(time_dim, dict) or time_dim.get("granularity") not in GRANULARITIES):
        raise _bad(f"granularity must be one of {sorted(GRANULARITIES)}")
    try:
        start, end = parse_time(q["fromTimestamp"]), parse_time(q["toTimestamp"])
    except (KeyError, TypeError, ValueError) as ex:
        raise _bad("fromTimestamp and toTimestamp are required ISO datetimes") from ex
    if end <= start:
        raise _bad("toTimestamp must be after fromTimestamp")
    config = q.get("config") or {}
    limit = config.get("row_limit", 100) if isinstance(config, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
        raise _bad("config.row_limit is between 1 and 1000")
    return q


def metrics_answer(standin: LangfuseStandIn, version: str, query: dict[str, list[str]]) -> dict[str, Any]:
    if version not in standin.metrics_api:
        raise HttpProblem(404, "Not Found")
    q = check_metrics_query(version, (query.get("query") or [""])[-1])
    view = q["view"]
    dimensions = METRICS_DIMENSIONS.get((version, view))
    if dimensions is None or [(m["measure"], m["aggregation"]) for m in q["metrics"]] != [("count", "count")]:
        raise _bad(f"the stand-in models only the count of the {'observations' if version == 'v2' else 'traces'} view")
    fields = [d["field"] for d in q.get("dimensions", [])]
    if unknown := [f for f in fields if f not in dimensions]:
        raise _bad(f"Invalid dimension {unknown[0]}. Must be one of {sorted(dimensions)}")
    for f in q.get("filters", []):
        if f["column"] not in dimensions | {"startTime", "timestamp", "traceId", "userId", "sessionId", "id"}:
            raise _bad(f"Invalid filter column {f['column']}")
    start, end = parse_time(q["fromTimestamp"]), parse_time(q["toTimestamp"])
    with standin._lock:
        rows = list(standin._obs_rows)
    newest: dict[str, dict[str, Any]] = {}  # the merged row of each observation, as the view sees it
    for r in rows:
        if r["id"] not in newest or r["_updated"] > newest[r["id"]]["_updated"]:
            newest[r["id"]] = r
    subjects = [r for r in newest.values() if start <= r["_start"] <= end]  # the builder's bounds: >= and <=
    if view == "traces":  # a trace is its root observation
        subjects = [r for r in subjects if r.get("parentObservationId") is None]

    aliases = {"traceRelease": "release", "traceVersion": "version", "id": "traceId" if view == "traces" else "id"}

    def value(r: dict[str, Any], name: str) -> Any:
        name = aliases.get(name, name)
        return bool(r.get("isRootObservation")) if name == "isRootObservation" else r.get(name)

    for f in q.get("filters", []):
        condition = {**f, "column": "startTime" if f["column"] in {"timestamp", "startTime"} else f["column"]}
        subjects = [r for r in subjects if _matches({**r, f["column"]: value(r, f["column"])}, condition)]
    time_dim = q.get("timeDimension")
    granularity = _granularity(time_dim["granularity"], start, end) if time_dim else None
    groups: dict[tuple[Any, ...], int] = {}
    for r in subjects:
        key = tuple(value(r, f) or "" for f in fields)  # ClickHouse's strings are never null
        if granularity:
            key += (_bucket(r["_start"], granularity),)
        groups[key] = groups.get(key, 0) + 1
    if granularity and not q.get("orderBy"):  # WITH FILL: every bucket of the range has a row
        seen = {key[-1] for key in groups}
        bucket = _bucket(start, granularity)
        while bucket <= end:
            if bucket not in seen:
                groups[(*("" for _ in fields), bucket)] = 0
            bucket = _next_bucket(bucket, granularity)
    out = []
    for key, count in sorted(groups.items(), key=lambda kv: (kv[0][-1] if granularity else 0, str(kv[0]))):
        row: dict[str, Any] = dict(zip(fields, key, strict=False))
        if granularity:
            row["time_dimension"] = _bucket_text(key[-1], granularity)
        row["count_count"] = str(count)
        out.append(row)
    limit = (q.get("config") or {}).get("row_limit", 100)
    return {"data": out[:limit]}


def standin_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of an import-format file, lazily (for big benchmark files)."""
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


__all__ = [
    "Fault",
    "HttpProblem",
    "LangfuseStandIn",
    "LoggedRequest",
    "iso",
    "load_jsonl",
    "parse_time",
    "standin_records",
]
