"""`triage check` fails closed and keeps what it found (issue 36): a run that could not check enough
exits 8, a case is compared with the newest run that decided it, a dataset with nothing readable is an
input error, a resume judges again what an outage left undecided; results are written as cases
finish (SIGTERM keeps them); a too-large result is clipped, a too-deep item is a bad item, new traces
are polled in batches, secrets never reach what the check writes, and two runs of one name never
double a Langfuse run item.

Each test fails on the code as issue 36 found it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.check.test_check import DATASET, NOW, TOOLS, FakeAgent, FakeJudge, fill, invoke, item, url
from tests.doubles.clock import VirtualClock
from tests.doubles.langfuse_server import LangfuseStandIn
from tests.sources.test_langfuse import backend_for
from triage.check import CheckOptions, TracePoller, read_cases, run_check
from triage.domain.checks import (
    CHECK_SCORE,
    STORED_RESULT_BYTES,
    AgentRun,
    CaseResult,
    CheckCase,
    CheckResult,
    ExpectationCheck,
    RunItemResult,
)
from triage.domain.records import Observation, UnreadableTrace
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode, InputError, JudgeError
from triage.sinks.report import check_json, render_check
from triage.sources.store import Store

RIGHT = AgentRun(answer="yes", sources=[url("a")])
WRONG = AgentRun(answer="no", sources=[url("elsewhere")])
DOWN = AgentRun(error="HTTP 500: scripted failure")


def cases(n: int, **kw: Any) -> dict[str, DatasetItem]:
    return {f"c{i}": item(f"c{i}", f"question {i}?", cite=url("a"), **kw) for i in range(n)}


class ScriptedJudge(FakeJudge):
    """FakeJudge, down (every case undecided) while `down` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
        if self.down:
            raise JudgeError("the model server is down")
        return await super().check(case, run)


def check(
    db: Store,
    items: dict[str, DatasetItem],
    answers: dict[str, AgentRun | Exception],
    run_name: str,
    judge: FakeJudge | None = None,
    **options: Any,
) -> CheckResult:
    opts = CheckOptions(dataset=DATASET, run_name=run_name, now=NOW, **options)
    agent = FakeAgent(answers)
    return asyncio.run(run_check(items, agent=agent, judge=judge or FakeJudge(), runs=db, options=opts, tools=TOOLS))


def store_with(items: dict[str, DatasetItem]) -> Store:
    db = Store(":memory:")
    db.ensure_dataset(DATASET, "", {})
    db.upsert_dataset_items(list(items.values()))
    return db


def by_question(items: dict[str, DatasetItem], answer: AgentRun | Exception) -> dict[str, AgentRun | Exception]:
    return {i.input["question"]: answer for i in items.values()}


# -- the gate fails closed -----------------------------------------------------------------------------


def test_every_case_an_agent_error_exits_8_even_with_no_previous_run() -> None:
    items = cases(3)
    with store_with(items) as db:
        result = check(db, items, by_question(items, DOWN), "r1")
    assert result.count("error") == 3 and result.exit_code == ExitCode.UNCHECKED


def test_every_case_undecided_exits_8() -> None:
    items = cases(3)
    judge = ScriptedJudge()
    judge.down = True
    with store_with(items) as db:
        result = check(db, items, by_question(items, RIGHT), "r1", judge)
    assert result.count("undecided") == 3 and result.exit_code == ExitCode.UNCHECKED


def test_a_case_that_passed_before_and_is_unchecked_now_exits_8_whatever_the_share() -> None:
    items = cases(20)
    with store_with(items) as db:
        assert check(db, items, by_question(items, RIGHT), "r1").exit_code == ExitCode.OK
        answers = by_question(items, RIGHT)
        answers["question 3?"] = DOWN  # 1 of 20: 5%, under the share
        result = check(db, items, answers, "r2", max_unchecked=0.5)
    assert [c.result.case.item_id for c in result.lost] == ["c3"]
    assert result.exit_code == ExitCode.UNCHECKED
    assert "passed before" in render_check(result)


