"""LangfuseBackend against the local Langfuse stand-in, over real HTTP on 127.0.0.1.

Every exchange of the spec test is validated against ../shared/langfuse/openapi.yml.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.doubles.langfuse_server import LangfuseStandIn, iso
from triage.domain.scores import ScoreBody, score_id
from triage.domain.votes import TraceRef
from triage.errors import ConfigError, LangfuseError
from triage.sources.langfuse.backend import LangfuseBackend

SPEC = Path(__file__).resolve().parents[3] / "shared" / "langfuse" / "openapi.yml"
NOW = datetime.now(UTC).replace(microsecond=0)
WINDOW = (NOW - timedelta(days=1), NOW - timedelta(minutes=15))


# --------------------------------------------------------------------------- data


def trace(
    trace_id: str,
    *,
    start: datetime | None = None,
    session_id: str | None = None,
    tools: int = 2,
    vote: float | None = 0,
    vote_at: datetime | None = None,
    comment: str = "wrong answer",
) -> dict[str, Any]:
    """A trace in the import format: a root, `tools` TOOL children, a GENERATION, maybe a vote."""
    start = start or NOW - timedelta(hours=3)
    root = {
        "id": f"{trace_id}-root",
        "traceId": trace_id,
        "type": "AGENT",
        "name": "docs-agent",
        "parentObservationId": None,
        "startTime": iso(start),
        "endTime": iso(start + timedelta(seconds=9)),
        "input": json.dumps({"messages": [{"role": "user", "content": f"question {trace_id}?"}]}),
        "output": json.dumps({"role": "assistant", "content": f"answer {trace_id}"}),
        "metadata": {"agent": "kubeflow-docs"},
        "sessionId": session_id,
        "userId": "u1",
        "environment": "production",
    }
    observations = [root]
    for n in range(tools):
        observations.append(
            {
                "id": f"{trace_id}-tool{n}",
                "traceId": trace_id,
                "type": "TOOL",
                "name": "search_kubeflow_docs",
                "parentObservationId": root["id"],
                "startTime": iso(start + timedelta(seconds=n + 1)),
                "input": json.dumps({"query": f"q{n}"}),
                "output": json.dumps({"content": [{"type": "text", "text": f"result {n}"}]}),
                "metadata": {},
                "sessionId": session_id,
                "environment": "production",
            }
        )
    observations.append(
        {
            "id": f"{trace_id}-gen",
            "traceId": trace_id,
            "type": "GENERATION",
            "name": "llm",
            "parentObservationId": root["id"],
            "startTime": iso(start + timedelta(seconds=tools + 1)),
            "input": json.dumps([{"role": "user", "content": "x"}]),
            "output": json.dumps("plain string output"),
            "metadata": {"model": "m"},
            "environment": "production",
        }
    )
    scores = []
    if vote is not None:
        scores.append(
            {
                "id": f"vote-{trace_id}",
                "name": "user_feedback",
                "dataType": "BOOLEAN",
                "value": vote,
                "comment": comment,
                "traceId": trace_id,
                "timestamp": iso(vote_at or start + timedelta(minutes=1)),
                "userId": "voter-1",
                "environment": "production",
                "source": "API",
            }
        )
    return {"traceId": trace_id, "observations": observations, "scores": scores}


def session_vote(vote_id: str, session_id: str, turn: int, at: datetime) -> dict[str, Any]:
    score = {
        "id": vote_id,
        "name": "user_feedback",
        "dataType": "BOOLEAN",
        "value": 0,
        "comment": "not what I asked",
        "sessionId": session_id,
        "metadata": {"turn": turn},
        "timestamp": iso(at),
    }
    return {"traceId": None, "observations": [], "scores": [score]}


def ids(sessions: dict[str, list[TraceRef]]) -> dict[str, list[str]]:
    """Each session's trace ids, in the order read."""
    return {s: [t.trace_id for t in traces] for s, traces in sessions.items()}


