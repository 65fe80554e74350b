"""`triage relay` over real HTTP (uvicorn on 127.0.0.1, a free port) into the embedded store:
votes, verdicts, every operation, every error status, health, metrics, the OpenAPI document."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from triage.domain.config import (
    VERDICT_FIELD_SPECS,
    DeclaredScore,
    RelayConfig,
    ScoreSource,
    TriageConfig,
    VerdictFieldSpec,
)
from triage.relay.access import issue_token
from triage.relay.api import Credentials, RelayApp
from triage.relay.outbox import Sink, StoreSink
from triage.relay.server import relay_running, uvicorn_config
from triage.settings import load_config
from triage.sources.store import Store

NOW = datetime.now(UTC)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """An ASGI app under uvicorn on 127.0.0.1 in a thread (httpx's TestServer, adapted)."""

    def __init__(self, app: RelayApp) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port))  # as `triage relay` serves
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def relay_config(**relay: Any) -> TriageConfig:
    config = load_config()
    if relay:
        config = config.model_copy(update={"relay": config.relay.model_copy(update=relay)})
    return config


@contextmanager
def serving(
    tmp_path: Path,
    *,
    sink: Sink | None = None,
    credentials: Credentials | None = None,
    config: TriageConfig | None = None,
    start_worker: bool = True,
) -> Iterator[tuple[httpx.Client, RelayApp]]:
    own = sink is None
    sink = sink or StoreSink(Store(tmp_path / "store.sqlite"))
    try:
        with relay_running(
            config or relay_config(), sink, tmp_path / "relay.sqlite", credentials or Credentials(),
            start_worker=start_worker, drain_seconds=0.5,
        ) as app, Served(app) as served, httpx.Client(base_url=served.url, timeout=10) as client:  # fmt: skip
            yield client, app
    finally:
        if own:
            sink.close()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[httpx.Client, RelayApp]]:
    with serving(tmp_path) as pair:
        yield pair


def rows(tmp_path: Path, name: str | None = None) -> list[dict[str, Any]]:
    with Store(tmp_path / "store.sqlite") as store:
        with store._lock:
            found = store._db.execute("SELECT * FROM scores ORDER BY name, id").fetchall()
    return [dict(r) for r in found if name is None or r["name"] == name]


# --------------------------------------------------------------------------- votes


def test_the_docs_agents_form_goes_on_the_session_and_a_changed_vote_overwrites(relay: Any, tmp_path: Path) -> None:
    client, _ = relay
    first = client.post("/api/feedback", json={"contextId": "c-1", "turn": 0, "value": "down", "comment": "dead link"})
    assert first.status_code == 200, first.text
    assert first.json()["stored"] == "store" and first.json()["author"] == "user:anonymous"
    [row] = rows(tmp_path, "user_feedback")
    assert (row["sessionId"], row["traceId"], row["value"], row["dataType"]) == ("c-1", None, 0.0, "BOOLEAN")
    time.sleep(0.01)
    again = client.post("/api/feedback", json={"contextId": "c-1", "turn": 0, "value": "up"})
    assert again.json()["ids"] == first.json()["ids"]
    [after] = rows(tmp_path, "user_feedback")
    assert after["value"] == 1.0 and after["comment"] is None
    assert after["timestamp"] == row["timestamp"]  # the first vote's: Langfuse upserts on it
    with Store(tmp_path / "store.sqlite") as store:
        [vote] = store.votes("user_feedback", NOW - timedelta(hours=1), NOW + timedelta(hours=1)).votes
    assert (vote.session_id, vote.turn, vote.value, vote.user_id) == ("c-1", 0, 1.0, "user:anonymous")


def test_votes_on_a_trace_one_per_voter(relay: Any, tmp_path: Path) -> None:
    client, _ = relay
    for user, value in (("bob", "down"), ("eve", True), ("bob", "up")):
        assert client.post("/api/feedback", json={"traceId": "t-1", "userId": user, "value": value}).status_code == 200
    votes = rows(tmp_path, "user_feedback")
    assert sorted((r["userId"], r["value"]) for r in votes) == [("user:bob", 1.0), ("user:eve", 1.0)]
    assert all(r["traceId"] == "t-1" and r["sessionId"] is None for r in votes)


