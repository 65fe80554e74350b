"""Human review: score configs, an annotation queue and its items; the port `triage queue` talks
to (Langfuse's annotation queues). The job's decisions are `triage.domain.calibration.Decision`,
read by `triage.calibration.decisions` for calibrate, eval and queue alike.

Pure records and the port; the sampling is in `triage.calibration.queue`, the Langfuse calls in
`triage.sources.langfuse.annotations`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

ConfigDataType = Literal["CATEGORICAL", "BOOLEAN", "NUMERIC", "TEXT"]
ObjectType = Literal["TRACE", "OBSERVATION", "SESSION"]

#: Langfuse's rule for a score config's name (`CreateScoreConfigRequest.name`)
CONFIG_NAME = re.compile(r"^[A-Za-z0-9_ .()\-]{1,35}$")


def config_name_problem(name: str) -> str | None:
    """Why Langfuse would refuse `name` as a score config's name, or None."""
    if not name or len(name) > 35:
        return f"score config name {name!r} must be 1-35 characters"
    if not CONFIG_NAME.match(name):
        return (
            f"score config name {name!r} may hold only letters, digits, underscores, spaces, periods, "
            "parentheses and hyphens"
        )
    return None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Category(_Record):
    label: str
    value: float


class ScoreConfigSpec(_Record):
    """A score config triage needs: what it creates when none of that name exists."""

    name: str
    data_type: ConfigDataType
    #: CATEGORICAL only; a BOOLEAN config's categories are Langfuse's (True 1, False 0)
    categories: list[Category] | None = None
    description: str | None = None
    #: NUMERIC only: the bounds (inclusive; None: open)
    min_value: float | None = None
    max_value: float | None = None


class ScoreConfig(_Record):
    """A score config as Langfuse holds it."""

    id: str
    name: str
    data_type: str
    is_archived: bool = False
    categories: list[Category] | None = None
    description: str | None = None
    min_value: float | None = None
    max_value: float | None = None

    def problem(self, spec: ScoreConfigSpec) -> str | None:
        """Why this config cannot take the scores `spec` describes, or None (Langfuse drops a score
        that does not fit its config silently, in its worker, after answering 202)."""
        if self.is_archived:
            return "it is archived"
        if self.data_type != spec.data_type:
            return f"it is {self.data_type}, not {spec.data_type}"
        if spec.data_type == "CATEGORICAL":
            have = sorted(c.label for c in self.categories or [])
            want = sorted(c.label for c in spec.categories or [])
            if have != want:
                return f"its categories are {have}, not {want}"
        if spec.data_type == "NUMERIC" and (self.min_value, self.max_value) != (spec.min_value, spec.max_value):
            return f"its bounds are [{self.min_value}, {self.max_value}], not [{spec.min_value}, {spec.max_value}]"
        return None


class ReviewQueue(_Record):
    """An annotation queue."""

    id: str
    name: str
    score_config_ids: list[str] = Field(default_factory=list)


class QueueItem(_Record):
    """One item of an annotation queue: the object a reviewer is shown, nothing else."""

    id: str
    object_id: str
    object_type: str
    status: str


class AnnotationPort(Protocol):
    """Score configs and annotation queues (Langfuse). Raise `LangfuseError`, or `ConfigError`
    for refused credentials."""

    def score_configs(self) -> list[ScoreConfig]:
        """Every score config of the project, archived ones included."""
        ...

    def create_score_config(self, spec: ScoreConfigSpec) -> ScoreConfig: ...

    def queues(self) -> list[ReviewQueue]:
        """Every annotation queue of the project."""
        ...

    def create_queue(
        self, name: str, description: str | None, score_config_ids: Sequence[str]
    ) -> ReviewQueue:
        """Create the queue; the existing one when a queue of that name appeared meanwhile."""
        ...

    def queue_items(self, queue_id: str) -> list[QueueItem]:
        """Every item of the queue, whatever its status."""
        ...

    def add_item(self, queue_id: str, object_id: str, object_type: ObjectType = "TRACE") -> QueueItem:
        """Add one item. The server does not de-duplicate items: the caller checks first. A write
        whose answer was lost is checked by re-reading the items, never blindly sent again."""
        ...


@dataclass
class ConfigsFound:
    """What `ensure_configs` found: a config id per spec name that has one, the names it created,
    and the names whose existing config does not fit (with why)."""

    ids: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    misfits: dict[str, str] = field(default_factory=dict)


def ensure_configs(
    port: AnnotationPort, specs: Sequence[ScoreConfigSpec], *, dry_run: bool = False, strict: bool = False
) -> ConfigsFound:
    """The one way triage maps its scores to Langfuse score configs (the relay's declared model,
    `triage queue`'s reviewer scores): an unarchived config of the spec's name that fits is used;
    none of that name is created (not with `dry_run`, nor with `strict` once any misfits); one that
    does not fit is a misfit, left alone (the caller decides whether that is an error)."""
    existing = [c for c in port.score_configs() if not c.is_archived]
    found = ConfigsFound()
    for spec in specs:
        same_name = [c for c in existing if c.name == spec.name]
        fitting = [c for c in same_name if c.problem(spec) is None]
        if fitting:
            found.ids[spec.name] = fitting[0].id
        elif same_name:
            found.misfits[spec.name] = f"id {same_name[0].id}: {same_name[0].problem(spec)}"
        else:
            found.created.append(spec.name)
    if dry_run or (strict and found.misfits):
        return found
    for spec in specs:
        if spec.name in found.created:
            found.ids[spec.name] = port.create_score_config(spec).id
    return found