def layer_score(trace_id: str, value: str = "retrieval", *, rule: str = "1") -> ScoreBody:
    return ScoreBody(
        data_type="CATEGORICAL",
        id=score_id(trace_id, "triage_layer", rule),
        trace_id=trace_id,
        name="triage_layer",
        value=value,
        comment="the index has the answer; the agent's search missed it",
        metadata={"rule_version": rule, "facts": {"agent_searched": True}},
        timestamp=NOW - timedelta(hours=3),
        environment="production",
    )


@pytest.fixture
def server() -> Iterator[LangfuseStandIn]:
    with LangfuseStandIn() as srv:
        yield srv


def backend_for(srv: LangfuseStandIn, **kw: Any) -> LangfuseBackend:
    options: dict[str, Any] = {
        "public_key": srv.public_key,
        "secret_key": srv.secret_key,
        "base_url": srv.url,
        "timeout": 5.0,
        "deadline_seconds": 10.0,
        "confirm_wait_seconds": 5.0,
        "backoff_initial": 0.01,
        "backoff_max": 0.2,
        "confirm_first_wait": 0.0,
    }
    options.update(kw)
    return LangfuseBackend(**options)


# --------------------------------------------------------------------------- votes


def test_votes_page_through_newest_first_without_a_value_filter(server: LangfuseStandIn) -> None:
    records = [
        trace(f"t{i:03d}", vote=0 if i % 3 else 1, vote_at=NOW - timedelta(hours=2, minutes=i))
        for i in range(250)
    ]
    records.append(trace("old", vote=0, vote_at=NOW - timedelta(days=3)))  # outside the window
    server.load(records)
    with backend_for(server) as backend:
        votes = backend.votes("user_feedback", *WINDOW).votes
    assert len(votes) == 250
    assert {v.trace_id for v in votes} == {f"t{i:03d}" for i in range(250)}
    down = [v for v in votes if v.is_thumbs_down]
    assert len(down) == sum(1 for i in range(250) if i % 3)
    sample = next(v for v in votes if v.trace_id == "t001")
    assert (sample.comment, sample.user_id, sample.environment, sample.value) == (
        "wrong answer",
        "voter-1",
        "production",
        0,
    )
    window_reads = [r for r in server.requests("/v3/scores") if "fromTimestamp" in r.query]
    assert len(window_reads) == 3  # 250 rows at 100 per page
    for r in window_reads:
        assert r.query["limit"] == ["100"] and r.query["fields"] == ["subject,details"]
        assert "value" not in r.query and r.query["name"] == ["user_feedback"]
    assert sum(1 for r in window_reads if "cursor" in r.query) == 2


def test_changed_votes_read_their_current_row_not_a_stale_one(server: LangfuseStandIn) -> None:
    server.load([trace("flip-in"), trace("flip-out"), trace("steady")])
    # a vote changed within the window: a second physical row (new timestamp) with value 1
    server.add_score_row(
        {"id": "vote-flip-in", "name": "user_feedback", "dataType": "BOOLEAN", "value": 1,
         "traceId": "flip-in", "timestamp": iso(NOW - timedelta(hours=1))}
    )  # fmt: skip
    # a vote changed after the window ended: its current row is outside the window
    server.add_score_row(
        {"id": "vote-flip-out", "name": "user_feedback", "dataType": "BOOLEAN", "value": 1,
         "traceId": "flip-out", "timestamp": iso(NOW - timedelta(minutes=5))}
    )  # fmt: skip
    # the trap, as the stand-in models it: a value filter still matches the stale rows
    raw = httpx.get(
        f"{server.url}/api/public/v3/scores",
        params={"name": "user_feedback", "dataType": "BOOLEAN", "value": "false", "limit": 100},
        auth=(server.public_key, server.secret_key),
    ).json()
    assert {s["id"] for s in raw["data"]} == {"vote-flip-in", "vote-flip-out", "vote-steady"}

    with backend_for(server) as backend:
        votes = {v.id: v for v in backend.votes("user_feedback", *WINDOW).votes}
    assert votes["vote-flip-in"].value == 1
    assert votes["vote-flip-out"].value == 1  # re-read by id: the current row wins
    assert votes["vote-steady"].value == 0
    assert [v.id for v in votes.values() if v.is_thumbs_down] == ["vote-steady"]


