"""Per-trace usage, kept for the most recent traces only, so the judge's memory is O(1) in the run.

The run's totals are `ChatExchange.usage`; nothing in a run reads a trace's own figure (the
report and the summary show totals). This map answers "what did trace X cost" for the traces
judged last (tests and debugging), and forgets the oldest beyond `limit`: a night of 5,000 traces
once kept 5,000 entries (about 0.6 KB each) for no reader.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping

from triage.domain.records import Usage

#: traces whose usage is remembered: far more than are judged at once (the judge's concurrency)
RECENT_TRACES = 256


class RecentUsage(Mapping[str, Usage]):
    """trace id -> `Usage`, least recently started out beyond `limit`.

    `start(trace_id)` hands out the `Usage` a trace's calls add to. A trace still being judged
    when it drops out keeps counting into its own object (and into the exchange's totals); only
    the lookup by id is lost.
    """

    def __init__(self, limit: int = RECENT_TRACES) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._items: OrderedDict[str, Usage] = OrderedDict()

    def start(self, trace_id: str) -> Usage:
        """The usage record of `trace_id` (the same one when it is judged again)."""
        usage = self._items.get(trace_id)
        if usage is None:
            usage = self._items[trace_id] = Usage()
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(trace_id)
        return usage

    def setdefault(self, trace_id: str, default: Usage | None = None) -> Usage:
        """`start`, under the dict name earlier callers used (`default` is ignored)."""
        return self.start(trace_id)

    def __getitem__(self, trace_id: str) -> Usage:
        return self._items[trace_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