def test_the_share_gate_and_its_precedence() -> None:
    items = cases(10)
    with store_with(items) as db:
        answers = by_question(items, RIGHT)
        answers["question 0?"] = DOWN  # 10%: not over 0.1
        assert check(db, items, answers, "r1").exit_code == ExitCode.OK
        answers["question 1?"] = DOWN  # 20%: over
        assert check(db, items, answers, "r2").exit_code == ExitCode.UNCHECKED
        answers = by_question(items, DOWN)
        answers["question 5?"] = WRONG  # a decided regression outranks every unchecked case: 7 over 8
        assert check(db, items, answers, "r3").exit_code == ExitCode.REGRESSED


def test_each_case_is_compared_with_the_newest_run_that_decided_it() -> None:
    """pass in r1, an agent error (r2 holds another case, so the run exists), fail in r3: a regression."""
    items = cases(2)
    judge = ScriptedJudge()
    with store_with(items) as db:
        assert check(db, items, by_question(items, RIGHT), "r1", judge).exit_code == ExitCode.OK
        judge.down = True  # r2: c0 undecided (written), c1 an agent error (not written)
        r2 = check(db, items, {"question 0?": RIGHT, "question 1?": DOWN}, "r2", judge, max_unchecked=1.0)
        assert r2.exit_code == ExitCode.UNCHECKED  # both passed in r1
        judge.down = False
        result = check(db, items, by_question(items, WRONG), "r3", judge)
    assert result.previous_run == "r2"
    assert {c.result.case.item_id: (c.status, c.previous, c.decided_in) for c in result.cases} == {
        "c0": ("newly_failing", "pass", "r1"),
        "c1": ("newly_failing", "pass", "r1"),
    }
    assert result.exit_code == ExitCode.REGRESSED


@pytest.mark.parametrize("kind", ["all bad", "none"])
def test_a_dataset_with_no_readable_case_is_an_input_error(kind: str) -> None:
    bad = item("c-bad", "q?", cite=url("a")).model_copy(update={"input": {"question": " "}})
    items = {"c-bad": bad} if kind == "all bad" else {}
    with store_with(items) as db, pytest.raises(InputError, match="no case|no active cases"):
        check(db, items, {}, "r1")


def test_a_resume_judges_again_what_an_outage_left_undecided_and_asks_the_errors_again() -> None:
    items = cases(3)
    judge = ScriptedJudge()
    judge.down = True
    with store_with(items) as db:
        answers = by_question(items, RIGHT)
        answers["question 2?"] = DOWN
        first = check(db, items, answers, "r1", judge)
        assert {c.result.outcome for c in first.cases} == {"undecided", "error"}
        judge.down = False
        answers["question 2?"] = RIGHT
        again = check(db, items, answers, "r1", judge)
        stored = db.dataset_run_results(db.dataset_runs(DATASET)[0])
        rows = db._db.execute("SELECT count(*) FROM dataset_run_items").fetchone()[0]
    assert {c.result.outcome for c in again.cases} == {"pass"} and not any(c.kept for c in again.cases)
    assert {k: r.outcome for k, r in stored.items()} == {"c0": "pass", "c1": "pass", "c2": "pass"}
    assert rows == 3 and again.exit_code == ExitCode.OK
    # a decided result is final: a third run under the name asks nothing and keeps the passes
    with store_with(items) as db2:
        check(db2, items, by_question(items, RIGHT), "r1")
        kept = check(db2, items, by_question(items, WRONG), "r1")
    assert all(c.kept and c.result.outcome == "pass" for c in kept.cases)


# -- durable: results written as the cases finish ---------------------------------------------------


class GatedAgent:
    """Answers every question at once, except `held`, which waits for `release`."""

    name = "gated"

    def __init__(self, held: str) -> None:
        self.held = held
        self.release = asyncio.Event()
        self.asked: list[str] = []

    async def aclose(self) -> None:
        return None

    async def ask(self, question: str) -> AgentRun:
        self.asked.append(question)
        if question == self.held:
            await self.release.wait()
        return RIGHT


