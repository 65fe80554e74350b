"""`triage queue`: the real CLI against the Langfuse stand-in, every exchange checked against the spec.

The verdicts are the job's own `triage_layer` scores (built with the job's score id and wire body),
seven layers, with low-confidence and injection-flagged ones among them.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from tests.doubles.langfuse_server import LangfuseStandIn
from tests.sources.test_langfuse_cli import thumbs_down
from tests.sources.test_langfuse_spec import validate
from triage.calibration.queue import choose, sample_key, score_config_specs
from triage.cli import cli
from triage.domain.config import CalibrationConfig
from triage.domain.records import Evidence, Facts, Layer
from triage.domain.review import Decision
from triage.domain.rule import decide, verdict_confidence, walk
from triage.domain.scores import ScoreBody, score_id
from triage.errors import ConfigError

NOW = datetime.now(UTC)
FACT_SCORES = set(CalibrationConfig().fact_scores.values())


# --------------------------------------------------------------------------- data


def facts_for(layer: Layer, confidence: str = "high", injection: bool = False) -> Facts:
    """Facts that the rule maps to `layer`, every judged fact stated with `confidence`."""
    values: dict[Layer, dict[str, Any]] = {
        Layer.AGENT_SKIPPED_RETRIEVAL: {"agent_searched": False},
        Layer.OK: {"retrieved_has_answer": True, "answer_grounded": True, "answer_declined": False},
        Layer.GENERATION: {"retrieved_has_answer": True, "answer_grounded": False, "answer_declined": False},
        Layer.RETRIEVAL: {
            "retrieved_has_answer": False,
            "index_has_answer": True,
            "answer_collection": "docs",
        },
        Layer.TOOL_ROUTING: {
            "retrieved_has_answer": False,
            "index_has_answer": True,
            "answer_collection": "issues",
        },
        Layer.CONTENT_GAP_HANDLED: {
            "retrieved_has_answer": False,
            "index_has_answer": False,
            "answer_declined": True,
            "answer_grounded": True,
        },
        Layer.CONTENT_GAP_HALLUCINATION: {
            "retrieved_has_answer": False,
            "index_has_answer": False,
            "answer_declined": False,
            "answer_grounded": False,
        },
    }
    fields = {"agent_searched": True, "agent_searched_collections": ["docs"], **values[layer]}
    judged = [
        k
        for k in ("retrieved_has_answer", "index_has_answer", "answer_grounded", "answer_declined")
        if k in fields
    ]
    evidence = {name: Evidence(confidence=confidence, note="test") for name in judged}  # type: ignore[arg-type]
    facts = Facts(**fields, evidence=evidence, injection_suspected=injection)
    assert decide(facts) == layer
    return facts


def verdict(
    trace_id: str,
    layer: Layer,
    *,
    confidence: str = "high",
    injection: bool = False,
    at: datetime | None = None,
    rule_version: str = "1",
    facts: Any = None,
) -> dict[str, Any]:
    """A `triage_layer` score as `triage feedback --write` posts it (same id, body and metadata)."""
    facts_json = (
        facts if facts is not None else facts_for(layer, confidence, injection).model_dump(mode="json")
    )
    score = ScoreBody(
        data_type="CATEGORICAL",
        id=score_id(trace_id, "triage_layer", rule_version),
        trace_id=trace_id,
        name="triage_layer",
        value=layer.value,
        comment="a reason",
        metadata={"facts": facts_json, "judge": "llm:test", "rule_version": rule_version},
        timestamp=at or NOW - timedelta(hours=3),
        environment="production",
    )
    return {"traceId": trace_id, "observations": [], "scores": [score.wire()]}


LOW = {"retrieval-low", "generation-low"}
INJECTED = {"ok-injected"}


def night() -> list[dict[str, Any]]:
    """6 confident verdicts per layer, 2 low-confidence, 1 injection-flagged, plus 3 that must
    never be queued: one outside the window, one of another rule version, one a human's."""
    records = [verdict(f"{layer.value}-{i}", layer) for layer in Layer for i in range(6)]
    records.append(verdict("retrieval-low", Layer.RETRIEVAL, confidence="low"))
    records.append(verdict("generation-low", Layer.GENERATION, confidence="low"))
    records.append(verdict("ok-injected", Layer.OK, injection=True))
    records.append(verdict("old", Layer.RETRIEVAL, confidence="low", at=NOW - timedelta(hours=30)))
    records.append(verdict("rule0", Layer.RETRIEVAL, confidence="low", rule_version="0"))
    human = verdict("human", Layer.RETRIEVAL, confidence="low")
    human["scores"][0].update(source="ANNOTATION", id="h1")
    records.append(human)
    return records


