"""Issue 25: every vote and every verdict exactly once, on the relay's side of the score path.

Each test names the defect it pins (the issue's numbering); each fails on the code before the fix.
The relay runs over real HTTP (uvicorn on 127.0.0.1) into a real embedded store, or into the
Langfuse stand-in that validates every exchange against Langfuse's OpenAPI file.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.relay.test_relay import relay_config, rows, serving
from tests.relay.test_relay_langfuse import sink_for
from triage.domain.scores import (
    END_USER,
    MAX_TURN,
    ScoreBody,
    is_end_user,
    legacy_relay_id,
    normalise_author,
    parse_turn,
    relay_score_id,
)
from triage.relay.bodies import Answer, Feedback, parse_feedback
from triage.relay.commits import GroupCommit as Ledger
from triage.relay.outbox import Worker
from triage.relay.service import Relay


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    with serving(tmp_path) as (client, _):
        yield client


@pytest.fixture
def langfuse() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as srv:
        yield srv


# -- 2: a lone surrogate is refused at the door, and one already in an outbox is set aside alone


def test_a_lone_surrogate_is_400_naming_the_field(http: httpx.Client, tmp_path: Path) -> None:
    client = http
    for body, field in (
        (b'{"traceId": "t", "value": "down", "comment": "cut \\ud83d"}', "comment"),
        (b'{"traceId": "t\\udc00", "value": "down"}', "traceId"),
        (b'{"traceId": "t", "value": "down", "meta": {"x\\udfff": 1}}', "meta.x"),
    ):
        answer = client.post("/api/feedback", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, body
        assert answer.json()["error"].startswith(field) and "surrogate" in answer.json()["error"]
    # the surrogate as raw bytes (CESU-8), which json.loads of bytes would let through
    raw = b'{"traceId": "t", "value": "down", "comment": "cut \xed\xa0\xbd"}'
    answer = client.post("/api/feedback", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not UTF-8" in answer.json()["error"]
    # a whole emoji, escaped as its surrogate pair, is text
    whole = b'{"traceId": "t", "value": "down", "comment": "ok \\ud83d\\ude00"}'
    assert client.post("/api/feedback", content=whole, headers={"content-type": "application/json"}).status_code == 200
    assert rows(tmp_path, "user_feedback")[0]["comment"] == "ok \U0001f600"


def test_an_undeliverable_write_in_the_outbox_never_blocks_its_batch(
    tmp_path: Path, langfuse: LangfuseStandIn
) -> None:
    """A body no encoder can send (left by an older relay) is set aside at once, on its own, and
    listed; the writes beside it in its batch are delivered."""
    clock = VirtualClock()
    ledger = Ledger(tmp_path / "relay.sqlite", now=lambda: clock.now().timestamp())
    sink = sink_for(langfuse)
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    for user in ("bob", "eve"):
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "down"}, max_text={}), f"user:{user}"))
    poison = json.dumps(
        {"id": "p", "traceId": "t", "name": "user_feedback", "value": 0, "dataType": "BOOLEAN",
         "comment": "half an emoji \ud83d", "timestamp": "2026-01-01T00:00:00.000Z"}
    )  # fmt: skip
    db = sqlite3.connect(tmp_path / "relay.sqlite")
    with db:
        db.execute("INSERT INTO outbox (score_id, op, body, enqueued) VALUES ('p', 'put', ?, 0)", (poison,))
    db.close()
    worker = Worker(ledger, sink, clock, batch_wait=0, max_attempts=20)
    assert worker.run_once() == 2
    assert ledger.reads.depth()[:2] == (0, 1)  # delivered, and one set aside (not retried 20 times)
    [(score_id, why)] = ledger.reads.set_aside()
    assert score_id == "p" and "not UTF-8" in why
    ledger.close()
    assert sorted(r["metadata"]["userId"] for r in langfuse.score_rows()) == ["user:bob", "user:eve"]


# -- 4: a number beyond SQLite's INTEGER hung its whole group commit


def test_an_overflowing_turn_is_400_and_its_batch_mates_are_answered(http: httpx.Client, tmp_path: Path) -> None:
    client = http
    for turn in (2**63, 10**30, MAX_TURN + 1, "²", "1e3", True):
        answer = client.post("/api/feedback", json={"contextId": "c", "turn": turn, "value": "down"})
        assert answer.status_code == 400 and "turn must be an integer" in answer.json()["error"], turn
    assert client.post("/api/feedback", json={"contextId": "c", "turn": MAX_TURN, "value": "down"}).status_code == 200


def test_a_row_the_ledger_cannot_hold_fails_its_own_request_only(tmp_path: Path) -> None:
    """Past the door (a caller of the core, an older client): the hostile request is refused, the
    others committed with it are answered and stored; nothing hangs."""
    from triage.relay.web import Problem

    with serving(tmp_path) as (_, app):
        relay = app.relay
        assert relay is not None

        async def burst() -> list[Any]:
            good = [
                relay.feedback(Feedback(answer=Answer(trace_id=f"t{i}"), value=False), f"user:u{i}")
                for i in range(20)
            ]
            hostile = relay.feedback(Feedback(answer=Answer(session_id="s", turn=2**63), value=False), "user:x")
            return await asyncio.wait_for(
                asyncio.gather(*good[:10], hostile, *good[10:], return_exceptions=True), timeout=10
            )

        loop = asyncio.new_event_loop()
        try:
            results = loop.run_until_complete(burst())
        finally:
            loop.close()
    refused = results[10]
    assert isinstance(refused, Problem) and refused.status == 422
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 10)
    assert len(rows(tmp_path, "user_feedback")) == 20


# -- 6: ids that cannot collide, while every id already written stays


def test_a_reviewer_and_an_end_user_never_share_an_id(http: httpx.Client, tmp_path: Path) -> None:
    client = http
    member = client.post("/api/feedback", json={"traceId": "t:user", "reviewer": "ana", "value": "down"})
    user = client.post("/api/feedback", json={"traceId": "t", "userId": "ana", "value": "up"})
    assert member.status_code == user.status_code == 200
    assert member.json()["ids"] != user.json()["ids"]
    stored = {(r["traceId"], r["userId"]): r["value"] for r in rows(tmp_path, "user_feedback")}
    assert stored == {("t:user", "ana"): 0.0, ("t", "user:ana"): 1.0}
    # the old form collided on exactly these two
    assert legacy_relay_id("user_feedback", "trace:t:user", "ana") == legacy_relay_id(
        "user_feedback", "trace:t", "user:ana"
    )
    assert relay_score_id("user_feedback", "trace:t:user", "ana") != relay_score_id(
        "user_feedback", "trace:t", "user:ana"
    )


def test_a_score_written_under_the_old_id_keeps_it_when_changed(tmp_path: Path) -> None:
    """A ledger row from before the collision-free ids: the changed vote overwrites it (same id,
    same timestamp), never adds a row; its author, spelled the old way, is found."""
    with serving(tmp_path) as (client, _):
        assert client.post("/api/feedback", json={"traceId": "t", "reviewer": "ana", "value": "up"}).status_code == 200
    old = legacy_relay_id("user_feedback", "trace:t", "Ana")
    db = sqlite3.connect(tmp_path / "relay.sqlite")
    with db:  # make it a row an older relay wrote: the old id, the author as the client spelled it
        db.execute("UPDATE feedback SET id = ?, author = 'Ana'", (old,))
        db.execute("PRAGMA user_version = 0")
    db.close()
    with Store_rows(tmp_path) as store:
        store.execute("UPDATE scores SET id = ?", (old,))
    with serving(tmp_path) as (client, _):
        changed = client.post("/api/feedback", json={"traceId": "t", "reviewer": "ANA ", "value": "down"})
        assert changed.status_code == 200 and changed.json()["ids"] == [old]
    [row] = rows(tmp_path, "user_feedback")
    assert (row["id"], row["value"]) == (old, 0.0)


class Store_rows:  # noqa: N801 - a tiny context for raw SQL on the store file
    def __init__(self, tmp_path: Path) -> None:
        self.db = sqlite3.connect(tmp_path / "store.sqlite")

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.commit()
        self.db.close()


# -- 7: the end-user rule, one normalisation for the relay, calibrate and promote


@pytest.mark.parametrize("spelled", ["User:x", " user:x", "user\uff1ax", "USER:x", "ｕｓｅｒ:x"])
def test_every_spelling_of_the_end_user_prefix_is_an_end_user(spelled: str, http: httpx.Client) -> None:
    assert is_end_user(spelled) and normalise_author(spelled) == f"{END_USER}x"
    client = http
    answer = client.post("/api/feedback", json={"traceId": "t", "reviewer": spelled, "verdict": "negative"})
    assert answer.status_code == 400 and "reviewer names a project member" in answer.json()["error"]


def test_members_are_one_person_whatever_the_spelling_end_users_keep_their_case() -> None:
    assert normalise_author("  Ana\u00a0 Lopez ") == "ana lopez"
    assert normalise_author("user:AbC") == "user:AbC" != normalise_author("user:abc")
    assert not is_end_user("ana") and not is_end_user(None)


def test_promote_and_calibrate_treat_a_disguised_end_user_as_a_vote_not_a_review() -> None:
    from datetime import UTC, datetime

    from triage.calibration.calibrate import labels_from_scores
    from triage.domain.records import StoredScore
    from triage.settings import load_config

    config = load_config()
    names = config.calibration
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    scores = [
        StoredScore(id=f"s{i}", name=names.verdict_score, trace_id="t", value="negative", author=author,
                    timestamp=stamp)  # fmt: skip
        for i, author in enumerate(["User:x", "user\uff1ay", "Ana", "ana"])
    ]
    labels, bad = labels_from_scores(scores, names)
    # "Ana" and "ana" are one reviewer with two verdicts on one trace: a bad label, not two labels
    assert len(labels) == 0 and len(bad) == 1


# -- 9: a declared limit Langfuse would refuse after a 202


def test_a_text_score_longer_than_langfuse_takes_is_a_configuration_error(tmp_path: Path) -> None:
    from triage.domain.config import DeclaredScore

    config = relay_config()
    scores = [s if s.name != "note" else DeclaredScore(name="note", data_type="TEXT", max_length=2000)
              for s in config.relay.scores]  # fmt: skip
    broken = config.relay.model_copy(update={"scores": scores})
    assert any("at most 500 characters in Langfuse" in p for p in broken.problems())


# -- the one score body


def test_a_score_body_round_trips_and_refuses_what_langfuse_refuses() -> None:
    from datetime import UTC, datetime

    from triage.domain.scores import BadScore

    body = ScoreBody(id="i", name="n", value=1, data_type="BOOLEAN", timestamp=datetime(2026, 1, 1, tzinfo=UTC),
                     session_id="s", metadata={"turn": 3})  # fmt: skip
    assert ScoreBody.from_wire(body.wire()) == body
    assert body.wire()["timestamp"] == "2026-01-01T00:00:00.000Z" and "traceId" not in body.wire()
    for bad in (
        {"value": 2},  # BOOLEAN 0/1
        {"value": "x"},  # BOOLEAN is a number
        {"data_type": "TEXT", "value": "x" * 501},
        {"trace_id": "t"},  # a trace and a session
        {"data_type": "EVAL"},
    ):
        with pytest.raises(BadScore):
            ScoreBody(**{**body_fields(body), **bad})
    assert parse_turn("²") is None and parse_turn("12") == 12 and parse_turn(2**63) is None and parse_turn(True) is None


def body_fields(body: ScoreBody) -> dict[str, Any]:
    return {f: getattr(body, f) for f in ScoreBody.__dataclass_fields__}
