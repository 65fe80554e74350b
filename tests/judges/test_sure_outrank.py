"""When a passage elsewhere makes a retrieval miss *sure* (issue #30, item 5).

A passage the index holds (it covers the question at `INDEX_THRESHOLD` or more) that covers the
question far better than anything the agent was shown (`CLEAR_OUTRANK`) is the same evidence
whether or not it reaches `HOLD_THRESHOLD`, the score at which it outranks a retrieved passage:
"the index holds it" and "the agent's passages missed it" are then `high`, as they are for an
outranking passage, with the same exceptions (an answer that leans on the agent's passages, a better
passage on a page the agent retrieved). Invented pages, not the evaluation set's.
"""

from __future__ import annotations

import pytest

from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Passage, ToolCall, Trace
from triage.domain.rule import walk
from triage.judges.heuristic import HeuristicJudge
from triage.judges.offline import containment as cont

QUESTION = "How do I mount a secret volume into every notebook server of a profile namespace?"
NOISE = [
    Passage(id=f"S{i}", collection="docs", source_url=f"https://docs.example/n{i}", text=text)
    for i, text in enumerate(["Katib runs experiments.", "Katib trials report metrics.", "Notebooks run pods."], 2)
]
#: the page the agent read: about notebook pods, not about mounting anything
SHOWN = "Each notebook runs as a pod under the `default-editor` ServiceAccount."
#: the page that answers, found by the re-search only
ANSWERS = "A PodDefault mounts a secret volume into a notebook server."


async def _facts(answer: str, shown_text: str = SHOWN, other_text: str = ANSWERS, other_url: str = "") -> Facts:
    shown = Passage(id="R1", collection="docs", source_url="https://docs.example/notebooks", text=shown_text)
    other = Passage(
        id="S9", collection="docs", source_url=other_url or "https://docs.example/poddefault", text=other_text
    )
    call = ToolCall(id="c", name="search", args={"query": "notebook pod"}, collection="docs")
    trace = Trace(id="t", question=QUESTION, answer=answer, tool_calls=[call], passages=[shown])
    base = Facts(agent_searched=True, agent_searched_collections=["docs"])
    return await HeuristicJudge().judge(JudgeRequest(trace, [shown, *NOISE, other], None, base))


def _levels(facts: Facts) -> tuple[str | None, str | None]:
    ev = facts.evidence
    return ev["retrieved_has_answer"].confidence, ev["index_has_answer"].confidence


def test_the_passage_elsewhere_holds_the_answer_without_outranking() -> None:
    shown = Passage(id="R1", collection="docs", source_url="https://docs.example/notebooks", text=SHOWN)
    other = Passage(id="S9", collection="docs", source_url="https://docs.example/poddefault", text=ANSWERS)
    found = cont.contain(QUESTION, "", [], [shown], [shown, *NOISE, other], answer_counts=False)
    assert found.elsewhere_best is not None and found.elsewhere_best.passage is other
    assert cont.INDEX_THRESHOLD <= found.elsewhere_best.coverage < cont.HOLD_THRESHOLD
    assert not found.outranked and found.index_holds is True and not found.retrieved_holds
    assert found.outrank_margin >= cont.CLEAR_OUTRANK


@pytest.mark.anyio
async def test_a_far_better_passage_the_index_holds_makes_the_miss_sure() -> None:
    # the answer takes one specific from the agent's page (no leaning: one specific says little),
    # which lifts the agent's score off a clear miss by the question's words alone
    facts = await _facts("Notebook pods run under `default-editor`; add the secret to each pod spec by hand.")
    assert (facts.retrieved_has_answer, facts.index_has_answer) == (False, True)
    assert _levels(facts) == ("high", "high")
    path = walk(facts)
    assert path.layer is not None and path.layer.value == "retrieval" and path.sure
    assert "a far better passage elsewhere" in (facts.evidence["retrieved_has_answer"].note or "")


@pytest.mark.anyio
async def test_a_passage_elsewhere_only_somewhat_better_leaves_it_a_suggestion() -> None:
    # the agent's page covers more of the question: the passage elsewhere is better by less than
    # `CLEAR_OUTRANK`, and just above the index's threshold
    shown = "Notebook servers run as pods in your namespace."
    facts = await _facts("Notebook servers are pods; add the secret to each pod spec by hand.", shown_text=shown)
    assert facts.index_has_answer is True
    assert facts.evidence["index_has_answer"].confidence != "high"
    assert not walk(facts).sure


@pytest.mark.anyio
async def test_an_answer_leaning_on_the_agents_page_is_sure_only_against_another_page() -> None:
    # the answer's specifics (two) are the agent's page's: it answered from what it was shown, and
    # another section of that page may say in other words what its chunk did not
    shown = SHOWN + " It is bound to the `kubeflow-edit` ClusterRole."
    answer = "Notebook pods run under `default-editor` with `kubeflow-edit`; add the secret by hand."
    elsewhere = await _facts(answer, shown_text=shown)
    assert _levels(elsewhere) == ("high", "high")
    same_page = await _facts(answer, shown_text=shown, other_url="https://docs.example/notebooks")
    assert _levels(same_page) == ("medium", "high")
    assert not walk(same_page).sure