def test_results_are_written_as_the_cases_finish_and_a_cancelled_run_keeps_them() -> None:
    items = cases(5)
    with store_with(items) as db:
        agent = GatedAgent(held="question 4?")
        options = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, concurrency=5, write_every=2)

        async def scenario() -> dict[str, RunItemResult]:
            task = asyncio.create_task(
                run_check(items, agent=agent, judge=FakeJudge(), runs=db, options=options, tools=TOOLS)
            )
            for _ in range(200):  # until the four free cases are written (two batches of two)
                await asyncio.sleep(0.01)
                if db.dataset_runs(DATASET) and len(db.dataset_run_results(db.dataset_runs(DATASET)[0])) == 4:
                    break
            written = db.dataset_run_results(db.dataset_runs(DATASET)[0]) if db.dataset_runs(DATASET) else {}
            task.cancel()  # the Pod killed: what was written stays
            with pytest.raises(asyncio.CancelledError):
                await task
            return written

        written = asyncio.run(scenario())
        assert sorted(written) == ["c0", "c1", "c2", "c3"]
        # the resume asks only the case that was in flight
        agent2 = GatedAgent(held="")
        result = asyncio.run(
            run_check(items, agent=agent2, judge=FakeJudge(), runs=db, options=options, tools=TOOLS)
        )
    assert agent2.asked == ["question 4?"] and result.exit_code == ExitCode.OK
    assert sum(c.kept for c in result.cases) == 4


SLOW_AGENT = """
import pathlib, sys, time
question = sys.stdin.read()
with open(sys.argv[1], "a") as log:
    log.write(question.strip() + "\\n")
time.sleep(0.3)
print("See %s." % sys.argv[2])
"""