def test_k2views_one_based_turn_and_a_note_without_a_rating(relay: Any, tmp_path: Path) -> None:
    client, _ = relay
    noted = client.post("/api/feedback", json={"sessionId": "s-1", "turnNumber": 2, "value": "", "note": "slow"})
    assert noted.status_code == 200, noted.text
    comment_only = client.post("/api/feedback", json={"sessionId": "s-1", "turn": 0, "userId": "kim", "comment": "hm"})
    assert comment_only.status_code == 200
    notes = rows(tmp_path, "note")
    assert sorted((r["stringValue"], r["dataType"], r["metadata"].count('"turn": 1')) for r in notes) == [
        ("hm", "TEXT", 0),
        ("slow", "TEXT", 1),
    ]
    assert rows(tmp_path, "user_feedback") == []


# --------------------------------------------------------------------------- verdicts


def test_a_verdict_is_replaced_whole_and_two_reviewers_keep_two(relay: Any, tmp_path: Path) -> None:
    client, _ = relay
    full = {
        "traceId": "t-1",
        "reviewer": "ana",
        "verdict": "negative",
        "issue_category": "Wrong Tool (search)",
        "corrected_answer": "Use the v2 SDK.",
        "expected_tool_behavior": "search the docs first",
        "note": "see #12",
    }
    assert client.post("/api/feedback", json=full).status_code == 200
    second = {"traceId": "t-1", "reviewer": "raj", "verdict": "positive"}
    assert client.post("/api/feedback", json=second).status_code == 200
    by_name = {(r["name"], r["metadata"].split('"reviewer": ')[1].split('"')[1]): r for r in rows(tmp_path)}
    assert by_name[("corrected_answer", "ana")]["dataType"] == "CORRECTION"
    assert by_name[("issue_category", "ana")]["stringValue"] == "Wrong Tool (search)"  # kept as written
    replaced = client.post("/api/feedback", json={"traceId": "t-1", "reviewer": "ana", "verdict": "false_alarm"})
    assert len(replaced.json()["cleared"]) == 4
    left = sorted((r["name"], r["stringValue"]) for r in rows(tmp_path))
    assert left == [("verdict", "false_alarm"), ("verdict", "positive")]
    with Store(tmp_path / "store.sqlite") as store:
        read = store.scores(["verdict"], NOW - timedelta(hours=1), NOW + timedelta(hours=1))
    assert sorted((s.author, s.value, s.trace_id) for s in read) == [
        ("ana", "false_alarm", "t-1"),
        ("raj", "positive", "t-1"),
    ]


@pytest.mark.parametrize("spec", VERDICT_FIELD_SPECS, ids=lambda spec: spec.name)
def test_every_declared_field_of_the_verdict_is_taken_stored_listed_and_limited(
    relay: Any, tmp_path: Path, spec: VerdictFieldSpec
) -> None:
    """The relay's half of a field of the verdict, for every field its one declaration lists
    (`VERDICT_FIELD_SPECS`), a new one included: taken under its name and its camelCase spelling,
    stored as a score of its name and type, listed, and refused past its longest value (422)."""
    client, _ = relay
    value = "x" * spec.max_length
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), spec.name)
    for n, key in enumerate(dict.fromkeys((spec.name, camel))):
        sent = client.post("/api/feedback", json={"traceId": f"t-{n}", "reviewer": "ana", key: value})
        assert sent.status_code == 200, sent.text
        [row] = [r for r in rows(tmp_path, spec.name) if r["traceId"] == f"t-{n}"]
        assert (row["dataType"], row["stringValue"]) == (spec.data_type, value)
    [listed] = client.get("/api/feedback", params={"reviewer": "ana", "traceId": "t-0"}).json()["data"]
    assert listed[spec.name] == value
    long = client.post("/api/feedback", json={"traceId": "t-9", "reviewer": "ana", spec.name: value + "x"})
    assert long.status_code == 422 and spec.name in long.json()["error"]
    assert not [r for r in rows(tmp_path, spec.name) if r["traceId"] == "t-9"]


def test_a_correction_needs_a_trace_and_a_verdict_its_categories(relay: Any) -> None:
    client, _ = relay
    on_session = client.post("/api/feedback", json={"sessionId": "s", "turn": 0, "corrected_answer": "x"})
    assert on_session.status_code == 400 and "corrected_answer needs a traceId" in on_session.json()["error"]
    bad = client.post("/api/feedback", json={"traceId": "t", "verdict": "meh"})
    assert bad.status_code == 422 and "verdict must be one of" in bad.json()["error"]
    long = client.post("/api/feedback", json={"traceId": "t", "issue_category": "x" * 65})
    assert long.status_code == 422 and "issue_category" in long.json()["error"]


