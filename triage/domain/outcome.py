"""What a run produced, as the sinks (report, summary) read it: entries, skipped votes, totals.

Kept out of the engine so that a sink never imports the engine that fills these in.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from triage.domain.kernel import one_line
from triage.domain.records import Layer, Trace, Undecided, Usage, Verdict
from triage.domain.releases import ReleaseWindow
from triage.domain.review import JudgeMeasure
from triage.domain.tracker import SignatureState
from triage.domain.worklist import Worklist
from triage.errors import ExitCode

QUESTION_CHARS = 160


def shorten(text: str, limit: int = QUESTION_CHARS) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    return one_line(text, limit)


@dataclass(frozen=True)
class Shard:
    """This process's share of the votes: `index` of `count`, by a stable hash of the trace."""

    index: int = 0
    count: int = 1

    def owns(self, key: str) -> bool:
        if self.count == 1:
            return True
        # never the builtin hash(): it is salted per process, and every shard must agree
        digest = hashlib.sha256(key.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index


@dataclass(frozen=True, slots=True)
class Findings:
    """What makes an entry actionable: where the answer was, what was searched, what was invented.

    Untrusted text (queries, quotes, claims) is cut short here and escaped by the sinks."""

    agent_queries: tuple[str, ...] = ()
    answer_url: str | None = None  # the page that holds the answer
    answer_quote: str | None = None  # a short exact quote of the passage that holds it
    unsupported: tuple[str, ...] = ()  # claims of the answer no passage supports
    searched_again: tuple[str, ...] = ()  # the collections searched again for the question
    #: the facts the layer rests on: (fact, value, the judge that established it)
    decided: tuple[tuple[str, str, str], ...] = ()
    #: the verdict is sure (every judged fact the rule read is `high`), else a suggestion
    sure: bool = False


@dataclass(slots=True)
class Entry:
    """One triaged trace, as the report shows it. Every entry of the window is held until the
    run ends (the report, the worklist): a slotted record, no per-instance dict."""

    trace_id: str
    layer: Layer
    component: str
    owners: list[str]
    reason: str
    question: str
    comments: list[str]
    url: str | None
    injection_suspected: bool = False
    written: bool = False
    findings: Findings = field(default_factory=Findings)
    start: datetime | None = None  # the trace's start
    score_time: datetime | None = None  # the timestamp its scores carry
    environment: str = "default"
    signature: str | None = None

    @classmethod
    def of(
        cls, trace: Trace, verdict: Verdict, *, comments: list[str], findings: Findings, score_time: datetime
    ) -> Entry:
        """The entry of a triaged trace: what the report keeps of the trace and its verdict, picked
        here (the engine hands both over whole), so a datum either holds is a field and a line here."""
        return cls(
            trace_id=trace.id,
            layer=verdict.layer,
            component=verdict.component,
            owners=verdict.owners,
            reason=verdict.reason,
            question=shorten(trace.question),
            comments=comments,
            url=trace.url,
            injection_suspected=verdict.facts.injection_suspected,
            findings=findings,
            start=trace.start_time,
            score_time=score_time,
            environment=trace.environment,
        )


@dataclass(slots=True)
class Skipped:
    """One thumbs-down that was not triaged, as the report shows it."""

    undecided: Undecided
    question: str | None
    comments: list[str]
    url: str | None = None


@dataclass(repr=False)
class RunResult:
    start: datetime
    end: datetime
    votes_seen: int = 0
    thumbs_down: int = 0
    already_triaged: int = 0
    entries: list[Entry] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    written: int = 0
    write: bool = False
    usage: Usage = field(default_factory=Usage)
    judge: str = ""
    search_calls: int = 0
    requests: int = 0
    elapsed: float = 0.0
    input_price: float = 0.0
    output_price: float = 0.0
    #: a cached input token's price (per M tokens); None: the input price
    cached_input_price: float | None = None
    shard: Shard = field(default_factory=Shard)
    #: signatures and the trend over the previous nights; None when the history could not be read
    worklist: Worklist | None = None
    #: tonight's state of each signature seen tonight (its releases, escalation, fix), by id
    signature_states: dict[str, SignatureState] = field(default_factory=dict)
    signatures_written: int = 0
    #: the releases of tonight and the nights before, each against the one before it; None when
    #: the answers carry no release (or they could not be read)
    releases: ReleaseWindow | None = None
    #: how far the judge has been measured against people's labels (`triage calibrate --write`);
    #: None: unmeasured
    judge_measure: JudgeMeasure | None = None

    def __repr__(self) -> str:
        # short on purpose: asyncio.run's task repr holds its result's repr, and Python 3.11 builds
        # that repr when asyncio.Runner puts the SIGINT handler back at the end of the run (the
        # signal module formats the old handler, a partial holding the task, into an error message
        # it then drops). A dataclass repr of every entry was a transient of ~10 KB per trace: 25 MB
        # of peak RSS at 2,000 traces, in the last 0.1 s of the run.
        return (
            f"RunResult({self.start.isoformat()}..{self.end.isoformat()}, {len(self.entries)} entries, "
            f"{len(self.skipped)} skipped, {self.written} written, exit {int(self.exit_code)})"
        )

    @property
    def layer_counts(self) -> Counter[str]:
        return Counter(entry.layer.value for entry in self.entries)

    @property
    def not_written(self) -> list[Skipped]:
        return [s for s in self.skipped if s.undecided.kind == "not_written"]

    @property
    def degraded(self) -> list[Skipped]:
        return [s for s in self.skipped if s.undecided.kind in ("unavailable", "rejected")]

    @property
    def cost(self) -> float:
        return (
            self.usage.input_tokens * self.input_price + self.usage.output_tokens * self.output_price
        ) / 1_000_000

    @property
    def billed_cost(self) -> float:
        """`cost` as billed: calls answered in batches at the batch price, cached input tokens at
        `cached_input_price`."""
        return self.usage.cost(self.input_price, self.output_price, self.cached_input_price)

    @property
    def exit_code(self) -> ExitCode:
        """ERROR on an internal error on some trace; NOT_WRITTEN when some scores were not
        confirmed; DEGRADED when some traces are undecided for a retryable reason; else OK."""
        if any(s.undecided.kind == "error" for s in self.skipped):
            return ExitCode.ERROR
        if self.not_written:
            return ExitCode.NOT_WRITTEN
        if self.degraded:
            return ExitCode.DEGRADED
        return ExitCode.OK
