"""Signatures inside the night: tonight's verdicts assigned to failure signatures (known ones read
back from the stored signature scores first), the nights counted, the signature scores in batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from triage.domain.config import TriageConfig
from triage.domain.outcome import Entry, RunResult
from triage.domain.ports import ScoreReader
from triage.domain.records import StoredScore
from triage.domain.scores import ScoreBody, SignatureMeta, score_id
from triage.domain.worklist import NIGHTS, Member, Night, Signature, Worklist, assign

TITLE_CHARS = 120


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