def test_end_users_never_collide_with_members(relay: Any) -> None:
    client, _ = relay
    refused = client.post("/api/feedback", json={"traceId": "t", "reviewer": "user:bob", "verdict": "negative"})
    assert refused.status_code == 400
    as_user = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "verdict": "negative"})
    assert as_user.json()["author"] == "user:bob"


# --------------------------------------------------------------------------- operations


def test_create_only_replace_delete_and_list(relay: Any, tmp_path: Path) -> None:
    client, _ = relay
    vote = {"traceId": "t-1", "userId": "bob", "value": "down", "comment": "no"}
    assert client.put("/api/feedback", json=vote).status_code == 404  # nothing to replace yet
    assert client.post("/api/feedback?mode=create", json=vote).status_code == 201
    conflict = client.post("/api/feedback?mode=create", json=vote)
    assert conflict.status_code == 409
    replaced = client.put("/api/feedback", json={"traceId": "t-1", "userId": "bob", "note": "fine now"})
    assert replaced.status_code == 200 and len(replaced.json()["cleared"]) == 1  # the vote went
    assert [r["name"] for r in rows(tmp_path)] == ["note"]
    verdict = {"traceId": "t-1", "reviewer": "ana", "verdict": "negative"}
    assert client.post("/api/feedback", json=verdict).status_code == 200
    # another member's feedback is theirs to retract; an end user's may be retracted on their behalf
    other = client.request("DELETE", "/api/feedback", json={"traceId": "t-1", "reviewer": "raj", "author": "ana"})
    assert other.status_code == 403
    on_behalf = client.request("DELETE", "/api/feedback", json={"traceId": "t-1", "reviewer": "raj", "userId": "bob"})
    assert on_behalf.status_code == 200 and on_behalf.json()["author"] == "user:bob"
    assert client.request("DELETE", "/api/feedback", json={"traceId": "t-1", "userId": "bob"}).status_code == 404
    own = client.delete("/api/feedback", params={"traceId": "t-1", "reviewer": "ana"})
    assert own.status_code == 200 and rows(tmp_path) == []


def test_listings(relay: Any) -> None:
    client, _ = relay
    assert client.get("/api/feedback", params={"sessionId": "new"}).json() == {"data": [], "next_cursor": None}
    client.post("/api/feedback", json={"contextId": "s-1", "turn": 1, "value": "down", "userId": "bob"})
    client.post("/api/feedback", json={"traceId": "t-1", "reviewer": "ana", "verdict": "false_alarm"})
    client.post("/api/feedback", json={"traceId": "t-2", "reviewer": "ana", "verdict": "negative", "note": "x"})
    client.post("/api/feedback", json={"traceId": "t-3", "reviewer": "raj", "verdict": "positive"})
    [session] = client.get("/api/feedback", params={"sessionId": "s-1"}).json()["data"]
    assert (session["turn"], session["vote"], session["author"]) == (1, "down", "user:bob")
    queue = client.get("/api/feedback", params={"verdict": "negative"}).json()["data"]
    assert sorted((i["traceId"], i["verdict"]) for i in queue) == [("t-1", "false_alarm"), ("t-2", "negative")]
    mine = client.get("/api/feedback", params={"reviewer": "raj"}).json()["data"]
    assert [(i["traceId"], i["verdict"]) for i in mine] == [("t-3", "positive")]
    assert client.get("/api/feedback").status_code == 400


# --------------------------------------------------------------------------- errors


