"""Issue drafts: one Markdown file per owner, and one per signature seen often, ready to paste.

Nothing is filed: a person reads the draft, checks the traces and files it. File names are made
from configuration (owners) and signature ids only, never from user text.
"""

from __future__ import annotations

import re
from pathlib import Path

from triage.domain.outcome import Entry, RunResult
from triage.domain.signatures import NIGHTS
from triage.errors import ConfigError
from triage.sinks.markdown import templates
from triage.sinks.report import by_signature, grouped

DEFAULT_MIN_SIZE = 3  # a signature with this many members in the last nights gets its own draft


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "owner"


def write_issue_drafts(result: RunResult, folder: Path, min_size: int = DEFAULT_MIN_SIZE) -> list[Path]:
    """Write the drafts; returns the files written (owners first, then signatures)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError as ex:
        raise ConfigError(f"cannot create the issues folder {folder}: {ex.strerror or ex}") from ex
    sigs = {sig.id: sig for sig in result.worklist.signatures} if result.worklist else {}
    written = []
    for owner, by_layer in grouped(result.entries).items():
        items = {layer: by_signature(entries) for layer, entries in by_layer.items()}
        text = templates.get_template("issue_owner.md.j2").render(
            owner=owner,
            count=sum(len(entries) for entries in by_layer.values()),
            by_layer=items,
            result=result,
            sigs=sigs,
            nights=NIGHTS + 1,
        )
        path = folder / f"owner-{_slug(owner)}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    members: dict[str, list[Entry]] = {}
    for entry in result.entries:
        if entry.signature in sigs:
            members.setdefault(entry.signature, []).append(entry)
    for sig_id, entries in members.items():
        sig = sigs[sig_id]
        if sig.count < min_size:
            continue
        owners = list(dict.fromkeys(owner for entry in entries for owner in entry.owners))
        text = templates.get_template("issue_signature.md.j2").render(
            sig=sig, members=entries, sigs=sigs, owners=owners, nights=NIGHTS + 1
        )
        path = folder / f"signature-{_slug(sig.id)}.md"
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
