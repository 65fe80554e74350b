"""`triage promote`: reviewers' corrections and selected failures become dataset items, once.

The same records go to the Langfuse stand-in (every exchange validated against
../shared/langfuse/openapi.yml), the embedded store and a JSONL file; each run twice: the second
run writes nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests.doubles.langfuse_server import LangfuseStandIn, iso
from tests.factories import trace_line
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - `openapi` is a fixture
from triage.cli import cli
from triage.domain.kernel import Window
from triage.domain.records import Layer
from triage.domain.scores import score_id
from triage.domain.worklist import DatasetItem, regression_item_id
from triage.errors import ExitCode
from triage.regression import EXPECTATIONS, PromoteOptions, promote_from
from triage.settings import load_config
from triage.sinks.exports import DatasetFile, render_promote
from triage.sources.store import Store

NOW = datetime.now(UTC).replace(microsecond=0)
DOCS = "https://www.kubeflow.org/docs/components/pipelines/user-guides/core-functions/"
DATASET = "triage-regressions"
SELECT = ["--signature", "sig-bbbb2222", "--layer", "content_gap_hallucination", "--trace", "t-none"]


def score(trace_id: str, name: str, value: Any, *, data_type: str = "CATEGORICAL", **extra: Any) -> dict[str, Any]:
    body = {
        "id": extra.pop("id", f"{trace_id}-{name}-{extra.get('metadata', {}).get('reviewer', 'job')}"),
        "name": name,
        "dataType": data_type,
        "value": value,
        "traceId": trace_id,
        "timestamp": iso(extra.pop("at", NOW - timedelta(hours=1))),
        "source": extra.pop("source", "API"),
    }
    body.update(extra)
    return body


def triaged(
    trace_id: str, layer: str, component: str, *, signature: str | None = None, facts: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The job's scores, as `triage feedback --write` stores them (the signature a score of its own)."""
    metadata: dict[str, Any] = {
        "facts": {"agent_searched": True, "agent_searched_collections": ["docs"], **(facts or {})},
        "judge": "heuristic",
        "prompt_version": None,
        "rule_version": "1",
        "owners": ["kubeflow/docs-agent"],
        "component_from": "sources",
        "votes": [f"vote-{trace_id}"],
    }
    at = NOW - timedelta(hours=3)
    signed = (
        [score(trace_id, "triage_signature", signature, id=score_id(trace_id, "triage_signature", "1"),
               metadata={"layer": layer, "component": component, "rule_version": "1"}, at=at)]
        if signature else []
    )  # fmt: skip
    return signed + [
        score(trace_id, "triage_layer", layer, id=score_id(trace_id, "triage_layer", "1"), metadata=metadata, at=at,
              comment=f"the {layer} failed"),
        score(trace_id, "triage_component", component, id=score_id(trace_id, "triage_component", "1"),
              metadata=metadata, at=at),
    ]


def review(trace_id: str, reviewer: str, verdict: str, **fields: str) -> list[dict[str, Any]]:
    """The relay's scores of one reviewer: verdict, corrected_answer (CORRECTION), the others TEXT."""
    meta = {"reviewer": reviewer}
    rows = [score(trace_id, "verdict", verdict, metadata=meta)]
    for name, value in fields.items():
        data_type = "CORRECTION" if name == "corrected_answer" else "TEXT"
        rows.append(score(trace_id, name, value, data_type=data_type, metadata=meta))
    return rows


def record(trace_id: str, question: str, answer: str, scores: list[dict[str, Any]]) -> dict[str, Any]:
    line = trace_line(
        trace_id, question, answer, [("search_kubeflow_docs", DOCS, "Pipelines have dsl.If.")],
        at=NOW - timedelta(hours=3),
    )
    line["scores"] += scores
    return line


