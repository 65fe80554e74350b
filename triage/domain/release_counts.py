"""What the release watch counts: the answers, votes and verdicts of each release as a source gives
them (`ReleaseCounts` from Langfuse's metrics API or the embedded store's GROUP BY, or one row per
answer, `TraceRow`, tallied one trace at a time by `ReleaseTally`), where an answer belongs
(`TracePlace`), and the releases in the order they were first seen (`in_order`). Pure (no I/O);
the comparisons and the gate are `domain.releases`'."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    model_validator,
)

from triage.domain.kernel import version_key
from triage.domain.records import Layer


class ReleaseRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReleaseFigures(ReleaseRecord):
    """What a release's counts and its stats (`ReleaseStats`) both hold: the release, when it was
    seen, and its counts. `answers`: its traces; `votes`: the answers with a vote (one per answer,
    however many votes it got); `thumbs_down`: the answers with a thumbs-down."""

    release: str = Field(min_length=1)
    version: str | None = None
    first_seen: AwareDatetime
    last_seen: AwareDatetime
    answers: NonNegativeInt
    votes: NonNegativeInt
    thumbs_down: NonNegativeInt


class ReleaseCounts(ReleaseFigures):
    """One release's counts over a window, as a source gives them: its figures, and `layers`: the
    triaged thumbs-down by layer (the rest are untriaged); `signatures`: the failures' signatures,
    counted."""

    layers: dict[Layer, NonNegativeInt] = Field(default_factory=dict)
    signatures: dict[str, NonNegativeInt] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> ReleaseCounts:
        where = f"release {self.release!r}"
        if self.last_seen < self.first_seen:
            raise ValueError(f"{where}: last seen ({self.last_seen}) before first seen ({self.first_seen})")
        if not self.thumbs_down <= self.votes <= self.answers:
            raise ValueError(
                f"{where}: needs thumbs-down <= votes <= answers, not {self.thumbs_down}, {self.votes}, {self.answers}"
            )
        if self.triaged > self.thumbs_down:
            raise ValueError(f"{where}: {self.triaged} triaged failures but {self.thumbs_down} thumbs-down")
        if sum(self.signatures.values()) > self.thumbs_down:
            raise ValueError(f"{where}: more failures in signatures than thumbs-down ({self.thumbs_down})")
        return self

    @property
    def triaged(self) -> int:
        return sum(self.layers.values())

    @property
    def untriaged(self) -> int:
        return self.thumbs_down - self.triaged

    def over(self, per: Per) -> int:
        """The denominator of its rates."""
        return self.answers if per == "answers" else self.votes


class TraceRow(ReleaseRecord):
    """One answer's row, for a source that reads traces rather than counts. A trace may come in
    several rows (its vote in one, its verdict in another): `from_rows` merges them."""

    trace_id: str = Field(min_length=1)
    release: str | None = None  # None or blank: a trace that carries no release
    version: str | None = None
    timestamp: AwareDatetime
    #: the vote's value (0: thumbs-down, as `records.Vote.is_thumbs_down`); None: no vote
    vote: float | None = Field(default=None, allow_inf_nan=False)
    #: the triaged layer of its thumbs-down; None: not triaged (yet)
    layer: Layer | None = None
    signature: str | None = None


class RowNote(ReleaseRecord):
    """A trace's rows that do not agree with one another, and what was counted of it."""

    trace_id: str
    reason: str


class ReleaseRows(ReleaseRecord):
    """What a source's rows make: counts per release (by first seen), the answers whose trace
    carries no release (they belong to no release, so no comparison), and the notes."""

    releases: list[ReleaseCounts]
    unreleased: int
    notes: list[RowNote]


