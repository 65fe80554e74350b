"""One retry policy for every outside system (Langfuse, the judge's model server, the MCP server).

tenacity does the looping; this module says how long to wait and when to give up, the same way
everywhere: a server's `Retry-After` (or `retry-after-ms`) first, else exponential back-off with
jitter, within a number of attempts and an optional deadline. Time comes from a `Clock`, so tests
and benchmarks run retries in virtual time (`use_clock`) instead of sleeping for real.

Beside it, the one way a request budget is kept before sending (`Pacer`, `Rate`): a system that
limits its callers is paced, not only retried when it answers 429.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
)
from tenacity.stop import stop_base

log = logging.getLogger("triage")


class Clock(Protocol):
    """Where waiting happens: the system's clock, or a virtual one in tests."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...

    def async_sleep(self, seconds: float) -> Awaitable[None]: ...


class SystemClock:
    """Real time."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def async_sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)


_clock: Clock = SystemClock()


def current_clock() -> Clock:
    """The clock policies use when none is given: the system's, unless `use_clock` says otherwise."""
    return _clock


@contextmanager
def use_clock(clock: Clock) -> Iterator[Clock]:
    """Run everything inside on `clock` (a virtual clock makes every back-off instant)."""
    global _clock
    previous, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = previous


def retry_after(headers: Mapping[str, str] | None, now: datetime | None = None) -> float | None:
    """Seconds a server asked us to wait: `retry-after-ms`, else `Retry-After` as seconds (fractions
    allowed) or an HTTP date. None when there is no usable header."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    if (ms := lowered.get("retry-after-ms")) is not None and (seconds := _finite(ms)) is not None:
        return max(seconds / 1000, 0.0)
    value = lowered.get("retry-after")
    if not value:
        return None
    if (seconds := _finite(value)) is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or current_clock().now())).total_seconds(), 0.0)


def _finite(text: str) -> float | None:
    """A finite number, or None: `float()` also accepts "nan", "inf" and "1e400", which no wait can be."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


class Budget:
    """A run's allowance for waiting on outside systems, shared by every policy that holds it.

    Once it is spent (its seconds are up, or `cancel()` was called on SIGTERM) no call retries any
    more: each still makes its one attempt (so in-flight work can still be written when the system
    is up), and a back-off in progress ends within `SLICE` seconds.
    """

    SLICE = 0.5

    def __init__(self, seconds: float | None = None, clock: Clock | None = None) -> None:
        self.seconds = seconds
        self.clock = clock or current_clock()
        self.started = self.clock.monotonic()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def remaining(self) -> float | None:
        """Seconds left; None without a limit (until cancelled)."""
        if self.cancelled:
            return 0.0
        if self.seconds is None:
            return None
        return max(self.seconds - (self.clock.monotonic() - self.started), 0.0)

    def spent(self, upcoming: float = 0.0) -> bool:
        """Whether a wait of `upcoming` seconds would overrun the budget (or it was cancelled)."""
        left = self.remaining()
        return left is not None and upcoming >= left

    def sleep(self, clock: Clock, seconds: float) -> None:
        """Wait `seconds`, ending early once the budget is cancelled. A virtual clock's sleep is
        instant, so it cannot be interrupted: it sleeps once."""
        if not isinstance(clock, SystemClock):
            clock.sleep(seconds)
        elif not self.cancelled:
            self._cancelled.wait(seconds)  # SIGTERM (another thread) wakes it at once

    async def async_sleep(self, clock: Clock, seconds: float) -> None:
        if not isinstance(clock, SystemClock):
            await clock.async_sleep(seconds)
            return
        end = clock.monotonic() + seconds
        while not self.cancelled and (left := end - clock.monotonic()) > 0:
            await clock.async_sleep(min(left, self.SLICE))  # the signal handler runs on this loop


