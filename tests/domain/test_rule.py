"""The layer rule over every combination of facts, against a decision table written as data."""

from __future__ import annotations

import itertools

import pytest

from triage.domain.records import Evidence, Facts, Layer
from triage.domain.rule import Undetermined, decide, explain, walk

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


def _stated(facts: Facts, **levels: str | None) -> Facts:
    evidence = {name: Evidence(confidence=level) for name, level in levels.items()}  # type: ignore[arg-type]
    return facts.model_copy(update={"evidence": evidence})


HIGH = "high"


DECIDED = [c for c in COMBOS if not expected(c).startswith(MISSING)]


@pytest.mark.parametrize("combo", DECIDED, ids=lambda c: "-".join(map(str, c)))
def test_a_verdict_is_sure_exactly_when_every_fact_on_its_path_is_high(combo: tuple[object, ...]) -> None:
    """Sure or suggestion is read off the rule's own path: all judged facts high makes it sure; any
    one of the facts the rule read at medium makes a suggestion; a fact the rule did not read, at
    any level, changes nothing."""
    facts = facts_of(combo)
    judged = ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")
    path = walk(_stated(facts, **dict.fromkeys(judged, HIGH)))
    assert path.sure and path.layer is not None
    for name in judged:
        lowered = walk(_stated(facts, **{**dict.fromkeys(judged, HIGH), name: "medium"}))
        assert lowered.layer == path.layer
        assert lowered.sure is (name not in path.read), (name, path.read)


def test_sure_needs_a_stated_high_and_a_layer() -> None:
    ok = Facts(
        agent_searched=True,
        agent_searched_collections=["docs"],
        retrieved_has_answer=True,
        answer_grounded=True,
        answer_declined=False,
    )
    assert walk(_stated(ok, retrieved_has_answer=HIGH, answer_grounded=HIGH, answer_declined=HIGH)).sure
    # a fact with no stated confidence has not earned `high`
    assert not walk(_stated(ok, retrieved_has_answer=HIGH, answer_grounded=HIGH)).sure
    assert not walk(_stated(ok, retrieved_has_answer=HIGH, answer_grounded=HIGH, answer_declined=None)).sure
    # a missing fact: no layer, never sure, whatever the rest says
    missing = ok.model_copy(update={"answer_grounded": None})
    assert not walk(_stated(missing, retrieved_has_answer=HIGH, answer_grounded=HIGH, answer_declined=HIGH)).sure
    # no search call: the trace proves the layer, no judged fact is read
    assert walk(Facts(agent_searched=False)).sure
    # the routing detail is not a judged fact: a routing verdict rests on the two containment facts
    routed = Facts(
        agent_searched=True,
        agent_searched_collections=["docs"],
        retrieved_has_answer=False,
        index_has_answer=True,
        answer_collection="issues",
    )
    assert walk(_stated(routed, retrieved_has_answer=HIGH, index_has_answer=HIGH)).sure
