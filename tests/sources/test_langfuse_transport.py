"""LangfuseBackend over `httpx.MockTransport` in virtual time: retries, errors, mapping, writes.

No sockets and no real sleeps (both are refused below): every back-off and every confirm poll
lands in the injected `VirtualClock`'s `sleeps`. The real-protocol tests, against a stand-in
server on 127.0.0.1, are in test_langfuse.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_transport import (
    BASE_URL,
    OBSERVATIONS_V2,
    PROJECTS,
    SCORES,
    SCORES_V3,
    Router,
    body,
    error,
    http_date,
    observation_v2,
    observations_page,
    on_observation,
    on_session,
    on_trace,
    params,
    projects,
    reply,
    score_created,
    score_v3,
    scores_accepted,
    scores_page,
    scores_partial,
    scores_table,
)
from triage.domain.records import UnreadableTrace
from triage.domain.scores import ScoreBody, score_id
from triage.errors import ConfigError, LangfuseError
from triage.retry import RetryPolicy, retry_after, use_clock
from triage.sources.langfuse.backend import LangfuseBackend

PUBLIC_KEY = "pk-lf-unit-test"
SECRET_KEY = "sk-lf-do-not-print-me"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EMPTY = reply(200, scores_page([]))


@pytest.fixture(autouse=True)
def no_sockets_no_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry that slept for real, or a request that left the process, fails the test."""

    def refuse_sleep(seconds: float) -> None:
        raise AssertionError(f"a real sleep of {seconds} s")

    def refuse_connect(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a real connection to {address}")

    monkeypatch.setattr(time, "sleep", refuse_sleep)
    monkeypatch.setattr(socket.socket, "connect", refuse_connect)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(start=T0)


@pytest.fixture
def router() -> Router:
    return Router()


def backend(router: Router, clock: VirtualClock, **options: Any) -> LangfuseBackend:
    return LangfuseBackend(
        public_key=PUBLIC_KEY,
        secret_key=SECRET_KEY,
        base_url=BASE_URL,
        httpx_client=router.client(),
        clock=clock,
        **options,
    )


def triaged_once(router: Router, clock: VirtualClock, **options: Any) -> set[str]:
    """One `triaged()` call: a single `GET /v3/scores?id=...` (plus its retries)."""
    return backend(router, clock, **options).triaged(["t-1"], "triage_layer", "1")


# --------------------------------------------------------------------------- retries over HTTP


def test_429_with_retry_after_seconds_waits_exactly_that(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, error(429, headers={"Retry-After": "2"}), EMPTY)
    assert triaged_once(router, clock) == set()
    assert clock.sleeps == [2.0]
    assert len(router.history) == 2


def test_429_with_retry_after_ms_waits_the_fraction(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, error(429, headers={"retry-after-ms": "1500", "Retry-After": "9"}), EMPTY)
    triaged_once(router, clock)
    assert clock.sleeps == [1.5]


def test_429_with_an_http_date_waits_until_then(router: Router, clock: VirtualClock) -> None:
    when = http_date(clock.now() + timedelta(seconds=5))
    router.on("GET", SCORES_V3, error(429, headers={"Retry-After": when}), EMPTY)
    with use_clock(clock):
        triaged_once(router, clock)
    assert clock.sleeps == [5.0]


def test_429_with_an_http_date_uses_the_injected_clock(router: Router, clock: VirtualClock) -> None:
    when = http_date(clock.now() + timedelta(seconds=5))
    router.on("GET", SCORES_V3, error(429, headers={"Retry-After": when}), EMPTY)
    triaged_once(router, clock)  # no use_clock: only the clock given to the backend
    assert clock.sleeps == [5.0]


def test_503_backs_off_then_succeeds_and_every_request_is_counted(
    router: Router, clock: VirtualClock
) -> None:
    router.on("GET", SCORES_V3, error(503), error(503), EMPTY)
    lf = backend(router, clock)
    assert lf.triaged(["t-1"], "triage_layer", "1") == set()
    # exponential with jitter: 0.5 s doubling, plus up to 0.5 s
    first, second = clock.sleeps
    assert 0.5 <= first <= 1.0
    assert 1.0 <= second <= 1.5
    assert lf.stats.requests == 3 == len(router.history)


def test_a_dropped_connection_is_retried(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, httpx.ConnectError("connection refused"), EMPTY)
    lf = backend(router, clock)
    lf.triaged(["t-1"], "triage_layer", "1")
    assert len(clock.sleeps) == 1 and lf.stats.requests == 2


def test_a_400_is_not_retried_and_raises_langfuse_error(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, error(400, "limit must be between 1 and 100"))
    lf = backend(router, clock)
    with pytest.raises(LangfuseError, match="HTTP 400.*limit must be between 1 and 100"):
        lf.votes("user_feedback", T0 - timedelta(days=1), T0)
    assert clock.sleeps == []
    assert lf.stats.requests == 1


@pytest.mark.parametrize("status", [401, 403])
def test_refused_keys_on_open_raise_config_error_without_the_secret(
    router: Router, clock: VirtualClock, status: int
) -> None:
    router.on("GET", PROJECTS, error(status, "Invalid credentials"))
    lf = backend(router, clock)
    with pytest.raises(ConfigError) as caught:
        with lf:
            pass
    message = str(caught.value)
    assert "LANGFUSE_PUBLIC_KEY" in message and f"HTTP {status}" in message
    assert SECRET_KEY not in message and PUBLIC_KEY not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert len(router.history) == 1 and clock.sleeps == []  # refused keys are not retried
    # the keys did go out, as HTTP Basic auth
    basic = base64.b64encode(f"{PUBLIC_KEY}:{SECRET_KEY}".encode()).decode()
    assert router.history[0].headers["authorization"] == f"Basic {basic}"


def test_open_reads_the_project_for_links(router: Router, clock: VirtualClock) -> None:
    router.on("GET", PROJECTS, error(503), reply(200, projects("proj-42")))
    with backend(router, clock) as lf:
        assert lf.trace_url("t/1") == f"{BASE_URL}/project/proj-42/traces/t%2F1"
    assert len(clock.sleeps) == 1


def test_the_deadline_stops_retries(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, then=error(503, "upstream busy"))
    lf = backend(router, clock, deadline_seconds=10)
    with pytest.raises(LangfuseError, match="HTTP 503"):
        lf.triaged(["t-1"], "triage_layer", "1")
    assert sum(clock.sleeps) <= 10
    assert len(clock.sleeps) >= 3  # it did retry, with growing waits, until the next would overrun
    assert clock.sleeps == sorted(clock.sleeps)
    assert lf.stats.requests == len(clock.sleeps) + 1 == len(router.history)


def test_a_long_retry_after_past_the_deadline_gives_up_at_once(router: Router, clock: VirtualClock) -> None:
    router.on("GET", SCORES_V3, then=error(429, headers={"Retry-After": "3600"}))
    with pytest.raises(LangfuseError, match="HTTP 429"):
        triaged_once(router, clock, deadline_seconds=60)
    assert clock.sleeps == [] and len(router.history) == 1


# --------------------------------------------------------------------------- reading votes


def test_votes_map_subjects_and_ignore_what_is_not_a_vote(router: Router, clock: VirtualClock) -> None:
    rows = [
        score_v3(
            "sv",
            timestamp=T0 - timedelta(hours=3),
            value=False,
            subject=on_session("sess-1"),
            metadata={"turn": 2, "userId": "u-7"},
            comment="not what I asked",
        ),
        score_v3("ov", timestamp=T0 - timedelta(hours=2), value=0, subject=on_observation("obs-1", "t-2")),
        score_v3("up", timestamp=T0 - timedelta(hours=1), value=True, subject=on_trace("t-3")),
        score_v3(
            "cat",
            timestamp=T0 - timedelta(hours=1),
            data_type="CATEGORICAL",
            value="bad",
            subject=on_trace("t-4"),
        ),
        score_v3(
            "exp", timestamp=T0 - timedelta(hours=1), value=0, subject={"kind": "experiment", "id": "r-1"}
        ),
    ]
    router.on("GET", SCORES_V3, then=scores_table(rows))
    start, end = T0 - timedelta(days=1), T0
    votes = backend(router, clock).votes("user_feedback", start, end).votes

    by_id = {v.id: v for v in votes}
    assert [v.id for v in votes] == ["sv", "ov", "up"]  # oldest first; categorical and experiment out
    session = by_id["sv"]
    assert (session.session_id, session.turn, session.trace_id) == ("sess-1", 2, None)
    assert session.is_thumbs_down and session.user_id == "u-7" and session.comment == "not what I asked"
    assert (by_id["ov"].trace_id, by_id["ov"].session_id, by_id["ov"].value) == ("t-2", None, 0.0)
    assert by_id["up"].trace_id == "t-3" and by_id["up"].value == 1.0
    assert session.timestamp == T0 - timedelta(hours=3) and session.timestamp.tzinfo is not None

    window, reread = (params(r) for r in router.history)
    assert window == {
        "name": "user_feedback",
        # the window's start less the 30-day lookback: a vote changed in the window keeps its first timestamp
        "fromTimestamp": "2026-01-29T12:00:00Z",
        "toTimestamp": "2026-03-01T12:00:00Z",
        "fields": "subject,details",
        "limit": "100",
    }
    # the thumbs-down candidates are re-read by id (their current row), nothing else
    assert set(reread["id"].split(",")) == {"sv", "ov", "exp"} and "fromTimestamp" not in reread


def test_votes_follow_the_cursor(router: Router, clock: VirtualClock) -> None:
    newer = score_v3("b", timestamp=T0 - timedelta(hours=1), value=1, subject=on_trace("t-b"))
    older = score_v3("a", timestamp=T0 - timedelta(hours=2), value=1, subject=on_trace("t-a"))
    router.on(
        "GET", SCORES_V3, reply(200, scores_page([newer], cursor="c2")), reply(200, scores_page([older]))
    )
    votes = backend(router, clock).votes("user_feedback", T0 - timedelta(days=1), T0).votes
    assert [v.id for v in votes] == ["a", "b"]
    assert "cursor" not in params(router.history[0]) and params(router.history[1])["cursor"] == "c2"


# --------------------------------------------------------------------------- reading traces


def test_observations_of_many_traces_in_one_request_newest_row_wins(
    router: Router, clock: VirtualClock
) -> None:
    rows = [
        observation_v2("t1-root", "t1", start=T0, type="AGENT", input="q1?", output="a1"),
        observation_v2("t1-tool", "t1", start=T0 + timedelta(seconds=1), type="TOOL", parent="t1-root"),
        observation_v2(
            "t1-tool",
            "t1",
            start=T0 + timedelta(seconds=1),
            type="TOOL",
            parent="t1-root",
            output={"content": "newest"},
            updated_at=T0 + timedelta(minutes=5),
        ),
        observation_v2("t2-root", "t2", start=T0 + timedelta(minutes=1), type="AGENT", input="q2?"),
    ]
    router.on("GET", OBSERVATIONS_V2, reply(200, observations_page(rows)))
    found = backend(router, clock).observations(["t1", "t2", "t3"])

    assert [o.id for o in found["t1"]] == ["t1-root", "t1-tool"]
    assert json.loads(found["t1"][1].output or "null") == {"content": "newest"}
    assert json.loads(found["t1"][0].input or "null") == "q1?"  # raw JSON strings, as the API sends them
    assert [o.id for o in found["t2"]] == ["t2-root"] and found["t3"] == []
    [request] = router.history
    [condition] = json.loads(params(request)["filter"])
    assert condition == {
        "type": "stringOptions",
        "column": "traceId",
        "operator": "any of",
        "value": ["t1", "t2", "t3"],
    }


# --------------------------------------------------------------------------- writing scores


def score(trace_id: str, value: str = "retrieval") -> ScoreBody:
    return ScoreBody(
        data_type="CATEGORICAL",
        id=score_id(trace_id, "triage_layer", "1"),
        trace_id=trace_id,
        name="triage_layer",
        value=value,
        comment="why",
        metadata={"rule_version": "1"},
        timestamp=T0,
    )


def landed(write: ScoreBody) -> dict[str, Any]:
    """The v3 row a read-back shows once `write` has landed (CATEGORICAL: a string value)."""
    return score_v3(
        write.id, timestamp=write.timestamp, name=write.name, data_type="CATEGORICAL", value=write.value
    )


def test_a_207_write_whose_read_back_shows_the_value_is_confirmed(
    router: Router, clock: VirtualClock
) -> None:
    kept, dropped = score("t-1"), score("t-2")
    router.on("POST", SCORES, scores_partial(1, "value is not a category of the config"))
    router.on("GET", SCORES_V3, then=scores_table([landed(kept)]))
    lf = backend(router, clock, confirm_wait_seconds=3)
    outcome = lf.write_scores([kept, dropped])

    assert outcome.confirmed == [kept.id]
    assert list(outcome.failed) == [dropped.id]
    assert "not readable after 3 s" in outcome.failed[dropped.id]
    assert "rejected 1 of 2" in outcome.failed[dropped.id]  # the 207's warning travels with it
    assert clock.sleeps == [1.0, 2.0]  # the confirm polls, in virtual time

    [post] = router.requests("POST", SCORES)
    sent = body(post)
    assert [s["id"] for s in sent] == [kept.id, dropped.id]
    assert sent[0]["traceId"] == "t-1" and sent[0]["dataType"] == "CATEGORICAL"
    assert datetime.fromisoformat(sent[0]["timestamp"].replace("Z", "+00:00")) == T0  # the upsert key
    reads = router.requests("GET", SCORES_V3)
    assert set(params(reads[0])["id"].split(",")) == {kept.id, dropped.id}
    assert params(reads[1])["id"] == dropped.id  # the confirmed one is not asked for again


def test_a_write_never_readable_fails_after_the_confirm_wait(router: Router, clock: VirtualClock) -> None:
    lost = score("t-1")
    router.on("POST", SCORES, scores_accepted())
    router.on("GET", SCORES_V3, then=EMPTY)
    outcome = backend(router, clock, confirm_wait_seconds=5).write_scores([lost])

    assert outcome.confirmed == []
    assert "not readable after 5 s" in outcome.failed[lost.id]
    assert sum(clock.sleeps) == pytest.approx(5.0) and clock.sleeps == [1.0, 2.0, 2.0]
    assert len(router.requests("GET", SCORES_V3)) == 3


def test_a_read_back_with_another_value_is_not_confirmed(router: Router, clock: VirtualClock) -> None:
    write = score("t-1", value="generation")
    router.on("POST", SCORES, scores_accepted())
    router.on("GET", SCORES_V3, then=scores_table([landed(score("t-1", value="retrieval"))]))
    outcome = backend(router, clock, confirm_wait_seconds=2).write_scores([write])
    assert outcome.confirmed == []
    assert "read back value 'retrieval', expected 'generation'" in outcome.failed[write.id]


def test_a_server_on_the_older_contract_gets_one_object_per_post(router: Router, clock: VirtualClock) -> None:
    first, second = score("t-1"), score("t-2")
    router.on(
        "POST",
        SCORES,
        error(400, "Invalid request data: expected object, received array"),
        score_created(first.id),
        score_created(second.id),
    )
    router.on("GET", SCORES_V3, then=scores_table([landed(first), landed(second)]))
    outcome = backend(router, clock).write_scores([first, second])

    assert outcome.confirmed == [first.id, second.id] and outcome.failed == {}
    list_post, *single = router.requests("POST", SCORES)
    assert isinstance(body(list_post), list)
    assert [body(r)["id"] for r in single] == [first.id, second.id]


# --------------------------------------------------------------------------- retry_after


NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"RETRY-AFTER": "0"}, 0.0),
        ({"Retry-After": "-4"}, 0.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "Retry-After": "10"}, 1.5),  # the finer header wins
        ({"retry-after-ms": "soon", "Retry-After": "3"}, 3.0),  # an unusable one is skipped
        ({"Retry-After": http_date(NOW + timedelta(seconds=30))}, 30.0),
        ({"Retry-After": http_date(NOW - timedelta(seconds=30))}, 0.0),  # already past
    ],
)
def test_retry_after_reads_seconds_fractions_and_dates(headers: dict[str, str], expected: float) -> None:
    assert retry_after(headers, now=NOW) == expected


