"""Batch mode: `triage.judges.model.batch` through the real `openai` client against a local stand-in of
the Batch API (`tests.doubles.batch_server`, 127.0.0.1), polling in virtual time; and the night in
batch mode, `triage feedback --batch`, end to end (the last section)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from openai.types.chat import ChatCompletion

from tests.doubles.batch_server import BatchServer, Faults, RawBody, RawLine
from tests.doubles.clock import VirtualClock
from tests.doubles.openai_server import Reply, keyword_responder
from triage.app import DEMO_DIR, demo_shift
from triage.cli import cli
from triage.domain.records import PRICES, Cost, Price, Tokens, cost, price_of
from triage.errors import JudgeError
from triage.judges.model.batch import (
    Answered,
    BatchOutcome,
    BatchRunError,
    BatchRunner,
    BatchUnsupported,
)
from triage.judges.model.rounds import BatchCollector
from triage.retry import Budget, RetryPolicy, use_clock
from triage.sources.store import Store

MODEL = "gpt-4o-mini"


def body(text: str, *, model: str = MODEL) -> dict[str, Any]:
    """A chat-completion request as the judge sends it."""
    return {
        "model": model,
        "temperature": 0,
        "messages": [{"role": "system", "content": "JUDGE"}, {"role": "user", "content": text}],
        "response_format": {"type": "json_object"},
    }


def echo(request: dict[str, Any]) -> Reply | RawBody | RawLine | dict[str, Any] | str:
    """The judge stand-in: a verdict naming the question it was asked."""
    return {"verdict": "contains_answer", "asked": request["messages"][-1]["content"]}


def requests(n: int, prefix: str = "t") -> dict[str, dict[str, Any]]:
    return {f"{prefix}{i}:containment": body(f"question {i}") for i in range(n)}


def asked(outcome: BatchOutcome, cid: str) -> str:
    content = outcome.answered[cid].completion.choices[0].message.content
    assert content is not None
    return str(json.loads(content)["asked"])


def settled_once(outcome: BatchOutcome, ids: list[str]) -> None:
    """Every custom_id exactly once: answered or left, never both, none lost, none invented."""
    assert not set(outcome.answered) & set(outcome.left)
    assert sorted([*outcome.answered, *outcome.left]) == sorted(ids)
    assert outcome.order == ids


class HookClock(VirtualClock):
    """Virtual time that runs `hooks[n]` before its n-th sleep (a restart, a SIGTERM)."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: dict[int, Callable[[], None]] = {}

    def sleep(self, seconds: float) -> None:
        hook = self.hooks.pop(len(self.sleeps), None)
        if hook is not None:
            hook()
        super().sleep(seconds)


@pytest.fixture
def clock() -> Iterator[HookClock]:
    hooked = HookClock()
    with use_clock(hooked):
        yield hooked


@asynccontextmanager
async def serving(
    clock: VirtualClock, responder: Callable[[dict[str, Any]], Any] | None = echo, **options: Any
) -> AsyncIterator[tuple[BatchServer, openai.AsyncOpenAI]]:
    with BatchServer(responder=responder, clock=clock.monotonic, **options) as server:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test-key") as client:
            yield server, client


def runner(client: openai.AsyncOpenAI, **options: Any) -> BatchRunner:
    return BatchRunner(client, retry=RetryPolicy(attempts=3, initial=1.0, maximum=5.0), **options)


