"""uvicorn's HTTP protocol (httptools) with the two limits it lacks: the size of a request's head
(request line and headers) and the time a client may take to send it.

Without them, measured: twenty unfinished 10 MB headers took the relay from 56 MB to about
250-290 MB, and half-sent requests were held for ever (600 of them exhausted a 512-descriptor
limit and every new client was refused). A head over `max_head_bytes` is answered 431, one not
complete within `head_seconds` of its first byte (or of the connection, for a client that sends
nothing) 408; either closes the connection. uvicorn's own `limit_concurrency` bounds the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

STATUS = {408: b"408 Request Timeout", 431: b"431 Request Header Fields Too Large"}


class GuardedHttpTools(HttpToolsProtocol):
    #: set per server by `limited` (a subclass per configuration)
    max_head_bytes = 32 * 1024
    head_seconds = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def _start_head(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._stop_timer()
        why = "the request head came too slowly"
        self._head_timer = self.loop.call_later(self.head_seconds, self._refuse, 408, why)

    def _stop_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # only a head still unfinished after this data counts: a body in the same packet does not
        if self._in_head and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._refuse(431, f"the request head is over {self.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # a keep-alive connection's next request
            self._start_head()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_timer()
        super().on_headers_complete()

    def _refuse(self, status: int, message: str) -> None:
        if not self._in_head or self.transport.is_closing():
            return
        body = ('{"error": "' + message + '"}').encode()
        self.transport.write(
            b"HTTP/1.1 " + STATUS[status] + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
        )  # fmt: skip
        self.transport.close()


def limited(max_head_bytes: int, head_seconds: float) -> type[GuardedHttpTools]:
    """The protocol class for one server's limits."""
    limits = {"max_head_bytes": max_head_bytes, "head_seconds": head_seconds}
    return type("LimitedHttpTools", (GuardedHttpTools,), limits)
