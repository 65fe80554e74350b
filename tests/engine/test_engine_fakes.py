"""`run_feedback` on fakes: which judge decides a trace, what a verdict records, how failures end.

Fast: no store, no index, no servers. `FakeSource` holds the votes and traces and keeps what was
written, `FakeJudge` answers from its queue, `FakeSearcher` from a fixed mapping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from tests.doubles.fakes import FakeJudge, FakeSearcher, FakeSource, passage
from tests.factories import NOW, session_vote, trace_line
from triage.app import run_setup
from triage.domain.outcome import RunResult
from triage.domain.records import Facts
from triage.domain.scores import ScoreBody
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.errors import ExitCode, JudgeError, JudgeRejected, LangfuseError, SearchError
from triage.settings import load_config

DOCS_URL = "https://www.kubeflow.org/docs/components/katib/early-stopping/"
EARLY = "Enable early stopping in a Katib Experiment by setting earlyStopping.algorithmName to medianstop."
QUESTION = "How do I enable early stopping in a Katib experiment?"
SEARCHED = trace_line(
    "searched",
    QUESTION,
    "Set `earlyStopping.algorithmName` to medianstop.",
    [("search_kubeflow_docs", DOCS_URL, EARLY)],
)
OTHER = trace_line(
    "other",
    "How do I limit the trials of a Katib experiment?",
    "I could not find that in the docs.",
    [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile to YAML.")],
)
SKIPPED = trace_line("skip", "How do I limit the trials of a Katib experiment?", "Use maxTrials: 5.", [])

#: facts that make a searched trace `ok`, and ones that make it `retrieval`
OK: dict[str, Any] = {"retrieved_has_answer": True, "answer_grounded": True, "answer_declined": False}
RETRIEVAL: dict[str, Any] = {
    "retrieved_has_answer": False,
    "index_has_answer": True,
    "answer_collection": "docs",
}


def run(
    source: FakeSource, judge: FakeJudge, searcher: FakeSearcher | None = None, **options: Any
) -> RunResult:
    settings: dict[str, Any] = {"concurrency": 2, "batch_size": 10, "progress_seconds": 0.0, **options}
    return asyncio.run(
        run_feedback(
            sources=Sources.of(source),
            judge=judge,
            config=load_config(),
            options=RunOptions(now=NOW, **settings), setup=run_setup(RunOptions(now=NOW, **settings), load_config()),
            searcher=searcher if searcher is not None else FakeSearcher(answers={}),
        )
    )


def by_trace(scores: list[ScoreBody], name: str = "triage_layer") -> dict[str, ScoreBody]:
    return {s.trace_id: s for s in scores if s.name == name}


def test_a_no_search_trace_is_judged_by_the_heuristic_not_the_judge() -> None:
    source = FakeSource.from_rows([SKIPPED, SEARCHED])
    judge = FakeJudge().enqueue(OK, trace_id="searched")
    result = run(source, judge, write=True)

    assert [call.trace_id for call in judge.history] == ["searched"]  # never asked about "skip"
    layers = by_trace(source.written())
    skip = layers["skip"]
    assert skip.value == "agent_skipped_retrieval"
    assert skip.metadata["judge"] == "heuristic" and skip.metadata["prompt_version"] == "heuristic-3"
    assert skip.metadata["facts"]["agent_searched"] is False
    assert layers["searched"].metadata["judge"] == "fake"
    assert result.written == 4 and result.exit_code == ExitCode.OK


def test_a_searched_verdict_records_the_judge_and_what_it_was_given() -> None:
    source = FakeSource.from_rows([SEARCHED])
    judge = FakeJudge(tokens_per_call=(1200, 80)).enqueue(OK)
    found = passage(EARLY, DOCS_URL)
    searcher = FakeSearcher(answers={QUESTION: [found]})
    result = run(source, judge, searcher, write=True)

    [entry] = result.entries
    assert (entry.trace_id, entry.layer.value, entry.component) == ("searched", "ok", "katib")
    assert entry.written and entry.url == "https://langfuse.test/traces/searched"
    for written in source.written("triage_layer") + source.written("triage_component"):
        assert written.metadata["judge"] == "fake" and written.metadata["prompt_version"] == "fake-1"
        assert written.metadata["facts"]["retrieved_has_answer"] is True
        assert written.metadata["facts"]["evidence"]["retrieved_has_answer"]["decided_by"] == "fake"
        assert written.metadata["votes"] == ["vote-searched"]
    assert ("retrieved_has_answer", "yes", "fake") in entry.findings.decided
    assert by_trace(source.written(), "triage_component")["searched"].value == "katib"

    [call] = judge.history
    assert call.comment == "wrong" and call.grounding is True
    assert call.base == Facts(agent_searched=True, agent_searched_collections=["docs"])
    # the re-search: the question (and a query with the comment) in every configured collection,
    # each with the configured top_k; how the comment is joined on is the researcher's business
    config = load_config()
    assert {c.collection for c in searcher.history} == set(config.collections)
    assert {c.top_k for c in searcher.history} == {config.search.top_k}
    for collection in config.collections:
        queries = [c.query for c in searcher.history if c.collection == collection]
        assert queries[0] == QUESTION and any("wrong" in q for q in queries[1:])
    assert searcher.entered == searcher.exited == 1
    assert [(p.id, p.source_url) for p in call.research or []] == [("S1", DOCS_URL)]
    assert result.usage.calls == 1 and result.usage.input_tokens == 1200
    assert result.requests == source.stats.requests > 0


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (JudgeError("model endpoint returned 503 three times"), "unavailable", "judge unavailable"),
        (JudgeRejected("quote not found in passage S1"), "rejected", "judge output rejected"),
    ],
)
def test_a_judge_failure_leaves_the_trace_undecided_and_degrades_the_run(
    error: JudgeError, kind: str, said: str
) -> None:
    source = FakeSource.from_rows([SEARCHED, OTHER])
    judge = FakeJudge().enqueue(error, trace_id="searched").enqueue(RETRIEVAL, trace_id="other")
    result = run(source, judge, write=True)

    [skipped] = result.skipped
    assert skipped.undecided.trace_id == "searched" and skipped.undecided.kind == kind
    assert said in skipped.undecided.reason and str(error) in skipped.undecided.reason
    assert skipped.undecided.vote_ids == ["vote-searched"] and skipped.comments == ["wrong"]
    assert [e.trace_id for e in result.entries] == ["other"]
    assert set(by_trace(source.written())) == {"other"}  # nothing written for the undecided trace
    assert result.exit_code == ExitCode.DEGRADED


def test_a_write_that_fails_lists_every_trace_of_the_batch_as_not_written() -> None:
    source = FakeSource.from_rows([SEARCHED, OTHER])
    source.fail("write_scores", LangfuseError("writing 4 scores failed: HTTP 503"))
    judge = FakeJudge().enqueue(OK, trace_id="searched").enqueue(RETRIEVAL, trace_id="other")
    result = run(source, judge, write=True)

    assert sorted(s.undecided.trace_id or "" for s in result.not_written) == ["other", "searched"]
    assert all("HTTP 503" in s.undecided.reason for s in result.not_written)
    assert (
        "triaged as ok" in {s.undecided.trace_id: s for s in result.not_written}["searched"].undecided.reason
    )
    assert result.written == 0 and not any(e.written for e in result.entries)
    assert source.stored == {} and len(source.write_batches) == 0  # the one call raised
    assert result.exit_code == ExitCode.NOT_WRITTEN


def test_a_write_that_is_not_confirmed_costs_only_its_trace() -> None:
    source = FakeSource.from_rows([SEARCHED, OTHER]).lose("searched", reason="not readable after 60 s")
    judge = FakeJudge().enqueue(OK, trace_id="searched").enqueue(RETRIEVAL, trace_id="other")
    result = run(source, judge, write=True)

    [lost] = result.not_written
    assert lost.undecided.trace_id == "searched" and "not readable after 60 s" in lost.undecided.reason
    assert result.written == 2 and set(by_trace(source.written())) == {"other"}
    assert result.exit_code == ExitCode.NOT_WRITTEN


def test_without_write_nothing_is_written() -> None:
    source = FakeSource.from_rows([SEARCHED])
    result = run(source, FakeJudge().enqueue(OK))
    assert len(result.entries) == 1 and source.calls("write_scores") == [] and result.written == 0


def test_already_triaged_traces_are_not_judged_again() -> None:
    source = FakeSource.from_rows([SEARCHED, OTHER], triaged=["searched"])
    judge = FakeJudge().enqueue(RETRIEVAL)
    result = run(source, judge)
    assert result.already_triaged == 1
    assert [c.trace_id for c in judge.history] == ["other"] and judge.pending == 0
    assert [e.layer.value for e in result.entries] == ["retrieval"]


def test_search_down_leaves_a_trace_needing_the_index_undecided() -> None:
    source = FakeSource.from_rows([OTHER])
    searcher = FakeSearcher(enter_error=SearchError("search server unreachable at http://127.0.0.1:9/mcp"))
    judge = FakeJudge()  # never asked: every fact of a searched trace may rest on the re-search
    result = run(source, judge, searcher)

    assert judge.history == [] and searcher.history == []
    [skipped] = result.skipped
    assert skipped.undecided.kind == "unavailable"
    assert "search unavailable" in skipped.undecided.reason and "unreachable" in skipped.undecided.reason
    assert result.exit_code == ExitCode.DEGRADED


def test_a_trace_read_failure_lists_its_traces() -> None:
    source = FakeSource.from_rows([SEARCHED]).fail("observations", LangfuseError("HTTP 502"))
    judge = FakeJudge()
    result = run(source, judge)
    [skipped] = result.skipped
    assert skipped.undecided.kind == "unavailable" and "could not read the trace" in skipped.undecided.reason
    assert judge.history == [] and result.exit_code == ExitCode.DEGRADED


def test_a_session_vote_goes_to_the_turn_it_names() -> None:
    at = NOW - timedelta(hours=4)
    rows: list[Mapping[str, Any]] = [
        trace_line("turn-0", QUESTION, "a.", [], at=at, session_id="sess", vote=None),
        trace_line(
            "turn-1",
            QUESTION,
            "b.",
            [("search_kubeflow_docs", DOCS_URL, EARLY)],
            at=at + timedelta(minutes=2),
            session_id="sess",
            vote=None,
        ),
        session_vote("sv", "sess", 1, at + timedelta(minutes=3)),
    ]
    source = FakeSource.from_rows(rows)
    judge = FakeJudge().enqueue(OK)
    result = run(source, judge)
    assert [(c.trace_id, c.comment) for c in judge.history] == [("turn-1", "bad")]
    assert [e.trace_id for e in result.entries] == ["turn-1"]
    assert source.calls("session_traces")[0].args == (("sess",),)


def test_an_unexpected_judge_call_fails_loudly() -> None:
    result = run(FakeSource.from_rows([SEARCHED]), FakeJudge())  # nothing queued
    [skipped] = result.skipped
    assert skipped.undecided.kind == "error" and "no answer queued" in skipped.undecided.reason
    assert result.exit_code == ExitCode.ERROR


# --------------------------------------------------------------------------- the component's source


@pytest.mark.parametrize(
    ("update", "component", "decided_by"),
    [
        # the answer's sources win over everything
        ({**OK, "answer_sources": [DOCS_URL], "component": "pipelines"}, "katib", "sources"),
        # else the judge's pick from the catalogue
        ({**OK, "component": "notebooks"}, "notebooks", "judge"),
        # a pick outside the catalogue is ignored; the layer facts stand; keywords decide
        ({**OK, "component": "not-a-component"}, "katib", "keywords"),
    ],
)
def test_the_component_is_decided_in_order_and_the_deciding_source_is_recorded(
    update: dict[str, Any], component: str, decided_by: str
) -> None:
    source = FakeSource.from_rows([SEARCHED])
    result = run(source, FakeJudge().enqueue(update), write=True)
    [entry] = result.entries
    assert (entry.layer.value, entry.component) == ("ok", component)
    written = by_trace(source.written(), "triage_component")["searched"]
    assert written.value == component and written.metadata["component_from"] == decided_by


def test_with_no_source_no_pick_and_no_keyword_the_default_component_is_recorded() -> None:
    plain = trace_line(
        "plain", "Why is the sky blue?", "Rayleigh scattering.", [("search_kubeflow_docs", "u", "x")]
    )
    source = FakeSource.from_rows([plain])
    run(source, FakeJudge().enqueue(OK), write=True)
    written = by_trace(source.written(), "triage_component")["plain"]
    assert (written.value, written.metadata["component_from"]) == ("general", "default")


def test_a_trace_that_searched_nothing_takes_its_component_from_the_pages_it_fetched() -> None:
    # the question's keywords say `pipelines`; the page the agent read says the dashboard
    question = "With only Notebooks and Pipelines installed, which sections does the sidebar show?"
    page = "https://www.kubeflow.org/docs/components/central-dash/overview/"
    fetched = trace_line("fetched", question, "Home, Notebooks, Pipelines.", [("fetch_url", page, "Home ...")])
    fetched["observations"][1]["input"] = json.dumps({"url": page})
    from_memory = trace_line("memory", question, "Home, Notebooks, Pipelines.")
    source = FakeSource.from_rows([fetched, from_memory])
    run(source, FakeJudge(), write=True)
    written = by_trace(source.written(), "triage_component")
    assert (written["fetched"].value, written["fetched"].metadata["component_from"]) == (
        "central-dashboard",
        "sources",
    )
    assert (written["memory"].value, written["memory"].metadata["component_from"]) == ("pipelines", "keywords")