# --- the happy path ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_full_batch_is_answered_in_virtual_time(clock: HookClock) -> None:
    asks = requests(6)
    started = time.monotonic()
    async with serving(clock, polls_to_complete=3) as (server, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))

        settled_once(outcome, list(asks))
        assert not outcome.left
        assert all(asked(outcome, f"t{i}:containment") == f"question {i}" for i in range(6))
        # the contract: one upload with purpose batch, one batch, its JSONL as the judge's bodies
        assert server.count("upload") == 1 and len(server.batches) == 1
        (batch,) = server.batches.values()
        uploaded = server.files[batch.input_file_id]
        assert uploaded.purpose == "batch" and uploaded.filename.endswith(".jsonl")
        lines = [json.loads(row) for row in uploaded.data.decode().splitlines()]
        assert [line["custom_id"] for line in lines] == list(asks)
        assert {(line["method"], line["url"]) for line in lines} == {("POST", "/v1/chat/completions")}
        assert [line["body"] for line in lines] == list(asks.values())
        assert batch.completion_window == "24h" and batch.status == "completed"
        assert outcome.batches[0].status == "completed" and outcome.batches[0].counts == (6, 6, 0)
    # polling waited in virtual time: growing intervals, no real sleep beyond milliseconds
    assert clock.sleeps[:3] == [10.0, 15.0, 22.5]
    assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_the_cascade_runs_as_two_rounds(clock: HookClock) -> None:
    """Round 1: every trace's first call; round 2: the second call, only where round 1 asks for it."""
    traces = [f"t{i}" for i in range(4)]
    async with serving(clock) as (server, client):
        batches = runner(client)
        deadline = clock.now() + timedelta(hours=2)
        first = await batches.run({f"{t}:containment": body(f"q {t}") for t in traces}, deadline=deadline)
        needs_second = [t for t in traces if asked(first, f"{t}:containment") in ("q t1", "q t3")]
        second = await batches.run(
            {f"{t}:grounding": body(f"ground {t}") for t in needs_second}, deadline=deadline
        )
        assert server.count("list") == 1  # the probe is asked once per runner
        assert server.count("upload") == server.count("create") == 2
    assert len(first.answered) == 4 and sorted(second.answered) == ["t1:grounding", "t3:grounding"]


# --- partial failure, expiry, the deadline --------------------------------------------------------


@pytest.mark.anyio
async def test_failed_lines_are_left_with_their_reason(clock: HookClock) -> None:
    asks = requests(6)
    faults = Faults(fail={"t1:containment": 500, "t2:containment": 400, "t3:containment": "request_timeout"})
    async with serving(clock, faults=faults) as (server, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))

    settled_once(outcome, list(asks))
    assert sorted(outcome.answered) == ["t0:containment", "t4:containment", "t5:containment"]
    assert outcome.left_ids() == ["t1:containment", "t2:containment", "t3:containment"]
    server_error, bad_request, timeout = (outcome.left[c] for c in outcome.left_ids())
    assert (server_error.kind, server_error.status_code, server_error.retryable) == ("failed", 500, True)
    assert "HTTP 500" in server_error.reason
    assert (bad_request.kind, bad_request.status_code, bad_request.retryable) == ("failed", 400, False)
    assert (timeout.kind, timeout.retryable) == ("failed", True) and "request_timeout" in timeout.reason
    assert outcome.batches[0].counts == (6, 3, 3)


@pytest.mark.anyio
async def test_at_the_deadline_the_batch_is_cancelled_and_the_rest_sent_directly(clock: HookClock) -> None:
    """The batch would take an hour; the deadline is in 10 minutes. Cancel at the deadline, keep what
    ran, send what is left directly: every request ends answered exactly once."""
    asks = requests(12)
    started = time.monotonic()
    async with serving(clock, seconds_to_complete=3600) as (server, client):
        start = clock.monotonic()
        outcome = await runner(client, cancel_grace=60).run(
            asks, deadline=clock.now() + timedelta(minutes=10)
        )

        # polling stopped at the deadline exactly; then one cancel, one status (cancelled), the files
        batch_id = outcome.batches[0].id
        stored = server.batches[batch_id]
        assert stored.times["cancelling"] - stored.created_at == 600
        cancel_at = server.log.index(("POST", f"/v1/batches/{batch_id}/cancel"))
        after = server.log[cancel_at + 1 :]
        assert after[0] == ("GET", f"/v1/batches/{batch_id}")
        assert after[1:] and all(path.endswith("/content") for _, path in after[1:])
        assert server.count("cancel") == 1
        assert 600 <= clock.monotonic() - start <= 600 + 60
        settled_once(outcome, list(asks))
        assert outcome.batches[0].status == "cancelled" and outcome.batches[0].cancelled_by_us
        assert 0 < len(outcome.answered) < 12
        assert {left.kind for left in outcome.left.values()} == {"deadline"}

        # the caller's fallback: the left ones, directly
        direct = {}
        for cid in outcome.left_ids():
            completion = await client.chat.completions.create(**asks[cid])
            direct[cid] = json.loads(completion.choices[0].message.content or "")["asked"]
        assert server.count("chat") == len(outcome.left)
    answers = {cid: asked(outcome, cid) for cid in outcome.answered} | direct
    assert answers == {f"t{i}:containment": f"question {i}" for i in range(12)}
    assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_an_expired_batch_still_returns_what_finished(clock: HookClock) -> None:
    asks = requests(8)
    async with serving(clock, polls_to_complete=4, faults=Faults(expire_after_polls=2)) as (server, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))
    settled_once(outcome, list(asks))
    assert outcome.batches[0].status == "expired" and not outcome.batches[0].cancelled_by_us
    assert len(outcome.answered) == 4
    assert {left.kind for left in outcome.left.values()} == {"expired"}
    assert all("batch_expired" in left.reason for left in outcome.left.values())
    assert server.count("cancel") == 0


