"""A breaker per collection: stop asking a search backend that fails the same way every time.

The docs agent's server is a thin layer over a vector store. With the store down the server stays
up and every search fails alike ("Search failed: ...", or a time-out), so asking again for each of
the night's traces only adds a failure (or a whole time-out) per trace, and a pile of abandoned
calls can make the server drop the session. After `threshold` identical failures in a row the
collection's breaker opens: its searches are refused at once with `SearchSuspended` (the traces
that need the collection are listed undecided with the reason, never dropped), and one search is
let through every `probe_seconds` as a probe, so a backend that comes back is used again.

Identical means the same message once digits are masked (a request id or a port must not make
each failure look new). A different failure starts the count again; an answer resets it. A query
the server rejects (its own limit), a lost session (the session keeper's business) and a
cancelled call say nothing about the backend and are not counted either way.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from triage.errors import SearchSuspended
from triage.retry import Clock, current_clock

log = logging.getLogger("triage")

_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class BreakerPolicy:
    """When a collection's searches stop, and how often a probe goes through while they do."""

    #: identical failures in a row that open the breaker
    threshold: int = 5
    #: seconds between probes while it is open
    probe_seconds: float = 30.0


@dataclass(frozen=True)
class Admission:
    """A search the breaker let through; `probe` when it is the one probe of an open breaker."""

    probe: bool = False


def signature(reason: str) -> str:
    """What makes two failures identical: the message, spaced once, any case, digits masked."""
    return _DIGITS.sub("#", " ".join(reason.split()).casefold())[:300]


class Breaker:
    """One collection's breaker (closed, or open with at most one probe in flight)."""

    def __init__(self, collection: str, policy: BreakerPolicy | None = None, clock: Clock | None = None) -> None:
        self.collection = collection
        self.policy = policy or BreakerPolicy()
        self._clock = clock
        self._signature: str | None = None
        self._in_a_row = 0
        #: why it is open (the latest failure); None while closed
        self.reason: str | None = None
        self._next_probe = 0.0
        self._probing = False
        #: searches refused while open, and how often it opened (for logs and tests)
        self.refused = 0
        self.opened = 0

    @property
    def clock(self) -> Clock:
        return self._clock or current_clock()

    @property
    def is_open(self) -> bool:
        return self.reason is not None

    def admit(self) -> Admission:
        """Let a search through, or raise `SearchSuspended` while open and no probe is due."""
        if self.reason is None:
            return Admission()
        if not self._probing and self.clock.monotonic() >= self._next_probe:
            self._probing = True
            return Admission(probe=True)
        self.refused += 1
        raise SearchSuspended(
            self.collection,
            f"searches of the {self.collection} collection suspended after {self.policy.threshold} identical "
            f"failures in a row (tried again every {self.policy.probe_seconds:g} s): {self.reason}",
        )

    def succeeded(self, admission: Admission) -> None:
        if self.reason is not None:
            log.warning(
                "searches of the %s collection answer again: resumed", self.collection,
                extra={"event": "search_resumed", "collection": self.collection},
            )  # fmt: skip
        self.reason, self._signature, self._in_a_row, self._probing = None, None, 0, False

    def failed(self, admission: Admission, reason: str) -> None:
        """A failure of the backend behind the collection (an error result, a time-out)."""
        now = self.clock.monotonic()
        if admission.probe:
            # still down: the next probe waits its turn again; the latest reason is the one to show
            self.reason, self._probing, self._next_probe = reason, False, now + self.policy.probe_seconds
            return
        if self.reason is not None:
            return  # a search let through before it opened, failing late: already counted in
        found = signature(reason)
        self._in_a_row = self._in_a_row + 1 if found == self._signature else 1
        self._signature = found
        if self._in_a_row >= self.policy.threshold:
            self.reason, self._next_probe = reason, now + self.policy.probe_seconds
            self.opened += 1
            log.warning(
                "searches of the %s collection suspended after %d identical failures in a row, tried again "
                "every %g s; the traces that need it are listed undecided: %s",
                self.collection, self._in_a_row, self.policy.probe_seconds, reason,
                extra={"event": "search_suspended", "collection": self.collection},
            )  # fmt: skip

    def released(self, admission: Admission) -> None:
        """A search that ended saying nothing about the backend (a rejected query, a lost session,
        a cancellation): a probe's turn goes to the next search."""
        if admission.probe:
            self._probing = False
