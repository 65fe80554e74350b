"""The embedded store's datasets and their runs, as mixins of `sources.store.Store` (its connection
and lock): `triage promote`'s `DatasetSink`, kept as Langfuse keeps them (an item's id is unique in
the project and cannot move to another dataset), and `triage check`'s `DatasetRuns`:
`dataset_runs`, one row per (dataset, run name), and `dataset_run_items`, one row per (run, dataset
item) with the case's result as JSON; the ids are derived from the names, so a rerun under the same
run name, or two at once, adds no item twice (a decided result is final; an undecided one is
replaced when the case is judged again)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from triage.domain.checks import CheckRun, RunItemResult, run_id, run_item_id
from triage.domain.kernel import iso_ms as iso
from triage.domain.kernel import parse_time
from triage.domain.worklist import DatasetItem, DatasetWriteOutcome


class DatasetTables:
    """The `datasets` and `dataset_items` tables of a `Store` (which provides the connection)."""

    _db: sqlite3.Connection
    _lock: threading.Lock

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO datasets (name, description, metadata, createdAt) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO NOTHING",
                (name, description, json.dumps(metadata), iso(datetime.now(UTC))),
            )
            return cursor.rowcount == 1

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM dataset_items WHERE datasetName = ? ORDER BY id", (name,)
            ).fetchall()
        return {
            row["id"]: DatasetItem(
                id=row["id"],
                dataset_name=row["datasetName"],
                input=json.loads(row["input"]) if row["input"] is not None else None,
                expected_output=json.loads(row["expectedOutput"]) if row["expectedOutput"] is not None else None,
                metadata=json.loads(row["metadata"]) if row["metadata"] else {},
                source_trace_id=row["sourceTraceId"],
                source_observation_id=row["sourceObservationId"],
                status=row["status"],
            )
            for row in rows
        }

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        now = iso(datetime.now(UTC))
        with self._tx() as db:
            for item in items:
                held = db.execute("SELECT datasetName FROM dataset_items WHERE id = ?", (item.id,)).fetchone()
                if held is not None and held["datasetName"] != item.dataset_name:
                    # as Langfuse: an id is unique in the project and cannot move to another dataset
                    outcome.failed[item.id] = (
                        f"the dataset item with id {item.id} already exists in a dataset other than {item.dataset_name}"
                    )
                    continue
                if db.execute("SELECT 1 FROM datasets WHERE name = ?", (item.dataset_name,)).fetchone() is None:
                    outcome.failed[item.id] = f"dataset {item.dataset_name} not found"
                    continue
                db.execute(
                    "INSERT INTO dataset_items (id, datasetName, input, expectedOutput, metadata, sourceTraceId, "
                    "sourceObservationId, createdAt, updatedAt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET input = excluded.input, expectedOutput = excluded.expectedOutput, "
                    "metadata = excluded.metadata, sourceTraceId = excluded.sourceTraceId, "
                    "sourceObservationId = excluded.sourceObservationId, updatedAt = excluded.updatedAt",
                    (
                        item.id,
                        item.dataset_name,
                        json.dumps(item.input, ensure_ascii=False),
                        json.dumps(item.expected_output, ensure_ascii=False),
                        json.dumps(item.metadata, ensure_ascii=False),
                        item.source_trace_id,
                        item.source_observation_id,
                        now,
                        now,
                    ),
                )
                outcome.written.append(item.id)
        return outcome


class DatasetRunTables:
    """The `dataset_runs` and `dataset_run_items` tables of a `Store` (`triage check`)."""

    _db: sqlite3.Connection
    _lock: threading.Lock

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def dataset_runs(self, dataset: str) -> list[CheckRun]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM dataset_runs WHERE datasetName = ? ORDER BY createdAt DESC, name DESC", (dataset,)
            ).fetchall()
        runs = []
        for row in rows:
            try:
                metadata = json.loads(row["metadata"]) if row["metadata"] else {}
                created = parse_time(row["createdAt"])
            except (TypeError, ValueError, RecursionError):
                continue  # a row another tool left: not a run triage can compare with
            runs.append(
                CheckRun(
                    dataset=dataset,
                    name=row["name"],
                    created_at=created,
                    description=row["description"],
                    metadata=metadata if isinstance(metadata, dict) else {},
                    id=row["id"],
                )
            )
        return runs

    def dataset_run_results(self, run: CheckRun) -> dict[str, RunItemResult]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM dataset_run_items WHERE runId = ? ORDER BY datasetItemId",
                (run_id(run.dataset, run.name),),
            ).fetchall()
        found = {}
        for row in rows:
            try:
                stored = json.loads(row["result"]) if row["result"] else None
            except (ValueError, RecursionError):
                stored = None
            found[row["datasetItemId"]] = RunItemResult.read(row["datasetItemId"], row["traceId"], stored)
        return found

    def write_dataset_run(self, run: CheckRun, results: Sequence[RunItemResult]) -> DatasetWriteOutcome:
        outcome = DatasetWriteOutcome()
        now = iso(datetime.now(UTC))
        rid = run_id(run.dataset, run.name)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM datasets WHERE name = ?", (run.dataset,)).fetchone() is None:
                outcome.failed.update({r.item_id: f"dataset {run.dataset} not found" for r in results})
                return outcome
            db.execute(
                "INSERT INTO dataset_runs (id, datasetName, name, description, metadata, createdAt, updatedAt) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET updatedAt = excluded.updatedAt",
                (rid, run.dataset, run.name, run.description, json.dumps(run.metadata), iso(run.created_at), now),
            )
            for result in results:
                held = db.execute("SELECT datasetName FROM dataset_items WHERE id = ?", (result.item_id,)).fetchone()
                if held is None or held["datasetName"] != run.dataset:
                    outcome.failed[result.item_id] = f"dataset item {result.item_id} not found in {run.dataset}"
                    continue
                # one row per (run, case), its id derived from both (two runs of one name at once, in
                # one file, still make one row): a DECIDED result is final; one the run holds
                # undecided (an outage) is replaced by the result of the case asked again
                db.execute(
                    "INSERT INTO dataset_run_items (id, runId, datasetItemId, traceId, outcome, result, createdAt) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET traceId = excluded.traceId, "
                    "outcome = excluded.outcome, result = excluded.result "
                    "WHERE dataset_run_items.outcome IS NULL OR dataset_run_items.outcome NOT IN ('pass', 'fail')",
                    (
                        run_item_id(run.dataset, run.name, result.item_id),
                        rid,
                        result.item_id,
                        result.trace_id,
                        result.outcome,
                        json.dumps(result.stored(), ensure_ascii=False),
                        now,
                    ),
                )
                outcome.written.append(result.item_id)
        return outcome