def test_malformed_bodies_and_missing_ids_are_400_naming_the_field(relay: Any) -> None:
    client, _ = relay
    cases = [
        (b"{not json", "not JSON"),
        (b"[1]", "a JSON object"),
        (b"", "empty"),
        (b'{"value": "down"}', "traceId is missing"),
        (b'{"contextId": "c", "value": "down"}', "turn is missing"),
        (b'{"traceId": "t"}', "value is missing"),
        (b'{"traceId": 5, "value": "down"}', "traceId must be a non-empty string"),
        (b'{"contextId": "c", "turn": -1, "value": "down"}', "turn must be an integer from 0"),
    ]
    for body, message in cases:
        answer = client.post("/api/feedback", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, body
        assert message in answer.json()["error"], (body, answer.json())


def test_a_body_over_the_limit_is_413(relay: Any) -> None:
    client, _ = relay
    answer = client.post("/api/feedback", json={"traceId": "t", "value": "down", "comment": "x" * 70_000})
    assert answer.status_code == 413


def test_a_bad_value_and_an_undeclared_name_are_422(relay: Any) -> None:
    client, _ = relay
    assert client.post("/api/feedback", json={"traceId": "t", "value": "sideways"}).status_code == 422
    undeclared = client.post("/api/scores", json={"traceId": "t", "source": "ci", "name": "helpfulness", "value": 3})
    assert undeclared.status_code == 422 and "not declared" in undeclared.json()["error"]


def test_a_declared_channel_in_enforce_and_an_undeclared_one_in_monitor(tmp_path: Path) -> None:
    scores = [*RelayConfig().scores, DeclaredScore(name="helpfulness", data_type="NUMERIC", min=1, max=5)]
    sources = [*RelayConfig().sources, ScoreSource(name="ci-eval", scores=["helpfulness"])]
    with serving(tmp_path, config=relay_config(scores=scores, sources=sources)) as (client, _):
        ok = client.post("/api/scores", json={"traceId": "t", "source": "ci-eval", "name": "helpfulness", "value": 4})
        assert ok.status_code == 200, ok.text
        out = client.post("/api/scores", json={"traceId": "t", "source": "ci-eval", "name": "helpfulness", "value": 9})
        assert out.status_code == 422 and "within [1.0, 5.0]" in out.json()["error"]
        other = client.post("/api/scores", json={"traceId": "t", "source": "other", "name": "helpfulness", "value": 4})
        assert other.status_code == 422
    with serving(tmp_path / "m", config=relay_config(mode="monitor")) as (client, _):
        taken = client.post("/api/scores", json={"traceId": "t", "source": "ci", "name": "tone", "value": "curt"})
        assert taken.status_code == 200
        metrics = client.get("/metrics").text
        assert 'relay_undeclared_scores_total{name="tone",source="ci"} 1' in metrics


def test_a_client_over_its_rate_is_429_with_retry_after(tmp_path: Path) -> None:
    with serving(tmp_path, config=relay_config(rate_per_second=0.5, rate_burst=2)) as (client, _):
        codes = [client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "up"}) for _ in range(3)]
        assert [c.status_code for c in codes] == [200, 200, 429]
        assert int(codes[2].headers["retry-after"]) >= 1
        # another client is not held up
        assert client.post("/api/feedback", json={"traceId": "t", "userId": "eve", "value": "up"}).status_code == 200


def test_no_store_configured_is_503(tmp_path: Path) -> None:
    app = RelayApp(None, Credentials())
    with Served(app) as served, httpx.Client(base_url=served.url) as client:
        assert client.post("/api/feedback", json={"traceId": "t", "value": "up"}).status_code == 503
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200


