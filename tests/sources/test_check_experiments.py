"""`triage check` on Langfuse v4: each run an experiment, each case an experiment item written as
OTLP/JSON spans (`triage.sources.langfuse.experiments`), read back through `GET
/api/public/experiments` and `GET /api/public/experiment-items`; no call to an endpoint v4 removed;
a rerun under the same run name adds no item and no score twice; the legacy dataset runs on a v3
server only (the generation asked once); the experiment id the SDK's own; and the official SDK
(langfuse 5.x, the test extra) reading the experiment back from the stand-in. Every exchange is
validated against ../shared/langfuse/openapi.yml.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.check.test_check import (
    DATASET,
    LF_QUESTIONS,
    NOW,
    TOOLS,
    FakeAgent,
    FakeJudge,
    agent_traces,
    http_config,
    invoke,
    item,
    results,
    seed_langfuse_cases,
    statuses,
    url,
)
from tests.check.test_check_gate import SECRET, cases, two_runs_at_once
from tests.doubles.agent_server import AgentStandIn
from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import EXPERIMENT_KEYS, LangfuseStandIn, removed_on_v4
from tests.sources.test_langfuse import backend_for
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.check import CheckOptions, run_check
from triage.domain.checks import (
    CHECK_SCORE,
    STORED_RESULT_BYTES,
    AgentRun,
    CheckRun,
    RunItemResult,
    check_score_id,
    placeholder_trace_id,
)
from triage.errors import ExitCode
from triage.sources.langfuse.experiments import experiment_id, item_ids

LONG_AGO = "2000-01-01T00:00:00Z"


def get(server: LangfuseStandIn, path: str, **params: Any) -> Any:
    answer = httpx.get(f"{server.url}{path}", params=params, auth=(server.public_key, server.secret_key))
    assert answer.status_code == 200, answer.text
    return answer.json()


def dataset_id(server: LangfuseStandIn) -> str:
    return str(get(server, f"/api/public/v2/datasets/{DATASET}")["id"])


def check_scores(server: LangfuseStandIn) -> list[dict[str, Any]]:
    return [r for r in server.score_rows() if r["name"] == CHECK_SCORE]


@pytest.mark.slow
def test_a_check_on_v4_is_an_experiment_its_rerun_adds_nothing_and_no_removed_endpoint_is_called(
    tmp_path: Path,
    virtual_time: VirtualClock,
    openapi: Any,  # noqa: F811
) -> None:
    with LangfuseStandIn(records=agent_traces(), v4=True) as server:
        script = seed_langfuse_cases(server)
        server.reset_log()
        with AgentStandIn(script) as agent:
            config = str(http_config(tmp_path / "triage.toml", agent, attempts=1, max_unchecked=0.5))
            env = {**server.env, "TRIAGE_CONFIRM_WAIT_SECONDS": "5"}
            out = tmp_path / "r1.json"
            first = invoke("--config", config, "--judge", "offline", "--run-name", "r1", "--output", str(out), env=env)
            assert first.exit_code == 0, first.output
            assert statuses(results(out)) == {
                "c-routed": "fixed",
                "c-misrouted": "still_failing",
                "c-cited": "fixed",
                "c-down": "error",
            }
            assert results(out)["written"] == 3

            # the run is an experiment, listed by the experiments API, its id the SDK's derivation
            exp_id = experiment_id(server.project_id, dataset_id(server), "r1")
            listed = get(server, "/api/public/experiments", fromStartTime=LONG_AGO, fields="core,metadata")["data"]
            assert [(e["id"], e["name"], e["itemCount"], e["datasetId"]) for e in listed] == [
                (exp_id, "r1", 3, dataset_id(server))
            ]
            assert listed[0]["metadata"]["created_by"] == "triage check"
            # its items, each linked to the agent's new trace (or the placeholder), with its score
            params = {"fromStartTime": LONG_AGO, "experimentId": exp_id, "fields": "io,scores"}
            items = get(server, "/api/public/experiment-items", **params)["data"]
            assert {i["experimentItemId"]: i["output"]["trace_id"] for i in items} == {
                "c-routed": "t-new-routed",
                "c-misrouted": "t-new-misrouted",
                "c-cited": placeholder_trace_id(DATASET, "r1", "c-cited"),
            }  # the agent error is not in the run
            for i in items:
                assert (i["traceId"], i["id"]) == item_ids(DATASET, "r1", i["experimentItemId"])
                assert i["input"]["question"] in LF_QUESTIONS.values()
                [score] = [s for s in i["scores"] if s["name"] == CHECK_SCORE]
                assert score["id"] == check_score_id(DATASET, "r1", i["experimentItemId"], i["traceId"])
                assert score["value"] == i["output"]["outcome"]
            # every span of every item's trace carries the experiment attributes
            assert server.otel_problems == []
            spans = server.otel_spans()
            assert len(spans) == 3 and all(set(EXPERIMENT_KEYS) <= s["attributes"].keys() for s in spans)

            # the same run name again: only the agent error is asked again, no item or score twice
            asked = len(agent.requests)
            again = invoke("--config", config, "--judge", "offline", "--run-name", "r1", env=env)
            assert again.exit_code == 0, again.output
            assert [r.question for r in agent.requests[asked:]] == [LF_QUESTIONS["down"]]
            assert len(server.otel_spans()) == 3
            assert len(get(server, "/api/public/experiment-items", **params)["data"]) == 3
            assert len(check_scores(server)) == 3

            # a new run: compared with r1 read back from the experiments; the cited case breaks: exit 7
            script[LF_QUESTIONS["cited"]].sources = [url("elsewhere")]
            out2 = tmp_path / "r2.json"
            second = invoke(
                "--config", config, "--judge", "offline", "--run-name", "r2", "--output", str(out2), env=env
            )
            assert second.exit_code == ExitCode.REGRESSED, second.output
            assert results(out2)["previous_run"] == "r1"
            assert statuses(results(out2))["c-cited"] == "newly_failing"
        # what v4 removed answers 404, as Cloud does (the error shape, for the spec check)
        auth = (server.public_key, server.secret_key)
        gone = httpx.get(f"{server.url}/api/public/datasets/{DATASET}/runs", auth=auth)
        assert gone.status_code == 404
        assert removed_on_v4("GET", f"/api/public/datasets/{DATASET}/runs")
        removed = [f"{r.method} {r.path}" for r in server.log if removed_on_v4(r.method, r.path)]
        checked = {validate(openapi, entry) for entry in server.log}
        otlp = [r for r in server.log if r.path == "/api/public/otel/v1/traces"]
    assert removed == [f"GET /api/public/datasets/{DATASET}/runs"]  # the one above, none by triage
    # v4's real-time ingestion, as the SDK's exporter asks for it (else the spans land minutes later)
    assert otlp and all(
        {k.lower(): v for k, v in r.request_headers.items()}.get("x-langfuse-ingestion-version") == "4" for r in otlp
    )
    assert {
        "POST /api/public/otel/v1/traces 200",
        "GET /api/public/experiments 200",
        "GET /api/public/experiment-items 200",
        f"GET /api/public/datasets/{DATASET}/runs 404",
        "POST /api/public/scores 202 (SDK contract)",
        "GET /api/public/v3/scores 200",
    } <= checked
    assert "unvalidated" not in checked


@pytest.mark.parametrize("v4", [False, True], ids=["v3", "v4"])
def test_each_generation_keeps_its_runs_once_and_a_decided_result_is_final(
    v4: bool, virtual_time: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The same backend calls on both generations: the generation asked once and logged; writing
    the same cases twice keeps one item each; an undecided result is written over, a decided one
    never; and only the generation's own endpoints are called."""
    run = CheckRun(dataset=DATASET, name="r", created_at=NOW, metadata={"created_by": "triage check"})
    first = [
        RunItemResult(item_id="c-1", trace_id="t-c-1", outcome="pass"),
        RunItemResult(item_id="c-2", trace_id="t-c-2", outcome="undecided"),
    ]
    second = [
        RunItemResult(item_id="c-1", trace_id="t-c-1b", outcome="fail"),  # held decided: stays a pass
        RunItemResult(item_id="c-2", trace_id="t-c-2b", outcome="pass"),  # held undecided: written over
    ]
    caplog.set_level(logging.INFO, logger="triage.sources.langfuse")
    with LangfuseStandIn(v4=v4) as server:
        with backend_for(server) as backend:
            backend.ensure_dataset(DATASET, "cases", {})
            backend.upsert_dataset_items([item("c-1", "q1?", cite=url("a")), item("c-2", "q2?", cite=url("a"))])
            assert backend.write_dataset_run(run, first).written == ["c-1", "c-2"]
            assert sorted(backend.write_dataset_run(run, second).written) == ["c-1", "c-2"]
            runs = backend.dataset_runs(DATASET)
            read = backend.dataset_run_results(runs[0])
        asked = [r for r in server.log if r.path == "/api/public/experiments" and r.query.get("limit") == ["1"]]
        paths = {r.path for r in server.log}
    assert len(asked) == 1  # the generation, asked once
    said = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "langfuse_generation"]
    assert len(said) == 1 and said[0].startswith(f"langfuse: a {'v4' if v4 else 'v3'} server: triage check's runs")
    assert [r.name for r in runs] == ["r"] and runs[0].by_check and runs[0].created_at == NOW
    assert {k: v.outcome for k, v in read.items()} == {"c-1": "pass", "c-2": "pass"}
    assert read["c-2"].trace_id in {"t-c-2", "t-c-2b"}
    assert len(check_scores(server)) == 2  # one score per case: rewritten in place, never doubled
    if v4:
        assert len(server.otel_spans()) == 2 and server.otel_problems == []
        assert not any(removed_on_v4("GET", p) or removed_on_v4("POST", p) for p in paths)
        assert read["c-2"].trace_id == "t-c-2b"  # the item's output names the agent's newest trace
    else:
        assert len(server.run_items_of(DATASET, "r")) == 2
        assert "/api/public/otel/v1/traces" not in paths and "/api/public/experiment-items" not in paths


