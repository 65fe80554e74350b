"""The embedded store's datasets (`triage promote`'s `DatasetSink`), kept as Langfuse keeps
them: an item's id is unique in the project and cannot move to another dataset."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from triage.domain.datasets import DatasetItem, DatasetWriteOutcome
from triage.domain.kernel import iso_ms as iso


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

