"""The re-search: query variants (the agent's own queries in every collection), lists merged rank
by rank, and the embedded index joining short sections with the ones after them."""

from __future__ import annotations

import pytest

from tests.doubles.fakes import FakeSearcher
from triage.domain.records import Passage, ToolCall, Trace
from triage.search.index import MIN_CHUNK_CHARS, Chunk, Index, chunk_markdown
from triage.search.local import Researcher, agent_queries

QUESTION = "Why do my Katib trials hang forever?"


def _p(name: str, collection: str) -> Passage:
    return Passage(id=name, collection=collection, source_url=f"https://x/{name}", text=f"text of {name}")


def _trace(*queries: str | dict[str, object], collection: str = "docs") -> Trace:
    calls = [
        ToolCall(
            id=f"o{n}",
            name="search_kubeflow_docs",
            args=q if isinstance(q, dict) else {"query": q},
            output="No results found for your query.",
            collection=collection,
        )
        for n, q in enumerate(queries)
    ]
    calls.append(ToolCall(id="k", name="run_kubectl", args={"query": "get pods"}, output="..."))
    return Trace(id="t", question=QUESTION, answer="...", tool_calls=calls)


def test_agent_queries_are_the_search_calls_query_arguments() -> None:
    trace = _trace("katib   trials hang", {"top_k": 3}, "")
    assert agent_queries(trace) == ["katib trials hang"]  # not the kubectl call's, not an empty one


@pytest.mark.anyio
async def test_the_agents_own_query_is_re_searched_in_every_collection() -> None:
    """An agent that searched docs with the right words: the same words in issues find the thread
    that answers (a tool_routing miss the question's own words do not surface)."""
    thread = _p("issue-2417", "issues")
    searcher = FakeSearcher(answers={("katib sidecar istio injection", "issues"): [thread]})
    researcher = Researcher(searcher, ["docs", "issues"], top_k=5, use_comment=False)
    found = await researcher.research(_trace("katib sidecar istio injection"), None)
    assert [p.source_url for p in found] == [thread.source_url]
    assert {(c.query, c.collection) for c in searcher.history} == {
        (QUESTION, "docs"),
        (QUESTION, "issues"),
        ("katib sidecar istio injection", "docs"),
        ("katib sidecar istio injection", "issues"),
    }


@pytest.mark.anyio
async def test_variants_can_be_turned_off() -> None:
    searcher = FakeSearcher(answers={})
    researcher = Researcher(searcher, ["docs"], top_k=5, use_comment=False, use_agent_queries=False)
    await researcher.research(_trace("katib sidecar"), "comment")
    assert [c.query for c in searcher.history] == [QUESTION]


@pytest.mark.anyio
async def test_result_lists_are_merged_rank_by_rank() -> None:
    """Every list's best result comes before any list's second: a collection or a variant with many
    weak hits cannot push another's best one out of what the judge is shown."""
    docs = [_p(f"d{i}", "docs") for i in range(1, 6)]
    issues = [_p(f"i{i}", "issues") for i in range(1, 3)]
    searcher = FakeSearcher(answers={(QUESTION, "docs"): docs, (QUESTION, "issues"): issues})
    researcher = Researcher(searcher, ["docs", "issues"], top_k=5, use_comment=False, use_agent_queries=False)
    found = await researcher.research(_trace(), None)
    assert [p.source_url.rsplit("/", 1)[-1] for p in found if p.source_url] == [
        "d1", "i1", "d2", "i2", "d3", "d4", "d5",
    ]  # fmt: skip
    assert [p.id for p in found] == [f"S{n}" for n in range(1, 8)]


def test_a_short_section_is_joined_with_the_sections_after_it() -> None:
    body = (
        "## ISSUE: notebook not starting\n\n"
        "## SOLUTION: check events of Notebook\n\nRun `kubectl describe notebooks NAME`.\n\n"
        "## SOLUTION: check logs of Pod\n\nRun `kubectl logs NAME-0`.\n\n"
        f"## Another topic\n\n{'Long text about something else entirely. ' * 40}\n"
    )
    chunks = list(chunk_markdown(body, "Troubleshooting"))
    first_label, first_text = chunks[0]
    assert first_label == "Troubleshooting > ISSUE: notebook not starting"
    assert "kubectl describe notebooks" in first_text and "kubectl logs" in first_text
    # a section that no longer fits starts its own chunk
    assert chunks[-1][0] == "Troubleshooting > Another topic" and len(chunks[-1][1]) >= MIN_CHUNK_CHARS
    # min_chars=0: every heading cuts (what the demo's search server does)
    assert len(list(chunk_markdown(body, "Troubleshooting", min_chars=0))) == 4


def test_the_joined_chunk_answers_a_search_for_the_issue() -> None:
    body = "## ISSUE: notebook not starting\n\n## SOLUTION: check logs of Pod\n\nRun `kubectl logs NAME-0`.\n"
    chunks = [
        Chunk(f"docs:t.md#{n}", "docs", "https://x/t", label, text)
        for n, (label, text) in enumerate(chunk_markdown(body, "Troubleshooting"))
    ]
    top = Index(chunks).search("notebook not starting", "docs", top_k=1)
    assert "kubectl logs" in top[0].text
