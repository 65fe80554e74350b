"""Writing scores: both POST contracts, then confirming each score by reading it back.

Newer servers take a list (202, or 207 with per-item errors that carry no id); older ones take
one object per POST (a list is a 400/422, detected once). Langfuse ingests asynchronously, so a
score counts as written only once a read by id shows its value.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from triage.domain.records import WriteOutcome
from triage.domain.scores import ScoreBody
from triage.errors import LangfuseError
from triage.retry import Clock, RetryPolicy, current_clock
from triage.sources.langfuse.http import HttpStatus, LangfuseHttp
from triage.sources.langfuse.scores import ScoreReads
from triage.sources.langfuse.wire import BatchAnswer, BatchResults, post_chunks

log = logging.getLogger("triage.sources.langfuse")


class ScoreBodys:
    def __init__(
        self,
        http: LangfuseHttp,
        reads: ScoreReads,
        *,
        confirm_wait: float,
        confirm_first_wait: float,
        clock: Clock | None = None,
    ) -> None:
        self.http = http
        self.reads = reads
        self.confirm_wait = confirm_wait
        self.confirm_first_wait = confirm_first_wait
        self.clock = clock
        self.list_contract: bool | None = None  # False: POST /scores takes one object only

    def write(self, scores: Sequence[ScoreBody]) -> WriteOutcome:
        unique = list({s.id: s for s in scores}.values())
        failed: dict[str, str] = {}
        notes: dict[str, str] = {}  # ids whose write was answered with a warning (207)
        sent: list[ScoreBody] = []
        for chunk in post_chunks(unique):
            if self.list_contract is not False:
                outcome = self._post_list(chunk)
                if outcome is None:  # the server speaks only the older contract
                    self.list_contract = False
                else:
                    self.list_contract = True
                    error, warning = outcome
                    for score in chunk:
                        if error:
                            failed[score.id] = error
                        else:
                            sent.append(score)
                            if warning:
                                notes[score.id] = warning
                    continue
            for score in chunk:
                error = self._post_one(score)
                if error:
                    failed[score.id] = error
                else:
                    sent.append(score)
        confirmed, unconfirmed = self._confirm(sent)
        for sid, reason in unconfirmed.items():
            failed[sid] = f"{reason}; {notes[sid]}" if sid in notes else reason
        return WriteOutcome(confirmed=confirmed, failed=failed)

    def _post_list(self, chunk: list[ScoreBody]) -> tuple[str | None, str | None] | None:
        """POST a list. (error, warning) per chunk; None when the server wants one object per POST."""
        what = f"writing {len(chunk)} scores"
        body = [s.wire() for s in chunk]
        try:
            response = self.http.call(
                what,
                lambda: BatchAnswer.validate_python(self.http.raw("POST", "api/public/scores", json_body=body)),
            )
        except HttpStatus as ex:
            if ex.status in {400, 422} and self.list_contract is None:
                log.info(
                    "POST /api/public/scores refused a list (%s): writing one score per request", ex.status
                )
                return None
            return f"write refused: {ex.detail()}", None
        except LangfuseError as ex:
            return f"write failed: {ex}", None
        if isinstance(response, BatchResults) and response.rejected:
            # 207: the errors carry no score id, so the read-back decides which ones landed
            messages = "; ".join(e.message for e in response.errors[:3])
            return None, f"the server rejected {response.rejected} of {len(chunk)} scores in the batch: {messages}"
        return None, None

    def _post_one(self, score: ScoreBody) -> str | None:
        """POST one object (the older contract); an error message, or None."""
        what = f"writing score {score.id}"
        try:
            self.http.call(what, lambda: self.http.raw("POST", "api/public/scores", json_body=score.wire()))
        except HttpStatus as ex:
            return f"write refused: {ex.detail()}"
        except LangfuseError as ex:
            return f"write failed: {ex}"
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


# -- the relay's writes (`triage relay`): raw bodies, one attempt each; the relay's outbox retries


def post_score_list(http: LangfuseHttp, bodies: Sequence[dict[str, object]], retry: RetryPolicy) -> int:
    """POST scores (Langfuse's POST shape, any data type) as one list; how many the server rejected
    (a 207). Raises `HttpStatus` for a refused request, `LangfuseError` when it failed."""
    what = f"relaying {len(bodies)} scores"
    body = http.call(what, lambda: http.raw("POST", "api/public/scores", json_body=list(bodies)), retry=retry)
    rejected = body.get("rejected", 0) if isinstance(body, dict) else 0
    return int(rejected) if isinstance(rejected, int) else 0


def delete_score(http: LangfuseHttp, score_id: str, retry: RetryPolicy) -> bool:
    """DELETE one score; False when Langfuse has no such score (nothing to delete)."""
    try:
        http.call(
            f"deleting score {score_id}", lambda: http.raw("DELETE", f"api/public/scores/{score_id}"), retry=retry
        )
    except HttpStatus as ex:
        if ex.status == 404:
            return False
        raise
    return True