@pytest.mark.anyio
async def test_sigterm_stops_polling_and_cancels(clock: HookClock) -> None:
    asks = requests(3)
    budget = Budget(clock=clock)
    clock.hooks[2] = budget.cancel
    async with serving(clock, seconds_to_complete=3600) as (server, client):
        batches = BatchRunner(client, retry=RetryPolicy(budget=budget))
        outcome = await batches.run(asks, deadline=clock.now() + timedelta(hours=2))
    assert server.count("cancel") == 1 and server.count("content") == 0
    assert clock.monotonic() < 100  # no waiting for the cancel to finish either: the run is ending
    settled_once(outcome, list(asks))
    assert {left.kind for left in outcome.left.values()} == {"deadline"}


# --- servers without the Batch API ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("status", [404, 405, 501])
async def test_a_server_without_the_batch_api_is_detected_before_anything_is_sent(
    clock: HookClock, status: int
) -> None:
    async with serving(clock, faults=Faults(unsupported=status)) as (server, client):
        with pytest.raises(BatchUnsupported, match="no Batch API") as raised:
            await runner(client).run(requests(3), deadline=clock.now() + timedelta(hours=1))
        assert server.count("upload") == 0 and server.count("create") == 0
        # the same server still answers directly: the caller's fallback for all
        completion = await client.chat.completions.create(**body("direct"))
        assert "direct" in (completion.choices[0].message.content or "")
    assert isinstance(raised.value, BatchRunError) and isinstance(raised.value, JudgeError)


@pytest.mark.anyio
async def test_a_web_page_where_the_batch_list_should_be_is_no_batch_api(clock: HookClock) -> None:
    async with serving(clock, faults=Faults(garbage={"list": 1})) as (server, client):
        with pytest.raises(BatchUnsupported, match="not JSON"):
            await runner(client).run(requests(2), deadline=clock.now() + timedelta(hours=1))
        assert server.count("upload") == 0


# --- splitting, limits, a rejected file ----------------------------------------------------------


@pytest.mark.anyio
async def test_requests_over_the_limit_are_split_over_several_batches(clock: HookClock) -> None:
    asks = requests(7)
    async with serving(clock, max_requests=3) as (server, client):
        outcome = await runner(client, max_requests=3).run(asks, deadline=clock.now() + timedelta(hours=1))
    settled_once(outcome, list(asks))
    assert len(outcome.answered) == 7
    assert [record.requests for record in outcome.batches] == [3, 3, 1]
    assert len(server.batches) == 3 and server.count("upload") == 3


@pytest.mark.anyio
async def test_the_byte_limit_splits_too_and_a_request_over_it_alone_is_left(clock: HookClock) -> None:
    asks = requests(4) | {"huge:grounding": body("x" * 5000)}
    async with serving(clock) as (server, client):
        outcome = await runner(client, max_bytes=700).run(asks, deadline=clock.now() + timedelta(hours=1))
    settled_once(outcome, list(asks))
    assert len(outcome.answered) == 4 and len(server.batches) >= 2
    assert all(len(f.data) <= 700 for f in server.files.values() if f.purpose == "batch")
    assert outcome.left["huge:grounding"].kind == "not_submitted"