def run(server: LangfuseStandIn, *args: str) -> Result:
    env = {
        **server.env,
        "LANGFUSE_TIMEOUT": "5",
    }
    return CliRunner().invoke(cli, ["queue", *args], env=env, catch_exceptions=False)


def queued(server: LangfuseStandIn) -> list[str]:
    return [item["objectId"] for item in server.queue_items()]


def posts(server: LangfuseStandIn) -> list[tuple[str, Any]]:
    return [(r.path, json.loads(r.request_body)) for r in server.log if r.method == "POST"]


@pytest.fixture(scope="module")
def openapi() -> Any:
    from tests.sources.test_langfuse_spec import SPEC

    if not SPEC.is_file():
        pytest.skip(f"the Langfuse OpenAPI file is not here ({SPEC}); it ships in ../shared")
    from openapi_core import Config, OpenAPI

    return OpenAPI.from_file_path(str(SPEC), config=Config(spec_validator_cls=None))


def in_window() -> dict[Layer, list[str]]:
    """The traces of each layer whose verdicts `triage queue` reads from `night()`."""
    ids = {layer: [f"{layer.value}-{i}" for i in range(6)] for layer in Layer}
    ids[Layer.RETRIEVAL].append("retrieval-low")
    ids[Layer.GENERATION].append("generation-low")
    ids[Layer.OK].append("ok-injected")
    return ids


def expected(per_layer: int) -> set[str]:
    """Per layer the first `per_layer` in the hash order, plus every low-confidence and injected one."""
    picked = LOW | INJECTED
    for names in in_window().values():
        picked |= set(sorted(names, key=sample_key)[:per_layer])
    return picked


# --------------------------------------------------------------------------- through the CLI


@pytest.mark.slow
def test_queue_twice_queues_nothing_new_and_every_exchange_matches_the_spec(openapi: Any) -> None:
    with LangfuseStandIn(records=night()) as server:
        first = run(server, "--per-layer", "3")
        assert first.exit_code == 0, first.output
        items = queued(server)
        assert len(items) == len(set(items))  # no trace twice
        assert set(items) == expected(3)  # stratified, plus every low-confidence and injected one
        assert not {"old", "rule0", "human"} & set(items)
        assert (
            f"added {len(expected(3))} traces (sampled 21, low confidence 2, injection suspected 1)"
            in first.output
        )
        layer_of = {t: layer for layer, names in in_window().items() for t in names}
        assert all(sum(1 for t in items if layer_of[t] == layer) >= 3 for layer in Layer)
        assert "created human_layer, human_retrieved_has_answer" in first.output

        # the configs: created once, as the reviewers' labels need them
        configs = {c["name"]: c for c in server.score_configs()}
        assert set(configs) == {"human_layer", *FACT_SCORES}
        layer_config = configs["human_layer"]
        assert layer_config["dataType"] == "CATEGORICAL"
        assert sorted(c["label"] for c in layer_config["categories"]) == sorted(
            layer.value for layer in Layer
        )
        assert all(configs[name]["dataType"] == "BOOLEAN" for name in FACT_SCORES)
        (queue,) = server.annotation_queues()
        assert queue["name"] == "triage-review"
        assert set(queue["scoreConfigIds"]) == {c["id"] for c in configs.values()}

        # never pre-filled: an item is the trace alone, no score is written, nothing names a verdict
        sent = posts(server)
        assert not [path for path, _ in sent if path == "/api/public/scores"]
        item_bodies = [body for path, body in sent if path.endswith("/items")]
        # suggestions first (the two low-confidence verdicts), then the sure ones, each by trace id
        order = sorted(LOW) + sorted(set(items) - LOW)
        assert item_bodies == [{"objectId": t, "objectType": "TRACE"} for t in order]
        assert "suggestions first: 2 suggestions, " in first.output
        listed = [line[2:].split(":")[0] for line in first.output.splitlines() if line.startswith("- ")]
        assert listed == order
        queue_body = next(body for path, body in sent if path == "/api/public/annotation-queues")
        assert not any(layer.value in json.dumps(queue_body) for layer in Layer)
        first_log = list(server.log)

        server.reset_log()
        second = run(server, "--per-layer", "3")
        assert second.exit_code == 0, second.output
        assert "added 0 traces" in second.output and "score configs: all present" in second.output
        assert "annotation queue 'triage-review': found" in second.output
        assert posts(server) == []  # no config, no queue, no item
        assert sorted(queued(server)) == sorted(items)
        assert len(server.score_configs()) == 5

        checked = {validate(openapi, entry) for entry in first_log + server.log}
    assert {
        "GET /api/public/score-configs 200",
        "POST /api/public/score-configs 200",
        "GET /api/public/annotation-queues 200",
        "POST /api/public/annotation-queues 200",
        f"GET /api/public/annotation-queues/{queue['id']}/items 200",
        f"POST /api/public/annotation-queues/{queue['id']}/items 200",
        "GET /api/public/v3/scores 200",
    } <= checked
    assert "unvalidated" not in checked


