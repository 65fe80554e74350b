"""`triage relay` into Langfuse (the stand-in, every exchange checked against openapi.yml): the
outbox, batched delivery, flips that overwrite, an outage the relay rides out, redelivery after
a crash, and back-off in virtual time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.relay.test_relay import relay_config, serving
from tests.sources.test_langfuse_spec import openapi, validate  # noqa: F401 - the fixture
from triage.domain.ports import SourceStats
from triage.domain.scores import ScoreBody
from triage.relay import sqlite as storage
from triage.relay.commits import GroupCommit
from triage.relay.outbox import BACKOFF, LangfuseSink, Worker
from triage.relay.service import Relay
from triage.retry import RetryPolicy
from triage.sources.langfuse.http import LangfuseHttp


def sink_for(srv: LangfuseStandIn) -> LangfuseSink:
    http = LangfuseHttp(
        public_key=srv.public_key,
        secret_key=srv.secret_key,
        base_url=srv.url,
        timeout=2.0,
        retry=RetryPolicy(attempts=1),
        stats=SourceStats(),
    )
    return LangfuseSink(http)


@pytest.fixture
def standin() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as srv:
        yield srv


def wait_for(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def posts(srv: LangfuseStandIn) -> list[Any]:
    return [r for r in srv.requests("/api/public/scores") if r.method == "POST"]


def test_votes_reach_langfuse_batched_and_a_flip_overwrites(tmp_path: Path, standin: LangfuseStandIn) -> None:
    sink = sink_for(standin)
    with serving(tmp_path, sink=sink, config=relay_config(batch_wait_seconds=0.3)) as (client, _):
        ids = set()
        for n in range(60):
            answer = client.post("/api/feedback", json={"contextId": f"c-{n % 20}", "turn": 0, "value": n % 2 == 0,
                                                        "userId": f"u{n % 20}"})  # fmt: skip
            assert answer.status_code == 202 and answer.json()["stored"] == "outbox"
            ids.update(answer.json()["ids"])
        assert len(ids) == 20
        wait_for(lambda: client.get("/readyz").json()["outbox"]["pending"] == 0)
    rows = standin.score_rows()
    assert len(rows) == 20 and {r["id"] for r in rows} == ids  # one physical row per id: true overwrites
    last = {f"c-{n % 20}": n % 2 == 0 for n in range(60)}
    assert {r["sessionId"]: r["value"] == 1.0 for r in rows} == last
    assert all(r["metadata"]["turn"] == 0 and r["metadata"]["userId"].startswith("user:u") for r in rows)
    assert len(posts(standin)) <= 3  # 60 votes, a handful of requests


def test_a_langfuse_outage_loses_nothing(tmp_path: Path, standin: LangfuseStandIn) -> None:
    sink = sink_for(standin)
    with serving(tmp_path, sink=sink, config=relay_config(batch_wait_seconds=0.05)) as (client, app):
        assert app.relay is not None and app.relay.worker is not None
        app.relay.worker.policy = BACKOFF.with_(initial=0.1, maximum=0.1)
        standin.stop()
        for user in ("bob", "eve", "kim"):
            vote = {"traceId": "t-1", "userId": user, "value": "down"}
            assert client.post("/api/feedback", json=vote).status_code == 202
        wait_for(lambda: app.relay is not None and app.relay.worker is not None and app.relay.worker.failures > 0)
        ready = client.get("/readyz").json()
        assert ready["status"] == "ok" and ready["outbox"]["pending"] == 3  # still ready: the outbox holds them
        assert "unreachable" in (ready["delivery"]["last_error"] or "")
        assert "relay_outbox_depth 3" in client.get("/metrics").text
        standin.start()
        wait_for(lambda: client.get("/readyz").json()["outbox"]["pending"] == 0)
    assert sorted(r["metadata"]["userId"] for r in standin.score_rows()) == ["user:bob", "user:eve", "user:kim"]


def test_verdicts_in_langfuse_correction_type_and_cleared_fields_deleted(
    tmp_path: Path, standin: LangfuseStandIn, openapi: Any  # noqa: F811
) -> None:
    sink = sink_for(standin)
    with serving(tmp_path, sink=sink, config=relay_config(batch_wait_seconds=0.05)) as (client, _):
        full = {"traceId": "t-1", "reviewer": "ana", "verdict": "negative", "corrected_answer": "Use v2.",
                "issue_category": "wrong_tool", "note": "n"}  # fmt: skip
        assert client.post("/api/feedback", json=full).status_code == 202
        wait_for(lambda: len(standin.score_rows()) == 4)
        by_name = {r["name"]: r for r in standin.score_rows()}
        assert by_name["corrected_answer"]["dataType"] == "CORRECTION"
        assert by_name["verdict"]["metadata"]["reviewer"] == "ana"
        replaced = {"traceId": "t-1", "reviewer": "ana", "verdict": "false_alarm"}
        assert client.post("/api/feedback", json=replaced).status_code == 202
        wait_for(lambda: len(standin.score_rows()) == 1)
        [left] = standin.score_rows()
        assert (left["name"], left["stringValue"]) == ("verdict", "false_alarm")
        client.post("/api/feedback", json={"contextId": "c", "turn": 1, "value": "up"})
        wait_for(lambda: len(standin.score_rows()) == 2)
    checked = {validate(openapi, entry) for entry in standin.log}
    assert "POST /api/public/scores 202 (SDK contract)" in checked
    assert any(r.method == "DELETE" and r.status == 204 for r in standin.log)


def test_redelivery_after_a_crash_is_harmless(tmp_path: Path, standin: LangfuseStandIn) -> None:
    """A process that dies after Langfuse took a batch but before the outbox forgot it delivers the
    batch again on restart: same ids, same timestamps, so still one row each."""
    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    sink = sink_for(standin)
    ledger = GroupCommit(tmp_path / "relay.sqlite", now=now)
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    import asyncio

    from triage.relay.bodies import parse_feedback

    for user in ("bob", "eve"):
        req = parse_feedback({"traceId": "t", "userId": user, "value": "down"}, max_text={})
        asyncio.run(relay.feedback(req, f"user:{user}"))
    ops = ledger.call(lambda tx: storage.claim(tx, 100))
    assert sink.deliver(ops) == {}  # Langfuse has them; then the process dies before settling
    ledger.close()
    again = GroupCommit(tmp_path / "relay.sqlite", now=now)
    worker = Worker(again, sink, clock, batch_wait=0)
    assert worker.run_once() == 2  # redelivered
    assert worker.run_once() == 0
    assert again.reads.depth()[0] == 0
    again.close()
    assert len(standin.score_rows()) == 2


def test_backoff_and_retry_after_in_virtual_time(tmp_path: Path, standin: LangfuseStandIn) -> None:
    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    sink = sink_for(standin)
    ledger = GroupCommit(tmp_path / "relay.sqlite", now=now)
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    worker = Worker(ledger, sink, clock, batch_wait=0, policy=BACKOFF.with_(initial=1.0, maximum=30.0))
    import asyncio

    from triage.relay.bodies import parse_feedback

    asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:anonymous"))
    standin.inject("status", status=503, count=3, path="/api/public/scores")
    waits = []
    for _ in range(3):
        assert worker.run_once() == 0
        due = ledger.call(storage.due_in)
        waits.append(due)
        assert worker.run_once() == 0  # not due yet: nothing is sent
        clock.sleep(due or 0)
    assert waits[0] is not None and 1.0 <= waits[0] <= 2.0 and 2.0 <= waits[1] <= 3.0 and 4.0 <= waits[2] <= 5.0
    standin.inject("429", seconds=7, path="/api/public/scores")
    assert worker.run_once() == 0
    assert ledger.call(storage.due_in) == pytest.approx(7.0)
    clock.sleep(7)
    assert worker.run_once() == 1
    ledger.close()
    assert len(standin.score_rows()) == 1
    assert len(posts(standin)) == 5  # 3 x 503, 1 x 429, 1 accepted: no request while waiting


def test_a_score_langfuse_refuses_is_set_aside_not_retried_forever(tmp_path: Path, standin: LangfuseStandIn) -> None:
    clock = VirtualClock()
    sink = sink_for(standin)
    ledger = GroupCommit(tmp_path / "relay.sqlite", now=lambda: clock.now().timestamp())
    worker = Worker(ledger, sink, clock, batch_wait=0, max_attempts=1)
    from triage.relay.storage import Row

    stamp = "2026-01-01T00:00:00.000Z"
    good = ScoreBody.from_wire(
        {"id": "g", "name": "user_feedback", "value": 1, "dataType": "BOOLEAN", "traceId": "t", "timestamp": stamp}
    )
    # a source Langfuse reserves for its own evaluators: a 400 for this score alone
    bad = replace(good, id="b", source="EVAL")

    def put(tx: Any) -> None:
        for body in (good, bad):
            tx.put(Row(body.id, "a", "x", "user_feedback", "vote", "t", None, None, "2026-01-01T00:00:00.000Z",
                       body, "2026-01-01T00:00:00.000Z"))  # fmt: skip

    ledger.call(put)
    assert worker.run_once() == 1
    assert ledger.reads.depth()[:2] == (0, 1)  # the refused one is set aside, visible in /metrics
    ledger.close()
    assert [r["id"] for r in standin.score_rows()] == ["g"]
    assert json.loads(standin.requests("/api/public/scores")[0].request_body)[0]["id"] == "g"


def test_the_cli_refuses_half_a_langfuse_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from triage.cli import cli

    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-only")
    result = CliRunner().invoke(cli, ["relay", "--port", "1"])
    assert result.exit_code == 3 and "LANGFUSE_SECRET_KEY" in result.output


def test_a_failed_delivery_never_brings_back_an_older_vote(tmp_path: Path, standin: LangfuseStandIn) -> None:
    """A vote in flight fails while the voter flips it: the retry of the old one is dropped, not
    delivered after the new one (found by bench/relay.py during an outage)."""
    import asyncio

    from triage.relay.bodies import parse_feedback

    clock = VirtualClock()
    sink = sink_for(standin)
    ledger = GroupCommit(tmp_path / "relay.sqlite", now=lambda: clock.now().timestamp())
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    worker = Worker(ledger, sink, clock, batch_wait=0)
    down = parse_feedback({"traceId": "t", "value": "down"}, max_text={})
    asyncio.run(relay.feedback(down, "user:anonymous"))
    in_flight = ledger.call(lambda tx: storage.claim(tx, 10))
    up = parse_feedback({"traceId": "t", "value": "up"}, max_text={})
    asyncio.run(relay.feedback(up, "user:anonymous"))
    retry = {in_flight[0].seq: (clock.now().timestamp() + 5, "Langfuse unreachable")}
    ledger.call(lambda tx: storage.settle(tx, [], retry, {}))
    worker.drain()
    clock.sleep(60)
    worker.drain()
    assert ledger.reads.depth()[0] == 0
    ledger.close()
    [row] = standin.score_rows()
    assert row["value"] == 1.0
    assert len(posts(standin)) == 1


def test_a_full_outbox_is_503_and_readiness_shows_its_depth(tmp_path: Path, standin: LangfuseStandIn) -> None:
    standin.stop()  # nothing drains: the outbox only grows
    sink = sink_for(standin)
    with serving(tmp_path, sink=sink, config=relay_config(outbox_max=2, batch_wait_seconds=5)) as (client, app):
        for user in ("bob", "eve"):
            assert client.post("/api/feedback", json={"traceId": "t", "userId": user, "value": "up"}).status_code == 202
        assert app.relay is not None
        app.relay._depth = None  # the write path reads the depth at most every half second
        full = client.post("/api/feedback", json={"traceId": "t", "userId": "kim", "value": "up"})
        assert full.status_code == 503 and full.headers["retry-after"] == "30"
        assert client.get("/readyz").json()["outbox"]["pending"] == 2
    standin.start()


def test_the_declared_model_becomes_langfuse_score_configs(
    tmp_path: Path, standin: LangfuseStandIn, openapi: Any  # noqa: F811
) -> None:
    from triage.domain.config import DeclaredScore, ScoreSource

    # an existing config that differs from the model is left alone and not attached
    standin.add_score_config({"name": "issue_category", "dataType": "NUMERIC"})
    model = relay_config(
        batch_wait_seconds=0.05,
        scores=[*relay_config().relay.scores, DeclaredScore(name="helpfulness", data_type="NUMERIC", min=1, max=5)],
        sources=[*relay_config().relay.sources, ScoreSource(name="ci", scores=["helpfulness"])],
    )
    sink = LangfuseSink(sink_for(standin).http, model=model.relay)
    with serving(tmp_path, sink=sink, config=model) as (client, _):
        wait_for(lambda: sink._configs_synced)
        client.post("/api/feedback", json={"traceId": "t", "reviewer": "ana", "verdict": "negative",
                                           "issue_category": "wrong_tool", "value": "down"})  # fmt: skip
        client.post("/api/scores", json={"traceId": "t", "source": "ci", "name": "helpfulness", "value": 4})
        wait_for(lambda: len(standin.score_rows()) == 4)
    configs = {c["name"]: c for c in standin.score_configs()}
    assert {n: c["dataType"] for n, c in configs.items()} == {
        "issue_category": "NUMERIC",  # the old one, untouched
        "user_feedback": "BOOLEAN",
        "verdict": "CATEGORICAL",
        "helpfulness": "NUMERIC",
    }
    assert [c["label"] for c in configs["verdict"]["categories"]] == ["positive", "negative", "false_alarm"]
    assert (configs["helpfulness"]["minValue"], configs["helpfulness"]["maxValue"]) == (1, 5)
    attached = {r["name"]: r["configId"] for r in standin.score_rows()}
    assert attached == {
        "user_feedback": configs["user_feedback"]["id"],
        "verdict": configs["verdict"]["id"],
        "issue_category": None,  # open categories, and the existing config differs
        "helpfulness": configs["helpfulness"]["id"],
    }
    checked = {validate(openapi, entry) for entry in standin.log}
    assert {"GET /api/public/score-configs 200", "POST /api/public/score-configs 200"} <= checked