@pytest.mark.anyio
async def test_a_file_the_server_rejects_leaves_every_request_with_the_reason(clock: HookClock) -> None:
    asks = requests(5)
    async with serving(clock, max_requests=4) as (_, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))
    settled_once(outcome, list(asks))
    assert outcome.batches[0].status == "failed"
    assert {left.kind for left in outcome.left.values()} == {"rejected"}
    assert "too_many_requests" in outcome.left["t0:containment"].reason


@pytest.mark.anyio
async def test_the_stand_in_checks_input_lines_as_openai_does(clock: HookClock) -> None:
    rows = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body("1")},
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body("2")},
        {"custom_id": "b", "method": "GET", "url": "/v1/chat/completions", "body": body("3")},
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings", "body": body("4")},
    ]
    data = ("\n".join(json.dumps(r) for r in rows) + "\nnot json\n").encode()
    async with serving(clock) as (server, client):
        uploaded = await client.files.create(file=("bad.jsonl", data, "application/jsonl"), purpose="batch")
        created = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert created.status == "validating"
        failed = await client.batches.retrieve(created.id)
        with pytest.raises(openai.BadRequestError):
            await client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
            )
        assert server.count("create") == 2
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    codes = {(e.line, e.code) for e in failed.errors.data}
    assert codes == {
        (2, "duplicate_custom_id"),
        (3, "invalid_method"),
        (4, "mismatched_url"),
        (5, "invalid_json_line"),
    }
    assert failed.output_file_id is None


# --- garbage, restarts, transient failures -------------------------------------------------------


@pytest.mark.anyio
async def test_garbage_answers_are_reasons_never_crashes(clock: HookClock) -> None:
    def responder(request: dict[str, Any]) -> Any:
        text = request["messages"][-1]["content"]
        if text == "question 1":
            return RawBody({"not": "a chat completion"})
        if text == "question 2":
            return RawLine('{"custom_id": "t2:containment", "respo')
        if text == "question 3":
            return RawBody("<html>")
        return echo(request)

    asks = requests(5)
    async with serving(clock, responder, faults=Faults(garbage={"status": 2})) as (_, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))
    settled_once(outcome, list(asks))
    assert sorted(outcome.answered) == ["t0:containment", "t4:containment"]
    assert outcome.left["t1:containment"].kind == "unreadable"
    assert "not a chat completion" in outcome.left["t1:containment"].reason
    assert outcome.left["t2:containment"].kind == "missing" and outcome.stray_lines == 1
    assert outcome.left["t3:containment"].kind == "unreadable"


@pytest.mark.anyio
async def test_garbage_where_the_created_batch_should_be_is_a_clear_error(clock: HookClock) -> None:
    async with serving(clock, faults=Faults(garbage={"create": 1})) as (_, client):
        with pytest.raises(BatchRunError, match="the created batch is not JSON") as raised:
            await runner(client).run(requests(2), deadline=clock.now() + timedelta(hours=1))
    assert not isinstance(raised.value, BatchUnsupported)


@pytest.mark.anyio
async def test_a_status_that_stays_garbage_ends_at_the_deadline_with_its_reason(clock: HookClock) -> None:
    asks = requests(2)
    async with serving(clock, faults=Faults(garbage={"status": 10_000, "cancel": 10_000})) as (_, client):
        outcome = await runner(client, cancel_grace=30).run(asks, deadline=clock.now() + timedelta(minutes=5))
    settled_once(outcome, list(asks))
    left = outcome.left["t0:containment"]
    assert left.kind == "deadline" and "not JSON" in left.reason


@pytest.mark.anyio
@pytest.mark.parametrize("keep_state", [True, False])
async def test_a_server_restart_between_create_and_retrieve(clock: HookClock, keep_state: bool) -> None:
    """Down after the create (connections refused), back one back-off later, with or without its
    state (the stand-in can do both; OpenAI's batches outlive a restart)."""
    asks = requests(4)
    async with serving(clock) as (server, client):
        clock.hooks[0] = server.stop  # before the first poll
        clock.hooks[1] = lambda: server.come_back(keep_state=keep_state)  # during the retry's back-off
        batches = runner(client)
        outcome = await batches.run(asks, deadline=clock.now() + timedelta(hours=1))
        assert server.restarts == 1
        assert batches.requests == len(server.log) + 1  # one status request found the port closed
    settled_once(outcome, list(asks))
    if keep_state:
        assert len(outcome.answered) == 4
    else:
        assert {left.kind for left in outcome.left.values()} == {"lost"}
        assert "no longer knows" in outcome.left["t0:containment"].reason