@pytest.mark.slow
def test_sigterm_keeps_every_finished_case_and_the_resume_continues(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    fill(store, list(cases(12).values()))
    script, asked = tmp_path / "agent.py", tmp_path / "asked.log"
    script.write_text(SLOW_AGENT, encoding="utf-8")
    config = tmp_path / "triage.toml"
    command = json.dumps([sys.executable, str(script), str(asked), url("a")])
    config.write_text(f'[agent_endpoint]\nkind = "command"\ncommand = {command}\n', encoding="utf-8")
    env = {"PATH": os.environ["PATH"], "TRIAGE_STORE": str(store), "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "triage", "check", "--config", str(config), "--judge", "offline"]
    argv += ["--run-name", "r1", "--concurrency", "1"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while (not asked.exists() or len(asked.read_text().splitlines()) < 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.UNCHECKED, err  # the cases never asked are unchecked
    assert b"SIGTERM: finishing the cases in flight" in err
    assert b"stopped (SIGTERM) before this case was asked" in out
    finished = len(asked.read_text().splitlines())
    with sqlite3.connect(store) as db:
        kept = db.execute("SELECT count(*) FROM dataset_run_items").fetchone()[0]
    assert 4 <= kept == finished < 12  # every case the agent answered was written
    again = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert len(asked.read_text().splitlines()) == 12  # the resume asked only the rest
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT count(*), count(DISTINCT datasetItemId) FROM dataset_run_items").fetchone() == (
            12,
            12,
        )


# -- the data: too large, too deep, polled in batches, masked ----------------------------------------


def test_a_result_too_large_to_store_is_clipped_with_a_note() -> None:
    case = CheckCase.from_item(item("big", "q?", cite=url("a")))
    run = AgentRun(answer="x" * 1_600_000, sources=[url(f"p{i}") + "y" * 3000 for i in range(500)])
    checks = [ExpectationCheck(name="must_cite", passed=False, evidence="e" * 800_000)]
    stored = RunItemResult.of(CaseResult(case=case, run=run, outcome="fail", checks=checks, judge="j"), "t")
    size = len(json.dumps(stored.stored(), ensure_ascii=False).encode())
    assert size <= STORED_RESULT_BYTES and stored.outcome == "fail" and stored.checks[0].passed is False
    assert stored.clipped is not None and "the answer (1600000 characters)" in stored.clipped
    # a hundred checks of long evidence still fit
    many = [ExpectationCheck(name="must_cite", passed=True, evidence="e" * 1999) for _ in range(100)]
    result = CaseResult(case=case, run=AgentRun(answer="a"), outcome="pass", checks=many, judge="j")
    small = RunItemResult.of(result, "t")
    assert len(json.dumps(small.stored()).encode()) <= STORED_RESULT_BYTES and small.clipped


@pytest.mark.slow
def test_a_huge_result_is_written_to_langfuse_not_an_endless_exit_5(quick: VirtualClock) -> None:
    items = cases(1)
    # 1.6 MB of sources (the answer alone was already cut): over Langfuse's 1 MiB score body
    huge = AgentRun(answer="x" * 100_000, sources=[url("a"), *(url(f"p{i}") + "y" * 3000 for i in range(530))])
    with LangfuseStandIn() as server, backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        backend.upsert_dataset_items(list(items.values()))
        opts = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, trace_wait=0)
        result = asyncio.run(
            run_check(items, agent=FakeAgent({"question 0?": huge}), judge=FakeJudge(), runs=backend, options=opts,
                      tools=TOOLS)
        )  # fmt: skip
        assert result.not_written == {} and result.written == 1 and result.exit_code == ExitCode.OK
        read = backend.dataset_run_results(backend.dataset_runs(DATASET)[0])
    assert read["c0"].outcome == "pass" and read["c0"].clipped and "the answer" in read["c0"].clipped


@pytest.fixture
def quick(virtual_time: VirtualClock) -> VirtualClock:
    return virtual_time


def nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    return root


def test_an_item_nested_3000_levels_is_that_items_bad_item() -> None:
    items = cases(2)
    deep = items["c1"].model_copy(update={"metadata": {"layer": "retrieval", "owners": [nested(3000)]}})
    found, bad = read_cases({"c0": items["c0"], "c1": deep})
    assert [c.item_id for c in found] == ["c0"]
    assert [(b.item_id, b.reason) for b in bad] == [("c1", "item c1: it is nested too deep to read")]
    with store_with(items) as db:
        result = check(db, {"c0": items["c0"], "c1": deep}, by_question(items, RIGHT), "r1")
    assert result.exit_code == ExitCode.OK and len(result.bad_items) == 1


class CountingTraces:
    """A TraceSource whose traces become readable on the `ready_on`-th call."""

    def __init__(self, ready_on: int) -> None:
        self.calls: list[list[str]] = []
        self.ready_on = ready_on

    def observations(self, trace_ids: Sequence[str]) -> dict[str, list[Observation] | UnreadableTrace]:
        self.calls.append(list(trace_ids))
        ready: list[Observation] = ["row"]  # type: ignore[list-item]  # the poller only hands rows on
        return {} if len(self.calls) < self.ready_on else {t: ready for t in trace_ids}

    def trace_url(self, trace_id: str) -> str | None:
        return None


def test_new_traces_are_polled_in_batches_one_call_per_poll(quick: VirtualClock) -> None:
    traces = CountingTraces(ready_on=10**6)  # never readable: each case waits out trace_wait
    items = cases(8)
    answers: dict[str, AgentRun | Exception] = {
        f"question {i}?": AgentRun(answer="yes", sources=[url("a")], trace_id=f"t{i}") for i in range(8)
    }
    with store_with(items) as db:
        opts = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, trace_wait=30, concurrency=8)
        result = asyncio.run(
            run_check(items, agent=FakeAgent(answers), judge=FakeJudge(), runs=db, options=opts, tools=TOOLS,
                      traces=traces)  # type: ignore[arg-type]
        )  # fmt: skip
    assert result.passed == 8
    # 1, 2, 4, 8, 10 s ... within 30 s: a handful of polls, each for every trace still awaited
    assert len(traces.calls) <= 6, traces.calls
    assert sorted(traces.calls[0]) == [f"t{i}" for i in range(8)]


def test_the_poller_asks_once_for_every_pending_trace(quick: VirtualClock) -> None:
    traces = CountingTraces(ready_on=3)

    async def scenario() -> list[list[Observation] | None]:
        poller = TracePoller(traces, wait=60)  # type: ignore[arg-type]
        return list(await asyncio.gather(*(poller.rows(f"t{i}") for i in range(20))))

    asyncio.run(scenario())
    assert len(traces.calls) == 3 and all(len(c) == 20 for c in traces.calls)


SECRET = "hunter2-plain-secret-value"  # no credential pattern: only the settings' list masks it
KEY = "sk-proj-abcdefghijklmnop1234"


def test_secrets_are_masked_in_every_output_the_check_writes() -> None:
    items = cases(2)
    leak = f"My env: OPENAI_API_KEY={KEY} LANGFUSE_SECRET_KEY={SECRET}"
    answers: dict[str, AgentRun | Exception] = {
        "question 0?": AgentRun(answer=leak, sources=[url("a"), f"{url('a')}?k={SECRET}"]),
        "question 1?": AgentRun(error=f"HTTP 500: {leak}"),
    }
    with store_with(items) as db:
        result = check(db, items, answers, "r1", secrets=(SECRET, KEY), max_unchecked=1.0)
        rows = db._db.execute("SELECT result FROM dataset_run_items").fetchall()
    written = json.dumps([r[0] for r in rows]) + check_json(result) + render_check(result)
    assert SECRET not in written and KEY not in written
    assert "***" in json.dumps([r[0] for r in rows]) and "***" in check_json(result)


ECHO_AGENT = """
import sys
sys.stdin.read()
print("See %s. My key is " + sys.argv[1])
"""


@pytest.mark.slow
def test_the_settings_secrets_reach_the_check_and_are_masked_in_output_and_store(tmp_path: Path) -> None:
    """The CLI hands the settings' secret list down (the core reads no environment)."""
    store = tmp_path / "store.sqlite"
    fill(store, [item("c0", "question 0?", cite=url("a"))])
    script = tmp_path / "agent.py"
    script.write_text(ECHO_AGENT % url("a"), encoding="utf-8")
    out = tmp_path / "out.json"
    line = f"{sys.executable} {script} {SECRET}"
    run = invoke("--agent-command", line, "--judge", "offline", "--output", str(out),
                 env={"OPENAI_API_KEY": SECRET, "TRIAGE_STORE": str(store)})  # fmt: skip
    assert run.exit_code == 0, run.output
    with sqlite3.connect(store) as db:
        rows = json.dumps(db.execute("SELECT result FROM dataset_run_items").fetchall())
    written = out.read_text(encoding="utf-8")
    assert SECRET not in written + rows + run.stdout and "My key is ***" in written and "***" in rows


@pytest.mark.slow
def test_secrets_are_masked_in_langfuse_score_metadata(quick: VirtualClock) -> None:
    items = cases(1)
    leak = AgentRun(answer=f"key {SECRET}", sources=[url("a")])
    with LangfuseStandIn() as server, backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        backend.upsert_dataset_items(list(items.values()))
        opts = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, trace_wait=0, secrets=(SECRET,))
        asyncio.run(
            run_check(items, agent=FakeAgent({"question 0?": leak}), judge=FakeJudge(), runs=backend, options=opts,
                      tools=TOOLS)
        )  # fmt: skip
        scores = [r for r in server.score_rows() if r["name"] == CHECK_SCORE]
    text = json.dumps(scores, default=str)
    assert len(scores) == 1 and SECRET not in text and "***" in text


