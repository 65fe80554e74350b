"""`triage check`: run the agent on a regression dataset, judge each new answer against its case,
and say per case fixed, still failing or newly failing (against the previous run of the dataset).

The flow, for one dataset:

1. the dataset's items become cases (`CheckCase.from_item`); an item that is no case is listed with
   its reason (`BadItem`), and an archived item is left out, as Langfuse leaves it out of a run;
2. the dataset's runs are read: a run of the same name is resumed (the cases it holds DECIDED, a pass
   or a fail, keep their results and are not asked again; an agent error or an undecided case is
   asked and judged again), and each case is compared with the newest earlier run `triage check`
   made that decided it (`LOOKBACK_RUNS` at most), else with production;
3. every other case is asked of the agent (`concurrency` at once, from a random place in the list,
   so two runs of one name at once meet on few cases; the agent adapter keeps its own time-out and
   retries, and its failure is that case's result, `AgentRun.error`). When the agent returns a trace
   id and the traces can be read (Langfuse), the new trace is read, waiting up to `trace_wait`
   seconds for it to arrive, for the passages it retrieved and the tools it called: one
   `observations` call per poll for every trace still awaited (`TracePoller`);
4. the judge decides each answered case's expectations (`CheckJudge`); a judge that cannot judge a
   case leaves its expectations undecided, with the reason;
5. every result is masked (the settings' secrets, credential-looking strings) before anything is
   made of it, so the report, the log, `--output`, the run items and the scores' metadata never
   hold a secret the agent echoed;
6. the results are written to the run (`DatasetRuns`) as the cases finish, in batches (`write_every`
   cases, or `write_seconds` after the oldest unwritten one finished): run items linked to the
   traces (the agent's, else a placeholder id derived from the run and the case). An agent error is
   not written, so a rerun under the same run name asks that case again. SIGTERM stops new work:
   the cases in flight finish and are written with the others, the rest are listed as stopped, and
   a rerun under the same run name continues from there.

Every case ends with a status (`domain.checks.status_of`) and the run with an exit code
(`CheckResult.exit_code`: 7 a decided regression, 8 too much left unchecked, 5 not written).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from triage.domain.checks import (
    CHECK_AUTHOR,
    STATUSES,
    Agent,
    AgentRun,
    BadItem,
    CaseReport,
    CaseResult,
    CheckCase,
    CheckJudge,
    CheckResult,
    CheckRun,
    ExpectationCheck,
    ExpectationName,
    Outcome,
    RunItemResult,
    ToolUse,
    placeholder_trace_id,
    status_of,
)
from triage.domain.kernel import ms_utc, one_line
from triage.domain.ports import DatasetRuns, TraceSource
from triage.domain.records import Observation, UnreadableTrace
from triage.domain.worklist import DatasetItem
from triage.errors import InputError, JudgeError, TriageError
from triage.reading.trace import read_trace
from triage.redact import Redactor, masked_data
from triage.retry import Budget, current_clock, stop_on_sigterm

log = logging.getLogger("triage")

#: the first wait for a new trace to become readable; each later one doubles, at most `MAX_POLL`
FIRST_POLL = 1.0
MAX_POLL = 10.0
#: the share of cases that may be unchecked (agent errors, undecided) before the run exits 8: one in
#: ten, room for a flaky case or two in a few dozen, never for an outage (`[check] max_unchecked`)
DEFAULT_MAX_UNCHECKED = 0.1
#: at most this many earlier runs are read to find, per case, the newest that decided it
LOOKBACK_RUNS = 20
#: results are written every this many finished cases, or this many seconds after the oldest unwritten
#: one finished, whichever comes first (a SIGKILL after the grace period loses at most that)
WRITE_EVERY = 10
WRITE_SECONDS = 5.0
STOPPED = "the run was stopped (SIGTERM) before this case was asked"


@dataclass(frozen=True)
class CheckRequest:
    """What `triage check` was asked on its command line; None: the configuration's `[check]`."""

    now: datetime
    dataset: str | None = None
    run_name: str | None = None
    #: `offline` or `llm` (None: `llm` when a model is configured, else `offline`)
    judge: str | None = None
    concurrency: int | None = None
    timeout: float | None = None
    min_pass: float | None = None
    max_unchecked: float | None = None
    #: the agent, overriding `[agent_endpoint]`: its URL, or a local command (a shell-like line)
    agent_url: str | None = None
    agent_command: str | None = None
    #: the release the agent under check is: a signature whose cases all pass is recorded fixed in it
    release: str | None = None


