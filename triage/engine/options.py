"""How a run is asked for: the window, writing, concurrency, shard and facts file.

`now` is a field of every command's options record (this one, and calibrate's, queue's, promote's,
votes' and eval's): the moment the window ends at, the current time unless a caller fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from triage.domain import kernel
from triage.domain.config import TriageConfig
from triage.domain.outcome import Shard


@dataclass
class RunOptions:
    since_hours: float = 24.0
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    write: bool = False
    force: bool = False
    concurrency: int = 8
    batch_size: int = 100
    shard: Shard = field(default_factory=Shard)
    facts_file: Path | None = None
    progress_seconds: float = 5.0


def window(options: RunOptions, config: TriageConfig) -> tuple[datetime, datetime]:
    """[start, end): `since_hours` ending `lag` before now, reaching `overlap` further back."""
    lag, overlap = config.window.lag_minutes, config.window.overlap_minutes
    return kernel.window(options.now, options.since_hours, lag_minutes=lag, overlap_minutes=overlap)
