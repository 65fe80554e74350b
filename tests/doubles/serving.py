"""A stand-in's HTTP listener in a thread of its own: started on a (free) port of 127.0.0.1,
stopped with every open connection closed, as a real restart closes keep-alive connections too.
The Langfuse and GitHub stand-ins serve their handlers through it (`Served`)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class ThreadedServer:
    """One listener: `start` binds `port` (0: a free one, kept for a restart) and serves `handler`."""

    def __init__(self, host: str, port: int, *, name: str, queue_size: int = 5) -> None:
        self.host, self.port, self.name, self.queue_size = host, port, name, queue_size
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self, handler: type[BaseHTTPRequestHandler]) -> None:
        listener = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = listener.queue_size

            def process_request(self, request: Any, client_address: Any) -> None:
                with listener._lock:
                    listener._connections.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                with listener._lock:
                    listener._connections.discard(request)
                super().shutdown_request(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that went away (time-outs, restarts, dropped answers) is expected here

        self._httpd = Server((self.host, self.port), handler)
        self.port = int(self._httpd.server_address[1])
        # a short poll interval: stop() waits for the loop to notice
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            conns = list(self._connections)
            self._connections.clear()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)


class Served:
    """A stand-in served by a `ThreadedServer` (`_listener`): its address, `start`, `stop` and `with`.
    Each stand-in says what serves its requests (`_handler`)."""

    _listener: ThreadedServer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def host(self) -> str:
        return self._listener.host

    @property
    def port(self) -> int:
        return self._listener.port

    def start(self) -> None:
        self._listener.start(self._handler())

    def stop(self) -> None:
        self._listener.stop()
