"""The relay on PostgreSQL (`TRIAGE_RELAY_DATABASE_URL`): the exactly-once semantics of the SQLite
ledger, on both ledgers alike (parametrised by backend), then what only replicas can do: two relay
apps on one database, writing the same keys at once, sharing delivery.

A throwaway PostgreSQL server is started for the module (tests/doubles/postgres.py: initdb in a
temporary folder, a Unix socket there, removed at the end); where none can be started the
PostgreSQL cases skip, saying why (`.ci/run` sets TRIAGE_TEST_POSTGRES=require: there they fail).
The sink is the Langfuse stand-in (with PostgreSQL the sink is Langfuse), over real HTTP.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.doubles.postgres import PostgresServer, unavailable
from tests.relay.test_relay import Served, relay_config
from tests.relay.test_relay_langfuse import sink_for, wait_for
from triage.domain.config import TriageConfig
from triage.relay.api import Credentials, RelayApp
from triage.relay.bodies import Answer, Feedback, parse_feedback
from triage.relay.commits import GroupCommit
from triage.relay.outbox import BACKOFF, LangfuseSink, Worker
from triage.relay.server import relay_running
from triage.relay.service import Relay
from triage.relay.storage import MAX_PAGE, ListingPage, Op
from triage.relay.web import Problem

pytestmark = pytest.mark.slow
Location = Path | str
#: read at import: every test's environment is cleaned of TRIAGE_* variables (conftest.py)
REQUIRE_POSTGRES = os.environ.get("TRIAGE_TEST_POSTGRES") == "require"


# --------------------------------------------------------------------------- fixtures


def _no_server(reason: str) -> None:
    if REQUIRE_POSTGRES:  # CI: a skip would hide a missing install
        pytest.fail(f"PostgreSQL is required here (TRIAGE_TEST_POSTGRES=require): {reason}")
    pytest.skip(f"no PostgreSQL server for these tests: {reason}")


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    reason = unavailable()
    if reason is not None:
        _no_server(reason)
    try:
        server = PostgresServer().start()
    except (RuntimeError, OSError) as ex:
        _no_server(str(ex))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    """A fresh database of the module's server: its URL."""
    return postgres.create_database()


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """Where the ledger is: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "relay.sqlite"
    return str(request.getfixturevalue("database"))


@pytest.fixture
def standin() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as srv:
        yield srv


class Recording(LangfuseSink):
    """The Langfuse sink, noting every op it delivered (the replica, the op's seq and id)."""

    def __init__(self, srv: LangfuseStandIn, replica: str, log: list[tuple[str, int, str]]) -> None:
        super().__init__(sink_for(srv).http)
        self.replica = replica
        self.log = log
        self._lock = threading.Lock()

    def deliver(self, ops: Any) -> dict[int, Any]:
        failed = super().deliver(ops)
        with self._lock:
            self.log += [(self.replica, op.seq, op.score_id) for op in ops if op.seq not in failed]
        return failed


@contextmanager
def replica(
    at: Location, sink: LangfuseSink, *, config: TriageConfig | None = None, start_worker: bool = True
) -> Iterator[tuple[httpx.Client, RelayApp]]:
    """One relay (a replica) on the ledger `at`, over real HTTP."""
    config = config or relay_config(batch_wait_seconds=0.02, rate_per_second=1e6, rate_burst=10**6)
    with relay_running(config, sink, at, Credentials(), start_worker=start_worker, drain_seconds=0.5) as app, \
            Served(app) as served, httpx.Client(base_url=served.url, timeout=30) as client:  # fmt: skip
        yield client, app


def drained(client: httpx.Client) -> Callable[[], bool]:
    return lambda: client.get("/readyz").json()["outbox"]["pending"] == 0


def live_rows(app: RelayApp) -> dict[str, tuple[Any, str]]:
    """The ledger's live scores, read page by page: id -> (value, first timestamp)."""
    assert app.relay is not None
    out: dict[str, tuple[Any, str]] = {}
    after = None
    while rows := app.relay.ledger.reads.page(ListingPage(after=after, groups=MAX_PAGE)):
        for row in rows:
            assert row.body is not None
            out[row.id] = (row.body.value, row.timestamp)
        after = (rows[-1].answer, rows[-1].author)
    return out


def langfuse_rows(srv: LangfuseStandIn) -> dict[str, tuple[Any, str]]:
    """The stand-in's scores: id -> (value, timestamp); every id once (asserted)."""
    rows = srv.score_rows()
    ids = Counter(r["id"] for r in rows)
    assert [i for i, n in ids.items() if n > 1] == [], "an id with two physical rows: a duplicate"
    return {
        r["id"]: (
            r["value"] if r["dataType"] in ("BOOLEAN", "NUMERIC") else r["stringValue"],
            r["timestamp"].isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        )
        for r in rows
    }


def same_state(app: RelayApp, srv: LangfuseStandIn) -> None:
    """Langfuse holds exactly the ledger's live scores, with their values and first timestamps."""
    ledger = {i: (1.0 if v is True or v == 1 else 0.0 if v is False or v == 0 else v, t)
              for i, (v, t) in live_rows(app).items()}  # fmt: skip
    assert langfuse_rows(srv) == ledger


# --------------------------------------------------------------------------- both ledgers alike


def test_create_replace_clear_and_delete_on_both_ledgers(ledger_at: Location, standin: LangfuseStandIn) -> None:
    with replica(ledger_at, sink_for(standin)) as (client, app):
        vote = {"traceId": "t-1", "userId": "bob", "value": "down", "comment": "no"}
        assert client.put("/api/feedback", json=vote).status_code == 404  # nothing to replace yet
        assert client.post("/api/feedback?mode=create", json=vote).status_code == 201
        assert client.post("/api/feedback?mode=create", json=vote).status_code == 409
        replaced = client.put("/api/feedback", json={"traceId": "t-1", "userId": "bob", "note": "fine now"})
        assert replaced.status_code == 202 and len(replaced.json()["cleared"]) == 1  # the vote went
        full = {"traceId": "t-1", "reviewer": "ana", "verdict": "negative", "issue_category": "wrong_tool",
                "corrected_answer": "Use v2.", "note": "n"}  # fmt: skip
        assert client.post("/api/feedback", json=full).status_code == 202
        whole = client.post("/api/feedback", json={"traceId": "t-1", "reviewer": "ana", "verdict": "false_alarm"})
        assert len(whole.json()["cleared"]) == 3  # a verdict is replaced whole: the fields left out go
        assert client.request("DELETE", "/api/feedback", json={"traceId": "t-1", "userId": "bob"}).status_code == 202
        assert client.request("DELETE", "/api/feedback", json={"traceId": "t-1", "userId": "bob"}).status_code == 404
        wait_for(drained(client))
        wait_for(lambda: len(standin.score_rows()) == 1)
        [left] = standin.score_rows()
        assert (left["name"], left["stringValue"], left["metadata"]["reviewer"]) == ("verdict", "false_alarm", "ana")
        same_state(app, standin)


def test_a_changed_vote_keeps_its_id_and_first_timestamp_on_both_ledgers(
    ledger_at: Location, standin: LangfuseStandIn
) -> None:
    with replica(ledger_at, sink_for(standin)) as (client, app):
        first = client.post("/api/feedback", json={"contextId": "c-1", "turn": 0, "value": "down"})
        wait_for(lambda: len(standin.score_rows()) == 1)
        [before] = standin.score_rows()
        time.sleep(0.02)
        for value in ("up", "down", "up"):
            again = client.post("/api/feedback", json={"contextId": "c-1", "turn": 0, "value": value})
            assert again.json()["ids"] == first.json()["ids"]
        wait_for(drained(client))
        wait_for(lambda: standin.score_rows()[0]["value"] == 1.0)
        [after] = standin.score_rows()  # one physical row: a true overwrite
        assert (after["id"], after["timestamp"]) == (before["id"], before["timestamp"])
        same_state(app, standin)


def test_listings_are_paged_with_an_opaque_cursor_on_both_ledgers(
    ledger_at: Location, standin: LangfuseStandIn
) -> None:
    with replica(ledger_at, sink_for(standin), start_worker=False) as (client, app):
        relay = app.relay
        assert relay is not None
        for n in range(7):
            client.post("/api/feedback", json={"traceId": "t", "userId": f"u{n}", "value": n % 2 == 0})
        client.post("/api/feedback", json={"traceId": "t", "reviewer": "ana", "verdict": "negative", "note": "x"})
        client.post("/api/feedback", json={"traceId": "t", "reviewer": "raj", "verdict": "false_alarm"})
        client.post("/api/feedback", json={"traceId": "t", "reviewer": "kim", "verdict": "positive"})
        client.post("/api/feedback", json={"traceId": "other", "userId": "u0", "value": "up"})
        everything, last = relay.listing(trace_id="t", limit=1000)
        assert last is None and len(everything) == 10
        assert [i["author"] for i in everything] == sorted(i["author"] for i in everything)  # a stable order
        pages, cursor = [], None
        while True:
            page, cursor = relay.listing(trace_id="t", limit=3, cursor=cursor)
            pages.append(page)
            if cursor is None:
                break
        assert [len(p) for p in pages] == [3, 3, 3, 1]
        assert [i for p in pages for i in p] == everything
        queue, end = relay.listing(verdict="negative", limit=1)
        rest, done = relay.listing(verdict="negative", limit=1, cursor=end)
        assert [(i["author"], i["verdict"]) for i in [*queue, *rest]] == [("ana", "negative"), ("raj", "false_alarm")]
        assert done is None or relay.listing(verdict="negative", limit=1, cursor=done)[0] == []
        for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "not-a-cursor"}, {"cursor": "WzFd"}):
            with pytest.raises(Problem) as refused:
                relay.listing(trace_id="t", **bad)  # type: ignore[arg-type]
            assert refused.value.status == 400