def records() -> list[dict[str, Any]]:
    return [
        # a reviewer's negative verdict with a corrected answer (and a note): promoted
        record(
            "t-corr", "How do I branch in a pipeline?", "Use dsl.Switch.",
            triaged("t-corr", "generation", "pipelines", signature="sig-aaaa1111",
                    facts={"answer_sources": [DOCS], "unsupported_claims": ["dsl.Switch exists"]})
            + review("t-corr", "ana", "negative", corrected_answer="Use dsl.If (dsl.Condition before KFP 2).",
                     note="see the control-flow page"),
        ),
        # a negative verdict with the expected tool behaviour only: promoted
        record(
            "t-tool", "Is the katib UI bug fixed?", "It works as documented.",
            triaged("t-tool", "tool_routing", "katib", facts={"answer_collection": "issues"})
            + review("t-tool", "bob", "negative", expected_tool_behavior="search the GitHub issues first"),
        ),
        # selected by signature; a person's ANNOTATION triage_layer score beside the job's is not the job's
        record(
            "t-sig", "Where do pipeline artifacts go?", "Nowhere.",
            triaged("t-sig", "retrieval", "pipelines", signature="sig-bbbb2222",
                    facts={"answer_collection": "docs", "answer_sources": [DOCS]})
            + [score("t-sig", "triage_layer", "ok", id="annot-1", source="ANNOTATION", metadata={"reviewer": "cy"})],
        ),
        # selected by layer (an older run: no signature score)
        record(
            "t-gap", "Can katib tune on TPUs?", "Yes, set tpu: true.",
            triaged("t-gap", "content_gap_hallucination", "katib", facts={"unsupported_claims": ["tpu: true"]}),
        ),
        # an end user's "correction" is a vote, not a review: not promoted
        record(
            "t-user", "What is KFP?", "A pipeline tool.",
            triaged("t-user", "generation", "pipelines")
            + review("t-user", "user:anonymous", "negative", corrected_answer="=HYPERLINK(\"http://evil\")"),
        ),
        # a negative verdict with nothing expected: nothing to promote
        record("t-neg", "What is Kubeflow?", "A cloud.", triaged("t-neg", "generation", "general")
               + review("t-neg", "ana", "negative")),
        # selected by id but never triaged and never corrected: skipped with the reason
        record("t-none", "Hello?", "Hi.", []),
    ]


def invoke(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, ["promote", *args], env=env, catch_exceptions=False)


def langfuse_env(server: LangfuseStandIn) -> dict[str, str]:
    return {
        **server.env,
        "LANGFUSE_TIMEOUT": "5",
    }


