"""Regression cases as a JSONL file (`triage promote --jsonl FILE`), upserted by id as Langfuse does.

One item per line in Langfuse's field names (`id`, `datasetName`, `input`, `expectedOutput`,
`metadata`, `sourceTraceId`, `sourceObservationId`, `status`), ready for `create_dataset_item`. An
item whose id is there is replaced in place, a new one is appended; an id held by another dataset
fails, as in Langfuse. The file is rewritten (atomically) only when an item changed, so a rerun
leaves it byte for byte as it was.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from triage import jsonl
from triage.domain.datasets import DatasetItem, DatasetWriteOutcome
from triage.errors import InputError


def _line(item: DatasetItem) -> str:
    record = {
        "id": item.id,
        "datasetName": item.dataset_name,
        "input": item.input,
        "expectedOutput": item.expected_output,
        "metadata": item.metadata,
        "sourceTraceId": item.source_trace_id,
        "sourceObservationId": item.source_observation_id,
        "status": item.status,
    }
    return jsonl.dumps(record, sort_keys=True)


class DatasetFile:
    """A `DatasetSink` on a JSONL file (created when first written)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> list[DatasetItem]:
        if not self.path.exists():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as ex:
            raise InputError(f"cannot read {self.path}: {ex}") from ex
        items = []
        for number, line in jsonl.lines(text):
            try:
                raw: Any = jsonl.parse(line)
                items.append(
                    DatasetItem(
                        id=raw["id"],
                        dataset_name=raw["datasetName"],
                        input=raw.get("input"),
                        expected_output=raw.get("expectedOutput"),
                        metadata=raw.get("metadata") or {},
                        source_trace_id=raw.get("sourceTraceId"),
                        source_observation_id=raw.get("sourceObservationId"),
                        status=raw.get("status") or "ACTIVE",
                    )
                )
            except (ValueError, KeyError, TypeError, ValidationError) as ex:
                raise InputError(f"{self.path}, line {number}: not a dataset item: {str(ex)[:200]}") from ex
        return items

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        """A file has no datasets of its own: "created" when none of its items is in `name` yet."""
        return not any(item.dataset_name == name for item in self._read())

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        return {item.id: item for item in self._read() if item.dataset_name == name}

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        held = self._read()
        position = {item.id: n for n, item in enumerate(held)}
        outcome = DatasetWriteOutcome()
        for item in items:
            at = position.get(item.id)
            if at is None:
                position[item.id] = len(held)
                held.append(item)
            elif held[at].dataset_name != item.dataset_name:
                outcome.failed[item.id] = (
                    f"the dataset item with id {item.id} already exists in a dataset other than {item.dataset_name}"
                )
                continue
            else:
                held[at] = item.model_copy(update={"status": held[at].status})  # an archived item stays so
            outcome.written.append(item.id)
        if outcome.written:
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                tmp.write_text("".join(_line(item) + "\n" for item in held), encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as ex:
                raise InputError(f"cannot write {self.path}: {ex.strerror or ex}") from ex
        return outcome
