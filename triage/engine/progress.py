"""A progress line every few seconds, for a log read without a terminal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("triage")


class Progress:
    """done/total, rate and ETA, logged at most every `every` seconds (and once at the end)."""

    def __init__(self, total: int, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.every, self.clock = total, every, clock
        self.started = self.last = clock()
        self.done = 0

    def tick(self, force: bool = False) -> None:
        self.done += 0 if force else 1
        now = self.clock()
        if not force and now - self.last < self.every:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        log.info(
            "progress %d/%d (%d%%) %.1f traces/s ETA %ds",
            self.done,
            self.total,
            100 * self.done // max(self.total, 1),
            rate,
            round(eta),
            extra={"event": "progress", "done": self.done, "total": self.total},
        )
