"""How sure a verdict is: the weakest confidence among the facts its layer rests on.

A verdict is only as sure as the least sure fact the rule read on the way to its layer; a fact
with no stated confidence counts as `low` (a judge that says nothing about its certainty has
not earned `high`). `agent_searched` and `agent_searched_collections` come from the trace
itself and are always certain.
"""

from __future__ import annotations

from typing import Literal

from triage.domain.records import Facts

Confidence = Literal["high", "medium", "low"]
_ORDER: dict[Confidence, int] = {"low": 0, "medium": 1, "high": 2}


def facts_used(facts: Facts, issues_collection: str = "issues") -> list[str]:
    """The judged facts `rule.decide` reads for these facts, in the order it reads them."""
    if not facts.agent_searched:
        return []
    used = ["retrieved_has_answer"]
    if facts.retrieved_has_answer:
        return [*used, "answer_grounded", "answer_declined"]
    used.append("index_has_answer")
    if facts.index_has_answer:
        in_issues = facts.answer_collection == issues_collection
        return [*used, "answer_collection"] if in_issues or facts.answer_collection is None else used
    return [*used, "answer_declined", "answer_grounded"]


def verdict_confidence(facts: Facts, issues_collection: str = "issues") -> Confidence:
    """The lowest confidence among the facts the layer rests on (`high` when it rests on none)."""
    levels: list[Confidence] = []
    for name in facts_used(facts, issues_collection):
        if name == "answer_collection":
            continue  # a routing detail the judge states with index_has_answer's evidence
        evidence = facts.evidence.get(name)
        levels.append(evidence.confidence if evidence is not None and evidence.confidence else "low")
    return min(levels, key=_ORDER.__getitem__, default="high")