@dataclass(frozen=True)
class CheckOptions:
    dataset: str
    run_name: str
    now: datetime
    concurrency: int = 4
    #: the gate on the pass rate (None: none)
    min_pass: float | None = None
    #: how long to wait for the agent's new traces to become readable (Langfuse)
    trace_wait: float = 60.0
    #: where the cases and results live, for the report
    target: str = ""
    #: the gate on the share of unchecked cases (None: none; a case that passed before and is
    #: unchecked now still exits 8)
    max_unchecked: float | None = DEFAULT_MAX_UNCHECKED
    #: the secret values to mask in every result (the settings' own: the core reads no environment)
    secrets: Sequence[str] = field(default_factory=tuple)
    write_every: int = WRITE_EVERY
    write_seconds: float = WRITE_SECONDS
    #: the order cases are asked in: rotated by a random offset (None: the system's randomness)
    shuffle: random.Random | None = None


def default_run_name(now: datetime) -> str:
    """A run's name when none is given: `check-` and the time, to the second (UTC)."""
    return "check-" + ms_utc(now).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_cases(items: Mapping[str, DatasetItem]) -> tuple[list[CheckCase], list[BadItem]]:
    """The active items as cases, in id order; the items that are none, with the reason."""
    cases: list[CheckCase] = []
    bad: list[BadItem] = []
    for item_id in sorted(items):
        item = items[item_id]
        if item.status != "ACTIVE":
            continue
        try:
            cases.append(CheckCase.from_item(item))
        except InputError as ex:
            bad.append(BadItem(item_id=item_id, reason=one_line(str(ex), 500)))
        except RecursionError:  # an item nested past the stack is that item's problem, not the run's
            bad.append(BadItem(item_id=item_id, reason=f"item {item_id}: it is nested too deep to read"))
        except (ValueError, TypeError) as ex:  # a value pydantic or str() refuses
            bad.append(BadItem(item_id=item_id, reason=f"item {item_id}: it cannot be read: {one_line(str(ex), 300)}"))
    return cases, bad


def _undecided(names: Iterable[ExpectationName], reason: str) -> list[ExpectationCheck]:
    return [ExpectationCheck(name=name, passed=None, evidence=reason) for name in names]


def completed(case: CheckCase, checks: list[ExpectationCheck]) -> list[ExpectationCheck]:
    """The judge's checks, with every expectation it did not answer undecided (never a silent pass)."""
    answered = {c.name for c in checks}
    missing = [n for n in case.expected.names() if n not in answered]
    return [*checks, *_undecided(missing, "the judge gave no decision on it")]


async def judged(judge: CheckJudge, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]:
    """The judge's checks of one answered case; undecided, with the reason, when it cannot judge."""
    try:
        return completed(case, await judge.check(case, run))
    except JudgeError as ex:
        log.warning(
            "check %s: the judge could not decide: %s", case.item_id, ex, extra={"event": "check_judge_error"}
        )
        return _undecided(case.expected.names(), f"the judge could not decide: {one_line(str(ex), 300)}")
    except Exception as ex:  # a judge's bug on one case leaves that case undecided, never the run
        log.exception("check %s: the judge failed", case.item_id, extra={"event": "check_judge_crash"})
        return _undecided(case.expected.names(), f"the judge failed: {type(ex).__name__}: {one_line(str(ex), 300)}")


class TracePoller:
    """Waits for the agents' new traces together: each poll is ONE `observations` call for every
    trace still awaited (never one call per case per poll), the first as soon as a trace is awaited
    and none is in flight; then the pause doubles (at most `MAX_POLL`), back to `FIRST_POLL` when a
    new trace joined. A trace not readable `wait` seconds after it joined is given up (the case is
    judged on the reply alone)."""

    def __init__(self, traces: TraceSource, wait: float) -> None:
        self.traces = traces
        self.wait = wait
        self.calls = 0
        self._waiting: dict[str, tuple[float, list[asyncio.Future[list[Observation] | None]]]] = {}
        self._joined = False
        self._task: asyncio.Task[None] | None = None

    async def rows(self, trace_id: str) -> list[Observation] | None:
        """The trace's observations once readable; None when it cannot be read in time."""
        future: asyncio.Future[list[Observation] | None] = asyncio.get_running_loop().create_future()
        clock = current_clock()
        self._waiting.setdefault(trace_id, (clock.monotonic(), []))[1].append(future)
        self._joined = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll())
        return await future

    def _settle(self, trace_id: str, rows: list[Observation] | None) -> None:
        for future in self._waiting.pop(trace_id, (0.0, []))[1]:
            if not future.done():
                future.set_result(rows)

    async def _poll(self) -> None:
        clock = current_clock()
        pause = FIRST_POLL
        while self._waiting:
            ids = sorted(self._waiting)
            self._joined = False
            self.calls += 1
            try:
                found = await asyncio.to_thread(self.traces.observations, ids)
            except TriageError as ex:
                log.warning("check: traces cannot be read: %s", ex, extra={"event": "check_trace_unread"})
                for trace_id in ids:
                    self._settle(trace_id, None)
                continue
            for trace_id in ids:
                rows = found.get(trace_id)
                if isinstance(rows, UnreadableTrace):
                    log.warning("check: trace %s cannot be read: %s", trace_id, rows.reason)
                    self._settle(trace_id, None)
                elif rows:
                    self._settle(trace_id, rows)
                elif trace_id in self._waiting and clock.monotonic() - self._waiting[trace_id][0] + pause > self.wait:
                    log.warning(
                        "check: trace %s not readable after %.0f s: judged on the reply alone",
                        trace_id,
                        self.wait,
                        extra={"event": "check_trace_missing"},
                    )
                    self._settle(trace_id, None)
            if not self._waiting:
                return
            await clock.async_sleep(pause)
            await asyncio.sleep(0)  # a virtual clock's sleep yields nothing: let the cases in flight join
            pause = FIRST_POLL if self._joined else min(pause * 2, MAX_POLL)


