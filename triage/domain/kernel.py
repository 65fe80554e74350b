"""What every part of triage shares, said once: the window, UTC time, clipping text, batching.

Commands, sources and the relay used to carry their own copies of these (five windows, five
clippers, three ISO formatters); a copy that drifted was a bug only one command had.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

T = TypeVar("T")

# -- the window --------------------------------------------------------------------------------

#: a year: Langfuse keeps no more by default, and a datetime cannot go far past
MAX_SINCE_HOURS = 24 * 366


def since_hours_problem(hours: float) -> str | None:
    """Why `hours` cannot be a window's length, or None. NaN passes every comparison, so it is
    named first; then (0, MAX_SINCE_HOURS]."""
    if math.isnan(hours):
        return "must be a number of hours, not NaN"
    if not 0 < hours <= MAX_SINCE_HOURS:
        return f"must be more than 0 and at most {MAX_SINCE_HOURS} hours"
    return None


def window(
    now: datetime,
    since_hours: float,
    *,
    lag_minutes: float = 0,
    overlap_minutes: float = 0,
    since: datetime | None = None,
    lookback_days: float = 0,
) -> tuple[datetime, datetime]:
    """[start, end): `since_hours` ending `lag_minutes` before `now`, reaching `overlap_minutes`
    further back (the nightly job's lag for late data and overlap with last night). With `since`
    (where the last complete run's window ended) the start reaches back to it, with the same
    overlap, but never more than `lookback_days` before the end: what earlier nights left is
    taken up, however many of them failed or were skipped."""
    end = now - timedelta(minutes=lag_minutes)
    start = end - timedelta(hours=since_hours, minutes=overlap_minutes)
    if since is not None and lookback_days > 0:
        start = min(start, max(since - timedelta(minutes=overlap_minutes), end - timedelta(days=lookback_days)))
    return start, end


@dataclass(frozen=True)
class Window:
    """[start, end): the span of time one command reads, made once by the application and handed
    down (`triage.app`), so no part of the run draws its own from the clock.

    `overlap` and `lookback` are kept for the nightly job's reach back (`reaching_back_to`): where
    the last complete run's window ended, with the same overlap, at most `lookback` before the end."""

    start: datetime
    end: datetime
    overlap: timedelta = timedelta(0)
    lookback: timedelta = timedelta(0)

    @classmethod
    def ending(
        cls,
        now: datetime,
        since_hours: float,
        *,
        lag_minutes: float = 0,
        overlap_minutes: float = 0,
        lookback_days: float = 0,
    ) -> Window:
        """`since_hours` ending `lag_minutes` before `now`, reaching `overlap_minutes` further back."""
        start, end = window(now, since_hours, lag_minutes=lag_minutes, overlap_minutes=overlap_minutes)
        return cls(start, end, timedelta(minutes=overlap_minutes), timedelta(days=max(lookback_days, 0)))

    def reaching_back_to(self, since: datetime) -> Window:
        """This window, its start reaching back to `since` (the last complete run's end) as
        `window` reaches: never later than its own start, never more than `lookback` back."""
        if self.lookback <= timedelta(0):
            return self
        start = min(self.start, max(since - self.overlap, self.end - self.lookback))
        return Window(start, self.end, self.overlap, self.lookback)


# -- time --------------------------------------------------------------------------------------


def as_utc(stamp: datetime) -> datetime:
    """`stamp` in UTC; naive means UTC (what every source of triage writes)."""
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)


def ms_utc(stamp: datetime) -> datetime:
    """`stamp` in UTC at millisecond precision (what Langfuse keeps; naive means UTC)."""
    stamp = as_utc(stamp)
    return stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)


def iso_ms(stamp: datetime) -> str:
    """The one text form of a stored time: UTC, milliseconds, `Z` (sorts as it reads)."""
    stamp = ms_utc(stamp)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def iso_z(stamp: datetime) -> str:
    """`stamp` as Langfuse's query parameters take it: UTC with `Z`, full precision."""
    return as_utc(stamp).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """An ISO-8601 time (with `Z` or an offset; naive means UTC); ValueError when it is none."""
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


# -- text --------------------------------------------------------------------------------------

ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, the last an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def one_line(text: str, limit: int) -> str:
    """`text` on one line (runs of whitespace made one space), cut to `limit` with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + ELLIPSIS


# -- batches -----------------------------------------------------------------------------------


def bounded_batches(
    items: Iterable[T], cost: Callable[[T], int], *, most: int, limit: int, base: int = 0
) -> Iterator[list[T]]:
    """`items` in order, in batches of at most `most` whose costs, plus `base` (a batch's own), stay
    within `limit`; an item that alone is over the limit still makes a batch (of its own)."""
    batch: list[T] = []
    size = base
    for item in items:
        spent = cost(item)
        if batch and (len(batch) >= most or size + spent > limit):
            yield batch
            batch, size = [], base
        batch.append(item)
        size += spent
    if batch:
        yield batch


# -- remembering what a text gives ----------------------------------------------------------------


#: texts up to this long are their own key in a `TextMemo`: cheaper than a digest, as small
SHORT_KEY_CHARS = 256


class TextMemo(Generic[T]):
    """`fn(text)`, remembered by the text's digest, least recently used out.

    The night reads the same index chunks and tool outputs for many traces, and several judges
    tokenise and scan them again; remembering the result by a 128-bit digest (a long text is never kept)
    keeps the memory a long tool output costs to its result. Texts over `max_chars` are not
    remembered (a whole page is rarely seen twice). Safe to call from worker threads."""

    def __init__(self, fn: Callable[[str], T], size: int, max_chars: int = 50_000) -> None:
        self.fn, self.size, self.max_chars = fn, size, max_chars
        self._seen: OrderedDict[str | bytes, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__

    def __call__(self, text: str) -> T:
        if len(text) > self.max_chars:
            return self.fn(text)
        # a short text is its own key (a string caches its hash); a long one, its digest
        key: str | bytes = (
            text
            if len(text) <= SHORT_KEY_CHARS
            else hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        )
        with self._lock:
            if key in self._seen:
                self.hits += 1
                self._seen.move_to_end(key)
                return self._seen[key]
            self.misses += 1
        value = self.fn(text)
        with self._lock:
            self._seen[key] = value
            if len(self._seen) > self.size:
                self._seen.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self.hits = self.misses = 0


#: a name's parts: a run of digits, a run of letters (with the `-`, `~` or digit before it, which
#: makes it a pre-release: `1.0.0-rc.1`, `1.0a1`), or anything else (separators, ignored)
_VERSION_PART = re.compile(r"(\d+)|((?<=\d)[A-Za-z]+|[-~][A-Za-z]+)|([A-Za-z]+)|[^\dA-Za-z]")


def version_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """A release name's place in version order: numbers compared as numbers (`2026.9` before
    `2026.10`, `v1.9.0` before `v1.10.0`), a pre-release before its release (`1.0.0-rc.2` before
    `1.0.0-rc.10` before `1.0.0`), text by its letters; separators do not count."""
    key: list[tuple[int, int, str]] = []
    for number, pre, text in (m.groups() for m in _VERSION_PART.finditer(name)):
        if number is not None:
            key.append((2, int(number), ""))
        elif pre is not None:
            key.append((0, 0, pre.lstrip("-~").lower()))
        elif text is not None:
            key.append((3, 0, text.lower()))
    key.append((1, 0, ""))  # the end: after a pre-release part, before any more numbers
    return tuple(key)
