"""Human review: a reviewer's verdict (`Verdict`), score configs, an annotation queue and its items;
the port `triage queue` talks to (Langfuse's annotation queues). The job's decisions are `Decision`
(below), read by `triage.calibration.calibrate` for calibrate, eval and queue alike.

Pure records and the port; the sampling is in `triage.calibration.queue`, the Langfuse calls in
`triage.sources.langfuse.annotations`.

Calibration's records: people's labels, the job's decisions, and how far they agree; a judge's
measurement as `triage calibrate --write` records it for the night (`JudgeMeasure`, one item per
judge in the dataset `CALIBRATION_DATASET`).

`triage.calibration` fills them; `triage.sinks.report` renders them (Markdown, JSON).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field

from triage.domain.records import Confidence, Facts, Layer
from triage.domain.scores import NAMESPACE
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode

#: a reviewer's verdict on an answer: `false_alarm` and `positive` on a thumbs-down say the agent was right
Verdict = Literal["positive", "negative", "false_alarm"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
#: the verdicts that find the agent's answer right
AGENT_RIGHT: frozenset[Verdict] = frozenset({"positive", "false_alarm"})

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


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Category(_Frozen):
    label: str
    value: float


class ScoreConfigSpec(_Frozen):
    """A score config triage needs: what it creates when none of that name exists."""

    name: str
    data_type: ConfigDataType
    #: CATEGORICAL only; a BOOLEAN config's categories are Langfuse's (True 1, False 0)
    categories: list[Category] | None = None
    description: str | None = None
    #: NUMERIC only: the bounds (inclusive; None: open)
    min_value: float | None = None
    max_value: float | None = None


class ScoreConfig(_Frozen):
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


class ReviewQueue(_Frozen):
    """An annotation queue."""

    id: str
    name: str
    score_config_ids: list[str] = Field(default_factory=list)


class QueueItem(_Frozen):
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


#: the judged facts a person can label (the two about the search are read from the trace)
LABELLED_FACTS = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Label(_Record):
    """One reviewer's label on one trace: a layer, some facts, or a verdict (any may be absent)."""

    trace_id: str
    reviewer: str
    layer: Layer | None = None
    facts: dict[str, bool] = Field(default_factory=dict)
    #: a reviewer's verdict: `false_alarm` or `positive` on a thumbs-down means the agent was right
    verdict: Verdict | None = None
    #: where it came from: `file:<line>`, `langfuse`, `store`
    origin: str = ""
    split: str | None = None

    @property
    def ok(self) -> bool | None:
        """Whether the person says the answer was fine (`None`: the label does not say)."""
        if self.layer is not None:
            return self.layer is Layer.OK
        if self.verdict is not None:
            return self.verdict != "negative"
        return None


class Decision(_Record):
    """The job's verdict on one trace, as it stored it (or as a facts file gives it)."""

    trace_id: str
    layer: Layer | None  # None: the rule could not decide (a fact missing)
    facts: Facts | None = None
    confidence: Confidence = "low"
    judge: str | None = None
    url: str | None = None
    component: str | None = None
    owners: list[str] = Field(default_factory=list)
    #: the score's timestamp (the trace's start), where the decision came from a score
    timestamp: datetime | None = None

    @property
    def sure(self) -> bool:
        """A sure verdict (a layer, every judged fact it rests on `high`), else a suggestion."""
        return self.layer is not None and self.confidence == "high"


class BadLabel(_Record):
    """A label set aside, and why: never a crash, never silently dropped."""

    where: str
    trace_id: str | None = None
    reviewer: str | None = None
    reason: str


class ClassScores(_Record):
    label: str
    support: int  # how many times people gave this class
    predicted: int  # how many times the judge gave it
    precision: float | None  # None: the judge never gave it
    recall: float | None  # None: people never gave it
    f1: float | None


class Agreement(_Record):
    """Two raters on the same items: people (rows) against the judge (columns), or person and person."""

    n: int
    agreed: int
    accuracy: float | None
    kappa: float | None  # None: undefined (no items, or both raters used one and the same class)
    kappa_low: float | None  # the 95% interval (asymptotic standard error, Fleiss, Cohen & Everitt 1969)
    kappa_high: float | None
    classes: list[str]
    confusion: list[list[int]]  # confusion[i][j]: people said classes[i], the judge classes[j]
    per_class: list[ClassScores]


class Disagreement(_Record):
    trace_id: str
    url: str | None
    reviewer: str
    human: str
    judge: str
    confidence: Confidence
    #: the labelled facts where the person and the judge differ (`fact: person/judge`)
    facts: list[str] = Field(default_factory=list)


class CoveragePoint(_Record):
    """Agreement on the verdicts kept when the less confident ones are set aside."""

    keep: Literal["all", "medium or high", "high"]
    n: int
    coverage: float | None
    accuracy: float | None
    kappa: float | None


