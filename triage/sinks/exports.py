"""What the other commands leave behind: files other tools read back, and their listings.

- the facts file: one JSON line per triaged trace, what `--judge replay:FILE` reads back;
- regression cases as a JSONL file (`triage promote --jsonl FILE`), and what `triage promote` did;
- `triage votes`: conversations and their votes as a Markdown table, JSON or CSV;
- `triage import` and `triage queue`: their plain-text lines.

User text in a table is escaped (`report.md`: no formatting, links, HTML or line breaks; a `|`
cannot split a cell); CSV cells that a spreadsheet would run as a formula (starting with `=`, `+`,
`-`, `@`, a tab or a carriage return) are prefixed with `'`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

from pydantic import ValidationError

from triage import jsonl
from triage.domain.records import Facts
from triage.domain.votes import Conversation, ConversationList
from triage.domain.worklist import DatasetItem, DatasetWriteOutcome, PromoteAction, PromoteResult
from triage.errors import ConfigError, InputError
from triage.sinks.report import md

# -- the facts file ----------------------------------------------------------------------------


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


# -- regression cases as a JSONL file ----------------------------------------------------------
# One item per line in Langfuse's field names (`id`, `datasetName`, `input`, `expectedOutput`,
# `metadata`, `sourceTraceId`, `sourceObservationId`, `status`), ready for `create_dataset_item`.
# An item whose id is there is replaced in place, a new one is appended; an id held by another
# dataset fails, as in Langfuse. The file is rewritten (atomically) only when an item changed, so a
# rerun leaves it byte for byte as it was.


def _dataset_line(item: DatasetItem) -> str:
    return jsonl.dumps(item.wire(), sort_keys=True)


class DatasetFile:
    """A `DatasetSink` on a JSONL file (created when first written)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> list[DatasetItem]:
        if not self.path.exists():
            return []
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as ex:
            raise InputError(f"cannot read {self.path}: {ex}") from ex
        items = []
        for number, line in jsonl.lines(text):
            try:
                raw: Any = jsonl.parse(line)
                items.append(
                    DatasetItem(
                        id=raw["id"],
                        dataset_name=raw["datasetName"],
                        input=raw.get("input"),
                        expected_output=raw.get("expectedOutput"),
                        metadata=raw.get("metadata") or {},
                        source_trace_id=raw.get("sourceTraceId"),
                        source_observation_id=raw.get("sourceObservationId"),
                        status=raw.get("status") or "ACTIVE",
                    )
                )
            except (ValueError, KeyError, TypeError, ValidationError) as ex:
                raise InputError(f"{self.path}, line {number}: not a dataset item: {str(ex)[:200]}") from ex
        return items

    def ensure_dataset(self, name: str, description: str, metadata: dict[str, Any]) -> bool:
        """A file has no datasets of its own: "created" when none of its items is in `name` yet."""
        return not any(item.dataset_name == name for item in self._read())

    def dataset_items(self, name: str) -> dict[str, DatasetItem]:
        return {item.id: item for item in self._read() if item.dataset_name == name}

    def upsert_dataset_items(self, items: Sequence[DatasetItem]) -> DatasetWriteOutcome:
        held = self._read()
        position = {item.id: n for n, item in enumerate(held)}
        outcome = DatasetWriteOutcome()
        for item in items:
            at = position.get(item.id)
            if at is None:
                position[item.id] = len(held)
                held.append(item)
            elif held[at].dataset_name != item.dataset_name:
                outcome.failed[item.id] = (
                    f"the dataset item with id {item.id} already exists in a dataset other than {item.dataset_name}"
                )
                continue
            else:
                held[at] = item.model_copy(update={"status": held[at].status})  # an archived item stays so
            outcome.written.append(item.id)
        if outcome.written:
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                tmp.write_text("".join(_dataset_line(item) + "\n" for item in held), encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as ex:
                raise InputError(f"cannot write {self.path}: {ex.strerror or ex}") from ex
        return outcome


# -- `triage promote`: what became of each trace -----------------------------------------------

ACTIONS: tuple[PromoteAction, ...] = ("created", "updated", "unchanged", "skipped", "failed")


def _link(url: str) -> str:
    """A URL as a Markdown link target that no `>` or `|` can end early."""
    return url.replace(">", "%3E").replace("|", "%7C")


def promote_json(result: PromoteResult) -> str:
    record = {**result.model_dump(mode="json"), "counts": {a: result.count(a) for a in ACTIONS}}
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def render_promote(result: PromoteResult) -> str:
    counts = ", ".join(f"{result.count(a)} {a}" for a in ACTIONS)
    lines = [
        f"# Regression cases: {md(result.dataset, 120)}",
        "",
        f"Target: {md(result.target, 200)}" + (" (dataset created)" if result.dataset_created else "") + ".",
        (f"Dry run, nothing written; a run would give: {counts}." if result.dry_run else f"{counts.capitalize()}."),
        "",
    ]
    if not result.cases:
        lines.append("No trace to promote: no reviewer's negative verdict with a correction, nothing selected.")
        return "\n".join(lines) + "\n"
    lines += [
        "| trace | action | expected from | layer | signature | item | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in result.cases:
        trace = md(case.trace_id, 80)
        if case.url:
            trace = f"[{trace}](<{_link(case.url)}>)"
        lines.append(
            f"| {trace} | {case.action} | {case.expected_from or ''} | {case.layer or ''} "
            f"| {md(case.signature, 40) if case.signature else ''} | {case.item_id} | {md(case.reason or '', 200)} |"
        )
    return "\n".join(lines) + "\n"


# -- `triage votes`: conversations and their votes ---------------------------------------------

COLUMNS = ["conversation", "kind", "traces", "up", "down", "notes", "started", "last_vote", "newest_note", "url"]
NOTE_CHARS = 120
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _stamp(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else ""


def _row(c: Conversation) -> dict[str, Any]:
    return {
        "conversation": c.id,
        "kind": c.kind,
        "traces": c.traces,
        "up": c.up,
        "down": c.down,
        "notes": c.notes,
        "started": _stamp(c.started),
        "last_vote": _stamp(c.last_vote),
        "newest_note": c.comments[0] if c.comments else "",
        "url": c.url or "",
    }


def safe_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text, never runs as a formula."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def votes_csv(listing: ConversationList) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for conversation in listing.conversations:
        writer.writerow({k: safe_cell(v) for k, v in _row(conversation).items()})
    return out.getvalue()


def votes_json(listing: ConversationList) -> str:
    record = {
        "start": listing.start.isoformat(),
        "end": listing.end.isoformat(),
        "filter": listing.filter,
        "total": listing.total,
        "conversations": [
            {**c.model_dump(mode="json", exclude={"first_trace"}), "votes": c.votes} for c in listing.conversations
        ],
        "bad_votes": [
            {"id": b.id, "reason": b.reason, "trace_id": b.trace_id, "session_id": b.session_id}
            for b in listing.bad_votes
        ],
    }
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def votes_table(listing: ConversationList) -> str:
    lines = [
        "# Conversations and their votes",
        "",
        f"{len(listing.conversations)} of {listing.total} conversations ({listing.filter}), "
        f"{_stamp(listing.start)} to {_stamp(listing.end)} UTC.",
        "",
    ]
    if not listing.conversations:
        return "\n".join(lines) + _bad_votes(listing)
    lines += [
        "| conversation | kind | traces | up | down | notes | last vote | newest note | link |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for c in listing.conversations:
        note = md(c.comments[0], NOTE_CHARS) if c.comments else ""
        link = f"[trace](<{_link(c.url)}>)" if c.url else ""
        lines.append(
            f"| {md(c.id, 80)} | {c.kind} | {c.traces} | {c.up} | {c.down} | {c.notes} "
            f"| {_stamp(c.last_vote or c.started)} | {note} | {link} |"
        )
    return "\n".join(lines) + "\n" + _bad_votes(listing)


def _bad_votes(listing: ConversationList) -> str:
    """The rows of the vote score that cannot be read, with their reasons, as a section to append
    (after a blank line); nothing when there are none."""
    if not listing.bad_votes:
        return ""
    items = [f"- vote {md(bad.id or '(no id)', 80)}: {md(bad.reason, 200)}" for bad in listing.bad_votes]
    return "\n".join(["", f"## Votes not read ({len(listing.bad_votes)})", "", *items]) + "\n"


#: `--format` of `triage promote` and `triage votes`: name -> renderer, the first the default
PROMOTE_FORMATS: Mapping[str, Callable[[PromoteResult], str]] = {"markdown": render_promote, "json": promote_json}
VOTES_FORMATS: Mapping[str, Callable[[ConversationList], str]] = {
    "table": votes_table,
    "json": votes_json,
    "csv": votes_csv,
}

# -- plain-text lines: `triage import`, `triage queue` -----------------------------------------


class ImportCounts(Protocol):
    """What `triage import` loaded, and where."""

    @property
    def path(self) -> Path: ...
    @property
    def traces(self) -> int: ...
    @property
    def observations(self) -> int: ...
    @property
    def scores(self) -> int: ...


def imported_text(imported: ImportCounts) -> str:
    return (
        f"imported {imported.traces} traces, {imported.observations} observations, {imported.scores} scores "
        f"into {imported.path}\n"
    )


def text_lines(lines: Iterable[str]) -> str:
    """Lines as standard output takes them, each ended by a newline."""
    return "".join(f"{line}\n" for line in lines)