class FailingSink:
    name = "store"
    inline = True

    def deliver(self, ops: Any) -> dict[int, Any]:
        from triage.relay.outbox import DeliveryFailed

        raise DeliveryFailed("disk gone")

    def reachable(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_a_ledger_that_cannot_commit_is_503_never_a_write_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25, defect 3: the relay wrote straight through to the sink with a new timestamp when
    its ledger could not commit (a changed vote became a second Langfuse row). Now nothing is
    written, the answer is 503 with Retry-After, and the retried request lands once."""
    import sqlite3

    from triage.relay import sqlite as storage

    real = storage.store_rows

    def full(db: Any, params: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with serving(tmp_path) as (client, app):
        first = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "up"})
        assert first.status_code == 200
        [before] = rows(tmp_path, "user_feedback")
        monkeypatch.setattr(storage, "store_rows", full)
        refused = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "down"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        assert "not written" in refused.json()["error"]
        [still] = rows(tmp_path, "user_feedback")
        assert still["value"] == 1.0  # nothing went around the ledger
        monkeypatch.setattr(storage, "store_rows", real)
        again = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "down"})
        assert again.status_code == 200
    [after] = rows(tmp_path, "user_feedback")
    assert (after["id"], after["timestamp"], after["value"]) == (before["id"], before["timestamp"], 0.0)


# --------------------------------------------------------------------------- auth


def test_credentials_bearer_and_feedback_tokens(tmp_path: Path) -> None:
    creds = Credentials(gateway_token="gw-secret-token-1", signing_key="signing-key-1")
    with serving(tmp_path, credentials=creds) as (client, _):
        vote = {"traceId": "t-1", "value": "down"}
        assert client.post("/api/feedback", json=vote).status_code == 401
        bad = client.post("/api/feedback", json=vote, headers={"Authorization": "Bearer nope-nope"})
        assert bad.status_code == 401 and "nope" not in bad.text
        gateway = {"Authorization": "Bearer gw-secret-token-1"}
        assert client.post("/api/feedback", json={**vote, "userId": "bob"}, headers=gateway).status_code == 200
        token = issue_token("signing-key-1", subject="kim", trace_id="t-1")
        browser = {"Authorization": f"Bearer {token}"}
        mine = client.post("/api/feedback", json=vote, headers=browser)
        assert mine.status_code == 200 and mine.json()["author"] == "user:kim"
        elsewhere = client.post("/api/feedback", json={"traceId": "t-2", "value": "down"}, headers=browser)
        assert elsewhere.status_code == 403
        posing = client.post("/api/feedback", json={**vote, "userId": "bob"}, headers=browser)
        assert posing.status_code == 403
        assert client.post("/api/scores", json={**vote, "source": "x", "name": "y"}, headers=browser).status_code == 403
        listed = client.get("/api/feedback", params={"traceId": "t-1"}, headers=browser).json()["data"]
        assert [i["author"] for i in listed] == ["user:kim"]
        assert client.request("DELETE", "/api/feedback", json={"traceId": "t-1"}, headers=browser).status_code == 200
        expired = issue_token("signing-key-1", subject="kim", trace_id="t-1", ttl_seconds=60, now=time.time() - 120)
        late = client.post("/api/feedback", json=vote, headers={"Authorization": f"Bearer {expired}"})
        assert late.status_code == 401 and "expired" in late.json()["error"]
        session = issue_token("signing-key-1", subject="kim", session_id="c-1", turn=2)
        on_turn = client.post("/api/feedback", json={"contextId": "c-1", "turn": 2, "value": "up"},
                              headers={"Authorization": f"Bearer {session}"})  # fmt: skip
        assert on_turn.status_code == 200
        assert client.get("/healthz").status_code == 200  # probes need no credentials


# --------------------------------------------------------------------------- operations endpoints


def test_health_readiness_metrics_and_the_openapi_document(relay: Any) -> None:
    client, _ = relay
    client.post("/api/feedback", json={"traceId": "t", "value": "down"})
    ready = client.get("/readyz").json()
    assert ready["status"] == "ok" and ready["outbox"]["pending"] == 0
    metrics = client.get("/metrics").text
    assert 'relay_requests_total{method="POST",route="/api/feedback",status="200"} 1' in metrics
    assert "relay_outbox_depth 0" in metrics and "relay_delivery_lag_seconds" in metrics
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert set(document["paths"]["/api/feedback"]) == {"get", "post", "put", "delete"}
    statuses = set(document["paths"]["/api/feedback"]["post"]["responses"])
    assert {"200", "201", "202", "400", "401", "403", "409", "413", "422", "429", "503"} <= statuses
    assert "502" not in statuses  # nothing is written around the ledger: "not written" is a 503


class FlakySink(StoreSink):
    """The embedded store, failing while `down` is set."""

    down = False

    def deliver(self, ops: Any) -> dict[int, Any]:
        if self.down:
            from triage.relay.outbox import DeliveryFailed

            raise DeliveryFailed("disk I/O error")
        return super().deliver(ops)


def test_a_store_that_fails_queues_writes_and_a_later_flip_is_not_overwritten(tmp_path: Path) -> None:
    sink = FlakySink(Store(tmp_path / "store.sqlite"))
    sink.down = True
    with serving(tmp_path, sink=sink, start_worker=False) as (client, app):
        assert app.relay is not None and app.relay.worker is not None
        queued = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "down"})
        assert queued.status_code == 202 and queued.json()["stored"] == "outbox"
        sink.down = False
        # the store is back, but an older write of this id waits in the outbox: this one queues behind it
        flipped = client.post("/api/feedback", json={"traceId": "t", "userId": "bob", "value": "up"})
        assert flipped.status_code == 202
        app.relay.worker.drain()
        again = client.post("/api/feedback", json={"traceId": "t", "userId": "eve", "value": "up"})
        assert again.status_code == 200 and again.json()["stored"] == "store"  # caught up: inline again
    sink.close()
    assert sorted((r["userId"], r["value"]) for r in rows(tmp_path, "user_feedback")) == [
        ("user:bob", 1.0),
        ("user:eve", 1.0),
    ]
