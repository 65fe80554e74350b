"""The job's decisions: its `triage_layer` scores (facts in their metadata), or a run's facts file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from triage import jsonl
from triage.domain.calibration import BadLabel, Decision
from triage.domain.records import Layer, StoredScore
from triage.domain.rule import Undetermined, decide, verdict_confidence
from triage.domain.verdicts import JobScoreNames, current_scores, facts_of
from triage.errors import InputError

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
    """One decision per trace from the job's current layer scores (`domain.verdicts.current_scores`).
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
