"""Compare the job's decisions with people's labels: per layer, per fact, person to person, by confidence."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import combinations
from pathlib import Path

from triage.calibration.agreement import agreement
from triage.calibration.decisions import decisions_from_facts_file, decisions_from_scores
from triage.calibration.labels import label_score_names, labels_from_file, labels_from_scores
from triage.domain.calibration import (
    LABELLED_FACTS,
    Agreement,
    BadLabel,
    CalibrationReport,
    CoveragePoint,
    Decision,
    Disagreement,
    Label,
)
from triage.domain.config import TriageConfig
from triage.domain.kernel import window
from triage.domain.ports import ScoreReader
from triage.domain.records import Layer

#: how far before the labels' window the job's decisions are read (they carry their trace's time)
DECISION_LOOKBACK = timedelta(days=30)
UNDECIDED = "undecided"  # the judge's class for a trace the rule could not decide
LAYER_CLASSES = [layer.value for layer in Layer]
_KEEP: list[tuple[str, set[str]]] = [
    ("all", {"high", "medium", "low"}),
    ("medium or high", {"high", "medium"}),
    ("high", {"high"}),
]


@dataclass(frozen=True)
class CalibrateOptions:
    since_hours: float = 24 * 30
    labels_file: Path | None = None  # else people's scores (Langfuse annotations, verdicts)
    facts_file: Path | None = None  # else the job's layer scores
    min_kappa: float | None = None
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def needs_store(self) -> bool:
        return self.labels_file is None or self.facts_file is None


def _judge_layer(decision: Decision) -> str:
    return decision.layer.value if decision.layer is not None else UNDECIDED


def _fact_value(decision: Decision, fact: str) -> bool | None:
    if decision.facts is None:
        return None
    value = getattr(decision.facts, fact)
    return value if isinstance(value, bool) else None


def calibrate(
    labels: Sequence[Label],
    decisions: Mapping[str, Decision],
    bad_labels: Sequence[BadLabel] = (),
    *,
    link: Callable[[str], str | None] = lambda trace_id: None,
    min_kappa: float | None = None,
) -> CalibrationReport:
    """The agreement report. Labels on traces with no decision are listed as bad labels."""
    bad = list(bad_labels)
    matched: list[tuple[Label, Decision]] = []
    for label in labels:
        decision = decisions.get(label.trace_id)
        if decision is None:
            bad.append(
                BadLabel(
                    where=label.origin,
                    trace_id=label.trace_id,
                    reviewer=label.reviewer,
                    reason="the trace was never triaged (no triage decision for it)",
                )
            )
            continue
        matched.append((label, decision))

    layer_pairs = [(lab.layer.value, _judge_layer(dec)) for lab, dec in matched if lab.layer is not None]
    ok_pairs = [
        ("ok" if lab.ok else "failed", UNDECIDED if dec.layer is None else "ok" if dec.layer is Layer.OK else "failed")
        for lab, dec in matched
        if lab.ok is not None
    ]
    facts: dict[str, Agreement] = {}
    for fact in LABELLED_FACTS:
        pairs = [
            (str(lab.facts[fact]).lower(), str(judged).lower())
            for lab, dec in matched
            if fact in lab.facts and (judged := _fact_value(dec, fact)) is not None
        ]
        if pairs:
            facts[fact] = agreement(pairs, ["true", "false"])

    disagreements = []
    for lab, dec in matched:
        if lab.layer is None or lab.layer.value == _judge_layer(dec):
            continue
        differ = [
            f"{fact}: {str(value).lower()}/{str(_fact_value(dec, fact)).lower()}"
            for fact, value in lab.facts.items()
            if _fact_value(dec, fact) != value
        ]
        disagreements.append(
            Disagreement(
                trace_id=lab.trace_id,
                url=dec.url or link(lab.trace_id),
                reviewer=lab.reviewer,
                human=lab.layer.value,
                judge=_judge_layer(dec),
                confidence=dec.confidence,
                facts=differ,
            )
        )

    coverage = []
    layered = [(lab, dec) for lab, dec in matched if lab.layer is not None]
    for keep, levels in _KEEP:
        kept = [(lab, dec) for lab, dec in layered if dec.confidence in levels]
        figures = agreement([(lab.layer.value, _judge_layer(dec)) for lab, dec in kept if lab.layer], LAYER_CLASSES)
        coverage.append(
            CoveragePoint(
                keep=keep,  # type: ignore[arg-type]
                n=len(kept),
                coverage=len(kept) / len(layered) if layered else None,
                accuracy=figures.accuracy,
                kappa=figures.kappa,
            )
        )

    return CalibrationReport(
        labels=len(labels) + len(bad_labels),
        decisions=len(decisions),
        matched=len(matched),
        layer=agreement(layer_pairs, LAYER_CLASSES),
        ok_vs_failed=agreement(ok_pairs, ["ok", "failed"]),
        facts=facts,
        people=people_agreement(labels),
        coverage=coverage,
        disagreements=disagreements,
        bad_labels=bad,
        min_kappa=min_kappa,
    )


def people_agreement(labels: Sequence[Label]) -> Agreement | None:
    """Layer agreement between people who labelled the same trace (every pair of reviewers, pooled)."""
    by_trace: dict[str, list[Label]] = defaultdict(list)
    for label in labels:
        if label.layer is not None:
            by_trace[label.trace_id].append(label)
    pairs = []
    for group in by_trace.values():
        ordered = sorted(group, key=lambda lab: lab.reviewer)
        for first, second in combinations(ordered, 2):
            assert first.layer is not None and second.layer is not None
            pairs.append((first.layer.value, second.layer.value))
    return agreement(pairs, LAYER_CLASSES) if pairs else None


def calibrate_from(
    reader: ScoreReader | None,
    config: TriageConfig,
    options: CalibrateOptions,
    *,
    link: Callable[[str], str | None] = lambda trace_id: None,
) -> CalibrationReport:
    """Read labels and decisions (files where given, else scores from `reader`) and compare them."""
    start, end = window(options.now, options.since_hours)
    bad: list[BadLabel] = []
    if options.labels_file is not None:
        labels, bad = labels_from_file(options.labels_file)
    else:
        assert reader is not None
        names = label_score_names(config.calibration)
        labels, bad = labels_from_scores(reader.scores(names, start, end), config.calibration)
    issues = config.agent.issues_collection
    if options.facts_file is not None:
        decisions, bad_facts = decisions_from_facts_file(options.facts_file, issues)
        bad += bad_facts
    else:
        assert reader is not None
        # a layer score is timestamped with its trace's start, which may be well before the label
        rows = reader.scores([config.scores.layer], start - DECISION_LOOKBACK, end)
        decisions = decisions_from_scores(rows, config.scores.layer, config.rule_version, issues)
    return calibrate(labels, decisions, bad, link=link, min_kappa=options.min_kappa)
