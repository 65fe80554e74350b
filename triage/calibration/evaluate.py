"""`triage eval`: run the job (`triage feedback`) over a labelled set with each judge, then calibrate.

A set is a folder with `traces.jsonl` (the `triage import` format, one thumbs-down per trace),
`labels.jsonl` (`triage calibrate`'s label format; an evaluation set's lines also carry the whole
`facts`, the `component` and a `split`) and optionally `triage.toml` (the configuration: the index
folders to search again). Each judge gets a fresh embedded store with the set imported (votes moved
to an hour ago), and a `triage feedback --write --force` run in this process: the application's
own feedback call (`FeedbackJob`, given by `triage.app`), its real writes, its log kept beside the
store. Its decisions are then read back from the store and compared with the labels.

`replay` means the labels' own facts replayed: the ceiling of everything after the judge.

Beside the overall layer accuracy each run reports its *sure part*: the verdicts whose every
judged fact on the rule's path is `high` (`RulePath.sure`; the rest are suggestions), their layer
accuracy and the share of the labelled cases they cover.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from triage import jsonl
from triage.calibration.calibrate import (
    LAYER_CLASSES,
    UNDECIDED,
    agreement,
    calibrate,
    decisions_from_scores,
    labels_from_file,
)
from triage.domain.config import TriageConfig
from triage.domain.outcome import RunResult
from triage.domain.review import Decision, EvalMiss, EvalReport, EvalRun, Label
from triage.domain.rule import owners
from triage.errors import TriageError, UsageError
from triage.judges import HEURISTIC, REPLAY, name_of, spec_of
from triage.redact import redact
from triage.sinks.report import summary_json, summary_record
from triage.sources.export_file import vote_shift, vote_span
from triage.sources.store import Store

SPLITS_ALL = "all"
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class EvalSet:
    folder: Path

    @property
    def traces(self) -> Path:
        return self.folder / "traces.jsonl"

    @property
    def labels(self) -> Path:
        return self.folder / "labels.jsonl"

    @property
    def config(self) -> Path | None:
        path = self.folder / "triage.toml"
        return path if path.is_file() else None

    def check(self) -> None:
        for path in (self.traces, self.labels):
            if not path.is_file():
                raise UsageError(f"{self.folder} is not an evaluation set: {path.name} is missing")


@dataclass(frozen=True)
class EvalOptions:
    judges: tuple[str, ...] = (HEURISTIC, REPLAY)
    split: str | None = None  # None: every split, and all together
    concurrency: int = 8
    keep: Path | None = None  # keep each judge's store, facts and log here
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True)
class EvalJob:
    """One `triage feedback --write --force` on a judge's fresh store, as `evaluate` asks for it."""

    store: Path
    judge: str  # the judge's spec, as `--judge` takes it
    since_hours: float
    now: datetime
    concurrency: int
    facts_file: Path
    log_file: Path  # the run's log lines go here
    config: Path | None  # the set's triage.toml; None: the built-in defaults


#: runs an `EvalJob` in this process: its result, or the `TriageError` that ended it
FeedbackJob = Callable[[EvalJob], RunResult]


_LABELLED = re.compile(r"^([A-Za-z0-9_.-]{1,40})=(.+)$")


def split_label(judge: str) -> tuple[str, str]:
    """`label=spec` names a run (`llm-perfect=llm`); a bare spec is its own label."""
    found = _LABELLED.match(judge)
    return (found[1], found[2]) if found else (judge, judge)


def _slug(judge: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name_of(judge)).strip("-") or "judge"


def _raw_labels(path: Path) -> dict[str, dict[str, Any]]:
    """Each trace's label line as written (for the component and the replayed facts)."""
    out: dict[str, dict[str, Any]] = {}
    # bytes, as labels_from_file reads them: a line that is not UTF-8 is that line's problem alone
    for _, line in jsonl.lines(path.read_bytes()):
        try:
            record = jsonl.parse(line)
        except ValueError:
            continue  # listed as a bad label by labels_from_file
        if isinstance(record, dict) and isinstance(record.get("trace_id"), str):
            out[record["trace_id"]] = record
    return out


def _unsearched(record: Mapping[str, Any] | None) -> bool:
    facts = record.get("facts") if record else None
    return isinstance(facts, dict) and facts.get("agent_searched") is False


def _span_hours(traces: Path, shift: timedelta, now: datetime) -> float:
    """A window that holds every vote of the set once moved: back to the oldest, plus margin."""
    oldest = vote_span(traces)[0] + shift
    return (now - oldest).total_seconds() / 3600 + 2


@dataclass
class _Run:
    judge: str
    exit_code: int
    decisions: dict[str, Decision]
    summary: dict[str, Any]
    error: str | None


