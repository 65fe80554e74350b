"""Datasets: regression cases as Langfuse dataset items (`triage promote`).

- `GET /api/public/v2/datasets/{name}`, and `POST /api/public/v2/datasets` when it answers 404 (the
  POST upserts on the name: sent only for a missing dataset, so a maintainer's description stays).
- `GET /api/public/dataset-items?datasetName=` in pages of 100 (the server's maximum), page numbers
  from 1: what is there, to write only what is new or changed.
- `POST /api/public/dataset-items` per item, with its id: an upsert on the id, which is unique in the
  project (an id held by another dataset is a 404 naming it: that item fails, the others go on). The
  status is never sent, so an item a maintainer archived stays archived. Writes are synchronous (the
  answer is the stored item), so no read-back is needed; every write makes a new item version.

Plain HTTP through the shared client and its retries (a retried POST is safe: it upserts by id).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any
from urllib.parse import quote

from triage.domain.datasets import DatasetItem, DatasetWriteOutcome
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail

log = logging.getLogger("triage.sources.langfuse")

ITEMS_PAGE = 100  # GET /dataset-items: `limit` above 100 is a 400


def _message(ex: HttpStatus) -> str:
    body = ex.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return f"HTTP {ex.status}: {body['message'][:300]}"
    return ex.detail()


def wire_item(item: DatasetItem) -> dict[str, Any]:
    """The `CreateDatasetItemRequest` body of one item (no status: see the module docstring)."""
    body: dict[str, Any] = {
        "id": item.id,
        "datasetName": item.dataset_name,
        "input": item.input,
        "expectedOutput": item.expected_output,
        "metadata": item.metadata,
        "sourceTraceId": item.source_trace_id,
    }
    if item.source_observation_id is not None:
        body["sourceObservationId"] = item.source_observation_id
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
            what = f"writing dataset item {item.id}"
            post = partial(self.http.raw, "POST", "api/public/dataset-items", json_body=wire_item(item))
            try:
                stored = self.http.call(what, post)
            except HttpStatus as ex:
                # 404: the dataset is gone, or the id is held by another dataset; 400: refused
                outcome.failed[item.id] = _message(ex)
                continue
            except LangfuseError as ex:
                outcome.failed[item.id] = str(ex)
                continue
            if not isinstance(stored, dict) or stored.get("id") != item.id:
                outcome.failed[item.id] = "the answer is not the item written"
                continue
            outcome.written.append(item.id)
        return outcome