@dataclass
class _Tally:
    """One release's counts so far: its answers' first and last start, its versions (answers, and
    the earliest start of each), votes, thumbs-down, layers, signatures; never the answers."""

    answers: int = 0
    first: datetime | None = None
    last: datetime | None = None
    versions: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    votes: int = 0
    thumbs_down: int = 0
    layers: Counter[Layer] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)

    def seen(self, at: datetime, versions: Iterable[str]) -> None:
        self.answers += 1
        self.first = at if self.first is None else min(self.first, at)
        self.last = at if self.last is None else max(self.last, at)
        for version in versions:
            held, earliest = self.versions.get(version, (0, at))
            self.versions[version] = (held + 1, min(earliest, at))

    def version(self) -> str | None:
        """The most common version (the one seen earliest on a tie)."""
        if not self.versions:
            return None
        return min(self.versions.items(), key=lambda item: (-item[1][0], item[1][1], item[0]))[0]


class ReleaseTally:
    """Counts per release from one answer's rows at a time (`add`), however many answers: the
    memory is the releases', not the answers' (a source read in trace order gives each trace's rows
    together). `from_rows` is this over rows given in any order."""

    def __init__(self) -> None:
        self._tallies: dict[str, _Tally] = {}
        self.notes: list[RowNote] = []
        self.unreleased = 0

    def add(self, trace_id: str, trace_rows: Sequence[TraceRow]) -> None:
        """One answer (trace): all its rows. See `from_rows` for how they are counted."""
        named = sorted({r.release for r in trace_rows if r.release is not None and r.release.strip()})
        if not named:
            self.unreleased += 1
            return
        if len(named) > 1:
            self.notes.append(
                RowNote(trace_id=trace_id, reason=f"named by releases {', '.join(named)}: counted in none")
            )
            return
        tally = self._tallies.setdefault(named[0], _Tally())
        tally.seen(min(r.timestamp for r in trace_rows), {v for r in trace_rows if (v := r.version) is not None})
        votes = [r.vote for r in trace_rows if r.vote is not None]
        down = any(v == 0 for v in votes)
        tally.votes += bool(votes)
        tally.thumbs_down += down
        layer_set = {r.layer for r in trace_rows if r.layer is not None}
        signature_set = {s for r in trace_rows if (s := r.signature)}
        for what, found in (("layer", layer_set), ("signature", signature_set)):
            if found and not down:
                self.notes.append(
                    RowNote(trace_id=trace_id, reason=f"a {what} without a thumbs-down: not counted")
                )
            elif len(found) > 1:
                names = ", ".join(sorted(str(f) for f in found))
                self.notes.append(
                    RowNote(trace_id=trace_id, reason=f"{what}s {names} on one answer: counted as none")
                )
        if down and len(layer_set) == 1:
            tally.layers[layer_set.pop()] += 1
        if down and len(signature_set) == 1:
            tally.signatures[signature_set.pop()] += 1

    def result(self) -> ReleaseRows:
        releases = []
        for name, t in self._tallies.items():
            assert t.first is not None and t.last is not None  # a tally is made by its first answer
            releases.append(
                ReleaseCounts(
                    release=name, version=t.version(), first_seen=t.first, last_seen=t.last, answers=t.answers,
                    votes=t.votes, thumbs_down=t.thumbs_down, layers=dict(t.layers), signatures=dict(t.signatures),
                )  # fmt: skip
            )
        return ReleaseRows(releases=in_order(releases), unreleased=self.unreleased, notes=self.notes)


def from_rows(rows: Iterable[TraceRow]) -> ReleaseRows:
    """Counts per release from per-answer rows.

    A trace is one answer. Its release is the one its rows name (rows naming none do not count
    against it); a trace whose rows name two releases is counted in neither, and noted. It is voted
    when a row has a vote, a thumbs-down when a vote is 0. A layer or a signature counts only with a
    thumbs-down (else it is noted and left out); two different ones on one trace count as none
    (untriaged), noted. A release's version is its traces' most common (the earliest's on a tie).
    """
    by_trace: dict[str, list[TraceRow]] = {}
    for row in rows:
        by_trace.setdefault(row.trace_id, []).append(row)
    tally = ReleaseTally()
    for trace_id, trace_rows in sorted(by_trace.items(), key=lambda item: (min(r.timestamp for r in item[1]), item[0])):
        tally.add(trace_id, trace_rows)
    return tally.result()