def test_a_failed_delivery_never_brings_back_an_older_vote_on_both_ledgers(
    ledger_at: Location, standin: LangfuseStandIn
) -> None:
    """A vote in flight fails while the voter flips it: the old one is dropped, never delivered
    after the new one."""
    clock = VirtualClock()
    sink = sink_for(standin)
    ledger = GroupCommit(ledger_at, now=lambda: clock.now().timestamp())
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    worker = Worker(ledger, sink, clock, batch_wait=0)
    try:
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "down"}, max_text={}), "user:anonymous"))

        def flip_while_in_flight(ops: list[Op]) -> Any:
            up = parse_feedback({"traceId": "t", "value": "up"}, max_text={})
            asyncio.run(relay.feedback(up, "user:anonymous"))  # the voter flips meanwhile
            return [], {ops[0].seq: (clock.now().timestamp() + 5, "Langfuse unreachable")}, {}

        assert ledger.deliver(10, flip_while_in_flight) == 1
        worker.drain()
        clock.sleep(60)
        worker.drain()
        assert ledger.reads.depth()[0] == 0
    finally:
        ledger.close()
    [row] = standin.score_rows()
    assert row["value"] == 1.0
    assert len([r for r in standin.requests("/api/public/scores") if r.method == "POST"]) == 1