def test_a_v4_rerun_resumes_its_experiment_from_the_listing(virtual_time: VirtualClock) -> None:
    """The run read back is the same experiment (its id, its start: the scores' timestamp), and a
    result whose score does not land is not added (a rerun writes it)."""
    run = CheckRun(dataset=DATASET, name="nightly", created_at=NOW - timedelta(hours=1), metadata={})
    with LangfuseStandIn(v4=True) as server:
        with backend_for(server, confirm_wait_seconds=1.0) as backend:
            backend.ensure_dataset(DATASET, "cases", {})
            backend.upsert_dataset_items([item("c-1", "q1?", cite=url("a")), item("c-2", "q2?", cite=url("a"))])
            trace_2, _ = item_ids(DATASET, "nightly", "c-2")
            server.drop_score_ids.add(check_score_id(DATASET, "nightly", "c-2", trace_2))
            outcome = backend.write_dataset_run(run, [
                RunItemResult(item_id="c-1", trace_id="t-1", outcome="fail"),
                RunItemResult(item_id="c-2", trace_id="t-2", outcome="pass"),
            ])  # fmt: skip
            assert outcome.written == ["c-1"] and "score was not written" in outcome.failed["c-2"]
            [listed] = backend.dataset_runs(DATASET)
            assert listed.id == experiment_id(server.project_id, dataset_id(server), "nightly")
            assert listed.created_at == run.created_at and listed.dataset_id == dataset_id(server)
            server.drop_score_ids.clear()
            again = backend.write_dataset_run(listed, [RunItemResult(item_id="c-2", trace_id="t-2", outcome="pass")])
            read = backend.dataset_run_results(listed)
    assert again.written == ["c-2"]
    assert {k: v.outcome for k, v in read.items()} == {"c-1": "fail", "c-2": "pass"}
    assert {r["timestamp"] for r in check_scores(server)} == {run.created_at}


