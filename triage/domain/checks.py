"""Checking a fix before it ships (`triage check`): a regression case, the agent's new run on it,
and what the check judge found, expectation by expectation, with its evidence.

A case is a dataset item as `triage promote` writes it (`domain.worklist.DatasetItem`): its input
holds the question, its expected output what a passing answer does (`regression.layer_expectation`):
the reviewer's corrected answer, `must_cite`, `must_not_claim`, `decline`, the tool behaviour. A
case passes when every expectation it carries holds; an expectation the judge cannot decide makes
the case `undecided`, never a pass. Pure records: the runner is `triage.check`, the judges
`triage.judges.expectations`.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage.domain.records import Confidence, Passage, Usage
from triage.domain.scores import NAMESPACE
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode, InputError

ExpectationName = Literal["correction", "must_cite", "must_not_claim", "decline", "tool_behavior"]
#: a case's outcome: every expectation held / one did not / the judge could not decide one / the
#: agent gave no answer (its error is the case's result, never the run's)
Outcome = Literal["pass", "fail", "undecided", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Expected(_Model):
    """What a passing answer does; the keys of `triage promote`'s expected output."""

    answer: str | None = None
    tool_behavior: str | None = None
    expectation: str | None = None
    must_cite: list[str] = Field(default_factory=list)
    must_not_claim: list[str] = Field(default_factory=list)
    decline: bool = False

    def names(self) -> list[ExpectationName]:
        """The expectations this case carries, in the order they are checked."""
        out: list[ExpectationName] = []
        if self.answer:
            out.append("correction")
        if self.must_cite:
            out.append("must_cite")
        if self.must_not_claim:
            out.append("must_not_claim")
        if self.decline:
            out.append("decline")
        if self.tool_behavior:
            out.append("tool_behavior")
        return out


class CheckCase(_Model):
    """One regression case, read from a dataset item."""

    item_id: str
    dataset: str
    question: str
    expected: Expected
    layer: str | None = None
    signature: str | None = None
    component: str | None = None
    owners: list[str] = Field(default_factory=list)
    source_trace_id: str | None = None

    @classmethod
    def from_item(cls, item: DatasetItem) -> CheckCase:
        """The case an item holds. Raises `InputError` naming what is missing or malformed."""
        data = item.input if isinstance(item.input, dict) else {"question": item.input}
        question = data.get("question") if isinstance(data, dict) else None
        if not isinstance(question, str) or not question.strip():
            raise InputError(f"item {item.id}: its input holds no question")
        raw = item.expected_output if item.expected_output is not None else {}
        if not isinstance(raw, dict):
            raise InputError(f"item {item.id}: its expected output is not an object")
        known = {k: v for k, v in raw.items() if k in Expected.model_fields}
        try:
            expected = Expected.model_validate(known)
        except ValueError as ex:
            raise InputError(f"item {item.id}: its expected output cannot be read: {ex}") from ex
        if not expected.names():
            raise InputError(f"item {item.id}: its expected output states nothing to check")
        meta = item.metadata
        owners = meta.get("owners")
        return cls(
            item_id=item.id,
            dataset=item.dataset_name,
            question=question,
            expected=expected,
            layer=_text(meta.get("layer")),
            signature=_text(meta.get("signature")),
            component=_text(meta.get("component")),
            owners=[str(o) for o in owners] if isinstance(owners, list) else [],
            source_trace_id=item.source_trace_id,
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class ToolUse(_Model):
    """A tool the agent called on its new run (from its reply or its new trace)."""

    name: str
    collection: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)


class AgentRun(_Model):
    """The agent's new run on a case: its answer, the sources it cites, what it retrieved and
    called (when its reply or its trace says), its trace id, or the error that stopped it."""

    answer: str | None = None
    sources: list[str] = Field(default_factory=list)
    retrieved: list[Passage] = Field(default_factory=list)
    tool_calls: list[ToolUse] | None = None  # None: the run does not say which tools it called
    trace_id: str | None = None
    error: str | None = None
    seconds: float = 0.0


class ExpectationCheck(_Model):
    """One expectation, decided with its evidence (`passed` None: the judge could not decide)."""

    name: ExpectationName
    passed: bool | None
    evidence: str
    confidence: Confidence = "low"