async def with_new_trace(
    run: AgentRun,
    poller: TracePoller,
    tools: Mapping[str, str],
    link: Callable[[str], str | None] | None = None,
) -> AgentRun:
    """The run with what its new trace shows (the passages retrieved, the tools called), once the
    trace can be read; as it was when it cannot."""
    trace_id = run.trace_id
    if trace_id is None:
        return run
    rows = await poller.rows(trace_id)
    if not rows:
        return run
    try:
        trace = read_trace(trace_id, rows, tools, link(trace_id) if link else None)
    except (InputError, RecursionError) as ex:
        log.warning("check: trace %s: %s", trace_id, one_line(str(ex), 300))
        return run
    calls = [ToolUse(name=c.name, collection=c.collection, args=c.args) for c in trace.tool_calls]
    return run.model_copy(
        update={
            "retrieved": [*run.retrieved, *trace.passages],
            "tool_calls": calls if run.tool_calls is None else [*run.tool_calls, *calls],
        }
    )


async def _asked(agent: Agent, case: CheckCase) -> AgentRun:
    try:
        run = await agent.ask(case.question)
    except Exception as ex:  # an adapter's bug is this case's error, never the run's
        log.exception(
            "check %s: the agent adapter failed", case.item_id, extra={"event": "check_agent_crash"}
        )
        return AgentRun(error=f"{type(ex).__name__}: {one_line(str(ex), 300)}")
    # the adapters read text strictly; any other agent (the demo, one in-process) is checked here:
    # a text nothing can write is this case's bad input, never the run's crash
    where = run.unwritable()
    if where is not None:
        return AgentRun(error=f"bad input: the reply's {where} is not UTF-8 text (a lone surrogate)")
    return run


def masked(result: CaseResult, redactor: Redactor) -> CaseResult:
    """The result with every secret and credential-looking string masked, in the agent's run and the
    judge's evidence alike (an agent may echo its environment; a judge may quote the answer)."""
    try:
        run = AgentRun.model_validate(masked_data(result.run.model_dump(mode="json"), redactor))
    except (RecursionError, ValueError):  # tool arguments nested past reading: the rest is kept
        bare = result.run.model_copy(update={"tool_calls": None, "retrieved": []})
        run = AgentRun.model_validate(masked_data(bare.model_dump(mode="json"), redactor))
    checks = [c.model_copy(update={"evidence": redactor(c.evidence)}) for c in result.checks]
    return result.model_copy(update={"run": run, "checks": checks, "judge": redactor(result.judge)})


