"""The Markdown report (a jinja2 template).

User text (questions, comments) is escaped: it cannot open a heading, a table, a link or HTML.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from triage.domain.outcome import Entry, RunResult, Skipped
from triage.domain.records import Layer
from triage.domain.signatures import NIGHTS
from triage.sinks.markdown import templates
from triage.sinks.summary import summary_lines


def grouped(entries: list[Entry]) -> dict[str, dict[str, list[Entry]]]:
    """owner -> layer -> entries, owners sorted, layers in the report's order."""
    groups: dict[str, dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for entry in entries:
        for owner in entry.owners:
            groups[owner][entry.layer.value].append(entry)
    order = [layer.value for layer in Layer]
    return {
        owner: {layer: groups[owner][layer] for layer in order if groups[owner].get(layer)}
        for owner in sorted(groups)
    }


def by_signature(entries: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Entries as signature items, in the order their first member comes (no signature: its own item)."""
    items: dict[str, list[Entry]] = {}
    for entry in entries:
        items.setdefault(entry.signature or f"trace:{entry.trace_id}", []).append(entry)
    return list(items.items())


def chart_label(text: object) -> str:
    """A Mermaid string: no quote, bracket or newline can end it early (owners are configuration)."""
    return " ".join(str(text).replace('"', "'").replace("[", "(").replace("]", ")").split())[:40]


templates.filters["chart"] = chart_label


def _entry_order(entry: Entry) -> tuple[str, str]:
    """When the trace started, then its id: the order traces finished in differs run to run."""
    return (entry.start.isoformat() if entry.start else "", entry.trace_id)


def _skipped_order(item: Skipped) -> tuple[str, str, str]:
    undecided = item.undecided
    return (undecided.kind, undecided.trace_id or "", ",".join(undecided.vote_ids))


def render_report(result: RunResult) -> str:
    """The Markdown report; the same run gives the same bytes (entries and skipped votes in a fixed
    order), so two nights' reports diff line by line."""
    result = replace(
        result,
        entries=sorted(result.entries, key=_entry_order),
        skipped=sorted(result.skipped, key=_skipped_order),
    )
    groups = grouped(result.entries)
    layers = [layer.value for layer in Layer if result.layer_counts.get(layer.value)]
    worklist = result.worklist
    return templates.get_template("report.md.j2").render(
        result=result,
        groups={
            owner: {layer: by_signature(items) for layer, items in by_layer.items()}
            for owner, by_layer in groups.items()
        },
        layers=layers,
        all_layers=[layer.value for layer in Layer],
        totals={
            owner: {layer: len(items) for layer, items in by_layer.items()}
            for owner, by_layer in groups.items()
        },
        worklist=worklist,
        sigs={sig.id: sig for sig in worklist.signatures} if worklist else {},
        nights=NIGHTS + 1,
        summary=summary_lines(result, timing=False),  # our own text: not escaped
    )
