"""Reading scores: the window's votes, and which traces already carry a triage score (v3 API)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pydantic

from triage.domain.kernel import as_utc, iso_z
from triage.domain.records import StoredScore, Vote
from triage.domain.scores import score_id
from triage.domain.votes import BadVote, WindowVotes, in_window, stored_time
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged
from triage.sources.langfuse.wire import (
    ScoreRow,
    ScoresPage,
    chunks,
    newer,
    to_stored,
    to_vote,
    unreadable_vote,
    vote_value,
)

#: how far before a window's start a vote read reaches: a vote changed in the window keeps the
#: timestamp of its first write, and v3 filters on timestamps only (`votes`)
VOTE_LOOKBACK = timedelta(days=30)

SCORES_PAGE = 100  # v3 scores: more is a 400
IDS_PER_READ = 100  # ids per `?id=` read, matching the page size so one page answers it

_PARAMS = {"from_timestamp": "fromTimestamp", "to_timestamp": "toTimestamp"}


class ScoreReads:
    def __init__(self, http: LangfuseHttp, vote_lookback: timedelta = VOTE_LOOKBACK) -> None:
        self.http = http
        self.vote_lookback = vote_lookback

    def rows(
        self, what: str, *, on_bad: Callable[[Any, pydantic.ValidationError], None] | None = None, **params: Any
    ) -> Iterator[ScoreRow]:
        """Every row of a v3 scores query, page by page (newest first); stops when the caller does.

        A row that breaks the API contract is a `LangfuseError`, or, given `on_bad`, handed to it
        and skipped (a vote read lists it as bad input and the night goes on).

        Plain HTTP, not `api.scores.get_many`: the SDK's response conversion costs about 15 ms per
        score row (measured: 1.5 s per 100-row page), more than the request itself.
        """
        query = {_PARAMS.get(k, k): v for k, v in params.items() if v is not None}
        for key in ("fromTimestamp", "toTimestamp"):
            if key in query:
                query[key] = iso_z(query[key])

        def page(cursor: str | None) -> ScoresPage:
            page_query = {**query, "limit": SCORES_PAGE, **({"cursor": cursor} if cursor else {})}
            try:
                body = self.http.call(what, lambda: self.http.raw("GET", "api/public/v3/scores", params=page_query))
                return ScoresPage.model_validate(body)
            except HttpStatus as ex:
                raise fail(what, ex) from None
            except pydantic.ValidationError as ex:
                raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex

        for raw in paged(page, what):
            try:
                row = ScoreRow.model_validate(raw)
            except pydantic.ValidationError as ex:
                if on_bad is None:
                    raise LangfuseError(f"{what}: response does not match the API contract: {ex}") from ex
                on_bad(raw, ex)
                continue
            yield row

    def by_id(self, ids: Sequence[str], what: str, **params: Any) -> dict[str, ScoreRow]:
        """The current row of each id that exists, reading `?id=` in chunks of 100."""
        found: dict[str, ScoreRow] = {}
        for chunk in chunks(list(dict.fromkeys(ids)), IDS_PER_READ):
            wanted = set(chunk)
            for row in self.rows(what, id=",".join(chunk), **params):
                if row.id in wanted and newer(row, found.get(row.id)):
                    found[row.id] = row
                if wanted <= found.keys():
                    break  # every id found: no need for the next page (older rows of the same ids)
        return found

    def votes(self, score_name: str, start: datetime, end: datetime) -> WindowVotes:
        """The votes cast or changed in the window (`in_window`), the current row of each; and the
        rows that cannot be read, each with its reason.

        v3 filters scores by timestamp only, and a changed vote keeps its first timestamp (the
        upsert rule), so the read reaches `vote_lookback` further back and keeps the rows whose
        timestamp or updatedAt is in the window, as they arrive. Held as votes from the first read
        on, not as score rows: a night's rows (metadata, subject) held twice over (the window read
        and the re-read) were about 5 KB per vote at the peak, for a `Vote` of about 1.5 KB."""
        start, end = as_utc(start), as_utc(end)
        newest: dict[str, _Held] = {}
        broken: dict[str, BadVote] = {}  # rows that break the contract, by id
        nameless: list[BadVote] = []  # ... and those without an id

        def set_aside(raw: Any, error: pydantic.ValidationError) -> None:
            bad = unreadable_vote(raw, error)
            if bad.id is None:
                nameless.append(bad)
            else:
                broken[bad.id] = bad

        def set_aside_in_window(raw: Any, error: pydantic.ValidationError) -> None:
            # a broken row whose times can be read and are outside the window is another night's
            times = _raw_times(raw)
            if times is None or in_window(*times, start, end):
                set_aside(raw, error)

        # no `value` filter: a changed vote can leave a stale row that such a filter still matches
        for row in self.rows(
            "reading votes",
            on_bad=set_aside_in_window,
            name=score_name,
            from_timestamp=start - self.vote_lookback,
            to_timestamp=end,
            fields="subject,details",
        ):
            held = newest.get(row.id)
            if held is None and not in_window(as_utc(row.timestamp), as_utc(row.updated_at), start, end):
                continue  # cast and last changed outside the window
            if held is None or _order(row) > held.order:
                newest[row.id] = _Held.of(row)
        # The window may hold an old row of a vote changed since (its new row is outside the
        # window): re-read the thumbs-down candidates by id, which returns the current row.
        down = [sid for sid, held in newest.items() if held.may_be_down]
        for chunk in chunks(down, IDS_PER_READ):  # the reads `by_id` makes, a chunk's rows at a time
            current = self.by_id(
                chunk, "re-reading votes", on_bad=set_aside, name=score_name, fields="subject,details"
            )
            for sid, row in current.items():
                newest[sid] = _Held.of(row)
        read = WindowVotes(votes=[], bad=nameless)
        for sid, held in newest.items():
            if sid in broken:
                read.bad.append(broken.pop(sid))  # its current row breaks the contract
            elif isinstance(held.vote, Vote):
                read.votes.append(held.vote)
            elif held.vote is not None:
                read.bad.append(held.vote)
        read.bad.extend(broken.values())
        read.votes.sort(key=lambda v: (v.timestamp, v.id))
        return read

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        # held as stored scores from the first read on, not as score rows (the worklist reads
        # eight nights of signature scores: every row of them held twice over grew with the window)
        newest: dict[str, tuple[tuple[datetime, datetime], StoredScore]] = {}
        for name in dict.fromkeys(names):
            for row in self.rows(
                f"reading {name} scores",
                name=name,
                from_timestamp=as_utc(start),
                to_timestamp=as_utc(end),
                fields="subject,details,annotation",
            ):
                held = newest.get(row.id)
                order = _order(row)
                if held is None or order > held[0]:
                    newest[row.id] = (order, to_stored(row))
        return sorted((stored for _, stored in newest.values()), key=lambda s: (s.timestamp, s.id))

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        by_id = {score_id(t, score_name, rule_version): t for t in dict.fromkeys(trace_ids)}
        found = self.by_id(list(by_id), "reading triaged traces", name=score_name)
        return {by_id[sid] for sid in found}


def _raw_times(raw: Any) -> tuple[datetime, datetime | None] | None:
    """The timestamp and updatedAt of a row that breaks the contract, when both can be read."""
    if not isinstance(raw, dict):
        return None
    try:
        updated = raw.get("updatedAt")
        return stored_time(raw.get("timestamp"), "timestamp"), (
            stored_time(updated, "updatedAt") if updated is not None else None
        )
    except ValueError:
        return None


def _order(row: ScoreRow) -> tuple[datetime, datetime]:
    """Which of two rows of a score is newer (`wire.newer`): later timestamp, then later updatedAt."""
    return as_utc(row.timestamp), as_utc(row.updated_at)


@dataclass(frozen=True, slots=True)
class _Held:
    """What `votes` keeps of the newest row of a score id: its order, its value, its vote (None
    when the row is no vote: a categorical score, an experiment's; a `BadVote` when it cannot be read)."""

    order: tuple[datetime, datetime]
    value: float | None
    vote: Vote | BadVote | None

    @property
    def may_be_down(self) -> bool:
        """A thumbs-down candidate, whose current row is re-read."""
        return self.value == 0 or (isinstance(self.vote, BadVote) and self.vote.may_be_thumbs_down)

    @classmethod
    def of(cls, row: ScoreRow) -> _Held:
        return cls(_order(row), vote_value(row), to_vote(row))
