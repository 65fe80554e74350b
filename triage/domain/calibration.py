"""Calibration's records: people's labels, the job's decisions, and how far they agree.

`triage.calibration` fills them; `triage.sinks.calibration` renders them (Markdown, JSON).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from triage.domain.records import Facts, Layer
from triage.domain.relay import Verdict
from triage.domain.rule import Confidence

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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gate_passed(self) -> bool | None:
        """`--min-kappa`: the layer kappa's lower bound at or above it (None: no gate asked)."""
        if self.min_kappa is None:
            return None
        return self.layer.kappa_low is not None and self.layer.kappa_low >= self.min_kappa


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
    misses: list[EvalMiss] = Field(default_factory=list)
    #: traces whose layer is right but whose component is not
    component_misses: list[EvalMiss] = Field(default_factory=list)


class EvalReport(_Record):
    set: str
    runs: list[EvalRun]
    #: label lines set aside, with their reasons, as `triage calibrate` lists them
    bad_labels: list[BadLabel] = Field(default_factory=list)
