"""Failure signatures: recurring failures as one item, with an id that stays the same night after night.

A signature is a layer, a component and a question topic. Two failures share one when their
layer and component agree and their questions' content words are similar enough (`similarity`). Ids are
never handed out in arrival order (a concurrent run has none): a signature seen before keeps the
id stored with its members' scores, and a new one takes an id made from its first member's
content (`signature_id`), so the same question founds the same id even after its history
expired. Tonight's failures are taken in a fixed order (trace start, then id), so a rerun of
the same night assigns the same ids.

Nights are windows of the run's own length counted back from its end: night 0 is tonight.
Statuses, over tonight and the 7 nights before it:

- `new`: first seen tonight;
- `recurring`: seen tonight and the night before;
- `regressed`: seen tonight, not the night before, but on an earlier night (it came back);
- `resolved`: seen in the previous 7 nights, not tonight.

Regression cases as dataset items, and the port they are written through.

A `DatasetItem` follows Langfuse's `CreateDatasetItemRequest` (input, expected output, metadata,
source trace). Its id is deterministic and unique across the project (Langfuse dataset item ids
are project-wide: one id cannot be reused in another dataset), so a rerun upserts the same item.
`triage promote` compares what it would write with what is there and writes only new or changed
items: a rerun writes nothing (in Langfuse every write makes a new item version).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from triage.domain.scores import NAMESPACE
from triage.errors import ExitCode

NIGHTS = 7  # the nights before tonight a trend looks at
#: the Dice similarity of two questions' content words at which they are the same failure; chosen
#: on the dev split of the evaluation set's paraphrases (bench/signatures.py: the middle of the
#: widest margin between paraphrases and unrelated questions; see bench/README.md)
SIMILARITY = 0.31
MAX_TERMS = 24  # a signature keeps its founder's most distinctive words, no more

Status = Literal["new", "recurring", "regressed", "resolved"]

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9]|[A-Za-z]{3,}")
_STOP = frozenset(
    """about above after again all also and any are because been before being below between both but can cannot
    could did does doing done down during each even every few for from further get gets getting got had has have
    having here how however into its itself just let like make makes many may might more most much must need
    needs not now off once only other our out over own per please really same see set should show some still such
    than that the their them then there these they this those through too try trying under until upon use used
    using very want wants was way well were what when where whether which while who whom why will with within
    without would yes yet you your yours thing things something anything work works working able help know tell
    doesn don isn wasn won instead""".split()
)


def _stem(word: str) -> str:
    """A light suffix strip so `trials`/`trial` and `configuring`/`configure` meet."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) >= 5 else word


def question_terms(text: str) -> frozenset[str]:
    """The content words of a question, lowercased and lightly stemmed."""
    words = (w.lower().strip(".-_") for w in _WORD.findall(text))
    return frozenset(_stem(w) for w in words if len(w) >= 3 and w not in _STOP)