def test_redelivery_after_a_crash_mid_delivery_is_harmless_on_both_ledgers(
    ledger_at: Location, standin: LangfuseStandIn
) -> None:
    """The process dies after Langfuse took a batch but before the ledger forgot it: the batch is
    delivered again (a restart; on PostgreSQL any replica, once the dead one's connection is
    gone): same ids, same timestamps, still one row each."""
    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    sink = sink_for(standin)
    ledger = GroupCommit(ledger_at, now=now)
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    for user in ("bob", "eve"):
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "userId": user, "value": "down"}, max_text={}),
                                   f"user:{user}"))  # fmt: skip

    class Died(BaseException):
        pass

    def deliver_then_die(ops: list[Op]) -> Any:
        assert sink.deliver(ops) == {}
        raise Died

    with pytest.raises(Died):
        ledger.deliver(100, deliver_then_die)
    ledger.close()
    again = GroupCommit(ledger_at, now=now)
    worker = Worker(again, sink, clock, batch_wait=0)
    try:
        assert worker.run_once() == 2  # redelivered
        assert worker.run_once() == 0
        assert again.reads.depth()[0] == 0
    finally:
        again.close()
    assert len(standin.score_rows()) == 2


def test_backoff_in_virtual_time_on_both_ledgers(ledger_at: Location, standin: LangfuseStandIn) -> None:
    clock = VirtualClock()
    sink = sink_for(standin)
    ledger = GroupCommit(ledger_at, now=lambda: clock.now().timestamp())
    relay = Relay(ledger=ledger, sink=sink, config=relay_config().relay, clock=clock)
    worker = Worker(ledger, sink, clock, batch_wait=0, policy=BACKOFF.with_(initial=1.0, maximum=30.0))
    try:
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:anonymous"))
        standin.inject("status", status=503, count=2, path="/api/public/scores")
        waits = []
        for _ in range(2):
            assert worker.run_once() == 0
            due = ledger.due_in()
            waits.append(due)
            assert worker.run_once() == 0  # not due yet: nothing is sent
            clock.sleep(due or 0)
        assert waits[0] is not None and 1.0 <= waits[0] <= 2.0 and waits[1] is not None and 2.0 <= waits[1] <= 3.0
        assert worker.run_once() == 1
        assert ledger.due_in() is None
    finally:
        ledger.close()


