"""The relay's core: votes, verdicts and channel scores to score rows with deterministic ids, the
operations on them (upsert, create-only, replace, delete, list), and where each write went.

Ids: `domain.scores.relay_score_id(name, answer, author)` where the answer is `trace:<id>` or
`session:<id>:<turn>`; a row the ledger already holds keeps its id (ids written before the
collision-free form included). Timestamp: the first write's, kept in the ledger, so a changed vote
is a true overwrite in Langfuse (same id, name and timestamp) and in the embedded store.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from triage.domain.config import HUMAN, CalibrationConfig, DeclaredScore, RelayConfig, ReviewNames
from triage.domain.kernel import iso_ms, parse_time
from triage.domain.review import Verdict
from triage.domain.scores import END_USER, BadScore, DataType, PersonMeta, ScoreBody, relay_score_id
from triage.relay.bodies import Answer, Feedback, ScoreIn
from triage.relay.commits import GroupCommit, LedgerDown
from triage.relay.outbox import Sink, Worker
from triage.relay.storage import MAX_PAGE, ListingPage, Row, Tx, decode_cursor, encode_cursor
from triage.relay.web import Metrics, Problem
from triage.retry import Clock

log = logging.getLogger("triage.relay")

Mode = Literal["upsert", "create", "replace"]
#: `verdict=negative` lists the negative queue: the answers people voted down that a reviewer
#: judged, the false alarms among them
NEGATIVE_QUEUE: tuple[Verdict, ...] = ("negative", "false_alarm")


@dataclass
class Written:
    """A write's answer: the ids, and where the write is durable now."""

    ids: list[str]
    cleared: list[str]
    where: Literal["store", "outbox"]

    def body(self) -> dict[str, Any]:
        return {"ids": self.ids, "cleared": self.cleared, "stored": self.where}


class _Wanted(NamedTuple):
    """A score a request sets: its name, kind (vote, verdict, score), wire value, type, comment."""

    name: str
    kind: str
    value: Any
    data_type: DataType
    comment: str | None


def check_value(decl: DeclaredScore, value: Any) -> Any:
    """The wire value of `value` for a score declared as `decl`; 422 when it does not fit."""
    name, kind = decl.name, decl.data_type
    if kind == "BOOLEAN":
        if isinstance(value, bool) or value in (0, 1):
            return 1 if value else 0
        raise Problem(422, f"{name} is BOOLEAN: the value must be true/false or 1/0")
    if kind == "NUMERIC":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Problem(422, f"{name} is NUMERIC: the value must be a finite number")
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits: no float, no score
            number = math.inf
        if not math.isfinite(number):
            raise Problem(422, f"{name} is NUMERIC: the value must be a finite number")
        if isinstance(value, int) and abs(value) > 2**53:
            value = number  # beyond a float's exact integers: sent as the float it is stored as
        if (decl.min is not None and value < decl.min) or (decl.max is not None and value > decl.max):
            raise Problem(422, f"{name} must be within [{decl.min}, {decl.max}]")
        return value
    if not isinstance(value, str) or not value:
        raise Problem(422, f"{name} is {kind}: the value must be a non-empty string")
    if len(value) > decl.max_length:
        raise Problem(422, f"{name} is at most {decl.max_length} characters")
    if kind == "CATEGORICAL" and decl.categories and value not in decl.categories:
        raise Problem(422, f"{name} must be one of {', '.join(decl.categories)}")
    return value