@pytest.mark.anyio
async def test_transient_failures_are_retried_and_a_lost_create_is_not_repeated(clock: HookClock) -> None:
    asks = requests(3)
    faults = Faults(transient={"upload": 2, "status": 1, "content": 1}, lose_answers={"create": 1})
    async with serving(clock, faults=faults) as (server, client):
        outcome = await runner(client).run(asks, deadline=clock.now() + timedelta(hours=1))
        assert len(server.batches) == 1  # the retried create found the batch the lost answer made
    assert len(outcome.answered) == 3 and not outcome.left


@pytest.mark.anyio
async def test_requests_no_batch_accepts_are_refused_up_front(clock: HookClock) -> None:
    async with serving(clock) as (server, client):
        batches = runner(client)
        with pytest.raises(ValueError, match="model"):
            await batches.run({"a": {"messages": []}}, deadline=clock.now() + timedelta(hours=1))
        with pytest.raises(ValueError, match="stream"):
            await batches.run({"a": body("x") | {"stream": True}}, deadline=clock.now() + timedelta(hours=1))
        with pytest.raises(ValueError, match="timezone"):
            await batches.run(requests(1), deadline=clock.now().replace(tzinfo=None))
        assert (await batches.run({}, deadline=clock.now())).order == []
        assert not server.log


# --- what it costs ----------------------------------------------------------------------------------


def test_the_cost_of_a_night_matches_the_notes() -> None:
    """../shared/notes/cost.md, "A night, costed": 8k input (1.5k a cached prefix) and 0.6k output a
    trace at $3 / $15 per M: direct $0.033, batch $0.0165, batch with the cached prefix ~$0.0145; a
    small model at $0.15 / $0.60 in batch ~$0.0008."""
    trace = Tokens(prompt=8000, cached_prompt=1500, completion=600)
    large = cost("claude-sonnet-4-5", trace)
    assert large is not None
    assert large.direct == pytest.approx(0.033)
    assert large.batch == pytest.approx(0.0165)
    assert large.batch_cached == pytest.approx(0.0145, abs=5e-5)
    assert large.direct_cached == pytest.approx(2 * large.batch_cached)
    small = cost("gpt-4o-mini", trace)
    assert small is not None and small.batch == pytest.approx(0.0008, abs=5e-5)
    assert cost("some-local-model", trace) is None
    assert price_of("openai/gpt-4o-mini-2024-07-18") == PRICES["gpt-4o-mini"]
    priced = cost("x", trace, {"x": Price(input=1, output=2, cached_input=0.5)})
    assert isinstance(priced, Cost)
    assert [priced.direct, priced.batch, priced.direct_cached, priced.batch_cached] == pytest.approx(
        [0.0092, 0.0046, 0.00845, 0.004225]
    )
    assert cost("gpt-4o-mini", Tokens(prompt=10, cached_prompt=99)) == cost(
        "gpt-4o-mini", Tokens(prompt=10, cached_prompt=10)
    )


@pytest.mark.anyio
async def test_the_outcome_counts_cached_tokens_for_the_cost(clock: HookClock) -> None:
    async with serving(clock, cached_prompt_tokens=60) as (_, client):
        outcome = await runner(client).run(requests(3), deadline=clock.now() + timedelta(hours=1))
    tokens = outcome.tokens()
    assert tokens == Tokens(prompt=300, cached_prompt=180, completion=60)
    priced = cost(MODEL, tokens)
    assert priced is not None and priced.batch_cached < priced.batch < priced.direct


# --- batch mode for the night: `triage feedback --batch` end to end -----------------------------------
#
# The real command (`triage.cli`), the demo's 29 thumbs-down in an embedded store, the judge's model
# behind the Batch API stand-in over HTTP, polling in virtual time. The responder records the nonce
# of every request it answers: each judge call has its own, so a call answered twice (in a batch and
# again directly) shows as a nonce seen twice, and a call lost shows as a missing verdict.

