"""Reading scores: the window's votes, and which traces already carry a triage score (v3 API)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pydantic

from triage.domain.records import StoredScore, Vote
from triage.domain.scores import score_id
from triage.errors import LangfuseError
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp, fail, paged
from triage.sources.langfuse.wire import (
    ScoreRow,
    ScoresPage,
    as_utc,
    chunks,
    iso_z,
    newer,
    to_stored,
    to_vote,
    vote_value,
)

SCORES_PAGE = 100  # v3 scores: more is a 400
IDS_PER_READ = 100  # ids per `?id=` read, matching the page size so one page answers it

_PARAMS = {"from_timestamp": "fromTimestamp", "to_timestamp": "toTimestamp"}


class ScoreReads:
    def __init__(self, http: LangfuseHttp) -> None:
        self.http = http

    def rows(self, what: str, **params: Any) -> Iterator[ScoreRow]:
        """Every row of a v3 scores query, page by page (newest first); stops when the caller does.

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

        yield from paged(page, what)

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

    def votes(self, score_name: str, start: datetime, end: datetime) -> list[Vote]:
        newest: dict[str, ScoreRow] = {}
        # no `value` filter: a changed vote can leave a stale row that such a filter still matches
        for row in self.rows(
            "reading votes",
            name=score_name,
            from_timestamp=as_utc(start),
            to_timestamp=as_utc(end),
            fields="subject,details",
        ):
            if newer(row, newest.get(row.id)):
                newest[row.id] = row
        # The window may hold an old row of a vote changed since (its new row is outside the
        # window): re-read the thumbs-down candidates by id, which returns the current row.
        down = [sid for sid, row in newest.items() if vote_value(row) == 0]
        if down:
            newest.update(self.by_id(down, "re-reading votes", name=score_name, fields="subject,details"))
        votes = [vote for row in newest.values() if (vote := to_vote(row)) is not None]
        votes.sort(key=lambda v: (v.timestamp, v.id))
        return votes

    def scores(self, names: Sequence[str], start: datetime, end: datetime) -> list[StoredScore]:
        newest: dict[str, ScoreRow] = {}
        for name in dict.fromkeys(names):
            for row in self.rows(
                f"reading {name} scores",
                name=name,
                from_timestamp=as_utc(start),
                to_timestamp=as_utc(end),
                fields="subject,details,annotation",
            ):
                if newer(row, newest.get(row.id)):
                    newest[row.id] = row
        return sorted((to_stored(row) for row in newest.values()), key=lambda s: (s.timestamp, s.id))

    def triaged(self, trace_ids: Sequence[str], score_name: str, rule_version: str) -> set[str]:
        by_id = {score_id(t, score_name, rule_version): t for t in dict.fromkeys(trace_ids)}
        found = self.by_id(list(by_id), "reading triaged traces", name=score_name)
        return {by_id[sid] for sid in found}
