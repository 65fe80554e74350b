"""Checking a fix before it ships (`triage check`): a regression case, the agent's new run on it,
and what the check judge found, expectation by expectation, with its evidence.

A case is a dataset item as `triage promote` writes it (`domain.worklist.DatasetItem`): its input
holds the question, its expected output what a passing answer does (`regression.layer_expectation`):
the reviewer's corrected answer, `must_cite`, `must_not_claim`, `decline`, the tool behaviour. A
case passes when every expectation it carries holds; an expectation the judge cannot decide makes
the case `undecided`, never a pass. Pure records: the runner is `triage.check`, the judges
`triage.judges.CHECK_JUDGES`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage.domain.records import Confidence, Passage, Usage
from triage.domain.scores import NAMESPACE
from triage.domain.worklist import DatasetItem
from triage.errors import ExitCode, InputError

ExpectationName = Literal[
    "correction", "answers", "must_cite", "rests_on", "must_not_claim", "decline", "tool_behavior"
]
#: a case's outcome: every expectation held / one did not / the judge could not decide one / the
#: agent gave no answer (its error is the case's result, never the run's)
Outcome = Literal["pass", "fail", "undecided", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: the layers whose fix is an answer: the passages or the index hold it, so a decline is no fix
ANSWERING_LAYERS = frozenset({"retrieval", "generation", "tool_routing", "ok"})
#: the layers whose fix rests on the page the case names (`must_cite`): retrieving it is not enough
RESTING_LAYERS = frozenset({"retrieval", "ok"})


class Expected(_Model):
    """What a passing answer does; the keys of `triage promote`'s expected output.

    `answers` (the answer answers: it does not decline) and `rests_on` (the answer rests on a
    passage of a `must_cite` page it retrieved or cites) are what a case's layer is about; items
    written before they existed carry neither and get them from their layer (`derived`), so a case
    tests what it is about whoever promoted it.
    """

    answer: str | None = None
    tool_behavior: str | None = None
    expectation: str | None = None
    must_cite: list[str] = Field(default_factory=list)
    must_not_claim: list[str] = Field(default_factory=list)
    decline: bool = False
    #: None: not said (derived from the layer)
    answers: bool | None = None
    rests_on: bool | None = None

    def derived(self, layer: str | None) -> Expected:
        """The expectations the case's layer implies, where the item does not say them: a case of
        an answering layer must answer (a decline is no fix), and a retrieval or `ok` case that
        names its page must rest on it (retrieving the page and then declining or contradicting it
        is no fix)."""
        answers = self.answers
        if answers is None:
            answers = layer in ANSWERING_LAYERS and not self.decline
        rests_on = self.rests_on
        if rests_on is None:
            rests_on = layer in RESTING_LAYERS and bool(self.must_cite)
        return self.model_copy(update={"answers": answers, "rests_on": rests_on and bool(self.must_cite)})

    def names(self) -> list[ExpectationName]:
        """The expectations this case carries, in the order they are checked."""
        out: list[ExpectationName] = []
        if self.answer:
            out.append("correction")
        if self.answers:
            out.append("answers")
        if self.must_cite:
            out.append("must_cite")
        if self.rests_on:
            out.append("rests_on")
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
            # what a layer implies adds to what an item states, never stands in for it
            raise InputError(f"item {item.id}: its expected output states nothing to check")
        meta = item.metadata
        expected = expected.derived(_text(meta.get("layer")))
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

    def unwritable(self) -> str | None:
        """Where one of its texts cannot be encoded as UTF-8 (a lone surrogate, which a JSON reply
        may escape and nothing can write: not a store, not the report), by field (`answer`,
        `retrieved[0].text`, `tool_calls[0].args key`...) and character; None when every one can."""
        for name, value in self.model_dump(exclude={"seconds", "error"}).items():
            for where in _unwritable(value, name):
                return where
        return None


def _unwritable(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as ex:
            shown = value[ex.start : ex.end].encode("utf-8", "backslashreplace").decode("utf-8")
            yield f"{where} (character {ex.start}: {shown})"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _unwritable(key, f"{where} key")
            yield from _unwritable(item, f"{where}.{str(key).encode('utf-8', 'backslashreplace').decode('utf-8')}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from _unwritable(item, f"{where}[{n}]")


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
#: a stored result's other texts are cut so (an evidence, a source, a tool's argument), and at most
#: this many sources kept: what the report and the next run need, never what an agent let run away
STORED_TEXT_CHARS = 2_000
STORED_SOURCES = 50
#: a stored result (a store's row, a Langfuse score's metadata) is at most this many bytes of JSON:
#: a result Langfuse refuses would never be written and every rerun would exit 5, so what is over is
#: clipped, with a note saying so (`RunItemResult.clipped`)
STORED_RESULT_BYTES = 64_000

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
    #: what was cut to keep the result under `STORED_RESULT_BYTES` (None: nothing)
    clipped: str | None = None

    @property
    def decided(self) -> bool:
        """A pass or a fail: a resume keeps it; anything else is asked and judged again."""
        return self.outcome in ("pass", "fail")

    @classmethod
    def of(cls, result: CaseResult, trace_id: str) -> RunItemResult:
        """The result as a store keeps it: long texts cut, and the whole under `STORED_RESULT_BYTES`."""
        cut: list[str] = []
        answer = _cut(result.run.answer, STORED_ANSWER_CHARS, "the answer", cut)
        sources = [_cut(s, STORED_TEXT_CHARS, "a source", cut) or "" for s in result.run.sources[:STORED_SOURCES]]
        if len(result.run.sources) > STORED_SOURCES:
            cut.append(f"{len(result.run.sources) - STORED_SOURCES} sources")
        checks = [
            c.model_copy(update={"evidence": _cut(c.evidence, STORED_TEXT_CHARS, f"the {c.name} evidence", cut)})
            for c in result.checks
        ]
        item = cls(
            item_id=result.case.item_id,
            trace_id=trace_id,
            outcome=result.outcome,
            answer=answer,
            sources=sources,
            checks=checks,
            judge=_cut(result.judge, STORED_TEXT_CHARS, "the judge's name", cut),
            agent_trace=result.run.trace_id is not None and result.run.trace_id == trace_id,
        )
        if cut:
            item.clipped = _clip_note(cut)
        return item._within(STORED_RESULT_BYTES)

    def _within(self, limit: int) -> RunItemResult:
        # still over (many checks, a long id): the texts go, then the sources, never the outcome
        if _size(self.stored()) <= limit:
            return self
        notes = [self.clipped] if self.clipped else []
        bare = self.model_copy(
            update={
                "answer": _cut(self.answer, 200, "the answer", []),
                "checks": [c.model_copy(update={"evidence": _cut(c.evidence, 200, "", [])}) for c in self.checks],
                "clipped": _clip_note([*notes, "every text, to stay under the size a store takes"]),
            }
        )
        if _size(bare.stored()) <= limit:
            return bare
        return bare.model_copy(
            update={
                "sources": [],
                "checks": [c.model_copy(update={"evidence": ""}) for c in bare.checks][:20],
                "clipped": _clip_note([*notes, "every text, the sources and the evidence: too large to store"]),
            }
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


def _cut(text: str | None, limit: int, what: str, cut: list[str]) -> str | None:
    if text is None or len(text) <= limit:
        return text
    if what:
        cut.append(f"{what} ({len(text)} characters)")
    return text[: limit - 1] + "…"


def _clip_note(cut: list[str]) -> str:
    note = "clipped to store: " + "; ".join(cut)
    return note if len(note) <= 500 else note[:499] + "…"


def _size(stored: dict[str, Any]) -> int:
    return len(json.dumps(stored, ensure_ascii=False).encode())


# -- what a check produced -----------------------------------------------------------------------


def status_of(outcome: Outcome, previous: Outcome | None, case: CheckCase) -> Status:
    """A case's outcome against what came before it: its outcome in the newest earlier run that
    decided it (`previous`, a pass or a fail), or, where no earlier run decided it, production (a
    case triaged `ok` was right there, every other case failed there)."""
    if outcome in ("undecided", "error"):
        return outcome
    passed_before = previous == "pass" if previous in ("pass", "fail") else case.layer == "ok"
    if outcome == "fail":
        return "newly_failing" if passed_before else "still_failing"
    return "still_passing" if passed_before else "fixed"


class CaseReport(_Model):
    """One case of the check: its result, its outcome in the newest earlier run that decided it, and
    what that makes it."""

    result: CaseResult
    status: Status
    #: the case's outcome in the newest earlier run that decided it (None: no run did)
    previous: Outcome | None = None
    #: that run's name
    decided_in: str | None = None
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
    #: the share of cases that may be left unchecked (agent errors, undecided) before the run exits 8
    #: (None: no gate on the share; a case that passed before and is unchecked now still exits 8)
    max_unchecked: float | None = None
    #: the run was stopped (SIGTERM) before every case was asked: those are agent errors saying so
    stopped: bool = False
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0
    #: `--release R`: the release checked, and the signatures this run found fixed in it (every case
    #: of each passed), recorded with their state (`triage issues sync` closes their issues)
    release: str | None = None
    fixed: list[str] = Field(default_factory=list)

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
        """The cases that passed in the newest earlier run that decided them and fail now: the gate.
        (A case newly failing against production alone, decided by no earlier run, is reported, not
        gated.)"""
        return [c for c in self.cases if c.status == "newly_failing" and c.previous == "pass"]

    @property
    def unchecked(self) -> list[CaseReport]:
        """The cases the run could not decide: the agent gave no answer, or the judge could not decide."""
        return [c for c in self.cases if c.result.outcome in ("error", "undecided")]

    @property
    def unchecked_share(self) -> float | None:
        return len(self.unchecked) / len(self.cases) if self.cases else None

    @property
    def too_unchecked(self) -> bool:
        """More cases unchecked than `max_unchecked` allows: the run cannot say the release holds."""
        share = self.unchecked_share
        return self.max_unchecked is not None and share is not None and share > self.max_unchecked

    @property
    def lost(self) -> list[CaseReport]:
        """The cases that passed in the newest run that decided them and are unchecked now: an
        error or an outage must never hide what may be a regression."""
        return [c for c in self.unchecked if c.previous == "pass"]

    @property
    def exit_code(self) -> ExitCode:
        """7 when a case that passed in the newest run that decided it fails now, or the pass rate is
        under `min_pass`; else 8 when more cases than `max_unchecked` allows are unchecked or a case
        that passed before is unchecked now; else 5 when a result could not be written; else 0.

        The order: 7 is a decided regression, the one finding that says the release is worse, so
        it wins whatever else went wrong; 8 says the run could not tell (the release is unverified,
        never passed), which outranks 5, a bookkeeping failure that leaves every decision standing
        (a rerun under the same run name writes what is missing)."""
        if self.regressed or self.below_min_pass:
            return ExitCode.REGRESSED
        if self.too_unchecked or self.lost:
            return ExitCode.UNCHECKED
        if self.not_written:
            return ExitCode.NOT_WRITTEN
        return ExitCode.OK