def test_session_votes_and_turns_that_arrive_after_the_vote(server: LangfuseStandIn) -> None:
    base = NOW - timedelta(hours=4)
    # ids deliberately out of start order: the order must come from root start times
    server.load(
        [
            trace("s1-b", start=base, session_id="s1", vote=None),
            trace("s1-a", start=base + timedelta(minutes=2), session_id="s1", vote=None),
            trace("s2-only", start=base, session_id="s2", vote=None),
            session_vote("sv1", "s1", turn=2, at=base + timedelta(minutes=3)),
        ]
    )
    with backend_for(server) as backend:
        votes = backend.votes("user_feedback", *WINDOW).votes
        assert [(v.session_id, v.turn, v.trace_id) for v in votes] == [("s1", 2, None)]
        early = backend.session_traces(["s1", "s2", "empty"])
        assert ids(early) == {"s1": ["s1-b", "s1-a"], "s2": ["s2-only"], "empty": []}
        # with their start times: a vote without a turn is placed by them
        assert [t.start_time for t in early["s1"]] == [base, base + timedelta(minutes=2)]
        # turn 2 (0-based) lands later; an earlier-started trace in another session changes nothing
        server.load([trace("s1-c", start=base + timedelta(minutes=5), session_id="s1", vote=None)])
        late = backend.session_traces(["s1"])
    assert ids(late) == {"s1": ["s1-b", "s1-a", "s1-c"]}
    reads = server.requests("/v2/observations")
    assert len(reads) == 2  # one request per call, sessions batched in one filter
    condition = json.loads(reads[0].query["filter"][0])
    assert {"type": "boolean", "column": "isRootObservation", "operator": "=", "value": True} in condition


# --------------------------------------------------------------------------- observations


def test_observations_batch_many_traces_and_keep_the_newest_duplicate(server: LangfuseStandIn) -> None:
    ids = [f"t{i:03d}" for i in range(200)]
    server.load([trace(t, tools=8) for t in ids])
    # an unmerged older row of an observation: same id, older updatedAt, stale output
    for t in ids[:50]:
        server.add_duplicate_observation(f"{t}-gen", output=json.dumps("STALE"))
    with backend_for(server) as backend:
        found = backend.observations(ids)
    assert set(found) == set(ids)
    for t in ids:
        assert [o.id for o in found[t]] == [f"{t}-root", *(f"{t}-tool{n}" for n in range(8)), f"{t}-gen"]
        gen = found[t][-1]
        assert gen.output == json.dumps("plain string output")
        assert (
            isinstance(found[t][0].input, str)
            and json.loads(found[t][0].input)["messages"][0]["role"] == "user"
        )
    reads = server.requests("/v2/observations")
    # 2050 rows for 200 traces: two filtered batches of 100 traces; the first (with the
    # duplicates) spans two 1000-row pages, the second fills exactly one
    assert len(reads) == 3 and sum(1 for r in reads if "cursor" in r.query) == 1
    for r in reads:
        condition = json.loads(r.query["filter"][0])
        assert condition[0]["column"] == "traceId" and condition[0]["operator"] == "any of"
        assert r.query["limit"] == ["1000"] and r.query["fields"] == ["core,basic,time,io,metadata"]


