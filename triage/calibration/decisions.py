"""The job's decisions: its `triage_layer` scores (facts in their metadata), or a run's facts file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from triage.domain.calibration import BadLabel, Decision
from triage.domain.confidence import verdict_confidence
from triage.domain.records import Facts, Layer, StoredScore, is_the_jobs
from triage.domain.rule import Undetermined, decide
from triage.domain.scores import score_id
from triage.errors import InputError

_NOT_FACTS = {"trace_id", "judge", "prompt_version"}
_LAYERS = {layer.value for layer in Layer}


def _facts(raw: Any) -> Facts | None:
    if not isinstance(raw, dict):
        return None
    try:
        return Facts.model_validate(raw)
    except ValidationError:
        return None


def decisions_from_scores(
    scores: Sequence[StoredScore],
    layer_score: str,
    rule_version: str,
    issues_collection: str = "issues",
    component_score: str | None = None,
    *,
    current_only: bool = False,
) -> dict[str, Decision]:
    """One decision per trace from the job's layer scores (people's annotations under the same
    name are not decisions): this rule version's where there is one, else the newest. With
    `current_only`, this rule version's only (the score id the job gives it), and a score whose
    value is not a layer is no decision.

    With `component_score`, the component comes from that score (same choice of row)."""
    best: dict[str, StoredScore] = {}
    components: dict[str, StoredScore] = {}

    def rank(score: StoredScore) -> tuple[bool, Any]:
        meta = score.metadata if isinstance(score.metadata, dict) else {}
        return (str(meta.get("rule_version")) == rule_version, score.timestamp)

    for score in scores:
        if score.trace_id is None or score.name not in (layer_score, component_score):
            continue
        if not is_the_jobs(score):
            continue
        if current_only and score.id != score_id(score.trace_id, score.name, rule_version):
            continue
        chosen = best if score.name == layer_score else components
        held = chosen.get(score.trace_id)
        if held is None or rank(score) > rank(held):
            chosen[score.trace_id] = score
    out = {}
    for trace_id, score in best.items():
        meta = score.metadata if isinstance(score.metadata, dict) else {}
        facts = _facts(meta.get("facts"))
        layer = Layer(score.value) if score.value in _LAYERS else None
        if layer is None and current_only:
            continue
        component = components.get(trace_id)
        owners = meta.get("owners")
        out[trace_id] = Decision(
            trace_id=trace_id,
            layer=layer,
            facts=facts,
            confidence=verdict_confidence(facts, issues_collection) if facts else "low",
            judge=meta.get("judge") if isinstance(meta.get("judge"), str) else None,
            component=component.value if component is not None and isinstance(component.value, str) else None,
            owners=[str(o) for o in owners] if isinstance(owners, list) else [],
            timestamp=score.timestamp,
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
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            bad.append(BadLabel(where=where, reason="facts file line is not JSON"))
            continue
        trace_id = record.get("trace_id") if isinstance(record, dict) else None
        facts = _facts({k: v for k, v in record.items() if k not in _NOT_FACTS}) if trace_id else None
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
