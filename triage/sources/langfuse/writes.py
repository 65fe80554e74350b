"""Writing scores: both POST contracts, then confirming each score by reading it back.

Newer servers take a list (202, or 207 with per-item errors that carry no id); older ones take
one object per POST (a list is a 400/422, detected once). Langfuse ingests asynchronously, so a
score counts as written only once a read by id shows its value.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field

import httpx

from triage.domain.records import WriteOutcome
from triage.domain.scores import ScoreBody
from triage.errors import LangfuseError
from triage.retry import Clock, RetryPolicy, current_clock, retry_after
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp
from triage.sources.langfuse.reads import ScoreReads
from triage.sources.langfuse.wire import BatchAccepted, BatchAnswer, BatchResults, post_chunks

log = logging.getLogger("triage.sources.langfuse")


@dataclass(frozen=True)
class Failure:
    """Why one write did not land: `retryable` when Langfuse was down, slow or rate-limiting (the
    same write may pass later; `wait`: its Retry-After), else a refusal of this score."""

    reason: str
    retryable: bool = True
    wait: float | None = None


def failure(ex: BaseException) -> Failure:
    """A failed request, classified: a 408, 409, 429 or 5xx and a lost connection are passing."""
    if isinstance(ex, HttpStatus):
        wait = retry_after(ex.headers) if ex.status == 429 else None
        retryable = ex.status in {408, 409, 429} or ex.status >= 500
        return Failure(f"Langfuse answered {ex.detail()}", retryable=retryable, wait=wait)
    cause = ex if isinstance(ex, httpx.TransportError) else ex.__cause__
    if isinstance(cause, httpx.TransportError):
        return Failure(f"Langfuse unreachable: {type(cause).__name__}")
    return Failure(f"Langfuse failed: {ex}")


@dataclass(eq=False)  # the constructor stores what it is given; compared by identity, as a client is
class ScoreWrites:
    """The one way scores reach Langfuse, for the job (confirmed by reading back, with retries)
    and the relay (one attempt, no read-back: its outbox retries)."""

    http: LangfuseHttp
    reads: ScoreReads
    _: KW_ONLY
    confirm_wait: float
    confirm_first_wait: float
    clock: Clock | None = None
    list_contract: bool | None = field(default=None, init=False)  # False: POST /scores takes one object only

    def write(
        self, scores: Sequence[ScoreBody], *, confirm: bool = True, retry: RetryPolicy | None = None
    ) -> WriteOutcome:
        """Write `scores`; each ends confirmed or failed with its reason. With `confirm`, a score
        counts as written once a read by id shows its value; without, once Langfuse accepted it
        (a 207's refused scores are then found one by one: its errors carry no id)."""
        unique = list({s.id: s for s in scores}.values())
        failures: dict[str, Failure] = {}
        notes: dict[str, str] = {}  # ids whose write was answered with a warning (207)
        sent: list[ScoreBody] = []
        for chunk in post_chunks(unique):
            if self.list_contract is not False:
                answer = self._post_list(chunk, retry)
                if answer is None:  # the server speaks only the older contract
                    self.list_contract = False
                else:
                    self.list_contract = True
                    problem, warning = answer
                    if problem is not None and (confirm or problem.retryable or len(chunk) == 1):
                        failures.update({score.id: problem for score in chunk})
                    elif problem is None and (confirm or warning is None):
                        sent += chunk
                        notes.update({score.id: warning for score in chunk if warning})
                    else:  # a refused batch, or a 207 with no read-back to tell: one by one
                        self._one_by_one(chunk, retry, sent, failures)
                    continue
            self._one_by_one(chunk, retry, sent, failures)
        if confirm:
            confirmed, unconfirmed = self._confirm(sent)
            for sid, reason in unconfirmed.items():
                failures[sid] = Failure(f"{reason}; {notes[sid]}" if sid in notes else reason, retryable=False)
        else:
            confirmed = [s.id for s in sent]
        waits = [f.wait for f in failures.values() if f.wait is not None]
        return WriteOutcome(
            confirmed=confirmed,
            failed={sid: f.reason for sid, f in failures.items()},
            retryable=[sid for sid, f in failures.items() if f.retryable],
            wait=max(waits) if waits else None,
        )

    def delete(self, ids: Sequence[str], *, retry: RetryPolicy | None = None) -> dict[str, Failure]:
        """Delete scores by id (every row of each); the ones that failed. An id Langfuse does not
        have is deleted already."""
        failed: dict[str, Failure] = {}
        for score_id in ids:

            def send(path: str = f"api/public/scores/{score_id}") -> object:
                return self.http.raw("DELETE", path)

            try:
                self.http.call(f"deleting score {score_id}", send, retry=retry)
            except HttpStatus as ex:
                if ex.status != 404:
                    failed[score_id] = failure(ex)
            except (LangfuseError, httpx.TransportError) as ex:
                failed[score_id] = failure(ex)
        return failed

    def _post_list(
        self, chunk: list[ScoreBody], retry: RetryPolicy | None
    ) -> tuple[Failure | None, str | None] | None:
        """POST a list. (failure, warning) per chunk; None when the server wants one object per POST."""
        what = f"writing {len(chunk)} scores"
        body = [s.wire() for s in chunk]
        try:
            response = self.http.call(
                what,
                lambda: BatchAnswer.validate_python(self.http.raw("POST", "api/public/scores", json_body=body)),
                retry=retry,
            )
        except HttpStatus as ex:
            if ex.status in {400, 422} and self.list_contract is None:
                log.info(
                    "POST /api/public/scores refused a list (%s): writing one score per request", ex.status
                )
                return None
            return failure(ex), None
        except (LangfuseError, httpx.TransportError) as ex:
            return failure(ex), None
        if isinstance(response, BatchResults) and response.rejected:
            # 207: the errors carry no score id, so the read-back decides which ones landed
            messages = "; ".join(e.message for e in response.errors[:3])
            return None, f"the server rejected {response.rejected} of {len(chunk)} scores in the batch: {messages}"
        return None, None

    def _one_by_one(
        self, chunk: Sequence[ScoreBody], retry: RetryPolicy | None, sent: list[ScoreBody], failures: dict[str, Failure]
    ) -> None:
        for score in chunk:
            problem = self._post_one(score, retry)
            if problem is None:
                sent.append(score)
            else:
                failures[score.id] = problem

    def _post_one(self, score: ScoreBody, retry: RetryPolicy | None) -> Failure | None:
        """POST one score (a list of one, or one object on the older contract); its failure, or None."""
        what = f"writing score {score.id}"
        listed = bool(self.list_contract)

        def send() -> BatchResults | BatchAccepted | None:
            answer = self.http.raw("POST", "api/public/scores", json_body=[score.wire()] if listed else score.wire())
            return BatchAnswer.validate_python(answer) if listed else None

        try:
            answer = self.http.call(what, send, retry=retry)
        except HttpStatus as ex:
            return failure(ex)
        except (LangfuseError, httpx.TransportError) as ex:
            return failure(ex)
        if isinstance(answer, BatchResults) and answer.rejected:
            reasons = "; ".join(e.message for e in answer.errors[:3])
            return Failure(f"Langfuse rejected the score (207): {reasons}"[:300], retryable=False)
        return None

    def _confirm(self, sent: Sequence[ScoreBody]) -> tuple[list[str], dict[str, str]]:
        """Read the written scores back by id until each shows its value, or the wait is over."""
        clock = self.clock or current_clock()
        pending = {s.id: s for s in sent}
        confirmed: list[str] = []
        seen_values: dict[str, str] = {}
        started = clock.monotonic()
        delay = self.confirm_first_wait
        error: str | None = None
        while pending:
            remaining = self.confirm_wait - (clock.monotonic() - started)
            if remaining <= 0:
                break
            clock.sleep(min(delay, remaining))
            delay = min(max(delay * 2, 0.25), 10.0)
            try:
                rows = self.reads.by_id(list(pending), "confirming scores", fields="details")
            except LangfuseError as ex:
                error = f"could not read the score back: {ex}"
                break
            for sid, row in rows.items():
                score = pending.get(sid)
                if score is None:
                    continue
                if str(row.value) == score.value and row.name == score.name:
                    confirmed.append(sid)
                    del pending[sid]
                else:
                    seen_values[sid] = str(row.value)
        waited = clock.monotonic() - started
        unconfirmed = {}
        for sid in pending:
            if error:
                unconfirmed[sid] = error
            elif sid in seen_values:
                expected = pending[sid].value
                unconfirmed[sid] = (
                    f"read back value {seen_values[sid]!r}, expected {expected!r} after {waited:.0f} s"
                )
            else:
                unconfirmed[sid] = (
                    f"not readable after {waited:.0f} s: Langfuse accepted the write but it has not landed"
                )
        order = {s.id: i for i, s in enumerate(sent)}
        return sorted(confirmed, key=order.__getitem__), unconfirmed