class Relay:
    """One per process: the ledger, the sink, the worker (for an outbox-delivered sink), metrics."""

    def __init__(
        self,
        *,
        ledger: GroupCommit,
        sink: Sink,
        config: RelayConfig,
        clock: Clock,
        names: ReviewNames | None = None,
        metrics: Metrics | None = None,
        worker: Worker | None = None,
    ) -> None:
        self.ledger = ledger
        self.sink = sink
        self.config = config
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.worker = worker
        #: the scores people write (the vote's name is `[scores] vote`, the one the night reads;
        #: the verdict's, the calibration config's): `TriageConfig.review_names()`
        self.names = names or ReviewNames.of(CalibrationConfig())
        #: a verdict's field (its body name) -> its score's name
        self.fields = self.names.verdict_scores()
        self._depth: tuple[int, int, float | None] | None = None
        #: when the last write the ledger could not commit was refused; None once one succeeds
        self.write_failed_at: float | None = None
        self._undeclared: set[str] = set()
        self._undeclared_sources: set[str] = set()
        self._depth_at = 0.0
        # the model is fixed for the process: look its names up once, not on every request
        self._decls = {n: self._lookup(n) for n in self.names.relay_writes()}
        self._max_text = self.config.max_text(self.names)

    def max_text(self) -> dict[str, int]:
        """The longest value of each verdict field the declared model allows (`parse_feedback`'s)."""
        return self._max_text

    # -- running a request's work -------------------------------------------------------------

    async def _run(
        self, fn: Any, keys: list[tuple[str, str]]
    ) -> tuple[Any, Literal["store", "outbox"]]:
        pending, _, _ = self.outbox_depth(fresh=False)
        if pending >= self.config.outbox_max:
            raise Problem(
                503, f"the outbox holds {pending} undelivered writes: try later", {"Retry-After": "30"}
            )
        try:
            result, ops, durable = await self.ledger.run(fn, keys)
        except BadScore as ex:  # a row the ledger cannot hold: this request alone is refused
            raise Problem(422, f"not written: {ex}") from None
        except LedgerDown as ex:
            # never around the ledger: a write it did not keep is no write (the client retries;
            # the same request then lands once, with the same id and timestamp)
            self.write_failed_at = self.clock.monotonic()
            self.metrics.inc("relay_outcomes_total", outcome="refused_ledger_down")
            raise Problem(
                503, f"not written: the relay's ledger cannot commit ({ex}); try again", {"Retry-After": "5"}
            ) from None
        self.write_failed_at = None
        if durable == "store":
            self.metrics.inc("relay_outcomes_total", outcome="stored")
            return result, "store"
        if self.worker is not None and ops:
            self.worker.notify()
        self.metrics.inc("relay_outcomes_total", outcome="queued")
        return result, "outbox"

    # -- building rows ------------------------------------------------------------------------

    @staticmethod
    def _row(
        score: _Wanted, answer: Answer, author: str, environment: str, existing: Row | None, now: str
    ) -> Row:
        name = score.name
        score_id = existing.id if existing else relay_score_id(name, answer.key, author)
        timestamp = existing.timestamp if existing else now
        meta = PersonMeta(author=author, answer=answer.key, session_id=answer.session_id, turn=answer.turn)
        body = ScoreBody(
            id=score_id,
            name=name,
            value=score.value,
            data_type=score.data_type,
            timestamp=parse_time(timestamp),
            trace_id=answer.trace_id or None,
            session_id=None if answer.trace_id else answer.session_id,
            comment=score.comment,
            metadata=meta.to_metadata(),
            environment=environment,
        )
        return Row(
            id=score_id,
            answer=answer.key,
            author=author,
            name=name,
            kind=score.kind,
            trace_id=answer.trace_id,
            session_id=answer.session_id,
            turn=answer.turn,
            timestamp=timestamp,
            body=body,
            updated_at=now,
        )

    def _wanted(self, name: str, kind: str, value: Any, comment: str | None) -> _Wanted:
        """A score a person's feedback sets, its value checked against its declaration."""
        decl = self._declared(name)
        return _Wanted(name, kind, check_value(decl, value), decl.data_type, comment)

    def _declared(self, name: str) -> DeclaredScore:
        decl = self._decls.get(name)
        return decl if decl is not None else self._lookup(name)

    def _lookup(self, name: str) -> DeclaredScore:
        decl = self.config.declared(name)
        if decl is None:  # monitor mode lets the model leave out a name the relay writes
            return DeclaredScore(name=name, data_type="BOOLEAN" if name == self.names.vote else "TEXT")
        return decl

    # -- operations ------------------------------------------------------------------------------

    async def feedback(self, req: Feedback, author: str, mode: Mode = "upsert") -> Written:
        wanted: dict[str, _Wanted] = {}
        if req.value is not None:
            vote = self.names.vote
            wanted[vote] = self._wanted(vote, "vote", req.value, req.comment)
        for field, text in (req.verdict or {}).items():
            name = self.fields[field]
            wanted[name] = self._wanted(name, "verdict", text, None)

        def work(tx: Tx) -> tuple[list[str], list[str]]:
            now = iso_ms(self.clock.now())
            existing = {r.name: r for r in tx.rows(req.answer.key, author)}
            live = {n: r for n, r in existing.items() if r.body is not None}
            if mode == "create" and live:
                raise Problem(
                    409, "this voter already has feedback on this answer (POST upserts; PUT replaces)"
                )
            if mode == "replace" and not live:
                raise Problem(404, "this voter has no feedback on this answer to replace")
            ids = []
            for name, score in wanted.items():
                row = self._row(score, req.answer, author, req.environment, existing.get(name), now)
                tx.put(row)
                ids.append(row.id)
            if mode == "replace":
                clear = [r for n, r in live.items() if n not in wanted]
            elif req.verdict is not None:  # the verdict is replaced whole: a field left out is cleared
                clear = [r for n, r in live.items() if r.kind == "verdict" and n not in wanted]
            else:
                clear = []
            for row in clear:
                tx.retract(row, now)
            return ids, [r.id for r in clear]

        (ids, cleared), where = await self._run(work, [(req.answer.key, author)])
        return Written(ids, cleared, where)

    async def delete(self, answer: Answer, target: str) -> Written:
        def work(tx: Tx) -> list[str]:
            now = iso_ms(self.clock.now())
            live = [r for r in tx.rows(answer.key, target) if r.body is not None]
            if not live:
                raise Problem(404, "no feedback of that author on this answer")
            for row in live:
                tx.retract(row, now)
            return [r.id for r in live]

        ids, where = await self._run(work, [(answer.key, target)])
        return Written([], ids, where)

    async def score(self, req: ScoreIn) -> Written:
        if req.source == HUMAN:
            raise Problem(422, "the human source writes through /api/feedback")
        decl = self.config.declared(req.name)
        if decl is None or not self.config.may_write(req.source, req.name):
            what = "not declared" if decl is None else f"not declared for source {req.source!r}"
            if self.config.mode == "enforce":
                raise Problem(422, f"score {req.name!r} is {what} in the score model (enforce)")
            # names come from clients: at most 100 distinct ones get a series of their own
            seen = self._undeclared
            name = req.name[:64] if req.name[:64] in seen or len(seen) < 100 else "(other)"
            seen.add(name)
            sources = self._undeclared_sources
            source = req.source[:64] if req.source[:64] in sources or len(sources) < 20 else "(other)"
            sources.add(source)
            self.metrics.inc("relay_undeclared_scores_total", name=name, source=source)
            log.info("undeclared score %r from %r accepted (monitor)", req.name, req.source,
                     extra={"event": "undeclared_score"})  # fmt: skip
            if decl is None:
                inferred = (
                    "BOOLEAN" if isinstance(req.value, bool)
                    else "NUMERIC" if isinstance(req.value, int | float) else "CATEGORICAL"
                )  # fmt: skip
                decl = DeclaredScore(name=req.name, data_type=inferred)  # type: ignore[arg-type]
        score = _Wanted(req.name, "score", check_value(decl, req.value), decl.data_type, req.comment)
        author = f"source:{req.source}"

        def work(tx: Tx) -> list[str]:
            now = iso_ms(self.clock.now())
            existing = next((r for r in tx.rows(req.answer.key, author) if r.name == req.name), None)
            row = self._row(score, req.answer, author, req.environment, existing, now)
            tx.put(row)
            return [row.id]

        ids, where = await self._run(work, [(req.answer.key, author)])
        return Written(ids, [], where)

    def listing(
        self,
        *,
        trace_id: str | None = None,
        session_id: str | None = None,
        author: str | None = None,
        verdict: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of feedback grouped by (answer, author), in the order of answer then author,
        at most `limit` groups (1 to `MAX_PAGE`), from `cursor` (a page's `next_cursor`, opaque);
        the page and the next page's cursor (None: this was the last). `verdict=negative` is the
        negative queue: it includes false alarms, each shown with its own verdict. Blocking (a
        query): the endpoint runs it off the event loop."""
        if not 1 <= limit <= MAX_PAGE:
            raise Problem(400, f"limit must be from 1 to {MAX_PAGE}")
        try:
            after = decode_cursor(cursor) if cursor is not None else None
        except ValueError:
            raise Problem(400, "cursor is not one this relay gave: pass next_cursor back as it came") from None
        wanted = NEGATIVE_QUEUE if verdict == "negative" else (verdict,) if verdict else ()
        page = ListingPage(
            trace_id=trace_id,
            session_id=session_id,
            author=author,
            verdict_name=self.names.verdict if wanted else None,
            verdict_values=wanted,
            after=after,
            groups=limit + 1,  # one more than asked: whether a next page exists
        )
        groups: dict[tuple[str, str], dict[str, Any]] = {}
        fields = {v: k for k, v in self.fields.items()}
        for row in self.ledger.reads.page(page):
            item = groups.setdefault(
                (row.answer, row.author),
                {
                    **Answer(row.trace_id, row.session_id, row.turn).public(),
                    "author": row.author,
                    "vote": None,
                    "comment": None,
                    **{f: None for f in self.fields},
                    "scores": {},
                    "updatedAt": row.updated_at,
                },
            )
            body = row.body
            if body is None:
                continue
            if row.name == self.names.vote:
                item["vote"] = "up" if body.value == 1 else "down"
                item["comment"] = body.comment
            elif row.name in fields and row.kind == "verdict":
                item[fields[row.name]] = body.value
            else:
                item["scores"][row.name] = body.value
            item["updatedAt"] = max(item["updatedAt"], row.updated_at)
        keys = list(groups)
        if len(keys) <= limit:
            return list(groups.values()), None
        return [groups[k] for k in keys[:limit]], encode_cursor(keys[limit - 1])

    def writes_failing(self, within: float = 30.0) -> bool:
        """Whether the last write failed less than `within` seconds ago (readiness: a replica whose
        disk is full takes no traffic for a while, then is tried again: not-ready for good would
        leave a single replica out of service even once the disk has room)."""
        failed = self.write_failed_at
        return failed is not None and self.clock.monotonic() - failed < within

    def outbox_depth(self, fresh: bool = True) -> tuple[int, int, float | None]:
        """(undelivered, set aside, oldest's age); for the write path, read at most every half second."""
        now = self.clock.monotonic()
        if fresh or self._depth is None or now - self._depth_at > 0.5:
            self._depth, self._depth_at = self.ledger.reads.depth(), now
        return self._depth


def end_user(subject: str | None) -> str:
    return f"{END_USER}{subject}" if subject else f"{END_USER}anonymous"