class ResultWriter:
    """Writes the results to the run as the cases finish: every `every` results, or once the oldest
    unwritten one is `seconds` old (checked as each case finishes, and by a timer of the event loop
    while cases are in flight), and whatever is left at the end or on SIGTERM. One batch at a time;
    each batch is one `write_dataset_run`, which reads what the run holds before it writes."""

    def __init__(self, runs: DatasetRuns, run: CheckRun, every: int, seconds: float) -> None:
        self.runs = runs
        self.run = run
        self.every = max(every, 1)
        self.seconds = seconds
        self.written: set[str] = set()
        self.failed: dict[str, str] = {}
        self.batches = 0
        self._pending: list[RunItemResult] = []
        self._oldest: float | None = None
        self._lock = asyncio.Lock()

    async def add(self, result: RunItemResult) -> None:
        clock = current_clock()
        if not self._pending:
            self._oldest = clock.monotonic()
        self._pending.append(result)
        due = self._oldest is not None and clock.monotonic() - self._oldest >= self.seconds
        if len(self._pending) >= self.every or due:
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            batch, self._pending, self._oldest = self._pending, [], None
            if not batch:
                return
            self.batches += 1
            try:
                outcome = await asyncio.to_thread(self.runs.write_dataset_run, self.run, batch)
            except TriageError as ex:  # this batch is not written; the next may be, a rerun writes it
                log.warning("check: %d results not written: %s", len(batch), ex, extra={"event": "check_not_written"})
                for result in batch:
                    self.failed[result.item_id] = one_line(str(ex), 300)
                return
        for item_id in outcome.written:
            self.written.add(item_id)
            self.failed.pop(item_id, None)
        for item_id, reason in outcome.failed.items():
            log.warning("check %s: not written: %s", item_id, reason, extra={"event": "check_not_written"})
            self.failed[item_id] = reason

    async def tick(self) -> None:
        """While cases are in flight: write what waited `seconds` (a case may take minutes)."""
        while True:
            await asyncio.sleep(self.seconds)  # the event loop's timer: a bound on staleness, not a back-off
            if self._pending:
                await self.flush()


async def run_check(
    items: Mapping[str, DatasetItem],
    *,
    agent: Agent,
    judge: CheckJudge,
    runs: DatasetRuns,
    options: CheckOptions,
    tools: Mapping[str, str],
    traces: TraceSource | None = None,
    budget: Budget | None = None,
    stop: asyncio.Event | None = None,
) -> CheckResult:
    """Check every case of `items` (the dataset's) on `agent`, judged by `judge`, written to `runs`.
    SIGTERM (or `stop`, set) stops new work: see the module docstring."""
    stop = stop or asyncio.Event()
    with stop_on_sigterm(stop, budget, doing="finishing the cases in flight, writing every finished one"):
        return await _run_check(items, agent, judge, runs, options, tools, traces, stop)


async def _previous_outcomes(
    runs: DatasetRuns, earlier: list[CheckRun], cases: list[CheckCase]
) -> dict[str, tuple[Outcome, str]]:
    """Per case, its outcome in the newest of `earlier` (newest first) that decided it, and that
    run's name; runs are read until every case has one or `LOOKBACK_RUNS` were read."""
    found: dict[str, tuple[Outcome, str]] = {}
    wanted = {c.item_id for c in cases}
    for run in earlier[:LOOKBACK_RUNS]:
        if wanted <= found.keys():
            break
        held = await asyncio.to_thread(runs.dataset_run_results, run)
        for item_id, stored in held.items():
            if item_id in wanted and item_id not in found and stored.decided and stored.outcome is not None:
                found[item_id] = (stored.outcome, run.name)
    return found