# -- two runs of one name at once ---------------------------------------------------------------------


class PacedAgent:
    """Answers right, each answer after `pause` seconds of the event loop."""

    name = "paced"

    def __init__(self, pause: float) -> None:
        self.pause = pause

    async def aclose(self) -> None:
        return None

    async def ask(self, question: str) -> AgentRun:
        await asyncio.sleep(self.pause)
        return RIGHT


def two_runs_at_once(server: LangfuseStandIn, items: dict[str, DatasetItem]) -> list[CheckResult]:
    """`items` in `server`'s dataset, then two checks of one run name at once, each in its own
    thread and shuffle (offsets 0 and 4 of 8), each through a backend of its own: their results."""
    with backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        backend.upsert_dataset_items(list(items.values()))
    results: list[CheckResult] = []

    def one(seed: int) -> None:
        opts = CheckOptions(
            dataset=DATASET, run_name="nightly", now=NOW, trace_wait=0, concurrency=1, write_every=1,
            shuffle=random.Random(seed),
        )  # fmt: skip
        with backend_for(server) as backend:
            results.append(
                asyncio.run(
                    run_check(items, agent=PacedAgent(0.05), judge=FakeJudge(), runs=backend, options=opts,
                              tools=TOOLS)
                )  # fmt: skip
            )

    threads = [threading.Thread(target=one, args=(seed,)) for seed in (2, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.mark.slow
def test_two_runs_of_one_name_at_once_never_double_a_langfuse_run_item() -> None:
    items = cases(8)
    with LangfuseStandIn() as server:
        results = two_runs_at_once(server, items)
        items_written = server.run_items_of(DATASET, "nightly")
    assert len(results) == 2 and all(r.exit_code == ExitCode.OK for r in results)
    linked = [i["datasetItemId"] for i in items_written]
    assert sorted(linked) == sorted(items), f"doubled: {sorted(linked)}"


@pytest.mark.slow
def test_langfuse_a_resume_rewrites_an_undecided_result_and_never_a_decided_one(quick: VirtualClock) -> None:
    items = cases(2)
    judge = ScriptedJudge()
    judge.down = True
    with LangfuseStandIn() as server, backend_for(server) as backend:
        backend.ensure_dataset(DATASET, "cases", {})
        backend.upsert_dataset_items(list(items.values()))
        opts = CheckOptions(dataset=DATASET, run_name="r1", now=NOW, trace_wait=0)

        def run(answers: dict[str, AgentRun | Exception]) -> CheckResult:
            return asyncio.run(
                run_check(items, agent=FakeAgent(answers), judge=judge, runs=backend, options=opts, tools=TOOLS)
            )

        first = run(by_question(items, RIGHT))
        assert {c.result.outcome for c in first.cases} == {"undecided"}
        judge.down = False
        again = run(by_question(items, RIGHT))
        assert {c.result.outcome for c in again.cases} == {"pass"} and again.exit_code == ExitCode.OK
        read = backend.dataset_run_results(backend.dataset_runs(DATASET)[0])
        assert {k: r.outcome for k, r in read.items()} == {"c0": "pass", "c1": "pass"}
        # a decided result is final whoever writes: an undecided one sent for a held pass is not taken
        stale = RunItemResult(item_id="c0", trace_id=read["c0"].trace_id, outcome="undecided")
        assert backend.write_dataset_run(backend.dataset_runs(DATASET)[0], [stale]).written == ["c0"]
        read = backend.dataset_run_results(backend.dataset_runs(DATASET)[0])
        items_written = server.run_items_of(DATASET, "r1")
        scores = [r for r in server.score_rows() if r["name"] == CHECK_SCORE]
    assert read["c0"].outcome == "pass"
    assert len(items_written) == 2 and len(scores) == 2  # one item and one score per case, throughout


def test_an_agent_that_is_no_adapter_returning_a_lone_surrogate_costs_only_its_case() -> None:
    """The adapters read text strictly; an in-process agent (the demo's kind) is checked by the
    runner: its unwritable answer is that case's bad input, the others are judged and written."""
    items = cases(3)
    answers: dict[str, AgentRun | Exception] = by_question(items, RIGHT)
    answers["question 1?"] = AgentRun(answer="yes \ud83d", sources=[url("a")])
    db = store_with(items)
    result = check(db, items, answers, "r1", max_unchecked=0.5)
    outcomes = {c.result.case.item_id: c.result.outcome for c in result.cases}
    assert outcomes == {"c0": "pass", "c1": "error", "c2": "pass"}
    error = next(c.result.run.error for c in result.cases if c.result.case.item_id == "c1")
    assert error is not None and error.startswith("bad input: the reply's answer")
    assert check_json(result) and render_check(result)
