"""Issue 26, item 3: nothing a client sends can hurt the relay (real HTTP, raw sockets)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.relay.test_relay import relay_config, rows, serving


def raw(port: int, data: bytes, *, wait: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or `wait` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as conn:
        conn.sendall(data)
        answer = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_head_over_the_limit_is_431_and_closed(tmp_path: Path) -> None:
    config = relay_config(max_head_bytes=4096)
    with serving(tmp_path, config=config) as (client, _):
        port = int(str(client.base_url).rsplit(":", 1)[1].rstrip("/"))
        # an unfinished header of 64 KiB: refused once the head passes the limit, not held
        answer = raw(port, b"POST /api/feedback HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536)
        assert answer.startswith(b"HTTP/1.1 431")
        # a full request whose headers are under the limit, with a body in the same packet, passes
        body = b'{"traceId": "t", "value": "up", "comment": "' + b"c" * 3000 + b'"}'
        ok = raw(port, b"POST /api/feedback HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        assert ok.startswith(b"HTTP/1.1 200"), ok[:200]


def test_a_half_sent_head_or_body_is_408_after_its_time(tmp_path: Path) -> None:
    config = relay_config(head_seconds=0.5, body_seconds=0.5)
    with serving(tmp_path, config=config) as (client, _):
        port = int(str(client.base_url).rsplit(":", 1)[1].rstrip("/"))
        started = time.monotonic()
        head = raw(port, b"POST /api/feedback HTTP/1.1\r\nHost: x\r\n", wait=5)
        assert head.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 4
        silent = raw(port, b"", wait=5)  # connected, sends nothing: closed too
        assert silent.startswith(b"HTTP/1.1 408")
        body = raw(port, b"POST /api/feedback HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"traceId\":", wait=5)
        assert body.startswith(b"HTTP/1.1 408") and b"body did not arrive" in body
        # and the relay still answers everyone else
        assert client.post("/api/feedback", json={"traceId": "t", "value": "up"}).status_code == 200


def test_a_retry_after_of_a_day_is_capped(tmp_path: Path) -> None:
    import asyncio

    from tests.doubles.clock import VirtualClock
    from tests.doubles.langfuse_server import LangfuseStandIn
    from tests.relay.test_relay_langfuse import sink_for
    from triage.relay import sqlite as storage
    from triage.relay.bodies import parse_feedback
    from triage.relay.commits import GroupCommit
    from triage.relay.outbox import MAX_RETRY_AFTER, Worker
    from triage.relay.service import Relay

    clock = VirtualClock()
    with LangfuseStandIn() as standin:
        sink = sink_for(standin)
        ledger = GroupCommit(tmp_path / "relay.sqlite", now=lambda: clock.now().timestamp())
        relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
        worker = Worker(ledger, sink, clock, batch_wait=0)
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:anonymous"))
        standin.inject("429", seconds=86400, path="/api/public/scores")
        assert worker.run_once() == 0
        due = ledger.call(storage.due_in)
        assert due is not None and due <= MAX_RETRY_AFTER
        clock.sleep(due)
        assert worker.run_once() == 1
        ledger.close()


def test_client_errors_that_were_500s_are_4xx_naming_the_field(tmp_path: Path) -> None:
    from triage.relay.api import Credentials

    config = relay_config(mode="monitor")
    creds = Credentials(signing_key="signing-key-0123456789abcdef0123")
    with serving(tmp_path, config=config, credentials=creds) as (client, _):
        # a feedback token whose signature is not ASCII
        token = "tfb1.eyJhIjoxfQ.sé".encode()  # bytes: a header is latin-1 to the server
        vote = {"traceId": "t", "value": "up"}
        bad_token = client.post("/api/feedback", json=vote, headers={"X-Feedback-Token": token})
        assert bad_token.status_code == 401
    with serving(tmp_path / "b", config=config) as (client, _):
        long_name = client.post("/api/scores", json={"traceId": "t", "source": "ci", "name": "n" * 65, "value": 1})
        assert long_name.status_code == 400 and "name must be at most 64" in long_name.json()["error"]
        for body in ({"traceId": "t", "value": "up", "turn": "²"}, {"contextId": "c", "turn": "²", "value": "up"}):
            assert client.post("/api/feedback", json=body).status_code == 400


def test_faults_are_told_truthfully(tmp_path: Path, monkeypatch: Any) -> None:
    """Issue 26, item 4: while writes fail, /readyz is not ready (then tried again); a ledger that
    cannot be opened is a configuration error; secrets in any form never reach /metrics."""
    import sqlite3

    import pytest

    from triage import redact
    from triage.errors import ConfigError
    from triage.relay import sqlite as storage
    from triage.relay.outbox import StoreSink
    from triage.relay.server import relay_running
    from triage.sources.store import Store

    with serving(tmp_path, config=relay_config(mode="monitor")) as (client, app):
        assert client.get("/readyz").status_code == 200

        def full(db: Any, params: Any) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        real = storage.store_rows
        monkeypatch.setattr(storage, "store_rows", full)
        assert client.post("/api/feedback", json={"traceId": "t", "value": "up"}).status_code == 503
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "writes failing"
        monkeypatch.setattr(storage, "store_rows", real)
        assert client.post("/api/feedback", json={"traceId": "t", "value": "up"}).status_code == 200
        assert client.get("/readyz").status_code == 200
        # a monitor-mode score name that is a secret, or its base64 (a proxy echoing Basic auth)
        import base64

        secret = "sk-lf-0123456789abcdef"
        redact.configure([secret, f"pk-lf-public:{secret}"])
        try:
            basic = base64.b64encode(f"pk-lf-public:{secret}".encode()).decode()
            for name in (secret[:60], basic[:60]):
                client.post("/api/scores", json={"traceId": "t", "source": "ci", "name": name, "value": 1})
            page = client.get("/metrics").text
            assert secret not in page and basic[:40] not in page
        finally:
            redact.configure([])
    (tmp_path / "not-a-folder").write_text("x")
    sink = StoreSink(Store(tmp_path / "s.sqlite"))
    with pytest.raises(ConfigError, match="cannot be opened"):
        with relay_running(relay_config(), sink, tmp_path / "not-a-folder" / "relay.sqlite", _open()):
            pass
    sink.close()


def _open() -> Any:
    from triage.relay.api import Credentials

    return Credentials()


def test_a_claim_whose_result_was_never_recorded_is_taken_again_after_its_lease(tmp_path: Path) -> None:
    """The fault benchmark's finding: when `settle` failed (a full disk), a delivery's ops stayed
    claimed until a restart and were never retried. A claim is now a lease; a lapsed claim that a
    newer op replaced is dropped, never delivered after it."""
    import asyncio

    from tests.doubles.clock import VirtualClock
    from triage.relay import sqlite as storage
    from triage.relay.bodies import parse_feedback
    from triage.relay.commits import GroupCommit
    from triage.relay.outbox import StoreSink
    from triage.relay.service import Relay
    from triage.sources.store import Store

    clock = VirtualClock()
    ledger = GroupCommit(tmp_path / "relay.sqlite", now=lambda: clock.now().timestamp())  # outbox mode
    relay = Relay(ledger=ledger, sink=StoreSink(Store(tmp_path / "s.sqlite")), config=relay_config().relay, clock=clock)
    for user, value in (("bob", "down"), ("eve", "down")):
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": value}, max_text={}), f"user:{user}"))
    first = ledger.call(lambda tx: storage.claim(tx, 10))
    assert len(first) == 2  # claimed; the settle never comes
    assert ledger.call(lambda tx: storage.claim(tx, 10)) == []
    assert ledger.call(storage.due_in) == pytest.approx(storage.LEASE_SECONDS, abs=1)
    # eve changes her vote meanwhile: a newer op on her score id, which waits behind the claimed one
    asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:eve"))
    assert ledger.call(lambda tx: storage.claim(tx, 10)) == []
    clock.sleep(storage.LEASE_SECONDS + 1)
    again = ledger.call(lambda tx: storage.claim(tx, 10))  # bob's lapsed claim; eve's older op dropped
    assert [op.body.metadata["userId"] for op in again if op.body] == ["user:bob"]
    newer = ledger.call(lambda tx: storage.claim(tx, 10))
    assert [(op.body.metadata["userId"], op.body.value) for op in newer if op.body] == [("user:eve", 1)]
    assert {op.score_id for op in first} == {op.score_id for op in again + newer}
    ledger.close()


def test_a_process_killed_between_the_ledger_and_the_store_commit_loses_no_write(tmp_path: Path) -> None:
    """The fault benchmark's kill -9 found it (1 wrong value in some runs): into the embedded store
    the ledger commits, then the store. Killed in between, the ledger is ahead; the retried request
    (a verdict without its note) found the note already cleared and cleared nothing, so the store kept
    it. The last batch's ops are now kept in the ledger and delivered again at the next start."""
    import asyncio

    from triage.relay.bodies import parse_feedback
    from triage.relay.commits import GroupCommit
    from triage.relay.service import Relay

    with serving(tmp_path) as (client, _):
        verdict = {"traceId": "t", "reviewer": "raj", "verdict": "negative", "note": "the link is dead"}
        assert client.post("/api/feedback", json=verdict).status_code == 200
    assert [r["stringValue"] for r in rows(tmp_path, "note")] == ["the link is dead"]
    # the next write commits to the ledger, and the process dies before the store's commit
    crashed = GroupCommit(tmp_path / "relay.sqlite", now=time.time, after_commit=lambda ops: None)
    relay = Relay(ledger=crashed, sink=_NoSink(), config=relay_config().relay, clock=_clock())
    replaced = parse_feedback({"traceId": "t", "reviewer": "raj", "verdict": "negative"}, max_text={})
    asyncio.run(relay.feedback(replaced, "raj", "replace"))
    crashed.close()
    assert len(rows(tmp_path, "note")) == 1  # the store is behind the ledger
    with serving(tmp_path) as (client, _):  # the restart delivers the last batch again
        retried = {"traceId": "t", "reviewer": "raj", "verdict": "negative"}  # the client's retry
        assert client.put("/api/feedback", json=retried).status_code == 200
    assert rows(tmp_path, "note") == []
    assert [r["stringValue"] for r in rows(tmp_path, "verdict")] == ["negative"]


class _NoSink:
    name = "store"
    inline = True


def _clock() -> Any:
    from triage.retry import current_clock

    return current_clock()