def topic_terms(question: str, component: str) -> frozenset[str]:
    """The question's words that can tell two failures of one component apart: the component's
    own name (and "kubeflow") says nothing there, since only one component's failures are compared."""
    return question_terms(question) - question_terms(f"kubeflow {component.replace('-', ' ')}")


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Dice: twice the shared words over both sizes (0 when either is empty). Unlike the overlap
    coefficient it does not call a two-word question the same as any longer one holding both."""
    if not a or not b:
        return 0.0
    return 2 * len(a & b) / (len(a) + len(b))


def signature_id(layer: str, component: str, terms: Iterable[str]) -> str:
    """An id from content alone: the same founding question gives the same id on any night."""
    key = "\x1f".join([layer, component, *sorted(terms)])
    return "sig-" + hashlib.sha256(key.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Member:
    """One triaged failure, as signatures see it."""

    trace_id: str
    layer: str
    component: str
    question: str
    start: datetime | None = None

    @property
    def terms(self) -> frozenset[str]:
        return topic_terms(self.question, self.component)


@dataclass
class Signature:
    id: str
    layer: str
    component: str
    terms: frozenset[str]
    title: str
    #: night number (0 = tonight) -> trace ids
    nights: dict[int, set[str]] = field(default_factory=dict)
    first_seen: datetime | None = None
    last_seen: datetime | None = None

    @property
    def tonight(self) -> set[str]:
        return self.nights.get(0, set())

    @property
    def count(self) -> int:
        return sum(len(ids) for ids in self.nights.values())

    @property
    def status(self) -> Status:
        earlier = [n for n, ids in self.nights.items() if n > 0 and ids]
        if not self.tonight:
            return "resolved"
        if not earlier:
            return "new"
        return "recurring" if 1 in earlier else "regressed"

    def add(self, night: int, trace_id: str, seen: datetime | None) -> None:
        self.nights.setdefault(night, set()).add(trace_id)
        if seen is not None:
            self.first_seen = seen if self.first_seen is None or seen < self.first_seen else self.first_seen
            self.last_seen = seen if self.last_seen is None or seen > self.last_seen else self.last_seen


def _founder_terms(terms: frozenset[str]) -> frozenset[str]:
    # longest (most specific) words first, then alphabetical: a bounded, deterministic choice
    return frozenset(sorted(terms, key=lambda w: (-len(w), w))[:MAX_TERMS])


def assign(
    members: Sequence[Member], known: Sequence[Signature], threshold: float = SIMILARITY
) -> dict[str, Signature]:
    """Each member's signature (trace id -> signature), known ones extended, new ones founded.

    A trace already a member of a known signature keeps it (a rerun changes nothing)."""
    by_id = {sig.id: sig for sig in known}
    pools: dict[tuple[str, str], list[Signature]] = {}
    # per pool, each word's signatures: only a signature sharing a word can reach a positive
    # threshold, so a member is scored against those alone, not against its whole pool (5,000
    # members into 1,400 signatures: 0.46 s -> 0.20 s; the pairs grow with the square of a night)
    words: dict[tuple[str, str], dict[str, list[Signature]]] = {}

    def enter(sig: Signature) -> None:
        key = (sig.layer, sig.component)
        pools.setdefault(key, []).append(sig)
        index = words.setdefault(key, {})
        for term in sig.terms:
            index.setdefault(term, []).append(sig)

    for sig in known:
        enter(sig)
    held = {trace_id: sig for sig in known for ids in sig.nights.values() for trace_id in ids}
    out: dict[str, Signature] = {}
    for member in sorted(members, key=lambda m: (m.start is None, m.start or datetime.min, m.trace_id)):
        if member.trace_id in held:
            sig = held[member.trace_id]
            sig.add(0, member.trace_id, member.start)
            out[member.trace_id] = sig
            continue
        terms = member.terms
        key = (member.layer, member.component)
        if threshold > 0:
            shared: dict[str, int] = {}
            for term in terms:
                for sig in words.get(key, {}).get(term, ()):
                    shared[sig.id] = shared.get(sig.id, 0) + 1
            scored = [
                (2 * n / (len(terms) + len(by_id[sid].terms)), sid, by_id[sid]) for sid, n in shared.items()
            ]
        else:
            scored = [(similarity(terms, sig.terms), sig.id, sig) for sig in pools.get(key, [])]
        best = max((s for s in scored if s[0] >= threshold), key=lambda s: (s[0], s[1]), default=None)
        if best is not None:
            sig = best[2]
        else:
            founder = _founder_terms(terms)
            sid = signature_id(member.layer, member.component, founder)
            sig = by_id.get(sid) or Signature(
                id=sid, layer=member.layer, component=member.component, terms=founder, title=member.question
            )
            if sid not in by_id:
                by_id[sid] = sig
                enter(sig)
        sig.add(0, member.trace_id, member.start)
        out[member.trace_id] = sig
    return out


@dataclass
class Night:
    """One night's failures: counts per layer and per owner (night 0 is tonight)."""

    number: int
    start: datetime
    end: datetime
    layers: dict[str, int] = field(default_factory=dict)
    owners: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.layers.values())

    def count(self, layer: str, owners: Iterable[str]) -> None:
        self.layers[layer] = self.layers.get(layer, 0) + 1
        for owner in owners:
            self.owners[owner] = self.owners.get(owner, 0) + 1


@dataclass
class Worklist:
    """Tonight's signatures with their status, the ones resolved, and the nights' counts."""

    signatures: list[Signature]  # seen tonight: most members tonight first
    resolved: list[Signature]
    nights: list[Night]  # tonight first, then the previous nights

    def status_counts(self) -> dict[str, int]:
        counts = {"new": 0, "recurring": 0, "regressed": 0, "resolved": len(self.resolved)}
        for sig in self.signatures:
            counts[sig.status] += 1
        return counts


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

    def wire(self) -> dict[str, Any]:
        """The item in Langfuse's field names (`CreateDatasetItemRequest`'s, and the status): a line
        of a dataset file as it is, the API's body without the status."""
        return {
            "id": self.id,
            "datasetName": self.dataset_name,
            "input": self.input,
            "expectedOutput": self.expected_output,
            "metadata": self.metadata,
            "sourceTraceId": self.source_trace_id,
            "sourceObservationId": self.source_observation_id,
            "status": self.status,
        }


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
