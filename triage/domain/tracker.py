"""A failure signature's life across releases, and the plan that keeps its tracker issue in step.

**The life.** Each night the job stores one state per signature seen (`SignatureState`, the
`[scores] signature_state` score on the signature's own trace id, `state_trace`): its nights'
counts, the release it was first and last seen in, whether it is escalating (tonight's share of the
night's failures above the nights before it beyond chance: the release watch's one-sided Fisher
test), and what `triage check` found: `fixed_in` (the release a check run passed every case of it
in, `fixed`) and `regressed_in` (the release it came back in after that: a member whose answer is of
that release or a later one). A state carries forward what earlier states said, so any night reads
the newest one alone (`latest_states`).

**The plan** (`triage issues sync`, `plan`): per signature and owner repository, one issue found by
the marker in its body (`issue_marker`). It is opened the first time the signature qualifies
(`[tracker]` `min_count`, `min_share`, escalating) *and* its verdict is trusted (`trusted`: a sure
verdict, a reviewer's confirmation, or a judge whose last calibration's kappa lower bound clears
`min_kappa`); else it stays a draft, listed with the reason. An open issue gets a comment when the
signature recurs on a later night or starts escalating, and is closed with the release and the
check run that showed it fixed; a closed one is reopened with a comment when it regressed. Every
comment carries a marker of its event (`event_marker`), so a rerun never posts one twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage.domain.kernel import iso_z, version_key
from triage.domain.ports import ScoreReader
from triage.domain.records import StoredScore
from triage.domain.scores import ScoreBody, score_id
from triage.domain.stats import fisher_greater
from triage.errors import ExitCode

StateStatus = Literal["new", "recurring", "regressed", "resolved", "fixed"]

#: at most this many of a signature's traces, questions and docs pages travel with its state
KEPT_TRACES = 20
KEPT_QUESTIONS = 3
KEPT_PAGES = 5
QUESTION_CHARS = 300


def state_trace(signature: str) -> str:
    """The trace id a signature's state score is stored on (no trace of an agent has it)."""
    return f"triage-signature-{signature}"