@pytest.mark.slow
def test_the_official_sdk_reads_the_experiment_back(virtual_time: VirtualClock) -> None:
    """langfuse 5.x (the test extra) lists the experiment and its items from the stand-in, and derives
    the same experiment id from the dataset and the run name."""
    from langfuse import Langfuse

    run = CheckRun(dataset=DATASET, name="sdk-run", created_at=NOW, description="triage check: sdk", metadata={})
    with LangfuseStandIn(v4=True) as server:
        with backend_for(server) as backend:
            backend.ensure_dataset(DATASET, "cases", {})
            backend.upsert_dataset_items([item("c-1", "q1?", cite=url("a"))])
            result = RunItemResult(item_id="c-1", trace_id="t-1", outcome="pass", answer="See the page.")
            assert backend.write_dataset_run(run, [result]).written == ["c-1"]
        did = dataset_id(server)
        client = Langfuse(
            public_key=server.public_key, secret_key=server.secret_key, base_url=server.url, tracing_enabled=False
        )
        try:
            since = datetime(2000, 1, 1, tzinfo=UTC)
            experiments = client.api.experiments.list(from_start_time=since, fields="core,metadata")
            items = client.api.experiments.list_items(
                from_start_time=since, experiment_id=experiments.data[0].id, fields="core,dataset,io,scores"
            )
            derived = client._create_experiment_id(
                project_id=server.project_id, dataset_id=did, run_name="sdk-run"
            )
        finally:
            client.shutdown()
    [experiment] = experiments.data
    assert (experiment.id, experiment.name, experiment.item_count) == (derived, "sdk-run", 1)
    assert experiment.description == "triage check: sdk" and experiment.dataset_id == did
    [sdk_item] = items.data
    assert sdk_item.experiment_item_id == "c-1" and sdk_item.experiment_id == derived
    assert sdk_item.experiment_dataset_id == did
    assert sdk_item.output["outcome"] == "pass" and sdk_item.output["answer"] == "See the page."
    assert sdk_item.expected_output["must_cite"] == [url("a")]
    assert [(s.name, s.value) for s in sdk_item.scores or []] == [(CHECK_SCORE, "pass")]