def test_observations_fall_back_to_one_trace_per_request_when_the_filter_is_refused() -> None:
    with LangfuseStandIn(records=[trace("a"), trace("b")], filter_any_of=False) as srv:
        with backend_for(srv) as backend:
            first = backend.observations(["a", "b"])
            second = backend.observations(["a"])
        assert [o.id for o in first["b"]] == ["b-root", "b-tool0", "b-tool1", "b-gen"]
        assert [o.id for o in second["a"]] == ["a-root", "a-tool0", "a-tool1", "a-gen"]
        reads = srv.requests("/v2/observations")
    assert [r.status for r in reads] == [400, 200, 200, 200]  # the filter is tried once per run
    assert [r.query.get("traceId") for r in reads[1:]] == [["a"], ["b"], ["a"]]


def test_legacy_server_reads_traces_and_sessions_through_the_old_api() -> None:
    records = [
        trace("a", session_id="s", start=NOW - timedelta(hours=2)),
        trace("b", session_id="s", start=NOW - timedelta(hours=3)),
    ]
    with LangfuseStandIn(records=records) as modern, backend_for(modern) as backend:
        expected = backend.observations(["a", "b"])
    with LangfuseStandIn(records=records, legacy=True) as srv:
        with backend_for(srv) as backend:
            found = backend.observations(["a", "b", "missing"])
            sessions = backend.session_traces(["s"])
            backend.observations(["a"])
        v2 = srv.requests("/v2/observations")
        legacy = srv.requests("/api/public/traces/")
    assert len(v2) == 1 and v2[0].status == 404  # detected once per run
    assert [r.path for r in legacy] == [f"/api/public/traces/{t}" for t in ("a", "b", "missing", "a")]
    assert found["missing"] == []
    assert ids(sessions) == {"s": ["b", "a"]}
    assert sessions["s"][0].start_time == NOW - timedelta(hours=3)
    for t in ("a", "b"):
        got = {o.id: (o.input, o.output, o.parent_observation_id, o.type) for o in found[t]}
        want = {o.id: (o.input, o.output, o.parent_observation_id, o.type) for o in expected[t]}
        assert got == want  # the same raw-string shape from both APIs


# --------------------------------------------------------------------------- writing scores


def test_list_writes_upsert_and_a_rewrite_never_adds_a_row(server: LangfuseStandIn) -> None:
    server.load([trace(f"t{i}") for i in range(150)])
    first = [layer_score(f"t{i}") for i in range(150)]
    with backend_for(server) as backend:
        outcome = backend.write_scores(first)
        assert outcome.failed == {} and outcome.confirmed == [s.id for s in first]
        again = backend.write_scores([layer_score(f"t{i}", "generation") for i in range(150)])
    assert again.failed == {} and len(again.confirmed) == 150
    posts = server.requests("/api/public/scores")
    assert [r.status for r in posts if r.method == "POST"] == [202, 202]
    body = json.loads(posts[0].request_body)
    assert isinstance(body, list) and len(body) == 150
    sent = body[0]
    assert sent["id"] == first[0].id and sent["dataType"] == "CATEGORICAL" and sent["traceId"] == "t0"
    assert sent["environment"] == "production" and sent["comment"] and sent["metadata"]["rule_version"] == "1"
    assert sent["timestamp"].startswith(iso(NOW - timedelta(hours=3))[:19])
    for score in first:
        rows = server.score_rows(score.id)
        assert len(rows) == 1 and rows[0]["stringValue"] == "generation"
    # the stand-in's rule: the same id with another timestamp is a second physical row
    moved = replace(layer_score("t0"), timestamp=NOW - timedelta(hours=1))
    with backend_for(server) as backend:
        backend.write_scores([moved])
    assert len(server.score_rows(first[0].id)) == 2


