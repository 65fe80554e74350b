"""The job's verdicts as stored: what its scores' metadata holds, and its current decision per trace.

The job writes three scores per triaged trace (`triage_layer`, `triage_component`,
`triage_signature`); their metadata are `VerdictMeta` and `SignatureMeta`, written with
`to_metadata` and read with `from_stored` (a stored row is untrusted: a field of the wrong kind
reads as missing, never as an error). `current_scores` is the one rule for "the job's current
decision per trace" that calibrate, queue, eval, promote and the worklist share: this rule
version's row where there is one, else the newest; people's annotations under the same names
are not the job's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from triage.domain.records import Facts, Layer, StoredScore, is_the_jobs
from triage.domain.scores import score_id

_LAYERS = {layer.value for layer in Layer}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def facts_of(raw: object) -> Facts | None:
    """Facts from stored or logged JSON; None when it holds none (a wrong kind reads as missing)."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return Facts.model_validate(raw)
    except ValidationError:
        return None


def _meta(metadata: object) -> Mapping[str, Any]:
    return metadata if isinstance(metadata, Mapping) else {}


@dataclass(frozen=True)
class VerdictMeta:
    """The metadata of the job's layer and component scores."""

    facts: Facts | None
    judge: str | None
    prompt_version: str | None
    rule_version: str | None
    owners: list[str] = field(default_factory=list)
    component_from: str | None = None
    votes: list[str] = field(default_factory=list)

    def to_metadata(self) -> dict[str, Any]:
        return {
            "facts": self.facts.model_dump(mode="json") if self.facts is not None else None,
            "judge": self.judge,
            "prompt_version": self.prompt_version,
            "rule_version": self.rule_version,
            "owners": list(self.owners),
            "component_from": self.component_from,
            "votes": list(self.votes),
        }

    @classmethod
    def from_stored(cls, metadata: object) -> VerdictMeta:
        meta = _meta(metadata)
        version = meta.get("rule_version")
        return cls(
            facts=facts_of(meta.get("facts")),
            judge=_text(meta.get("judge")),
            prompt_version=_text(meta.get("prompt_version")),
            rule_version=str(version) if version is not None else None,
            owners=_texts(meta.get("owners")),
            component_from=_text(meta.get("component_from")),
            votes=_texts(meta.get("votes")),
        )


@dataclass(frozen=True)
class SignatureMeta:
    """The metadata of the job's signature score: what later nights need to read it back."""

    layer: str
    component: str
    owners: list[str]
    terms: list[str]
    title: str
    rule_version: str | None

    def to_metadata(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "component": self.component,
            "owners": list(self.owners),
            "terms": sorted(self.terms),
            "title": self.title,
            "rule_version": self.rule_version,
        }

    @classmethod
    def from_stored(cls, metadata: object) -> SignatureMeta:
        meta = _meta(metadata)
        version = meta.get("rule_version")
        return cls(
            layer=str(meta.get("layer", "")),
            component=str(meta.get("component", "")),
            owners=_texts(meta.get("owners")),
            terms=_texts(meta.get("terms")),
            title=str(meta.get("title", "")),
            rule_version=str(version) if version is not None else None,
        )


@dataclass
class JobScores:
    """The job's current scores on one trace (None: it wrote none of that name)."""

    layer: StoredScore | None = None
    component: StoredScore | None = None
    signature: StoredScore | None = None

    @property
    def verdict(self) -> VerdictMeta:
        return VerdictMeta.from_stored(self.layer.metadata if self.layer else None)

    @property
    def layer_value(self) -> Layer | None:
        value = self.layer.value if self.layer is not None else None
        return Layer(value) if isinstance(value, str) and value in _LAYERS else None

    @property
    def component_value(self) -> str | None:
        value = self.component.value if self.component is not None else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class JobScoreNames:
    layer: str
    component: str | None = None
    signature: str | None = None


def current_scores(
    scores: Sequence[StoredScore], names: JobScoreNames, rule_version: str, *, current_only: bool = False
) -> dict[str, JobScores]:
    """Per trace, the job's current layer, component and signature scores: this rule version's
    row where there is one, else the newest (ties: the larger id). With `current_only`, this rule
    version's only (the id the job gives it)."""
    named = ((names.layer, "layer"), (names.component, "component"), (names.signature, "signature"))
    slots = {name: slot for name, slot in named if name is not None}
    out: dict[str, JobScores] = {}

    def rank(score: StoredScore) -> tuple[bool, datetime, str]:
        return (str(_meta(score.metadata).get("rule_version")) == rule_version, score.timestamp, score.id)

    for score in scores:
        slot = slots.get(score.name)
        if slot is None or score.trace_id is None or not is_the_jobs(score):
            continue
        if current_only and score.id != score_id(score.trace_id, score.name, rule_version):
            continue
        held = out.setdefault(score.trace_id, JobScores())
        current: StoredScore | None = getattr(held, slot)
        if current is None or rank(score) > rank(current):
            setattr(held, slot, score)
    return out
