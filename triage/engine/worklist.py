"""Signatures inside the night: tonight's verdicts assigned to failure signatures (known ones read
back from the stored signature scores first), the nights counted, the signature scores in batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry, RunResult
from triage.domain.ports import ScoreReader
from triage.domain.records import StoredScore
from triage.domain.scores import ScoreBody, SignatureMeta, score_id
from triage.domain.tracker import Member as StateMember
from triage.domain.tracker import SignatureState, next_state, stored_states
from triage.domain.worklist import NIGHTS, Member, Night, Signature, Worklist, assign

TITLE_CHARS = 120

log = logging.getLogger("triage")


def night_of(stamp: datetime, end: datetime, length: timedelta) -> int:
    """0 for tonight's window (end - length, end], 1 for the one before, ..."""
    return max(0, int((end - stamp) / length))


def known_signatures(
    rows: Sequence[StoredScore], end: datetime, length: timedelta, config: TriageConfig
) -> tuple[list[Signature], list[Night]]:
    """The signatures and night counts the stored signature scores describe."""
    nights = [Night(n, end - length * (n + 1), end - length * n) for n in range(NIGHTS + 1)]
    sigs: dict[str, Signature] = {}
    for row in sorted(rows, key=lambda r: (r.timestamp, r.id)):
        meta = SignatureMeta.from_stored(row.metadata)
        if row.trace_id is None or not isinstance(row.value, str) or meta.rule_version != config.rule_version:
            continue
        night = night_of(row.timestamp, end, length)
        if night > NIGHTS:
            continue
        sig = sigs.get(row.value)
        if sig is None:
            sig = sigs[row.value] = Signature(
                id=row.value,
                layer=meta.layer,
                component=meta.component,
                terms=frozenset(meta.terms),
                title=meta.title,
            )
        sig.add(night, row.trace_id, row.timestamp)
        nights[night].count(meta.layer, meta.owners)
    return list(sigs.values()), nights


def build_worklist(
    history: ScoreReader, entries: Sequence[Entry], result: RunResult, config: TriageConfig, length: timedelta
) -> Worklist:
    """Assign tonight's entries to signatures (known ones first) and count the nights.

    A night is `length` long (the run's `--since-hours`, without the overlap), counted back from
    the window's end; this run's own entries count as tonight wherever their trace started."""
    rows = history.scores([config.scores.signature], result.end - length * (NIGHTS + 1), result.end + length)
    known, nights = known_signatures(rows, result.end, length, config)
    already = {trace_id for sig in known for trace_id in sig.tonight}
    members = [
        Member(e.trace_id, e.layer.value, e.component, e.question, e.start) for e in entries
    ]
    chosen = assign(members, known)
    for entry in entries:
        sig = chosen[entry.trace_id]
        entry.signature = sig.id
        if entry.trace_id not in already:
            nights[0].count(entry.layer.value, entry.owners)
    seen = {sig.id: sig for sig in [*known, *chosen.values()]}
    tonight = sorted((s for s in seen.values() if s.tonight), key=lambda s: (-len(s.tonight), s.id))
    resolved = sorted((s for s in seen.values() if not s.tonight), key=lambda s: (-s.count, s.id))
    return Worklist(signatures=tonight, resolved=resolved, nights=nights)


def signature_scores(entries: Sequence[Entry], worklist: Worklist, config: TriageConfig) -> list[ScoreBody]:
    """One `triage_signature` score per entry, with what later nights need to read it back."""
    by_id = {sig.id: sig for sig in worklist.signatures}
    name = config.scores.signature
    out = []
    for entry in entries:
        if entry.signature is None or entry.score_time is None or not entry.written:
            continue  # a verdict not written has no signature score either: a rerun writes both
        sig = by_id[entry.signature]
        out.append(
            ScoreBody(
                data_type="CATEGORICAL",
                id=score_id(entry.trace_id, name, config.rule_version),
                trace_id=entry.trace_id,
                name=name,
                value=sig.id,
                comment=f"{sig.layer} / {sig.component}",
                metadata=SignatureMeta(
                    layer=entry.layer.value,
                    component=entry.component,
                    owners=entry.owners,
                    terms=sorted(sig.terms),
                    title=sig.title[:TITLE_CHARS],
                    rule_version=config.rule_version,
                ).to_metadata(),
                timestamp=entry.score_time,
                environment=entry.environment,
            )
        )
    return out


def signature_batches(
    entries: Sequence[Entry], worklist: Worklist, config: TriageConfig, size: int
) -> Iterator[list[ScoreBody]]:
    """`signature_scores` a batch of at most `size` entries at a time (each batch made only when
    asked for), so that the scores to write, and their read-back, never grow with the window."""
    step = max(1, size)
    for start in range(0, len(entries), step):
        writes = signature_scores(entries[start : start + step], worklist, config)
        if writes:
            yield writes


def signature_states(
    history: ScoreReader,
    releases: Mapping[str, str | None],
    worklist: Worklist,
    entries: Sequence[Entry],
    result: RunResult,
    config: TriageConfig,
) -> list[SignatureState]:
    """Tonight's state of each signature seen tonight (`domain.tracker.next_state`): the newest
    stored state of each (the `[tracker] lookback_days`) carried forward, tonight's members with
    the releases of their answers (`releases`: trace id -> release, as the release watch read
    them). A state that cannot be read is logged and started afresh."""
    name = config.scores.signature_state
    lookback = timedelta(days=config.tracker.lookback_days)
    previous, bad = stored_states(history, name, at=result.end, lookback=lookback)
    for reason in bad[:3]:
        log.warning("signature state unreadable (started afresh): %s", reason, extra={"event": "state_unreadable"})
    # a member whose verdict was not written has no signature score: it is not the state's either
    written = [e for e in entries if e.signature is not None and e.written]
    by_signature: dict[str, list[Entry]] = {}
    for entry in written:
        by_signature.setdefault(entry.signature or "", []).append(entry)
    totals = [night.total for night in worklist.nights]
    out = []
    for sig in worklist.signatures:
        if sig.id not in by_signature:
            continue
        members = [
            StateMember(
                trace_id=e.trace_id,
                question=e.question,
                start=e.start,
                release=releases.get(e.trace_id),
                sure=e.findings.sure,
                page=e.findings.answer_url,
                comments=tuple(e.comments),
            )
            for e in by_signature.get(sig.id, [])
        ]
        owners = list(dict.fromkeys(o for e in by_signature.get(sig.id, []) for o in e.owners))
        out.append(
            next_state(
                previous.get(sig.id),
                signature=sig.id,
                layer=sig.layer,
                component=sig.component,
                owners=owners or (previous[sig.id].owners if sig.id in previous else []),
                title=sig.title[:TITLE_CHARS],
                status=sig.status,
                nights=[len(sig.nights.get(n, ())) for n in range(NIGHTS + 1)],
                totals=totals,
                members=members,
                at=result.end,
                judge=result.judge,
                alpha=config.tracker.alpha,
            )
        )
    return out