@pytest.mark.slow
def test_a_larger_share_tops_each_layer_up_and_keeps_what_is_queued() -> None:
    with LangfuseStandIn(records=night()) as server:
        assert run(server, "--per-layer", "2").exit_code == 0
        before = set(queued(server))
        again = run(server, "--per-layer", "4")
        assert again.exit_code == 0, again.output
        after = queued(server)
        assert len(after) == len(set(after)) and before <= set(after)
        # each layer now holds 4: what was there (its 2 sampled, and a low or injected one) counts
        layer_of = {t: layer for layer, names in in_window().items() for t in names}
        assert Counter(layer_of[t] for t in after) == {layer: 4 for layer in Layer}
        assert f"added {28 - len(before)} traces" in again.output


@pytest.mark.slow
def test_a_lost_answer_is_checked_before_the_item_is_sent_again(openapi: Any) -> None:
    with LangfuseStandIn(records=night()) as server:
        # the first item lands but its answer is lost; a later one meets a 503 before it lands
        server.inject("drop_after", path="/items", method="POST")
        server.inject("status", status=503, path="/items", method="POST")
        server.inject("drop_after", path="/api/public/score-configs", method="POST")
        result = run(server, "--per-layer", "3")
        assert result.exit_code == 0, result.output
        items = queued(server)
        assert len(items) == len(set(items)) and set(items) == expected(3)
        names = Counter(c["name"] for c in server.score_configs())
        assert set(names.values()) == {1}  # the config whose answer was lost was not made twice
        checked = {validate(openapi, e) for e in server.log if e.status not in (0, 503)}
    assert "unvalidated" not in checked


@pytest.mark.slow
def test_items_already_in_the_queue_count_and_are_never_added_again() -> None:
    with LangfuseStandIn(records=night()) as server:
        assert run(server, "--per-layer", "0").exit_code == 0  # only the low and injected ones
        assert set(queued(server)) == LOW | INJECTED
        (queue,) = server.annotation_queues()
        # a reviewer added one by hand and completed it
        by_hand = sorted((f"retrieval-{i}" for i in range(6)), key=sample_key)[-1]
        httpx.post(
            f"{server.url}/api/public/annotation-queues/{queue['id']}/items",
            json={"objectId": by_hand, "objectType": "TRACE", "status": "COMPLETED"},
            auth=(server.public_key, server.secret_key),
        ).raise_for_status()
        result = run(server, "--per-layer", "3")
        assert result.exit_code == 0, result.output
        items = queued(server)
        assert len(items) == len(set(items))
        retrieval = {t for t in items if t.startswith("retrieval-") and t != "retrieval-low"}
        # by hand + low-confidence already count: retrieval needs 3 - 2 = 1 more, the first in hash order
        first = sorted((f"retrieval-{i}" for i in range(6)), key=sample_key)[0]
        assert retrieval == {by_hand, first}
        assert "| retrieval | 7 | 2 | 1 |" in result.output


@pytest.mark.slow
def test_dry_run_writes_nothing() -> None:
    with LangfuseStandIn(records=night()) as server:
        result = run(server, "--per-layer", "3", "--dry-run")
        assert result.exit_code == 0, result.output
        assert posts(server) == [] and server.queue_items() == [] and server.score_configs() == []
        assert f"would add {len(expected(3))} traces" in result.output
        assert "annotation queue 'triage-review': to be created" in result.output


@pytest.mark.slow
def test_an_existing_config_that_cannot_take_the_labels_is_a_config_error() -> None:
    with LangfuseStandIn(records=night()) as server:
        server.add_score_config(
            {"name": "human_layer", "dataType": "CATEGORICAL", "categories": [{"label": "bad", "value": 0}]}
        )
        result = run(server)
        assert result.exit_code == 3
        assert "human_layer" in result.output and "archive it in Langfuse" in result.output
        assert posts(server) == []


