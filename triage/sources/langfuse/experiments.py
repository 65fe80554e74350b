"""Langfuse v4 experiments: `triage check`'s runs where a Langfuse v4 server keeps them (`DatasetRuns`).

In Langfuse v4 a dataset run is an experiment. Cloud removed the dataset-run endpoints on 2026-11-16
(`POST`/`GET /api/public/dataset-run-items`, `GET /api/public/datasets/{name}/runs`), and a run
linked that way would not show as an experiment run in the v4 UI. Self-hosted v3 servers keep them
until they upgrade, so the server's generation is detected once (`server_generation`: `GET
/api/public/experiments` answers on v4, is a 404 on v3) and logged; the backend writes experiments
on v4 and the legacy dataset runs (`backend.DatasetRunWrites`) on v3 only.

The experiment of a run: its id derived from the project, the dataset and the run name exactly as
the SDK derives it for a dataset and a run name (`experiment_id`: Langfuse's server derives it the
same way), so a rerun under the same name writes into the same experiment, and so would the SDK.
Each case is one experiment item: a trace of one span, with ids derived from the dataset, the run
name and the case (`item_ids`), carrying every `langfuse.experiment.*` attribute the SDK sets (id,
name, description, metadata, dataset id, item id, root observation id, the item's expected output
and metadata), the case's input, and as its output the stored result (the `triage_check` score's
metadata, with the agent's trace id, which the item links). Written:

- first the `triage_check` score on the item's trace, through the one score path (read back), with
  the id derived from the dataset, the run, the case and the item's trace and the run's start as its
  timestamp, as on v3 (`backend.check_score`: its clipping and masking hold here too);
- then, for each case whose score landed, its span: `POST /api/public/otel/v1/traces` as OTLP/JSON
  (see `otlp`), in requests of at most `OTLP_REQUEST_BYTES`. The span starts at the run's start
  (the experiment's start time, which a rerun reads back as the run's creation time) and has fixed
  ids, so written again (a retry, a rerun, two runs of one name at once) it replaces itself: no
  case is ever in an experiment twice, unlike a re-posted dataset run item.

Read: `GET /api/public/experiments` (cursor pages, `fromStartTime` a day before the dataset's creation, the
dataset's id, `fields=core,metadata`) for a dataset's runs; `GET /api/public/experiment-items`
(`experimentId`, `fromStartTime` the run's start, `fields=io,scores`) for a run's results: the
`triage_check` score's metadata where the listing carries it, else the item's output (the same
record). A case the run holds decided (a pass or a fail) is final, as on v3; an undecided one is
written again over itself.

Every request goes through `LangfuseHttp` (retries, the `[langfuse]` budget: the experiments
listings count as datasets, the spans as ingestion). `LangfuseHttp.raw` sends no extra header, so
the spans go without `x-langfuse-ingestion-version: 4` (the SDK's exporter sends it for v4's
real-time processing): they are ingested all the same, listed after the server's usual delay, and
a rerun started within it may write again what it does not see yet: over itself, never twice.

Not the SDK's own runner (`Langfuse.run_experiment`): it would make the SDK (its tracing stack:
about 20 MB and 300 modules) a run-time dependency; it runs the task itself, where `triage check`
asks a remote agent and judges the answer; it gives each item a new trace and span on every call
(so a resumed run would hold a case twice); and its scores are fire-and-forget, never confirmed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal
from urllib.parse import quote

import pydantic

import triage
from triage.domain.checks import CHECK_SCORE, STORED_TEXT_CHARS, CheckRun, RunItemResult, check_score_id
from triage.domain.kernel import clip, iso_z, ms_utc
from triage.domain.scores import ScoreBody
from triage.domain.worklist import DatasetItem, DatasetWriteOutcome
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged, parsed
from triage.sources.langfuse.otlp import Span, chunked, export_request, hex_id
from triage.sources.langfuse.reads import ScoreReads
from triage.sources.langfuse.wire import ProjectsPage
from triage.sources.langfuse.writes import ScoreWrites

log = logging.getLogger("triage.sources.langfuse")

Generation = Literal["v3", "v4"]

EXPERIMENTS_PATH = "api/public/experiments"
ITEMS_PATH = "api/public/experiment-items"
OTLP_PATH = "api/public/otel/v1/traces"
#: v4's real-time ingestion (as the SDK's exporter sends it): without it, spans land some minutes
#: later, and a rerun started in between would ask again what it cannot see yet
INGESTION_HEADERS = {"x-langfuse-ingestion-version": "4"}
EXPERIMENTS_PAGE = 100  # `limit` at most 100
#: an item carries its result (up to `STORED_RESULT_BYTES`) twice at most (output, score): 50 a page
#: stays under Cloud's 5 MB a response
ITEMS_PAGE = 50
#: spans per OTLP request, in bytes: under Cloud's 5 MB a request with room for the envelope
OTLP_REQUEST_BYTES = 3_000_000
#: the environment of the experiments' traces and scores: the SDK's for experiments, so they stay out
#: of the production views (and the nightly triage) as the SDK's do
EXPERIMENT_ENVIRONMENT = "sdk-experiment"
SPAN_NAME = "triage check"
#: a dataset's experiments are listed from this long before its creation: the dataset's time is the
#: server's, a run's start the machine's that ran it (clocks differ)
CLOCK_MARGIN = timedelta(days=1)
#: the item's input and expected output as sent, at most this many characters of JSON each
ITEM_TEXT_CHARS = 4 * STORED_TEXT_CHARS

# the SDK's span attributes (langfuse._client.attributes.LangfuseOtelSpanAttributes, 5.2.0)
EXPERIMENT_ID = "langfuse.experiment.id"
EXPERIMENT_NAME = "langfuse.experiment.name"
EXPERIMENT_DESCRIPTION = "langfuse.experiment.description"
EXPERIMENT_METADATA = "langfuse.experiment.metadata"
EXPERIMENT_DATASET_ID = "langfuse.experiment.dataset.id"
EXPERIMENT_ITEM_ID = "langfuse.experiment.item.id"
EXPERIMENT_ITEM_EXPECTED_OUTPUT = "langfuse.experiment.item.expected_output"
EXPERIMENT_ITEM_METADATA = "langfuse.experiment.item.metadata"
EXPERIMENT_ITEM_ROOT_OBSERVATION_ID = "langfuse.experiment.item.root_observation_id"
ENVIRONMENT = "langfuse.environment"
OBSERVATION_TYPE = "langfuse.observation.type"
OBSERVATION_INPUT = "langfuse.observation.input"
OBSERVATION_OUTPUT = "langfuse.observation.output"
OBSERVATION_METADATA = "langfuse.observation.metadata"
TRACE_NAME = "langfuse.trace.name"


def experiment_id(project_id: str, dataset_id: str, run_name: str) -> str:
    """The experiment id of a run on a dataset, byte for byte as the SDK (`Langfuse._create_experiment_id`,
    5.x) and Langfuse's server derive it: SHA-256 of the JSON array, its first 16 hex digits."""
    payload = json.dumps(
        ["langfuse-experiment-v1", project_id, dataset_id, run_name], separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def item_ids(dataset: str, run_name: str, item_id: str) -> tuple[str, str]:
    """The (trace id, span id) of a case's experiment item: the same for every write of the case in
    the run, so the span replaces itself and the score on the trace keeps its id."""
    return (
        hex_id(["triage-check-item-trace", dataset, run_name, item_id], 32),
        hex_id(["triage-check-item-span", dataset, run_name, item_id], 16),
    )


# -- the answers' shapes (only the fields read) ------------------------------------------------------


class _Wire(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore", populate_by_name=True)


class _Meta(_Wire):
    cursor: str | None = None


class ExperimentRow(_Wire):
    id: str
    name: str
    description: str | None = None
    start_time: datetime = pydantic.Field(alias="startTime")
    dataset_id: str | None = pydantic.Field(default=None, alias="datasetId")
    metadata: dict[str, Any] | None = None


class ExperimentsPage(_Wire):
    data: list[ExperimentRow]
    meta: _Meta


class ItemScore(_Wire):
    id: str
    name: str
    value: Any = None
    metadata: Any = None


class ExperimentItemRow(_Wire):
    id: str
    trace_id: str = pydantic.Field(alias="traceId")
    experiment_id: str = pydantic.Field(alias="experimentId")
    experiment_item_id: str = pydantic.Field(alias="experimentItemId")
    output: Any = None
    scores: list[ItemScore] | None = None


class ExperimentItemsPage(_Wire):
    data: list[ExperimentItemRow]
    meta: _Meta


class DatasetRow(_Wire):
    id: str
    created_at: datetime = pydantic.Field(alias="createdAt")


def _reason(ex: HttpStatus) -> str:
    body = ex.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return f"HTTP {ex.status}: {body['message'][:300]}"
    return ex.detail()


def server_generation(http: LangfuseHttp) -> Generation:
    """Which Langfuse answers: v4 when `GET /api/public/experiments` does, v3 when it is a 404 (the
    endpoint came with v4's experiments). Anything else fails as a read does."""
    what = "asking Langfuse for its experiments (which server generation it is)"
    params = {"fromStartTime": iso_z(datetime.now(UTC)), "limit": 1}
    try:
        http.call(what, partial(http.raw, "GET", EXPERIMENTS_PATH, params=params))
    except HttpStatus as ex:
        if ex.status == 404:
            return "v3"
        raise fail(what, ex) from None
    return "v4"


@dataclass(frozen=True)
class _Target:
    """Where a run's items go: the dataset's Langfuse id and the experiment's."""

    dataset_id: str
    experiment_id: str


@dataclass(frozen=True)
class _Dataset:
    id: str
    created_at: datetime


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class ExperimentRuns:
    """`DatasetRuns` on a Langfuse v4 server (see the module docstring). Safe to share between threads.

    `project_id` gives the project's id (read when the backend opens; None when it could not be);
    `dataset_items` reads a dataset's items (the cases' input and expected output, sent with each
    item as the SDK sends them); `score_of` is the `triage_check` score of a result (the v3 path's)."""

    def __init__(
        self,
        http: LangfuseHttp,
        scores: ScoreReads,
        writes: ScoreWrites,
        *,
        project_id: Callable[[], str | None],
        dataset_items: Callable[[str], dict[str, DatasetItem]],
        score_of: Callable[[CheckRun, RunItemResult], ScoreBody],
    ) -> None:
        self.http = http
        self.scores = scores
        self.writes = writes
        self._project_id = project_id
        self._dataset_items = dataset_items
        self._score_of = score_of
        self._lock = threading.Lock()
        self._generation: Generation | None = None
        self._datasets: dict[str, _Dataset | None] = {}
        self._items: dict[str, dict[str, DatasetItem]] = {}
        self._project_read: str | None = None

    # -- the server's generation ------------------------------------------------------------------

    def generation(self) -> Generation:
        """The server's generation, asked once (the first `DatasetRuns` call) and logged."""
        with self._lock:
            if self._generation is None:
                self._generation = server_generation(self.http)
                where = (
                    "experiments (GET /api/public/experiments, OTLP spans)"
                    if self._generation == "v4"
                    else "dataset runs (the v3 endpoints; GET /api/public/experiments is a 404)"
                )
                log.info(
                    "langfuse: a %s server: triage check's runs are %s",
                    self._generation,
                    where,
                    extra={"event": "langfuse_generation", "generation": self._generation},
                )
            return self._generation

    # -- what a run needs: the dataset, the project, the experiment id ---------------------------

    def _dataset(self, name: str) -> _Dataset | None:
        with self._lock:
            if name in self._datasets:
                return self._datasets[name]
        what = f"reading dataset {name}"
        try:
            body = self.http.call(
                what, partial(self.http.raw, "GET", f"api/public/v2/datasets/{quote(name, safe='')}")
            )
        except HttpStatus as ex:
            if ex.status != 404:
                raise fail(what, ex) from None
            found = None
        else:
            row = parsed(what, DatasetRow, body)
            found = _Dataset(row.id, ms_utc(row.created_at))
        with self._lock:
            self._datasets[name] = found
        return found

    def _project(self) -> str:
        """The project's id (the experiment id derives from it). Raises LangfuseError without one:
        a random id, as the SDK falls back to, would start a new experiment on every rerun."""
        known = self._project_id() or self._project_read
        if known:
            return known
        what = "reading the project (the experiment id derives from its id)"
        try:
            body = self.http.call(what, partial(self.http.raw, "GET", "api/public/projects"))
            page = parsed(what, ProjectsPage, body)
        except HttpStatus as ex:
            raise fail(what, ex) from None
        if not page.data:
            raise LangfuseError(f"{what}: the keys see no project")
        self._project_read = page.data[0].id
        return self._project_read

    def _target(self, run: CheckRun) -> _Target | None:
        dataset_id = run.dataset_id
        if dataset_id is None:
            dataset = self._dataset(run.dataset)
            if dataset is None:
                return None
            dataset_id = dataset.id
        return _Target(dataset_id, experiment_id(self._project(), dataset_id, run.name))

    # -- reads -----------------------------------------------------------------------------------

    def dataset_runs(self, dataset: str) -> list[CheckRun]:
        found = self._dataset(dataset)
        if found is None:
            return []
        what = f"reading the experiments of dataset {dataset}"
        params = {
            "fromStartTime": iso_z(found.created_at - CLOCK_MARGIN),
            "datasetId": found.id,
            "fields": "core,metadata",
            "limit": EXPERIMENTS_PAGE,
        }

        def page(cursor: str | None) -> ExperimentsPage:
            query = {**params, **({"cursor": cursor} if cursor else {})}
            try:
                body = self.http.call(what, partial(self.http.raw, "GET", EXPERIMENTS_PATH, params=query))
            except HttpStatus as ex:
                raise fail(what, ex) from None
            return parsed(what, ExperimentsPage, body)

        by_name: dict[str, CheckRun] = {}
        project = self._project_id() or self._project_read
        for row in paged(page, what):
            run = CheckRun(
                dataset=dataset,
                name=row.name,
                created_at=ms_utc(row.start_time),
                description=row.description,
                metadata=row.metadata or {},
                id=row.id,
                dataset_id=found.id,
            )
            held = by_name.get(row.name)
            # two experiments of one name (another runner's, with its own id): ours is the derived id
            ours = project is not None and row.id == experiment_id(project, found.id, row.name)
            if held is None or ours:
                by_name[row.name] = run
        return sorted(by_name.values(), key=lambda r: (r.created_at, r.name), reverse=True)

    def _rows(self, run: CheckRun, target: _Target) -> Iterator[ExperimentItemRow]:
        what = f"reading the items of experiment {run.name}"
        params = {
            "experimentId": run.id or target.experiment_id,
            "fromStartTime": iso_z(run.created_at),
            "fields": "io,scores",
            "limit": ITEMS_PAGE,
        }

        def page(cursor: str | None) -> ExperimentItemsPage:
            query = {**params, **({"cursor": cursor} if cursor else {})}
            try:
                body = self.http.call(what, partial(self.http.raw, "GET", ITEMS_PATH, params=query))
            except HttpStatus as ex:
                raise fail(what, ex) from None
            return parsed(what, ExperimentItemsPage, body)

        return paged(page, what)

    def _held(self, run: CheckRun, target: _Target) -> dict[str, RunItemResult]:
        """The run's results by dataset item id: from the `triage_check` score's metadata where the
        listing carries it, else from the item's output (the same record)."""
        results: dict[str, RunItemResult] = {}
        for row in self._rows(run, target):
            trace_id, span_id = item_ids(run.dataset, run.name, row.experiment_item_id)
            if row.experiment_item_id in results and row.id != span_id:
                continue  # another writer's item of the same case: ours (the fixed span id) wins
            score_id = check_score_id(run.dataset, run.name, row.experiment_item_id, row.trace_id)
            score = next((s for s in row.scores or [] if s.id == score_id and s.name == CHECK_SCORE), None)
            stored = score.metadata if score is not None and isinstance(score.metadata, dict) else row.output
            agent_trace = stored.get("trace_id") if isinstance(stored, dict) else None
            results[row.experiment_item_id] = RunItemResult.read(
                row.experiment_item_id, agent_trace if isinstance(agent_trace, str) else row.trace_id, stored
            )
        return results

    def dataset_run_results(self, run: CheckRun) -> dict[str, RunItemResult]:
        target = self._target(run)
        return self._held(run, target) if target is not None else {}

    # -- writes ----------------------------------------------------------------------------------

    def _score(self, run: CheckRun, result: RunItemResult) -> ScoreBody:
        """The `triage_check` score on the item's trace (the v3 path's score, its metadata naming
        the agent's trace, which the item links)."""
        trace_id, _ = item_ids(run.dataset, run.name, result.item_id)
        score = self._score_of(run, result.model_copy(update={"trace_id": trace_id}))
        return replace(
            score, environment=EXPERIMENT_ENVIRONMENT, metadata={**score.metadata, "trace_id": result.trace_id}
        )

    def _cases(self, dataset: str) -> dict[str, DatasetItem]:
        """The dataset's items, read once a run (their input and expected output go with each item);
        {} when they cannot be read (the items then go without them)."""
        with self._lock:
            if dataset in self._items:
                return self._items[dataset]
        try:
            items = self._dataset_items(dataset)
        except LangfuseError as ex:
            log.warning("check: the items of dataset %s cannot be read (%s): experiment items go without "
                        "their input", dataset, ex)  # fmt: skip
            items = {}
        with self._lock:
            self._items[dataset] = items
        return items

    def _span(
        self, run: CheckRun, target: _Target, result: RunItemResult, output: Mapping[str, Any], item: DatasetItem | None
    ) -> Span:
        trace_id, span_id = item_ids(run.dataset, run.name, result.item_id)
        attributes: dict[str, str] = {
            TRACE_NAME: SPAN_NAME,
            ENVIRONMENT: EXPERIMENT_ENVIRONMENT,
            OBSERVATION_TYPE: "span",
            EXPERIMENT_ID: target.experiment_id,
            EXPERIMENT_NAME: run.name,
            EXPERIMENT_METADATA: _json(run.metadata),
            EXPERIMENT_DATASET_ID: target.dataset_id,
            EXPERIMENT_ITEM_ID: result.item_id,
            EXPERIMENT_ITEM_ROOT_OBSERVATION_ID: span_id,
            OBSERVATION_INPUT: clip(_json(item.input if item is not None else {"dataset_item_id": result.item_id}),
                                    ITEM_TEXT_CHARS),  # fmt: skip
            OBSERVATION_OUTPUT: _json(dict(output)),
            # as the SDK's item metadata: the run and the item, and what the item links
            f"{OBSERVATION_METADATA}.experiment_name": run.name,
            f"{OBSERVATION_METADATA}.experiment_run_name": run.name,
            f"{OBSERVATION_METADATA}.dataset_id": target.dataset_id,
            f"{OBSERVATION_METADATA}.dataset_item_id": result.item_id,
            f"{OBSERVATION_METADATA}.agent_trace_id": result.trace_id,
        }
        if run.description:
            attributes[EXPERIMENT_DESCRIPTION] = run.description
        if item is not None:
            if item.expected_output is not None:
                attributes[EXPERIMENT_ITEM_EXPECTED_OUTPUT] = clip(_json(item.expected_output), ITEM_TEXT_CHARS)
            if item.metadata:
                attributes[EXPERIMENT_ITEM_METADATA] = clip(_json(item.metadata), ITEM_TEXT_CHARS)
        # the run's start, fixed: the span written again replaces itself (and the experiment's start
        # is the run's creation time a rerun reads back)
        return Span(trace_id, span_id, SPAN_NAME, run.created_at, datetime.now(UTC), attributes)

    def write_dataset_run(self, run: CheckRun, results: Sequence[RunItemResult]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        if not results:
            return outcome
        target = self._target(run)
        if target is None:
            for result in results:
                outcome.failed[result.item_id] = f"dataset {run.dataset} not found"
            return outcome
        held = self._held(run, target)
        # a decided result the run holds is final, whoever writes; an undecided one is written over
        pending = [r for r in results if not (r.item_id in held and held[r.item_id].decided)]
        outcome.written += [r.item_id for r in results if r.item_id in held and held[r.item_id].decided]
        scores = {r.item_id: self._score(run, r) for r in pending}
        landed = self.writes.write(list(scores.values()))
        confirmed = set(landed.confirmed)
        ready: list[RunItemResult] = []
        for result in pending:
            score = scores[result.item_id]
            if score.id in confirmed:
                ready.append(result)
            else:
                reason = landed.failed.get(score.id, "not confirmed")
                outcome.failed[result.item_id] = f"its {CHECK_SCORE} score was not written: {reason}"
        if not ready:
            return outcome
        cases = self._cases(run.dataset)
        spans = [
            (r.item_id, self._span(run, target, r, scores[r.item_id].metadata, cases.get(r.item_id))) for r in ready
        ]
        for chunk in chunked(spans, OTLP_REQUEST_BYTES):
            self._post(run, chunk, outcome)
        return outcome

    def _post(self, run: CheckRun, chunk: list[tuple[str, Span]], outcome: DatasetWriteOutcome) -> None:
        what = f"writing {len(chunk)} items of experiment {run.name}"
        body = export_request([s for _, s in chunk], service="triage", scope="triage", version=triage.__version__)
        try:
            answer = self.http.call(
                what, partial(self.http.raw, "POST", OTLP_PATH, json_body=body, headers=INGESTION_HEADERS)
            )
        except HttpStatus as ex:
            reason = _reason(ex)
        except LangfuseError as ex:
            reason = str(ex)
        else:
            # OTLP's partial success: some spans refused (none of ours may be: they go again on a rerun)
            partial_ = answer.get("partialSuccess") if isinstance(answer, dict) else None
            rejected = partial_.get("rejectedSpans") if isinstance(partial_, dict) else None
            if not rejected or str(rejected) == "0":
                outcome.written += [key for key, _ in chunk]
                return
            reason = f"the server refused {rejected} spans: {partial_.get('errorMessage') if partial_ else ''}"
        for key, _ in chunk:
            outcome.failed[key] = f"its experiment item was not written: {reason}"