SECRET = "sk-test-batch-0123456789"
_NONCE = re.compile(r'Data for review \(JSON inside blocks with nonce="([0-9a-f]+)"\)')


class Recording:
    """`keyword_responder`, counting each call it answers by its nonce."""

    def __init__(self) -> None:
        self.answered: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        user = next(m["content"] for m in request["messages"] if m["role"] == "user")
        found = _NONCE.match(user)
        assert found, "every judge call names its nonce first"
        with self._lock:
            self.answered[found.group(1)] += 1
        return keyword_responder(request)


def fresh_store(folder: Path) -> Path:
    path = folder / "store.sqlite"
    traces = DEMO_DIR / "traces.jsonl"
    with Store(path) as store:
        store.import_file(traces, shift=demo_shift(traces, datetime.now(UTC)))
    return path


@pytest.fixture
def demo_store(tmp_path: Path) -> Path:
    return fresh_store(tmp_path)


@dataclass
class Night:
    exit_code: int
    stderr: str
    summary: dict[str, Any]
    server: BatchServer
    answered: Counter[str]

    def custom_ids(self) -> list[list[str]]:
        """Each batch's custom_ids, in the order the batches were made."""
        return [[line["custom_id"] for line in batch.requests] for batch in self.server.batches.values()]


def night(
    store: Path, tmp_path: Path, judge: str, *, env: dict[str, str] | None = None, **server_options: Any
) -> Night:
    """`triage feedback --write --batch --judge JUDGE` against a batch stand-in, in virtual time."""
    recording = Recording()
    summary_file = tmp_path / f"summary-{judge}.json"
    virtual = VirtualClock(datetime.now(UTC))
    with (
        use_clock(virtual),
        BatchServer(responder=recording, clock=virtual.monotonic, **server_options) as server,
    ):
        settings = {
            "TRIAGE_STORE": str(store),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": SECRET,
            "TRIAGE_JUDGE_MODEL": MODEL,
            **(env or {}),
        }
        args = ["feedback", "--write", "--batch", "--judge", judge, "--summary-file", str(summary_file)]
        result = CliRunner().invoke(cli, args, env=settings, catch_exceptions=False)
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return Night(result.exit_code, result.stderr, summary, server, recording.answered)


def once_each(run: Night, lost_on_the_way: int = 0) -> None:
    """All 29 triaged, each judge call answered exactly once (in a batch or directly), and the
    summary's calls are those answers. `lost_on_the_way`: calls a batch ran whose answer never came
    back (no line in either file): the stand-in ran those twice, the second time directly."""
    assert run.exit_code == 0, run.stderr[-3000:]
    assert (run.summary["triaged"], run.summary["not_triaged"]) == (29, {})
    assert run.answered and max(run.answered.values()) <= 2
    assert sum(n - 1 for n in run.answered.values()) == lost_on_the_way, "a call answered twice"
    assert run.summary["judge_calls"] == len(run.answered)
    assert SECRET not in run.stderr


def test_batch_mode_judges_the_window_in_one_round(demo_store: Path, tmp_path: Path) -> None:
    run = night(demo_store, tmp_path, "llm")
    once_each(run)
    # every trace's two calls in one batch: the collector waited for every trace in flight
    (ids,) = run.custom_ids()
    assert len(ids) == run.summary["judge_calls"] == len(set(ids))
    searched = {cid.split(":")[0] for cid in ids}
    assert ids and all(
        f"{trace}:{call}" in ids for trace in searched for call in ("containment", "grounding")
    )
    assert run.server.count("chat") == 0  # nothing went directly
    assert run.summary["batch_calls"] == run.summary["judge_calls"]
    assert run.summary["cost_usd_billed"] == pytest.approx(run.summary["cost_usd"] / 2, abs=1e-6)
    calls = run.summary["judge_calls"]
    assert f"{calls} of {calls} calls in batches, at the batch price" in run.stderr
    assert "batch round 1:" in run.stderr and "batch round 2:" not in run.stderr


