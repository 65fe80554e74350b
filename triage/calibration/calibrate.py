"""Compare the job's decisions with people's labels: per layer, per fact, person to person, by confidence.

Agreement between two raters (`agreement`): raw agreement, Cohen's kappa with its 95% interval
(`triage.domain.stats.cohen_kappa`), per-class scores.

Computed here rather than with a statistics package so the job needs no numpy or scipy; the
tests check every figure against scikit-learn and statsmodels on labelled fixtures.

The job's decisions: its `triage_layer` scores (facts in their metadata), or a run's facts file.

People's labels: from a local JSONL file, or from scores people wrote (Langfuse annotation, verdicts).

A label file has one JSON object per line:

    {"trace_id": "t-1", "reviewer": "ana", "layer": "retrieval",
     "facts": {"retrieved_has_answer": false, "index_has_answer": true}, "verdict": "negative"}

`layer`, `facts` and `verdict` are each optional (but one is needed); `reviewer` defaults to
`file`. Extra fields are ignored (an evaluation set's label file carries its own). A bad line
becomes a `BadLabel` with its line number; so do two labels from one reviewer for one trace
(both set aside: which one is right is not ours to guess).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import combinations
from pathlib import Path
from typing import Any

from triage import jsonl
from triage.domain.config import CalibrationConfig, ReviewNames, TriageConfig
from triage.domain.kernel import Window
from triage.domain.ports import ScoreReader
from triage.domain.records import Layer, StoredScore
from triage.domain.review import (
    CALIBRATION_DATASET,
    CALIBRATION_DATASET_DESCRIPTION,
    LABELLED_FACTS,
    VERDICTS,
    Agreement,
    BadLabel,
    CalibrationReport,
    ClassScores,
    CoveragePoint,
    Decision,
    Disagreement,
    JudgeMeasure,
    Label,
    Verdict,
    measure_item,
)
from triage.domain.rule import Undetermined, decide, verdict_confidence
from triage.domain.scores import JobScoreNames, current_scores, facts_of, is_end_user, normalise_author
from triage.domain.stats import cohen_kappa
from triage.domain.worklist import DatasetSink, DatasetWriteOutcome
from triage.errors import InputError


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def agreement(pairs: Sequence[tuple[str, str]], classes: Sequence[str] = ()) -> Agreement:
    """How far the first rater (people) and the second (the judge) agree on `pairs`.

    `classes` fixes the order of the confusion matrix; classes seen in `pairs` but not listed
    are appended in sorted order.
    """
    seen = {c for pair in pairs for c in pair}
    order = list(dict.fromkeys(classes)) + sorted(seen - set(classes))
    index = {c: i for i, c in enumerate(order)}
    k = len(order)
    table = [[0] * k for _ in range(k)]
    for first, second in pairs:
        table[index[first]][index[second]] += 1
    n = len(pairs)
    agreed = sum(table[i][i] for i in range(k))
    rows = [sum(table[i]) for i in range(k)]
    cols = [sum(table[i][j] for i in range(k)) for j in range(k)]
    per_class = []
    for i, label in enumerate(order):
        precision = _ratio(table[i][i], cols[i])
        recall = _ratio(table[i][i], rows[i])
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall
            else (0.0 if precision is not None and recall is not None else None)
        )
        per_class.append(
            ClassScores(label=label, support=rows[i], predicted=cols[i], precision=precision, recall=recall, f1=f1)
        )
    kappa, low, high = cohen_kappa(table)
    return Agreement(
        n=n,
        agreed=agreed,
        accuracy=_ratio(agreed, n),
        kappa=kappa,
        kappa_low=low,
        kappa_high=high,
        classes=order,
        confusion=table,
        per_class=per_class,
    )


_NOT_FACTS = {"trace_id", "judge", "prompt_version"}


def decisions_from_scores(
    scores: Sequence[StoredScore],
    layer_score: str,
    rule_version: str,
    issues_collection: str = "issues",
    component_score: str | None = None,
    *,
    current_only: bool = False,
) -> dict[str, Decision]:
    """One decision per trace from the job's current layer scores (`domain.scores.current_scores`).
    With `current_only`, this rule version's only, and a score whose value is not a layer is no
    decision. With `component_score`, the component comes from that score (same choice of row)."""
    names = JobScoreNames(layer=layer_score, component=component_score)
    out = {}
    for trace_id, held in current_scores(scores, names, rule_version, current_only=current_only).items():
        if held.layer is None:
            continue
        layer = held.layer_value
        if layer is None and current_only:
            continue
        meta = held.verdict
        out[trace_id] = Decision(
            trace_id=trace_id,
            layer=layer,
            facts=meta.facts,
            confidence=verdict_confidence(meta.facts, issues_collection) if meta.facts else "low",
            judge=meta.judge,
            component=held.component_value,
            owners=meta.owners,
            timestamp=held.layer.timestamp,
        )
    return out


def decisions_from_facts_file(
    path: Path, issues_collection: str = "issues"
) -> tuple[dict[str, Decision], list[BadLabel]]:
    """One decision per trace of a facts file (the last line of a trace wins, as in a replay)."""
    try:
        raw = path.read_bytes()
    except OSError as ex:
        raise InputError(f"cannot read the facts file {path}: {ex.strerror or ex}") from ex
    out: dict[str, Decision] = {}
    bad: list[BadLabel] = []
    for number, line in jsonl.lines(raw):
        where = f"{path.name}:{number}"
        try:
            record = jsonl.parse(line)
        except ValueError as ex:  # not JSON, not UTF-8, or too deep
            bad.append(BadLabel(where=where, reason=f"facts file line is not JSON: {str(ex)[:120]}"))
            continue
        trace_id = record.get("trace_id") if isinstance(record, dict) else None
        facts = facts_of({k: v for k, v in record.items() if k not in _NOT_FACTS}) if trace_id else None
        if not isinstance(trace_id, str) or facts is None:
            bad.append(BadLabel(where=where, reason="facts file line is not a trace's facts"))
            continue
        try:
            layer: Layer | None = decide(facts, issues_collection)
        except Undetermined:
            layer = None
        judge = record.get("judge")
        out[trace_id] = Decision(
            trace_id=trace_id,
            layer=layer,
            facts=facts,
            confidence=verdict_confidence(facts, issues_collection),
            judge=judge if isinstance(judge, str) else None,
        )
    return out, bad


LAYERS = [layer.value for layer in Layer]
MAX_REASON_VALUE = 60  # how much of a bad value a reason quotes


def _quote(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_REASON_VALUE else text[:MAX_REASON_VALUE] + "..."


def _layer(value: Any) -> Layer:
    if not isinstance(value, str) or value not in LAYERS:
        raise ValueError(f"unknown layer {_quote(value)} (one of {', '.join(LAYERS)})")
    return Layer(value)


def _verdict(value: Any) -> Verdict:
    if value not in VERDICTS:
        raise ValueError(f"unknown verdict {_quote(value)} (one of {', '.join(VERDICTS)})")
    verdict: Verdict = value
    return verdict


def _fact(name: str, value: Any) -> bool:
    if name not in LABELLED_FACTS:
        raise ValueError(f"unknown fact {_quote(name)} (one of {', '.join(LABELLED_FACTS)})")
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    raise ValueError(f"fact {name} is {_quote(value)}, not true or false")


def _one_per_reviewer(labels: Iterable[Label], bad: list[BadLabel]) -> list[Label]:
    groups: dict[tuple[str, str], list[Label]] = defaultdict(list)
    for label in labels:
        groups[(label.trace_id, label.reviewer)].append(label)
    kept = []
    for (trace_id, reviewer), group in groups.items():
        if len(group) == 1:
            kept.append(group[0])
            continue
        where = ", ".join(label.origin for label in group)
        bad.append(
            BadLabel(
                where=where,
                trace_id=trace_id,
                reviewer=reviewer,
                reason=f"{len(group)} labels from one reviewer for one trace (all set aside)",
            )
        )
    return kept


def labels_from_file(path: Path) -> tuple[list[Label], list[BadLabel]]:
    """The labels of a JSONL file, and the lines set aside with their reasons."""
    try:
        raw = path.read_bytes()
    except OSError as ex:
        raise InputError(f"cannot read the labels file {path}: {ex.strerror or ex}") from ex
    labels: list[Label] = []
    bad: list[BadLabel] = []
    for number, line in jsonl.lines(raw):
        where = f"{path.name}:{number}"
        try:
            record = jsonl.parse(line)
        except ValueError as ex:  # not JSON, not UTF-8, too deep, or a lone surrogate (jsonl.parse says which)
            undecodable = isinstance(ex, json.JSONDecodeError | UnicodeDecodeError)
            reason = f"not a JSON object: {str(ex)[:120]}" if undecodable else str(ex)
            bad.append(BadLabel(where=where, reason=reason))
            continue
        try:
            labels.append(_label_from_record(record, where))
        except ValueError as ex:
            trace_id = record.get("trace_id") if isinstance(record, dict) else None
            reviewer = record.get("reviewer") if isinstance(record, dict) else None
            bad.append(
                BadLabel(
                    where=where,
                    trace_id=trace_id if isinstance(trace_id, str) else None,
                    reviewer=reviewer if isinstance(reviewer, str) else None,
                    reason=str(ex),
                )
            )
    return _one_per_reviewer(labels, bad), bad


def _label_from_record(record: Any, where: str) -> Label:
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    trace_id = record.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        raise ValueError("no trace_id")
    reviewer = record.get("reviewer", "file")
    if not isinstance(reviewer, str) or not reviewer:
        raise ValueError(f"reviewer is {_quote(reviewer)}, not a name")
    facts_in = record.get("facts") or {}
    if not isinstance(facts_in, dict):
        raise ValueError("facts is not an object")
    # an evaluation set's facts carry more than people label (the component, the sources)
    facts = {name: _fact(name, value) for name, value in facts_in.items() if name in LABELLED_FACTS}
    layer = _layer(record["layer"]) if record.get("layer") is not None else None
    verdict = _verdict(record["verdict"]) if record.get("verdict") is not None else None
    if layer is None and verdict is None and not facts:
        raise ValueError("no layer, facts or verdict")
    split = record.get("split")
    return Label(
        trace_id=trace_id,
        reviewer=reviewer,
        layer=layer,
        facts=facts,
        verdict=verdict,
        origin=where,
        split=split if isinstance(split, str) else None,
    )


def labels_from_scores(
    scores: Sequence[StoredScore], names: CalibrationConfig
) -> tuple[list[Label], list[BadLabel]]:
    """People's labels among `scores`: the layer score, the per-fact scores, the verdict score.

    One reviewer's scores on one trace make one label; two scores of the same name from one
    reviewer on one trace are a bad label (both set aside).
    """
    review = ReviewNames.of(names)
    fact_of = {score: fact for fact, score in review.facts.items()}
    grouped: dict[tuple[str, str], list[StoredScore]] = defaultdict(list)
    bad: list[BadLabel] = []
    for score in scores:
        where = f"score {score.id}"
        if score.trace_id is None:
            bad.append(BadLabel(where=where, reason=f"{score.name} is not on a trace"))
            continue
        if score.author is None:
            bad.append(BadLabel(where=where, trace_id=score.trace_id, reason=f"{score.name} names no reviewer"))
            continue
        if is_end_user(score.author):
            continue  # an end user's verdict is a vote on the answer, not a reviewer's label
        grouped[(score.trace_id, normalise_author(score.author))].append(score)
    labels = []
    for (trace_id, reviewer), group in grouped.items():
        by_name: dict[str, list[StoredScore]] = defaultdict(list)
        for score in group:
            by_name[score.name].append(score)
        twice = [name for name, rows in by_name.items() if len(rows) > 1]
        where = ", ".join(f"score {s.id}" for s in group)
        if twice:
            bad.append(
                BadLabel(
                    where=where,
                    trace_id=trace_id,
                    reviewer=reviewer,
                    reason=f"two {', '.join(twice)} scores from one reviewer for one trace (all set aside)",
                )
            )
            continue
        try:
            layer = verdict = None
            facts: dict[str, bool] = {}
            for name, (score,) in by_name.items():
                if name == review.layer:
                    layer = _layer(score.value)
                elif name == review.verdict:
                    verdict = _verdict(score.value)
                elif name in fact_of:
                    facts[fact_of[name]] = _fact(fact_of[name], score.value)
        except ValueError as ex:
            bad.append(BadLabel(where=where, trace_id=trace_id, reviewer=reviewer, reason=str(ex)))
            continue
        if layer is None and verdict is None and not facts:
            continue
        labels.append(
            Label(trace_id=trace_id, reviewer=reviewer, layer=layer, facts=facts, verdict=verdict, origin="scores")
        )
    return labels, bad


def label_score_names(names: CalibrationConfig) -> list[str]:
    """Every score name a label can come from."""
    return ReviewNames.of(names).labels()


#: how far before the labels' window the job's decisions are read (they carry their trace's time)
DECISION_LOOKBACK = timedelta(days=30)
UNDECIDED = "undecided"  # the judge's class for a trace the rule could not decide
UNKNOWN_JUDGE = "unknown"  # the judge of decisions that name none (older scores, a bare facts file)
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
    #: record each judge's agreement where the night reads it (`record_measures`)
    write: bool = False

    @property
    def needs_store(self) -> bool:
        return self.write or self.labels_file is None or self.facts_file is None


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

    by_judge: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for lab, dec in layered:
        assert lab.layer is not None
        by_judge[dec.judge or UNKNOWN_JUDGE].append((lab.layer.value, _judge_layer(dec)))

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
        judges={judge: agreement(pairs, LAYER_CLASSES) for judge, pairs in sorted(by_judge.items())},
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
    window: Window,
    link: Callable[[str], str | None] = lambda trace_id: None,
) -> CalibrationReport:
    """Read labels and decisions (files where given, else scores from `reader`) in `window` and
    compare them."""
    start, end = window.start, window.end
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


# -- the measurement the night reads (`triage calibrate --write`) ------------------------------


def judge_measures(report: CalibrationReport, options: CalibrateOptions, rule_version: str) -> list[JudgeMeasure]:
    """One measurement per judge the labels were compared with (decisions naming no judge are not
    recorded: no night can ask for them)."""
    return [
        JudgeMeasure.of(
            judge, layer, measured_at=options.now, since_hours=options.since_hours, rule_version=rule_version
        )
        for judge, layer in report.judges.items()
        if judge != UNKNOWN_JUDGE and layer.n > 0
    ]


def record_measures(sink: DatasetSink, measures: Sequence[JudgeMeasure]) -> DatasetWriteOutcome:
    """Upsert each judge's measurement into `CALIBRATION_DATASET` (made when missing)."""
    if not measures:
        return DatasetWriteOutcome()
    sink.ensure_dataset(CALIBRATION_DATASET, CALIBRATION_DATASET_DESCRIPTION, {"written_by": "triage calibrate"})
    return sink.upsert_dataset_items([measure_item(m) for m in measures])
