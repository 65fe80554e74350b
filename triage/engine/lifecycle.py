"""The run's lifecycle: opening the searcher (degraded when it is down) and honouring SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager

from triage.domain.ports import Searcher
from triage.errors import SearchError
from triage.retry import Budget

log = logging.getLogger("triage")


@asynccontextmanager
async def open_searcher(
    searcher: AbstractAsyncContextManager[Searcher] | None,
) -> AsyncIterator[tuple[Searcher | None, str | None]]:
    """Enter the searcher: (searcher, None), or (None, why) when there is none or it cannot be
    reached; then the run goes on without re-search (degraded). What the first contact finds wrong
    with the configuration (a refused token, nothing at the MCP path, a tool the server lacks) is a
    `ConfigError`: it ends the run (exit 3) before any trace is judged."""
    if searcher is None:
        yield None, "no search configured"
        return
    try:
        entered = await searcher.__aenter__()
    except SearchError as ex:  # a ConfigError is not: it ends the run
        log.warning("search unavailable: %s", ex, extra={"event": "search_unavailable"})
        yield None, str(ex)
        return
    try:
        yield entered, None
    finally:
        await searcher.__aexit__(None, None, None)


@contextmanager
def stop_on_sigterm(stop: asyncio.Event, budget: Budget | None = None) -> Iterator[None]:
    """Kubernetes sends SIGTERM before it kills a Pod: set `stop`, so the run finishes what is in
    flight, writes it and reports; cancel `budget`, so no outside call waits out a back-off."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGTERM, _on_sigterm, stop, budget)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _on_sigterm(stop: asyncio.Event, budget: Budget | None) -> None:
    log.warning("SIGTERM: finishing the traces in flight, listing the rest", extra={"event": "sigterm"})
    stop.set()
    if budget is not None:
        budget.cancel()