@pytest.mark.slow
def test_an_archived_config_is_passed_over_and_a_fitting_one_is_reused() -> None:
    with LangfuseStandIn(records=night()) as server:
        server.add_score_config({"name": "human_layer", "dataType": "NUMERIC"}, archived=True)
        reused = server.add_score_config({"name": "human_answer_grounded", "dataType": "BOOLEAN"})
        result = run(server, "--per-layer", "1")
        assert result.exit_code == 0, result.output
        names = Counter(c["name"] for c in server.score_configs())
        assert names["human_layer"] == 2 and names["human_answer_grounded"] == 1
        (queue,) = server.annotation_queues()
        assert reused["id"] in queue["scoreConfigIds"]


@pytest.mark.slow
def test_verdicts_written_by_triage_feedback_are_what_queue_reads() -> None:
    traces = thumbs_down(12)
    with LangfuseStandIn(records=traces) as server:
        env = server.env
        job = CliRunner().invoke(
            cli, ["feedback", "--write", "--judge", "heuristic"], env=env, catch_exceptions=False
        )
        assert job.exit_code == 0, job.output
        result = run(server, "--per-layer", "2")
        assert result.exit_code == 0, result.output
        assert "12 verdicts" in result.output
        rows = [r for r in server.score_rows() if r["name"] == "triage_layer"]
        layers = Counter(r["stringValue"] for r in rows)
        low = {
            r["traceId"]
            for r in rows
            if verdict_confidence(Facts.model_validate(r["metadata"]["facts"])) == "low"
            or r["metadata"]["facts"]["injection_suspected"]
        }
        items = set(queued(server))
        assert low <= items
        assert len(items) <= len(low) + 2 * len(layers)
        # each verdict's metadata says whether it is sure, as its facts' path does; the queue
        # lists the suggestions first
        sure = {}
        for r in rows:
            facts = Facts.model_validate(r["metadata"]["facts"])
            assert r["metadata"]["sure"] is walk(facts).sure
            assert r["metadata"]["certainty"] == ("sure" if walk(facts).sure else "suggestion")
            sure[r["traceId"]] = r["metadata"]["sure"]
        order = queued(server)
        assert order == sorted(order, key=lambda t: (sure[t], t))


def test_without_langfuse_queue_is_a_configuration_error() -> None:
    result = CliRunner().invoke(cli, ["queue"], catch_exceptions=False)
    assert result.exit_code == 3
    assert "set LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY" in result.output
    assert "the embedded store has no annotation queues" in result.output


# --------------------------------------------------------------------------- the stand-in's Langfuse behaviour


@pytest.mark.slow
def test_the_stand_in_keeps_langfuses_pitfall_and_checks() -> None:
    with LangfuseStandIn() as server:
        auth = (server.public_key, server.secret_key)
        config = httpx.post(
            f"{server.url}/api/public/score-configs", json={"name": "b", "dataType": "BOOLEAN"}, auth=auth
        ).json()
        assert [c["label"] for c in config["categories"]] == ["True", "False"]
        for bad in (
            {"name": "b", "dataType": "BOOLEAN", "categories": []},
            {"name": "c", "dataType": "CATEGORICAL", "categories": [{"label": "x", "value": 0}] * 2},
            {"name": "x" * 36, "dataType": "BOOLEAN"},
            {"name": "a/b", "dataType": "BOOLEAN"},
        ):
            answer = httpx.post(f"{server.url}/api/public/score-configs", json=bad, auth=auth)
            assert answer.status_code == 400, bad
        queue = httpx.post(
            f"{server.url}/api/public/annotation-queues",
            json={"name": "q", "scoreConfigIds": [config["id"]]},
            auth=auth,
        ).json()
        again = httpx.post(
            f"{server.url}/api/public/annotation-queues",
            json={"name": "q", "scoreConfigIds": [config["id"]]},
            auth=auth,
        )
        assert again.status_code == 409
        for _ in range(2):  # the pitfall: the same trace twice makes two items
            httpx.post(
                f"{server.url}/api/public/annotation-queues/{queue['id']}/items",
                json={"objectId": "t1", "objectType": "TRACE"},
                auth=auth,
            ).raise_for_status()
        assert [i["objectId"] for i in server.queue_items()] == ["t1", "t1"]
        page = httpx.get(
            f"{server.url}/api/public/annotation-queues/{queue['id']}/items",
            params={"limit": 1, "page": 2},
            auth=auth,
        ).json()
        assert page["meta"] == {"page": 2, "limit": 1, "totalItems": 2, "totalPages": 2}
        too_many = httpx.get(f"{server.url}/api/public/score-configs", params={"limit": 101}, auth=auth)
        assert too_many.status_code == 400