def store_env(path: Path) -> dict[str, str]:
    return {"TRIAGE_STORE": str(path), "LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}


def actions(result: Result) -> dict[str, str]:
    return {case["trace_id"]: case["action"] for case in json.loads(result.stdout)["cases"]}


EXPECTED_ACTIONS = {"t-corr": "created", "t-tool": "created", "t-sig": "created", "t-gap": "created",
                    "t-none": "skipped"}


def check_items(items: dict[str, dict[str, Any]]) -> None:
    """The items' content, the same whatever the sink (Langfuse field names)."""
    assert set(items) == {regression_item_id(DATASET, t) for t in ("t-corr", "t-tool", "t-sig", "t-gap")}
    corr = items[regression_item_id(DATASET, "t-corr")]
    assert corr["sourceTraceId"] == "t-corr"
    assert corr["input"]["question"] == "How do I branch in a pipeline?"
    assert corr["input"]["trace_input"] == "How do I branch in a pipeline?"
    assert corr["input"]["tool_calls"] == [
        {"tool": "search_kubeflow_docs", "collection": "docs", "args": {"query": "How do I branch in a pipeline?"},
         "error": False}
    ]
    assert corr["input"]["retrieved_sources"] == [DOCS]
    assert corr["expectedOutput"]["answer"] == "Use dsl.If (dsl.Condition before KFP 2)."
    meta = corr["metadata"]
    assert (meta["layer"], meta["component"], meta["owners"], meta["signature"]) == (
        "generation", "pipelines", ["kubeflow/docs-agent"], "sig-aaaa1111")
    assert (meta["reviewer"], meta["verdict"], meta["note"], meta["expected_from"]) == (
        "ana", "negative", "see the control-flow page", "correction")
    assert meta["original_answer"] == "Use dsl.Switch."
    tool = items[regression_item_id(DATASET, "t-tool")]
    assert tool["expectedOutput"] == {
        "answer": None, "tool_behavior": "search the GitHub issues first",
        "expectation": "The reviewer's expected tool behaviour.",
    }
    sig = items[regression_item_id(DATASET, "t-sig")]
    assert sig["metadata"]["layer"] == "retrieval"  # the job's score, not the person's ANNOTATION
    assert sig["expectedOutput"]["expectation"] == EXPECTATIONS[Layer.RETRIEVAL]
    assert sig["expectedOutput"]["tool_behavior"] == "call search_kubeflow_docs (the docs collection)"
    assert sig["expectedOutput"]["must_cite"] == [DOCS]
    gap = items[regression_item_id(DATASET, "t-gap")]
    assert gap["metadata"]["signature"] is None
    assert gap["expectedOutput"]["decline"] is True
    assert gap["expectedOutput"]["must_not_claim"] == ["tpu: true"]


# -- Langfuse ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_langfuse_items_are_created_once_and_every_exchange_matches_the_spec(openapi: Any) -> None:  # noqa: F811
    with LangfuseStandIn(records=records()) as server:
        env = langfuse_env(server)
        first = invoke(env, *SELECT, "--format", "json")
        assert first.exit_code == 0, first.output
        assert actions(first) == EXPECTED_ACTIONS
        assert json.loads(first.stdout)["dataset_created"] is True
        posted = [r for r in server.log if r.method == "POST" and r.path == "/api/public/dataset-items"]
        assert len(posted) == 4
        check_items({item["id"]: item for item in server.dataset_items_of(DATASET)})
        for item in server.dataset_items_of(DATASET):
            assert item["status"] == "ACTIVE"

        server.reset_log()
        second = invoke(env, *SELECT, "--format", "json")
        assert second.exit_code == 0
        assert set(actions(second).values()) == {"unchanged", "skipped"}
        assert [r for r in server.log if r.method == "POST"] == []  # a rerun writes nothing
        assert set(server.dataset_item_versions.values()) == {1}  # no new item version either

        # a changed correction updates its item alone (a new version of it)
        server.load([{"traceId": "t-corr", "observations": [], "scores": [
            score("t-corr", "corrected_answer", "Use dsl.If.", data_type="CORRECTION",
                  metadata={"reviewer": "ana"}, at=NOW - timedelta(minutes=30), id="t-corr-fix")]}])
        third = invoke(env, *SELECT, "--format", "json")
        assert actions(third)["t-corr"] == "updated" and Counter(actions(third).values())["unchanged"] == 3
        assert server.dataset_item_versions[regression_item_id(DATASET, "t-corr")] == 2

        # the exchanges (including the ones the test makes to show the error shapes)
        import httpx

        auth = (server.public_key, server.secret_key)
        httpx.get(f"{server.url}/api/public/dataset-items", params={"datasetName": "nope"}, auth=auth)
        httpx.get(f"{server.url}/api/public/dataset-items/{regression_item_id(DATASET, 't-sig')}", auth=auth)
        httpx.post(f"{server.url}/api/public/dataset-items", json={"datasetName": "nope", "input": 1}, auth=auth)
        checked = {validate(openapi, entry) for entry in server.log}
    assert {
        "GET /api/public/v2/datasets/triage-regressions 200",
        "GET /api/public/dataset-items 200",
        "GET /api/public/dataset-items 404",
        "POST /api/public/dataset-items 200",
        "POST /api/public/dataset-items 404",
        f"GET /api/public/dataset-items/{regression_item_id(DATASET, 't-sig')} 200",
        "GET /api/public/v3/scores 200",
        "GET /api/public/v2/observations 200",
    } <= checked
    assert "unvalidated" not in checked


@pytest.mark.slow
def test_the_first_run_exchanges_match_the_spec(openapi: Any) -> None:  # noqa: F811
    """The dataset read that answers 404, its creation, and an empty item listing."""
    with LangfuseStandIn(records=records()) as server:
        assert invoke(langfuse_env(server), "--trace", "t-corr").exit_code == 0
        checked = {validate(openapi, entry) for entry in server.log}
    assert {
        "GET /api/public/v2/datasets/triage-regressions 404",
        "POST /api/public/v2/datasets 200",
        "POST /api/public/dataset-items 200",
    } <= checked
    assert "unvalidated" not in checked


@pytest.mark.slow
def test_an_id_held_by_another_dataset_fails_that_item_alone_and_archived_items_stay_archived() -> None:
    with LangfuseStandIn(records=records()) as server:
        env = langfuse_env(server)
        assert invoke(env, "--no-corrections", "--trace", "t-corr").exit_code == 0
        import httpx

        auth = (server.public_key, server.secret_key)
        # a maintainer archives the item; someone else's dataset holds the id t-tool's item will want
        corr_id = regression_item_id(DATASET, "t-corr")
        httpx.post(f"{server.url}/api/public/dataset-items",
                   json={"datasetName": DATASET, "id": corr_id, "status": "ARCHIVED"}, auth=auth)
        httpx.post(f"{server.url}/api/public/v2/datasets", json={"name": "other"}, auth=auth)
        httpx.post(f"{server.url}/api/public/dataset-items",
                   json={"datasetName": "other", "id": regression_item_id(DATASET, "t-tool"), "input": "x"}, auth=auth)
        server.load([{"traceId": "t-corr", "observations": [], "scores": [
            score("t-corr", "corrected_answer", "Use dsl.If.", data_type="CORRECTION",
                  metadata={"reviewer": "ana"}, at=NOW - timedelta(minutes=30), id="t-corr-fix")]}])
        result = invoke(env, "--format", "json")
        assert result.exit_code == ExitCode.NOT_WRITTEN, result.output
        cases = {c["trace_id"]: c for c in json.loads(result.stdout)["cases"]}
        assert cases["t-corr"]["action"] == "updated"
        assert cases["t-tool"]["action"] == "failed"
        assert "already exists in a dataset other than" in cases["t-tool"]["reason"]
        held = {i["id"]: i for i in server.dataset_items_of(DATASET)}
        assert held[corr_id]["status"] == "ARCHIVED"  # triage never sends a status
        assert held[corr_id]["expectedOutput"]["answer"] == "Use dsl.If."


@pytest.mark.slow
def test_a_legacy_server_is_read_through_the_old_trace_api() -> None:
    with LangfuseStandIn(records=records(), legacy=True) as server:
        result = invoke(langfuse_env(server), *SELECT, "--format", "json")
        assert result.exit_code == 0, result.output
        assert actions(result) == EXPECTED_ACTIONS
        check_items({item["id"]: item for item in server.dataset_items_of(DATASET)})


# -- the embedded store and a JSONL file ------------------------------------------------------


def loaded_store(path: Path) -> None:
    with Store(path) as store:
        store.import_lines([json.dumps(r) for r in records()], "test")


def store_items(path: Path) -> dict[str, dict[str, Any]]:
    with Store(path) as store:
        return {i.id: wire(i) for i in store.dataset_items(DATASET).values()}


def wire(item: DatasetItem) -> dict[str, Any]:
    return {
        "id": item.id, "input": item.input, "expectedOutput": item.expected_output, "metadata": item.metadata,
        "sourceTraceId": item.source_trace_id, "status": item.status,
    }


def test_the_embedded_store_holds_the_items_once(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    loaded_store(path)
    env = store_env(path)
    first = invoke(env, *SELECT, "--format", "json")
    assert first.exit_code == 0, first.output
    assert actions(first) == EXPECTED_ACTIONS
    check_items(store_items(path))
    second = invoke(env, *SELECT, "--format", "json")
    assert set(actions(second).values()) == {"unchanged", "skipped"}
    assert json.loads(second.stdout)["dataset_created"] is False


def test_a_jsonl_export_works_the_same_way_and_a_rerun_leaves_it_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    loaded_store(path)
    out = tmp_path / "cases.jsonl"
    first = invoke(store_env(path), *SELECT, "--jsonl", str(out), "--format", "json")
    assert first.exit_code == 0, first.output
    assert actions(first) == EXPECTED_ACTIONS
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(line["datasetName"] == DATASET for line in lines)
    check_items({line["id"]: line for line in lines})
    before, stamp = out.read_bytes(), out.stat().st_mtime_ns
    second = invoke(store_env(path), *SELECT, "--jsonl", str(out), "--format", "json")
    assert set(actions(second).values()) == {"unchanged", "skipped"}
    assert out.read_bytes() == before and out.stat().st_mtime_ns == stamp  # not even rewritten
    assert store_items(path) == {}  # the export went to the file, not the store


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    loaded_store(path)
    result = invoke(store_env(path), *SELECT, "--dry-run")
    assert result.exit_code == 0
    assert "Dry run, nothing written; a run would give: 4 created" in result.stdout
    with Store(path) as store:
        assert store.dataset_items(DATASET) == {}
        assert store.ensure_dataset(DATASET, "", {}) is True  # it was not created by the dry run


def test_no_corrections_promotes_the_selection_only(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    loaded_store(path)
    result = invoke(store_env(path), "--no-corrections", "--layer", "content_gap_hallucination", "--format", "json")
    assert actions(result) == {"t-gap": "created"}


def test_an_item_id_is_unique_per_dataset_and_trace() -> None:
    ids = {regression_item_id(d, t) for d in ("a", "b", "a:b") for t in ("t1", "b:t1")}
    assert len(ids) == 6 and regression_item_id("a", "t1") == regression_item_id("a", "t1")
    assert regression_item_id("a:b", "t1") != regression_item_id("a", "b:t1")  # no separator to forge
    # fixed forever: changing the derivation would orphan every item written before
    assert regression_item_id("triage-regressions", "t1") == "7642cd43-e58b-51d0-a5d0-b5d91376f489"


def test_every_layer_has_an_expectation() -> None:
    assert set(EXPECTATIONS) == set(Layer)


def test_hostile_text_cannot_change_the_markdown(tmp_path: Path) -> None:
    hostile = "x | y\n# heading [link](http://evil) <script>"
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(record(hostile, "q?", "a.", triaged(hostile, "retrieval", "general")))], "t")
        result = promote_from(
            store, store, DatasetFile(tmp_path / "out.jsonl"), load_config(None),
            PromoteOptions(traces=(hostile,), now=NOW), window=Window.ending(NOW, 24), target="file",
        )
    text = render_promote(result)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 2  # the header and one case: the newline did not end the row
    assert all(line.replace("\\|", "").count("|") == 8 for line in rows)  # 7 cells, none split
    assert "<script>" not in text and "\\[link\\](http\\://evil)" in text  # no tag, no link, no autolink
    assert not any(line.startswith("# heading") for line in text.splitlines())


def test_a_triage_score_from_before_the_window_still_gives_the_layer(tmp_path: Path) -> None:
    """A layer score carries its trace's start time: a trace of 35 days ago reviewed today keeps its layer."""
    old = record("t-old", "q?", "a.", review("t-old", "ana", "negative", corrected_answer="b."))
    for row in triaged("t-old", "retrieval", "general"):
        row["timestamp"] = iso(NOW - timedelta(days=35))
        old["scores"].append(row)
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        store.import_lines([json.dumps(old)], "t")
        result = promote_from(
            store, store, store, load_config(None), PromoteOptions(since_hours=24 * 7, now=NOW),
            window=Window.ending(NOW, 24 * 7), target="store",
        )
        (item,) = store.dataset_items(DATASET).values()
    assert [(c.trace_id, c.action, c.layer) for c in result.cases] == [("t-old", "created", "retrieval")]
    assert item.metadata["layer"] == "retrieval" and item.expected_output["answer"] == "b."


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_mistyped_store_is_named_never_made(tmp_path: Path, dry_run: bool) -> None:
    """Issue 37: `promote --dry-run` made an empty store at a mistyped TRIAGE_STORE (and promoted
    nothing from it, exit 0)."""
    mistyped = tmp_path / "stoer.sqlite"
    result = CliRunner().invoke(
        cli, ["promote", "--layer", "retrieval", *(["--dry-run"] if dry_run else [])], env=store_env(mistyped)
    )
    assert result.exit_code == 3, result.output
    assert str(mistyped) in result.output and not mistyped.exists()


def test_every_verdict_field_promote_reads_is_one_the_relay_takes_and_a_review_holds() -> None:
    """Promote names the verdict's fields it reads (`_REVIEWED`); a name the relay does not take
    (`VERDICT_FIELD_SPECS`) would be asked of the store forever and never found."""
    from dataclasses import fields

    from triage.domain.config import VERDICT_FIELDS
    from triage.regression import _REVIEWED, _Review

    assert set(_REVIEWED) <= set(VERDICT_FIELDS)
    assert set(_REVIEWED.values()) <= {f.name for f in fields(_Review)}