def test_a_row_the_ledger_cannot_hold_fails_its_own_request_only_on_both_ledgers(
    ledger_at: Location, standin: LangfuseStandIn
) -> None:
    hostile = [Answer(session_id="s", turn=2**63)]
    if isinstance(ledger_at, str):
        hostile.append(Answer(trace_id="t\x00nul"))  # PostgreSQL's text holds no NUL
    with replica(ledger_at, sink_for(standin), start_worker=False) as (_, app):
        relay = app.relay
        assert relay is not None

        async def burst() -> list[Any]:
            good = [
                relay.feedback(Feedback(answer=Answer(trace_id=f"t{i}"), value=False), f"user:u{i}") for i in range(20)
            ]
            bad = [relay.feedback(Feedback(answer=answer, value=False), "user:x") for answer in hostile]
            return await asyncio.wait_for(asyncio.gather(*good[:10], *bad, *good[10:], return_exceptions=True), 30)

        loop = asyncio.new_event_loop()
        try:
            results = loop.run_until_complete(burst())
        finally:
            loop.close()
        refused = results[10 : 10 + len(hostile)]
        assert all(isinstance(r, Problem) and r.status == 422 for r in refused), refused
        assert all(not isinstance(r, BaseException) for r in results[:10] + results[10 + len(hostile) :])
        assert len(live_rows(app)) == 20


# --------------------------------------------------------------------------- PostgreSQL: replicas


