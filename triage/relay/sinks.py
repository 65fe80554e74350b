"""Where the relay's writes land: the embedded store (inline, in the writer's batch) or Langfuse
(from the outbox, by the delivery worker, batched)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Sequence
from typing import Literal, Protocol

import httpx

from triage.domain.relay import RelayConfig
from triage.domain.scores import BadScore, ScoreBody
from triage.errors import TriageError
from triage.relay.configs import sync_score_configs
from triage.relay.ledger import Op
from triage.relay.problems import DeliveryFailed
from triage.retry import RetryPolicy, retry_after
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp
from triage.sources.langfuse.writes import delete_score, post_score_list
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

    def __init__(self, http: LangfuseHttp, batch_max: int = 500, model: RelayConfig | None = None) -> None:
        self.http = http
        self.batch_max = batch_max
        self.requests = 0
        #: the declared model, mapped to Langfuse score configs on the worker's first chance
        self.model = model
        self.config_ids: dict[str, str] = {}
        self._configs_synced = model is None
        self._configs_tried = -1e9

    def housekeeping(self) -> None:
        """Map the declared model to Langfuse score configs (once; again a minute after a failure)."""
        if self._configs_synced or self.model is None or time.monotonic() - self._configs_tried < 60:
            return
        self._configs_tried = time.monotonic()
        try:
            self.config_ids = sync_score_configs(self.http, self.model, ONE_ATTEMPT)
            self._configs_synced = True
        except (HttpStatus, httpx.TransportError, TriageError) as ex:
            log.warning(
                "score configs not synced (again in a minute): %s",
                self._failed(ex),
                extra={"event": "score_config"},
            )

    def _wire(self, body: ScoreBody) -> dict[str, object]:
        wire = body.wire()
        config = self.config_ids.get(body.name)
        return {**wire, "configId": config} if config else wire

    def _failed(self, ex: BaseException) -> DeliveryFailed:
        if isinstance(ex, HttpStatus):
            wait = retry_after(ex.headers) if ex.status == 429 else None
            retryable = ex.status in {408, 409, 429} or ex.status >= 500
            return DeliveryFailed(f"Langfuse answered {ex.detail()}", retryable=retryable, wait=wait)
        cause = ex if isinstance(ex, httpx.TransportError) else ex.__cause__
        if isinstance(cause, httpx.TransportError):
            return DeliveryFailed(f"Langfuse unreachable: {type(cause).__name__}")
        return DeliveryFailed(f"Langfuse failed: {ex}")

    def deliver(self, ops: Sequence[Op]) -> dict[int, DeliveryFailed]:
        failed: dict[int, DeliveryFailed] = {}
        ops = coalesce(ops)
        puts: list[Op] = []
        for op in ops:
            if op.op != "put" or op.body is None:
                continue
            try:
                op.body.encoded()
            except BadScore as ex:  # text no JSON encoder can send: never sendable, set aside alone
                failed[op.seq] = DeliveryFailed(str(ex), permanent=True)
                continue
            puts.append(op)
        deletes = [op for op in ops if op.op == "delete"]
        for start in range(0, len(puts), self.batch_max):
            chunk = puts[start : start + self.batch_max]
            try:
                self.requests += 1
                rejected = post_score_list(self.http, [self._wire(op.body) for op in chunk if op.body], ONE_ATTEMPT)
            except (HttpStatus, httpx.TransportError, TriageError) as ex:
                problem = self._failed(ex)
                if problem.retryable or len(chunk) == 1:
                    if start == 0 and problem.retryable:
                        raise problem from None  # Langfuse is down: nothing of this batch went
                    failed.update({op.seq: problem for op in chunk})
                    continue
                failed.update(self._one_by_one(chunk))
                continue
            except Exception:  # a bug on one op must not fail its batch-mates: find it alone
                log.exception("delivering a batch crashed; one by one", extra={"event": "delivery_crash"})
                failed.update(self._one_by_one(chunk))
                continue
            if rejected:
                # a 207's errors carry no score id: find the refused ones one by one
                failed.update(self._one_by_one(chunk))
        for op in deletes:
            try:
                self.requests += 1
                delete_score(self.http, op.score_id, ONE_ATTEMPT)
            except (HttpStatus, httpx.TransportError, TriageError) as ex:
                failed[op.seq] = self._failed(ex)
        return failed

    def _one_by_one(self, chunk: Sequence[Op]) -> dict[int, DeliveryFailed]:
        failed: dict[int, DeliveryFailed] = {}
        for op in chunk:
            try:
                self.requests += 1
                if post_score_list(self.http, [self._wire(op.body)] if op.body else [], ONE_ATTEMPT):
                    failed[op.seq] = DeliveryFailed("Langfuse rejected the score (207)", retryable=False)
            except (HttpStatus, httpx.TransportError, TriageError) as ex:
                failed[op.seq] = self._failed(ex)
            except Exception as ex:  # not a refusal, and not Langfuse's fault: a few more tries, then aside
                failed[op.seq] = DeliveryFailed(f"{type(ex).__name__}: {ex}", retryable=False)
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