def test_the_cascade_s_second_call_is_a_second_round(demo_store: Path, tmp_path: Path) -> None:
    run = night(demo_store, tmp_path, "cascade")
    once_each(run)
    first, second = run.custom_ids()
    # round 2: grounding calls that waited for their trace's containment reply in round 1
    assert second and all(cid.endswith(":grounding") for cid in second)
    assert all(cid.replace(":grounding", ":containment") in first for cid in second)
    # round 1: the containment calls, and the grounding calls the cheap judge's facts asked for alone
    assert not set(first) & set(second)
    assert run.server.count("chat") == 0
    assert run.summary["judge_calls"] == len(first) + len(second) == run.summary["batch_calls"]


def sent(judge: str, tmp_path: Path) -> list[str]:
    """The custom_ids a clean night sends, in order (the faults below name some of them)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    return [cid for batch in night(fresh_store(probe), probe, judge).custom_ids() for cid in batch]


@pytest.mark.parametrize("judge", ["llm", "cascade"])
def test_a_partial_failure_goes_directly_with_nothing_lost_or_doubled(
    demo_store: Path, tmp_path: Path, judge: str
) -> None:
    ids = sent(judge, tmp_path)
    failing: dict[str, int | str] = {ids[0]: 500, ids[1]: "request_timeout", ids[2]: 400}
    run = night(demo_store, tmp_path, judge, faults=Faults(fail=failing, drop={ids[3]}))
    once_each(run, lost_on_the_way=1)
    # the three that failed and the one missing from both files went directly, once each
    assert run.server.count("chat") == 4
    assert run.summary["batch_calls"] == run.summary["judge_calls"] - 4
    assert "4 sent directly (failed 3, missing 1)" in run.stderr


@pytest.mark.parametrize("judge", ["llm", "cascade"])
def test_an_expired_batch_s_rest_goes_directly(demo_store: Path, tmp_path: Path, judge: str) -> None:
    # each batch runs a quarter of its requests a poll, and expires at the second poll
    run = night(demo_store, tmp_path, judge, faults=Faults(expire_after_polls=2), polls_to_complete=4)
    once_each(run)
    expired = run.summary["judge_calls"] - run.summary["batch_calls"]
    assert run.server.count("chat") == expired > 0 and run.summary["batch_calls"] > 0
    assert {b.status for b in run.server.batches.values()} == {"expired"}
    assert "expired" in run.stderr


def test_at_the_deadline_the_round_is_cancelled_and_its_calls_go_directly(
    demo_store: Path, tmp_path: Path
) -> None:
    # a batch that never finishes: polled until TRIAGE_BATCH_DEADLINE_SECONDS, then cancelled
    run = night(
        demo_store, tmp_path, "llm", env={"TRIAGE_BATCH_DEADLINE_SECONDS": "600"}, polls_to_complete=10**6
    )
    once_each(run)
    assert run.server.count("cancel") == 1 and run.summary["batch_calls"] == 0
    assert run.server.count("chat") == run.summary["judge_calls"]
    assert "deadline" in run.stderr


@pytest.mark.parametrize("status", [404, 501])
def test_a_server_without_the_batch_api_is_used_directly_and_said_once(
    demo_store: Path, tmp_path: Path, status: int
) -> None:
    run = night(demo_store, tmp_path, "cascade", faults=Faults(unsupported=status))
    once_each(run)
    # asked before anything was sent (a 5xx is retried first), never again: the rest went directly
    assert run.server.count("list") == (1 if status == 404 else 4) and run.server.count("upload") == 0
    assert run.server.count("chat") == run.summary["judge_calls"] and run.summary["batch_calls"] == 0
    assert run.stderr.count("no Batch API") == 1
    assert "calls in batches" not in run.stderr  # nothing billed at the batch price


def test_without_batch_the_night_makes_no_batch_request(demo_store: Path, tmp_path: Path) -> None:
    recording = Recording()
    with BatchServer(responder=recording) as server:
        env = {
            "TRIAGE_STORE": str(demo_store),
            "OPENAI_BASE_URL": f"{server.url}/v1",
            "OPENAI_API_KEY": SECRET,
            "TRIAGE_JUDGE_MODEL": MODEL,
        }
        result = CliRunner().invoke(
            cli, ["feedback", "--write", "--judge", "llm"], env=env, catch_exceptions=False
        )
        assert result.exit_code == 0, result.stderr[-2000:]
        assert set(server.routes) == {"chat"} and set(recording.answered.values()) == {1}


# --- the collector alone: when a round goes ------------------------------------------------------------


class ScriptedRunner:
    """A `BatchRunner` stand-in: records each round's custom_ids and answers them all (or raises)."""

    poll = RetryPolicy(initial=10.0)

    def __init__(self, fail: Exception | None = None) -> None:
        self.rounds: list[list[str]] = []
        self.fail = fail

    async def run(self, requests: dict[str, dict[str, Any]], *, deadline: datetime) -> BatchOutcome:
        self.rounds.append(list(requests))
        if self.fail is not None:
            raise self.fail
        outcome = BatchOutcome(order=list(requests))
        for cid in requests:
            completion = ChatCompletion.model_validate(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 0,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": cid},
                        }
                    ],
                }
            )
            outcome._settle(Answered(cid, completion, "batch_1"))
        return outcome


