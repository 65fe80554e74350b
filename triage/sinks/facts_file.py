"""The facts file: one JSON line per triaged trace, what `--judge replay:FILE` reads back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from triage import jsonl
from triage.domain.records import Facts
from triage.errors import ConfigError


@contextmanager
def open_facts_file(path: Path | None) -> Iterator[IO[str] | None]:
    """`path` opened for appending (a run file grows night by night), or None without a path.
    One that cannot be opened is a configuration error, raised before any trace is judged."""
    if path is None:
        yield None
        return
    try:
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as ex:
        raise ConfigError(f"cannot write the facts file {path}: {ex.strerror or ex}") from ex
    with handle:
        yield handle


def write_facts_line(
    trace_id: str, facts: Facts, *, judge: str | None = None, prompt_version: str | None = None
) -> str:
    """One line of a facts file (no trailing newline) that `ReplayJudge` reads back to the same facts."""
    record: dict[str, Any] = {"trace_id": trace_id, **facts.model_dump(mode="json")}
    if judge is not None:
        record["judge"] = judge
    if prompt_version is not None:
        record["prompt_version"] = prompt_version
    return jsonl.dumps(record, separators=(",", ":"))