@pytest.mark.parametrize(
    "headers",
    [None, {}, {"Retry-After": ""}, {"Retry-After": "soon"}, {"Retry-After": "Thu, 99 Foo 2026"}, {"X": "1"}],
)
def test_retry_after_without_a_usable_header_is_none(headers: dict[str, str] | None) -> None:
    assert retry_after(headers, now=NOW) is None


@pytest.mark.parametrize("value", ["nan", "inf", "1e400"])
def test_retry_after_rejects_non_finite_numbers(value: str) -> None:
    assert retry_after({"Retry-After": value}, now=NOW) is None
    assert retry_after({"retry-after-ms": value}, now=NOW) is None


def test_retry_after_dates_default_to_the_current_clock() -> None:
    clock = VirtualClock(start=NOW)
    clock.sleep(10)
    with use_clock(clock):
        assert retry_after({"Retry-After": http_date(NOW + timedelta(seconds=30))}) == 20.0


# --------------------------------------------------------------------------- RetryPolicy


class Flaky:
    """Fails `failures` times with `error`, then returns "done"; counts calls."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures, self.calls = failures, 0
        self.error = error or OSError("flaky")

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def retry_os_errors(ex: BaseException) -> bool:
    return isinstance(ex, OSError)


def test_policy_gives_up_after_its_attempts_with_the_last_error(clock: VirtualClock) -> None:
    flaky = Flaky(10)
    policy = RetryPolicy(attempts=3, initial=1.0, jitter=0.0, clock=clock)
    with pytest.raises(OSError, match="flaky"):
        policy.retrying(retry_os_errors)(flaky)
    assert flaky.calls == 3 and clock.sleeps == [1.0, 2.0]


def test_policy_does_not_retry_what_is_not_retryable(clock: VirtualClock) -> None:
    flaky = Flaky(1, ValueError("bad request"))
    with pytest.raises(ValueError):
        RetryPolicy(attempts=5, clock=clock).retrying(retry_os_errors)(flaky)
    assert flaky.calls == 1 and clock.sleeps == []


def test_policy_backs_off_up_to_its_maximum(clock: VirtualClock) -> None:
    flaky = Flaky(5)
    policy = RetryPolicy(attempts=6, initial=1.0, maximum=4.0, jitter=0.0, clock=clock)
    assert policy.retrying(retry_os_errors)(flaky) == "done"
    assert clock.sleeps == [1.0, 2.0, 4.0, 4.0, 4.0]


def test_policy_deadline_stops_before_a_wait_that_would_overrun_it(clock: VirtualClock) -> None:
    flaky = Flaky(100)
    policy = RetryPolicy(attempts=None, deadline=5.0, initial=1.0, jitter=0.0, clock=clock)
    with pytest.raises(OSError):
        policy.retrying(retry_os_errors)(flaky)
    # waits 1 and 2 fit (ending at 3 s); the next, 4, would end at 7 s, past the deadline
    assert clock.sleeps == [1.0, 2.0] and flaky.calls == 3


def test_policy_honours_retry_after_within_its_cap(clock: VirtualClock) -> None:
    policy = RetryPolicy(attempts=2, max_retry_after=10.0, clock=clock)
    # `retry_after` finds the failure's headers; the policy reads the wait from them
    assert policy.retrying(retry_os_errors, retry_after=lambda ex: {"Retry-After": "2"})(Flaky(1)) == "done"
    assert policy.retrying(retry_os_errors, retry_after=lambda ex: {"Retry-After": "120"})(Flaky(1)) == "done"
    assert clock.sleeps == [2.0, 10.0]


def test_policy_without_a_clock_takes_the_current_one() -> None:
    virtual = VirtualClock()
    with use_clock(virtual):
        retrying = RetryPolicy(attempts=2, initial=1.0, jitter=0.0).retrying(retry_os_errors)
    assert retrying(Flaky(1)) == "done"  # the clock was fixed when the loop was made
    assert virtual.sleeps == [1.0]


def test_async_policy_sleeps_on_the_clock(clock: VirtualClock) -> None:
    policy = RetryPolicy(attempts=3, initial=0.5, jitter=0.0, clock=clock)
    flaky = Flaky(2)

    async def run() -> str:
        async for attempt in policy.async_retrying(retry_os_errors):
            with attempt:
                return flaky()
        raise AssertionError("unreachable")

    assert asyncio.run(run()) == "done"
    assert clock.sleeps == [0.5, 1.0] and flaky.calls == 3


def test_virtual_time_fixture_makes_default_policies_virtual(virtual_time: VirtualClock) -> None:
    flaky = Flaky(1)
    assert RetryPolicy(attempts=2, initial=3.0, jitter=0.0).retrying(retry_os_errors)(flaky) == "done"
    assert virtual_time.sleeps == [3.0]


# --------------------------------------------------------------------------- rows that break the contract


def test_one_row_breaking_the_contract_costs_only_its_own_trace(
    router: Router, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    tolerated = observation_v2("o-1", "t-1", start=T0, input="q", output="a")
    tolerated["projectId"] = None  # a field triage never reads: tolerated
    broken = observation_v2("o-2", "t-2", start=T0)
    broken["startTime"] = "not a time"  # a field triage needs: that trace alone is unreadable
    fine = observation_v2("o-3", "t-3", start=T0)
    router.on("GET", OBSERVATIONS_V2, reply(200, observations_page([tolerated, broken, fine])))
    with caplog.at_level("WARNING", logger="triage"):
        found = backend(router, clock).observations(["t-1", "t-2", "t-3"])
    assert [o.id for o in found["t-1"]] == ["o-1"]  # type: ignore[union-attr]
    assert [o.id for o in found["t-3"]] == ["o-3"]  # type: ignore[union-attr]
    unreadable = found["t-2"]
    assert isinstance(unreadable, UnreadableTrace)
    assert "startTime" in unreadable.reason and len(unreadable.reason) < 300
    assert len(router.requests("GET", OBSERVATIONS_V2)) == 1  # one batch, one request
    contract_lines = [r for r in caplog.records if "do not match the API contract" in r.getMessage()]
    assert len(contract_lines) == 1  # the long validation error is logged once
