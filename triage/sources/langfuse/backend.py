"""The Langfuse source: votes and traces in, triage scores out (see ../shared/notes/langfuse.md).

Calls are plain JSON requests on an injected httpx client, in the shapes of the `langfuse` SDK
5.x's REST client (score POSTs as a list, or one object each for servers that speak the older
contract; v3 score reads, v2 observation reads, the legacy trace and session reads). The SDK
itself is not imported: see `http`. The parts: `http` (plumbing, retries, UI links), `reads` (scores
and traces), `writes` (both write contracts and the read-back), `wire` (shapes, mapping),
`annotations` (score configs and annotation queues for `triage queue`), `metrics` (the release
watch's reads: answers per release by the metrics API, where traces belong).

Datasets: regression cases as Langfuse dataset items (`triage promote`).

- `GET /api/public/v2/datasets/{name}`, and `POST /api/public/v2/datasets` when it answers 404 (the
  POST upserts on the name: sent only for a missing dataset, so a maintainer's description stays).
- `GET /api/public/dataset-items?datasetName=` in pages of 100 (the server's maximum), page numbers
  from 1: what is there, to write only what is new or changed.
- `POST /api/public/dataset-items` per item, with its id: an upsert on the id, which is unique in the
  project (an id held by another dataset is a 404 naming it: that item fails, the others go on). The
  status is never sent, so an item a maintainer archived stays archived. Writes are synchronous (the
  answer is the stored item), so no read-back is needed; every write makes a new item version.

Plain HTTP through the shared client and its retries (a retried POST is safe: it upserts by id).

Dataset runs: `triage check`'s results as Langfuse experiment runs (`DatasetRuns`). On a Langfuse v4
server (detected once: `experiments.server_generation`) they are experiments, written as OTLP spans
(`experiments`); the dataset-run endpoints below, removed by v4, are used on a v3 server only.

- `GET /api/public/datasets/{name}/runs` in pages of 100: the dataset's runs (the previous one is
  the newest `triage check` made, by its metadata's `created_by`).
- `GET /api/public/dataset-run-items?datasetId=&runName=` in pages of 100: a run's items, each a
  dataset item linked to a trace (a 404: no such run yet).
- Each result is a CATEGORICAL `triage_check` score (the outcome; the checks and their evidence in
  its metadata) on the run item's trace, written through the one score path (read back), with an id
  derived from the dataset, the run, the item and the trace, and the run's creation time as its
  timestamp: written again, it is overwritten, never doubled.
- Then `POST /api/public/dataset-run-items` (`runName`, `datasetItemId`, `traceId`, the run's
  metadata and `createdAt`) for each case whose score landed. Langfuse gives every POST a new id
  (it takes none from the client, and has no conditional create and no delete of one run item), so
  the POST itself cannot be made idempotent: what is deterministic is the rest (the placeholder
  trace ids and the score ids, so a case written twice lands on one score), and a case the run
  already holds is never posted again: the run's items are read before each batch (`triage check`
  writes as its cases finish) and again just before its POSTs. Two runs of one name at once can
  then double an item only when both finish the same case within that last read and POST; the
  runner starts each run at a random place in its cases to keep that rare, and a reader takes the
  newest item of a case. A case whose score did not land is not added either, so a rerun under the
  same run name does it again.
- A case the run holds with an undecided result (an outage), judged again by a rerun: its score is
  rewritten on the trace its run item links (the same id), no item is added. A decided result is
  final: a held pass or fail is never overwritten, whoever writes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote

import httpx

from triage.domain.checks import CHECK_SCORE, CheckRun, RunItemResult, check_score_id
from triage.domain.config import LangfuseLimits
from triage.domain.kernel import iso_ms, parse_time
from triage.domain.ports import SourceStats
from triage.domain.records import Observation, StoredScore, UnreadableTrace, WriteOutcome
from triage.domain.release_counts import ReleaseAnswers, TracePlace
from triage.domain.scores import ScoreBody
from triage.domain.votes import TraceRef, WindowVotes
from triage.domain.worklist import DatasetItem, DatasetWriteOutcome
from triage.errors import ConfigError, LangfuseError
from triage.retry import Budget, Clock, RetryPolicy
from triage.sources.langfuse.annotations import LangfuseAnnotations
from triage.sources.langfuse.experiments import ExperimentRuns
from triage.sources.langfuse.http import (
    LANGFUSE_RETRY,
    LINKS_RETRY,
    HttpStatus,
    LangfuseHttp,
    TraceLinks,
    fail,
)
from triage.sources.langfuse.metrics import LangfuseReleases
from triage.sources.langfuse.reads import VOTE_LOOKBACK, ScoreReads, TraceReads
from triage.sources.langfuse.writes import ScoreWrites

log = logging.getLogger("triage.sources.langfuse")

#: Langfuse requests a night makes per 100 traces once its votes are read (the observations, the
#: scores written and read back, the release watch): measured on the stand-in, 84 for 1,200 traces
PLAN_REQUESTS_PER_100 = 7
ITEMS_PAGE = 100  # GET /dataset-items: `limit` above 100 is a 400
RUNS_PAGE = 100  # GET /datasets/{name}/runs, GET /dataset-run-items: the same pagination


def _message(ex: HttpStatus) -> str:
    body = ex.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return f"HTTP {ex.status}: {body['message'][:300]}"
    return ex.detail()


def _post_one(
    http: LangfuseHttp,
    outcome: DatasetWriteOutcome,
    key: str,
    what: str,
    path: str,
    body: dict[str, Any],
    *,
    echoed: str,
    wrong: str,
) -> None:
    """POST one record, counted in `outcome` under `key`: written when the answer echoes `key` in
    its field `echoed` (the writes are synchronous: that is the proof), else failed with why not."""
    try:
        stored = http.call(what, partial(http.raw, "POST", path, json_body=body))
    except HttpStatus as ex:
        outcome.failed[key] = _message(ex)
    except LangfuseError as ex:
        outcome.failed[key] = str(ex)
    else:
        if isinstance(stored, dict) and stored.get(echoed) == key:
            outcome.written.append(key)
        else:
            outcome.failed[key] = wrong


def wire_item(item: DatasetItem) -> dict[str, Any]:
    """The `CreateDatasetItemRequest` body of one item (no status: see the module docstring)."""
    body = item.wire()
    del body["status"]
    if item.source_observation_id is None:
        del body["sourceObservationId"]
    return body


def read_item(raw: Any, dataset_name: str) -> DatasetItem:
    """One `DatasetItem` of the API. Raises LangfuseError when it is not one."""
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise LangfuseError("a dataset item does not match the API contract: no id")
    metadata = raw.get("metadata")
    status = raw.get("status")
    return DatasetItem(
        id=raw["id"],
        dataset_name=str(raw.get("datasetName") or dataset_name),
        input=raw.get("input"),
        expected_output=raw.get("expectedOutput"),
        # not ours if it is not an object: compared unequal, so triage's item replaces it
        metadata=metadata if isinstance(metadata, dict) else {},
        source_trace_id=raw.get("sourceTraceId"),
        source_observation_id=raw.get("sourceObservationId"),
        status="ARCHIVED" if status == "ARCHIVED" else "ACTIVE",
    )


class DatasetWrites:
    def __init__(self, http: LangfuseHttp) -> None:
        self.http = http

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        path = f"api/public/v2/datasets/{quote(name, safe='')}"
        what = f"reading dataset {name}"
        try:
            self.http.call(what, lambda: self.http.raw("GET", path))
            return False
        except HttpStatus as ex:
            if ex.status != 404:
                raise fail(what, ex) from None
        what = f"creating dataset {name}"
        body = {"name": name, "description": description, "metadata": metadata}
        try:
            created = self.http.call(what, lambda: self.http.raw("POST", "api/public/v2/datasets", json_body=body))
        except HttpStatus as ex:
            raise fail(what, ex) from None
        if not isinstance(created, dict) or created.get("name") != name:
            raise LangfuseError(f"{what}: the answer is not the dataset")
        log.info("dataset %s created", name, extra={"event": "dataset_created"})
        return True

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        found: dict[str, DatasetItem] = {}
        page = 1
        while True:
            what = f"reading the items of dataset {name} (page {page})"
            params = {"datasetName": name, "page": page, "limit": ITEMS_PAGE}
            try:
                body = self.http.call(what, partial(self.http.raw, "GET", "api/public/dataset-items", params=params))
            except HttpStatus as ex:
                if ex.status == 404:
                    return {}  # "Dataset not found": nothing there yet
                raise fail(what, ex) from None
            try:
                rows, total_pages = body["data"], int(body["meta"]["totalPages"])
            except (KeyError, TypeError, ValueError) as ex:
                raise LangfuseError(f"{what}: the answer does not match the API contract: {ex!r}") from ex
            for raw in rows:
                item = read_item(raw, name)
                found[item.id] = item
            if page >= total_pages or not rows:
                return found
            page += 1

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        for item in items:
            # 404: the dataset is gone, or the id is held by another dataset; 400: refused
            _post_one(
                self.http, outcome, item.id, f"writing dataset item {item.id}", "api/public/dataset-items",
                wire_item(item), echoed="id", wrong="the answer is not the item written",
            )  # fmt: skip
        return outcome


def check_score(run: CheckRun, result: RunItemResult) -> ScoreBody:
    """The `triage_check` score of one result, on its run item's trace."""
    comment = "; ".join(
        f"{c.name}: {'pass' if c.passed else 'fail' if c.passed is False else 'undecided'}" for c in result.checks
    )
    return ScoreBody(
        id=check_score_id(run.dataset, run.name, result.item_id, result.trace_id),
        name=CHECK_SCORE,
        value=result.outcome or "undecided",
        data_type="CATEGORICAL",
        timestamp=run.created_at,
        trace_id=result.trace_id,
        comment=f"{result.outcome}: {comment}"[:500] if comment else result.outcome,
        metadata={"dataset": run.dataset, "run": run.name, "item_id": result.item_id, **result.stored()},
    )


