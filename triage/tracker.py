"""`triage issues sync`: the signatures' newest states into their owners' trackers, one issue each.

The flow: the newest state of each signature (`domain.tracker.stored_states`, from the
`[scores] signature_state` scores of the lookback) and the reviewers' confirmations of its traces;
per signature and owner repository (`[tracker] allow`, `repositories`): the issue looked up by its
marker, then what to do (`Step`s: create, comment, close, reopen) or why not (`Draft`: below the
threshold's radar it is not listed; qualifying but untrusted, or an owner not allowed, it is). A dry
run (the default) prints the plan; `--apply` does it, step after step, one signature's failure
never costing the others. Every step is idempotent: an issue is found by its marker before one is
opened, a comment by its event's marker before one is posted, so a rerun, two runs at once or a
lost answer never doubles one (`sinks.github` looks up again before it repeats a lost write).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from triage.domain.checks import CheckResult
from triage.domain.config import ReviewNames, TrackerConfig
from triage.domain.ports import ScoreReader, ScoreSink
from triage.domain.tracker import (
    Draft,
    Qualifies,
    SignatureState,
    Step,
    SyncResult,
    Tracker,
    TrackerIssue,
    events,
    fixed,
    issue_marker,
    marked,
    repository_of,
    stored_states,
    told_by_body,
    trusted,
)
from triage.errors import TriageError
from triage.redact import redact
from triage.sinks.issues import event_comment, issue_body, issue_title

log = logging.getLogger("triage")


@dataclass(frozen=True)
class SyncOptions:
    now: datetime
    apply: bool = False


def read_states(
    history: ScoreReader, config_name: str, review: ReviewNames, *, now: datetime, lookback: timedelta
) -> tuple[dict[str, SignatureState], list[str]]:
    """The newest state of each signature in the lookback, with each one's reviewer confirmations
    (a `negative` verdict on one of its traces) counted in."""
    states, bad = stored_states(history, config_name, at=now, lookback=lookback)
    traces = {t for state in states.values() for t in state.traces}
    if traces:
        rows = history.scores([review.verdict], now - lookback, now + timedelta(days=1))
        negative = {r.trace_id for r in rows if r.trace_id in traces and r.value == "negative"}
        states = {
            sig: state.model_copy(update={"confirmed": sum(1 for t in state.traces if t in negative)})
            for sig, state in states.items()
        }
    return states, bad


def plan(
    states: Mapping[str, SignatureState],
    config: TrackerConfig,
    kappa_of: Callable[[str], float | None],
    tracker: Tracker | None,
    trace_url: Callable[[str], str | None],
) -> tuple[list[Step], list[Draft]]:
    """What to write for each signature (in signature order), and the drafts. Reads the trackers
    (issues by marker, their comments); writes nothing."""
    qualifies = Qualifies(config.min_count, config.min_share, config.on_escalating)
    label = config.labels[0]
    listed: dict[str, list[TrackerIssue]] = {}

    def held(repo: str, marker: str) -> TrackerIssue | None:
        """The issue carrying `marker`: each repository's issues listed once a run."""
        if tracker is None:
            return None
        if repo not in listed:
            listed[repo] = tracker.issues(repo, label)
        return marked(listed[repo], marker)

    steps: list[Step] = []
    drafts: list[Draft] = []
    for sig, state in sorted(states.items()):
        why = qualifies(state)
        trust = trusted(state, kappa_of(state.judge), config.min_kappa)
        for owner in state.owners:
            repo = repository_of(owner, config.repositories, config.allow)
            issue = held(repo, issue_marker(sig)) if repo else None
            if issue is None:
                if why is None or state.is_fixed or state.status == "resolved":
                    continue  # nothing to open: below the threshold, or no longer failing
                if repo is None:
                    drafts.append(Draft(sig, owner, state.title, f"{why}; owner {owner!r} is not in [tracker] allow"))
                elif trust is None:
                    unsure = f"not sure, not confirmed, judge {state.judge!r} not measured at {config.min_kappa}"
                    drafts.append(Draft(sig, owner, state.title, f"{why}; verdict not trusted ({unsure})"))
                else:
                    body = issue_body(state, trust=trust, trace_url=trace_url, include_comments=config.include_comments)
                    steps.append(Step("create", sig, repo, None, issue_title(state), body, issue_marker(sig)))
                continue
            assert repo is not None
            steps += _updates(state, repo, issue, tracker)
    return steps, drafts


def _updates(state: SignatureState, repo: str, issue: TrackerIssue, tracker: Tracker | None) -> list[Step]:
    """The comments (and the close or reopen) an existing issue needs for the state's events."""
    told = "\n".join(c.body for c in tracker.comments(repo, issue.number)) if tracker is not None else ""
    out: list[Step] = []
    open_now = issue.state == "open"
    for event in events(state):
        if told_by_body(issue.body, event):
            continue
        body = event_comment(state, event)
        marker = body.split("\n", 1)[0]
        done = marker in told
        if event.kind == "fixed":
            if not done:
                out.append(Step("comment", state.signature, repo, issue.number, event.key, body, marker))
            if open_now:
                out.append(Step("close", state.signature, repo, issue.number, event.key))
        elif event.kind == "regressed":
            if not open_now:
                out.append(Step("reopen", state.signature, repo, issue.number, event.key))
            if not done:
                out.append(Step("comment", state.signature, repo, issue.number, event.key, body, marker))
            open_now = True
        elif open_now and not done:
            out.append(Step("comment", state.signature, repo, issue.number, event.key, body, marker))
    return out