def collector(runner: ScriptedRunner, **options: Any) -> BatchCollector:
    gathered = BatchCollector(deadline=datetime.now(UTC) + timedelta(hours=1), settle=0.01, **options)
    gathered.attach(runner)  # type: ignore[arg-type]  # the scripted stand-in
    return gathered


async def _trace(gathered: BatchCollector, trace_id: str, works: float, calls: int = 1) -> list[str | None]:
    """A trace in flight: it works `works` seconds (a search), then asks `calls` calls in turn."""
    answers: list[str | None] = []
    with gathered.flying(trace_id):
        await asyncio.sleep(works)
        for n in range(calls):
            got = await gathered.ask(body(f"{trace_id} {n}"), trace_id=trace_id, call=f"call{n}")
            answers.append(got.choices[0].message.content if got is not None else None)
    return answers


@pytest.mark.anyio
async def test_a_round_waits_for_every_trace_in_flight() -> None:
    runner = ScriptedRunner()
    gathered = collector(runner)
    # one trace asks at once, one after a slow search, one asks twice in turn (the cascade's rounds)
    answers = await asyncio.gather(
        _trace(gathered, "fast", 0.0), _trace(gathered, "slow", 0.3), _trace(gathered, "twice", 0.0, calls=2)
    )
    assert runner.rounds == [["fast:call0", "twice:call0", "slow:call0"], ["twice:call1"]]
    assert answers == [["fast:call0"], ["slow:call0"], ["twice:call0", "twice:call1"]]
    assert [r.calls for r in gathered.rounds] == [3, 1]


@pytest.mark.anyio
async def test_a_trace_busy_past_the_quiet_interval_does_not_hold_the_round() -> None:
    runner = ScriptedRunner()
    gathered = collector(runner, quiet=0.1)
    await asyncio.gather(_trace(gathered, "fast", 0.0), _trace(gathered, "stuck", 0.5))
    assert runner.rounds == [["fast:call0"], ["stuck:call0"]]


@pytest.mark.anyio
async def test_no_batch_api_sends_the_round_and_the_rest_directly_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner = ScriptedRunner(fail=BatchUnsupported("the server has no Batch API (HTTP 404)"))
    gathered = collector(runner)
    first = await asyncio.gather(_trace(gathered, "a", 0.0), _trace(gathered, "b", 0.0))
    later = await _trace(gathered, "c", 0.0)
    assert first == [[None], [None]] and later == [None]  # None: send it directly
    assert len(runner.rounds) == 1  # asked once, never again
    assert [r.message for r in caplog.records].count(
        "the server has no Batch API (HTTP 404): the judge's calls go directly from now"
    ) == 1


@pytest.mark.anyio
async def test_near_the_deadline_every_call_goes_directly() -> None:
    runner = ScriptedRunner()
    gathered = BatchCollector(deadline=datetime.now(UTC) + timedelta(seconds=15))
    gathered.attach(runner)  # type: ignore[arg-type]
    assert await _trace(gathered, "late", 0.0) == [None] and runner.rounds == []
    assert gathered.direct == "the batch deadline is near"
