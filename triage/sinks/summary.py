"""The run summary: a few lines for the log and the top of the report (our own text, not escaped)."""

from __future__ import annotations

from collections import defaultdict

from triage.domain.outcome import RunResult


def summary_lines(result: RunResult, *, timing: bool = True) -> list[str]:
    """The run summary: counts per layer, undecided, written, time, requests and cost. Without
    `timing` (the report), no wall time: the same input then gives the same report."""
    triaged = len(result.entries)
    per_layer = (
        ", ".join(f"{layer} {count}" for layer, count in sorted(result.layer_counts.items())) or "none"
    )
    kinds: dict[str, int] = defaultdict(int)
    for skipped in result.skipped:
        kinds[skipped.undecided.kind] += 1
    undecided = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())) or "none"
    per_trace = result.requests / triaged if triaged else 0.0
    usage = result.usage
    lines = [
        f"thumbs-down {result.thumbs_down} (of {result.votes_seen} votes), already triaged {result.already_triaged}, "
        f"triaged {triaged}, not triaged {len(result.skipped)}",
        f"layers: {per_layer}",
        f"not triaged: {undecided}",
        f"written: {result.written} scores" if result.write else "written: nothing (no --write)",
        f"judge {result.judge}: {usage.calls} calls, {usage.input_tokens} input + {usage.output_tokens} output "
        f"tokens, est. ${result.cost:.4f}"
        + (
            f" ({usage.calls / triaged:.2f} calls, {(usage.input_tokens + usage.output_tokens) / triaged:.0f} "
            f"tokens per trace)"
            if triaged
            else ""
        ),
        f"search calls {result.search_calls}; backend requests {result.requests} ({per_trace:.2f} per triaged trace)",
    ]
    if timing:
        lines.append(f"time {result.elapsed:.1f}s")
    if result.worklist is not None:
        status = result.worklist.status_counts()
        lines.insert(
            4,
            f"signatures: {len(result.worklist.signatures)} tonight ({status['new']} new, {status['recurring']} "
            f"recurring, {status['regressed']} regressed), {status['resolved']} resolved"
            + (f"; {result.signatures_written} signature scores written" if result.write else ""),
        )
    return lines


def summary_record(result: RunResult) -> dict[str, object]:
    """The run's figures for a machine (`--summary-file`): what the summary lines say, as JSON."""
    kinds: dict[str, int] = defaultdict(int)
    for skipped in result.skipped:
        kinds[skipped.undecided.kind] += 1
    return {
        "exit_code": int(result.exit_code),
        "votes_seen": result.votes_seen,
        "thumbs_down": result.thumbs_down,
        "already_triaged": result.already_triaged,
        "triaged": len(result.entries),
        "not_triaged": dict(sorted(kinds.items())),
        "layers": dict(sorted(result.layer_counts.items())),
        "written": result.written,
        "judge": result.judge,
        "judge_calls": result.usage.calls,
        "input_tokens": result.usage.input_tokens,
        "output_tokens": result.usage.output_tokens,
        "cost_usd": round(result.cost, 6),
        "search_calls": result.search_calls,
        "backend_requests": result.requests,
        "elapsed_seconds": round(result.elapsed, 3),
    }