def read_run(raw: Any, dataset: str) -> CheckRun | None:
    """One `DatasetRun` of the API; None when it is not one (listed runs are read leniently)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    try:
        created = parse_time(str(raw.get("createdAt")))
    except ValueError:
        return None
    metadata = raw.get("metadata")
    description = raw.get("description")
    return CheckRun(
        dataset=dataset,
        name=raw["name"],
        created_at=created,
        description=description if isinstance(description, str) else None,
        metadata=metadata if isinstance(metadata, dict) else {},
        id=raw.get("id") if isinstance(raw.get("id"), str) else None,
        dataset_id=raw.get("datasetId") if isinstance(raw.get("datasetId"), str) else None,
    )


class DatasetRunWrites:
    def __init__(self, http: LangfuseHttp, scores: ScoreReads, writes: ScoreWrites) -> None:
        self.http = http
        self.scores = scores
        self.writes = writes

    def _pages(self, what: str, path: str, params: dict[str, Any]) -> list[Any] | None:
        """Every row of a page-numbered listing; None on a 404 (no such dataset or run)."""
        rows: list[Any] = []
        page = 1
        while True:
            where = f"{what} (page {page})"
            query = {**params, "page": page, "limit": RUNS_PAGE}
            try:
                body = self.http.call(where, partial(self.http.raw, "GET", path, params=query))
            except HttpStatus as ex:
                if ex.status == 404:
                    return None
                raise fail(where, ex) from None
            try:
                data, total_pages = body["data"], int(body["meta"]["totalPages"])
                if not isinstance(data, list):
                    raise TypeError("data is not a list")
            except (KeyError, TypeError, ValueError) as ex:
                raise LangfuseError(f"{where}: the answer does not match the API contract: {ex!r}") from ex
            rows += data
            if page >= total_pages or not data:
                return rows
            page += 1

    def dataset_runs(self, dataset: str) -> list[CheckRun]:
        path = f"api/public/datasets/{quote(dataset, safe='')}/runs"
        rows = self._pages(f"reading the runs of dataset {dataset}", path, {}) or []
        runs = [run for raw in rows if (run := read_run(raw, dataset)) is not None]
        return sorted(runs, key=lambda r: (r.created_at, r.name), reverse=True)

    def _dataset_id(self, dataset: str) -> str | None:
        what = f"reading dataset {dataset}"
        try:
            path = f"api/public/v2/datasets/{quote(dataset, safe='')}"
            body = self.http.call(what, partial(self.http.raw, "GET", path))
        except HttpStatus as ex:
            if ex.status == 404:
                return None
            raise fail(what, ex) from None
        found = body.get("id") if isinstance(body, dict) else None
        return found if isinstance(found, str) else None

    def _run_items(self, run: CheckRun) -> dict[str, str]:
        """The run's items: dataset item id -> trace id (the newest, should a run hold two)."""
        dataset_id = run.dataset_id or self._dataset_id(run.dataset)
        if dataset_id is None:
            return {}
        params = {"datasetId": dataset_id, "runName": run.name}
        rows = self._pages(f"reading the items of run {run.name}", "api/public/dataset-run-items", params) or []
        found: dict[str, tuple[str, str]] = {}
        for raw in rows:
            if not isinstance(raw, dict) or not isinstance(raw.get("datasetItemId"), str):
                raise LangfuseError(f"reading the items of run {run.name}: a run item has no datasetItemId")
            trace, stamp = raw.get("traceId"), str(raw.get("createdAt") or "")
            if not isinstance(trace, str):
                continue
            held = found.get(raw["datasetItemId"])
            if held is None or stamp > held[1]:
                found[raw["datasetItemId"]] = (trace, stamp)
        return {item: trace for item, (trace, _) in found.items()}

    def dataset_run_results(self, run: CheckRun) -> dict[str, RunItemResult]:
        items = self._run_items(run)
        ids = {check_score_id(run.dataset, run.name, item, trace): item for item, trace in items.items()}
        rows = self.scores.by_id(list(ids), f"reading the results of run {run.name}", fields="details") if ids else {}
        results = {}
        for item, trace in items.items():
            row = rows.get(check_score_id(run.dataset, run.name, item, trace))
            results[item] = RunItemResult.read(item, trace, row.metadata if row is not None else None)
        return results

    def _decided(self, run: CheckRun, held: dict[str, str], item_ids: Sequence[str]) -> set[str]:
        """Of `item_ids` (items the run holds), those whose result there is a pass or a fail."""
        ids = {check_score_id(run.dataset, run.name, item, held[item]): item for item in item_ids}
        if not ids:
            return set()
        rows = self.scores.by_id(list(ids), f"reading the results of run {run.name}", fields="details")
        return {
            item
            for sid, item in ids.items()
            if (row := rows.get(sid)) is not None and RunItemResult.read(item, held[item], row.metadata).decided
        }

    def write_dataset_run(self, run: CheckRun, results: Sequence[RunItemResult]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        held = self._run_items(run)
        again = [r for r in results if r.item_id in held]
        decided = self._decided(run, held, [r.item_id for r in again])
        outcome.written += [r.item_id for r in again if r.item_id in decided]
        # a case the run holds undecided (an outage), judged again: its score is rewritten on the trace
        # the run item links (the id derives from it), so the run keeps one item with the new result
        replaced = [
            r.model_copy(
                update={"trace_id": held[r.item_id], "agent_trace": r.agent_trace and r.trace_id == held[r.item_id]}
            )
            for r in again
            if r.item_id not in decided
        ]
        new = [r for r in results if r.item_id not in held]
        scores = {r.item_id: check_score(run, r) for r in [*replaced, *new]}
        landed = self.writes.write(list(scores.values()))
        confirmed = set(landed.confirmed)

        def landed_or_failed(result: RunItemResult) -> bool:
            score = scores[result.item_id]
            if score.id in confirmed:
                return True
            reason = landed.failed.get(score.id, "not confirmed")
            outcome.failed[result.item_id] = f"its {CHECK_SCORE} score was not written: {reason}"
            return False

        outcome.written += [r.item_id for r in replaced if landed_or_failed(r)]
        to_post = [r for r in new if landed_or_failed(r)]
        # read again just before posting: another run of the same name may have added some of these
        # while the scores were written and confirmed (Langfuse takes no run item id: see the docstring)
        now_held = self._run_items(run) if to_post else {}
        for result in to_post:
            if result.item_id in now_held:
                outcome.written.append(result.item_id)
                continue
            body = {
                "runName": run.name,
                "runDescription": run.description,
                "metadata": run.metadata,
                "datasetItemId": result.item_id,
                "traceId": result.trace_id,
                "createdAt": iso_ms(run.created_at),
            }
            # 404: the item is archived or gone
            _post_one(
                self.http, outcome, result.item_id, f"adding item {result.item_id} to run {run.name}",
                "api/public/dataset-run-items", body, echoed="datasetItemId",
                wrong="the answer is not the run item written",
            )  # fmt: skip
        return outcome


class LangfuseBackend:
    """Vote source, trace source and score sink on Langfuse's public API (`triage.domain.ports`).

    Synchronous; safe to share between threads. Open it (`with`) before use: opening reads the
    project id for trace links, so `trace_url` never does I/O.
    """

    def __init__(
        self,
        *,
        public_key: str,
        secret_key: str,
        base_url: str,
        timeout: float = 30.0,
        deadline_seconds: float = 90.0,
        confirm_wait_seconds: float = 60.0,
        httpx_client: httpx.Client | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        confirm_first_wait: float = 1.0,
        clock: Clock | None = None,
        budget: Budget | None = None,
        vote_lookback: timedelta = VOTE_LOOKBACK,
        limits: LangfuseLimits | None = None,
    ) -> None:
        """`vote_lookback`: how far before a window a vote read reaches for votes changed in it
        (they keep their first timestamp; `ScoreReads.votes`)."""
        if not public_key or not secret_key:
            raise ConfigError("Langfuse needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY")
        self.stats = SourceStats()
        self.retry: RetryPolicy = LANGFUSE_RETRY.with_(
            deadline=deadline_seconds, initial=backoff_initial, maximum=backoff_max, clock=clock, budget=budget
        )
        self._http = LangfuseHttp(
            public_key=public_key,
            secret_key=secret_key,
            base_url=base_url,
            timeout=timeout,
            retry=self.retry,
            stats=self.stats,
            httpx_client=httpx_client,
            limits=limits,
            clock=clock,
        )
        self.base_url = self._http.base_url
        self._scores = ScoreReads(self._http, vote_lookback)
        self._traces = TraceReads(self._http)
        self._writes = ScoreWrites(
            self._http,
            self._scores,
            confirm_wait=confirm_wait_seconds,
            confirm_first_wait=confirm_first_wait,
            clock=clock,
        )
        self._links = TraceLinks(self.base_url)
        self._datasets = DatasetWrites(self._http)
        self._releases = LangfuseReleases(self._http)
        self._runs = DatasetRunWrites(self._http, self._scores, self._writes)
        self._experiments = ExperimentRuns(
            self._http,
            self._scores,
            self._writes,
            project_id=lambda: self._links.project_id,
            dataset_items=self._datasets.dataset_items,
            score_of=check_score,
        )
        self._links_retry = LINKS_RETRY.with_(clock=clock, budget=budget)

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> LangfuseBackend:
        """Resolve what later calls need without I/O (the project id for links)."""
        self._links.resolve(self._http, self._links_retry)
        return self

    def request_plan(self, traces: int) -> str | None:
        """What the night still costs at the budget (`[langfuse]`), from the requests made so far
        and `PLAN_REQUESTS_PER_100`; None when no budget is set."""
        pacer = self._http.pacers.get("general")
        if pacer is None:
            return None
        more = -(-traces // 100) * PLAN_REQUESTS_PER_100
        total = self.stats.requests + more
        rates = ", ".join(map(str, pacer.rates))
        minutes = pacer.seconds_for(total) / 60
        return (
            f"langfuse budget: {traces} thumbs-down to triage, about {total} requests in all at {rates}: "
            f"about {minutes:.1f} minutes of Langfuse time"
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LangfuseBackend:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def annotations(self) -> LangfuseAnnotations:
        """Score configs, annotation queues and the job's decisions, on the same client (`triage queue`)."""
        return LangfuseAnnotations(self._http)

    # -- VoteSource -----------------------------------------------------------------------------

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        return self._scores.votes(score_name, start, end)

    # -- TraceSource ----------------------------------------------------------------------------

    def session_traces(self, session_ids: Sequence[str]) -> dict[str, list[TraceRef]]:
        return self._traces.session_traces(session_ids)

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        return self._traces.observations(trace_ids)

    def trace_url(self, trace_id: str) -> str | None:
        return self._links.url(trace_id)

    def root_traces(self, start: datetime, end: datetime) -> list[TraceRef]:
        return self._traces.root_traces(start, end)

    # -- ScoreSink ------------------------------------------------------------------------------

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        return self._scores.triaged(trace_ids, score_name, rule_version)

    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        return self._writes.write(scores)

    # -- ScoreReader ----------------------------------------------------------------------------

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        return self._scores.scores(names, start, end)

    # -- ReleaseSource (`triage releases`, the report's Releases section) -------------------------

    def release_answers(self, start: datetime, end: datetime) -> ReleaseAnswers:
        return self._releases.release_answers(start, end)

    def trace_places(self, trace_ids: Sequence[str]) -> dict[str, TracePlace]:
        return self._releases.trace_places(trace_ids)

    def cast_votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        return self._releases.cast_votes(score_name, start, end)

    # -- DatasetSink (`triage promote`) ----------------------------------------------------------

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        return self._datasets.ensure_dataset(name, description, metadata)

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        return self._datasets.dataset_items(name)

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        return self._datasets.upsert_dataset_items(items)

    # -- DatasetRuns (`triage check`) -------------------------------------------------------------

    def _check_runs(self) -> DatasetRunWrites | ExperimentRuns:
        """Experiments on a Langfuse v4 server; the dataset-run endpoints on a v3 one only (asked once)."""
        return self._experiments if self._experiments.generation() == "v4" else self._runs

    def dataset_runs(self, dataset: str) -> list[CheckRun]:
        return self._check_runs().dataset_runs(dataset)

    def dataset_run_results(self, run: CheckRun) -> dict[str, RunItemResult]:
        return self._check_runs().dataset_run_results(run)

    def write_dataset_run(self, run: CheckRun, results: Sequence[RunItemResult]) -> DatasetWriteOutcome:
        return self._check_runs().write_dataset_run(run, results)