class CalibrationReport(_Record):
    labels: int  # labels read (good and bad)
    decisions: int
    matched: int  # labels with a decision for their trace
    layer: Agreement
    ok_vs_failed: Agreement  # every label that says whether the answer was fine, verdicts included
    facts: dict[str, Agreement]
    people: Agreement | None  # two people on one trace: the ceiling for any judge
    coverage: list[CoveragePoint]
    disagreements: list[Disagreement]
    bad_labels: list[BadLabel]
    min_kappa: float | None = None
    #: the layer agreement of each judge whose decisions were matched (`Decision.judge`; "unknown"
    #: for decisions that name none): what `triage calibrate --write` records per judge
    judges: dict[str, Agreement] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gate_passed(self) -> bool | None:
        """`--min-kappa`: the layer kappa's lower bound at or above it (None: no gate asked)."""
        if self.min_kappa is None:
            return None
        return self.layer.kappa_low is not None and self.layer.kappa_low >= self.min_kappa

    @property
    def exit_code(self) -> ExitCode:
        """`triage calibrate`'s: BELOW_GATE (6) when the `--min-kappa` gate failed, else OK (no gate
        asked is no failure)."""
        return ExitCode.BELOW_GATE if self.gate_passed is False else ExitCode.OK


class EvalMiss(_Record):
    trace_id: str
    human: str
    judge: str
    human_component: str | None = None
    judge_component: str | None = None


class EvalRun(_Record):
    """One judge over one split of a labelled set, through the real `triage feedback`."""

    judge: str
    split: str
    cases: int
    triaged: int
    layer: Agreement
    facts: dict[str, Agreement]
    component_accuracy: float | None
    owner_accuracy: float | None
    judge_calls_per_trace: float | None
    exit_code: int
    error: str | None = None
    #: the sure part: how many labelled cases got a sure verdict, and how many of those are right
    sure_cases: int = 0
    sure_right: int = 0
    #: ... its layer accuracy (None: no sure verdict) and the share of the labelled cases it covers
    sure_accuracy: float | None = None
    sure_coverage: float | None = None
    misses: list[EvalMiss] = Field(default_factory=list)
    #: traces whose layer is right but whose component is not
    component_misses: list[EvalMiss] = Field(default_factory=list)


class EvalReport(_Record):
    set: str
    runs: list[EvalRun]
    #: label lines set aside, with their reasons, as `triage calibrate` lists them
    bad_labels: list[BadLabel] = Field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        """`triage eval`'s: ERROR (1) when some judge's run failed (its error is in the report), else
        OK. A run's own exit code (`EvalRun.exit_code`, a degraded night's 4) is reported, not
        passed on: a judge that left traces undecided was still measured."""
        return ExitCode.ERROR if any(run.error for run in self.runs) else ExitCode.OK


# -- how far a judge has been measured (`triage calibrate --write`, read by the night) ----------

#: the dataset `triage calibrate --write` keeps its measurements in (Langfuse or the embedded store):
#: one item per judge, upserted by a fixed id, so the newest measurement is the item and Langfuse's
#: item versions keep the earlier ones
CALIBRATION_DATASET = "triage-calibrations"
CALIBRATION_DATASET_DESCRIPTION = (
    "How far each judge's verdicts agree with people's labels: one item per judge, written by "
    "`triage calibrate --write` and read by `triage feedback` for its report. Not regression cases."
)


class JudgeMeasure(_Record):
    """The last `triage calibrate --write` agreement of one judge with people's layer labels."""

    judge: str
    kappa: float | None
    kappa_low: float | None  # the 95% interval
    kappa_high: float | None
    accuracy: float | None
    labels: int  # layer labels compared with this judge's decisions
    measured_at: datetime
    since_hours: float  # the labels' window
    rule_version: str

    @classmethod
    def of(
        cls, judge: str, layer: Agreement, *, measured_at: datetime, since_hours: float, rule_version: str
    ) -> JudgeMeasure:
        return cls(
            judge=judge,
            kappa=layer.kappa,
            kappa_low=layer.kappa_low,
            kappa_high=layer.kappa_high,
            accuracy=layer.accuracy,
            labels=layer.n,
            measured_at=measured_at,
            since_hours=since_hours,
            rule_version=rule_version,
        )


def measure_item_id(judge: str) -> str:
    """The item of `judge` in `CALIBRATION_DATASET`: fixed forever, so a new measurement replaces it."""
    return str(uuid.uuid5(NAMESPACE, "calibration:" + json.dumps(judge, ensure_ascii=False)))


def measure_item(measure: JudgeMeasure) -> DatasetItem:
    """The dataset item that holds `measure` (its figures in the metadata, the judge as the input)."""
    return DatasetItem(
        id=measure_item_id(measure.judge),
        dataset_name=CALIBRATION_DATASET,
        input={"judge": measure.judge},
        metadata=measure.model_dump(mode="json"),
    )


def measure_of(items: Mapping[str, DatasetItem], judge: str) -> JudgeMeasure | None:
    """`judge`'s measurement among the dataset's items (by id, as a `DatasetSink` reads them), or
    None: unmeasured (no item, an archived one, or one that is not a measurement)."""
    item = items.get(measure_item_id(judge))
    if item is None or item.status != "ACTIVE":
        return None
    try:
        measure = JudgeMeasure.model_validate(item.metadata)
    except ValueError:  # edited by hand into something else: unmeasured, never a crash
        return None
    return measure if measure.judge == judge else None
