"""A token bucket per client: `rate` requests per second sustained, `burst` at once."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(self, rate: float, burst: int, now: Callable[[], float], max_clients: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.now = now
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, client: str) -> float | None:
        """None when the request may go; else the seconds to wait (a 429's Retry-After)."""
        now = self.now()
        with self._lock:
            tokens, at = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                wait = None
            else:
                self._buckets[client] = (tokens, now)
                wait = (1 - tokens) / self.rate
            while len(self._buckets) > self.max_clients:  # bounded: the longest idle go first
                self._buckets.popitem(last=False)
        return None if wait is None else max(1.0, math.ceil(wait))
