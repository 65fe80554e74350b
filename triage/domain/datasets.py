"""Regression cases as dataset items, and the port they are written through.

A `DatasetItem` follows Langfuse's `CreateDatasetItemRequest` (input, expected output, metadata,
source trace). Its id is deterministic and unique across the project (Langfuse dataset item ids
are project-wide: one id cannot be reused in another dataset), so a rerun upserts the same item.
`triage promote` compares what it would write with what is there and writes only new or changed
items: a rerun writes nothing (in Langfuse every write makes a new item version).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.scores import NAMESPACE
from triage.errors import ExitCode

MAX_ITEM_ID = 255  # Langfuse's limit on a dataset item id


class DatasetItem(BaseModel):
    """One item of a dataset, as triage writes it and as a sink reads it back."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(max_length=MAX_ITEM_ID)
    dataset_name: str
    input: Any = None
    expected_output: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    source_trace_id: str | None = None
    source_observation_id: str | None = None
    #: read back only: a maintainer may archive an item; triage never sends a status on update
    status: Literal["ACTIVE", "ARCHIVED"] = "ACTIVE"

    def content(self) -> tuple[Any, Any, Any, str | None, str | None]:
        """What a rerun compares: everything triage writes, not the status a person may set."""
        return (self.input, self.expected_output, self.metadata, self.source_trace_id, self.source_observation_id)


class DatasetWriteOutcome(BaseModel):
    """Which items a write stored (the response proves it: dataset writes are synchronous)."""

    model_config = ConfigDict(extra="forbid")

    written: list[str] = Field(default_factory=list)
    failed: dict[str, str] = Field(default_factory=dict)


@runtime_checkable
class DatasetSink(Protocol):
    """Where regression cases go: Langfuse datasets, the embedded store, a JSONL file."""

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        """Create the dataset when it is missing (left as it is otherwise); True when it was created."""
        ...

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        """Every item of the dataset by id (empty when the dataset does not exist yet)."""
        ...

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        """Create or update the items by id; an id held by another dataset fails that item alone."""
        ...


def regression_item_id(dataset_name: str, trace_id: str) -> str:
    """The item of `trace_id` in `dataset_name`: one id per (dataset, trace), so the same trace can be
    a case in two datasets without the ids colliding project-wide. Fixed forever (like score ids)."""
    # JSON, not a separator: dataset "a:b" with trace "c" and dataset "a" with trace "b:c" differ
    return str(uuid.uuid5(NAMESPACE, "regression:" + json.dumps([dataset_name, trace_id], ensure_ascii=False)))


PromoteAction = Literal["created", "updated", "unchanged", "skipped", "failed"]


class PromotedCase(BaseModel):
    """What `triage promote` did with one trace."""

    model_config = ConfigDict(extra="forbid")

    trace_id: str
    item_id: str
    action: PromoteAction
    #: where the expected output came from: a reviewer's correction or expected tool behaviour, a
    #: reviewer who found the answer right, or the triaged layer's expectation
    expected_from: Literal["correction", "expected_tool_behavior", "review", "layer"] | None = None
    layer: str | None = None
    signature: str | None = None
    #: why it was skipped or failed
    reason: str | None = None
    url: str | None = None


class PromoteResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str
    target: str
    dry_run: bool = False
    dataset_created: bool = False
    cases: list[PromotedCase] = Field(default_factory=list)

    def count(self, action: PromoteAction) -> int:
        return sum(1 for case in self.cases if case.action == action)

    @property
    def exit_code(self) -> ExitCode:
        """5 when an item could not be written (a rerun writes it), else 0."""
        return ExitCode.NOT_WRITTEN if self.count("failed") else ExitCode.OK
