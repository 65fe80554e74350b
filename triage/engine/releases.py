"""The release watch inside the night and `triage releases`: each release of the window counted
(answers, votes, verdicts), each against the one before it, and the gate between two named ones.

Counts are aggregated where they are read, one trace at a time in trace order where the source can
sort (`ReadsInTraceOrder`), so memory grows with the releases, not the votes."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import chain, groupby
from typing import TypeVar

from triage.domain.config import TriageConfig
from triage.domain.kernel import iso_z
from triage.domain.outcome import Entry
from triage.domain.ports import (
    ReadsInTraceOrder,
    ReleaseSource,
    ScoreReader,
    TraceSource,
)
from triage.domain.records import Layer, StoredScore, Vote
from triage.domain.release_counts import (
    Per,
    ReleaseCounts,
    ReleaseRows,
    ReleaseTally,
    TraceRow,
    merge_answers,
)
from triage.domain.releases import ALPHA, ReleaseWindow, gate, watch
from triage.domain.rule import owners as rule_owners
from triage.domain.scores import JobScoreNames, current_scores
from triage.domain.tracker import SignatureState
from triage.domain.votes import rated_trace
from triage.errors import SourceError, UsageError

log = logging.getLogger("triage")

T = TypeVar("T")


#: the traces placed per `trace_places` call while the release watch counts (Langfuse: ten
#: requests of 100 ids; the store: two queries)
TRACES_PER_PLACE = 1000


def _in_trace_order(items: Iterable[T], trace_of: Callable[[T], str], what: str) -> Iterator[T]:
    """`items` as they come, checked to be in trace order: the count of a trace is made from its
    rows together, so a source out of order would count a trace twice."""
    last = ""
    for item in items:
        trace = trace_of(item)
        if trace < last:
            raise SourceError(f"the {what} did not come in trace order ({trace!r} after {last!r})")
        last = trace
        yield item


def _verdicts(
    stored: Iterator[StoredScore], names: JobScoreNames, rule_version: str, tonight: Sequence[Entry]
) -> Iterator[tuple[str, Verdict]]:
    """Each trace's current verdict (`current_scores` of its stored scores, tonight's entry over
    them), in trace order, from the stored scores in trace order."""
    tonight_by = {e.trace_id: (e.layer, e.component, e.signature) for e in tonight}

    def held() -> Iterator[tuple[str, Verdict]]:
        for trace_id, group in groupby(stored, key=lambda score: score.trace_id):
            if trace_id is None or trace_id in tonight_by:
                continue
            for job in current_scores(list(group), names, rule_version).values():
                signature = job.signature.value if job.signature is not None else None
                text = signature if isinstance(signature, str) else None
                yield trace_id, (job.layer_value, job.component_value, text)

    return heapq.merge(held(), sorted(tonight_by.items()), key=lambda item: item[0])


def _count_voted(
    source: ReleaseSource,
    traces: TraceSource,
    scores: ScoreReader,
    config: TriageConfig,
    start: datetime,
    end: datetime,
    tonight: Sequence[Entry],
    components: dict[Layer, set[str]],
    placed: dict[str, str | None] | None = None,
) -> tuple[ReleaseRows, int, int]:
    """The window's votes and verdicts counted per release (`ReleaseTally`), one trace at a time:
    the votes and the job's scores are read in trace order (a `ReadsInTraceOrder` source sorts them
    as it reads, a page at a time; another is read whole and sorted), merged, and each trace placed
    (`trace_places`, `TRACES_PER_PLACE` at a time) and counted. Memory: the releases', plus the
    votes on conversations (placed first) and tonight's entries, not the window's votes. Also the
    votes on answers from outside the window, and those whose rated turn is not there yet. Adds to
    `components` each layer's components."""
    names = JobScoreNames(layer=config.scores.layer, component=config.scores.component,
                          signature=config.scores.signature)  # fmt: skip
    score_names = [config.scores.layer, config.scores.component, config.scores.signature]
    votes: Iterator[Vote]
    stored: Iterator[StoredScore]
    if isinstance(source, ReadsInTraceOrder):
        votes = source.votes_in_trace_order(config.scores.vote, start, end)
    else:
        votes = iter(sorted(source.cast_votes(config.scores.vote, start, end).votes, key=lambda v: v.trace_id or ""))
    if isinstance(scores, ReadsInTraceOrder):
        stored = scores.scores_in_trace_order(score_names, start, end)
    else:
        stored = iter(sorted(scores.scores(score_names, start, end), key=lambda s: s.trace_id or ""))
    votes = _in_trace_order(votes, lambda v: v.trace_id or "", "votes")
    stored = _in_trace_order(stored, lambda s: s.trace_id or "", "job's scores")
    # the votes on a conversation (no trace) come first: each for the turn it rates, as the job places it
    on_sessions: list[Vote] = []
    first = next(votes, None)
    while first is not None and not first.trace_id:
        on_sessions.append(first)
        first = next(votes, None)
    session_ids = sorted({v.session_id for v in on_sessions if v.session_id})
    sessions = traces.session_traces(session_ids) if session_ids else {}
    rated: list[tuple[str, Vote]] = []
    unplaced = 0
    for vote in on_sessions:
        turn = rated_trace(vote, sessions.get(vote.session_id, [])) if vote.session_id else None
        if isinstance(turn, str):
            rated.append((turn, vote))
        else:
            unplaced += 1
    rated.sort(key=lambda item: item[0])
    on_traces = ((v.trace_id or "", v) for v in chain([first] if first is not None else [], votes))
    voted = heapq.merge(on_traces, rated, key=lambda item: item[0])
    tagged: Iterator[tuple[str, Vote | Verdict]] = heapq.merge(
        voted, _verdicts(stored, names, config.rule_version, tonight), key=lambda item: item[0]
    )
    tally = ReleaseTally()
    outside = 0
    tonight_ids = {e.trace_id for e in tonight}

    def count(chunk: list[tuple[str, list[Vote | Verdict]]]) -> None:
        nonlocal outside
        places = source.trace_places([trace_id for trace_id, _ in chunk])
        if placed is not None:  # tonight's answers' releases, for their signatures' states
            placed.update((t, p.release) for t, p in places.items() if t in tonight_ids)
        for trace_id, said in chunk:
            place = places.get(trace_id)
            if place is not None and not start <= place.start < end:
                place = None
            rows: list[TraceRow] = []
            for item in said:
                if isinstance(item, Vote):
                    if place is None:
                        outside += 1
                    else:
                        rows.append(TraceRow(trace_id=trace_id, release=place.release, version=place.version,
                                             timestamp=place.start, vote=item.value))  # fmt: skip
                    continue
                layer, component, signature = item
                if place is None or (layer is None and signature is None):
                    continue
                rows.append(TraceRow(trace_id=trace_id, release=place.release, version=place.version,
                                     timestamp=place.start, layer=layer, signature=signature))  # fmt: skip
                if layer is not None:
                    components.setdefault(layer, set()).add(component or config.agent.default_component)
            if rows:
                tally.add(trace_id, rows)

    chunk: list[tuple[str, list[Vote | Verdict]]] = []
    for trace_id, group in groupby(tagged, key=lambda item: item[0]):
        chunk.append((trace_id, [item for _, item in group]))
        if len(chunk) >= TRACES_PER_PLACE:
            count(chunk)
            chunk = []
    if chunk:
        count(chunk)
    return tally.result(), outside, unplaced