#: a bucket's origin: a Monday at midnight UTC, where hour, day and week buckets all begin
_BUCKET_ORIGIN = datetime(1970, 1, 5, tzinfo=UTC)


def _seen_bucket(seen: datetime, resolution: timedelta) -> datetime:
    """`seen` as precisely as the source knows it: the start of its bucket (the time itself at 0)."""
    if resolution <= timedelta(0):
        return seen
    return seen - (seen - _BUCKET_ORIGIN) % resolution


def in_order(releases: Iterable[ReleaseCounts], resolution: timedelta = timedelta(0)) -> list[ReleaseCounts]:
    """By first seen, compared at `resolution` (a metrics API's time bucket: two releases first
    seen in one hour are a tie, whichever came first inside it, even when a voted answer gave one
    of them an exact time); a tie by the version order of their names (`version_key`), then of
    their versions."""

    def key(r: ReleaseCounts) -> tuple[object, ...]:
        return (_seen_bucket(r.first_seen, resolution), version_key(r.release), version_key(r.version or ""), r.release)

    ordered = sorted(releases, key=key)
    names = Counter(r.release for r in ordered)
    if twice := sorted(name for name, n in names.items() if n > 1):
        raise ValueError(f"releases given more than once: {', '.join(twice)}")
    return ordered


class ReleaseAnswers(ReleaseRecord):
    """A window's answers per release, as a source counts them (no votes or verdicts yet: their
    `votes`, `thumbs_down`, `layers` and `signatures` are 0), the answers that carry no release, and
    how they were counted (`counted_by`, said in the log and the report).

    `resolution`: how precise `first_seen` and `last_seen` are (0: exact; a metrics API's time
    bucket: the first answer is somewhere in the bucket that starts at `first_seen`, the last in the
    one that ends at `last_seen`)."""

    releases: list[ReleaseCounts]
    unreleased: NonNegativeInt = 0
    counted_by: str
    resolution: timedelta = timedelta(0)


class TracePlace(ReleaseRecord):
    """Where one answer belongs: its release (None: it carries none), version and start."""

    release: str | None = None
    version: str | None = None
    start: AwareDatetime


def merge_answers(
    answers: Sequence[ReleaseCounts], voted: Sequence[ReleaseCounts], resolution: timedelta = timedelta(0)
) -> list[ReleaseCounts]:
    """Each release's answers (from `answers`, a source's counts) with its votes, thumbs-down, layers
    and signatures (from `voted`, `from_rows` over the answers with a vote or a verdict).

    The voted answers are some of the release's answers; where a source counted fewer (data a
    metrics store has not caught up with), the voted ones are the count. A release with votes and no
    counted answers is kept the same way. When the source's times are buckets (`resolution`), a
    voted answer's exact time inside the first (or last) bucket is the better estimate: two releases
    first seen in the same hour are still a tie for their order (`in_order` at `resolution`), as
    one's first answer may be voted on and the other's not."""
    counted = {r.release: r for r in answers}
    with_votes = {r.release: r for r in voted}
    merged = []
    for name in dict.fromkeys([*counted, *with_votes]):
        a, v = counted.get(name), with_votes.get(name)
        if v is None:
            assert a is not None
            merged.append(a)
            continue
        if a is None:
            merged.append(v)
            continue
        first = v.first_seen if a.first_seen <= v.first_seen < a.first_seen + resolution else a.first_seen
        last = v.last_seen if a.last_seen - resolution < v.last_seen <= a.last_seen else a.last_seen
        merged.append(
            v.model_copy(
                update={
                    "version": a.version or v.version,
                    "first_seen": min(first, v.first_seen),
                    "last_seen": max(last, v.last_seen),
                    "answers": max(a.answers, v.answers),
                }
            )
        )
    return in_order(merged, resolution)


#: what a rate is counted over: every answer (trace) of the release, or the answers with a vote
Per = Literal["answers", "votes"]
