"""`triage check`: run the agent on a regression dataset, judge each new answer against its case,
and say per case fixed, still failing or newly failing (against the previous run of the dataset).

The flow, for one dataset:

1. the dataset's items become cases (`CheckCase.from_item`); an item that is no case is listed with
   its reason (`BadItem`), and an archived item is left out, as Langfuse leaves it out of a run;
2. the dataset's runs are read: a run of the same name is resumed (the cases it holds keep their
   results, read back, and are not asked again: a rerun adds no run item twice), and the newest
   other run `triage check` made is the previous run the cases are compared with;
3. every other case is asked of the agent (`concurrency` at once; the agent adapter keeps its own
   time-out and retries, and its failure is that case's result, `AgentRun.error`). When the agent
   returns a trace id and the traces can be read (Langfuse), the new trace is read, waiting up to
   `trace_wait` seconds for it to arrive, for the passages it retrieved and the tools it called;
4. the judge decides each answered case's expectations (`CheckJudge`); a judge that cannot judge a
   case leaves its expectations undecided, with the reason;
5. the new results are written to the run (`DatasetRuns`): run items linked to the traces (the
   agent's, else a placeholder id derived from the run and the case). An agent error is not
   written, so a rerun under the same run name asks that case again.

Every case ends with a status (`domain.checks.status_of`) and the run with an exit code
(`CheckResult.exit_code`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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
from triage.domain.records import UnreadableTrace
from triage.domain.worklist import DatasetItem
from triage.errors import InputError, JudgeError, TriageError
from triage.reading.trace import read_trace
from triage.retry import current_clock

log = logging.getLogger("triage")

#: the first wait for a new trace to become readable; each later one doubles, at most `MAX_POLL`
FIRST_POLL = 1.0
MAX_POLL = 10.0


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
    #: the agent, overriding `[agent_endpoint]`: its URL, or a local command (a shell-like line)
    agent_url: str | None = None
    agent_command: str | None = None


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
            bad.append(BadItem(item_id=item_id, reason=str(ex)))
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


async def with_new_trace(
    run: AgentRun,
    traces: TraceSource,
    tools: Mapping[str, str],
    wait: float,
    link: Callable[[str], str | None] | None = None,
) -> AgentRun:
    """The run with what its new trace shows (the passages retrieved, the tools called), once the
    trace can be read (waiting up to `wait` seconds); as it was when it cannot."""
    trace_id = run.trace_id
    if trace_id is None:
        return run
    clock = current_clock()
    started, pause = clock.monotonic(), FIRST_POLL
    while True:
        try:
            rows = (await asyncio.to_thread(traces.observations, [trace_id])).get(trace_id)
        except TriageError as ex:
            log.warning(
                "check: trace %s cannot be read: %s", trace_id, ex, extra={"event": "check_trace_unread"}
            )
            return run
        if isinstance(rows, UnreadableTrace):
            log.warning("check: trace %s cannot be read: %s", trace_id, rows.reason)
            return run
        if rows:
            break
        if clock.monotonic() - started + pause > wait:
            log.warning(
                "check: trace %s not readable after %.0f s: judged on the reply alone",
                trace_id,
                wait,
                extra={"event": "check_trace_missing"},
            )
            return run
        await clock.async_sleep(pause)
        pause = min(pause * 2, MAX_POLL)
    try:
        trace = read_trace(trace_id, rows, tools, link(trace_id) if link else None)
    except InputError as ex:
        log.warning("check: trace %s: %s", trace_id, ex)
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
        return await agent.ask(case.question)
    except Exception as ex:  # an adapter's bug is this case's error, never the run's
        log.exception(
            "check %s: the agent adapter failed", case.item_id, extra={"event": "check_agent_crash"}
        )
        return AgentRun(error=f"{type(ex).__name__}: {one_line(str(ex), 300)}")


async def run_check(
    items: Mapping[str, DatasetItem],
    *,
    agent: Agent,
    judge: CheckJudge,
    runs: DatasetRuns,
    options: CheckOptions,
    tools: Mapping[str, str],
    traces: TraceSource | None = None,
) -> CheckResult:
    """Check every case of `items` (the dataset's) on `agent`, judged by `judge`, written to `runs`."""
    clock = current_clock()
    started = clock.monotonic()
    cases, bad = read_cases(items)
    if not cases and not bad:
        raise InputError(
            f"dataset {options.dataset} holds no active cases: `triage promote` writes them (--dataset names another)"
        )
    for item in bad:
        log.warning(
            "check: item %s is no case: %s", item.item_id, item.reason, extra={"event": "check_bad_item"}
        )

    known = await asyncio.to_thread(runs.dataset_runs, options.dataset)
    current = next((r for r in known if r.name == options.run_name), None)
    previous = next(
        (
            r
            for r in known
            if r.name != options.run_name
            and r.by_check
            and (current is None or r.created_at <= current.created_at)
        ),
        None,
    )
    held = await asyncio.to_thread(runs.dataset_run_results, current) if current else {}
    before = await asyncio.to_thread(runs.dataset_run_results, previous) if previous else {}
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
        previous.name if previous else "none",
        agent.name,
        judge.name,
        extra={"event": "check_start"},
    )

    kept: dict[str, CaseResult] = {}
    for case in cases:
        stored = held.get(case.item_id)
        result = stored.case_result(case) if stored is not None else None
        if result is not None:
            kept[case.item_id] = result
    limit = asyncio.Semaphore(options.concurrency)
    link = traces.trace_url if traces is not None else None

    async def one(case: CheckCase) -> CaseResult:
        async with limit:  # the agent's slots; the wait for a trace and the judge hold none
            answer = await _asked(agent, case)
        if answer.error is not None or answer.answer is None:
            log.info("check %s: agent error: %s", case.item_id, answer.error, extra={"event": "check_case"})
            return CaseResult(case=case, run=answer, outcome="error", checks=[], judge=judge.name)
        if traces is not None and answer.trace_id is not None:
            answer = await with_new_trace(answer, traces, tools, options.trace_wait, link)
        checks = await judged(judge, case, answer)
        outcome = CaseResult.outcome_of(answer, checks)
        log.info("check %s: %s", case.item_id, outcome, extra={"event": "check_case"})
        return CaseResult(case=case, run=answer, outcome=outcome, checks=checks, judge=judge.name)

    asked = [case for case in cases if case.item_id not in kept]
    fresh = dict(zip((c.item_id for c in asked), await asyncio.gather(*(one(c) for c in asked)), strict=True))

    to_write = [
        RunItemResult.of(
            result, result.run.trace_id or placeholder_trace_id(options.dataset, options.run_name, item_id)
        )
        for item_id, result in fresh.items()
        if result.outcome != "error"
    ]
    written = await asyncio.to_thread(runs.write_dataset_run, run, to_write) if to_write else None
    if written is not None and written.failed:
        for item_id, reason in written.failed.items():
            log.warning("check %s: not written: %s", item_id, reason, extra={"event": "check_not_written"})

    reports: list[CaseReport] = []
    for case in cases:
        result = kept.get(case.item_id) or fresh[case.item_id]
        prior = before.get(case.item_id)
        previous_outcome: Outcome | None = prior.outcome if prior is not None else None
        reports.append(
            CaseReport(
                result=result,
                status=status_of(result.outcome, previous_outcome, case),
                previous=previous_outcome,
                kept=case.item_id in kept,
            )
        )
    check = CheckResult(
        dataset=options.dataset,
        run_name=options.run_name,
        target=options.target,
        agent=agent.name,
        judge=judge.name,
        previous_run=previous.name if previous else None,
        cases=reports,
        bad_items=bad,
        written=len(written.written) if written else 0,
        not_written=dict(written.failed) if written else {},
        min_pass=options.min_pass,
        usage=judge.usage,
        seconds=round(clock.monotonic() - started, 3),
    )
    counts = ", ".join(f"{s.replace('_', ' ')} {check.count(s)}" for s in STATUSES if check.count(s))
    rate = check.pass_rate
    log.info(
        "check: %s; pass rate %s; %d written, %d not written; %d bad items; exit %d",
        counts or "no cases",
        f"{rate:.0%}" if rate is not None else "-",
        check.written,
        len(check.not_written),
        len(bad),
        int(check.exit_code),
        extra={"event": "check_summary"},
    )
    return check