def gather_releases(
    source: ReleaseSource,
    traces: TraceSource,
    scores: ScoreReader,
    config: TriageConfig,
    start: datetime,
    end: datetime,
    *,
    tonight: Sequence[Entry] = (),
    alpha: float = ALPHA,
    per: Per = "answers",
    gate_pair: tuple[str, str] | None = None,
    states: Sequence[SignatureState] = (),
    placed: dict[str, str | None] | None = None,
) -> ReleaseWindow:
    """The releases of the answers started in [start, end), each against the one before it
    (`domain.releases.watch`); with `gate_pair` (candidate, baseline), the release gate between
    those two (`domain.releases.gate`), a `UsageError` naming the window's releases when one of
    them has no answer in it.

    The answers per release come from the source (`release_answers`: Langfuse's metrics API, the
    store's GROUP BY). Then, per answer of the window: its votes cast in the window (a vote on a
    conversation counts for the turn it rates, as the job places it), and its failure's layer and
    signature, the job's current verdict (`current_scores`), tonight's `tonight` entries over the
    stored ones; read in trace order and counted one answer at a time (`_count_voted`). The owners
    of a layer are the configuration's (`rule.owners`) for the components its failures were given.
    Releases are ordered by first seen at the source's resolution, then in version order."""
    answers = source.release_answers(start, end)
    notes: list[str] = []
    counts: list[ReleaseCounts] = []
    components: dict[Layer, set[str]] = {}
    if answers.releases:
        read, outside, unplaced = _count_voted(
            source, traces, scores, config, start, end, tonight, components, placed
        )
        counts = merge_answers(answers.releases, read.releases, answers.resolution)
        if outside:
            notes.append(f"{outside} votes on answers that started before the window (or are unknown): not counted")
        if unplaced:
            notes.append(f"{unplaced} votes on a conversation whose rated turn is not there yet: not counted")
        if read.notes:
            notes.append(f"{len(read.notes)} answers whose rows disagree, e.g. {read.notes[0].reason}")

    def owners_of(layer: Layer) -> list[str]:
        found = sorted(components.get(layer) or {config.agent.default_component})
        return list(dict.fromkeys(o for component in found for o in rule_owners(layer, component, config)))

    watched = watch(counts, alpha=alpha, per=per, owners=owners_of, resolution=answers.resolution)
    log.info(
        "releases %s .. %s: %d, answers counted by %s; worse than the one before: %s",
        start.isoformat(timespec="minutes"),
        end.isoformat(timespec="minutes"),
        len(watched.releases),
        answers.counted_by,
        ", ".join(watched.flagged) or "none",
        extra={"event": "releases", "flagged": watched.flagged},
    )
    for note in notes:
        log.info("releases: %s", note, extra={"event": "releases_note"})
    gated = None
    if gate_pair is not None:
        by_name = {c.release: c for c in counts}
        unknown = [name for name in gate_pair if name not in by_name]
        if unknown:
            found = ", ".join(sorted(by_name)) or "none"
            raise UsageError(
                f"release {', '.join(map(repr, unknown))} has no answer started between {iso_z(start)} and "
                f"{iso_z(end)} (--since-hours); the releases of that window: {found}"
            )
        candidate, baseline = gate_pair
        if candidate == baseline:
            raise UsageError(f"--candidate and --baseline name the same release ({candidate!r})")
        gated = gate(by_name[candidate], by_name[baseline], alpha, per=per, owners=owners_of)
    named = {r.release for r in watched.releases}
    lives = sorted(
        (s for s in states if {s.first_release, s.fixed_in, s.regressed_in} & named),
        key=lambda s: (not s.has_regressed, s.fixed_in is None, s.signature),
    )
    return ReleaseWindow(
        start=start, end=end, counted_by=answers.counted_by, unreleased=answers.unreleased,
        watch=watched, gate=gated, notes=notes, signatures=lives,
    )  # fmt: skip


Verdict = tuple[Layer | None, str | None, str | None]  # a trace's layer, component, signature
