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


#: a stand-in's answer: status, headers, body; None drops the connection without a status line
Answer = tuple[int, dict[str, str], bytes] | None


class Served:
    """A stand-in served by a `ThreadedServer` (`_listener`): its address, `start`, `stop` and `with`.
    Each stand-in answers one request at a time in `handle`; `methods` are the ones it serves (any
    other is a 501, as `BaseHTTPRequestHandler` answers it), `content_type` a header every answer
    carries (None: each answer sets its own)."""

    _listener: ThreadedServer
    methods: tuple[str, ...] = ("GET", "POST", "DELETE")
    content_type: str | None = None

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, every answer has a Content-Length
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base signature
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = standin.handle(self.command, self.path, headers, body)
                if answer is None:  # a dropped connection: no status line at all
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                status, extra, data = answer
                try:
                    self.send_response(status)
                    if standin.content_type is not None:
                        self.send_header("Content-Type", standin.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up (a timeout) or a restart closed us

        for method in self.methods:
            setattr(Handler, f"do_{method}", Handler._serve)
        return Handler

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

    @property
    def running(self) -> bool:
        return self._listener.running

    def start(self) -> None:
        self._listener.start(self._handler())

    def stop(self) -> None:
        self._listener.stop()
