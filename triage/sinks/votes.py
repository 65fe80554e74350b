"""`triage votes` output: a Markdown table, JSON or CSV of conversations and their votes.

User text (conversation ids, comments) is escaped in the table (`markdown.md`: no formatting,
links, HTML or line breaks; a `|` cannot split a cell); CSV cells that a spreadsheet would run as a
formula (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) are prefixed with `'`.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from triage.domain.conversations import Conversation, ConversationList
from triage.sinks.markdown import md

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
        link = f"[trace](<{c.url.replace('>', '%3E').replace('|', '%7C')}>)" if c.url else ""
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