@contextmanager
def stop_on_sigterm(stop: asyncio.Event, budget: Budget | None = None, *, doing: str) -> Iterator[None]:
    """Kubernetes sends SIGTERM before it kills a Pod: set `stop`, so the run finishes what is in
    flight, writes it and reports; cancel `budget`, so no outside call waits out a back-off. `doing`
    says in the log what the run does now ("finishing the traces in flight, listing the rest")."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, _on_sigterm, stop, budget, doing)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _on_sigterm(stop: asyncio.Event, budget: Budget | None, doing: str) -> None:
    log.warning("SIGTERM: %s", doing, extra={"event": "sigterm"})
    stop.set()
    if budget is not None:
        budget.cancel()


class _BudgetStop(stop_base):
    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.budget.spent(retry_state.upcoming_sleep or 0.0)


class _Deadline(stop_base):
    """Stop when the next wait would end past the deadline (measured on the policy's clock)."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds
        self.started = clock.monotonic()

    def __call__(self, retry_state: RetryCallState) -> bool:
        upcoming = retry_state.upcoming_sleep or 0.0
        return self.clock.monotonic() - self.started + upcoming >= self.seconds


@dataclass(frozen=True)
class RetryPolicy:
    """How one outside system is retried. Immutable; `with_` makes a variant."""

    #: attempts in all, the first included; None: until the deadline
    attempts: int | None = 4
    #: seconds from the first attempt after which no retry starts; None: no deadline
    deadline: float | None = None
    #: first back-off (seconds); each later one `factor` times the one before (doubles), up to `maximum`
    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    #: random extra of up to this many seconds per wait, so a burst of 429s does not retry in step;
    #: None: as much as `initial`
    jitter: float | None = None
    #: the longest `Retry-After` honoured as asked (longer ones are cut to this); None: any
    max_retry_after: float | None = None
    #: None: `current_clock()` when the loop starts
    clock: Clock | None = None
    #: the run's budget: when it is spent no call retries any more
    budget: Budget | None = None

    def with_(self, **changes: Any) -> RetryPolicy:
        return replace(self, **changes)

    def backoff(self, attempt: int, asked: float | None = None) -> float:
        """Seconds to wait after the `attempt`-th failed attempt (1: the first): what the server
        `asked` (its Retry-After, cut to `max_retry_after`), else the exponential back-off."""
        if asked is not None:
            return asked if self.max_retry_after is None else min(asked, self.max_retry_after)
        # exponential back-off with additive jitter (the shape tenacity's wait_exponential_jitter has)
        jitter = self.initial if self.jitter is None else self.jitter
        backoff: float = self.initial * self.factor ** min(attempt - 1, 64)  # capped: no overflow (factor < 2**16)
        return min(backoff + random.uniform(0, jitter), self.maximum)

    def _options(
        self,
        clock: Clock,
        retryable: Callable[[BaseException], bool],
        asked: Callable[[BaseException], Mapping[str, str] | None] | None,
        before_sleep: Callable[[RetryCallState], None] | None,
    ) -> dict[str, Any]:
        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            headers = asked(error) if asked and error is not None else None
            # an HTTP date is measured on the policy's clock, like every other wait
            return self.backoff(state.attempt_number, retry_after(headers, now=clock.now()))

        stop: stop_base = stop_never if self.attempts is None else stop_after_attempt(self.attempts)
        if self.deadline is not None:
            stop = stop | _Deadline(clock, self.deadline)
        if self.budget is not None:
            stop = stop | _BudgetStop(self.budget)
        return {
            "retry": retry_if_exception(retryable),
            "wait": wait,
            "stop": stop,
            "reraise": True,  # callers classify the last error themselves
            "before_sleep": before_sleep,
        }

    def retrying(
        self,
        retryable: Callable[[BaseException], bool],
        *,
        retry_after: Callable[[BaseException], Mapping[str, str] | None] | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> Retrying:
        """A synchronous tenacity loop: `retrying(fn)` or `for attempt in retrying: with attempt: ...`.
        `retry_after` finds the headers of a failure that may say how long to wait."""
        clock = self.clock or current_clock()
        budget = self.budget
        sleep = clock.sleep if budget is None else (lambda seconds: budget.sleep(clock, seconds))
        return Retrying(sleep=sleep, **self._options(clock, retryable, retry_after, before_sleep))

    def async_retrying(
        self,
        retryable: Callable[[BaseException], bool],
        *,
        retry_after: Callable[[BaseException], Mapping[str, str] | None] | None = None,
        before_sleep: Callable[[RetryCallState], None] | None = None,
    ) -> AsyncRetrying:
        """The same loop for coroutines: `async for attempt in policy.async_retrying(...)`."""
        clock = self.clock or current_clock()
        sleep = partial(async_sleep, clock, self.budget)
        return AsyncRetrying(sleep=sleep, **self._options(clock, retryable, retry_after, before_sleep))


def async_sleep(clock: Clock, budget: Budget | None, seconds: float) -> Awaitable[None]:
    """Wait `seconds` on `clock`, ending early once `budget` (when there is one) is cancelled."""
    return clock.async_sleep(seconds) if budget is None else budget.async_sleep(clock, seconds)


# -- pacing: a request budget kept before each request ----------------------------------------------


@dataclass(frozen=True)
class Rate:
    """At most `requests` in any `seconds`. Kept over a sliding window, which keeps every fixed
    window too (Langfuse Cloud counts in fixed windows)."""

    requests: int
    seconds: float

    def __str__(self) -> str:
        # a window kept a little longer than the system's (a margin) reads as the system's
        whole = int(self.seconds // 60 * 60)
        unit = {60: "a minute", 3600: "an hour", 86400: "a day"}.get(whole, f"in {self.seconds:g} s")
        return f"{self.requests} {unit}"


class PaceExceeded(Exception):
    """Keeping to a rate would mean waiting longer than the pacer may (`Pacer.max_wait`)."""


class Pacer:
    """Holds each request back until it keeps every rate: the request budget an operator sets for a
    shared, rate-limited system (Langfuse Cloud's per-organisation limits), kept *before* sending
    instead of learnt from 429s. Shared by threads: requests leave in turn, each at its slot, so a
    virtual clock's time is the time the requests would really take."""

    def __init__(self, rates: Sequence[Rate], *, clock: Clock | None = None, max_wait: float | None = None) -> None:
        self.rates = tuple(rates)
        self.clock = clock
        #: a wait longer than this raises `PaceExceeded` (a day's budget spent is no reason to wait a day)
        self.max_wait = max_wait
        self._sent: deque[float] = deque(maxlen=max((r.requests for r in self.rates), default=1))
        self._lock = threading.Lock()
        #: seconds spent waiting, in all
        self.waited = 0.0

    def wait(self) -> None:
        """Wait for this request's slot, and take it."""
        if not self.rates:
            return
        clock = self.clock or current_clock()
        with self._lock:
            now = clock.monotonic()
            slot = now
            for rate in self.rates:
                if len(self._sent) >= rate.requests:
                    slot = max(slot, self._sent[-rate.requests] + rate.seconds)
            if self.max_wait is not None and slot - now > self.max_wait:
                raise PaceExceeded(
                    f"the request budget ({', '.join(map(str, self.rates))}) is spent for {slot - now:.0f} s"
                )
            if slot > now:
                clock.sleep(slot - now)
                self.waited += slot - now
            self._sent.append(max(slot, clock.monotonic()))

    def seconds_for(self, requests: int) -> float:
        """How long `requests` more requests take at these rates, from an unused budget (the plan)."""
        longest = 0.0
        for rate in self.rates:
            longest = max(longest, max(0, math.ceil(requests / rate.requests) - 1) * rate.seconds)
        return longest