class CaseResult(_Model):
    """What `triage check` found for one case."""

    case: CheckCase
    run: AgentRun
    outcome: Outcome
    checks: list[ExpectationCheck] = Field(default_factory=list)
    judge: str

    @staticmethod
    def outcome_of(run: AgentRun, checks: list[ExpectationCheck]) -> Outcome:
        if run.error is not None or run.answer is None:
            return "error"
        if any(c.passed is False for c in checks):
            return "fail"
        if any(c.passed is None for c in checks):
            return "undecided"
        return "pass"


class CheckJudge(Protocol):
    """Decides a case's expectations on the agent's new run. Raises `JudgeError` when it cannot
    judge at all (the case is then `undecided`, listed with the reason)."""

    name: str

    @property
    def usage(self) -> Usage: ...

    async def check(self, case: CheckCase, run: AgentRun) -> list[ExpectationCheck]: ...

    async def aclose(self) -> None: ...


# -- the agent under check ---------------------------------------------------------------------


class Agent(Protocol):
    """The agent `triage check` asks: one question in, its run out. Its own failures (an HTTP
    error, a time-out, a reply that cannot be read) are the run's `error`, never an exception."""

    @property
    def name(self) -> str:
        """How the report names it: `openai:URL (model)`, `http:URL`, `command:PROGRAM`, `demo`."""
        ...

    async def ask(self, question: str) -> AgentRun: ...

    async def aclose(self) -> None: ...


# -- dataset runs: what a run holds, as written and read back ------------------------------------

#: the score `triage check` writes on each run item's trace in Langfuse (CATEGORICAL: an `Outcome`)
CHECK_SCORE = "triage_check"
#: the runs `triage check` made carry this in their metadata (`created_by`): the previous run is one
CHECK_AUTHOR = "triage check"
#: a stored answer is cut to this many characters (the whole answer stays in the agent's trace)
STORED_ANSWER_CHARS = 4_000

#: a case against what came before it (`status_of`): passed before and fails now; failed before and
#: fails now; failed before and passes now; passed before and passes now; the judge could not
#: decide; the agent gave no answer
Status = Literal["newly_failing", "still_failing", "fixed", "still_passing", "undecided", "error"]
STATUSES: tuple[Status, ...] = ("newly_failing", "still_failing", "fixed", "still_passing", "undecided", "error")


def _key(*parts: str) -> str:
    # JSON, not a separator: no two tuples of parts give the same text
    return str(uuid.uuid5(NAMESPACE, json.dumps(list(parts), ensure_ascii=False)))


def run_id(dataset: str, run_name: str) -> str:
    """The embedded store's id of a dataset run (Langfuse makes its own)."""
    return _key("dataset-run", dataset, run_name)


def run_item_id(dataset: str, run_name: str, item_id: str) -> str:
    """The embedded store's id of a run item: one per (run, case), so a rerun adds none."""
    return _key("dataset-run-item", dataset, run_name, item_id)


def placeholder_trace_id(dataset: str, run_name: str, item_id: str) -> str:
    """The trace a run item is linked to when the agent returned no trace id (Langfuse links every
    run item to a trace): the same on a rerun, so the score on it is overwritten, not doubled."""
    return _key("check-trace", dataset, run_name, item_id)


def check_score_id(dataset: str, run_name: str, item_id: str, trace_id: str) -> str:
    """The id of the `triage_check` score of one run item (a score's trace is fixed at its first
    write, so the trace is part of the id)."""
    return _key("check-score", dataset, run_name, item_id, trace_id)


class CheckRun(_Model):
    """A dataset run (a Langfuse experiment run, or a row of the embedded store's `dataset_runs`)."""

    dataset: str
    name: str
    created_at: datetime
    description: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Langfuse's ids of the run and its dataset (the run items are listed by both)
    id: str | None = None
    dataset_id: str | None = None

    @property
    def by_check(self) -> bool:
        """Made by `triage check` (its results can be read back), not by another experiment runner."""
        return self.metadata.get("created_by") == CHECK_AUTHOR


