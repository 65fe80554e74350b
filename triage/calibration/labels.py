"""People's labels: from a local JSONL file, or from scores people wrote (Langfuse annotation, verdicts).

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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from triage import jsonl
from triage.domain.calibration import LABELLED_FACTS, BadLabel, Label
from triage.domain.config import CalibrationConfig
from triage.domain.records import Layer, StoredScore
from triage.domain.relay import VERDICTS, ReviewNames, Verdict
from triage.domain.scores import is_end_user, normalise_author
from triage.errors import InputError

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
