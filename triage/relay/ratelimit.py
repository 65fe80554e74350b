"""A token bucket per client: `rate` requests per second sustained, `burst` at once."""

from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict
from collections.abc import Callable

from starlette.requests import Request


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


class Proxies:
    """The client's address for its rate bucket: the connection's peer, or, when that peer is a
    trusted proxy (`[relay] trusted_proxies`), the nearest address in `X-Forwarded-For` that is not
    one (a client can write anything into the header; only the proxies' own entries are believed).
    Behind a gateway with no trusted proxy configured, every anonymous vote shares one bucket."""

    def __init__(self, trusted: list[str]) -> None:
        self.networks = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    def client(self, request: Request) -> str:
        peer = request.client.host if request.client else "?"
        if not self.networks or not self._trusted(peer):
            return peer
        hops = [h.strip() for h in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return peer