def test_older_servers_get_one_object_per_post_detected_once() -> None:
    with LangfuseStandIn(records=[trace("a"), trace("b")], score_contract="single") as srv:
        with backend_for(srv) as backend:
            one = backend.write_scores([layer_score("a"), layer_score("b")])
            two = backend.write_scores([layer_score("a", "generation")])
        posts = [r for r in srv.requests("/api/public/scores") if r.method == "POST"]
        assert one.failed == {} and len(one.confirmed) == 2
        assert two.failed == {} and two.confirmed == [layer_score("a").id]
        assert [r.status for r in posts] == [400, 200, 200, 200]
        assert isinstance(json.loads(posts[0].request_body), list)
        assert all(isinstance(json.loads(r.request_body), dict) for r in posts[1:])
        # such a server stamps the receive time, so the rewrite is a second row; the newest reads back
        assert len(srv.score_rows(layer_score("a").id)) == 2


def test_writes_readable_only_after_a_delay_are_confirmed_by_polling() -> None:
    with LangfuseStandIn(records=[trace("a")], read_delay=0.5) as srv:
        with backend_for(srv, confirm_wait_seconds=10.0) as backend:
            outcome = backend.write_scores([layer_score("a")])
        confirm_reads = [r for r in srv.requests("/v3/scores") if "id" in r.query]
    assert outcome.confirmed == [layer_score("a").id] and outcome.failed == {}
    assert len(confirm_reads) >= 2  # the first read-back did not see it yet


def test_scores_that_never_land_are_reported_not_confirmed(server: LangfuseStandIn) -> None:
    server.load([trace("a"), trace("b")])
    lost = layer_score("b")
    server.drop_score_ids.add(lost.id)  # the worker's validation drops it silently after the 202
    with backend_for(server, confirm_wait_seconds=0.6) as backend:
        outcome = backend.write_scores([layer_score("a"), lost])
    assert outcome.confirmed == [layer_score("a").id]
    assert set(outcome.failed) == {lost.id}
    assert "not readable" in outcome.failed[lost.id]


def test_a_refused_write_is_a_failure_with_its_reason_not_an_exception(server: LangfuseStandIn) -> None:
    server.load([trace("a")])
    server.inject("status", status=413, path="/api/public/scores", method="POST")
    with backend_for(server) as backend:
        outcome = backend.write_scores([layer_score("a")])
    assert outcome.confirmed == [] and "413" in outcome.failed[layer_score("a").id]


def test_triaged_finds_existing_scores_with_one_read_per_hundred_traces(server: LangfuseStandIn) -> None:
    ids = [f"t{i:03d}" for i in range(250)]
    server.load([trace(t) for t in ids])
    with backend_for(server) as backend:
        backend.write_scores([layer_score(t) for t in ids[:120]])
        backend.write_scores([layer_score(t, rule="0") for t in ids[200:]])  # an older rule version
        server.reset_log()
        assert backend.triaged(ids, "triage_layer", "1") == set(ids[:120])
    reads = server.requests("/v3/scores")
    assert len(reads) == 3 and all(len(r.query["id"][0].split(",")) <= 100 for r in reads)


def test_trace_url_uses_the_project_id_fetched_once(server: LangfuseStandIn) -> None:
    with backend_for(server) as backend:
        urls = [backend.trace_url("t1"), backend.trace_url("t2")]
    assert urls == [
        f"{server.url}/project/proj-standin/traces/t1",
        f"{server.url}/project/proj-standin/traces/t2",
    ]
    assert len(server.requests("/api/public/projects")) == 1


# --------------------------------------------------------------------------- faults