def test_a_group_commit_costs_the_same_few_statements_however_many_keys_it_locks(
    database: str, standin: LangfuseStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each statement costs the server and psycopg a round of work (the p99 on a busy machine, #37
    item 6): a batch's locks are one statement whatever its number of keys (was one a key), and a
    vote is five (the pool's check of its connection, locks, its rows read, its rows written, its
    outbox: was six)."""
    import psycopg

    sent: list[int] = []  # statements sent by the group commit's writer thread
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith("relay-ledger"):
            sent.append(1)
        return execute(self, *args, **kwargs)

    def counted_executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        if threading.current_thread().name.startswith("relay-ledger"):
            sent.append(len(params_seq))
        return executemany(self, query, params_seq, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counted_executemany)
    ledger = GroupCommit(database, now=time.time)
    try:

        async def batch() -> None:  # queued before the batch starts: one group commit
            keys = [(f"trace:t-{n}", "user:bob") for n in range(20)]
            await asyncio.gather(*(ledger.run(lambda tx: None, [k]) for k in keys))

        asyncio.run(batch())
        assert sum(sent) == 3, sent  # the connection's check, the 20 locks, the read of their rows
    finally:
        ledger.close()
    sent.clear()
    with replica(database, sink_for(standin), start_worker=False) as (client, _):
        sent.clear()
        assert client.post("/api/feedback", json={"traceId": "t-1", "userId": "bob", "value": "up"}).status_code == 202
    assert sum(sent) == 5, sent


def test_two_replicas_race_to_create_one_key_and_exactly_one_wins(database: str, standin: LangfuseStandIn) -> None:
    """Create-only (409), replace (404) and delete hold across replicas: the (answer, author) pairs
    of a batch are locked in the database before their rows are read."""
    with replica(database, sink_for(standin)) as (a, app_a), replica(database, sink_for(standin)) as (b, _):
        clients = [a, b] * 8
        for n in range(5):
            vote = {"traceId": f"t-{n}", "userId": "bob", "value": "down"}
            start = threading.Barrier(len(clients))

            def create(client: httpx.Client, vote: dict[str, Any] = vote, start: threading.Barrier = start) -> int:
                start.wait()
                return client.post("/api/feedback?mode=create", json=vote).status_code

            with ThreadPoolExecutor(len(clients)) as pool:
                codes = Counter(pool.map(create, clients))
            assert codes == {201: 1, 409: len(clients) - 1}, codes
            start = threading.Barrier(len(clients))

            def delete(client: httpx.Client, vote: dict[str, Any] = vote, start: threading.Barrier = start) -> int:
                start.wait()
                return client.request("DELETE", "/api/feedback", json=vote).status_code

            with ThreadPoolExecutor(len(clients)) as pool:
                codes = Counter(pool.map(delete, clients))
            assert codes == {202: 1, 404: len(clients) - 1}, codes
            replace = {**vote, "value": "up"}
            assert b.put("/api/feedback", json=replace).status_code == 404  # nothing left to replace
        wait_for(drained(a))
        wait_for(drained(b))
        assert standin.score_rows() == []
        same_state(app_a, standin)


def test_two_replicas_hand_one_key_back_and_forth_never_two_owners(database: str, standin: LangfuseStandIn) -> None:
    """Create-only as a lock: whoever creates the vote owns it until it deletes it. Eight clients
    over two replicas take turns; a broken serialisation lets two creates win at once."""
    owner: list[int | None] = [None]
    guard = threading.Lock()
    wins = Counter[int]()
    errors: list[str] = []
    vote = {"traceId": "t-lock", "userId": "bob", "value": "down"}
    with replica(database, sink_for(standin)) as (a, _), replica(database, sink_for(standin)) as (b, app_b):

        def contend(number: int) -> None:
            rng = random.Random(number)
            for _ in range(25):
                client = rng.choice([a, b])
                code = client.post("/api/feedback?mode=create", json=vote).status_code
                if code == 409:
                    continue
                with guard:
                    if code != 201 or owner[0] is not None:
                        errors.append(f"client {number}: {code} while client {owner[0]} owns it")
                    owner[0] = number
                    wins[number] += 1
                with guard:
                    owner[0] = None  # before the delete goes: the next create can only win after it
                gone = rng.choice([a, b]).request("DELETE", "/api/feedback", json=vote).status_code
                if gone != 202:
                    errors.append(f"client {number}: its own vote's delete was {gone}")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(contend, range(8)))
        assert errors == []
        assert sum(wins.values()) >= 8  # it did change hands
        wait_for(drained(a))
        wait_for(drained(b))
        same_state(app_b, standin)


def test_two_replicas_concurrent_writers_lose_nothing_double_nothing_deliver_nothing_twice(
    database: str, standin: LangfuseStandIn
) -> None:
    """Sixteen voters flip votes and verdicts on shared answers, each sending every action to
    either replica at random; eight more write the very same (answer, author) keys at once through
    both. Afterwards Langfuse holds exactly the ledger's state (0 lost, 0 wrong, 0 duplicated), each
    voter's last action is what is stored, and no op was delivered twice, by either replica."""
    log: list[tuple[str, int, str]] = []
    answers = [{"traceId": f"t-{n}"} if n % 2 == 0 else {"contextId": f"s-{n}", "turn": n % 3} for n in range(30)]
    last: dict[tuple[int, int], Any] = {}
    with replica(database, Recording(standin, "a", log)) as (a, app), \
            replica(database, Recording(standin, "b", log)) as (b, _):  # fmt: skip

        def voter(number: int) -> None:
            rng = random.Random(number)
            for _ in range(40):
                n = rng.randrange(len(answers))
                client = rng.choice([a, b])
                if rng.random() < 0.15:
                    body = {**answers[n], "userId": f"v{number}", "verdict": rng.choice(["positive", "negative"])}
                    expect: Any = ("verdict", body["verdict"])
                else:
                    value = rng.random() < 0.5
                    body = {**answers[n], "userId": f"v{number}", "value": "up" if value else "down"}
                    expect = ("vote", value)
                answer = client.post("/api/feedback", json=body)
                assert answer.status_code == 202, answer.text
                slot = last.setdefault((number, n), {})
                slot[expect[0]] = expect[1]

        def shared(number: int) -> None:
            rng = random.Random(1000 + number)
            for _ in range(40):
                body = {**answers[rng.randrange(4)], "userId": "everyone", "value": rng.choice(["up", "down"])}
                assert rng.choice([a, b]).post("/api/feedback", json=body).status_code == 202

        with ThreadPoolExecutor(24) as pool:
            futures = [pool.submit(voter, n) for n in range(16)] + [pool.submit(shared, n) for n in range(8)]
            for future in futures:
                future.result()
        wait_for(drained(a), 30)
        wait_for(drained(b), 30)
        same_state(app, standin)
        rows = standin.score_rows()
        stored = {}
        for r in rows:
            value = r["value"] if r["name"] == "user_feedback" else r["stringValue"]
            stored[(r["metadata"]["reviewer"], r["metadata"]["answer"], r["name"])] = value
    wrong, lost = 0, 0
    for (number, n), kinds in last.items():
        a_key = f"trace:{answers[n]['traceId']}" if "traceId" in answers[n] else \
            f"session:{answers[n]['contextId']}:{answers[n]['turn']}"  # fmt: skip
        for kind, value in kinds.items():
            name = "user_feedback" if kind == "vote" else "verdict"
            want = (1.0 if value else 0.0) if kind == "vote" else value
            got = stored.get((f"user:v{number}", a_key, name))
            lost += got is None
            wrong += got is not None and got != want
    assert (lost, wrong) == (0, 0)
    delivered = Counter(seq for _, seq, _ in log)
    assert [seq for seq, n in delivered.items() if n > 1] == []  # no op delivered twice
    assert {replica for replica, _, _ in log} == {"a", "b"}  # delivery was shared


def test_a_superseded_op_is_never_delivered_after_its_successor_across_replicas(
    database: str, standin: LangfuseStandIn
) -> None:
    """Replica 1 is delivering a vote when the voter flips it through replica 2: replica 2 may not
    deliver the flip until replica 1's delivery is settled, or the old vote could land last."""
    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    order: list[tuple[str, Any]] = []
    one, two = GroupCommit(database, now=now), GroupCommit(database, now=now)
    config = relay_config().relay
    relay_one = Relay(ledger=one, sink=sink_for(standin), config=config, clock=clock)
    relay_two = Relay(ledger=two, sink=sink_for(standin), config=config, clock=clock)
    sink = sink_for(standin)
    in_flight, release = threading.Event(), threading.Event()

    def slow(ops: list[Op]) -> Any:
        in_flight.set()
        release.wait(10)
        assert sink.deliver(ops) == {}
        order.extend(("one", op.body and op.body.value) for op in ops)
        return [op.seq for op in ops], {}, {}

    def send(ops: list[Op]) -> Any:
        assert sink.deliver(ops) == {}
        order.extend(("two", op.body and op.body.value) for op in ops)
        return [op.seq for op in ops], {}, {}

    try:
        asyncio.run(relay_one.feedback(parse_feedback({"traceId": "t", "value": "down"}, max_text={}), "user:x"))
        delivering = threading.Thread(target=lambda: one.deliver(10, slow))
        delivering.start()
        assert in_flight.wait(10)
        asyncio.run(relay_two.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:x"))
        assert two.deliver(10, send) == 0  # the flip waits: its id has an op in flight
        assert two.due_in() == 0.0  # due, yet held
        release.set()
        delivering.join(10)
        assert two.deliver(10, send) == 1
        assert order == [("one", 0), ("two", 1)]
        assert one.reads.depth()[0] == 0
    finally:
        release.set()
        one.close()
        two.close()
    [row] = standin.score_rows()
    assert row["value"] == 1.0


def test_an_op_superseded_during_a_failed_delivery_is_dropped_at_the_next_claim(
    database: str, standin: LangfuseStandIn
) -> None:
    """Replica 1's failed delivery is settled for a retry an hour away just before the flip through
    replica 2 commits, so neither the settle nor the enqueue removed it (the enqueue skips an op in
    flight). The next claim drops the old op instead of delivering it, and the flip goes at once,
    not after the old op's back-off."""
    from triage.relay.postgres import PostgresStorage

    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    ledger = GroupCommit(database, now=now)
    relay = Relay(ledger=ledger, sink=sink_for(standin), config=relay_config().relay, clock=clock)
    worker = Worker(ledger, sink_for(standin), clock, batch_wait=0)
    storage = ledger.storage
    assert isinstance(storage, PostgresStorage)
    try:
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "down"}, max_text={}), "user:x"))
        with storage.pool.connection() as conn:
            old = conn.execute("SELECT seq, score_id, body FROM relay_outbox").fetchone()
        assert old is not None
        asyncio.run(relay.feedback(parse_feedback({"traceId": "t", "value": "up"}, max_text={}), "user:x"))
        with storage.pool.connection() as conn:  # the state the race leaves: the old op, waiting, kept
            conn.execute(
                "INSERT INTO relay_outbox (seq, score_id, op, body, enqueued, next_at, attempts) "
                "OVERRIDING SYSTEM VALUE VALUES (%s, %s, 'put', %s, %s, %s, 1)",
                (old[0], old[1], old[2], now(), now() + 3600),
            )
        assert ledger.due_in() == 0.0  # not in an hour: the old op blocks nothing
        worker.drain()
        assert ledger.reads.depth()[0] == 0
    finally:
        ledger.close()
    [row] = standin.score_rows()
    assert row["value"] == 1.0
    assert len([r for r in standin.requests("/api/public/scores") if r.method == "POST"]) == 1