async def _run_check(
    items: Mapping[str, DatasetItem],
    agent: Agent,
    judge: CheckJudge,
    runs: DatasetRuns,
    options: CheckOptions,
    tools: Mapping[str, str],
    traces: TraceSource | None,
    stop: asyncio.Event,
) -> CheckResult:
    clock = current_clock()
    started = clock.monotonic()
    redactor = Redactor(options.secrets)
    cases, bad = read_cases(items)
    bad = [b.model_copy(update={"reason": redactor(b.reason)}) for b in bad]  # an item's text may quote a key
    for item in bad:
        log.warning(
            "check: item %s is no case: %s", item.item_id, item.reason, extra={"event": "check_bad_item"}
        )
    if not cases:
        # nothing to check is never a pass: an empty dataset, or one whose every item is unreadable
        said = f"its {len(bad)} active items are no case (the first: {bad[0].reason})" if bad else "no active cases"
        raise InputError(
            f"dataset {options.dataset} holds {said}: `triage promote` writes cases (--dataset names another)"
        )

    known = await asyncio.to_thread(runs.dataset_runs, options.dataset)
    current = next((r for r in known if r.name == options.run_name), None)
    earlier = [
        r
        for r in known
        if r.name != options.run_name and r.by_check and (current is None or r.created_at <= current.created_at)
    ]
    held = await asyncio.to_thread(runs.dataset_run_results, current) if current else {}
    before = await _previous_outcomes(runs, earlier, cases)
    run = current or CheckRun(
        dataset=options.dataset,
        name=options.run_name,
        created_at=ms_utc(options.now),
        description=f"triage check: agent {agent.name}, judge {judge.name}",
        metadata={"created_by": CHECK_AUTHOR, "agent": agent.name, "judge": judge.name},
    )
    log.info(
        "check: %d cases of dataset %s, run %s (%s), previous run %s; agent %s, judge %s",
        len(cases),
        options.dataset,
        options.run_name,
        "resumed" if current else "new",
        earlier[0].name if earlier else "none",
        agent.name,
        judge.name,
        extra={"event": "check_start"},
    )

    # a resume keeps what the run DECIDED; an error or an undecided case is asked and judged again
    kept: dict[str, CaseResult] = {}
    for case in cases:
        stored = held.get(case.item_id)
        result = stored.case_result(case) if stored is not None and stored.decided else None
        if result is not None:
            kept[case.item_id] = masked(result, redactor)
    limit = asyncio.Semaphore(options.concurrency)
    link = traces.trace_url if traces is not None else None
    poller = TracePoller(traces, options.trace_wait) if traces is not None else None
    writer = ResultWriter(runs, run, options.write_every, options.write_seconds)

    async def one(case: CheckCase) -> CaseResult:
        async with limit:  # the agent's slots; the wait for a trace and the judge hold none
            if stop.is_set():
                return CaseResult(case=case, run=AgentRun(error=STOPPED), outcome="error", checks=[], judge=judge.name)
            answer = await _asked(agent, case)
        if answer.error is not None or answer.answer is None:
            result = CaseResult(case=case, run=answer, outcome="error", checks=[], judge=judge.name)
            result = masked(result, redactor)
            log.info("check %s: agent error: %s", case.item_id, result.run.error, extra={"event": "check_case"})
            return result  # not written: a rerun under the same run name asks it again
        if poller is not None and answer.trace_id is not None:
            answer = await with_new_trace(answer, poller, tools, link)
        checks = await judged(judge, case, answer)
        outcome = CaseResult.outcome_of(answer, checks)
        result = masked(CaseResult(case=case, run=answer, outcome=outcome, checks=checks, judge=judge.name), redactor)
        log.info("check %s: %s", case.item_id, result.outcome, extra={"event": "check_case"})
        trace_id = result.run.trace_id or placeholder_trace_id(options.dataset, options.run_name, case.item_id)
        await writer.add(RunItemResult.of(result, trace_id))
        return result

    asked = [case for case in cases if case.item_id not in kept]
    # from a random place in the list: two runs of one name at once ask (and write) different cases
    # first, so the read-before-write of each batch finds what the other wrote
    offset = (options.shuffle or random.SystemRandom()).randrange(len(asked)) if asked else 0
    order = asked[offset:] + asked[:offset]

    async def flush_on_stop() -> None:
        await stop.wait()
        await writer.flush()

    helpers = [asyncio.create_task(writer.tick()), asyncio.create_task(flush_on_stop())]
    try:
        done = await asyncio.gather(*(one(c) for c in order))
    finally:
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await writer.flush()
    fresh = {result.case.item_id: result for result in done}

    reports: list[CaseReport] = []
    for case in cases:
        result = kept.get(case.item_id) or fresh[case.item_id]
        prior = before.get(case.item_id)
        previous_outcome: Outcome | None = prior[0] if prior is not None else None
        reports.append(
            CaseReport(
                result=result,
                status=status_of(result.outcome, previous_outcome, case),
                previous=previous_outcome,
                decided_in=prior[1] if prior is not None else None,
                kept=case.item_id in kept,
            )
        )
    check = CheckResult(
        dataset=options.dataset,
        run_name=options.run_name,
        target=options.target,
        agent=agent.name,
        judge=judge.name,
        previous_run=earlier[0].name if earlier else None,
        cases=reports,
        bad_items=bad,
        written=len(writer.written),
        not_written={item_id: redactor(reason) for item_id, reason in sorted(writer.failed.items())},
        min_pass=options.min_pass,
        max_unchecked=options.max_unchecked,
        stopped=stop.is_set(),
        usage=judge.usage,
        seconds=round(clock.monotonic() - started, 3),
    )
    counts = ", ".join(f"{s.replace('_', ' ')} {check.count(s)}" for s in STATUSES if check.count(s))
    rate = check.pass_rate
    log.info(
        "check: %s; pass rate %s; %d unchecked; %d written in %d batches, %d not written; %d bad items; %s"
        "exit %d",
        counts or "no cases",
        f"{rate:.0%}" if rate is not None else "-",
        len(check.unchecked),
        check.written,
        writer.batches,
        len(check.not_written),
        len(bad),
        "stopped by SIGTERM; " if check.stopped else "",
        int(check.exit_code),
        extra={"event": "check_summary"},
    )
    return check