def test_429_honours_retry_after_and_every_request_is_counted() -> None:
    with LangfuseStandIn(
        records=[trace(f"t{i}") for i in range(30)], rate_limit_every=2, retry_after=0.05
    ) as srv:
        with backend_for(srv) as backend:
            votes = backend.votes("user_feedback", *WINDOW).votes
            found = backend.observations([v.trace_id for v in votes if v.trace_id])
            outcome = backend.write_scores([layer_score(f"t{i}") for i in range(30)])
            count = backend.stats.requests
        statuses = [r.status for r in srv.log]
    assert len(votes) == 30 and len(found) == 30 and len(outcome.confirmed) == 30
    assert statuses.count(429) >= 3
    assert count == len(statuses)  # retries included


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "status", "status": 500, "count": 2},
        {"kind": "status", "status": 503},
        {"kind": "drop", "count": 2},
        {"kind": "slow", "seconds": 1.5},
        {"kind": "429", "seconds": 0.1},
    ],
    ids=["500", "503", "dropped-connection", "timeout", "429-scripted"],
)
def test_transient_faults_are_retried(server: LangfuseStandIn, fault: dict[str, Any]) -> None:
    server.load([trace("a"), trace("b")])
    with backend_for(server, timeout=0.5) as backend:
        for path in ("/v3/scores", "/v2/observations", "/api/public/scores"):
            server.inject(path=path, **fault)
        votes = backend.votes("user_feedback", *WINDOW).votes
        found = backend.observations(["a", "b"])
        outcome = backend.write_scores([layer_score("a"), layer_score("b")])
    assert {v.trace_id for v in votes} == {"a", "b"}
    assert len(found["a"]) == 4 and len(found["b"]) == 4
    assert outcome.failed == {} and len(outcome.confirmed) == 2


def test_a_server_restart_mid_run_is_survived_and_state_is_kept(server: LangfuseStandIn) -> None:
    server.load([trace(f"t{i}") for i in range(5)])
    with backend_for(server) as backend:
        first = backend.write_scores([layer_score("t0")])
        server.schedule_restart(at_request=1, down_seconds=0.3)
        votes = backend.votes("user_feedback", *WINDOW).votes  # its first request hits the restart
        rest = backend.write_scores([layer_score(f"t{i}") for i in range(1, 5)])
        assert backend.triaged([f"t{i}" for i in range(5)], "triage_layer", "1") == {
            f"t{i}" for i in range(5)
        }
    assert len(first.confirmed) == 1 and len(votes) == 5 and len(rest.confirmed) == 4
    assert [r.status for r in server.log].count(0) == 1  # the dropped request


def test_a_fault_that_outlasts_the_deadline_is_a_langfuse_error(server: LangfuseStandIn) -> None:
    server.inject("status", status=502, count=10_000)
    with backend_for(server, deadline_seconds=0.5) as backend, pytest.raises(LangfuseError, match="502"):
        backend.votes("user_feedback", *WINDOW)


def test_a_client_error_is_not_retried(server: LangfuseStandIn) -> None:
    server.inject("status", status=400, path="/v3/scores")
    with backend_for(server) as backend, pytest.raises(LangfuseError, match="400"):
        backend.votes("user_feedback", *WINDOW)
    assert len(server.requests("/v3/scores")) == 1


def test_refused_credentials_are_a_config_error_naming_the_variables(server: LangfuseStandIn) -> None:
    # refused on opening (the project read for links), before any data is read
    with pytest.raises(ConfigError) as info, backend_for(server, secret_key="sk-lf-WRONG-VALUE") as backend:
        backend.votes("user_feedback", *WINDOW)
    message = str(info.value)
    assert "LANGFUSE_PUBLIC_KEY" in message and "LANGFUSE_SECRET_KEY" in message
    assert "sk-lf-WRONG-VALUE" not in message
    assert len(server.log) == 1  # a 401 is not retried
    with pytest.raises(ConfigError), backend_for(server, secret_key="nope") as backend:
        backend.write_scores([layer_score("a")])


def test_an_injected_client_is_used_and_left_open(server: LangfuseStandIn) -> None:
    server.load([trace("a")])
    client = httpx.Client(timeout=5.0)
    with backend_for(server, httpx_client=client) as backend:
        assert len(backend.votes("user_feedback", *WINDOW).votes) == 1
        # the project read on opening, the window read and the thumbs-down re-read
        assert backend.stats.requests == 3
    assert not client.is_closed
    client.close()
