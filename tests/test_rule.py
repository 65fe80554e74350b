"""The layer rule over every combination of facts, against a decision table written as data."""

from __future__ import annotations

import itertools

import pytest

from triage.domain.records import Facts, Layer
from triage.domain.rule import Undetermined, decide, explain

ANY = object()
MISSING = "missing"

# (searched, searched_issues, retrieved, index, collection, grounded, declined) -> layer, first match wins.
# A "missing:<fact>" result means the rule must refuse to decide and name that fact.
TABLE: list[tuple[tuple[object, ...], str]] = [
    ((False, ANY, ANY, ANY, ANY, ANY, ANY), "agent_skipped_retrieval"),
    ((True, ANY, None, ANY, ANY, ANY, ANY), "missing:retrieved_has_answer"),
    ((True, ANY, True, ANY, ANY, None, ANY), "missing:answer_grounded"),
    ((True, ANY, True, ANY, ANY, ANY, None), "missing:answer_declined"),
    ((True, ANY, True, ANY, ANY, True, False), "ok"),
    ((True, ANY, True, ANY, ANY, ANY, ANY), "generation"),
    ((True, ANY, False, None, ANY, ANY, ANY), "missing:index_has_answer"),
    ((True, False, False, True, "issues", ANY, ANY), "tool_routing"),
    ((True, ANY, False, True, ANY, ANY, ANY), "retrieval"),
    ((True, ANY, False, False, ANY, ANY, None), "missing:answer_declined"),
    ((True, ANY, False, False, ANY, None, ANY), "missing:answer_grounded"),
    ((True, ANY, False, False, ANY, True, True), "content_gap_handled"),
    ((True, ANY, False, False, ANY, ANY, ANY), "content_gap_hallucination"),
]

VALUES = [
    [True, False],  # searched
    [True, False],  # searched issues
    [True, False, None],  # retrieved has answer
    [True, False, None],  # index has answer
    ["docs", "issues", "code"],  # answer collection
    [True, False, None],  # grounded
    [True, False, None],  # declined
]


def expected(combo: tuple[object, ...]) -> str:
    for pattern, outcome in TABLE:
        if all(p is ANY or p == v for p, v in zip(pattern, combo, strict=True)):
            return outcome
    raise AssertionError(f"table has no row for {combo}")


COMBOS = list(itertools.product(*VALUES))


def facts_of(combo: tuple[object, ...]) -> Facts:
    searched, issues, retrieved, index, collection, grounded, declined = combo
    return Facts(
        agent_searched=bool(searched),
        agent_searched_collections=(["docs", "issues"] if issues else ["docs"]) if searched else [],
        retrieved_has_answer=retrieved,  # type: ignore[arg-type]
        index_has_answer=index,  # type: ignore[arg-type]
        answer_collection=collection,  # type: ignore[arg-type]
        answer_grounded=grounded,  # type: ignore[arg-type]
        answer_declined=declined,  # type: ignore[arg-type]
    )


def test_table_covers_every_layer() -> None:
    outcomes = {expected(c) for c in COMBOS}
    assert {layer.value for layer in Layer} <= outcomes
    assert len(COMBOS) == 2 * 2 * 3 * 3 * 3 * 3 * 3


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(map(str, c)))
def test_rule_matches_decision_table(combo: tuple[object, ...]) -> None:
    want = expected(combo)
    facts = facts_of(combo)
    if want.startswith(MISSING):
        with pytest.raises(Undetermined) as info:
            decide(facts)
        assert info.value.missing == want.split(":")[1]
    else:
        assert decide(facts).value == want


def test_issues_collection_is_configurable() -> None:
    facts = Facts(
        agent_searched=True,
        agent_searched_collections=["docs"],
        retrieved_has_answer=False,
        index_has_answer=True,
        answer_collection="tickets",
    )
    assert decide(facts) is Layer.RETRIEVAL
    assert decide(facts, issues_collection="tickets") is Layer.TOOL_ROUTING


def test_reasons_name_the_deciding_fact() -> None:
    facts = Facts(
        agent_searched=True,
        retrieved_has_answer=True,
        answer_grounded=False,
        answer_declined=False,
        unsupported_claims=["maxTrials"],
    )
    assert "maxTrials" in explain(Layer.GENERATION, facts)
    declined = facts.model_copy(update={"answer_grounded": True, "answer_declined": True})
    assert "declined" in explain(Layer.GENERATION, declined)
    assert "issues" in explain(Layer.TOOL_ROUTING, facts.model_copy(update={"answer_collection": "issues"}))