def test_a_replica_that_dies_mid_delivery_leaves_its_ops_to_the_other(database: str, standin: LangfuseStandIn) -> None:
    """A replica's delivery holds its ops by row locks of its own transaction; killed, its
    connection goes and the other replica delivers them (again: harmless, same ids)."""
    clock = VirtualClock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    one, two = GroupCommit(database, now=now), GroupCommit(database, now=now)
    relay_one = Relay(ledger=one, sink=sink_for(standin), config=relay_config().relay, clock=clock)
    sink = sink_for(standin)
    killed = threading.Event()
    try:
        for user in ("bob", "eve", "kim"):
            vote = parse_feedback({"traceId": "t", "userId": user, "value": "down"}, max_text={})
            asyncio.run(relay_one.feedback(vote, f"user:{user}"))
        from triage.relay.postgres import PostgresStorage

        storage = one.storage
        assert isinstance(storage, PostgresStorage)

        def delivered_then_killed(ops: list[Op]) -> Any:
            assert sink.deliver(ops) == {}
            with storage.pool.connection() as other:  # the kill: its delivery's connection is cut
                other.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
                )
            killed.set()
            return [op.seq for op in ops], {}, {}

        with pytest.raises(Exception):  # noqa: B017 - the settle meets a dead connection
            one.deliver(10, delivered_then_killed)
        assert killed.is_set()
        assert Worker(two, sink, clock, batch_wait=0).run_once() == 3
        assert two.reads.depth()[0] == 0
    finally:
        one.close()
        two.close()
    assert len(standin.score_rows()) == 3