@pytest.mark.slow
def test_on_v4_a_huge_result_is_clipped_and_a_secret_masked_in_the_span_and_the_score(
    virtual_time: VirtualClock,
) -> None:
    """The v3 path's guarantees hold on v4: the result as stored is clipped under the size a store
    takes (never an endless exit 5), and the settings' secrets are masked in the item and its score."""
    items = cases(1)
    huge = AgentRun(
        answer=f"key {SECRET} " + "x" * 100_000, sources=[url("a"), *(url(f"p{i}") + "y" * 3000 for i in range(530))]
    )
    with LangfuseStandIn(v4=True) as server, backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        backend.upsert_dataset_items(list(items.values()))
        opts = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, trace_wait=0, secrets=(SECRET,))
        result = asyncio.run(
            run_check(items, agent=FakeAgent({"question 0?": huge}), judge=FakeJudge(), runs=backend, options=opts,
                      tools=TOOLS)
        )  # fmt: skip
        read = backend.dataset_run_results(backend.dataset_runs(DATASET)[0])
        spans = server.otel_spans()
        scores = check_scores(server)
    assert result.not_written == {} and result.written == 1 and result.exit_code == ExitCode.OK
    assert read["c0"].outcome == "pass" and read["c0"].clipped and "the answer" in read["c0"].clipped
    [span] = spans
    output = span["attributes"]["langfuse.observation.output"]
    assert len(output.encode()) <= STORED_RESULT_BYTES + 1_000  # the stored result and its keys
    text = json.dumps([spans, scores], default=str)
    assert SECRET not in text and "***" in output and len(scores) == 1


@pytest.mark.slow
def test_two_v4_runs_of_one_name_at_once_never_double_an_item_or_a_score() -> None:
    items = cases(8)
    with LangfuseStandIn(v4=True) as server:
        done = two_runs_at_once(server, items)
        listed = get(server, "/api/public/experiment-items", fromStartTime=LONG_AGO)["data"]
        experiments = get(server, "/api/public/experiments", fromStartTime=LONG_AGO)["data"]
        scores = check_scores(server)
    assert len(done) == 2 and all(r.exit_code == ExitCode.OK for r in done)
    assert sorted(i["experimentItemId"] for i in listed) == sorted(items)
    assert len(experiments) == 1 and len({s["id"] for s in scores}) == len(scores) == len(items)