# --------------------------------------------------------------------------- the sampling, pure


def decision(trace_id: str, layer: Layer, confidence: str = "high", injection: bool = False) -> Decision:
    return Decision(trace_id=trace_id, layer=layer, facts=facts_for(layer, confidence, injection))


def test_the_sample_is_stratified_stable_and_order_free() -> None:
    decisions = [decision(f"{layer.value}-{i}", layer) for layer in Layer for i in range(20)]
    picks, counts, _ = choose(decisions, set(), 5)
    assert Counter(p.layer for p in picks) == {layer: 5 for layer in Layer}
    assert all(p.reasons == ("sample",) for p in picks)
    again, _, _ = choose(list(reversed(decisions)), set(), 5)
    assert again == picks
    assert all(counts[layer].verdicts == 20 and counts[layer].added == 5 for layer in Layer)


def test_low_confidence_unreadable_and_injected_verdicts_always_go_in() -> None:
    decisions = [
        decision("a", Layer.RETRIEVAL, confidence="medium"),
        decision("b", Layer.RETRIEVAL, confidence="low"),
        decision("c", Layer.OK, injection=True),
        Decision(trace_id="d", layer=Layer.GENERATION, facts=None),
    ]
    picks, _, unreadable = choose(decisions, {"x"}, 0)
    assert {p.trace_id: p.reasons for p in picks} == {
        "b": ("low_confidence",),
        "c": ("injection",),
        "d": ("low_confidence",),
    }
    assert unreadable == 1
    picks, _, _ = choose(decisions, {"b", "c"}, 0)
    assert [p.trace_id for p in picks] == ["d"]


def test_config_names_langfuse_would_refuse_fail_before_any_call() -> None:
    specs = score_config_specs(CalibrationConfig())
    assert [s.data_type for s in specs] == ["CATEGORICAL"] + ["BOOLEAN"] * 4
    assert [c.label for c in specs[0].categories or []] == [layer.value for layer in Layer]
    with pytest.raises(ConfigError, match="1-35 characters"):
        score_config_specs(CalibrationConfig(layer_score="x" * 36))
    with pytest.raises(ConfigError, match="may hold only"):
        score_config_specs(CalibrationConfig(fact_scores={"answer_grounded": "grounded?"}))
    with pytest.raises(ConfigError, match="repeat"):
        score_config_specs(CalibrationConfig(fact_scores={"answer_grounded": "human_layer"}))


def test_suggestions_are_queued_before_sure_verdicts() -> None:
    """A verdict is sure only when every judged fact its layer rests on is `high`; the queue puts
    the suggestions first (a medium fact anywhere on the rule's path makes one), each group in trace
    id order, whatever the order the verdicts came in."""
    decisions = [
        decision("a-sure", Layer.RETRIEVAL),
        decision("b-medium", Layer.OK, confidence="medium"),
        decision("c-sure", Layer.CONTENT_GAP_HANDLED),
        decision("d-low", Layer.GENERATION, confidence="low"),
        decision("e-skipped", Layer.AGENT_SKIPPED_RETRIEVAL, confidence="low"),  # reads no judged fact
        Decision(trace_id="f-unreadable", layer=Layer.OK, facts=None),
    ]
    picks, _, _ = choose(decisions, set(), 10)
    assert [(p.trace_id, p.sure) for p in picks] == [
        ("b-medium", False),
        ("d-low", False),
        ("f-unreadable", False),
        ("a-sure", True),
        ("c-sure", True),
        ("e-skipped", True),
    ]
    again, _, _ = choose(list(reversed(decisions)), set(), 10)
    assert again == picks
    # one medium fact on the path is enough to make a suggestion; one off the path is not
    facts = facts_for(Layer.RETRIEVAL)
    off_path = facts.model_copy(
        update={"answer_grounded": True, "evidence": {**facts.evidence, "answer_grounded": Evidence(confidence="low")}}
    )
    on_path = facts.model_copy(
        update={"evidence": {**facts.evidence, "index_has_answer": Evidence(confidence="medium")}}
    )
    picks, _, _ = choose(
        [
            Decision(trace_id="x", layer=Layer.RETRIEVAL, facts=off_path, confidence=verdict_confidence(off_path)),
            Decision(trace_id="y", layer=Layer.RETRIEVAL, facts=on_path, confidence=verdict_confidence(on_path)),
        ],
        set(),
        2,
    )
    assert [(p.trace_id, p.sure) for p in picks] == [("y", False), ("x", True)]