def test_one_replica_at_a_time_runs_the_sinks_housekeeping(database: str) -> None:
    """Langfuse's score configs are made by one replica at a time: another skips its turn."""
    one, two = GroupCommit(database, now=time.time), GroupCommit(database, now=time.time)
    inside, release = threading.Event(), threading.Event()
    try:
        running = threading.Thread(target=lambda: one.exclusively("configs", lambda: (inside.set(), release.wait(10))))
        running.start()
        assert inside.wait(10)
        assert two.exclusively("configs", lambda: None) is False  # the other replica holds it
        assert two.exclusively("other", lambda: None) is True
        release.set()
        running.join(10)
        assert two.exclusively("configs", lambda: None) is True
    finally:
        release.set()
        one.close()
        two.close()


def test_replicas_starting_together_create_the_schema_once(database: str) -> None:
    ledgers: list[GroupCommit] = []
    with ThreadPoolExecutor(4) as pool:
        ledgers = list(pool.map(lambda _: GroupCommit(database, now=time.time), range(4)))
    try:
        assert all(ledger.ready() is None for ledger in ledgers)
    finally:
        for ledger in ledgers:
            ledger.close()


def test_a_database_that_cannot_be_reached_is_503_and_not_ready_and_the_retry_lands_once(
    postgres: PostgresServer, database: str, standin: LangfuseStandIn
) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = conninfo_to_dict(database)["dbname"]
    with replica(database, sink_for(standin)) as (client, app):
        assert app.relay is not None
        vote = {"traceId": "t", "userId": "bob", "value": "up"}
        assert client.post("/api/feedback", json=vote).status_code == 202
        wait_for(drained(client))
        [before] = standin.score_rows()
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')  # type: ignore[arg-type]
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            app.relay._depth = None  # the write path reads the depth at most every half second
            refused = client.post("/api/feedback", json={**vote, "value": "down"})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5", refused.text
            assert "postgresql://" not in refused.text
            assert app.relay.ledger.ready() is not None
        finally:
            with psycopg.connect(postgres.url(), autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')  # type: ignore[arg-type]
        wait_for(lambda: app.relay is not None and app.relay.ledger.ready() is None, 30)  # the pool reconnects
        app.relay._depth = None
        again = client.post("/api/feedback", json={**vote, "value": "down"})  # the client's retry
        assert again.status_code == 202, again.text
        wait_for(drained(client))
        wait_for(lambda: standin.score_rows()[0]["value"] == 0.0)
    [after] = standin.score_rows()
    assert (after["id"], after["timestamp"]) == (before["id"], before["timestamp"])


# --------------------------------------------------------------------------- refusals (no server needed)


def _cli(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str) -> Any:
    from click.testing import CliRunner

    from triage.cli import cli

    for key in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "TRIAGE_RELAY_OUTBOX", "TRIAGE_RELAY_DATABASE_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return CliRunner().invoke(cli, ["relay", "--port", "1", *args])


URL = "postgresql://relay:s3cret-pass@db.invalid:5432/relay"


def test_postgres_with_the_embedded_store_is_refused_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _cli(monkeypatch, {"TRIAGE_RELAY_DATABASE_URL": URL})
    assert result.exit_code == 3, result.output
    assert "needs Langfuse as the sink" in result.output and "one file on one machine" in result.output
    assert "s3cret-pass" not in result.output


def test_postgres_beside_a_sqlite_ledger_and_a_url_of_another_kind_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    langfuse = {"LANGFUSE_PUBLIC_KEY": "pk-lf-x", "LANGFUSE_SECRET_KEY": "sk-lf-x"}
    both = _cli(monkeypatch, {**langfuse, "TRIAGE_RELAY_DATABASE_URL": URL}, "--outbox", "/tmp/relay.sqlite")
    assert both.exit_code == 3 and "one ledger" in both.output
    other = _cli(monkeypatch, {**langfuse, "TRIAGE_RELAY_DATABASE_URL": "mysql://x@y/z"})
    assert other.exit_code == 3 and "postgresql:// URL" in other.output


def test_a_database_that_cannot_be_reached_at_start_is_a_configuration_error() -> None:
    pytest.importorskip("psycopg")
    from triage.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        GroupCommit("postgresql://relay:s3cret-pass@127.0.0.1:1/relay?connect_timeout=2", now=time.time)
    assert "cannot be opened" in str(refused.value) and "s3cret-pass" not in str(refused.value)
    assert "127.0.0.1:1/relay" in str(refused.value)
