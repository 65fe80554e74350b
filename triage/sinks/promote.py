"""`triage promote` output: what became of each trace, as Markdown (user text escaped) or JSON."""

from __future__ import annotations

import json

from triage.domain.datasets import PromoteAction, PromoteResult
from triage.sinks.markdown import md

ACTIONS: tuple[PromoteAction, ...] = ("created", "updated", "unchanged", "skipped", "failed")


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
            trace = f"[{trace}](<{case.url.replace('>', '%3E').replace('|', '%7C')}>)"
        lines.append(
            f"| {trace} | {case.action} | {case.expected_from or ''} | {case.layer or ''} "
            f"| {md(case.signature, 40) if case.signature else ''} | {case.item_id} | {md(case.reason or '', 200)} |"
        )
    return "\n".join(lines) + "\n"
