"""Where the relay's writes land: the embedded store (inline, in the writer's batch) or Langfuse
(from the outbox, by the delivery worker, batched)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal, Protocol

import httpx

from triage.domain.relay import RelayConfig
from triage.domain.review import ensure_configs
from triage.domain.scores import ScoreBody
from triage.errors import TriageError
from triage.relay.ledger import Op
from triage.relay.problems import DeliveryFailed
from triage.retry import RetryPolicy
from triage.sources.langfuse.annotations import LangfuseAnnotations
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp
from triage.sources.langfuse.scores import ScoreReads
from triage.sources.langfuse.writes import ScoreWrites, failure
from triage.sources.store import Store

log = logging.getLogger("triage.relay")

#: one attempt per call: the outbox is the retry (with its own back-off), so a request never waits
ONE_ATTEMPT = RetryPolicy(attempts=1)


class Sink(Protocol):
    name: str
    #: True: deliver in the writer's batch, before the requests are answered (the embedded store)
    inline: bool

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        """Deliver ops in order; the ones that failed, by seq (empty: all delivered). Raises
        `DeliveryFailed` when none could be (the sink is down)."""
        ...

    def reachable(self) -> bool: ...

    def close(self) -> None: ...


def _store_op(op: Op) -> tuple[Literal["put"], ScoreBody] | tuple[Literal["delete"], str]:
    return ("put", op.body) if op.op == "put" and op.body is not None else ("delete", op.score_id)


def coalesce(ops: Sequence[Op]) -> list[Op]:
    """The newest op per score id, in order of seq (older ones are superseded)."""
    newest: dict[str, Op] = {}
    for op in sorted(ops, key=lambda o: o.seq):
        newest.pop(op.score_id, None)
        newest[op.score_id] = op
    return list(newest.values())


class StoreSink:
    name = "store"
    inline = True

    def __init__(self, store: Store) -> None:
        self.store = store
        store.use_wal()  # one fsync per batch: the relay's latency is mostly this commit

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        # in order (a put then a delete of one id must end deleted), in one transaction: one fsync
        # per batch however its puts and deletes interleave
        try:
            self.store.apply_score_ops([_store_op(op) for op in ops])
        except sqlite3.OperationalError:
            raise  # the store is down (disk, lock): the outbox keeps every op
        except Exception:
            # one op the store cannot take must not fail its batch-mates: find it alone
            return self._one_by_one(ops)
        return {}

    def _one_by_one(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        failed: dict[int, DeliveryFailed] = {}
        for op in ops:
            try:
                self.store.apply_score_ops([_store_op(op)])
            except sqlite3.OperationalError:
                raise
            except Exception as ex:
                failed[op.seq] = DeliveryFailed(f"the store refused it: {type(ex).__name__}: {ex}", permanent=True)
        return failed

    def housekeeping(self) -> None:
        self.store.checkpoint()

    def reachable(self) -> bool:
        try:
            self.store.scores_named("__relay_ready__")
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.store.close()


class LangfuseSink:
    name = "langfuse"
    inline = False

    def __init__(self, http: LangfuseHttp, model: RelayConfig | None = None) -> None:
        self.http = http
        self.writes = ScoreWrites(http, ScoreReads(http), confirm_wait=0, confirm_first_wait=0)
        #: the declared model, mapped to Langfuse score configs on the worker's first chance
        self.model = model
        self.config_ids: dict[str, str] = {}
        self._configs_synced = model is None
        self._configs_tried = -1e9

    @property
    def requests(self) -> int:
        """Requests sent to Langfuse so far (the metrics page's count)."""
        return self.http.stats.requests

    def housekeeping(self) -> None:
        """Map the declared model to Langfuse score configs (once; again a minute after a failure)."""
        if self._configs_synced or self.model is None or time.monotonic() - self._configs_tried < 60:
            return
        self._configs_tried = time.monotonic()
        try:
            specs = [spec for score in self.model.scores if (spec := score.config_spec()) is not None]
            found = ensure_configs(LangfuseAnnotations(self.http), specs)
            for name, problem in found.misfits.items():
                log.warning(
                    "Langfuse score config %r differs from the declared model (%s): its scores go without it",
                    name,
                    problem,
                    extra={"event": "score_config_mismatch"},
                )
            self.config_ids = found.ids
            self._configs_synced = True
        except (HttpStatus, httpx.TransportError, TriageError) as ex:
            log.warning(
                "score configs not synced (again in a minute): %s",
                failure(ex).reason,
                extra={"event": "score_config"},
            )

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        """Puts through `ScoreWrites.write` (no read-back: the outbox retries), deletes through
        `ScoreWrites.delete`. Raises `DeliveryFailed` when Langfuse took nothing (it is down)."""
        failed: dict[int, DeliveryFailed] = {}
        ops = coalesce(ops)
        # a body no sink could send never gets here: the claim set it aside (ledger.decode_body)
        puts = {op.score_id: op for op in ops if op.op == "put" and op.body is not None}
        if puts:
            bodies = [replace(op.body, config_id=self.config_ids.get(op.body.name)) for op in puts.values() if op.body]
            outcome = self.writes.write(bodies, confirm=False, retry=ONE_ATTEMPT)
            retryable = set(outcome.retryable)
            if not outcome.confirmed and set(outcome.failed) == retryable:
                first = next(iter(outcome.failed.values()))
                raise DeliveryFailed(first, wait=outcome.wait)  # Langfuse is down: nothing of this batch went
            for score_id, reason in outcome.failed.items():
                failed[puts[score_id].seq] = DeliveryFailed(
                    reason, retryable=score_id in retryable, wait=outcome.wait if score_id in retryable else None
                )
        deletes = {op.score_id: op for op in ops if op.op == "delete"}
        for score_id, problem in self.writes.delete(list(deletes), retry=ONE_ATTEMPT).items():
            seq = deletes[score_id].seq
            failed[seq] = DeliveryFailed(problem.reason, retryable=problem.retryable, wait=problem.wait)
        return failed

    def reachable(self) -> bool:
        try:
            self.http.call(
                "checking Langfuse", lambda: self.http.raw("GET", "api/public/projects"), retry=ONE_ATTEMPT
            )
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.http.close()