def _run_judge(
    judge: str,
    eval_set: EvalSet,
    raw: Mapping[str, Mapping[str, Any]],
    config: TriageConfig,
    options: EvalOptions,
    run_job: FeedbackJob,
    work: Path,
) -> _Run:
    label, judge = split_label(judge)
    slug = _slug(label)
    store = work / f"{slug}.sqlite"
    now = options.now
    shift = vote_shift(eval_set.traces, now)
    with Store(store) as db:
        db.import_file(eval_set.traces, shift=shift)
    spec = judge
    if judge == REPLAY:  # bare, here: the labels' own facts replayed
        truth = work / "labels.facts.jsonl"
        truth.write_text(
            "".join(
                json.dumps({**record["facts"], "trace_id": trace_id}) + "\n"
                for trace_id, record in raw.items()
                if isinstance(record.get("facts"), dict)
            ),
            encoding="utf-8",
        )
        spec = spec_of(REPLAY, str(truth))
    job = EvalJob(
        store=store,
        judge=spec,
        since_hours=_span_hours(eval_set.traces, shift, now),
        now=now,
        concurrency=options.concurrency,
        facts_file=work / f"{slug}.facts.jsonl",
        log_file=work / f"{slug}.log",
        config=eval_set.config,
    )
    try:
        result = run_job(job)
    except TriageError as ex:
        return _Run(label, int(ex.exit_code), {}, {}, redact(str(ex))[-MAX_ERROR_CHARS:])
    (work / f"{slug}.summary.json").write_text(summary_json(result), encoding="utf-8")
    summary = summary_record(result)
    with Store(store) as db:
        names = [config.scores.layer, config.scores.component]
        rows = db.scores(names, now - timedelta(days=3650), now + timedelta(days=1))
    scores = config.scores
    decisions = decisions_from_scores(
        rows, scores.layer, config.rule_version, config.agent.issues_collection, scores.component
    )
    return _Run(label, int(result.exit_code), decisions, summary, None)


def _one_split(
    run: _Run,
    split: str,
    labels: Sequence[Label],
    raw: Mapping[str, Mapping[str, Any]],
    config: TriageConfig,
) -> EvalRun:
    chosen = [lab for lab in labels if split == SPLITS_ALL or lab.split == split]
    report = calibrate(chosen, run.decisions)
    components = owners_right = with_component = 0
    layered = sure_cases = sure_right = 0
    misses = []
    component_misses = []
    for label in chosen:
        decision = run.decisions.get(label.trace_id)
        component = raw.get(label.trace_id, {}).get("component")
        found = decision.layer.value if decision is not None and decision.layer is not None else UNDECIDED
        if isinstance(component, str) and label.layer is not None:
            with_component += 1
            components += decision is not None and decision.component == component
            expected = owners(label.layer, component, config)
            owners_right += decision is not None and decision.owners == expected
        if label.layer is None:
            continue
        layered += 1
        if decision is not None and decision.sure:
            # the sure part: a verdict whose every judged fact is `high` (`RulePath.sure`)
            sure_cases += 1
            sure_right += found == label.layer.value
        miss = EvalMiss(
            trace_id=label.trace_id,
            human=label.layer.value,
            judge=found if decision is not None else "not triaged",
            human_component=component if isinstance(component, str) else None,
            judge_component=decision.component if decision is not None else None,
        )
        if found != label.layer.value:
            misses.append(miss)
        elif isinstance(component, str) and decision is not None and decision.component != component:
            component_misses.append(miss)
    triaged = sum(lab.trace_id in run.decisions for lab in chosen)
    calls = run.summary.get("judge_calls")
    total = run.summary.get("triaged")
    return EvalRun(
        judge=run.judge,
        split=split,
        cases=len(chosen),
        triaged=triaged,
        layer=report.layer if chosen else agreement([], LAYER_CLASSES),
        facts=report.facts,
        component_accuracy=components / with_component if with_component else None,
        owner_accuracy=owners_right / with_component if with_component else None,
        judge_calls_per_trace=calls / total if isinstance(calls, int) and isinstance(total, int) and total else None,
        exit_code=run.exit_code,
        error=run.error,
        sure_cases=sure_cases,
        sure_right=sure_right,
        sure_accuracy=sure_right / sure_cases if sure_cases else None,
        sure_coverage=sure_cases / layered if layered else None,
        misses=misses,
        component_misses=component_misses,
    )


def evaluate(eval_set: EvalSet, config: TriageConfig, options: EvalOptions, run_job: FeedbackJob) -> EvalReport:
    """Every judge over the set, each through a `triage feedback` run (`run_job`), against the labels."""
    eval_set.check()
    if not options.judges:
        raise UsageError("name at least one judge")
    labels, bad_labels = labels_from_file(eval_set.labels)
    raw = _raw_labels(eval_set.labels)
    # where the trace proves the agent never searched, the rule reads no judged fact: a set's
    # complete facts there are no test of a judge (the engine does not even ask one)
    labels = [lab.model_copy(update={"facts": {}}) if _unsearched(raw.get(lab.trace_id)) else lab for lab in labels]
    splits = sorted({lab.split for lab in labels if lab.split})
    wanted = [options.split] if options.split else [SPLITS_ALL, *splits]
    if options.split and options.split not in splits:
        raise UsageError(f"no label is in split {options.split!r} (splits: {', '.join(splits) or 'none'})")
    runs: list[EvalRun] = []
    with tempfile.TemporaryDirectory(prefix="triage-eval-") as tmp:
        work = options.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for judge in options.judges:
            run = _run_judge(judge, eval_set, raw, config, options, run_job, work)
            runs += [_one_split(run, split, labels, raw, config) for split in wanted]
    return EvalReport(set=str(eval_set.folder), runs=runs, bad_labels=bad_labels)