class RunItemResult(_Model):
    """One case's result as a dataset run keeps it: what the report and the next run read back."""

    item_id: str
    trace_id: str
    #: None: the case is in the run but its result cannot be read (its score is missing)
    outcome: Outcome | None = None
    answer: str | None = None
    sources: list[str] = Field(default_factory=list)
    checks: list[ExpectationCheck] = Field(default_factory=list)
    judge: str | None = None
    #: the agent's own trace (False: `trace_id` is a placeholder)
    agent_trace: bool = True

    @classmethod
    def of(cls, result: CaseResult, trace_id: str) -> RunItemResult:
        answer = result.run.answer
        if answer is not None and len(answer) > STORED_ANSWER_CHARS:
            answer = answer[: STORED_ANSWER_CHARS - 1] + "…"
        return cls(
            item_id=result.case.item_id,
            trace_id=trace_id,
            outcome=result.outcome,
            answer=answer,
            sources=result.run.sources,
            checks=result.checks,
            judge=result.judge,
            agent_trace=result.run.trace_id is not None and result.run.trace_id == trace_id,
        )

    def stored(self) -> dict[str, Any]:
        """What a store keeps of it (the embedded store's row, a Langfuse score's metadata)."""
        return self.model_dump(mode="json", exclude={"item_id", "trace_id"})

    @classmethod
    def read(cls, item_id: str, trace_id: str, stored: object) -> RunItemResult:
        """A result from what a store kept; what cannot be read is a result without an outcome."""
        if isinstance(stored, dict):
            known = {k: v for k, v in stored.items() if k in cls.model_fields}  # a score's metadata holds more
            try:
                return cls.model_validate({**known, "item_id": item_id, "trace_id": trace_id})
            except ValidationError:
                pass
        return cls(item_id=item_id, trace_id=trace_id)

    def case_result(self, case: CheckCase) -> CaseResult | None:
        """The case's result as this run kept it; None when no outcome can be read."""
        if self.outcome is None:
            return None
        run = AgentRun(
            answer=self.answer, sources=self.sources, trace_id=self.trace_id if self.agent_trace else None
        )
        return CaseResult(case=case, run=run, outcome=self.outcome, checks=self.checks, judge=self.judge or "?")


# -- what a check produced -----------------------------------------------------------------------


def status_of(outcome: Outcome, previous: Outcome | None, case: CheckCase) -> Status:
    """A case's outcome against what came before it: the previous run's outcome, or, where that
    run has no decided result for the case, production (a case triaged `ok` was right there, every
    other case failed there)."""
    if outcome in ("undecided", "error"):
        return outcome
    passed_before = previous == "pass" if previous in ("pass", "fail") else case.layer == "ok"
    if outcome == "fail":
        return "newly_failing" if passed_before else "still_failing"
    return "still_passing" if passed_before else "fixed"


class CaseReport(_Model):
    """One case of the check: its result, the previous run's outcome, and what that makes it."""

    result: CaseResult
    status: Status
    previous: Outcome | None = None
    #: read back from the run, not asked again (a rerun under the same run name)
    kept: bool = False


class BadItem(_Model):
    """A dataset item that is no case (listed with the reason, never a crash)."""

    item_id: str
    reason: str


class CheckResult(_Model):
    """What `triage check` produced: every case with its status, the items that are no case, what
    was written, and the gate."""

    dataset: str
    run_name: str
    #: where the cases and the results live: Langfuse, the embedded store, the demo's store
    target: str
    agent: str
    judge: str
    previous_run: str | None = None
    cases: list[CaseReport] = Field(default_factory=list)
    bad_items: list[BadItem] = Field(default_factory=list)
    #: results written as run items (with their scores in Langfuse), and those that failed
    written: int = 0
    not_written: dict[str, str] = Field(default_factory=dict)
    min_pass: float | None = None
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0

    def count(self, status: Status) -> int:
        return sum(1 for case in self.cases if case.status == status)

    @property
    def passed(self) -> int:
        return sum(1 for case in self.cases if case.result.outcome == "pass")

    @property
    def pass_rate(self) -> float | None:
        """Passing cases over every case (an undecided case and an agent error do not pass)."""
        return self.passed / len(self.cases) if self.cases else None

    @property
    def below_min_pass(self) -> bool:
        if self.min_pass is None:
            return False
        rate = self.pass_rate
        return rate is None or rate < self.min_pass

    @property
    def regressed(self) -> list[CaseReport]:
        """The cases that passed in the previous run and fail now: the gate. (A case newly failing
        against production alone, with no result in the previous run, is reported, not gated.)"""
        return [c for c in self.cases if c.status == "newly_failing" and c.previous == "pass"]

    @property
    def exit_code(self) -> ExitCode:
        """7 when a case that passed in the previous run fails now or the pass rate is under
        `min_pass`; else 5 when a result could not be written; else 0."""
        if self.regressed or self.below_min_pass:
            return ExitCode.REGRESSED
        if self.not_written:
            return ExitCode.NOT_WRITTEN
        return ExitCode.OK