class SignatureState(BaseModel):
    """What a signature is, as of one night (or one check run): the metadata of its state score."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    signature: str
    layer: str
    component: str
    owners: list[str] = Field(default_factory=list)
    title: str = ""
    status: StateStatus
    #: the night (or check run) this state was made for
    at: datetime
    #: members per night, tonight first (the worklist's nights)
    nights: list[int] = Field(default_factory=list)
    #: tonight's members over the night's failures (0 when there were none)
    share: float = 0.0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    first_release: str | None = None
    last_release: str | None = None
    escalating: bool = False
    escalation_p: float | None = None
    fixed_in: str | None = None
    fixed_by: str | None = None
    fixed_at: datetime | None = None
    regressed_in: str | None = None
    regressed_at: datetime | None = None
    #: tonight's members whose verdict is sure (every judged fact the rule read `high`)
    sure: int = 0
    #: members a reviewer confirmed (a `negative` verdict on the trace)
    confirmed: int = 0
    #: the judge of tonight's verdicts
    judge: str = ""
    traces: list[str] = Field(default_factory=list)
    questions: list[str] = Field(default_factory=list)
    #: the public docs pages that hold the answer (the judge's finding), never a user's text
    pages: list[str] = Field(default_factory=list)
    #: users' comments: shown in a tracker only where `[tracker] include_comments`
    comments: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(self.nights)

    @property
    def tonight(self) -> int:
        return self.nights[0] if self.nights else 0

    @property
    def is_fixed(self) -> bool:
        """Fixed by a check run and not come back since."""
        return self.fixed_at is not None and (self.regressed_at is None or self.regressed_at < self.fixed_at)

    @property
    def has_regressed(self) -> bool:
        return self.regressed_at is not None and (self.fixed_at is None or self.regressed_at > self.fixed_at)

    def score(self, name: str) -> ScoreBody:
        """The state as a score on `state_trace`: one per signature and night (a rerun upserts it)."""
        on = state_trace(self.signature)
        return ScoreBody(
            id=score_id(on, name, iso_z(self.at)),
            name=name,
            value=self.status,
            data_type="CATEGORICAL",
            timestamp=self.at,
            trace_id=on,
            comment=f"{self.layer} / {self.component}: {self.status}",
            metadata=self.model_dump(mode="json"),
        )


def latest_states(rows: Iterable[StoredScore]) -> tuple[dict[str, SignatureState], list[str]]:
    """The newest readable state of each signature, and a reason for each row that is none (a row
    that cannot be read is listed, never a crash: the next night writes a good one)."""
    out: dict[str, SignatureState] = {}
    bad: list[str] = []
    for row in sorted(rows, key=lambda r: (r.timestamp, r.id)):
        try:
            state = SignatureState.model_validate(row.metadata)
        except ValidationError as ex:
            bad.append(f"score {row.id}: not a signature state ({ex.error_count()} problems)")
            continue
        out[state.signature] = state
    return out, bad


def stored_states(
    history: ScoreReader, name: str, *, at: datetime, lookback: timedelta
) -> tuple[dict[str, SignatureState], list[str]]:
    """`latest_states` of the `name` scores stored in the `lookback` before `at` (and the day after
    it: a state is stamped with its night's end)."""
    return latest_states(history.scores([name], at - lookback, at + timedelta(days=1)))


def escalation(nights: Sequence[int], totals: Sequence[int], alpha: float) -> tuple[bool, float | None]:
    """Is tonight's share of the night's failures above the nights before it beyond chance? A
    one-sided Fisher test (`stats.fisher_greater`) of tonight's members among tonight's failures
    against the earlier nights' members among theirs; None: not testable (no earlier failures)."""
    if not nights or not totals:
        return False, None
    tonight, total = nights[0], max(totals[0], nights[0])
    earlier, earlier_total = sum(nights[1:]), max(sum(totals[1:]), sum(nights[1:]))
    if earlier_total == 0 or tonight == 0:
        return False, None
    p = fisher_greater(tonight, total, earlier, earlier_total)
    return p < alpha, p


@dataclass(frozen=True)
class Member:
    """A trace of the signature tonight, as the state sees it."""

    trace_id: str
    question: str
    start: datetime | None
    release: str | None
    sure: bool
    page: str | None
    comments: tuple[str, ...] = ()


def later_or_same(release: str, than: str) -> bool:
    """`release` is `than` or a later one in version order (`releases.version_key`)."""
    return version_key(release) >= version_key(than)


def next_state(
    previous: SignatureState | None,
    *,
    signature: str,
    layer: str,
    component: str,
    owners: Sequence[str],
    title: str,
    status: StateStatus,
    nights: Sequence[int],
    totals: Sequence[int],
    members: Sequence[Member],
    at: datetime,
    judge: str,
    alpha: float,
) -> SignatureState:
    """Tonight's state of a signature from its previous one and tonight's members: releases and
    the fix carried forward, escalation tested, a regression found where a member is of the fixed
    release or a later one."""
    releases = [m.release for m in sorted(members, key=lambda m: (m.start is None, m.start or at)) if m.release]
    first_release = previous.first_release if previous and previous.first_release else None
    first_release = first_release or (releases[0] if releases else None)
    escalating, p = escalation(nights, totals, alpha)
    regressed_in = previous.regressed_in if previous else None
    regressed_at = previous.regressed_at if previous else None
    fixed_in = previous.fixed_in if previous else None
    fixed_at = previous.fixed_at if previous else None
    if fixed_in is not None and fixed_at is not None:
        back = [r for r in releases if later_or_same(r, fixed_in)]
        if back and (regressed_at is None or regressed_at < fixed_at):
            regressed_in, regressed_at = max(back, key=version_key), at
    state_status: StateStatus = status
    if regressed_at is not None and (fixed_at is None or regressed_at > fixed_at) and members:
        state_status = "regressed"
    newest = sorted(members, key=lambda m: (m.start is not None, m.start or at), reverse=True)
    earlier_traces = previous.traces if previous else []
    traces = list(dict.fromkeys([*(m.trace_id for m in newest), *earlier_traces]))[:KEPT_TRACES]
    asked = [m.question[:QUESTION_CHARS] for m in newest]
    questions = list(dict.fromkeys([*asked, *(previous.questions if previous else [])]))
    pages = list(dict.fromkeys([*(m.page for m in newest if m.page), *(previous.pages if previous else [])]))
    said = list(dict.fromkeys([*(c for m in newest for c in m.comments), *(previous.comments if previous else [])]))
    starts = [m.start for m in members if m.start is not None]
    first_seen = min([*starts, *([previous.first_seen] if previous and previous.first_seen else [])], default=None)
    last_seen = max([*starts, *([previous.last_seen] if previous and previous.last_seen else [])], default=None)
    return SignatureState(
        signature=signature,
        layer=layer,
        component=component,
        owners=list(owners),
        title=title,
        status=state_status,
        at=at,
        nights=list(nights),
        share=(nights[0] / totals[0]) if nights and totals and totals[0] > 0 else 0.0,
        first_seen=first_seen,
        last_seen=last_seen,
        first_release=first_release,
        last_release=releases[-1] if releases else (previous.last_release if previous else None),
        escalating=escalating,
        escalation_p=p,
        fixed_in=fixed_in,
        fixed_by=previous.fixed_by if previous else None,
        fixed_at=fixed_at,
        regressed_in=regressed_in,
        regressed_at=regressed_at,
        sure=sum(1 for m in members if m.sure),
        confirmed=previous.confirmed if previous else 0,
        judge=judge,
        traces=traces,
        questions=questions[:KEPT_QUESTIONS],
        pages=pages[:KEPT_PAGES],
        comments=said[:KEPT_QUESTIONS],
    )


def fixed(state: SignatureState, *, release: str, run: str, at: datetime) -> SignatureState:
    """`state` after a check run (`run`, on `release`) passed every case of the signature."""
    return state.model_copy(update={"status": "fixed", "fixed_in": release, "fixed_by": run, "fixed_at": at, "at": at})


# -- the trust gate ----------------------------------------------------------------------------


def trusted(state: SignatureState, kappa_low: float | None, min_kappa: float) -> str | None:
    """Why the signature's verdict may go to a tracker, or None when it may not: a sure verdict,
    a reviewer's confirmation, or the judge's last measured kappa lower bound at `min_kappa`."""
    if state.sure:
        return f"{state.sure} sure verdict(s)"
    if state.confirmed:
        return f"{state.confirmed} confirmed by a reviewer"
    if kappa_low is not None and kappa_low >= min_kappa:
        return f"judge {state.judge} measured: kappa lower bound {kappa_low:.2f} >= {min_kappa:.2f}"
    return None


# -- the tracker and the plan ------------------------------------------------------------------

IssueState = Literal["open", "closed"]
ActionKind = Literal["create", "comment", "close", "reopen", "edit"]

_MARKER = re.compile(r"<!-- triage-signature: ([\w.-]+) -->")


def issue_marker(signature: str) -> str:
    """What an issue's body carries so the sync finds it again (never by title: people edit those)."""
    return f"<!-- triage-signature: {signature} -->"


def event_marker(signature: str, event: str) -> str:
    """What a comment carries so the same event is never commented twice."""
    return f"<!-- triage-event: {signature} {event} -->"


_AS_OF = re.compile(r"<!-- triage-as-of: (\d{4}-\d{2}-\d{2}) -->")


def as_of_marker(state: SignatureState) -> str:
    """What an issue's body carries of the night it was written for: the nights up to it are told
    by the body itself, so only later ones get a comment."""
    return f"<!-- triage-as-of: {state.at.strftime('%Y-%m-%d')} -->"


def told_by_body(body: str, event: Event) -> bool:
    """A recurrence or escalation of a night the issue's body was written for (or before)."""
    found = _AS_OF.search(body)
    if found is None or event.kind not in ("recurred", "escalating"):
        return False
    return event.key.split(":", 1)[1] <= found.group(1)


def marked_signature(body: str) -> str | None:
    found = _MARKER.search(body)
    return found.group(1) if found else None


@dataclass(frozen=True)
class TrackerIssue:
    number: int
    title: str
    body: str
    state: IssueState
    labels: tuple[str, ...]
    url: str


@dataclass(frozen=True)
class TrackerComment:
    id: int
    body: str


def marked(issues: Iterable[TrackerIssue], marker: str) -> TrackerIssue | None:
    """The issue whose body carries `marker` (the lowest number, should two ever carry it)."""
    found = [issue for issue in issues if marker in issue.body]
    return min(found, key=lambda issue: issue.number) if found else None


class Tracker(Protocol):
    """An owner's issue tracker (GitHub's issues: `sinks.github.GitHubIssues`)."""

    def issues(self, repo: str, label: str) -> list[TrackerIssue]: ...

    def create(self, repo: str, *, title: str, body: str, labels: Sequence[str], marker: str) -> TrackerIssue: ...

    def comments(self, repo: str, number: int) -> list[TrackerComment]: ...

    def comment(self, repo: str, number: int, body: str, marker: str) -> TrackerComment | None: ...

    def edit(
        self,
        repo: str,
        number: int,
        *,
        body: str | None = None,
        state: IssueState | None = None,
        state_reason: Literal["completed", "not_planned", "reopened"] | None = None,
    ) -> TrackerIssue: ...


@dataclass(frozen=True)
class Event:
    """Something a signature did that its open issue should be told of, once."""

    key: str
    kind: Literal["recurred", "escalating", "fixed", "regressed"]


def events(state: SignatureState) -> list[Event]:
    """The events of a state, each with a key that names it once (a night, a release)."""
    out: list[Event] = []
    night = state.at.strftime("%Y-%m-%d")
    if state.is_fixed and state.fixed_in:
        out.append(Event(f"fixed:{state.fixed_in}", "fixed"))
        return out
    if state.has_regressed and state.regressed_in:
        out.append(Event(f"regressed:{state.regressed_in}", "regressed"))
    if state.tonight and state.count > state.tonight:
        out.append(Event(f"night:{night}", "recurred"))
    if state.escalating:
        out.append(Event(f"escalating:{night}", "escalating"))
    return out


@dataclass(frozen=True)
class Qualifies:
    min_count: int
    min_share: float
    on_escalating: bool

    def __call__(self, state: SignatureState) -> str | None:
        """Why the signature deserves an issue, or None."""
        if state.count >= self.min_count:
            return f"{state.count} failures (at least {self.min_count})"
        if self.min_share > 0 and state.share >= self.min_share:
            return f"{state.share:.0%} of the night's failures (at least {self.min_share:.0%})"
        if self.on_escalating and state.escalating:
            return "escalating"
        return None


def repository_of(owner: str, repositories: Mapping[str, str], allow: Sequence[str]) -> str | None:
    """The GitHub repository an owner's issues go to: configured, else the owner itself when it is
    `owner/name`; None for an owner not on the allow-list (or no repository)."""
    if owner not in allow:
        return None
    repo = repositories.get(owner, owner)
    return repo if re.fullmatch(r"[\w.-]+/[\w.-]+", repo) else None


@dataclass(frozen=True)
class Step:
    """One write to a tracker."""

    kind: ActionKind
    signature: str
    repo: str
    #: the issue's number (None: the issue is still to be opened)
    number: int | None
    #: the title to open with, or what the step says (the event of a comment)
    title: str
    body: str = ""
    marker: str = ""
    #: after a write: the issue's address, or why the write failed
    url: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Draft:
    """A signature that qualifies for an issue and gets none, with why."""

    signature: str
    owner: str
    title: str
    reason: str


@dataclass
class SyncResult:
    """What `triage issues sync` planned, did and left."""

    applied: bool
    #: the trackers were read (False: no token, a dry run that assumes no issue exists yet)
    looked_up: bool
    signatures: int = 0
    steps: list[Step] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)
    #: signatures below every threshold (`Qualifies`): no issue, no draft
    below: int = 0
    #: stored states that could not be read
    unreadable: list[str] = field(default_factory=list)
    requests: int = 0

    @property
    def failed(self) -> list[Step]:
        return [s for s in self.steps if s.error is not None]

    @property
    def exit_code(self) -> ExitCode:
        """5 when a write did not land (a rerun finishes it), else 0."""
        return ExitCode.NOT_WRITTEN if self.failed else ExitCode.OK
