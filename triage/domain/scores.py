"""Deterministic score ids and timestamps, so a rerun overwrites instead of duplicating.

Langfuse upserts a score only when both its id and its timestamp match an existing row, so both
are derived from the trace alone: the id from (trace, score name, rule version), the timestamp
from the trace's start time.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

# Fixed forever: changing it would orphan every score written before.
NAMESPACE = uuid.UUID("6f0e3c1a-3f43-4c52-9d1e-7a1b2c3d4e5f")


def score_id(trace_id: str, score_name: str, rule_version: str) -> str:
    """The id of the `score_name` score on `trace_id` under `rule_version`."""
    return str(uuid.uuid5(NAMESPACE, f"{trace_id}:{score_name}:{rule_version}"))


def score_timestamp(trace_start: datetime | None, fallback: datetime) -> datetime:
    """The trace's start time (UTC, millisecond precision), or `fallback` when it has none."""
    stamp = trace_start or fallback
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    stamp = stamp.astimezone(UTC)
    return stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