def apply(steps: Sequence[Step], tracker: Tracker, labels: Sequence[str]) -> list[Step]:
    """Each step written, in order; a failed one is kept with its error and the signature's later
    steps are skipped (a rerun does them), the other signatures go on."""
    done: list[Step] = []
    broken: set[str] = set()
    opened: dict[tuple[str, str], int] = {}
    for step in steps:
        if step.signature in broken:
            done.append(replace(step, error="skipped: an earlier step of this signature failed"))
            continue
        try:
            done.append(_write(step, tracker, labels, opened))
        except TriageError as ex:
            broken.add(step.signature)
            done.append(replace(step, error=redact(str(ex))[:300]))
            log.warning("issues sync: %s %s on %s failed: %s", step.kind, step.signature, step.repo, redact(str(ex)),
                        extra={"event": "issues_step_failed"})  # fmt: skip
    return done


def _write(step: Step, tracker: Tracker, labels: Sequence[str], opened: dict[tuple[str, str], int]) -> Step:
    number = step.number if step.number is not None else opened.get((step.repo, step.signature))
    if step.kind == "create":
        issue = tracker.create(step.repo, title=step.title, body=step.body, labels=labels, marker=step.marker)
        opened[(step.repo, step.signature)] = issue.number
        return replace(step, number=issue.number, url=issue.url)
    if number is None:
        raise TriageError(f"no issue to {step.kind} for {step.signature}")
    if step.kind == "comment":
        tracker.comment(step.repo, number, step.body, step.marker)
        return step
    state: Literal["open", "closed"] = "closed" if step.kind == "close" else "open"
    reason: Literal["completed", "reopened"] = "completed" if step.kind == "close" else "reopened"
    issue = tracker.edit(step.repo, number, state=state, state_reason=reason)
    return replace(step, url=issue.url)


def sync(
    states: Mapping[str, SignatureState],
    *,
    config: TrackerConfig,
    kappa_of: Callable[[str], float | None],
    tracker: Tracker | None,
    trace_url: Callable[[str], str | None],
    options: SyncOptions,
    unreadable: Sequence[str] = (),
) -> SyncResult:
    """Plan, and with `options.apply` write, every signature's issue. Without a tracker (no token)
    only a dry run is possible: it plans as if no issue existed yet, and says so."""
    steps, drafts = plan(states, config, kappa_of, tracker, trace_url)
    qualifies = Qualifies(config.min_count, config.min_share, config.on_escalating)
    result = SyncResult(
        applied=options.apply, looked_up=tracker is not None, signatures=len(states), drafts=drafts,
        unreadable=list(unreadable), below=sum(1 for s in states.values() if qualifies(s) is None),
    )  # fmt: skip
    if options.apply and tracker is not None:
        result.steps = apply(steps, tracker, config.labels)
    else:
        result.steps = steps
    return result


def record_fixes(
    history: ScoreReader,
    sink: ScoreSink,
    result: CheckResult,
    *,
    release: str,
    state_name: str,
    lookback: timedelta,
    at: datetime,
) -> list[str]:
    """After `triage check --release R`: each signature whose cases in this run all passed is fixed
    in R by this run (its newest state carried forward, `domain.tracker.fixed`), written as its state
    score. Returns the signatures marked; a case that errs, fails or is undecided keeps its
    signature open. A write that does not land is logged (the next check run writes it again)."""
    by_signature: dict[str, list[str]] = {}
    for report in result.cases:
        case = report.result.case
        if case.signature:
            by_signature.setdefault(case.signature, []).append(report.result.outcome)
    passed = sorted(sig for sig, outcomes in by_signature.items() if all(o == "pass" for o in outcomes))
    if not passed:
        return []
    states, _ = stored_states(history, state_name, at=at, lookback=lookback)
    cases = {r.result.case.signature: r.result.case for r in result.cases if r.result.case.signature}
    bodies = []
    for sig in passed:
        case = cases[sig]
        state = states.get(sig) or SignatureState(
            signature=sig, layer=case.layer or "", component=case.component or "", owners=list(case.owners),
            title=case.question, status="new", at=at,
        )  # fmt: skip
        bodies.append(fixed(state, release=release, run=result.run_name, at=at).score(state_name))
    outcome = sink.write_scores(bodies)
    if outcome.failed:
        log.warning("%d fixed signature states not written (the next check run writes them): %s",
                    len(outcome.failed), next(iter(outcome.failed.values())),
                    extra={"event": "fixed_states_not_written"})  # fmt: skip
    return [sig for sig, body in zip(passed, bodies, strict=True) if body.id not in outcome.failed]
