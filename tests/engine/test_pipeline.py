"""The pipeline end to end on the embedded store, the embedded index and the offline judge."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from tests.factories import NOW, lines, session_vote, trace_line
from triage.app import run_setup
from triage.domain.config import IndexFolder
from triage.domain.outcome import RunResult, Shard
from triage.domain.ports import JudgeRequest
from triage.domain.records import Facts, Passage, Usage, WriteOutcome
from triage.domain.scores import ScoreBody
from triage.engine.run import Sources, run_feedback
from triage.engine.stream import RunOptions
from triage.errors import ConfigError, JudgeError, SearchError
from triage.judges.heuristic import HeuristicJudge
from triage.search.index import Index
from triage.search.local import LocalSearcher
from triage.settings import load_config
from triage.sources.store import Store

DOCS_URL = "https://www.kubeflow.org/docs/components/katib/early-stopping/"
ISSUE_URL = "https://github.com/kubeflow/katib/issues/1234"
EARLY = "Enable early stopping in a Katib Experiment by setting earlyStopping.algorithmName to medianstop."
TRIALS = "Limit how many trials a Katib experiment runs with the maxTrialCount field of the Experiment spec."
QUOTA = (
    "Suggestion pods stuck pending because of namespace resource quota: raise the quota for suggestion pods."
)


@pytest.fixture
def index(tmp_path: Path) -> Index:
    docs, issues = tmp_path / "docs", tmp_path / "issues"
    docs.mkdir()
    issues.mkdir()
    (docs / "early.md").write_text(
        f'+++\ntitle = "Early stopping"\nurl = "{DOCS_URL}"\n+++\n{EARLY}\n\n{TRIALS}\n'
    )
    (issues / "quota.md").write_text(f'---\ntitle: "Suggestion pending"\nurl: "{ISSUE_URL}"\n---\n{QUOTA}\n')
    return Index.from_folders(
        [IndexFolder(collection="docs", path=docs), IndexFolder(collection="issues", path=issues)]
    )


def rows() -> list[str]:
    at = NOW - timedelta(hours=3)
    return lines(
        trace_line(
            "ok",
            "How do I enable early stopping in a Katib experiment?",
            "Set `earlyStopping.algorithmName` to medianstop.",
            [("search_kubeflow_docs", DOCS_URL, EARLY)],
            at=at,
            comment="too terse",
        ),
        trace_line(
            "gen",
            "How do I enable early stopping in a Katib experiment?",
            "Set `earlyStopping.policy: aggressive` in the spec.",
            [("search_kubeflow_docs", DOCS_URL, EARLY)],
            at=at,
        ),
        trace_line(
            "skip", "How do I limit the trials of a Katib experiment?", "Use maxTrials: 5.", [], at=at
        ),
        trace_line(
            "retr",
            "How do I limit the number of trials a Katib experiment runs?",
            "I could not find that in the docs.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/x/", "Pipelines compile to YAML.")],
            at=at,
        ),
        trace_line(
            "route",
            "Why are suggestion pods stuck pending with a resource quota?",
            "I'm not sure.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/y/", "Notebooks.")],
            at=at,
        ),
        trace_line(
            "gap",
            "Does Katib support quantum annealing optimizers?",
            "The docs don't cover quantum annealing.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/z/", "Random search samples.")],
            at=at,
        ),
        trace_line(
            "halluc",
            "Does Katib support quantum annealing optimizers?",
            "Yes: set `algorithmName: qanneal` and `--qpu-count 16`.",
            [("search_kubeflow_docs", "https://www.kubeflow.org/docs/z/", "Random search samples.")],
            at=at,
        ),
        trace_line("liked", "q?", "a.", [], vote=1, at=at),
        trace_line("old", "q?", "a.", [], at=NOW - timedelta(days=3)),
    )


EXPECTED = {
    "ok": "ok",
    "gen": "generation",
    "skip": "agent_skipped_retrieval",
    "retr": "retrieval",
    "route": "tool_routing",
    "gap": "content_gap_handled",
    "halluc": "content_gap_hallucination",
}


def run(store: Store, index: Index | None, **kwargs: object) -> RunResult:
    settings: dict[str, object] = {"concurrency": 4, "batch_size": 3, "progress_seconds": 0.0, **kwargs}
    options = RunOptions(now=NOW, **settings)  # type: ignore[arg-type]
    judge = HeuristicJudge()
    return asyncio.run(
        run_feedback(
            sources=Sources.of(store),
            judge=judge,
            config=load_config(),
            options=options, setup=run_setup(options, load_config()),
            searcher=LocalSearcher(index) if index else None,
        )
    )


def test_every_layer_and_the_window(index: Index) -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        result = run(store, index)
    assert {e.trace_id: e.layer.value for e in result.entries} == EXPECTED
    assert result.votes_seen == 8  # the three-day-old vote is outside the window
    assert result.thumbs_down == 7
    assert result.exit_code == 0
    by_id = {e.trace_id: e for e in result.entries}
    assert by_id["ok"].comments == ["too terse"]
    assert by_id["route"].owners == ["kubeflow/docs-agent"]
    assert by_id["gap"].owners == ["kubeflow/katib"]
    assert by_id["halluc"].owners == ["kubeflow/docs-agent", "kubeflow/katib"]
    assert by_id["ok"].component == "katib"


def test_second_write_run_triages_nothing_and_duplicates_nothing(index: Index) -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        first = run(store, index, write=True)
        assert first.written == 2 * len(EXPECTED)
        layer_rows = store.scores_named("triage_layer")
        assert sorted(r["traceId"] for r in layer_rows) == sorted(EXPECTED)
        assert {r["traceId"]: r["stringValue"] for r in layer_rows} == EXPECTED
        second = run(store, index, write=True)
        assert second.already_triaged == len(EXPECTED)
        assert second.entries == [] and second.written == 0
        forced = run(store, index, write=True, force=True)
        assert len(forced.entries) == len(EXPECTED)
        # forced rewrites upsert: same ids, same timestamps, still one row per trace and name
        assert store.scores_named("triage_layer") == [
            {**r, "updatedAt": new["updatedAt"]}
            for r, new in zip(layer_rows, store.scores_named("triage_layer"), strict=True)
        ]
        assert len(store.scores_named("triage_component")) == len(EXPECTED)


def test_session_votes_resolve_by_turn_or_wait(index: Index) -> None:
    at = NOW - timedelta(hours=5)
    data = lines(
        trace_line(
            "s-0",
            "How do I enable early stopping in a Katib experiment?",
            "Use medianstop.",
            [("search_kubeflow_docs", DOCS_URL, EARLY)],
            at=at,
            session_id="sess",
            vote=None,
        ),
        trace_line(
            "s-1",
            "Does Katib support quantum annealing optimizers?",
            "The docs don't cover it.",
            [("search_kubeflow_docs", DOCS_URL, EARLY)],
            at=at + timedelta(minutes=5),
            session_id="sess",
            vote=None,
        ),
        session_vote("sv1", "sess", 1, at + timedelta(minutes=6)),
        session_vote("sv2", "sess", 2, at + timedelta(minutes=7)),
    )
    with Store(":memory:") as store:
        store.import_lines(data, "test")
        result = run(store, index)
        assert [e.trace_id for e in result.entries] == ["s-1"]
        assert result.entries[0].layer.value == "content_gap_handled"
        [pending] = result.skipped
        assert pending.undecided.kind == "pending" and pending.undecided.vote_ids == ["sv2"]
        assert "turn 2 has not arrived" in pending.undecided.reason
        assert result.exit_code == 0
        # the third turn arrives later: the next run resolves the waiting vote
        store.import_lines(
            lines(
                trace_line(
                    "s-2",
                    "How do I enable early stopping in a Katib experiment?",
                    "Use medianstop.",
                    [("search_kubeflow_docs", DOCS_URL, EARLY)],
                    at=at + timedelta(minutes=8),
                    session_id="sess",
                    vote=None,
                )
            ),
            "late",
        )
        later = run(store, index)
        assert sorted(e.trace_id for e in later.entries) == ["s-1", "s-2"]
        assert later.skipped == []


class DownSearcher:
    async def __aenter__(self) -> DownSearcher:
        raise SearchError("search server unreachable at http://127.0.0.1:9/mcp")

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def search(self, query: str, collection: str, top_k: int) -> list[Passage]:
        raise AssertionError("never called")


def test_search_down_leaves_only_search_dependent_traces_undecided() -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        result = asyncio.run(
            run_feedback(
                sources=Sources.of(store),
                judge=HeuristicJudge(),
                config=load_config(),
                options=RunOptions(now=NOW), setup=run_setup(RunOptions(now=NOW), load_config()),
                searcher=DownSearcher(),
            )
        )
    decided = {e.trace_id: e.layer.value for e in result.entries}
    # only the trace alone decides without the re-search (the agent never searched): every other
    # path of the rule reads `retrieved_has_answer`, which the offline judge reads the re-search for
    assert decided == {k: EXPECTED[k] for k in ("skip",)}
    undecided = {s.undecided.trace_id: s.undecided for s in result.skipped}
    assert set(undecided) == {"ok", "gen", "retr", "route", "gap", "halluc"}
    assert all(u.kind == "unavailable" and "search unavailable" in u.reason for u in undecided.values())
    assert result.exit_code == 4


class FailingJudge(HeuristicJudge):
    """The offline judge, except that it raises `error` on one trace."""

    def __init__(self, trace_id: str, error: Exception) -> None:
        super().__init__()
        self.trace_id, self.error = trace_id, error

    async def judge(self, request: JudgeRequest) -> Facts:
        if request.trace.id == self.trace_id:
            raise self.error
        return await super().judge(request)


def run_with(store: Store, index: Index, judge: HeuristicJudge, **options: object) -> RunResult:
    return asyncio.run(
        run_feedback(
            sources=Sources.of(store),
            judge=judge,
            config=load_config(),
            options=RunOptions(now=NOW, **options),
            setup=run_setup(RunOptions(now=NOW, **options), load_config()),  # type: ignore[arg-type]
            searcher=LocalSearcher(index),
        )
    )


def test_judge_failure_is_listed_and_degrades_the_run(index: Index) -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        result = run_with(
            store, index, FailingJudge("gen", JudgeError("model endpoint returned 503 three times"))
        )
    assert "gen" not in {e.trace_id for e in result.entries}
    [skipped] = result.skipped
    assert skipped.undecided.kind == "unavailable" and "503" in skipped.undecided.reason
    assert skipped.comments == ["wrong"]
    assert result.exit_code == 4


class LossyStore(Store):
    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        outcome = super().write_scores([s for s in scores if s.trace_id != "ok"])
        outcome.failed.update({s.id: "not readable after 60 s" for s in scores if s.trace_id == "ok"})
        return outcome


def test_unconfirmed_scores_are_listed_and_a_rerun_finishes_them(index: Index) -> None:
    with LossyStore(":memory:") as store:
        store.import_lines(rows(), "test")
        result = run(store, index, write=True)
        [lost] = result.not_written
        assert lost.undecided.trace_id == "ok" and "not readable after 60 s" in lost.undecided.reason
        assert result.exit_code == 5
        assert result.written == 2 * (len(EXPECTED) - 1)
        # the rerun (now writing fine) finishes only the one that was lost
        store.write_scores = Store.write_scores.__get__(store)  # type: ignore[method-assign]
        rerun = run(store, index, write=True)
        assert [e.trace_id for e in rerun.entries] == ["ok"]
        assert rerun.exit_code == 0
        assert len(store.scores_named("triage_layer")) == len(EXPECTED)


def test_bad_traces_are_listed_not_dropped(index: Index) -> None:
    broken = trace_line("broken", "q?", "a.", [], at=NOW - timedelta(hours=1))
    broken["observations"][0]["input"] = None
    with Store(":memory:") as store:
        store.import_lines(lines(broken), "test")
        result = run(store, index)
    [skipped] = result.skipped
    assert skipped.undecided.kind == "bad_input" and "no question" in skipped.undecided.reason
    assert result.exit_code == 0


def test_shards_cover_every_vote_exactly_once(index: Index) -> None:
    seen: list[str] = []
    for i in range(3):
        with Store(":memory:") as store:
            store.import_lines(rows(), "test")
            result = run(store, index, shard=Shard(i, 3))
            seen += [e.trace_id for e in result.entries]
    assert sorted(seen) == sorted(EXPECTED)
    keys = [f"trace-{n}" for n in range(1000)]
    owners = [[k for k in keys if Shard(i, 4).owns(k)] for i in range(4)]
    assert sorted(k for part in owners for k in part) == sorted(keys)
    assert all(150 < len(part) < 350 for part in owners)  # a fair spread, not one shard taking all


def test_usage_and_requests_are_reported(index: Index) -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        result = run(store, index)
    assert result.usage == Usage()  # the offline judge calls no model
    assert result.search_calls > 0


def test_an_internal_error_on_one_trace_costs_only_that_trace(index: Index) -> None:
    with Store(":memory:") as store:
        store.import_lines(rows(), "test")
        result = run_with(store, index, FailingJudge("ok", KeyError("a bug")), write=True)
        assert len(store.scores_named("triage_layer")) == len(EXPECTED) - 1
    [skipped] = result.skipped
    assert skipped.undecided.kind == "error" and "KeyError" in skipped.undecided.reason
    assert result.exit_code == 1


class RefusingStore(Store):
    def write_scores(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        raise ConfigError("Langfuse refused the keys (HTTP 401): check LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY")


def test_refused_credentials_mid_run_end_it_with_the_config_error(index: Index) -> None:
    with RefusingStore(":memory:") as store:
        store.import_lines(rows(), "test")
        with pytest.raises(ConfigError, match="refused the keys"):
            run(store, index, write=True)
