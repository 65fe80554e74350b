"""Virtual time: every sleep returns at once and moves the clock on by what it asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class VirtualClock:
    """A `triage.retry.Clock` whose sleeps are instant and recorded in `sleeps`."""

    def __init__(self, start: datetime | None = None) -> None:
        self.elapsed = 0.0
        self.start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.elapsed

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.elapsed += max(seconds, 0.0)

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)
