"""Putting the relay together (ledger, sink, worker, app) and serving it under uvicorn."""

from __future__ import annotations

import gc
import ipaddress
import logging
import signal
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from triage.domain.config import RelayConfig, TriageConfig
from triage.errors import ConfigError
from triage.relay.api import Credentials, RelayApp
from triage.relay.commits import GroupCommit
from triage.relay.outbox import Sink, Worker
from triage.relay.service import Relay
from triage.relay.storage import Op
from triage.relay.web import limited
from triage.retry import Clock, current_clock

log = logging.getLogger("triage.relay")
#: the shortest bearer token or signing key the relay takes when it listens beyond loopback
MIN_SECRET = 32
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def check_startup(config: TriageConfig, credentials: Credentials, host: str) -> None:
    """Refuse to start (ConfigError, exit 3) on an incoherent model, an open relay off loopback, or a
    secret too short to withstand guessing (fewer than 32 characters) off loopback."""
    problems = config.relay.problems(config.review_names().relay_writes())
    if problems:
        raise ConfigError("the relay's score model is incoherent: " + "; ".join(problems))
    if credentials.open and not is_loopback(host):
        raise ConfigError(
            f"no credentials are configured, so the relay serves on 127.0.0.1 only, not {host}: set "
            "TRIAGE_RELAY_TOKEN (the gateway's bearer token), TRIAGE_RELAY_SIGNING_KEY (feedback tokens) "
            "and/or TRIAGE_RELAY_SESSION_KEYS (the gateway's session JWTs)"
        )
    if not is_loopback(host):
        for name, secret in (
            ("TRIAGE_RELAY_TOKEN", credentials.gateway_token),
            ("TRIAGE_RELAY_SIGNING_KEY", credentials.signing_key),
        ):
            if secret is not None and len(secret) < MIN_SECRET:
                raise ConfigError(f"{name} is shorter than {MIN_SECRET} characters: too easy to guess off 127.0.0.1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def relay_running(
    config: TriageConfig,
    sink: Sink,
    outbox: Path | str,
    credentials: Credentials,
    *,
    clock: Clock | None = None,
    start_worker: bool = True,
    drain_seconds: float = 5.0,
) -> Iterator[RelayApp]:
    """The app with its ledger open and (for an outbox-delivered sink) its worker running."""
    clock = clock or current_clock()
    now = lambda: clock.now().timestamp()  # noqa: E731
    try:
        ledger = GroupCommit(outbox, now=now, after_commit=_inline(sink) if sink.inline else None)
    except (sqlite3.Error, OSError) as ex:  # a path it cannot open, a file that is no ledger
        raise ConfigError(f"the relay's ledger {outbox} cannot be opened: {ex} (check TRIAGE_RELAY_OUTBOX)") from None
    worker = Worker(
        ledger,
        sink,
        clock,
        batch_max=config.relay.batch_max,
        batch_wait=config.relay.batch_wait_seconds,
        max_attempts=config.relay.max_attempts,
    )
    relay = Relay(
        ledger=ledger,
        sink=sink,
        config=config.relay,
        clock=clock,
        names=config.review_names(),
        worker=worker,
    )
    if start_worker:
        worker.start()
    try:
        yield RelayApp(relay, credentials, clock_now=clock.monotonic)
    finally:
        if start_worker:
            worker.stop(drain_seconds)
        ledger.close()


def _inline(sink: Sink) -> Callable[[list[Op]], None]:
    def deliver(ops: list[Op]) -> None:
        failed = sink.deliver(ops)
        if failed:
            raise next(iter(failed.values()))

    return deliver


def quiet_gc() -> None:
    """Keep the collector's pauses out of the requests' latency. Everything imported and built at
    startup (some 300,000 objects: pydantic, httpx, the langfuse client) moves to the permanent
    generation, so a full collection no longer walks it: measured here, full collections took
    80-140 ms each, several a run, each one a latency spike of every request in flight. A larger
    first generation also makes the young collections rarer (the relay's garbage is short-lived)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def uvicorn_config(app: RelayApp, host: str, port: int, *, grace_seconds: float = 10.0) -> uvicorn.Config:
    """How the relay is served. uvicorn's own X-Forwarded-For handling is off: it believes any
    loopback peer (a sidecar proxy is one), so every client could pick its own rate bucket; the
    relay believes only its configured trusted proxies (`access.Proxies`)."""
    limits = app.relay.config if app.relay is not None else RelayConfig()
    return uvicorn.Config(
        app.app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
        proxy_headers=False, server_header=False, timeout_graceful_shutdown=max(1, round(grace_seconds)),
        http=limited(limits.max_head_bytes, limits.head_seconds), limit_concurrency=limits.max_connections,
    )  # fmt: skip


def serve(app: RelayApp, host: str, port: int, *, grace_seconds: float = 10.0) -> None:
    """Serve until SIGINT/SIGTERM, then return: requests in flight get `grace_seconds` to finish
    (a client that never finishes sending holds no one up longer)."""
    server = uvicorn.Server(uvicorn_config(app, host, port, grace_seconds=grace_seconds))
    log.info("relay serving on http://%s:%d", host, port, extra={"event": "relay_start", "host": host, "port": port})
    stopped: list[int] = []
    # uvicorn re-raises the signal it handled to the handler it found: make that one note it, so
    # the caller still drains the outbox and closes the ledger, and the process exits 0
    previous = {sig: signal.signal(sig, lambda number, frame: stopped.append(number)) for sig in _SIGNALS}
    # the ledger's writer thread gives up the GIL on every SQLite call and waits for it behind the
    # HTTP thread for up to the switch interval (5 ms by default): a shorter one keeps batches short
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    thresholds = gc.get_threshold()
    quiet_gc()
    try:
        server.run()
    finally:
        sys.setswitchinterval(switch)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("relay stopped%s", f" (signal {stopped[0]})" if stopped else "", extra={"event": "relay_stop"})
